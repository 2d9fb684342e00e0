//! IQ2_S: a 1024-point codebook of eight values (8, 25, 43) with eight stored signs, a 4-bit
//! scale per 16 weights (`block_iq2_s`, 2.5625 bits per weight).
//!
//! ```text
//! byte 0..2     d           f16 super-scale
//! byte 2..34    qs[0..32]   low 8 bits of each group of eight's grid index
//! byte 34..66   qs[32..64]  each group's eight signs (bit j: weight j negated)
//! byte 66..74   qh[8]       per block of 32: bits 2l..2l+2 the top two index bits of group l
//! byte 74..82   scales[8]   per block of 32: low nibble the first 16 weights' s, high the second
//! weight = d * (0.5 + s) * 0.25 * grid value * sign
//! ```

use super::fp16::f16_to_f32;
use super::iq_common::{dequantize_scaled, nibbles, odd_scaled_sum, signed8};
use super::iq_grids::IQ2S_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq2_s`: QK_K weights in 82 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq2S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Low index bytes, then the signs.
    pub qs: [u8; QK_K / 4],
    /// Top index bits.
    pub qh: [u8; QK_K / 32],
    /// Two 4-bit scales per block of 32.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2S>() == 82);

/// The signed levels of a super-block.
pub fn levels(b: &BlockIq2S) -> [i8; QK_K] {
    let mut levels = [0i8; QK_K];
    for (g, out) in levels.chunks_exact_mut(8).enumerate() {
        let (ib, l) = (g / 4, g % 4);
        let index = b.qs[g] as usize | ((b.qh[ib] as usize) << (8 - 2 * l)) & 0x300;
        out.copy_from_slice(&signed8(IQ2S_GRID[index], b.qs[QK_K / 8 + g]));
    }
    levels
}

/// The scale of each 16 weights (`s`, 0..=15).
pub fn scales(b: &BlockIq2S) -> [u8; QK_K / 16] {
    nibbles(&b.scales)
}

/// `dequantize_row_iq2_s`: `d * (0.5 + s) * 0.25` times each signed level.
pub fn dequantize_row(x: &[BlockIq2S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        dequantize_scaled(&levels(xb), &scales(xb), yb, |s| d * (0.5 + s as f32) * 0.25);
    }
}

/// `ggml_vec_dot_iq2_s_q8_K_generic`: per 16 weights the exact integer sum times `2s + 1`,
/// summed per super-block and added as `sumf += d * bsum`; the total times 0.125.
pub fn vec_dot_ref(x: &[BlockIq2S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        sumf += f16_to_f32(xb.d) * yb.d * odd_scaled_sum(&levels(xb), &yb.qs, &scales(xb)) as f32;
    }
    0.125 * sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq2S {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
