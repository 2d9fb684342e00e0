//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), what
//! coding agents speak when pointed at a server with `ANTHROPIC_BASE_URL`.
//!
//! A request becomes a chat completion request: `system` the first message, content blocks
//! text, `tool_use` blocks an assistant's `tool_calls`, `tool_result` blocks `tool` messages
//! (before the user's text, where Anthropic puts them), `thinking` blocks the turn's
//! `reasoning_content`; `tools` with `input_schema` function tools; `tool_choice`
//! `auto`/`any`/`tool`/`none`; `stop_sequences`, `max_tokens`, `temperature`, `top_p`,
//! `top_k`; `thinking` the template's `enable_thinking`. Images, documents, server tools and
//! redacted thinking are refused by name. The answer: a `message` with `thinking`, `text` and
//! `tool_use` blocks, `stop_reason`, and `usage` with `cache_read_input_tokens` (the prompt's
//! tokens reused from a slot's cache); streamed as Anthropic's events (`message_start`,
//! `content_block_start`/`delta`/`stop` per block, `message_delta`, `message_stop`, `ping`
//! on an idle stream, `error`). Errors are `{"type": "error", "error": {"type", "message"}}`.
//!
//! This file holds the shapes only: it reads JSON into JSON and writes events.

use super::{event, ChunkParts, Dialect};
use crate::server::error::ApiError;
use crate::server::request::kind;
use crate::server::routes::{self, App};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value as Json};

/// `POST /v1/messages`.
pub async fn messages(State(app): State<App>, req: Request) -> Response {
    let read = |body: &Json| read(body, false).map(|(chat, dialect)| (Some(chat), dialect));
    routes::chat_as(app, req, read, error_body).await
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens"}`, the prompt the request would be.
pub async fn count_tokens(State(app): State<App>, req: Request) -> Response {
    match routes::count_as(&app, req, |body| read(body, true).map(|(chat, _)| chat)).await {
        Ok(n) => axum::Json(json!({ "input_tokens": n })).into_response(),
        Err(e) => (e.status, axum::Json(error_body(&e))).into_response(),
    }
}

/// The request as a chat completion request, and the dialect that answers it. For
/// `count_tokens` (`counting`), `max_tokens` is not required.
pub fn read(body: &Json, counting: bool) -> Result<(Json, Box<dyn Dialect>), ApiError> {
    let Json::Object(b) = body else {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind(body)
        )));
    };
    for name in REFUSED_FIELDS {
        if b.get(*name).is_some_and(|v| !v.is_null()) {
            return Err(ApiError::field(
                *name,
                format!("{name} is not supported: minfer runs no server-side tools or containers"),
            ));
        }
    }
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(system) = b.get("system") {
        let text = super::text_of(system, "system", not_text)?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match b.get("messages") {
        None => return Err(ApiError::field("messages", "messages is required")),
        Some(Json::Array(items)) => {
            for (i, m) in items.iter().enumerate() {
                message(i, m, &mut messages)?;
            }
        }
        Some(other) => {
            return Err(ApiError::field(
                "messages",
                format!("messages must be an array of messages, not {}", kind(other)),
            ))
        }
    }
    chat.insert("messages".into(), Json::Array(messages));
    match b.get("max_tokens") {
        Some(v @ Json::Number(_)) => {
            chat.insert("max_tokens".into(), v.clone());
        }
        None if counting => {}
        None => return Err(ApiError::field("max_tokens", "max_tokens is required")),
        Some(other) => {
            return Err(ApiError::field(
                "max_tokens",
                format!("max_tokens must be an integer, not {}", kind(other)),
            ))
        }
    }
    let mut stops = Vec::new();
    if let Some(v) = b.get("stop_sequences") {
        let Json::Array(items) = v else {
            return Err(ApiError::field(
                "stop_sequences",
                "stop_sequences must be an array of strings",
            ));
        };
        for (i, s) in items.iter().enumerate() {
            match s.as_str() {
                Some(s) => stops.push(s.to_string()),
                None => {
                    return Err(ApiError::field(
                        format!("stop_sequences[{i}]"),
                        format!("stop_sequences[{i}] must be a string, not {}", kind(s)),
                    ))
                }
            }
        }
        chat.insert("stop".into(), json!(stops));
    }
    // The sampling fields have the chat request's names and ranges.
    for name in ["temperature", "top_p", "top_k", "stream"] {
        if let Some(v) = b.get(name) {
            chat.insert(name.into(), v.clone());
        }
    }
    if let Some(user) = b.get("metadata").and_then(|m| m.get("user_id")) {
        chat.insert("user".into(), user.clone());
    }
    super::tools_into(b, &mut chat, tool, tool_choice)?;
    if let Some(thinking) = b.get("thinking") {
        let enabled = match thinking["type"].as_str() {
            Some("enabled" | "adaptive" | "between_tools") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::field(
                    "thinking.type",
                    "thinking.type must be one of enabled, adaptive, between_tools, disabled",
                ))
            }
        };
        chat.insert("chat_template_kwargs".into(), json!({ "enable_thinking": enabled }));
        if let Some(budget) = thinking.get("budget_tokens") {
            chat.insert("thinking_budget_tokens".into(), budget.clone());
        }
    }
    if let Some(config) = b.get("output_config") {
        output_config(config, &mut chat)?;
    }
    // llama-server's own fields (`n_probs`, `grammar`, `reasoning_budget_tokens`, ...) pass
    // through to the chat request, which reads or refuses them there.
    for (name, value) in b {
        if !ANTHROPIC_FIELDS.contains(&name.as_str()) {
            chat.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    let dialect = Anthropic::default();
    Ok((Json::Object(chat), Box::new(dialect)))
}

/// Request fields whose features minfer does not have: refused rather than ignored.
const REFUSED_FIELDS: &[&str] = &["mcp_servers", "container"];

/// Anthropic's request fields: read above, or (routing, billing and caching hints that do not
/// change the answer: prompt caching is automatic here) taken and left aside.
const ANTHROPIC_FIELDS: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "tools",
    "tool_choice",
    "thinking",
    "output_config",
    "cache_control",
    "service_tier",
    "speed",
    "inference_geo",
    "diagnostics",
    "user_profile_id",
    "workspace_id",
    "mcp_servers",
    "container",
];

