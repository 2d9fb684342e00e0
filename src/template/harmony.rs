//! OpenAI's harmony format in generated text (gpt-oss): the reply's messages split into what a
//! client expects apart — the `analysis` channel to reasoning, the `final` channel (and
//! `commentary` addressed to no function, the preambles) to content, and messages addressed
//! `to=functions.NAME` to tool calls — for a whole reply and incrementally for a stream.
//!
//! A reply continues the prompt's `<|start|>assistant`, so its first message opens at its
//! header (`<|channel|>analysis<|message|>…`); later ones repeat `<|start|>assistant`. A header
//! is the role, an optional `to=RECIPIENT`, `<|channel|>` and the channel, and an optional
//! content type (`json`, or `<|constrain|>json`); the body runs to `<|end|>`, `<|return|>` or
//! `<|call|>`, or to a `<|start|>` or `<|channel|>` that opens the next header without one. A
//! reply cut short (a token limit) ends inside a body, which is kept, or inside a header, which
//! is dropped (it has no text yet).
//!
//! What is not harmony — text where a header must be, a header that cannot become one, an
//! unknown channel — is never a panic: the split goes on as plain text. Everything read before
//! the fault keeps its fields; from the fault on, the rest of the reply is content with
//! harmony's markers taken out (what a model that does not speak harmony would show, its
//! control tokens unprinted), and the first fault is kept as a [`HarmonyError`] naming it. A
//! stream and a whole reply give the same fields, whatever the pieces, faults included.
//!
//! This file knows only the text format; it never decides that a model speaks harmony (the chat
//! template does: [`super::ChatTemplate::is_harmony`]) and renders nothing (the model's own
//! template does).

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";

/// Every marker of the format, which no client-facing text may hold.
pub const MARKERS: [&str; 7] = [START, END, MESSAGE, CHANNEL, CONSTRAIN, RETURN, CALL];

/// The longest header read: far beyond any role, recipient and content type, and a bound on
/// what a stream holds back while it waits for `<|message|>`.
const MAX_HEADER: usize = 1024;

/// A tool call: the function named by the message's recipient, its arguments as the JSON text
/// the model wrote (OpenAI's `tool_calls[].function`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function (`NAME` of `to=functions.NAME`).
    pub name: String,
    /// The message's body.
    pub arguments: String,
}

/// Why a reply is not well-formed harmony.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HarmonyError {
    /// A message names a channel other than analysis, commentary and final.
    #[error("harmony: unknown channel '{channel}' at byte {at}")]
    UnknownChannel {
        /// The channel as written.
        channel: String,
        /// Where its header starts in the reply.
        at: usize,
    },
    /// A header that cannot become one, or text where a header must be.
    #[error("harmony: malformed message header {header:?} at byte {at}")]
    BadHeader {
        /// The header text (or the stray text), as far as it was read.
        header: String,
        /// Where it starts in the reply.
        at: usize,
    },
}

/// A whole reply, split.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarmonyReply {
    /// The `analysis` channel's text, messages joined by newlines.
    pub reasoning: String,
    /// The `final` channel's text and unaddressed `commentary`, then, after a fault, the rest
    /// of the reply as plain text.
    pub content: String,
    /// Messages to `functions.NAME`, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The first place the reply stopped being harmony, if it did.
    pub error: Option<HarmonyError>,
}

/// One part of a streamed reply, as it becomes known.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// More reasoning text (a newline first where a new `analysis` message follows another).
    Reasoning(String),
    /// More content text.
    Content(String),
    /// A complete tool call (its arguments known at the end of its message).
    Call(ToolCall),
}

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq)]
enum Sink {
    Reasoning,
    Content,
    Call(String),
}

/// The sink of a header (`assistant to=functions.f<|channel|>commentary <|constrain|>json`),
/// which begins at byte `at` of the reply. The last `<|channel|>` names the channel: gpt-oss
/// sometimes writes a stray `<|channel|>commentary` before the real one (llama.cpp reads it so).
fn sink(header: &str, at: usize) -> Result<Sink, HarmonyError> {
    let bad = || HarmonyError::BadHeader {
        header: header.to_string(),
        at,
    };
    let (role_part, channel_part) = header.rsplit_once(CHANNEL).ok_or_else(bad)?;
    let channel_part = channel_part.replace(CONSTRAIN, " ");
    let mut words = channel_part.split_whitespace();
    let channel = words.next().ok_or_else(bad)?;
    // The recipient may be in either part of the header.
    let recipient = role_part
        .split_whitespace()
        .chain(words)
        .find_map(|w| w.strip_prefix("to="))
        .map(str::to_string);
    let function = recipient
        .as_deref()
        .and_then(|to| to.strip_prefix("functions."))
        .filter(|name| !name.is_empty());
    match (channel, function) {
        // llama.cpp takes a call on either channel.
        ("analysis" | "commentary", Some(name)) => Ok(Sink::Call(name.to_string())),
        ("analysis", None) => Ok(Sink::Reasoning),
        // A message to anyone else (a built-in tool's) is text, not a function call.
        ("final" | "commentary", None) | ("final", Some(_)) => Ok(Sink::Content),
        (other, _) => Err(HarmonyError::UnknownChannel {
            channel: other.to_string(),
            at,
        }),
    }
}

