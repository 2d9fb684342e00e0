//! OpenAI's Responses API (`POST /v1/responses`, and `/responses` as llama-server routes it),
//! what newer OpenAI clients and agents speak.
//!
//! A request becomes a chat completion request: `instructions` the system message, `input`
//! text one user message, or items (messages with `input_text`/`output_text` parts,
//! `function_call` items an assistant's `tool_calls`, `function_call_output` items `tool`
//! messages, `reasoning` items the next assistant turn's `reasoning_content`); function
//! `tools`, `tool_choice`, `text.format` (`json_schema`, `json_object`), `reasoning.effort`,
//! `max_output_tokens`, `temperature`, `top_p`. Hosted tools, images, files,
//! `previous_response_id` and `conversation` (minfer keeps no responses) and `background` are
//! refused by name. The answer: a `response` whose `output` holds a `reasoning` item, a
//! `message` with its `output_text`, and `function_call` items; `status` `incomplete` with
//! `incomplete_details` when `max_output_tokens` ended it, as OpenAI says it; streamed as the
//! typed events (`response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`, `response.reasoning_text.delta`,
//! `response.function_call_arguments.delta`, their `.done`, then `response.completed` or
//! `response.incomplete`), each with its `sequence_number`. llama-server's telemetry rides along
//! as it sends it: `prompt_progress` on `response.in_progress`, `timings` on the events of a
//! chunk that had them and on the last.
//!
//! This file holds the shapes only: it reads JSON into JSON and writes events.

use super::{event, ChunkParts, Dialect};
use crate::server::error::ApiError;
use crate::server::request::kind;
use crate::server::routes::{self, App};
use axum::extract::{Request, State};
use axum::response::Response;
use serde_json::{json, Map, Value as Json};

/// `POST /v1/responses`.
pub async fn create(State(app): State<App>, req: Request) -> Response {
    let read = |body: &Json| read(body).map(|(chat, dialect)| (Some(chat), dialect));
    routes::chat_as(app, req, read, ApiError::body).await
}

/// Fields whose features minfer does not have, refused by name unless off, with the reason.
const REFUSED: &[(&str, &str)] = &[
    (
        "previous_response_id",
        "minfer keeps no responses: send the conversation as input items",
    ),
    (
        "conversation",
        "minfer keeps no conversations: send the conversation as input items",
    ),
    ("background", "minfer answers in the request, not in the background"),
    ("prompt", "minfer keeps no prompt templates"),
];

/// The Responses API's own fields: read here, or left aside where they do not change the
/// answer (`store`, `metadata`, `include`, `truncation: disabled`, ...).
const RESPONSES_FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "text",
    "reasoning",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "user",
    "safety_identifier",
    "metadata",
    "store",
    "include",
    "parallel_tool_calls",
    "truncation",
    "service_tier",
    "prompt_cache_key",
    "stream_options",
    "previous_response_id",
    "conversation",
    "background",
    "prompt",
    "top_logprobs",
    "max_tool_calls",
];

