//! The 32-value block dot products (Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1),
//! of one weight row with `N` activation rows at once (the weight blocks are unpacked once).
//!
//! Blocks go eight at a time: each block's integer dot product is summed exactly in i32 lanes,
//! the eight sums are gathered into one vector, the reference's per-block float expression is
//! evaluated for the eight blocks at once (same operands, same association), and the eight
//! results are added to the running sum one by one, left to right, as the reference adds them.

use super::*;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_1::BlockQ8_1;

/// The block loop shared by the kernels, for the weight row `$x` and the `N` activation rows
/// `$ys`: `$prep(xb)` unpacks a weight block, `$dot(u, yb)` gives the integer dot product of
/// the unpacked block with an activation block as i32 lanes, and `$floats(xc, yc, sumi)` the
/// reference's per-block float terms of a chunk of up to eight blocks given their integer sums.
/// The terms are added to each row's total in block order.
macro_rules! blockwise {
    ($x:expr, $ys:expr, $prep:expr, $dot:expr, $floats:expr) => {{
        let (x, ys) = ($x, $ys);
        let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
        let mut sums = [0.0f32; N];
        let mut start = 0;
        while start < n {
            let len = (n - start).min(8);
            let xc = &x[start..start + len];
            let mut yc: [&[_]; N] = [&[]; N];
            for (c, y) in yc.iter_mut().zip(ys) {
                *c = &y[start..start + len];
            }
            prefetch_ahead(xc);
            macro_rules! block {
                ($lanes:ident, $k:expr) => {{
                    let u = $prep(&xc[$k]);
                    #[allow(clippy::needless_range_loop)] // constant indices keep the lanes in registers
                    for t in 0..N {
                        $lanes[t][$k] = $dot(u, &yc[t][$k]);
                    }
                }};
            }
            macro_rules! add_terms {
                ($lanes:ident) => {
                    for ((sum, l), y) in sums.iter_mut().zip(&$lanes).zip(yc) {
                        let terms = lanes_f32($floats(xc, y, hsum_8x8(l)));
                        for &v in &terms[..len] {
                            *sum += v;
                        }
                    }
                };
            }
            if len == 8 {
                // Unrolled, on its own: the lanes stay in registers.
                let mut lanes = [[_mm256_setzero_si256(); 8]; N];
                block!(lanes, 0);
                block!(lanes, 1);
                block!(lanes, 2);
                block!(lanes, 3);
                block!(lanes, 4);
                block!(lanes, 5);
                block!(lanes, 6);
                block!(lanes, 7);
                add_terms!(lanes);
            } else {
                let mut lanes = [[_mm256_setzero_si256(); 8]; N];
                for k in 0..len {
                    block!(lanes, k);
                }
                add_terms!(lanes);
            }
            start += len;
        }
        sums
    }};
}

// `heads8` reads the scale `d` from the first two bytes of every block, and the minimum `m` or
// the scaled sum `s` from the next two.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(BlockQ4_0, d) == 0 && offset_of!(BlockQ5_0, d) == 0 && offset_of!(BlockQ8_0, d) == 0);
    assert!(offset_of!(BlockQ4_1, d) == 0 && offset_of!(BlockQ4_1, m) == 2);
    assert!(offset_of!(BlockQ5_1, d) == 0 && offset_of!(BlockQ5_1, m) == 2);
    assert!(offset_of!(BlockQ8_1, d) == 0 && offset_of!(BlockQ8_1, s) == 2);
};

/// `q4_0::vec_dot_ref`: `sumf += sumi * d_x * d_y`, i.e. `(sumi * d_x) * d_y`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q4_0<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4_0, BlockQ8_0, N>(x, ys);
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prep(x: &BlockQ4_0) -> __m256i {
        nibbles_32(&x.qs)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot<const VNNI: bool>(u: __m256i, y: &BlockQ8_0) -> __m256i {
        dot4_offset::<VNNI>(u, load32(&y.qs, 0), _mm256_set1_epi8(8))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn floats(x: &[BlockQ4_0], y: &[BlockQ8_0], sumi: __m256i) -> __m256 {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sumi), dx), dy)
    }
    blockwise!(x, ys, prep, dot::<VNNI>, floats)
}

