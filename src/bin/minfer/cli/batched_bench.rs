//! `minfer bench --npl 1,2,4,8`: llama-batched-bench's measurement of parallel sequences. For
//! each prompt length PP, generation length TG and parallel count B: B sequences of PP random
//! tokens are prefilled together (batches of up to [`PREFILL_BATCH`] tokens, spanning
//! sequences), then TG steps each decode one token of every sequence in one B-token batch. The
//! speeds are aggregates over the B sequences, as llama-batched-bench reports them (`S_PP`,
//! `S_TG`, and `S` over all of the KV cache's tokens).
//!
//! It shows what decoding many sequences in one batch gains over one at a time, without a
//! server. This module measures and formats; it prints nothing itself.

use super::bench::BenchError;
use super::run::{load, LoadOptions};
use minfer::engine::{Batch, Session};
use std::path::Path;
use std::time::Instant;

/// Tokens per prefill batch (llama-batched-bench's default `n_batch` is 2048 with a 512 `n_ubatch`;
/// the engine's own prompt chunk is 512).
pub const PREFILL_BATCH: usize = 512;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BatchedOptions {
    /// Prompt lengths (`-p`, llama-batched-bench's `-npp`).
    pub n_prompt: Vec<usize>,
    /// Generation lengths (`-n`, `-ntg`).
    pub n_gen: Vec<usize>,
    /// Parallel sequence counts (`--npl`).
    pub n_parallel: Vec<usize>,
    /// CPU threads.
    pub n_threads: usize,
    /// `--backend`, as for `minfer MODEL`.
    pub backend: Option<String>,
    /// `-ngl N`, as for `minfer MODEL`.
    pub n_gpu_layers: Option<usize>,
    /// Seed of the random token ids.
    pub seed: u64,
}

/// One row: llama-batched-bench's columns.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchedResult {
    /// Prompt tokens per sequence.
    pub pp: usize,
    /// Generated tokens per sequence.
    pub tg: usize,
    /// Parallel sequences.
    pub b: usize,
    /// Tokens in the KV cache at the end: `b * (pp + tg)`.
    pub n_kv: usize,
    /// Seconds of prefill, and its aggregate tokens per second.
    pub t_pp: f64,
    /// `b * pp / t_pp`.
    pub s_pp: f64,
    /// Seconds of generation, and its aggregate tokens per second.
    pub t_tg: f64,
    /// `b * tg / t_tg`.
    pub s_tg: f64,
}

impl BatchedResult {
    /// Total seconds.
    pub fn t(&self) -> f64 {
        self.t_pp + self.t_tg
    }

    /// Tokens of the KV cache per second overall.
    pub fn s(&self) -> f64 {
        self.n_kv as f64 / self.t().max(1e-9)
    }
}

/// Runs every (PP, TG, B) combination, calling `on_result` after each.
pub fn run_batched(
    path: &Path,
    options: &BatchedOptions,
    mut on_result: impl FnMut(&BatchedResult) -> std::io::Result<()>,
) -> Result<Vec<BatchedResult>, BenchError> {
    if options.n_threads == 0 {
        return Err(BenchError::ZeroThreads);
    }
    let cases: Vec<(usize, usize, usize)> = options
        .n_prompt
        .iter()
        .flat_map(|&pp| {
            options
                .n_gen
                .iter()
                .flat_map(move |&tg| options.n_parallel.iter().map(move |&b| (pp, tg, b)))
        })
        .filter(|&(pp, tg, b)| b > 0 && pp + tg > 0)
        .collect();
    if cases.is_empty() {
        return Err(BenchError::NoTests);
    }
    let needed = cases.iter().map(|&(pp, tg, b)| b * (pp + tg)).max().unwrap_or(1);
    let loaded = load(
        path,
        &LoadOptions {
            model: minfer::engine::ModelOptions {
                n_threads: Some(options.n_threads),
                backend: options.backend.clone(),
                n_gpu_layers: options.n_gpu_layers,
                ..Default::default()
            },
            // An f16 cache, as llama-batched-bench's default.
            session: minfer::engine::SessionOptions {
                n_ctx: needed,
                ..Default::default()
            },
        },
    )?;
    let model = &loaded.model;
    let n_ctx_train = model.hparams().n_ctx_train;
    if model.clamp_n_ctx(needed) < needed {
        return Err(BenchError::ContextTooLarge { needed, n_ctx_train });
    }
    let n_vocab = model.hparams().n_vocab;
    let mut seed = options.seed.max(1);
    let mut token = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n_vocab as u64) as u32
    };
    let mut results = Vec::new();
    for (pp, tg, b) in cases {
        let mut session = Session::with_sequences(model, b * (pp + tg), b)?;
        // Warm-up, as llama-batched-bench: one small batch through the same graphs' kernels.
        session.decode(&Batch::for_sequence(&[token()], 0, 0, 1))?;
        session.reset();

        let start = Instant::now();
        let mut batch = Batch::new();
        for seq in 0..b {
            for pos in 0..pp {
                batch.add(token(), pos as i32, seq, pos + 1 == pp);
                if batch.len() == PREFILL_BATCH {
                    session.decode(&batch)?;
                    batch.clear();
                }
            }
        }
        if !batch.is_empty() {
            session.decode(&batch)?;
        }
        let t_pp = start.elapsed().as_secs_f64();

        let start = Instant::now();
        for step in 0..tg {
            batch.clear();
            for seq in 0..b {
                batch.add(token(), (pp + step) as i32, seq, true);
            }
            session.decode(&batch)?;
        }
        let t_tg = start.elapsed().as_secs_f64();
        let result = BatchedResult {
            pp,
            tg,
            b,
            n_kv: b * (pp + tg),
            t_pp,
            s_pp: (b * pp) as f64 / t_pp.max(1e-9),
            t_tg,
            s_tg: (b * tg) as f64 / t_tg.max(1e-9),
        };
        on_result(&result)?;
        results.push(result);
    }
    Ok(results)
}

/// llama-batched-bench's table header.
pub fn markdown_header() -> String {
    "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |\n\
     |-------|--------|------|--------|----------|----------|----------|----------|----------|----------|\n"
        .to_string()
}

/// One row of the table.
pub fn markdown_row(r: &BatchedResult) -> String {
    format!(
        "| {:>5} | {:>6} | {:>4} | {:>6} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} | {:>8.3} | {:>8.2} |\n",
        r.pp,
        r.tg,
        r.b,
        r.n_kv,
        r.t_pp,
        r.s_pp,
        r.t_tg,
        r.s_tg,
        r.t(),
        r.s()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combination_runs_and_fills_the_cache_it_reports() {
        let options = BatchedOptions {
            n_prompt: vec![8],
            n_gen: vec![4],
            n_parallel: vec![1, 3],
            n_threads: 1,
            backend: None,
            n_gpu_layers: None,
            seed: 7,
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-qwen2-Q8_0.gguf");
        let results = run_batched(&path, &options, |_| Ok(())).unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!((results[1].b, results[1].n_kv), (3, 36));
        assert!(results.iter().all(|r| r.s_pp > 0.0 && r.s_tg > 0.0));
        assert_eq!(markdown_row(&results[0]).matches('|').count(), 11);
    }
}
