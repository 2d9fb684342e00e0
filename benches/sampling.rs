//! What sampling one token costs on a vocabulary of the default model's size (151,936 logits),
//! for llama.cpp's default chain, greedy, and under a grammar's mask: the share of a decode
//! step that is not the forward pass.
//!
//! Run: `cargo bench --bench sampling`.

use minfer::sampling::{Sampler, SamplingParams};
use std::time::Instant;

const N_VOCAB: usize = 151_936;

/// Logits shaped like a model's: a few strong candidates over a broad, low background.
fn logits(seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..N_VOCAB)
        .map(|i| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let noise = (state >> 40) as f32 / (1u64 << 24) as f32;
            if i.is_multiple_of(9973) {
                12.0 + noise
            } else {
                noise * 8.0 - 4.0
            }
        })
        .collect()
}

fn time(name: &str, params: SamplingParams, mask: Option<&dyn Fn(u32) -> bool>) {
    let rows: Vec<Vec<f32>> = (0..8).map(logits).collect();
    let history: Vec<u32> = (0..512).map(|i| (i * 7919) % N_VOCAB as u32).collect();
    let mut sampler = Sampler::new(params).unwrap();
    let n = 400;
    let start = Instant::now();
    for i in 0..n {
        let row = &rows[i % rows.len()];
        sampler.build_candidates_masked(row, &history, mask).unwrap();
        std::hint::black_box(sampler.draw().unwrap());
    }
    let per = start.elapsed().as_secs_f64() / n as f64;
    println!("{name:<40} {:>8.1} µs per token", per * 1e6);
}

fn main() {
    time(
        "default chain (temp 0.8, top-k 40, ...)",
        SamplingParams::default(),
        None,
    );
    time("greedy", SamplingParams::greedy(), None);
    let allowed = |id: u32| id.is_multiple_of(16);
    time(
        "default chain under a mask (1 in 16)",
        SamplingParams::default(),
        Some(&allowed),
    );
    time(
        "top-k off (temp 0.8, top-p 0.95)",
        SamplingParams {
            top_k: 0,
            ..SamplingParams::default()
        },
        None,
    );
}
