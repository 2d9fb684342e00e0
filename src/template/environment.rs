//! The minijinja environment, configured as transformers configures jinja2 for chat templates
//! (`_compile_jinja_template`): `trim_blocks` and `lstrip_blocks` on, no trailing newline kept,
//! no autoescaping, its `tojson` filter, and its `raise_exception` and `strftime_now` globals;
//! plus Python's string and dict methods, which templates call as if they ran on Python.
//!
//! This file owns that configuration only. It must not add helpers transformers does not have:
//! a template that works here and not there would be a template that breaks elsewhere.

use super::{python, strftime, tojson};
use minijinja::syntax::SyntaxConfig;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};

/// The name the template is compiled under; minijinja's messages say `(in chat_template:LINE)`.
pub(super) const TEMPLATE_NAME: &str = "chat_template";

/// The fuel every render gets, whatever its input. minijinja charges one fuel per instruction
/// and one per 64 bytes of data a template builds (strings, lists, output), so fuel bounds both
/// the time and the memory of a render: a template that loops without end or doubles a string
/// in a loop is refused within a few tens of megabytes. A short conversation uses a few
/// thousand.
pub const TEMPLATE_FUEL: u64 = 1_000_000;

/// Extra fuel per byte of input (message and tool strings): rendering copies, trims and joins
/// its input a few times over. The five Qwen-family templates in the test fixtures render an
/// 8 MiB conversation (2,048 messages of 4 KB, 128 tools) with 0.5 to 1 million fuel in all,
/// so 1/4 per byte (2 million for that conversation, plus the base) leaves them twice that.
pub const TEMPLATE_FUEL_PER_INPUT_BYTE: f64 = 0.25;

/// The fuel of a render whose message and tool strings hold `input_bytes` bytes.
pub fn template_fuel(input_bytes: usize) -> u64 {
    TEMPLATE_FUEL + (input_bytes as f64 * TEMPLATE_FUEL_PER_INPUT_BYTE) as u64
}

pub(super) fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    let syntax = SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .keep_trailing_newline(false)
        .build()
        // Only custom delimiters can make this fail, and these are the defaults.
        .expect("the default Jinja delimiters are valid");
    env.set_syntax(syntax);
    env.set_fuel(Some(TEMPLATE_FUEL));
    // Templates are not HTML: a tool schema must reach the model unescaped.
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(python::formatter);
    env.add_filter("tojson", tojson::tojson);
    env.add_filter("string", python::string_filter);
    env.add_test("iterable", python::is_iterable);
    env.add_test("sequence", python::is_sequence);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", |format: String| strftime::strftime_now(&format));
    env
}

/// Templates refuse conversations they cannot format (e.g. roles that do not alternate) with
/// `raise_exception("...")`; the message is what the user needs to see.
fn raise_exception(message: Value) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.to_string()))
}
