//! OpenAI's harmony format in generated text (gpt-oss): the reply's messages split into what a
//! client expects apart — the `analysis` channel to reasoning, the `final` channel (and
//! `commentary` addressed to no one, the preambles) to content, and `commentary` addressed
//! `to=functions.NAME` to tool calls — for a whole reply and incrementally for a stream.
//!
//! A reply continues the prompt's `<|start|>assistant`, so its first message opens at its
//! header (`<|channel|>analysis<|message|>…`); later ones repeat `<|start|>assistant`. A header
//! is the role, an optional `to=RECIPIENT`, `<|channel|>` and the channel, and an optional
//! content type (`json`, or `<|constrain|>json`); the body runs to `<|end|>`, `<|return|>` or
//! `<|call|>`. A reply cut short (a token limit) ends inside a body, which is kept.
//!
//! This file knows only the text format; it never decides that a model speaks harmony (the
//! server will, from the template) and renders nothing (the model's own template does). Text outside any message, a header
//! without `<|message|>` at the end of the reply, or an unknown channel is an error naming it
//! ([`HarmonyError`]), never a panic; the handlers may then return the text as plain content.

const START: &str = "<|start|>";
const END: &str = "<|end|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const CONSTRAIN: &str = "<|constrain|>";
const RETURN: &str = "<|return|>";
const CALL: &str = "<|call|>";

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
    /// A header that never reaches `<|message|>`, or text where a header must be.
    #[error("harmony: malformed message header {header:?} at byte {at}")]
    BadHeader {
        /// The header text (or the stray text).
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
    /// The `final` channel's text and unaddressed `commentary`.
    pub content: String,
    /// `commentary` messages to `functions.NAME`, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// One part of a streamed reply, as it becomes known.
#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    /// More reasoning text.
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
/// which begins at byte `at` of the reply.
fn sink(header: &str, at: usize) -> Result<Sink, HarmonyError> {
    let bad = || HarmonyError::BadHeader {
        header: header.to_string(),
        at,
    };
    let (role_part, channel_part) = header.split_once(CHANNEL).ok_or_else(bad)?;
    let channel_part = channel_part.replace(CONSTRAIN, " ");
    let mut words = channel_part.split_whitespace();
    let channel = words.next().ok_or_else(bad)?;
    // The recipient may be in either part of the header.
    let recipient = role_part
        .split_whitespace()
        .chain(words)
        .find_map(|w| w.strip_prefix("to="))
        .map(str::to_string);
    match (channel, recipient) {
        ("analysis", _) => Ok(Sink::Reasoning),
        ("final", _) | ("commentary", None) => Ok(Sink::Content),
        ("commentary", Some(to)) => match to.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => Ok(Sink::Call(name.to_string())),
            _ => Ok(Sink::Content),
        },
        (other, _) => Err(HarmonyError::UnknownChannel {
            channel: other.to_string(),
            at,
        }),
    }
}

/// Split a whole reply (the text after the prompt's `<|start|>assistant`).
pub fn parse(text: &str) -> Result<HarmonyReply, HarmonyError> {
    let mut stream = HarmonyStream::new();
    let mut deltas = stream.push(text)?;
    deltas.extend(stream.finish()?);
    let mut reply = HarmonyReply::default();
    let mut last_reasoning_message = None;
    for (message, delta) in deltas {
        match delta {
            Delta::Reasoning(t) => {
                if last_reasoning_message.is_some_and(|m| m != message) {
                    reply.reasoning.push('\n');
                }
                last_reasoning_message = Some(message);
                reply.reasoning.push_str(&t);
            }
            Delta::Content(t) => reply.content.push_str(&t),
            Delta::Call(c) => reply.tool_calls.push(c),
        }
    }
    Ok(reply)
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
}

impl HarmonyStream {
    /// A stream at the start of a reply (inside the first message's header).
    pub fn new() -> Self {
        Self::default()
    }

