//! A loaded model: the file, its validated weights and architecture, tokenizer and chat
//! template, and the process's backend set over the weights. Made once, shared (behind an
//! `Arc` or by reference) by every [`Session`](super::Session) over it; holds no per-sequence
//! state.
//!
//! Loading is the only place that turns a path and options into these parts, so the CLI, the
//! server, `bench` and the tests load a model the same way.

use crate::backends::BackendSet;
use crate::gguf::{GgufError, GgufFile};
use crate::grammar::{Grammar, GrammarError, GrammarSpec, GrammarVocabulary};
use crate::graph::registry::{fence_from, RegistryError};
use crate::graph::{Backend, BackendError, CParams, GraphParams, TensorSource};
use crate::models::{load_model, GgufWeights, HParams, ModelDef, ModelError};
use crate::template::{ChatTemplate, Rendered, TemplateError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// Device memory `-ngl auto` leaves free for the KV cache, activations and the driver (or 5 %
/// of the free memory, if more).
const AUTO_RESERVE: usize = 512 << 20;

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be opened or is not a valid GGUF file.
    #[error("cannot read model {path}: {source}")]
    Open {
        /// The path as given.
        path: String,
        /// What the GGUF reader found.
        source: GgufError,
    },
    /// The architecture is unknown, or its tensors or hyper-parameters are wrong.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The tokenizer metadata is missing or malformed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The chat template does not parse or cannot render a conversation.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// The backend fence names an unknown, absent or unusable backend.
    #[error(transparent)]
    Fence(#[from] RegistryError),
    /// A thread count of 0, or more than [`max_threads`].
    #[error("{n_threads} threads is out of range: use 1 to {max} (4 per logical CPU here)")]
    Threads {
        /// The count asked for.
        n_threads: usize,
        /// The most allowed on this machine.
        max: usize,
    },
    /// A backend could not prepare the weights (upload, repack).
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// `-ngl N` leaves layers on the CPU but the fence has no CPU to run them, or asks for
    /// device layers in a fence whose first backend is the CPU.
    #[error(
        "-ngl {n_gpu_layers} does not fit the backend fence ({fence}): it needs a GPU first and the CPU behind it"
    )]
    GpuLayers {
        /// The layers asked for.
        n_gpu_layers: usize,
        /// The fence's backends.
        fence: String,
    },
    /// `-ngl N` above 0 on a machine where no GPU backend can run.
    #[error("-ngl {n_gpu_layers} asks for GPU layers, and no GPU backend is usable here ({why}); give -ngl 0 or leave it out")]
    NoGpu {
        /// The layers asked for.
        n_gpu_layers: usize,
        /// Why each GPU backend of this build cannot run, as `name: reason; ...`.
        why: String,
    },
}

/// Where and how the model's forward passes run: options of the process's backend set, not
/// of a session.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// CPU threads, shared by every session (`None`: one per physical core).
    pub n_threads: Option<usize>,
    /// A backend fence, `cpu` or a comma-separated list (`None`: `MINFER_BACKENDS`, else every
    /// usable backend).
    pub backend: Option<String>,
    /// How the file is brought into memory: mapped (the default) or read, locked or not.
    pub open: crate::gguf::OpenOptions,
    /// A chat template to use instead of the file's (`--chat-template-file`'s text).
    pub chat_template: Option<String>,
    /// Layers a device (a GPU in the fence) runs, llama.cpp's `-ngl N`: the last N, the output
    /// head too when N exceeds the layer count, the rest and the embedding lookup on the CPU.
    /// `None`: every node on the highest-priority backend that runs it.
    pub n_gpu_layers: Option<usize>,
}

/// A model ready to run. See the module documentation.
///
/// ```
/// use minfer::engine::{Model, ModelOptions, Session};
///
/// let model = Model::load("tests/fixtures/models/tiny-qwen2-Q8_0.gguf", &ModelOptions::default())?;
/// let tokens = model.encode("Hello");
/// let mut session = Session::new(&model, 256);
/// let logits = session.eval(&tokens, 1)?;
/// assert_eq!(logits.len(), model.hparams().n_vocab);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Model {
    path: PathBuf,
    file: Arc<GgufFile>,
    def: Arc<dyn ModelDef>,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
    backends: BackendSet,
    /// Made on the first constrained generation: most runs never need it.
    grammar_vocabulary: OnceLock<Result<Arc<GrammarVocabulary>, GrammarError>>,
}

