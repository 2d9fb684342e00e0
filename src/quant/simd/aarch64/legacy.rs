//! The 32-value block dot products (Q4_0, Q5_0, Q8_0 against Q8_0; Q4_1, Q5_1 against Q8_1) of
//! one weight row with `N` activation rows at once: each weight block is unpacked once into 32
//! signed bytes, its exact integer dot product with each activation block taken in NEON lanes,
//! and the reference's per-block float expression added to the row's sum, block by block, in the
//! reference's order. The four-row forms (decoding) take four weight rows with one activation
//! row, loading each activation block once. The `i8mm` forms take two weight rows and two activation rows: each
//! block's four integer sums from SMMLA, then the same float terms.

use super::*;
use crate::quant::fp16::f16_to_f32;
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_1::BlockQ8_1;

/// A 32-value block type's dot product with its activation blocks, as the kernels take it:
/// [`Self::unpack`] gives a weight block's 32 levels as signed bytes (element order),
/// [`Self::acts`] an activation block's, and [`Self::term`] the reference's float term of the
/// block given its exact integer sum.
trait Block32 {
    type W: bytemuck::Pod;
    type A: bytemuck::Pod;
    unsafe fn unpack(xb: &Self::W) -> (int8x16_t, int8x16_t);
    unsafe fn acts(yb: &Self::A) -> (int8x16_t, int8x16_t);
    fn term(xb: &Self::W, yb: &Self::A, sumi: i32) -> f32;
}

/// One weight row with `N` activation rows: each weight block unpacked once, its integer dot
/// product with each activation block taken in NEON lanes, the terms added block by block.
#[inline(always)]
unsafe fn blockwise<const SDOT: bool, const N: usize, T: Block32>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    let (x, ys) = block_rows::<T::W, T::A, N>(x, ys);
    let mut sums = [0.0f32; N];
    for (i, xb) in x.iter().enumerate() {
        let w = T::unpack(xb);
        for (sum, y) in sums.iter_mut().zip(&ys) {
            let yb = &y[i];
            *sum += T::term(xb, yb, dot32::<SDOT>(w, T::acts(yb)));
        }
    }
    sums
}

/// Four weight rows with one activation row (decoding's matrix-vector product): each activation
/// block loaded once for the four, the terms added block by block to each row's sum.
#[inline(always)]
unsafe fn rowwise<const SDOT: bool, T: Block32>(ws: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
    let ws: [&[T::W]; 4] = ws.map(bytemuck::cast_slice);
    let y: &[T::A] = bytemuck::cast_slice(y);
    let n = ws.iter().fold(y.len(), |n, w| n.min(w.len()));
    let mut sums = [0.0f32; 4];
    for (i, yb) in y[..n].iter().enumerate() {
        let a = T::acts(yb);
        for (sum, w) in sums.iter_mut().zip(&ws) {
            let xb = &w[i];
            *sum += T::term(xb, yb, dot32::<SDOT>(T::unpack(xb), a));
        }
    }
    sums
}

/// Two weight rows with two activation rows: each block's four integer sums from four SMMLAs,
/// then each (row, token)'s term added to its sum, block by block, as [`blockwise`] does.
///
/// # Safety
/// Only inside a function compiled with `i8mm`, on a CPU that has it.
#[inline(always)]
unsafe fn blockwise_2x2<T: Block32>(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
    let (xs, ys) = block_rows_2x2::<T::W, T::A>(xs, ys);
    let mut sums = [[0.0f32; 2]; 2];
    for i in 0..xs[0].len() {
        let (w0, w1) = (T::unpack(&xs[0][i]), T::unpack(&xs[1][i]));
        let (a0, a1) = (T::acts(&ys[0][i]), T::acts(&ys[1][i]));
        let acc = mmla16(vdupq_n_s32(0), [w0.0, w1.0], [a0.0, a1.0]);
        let acc = mmla16(acc, [w0.1, w1.1], [a0.1, a1.1]);
        let mut sumi = [0i32; 4];
        vst1q_s32(sumi.as_mut_ptr(), acc);
        for (r, row) in sums.iter_mut().enumerate() {
            for (t, sum) in row.iter_mut().enumerate() {
                *sum += T::term(&xs[r][i], &ys[t][i], sumi[2 * r + t]);
            }
        }
    }
    sums
}

