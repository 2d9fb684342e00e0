//! Q8_0: 32 weights per block, one F16 scale, signed 8-bit values (`block_q8_0`). Also the
//! activation type the 32-block weight dot products consume.
//!
//! ```text
//! byte 0..2   d        f16 scale; weight = d * q
//! byte 2..34  qs[32]   int8 values
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{abs_max, round_half_away};
use bytemuck::{Pod, Zeroable};

/// Values per Q8_0 block (ggml's `QK8_0`).
pub const QK8_0: usize = 32;

/// ggml's `block_q8_0`: 32 weights (or activations) in 34 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_0 {
    /// Block scale (f16 bits); weight = `d * q`.
    pub d: u16,
    /// Signed 8-bit values.
    pub qs: [i8; QK8_0],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// `quantize_row_q8_0_ref`: symmetric quantization to ±127, rounding half away from zero.
#[inline(always)]
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = abs_max(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = round_half_away(v * id) as i8;
        }
    }
}

/// `dequantize_row_q8_0`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockQ8_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = f16_to_f32(xb.d);
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = q as f32 * d;
        }
    }
}

/// `ggml_vec_dot_q8_0_q8_0_generic`: `sumf += sumi * (d_x * d_y)` per block.
pub fn vec_dot_ref(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&a, &b) in xb.qs.iter().zip(&yb.qs) {
            sumi += a as i32 * b as i32;
        }
        sumf += sumi as f32 * (f16_to_f32(xb.d) * f16_to_f32(yb.d));
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ8_0 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.05);
    }
}
