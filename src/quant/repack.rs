//! Weights repacked for the 16-row kernels, as ggml-cpu's `repack` buffers: the 32-value block
//! types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4), Q4_K and Q6_K rearranged once at load so that a
//! kernel reads each block of 16 rows straight into the row-interleaved vectors of
//! `crate::quant::gemm`'s panels (one i32 lane per row), with no unpacking into a buffer and no
//! horizontal reduction. A decode step then multiplies a block of 16 rows with a handful of
//! instructions, and a prompt does the same for a few tokens at a time (Q6_K's records are
//! expanded into the panel instead from 24 tokens on).
//!
//! The layout keeps every bit and (but for Q4_K) every byte count of the original (a record of
//! 16 blocks is 16 blocks' bytes), so a repacked matrix reads as much memory as the file's. Rows go
//! in groups of [`GROUP`]; group `G`'s block `b` is the record at `(G * nb + b) * record_bytes(ty)`:
//!
//! - levels: for Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL and MXFP4 four 64-byte vectors (the last two's
//!   nibbles index their tables), vector `k` holding bytes
//!   `4k..4k + 4` of each row's `qs` in lane `r` (the low nibbles are values `4k..`, the high
//!   ones values `16 + 4k..`); for Q8_0 eight 64-byte vectors, vector `g` holding values
//!   `4g..4g + 4` of each row plus 128 (unsigned, for `vpdpbusd`);
//! - fifth bits (Q5_0, Q5_1): eight little-endian u64 masks, bit `4r + i` of mask `g` being bit
//!   `4g + i` of row `r`'s `qh`;
//! - the 16 rows' f16 scales `d` (MXFP4: their E8M0 exponent bytes `e`), then (Q4_1, Q5_1)
//!   their f16 minimums `m`.
//!
//! Q4_K goes by super-block, a record per 16 rows' super-block: 32 vectors of nibbles, vector
//! `8c + k` holding bytes `32c + 4k..32c + 4k + 4` of each row's `qs` (low nibbles: values
//! `64c + 4k..`; high: `64c + 32 + 4k..`); then the eight 6-bit sub-block scales unpacked to
//! bytes, `[j][row]`; the eight minimums as byte pairs, `[i][row][2]` for sub-blocks `2i` and
//! `2i + 1`; the rows' f16 `d`, then `dmin`. The unpacked scales make a record 64 bytes longer
//! than its 16 blocks (2,368 against 2,304).
//!
//! Q6_K also goes by super-block, in exactly its 16 blocks' bytes (3,360): 32 vectors of `ql`,
//! vector `v` holding bytes `4v..4v + 4` of each row's `ql`; 16 vectors of `qh`, vector `u`
//! holding bytes `4u..4u + 4` of each row's `qh` (the file's bit positions kept); the 16 signed
//! sub-block scales as byte pairs, `[i][row][2]` for sub-blocks `2i` and `2i + 1`; the rows' f16
//! `d`.
//!
//! This module owns the layout and its scalar conversion; the kernels reading it are
//! `simd::x86::gemm`'s and `simd::x86::gemm_k`'s, and which weights get repacked is the
//! backend's choice. It must not do
//! arithmetic on the values: repacking moves bits only.

use super::{GgmlType, QuantError};

/// Rows per group: one i32 lane of a 512-bit vector each.
pub const GROUP: usize = 16;

/// Whether `ty` has a repacked layout.
pub fn supports(ty: GgmlType) -> bool {
    record_bytes(ty).is_some()
}

/// Bytes of one record (16 rows' block or super-block) of `ty`, if it has a layout.
pub const fn record_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0
        | GgmlType::Q4_1
        | GgmlType::Q5_0
        | GgmlType::Q5_1
        | GgmlType::Q8_0
        | GgmlType::IQ4_NL
        | GgmlType::MXFP4 => Some(GROUP * ty.type_size()),
        GgmlType::Q4_K => Some(Q4_K_RECORD),
        GgmlType::Q6_K => Some(Q6_K_RECORD),
        _ => None,
    }
}

