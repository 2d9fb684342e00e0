//! The 32-value block dot products (Q4_0, Q5_0, Q8_0, IQ4_NL, MXFP4 against Q8_0; Q4_1, Q5_1
//! against Q8_1),
//! of one weight row with `N` activation rows at once (the weight blocks are unpacked once), and
//! of four weight rows with one activation row (`rows_*`, for decoding: the activation blocks,
//! their scales and their offset terms are read once for the four rows, and the four rows'
//! float sums are added in one vector).
//!
//! Blocks go eight at a time: each block's integer dot product is summed exactly in i32 lanes,
//! the eight sums are gathered into one vector, the reference's per-block float expression is
//! evaluated for the eight blocks at once (same operands, same association), and the eight
//! results are added to the running sum one by one, left to right, as the reference adds them.

use super::*;
use crate::quant::iq4_nl::{self, BlockIq4Nl};
use crate::quant::mxfp4::{self, BlockMxfp4};
use crate::quant::q4_0::BlockQ4_0;
use crate::quant::q4_1::BlockQ4_1;
use crate::quant::q5_0::BlockQ5_0;
use crate::quant::q5_1::BlockQ5_1;
use crate::quant::q8_0::BlockQ8_0;
use crate::quant::q8_1::BlockQ8_1;

/// The block loop shared by the kernels, for the weight row `$x` and the `N` activation rows
/// `$ys`: `$prep(xb)` unpacks a
/// weight block, `$dot(u, yb)` gives the integer dot product of the unpacked block with an
/// activation block as i32 lanes, and `$floats(xc, yc, sumi)` the reference's per-block float
/// terms of a chunk of up to eight blocks given their integer sums. The terms are added to each
/// row's total in block order.
macro_rules! blockwise {
    ($x:expr, $ys:expr, $prep:expr, $dot:expr, $floats:expr) => {{
        let (x, ys) = ($x, $ys);
        let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
        let mut sums = [0.0f32; N];
        let mut start = 0;
        while start < n {
            let len = (n - start).min(8);
            let xc = &x[start..start + len];
            let mut yc: [&[_]; N] = [&[]; N];
            for (c, y) in yc.iter_mut().zip(ys) {
                *c = &y[start..start + len];
            }
            prefetch_ahead(xc);
            macro_rules! block {
                ($lanes:ident, $k:expr) => {{
                    let u = $prep(&xc[$k]);
                    #[allow(clippy::needless_range_loop)] // constant indices keep the lanes in registers
                    for t in 0..N {
                        $lanes[t][$k] = $dot(u, &yc[t][$k]);
                    }
                }};
            }
            macro_rules! add_terms {
                ($lanes:ident) => {
                    for ((sum, l), y) in sums.iter_mut().zip(&$lanes).zip(yc) {
                        let terms = lanes_f32($floats(xc, y, hsum_8x8(l)));
                        for &v in &terms[..len] {
                            *sum += v;
                        }
                    }
                };
            }
            if len == 8 {
                // Unrolled, on its own: the lanes stay in registers.
                let mut lanes = [[_mm256_setzero_si256(); 8]; N];
                block!(lanes, 0);
                block!(lanes, 1);
                block!(lanes, 2);
                block!(lanes, 3);
                block!(lanes, 4);
                block!(lanes, 5);
                block!(lanes, 6);
                block!(lanes, 7);
                add_terms!(lanes);
            } else {
                let mut lanes = [[_mm256_setzero_si256(); 8]; N];
                for k in 0..len {
                    block!(lanes, k);
                }
                add_terms!(lanes);
            }
            start += len;
        }
        sums
    }};
}

/// Eight values of each of `$f(0)` ... `$f(7)`, written out (a closure over `from_fn` would be
/// left as a loop over memory).
macro_rules! eight {
    ($f:expr) => {
        [$f(0), $f(1), $f(2), $f(3), $f(4), $f(5), $f(6), $f(7)]
    };
}

