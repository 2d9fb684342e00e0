//! A session: the KV cache of one or more sequences over a model, and the forward passes that
//! fill it. It owns what its passes write (a graph cache with its allocator, and so the KV
//! regions and activation buffers, in execution contexts of the model's shared backend set)
//! and the bookkeeping of which cell holds which token of which sequence ([`KvCells`]); the
//! weights, the threads and the tokenizer belong to the [`Model`](super::Model).
//!
//! A [`Batch`] goes in; each token is placed in a cell, the graph's typed inputs are filled from
//! the batch and the cells, and the logits of the rows that want them come out. One sequence
//! whose cells are its positions (the CLI, a server slot) runs the attention bounded by
//! position; anything else runs it over explicit per-sequence cell lists, which gives each
//! sequence the bits it would get alone.

use super::host_cache::SavedPrefix;
use super::{Batch, EngineError, KvCells, KvWindow, Model, SeqId};
use crate::graph::scheduler::Timed;
use crate::graph::{
    Backend, CParams, ComputeBackend, ComputeGraph, DType, GraphAllocator, GraphCache, GraphError, GraphOutput,
    GraphParams, InputKind, KShift, NodeMeta,
};
use crate::models::ModelDef;
use std::sync::Arc;
use std::time::Instant;

/// One layer's K rows and V rows as stored (f32, f16 or Q8_0 bytes), one row a token.
pub type LayerRows = (Vec<u8>, Vec<u8>);

/// What a session is made with: options of one session's cache and passes, beside the
/// model's [`ModelOptions`](super::ModelOptions). The CLI, the server, `viz` and `bench` build
/// one each and hand it to [`Session::with_options`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// KV cells each sequence may hold (llama.cpp's `-c` for one sequence; a server's per-slot
    /// context), clamped to the model's training context; 0 (llama.cpp's default `-c 0`): the
    /// training context shared by the sequences, fit to memory ([`Model::session_n_ctx`]).
    pub n_ctx: usize,
    /// Sequences the cache holds at once (a server's slots), each of `n_ctx` cells.
    pub n_seq_max: usize,
    /// One cache of `n_ctx` cells shared by every sequence (llama.cpp's `--kv-unified`, the
    /// server's way): `n_ctx` is the whole KV budget, not clamped to the training context, and
    /// each sequence may hold up to the smaller of the two; a cell several sequences share
    /// counts once. 0 means the training context fit to memory, undivided.
    pub kv_unified: bool,
    /// How the KV cache stores K (`--cache-type-k`: f32, f16 or q8_0).
    pub type_k: DType,
    /// How the KV cache stores V (`--cache-type-v`).
    pub type_v: DType,
    /// Most prompt tokens one forward pass reads (`-ub`, and `-b` when smaller; `None`: the
    /// engine's default). The logits do not depend on it.
    pub n_ubatch: Option<usize>,
    /// Keep full KV regions for a model's windowed layers (llama.cpp's `--swa-full`) instead of
    /// a window cache of their last positions: more memory, but any earlier position can be
    /// gone back to, and saved sessions hold every layer.
    pub swa_full: bool,
}

impl Default for SessionOptions {
    /// llama.cpp's defaults: 4096 cells, one sequence, an f16 cache.
    fn default() -> Self {
        SessionOptions {
            n_ctx: 4096,
            n_seq_max: 1,
            kv_unified: false,
            type_k: DType::F16,
            type_v: DType::F16,
            n_ubatch: None,
            swa_full: false,
        }
    }
}

/// The KV cache and activations of a model's sequences; see the module documentation.
///
/// ```
/// use minfer::engine::{Model, ModelOptions, Session};
///
/// let model = Model::load("tests/fixtures/models/tiny-qwen3-Q4_K.gguf", &ModelOptions::default())?;
/// let mut session = Session::new(&model, 64);
/// let prompt = model.encode("one two three");
/// session.eval(&prompt, 1)?;
/// session.eval(&[1], 1)?; // a decode step reuses the graph and the KV cache
/// assert_eq!(session.n_past(), prompt.len() + 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// Two sequences in one batch, each getting the logits it would get alone:
///
/// ```
/// use minfer::engine::{Batch, Model, ModelOptions, Session};
///
/// let model = Model::load("tests/fixtures/models/tiny-qwen2-Q4_0.gguf", &ModelOptions::default())?;
/// let mut session = Session::with_sequences(&model, 64, 2)?;
/// let mut batch = Batch::for_sequence(&model.encode("red green"), 0, 0, 1);
/// batch.push_sequence(&model.encode("one two three"), 0, 1, 1);
/// session.decode(&batch)?;
/// let last_of_seq_1 = session.logits_ith(batch.len() - 1)?;
/// assert_eq!(last_of_seq_1.len(), model.hparams().n_vocab);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Session {
    model: Arc<dyn ModelDef>,
    cache: GraphCache,
    /// The params of the last graph: the context params, and the batch of the last step.
    params: GraphParams,
    kv: KvCells,
    /// The windowed layers' own cells, when the model has windowed layers and their window
    /// (with a pass) is smaller than the context (llama.cpp's ISWA cache); `None`: every layer
    /// keeps full regions.
    window: Option<KvWindow>,
    /// `--swa-full`: never a window cache.
    swa_full: bool,
    /// The logits of the last batch's output rows, copied out of the backend (reused: a decode
    /// step allocates nothing); empty before the first.
    logits: Vec<f32>,
    /// For each row of the last batch, its row in `logits`, or -1.
    output_rows: Vec<i32>,
    scratch: Scratch,
    /// Prompt tokens a generation prefills per forward pass (llama.cpp's `n_ubatch`).
    n_ubatch: usize,
    /// What watches each step (a trace, a profile); none: no step is timed.
    observers: Vec<Box<dyn super::trace::StepObserver>>,
}

/// Buffers reused by every step, so that a decode step allocates nothing.
#[derive(Default)]
struct Scratch {
    batch: Batch,
    cells: Vec<i32>,
    cells_swa: Vec<i32>,
    ids: Vec<i32>,
    index: Vec<i32>,
    spans: Vec<i32>,
    index_swa: Vec<i32>,
    spans_swa: Vec<i32>,
    timings: Vec<Timed>,
}

