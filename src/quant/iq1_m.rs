//! IQ1_M: IQ1_S's codebook with a shift per eight weights and a 3-bit scale per 16, the f16
//! super-scale spread over the scales' top nibbles (`block_iq1_m`, 1.75 bits per weight).
//!
//! ```text
//! byte 0..32    qs[32]      low 8 bits of each group of eight's grid index
//! byte 32..48   qh[16]      per two groups (byte 2ib + h): bits 0..3 / 4..7 the top index bits
//!                           of groups 4ib + 2h and 4ib + 2h + 1, bits 3 / 7 their shifts' signs
//! byte 48..56   scales[8]   four u16s sc: sc[ib / 2] bits 6(ib % 2)..+3 block ib's first 16
//!                           weights' s, the next three bits the second 16's; the top nibbles
//!                           of sc[0..4] are the f16 super-scale d, sc[0]'s lowest
//! weight = d * (2s + 1) * (grid value + shift), shift ±1/8
//! ```
//!
//! minfer reads this type but does not write it: llama.cpp quantizes it only with an importance
//! matrix.

use super::fp16::f16_to_f32;
use super::iq1_s::{point, IQ1S_DELTA};
use super::iq_common::dot8;
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq1_m`: QK_K weights in 56 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq1M {
    /// Low 8 bits of the grid indices.
    pub qs: [u8; QK_K / 8],
    /// Top index bits and shift signs, two groups per byte.
    pub qh: [u8; QK_K / 16],
    /// 3-bit scales and the super-scale's nibbles.
    pub scales: [u8; QK_K / 32],
}
const _: () = assert!(std::mem::size_of::<BlockIq1M>() == 56);

/// A block's four scale words.
fn sc(b: &BlockIq1M) -> [u16; 4] {
    std::array::from_fn(|k| u16::from_le_bytes([b.scales[2 * k], b.scales[2 * k + 1]]))
}

/// The super-scale: the top nibbles of the four scale words (`iq1m_scale_t`).
pub fn d(b: &BlockIq1M) -> f32 {
    let sc = sc(b);
    f16_to_f32((sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000))
}

/// The odd scale `2s + 1` of each 16 weights.
pub fn scales(b: &BlockIq1M) -> [i32; QK_K / 16] {
    let sc = sc(b);
    std::array::from_fn(|i| {
        let (ib, h) = (i / 2, i % 2);
        2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3 * h)) & 7) as i32 + 1
    })
}

/// The ternary levels of a super-block (without the shifts) and whether each group of eight's
/// shift is negative.
pub fn levels(b: &BlockIq1M) -> ([i8; QK_K], [bool; QK_K / 8]) {
    let mut levels = [0i8; QK_K];
    let mut negative = [false; QK_K / 8];
    for (g, out) in levels.chunks_exact_mut(8).enumerate() {
        let qh = b.qh[g / 2] as usize;
        let nibble = if g % 2 == 0 { qh & 0xf } else { qh >> 4 };
        out.copy_from_slice(&point(b.qs[g] as usize | (nibble & 7) << 8));
        negative[g] = nibble & 8 != 0;
    }
    (levels, negative)
}

/// `dequantize_row_iq1_m`: `d * (2s + 1)` times each level plus its group's shift.
pub fn dequantize_row(x: &[BlockIq1M], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = d(xb);
        let ((levels, negative), scales) = (levels(xb), scales(xb));
        for (g, (out, l)) in yb.chunks_exact_mut(8).zip(levels.chunks_exact(8)).enumerate() {
            let dl = d * scales[g / 2] as f32;
            let delta = if negative[g] { -IQ1S_DELTA } else { IQ1S_DELTA };
            for (o, &v) in out.iter_mut().zip(l) {
                *o = dl * (v as f32 + delta);
            }
        }
    }
}

/// `ggml_vec_dot_iq1_m_q8_K_generic`: the exact sums of levels times activations (`sumi1`) and
/// of the shifts' signs times the activations' sums (`sumi2`), each 16 weighted by `2s + 1`;
/// `sumf += d_x * d_y * (sumi1 + IQ1M_DELTA * sumi2)`.
pub fn vec_dot_ref(x: &[BlockIq1M], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let ((levels, negative), scales) = (levels(xb), scales(xb));
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for (g, (l, q)) in levels.chunks_exact(8).zip(yb.qs.chunks_exact(8)).enumerate() {
            let qsum: i32 = q.iter().map(|&v| v as i32).sum();
            let delta = if negative[g] { -1 } else { 1 };
            sumi1 += scales[g / 2] * dot8(l, q);
            sumi2 += scales[g / 2] * delta * qsum;
        }
        sumf += d(xb) * yb.d * (sumi1 as f32 + IQ1S_DELTA * sumi2 as f32);
    }
    sumf
}

/// The tests' random blocks: the super-scale lives in the scales' top nibbles, so it is set
/// there.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq1M {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        let d = r.scale(mode, 0.02);
        for k in 0..4 {
            let nibble = ((d >> (4 * k)) & 0xf) as u8;
            self.scales[2 * k + 1] = (self.scales[2 * k + 1] & 0x0f) | nibble << 4;
        }
    }
}
