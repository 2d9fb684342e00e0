//! A session: one sequence over a model. It owns what its forward passes write (a graph cache
//! with its allocator, and so the KV cache and activation buffers, in execution contexts of the
//! model's shared backend set) and the position reached; the weights, the threads and the
//! tokenizer belong to the [`Model`](super::Model).

use super::{EngineError, Model};
use crate::graph::{Backend, CParams, ComputeBackend, ComputeGraph, GraphAllocator, GraphCache, GraphParams};
use crate::models::ModelDef;
use std::sync::Arc;

/// One sequence's KV cache and activations over a [`Model`]; see the module documentation.
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
pub struct Session {
    model: Arc<dyn ModelDef>,
    cache: GraphCache,
    /// The params of the last graph: the context params, and the batch of the last step.
    params: GraphParams,
    n_past: usize,
    /// Reused for the token ids, positions and output rows of each evaluation.
    input_ids: Vec<i32>,
    /// The logits of the last evaluation, copied out of the backend (reused: a decode step
    /// allocates nothing); empty before the first.
    logits: Vec<f32>,
}

impl Session {
    /// A session over `model` with a context of `n_ctx` tokens (clamped to 1 ..= the training
    /// context): one new execution context per backend of the model's set. Sessions over one
    /// model share its weights and threads, never a buffer.
    pub fn new(model: &Model, n_ctx: usize) -> Self {
        Self::with_backends(
            Arc::clone(model.def()),
            model.backends().new_contexts(),
            model.clamp_n_ctx(n_ctx),
        )
    }

    /// A session over execution contexts made by the caller (in priority order) with a context
    /// of exactly `n_ctx` tokens: for tests and tools that bring their own backend.
    pub fn with_backends(
        model: impl Into<Arc<dyn ModelDef>>,
        backends: Vec<Box<dyn ComputeBackend>>,
        n_ctx: usize,
    ) -> Self {
        let fence: Vec<u16> = backends.iter().map(|b| b.handle().0).collect();
        let cparams = CParams::new(n_ctx, fence);
        Session {
            model: model.into(),
            cache: GraphCache::new(GraphAllocator::new(backends)),
            params: GraphParams::new(1, 1, cparams),
            n_past: 0,
            input_ids: Vec::new(),
            logits: Vec::new(),
        }
    }

    /// The architecture the session runs.
    pub fn model(&self) -> &dyn ModelDef {
        self.model.as_ref()
    }

    /// The context size in tokens.
    pub fn n_ctx(&self) -> usize {
        self.params.cparams.n_ctx
    }

    /// Tokens already in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forget the context (the KV contents become unreachable; positions restart at 0).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Keep only the first `n` tokens of the context (for reusing a shared prefix).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
    }

    /// Turn the decode fusions on or off (the default comes from `MINFER_NO_FUSE_QKV` /
    /// `MINFER_NO_FUSE_FFN`). The flags are part of the graph's identity, so the next step
    /// rebuilds.
    pub fn set_fusion(&mut self, fuse_qkv: bool, fuse_ffn: bool) {
        self.params.cparams.fuse_qkv = fuse_qkv;
        self.params.cparams.fuse_ffn = fuse_ffn;
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

    /// Append `tokens` to the context and return the logits of the last `n_out` of them,
    /// `n_out` rows of n_vocab values.
    pub fn eval(&mut self, tokens: &[u32], n_out: usize) -> Result<&[f32], EngineError> {
        let nt = tokens.len();
        if nt == 0 {
            return Err(EngineError::EmptyBatch);
        }
        let n_ctx = self.params.cparams.n_ctx;
        if self.n_past + nt > n_ctx {
            return Err(EngineError::ContextFull {
                n_past: self.n_past,
                n_tokens: nt,
                needed: self.n_past + nt,
                n_ctx,
            });
        }
        let n_vocab = self.model.hparams().n_vocab;
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::TokenOutOfRange { id, n_vocab });
        }
        let n_out = n_out.clamp(1, nt);
        self.prepare_graph(nt, n_out)?;

        // One reused buffer for the three I32 inputs: a decode step allocates nothing.
        let mut ids = std::mem::take(&mut self.input_ids);
        let filled = (|| {
            let (graph, alloc) = self.cache.parts().expect("prepared");
            ids.clear();
            ids.extend(tokens.iter().map(|&t| t as i32));
            alloc.fill_input_i32(graph, "token_ids", &ids)?;
            ids.clear();
            ids.extend((self.n_past..self.n_past + nt).map(|p| p as i32));
            alloc.fill_input_i32(graph, "positions", &ids)?;
            if n_out < nt {
                ids.clear();
                ids.extend(((nt - n_out)..nt).map(|i| i as i32));
                alloc.fill_input_i32(graph, "tail_ids", &ids)?;
            }
            Ok::<_, EngineError>(())
        })();
        self.input_ids = ids;
        filled?;
        self.cache.execute()?;
        self.n_past += nt;
        let (graph, alloc) = self.cache.parts().expect("executed");
        if let Err(e) = alloc.read_f32(graph, graph.outputs[0], &mut self.logits) {
            self.logits.clear();
            return Err(e.into());
        }
        self.last_logits()
    }

    /// The logits rows of the last evaluation (`n_out` rows of n_vocab values), copied out of
    /// the backend once per evaluation.
    pub fn last_logits(&self) -> Result<&[f32], EngineError> {
        if self.logits.is_empty() {
            return Err(EngineError::NothingEvaluated);
        }
        Ok(&self.logits)
    }
}