/// The fence and offload `-ngl` means, as llama.cpp reads it: 0 without a fence keeps every
/// layer on the CPU (the CPU alone), N above 0 without a fence needs a usable GPU backend — the
/// first of the registry's order whose probe passes, so a software adapter (lavapipe) never
/// counts — (refused with every GPU backend's reason otherwise), and no `-ngl` leaves the fence
/// to decide. With a fence, the fence's own check says whether N fits it.
fn placement(backend: Option<&str>, n_gpu_layers: Option<usize>) -> Result<(Option<&str>, Option<usize>), LoadError> {
    match n_gpu_layers {
        Some(0) if backend.is_none() => Ok((Some("cpu"), None)),
        Some(n) if n > 0 && backend.is_none() => match usable_gpu() {
            Ok(_) => Ok((backend, Some(n))),
            Err(why) => Err(LoadError::NoGpu { n_gpu_layers: n, why }),
        },
        n => Ok((backend, n)),
    }
}

/// The first GPU backend of the registry's order whose probe passes (a software adapter such as
/// lavapipe never does), or every GPU backend's reason it is not usable: what `-ngl N` needs.
pub fn usable_gpu() -> Result<&'static str, String> {
    let gpus = crate::graph::registry::entries()
        .iter()
        .filter(|e| e.handle != Backend::CPU && e.compiled);
    let mut reasons = Vec::new();
    for gpu in gpus {
        match crate::backends::probe(gpu.handle) {
            Ok(()) => return Ok(gpu.name),
            Err(why) => reasons.push(format!("{}: {why}", gpu.name)),
        }
    }
    if reasons.is_empty() {
        reasons.push("this build contains no GPU backend".into());
    }
    Err(reasons.join("; "))
}

impl Model {
    /// Open `path` (any part of a split model), check its architecture and tensors, read its
    /// tokenizer and chat template, and make the backend set. A bad backend fence is reported
    /// before the file is read.
    pub fn load(path: impl AsRef<Path>, options: &ModelOptions) -> Result<Model, LoadError> {
        let path = path.as_ref();
        if let Some(n_threads) = options.n_threads.filter(|&n| n == 0 || n > max_threads()) {
            return Err(LoadError::Threads {
                n_threads,
                max: max_threads(),
            });
        }
        let (backend, n_gpu_layers) = placement(options.backend.as_deref(), options.n_gpu_layers)?;
        let fence = fence_from(backend, &crate::backends::probe)?;
        let file = Arc::new(
            GgufFile::open_with(path, options.open).map_err(|source| LoadError::Open {
                path: path.display().to_string(),
                source,
            })?,
        );
        let def: Arc<dyn ModelDef> = Arc::from(load_model(&file)?);
        let tokenizer = Arc::new(Tokenizer::from_metadata(file.metadata())?);
        let template = match &options.chat_template {
            Some(source) => ChatTemplate::with_source(source, file.metadata())?,
            None => ChatTemplate::from_metadata(file.metadata())?,
        };
        let weights = Arc::new(GgufWeights::with_views(Arc::clone(&file), &def.weight_views()));
        // Every weight the model's forward pass names, for the backends to prepare once: a
        // prompt-shaped graph names them all (the decode fusions reuse the same weights), but
        // for those chosen by the context's size (LongRoPE's long or short factors), which a
        // second probe at the training context names.
        let probe_at = |n_ctx: usize| {
            def.build_graph(&GraphParams::new(
                2,
                1,
                CParams::new(n_ctx, fence.iter().map(|b| b.0).collect()),
            ))
        };
        let mut probe = probe_at(1);
        let mut probe_long = probe_at(def.hparams().n_ctx_train.max(2));
        // A partial offload needs a device ahead of the CPU; with the CPU alone there is
        // nothing to offload. Refused before any device is made: layers for a device the fence
        // puts behind the CPU (they would silently run on the CPU), or layers left to a CPU the
        // fence excludes.
        let first = fence.first().copied().unwrap_or(Backend::CPU);
        let n_layer = crate::graph::offload::n_layer(&crate::graph::offload::places(&probe));
        if let Some(n) = n_gpu_layers {
            let device_first = first != Backend::CPU;
            if (!device_first && n > 0) || (device_first && n <= n_layer && !fence.contains(&Backend::CPU)) {
                return Err(LoadError::GpuLayers {
                    n_gpu_layers: n,
                    fence: fence.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(","),
                });
            }
        }
        let unprepared = BackendSet::open(&fence, Arc::clone(&weights) as Arc<dyn TensorSource>, options.n_threads)?;
        let offload = match n_gpu_layers {
            // A fence without the CPU runs everything on its device (the check above refused
            // fewer layers than the model has): nothing to pin, the embedding lookup included.
            Some(_) if !fence.contains(&Backend::CPU) => None,
            Some(n) if first != Backend::CPU => Some(n),
            // No -ngl with a device first and the CPU behind it: `auto`, as many layers as the
            // device's free memory holds (a reserve kept for the KV cache and activations).
            None if first != Backend::CPU && fence.contains(&Backend::CPU) => {
                unprepared.free_memory().map(|free| {
                    let bytes_of = |name: &str| weights.weight(name).map_or(0, |w| w.data.len());
                    let (layers, head) = crate::graph::offload::weight_bytes_by_place(&probe, bytes_of);
                    let reserve = (free / 20).max(AUTO_RESERVE);
                    // Everything fitting is "every layer and the head": the embedding lookup
                    // stays on the CPU all the same (the device need not hold its table).
                    let fit = crate::graph::offload::fit_layers(&layers, head, free.saturating_sub(reserve));
                    fit.unwrap_or(layers.len() + 1)
                })
            }
            _ => None,
        };
        if let Some(n) = offload {
            crate::graph::offload::pin_to_cpu(&mut probe, n);
            crate::graph::offload::pin_to_cpu(&mut probe_long, n);
        }
        // Each device prepares the weights of the nodes it will run.
        let uses_of = |b: Backend| {
            let mut uses = probe.weight_uses_of(|node| node.backend.unwrap_or(first) == b);
            for more in probe_long.weight_uses_of(|node| node.backend.unwrap_or(first) == b) {
                match uses.iter_mut().find(|u| u.name == more.name) {
                    Some(u) => u.multiplied |= more.multiplied,
                    None => uses.push(more),
                }
            }
            uses
        };
        let backends = unprepared.prepare(&uses_of, offload)?;
        Ok(Model {
            path: path.to_path_buf(),
            file,
            def,
            tokenizer,
            template,
            backends,
            grammar_vocabulary: OnceLock::new(),
        })
    }

