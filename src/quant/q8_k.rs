//! Q8_K: the activation type of the K-quant dot products (`block_q8_K`): 256 int8 values with
//! an f32 scale and the sums of each group of 16, which the K-quant kernels use to apply the
//! sub-block mins without touching the values again. Never stored in model files.
//!
//! ```text
//! byte 0..4      d          f32 scale; value = d * q
//! byte 4..260    qs[256]    int8 values
//! byte 260..292  bsums[16]  int16 sum of qs[16j .. 16j + 16]
//! ```

use super::k_quants::{nearest_int, QK_K};
use bytemuck::{Pod, Zeroable};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// `quantize_row_q8_K_ref`: the value of largest magnitude maps to -127 (ggml uses -127, not
/// -128, so that the AVX kernels can negate without overflow).
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *yb = BlockQ8K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, group) in yb.bsums.iter_mut().zip(yb.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| q as i16).sum();
        }
        yb.d = 1.0 / iscale;
    }
}

pub fn dequantize_row(x: &[BlockQ8K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = xb.d * q as f32;
        }
    }
}
