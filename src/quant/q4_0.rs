//! Q4_0: 32 weights per block, one F16 scale, 4-bit values offset by 8 (ggml `block_q4_0`).
//!
//! ```text
//! byte 0..2   d        f16 scale; weight = d * (q - 8)
//! byte 2..18  qs[16]   low nibble of qs[j] = q[j], high nibble = q[j + 16]
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{make_qx_quants, weighted_blocks_32};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Values per Q4_0 block (ggml's `QK4_0`).
pub const QK4_0: usize = 32;

/// ggml's `block_q4_0`: 32 weights in 18 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ4_0 {
    /// Block scale (f16 bits); weight = `d * (q - 8)`.
    pub d: u16,
    /// 4-bit values: low nibble of `qs[j]` is `q[j]`, high nibble is `q[j + 16]`.
    pub qs: [u8; QK4_0 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// `quantize_row_q4_0_ref`: the scale maps the value of largest magnitude to -8.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let (_, max) = signed_absmax(xb);
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        for j in 0..QK4_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK4_0 / 2 + j] * id;
            // ggml truncates through int8_t before clamping; `as i8` saturates like the C cast
            // does for every value these products can take.
            let xi0 = ((x0 + 8.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 8.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// `quantize_row_q4_0_impl`: one row with its importance matrix `qw` (one weight per column):
/// each block's levels by `make_qx_quants` under the weights `qw * sqrt(sigma2 + x²)`.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ4_0]) {
    for ((xb, weight), yb) in weighted_blocks_32(x, qw).zip(y.iter_mut()) {
        let mut levels = [0i8; QK4_0];
        yb.d = f32_to_f16(make_qx_quants(8, xb, &mut levels, Some(&weight)));
        for j in 0..QK4_0 / 2 {
            yb.qs[j] = levels[j] as u8 | (levels[j + 16] as u8) << 4;
        }
    }
}

/// `dequantize_row_q4_0`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ4_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(xb.d);
        for j in 0..QK4_0 / 2 {
            let x0 = (xb.qs[j] & 0x0f) as i32 - 8;
            let x1 = (xb.qs[j] >> 4) as i32 - 8;
            yb[j] = x0 as f32 * d;
            yb[j + QK4_0 / 2] = x1 as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q4_0_q8_0_generic`: exact integer sums per block, then
/// `sumf += sumi * d_x * d_y` in f32, block by block.
pub fn vec_dot_ref(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let (lo, hi) = yb.qs.split_at(QK4_0 / 2);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for ((&q, &y0), &y1) in xb.qs.iter().zip(lo).zip(hi) {
            sumi0 += ((q & 0x0f) as i32 - 8) * y0 as i32;
            sumi1 += ((q >> 4) as i32 - 8) * y1 as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * f16_to_f32(xb.d) * f16_to_f32(yb.d);
    }
    sumf
}

/// The largest magnitude in `xs` and the signed value that has it (the first one on ties),
/// as the 32-block reference quantizers compute it.
pub(crate) fn signed_absmax(xs: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in xs {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ4_0 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.5);
    }
}