/// The request as a chat completion request, and the dialect that answers it.
pub fn read(body: &Json) -> Result<(Json, Box<dyn Dialect>), ApiError> {
    let Json::Object(b) = body else {
        return Err(ApiError::bad_request(format!(
            "the request body must be a JSON object, not {}",
            kind(body)
        )));
    };
    for (name, why) in REFUSED {
        if b.get(*name).is_some_and(|v| !v.is_null() && *v != json!(false)) {
            return Err(ApiError::field(*name, format!("{name} is not supported: {why}")));
        }
    }
    if b.get("truncation")
        .and_then(Json::as_str)
        .is_some_and(|t| t != "disabled")
    {
        return Err(ApiError::field(
            "truncation",
            "truncation 'auto' is not supported: a prompt longer than the context is refused, never cut",
        ));
    }
    let mut chat = Map::new();
    let mut messages = Vec::new();
    if let Some(instructions) = b.get("instructions").filter(|i| !i.is_null()) {
        let text = super::text_of(instructions, "instructions", not_text)?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match b.get("input") {
        Some(Json::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Json::Array(items)) => input_items(items, &mut messages)?,
        None => return Err(ApiError::field("input", "input is required")),
        Some(other) => {
            return Err(ApiError::field(
                "input",
                format!("input must be a string or an array of items, not {}", kind(other)),
            ))
        }
    }
    chat.insert("messages".into(), Json::Array(messages));
    if let Some(n) = b.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_tokens".into(), n.clone());
    }
    for name in ["temperature", "top_p", "stream", "parallel_tool_calls"] {
        if let Some(v) = b.get(name) {
            chat.insert(name.into(), v.clone());
        }
    }
    if let Some(user) = b.get("safety_identifier").or_else(|| b.get("user")) {
        chat.insert("user".into(), user.clone());
    }
    super::tools_into(b, &mut chat, tool, tool_choice)?;
    if let Some(format) = b.get("text").and_then(|t| t.get("format")).filter(|f| !f.is_null()) {
        if let Some(format) = text_format(format)? {
            chat.insert("response_format".into(), format);
        }
    }
    if let Some(effort) = b
        .get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        match effort.as_str() {
            Some(e @ ("low" | "medium" | "high")) => {
                chat.insert("reasoning_effort".into(), json!(e));
            }
            Some("minimal") => {
                chat.insert("reasoning_effort".into(), json!("low"));
            }
            Some("none") => {
                chat.insert("chat_template_kwargs".into(), json!({"enable_thinking": false}));
            }
            _ => {
                return Err(ApiError::field(
                    "reasoning.effort",
                    "reasoning.effort must be one of none, minimal, low, medium, high",
                ))
            }
        }
    }
    // llama-server's own fields (`timings_per_token`, `return_progress`, `top_k`, ...) pass
    // through to the chat request, which reads or refuses them there.
    for (name, value) in b {
        if !RESPONSES_FIELDS.contains(&name.as_str()) {
            chat.entry(name.clone()).or_insert_with(|| value.clone());
        }
    }
    let dialect = Responses {
        id: format!("resp_{:016x}", crate::server::random_u64()),
        echo: echo_fields(b),
        ..Default::default()
    };
    Ok((Json::Object(chat), Box::new(dialect)))
}

fn not_text(at: &str, kind: &str) -> ApiError {
    let what = match kind {
        "input_image" => "image input is not supported (minfer runs text-only models)",
        "input_file" => "file input is not supported: send the file's text as input_text",
        "input_audio" => "audio input is not supported",
        _ => "only input_text and output_text parts are",
    };
    ApiError::field(format!("{at}.type"), format!("{at}.type '{kind}': {what}"))
}

/// The input items as chat messages: consecutive `function_call` items are one assistant turn
/// with several calls, and a `reasoning` item is the reasoning of the assistant turn after it.
fn input_items(items: &[Json], out: &mut Vec<Json>) -> Result<(), ApiError> {
    let mut reasoning = String::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind_name = item["type"]
            .as_str()
            .unwrap_or(if item.get("role").is_some() { "message" } else { "" });
        match kind_name {
            "message" => {
                let role = match item["role"].as_str() {
                    Some(r @ ("user" | "assistant" | "system")) => r,
                    Some("developer") => "system",
                    Some(other) => {
                        return Err(ApiError::field(
                            format!("{at}.role"),
                            format!("{at}.role '{other}' is not one of user, assistant, system, developer"),
                        ))
                    }
                    None => return Err(ApiError::field(format!("{at}.role"), format!("{at}.role is required"))),
                };
                let text = super::text_of(&item["content"], &format!("{at}.content"), not_text)?;
                let mut message = json!({"role": role, "content": text});
                if role == "assistant" && !reasoning.is_empty() {
                    message["reasoning_content"] = json!(std::mem::take(&mut reasoning));
                }
                out.push(message);
            }
            "function_call" => {
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str()) else {
                    return Err(ApiError::field(at.clone(), format!("{at} needs a 'call_id' and a 'name'")));
                };
                let arguments = item["arguments"].as_str().unwrap_or("{}");
                let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                // Calls after an assistant turn's text, or after other calls, join that turn.
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" && reasoning.is_empty() => {
                        match last["tool_calls"].as_array_mut() {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => {
                        let mut message = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                        if !reasoning.is_empty() {
                            message["reasoning_content"] = json!(std::mem::take(&mut reasoning));
                        }
                        out.push(message);
                    }
                }
            }
            "function_call_output" => {
                let Some(call_id) = item["call_id"].as_str() else {
                    return Err(ApiError::field(format!("{at}.call_id"), format!("{at}.call_id is required")));
                };
                let output = super::text_of(&item["output"], &format!("{at}.output"), not_text)?;
                out.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
            }
            "reasoning" => {
                for part in item["content"].as_array().into_iter().flatten() {
                    reasoning.push_str(part["text"].as_str().unwrap_or_default());
                }
                if item["content"].as_array().is_none_or(|c| c.is_empty()) {
                    for part in item["summary"].as_array().into_iter().flatten() {
                        reasoning.push_str(part["text"].as_str().unwrap_or_default());
                    }
                }
            }
            "" => return Err(ApiError::field(format!("{at}.type"), format!("{at}.type is required"))),
            other => {
                return Err(ApiError::field(
                    format!("{at}.type"),
                    format!("{at}.type '{other}' is not supported: minfer takes message, function_call, function_call_output and reasoning items"),
                ))
            }
        }
    }
    Ok(())
}

