//! The float weight types F32, F16 and BF16 as rows of the type table: a weight widened to f32
//! (exactly), an f32 narrowed to a weight (round to nearest even, as ggml), and the scalar
//! reference of their dot product with f32 activations.
//!
//! This module owns the little-endian encodings and the accumulation order of that dot product
//! (documented on [`super::vec_dot_f32`]); the SIMD forms, bit-identical to [`dot_widened`],
//! are in `simd::x86::float`. It must not know where the rows come from.

use super::fp16;

/// An F32 weight from its little-endian bytes.
#[inline(always)]
pub fn f32_from_le(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

/// The little-endian bytes of an F32 weight.
#[inline(always)]
pub fn f32_to_le(v: f32) -> [u8; 4] {
    v.to_le_bytes()
}

/// An F16 weight from its little-endian bytes, widened exactly.
#[inline(always)]
pub fn f16_from_le(b: [u8; 2]) -> f32 {
    fp16::f16_to_f32(u16::from_le_bytes(b))
}

/// `v` rounded to F16, as little-endian bytes.
#[inline(always)]
pub fn f16_to_le(v: f32) -> [u8; 2] {
    fp16::f32_to_f16(v).to_le_bytes()
}

/// A BF16 weight from its little-endian bytes, widened exactly.
#[inline(always)]
pub fn bf16_from_le(b: [u8; 2]) -> f32 {
    fp16::bf16_to_f32(u16::from_le_bytes(b))
}

/// `v` rounded to BF16, as little-endian bytes.
#[inline(always)]
pub fn bf16_to_le(v: f32) -> [u8; 2] {
    fp16::f32_to_bf16(v).to_le_bytes()
}

/// Widens the weights `src` (`W` bytes each) into `dst`, one for one.
#[inline]
pub fn widen_row<const W: usize>(src: &[u8], dst: &mut [f32], widen: impl Fn([u8; W]) -> f32) {
    for (out, b) in dst.iter_mut().zip(src.chunks_exact(W)) {
        *out = widen(to_array(b));
    }
}

/// Narrows the values `src` into weights of `W` bytes in `dst`, one for one.
#[inline]
pub fn narrow_row<const W: usize>(src: &[f32], dst: &mut [u8], narrow: impl Fn(f32) -> [u8; W]) {
    for (b, &v) in dst.chunks_exact_mut(W).zip(src) {
        b.copy_from_slice(&narrow(v));
    }
}

/// The dot product of the weights `w` (`W` bytes each) with `x`, in [`super::vec_dot_f32`]'s
/// lane order; generic so that the widening is inlined into the loop.
pub fn dot_widened<const W: usize>(w: &[u8], x: &[f32], widen: impl Fn([u8; W]) -> f32) -> f32 {
    let mut lanes = [0.0f32; 8];
    let w_chunks = w.chunks_exact(8 * W);
    let x_chunks = x.chunks_exact(8);
    let (w_tail, x_tail) = (w_chunks.remainder(), x_chunks.remainder());
    for (wc, xc) in w_chunks.zip(x_chunks) {
        for ((lane, wv), &xv) in lanes.iter_mut().zip(wc.chunks_exact(W)).zip(xc) {
            *lane += widen(to_array(wv)) * xv;
        }
    }
    let mut sum = 0.0f32;
    for lane in lanes {
        sum += lane;
    }
    for (wv, &xv) in w_tail.chunks_exact(W).zip(x_tail) {
        sum += widen(to_array(wv)) * xv;
    }
    sum
}

/// The `W` bytes of a weight (`b` holds exactly `W`).
#[inline(always)]
fn to_array<const W: usize>(b: &[u8]) -> [u8; W] {
    let mut bytes = [0u8; W];
    bytes.copy_from_slice(b);
    bytes
}

/// The scalar reference of [`super::vec_dot_f32`] for F32 weights (`w` holds `4 * x.len()` bytes).
pub fn vec_dot_f32_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, f32_from_le)
}

/// The scalar reference of [`super::vec_dot_f32`] for F16 weights (`w` holds `2 * x.len()` bytes).
pub fn vec_dot_f16_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, f16_from_le)
}

/// The scalar reference of [`super::vec_dot_f32`] for BF16 weights (`w` holds `2 * x.len()` bytes).
pub fn vec_dot_bf16_ref(w: &[u8], x: &[f32]) -> f32 {
    dot_widened(w, x, bf16_from_le)
}
