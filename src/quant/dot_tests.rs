//! Checks of the block dot products against an independent analytic reference: both operands
//! dequantized with the existing dequantizers and multiplied in f64. The reference shares no
//! integer arithmetic with the code under test, so a wrong nibble, scale or min shows up as a
//! wrong sum rather than as the same mistake made twice. The checks run over the rows of the
//! type table: a new type is checked by adding its row.

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::QK_K;
use super::q8_1::BlockQ8_1;
use super::simd::Isa;
use super::traits::{self, TypeTraits};
use super::*;
use crate::test_util::XorShift;
use bytemuck::Zeroable;

struct Reference {
    dot: f64,
    /// Sum of |x_i * y_i|: the scale against which float rounding is judged.
    magnitude: f64,
}

fn analytic(wty: GgmlType, w: &[u8], aty: GgmlType, a: &[u8]) -> Reference {
    let n = w.len() / wty.type_size() * wty.block_size();
    let mut xw = vec![0.0f32; n];
    let mut xa = vec![0.0f32; n];
    dequantize_row(wty, w, &mut xw).unwrap();
    dequantize_row(aty, a, &mut xa).unwrap();
    let mut dot = 0.0f64;
    let mut magnitude = 0.0f64;
    for (&p, &q) in xw.iter().zip(&xa) {
        dot += p as f64 * q as f64;
        magnitude += (p as f64 * q as f64).abs();
    }
    Reference { dot, magnitude }
}

/// The F16 rounding of a stored sum (Q8_1's `s`), which the dot products of weights with a
/// minimum (Q4_1, Q5_1) use in place of the sum of the dequantized activations: the minimum
/// times half an F16 ulp of `s`, relative (doubled when `s` was computed from the unrounded
/// scale), or half the smallest subnormal. Zero for the types without stored sums.
fn stored_sum_allowance(w_row: &TypeTraits, a_row: &TypeTraits, w: &[u8], a: &[u8], relative: f64) -> f64 {
    let (factor, sum) = (w_row.test.unwrap().stored_sum_factor, a_row.test.unwrap().stored_sum);
    w.chunks_exact(w_row.type_size)
        .zip(a.chunks_exact(a_row.type_size))
        .map(|(wb, ab)| factor(wb).abs() as f64 * (sum(ab).abs() as f64 * relative + 2f64.powi(-25)))
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

/// The scalar table's rows of the quantized weight types, each with its activation type's row.
fn quantized_weights() -> impl Iterator<Item = (&'static TypeTraits, &'static TypeTraits)> {
    let scalar = traits::for_isa(Isa::Scalar).unwrap();
    scalar
        .iter()
        .filter(|row| row.block_dots().is_some())
        .map(move |row| (row, traits::row_in(scalar, row.vec_dot_type.unwrap()).unwrap()))
}

const TRIALS: usize = 200;

#[test]
fn every_quantized_dot_product_matches_the_analytic_dot_product() {
    for (w_row, a_row) in quantized_weights() {
        let what = format!("{}·{}", w_row.ty, a_row.ty);
        let reference = w_row.block_dots().unwrap();
        let (w_hooks, a_hooks) = (w_row.test.unwrap(), a_row.test.unwrap());
        // 8 blocks of 32 values, or 4 super-blocks.
        let nb = (1024 / w_row.block_size).min(8);
        let n = nb * w_row.block_size;
        let mut r = XorShift(0x9e37_79b9_7f4a_7c15 ^ w_row.ty as u64);
        for trial in 0..TRIALS {
            let w = w_hooks.random_row(&mut r, nb, w_row.type_size);
            let a = a_hooks.random_row(&mut r, nb, a_row.type_size);
            let got = reference.dot(&w, &a);
            let allowance = stored_sum_allowance(w_row, a_row, &w, &a, 2f64.powi(-11));
            assert_close(&what, trial, got, &analytic(w_row.ty, &w, a_row.ty, &a), allowance);
            // The entry point (the chosen instruction set's kernel) gives the same bits, aligned
            // or not.
            assert_eq!(
                vec_dot(w_row.ty, &w, &a, n).unwrap().to_bits(),
                got.to_bits(),
                "{what} dispatch"
            );
            let mut shifted = vec![0u8; w.len() + 1];
            shifted[1..].copy_from_slice(&w);
            assert_eq!(
                vec_dot(w_row.ty, &shifted[1..], &a, n).unwrap().to_bits(),
                got.to_bits(),
                "{what} unaligned"
            );
        }
    }
}

#[test]
fn dot_products_of_quantized_f32_rows_match_the_analytic_dot_product() {
    // The path a matmul takes: both sides produced by the reference quantizers.
    let mut r = XorShift(0x2545_f491_4f6c_dd1d);
    // (A type minfer only reads has no reference quantizer: the random blocks of the test above
    // check it.)
    for (w_row, a_row) in quantized_weights().filter(|(w, _)| w.can_quantize()) {
        let (wty, aty) = (w_row.ty, a_row.ty);
        let n = 2 * QK_K;
        for trial in 0..20 {
            let xw: Vec<f32> = (0..n).map(|_| r.signed_unit() * 2.0).collect();
            let xa: Vec<f32> = (0..n).map(|_| r.signed_unit() * 3.0).collect();
            let mut w = vec![0u8; wty.row_size(n as u64).unwrap() as usize];
            let mut a = vec![0u8; aty.row_size(n as u64).unwrap() as usize];
            quantize_row(wty, &xw, &mut w).unwrap();
            quantize_row(aty, &xa, &mut a).unwrap();
            let got = vec_dot(wty, &w, &a, n).unwrap();
            // Q8_1's `s` is computed from the scale before its F16 rounding: two roundings.
            let allowance = stored_sum_allowance(w_row, a_row, &w, &a, 2f64.powi(-10));
            assert_close(wty.name(), trial, got, &analytic(wty, &w, aty, &a), allowance);
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
    let err = vec_dot(GgmlType::I32, &[0; 4], &[0; 4], 1).unwrap_err();
    assert_eq!(err.to_string(), "vec_dot is not implemented for ggml type I32");
}

#[test]
fn float_weight_dot_products_widen_exactly_and_sum_in_lanes() {
    let mut r = XorShift(7);
    for row in traits::computable().filter(|row| row.float_dot().is_some()) {
        let ty = row.ty;
        for n in [0usize, 1, 7, 8, 9, 64, 67] {
            let values: Vec<f32> = (0..n).map(|_| r.signed_unit()).collect();
            let x: Vec<f32> = (0..n).map(|_| r.signed_unit()).collect();
            let mut bytes = vec![0u8; row.type_size * n];
            quantize_row(ty, &values, &mut bytes).unwrap();
            // Widening is exact, so the documented order on the widened weights is the result:
            // eight lanes over the leading multiple of 8, then the tail.
            let mut w = vec![0.0f32; n];
            dequantize_row(ty, &bytes, &mut w).unwrap();
            let body = n / 8 * 8;
            let mut lanes = [0.0f32; 8];
            for i in 0..body {
                lanes[i % 8] += w[i] * x[i];
            }
            let mut expected = lanes.iter().fold(0.0f32, |s, &l| s + l);
            for i in body..n {
                expected += w[i] * x[i];
            }
            let got = vec_dot_f32(ty, &bytes, &x).unwrap();
            assert_eq!(got.to_bits(), expected.to_bits(), "{ty} n = {n}");
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