/// A function tool as a chat tool; hosted tools are refused by name.
fn tool(index: usize, t: &Json) -> Result<Json, ApiError> {
    let at = format!("tools[{index}]");
    match t["type"].as_str() {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::field(
                format!("{at}.type"),
                format!("{at} is the hosted tool '{other}': minfer runs only function tools"),
            ))
        }
        None => return Err(ApiError::field(format!("{at}.type"), format!("{at}.type is required"))),
    }
    let Some(name) = t["name"].as_str() else {
        return Err(ApiError::field(format!("{at}.name"), format!("{at}.name is required")));
    };
    let mut function = json!({"name": name, "parameters": t.get("parameters").filter(|p| !p.is_null()).cloned().unwrap_or(json!({"type": "object"}))});
    if let Some(d) = t.get("description").filter(|d| !d.is_null()) {
        function["description"] = d.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

fn tool_choice(choice: &Json) -> Result<Json, ApiError> {
    match choice {
        Json::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => Ok(choice.clone()),
        Json::Object(_) if choice["type"] == "function" => match choice["name"].as_str() {
            Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
            None => Err(ApiError::field("tool_choice.name", "tool_choice.name is required")),
        },
        _ => Err(ApiError::field(
            "tool_choice",
            "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\"}",
        )),
    }
}

/// `text.format` as a chat `response_format` (`None`: plain text).
fn text_format(format: &Json) -> Result<Option<Json>, ApiError> {
    match format["type"].as_str() {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let Some(schema @ Json::Object(_)) = format.get("schema") else {
                return Err(ApiError::field(
                    "text.format.schema",
                    "text.format.schema must be a JSON schema object",
                ));
            };
            let name = format["name"].as_str().unwrap_or("output");
            Ok(Some(
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}}),
            ))
        }
        _ => Err(ApiError::field(
            "text.format.type",
            "text.format.type must be one of text, json_object, json_schema",
        )),
    }
}

/// The request's settings a response repeats, as OpenAI's does.
fn echo_fields(b: &Map<String, Json>) -> Map<String, Json> {
    let mut echo = Map::new();
    let get = |name: &str, default: Json| b.get(name).filter(|v| !v.is_null()).cloned().unwrap_or(default);
    echo.insert("instructions".into(), get("instructions", Json::Null));
    echo.insert("max_output_tokens".into(), get("max_output_tokens", Json::Null));
    echo.insert("temperature".into(), get("temperature", json!(0.8)));
    echo.insert("top_p".into(), get("top_p", json!(0.95)));
    echo.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    echo.insert("tools".into(), get("tools", json!([])));
    echo.insert("parallel_tool_calls".into(), get("parallel_tool_calls", json!(true)));
    echo.insert("text".into(), get("text", json!({"format": {"type": "text"}})));
    echo.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    echo.insert("metadata".into(), get("metadata", json!({})));
    echo.insert("store".into(), json!(false));
    echo.insert("truncation".into(), json!("disabled"));
    echo.insert("previous_response_id".into(), Json::Null);
    echo.insert("user".into(), get("user", Json::Null));
    echo
}