/// 16 packed nibbles as the low nibbles (elements 0..16) and the high ones (16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = load16u(qs, 0);
    (vandq_u8(q, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(q))
}

/// The 32 five-bit levels of a Q5 block: its nibbles with the fifth bits of `qh`.
#[inline(always)]
unsafe fn five_bit_levels(qs: &[u8; 16], qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    let (lo, hi) = nibbles(qs);
    let qh = u32::from_le_bytes(qh);
    (
        vorrq_u8(lo, fifth_bits_16(qh as u16)),
        vorrq_u8(hi, fifth_bits_16((qh >> 16) as u16)),
    )
}

/// Unsigned levels as signed bytes, less `offset`.
#[inline(always)]
unsafe fn signed(levels: (uint8x16_t, uint8x16_t), offset: i8) -> (int8x16_t, int8x16_t) {
    let o = vdupq_n_s8(offset);
    (
        vsubq_s8(vreinterpretq_s8_u8(levels.0), o),
        vsubq_s8(vreinterpretq_s8_u8(levels.1), o),
    )
}

macro_rules! block32 {
    ($(#[$doc:meta])* $name:ident, $w:ty, $a:ty, unpack($xb:ident) $unpack:expr, term($txb:ident, $yb:ident, $sumi:ident) $term:expr) => {
        $(#[$doc])*
        #[allow(non_camel_case_types)]
        struct $name;
        impl Block32 for $name {
            type W = $w;
            type A = $a;
            #[inline(always)]
            unsafe fn unpack($xb: &$w) -> (int8x16_t, int8x16_t) {
                $unpack
            }
            #[inline(always)]
            unsafe fn acts(yb: &$a) -> (int8x16_t, int8x16_t) {
                (load16(&yb.qs, 0), load16(&yb.qs, 16))
            }
            #[inline(always)]
            fn term($txb: &$w, $yb: &$a, $sumi: i32) -> f32 {
                $term
            }
        }
    };
}

block32!(
    /// Q4_0 against Q8_0: `sumi * d_x * d_y`.
    Q4_0, BlockQ4_0, BlockQ8_0,
    unpack(xb) signed(nibbles(&xb.qs), 8),
    term(xb, yb, sumi) sumi as f32 * f16_to_f32(xb.d) * f16_to_f32(yb.d)
);
block32!(
    /// Q4_1 against Q8_1: `(d_x * d_y) * sumi + m_x * s_y`.
    Q4_1, BlockQ4_1, BlockQ8_1,
    unpack(xb) signed(nibbles(&xb.qs), 0),
    term(xb, yb, sumi) (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s)
);
block32!(
    /// Q5_0 against Q8_0: `(d_x * d_y) * sumi`.
    Q5_0, BlockQ5_0, BlockQ8_0,
    unpack(xb) signed(five_bit_levels(&xb.qs, xb.qh), 16),
    term(xb, yb, sumi) (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32
);
block32!(
    /// Q5_1 against Q8_1: `(d_x * d_y) * sumi + m_x * s_y`.
    Q5_1, BlockQ5_1, BlockQ8_1,
    unpack(xb) signed(five_bit_levels(&xb.qs, xb.qh), 0),
    term(xb, yb, sumi) (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32 + f16_to_f32(xb.m) * f16_to_f32(yb.s)
);
block32!(
    /// Q8_0 against Q8_0: `sumi * (d_x * d_y)`.
    Q8_0, BlockQ8_0, BlockQ8_0,
    unpack(xb) (load16(&xb.qs, 0), load16(&xb.qs, 16)),
    term(xb, yb, sumi) sumi as f32 * (f16_to_f32(xb.d) * f16_to_f32(yb.d))
);

/// Declares the four-row entry point `$name` of the block type `$t`: the baseline NEON form, and
/// the SDOT form compiled with `dotprod`.
macro_rules! rows_entry {
    ($name:ident, $t:ident) => {
        #[doc = concat!("`", stringify!($t), "`'s reference dot product of each of the weight rows `ws` with the activation row `y`.")]
        ///
        /// # Safety
        /// With `SDOT`, the CPU must have the `dotprod` extension.
        pub(in crate::quant) unsafe fn $name<const SDOT: bool>(ws: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
            #[target_feature(enable = "dotprod")]
            unsafe fn with_sdot(ws: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
                rowwise::<true, $t>(ws, y)
            }
            if SDOT {
                with_sdot(ws, y)
            } else {
                rowwise::<false, $t>(ws, y)
            }
        }
    };
}

rows_entry!(rows_q4_0, Q4_0);
rows_entry!(rows_q4_1, Q4_1);
rows_entry!(rows_q5_0, Q5_0);
rows_entry!(rows_q5_1, Q5_1);
rows_entry!(rows_q8_0, Q8_0);

#[inline(always)]
unsafe fn q4_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    blockwise::<SDOT, N, Q4_0>(x, ys)
}

#[inline(always)]
unsafe fn q4_1<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    blockwise::<SDOT, N, Q4_1>(x, ys)
}

#[inline(always)]
unsafe fn q5_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    blockwise::<SDOT, N, Q5_0>(x, ys)
}

#[inline(always)]
unsafe fn q5_1<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    blockwise::<SDOT, N, Q5_1>(x, ys)
}

