//! Checks of the block dot products against an independent analytic reference: both operands
//! dequantized with the existing dequantizers and multiplied in f64. The reference shares no
//! integer arithmetic with the code under test, so a wrong nibble, scale or min shows up as a
//! wrong sum rather than as the same mistake made twice.

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::QK_K;
use super::q4_0::BlockQ4_0;
use super::q4_1::BlockQ4_1;
use super::q4_k::BlockQ4K;
use super::q5_0::BlockQ5_0;
use super::q5_1::BlockQ5_1;
use super::q5_k::BlockQ5K;
use super::q6_k::BlockQ6K;
use super::q8_0::BlockQ8_0;
use super::q8_1::BlockQ8_1;
use super::q8_k::BlockQ8K;
use super::*;
use bytemuck::Zeroable;

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn signed_unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b = self.next() as u8;
        }
    }

    fn block<B: Pod>(&mut self) -> B {
        let mut b = B::zeroed();
        self.fill(bytemuck::bytes_of_mut(&mut b));
        b
    }
}

/// What a generated block stresses: ordinary values, a zero scale (only the min, if any, is
/// left), or the extreme levels and scales of the format.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Random,
    ZeroScale,
    Extreme,
}

impl XorShift {
    fn mode(&mut self) -> Mode {
        match self.below(4) {
            0 => Mode::ZeroScale,
            1 => Mode::Extreme,
            _ => Mode::Random,
        }
    }

    /// An F16 scale: `max_abs` times a random sign in extreme mode, 0 in zero mode.
    fn scale(&mut self, mode: Mode, max_abs: f32) -> u16 {
        match mode {
            Mode::Random => f32_to_f16(self.signed_unit() * max_abs),
            Mode::ZeroScale => 0,
            Mode::Extreme => f32_to_f16(if self.below(2) == 0 { max_abs } else { -max_abs }),
        }
    }

    /// Either all of `bytes` at one end of their range, or random.
    fn levels(&mut self, mode: Mode, bytes: &mut [u8]) {
        if mode == Mode::Extreme {
            let v = if self.below(2) == 0 { 0x00 } else { 0xff };
            bytes.fill(v);
        } else {
            self.fill(bytes);
        }
    }

    fn q8_values(&mut self, mode: Mode, qs: &mut [i8]) {
        if mode == Mode::Extreme {
            let v = if self.below(2) == 0 { 127 } else { -128 };
            qs.fill(v);
        } else {
            self.fill(bytemuck::cast_slice_mut(qs));
        }
    }
}

fn gen_q4_0(r: &mut XorShift) -> BlockQ4_0 {
    let mode = r.mode();
    let mut b: BlockQ4_0 = r.block();
    b.d = r.scale(mode, 0.5);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q4_1(r: &mut XorShift) -> BlockQ4_1 {
    let mode = r.mode();
    let mut b: BlockQ4_1 = r.block();
    b.d = r.scale(mode, 0.5);
    b.m = r.scale(Mode::Random, 4.0);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q5_0(r: &mut XorShift) -> BlockQ5_0 {
    let mode = r.mode();
    let mut b: BlockQ5_0 = r.block();
    b.d = r.scale(mode, 0.25);
    r.levels(mode, &mut b.qs);
    r.levels(mode, &mut b.qh);
    b
}

fn gen_q5_1(r: &mut XorShift) -> BlockQ5_1 {
    let mode = r.mode();
    let mut b: BlockQ5_1 = r.block();
    b.d = r.scale(mode, 0.25);
    b.m = r.scale(Mode::Random, 4.0);
    r.levels(mode, &mut b.qs);
    r.levels(mode, &mut b.qh);
    b
}

fn gen_q8_0(r: &mut XorShift) -> BlockQ8_0 {
    let mode = r.mode();
    let mut b = BlockQ8_0::zeroed();
    b.d = r.scale(mode, 0.05);
    r.q8_values(mode, &mut b.qs);
    b
}

fn gen_q8_1(r: &mut XorShift) -> BlockQ8_1 {
    let mode = r.mode();
    let mut b = BlockQ8_1::zeroed();
    b.d = r.scale(mode, 0.05);
    r.q8_values(mode, &mut b.qs);
    let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
    b.s = f32_to_f16(sum as f32 * f16_to_f32(b.d));
    b
}

fn gen_q8_k(r: &mut XorShift) -> BlockQ8K {
    let mode = r.mode();
    let mut b = BlockQ8K::zeroed();
    b.d = match mode {
        Mode::Random => r.signed_unit() * 0.05,
        Mode::ZeroScale => 0.0,
        Mode::Extreme => -0.05,
    };
    r.q8_values(mode, &mut b.qs);
    for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| q as i16).sum();
    }
    b
}

