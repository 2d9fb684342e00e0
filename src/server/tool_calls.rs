//! Tool calls in generated text: the `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
//! blocks that Qwen-family (Hermes-style) templates teach the model to write, turned into
//! OpenAI `tool_calls`, both for a whole reply and incrementally for a stream. Llama 3.x's JSON
//! calls (`{"name", "parameters"}` after the control token `<|python_tag|>`) and Mistral's
//! (`[TOOL_CALLS]` and a JSON array of `{"name", "arguments"}`, or in the newer templates —
//! Mistral Small 3.2, Devstral, Ministral 3 — `[TOOL_CALLS]name[ARGS]{...}` once per call) reach
//! this file without their control tokens, which the reply's text leaves out, and are read as the
//! bare calls below: a JSON call, an array of them, or an offered tool's name followed by its
//! arguments object, repeated.
//!
//! Small models often skip the tags and answer with the call alone: a bare JSON object
//! `{"name": ..., "arguments": ...}` (or an array of them), possibly in a ```` ```json ````
//! fence. A reply that is exactly that, naming an offered tool, is a call too. A streamed reply
//! that opens with `{` or a fence is therefore held back until it ends, since only the end
//! tells a bare call from ordinary JSON or code.
//!
//! This file knows only the text format. It never decides whether tools are in play (the
//! handlers do) and never renders tools into a prompt (the chat template does). A block whose
//! body is not a JSON object with a string `name` is not a tool call, and comes back as content
//! exactly as the model wrote it, so nothing generated is ever lost.

use super::request::ToolChoice;
use crate::grammar::GrammarSpec;
use serde_json::Value as Json;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    /// The arguments as a JSON text, as OpenAI sends them.
    pub arguments: String,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Content(String),
    Call(ToolCall),
}

/// The grammar of a reply to a request with tools: with `choice` `Required` or a function, one
/// `<tool_call>` block whose JSON names an offered tool (or that function) and whose
/// `arguments` satisfy the tool's `parameters` schema; with `Auto`, either that or text that
/// never opens a block, so whatever the model chooses parses.
pub fn call_grammar(tools: &[Json], choice: &ToolChoice) -> GrammarSpec {
    let mut calls = Vec::new();
    for tool in tools {
        let function = &tool["function"];
        let Some(name) = function["name"].as_str() else {
            continue;
        };
        if matches!(choice, ToolChoice::Function(f) if f != name) {
            continue;
        }
        let parameters = match &function["parameters"] {
            Json::Null => serde_json::json!({"type": "object"}),
            p => p.clone(),
        };
        let schema = crate::grammar::with_layout(&serde_json::json!({
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": false,
        }));
        calls.push(format!("call_{}: %json {schema}\n", calls.len()));
    }
    let names: Vec<String> = (0..calls.len()).map(|i| format!("call_{i}")).collect();
    let mut lark = match choice {
        ToolChoice::Auto => "start: TEXT | call\nTEXT: ~/(?s:.*<tool_call>.*)/\n".to_string(),
        _ => "start: call\n".to_string(),
    };
    lark.push_str(&format!(
        "call: {} ({}) {}\n",
        Json::from(format!("{OPEN}\n")),
        names.join(" | "),
        Json::from(format!("\n{CLOSE}"))
    ));
    for call in calls {
        lark.push_str(&call);
    }
    GrammarSpec::Lark(lark)
}

