//! Importance matrices as llama-quantize reads them (`--imatrix FILE`): llama-imatrix's GGUF
//! files (per weight, `<name>.in_sum2` — the sums of each input column's squares — and
//! `<name>.counts` — the tokens, per expert) and the legacy `.dat` files, each entry brought to
//! the mean square per column the quantizers weigh (`load_imatrix` in llama.cpp's
//! `tools/quantize`, float for float).
//!
//! This module reads the files and hands out each weight's row of weights, and writes the
//! statistics `minfer imatrix` gathers in llama-imatrix's GGUF form ([`ImatrixStats`]); it does
//! not choose which tensors use them (that is `quantize_file`'s), quantize, or run a model.

use crate::gguf::{Array, GgufFile, GgufWriter, Value};
use crate::quant::GgmlType;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Why an importance matrix could not be read.
#[derive(Debug, thiserror::Error)]
#[error("importance matrix {}: {reason}", path.display())]
pub struct ImatrixError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub reason: String,
}

/// An importance matrix: per weight name, the mean square of each input column (per expert,
/// one row of `ne0` after another).
#[derive(Clone, Debug, Default)]
pub struct Imatrix {
    entries: HashMap<String, Vec<f32>>,
    /// The path it was read from, as given (llama-quantize records it in the output).
    pub source: String,
    /// The texts it was computed on, as the file names them.
    pub datasets: Vec<String>,
    /// The chunks it was computed on.
    pub chunk_count: u32,
}

impl Imatrix {
    /// Reads `path`: a GGUF file, or else the legacy format.
    pub fn load(path: &Path) -> Result<Self, ImatrixError> {
        let fail = |reason: String| ImatrixError {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
        let imatrix = if bytes.starts_with(b"GGUF") {
            Self::from_gguf(path).map_err(fail)?
        } else {
            Self::from_legacy(&bytes).map_err(fail)?
        };
        let mut imatrix = imatrix;
        imatrix.source = path.to_string_lossy().into_owned();
        if imatrix.entries.is_empty() {
            return Err(fail("no entries".into()));
        }
        // llama-quantize refuses a matrix with a NaN or an infinity.
        for (name, values) in &imatrix.entries {
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                return Err(fail(format!("the entry of {name} holds the non-finite value {v}")));
            }
        }
        Ok(imatrix)
    }

