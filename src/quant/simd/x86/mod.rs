//! x86-64 kernels: AVX2 (with F16C), and the same kernels with AVX-512 VNNI's `vpdpbusd` and
//! `vpdpwssd` at 256 bits in place of the AVX2 multiply-add pairs (`const VNNI: bool`).
//!
//! Every kernel computes each block's integer dot product exactly (in any lane arrangement; the
//! integer sums are order-free) and then does the reference's float operations, in the
//! reference's order, with separate IEEE multiplies and adds: products of the same f32 values
//! round identically in a vector lane and in a scalar register, and no kernel fuses a multiply
//! into an add or reassociates a float sum. The results are therefore bit-identical to the
//! scalar references for every input, including the extremes (-128 activations, zero scales)
//! that the quantizers never produce.
//!
//! The 32-value block kernels (`legacy`) compile their VNNI body with AVX-512 F, BW and VL
//! enabled (byte masks for Q5_0's fifth bits; 32 vector registers), their AVX2 body without.
//! The 256-bit kernels emit the AVX-512 VNNI instructions through `asm!` on `ymm` registers, as
//! they were written before the crate's minimum Rust reached 1.89 (which stabilised the
//! `avx512*` intrinsics and target features); the 512-bit panel kernel of `gemm` uses the
//! intrinsics. The functions using either only run after run-time detection of the features
//! (see `super::Isa::Avx512` and `crate::quant::gemm::kernel`).
//!
//! The dot products take their rows as bytes and are the entries of the type table
//! (`crate::quant::traits`) as they are; a type's kernels here and its row there are all it
//! takes to dispatch them.
//!
//! `amx` holds the AMX tile products of the prompt's panel kernels and the check that the CPU
//! and the OS allow them (its one safe entry point).
//!
//! All kernels here are `unsafe` because they require CPU features: callers must have
//! checked that the CPU has AVX2 and F16C (and AVX-512 F, VL, BW and VNNI when `VNNI` is true).
//! Memory accesses are all within the fixed-size arrays or slices whose bounds are checked.

pub(crate) mod amx;
pub(in crate::quant) mod float;
pub(crate) mod gemm;
pub(crate) mod gemm_k;
pub(in crate::quant) mod iq_quants;
pub(in crate::quant) mod k_quants;
pub(in crate::quant) mod legacy;

use std::arch::asm;
use std::arch::x86_64::*;

/// The byte rows of a dot product as blocks: the weight row `x` as `W`, the activation rows `ys`
/// as `A`. The kernels take bytes so that the type table can hold them as they are (one call per
/// dot product, no wrapper in between).
///
/// # Panics
/// If a row is not aligned for its blocks or not a whole number of them; the table's safe
/// entries (`crate::quant::traits::BlockDots`) pass only rows that are.
#[inline(always)]
fn block_rows<'a, W: bytemuck::Pod, A: bytemuck::Pod, const N: usize>(
    x: &'a [u8],
    ys: [&'a [u8]; N],
) -> (&'a [W], [&'a [A]; N]) {
    (bytemuck::cast_slice(x), ys.map(bytemuck::cast_slice))
}

/// How far ahead of the weight block in hand the kernels prefetch, in bytes. Weight rows stream
/// from memory once per product and a matmul's rows are contiguous, so the hint runs on into the
/// next row. A single core's hardware prefetcher keeps too few lines in flight on its own:
/// prefetching 4 KiB ahead streamed rows 20-35% faster in measurements on an AVX-512 Xeon.
const PREFETCH_DISTANCE: usize = 4096;

/// Prefetches the cache lines `PREFETCH_DISTANCE` bytes past the start of each 64-byte stretch
/// of `blocks`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_ahead<T>(blocks: &[T]) {
    prefetch_past(blocks, PREFETCH_DISTANCE)
}

/// Prefetches the cache lines `distance` bytes past the start of each 64-byte stretch of
/// `blocks`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn prefetch_past<T>(blocks: &[T], distance: usize) {
    let ahead = blocks.as_ptr().cast::<i8>().wrapping_add(distance);
    let mut offset = 0;
    while offset < std::mem::size_of_val(blocks) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(offset));
        offset += 64;
    }
}

