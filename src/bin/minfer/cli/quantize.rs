//! `minfer quantize IN OUT TYPE [--pure] [--imatrix FILE]`: llama-quantize's file types, its
//! mixes' per-tensor rules (or every matrix in one type with `--pure`) and its bytes, with an
//! importance matrix too, with a progress line per tensor on the log writer.
//!
//! The conversion is [`minfer::quantize`]'s; this module names the target and prints.

use minfer::gguf::GgufFile;
use minfer::quantize::{quantize_file, FileType, Imatrix, ImatrixError, Progress, QuantizeError, QuantizeOptions};
use std::io::Write;
use std::path::Path;

/// Why `quantize` failed.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeCommandError {
    /// The target is not a file type `quantize` writes.
    #[error("cannot quantize to {target}: the types are {known}")]
    Target {
        /// The name given.
        target: String,
        /// The names accepted.
        known: String,
    },
    /// A file type of llama-quantize's that `quantize` does not write yet.
    #[error(
        "cannot quantize to {target}: minfer does not write llama-quantize's {target} yet ({why}); the types are {known}"
    )]
    NotWritten {
        /// The name given.
        target: String,
        /// What it lacks.
        why: &'static str,
        /// The names accepted.
        known: String,
    },
    /// The input could not be opened.
    #[error(transparent)]
    Gguf(#[from] minfer::gguf::GgufError),
    /// The importance matrix could not be read.
    #[error(transparent)]
    Imatrix(#[from] ImatrixError),
    /// `--include-weights` and `--exclude-weights` together, which llama-quantize refuses.
    #[error("--include-weights and --exclude-weights cannot be used together")]
    IncludeAndExclude,
    /// The conversion failed.
    #[error(transparent)]
    Quantize(#[from] QuantizeError),
}

/// The importance matrix of a run: the file and the weights to use it for or not.
#[derive(Debug, Default)]
pub struct ImatrixArgs {
    /// `--imatrix FILE`.
    pub file: Option<std::path::PathBuf>,
    /// `--include-weights NAME`: only the entries whose names contain one of these.
    pub include: Vec<String>,
    /// `--exclude-weights NAME`: not the entries whose names contain one of these.
    pub exclude: Vec<String>,
}

/// Quantizes `input` into `output` as llama-quantize does for the file type named `target`
/// (`pure`: every matrix in that type; `imatrix`: weighed by an importance matrix), on
/// `n_threads` threads, with a line per tensor on `log`.
pub fn quantize(
    input: &Path,
    output: &Path,
    target: &str,
    pure: bool,
    imatrix: &ImatrixArgs,
    n_threads: usize,
    log: &mut impl Write,
) -> Result<(), QuantizeCommandError> {
    let known = || FileType::names().collect::<Vec<_>>().join(", ");
    let ftype = FileType::from_name(target).ok_or_else(|| match not_written(target) {
        Some(why) => QuantizeCommandError::NotWritten {
            target: target.to_string(),
            why,
            known: known(),
        },
        None => QuantizeCommandError::Target {
            target: target.to_string(),
            known: known(),
        },
    })?;
    if !imatrix.include.is_empty() && !imatrix.exclude.is_empty() {
        return Err(QuantizeCommandError::IncludeAndExclude);
    }
    let matrix = match &imatrix.file {
        Some(path) => {
            let mut m = Imatrix::load(path)?;
            writeln!(
                log,
                "loaded {} importance matrix entries from {} computed on {} chunks{}",
                m.len(),
                path.display(),
                m.chunk_count,
                if m.datasets.is_empty() {
                    String::new()
                } else {
                    format!(" of {}", m.datasets.join(", "))
                }
            )
            .map_err(QuantizeError::Progress)?;
            if !imatrix.exclude.is_empty() {
                m.filter(&imatrix.exclude, false);
            }
            if !imatrix.include.is_empty() {
                m.filter(&imatrix.include, true);
            }
            Some(m)
        }
        None => None,
    };
    let file = GgufFile::open(input)?;
    let options = QuantizeOptions {
        ftype,
        pure,
        n_threads,
        imatrix: matrix.as_ref(),
    };
    quantize_file(&file, output, options, |p| writeln!(log, "{}", progress_line(p)))?;
    Ok(())
}

/// Why llama-quantize's file type `name` is not one `quantize` writes, if it is one of its.
fn not_written(name: &str) -> Option<&'static str> {
    const GRID_SEARCH: &[&str] = &[
        "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M",
    ];
    const NO_QUANTIZER: &[&str] = &["MXFP4_MOE", "Q1_0", "Q2_0", "COPY"];
    if GRID_SEARCH.iter().any(|n| n.eq_ignore_ascii_case(name)) {
        Some("the grid searches of its i-quants (IQ1, IQ2, IQ3) are not written yet: minfer reads these types but does not write them")
    } else if NO_QUANTIZER.iter().any(|n| n.eq_ignore_ascii_case(name)) {
        Some("no quantizer for its types, or no rules for the mix, here")
    } else {
        None
    }
}

/// `[  12/ 291] blk.0.ffn_down.weight   F32   -> Q6_K  [4864, 896]`, and why a tensor fell
/// back from the type its rules chose.
fn progress_line(p: &Progress) -> String {
    let total = p.total.to_string();
    let mut line = format!(
        "[{:>w$}/{total}] {:<32} {:>5} -> {:<5} {:?}",
        p.index,
        p.name,
        p.from.name(),
        p.to.name(),
        p.shape,
        w = total.len(),
    );
    if let Some(chosen) = p.fell_back_from {
        let row = p.shape.first().copied().unwrap_or(1);
        line += &format!(" (rows of {row} do not split into {}'s blocks)", chosen.name());
    }
    line
}
