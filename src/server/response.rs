//! Shaping results as OpenAI responses: the events a job's slot sends, turned into a
//! `chat.completion` / `text_completion` body, or into the SSE frames of a stream (role delta,
//! content or tool-call deltas, the finishing chunk, the usage chunk, `data: [DONE]`); and as
//! llama-server's own `/completion` and `/infill` answers (`content`, `stop`, the token counts;
//! streamed as `{"content", "stop": false}` frames and a final object, without `[DONE]`).
//!
//! A harmony model's chat reply (gpt-oss: [`Reply::harmony`]) is read back with
//! [`crate::template::harmony`]: the `analysis` channel becomes `reasoning_content` (llama-server's
//! field), the `final` channel and preambles `content`, and messages to `functions.NAME`
//! `tool_calls`, whole or as deltas; text that is not harmony is content, so no reply is lost
//! and none fails. The completions endpoints return such a reply's text as generated, markers
//! and all, as llama-server does.
//!
//! This file builds JSON and SSE text only; it never touches sockets, slots or requests, and it
//! holds the one place where finish reasons, usage and log-probabilities get their OpenAI form.

use super::error::ApiError;
use super::slots::{Event, TokenLogprob};
use super::tool_calls::{self, Piece, ToolCallStream};
use crate::engine::StopReason;
use crate::template::harmony::{self, Delta, HarmonyStream};
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
    /// The model speaks harmony ([`crate::template::ChatTemplate::is_harmony`]): its tokens are
    /// printed with their control tokens, and a chat reply is read as harmony.
    pub harmony: bool,
}

