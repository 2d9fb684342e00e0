//! Shaping results as OpenAI responses: the events a job's slot sends, turned into a
//! `chat.completion` / `text_completion` body, or into the SSE frames of a stream (role delta,
//! content or tool-call deltas, the finishing chunk, the usage chunk, `data: [DONE]`); and as
//! llama-server's own `/completion` and `/infill` answers (its sixteen keys: `index`,
//! `content`, `tokens`, `id_slot`, `stop`, `model`, `tokens_predicted`, `tokens_evaluated`,
//! `generation_settings`, `prompt`, `has_new_line`, `truncated`, `stop_type`, `stopping_word`,
//! `tokens_cached`, `timings`; streamed as `{"index", "content", "tokens", "stop": false,
//! "id_slot", "tokens_predicted", "tokens_evaluated"}` frames and the final object, without
//! `[DONE]`). Every answer carries llama-server's `timings` ([`timings_json`]) and its
//! `system_fingerprint` ([`build_info`]); log-probabilities carry each token's `id`.
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
use super::slots::{Event, RunTimings, TokenLogprob};
use super::tool_calls::{self, Piece, ToolCallStream};
use crate::engine::StopReason;
use crate::template::harmony::{self, Delta, HarmonyStream};
use crate::template::reasoning::{self, ThinkDelta, ThinkStream, ThinkTags};
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
    /// A thinking model's chat reply, read apart ([`Think`]); `None`: the text is content.
    pub think: Option<Think>,
    /// What llama-server's answers add.
    pub llama: LlamaReply,
    /// The chat answer is read by another API's shape ([`super::apis`]): each finished choice
    /// carries llama-server's `stop_type`, which tells a stop string from the end of
    /// generation, as OpenAI's `finish_reason` does not.
    pub for_dialect: bool,
}

/// How a thinking model's chat reply is split ([`crate::template::reasoning`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Think {
    /// The template's tags.
    pub tags: ThinkTags,
    /// The prompt left the reasoning open: the reply starts inside it.
    pub opened: bool,
    /// `deepseek-legacy`: the content keeps the reasoning and its tags as generated.
    pub legacy: bool,
}

/// What llama-server's own answer holds beyond the text, and the options that shape it.
#[derive(Default)]
pub struct LlamaReply {
    /// `generation_settings`: the request's settings, as llama-server lists them.
    pub settings: Arc<Json>,
    /// Each prompt as the model read it (control tokens printed), for `prompt`.
    pub prompts: Vec<String>,
    /// Each prompt's length in tokens, for `tokens_evaluated`.
    pub n_prompt: Vec<usize>,
    /// The generated ids in `tokens` (`return_tokens`).
    pub return_tokens: bool,
    /// Only these fields (`response_fields`).
    pub response_fields: Vec<String>,
    /// llama-server's answer under `__verbose` beside an OpenAI one.
    pub verbose: bool,
    /// Log-probabilities are the sampler chain's, reported as probabilities (`prob`,
    /// `top_probs`).
    pub post_sampling_probs: bool,
    /// `timings` with every streamed chunk.
    pub timings_per_token: bool,
}

/// What `system_fingerprint` and `/props`' `build_info` say: `b` and the build, as
/// llama-server's `b<build>-<commit>`.
pub fn build_info() -> String {
    format!("b{}-minfer", env!("CARGO_PKG_VERSION"))
}

/// llama-server's `timings` for one run: prompt tokens read and found cached, the time to read
/// them, the tokens generated and the time from the first to the last. Rates are over decode
/// steps: a run's first token comes from the prompt's last pass and costs no step of its own,
/// so it is not counted (llama-server's `n_gen_steps`). Every value is finite.
pub fn timings_json(t: &RunTimings) -> Json {
    let prompt_ms = t.prompt.as_secs_f64() * 1e3;
    let steps = t.n_generated.saturating_sub(1) as f64;
    let predicted_ms = if t.n_generated > 0 {
        t.gen.as_micros().max(1) as f64 / 1e3
    } else {
        0.0
    };
    let per = |ms: f64, n: f64| if n > 0.0 { ms / n } else { 0.0 };
    let rate = |ms: f64, n: f64| if ms > 0.0 { 1e3 / ms * n } else { 0.0 };
    let mut timings = json!({
        "cache_n": t.n_cached,
        "prompt_n": t.n_prompt,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": per(prompt_ms, t.n_prompt as f64),
        "prompt_per_second": rate(prompt_ms, t.n_prompt as f64),
        "predicted_n": t.n_generated,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": per(predicted_ms, steps),
        "predicted_per_second": rate(predicted_ms, steps),
    });
    if t.n_drafted > 0 {
        timings["draft_n"] = json!(t.n_drafted);
        timings["draft_n_accepted"] = json!(t.n_accepted);
    }
    timings
}

