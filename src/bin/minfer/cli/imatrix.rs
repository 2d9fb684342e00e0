//! `minfer imatrix MODEL -f TEXT [-o FILE]`: an importance matrix as llama-imatrix computes
//! it, written in its GGUF form (which `minfer quantize --imatrix` and llama-quantize read),
//! with llama-imatrix's running perplexity on the log writer.
//!
//! The statistics are [`minfer::engine::compute_imatrix`]'s and the file
//! [`minfer::quantize::ImatrixStats`]'; this module loads, tokenizes and prints.

use anyhow::Context;
use minfer::engine::{compute_imatrix, ImatrixOptions, Model, ModelOptions, Session};
use std::io::Write;
use std::path::Path;

/// What `imatrix` was asked for.
pub struct ImatrixCommand<'a> {
    /// The model.
    pub model: &'a Path,
    /// The text.
    pub text: &'a Path,
    /// The file to write.
    pub output: &'a Path,
    /// Tokens per chunk.
    pub n_ctx: usize,
    /// At most this many chunks.
    pub max_chunks: Option<usize>,
    /// Also the output head.
    pub process_output: bool,
    /// Threads.
    pub n_threads: usize,
}

/// Computes and writes the matrix, a line per chunk on `log`.
pub fn imatrix(cmd: &ImatrixCommand, log: &mut impl Write) -> anyhow::Result<()> {
    let options = ModelOptions {
        n_threads: Some(cmd.n_threads),
        ..Default::default()
    };
    let model = Model::load(cmd.model, &options).with_context(|| format!("cannot load {}", cmd.model.display()))?;
    let text = std::fs::read(cmd.text).with_context(|| format!("cannot read {}", cmd.text.display()))?;
    let tokenizer = model.tokenizer();
    let tokens = tokenizer.encode_bytes(&text, true, false);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
    let n_chunk = (tokens.len() / cmd.n_ctx).min(cmd.max_chunks.unwrap_or(usize::MAX));
    writeln!(
        log,
        "computing over {n_chunk} chunks of {} tokens ({} tokens of {})",
        cmd.n_ctx,
        tokens.len(),
        cmd.text.display()
    )?;
    let mut session = Session::new(&model, cmd.n_ctx);
    let options = ImatrixOptions {
        n_ctx: cmd.n_ctx,
        max_chunks: cmd.max_chunks,
        process_output: cmd.process_output,
        dataset: cmd.text.to_string_lossy().into_owned(),
    };
    // llama-imatrix's running perplexity of the chunks' second halves: `[1]7.1234,[2]...`.
    let stats = compute_imatrix(&mut session, &tokens, bos, &options, |done| {
        let _ = write!(log, "[{}]{:.4},", done.index, done.ppl);
        let _ = log.flush();
    })?;
    writeln!(log)?;
    stats
        .write_gguf(cmd.output)
        .with_context(|| format!("cannot write {}", cmd.output.display()))?;
    writeln!(
        log,
        "stored {} entries computed on {} chunks in {}",
        stats.entries.len(),
        stats.chunk_count(),
        cmd.output.display()
    )?;
    Ok(())
}
