//! The `tojson` filter as transformers registers it: `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)`, with the same parameters in the same order.
//!
//! minijinja's built-in `tojson` cannot stand in for it: it writes `,` and `:` without spaces and
//! escapes `<`, `>`, `&` and `'` for HTML, so a tool schema would reach the model spelled
//! differently from how the model saw it in training. This file owns the Python encoder's output
//! format only; it must not parse JSON or know what is being encoded.
//!
//! The output is built under the render's budget: minijinja charges a filter's result only once
//! it exists, and `tojson(indent=65536)` over a list nested 150 deep writes gigabytes of
//! indentation, so the encoder stops as soon as what it wrote passes the fuel left (one fuel per
//! 64 bytes, the engine's own rate), before the bytes are allocated.

use super::python::float_repr;
use minijinja::value::{Kwargs, Rest, ValueKind, ValueOrKwargs};
use minijinja::{Error, ErrorKind, State, Value};
use std::cmp::Ordering;
use std::fmt::Write as _;

/// Python's parameter order: a positional `tojson(2)` sets `ensure_ascii`, not `indent`.
const PARAMS: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];

/// Deeper values than this are refused rather than risking the stack; Python stops at about the
/// same depth (its recursion limit).
const MAX_DEPTH: usize = 512;

struct Options {
    ensure_ascii: bool,
    /// The string repeated once per level, or `None` for single-line output.
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    /// The most bytes the output may take: the fuel left when the filter was called.
    budget: usize,
}

/// Bytes one fuel pays for (minijinja's `UNITS_PER_FUEL`).
const BYTES_PER_FUEL: u64 = 64;

pub(super) fn tojson(state: &State, value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let mut options = options(args.0.into_iter().map(ValueOrKwargs::into_value).collect())?;
    if let Some((_, remaining)) = state.fuel_levels() {
        options.budget = usize::try_from(remaining.saturating_mul(BYTES_PER_FUEL)).unwrap_or(usize::MAX);
    }
    let mut out = String::new();
    encode(&mut out, value, &options, 0)?;
    Ok(Value::from(out))
}

fn invalid(message: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {}", message.into()))
}

fn options(mut args: Vec<Value>) -> Result<Options, Error> {
    let kwargs = match args.last() {
        Some(last) if last.is_kwargs() => Some(Kwargs::try_from(args.pop().unwrap_or_default())?),
        _ => None,
    };
    if args.len() > PARAMS.len() {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            format!("tojson takes at most {} arguments, {} given", PARAMS.len(), args.len()),
        ));
    }
    let mut given: [Option<Value>; 4] = Default::default();
    for (slot, arg) in given.iter_mut().zip(args) {
        *slot = Some(arg);
    }
    if let Some(kwargs) = kwargs {
        for (slot, name) in given.iter_mut().zip(PARAMS) {
            if kwargs.has(name) {
                if slot.is_some() {
                    return Err(invalid(format!("got multiple values for argument '{name}'")));
                }
                *slot = Some(kwargs.get::<Value>(name)?);
            }
        }
        kwargs.assert_all_used()?;
    }
    let [ensure_ascii, indent, separators, sort_keys] = given.map(|v| v.filter(|v| !v.is_none()));

    let indent = match indent {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
        // Python repeats a space `indent` times (so True is one space, a negative count none).
        Some(v) if v.kind() == ValueKind::Bool => Some(if v.is_true() { " ".into() } else { String::new() }),
        Some(v) => match v.as_i64() {
            Some(n) => Some(" ".repeat(n.clamp(0, 1 << 16) as usize)),
            None => return Err(invalid(format!("indent must be an int or a string, not {}", v.kind()))),
        },
    };
    // Python drops the space after ',' when indenting, since each item starts a new line.
    let (item_separator, key_separator) = match separators {
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
        Some(v) => {
            let parts: Vec<Value> = v.try_iter().map(Iterator::collect).unwrap_or_default();
            match parts.as_slice() {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => (
                    item.as_str().unwrap_or_default().to_string(),
                    key.as_str().unwrap_or_default().to_string(),
                ),
                _ => return Err(invalid("separators must be a pair of strings")),
            }
        }
    };
    Ok(Options {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        item_separator,
        key_separator,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
        budget: usize::MAX,
    })
}

/// Refuses output that would grow past the budget by `more` bytes, before it is written.
fn within_budget(out: &str, more: usize, options: &Options) -> Result<(), Error> {
    if out.len().saturating_add(more) > options.budget {
        return Err(Error::new(
            ErrorKind::OutOfFuel,
            format!(
                "tojson: the output passes the {} bytes left in the render's budget",
                options.budget
            ),
        ));
    }
    Ok(())
}

