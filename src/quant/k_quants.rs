//! Helpers shared by the K-quant reference quantizers and dot products (Q4_K, Q5_K, Q6_K, Q8_K).
//!
//! These reproduce ggml's `nearest_int`, `make_qx_quants` and `make_qkx2_quants` operation for
//! operation: llama-quantize's output depends on every rounding step, so the order of the float
//! operations here is part of the file format, not an implementation detail.

use super::fp16::f16_to_f32;
use super::q8_k::BlockQ8K;

/// Values per k-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// Round to nearest (ties to even) through the float-adding trick ggml uses. Valid for
/// |x| <= 4194303; outside that the result is garbage, as in ggml, but never a panic.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12582912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// `roundf`: to nearest, ties away from zero, for every f32 (NaN and infinities included).
/// Written without the libm call so that a loop of it vectorizes: `v - trunc(v)` is exact, so
/// the comparison with one half decides exactly as `roundf` does.
#[inline(always)]
pub fn round_half_away(v: f32) -> f32 {
    let t = v.trunc();
    if (v - t).abs() >= 0.5 {
        t + 1.0f32.copysign(v)
    } else {
        t
    }
}

/// The largest `|v|` of `x` (0 if none is larger; NaN ignored), as the references' sequential
/// `fold(0, max(a, |v|))` computes it, in 16 independent lanes that vectorize: the maximum of a
/// set does not depend on the order it is taken in (every `|v|` is non-negative, so no -0.0,
/// and `max` skips NaN either way).
#[inline(always)]
pub fn abs_max(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = l.max(v.abs());
        }
    }
    lanes.iter().chain(tail.iter()).fold(0.0f32, |a, v| a.max(v.abs()))
}

