//! Q8_1: 32 values per block, F16 scale and the F16 scaled sum of the values (`block_q8_1`).
//! The activation type of the Q4_1 and Q5_1 dot products: the stored sum lets them apply the
//! weight block's minimum with one multiply instead of a pass over the values. Never stored in
//! model files; this module knows nothing of the weights it is multiplied with.
//!
//! ```text
//! byte 0..2   d        f16 scale; value = d * q
//! byte 2..4   s        f16 of d * sum(q)
//! byte 4..36  qs[32]   int8 values
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{abs_max, round_half_away};
use bytemuck::{Pod, Zeroable};

/// Values per Q8_1 block (ggml's `QK8_1`).
pub const QK8_1: usize = 32;

/// ggml's `block_q8_1`: 32 activations in 36 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ8_1 {
    /// Block scale (f16 bits); value = `d * q`.
    pub d: u16,
    /// `d * sum(qs)` (f16 bits), with `d` before its rounding to f16.
    pub s: u16,
    /// Signed 8-bit values.
    pub qs: [i8; QK8_1],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

/// `quantize_row_q8_1_ref`: Q8_0's quantization plus `s = fp16(sum(q) * d)`, where `d` is the
/// f32 scale before its own rounding to F16 (so `s` is not exactly `d_stored * sum`).
#[inline(always)]
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let amax = abs_max(xb);
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        let mut sum = 0i32;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = round_half_away(v * id) as i8;
            sum += *q as i32;
        }
        yb.s = f32_to_f16(sum as f32 * d);
    }
}

/// Every block of `x` into 32 f32 values `d * q` of `y` (`s` is not needed).
pub fn dequantize_row(x: &[BlockQ8_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = f16_to_f32(xb.d);
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = q as f32 * d;
        }
    }
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ8_1 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.05);
        let sum: i32 = self.qs.iter().map(|&q| i32::from(q)).sum();
        self.s = f32_to_f16(sum as f32 * f16_to_f32(self.d));
    }

    fn stored_sum(&self) -> f32 {
        f16_to_f32(self.s)
    }
}
