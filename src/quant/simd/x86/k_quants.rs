//! The K-quant dot products (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K against Q8_K), and IQ4_XS's, whose
//! super-blocks are theirs.
//!
//! The references take one exact integer per super-block (`scaled_dot_k`): the levels times
//! the activations, summed per sub-block and times its scale. Here `maddubs` multiplies the
//! unsigned levels by the signed activations and sums adjacent pairs into i16 (at most
//! 2 * 63 * 128, so it never saturates), and `madd` (or `vpdpwssd`) multiplies those by the
//! sub-block's scale and sums them into i32 lanes; any lane arrangement gives the same integer.
//! The float steps per super-block are then the reference's, in its order.

use super::*;
use crate::quant::iq4_nl;
use crate::quant::iq4_xs::BlockIq4Xs;
use crate::quant::k_quants::unpack_scales_mins_k4;
use crate::quant::q2_k::BlockQ2K;
use crate::quant::q3_k::{self, BlockQ3K};
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q5_k::BlockQ5K;
use crate::quant::q6_k::BlockQ6K;
use crate::quant::q8_k::BlockQ8K;

/// Eight bytes as i16, the same eight in both 128-bit halves.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bytes_as_i16_twice(v: [u8; 8]) -> __m256i {
    let x = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(v)));
    _mm256_set_m128i(x, x)
}

/// The i16 number `j` (0..8) of each 128-bit half of `v` in every lane of that half.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn pick_i16(v: __m256i, j: usize) -> __m256i {
    let b = 2 * j as i16;
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(b | (b + 1) << 8))
}

/// The totals of the i32 lanes of `a` and of `b`, as the first two lanes of an f32 vector.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn two_totals(a: __m256i, b: __m256i) -> __m128 {
    let r = _mm256_hadd_epi32(a, b);
    let r = _mm_add_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_cvtepi32_ps(_mm_hadd_epi32(r, r))
}

/// The f16 `d` and `dmin` of a super-block as the first two lanes of an f32 vector (F16C's
/// conversion is exact, as `f16_to_f32` is).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn d_dmin(d: u16, dmin: u16) -> __m128 {
    _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d) | i32::from(dmin) << 16))
}

/// The float steps of a Q4_K or Q5_K super-block for one activation row, after its integer
/// lanes `acc`: `sumf += (d * d_y) * sumi`, then `sumf -= (dmin * d_y) * summ`, where `summ`
/// is `Σ bsums[j] * mins[j / 2]` (`mins` as i16 pairs, each minimum twice).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_min_floats(sumf: &mut f32, acc: __m256i, d_dmin: __m128, mins: __m256i, yb: &BlockQ8K) {
    let totals = two_totals(acc, _mm256_madd_epi16(load32(&yb.bsums, 0), mins));
    let t = _mm_mul_ps(_mm_mul_ps(d_dmin, _mm_set1_ps(yb.d)), totals);
    *sumf += _mm_cvtss_f32(t);
    *sumf -= _mm_cvtss_f32(_mm_movehdup_ps(t));
}

/// The minimums of a super-block as i16, each twice (`m0, m0, m1, m1, ...`), for `madd` with
/// the activations' 16 group sums.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn mins_twice(mins: [u8; 8]) -> __m256i {
    let pairs = _mm_shuffle_epi8(
        _mm_cvtsi64_si128(i64::from_le_bytes(mins)),
        _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
    );
    _mm256_cvtepu8_epi16(pairs)
}

/// Adds a 64-value chunk of a Q4_K or Q5_K super-block (sub-blocks `2c` and `2c + 1`, levels
/// `a0` and `a1`, scales `s0` and `s1` as i16 in every lane) against each row's activations.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add_chunk<const VNNI: bool, const N: usize>(
    acc: &mut [__m256i; N],
    (a0, a1): (__m256i, __m256i),
    (s0, s1): (__m256i, __m256i),
    ys: &[&BlockQ8K; N],
    c: usize,
) {
    for (acc, y) in acc.iter_mut().zip(ys) {
        let m0 = _mm256_maddubs_epi16(a0, load32(&y.qs, 64 * c));
        let m1 = _mm256_maddubs_epi16(a1, load32(&y.qs, 64 * c + 32));
        *acc = madd_acc::<VNNI>(madd_acc::<VNNI>(*acc, m0, s0), m1, s1);
    }
}