fn not_serializable(kind: &str) -> Error {
    invalid(format!("Object of type {kind} is not JSON serializable"))
}

fn encode(out: &mut String, value: &Value, options: &Options, level: usize) -> Result<(), Error> {
    if level > MAX_DEPTH {
        return Err(invalid(format!("value nested deeper than {MAX_DEPTH} levels")));
    }
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => encode_number(out, value),
        ValueKind::String => {
            // Escapes may grow it a few times over; the string itself was paid for.
            let s = value.as_str().unwrap_or_default();
            within_budget(out, s.len(), options)?;
            encode_str(out, s, options.ensure_ascii)
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            encode_container(out, ('[', ']'), items.len(), options, level, |out, i, level| {
                encode(out, &items[i], options, level)
            })?;
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                entries.push((key, item));
            }
            if options.sort_keys {
                sort_entries(&mut entries)?;
            }
            encode_container(out, ('{', '}'), entries.len(), options, level, |out, i, level| {
                let (key, item) = &entries[i];
                let key = key_string(key)?;
                within_budget(out, key.len(), options)?;
                encode_str(out, &key, options.ensure_ascii);
                out.push_str(&options.key_separator);
                encode(out, item, options, level)
            })?;
        }
        ValueKind::Undefined => return Err(not_serializable("Undefined")),
        ValueKind::Bytes => return Err(not_serializable("bytes")),
        other => return Err(not_serializable(&other.to_string())),
    }
    Ok(())
}

/// Python's list/dict layout: `[]`/`{}` when empty; with an indent, every item on its own line
/// one level deeper and the closing bracket back at the container's level.
fn encode_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    options: &Options,
    level: usize,
    mut item: impl FnMut(&mut String, usize, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len == 0 {
        out.push(close);
        return Ok(());
    }
    let newline = |out: &mut String, level: usize| -> Result<(), Error> {
        if let Some(indent) = &options.indent {
            within_budget(out, 1 + level.saturating_mul(indent.len()), options)?;
            out.push('\n');
            for _ in 0..level {
                out.push_str(indent);
            }
        }
        Ok(())
    };
    newline(out, level + 1)?;
    for i in 0..len {
        if i > 0 {
            within_budget(out, options.item_separator.len(), options)?;
            out.push_str(&options.item_separator);
            newline(out, level + 1)?;
        }
        item(out, i, level + 1)?;
    }
    newline(out, level)?;
    out.push(close);
    Ok(())
}

fn encode_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let x = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    // json.dumps allows non-finite floats by default and spells them as JavaScript does.
    if x.is_nan() {
        out.push_str("NaN");
    } else if x.is_infinite() {
        out.push_str(if x < 0.0 { "-Infinity" } else { "Infinity" });
    } else {
        out.push_str(&float_repr(x));
    }
}

/// Python's dict keys become strings the way json.dumps converts them.
fn key_string(key: &Value) -> Result<String, Error> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_string(),
        ValueKind::None => "null".into(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
        ValueKind::Number => {
            let mut s = String::new();
            encode_number(&mut s, key);
            s
        }
        other => {
            return Err(invalid(format!(
                "keys must be str, int, float, bool or None, not {other}"
            )))
        }
    })
}

/// `sort_keys=True` sorts by the original keys, so (as in Python) only keys of one comparable
/// kind can be sorted.
fn sort_entries(entries: &mut [(Value, Value)]) -> Result<(), Error> {
    if entries.iter().all(|(k, _)| k.kind() == ValueKind::String) {
        entries.sort_by(|(a, _), (b, _)| a.as_str().cmp(&b.as_str()));
    } else if entries
        .iter()
        .all(|(k, _)| matches!(k.kind(), ValueKind::Number | ValueKind::Bool))
    {
        let num = |v: &Value| f64::try_from(v.clone()).unwrap_or(if v.is_true() { 1.0 } else { 0.0 });
        entries.sort_by(|(a, _), (b, _)| num(a).partial_cmp(&num(b)).unwrap_or(Ordering::Equal));
    } else {
        return Err(invalid("sort_keys cannot order keys of different types"));
    }
    Ok(())
}

