//! The AVX-512 VNNI panel kernel for the K-quants (Q2_K to Q6_K) and IQ4_XS against Q8_K
//! activations: 16 weight rows against a tile of up to 8 token rows, bit-identical to the types'
//! `vec_dot_ref`.
//!
//! The K-quant references take one exact integer per super-block and row: the levels times the
//! activations, summed per sub-block and times the sub-block's scale. A panel is unpacked into
//! the unsigned levels (four consecutive ones of a row per 32-bit word, so a sub-block is 8 or 4
//! words), one `vpdpbusd` against a token's matching four activation bytes (a broadcast straight
//! from the Q8_K block) adds four products for 16 rows at once, and one `vpmulld` per sub-block
//! applies its scale. The integer parts that do not depend on the levels come from the
//! activations' group sums with `vpdpwssd`: the minimums of Q2_K, Q4_K and Q5_K, and the
//! offsets of Q6_K and Q3_K (their stored levels are the signed ones plus 32 and plus 4). The
//! float steps per super-block are then the references', in their order. IQ4_XS's reference
//! takes a float step per block of 32 instead (`iq4_xs_block`): its table values are unpacked
//! 128 up, and each block's sum, less 128 times its activations' sum, is scaled and added.
//!
//! Repacked Q4_K weights (`crate::quant::repack`) go through the same arithmetic:
//! `repacked_tile_q4_k` reads a record's levels, scales and minimums straight into these vectors.
//!
//! `amx_panel_tile_k` runs a panel against 16 tokens with one AMX tile product per sub-block
//! (`super::amx`) in place of the `vpdpbusd` loop, then the same steps (`finish_super_block`);
//! `unpack_records_q4_k` expands repacked Q4_K records into a panel for it.
//!
//! This file must not decide when the kernel applies; `crate::quant::gemm` checks the sizes and
//! the CPU, and these functions trust those checks.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::iq2_xs::{self, BlockIq2Xs};
use crate::quant::iq3_xxs::{self, BlockIq3Xxs};
use crate::quant::iq4_xs::{self, BlockIq4Xs};
use crate::quant::k_quants::unpack_scales_mins_k4;
use crate::quant::q2_k::{self, BlockQ2K};
use crate::quant::q3_k::{self, BlockQ3K};
use crate::quant::q4_k::{self, BlockQ4K};
use crate::quant::q5_k::{self, BlockQ5K};
use crate::quant::q6_k::{self, BlockQ6K};
use crate::quant::q8_k::BlockQ8K;

use super::gemm::PANEL;

/// The types, as the const parameter of the kernels.
pub(crate) const Q4_K: u8 = 0;
pub(crate) const Q6_K: u8 = 1;
pub(crate) const Q5_K: u8 = 2;
pub(crate) const Q3_K: u8 = 3;
pub(crate) const Q2_K: u8 = 4;
pub(crate) const IQ4_XS: u8 = 5;
pub(crate) const IQ2_XS: u8 = 6;
pub(crate) const IQ3_XXS: u8 = 7;

/// The codebook i-quants' signed levels (at most 62 in magnitude) are stored this far up, so
/// that `vpdpbusd` takes them unsigned; the offset term undoes it.
const IQ_OFFSET: i32 = 64;

/// What the references multiply their total by at the very end: IQ2_XS's 0.125 and IQ3_XXS's
/// 0.25 (1 for the others).
const fn final_factor(kind: u8) -> f32 {
    match kind {
        IQ2_XS => 0.125,
        IQ3_XXS => 0.25,
        _ => 1.0,
    }
}

/// How many records ahead the repacked tiles of Q4_K (index [`Q4_K`]) and Q6_K ([`Q6_K`])
/// prefetch. The best distance depends on the CPU: one record measured 20-25 % faster than
/// four on a Xeon with AMX (Q4_K, 1.5B, `bench -p 0 -n 64 -t 1`), where four had measured 20 %
/// faster than about two on a Zen 5 class guest; so the kernel choice (`crate::quant::choice`)
/// times the distances on each CPU and sets them here before the first product.
static PREFETCH_RECORDS: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(1),
    std::sync::atomic::AtomicUsize::new(1),
];

/// Sets how many records ahead the repacked tiles of `kind` ([`Q4_K`] or [`Q6_K`]) prefetch:
/// speed only, never a result.
pub(crate) fn set_prefetch_records(kind: u8, records: usize) {
    PREFETCH_RECORDS[usize::from(kind == Q6_K)].store(records, std::sync::atomic::Ordering::Relaxed);
}

/// How many records ahead the repacked tiles of `kind` prefetch.
pub(crate) fn prefetch_records(kind: u8) -> usize {
    PREFETCH_RECORDS[usize::from(kind == Q6_K)].load(std::sync::atomic::Ordering::Relaxed)
}

/// Words of four levels per super-block and row.
const WORDS: usize = 64;
/// 32-bit words per super-block of a panel's levels.
pub(crate) const PACK_WORDS: usize = WORDS * PANEL;
/// Sub-blocks per super-block, at most (Q6_K's 16 of 16 values).
pub(crate) const MAX_SUBS: usize = 16;
/// Words of the group-sum term per super-block and row: Q4_K/Q5_K's minimum pairs (4 used),
/// Q6_K's offset pairs (8).
pub(crate) const TERM_WORDS: usize = 8;
/// Words per super-block of a token's activation terms: `(b[2i], b[2i + 1])` as i16 pairs,
/// where `b[j]` is the sum of the 32 activations of sub-block `j`.
pub(crate) const PAIR_WORDS: usize = 4;

/// Bytes of a Q8_K block, and where its values and its group sums start (the kernel reads
/// them in place, from the activation rows' bytes).
const Q8_K_BYTES: usize = std::mem::size_of::<BlockQ8K>();
const Q8_K_QS: usize = std::mem::offset_of!(BlockQ8K, qs);
const Q8_K_BSUMS: usize = std::mem::offset_of!(BlockQ8K, bsums);

