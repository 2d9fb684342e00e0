//! Weights repacked for the 16-row kernels, as ggml-cpu's `repack` buffers: the 32-value block
//! types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) rearranged once at load so that a kernel reads each
//! block of 16 rows straight into the row-interleaved vectors of `crate::quant::gemm`'s panel
//! (one i32 lane per row), with no unpacking into a buffer and no horizontal reduction. A
//! decode step then multiplies a block of 16 rows with a handful of instructions; prompts
//! expand the same records into the panel at a fraction of the cost of the original layout.
//!
//! The layout keeps every bit and every byte count of the original (a record of 16 blocks is
//! 16 blocks' bytes), so a repacked matrix reads exactly as much memory as the file's. Rows go
//! in groups of [`GROUP`]; group `G`'s block `b` is the record at `(G * nb + b) * 16 * bsize`:
//!
//! - levels: for Q4_0, Q4_1, Q5_0, Q5_1 four 64-byte vectors, vector `k` holding bytes
//!   `4k..4k + 4` of each row's `qs` in lane `r` (the low nibbles are values `4k..`, the high
//!   ones values `16 + 4k..`); for Q8_0 eight 64-byte vectors, vector `g` holding values
//!   `4g..4g + 4` of each row plus 128 (unsigned, for `vpdpbusd`);
//! - fifth bits (Q5_0, Q5_1): eight little-endian u64 masks, bit `4r + i` of mask `g` being bit
//!   `4g + i` of row `r`'s `qh`;
//! - the 16 rows' f16 scales `d`, then (Q4_1, Q5_1) their f16 minimums `m`.
//!
//! This module owns the layout and its scalar conversion; the kernels reading it are
//! `simd::x86::gemm`'s, and which weights get repacked is the backend's choice. It must not do
//! arithmetic on the values: repacking moves bits only.

use super::{GgmlType, QuantError};

/// Rows per group: one i32 lane of a 512-bit vector each.
pub const GROUP: usize = 16;

/// Whether `ty` has a repacked layout.
pub fn supports(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0
    )
}

/// Where the parts of a block sit in the original layout: the `qs` bytes, the `qh` word (Q5),
/// and the minimum `m` (Q4_1, Q5_1); the scale `d` is always first.
struct Fields {
    qs: usize,
    qh: Option<usize>,
    m: Option<usize>,
    qs_len: usize,
}

fn fields(ty: GgmlType) -> Option<Fields> {
    let f = |qs, qh, m, qs_len| Fields { qs, qh, m, qs_len };
    match ty {
        GgmlType::Q4_0 => Some(f(2, None, None, 16)),
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
    /// The records, group by group.
    pub data: Vec<u8>,
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

    /// Bytes of one group of rows (all its blocks).
    pub fn group_bytes(&self) -> usize {
        self.nb() * GROUP * self.ty.type_size()
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
    let f = fields(ty).ok_or_else(unsupported)?;
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
    let mut data = vec![0u8; expected];
    let group_bytes = nb * GROUP * bsize;
    let n_groups = n_out / GROUP;
    let per_thread = n_groups.div_ceil(n_threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (i, out) in data.chunks_mut(per_thread * group_bytes).enumerate() {
            let first = i * per_thread;
            let f = &f;
            let mut job = move || {
                for (g, record_group) in out.chunks_exact_mut(group_bytes).enumerate() {
                    let rows = &w[(first + g) * group_bytes..][..group_bytes];
                    repack_group(ty, f, rows, nb, record_group);
                }
            };
            if i + 1 == n_groups.div_ceil(per_thread) {
                job();
            } else {
                s.spawn(job);
            }
        }
    });
    Ok(Repacked { ty, n_in, n_out, data })
}

/// One group: `rows` holds 16 rows of `nb` blocks in the original layout, `out` their records.
fn repack_group(ty: GgmlType, f: &Fields, rows: &[u8], nb: usize, out: &mut [u8]) {
    let bsize = ty.type_size();
    let row_bytes = nb * bsize;
    for (b, rec) in out.chunks_exact_mut(GROUP * bsize).enumerate() {
        let block = |r: usize| &rows[r * row_bytes + b * bsize..][..bsize];
        let vectors = f.qs_len / 4;
        for r in 0..GROUP {
            let blk = block(r);
            for k in 0..vectors {
                let src = &blk[f.qs + 4 * k..f.qs + 4 * k + 4];
                let dst = &mut rec[64 * k + 4 * r..64 * k + 4 * r + 4];
                if ty == GgmlType::Q8_0 {
                    for (d, s) in dst.iter_mut().zip(src) {
                        *d = s ^ 0x80;
                    }
                } else {
                    dst.copy_from_slice(src);
                }
            }
        }
        let mut at = 64 * vectors;
        if let Some(qh) = f.qh {
            for g in 0..8 {
                let mut mask = 0u64;
                for r in 0..GROUP {
                    let bits = u32::from_le_bytes(block(r)[qh..qh + 4].try_into().expect("4 bytes"));
                    mask |= u64::from((bits >> (4 * g)) & 0xf) << (4 * r);
                }
                rec[at + 8 * g..at + 8 * g + 8].copy_from_slice(&mask.to_le_bytes());
            }
            at += 64;
        }
        for r in 0..GROUP {
            rec[at + 2 * r..at + 2 * r + 2].copy_from_slice(&block(r)[..2]);
        }
        at += 32;
        if let Some(m) = f.m {
            for r in 0..GROUP {
                rec[at + 2 * r..at + 2 * r + 2].copy_from_slice(&block(r)[m..m + 2]);
            }
            at += 32;
        }
        debug_assert_eq!(at, rec.len());
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
        let err = repack(GgmlType::Q4_K, &[0; 144 * 16], 256, 16, 1).unwrap_err();
        assert!(err.to_string().contains("Q4_K"), "{err}");
        let ty = GgmlType::Q8_0;
        let err = repack(ty, &vec![0; 15 * 34], 32, 15, 1).unwrap_err();
        assert!(err.to_string().contains("groups of 16"), "{err}");
        let err = repack(ty, &vec![0; 16 * 34], 33, 16, 1).unwrap_err();
        assert!(err.to_string().contains("33"), "{err}");
        let err = repack(ty, &vec![0; 16 * 34 - 1], 32, 16, 1).unwrap_err();
        assert!(err.to_string().contains("543"), "{err}");
    }
}