/// The block loop of the `rows_*` kernels, for four weight rows `$xs` and one activation row
/// `$y`: `$prep`, `$floats` as in `blockwise!`, `$dot(u, yb)` the integer products of unpacked
/// levels with an activation block and `$offset(yb)` those of the type's level offset (zero for
/// none; the compiler then drops them), computed once per block for the four rows. Each row's
/// integer sums are `Σ u·y - Σ offset·y = Σ (u - offset)·y`, exactly those of the one-row
/// kernel, and each row's terms are added in block order (the four rows side by side in one
/// vector), so a row's result is its one-row kernel's, bit for bit.
macro_rules! rowwise {
    ($xs:expr, $y:expr, $prep:expr, $dot:expr, $offset:expr, $floats:expr) => {{
        let (xs, y) = ($xs, $y);
        let n = xs.iter().fold(y.len(), |n, x| n.min(x.len()));
        // The terms of eight blocks of the four rows, block by block.
        macro_rules! chunk {
            ($xc:expr, $yc:expr) => {{
                let (xc, yc) = ($xc, $yc);
                let offset_sums = hsum_8x8(&eight!(|k| $offset(&yc[k])));
                macro_rules! row {
                    ($r:expr) => {{
                        let x = xc[$r];
                        prefetch_ahead(x);
                        let lanes = eight!(|k| $dot($prep(&x[k]), &yc[k]));
                        $floats(x, yc, _mm256_sub_epi32(hsum_8x8(&lanes), offset_sums))
                    }};
                }
                transpose_4x8([row!(0), row!(1), row!(2), row!(3)])
            }};
        }
        let mut sums = _mm_setzero_ps();
        let whole = n - n % 8;
        for start in (0..whole).step_by(8) {
            let xc = [
                &xs[0][start..start + 8],
                &xs[1][start..start + 8],
                &xs[2][start..start + 8],
                &xs[3][start..start + 8],
            ];
            for b in chunk!(xc, &y[start..start + 8]) {
                sums = _mm_add_ps(sums, b);
            }
        }
        if whole < n {
            // The last, short chunk, copied after zero blocks' worth of padding whose terms are
            // not added.
            let len = n - whole;
            let mut x_pad = [[bytemuck::Zeroable::zeroed(); 8]; 4];
            let mut y_pad = [bytemuck::Zeroable::zeroed(); 8];
            for (pad, x) in x_pad.iter_mut().zip(xs) {
                pad[..len].copy_from_slice(&x[whole..n]);
            }
            y_pad[..len].copy_from_slice(&y[whole..n]);
            let terms = chunk!([&x_pad[0][..], &x_pad[1][..], &x_pad[2][..], &x_pad[3][..]], &y_pad[..]);
            for b in &terms[..len] {
                sums = _mm_add_ps(sums, *b);
            }
        }
        let mut out = [0.0f32; 4];
        _mm_storeu_ps(out.as_mut_ptr(), sums);
        out
    }};
}

// `heads8` reads the scale `d` from the first two bytes of every block, and the minimum `m` or
// the scaled sum `s` from the next two.
const _: () = {
    use std::mem::offset_of;
    assert!(offset_of!(BlockQ4_0, d) == 0 && offset_of!(BlockQ5_0, d) == 0 && offset_of!(BlockQ8_0, d) == 0);
    assert!(offset_of!(BlockIq4Nl, d) == 0 && offset_of!(BlockMxfp4, e) == 0);
    assert!(offset_of!(BlockQ4_1, d) == 0 && offset_of!(BlockQ4_1, m) == 2);
    assert!(offset_of!(BlockQ5_1, d) == 0 && offset_of!(BlockQ5_1, m) == 2);
    assert!(offset_of!(BlockQ8_1, d) == 0 && offset_of!(BlockQ8_1, s) == 2);
};