/// Sub-blocks per super-block of `KIND`.
const fn subs(kind: u8) -> usize {
    if matches!(kind, Q4_K | Q5_K | IQ4_XS | IQ3_XXS) {
        8
    } else {
        16
    }
}

/// Whether `KIND` stores its levels above the signed ones (Q6_K by 32, Q3_K by 4, the
/// codebook i-quants by [`IQ_OFFSET`]), which the group-sum term undoes.
const fn has_offset(kind: u8) -> bool {
    matches!(kind, Q6_K | Q3_K | IQ2_XS | IQ3_XXS)
}

/// Two i16 as the low and high halves of a word.
#[inline]
fn pair(lo: i16, hi: i16) -> u32 {
    lo as u16 as u32 | (hi as u16 as u32) << 16
}

/// An unpacked panel of `nsb` super-blocks: the levels (`PACK_WORDS` per super-block), the
/// sub-block scales as i32 (`subs(KIND)` vectors of 16 rows per super-block), the group-sum
/// term (`TERM_WORDS` vectors per super-block), and `d` and (Q4_K, Q5_K) `dmin` as f32.
pub(crate) struct PanelK<'a> {
    pub pack: &'a [u32],
    pub scales: &'a [i32],
    pub terms: &'a [u32],
    pub dx: &'a [f32],
    pub dmx: &'a [f32],
    pub nsb: usize,
}

/// What a row's super-block gives the panel: its levels, sub-block scales, group-sum term
/// words, `d` and `dmin`.
type Unpacked = ([u8; 256], [i32; MAX_SUBS], [u32; TERM_WORDS], f32, f32);

/// One super-block of `KIND` unpacked.
fn unpack_block<const KIND: u8>(blk: &[u8]) -> Unpacked {
    let mut scales = [0i32; MAX_SUBS];
    let mut terms = [0u32; TERM_WORDS];
    match KIND {
        Q6_K => {
            let b: BlockQ6K = bytemuck::pod_read_unaligned(blk);
            for (s, &bs) in scales.iter_mut().zip(&b.scales) {
                *s = bs as i32;
            }
            // The stored levels are `q + 32`: `-32 * Σ scale_j * bsum_j` undoes it.
            for (i, t) in terms.iter_mut().enumerate() {
                *t = pair(-32 * b.scales[2 * i] as i16, -32 * b.scales[2 * i + 1] as i16);
            }
            (q6_k::levels(&b), scales, terms, f16_to_f32(b.d), 0.0)
        }
        Q3_K => {
            let b: BlockQ3K = bytemuck::pod_read_unaligned(blk);
            let sc = q3_k::scales(&b);
            for (s, &v) in scales.iter_mut().zip(&sc) {
                *s = v as i32;
            }
            // The levels are stored 4 up (0..=7): `-4 * Σ scale_j * bsum_j` undoes it.
            for (i, t) in terms.iter_mut().enumerate() {
                *t = pair(-4 * sc[2 * i] as i16, -4 * sc[2 * i + 1] as i16);
            }
            (
                q3_k::levels(&b).map(|l| (l + 4) as u8),
                scales,
                terms,
                f16_to_f32(b.d),
                0.0,
            )
        }
        IQ2_XS => {
            let b: BlockIq2Xs = bytemuck::pod_read_unaligned(blk);
            let sc = iq2_xs::scales(&b).map(|s| 2 * s as i32 + 1);
            scales.copy_from_slice(&sc);
            // `-64 * Σ scale_j * bsum_j` undoes the levels' offset, per 16 values.
            for (i, t) in terms.iter_mut().enumerate() {
                *t = pair((-IQ_OFFSET * sc[2 * i]) as i16, (-IQ_OFFSET * sc[2 * i + 1]) as i16);
            }
            let levels = iq2_xs::levels(&b).map(|l| (l as i32 + IQ_OFFSET) as u8);
            (levels, scales, terms, f16_to_f32(b.d), 0.0)
        }
        IQ3_XXS => {
            let b: BlockIq3Xxs = bytemuck::pod_read_unaligned(blk);
            let (levels, sc) = iq3_xxs::levels(&b);
            for (s, &v) in scales.iter_mut().zip(&sc) {
                *s = 2 * v as i32 + 1;
            }
            // One scale per 32 values: both halves of pair word i are block i's.
            for (i, t) in terms.iter_mut().enumerate() {
                let c = (-IQ_OFFSET * scales[i]) as i16;
                *t = pair(c, c);
            }
            let levels = levels.map(|l| (l as i32 + IQ_OFFSET) as u8);
            (levels, scales, terms, f16_to_f32(b.d), 0.0)
        }
        IQ4_XS => {
            let b: BlockIq4Xs = bytemuck::pod_read_unaligned(blk);
            scales[..8].copy_from_slice(&iq4_xs::scales(&b));
            // SAFETY: the panel kernels run only on CPUs with AVX-512, so with SSSE3.
            let levels = unsafe { iq4_xs_levels_128(&b) };
            (levels, scales, terms, f16_to_f32(b.d), 0.0)
        }
        Q2_K => {
            let b: BlockQ2K = bytemuck::pod_read_unaligned(blk);
            for (s, &v) in scales.iter_mut().zip(&b.scales) {
                *s = (v & 0x0f) as i32;
            }
            // One minimum per sub-block of 16, against the activations' own group sums.
            for (i, t) in terms.iter_mut().enumerate() {
                *t = pair((b.scales[2 * i] >> 4) as i16, (b.scales[2 * i + 1] >> 4) as i16);
            }
            (q2_k::levels(&b), scales, terms, f16_to_f32(b.d), f16_to_f32(b.dmin))
        }
        _ => {
            let (levels, d, dmin, packed) = if KIND == Q4_K {
                let b: BlockQ4K = bytemuck::pod_read_unaligned(blk);
                (q4_k::levels(&b), b.d, b.dmin, b.scales)
            } else {
                let b: BlockQ5K = bytemuck::pod_read_unaligned(blk);
                (q5_k::levels(&b), b.d, b.dmin, b.scales)
            };
            let (sc, mins) = unpack_scales_mins_k4(&packed);
            for (s, &v) in scales.iter_mut().zip(&sc) {
                *s = v as i32;
            }
            for (i, t) in terms.iter_mut().take(4).enumerate() {
                *t = pair(mins[2 * i] as i16, mins[2 * i + 1] as i16);
            }
            (levels, scales, terms, f16_to_f32(d), f16_to_f32(dmin))
        }
    }
}