    /// The weights of the tensor `name`, if the matrix has them.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(Vec::as_slice)
    }

    /// The number of weights it has entries for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The keys llama-quantize adds to a file quantized with this matrix (after the file type):
    /// its path and first dataset (each cut to 127 bytes), its entries and its chunks (when
    /// known). None when filtering left no entry.
    pub fn metadata(&self) -> Vec<(&'static str, Value)> {
        if self.entries.is_empty() {
            return Vec::new();
        }
        let cut = |s: &str| {
            let mut end = s.len().min(127);
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s[..end].to_string()
        };
        let mut keys = vec![("quantize.imatrix.file", Value::String(cut(&self.source)))];
        if let Some(first) = self.datasets.first() {
            keys.push(("quantize.imatrix.dataset", Value::String(cut(first))));
        }
        keys.push(("quantize.imatrix.entries_count", Value::U32(self.entries.len() as u32)));
        if self.chunk_count > 0 {
            keys.push(("quantize.imatrix.chunks_count", Value::U32(self.chunk_count)));
        }
        keys
    }

    /// Whether it has none (never, once loaded).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps only the entries whose names contain one of `names` (llama-quantize's
    /// `--include-weights`), or drops those (`--exclude-weights`).
    pub fn filter(&mut self, names: &[String], keep: bool) {
        self.entries
            .retain(|name, _| names.iter().any(|n| name.contains(n.as_str())) == keep);
    }

    /// llama-imatrix's GGUF: `sums / count` per expert row, 1 where the count is 0.
    fn from_gguf(path: &Path) -> Result<Self, String> {
        let file = GgufFile::open(path).map_err(|e| e.to_string())?;
        let meta = file.metadata();
        let (datasets, count, size) = (
            meta.get("imatrix.datasets"),
            meta.get("imatrix.chunk_count"),
            meta.get("imatrix.chunk_size"),
        );
        if datasets.is_none() || count.is_none() || size.is_none() {
            return Err("missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size)".into());
        }
        let mut imatrix = Imatrix {
            chunk_count: match count {
                Some(Value::U32(n)) => *n,
                other => return Err(format!("imatrix.chunk_count is {other:?}, not a u32")),
            },
            ..Default::default()
        };
        if let Some(Value::Array(Array::String(names))) = datasets {
            imatrix.datasets = names.clone();
        }
        let tensors: HashMap<&str, &crate::gguf::TensorInfo> =
            file.tensors().iter().map(|t| (t.name.as_str(), t)).collect();
        let floats = |t: &crate::gguf::TensorInfo| -> Result<Vec<f32>, String> {
            if t.ggml_type != GgmlType::F32 {
                return Err(format!("{} is {}, not F32", t.name, t.ggml_type));
            }
            Ok(file
                .tensor_data(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect())
        };
        for t in file.tensors() {
            let Some(name) = t.name.strip_suffix(".in_sum2") else {
                continue;
            };
            let counts = tensors
                .get(format!("{name}.counts").as_str())
                .ok_or_else(|| format!("{name} has sums but no counts"))?;
            let (sums, counts) = (floats(t)?, floats(counts)?);
            if counts.is_empty() || sums.len() % counts.len() != 0 {
                return Err(format!(
                    "{name}: {} sums do not split into {} experts' rows",
                    sums.len(),
                    counts.len()
                ));
            }
            let ne0 = sums.len() / counts.len();
            let mut values = vec![0f32; sums.len()];
            for ((row, sums), &count) in values.chunks_exact_mut(ne0).zip(sums.chunks_exact(ne0)).zip(&counts) {
                // llama.cpp rounds the stored count to an integer, then divides by it as a float.
                let count = count.round() as i64 as f32;
                for (v, &s) in row.iter_mut().zip(sums) {
                    *v = if count > 0.0 { s / count } else { 1.0 };
                }
            }
            imatrix.entries.insert(name.to_string(), values);
        }
        for t in file.tensors() {
            if let Some(name) = t.name.strip_suffix(".counts") {
                if !imatrix.entries.contains_key(name) {
                    return Err(format!("{name} has counts but no sums"));
                }
            }
        }
        Ok(imatrix)
    }

    /// The legacy format: `n_entries`, then per entry its name, `ncall`, `nval` and `nval`
    /// floats, then optionally the chunk count and the dataset's name; each value divided by
    /// `ncall` (kept as it is when that is 0).
    fn from_legacy(bytes: &[u8]) -> Result<Self, String> {
        let mut r = Reader { bytes, at: 0 };
        let n_entries = r.i32("the entry count")?;
        if n_entries < 1 {
            return Err(format!("{n_entries} entries: not an importance matrix"));
        }
        let mut imatrix = Imatrix::default();
        for i in 0..n_entries {
            let len = r.len(&format!("entry {i}'s name length"), 1)?;
            let name = String::from_utf8_lossy(r.take(len, "a name")?).into_owned();
            let ncall = r.i32("a call count")?;
            let nval = r.len(&format!("{name}'s value count"), 4)?;
            if nval < 1 {
                return Err(format!("{name} has no values"));
            }
            let values = r.take(4 * nval, "values")?;
            let values = values
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .map(|v| if ncall > 0 { v / ncall as i64 as f32 } else { v })
                .collect();
            imatrix.entries.insert(name, values);
        }
        if r.at < bytes.len() {
            if let Ok(n) = r.i32("the chunk count") {
                imatrix.chunk_count = n.max(0) as u32;
                if let Ok(len) = r.len("the dataset name length", 1) {
                    if let Ok(name) = r.take(len, "the dataset name") {
                        imatrix.datasets.push(String::from_utf8_lossy(name).into_owned());
                    }
                }
            }
        }
        Ok(imatrix)
    }
}

/// What llama-imatrix gathers: per weight, the sums of the squares of each input column over
/// every token that went through it, and that token count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImatrixStats {
    /// Per weight name: the column sums (f32, accumulated token after token) and the tokens.
    pub entries: BTreeMap<String, (Vec<f32>, u64)>,
    /// The texts, as named on the command line.
    pub datasets: Vec<String>,
    /// Tokens per chunk (`-c`).
    pub chunk_size: u32,
}

impl ImatrixStats {
    /// Adds the rows of one matrix product's input (`width` values per token) to the entry
    /// of `weight`: `sums[j] += x[j]²` for each row in order, and the row count.
    pub fn add(&mut self, weight: &str, width: usize, rows: &[f32]) {
        let (sums, count) = self
            .entries
            .entry(weight.to_string())
            .or_insert_with(|| (vec![0.0; width], 0));
        for row in rows.chunks_exact(width) {
            for (s, &x) in sums.iter_mut().zip(row) {
                *s += x * x;
            }
            *count += 1;
        }
    }

