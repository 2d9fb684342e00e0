//! The main job: load a model into a session (backends, tokenizer, chat template), turn a
//! prompt into tokens, and generate. Also `eval`, the numerics probe. The binary maps flags to
//! these options and errors to exit codes; nothing here prints except through the writers it
//! is given.

use crate::engine::{generate, EngineError, GenerateOptions, GenerationResult, Session};
use crate::gguf::{GgufError, GgufFile};
use crate::graph::registry::{fence_from, RegistryError};
use crate::models::{load_model, GgufWeights, ModelError};
use crate::template::{ChatTemplate, TemplateError};
use crate::tokenizer::{Tokenizer, TokenizerError};
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read model {path}: {source}")]
    Open { path: String, source: GgufError },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Backend(#[from] RegistryError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("the prompt has {n_prompt} tokens, more than the context of {n_ctx} (use --n-ctx, at most {n_ctx_train})")]
    PromptTooLong {
        n_prompt: usize,
        n_ctx: usize,
        n_ctx_train: usize,
    },
    #[error("cannot write {what}: {source}")]
    Write { what: String, source: std::io::Error },
}

/// A model ready to run.
pub struct Loaded {
    pub file: Arc<GgufFile>,
    pub tokenizer: Tokenizer,
    pub template: ChatTemplate,
    pub session: Session,
}

/// Where and how to run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Requested context; clamped to the model's training context.
    pub n_ctx: usize,
    pub n_threads: usize,
    /// `--backend` (else `MINFER_BACKENDS`, else every usable backend).
    pub backend: Option<String>,
}

pub fn load(path: &Path, options: &LoadOptions) -> Result<Loaded, RunError> {
    // A bad --backend is reported before the model is read.
    fence_from(options.backend.as_deref())?;
    let (file, tokenizer, template) = open(path)?;
    let session = new_session(&file, options)?;
    Ok(Loaded {
        file,
        tokenizer,
        template,
        session,
    })
}

/// The model file with its tokenizer and chat template, without a session: what sessions over
/// the same weights share.
pub fn open(path: &Path) -> Result<(Arc<GgufFile>, Tokenizer, ChatTemplate), RunError> {
    let file = Arc::new(GgufFile::open(path).map_err(|source| RunError::Open {
        path: path.display().to_string(),
        source,
    })?);
    let tokenizer = Tokenizer::from_metadata(file.metadata())?;
    let template = ChatTemplate::from_metadata(file.metadata())?;
    Ok((file, tokenizer, template))
}

/// A new session (its own graph cache and KV) over `file`'s weights, which stay mapped once
/// however many sessions read them.
pub fn new_session(file: &Arc<GgufFile>, options: &LoadOptions) -> Result<Session, RunError> {
    let fence = fence_from(options.backend.as_deref())?;
    let model = load_model(file)?;
    let n_ctx = options.n_ctx.clamp(1, model.hparams().n_ctx_train.max(1));
    let backends = crate::backends::create(&fence, Arc::new(GgufWeights(Arc::clone(file))), options.n_threads);
    Ok(Session::new(model, backends, n_ctx))
}

/// The tokens of a rendered prompt: special-token text is parsed, and a BOS is added only if
/// the model asks for one.
pub fn encode_prompt(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode(text, true, true)
}

/// The prompt's tokens: as one user turn through the chat template, or raw (`no_template`).
/// Special-token text is parsed either way, and a BOS is added only if the model asks for one.
pub fn prompt_tokens(loaded: &Loaded, prompt: &str, no_template: bool) -> Result<Vec<u32>, RunError> {
    let text = if no_template {
        prompt.to_string()
    } else {
        let messages = [serde_json::json!({"role": "user", "content": prompt})];
        loaded.template.render(&messages, None, true, &serde_json::Map::new())?
    };
    let tokens = encode_prompt(&loaded.tokenizer, &text);
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
    let mut options = options.clone();
    // Generation ends when the context is full, like the token limit.
    options.max_tokens = options
        .max_tokens
        .min(loaded.session.n_ctx().saturating_sub(tokens.len()));
    let result = generate(&mut loaded.session, &loaded.tokenizer, tokens, &options, |bytes| {
        out.write_all(bytes)
            .and_then(|_| out.flush())
            .map_err(|e| e.to_string())
    })?;
    Ok(result)
}

/// `eval`: the logits at the last position of a raw text (specials parsed, no template).
pub fn eval_last_logits(loaded: &mut Loaded, text: &str) -> Result<Vec<f32>, RunError> {
    let tokens = loaded.tokenizer.encode(text, true, true);
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
