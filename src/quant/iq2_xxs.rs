//! IQ2_XXS: weights in groups of eight, each group one point of a 256-point codebook on the E8
//! lattice's shell (values 8, 25, 43) with seven stored signs, under a 4-bit scale per 32
//! weights and one f16 scale (`block_iq2_xxs`, 2.0625 bits per weight).
//!
//! ```text
//! byte 0..2    d        f16 super-scale
//! byte 2..66   qs[32]   u16s; per block of 32 (ib), qs[4ib..4ib+4] as two u32s a and b:
//!                       byte l of a is group l's grid index; bits 7l..7l+7 of b its signs
//!                       (KSIGNS); b >> 28 the block scale s
//! weight = d * (0.5 + s) * 0.25 * grid value * sign
//! ```
//!
//! minfer reads this type but does not write it: llama.cpp quantizes it only with an importance
//! matrix.

use super::fp16::f16_to_f32;
use super::iq_common::{dequantize_scaled, odd_scaled_sum, signed8, KSIGNS};
use super::iq_grids::IQ2XXS_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq2_xxs`: QK_K weights in 66 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq2Xxs {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Grid indices, signs and block scales.
    pub qs: [u16; QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq2Xxs>() == 66);

/// The signed levels of a super-block (grid values with their signs) and its eight 4-bit block
/// scales.
pub fn levels(b: &BlockIq2Xxs) -> ([i8; QK_K], [u8; 8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0u8; 8];
    for ib in 0..QK_K / 32 {
        let q = &b.qs[4 * ib..4 * ib + 4];
        let a = q[0] as u32 | (q[1] as u32) << 16;
        let signs = q[2] as u32 | (q[3] as u32) << 16;
        scales[ib] = (signs >> 28) as u8;
        for l in 0..4 {
            let point = IQ2XXS_GRID[(a >> (8 * l)) as usize & 0xff];
            let s = KSIGNS[(signs >> (7 * l)) as usize & 127];
            levels[32 * ib + 8 * l..][..8].copy_from_slice(&signed8(point, s));
        }
    }
    (levels, scales)
}

/// `dequantize_row_iq2_xxs`: `d * (0.5 + s) * 0.25` times each signed level.
pub fn dequantize_row(x: &[BlockIq2Xxs], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let (levels, scales) = levels(xb);
        dequantize_scaled(&levels, &scales, yb, |s| d * (0.5 + s as f32) * 0.25);
    }
}

/// `ggml_vec_dot_iq2_xxs_q8_K_generic`: per block of 32 the exact integer sum times `2s + 1`,
/// summed per super-block and added as `sumf += d * bsum`; the total times 0.125.
pub fn vec_dot_ref(x: &[BlockIq2Xxs], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let (levels, scales) = levels(xb);
        sumf += f16_to_f32(xb.d) * yb.d * odd_scaled_sum(&levels, &yb.qs, &scales) as f32;
    }
    0.125 * sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq2Xxs {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
