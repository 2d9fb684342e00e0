//! The 16-row matrix products: prefill's, where a panel of 16 weight rows is unpacked once and
//! then multiplied against the token rows eight at a time, so the unpacking is paid once per
//! panel instead of once per token, and each VNNI instruction works for 16 rows at once; and
//! those of repacked weights (`super::repack`, [`gemm_rows_repacked`]), which every tile of up
//! to eight tokens multiplies straight from the records, with the panel kernel's arithmetic. Two kernels:
//! the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the K-quants (Q2_K to Q6_K, and IQ4_XS),
//! both `vpdpbusd` on unsigned levels (the K-quants scale each sub-block's sum with `vpmulld`).
//! Which type has which is its row of the type table (`super::traits`): a [`PanelKernel`].
//!
//! Every output is bit-identical to the type's scalar `vec_dot_ref` of the weight row and the
//! token row (the kernels' float operations are the references', in their order; see
//! `simd::x86::gemm` and `simd::x86::gemm_k`), so a prompt gives the same logits through this
//! path, through the dot products, and on any number of threads.
//!
//! Where the CPU has AMX ([`super::simd::amx`]), each whole tile of 16 tokens runs as tile
//! products instead (`simd::x86::amx`: one `TDPBSUD` per block and 16 × 16 outputs), scaled by
//! the VNNI kernels' own float steps, so those outputs are bit-identical too; the tokens left
//! over run on the VNNI tiles. Tests run the tile kernels on emulated tiles on any CPU.
//!
//! The kernels need AVX-512 F, BW and VNNI: only the AVX-512 table has them, and [`kernel`]
//! hands one out only on a CPU with BW too (`MINFER_NO_AVX512` turns this path off).
//! [`gemm_rows`] says `false` when it does not apply, and the caller then uses the dot products
//! (a repacked weight has no such way out: the backend repacks only where the kernel exists).
//! This module owns the activation terms the kernels read and the panel and tile loops; it must
//! not change any arithmetic, and names a weight type only to say which have a repacked kernel.

use super::repack::Repacked;
use super::{traits, GgmlType, QuantError};
use std::ops::Range;

#[cfg(target_arch = "x86_64")]
use super::simd::x86::{gemm as kernel, gemm_k as kernel_k};

/// Rows the kernel computes at once. Row ranges that are multiples of it waste no lanes.
pub const PANEL: usize = 16;

/// Below this many tokens the dot products (which unpack a weight block per token pair) are
/// as fast: unpacking a panel costs about as much as a few tokens' worth of its multiply-adds.
/// Measured on the default model with batched decoding (`minfer bench -npl 1,2,4,6,8 -p 64
/// -n 64 -t 2`): 4 tokens a pass ran at 110 tok/s through the dot products and 97 through the
/// panel, 6 at 106 and 137, so the panel starts at 5.
pub const MIN_TOKENS: usize = 5;

/// [`MIN_TOKENS`] for the K-quants, whose super-block panels cost more to unpack. Measured on
/// Qwen2.5-Coder-1.5B Q4_K_M (`minfer bench -p 5,8,12,16 -n 0 -r 3 -t 2`, every matrix Q4_K or
/// Q6_K): dot products 80, 87, 88, 92 tok/s against the panel's 42, 63, 88, 110, so the
/// panel starts at 12. Small batches are what a speculative check runs.
pub const MIN_TOKENS_K: usize = 12;

/// The fewest tokens for which the panel beats the dot products on `wtype` weights: its
/// panel kernel's threshold, from the type's row of the table (`None` for a type without a
/// panel kernel on this CPU).
pub fn min_tokens(wtype: GgmlType) -> Option<usize> {
    kernel(wtype).map(|k| k.min_tokens)
}

/// How a product runs its full tiles of 16 tokens: through the AMX tile kernels
/// (`simd::x86::amx`) or, like the rest, through the VNNI tiles of up to eight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TileMode {
    Vnni,
    /// On the CPU's tiles ([`super::simd::amx`] said they are there).
    Amx,
    /// On emulated tiles, to test the tile kernels on any CPU.
    #[cfg(test)]
    EmulatedAmx,
}

impl TileMode {
    /// The mode of every product outside tests: AMX where [`super::simd::amx`] allows it.
    pub(crate) fn chosen() -> TileMode {
        if super::simd::amx() {
            TileMode::Amx
        } else {
            TileMode::Vnni
        }
    }

    /// The tile unit of a product, for the modes with one.
    ///
    /// # Safety
    /// `Amx` only where [`super::simd::amx`] holds; on the thread, no other tile unit is alive.
    #[cfg(target_arch = "x86_64")]
    unsafe fn open(self) -> Option<super::simd::x86::amx::Tiles> {
        use super::simd::x86::amx::{HardwareTiles, Tiles};
        match self {
            TileMode::Vnni => None,
            TileMode::Amx => Some(Tiles::Hardware(HardwareTiles::new())),
            #[cfg(test)]
            TileMode::EmulatedAmx => Some(Tiles::Emulated(super::simd::x86::amx::EmulatedTiles)),
        }
    }
}

/// The name of the kernel that runs a product of `n_tokens` tokens with a panel kernel (what
/// `minfer bench` reports): `"amx"` when its tiles of 16 tokens run as tile products, else the
/// instruction set's name.
pub fn kernel_name(n_tokens: usize) -> &'static str {
    if TileMode::chosen() == TileMode::Amx && n_tokens >= TILE_TOKENS {
        "amx"
    } else {
        super::simd::simd_level()
    }
}

/// Tokens of a tile product.
const TILE_TOKENS: usize = 16;

