//! Q8_K: the activation type of the K-quant dot products (`block_q8_K`): 256 int8 values with
//! an f32 scale and the sums of each group of 16, which the K-quant kernels use to apply the
//! sub-block mins without touching the values again. Never stored in model files.
//!
//! ```text
//! byte 0..4      d          f32 scale; value = d * q
//! byte 4..260    qs[256]    int8 values
//! byte 260..292  bsums[16]  int16 sum of qs[16j .. 16j + 16]
//! ```

use super::k_quants::abs_max;
use super::k_quants::{nearest_int, QK_K};
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q8_K`: QK_K activations in 292 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
pub struct BlockQ8K {
    /// Super-block scale (f32, unlike the other blocks' f16); value = `d * q`.
    pub d: f32,
    /// Signed 8-bit values.
    pub qs: [i8; QK_K],
    /// Sum of each group of 16 `qs`, for applying the weight sub-block mins.
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

/// `quantize_row_q8_K_ref`: the value of largest magnitude maps to -127 (ggml uses -127, not
/// -128, so that the AVX kernels can negate without overflow).
#[inline(always)]
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ8K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        // ggml takes the first value of the largest magnitude, sign included: the magnitude in
        // vector lanes, then a search for its first holder.
        let amax = abs_max(xb);
        let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
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

/// Every super-block of `x` into QK_K f32 values `d * q` of `y`.
pub fn dequantize_row(x: &[BlockQ8K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (out, &q) in yb.iter_mut().zip(&xb.qs) {
            *out = xb.d * q as f32;
        }
    }
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ8K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale_f32(mode, 0.05);
        for (s, g) in self.bsums.iter_mut().zip(self.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| i16::from(q)).sum();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `quantize_row_q8_K_ref` transcribed loop for loop: the first largest magnitude found by a
    /// strict comparison, value by value.
    fn ggml_transcription(x: &[f32]) -> BlockQ8K {
        let (mut max, mut amax) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            return BlockQ8K::zeroed();
        }
        let iscale = -127.0 / max;
        let mut b = BlockQ8K::zeroed();
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, group) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *sum = group.iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
        b
    }

    #[test]
    fn the_quantizer_is_ggmls_loop_including_ties_of_opposite_sign_and_nan() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for case in 0..2000 {
            let mut x: Vec<f32> = (0..QK_K).map(|_| (next() >> 40) as f32 / 65536.0 - 128.0).collect();
            match case % 4 {
                // The largest magnitude twice, with opposite signs, in either order.
                0 => {
                    let (i, j) = ((next() % 256) as usize, (next() % 256) as usize);
                    x[i] = 200.0;
                    x[j] = -200.0;
                }
                1 => x[(next() % 256) as usize] = f32::NAN,
                2 => x.iter_mut().for_each(|v| *v = if next() % 2 == 0 { 0.0 } else { -0.0 }),
                _ => {}
            }
            let mut got = [BlockQ8K::zeroed()];
            quantize_row_ref(&x, &mut got);
            let want = ggml_transcription(&x);
            assert_eq!(bytemuck::bytes_of(&got[0]), bytemuck::bytes_of(&want), "case {case}");
        }
    }
}
