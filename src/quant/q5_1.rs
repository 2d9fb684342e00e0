//! Q5_1: 32 weights per block, F16 scale and minimum, 5-bit unsigned values (`block_q5_1`).
//!
//! ```text
//! byte 0..2   d        f16 scale
//! byte 2..4   m        f16 minimum; weight = d * q + m
//! byte 4..8   qh       bit j of the little-endian u32 = bit 4 of q[j]
//! byte 8..24  qs[16]   low nibble of qs[j] = q[j] & 15, high nibble = q[j + 16] & 15
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{make_qkx2_quants, weighted_blocks_32, QKX3_SEARCH};
use super::q4_1::min_max;
use super::q8_1::BlockQ8_1;
use bytemuck::{Pod, Zeroable};

/// Values per Q5_1 block (ggml's `QK5_1`).
pub const QK5_1: usize = 32;

/// ggml's `block_q5_1`: 32 weights in 24 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_1 {
    /// Block scale (f16 bits).
    pub d: u16,
    /// Block minimum (f16 bits); weight = `d * q + m`.
    pub m: u16,
    /// High bits: bit `j` of the little-endian u32 is bit 4 of `q[j]`.
    pub qh: [u8; 4],
    /// Low 4 bits: low nibble of `qs[j]` is `q[j] & 15`, high nibble is `q[j + 16] & 15`.
    pub qs: [u8; QK5_1 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// `quantize_row_q5_1_ref`: min/max affine quantization to 32 levels. Unlike Q4_1 the
/// reference does not clamp: it converts straight to `uint8_t`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK5_1 / 2 + j] - min) * id;
            let xi0 = (x0 + 0.5) as u8;
            let xi1 = (x1 + 0.5) as u8;
            yb.qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_1 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `quantize_row_q5_1_impl`: one row with its importance matrix `qw` (one weight per column):
/// each block fitted by `make_qkx3_quants` under the weights `qw * sqrt(sigma2 + x²)`.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ5_1]) {
    for ((xb, weight), yb) in weighted_blocks_32(x, qw).zip(y.iter_mut()) {
        let (mut levels, mut aux) = ([0u8; QK5_1], [0u8; QK5_1]);
        let (d, the_min) = make_qkx2_quants(31, xb, &weight, &mut levels, &mut aux, &QKX3_SEARCH);
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(-the_min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let (xi0, xi1) = (levels[j], levels[j + 16]);
            yb.qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_1 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `dequantize_row_q5_1`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ5_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = f16_to_f32(xb.d);
        let m = f16_to_f32(xb.m);
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_1 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = (xb.qs[j] & 0x0f) | xh_0;
            let x1 = (xb.qs[j] >> 4) | xh_1;
            yb[j] = x0 as f32 * d + m;
            yb[j + QK5_1 / 2] = x1 as f32 * d + m;
        }
    }
}

/// `ggml_vec_dot_q5_1_q8_1_generic`: `sumf += (d_x * d_y) * sumi + m_x * s_y` per block.
pub fn vec_dot_ref(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(xb.qh);
        let (lo, hi) = yb.qs.split_at(QK5_1 / 2);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for (j, ((&q, &y0), &y1)) in xb.qs.iter().zip(lo).zip(hi).enumerate() {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((q & 0x0f) as u32 | xh_0) as i32;
            let x1 = ((q >> 4) as u32 | xh_1) as i32;
            sumi0 += x0 * y0 as i32;
            sumi1 += x1 * y1 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s);
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ5_1 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.25);
        self.m = r.scale(mode.for_min(), 4.0);
    }

    fn stored_sum_factor(&self) -> f32 {
        f16_to_f32(self.m)
    }
}