/// Whether `text`, read where a header begins and holding no `<|message|>`, may still become
/// a header: `[<|start|>ROLE] ( to=RECIPIENT)* [<|channel|>…]`, where what follows the channel
/// holds no `<|start|>`, `<|end|>`, `<|return|>` or `<|call|>`. Checked as the text arrives,
/// so that a reply that is not harmony streams as plain text at once instead of at its end.
fn may_be_header(text: &str) -> bool {
    if text.len() > MAX_HEADER {
        return false;
    }
    if START.starts_with(text) {
        return true;
    }
    let mut rest = text;
    if let Some(role) = rest.strip_prefix(START) {
        rest = role.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || "_-.:".contains(c));
    }
    loop {
        if CHANNEL.starts_with(rest) {
            return true;
        }
        if let Some(tail) = rest.strip_prefix(CHANNEL) {
            return ![START, END, RETURN, CALL].iter().any(|m| tail.contains(m));
        }
        // ` to=RECIPIENT`, after at least one space.
        let after_space = rest.trim_start();
        if after_space.len() == rest.len() {
            return false;
        }
        if "to=".starts_with(after_space) {
            return true;
        }
        let Some(recipient) = after_space.strip_prefix("to=") else {
            return false;
        };
        rest = recipient.trim_start_matches(|c: char| !c.is_whitespace() && c != '<');
    }
}

/// Whether `text` may still open a message: a header so far, perhaps followed by the first
/// bytes of `<|message|>`.
fn may_open(text: &str) -> bool {
    may_be_header(text)
        || (1..MESSAGE.len().min(text.len() + 1))
            .filter(|&n| text.is_char_boundary(text.len() - n))
            .any(|n| MESSAGE.starts_with(&text[text.len() - n..]) && may_be_header(&text[..text.len() - n]))
}

/// The fault of `text` (the rest of the reply from byte `at`, where a header cannot open): named
/// by its shortest part that already cannot, which a stream sees as soon as a whole reply does.
fn bad_header(text: &str, at: usize) -> HarmonyError {
    let end = (1..=text.len())
        .filter(|&n| text.is_char_boundary(n))
        .find(|&n| !may_open(&text[..n]))
        .unwrap_or(text.len());
    HarmonyError::BadHeader {
        header: text[..end].to_string(),
        at,
    }
}

/// Split a whole reply (the text after the prompt's `<|start|>assistant`). Never fails: a fault
/// is kept in [`HarmonyReply::error`] and the rest of the reply is content.
pub fn parse(text: &str) -> HarmonyReply {
    let mut stream = HarmonyStream::new();
    let mut deltas = stream.push(text);
    deltas.extend(stream.finish());
    let mut reply = HarmonyReply {
        error: stream.error().cloned(),
        ..Default::default()
    };
    for (_, delta) in deltas {
        match delta {
            Delta::Reasoning(t) => reply.reasoning.push_str(&t),
            Delta::Content(t) => reply.content.push_str(&t),
            Delta::Call(c) => reply.tool_calls.push(c),
        }
    }
    reply
}

/// `text` with harmony's markers taken out (again, where taking one out joins another).
pub fn strip_markers(text: &str) -> String {
    let mut out = text.to_string();
    while let Some(marker) = MARKERS.iter().find(|m| out.contains(*m)) {
        out = out.replace(marker, "");
    }
    out
}

/// A streamed reply: text in as it is generated, [`Delta`]s out, each with the index of the
/// message it belongs to. A marker split across pushes is held back until it is whole.
#[derive(Debug, Default)]
pub struct HarmonyStream {
    /// Text received and not yet consumed (a partial header, body or marker).
    pending: String,
    /// Bytes of the reply consumed before `pending`.
    consumed: usize,
    /// The body being read, with its message's index; `None` between messages.
    body: Option<(usize, Sink)>,
    /// A tool call's arguments so far.
    arguments: String,
    /// Messages opened so far.
    messages: usize,
    /// The message of the last reasoning sent, to put a newline between two messages' text.
    last_reasoning: Option<usize>,
    /// The first fault; from it on, everything is plain content (message index `messages`).
    error: Option<HarmonyError>,
}