/// IQ4_XS's levels, the table's values stored 128 up (1..=241; `iq4_xs_block`'s offsets undo
/// it): the 4-bit index of weight `32 ib + j` is nibble `j / 16` of `qs[16 ib + j % 16]`, looked
/// up 16 at a time with `pshufb`.
#[target_feature(enable = "ssse3")]
unsafe fn iq4_xs_levels_128(b: &BlockIq4Xs) -> [u8; 256] {
    let table = _mm_loadu_si128(IQ4_NL_128.as_ptr().cast());
    let low = _mm_set1_epi8(0x0f);
    let mut levels = [0u8; 256];
    for (qs, out) in b.qs.chunks_exact(16).zip(levels.chunks_exact_mut(32)) {
        let q = _mm_loadu_si128(qs.as_ptr().cast());
        let lo = _mm_shuffle_epi8(table, _mm_and_si128(q, low));
        let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), low));
        _mm_storeu_si128(out.as_mut_ptr().cast(), lo);
        _mm_storeu_si128(out[16..].as_mut_ptr().cast(), hi);
    }
    levels
}

/// Unpacks the rows `rows` (at most [`PANEL`]) of the weight `w` (`nsb` super-blocks per row)
/// into the buffers of a [`PanelK`]; lanes past the rows are zero.
#[allow(clippy::too_many_arguments)]
pub(crate) fn unpack_panel_k<const KIND: u8>(
    w: &[u8],
    nsb: usize,
    rows: std::ops::Range<usize>,
    pack: &mut [u32],
    scales: &mut [i32],
    terms: &mut [u32],
    dx: &mut [f32],
    dmx: &mut [f32],
) {
    let bsize = match KIND {
        Q4_K => std::mem::size_of::<BlockQ4K>(),
        Q5_K => std::mem::size_of::<BlockQ5K>(),
        Q3_K => std::mem::size_of::<BlockQ3K>(),
        Q2_K => std::mem::size_of::<BlockQ2K>(),
        IQ4_XS => std::mem::size_of::<BlockIq4Xs>(),
        IQ2_XS => std::mem::size_of::<BlockIq2Xs>(),
        IQ3_XXS => std::mem::size_of::<BlockIq3Xxs>(),
        _ => std::mem::size_of::<BlockQ6K>(),
    };
    let n_subs = subs(KIND);
    for r in 0..PANEL {
        let row = rows.start + r;
        for sb in 0..nsb {
            let (levels, sc, tw, d, dmin) = if row < rows.end {
                unpack_block::<KIND>(&w[(row * nsb + sb) * bsize..][..bsize])
            } else {
                ([0; 256], [0; MAX_SUBS], [0; TERM_WORDS], 0.0, 0.0)
            };
            let pack = &mut pack[sb * PACK_WORDS..(sb + 1) * PACK_WORDS];
            for (k, q) in levels.chunks_exact(4).enumerate() {
                pack[k * PANEL + r] = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
            }
            for (j, &s) in sc.iter().take(n_subs).enumerate() {
                scales[(sb * n_subs + j) * PANEL + r] = s;
            }
            for (i, &t) in tw.iter().enumerate() {
                terms[(sb * TERM_WORDS + i) * PANEL + r] = t;
            }
            dx[sb * PANEL + r] = d;
            dmx[sb * PANEL + r] = dmin;
        }
    }
}

/// A token's Q8_K super-block as the words the kernel broadcasts for the minimums
/// (`PAIR_WORDS`): the sub-block sums of its values, paired.
pub(crate) fn activation_pairs(bsums: &[i16; 16], out: &mut [i32]) {
    for (i, out) in out.iter_mut().enumerate().take(PAIR_WORDS) {
        let b = |j: usize| bsums[2 * j] + bsums[2 * j + 1];
        *out = pair(b(2 * i), b(2 * i + 1)) as i32;
    }
}

/// The activations of a tile: `T` token rows of Q8_K blocks, their pairs and scales.
pub(crate) struct TileActivationsK<'a> {
    /// The Q8_K token rows, the tile's first at 0.
    pub data: &'a [u8],
    pub row_bytes: usize,
    /// `PAIR_WORDS` per token and super-block, token-major.
    pub pairs: &'a [i32],
    /// The scale of each token's super-block.
    pub d: &'a [f32],
}

