//! The few places where jinja2 running on Python and minijinja disagree in ways published chat
//! templates can see: how a float prints (Python's `repr`), and the `iterable` and `sequence`
//! tests (Python answers from the object's protocols: `None` is not iterable, a dict is a
//! sequence). Everything else minijinja already prints the Python way (`None`, `True`,
//! `['a', 1]`).
//!
//! This file must not grow into a Python emulator: a rule earns its place here only when a
//! template's output depends on it. Known gaps, all outside minijinja's extension points: floats
//! joined with `~` or nested inside a printed list or dict keep minijinja's spelling (`1e20` for
//! Python's `1e+20`, only outside 1e-4..1e16), and `{% for x in none %}` iterates nothing where
//! Python raises, so a template that loops over a `None` renders here where transformers refuses.

use minijinja::value::ValueKind;
use minijinja::{Error, Output, State, Value};
use std::fmt::Write as _;

/// Python's `repr(float)` (which is also `str(float)` and what `json.dumps` writes): the shortest
/// digits that round-trip, in positional notation for 1e-4 <= |x| < 1e16 and scientific notation
/// (`1e+16`, `1.5e-05`) outside it.
pub(super) fn float_repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf".into() } else { "inf".into() };
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    // Rust's `{:e}` without a precision prints the shortest round-trip digits, as Python's repr
    // does; only the layout differs.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // The decimal point sits after `decpt` digits: x = 0.d1d2... * 10^decpt.
    let decpt = exponent + 1;
    let n = digits.len() as i32;
    let mut out = String::from(sign);
    if decpt <= -4 || decpt > 16 {
        out.push_str(&digits[..1]);
        if n > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let exp_sign = if exponent < 0 { '-' } else { '+' };
        let _ = write!(out, "e{exp_sign}{:02}", exponent.unsigned_abs());
    } else if decpt <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', decpt.unsigned_abs() as usize));
        out.push_str(&digits);
    } else if decpt >= n {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (decpt - n) as usize));
        out.push_str(".0");
    } else {
        out.push_str(&digits[..decpt as usize]);
        out.push('.');
        out.push_str(&digits[decpt as usize..]);
    }
    out
}

/// The float inside `value`, if it holds a non-integer number.
fn as_float(value: &Value) -> Option<f64> {
    if value.kind() == ValueKind::Number && !value.is_integer() {
        f64::try_from(value.clone()).ok()
    } else {
        None
    }
}

/// Writes `{{ value }}`: floats as Python prints them, everything else as minijinja does.
pub(super) fn formatter(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    match as_float(value) {
        Some(x) => out.write_str(&float_repr(x)).map_err(Error::from),
        None => minijinja::escape_formatter(out, state, value),
    }
}

/// The `string` filter, as Python's `str()`: strings pass unchanged (keeping their safe mark).
pub(super) fn string_filter(value: &Value) -> Value {
    match as_float(value) {
        Some(x) => Value::from(float_repr(x)),
        None if value.kind() == ValueKind::String => value.clone(),
        None => Value::from(value.to_string()),
    }
}

/// jinja2's `iterable` test is `iter(value)` succeeding: `None` and numbers are not iterable, an
/// undefined value is (jinja2's `Undefined` iterates as empty). Qwen3-Coder's template writes
/// `tools is iterable and tools | length > 0`, which must be false, not an error, for `tools=None`.
pub(super) fn is_iterable(value: &Value) -> bool {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Invalid => false,
        ValueKind::Undefined
        | ValueKind::String
        | ValueKind::Bytes
        | ValueKind::Seq
        | ValueKind::Map
        | ValueKind::Iterable => true,
        // Plain objects (namespace, loop, macros) and kinds minijinja may add later.
        _ => value.try_iter().is_ok(),
    }
}

/// jinja2's `sequence` test is "has `len()` and `__getitem__`": strings and dicts qualify, as
/// does an undefined value; a one-shot iterator does not.
pub(super) fn is_sequence(value: &Value) -> bool {
    matches!(
        value.kind(),
        ValueKind::Undefined | ValueKind::String | ValueKind::Bytes | ValueKind::Seq | ValueKind::Map
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python_repr() {
        // Expected strings are CPython 3.11's repr() of the same doubles.
        let cases: &[(f64, &str)] = &[
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (-2.5, "-2.5"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (123456.789, "123456.789"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (0.000123, "0.000123"),
            (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345e20, "1.2345e+20"),
            (9007199254740993.0, "9007199254740992.0"),
            (1e100, "1e+100"),
            (f64::MAX, "1.7976931348623157e+308"),
            (5e-324, "5e-324"),
            (f64::NAN, "nan"),
            (f64::NEG_INFINITY, "-inf"),
        ];
        for &(x, expected) in cases {
            assert_eq!(float_repr(x), expected, "repr of {x:e}");
        }
    }

    #[test]
    fn none_and_numbers_are_not_iterable_but_undefined_and_strings_are() {
        assert!(!is_iterable(&Value::from(())));
        assert!(!is_iterable(&Value::from(3)));
        assert!(is_iterable(&Value::UNDEFINED));
        assert!(is_iterable(&Value::from("abc")));
        assert!(is_iterable(&Value::from(vec![1, 2])));
        assert!(is_sequence(&Value::from_pairs([("a", 1)])));
        assert!(!is_sequence(&Value::from(())));
    }
}
