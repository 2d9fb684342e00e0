//! Shaping results as OpenAI responses: the events a job's slot sends, turned into a
//! `chat.completion` / `text_completion` body, or into the SSE frames of a stream (role delta,
//! content or tool-call deltas, the finishing chunk, the usage chunk, `data: [DONE]`); and as
//! llama-server's own `/completion` and `/infill` answers (`content`, `stop`, the token counts;
//! streamed as `{"content", "stop": false}` frames and a final object, without `[DONE]`).
//!
//! This file builds JSON and SSE text only; it never touches sockets, slots or requests, and it
//! holds the one place where finish reasons, usage and log-probabilities get their OpenAI form.

use super::error::ApiError;
use super::slots::{Event, TokenLogprob};
use super::tool_calls::{self, Piece, ToolCallStream};
use crate::engine::StopReason;
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
    /// llama-server's `/completion` and `/infill`.
    Native,
}

/// What every part of one response shares.
pub struct Reply {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub endpoint: Endpoint,
    /// The offered tools' names: tool calls are parsed out of the text when there are any.
    pub tools: Vec<String>,
    pub include_usage: bool,
    /// Choices per prompt (`n`), so that usage counts each prompt once.
    pub n: usize,
    pub tokenizer: Arc<Tokenizer>,
}

#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<TokenLogprob>,
    reason: Option<StopReason>,
    /// Streaming only: the role delta went out, and the tool-call parser's state.
    role_sent: bool,
    tool_stream: ToolCallStream,
    n_calls: usize,
    /// The run's token counts, once it is done.
    n_prompt: usize,
    n_cached: usize,
    n_generated: usize,
}

#[derive(Default, Debug, Clone, Copy, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

impl Usage {
    fn add(&mut self, index: usize, n: usize, n_prompt: usize, n_cached: usize, n_generated: usize) {
        // The n choices of one prompt share it: count it once, with the first choice's reuse.
        if index.is_multiple_of(n.max(1)) {
            self.prompt_tokens += n_prompt;
            self.cached_tokens += n_cached;
        }
        self.completion_tokens += n_generated;
    }

    pub fn json(&self) -> Json {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        })
    }
}

fn finish_reason(reason: Option<StopReason>, tool_calls: bool) -> &'static str {
    match reason {
        _ if tool_calls => "tool_calls",
        Some(StopReason::MaxTokens | StopReason::ContextFull) => "length",
        Some(StopReason::EndOfGeneration | StopReason::StopString | StopReason::Interrupted) | None => "stop",
    }
}

