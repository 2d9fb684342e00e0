//! The engine: a session that runs a model's graphs over a persistent KV cache (prefill, then
//! decode steps that reuse one cached graph), and the generation loop on top of it.
//!
//! It knows no transport and no terminal: callers receive text through a callback and timing
//! through [`GenerationStats`].

mod generate;
mod session;

pub use generate::{
    generate, generate_cached, GenerateOptions, GenerationObserver, GenerationResult, GenerationStats, StopReason,
};
pub use session::Session;

use crate::graph::GraphError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "the prompt needs {needed} tokens of context ({n_past} already used + {n_tokens} new), but n_ctx is {n_ctx}"
    )]
    ContextFull {
        n_past: usize,
        n_tokens: usize,
        needed: usize,
        n_ctx: usize,
    },
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("nothing to evaluate: the token list is empty")]
    EmptyBatch,
    #[error(
        "the session holds {n_past} tokens, but {n_cached} of the {n_prompt} prompt tokens were said to be cached"
    )]
    BadCachedPrefix {
        n_cached: usize,
        n_past: usize,
        n_prompt: usize,
    },
    #[error("no logits yet: nothing has been evaluated in this session")]
    NothingEvaluated,
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    #[error("output callback failed: {0}")]
    Output(String),
}