/// `output_config`: `format` (a JSON schema the answer follows) and `effort` (the template's
/// `reasoning_effort`; `xhigh` and `max` are its highest, `high`).
fn output_config(config: &Json, chat: &mut Map<String, Json>) -> Result<(), ApiError> {
    if let Some(format) = config.get("format").filter(|f| !f.is_null()) {
        match (format["type"].as_str(), format.get("schema")) {
            (Some("json_schema"), Some(schema @ Json::Object(_))) => {
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}),
                );
            }
            _ => {
                return Err(ApiError::field(
                    "output_config.format",
                    "output_config.format must be {\"type\": \"json_schema\", \"schema\": {...}}",
                ))
            }
        }
    }
    if let Some(effort) = config.get("effort").filter(|e| !e.is_null()) {
        let level = match effort.as_str() {
            Some(e @ ("low" | "medium" | "high")) => e,
            Some("xhigh" | "max") => "high",
            _ => {
                return Err(ApiError::field(
                    "output_config.effort",
                    "output_config.effort must be one of low, medium, high, xhigh, max",
                ))
            }
        };
        chat.insert("reasoning_effort".into(), json!(level));
    }
    Ok(())
}

fn not_text(at: &str, kind: &str) -> ApiError {
    match kind {
        "image" | "document" => ApiError::field(
            format!("{at}.type"),
            format!("{at} is an {kind} block: image input is not supported (minfer runs text-only models)"),
        ),
        _ => ApiError::field(
            format!("{at}.type"),
            format!("{at}.type '{kind}' is not supported here: only text blocks are"),
        ),
    }
}

