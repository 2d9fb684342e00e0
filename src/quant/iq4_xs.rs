//! IQ4_XS: IQ4_NL's table in super-blocks of 256 weights, eight blocks of 32 with 6-bit scales
//! under one f16 scale (`block_iq4_xs`, 4.25 bits per weight).
//!
//! ```text
//! byte 0..2     d            f16 super-scale; weight = d * (scale_ib - 32) * KVALUES[index]
//! byte 2..4     scales_h     top 2 bits of block ib's scale at bits 2ib..2ib+1
//! byte 4..8     scales_l[4]  low 4 bits: block 2k in the low nibble of byte k, 2k + 1 high
//! byte 8..136   qs[128]      per block ib, qs[16ib + j]: low nibble weight 32ib + j, high
//!                            nibble weight 32ib + 16 + j
//! ```

use super::fp16::f16_to_f32;
use super::iq4_nl::{dot_32, quantize_impl, table_levels_32, Iq4Out, KVALUES};
use super::k_quants::QK_K;
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_iq4_xs`: QK_K weights in 136 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq4Xs {
    /// Super-block scale (f16 bits).
    pub d: u16,
    /// Top two bits of each block's scale.
    pub scales_h: u16,
    /// Low four bits of each block's scale, two blocks per byte.
    pub scales_l: [u8; QK_K / 64],
    /// 4-bit table indices.
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Xs>() == 136);

/// The eight block scales of a super-block, unbiased (`scale - 32`, in -32..=31).
pub fn scales(b: &BlockIq4Xs) -> [i32; 8] {
    std::array::from_fn(|ib| {
        let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0f;
        let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
        (low | high << 4) as i32 - 32
    })
}

/// `quantize_iq4_xs` without an importance matrix (ggml's `quantize_row_iq4_xs_ref` is the
/// same call).
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockIq4Xs]) {
    quantize_row(x, None, y);
}

/// `quantize_iq4_xs` with the importance matrix `qw` of the row (one weight per column).
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockIq4Xs]) {
    quantize_row(x, Some(qw), y);
}

/// `quantize_iq4_xs` with an optional importance matrix (one weight per column of the row).
pub fn quantize_row(x: &[f32], quant_weights: Option<&[f32]>, y: &mut [BlockIq4Xs]) {
    for (i, (xb, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let out = Iq4Out {
            d: &mut yb.d,
            qs: &mut yb.qs,
            scales_h: &mut yb.scales_h,
            scales_l: &mut yb.scales_l,
        };
        quantize_impl(xb, quant_weights.map(|w| &w[QK_K * i..QK_K * (i + 1)]), out);
    }
}

/// `dequantize_row_iq4_xs`: every super-block of `x` into QK_K f32 values of `y`.
pub fn dequantize_row(x: &[BlockIq4Xs], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ((out, qs), ls) in yb.chunks_exact_mut(32).zip(xb.qs.chunks_exact(16)).zip(scales(xb)) {
            let dl = d * ls as f32;
            for (o, &l) in out.iter_mut().zip(&table_levels_32(qs, &KVALUES)) {
                *o = dl * l as f32;
            }
        }
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`: per block of 32, the exact integer sum, then
/// `sumf += (d * d_y * (scale - 32)) * sumi`, block by block.
pub fn vec_dot_ref(x: &[BlockIq4Xs], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d4d8 = f16_to_f32(xb.d) * yb.d;
        for ((qs, q8), ls) in xb.qs.chunks_exact(16).zip(yb.qs.chunks_exact(32)).zip(scales(xb)) {
            sumf += (d4d8 * ls as f32) * dot_32(&table_levels_32(qs, &KVALUES), q8) as f32;
        }
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq4Xs {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
