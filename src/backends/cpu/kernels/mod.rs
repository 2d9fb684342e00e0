//! CPU compute kernels: the arithmetic of one graph operation over plain slices, on the calling
//! thread.
//!
//! This module owns the numerics of the CPU backend and nothing else. A kernel must not spawn
//! threads, allocate per call (anything sizeable comes from a caller-provided scratch), know a
//! model architecture, or panic on bad sizes: every public kernel checks its slice lengths first
//! and returns a [`KernelError`] naming itself and the sizes. Where ggml defines the operation,
//! the kernel reproduces ggml-cpu's reference arithmetic (types, rounding points and
//! accumulation order), so that a difference from llama.cpp's output is a bug to find rather than
//! noise to tolerate.
//!
//! Layout convention, for every kernel: activations are token-major. A `[d, n_tokens]`
//! activation is `n_tokens` rows of `d` contiguous f32, row `t` at `t * d`. A GGUF weight
//! `[n_in, n_out]` is `n_out` rows of `n_in` values in its ggml type, row `o` at
//! `o * row_size(n_in)` bytes.

mod attention;
mod elementwise;
mod get_rows;
mod kv_region;
mod kv_store;
mod math;
mod matmul;
mod moe;
mod norm;
mod rope;

pub use attention::{attention, attention_heads, ScoreScale, Visible};
pub use elementwise::{
    add, add_inplace, add_row_broadcast, add_row_broadcast_inplace, gelu, gelu_inplace, mul, mul_inplace,
    mul_row_broadcast, mul_row_broadcast_inplace, scale, scale_inplace, sigmoid, sigmoid_inplace, silu, silu_inplace,
    softcap, softcap_inplace, swiglu, swiglu_inplace, swiglu_oai,
};
pub use get_rows::get_rows;
pub use kv_region::{region_values, rope_shift, F16Rows, KvRegion, KvRegionMut, KvRows, Q8Rows, SCRATCH_SLACK};
pub use kv_store::kv_store;
pub use matmul::{
    matmul, matmul_rows, matmul_rows_repacked, quantize_activations, quantize_chunk, ActivationBuffers,
    ActivationChunk, Activations,
};
pub use moe::{moe_sum, moe_weights, softmax_rows, top_k};
pub use norm::{rms_norm, rms_norm_mul};
pub use rope::{rope, RopeStyle};

use crate::quant::{GgmlType, QuantError};