/// One Anthropic message as chat messages (a user message with tool results is a `tool`
/// message per result, then the user's text if any).
fn message(index: usize, m: &Json, out: &mut Vec<Json>) -> Result<(), ApiError> {
    let at = format!("messages[{index}]");
    let role = match m["role"].as_str() {
        Some(r @ ("user" | "assistant")) => r,
        Some(other) => {
            return Err(ApiError::field(
                format!("{at}.role"),
                format!("{at}.role '{other}' is not one of user, assistant (the system prompt is the 'system' field)"),
            ))
        }
        None => return Err(ApiError::field(format!("{at}.role"), format!("{at}.role is required"))),
    };
    let blocks = match &m["content"] {
        Json::String(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Json::Array(blocks) => blocks,
        Json::Null => {
            return Err(ApiError::field(
                format!("{at}.content"),
                format!("{at}.content is required"),
            ))
        }
        other => {
            return Err(ApiError::field(
                format!("{at}.content"),
                format!(
                    "{at}.content must be a string or an array of content blocks, not {}",
                    kind(other)
                ),
            ))
        }
    };
    let (mut text, mut reasoning, mut calls, mut results) = (String::new(), String::new(), Vec::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let field = |name: &str| format!("{at}.{name}");
        let kind_name = block["type"].as_str().unwrap_or_default();
        match (kind_name, role) {
            ("text", _) => match block["text"].as_str() {
                Some(t) => text.push_str(t),
                None => return Err(ApiError::field(field("text"), format!("{at}.text must be a string"))),
            },
            ("thinking", "assistant") => reasoning.push_str(block["thinking"].as_str().unwrap_or_default()),
            ("tool_use", "assistant") => {
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Err(ApiError::field(at.clone(), format!("{at} needs an 'id' and a 'name'")));
                };
                let input = match &block["input"] {
                    Json::Null => json!({}),
                    v @ Json::Object(_) => v.clone(),
                    other => {
                        return Err(ApiError::field(
                            field("input"),
                            format!("{at}.input must be an object, not {}", kind(other)),
                        ))
                    }
                };
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input}}));
            }
            ("tool_result", "user") => {
                let Some(id) = block["tool_use_id"].as_str() else {
                    return Err(ApiError::field(
                        field("tool_use_id"),
                        format!("{at}.tool_use_id is required"),
                    ));
                };
                let mut content = super::text_of(&block["content"], &field("content"), not_text)?;
                if block["is_error"].as_bool() == Some(true) {
                    content = format!("Error: {content}");
                }
                results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
            }
            ("image" | "document", _) => return Err(not_text(&at, kind_name)),
            ("", _) => return Err(ApiError::field(field("type"), format!("{at}.type is required"))),
            (other, _) => {
                return Err(ApiError::field(
                    field("type"),
                    format!("{at}.type '{other}' is not supported in a {role} message"),
                ))
            }
        }
    }
    out.extend(results.iter().cloned());
    if role == "assistant" {
        let mut message = json!({"role": "assistant", "content": text});
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            message["tool_calls"] = Json::Array(calls);
        }
        out.push(message);
    } else if !text.is_empty() || results.is_empty() {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

/// An Anthropic tool (`name`, `description`, `input_schema`) as a function tool; server tools
/// (a `type` other than `custom`) are refused by name.
fn tool(index: usize, t: &Json) -> Result<Json, ApiError> {
    let at = format!("tools[{index}]");
    if let Some(kind) = t["type"].as_str().filter(|k| *k != "custom") {
        return Err(ApiError::field(
            format!("{at}.type"),
            format!("{at} is the server tool '{kind}': minfer runs no server tools (offer it as a client tool with input_schema)"),
        ));
    }
    let Some(name) = t["name"].as_str() else {
        return Err(ApiError::field(format!("{at}.name"), format!("{at}.name is required")));
    };
    let mut function =
        json!({"name": name, "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"}))});
    if let Some(d) = t.get("description") {
        function["description"] = d.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

fn tool_choice(choice: &Json) -> Result<Json, ApiError> {
    Ok(match choice["type"].as_str() {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => match choice["name"].as_str() {
            Some(name) => json!({"type": "function", "function": {"name": name}}),
            None => {
                return Err(ApiError::field(
                    "tool_choice.name",
                    "tool_choice.name is required with type 'tool'",
                ))
            }
        },
        _ => {
            return Err(ApiError::field(
                "tool_choice.type",
                "tool_choice.type must be one of auto, any, tool, none",
            ))
        }
    })
}

/// Anthropic's error type for a status.
fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// A failure in Anthropic's shape.
pub fn error_body(e: &ApiError) -> Json {
    json!({"type": "error", "error": {"type": error_type(e.status), "message": e.message}})
}

/// The block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
}

/// Writes a chat answer as an Anthropic message, whole or as its events.
#[derive(Default)]
pub struct Anthropic {
    /// The served model's name, as the chat answer carries it.
    model: String,
    /// The stop sequence that ended the reply, once one has.
    stopping_word: Option<String>,
    id: String,
    n_prompt: usize,
    started: bool,
    /// The open block and how many blocks the message has so far.
    open: Option<Block>,
    n_blocks: usize,
    stop_reason: Option<&'static str>,
    usage: (u64, u64, u64),
    failed: bool,
}

