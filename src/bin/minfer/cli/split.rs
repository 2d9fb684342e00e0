//! `minfer split IN OUT_PREFIX` and `minfer merge PART OUT`: llama-gguf-split's split and
//! merge, with a line per part written.
//!
//! The file work is [`minfer::gguf::split`]'s; this module reads the limits and prints.

use minfer::gguf::split::{merge_file, split_file, SplitLimit};
use minfer::gguf::GgufFile;
use std::io::Write;
use std::path::Path;

/// Why `split` or `merge` failed.
#[derive(Debug, thiserror::Error)]
pub enum SplitCommandError {
    /// `--split-max-size` is not a size.
    #[error("--split-max-size {0}: expected a positive whole number of megabytes or gigabytes, such as 500M or 2G")]
    Size(String),
    /// The files could not be read or written.
    #[error(transparent)]
    Gguf(#[from] minfer::gguf::GgufError),
    /// The log could not be written.
    #[error("cannot write the log: {0}")]
    Log(#[from] std::io::Error),
}

/// `500M` or `2G` in bytes, as llama-gguf-split counts them (decimal: M is 10^6 bytes).
pub fn parse_size(text: &str) -> Result<u64, SplitCommandError> {
    let bad = || SplitCommandError::Size(text.to_string());
    let (digits, unit) = match text.as_bytes().last() {
        Some(b'M') => (&text[..text.len() - 1], 1_000_000u64),
        Some(b'G') => (&text[..text.len() - 1], 1_000_000_000u64),
        _ => return Err(bad()),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(bad());
    }
    n.checked_mul(unit).ok_or_else(bad)
}

/// Split `input` into parts named `{prefix}-NNNNN-of-NNNNN.gguf`, a line per part on `log`.
pub fn split(
    input: &Path,
    prefix: &str,
    limit: SplitLimit,
    no_tensor_first_split: bool,
    log: &mut impl Write,
) -> Result<(), SplitCommandError> {
    let file = GgufFile::open(input)?;
    let parts = split_file(&file, prefix, limit, no_tensor_first_split)?;
    for p in &parts {
        writeln!(log, "{}: {} tensors, {} bytes", p.path.display(), p.n_tensors, p.bytes)?;
    }
    writeln!(log, "{} parts, {} tensors", parts.len(), file.tensors().len())?;
    Ok(())
}

/// Merge the split model `part` belongs to into `output`, saying so on `log`.
pub fn merge(part: &Path, output: &Path, log: &mut impl Write) -> Result<(), SplitCommandError> {
    let n = merge_file(part, output)?;
    writeln!(log, "{}: merged from {n} parts", output.display())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_decimal_megabytes_or_gigabytes() {
        assert_eq!(parse_size("500M").unwrap(), 500_000_000);
        assert_eq!(parse_size("2G").unwrap(), 2_000_000_000);
        for bad in ["", "M", "0M", "500", "1.5G", "-1M", "500K", "99999999999999999999G"] {
            let err = parse_size(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("--split-max-size {bad}:")), "{bad}: {err}");
        }
    }
}
