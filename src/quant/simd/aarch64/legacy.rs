//! The 32-value block dot products (Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1) of
//! one weight row with `N` activation rows at once: each weight block is unpacked once into 32
//! signed bytes, its exact integer dot product with each activation block taken in NEON lanes,
//! and the reference's per-block float expression added to the row's sum, block by block, in the
//! reference's order.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_1::BlockQ8_1;

/// The block loop shared by the kernels: `unpack(xb)` gives a weight block's 32 levels as
/// signed bytes (element order), `acts(yb)` an activation block's, and `term(xb, yb, sumi)` the
/// reference's float term of the block given its integer sum.
#[inline(always)]
unsafe fn blockwise<const SDOT: bool, const N: usize, W: Copy, A: Copy>(
    x: &[W],
    ys: [&[A]; N],
    unpack: impl Fn(&W) -> (int8x16_t, int8x16_t),
    acts: impl Fn(&A) -> (int8x16_t, int8x16_t),
    term: impl Fn(&W, &A, i32) -> f32,
) -> [f32; N] {
    let mut sums = [0.0f32; N];
    for (i, xb) in x.iter().enumerate() {
        let w = unpack(xb);
        for (sum, y) in sums.iter_mut().zip(&ys) {
            let yb = &y[i];
            *sum += term(xb, yb, dot32::<SDOT>(w, acts(yb)));
        }
    }
    sums
}

/// A Q8_0 block's 32 values.
#[inline(always)]
unsafe fn q8_0_values(b: &BlockQ8_0) -> (int8x16_t, int8x16_t) {
    (load16(&b.qs, 0), load16(&b.qs, 16))
}

/// A Q8_1 block's 32 values.
#[inline(always)]
unsafe fn q8_1_values(b: &BlockQ8_1) -> (int8x16_t, int8x16_t) {
    (load16(&b.qs, 0), load16(&b.qs, 16))
}

/// 16 packed nibbles as the low nibbles (elements 0..16) and the high ones (16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = load16u(qs, 0);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

/// The 32 five-bit levels of a Q5 block: its nibbles with the fifth bits of `qh`.
#[inline(always)]
unsafe fn five_bit_levels(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let (lo, hi) = nibbles(qs);
    let qh = u32::from_le_bytes(qh);
    (
        vorrq_u8(lo, fifth_bits_16(qh as u16)),
        vorrq_u8(hi, fifth_bits_16((qh >> 16) as u16)),
    )
}

/// Unsigned levels as signed bytes, less `offset`.
#[inline(always)]
unsafe fn signed(levels: (uint8x16_t, uint8x16_t), offset: i8) -> (int8x16_t, int8x16_t) {
    let o = vdupq_n_s8(offset);
    (
        vsubq_s8(vreinterpretq_s8_u8(levels.0), o),
        vsubq_s8(vreinterpretq_s8_u8(levels.1), o),
    )
}

#[inline(always)]
unsafe fn q4_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4_0, BlockQ8_0, N>(x, ys);
    blockwise::<SDOT, N, _, _>(
        x,
        ys,
        |xb| signed(nibbles(&xb.qs), 8),
        |yb| q8_0_values(yb),
        |xb, yb, sumi| sumi as f32 * f16_to_f32(xb.d) * f16_to_f32(yb.d),
    )
}

#[inline(always)]
unsafe fn q4_1<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4_1, BlockQ8_1, N>(x, ys);
    blockwise::<SDOT, N, _, _>(
        x,
        ys,
        |xb| signed(nibbles(&xb.qs), 0),
        |yb| q8_1_values(yb),
        |xb, yb, sumi| (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s),
    )
}

#[inline(always)]
unsafe fn q5_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5_0, BlockQ8_0, N>(x, ys);
    blockwise::<SDOT, N, _, _>(
        x,
        ys,
        |xb| signed(five_bit_levels(&xb.qs, xb.qh), 16),
        |yb| q8_0_values(yb),
        |xb, yb, sumi| (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32,
    )
}

#[inline(always)]
unsafe fn q5_1<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5_1, BlockQ8_1, N>(x, ys);
    blockwise::<SDOT, N, _, _>(
        x,
        ys,
        |xb| signed(five_bit_levels(&xb.qs, xb.qh), 0),
        |yb| q8_1_values(yb),
        |xb, yb, sumi| (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s),
    )
}

#[inline(always)]
unsafe fn q8_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ8_0, BlockQ8_0, N>(x, ys);
    blockwise::<SDOT, N, _, _>(
        x,
        ys,
        |xb| q8_0_values(xb),
        |yb| q8_0_values(yb),
        |xb, yb, sumi| sumi as f32 * (f16_to_f32(xb.d) * f16_to_f32(yb.d)),
    )
}

sdot_entry!(
    /// `q4_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q4_0,
    q4_0
);
sdot_entry!(
    /// `q4_1::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q4_1,
    q4_1
);
sdot_entry!(
    /// `q5_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q5_0,
    q5_0
);
sdot_entry!(
    /// `q5_1::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q5_1,
    q5_1
);
sdot_entry!(
    /// `q8_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q8_0,
    q8_0
);
