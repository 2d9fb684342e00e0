//! Prefill's matrix-matrix product for the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1,
//! Q8_0): a panel of 16 weight rows is unpacked once into unsigned levels and then multiplied
//! against the token rows eight at a time, so the unpacking is paid once per panel instead of
//! once per token, and each `vpdpbusd` does 64 multiply-adds for 16 rows.
//!
//! Every output is bit-identical to the type's scalar `vec_dot_ref` of the weight row and the
//! token row (the kernel's float operations are the reference's, in its order; see
//! `simd::x86::gemm`), so a prompt gives the same logits through this path, through the dot
//! products, and on any number of threads.
//!
//! The kernel needs AVX-512 F, BW and VNNI and the [`super::simd::kernels`] choice to allow them
//! (`MINFER_NO_AVX512` turns this path off). [`gemm_rows`] says `false` when it does not apply,
//! and the caller then uses the dot products. This module owns the activation terms the kernel
//! reads and the panel and tile loops; it must not change any arithmetic.

use super::{GgmlType, QuantError};
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::simd::x86::gemm as kernel;

/// Rows the kernel computes at once. Row ranges that are multiples of it waste no lanes.
pub const PANEL: usize = 16;

/// Below this many tokens the dot products (which unpack a weight block per token pair) are
/// as fast: unpacking a panel costs about as much as four tokens' worth of its multiply-adds.
pub const MIN_TOKENS: usize = 4;

/// Per-(token, block) terms of quantized activations that the kernel reads beside the bytes:
/// the block scale as f32, and `Σ qs` (Q8_0) or the bits of the f32 scaled sum `s` (Q8_1).
/// Computed once per product by [`activation_terms`], shared by every thread.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationTerms<'a> {
    pub d: &'a [f32],
    pub aux: &'a [i32],
}

/// Whether [`gemm_rows`] runs products of `wtype` weights on this CPU with this environment.
pub fn is_available(wtype: GgmlType) -> bool {
    kind(wtype).is_some() && super::simd::kernels().isa() == super::simd::Isa::Avx512 && cpu_has_bw()
}

fn cpu_has_bw() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512bw")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel's name for a weight type it handles.
fn kind(wtype: GgmlType) -> Option<u8> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(match wtype {
            GgmlType::Q4_0 => kernel::Q4_0,
            GgmlType::Q4_1 => kernel::Q4_1,
            GgmlType::Q5_0 => kernel::Q5_0,
            GgmlType::Q5_1 => kernel::Q5_1,
            GgmlType::Q8_0 => kernel::Q8_0,
            _ => return None,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wtype;
        None
    }
}

/// The terms of `n_tokens` activation rows of `nb` blocks of `aty` (Q8_0 or Q8_1) into `d` and
/// `aux`, `n_tokens * nb` values each, token-major.
pub fn activation_terms(
    aty: GgmlType,
    data: &[u8],
    nb: usize,
    d: &mut [f32],
    aux: &mut [i32],
) -> Result<(), QuantError> {
    let (bsize, qs) = match aty {
        GgmlType::Q8_0 => (aty.type_size(), 2),
        GgmlType::Q8_1 => (aty.type_size(), 4),
        _ => {
            return Err(QuantError::UnsupportedType {
                ggml_type: aty,
                op: "gemm activation terms",
            })
        }
    };
    let n = d.len();
    if aux.len() != n || data.len() != n * bsize || (nb > 0 && !n.is_multiple_of(nb)) {
        return Err(QuantError::SizeMismatch {
            ggml_type: aty,
            op: "gemm activation terms",
            n: n * 32,
            expected: n * bsize,
            got: data.len(),
        });
    }
    for ((blk, d), aux) in data.chunks_exact(bsize).zip(d.iter_mut()).zip(aux.iter_mut()) {
        *d = super::fp16::f16_to_f32(u16::from_le_bytes([blk[0], blk[1]]));
        *aux = if aty == GgmlType::Q8_1 {
            super::fp16::f16_to_f32(u16::from_le_bytes([blk[2], blk[3]])).to_bits() as i32
        } else {
            blk[qs..qs + 32].iter().map(|&q| q as i8 as i32).sum()
        };
    }
    Ok(())
}