/// The call a block's body describes, if it is one.
fn parse_call(body: &str) -> Option<ToolCall> {
    let Json::Object(mut obj) = serde_json::from_str::<Json>(body.trim()).ok()? else {
        return None;
    };
    let Some(Json::String(name)) = obj.remove("name") else {
        return None;
    };
    let arguments = match obj.remove("arguments").or_else(|| obj.remove("parameters")) {
        None | Some(Json::Null) => "{}".to_string(),
        // Some models write the arguments already encoded as a string.
        Some(Json::String(s)) => s,
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Mistral's `[TOOL_CALLS]name[ARGS]{...}` calls with their control tokens left out: one or more
/// of an offered tool's name (the longest that fits) directly followed by a JSON object.
fn parse_named(text: &str, names: &[String]) -> Option<Vec<ToolCall>> {
    let mut rest = text.trim();
    let mut calls = Vec::new();
    while !rest.is_empty() {
        let name = names
            .iter()
            .filter(|n| !n.is_empty() && rest.starts_with(n.as_str()))
            .max_by_key(|n| n.len())?;
        let args = &rest[name.len()..];
        if !args.starts_with('{') {
            return None;
        }
        let mut values = serde_json::Deserializer::from_str(args).into_iter::<Json>();
        let Some(Ok(value @ Json::Object(_))) = values.next() else {
            return None;
        };
        calls.push(ToolCall {
            name: name.clone(),
            arguments: value.to_string(),
        });
        rest = args[values.byte_offset()..].trim_start();
    }
    (!calls.is_empty()).then_some(calls)
}

/// Whether `text` (the reply so far, leading whitespace trimmed) may still become a call in
/// Mistral's named form: it is a prefix of an offered name, or a name and then `{`.
fn may_be_named(text: &str, names: &[String]) -> bool {
    names.iter().filter(|n| !n.is_empty()).any(|n| {
        n.starts_with(text)
            || text
                .strip_prefix(n.as_str())
                .is_some_and(|r| r.is_empty() || r.starts_with('{'))
    })
}

/// The calls a whole reply makes without tags: a JSON object naming one of `names`, or an
/// array of such objects, optionally fenced as a code block; or Mistral's named calls.
fn parse_bare(text: &str, names: &[String]) -> Option<Vec<ToolCall>> {
    if !text.trim_start().starts_with(['{', '[', '`']) {
        return parse_named(text, names);
    }
    let mut body = text.trim();
    if let Some(fenced) = body.strip_prefix("```") {
        let fenced = fenced.strip_suffix("```")?;
        body = fenced.strip_prefix("json").unwrap_or(fenced).trim();
    }
    let value: Json = serde_json::from_str(body).ok()?;
    let items = match value {
        Json::Array(items) if !items.is_empty() => items,
        obj @ Json::Object(_) => vec![obj],
        _ => return None,
    };
    items
        .iter()
        .map(|item| {
            let call = parse_call(&item.to_string())?;
            let Json::Object(obj) = item else { return None };
            let known = names.contains(&call.name);
            (known && (obj.contains_key("arguments") || obj.contains_key("parameters"))).then_some(call)
        })
        .collect()
}

#[derive(Default, PartialEq)]
enum Mode {
    /// Nothing but whitespace yet.
    #[default]
    Undecided,
    /// The reply opened like a bare call: hold it all until the end.
    Bare,
    /// Ordinary text, with `<tool_call>` blocks found as they come.
    Tagged,
}

/// Splits streamed text into content and tool calls, holding back only what may still turn out
/// to be part of a call: a partial `<tool_call>` tag, an open block, a reply that may be a bare
/// call, and whitespace that would only pad the calls.
#[derive(Default)]
pub struct ToolCallStream {
    /// The offered tools' names, which a bare call must use.
    names: Vec<String>,
    mode: Mode,
    buf: String,
    inside: bool,
    /// Whitespace-only content held back: sent with the next real content, dropped otherwise.
    blank: String,
}

impl ToolCallStream {
    pub fn new(names: Vec<String>) -> Self {
        ToolCallStream {
            names,
            ..Default::default()
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        if self.mode == Mode::Undecided {
            let start = self.buf.trim_start();
            match start.chars().next() {
                None => return out,
                Some('{' | '[' | '`') => self.mode = Mode::Bare,
                // An offered tool's name (or the start of one): a call in Mistral's named form
                // once its `{` comes, until then undecided.
                Some(_) if may_be_named(start, &self.names) => {
                    if !start.contains('{') {
                        return out;
                    }
                    self.mode = Mode::Bare
                }
                Some(_) => self.mode = Mode::Tagged,
            }
        }
        if self.mode == Mode::Bare {
            return out;
        }
        loop {
            if self.inside {
                let Some(end) = self.buf.find(CLOSE) else { break };
                let body = self.buf[..end].to_string();
                self.buf.drain(..end + CLOSE.len());
                self.inside = false;
                match parse_call(&body) {
                    Some(call) => {
                        self.blank.clear();
                        out.push(Piece::Call(call));
                    }
                    None => self.content(format!("{OPEN}{body}{CLOSE}"), &mut out),
                }
            } else if let Some(start) = self.buf.find(OPEN) {
                let before: String = self.buf.drain(..start + OPEN.len()).collect();
                self.content(before[..start].to_string(), &mut out);
                self.inside = true;
            } else {
                let keep = partial_suffix(&self.buf, OPEN);
                let ready: String = self.buf.drain(..self.buf.len() - keep).collect();
                self.content(ready, &mut out);
                break;
            }
        }
        out
    }

    /// The end of the text: an unclosed block is still a call if its body parses (generation
    /// may stop at the end-of-turn token right where `</tool_call>` would be).
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        if self.mode == Mode::Bare {
            if let Some(calls) = parse_bare(&self.buf, &self.names) {
                self.buf.clear();
                out.extend(calls.into_iter().map(Piece::Call));
                return out;
            }
            // Not a bare call: read it as ordinary text, tags and all.
            self.mode = Mode::Tagged;
            let text = std::mem::take(&mut self.buf);
            out.extend(self.push(&text));
        }
        let rest = std::mem::take(&mut self.buf);
        if self.inside {
            self.inside = false;
            match parse_call(&rest) {
                Some(call) => out.push(Piece::Call(call)),
                None => self.content(format!("{OPEN}{rest}"), &mut out),
            }
        } else {
            self.content(rest, &mut out);
        }
        out
    }

    fn content(&mut self, text: String, out: &mut Vec<Piece>) {
        if text.is_empty() {
            return;
        }
        if text.trim().is_empty() {
            self.blank.push_str(&text);
            return;
        }
        let text = std::mem::take(&mut self.blank) + &text;
        out.push(Piece::Content(text));
    }
}

/// The length of the longest proper prefix of `tag` that `text` ends with.
fn partial_suffix(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().find(|&k| text.ends_with(&tag[..k])).unwrap_or(0)
}

/// A whole reply, which the prompt began with `prefix` (empty unless a call was forced): its
/// content (without the blocks, `None` when nothing else is left) and its calls.
pub fn parse(text: &str, names: &[String]) -> (Option<String>, Vec<ToolCall>) {
    let mut stream = ToolCallStream::new(names.to_vec());
    let mut pieces = stream.push(text);
    pieces.extend(stream.finish());
    let mut content = String::new();
    let mut calls = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Content(c) => content.push_str(&c),
            Piece::Call(c) => calls.push(c),
        }
    }
    let content = if calls.is_empty() {
        Some(content)
    } else {
        Some(content.trim().to_string()).filter(|c| !c.is_empty())
    };
    (content, calls)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> (Option<String>, Vec<ToolCall>) {
        super::parse(
            text,
            &[
                "get_weather".to_string(),
                "f".to_string(),
                "a".to_string(),
                "b".to_string(),
            ],
        )
    }

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    #[test]
    fn a_qwen_tool_call_block_becomes_a_call_with_json_text_arguments() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        assert_eq!(parse(text), (None, vec![call("get_weather", r#"{"city":"Paris"}"#)]));
    }

    #[test]
    fn text_around_calls_is_content_and_several_calls_are_kept_in_order() {
        let text = "Let me check.\n<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\"}</tool_call>";
        let (content, calls) = parse(text);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls, vec![call("a", "{}"), call("b", "{}")]);
    }

    #[test]
    fn a_block_that_is_not_a_call_stays_in_the_content_verbatim() {
        let text = "x <tool_call>not json</tool_call> y";
        assert_eq!(parse(text), (Some(text.to_string()), vec![]));
    }

    #[test]
    fn an_unclosed_block_at_the_end_is_still_a_call_when_it_parses() {
        assert_eq!(parse("<tool_call>{\"name\": \"f\"}"), (None, vec![call("f", "{}")]));
        assert_eq!(
            parse("<tool_call>{\"name\": "),
            (Some("<tool_call>{\"name\": ".to_string()), vec![])
        );
    }

    #[test]
    fn streaming_in_any_split_gives_what_the_whole_text_gives() {
        let text = "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"q\": \"<tool\"}}\n</tool_call>\n";
        let whole = parse(text);
        for size in 1..8 {
            let mut stream = ToolCallStream::new(vec!["f".into()]);
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(size) {
                pieces.extend(stream.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(stream.finish());
            let calls: Vec<_> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Call(c) => Some(c.clone()),
                    _ => None,
                })
                .collect();
            let content: String = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Content(c) => Some(c.as_str()),
                    _ => None,
                })
                .collect();
            assert_eq!(calls, whole.1, "chunks of {size}");
            assert_eq!(content.trim(), whole.0.as_deref().unwrap_or(""), "chunks of {size}");
        }
    }

    #[test]
    fn llama3_json_calls_and_mistral_tool_call_arrays_are_calls_whole_and_streamed() {
        // Llama 3.x writes `{"name": ..., "parameters": ...}` (after `<|python_tag|>`, a control
        // token the reply's text leaves out); Mistral writes `[TOOL_CALLS]` (a control token too)
        // and then a JSON array of `{"name", "arguments"}` objects.
        let cases = [
            (
                r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
                vec![call("get_weather", r#"{"city":"Paris"}"#)],
            ),
            (
                r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#,
                vec![call("a", r#"{"x":1}"#), call("b", "{}")],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), (None, expected.clone()), "{text}");
            let mut stream = ToolCallStream::new(vec!["get_weather".into(), "a".into(), "b".into()]);
            let mut pieces = Vec::new();
            for ch in text.chars() {
                pieces.extend(stream.push(&ch.to_string()));
            }
            pieces.extend(stream.finish());
            assert_eq!(
                pieces,
                expected.into_iter().map(Piece::Call).collect::<Vec<_>>(),
                "{text}"
            );
        }
    }

    #[test]
    fn mistrals_named_calls_without_their_control_tokens_are_calls_whole_and_streamed() {
        // Mistral Small 3.2's `[TOOL_CALLS]get_weather[ARGS]{...}[TOOL_CALLS]a[ARGS]{...}`, as the
        // reply's text has it once the control tokens are left out.
        let text = r#"get_weather{"city": "Paris", "days": [1, 2]}a{"x": {"y": "}"}}"#;
        let expected = vec![
            call("get_weather", r#"{"city":"Paris","days":[1,2]}"#),
            call("a", r#"{"x":{"y":"}"}}"#),
        ];
        assert_eq!(parse(text), (None, expected.clone()));
        for size in [1, 3, 7] {
            let mut stream = ToolCallStream::new(vec!["get_weather".into(), "a".into()]);
            let mut pieces = Vec::new();
            let chars: Vec<char> = text.chars().collect();
            for chunk in chars.chunks(size) {
                pieces.extend(stream.push(&chunk.iter().collect::<String>()));
            }
            pieces.extend(stream.finish());
            assert_eq!(
                pieces,
                expected.iter().cloned().map(Piece::Call).collect::<Vec<_>>(),
                "chunks of {size}"
            );
        }
        // A reply that only starts like a tool's name is text, streamed as soon as it differs.
        let mut stream = ToolCallStream::new(vec!["get_weather".into()]);
        assert_eq!(stream.push("get"), vec![]);
        assert_eq!(stream.push("ting there"), vec![Piece::Content("getting there".into())]);
        assert_eq!(
            parse("get_weather is sunny"),
            (Some("get_weather is sunny".into()), vec![])
        );
        assert_eq!(parse("rm_rf{}"), (Some("rm_rf{}".into()), vec![]));
    }

    #[test]
    fn plain_text_streams_through_without_waiting_for_the_end() {
        let mut stream = ToolCallStream::new(vec!["f".into()]);
        assert_eq!(stream.push("hello <"), vec![Piece::Content("hello ".into())]);
        assert_eq!(stream.push("b>"), vec![Piece::Content("<b>".into())]);
    }

    #[test]
    fn a_reply_that_is_only_a_json_call_to_an_offered_tool_is_a_call() {
        let expected = (None, vec![call("get_weather", r#"{"city":"Paris"}"#)]);
        assert_eq!(
            parse(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#),
            expected
        );
        assert_eq!(
            parse("```json\n{\n  \"name\": \"get_weather\",\n  \"arguments\": {\"city\": \"Paris\"}\n}\n```"),
            expected
        );
        // Unknown tool, or JSON that merely mentions a name: content.
        let other = r#"{"name": "rm_rf", "arguments": {}}"#;
        assert_eq!(parse(other), (Some(other.to_string()), vec![]));
        let data = r#"{"name": "get_weather"}"#;
        assert_eq!(parse(data), (Some(data.to_string()), vec![]));
    }
}