/// Per-(token, block) terms of quantized activations that the kernels read beside the bytes,
/// computed once per product by [`PanelKernel::activation_terms`] and shared by every thread.
///
/// For Q8_0 and Q8_1: `d` is each block's scale as f32 and `aux` its `Σ qs` (Q8_0) or the bits
/// of its f32 scaled sum `s` (Q8_1). For Q8_K: `d` is each super-block's scale and `aux` holds
/// the sums of its sub-blocks of 32 values as i16 pairs, for the minimums (4 words).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ActivationTerms<'a> {
    /// Each block's (Q8_0, Q8_1) or super-block's (Q8_K) scale `d` as f32, token-major.
    pub d: &'a [f32],
    /// [`PanelKernel::aux_words`] words per block, token-major: `Σ qs` (Q8_0), the bits of `s`
    /// (Q8_1), or the sub-block sums as i16 pairs (Q8_K).
    pub aux: &'a [i32],
}

/// The panel loops of one weight type's kernel over the rows and tokens of a [`Shape`].
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; the sizes are those [`gemm_rows`] checks.
type PanelRun = unsafe fn(&[u8], &[u8], ActivationTerms<'_>, &Shape, &mut [f32]);

/// A weight type's matrix-matrix kernel, as its row of the type table holds it: the activation
/// type it reads, the terms it wants beside the activation bytes, and its panel loops.
#[derive(Clone, Copy)]
pub struct PanelKernel {
    act: GgmlType,
    aux_words: usize,
    /// The terms of whole activation blocks (one call per chunk of rows, not per block).
    terms: fn(&[u8], &mut [f32], &mut [i32]),
    run: PanelRun,
    /// The loops over weights in the repacked layout (`super::repack`), for the types with one.
    run_repacked: Option<PanelRun>,
    /// The fewest tokens for which the panel beats the dot products ([`MIN_TOKENS`],
    /// [`MIN_TOKENS_K`]).
    min_tokens: usize,
}

impl std::fmt::Debug for PanelKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PanelKernel")
            .field("act", &self.act)
            .finish_non_exhaustive()
    }
}

#[cfg(target_arch = "x86_64")]
impl PanelKernel {
    /// The 32-value block kernel for `KIND` (a type of `simd::x86::gemm`), against Q8_1
    /// activations for the types with a minimum and Q8_0 for the others.
    pub(crate) const fn block32<const KIND: u8>() -> Self {
        let with_min = kernel::has_min(KIND);
        PanelKernel {
            act: if with_min { GgmlType::Q8_1 } else { GgmlType::Q8_0 },
            aux_words: 1,
            terms: if with_min { terms_q8_1 } else { terms_q8_0 },
            run: run_block32::<KIND>,
            run_repacked: Some(run_repacked::<KIND>),
            min_tokens: MIN_TOKENS,
        }
    }

    /// The K-quant kernel for `KIND` (a type of `simd::x86::gemm_k`), against Q8_K activations.
    pub(crate) const fn k<const KIND: u8>() -> Self {
        PanelKernel {
            act: GgmlType::Q8_K,
            aux_words: kernel_k::PAIR_WORDS,
            terms: terms_q8_k,
            run: run_k::<KIND>,
            run_repacked: if matches!(KIND, kernel_k::Q4_K | kernel_k::Q6_K) {
                Some(run_repacked_k::<KIND>)
            } else {
                None
            },
            min_tokens: MIN_TOKENS_K,
        }
    }
}

impl PanelKernel {
    /// The activation type the kernel reads: its weight type's `vec_dot_type`.
    pub const fn activation_type(&self) -> GgmlType {
        self.act
    }

    /// Whether the kernel has loops over weights in the repacked layout.
    pub fn has_repacked(&self) -> bool {
        self.run_repacked.is_some()
    }

    /// Words of [`ActivationTerms::aux`] per activation block: 1, or 4 for Q8_K's pairs.
    pub fn aux_words(&self) -> usize {
        self.aux_words
    }

    /// The terms of `n_tokens` activation rows of `nb` blocks of [`Self::activation_type`]
    /// into `d` (`n_tokens * nb` values) and `aux` (that times [`Self::aux_words`]),
    /// token-major.
    pub fn activation_terms(&self, data: &[u8], nb: usize, d: &mut [f32], aux: &mut [i32]) -> Result<(), QuantError> {
        let bsize = self.act.type_size();
        let n = d.len();
        if aux.len() != n * self.aux_words || data.len() != n * bsize || (nb > 0 && !n.is_multiple_of(nb)) {
            return Err(QuantError::SizeMismatch {
                ggml_type: self.act,
                op: "gemm activation terms",
                n: n * self.act.block_size(),
                expected: n * bsize,
                got: data.len(),
            });
        }
        (self.terms)(data, d, aux);
        Ok(())
    }
}

/// The f16 at byte `at` of `blk`, widened.
#[cfg(target_arch = "x86_64")]
fn half(blk: &[u8], at: usize) -> f32 {
    super::fp16::f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]]))
}

/// `block` on each activation block of `BYTES` bytes in `data`, with its scale and its `WORDS`
/// words of `aux`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn each_block<const BYTES: usize, const WORDS: usize>(
    data: &[u8],
    d: &mut [f32],
    aux: &mut [i32],
    block: impl Fn(&[u8], &mut f32, &mut [i32]),
) {
    for ((blk, d), aux) in data.chunks_exact(BYTES).zip(d).zip(aux.chunks_exact_mut(WORDS)) {
        block(blk, d, aux);
    }
}