/// Bytes of a Q4_K record: the 16 blocks' nibbles, their unpacked scales and minimums, `d` and
/// `dmin`.
pub const Q4_K_RECORD: usize = Q4_K_DMIN + 32;
/// Where a Q4_K record's scales (`[j][row]`), minimum pairs (`[i][row][2]`), `d` and `dmin`
/// start; its nibbles fill the 2,048 bytes before.
pub const Q4_K_SCALES: usize = 2048;
/// See [`Q4_K_SCALES`].
pub const Q4_K_MINS: usize = Q4_K_SCALES + 128;
/// See [`Q4_K_SCALES`].
pub const Q4_K_D: usize = Q4_K_MINS + 128;
/// See [`Q4_K_SCALES`].
pub const Q4_K_DMIN: usize = Q4_K_D + 32;

/// Bytes of a Q6_K record: exactly its 16 blocks'.
pub const Q6_K_RECORD: usize = Q6_K_D + 32;
/// Where a Q6_K record's `qh` vectors, scale pairs (`[i][row][2]`) and `d` start; its `ql`
/// vectors fill the 2,048 bytes before.
pub const Q6_K_QH: usize = 2048;
/// See [`Q6_K_QH`].
pub const Q6_K_SCALES: usize = Q6_K_QH + 1024;
/// See [`Q6_K_QH`].
pub const Q6_K_D: usize = Q6_K_SCALES + 256;
const _: () = assert!(Q6_K_RECORD == GROUP * 210);

/// Where the parts of a block sit in the original layout: the `qs` bytes, the `qh` word (Q5),
/// and the minimum `m` (Q4_1, Q5_1); the scale is always first, `scale` bytes of it (the f16
/// `d`, MXFP4's exponent byte).
struct Fields {
    scale: usize,
    qs: usize,
    qh: Option<usize>,
    m: Option<usize>,
    qs_len: usize,
}

fn fields(ty: GgmlType) -> Option<Fields> {
    let f = |qs, qh, m, qs_len| Fields {
        scale: 2,
        qs,
        qh,
        m,
        qs_len,
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::IQ4_NL => Some(f(2, None, None, 16)),
        GgmlType::MXFP4 => Some(Fields {
            scale: 1,
            ..f(1, None, None, 16)
        }),
        GgmlType::Q4_1 => Some(f(4, None, Some(2), 16)),
        GgmlType::Q5_0 => Some(f(6, Some(2), None, 16)),
        GgmlType::Q5_1 => Some(f(8, Some(4), Some(2), 16)),
        GgmlType::Q8_0 => Some(f(2, None, None, 32)),
        _ => None,
    }
}

/// A weight matrix in the repacked layout (see the module documentation).
#[derive(Clone, PartialEq, Eq)]
pub struct Repacked {
    /// The weight type whose blocks the records hold.
    pub ty: GgmlType,
    /// Values per row.
    pub n_in: usize,
    /// Rows, a multiple of [`GROUP`].
    pub n_out: usize,
    /// The records, group by group, from a 64-byte boundary.
    pub data: AlignedBytes,
}

impl std::fmt::Debug for Repacked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repacked")
            .field("ty", &self.ty)
            .field("n_in", &self.n_in)
            .field("n_out", &self.n_out)
            .field("bytes", &self.data.len())
            .finish()
    }
}

impl Repacked {
    /// Blocks per row.
    pub fn nb(&self) -> usize {
        self.n_in / self.ty.block_size()
    }

    /// Bytes of one group of rows (all its records).
    pub fn group_bytes(&self) -> usize {
        self.nb() * record_bytes(self.ty).unwrap_or(0)
    }
}

/// Bytes that start on a 64-byte boundary: the kernels read records in 64-byte vectors, and a
/// record that starts on a cache line keeps every one of its vectors within a line (the
/// allocator's large blocks start 16 bytes past a page, which split every vector across two).
#[derive(Clone, PartialEq, Eq)]
pub struct AlignedBytes {
    lines: Vec<Line>,
    len: usize,
}

/// One cache line.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(64))]
struct Line([u8; 64]);

// SAFETY: 64 bytes of `u8`, aligned to 64: no padding, every bit pattern valid.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Line {}

impl AlignedBytes {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> AlignedBytes {
        AlignedBytes {
            lines: vec![Line([0; 64]); len.div_ceil(64)],
            len,
        }
    }
}

