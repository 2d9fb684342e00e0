//! What the CPU device says about itself for reports (`bench`): the kernels it multiplies a
//! model's matrices with, and the host memory's read bandwidth. Owns those descriptions and the
//! bandwidth probe; must not change what a run computes.

use crate::quant::GgmlType;
use std::time::Instant;

/// The CPU kernels that multiply `matrices` (type and GGUF shape) by `n_tokens` activation rows,
/// grouped by kernel: `avx512-vnni repacked (Q5_0, Q8_0, Q4_K, Q6_K)`, beside it `avx512-vnni
/// gemm (Q5_K)` for a prompt and `avx512-vnni dot (Q5_K)` for a generated token where a file has
/// a type without a repacked layout. A repacked matrix takes the repacked kernel at every token
/// count; on a CPU with AMX a prompt's reads `amx repacked (…)`.
pub fn matmul_kernels(matrices: &[(GgmlType, Vec<u64>)], n_tokens: usize) -> String {
    // The panel kernels run a prompt's tiles of 16 tokens as AMX tile products where the CPU
    // has them; the dot products are those of the instruction set chosen for the type
    // (`quant::choice`), the widest allowed for the float types.
    let panel = crate::quant::gemm::kernel_name(n_tokens);
    let dot_isa = |ty| match crate::quant::choice::kernel_of(ty) {
        Some(kernel) => kernel.isa().name(),
        None => crate::quant::simd::simd_level(),
    };
    let mut groups: Vec<(&str, &str, Vec<&str>)> = Vec::new();
    for (ty, shape) in matrices {
        let (kernel, how) = if super::repacks(*ty, shape) {
            (panel, "repacked")
        } else if crate::quant::gemm::kernel_for(*ty, n_tokens).is_some() {
            (panel, "gemm")
        } else {
            (dot_isa(*ty), "dot")
        };
        let at = groups
            .iter()
            .position(|g| (g.0, g.1) == (kernel, how))
            .unwrap_or_else(|| {
                groups.push((kernel, how, Vec::new()));
                groups.len() - 1
            });
        if !groups[at].2.contains(&ty.name()) {
            groups[at].2.push(ty.name());
        }
    }
    // Repacked, then GEMM, then dot products; in the order met within each.
    groups.sort_by_key(|g| ["repacked", "gemm", "dot"].iter().position(|h| *h == g.1));
    let groups: Vec<String> = groups
        .iter()
        .map(|(kernel, how, types)| format!("{kernel} {how} ({})", types.join(", ")))
        .collect();
    groups.join(", ")
}

/// The memory read bandwidth with `n_threads` threads, in GB/s: the best of three passes summing
/// a 512 MiB buffer (larger than any cache), each thread its share.
pub fn read_bandwidth(n_threads: usize) -> f64 {
    const BYTES: usize = 512 << 20;
    // Nonzero, so that every page is really written (and resident) before timing.
    let buf = vec![1u64; BYTES / 8];
    let n_threads = n_threads.max(1);
    let mut best = 0.0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let parts: Vec<_> = buf
                .chunks(buf.len().div_ceil(n_threads))
                .map(|part| s.spawn(move || sum_words(part)))
                .collect();
            parts
                .into_iter()
                .map(|p| p.join().unwrap_or(0))
                .fold(0, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max(BYTES as f64 / start.elapsed().as_secs_f64() / 1e9);
    }
    best
}

/// A wrapping sum of `words`: with AVX-512 where the CPU has it (a full cache line per load and
/// prefetches ahead, as the weight streams of generation read), otherwise in eight lanes the
/// compiler vectorizes.
fn sum_words(words: &[u64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { sum_words_avx512(words) };
    }
    sum_words_lanes(words)
}