/// Q8_0 blocks' terms: each scale and `Σ qs`.
#[cfg(target_arch = "x86_64")]
fn terms_q8_0(data: &[u8], d: &mut [f32], aux: &mut [i32]) {
    each_block::<{ GgmlType::Q8_0.type_size() }, 1>(data, d, aux, |blk, d, aux| {
        *d = half(blk, 0);
        aux[0] = blk[2..34].iter().map(|&q| q as i8 as i32).sum();
    });
}

/// Q8_1 blocks' terms: each scale and the bits of the scaled sum `s`.
#[cfg(target_arch = "x86_64")]
fn terms_q8_1(data: &[u8], d: &mut [f32], aux: &mut [i32]) {
    each_block::<{ GgmlType::Q8_1.type_size() }, 1>(data, d, aux, |blk, d, aux| {
        *d = half(blk, 0);
        aux[0] = half(blk, 2).to_bits() as i32;
    });
}

/// Q8_K super-blocks' terms: each scale and its sub-block sums as the K-quant kernel's pairs.
#[cfg(target_arch = "x86_64")]
fn terms_q8_k(data: &[u8], d: &mut [f32], aux: &mut [i32]) {
    each_block::<{ GgmlType::Q8_K.type_size() }, { kernel_k::PAIR_WORDS }>(data, d, aux, |blk, d, aux| {
        let b: super::q8_k::BlockQ8K = bytemuck::pod_read_unaligned(blk);
        *d = b.d;
        kernel_k::activation_pairs(&b.bsums, aux);
    });
}

/// The matrix-matrix kernel of `wtype` weights, when this CPU, the environment and the type
/// have one.
pub fn kernel(wtype: GgmlType) -> Option<PanelKernel> {
    traits::get(wtype)?.panel().filter(|_| cpu_has_bw())
}

/// The panel kernel that multiplies `n_tokens` activation rows by `wtype` weights, when the
/// product takes one (enough tokens, and a kernel for the type on this CPU); otherwise the
/// per-row dot products do it.
pub fn kernel_for(wtype: GgmlType, n_tokens: usize) -> Option<PanelKernel> {
    kernel(wtype).filter(|k| n_tokens >= k.min_tokens)
}

/// Whether [`gemm_rows`] runs products of `wtype` weights on this CPU with this environment.
pub fn is_available(wtype: GgmlType) -> bool {
    kernel(wtype).is_some()
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
    gemm_rows_in(TileMode::chosen(), wtype, w, nb, act, terms, n_tokens, rows, y)
}

/// [`gemm_rows`] with its full tiles of 16 tokens run in `mode`.
#[allow(clippy::too_many_arguments)]
fn gemm_rows_in(
    mode: TileMode,
    wtype: GgmlType,
    w: &[u8],
    nb: usize,
    act: &[u8],
    terms: ActivationTerms<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<bool, QuantError> {
    let Some(k) = kernel(wtype) else {
        return Ok(false);
    };
    let wb = wtype.type_size();
    if rows.start > rows.end || w.len() < rows.end * nb * wb {
        return Err(size_error(wtype, "gemm_rows", nb)(rows.end * nb * wb, w.len()));
    }
    let shape = Shape::checked(&k, mode, wtype, "gemm_rows", nb, act, terms, n_tokens, rows, y)?;
    // SAFETY: `kernel` found the kernel in the AVX-512 table, handed out only on a CPU with
    // AVX-512 F, VL and VNNI (and AVX2), and checked BW; the sizes are checked above.
    unsafe { (k.run)(w, act, terms, &shape, y) };
    Ok(true)
}

/// Whether products of `wtype` weights run on the repacked layout on this CPU with this
/// environment: the backend repacks a weight only when this holds.
/// That is: the type has a repacked kernel here ([`has_repacked_kernel`]), and it is the kernel
/// chosen for the type's decoding (`super::choice`, by measurement unless forced).
pub fn repacked_available(wtype: GgmlType) -> bool {
    has_repacked_kernel(wtype) && super::choice::kernel_of(wtype) == Some(super::choice::Kernel::Repacked)
}

/// Whether this CPU and environment have kernels for `wtype` weights in the repacked layout
/// ([`gemm_rows_repacked`] takes them), chosen or not.
pub fn has_repacked_kernel(wtype: GgmlType) -> bool {
    kernel(wtype).is_some_and(|k| k.has_repacked())
}

/// [`gemm_rows`] for a weight in the repacked layout, at any number of tokens (one included):
/// the output rows `rows`, whole groups of [`super::repack::GROUP`], of the product of `w`
/// with `n_tokens` activation rows `act` and their `terms`, laid out as `gemm_rows` lays them.
///
/// Returns `false`, having written nothing, when this CPU or environment has no kernel for
/// the layout; sizes and row ranges that do not fit are errors.
pub fn gemm_rows_repacked(
    w: &Repacked,
    act: &[u8],
    terms: ActivationTerms<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<bool, QuantError> {
    match kernel(w.ty) {
        Some(k) => gemm_rows_repacked_in(TileMode::chosen(), k, w, act, terms, n_tokens, rows, y),
        None => Ok(false),
    }
}

/// [`gemm_rows_repacked`] with the panel kernel `k` (of an instruction set's table, whichever
/// the type table chose: the kernel choice times it before there is a table), its full tiles
/// of 16 tokens run in `mode`.
///
/// Declined (`Ok(false)`) where `k` has no repacked loops or the CPU lacks AVX-512 BW; the
/// caller has checked F and VNNI (they come with every table that holds a panel kernel).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_rows_repacked_in(
    mode: TileMode,
    k: PanelKernel,
    w: &Repacked,
    act: &[u8],
    terms: ActivationTerms<'_>,
    n_tokens: usize,
    rows: Range<usize>,
    y: &mut [f32],
) -> Result<bool, QuantError> {
    let Some(run) = k.run_repacked.filter(|_| cpu_has_bw()) else {
        return Ok(false);
    };
    const OP: &str = "gemm_rows_repacked";
    let (nb, group) = (w.nb(), super::repack::GROUP);
    if let Some(&edge) = [rows.start, rows.end].iter().find(|e| !e.is_multiple_of(group)) {
        return Err(QuantError::PartialBlock {
            ggml_type: w.ty,
            op: "gemm_rows_repacked: a row range's edge (rows go in groups)",
            n: edge,
            block_size: group,
        });
    }
    if rows.start > rows.end || rows.end > w.n_out {
        return Err(QuantError::SizeMismatch {
            ggml_type: w.ty,
            op: "gemm_rows_repacked: the end of the row range against the rows",
            n: w.n_in,
            expected: w.n_out,
            got: rows.end,
        });
    }
    let group_bytes = w.group_bytes();
    if w.data.len() != w.n_out / group * group_bytes {
        return Err(size_error(w.ty, OP, nb)(w.n_out / group * group_bytes, w.data.len()));
    }
    let shape = Shape::checked(&k, mode, w.ty, OP, nb, act, terms, n_tokens, rows, y)?;
    if n_tokens == 0 || shape.rows.is_empty() {
        return Ok(true);
    }
    // SAFETY: as in `gemm_rows`; the records are the repacked layout of `w.ty`, whole groups.
    unsafe { run(&w.data, act, terms, &shape, y) };
    Ok(true)
}

/// The shape of one call: blocks per row, tokens, output rows, weight and activation block
/// bytes.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Shape {
    nb: usize,
    n_tokens: usize,
    rows: Range<usize>,
    wb: usize,
    ab: usize,
    mode: TileMode,
}