/// The activations of a tile for the repacked kernels: `T` tokens' Q8_K blocks, pairs and
/// scales interleaved by super-block (`[sb][t]`), so that every token's block of a super-block
/// sits at a constant offset from one pointer (token-major rows need a register per token, and
/// from five tokens on the kernels ran short of them).
pub(crate) struct InterleavedTileK<'a> {
    /// The Q8_K blocks, `[sb][t]`.
    pub data: &'a [u8],
    /// `PAIR_WORDS` per block, `[sb][t]`.
    pub pairs: &'a [i32],
    /// The scale of each block, `[sb][t]`.
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
        scales,
        terms,
        dx,
        dmx,
        nsb,
    } = *p;
    let n_subs = subs(KIND);
    let per_sub = WORDS / n_subs;
    debug_assert!(pack.len() >= nsb * PACK_WORDS && dx.len() >= nsb * PANEL && dmx.len() >= nsb * PANEL);
    debug_assert!(scales.len() >= nsb * n_subs * PANEL && terms.len() >= nsb * TERM_WORDS * PANEL);
    debug_assert!(a.data.len() >= (T - 1) * a.row_bytes + nsb * Q8_K_BYTES);
    debug_assert!(a.pairs.len() >= T * nsb * PAIR_WORDS && a.d.len() >= T * nsb);
    debug_assert!(y.len() >= (T - 1) * stride + (16 - mask.leading_zeros() as usize));
    let block = |t: usize, sb: usize| a.data.as_ptr().add(t * a.row_bytes + sb * Q8_K_BYTES);
    let word = |at: *const u8| _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..nsb {
        let mut sumi = [_mm512_setzero_si512(); T];
        let d4d8 = if KIND == IQ4_XS {
            iq4_xs_d4d8::<T>(p, a, sb)
        } else {
            [_mm512_setzero_ps(); T]
        };
        for j in 0..n_subs {
            // IQ4_XS's sums start from the offset of its levels.
            let mut s: [__m512i; T] = std::array::from_fn(|t| {
                if KIND == IQ4_XS {
                    _mm512_set1_epi32(iq4_xs_offset(a, nsb, t, sb, j))
                } else {
                    _mm512_setzero_si512()
                }
            });
            for k in 0..per_sub {
                let at = j * per_sub + k;
                let w = _mm512_loadu_si512(pack.as_ptr().add(sb * PACK_WORDS + at * PANEL).cast());
                for (t, s) in s.iter_mut().enumerate() {
                    *s = _mm512_dpbusd_epi32(*s, w, word(block(t, sb).add(Q8_K_QS + 4 * at)));
                }
            }
            if KIND == IQ4_XS {
                iq4_xs_block::<T>(p, sb, j, &d4d8, &s, &mut acc);
                continue;
            }
            let scale = _mm512_loadu_si512(scales.as_ptr().add((sb * n_subs + j) * PANEL).cast());
            for (sumi, s) in sumi.iter_mut().zip(&s) {
                *sumi = _mm512_add_epi32(*sumi, _mm512_mullo_epi32(*s, scale));
            }
        }
        if KIND != IQ4_XS {
            finish_super_block::<KIND, T>(p, a, sb, sumi, &mut acc);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let acc = if final_factor(KIND) != 1.0 {
            _mm512_mul_ps(_mm512_set1_ps(final_factor(KIND)), *acc)
        } else {
            *acc
        };
        _mm512_mask_storeu_ps(y.as_mut_ptr().add(t * stride), mask, acc);
    }
}

/// `-128 * Σ y` over block `j` (32 values) of token `t`'s super-block `sb`: what IQ4_XS's
/// levels, unpacked 128 up, add to the block's sum (half `j % 2` of pair word `j / 2`).
#[inline(always)]
unsafe fn iq4_xs_offset(a: &TileActivationsK<'_>, nsb: usize, t: usize, sb: usize, j: usize) -> i32 {
    let pair = *a.pairs.get_unchecked((t * nsb + sb) * PAIR_WORDS + j / 2) as u32;
    -128 * i32::from((pair >> (16 * (j % 2))) as u16 as i16)
}

/// Each token's `d * d_y` of super-block `sb` for the 16 rows (IQ4_XS's `d4d8`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn iq4_xs_d4d8<const T: usize>(p: &PanelK<'_>, a: &TileActivationsK<'_>, sb: usize) -> [__m512; T] {
    let d = _mm512_loadu_ps(p.dx.as_ptr().add(sb * PANEL));
    std::array::from_fn(|t| _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(t * p.nsb + sb))))
}

/// IQ4_XS's float step for block `j` (32 values) of super-block `sb`, once `sumi` holds each
/// token's exact sums of the block's levels times its activations for the 16 rows:
/// `acc += ((d * d_y) * (scale - 32)) * sumi`, the reference's step per block, in its order
/// (IQ4_XS takes no integer sum across blocks).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn iq4_xs_block<const T: usize>(
    p: &PanelK<'_>,
    sb: usize,
    j: usize,
    d4d8: &[__m512; T],
    sumi: &[__m512i; T],
    acc: &mut [__m512; T],
) {
    let ls = _mm512_cvtepi32_ps(_mm512_loadu_si512(p.scales.as_ptr().add((sb * 8 + j) * PANEL).cast()));
    for ((acc, sumi), d4d8) in acc.iter_mut().zip(sumi).zip(d4d8) {
        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(_mm512_mul_ps(*d4d8, ls), _mm512_cvtepi32_ps(*sumi)));
    }
}