/// A JSON string literal as Python's encoder writes it: the short escapes for `"`, `\` and
/// `\b \f \n \r \t`, `\u00XX` (lower-case hex) for other control characters, and with
/// `ensure_ascii` every non-ASCII character (and DEL) as `\uXXXX`, surrogate pairs above U+FFFF.
fn encode_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;

    /// Renders `{{ <expr> | tojson<args> }}`, with `v` bound to `v`.
    fn render_with(v: serde_json::Value, expr: &str, args: &str) -> Result<String, Error> {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        let v = crate::template::input::convert(&v, 16).unwrap();
        env.render_str(
            &format!("{{{{ {expr} | tojson{args} }}}}"),
            Value::from_pairs([("v", v)]),
        )
    }

    fn render(expr: &str, args: &str) -> Result<String, Error> {
        render_with(serde_json::Value::Null, expr, args)
    }

    // Expected strings are what CPython 3.11's json.dumps writes for the same Python values.
    #[test]
    fn default_output_uses_python_separators_and_leaves_non_ascii_and_html_alone() {
        assert_eq!(
            render(r#"{"b": [1, 2.5, none, true], "a": "<é & 日本 '🚀'>"}"#, "").unwrap(),
            r#"{"b": [1, 2.5, null, true], "a": "<é & 日本 '🚀'>"}"#
        );
        assert_eq!(render("[]", "").unwrap(), "[]");
        assert_eq!(render("{}", "").unwrap(), "{}");
        assert_eq!(render("1e20", "").unwrap(), "1e+20");
        assert_eq!(render("(0.1 + 0.2)", "").unwrap(), "0.30000000000000004");
    }

    #[test]
    fn strings_are_escaped_like_python() {
        let raw = "q\"b\\n\n t\t c\u{1} del\u{7f}";
        assert_eq!(
            render_with(raw.into(), "v", "").unwrap(),
            "\"q\\\"b\\\\n\\n t\\t c\\u0001 del\u{7f}\""
        );
        assert_eq!(
            render_with("é🚀\u{7f}".into(), "v", "(ensure_ascii=true)").unwrap(),
            r#""\u00e9\ud83d\ude80\u007f""#
        );
        // Python's first positional parameter is ensure_ascii.
        assert_eq!(render(r#""é""#, "(true)").unwrap(), r#""\u00e9""#);
    }

    #[test]
    fn indent_puts_items_on_their_own_lines_without_trailing_spaces() {
        assert_eq!(
            render(r#"{"a": [1, {"b": []}], "c": {}}"#, "(indent=2)").unwrap(),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": []\n    }\n  ],\n  \"c\": {}\n}"
        );
        assert_eq!(render("[1, 2]", "(indent=0)").unwrap(), "[\n1,\n2\n]");
        assert_eq!(render("[1, 2]", "(indent='\\t')").unwrap(), "[\n\t1,\n\t2\n]");
    }

    #[test]
    fn separators_and_sort_keys_are_honoured() {
        assert_eq!(
            render(r#"{"b": 1, "a": [1, 2]}"#, "(separators=(',', ':'))").unwrap(),
            r#"{"b":1,"a":[1,2]}"#
        );
        assert_eq!(
            render(r#"{"b": 1, "a": 2}"#, "(sort_keys=true)").unwrap(),
            r#"{"a": 2, "b": 1}"#
        );
        assert_eq!(render("{1: 'x', 2.5: 'y'}", "").unwrap(), r#"{"1": "x", "2.5": "y"}"#);
    }

    #[test]
    fn deep_indented_output_stops_at_the_renders_fuel_before_it_is_built() {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        env.set_fuel(Some(100_000));
        // 150 levels of 65,536 spaces: about 740 MB of indentation unbounded; 6.4 MB of fuel.
        let template = "{% set ns = namespace(v=[1]) %}{% for _ in range(150) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson(indent=65536) | length }}";
        let err = env.render_str(template, ()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::OutOfFuel, "{err}");
        // The same value with a small indent fits.
        let small = template.replace("65536", "1");
        assert_eq!(env.render_str(&small, ()).unwrap(), "23406");
    }

    #[test]
    fn values_python_cannot_serialize_are_errors() {
        let err = render("missing_variable", "").unwrap_err();
        assert!(err
            .to_string()
            .contains("Object of type Undefined is not JSON serializable"));
        assert!(render("[1]", "(indent=[1])").is_err());
        assert!(render("[1]", "(separators=',')").is_err());
        assert!(render("[1]", "(bogus=1)").is_err());
        assert!(render("[1]", "(false, indent=2, ensure_ascii=true)").is_err());
    }
}
