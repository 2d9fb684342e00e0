//! What the renderer hands a template: the caller's JSON (OpenAI-shaped messages, tool
//! definitions, extra variables) turned into template values, passed on as given, the way
//! transformers passes its Python dicts, with two exceptions. Content given as OpenAI's array of
//! text parts is joined into one string, because published templates concatenate `content` as a
//! string; and input that no template could use (a message without a role, content of another
//! type, values nested absurdly deep) is refused with an error naming where it is.
//!
//! This file must not interpret anything else in a message: `tool_calls`, `reasoning_content`
//! and the rest reach the template untouched, and what they mean is the template's business.

use super::error::TemplateError;
use minijinja::Value;
use serde_json::Value as Json;

/// Deeper input is refused rather than converted: the conversion, the template and `tojson`
/// all recurse per level. serde_json's parser stops at the same depth, so no parsed request is
/// refused for this.
const MAX_DEPTH: usize = 128;

/// Text parts are joined with a newline, as llama.cpp's server and vLLM do for templates that
/// expect a string.
const TEXT_PART_SEPARATOR: &str = "\n";

/// The conversation as a template's `messages`.
pub(super) fn messages(messages: &[Json]) -> Result<Value, TemplateError> {
    let converted = messages
        .iter()
        .enumerate()
        .map(|(index, message)| self::message(index, message))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::from(converted))
}

fn message(index: usize, message: &Json) -> Result<Value, TemplateError> {
    let invalid = |field: &str, reason: &str| TemplateError::InvalidMessage {
        index,
        field: field.to_string(),
        reason: reason.to_string(),
    };
    let Json::Object(fields) = message else {
        return Err(invalid("", &format!("must be a JSON object, not {}", kind(message))));
    };
    match fields.get("role") {
        Some(Json::String(_)) => {}
        None => return Err(invalid("role", "is missing")),
        Some(other) => return Err(invalid("role", &format!("must be a string, not {}", kind(other)))),
    }
    let mut pairs = Vec::with_capacity(fields.len());
    for (name, value) in fields {
        let value = if name == "content" {
            content(value).map_err(|(field, reason)| invalid(&field, &reason))?
        } else {
            convert(value, MAX_DEPTH).ok_or_else(|| invalid(name, &too_deep()))?
        };
        pairs.push((name.as_str(), value));
    }
    Ok(Value::from_pairs(pairs))
}

/// `content` as a string or none; an error is (field, reason).
fn content(content: &Json) -> Result<Value, (String, String)> {
    match content {
        Json::Null => Ok(Value::from(())),
        Json::String(s) => Ok(Value::from(s.as_str())),
        Json::Array(parts) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (i, part) in parts.iter().enumerate() {
                let field = |name: &str| format!("content[{i}]{name}");
                let Json::Object(part) = part else {
                    return Err((field(""), format!("must be a content part object, not {}", kind(part))));
                };
                match part.get("type") {
                    Some(Json::String(t)) if t == "text" => {}
                    Some(Json::String(t)) => {
                        return Err((
                            field(".type"),
                            format!("is '{t}'; only text parts can be rendered into a prompt"),
                        ))
                    }
                    Some(other) => return Err((field(".type"), format!("must be a string, not {}", kind(other)))),
                    None => return Err((field(".type"), "is missing".into())),
                }
                match part.get("text") {
                    Some(Json::String(text)) => texts.push(text.as_str()),
                    Some(other) => return Err((field(".text"), format!("must be a string, not {}", kind(other)))),
                    None => return Err((field(".text"), "is missing".into())),
                }
            }
            Ok(Value::from(texts.join(TEXT_PART_SEPARATOR)))
        }
        other => Err((
            "content".into(),
            format!("must be a string, null or an array of text parts, not {}", kind(other)),
        )),
    }
}

/// The tool definitions as a template's `tools`.
pub(super) fn tools(tools: &[Json]) -> Result<Value, TemplateError> {
    let converted = tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            convert(tool, MAX_DEPTH).ok_or_else(|| TemplateError::InvalidInput {
                name: format!("tools[{i}]"),
                reason: too_deep(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::from(converted))
}

/// An extra template variable (e.g. `enable_thinking`).
pub(super) fn extra(name: &str, value: &Json) -> Result<Value, TemplateError> {
    convert(value, MAX_DEPTH).ok_or_else(|| TemplateError::InvalidInput {
        name: name.to_string(),
        reason: too_deep(),
    })
}

fn too_deep() -> String {
    format!("is nested deeper than {MAX_DEPTH} levels")
}

fn kind(value: &Json) -> &'static str {
    match value {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

/// JSON to a template value, keeping object key order (templates print tool schemas in the
/// order given). `None` when nested deeper than `depth_left` levels.
pub(super) fn convert(json: &Json, depth_left: usize) -> Option<Value> {
    Some(match json {
        Json::Null => Value::from(()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(i)
            } else if let Some(u) = n.as_u64() {
                Value::from(u)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => {
            let depth_left = depth_left.checked_sub(1)?;
            let items = items
                .iter()
                .map(|item| convert(item, depth_left))
                .collect::<Option<Vec<_>>>()?;
            Value::from(items)
        }
        Json::Object(fields) => {
            let depth_left = depth_left.checked_sub(1)?;
            let pairs = fields
                .iter()
                .map(|(k, v)| Some((k.as_str(), convert(v, depth_left)?)))
                .collect::<Option<Vec<_>>>()?;
            Value::from_pairs(pairs)
        }
    })
}