/// The rest of super-block `sb` of a panel for `T` tokens, once `sumi` holds each token's
/// scaled level sums for the 16 rows: Q6_K's and Q3_K's offset term, then
/// `acc += (d * d_y) * sumi` and, for Q2_K, Q4_K and Q5_K, `acc -= (dmin * d_y) * summ` with the
/// minimums' sum `summ`: the references' float steps, in their order.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn finish_super_block<const KIND: u8, const T: usize>(
    p: &PanelK<'_>,
    a: &TileActivationsK<'_>,
    sb: usize,
    mut sumi: [__m512i; T],
    acc: &mut [__m512; T],
) {
    let PanelK {
        terms, dx, dmx, nsb, ..
    } = *p;
    let block = |t: usize| a.data.as_ptr().add(t * a.row_bytes + sb * Q8_K_BYTES);
    let word = |at: *const u8| _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
    let term = |i: usize| _mm512_loadu_si512(terms.as_ptr().add((sb * TERM_WORDS + i) * PANEL).cast());
    if has_offset(KIND) {
        for i in 0..8 {
            let c = term(i);
            for (t, sumi) in sumi.iter_mut().enumerate() {
                *sumi = _mm512_dpwssd_epi32(*sumi, c, word(block(t).add(Q8_K_BSUMS + 4 * i)));
            }
        }
    }
    let d = _mm512_loadu_ps(dx.as_ptr().add(sb * PANEL));
    for (t, (acc, sumi)) in acc.iter_mut().zip(&sumi).enumerate() {
        let d = _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(t * nsb + sb)));
        *acc = _mm512_add_ps(*acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(*sumi)));
    }
    if !has_offset(KIND) {
        let mut summ = [_mm512_setzero_si512(); T];
        if KIND == Q2_K {
            // A minimum per sub-block of 16: against the activations' group sums themselves.
            for i in 0..8 {
                let m = term(i);
                for (t, summ) in summ.iter_mut().enumerate() {
                    *summ = _mm512_dpwssd_epi32(*summ, m, word(block(t).add(Q8_K_BSUMS + 4 * i)));
                }
            }
        } else {
            for i in 0..PAIR_WORDS {
                let m = term(i);
                for (t, summ) in summ.iter_mut().enumerate() {
                    let b = *a.pairs.get_unchecked((t * nsb + sb) * PAIR_WORDS + i);
                    *summ = _mm512_dpwssd_epi32(*summ, m, _mm512_set1_epi32(b));
                }
            }
        }
        let dmin = _mm512_loadu_ps(dmx.as_ptr().add(sb * PANEL));
        for (t, (acc, summ)) in acc.iter_mut().zip(&summ).enumerate() {
            let dmin = _mm512_mul_ps(dmin, _mm512_set1_ps(*a.d.get_unchecked(t * nsb + sb)));
            *acc = _mm512_sub_ps(*acc, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(*summ)));
        }
    }
}

/// One panel against 16 token rows through tile products (`super::amx`): per sub-block, one
/// product gives every token's level sums for the 16 rows (its `K` is the sub-block's 32 or
/// 16 values), which `vpmulld` scales into `sumi` as [`panel_tile_k`] scales its own; the rest
/// is [`finish_super_block`]. `y[t * stride + r]` for the panel's row `r` in the lanes set in
/// `mask`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI, and `tiles` runs products; `p` holds a panel of `nsb`
/// super-blocks; `a` holds 16 token rows of `nsb` super-blocks with their pairs and scales;
/// `y` holds `15 * stride` values plus those of the lanes `mask` keeps.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn amx_panel_tile_k<const KIND: u8>(
    tiles: &mut impl super::amx::TileUnit,
    p: &PanelK<'_>,
    a: &TileActivationsK<'_>,
    y: &mut [f32],
    stride: usize,
    mask: u16,
) {
    const T: usize = super::amx::ROWS;
    let PanelK { pack, scales, nsb, .. } = *p;
    let n_subs = subs(KIND);
    let (per_sub, k) = (WORDS / n_subs, 256 / n_subs);
    assert!(pack.len() >= nsb * PACK_WORDS && scales.len() >= nsb * n_subs * PANEL);
    assert!(p.terms.len() >= nsb * TERM_WORDS * PANEL && p.dx.len() >= nsb * PANEL && p.dmx.len() >= nsb * PANEL);
    assert!(a.data.len() >= (T - 1) * a.row_bytes + nsb * Q8_K_BYTES);
    assert!(a.pairs.len() >= T * nsb * PAIR_WORDS && a.d.len() >= T * nsb);
    assert!(y.len() >= (T - 1) * stride + (16 - mask.leading_zeros() as usize));
    let mut sums = [0i32; T * 16];
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..nsb {
        let mut sumi = [_mm512_setzero_si512(); T];
        for j in 0..n_subs {
            let tokens = a.data.as_ptr().add(sb * Q8_K_BYTES + Q8_K_QS + j * k);
            let levels = pack.as_ptr().add(sb * PACK_WORDS + j * per_sub * PANEL);
            tiles.product(k, tokens, a.row_bytes, levels.cast(), &mut sums);
            if KIND == IQ4_XS {
                let s: [__m512i; T] = std::array::from_fn(|t| {
                    let s = _mm512_loadu_si512(sums.as_ptr().add(t * 16).cast());
                    _mm512_add_epi32(s, _mm512_set1_epi32(iq4_xs_offset(a, nsb, t, sb, j)))
                });
                let d4d8 = iq4_xs_d4d8::<T>(p, a, sb);
                iq4_xs_block::<T>(p, sb, j, &d4d8, &s, &mut acc);
                continue;
            }
            let scale = _mm512_loadu_si512(scales.as_ptr().add((sb * n_subs + j) * PANEL).cast());
            for (t, sumi) in sumi.iter_mut().enumerate() {
                let s = _mm512_loadu_si512(sums.as_ptr().add(t * 16).cast());
                *sumi = _mm512_add_epi32(*sumi, _mm512_mullo_epi32(s, scale));
            }
        }
        if KIND != IQ4_XS {
            finish_super_block::<KIND, T>(p, a, sb, sumi, &mut acc);
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        let acc = if final_factor(KIND) != 1.0 {
            _mm512_mul_ps(_mm512_set1_ps(final_factor(KIND)), *acc)
        } else {
            *acc
        };
        _mm512_mask_storeu_ps(y.as_mut_ptr().add(t * stride), mask, acc);
    }
}

/// Expands a group's Q4_K records (`nsb` of them) into the buffers of a [`PanelK`], as
/// [`unpack_panel_k`] does from the file's layout: the tile products read their levels from
/// memory.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn unpack_records_q4_k(
    records: &[u8],
    nsb: usize,
    pack: &mut [u32],
    scales: &mut [i32],
    terms: &mut [u32],
    dx: &mut [f32],
    dmx: &mut [f32],
) {
    assert!(records.len() >= nsb * RECORD_BYTES_Q4_K && pack.len() >= nsb * PACK_WORDS);
    assert!(scales.len() >= nsb * MAX_SUBS * PANEL && terms.len() >= nsb * TERM_WORDS * PANEL);
    assert!(dx.len() >= nsb * PANEL && dmx.len() >= nsb * PANEL);
    let store = |at: *mut u32, v: __m512i| _mm512_storeu_si512(at.cast(), v);
    for sb in 0..nsb {
        let rec = records.as_ptr().add(sb * RECORD_BYTES_Q4_K);
        let words = pack.as_mut_ptr().add(sb * PACK_WORDS);
        for c in 0..4 {
            for k in 0..8 {
                let (lo, hi) = record_chunk_words(rec, c, k);
                store(words.add((16 * c + k) * PANEL), lo);
                store(words.add((16 * c + 8 + k) * PANEL), hi);
            }
        }
        for j in 0..8 {
            store(
                scales.as_mut_ptr().add((sb * 8 + j) * PANEL).cast(),
                record_sub_scales(rec, j),
            );
        }
        for i in 0..PAIR_WORDS {
            store(
                terms.as_mut_ptr().add((sb * TERM_WORDS + i) * PANEL),
                record_min_pairs(rec, i),
            );
        }
        let (d, dmin) = record_d(rec);
        _mm512_storeu_ps(dx.as_mut_ptr().add(sb * PANEL), d);
        _mm512_storeu_ps(dmx.as_mut_ptr().add(sb * PANEL), dmin);
    }
}

