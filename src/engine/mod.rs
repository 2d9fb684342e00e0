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

mod batch;
mod conversation;
mod embed;
mod generate;
mod host_cache;
mod imatrix;
mod kv_cells;
mod kv_window;
mod model;
pub mod profile;
mod reasoning_budget;
mod sequence;
mod session;
pub mod session_file;
mod speculative;
mod stop;
pub mod trace;

pub use crate::backends::default_threads;
pub use batch::{Batch, SeqId};
pub use conversation::{Prepared, TokenStream};
pub use embed::{check_inputs, cosine_similarity, EmbedError, Embedder, Normalize, Rows};
pub use generate::{
    eval_preparing, generate, generate_cached, GenerateOptions, GenerationObserver, GenerationResult, GenerationStats,
    StopReason, PREFILL_CHUNK,
};
pub use host_cache::{HostCache, SavedPrefix};
pub use imatrix::{compute_imatrix, ChunkDone, ImatrixComputeError, ImatrixOptions};
pub use kv_cells::{KvCells, MAX_SEQUENCES};
pub use kv_window::{kv_cache_bytes, KvWindow};
pub use model::{encode_prompt, max_threads, usable_gpu, LoadError, Model, ModelOptions};
pub use reasoning_budget::ReasoningBudget;
pub use sequence::{Sequence, Step};
pub use session::{LayerRows, Session, SessionOptions};
pub use speculative::{
    check_compatible, generate_speculative, DraftOptions, DraftSource, Drafter, ModelDrafter, NgramDrafter,
};

use crate::graph::GraphError;

/// Why an evaluation or a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The tokens do not fit in what is left of the session's context.
    #[error(
        "the prompt needs {needed} tokens of context ({n_past} already used + {n_tokens} new), but n_ctx is {n_ctx}"
    )]
    ContextFull {
        /// Tokens already in the KV cache.
        n_past: usize,
        /// Tokens of the refused batch.
        n_tokens: usize,
        /// `n_past + n_tokens`.
        needed: usize,
        /// The session's context size.
        n_ctx: usize,
    },
    /// A token id is not below n_vocab.
    #[error("token id {id} is outside the vocabulary of {n_vocab} tokens")]
    TokenOutOfRange {
        /// The offending id.
        id: u32,
        /// The model's vocabulary size.
        n_vocab: usize,
    },
    /// An evaluation was asked for no tokens.
    #[error("nothing to evaluate: the token list is empty")]
    EmptyBatch,
    /// A cached generation named a prefix the session does not hold.
    #[error(
        "the session holds {n_past} tokens, but {n_cached} of the {n_prompt} prompt tokens were said to be cached"
    )]
    BadCachedPrefix {
        /// Prompt tokens said to be in the KV cache.
        n_cached: usize,
        /// Tokens the session actually holds.
        n_past: usize,
        /// The prompt's length.
        n_prompt: usize,
    },
    /// A KV cache type that cannot hold this model's rows.
    #[error("the KV cache cannot store {which} as {name}: {reason}")]
    BadKvType {
        /// `K` or `V`.
        which: &'static str,
        /// The type asked for.
        name: &'static str,
        /// Why not.
        reason: String,
    },
    /// Context shifting moves one sequence's cells, so the cache must hold no other.
    #[error("cannot shift the context of sequence {seq}: sequence {other} also holds cells")]
    ShiftSharedCache {
        /// The sequence being shifted.
        seq: usize,
        /// Another sequence with cells.
        other: usize,
    },
    /// A context shift that does not fit what the sequence holds.
    #[error("cannot keep {n_keep} tokens and discard {n_discard} of a context of {n_past}")]
    BadShift {
        /// Tokens kept at the start.
        n_keep: usize,
        /// Tokens discarded after them.
        n_discard: usize,
        /// Tokens held.
        n_past: usize,
    },
    /// A sequence asked to go on at a position whose window the window cache no longer holds
    /// (it was dropped when the sequence went past it).
    #[error(
        "sequence {seq} cannot go on at position {pos}: the window cache no longer holds the {n_swa} positions before it \
         (the model's windowed layers keep only their window); evaluate the prompt again from the start, or run with --swa-full"
    )]
    WindowLost {
        /// The sequence.
        seq: usize,
        /// Where it asked to go on.
        pos: i32,
        /// The window.
        n_swa: usize,
    },
    /// A saved session holds every token's K and V in every layer, which a window cache past
    /// its window no longer has.
    #[error(
        "cannot save a session of {n_past} tokens: the model's windowed layers keep only the last {n_swa} positions \
         (a window cache); run with --swa-full to save sessions of this model"
    )]
    WindowNotSaved {
        /// Tokens held.
        n_past: usize,
        /// The window.
        n_swa: usize,
    },
    /// A batch larger than the window cache's free room.
    #[error(
        "a batch of {n_tokens} tokens does not fit the window cache of {n_ctx_swa} cells \
         (it holds each sequence's window and one pass of n_ubatch tokens): pass fewer tokens at once, or run with --swa-full"
    )]
    WindowFull {
        /// Tokens of the refused batch.
        n_tokens: usize,
        /// Cells of the window cache.
        n_ctx_swa: usize,
    },
    /// A batch names a sequence the session's KV cache was not made for.
    #[error("sequence {seq} is out of range: the session holds sequences 0..{n_seq_max}")]
    SeqOutOfRange {
        /// The sequence asked for.
        seq: usize,
        /// Sequences the session holds.
        n_seq_max: usize,
    },
    /// A session was asked for more sequences than a cache can track.
    #[error("{n_seq_max} sequences asked for; a session holds 1 to {max}")]
    TooManySequences {
        /// Sequences asked for.
        n_seq_max: usize,
        /// The most there can be.
        max: usize,
    },
    /// A token's position does not rise above what its sequence already holds.
    #[error("sequence {seq}: position {pos} does not follow position {after}, the last it holds")]
    PositionOrder {
        /// The sequence.
        seq: usize,
        /// The token's position.
        pos: i32,
        /// The highest position before it (-1 for none).
        after: i32,
    },
    /// Logits were asked of a batch row that did not want them.
    #[error("row {row} of the last batch has no logits (rows with logits: {n_outputs})")]
    NoLogits {
        /// The batch row.
        row: usize,
        /// Rows that had logits.
        n_outputs: usize,
    },
    /// Logits were read before any evaluation.
    #[error("no logits yet: nothing has been evaluated in this session")]
    NothingEvaluated,
    /// Building, allocating or executing the forward graph failed (a backend error included).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// The sampler refused its parameters or a logits row.
    #[error(transparent)]
    Sampling(#[from] crate::sampling::SamplingError),
    /// The grammar could not be compiled or followed.
    #[error(transparent)]
    Grammar(#[from] crate::grammar::GrammarError),
    /// A draft model's vocabulary differs from the target's (the first difference).
    #[error("the draft model cannot be used with this model: {0}")]
    IncompatibleDraft(String),
    /// The caller's output callback or observer asked to stop, with its reason.
    #[error("output callback failed: {0}")]
    Output(String),
}
