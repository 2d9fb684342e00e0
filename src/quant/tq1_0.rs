//! TQ1_0: ternary weights (-1, 0, 1) packed five to a byte in base 3 in super-blocks of 256 with
//! one f16 scale (`block_tq1_0`, 1.6875 bits per weight; BitNet-style models).
//!
//! ```text
//! byte 0..48   qs[48]  bytes 0..32: trit l (0..5, most significant first) of qs[m] is weight
//!                      32l + m; bytes 32..48: trit l of qs[32 + m] is weight 160 + 16l + m
//! byte 48..52  qh[4]   trit l (0..4) of qh[j] is weight 240 + 4l + j
//! byte 52..54  d       f16 scale; weight = d * (trit - 1)
//! ```
//!
//! A byte holds its five trits as a fixed-point fraction: `q = ceil(t * 256 / 243)` for the
//! base-3 number `t`, so that multiplying by `3^l` (wrapping in a byte) and taking the top of
//! `q * 3` reads trit `l` with shifts alone.

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_tq1_0`: QK_K weights in 54 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockTq1_0 {
    /// Five trits per byte.
    pub qs: [u8; 48],
    /// Four trits per byte.
    pub qh: [u8; 4],
    /// Scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `l` of a packed byte, 0..=2.
fn trit(q: u8, l: usize) -> i8 {
    ((u16::from(q.wrapping_mul(POW3[l])) * 3) >> 8) as i8
}

/// The 256 signed levels (`trit - 1`) of a block, in weight order.
pub fn levels(b: &BlockTq1_0) -> [i8; QK_K] {
    std::array::from_fn(|i| {
        let t = match i {
            0..160 => trit(b.qs[i % 32], i / 32),
            160..240 => trit(b.qs[32 + (i - 160) % 16], (i - 160) / 16),
            _ => trit(b.qh[(i - 240) % 4], (i - 240) / 4),
        };
        t - 1
    })
}

/// Base-3 digits `x[k * stride]` (k < n), each rounded against `id` to -1, 0 or 1 and stored
/// plus one, most significant first, times 3 for each of the `5 - n` missing ones, as the
/// fixed-point byte `ceil(t * 256 / 243)`.
fn pack(x: &[f32], stride: usize, n: usize, id: f32) -> u8 {
    let mut q = 0u8;
    for k in 0..n {
        let xi = (x[k * stride] * id).round() as i32 + 1;
        q = q.wrapping_mul(3).wrapping_add(xi as u8);
    }
    for _ in n..5 {
        q = q.wrapping_mul(3);
    }
    (u16::from(q) * 256).div_ceil(243) as u8
}

/// `quantize_row_tq1_0_ref`: the scale is the largest magnitude, each weight rounded (half away
/// from zero) to -1, 0 or 1 of it.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockTq1_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let amax = xb.iter().fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
        yb.d = f32_to_f16(amax);
        for m in 0..32 {
            yb.qs[m] = pack(&xb[m..], 32, 5, id);
        }
        for m in 0..16 {
            yb.qs[32 + m] = pack(&xb[160 + m..], 16, 5, id);
        }
        for j in 0..4 {
            yb.qh[j] = pack(&xb[240 + j..], 4, 4, id);
        }
    }
}

/// `dequantize_row_tq1_0`: every block of `x` into QK_K values of `y`, `(trit - 1) * d`.
pub fn dequantize_row(x: &[BlockTq1_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (o, &l) in yb.iter_mut().zip(&levels(xb)) {
            *o = l as f32 * d;
        }
    }
}

/// `ggml_vec_dot_tq1_0_q8_K_generic`: the exact integer sum per block, then
/// `sumf += sum * (d * d_y)`.
pub fn vec_dot_ref(x: &[BlockTq1_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sum: i32 = levels(xb).iter().zip(&yb.qs).map(|(&l, &q)| l as i32 * q as i32).sum();
        sumf += sum as f32 * (f16_to_f32(xb.d) * yb.d);
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockTq1_0 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.05);
    }
}