/// Bytes of a repacked Q4_K record (16 rows' super-block; `crate::quant::repack`): nibbles,
/// scales and minimums unpacked to bytes, `d`, `dmin`.
pub(crate) const RECORD_BYTES_Q4_K: usize = crate::quant::repack::Q4_K_RECORD;
use crate::quant::repack::{Q4_K_D as D_AT, Q4_K_DMIN as DMIN_AT, Q4_K_MINS as MINS_AT, Q4_K_SCALES as SCALES_AT};

/// Sub-block `j`'s scales of the Q4_K record at `rec`, one i32 lane per row.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn record_sub_scales(rec: *const u8, j: usize) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(rec.add(SCALES_AT + 16 * j).cast()))
}

/// The panel's minimum pairs `i` (sub-blocks `2i`, `2i + 1`) of the Q4_K record at `rec`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn record_min_pairs(rec: *const u8, i: usize) -> __m512i {
    _mm512_cvtepu8_epi16(_mm256_loadu_si256(rec.add(MINS_AT + 32 * i).cast()))
}

/// The rows' `d` and `dmin` of the Q4_K record at `rec`, as f32.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn record_d(rec: *const u8) -> (__m512, __m512) {
    (
        _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(D_AT).cast())),
        _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(DMIN_AT).cast())),
    )
}

/// The level words of chunk `c` (values `64c..64c + 64`) of the Q4_K record at `rec`: word
/// `k` of sub-block `2c` and of sub-block `2c + 1`, four unsigned levels of each row per lane,
/// as the panel's `pack` holds them (words `16c + k` and `16c + 8 + k`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn record_chunk_words(rec: *const u8, c: usize, k: usize) -> (__m512i, __m512i) {
    let low = _mm512_set1_epi8(0x0f);
    let v = _mm512_loadu_si512(rec.add(64 * (8 * c + k)).cast());
    (_mm512_and_si512(v, low), _mm512_and_si512(_mm512_srli_epi16(v, 4), low))
}

/// [`record_chunk_words`] with the high nibbles left in place: word `k` of sub-block `2c + 1`
/// as sixteen times its levels (the tile takes the factor out of the sub-block's sum with one
/// exact shift, instead of shifting every word down).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn record_chunk_words_x16(rec: *const u8, c: usize, k: usize) -> (__m512i, __m512i) {
    let v = _mm512_loadu_si512(rec.add(64 * (8 * c + k)).cast());
    (
        _mm512_and_si512(v, _mm512_set1_epi8(0x0f)),
        _mm512_and_si512(v, _mm512_set1_epi8(0xf0_u8 as i8)),
    )
}