fn tool_call_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!(
        "call_{:016x}",
        super::random_u64() ^ NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn tool_call_json(call: &tool_calls::ToolCall) -> Json {
    json!({
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

impl Reply {
    fn piece(&self, token: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_to_piece(token, false).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Chat's `logprobs` object for some tokens.
    fn chat_logprobs(&self, lps: &[TokenLogprob]) -> Json {
        let entry = |token: u32, logprob: f32| {
            let (text, bytes) = self.piece(token);
            json!({"token": text, "logprob": logprob, "bytes": bytes})
        };
        let content: Vec<Json> = lps
            .iter()
            .map(|lp| {
                let mut e = entry(lp.token, lp.logprob);
                e["top_logprobs"] = Json::Array(lp.top.iter().map(|&(t, l)| entry(t, l)).collect());
                e
            })
            .collect();
        json!({"content": content, "refusal": null})
    }

    /// The legacy completions `logprobs` object; `offset` is where the tokens' text starts.
    fn completion_logprobs(&self, lps: &[TokenLogprob], mut offset: usize) -> Json {
        let mut tokens = Vec::new();
        let mut token_logprobs = Vec::new();
        let mut top = Vec::new();
        let mut offsets = Vec::new();
        for lp in lps {
            let (text, _) = self.piece(lp.token);
            offsets.push(offset);
            offset += text.len();
            tokens.push(text);
            token_logprobs.push(lp.logprob);
            let alternatives: serde_json::Map<String, Json> =
                lp.top.iter().map(|&(t, l)| (self.piece(t).0, json!(l))).collect();
            top.push(Json::Object(alternatives));
        }
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion | Endpoint::Native, _) => "text_completion",
        }
    }

    /// llama-server's answer to `/completion` for a finished run: `content` (the whole text,
    /// or empty at the end of a stream), `stop`, why it stopped, and the token counts.
    fn native(&self, c: &Choice, content: &str) -> Json {
        let stop_type = match c.reason {
            Some(StopReason::EndOfGeneration) => "eos",
            Some(StopReason::MaxTokens | StopReason::ContextFull) => "limit",
            Some(StopReason::StopString) => "word",
            Some(StopReason::Interrupted) | None => "none",
        };
        json!({
            "content": content,
            "stop": true,
            "model": self.model,
            "stop_type": stop_type,
            "stopping_word": "",
            "truncated": false,
            "tokens_predicted": c.n_generated,
            "tokens_evaluated": c.n_prompt,
            "tokens_cached": c.n_cached,
            "timings": {
                "prompt_n": c.n_prompt - c.n_cached.min(c.n_prompt),
                "predicted_n": c.n_generated,
            },
        })
    }

    fn envelope(&self, chunk: bool, choices: Vec<Json>) -> Json {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": choices,
        })
    }
}

/// Gathers a whole response from its events.
pub struct Collector {
    reply: Reply,
    choices: BTreeMap<usize, Choice>,
    usage: Usage,
}

impl Collector {
    pub fn new(reply: Reply) -> Self {
        Collector {
            reply,
            choices: BTreeMap::new(),
            usage: Usage::default(),
        }
    }

    /// Takes one event; a failure ends the response with a 500.
    pub fn push(&mut self, event: Event) -> Result<(), ApiError> {
        match event {
            Event::Logprob { index, logprob } => self.choices.entry(index).or_default().logprobs.push(logprob),
            Event::Text { index, text } => self.choices.entry(index).or_default().text.push_str(&text),
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
            } => {
                let choice = self.choices.entry(index).or_default();
                choice.reason = Some(reason);
                (choice.n_prompt, choice.n_cached, choice.n_generated) = (n_prompt, n_cached, n_generated);
                self.usage.add(index, self.reply.n, n_prompt, n_cached, n_generated);
            }
            Event::Failed(message) => return Err(ApiError::internal(format!("generation failed: {message}"))),
            Event::Refused(message) => return Err(refused(&message)),
        }
        Ok(())
    }

    /// The response body, once every choice is done.
    pub fn finish(self, n_choices: usize) -> Result<Json, ApiError> {
        if self.choices.values().filter(|c| c.reason.is_some()).count() < n_choices {
            return Err(ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the request was cancelled: the server is shutting down",
            ));
        }
        let reply = &self.reply;
        if reply.endpoint == Endpoint::Native {
            let choice = self
                .choices
                .values()
                .next()
                .ok_or_else(|| ApiError::internal("no run ended"))?;
            return Ok(reply.native(choice, &choice.text));
        }
        let choices: Vec<Json> = self
            .choices
            .iter()
            .map(|(&index, c)| match reply.endpoint {
                Endpoint::Chat => {
                    let (content, calls) = if !reply.tools.is_empty() {
                        tool_calls::parse(&c.text, &reply.tools)
                    } else {
                        (Some(c.text.clone()), Vec::new())
                    };
                    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
                    if !calls.is_empty() {
                        message["tool_calls"] = Json::Array(calls.iter().map(tool_call_json).collect());
                    }
                    json!({
                        "index": index,
                        "message": message,
                        "logprobs": reply.logprobs_or_null(c, |lps| reply.chat_logprobs(lps)),
                        "finish_reason": finish_reason(c.reason, !calls.is_empty()),
                    })
                }
                Endpoint::Completion | Endpoint::Native => json!({
                    "index": index,
                    "text": c.text,
                    "logprobs": reply.logprobs_or_null(c, |lps| reply.completion_logprobs(lps, 0)),
                    "finish_reason": finish_reason(c.reason, false),
                }),
            })
            .collect();
        let mut body = reply.envelope(false, choices);
        body["usage"] = self.usage.json();
        Ok(body)
    }
}

impl Reply {
    fn logprobs_or_null(&self, c: &Choice, f: impl Fn(&[TokenLogprob]) -> Json) -> Json {
        if c.logprobs.is_empty() {
            Json::Null
        } else {
            f(&c.logprobs)
        }
    }
}

/// Turns events into SSE frames as they arrive.
pub struct Streamer {
    reply: Reply,
    choices: BTreeMap<usize, Choice>,
    usage: Usage,
    /// Text already sent per choice (for completions' `text_offset`).
    sent: BTreeMap<usize, usize>,
    failed: bool,
}

pub fn frame(data: &Json) -> String {
    format!("data: {data}\n\n")
}

impl Streamer {
    pub fn new(reply: Reply) -> Self {
        Streamer {
            reply,
            choices: BTreeMap::new(),
            usage: Usage::default(),
            sent: BTreeMap::new(),
            failed: false,
        }
    }

