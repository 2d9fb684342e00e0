//! Prefill's matrix-matrix product: a panel of 16 weight rows is unpacked once and then
//! multiplied against the token rows eight at a time, so the unpacking is paid once per panel
//! instead of once per token, and each VNNI instruction works for 16 rows at once. Two kernels:
//! the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; `vpdpbusd` on unsigned levels) and
//! the K-quants Q4_K and Q6_K (`vpdpwssd` on scaled levels paired within the reference's lanes).
//!
//! Every output is bit-identical to the type's scalar `vec_dot_ref` of the weight row and the
//! token row (the kernels' float operations are the references', in their order; see
//! `simd::x86::gemm` and `simd::x86::gemm_k`), so a prompt gives the same logits through this
//! path, through the dot products, and on any number of threads.
//!
//! The kernels need AVX-512 F, BW and VNNI and the [`super::simd::kernels`] choice to allow
//! them (`MINFER_NO_AVX512` turns this path off). [`gemm_rows`] says `false` when it does not
//! apply, and the caller then uses the dot products. This module owns the activation terms the
//! kernels read and the panel and tile loops; it must not change any arithmetic.

use super::{GgmlType, QuantError};
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::simd::x86::{gemm as kernel, gemm_k as kernel_k};

/// Rows the kernel computes at once. Row ranges that are multiples of it waste no lanes.
pub const PANEL: usize = 16;

/// Below this many tokens the dot products (which unpack a weight block per token pair) are
/// as fast: unpacking a panel costs about as much as a few tokens' worth of its multiply-adds.
pub const MIN_TOKENS: usize = 4;

/// Per-(token, block) terms of quantized activations that the kernels read beside the bytes,
/// computed once per product by [`activation_terms`] and shared by every thread.
///
/// For Q8_0 and Q8_1: `d` is each block's scale as f32 and `aux` its `Σ qs` (Q8_0) or the bits
/// of its f32 scaled sum `s` (Q8_1). For Q8_K: `d` is each super-block's scale and `aux` holds
/// its values as the i16 pairs the K-quant kernel broadcasts (128 words per super-block).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationTerms<'a> {
    /// Each block's (Q8_0, Q8_1) or super-block's (Q8_K) scale `d` as f32, token-major.
    pub d: &'a [f32],
    /// [`aux_words_per_block`] words per block, token-major: `Σ qs` (Q8_0), the bits of `s`
    /// (Q8_1), or the values as i16 pairs (Q8_K).
    pub aux: &'a [i32],
}

/// The kernel for a weight type.
#[derive(Clone, Copy)]
enum Kernel {
    /// The 32-value block kernel with its type parameter.
    Block32(u8),
    /// The K-quant kernel with its type parameter.
    K(u8),
}

