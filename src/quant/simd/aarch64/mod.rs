//! aarch64 kernels: NEON, which every aarch64 CPU has, and the same kernels with the `dotprod`
//! extension's SDOT in place of NEON's widening multiplies (`const SDOT: bool`); and, in each
//! file's `i8mm` module, the products of two weight rows with two activation rows at once
//! (ggml's `nrc == 2` form) on the `i8mm` extension's SMMLA, which multiplies a 2 × 8 matrix of
//! bytes by another's transpose into four i32 sums: the prompt's tiles of two rows by two tokens.
//!
//! As on x86 (`super::x86`), every kernel computes each block's (or sub-block's) integer dot
//! product exactly, in whatever lane arrangement, and then does the reference's float
//! operations in the reference's order, one scalar IEEE multiply or add at a time (Rust never
//! fuses them): the results are bit-identical to the scalar references for every input, so a
//! model's logits on an ARM CPU are those on an x86 one.
//!
//! SDOT and SMMLA are emitted through `asm!` (their intrinsics are not stable) inside functions
//! compiled with `dotprod` (and `i8mm`) enabled, which the type table hands out only after
//! run-time detection (`super::Isa::Dotprod`, `super::Isa::I8mm`); the baseline kernels are
//! compiled without them, so the compiler cannot slip such an instruction into them. The F16
//! widening (`fcvtl`) is baseline ARMv8.
//!
//! All kernels here are `unsafe` only because the SDOT forms require the feature; memory accesses
//! are within fixed-size arrays or bounds-checked slices.

pub(in crate::quant) mod float;
pub(in crate::quant) mod k_quants;
pub(in crate::quant) mod legacy;

use std::arch::aarch64::*;
use std::arch::asm;

/// The byte rows of a dot product as blocks: the weight row `x` as `W`, the activation rows `ys`
/// as `A`, all cut to their common length.
///
/// # Panics
/// If a row is not aligned for its blocks or not a whole number of them; the table's safe
/// entries (`crate::quant::traits::BlockDots`) pass only rows that are.
#[inline(always)]
fn block_rows<'a, W: bytemuck::Pod, A: bytemuck::Pod, const N: usize>(
    x: &'a [u8],
    ys: [&'a [u8]; N],
) -> (&'a [W], [&'a [A]; N]) {
    let x: &[W] = bytemuck::cast_slice(x);
    let ys: [&[A]; N] = ys.map(bytemuck::cast_slice);
    let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
    (&x[..n], ys.map(|y| &y[..n]))
}