impl HarmonyStream {
    /// A stream at the start of a reply (inside the first message's header).
    pub fn new() -> Self {
        Self::default()
    }

    /// The first place the reply stopped being harmony, if it has.
    pub fn error(&self) -> Option<&HarmonyError> {
        self.error.as_ref()
    }

    /// The deltas `text` completes.
    pub fn push(&mut self, text: &str) -> Vec<(usize, Delta)> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        if self.error.is_none() {
            if let Err(error) = self.read(&mut out) {
                self.fail(error, &mut out);
            }
        }
        if self.error.is_some() {
            self.plain(&mut out, false);
        }
        out
    }

    /// The end of the reply: a body cut short is kept (a call's arguments as far as they got),
    /// a header cut short is dropped, and stray text is plain content.
    pub fn finish(&mut self) -> Vec<(usize, Delta)> {
        let mut out = Vec::new();
        if self.error.is_none() {
            let rest = std::mem::take(&mut self.pending);
            match self.body.take() {
                Some((message, sink)) => self.close(&mut out, message, sink, &rest),
                None if may_open(&rest) => {}
                None => {
                    let error = bad_header(&rest, self.consumed);
                    self.pending = rest;
                    self.fail(error, &mut out);
                }
            }
        }
        if self.error.is_some() {
            self.plain(&mut out, true);
        }
        out
    }

    /// Reads headers and bodies from `pending` while they are whole.
    fn read(&mut self, out: &mut Vec<(usize, Delta)>) -> Result<(), HarmonyError> {
        loop {
            match self.body.take() {
                None => {
                    // A header: up to `<|message|>`, after an optional `<|start|>`.
                    let at = self.consumed;
                    let Some(end) = self.pending.find(MESSAGE) else {
                        if may_open(&self.pending) {
                            return Ok(());
                        }
                        return Err(bad_header(&self.pending, at));
                    };
                    let raw = &self.pending[..end];
                    if !may_be_header(raw) {
                        return Err(bad_header(&self.pending, at));
                    }
                    let sink = sink(raw.strip_prefix(START).unwrap_or(raw), at)?;
                    self.body = Some((self.messages, sink));
                    self.messages += 1;
                    self.take(end + MESSAGE.len());
                }
                Some((message, sink)) => {
                    // Closed by its end marker, or by the next header where the end is missing.
                    let ends = [END, RETURN, CALL].map(|m| self.pending.find(m).map(|i| (i, m.len())));
                    let opens = [START, CHANNEL].map(|m| self.pending.find(m).map(|i| (i, 0)));
                    match ends.into_iter().chain(opens).flatten().min() {
                        Some((i, len)) => {
                            let body = self.pending[..i].to_string();
                            self.close(out, message, sink, &body);
                            self.take(i + len);
                        }
                        None => {
                            // All but what may be the start of a marker.
                            let keep = partial_marker(&self.pending);
                            let body = self.pending[..self.pending.len() - keep].to_string();
                            self.emit(out, message, &sink, &body);
                            self.take(self.pending.len() - keep);
                            self.body = Some((message, sink));
                            return Ok(());
                        }
                    }
                }
            }
        }
    }

    /// Ends a message with the last of its body: a call goes out whole.
    fn close(&mut self, out: &mut Vec<(usize, Delta)>, message: usize, sink: Sink, body: &str) {
        self.emit(out, message, &sink, body);
        if let Sink::Call(name) = sink {
            let arguments = std::mem::take(&mut self.arguments);
            out.push((message, Delta::Call(ToolCall { name, arguments })));
        }
    }

    fn fail(&mut self, error: HarmonyError, out: &mut Vec<(usize, Delta)>) {
        // A call cut off by the fault still goes out with what it had.
        if let Some((message, sink)) = self.body.take() {
            self.close(out, message, sink, "");
        }
        self.error = Some(error);
        self.messages += 1;
    }

    /// After a fault: what is pending as plain content, a possible partial marker held back
    /// unless the reply has ended.
    fn plain(&mut self, out: &mut Vec<(usize, Delta)>, end: bool) {
        let keep = if end { 0 } else { partial_marker(&self.pending) };
        let text = strip_markers(&self.pending[..self.pending.len() - keep]);
        if !text.is_empty() {
            out.push((self.messages - 1, Delta::Content(text)));
        }
        self.take(self.pending.len() - keep);
    }

    fn emit(&mut self, out: &mut Vec<(usize, Delta)>, message: usize, sink: &Sink, text: &str) {
        // A stray `<|message|>` or `<|constrain|>` in a body is no part of its text.
        let text = strip_markers(text);
        if text.is_empty() {
            return;
        }
        match sink {
            Sink::Reasoning => {
                let newline = self.last_reasoning.is_some_and(|m| m != message);
                self.last_reasoning = Some(message);
                let text = if newline { format!("\n{text}") } else { text };
                out.push((message, Delta::Reasoning(text)));
            }
            Sink::Content => out.push((message, Delta::Content(text))),
            Sink::Call(_) => self.arguments.push_str(&text),
        }
    }

    fn take(&mut self, n: usize) {
        self.pending.drain(..n);
        self.consumed += n;
    }
}