/// Whether [`gemm_rows`] runs products of `wtype` weights on this CPU with this environment.
pub fn is_available(wtype: GgmlType) -> bool {
    kernel_for(wtype).is_some() && super::simd::kernels().isa() == super::simd::Isa::Avx512 && cpu_has_bw()
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

fn kernel_for(wtype: GgmlType) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    {
        Some(match wtype {
            GgmlType::Q4_0 => Kernel::Block32(kernel::Q4_0),
            GgmlType::Q4_1 => Kernel::Block32(kernel::Q4_1),
            GgmlType::Q5_0 => Kernel::Block32(kernel::Q5_0),
            GgmlType::Q5_1 => Kernel::Block32(kernel::Q5_1),
            GgmlType::Q8_0 => Kernel::Block32(kernel::Q8_0),
            GgmlType::Q4_K => Kernel::K(kernel_k::Q4_K),
            GgmlType::Q6_K => Kernel::K(kernel_k::Q6_K),
            _ => return None,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wtype;
        None
    }
}

/// Words of `aux` per activation block of `aty`: 1, or 128 for Q8_K's pairs.
pub fn aux_words_per_block(aty: GgmlType) -> usize {
    if aty == GgmlType::Q8_K {
        128
    } else {
        1
    }
}

/// The terms of `n_tokens` activation rows of `nb` blocks of `aty` (Q8_0, Q8_1 or Q8_K) into
/// `d` (`n_tokens * nb` values) and `aux` (that times [`aux_words_per_block`]), token-major.
pub fn activation_terms(
    aty: GgmlType,
    data: &[u8],
    nb: usize,
    d: &mut [f32],
    aux: &mut [i32],
) -> Result<(), QuantError> {
    let bsize = aty.type_size();
    let n = d.len();
    let words = aux_words_per_block(aty);
    let size_err = QuantError::SizeMismatch {
        ggml_type: aty,
        op: "gemm activation terms",
        n: n * aty.block_size(),
        expected: n * bsize,
        got: data.len(),
    };
    if !matches!(aty, GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K) {
        return Err(QuantError::UnsupportedType {
            ggml_type: aty,
            op: "gemm activation terms",
        });
    }
    if aux.len() != n * words || data.len() != n * bsize || (nb > 0 && !n.is_multiple_of(nb)) {
        return Err(size_err);
    }
    let half = |blk: &[u8], at: usize| super::fp16::f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]));
    for ((blk, d), aux) in data
        .chunks_exact(bsize)
        .zip(d.iter_mut())
        .zip(aux.chunks_exact_mut(words))
    {
        match aty {
            GgmlType::Q8_0 => {
                *d = half(blk, 0);
                aux[0] = blk[2..34].iter().map(|&q| q as i8 as i32).sum();
            }
            GgmlType::Q8_1 => {
                *d = half(blk, 0);
                aux[0] = half(blk, 2).to_bits() as i32;
            }
            _ => {
                *d = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]);
                #[cfg(target_arch = "x86_64")]
                kernel_k::activation_pairs(bytemuck::cast_slice::<u8, i8>(&blk[4..260]).try_into().unwrap(), aux);
            }
        }
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
    let aty = wtype.vec_dot_type().expect("the kernels' types have activation types");
    let (wb, ab) = (wtype.type_size(), aty.type_size());
    let size_err = |expected: usize, got: usize| QuantError::SizeMismatch {
        ggml_type: wtype,
        op: "gemm_rows",
        n: nb * wtype.block_size(),
        expected,
        got,
    };
    if rows.start > rows.end || w.len() < rows.end * nb * wb {
        return Err(size_err(rows.end * nb * wb, w.len()));
    }
    if act.len() != n_tokens * nb * ab {
        return Err(size_err(n_tokens * nb * ab, act.len()));
    }
    if terms.d.len() != n_tokens * nb || terms.aux.len() != n_tokens * nb * aux_words_per_block(aty) {
        return Err(size_err(n_tokens * nb, terms.d.len()));
    }
    if y.len() != rows.len() * n_tokens {
        return Err(size_err(rows.len() * n_tokens, y.len()));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let shape = Shape { nb, n_tokens, rows, ab };
        // SAFETY: `is_available` checked AVX-512 F, BW, VNNI (and AVX2 under them); the sizes
        // are checked above.
        match kernel_for(wtype).expect("is_available checked the type") {
            Kernel::Block32(kind) => unsafe { run_block32(kind, w, wb, act, terms, &shape, y) },
            Kernel::K(kind) => unsafe { run_k(kind, w, act, terms, &shape, y) },
        }
        Ok(true)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        unreachable!("is_available is false off x86-64")
    }
}

/// The shape of one call: blocks per row, tokens, output rows, activation block bytes.
#[cfg(target_arch = "x86_64")]
struct Shape {
    nb: usize,
    n_tokens: usize,
    rows: Range<usize>,
    ab: usize,
}

#[cfg(target_arch = "x86_64")]
impl Shape {
    /// The panels of the output rows, each with the store mask of its rows (a narrow last
    /// panel's stores are masked to its rows).
    fn panels(&self) -> impl Iterator<Item = (Range<usize>, u16)> + '_ {
        self.rows.clone().step_by(PANEL).map(|start| {
            let end = (start + PANEL).min(self.rows.end);
            let mask = if end - start == PANEL {
                u16::MAX
            } else {
                (1u16 << (end - start)) - 1
            };
            (start..end, mask)
        })
    }

    /// The token tiles: first token and count.
    fn tiles(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        (0..self.n_tokens)
            .step_by(kernel::TILE)
            .map(|t0| (t0, (self.n_tokens - t0).min(kernel::TILE)))
    }

    /// Where the outputs of the panel `rows` for tokens from `t0` on start in `y`.
    fn out_offset(&self, rows: &Range<usize>, t0: usize) -> usize {
        t0 * self.rows.len() + rows.start - self.rows.start
    }
}

