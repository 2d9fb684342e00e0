//! The K-quant dot products (Q4_K, Q5_K, Q6_K against Q8_K) of one weight row with `N`
//! activation rows. The references take one exact integer per super-block (`scaled_dot_k`: each
//! sub-block's level-times-activation sum times its scale); here each sub-block's sum is taken in
//! NEON lanes and scaled in a scalar register, the same integers in another order. The float
//! steps per super-block are then the reference's, in its order.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::k_quants::{mins_dot_k, unpack_scales_mins_k4};
use crate::quant::q4_k::BlockQ4K;
use crate::quant::q5_k::BlockQ5K;
use crate::quant::q6_k::BlockQ6K;
use crate::quant::q8_k::BlockQ8K;

/// A super-block's 256 levels as signed bytes, in element order.
type Levels = [int8x16_t; 16];

/// `Σ_j scales[j] * (levels · q8 over the j-th group)`, the groups being the super-block's
/// 256 values cut into `G` equal runs (8 of 32 for Q4_K and Q5_K, 16 of 16 for Q6_K).
#[inline(always)]
unsafe fn scaled_sum<const SDOT: bool, const G: usize>(levels: &Levels, scales: [i32; G], y: &BlockQ8K) -> i32 {
    let per_group = 16 / G;
    let mut sumi = 0i32;
    for (g, &scale) in scales.iter().enumerate() {
        let mut acc = vdupq_n_s32(0);
        for k in 0..per_group {
            let v = g * per_group + k;
            acc = dot16::<SDOT>(acc, levels[v], load16(&y.qs, 16 * v));
        }
        sumi = sumi.wrapping_add(scale.wrapping_mul(vaddvq_s32(acc)));
    }
    sumi
}

/// The dot product of super-blocks with packed scales and minimums (Q4_K, Q5_K) against each
/// row: `sumf += (d * d_y) * sumi`, then `sumf -= (dmin * d_y) * summ`, as
/// `k_quants::add_scale_min_superblock` does.
#[inline(always)]
unsafe fn scale_min_rows<const SDOT: bool, const N: usize, B>(
    x: &[B],
    ys: [&[BlockQ8K]; N],
    head: impl Fn(&B) -> (&[u8; 12], u16, u16),
    levels: impl Fn(&B) -> Levels,
) -> [f32; N] {
    let mut sums = [0.0f32; N];
    for (i, xb) in x.iter().enumerate() {
        let (packed, d, dmin) = head(xb);
        let (scales, mins) = unpack_scales_mins_k4(packed);
        let scales = scales.map(i32::from);
        let levels = levels(xb);
        for (sumf, y) in sums.iter_mut().zip(&ys) {
            let yb = &y[i];
            let sumi = scaled_sum::<SDOT, 8>(&levels, scales, yb);
            let summ = mins_dot_k(&yb.bsums, &mins);
            *sumf += (f16_to_f32(d) * yb.d) * sumi as f32;
            *sumf -= (f16_to_f32(dmin) * yb.d) * summ as f32;
        }
    }
    sums
}

/// Q4_K levels: in each 32-byte chunk `c`, the low nibbles are values `64c..64c + 32` and the
/// high nibbles the next 32.
#[inline(always)]
unsafe fn q4_k_levels(b: &BlockQ4K) -> Levels {
    let mut out = [vdupq_n_s8(0); 16];
    let m4 = vdupq_n_u8(0x0f);
    for c in 0..4 {
        for h in 0..2 {
            let q = load16u(&b.qs, 32 * c + 16 * h);
            out[4 * c + h] = vreinterpretq_s8_u8(vandq_u8(q, m4));
            out[4 * c + 2 + h] = vreinterpretq_s8_u8(vshrq_n_u8::<4>(q));
        }
    }
    out
}