/// `acc + Σ a[4i + k] * b[4i + k]` over `k` in each i32 lane, `a` unsigned and `b` signed bytes,
/// without saturation (`vpdpbusd`, AVX-512 VNNI + VL, EVEX-encoded at 256 bits).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: a register-only instruction; the caller has checked AVX-512 VNNI and VL.
    asm!(
        "{{evex}} vpdpbusd {acc}, {a}, {b}",
        acc = inout(ymm_reg) acc,
        a = in(ymm_reg) a,
        b = in(ymm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `acc + a[2i] * b[2i] + a[2i + 1] * b[2i + 1]` in each i32 lane, signed 16-bit `a` and `b`
/// (`vpdpwssd`, AVX-512 VNNI + VL, EVEX-encoded at 256 bits).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    let mut acc = acc;
    // SAFETY: as for `dpbusd`.
    asm!(
        "{{evex}} vpdpwssd {acc}, {a}, {b}",
        acc = inout(ymm_reg) acc,
        a = in(ymm_reg) a,
        b = in(ymm_reg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// `acc + madd(a, b)`: i16 pairs multiplied and summed into i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn madd_acc<const VNNI: bool>(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
    if VNNI {
        dpwssd(acc, a, b)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }
}

/// Sums of four consecutive `u * s` byte products in i32 lanes. Without VNNI this goes through
/// `maddubs`, which saturates pairs to i16: every caller keeps `u <= 63` so that a pair is at most
/// `2 * 63 * 128` in magnitude.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot4<const VNNI: bool>(u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        dpbusd(_mm256_setzero_si256(), u, s)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }
}

/// The 32 bytes of `bytes` from element `at` on.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load32<T: Copy>(bytes: &[T], at: usize) -> __m256i {
    const { assert!(32 % std::mem::size_of::<T>() == 0) };
    let bytes = &bytes[at..at + 32 / std::mem::size_of::<T>()];
    // SAFETY: the slice above is 32 bytes long.
    _mm256_loadu_si256(bytes.as_ptr().cast())
}

/// The 16 bytes of `bytes` from element `at` on.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load16<T: Copy>(bytes: &[T], at: usize) -> __m128i {
    const { assert!(16 % std::mem::size_of::<T>() == 0) };
    let bytes = &bytes[at..at + 16 / std::mem::size_of::<T>()];
    // SAFETY: the slice above is 16 bytes long.
    _mm_loadu_si128(bytes.as_ptr().cast())
}

/// 16 packed nibbles as 32 bytes: the low nibbles of `qs` first, then the high nibbles (the
/// element order of the 32-value blocks).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn nibbles_32(qs: &[u8; 16]) -> __m256i {
    // A broadcast load and a blend rather than an insert: no shuffle-port uop.
    let both = _mm256_broadcastsi128_si256(load16(qs, 0));
    let split = _mm256_blend_epi32(both, _mm256_srli_epi16(both, 4), 0b1111_0000);
    _mm256_and_si256(split, _mm256_set1_epi8(0x0f))
}

/// The signed values `table[index]` of a 32-value block of 4-bit indices packed as Q4_0 packs
/// its levels (weight `j` in the low nibble of `qs[j]`, `j + 16` in the high one): IQ4_NL's
/// and MXFP4's codebooks, one `pshufb`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn table_32(qs: &[u8; 16], table: &[i8; 16]) -> __m256i {
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(load16(table, 0)), nibbles_32(qs))
}

/// A 4-bit table of signed values (IQ4_NL's, MXFP4's) with every value 128 up, as unsigned
/// bytes for `vpdpbusd` (the kernels take `128 * Σ activations` back out).
const fn table_128(table: &[i8; 16]) -> [i8; 16] {
    let mut out = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        out[i] = (table[i] as i32 + 128) as u8 as i8;
        i += 1;
    }
    out
}

/// IQ4_NL's table (IQ4_XS's too) 128 up: 1..=241.
const IQ4_NL_128: [i8; 16] = table_128(&crate::quant::iq4_nl::KVALUES);
/// MXFP4's table 128 up: 116..=140.
const MXFP4_128: [i8; 16] = table_128(&crate::quant::mxfp4::KVALUES);

/// Sums of four consecutive products of the signed bytes `w` (never -128) and `y` (any) in i32
/// lanes, exactly: `|y|` times `w` with `y`'s sign, where `|-128|` is the unsigned byte 128, so
/// that `maddubs`' pairs stay within `2 * 128 * 127` and never saturate.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn dot_signed<const VNNI: bool>(w: __m256i, y: __m256i) -> __m256i {
    let (abs_y, signed_w) = (_mm256_abs_epi8(y), _mm256_sign_epi8(w, y));
    if VNNI {
        dpbusd(_mm256_setzero_si256(), abs_y, signed_w)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(abs_y, signed_w), _mm256_set1_epi16(1))
    }
}

/// Byte `i` is 0x10 where bit `i` of the little-endian `qh` is set, 0 elsewhere: the fifth bit
/// of the 5-bit 32-value blocks.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn fifth_bits_32(qh: [u8; 4]) -> __m256i {
    // Byte i takes byte i / 8 of qh; every bit but i % 8 is then set, so the byte is all ones
    // exactly when bit i % 8 was.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(i32::from_le_bytes(qh)),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// The lane sums of eight i32 vectors, in order: lane `i` of the result is the sum of `v[i]`.