/// A panel's unpacked weights, minimums (K-quants), scales and minimum scales.
#[cfg(target_arch = "x86_64")]
type PanelBuffers = (Vec<u32>, Vec<u32>, Vec<f32>, Vec<f32>);

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// The panel buffers, reused by every product on the thread.
    static PANEL_SCRATCH: std::cell::RefCell<PanelBuffers> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new()))
    };
}

/// The 32-value block kernel's panel and tile loops.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by [`gemm_rows`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_block32(kind: u8, w: &[u8], wb: usize, act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    macro_rules! by_kind {
        ($($f:ident)::+, [$($n:literal)?], $($arg:expr),*) => {
            match kind {
                kernel::Q4_0 => $($f)::+::<{ kernel::Q4_0 } $(, $n)?>($($arg),*),
                kernel::Q4_1 => $($f)::+::<{ kernel::Q4_1 } $(, $n)?>($($arg),*),
                kernel::Q5_0 => $($f)::+::<{ kernel::Q5_0 } $(, $n)?>($($arg),*),
                kernel::Q5_1 => $($f)::+::<{ kernel::Q5_1 } $(, $n)?>($($arg),*),
                _ => $($f)::+::<{ kernel::Q8_0 } $(, $n)?>($($arg),*),
            }
        };
    }
    let (nb, ab, stride) = (s.nb, s.ab, s.rows.len());
    let qs_offset = if ab == 36 { 4 } else { 2 };
    PANEL_SCRATCH.with_borrow_mut(|(pack, _, dx, mx)| {
        pack.resize(nb * 128, 0);
        dx.resize(nb * PANEL, 0.0);
        mx.resize(nb * PANEL, 0.0);
        for (rows, mask) in s.panels() {
            by_kind!(kernel::unpack_panel, [], w, wb, nb, rows.clone(), pack, dx, mx);
            for (t0, n) in s.tiles() {
                let a = kernel::TileActivations {
                    data: &act[t0 * nb * ab..(t0 + n) * nb * ab],
                    row_bytes: nb * ab,
                    block_bytes: ab,
                    qs_offset,
                    d: &terms.d[t0 * nb..(t0 + n) * nb],
                    aux: &terms.aux[t0 * nb..(t0 + n) * nb],
                };
                let p = kernel::Panel { pack, dx, mx, nb };
                let y = &mut y[s.out_offset(&rows, t0)..];
                match n {
                    1 => by_kind!(kernel::panel_tile, [1], &p, &a, y, stride, mask),
                    2 => by_kind!(kernel::panel_tile, [2], &p, &a, y, stride, mask),
                    3 => by_kind!(kernel::panel_tile, [3], &p, &a, y, stride, mask),
                    4 => by_kind!(kernel::panel_tile, [4], &p, &a, y, stride, mask),
                    5 => by_kind!(kernel::panel_tile, [5], &p, &a, y, stride, mask),
                    6 => by_kind!(kernel::panel_tile, [6], &p, &a, y, stride, mask),
                    7 => by_kind!(kernel::panel_tile, [7], &p, &a, y, stride, mask),
                    _ => by_kind!(kernel::panel_tile, [8], &p, &a, y, stride, mask),
                }
            }
        }
    });
}

