//! Computing an importance matrix as llama-imatrix does (`minfer imatrix`): the text split into
//! chunks of `n_ctx` tokens, each evaluated from an empty cache, and for every weight matrix
//! product of the layers (and of the output head, if asked) the squares of its input columns
//! summed over every token of a batch of at least 16, with the perplexity of each chunk's second
//! half as llama-imatrix prints it.
//!
//! This module drives a session and gathers statistics; the file they become is
//! `quantize::ImatrixStats`', and which tensors use them is the quantizer's business.

use super::{EngineError, Session};
use crate::quantize::ImatrixStats;

/// llama-imatrix skips products of fewer rows ("why are small batches ignored (<16 tokens)?").
const MIN_ROWS: usize = 16;

/// How to compute.
#[derive(Clone, Debug)]
pub struct ImatrixOptions {
    /// Tokens per chunk (`-c`).
    pub n_ctx: usize,
    /// At most this many chunks (`--chunks`; all by default).
    pub max_chunks: Option<usize>,
    /// Also the output head's input (`--process-output`).
    pub process_output: bool,
    /// The dataset's name for the file (the text's path).
    pub dataset: String,
}

/// Progress after each chunk: its index (from 1), the chunks in all, and the perplexity so far.
pub struct ChunkDone {
    /// 1-based.
    pub index: usize,
    /// Chunks to run.
    pub total: usize,
    /// Perplexity of the second halves so far.
    pub ppl: f64,
}

/// Why there is nothing to compute.
#[derive(Debug, thiserror::Error)]
pub enum ImatrixComputeError {
    /// The text is shorter than two chunks (llama-imatrix's own limit).
    #[error("the text tokenizes to {n_tokens} tokens; a context of {n_ctx} needs at least {}", 2 * n_ctx)]
    TooShort {
        /// Tokens of the text.
        n_tokens: usize,
        /// Tokens per chunk.
        n_ctx: usize,
    },
    /// The model failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Runs `tokens` (the text tokenized with its special tokens, as llama-imatrix does) through
/// `session` chunk by chunk and gathers the statistics; `progress` hears of each chunk.
pub fn compute_imatrix(
    session: &mut Session,
    tokens: &[u32],
    bos: Option<u32>,
    options: &ImatrixOptions,
    mut progress: impl FnMut(&ChunkDone),
) -> Result<ImatrixStats, ImatrixComputeError> {
    let n_ctx = options.n_ctx;
    if tokens.len() < 2 * n_ctx {
        return Err(ImatrixComputeError::TooShort {
            n_tokens: tokens.len(),
            n_ctx,
        });
    }
    let n_chunk = (tokens.len() / n_ctx).min(options.max_chunks.unwrap_or(usize::MAX));
    let mut stats = ImatrixStats {
        datasets: vec![options.dataset.clone()],
        chunk_size: n_ctx as u32,
        ..Default::default()
    };
    session.keep_matmul_inputs(true);
    let (mut nll, mut count) = (0.0f64, 0usize);
    let n_vocab = session.model().hparams().n_vocab;
    for c in 0..n_chunk {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        // A model that adds a BOS token starts every chunk with it.
        if let Some(bos) = bos {
            chunk[0] = bos;
        }
        session.reset();
        let logits = session.eval(&chunk, n_ctx)?.to_vec();
        session.matmul_inputs(|weight, width, rows| {
            let wanted = weight.starts_with("blk.") || (options.process_output && weight == "output.weight");
            if wanted && rows.len() / width >= MIN_ROWS {
                stats.add(weight, width, rows);
            }
        })?;
        // The second half's tokens, each from the logits before it.
        for pos in n_ctx / 2..n_ctx - 1 {
            let row = &logits[pos * n_vocab..(pos + 1) * n_vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let sum: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
            nll += sum.ln() - (row[chunk[pos + 1] as usize] - max) as f64;
            count += 1;
        }
        progress(&ChunkDone {
            index: c + 1,
            total: n_chunk,
            ppl: (nll / count as f64).exp(),
        });
    }
    session.keep_matmul_inputs(false);
    Ok(stats)
}
