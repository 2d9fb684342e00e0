//! IQ3_XXS: weights in groups of four, each group one point of a 256-point codebook (values
//! 4..62), signs per eight weights, a 4-bit scale per 32 weights and one f16 scale
//! (`block_iq3_xxs`, 3.0625 bits per weight).
//!
//! ```text
//! byte 0..2     d           f16 super-scale
//! byte 2..66    qs[0..64]   per block of 32 (ib), qs[8ib + k]: grid index of weights 4k..4k+4
//! byte 66..98   qs[64..96]  per block of 32, a u32 b: bits 7l..7l+7 the signs of eight
//!                           weights 8l.. (KSIGNS); b >> 28 the block scale s
//! weight = d * (0.5 + s) * 0.5 * grid value * sign
//! ```

use super::fp16::f16_to_f32;
use super::iq_common::{dequantize_scaled, odd_scaled_sum, signed4x2, KSIGNS};
use super::iq_grids::IQ3XXS_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq3_xxs`: QK_K weights in 98 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq3Xxs {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Grid indices, then signs and scales.
    pub qs: [u8; 3 * QK_K / 8],
}
const _: () = assert!(std::mem::size_of::<BlockIq3Xxs>() == 98);

/// The signed levels of a super-block and its eight 4-bit block scales.
pub fn levels(b: &BlockIq3Xxs) -> ([i8; QK_K], [u8; 8]) {
    let mut levels = [0i8; QK_K];
    let mut scales = [0u8; 8];
    for ib in 0..QK_K / 32 {
        let aux = u32::from_le_bytes(b.qs[QK_K / 4 + 4 * ib..][..4].try_into().unwrap());
        scales[ib] = (aux >> 28) as u8;
        for l in 0..4 {
            let q = &b.qs[8 * ib + 2 * l..][..2];
            let signs = KSIGNS[(aux >> (7 * l)) as usize & 127];
            let v = signed4x2(IQ3XXS_GRID[q[0] as usize], IQ3XXS_GRID[q[1] as usize], signs);
            levels[32 * ib + 8 * l..][..8].copy_from_slice(&v);
        }
    }
    (levels, scales)
}

/// `dequantize_row_iq3_xxs`: `d * (0.5 + s) * 0.5` times each signed level.
pub fn dequantize_row(x: &[BlockIq3Xxs], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let (levels, scales) = levels(xb);
        dequantize_scaled(&levels, &scales, yb, |s| d * (0.5 + s as f32) * 0.5);
    }
}

/// `ggml_vec_dot_iq3_xxs_q8_K_generic`: per block of 32 the exact integer sum times `2s + 1`,
/// summed per super-block and added as `sumf += d * bsum`; the total times 0.25.
pub fn vec_dot_ref(x: &[BlockIq3Xxs], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let (levels, scales) = levels(xb);
        sumf += f16_to_f32(xb.d) * yb.d * odd_scaled_sum(&levels, &yb.qs, &scales) as f32;
    }
    0.25 * sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq3Xxs {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