impl Session {
    /// A session over `model` holding one sequence (id 0) in `n_ctx` cells (clamped to
    /// 1 ..= the training context): one new execution context per backend of the model's set.
    /// Sessions over one model share its weights and threads, never a buffer.
    pub fn new(model: &Model, n_ctx: usize) -> Self {
        Self::with_sequences(model, n_ctx, 1).expect("one sequence is always allowed")
    }

    /// A session over `model` whose `n_ctx` cells (clamped as in [`Session::new`]) are shared
    /// by up to `n_seq_max` sequences, ids `0..n_seq_max`.
    pub fn with_sequences(model: &Model, n_ctx: usize, n_seq_max: usize) -> Result<Self, EngineError> {
        let mut session = Self::build(
            Arc::clone(model.def()),
            model.backends().new_contexts(),
            model.clamp_n_ctx(n_ctx),
            n_seq_max,
        )?;
        session.params.cparams.n_gpu_layers = model.backends().n_gpu_layers();
        Ok(session)
    }

    /// A session of `n_seq_max` sequences, each limited to `n_ctx_seq` cells (clamped as in
    /// [`Session::new`]), in a cache of `n_seq_max * n_ctx_seq` cells: a server's slots, each
    /// with a context of its own in one cache.
    pub fn with_sequences_of(model: &Model, n_ctx_seq: usize, n_seq_max: usize) -> Result<Self, EngineError> {
        let n_ctx_seq = model.clamp_n_ctx(n_ctx_seq);
        Self::with_limits(model, n_ctx_seq * n_seq_max.max(1), n_ctx_seq, n_seq_max)
    }

    /// A session of up to `n_seq_max` sequences sharing one cache of `n_ctx` cells (at least
    /// 1; not clamped to the training context: it is a budget for all of them), each sequence
    /// limited to the training context: a server that admits sequences by the cells they need
    /// rather than giving each a fixed share.
    pub fn with_budget(model: &Model, n_ctx: usize, n_seq_max: usize) -> Result<Self, EngineError> {
        let n_ctx = n_ctx.max(1);
        Self::with_limits(model, n_ctx, model.clamp_n_ctx(n_ctx), n_seq_max)
    }

    /// `n_ctx` cells for `n_seq_max` sequences of at most `n_ctx_seq` each.
    fn with_limits(model: &Model, n_ctx: usize, n_ctx_seq: usize, n_seq_max: usize) -> Result<Self, EngineError> {
        let mut session = Self::build(
            Arc::clone(model.def()),
            model.backends().new_contexts(),
            n_ctx,
            n_seq_max,
        )?;
        session.params.cparams.n_ctx_seq = n_ctx_seq;
        session.params.cparams.n_gpu_layers = model.backends().n_gpu_layers();
        session.kv.set_max_per_seq(n_ctx_seq);
        Ok(session)
    }

    /// A session over `model` as `options` say: its sequences, context, KV types and prompt
    /// passes.
    pub fn with_options(model: &Model, options: &SessionOptions) -> Result<Self, EngineError> {
        let n_ctx = model.session_n_ctx(options);
        let mut session = if options.kv_unified {
            Self::with_budget(model, n_ctx, options.n_seq_max.max(1))?
        } else if options.n_seq_max <= 1 {
            Self::with_sequences(model, n_ctx, 1)?
        } else {
            Self::with_sequences_of(model, n_ctx, options.n_seq_max)?
        };
        session.set_kv_types(options.type_k, options.type_v)?;
        session.swa_full = options.swa_full;
        session.set_n_ubatch(options.n_ubatch.unwrap_or(super::generate::PREFILL_CHUNK))?;
        Ok(session)
    }

    /// A one-sequence session over execution contexts made by the caller (in priority order)
    /// with exactly `n_ctx` cells: for tests and tools that bring their own backend.
    pub fn with_backends(
        model: impl Into<Arc<dyn ModelDef>>,
        backends: Vec<Box<dyn ComputeBackend>>,
        n_ctx: usize,
    ) -> Self {
        Self::build(model.into(), backends, n_ctx, 1).expect("one sequence is always allowed")
    }

    fn build(
        model: Arc<dyn ModelDef>,
        backends: Vec<Box<dyn ComputeBackend>>,
        n_ctx: usize,
        n_seq_max: usize,
    ) -> Result<Self, EngineError> {
        let fence: Vec<u16> = backends.iter().map(|b| b.handle().0).collect();
        let mut cparams = CParams::new(n_ctx, fence);
        cparams.n_seq_max = n_seq_max;
        (cparams.fuse_qkv, cparams.fuse_ffn) =
            crate::graph::fusion::decode_fusions(backends.first().map(|b| b.as_ref()));
        let mut session = Session {
            model,
            cache: GraphCache::new(GraphAllocator::new(backends)),
            params: GraphParams::new(1, 1, cparams),
            kv: KvCells::new(n_ctx, n_seq_max)?,
            window: None,
            swa_full: false,
            logits: Vec::new(),
            output_rows: Vec::new(),
            scratch: Scratch::default(),
            n_ubatch: super::generate::PREFILL_CHUNK,
            observers: super::trace::process_observer().into_iter().collect(),
        };
        session.configure_window()?;
        Ok(session)
    }

    /// Make the window cache the model, the context and the pass size call for (or none),
    /// emptying the cache when that changes.
    fn configure_window(&mut self) -> Result<(), EngineError> {
        let hp = self.model.hparams();
        let (n_ctx, n_seq_max) = (self.kv.n_ctx(), self.kv.n_seq_max());
        let size = KvWindow::size(hp.n_swa, n_seq_max, self.n_ubatch);
        let windowed = (0..hp.n_layer).any(|il| hp.is_swa(il));
        let wanted = (windowed && !self.swa_full && size < n_ctx).then_some(size);
        if wanted == self.window.as_ref().map(|w| w.cells().n_ctx()) {
            return Ok(());
        }
        self.window = wanted.map(|n| KvWindow::new(n, n_seq_max, hp.n_swa)).transpose()?;
        self.params.cparams.n_ctx_swa = wanted.unwrap_or(0);
        self.kv.clear();
        self.cache.alloc_mut().reset_kv()?;
        Ok(())
    }