    fn choice(&mut self, index: usize) -> &mut Choice {
        let names = &self.reply.tools;
        self.choices.entry(index).or_insert_with(|| Choice {
            tool_stream: ToolCallStream::new(names.clone()),
            ..Default::default()
        })
    }

    fn chunk(&self, index: usize, delta: Json, logprobs: Json, finish: Option<&str>) -> String {
        if self.reply.endpoint == Endpoint::Native {
            let content = delta.get("content").and_then(Json::as_str).unwrap_or("");
            return frame(&json!({"content": content, "stop": false}));
        }
        let choice = match self.reply.endpoint {
            Endpoint::Chat => json!({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}),
            Endpoint::Completion | Endpoint::Native => json!({
                "index": index,
                "text": delta.get("content").and_then(Json::as_str).unwrap_or(""),
                "logprobs": logprobs,
                "finish_reason": finish,
            }),
        };
        let mut body = self.reply.envelope(true, vec![choice]);
        if self.reply.include_usage {
            body["usage"] = Json::Null;
        }
        frame(&body)
    }

    /// The role delta that opens a chat choice, once.
    fn open(&mut self, index: usize, out: &mut String) {
        let chat = self.reply.endpoint == Endpoint::Chat;
        let choice = self.choice(index);
        if choice.role_sent || !chat {
            return;
        }
        choice.role_sent = true;
        out.push_str(&self.chunk(index, json!({"role": "assistant", "content": ""}), Json::Null, None));
    }

    fn pending_logprobs(&mut self, index: usize, text_len: usize) -> Json {
        let choice = self.choice(index);
        if choice.logprobs.is_empty() {
            return Json::Null;
        }
        let lps = std::mem::take(&mut choice.logprobs);
        let sent = self.sent.entry(index).or_default();
        let offset = *sent;
        *sent += text_len;
        match self.reply.endpoint {
            Endpoint::Chat => self.reply.chat_logprobs(&lps),
            Endpoint::Completion | Endpoint::Native => self.reply.completion_logprobs(&lps, offset),
        }
    }

    fn pieces(&mut self, index: usize, pieces: Vec<Piece>, out: &mut String) {
        for piece in pieces {
            match piece {
                Piece::Content(text) => {
                    let lps = self.pending_logprobs(index, text.len());
                    out.push_str(&self.chunk(index, json!({"content": text}), lps, None));
                }
                Piece::Call(call) => {
                    let choice = self.choice(index);
                    let k = choice.n_calls;
                    choice.n_calls += 1;
                    let mut delta = tool_call_json(&call);
                    delta["index"] = json!(k);
                    let lps = self.pending_logprobs(index, 0);
                    out.push_str(&self.chunk(index, json!({"tool_calls": [delta]}), lps, None));
                }
            }
        }
    }

    /// The frames an event makes (possibly none).
    pub fn push(&mut self, event: Event) -> String {
        let mut out = String::new();
        match event {
            Event::Logprob { index, logprob } => self.choice(index).logprobs.push(logprob),
            Event::Text { index, text } => {
                self.open(index, &mut out);
                let pieces = if !self.reply.tools.is_empty() {
                    self.choice(index).tool_stream.push(&text)
                } else {
                    vec![Piece::Content(text)]
                };
                self.pieces(index, pieces, &mut out);
            }
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
            } => {
                self.open(index, &mut out);
                if !self.reply.tools.is_empty() {
                    let pieces = self.choice(index).tool_stream.finish();
                    self.pieces(index, pieces, &mut out);
                }
                self.usage.add(index, self.reply.n, n_prompt, n_cached, n_generated);
                let lps = self.pending_logprobs(index, 0);
                let choice = self.choice(index);
                choice.reason = Some(reason);
                (choice.n_prompt, choice.n_cached, choice.n_generated) = (n_prompt, n_cached, n_generated);
                let n_calls = choice.n_calls;
                if self.reply.endpoint == Endpoint::Native {
                    out.push_str(&frame(&self.reply.native(&self.choices[&index], "")));
                    return out;
                }
                let finish = finish_reason(Some(reason), n_calls > 0);
                let delta = if self.reply.endpoint == Endpoint::Chat {
                    json!({})
                } else {
                    json!({"content": ""})
                };
                out.push_str(&self.chunk(index, delta, lps, Some(finish)));
            }
            Event::Failed(message) => {
                self.failed = true;
                out.push_str(&frame(
                    &ApiError::internal(format!("generation failed: {message}")).body(),
                ));
            }
            Event::Refused(message) => {
                self.failed = true;
                out.push_str(&frame(&refused(&message).body()));
            }
        }
        out
    }

    /// The frames after the last event: the usage chunk if asked for, then `[DONE]` (neither
    /// after a failure, whose error frame ends the stream).
    pub fn finish(&mut self) -> String {
        // llama-server's own stream ends with its final object, without `[DONE]`.
        if self.failed || self.reply.endpoint == Endpoint::Native {
            return String::new();
        }
        let mut out = String::new();
        if self.reply.include_usage {
            let mut body = self.reply.envelope(true, Vec::new());
            body["usage"] = self.usage.json();
            out.push_str(&frame(&body));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }
}

