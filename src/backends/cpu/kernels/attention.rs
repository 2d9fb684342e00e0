//! Causal multi-head attention with grouped KV heads over a KV cache of f32, f16 or Q8_0 rows
//! (read a head at a time through [`KvRows`]; an f16 or Q8_0 cache gives exactly the bits of an
//! f32 cache holding the same values), computed with an
//! online (flash-style) softmax over blocks of cells: one running maximum, one running sum and
//! a `head_dim` accumulator per (token, head), and the scores of one block of cells at a time,
//! so no score matrix is ever materialised. Owns the score,
//! softmax and value accumulation; must not know how the cache is filled or laid out beyond the
//! row stride it is given.
//!
//! A block's weights are exponentiated together by the vectorizable [`exp_f32`], and the
//! accumulator is rescaled only when a block raises the maximum. ggml's `flash_attn_ext`
//! rescales per cell instead; the two differ by rounding only, and the tests hold this one to
//! an f64 reference.

use super::kv_region::{F16Rows, KvRegion, KvRows, Q8Rows, SCRATCH_SLACK};
use super::math::{exp_f32, is_wide};
use super::{check_len, check_nonzero, size, KernelError};
use std::ops::Range;

/// Which cells each token attends to.
#[derive(Clone, Copy, Debug)]
pub enum Visible<'a> {
    /// Token `t` sees cells `0..=positions[t]`: one sequence whose cells are its positions.
    Prefix {
        /// I32 `[n_tokens]`.
        positions: &'a [i32],
        /// Sliding window: token `t` sees only cells above `positions[t] - n_swa`.
        n_swa: Option<usize>,
    },
    /// Token `t` sees the cells `index[spans[2t]..spans[2t] + spans[2t + 1]]`, in that order
    /// (its sequence's cells by position, up to its own): several sequences, or cells that are
    /// not positions. A token whose list is `0..=p` gets exactly [`Visible::Prefix`]'s bits.
    Spans {
        /// Cell ids, I32.
        index: &'a [i32],
        /// I32 `[2, n_tokens]`: offset into `index` and count, per token.
        spans: &'a [i32],
        /// Sliding window: token `t` sees only the last `n_swa` cells of its list (a sequence's
        /// positions are consecutive, so those are the positions above `p - n_swa`).
        n_swa: Option<usize>,
    },
}

/// How a score `q · k` becomes a logit of the softmax: times `kq_scale`, and with a soft-cap
/// (Gemma 2's `attn_logit_softcapping`) `cap * tanh(s / cap)` of that, computed as ggml's flash
/// attention does: `cap * tanh(q·k * (kq_scale / cap))` (with [`tanh_f32`](super::math::tanh_f32)).
/// With attention sinks (gpt-oss), each head's softmax also has one learned logit of its own,
/// `sinks[h]`, which adds `exp(sinks[h] - max)` to the denominator and no value to the sum (as
/// ggml's `soft_max_ext` and flash attention take them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScoreScale<'a> {
    mul: f32,
    cap: Option<f32>,
    sinks: Option<&'a [f32]>,
}

impl<'a> ScoreScale<'a> {
    /// Scores times `kq_scale`, soft-capped at `softcap` when given.
    pub fn new(kq_scale: f32, softcap: Option<f32>) -> Self {
        match softcap {
            Some(cap) => ScoreScale {
                mul: kq_scale / cap,
                cap: Some(cap),
                sinks: None,
            },
            None => ScoreScale {
                mul: kq_scale,
                cap: None,
                sinks: None,
            },
        }
    }

    /// The same, each head's softmax with its sink logit (`sinks[h]`, one a query head).
    pub fn with_sinks(self, sinks: &'a [f32]) -> ScoreScale<'a> {
        ScoreScale {
            sinks: Some(sinks),
            ..self
        }
    }

    /// Head `h`'s sink logit, if the attention has sinks.
    #[inline(always)]
    fn sink(self, h: usize) -> Option<f32> {
        self.sinks.and_then(|s| s.get(h).copied())
    }

    #[inline(always)]
    fn apply(self, dot: f32) -> f32 {
        let s = dot * self.mul;
        match self.cap {
            Some(cap) => cap * super::math::tanh_f32(s),
            None => s,
        }
    }
}

impl From<f32> for ScoreScale<'_> {
    /// Scores times `kq_scale`, no soft-cap.
    fn from(kq_scale: f32) -> Self {
        ScoreScale::new(kq_scale, None)
    }
}

/// `out[t, h] = softmax_c(q[t, h] · k[c, h / g] * kq_scale) · v[c, h / g]` over the cells `c`
/// token `t` sees ([`Visible`]), with `g = n_head / n_head_kv`; `kq_scale` is `1 / sqrt(head_dim)`
/// for most models.
///
/// `q` and `out` are `[head_dim * n_head, n_tokens]`. `k` and `v` are KV cache regions of `n_kv`
/// cells; cell `c` starts at `c * kv_stride` and holds its `n_head_kv` heads of `head_dim` values
/// one after the other. A cell outside `0..n_kv` (or a span outside the index) is an error.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: KvRegion<'_>,
    v: KvRegion<'_>,
    visible: Visible<'_>,
    n_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    kv_stride: usize,
    n_kv: usize,
    scale: ScoreScale,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "attention";
    check(
        K, q, k, v, visible, n_tokens, n_head, n_head_kv, head_dim, kv_stride, n_kv,
    )?;
    check_len(K, "out", out.len(), q.len())?;
    attend(
        q,
        k,
        v,
        visible,
        n_head,
        n_head_kv,
        head_dim,
        kv_stride,
        scale,
        0..n_tokens * n_head,
        out,
    );
    Ok(())
}