fn gen_q4_k(r: &mut XorShift) -> BlockQ4K {
    let mode = r.mode();
    let mut b: BlockQ4K = r.block();
    b.d = r.scale(mode, 0.02);
    b.dmin = r.scale(if mode == Mode::Extreme { mode } else { Mode::Random }, 0.02);
    r.levels(mode, &mut b.scales);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q5_k(r: &mut XorShift) -> BlockQ5K {
    let mode = r.mode();
    let mut b: BlockQ5K = r.block();
    b.d = r.scale(mode, 0.01);
    b.dmin = r.scale(if mode == Mode::Extreme { mode } else { Mode::Random }, 0.02);
    r.levels(mode, &mut b.scales);
    r.levels(mode, &mut b.qh);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q6_k(r: &mut XorShift) -> BlockQ6K {
    let mode = r.mode();
    let mut b: BlockQ6K = r.block();
    b.d = r.scale(mode, 0.002);
    r.levels(mode, &mut b.ql);
    r.levels(mode, &mut b.qh);
    if mode == Mode::Extreme {
        let v = if r.below(2) == 0 { 127 } else { -128 };
        b.scales.fill(v);
    }
    b
}

struct Reference {
    dot: f64,
    /// Sum of |x_i * y_i|: the scale against which float rounding is judged.
    magnitude: f64,
}

fn analytic<W: Pod, A: Pod>(wty: GgmlType, w: &[W], aty: GgmlType, a: &[A]) -> Reference {
    let n = w.len() * wty.block_size();
    let mut xw = vec![0.0f32; n];
    let mut xa = vec![0.0f32; n];
    dequantize_row(wty, bytemuck::cast_slice(w), &mut xw).unwrap();
    dequantize_row(aty, bytemuck::cast_slice(a), &mut xa).unwrap();
    let mut dot = 0.0f64;
    let mut magnitude = 0.0f64;
    for (&p, &q) in xw.iter().zip(&xa) {
        dot += p as f64 * q as f64;
        magnitude += (p as f64 * q as f64).abs();
    }
    Reference { dot, magnitude }
}

/// The F16 rounding of Q8_1's stored sum `s`, which the dot product uses in place of the sum of
/// the dequantized values: half an F16 ulp relative (doubled when `s` was computed from the
/// unrounded scale), or half the smallest subnormal.
fn q8_1_sum_allowance(mins: impl Iterator<Item = u16>, a: &[BlockQ8_1], relative: f64) -> f64 {
    mins.zip(a)
        .map(|(m, b)| f16_to_f32(m).abs() as f64 * (f16_to_f32(b.s).abs() as f64 * relative + 2f64.powi(-25)))
        .sum()
}

fn assert_close(what: &str, trial: usize, got: f32, reference: &Reference, allowance: f64) {
    let tolerance = 1e-5 * reference.magnitude + 1e-6 + allowance;
    let err = (got as f64 - reference.dot).abs();
    assert!(
        err <= tolerance,
        "{what} trial {trial}: got {got}, analytic {} (error {err:e} > tolerance {tolerance:e})",
        reference.dot
    );
}

const TRIALS: usize = 200;

fn check_pair<W: Pod, A: Pod>(
    what: &str,
    (wty, aty): (GgmlType, GgmlType),
    nb: usize,
    gen_w: fn(&mut XorShift) -> W,
    gen_a: fn(&mut XorShift) -> A,
    dot: fn(&[W], &[A]) -> f32,
    allowance: fn(&[W], &[A]) -> f64,
) {
    let mut r = XorShift(0x9e37_79b9_7f4a_7c15 ^ wty as u64);
    for trial in 0..TRIALS {
        let w: Vec<W> = (0..nb).map(|_| gen_w(&mut r)).collect();
        let a: Vec<A> = (0..nb).map(|_| gen_a(&mut r)).collect();
        let got = dot(&w, &a);
        assert_close(what, trial, got, &analytic(wty, &w, aty, &a), allowance(&w, &a));
        // The byte-level dispatch must be the same function, aligned or not.
        let n = nb * wty.block_size();
        let (wb, ab) = (bytemuck::cast_slice::<W, u8>(&w), bytemuck::cast_slice::<A, u8>(&a));
        assert_eq!(
            vec_dot(wty, wb, ab, n).unwrap().to_bits(),
            got.to_bits(),
            "{what} dispatch"
        );
        let mut shifted = vec![0u8; wb.len() + 1];
        shifted[1..].copy_from_slice(wb);
        assert_eq!(
            vec_dot(wty, &shifted[1..], ab, n).unwrap().to_bits(),
            got.to_bits(),
            "{what} unaligned"
        );
    }
}

fn no_allowance<W, A>(_: &[W], _: &[A]) -> f64 {
    0.0
}

#[test]
fn q4_0_times_q8_0_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q4_0, GgmlType::Q8_0);
    check_pair(
        "Q4_0·Q8_0",
        types,
        8,
        gen_q4_0,
        gen_q8_0,
        q4_0::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn q5_0_times_q8_0_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q5_0, GgmlType::Q8_0);
    check_pair(
        "Q5_0·Q8_0",
        types,
        8,
        gen_q5_0,
        gen_q8_0,
        q5_0::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn q8_0_times_q8_0_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q8_0, GgmlType::Q8_0);
    check_pair(
        "Q8_0·Q8_0",
        types,
        8,
        gen_q8_0,
        gen_q8_0,
        q8_0::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn q4_1_times_q8_1_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q4_1, GgmlType::Q8_1);
    let allowance = |w: &[BlockQ4_1], a: &[BlockQ8_1]| q8_1_sum_allowance(w.iter().map(|b| b.m), a, 2f64.powi(-11));
    check_pair("Q4_1·Q8_1", types, 8, gen_q4_1, gen_q8_1, q4_1::vec_dot_ref, allowance);
}