    /// Whole chunks seen: the largest count over the chunk size (llama-imatrix's `m_last_chunk`).
    pub fn chunk_count(&self) -> u32 {
        let most = self.entries.values().map(|(_, c)| *c).max().unwrap_or(0);
        most.checked_div(self.chunk_size as u64).unwrap_or(0) as u32
    }

    /// Writes llama-imatrix's GGUF file: `general.type` `imatrix`, the datasets, chunk count and
    /// size, and per weight (names sorted) `<name>.in_sum2` `[width, 1]` and `<name>.counts`
    /// `[1, 1]`, F32.
    pub fn write_gguf(&self, path: &Path) -> crate::gguf::Result<()> {
        let mut w = GgufWriter::new();
        w.set("general.type", Value::String("imatrix".into()))
            .set("imatrix.datasets", Value::Array(Array::String(self.datasets.clone())))
            .set("imatrix.chunk_count", Value::U32(self.chunk_count()))
            .set("imatrix.chunk_size", Value::U32(self.chunk_size));
        for (name, (sums, count)) in &self.entries {
            let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            w.add_tensor(
                &format!("{name}.in_sum2"),
                GgmlType::F32,
                &[sums.len() as u64, 1],
                bytes(sums),
            )?;
            w.add_tensor(
                &format!("{name}.counts"),
                GgmlType::F32,
                &[1, 1],
                bytes(&[*count as f32]),
            )?;
        }
        w.write_file(path)
    }
}

/// A little-endian cursor over a legacy file, every length checked against what is left.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| format!("the file ends inside {what} (byte {})", self.at))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        Ok(i32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }

    /// A non-negative count of items of `item_size` bytes that the rest of the file can hold.
    fn len(&mut self, what: &str, item_size: usize) -> Result<usize, String> {
        let n = self.i32(what)?;
        let left = (self.bytes.len() - self.at) / item_size;
        match usize::try_from(n) {
            Ok(n) if n <= left => Ok(n),
            _ => Err(format!("{what} is {n}, more than the {left} the file has left")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(entries: &[(&str, i32, &[f32])], tail: Option<(i32, &str)>) -> Vec<u8> {
        let mut b = (entries.len() as i32).to_le_bytes().to_vec();
        for (name, ncall, values) in entries {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((values.len() as i32).to_le_bytes());
            values.iter().for_each(|v| b.extend(v.to_le_bytes()));
        }
        if let Some((chunks, dataset)) = tail {
            b.extend(chunks.to_le_bytes());
            b.extend((dataset.len() as i32).to_le_bytes());
            b.extend(dataset.as_bytes());
        }
        b
    }

    #[test]
    fn a_legacy_file_divides_each_entry_by_its_calls() {
        let bytes = legacy(
            &[("a.weight", 4, &[2.0, 6.0]), ("b.weight", 0, &[3.0])],
            Some((7, "wiki.txt")),
        );
        let m = Imatrix::from_legacy(&bytes).unwrap();
        assert_eq!(m.get("a.weight"), Some(&[0.5, 1.5][..]));
        assert_eq!(m.get("b.weight"), Some(&[3.0][..]), "no calls: the sums as they are");
        assert_eq!(
            (m.chunk_count, m.datasets.as_slice()),
            (7, &["wiki.txt".to_string()][..])
        );
    }

    #[test]
    fn a_truncated_or_lying_legacy_file_is_refused_naming_what_is_missing() {
        let bytes = legacy(&[("a.weight", 1, &[2.0, 6.0])], None);
        let err = Imatrix::from_legacy(&bytes[..bytes.len() - 2]).unwrap_err();
        assert_eq!(err, "a.weight's value count is 2, more than the 1 the file has left");
        let mut huge = bytes.clone();
        huge[4..8].copy_from_slice(&i32::MAX.to_le_bytes());
        let err = Imatrix::from_legacy(&huge).unwrap_err();
        assert!(err.contains("name length is 2147483647, more than"), "{err}");
        let err = Imatrix::from_legacy(&0i32.to_le_bytes()).unwrap_err();
        assert!(err.contains("0 entries"), "{err}");
    }

    #[test]
    fn filters_keep_or_drop_the_entries_whose_names_contain_a_pattern() {
        let bytes = legacy(
            &[("blk.0.ffn_down.weight", 1, &[1.0]), ("blk.0.attn_q.weight", 1, &[1.0])],
            None,
        );
        let mut m = Imatrix::from_legacy(&bytes).unwrap();
        m.filter(&["ffn_down".into()], false);
        assert!(m.get("blk.0.ffn_down.weight").is_none() && m.get("blk.0.attn_q.weight").is_some());
        m.filter(&["attn".into()], true);
        assert_eq!(m.len(), 1);
    }
}
