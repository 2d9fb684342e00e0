//! TQ2_0: ternary weights (-1, 0, 1) two bits each in super-blocks of 256 with one f16 scale
//! (`block_tq2_0`, 2.0625 bits per weight; BitNet-style models).
//!
//! ```text
//! byte 0..64   qs[64]   per 32-byte group j (0, 32): bits 2l..2l+1 of qs[j + m] hold weight
//!                       4j + 32l + m, stored plus one (0..=3; 3 is read as 2 though never written)
//! byte 64..66  d        f16 scale; weight = d * (q - 1)
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_tq2_0`: QK_K weights in 66 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTq2_0 {
    /// The 2-bit values, four per byte.
    pub qs: [u8; QK_K / 4],
    /// Scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

/// The 256 signed levels (`q - 1`) of a block, in weight order.
pub fn levels(b: &BlockTq2_0) -> [i8; QK_K] {
    std::array::from_fn(|i| {
        let (j, l, m) = (i / 128 * 32, (i % 128) / 32, i % 32);
        ((b.qs[j + m] >> (2 * l)) & 3) as i8 - 1
    })
}

/// `quantize_row_tq2_0_ref`: the scale is the largest magnitude, each weight rounded (half away
/// from zero) to -1, 0 or 1 of it.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockTq2_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        yb.d = f32_to_f16(amax);
        for j in (0..QK_K / 4).step_by(32) {
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    let xi = (xb[4 * j + 32 * n + m] * id).round() as i32 + 1;
                    q = q.wrapping_add(((xi & 3) as u8) << (2 * n));
                }
                yb.qs[j + m] = q;
            }
        }
    }
}

/// `dequantize_row_tq2_0`: every block of `x` into QK_K values of `y`, `(q - 1) * d`.
pub fn dequantize_row(x: &[BlockTq2_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (o, &l) in yb.iter_mut().zip(&levels(xb)) {
            *o = l as f32 * d;
        }
    }
}

/// `ggml_vec_dot_tq2_0_q8_K_generic`: the exact integer sum per block, then
/// `sumf += sumi * (d_y * d)`.
pub fn vec_dot_ref(x: &[BlockTq2_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi: i32 = levels(xb).iter().zip(&yb.qs).map(|(&l, &q)| l as i32 * q as i32).sum();
        sumf += sumi as f32 * (yb.d * f16_to_f32(xb.d));
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockTq2_0 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.05);
    }
}