/// The error of a buffer of `got` bytes or values where `expected` are needed, for `op` on
/// rows of `nb` blocks of `ty`.
fn size_error(ty: GgmlType, op: &'static str, nb: usize) -> impl Fn(usize, usize) -> QuantError {
    move |expected, got| QuantError::SizeMismatch {
        ggml_type: ty,
        op,
        n: nb * ty.block_size(),
        expected,
        got,
    }
}

impl Shape {
    /// The shape of a call of `k` (its tiles of 16 tokens in `mode`) on `wtype` weights of `nb`
    /// blocks per row, after checking the activations, their terms and the output against it
    /// (the weight's bytes are the caller's to check: their layout differs).
    #[allow(clippy::too_many_arguments)]
    fn checked(
        k: &PanelKernel,
        mode: TileMode,
        wtype: GgmlType,
        op: &'static str,
        nb: usize,
        act: &[u8],
        terms: ActivationTerms<'_>,
        n_tokens: usize,
        rows: Range<usize>,
        y: &[f32],
    ) -> Result<Shape, QuantError> {
        let ab = k.act.type_size();
        let err = size_error(wtype, op, nb);
        if act.len() != n_tokens * nb * ab {
            return Err(err(n_tokens * nb * ab, act.len()));
        }
        if terms.d.len() != n_tokens * nb || terms.aux.len() != n_tokens * nb * k.aux_words {
            return Err(err(n_tokens * nb, terms.d.len()));
        }
        if y.len() != rows.len() * n_tokens {
            return Err(err(rows.len() * n_tokens, y.len()));
        }
        Ok(Shape {
            nb,
            n_tokens,
            rows,
            wb: wtype.type_size(),
            ab,
            mode,
        })
    }
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

    /// The tokens the tile kernels take: the whole tiles of 16, where the mode has tiles.
    fn tile_tokens(&self) -> usize {
        if self.mode == TileMode::Vnni {
            0
        } else {
            self.n_tokens / TILE_TOKENS * TILE_TOKENS
        }
    }

    /// The tile unit for [`Self::tile_tokens`], when there are any.
    ///
    /// # Safety
    /// As [`TileMode::open`].
    unsafe fn open_tiles(&self) -> Option<super::simd::x86::amx::Tiles> {
        if self.tile_tokens() > 0 {
            self.mode.open()
        } else {
            None
        }
    }

    /// The VNNI kernel's token tiles of the tokens from `first` on: first token and count.
    fn tiles(&self, first: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        (first..self.n_tokens)
            .step_by(kernel::TILE)
            .map(|t0| (t0, (self.n_tokens - t0).min(kernel::TILE)))
    }

    /// The token tiles of at most `max` tokens, of sizes differing by at most one.
    fn balanced_tiles(&self, max: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let n_tiles = self.n_tokens.div_ceil(max).max(1);
        (0..n_tiles).map(move |i| {
            let (t0, t1) = (i * self.n_tokens / n_tiles, (i + 1) * self.n_tokens / n_tiles);
            (t0, t1 - t0)
        })
    }

    /// Where the outputs of the panel `rows` for tokens from `t0` on start in `y`.
    fn out_offset(&self, rows: &Range<usize>, t0: usize) -> usize {
        t0 * self.rows.len() + rows.start - self.rows.start
    }
}

/// A panel's unpacked weights, sub-block scales and group-sum terms (K-quants), scales and
/// minimum scales.
#[cfg(target_arch = "x86_64")]
type PanelBuffers = (Vec<u32>, Vec<i32>, Vec<u32>, Vec<f32>, Vec<f32>);

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// The panel buffers, reused by every product on the thread.
    static PANEL_SCRATCH: std::cell::RefCell<PanelBuffers> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new()))
    };
}

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// The repacked K-quant kernels' interleaved activations (blocks, pairs, scales), reused by
    /// every product on the thread.
    static INTERLEAVED_SCRATCH: std::cell::RefCell<(Vec<u8>, Vec<i32>, Vec<f32>)> = const {
        std::cell::RefCell::new((Vec::new(), Vec::new(), Vec::new()))
    };
}

