//! The K-quant dot products (Q4_K, Q5_K, Q6_K against Q8_K).
//!
//! The references accumulate `scale * q8[i] * a[i]` into eight integer lanes by `i % 8`
//! (`accumulate_lanes_k`), then add `d * lane` to eight float lanes. The integer lanes are
//! reproduced exactly here: bytes are first shuffled so that adjacent bytes share `i % 8`
//! ([`residue_pairs`]), `maddubs` sums such pairs into i16, and two sub-blocks with their
//! scales are interleaved so that `madd` also pairs like with like. The i32 lanes then hold
//! residues 0..4 (`acc_lo`) and 4..8 (`acc_hi`), once per 128-bit half, and adding the halves
//! gives the reference's eight integers. The float lanes are one vector multiply and add per
//! super-block, as in the reference.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::k_quants::unpack_scales_mins_k4;
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q5_k::BlockQ5K;
use crate::quant::q6_k::BlockQ6K;
use crate::quant::q8_k::BlockQ8K;

/// The eight integer lanes (`aux32` of the reference) from the two residue accumulators.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn residue_lanes(acc_lo: __m256i, acc_hi: __m256i) -> __m256 {
    let lo = _mm_add_epi32(_mm256_castsi256_si128(acc_lo), _mm256_extracti128_si256(acc_lo, 1));
    let hi = _mm_add_epi32(_mm256_castsi256_si128(acc_hi), _mm256_extracti128_si256(acc_hi, 1));
    _mm256_cvtepi32_ps(_mm256_set_m128i(hi, lo))
}

/// `sum(bsums[j] * mins[j / 2])`, the integer the mins contribute in Q4_K and Q5_K.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mins_dot(bsums: &[i16; 16], mins: &[u8; 8]) -> i32 {
    let pairs = _mm_shuffle_epi8(
        _mm_loadl_epi64(mins.as_ptr().cast()),
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
    );
    hsum_i32(_mm256_madd_epi16(load32(bsums, 0), _mm256_cvtepu8_epi16(pairs)))
}

/// Both scales of a pair of sub-blocks as i16 in every i32 lane: `lo` in the low half.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_pair(lo: u8, hi: u8) -> __m256i {
    _mm256_set1_epi32(i32::from(lo) | (i32::from(hi) << 16))
}

/// Adds the 32-value sub-blocks `a0` (scale `s`'s low i16) and `a1` (its high i16) against
/// `y0` and `y1` to the residue accumulators. `a0` and `a1` are unsigned levels of at most 31,
/// already in [`residue_pairs`] order, as are `y0` and `y1`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add_sub_block_pair<const VNNI: bool>(
    acc: &mut (__m256i, __m256i),
    a0: __m256i,
    a1: __m256i,
    y0: __m256i,
    y1: __m256i,
    s: __m256i,
) {
    let m0 = _mm256_maddubs_epi16(a0, y0);
    let m1 = _mm256_maddubs_epi16(a1, y1);
    acc.0 = madd_acc::<VNNI>(acc.0, _mm256_unpacklo_epi16(m0, m1), s);
    acc.1 = madd_acc::<VNNI>(acc.1, _mm256_unpackhi_epi16(m0, m1), s);
}

/// The rows `ys` cut to the common length of all rows and `x`.
#[inline]
fn common_len<'a, W, const N: usize>(x: &[W], ys: [&'a [BlockQ8K]; N]) -> (usize, [&'a [BlockQ8K]; N]) {
    let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
    let mut cut: [&[BlockQ8K]; N] = [&[]; N];
    for (c, y) in cut.iter_mut().zip(ys) {
        *c = &y[..n];
    }
    (n, cut)
}

/// The float steps of a Q4_K or Q5_K super-block for one activation row, after its integer
/// lanes `acc`: `sums += d * lanes`, then `sumf -= dmin * sumi` (the mins' integer).
#[inline]
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn scale_min_floats(
    sums: &mut __m256,
    sumf: &mut f32,
    acc: (__m256i, __m256i),
    d: f32,
    dmin: f32,
    mins: &[u8; 8],
    yb: &BlockQ8K,
) {
    let sumi = mins_dot(&yb.bsums, mins);
    let d = d * yb.d;
    *sums = _mm256_add_ps(*sums, _mm256_mul_ps(_mm256_set1_ps(d), residue_lanes(acc.0, acc.1)));
    let dmin = dmin * yb.d;
    *sumf -= dmin * sumi as f32;
}

/// `q4_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q4_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let pairs = residue_pairs();
    let m4 = _mm256_set1_epi8(0x0f);
    let mut sums = [_mm256_setzero_ps(); N];
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let (scales, mins) = unpack_scales_mins_k4(&xb.scales);
        let mut acc = [(_mm256_setzero_si256(), _mm256_setzero_si256()); N];
        for c in 0..4 {
            let q4 = _mm256_shuffle_epi8(load32(&xb.qs, 32 * c), pairs);
            let a0 = _mm256_and_si256(q4, m4);
            let a1 = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
            let s = scale_pair(scales[2 * c], scales[2 * c + 1]);
            for (acc, y) in acc.iter_mut().zip(ys) {
                let y0 = _mm256_shuffle_epi8(load32(&y[i].qs, 64 * c), pairs);
                let y1 = _mm256_shuffle_epi8(load32(&y[i].qs, 64 * c + 32), pairs);
                add_sub_block_pair::<VNNI>(acc, a0, a1, y0, y1, s);
            }
        }
        let (d, dmin) = (f16_to_f32(xb.d), f16_to_f32(xb.dmin));
        for (((sums, sumf), acc), y) in sums.iter_mut().zip(&mut sumf).zip(acc).zip(ys) {
            scale_min_floats(sums, sumf, acc, d, dmin, &mins, &y[i]);
        }
    }
    for (sumf, sums) in sumf.iter_mut().zip(sums) {
        for s in lanes_f32(sums) {
            *sumf += s;
        }
    }
    sumf
}

