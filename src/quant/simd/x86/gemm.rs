//! The AVX-512 VNNI panel kernel behind [`crate::quant::gemm`]: 16 weight rows of a 32-value
//! block type against a tile of up to 8 token rows, one `vpdpbusd` per four values of a block
//! for all 16 rows at once. Repacked weights (`crate::quant::repack`) are read by the same
//! arithmetic: `repacked_tile` takes the panel's vectors straight from a record.
//!
//! A panel is first unpacked into a row-interleaved form (`pack`): for block `b` and value group
//! `g` (values `4g..4g+4`), the 16 rows' four unsigned levels sit side by side in one 64-byte
//! vector. A token's four activation bytes are broadcast against it, so each i32 lane ends the
//! block holding one row's exact integer block sum, with no horizontal reduction. The level
//! offset of the types without a minimum (8, 16 or 128) is taken out exactly by starting the
//! sum at `-offset * Σ activations`. The float part is then the reference's per-block
//! expression, lane-wise, with separate multiplies and adds in the reference's order, added to
//! each row's running sum block by block as the reference adds it: every output is bit-identical
//! to the type's `vec_dot_ref`.
//!
//! `amx_panel_tile` runs a panel against 16 tokens with AMX tile products (`super::amx`) instead
//! of `vpdpbusd`, and the same float steps (`block_value`); `unpack_records` expands repacked
//! records into a panel for it, since the tiles read their levels from memory.
//!
//! This file must not decide when the kernel applies; `crate::quant::gemm` checks the sizes and
//! the CPU, and these functions trust those checks.

use super::*;
use crate::quant::fp16::f16_to_f32;

/// Rows per panel: one i32 lane of a 512-bit vector each.
pub(crate) const PANEL: usize = 16;
/// Most token rows per tile: one f32 accumulator vector each, beside the eight weight vectors.
pub(crate) const TILE: usize = 8;

/// The 32-value block types, as the const parameter of the kernels.
pub(crate) const Q4_0: u8 = 0;
pub(crate) const Q4_1: u8 = 1;
pub(crate) const Q5_0: u8 = 2;
pub(crate) const Q5_1: u8 = 3;
pub(crate) const Q8_0: u8 = 4;
pub(crate) const IQ4_NL: u8 = 5;
pub(crate) const MXFP4: u8 = 6;

/// Whether blocks of `KIND` carry a minimum (and take Q8_1 activations).
pub(crate) const fn has_min(kind: u8) -> bool {
    kind == Q4_1 || kind == Q5_1
}

/// The offset of `KIND`'s unsigned levels, as a power of two (`level = value + 2^shift`);
/// unused for the types with a minimum, whose levels are the values.
const fn offset_shift(kind: u8) -> u32 {
    match kind {
        Q4_0 => 3,
        Q5_0 => 4,
        _ => 7,
    }
}

/// The 32 unsigned levels of the block `blk` (its bytes), in activation order.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn levels<const KIND: u8>(blk: &[u8]) -> __m256i {
    let qs = |at: usize| -> &[u8; 16] { blk[at..at + 16].try_into().expect("16 bytes") };
    let qh = |at: usize| -> [u8; 4] { blk[at..at + 4].try_into().expect("4 bytes") };
    match KIND {
        Q4_0 => nibbles_32(qs(2)),
        Q4_1 => nibbles_32(qs(4)),
        Q5_0 => _mm256_or_si256(nibbles_32(qs(6)), fifth_bits_32(qh(2))),
        Q5_1 => _mm256_or_si256(nibbles_32(qs(8)), fifth_bits_32(qh(4))),
        IQ4_NL => table_32(qs(2), &IQ4_NL_128),
        MXFP4 => table_32(qs(1), &MXFP4_128),
        _ => _mm256_xor_si256(load32(blk, 2), _mm256_set1_epi8(-128)),
    }
}