fn sum_words_lanes(words: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let chunks = words.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &w) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(w);
        }
    }
    lanes.iter().chain(tail).fold(0, |a, &b| a.wrapping_add(b))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_words_avx512(words: &[u64]) -> u64 {
    use std::arch::x86_64::*;
    let body = words.len() / 32 * 32;
    let (mut a, mut b, mut c, mut d) = (
        _mm512_setzero_si512(),
        _mm512_setzero_si512(),
        _mm512_setzero_si512(),
        _mm512_setzero_si512(),
    );
    let p = words.as_ptr();
    let mut i = 0;
    while i < body {
        // 4 KiB ahead, as the dot products prefetch their weights: a core's hardware prefetcher
        // alone keeps too few lines in flight to show what the memory can do.
        for line in 0..4 {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 512 + 8 * line).cast());
        }
        a = _mm512_add_epi64(a, _mm512_loadu_si512(p.add(i).cast()));
        b = _mm512_add_epi64(b, _mm512_loadu_si512(p.add(i + 8).cast()));
        c = _mm512_add_epi64(c, _mm512_loadu_si512(p.add(i + 16).cast()));
        d = _mm512_add_epi64(d, _mm512_loadu_si512(p.add(i + 24).cast()));
        i += 32;
    }
    let v = _mm512_add_epi64(_mm512_add_epi64(a, b), _mm512_add_epi64(c, d));
    let mut lanes = [0u64; 8];
    _mm512_storeu_si512(lanes.as_mut_ptr().cast(), v);
    lanes.iter().chain(&words[body..]).fold(0, |x, &y| x.wrapping_add(y))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every two-dimensional tensor of `file`, as the bench hands them over.
    fn matrices(file: &crate::gguf::GgufFile) -> Vec<(GgmlType, Vec<u64>)> {
        file.tensors()
            .iter()
            .filter(|t| t.shape.len() == 2)
            .map(|t| (t.ggml_type, t.shape.clone()))
            .collect()
    }

    #[test]
    fn the_bandwidth_sum_adds_every_word_with_wraparound() {
        let words: Vec<u64> = (0..1003).map(|i| i * 0x9e37_79b9_7f4a_7c15).collect();
        let expected = words.iter().fold(0u64, |a, &b| a.wrapping_add(b));
        assert_eq!(sum_words(&words), expected);
        assert_eq!(sum_words_lanes(&words), expected);
        assert_eq!(sum_words(&[]), 0);
    }

    #[test]
    fn the_kernels_line_names_the_repacked_kernel_at_any_token_count_then_gemm_for_a_prompt_and_dot_for_one_token() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let file = crate::gguf::GgufFile::open(dir.join("tiny-qwen2-Q8_0.gguf")).unwrap();
        let simd = crate::quant::simd::simd_level();
        let one = matmul_kernels(&matrices(&file), 1);
        assert!(!one.contains("gemm"), "{one}");
        // The tiny model's matrices are Q8_0 except its F32 norms; those with rows in groups of
        // 16 are repacked where the CPU has the kernel.
        let q8 = |t: &&crate::gguf::TensorInfo| t.ggml_type == crate::quant::GgmlType::Q8_0 && t.shape.len() == 2;
        let any_repacked = file
            .tensors()
            .iter()
            .filter(q8)
            .any(|t| super::super::repacks(t.ggml_type, &t.shape));
        let all_repacked = file
            .tensors()
            .iter()
            .filter(q8)
            .all(|t| super::super::repacks(t.ggml_type, &t.shape));
        assert_eq!(one.contains(&format!("{simd} repacked (Q8_0")), any_repacked, "{one}");
        // The matrices left in the file's layout take the dot products of the kernel chosen
        // for the type (`quant::choice`).
        let dot = crate::quant::choice::kernel_of(crate::quant::GgmlType::Q8_0).map_or(simd, |k| k.isa().name());
        assert_eq!(one.contains(&format!("{dot} dot (Q8_0")), !all_repacked, "{one}");
        // A prompt: the repacked matrices still take the repacked kernel, the others the GEMM
        // where the CPU has it.
        let prompt = matmul_kernels(&matrices(&file), 512);
        let has_gemm = crate::quant::gemm::kernel(crate::quant::GgmlType::Q8_0).is_some();
        // A prompt's panel kernels are named for AMX where the CPU has its tiles.
        let panel = crate::quant::gemm::kernel_name(512);
        assert_eq!(panel == "amx", crate::quant::simd::amx(), "{prompt}");
        assert_eq!(
            prompt.contains(&format!("{panel} repacked (Q8_0")),
            any_repacked,
            "{prompt}"
        );
        assert_eq!(
            prompt.contains(&format!("{panel} gemm (Q8_0")),
            has_gemm && !all_repacked,
            "{prompt}"
        );
    }
}
