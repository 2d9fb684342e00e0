//! Every kernel of every instruction set this CPU supports against the scalar references,
//! compared bit for bit (`to_bits`), on random rows of 1 to 64 blocks that mix ordinary blocks
//! with zero scales, extreme levels and activations (-128 included) and all-equal values.

use super::*;
use crate::quant::fp16::{f32_to_bf16, f32_to_f16};
use crate::quant::k_quants::QK_K;
use crate::quant::{vec_dot_bf16_ref, vec_dot_f16_ref, vec_dot_f32_ref};
use bytemuck::{Pod, Zeroable};

struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in [-1, 1).
    fn signed_unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn fill(&mut self, bytes: &mut [u8]) {
        for b in bytes {
            *b = self.next() as u8;
        }
    }
}

/// What a generated block stresses.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Mode {
    /// Random levels and scales.
    Random,
    /// Scales (and for Q8_K the activation scale) of zero.
    ZeroScale,
    /// Every level at one end of its range, scales at their largest magnitude.
    Extreme,
    /// Every level byte the same random value.
    AllEqual,
}

impl XorShift {
    fn mode(&mut self) -> Mode {
        match self.below(6) {
            0 => Mode::ZeroScale,
            1 => Mode::Extreme,
            2 => Mode::AllEqual,
            _ => Mode::Random,
        }
    }

    /// An F16 scale of magnitude up to `max_abs` (exactly `max_abs` in extreme mode).
    fn scale(&mut self, mode: Mode, max_abs: f32) -> u16 {
        match mode {
            Mode::ZeroScale => 0,
            Mode::Extreme => f32_to_f16(if self.below(2) == 0 { max_abs } else { -max_abs }),
            Mode::Random | Mode::AllEqual => f32_to_f16(self.signed_unit() * max_abs),
        }
    }

    /// Level bytes: random, all 0x00 or all 0xff, or all one random byte.
    fn levels(&mut self, mode: Mode, bytes: &mut [u8]) {
        match mode {
            Mode::Extreme => bytes.fill(if self.below(2) == 0 { 0x00 } else { 0xff }),
            Mode::AllEqual => bytes.fill(self.next() as u8),
            Mode::Random | Mode::ZeroScale => self.fill(bytes),
        }
    }

    /// Activation values: random, all 127 or all -128, or all one random value.
    fn q8(&mut self, mode: Mode, qs: &mut [i8]) {
        match mode {
            Mode::Extreme => qs.fill(if self.below(2) == 0 { 127 } else { -128 }),
            Mode::AllEqual => qs.fill(self.next() as i8),
            Mode::Random | Mode::ZeroScale => self.fill(bytemuck::cast_slice_mut(qs)),
        }
    }

    fn blocks<B: Pod>(&mut self, n: usize, gen: fn(&mut XorShift, Mode) -> B) -> Vec<B> {
        (0..n)
            .map(|_| {
                let mode = self.mode();
                gen(self, mode)
            })
            .collect()
    }
}