/// Q5_K levels: Q4_K's nibbles, each with its fifth bit from `qh` (bit `2c` of `qh[l]` for the
/// low nibbles of chunk `c`, bit `2c + 1` for the high ones).
#[inline(always)]
unsafe fn q5_k_levels(b: &BlockQ5K) -> Levels {
    let mut out = [vdupq_n_s8(0); 16];
    let m4 = vdupq_n_u8(0x0f);
    let bit5 = vdupq_n_u8(0x10);
    let qh = [load16u(&b.qh, 0), load16u(&b.qh, 16)];
    for c in 0..4 {
        let (lo_bit, hi_bit) = (vdupq_n_u8(1 << (2 * c)), vdupq_n_u8(2 << (2 * c)));
        for h in 0..2 {
            let q = load16u(&b.qs, 32 * c + 16 * h);
            let lo = vorrq_u8(vandq_u8(q, m4), vandq_u8(vtstq_u8(qh[h], lo_bit), bit5));
            let hi = vorrq_u8(vshrq_n_u8::<4>(q), vandq_u8(vtstq_u8(qh[h], hi_bit), bit5));
            out[4 * c + h] = vreinterpretq_s8_u8(lo);
            out[4 * c + 2 + h] = vreinterpretq_s8_u8(hi);
        }
    }
    out
}

/// Q6_K levels less 32: per half of 128 values, `ql` (64 bytes) holds the low four bits and
/// `qh` (32 bytes) two high bits for each of the four runs of 32.
#[inline(always)]
unsafe fn q6_k_levels(b: &BlockQ6K) -> Levels {
    let mut out = [vdupq_n_s8(0); 16];
    let (m4, m3, thirty_two) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x03), vdupq_n_s8(32));
    for half in 0..2 {
        for h in 0..2 {
            let ql0 = load16u(&b.ql, 64 * half + 16 * h);
            let ql1 = load16u(&b.ql, 64 * half + 32 + 16 * h);
            let qh = load16u(&b.qh, 32 * half + 16 * h);
            let high = |shift: i8| vshlq_n_u8::<4>(vandq_u8(vshlq_u8(qh, vdupq_n_s8(-shift)), m3));
            let runs = [
                vorrq_u8(vandq_u8(ql0, m4), high(0)),
                vorrq_u8(vandq_u8(ql1, m4), high(2)),
                vorrq_u8(vshrq_n_u8::<4>(ql0), high(4)),
                vorrq_u8(vshrq_n_u8::<4>(ql1), high(6)),
            ];
            for (r, run) in runs.into_iter().enumerate() {
                out[8 * half + 2 * r + h] = vsubq_s8(vreinterpretq_s8_u8(run), thirty_two);
            }
        }
    }
    out
}

#[inline(always)]
unsafe fn q4_k<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ4K, BlockQ8K, N>(x, ys);
    scale_min_rows::<SDOT, N, _>(x, ys, |b| (&b.scales, b.d, b.dmin), |b| q4_k_levels(b))
}

#[inline(always)]
unsafe fn q5_k<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ5K, BlockQ8K, N>(x, ys);
    scale_min_rows::<SDOT, N, _>(x, ys, |b| (&b.scales, b.d, b.dmin), |b| q5_k_levels(b))
}

#[inline(always)]
unsafe fn q6_k<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<BlockQ6K, BlockQ8K, N>(x, ys);
    let mut sums = [0.0f32; N];
    for (i, xb) in x.iter().enumerate() {
        let levels = q6_k_levels(xb);
        let scales = xb.scales.map(i32::from);
        for (sumf, y) in sums.iter_mut().zip(&ys) {
            let yb = &y[i];
            let sumi = scaled_sum::<SDOT, 16>(&levels, scales, yb);
            *sumf += (f16_to_f32(xb.d) * yb.d) * sumi as f32;
        }
    }
    sums
}

sdot_entry!(
    /// `q4_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q4_k,
    q4_k
);
sdot_entry!(
    /// `q5_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q5_k,
    q5_k
);
sdot_entry!(
    /// `q6_k::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q6_k,
    q6_k
);

/// The two-by-two forms on SMMLA: two weight rows with two activation rows, `[row][token]`.
pub(in crate::quant) mod i8mm {
    use super::super::{block_rows_2x2, mmla16, mmla_entry};
    use super::*;

