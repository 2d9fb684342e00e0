//! Q3_K: super-blocks of 256 weights in 16 sub-blocks of 16, each with a 6-bit scale; 3-bit
//! values, their low 2 bits packed four to a byte and their high bit in a mask (`block_q3_K`).
//!
//! ```text
//! byte 0..32     hmask[32]  high bits: bit b of hmask[l] belongs to weight 32b + l; a set bit
//!                           means the level is as stored, a clear one that 4 is subtracted
//! byte 32..96    qs[64]     low 2 bits: per 128-weight half h, qs[32h + l] bits 2s..2s+1 hold
//!                           weight 128h + 32s + l
//! byte 96..108   scales[12] 16 six-bit scales biased by 32: low nibbles in bytes 0..8
//!                           (scale j < 8 low, j + 8 high), top 2 bits in bytes 8..12
//! byte 108..110  d          f16 super-scale; weight = d * (scale_j - 32) * level, level in -4..=3
//! ```

use super::fp16::{f16_to_f32, f32_to_f16};
use super::k_quants::{importance_weights, make_qx_quants, nearest_int, scaled_dot_k, sum_squares, QK_K};
use super::q8_k::BlockQ8K;
use bytemuck::{Pod, Zeroable};

/// ggml's `block_q3_K`: QK_K weights in 110 bytes (layout in the module docs).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Pod, Zeroable)]
pub struct BlockQ3K {
    /// High bits of the values, one per weight.
    pub hmask: [u8; QK_K / 8],
    /// Low 2 bits of the values, four per byte.
    pub qs: [u8; QK_K / 4],
    /// The 16 six-bit sub-block scales, packed.
    pub scales: [u8; 12],
    /// Super-block scale (f16 bits).
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

use super::k_quants::GROUP_MAX_EPS;

/// ggml's `make_q3_quants(n, nmax, x, L, do_rmse = true)`: levels `L` in `0..2 nmax` (the signed
/// level plus `nmax`) and the scale, refined by coordinate descent on the weighted error with
/// weights `x²`, in ggml's order of operations.
fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (l, &v) in levels.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *l = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (l, &v) in levels.iter_mut().zip(x) {
            let w = v * v;
            let mut slx = sumlx - w * v * *l as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * *l as f32 * *l as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *l as i32 {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *l = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in levels.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The 16 six-bit scales of a block, biased (0..=63), four to a little-endian word: scale `j`
/// is byte `j % 4` of word `j / 4`. Scale `j`'s low nibble is nibble `j / 8` of byte `j % 8`,
/// its top two bits bits `2 (j / 4)` of byte `8 + j % 4`; unpacked as ggml's dot products do,
/// four at a time.
pub fn scale_words(b: &BlockQ3K) -> [u32; 4] {
    const LOW: u32 = 0x0f0f_0f0f;
    const TOP: u32 = 0x0303_0303;
    let word = |i: usize| {
        u32::from_le_bytes([
            b.scales[4 * i],
            b.scales[4 * i + 1],
            b.scales[4 * i + 2],
            b.scales[4 * i + 3],
        ])
    };
    let (a0, a1, top) = (word(0), word(1), word(2));
    [
        (a0 & LOW) | ((top & TOP) << 4),
        (a1 & LOW) | (((top >> 2) & TOP) << 4),
        ((a0 >> 4) & LOW) | (((top >> 4) & TOP) << 4),
        ((a1 >> 4) & LOW) | (((top >> 6) & TOP) << 4),
    ]
}

/// The 16 scales of a block, unbiased (`scale_j - 32`, in -32..=31).
pub fn scales(b: &BlockQ3K) -> [i8; QK_K / 16] {
    let words = scale_words(b);
    std::array::from_fn(|j| (words[j / 4].to_le_bytes()[j % 4] as i8).wrapping_sub(32))
}

/// The 256 signed levels (-4..=3) of a super-block, in weight order: the low 2 bits packed as
/// Q2_K packs its levels ([`q2_k::unpack_2bit`](super::q2_k::unpack_2bit)), weight `i`'s high
/// bit at bit `i / 32` of `hmask[i % 32]`.
pub fn levels(b: &BlockQ3K) -> [i8; QK_K] {
    let low = super::q2_k::unpack_2bit(&b.qs);
    std::array::from_fn(|i| low[i] as i8 - if b.hmask[i % 32] & (1 << (i / 32)) != 0 { 0 } else { 4 })
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_row_ref(x: &[f32], y: &mut [BlockQ3K]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut levels = [0i8; QK_K];
        let mut sub_scales = [0f32; QK_K / 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for (j, s) in sub_scales.iter_mut().enumerate() {
            *s = make_q3_quants(4, &xb[16 * j..16 * j + 16], &mut levels[16 * j..16 * j + 16]);
            if s.abs() > amax {
                amax = s.abs();
                max_scale = *s;
            }
        }
        yb.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in sub_scales.iter().enumerate() {
                pack_scale(&mut yb.scales, j, (nearest_int(iscale * s).clamp(-32, 31) + 32) as u8);
            }
            yb.d = f32_to_f16(1.0 / iscale);
        } else {
            yb.d = f32_to_f16(0.0);
        }
        requantize_and_pack(xb, &mut levels, yb);
    }
}

/// Scale `j`'s six bits `l` (biased by 32) into the packed scales.
fn pack_scale(scales: &mut [u8; 12], j: usize, l: u8) {
    if j < 8 {
        scales[j] = l & 0x0f;
    } else {
        scales[j - 8] |= (l & 0x0f) << 4;
    }
    scales[j % 4 + 8] |= (l >> 4) << (2 * (j / 4));
}

/// The levels of a super-block whose scales are stored, requantized against them (after the
/// f16 rounding of `d`), and packed.
fn requantize_and_pack(xb: &[f32], levels: &mut [i8; QK_K], yb: &mut BlockQ3K) {
    for (j, &sc) in scales(yb).iter().enumerate() {
        let d = f16_to_f32(yb.d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(xb[16 * j + ii] / d).clamp(-4, 3);
            levels[16 * j + ii] = (l + 4) as i8;
        }
    }
    // The high bit of weight j goes to bit j / 32 of hmask[j % 32].
    yb.hmask = [0; QK_K / 8];
    for (j, l) in levels.iter_mut().enumerate() {
        if *l > 3 {
            yb.hmask[j % 32] |= 1 << (j / 32);
            *l -= 4;
        }
    }
    for h in 0..QK_K / 128 {
        let lv = &levels[128 * h..];
        for l in 0..32 {
            yb.qs[32 * h + l] = (lv[l] | (lv[l + 32] << 2) | (lv[l + 64] << 4) | (lv[l + 96] << 6)) as u8;
        }
    }
}

/// `quantize_row_q3_K_impl`: one row with its importance matrix `qw` (one weight per column):
/// each sub-block's levels by `make_qx_quants` under the weights `qw * sqrt(sigma2 + x²)`, the
/// sub-block scales by `make_qx_quants` under their total weights.
pub fn quantize_row_imatrix(x: &[f32], qw: &[f32], y: &mut [BlockQ3K]) {
    for ((xb, qw), yb) in x.chunks_exact(QK_K).zip(qw.chunks_exact(QK_K)).zip(y.iter_mut()) {
        let mut levels = [0i8; QK_K];
        let (mut scales, mut sw) = ([0f32; QK_K / 16], [0f32; QK_K / 16]);
        let sigma2 = 2.0 * sum_squares(xb) / QK_K as f32;
        for j in 0..QK_K / 16 {
            let (xs, ws) = (&xb[16 * j..16 * j + 16], &qw[16 * j..16 * j + 16]);
            let mut weight = [0f32; 16];
            importance_weights(xs, ws, sigma2, &mut weight);
            sw[j] = weight.iter().fold(0.0f32, |s, &w| s + w);
            scales[j] = make_qx_quants(4, xs, &mut levels[16 * j..16 * j + 16], Some(&weight));
        }
        yb.scales = [0; 12];
        let mut ls = [0i8; QK_K / 16];
        let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
        for (j, &l) in ls.iter().enumerate() {
            pack_scale(&mut yb.scales, j, l as u8);
        }
        yb.d = f32_to_f16(d_block);
        requantize_and_pack(xb, &mut levels, yb);
    }
}

/// `dequantize_row_q3_K`: every super-block of `x` into QK_K f32 values of `y`:
/// `d * (scale - 32) * level`, the scale of each 16 values.
pub fn dequantize_row(x: &[BlockQ3K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let levels = levels(xb);
        for ((q, out), &sc) in levels.chunks_exact(16).zip(yb.chunks_exact_mut(16)).zip(&scales(xb)) {
            let dl = d * sc as f32;
            for (o, &q) in out.iter_mut().zip(q) {
                *o = dl * q as f32;
            }
        }
    }
}

/// The dot product of Q3_K weights with Q8_K activations: per super-block, the exact integer
/// `sumi` of the scaled signed levels ([`scaled_dot_k`]), then `sumf += (d * d_y) * sumi`.
pub fn vec_dot_ref(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sumi = scaled_dot_k(&levels(xb), &yb.qs, &scales(xb).map(|s| s as i32));
        sumf += (f16_to_f32(xb.d) * yb.d) * sumi as f32;
    }
    sumf
}

/// The float fields of the tests' random blocks.
#[cfg(test)]
impl super::testing::TestBlock for BlockQ3K {
    fn set_floats(&mut self, r: &mut crate::test_util::XorShift, mode: super::testing::Mode) {
        self.d = r.scale(mode, 0.002);
    }
}