/// Unpacks the rows `rows` (at most [`PANEL`]) of the weight `w` (`nb` blocks of `bsize` bytes
/// per row) into `pack` (`nb * 128` words), their scales into `dx` and minimums into `mx`
/// (`nb * 16` values each). Lanes past the rows are zero.
///
/// # Safety
/// The CPU has AVX2; `w` holds the rows, `pack`, `dx` and `mx` the sizes above.
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn unpack_panel<const KIND: u8>(
    w: &[u8],
    bsize: usize,
    nb: usize,
    rows: std::ops::Range<usize>,
    pack: &mut [u32],
    dx: &mut [f32],
    mx: &mut [f32],
) {
    for r in 0..PANEL {
        let row = rows.start + r;
        for b in 0..nb {
            if row >= rows.end {
                for g in 0..8 {
                    pack[b * 128 + g * 16 + r] = 0;
                }
                dx[b * 16 + r] = 0.0;
                mx[b * 16 + r] = 0.0;
                continue;
            }
            let blk = &w[(row * nb + b) * bsize..][..bsize];
            let mut words = [0u32; 8];
            _mm256_storeu_si256(words.as_mut_ptr().cast(), levels::<KIND>(blk));
            for (g, &word) in words.iter().enumerate() {
                pack[b * 128 + g * 16 + r] = word;
            }
            dx[b * 16 + r] = if KIND == MXFP4 {
                crate::quant::mxfp4::e8m0_to_f32_half(blk[0])
            } else {
                f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]))
            };
            mx[b * 16 + r] = if has_min(KIND) {
                f16_to_f32(u16::from_le_bytes([blk[2], blk[3]]))
            } else {
                0.0
            };
        }
    }
}

/// An unpacked panel ([`unpack_panel`]) of `nb` blocks.
pub(crate) struct Panel<'a> {
    pub pack: &'a [u32],
    pub dx: &'a [f32],
    pub mx: &'a [f32],
    pub nb: usize,
}

/// The activations of a tile: `T` token rows of quantized blocks and their per-block terms.
pub(crate) struct TileActivations<'a> {
    /// The token rows (Q8_0 or Q8_1 blocks), the first of the tile at 0.
    pub data: &'a [u8],
    /// Bytes per token row and per block, and the offset of `qs` in a block.
    pub row_bytes: usize,
    pub block_bytes: usize,
    pub qs_offset: usize,
    /// Per token and block, the tile's first token at 0: the scale, and `Σ qs` (Q8_0) or the
    /// bits of the f32 scaled sum `s` (Q8_1).
    pub d: &'a [f32],
    pub aux: &'a [i32],
}

/// Block `b` of 16 rows (their levels `w`, scales `dxv` and minimums `mxv`) against the `T`
/// token rows of `a` (`nb` blocks each): each row's term, the reference's per-block float
/// expression, added to its running sum in `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn add_block<const KIND: u8, const T: usize>(
    w: &[__m512i; 8],
    dxv: __m512,
    mxv: __m512,
    a: &TileActivations<'_>,
    nb: usize,
    b: usize,
    acc: &mut [__m512; T],
) {
    let shift = offset_shift(KIND);
    for (t, acc) in acc.iter_mut().enumerate() {
        let term = t * nb + b;
        let qs = a.data.as_ptr().add(t * a.row_bytes + b * a.block_bytes + a.qs_offset);
        let bcast = |g: usize| _mm512_set1_epi32(qs.add(4 * g).cast::<i32>().read_unaligned());
        let aux = *a.aux.get_unchecked(term);
        let start = if has_min(KIND) {
            _mm512_setzero_si512()
        } else {
            _mm512_set1_epi32(-(aux << shift))
        };
        // Two chains for latency; integer sums are exact in any order.
        let mut s0 = _mm512_dpbusd_epi32(start, w[0], bcast(0));
        let mut s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[1], bcast(1));
        s0 = _mm512_dpbusd_epi32(s0, w[2], bcast(2));
        s1 = _mm512_dpbusd_epi32(s1, w[3], bcast(3));
        s0 = _mm512_dpbusd_epi32(s0, w[4], bcast(4));
        s1 = _mm512_dpbusd_epi32(s1, w[5], bcast(5));
        s0 = _mm512_dpbusd_epi32(s0, w[6], bcast(6));
        s1 = _mm512_dpbusd_epi32(s1, w[7], bcast(7));
        *acc = _mm512_add_ps(
            *acc,
            block_value::<KIND>(_mm512_add_epi32(s0, s1), dxv, mxv, *a.d.get_unchecked(term), aux),
        );
    }
}