/// `q4_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q4_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let (scales, mins) = unpack_scales_mins_k4(&xb.scales);
        let (sc, mins) = (bytes_as_i16_twice(scales), mins_twice(mins));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let mut acc = [_mm256_setzero_si256(); N];
        for c in 0..4 {
            let q4 = load32(&xb.qs, 32 * c);
            let a = (_mm256_and_si256(q4, m4), _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4));
            let s = (pick_i16(sc, 2 * c), pick_i16(sc, 2 * c + 1));
            add_chunk::<VNNI, N>(&mut acc, a, s, &yb, c);
        }
        let d_dmin = d_dmin(xb.d, xb.dmin);
        for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(yb) {
            scale_min_floats(sumf, acc, d_dmin, mins, y);
        }
    }
    sumf
}

/// `q5_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q5_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let m4 = _mm256_set1_epi8(0x0f);
    let (bit0, bit1) = (_mm256_set1_epi8(1), _mm256_set1_epi8(2));
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let (scales, mins) = unpack_scales_mins_k4(&xb.scales);
        let (sc, mins) = (bytes_as_i16_twice(scales), mins_twice(mins));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let mut acc = [_mm256_setzero_si256(); N];
        // Bits 2c and 2c + 1 of qh[l] are the fifth bits of chunk c; shifted down as c grows
        // (the 16-bit shift moves bits across bytes only above the two that are read).
        let mut qh = load32(&xb.qh, 0);
        for c in 0..4 {
            let q4 = load32(&xb.qs, 32 * c);
            let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, bit0), 4);
            let h1 = _mm256_slli_epi16(_mm256_and_si256(qh, bit1), 3);
            qh = _mm256_srli_epi16(qh, 2);
            let a = (
                _mm256_or_si256(_mm256_and_si256(q4, m4), h0),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4, 4), m4), h1),
            );
            let s = (pick_i16(sc, 2 * c), pick_i16(sc, 2 * c + 1));
            add_chunk::<VNNI, N>(&mut acc, a, s, &yb, c);
        }
        let d_dmin = d_dmin(xb.d, xb.dmin);
        for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(yb) {
            scale_min_floats(sumf, acc, d_dmin, mins, y);
        }
    }
    sumf
}

/// The 16 sub-block scales `sc` (i16) of a super-block of 16-value sub-blocks, arranged for its
/// eight chunks of 32 weights: for chunk `p`, scale `2p` in every i16 lane of the low 128-bit
/// half and scale `2p + 1` in every lane of the high half.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn chunk_scales(sc: __m256i) -> [__m256i; 8] {
    let sc_lo = _mm256_permute2x128_si256(sc, sc, 0x00);
    let sc_hi = _mm256_permute2x128_si256(sc, sc, 0x11);
    // Bytes (4j, 4j + 1) for the low half, (4j + 2, 4j + 3) for the high half, j = p mod 4 of
    // the 128-bit half that holds scales 2p and 2p + 1.
    std::array::from_fn(|p| {
        let v = if p < 4 { sc_lo } else { sc_hi };
        let j = (p % 4) as i16 * 4;
        let (lo, hi) = (j | (j + 1) << 8, (j + 2) | (j + 3) << 8);
        _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo)))
    })
}

/// `-k * Σ_j scale_j * bsums_j` in i32 lanes (`k` a power of two, `2^shift`): the offset of
/// levels stored `k` above the signed ones (Q3_K's 4, Q6_K's 32), for every activation.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn offset_term<const SHIFT: i32>(bsums: &[i16; 16], sc: __m256i) -> __m256i {
    let corr = _mm256_madd_epi16(load32(bsums, 0), sc);
    _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<SHIFT>(corr))
}

/// `q2_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`: the levels
/// (0..=3) of chunk `p` are bits `2s..2s + 1` of `qs[32h..32h + 32]` (`p = 4h + s`), each
/// sub-block's scale and minimum a nibble of `scales[j]`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q2_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ2K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let (m2, m4) = (_mm256_set1_epi8(0x03), _mm_set1_epi8(0x0f));
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let packed = load16(&xb.scales, 0);
        let s = chunk_scales(_mm256_cvtepu8_epi16(_mm_and_si128(packed, m4)));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
        let mut acc = [_mm256_setzero_si256(); N];
        for h in 0..2 {
            // Shifted down by two per chunk: the 16-bit shift brings bits across bytes only
            // above the two that are read.
            let mut q = load32(&xb.qs, 32 * h);
            for k in 0..4 {
                let a = _mm256_and_si256(q, m2);
                q = _mm256_srli_epi16(q, 2);
                for (acc, y) in acc.iter_mut().zip(&yb) {
                    let m = _mm256_maddubs_epi16(a, load32(&y.qs, 128 * h + 32 * k));
                    *acc = madd_acc::<VNNI>(*acc, m, s[4 * h + k]);
                }
            }
        }
        let d_dmin = d_dmin(xb.d, xb.dmin);
        for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(yb) {
            scale_min_floats(sumf, acc, d_dmin, mins, y);
        }
    }
    sumf
}

