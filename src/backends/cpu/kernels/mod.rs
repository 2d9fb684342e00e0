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
mod kv_store;
mod math;
mod matmul;
mod norm;
mod rope;

pub use attention::{attention, attention_heads};
pub use elementwise::{
    add, add_inplace, add_row_broadcast, add_row_broadcast_inplace, mul, mul_inplace, mul_row_broadcast,
    mul_row_broadcast_inplace, silu, silu_inplace, swiglu, swiglu_inplace,
};
pub use get_rows::get_rows;
pub use kv_store::kv_store;
pub use matmul::{
    matmul, matmul_rows, quantize_activations, quantize_chunk, ActivationBuffers, ActivationChunk, Activations,
};
pub use norm::{rms_norm, rms_norm_mul};
pub use rope::{rope, RopeStyle};

use crate::quant::{GgmlType, QuantError};

/// Why a kernel refused its arguments. Every variant names the kernel.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KernelError {
    #[error("{kernel}: {operand} has length {got}, expected {expected}")]
    Length {
        kernel: &'static str,
        operand: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{kernel}: {operand} has length {got}, not a multiple of {multiple_of}")]
    NotMultiple {
        kernel: &'static str,
        operand: &'static str,
        got: usize,
        multiple_of: usize,
    },
    #[error("{kernel}: {operand} = {got} is below the {needed} needed")]
    TooSmall {
        kernel: &'static str,
        operand: &'static str,
        needed: usize,
        got: usize,
    },
    #[error("{kernel}: {name} must not be zero")]
    Zero { kernel: &'static str, name: &'static str },
    #[error("{kernel}: the size of {operand} overflows usize")]
    Overflow {
        kernel: &'static str,
        operand: &'static str,
    },
    #[error("{kernel}: n_head = {n_head} is not a multiple of n_head_kv = {n_head_kv}")]
    HeadGroups {
        kernel: &'static str,
        n_head: usize,
        n_head_kv: usize,
    },
    #[error("{kernel}: n_rot = {n_rot} must be even and at most head_dim = {head_dim}")]
    RotaryDims {
        kernel: &'static str,
        n_rot: usize,
        head_dim: usize,
    },
    #[error("{kernel}: token {token} has position {pos}, outside the {n_kv} cells of the KV cache")]
    PositionOutOfRange {
        kernel: &'static str,
        token: usize,
        pos: i32,
        n_kv: usize,
    },
    #[error("{kernel}: ids[{index}] = {id} is not a row of a table of {n_rows} rows")]
    RowIdOutOfRange {
        kernel: &'static str,
        index: usize,
        id: i32,
        n_rows: usize,
    },
    #[error("{kernel}: rows {start}..{end} are not within the {n_out} output rows")]
    RowRange {
        kernel: &'static str,
        start: usize,
        end: usize,
        n_out: usize,
    },
    #[error(
        "{kernel}: {wtype} weights take {} activations, got {}",
        act_name(*.expected),
        act_name(*.got)
    )]
    ActivationType {
        kernel: &'static str,
        wtype: GgmlType,
        expected: Option<GgmlType>,
        got: Option<GgmlType>,
    },
    #[error("{kernel}: {source}")]
    Quant {
        kernel: &'static str,
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
