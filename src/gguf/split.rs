//! Split models: the `name-00001-of-00003.gguf` naming llama.cpp's gguf-split uses, the
//! `split.*` metadata keys each part carries, and cutting a file into parts ([`split_file`])
//! and joining them back ([`merge_file`]) with llama-gguf-split's rules
//! (`tools/gguf-split/gguf-split.cpp`).
//!
//! A split writes llama-gguf-split's bytes: all the metadata in the first part, only the three
//! `split.*` keys in the others, tensors in file order, cut where its size or tensor-count rule
//! cuts. A merge drops the `split.*` keys, so merging the parts of a file gives that file back
//! byte for byte (llama-gguf-split's merge keeps `split.no` and `split.tensors.count` and sets
//! `split.count` to 0 instead).

use super::error::{GgufError, Result};
use super::file::GgufFile;
use super::reader::{TensorInfo, DEFAULT_ALIGNMENT};
use super::value::Value;
use super::writer::{GgufStreamWriter, TensorLayout};
use std::path::{Path, PathBuf};

/// Key holding the 0-based index of this part (u16).
pub const KEY_SPLIT_NO: &str = "split.no";
/// Key holding the number of parts (u16).
pub const KEY_SPLIT_COUNT: &str = "split.count";
/// Key holding the total number of tensors over all parts (i32).
pub const KEY_SPLIT_TENSORS_COUNT: &str = "split.tensors.count";

/// The path of part `split_no` (0-based) of `split_count`, as llama.cpp's `llama_split_path`
/// names it: `{prefix}-{no+1:05}-of-{count:05}.gguf`.
pub fn split_path(prefix: &str, split_no: u32, split_count: u32) -> String {
    format!("{prefix}-{:05}-of-{:05}.gguf", split_no + 1, split_count)
}

/// Parse a split file name into its prefix, 0-based part index and part count, or `None` if
/// the name does not follow the split naming.
pub fn parse_split_path(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    // "-NNNNN-of-NNNNN" is 15 characters.
    if stem.len() < 15 || !stem.is_char_boundary(stem.len() - 15) {
        return None;
    }
    let (prefix, tail) = stem.split_at(stem.len() - 15);
    let tail = tail.strip_prefix('-')?;
    let (no, count) = tail.split_once("-of-")?;
    if no.len() != 5 || count.len() != 5 || !no.bytes().chain(count.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (no, count): (u32, u32) = (no.parse().ok()?, count.parse().ok()?);
    if no == 0 || no > count {
        return None;
    }
    Some((prefix, no - 1, count))
}

/// Where a split cuts (llama-gguf-split's `--split-max-tensors` and `--split-max-size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitLimit {
    /// At most this many tensors per part.
    MaxTensors(usize),
    /// At most this many bytes of tensor data (each tensor padded to 32 bytes) per part; the
    /// metadata does not count.
    MaxBytes(u64),
}

impl std::fmt::Display for SplitLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SplitLimit::MaxTensors(n) => write!(f, "at most {n} tensors per part"),
            SplitLimit::MaxBytes(n) => write!(f, "at most {n} bytes of tensors per part"),
        }
    }
}

/// The tensors of each part, as indices into `tensors` (in order). With
/// `no_tensor_first_split` the first part holds only the metadata.
pub fn plan_split(tensors: &[TensorInfo], limit: SplitLimit, no_tensor_first_split: bool) -> Result<Vec<Vec<usize>>> {
    let err = |reason: String| GgufError::Split {
        path: PathBuf::new(),
        reason,
    };
    if limit == SplitLimit::MaxTensors(0) || limit == SplitLimit::MaxBytes(0) {
        return Err(err(format!("the limit must be positive, got {limit}")));
    }
    let mut parts: Vec<Vec<usize>> = vec![Vec::new()];
    if no_tensor_first_split {
        parts.push(Vec::new());
    }
    let mut bytes = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        // llama-gguf-split counts each tensor padded to the default alignment, whatever the
        // file's.
        let size = t.size.next_multiple_of(DEFAULT_ALIGNMENT);
        let cut = match limit {
            SplitLimit::MaxBytes(max) => bytes + size > max,
            SplitLimit::MaxTensors(n) => i > 0 && i.is_multiple_of(n),
        };
        if cut {
            if parts.last().is_some_and(|p| p.is_empty()) {
                return Err(err(format!(
                    "part {} would hold no tensor: '{}' ({} bytes) does not fit {limit}",
                    parts.len(),
                    t.name,
                    t.size
                )));
            }
            parts.push(Vec::new());
            bytes = size;
        } else {
            bytes += size;
        }
        parts.last_mut().expect("a part is open").push(i);
    }
    if parts.len() > u16::MAX as usize {
        return Err(err(format!("{} parts: split.count is a u16", parts.len())));
    }
    Ok(parts)
}

/// One part written by [`split_file`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenPart {
    /// Its path.
    pub path: PathBuf,
    /// How many tensors it holds.
    pub n_tensors: usize,
    /// Its size in bytes.
    pub bytes: u64,
}