#[test]
fn q5_1_times_q8_1_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q5_1, GgmlType::Q8_1);
    let allowance = |w: &[BlockQ5_1], a: &[BlockQ8_1]| q8_1_sum_allowance(w.iter().map(|b| b.m), a, 2f64.powi(-11));
    check_pair("Q5_1·Q8_1", types, 8, gen_q5_1, gen_q8_1, q5_1::vec_dot_ref, allowance);
}

#[test]
fn q4_k_times_q8_k_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q4_K, GgmlType::Q8_K);
    check_pair(
        "Q4_K·Q8_K",
        types,
        4,
        gen_q4_k,
        gen_q8_k,
        q4_k::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn q5_k_times_q8_k_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q5_K, GgmlType::Q8_K);
    check_pair(
        "Q5_K·Q8_K",
        types,
        4,
        gen_q5_k,
        gen_q8_k,
        q5_k::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn q6_k_times_q8_k_matches_the_analytic_dot_product() {
    let types = (GgmlType::Q6_K, GgmlType::Q8_K);
    check_pair(
        "Q6_K·Q8_K",
        types,
        4,
        gen_q6_k,
        gen_q8_k,
        q6_k::vec_dot_ref,
        no_allowance,
    );
}

#[test]
fn dot_products_of_quantized_f32_rows_match_the_analytic_dot_product() {
    // The path a matmul takes: both sides produced by the reference quantizers.
    let mut r = XorShift(0x2545_f491_4f6c_dd1d);
    for &wty in &[
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let aty = wty.vec_dot_type().unwrap();
        let n = 2 * QK_K;
        for trial in 0..20 {
            let xw: Vec<f32> = (0..n).map(|_| r.signed_unit() * 2.0).collect();
            let xa: Vec<f32> = (0..n).map(|_| r.signed_unit() * 3.0).collect();
            let mut w = vec![0u8; wty.row_size(n as u64).unwrap() as usize];
            let mut a = vec![0u8; aty.row_size(n as u64).unwrap() as usize];
            quantize_row(wty, &xw, &mut w).unwrap();
            quantize_row(aty, &xa, &mut a).unwrap();
            let got = vec_dot(wty, &w, &a, n).unwrap();
            let (mut dw, mut da) = (vec![0.0f32; n], vec![0.0f32; n]);
            dequantize_row(wty, &w, &mut dw).unwrap();
            dequantize_row(aty, &a, &mut da).unwrap();
            let reference = Reference {
                dot: dw.iter().zip(&da).map(|(&p, &q)| p as f64 * q as f64).sum(),
                magnitude: dw.iter().zip(&da).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum(),
            };
            // Q8_1's `s` is computed from the scale before its F16 rounding: two roundings.
            let allowance = match wty {
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    let a8: Vec<BlockQ8_1> = a.chunks_exact(36).map(bytemuck::pod_read_unaligned).collect();
                    let mins = w
                        .chunks_exact(wty.type_size())
                        .map(|b| u16::from_le_bytes([b[2], b[3]]));
                    q8_1_sum_allowance(mins, &a8, 2f64.powi(-10))
                }
                _ => 0.0,
            };
            assert_close(wty.name(), trial, got, &reference, allowance);
        }
    }
}

