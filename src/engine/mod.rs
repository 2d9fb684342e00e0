//! The engine, minfer's library API: a [`Model`] (the file, weights, tokenizer, chat template
//! and the process's backend set, loaded once and shared), [`Session`]s over it (one sequence's
//! KV cache and activations each: prefill, then decode steps that reuse one cached graph), and
//! the generation loop on top of them.
//!
//! It knows no transport and no terminal: callers receive text through a callback and timing
//! through [`GenerationStats`].
//!
//! ```
//! use minfer::engine::{generate, GenerateOptions, Model, ModelOptions, Session};
//! use minfer::sampling::SamplingParams;
//!
//! let model = Model::load("tests/fixtures/models/tiny-qwen2-Q4_0.gguf", &ModelOptions::default())?;
//! let prompt = model.encode("The quick brown fox");
//! let mut session = Session::new(&model, 128);
//! let options = GenerateOptions {
//!     max_tokens: 8,
//!     sampling: SamplingParams::greedy(),
//!     ..GenerateOptions::default()
//! };
//! let mut text = Vec::new();
//! let result = generate(&mut session, model.tokenizer(), &prompt, &options, |bytes| {
//!     text.extend_from_slice(bytes);
//!     Ok(())
//! })?;
//! assert!(result.stats.n_generated <= 8);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod generate;
mod model;
mod session;

pub use crate::backends::default_threads;
pub use generate::{
    generate, generate_cached, GenerateOptions, GenerationObserver, GenerationResult, GenerationStats, StopReason,
};
pub use model::{encode_prompt, LoadError, Model, ModelOptions};
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