/// `$call` with the const `$t` set to the tile's token count `$n` (1 to `kernel::TILE`): one
/// instance of the tile kernel per count, so that its accumulators stay in registers.
#[cfg(target_arch = "x86_64")]
macro_rules! by_tile {
    ($n:expr, $t:ident => $call:expr) => {
        by_tile!(@arms $n, $t, $call, 1 2 3 4 5 6 7)
    };
    (@arms $n:expr, $t:ident, $call:expr, $($k:literal)*) => {
        match $n {
            $($k => {
                const $t: usize = $k;
                $call
            })*
            _ => {
                const $t: usize = kernel::TILE;
                $call
            }
        }
    };
}

/// The activations of the tile of `n` tokens from `t0` for the 32-value block kernel.
#[cfg(target_arch = "x86_64")]
fn block32_tile<'a, const KIND: u8>(
    act: &'a [u8],
    terms: ActivationTerms<'a>,
    s: &Shape,
    t0: usize,
    n: usize,
) -> kernel::TileActivations<'a> {
    let (nb, ab) = (s.nb, s.ab);
    kernel::TileActivations {
        data: &act[t0 * nb * ab..(t0 + n) * nb * ab],
        row_bytes: nb * ab,
        block_bytes: ab,
        qs_offset: if kernel::has_min(KIND) { 4 } else { 2 },
        d: &terms.d[t0 * nb..(t0 + n) * nb],
        aux: &terms.aux[t0 * nb..(t0 + n) * nb],
    }
}

/// The activations of the tile of `n` tokens from `t0` for the K-quant kernel.
#[cfg(target_arch = "x86_64")]
fn k_tile<'a>(
    act: &'a [u8],
    terms: ActivationTerms<'a>,
    s: &Shape,
    t0: usize,
    n: usize,
) -> kernel_k::TileActivationsK<'a> {
    let (nsb, ab, words) = (s.nb, s.ab, kernel_k::PAIR_WORDS);
    kernel_k::TileActivationsK {
        data: &act[t0 * nsb * ab..(t0 + n) * nsb * ab],
        row_bytes: nsb * ab,
        pairs: &terms.aux[t0 * nsb * words..(t0 + n) * nsb * words],
        d: &terms.d[t0 * nsb..(t0 + n) * nsb],
    }
}

/// The 32-value block kernel's panel and tile loops for `KIND`: `unpack(rows, pack, dx, mx)`
/// fills the panel of each group of output rows, then every tile of tokens runs against it.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by the caller.
#[cfg(target_arch = "x86_64")]
unsafe fn block32_panels<const KIND: u8>(
    act: &[u8],
    terms: ActivationTerms<'_>,
    s: &Shape,
    y: &mut [f32],
    unpack: impl Fn(&Range<usize>, &mut [u32], &mut [f32], &mut [f32]),
) {
    let (nb, stride) = (s.nb, s.rows.len());
    PANEL_SCRATCH.with_borrow_mut(|(pack, _, _, dx, mx)| {
        pack.resize(nb * 128, 0);
        dx.resize(nb * PANEL, 0.0);
        mx.resize(nb * PANEL, 0.0);
        // SAFETY: the mode is `Amx` only where the CPU has the tiles; this is the thread's unit.
        let mut tiles = s.open_tiles();
        for (rows, mask) in s.panels() {
            unpack(&rows, pack, dx, mx);
            let p = kernel::Panel { pack, dx, mx, nb };
            if let Some(tiles) = &mut tiles {
                for t0 in (0..s.tile_tokens()).step_by(TILE_TOKENS) {
                    let a = block32_tile::<KIND>(act, terms, s, t0, TILE_TOKENS);
                    let y = &mut y[s.out_offset(&rows, t0)..];
                    kernel::amx_panel_tile::<KIND>(tiles, &p, &a, y, stride, mask);
                }
            }
            for (t0, n) in s.tiles(s.tile_tokens()) {
                let a = block32_tile::<KIND>(act, terms, s, t0, n);
                let y = &mut y[s.out_offset(&rows, t0)..];
                by_tile!(n, T => kernel::panel_tile::<KIND, T>(&p, &a, y, stride, mask));
            }
        }
    });
}

/// The K-quant kernel's panel and tile loops for `KIND`: `unpack(rows, buffers)` fills the
/// panel of each group of output rows, then every tile of tokens runs against it.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by the caller.
#[cfg(target_arch = "x86_64")]
unsafe fn k_panels<const KIND: u8>(
    act: &[u8],
    terms: ActivationTerms<'_>,
    s: &Shape,
    y: &mut [f32],
    unpack: impl Fn(&Range<usize>, &mut PanelBuffers),
) {
    let (nsb, stride) = (s.nb, s.rows.len());
    PANEL_SCRATCH.with_borrow_mut(|buffers| {
        buffers.0.resize(nsb * kernel_k::PACK_WORDS, 0);
        buffers.1.resize(nsb * kernel_k::MAX_SUBS * PANEL, 0);
        buffers.2.resize(nsb * kernel_k::TERM_WORDS * PANEL, 0);
        buffers.3.resize(nsb * PANEL, 0.0);
        buffers.4.resize(nsb * PANEL, 0.0);
        // SAFETY: the mode is `Amx` only where the CPU has the tiles; this is the thread's unit.
        let mut tiles = s.open_tiles();
        for (rows, mask) in s.panels() {
            unpack(&rows, buffers);
            let (pack, scales, group_terms, dx, dmx) = &*buffers;
            let p = kernel_k::PanelK {
                pack,
                scales,
                terms: group_terms,
                dx,
                dmx,
                nsb,
            };
            if let Some(tiles) = &mut tiles {
                for t0 in (0..s.tile_tokens()).step_by(TILE_TOKENS) {
                    let a = k_tile(act, terms, s, t0, TILE_TOKENS);
                    let y = &mut y[s.out_offset(&rows, t0)..];
                    kernel_k::amx_panel_tile_k::<KIND>(tiles, &p, &a, y, stride, mask);
                }
            }
            for (t0, n) in s.tiles(s.tile_tokens()) {
                let a = k_tile(act, terms, s, t0, n);
                let y = &mut y[s.out_offset(&rows, t0)..];
                by_tile!(n, T => kernel_k::panel_tile_k::<KIND, T>(&p, &a, y, stride, mask));
            }
        }
    });
}

