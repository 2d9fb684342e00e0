//! The codebook i-quants' dot products against Q8_K: IQ2_XS and IQ3_XXS, the two the files of
//! small machines use most (the others run their scalar references).
//!
//! The reference takes one exact integer per super-block: every group's grid values with their
//! signs times the activations, summed per block of 16 or 32 and times the block's odd scale
//! `2s + 1`. Here 32 values at a time are looked up in the codebook (four u64 or eight u32 grid
//! points, the tables staying in L1), their signs applied as a byte mask (negate where set), and
//! `maddubs` multiplies the activations' magnitudes by the signed grid values carrying the
//! activations' signs (`|-128|` is the unsigned 128, the grid at most 62, so a pair stays far
//! from i16's bounds); `madd` (or `vpdpwssd`) takes the pairs times the block scales into i32
//! lanes. The integer total is the reference's; the float steps are then its own.

use super::*;
use crate::quant::iq2_xs::BlockIq2Xs;
use crate::quant::iq3_xxs::BlockIq3Xxs;
use crate::quant::iq_common::KSIGNS;
use crate::quant::iq_grids::{IQ2XS_GRID, IQ3XXS_GRID};
use crate::quant::k_quants::QK_K;
use crate::quant::q8_k::BlockQ8K;

/// Per 7-bit sign index, the eight bytes of its signs (`KSIGNS`, the eighth bit the parity) as
/// a mask: 0xff where the weight is negated.
static SIGN_MASKS: [u64; 128] = {
    let mut masks = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let signs = KSIGNS[i];
        let mut j = 0;
        while j < 8 {
            if (signs >> j) & 1 == 1 {
                masks[i] |= 0xff << (8 * j);
            }
            j += 1;
        }
        i += 1;
    }
    masks
};

/// The sign masks of four groups of eight, by their 7-bit sign indices.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn sign_mask(indices: [usize; 4]) -> __m256i {
    let m = |k: usize| SIGN_MASKS[indices[k] & 127] as i64;
    _mm256_setr_epi64x(m(0), m(1), m(2), m(3))
}

/// `grid` negated where `mask` is all ones.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn with_signs(grid: __m256i, mask: __m256i) -> __m256i {
    _mm256_sub_epi8(_mm256_xor_si256(grid, mask), mask)
}

/// `acc` plus the products of 32 signed grid values `w` with 32 activations `y`, each pair of
/// i16 products times its scale in `scales`, in i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn add_scaled<const VNNI: bool>(acc: __m256i, w: __m256i, y: __m256i, scales: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(y), _mm256_sign_epi8(w, y));
    madd_acc::<VNNI>(acc, pairs, scales)
}

/// The float step of every row: `sumf += (d * d_y) * bsum`, `bsum` the total of its lanes.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn add_totals<const N: usize>(sumf: &mut [f32; N], d: u16, acc: [__m256i; N], ys: [&BlockQ8K; N]) {
    let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(d))));
    for ((sumf, acc), y) in sumf.iter_mut().zip(acc).zip(ys) {
        *sumf += d * y.d * hsum_i32(acc) as f32;
    }
}

/// `iq2_xs::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_iq2_xs<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockIq2Xs, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let mut acc = [_mm256_setzero_si256(); N];
        for (c, q) in xb.qs.chunks_exact(4).enumerate() {
            let q: [u16; 4] = q.try_into().unwrap();
            let point = |k: usize| IQ2XS_GRID[(q[k] & 511) as usize] as i64;
            let grid = _mm256_setr_epi64x(point(0), point(1), point(2), point(3));
            let w = with_signs(grid, sign_mask(q.map(|v| (v >> 9) as usize)));
            let s = xb.scales[c] as i16;
            let scales = _mm256_setr_m128i(_mm_set1_epi16(2 * (s & 0xf) + 1), _mm_set1_epi16(2 * (s >> 4) + 1));
            for (acc, y) in acc.iter_mut().zip(yb) {
                *acc = add_scaled::<VNNI>(*acc, w, load32(&y.qs, 32 * c), scales);
            }
        }
        add_totals(&mut sumf, xb.d, acc, yb);
    }
    sumf.map(|s| 0.125 * s)
}

/// `iq3_xxs::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::quant) unsafe fn vec_dot_iq3_xxs<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockIq3Xxs, BlockQ8K, N>(x, ys);
    let (n, ys) = common_len(x, ys);
    let mut sumf = [0.0f32; N];
    for (i, xb) in x[..n].iter().enumerate() {
        prefetch_ahead(std::slice::from_ref(xb));
        let yb: [&BlockQ8K; N] = std::array::from_fn(|r| &ys[r][i]);
        let (indices, signs_and_scales) = xb.qs.split_at(QK_K / 4);
        let mut acc = [_mm256_setzero_si256(); N];
        for (c, (q, aux)) in indices
            .chunks_exact(8)
            .zip(signs_and_scales.chunks_exact(4))
            .enumerate()
        {
            let aux = u32::from_le_bytes(aux.try_into().unwrap());
            let point = |k: usize| IQ3XXS_GRID[q[k] as usize] as i32;
            let grid = _mm256_setr_epi32(
                point(0),
                point(1),
                point(2),
                point(3),
                point(4),
                point(5),
                point(6),
                point(7),
            );
            let w = with_signs(grid, sign_mask(std::array::from_fn(|l| (aux >> (7 * l)) as usize)));
            let scales = _mm256_set1_epi16(2 * (aux >> 28) as i16 + 1);
            for (acc, y) in acc.iter_mut().zip(yb) {
                *acc = add_scaled::<VNNI>(*acc, w, load32(&y.qs, 32 * c), scales);
            }
        }
        add_totals(&mut sumf, xb.d, acc, yb);
    }
    sumf.map(|s| 0.25 * s)
}
