//! Q4_1: 32 weights per block, F16 scale and minimum, 4-bit unsigned values (`block_q4_1`).
//!
//! ```text
//! byte 0..2   d        f16 scale
//! byte 2..4   m        f16 minimum; weight = d * q + m
//! byte 4..20  qs[16]   low nibble of qs[j] = q[j], high nibble = q[j + 16]
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{make_qkx2_quants, weighted_blocks_32, QKX3_SEARCH};
use super::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// Values per Q4_1 block (ggml's `QK4_1`).
pub const QK4_1: usize = 32;

/// ggml's `block_q4_1`: 32 weights in 20 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_1 {
    /// Block scale (f16 bits).
    pub d: u16,
    /// Block minimum (f16 bits); weight = `d * q + m`.
    pub m: u16,
    /// 4-bit values: low nibble of `qs[j]` is `q[j]`, high nibble is `q[j + 16]`.
    pub qs: [u8; QK4_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// `quantize_row_q4_1_ref`: min/max affine quantization to 16 levels.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            let xi0 = ((x0 + 0.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 0.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// `quantize_row_q4_1_impl`: one row with its importance matrix `qw` (one weight per column):
/// each block fitted by `make_qkx3_quants` under the weights `qw * sqrt(sigma2 + x²)`.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ4_1]) {
    for ((xb, weight), yb) in weighted_blocks_32(x, qw).zip(y.iter_mut()) {
        let (mut levels, mut aux) = ([0u8; QK4_1], [0u8; QK4_1]);
        let (d, the_min) = make_qkx2_quants(15, xb, &weight, &mut levels, &mut aux, &QKX3_SEARCH);
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(-the_min);
        for j in 0..QK4_1 / 2 {
            yb.qs[j] = levels[j] | (levels[j + 16] << 4);
        }
    }
}

/// `dequantize_row_q4_1`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ4_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = f16_to_f32(xb.d);
        let m = f16_to_f32(xb.m);
        for j in 0..QK4_1 / 2 {
            yb[j] = (xb.qs[j] & 0x0f) as f32 * d + m;
            yb[j + QK4_1 / 2] = (xb.qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q4_1_q8_1_generic`: the minimum enters through the activation block's stored
/// scaled sum, `sumf += (d_x * d_y) * sumi + m_x * s_y`.
pub fn vec_dot_ref(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let (lo, hi) = yb.qs.split_at(QK4_1 / 2);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for ((&q, &y0), &y1) in xb.qs.iter().zip(lo).zip(hi) {
            sumi0 += (q & 0x0f) as i32 * y0 as i32;
            sumi1 += (q >> 4) as i32 * y1 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s);
    }
    sumf
}

/// Minimum and maximum as the reference quantizers scan them (starting from ±FLT_MAX).
pub(crate) fn min_max(xs: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xs {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ4_1 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.5);
        self.m = r.scale(mode.for_min(), 4.0);
    }

    fn stored_sum_factor(&self) -> f32 {
        f16_to_f32(self.m)
    }
}