/// The head rows `heads` of [`attention`]'s output, for splitting it across threads. A head row
/// is one (token, head) pair, `head_dim` values; they are numbered token-major, row
/// `t * n_head + h`, so `out` (`heads.len() * head_dim` values) is the slice
/// `out_full[heads.start * head_dim..heads.end * head_dim]`. Each row is computed exactly as
/// [`attention`] computes it, so any split gives the same bits.
#[allow(clippy::too_many_arguments)]
pub fn attention_heads(
    q: &[f32],
    k: KvRegion<'_>,
    v: KvRegion<'_>,
    visible: Visible<'_>,
    n_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    kv_stride: usize,
    n_kv: usize,
    scale: ScoreScale,
    heads: Range<usize>,
    out: &mut [f32],
) -> Result<(), KernelError> {
    const K: &str = "attention_heads";
    check(
        K, q, k, v, visible, n_tokens, n_head, n_head_kv, head_dim, kv_stride, n_kv,
    )?;
    let n_rows = size(K, "out", n_tokens, n_head)?;
    if heads.start > heads.end || heads.end > n_rows {
        return Err(KernelError::RowRange {
            kernel: K,
            start: heads.start,
            end: heads.end,
            n_out: n_rows,
        });
    }
    check_len(K, "out", out.len(), heads.len() * head_dim)?;
    attend(
        q, k, v, visible, n_head, n_head_kv, head_dim, kv_stride, scale, heads, out,
    );
    Ok(())
}