/// The timings of several runs (the choices of one answer) as one: counts and times summed.
fn combined(runs: impl Iterator<Item = RunTimings>) -> RunTimings {
    runs.fold(RunTimings::default(), |a, t| RunTimings {
        n_prompt: a.n_prompt + t.n_prompt,
        n_cached: a.n_cached + t.n_cached,
        prompt: a.prompt + t.prompt,
        n_generated: a.n_generated + t.n_generated,
        gen: a.gen + t.gen,
        n_drafted: a.n_drafted + t.n_drafted,
        n_accepted: a.n_accepted + t.n_accepted,
    })
}

/// `fields` of `body` only, each `a/b` taken from inside `a` under its whole path as the key
/// (llama-server's `response_fields`); missing ones are left out.
fn pick_fields(body: Json, fields: &[String]) -> Json {
    let mut picked = serde_json::Map::new();
    for path in fields {
        let mut value = Some(&body);
        for key in path.split('/') {
            value = value.and_then(|v| v.get(key));
        }
        if let Some(v) = value {
            picked.insert(path.clone(), v.clone());
        }
    }
    Json::Object(picked)
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
    think_stream: Option<ThinkStream>,
    n_calls: usize,
    /// The run's token counts, once it is done.
    n_prompt: usize,
    n_cached: usize,
    n_generated: usize,
    /// The tokens generated, the slot, its cells and the timings, once it is done.
    tokens: Vec<u32>,
    slot: usize,
    n_cells: usize,
    timings: RunTimings,
    /// The stop string that ended the run, else empty.
    stopping_word: String,
    /// Tokens streamed so far, and whether a newline was among their text.
    n_streamed: usize,
    has_new_line: bool,
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

/// llama-server's `stop_type`: `eos`, `word` (a stop string), `limit` or `none`.
fn stop_type(reason: Option<StopReason>) -> &'static str {
    match reason {
        Some(StopReason::EndOfGeneration) => "eos",
        Some(StopReason::MaxTokens | StopReason::ContextFull) => "limit",
        Some(StopReason::StopString) => "word",
        Some(StopReason::Interrupted) | None => "none",
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
    /// llama-server's `completion_probabilities` (also OpenAI's chat `logprobs.content`): each
    /// token's id, text, bytes and log-probability with its alternatives, or, after the
    /// sampler chain, its probability (`prob`, `top_probs`).
    fn probabilities(&self, lps: &[TokenLogprob]) -> Json {
        let post = self.llama.post_sampling_probs;
        let (value, top_name) = if post {
            ("prob", "top_probs")
        } else {
            ("logprob", "top_logprobs")
        };
        // A log-probability of -inf is sent as the lowest float (JSON has no infinity).
        let number = |lp: f32| {
            if post {
                json!((lp as f64).exp())
            } else if lp.is_finite() {
                json!(lp)
            } else {
                json!(f32::MIN)
            }
        };
        let entry = |token: u32, lp: f32| {
            let (text, bytes) = self.piece(token);
            let mut e = json!({"id": token, "token": text, "bytes": bytes});
            e[value] = number(lp);
            e
        };
        Json::Array(
            lps.iter()
                .map(|lp| {
                    let mut e = entry(lp.token, lp.logprob);
                    e[top_name] = Json::Array(lp.top.iter().map(|&(t, l)| entry(t, l)).collect());
                    e
                })
                .collect(),
        )
    }

    /// llama-server's answer for a finished run (`index` is its place among the outputs):
    /// its sixteen keys, `completion_probabilities` when asked for, cut to `response_fields`.
    /// In a stream, the text and tokens went out in the frames: `content` is empty here.
    fn native_final(&self, index: usize, c: &Choice, stream: bool) -> Json {
        let stop_type = stop_type(c.reason);
        let prompt = index / self.n.max(1);
        let (content, tokens) = if stream {
            ("", &[][..])
        } else if self.llama.return_tokens {
            (c.text.as_str(), &c.tokens[..])
        } else {
            (c.text.as_str(), &[][..])
        };
        let mut body = json!({
            "index": index,
            "content": content,
            "tokens": tokens,
            "id_slot": c.slot,
            "stop": true,
            "model": self.model,
            "tokens_predicted": c.n_generated,
            "tokens_evaluated": c.n_prompt,
            "generation_settings": *self.llama.settings,
            "prompt": self.llama.prompts.get(prompt).map_or("", String::as_str),
            "has_new_line": c.has_new_line || c.text.contains('\n'),
            "truncated": c.reason == Some(StopReason::ContextFull),
            "stop_type": stop_type,
            "stopping_word": c.stopping_word,
            "tokens_cached": c.n_cells,
            "timings": timings_json(&c.timings),
        });
        if !stream && !c.logprobs.is_empty() {
            body["completion_probabilities"] = self.probabilities(&c.logprobs);
        }
        if self.llama.response_fields.is_empty() {
            body
        } else {
            pick_fields(body, &self.llama.response_fields)
        }
    }

    /// A token's text as the reply printed it (a harmony model's with its control tokens).
    fn piece(&self, token: u32) -> (String, Vec<u8>) {
        let bytes = self.tokenizer.token_to_piece(token, self.harmony).to_vec();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// Chat's `logprobs` object for some tokens: OpenAI's entries with llama-server's `id`.
    fn chat_logprobs(&self, lps: &[TokenLogprob]) -> Json {
        json!({"content": self.probabilities(lps), "refusal": null})
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
        // OpenAI's legacy arrays, and llama-server's `content` entries beside them.
        json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets,
               "content": self.probabilities(lps)})
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion | Endpoint::Native, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Vec<Json>) -> Json {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "system_fingerprint": build_info(),
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
            Event::Text { index, text, .. } => self.choices.entry(index).or_default().text.push_str(&text),
            Event::Progress { .. } => {}
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
                slot,
                tokens,
                n_cells,
                timings,
                stopping_word,
            } => {
                let choice = self.choices.entry(index).or_default();
                choice.reason = Some(reason);
                choice.stopping_word = stopping_word;
                (choice.n_prompt, choice.n_cached, choice.n_generated) = (n_prompt, n_cached, n_generated);
                (choice.tokens, choice.slot, choice.n_cells, choice.timings) = (tokens, slot, n_cells, timings);
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
            // One output is an object; several (prompts × n_cmpl) an array, in order.
            let mut outputs: Vec<Json> = self
                .choices
                .iter()
                .map(|(&index, c)| reply.native_final(index, c, false))
                .collect();
            return match outputs.len() {
                0 => Err(ApiError::internal("no run ended")),
                1 => Ok(outputs.remove(0)),
                _ => Ok(Json::Array(outputs)),
            };
        }
        let choices: Vec<Json> = self
            .choices
            .iter()
            .map(|(&index, c)| match reply.endpoint {
                Endpoint::Chat => {
                    let (content, reasoning, calls) = if reply.harmony {
                        harmony_message(&c.text)
                    } else {
                        let (reasoning, text) = match reply.think {
                            Some(think) => {
                                let split = reasoning::parse(&c.text, think.tags, think.opened);
                                let content = if think.legacy { c.text.clone() } else { split.content };
                                (split.reasoning.filter(|r| !r.is_empty()), content)
                            }
                            None => (None, c.text.clone()),
                        };
                        if reply.tools.is_empty() {
                            (Some(text), reasoning, Vec::new())
                        } else {
                            let (content, calls) = tool_calls::parse(&text, &reply.tools);
                            (content, reasoning, calls)
                        }
                    };
                    let mut message = json!({"role": "assistant", "content": content, "refusal": null});
                    if let Some(reasoning) = reasoning {
                        message["reasoning_content"] = json!(reasoning);
                    }
                    if !calls.is_empty() {
                        message["tool_calls"] = Json::Array(calls.iter().map(tool_call_json).collect());
                    }
                    let mut choice = json!({
                        "index": index,
                        "message": message,
                        "logprobs": reply.logprobs_or_null(c, |lps| reply.chat_logprobs(lps)),
                        "finish_reason": finish_reason(c.reason, !calls.is_empty()),
                    });
                    if reply.for_dialect {
                        choice["stop_type"] = json!(stop_type(c.reason));
                        choice["stopping_word"] = json!(c.stopping_word);
                    }
                    choice
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
        body["timings"] = timings_json(&combined(self.choices.values().map(|c| c.timings)));
        if reply.llama.verbose {
            if let Some((&index, c)) = self.choices.iter().next() {
                body["__verbose"] = reply.native_final(index, c, false);
            }
        }
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
    /// The timings the chunks made now carry (`timings_per_token`, and a run's last chunk).
    timings_now: Option<RunTimings>,
}

pub fn frame(data: &Json) -> String {
    format!("data: {data}\n\n")
}

/// Frames as SSE text.
#[cfg(test)]
fn sse(frames: Vec<Json>) -> String {
    frames.iter().map(frame).collect()
}

impl Streamer {
    pub fn new(reply: Reply) -> Self {
        Streamer {
            reply,
            choices: BTreeMap::new(),
            usage: Usage::default(),
            sent: BTreeMap::new(),
            failed: false,
            timings_now: None,
        }
    }

    fn choice(&mut self, index: usize) -> &mut Choice {
        let names = &self.reply.tools;
        self.choices.entry(index).or_insert_with(|| Choice {
            tool_stream: ToolCallStream::new(names.clone()),
            ..Default::default()
        })
    }

    fn chunk(&self, index: usize, delta: Json, logprobs: Json, finish: Option<&str>) -> Json {
        if self.reply.endpoint == Endpoint::Native {
            let content = delta.get("content").and_then(Json::as_str).unwrap_or("");
            return self.native_chunk(index, content, Vec::new(), None);
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
        if let Some(t) = &self.timings_now {
            body["timings"] = timings_json(t);
        }
        body
    }

    /// llama-server's frame for some of a run's text (`stop` false): its tokens, the counts so
    /// far, and the tokens' probabilities when asked for.
    fn native_chunk(&self, index: usize, content: &str, tokens: Vec<u32>, lps: Option<&[TokenLogprob]>) -> Json {
        let c = self.choices.get(&index);
        let prompt = index / self.reply.n.max(1);
        let mut body = json!({
            "index": index,
            "content": content,
            "tokens": tokens,
            "stop": false,
            "id_slot": c.map_or(-1, |c| c.slot as i64),
            "tokens_predicted": c.map_or(0, |c| c.n_streamed),
            "tokens_evaluated": self.reply.llama.n_prompt.get(prompt).copied().unwrap_or(0),
        });
        if let Some(lps) = lps.filter(|l| !l.is_empty()) {
            body["completion_probabilities"] = self.reply.probabilities(lps);
        }
        body
    }

    /// Whether the text is read as harmony: a harmony model's chat reply (completions return it
    /// as generated).
    fn reads_harmony(&self) -> bool {
        self.reply.harmony && self.reply.endpoint == Endpoint::Chat
    }

    /// The parts a chat reply's next `text` makes (`None`: its end), when it is not harmony: its
    /// reasoning split out for a thinking model, then calls read out of the rest when tools were
    /// offered. A completion's text is content as generated.
    fn content_parts(&mut self, index: usize, text: Option<&str>) -> Vec<Part> {
        let chat = self.reply.endpoint == Endpoint::Chat;
        let think = self.reply.think.filter(|_| chat);
        let has_tools = chat && !self.reply.tools.is_empty();
        let choice = self.choice(index);
        let mut parts = Vec::new();
        let mut content = Vec::new();
        match think {
            Some(think) => {
                let stream = choice
                    .think_stream
                    .get_or_insert_with(|| ThinkStream::new(think.tags, think.opened));
                let deltas = match text {
                    Some(text) => stream.push(text),
                    None => stream.finish(),
                };
                for delta in deltas {
                    match delta {
                        ThinkDelta::Reasoning(r) => parts.push(Part::Reasoning(r)),
                        ThinkDelta::Content(c) if !think.legacy => content.push(c),
                        ThinkDelta::Content(_) => {}
                    }
                }
                // deepseek-legacy: the content is the text as generated, reasoning and all.
                if think.legacy {
                    content.extend(text.map(str::to_string));
                }
            }
            None => content.extend(text.map(str::to_string)),
        }
        if has_tools {
            for c in content {
                parts.extend(choice.tool_stream.push(&c).into_iter().map(Part::from));
            }
            if text.is_none() {
                parts.extend(choice.tool_stream.finish().into_iter().map(Part::from));
            }
        } else {
            parts.extend(content.into_iter().map(Part::Content));
        }
        parts
    }

    /// The role delta that opens a chat choice, once.
    fn open(&mut self, index: usize, out: &mut Vec<Json>) {
        let chat = self.reply.endpoint == Endpoint::Chat;
        let choice = self.choice(index);
        if choice.role_sent || !chat {
            return;
        }
        choice.role_sent = true;
        // llama-server's first delta: the role, with null content.
        out.push(self.chunk(index, json!({"role": "assistant", "content": null}), Json::Null, None));
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

    fn parts(&mut self, index: usize, parts: impl IntoIterator<Item = Part>, out: &mut Vec<Json>) {
        for part in parts {
            match part {
                Part::Content(text) => {
                    let lps = self.pending_logprobs(index, text.len());
                    out.push(self.chunk(index, json!({"content": text}), lps, None));
                }
                Part::Reasoning(text) => {
                    let lps = self.pending_logprobs(index, text.len());
                    out.push(self.chunk(index, json!({"reasoning_content": text}), lps, None));
                }
                Part::Call(call) => {
                    let choice = self.choice(index);
                    let k = choice.n_calls;
                    choice.n_calls += 1;
                    let mut delta = tool_call_json(&call);
                    delta["index"] = json!(k);
                    let lps = self.pending_logprobs(index, 0);
                    out.push(self.chunk(index, json!({"tool_calls": [delta]}), lps, None));
                }
            }
        }
    }

    /// The SSE text an event makes (possibly none), as an OpenAI-shaped stream sends it
    /// (`apis::OpenAi` writes the server's).
    #[cfg(test)]
    pub fn push(&mut self, event: Event) -> String {
        sse(self.push_frames(event))
    }

    /// The SSE text after the last event: [`Self::finish_frames`], then `[DONE]` (not after a
    /// failure, whose error frame ends the stream, and not on llama-server's own stream, which
    /// ends with its final object).
    #[cfg(test)]
    pub fn finish(&mut self) -> String {
        let mut out = sse(self.finish_frames());
        if !self.failed && self.reply.endpoint != Endpoint::Native {
            out.push_str("data: [DONE]\n\n");
        }
        out
    }

    /// The frames an event makes (possibly none), as JSON: chunks, and an error body on a
    /// failure.
    pub fn push_frames(&mut self, event: Event) -> Vec<Json> {
        let mut out = Vec::new();
        match event {
            Event::Logprob { index, logprob } => self.choice(index).logprobs.push(logprob),
            Event::Text {
                index,
                text,
                tokens,
                slot,
                timings,
            } => {
                let choice = self.choice(index);
                choice.slot = slot;
                choice.n_streamed += tokens.len();
                choice.has_new_line |= text.contains('\n');
                let timings = timings.filter(|_| self.reply.llama.timings_per_token);
                if self.reply.endpoint == Endpoint::Native {
                    let lps = std::mem::take(&mut self.choice(index).logprobs);
                    let mut body = self.native_chunk(index, &text, tokens, Some(&lps));
                    if let Some(t) = &timings {
                        body["timings"] = timings_json(t);
                    }
                    out.push(body);
                    return out;
                }
                self.open(index, &mut out);
                self.timings_now = timings;
                let parts: Vec<Part> = if self.reads_harmony() {
                    let deltas = self.choice(index).harmony_stream.push(&text);
                    deltas.into_iter().map(|(_, d)| d.into()).collect()
                } else {
                    self.content_parts(index, Some(&text))
                };
                self.parts(index, parts, &mut out);
                self.timings_now = None;
            }
            Event::Progress {
                index,
                total,
                cache,
                processed,
                timings,
            } => {
                let mut body = match self.reply.endpoint {
                    Endpoint::Native => self.native_chunk(index, "", Vec::new(), None),
                    // As llama-server sends it: the role, with null content, beside the progress.
                    Endpoint::Chat => self.reply.envelope(
                        true,
                        vec![json!({"index": index, "delta": {"role": "assistant", "content": null},
                                    "logprobs": null, "finish_reason": null})],
                    ),
                    Endpoint::Completion => self.reply.envelope(
                        true,
                        vec![json!({"index": index, "text": "", "logprobs": null, "finish_reason": null})],
                    ),
                };
                body["prompt_progress"] = json!({
                    "total": total,
                    "cache": cache,
                    "processed": processed,
                    "time_ms": timings.prompt.as_millis() as u64,
                });
                if self.reply.llama.timings_per_token {
                    body["timings"] = timings_json(&timings);
                }
                out.push(body);
            }
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
                slot,
                tokens,
                n_cells,
                timings,
                stopping_word,
            } => {
                self.open(index, &mut out);
                if self.reads_harmony() {
                    let deltas = self.choice(index).harmony_stream.finish();
                    self.parts(index, deltas.into_iter().map(|(_, d)| d.into()), &mut out);
                } else {
                    let parts = self.content_parts(index, None);
                    self.parts(index, parts, &mut out);
                }
                self.usage.add(index, self.reply.n, n_prompt, n_cached, n_generated);
                let lps = self.pending_logprobs(index, 0);
                let choice = self.choice(index);
                choice.reason = Some(reason);
                choice.stopping_word = stopping_word.clone();
                (choice.n_prompt, choice.n_cached, choice.n_generated) = (n_prompt, n_cached, n_generated);
                (choice.tokens, choice.slot, choice.n_cells, choice.timings) = (tokens, slot, n_cells, timings);
                let n_calls = choice.n_calls;
                if self.reply.endpoint == Endpoint::Native {
                    out.push(self.reply.native_final(index, &self.choices[&index], true));
                    return out;
                }
                let finish = finish_reason(Some(reason), n_calls > 0);
                let delta = if self.reply.endpoint == Endpoint::Chat {
                    json!({})
                } else {
                    json!({"content": ""})
                };
                // A run's last chunk carries its timings, as llama-server's does.
                self.timings_now = Some(timings);
                let mut chunk = self.chunk(index, delta, lps, Some(finish));
                if self.reply.for_dialect {
                    chunk["choices"][0]["stop_type"] = json!(stop_type(Some(reason)));
                    chunk["choices"][0]["stopping_word"] = json!(stopping_word);
                }
                out.push(chunk);
                self.timings_now = None;
            }
            Event::Failed(message) => {
                self.failed = true;
                out.push(ApiError::internal(format!("generation failed: {message}")).body());
            }
            Event::Refused(message) => {
                self.failed = true;
                out.push(refused(&message).body());
            }
        }
        out
    }

    /// The frames after the last event: the usage chunk if asked for (none after a failure,
    /// nor on llama-server's own stream).
    pub fn finish_frames(&mut self) -> Vec<Json> {
        if self.failed || self.reply.endpoint == Endpoint::Native || !self.reply.include_usage {
            return Vec::new();
        }
        let mut body = self.reply.envelope(true, Vec::new());
        body["usage"] = self.usage.json();
        body["timings"] = timings_json(&combined(self.choices.values().map(|c| c.timings)));
        vec![body]
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
            think: None,
            llama: LlamaReply::default(),
            for_dialect: false,
        }
    }

    /// A reply of a model that speaks harmony.
    fn harmony_reply(endpoint: Endpoint, tools: &[&str]) -> Reply {
        Reply {
            harmony: true,
            think: None,
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
            slot: 0,
            tokens: vec![7; n_generated],
            n_cells: 10 + n_generated,
            stopping_word: String::new(),
            timings: RunTimings {
                n_prompt: 6,
                n_cached: 4,
                prompt: std::time::Duration::from_millis(20),
                n_generated,
                gen: std::time::Duration::from_millis(10 * n_generated as u64),
                ..Default::default()
            },
        }
    }

    /// Some text of choice 0, as the slot sends it.
    fn text_event(piece: &str) -> Event {
        Event::Text {
            index: 0,
            text: piece.into(),
            tokens: vec![7],
            slot: 0,
            timings: None,
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
        let mut out = s.push(text_event("Hi"));
        out += &s.push(done(StopReason::MaxTokens, 1));
        out += &s.finish();
        assert!(out.ends_with("data: [DONE]\n\n"));
        let f = frames(&out);
        assert_eq!(
            f[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": null})
        );
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
            out += &s.push(text_event(piece));
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
        c.push(text_event("Hello")).unwrap();
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
        c.push(text_event(text)).unwrap();
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
            out += &s.push(text_event(&piece.iter().collect::<String>()));
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
                    json!({"role": "assistant", "content": null})
                );
                let sent = serde_json::to_string(&frames).unwrap();
                assert!(harmony::MARKERS.iter().all(|m| !sent.contains(m)), "{sent}");
            }
        }
    }

    /// A reply of a thinking model (`<think>` tags).
    fn think_reply(tools: &[&str], opened: bool, legacy: bool) -> Reply {
        let tags = ThinkTags::of_template("<think></think>").unwrap();
        Reply {
            think: Some(Think { tags, opened, legacy }),
            ..reply(Endpoint::Chat, tools)
        }
    }

    #[test]
    fn a_thinking_models_reply_puts_its_reasoning_in_reasoning_content_whole_and_streamed() {
        let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";
        let with_call = format!("<think>\nWeather needed.\n</think>\n\n{call}");
        for (text, tools, opened, content, reasoning) in [
            (
                "<think>\nTwo and two.\n</think>\n\nIt is 4.",
                &[][..],
                false,
                json!("It is 4."),
                json!("Two and two."),
            ),
            (
                "Two and two.\n</think>\nIt is 4.",
                &[][..],
                true,
                json!("It is 4."),
                json!("Two and two."),
            ),
            ("No tags here.", &[][..], false, json!("No tags here."), Json::Null),
            ("<think>\n\n</think>\n\nHi", &[][..], false, json!("Hi"), Json::Null),
            (
                with_call.as_str(),
                &["get_weather"][..],
                false,
                Json::Null,
                json!("Weather needed."),
            ),
        ] {
            let whole = collect(think_reply(tools, opened, false), text, StopReason::EndOfGeneration);
            let message = &whole["choices"][0]["message"];
            assert_eq!(
                (&message["content"], &message["reasoning_content"]),
                (&content, &reasoning),
                "{text}"
            );
            assert_eq!(
                message["tool_calls"].as_array().map_or(0, Vec::len),
                tools.len(),
                "{text}"
            );
            for size in [1, 3, 7, 1000] {
                let (_, got) = stream(
                    think_reply(tools, opened, false),
                    text,
                    size,
                    StopReason::EndOfGeneration,
                );
                assert_eq!(
                    got["content"],
                    content.as_str().unwrap_or(""),
                    "{text} in pieces of {size}"
                );
                assert_eq!(
                    got["reasoning_content"],
                    reasoning.as_str().unwrap_or(""),
                    "{text} in pieces of {size}"
                );
                assert_eq!(got["calls"].as_array().unwrap().len(), tools.len());
            }
        }
        // deepseek-legacy: the reasoning is split out and the content keeps it as generated.
        let text = "<think>a</think>b";
        let legacy = collect(think_reply(&[], false, true), text, StopReason::EndOfGeneration);
        assert_eq!(legacy["choices"][0]["message"]["content"], text);
        assert_eq!(legacy["choices"][0]["message"]["reasoning_content"], "a");
        let (_, got) = stream(think_reply(&[], false, true), text, 2, StopReason::EndOfGeneration);
        assert_eq!(
            (&got["content"], &got["reasoning_content"]),
            (&json!(text), &json!("a"))
        );
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

    fn native_reply(llama: LlamaReply) -> Reply {
        Reply {
            llama,
            ..reply(Endpoint::Native, &[])
        }
    }

    fn llama_reply() -> LlamaReply {
        LlamaReply {
            settings: Arc::new(json!({"seed": 42, "n_predict": 8})),
            prompts: vec!["<s> Hi".into()],
            n_prompt: vec![10],
            ..Default::default()
        }
    }

    fn keys(v: &Json) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn timings_count_decode_steps_not_the_first_token_and_are_always_finite() {
        let t = RunTimings {
            n_prompt: 8,
            n_cached: 2,
            prompt: std::time::Duration::from_millis(40),
            n_generated: 16,
            gen: std::time::Duration::from_millis(150),
            ..Default::default()
        };
        let j = timings_json(&t);
        assert_eq!(j["prompt_n"], 8);
        assert_eq!(j["cache_n"], 2);
        assert_eq!(j["prompt_ms"], 40.0);
        assert_eq!(j["prompt_per_token_ms"], 5.0);
        assert_eq!(j["prompt_per_second"], 200.0);
        assert_eq!(j["predicted_n"], 16);
        assert_eq!(j["predicted_ms"], 150.0);
        assert_eq!(j["predicted_per_token_ms"], 10.0);
        assert_eq!(j["predicted_per_second"], 1e3 / 150.0 * 15.0);
        assert!(j.get("draft_n").is_none());
        // One token took no step: no rate, not a division by zero.
        let one = timings_json(&RunTimings { n_generated: 1, ..t });
        assert_eq!(one["predicted_per_second"], 0.0);
        assert_eq!(one["predicted_per_token_ms"], 0.0);
        let none = timings_json(&RunTimings::default());
        for (k, v) in none.as_object().unwrap() {
            assert!(v.as_f64().is_some_and(|x| x == 0.0), "{k}: {v}");
        }
        let drafted = timings_json(&RunTimings {
            n_drafted: 5,
            n_accepted: 3,
            ..t
        });
        assert_eq!(
            (drafted["draft_n"].clone(), drafted["draft_n_accepted"].clone()),
            (json!(5), json!(3))
        );
    }

    #[test]
    fn a_native_answer_has_llama_servers_sixteen_keys_and_its_frames_their_seven() {
        let body = collect(native_reply(llama_reply()), "Hello\nthere", StopReason::MaxTokens);
        assert_eq!(
            keys(&body),
            [
                "content",
                "generation_settings",
                "has_new_line",
                "id_slot",
                "index",
                "model",
                "prompt",
                "stop",
                "stop_type",
                "stopping_word",
                "timings",
                "tokens",
                "tokens_cached",
                "tokens_evaluated",
                "tokens_predicted",
                "truncated"
            ]
        );
        assert_eq!(body["content"], "Hello\nthere");
        assert_eq!(body["tokens"], json!([]));
        assert_eq!(body["has_new_line"], true);
        assert_eq!(body["truncated"], false);
        assert_eq!(body["stop_type"], "limit");
        assert_eq!(body["prompt"], "<s> Hi");
        assert_eq!(body["generation_settings"]["seed"], 42);
        assert_eq!(body["tokens_cached"], 40);
        assert_eq!(body["timings"]["prompt_n"], 6);
        // With return_tokens, the ids; a full context is a truncated limit.
        let with_tokens = LlamaReply {
            return_tokens: true,
            ..llama_reply()
        };
        let body = collect(native_reply(with_tokens), "Hi", StopReason::ContextFull);
        assert_eq!(body["tokens"], json!(vec![7; 30]));
        assert_eq!(
            (body["truncated"].clone(), body["stop_type"].clone()),
            (json!(true), json!("limit"))
        );
        // Streamed: frames with the tokens of their text, then the final object without text.
        let (frames, _) = stream(native_reply(llama_reply()), "Hi there", 3, StopReason::EndOfGeneration);
        let (last, pieces) = frames.split_last().unwrap();
        for f in pieces {
            assert_eq!(
                keys(f),
                [
                    "content",
                    "id_slot",
                    "index",
                    "stop",
                    "tokens",
                    "tokens_evaluated",
                    "tokens_predicted"
                ]
            );
            assert_eq!((f["stop"].clone(), f["tokens"].clone()), (json!(false), json!([7])));
            assert_eq!(f["tokens_evaluated"], 10);
        }
        assert_eq!(pieces.last().unwrap()["tokens_predicted"], pieces.len());
        assert_eq!(
            (last["stop"].clone(), last["content"].clone()),
            (json!(true), json!(""))
        );
        assert_eq!(last["stop_type"], "eos");
    }

    #[test]
    fn response_fields_keep_only_the_paths_asked_for_each_under_its_path() {
        let llama = LlamaReply {
            response_fields: vec!["content".into(), "generation_settings/n_predict".into(), "nope".into()],
            ..llama_reply()
        };
        let body = collect(native_reply(llama), "Hi", StopReason::MaxTokens);
        assert_eq!(body, json!({"content": "Hi", "generation_settings/n_predict": 8}));
    }

    #[test]
    fn several_native_outputs_are_an_array_in_their_order() {
        let mut c = Collector::new(Reply {
            n: 2,
            ..native_reply(llama_reply())
        });
        for index in [1, 0] {
            c.push(Event::Text {
                index,
                text: format!("run {index}"),
                tokens: vec![7],
                slot: index,
                timings: None,
            })
            .unwrap();
            let Event::Done {
                reason,
                n_prompt,
                n_cached,
                n_generated,
                tokens,
                n_cells,
                timings,
                ..
            } = done(StopReason::MaxTokens, 1)
            else {
                unreachable!()
            };
            c.push(Event::Done {
                index,
                reason,
                n_prompt,
                n_cached,
                n_generated,
                slot: index,
                tokens,
                n_cells,
                timings,
                stopping_word: String::new(),
            })
            .unwrap();
        }
        let body = c.finish(2).unwrap();
        let outputs = body.as_array().unwrap();
        assert_eq!(outputs.len(), 2);
        for (i, out) in outputs.iter().enumerate() {
            assert_eq!((out["index"].clone(), out["id_slot"].clone()), (json!(i), json!(i)));
            assert_eq!(out["content"], format!("run {i}"));
        }
    }

    #[test]
    fn openai_answers_carry_timings_and_a_build_fingerprint_whole_and_streamed() {
        for endpoint in [Endpoint::Chat, Endpoint::Completion] {
            let body = collect(reply(endpoint, &[]), "Hi", StopReason::MaxTokens);
            assert_eq!(body["timings"]["predicted_n"], 30);
            assert!(body["system_fingerprint"].as_str().unwrap().starts_with('b'));
            assert!(body.get("__verbose").is_none());
            let (frames, _) = stream(reply(endpoint, &[]), "Hi there", 2, StopReason::MaxTokens);
            // The finishing chunk carries its run's timings, the usage chunk the answer's.
            let finish = frames
                .iter()
                .find(|f| f["choices"][0]["finish_reason"].is_string())
                .unwrap();
            assert_eq!(finish["timings"]["predicted_n"], 30);
            let usage = frames.last().unwrap();
            assert_eq!(usage["choices"], json!([]));
            assert_eq!(usage["timings"]["prompt_n"], 6);
            assert!(frames
                .iter()
                .all(|f| f["system_fingerprint"].as_str().unwrap().starts_with('b')));
        }
        // verbose: llama-server's own answer beside OpenAI's.
        let verbose = Reply {
            llama: LlamaReply {
                verbose: true,
                ..llama_reply()
            },
            ..reply(Endpoint::Chat, &[])
        };
        let body = collect(verbose, "Hi", StopReason::MaxTokens);
        assert_eq!(body["__verbose"]["prompt"], "<s> Hi");
        assert_eq!(body["__verbose"]["content"], "Hi");
    }

    #[test]
    fn log_probabilities_carry_token_ids_and_after_the_chain_are_probabilities() {
        let lp = TokenLogprob {
            token: 9,
            logprob: -0.5,
            top: vec![(9, -0.5), (3, -1.0)],
        };
        let with = |post: bool, endpoint: Endpoint| {
            let mut c = Collector::new(Reply {
                llama: LlamaReply {
                    post_sampling_probs: post,
                    ..llama_reply()
                },
                ..reply(endpoint, &[])
            });
            c.push(Event::Logprob {
                index: 0,
                logprob: lp.clone(),
            })
            .unwrap();
            c.push(text_event("x")).unwrap();
            c.push(done(StopReason::MaxTokens, 1)).unwrap();
            c.finish(1).unwrap()
        };
        let chat = with(false, Endpoint::Chat);
        let entry = &chat["choices"][0]["logprobs"]["content"][0];
        assert_eq!((entry["id"].clone(), entry["logprob"].clone()), (json!(9), json!(-0.5)));
        assert_eq!(entry["top_logprobs"][1]["id"], 3);
        let native = with(false, Endpoint::Native);
        let entry = &native["completion_probabilities"][0];
        assert_eq!(entry["id"], 9);
        assert_eq!(entry["top_logprobs"].as_array().unwrap().len(), 2);
        let post = with(true, Endpoint::Native);
        let entry = &post["completion_probabilities"][0];
        assert!((entry["prob"].as_f64().unwrap() - (-0.5f64).exp()).abs() < 1e-6);
        assert_eq!(entry["top_probs"][1]["id"], 3);
        assert!(entry.get("logprob").is_none());
        // The legacy completions object keeps OpenAI's arrays and adds llama-server's entries.
        let legacy = with(false, Endpoint::Completion);
        let lps = &legacy["choices"][0]["logprobs"];
        assert_eq!(lps["token_logprobs"], json!([-0.5]));
        assert_eq!(lps["content"][0]["id"], 9);
    }

    #[test]
    fn prompt_progress_is_a_frame_of_each_endpoints_own_shape() {
        let progress = Event::Progress {
            index: 0,
            total: 100,
            cache: 20,
            processed: 60,
            timings: RunTimings {
                n_prompt: 40,
                n_cached: 20,
                prompt: std::time::Duration::from_millis(12),
                ..Default::default()
            },
        };
        for endpoint in [Endpoint::Chat, Endpoint::Completion, Endpoint::Native] {
            let out = Streamer::new(reply(endpoint, &[])).push(progress.clone());
            let f = &frames(&out)[0];
            assert_eq!(
                f["prompt_progress"],
                json!({"total": 100, "cache": 20, "processed": 60, "time_ms": 12})
            );
            assert!(f.get("timings").is_none());
            if endpoint == Endpoint::Chat {
                assert_eq!(f["choices"][0]["delta"], json!({"role": "assistant", "content": null}));
            }
        }
        let per_token = Reply {
            llama: LlamaReply {
                timings_per_token: true,
                ..llama_reply()
            },
            ..reply(Endpoint::Native, &[])
        };
        let out = Streamer::new(per_token).push(progress);
        assert_eq!(frames(&out)[0]["timings"]["prompt_n"], 40);
    }
}