/// Why a kernel refused its arguments. Every variant names the kernel.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    /// A slice does not have the exact length the sizes imply.
    #[error("{kernel}: {operand} has length {got}, expected {expected}")]
    Length {
        /// The kernel that refused.
        kernel: &'static str,
        /// The slice (or size) at fault.
        operand: &'static str,
        /// Length the other arguments imply.
        expected: usize,
        /// Length given.
        got: usize,
    },
    /// A length is not whole rows: a norm's `x` not whole rows of `d`, or a broadcast `a` not whole
    /// rows of `b`.
    #[error("{kernel}: {operand} has length {got}, not a multiple of {multiple_of}")]
    NotMultiple {
        /// The kernel that refused.
        kernel: &'static str,
        /// The slice at fault.
        operand: &'static str,
        /// Its length.
        got: usize,
        /// The row width it must be whole rows of.
        multiple_of: usize,
    },
    /// A size is below a minimum: attention's `kv_stride` below n_head_kv * head_dim, or its K or V
    /// slice too short for n_kv cells.
    #[error("{kernel}: {operand} = {got} is below the {needed} needed")]
    TooSmall {
        /// The kernel that refused.
        kernel: &'static str,
        /// The size or slice at fault.
        operand: &'static str,
        /// The minimum.
        needed: usize,
        /// What was given.
        got: usize,
    },
    /// A size that divides or shapes rows is zero (n_in, head_dim, n_head_kv, n_embd, d).
    #[error("{kernel}: {name} must not be zero")]
    Zero {
        /// The kernel that refused.
        kernel: &'static str,
        /// The size that is zero.
        name: &'static str,
    },
    /// A buffer size computed from the arguments does not fit in `usize`.
    #[error("{kernel}: the size of {operand} overflows usize")]
    Overflow {
        /// The kernel that refused.
        kernel: &'static str,
        /// The buffer whose size overflows.
        operand: &'static str,
    },
    /// n_head is not a whole number of groups of n_head_kv (grouped-query attention needs it).
    #[error("{kernel}: n_head = {n_head} is not a multiple of n_head_kv = {n_head_kv}")]
    HeadGroups {
        /// The kernel that refused.
        kernel: &'static str,
        /// Query heads.
        n_head: usize,
        /// KV heads.
        n_head_kv: usize,
    },
    /// RoPE's n_rot is odd or exceeds head_dim.
    #[error("{kernel}: n_rot = {n_rot} must be even and at most head_dim = {head_dim}")]
    RotaryDims {
        /// The kernel that refused.
        kernel: &'static str,
        /// Dimensions to rotate.
        n_rot: usize,
        /// Per-head dimension.
        head_dim: usize,
    },
    /// A position is negative or not below n_kv, so it names no KV cell (attention, kv_store).
    #[error("{kernel}: token {token} has position {pos}, outside the {n_kv} cells of the KV cache")]
    PositionOutOfRange {
        /// The kernel that refused.
        kernel: &'static str,
        /// Index of the token in the batch.
        token: usize,
        /// Its position.
        pos: i32,
        /// Cells in the KV cache.
        n_kv: usize,
    },
    /// A token's span of visible cells lies outside the cell index.
    #[error("{kernel}: token {token}'s span {offset}+{count} lies outside the {len} cells listed")]
    SpanOutOfRange {
        /// The kernel that refused.
        kernel: &'static str,
        /// Index of the token in the batch.
        token: usize,
        /// The span's offset into the index.
        offset: i32,
        /// The span's cell count.
        count: i32,
        /// Cells the index lists.
        len: usize,
    },
    /// A get_rows id is negative or not below the table's row count (e.g. a token id >= n_vocab).
    #[error("{kernel}: ids[{index}] = {id} is not a row of a table of {n_rows} rows")]
    RowIdOutOfRange {
        /// The kernel that refused.
        kernel: &'static str,
        /// Index of the id in `ids`.
        index: usize,
        /// The id.
        id: i32,
        /// Rows in the table.
        n_rows: usize,
    },
    /// A requested row range (matmul output rows, attention head rows) is reversed or runs past the end.
    #[error("{kernel}: rows {start}..{end} are not within the {n_out} output rows")]
    RowRange {
        /// The kernel that refused.
        kernel: &'static str,
        /// First row requested.
        start: usize,
        /// One past the last row requested.
        end: usize,
        /// Rows available.
        n_out: usize,
    },
    /// The prepared activations are not of the weight type's `vec_dot_type` (f32 for F32, F16 and
    /// BF16 weights).
    #[error(
        "{kernel}: {wtype} weights take {} activations, got {}",
        act_name(*.expected),
        act_name(*.got)
    )]
    ActivationType {
        /// The kernel that refused.
        kernel: &'static str,
        /// The weight's ggml type.
        wtype: GgmlType,
        /// Activation type it needs (`None`: f32).
        expected: Option<GgmlType>,
        /// Activation type given (`None`: f32).
        got: Option<GgmlType>,
    },
    /// The quantization layer refused: an unsupported ggml type, or a row that is not whole blocks.
    #[error("{kernel}: {source}")]
    Quant {
        /// The kernel that refused.
        kernel: &'static str,
        /// The underlying error.
        #[source]
        source: QuantError,
    },
}

fn act_name(ty: Option<GgmlType>) -> &'static str {
    ty.map_or("f32", GgmlType::name)
}

fn check_len(kernel: &'static str, operand: &'static str, got: usize, expected: usize) -> Result<(), KernelError> {
    if got == expected {
        Ok(())
    } else {
        Err(KernelError::Length {
            kernel,
            operand,
            expected,
            got,
        })
    }
}

fn check_nonzero(kernel: &'static str, name: &'static str, value: usize) -> Result<(), KernelError> {
    if value == 0 {
        Err(KernelError::Zero { kernel, name })
    } else {
        Ok(())
    }
}

/// `a * b`, or the overflow error naming `operand` (the buffer that size describes).
fn size(kernel: &'static str, operand: &'static str, a: usize, b: usize) -> Result<usize, KernelError> {
    a.checked_mul(b).ok_or(KernelError::Overflow { kernel, operand })
}

/// Bytes of one row of `n` values of `ty`.
fn row_bytes(kernel: &'static str, ty: GgmlType, n: usize) -> Result<usize, KernelError> {
    match ty.row_size(n as u64) {
        Some(bytes) => usize::try_from(bytes).map_err(|_| KernelError::Overflow {
            kernel,
            operand: "a row",
        }),
        None => Err(KernelError::Quant {
            kernel,
            source: QuantError::PartialBlock {
                ggml_type: ty,
                op: "row",
                n,
                block_size: ty.block_size(),
            },
        }),
    }
}