/// A group of 16 repacked Q4_K rows (`records`: `nsb` records) against `T` token rows, reading
/// the levels straight from the records: `y[t * stride + r]` for the group's row `r`. The
/// arithmetic is [`panel_tile_k`]'s.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `records` holds `nsb` records; `a` holds `T` tokens'
/// blocks of `nsb` super-blocks with their pairs and scales; `y` holds `(T - 1) * stride + 16`
/// values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn repacked_tile_q4_k<const T: usize>(
    records: &[u8],
    nsb: usize,
    a: &InterleavedTileK<'_>,
    y: &mut [f32],
    stride: usize,
) {
    assert!(records.len() >= nsb * RECORD_BYTES_Q4_K);
    assert!(y.len() >= (T - 1) * stride + 16);
    debug_assert!(a.data.len() >= T * nsb * Q8_K_BYTES);
    debug_assert!(a.pairs.len() >= T * nsb * PAIR_WORDS && a.d.len() >= T * nsb);
    let block = |t: usize, sb: usize| a.data.as_ptr().add((sb * T + t) * Q8_K_BYTES);
    let ahead = prefetch_records(Q4_K) * RECORD_BYTES_Q4_K;
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..nsb {
        let record = &records[sb * RECORD_BYTES_Q4_K..(sb + 1) * RECORD_BYTES_Q4_K];
        // The records stream from memory: ask for those ahead (as far as measured best here).
        prefetch_past(record, ahead);
        let rec = record.as_ptr();
        let y4 =
            |t: usize, w: usize| _mm512_set1_epi32(block(t, sb).add(Q8_K_QS + 4 * w).cast::<i32>().read_unaligned());
        let mut sumi = [_mm512_setzero_si512(); T];
        // A chunk's two sub-blocks at a time (their sums stay in registers), each scaled into
        // `sumi` as soon as it is complete.
        for c in 0..4 {
            let (mut s_lo, mut s_hi) = ([_mm512_setzero_si512(); T], [_mm512_setzero_si512(); T]);
            for k in 0..8 {
                let (lo, hi16) = record_chunk_words_x16(rec, c, k);
                for t in 0..T {
                    s_lo[t] = _mm512_dpbusd_epi32(s_lo[t], lo, y4(t, 16 * c + k));
                    s_hi[t] = _mm512_dpbusd_epi32(s_hi[t], hi16, y4(t, 16 * c + 8 + k));
                }
            }
            let (scale_lo, scale_hi) = (record_sub_scales(rec, 2 * c), record_sub_scales(rec, 2 * c + 1));
            for t in 0..T {
                // `s_hi` is sixteen times the sub-block's sum (at most 16 * 32 * 15 * 128 in
                // magnitude): the arithmetic shift divides it exactly.
                let scaled = _mm512_add_epi32(
                    _mm512_mullo_epi32(s_lo[t], scale_lo),
                    _mm512_mullo_epi32(_mm512_srai_epi32(s_hi[t], 4), scale_hi),
                );
                sumi[t] = _mm512_add_epi32(sumi[t], scaled);
            }
        }
        let (d, dmin) = record_d(rec);
        for (t, (acc, sumi)) in acc.iter_mut().zip(&sumi).enumerate() {
            let d = _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(sb * T + t)));
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(*sumi)));
        }
        let mut summ = [_mm512_setzero_si512(); T];
        for i in 0..PAIR_WORDS {
            let m = record_min_pairs(rec, i);
            for (t, summ) in summ.iter_mut().enumerate() {
                let b = *a.pairs.get_unchecked((sb * T + t) * PAIR_WORDS + i);
                *summ = _mm512_dpwssd_epi32(*summ, m, _mm512_set1_epi32(b));
            }
        }
        for (t, (acc, summ)) in acc.iter_mut().zip(&summ).enumerate() {
            let dmin = _mm512_mul_ps(dmin, _mm512_set1_ps(*a.d.get_unchecked(sb * T + t)));
            *acc = _mm512_sub_ps(*acc, _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(*summ)));
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(y.as_mut_ptr().add(t * stride), *acc);
    }
}

/// Bytes of a repacked Q6_K record (16 rows' super-block; `crate::quant::repack`): exactly the
/// 16 blocks' bytes.
pub(crate) const RECORD_BYTES_Q6_K: usize = crate::quant::repack::Q6_K_RECORD;
use crate::quant::repack::{Q6_K_D as Q6_D_AT, Q6_K_QH as Q6_QH_AT, Q6_K_SCALES as Q6_SCALES_AT};

/// The four level vectors of word `k` (0..8) of half `h` of the Q6_K record at `rec`, set `s`
/// holding values `128h + 32s + 4k..+4` of each row, four unsigned levels (the stored `q + 32`)
/// per lane. The low four bits are a nibble of `ql` (the low ones of vector `16h + k` for set 0,
/// of `16h + 8 + k` for set 1, their high ones for sets 2 and 3), the high two bits `2s..2s + 2`
/// of the same byte of `qh`, as in the file: three loads for the four.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q6_k_level_sets(rec: *const u8, h: usize, k: usize) -> [__m512i; 4] {
    let ql_a = _mm512_loadu_si512(rec.add(64 * (16 * h + k)).cast());
    let ql_b = _mm512_loadu_si512(rec.add(64 * (16 * h + 8 + k)).cast());
    let qh = _mm512_loadu_si512(rec.add(Q6_QH_AT + 64 * (8 * h + k)).cast());
    // The bit pairs of sets 0 and 2 (bits 0-1, 4-5 of each byte) and of sets 1 and 3 (2-3,
    // 6-7), each moved to bits 4-5 by a 16-bit shift: the bits that cross into a neighbouring
    // byte or land on bits 6-7 are the other set's, cleared beforehand. Each level is then
    // one bit select: bits 4-7 from the pair, bits 0-3 from the nibble (`ql` as loaded for
    // sets 0 and 1, shifted down by four for 2 and 3).
    let even = _mm512_and_si512(qh, _mm512_set1_epi8(0x33));
    let odd = _mm512_and_si512(qh, _mm512_set1_epi8(0xcc_u8 as i8));
    let nibble = _mm512_set1_epi8(0x0f);
    // (pair & !nibble) | (bits & nibble).
    let level = |pair: __m512i, bits: __m512i| _mm512_ternarylogic_epi32(pair, bits, nibble, 0xd8);
    [
        level(_mm512_slli_epi16(even, 4), ql_a),
        level(_mm512_slli_epi16(odd, 2), ql_b),
        level(even, _mm512_srli_epi16(ql_a, 4)),
        level(_mm512_srli_epi16(odd, 2), _mm512_srli_epi16(ql_b, 4)),
    ]
}

/// The Q6_K record's scale pairs `i` (sub-blocks `2i`, `2i + 1`), sign-extended to i16 pairs,
/// one i32 lane per row.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn q6_k_scale_pairs(rec: *const u8, i: usize) -> __m512i {
    _mm512_cvtepi8_epi16(_mm256_loadu_si256(rec.add(Q6_SCALES_AT + 32 * i).cast()))
}

