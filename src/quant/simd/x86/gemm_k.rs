//! The AVX-512 VNNI panel kernel for Q4_K and Q6_K weights against Q8_K activations: 16
//! weight rows against a tile of up to 8 token rows, bit-identical to `q4_k::vec_dot_ref` and
//! `q6_k::vec_dot_ref`.
//!
//! The references keep eight integer lane sums per super-block (lane `l` takes the values at
//! positions `l mod 8`, each times its sub-block scale) and eight float sums across
//! super-blocks. To reproduce them exactly, a panel is unpacked into scaled levels
//! (`scale * q`, at most 63 * 15 or 128 * 32 in magnitude, so i16) paired within a lane:
//! positions `16k + l` and `16k + l + 8`, which always share a scale. One `vpdpwssd` against a
//! token's matching activation pair then adds both products to lane `l` of 16 rows at once,
//! and the sixteen pairs of a lane give the reference's `aux32[l]` exactly. The kernel runs the
//! lanes one after another, each across all super-blocks, which leaves every float sum's
//! operations and their order as the reference has them.
//!
//! This file must not decide when the kernel applies; `crate::quant::gemm` checks the sizes and
//! the CPU, and these functions trust those checks.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::k_quants::unpack_scales_mins_k4;
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q6_k::BlockQ6K;

use super::gemm::PANEL;

/// The two types, as the const parameter of the kernels.
pub(crate) const Q4_K: u8 = 0;
pub(crate) const Q6_K: u8 = 1;

/// 32-bit words per super-block of a panel: 8 lanes of 16 pairs, for 16 rows.
pub(crate) const PACK_WORDS: usize = 8 * 16 * PANEL;
/// Words per super-block of a token's activation pairs: 8 lanes of 16 pairs.
pub(crate) const PAIR_WORDS: usize = 8 * 16;

/// The 256 levels of a Q4_K super-block times their sub-block scales, and its 8 minimums.
fn scaled_q4_k(b: &BlockQ4K, out: &mut [i16; 256]) -> [u8; 8] {
    let (scales, mins) = unpack_scales_mins_k4(&b.scales);
    for (c, q) in b.qs.chunks_exact(32).enumerate() {
        for (i, &byte) in q.iter().enumerate() {
            out[64 * c + i] = scales[2 * c] as i16 * (byte & 0x0f) as i16;
            out[64 * c + 32 + i] = scales[2 * c + 1] as i16 * (byte >> 4) as i16;
        }
    }
    mins
}

/// The 256 signed levels of a Q6_K super-block times their sub-block scales.
fn scaled_q6_k(b: &BlockQ6K, out: &mut [i16; 256]) {
    for h in 0..2 {
        let (ql, qh) = (&b.ql[64 * h..64 * h + 64], &b.qh[32 * h..32 * h + 32]);
        for l in 0..32 {
            let q = [
                (ql[l] & 0x0f) | ((qh[l] & 3) << 4),
                (ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4),
                (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4),
                (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4),
            ];
            for (k, &q) in q.iter().enumerate() {
                let at = 128 * h + 32 * k + l;
                out[at] = b.scales[at / 16] as i16 * (q as i16 - 32);
            }
        }
    }
}

/// Two i16 as the low and high halves of a word.
#[inline]
fn pair(lo: i16, hi: i16) -> u32 {
    lo as u16 as u32 | (hi as u16 as u32) << 16
}

/// The word of the pair (positions `16k + l`, `16k + l + 8`) of 256 values.
#[inline]
fn lane_pair(v: &[i16; 256], l: usize, k: usize) -> u32 {
    pair(v[16 * k + l], v[16 * k + l + 8])
}

/// An unpacked panel of `nsb` super-blocks: the scaled level pairs (`PACK_WORDS` per
/// super-block), the scales `d` and (Q4_K) `dmin` as f32 (16 per super-block), and the
/// minimums as pairs of equal i16 (8 words of 16 rows per super-block; Q4_K only).
pub(crate) struct PanelK<'a> {
    pub pack: &'a [u32],
    pub mins: &'a [u32],
    pub dx: &'a [f32],
    pub dmx: &'a [f32],
    pub nsb: usize,
}