/// The answer to a request whose grammar could not go on: a 400, naming what stopped it.
fn refused(message: &str) -> ApiError {
    ApiError::bad_request(format!(
        "the request's grammar could not be followed past its limits: {message}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(endpoint: Endpoint, tools: &[&str]) -> Reply {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-qwen2-Q8_0.gguf");
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        Reply {
            id: "chatcmpl-1".into(),
            created: 0,
            model: "m".into(),
            endpoint,
            tools: tools.iter().map(|t| t.to_string()).collect(),
            include_usage: true,
            n: 1,
            tokenizer: Arc::new(Tokenizer::from_metadata(file.metadata()).unwrap()),
        }
    }

    fn done(reason: StopReason, n_generated: usize) -> Event {
        Event::Done {
            index: 0,
            reason,
            n_prompt: 10,
            n_cached: 4,
            n_generated,
        }
    }

    fn frames(text: &str) -> Vec<Json> {
        text.split("\n\n")
            .filter(|f| !f.is_empty() && *f != "data: [DONE]")
            .map(|f| serde_json::from_str(f.strip_prefix("data: ").unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn a_chat_stream_opens_with_the_role_and_ends_with_finish_usage_and_done() {
        let mut s = Streamer::new(reply(Endpoint::Chat, &[]));
        let mut out = s.push(Event::Text {
            index: 0,
            text: "Hi".into(),
        });
        out += &s.push(done(StopReason::MaxTokens, 1));
        out += &s.finish();
        assert!(out.ends_with("data: [DONE]\n\n"));
        let f = frames(&out);
        assert_eq!(f[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
        assert_eq!(f[1]["choices"][0]["delta"]["content"], "Hi");
        assert_eq!(f[2]["choices"][0]["finish_reason"], "length");
        assert_eq!(f[3]["choices"], json!([]));
        assert_eq!(f[3]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(f[3]["usage"]["total_tokens"], 11);
    }

    #[test]
    fn a_streamed_tool_call_is_one_tool_call_delta_and_finishes_with_tool_calls() {
        let mut s = Streamer::new(reply(Endpoint::Chat, &["f"]));
        let mut out = String::new();
        for piece in [
            "<tool",
            "_call>{\"name\": \"f\", ",
            "\"arguments\": {\"x\": 1}}</tool_call>",
        ] {
            out += &s.push(Event::Text {
                index: 0,
                text: piece.into(),
            });
        }
        out += &s.push(done(StopReason::EndOfGeneration, 9));
        let f = frames(&out);
        let calls: Vec<&Json> = f
            .iter()
            .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
            .collect();
        assert_eq!(calls.len(), 1);
        let call = &calls[0]["choices"][0]["delta"]["tool_calls"][0];
        assert_eq!(call["index"], 0);
        assert_eq!(call["function"], json!({"name": "f", "arguments": "{\"x\":1}"}));
        assert_eq!(f.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }

    #[test]
    fn a_failure_mid_stream_is_an_error_frame_without_done() {
        let mut s = Streamer::new(reply(Endpoint::Completion, &[]));
        let out = s.push(Event::Failed("boom".into())) + &s.finish();
        assert!(out.contains("\"server_error\"") && !out.contains("[DONE]"), "{out}");
    }

    #[test]
    fn a_collected_chat_reply_carries_content_usage_and_the_finish_reason() {
        let mut c = Collector::new(reply(Endpoint::Chat, &[]));
        c.push(Event::Text {
            index: 0,
            text: "Hello".into(),
        })
        .unwrap();
        c.push(done(StopReason::StopString, 2)).unwrap();
        let body = c.finish(1).unwrap();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(body["choices"][0]["message"]["content"], "Hello");
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        assert_eq!(body["usage"]["completion_tokens"], 2);
        let mut failed = Collector::new(reply(Endpoint::Chat, &[]));
        assert_eq!(failed.push(Event::Failed("x".into())).unwrap_err().status.as_u16(), 500);
        let mut refused = Collector::new(reply(Endpoint::Chat, &[]));
        assert_eq!(
            refused.push(Event::Refused("x".into())).unwrap_err().status.as_u16(),
            400
        );
    }
}