/// [`block_rows`] for two weight rows and two activation rows, all cut to their common length.
#[inline(always)]
fn block_rows_2x2<'a, W: bytemuck::Pod, A: bytemuck::Pod>(
    xs: [&'a [u8]; 2],
    ys: [&'a [u8]; 2],
) -> ([&'a [W]; 2], [&'a [A]; 2]) {
    let xs: [&[W]; 2] = xs.map(bytemuck::cast_slice);
    let ys: [&[A]; 2] = ys.map(bytemuck::cast_slice);
    let n = xs
        .iter()
        .map(|x| x.len())
        .chain(ys.iter().map(|y| y.len()))
        .min()
        .unwrap_or(0);
    (xs.map(|x| &x[..n]), ys.map(|y| &y[..n]))
}

/// `acc` plus the 2 × 2 products of the matrices of signed bytes `a` and `b`, each two rows of 8
/// (bytes 0..8 and 8..16): lane `2i + j` gains row `i` of `a` dotted with row `j` of `b` (SMMLA),
/// exactly.
///
/// # Safety
/// Only inside a function compiled with `i8mm`, on a CPU that has it.
#[inline(always)]
unsafe fn smmla(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: a register-only instruction, run only where `i8mm` was detected.
    asm!(
        "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// Two rows' 16 bytes as two SMMLA operands: the first 8 of each (row 0 then row 1), and the
/// last 8 of each.
#[inline(always)]
unsafe fn interleave(r0: int8x16_t, r1: int8x16_t) -> (int8x16_t, int8x16_t) {
    let (a, b) = (vreinterpretq_s64_s8(r0), vreinterpretq_s64_s8(r1));
    (
        vreinterpretq_s8_s64(vzip1q_s64(a, b)),
        vreinterpretq_s8_s64(vzip2q_s64(a, b)),
    )
}

/// `acc` plus, in lane `2i + j`, the exact dot product of the 16 signed bytes `w[i]` with `a[j]`.
///
/// # Safety
/// As for [`smmla`].
#[inline(always)]
unsafe fn mmla16(acc: int32x4_t, w: [int8x16_t; 2], a: [int8x16_t; 2]) -> int32x4_t {
    let (w_lo, w_hi) = interleave(w[0], w[1]);
    let (a_lo, a_hi) = interleave(a[0], a[1]);
    smmla(smmla(acc, w_lo, a_lo), w_hi, a_hi)
}

/// `acc` plus the products of the signed bytes `a` and `b`, four consecutive products summed
/// into each i32 lane (SDOT), or, without `SDOT`, pairs of NEON's widening products summed
/// into the lanes: a different arrangement of the same exact integers (a product is at most
/// 2^14 in magnitude, so no i16 step overflows).
#[inline(always)]
unsafe fn dot16<const SDOT: bool>(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    if SDOT {
        let mut acc = acc;
        // SAFETY: a register-only instruction; SDOT forms run only where `dotprod` was
        // detected, inside functions compiled with it.
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    } else {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// The exact integer dot product of 32 signed bytes `(a0, a1)` with `(b0, b1)`.
#[inline(always)]
unsafe fn dot32<const SDOT: bool>(a: (int8x16_t, int8x16_t), b: (int8x16_t, int8x16_t)) -> i32 {
    let acc = dot16::<SDOT>(dot16::<SDOT>(vdupq_n_s32(0), a.0, b.0), a.1, b.1);
    vaddvq_s32(acc)
}

/// The 16 bytes of `bytes` from element `at` on, as signed bytes.
#[inline(always)]
unsafe fn load16<T: Copy>(bytes: &[T], at: usize) -> int8x16_t {
    const { assert!(16 % std::mem::size_of::<T>() == 0) };
    let bytes = &bytes[at..at + 16 / std::mem::size_of::<T>()];
    // SAFETY: the slice above is 16 bytes long.
    vld1q_s8(bytes.as_ptr().cast())
}

/// The 16 bytes of `bytes` from element `at` on, as unsigned bytes.
#[inline(always)]
unsafe fn load16u<T: Copy>(bytes: &[T], at: usize) -> uint8x16_t {
    vreinterpretq_u8_s8(load16(bytes, at))
}

/// Byte `i` is 0x10 where bit `i` of the little-endian `bits` (16 bits) is set, 0 elsewhere:
/// the fifth bit of 16 five-bit levels.
#[inline(always)]
unsafe fn fifth_bits_16(bits: u16) -> uint8x16_t {
    let [b0, b1] = bits.to_le_bytes();
    let spread = vcombine_u8(vdup_n_u8(b0), vdup_n_u8(b1));
    let which = vreinterpretq_u8_u64(vdupq_n_u64(0x8040_2010_0804_0201));
    vandq_u8(vtstq_u8(spread, which), vdupq_n_u8(0x10))
}

/// Declares the entry points of a kernel whose body is the `#[inline(always)]` generic
/// `$body::<SDOT, ...>`: the baseline NEON form compiled as it is, the SDOT form inside a
/// function compiled with `dotprod` (so that its `asm!` assembles and nothing of the baseline
/// form can use the extension). `one` entries take one weight row and `N` activation rows.
macro_rules! sdot_entry {
    ($(#[$doc:meta])* $name:ident, $body:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// With `SDOT`, the CPU must have the `dotprod` extension.
        pub(in crate::quant) unsafe fn $name<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
            #[target_feature(enable = "dotprod")]
            unsafe fn with_sdot<const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
                $body::<true, N>(x, ys)
            }
            if SDOT {
                with_sdot::<N>(x, ys)
            } else {
                $body::<false, N>(x, ys)
            }
        }
    };
}
pub(in crate::quant::simd::aarch64) use sdot_entry;

/// Declares the entry point of a two-by-two kernel whose body is the `#[inline(always)]`
/// `$body`: two weight rows `xs` with two activation rows `ys`, giving `[row][token]`, compiled
/// with `dotprod` and `i8mm` so that its `asm!` assembles.
macro_rules! mmla_entry {
    ($(#[$doc:meta])* $name:ident, $body:ident) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU must have the `dotprod` and `i8mm` extensions.
        #[target_feature(enable = "dotprod,i8mm")]
        pub(in crate::quant) unsafe fn $name(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
            $body(xs, ys)
        }
    };
}
pub(in crate::quant::simd::aarch64) use mmla_entry;