impl std::ops::Deref for AlignedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl std::ops::DerefMut for AlignedBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// The repacked form of `w`, `n_out` rows of `n_in` values of `ty`, converting its groups on up
/// to `n_threads` threads (any split gives the same bytes). Refused, naming the reason, for a
/// type without a layout, rows that are not whole blocks or groups, or a size mismatch.
pub fn repack(ty: GgmlType, w: &[u8], n_in: usize, n_out: usize, n_threads: usize) -> Result<Repacked, QuantError> {
    let unsupported = || QuantError::UnsupportedType {
        ggml_type: ty,
        op: "repack",
    };
    let record = record_bytes(ty).ok_or_else(unsupported)?;
    let (bs, bsize) = (ty.block_size(), ty.type_size());
    if n_in == 0 || !n_in.is_multiple_of(bs) {
        return Err(QuantError::PartialBlock {
            ggml_type: ty,
            op: "repack",
            n: n_in,
            block_size: bs,
        });
    }
    let nb = n_in / bs;
    let expected = n_out.checked_mul(nb * bsize).ok_or_else(unsupported)?;
    if w.len() != expected || !n_out.is_multiple_of(GROUP) {
        return Err(QuantError::SizeMismatch {
            ggml_type: ty,
            op: "repack (rows in groups of 16)",
            n: n_out * n_in,
            expected: expected.next_multiple_of(GROUP * nb * bsize),
            got: w.len(),
        });
    }
    let n_groups = n_out / GROUP;
    let (in_group, out_group) = (nb * GROUP * bsize, nb * record);
    let mut data = AlignedBytes::zeroed(n_groups * out_group);
    let per_thread = n_groups.div_ceil(n_threads.max(1)).max(1);
    let n_chunks = n_groups.div_ceil(per_thread);
    std::thread::scope(|s| {
        for (i, out) in data.chunks_mut(per_thread * out_group).enumerate() {
            let first = i * per_thread;
            let mut job = move || {
                for (g, records) in out.chunks_exact_mut(out_group).enumerate() {
                    let rows = &w[(first + g) * in_group..][..in_group];
                    repack_group(ty, rows, nb, records);
                }
            };
            if i + 1 == n_chunks {
                job();
            } else {
                s.spawn(job);
            }
        }
    });
    Ok(Repacked { ty, n_in, n_out, data })
}

/// One group: `rows` holds 16 rows of `nb` blocks in the original layout, `out` their records.
fn repack_group(ty: GgmlType, rows: &[u8], nb: usize, out: &mut [u8]) {
    let bsize = ty.type_size();
    let record = record_bytes(ty).expect("a type with a layout");
    for (b, rec) in out.chunks_exact_mut(record).enumerate() {
        let blocks: [&[u8]; GROUP] = std::array::from_fn(|r| &rows[(r * nb + b) * bsize..][..bsize]);
        match ty {
            GgmlType::Q4_K => record_q4_k(&blocks, rec),
            GgmlType::Q6_K => record_q6_k(&blocks, rec),
            _ => record_block32(ty, &fields(ty).expect("a 32-value block type"), &blocks, rec),
        }
    }
}

/// Fills `vectors` 64-byte vectors from byte `at` of `rec`: lane `r` of vector `v` (its bytes
/// `4r..4r + 4`) takes the four bytes `src(r, v)`.
fn interleave4(rec: &mut [u8], at: usize, vectors: usize, src: impl Fn(usize, usize) -> [u8; 4]) {
    for v in 0..vectors {
        for r in 0..GROUP {
            rec[at + 64 * v + 4 * r..][..4].copy_from_slice(&src(r, v));
        }
    }
}

/// Four bytes of `b` from `at`.
fn four(b: &[u8], at: usize) -> [u8; 4] {
    b[at..at + 4].try_into().expect("four bytes")
}