/// The 5-bit levels of a Q5_0 or Q5_1 block, unsigned.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn five_bits(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    _mm256_or_si256(nibbles_32(qs), fifth_bits_32(qh))
}

/// `q5_0::vec_dot_ref`: `sumf += (d_x * d_y) * sumi`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q5_0<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5_0, BlockQ8_0, N>(x, ys);
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prep(x: &BlockQ5_0) -> __m256i {
        five_bits(&x.qs, x.qh)
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot<const VNNI: bool>(u: __m256i, y: &BlockQ8_0) -> __m256i {
        dot4_offset::<VNNI>(u, load32(&y.qs, 0), _mm256_set1_epi8(16))
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn floats(x: &[BlockQ5_0], y: &[BlockQ8_0], sumi: __m256i) -> __m256 {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi))
    }
    blockwise!(x, ys, prep, dot::<VNNI>, floats)
}

/// `q8_0::vec_dot_ref`: `sumf += sumi * (d_x * d_y)`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q8_0<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ8_0, BlockQ8_0, N>(x, ys);
    /// With VNNI, `x + 128` (unsigned); without, `x` itself.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prep<const VNNI: bool>(x: &BlockQ8_0) -> __m256i {
        let xv = load32(&x.qs, 0);
        if VNNI {
            _mm256_xor_si256(xv, _mm256_set1_epi8(-128))
        } else {
            xv
        }
    }
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn dot<const VNNI: bool>(u: __m256i, y: &BlockQ8_0) -> __m256i {
        let yv = load32(&y.qs, 0);
        if VNNI {
            // (x + 128) * y summed, less 128 * sum(y): exact in i32.
            dot4_offset::<true>(u, yv, _mm256_set1_epi8(-128))
        } else {
            // Both operands signed and possibly -128: widen to i16 (`maddubs` could saturate).
            let lo = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u)),
                _mm256_cvtepi8_epi16(_mm256_castsi256_si128(yv)),
            );
            let hi = _mm256_madd_epi16(
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u, 1)),
                _mm256_cvtepi8_epi16(_mm256_extracti128_si256(yv, 1)),
            );
            _mm256_add_epi32(lo, hi)
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn floats(x: &[BlockQ8_0], y: &[BlockQ8_0], sumi: __m256i) -> __m256 {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy))
    }
    blockwise!(x, ys, prep::<VNNI>, dot::<VNNI>, floats)
}

/// The `(d_x * d_y) * sumi + m_x * s_y` terms of the Q4_1 and Q5_1 references.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn min_floats<W: bytemuck::Pod>(x: &[W], y: &[BlockQ8_1], sumi: __m256i) -> __m256 {
    let ((dx, mx), (dy, sy)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
    let scaled = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi));
    _mm256_add_ps(scaled, _mm256_mul_ps(mx, sy))
}

/// The integer dot product of unsigned levels with a Q8_1 block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_q8_1<const VNNI: bool>(u: __m256i, y: &BlockQ8_1) -> __m256i {
    dot4::<VNNI>(u, load32(&y.qs, 0))
}

/// `q4_1::vec_dot_ref`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q4_1<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4_1, BlockQ8_1, N>(x, ys);
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prep(x: &BlockQ4_1) -> __m256i {
        nibbles_32(&x.qs)
    }
    blockwise!(x, ys, prep, dot_q8_1::<VNNI>, min_floats)
}

/// `q5_1::vec_dot_ref`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q5_1<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5_1, BlockQ8_1, N>(x, ys);
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn prep(x: &BlockQ5_1) -> __m256i {
        five_bits(&x.qs, x.qh)
    }
    blockwise!(x, ys, prep, dot_q8_1::<VNNI>, min_floats)
}