/// The output item a stream has open.
#[derive(Debug, Clone, PartialEq)]
enum Open {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
}

/// Writes a chat answer as a `response`, whole or as its events.
#[derive(Default)]
pub struct Responses {
    id: String,
    echo: Map<String, Json>,
    model: String,
    created_at: u64,
    /// Streaming: the events sent so far (their `sequence_number`), the output items done,
    /// the open one, and how the answer ended.
    sequence: u64,
    started: bool,
    output: Vec<Json>,
    open: Option<Open>,
    stop_type: Option<String>,
    usage: (u64, u64, u64),
    /// llama-server's timings: the latest, and the ones of the chunk being written.
    timings: Option<Json>,
    chunk_timings: Option<Json>,
    failed: bool,
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{:016x}", crate::server::random_u64())
}

fn reasoning_item(id: &str, text: &str) -> Json {
    json!({"type": "reasoning", "id": id, "summary": [], "status": "completed",
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn output_text(text: &str) -> Json {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str) -> Json {
    json!({"type": "message", "id": id, "status": "completed", "role": "assistant", "content": [output_text(text)]})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str) -> Json {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": arguments,
           "status": "completed"})
}

impl Responses {
    /// The response object: `status` `completed`, `incomplete` (the token limit or the context
    /// ended it) or `in_progress`.
    fn response(&self, output: Vec<Json>, done: bool) -> Json {
        let limit = self.stop_type.as_deref() == Some("limit");
        let status = match (done, limit) {
            (false, _) => "in_progress",
            (true, true) => "incomplete",
            (true, false) => "completed",
        };
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "model": self.model, "output": output, "error": null,
            "incomplete_details": if done && limit { json!({"reason": "max_output_tokens"}) } else { Json::Null },
        });
        if done {
            let (prompt, cached, generated) = self.usage;
            r["completed_at"] = json!(crate::server::unix_time());
            r["usage"] = json!({
                "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": generated, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + generated,
            });
        }
        if let Json::Object(map) = &mut r {
            map.extend(self.echo.clone());
        }
        r
    }

    fn emit(&mut self, name: &str, mut data: Json, out: &mut String) {
        data["type"] = json!(name);
        data["sequence_number"] = json!(self.sequence);
        if let Some(t) = &self.chunk_timings {
            data["timings"] = t.clone();
        }
        self.sequence += 1;
        out.push_str(&event(name, &data));
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        self.created_at = crate::server::unix_time();
        let response = self.response(Vec::new(), false);
        self.emit("response.created", json!({"response": response}), out);
        let response = self.response(Vec::new(), false);
        self.emit("response.in_progress", json!({"response": response}), out);
    }

    fn close(&mut self, out: &mut String) {
        let index = self.output.len();
        match self.open.take() {
            None => {}
            Some(Open::Reasoning { id, text }) => {
                self.emit(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                    out,
                );
                let item = reasoning_item(&id, &text);
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.output.push(item);
            }
            Some(Open::Message { id, text }) => {
                let base = json!({"item_id": id, "output_index": index, "content_index": 0});
                let mut done = base.clone();
                done["text"] = json!(text);
                done["logprobs"] = json!([]);
                self.emit("response.output_text.done", done, out);
                let mut part = base;
                part["part"] = output_text(&text);
                self.emit("response.content_part.done", part, out);
                let item = message_item(&id, &text);
                self.emit(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item}),
                    out,
                );
                self.output.push(item);
            }
        }
    }

    fn reasoning(&mut self, delta: &str, out: &mut String) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out);
            let id = item_id("rs");
            let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
            self.emit(
                "response.output_item.added",
                json!({"output_index": self.output.len(), "item": item}),
                out,
            );
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let Some(Open::Reasoning { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let data = json!({"item_id": id, "output_index": self.output.len(), "content_index": 0, "delta": delta});
        self.emit("response.reasoning_text.delta", data, out);
    }

    fn text(&mut self, delta: &str, out: &mut String) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(out);
            let id = item_id("msg");
            let index = self.output.len();
            let item =
                json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
            self.emit(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
                out,
            );
            let part = json!({"type": "output_text", "text": "", "annotations": [], "logprobs": []});
            self.emit(
                "response.content_part.added",
                json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
                out,
            );
            self.open = Some(Open::Message {
                id,
                text: String::new(),
            });
        }
        let Some(Open::Message { id, text }) = &mut self.open else {
            return;
        };
        text.push_str(delta);
        let data = json!({"item_id": id, "output_index": self.output.len(), "content_index": 0, "delta": delta,
                          "logprobs": []});
        self.emit("response.output_text.delta", data, out);
    }

    fn call(&mut self, call_id: &str, name: &str, arguments: &str, out: &mut String) {
        self.close(out);
        let id = item_id("fc");
        let index = self.output.len();
        let mut item = call_item(&id, call_id, name, "");
        item["status"] = json!("in_progress");
        self.emit(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.emit(
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": arguments}),
            out,
        );
        self.emit(
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": name, "arguments": arguments}),
            out,
        );
        let item = call_item(&id, call_id, name, arguments);
        self.emit(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
            out,
        );
        self.output.push(item);
    }
}