    /// The deltas `text` completes.
    pub fn push(&mut self, text: &str) -> Result<Vec<(usize, Delta)>, HarmonyError> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.body.clone() {
                None => {
                    // A header: up to `<|message|>`, after an optional `<|start|>`.
                    let Some(end) = self.pending.find(MESSAGE) else {
                        return Ok(out);
                    };
                    let raw = &self.pending[..end];
                    let at = self.consumed;
                    let header = raw.strip_prefix(START).unwrap_or(raw);
                    if header.contains(START) || header.contains(END) {
                        return Err(HarmonyError::BadHeader {
                            header: raw.to_string(),
                            at,
                        });
                    }
                    let sink = sink(header, at)?;
                    self.body = Some((self.messages, sink));
                    self.messages += 1;
                    self.take(end + MESSAGE.len());
                }
                Some((message, sink)) => {
                    let ends = [END, RETURN, CALL].map(|m| self.pending.find(m).map(|i| (i, m.len())));
                    match ends.into_iter().flatten().min() {
                        Some((i, len)) => {
                            let body = self.pending[..i].to_string();
                            self.emit(&mut out, message, &sink, &body);
                            if let Sink::Call(name) = sink {
                                let arguments = std::mem::take(&mut self.arguments);
                                out.push((message, Delta::Call(ToolCall { name, arguments })));
                            }
                            self.body = None;
                            self.take(i + len);
                        }
                        None => {
                            // All but what may be the start of a marker.
                            let keep = partial_marker(&self.pending);
                            let body = self.pending[..self.pending.len() - keep].to_string();
                            self.emit(&mut out, message, &sink, &body);
                            self.take(self.pending.len() - keep);
                            return Ok(out);
                        }
                    }
                }
            }
        }
    }

    /// The end of the reply: a body cut short is kept (a call's arguments as far as they got);
    /// a header left unfinished is an error, and stray text is too.
    pub fn finish(&mut self) -> Result<Vec<(usize, Delta)>, HarmonyError> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        match self.body.take() {
            Some((message, sink)) => {
                self.emit(&mut out, message, &sink, &rest);
                if let Sink::Call(name) = sink {
                    let arguments = std::mem::take(&mut self.arguments);
                    out.push((message, Delta::Call(ToolCall { name, arguments })));
                }
            }
            None if rest.trim().is_empty() => {}
            None => {
                return Err(HarmonyError::BadHeader {
                    header: rest,
                    at: self.consumed,
                })
            }
        }
        Ok(out)
    }

    fn emit(&mut self, out: &mut Vec<(usize, Delta)>, message: usize, sink: &Sink, text: &str) {
        if text.is_empty() {
            return;
        }
        match sink {
            Sink::Reasoning => out.push((message, Delta::Reasoning(text.to_string()))),
            Sink::Content => out.push((message, Delta::Content(text.to_string()))),
            Sink::Call(_) => self.arguments.push_str(text),
        }
    }

    fn take(&mut self, n: usize) {
        self.pending.drain(..n);
        self.consumed += n;
    }
}

/// Bytes at the end of `text` that could begin a marker (`<`, `<|`, `<|en`, …).
fn partial_marker(text: &str) -> usize {
    let markers = [END, RETURN, CALL];
    (1..=text.len().min(CONSTRAIN.len()))
        .rev()
        .filter(|&n| text.is_char_boundary(text.len() - n))
        .find(|&n| {
            let tail = &text[text.len() - n..];
            markers.iter().any(|m| m.starts_with(tail))
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

    #[test]
    fn a_reply_splits_into_reasoning_content_and_a_tool_call() {
        let r = parse(REPLY).unwrap();
        assert_eq!(r.reasoning, "User asks for the weather in SF. Need to call the tool.");
        assert_eq!(r.content, "Checking the forecast.");
        assert_eq!(
            r.tool_calls,
            vec![ToolCall {
                name: "get_weather".into(),
                arguments: "{\"location\":\"San Francisco\"}".into()
            }]
        );
        let r = parse("<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>It is 20 °C.<|return|>")
            .unwrap();
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("Easy.", "It is 20 °C."));
        assert!(r.tool_calls.is_empty());
    }

    #[test]
    fn the_recipient_may_come_before_the_channel_and_the_type_without_constrain() {
        let r = parse("<|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{}<|call|>").unwrap();
        assert_eq!(r.tool_calls[0].name, "lookup");
        assert_eq!(r.tool_calls[0].arguments, "{}");
    }

    #[test]
    fn streamed_in_any_pieces_the_reply_gives_the_same_fields() {
        let whole = parse(REPLY).unwrap();
        for size in [1, 2, 3, 5, 7, 13, 64] {
            let mut stream = HarmonyStream::new();
            let mut deltas = Vec::new();
            let chars: Vec<char> = REPLY.chars().collect();
            for piece in chars.chunks(size) {
                deltas.extend(stream.push(&piece.iter().collect::<String>()).unwrap());
            }
            deltas.extend(stream.finish().unwrap());
            let mut got = HarmonyReply::default();
            for (_, d) in deltas {
                match d {
                    Delta::Reasoning(t) => got.reasoning.push_str(&t),
                    Delta::Content(t) => got.content.push_str(&t),
                    Delta::Call(c) => got.tool_calls.push(c),
                }
                // No marker ever leaks into the text.
                assert!(!got.content.contains("<|") && !got.reasoning.contains("<|"), "{size}");
            }
            assert_eq!(got, whole, "pieces of {size}");
        }
    }

    #[test]
    fn a_reply_cut_short_keeps_what_it_has() {
        let r = parse("<|channel|>analysis<|message|>Let me th").unwrap();
        assert_eq!(r.reasoning, "Let me th");
        let r = parse("<|channel|>commentary to=functions.f json<|message|>{\"a\":").unwrap();
        assert_eq!(r.tool_calls[0].arguments, "{\"a\":");
    }

    #[test]
    fn malformed_channels_and_headers_are_errors_naming_them_never_panics() {
        assert_eq!(
            parse("<|channel|>secret<|message|>x<|end|>"),
            Err(HarmonyError::UnknownChannel {
                channel: "secret".into(),
                at: 0
            })
        );
        assert!(matches!(
            parse("<|channel|>analysis"),
            Err(HarmonyError::BadHeader { .. })
        ));
        assert!(matches!(
            parse("plain words<|message|>x"),
            Err(HarmonyError::BadHeader { .. })
        ));
        assert!(matches!(
            parse("<|channel|>final<|message|>a<|end|>stray"),
            Err(HarmonyError::BadHeader { at, .. }) if at == 35
        ));
        // Whatever the bytes, no panic.
        for text in [
            "<|",
            "<|start|><|start|><|message|>",
            "<|channel|><|message|>",
            "\u{1F600}<|e",
            "",
        ] {
            let _ = parse(text);
        }
    }
}