    /// The path the model was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The memory-mapped file (all parts of a split model).
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// The architecture's description: hyper-parameters and the forward graph.
    pub fn def(&self) -> &Arc<dyn ModelDef> {
        &self.def
    }

    /// The architecture's hyper-parameters (n_vocab, n_ctx_train, n_embd, ...).
    pub fn hparams(&self) -> &HParams {
        self.def.hparams()
    }

    /// The model's byte-level BPE tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The tokenizer as a shared handle, for what outlives a borrow of the model (a streamed
    /// response, say).
    pub fn shared_tokenizer(&self) -> Arc<Tokenizer> {
        Arc::clone(&self.tokenizer)
    }

    /// The vocabulary prepared for grammars and JSON schemas, made once (on first use) and
    /// shared by every generation.
    pub fn grammar_vocabulary(&self) -> Result<Arc<GrammarVocabulary>, GrammarError> {
        self.grammar_vocabulary
            .get_or_init(|| GrammarVocabulary::new(&self.tokenizer, self.hparams().n_vocab).map(Arc::new))
            .clone()
    }

    /// Compiles `spec` against this model's vocabulary.
    pub fn compile_grammar(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.grammar_vocabulary()?.compile(spec)
    }

    /// The model's own chat template (ChatML for a file that has none).
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The process's backends over this model's weights.
    pub fn backends(&self) -> &BackendSet {
        &self.backends
    }