#[derive(Default)]
struct Choice {
    text: String,
    logprobs: Vec<TokenLogprob>,
    reason: Option<StopReason>,
    /// Streaming only: the role delta went out, and the tool-call parser's state.
    role_sent: bool,
    tool_stream: ToolCallStream,
    harmony_stream: HarmonyStream,
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

/// One part of a chat reply, as a stream sends it.
enum Part {
    Content(String),
    Reasoning(String),
    Call(tool_calls::ToolCall),
}

impl From<Piece> for Part {
    fn from(piece: Piece) -> Self {
        match piece {
            Piece::Content(text) => Part::Content(text),
            Piece::Call(call) => Part::Call(call),
        }
    }
}

impl From<Delta> for Part {
    fn from(delta: Delta) -> Self {
        match delta {
            Delta::Content(text) => Part::Content(text),
            Delta::Reasoning(text) => Part::Reasoning(text),
            Delta::Call(call) => Part::Call(tool_calls::ToolCall {
                name: call.name,
                arguments: call.arguments,
            }),
        }
    }
}

/// A whole harmony reply as a chat `message`'s fields: content (null beside calls when there is
/// none, as OpenAI sends it), `reasoning_content` when there is reasoning, and the calls.
fn harmony_message(text: &str) -> (Option<String>, Option<String>, Vec<tool_calls::ToolCall>) {
    let reply = harmony::parse(text);
    let calls: Vec<tool_calls::ToolCall> = reply
        .tool_calls
        .into_iter()
        .map(|c| tool_calls::ToolCall {
            name: c.name,
            arguments: c.arguments,
        })
        .collect();
    let content = (!reply.content.is_empty() || calls.is_empty()).then_some(reply.content);
    let reasoning = (!reply.reasoning.is_empty()).then_some(reply.reasoning);
    (content, reasoning, calls)
}

fn tool_call_json(call: &tool_calls::ToolCall) -> Json {
    json!({
        "id": tool_call_id(),
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    })
}

impl Reply {
    /// A token's text as the reply printed it (a harmony model's with its control tokens).
    fn piece(&self, token: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_to_piece(token, self.harmony).to_vec();
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
                    let (content, reasoning, calls) = if reply.harmony {
                        harmony_message(&c.text)
                    } else if !reply.tools.is_empty() {
                        let (content, calls) = tool_calls::parse(&c.text, &reply.tools);
                        (content, None, calls)
                    } else {
                        (Some(c.text.clone()), None, Vec::new())
                    };
                    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
                    if let Some(reasoning) = reasoning {
                        message["reasoning_content"] = json!(reasoning);
                    }
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

    /// Whether the text is read as harmony: a harmony model's chat reply (completions return it
    /// as generated).
    fn reads_harmony(&self) -> bool {
        self.reply.harmony && self.reply.endpoint == Endpoint::Chat
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

    fn parts(&mut self, index: usize, parts: impl IntoIterator<Item = Part>, out: &mut String) {
        for part in parts {
            match part {
                Part::Content(text) => {
                    let lps = self.pending_logprobs(index, text.len());
                    out.push_str(&self.chunk(index, json!({"content": text}), lps, None));
                }
                Part::Reasoning(text) => {
                    let lps = self.pending_logprobs(index, text.len());
                    out.push_str(&self.chunk(index, json!({"reasoning_content": text}), lps, None));
                }
                Part::Call(call) => {
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
                let parts: Vec<Part> = if self.reads_harmony() {
                    let deltas = self.choice(index).harmony_stream.push(&text);
                    deltas.into_iter().map(|(_, d)| d.into()).collect()
                } else if !self.reply.tools.is_empty() {
                    let pieces = self.choice(index).tool_stream.push(&text);
                    pieces.into_iter().map(Part::from).collect()
                } else {
                    vec![Part::Content(text)]
                };
                self.parts(index, parts, &mut out);
            }
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
            } => {
                self.open(index, &mut out);
                if self.reads_harmony() {
                    let deltas = self.choice(index).harmony_stream.finish();
                    self.parts(index, deltas.into_iter().map(|(_, d)| d.into()), &mut out);
                } else if !self.reply.tools.is_empty() {
                    let pieces = self.choice(index).tool_stream.finish();
                    self.parts(index, pieces.into_iter().map(Part::from), &mut out);
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
            harmony: false,
        }
    }

    /// A reply of a model that speaks harmony.
    fn harmony_reply(endpoint: Endpoint, tools: &[&str]) -> Reply {
        Reply {
            harmony: true,
            ..reply(endpoint, tools)
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

    /// gpt-oss's reply to a weather question with a tool offered, as the server's text holds it
    /// (the closing `<|call|>` ends the generation and is no part of the text): reasoning, a
    /// preamble to the user, and the call.
    const HARMONY_CALL: &str = "<|channel|>analysis<|message|>The user wants the weather in Paris. \
        I should call get_weather.<|end|><|start|>assistant<|channel|>commentary<|message|>Let me check.\
        <|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
        <|message|>{\"location\":\"Paris\"}";

    /// The next turn's reply, once the tool answered: reasoning, then the final answer (its
    /// `<|return|>` ends the generation).
    const HARMONY_ANSWER: &str = "<|channel|>analysis<|message|>The tool says 20 degrees.<|end|>\
        <|start|>assistant<|channel|>final<|message|>It is 20 °C in Paris.";

    fn collect(reply: Reply, text: &str, reason: StopReason) -> Json {
        let mut c = Collector::new(reply);
        c.push(Event::Text {
            index: 0,
            text: text.into(),
        })
        .unwrap();
        c.push(done(reason, 30)).unwrap();
        c.finish(1).unwrap()
    }

    /// The stream's frames for `text` sent in pieces of `size` characters, and the message its
    /// deltas add up to (`content`, `reasoning_content`, the calls' names and arguments).
    fn stream(reply: Reply, text: &str, size: usize, reason: StopReason) -> (Vec<Json>, Json) {
        let mut s = Streamer::new(reply);
        let mut out = String::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            out += &s.push(Event::Text {
                index: 0,
                text: piece.iter().collect(),
            });
        }
        out += &s.push(done(reason, 30));
        out += &s.finish();
        let f = frames(&out);
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        for frame in &f {
            let delta = &frame["choices"][0]["delta"];
            content += delta["content"].as_str().unwrap_or("");
            reasoning += delta["reasoning_content"].as_str().unwrap_or("");
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                calls.push(call["function"].clone());
            }
        }
        let finish = f
            .iter()
            .rev()
            .find_map(|f| f["choices"][0]["finish_reason"].as_str())
            .unwrap_or("");
        (
            f.clone(),
            json!({"content": content, "reasoning_content": reasoning, "calls": calls, "finish": finish}),
        )
    }

    #[test]
    fn a_harmony_reply_with_reasoning_and_a_tool_call_fills_reasoning_content_content_and_tool_calls() {
        let body = collect(
            harmony_reply(Endpoint::Chat, &["get_weather"]),
            HARMONY_CALL,
            StopReason::EndOfGeneration,
        );
        let choice = &body["choices"][0];
        let message = &choice["message"];
        assert_eq!(
            message["reasoning_content"],
            "The user wants the weather in Paris. I should call get_weather."
        );
        assert_eq!(message["content"], "Let me check.");
        assert_eq!(message["tool_calls"].as_array().unwrap().len(), 1);
        assert_eq!(message["tool_calls"][0]["type"], "function");
        assert_eq!(
            message["tool_calls"][0]["function"],
            json!({"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"})
        );
        assert_eq!(choice["finish_reason"], "tool_calls");

        let body = collect(
            harmony_reply(Endpoint::Chat, &["get_weather"]),
            HARMONY_ANSWER,
            StopReason::EndOfGeneration,
        );
        let choice = &body["choices"][0];
        assert_eq!(
            choice["message"],
            json!({"role": "assistant", "content": "It is 20 °C in Paris.", "refusal": null,
                   "reasoning_content": "The tool says 20 degrees."})
        );
        assert_eq!(choice["finish_reason"], "stop");
    }

    #[test]
    fn a_streamed_harmony_reply_sends_reasoning_content_and_tool_call_deltas_that_add_up_to_the_whole_reply() {
        for (text, tools) in [(HARMONY_CALL, &["get_weather"][..]), (HARMONY_ANSWER, &[][..])] {
            let whole = collect(harmony_reply(Endpoint::Chat, tools), text, StopReason::EndOfGeneration);
            let message = &whole["choices"][0]["message"];
            let expected = json!({
                "content": message["content"].as_str().unwrap_or(""),
                "reasoning_content": message["reasoning_content"],
                "calls": message["tool_calls"].as_array().map_or(vec![], |c| c.iter().map(|c| c["function"].clone()).collect()),
                "finish": whole["choices"][0]["finish_reason"],
            });
            for size in [1, 2, 5, 11, 1000] {
                let (frames, got) = stream(
                    harmony_reply(Endpoint::Chat, tools),
                    text,
                    size,
                    StopReason::EndOfGeneration,
                );
                assert_eq!(got, expected, "pieces of {size}");
                // The role opens the stream, and no marker reaches the client.
                assert_eq!(
                    frames[0]["choices"][0]["delta"],
                    json!({"role": "assistant", "content": ""})
                );
                let sent = serde_json::to_string(&frames).unwrap();
                assert!(harmony::MARKERS.iter().all(|m| !sent.contains(m)), "{sent}");
            }
        }
    }

    #[test]
    fn a_reply_that_is_not_well_formed_harmony_comes_back_as_plain_content_never_an_error() {
        let text = "<|channel|>secret<|message|>Hello<|end|>";
        let body = collect(harmony_reply(Endpoint::Chat, &[]), text, StopReason::EndOfGeneration);
        assert_eq!(body["choices"][0]["message"]["content"], "secretHello");
        assert!(body["choices"][0]["message"].get("reasoning_content").is_none());
        assert_eq!(body["choices"][0]["finish_reason"], "stop");
        let (_, streamed) = stream(harmony_reply(Endpoint::Chat, &[]), text, 3, StopReason::EndOfGeneration);
        assert_eq!(streamed["content"], "secretHello");
        // No harmony at all (a reply under a JSON schema cannot print control tokens).
        let json_reply = "{\"answer\": 4}";
        let body = collect(
            harmony_reply(Endpoint::Chat, &[]),
            json_reply,
            StopReason::EndOfGeneration,
        );
        assert_eq!(body["choices"][0]["message"]["content"], json_reply);
        // Cut short inside the reasoning: what there is, and `length`.
        let body = collect(
            harmony_reply(Endpoint::Chat, &[]),
            "<|channel|>analysis<|message|>Let me",
            StopReason::MaxTokens,
        );
        assert_eq!(body["choices"][0]["message"]["reasoning_content"], "Let me");
        assert_eq!(body["choices"][0]["message"]["content"], "");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn completions_of_a_harmony_model_return_the_text_as_generated_markers_and_all() {
        for endpoint in [Endpoint::Completion, Endpoint::Native] {
            let body = collect(
                harmony_reply(endpoint, &[]),
                HARMONY_ANSWER,
                StopReason::EndOfGeneration,
            );
            let text = if endpoint == Endpoint::Native {
                &body["content"]
            } else {
                &body["choices"][0]["text"]
            };
            assert_eq!(text, HARMONY_ANSWER);
            let (frames, _) = stream(
                harmony_reply(endpoint, &[]),
                HARMONY_ANSWER,
                4,
                StopReason::EndOfGeneration,
            );
            let streamed: String = frames
                .iter()
                .map(|f| {
                    f["choices"][0]["text"]
                        .as_str()
                        .or_else(|| f["content"].as_str())
                        .unwrap_or("")
                })
                .collect();
            assert_eq!(streamed, HARMONY_ANSWER);
        }
    }
}