/// Unpacks the rows `rows` (at most [`PANEL`]) of the weight `w` (`nsb` super-blocks per row)
/// into the buffers of a [`PanelK`]; lanes past the rows are zero.
pub(crate) fn unpack_panel_k<const KIND: u8>(
    w: &[u8],
    nsb: usize,
    rows: std::ops::Range<usize>,
    pack: &mut [u32],
    mins: &mut [u32],
    dx: &mut [f32],
    dmx: &mut [f32],
) {
    let bsize = if KIND == Q4_K { 144 } else { 210 };
    let mut v = [0i16; 256];
    for r in 0..PANEL {
        let row = rows.start + r;
        for sb in 0..nsb {
            let pack = &mut pack[sb * PACK_WORDS..(sb + 1) * PACK_WORDS];
            let (mut m, mut d, mut dmin) = ([0u8; 8], 0.0, 0.0);
            if row < rows.end {
                let blk = &w[(row * nsb + sb) * bsize..][..bsize];
                if KIND == Q4_K {
                    let b: BlockQ4K = bytemuck::pod_read_unaligned(blk);
                    m = scaled_q4_k(&b, &mut v);
                    (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
                } else {
                    let b: BlockQ6K = bytemuck::pod_read_unaligned(blk);
                    scaled_q6_k(&b, &mut v);
                    d = f16_to_f32(b.d);
                }
            } else {
                v = [0; 256];
            }
            for l in 0..8 {
                for k in 0..16 {
                    pack[(l * 16 + k) * PANEL + r] = lane_pair(&v, l, k);
                }
                mins[(sb * 8 + l) * PANEL + r] = pair(m[l] as i16, m[l] as i16);
            }
            dx[sb * PANEL + r] = d;
            dmx[sb * PANEL + r] = dmin;
        }
    }
}

/// A token's Q8_K super-block as the activation pairs the kernel broadcasts (`PAIR_WORDS`).
pub(crate) fn activation_pairs(qs: &[i8; 256], out: &mut [i32]) {
    let v: [i16; 256] = std::array::from_fn(|i| qs[i] as i16);
    for l in 0..8 {
        for k in 0..16 {
            out[l * 16 + k] = lane_pair(&v, l, k) as i32;
        }
    }
}

/// The activations of a tile: `T` token rows of Q8_K blocks, their pairs and scales.
pub(crate) struct TileActivationsK<'a> {
    /// The Q8_K token rows, the tile's first at 0 (the kernel reads `bsums` from them).
    pub data: &'a [u8],
    pub row_bytes: usize,
    /// `PAIR_WORDS` per token and super-block, token-major.
    pub pairs: &'a [i32],
    /// The scale of each token's super-block.
    pub d: &'a [f32],
}

/// One panel against `T` token rows: `y[t * stride + r]` for the panel's row `r` in the lanes
/// set in `mask`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `p` holds a panel of `nsb` super-blocks; `a` holds `T`
/// token rows of `nsb` super-blocks with their pairs and scales; `y` holds `(T - 1) * stride`
/// values plus those of the lanes `mask` keeps.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn panel_tile_k<const KIND: u8, const T: usize>(
    p: &PanelK<'_>,
    a: &TileActivationsK<'_>,
    y: &mut [f32],
    stride: usize,
    mask: u16,
) {
    let PanelK {
        pack,
        mins,
        dx,
        dmx,
        nsb,
    } = *p;
    debug_assert!(pack.len() >= nsb * PACK_WORDS && dx.len() >= nsb * PANEL);
    debug_assert!(KIND != Q4_K || (mins.len() >= nsb * 8 * PANEL && dmx.len() >= nsb * PANEL));
    debug_assert!(a.data.len() >= (T - 1) * a.row_bytes + nsb * 292);
    debug_assert!(a.pairs.len() >= T * nsb * PAIR_WORDS && a.d.len() >= T * nsb);
    debug_assert!(y.len() >= (T - 1) * stride + (16 - mask.leading_zeros() as usize));
    let mut sumf = [_mm512_setzero_ps(); T];
    if KIND == Q4_K {
        // `sumf -= (dmin * d_y) * Σ bsums[j] * mins[j / 2]`, super-block by super-block.
        for sb in 0..nsb {
            let mut sumi = [_mm512_setzero_si512(); T];
            for i in 0..8 {
                let m = _mm512_loadu_si512(mins.as_ptr().add((sb * 8 + i) * PANEL).cast());
                for (t, s) in sumi.iter_mut().enumerate() {
                    // bsums 2i and 2i + 1 of the token's super-block, at byte 260 of a Q8_K block.
                    let bsums = a.data.as_ptr().add(t * a.row_bytes + sb * 292 + 260 + 4 * i);
                    *s = _mm512_dpwssd_epi32(*s, m, _mm512_set1_epi32(bsums.cast::<i32>().read_unaligned()));
                }
            }
            let dmin = _mm512_loadu_ps(dmx.as_ptr().add(sb * PANEL));
            for (t, (acc, s)) in sumf.iter_mut().zip(&sumi).enumerate() {
                let dmin = _mm512_mul_ps(dmin, _mm512_set1_ps(*a.d.get_unchecked(t * nsb + sb)));
                *acc = _mm512_sub_ps(*acc, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(*s)));
            }
        }
    }
    // Lane by lane: `sums[l] += (d_x * d_y) * aux32[l]` over the super-blocks, then
    // `sumf += sums[l]`, in lane order.
    for l in 0..8 {
        let mut sums = [_mm512_setzero_ps(); T];
        for sb in 0..nsb {
            let mut aux = [_mm512_setzero_si512(); T];
            let wp = pack.as_ptr().add(sb * PACK_WORDS + l * 16 * PANEL);
            for k in 0..16 {
                let w = _mm512_loadu_si512(wp.add(k * PANEL).cast());
                for (t, s) in aux.iter_mut().enumerate() {
                    let pair = *a.pairs.get_unchecked((t * nsb + sb) * PAIR_WORDS + l * 16 + k);
                    *s = _mm512_dpwssd_epi32(*s, w, _mm512_set1_epi32(pair));
                }
            }
            let d = _mm512_loadu_ps(dx.as_ptr().add(sb * PANEL));
            for (t, (sum, s)) in sums.iter_mut().zip(&aux).enumerate() {
                let d = _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(t * nsb + sb)));
                *sum = _mm512_add_ps(*sum, _mm512_mul_ps(d, _mm512_cvtepi32_ps(*s)));
            }
        }
        for (acc, sum) in sumf.iter_mut().zip(&sums) {
            *acc = _mm512_add_ps(*acc, *sum);
        }
    }
    for (t, acc) in sumf.iter().enumerate() {
        _mm512_mask_storeu_ps(y.as_mut_ptr().add(t * stride), mask, *acc);
    }
}