#[test]
fn q8_1_quantization_rounds_half_away_from_zero_and_stores_the_scaled_sum() {
    // Block 0: the largest magnitude is x[0] = -127, so d = 1 and q = round(x) exactly, with
    // ties at j = 8 (-38.5) and j = 24 (4.5) rounding away from zero. Block 1 is all zeros.
    let mut x = vec![0.0f32; 64];
    x[0] = -127.0;
    for (j, v) in x.iter_mut().enumerate().take(32).skip(1) {
        *v = j as f32 * 2.6875 - 60.0;
    }
    let mut blocks = [BlockQ8_1::zeroed(); 2];
    q8_1::quantize_row_ref(&x, &mut blocks);
    let b = &blocks[0];
    assert_eq!(b.d, f32_to_f16(1.0));
    let mut sum = 0i64;
    for (j, (&q, &v)) in b.qs.iter().zip(&x).enumerate() {
        let v = v as f64;
        let expected = (v.abs() + 0.5).floor().copysign(v) as i64;
        assert_eq!(q as i64, expected, "q[{j}] of {v}");
        sum += expected;
    }
    assert_eq!(b.qs[8], -39);
    assert_eq!(b.qs[24], 5);
    assert_eq!(f16_to_f32(b.s) as i64, sum, "s = sum * d with d = 1");
    assert_eq!(blocks[1], BlockQ8_1::zeroed());

    let mut bytes = vec![0u8; 72];
    quantize_row(GgmlType::Q8_1, &x, &mut bytes).unwrap();
    assert_eq!(bytes, bytemuck::cast_slice::<BlockQ8_1, u8>(&blocks));
    let mut back = vec![0.0f32; 64];
    dequantize_row(GgmlType::Q8_1, &bytes, &mut back).unwrap();
    assert_eq!(back[0], -127.0);
    assert_eq!(back[8], -39.0);
}