    /// [`scaled_sum`] of each weight row's levels and scales with each activation row, in lane
    /// `2 * row + token`: each group's four sums from SMMLA, scaled by its row's scale.
    ///
    /// # Safety
    /// Only inside a function compiled with `i8mm`, on a CPU that has it.
    #[inline(always)]
    unsafe fn scaled_sums<const G: usize>(levels: [&Levels; 2], scales: [[i32; G]; 2], ys: [&BlockQ8K; 2]) -> [i32; 4] {
        let per_group = 16 / G;
        let mut total = vdupq_n_s32(0);
        for g in 0..G {
            let mut acc = vdupq_n_s32(0);
            for k in 0..per_group {
                let v = g * per_group + k;
                let acts = [load16(&ys[0].qs, 16 * v), load16(&ys[1].qs, 16 * v)];
                acc = mmla16(acc, [levels[0][v], levels[1][v]], acts);
            }
            // Wrapping, as the one-row form's scalar steps: the same integers mod 2^32.
            let scale = [scales[0][g], scales[0][g], scales[1][g], scales[1][g]];
            total = vaddq_s32(total, vmulq_s32(acc, vld1q_s32(scale.as_ptr())));
        }
        let mut out = [0i32; 4];
        vst1q_s32(out.as_mut_ptr(), total);
        out
    }

    /// `scale_min_rows` for two weight rows and two activation rows.
    #[inline(always)]
    unsafe fn scale_min_2x2<B: bytemuck::Pod>(
        xs: [&[u8]; 2],
        ys: [&[u8]; 2],
        head: impl Fn(&B) -> (&[u8; 12], u16, u16),
        levels: impl Fn(&B) -> Levels,
    ) -> [[f32; 2]; 2] {
        let (xs, ys) = block_rows_2x2::<B, BlockQ8K>(xs, ys);
        let mut sums = [[0.0f32; 2]; 2];
        for i in 0..xs[0].len() {
            let heads = [head(&xs[0][i]), head(&xs[1][i])];
            let unpacked = heads.map(|(packed, _, _)| unpack_scales_mins_k4(packed));
            let lv = [levels(&xs[0][i]), levels(&xs[1][i])];
            let sumi = scaled_sums::<8>(
                [&lv[0], &lv[1]],
                unpacked.map(|(s, _)| s.map(i32::from)),
                [&ys[0][i], &ys[1][i]],
            );
            for (r, row) in sums.iter_mut().enumerate() {
                let (_, d, dmin) = heads[r];
                for (t, sumf) in row.iter_mut().enumerate() {
                    let yb = &ys[t][i];
                    let summ = mins_dot_k(&yb.bsums, &unpacked[r].1);
                    *sumf += (f16_to_f32(d) * yb.d) * sumi[2 * r + t] as f32;
                    *sumf -= (f16_to_f32(dmin) * yb.d) * summ as f32;
                }
            }
        }
        sums
    }

    #[inline(always)]
    unsafe fn q4_k(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        scale_min_2x2::<BlockQ4K>(xs, ys, |b| (&b.scales, b.d, b.dmin), |b| q4_k_levels(b))
    }

    #[inline(always)]
    unsafe fn q5_k(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        scale_min_2x2::<BlockQ5K>(xs, ys, |b| (&b.scales, b.d, b.dmin), |b| q5_k_levels(b))
    }

    #[inline(always)]
    unsafe fn q6_k(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        let (xs, ys) = block_rows_2x2::<BlockQ6K, BlockQ8K>(xs, ys);
        let mut sums = [[0.0f32; 2]; 2];
        for i in 0..xs[0].len() {
            let (x0, x1) = (&xs[0][i], &xs[1][i]);
            let lv = [q6_k_levels(x0), q6_k_levels(x1)];
            let scales = [x0.scales.map(i32::from), x1.scales.map(i32::from)];
            let sumi = scaled_sums::<16>([&lv[0], &lv[1]], scales, [&ys[0][i], &ys[1][i]]);
            for (r, row) in sums.iter_mut().enumerate() {
                let d = [x0.d, x1.d][r];
                for (t, sumf) in row.iter_mut().enumerate() {
                    *sumf += (f16_to_f32(d) * ys[t][i].d) * sumi[2 * r + t] as f32;
                }
            }
        }
        sums
    }

    mmla_entry!(
        /// `q4_k::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q4_k,
        q4_k
    );
    mmla_entry!(
        /// `q5_k::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q5_k,
        q5_k
    );
    mmla_entry!(
        /// `q6_k::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q6_k,
        q6_k
    );
}