/// The K-quant kernel's panel and tile loops.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by [`gemm_rows`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_k(kind: u8, w: &[u8], act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    macro_rules! by_kind {
        ($($f:ident)::+, [$($n:literal)?], $($arg:expr),*) => {
            match kind {
                kernel_k::Q4_K => $($f)::+::<{ kernel_k::Q4_K } $(, $n)?>($($arg),*),
                _ => $($f)::+::<{ kernel_k::Q6_K } $(, $n)?>($($arg),*),
            }
        };
    }
    let (nsb, ab, stride) = (s.nb, s.ab, s.rows.len());
    let words = kernel_k::PAIR_WORDS;
    PANEL_SCRATCH.with_borrow_mut(|(pack, mins, dx, dmx)| {
        pack.resize(nsb * kernel_k::PACK_WORDS, 0);
        mins.resize(nsb * 8 * PANEL, 0);
        dx.resize(nsb * PANEL, 0.0);
        dmx.resize(nsb * PANEL, 0.0);
        for (rows, mask) in s.panels() {
            by_kind!(kernel_k::unpack_panel_k, [], w, nsb, rows.clone(), pack, mins, dx, dmx);
            for (t0, n) in s.tiles() {
                let a = kernel_k::TileActivationsK {
                    data: &act[t0 * nsb * ab..(t0 + n) * nsb * ab],
                    row_bytes: nsb * ab,
                    pairs: &terms.aux[t0 * nsb * words..(t0 + n) * nsb * words],
                    d: &terms.d[t0 * nsb..(t0 + n) * nsb],
                };
                let p = kernel_k::PanelK {
                    pack,
                    mins,
                    dx,
                    dmx,
                    nsb,
                };
                let y = &mut y[s.out_offset(&rows, t0)..];
                match n {
                    1 => by_kind!(kernel_k::panel_tile_k, [1], &p, &a, y, stride, mask),
                    2 => by_kind!(kernel_k::panel_tile_k, [2], &p, &a, y, stride, mask),
                    3 => by_kind!(kernel_k::panel_tile_k, [3], &p, &a, y, stride, mask),
                    4 => by_kind!(kernel_k::panel_tile_k, [4], &p, &a, y, stride, mask),
                    5 => by_kind!(kernel_k::panel_tile_k, [5], &p, &a, y, stride, mask),
                    6 => by_kind!(kernel_k::panel_tile_k, [6], &p, &a, y, stride, mask),
                    7 => by_kind!(kernel_k::panel_tile_k, [7], &p, &a, y, stride, mask),
                    _ => by_kind!(kernel_k::panel_tile_k, [8], &p, &a, y, stride, mask),
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fp16::f32_to_f16;
    use crate::quant::{q4_0, q4_1, q4_k, q5_0, q5_1, q6_k, q8_0};
    use crate::test_util::XorShift;

    /// Random bytes in `n` blocks of `ty`, with the float fields (scales, minimums, scaled sums)
    /// replaced by finite values in [-2, 2), so that no NaN makes bits differ.
    fn random_blocks(r: &mut XorShift, n: usize, ty: GgmlType) -> Vec<u8> {
        let bsize = ty.type_size();
        let mut bytes: Vec<u8> = (0..n * bsize).map(|_| r.next() as u8).collect();
        let (f16_at, f32_at): (&[usize], &[usize]) = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 | GgmlType::Q4_K => (&[0, 2], &[]),
            GgmlType::Q6_K => (&[208], &[]),
            GgmlType::Q8_K => (&[], &[0]),
            _ => (&[0], &[]),
        };
        for blk in bytes.chunks_exact_mut(bsize) {
            for &at in f16_at {
                let v = r.signed_unit() * 2.0;
                blk[at..at + 2].copy_from_slice(&f32_to_f16(v).to_le_bytes());
            }
            for &at in f32_at {
                let v = r.signed_unit() * 2.0;
                blk[at..at + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        bytes
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
            GgmlType::Q4_K => q4_k::vec_dot_ref(&blocks(w), &blocks(a)),
            GgmlType::Q6_K => q6_k::vec_dot_ref(&blocks(w), &blocks(a)),
            _ => q8_0::vec_dot_ref(&blocks(w), &blocks(a)),
        }
    }

    const TYPES: [GgmlType; 7] = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
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
            for nb in [1, 3, 19] {
                let w = random_blocks(&mut r, n_out * nb, ty);
                for n_tokens in [4, 5, 8, 9, 13, 16] {
                    let act = random_blocks(&mut r, n_tokens * nb, aty);
                    let words = aux_words_per_block(aty);
                    let (mut d, mut aux) = (vec![0.0; n_tokens * nb], vec![0; n_tokens * nb * words]);
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
        assert!(!gemm_rows(GgmlType::Q5_K, &[], 1, &[], terms, 0, 0..0, &mut []).unwrap());
        if is_available(GgmlType::Q8_0) {
            let err = gemm_rows(GgmlType::Q8_0, &[0; 34], 1, &[0; 34], terms, 1, 0..1, &mut [0.0]).unwrap_err();
            assert!(err.to_string().contains("gemm_rows"), "{err}");
        }
        let err = activation_terms(GgmlType::F16, &[], 1, &mut [], &mut []).unwrap_err();
        assert!(err.to_string().contains("F16"), "{err}");
    }
}