/// The 32-value block kernel's panel and tile loops for `KIND`, on the file's layout.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by [`gemm_rows`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_block32<const KIND: u8>(w: &[u8], act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    block32_panels::<KIND>(act, terms, s, y, |rows, pack, dx, mx| {
        kernel::unpack_panel::<KIND>(w, s.wb, s.nb, rows.clone(), pack, dx, mx)
    });
}

/// The 32-value block kernel's loops for `KIND` over repacked records (`w`): every tile of up
/// to eight tokens reads each group's records straight into the panel's vectors. Expanding a
/// group into the panel once for all its tiles measured slower at every token count, prompts
/// included: the unpacked panel is 1.6 to 2.9 times the records' bytes, and reading it back
/// for each tile cost more than unpacking the records again.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by
/// [`gemm_rows_repacked`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_repacked<const KIND: u8>(w: &[u8], act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    let group_bytes = s.nb * kernel::record_bytes(KIND);
    if s.tile_tokens() > 0 {
        // The tile products read the levels from memory: expand each group once for its tiles.
        block32_panels::<KIND>(act, terms, s, y, |rows, pack, dx, mx| {
            let records = &w[rows.start / PANEL * group_bytes..][..group_bytes];
            kernel::unpack_records::<KIND>(records, s.nb, pack, dx, mx)
        });
        return;
    }
    for (rows, _) in s.panels() {
        let records = &w[rows.start / PANEL * group_bytes..][..group_bytes];
        for (t0, n) in s.tiles(0) {
            let a = block32_tile::<KIND>(act, terms, s, t0, n);
            let y = &mut y[s.out_offset(&rows, t0)..];
            by_tile!(n, T => kernel::repacked_tile::<KIND, T>(records, s.nb, &a, y, s.rows.len()));
        }
    }
}

/// The K-quant kernels' loops over repacked records (`w`) of `KIND` (Q4_K or Q6_K), as
/// [`run_repacked`].
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by
/// [`gemm_rows_repacked`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_repacked_k<const KIND: u8>(w: &[u8], act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    let record = if KIND == kernel_k::Q4_K {
        kernel_k::RECORD_BYTES_Q4_K
    } else {
        kernel_k::RECORD_BYTES_Q6_K
    };
    let group_bytes = s.nb * record;
    // Q6_K's levels cost more to rebuild from `ql` and `qh` than Q4_K's nibbles: for a prompt,
    // expanding a group once into the panel and running every tile against it is faster (one
    // thread, 256 rows of 8,960: 601-607 against 528-536 GFLOP/s at 32 tokens, 676 at 128),
    // while a speculative check's few tokens go faster straight from the records (513 against
    // 370-409 at 8 tokens, 520 against 530 at 16). Q4_K's expansion measured slower at every size.
    // The tile products read the levels from memory: with them, both types expand a group once.
    if (KIND == kernel_k::Q6_K && s.n_tokens >= 24) || s.tile_tokens() > 0 {
        k_panels::<KIND>(act, terms, s, y, |rows, (pack, scales, group_terms, dx, dmx)| {
            let records = &w[rows.start / PANEL * group_bytes..][..group_bytes];
            if KIND == kernel_k::Q6_K {
                kernel_k::unpack_records_q6_k(records, s.nb, pack, scales, group_terms, dx)
            } else {
                kernel_k::unpack_records_q4_k(records, s.nb, pack, scales, group_terms, dx, dmx)
            }
        });
        return;
    }
    // Larger tiles measured slower per token than two smaller ones: Q4_K's from seven tokens
    // on (1.5B, `bench -p 5,8,10,13,16 -t 2`), Q6_K's from six, whose four sets' sums take four
    // registers a token (one thread, 256 rows of 8,960: 485 GFLOP/s at five tokens).
    let max_tile = if KIND == kernel_k::Q4_K { 6 } else { 5 };
    let (nsb, ab, words) = (s.nb, s.ab, kernel_k::PAIR_WORDS);
    // Every group of rows against every tile, the tiles' activations `[sb][t]` in `data`,
    // `pairs` and `d`.
    let run_tiles = |data: &[u8], pairs: &[i32], d: &[f32], y: &mut [f32]| {
        for (rows, _) in s.panels() {
            let records = &w[rows.start / PANEL * group_bytes..][..group_bytes];
            for (t0, n) in s.balanced_tiles(max_tile) {
                let a = kernel_k::InterleavedTileK {
                    data: &data[t0 * nsb * ab..(t0 + n) * nsb * ab],
                    pairs: &pairs[t0 * nsb * words..(t0 + n) * nsb * words],
                    d: &d[t0 * nsb..(t0 + n) * nsb],
                };
                let y = &mut y[s.out_offset(&rows, t0)..];
                if KIND == kernel_k::Q4_K {
                    by_tile!(n, T => kernel_k::repacked_tile_q4_k::<T>(records, nsb, &a, y, s.rows.len()));
                } else {
                    by_tile!(n, T => kernel_k::repacked_tile_q6_k::<T>(records, nsb, &a, y, s.rows.len()));
                }
            }
        }
    };
    if s.n_tokens == 1 {
        // One token's rows are already `[sb][t]`: a decode step copies nothing.
        run_tiles(&act[..nsb * ab], &terms.aux[..nsb * words], &terms.d[..nsb], y);
        return;
    }
    INTERLEAVED_SCRATCH.with_borrow_mut(|(data, pairs, d)| {
        // Each tile's blocks, pairs and scales `[sb][t]`, once for every group of rows.
        data.resize(s.n_tokens * nsb * ab, 0);
        pairs.resize(s.n_tokens * nsb * words, 0);
        d.resize(s.n_tokens * nsb, 0.0);
        for (t0, n) in s.balanced_tiles(max_tile) {
            for sb in 0..nsb {
                for t in 0..n {
                    let (from, to) = ((t0 + t) * nsb + sb, t0 * nsb + sb * n + t);
                    data[to * ab..(to + 1) * ab].copy_from_slice(&act[from * ab..(from + 1) * ab]);
                    pairs[to * words..(to + 1) * words].copy_from_slice(&terms.aux[from * words..(from + 1) * words]);
                    d[to] = terms.d[from];
                }
            }
        }
        run_tiles(data, pairs, d, y);
    });
}