/// The reference's per-block float expression for 16 rows' exact integer block sums `sumi`
/// (the level offset already taken out), their scales `dxv` and minimums `mxv`, and a token's
/// block scale `d_y` and term `aux` (the bits of `s_y` for the types with a minimum).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn block_value<const KIND: u8>(sumi: __m512i, dxv: __m512, mxv: __m512, d_y: f32, aux: i32) -> __m512 {
    let sumi = _mm512_cvtepi32_ps(sumi);
    let dy = _mm512_set1_ps(d_y);
    match KIND {
        // `sumi * d_x * d_y`
        Q4_0 => _mm512_mul_ps(_mm512_mul_ps(sumi, dxv), dy),
        // `(d_x * d_y) * sumi + m_x * s_y`
        Q4_1 | Q5_1 => {
            let sy = _mm512_set1_ps(f32::from_bits(aux as u32));
            _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(dxv, dy), sumi), _mm512_mul_ps(mxv, sy))
        }
        // `(d_x * d_y) * sumi` (Q5_0), `sumi * (d_x * d_y)` (Q8_0), `(d_y * d_x) * sumi`
        // (IQ4_NL, MXFP4): the same products.
        _ => _mm512_mul_ps(_mm512_mul_ps(dxv, dy), sumi),
    }
}

/// One panel against 16 token rows through tile products (`super::amx`): per block, one
/// product gives every token's integer sums for the 16 rows, the level offset is taken out
/// (`-offset * Σ activations`, as [`add_block`] starts its sums), and the float part is
/// [`block_value`]'s. `y[t * stride + r]` for the panel's row `r` in the lanes set in `mask`.
///
/// # Safety
/// The CPU has AVX-512 F and BW, and `tiles` runs products; `p` holds a panel of `nb` blocks;
/// `a` holds 16 token rows of `nb` blocks and `16 * nb` terms; `y` holds `15 * stride + 16`
/// values, or as many fewer as the high lanes `mask` leaves out.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn amx_panel_tile<const KIND: u8>(
    tiles: &mut impl super::amx::TileUnit,
    p: &Panel<'_>,
    a: &TileActivations<'_>,
    y: &mut [f32],
    stride: usize,
    mask: u16,
) {
    const T: usize = super::amx::ROWS;
    let Panel { pack, dx, mx, nb } = *p;
    assert!(pack.len() >= nb * 128 && dx.len() >= nb * 16 && mx.len() >= nb * 16);
    assert!(a.data.len() >= (T - 1) * a.row_bytes + nb * a.block_bytes);
    assert!(a.qs_offset + 32 <= a.block_bytes);
    assert!(a.d.len() >= T * nb && a.aux.len() >= T * nb);
    assert!(y.len() >= (T - 1) * stride + (16 - mask.leading_zeros() as usize));
    let shift = offset_shift(KIND);
    let mut sums = [0i32; T * 16];
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let tokens = a.data.as_ptr().add(b * a.block_bytes + a.qs_offset);
        tiles.product(32, tokens, a.row_bytes, pack.as_ptr().add(b * 128).cast(), &mut sums);
        let dxv = _mm512_loadu_ps(dx.as_ptr().add(b * 16));
        let mxv = _mm512_loadu_ps(mx.as_ptr().add(b * 16));
        for (t, acc) in acc.iter_mut().enumerate() {
            let term = t * nb + b;
            let aux = *a.aux.get_unchecked(term);
            let mut sumi = _mm512_loadu_si512(sums.as_ptr().add(t * 16).cast());
            if !has_min(KIND) {
                sumi = _mm512_sub_epi32(sumi, _mm512_set1_epi32(aux << shift));
            }
            *acc = _mm512_add_ps(*acc, block_value::<KIND>(sumi, dxv, mxv, *a.d.get_unchecked(term), aux));
        }
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(y.as_mut_ptr().add(t * stride), mask, *acc);
    }
}

