//! IQ2_XS: IQ2_XXS's idea with a 512-point codebook and a 4-bit scale per 16 weights
//! (`block_iq2_xs`, 2.3125 bits per weight).
//!
//! ```text
//! byte 0..2     d           f16 super-scale
//! byte 2..66    qs[32]      u16 per group of eight weights: bits 0..9 the grid index, bits
//!                           9..16 the signs (KSIGNS)
//! byte 66..74   scales[8]   per block of 32: low nibble the first 16 weights' scale s, high
//!                           nibble the second 16's
//! weight = d * (0.5 + s) * 0.25 * grid value * sign
//! ```
//!
//! minfer reads this type but does not write it: llama.cpp quantizes it only with an importance
//! matrix.

use super::fp16::f16_to_f32;
use super::iq_common::{dequantize_scaled, nibbles, odd_scaled_sum, signed8, KSIGNS};
use super::iq_grids::IQ2XS_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq2_xs`: QK_K weights in 74 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq2Xs {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Grid index and signs of each group of eight.
    pub qs: [u16; QK_K / 8],
    /// Two 4-bit scales per block of 32.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xs>() == 74);

/// The signed levels of a super-block.
pub fn levels(b: &BlockIq2Xs) -> [i8; QK_K] {
    let mut levels = [0i8; QK_K];
    for (out, &q) in levels.chunks_exact_mut(8).zip(&b.qs) {
        out.copy_from_slice(&signed8(IQ2XS_GRID[(q & 511) as usize], KSIGNS[(q >> 9) as usize]));
    }
    levels
}

/// The scale of each 16 weights (`s`, 0..=15).
pub fn scales(b: &BlockIq2Xs) -> [u8; QK_K / 16] {
    nibbles(&b.scales)
}

/// `dequantize_row_iq2_xs`: `d * (0.5 + s) * 0.25` times each signed level.
pub fn dequantize_row(x: &[BlockIq2Xs], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        dequantize_scaled(&levels(xb), &scales(xb), yb, |s| d * (0.5 + s as f32) * 0.25);
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K_generic`: per 16 weights the exact integer sum times `2s + 1`,
/// summed per super-block and added as `sumf += d * bsum`; the total times 0.125.
pub fn vec_dot_ref(x: &[BlockIq2Xs], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        sumf += f16_to_f32(xb.d) * yb.d * odd_scaled_sum(&levels(xb), &yb.qs, &scales(xb)) as f32;
    }
    0.125 * sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq2Xs {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
