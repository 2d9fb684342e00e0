//! Graph parameters: everything the topology of a forward pass depends on, and nothing else.
//! Equal params mean an identical graph, which is what lets a decode step reuse the last one.
//! The KV position (n_past) is deliberately absent: it enters as data through `positions`.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphType {
    Prefill,
    Decode,
}

/// Context parameters that shape the graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CParams {
    pub n_ctx: usize,
    /// The backend fence in force: assignment is part of the topology.
    pub backends: Vec<u16>,
    /// Decode QKV fusion (`MINFER_NO_FUSE_QKV=1` disables); part of the reuse identity.
    pub fuse_qkv: bool,
    /// Decode FFN fusion (`MINFER_NO_FUSE_FFN=1` disables); part of the reuse identity.
    pub fuse_ffn: bool,
}

impl CParams {
    /// Context parameters with the fusion flags read from the environment.
    pub fn new(n_ctx: usize, backends: Vec<u16>) -> Self {
        let off = |var: &str| std::env::var(var).is_ok_and(|v| v == "1");
        CParams {
            n_ctx,
            backends,
            fuse_qkv: !off("MINFER_NO_FUSE_QKV"),
            fuse_ffn: !off("MINFER_NO_FUSE_FFN"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphParams {
    pub n_tokens: usize,
    /// Rows of logits computed (the last n_out tokens): part of the topology (the tail-row
    /// reduction), not just of execution.
    pub n_out: usize,
    pub gtype: GraphType,
    pub cparams: CParams,
    /// Reserved for weight reload; a change forces a rebuild.
    pub weights_version: u64,
}

impl GraphParams {
    pub fn new(n_tokens: usize, n_out: usize, cparams: CParams) -> Self {
        let gtype = if n_tokens == 1 {
            GraphType::Decode
        } else {
            GraphType::Prefill
        };
        GraphParams {
            n_tokens,
            n_out,
            gtype,
            cparams,
            weights_version: 1,
        }
    }
}