/// Bytes of a repacked record's levels and fifth-bit masks, before its scales
/// (`crate::quant::repack`).
const fn record_levels_bytes(kind: u8) -> usize {
    match kind {
        Q8_0 => 512,
        Q5_0 | Q5_1 => 256 + 64,
        _ => 256,
    }
}

/// Bytes of a repacked record: 16 blocks.
pub(crate) const fn record_bytes(kind: u8) -> usize {
    record_levels_bytes(kind)
        + match kind {
            MXFP4 => 16,
            _ if has_min(kind) => 64,
            _ => 32,
        }
}

/// Whether `crate::quant::repack` writes records of `ty` as long as [`record_bytes`] of `kind`.
const fn same_record(ty: crate::quant::GgmlType, kind: u8) -> bool {
    matches!(crate::quant::repack::record_bytes(ty), Some(n) if n == record_bytes(kind))
}

// The records these kernels read are those `crate::quant::repack` writes.
const _: () = {
    use crate::quant::GgmlType;
    assert!(same_record(GgmlType::Q4_0, Q4_0) && same_record(GgmlType::Q4_1, Q4_1));
    assert!(same_record(GgmlType::Q5_0, Q5_0) && same_record(GgmlType::Q5_1, Q5_1));
    assert!(same_record(GgmlType::Q8_0, Q8_0));
    assert!(same_record(GgmlType::IQ4_NL, IQ4_NL) && same_record(GgmlType::MXFP4, MXFP4));
};

/// The eight level vectors of the repacked record at `rec`, as [`unpack_panel`] lays out a
/// block of a panel.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn record_levels<const KIND: u8>(rec: *const u8) -> [__m512i; 8] {
    let load = |at: usize| _mm512_loadu_si512(rec.add(at).cast());
    if KIND == Q8_0 {
        return std::array::from_fn(|g| load(64 * g));
    }
    let low = _mm512_set1_epi8(0x0f);
    let v: [__m512i; 4] = std::array::from_fn(|k| load(64 * k));
    let mut l: [__m512i; 8] = std::array::from_fn(|g| {
        if g < 4 {
            _mm512_and_si512(v[g], low)
        } else {
            _mm512_and_si512(_mm512_srli_epi16(v[g - 4], 4), low)
        }
    });
    if KIND == IQ4_NL || KIND == MXFP4 {
        // The nibbles index the table of levels (128 up), as `levels` reads a block.
        let table = match KIND {
            IQ4_NL => &IQ4_NL_128,
            _ => &MXFP4_128,
        };
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(table.as_ptr().cast()));
        for l in l.iter_mut() {
            *l = _mm512_shuffle_epi8(table, *l);
        }
    }
    if KIND == Q5_0 || KIND == Q5_1 {
        let five = _mm512_set1_epi8(0x10);
        for (g, l) in l.iter_mut().enumerate() {
            let mask = rec.add(256 + 8 * g).cast::<u64>().read_unaligned();
            *l = _mm512_mask_add_epi8(*l, u64::from_le(mask), *l, five);
        }
    }
    l
}

/// The scales and minimums (zero for the types without) of the repacked record at `rec`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn record_scales<const KIND: u8>(rec: *const u8) -> (__m512, __m512) {
    let at = record_levels_bytes(KIND);
    let dxv = if KIND == MXFP4 {
        // `e8m0_to_f32_half` on 16 lanes: `(e - 1) << 23`, the two smallest as subnormals.
        let e = _mm512_cvtepu8_epi32(_mm_loadu_si128(rec.add(at).cast()));
        let normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
        let subnormal = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
        let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
        _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, subnormal))
    } else {
        _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(at).cast()))
    };
    let mxv = if has_min(KIND) {
        _mm512_cvtph_ps(_mm256_loadu_si256(rec.add(at + 32).cast()))
    } else {
        _mm512_setzero_ps()
    };
    (dxv, mxv)
}

