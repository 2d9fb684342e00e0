//! IQ4_NL: 32 weights per block, one f16 scale, 4-bit indices into a non-linear table of 16
//! levels (`block_iq4_nl`); and the quantizer it shares with IQ4_XS.
//!
//! ```text
//! byte 0..2   d        f16 scale; weight = d * KVALUES[index]
//! byte 2..18  qs[16]   low nibble of qs[j] = index of weight j, high nibble = weight j + 16
//! ```
//!
//! The activations are Q8_0, as for Q4_0: the dot product is Q4_0's with the table in place of
//! `q - 8`.

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::nearest_int;
use super::q8_0::BlockQ8_0;
use bytemuck::{Pod, Zeroable};

/// Values per IQ4_NL block (ggml's `QK4_NL`).
pub const QK4_NL: usize = 32;

/// ggml's `kvalues_iq4nl`: the 16 levels an index selects, denser near zero.
pub const KVALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// ggml's `block_iq4_nl`: 32 weights in 18 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockIq4Nl {
    /// Block scale (f16 bits).
    pub d: u16,
    /// 4-bit table indices: low nibble of `qs[j]` for weight `j`, high nibble for `j + 16`.
    pub qs: [u8; QK4_NL / 2],
}
const _: () = assert!(std::mem::size_of::<BlockIq4Nl>() == 18);

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `best_index_int8`: the index of the level of `values` (ascending) nearest to `x`,
/// the upper one on a tie, by bisection.
pub(crate) fn best_index_int8(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < values[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (values[mu - 1] as f32) < values[mu] as f32 - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// Where [`quantize_impl`] writes a super-block: the f16 super-scale, the packed indices, and
/// (for more than one block of 32) IQ4_XS's 6-bit block scales.
pub(crate) struct Iq4Out<'a> {
    pub d: &'a mut u16,
    pub qs: &'a mut [u8],
    pub scales_h: &'a mut u16,
    pub scales_l: &'a mut [u8],
}

/// ggml's `quantize_row_iq4_nl_impl(super_block_size = x.len(), block_size = 32, …, ntry = 7)`
/// as `quantize_iq4_nl` and `quantize_iq4_xs` call it: per block of 32 the best scale of 15
/// candidates for the table (weights `x²`, or the importance `qw * sqrt(σ² + x²)`), and for a
/// super-block of several blocks, their scales as 6-bit multiples of one f16 scale, indices
/// chosen again for the rounded scale. ggml's order of float operations throughout.
pub(crate) fn quantize_impl(x: &[f32], quant_weights: Option<&[f32]>, out: Iq4Out<'_>) {
    const NTRY: i32 = 7;
    let values = &KVALUES;
    let n = x.len();
    let nblocks = n / 32;
    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / n as f32;
    out.qs.fill(0);
    *out.d = f32_to_f16(0.0);
    let mut levels = vec![0u8; n];
    let mut scales = vec![0.0f32; nblocks];
    let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
    let mut weight = [0.0f32; 32];
    for ib in 0..nblocks {
        let xb = &x[32 * ib..32 * ib + 32];
        let lb = &mut levels[32 * ib..32 * ib + 32];
        match quant_weights {
            Some(qw) => {
                for (j, w) in weight.iter_mut().enumerate() {
                    *w = qw[32 * ib + j] * (sigma2 + xb[j] * xb[j]).sqrt();
                }
            }
            None => {
                for (w, &v) in weight.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            continue;
        }
        let mut d = -max / values[0] as f32;
        let mut id = 1.0 / d;
        let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
        for j in 0..32 {
            let l = best_index_int8(values, id * xb[j]);
            lb[j] = l;
            let q = values[l as usize] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -NTRY..=NTRY {
            id = (itry as f32 + values[0] as f32) / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..32 {
                let q = values[best_index_int8(values, id * xb[j]) as usize] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        if d.abs() > amax_scale {
            amax_scale = d.abs();
            max_scale = d;
        }
    }
    if nblocks > 1 {
        *out.scales_h = 0;
        let d = -max_scale / 32.0;
        *out.d = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for ib in 0..nblocks {
            let l = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 0..32 {
                levels[32 * ib + j] = best_index_int8(values, idl * x[32 * ib + j]);
            }
            let l = (l + 32) as u8;
            if ib % 2 == 0 {
                out.scales_l[ib / 2] = l & 0x0f;
            } else {
                out.scales_l[ib / 2] |= (l & 0x0f) << 4;
            }
            *out.scales_h |= u16::from(l >> 4) << (2 * (ib % 8));
        }
    } else {
        *out.d = f32_to_f16(scales[0]);
        let id = if scales[0] != 0.0 { 1.0 / scales[0] } else { 0.0 };
        for (l, &v) in levels.iter_mut().zip(x) {
            *l = best_index_int8(values, id * v);
        }
    }
    for i in 0..n / 32 {
        for j in 0..16 {
            out.qs[16 * i + j] = levels[32 * i + j] | (levels[32 * i + 16 + j] << 4);
        }
    }
}

/// `quantize_iq4_nl` without an importance matrix: what llama-quantize writes (the search over
/// 15 scales; ggml's `quantize_row_iq4_nl_ref`, which skips it, writes no file).
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockIq4Nl]) {
    quantize_row(x, None, y);
}

/// `quantize_iq4_nl` with the importance matrix `qw` of the row (one weight per column).
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockIq4Nl]) {
    quantize_row(x, Some(qw), y);
}

/// `quantize_iq4_nl` with an optional importance matrix (one weight per column of the row).
pub fn quantize_row(x: &[f32], quant_weights: Option<&[f32]>, y: &mut [BlockIq4Nl]) {
    let (mut unused_h, mut unused_l) = (0u16, [0u8; 0]);
    for (i, (xb, yb)) in x.chunks_exact(QK4_NL).zip(y.iter_mut()).enumerate() {
        let out = Iq4Out {
            d: &mut yb.d,
            qs: &mut yb.qs,
            scales_h: &mut unused_h,
            scales_l: &mut unused_l,
        };
        quantize_impl(xb, quant_weights.map(|w| &w[QK4_NL * i..QK4_NL * (i + 1)]), out);
    }
}

/// The 32 values `table[index]` of 16 bytes of 4-bit indices packed as Q4_0 packs its levels
/// (weight `j` in the low nibble of `qs[j]`, `j + 16` in the high one): the levels of a block of
/// IQ4_NL and MXFP4 and of a block of 32 of IQ4_XS.
pub(crate) fn table_levels_32(qs: &[u8], table: &[i8; 16]) -> [i8; 32] {
    std::array::from_fn(|j| table[((qs[j % 16] >> (4 * (j / 16))) & 0x0f) as usize])
}

/// The exact integer dot product of 32 levels with 32 activations.
pub(crate) fn dot_32(levels: &[i8; 32], y: &[i8]) -> i32 {
    levels.iter().zip(y).map(|(&l, &y)| l as i32 * y as i32).sum()
}

/// `dequantize_row_iq4_nl`: every block of `x` into 32 f32 values of `y`.
pub fn dequantize_row(x: &[BlockIq4Nl], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = f16_to_f32(xb.d);
        for (o, &l) in yb.iter_mut().zip(&table_levels_32(&xb.qs, &KVALUES)) {
            *o = d * l as f32;
        }
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`: exact integer sums per block, then
/// `sumf += (d_y * d_x) * sumi`, block by block.
pub fn vec_dot_ref(x: &[BlockIq4Nl], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(yb.d) * f16_to_f32(xb.d);
        sumf += d * dot_32(&table_levels_32(&xb.qs, &KVALUES), &yb.qs) as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockIq4Nl {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.02);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nearest_level_wins_and_a_tie_goes_to_the_upper_one() {
        assert_eq!(best_index_int8(&KVALUES, -200.0), 0);
        assert_eq!(best_index_int8(&KVALUES, 500.0), 15);
        assert_eq!(best_index_int8(&KVALUES, 0.0), 8);
        assert_eq!(best_index_int8(&KVALUES, -4.5), 8, "halfway between -10 and 1 goes up");
        assert_eq!(best_index_int8(&KVALUES, -4.6), 7);
        for (i, &v) in KVALUES.iter().enumerate() {
            assert_eq!(best_index_int8(&KVALUES, v as f32) as usize, i);
        }
    }
}