/// A record of 16 blocks of a 32-value type (see the module documentation).
fn record_block32(ty: GgmlType, f: &Fields, blocks: &[&[u8]; GROUP], rec: &mut [u8]) {
    let vectors = f.qs_len / 4;
    interleave4(rec, 0, vectors, |r, k| {
        let q = four(blocks[r], f.qs + 4 * k);
        if ty == GgmlType::Q8_0 {
            q.map(|b| b ^ 0x80)
        } else {
            q
        }
    });
    let mut at = 64 * vectors;
    if let Some(qh) = f.qh {
        for g in 0..8 {
            let mut mask = 0u64;
            for (r, blk) in blocks.iter().enumerate() {
                let bits = u32::from_le_bytes(four(blk, qh));
                mask |= u64::from((bits >> (4 * g)) & 0xf) << (4 * r);
            }
            rec[at + 8 * g..at + 8 * g + 8].copy_from_slice(&mask.to_le_bytes());
        }
        at += 64;
    }
    for (r, blk) in blocks.iter().enumerate() {
        rec[at + f.scale * r..][..f.scale].copy_from_slice(&blk[..f.scale]);
    }
    at += GROUP * f.scale;
    if let Some(m) = f.m {
        for (r, blk) in blocks.iter().enumerate() {
            rec[at + 2 * r..at + 2 * r + 2].copy_from_slice(&blk[m..m + 2]);
        }
        at += 32;
    }
    debug_assert_eq!(at, rec.len());
}

/// A Q4_K record (see the module documentation).
fn record_q4_k(blocks: &[&[u8]; GROUP], rec: &mut [u8]) {
    use super::q4_k::BlockQ4K;
    let b: [BlockQ4K; GROUP] = std::array::from_fn(|r| bytemuck::pod_read_unaligned(blocks[r]));
    interleave4(rec, 0, 32, |r, v| four(&b[r].qs, 32 * (v / 8) + 4 * (v % 8)));
    for (r, blk) in b.iter().enumerate() {
        let (scales, mins) = super::k_quants::unpack_scales_mins_k4(&blk.scales);
        for j in 0..8 {
            rec[Q4_K_SCALES + 16 * j + r] = scales[j];
            rec[Q4_K_MINS + 32 * (j / 2) + 2 * r + j % 2] = mins[j];
        }
        rec[Q4_K_D + 2 * r..][..2].copy_from_slice(&blk.d.to_le_bytes());
        rec[Q4_K_DMIN + 2 * r..][..2].copy_from_slice(&blk.dmin.to_le_bytes());
    }
}