/// `q5_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q5_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let pairs = residue_pairs();
    let m4 = _mm256_set1_epi8(0x0f);
    let (bit0, bit1) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
    let mut sums = [_mm256_setzero_ps(); N];
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let (scales, mins) = unpack_scales_mins_k4(&xb.scales);
        let mut acc = [(_mm256_setzero_si256(), _mm256_setzero_si256()); N];
        // Bits 2c and 2c + 1 of qh[l] are the fifth bits of chunk c; shifted down as c grows.
        let mut qh = _mm256_shuffle_epi8(load32(&xb.qh, 0), pairs);
        for c in 0..4 {
            let q4 = _mm256_shuffle_epi8(load32(&xb.qs, 32 * c), pairs);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, bit0), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(qh, bit1), 3);
            qh = _mm256_srli_epi16(qh, 2);
            let a0 = _mm256_or_si256(_mm256_and_si256(q4, m4), h0);
            let a1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), h1);
            let s = scale_pair(scales[2 * c], scales[2 * c + 1]);
            for (acc, y) in acc.iter_mut().zip(ys) {
                let y0 = _mm256_shuffle_epi8(load32(&y[i].qs, 64 * c), pairs);
                let y1 = _mm256_shuffle_epi8(load32(&y[i].qs, 64 * c + 32), pairs);
                add_sub_block_pair::<VNNI>(acc, a0, a1, y0, y1, s);
            }
        }
        let (d, dmin) = (f16_to_f32(xb.d), f16_to_f32(xb.dmin));
        for (((sums, sumf), acc), y) in sums.iter_mut().zip(&mut sumf).zip(acc).zip(ys) {
            scale_min_floats(sums, sumf, acc, d, dmin, &mins, &y[i]);
        }
    }
    for (sumf, sums) in sumf.iter_mut().zip(sums) {
        for s in lanes_f32(sums) {
            *sumf += s;
        }
    }
    sumf
}

/// `q6_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`. The signed
/// levels `q - 32` are dotted as `q * y - 32 * y` (exact for every activation, -128 included).
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q6_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ6K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let pairs = residue_pairs();
    let m4 = _mm256_set1_epi8(0x0f);
    let (m2, m3) = (_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x30));
    let off = _mm256_set1_epi8(32);
    // The i16 scales in the order the sub-block pairs below take them: dword 2p holds scales
    // (4p, 4p + 2) and dword 2p + 1 scales (4p + 1, 4p + 3).
    let scale_order = _mm_setr_epi8(0, 2, 1, 3, 4, 6, 5, 7, 8, 10, 9, 11, 12, 14, 13, 15);
    let mut sums = [_mm256_setzero_ps(); N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(load16(&xb.scales, 0), scale_order));
        let mut acc = [(_mm256_setzero_si256(), _mm256_setzero_si256()); N];
        for h in 0..2 {
            let ql0 = _mm256_shuffle_epi8(load32(&xb.ql, 64 * h), pairs);
            let ql1 = _mm256_shuffle_epi8(load32(&xb.ql, 64 * h + 32), pairs);
            let qh = _mm256_shuffle_epi8(load32(&xb.qh, 32 * h), pairs);
            // The unsigned levels q of weights 128h + 32k + l, k = 0..4.
            let a = [
                _mm256_or_si256(
                    _mm256_and_si256(ql0, m4),
                    _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_and_si256(qh, m3),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_and_si256(_mm256_srli_epi16(qh, 2), m3),
                ),
            ];
            let p = 4 * h as i32;
            let s01 = _mm256_permutevar8x32_epi32(sc, _mm256_setr_epi32(p, p, p, p, p + 1, p + 1, p + 1, p + 1));
            let (q, r) = (p + 2, p + 3);
            let s23 = _mm256_permutevar8x32_epi32(sc, _mm256_setr_epi32(q, q, q, q, r, r, r, r));
            for (acc, y) in acc.iter_mut().zip(ys) {
                // Each m holds two 16-value sub-blocks: 2k + 8h in the low half, 2k + 8h + 1 high.
                let mut m = [_mm256_setzero_si256(); 4];
                for (k, (m, &a)) in m.iter_mut().zip(&a).enumerate() {
                    let yk = _mm256_shuffle_epi8(load32(&y[i].qs, 128 * h + 32 * k), pairs);
                    *m = _mm256_sub_epi16(_mm256_maddubs_epi16(a, yk), _mm256_maddubs_epi16(off, yk));
                }
                acc.0 = madd_acc::<VNNI>(acc.0, _mm256_unpacklo_epi16(m[0], m[1]), s01);
                acc.1 = madd_acc::<VNNI>(acc.1, _mm256_unpackhi_epi16(m[0], m[1]), s01);
                acc.0 = madd_acc::<VNNI>(acc.0, _mm256_unpacklo_epi16(m[2], m[3]), s23);
                acc.1 = madd_acc::<VNNI>(acc.1, _mm256_unpackhi_epi16(m[2], m[3]), s23);
            }
        }
        let d = f16_to_f32(xb.d);
        for ((sums, acc), y) in sums.iter_mut().zip(acc).zip(ys) {
            let d = d * y[i].d;
            *sums = _mm256_add_ps(*sums, _mm256_mul_ps(_mm256_set1_ps(d), residue_lanes(acc.0, acc.1)));
        }
    }
    let mut sumf = [0.0f32; N];
    for (sumf, sums) in sumf.iter_mut().zip(sums) {
        for s in lanes_f32(sums) {
            *sumf += s;
        }
    }
    sumf
}