/// The kernels of one type from its parts: `$one` (one weight row, `N` activation rows) and
/// `$rows` (four weight rows, one activation row). `$prep` unpacks a weight block to unsigned
/// levels; `$dot` is their integer product with an activation block and `$offset` the product
/// of the type's level offset with it (both i32 lanes, any arrangement), so that a block's sum
/// is `Σ $dot - Σ $offset`; `$floats` is the reference's per-block float expression.
macro_rules! kernels {
    ($(#[$doc:meta])* $one:ident, $rows:ident, $w:ty, $a:ty, $prep:expr, $dot:expr, $offset:expr, $floats:expr) => {
        $(#[$doc])*
        #[inline(always)]
        pub(in crate::quant) unsafe fn $one<const VNNI: bool, const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
            // One body per instruction set, each compiled for its features (the AVX-512 one may
            // then use the mask registers and all 32 vector registers).
            macro_rules! body {
                ($features:literal, $vnni:literal) => {{
                    #[target_feature(enable = $features)]
                    unsafe fn kernel<const N: usize>(x: &[u8], ys: [&[u8]; N]) -> [f32; N] {
                        const VNNI: bool = $vnni;
                        let (x, ys) = block_rows::<$w, $a, N>(x, ys);
                        let dot = |u, y: &$a| _mm256_sub_epi32($dot(u, y), $offset(y));
                        blockwise!(x, ys, $prep, dot, $floats)
                    }
                    kernel::<N>(x, ys)
                }};
            }
            if VNNI {
                body!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", true)
            } else {
                body!("avx2,f16c", false)
            }
        }

        $(#[$doc])*
        ///
        /// Four weight rows against one activation row.
        #[inline(always)]
        pub(in crate::quant) unsafe fn $rows<const VNNI: bool>(xs: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
            macro_rules! body {
                ($features:literal, $vnni:literal) => {{
                    #[target_feature(enable = $features)]
                    unsafe fn kernel(xs: [&[u8]; 4], y: &[u8]) -> [f32; 4] {
                        const VNNI: bool = $vnni;
                        let xs: [&[$w]; 4] = xs.map(bytemuck::cast_slice);
                        let y: &[$a] = bytemuck::cast_slice(y);
                        rowwise!(xs, y, $prep, $dot, $offset, $floats)
                    }
                    kernel(xs, y)
                }};
            }
            if VNNI {
                body!("avx2,f16c,avx512f,avx512bw,avx512vl,avx512vnni", true)
            } else {
                body!("avx2,f16c", false)
            }
        }
    };
}

/// The integer products of unsigned levels with a Q8_0 or Q8_1 block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_levels<const VNNI: bool>(u: __m256i, qs: &[i8; 32]) -> __m256i {
    dot4::<VNNI>(u, load32(qs, 0))
}

/// The products of the offset `k` (every byte) with a Q8_0 block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn offset_q8_0<const VNNI: bool>(k: i8, y: &BlockQ8_0) -> __m256i {
    dot4::<VNNI>(_mm256_set1_epi8(k), load32(&y.qs, 0))
}

kernels!(
    /// `q4_0::vec_dot_ref`: `sumf += sumi * d_x * d_y`, i.e. `(sumi * d_x) * d_y`.
    vec_dot_q4_0,
    rows_q4_0,
    BlockQ4_0,
    BlockQ8_0,
    |x: &BlockQ4_0| nibbles_32(&x.qs),
    |u, y: &BlockQ8_0| dot_levels::<VNNI>(u, &y.qs),
    |y| offset_q8_0::<VNNI>(8, y),
    |x: &[BlockQ4_0], y: &[BlockQ8_0], sumi| {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sumi), dx), dy)
    }
);

/// The 5-bit levels of a Q5_0 or Q5_1 block, unsigned. With AVX-512 (`VNNI`), a masked add
/// puts in the fifth bits straight from `qh` (two instructions instead of seven).
#[inline(always)]
unsafe fn five_bits<const VNNI: bool>(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    if VNNI {
        #[inline]
        #[target_feature(enable = "avx2,avx512f,avx512bw,avx512vl")]
        unsafe fn masked(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
            let low = nibbles_32(qs);
            _mm256_mask_add_epi8(low, u32::from_le_bytes(qh), low, _mm256_set1_epi8(0x10))
        }
        masked(qs, qh)
    } else {
        #[inline]
        #[target_feature(enable = "avx2")]
        unsafe fn spread(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
            _mm256_or_si256(nibbles_32(qs), fifth_bits_32(qh))
        }
        spread(qs, qh)
    }
}

kernels!(
    /// `q5_0::vec_dot_ref`: `sumf += (d_x * d_y) * sumi`.
    vec_dot_q5_0,
    rows_q5_0,
    BlockQ5_0,
    BlockQ8_0,
    |x: &BlockQ5_0| five_bits::<VNNI>(&x.qs, x.qh),
    |u, y: &BlockQ8_0| dot_levels::<VNNI>(u, &y.qs),
    |y| offset_q8_0::<VNNI>(16, y),
    |x: &[BlockQ5_0], y: &[BlockQ8_0], sumi| {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi))
    }
);

/// With VNNI, a Q8_0 weight block's values plus 128 (unsigned); without, the values themselves.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_levels<const VNNI: bool>(x: &BlockQ8_0) -> __m256i {
    let xv = load32(&x.qs, 0);
    if VNNI {
        _mm256_xor_si256(xv, _mm256_set1_epi8(-128))
    } else {
        xv
    }
}

/// The integer products of [`q8_0_levels`] with a Q8_0 block.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_dot<const VNNI: bool>(u: __m256i, y: &BlockQ8_0) -> __m256i {
    let yv = load32(&y.qs, 0);
    if VNNI {
        dpbusd(_mm256_setzero_si256(), u, yv)
    } else {
        // Both operands signed and possibly -128: widen to i16 (`maddubs` could saturate).
        let lo = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(u)),
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(yv)),
        );
        let hi = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(u, 1)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256(yv, 1)),
        );
        _mm256_add_epi32(lo, hi)
    }
}

