//! The main job: load a model and one session over it, turn a prompt into tokens, and
//! generate. Also `eval`, the numerics probe. The binary maps flags to these options and errors
//! to exit codes; nothing here prints except through the writers it is given. Loading itself is
//! the engine's ([`Model::load`]); this file only adds what a single command-line run needs.

use minfer::engine::{
    generate, generate_cached, generate_speculative, session_file, DraftOptions, Drafter, EngineError, GenerateOptions,
    GenerationObserver, GenerationResult, LoadError, Model, ModelOptions, Session, SessionOptions,
};
use minfer::template::TemplateError;
use std::io::Write;
use std::path::Path;

/// Why a command-line run failed.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The model could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The chat template could not render the prompt.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// Evaluation or generation failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The prompt alone is longer than the context.
    #[error("the prompt has {n_prompt} tokens, more than the context of {n_ctx} (use --n-ctx, at most {n_ctx_train})")]
    PromptTooLong {
        /// The prompt's tokens.
        n_prompt: usize,
        /// The session's context.
        n_ctx: usize,
        /// The model's training context, the most `--n-ctx` can give.
        n_ctx_train: usize,
    },
    /// A saved session could not be loaded or written.
    #[error(transparent)]
    SessionFile(#[from] minfer::engine::session_file::SessionFileError),
    /// Output could not be written.
    #[error("cannot write {what}: {source}")]
    Write {
        /// What was being written.
        what: String,
        /// The system's reason.
        source: std::io::Error,
    },
}

/// A model and the one session a command-line run uses.
pub struct Loaded {
    /// The model (tokenizer, template, backends).
    pub model: Model,
    /// The run's one session, with `--n-ctx` tokens of context.
    pub session: Session,
}

/// Where and how to run: the model's options and its one session's, as the flags give them.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// Threads, backends, `-ngl`, how the file is read, the chat template.
    pub model: ModelOptions,
    /// Context, KV types, prompt passes.
    pub session: SessionOptions,
}

/// Load the model at `path` and open one session over it.
pub fn load(path: &Path, options: &LoadOptions) -> Result<Loaded, RunError> {
    let model = Model::load(path, &options.model)?;
    let session = Session::with_options(&model, &options.session)?;
    Ok(Loaded { model, session })
}

/// The prompt's tokens: as one user turn through the chat template, or raw (`no_template`).
/// Special-token text is parsed either way, and a BOS is added only if the model asks for one.
pub fn prompt_tokens(loaded: &Loaded, prompt: &str, no_template: bool) -> Result<Vec<u32>, RunError> {
    if no_template {
        return checked_tokens(loaded, prompt);
    }
    chat_tokens(loaded, None, prompt)
}

/// The tokens of one user turn `prompt`, after a system turn when `system` is given, through
/// the model's chat template; a prompt longer than the context is refused.
pub fn chat_tokens(loaded: &Loaded, system: Option<&String>, prompt: &str) -> Result<Vec<u32>, RunError> {
    let mut messages: Vec<serde_json::Value> = system
        .map(|s| serde_json::json!({"role": "system", "content": s}))
        .into_iter()
        .collect();
    messages.push(serde_json::json!({"role": "user", "content": prompt}));
    let text = loaded
        .model
        .template()
        .render(&messages, None, true, &serde_json::Map::new())?;
    checked_tokens(loaded, &text)
}

/// The tokens of `text`, refused when they do not fit in the context.
fn checked_tokens(loaded: &Loaded, text: &str) -> Result<Vec<u32>, RunError> {
    let tokens = loaded.model.encode(text);
    let n_ctx = loaded.session.n_ctx();
    if tokens.len() > n_ctx {
        return Err(RunError::PromptTooLong {
            n_prompt: tokens.len(),
            n_ctx,
            n_ctx_train: loaded.session.model().hparams().n_ctx_train,
        });
    }
    Ok(tokens)
}

/// Generate from `tokens`, streaming the text to `out` as it is produced.
pub fn run_generation(
    loaded: &mut Loaded,
    tokens: &[u32],
    options: &GenerateOptions,
    out: &mut impl Write,
) -> Result<GenerationResult, RunError> {
    // Generation also ends when the context is full (StopReason::ContextFull).
    let result = generate(
        &mut loaded.session,
        loaded.model.tokenizer(),
        tokens,
        options,
        |bytes| {
            out.write_all(bytes)
                .and_then(|_| out.flush())
                .map_err(|e| e.to_string())
        },
    )?;
    Ok(result)
}

/// [`run_generation`] with speculative decoding: `drafter` proposes, the model checks.
pub fn run_speculative(
    loaded: &mut Loaded,
    drafter: &mut dyn Drafter,
    draft: DraftOptions,
    tokens: &[u32],
    options: &GenerateOptions,
    out: &mut impl Write,
) -> Result<GenerationResult, RunError> {
    Ok(generate_speculative(
        &mut loaded.session,
        drafter,
        draft,
        loaded.model.tokenizer(),
        tokens,
        options,
        &mut Streamed(out),
    )?)
}

