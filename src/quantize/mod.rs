//! Quantizing a model file as llama-quantize does: the file types and their names
//! ([`FileType`]), the per-tensor rules of its mixes ([`plan`]) and the conversion itself
//! ([`quantize_file`]), which writes llama-quantize's own bytes for the same input: its tensor
//! order, its metadata edits, its quantizers: the references without an importance matrix, the
//! weighted ones with one ([`Imatrix`], `--imatrix`).
//!
//! This module reads and writes GGUF files and calls `quant`'s row functions; what a type's
//! blocks are is `quant`'s business, and printing is the caller's (progress comes back through
//! a callback).

mod ftype;
mod imatrix;
mod rules;

pub use ftype::{llama_ftype_name, FileType};
pub use imatrix::{Imatrix, ImatrixError, ImatrixStats};
pub use rules::{llama_order, plan, ModelFacts, Planned, TensorMeta};

use crate::gguf::split::{KEY_SPLIT_COUNT, KEY_SPLIT_NO, KEY_SPLIT_TENSORS_COUNT};
use crate::gguf::{GgufFile, GgufStreamWriter, TensorLayout, Value};
use crate::quant::{dequantize_row, quantize_row, quantize_row_imatrix, GgmlType};
use std::path::Path;

/// ggml's `GGML_QNT_VERSION`, which llama-quantize writes as `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// Why a file could not be quantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// The input could not be read or the output written.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A tensor's type cannot be read or the target type cannot be written.
    #[error("tensor '{name}': {source}")]
    Quant {
        /// The tensor being converted.
        name: String,
        /// What the row functions refused.
        source: crate::quant::QuantError,
    },
    /// The output is the input: writing it would truncate the file being read.
    #[error("{0} is the input file: write the output elsewhere")]
    OutputIsInput(std::path::PathBuf),
    /// An importance matrix entry does not fit its tensor.
    #[error("tensor '{name}': the importance matrix has {got} weights for it, its rows need {expected}")]
    ImatrixSize {
        /// The tensor.
        name: String,
        /// Its row length times its experts.
        expected: u64,
        /// The entry's length.
        got: usize,
    },
    /// A file type whose matrices need an importance matrix, without one (llama-quantize's
    /// "this quantization requires an imatrix!"), or a tensor the matrix has no entry for.
    #[error("{0}")]
    ImatrixNeeded(String),
    /// The progress callback failed (its output could not be written).
    #[error("cannot report progress: {0}")]
    Progress(#[from] std::io::Error),
}

/// How to quantize.
#[derive(Clone, Copy, Debug)]
pub struct QuantizeOptions<'a> {
    /// The file type to write.
    pub ftype: FileType,
    /// Every matrix in the file type's own type (llama-quantize's `--pure`), instead of the
    /// mix's per-tensor rules.
    pub pure: bool,
    /// Threads converting each tensor's rows.
    pub n_threads: usize,
    /// The importance matrix weighing the quantizers (llama-quantize's `--imatrix`); it also
    /// changes a few rules of the mixes.
    pub imatrix: Option<&'a Imatrix>,
}

/// One tensor about to be written, for a progress line.
#[derive(Debug)]
pub struct Progress<'a> {
    /// 1-based position in the output.
    pub index: usize,
    /// Number of tensors.
    pub total: usize,
    /// The tensor name.
    pub name: &'a str,
    /// Dimensions, ne0 first.
    pub shape: &'a [u64],
    /// Its type in the input.
    pub from: GgmlType,
    /// Its type in the output.
    pub to: GgmlType,
    /// The type the rules chose, when its rows do not split into that type's blocks.
    pub fell_back_from: Option<GgmlType>,
}

/// The plan for `file`: each tensor's output type, in the order llama-quantize writes them.
/// `has_imatrix`: whether an importance matrix is given (a few rules depend on it).
pub fn plan_file(
    file: &GgufFile,
    ftype: FileType,
    pure: bool,
    has_imatrix: bool,
) -> Result<Vec<Planned>, QuantizeError> {
    let mut facts = if pure {
        // The pure mode reads no hyper-parameter: a file without them still quantizes.
        ModelFacts {
            arch: String::new(),
            n_layer: 0,
            n_expert: 0,
            n_gqa: 0,
            is_70b: false,
            has_imatrix,
        }
    } else {
        ModelFacts::from_metadata(file.metadata())?
    };
    facts.has_imatrix = has_imatrix;
    let metas: Vec<TensorMeta> = file
        .tensors()
        .iter()
        .map(|t| TensorMeta {
            name: &t.name,
            shape: &t.shape,
            ggml_type: t.ggml_type,
        })
        .collect();
    Ok(plan(&metas, &facts, ftype, pure))
}

