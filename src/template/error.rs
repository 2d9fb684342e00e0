//! The chat-template subsystem's error type. Template failures carry minijinja's own message
//! (which names the template and line); input failures name the message index and field, so an
//! API layer can hand them back to the client as they are.

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template source is not valid Jinja (as minijinja reads it).
    #[error("chat template does not compile: {message}")]
    Compile { message: String },
    /// The template compiled but cannot render even a plain conversation, so it is refused at load
    /// instead of failing on every request.
    #[error("chat template cannot render a plain conversation, refusing it: {message}")]
    Probe { message: String },
    /// Rendering this conversation failed, including a template's own `raise_exception`.
    #[error("chat template failed to render: {message}")]
    Render { message: String },
    /// A message cannot be handed to a template. `field` is empty when the message itself is at
    /// fault (e.g. not a JSON object).
    #[error("invalid message {index}{}: {reason}", field_suffix(.field))]
    InvalidMessage {
        index: usize,
        field: String,
        reason: String,
    },
    /// A tool definition or an extra template variable cannot be handed to a template; `name`
    /// says which (`tools[2]`, `enable_thinking`).
    #[error("invalid template input '{name}': {reason}")]
    InvalidInput { name: String, reason: String },
    /// The file's metadata holds a template-related key of the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// A special-token id names no token of the file's vocabulary.
    #[error("metadata key '{key}' is token id {id}, but the vocabulary has {n_vocab} tokens")]
    TokenOutOfRange { key: &'static str, id: u64, n_vocab: usize },
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
