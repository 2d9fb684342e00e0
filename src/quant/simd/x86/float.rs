//! Float weight rows (F32, F16, BF16) against f32 activations, in `vec_dot_f32`'s documented
//! order: one vector of eight running sums (lane `l` takes the products `i % 8 == l` of the
//! leading multiple of 8, each a separate multiply then add), the lanes added in order to 0.0,
//! then the remaining products one by one.

use super::*;
use crate::quant::fp16::{bf16_to_f32, f16_to_f32};

/// The shared loop: `widen8(chunk)` turns `8 * W` weight bytes into eight f32, `widen(bytes)`
/// one weight of the tail. Both widen exactly, as the reference does.
macro_rules! lanes_dot {
    ($w:expr, $x:expr, $width:literal, $widen8:expr, $widen:expr) => {{
        let (w, x) = ($w, $x);
        let n = (w.len() / $width).min(x.len());
        let body = n / 8 * 8;
        let mut acc = _mm256_setzero_ps();
        let chunks = w[..$width * body]
            .chunks_exact(8 * $width)
            .zip(x[..body].chunks_exact(8));
        for (i, (wc, xc)) in chunks.enumerate() {
            // One prefetch per 64 bytes of weights.
            if i % (8 / $width) == 0 {
                prefetch_ahead(wc);
            }
            // SAFETY: `xc` holds 8 f32.
            let xv = _mm256_loadu_ps(xc.as_ptr());
            acc = _mm256_add_ps(acc, _mm256_mul_ps($widen8(wc), xv));
        }
        let mut sum = 0.0f32;
        for lane in lanes_f32(acc) {
            sum += lane;
        }
        for (wb, &xv) in w[$width * body..$width * n].chunks_exact($width).zip(&x[body..n]) {
            let mut bytes = [0u8; $width];
            bytes.copy_from_slice(wb);
            sum += $widen(bytes) * xv;
        }
        sum
    }};
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn f32x8(w: &[u8]) -> __m256 {
    _mm256_castsi256_ps(load32(w, 0))
}

#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16x8_bytes(w: &[u8]) -> __m256 {
    _mm256_cvtph_ps(load16(w, 0))
}

#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bf16x8(w: &[u8]) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load16(w, 0)), 16))
}

/// F32 weights (little-endian bytes).
#[target_feature(enable = "avx2")]
pub(in crate::quant) unsafe fn vec_dot_f32(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot!(w, x, 4, f32x8, f32::from_le_bytes)
}

/// F16 weights.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_f16(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot!(w, x, 2, f16x8_bytes, |b| f16_to_f32(u16::from_le_bytes(b)))
}

/// BF16 weights.
#[target_feature(enable = "avx2")]
pub(in crate::quant) unsafe fn vec_dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    lanes_dot!(w, x, 2, bf16x8, |b| bf16_to_f32(u16::from_le_bytes(b)))
}