/// The output rows `rows` of the product of the weight `w` (`n_out` rows of `nb` blocks of
/// `wtype`) with `n_tokens` activation rows `act` (of `wtype.vec_dot_type()`, with their
/// `terms`), token-major over the selected rows as `matmul_rows` lays them out:
/// `y[t * rows.len() + (o - rows.start)]`.
///
/// Returns `false`, having written nothing, when the kernel does not apply (type, CPU,
/// environment); the sizes are the caller's to check, and a mismatch is an error.
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows(
    wtype: GgmlType,
    w: &[u8],
    nb: usize,
    act: &[u8],
    terms: ActivationTerms<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<bool, QuantError> {
    if !is_available(wtype) {
        return Ok(false);
    }
    let aty = wtype.vec_dot_type().expect("the 32-value types have activation types");
    let (wb, ab) = (wtype.type_size(), aty.type_size());
    let size_err = |expected: usize, got: usize| QuantError::SizeMismatch {
        ggml_type: wtype,
        op: "gemm_rows",
        n: nb * 32,
        expected,
        got,
    };
    if rows.start > rows.end || w.len() < rows.end * nb * wb {
        return Err(size_err(rows.end * nb * wb, w.len()));
    }
    if act.len() != n_tokens * nb * ab {
        return Err(size_err(n_tokens * nb * ab, act.len()));
    }
    if terms.d.len() != n_tokens * nb || terms.aux.len() != n_tokens * nb {
        return Err(size_err(n_tokens * nb, terms.d.len().min(terms.aux.len())));
    }
    if y.len() != rows.len() * n_tokens {
        return Err(size_err(rows.len() * n_tokens, y.len()));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let kind = kind(wtype).expect("is_available checked the type");
        // SAFETY: `is_available` checked AVX-512 F, BW, VNNI (and AVX2 under them); the sizes
        // are checked above.
        unsafe {
            run(
                kind,
                w,
                wb,
                nb,
                act,
                ab,
                if aty == GgmlType::Q8_1 { 4 } else { 2 },
                terms,
                n_tokens,
                rows,
                y,
            )
        };
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("is_available is false off x86-64")
    }
}

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// A panel's unpacked levels, scales and minimums, reused by every product on the thread.
    static PANEL_SCRATCH: std::cell::RefCell<(Vec<u32>, Vec<f32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new()))
    };
}

/// The panel and tile loops.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by [`gemm_rows`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    kind: u8,
    w: &[u8],
    wb: usize,
    nb: usize,
    act: &[u8],
    ab: usize,
    qs_offset: usize,
    terms: ActivationTerms<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) {
    macro_rules! by_kind {
        ($f:ident, $($arg:expr),*) => {
            match kind {
                kernel::Q4_0 => $f::<{ kernel::Q4_0 }>($($arg),*),
                kernel::Q4_1 => $f::<{ kernel::Q4_1 }>($($arg),*),
                kernel::Q5_0 => $f::<{ kernel::Q5_0 }>($($arg),*),
                kernel::Q5_1 => $f::<{ kernel::Q5_1 }>($($arg),*),
                _ => $f::<{ kernel::Q8_0 }>($($arg),*),
            }
        };
    }
    let stride = rows.len();
    PANEL_SCRATCH.with_borrow_mut(|(pack, dx, mx)| {
        pack.resize(nb * 128, 0);
        dx.resize(nb * 16, 0.0);
        mx.resize(nb * 16, 0.0);
        let mut start = rows.start;
        while start < rows.end {
            let end = (start + PANEL).min(rows.end);
            by_kind!(unpack, w, wb, nb, start..end, pack, dx, mx);
            let mask = if end - start == PANEL {
                u16::MAX
            } else {
                (1u16 << (end - start)) - 1
            };
            let col = start - rows.start;
            let mut t0 = 0;
            while t0 < n_tokens {
                let n = (n_tokens - t0).min(kernel::TILE);
                let a = kernel::TileActivations {
                    data: &act[t0 * nb * ab..(t0 + n) * nb * ab],
                    row_bytes: nb * ab,
                    block_bytes: ab,
                    qs_offset,
                    d: &terms.d[t0 * nb..(t0 + n) * nb],
                    aux: &terms.aux[t0 * nb..(t0 + n) * nb],
                };
                // The tile's outputs: rows `col..col + 16` of tokens `t0..t0 + n`; a narrow last
                // panel's stores are masked to its rows.
                let out = &mut y[t0 * stride + col..];
                let panel = kernel::Panel { pack, dx, mx, nb };
                by_kind!(tile, &panel, &a, out, stride, mask, n);
                t0 += n;
            }
            start = end;
        }
    });
}

#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn unpack<const KIND: u8>(
    w: &[u8],
    wb: usize,
    nb: usize,
    rows: Range<usize>,
    pack: &mut [u32],
    dx: &mut [f32],
    mx: &mut [f32],
) {
    kernel::unpack_panel::<KIND>(w, wb, nb, rows, pack, dx, mx)
}

