//! The APIs beside OpenAI's chat completions: Anthropic's Messages (`anthropic`), OpenAI's
//! Responses (`responses`) and Ollama's (`ollama`), each a translation over the one chat
//! pipeline. A request in the API's shape becomes a chat completion request (then read by
//! `request::chat` like any other), and the chat pipeline's answer (the collected
//! `chat.completion`, or its stream of chunks) becomes the API's answer through a
//! [`Dialect`]. So reasoning, tool calls, grammars, sampling and the slots are the chat
//! pipeline's, once, and each file here holds only its API's shapes.
//!
//! Nothing here generates, tokenizes or renders; a dialect sees JSON and writes text.

pub mod anthropic;
pub mod ollama;
pub mod responses;

use super::error::ApiError;
use serde_json::Value as Json;

/// How one API answers, written from the chat pipeline's answer.
pub trait Dialect: Send + 'static {
    /// Before the first frame: the prompt's length in tokens (Anthropic's `message_start`
    /// carries it).
    fn begin(&mut self, _n_prompt: usize) {}
    /// Whether this is another API than chat completions: the chat answer then always carries
    /// its usage and each choice its `stop_type` (see `response::Reply::for_dialect`).
    fn translated(&self) -> bool {
        true
    }
    /// The whole answer, from the `chat.completion` body.
    fn whole(&mut self, chat: Json) -> Json;
    /// The stream text for some chat chunks; a chunk holding an `error` is the failure that
    /// ends the stream.
    fn frames(&mut self, chunks: Vec<Json>) -> String;
    /// The stream text after the last chunk.
    fn end(&mut self) -> String;
    /// What an idle stream sends to keep clients and proxies from timing it out: something
    /// the API's clients read past.
    fn keepalive(&self) -> String;
    /// The stream's media type.
    fn content_type(&self) -> &'static str {
        "text/event-stream"
    }
}

/// OpenAI's chat completions and completions and llama-server's own endpoints: the pipeline's
/// answer as it is, SSE `data:` frames ending in `[DONE]` (not after a failure, and not on
/// llama-server's own stream, which ends with its final object).
pub struct OpenAi {
    /// llama-server's `/completion` or `/infill`.
    native: bool,
    failed: bool,
}

impl OpenAi {
    pub fn boxed(native: bool) -> Box<dyn Dialect> {
        Box::new(OpenAi { native, failed: false })
    }
}

impl Dialect for OpenAi {
    fn translated(&self) -> bool {
        false
    }

    fn whole(&mut self, chat: Json) -> Json {
        chat
    }

    fn frames(&mut self, chunks: Vec<Json>) -> String {
        self.failed |= chunks.iter().any(|c| c.get("error").is_some());
        chunks.iter().map(super::response::frame).collect()
    }

    fn end(&mut self) -> String {
        if self.failed || self.native {
            String::new()
        } else {
            "data: [DONE]\n\n".into()
        }
    }

    fn keepalive(&self) -> String {
        // An SSE comment, as llama-server sends.
        ":\n\n".into()
    }
}

/// A failure answered before any handler, in the shape of the API the path belongs to.
pub fn error_body_for(path: &str, e: &ApiError) -> Json {
    if path.starts_with("/v1/messages") {
        anthropic::error_body(e)
    } else if path.starts_with("/api/") {
        ollama::error_body(e)
    } else {
        e.body()
    }
}

/// An SSE event with its name, as Anthropic's and OpenAI's Responses streams send them.
pub fn event(name: &str, data: &Json) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// What one chat chunk says, read apart for the dialects.
#[derive(Debug, Default)]
pub struct ChunkParts {
    pub reasoning: Option<String>,
    pub content: Option<String>,
    /// Whole tool calls: `(id, name, arguments as JSON text)`.
    pub calls: Vec<(String, String, String)>,
    /// The choice ended: llama-server's `stop_type` (`eos`, `word`, `limit`, `none`) and
    /// whether it ended with tool calls.
    pub finish: Option<(String, bool)>,
    /// The stop string that ended it (`stopping_word`), when one did.
    pub stopping_word: Option<String>,
    /// The usage chunk's counts: prompt, cached, generated.
    pub usage: Option<(u64, u64, u64)>,
    /// llama-server's `timings` and `prompt_progress`, when the chunk carries them.
    pub timings: Option<Json>,
    pub progress: Option<Json>,
    /// The error body of a failure.
    pub error: Option<ApiError>,
}