impl Dialect for Responses {
    fn whole(&mut self, chat: Json) -> Json {
        let choice = &chat["choices"][0];
        let message = &choice["message"];
        self.model = chat["model"].as_str().unwrap_or_default().to_string();
        self.created_at = chat["created"].as_u64().unwrap_or_else(crate::server::unix_time);
        self.stop_type = choice["stop_type"].as_str().map(str::to_string);
        self.usage = super::usage_counts(&chat["usage"]);
        let mut output = Vec::new();
        if let Some(r) = message["reasoning_content"].as_str().filter(|r| !r.is_empty()) {
            output.push(reasoning_item(&item_id("rs"), r));
        }
        let calls = message["tool_calls"].as_array().cloned().unwrap_or_default();
        let text = message["content"].as_str().unwrap_or_default();
        if !text.is_empty() || calls.is_empty() {
            output.push(message_item(&item_id("msg"), text));
        }
        for call in &calls {
            let f = &call["function"];
            output.push(call_item(
                &item_id("fc"),
                call["id"].as_str().unwrap_or_default(),
                f["name"].as_str().unwrap_or_default(),
                f["arguments"].as_str().unwrap_or("{}"),
            ));
        }
        let mut response = self.response(output, true);
        if let Some(timings) = chat.get("timings") {
            // llama-server's figures, beside OpenAI's fields.
            response["timings"] = timings.clone();
        }
        response
    }