impl Anthropic {
    fn stop_reason(&self, stop_type: &str, calls: bool) -> &'static str {
        match stop_type {
            _ if calls => "tool_use",
            "word" => "stop_sequence",
            "limit" => "max_tokens",
            _ => "end_turn",
        }
    }

    fn stop_sequence(&self, reason: Option<&str>) -> Json {
        match (reason, &self.stopping_word) {
            (Some("stop_sequence"), Some(word)) => json!(word),
            _ => Json::Null,
        }
    }

    fn message_id(&mut self) -> String {
        if self.id.is_empty() {
            self.id = format!("msg_{:016x}", crate::server::random_u64());
        }
        self.id.clone()
    }

    /// Anthropic's usage: the prompt's tokens read fresh and from the cache, and the reply's.
    fn usage_json(&self) -> Json {
        let (prompt, cached, generated) = self.usage;
        json!({
            "input_tokens": prompt.saturating_sub(cached),
            "output_tokens": generated,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0,
        })
    }

    fn close(&mut self, out: &mut String) {
        if let Some(block) = self.open.take() {
            let index = self.n_blocks - 1;
            if block == Block::Thinking {
                // Anthropic's clients expect a signature before a thinking block closes; a
                // local model's reasoning has none to verify.
                out.push_str(&event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "signature_delta", "signature": ""}}),
                ));
            }
            out.push_str(&event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": index}),
            ));
        }
    }

    fn open_block(&mut self, block: Json, out: &mut String) -> usize {
        let index = self.n_blocks;
        self.n_blocks += 1;
        out.push_str(&event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        index
    }

    /// Text into the open block of `kind`, opening it first when another is open.
    fn delta(&mut self, kind: Block, text: &str, out: &mut String) {
        if self.open != Some(kind) {
            self.close(out);
            let block = match kind {
                Block::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
                Block::Text => json!({"type": "text", "text": ""}),
            };
            self.open_block(block, out);
            self.open = Some(kind);
        }
        let delta = match kind {
            Block::Thinking => json!({"type": "thinking_delta", "thinking": text}),
            Block::Text => json!({"type": "text_delta", "text": text}),
        };
        out.push_str(&event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.n_blocks - 1, "delta": delta}),
        ));
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.message_id(), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.n_prompt, "output_tokens": 0,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
        });
        out.push_str(&event(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
    }
}

impl Dialect for Anthropic {
    fn begin(&mut self, n_prompt: usize) {
        self.n_prompt = n_prompt;
    }

    fn whole(&mut self, chat: Json) -> Json {
        let choice = &chat["choices"][0];
        let message = &choice["message"];
        let mut content = Vec::new();
        if let Some(r) = message["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
        }
        let text = message["content"].as_str().unwrap_or_default();
        let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
        if !text.is_empty() || calls.is_empty() {
            content.push(json!({"type": "text", "text": text}));
        }
        for call in &calls {
            let input = call["function"]["arguments"]
                .as_str()
                .and_then(|a| serde_json::from_str::<Json>(a).ok())
                .unwrap_or(json!({}));
            content
                .push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
        }
        let reason = self.stop_reason(choice["stop_type"].as_str().unwrap_or("eos"), !calls.is_empty());
        self.model = chat["model"].as_str().unwrap_or_default().to_string();
        self.stopping_word = choice["stopping_word"]
            .as_str()
            .filter(|w| !w.is_empty())
            .map(str::to_string);
        self.usage = super::usage_counts(&chat["usage"]);
        json!({
            "id": self.message_id(),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": reason,
            "stop_sequence": self.stop_sequence(Some(reason)),
            "usage": self.usage_json(),
        })
    }