/// [`run_generation`] with a saved session (`--session FILE`): the file, when it exists, is
/// loaded first and the prompt's common prefix with it is not prefilled again; the session is
/// saved once the prompt is read, before generating. One line about it goes to `log`.
pub fn run_generation_saved(
    loaded: &mut Loaded,
    tokens: &[u32],
    options: &GenerateOptions,
    path: &Path,
    out: &mut impl Write,
    log: &mut impl Write,
) -> Result<GenerationResult, RunError> {
    let restored = if path.exists() {
        session_file::load(&mut loaded.session, &loaded.model, path)?.len()
    } else {
        0
    };
    let n_cached = loaded.session.reuse_prefix(0, tokens)?;
    let last = tokens.len() - 1;
    // The prompt is read up to its last token here, to save it; the generation reads the last.
    let started = std::time::Instant::now();
    let mut n_read = 0;
    if n_cached < last {
        loaded.session.eval(&tokens[n_cached..last], 1)?;
        n_read = last - n_cached;
    }
    let read_time = started.elapsed();
    let saved = session_file::save(&mut loaded.session, &loaded.model, path)?;
    writeln!(
        log,
        "session {}: {n_cached} of the prompt's {} tokens reused (the file held {restored}); {saved} saved",
        path.display(),
        tokens.len()
    )
    .map_err(|source| RunError::Write {
        what: "the log".into(),
        source,
    })?;
    let result = generate_cached(
        &mut loaded.session,
        loaded.model.tokenizer(),
        tokens,
        last,
        options,
        &mut Streamed(out),
    )?;
    // The timing line counts the whole prefill: what was read before the save, and the last
    // token the generation read (its own count), against the tokens the file gave back.
    let mut result = result;
    result.stats.n_prompt += n_read;
    result.stats.prompt_time += read_time;
    result.stats.n_cached = n_cached;
    Ok(result)
}

/// Streams the text to a writer.
struct Streamed<'a, W: Write>(&'a mut W);

impl<W: Write> GenerationObserver for Streamed<'_, W> {
    fn on_text(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.0
            .write_all(bytes)
            .and_then(|_| self.0.flush())
            .map_err(|e| e.to_string())
    }
}

/// llama.cpp's escape processing (`-e`): `\n`, `\r`, `\t`, `\\`, `\'`, `\"`, `\?`, `\a`,
/// `\b`, `\f`, `\v` and `\xHH`; any other backslash stays as it is.
pub fn unescape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let Some(&next) = chars.peek() else {
            out.push(c);
            break;
        };
        let simple = match next {
            'n' => Some('\n'),
            'r' => Some('\r'),
            't' => Some('\t'),
            '\\' => Some('\\'),
            '\'' => Some('\''),
            '"' => Some('"'),
            '?' => Some('?'),
            'a' => Some('\x07'),
            'b' => Some('\x08'),
            'f' => Some('\x0c'),
            'v' => Some('\x0b'),
            _ => None,
        };
        if let Some(escaped) = simple {
            chars.next();
            out.push(escaped);
            continue;
        }
        if next == 'x' {
            let hex: String = chars
                .clone()
                .skip(1)
                .take(2)
                .take_while(char::is_ascii_hexdigit)
                .collect();
            if hex.len() == 2 {
                chars.nth(2);
                out.push(char::from(u8::from_str_radix(&hex, 16).expect("two hex digits")));
                continue;
            }
        }
        out.push(c);
    }
    out
}

/// `eval`: the logits at the last position of a raw text (specials parsed, no template).
pub fn eval_last_logits(loaded: &mut Loaded, text: &str) -> Result<Vec<f32>, RunError> {
    let tokens = loaded.model.encode(text);
    if tokens.len() > loaded.session.n_ctx() {
        return Err(RunError::PromptTooLong {
            n_prompt: tokens.len(),
            n_ctx: loaded.session.n_ctx(),
            n_ctx_train: loaded.session.model().hparams().n_ctx_train,
        });
    }
    loaded.session.reset();
    Ok(loaded.session.eval(&tokens, 1)?.to_vec())
}

/// The `n` highest logits as `[[id, logit], ...]`, highest first (ties to the lower id).
pub fn top_logits_json(logits: &[f32], n: usize) -> String {
    let mut ids: Vec<usize> = (0..logits.len()).collect();
    ids.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    let items: Vec<String> = ids.iter().take(n).map(|&i| format!("[{i}, {}]", logits[i])).collect();
    format!("[{}]", items.join(", "))
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes_are_processed_as_llama_cpp_does() {
        assert_eq!(unescape(r#"a\nb\tc\\d\x41\q\"e"#), "a\nb\tc\\dA\\q\"e");
        assert_eq!(unescape(r"end\"), "end\\");
        assert_eq!(unescape(r"\x4"), "\\x4");
    }
}