#[inline(always)]
unsafe fn q8_0<const SDOT: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
    blockwise::<SDOT, N, Q8_0>(x, ys)
}

sdot_entry!(
    /// `q4_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q4_0,
    q4_0
);
sdot_entry!(
    /// `q4_1::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q4_1,
    q4_1
);
sdot_entry!(
    /// `q5_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q5_0,
    q5_0
);
sdot_entry!(
    /// `q5_1::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q5_1,
    q5_1
);
sdot_entry!(
    /// `q8_0::vec_dot_ref` of the weight row `x` with each of the activation rows `ys`.
    vec_dot_q8_0,
    q8_0
);

/// The two-by-two forms on SMMLA: two weight rows with two activation rows, `[row][token]`.
pub(in crate::quant) mod i8mm {
    use super::super::mmla_entry;
    use super::*;

    #[inline(always)]
    unsafe fn q4_0(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        blockwise_2x2::<Q4_0>(xs, ys)
    }
    #[inline(always)]
    unsafe fn q4_1(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        blockwise_2x2::<Q4_1>(xs, ys)
    }
    #[inline(always)]
    unsafe fn q5_0(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        blockwise_2x2::<Q5_0>(xs, ys)
    }
    #[inline(always)]
    unsafe fn q5_1(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        blockwise_2x2::<Q5_1>(xs, ys)
    }
    #[inline(always)]
    unsafe fn q8_0(xs: [&[u8]; 2], ys: [&[u8]; 2]) -> [[f32; 2]; 2] {
        blockwise_2x2::<Q8_0>(xs, ys)
    }

    mmla_entry!(
        /// `q4_0::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q4_0,
        q4_0
    );
    mmla_entry!(
        /// `q4_1::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q4_1,
        q4_1
    );
    mmla_entry!(
        /// `q5_0::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q5_0,
        q5_0
    );
    mmla_entry!(
        /// `q5_1::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q5_1,
        q5_1
    );
    mmla_entry!(
        /// `q8_0::vec_dot_ref` of each weight row of `xs` with each activation row of `ys`.
        vec_dot_q8_0,
        q8_0
    );
}