/// Quantize `input` into a new file at `output`, streaming: the header first, then one tensor
/// at a time, each converted on `n_threads` threads. `progress` hears of each tensor before
/// its conversion.
pub fn quantize_file(
    input: &GgufFile,
    output: &Path,
    options: QuantizeOptions,
    mut progress: impl FnMut(&Progress) -> std::io::Result<()>,
) -> Result<(), QuantizeError> {
    if let Ok(out) = output.canonicalize() {
        if input.paths().any(|p| p.canonicalize().is_ok_and(|p| p == out)) {
            return Err(QuantizeError::OutputIsInput(output.to_path_buf()));
        }
    }
    let planned = plan_file(input, options.ftype, options.pure, options.imatrix.is_some())?;
    let tensors = input.tensors();
    // llama-quantize's `tensor_requires_imatrix`: never the embedding or the output.
    let needs = |p: &Planned| {
        let name = tensors[p.index].name.as_str();
        options.ftype.needs_imatrix(p.ggml_type) && name != "token_embd.weight" && name != "output.weight"
    };
    if options.imatrix.is_none() && planned.iter().any(needs) {
        return Err(QuantizeError::ImatrixNeeded(format!(
            "{} needs an importance matrix (--imatrix FILE; `minfer imatrix` computes one)",
            options.ftype.name()
        )));
    }

    // llama-quantize copies the metadata, then sets (removes and appends) these two keys, and
    // drops the split keys of a split input.
    let mut metadata = input.metadata().clone();
    metadata.set_last("general.quantization_version", Value::U32(QUANTIZATION_VERSION));
    metadata.set_last("general.file_type", Value::U32(options.ftype.id()));
    for key in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT] {
        metadata.remove(key);
    }
    for (key, value) in options.imatrix.map(Imatrix::metadata).unwrap_or_default() {
        metadata.set_last(key, value);
    }

    let layout: Vec<TensorLayout> = planned
        .iter()
        .map(|p| {
            let t = &tensors[p.index];
            TensorLayout::as_ggml_records(&t.name, p.ggml_type, &t.shape)
        })
        .collect();
    let mut out = GgufStreamWriter::create(output, &metadata, &layout)?;
    for (i, p) in planned.iter().enumerate() {
        let info = &tensors[p.index];
        progress(&Progress {
            index: i + 1,
            total: planned.len(),
            name: &info.name,
            shape: &info.shape,
            from: info.ggml_type,
            to: p.ggml_type,
            fell_back_from: p.fell_back_from,
        })?;
        let data = input.tensor_data(info);
        if p.ggml_type == info.ggml_type {
            out.write_tensor(&info.name, data)?;
        } else {
            let row = info.shape.first().copied().unwrap_or(1) as usize;
            let weights = match options.imatrix.and_then(|m| m.get(&info.name)) {
                Some(w) => {
                    // One row of weights per expert (the third dimension); llama-quantize lets the
                    // embedding's mismatch pass, as a matrix cannot have seen its rows.
                    let expected = row as u64 * info.shape.get(2).copied().unwrap_or(1);
                    if w.len() as u64 == expected {
                        Some(w)
                    } else if info.name == "token_embd.weight" {
                        None
                    } else {
                        return Err(QuantizeError::ImatrixSize {
                            name: info.name.clone(),
                            expected,
                            got: w.len(),
                        });
                    }
                }
                None => None,
            };
            if weights.is_none() && needs(p) {
                return Err(QuantizeError::ImatrixNeeded(format!(
                    "the importance matrix has no entry for {}, which {} quantizes to {} \
                     (llama-quantize: \"the result will be garbage\")",
                    info.name,
                    options.ftype.name(),
                    p.ggml_type
                )));
            }
            let rows_per_expert = info.shape.get(1).copied().unwrap_or(1) as usize;
            let target = Target {
                ty: p.ggml_type,
                imatrix: weights.map(|w| (w, rows_per_expert)),
            };
            let converted = convert(info.ggml_type, data, target, row, options.n_threads).map_err(|source| {
                QuantizeError::Quant {
                    name: info.name.clone(),
                    source,
                }
            })?;
            out.write_tensor(&info.name, &converted)?;
        }
    }
    out.finish()?;
    Ok(())
}

/// What a tensor becomes: its type and, with an importance matrix, its weights (one row of
/// `row` weights per expert) and the rows of each expert.
#[derive(Clone, Copy)]
struct Target<'a> {
    ty: GgmlType,
    imatrix: Option<(&'a [f32], usize)>,
}

/// `data` (rows of `row` values of `from`) as `to`, the rows shared among the threads.
fn convert(
    from: GgmlType,
    data: &[u8],
    to: Target,
    row: usize,
    n_threads: usize,
) -> Result<Vec<u8>, crate::quant::QuantError> {
    let (row_in, row_out) = (
        row / from.block_size() * from.type_size(),
        row / to.ty.block_size() * to.ty.type_size(),
    );
    if row_in == 0 {
        return Ok(Vec::new());
    }
    let n_rows = data.len() / row_in;
    let mut out = vec![0u8; n_rows * row_out];
    let per_thread = n_rows.div_ceil(n_threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = out
            .chunks_mut(per_thread * row_out)
            .zip(data.chunks(per_thread * row_in))
            .enumerate()
            .map(|(chunk, (dst, src))| {
                scope.spawn(move || -> Result<(), crate::quant::QuantError> {
                    let mut values = vec![0f32; row];
                    for (i, (d, s)) in dst.chunks_mut(row_out).zip(src.chunks(row_in)).enumerate() {
                        dequantize_row(from, s, &mut values)?;
                        match to.imatrix {
                            Some((weights, rows_per_expert)) => {
                                let expert = (chunk * per_thread + i) / rows_per_expert.max(1);
                                quantize_row_imatrix(to.ty, &values, &weights[expert * row..][..row], d)?;
                            }
                            None => quantize_row(to.ty, &values, d)?,
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a quantizing thread panicked"))
    })?;
    Ok(out)
}