    /// The tokens of a rendered prompt: special-token text is parsed, and a BOS is added only if
    /// the model asks for one (as llama.cpp does for a chat prompt).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        encode_prompt(&self.tokenizer, text)
    }

    /// [`Model::encode`] for a prompt rendered with guarded strings: control-token text inside
    /// `rendered.literal` stays text.
    pub fn encode_rendered(&self, rendered: &Rendered) -> Vec<u32> {
        self.tokenizer
            .encode_with_literal_spans(&rendered.text, true, &rendered.literal)
    }

    /// The context a session gets for a requested `n_ctx`: at least 1, at most the training
    /// context.
    pub fn clamp_n_ctx(&self, n_ctx: usize) -> usize {
        n_ctx.clamp(1, self.hparams().n_ctx_train.max(1))
    }

    /// The cells each sequence of a session made with `options` gets: `options.n_ctx` clamped
    /// as in [`Self::clamp_n_ctx`], or for `n_ctx` 0 (llama.cpp's `-c 0`, its default) the
    /// training context shared by the `n_seq_max` sequences, made smaller where the weights, that
    /// KV cache and 1 GiB to spare would not fit the machine's memory, as llama.cpp's `--fit`
    /// does on a CPU: never below 4,096 cells in all (or the training context, if smaller).
    /// With `kv_unified` the cells are the whole cache's: `n_ctx` as given (at least 1), or the
    /// fit context undivided.
    pub fn session_n_ctx(&self, options: &super::SessionOptions) -> usize {
        if options.n_ctx > 0 {
            return match options.kv_unified {
                true => options.n_ctx,
                false => self.clamp_n_ctx(options.n_ctx),
            };
        }
        let n_seq = if options.kv_unified {
            1
        } else {
            options.n_seq_max.max(1)
        };
        let total = fit_context(
            self.hparams().n_ctx_train.max(1),
            self.file.file_size(),
            // The machine's memory, which is what llama.cpp's CPU device reports.
            crate::backends::host_memory("MemTotal"),
            |n_ctx| {
                // A windowed layer keeps only its window (and a batch) unless --swa-full.
                let n_ctx_swa = if options.swa_full {
                    0
                } else {
                    self.hparams().n_swa + 512
                };
                let n_ctx_swa = if n_ctx_swa > 0 { n_ctx_swa.min(n_ctx) } else { 0 };
                super::kv_window::kv_cache_bytes(self.hparams(), options.type_k, options.type_v, n_ctx, n_ctx_swa)
                    as u64
            },
        );
        (total / n_seq).max(1)
    }
}

/// What llama.cpp's context fit leaves free of the machine's memory.
const FIT_MARGIN: u64 = 1 << 30;
/// The smallest context the fit makes (llama.cpp's `fit_params_min_ctx`).
const FIT_MIN_CTX: usize = 4096;

/// The largest context of at most `n_ctx_train` cells (and at least [`FIT_MIN_CTX`], or
/// `n_ctx_train` if smaller) whose KV cache (`kv_bytes` of a cell count), beside `weights`
/// bytes and [`FIT_MARGIN`], fits `memory` bytes; `n_ctx_train` where the memory is unknown.
/// Cut to a multiple of 256 cells, as llama.cpp pads a context.
fn fit_context(n_ctx_train: usize, weights: u64, memory: Option<u64>, kv_bytes: impl Fn(usize) -> u64) -> usize {
    let Some(memory) = memory else { return n_ctx_train };
    let budget = memory.saturating_sub(weights + FIT_MARGIN);
    if kv_bytes(n_ctx_train) <= budget {
        return n_ctx_train;
    }
    let floor = FIT_MIN_CTX.min(n_ctx_train);
    // kv_bytes grows with the cell count: the largest count that fits, by bisection.
    let (mut lo, mut hi) = (floor, n_ctx_train);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if kv_bytes(mid) <= budget {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo / 256 * 256).max(floor)
}

/// The most CPU threads a model runs on: four per logical CPU. More only adds threads waiting
/// for a core, and a count in the thousands would spend memory on stacks for nothing.
pub fn max_threads() -> usize {
    4 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The tokens of a rendered prompt with `tokenizer`: special-token text parsed, a BOS only if
/// the model asks for one.
pub fn encode_prompt(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, true, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    /// 100 KiB a cell: 32,768 cells are 3.2 GiB.
    fn kv(n: usize) -> u64 {
        n as u64 * 100 * 1024
    }

    #[test]
    fn the_training_context_is_kept_where_it_fits_and_where_memory_is_unknown() {
        assert_eq!(fit_context(32768, GIB, Some(16 * GIB), kv), 32768);
        assert_eq!(fit_context(32768, 100 * GIB, None, kv), 32768);
    }

    #[test]
    fn a_context_that_does_not_fit_shrinks_to_what_does_in_steps_of_256() {
        // 4 GiB - 1 GiB weights - 1 GiB margin leaves 2 GiB: 20,971 cells, cut to 20,736.
        assert_eq!(fit_context(32768, GIB, Some(4 * GIB), kv), 20736);
        assert!(kv(20736) <= 2 * GIB && kv(20736 + 256) > 2 * GIB);
    }

    #[test]
    fn the_fit_never_goes_below_4096_cells_or_above_the_training_context() {
        assert_eq!(fit_context(32768, 8 * GIB, Some(4 * GIB), kv), 4096);
        assert_eq!(fit_context(2048, 8 * GIB, Some(4 * GIB), kv), 2048);
    }
}