/// The K-quant kernel's panel and tile loops for `KIND`, on the file's layout.
///
/// # Safety
/// As for the kernel: the CPU features are present and the sizes checked by [`gemm_rows`].
#[cfg(target_arch = "x86_64")]
unsafe fn run_k<const KIND: u8>(w: &[u8], act: &[u8], terms: ActivationTerms<'_>, s: &Shape, y: &mut [f32]) {
    k_panels::<KIND>(act, terms, s, y, |rows, (pack, scales, group_terms, dx, dmx)| {
        kernel_k::unpack_panel_k::<KIND>(w, s.nb, rows.clone(), pack, scales, group_terms, dx, dmx)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::simd::{self, Isa};
    use crate::quant::traits::TypeTraits;
    use crate::test_util::XorShift;

    /// The scalar table: the references, and the layouts' test generators.
    fn scalar() -> &'static [TypeTraits] {
        traits::for_isa(Isa::Scalar).unwrap()
    }

    /// The modes a test runs every product in: the chosen one (the CPU's tiles where it has
    /// them) and the emulated tiles, so the tile kernels are checked on every CPU.
    fn modes() -> [TileMode; 2] {
        [TileMode::chosen(), TileMode::EmulatedAmx]
    }

    /// The kernel terms of `n_tokens` activation rows `a` of `nb` blocks.
    fn terms_of(k: &PanelKernel, a: &[u8], nb: usize, n_tokens: usize) -> (Vec<f32>, Vec<i32>) {
        let (mut d, mut aux) = (vec![0.0; n_tokens * nb], vec![0; n_tokens * nb * k.aux_words()]);
        k.activation_terms(a, nb, &mut d, &mut aux).unwrap();
        (d, aux)
    }

    /// A product's operands: weight rows `w` and token rows `a` of `nb` blocks (`wb` and `ab`
    /// bytes each), and the scalar dot product of the weight type.
    struct Operands<'a> {
        ty: GgmlType,
        dots: traits::BlockDots,
        w: &'a [u8],
        a: &'a [u8],
        nb: usize,
        wb: usize,
        ab: usize,
    }

    impl Operands<'_> {
        /// Every output of `y` (the rows `rows` for `n_tokens` tokens, as `gemm_rows` lays them
        /// out) equals the scalar dot product of its weight row and token row, bit for bit.
        fn assert_bit_identical(&self, n_tokens: usize, rows: Range<usize>, y: &[f32]) {
            let Operands {
                ty,
                dots,
                w,
                a,
                nb,
                wb,
                ab,
            } = self;
            for t in 0..n_tokens {
                let a_row = &a[t * nb * ab..][..nb * ab];
                for (i, o) in rows.clone().enumerate() {
                    let expected = dots.dot(&w[o * nb * wb..][..nb * wb], a_row);
                    let got = y[t * rows.len() + i];
                    assert_eq!(
                        got.to_bits(),
                        expected.to_bits(),
                        "{ty} nb={nb} tokens={n_tokens} t={t} o={o}: {got} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn every_output_of_the_vnni_and_the_tile_kernels_is_bit_identical_to_the_scalar_dot_product_of_its_row_and_token() {
        let mut r = XorShift(0x9e37_79b9_7f4a_7c15);
        let n_out = 37;
        let mut ran = 0;
        for reference in scalar().iter().filter(|row| row.block_dots().is_some()) {
            let ty = reference.ty;
            let Some(k) = kernel(ty) else {
                eprintln!("gemm: no kernel for {ty} on this CPU; the dot products take it");
                continue;
            };
            let act = traits::row_in(scalar(), k.activation_type()).unwrap();
            let dots = reference.block_dots().unwrap();
            let (wb, ab) = (reference.type_size, act.type_size);
            for nb in [1, 3, 19] {
                let w = reference.test.unwrap().random_row(&mut r, n_out * nb, wb);
                for n_tokens in [1, 2, 4, 5, 8, 9, 13, 16, 21, 32] {
                    let a = act.test.unwrap().random_row(&mut r, n_tokens * nb, ab);
                    let (d, aux) = terms_of(&k, &a, nb, n_tokens);
                    let terms = ActivationTerms { d: &d, aux: &aux };
                    let (w, a) = (&w[..], &a[..]);
                    let operands = Operands {
                        ty,
                        dots,
                        w,
                        a,
                        nb,
                        wb,
                        ab,
                    };
                    for (mode, rows) in modes()
                        .into_iter()
                        .flat_map(|m| [0..n_out, 5..21, 16..32, 36..37].map(|r| (m, r)))
                    {
                        let mut y = vec![f32::NAN; rows.len() * n_tokens];
                        assert!(gemm_rows_in(mode, ty, w, nb, a, terms, n_tokens, rows.clone(), &mut y).unwrap());
                        operands.assert_bit_identical(n_tokens, rows, &y);
                    }
                }
            }
            ran += 1;
        }
        // Where the kernels run, every type of the AVX-512 table with one was checked.
        if simd::isa() == Isa::Avx512 && cpu_has_bw() {
            let with_kernels = traits::for_isa(Isa::Avx512)
                .unwrap()
                .iter()
                .filter(|row| row.panel().is_some());
            assert_eq!(ran, with_kernels.count());
        }
    }

    #[test]
    fn repacked_weights_give_every_output_of_either_kernel_bit_identical_to_the_scalar_dot_product() {
        let mut r = XorShift(0x5851_f42d_4c95_7f2d);
        let n_out = 48;
        let mut ran = 0;
        for reference in scalar().iter().filter(|row| super::super::repack::supports(row.ty)) {
            let ty = reference.ty;
            if !has_repacked_kernel(ty) {
                eprintln!("gemm: no repacked kernel for {ty} on this CPU; the dot products take it");
                continue;
            }
            let k = kernel(ty).unwrap();
            let act = traits::row_in(scalar(), k.activation_type()).unwrap();
            let dots = reference.block_dots().unwrap();
            let (wb, ab) = (reference.type_size, act.type_size);
            let blocks: &[usize] = if ty.block_size() == 32 {
                &[1, 2, 9, 28]
            } else {
                &[1, 3, 6]
            };
            for &nb in blocks {
                let w = reference.test.unwrap().random_row(&mut r, n_out * nb, wb);
                let packed = super::super::repack::repack(ty, &w, nb * ty.block_size(), n_out, 2).unwrap();
                let none = ActivationTerms { d: &[], aux: &[] };
                assert!(
                    gemm_rows_repacked(&packed, &[], none, 0, 0..n_out, &mut []).unwrap(),
                    "no tokens"
                );
                for n_tokens in [1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 24, 29, 35] {
                    let a = act.test.unwrap().random_row(&mut r, n_tokens * nb, ab);
                    let (d, aux) = terms_of(&k, &a, nb, n_tokens);
                    let terms = ActivationTerms { d: &d, aux: &aux };
                    let operands = Operands {
                        ty,
                        dots,
                        w: &w,
                        a: &a,
                        nb,
                        wb,
                        ab,
                    };
                    for (mode, rows) in modes()
                        .into_iter()
                        .flat_map(|m| [0..n_out, 16..32, 32..48].map(|r| (m, r)))
                    {
                        let mut y = vec![f32::NAN; rows.len() * n_tokens];
                        let done = gemm_rows_repacked_in(mode, k, &packed, &a, terms, n_tokens, rows.clone(), &mut y);
                        assert!(done.unwrap());
                        operands.assert_bit_identical(n_tokens, rows, &y);
                    }
                    let mut y = vec![0.0; 8 * n_tokens];
                    let err = gemm_rows_repacked(&packed, &a, terms, n_tokens, 8..16, &mut y).unwrap_err();
                    assert!(err.to_string().contains("gemm_rows_repacked"), "{err}");
                }
            }
            ran += 1;
        }
        if simd::isa() == Isa::Avx512 && cpu_has_bw() {
            assert_eq!(ran, 9, "every repacked type ran");
        }
    }

    #[test]
    fn the_panels_token_threshold_is_the_types_row_and_decides_the_kernel() {
        for row in traits::for_isa(Isa::Avx512).into_iter().flatten() {
            let Some(k) = row.panel() else { continue };
            let k_quant = row.ty.block_size() == crate::quant::k_quants::QK_K;
            assert_eq!(
                k.min_tokens,
                if k_quant { MIN_TOKENS_K } else { MIN_TOKENS },
                "{}",
                row.ty
            );
        }
        for row in traits::table() {
            match min_tokens(row.ty) {
                Some(min) => {
                    assert!(
                        kernel_for(row.ty, min - 1).is_none() && kernel_for(row.ty, min).is_some(),
                        "{}",
                        row.ty
                    );
                }
                None => assert!(kernel_for(row.ty, 512).is_none(), "{}", row.ty),
            }
        }
    }

    #[test]
    fn types_without_a_kernel_are_declined_and_bad_sizes_refused() {
        let terms = ActivationTerms { d: &[], aux: &[] };
        for row in traits::table().iter().filter(|row| row.panel().is_none()) {
            assert!(
                !gemm_rows(row.ty, &[], 1, &[], terms, 0, 0..0, &mut []).unwrap(),
                "{}",
                row.ty
            );
        }
        for row in traits::table() {
            let Some(k) = kernel(row.ty) else { continue };
            let bytes = vec![0u8; row.type_size];
            let err = gemm_rows(row.ty, &bytes, 1, &bytes, terms, 1, 0..1, &mut [0.0]).unwrap_err();
            assert!(err.to_string().contains("gemm_rows"), "{err}");
            let err = k.activation_terms(&[0; 3], 1, &mut [0.0], &mut [0; 128]).unwrap_err();
            assert!(err.to_string().contains(k.activation_type().name()), "{err}");
        }
    }
}