fn gen_q4_0(r: &mut XorShift, mode: Mode) -> BlockQ4_0 {
    let mut b = BlockQ4_0::zeroed();
    b.d = r.scale(mode, 0.5);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q4_1(r: &mut XorShift, mode: Mode) -> BlockQ4_1 {
    let mut b = BlockQ4_1::zeroed();
    b.d = r.scale(mode, 0.5);
    b.m = r.scale(if mode == Mode::ZeroScale { Mode::Random } else { mode }, 4.0);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q5_0(r: &mut XorShift, mode: Mode) -> BlockQ5_0 {
    let mut b = BlockQ5_0::zeroed();
    b.d = r.scale(mode, 0.25);
    r.levels(mode, &mut b.qh);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q5_1(r: &mut XorShift, mode: Mode) -> BlockQ5_1 {
    let mut b = BlockQ5_1::zeroed();
    b.d = r.scale(mode, 0.25);
    b.m = r.scale(if mode == Mode::ZeroScale { Mode::Random } else { mode }, 4.0);
    r.levels(mode, &mut b.qh);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q8_0(r: &mut XorShift, mode: Mode) -> BlockQ8_0 {
    let mut b = BlockQ8_0::zeroed();
    b.d = r.scale(mode, 0.05);
    r.q8(mode, &mut b.qs);
    b
}

fn gen_q8_1(r: &mut XorShift, mode: Mode) -> BlockQ8_1 {
    let mut b = BlockQ8_1::zeroed();
    b.d = r.scale(mode, 0.05);
    r.q8(mode, &mut b.qs);
    let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
    b.s = f32_to_f16(sum as f32 * crate::quant::fp16::f16_to_f32(b.d));
    b
}

fn gen_q8_k(r: &mut XorShift, mode: Mode) -> BlockQ8K {
    let mut b = BlockQ8K::zeroed();
    b.d = match mode {
        Mode::ZeroScale => 0.0,
        Mode::Extreme => -0.05,
        Mode::Random | Mode::AllEqual => r.signed_unit() * 0.05,
    };
    r.q8(mode, &mut b.qs);
    for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
        *s = g.iter().map(|&q| i16::from(q)).sum();
    }
    b
}

fn gen_q4_k(r: &mut XorShift, mode: Mode) -> BlockQ4K {
    let mut b = BlockQ4K::zeroed();
    b.d = r.scale(mode, 0.02);
    b.dmin = r.scale(if mode == Mode::ZeroScale { Mode::Random } else { mode }, 0.02);
    r.levels(mode, &mut b.scales);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q5_k(r: &mut XorShift, mode: Mode) -> BlockQ5K {
    let mut b = BlockQ5K::zeroed();
    b.d = r.scale(mode, 0.01);
    b.dmin = r.scale(if mode == Mode::ZeroScale { Mode::Random } else { mode }, 0.02);
    r.levels(mode, &mut b.scales);
    r.levels(mode, &mut b.qh);
    r.levels(mode, &mut b.qs);
    b
}

fn gen_q6_k(r: &mut XorShift, mode: Mode) -> BlockQ6K {
    let mut b = BlockQ6K::zeroed();
    b.d = r.scale(mode, 0.002);
    r.levels(mode, &mut b.ql);
    r.levels(mode, &mut b.qh);
    let mut scales = [0u8; QK_K / 16];
    match mode {
        Mode::Extreme => scales.fill(if r.below(2) == 0 { 127 } else { 128 }),
        _ => r.levels(mode, &mut scales),
    }
    b.scales = bytemuck::cast(scales);
    b
}

/// Row lengths in blocks: 1 to 64, around every multiple of the 8-block chunks.
const BLOCK_COUNTS: &[usize] = &[1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 24, 31, 32, 33, 40, 47, 63, 64];

/// Trials per length; each draws fresh rows.
const TRIALS: usize = 6;

/// The single-row and two-row forms of a block kernel.
type BlockDots<W, A> = (
    fn(&DotKernels, &[W], &[A]) -> f32,
    fn(&DotKernels, &[W], &[A], &[A]) -> [f32; 2],
);

/// Compares both forms of a kernel against `reference` on random rows of every length in
/// [`BLOCK_COUNTS`].
fn check_blocks<W: Pod, A: Pod>(
    what: &str,
    isa: Isa,
    seed: u64,
    gen_w: fn(&mut XorShift, Mode) -> W,
    gen_a: fn(&mut XorShift, Mode) -> A,
    reference: fn(&[W], &[A]) -> f32,
    (simd, simd_x2): BlockDots<W, A>,
) {
    let Some(kernels) = DotKernels::for_isa(isa) else {
        eprintln!("{what}: this CPU has no {}, skipped", isa.name());
        return;
    };
    let mut r = XorShift(seed);
    for &n in BLOCK_COUNTS {
        for trial in 0..TRIALS {
            let w = r.blocks(n, gen_w);
            let a = r.blocks(n, gen_a);
            let b = r.blocks(n, gen_a);
            let expected = [reference(&w, &a), reference(&w, &b)];
            let got = simd(kernels, &w, &a);
            let got_x2 = simd_x2(kernels, &w, &a, &b);
            let context = || format!("{what} on {}: {n} blocks, trial {trial}", isa.name());
            assert_eq!(
                got.to_bits(),
                expected[0].to_bits(),
                "{}: {got} vs {}",
                context(),
                expected[0]
            );
            for (row, (g, e)) in got_x2.iter().zip(expected).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{}, two rows, row {row}: {g} vs {e}",
                    context()
                );
            }
        }
    }
}

/// Bytes per weight and the encoding of one weight.
type Encoding = (usize, fn(f32) -> Vec<u8>);

/// A float-weight reference and the table entry under test.
type FloatDots = (fn(&[u8], &[f32]) -> f32, fn(&DotKernels, &[u8], &[f32]) -> f32);

/// Compares a float-weight kernel against its reference on rows of 0 to 600 values: random
/// values, zeros, subnormal F16 weights, and large and tiny magnitudes that round differently
/// in every lane.
fn check_float(what: &str, isa: Isa, seed: u64, (width, to_bytes): Encoding, (reference, simd): FloatDots) {
    let Some(kernels) = DotKernels::for_isa(isa) else {
        eprintln!("{what}: this CPU has no {}, skipped", isa.name());
        return;
    };
    let mut r = XorShift(seed);
    let lengths = (0..=40).chain([63, 64, 65, 100, 255, 256, 257, 511, 600]);
    for n in lengths {
        for trial in 0..TRIALS {
            let kind = r.below(4);
            let value = |r: &mut XorShift| match kind {
                0 => r.signed_unit(),
                1 => r.signed_unit() * 6e-5,                               // F16 subnormals
                2 => r.signed_unit() * 2f32.powi(r.below(40) as i32 - 20), // wide exponents
                _ => 0.0,
            };
            let wf: Vec<f32> = (0..n).map(|_| value(&mut r)).collect();
            let x: Vec<f32> = (0..n)
                .map(|_| r.signed_unit() * 2f32.powi(r.below(20) as i32 - 10))
                .collect();
            let w: Vec<u8> = wf.iter().flat_map(|&v| to_bytes(v)).collect();
            assert_eq!(w.len(), width * n);
            let expected = reference(&w, &x);
            let got = simd(kernels, &w, &x);
            assert_eq!(
                got.to_bits(),
                expected.to_bits(),
                "{what} on {}: {n} values, trial {trial}: {got} vs the reference's {expected}",
                isa.name()
            );
        }
    }
}

fn f32_bytes(v: f32) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

fn f16_bytes(v: f32) -> Vec<u8> {
    f32_to_f16(v).to_le_bytes().to_vec()
}

fn bf16_bytes(v: f32) -> Vec<u8> {
    f32_to_bf16(v).to_le_bytes().to_vec()
}

/// One test per instruction set and type: `$name` on `$isa`.
macro_rules! block_dot_tests {
    ($($name:ident: $isa:expr, $ty:ident, $ty_x2:ident, $gen_w:ident, $gen_a:ident, $reference:path, $seed:literal;)*) => {$(
        #[test]
        fn $name() {
            let dots: BlockDots<_, _> = (DotKernels::$ty, DotKernels::$ty_x2);
            check_blocks(stringify!($ty), $isa, $seed, $gen_w, $gen_a, $reference, dots);
        }
    )*};
}

macro_rules! float_dot_tests {
    ($($name:ident: $isa:expr, $ty:ident, $width:literal, $bytes:ident, $reference:ident, $seed:literal;)*) => {$(
        #[test]
        fn $name() {
            let dots: FloatDots = ($reference, DotKernels::$ty);
            check_float(stringify!($ty), $isa, $seed, ($width, $bytes), dots);
        }
    )*};
}

block_dot_tests! {
    q4_0_scalar_table_is_the_scalar_reference: Isa::Scalar, q4_0, q4_0_x2, gen_q4_0, gen_q8_0, q4_0::vec_dot_ref, 1;
    q4_0_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q4_0, q4_0_x2, gen_q4_0, gen_q8_0, q4_0::vec_dot_ref, 2;
    q4_0_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q4_0, q4_0_x2, gen_q4_0, gen_q8_0, q4_0::vec_dot_ref, 3;
    q4_1_scalar_table_is_the_scalar_reference: Isa::Scalar, q4_1, q4_1_x2, gen_q4_1, gen_q8_1, q4_1::vec_dot_ref, 4;
    q4_1_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q4_1, q4_1_x2, gen_q4_1, gen_q8_1, q4_1::vec_dot_ref, 5;
    q4_1_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q4_1, q4_1_x2, gen_q4_1, gen_q8_1, q4_1::vec_dot_ref, 6;
    q5_0_scalar_table_is_the_scalar_reference: Isa::Scalar, q5_0, q5_0_x2, gen_q5_0, gen_q8_0, q5_0::vec_dot_ref, 7;
    q5_0_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q5_0, q5_0_x2, gen_q5_0, gen_q8_0, q5_0::vec_dot_ref, 8;
    q5_0_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q5_0, q5_0_x2, gen_q5_0, gen_q8_0, q5_0::vec_dot_ref, 9;
    q5_1_scalar_table_is_the_scalar_reference: Isa::Scalar, q5_1, q5_1_x2, gen_q5_1, gen_q8_1, q5_1::vec_dot_ref, 10;
    q5_1_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q5_1, q5_1_x2, gen_q5_1, gen_q8_1, q5_1::vec_dot_ref, 11;
    q5_1_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q5_1, q5_1_x2, gen_q5_1, gen_q8_1, q5_1::vec_dot_ref, 12;
    q8_0_scalar_table_is_the_scalar_reference: Isa::Scalar, q8_0, q8_0_x2, gen_q8_0, gen_q8_0, q8_0::vec_dot_ref, 13;
    q8_0_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q8_0, q8_0_x2, gen_q8_0, gen_q8_0, q8_0::vec_dot_ref, 14;
    q8_0_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q8_0, q8_0_x2, gen_q8_0, gen_q8_0, q8_0::vec_dot_ref, 15;
    q4_k_scalar_table_is_the_scalar_reference: Isa::Scalar, q4_k, q4_k_x2, gen_q4_k, gen_q8_k, q4_k::vec_dot_ref, 16;
    q4_k_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q4_k, q4_k_x2, gen_q4_k, gen_q8_k, q4_k::vec_dot_ref, 17;
    q4_k_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q4_k, q4_k_x2, gen_q4_k, gen_q8_k, q4_k::vec_dot_ref, 18;
    q5_k_scalar_table_is_the_scalar_reference: Isa::Scalar, q5_k, q5_k_x2, gen_q5_k, gen_q8_k, q5_k::vec_dot_ref, 19;
    q5_k_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q5_k, q5_k_x2, gen_q5_k, gen_q8_k, q5_k::vec_dot_ref, 20;
    q5_k_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q5_k, q5_k_x2, gen_q5_k, gen_q8_k, q5_k::vec_dot_ref, 21;
    q6_k_scalar_table_is_the_scalar_reference: Isa::Scalar, q6_k, q6_k_x2, gen_q6_k, gen_q8_k, q6_k::vec_dot_ref, 22;
    q6_k_avx2_dot_matches_the_scalar_reference: Isa::Avx2, q6_k, q6_k_x2, gen_q6_k, gen_q8_k, q6_k::vec_dot_ref, 23;
    q6_k_avx512_dot_matches_the_scalar_reference: Isa::Avx512, q6_k, q6_k_x2, gen_q6_k, gen_q8_k, q6_k::vec_dot_ref, 24;
}

float_dot_tests! {
    f32_scalar_table_is_the_scalar_reference: Isa::Scalar, f32, 4, f32_bytes, vec_dot_f32_ref, 31;
    f32_avx2_dot_matches_the_scalar_reference: Isa::Avx2, f32, 4, f32_bytes, vec_dot_f32_ref, 32;
    f32_avx512_dot_matches_the_scalar_reference: Isa::Avx512, f32, 4, f32_bytes, vec_dot_f32_ref, 33;
    f16_scalar_table_is_the_scalar_reference: Isa::Scalar, f16, 2, f16_bytes, vec_dot_f16_ref, 34;
    f16_avx2_dot_matches_the_scalar_reference: Isa::Avx2, f16, 2, f16_bytes, vec_dot_f16_ref, 35;
    f16_avx512_dot_matches_the_scalar_reference: Isa::Avx512, f16, 2, f16_bytes, vec_dot_f16_ref, 36;
    bf16_scalar_table_is_the_scalar_reference: Isa::Scalar, bf16, 2, bf16_bytes, vec_dot_bf16_ref, 37;
    bf16_avx2_dot_matches_the_scalar_reference: Isa::Avx2, bf16, 2, bf16_bytes, vec_dot_bf16_ref, 38;
    bf16_avx512_dot_matches_the_scalar_reference: Isa::Avx512, bf16, 2, bf16_bytes, vec_dot_bf16_ref, 39;
}

#[test]
fn the_environment_switches_force_the_narrower_paths() {
    assert_eq!(Isa::best_supported(false, true), Isa::Scalar);
    assert_eq!(Isa::best_supported(true, true), Isa::Scalar);
    let no_avx512 = Isa::best_supported(true, false);
    assert!(no_avx512 <= Isa::Avx2);
    assert_eq!(no_avx512 == Isa::Avx2, Isa::Avx2.is_supported());
    let best = Isa::best_supported(false, false);
    assert!(best.is_supported());
    assert!(Isa::ALL.iter().all(|&isa| isa <= best || !isa.is_supported()));
}

#[test]
fn the_chosen_kernels_run_on_this_cpu_and_name_their_instruction_set() {
    let chosen = kernels();
    assert!(chosen.isa().is_supported());
    assert_eq!(simd_level(), chosen.isa().name());
    assert!(["scalar", "avx2", "avx512-vnni"].contains(&simd_level()));
    for isa in Isa::ALL {
        assert_eq!(DotKernels::for_isa(isa).is_some(), isa.is_supported(), "{isa:?}");
        if let Some(k) = DotKernels::for_isa(isa) {
            assert_eq!(k.isa(), isa);
        }
    }
}

#[test]
#[should_panic(expected = "block counts differ")]
fn a_kernel_refuses_rows_of_different_lengths() {
    let w = [BlockQ8_0::zeroed(); 2];
    let a = [BlockQ8_0::zeroed(); 3];
    kernels().q8_0(&w, &a);
}
