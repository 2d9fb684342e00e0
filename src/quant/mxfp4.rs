//! MXFP4 (OCP microscaling FP4): 32 weights per block, each an E2M1 float, with one shared
//! power-of-two scale (`block_mxfp4`); gpt-oss ships its experts in it.
//!
//! ```text
//! byte 0      e        E8M0 exponent; weight = 2^(e - 128) * KVALUES[code]
//! byte 1..17  qs[16]   low nibble of qs[j] = code of weight j, high nibble = weight j + 16
//! ```
//!
//! ggml keeps the E2M1 values doubled, as integers (`kvalues_mxfp4`), and halves the scale
//! instead (`GGML_E8M0_TO_FP32_HALF`), so the dot product against Q8_0 stays in integers.

use super::fp16::f16_to_f32;
use super::iq4_nl::{dot_32, table_levels_32};
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Values per MXFP4 block (ggml's `QK_MXFP4`).
pub const QK_MXFP4: usize = 32;

/// ggml's `kvalues_mxfp4`: twice the E2M1 value of each 4-bit code (sign in bit 3).
pub const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `block_mxfp4`: 32 weights in 17 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockMxfp4 {
    /// The shared E8M0 exponent.
    pub e: u8,
    /// 4-bit codes: low nibble of `qs[j]` for weight `j`, high nibble for `j + 16`.
    pub qs: [u8; QK_MXFP4 / 2],
}
const _: () = assert!(std::mem::size_of::<BlockMxfp4>() == 17);

/// `GGML_E8M0_TO_FP32_HALF`: half the E8M0 scale, `2^(e - 128)`, built from its bits (the two
/// smallest as subnormals).
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// ggml's `best_index_mxfp4`: the code whose value times `d` is nearest to `x`, the first on a
/// tie.
fn best_index(x: f32, d: f32) -> u8 {
    let mut best = 0;
    let mut best_err = (KVALUES[0] as f32 * d - x).abs();
    for (i, &k) in KVALUES.iter().enumerate().skip(1) {
        let err = (k as f32 * d - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

/// `quantize_row_mxfp4_ref`: the exponent puts the largest magnitude in the top binade of the
/// E2M1 values (`floor(log2(amax)) - 2`), each weight takes its nearest code.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockMxfp4]) {
    for (xb, yb) in x.chunks_exact(QK_MXFP4).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
            }
        }
        // ggml's `log2f` is the platform's, as Rust's `log2` is; the cast saturates where C's
        // would be undefined (no finite weight gets there).
        yb.e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(yb.e);
        for j in 0..QK_MXFP4 / 2 {
            yb.qs[j] = best_index(xb[j], d) | best_index(xb[j + QK_MXFP4 / 2], d) << 4;
        }
    }
}

/// `dequantize_row_mxfp4`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockMxfp4], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_MXFP4)) {
        let d = e8m0_to_f32_half(xb.e);
        for (o, &l) in yb.iter_mut().zip(&table_levels_32(&xb.qs, &KVALUES)) {
            *o = l as f32 * d;
        }
    }
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`: exact integer sums per block, then
/// `sumf += (d_y * scale / 2) * sumi`, block by block.
pub fn vec_dot_ref(x: &[BlockMxfp4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(yb.d) * e8m0_to_f32_half(xb.e);
        sumf += d * dot_32(&table_levels_32(&xb.qs, &KVALUES), &yb.qs) as f32;
    }
    sumf
}

/// The tests' random blocks: any exponent but the largest few, whose scales overflow.
#[cfg(test)]
impl super::testing::TestBlock for BlockMxfp4 {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        use super::testing::Mode;
        self.e = match mode {
            // The two subnormal half-scales (0 and 1), which the vector kernels build apart.
            Mode::ZeroScale => r.below(2) as u8,
            Mode::Extreme => 140,
            Mode::Random | Mode::AllEqual => 100 + r.below(40) as u8,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_half_scale_is_two_to_the_exponent_less_128_down_to_the_subnormals() {
        assert_eq!(e8m0_to_f32_half(128), 1.0);
        assert_eq!(e8m0_to_f32_half(127), 0.5);
        assert_eq!(e8m0_to_f32_half(130), 4.0);
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
    }

    #[test]
    fn a_block_of_e2m1_values_quantizes_exactly() {
        // Values of E2M1 times 2^-1: amax 3 = 1.5 * 2, so e - 127 = 1 - 2 = -1.
        let x: Vec<f32> = (0..32)
            .map(|i| [0.0, 0.25, 0.5, -0.75, 1.0, -1.5, 2.0, 3.0][i % 8])
            .collect();
        let mut b = [BlockMxfp4::default()];
        quantize_row_ref(&x, &mut b);
        assert_eq!(b[0].e, 126);
        let mut y = vec![0.0; 32];
        dequantize_row(&b, &mut y);
        assert_eq!(y, x);
    }
}