    /// Cells of the window cache (each windowed layer's K and V regions), 0 when the session
    /// keeps none.
    pub fn n_ctx_swa(&self) -> usize {
        self.params.cparams.n_ctx_swa
    }

    /// Keep full KV regions for the windowed layers (`true`, llama.cpp's `--swa-full`) or a
    /// window cache where it is smaller; the cache starts over empty when that changes.
    pub fn set_swa_full(&mut self, swa_full: bool) -> Result<(), EngineError> {
        self.swa_full = swa_full;
        self.configure_window()
    }

    /// The architecture the session runs.
    pub fn model(&self) -> &dyn ModelDef {
        self.model.as_ref()
    }

    /// The context size: KV cells in all.
    pub fn n_ctx(&self) -> usize {
        self.params.cparams.n_ctx
    }

    /// Cells one sequence may hold (llama.cpp's `n_ctx_seq`): [`Session::n_ctx`] unless the
    /// cache is split between sequences or is a budget larger than the training context.
    pub fn n_ctx_seq(&self) -> usize {
        self.kv.max_per_seq()
    }

    /// Prompt tokens a generation prefills per forward pass (llama.cpp's `n_ubatch`; default
    /// [`PREFILL_CHUNK`](super::PREFILL_CHUNK)). The chunking changes no logit, only the
    /// passes' size: how much scratch memory a pass takes and how soon a cancellation lands.
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// Sets [`Self::n_ubatch`] (at least 1). The window cache, where the model has one, holds
    /// one pass besides the windows, so a change of size empties the cache.
    pub fn set_n_ubatch(&mut self, n_ubatch: usize) -> Result<(), EngineError> {
        self.n_ubatch = n_ubatch.max(1);
        self.configure_window()
    }

    /// Sequences the session can hold.
    pub fn n_seq_max(&self) -> usize {
        self.kv.n_seq_max()
    }

    /// Which cell holds which token of which sequence.
    pub fn kv(&self) -> &KvCells {
        &self.kv
    }

    /// Whether `seq` can go on at position `pos` after dropping what it holds from there: always
    /// with full caches; with a window cache, when it still holds the window before `pos`.
    pub fn holds_window(&self, seq: SeqId, pos: usize) -> bool {
        let pos = i32::try_from(pos).unwrap_or(i32::MAX);
        self.window.as_ref().is_none_or(|w| w.holds_window(&self.kv, seq, pos))
    }

    /// The window cache's cells, when the session keeps one.
    pub fn kv_window(&self) -> Option<&KvWindow> {
        self.window.as_ref()
    }

    /// Both caches' cells, to apply one sequence operation to each.
    fn all_cells(&mut self) -> impl Iterator<Item = &mut KvCells> {
        std::iter::once(&mut self.kv).chain(self.window.as_mut().map(KvWindow::cells_mut))
    }

    /// Tokens sequence 0 holds: the position its next token takes.
    pub fn n_past(&self) -> usize {
        self.kv.seq_pos_max(0).map_or(0, |p| p as usize + 1)
    }

    /// Forget every sequence (the cells are free; positions restart at 0).
    pub fn reset(&mut self) {
        self.all_cells().for_each(KvCells::clear);
        self.forget_emptied();
    }

    /// A sequence the full cache no longer holds anything of starts over in the window cache.
    fn forget_emptied(&mut self) {
        if let Some(w) = &mut self.window {
            for seq in 0..self.kv.n_seq_max() {
                if self.kv.seq_cells(seq).is_empty() {
                    w.forget(seq);
                }
            }
        }
    }

    /// Keep only the first `n` tokens of sequence 0 (for reusing a shared prefix).
    pub fn truncate(&mut self, n: usize) {
        let _ = self.seq_rm(Some(0), n.min(i32::MAX as usize) as i32, i32::MAX);
    }