    fn frames(&mut self, chunks: Vec<Json>) -> String {
        let mut out = String::new();
        for chunk in &chunks {
            let parts = ChunkParts::of(chunk);
            if let Some(e) = parts.error {
                self.failed = true;
                let error = e.body()["error"].clone();
                self.emit(
                    "error",
                    json!({"code": error["type"], "message": error["message"], "param": error["param"]}),
                    &mut out,
                );
                continue;
            }
            if let Some(model) = chunk["model"].as_str() {
                self.model = model.to_string();
            }
            // The chunk's timings ride on the events it makes, as llama-server sends them.
            if let Some(t) = &parts.timings {
                self.timings = Some(t.clone());
            }
            self.chunk_timings = parts.timings.clone();
            self.start(&mut out);
            if let Some(progress) = &parts.progress {
                let response = self.response(Vec::new(), false);
                let data = json!({"response": response, "prompt_progress": progress});
                self.emit("response.in_progress", data, &mut out);
                self.chunk_timings = None;
                continue;
            }
            if let Some(r) = &parts.reasoning {
                self.reasoning(r, &mut out);
            }
            if let Some(c) = &parts.content {
                self.text(c, &mut out);
            }
            for (call_id, name, arguments) in &parts.calls {
                self.call(call_id, name, arguments, &mut out);
            }
            if let Some((stop_type, _)) = &parts.finish {
                self.stop_type = Some(stop_type.clone());
            }
            if let Some(usage) = parts.usage {
                self.usage = usage;
            }
            self.chunk_timings = None;
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
        let response = self.response(self.output.clone(), true);
        let name = if response["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let mut data = json!({"response": response});
        if let Some(t) = &self.timings {
            data["timings"] = t.clone();
        }
        self.emit(name, data, &mut out);
        out
    }

    fn keepalive(&self) -> String {
        ":\n\n".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(body: Json) -> Json {
        read(&body).map(|(chat, _)| chat).unwrap()
    }

    #[test]
    fn input_items_become_the_chat_conversation_they_mean() {
        let chat = chat_of(json!({
            "instructions": "Be brief.", "max_output_tokens": 32, "temperature": 0.1,
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}}},
            "reasoning": {"effort": "minimal"}, "tool_choice": {"type": "function", "name": "f"},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}]},
                {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Call f."}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\":1}"},
                {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{\"x\":2}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"},
                {"type": "function_call_output", "call_id": "c2", "output": "two"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]},
            ],
        }));
        assert_eq!(
            chat["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "", "reasoning_content": "Call f.", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{\"x\":2}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
                {"role": "assistant", "content": "Done."},
            ])
        );
        assert_eq!(chat["max_tokens"], 32);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(
            chat["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(chat["tools"][0]["function"]["name"], "f");
        crate::server::request::chat(&chat, &Default::default()).unwrap();
    }

    #[test]
    fn a_whole_answer_is_a_response_with_reasoning_message_and_function_call_items() {
        let (_, mut dialect) = read(&json!({"input": "x", "max_output_tokens": 5})).unwrap();
        let chat = json!({
            "model": "m", "created": 7,
            "choices": [{"finish_reason": "tool_calls", "stop_type": "eos", "message": {
                "role": "assistant", "content": "Checking.", "reasoning_content": "Need f.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}},
        });
        let r = dialect.whole(chat);
        let kinds: Vec<&str> = r["output"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["reasoning", "message", "function_call"]);
        assert_eq!(r["output"][0]["content"][0]["text"], "Need f.");
        assert_eq!(r["output"][1]["content"][0]["text"], "Checking.");
        assert_eq!(r["output"][2]["call_id"], "c1");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["max_output_tokens"], 5);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
        assert_eq!(r["usage"]["total_tokens"], 13);
        let (_, mut dialect) = read(&json!({"input": "x"})).unwrap();
        let cut = dialect.whole(json!({"choices": [{"finish_reason": "length", "stop_type": "limit",
                                                   "message": {"content": "ab"}}], "usage": {}}));
        assert_eq!(cut["status"], "incomplete");
        assert_eq!(cut["incomplete_details"]["reason"], "max_output_tokens");
    }

    #[test]
    fn what_minfer_does_not_do_is_refused_by_name() {
        let refused = |body: Json| read(&body).err().expect("refused").param.unwrap_or_default();
        assert_eq!(
            refused(json!({"input": "x", "previous_response_id": "resp_1"})),
            "previous_response_id"
        );
        assert_eq!(refused(json!({"input": "x", "background": true})), "background");
        assert_eq!(refused(json!({"input": "x", "truncation": "auto"})), "truncation");
        assert_eq!(
            refused(json!({"input": "x", "tools": [{"type": "file_search"}]})),
            "tools[0].type"
        );
        assert_eq!(
            refused(json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]})),
            "input[0].content[0].type"
        );
        assert_eq!(
            refused(json!({"input": [{"type": "item_reference", "id": "x"}]})),
            "input[0].type"
        );
        assert_eq!(refused(json!({})), "input");
        assert!(read(&json!({"input": "x", "background": false, "store": true})).is_ok());
    }
}