/// `q3_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`. The signed
/// levels `low - 4 * (1 - high)` are dotted as `low + 4 * high` (0..=7) less
/// `4 * Σ scale * bsum`; chunk `p = 4h + s` takes its low bits as Q2_K does and its high bits
/// from bit `p` of `hmask`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q3_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ3K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let (m1, m2) = (_mm256_set1_epi8(0x01), _mm256_set1_epi8(0x03));
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let biased = load16(&q3_k::scale_words(xb), 0);
        let sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32)));
        let s = chunk_scales(sc);
        let mut acc: [__m256i; N] = std::array::from_fn(|r| offset_term::<2>(&yb[r].bsums, sc));
        // Shifted down by one per chunk, as the low bits by two (see `vec_dot_q2_k`).
        let mut hm = load32(&xb.hmask, 0);
        for h in 0..2 {
            let mut q = load32(&xb.qs, 32 * h);
            for k in 0..4 {
                let high = _mm256_slli_epi16(_mm256_and_si256(hm, m1), 2);
                let a = _mm256_or_si256(_mm256_and_si256(q, m2), high);
                (q, hm) = (_mm256_srli_epi16(q, 2), _mm256_srli_epi16(hm, 1));
                for (acc, y) in acc.iter_mut().zip(&yb) {
                    let m = _mm256_maddubs_epi16(a, load32(&y.qs, 128 * h + 32 * k));
                    *acc = madd_acc::<VNNI>(*acc, m, s[4 * h + k]);
                }
            }
        }
        let d = _mm_cvtss_f32(d_dmin(xb.d, 0));
        for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(yb) {
            *sumf += (d * y.d) * hsum_i32(acc) as f32;
        }
    }
    sumf
}

/// `q6_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`. The signed
/// levels `q - 32` are dotted as `q * y` less `32 * Σ scale * bsum` (exact for every
/// activation, -128 included).
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_q6_k<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ6K, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let m4 = _mm256_set1_epi8(0x0f);
    let (m2, m3) = (_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x30));
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let sc = _mm256_cvtepi8_epi16(load16(&xb.scales, 0));
        let s = chunk_scales(sc);
        // -32 * Σ scale_j * bsums_j: the offset of the stored levels.
        let mut acc: [__m256i; N] = std::array::from_fn(|r| offset_term::<5>(&yb[r].bsums, sc));
        for h in 0..2 {
            let (ql0, ql1) = (load32(&xb.ql, 64 * h), load32(&xb.ql, 64 * h + 32));
            let qh = load32(&xb.qh, 32 * h);
            // The stored levels q of weights 128h + 32k + l, k = 0..4.
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
            // Each a[k] holds the sub-blocks 8h + 2k (low half) and 8h + 2k + 1 (high half).
            for (acc, y) in acc.iter_mut().zip(&yb) {
                for (k, (&a, &s)) in a.iter().zip(&s[4 * h..]).enumerate() {
                    let m = _mm256_maddubs_epi16(a, load32(&y.qs, 128 * h + 32 * k));
                    *acc = madd_acc::<VNNI>(*acc, m, s);
                }
            }
        }
        let d = _mm_cvtss_f32(d_dmin(xb.d, 0));
        for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(yb) {
            *sumf += (d * y.d) * hsum_i32(acc) as f32;
        }
    }
    sumf
}

