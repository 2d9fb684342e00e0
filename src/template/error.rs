//! The chat-template subsystem's error type. Template failures carry minijinja's own message
//! (which names the template and line); input failures name the message index and field, so an
//! API layer can hand them back to the client as they are.

use crate::gguf::GgufError;

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja (as minijinja reads it).
    #[error("chat template does not compile: {message}")]
    Compile {
        /// minijinja's message, naming the template and line.
        message: String,
    },
    /// The template compiled but cannot render even a plain conversation, so it is refused at load
    /// instead of failing on every request.
    #[error("chat template cannot render a plain conversation, refusing it: {message}")]
    Probe {
        /// Why the last probe conversation failed (or that it rendered as empty).
        message: String,
    },
    /// Rendering this conversation failed, including a template's own `raise_exception`.
    #[error("chat template failed to render: {message}")]
    Render {
        /// minijinja's message with the causes it wraps (a `raise_exception` text included).
        message: String,
    },
    /// The render ran past its budget (minijinja's fuel: one per instruction, one per 64 bytes of
    /// data built): a template that loops without end or builds without bound, refused at load
    /// or for the conversation that triggers it.
    #[error(
        "chat template ran out of fuel: it used more than its budget of {fuel} (one per instruction and per 64 bytes it builds)"
    )]
    OutOfFuel {
        /// The budget of this render.
        fuel: u64,
    },
    /// The render produced more than the output limit.
    #[error("chat template output exceeds {limit} bytes (the per-render output limit)")]
    TooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A message cannot be handed to a template. `field` is empty when the message itself is at
    /// fault (e.g. not a JSON object).
    #[error("invalid message {index}{}: {reason}", field_suffix(.field))]
    InvalidMessage {
        /// Position of the message in the conversation, from 0.
        index: usize,
        /// The offending field (`role`, `content`, ...), or empty.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tool definition or an extra template variable cannot be handed to a template; `name`
    /// says which (`tools[2]`, `enable_thinking`).
    #[error("invalid template input '{name}': {reason}")]
    InvalidInput {
        /// Which input: `tools[N]` or the variable's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The file's metadata holds a template-related key of the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// A special-token id names no token of the file's vocabulary.
    #[error("metadata key '{key}' is token id {id}, but the vocabulary has {n_vocab} tokens")]
    TokenOutOfRange {
        /// The metadata key holding the id (`tokenizer.ggml.bos_token_id`, ...).
        key: &'static str,
        /// The id found.
        id: u64,
        /// The vocabulary size: the length of `tokenizer.ggml.tokens`.
        n_vocab: usize,
    },
}

fn field_suffix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(", field '{field}'")
    }
}

/// minijinja's message, with the errors it wraps: a failure inside a macro or a function reports
/// its cause as the error's source, and the cause is what the user needs to read.
pub(super) fn describe(err: &minijinja::Error) -> String {
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}
