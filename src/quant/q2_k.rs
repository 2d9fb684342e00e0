//! Q2_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with a 4-bit scale and a
//! 4-bit min; 2-bit values packed four to a byte (`block_q2_K`).
//!
//! ```text
//! byte 0..16     scales[16] sub-block j: scale in the low nibble, min in the high one
//! byte 16..80    qs[64]     per 128-weight half h, qs[32h + l] bits 2s..2s+1 hold weight
//!                           128h + 32s + l
//! byte 80..82    d          f16 scale of the scales
//! byte 82..84    dmin       f16 scale of the mins; weight = d * scale_j * q - dmin * min_j
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{
    importance_weights, make_qkx2_quants, make_qp_quants, nearest_int, scaled_dot_k, sum_squares, Qkx2Search,
    QKX3_SEARCH, QK_K,
};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q2_K`: QK_K weights in 84 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ2K {
    /// Per sub-block of 16: the scale (low nibble) and the min (high nibble).
    pub scales: [u8; QK_K / 16],
    /// The 2-bit values, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Scale of the scales (f16 bits).
    pub d: u16,
    /// Scale of the mins (f16 bits).
    pub dmin: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// The 256 levels (0..=3) of a super-block, in weight order.
pub fn levels(b: &BlockQ2K) -> [u8; QK_K] {
    unpack_2bit(&b.qs)
}

/// 2-bit values packed four to a byte as Q2_K and Q3_K pack them: per 128-value half h,
/// bits 2s..2s+1 of `qs[32h + l]` hold value 128h + 32s + l.
pub fn unpack_2bit(qs: &[u8; QK_K / 4]) -> [u8; QK_K] {
    std::array::from_fn(|i| {
        let (h, rest) = (i / 128, i % 128);
        let (s, l) = (rest / 32, rest % 32);
        (qs[32 * h + l] >> (2 * s)) & 3
    })
}

/// `quantize_row_q2_K_ref`: each sub-block fitted by `make_qkx2_quants` (3 levels above the
/// min, weights `|x|`, absolute error, 16 candidate scales), the scales and mins quantized to
/// 4 bits against their maxima.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ2K]) {
    const Q4SCALE: f32 = 15.0;
    let search = Qkx2Search {
        rmin: -0.5,
        rdelta: 0.1,
        nstep: 15,
        use_mad: true,
    };
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut levels = [0u8; QK_K];
        let mut aux = [0u8; 16];
        let mut scales = [0f32; QK_K / 16];
        let mut mins = [0f32; QK_K / 16];
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for j in 0..QK_K / 16 {
            let xs = &xb[16 * j..16 * j + 16];
            let weights: [f32; 16] = std::array::from_fn(|l| xs[l].abs());
            (scales[j], mins[j]) =
                make_qkx2_quants(3, xs, &weights, &mut levels[16 * j..16 * j + 16], &mut aux, &search);
            // ggml's `if (v > max) max = v` from 0 (NaN never wins).
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &scale) in yb.scales.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * scale) as u8;
            }
            yb.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            yb.scales = [0; QK_K / 16];
            yb.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &min) in yb.scales.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * min) << 4) as u8;
            }
            yb.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            yb.dmin = f32_to_f16(0.0);
        }
        requantize_and_pack(xb, &mut levels, yb);
    }
}

/// The levels of a super-block whose scales are stored, requantized against them (after their
/// f16 rounding), and packed.
fn requantize_and_pack(xb: &[f32], levels: &mut [u8; QK_K], yb: &mut BlockQ2K) {
    for j in 0..QK_K / 16 {
        let d = f16_to_f32(yb.d) * (yb.scales[j] & 0x0f) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(yb.dmin) * (yb.scales[j] >> 4) as f32;
        for ii in 0..16 {
            levels[16 * j + ii] = nearest_int((xb[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    for h in 0..QK_K / 128 {
        let lv = &levels[128 * h..];
        for l in 0..32 {
            yb.qs[32 * h + l] = lv[l] | (lv[l + 32] << 2) | (lv[l + 64] << 4) | (lv[l + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_impl`: one row with its importance matrix `qw` (one weight per column):
/// each sub-block fitted by `make_qkx3_quants` under the weights `qw * sqrt(sigma2 + x²)`, the
/// scales and mins by `make_qp_quants` under their sub-blocks' total weights.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ2K]) {
    for ((xb, qw), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        let mut levels = [0u8; QK_K];
        let mut aux = [0u8; 16];
        let (mut scales, mut mins, mut sw) = ([0f32; QK_K / 16], [0f32; QK_K / 16], [0f32; QK_K / 16]);
        let sigma2 = sum_squares(xb) / QK_K as f32;
        for j in 0..QK_K / 16 {
            let (xs, ws) = (&xb[16 * j..16 * j + 16], &qw[16 * j..16 * j + 16]);
            let mut weight = [0f32; 16];
            importance_weights(xs, ws, sigma2, &mut weight);
            sw[j] = weight.iter().fold(0.0f32, |s, &w| s + w);
            (scales[j], mins[j]) =
                make_qkx2_quants(3, xs, &weight, &mut levels[16 * j..16 * j + 16], &mut aux, &QKX3_SEARCH);
        }
        let (mut ls, mut lm) = ([0u8; QK_K / 16], [0u8; QK_K / 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        yb.d = f32_to_f16(dm);
        yb.dmin = f32_to_f16(mm);
        for (s, (&l, &m)) in yb.scales.iter_mut().zip(ls.iter().zip(&lm)) {
            *s = l | (m << 4);
        }
        requantize_and_pack(xb, &mut levels, yb);
    }
}

/// `dequantize_row_q2_K`: `d * scale_j * q - dmin * min_j` for every weight, as
/// `(d * scale) * q - (dmin * min)`.
pub fn dequantize_row(x: &[BlockQ2K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (f16_to_f32(xb.d), f16_to_f32(xb.dmin));
        let levels = levels(xb);
        for ((q, out), &sc) in levels.chunks_exact(16).zip(yb.chunks_exact_mut(16)).zip(&xb.scales) {
            let (dl, ml) = (d * (sc & 0x0f) as f32, min * (sc >> 4) as f32);
            for (o, &q) in out.iter_mut().zip(q) {
                *o = dl * q as f32 - ml;
            }
        }
    }
}

/// The dot product of Q2_K weights with Q8_K activations: per super-block, the exact integers
/// of the scaled levels ([`scaled_dot_k`]) and of the mins against the activation sums, then
/// `sumf += (d * d_y) * sumi` and `sumf -= (dmin * d_y) * summ`, as the other k-quants take it.
pub fn vec_dot_ref(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let levels = levels(xb).map(|q| q as i8);
        let sumi = scaled_dot_k(&levels, &yb.qs, &xb.scales.map(|s| (s & 0x0f) as i32));
        let summ: i32 = yb
            .bsums
            .iter()
            .zip(&xb.scales)
            .map(|(&b, &s)| b as i32 * (s >> 4) as i32)
            .sum();
        sumf += (f16_to_f32(xb.d) * yb.d) * sumi as f32;
        sumf -= (f16_to_f32(xb.dmin) * yb.d) * summ as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ2K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.02);
        self.dmin = r.scale(mode.for_min(), 0.02);
    }
}
