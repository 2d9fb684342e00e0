//! IQ1_S: weights in groups of eight, each group one point of a 2048-point ternary codebook
//! (-1, 0, 1), shifted by ±1/8 per block of 32, with a 3-bit scale per block of 32
//! (`block_iq1_s`, 1.5625 bits per weight).
//!
//! ```text
//! byte 0..2     d        f16 super-scale
//! byte 2..34    qs[32]   low 8 bits of each group of eight's grid index
//! byte 34..50   qh[8]    u16 per block of 32: bits 3l..3l+3 the top index bits of group l,
//!                        bits 12..15 the scale s, bit 15 the shift's sign (set: -1/8)
//! weight = d * (2s + 1) * (grid value + shift)
//! ```
//!
//! minfer reads this type but does not write it: llama.cpp quantizes it only with an importance
//! matrix.

use super::fp16::f16_to_f32;
use super::iq_common::dot8;
use super::iq_grids::IQ1S_GRID;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `IQ1S_DELTA`: the magnitude of a block's shift.
pub const IQ1S_DELTA: f32 = 0.125;

/// ggml's `block_iq1_s`: QK_K weights in 50 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq1S {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 8],
    /// Top index bits, scale and shift sign per block of 32.
    pub qh: [u16; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq1S>() == 50);

/// The eight values of the grid point at `index` (-1, 0 or 1).
pub fn point(index: usize) -> [i8; 8] {
    IQ1S_GRID[index].to_le_bytes().map(|v| v as i8)
}

/// The ternary levels of a super-block (without the shifts).
pub fn levels(b: &BlockIq1S) -> [i8; QK_K] {
    let mut levels = [0i8; QK_K];
    for (g, out) in levels.chunks_exact_mut(8).enumerate() {
        let (ib, l) = (g / 4, g % 4);
        let index = b.qs[g] as usize | (((b.qh[ib] >> (3 * l)) & 7) as usize) << 8;
        out.copy_from_slice(&point(index));
    }
    levels
}

/// A block of 32's odd scale `2s + 1` and whether its shift is negative.
fn scale_and_sign(qh: u16) -> (i32, bool) {
    (2 * ((qh >> 12) & 7) as i32 + 1, qh & 0x8000 != 0)
}

/// `dequantize_row_iq1_s`: `d * (2s + 1)` times each level plus the block's shift.
pub fn dequantize_row(x: &[BlockIq1S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let levels = levels(xb);
        for ((out, l), &qh) in yb.chunks_exact_mut(32).zip(levels.chunks_exact(32)).zip(&xb.qh) {
            let (ls, negative) = scale_and_sign(qh);
            let dl = d * ls as f32;
            let delta = if negative { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (o, &v) in out.iter_mut().zip(l) {
                *o = dl * (v as f32 + delta);
            }
        }
    }
}

/// `ggml_vec_dot_iq1_s_q8_K_generic`: the exact sums of levels times activations (`sumi`) and of
/// the shifts' signs times the activations' group sums (`sumi1`), each weighted by `2s + 1`;
/// `sumf += d_x * d_y * (sumi + IQ1S_DELTA * sumi1)`.
pub fn vec_dot_ref(x: &[BlockIq1S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let levels = levels(xb);
        let (mut sumi, mut sumi1) = (0i32, 0i32);
        for (ib, &qh) in xb.qh.iter().enumerate() {
            let (ls, negative) = scale_and_sign(qh);
            let lsum: i32 = (0..4)
                .map(|l| dot8(&levels[32 * ib + 8 * l..][..8], &yb.qs[32 * ib + 8 * l..][..8]))
                .sum();
            let delta = if negative { -1 } else { 1 };
            sumi += ls * lsum;
            sumi1 += ls * delta * (yb.bsums[2 * ib] as i32 + yb.bsums[2 * ib + 1] as i32);
        }
        sumf += f16_to_f32(xb.d) * yb.d * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq1S {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.02);
    }
}
