//! minfer: a pure-Rust LLM inference engine for GGUF models.
//!
//! The crate is cut along the inference pipeline, from the file format up:
//! - [`gguf`] reads and writes GGUF v3 files (memory-mapped, zero-copy, split models);
//! - [`quant`] defines every ggml block layout with its scalar reference quantizer and
//!   dequantizer;
//! - [`quantize`] converts a model file as llama-quantize does (its mixes' per-tensor rules,
//!   its bytes);
//! - [`tokenizer`] turns text into token ids and back (byte-level BPE from GGUF metadata);
//! - [`template`] renders a conversation with the model's own Jinja chat template;
//! - [`graph`] is the compute graph: IR, builder, params and reuse cache, allocator, scheduler,
//!   fusion pass, backend trait and registry, export;
//! - [`backends`] execute graph nodes: a device per backend made once per process (the
//!   [`backends::BackendSet`]) and an execution context per session (`backends::cpu`);
//! - [`models`] describe architectures (hyper-parameters, tensors, the forward graph);
//! - [`engine`] is the library API: a [`engine::Model`] loaded once, [`engine::Session`]s over it
//!   (one sequence's KV cache and activations each, graph reuse), and the generation loop;
//! - [`sampling`] maps a logits row and the recent token history to the next token id;
//! - `download` turns a model argument (a path, a cached name, `hf:OWNER/REPO[:QUANT]`,
//!   `ollama:NAME[:TAG]`) into a local file, fetching and verifying it into the model cache
//!   (the `download` feature);
//! - `server` is `minfer serve`, the OpenAI-compatible HTTP server over the engine, and `viz`
//!   is `minfer viz`, the page that draws the forward graph and its live timings (both behind
//!   the `server` feature).
//!
//! The command line (flags, what its surfaces print, the line editor) is the `minfer` binary's
//! own (`src/bin/minfer/`), behind the `cli` feature; nothing in the library imports it.
//!
//! Dependencies point one way, from the surfaces down to the formats: the binary, `server`,
//! `viz` → `engine` (+ `sampling`) → `models` → `graph` → `quant`; `backends` → `graph`, `quant`;
//! `models`, `tokenizer`, `template` → `gguf`; `quantize` → `gguf`, `quant`. `gguf` and `quant` know nothing of execution. The
//! design of record is the compute-graph and architecture documents.
//!
//! Every public item is documented (`missing_docs` is denied).

#![deny(missing_docs)]

#[cfg(target_endian = "big")]
compile_error!("minfer reads GGUF data in place and supports little-endian targets only");

pub mod backends;
#[cfg(feature = "download")]
pub mod download;
pub mod engine;
pub mod fs_safe;
pub mod gguf;
pub mod grammar;
pub mod graph;
pub mod models;
pub mod quant;
pub mod quantize;
pub mod sampling;
#[cfg(feature = "server")]
pub mod server;
pub mod template;
pub mod tokenizer;
#[cfg(feature = "server")]
pub mod viz;

#[cfg(test)]
mod test_util;