/// With VNNI, the 128 added to the weights times the activations (`(x + 128) * y` summed, less
/// `128 * Σ y`, is exact in i32); without, nothing.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn q8_0_offset<const VNNI: bool>(y: &BlockQ8_0) -> __m256i {
    if VNNI {
        dpbusd(_mm256_setzero_si256(), _mm256_set1_epi8(-128), load32(&y.qs, 0))
    } else {
        _mm256_setzero_si256()
    }
}

kernels!(
    /// `q8_0::vec_dot_ref`: `sumf += sumi * (d_x * d_y)`.
    vec_dot_q8_0,
    rows_q8_0,
    BlockQ8_0,
    BlockQ8_0,
    q8_0_levels::<VNNI>,
    q8_0_dot::<VNNI>,
    q8_0_offset::<VNNI>,
    |x: &[BlockQ8_0], y: &[BlockQ8_0], sumi| {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(dx, dy))
    }
);

/// The `(d_x * d_y) * sumi + m_x * s_y` terms of the Q4_1 and Q5_1 references.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn min_floats<W: bytemuck::Pod>(x: &[W], y: &[BlockQ8_1], sumi: __m256i) -> __m256 {
    let ((dx, mx), (dy, sy)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
    let scaled = _mm256_mul_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(sumi));
    _mm256_add_ps(scaled, _mm256_mul_ps(mx, sy))
}

kernels!(
    /// `q4_1::vec_dot_ref`.
    vec_dot_q4_1,
    rows_q4_1,
    BlockQ4_1,
    BlockQ8_1,
    |x: &BlockQ4_1| nibbles_32(&x.qs),
    |u, y: &BlockQ8_1| dot_levels::<VNNI>(u, &y.qs),
    |_: &BlockQ8_1| _mm256_setzero_si256(),
    min_floats
);

kernels!(
    /// `q5_1::vec_dot_ref`.
    vec_dot_q5_1,
    rows_q5_1,
    BlockQ5_1,
    BlockQ8_1,
    |x: &BlockQ5_1| five_bits::<VNNI>(&x.qs, x.qh),
    |u, y: &BlockQ8_1| dot_levels::<VNNI>(u, &y.qs),
    |_: &BlockQ8_1| _mm256_setzero_si256(),
    min_floats
);

kernels!(
    /// `iq4_nl::vec_dot_ref`: `sumf += (d_y * d_x) * sumi`, the levels from the table.
    vec_dot_iq4_nl,
    rows_iq4_nl,
    BlockIq4Nl,
    BlockQ8_0,
    |x: &BlockIq4Nl| table_32(&x.qs, &iq4_nl::KVALUES),
    |w, y: &BlockQ8_0| dot_signed::<VNNI>(w, load32(&y.qs, 0)),
    |_: &BlockQ8_0| _mm256_setzero_si256(),
    |x: &[BlockIq4Nl], y: &[BlockQ8_0], sumi| {
        let ((dx, _), (dy, _)) = (f16_pairs(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(dy, dx), _mm256_cvtepi32_ps(sumi))
    }
);

/// `GGML_E8M0_TO_FP32_HALF` of the exponent in the low byte of each i32 lane: `(e - 1) << 23`,
/// or for `e < 2` the subnormal `0x200000 << e`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn e8m0_halves(heads: __m256i) -> __m256 {
    let e = _mm256_and_si256(heads, _mm256_set1_epi32(0xff));
    let normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
}

kernels!(
    /// `mxfp4::vec_dot_ref`: `sumf += (d_y * scale / 2) * sumi`, the doubled E2M1 values from
    /// the table.
    vec_dot_mxfp4,
    rows_mxfp4,
    BlockMxfp4,
    BlockQ8_0,
    |x: &BlockMxfp4| table_32(&x.qs, &mxfp4::KVALUES),
    |w, y: &BlockQ8_0| dot_signed::<VNNI>(w, load32(&y.qs, 0)),
    |_: &BlockQ8_0| _mm256_setzero_si256(),
    |x: &[BlockMxfp4], y: &[BlockQ8_0], sumi| {
        let (dx, (dy, _)) = (e8m0_halves(heads8(x)), f16_pairs(heads8(y)));
        _mm256_mul_ps(_mm256_mul_ps(dy, dx), _mm256_cvtepi32_ps(sumi))
    }
);