#[test]
fn activation_types_follow_ggml_cpu() {
    use GgmlType::*;
    for (w, a) in [(Q4_0, Q8_0), (Q5_0, Q8_0), (Q8_0, Q8_0), (Q4_1, Q8_1), (Q5_1, Q8_1)] {
        assert_eq!(w.vec_dot_type(), Some(a), "{w}");
    }
    for w in [Q4_K, Q5_K, Q6_K] {
        assert_eq!(w.vec_dot_type(), Some(Q8_K), "{w}");
    }
    for w in [F32, F16, BF16] {
        assert_eq!(w.vec_dot_type(), None, "{w}");
    }
}

#[test]
fn vec_dot_refuses_mismatched_rows_naming_the_operand_and_sizes() {
    let err = vec_dot(GgmlType::Q4_0, &[0; 36], &[0; 34], 64).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vec_dot activation Q8_0: 64 values need 68 bytes, the buffer has 34"
    );
    let err = vec_dot(GgmlType::Q4_K, &[0; 144], &[0; 292], 255).unwrap_err();
    assert!(
        matches!(
            err,
            QuantError::PartialBlock {
                op: "vec_dot weight",
                n: 255,
                ..
            }
        ),
        "{err}"
    );
    let err = vec_dot(GgmlType::F16, &[0; 64], &[0; 34], 32).unwrap_err();
    assert_eq!(err.to_string(), "vec_dot is not implemented for ggml type F16");
    let err = vec_dot(GgmlType::Q2_K, &[0; 84], &[0; 292], 256).unwrap_err();
    assert_eq!(err.to_string(), "vec_dot is not implemented for ggml type Q2_K");
}

#[test]
fn float_weight_dot_products_widen_exactly_and_sum_in_lanes() {
    let mut r = XorShift(7);
    for n in [0usize, 1, 7, 8, 9, 64, 67] {
        let w: Vec<f32> = (0..n).map(|_| r.signed_unit()).collect();
        let x: Vec<f32> = (0..n).map(|_| r.signed_unit()).collect();
        // Documented order: eight lanes over the leading multiple of 8, then the tail.
        let body = n / 8 * 8;
        let mut lanes = [0.0f32; 8];
        for i in 0..body {
            lanes[i % 8] += w[i] * x[i];
        }
        let mut expected = lanes.iter().fold(0.0f32, |s, &l| s + l);
        for i in body..n {
            expected += w[i] * x[i];
        }
        let f32_bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let got = vec_dot_f32(GgmlType::F32, &f32_bytes, &x).unwrap();
        assert_eq!(got.to_bits(), expected.to_bits(), "F32 n = {n}");

        for ty in [GgmlType::F16, GgmlType::BF16] {
            let mut bytes = vec![0u8; 2 * n];
            quantize_row(ty, &w, &mut bytes).unwrap();
            let mut widened = vec![0.0f32; n];
            dequantize_row(ty, &bytes, &mut widened).unwrap();
            let exact: f64 = widened.iter().zip(&x).map(|(&p, &q)| p as f64 * q as f64).sum();
            let got = vec_dot_f32(ty, &bytes, &x).unwrap();
            assert!(
                (got as f64 - exact).abs() <= 1e-6 * (n as f64 + 1.0),
                "{ty} n = {n}: {got} vs {exact}"
            );
        }
    }
    let err = vec_dot_f32(GgmlType::F16, &[0; 6], &[0.0; 4]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "vec_dot_f32 F16: 4 values need 8 bytes, the buffer has 6"
    );
    let err = vec_dot_f32(GgmlType::Q8_0, &[0; 34], &[0.0; 32]).unwrap_err();
    assert_eq!(err.to_string(), "vec_dot_f32 is not implemented for ggml type Q8_0");
}
