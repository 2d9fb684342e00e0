//! IQ3_S: a 512-point codebook of four values (1, 3, .., 15), eight stored signs, a 4-bit scale
//! per 32 weights (`block_iq3_s`, 3.4375 bits per weight).
//!
//! ```text
//! byte 0..2      d           f16 super-scale
//! byte 2..66     qs[64]      per block of 32 (ib), qs[8ib + k]: low 8 bits of the grid index of
//!                            weights 4k..4k+4
//! byte 66..74    qh[8]       per block of 32, bit k: the ninth index bit of qs[8ib + k]
//! byte 74..106   signs[32]   per block of 32, signs[4ib + l]: the signs of weights 8l..8l+8
//! byte 106..110  scales[4]   block 2k's s in the low nibble of byte k, 2k + 1's in the high
//! weight = d * (1 + 2s) * grid value * sign
//! ```

use super::fp16::f16_to_f32;
use super::iq_common::{dequantize_scaled, nibbles, odd_scaled_sum, signed4x2};
use super::iq_grids::IQ3S_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq3_s`: QK_K weights in 110 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq3S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 4],
    /// Ninth index bits.
    pub qh: [u8; QK_K / 32],
    /// One sign bit per weight.
    pub signs: [u8; QK_K / 8],
    /// Two 4-bit block scales per byte.
    pub scales: [u8; QK_K / 64],
}
const _: () = assert!(std::mem::size_of::<BlockIq3S>() == 110);

/// The signed levels of a super-block.
pub fn levels(b: &BlockIq3S) -> [i8; QK_K] {
    let mut levels = [0i8; QK_K];
    for (g, out) in levels.chunks_exact_mut(8).enumerate() {
        let (ib, l) = (g / 4, g % 4);
        let qh = b.qh[ib] as usize;
        let first = b.qs[2 * g] as usize | (qh << (8 - 2 * l)) & 256;
        let second = b.qs[2 * g + 1] as usize | (qh << (7 - 2 * l)) & 256;
        out.copy_from_slice(&signed4x2(IQ3S_GRID[first], IQ3S_GRID[second], b.signs[g]));
    }
    levels
}

/// The scale of each block of 32 (`s`, 0..=15).
pub fn scales(b: &BlockIq3S) -> [u8; QK_K / 32] {
    nibbles(&b.scales)
}

/// `dequantize_row_iq3_s`: `d * (1 + 2s)` times each signed level.
pub fn dequantize_row(x: &[BlockIq3S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        dequantize_scaled(&levels(xb), &scales(xb), yb, |s| d * (1 + 2 * s as i32) as f32);
    }
}

/// `ggml_vec_dot_iq3_s_q8_K_generic`: per block of 32 the exact integer sum times `2s + 1`,
/// summed per super-block and added as `sumf += d * bsum`.
pub fn vec_dot_ref(x: &[BlockIq3S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        sumf += f16_to_f32(xb.d) * yb.d * odd_scaled_sum(&levels(xb), &yb.qs, &scales(xb)) as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq3S {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.0005);
    }
}