/// A Q6_K record (see the module documentation).
fn record_q6_k(blocks: &[&[u8]; GROUP], rec: &mut [u8]) {
    use super::q6_k::BlockQ6K;
    let b: [BlockQ6K; GROUP] = std::array::from_fn(|r| bytemuck::pod_read_unaligned(blocks[r]));
    interleave4(rec, 0, 32, |r, v| four(&b[r].ql, 4 * v));
    interleave4(rec, Q6_K_QH, 16, |r, u| four(&b[r].qh, 4 * u));
    for (r, blk) in b.iter().enumerate() {
        for (j, &scale) in blk.scales.iter().enumerate() {
            rec[Q6_K_SCALES + 32 * (j / 2) + 2 * r + j % 2] = scale as u8;
        }
        rec[Q6_K_D + 2 * r..][..2].copy_from_slice(&blk.d.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::XorShift;

    fn random_bytes(r: &mut XorShift, n: usize) -> Vec<u8> {
        (0..n).map(|_| r.next() as u8).collect()
    }

    #[test]
    fn a_record_holds_every_bit_of_its_sixteen_blocks_where_the_layout_says() {
        let mut r = XorShift(7);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
        ] {
            let f = fields(ty).unwrap();
            let (nb, bsize) = (3, ty.type_size());
            let w = random_bytes(&mut r, 32 * nb * bsize);
            let p = repack(ty, &w, nb * 32, 32, 2).unwrap();
            assert_eq!(p.data.len(), w.len(), "{ty}: same bytes");
            for row in 0..32 {
                for b in 0..nb {
                    let blk = &w[(row * nb + b) * bsize..][..bsize];
                    let rec = &p.data[((row / GROUP) * nb + b) * GROUP * bsize..][..GROUP * bsize];
                    let lane = row % GROUP;
                    for j in 0..f.qs_len {
                        let got = rec[64 * (j / 4) + 4 * lane + j % 4];
                        let want = if ty == GgmlType::Q8_0 {
                            blk[f.qs + j] ^ 0x80
                        } else {
                            blk[f.qs + j]
                        };
                        assert_eq!(got, want, "{ty} row {row} block {b} qs {j}");
                    }
                    let mut at = 16 * f.qs_len;
                    if let Some(qh) = f.qh {
                        let bits = u32::from_le_bytes(blk[qh..qh + 4].try_into().unwrap());
                        for v in 0..32 {
                            let mask = u64::from_le_bytes(rec[at + 8 * (v / 4)..][..8].try_into().unwrap());
                            assert_eq!(
                                (mask >> (4 * lane + v % 4)) & 1,
                                u64::from(bits >> v & 1),
                                "{ty} qh {v}"
                            );
                        }
                        at += 64;
                    }
                    assert_eq!(rec[at + 2 * lane..at + 2 * lane + 2], blk[..2], "{ty} d");
                    if let Some(m) = f.m {
                        assert_eq!(rec[at + 32 + 2 * lane..at + 34 + 2 * lane], blk[m..m + 2], "{ty} m");
                    }
                }
            }
        }
    }

    #[test]
    fn a_q6_k_record_gives_back_every_level_scale_and_d_of_its_rows() {
        use crate::quant::q6_k::{self, BlockQ6K};
        let mut r = XorShift(5);
        let (nb, bsize) = (2, GgmlType::Q6_K.type_size());
        let w = random_bytes(&mut r, 32 * nb * bsize);
        let p = repack(GgmlType::Q6_K, &w, nb * 256, 32, 2).unwrap();
        assert_eq!(p.data.len(), w.len(), "same bytes");
        for row in 0..32 {
            for b in 0..nb {
                let blk: BlockQ6K = bytemuck::pod_read_unaligned(&w[(row * nb + b) * bsize..][..bsize]);
                let rec = &p.data[((row / GROUP) * nb + b) * Q6_K_RECORD..][..Q6_K_RECORD];
                let lane = row % GROUP;
                // The levels as the kernel rebuilds them: the value `128h + 32s + 4k + i` from
                // byte `i` of lane `lane` of ql vector `16h + 8(s % 2) + k` (high nibble for
                // s >= 2) and bits `2s..2s + 2` of the same byte of qh vector `8h + k`.
                let levels = q6_k::levels(&blk);
                for (v, &want) in levels.iter().enumerate() {
                    let (h, s, k, i) = (v / 128, v % 128 / 32, v % 32 / 4, v % 4);
                    let ql = rec[64 * (16 * h + 8 * (s % 2) + k) + 4 * lane + i];
                    let qh = rec[Q6_K_QH + 64 * (8 * h + k) + 4 * lane + i];
                    let nibble = if s >= 2 { ql >> 4 } else { ql & 0x0f };
                    assert_eq!(
                        nibble | ((qh >> (2 * s)) & 3) << 4,
                        want,
                        "row {row} block {b} value {v}"
                    );
                }
                for j in 0..16 {
                    let got = rec[Q6_K_SCALES + 32 * (j / 2) + 2 * lane + j % 2] as i8;
                    assert_eq!(got, blk.scales[j], "row {row} block {b} scale {j}");
                }
                assert_eq!(rec[Q6_K_D + 2 * lane..][..2], blk.d.to_le_bytes(), "row {row} d");
            }
        }
    }

    #[test]
    fn any_thread_count_gives_the_same_bytes() {
        let mut r = XorShift(11);
        let ty = GgmlType::Q5_0;
        let w = random_bytes(&mut r, 80 * 2 * ty.type_size());
        let one = repack(ty, &w, 64, 80, 1).unwrap();
        for n_threads in [2, 3, 5, 8] {
            assert_eq!(repack(ty, &w, 64, 80, n_threads).unwrap(), one, "{n_threads} threads");
        }
    }

    #[test]
    fn types_without_a_layout_and_ragged_shapes_are_refused_by_name() {
        let err = repack(GgmlType::Q5_K, &[0; 176 * 16], 256, 16, 1).unwrap_err();
        assert!(err.to_string().contains("Q5_K"), "{err}");
        let ty = GgmlType::Q8_0;
        let err = repack(ty, &vec![0; 15 * 34], 32, 15, 1).unwrap_err();
        assert!(err.to_string().contains("groups of 16"), "{err}");
        let err = repack(ty, &vec![0; 16 * 34], 33, 16, 1).unwrap_err();
        assert!(err.to_string().contains("33"), "{err}");
        let err = repack(ty, &vec![0; 16 * 34 - 1], 32, 16, 1).unwrap_err();
        assert!(err.to_string().contains("543"), "{err}");
    }
}
