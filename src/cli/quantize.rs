//! `minfer quantize IN OUT TYPE --pure`: llama-quantize's `--pure` mode, every matrix to one
//! type with our reference quantizers (the same bytes llama-quantize writes without an
//! importance matrix), 1-D tensors (norms, biases) kept in F32, the metadata copied with
//! `general.file_type` set. Tensors are quantized on every core; a line per tensor goes to the
//! log writer.
//!
//! It reads and writes GGUF files only; what the types are is `quant`'s business.

use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::quant::{dequantize_row, quantize_row, GgmlType};
use std::io::Write;
use std::path::Path;

/// Why a file could not be quantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    /// The input could not be read or the output written.
    #[error(transparent)]
    Gguf(#[from] crate::gguf::GgufError),
    /// A tensor's type cannot be read or the target type cannot be written.
    #[error(transparent)]
    Quant(#[from] crate::quant::QuantError),
    /// The target is not a type `quantize` writes.
    #[error("cannot quantize to {0}: the types are F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K (llama.cpp's mixes such as Q4_K_M need the per-tensor rules, which are not implemented: use --pure)")]
    Target(String),
    /// Only `--pure` is implemented.
    #[error("only --pure is implemented: every matrix becomes {0}")]
    NotPure(String),
    /// The log could not be written.
    #[error("cannot write the log: {0}")]
    Log(#[from] std::io::Error),
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a file whose matrices are all `ty`, for
/// the types `quantize` writes.
fn file_type(ty: GgmlType) -> Option<u32> {
    Some(match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        // llama-quantize's Q4_K, Q5_K and Q6_K are its Q4_K_M, Q5_K_M and Q6_K file types.
        GgmlType::Q4_K => 15,
        GgmlType::Q5_K => 17,
        GgmlType::Q6_K => 18,
        GgmlType::BF16 => 32,
        _ => return None,
    })
}

/// llama.cpp's fallback for a matrix whose rows do not split into `ty`'s blocks (a 896-wide
/// row has no 256-element super-blocks), as llama-quantize chooses it.
fn fallback(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => GgmlType::F16,
    }
}

/// Quantizes `input` into `output` with every matrix in `target` (`--pure`), on `n_threads`
/// threads, saying what it does per tensor on `log`.
pub fn quantize(
    input: &Path,
    output: &Path,
    target: &str,
    pure: bool,
    n_threads: usize,
    log: &mut impl Write,
) -> Result<(), QuantizeError> {
    let (ty, ftype) = GgmlType::from_name(target)
        .and_then(|t| Some((t, file_type(t)?)))
        .ok_or_else(|| QuantizeError::Target(target.to_string()))?;
    if !pure {
        return Err(QuantizeError::NotPure(target.to_string()));
    }
    let file = GgufFile::open(input)?;
    let mut writer = GgufWriter::new();
    writer.set_all(file.metadata());
    writer.set("general.file_type", Value::U32(ftype));
    let n_tensors = file.tensors().len();
    for (i, info) in file.tensors().iter().enumerate() {
        let data = file.tensor_data(info);
        let row = info.shape.first().copied().unwrap_or(1) as usize;
        let n = info.n_elements() as usize;
        let wanted = if info.shape.len() >= 2 { ty } else { GgmlType::F32 };
        let out_type = if row.is_multiple_of(wanted.block_size()) {
            wanted
        } else {
            fallback(wanted)
        };
        let bytes = if out_type == info.ggml_type {
            data.to_vec()
        } else {
            convert(info.ggml_type, data, out_type, n, row, n_threads)?
        };
        writeln!(
            log,
            "[{:>4}/{n_tensors}] {:<32} {:>5} -> {:<5} {:?}{}",
            i + 1,
            info.name,
            info.ggml_type.name(),
            out_type.name(),
            info.shape,
            if out_type != wanted {
                format!(" (rows of {row} do not split into {}'s blocks)", wanted.name())
            } else {
                String::new()
            }
        )?;
        writer.add_tensor(&info.name, out_type, &info.shape, bytes)?;
    }
    writer.write_file(output)?;
    Ok(())
}

/// `data` (`n` values of `from` in rows of `row`) as `to`, the rows shared among the threads.
fn convert(
    from: GgmlType,
    data: &[u8],
    to: GgmlType,
    n: usize,
    row: usize,
    n_threads: usize,
) -> Result<Vec<u8>, QuantizeError> {
    let n_rows = n / row.max(1);
    if n_rows == 0 {
        return Ok(Vec::new());
    }
    let (row_in, row_out) = (
        row / from.block_size() * from.type_size(),
        row / to.block_size() * to.type_size(),
    );
    let mut out = vec![0u8; n_rows * row_out];
    let per_thread = n_rows.div_ceil(n_threads.max(1)).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = out
            .chunks_mut(per_thread * row_out)
            .zip(data.chunks(per_thread * row_in))
            .map(|(dst, src)| {
                scope.spawn(move || -> Result<(), QuantizeError> {
                    let mut values = vec![0f32; row];
                    for (d, s) in dst.chunks_mut(row_out).zip(src.chunks(row_in)) {
                        dequantize_row(from, s, &mut values)?;
                        quantize_row(to, &values, d)?;
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