/// `make_qx_quants` with `rmse_type = 1`: each value weighted by `qw[i]` (an importance
/// matrix's), or by `x²` without one. Writes `L[i] = l + nmax` and returns the scale.
pub fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8], qw: Option<&[f32]>) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let quantize = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let weight = |i: usize, v: f32| qw.map_or(v * v, |qw| qw[i]);

    let mut iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (i, (l_out, &v)) in levels.iter_mut().zip(x).enumerate() {
        let l = quantize(iscale, v);
        *l_out = (l + nmax) as i8;
        let w = weight(i, v);
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &v) in x.iter().enumerate() {
            let l = quantize(iscale, v);
            let w = weight(i, v);
            sumlx += w * v * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (l_out, &v) in levels.iter_mut().zip(x) {
                *l_out = (quantize(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below it is all zeros.
pub const GROUP_MAX_EPS: f32 = 1e-15;

/// `make_qp_quants`: fits the non-negative `x ≈ scale * L` with `L` in `0..=nmax`, minimising
/// the error weighted by `qw` (the scales and minimums of the importance-weighted k-quants),
/// trying nine inverse scales and then five passes of moving single levels. Returns the scale.
pub fn make_qp_quants(nmax: i32, x: &[f32], levels: &mut [u8], qw: &[f32]) -> f32 {
    let max = x.iter().fold(0.0f32, |m, &v| if m > v { m } else { v });
    if max < GROUP_MAX_EPS {
        levels.iter_mut().for_each(|l| *l = 0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for (l, &v) in levels.iter_mut().zip(x) {
        // `L[i] = nearest_int(...)` into a uint8_t: wraps modulo 256, as here.
        *l = nearest_int(iscale * v) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for ((&v, &l), &w) in x.iter().zip(levels.iter()).zip(qw) {
        let diff = v - scale * l as f32;
        best_mse += w * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for (&v, &w) in x.iter().zip(qw) {
            let l = nearest_int(iscale_is * v).min(nmax);
            let diff = v - scale_is * l as f32;
            mse += w * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for ((l_out, &v), &w) in levels.iter_mut().zip(x).zip(qw) {
        let l = nearest_int(iscale * v).min(nmax);
        *l_out = l as u8;
        sumlx += w * v * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for ((l_i, &v), &w) in levels.iter_mut().zip(x).zip(qw) {
            let l = *l_i as f32;
            let mut slx = sumlx - w * v * l;
            let mut sl2 = suml2 - w * l * l;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(v * sl2 / slx).min(nmax);
                if new_l != *l_i as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l_i = new_l as u8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The importance weights of the k-quants and the 32-value types: `qw[i] * sqrt(sigma2 + x[i]²)`.
pub fn importance_weights(x: &[f32], qw: &[f32], sigma2: f32, out: &mut [f32]) {
    for ((o, &v), &q) in out.iter_mut().zip(x).zip(qw) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

/// The blocks of 32 of one row with their importance weights, as the 32-value types' weighted
/// quantizers (`quantize_row_q{4,5}_{0,1}_impl`) take them: `qw * sqrt(sigma2 + x²)` with
/// `sigma2` the mean square of the whole row.
pub fn weighted_blocks_32<'a>(x: &'a [f32], qw: &'a [f32]) -> impl Iterator<Item = (&'a [f32], [f32; 32])> {
    let sigma2 = sum_squares(x) / x.len() as f32;
    x.chunks_exact(32).zip(qw.chunks_exact(32)).map(move |(xb, qw)| {
        let mut weight = [0f32; 32];
        importance_weights(xb, qw, sigma2, &mut weight);
        (xb, weight)
    })
}

/// The sum of `x²`, in order.
pub fn sum_squares(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |s, &v| s + v * v)
}

/// The search ggml's `make_qkx3_quants` makes (the importance-weighted quantizers'): 37 inverse
/// scales from `nmax - 0.9` in steps of 0.05. Its arithmetic is `make_qkx2_quants`' given the
/// same weights.
pub const QKX3_SEARCH: Qkx2Search = Qkx2Search {
    rmin: -0.9,
    rdelta: 0.05,
    nstep: 36,
    use_mad: false,
};

/// Search parameters of [`make_qkx2_quants`]: candidate inverse scales are
/// `(rmin + rdelta * is + nmax) / (max - min)` for `is` in `0..=nstep`.
pub struct Qkx2Search {
    /// Offset of the first candidate, in levels (ggml passes -1 for Q4_K and -0.5 for Q5_K).
    pub rmin: f32,
    /// Step between candidates, in levels (ggml passes 0.1).
    pub rdelta: f32,
    /// Number of steps after the first (ggml passes 20 for Q4_K and 15 for Q5_K); below 1, no search.
    pub nstep: i32,
    /// Minimise the weighted absolute error instead of the squared one (ggml's `use_mad`, which
    /// Q2_K sets).
    pub use_mad: bool,
}

/// `make_qkx2_quants`: fits `x ≈ scale * L + min` with `L` in `0..=nmax` and `min <= 0`,
/// minimising the weighted squared error (or absolute error, `use_mad`). Returns the scale and
/// `-min` (the positive offset the K-quant blocks store).
pub fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    levels_aux: &mut [u8],
    search: &Qkx2Search,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels[..n].iter_mut().for_each(|l| *l = 0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * error(diff, search.use_mad);
    }
    if search.nstep < 1 {
        return (scale, -min);
    }
    for is in 0..=search.nstep {
        iscale = (search.rmin + search.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            levels_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * levels_aux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * error(diff, search.use_mad);
            }
            if cur_error < best_error {
                levels[..n].copy_from_slice(&levels_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The error of one value in [`make_qkx2_quants`]: `|diff|` or `diff²`.
#[inline]
fn error(diff: f32, use_mad: bool) -> f32 {
    if use_mad {
        diff.abs()
    } else {
        diff * diff
    }
}

/// Unpack the 6-bit scale and min of sub-block `j` from the 12-byte `scales` field of Q4_K
/// and Q5_K (`get_scale_min_k4`).
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, min) pairs of a Q4_K/Q5_K `scales` field at once, with ggml's `utmp`
/// shuffle: a handful of 32-bit operations instead of sixteen [`get_scale_min_k4`] calls (the
/// dot products do this once per super-block).
#[inline]
pub fn unpack_scales_mins_k4(q: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (word(0), word(1), word(2));
    let scales = (u0 & KMASK1) as u64 | (((u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4)) as u64) << 32;
    let mins = (u1 & KMASK1) as u64 | ((((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4)) as u64) << 32;
    (scales.to_le_bytes(), mins.to_le_bytes())
}

/// The integer core shared by the K-quant dot products: `Σ_j scale_j * Σ a[i] * q8[i]` over the
/// sub-blocks `j` of a super-block, exact in i32 (at most 256 * 128 * 32 * 127 in magnitude).
///
/// The references then take one float step per super-block with this integer. ggml's generic C
/// keeps eight integer lanes by `i % 8` and eight float lanes instead; one integer per
/// super-block rounds less, and it is what lets the SIMD kernels sum four byte products at a
/// time (`vpdpbusd`) and scale a whole sub-block at once, which the lane split forbids.
///
/// `a` holds the unpacked weight levels; `scales` has one entry per `256 / scales.len()`
/// consecutive values (8 sub-blocks of 32 for Q4_K/Q5_K, 16 of 16 for Q6_K).
#[inline]
pub fn scaled_dot_k(a: &[i8; QK_K], q8: &[i8; QK_K], scales: &[i32]) -> i32 {
    let group = QK_K / scales.len();
    a.chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .zip(scales)
        .map(|((ag, qg), &scale)| scale * ag.iter().zip(qg).map(|(&a, &q)| a as i32 * q as i32).sum::<i32>())
        .sum()
}

/// `Σ_j bsums[j] * mins[j / 2]`: what the sub-block minimums of Q4_K and Q5_K take from a
/// super-block's dot product, before `dmin`.
#[inline]
pub fn mins_dot_k(bsums: &[i16; QK_K / 16], mins: &[u8; 8]) -> i32 {
    bsums
        .iter()
        .enumerate()
        .map(|(j, &b)| b as i32 * mins[j / 2] as i32)
        .sum()
}

/// `sumf` after one Q4_K or Q5_K super-block (its `levels`, packed `scales`, `d` and `dmin`)
/// against the Q8_K block `y`, as both references take it: the exact integers of the scaled
/// levels ([`scaled_dot_k`]) and of the minimums ([`mins_dot_k`]), then
/// `sumf += (d * d_y) * sumi` and `sumf -= (dmin * d_y) * summ`, in that order.
#[inline]
pub fn add_scale_min_superblock(
    sumf: f32,
    levels: &[u8; QK_K],
    scales: &[u8; 12],
    d: u16,
    dmin: u16,
    y: &BlockQ8K,
) -> f32 {
    let (scales, mins) = unpack_scales_mins_k4(scales);
    let sumi = scaled_dot_k(bytemuck::cast_ref(levels), &y.qs, &scales.map(|s| s as i32));
    let summ = mins_dot_k(&y.bsums, &mins);
    let sumf = sumf + (f16_to_f32(d) * y.d) * sumi as f32;
    sumf - (f16_to_f32(dmin) * y.d) * summ as f32
}

/// The values of one Q4_K or Q5_K super-block (its `levels`, packed `scales`, `d` and `dmin`):
/// `d * scale_j * q - dmin * min_j`, as `dequantize_row_q{4,5}_K` computes them.
pub fn dequantize_scale_min_superblock(levels: &[u8; QK_K], scales: &[u8; 12], d: u16, dmin: u16, out: &mut [f32]) {
    let (d, min) = (f16_to_f32(d), f16_to_f32(dmin));
    let (scales, mins) = unpack_scales_mins_k4(scales);
    for (j, (q, out)) in levels.chunks_exact(32).zip(out.chunks_exact_mut(32)).enumerate() {
        let (dj, mj) = (d * scales[j] as f32, min * mins[j] as f32);
        for (o, &q) in out.iter_mut().zip(q) {
            *o = dj * q as f32 - mj;
        }
    }
}

/// Pack eight 6-bit (scale, min) pairs into the 12-byte layout [`get_scale_min_k4`] reads.
pub fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            q[j] = ls[j];
            q[j + 4] = lm[j];
        } else {
            q[j + 4] = (ls[j] & 0x0f) | ((lm[j] & 0x0f) << 4);
            q[j - 4] |= (ls[j] >> 4) << 6;
            q[j] |= (lm[j] >> 4) << 6;
        }
    }
    q
}

/// The per-sub-block (scale, min) search of Q4_K and Q5_K's reference quantizers, then the
/// 6-bit quantization of those scales and mins. Returns `(d, dmin, scales, levels)` where the
/// levels are requantized against the stored (rounded) scales, as ggml does.
pub fn quantize_scale_min_superblock(x: &[f32], nmax: i32, search: &Qkx2Search) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    use super::fp16::f32_to_f16;
    let mut levels = [0u8; QK_K];
    let mut levels_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0.0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (scale, min) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            &mut levels_aux,
            search,
        );
        scales[j] = scale;
        mins[j] = min;
        if scale > max_scale {
            max_scale = scale;
        }
        if min > max_min {
            max_min = min;
        }
    }

    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        // `uint8_t ls = nearest_int(...)` wraps modulo 256 before the clamp, as here.
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    requantize_scale_min(x, nmax, d, dmin, &packed, &mut levels);
    (d, dmin, packed, levels)
}

/// The levels of a Q4_K / Q5_K super-block against its stored scales, mins and f16 `d`, `dmin`.
fn requantize_scale_min(x: &[f32], nmax: i32, d: u16, dmin: u16, packed: &[u8; 12], levels: &mut [u8; QK_K]) {
    use super::fp16::f16_to_f32;
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, packed);
        let d = f16_to_f32(d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for ii in 0..32 {
            let l = nearest_int((x[32 * j + ii] + dm) / d);
            levels[32 * j + ii] = l.clamp(0, nmax) as u8;
        }
    }
}

/// `quantize_row_q{4,5}_K_impl`'s super-block with its importance matrix `qw`: each sub-block
/// fitted by `make_qkx3_quants` under the weights `qw * sqrt(sigma2 + x²)`, the scales and mins
/// by `make_qp_quants` under their sub-blocks' total weights. Returns what
/// [`quantize_scale_min_superblock`] does.
pub fn quantize_scale_min_superblock_imatrix(
    x: &[f32],
    qw: &[f32],
    nmax: i32,
    clamp_63: bool,
) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    use super::fp16::f32_to_f16;
    let mut levels = [0u8; QK_K];
    let mut levels_aux = [0u8; 32];
    let (mut scales, mut mins, mut sw) = ([0f32; QK_K / 32], [0f32; QK_K / 32], [0f32; QK_K / 32]);
    let sigma2 = 2.0 * sum_squares(x) / QK_K as f32;
    for j in 0..QK_K / 32 {
        let (xs, ws) = (&x[32 * j..32 * j + 32], &qw[32 * j..32 * j + 32]);
        let mut weights = [0f32; 32];
        importance_weights(xs, ws, sigma2, &mut weights);
        sw[j] = weights.iter().fold(0.0f32, |s, &w| s + w);
        (scales[j], mins[j]) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut levels[32 * j..32 * j + 32],
            &mut levels_aux,
            &QKX3_SEARCH,
        );
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if clamp_63 {
        // Q5_K's `MIN(63, ls)`: a negative level stored as a byte (a negative scale) becomes 63.
        ls.iter_mut().chain(lm.iter_mut()).for_each(|l| *l = (*l).min(63));
    }
    let packed = pack_scale_min_k4(&ls, &lm);
    let (d, dmin) = (f32_to_f16(d_block), f32_to_f16(m_block));
    requantize_scale_min(x, nmax, d, dmin, &packed, &mut levels);
    (d, dmin, packed, levels)
}

#[cfg(test)]
mod round_tests {
    use super::{abs_max, get_scale_min_k4, round_half_away, unpack_scales_mins_k4};

    #[test]
    fn the_word_wise_scale_unpacking_agrees_with_the_per_sub_block_one() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut q = [0u8; 12];
            for b in q.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *b = state as u8;
            }
            let (scales, mins) = unpack_scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!((scales[j], mins[j]), get_scale_min_k4(j, &q), "{q:?} j={j}");
            }
        }
    }

    #[test]
    fn abs_max_is_the_sequential_fold_for_any_values() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in [0, 1, 15, 16, 17, 32, 256] {
            for case in 0..200 {
                let x: Vec<f32> = (0..len)
                    .map(|_| match (next() % 11, case % 3) {
                        (0, _) => f32::NAN,
                        (1, _) => -0.0,
                        (2, _) => f32::NEG_INFINITY,
                        (_, 0) => f32::from_bits(next() as u32),
                        _ => ((next() >> 40) as f32 / 65536.0 - 128.0).round(),
                    })
                    .collect();
                let sequential = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                assert_eq!(abs_max(&x).to_bits(), sequential.to_bits(), "{x:?}");
            }
        }
    }

    #[test]
    fn round_half_away_is_roundf_for_every_kind_of_value() {
        let mut values = vec![
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.5,
            -1.5,
            2.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            126.5,
            -127.5,
            8_388_607.5,
            -8_388_607.5,
            8_388_608.0,
            16_777_217.0,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-45,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            values.push(f32::from_bits(state as u32));
            values.push((state >> 40) as f32 / 65536.0 - 128.0);
        }
        for v in values {
            let (got, want) = (round_half_away(v), v.round());
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{v}: {got} vs {want}"
            );
        }
    }
}
