//! Q5_0: 32 weights per block, one F16 scale, 5-bit values offset by 16 (`block_q5_0`).
//!
//! ```text
//! byte 0..2   d        f16 scale; weight = d * (q - 16)
//! byte 2..6   qh       bit j of the little-endian u32 = bit 4 of q[j]
//! byte 6..22  qs[16]   low nibble of qs[j] = q[j] & 15, high nibble = q[j + 16] & 15
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{make_qx_quants, weighted_blocks_32};
use super::q4_0::signed_absmax;
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Values per Q5_0 block (ggml's `QK5_0`).
pub const QK5_0: usize = 32;

/// ggml's `block_q5_0`: 32 weights in 22 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ5_0 {
    /// Block scale (f16 bits); weight = `d * (q - 16)`.
    pub d: u16,
    /// High bits: bit `j` of the little-endian u32 is bit 4 of `q[j]`.
    pub qh: [u8; 4],
    /// Low 4 bits: low nibble of `qs[j]` is `q[j] & 15`, high nibble is `q[j + 16] & 15`.
    pub qs: [u8; QK5_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// `quantize_row_q5_0_ref`: the scale maps the value of largest magnitude to -16.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let (_, max) = signed_absmax(xb);
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK5_0 / 2 + j] * id;
            let xi0 = ((x0 + 16.5) as i8).min(31) as u8;
            let xi1 = ((x1 + 16.5) as i8).min(31) as u8;
            yb.qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_0 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `quantize_row_q5_0_impl`: one row with its importance matrix `qw` (one weight per column):
/// each block's levels by `make_qx_quants` under the weights `qw * sqrt(sigma2 + x²)`.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ5_0]) {
    for ((xb, weight), yb) in weighted_blocks_32(x, qw).zip(y.iter_mut()) {
        let mut levels = [0i8; QK5_0];
        yb.d = f32_to_f16(make_qx_quants(16, xb, &mut levels, Some(&weight)));
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let (xi0, xi1) = (levels[j] as u8, levels[j + 16] as u8);
            yb.qs[j] = (xi0 & 0x0f) | ((xi1 & 0x0f) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_0 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `dequantize_row_q5_0`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ5_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = f16_to_f32(xb.d);
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_0 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0f) | xh_0) as i32 - 16;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32 - 16;
            yb[j] = x0 as f32 * d;
            yb[j + QK5_0 / 2] = x1 as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q5_0_q8_0_generic`: `sumf += (d_x * d_y) * sumi` per block.
pub fn vec_dot_ref(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(xb.qh);
        let (lo, hi) = yb.qs.split_at(QK5_0 / 2);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for (j, ((&q, &y0), &y1)) in xb.qs.iter().zip(lo).zip(hi).enumerate() {
            let xh_0 = ((qh >> j) << 4) & 0x10;
            let xh_1 = (qh >> (j + 12)) & 0x10;
            let x0 = ((q & 0x0f) as u32 | xh_0) as i32 - 16;
            let x1 = ((q >> 4) as u32 | xh_1) as i32 - 16;
            sumi0 += x0 * y0 as i32;
            sumi1 += x1 * y1 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ5_0 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.25);
    }
}