/// A group of 16 repacked Q6_K rows (`records`: `nsb` records) against `T` token rows, reading
/// the levels straight from the records: `y[t * stride + r]` for the group's row `r`. The
/// arithmetic is [`panel_tile_k`]'s: per super-block the exact integer sum of the scaled
/// levels, with `-32 * Σ scale_j * bsum_j` undoing the stored offset, then `acc += (d * d_y) *
/// sumi` in f32.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `records` holds `nsb` records; `a` holds `T` tokens'
/// blocks of `nsb` super-blocks with their scales; `y` holds `(T - 1) * stride + 16` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn repacked_tile_q6_k<const T: usize>(
    records: &[u8],
    nsb: usize,
    a: &InterleavedTileK<'_>,
    y: &mut [f32],
    stride: usize,
) {
    assert!(records.len() >= nsb * RECORD_BYTES_Q6_K);
    assert!(y.len() >= (T - 1) * stride + 16);
    debug_assert!(a.data.len() >= T * nsb * Q8_K_BYTES);
    debug_assert!(a.d.len() >= T * nsb);
    let block = |t: usize, sb: usize| a.data.as_ptr().add((sb * T + t) * Q8_K_BYTES);
    let word = |at: *const u8| _mm512_set1_epi32(at.cast::<i32>().read_unaligned());
    let ahead = prefetch_records(Q6_K) * RECORD_BYTES_Q6_K;
    let mut acc = [_mm512_setzero_ps(); T];
    for sb in 0..nsb {
        let record = &records[sb * RECORD_BYTES_Q6_K..(sb + 1) * RECORD_BYTES_Q6_K];
        // The records stream from memory: ask for those ahead (as far as measured best here;
        // six had measured 3-5 % better than three on a Zen 5 class guest, one and six were
        // level on a Xeon with AMX).
        prefetch_past(record, ahead);
        let rec = record.as_ptr();
        // The offset's sum first, `Σ scale_j * bsum_j` by pairs of sub-blocks.
        let mut offset = [_mm512_setzero_si512(); T];
        for i in 0..8 {
            let pairs = q6_k_scale_pairs(rec, i);
            for (t, offset) in offset.iter_mut().enumerate() {
                *offset = _mm512_dpwssd_epi32(*offset, pairs, word(block(t, sb).add(Q8_K_BSUMS + 4 * i)));
            }
        }
        let mut sumi = offset.map(|o| _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(o, 5)));
        // Four sub-blocks at a time, one of each set (`8h + 2s + kk`): each word of `ql` and
        // `qh` is loaded once for the four sets it holds, and the four sums are independent.
        for h in 0..2 {
            for kk in 0..2 {
                let mut sub = [[_mm512_setzero_si512(); T]; 4];
                for k in 4 * kk..4 * kk + 4 {
                    for (set, (sub, levels)) in sub.iter_mut().zip(q6_k_level_sets(rec, h, k)).enumerate() {
                        let at = Q8_K_QS + 128 * h + 32 * set + 4 * k;
                        for (t, sub) in sub.iter_mut().enumerate() {
                            *sub = _mm512_dpbusd_epi32(*sub, levels, word(block(t, sb).add(at)));
                        }
                    }
                }
                // Sub-block `8h + 2s + kk`'s scale is half `kk` of pair `4h + s`.
                for (set, sub) in sub.iter().enumerate() {
                    let pairs = q6_k_scale_pairs(rec, 4 * h + set);
                    let scale = if kk == 0 {
                        _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16)
                    } else {
                        _mm512_srai_epi32(pairs, 16)
                    };
                    for (sumi, sub) in sumi.iter_mut().zip(sub) {
                        *sumi = _mm512_add_epi32(*sumi, _mm512_mullo_epi32(*sub, scale));
                    }
                }
            }
        }
        let d = _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(Q6_D_AT).cast()));
        for (t, (acc, sumi)) in acc.iter_mut().zip(&sumi).enumerate() {
            let d = _mm512_mul_ps(d, _mm512_set1_ps(*a.d.get_unchecked(sb * T + t)));
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(d, _mm512_cvtepi32_ps(*sumi)));
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(y.as_mut_ptr().add(t * stride), *acc);
    }
}

/// Expands a group's Q6_K records (`nsb` of them) into the buffers of a [`PanelK`], as
/// [`unpack_panel_k`] does from the file's layout: a prompt's many tiles then share the levels
/// instead of rebuilding them from `ql` and `qh` each.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn unpack_records_q6_k(
    records: &[u8],
    nsb: usize,
    pack: &mut [u32],
    scales: &mut [i32],
    terms: &mut [u32],
    dx: &mut [f32],
) {
    assert!(records.len() >= nsb * RECORD_BYTES_Q6_K && pack.len() >= nsb * PACK_WORDS);
    assert!(scales.len() >= nsb * MAX_SUBS * PANEL && terms.len() >= nsb * TERM_WORDS * PANEL);
    assert!(dx.len() >= nsb * PANEL);
    let store = |at: *mut u32, v: __m512i| _mm512_storeu_si512(at.cast(), v);
    for sb in 0..nsb {
        let rec = records.as_ptr().add(sb * RECORD_BYTES_Q6_K);
        // Word `32h + 8s + k` of the panel holds values `128h + 32s + 4k..`.
        let words = pack.as_mut_ptr().add(sb * PACK_WORDS);
        for h in 0..2 {
            for k in 0..8 {
                for (set, levels) in q6_k_level_sets(rec, h, k).into_iter().enumerate() {
                    store(words.add((32 * h + 8 * set + k) * PANEL), levels);
                }
            }
        }
        for i in 0..8 {
            let pairs = q6_k_scale_pairs(rec, i);
            let scale = scales.as_mut_ptr().add((sb * MAX_SUBS + 2 * i) * PANEL);
            _mm512_storeu_si512(scale.cast(), _mm512_srai_epi32(_mm512_slli_epi32(pairs, 16), 16));
            _mm512_storeu_si512(scale.add(PANEL).cast(), _mm512_srai_epi32(pairs, 16));
            // The offset term's pairs, `-32 * scale` (within i16: |scale| <= 128).
            let term = _mm512_mullo_epi16(pairs, _mm512_set1_epi16(-32));
            store(terms.as_mut_ptr().add((sb * TERM_WORDS + i) * PANEL), term);
        }
        _mm512_storeu_ps(
            dx.as_mut_ptr().add(sb * PANEL),
            _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(Q6_D_AT).cast())),
        );
    }
}