/// The size checks shared by both entry points.
#[allow(clippy::too_many_arguments)]
fn check(
    kernel: &'static str,
    q: &[f32],
    k: KvRegion<'_>,
    v: KvRegion<'_>,
    visible: Visible<'_>,
    n_tokens: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    kv_stride: usize,
    n_kv: usize,
) -> Result<(), KernelError> {
    check_nonzero(kernel, "head_dim", head_dim)?;
    check_nonzero(kernel, "n_head_kv", n_head_kv)?;
    if head_dim > MAX_HEAD_DIM {
        return Err(KernelError::TooSmall {
            kernel,
            operand: "head scratch (head_dim)",
            needed: head_dim,
            got: MAX_HEAD_DIM,
        });
    }
    if !n_head.is_multiple_of(n_head_kv) {
        return Err(KernelError::HeadGroups {
            kernel,
            n_head,
            n_head_kv,
        });
    }
    let n_embd_q = size(kernel, "q", head_dim, n_head)?;
    let n_embd_kv = size(kernel, "k", head_dim, n_head_kv)?;
    check_len(kernel, "q", q.len(), size(kernel, "q", n_embd_q, n_tokens)?)?;
    let cells_ok = |c: i32| usize::try_from(c).is_ok_and(|c| c < n_kv);
    if kv_stride < n_embd_kv {
        return Err(KernelError::TooSmall {
            kernel,
            operand: "kv_stride",
            needed: n_embd_kv,
            got: kv_stride,
        });
    }
    let kv_needed = match n_kv {
        0 => 0,
        n => size(kernel, "k", n - 1, kv_stride)?
            .checked_add(n_embd_kv)
            .ok_or(KernelError::Overflow { kernel, operand: "k" })?,
    };
    for (operand, got) in [("k length", k.len()), ("v length", v.len())] {
        if got < kv_needed {
            return Err(KernelError::TooSmall {
                kernel,
                operand,
                needed: kv_needed,
                got,
            });
        }
    }
    match visible {
        Visible::Prefix { positions, .. } => {
            check_len(kernel, "positions", positions.len(), n_tokens)?;
            if let Some((token, &pos)) = positions.iter().enumerate().find(|&(_, &p)| !cells_ok(p)) {
                return Err(KernelError::PositionOutOfRange {
                    kernel,
                    token,
                    pos,
                    n_kv,
                });
            }
        }
        Visible::Spans { index, spans, .. } => {
            check_len(kernel, "kv_span", spans.len(), size(kernel, "kv_span", 2, n_tokens)?)?;
            for (token, span) in spans.chunks_exact(2).enumerate() {
                let list = usize::try_from(span[0])
                    .ok()
                    .zip(usize::try_from(span[1]).ok())
                    .and_then(|(off, n)| index.get(off..off.checked_add(n)?));
                let Some(list) = list else {
                    return Err(KernelError::SpanOutOfRange {
                        kernel,
                        token,
                        offset: span[0],
                        count: span[1],
                        len: index.len(),
                    });
                };
                if let Some(&cell) = list.iter().find(|&&c| !cells_ok(c)) {
                    return Err(KernelError::PositionOutOfRange {
                        kernel,
                        token,
                        pos: cell,
                        n_kv,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Cells per block of the softmax: one block's scores live on the stack.
const BLOCK: usize = 128;

/// The widest head the kernel takes: a head of K and one of V are converted into scratch
/// arrays of this size (plus slack) when the cache is not f32.
const MAX_HEAD_DIM: usize = 512;

/// The operands of one attention, sizes already checked; `k` and `v` in their stored types.
#[derive(Clone, Copy)]
struct Operands<'a, KR, VR> {
    q: &'a [f32],
    k: KR,
    v: VR,
    visible: Visible<'a>,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    kv_stride: usize,
    scale: ScoreScale<'a>,
}

/// Head rows `heads` (token-major (token, head) pairs) into `out`, for the stored types of `k`
/// and `v`, compiled wide where the CPU allows ([`is_wide`]).
#[allow(clippy::too_many_arguments)]
fn attend(
    q: &[f32],
    k: KvRegion<'_>,
    v: KvRegion<'_>,
    visible: Visible<'_>,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    kv_stride: usize,
    scale: ScoreScale,
    heads: Range<usize>,
    out: &mut [f32],
) {
    macro_rules! typed {
        ($k:expr, $v:expr) => {
            attend_typed(
                Operands {
                    q,
                    k: $k,
                    v: $v,
                    visible,
                    n_head,
                    n_head_kv,
                    head_dim,
                    kv_stride,
                    scale,
                },
                heads,
                out,
            )
        };
    }
    macro_rules! with_v {
        ($k:expr) => {
            match v {
                KvRegion::F32(v) => typed!($k, v),
                KvRegion::F16(v) => typed!($k, F16Rows(v)),
                KvRegion::Q8_0(v) => typed!($k, Q8Rows(v)),
            }
        };
    }
    match k {
        KvRegion::F32(k) => with_v!(k),
        KvRegion::F16(k) => with_v!(F16Rows(k)),
        KvRegion::Q8_0(k) => with_v!(Q8Rows(k)),
    }
}

fn attend_typed<KR: KvRows, VR: KvRows>(ops: Operands<'_, KR, VR>, heads: Range<usize>, out: &mut [f32]) {
    if is_wide() {
        // SAFETY: `is_wide` checked AVX-512 F and VL (and AVX2).
        unsafe { attend_wide(ops, heads, out) };
    } else {
        attend_rows::<false, KR, VR>(ops, heads, out)
    }
}

/// [`attend_rows`] compiled for AVX-512: a named function rather than [`super::math::wide`]'s
/// closure, which the compiler does not inline whole at this size.
#[cfg_attr(target_arch = "x86_64", target_feature(enable = "avx512f,avx512vl,avx2"))]
unsafe fn attend_wide<KR: KvRows, VR: KvRows>(ops: Operands<'_, KR, VR>, heads: Range<usize>, out: &mut [f32]) {
    attend_rows::<true, KR, VR>(ops, heads, out)
}

/// Scratch for one K head and one V head converted from the stored type.
struct HeadScratch {
    k: [f32; MAX_HEAD_DIM + SCRATCH_SLACK],
    v: [f32; MAX_HEAD_DIM + SCRATCH_SLACK],
}

/// Each row: the cells in blocks of [`BLOCK`]. A block's scores are computed and its maximum
/// taken; a larger maximum than the running one rescales the accumulator and the sum (once per
/// block, not per cell, as in flash attention); then the block's weights `exp(s - max)` are
/// computed together (vectorized) and added to the sum and, times the values, to the
/// accumulator, cell by cell.
///
/// `WIDE` selects [`dot_wide`], which only a caller compiled for AVX-512 may ask for.
#[inline(always)]
fn attend_rows<const WIDE: bool, KR: KvRows, VR: KvRows>(
    ops: Operands<'_, KR, VR>,
    heads: Range<usize>,
    out: &mut [f32],
) {
    let mut scores = [0.0f32; BLOCK];
    let mut scratch = HeadScratch {
        k: [0.0; MAX_HEAD_DIM + SCRATCH_SLACK],
        v: [0.0; MAX_HEAD_DIM + SCRATCH_SLACK],
    };
    for (row, out_row) in heads.zip(out.chunks_exact_mut(ops.head_dim)) {
        // The usual head sizes accumulate in a local array the compiler keeps in registers;
        // accumulating in `out` would chain every cell's update through memory.
        match ops.head_dim {
            64 => {
                let mut acc = [0.0f32; 64];
                attend_row::<WIDE, KR, VR>(ops, row, &mut acc, &mut scores, &mut scratch);
                out_row.copy_from_slice(&acc);
            }
            128 => {
                let mut acc = [0.0f32; 128];
                attend_row::<WIDE, KR, VR>(ops, row, &mut acc, &mut scores, &mut scratch);
                out_row.copy_from_slice(&acc);
            }
            _ => attend_row::<WIDE, KR, VR>(ops, row, out_row, &mut scores, &mut scratch),
        }
    }
}

/// One head row into `acc` (`head_dim` values), with `scores` as the block's scratch.
#[inline(always)]
fn attend_row<const WIDE: bool, KR: KvRows, VR: KvRows>(
    ops: Operands<'_, KR, VR>,
    row: usize,
    acc: &mut [f32],
    scores: &mut [f32; BLOCK],
    scratch: &mut HeadScratch,
) {
    let t = row / ops.n_head;
    match ops.visible {
        Visible::Prefix { positions, n_swa } => {
            let n = positions[t] as usize + 1;
            let first = n - n_swa.map_or(n, |w| w.min(n));
            attend_cells::<WIDE, KR, VR>(ops, row, acc, scores, scratch, n - first, |j| first + j)
        }
        Visible::Spans { index, spans, n_swa } => {
            let list = &index[spans[2 * t] as usize..][..spans[2 * t + 1] as usize];
            let list = &list[list.len() - n_swa.map_or(list.len(), |w| w.min(list.len()))..];
            attend_cells::<WIDE, KR, VR>(ops, row, acc, scores, scratch, list.len(), |j| list[j] as usize)
        }
    }
}

/// [`attend_row`] over `n_cells` cells, the `j`-th being `cell(j)`: the same operations in the
/// same order whatever maps `j` to a cell, so a list `0..n` gives the prefix's bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_cells<const WIDE: bool, KR: KvRows, VR: KvRows>(
    ops: Operands<'_, KR, VR>,
    row: usize,
    acc: &mut [f32],
    scores: &mut [f32; BLOCK],
    scratch: &mut HeadScratch,
    n_cells: usize,
    cell: impl Fn(usize) -> usize,
) {
    let Operands {
        q,
        k,
        v,
        n_head,
        n_head_kv,
        kv_stride,
        scale,
        ..
    } = ops;
    // The accumulator's length, a constant where the caller's array has one.
    let head_dim = acc.len();
    let group = n_head / n_head_kv;
    let h = row % n_head;
    let qh = &q[row * head_dim..][..head_dim];
    let kv_off = (h / group) * head_dim;
    acc.fill(0.0);
    // A sink starts the running softmax as a cell of weight exp(0) = 1 and no value would.
    let (mut max, mut sum) = match scale.sink(h) {
        Some(sink) => (sink, 1.0f32),
        None => (f32::NEG_INFINITY, 0.0f32),
    };
    for start in (0..n_cells).step_by(BLOCK) {
        let cells = start..n_cells.min(start + BLOCK);
        let scores = &mut scores[..cells.len()];
        let mut block_max = f32::NEG_INFINITY;
        for (s, j) in scores.iter_mut().zip(cells.clone()) {
            let c = cell(j);
            let kc = if WIDE {
                // SAFETY: only `attend_wide`, compiled for AVX-512, instantiates WIDE.
                unsafe { k.values_wide(c * kv_stride + kv_off, head_dim, &mut scratch.k) }
            } else {
                k.values(c * kv_stride + kv_off, head_dim, &mut scratch.k)
            };
            *s = if WIDE {
                // SAFETY: only `attend_wide`, compiled for AVX-512, instantiates WIDE.
                unsafe { dot_wide(qh, kc) }
            } else {
                dot(qh, kc)
            };
            *s = scale.apply(*s);
            if *s > block_max {
                block_max = *s;
            }
        }
        if block_max > max {
            if max != f32::NEG_INFINITY {
                let rescale = exp_f32(max - block_max);
                for a in acc.iter_mut() {
                    *a *= rescale;
                }
                sum *= rescale;
            }
            max = block_max;
        }
        for s in scores.iter_mut() {
            *s = exp_f32(*s - max);
        }
        for (&w, j) in scores.iter().zip(cells) {
            let c = cell(j);
            sum += w;
            let vc = if WIDE {
                // SAFETY: as for K.
                unsafe { v.values_wide(c * kv_stride + kv_off, head_dim, &mut scratch.v) }
            } else {
                v.values(c * kv_stride + kv_off, head_dim, &mut scratch.v)
            };
            for (a, &x) in acc.iter_mut().zip(vc) {
                *a += x * w;
            }
        }
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for a in acc.iter_mut() {
        *a *= inv;
    }
}

/// f32 dot product in sixteen lanes (one AVX-512 register when compiled wide), the lanes then
/// summed as a tree (halves, quarters, ...) and the tail after: short dependency chains, so
/// the scores of consecutive cells overlap in the pipeline.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (at, bt) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        // Fixed-size arrays: the compiler sees one 16-lane vector.
        let (x, y): (&[f32; 16], &[f32; 16]) = (x.try_into().unwrap(), y.try_into().unwrap());
        for i in 0..16 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
        width /= 2;
    }
    let mut sum = lanes[0];
    for (&p, &q) in at.iter().zip(bt) {
        sum += p * q;
    }
    sum
}

/// [`dot`] with AVX-512 intrinsics: the same lanes, the same tree, the same bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx2")]
#[inline]
unsafe fn dot_wide(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len().min(b.len());
    let body = n / 16 * 16;
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < body {
        let x = _mm512_loadu_ps(a.as_ptr().add(i));
        let y = _mm512_loadu_ps(b.as_ptr().add(i));
        acc = _mm512_add_ps(acc, _mm512_mul_ps(x, y));
        i += 16;
    }
    // Lanes i + 8, i + 4, i + 2, i + 1 onto lane i, as `dot`'s tree.
    let hi8 = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    let h = _mm256_add_ps(_mm512_castps512_ps256(acc), hi8);
    let q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps::<1>(h));
    let p = _mm_add_ps(q, _mm_movehl_ps(q, q));
    let mut sum = _mm_cvtss_f32(_mm_add_ss(p, _mm_shuffle_ps::<1>(p, p)));
    for (&x, &y) in a[body..n].iter().zip(&b[body..n]) {
        sum += x * y;
    }
    sum
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn dot_wide(a: &[f32], b: &[f32]) -> f32 {
    dot(a, b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pre(positions: &[i32]) -> Visible<'_> {
        Visible::Prefix { positions, n_swa: None }
    }
    use crate::test_util::XorShift;

    struct Case {
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        kv_stride: usize,
        n_kv: usize,
        positions: Vec<i32>,
    }

    /// Scores materialised, softmax and weighted sum, all in f64, over cells `0..=position`.
    fn naive(c: &Case, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        let lists: Vec<Vec<usize>> = c.positions.iter().map(|&p| (0..=p as usize).collect()).collect();
        naive_lists(c, &lists, q, k, v)
    }

    fn run(c: &Case, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        run_visible(c, pre(&c.positions), c.positions.len(), q, k, v)
    }

    /// [`attention`] of `n_tokens` tokens over the cells `visible` gives them.
    fn run_visible(c: &Case, visible: Visible<'_>, n_tokens: usize, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let mut out = vec![f32::NAN; q.len()];
        attention(
            q,
            KvRegion::F32(k),
            KvRegion::F32(v),
            visible,
            n_tokens,
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.kv_stride,
            c.n_kv,
            (1.0 / (c.head_dim as f32).sqrt()).into(),
            &mut out,
        )
        .unwrap();
        out
    }

    fn inputs(r: &mut XorShift, c: &Case) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let q = r.vec(c.positions.len() * c.n_head * c.head_dim, 2.0);
        let k = r.vec(c.n_kv * c.kv_stride, 2.0);
        let v = r.vec(c.n_kv * c.kv_stride, 1.0);
        (q, k, v)
    }

    #[test]
    fn a_sliding_window_sees_only_the_last_n_swa_positions_in_both_forms() {
        let mut r = XorShift(69);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            kv_stride: 64,
            n_kv: 2 * BLOCK + 9,
            positions: vec![0, 3, 5, 6, BLOCK as i32 + 40, 2 * BLOCK as i32 + 8],
        };
        let (q, k, v) = inputs(&mut r, &c);
        for n_swa in [1usize, 4, 5, 100, 10_000] {
            let lists: Vec<Vec<usize>> = c
                .positions
                .iter()
                .map(|&p| ((p as usize + 1).saturating_sub(n_swa)..=p as usize).collect())
                .collect();
            let expected = naive_lists(&c, &lists, &q, &k, &v);
            let prefix = Visible::Prefix {
                positions: &c.positions,
                n_swa: Some(n_swa),
            };
            let got = run_visible(&c, prefix, c.positions.len(), &q, &k, &v);
            for (i, (&g, &e)) in got.iter().zip(&expected).enumerate() {
                assert!((g as f64 - e).abs() < 1e-5, "n_swa {n_swa}, value {i}: {g} vs {e}");
            }
            // The same cells as explicit lists (each token's whole prefix, the window applied
            // by the kernel) give the prefix form's bits.
            let mut index = Vec::new();
            let mut spans = Vec::new();
            for &p in &c.positions {
                spans.extend([index.len() as i32, p + 1]);
                index.extend(0..=p);
            }
            let listed = Visible::Spans {
                index: &index,
                spans: &spans,
                n_swa: Some(n_swa),
            };
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&run_visible(&c, listed, c.positions.len(), &q, &k, &v)),
                bits(&got),
                "n_swa {n_swa}"
            );
        }
    }

    #[test]
    fn a_soft_cap_bends_the_scaled_scores_as_cap_times_tanh_before_the_softmax() {
        // Gemma 2's attention soft-cap, here low enough (2 against scores of about 1..8) that
        // the capped softmax is far from the plain one.
        let mut r = XorShift(69);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            n_kv: 20,
            positions: vec![3, 19],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let lists: Vec<Vec<usize>> = c.positions.iter().map(|&p| (0..=p as usize).collect()).collect();
        let mut out = vec![f32::NAN; q.len()];
        let scale = ScoreScale::new(0.5, Some(2.0));
        attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&c.positions),
            2,
            4,
            2,
            64,
            128,
            20,
            scale,
            &mut out,
        )
        .unwrap();
        let expected = naive_lists_capped(&c, &lists, &q, &k, &v, 0.5, Some(2.0));
        let plain = naive_lists_scaled(&c, &lists, &q, &k, &v, 0.5);
        let mut apart = 0f64;
        for (i, (&got, &want)) in out.iter().zip(&expected).enumerate() {
            assert!((got as f64 - want).abs() < 1e-5, "value {i}: {got} vs {want}");
            apart = apart.max((want - plain[i]).abs());
        }
        assert!(apart > 0.05, "the cap changed nothing ({apart})");
    }

    #[test]
    fn a_models_own_score_scale_replaces_one_over_the_square_root_of_head_dim() {
        // Granite's attention.scale (1/128 for a 64-wide head, not 1/8), and a larger one.
        let mut r = XorShift(68);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            n_kv: 20,
            positions: vec![3, 19],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let lists: Vec<Vec<usize>> = c.positions.iter().map(|&p| (0..=p as usize).collect()).collect();
        for scale in [0.0078125f32, 0.5] {
            let mut out = vec![f32::NAN; q.len()];
            attention(
                &q,
                KvRegion::F32(&k),
                KvRegion::F32(&v),
                pre(&c.positions),
                2,
                4,
                2,
                64,
                128,
                20,
                scale.into(),
                &mut out,
            )
            .unwrap();
            let expected = naive_lists_scaled(&c, &lists, &q, &k, &v, scale as f64);
            for (i, (&got, &want)) in out.iter().zip(&expected).enumerate() {
                assert!(
                    (got as f64 - want).abs() < 1e-5,
                    "scale {scale}, value {i}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn online_softmax_matches_a_materialised_f64_reference_with_grouped_heads() {
        let mut r = XorShift(61);
        let cases = [
            Case {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 16,
                kv_stride: 32,
                n_kv: 9,
                positions: vec![0, 3, 4, 5, 8],
            },
            Case {
                n_head: 14,
                n_head_kv: 2,
                head_dim: 64,
                kv_stride: 136, // padded rows: the stride is not the row width
                n_kv: 40,
                positions: vec![30, 31, 32, 39],
            },
            Case {
                n_head: 14,
                n_head_kv: 2,
                head_dim: 64,
                kv_stride: 128,
                n_kv: 7,
                positions: vec![6],
            },
            // Several blocks of cells: the running maximum and sum cross block boundaries.
            Case {
                n_head: 4,
                n_head_kv: 1,
                head_dim: 32,
                kv_stride: 32,
                n_kv: 3 * BLOCK + 5,
                positions: vec![
                    BLOCK as i32 - 1,
                    BLOCK as i32,
                    2 * BLOCK as i32 + 7,
                    3 * BLOCK as i32 + 4,
                ],
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let (q, k, v) = inputs(&mut r, c);
            let got = run(c, &q, &k, &v);
            let want = naive(c, &q, &k, &v);
            for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g as f64 - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "case {i} [{j}]: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn a_sink_adds_its_own_logit_to_each_heads_softmax_denominator_and_nothing_else() {
        let mut r = XorShift(71);
        // Across block boundaries too, and a sink far above every score (the output near 0).
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 32,
            kv_stride: 64,
            n_kv: 2 * BLOCK + 3,
            positions: vec![0, 5, BLOCK as i32 + 1, 2 * BLOCK as i32 + 2],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let sinks = [0.7f32, -2.0, 3.5, 40.0];
        let mut got = vec![f32::NAN; q.len()];
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&c.positions),
            c.positions.len(),
            c.n_head,
            c.n_head_kv,
            c.head_dim,
            c.kv_stride,
            c.n_kv,
            ScoreScale::from(scale).with_sinks(&sinks),
            &mut got,
        )
        .unwrap();
        let group = c.n_head / c.n_head_kv;
        for (t, &p) in c.positions.iter().enumerate() {
            for h in 0..c.n_head {
                let qh = &q[(t * c.n_head + h) * c.head_dim..][..c.head_dim];
                let off = (h / group) * c.head_dim;
                let scores: Vec<f64> = (0..=p as usize)
                    .map(|j| {
                        let kj = &k[j * c.kv_stride + off..][..c.head_dim];
                        qh.iter().zip(kj).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(sinks[h] as f64, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let denom = e.iter().sum::<f64>() + (sinks[h] as f64 - max).exp();
                for d in 0..c.head_dim {
                    let want: f64 = e
                        .iter()
                        .enumerate()
                        .map(|(j, w)| w * v[j * c.kv_stride + off + d] as f64)
                        .sum::<f64>()
                        / denom;
                    let have = got[(t * c.n_head + h) * c.head_dim + d] as f64;
                    assert!(
                        (have - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "token {t} head {h} [{d}]: {have} vs {want}"
                    );
                }
            }
        }
        // Without sinks the same call is the plain softmax, which differs.
        assert_ne!(got, run(&c, &q, &k, &v));
    }

    #[test]
    fn the_wide_vector_build_gives_the_same_bits_as_the_portable_one() {
        let mut r = XorShift(67);
        let c = Case {
            n_head: 14,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            n_kv: 2 * BLOCK + 9,
            positions: vec![0, 5, BLOCK as i32 + 3, 2 * BLOCK as i32 + 8],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let dispatched = run(&c, &q, &k, &v);
        let mut portable = vec![f32::NAN; q.len()];
        let rows = 0..c.positions.len() * c.n_head;
        let ops = Operands {
            q: &q,
            k: &k[..],
            v: &v[..],
            visible: pre(&c.positions),
            n_head: 14,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            scale: 0.125.into(),
        };
        attend_rows::<false, &[f32], &[f32]>(ops, rows, &mut portable);
        let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&dispatched), bits(&portable));
    }

    #[test]
    fn an_f16_or_q8_0_cache_gives_the_bits_of_an_f32_cache_holding_the_same_values() {
        use crate::backends::cpu::kernels::KvRegionMut;
        use crate::graph::DType;
        let mut r = XorShift(63);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            n_kv: 40,
            positions: vec![3, 20, 39],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let n = k.len();
        for dtype in [DType::F16, DType::Q8_0] {
            let (mut kw, mut vw) = (vec![0f32; n], vec![0f32; n]);
            KvRegionMut::of(&mut kw, dtype, n).unwrap().write(0, &k).unwrap();
            KvRegionMut::of(&mut vw, dtype, n).unwrap().write(0, &v).unwrap();
            let (kr, vr) = (
                KvRegion::of(&kw, dtype, n).unwrap(),
                KvRegion::of(&vw, dtype, n).unwrap(),
            );
            let (mut k32, mut v32) = (vec![0f32; n], vec![0f32; n]);
            kr.read(0, &mut k32).unwrap();
            vr.read(0, &mut v32).unwrap();
            let mut typed = vec![f32::NAN; q.len()];
            attention(
                &q,
                kr,
                vr,
                pre(&c.positions),
                3,
                4,
                2,
                64,
                128,
                40,
                (1.0 / 64f32.sqrt()).into(),
                &mut typed,
            )
            .unwrap();
            let plain = run(&c, &q, &k32, &v32);
            let bits = |x: &[f32]| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&typed), bits(&plain), "{dtype:?}");
        }
    }

    #[test]
    fn cells_after_a_tokens_position_do_not_reach_it() {
        let mut r = XorShift(62);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 8,
            kv_stride: 16,
            n_kv: 6,
            positions: vec![2, 5],
        };
        let (q, mut k, mut v) = inputs(&mut r, &c);
        let before = run(&c, &q, &k, &v);
        // Change cell 4: beyond token 0 (position 2), within token 1 (position 5).
        for x in &mut v[4 * 16..5 * 16] {
            *x += 100.0;
        }
        for x in &mut k[4 * 16..5 * 16] {
            *x = -*x;
        }
        let after = run(&c, &q, &k, &v);
        let row = c.n_head * c.head_dim;
        assert_eq!(before[..row], after[..row], "token at position 2 saw cell 4");
        assert_ne!(before[row..], after[row..], "token at position 5 ignored cell 4");
    }

    #[test]
    fn a_position_outside_the_cache_is_refused() {
        let c = Case {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            kv_stride: 4,
            n_kv: 3,
            positions: vec![1, 3],
        };
        let (q, k, v) = (vec![0.0; 16], vec![0.0; 12], vec![0.0; 12]);
        let mut out = vec![0.0; 16];
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&c.positions),
            2,
            2,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention: token 1 has position 3, outside the 3 cells of the KV cache"
        );
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[-1, 0]),
            2,
            2,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert!(matches!(err, KernelError::PositionOutOfRange { token: 0, pos: -1, .. }));
    }

    #[test]
    fn any_split_of_the_head_rows_gives_the_same_bits_as_the_whole() {
        let mut r = XorShift(63);
        let small = Case {
            n_head: 6,
            n_head_kv: 2,
            head_dim: 12,
            kv_stride: 28,
            n_kv: 11,
            positions: vec![3, 4, 5, 6, 10],
        };
        // Several softmax blocks, the register-held head sizes, and a large group.
        let long = |head_dim, n_head| Case {
            n_head,
            n_head_kv: 2,
            head_dim,
            kv_stride: 2 * head_dim + 3,
            n_kv: 300,
            positions: vec![0, 31, 32, 127, 128, 200, 299],
        };
        for c in [small, long(64, 8), long(128, 6), long(20, 40)] {
            check_splits(&mut r, &c);
        }
    }

    fn check_splits(r: &mut XorShift, c: &Case) {
        let (q, k, v) = inputs(r, c);
        let whole = run(c, &q, &k, &v);
        let n_rows = c.positions.len() * c.n_head;
        for chunk in [1, 2, 5, 7, n_rows] {
            let mut out = vec![f32::NAN; q.len()];
            for (i, o) in out.chunks_mut(chunk * c.head_dim).enumerate().rev() {
                let rows = i * chunk..i * chunk + o.len() / c.head_dim;
                attention_heads(
                    &q,
                    KvRegion::F32(&k),
                    KvRegion::F32(&v),
                    pre(&c.positions),
                    c.positions.len(),
                    c.n_head,
                    c.n_head_kv,
                    c.head_dim,
                    c.kv_stride,
                    c.n_kv,
                    (1.0 / (c.head_dim as f32).sqrt()).into(),
                    rows,
                    o,
                )
                .unwrap();
            }
            let same = out.iter().zip(&whole).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "chunks of {chunk} head rows differ from the whole (head_dim {})",
                c.head_dim
            );
        }
    }

    #[test]
    fn head_rows_outside_the_output_are_refused() {
        let (q, k, v) = (vec![0.0; 16], vec![0.0; 12], vec![0.0; 12]);
        let mut out = vec![0.0; 8];
        // 2 tokens x 2 heads = 4 head rows of 4 values.
        let err = attention_heads(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0, 1]),
            2,
            2,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            3..5,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention_heads: rows 3..5 are not within the 4 output rows"
        );
        let err = attention_heads(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0, 1]),
            2,
            2,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            1..4,
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "attention_heads: out has length 8, expected 12");
        attention_heads(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0, 1]),
            2,
            2,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            2..4,
            &mut out,
        )
        .unwrap();
    }

    #[test]
    fn bad_sizes_are_refused_naming_the_kernel_and_the_sizes() {
        let (q, k, v) = (vec![0.0; 48], vec![0.0; 8], vec![0.0; 8]);
        let mut out = vec![0.0; 48];
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0]),
            1,
            12,
            5,
            4,
            20,
            1,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention: n_head = 12 is not a multiple of n_head_kv = 5"
        );
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0]),
            1,
            12,
            2,
            4,
            8,
            2,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "attention: k length = 8 is below the 16 needed");
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0]),
            1,
            12,
            2,
            4,
            6,
            1,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "attention: kv_stride = 6 is below the 8 needed");
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0]),
            1,
            12,
            2,
            4,
            8,
            1,
            (1.0 / 4f32.sqrt()).into(),
            &mut out[..47],
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "attention: out has length 47, expected 48");
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            pre(&[0, 0]),
            1,
            12,
            2,
            4,
            8,
            1,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "attention: positions has length 2, expected 1");
    }

    /// Scores materialised, softmax and weighted sum, all in f64, over each token's listed cells.
    fn naive_lists(c: &Case, lists: &[Vec<usize>], q: &[f32], k: &[f32], v: &[f32]) -> Vec<f64> {
        naive_lists_scaled(c, lists, q, k, v, 1.0 / (c.head_dim as f64).sqrt())
    }

    /// [`naive_lists`] with the scores multiplied by `scale`.
    fn naive_lists_scaled(c: &Case, lists: &[Vec<usize>], q: &[f32], k: &[f32], v: &[f32], scale: f64) -> Vec<f64> {
        naive_lists_capped(c, lists, q, k, v, scale, None)
    }

    /// [`naive_lists_scaled`] with the scaled scores soft-capped: `cap * tanh(s / cap)`.
    fn naive_lists_capped(
        c: &Case,
        lists: &[Vec<usize>],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        scale: f64,
        cap: Option<f64>,
    ) -> Vec<f64> {
        let (hd, nh) = (c.head_dim, c.n_head);
        let group = c.n_head / c.n_head_kv;
        let mut out = vec![0.0f64; q.len()];
        for (t, cells) in lists.iter().enumerate() {
            for h in 0..nh {
                let qh = &q[t * nh * hd + h * hd..][..hd];
                let kv = (h / group) * hd;
                let scores: Vec<f64> = cells
                    .iter()
                    .map(|&cell| {
                        let kc = &k[cell * c.kv_stride + kv..][..hd];
                        let s = qh.iter().zip(kc).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * scale;
                        cap.map_or(s, |cap| cap * (s / cap).tanh())
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (&cell, w) in cells.iter().zip(&weights) {
                    let vc = &v[cell * c.kv_stride + kv..][..hd];
                    for i in 0..hd {
                        out[t * nh * hd + h * hd + i] += w / total * vc[i] as f64;
                    }
                }
            }
        }
        out
    }

    fn run_spans(c: &Case, index: &[i32], spans: &[i32], q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        run_visible(
            c,
            Visible::Spans {
                index,
                spans,
                n_swa: None,
            },
            spans.len() / 2,
            q,
            k,
            v,
        )
    }

    #[test]
    fn a_span_listing_cells_zero_to_the_position_gives_the_prefix_bits() {
        let mut r = XorShift(64);
        let c = Case {
            n_head: 14,
            n_head_kv: 2,
            head_dim: 64,
            kv_stride: 128,
            n_kv: 300,
            positions: vec![0, 7, 130, 299],
        };
        let (q, k, v) = inputs(&mut r, &c);
        let prefix = run(&c, &q, &k, &v);
        let index: Vec<i32> = (0..300).collect();
        let spans: Vec<i32> = c.positions.iter().flat_map(|&p| [0, p + 1]).collect();
        let spanned = run_spans(&c, &index, &spans, &q, &k, &v);
        assert!(prefix.iter().zip(&spanned).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    #[test]
    fn a_span_of_scattered_cells_attends_to_exactly_those_cells() {
        let mut r = XorShift(65);
        let c = Case {
            n_head: 4,
            n_head_kv: 2,
            head_dim: 16,
            kv_stride: 40,
            n_kv: 200,
            positions: vec![0; 3],
        };
        let (q, mut k, mut v) = inputs(&mut r, &c);
        // Two sequences' lists in one index: A = 5, 17, 3, then 150 cells from 40; B = 1, 2.
        let a: Vec<i32> = [5, 17, 3].into_iter().chain(40..190).collect();
        let index: Vec<i32> = a.iter().copied().chain([1, 2]).collect();
        let b_at = a.len() as i32;
        // Token 0 (A) sees its first 2 cells, token 1 (A) all of A's, token 2 (B) both of B's.
        let spans = [0, 2, 0, b_at, b_at, 2];
        let lists: Vec<Vec<usize>> = vec![vec![5, 17], a.iter().map(|&c| c as usize).collect(), vec![1, 2]];
        let got = run_spans(&c, &index, &spans, &q, &k, &v);
        let want = naive_lists(&c, &lists, &q, &k, &v);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(&g, &w)| (g as f64 - w).abs())
            .fold(0.0, f64::max);
        assert!(worst < 1e-5, "max |error| {worst}");
        // A cell no list names (0, 4, 20) reaches no token.
        for cell in [0usize, 4, 20] {
            for x in &mut v[cell * 40..cell * 40 + 32] {
                *x += 50.0;
            }
            for x in &mut k[cell * 40..cell * 40 + 32] {
                *x = 9.0;
            }
        }
        assert_eq!(run_spans(&c, &index, &spans, &q, &k, &v), got);
    }

    #[test]
    fn a_span_outside_the_index_or_a_listed_cell_outside_the_cache_is_refused() {
        let (q, k, v) = (vec![0.0; 8], vec![0.0; 12], vec![0.0; 12]);
        let mut out = vec![0.0; 8];
        let visible = Visible::Spans {
            index: &[0, 1, 2],
            spans: &[0, 2, 2, 2],
            n_swa: None,
        };
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            visible,
            2,
            1,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "attention: token 1's span 2+2 lies outside the 3 cells listed"
        );
        let visible = Visible::Spans {
            index: &[0, 5],
            spans: &[0, 1, 0, 2],
            n_swa: None,
        };
        let err = attention(
            &q,
            KvRegion::F32(&k),
            KvRegion::F32(&v),
            visible,
            2,
            1,
            1,
            4,
            4,
            3,
            (1.0 / 4f32.sqrt()).into(),
            &mut out,
        )
        .unwrap_err();
        assert!(
            matches!(err, KernelError::PositionOutOfRange { token: 1, pos: 5, .. }),
            "{err}"
        );
    }
}