    fn frames(&mut self, chunks: Vec<Json>) -> String {
        let mut out = String::new();
        for chunk in &chunks {
            let parts = ChunkParts::of(chunk);
            if let Some(e) = parts.error {
                self.failed = true;
                out.push_str(&event("error", &error_body(&e)));
                continue;
            }
            if let Some(model) = chunk["model"].as_str() {
                self.model = model.to_string();
            }
            self.start(&mut out);
            if let Some(r) = &parts.reasoning {
                self.delta(Block::Thinking, r, &mut out);
            }
            if let Some(c) = &parts.content {
                self.delta(Block::Text, c, &mut out);
            }
            for (id, name, arguments) in &parts.calls {
                self.close(&mut out);
                let index = self.open_block(
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    &mut out,
                );
                out.push_str(&event(
                    "content_block_delta",
                    &json!({"type": "content_block_delta", "index": index,
                            "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                ));
                out.push_str(&event(
                    "content_block_stop",
                    &json!({"type": "content_block_stop", "index": index}),
                ));
            }
            if let Some((stop_type, calls)) = &parts.finish {
                self.stop_reason = Some(self.stop_reason(stop_type, *calls));
                self.stopping_word = parts.stopping_word.clone();
            }
            if let Some(usage) = parts.usage {
                self.usage = usage;
            }
        }
        out
    }

    fn end(&mut self) -> String {
        let mut out = String::new();
        if self.failed {
            return out;
        }
        self.start(&mut out);
        self.close(&mut out);
        let reason = self.stop_reason.unwrap_or("end_turn");
        out.push_str(&event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": reason, "stop_sequence": self.stop_sequence(Some(reason))},
                    "usage": self.usage_json()}),
        ));
        out.push_str(&event("message_stop", &json!({"type": "message_stop"})));
        out
    }

    fn keepalive(&self) -> String {
        "event: ping\ndata: {\"type\": \"ping\"}\n\n".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(body: Json) -> Json {
        read(&body, false).map(|(chat, _)| chat).unwrap()
    }

    fn refusal(body: Json) -> (String, String) {
        let e = read(&body, false).err().expect("refused");
        (e.param.unwrap_or_default(), e.message)
    }

    #[test]
    fn a_messages_request_becomes_the_chat_request_it_means() {
        let chat = chat_of(json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.2, "top_k": 5, "metadata": {"user_id": "u1"},
            "thinking": {"type": "disabled"},
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "tool", "name": "get_weather"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Weather in "}, {"type": "text", "text": "Paris?"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Call the tool.", "signature": "x"},
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "20 C"}]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "no", "is_error": true},
                    {"type": "text", "text": "Thanks"}]},
            ],
        }));
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "reasoning_content": "Call the tool.",
                 "tool_calls": [{"id": "t1", "type": "function",
                                 "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "20 C"},
                {"role": "tool", "tool_call_id": "t2", "content": "Error: no"},
                {"role": "user", "content": "Thanks"},
            ])
        );
        assert_eq!(chat["max_tokens"], 64);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(
            (chat["temperature"].clone(), chat["top_k"].clone()),
            (json!(0.2), json!(5))
        );
        assert_eq!(chat["user"], "u1");
        assert_eq!(chat["chat_template_kwargs"], json!({"enable_thinking": false}));
        assert_eq!(
            chat["tools"],
            json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                                      "parameters": {"type": "object"}}}])
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "get_weather"}})
        );
        // The chat reader takes what the translation makes.
        crate::server::request::chat(&chat, &Default::default()).unwrap();
    }

    #[test]
    fn what_a_text_model_cannot_take_is_refused_naming_the_block() {
        let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}});
        let (param, message) = refusal(json!({"max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}));
        assert_eq!(param, "messages[0].content[0].type");
        assert!(message.contains("image input is not supported"), "{message}");
        let (param, _) = refusal(json!({"max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [image]}]}]}));
        assert_eq!(param, "messages[0].content[0].content[0].type");
        let (param, message) = refusal(json!({"max_tokens": 8, "messages": [],
            "tools": [{"type": "web_search_20250305", "name": "web_search"}]}));
        assert_eq!(param, "tools[0].type");
        assert!(message.contains("web_search_20250305"), "{message}");
        assert_eq!(refusal(json!({"messages": []})).0, "max_tokens");
        assert_eq!(refusal(json!({"max_tokens": 8})).0, "messages");
        assert_eq!(
            refusal(json!({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]})).0,
            "messages[0].role"
        );
        assert_eq!(
            refusal(
                json!({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "redacted_thinking"}]}]})
            )
            .0,
            "messages[0].content[0].type"
        );
        assert_eq!(
            refusal(json!({"max_tokens": 8, "messages": [], "mcp_servers": [{}]})).0,
            "mcp_servers"
        );
        // count_tokens needs no max_tokens.
        assert!(read(&json!({"messages": [{"role": "user", "content": "x"}]}), true).is_ok());
    }

    #[test]
    fn errors_have_anthropics_shape_and_types() {
        let body = error_body(&ApiError::field("max_tokens", "max_tokens is required"));
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens is required"}})
        );
        assert_eq!(
            error_body(&ApiError::new(StatusCode::UNAUTHORIZED, "no"))["error"]["type"],
            "authentication_error"
        );
        assert_eq!(error_body(&ApiError::internal("x"))["error"]["type"], "api_error");
        assert_eq!(
            error_body(&ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy"))["error"]["type"],
            "overloaded_error"
        );
    }

    fn dialect() -> Anthropic {
        Anthropic {
            model: "m".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_whole_answer_is_a_message_of_thinking_text_and_tool_use_blocks() {
        let chat = json!({
            "choices": [{"index": 0, "finish_reason": "tool_calls", "stop_type": "eos", "message": {
                "role": "assistant", "content": "Checking.", "reasoning_content": "Need the tool.",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 12, "prompt_tokens_details": {"cached_tokens": 10}},
        });
        let m = dialect().whole(chat);
        assert_eq!(
            m["content"],
            json!([
                {"type": "thinking", "thinking": "Need the tool.", "signature": ""},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}},
            ])
        );
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 20, "output_tokens": 12, "cache_read_input_tokens": 10, "cache_creation_input_tokens": 0})
        );
        assert!(m["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(
            (m["type"].clone(), m["role"].clone()),
            (json!("message"), json!("assistant"))
        );
        let stopped = |stop_type: &str, word: &str| {
            let chat = json!({"choices": [{"finish_reason": "stop", "stop_type": stop_type, "stopping_word": word,
                                           "message": {"role": "assistant", "content": "x"}}], "usage": {}});
            let m = dialect().whole(chat);
            (m["stop_reason"].clone(), m["stop_sequence"].clone())
        };
        assert_eq!(stopped("word", "END"), (json!("stop_sequence"), json!("END")));
        assert_eq!(stopped("limit", ""), (json!("max_tokens"), Json::Null));
        assert_eq!(stopped("eos", ""), (json!("end_turn"), Json::Null));
    }

    fn events(text: &str) -> Vec<(String, Json)> {
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                let data: Json = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                let name = name.strip_prefix("event: ").unwrap().to_string();
                assert_eq!(data["type"], json!(name), "the event's name is its data's type");
                (name, data)
            })
            .collect()
    }

    fn chunk(delta: Json) -> Json {
        json!({"choices": [{"index": 0, "delta": delta, "finish_reason": null}]})
    }

    #[test]
    fn a_stream_opens_a_block_per_kind_of_part_and_ends_with_the_stop_reason_and_usage() {
        let mut d = dialect();
        d.begin(25);
        let mut out = d.frames(vec![chunk(json!({"role": "assistant", "content": null}))]);
        out += &d.frames(vec![
            chunk(json!({"reasoning_content": "Hmm"})),
            chunk(json!({"reasoning_content": "."})),
        ]);
        out += &d.frames(vec![chunk(json!({"content": "Hi"}))]);
        out += &d.frames(vec![chunk(
            json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
            "function": {"name": "f", "arguments": "{\"x\":1}"}}]}),
        )]);
        out += &d.frames(vec![
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls", "stop_type": "eos"}]}),
        ]);
        out += &d.frames(vec![
            json!({"choices": [], "usage": {"prompt_tokens": 25, "completion_tokens": 7,
                                                              "prompt_tokens_details": {"cached_tokens": 5}}}),
        ]);
        out += &d.end();
        let events = events(&out);
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        assert_eq!(events[0].1["message"]["usage"]["input_tokens"], 25);
        assert_eq!(events[1].1["content_block"]["type"], "thinking");
        assert_eq!(
            events[4].1["delta"],
            json!({"type": "signature_delta", "signature": ""})
        );
        assert_eq!(events[6].1["index"], 1);
        assert_eq!(events[7].1["delta"], json!({"type": "text_delta", "text": "Hi"}));
        assert_eq!(
            events[9].1["content_block"],
            json!({"type": "tool_use", "id": "c1", "name": "f", "input": {}})
        );
        assert_eq!(
            events[10].1["delta"],
            json!({"type": "input_json_delta", "partial_json": "{\"x\":1}"})
        );
        assert_eq!(events[12].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(events[12].1["usage"]["output_tokens"], 7);
        assert_eq!(events[12].1["usage"]["cache_read_input_tokens"], 5);
    }

    #[test]
    fn a_failure_mid_stream_is_an_error_event_and_ends_it() {
        let mut d = dialect();
        let mut out = d.frames(vec![chunk(json!({"content": "Hi"}))]);
        out += &d.frames(vec![ApiError::internal("generation failed: boom").body()]);
        out += &d.end();
        let events = events(&out);
        let (name, data) = events.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(
            data["error"],
            json!({"type": "api_error", "message": "generation failed: boom"})
        );
    }
}