/// The eight terms `(d * d_y * (scale - 32)) * sumi` of an IQ4_XS super-block against a Q8_K
/// block, the blocks' exact integer sums side by side in one vector (`w`: its levels by block,
/// from [`iq4_xs_levels`]). With VNNI the levels are 128 up and `vpdpbusd` multiplies them
/// as they are, less `128 * Σ y` per block (from the activations' group sums); without, they
/// are signed and multiplied by `dot_signed`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn iq4_xs_terms<const VNNI: bool>(xb: &BlockIq4Xs, w: &[__m256i; 8], y: &BlockQ8K) -> __m256 {
    let sumi = if VNNI {
        let lanes: [__m256i; 8] =
            std::array::from_fn(|ib| dpbusd(_mm256_setzero_si256(), w[ib], load32(&y.qs, 32 * ib)));
        // Lane ib: the sum of block ib's 32 activations, the two group sums of 16.
        let block_sums = _mm256_madd_epi16(load32(&y.bsums, 0), _mm256_set1_epi16(1));
        _mm256_sub_epi32(hsum_8x8(&lanes), _mm256_slli_epi32(block_sums, 7))
    } else {
        let lanes: [__m256i; 8] = std::array::from_fn(|ib| dot_signed::<VNNI>(w[ib], load32(&y.qs, 32 * ib)));
        hsum_8x8(&lanes)
    };
    let dx = _mm_cvtss_f32(d_dmin(xb.d, 0));
    _mm256_mul_ps(
        _mm256_mul_ps(_mm256_set1_ps(dx * y.d), iq4_xs_scales(xb)),
        _mm256_cvtepi32_ps(sumi),
    )
}

/// The eight block scales of an IQ4_XS super-block, unbiased, as f32 lanes: block `j`'s low
/// nibble is bits `4j..4j + 4` of `scales_l` read as one word, its top two bits bits `2j` and
/// `2j + 1` of `scales_h`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn iq4_xs_scales(xb: &BlockIq4Xs) -> __m256 {
    let low = _mm256_srlv_epi32(
        _mm256_set1_epi32(i32::from_le_bytes(xb.scales_l)),
        _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
    );
    let high = _mm256_srlv_epi32(
        _mm256_set1_epi32(i32::from(xb.scales_h)),
        _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14),
    );
    let ls = _mm256_or_si256(
        _mm256_and_si256(low, _mm256_set1_epi32(0x0f)),
        _mm256_slli_epi32(_mm256_and_si256(high, _mm256_set1_epi32(3)), 4),
    );
    _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))
}

/// The 256 levels of an IQ4_XS super-block by block of 32, from the table: 128 up for the VNNI
/// kernels, signed for the others.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn iq4_xs_levels<const VNNI: bool>(xb: &BlockIq4Xs) -> [__m256i; 8] {
    let table = if VNNI { &IQ4_NL_128 } else { &iq4_nl::KVALUES };
    std::array::from_fn(|ib| {
        let qs: &[u8; 16] = xb.qs[16 * ib..16 * ib + 16].try_into().unwrap();
        table_32(qs, table)
    })
}

/// `iq4_xs::vec_dot_ref` of four weight rows `xs` with the activation row `y`: each super-block's
/// eight terms of the four rows (`iq4_xs_terms`), transposed so that one vector add takes a
/// block of all four rows, in block order as each row's reference adds them. Four rows give the
/// additions four independent chains where one row waits on each.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn rows_iq4_xs<const VNNI: bool>(xs: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
    let xs: [&[BlockIq4Xs]; 4] = xs.map(bytemuck::cast_slice);
    let y: &[BlockQ8K] = bytemuck::cast_slice(y);
    let n = xs.iter().fold(y.len(), |n, x| n.min(x.len()));
    let mut sums = _mm_setzero_ps();
    for (i, yb) in y[..n].iter().enumerate() {
        let terms: [__m256; 4] = std::array::from_fn(|r| {
            let xb = &xs[r][i];
            prefetch_ahead(std::slice::from_ref(xb));
            iq4_xs_terms::<VNNI>(xb, &iq4_xs_levels::<VNNI>(xb), yb)
        });
        for b in transpose_4x8(terms) {
            sums = _mm_add_ps(sums, b);
        }
    }
    let mut out = [0.0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), sums);
    out
}

/// `iq4_xs::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`: the eight
/// blocks' exact integer sums side by side in one vector, their terms
/// `(d * d_y * (scale - 32)) * sumi` computed at once and added in block order.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_iq4_xs<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockIq4Xs, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let w = iq4_xs_levels::<VNNI>(xb);
        for (sumf, y) in sumf.iter_mut().zip(yb) {
            for v in lanes_f32(iq4_xs_terms::<VNNI>(xb, &w, y)) {
                *sumf += v;
            }
        }
    }
    sumf
}