///
/// A transposing reduction written as blends and one shuffle per addition (blends are cheap,
/// shuffles share a port); the compiler may still choose an equivalent sequence of its own.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_8x8(v: &[__m256i; 8]) -> __m256i {
    // Lane 2k of pair(a, b) holds a[2k] + a[2k + 1], lane 2k + 1 holds b[2k] + b[2k + 1].
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn pair(a: __m256i, b: __m256i) -> __m256i {
        let even_odd = _mm256_blend_epi32(a, b, 0b1010_1010);
        let odd_even = _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0b1010_1010), 0b10_11_00_01);
        _mm256_add_epi32(even_odd, odd_even)
    }
    // The same one level up: lanes 4h + j hold the half-h sum of input j.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn quad(a: __m256i, b: __m256i) -> __m256i {
        let low_high = _mm256_blend_epi32(a, b, 0b1100_1100);
        let high_low = _mm256_shuffle_epi32(_mm256_blend_epi32(b, a, 0b1100_1100), 0b01_00_11_10);
        _mm256_add_epi32(low_high, high_low)
    }
    let q0 = quad(pair(v[0], v[1]), pair(v[2], v[3]));
    let q1 = quad(pair(v[4], v[5]), pair(v[6], v[7]));
    let own_halves = _mm256_blend_epi32(q0, q1, 0b1111_0000);
    let other_halves = _mm256_permute2x128_si256(q0, q1, 0x21);
    _mm256_add_epi32(own_halves, other_halves)
}

/// The rows `ys` cut to the common length of all rows and `x`.
#[inline]
pub(super) fn common_len<'a, W, const N: usize>(
    x: &[W],
    ys: [&'a [crate::quant::q8_k::BlockQ8K]; N],
) -> (usize, [&'a [crate::quant::q8_k::BlockQ8K]; N]) {
    let n = ys.iter().fold(x.len(), |n, y| n.min(y.len()));
    let mut cut: [&[crate::quant::q8_k::BlockQ8K]; N] = [&[]; N];
    for (c, y) in cut.iter_mut().zip(ys) {
        *c = &y[..n];
    }
    (n, cut)
}

/// The sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

/// The first four bytes of each of up to eight blocks, one block per i32 lane (lanes past the
/// end repeat the last block; `blocks` must not be empty), gathered with broadcasts and blends.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn heads8<B: bytemuck::Pod>(blocks: &[B]) -> __m256i {
    const { assert!(std::mem::size_of::<B>() >= 4) };
    assert!(!blocks.is_empty(), "heads8 of no blocks");
    // A whole chunk (the usual case) reads at constant offsets; a short one repeats its last.
    let last = if blocks.len() >= 8 { 7 } else { blocks.len() - 1 };
    let base = blocks.as_ptr();
    // SAFETY: `k.min(last)` indexes `blocks`, and every block has at least four bytes.
    let head = |k: usize| unsafe { base.add(k.min(last)).cast::<i32>().read_unaligned() };
    let mut v = _mm256_set1_epi32(head(0));
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(1)), 0b0000_0010);
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(2)), 0b0000_0100);
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(3)), 0b0000_1000);
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(4)), 0b0001_0000);
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(5)), 0b0010_0000);
    v = _mm256_blend_epi32(v, _mm256_set1_epi32(head(6)), 0b0100_0000);
    _mm256_blend_epi32(v, _mm256_set1_epi32(head(7)), 0b1000_0000)
}

/// The F16 values in the low and in the high 16 bits of each i32 lane of `v`, widened exactly
/// to f32 (for block heads `d` and `m` or `s`).
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn f16_pairs(v: __m256i) -> (__m256, __m256) {
    let split = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, //
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
    );
    // Per half: the low fields, then the high fields; then the low fields of both halves first.
    let q = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, split), 0b11_01_10_00);
    (
        _mm256_cvtph_ps(_mm256_castsi256_si128(q)),
        _mm256_cvtph_ps(_mm256_extracti128_si256(q, 1)),
    )
}

/// The lanes of four vectors by lane: element `k` holds lane `k` of `v[0]`, `v[1]`, `v[2]` and
/// `v[3]`, in that order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_4x8(v: [__m256; 4]) -> [__m128; 8] {
    let (t0, t1) = (_mm256_unpacklo_ps(v[0], v[1]), _mm256_unpackhi_ps(v[0], v[1]));
    let (t2, t3) = (_mm256_unpacklo_ps(v[2], v[3]), _mm256_unpackhi_ps(v[2], v[3]));
    // u_j holds lanes j (low half) and j + 4 (high half).
    let u = [
        _mm256_shuffle_ps(t0, t2, 0x44),
        _mm256_shuffle_ps(t0, t2, 0xee),
        _mm256_shuffle_ps(t1, t3, 0x44),
        _mm256_shuffle_ps(t1, t3, 0xee),
    ];
    std::array::from_fn(|k| {
        if k < 4 {
            _mm256_castps256_ps128(u[k])
        } else {
            _mm256_extractf128_ps(u[k - 4], 1)
        }
    })
}

/// The f32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn lanes_f32(v: __m256) -> [f32; 8] {
    let mut out = [0.0f32; 8];
    // SAFETY: `out` holds 8 f32.
    _mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}