/// Bytes at the end of `text` that could begin a marker (`<`, `<|`, `<|en`, …).
fn partial_marker(text: &str) -> usize {
    let longest = MARKERS.iter().map(|m| m.len()).max().unwrap_or(0);
    (1..=text.len().min(longest - 1))
        .rev()
        .filter(|&n| text.is_char_boundary(text.len() - n))
        .find(|&n| {
            let tail = &text[text.len() - n..];
            MARKERS.iter().any(|m| m.starts_with(tail))
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reasoning, a preamble, a tool call with its recipient after the channel, and (in the
    /// next turn's reply) the final answer — built from the format's specification.
    const REPLY: &str = "<|channel|>analysis<|message|>User asks for the weather in SF. \
        Need to call the tool.<|end|><|start|>assistant<|channel|>commentary<|message|>Checking \
        the forecast.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather \
        <|constrain|>json<|message|>{\"location\":\"San Francisco\"}<|call|>";

    /// `parse`, asserting that the reply is harmony throughout.
    fn well_formed(text: &str) -> HarmonyReply {
        let r = parse(text);
        assert_eq!(r.error, None, "{text:?}");
        r
    }

    /// The reply fed to a stream in pieces of `size` characters, its deltas gathered.
    fn streamed(text: &str, size: usize) -> HarmonyReply {
        let mut stream = HarmonyStream::new();
        let mut deltas = Vec::new();
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(size) {
            deltas.extend(stream.push(&piece.iter().collect::<String>()));
        }
        deltas.extend(stream.finish());
        let mut got = HarmonyReply {
            error: stream.error().cloned(),
            ..Default::default()
        };
        for (_, d) in deltas {
            match d {
                Delta::Reasoning(t) => got.reasoning.push_str(&t),
                Delta::Content(t) => got.content.push_str(&t),
                Delta::Call(c) => got.tool_calls.push(c),
            }
            // No marker ever leaks into the text.
            for text in [&got.content, &got.reasoning] {
                assert!(MARKERS.iter().all(|m| !text.contains(m)), "{size}: {text:?}");
            }
        }
        got
    }

    #[test]
    fn a_reply_splits_into_reasoning_content_and_a_tool_call() {
        let r = well_formed(REPLY);
        assert_eq!(r.reasoning, "User asks for the weather in SF. Need to call the tool.");
        assert_eq!(r.content, "Checking the forecast.");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: "{\"location\":\"San Francisco\"}".into()
            }]
        );
        let r = well_formed(
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 20 °C.<|return|>",
        );
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Easy.", "It is 20 °C."));
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn the_recipient_may_come_before_the_channel_and_the_type_without_constrain() {
        let r = well_formed("<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>");
        assert_eq!(r.tool_calls[0].name, "lookup");
        assert_eq!(r.tool_calls[0].arguments, "{}");
        // The first message of a reply, right after the prompt's `<|start|>assistant`.
        let r = well_formed(" to=functions.lookup<|channel|>commentary json<|message|>{\"q\":1}");
        assert_eq!(r.tool_calls[0].arguments, "{\"q\":1}");
    }

    #[test]
    fn a_call_on_the_analysis_channel_and_a_stray_commentary_channel_read_as_llama_cpp_reads_them() {
        let r = well_formed("<|channel|>analysis to=functions.f<|message|>{}<|call|>");
        assert_eq!(r.tool_calls[0].name, "f");
        assert!(r.reasoning.is_empty());
        let r = well_formed("<|channel|>commentary<|channel|>analysis<|message|>Hmm.<|end|>");
        assert_eq!(r.reasoning, "Hmm.");
        // A built-in tool's recipient is no function call.
        let r = well_formed("<|channel|>commentary to=browser.search<|message|>q<|end|>");
        assert_eq!((r.content.as_str(), r.tool_calls.len()), ("q", 0));
    }

    #[test]
    fn reasoning_messages_are_joined_by_a_newline_streamed_or_whole() {
        let text =
            "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>";
        assert_eq!(well_formed(text).reasoning, "One.\nTwo.");
        assert_eq!(streamed(text, 3).reasoning, "One.\nTwo.");
    }

    #[test]
    fn streamed_in_any_pieces_the_reply_gives_the_same_fields() {
        let whole = parse(REPLY);
        for size in [1, 2, 3, 5, 7, 13, 64] {
            assert_eq!(streamed(REPLY, size), whole, "pieces of {size}");
        }
    }

    #[test]
    fn a_reply_cut_short_keeps_its_body_and_drops_its_header() {
        assert_eq!(
            well_formed("<|channel|>analysis<|message|>Let me th").reasoning,
            "Let me th"
        );
        let r = well_formed("<|channel|>commentary to=functions.f json<|message|>{\"a\":");
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":");
        for cut in ["<|channel|>analysis", "<|start|>assist", " to=fun", "<|ch", ""] {
            assert_eq!(parse(cut).error, None, "{cut:?}");
        }
        let r = well_formed("<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>fi");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Done.", ""));
    }

    #[test]
    fn a_missing_end_marker_ends_the_message_at_the_next_header() {
        let r = well_formed("<|channel|>analysis<|message|>Think.<|start|>assistant<|channel|>final<|message|>Answer.");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Think.", "Answer."));
    }

    #[test]
    fn malformed_channels_and_headers_name_the_fault_and_the_rest_is_plain_content() {
        let r = parse("<|channel|>secret<|message|>x<|end|>");
        assert_eq!(
            r.error,
            Some(HarmonyError::UnknownChannel {
                channel: "secret".into(),
                at: 0
            })
        );
        assert_eq!(r.content, "secretx");
        let r = parse("plain words<|message|>x");
        assert!(matches!(r.error, Some(HarmonyError::BadHeader { at: 0, .. })));
        assert_eq!(r.content, "plain wordsx");
        // What came before the fault keeps its fields.
        let r = parse("<|channel|>analysis<|message|>Hm.<|end|>stray <|end|>text");
        assert!(matches!(r.error, Some(HarmonyError::BadHeader { at: 40, .. })), "{r:?}");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Hm.", "stray text"));
        // A model that does not write harmony at all: its text, unchanged.
        assert_eq!(parse("Hello, world.").content, "Hello, world.");
        // Whatever the bytes, no panic.
        for text in [
            "<|",
            "<|start|><|start|><|message|>",
            "<|channel|><|message|>",
            "\u{1F600}<|e",
            "<|start|>\u{1F600}<|channel|>final<|message|>é<|constrain|>",
            "",
        ] {
            let _ = parse(text);
        }
    }

    #[test]
    fn a_fault_streams_as_plain_content_at_once_and_streamed_equals_whole() {
        let text = "<|channel|>analysis<|message|>Hm.<|end|>Plain <|start|>text and a <|channel|>marker";
        let whole = parse(text);
        assert_eq!(whole.content, "Plain text and a marker");
        for size in [1, 2, 4, 9, 100] {
            assert_eq!(streamed(text, size), whole, "pieces of {size}");
        }
        // Not held back to the end: plain text comes out as it arrives.
        let mut stream = HarmonyStream::new();
        assert_eq!(stream.push("Hello"), vec![(0, Delta::Content("Hello".into()))]);
        assert!(stream.error().is_some());
    }

    #[test]
    fn random_mixes_of_markers_and_text_never_panic_never_leak_a_marker_and_stream_as_they_parse() {
        let parts = [
            START,
            END,
            MESSAGE,
            CHANNEL,
            CONSTRAIN,
            RETURN,
            CALL,
            "assistant",
            " to=functions.f",
            "analysis",
            "final",
            "commentary",
            " json",
            "é",
            "<",
            "|",
            "x y",
            "\u{1F600}",
        ];
        let mut rng = crate::test_util::XorShift(0x5eed);
        for _ in 0..2000 {
            let n = rng.below(12) as usize;
            let text: String = (0..n).map(|_| parts[rng.below(parts.len() as u64) as usize]).collect();
            let whole = parse(&text);
            let size = 1 + rng.below(6) as usize;
            assert_eq!(streamed(&text, size), whole, "{text:?} in pieces of {size}");
        }
    }
}