/// Expands a group's repacked records (`nb` of them) into a panel, as [`unpack_panel`] lays
/// out the file's blocks: the tile products read their levels from memory.
///
/// # Safety
/// The CPU has AVX-512 F and BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn unpack_records<const KIND: u8>(
    records: &[u8],
    nb: usize,
    pack: &mut [u32],
    dx: &mut [f32],
    mx: &mut [f32],
) {
    assert!(records.len() >= nb * record_bytes(KIND) && pack.len() >= nb * 128);
    assert!(dx.len() >= nb * 16 && mx.len() >= nb * 16);
    for b in 0..nb {
        let rec = records.as_ptr().add(b * record_bytes(KIND));
        for (g, levels) in record_levels::<KIND>(rec).into_iter().enumerate() {
            _mm512_storeu_si512(pack.as_mut_ptr().add(b * 128 + g * 16).cast(), levels);
        }
        let (dxv, mxv) = record_scales::<KIND>(rec);
        _mm512_storeu_ps(dx.as_mut_ptr().add(b * 16), dxv);
        _mm512_storeu_ps(mx.as_mut_ptr().add(b * 16), mxv);
    }
}

/// A group of 16 repacked rows (`records`: `nb` records) against `T` token rows, reading the
/// levels straight from the records: `y[t * stride + r]` for the group's row `r`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `records` holds `nb` records of `KIND`; `a` holds `T`
/// token rows of `nb` blocks and `T * nb` terms; `y` holds `(T - 1) * stride + 16` values.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn repacked_tile<const KIND: u8, const T: usize>(
    records: &[u8],
    nb: usize,
    a: &TileActivations<'_>,
    y: &mut [f32],
    stride: usize,
) {
    assert!(records.len() >= nb * record_bytes(KIND));
    assert!(y.len() >= (T - 1) * stride + 16);
    debug_assert!(a.data.len() >= (T - 1) * a.row_bytes + nb * a.block_bytes);
    debug_assert!(a.d.len() >= T * nb && a.aux.len() >= T * nb);
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let record = &records[b * record_bytes(KIND)..(b + 1) * record_bytes(KIND)];
        // The records stream from memory: ask for those ahead.
        prefetch_ahead(record);
        let rec = record.as_ptr();
        let w = record_levels::<KIND>(rec);
        let (dxv, mxv) = record_scales::<KIND>(rec);
        add_block::<KIND, T>(&w, dxv, mxv, a, nb, b, &mut acc);
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_storeu_ps(y.as_mut_ptr().add(t * stride), *acc);
    }
}

/// One panel against `T` token rows: `y[t * stride + r]` for the panel's row `r` in the lanes
/// set in `mask`.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; `p` holds a panel of `nb` blocks; `a` holds `T` token rows of `nb` blocks and `T * nb` terms; `y` holds
/// `(T - 1) * stride + 16` values, or as many fewer as the high lanes `mask` leaves out.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(crate) unsafe fn panel_tile<const KIND: u8, const T: usize>(
    p: &Panel<'_>,
    a: &TileActivations<'_>,
    y: &mut [f32],
    stride: usize,
    mask: u16,
) {
    let Panel { pack, dx, mx, nb } = *p;
    debug_assert!(pack.len() >= nb * 128 && dx.len() >= nb * 16 && mx.len() >= nb * 16);
    debug_assert!(a.data.len() >= (T - 1) * a.row_bytes + nb * a.block_bytes);
    debug_assert!(a.d.len() >= T * nb && a.aux.len() >= T * nb);
    debug_assert!(y.len() >= (T - 1) * stride + (16 - mask.leading_zeros() as usize));
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let wp = pack.as_ptr().add(b * 128).cast::<__m512i>();
        let w: [__m512i; 8] = std::array::from_fn(|g| _mm512_loadu_si512(wp.add(g)));
        let dxv = _mm512_loadu_ps(dx.as_ptr().add(b * 16));
        let mxv = _mm512_loadu_ps(mx.as_ptr().add(b * 16));
        add_block::<KIND, T>(&w, dxv, mxv, a, nb, b, &mut acc);
    }
    for (t, acc) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(y.as_mut_ptr().add(t * stride), mask, *acc);
    }
}
