//! Q6_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with a signed 8-bit scale,
//! 6-bit values offset by 32 (`block_q6_K`).
//!
//! ```text
//! byte 0..128    ql[128]    low 4 bits: per 128-weight half h, ql[64h + l] holds weights
//!                           l (low nibble) and 64 + l (high); ql[64h + 32 + l] weights 32 + l, 96 + l
//! byte 128..192  qh[64]     high 2 bits: qh[32h + l] bits 0-1, 2-3, 4-5, 6-7 for weights
//!                           l, 32 + l, 64 + l, 96 + l of half h
//! byte 192..208  scales[16] int8 sub-block scales
//! byte 208..210  d          f16 super-scale; weight = d * scale_j * (q - 32)
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{make_qx_quants, nearest_int, scaled_dot_k, GROUP_MAX_EPS, QK_K};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q6_K`: QK_K weights in 210 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ6K {
    /// Low 4 bits of the values, two per byte.
    pub ql: [u8; QK_K / 2],
    /// High 2 bits of the values, four per byte.
    pub qh: [u8; QK_K / 4],
    /// Signed 8-bit scales of the 16 sub-blocks of 16 weights.
    pub scales: [i8; QK_K / 16],
    /// Super-block scale (f16 bits); weight = `d * scales[j] * (q - 32)`.
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

/// `quantize_row_q6_K_ref`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ6K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_superblock(xb, None, yb);
    }
}

/// `quantize_row_q6_K_impl`: one row with its importance matrix `qw` (one weight per column),
/// which weighs each sub-block's fit as it is (no `sigma2` term, unlike the other k-quants).
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ6K]) {
    for ((xb, qw), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        quantize_superblock(xb, Some(qw), yb);
    }
}

/// One super-block, its sub-blocks fitted under the weights `qw` (or `x²`).
fn quantize_superblock(xb: &[f32], qw: Option<&[f32]>, yb: &mut BlockQ6K) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    for ib in 0..QK_K / 16 {
        let scale = make_qx_quants(
            32,
            &xb[16 * ib..16 * ib + 16],
            &mut levels[16 * ib..16 * ib + 16],
            qw.map(|qw| &qw[16 * ib..16 * ib + 16]),
        );
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        *yb = BlockQ6K::zeroed();
        return;
    }

    let iscale = -128.0 / max_scale;
    yb.d = f32_to_f16(1.0 / iscale);
    for (s, &scale) in yb.scales.iter_mut().zip(&scales) {
        *s = nearest_int(iscale * scale).min(127) as i8;
    }
    for j in 0..QK_K / 16 {
        let d = f16_to_f32(yb.d) * yb.scales[j] as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(xb[16 * j + ii] / d).clamp(-32, 31);
            levels[16 * j + ii] = (l + 32) as i8;
        }
    }

    for h in 0..QK_K / 128 {
        let lv = &levels[128 * h..128 * h + 128];
        let ql = &mut yb.ql[64 * h..64 * h + 64];
        for l in 0..32 {
            let q1 = lv[l] as u8 & 0x0f;
            let q2 = lv[l + 32] as u8 & 0x0f;
            let q3 = lv[l + 64] as u8 & 0x0f;
            let q4 = lv[l + 96] as u8 & 0x0f;
            ql[l] = q1 | (q3 << 4);
            ql[l + 32] = q2 | (q4 << 4);
        }
        let qh = &mut yb.qh[32 * h..32 * h + 32];
        for l in 0..32 {
            qh[l] = (lv[l] as u8 >> 4)
                | ((lv[l + 32] as u8 >> 4) << 2)
                | ((lv[l + 64] as u8 >> 4) << 4)
                | ((lv[l + 96] as u8 >> 4) << 6);
        }
    }
}

/// `dequantize_row_q6_K`: every super-block of `x` into QK_K f32 values of `y`:
/// `d * scale * (q - 32)`, the scale of each 16 values.
pub fn dequantize_row(x: &[BlockQ6K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ((q, out), &sc) in levels(xb).chunks_exact(16).zip(yb.chunks_exact_mut(16)).zip(&xb.scales) {
            for (o, &q) in out.iter_mut().zip(q) {
                *o = d * sc as f32 * (q as i8 - 32) as f32;
            }
        }
    }
}

/// The 256 stored levels (0..=63, the weight's level plus 32) of a super-block, in weight order.
pub fn levels(b: &BlockQ6K) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for ((a, ql), qh) in out
        .chunks_exact_mut(128)
        .zip(b.ql.chunks_exact(64))
        .zip(b.qh.chunks_exact(32))
    {
        let (ql0, ql1) = ql.split_at(32);
        for l in 0..32 {
            let h = qh[l];
            a[l] = (ql0[l] & 0x0f) | ((h & 3) << 4);
            a[l + 32] = (ql1[l] & 0x0f) | (((h >> 2) & 3) << 4);
            a[l + 64] = (ql0[l] >> 4) | (((h >> 4) & 3) << 4);
            a[l + 96] = (ql1[l] >> 4) | (((h >> 6) & 3) << 4);
        }
    }
    out
}

/// The dot product of Q6_K weights with Q8_K activations: per super-block, the exact integer
/// `sumi` of the scaled signed levels `q - 32` ([`scaled_dot_k`]), then `sumf += (d * d_y) *
/// sumi`.
pub fn vec_dot_ref(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let signed = levels(xb).map(|q| q as i8 - 32);
        let sumi = scaled_dot_k(&signed, &yb.qs, &xb.scales.map(|s| s as i32));
        sumf += (f16_to_f32(xb.d) * yb.d) * sumi as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ6K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