/// Cut `input` into parts named `{prefix}-NNNNN-of-NNNNN.gguf` (see [`plan_split`]), replacing
/// any files there.
pub fn split_file(
    input: &GgufFile,
    prefix: &str,
    limit: SplitLimit,
    no_tensor_first_split: bool,
) -> Result<Vec<WrittenPart>> {
    let tensors = input.tensors();
    let parts = plan_split(tensors, limit, no_tensor_first_split).map_err(|e| match e {
        GgufError::Split { reason, .. } => GgufError::Split {
            path: input.paths().next().map(Path::to_path_buf).unwrap_or_default(),
            reason,
        },
        e => e,
    })?;
    let count = parts.len() as u32;
    // Writing a part over a file of the input (re-splitting under the same prefix) would
    // truncate what is being read: refused before anything is written.
    let inputs: Vec<PathBuf> = input.paths().filter_map(|p| p.canonicalize().ok()).collect();
    for no in 0..count {
        let path = PathBuf::from(split_path(prefix, no, count));
        if path.canonicalize().is_ok_and(|p| inputs.contains(&p)) {
            return Err(GgufError::Split {
                path,
                reason: "this part would overwrite a file of the input: choose another prefix".into(),
            });
        }
    }
    let mut written = Vec::with_capacity(parts.len());
    for (no, part) in parts.iter().enumerate() {
        // gguf-split sets split.count to a placeholder before it knows the count and again at
        // the end; each set moves the key last.
        let mut metadata = if no == 0 {
            input.metadata().clone()
        } else {
            Default::default()
        };
        metadata.set_last(KEY_SPLIT_NO, Value::U16(no as u16));
        metadata.set_last(KEY_SPLIT_TENSORS_COUNT, Value::I32(tensors.len() as i32));
        metadata.set_last(KEY_SPLIT_COUNT, Value::U16(count as u16));
        let layout: Vec<TensorLayout> = part
            .iter()
            .map(|&i| TensorLayout::as_ggml_records(&tensors[i].name, tensors[i].ggml_type, &tensors[i].shape))
            .collect();
        let path = PathBuf::from(split_path(prefix, no as u32, count));
        let mut out = GgufStreamWriter::create(&path, &metadata, &layout)?;
        for &i in part {
            out.write_tensor(&tensors[i].name, input.tensor_data(&tensors[i]))?;
        }
        out.finish()?;
        let bytes = std::fs::metadata(&path)
            .map_err(|source| GgufError::Io {
                path: path.clone(),
                source,
            })?
            .len();
        written.push(WrittenPart {
            path,
            n_tensors: part.len(),
            bytes,
        });
    }
    Ok(written)
}

/// Join the parts of the split model `part` belongs to (any part names them all) into one
/// file at `output`, which must not exist yet. Returns the number of parts.
pub fn merge_file(part: &Path, output: &Path) -> Result<usize> {
    let input = GgufFile::open(part)?;
    if !input.metadata().contains(KEY_SPLIT_COUNT) {
        return Err(GgufError::Split {
            path: part.to_path_buf(),
            reason: format!("not a split model: no {KEY_SPLIT_COUNT} key"),
        });
    }
    if output.exists() {
        return Err(GgufError::Split {
            path: output.to_path_buf(),
            reason: "the output file already exists".into(),
        });
    }
    let mut metadata = input.metadata().clone();
    for key in [KEY_SPLIT_NO, KEY_SPLIT_COUNT, KEY_SPLIT_TENSORS_COUNT] {
        metadata.remove(key);
    }
    let tensors = input.tensors();
    let layout: Vec<TensorLayout> = tensors
        .iter()
        .map(|t| TensorLayout::as_ggml_records(&t.name, t.ggml_type, &t.shape))
        .collect();
    let mut out = GgufStreamWriter::create(output, &metadata, &layout)?;
    for t in tensors {
        out.write_tensor(&t.name, input.tensor_data(t))?;
    }
    out.finish()?;
    Ok(input.paths().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensors(sizes: &[u64]) -> Vec<TensorInfo> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| TensorInfo {
                name: format!("t{i}"),
                ggml_type: crate::quant::GgmlType::I8,
                shape: vec![size],
                offset: 0,
                size,
                part: 0,
            })
            .collect()
    }

    #[test]
    fn a_tensor_limit_cuts_every_n_tensors_and_a_size_limit_before_the_tensor_that_overflows() {
        let t = tensors(&[10, 20, 30, 40, 50]);
        assert_eq!(
            plan_split(&t, SplitLimit::MaxTensors(2), false).unwrap(),
            vec![vec![0, 1], vec![2, 3], vec![4]]
        );
        // Padded to 32: 32, 32, 32, 64, 64.
        assert_eq!(
            plan_split(&t, SplitLimit::MaxBytes(96), false).unwrap(),
            vec![vec![0, 1, 2], vec![3], vec![4]]
        );
        assert_eq!(
            plan_split(&t, SplitLimit::MaxTensors(3), true).unwrap(),
            vec![vec![], vec![0, 1, 2], vec![3, 4]]
        );
        // A tensor larger than the limit gets a part of its own, unless it is the first: then
        // the part before it would be empty, which llama-gguf-split refuses.
        assert_eq!(
            plan_split(&t, SplitLimit::MaxBytes(40), false).unwrap(),
            vec![vec![0], vec![1], vec![2], vec![3], vec![4]]
        );
        let err = plan_split(&t, SplitLimit::MaxBytes(20), false).unwrap_err().to_string();
        assert!(err.contains("'t0'") && err.contains("no tensor"), "{err}");
        assert!(plan_split(&t, SplitLimit::MaxTensors(0), false).is_err());
    }

    #[test]
    fn split_paths_follow_llama_cpp_naming_and_parse_back() {
        let p = split_path("/models/qwen", 1, 3);
        assert_eq!(p, "/models/qwen-00002-of-00003.gguf");
        assert_eq!(parse_split_path(&p), Some(("/models/qwen", 1, 3)));
        assert_eq!(parse_split_path("/models/qwen.gguf"), None);
        assert_eq!(parse_split_path("/models/qwen-00000-of-00003.gguf"), None);
        assert_eq!(parse_split_path("/models/qwen-00004-of-00003.gguf"), None);
        assert_eq!(parse_split_path("x-0000a-of-00003.gguf"), None);
    }
}