    /// Remove the tokens of `seq` (every sequence if `None`) at positions `p0..p1`.
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), EngineError> {
        self.all_cells().try_for_each(|c| c.seq_rm(seq, p0, p1))?;
        self.forget_emptied();
        Ok(())
    }

    /// Give `dst` the tokens `src` holds at positions `p0..p1` (their cells are shared; of the
    /// window cache, those it still holds).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), EngineError> {
        self.all_cells().try_for_each(|c| c.seq_cp(src, dst, p0, p1))
    }

    /// Remove every sequence but `seq`.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.all_cells().try_for_each(|c| c.seq_keep(seq))?;
        self.forget_emptied();
        Ok(())
    }

    /// Shift the positions of `seq`'s tokens at `p0..p1` by `delta` (bookkeeping only until
    /// context shifting re-rotates K; see [`KvCells::seq_add`]).
    pub fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), EngineError> {
        self.all_cells().try_for_each(|c| c.seq_add(seq, p0, p1, delta))
    }

    /// How the cache stores K and V.
    pub fn kv_types(&self) -> (DType, DType) {
        (self.params.cparams.type_k, self.params.cparams.type_v)
    }

    /// Store K and V as `type_k` and `type_v` (`F32`, `F16`, the default, or `Q8_0`, whose
    /// rows must be whole blocks of 32 values). The cache starts over empty.
    pub fn set_kv_types(&mut self, type_k: DType, type_v: DType) -> Result<(), EngineError> {
        let row = self.model.hparams().n_kv_embd();
        for (which, t) in [("K", type_k), ("V", type_v)] {
            let reason = match t {
                DType::F32 | DType::F16 => None,
                DType::Q8_0 if row.is_multiple_of(32) => None,
                DType::Q8_0 => Some(format!(
                    "a row of {row} values is not a whole number of 32-value blocks"
                )),
                DType::I32 => Some("it is not a value type".to_string()),
            };
            if let Some(reason) = reason {
                return Err(EngineError::BadKvType {
                    which,
                    name: t.name(),
                    reason,
                });
            }
        }
        self.params.cparams.type_k = type_k;
        self.params.cparams.type_v = type_v;
        self.reset();
        self.cache.alloc_mut().reset_kv()?;
        Ok(())
    }

    /// Bytes the cache takes per token (K and V over every layer) without a window cache.
    pub fn kv_bytes_per_token(&self) -> usize {
        let hp = self.model.hparams();
        let (k, v) = self.kv_types();
        hp.n_layer * (k.bytes(hp.n_kv_embd()) + v.bytes(hp.n_kv_embd()))
    }

    /// Bytes the K and V regions of every layer take: the context's cells for each layer, the
    /// window cache's for a windowed layer when the session keeps one.
    pub fn kv_bytes(&self) -> usize {
        let (k, v) = self.kv_types();
        super::kv_window::kv_cache_bytes(self.model.hparams(), k, v, self.n_ctx(), self.n_ctx_swa())
    }

    /// Rows of layer `layer`'s K and V regions.
    fn layer_cells(&self, layer: usize) -> usize {
        match &self.window {
            Some(w) if self.model.hparams().is_swa(layer) => w.cells().n_ctx(),
            _ => self.kv.n_ctx(),
        }
    }

    /// llama.cpp's context shift, on sequence 0 (the only one the cache may hold): keep the
    /// first `n_keep` tokens, discard the `n_discard` after them, and move the rest down by
    /// `n_discard` positions. Nothing is evaluated again: each moved K row is turned back by
    /// `n_discard` positions' worth of RoPE (a rotation, so exact up to rounding; an f16 or
    /// Q8_0 row is converted to f32 for it and back, as llama.cpp does), the rows are packed
    /// into cells `0..` so that attention stays bounded by position, and generation goes on
    /// from `n_past() - n_discard`.
    ///
    /// The rows move and turn where the backend holding the KV regions keeps them, through the
    /// seam ([`ComputeBackend::rope_shift`], [`ComputeBackend::gather_rows`]). A window cache
    /// shifts alike: it holds the last positions, which all move down. The kept first tokens it
    /// dropped long before are not there: when fewer than a window are discarded, they come back
    /// into the window of the full caches' local layers but not of a window cache's, which goes
    /// on over what it holds (as llama.cpp's does once it has wrapped).
    pub fn shift_context(&mut self, n_keep: usize, n_discard: usize) -> Result<(), EngineError> {
        let n_past = self.n_past();
        let bad = EngineError::BadShift {
            n_keep,
            n_discard,
            n_past,
        };
        if n_discard == 0 || n_keep + n_discard > n_past {
            return Err(bad);
        }
        let (p0, p1) = (n_keep as i32, (n_keep + n_discard) as i32);
        // Refused before anything moves when another sequence holds cells.
        if let Some(other) = (1..self.kv.n_seq_max()).find(|&s| !self.kv.seq_cells(s).is_empty()) {
            return Err(EngineError::ShiftSharedCache { seq: 0, other });
        }
        self.seq_rm(Some(0), p0, p1)?;
        self.seq_add(0, p1, i32::MAX, -(n_discard as i32))?;
        let from = self.kv.compact(0)?;
        let from_swa = match &mut self.window {
            Some(w) => {
                w.set_floor_after_shift(0);
                w.cells_mut().compact(0)?
            }
            None => Vec::new(),
        };
        self.move_rows(&from, &from_swa)?;
        // Rows at positions below n_keep stay where they were, first in each cache.
        let n_kept = |cells: &KvCells| cells.count_in(0, 0, p0);
        let full = (n_kept(&self.kv), from.len());
        let swa = self
            .window
            .as_ref()
            .map_or((0, 0), |w| (n_kept(w.cells()), from_swa.len()));
        let hp = self.model.hparams();
        let windowed = self.window.is_some();
        let n_ctx_seq = self.params.cparams.n_ctx_seq.min(self.params.cparams.n_ctx);
        // Each layer's own rotation (a windowed layer has its own base), by the shift only: the
        // stored K already carries LongRoPE's magnitude factor once (llama.cpp's K-shift applies
        // it a second time).
        let shift_of = |layer: usize| {
            let (kept, len) = if windowed && hp.is_swa(layer) { swa } else { full };
            KShift {
                first_row: kept,
                n_rows: len - kept,
                delta: -(n_discard as i32),
                rope: crate::graph::RopeMeta {
                    attn_factor: 1.0,
                    ..crate::models::blocks::rope_meta(hp, layer, hp.n_head_kv, n_ctx_seq)
                },
            }
        };
        let alloc = self.cache.alloc_mut();
        for layer in alloc.kv_layers() {
            let shift = shift_of(layer);
            if shift.n_rows > 0 {
                alloc.shift_k(layer, &shift)?;
            }
        }
        Ok(())
    }

    /// The K (`v = false`) or V rows of `layer` as f32, one per cell (`n_kv_embd` values each),
    /// converted from the stored type and read through the backend seam: for tests and tools
    /// that check what the cache holds. Empty before the first forward pass.
    pub fn kv_rows(&mut self, layer: usize, v: bool) -> Result<Vec<f32>, EngineError> {
        let n = self.layer_cells(layer) * self.model.hparams().n_kv_embd();
        let dtype = if v {
            self.params.cparams.type_v
        } else {
            self.params.cparams.type_k
        };
        let Some(words) = self.region_words(layer, v, dtype.bytes(n))? else {
            return Ok(Vec::new());
        };
        let ty = dtype.ggml_type().expect("a KV type holds values");
        let mut rows = vec![0f32; n];
        crate::quant::dequantize_row(ty, &bytemuck::cast_slice(&words)[..dtype.bytes(n)], &mut rows)
            .map_err(|e| EngineError::Output(format!("the KV region of layer {layer}: {e}")))?;
        Ok(rows)
    }

    /// The first `bytes` bytes of a KV region, in f32 words; `None` before the region exists.
    fn region_words(&mut self, layer: usize, v: bool, bytes: usize) -> Result<Option<Vec<f32>>, EngineError> {
        let alloc = self.cache.alloc_mut();
        if !alloc.kv_layers().contains(&layer) {
            return Ok(None);
        }
        let mut words = vec![0f32; bytes.div_ceil(4)];
        alloc.read_kv(layer, v, &mut bytemuck::cast_slice_mut(&mut words)[..bytes])?;
        Ok(Some(words))
    }

    /// Sequence 0's tokens and, per layer, the stored bytes of their K and V rows, for a saved
    /// session. Its cells are packed first when they are not its positions. A window cache
    /// that no longer holds every token's rows is refused by name (`--swa-full` keeps them).
    pub fn export_state(&mut self) -> Result<(Vec<u32>, Vec<LayerRows>), EngineError> {
        if let Some(w) = &self.window {
            let n_past = self.n_past();
            if w.cells().seq_cells(0).len() < n_past {
                return Err(EngineError::WindowNotSaved {
                    n_past,
                    n_swa: w.n_swa(),
                });
            }
        }
        let other = |c: &KvCells| (1..c.n_seq_max()).find(|&s| !c.seq_cells(s).is_empty());
        if !self.kv.is_identity(0) || self.window.as_ref().is_some_and(|w| !w.cells().is_identity(0)) {
            if let Some(other) = other(&self.kv) {
                return Err(EngineError::ShiftSharedCache { seq: 0, other });
            }
            let from = self.kv.compact(0)?;
            let from_swa = match &mut self.window {
                Some(w) => w.cells_mut().compact(0)?,
                None => Vec::new(),
            };
            self.move_rows(&from, &from_swa)?;
        }
        let tokens = self.seq_tokens(0);
        let n = tokens.len() * self.model.hparams().n_kv_embd();
        let (type_k, type_v) = self.kv_types();
        let mut layers = Vec::new();
        for layer in 0..self.model.hparams().n_layer {
            let mut pair: LayerRows = (Vec::new(), Vec::new());
            for (v, dtype) in [(false, type_k), (true, type_v)] {
                let bytes = dtype.bytes(n);
                let rows = match self.region_words(layer, v, bytes)? {
                    Some(words) => bytemuck::cast_slice::<f32, u8>(&words)[..bytes].to_vec(),
                    None if n == 0 => Vec::new(),
                    None => return Err(EngineError::Output(format!("layer {layer} has no KV rows to save"))),
                };
                if v {
                    pair.1 = rows;
                } else {
                    pair.0 = rows;
                }
            }
            layers.push(pair);
        }
        Ok((tokens, layers))
    }

    /// Replace everything the cache holds with `tokens` in sequence 0 at positions `0..`, and
    /// the stored bytes of their K and V rows (one pair per layer, as
    /// [`Session::export_state`] gives them, in this session's KV types).
    pub fn import_state(&mut self, tokens: &[u32], layers: &[(&[u8], &[u8])]) -> Result<(), EngineError> {
        let model = Arc::clone(&self.model);
        let hp = model.hparams();
        let n = tokens.len() * hp.n_kv_embd();
        let (type_k, type_v) = self.kv_types();
        if layers.len() != hp.n_layer
            || layers
                .iter()
                .any(|(k, v)| k.len() != type_k.bytes(n) || v.len() != type_v.bytes(n))
        {
            return Err(EngineError::Output(format!(
                "a saved state needs {} layers of {} K bytes and {} V bytes",
                hp.n_layer,
                type_k.bytes(n),
                type_v.bytes(n)
            )));
        }
        // The regions exist once a graph has been allocated.
        self.prepare_graph(1, 1)?;
        self.kv.restore(0, tokens, 0)?;
        // A window cache takes the last window's rows of its layers.
        let n_tail = self.window.as_ref().map_or(0, |w| tokens.len().min(w.n_swa()));
        let first = tokens.len() - n_tail;
        if let Some(w) = &mut self.window {
            w.cells_mut().restore(0, &tokens[first..], first as i32)?;
        }
        let windowed = |layer: usize| self.window.is_some() && hp.is_swa(layer);
        let tails: Vec<bool> = (0..layers.len()).map(windowed).collect();
        let alloc = self.cache.alloc_mut();
        for (layer, (k, v)) in layers.iter().enumerate() {
            let (k, v) = if tails[layer] {
                (
                    &k[type_k.bytes(first * hp.n_kv_embd())..],
                    &v[type_v.bytes(first * hp.n_kv_embd())..],
                )
            } else {
                (*k, *v)
            };
            alloc.write_kv(layer, false, k)?;
            alloc.write_kv(layer, true, v)?;
        }
        Ok(())
    }

    /// Copy each layer's K and V rows (in their stored types) so that new cell `i` holds old
    /// cell `from[i]`'s (`from_swa[i]`'s in a windowed layer's window regions).
    fn move_rows(&mut self, from: &[u32], from_swa: &[u32]) -> Result<(), EngineError> {
        let hp = self.model.hparams();
        let row = hp.n_kv_embd();
        let windowed = self.window.is_some();
        let (type_k, type_v) = self.kv_types();
        let alloc = self.cache.alloc_mut();
        for layer in alloc.kv_layers() {
            let from = if windowed && hp.is_swa(layer) { from_swa } else { from };
            for (v, dtype) in [(false, type_k), (true, type_v)] {
                alloc.gather_kv(layer, v, dtype.bytes(row), from)?;
            }
        }
        Ok(())
    }

    /// The tokens `seq` holds, in position order.
    pub fn seq_tokens(&self, seq: SeqId) -> Vec<u32> {
        self.kv.seq_tokens(seq).collect()
    }

    /// Prepare `seq` to generate from `prompt`, its whole context: keep the longest prefix of
    /// what it holds that `prompt` starts with (at most all of `prompt` but its last token,
    /// whose logits are needed), drop the rest, and return the length kept, which is where
    /// prefilling starts.
    ///
    /// With a window cache, a prefix whose window it no longer holds (the sequence went more
    /// than a window past it) is not kept: the prompt is read again from the start, as
    /// llama-server does.
    pub fn reuse_prefix(&mut self, seq: SeqId, prompt: &[u32]) -> Result<usize, EngineError> {
        let held = self.kv.seq_tokens(seq).zip(prompt).take_while(|(a, b)| a == *b).count();
        let mut kept = held.min(prompt.len().saturating_sub(1));
        if !self.holds_window(seq, kept) {
            kept = 0;
        }
        self.seq_rm(Some(seq), kept as i32, i32::MAX)?;
        Ok(kept)
    }
    /// [`Session::reuse_prefix`] for `dst`, taking the prefix of `prompt` that `src` holds when
    /// it is longer than what `dst` keeps of its own: `dst` then shares `src`'s cells for it
    /// (llama.cpp's `seq_cp`; nothing is copied or computed again, and what either sequence
    /// drops later stays for the other). Returns where prefilling starts. With a window cache
    /// only `dst`'s own prefix is kept: the window layers' cells are not shared.
    pub fn share_prefix(&mut self, src: SeqId, dst: SeqId, prompt: &[u32]) -> Result<usize, EngineError> {
        let own = self.reuse_prefix(dst, prompt)?;
        if self.window.is_some() || src == dst {
            return Ok(own);
        }
        let shared = self.kv.prefix_len(src, prompt).min(prompt.len().saturating_sub(1));
        if shared <= own {
            return Ok(own);
        }
        self.seq_rm(Some(dst), 0, i32::MAX)?;
        self.seq_cp(src, dst, 0, shared as i32)?;
        Ok(shared)
    }

    /// A host copy of what `seq` holds at positions `0, 1, ...` without a gap: its tokens and
    /// each layer's stored K and V rows (for the host tier of the prompt cache). Refused with a
    /// window cache, whose layers hold only the last positions.
    pub fn save_prefix(&mut self, seq: SeqId) -> Result<SavedPrefix, EngineError> {
        if let Some(w) = &self.window {
            return Err(EngineError::WindowNotSaved {
                n_past: self.kv.seq_cells(seq).len(),
                n_swa: w.n_swa(),
            });
        }
        let tokens: Vec<u32> = self.kv.seq_tokens(seq).collect();
        let n = self.kv.prefix_len(seq, &tokens);
        let cells: Vec<u32> = self.kv.seq_cells(seq)[..n].to_vec();
        let (row_k, row_v) = self.row_bytes();
        let alloc = self.cache.alloc_mut();
        let layers = alloc.kv_layers();
        let mut rows = vec![0u8; layers.len() * n * (row_k + row_v)];
        let mut at = 0;
        for &layer in &layers {
            for (v, row) in [(false, row_k), (true, row_v)] {
                let part = &mut rows[at..at + n * row];
                for_runs(&cells, |i, cell, len| {
                    alloc.read_kv_at(layer, v, cell * row, &mut part[i * row..(i + len) * row])
                })?;
                at += n * row;
            }
        }
        Ok(SavedPrefix {
            tokens: tokens[..n].to_vec(),
            layers,
            row_bytes: (row_k, row_v),
            rows,
        })
    }

    /// Give `seq`, which holds exactly positions `0..from` of `saved`'s tokens, positions
    /// `from..to` from the copy: new cells whose K and V rows are the saved bytes (no forward
    /// pass). Returns `to`.
    pub fn restore_prefix(
        &mut self,
        seq: SeqId,
        saved: &SavedPrefix,
        from: usize,
        to: usize,
    ) -> Result<usize, EngineError> {
        let to = to.min(saved.tokens.len());
        let held = self.kv.prefix_len(seq, &saved.tokens);
        // A copy in other KV types (the cache's changed since) is not this cache's to take.
        if from >= to
            || held != from
            || self.kv.seq_cells(seq).len() != from
            || self.window.is_some()
            || saved.row_bytes != self.row_bytes()
        {
            return Ok(from);
        }
        // The regions exist once a graph has been allocated.
        self.prepare_graph(1, 1)?;
        let mut batch = Batch::new();
        for (i, &token) in saved.tokens[from..to].iter().enumerate() {
            batch.add(token, (from + i) as i32, seq, false);
        }
        let mut cells = Vec::new();
        self.kv.place(&batch, &mut cells)?;
        let cells: Vec<u32> = cells.iter().map(|&c| c as u32).collect();
        let (row_k, row_v) = self.row_bytes();
        let alloc = self.cache.alloc_mut();
        let written = saved.layers.iter().enumerate().try_for_each(|(l, &layer)| {
            for (v, row) in [(false, row_k), (true, row_v)] {
                let rows = saved.layer_rows(l, v, from, to);
                for_runs(&cells, |i, cell, len| {
                    alloc.write_kv_at(layer, v, cell * row, &rows[i * row..(i + len) * row])
                })?;
            }
            Ok::<(), EngineError>(())
        });
        if let Err(e) = written {
            let _ = self.kv.seq_rm(Some(seq), from as i32, i32::MAX);
            return Err(e);
        }
        Ok(to)
    }

    /// Bytes of one cell's K row and V row in the stored types.
    fn row_bytes(&self) -> (usize, usize) {
        let row = self.model.hparams().n_kv_embd();
        let (k, v) = self.kv_types();
        (k.bytes(row), v.bytes(row))
    }

    /// Turn the decode fusions on or off (the default comes from `MINFER_NO_FUSE_QKV` /
    /// `MINFER_NO_FUSE_FFN`). The flags are part of the graph's identity, so the next step
    /// rebuilds.
    pub fn set_fusion(&mut self, fuse_qkv: bool, fuse_ffn: bool) {
        self.params.cparams.fuse_qkv = fuse_qkv;
        self.params.cparams.fuse_ffn = fuse_ffn;
    }

    /// Keep every weight matrix product's input rows after each step, for
    /// [`Session::matmul_inputs`] (`minfer imatrix`); the decode fusions go off, so that every
    /// product is its own node. Part of the graph's identity: the next step rebuilds.
    pub fn keep_matmul_inputs(&mut self, keep: bool) {
        self.params.cparams.keep_matmul_inputs = keep;
        if keep {
            self.set_fusion(false, false);
        }
    }

    /// After a step run with [`Session::keep_matmul_inputs`]: each weight matrix product's
    /// weight name, its input width and its input rows (one per token of the step), in build
    /// order; a node read by several products is read back once.
    pub fn matmul_inputs(&mut self, mut visit: impl FnMut(&str, usize, &[f32])) -> Result<(), EngineError> {
        let Some((graph, alloc)) = self.cache.parts() else {
            return Ok(());
        };
        let mut rows: Vec<f32> = Vec::new();
        let mut read: Option<crate::graph::NodeId> = None;
        for (name, input) in graph.matmul_inputs() {
            if read != Some(input) {
                alloc.read_f32(graph, input, &mut rows)?;
                read = Some(input);
            }
            visit(name, graph.nodes[input].out_shape[0], &rows);
        }
        Ok(())
    }

    /// Offload only the last `n_gpu_layers` layers to the first backend (`-ngl`; `None`: every
    /// node to the highest-priority backend that runs it), for a session over contexts the
    /// caller made ([`Session::with_backends`]), before its first step: a layer's KV regions stay
    /// on the backend they were first made on, and a session over a model takes the model's
    /// setting, which decided the weights each device prepared.
    pub fn set_gpu_layers(&mut self, n_gpu_layers: Option<usize>) {
        self.params.cparams.n_gpu_layers = n_gpu_layers;
    }

    /// How many graphs were built so far (a reused graph is not rebuilt).
    pub fn graph_rebuilds(&self) -> usize {
        self.cache.rebuild_count()
    }

    /// The graph of the last evaluation.
    pub fn graph(&self) -> Option<&ComputeGraph> {
        self.cache.graph()
    }

    /// The backends taking part, in priority order.
    pub fn backends(&self) -> Vec<Backend> {
        self.cache.alloc().backends().map(|b| b.handle()).collect()
    }

    /// The graph `tokens` would run on, with backends assigned and fusion applied, without
    /// executing it (for `--dump-graph`).
    pub fn prepare_graph(&mut self, n_tokens: usize, n_out: usize) -> Result<&ComputeGraph, EngineError> {
        self.params.set_batch(n_tokens, n_out);
        let model = &self.model;
        self.cache.prepare(&self.params, |p| model.build_graph(p))?;
        Ok(self.cache.graph().expect("prepared"))
    }

    /// Append `tokens` to sequence 0 and return the logits of the last `n_out` of them (at
    /// least one), `n_out` rows of n_vocab values.
    pub fn eval(&mut self, tokens: &[u32], n_out: usize) -> Result<&[f32], EngineError> {
        let mut batch = std::mem::take(&mut self.scratch.batch);
        batch.clear();
        batch.push_sequence(tokens, self.n_past(), 0, n_out.max(1));
        let result = self.decode(&batch);
        self.scratch.batch = batch;
        result?;
        self.last_logits()
    }

    /// Run one forward pass over `batch`: each token takes a KV cell of its sequence, and the
    /// logits of the rows that want them are kept ([`Session::logits_ith`],
    /// [`Session::last_logits`]). On error the cache holds what it held before.
    pub fn decode(&mut self, batch: &Batch) -> Result<(), EngineError> {
        let nt = batch.len();
        if nt == 0 {
            return Err(EngineError::EmptyBatch);
        }
        let n_vocab = self.model.hparams().n_vocab;
        if let Some(&id) = batch.tokens().iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { id, n_vocab });
        }
        let mut cells = std::mem::take(&mut self.scratch.cells);
        let mut cells_swa = std::mem::take(&mut self.scratch.cells_swa);
        cells_swa.clear();
        // A refused placement places nothing; a pass that fails after it gives the cells back.
        let result = self.kv.place(batch, &mut cells).and_then(|()| {
            if let Some(w) = &mut self.window {
                if let Err(e) = w.place(&self.kv, batch, &mut cells_swa) {
                    self.kv.unplace(&cells);
                    return Err(e);
                }
            }
            let run = self.run(batch, &cells, &cells_swa);
            if run.is_err() {
                self.kv.unplace(&cells);
                if let Some(w) = &mut self.window {
                    w.cells_mut().unplace(&cells_swa);
                }
            }
            run
        });
        self.scratch.cells = cells;
        self.scratch.cells_swa = cells_swa;
        result
    }

    /// The splits (runs of nodes on one backend) of the graph prepared last.
    pub fn graph_splits(&self) -> &[crate::graph::scheduler::Split] {
        self.cache.splits()
    }

    /// Adds an observer that sees every later step with its timed nodes (see
    /// [`trace`](super::trace)). A session created while a process trace is open has that one.
    pub fn add_step_observer(&mut self, observer: Box<dyn super::trace::StepObserver>) {
        self.observers.push(observer);
    }

    /// Removes the observer added last (and returns it); with none left, steps are not timed.
    pub fn pop_step_observer(&mut self) -> Option<Box<dyn super::trace::StepObserver>> {
        self.observers.pop()
    }

    /// The forward pass of a placed batch.
    fn run(&mut self, batch: &Batch, cells: &[i32], cells_swa: &[i32]) -> Result<(), EngineError> {
        let start = (!self.observers.is_empty()).then(Instant::now);
        let nt = batch.len();
        let n_outputs = batch.n_outputs();
        // A batch that wants no logits still computes its last row's (the head needs a row).
        let n_out = n_outputs.max(1);
        let first_seq = batch.seq_ids()[0];
        let one_sequence = batch.seq_ids().iter().all(|&s| s == first_seq);
        self.params.set_batch(nt, n_out);
        self.params.cparams.explicit_span = !(one_sequence && self.kv.is_identity(first_seq));
        self.params.cparams.explicit_span_swa =
            (self.window.as_ref()).is_some_and(|w| !(one_sequence && w.cells().is_identity(first_seq)));
        let model = &self.model;
        let reused = self.cache.prepare(&self.params, |p| {
            let mut graph = model.build_graph(p);
            if p.cparams.keep_matmul_inputs {
                graph.keep_matmul_inputs();
            }
            graph
        })?;
        self.fill_inputs(batch, cells, cells_swa)?;
        let mut timings = std::mem::take(&mut self.scratch.timings);
        timings.clear();
        let executed = self.cache.execute(start.is_some().then_some(&mut timings));
        self.scratch.timings = timings;
        executed?;
        let (graph, alloc) = self.cache.parts().expect("executed");
        if let Err(e) = alloc.read_f32(graph, graph.outputs[0], &mut self.logits) {
            self.logits.clear();
            return Err(e.into());
        }
        if let Some(start) = start {
            let graph = self.cache.graph().expect("executed");
            let record = super::trace::StepRecord {
                graph,
                splits: self.cache.splits(),
                timings: &self.scratch.timings,
                start,
                end: Instant::now(),
                n_tokens: nt,
                n_outputs: n_out,
                rebuilt: !reused,
            };
            for observer in &mut self.observers {
                observer.on_step(&record);
            }
        }
        self.output_rows.clear();
        let mut next = 0;
        for &wanted in batch.logits() {
            self.output_rows.push(if wanted { next } else { -1 });
            next += i32::from(wanted);
        }
        Ok(())
    }

    /// Fill every input of the prepared graph from `batch` and its cells, by the input's kind.
    fn fill_inputs(&mut self, batch: &Batch, cells: &[i32], cells_swa: &[i32]) -> Result<(), EngineError> {
        let Scratch {
            ids,
            index,
            spans,
            index_swa,
            spans_swa,
            ..
        } = &mut self.scratch;
        let (graph, alloc) = self.cache.parts().expect("prepared");
        // The cell lists are sized for every sequence at its longest; only what this batch
        // lists is written (a server's 64 slots would otherwise copy megabytes a step).
        let (mut n_index, mut n_index_swa) = (0, 0);
        if let Some(kv_index) = graph.input_of(InputKind::KvIndex) {
            index.resize(graph.nodes[kv_index].n_elements(), 0);
            n_index = self.kv.fill_spans(batch, index, spans);
        }
        if let (Some(kv_index), Some(w)) = (graph.input_of(InputKind::KvIndexSwa), &self.window) {
            index_swa.resize(graph.nodes[kv_index].n_elements(), 0);
            n_index_swa = w.cells().fill_spans(batch, index_swa, spans_swa);
        }
        for &input in &graph.inputs {
            let node = &graph.nodes[input];
            let NodeMeta::Input(kind) = node.meta else {
                return Err(EngineError::Graph(GraphError::NoSuchInput {
                    name: format!("{} (an input of no kind the engine fills)", node.name),
                }));
            };
            let data: &[i32] = match kind {
                InputKind::TokenIds => {
                    ids.clear();
                    ids.extend(batch.tokens().iter().map(|&t| t as i32));
                    ids
                }
                InputKind::Positions => batch.positions(),
                InputKind::KvCells => cells,
                InputKind::OutIds => {
                    ids.clear();
                    ids.extend((0..batch.len()).filter(|&i| batch.logits()[i]).map(|i| i as i32));
                    if ids.is_empty() {
                        ids.push(batch.len() as i32 - 1);
                    }
                    ids
                }
                InputKind::KvIndex => {
                    alloc.fill_node_i32_prefix(graph, input, &index[..n_index])?;
                    continue;
                }
                InputKind::KvIndexSwa => {
                    alloc.fill_node_i32_prefix(graph, input, &index_swa[..n_index_swa])?;
                    continue;
                }
                InputKind::KvSpan => spans,
                InputKind::KvCellsSwa => cells_swa,
                InputKind::KvSpanSwa => spans_swa,
            };
            alloc.fill_node_i32(graph, input, data)?;
        }
        Ok(())
    }

    /// The logits of every output row of the last batch, row after row (n_vocab values each).
    pub fn last_logits(&self) -> Result<&[f32], EngineError> {
        if self.logits.is_empty() {
            return Err(EngineError::NothingEvaluated);
        }
        Ok(&self.logits)
    }

    /// What the session's passes end with: logits (the default), or embeddings (the final
    /// norm's rows, or a reranker's head on them) read through the same
    /// [`Session::logits_ith`]; see [`embed`](super::embed).
    pub fn set_output(&mut self, output: GraphOutput) {
        self.params.cparams.output = output;
        self.logits.clear();
    }

    /// Values in each output row: n_vocab for logits, n_embd for embeddings, the rank head's
    /// classes for rank scores.
    pub fn output_width(&self) -> usize {
        let hp = self.model.hparams();
        match (self.params.cparams.output, &hp.rank_head) {
            (GraphOutput::Logits, _) => hp.n_vocab,
            (GraphOutput::Rank, Some(head)) => head.n_cls,
            (GraphOutput::Embeddings | GraphOutput::Rank, _) => hp.n_embd,
        }
    }

    /// The output row of row `row` of the last batch (llama.cpp's `llama_get_logits_ith`), of
    /// [`Session::output_width`] values; the row must have wanted it.
    pub fn logits_ith(&self, row: usize) -> Result<&[f32], EngineError> {
        let n_vocab = self.output_width();
        match self.output_rows.get(row) {
            Some(&r) if r >= 0 => Ok(&self.logits[r as usize * n_vocab..][..n_vocab]),
            _ => Err(EngineError::NoLogits {
                row,
                n_outputs: self.output_rows.iter().filter(|&&r| r >= 0).count(),
            }),
        }
    }
}

/// Calls `f(i, cell, len)` for each run of consecutive cells in `cells` (`cells[i..i + len]` is
/// `cell, cell + 1, ...`), so rows move in as few copies as the layout allows.
fn for_runs(
    cells: &[u32],
    mut f: impl FnMut(usize, usize, usize) -> Result<(), crate::graph::GraphError>,
) -> Result<(), EngineError> {
    let mut i = 0;
    while i < cells.len() {
        let mut len = 1;
        while i + len < cells.len() && cells[i + len] == cells[i] + len as u32 {
            len += 1;
        }
        f(i, cells[i] as usize, len)?;
        i += len;
    }
    Ok(())
}