/// One tile of `n` tokens (1..=8), the kernel instantiated for that count.
#[cfg(target_arch = "x86_64")]
unsafe fn tile<const KIND: u8>(
    p: &kernel::Panel<'_>,
    a: &kernel::TileActivations<'_>,
    y: &mut [f32],
    stride: usize,
    mask: u16,
    n: usize,
) {
    match n {
        1 => kernel::panel_tile::<KIND, 1>(p, a, y, stride, mask),
        2 => kernel::panel_tile::<KIND, 2>(p, a, y, stride, mask),
        3 => kernel::panel_tile::<KIND, 3>(p, a, y, stride, mask),
        4 => kernel::panel_tile::<KIND, 4>(p, a, y, stride, mask),
        5 => kernel::panel_tile::<KIND, 5>(p, a, y, stride, mask),
        6 => kernel::panel_tile::<KIND, 6>(p, a, y, stride, mask),
        7 => kernel::panel_tile::<KIND, 7>(p, a, y, stride, mask),
        _ => kernel::panel_tile::<KIND, 8>(p, a, y, stride, mask),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp16::f32_to_f16;
    use crate::quant::{q4_0, q4_1, q5_0, q5_1, q8_0};

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// Random bytes in blocks of `bsize`, each block's first `n_halves` f16 fields replaced
        /// by finite values (scales, minimums, scaled sums), so that no NaN makes bits differ.
        fn blocks(&mut self, n: usize, bsize: usize, n_halves: usize) -> Vec<u8> {
            let mut bytes: Vec<u8> = (0..n * bsize).map(|_| self.next() as u8).collect();
            for blk in bytes.chunks_exact_mut(bsize) {
                for h in 0..n_halves {
                    let v = ((self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * 2.0;
                    blk[2 * h..2 * h + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
                }
            }
            bytes
        }
    }

    /// The scalar reference of one weight row against one activation row.
    fn reference(ty: GgmlType, w: &[u8], a: &[u8]) -> f32 {
        fn blocks<T: bytemuck::Pod>(bytes: &[u8]) -> Vec<T> {
            bytes
                .chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect()
        }
        match ty {
            GgmlType::Q4_0 => q4_0::vec_dot_ref(&blocks(w), &blocks(a)),
            GgmlType::Q4_1 => q4_1::vec_dot_ref(&blocks(w), &blocks(a)),
            GgmlType::Q5_0 => q5_0::vec_dot_ref(&blocks(w), &blocks(a)),
            GgmlType::Q5_1 => q5_1::vec_dot_ref(&blocks(w), &blocks(a)),
            _ => q8_0::vec_dot_ref(&blocks(w), &blocks(a)),
        }
    }

    const TYPES: [GgmlType; 5] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ];

    #[test]
    fn every_output_is_bit_identical_to_the_scalar_dot_product_of_its_row_and_token() {
        let mut r = XorShift(0x9e37_79b9_7f4a_7c15);
        let n_out = 37;
        for ty in TYPES {
            if !is_available(ty) {
                eprintln!("gemm: not available on this CPU; the dot products take {ty}");
                continue;
            }
            let aty = ty.vec_dot_type().unwrap();
            let (wb, ab) = (ty.type_size(), aty.type_size());
            // Q4_1 and Q5_1 carry d and m; Q8_1 carries d and s.
            let w_halves = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
                2
            } else {
                1
            };
            let a_halves = if aty == GgmlType::Q8_1 { 2 } else { 1 };
            for nb in [1, 3, 28] {
                let w = r.blocks(n_out * nb, wb, w_halves);
                for n_tokens in [4, 5, 8, 9, 13, 16] {
                    let act = r.blocks(n_tokens * nb, ab, a_halves);
                    let (mut d, mut aux) = (vec![0.0; n_tokens * nb], vec![0; n_tokens * nb]);
                    activation_terms(aty, &act, nb, &mut d, &mut aux).unwrap();
                    let terms = ActivationTerms { d: &d, aux: &aux };
                    for rows in [0..n_out, 5..21, 16..32, 36..37] {
                        let mut y = vec![f32::NAN; rows.len() * n_tokens];
                        assert!(gemm_rows(ty, &w, nb, &act, terms, n_tokens, rows.clone(), &mut y).unwrap());
                        for t in 0..n_tokens {
                            let a_row = &act[t * nb * ab..][..nb * ab];
                            for (i, o) in rows.clone().enumerate() {
                                let expected = reference(ty, &w[o * nb * wb..][..nb * wb], a_row);
                                let got = y[t * rows.len() + i];
                                assert_eq!(
                                    got.to_bits(),
                                    expected.to_bits(),
                                    "{ty} nb={nb} t={t} o={o}: {got} vs {expected}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn types_without_a_kernel_are_declined_and_bad_sizes_refused() {
        let terms = ActivationTerms { d: &[], aux: &[] };
        assert!(!gemm_rows(GgmlType::Q4_K, &[], 1, &[], terms, 0, 0..0, &mut []).unwrap());
        if is_available(GgmlType::Q8_0) {
            let err = gemm_rows(GgmlType::Q8_0, &[0; 34], 1, &[0; 34], terms, 1, 0..1, &mut [0.0]).unwrap_err();
            assert!(err.to_string().contains("gemm_rows"), "{err}");
        }
        let err = activation_terms(GgmlType::Q8_K, &[], 1, &mut [], &mut []).unwrap_err();
        assert!(err.to_string().contains("Q8_K"), "{err}");
    }
}