impl ChunkParts {
    pub fn of(chunk: &Json) -> ChunkParts {
        let mut parts = ChunkParts {
            timings: chunk.get("timings").cloned(),
            progress: chunk.get("prompt_progress").cloned(),
            ..Default::default()
        };
        if let Some(error) = chunk.get("error") {
            let status = error["code"]
                .as_u64()
                .and_then(|c| axum::http::StatusCode::from_u16(c as u16).ok())
                .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
            parts.error = Some(ApiError::new(status, error["message"].as_str().unwrap_or("")));
            return parts;
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            parts.usage = Some(usage_counts(usage));
        }
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        let text = |v: &Json| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
        parts.reasoning = text(&delta["reasoning_content"]);
        // A completion's chunk has its text beside the delta.
        parts.content = text(&delta["content"]).or_else(|| text(&choice["text"]));
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            parts.calls.push((
                call["id"].as_str().unwrap_or_default().to_string(),
                call["function"]["name"].as_str().unwrap_or_default().to_string(),
                call["function"]["arguments"].as_str().unwrap_or("{}").to_string(),
            ));
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            let stop_type = choice["stop_type"].as_str().unwrap_or("eos").to_string();
            parts.finish = Some((stop_type, reason == "tool_calls"));
            parts.stopping_word = choice["stopping_word"]
                .as_str()
                .filter(|w| !w.is_empty())
                .map(str::to_string);
        }
        parts
    }
}

/// The request's `tools`, each read by the API's `tool`, and its `tool_choice`, read by
/// `choice`, into the chat request.
pub fn tools_into(
    body: &serde_json::Map<String, Json>,
    chat: &mut serde_json::Map<String, Json>,
    tool: fn(usize, &Json) -> Result<Json, ApiError>,
    choice: fn(&Json) -> Result<Json, ApiError>,
) -> Result<(), ApiError> {
    if let Some(tools) = body.get("tools") {
        let Json::Array(items) = tools else {
            return Err(ApiError::field("tools", "tools must be an array of tools"));
        };
        let tools = items
            .iter()
            .enumerate()
            .map(|(i, t)| tool(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        chat.insert("tools".into(), Json::Array(tools));
    }
    if let Some(value) = body.get("tool_choice") {
        chat.insert("tool_choice".into(), choice(value)?);
    }
    Ok(())
}

/// Prompt, cached and generated tokens of an OpenAI `usage` object.
pub fn usage_counts(usage: &Json) -> (u64, u64, u64) {
    (
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0),
        usage["completion_tokens"].as_u64().unwrap_or(0),
    )
}

/// The text of a content given as a string or as text blocks (`{"type": "text", "text"}`),
/// joined without a separator, as the APIs concatenate them; `what` names the place for the
/// error on any other block, which `refuse` words.
pub fn text_of(value: &Json, place: &str, other_block: impl Fn(&str, &str) -> ApiError) -> Result<String, ApiError> {
    match value {
        Json::String(s) => Ok(s.clone()),
        Json::Null => Ok(String::new()),
        Json::Array(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("{place}[{i}]");
                match block["type"].as_str() {
                    Some("text" | "input_text" | "output_text") => match block["text"].as_str() {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(ApiError::field(
                                format!("{at}.text"),
                                format!("{at}.text must be a string"),
                            ))
                        }
                    },
                    Some(kind) => return Err(other_block(&at, kind)),
                    None => return Err(ApiError::field(format!("{at}.type"), format!("{at}.type is required"))),
                }
            }
            Ok(text)
        }
        other => Err(ApiError::field(
            place,
            format!(
                "{place} must be a string or an array of text blocks, not {}",
                super::request::kind(other)
            ),
        )),
    }
}
