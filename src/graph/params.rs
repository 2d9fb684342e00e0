//! Graph parameters: everything the topology of a forward pass depends on, and nothing else.
//! Equal params mean an identical graph, which is what lets a decode step reuse the last one.
//! The KV position (n_past) is deliberately absent: it enters as data through `positions`.

/// Which kind of forward pass a graph is; a single token is a decode step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphType {
    /// A batch of several tokens (the prompt, or a chunk of it).
    Prefill,
    /// One token (a generation step); the decode fusions apply only here.
    Decode,
}

/// What a forward pass ends with.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GraphOutput {
    /// The head's logits, `[n_vocab, n_out]`: generation.
    #[default]
    Logits,
    /// The final norm's rows, `[n_embd, n_out]` (llama.cpp's `t_embd`): embeddings, pooled by
    /// the engine. The head is not computed.
    Embeddings,
    /// A reranker's classification head on the final norm's rows, `[n_cls, n_out]`.
    Rank,
}

/// Context parameters that shape the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CParams {
    /// KV cells per layer: the length of each persistent K and V region.
    pub n_ctx: usize,
    /// The backend fence in force: assignment is part of the topology.
    pub backends: Vec<u16>,
    /// Layers a device runs (`-ngl N`): the last N, the head too when N exceeds the layer count;
    /// the rest is pinned to the CPU ([`super::offload`]). `None`: every node goes to the
    /// highest-priority backend that supports it.
    pub n_gpu_layers: Option<usize>,
    /// Decode QKV fusion, as [`decode_fusions`](super::fusion::decode_fusions) decides it for
    /// the backend that runs the layers; part of the reuse identity.
    pub fuse_qkv: bool,
    /// Decode FFN fusion, likewise.
    pub fuse_ffn: bool,
    /// Sequences the KV cache may hold at once (the `kv_index` input has room for
    /// `n_ctx_seq` cells of each).
    pub n_seq_max: usize,
    /// Cells one sequence may hold: `n_ctx` unless the cache is split between sequences (a
    /// server's slots), which keeps `kv_index` at `n_seq_max * n_ctx_seq`.
    pub n_ctx_seq: usize,
    /// Attention reads each token's cells from explicit lists (`kv_index`, `kv_span`) instead of
    /// `0..=position`: needed when several sequences share the cache or a sequence's cells are
    /// not its positions. One sequence whose cells are its positions never needs it.
    pub explicit_span: bool,
    /// Cells of the window cache (llama.cpp's ISWA cache): the length of each windowed layer's
    /// K and V regions, which hold only the last `n_swa` positions of each sequence (plus a
    /// batch). 0: no window cache, the windowed layers keep full regions (`--swa-full`).
    pub n_ctx_swa: usize,
    /// [`CParams::explicit_span`] for the windowed layers: their cells are not their positions
    /// once the window cache wraps.
    pub explicit_span_swa: bool,
    /// How the KV cache stores K (`F32`, `F16` or `Q8_0`).
    pub type_k: super::DType,
    /// How the KV cache stores V.
    pub type_v: super::DType,
    /// Every weight's matrix-product input is kept as a graph output, to be read back after the
    /// step (`minfer imatrix`'s statistics); part of the reuse identity.
    pub keep_matmul_inputs: bool,
    /// What the graph ends with: logits, or embeddings for `minfer embed` and the server's
    /// `--embeddings`.
    pub output: GraphOutput,
}

impl CParams {
    /// Context parameters for a backend fence, with the decode fusions off: a session turns
    /// them on from what its backends claim ([`decode_fusions`](super::fusion::decode_fusions)).
    pub fn new(n_ctx: usize, backends: Vec<u16>) -> Self {
        CParams {
            n_ctx,
            n_ctx_seq: n_ctx,
            backends,
            n_gpu_layers: None,
            type_k: super::DType::F16,
            type_v: super::DType::F16,
            fuse_qkv: false,
            fuse_ffn: false,
            n_seq_max: 1,
            explicit_span: false,
            n_ctx_swa: 0,
            explicit_span_swa: false,
            keep_matmul_inputs: false,
            output: GraphOutput::Logits,
        }
    }
}

/// What the topology of one forward pass depends on: the cache key of [`GraphCache`](super::GraphCache).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphParams {
    /// Tokens in the batch: the ne1 of the activations (until the tail-row reduction).
    pub n_tokens: usize,
    /// Rows of logits computed (the last n_out tokens): part of the topology (the tail-row
    /// reduction), not just of execution.
    pub n_out: usize,
    /// Decode or prefill, derived from `n_tokens`.
    pub gtype: GraphType,
    /// The context parameters, including the backend fence and fusion flags.
    pub cparams: CParams,
    /// Reserved for weight reload; a change forces a rebuild.
    pub weights_version: u64,
}

impl GraphType {
    /// A single token decodes; more prefill.
    pub fn for_batch(n_tokens: usize) -> Self {
        if n_tokens == 1 {
            GraphType::Decode
        } else {
            GraphType::Prefill
        }
    }
}

impl GraphParams {
    /// Point these params at a batch of `n_tokens` tokens with `n_out` logits rows, as
    /// [`GraphParams::new`] would make them, keeping everything else: a session's step changes
    /// only this, without copying the context params.
    pub fn set_batch(&mut self, n_tokens: usize, n_out: usize) {
        self.n_tokens = n_tokens;
        self.n_out = n_out;
        self.gtype = GraphType::for_batch(n_tokens);
    }

    /// Params for a batch of `n_tokens` tokens with `n_out` logits rows, in context `cparams`.
    pub fn new(n_tokens: usize, n_out: usize, cparams: CParams) -> Self {
        let gtype = GraphType::for_batch(n_tokens);
        GraphParams {
            n_tokens,
            n_out,
            gtype,
            cparams,
            weights_version: 1,
        }
    }
}
