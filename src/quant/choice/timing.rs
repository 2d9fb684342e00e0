//! The timed passes: decoding matrix-vector products of the same weights, one copy per
//! candidate in its layout, every copy flushed from the caches before each round.

use super::{Kernel, CHUNK_ROWS, PREFETCH_DISTANCES, ROUNDS, SLICE_N_IN};
use crate::quant::gemm::{self, ActivationTerms, TileMode};
use crate::quant::simd::x86::gemm_k;
use crate::quant::{repack, traits, GgmlType};
use std::ops::Range;
use std::time::{Duration, Instant};

/// A candidate's own copy of the weights, in its layout: no candidate reads lines another
/// has just brought into the caches.
enum Copy {
    /// The file's layout, as u64 words (aligned for every block type).
    File(Vec<u64>),
    Repacked(repack::Repacked),
}

/// A slice of `ty` weights, a copy per candidate, one quantized activation row and (for
/// the repacked tiles) its terms.
struct Slice {
    ty: GgmlType,
    n_out: usize,
    row_bytes: usize,
    copies: Vec<(Kernel, Copy)>,
    act: Vec<u64>,
    act_bytes: usize,
    d: Vec<f32>,
    aux: Vec<i32>,
    y: Vec<f32>,
}

/// Pseudo-random values in [-1, 1) (a fixed sequence: the rates do not depend on them).
fn values(n: usize, mut state: u64) -> Vec<f32> {
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn words(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// The AVX-512 panel kernel of `ty`, which holds its repacked loops.
fn panel(ty: GgmlType) -> Option<gemm::PanelKernel> {
    traits::row_in(traits::for_isa(crate::quant::simd::Isa::Avx512)?, ty)?.panel()
}

impl Slice {
    fn new(ty: GgmlType, kernels: &[Kernel], slice_bytes: usize) -> Option<Slice> {
        let scalar = traits::for_isa(crate::quant::simd::Isa::Scalar)?;
        let aty = ty.vec_dot_type()?;
        let row_bytes = ty.row_size(SLICE_N_IN as u64)? as usize;
        let n_out = (slice_bytes / row_bytes / repack::GROUP).max(1) * repack::GROUP;
        // One row quantized by the reference, repeated: the kernels' speed does not depend
        // on the values, and quantizing one row costs nothing.
        let mut weights = words(n_out * row_bytes);
        let bytes: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut weights)[..n_out * row_bytes];
        let (first, rest) = bytes.split_at_mut(row_bytes);
        // A type minfer only reads has no quantizer to make its row: it is not timed.
        let row = traits::row_in(scalar, ty).filter(|row| row.can_quantize())?;
        row.quantize_ref(&values(SLICE_N_IN, 0x9e37_79b9_7f4a_7c15), first);
        for r in rest.chunks_exact_mut(row_bytes) {
            r.copy_from_slice(first);
        }
        let act_bytes = aty.row_size(SLICE_N_IN as u64)? as usize;
        let mut act = words(act_bytes);
        traits::row_in(scalar, aty)?.quantize_ref(
            &values(SLICE_N_IN, 0x2545_f491_4f6c_dd1d),
            &mut bytemuck::cast_slice_mut(&mut act)[..act_bytes],
        );
        let act_row = &bytemuck::cast_slice::<u64, u8>(&act)[..act_bytes];
        let (mut d, mut aux) = (Vec::new(), Vec::new());
        let mut copies = Vec::new();
        for &k in kernels {
            let file: &[u8] = &bytemuck::cast_slice(&weights)[..n_out * row_bytes];
            let copy = if k == Kernel::Repacked {
                let panel = panel(ty)?;
                let nb = SLICE_N_IN / ty.block_size();
                d = vec![0.0; nb];
                aux = vec![0; nb * panel.aux_words()];
                panel.activation_terms(act_row, nb, &mut d, &mut aux).ok()?;
                Copy::Repacked(repack::repack(ty, file, SLICE_N_IN, n_out, 1).ok()?)
            } else {
                Copy::File(weights.clone())
            };
            copies.push((k, copy));
        }
        Some(Slice {
            ty,
            n_out,
            row_bytes,
            copies,
            act,
            act_bytes,
            d,
            aux,
            y: vec![0.0; n_out],
        })
    }

    /// The bytes candidate `i` reads.
    fn weight_bytes(&self, i: usize) -> &[u8] {
        match &self.copies[i].1 {
            Copy::File(w) => &bytemuck::cast_slice(w)[..self.n_out * self.row_bytes],
            Copy::Repacked(r) => &r.data,
        }
    }

    /// Candidate `i`'s decoding product of the weight rows `rows`: its duration.
    fn pass(&mut self, i: usize, rows: Range<usize>) -> Option<Duration> {
        let act = &bytemuck::cast_slice(&self.act)[..self.act_bytes];
        let y = &mut self.y[..rows.len()];
        let (kernel, copy) = &self.copies[i];
        let start = Instant::now();
        match copy {
            Copy::Repacked(w) => {
                let terms = ActivationTerms {
                    d: &self.d,
                    aux: &self.aux,
                };
                let k = panel(self.ty)?;
                if !gemm::gemm_rows_repacked_in(TileMode::Vnni, k, w, act, terms, 1, rows, y).ok()? {
                    return None;
                }
            }
            Copy::File(w) => {
                let table = traits::for_isa(kernel.isa())?;
                let dots = traits::row_in(table, self.ty)?.block_dots()?;
                let w = &bytemuck::cast_slice(w)[rows.start * self.row_bytes..rows.end * self.row_bytes];
                dots.matvec(w, self.row_bytes, act, y);
            }
        }
        let elapsed = start.elapsed();
        std::hint::black_box(&self.y);
        Some(elapsed)
    }
}

/// Writes every cache line of `bytes` back and out of every cache level, so that the next
/// read streams from memory as a decoding step's does.
fn flush(bytes: &[u8]) {
    use std::arch::x86_64::{__cpuid_count, _mm_clflush, _mm_mfence};
    // CLFLUSHOPT (CPUID leaf 7, EBX bit 23) flushes lines without ordering them against
    // each other: many times faster than CLFLUSH over a few MiB.
    let opt = __cpuid_count(7, 0).ebx & (1 << 23) != 0;
    for line in bytes.chunks(64) {
        let p = line.as_ptr();
        if opt {
            // SAFETY: CLFLUSHOPT, present (checked above), of an address inside `bytes`.
            unsafe { std::arch::asm!("clflushopt [{p}]", p = in(reg) p, options(nostack, preserves_flags)) };
        } else {
            // SAFETY: CLFLUSH (SSE2, on every x86-64 CPU) of an address inside `bytes`.
            unsafe { _mm_clflush(p) };
        }
    }
    // SAFETY: a fence (SSE2); it also orders the CLFLUSHOPTs before the timed reads.
    unsafe { _mm_mfence() };
}

/// The kind of `ty`'s repacked K-quant tile, for its prefetch distance.
pub(super) fn k_kind(ty: GgmlType) -> Option<u8> {
    match ty {
        GgmlType::Q4_K => Some(gemm_k::Q4_K),
        GgmlType::Q6_K => Some(gemm_k::Q6_K),
        _ => None,
    }
}

/// The repacked tile of `ty` from memory at each of [`PREFETCH_DISTANCES`], taking turns
/// as [`measure`]'s candidates do (on one copy of the weights: the turns read different
/// rows, all flushed before each round).
pub(super) fn measure_prefetch(ty: GgmlType, slice_bytes: usize) -> Vec<(usize, f64)> {
    let Some(kind) = k_kind(ty) else { return Vec::new() };
    let Some(mut slice) = Slice::new(ty, &[Kernel::Repacked], slice_bytes) else {
        return Vec::new();
    };
    // The distance in use, put back at the end (the choice's, where it was made before).
    let in_use = gemm_k::prefetch_records(kind);
    let n = PREFETCH_DISTANCES.len();
    let mut best = vec![Duration::MAX; n];
    // Chunks of rows dealt round-robin: each distance reads its share of the slice.
    let chunks: Vec<Range<usize>> = (0..slice.n_out)
        .step_by(CHUNK_ROWS / 4)
        .map(|r| r..(r + CHUNK_ROWS / 4).min(slice.n_out))
        .collect();
    let mut rows_of = vec![0usize; n];
    for round in 0..ROUNDS {
        flush(slice.weight_bytes(0));
        let mut total = vec![Some(Duration::ZERO); n];
        rows_of.iter_mut().for_each(|r| *r = 0);
        for (c, rows) in chunks.iter().enumerate() {
            let i = (c + round) % n;
            gemm_k::set_prefetch_records(kind, PREFETCH_DISTANCES[i]);
            rows_of[i] += rows.len();
            let t = slice.pass(0, rows.clone());
            total[i] = total[i].zip(t).map(|(a, b)| a + b);
        }
        // Rows per second, so that shares of unequal size compare.
        for ((best, total), rows) in best.iter_mut().zip(total).zip(&rows_of) {
            let per_row = total.map(|t| t / (*rows).max(1) as u32);
            *best = (*best).min(per_row.unwrap_or(Duration::MAX));
        }
    }
    gemm_k::set_prefetch_records(kind, in_use);
    let row_bytes = slice.weight_bytes(0).len() as f64 / slice.n_out as f64;
    (0..n)
        .map(|i| {
            let rate = if best[i] == Duration::MAX || best[i].is_zero() {
                0.0
            } else {
                row_bytes / best[i].as_secs_f64() / 1e9
            };
            (PREFETCH_DISTANCES[i], rate)
        })
        .collect()
}

pub(super) fn measure(ty: GgmlType, kernels: &[Kernel], slice_bytes: usize, from_memory: bool) -> Vec<(Kernel, f64)> {
    let Some(mut slice) = Slice::new(ty, kernels, slice_bytes) else {
        return kernels.iter().map(|&k| (k, 0.0)).collect();
    };
    // The candidates take turns chunk by chunk, all from cold caches, so that each sees
    // the same memory (a shared host's bandwidth drifts from one pass to the next); each
    // candidate's fastest round counts.
    let chunks: Vec<Range<usize>> = (0..slice.n_out)
        .step_by(CHUNK_ROWS)
        .map(|r| r..(r + CHUNK_ROWS).min(slice.n_out))
        .collect();
    let n = kernels.len();
    let mut best = vec![Duration::MAX; n];
    for round in 0..ROUNDS {
        for i in (0..n).filter(|_| from_memory) {
            flush(slice.weight_bytes(i));
        }
        let mut total = vec![Some(Duration::ZERO); n];
        for (c, rows) in chunks.iter().enumerate() {
            for i in (0..n).map(|i| (i + c + round) % n) {
                let t = slice.pass(i, rows.clone());
                total[i] = total[i].zip(t).map(|(a, b)| a + b);
            }
        }
        for (best, total) in best.iter_mut().zip(total) {
            *best = (*best).min(total.unwrap_or(Duration::MAX));
        }
    }
    (0..n)
        .map(|i| {
            let t = best[i];
            let rate = if t == Duration::MAX || t.is_zero() {
                0.0
            } else {
                slice.weight_bytes(i).len() as f64 / t.as_secs_f64() / 1e9
            };
            (kernels[i], rate)
        })
        .collect()
}
