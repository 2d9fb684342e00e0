//! Chat templates: renders a conversation with the model's own Jinja chat template (GGUF
//! `tokenizer.chat_template`) byte for byte as Hugging Face transformers renders it
//! (`render_jinja_template`), so the model sees the prompt layout it was trained on.
//!
//! This module owns the template environment (jinja2's settings and the helpers transformers
//! registers, in `environment`), the checks on what callers pass in (`input`), and the load-time
//! refusal of a template that cannot render: constructing a [`ChatTemplate`] compiles it and
//! renders a probe conversation, so a broken template fails the model load loudly instead of
//! every request. ChatML is used only when a file has no template at all, never as a fallback
//! for a broken one (architecture document, "render chat template").
//!
//! `harmony` reads OpenAI's harmony format (gpt-oss) back out of a generated reply: its
//! channels split into reasoning, content and tool calls, whole or streamed. Whether a model
//! speaks harmony is decided here, once, from its template ([`ChatTemplate::is_harmony`]).
//!
//! It must not tokenize, parse API requests, or know models and generation: callers pass
//! OpenAI-shaped JSON messages and get the prompt text back. Messages reach the template as
//! given, as in transformers; in particular, tool-call `arguments` sent as a JSON string (the
//! OpenAI wire format) stay a string, and a server that wants templates to see an object must
//! parse it first, as llama.cpp's and vLLM's servers do.

mod builtin;
mod environment;
mod error;
mod guard;
pub mod harmony;
mod input;
mod python;
pub mod reasoning;
mod strftime;
/// UTC time as strftime formats it (the server's timestamps use it too).
pub use strftime::format_utc;
mod tojson;

pub use builtin::{builtin, builtin_names, LLAMA_CPP_NAMES};
pub use error::TemplateError;
pub use guard::Rendered;

use crate::gguf::{Array, GgufError, Metadata, ValueType};
use environment::TEMPLATE_NAME;
pub use environment::{template_fuel, TEMPLATE_FUEL, TEMPLATE_FUEL_PER_INPUT_BYTE};
use error::describe;
use minijinja::{Environment, Value};
use serde_json::{json, Map, Value as Json};

/// The metadata key holding the template source.
pub const CHAT_TEMPLATE_KEY: &str = "tokenizer.chat_template";
const BOS_TOKEN_ID_KEY: &str = "tokenizer.ggml.bos_token_id";
const EOS_TOKEN_ID_KEY: &str = "tokenizer.ggml.eos_token_id";
const TOKENS_KEY: &str = "tokenizer.ggml.tokens";

/// ChatML, for files without a template. Content that is not a string (none, or absent beside
/// tool calls) renders as empty rather than failing: ChatML has no tool-call syntax to offer.
const CHATML_TEMPLATE: &str = "{%- for message in messages %}
{{- '<|im_start|>' ~ message.role ~ '\\n' ~ (message.content if message.content is string else '') ~ '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\\n' }}
{%- endif %}";

/// Variables the renderer always sets itself. transformers passes these as named arguments, so
/// an extra variable of the same name is an error there too.
const RESERVED_VARIABLES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The conversations rendered at load, in order; the template is accepted once one renders.
/// The first is the common shape; the second drops the system message, which some published
/// templates refuse (Gemma's raises "System role not supported") and a server can still serve.
const PROBES: [&[(&str, &str)]; 2] = [
    &[
        ("system", "You are a helpful assistant."),
        ("user", "Hello!"),
        ("assistant", "Hello! How can I help you today?"),
        ("user", "What is 2 + 2?"),
    ],
    &[
        ("user", "Hello!"),
        ("assistant", "Hello! How can I help you today?"),
        ("user", "What is 2 + 2?"),
    ],
];

/// A compiled chat template, with the special tokens it may print.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    builtin_chatml: bool,
    harmony: bool,
}

/// What a template that writes OpenAI's harmony format prints: messages as
/// `<|start|>ROLE<|channel|>CHANNEL<|message|>…`, and a reply asked for after
/// `<|start|>assistant`. llama.cpp picks its gpt-oss handling from `<|channel|>` in the template
/// alone; the other two keep a template that merely mentions the token from counting.
const HARMONY_MARKERS: [&str; 3] = ["<|channel|>", "<|message|>", "<|start|>assistant"];

impl ChatTemplate {
    /// The file's template, or ChatML when the file has no `tokenizer.chat_template` key.
    /// `bos_token` and `eos_token` are the vocabulary entries that `tokenizer.ggml.bos_token_id`
    /// and `eos_token_id` name, or empty when those keys are absent.
    pub fn from_metadata(metadata: &Metadata) -> Result<Self, TemplateError> {
        let bos_token = special_token(metadata, BOS_TOKEN_ID_KEY)?;
        let eos_token = special_token(metadata, EOS_TOKEN_ID_KEY)?;
        if !metadata.contains(CHAT_TEMPLATE_KEY) {
            return Ok(Self::builtin_chatml(bos_token, eos_token));
        }
        Self::new(metadata.get_str(CHAT_TEMPLATE_KEY)?, &bos_token, &eos_token)
    }

    /// `source` in place of the file's template (llama.cpp's `--chat-template-file`), with the
    /// file's BOS and EOS text.
    pub fn with_source(source: &str, metadata: &Metadata) -> Result<Self, TemplateError> {
        let bos_token = special_token(metadata, BOS_TOKEN_ID_KEY)?;
        let eos_token = special_token(metadata, EOS_TOKEN_ID_KEY)?;
        Self::new(source, &bos_token, &eos_token)
    }

    /// Compiles `source` and renders a probe conversation with it; either failure is returned
    /// with minijinja's message (naming the line).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, TemplateError> {
        let template = Self::compile(source.to_string(), bos_token.to_string(), eos_token.to_string(), false)
            .map_err(|message| TemplateError::Compile { message })?;
        template.probe()?;
        Ok(template)
    }

    /// The built-in ChatML template, with empty special tokens.
    pub fn chatml() -> Self {
        Self::builtin_chatml(String::new(), String::new())
    }

    fn builtin_chatml(bos_token: String, eos_token: String) -> Self {
        // A constant template; the unit tests render it.
        Self::compile(CHATML_TEMPLATE.to_string(), bos_token, eos_token, true)
            .expect("the built-in ChatML template compiles")
    }

    fn compile(source: String, bos_token: String, eos_token: String, builtin_chatml: bool) -> Result<Self, String> {
        let mut env = environment::environment();
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|err| describe(&err))?;
        let harmony = HARMONY_MARKERS.iter().all(|m| source.contains(m));
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
            builtin_chatml,
            harmony,
        })
    }

    /// The Jinja source being rendered.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is the built-in ChatML template (the file had none).
    pub fn is_builtin_chatml(&self) -> bool {
        self.builtin_chatml
    }

    /// Whether the model speaks OpenAI's harmony format (gpt-oss): its template writes
    /// harmony's channels and messages ([`HARMONY_MARKERS`]). This is the one place that
    /// decides it, from the template and never from the model's name, so a fine-tune keeps it
    /// and a `--chat-template-file` in harmony gives it to any model. A harmony model's replies
    /// are printed with its control tokens and read back with [`harmony`]; its template reads
    /// `reasoning_effort` and an assistant turn's `thinking`.
    pub fn is_harmony(&self) -> bool {
        self.harmony
    }

    /// The text the template's `bos_token` variable holds.
    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    /// The text the template's `eos_token` variable holds.
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// Renders `messages` (OpenAI-shaped objects: a string `role`; `content` a string, null,
    /// absent, or an array of text parts, which is joined with newlines; anything else passed
    /// through) with `tools` (the template's `tools`, `None` when absent), `add_generation_prompt`,
    /// and `extra` variables such as `enable_thinking`. `extra` may replace `bos_token` and
    /// `eos_token`, as transformers' keyword arguments do, but not the variables the renderer
    /// sets itself (`messages`, `tools`, `documents`, `add_generation_prompt`).
    pub fn render(
        &self,
        messages: &[Json],
        tools: Option<&[Json]>,
        add_generation_prompt: bool,
        extra: &Map<String, Json>,
    ) -> Result<String, TemplateError> {
        let fuel = template_fuel(input_bytes(messages) + tools.map_or(0, input_bytes));
        let messages = input::messages(messages)?;
        let tools = match tools {
            Some(tools) => input::tools(tools)?,
            None => Value::from(()),
        };
        let mut context = vec![
            ("bos_token".to_string(), Value::from(self.bos_token.as_str())),
            ("eos_token".to_string(), Value::from(self.eos_token.as_str())),
        ];
        // Today's date under the names llama.cpp gives every template (Llama 3.x prints
        // `date_string`, falling back to a fixed day without it); a caller's variable wins.
        for (name, format) in [("date_string", "%d %b %Y"), ("datetime", "%b %d %Y")] {
            if !extra.contains_key(name) {
                context.push((name.to_string(), Value::from(strftime::strftime_now(format))));
            }
        }
        for (name, value) in extra {
            if RESERVED_VARIABLES.contains(&name.as_str()) {
                return Err(TemplateError::InvalidInput {
                    name: name.clone(),
                    reason: "is set by the renderer itself and cannot be passed as an extra variable".into(),
                });
            }
            context.push((name.clone(), input::extra(name, value)?));
        }
        context.extend([
            ("messages".to_string(), messages),
            ("tools".to_string(), tools),
            // transformers always passes `documents`, None unless retrieval documents are given.
            ("documents".to_string(), Value::from(())),
            ("add_generation_prompt".to_string(), Value::from(add_generation_prompt)),
        ]);
        // The budget grows with the input, so a large conversation renders while a hostile
        // template on a small one stops early; environments share their compiled templates, so
        // the clone is cheap.
        let mut env = self.env.clone();
        env.set_fuel(Some(fuel));
        let template = env.get_template(TEMPLATE_NAME).map_err(|err| TemplateError::Render {
            message: describe(&err),
        })?;
        // Later pairs replace earlier ones, which is how an extra overrides `bos_token`.
        let mut out = Bounded {
            bytes: Vec::new(),
            full: false,
        };
        let rendered = template.render_captured_to(Value::from_pairs(context), &mut out);
        if out.full {
            return Err(TemplateError::TooLong {
                limit: TEMPLATE_MAX_OUTPUT,
            });
        }
        match rendered {
            Err(err) if err.kind() == minijinja::ErrorKind::OutOfFuel => Err(TemplateError::OutOfFuel { fuel }),
            Err(err) => Err(TemplateError::Render {
                message: describe(&err),
            }),
            Ok(_) => String::from_utf8(out.bytes).map_err(|e| TemplateError::Render {
                message: format!("the output is not UTF-8: {e}"),
            }),
        }
    }

    /// Renders the probe conversations; a template that renders none of them (or renders them as
    /// nothing) would fail every request, so it is refused now with the last failure.
    fn probe(&self) -> Result<(), TemplateError> {
        let mut failure = String::new();
        for probe in PROBES {
            let messages: Vec<Json> = probe
                .iter()
                .map(|(role, content)| json!({ "role": role, "content": content }))
                .collect();
            match self.render(&messages, None, true, &Map::new()) {
                Ok(prompt) if !prompt.is_empty() => return Ok(()),
                Ok(_) => failure = "it renders a conversation as an empty prompt".into(),
                Err(TemplateError::Render { message }) => failure = message,
                // A budget the probe exhausts, every request would: refuse it by name.
                Err(e @ (TemplateError::OutOfFuel { .. } | TemplateError::TooLong { .. })) => return Err(e),
                Err(other) => failure = other.to_string(),
            }
        }
        Err(TemplateError::Probe { message: failure })
    }
}

/// The bytes of every string (keys included) in `values`.
fn input_bytes(values: &[Json]) -> usize {
    fn walk(v: &Json) -> usize {
        match v {
            Json::String(s) => s.len(),
            Json::Array(items) => items.iter().map(walk).sum(),
            Json::Object(map) => map.iter().map(|(k, v)| k.len() + walk(v)).sum(),
            _ => 0,
        }
    }
    values.iter().map(walk).sum()
}

/// Bytes one render may produce: far beyond any prompt a context holds (a 128K-token context
/// is well under 1 MiB of text), a bound on a template that writes without end.
pub const TEMPLATE_MAX_OUTPUT: usize = 16 << 20;

/// The render's output, refusing to grow past [`TEMPLATE_MAX_OUTPUT`].
struct Bounded {
    bytes: Vec<u8>,
    full: bool,
}

impl std::io::Write for &mut Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > TEMPLATE_MAX_OUTPUT {
            self.full = true;
            return Err(std::io::Error::other("the template output limit is reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The vocabulary entry a special-token id key names, or empty when the key is absent.
fn special_token(metadata: &Metadata, key: &'static str) -> Result<String, TemplateError> {
    if !metadata.contains(key) {
        return Ok(String::new());
    }
    let id = metadata.get_uint(key)?;
    let tokens = match metadata.get_array(TOKENS_KEY)? {
        Array::String(tokens) => tokens,
        _ => {
            return Err(GgufError::WrongType {
                key: TOKENS_KEY.to_string(),
                expected: "ARRAY of STRING",
                actual: ValueType::Array,
            }
            .into())
        }
    };
    usize::try_from(id)
        .ok()
        .and_then(|i| tokens.get(i))
        .cloned()
        .ok_or(TemplateError::TokenOutOfRange {
            key,
            id,
            n_vocab: tokens.len(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value as MetaValue;

    #[test]
    fn templates_get_todays_date_as_llama_cpp_gives_it_unless_the_caller_sets_one() {
        let t = ChatTemplate::new("{{ date_string }}|{{ datetime }}", "", "").unwrap();
        let today = || {
            format!(
                "{}|{}",
                strftime::strftime_now("%d %b %Y"),
                strftime::strftime_now("%b %d %Y")
            )
        };
        // Read before and after, so that a render across midnight matches one of them.
        let before = today();
        let rendered = t.render(&[], None, false, &Map::new()).unwrap();
        assert!(rendered == before || rendered == today(), "{rendered}");
        let mut extra = Map::new();
        extra.insert("date_string".into(), json!("26 Jul 2024"));
        assert!(t.render(&[], None, false, &extra).unwrap().starts_with("26 Jul 2024|"));
    }

    fn conversation() -> Vec<Json> {
        vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": null, "tool_calls": []}),
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}),
        ]
    }

    #[test]
    fn chatml_renders_each_message_and_the_generation_prompt() {
        let chatml = ChatTemplate::chatml();
        assert!(chatml.is_builtin_chatml());
        assert_eq!(
            chatml.render(&conversation(), None, true, &Map::new()).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\n<|im_end|>\n<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            chatml.render(&conversation()[..2], None, false, &Map::new()).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn special_tokens_are_looked_up_in_the_vocabulary() {
        let mut metadata = Metadata::new();
        metadata.set(
            TOKENS_KEY,
            MetaValue::Array(Array::String(vec!["<s>".into(), "</s>".into()])),
        );
        metadata.set(BOS_TOKEN_ID_KEY, MetaValue::U32(0));
        metadata.set(EOS_TOKEN_ID_KEY, MetaValue::U32(1));
        metadata.set(
            CHAT_TEMPLATE_KEY,
            MetaValue::String("{{ bos_token }}{{ messages[-1].content }}{{ eos_token }}".into()),
        );
        let template = ChatTemplate::from_metadata(&metadata).unwrap();
        assert_eq!((template.bos_token(), template.eos_token()), ("<s>", "</s>"));
        assert_eq!(
            template.render(&conversation()[..2], None, true, &Map::new()).unwrap(),
            "<s>Hi</s>"
        );

        metadata.set(EOS_TOKEN_ID_KEY, MetaValue::U32(7));
        let err = ChatTemplate::from_metadata(&metadata).unwrap_err();
        assert!(
            matches!(err, TemplateError::TokenOutOfRange { id: 7, n_vocab: 2, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_template_key_that_is_not_a_string_is_an_error_not_chatml() {
        let mut metadata = Metadata::new();
        metadata.set(CHAT_TEMPLATE_KEY, MetaValue::U32(1));
        let err = ChatTemplate::from_metadata(&metadata).unwrap_err();
        assert!(err.to_string().contains(CHAT_TEMPLATE_KEY), "{err}");
    }

    #[test]
    fn a_template_that_renders_nothing_is_refused() {
        let err = ChatTemplate::new("{# nothing #}", "", "").unwrap_err();
        assert!(matches!(err, TemplateError::Probe { .. }), "{err}");
    }

    #[test]
    fn a_template_that_writes_harmony_channels_speaks_harmony_and_chatml_does_not() {
        let harmony = "{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}\
                       {% if add_generation_prompt %}<|start|>assistant{% endif %}\
                       {# final answers: <|channel|>final #}";
        assert!(ChatTemplate::new(harmony, "", "").unwrap().is_harmony());
        assert!(!ChatTemplate::chatml().is_harmony());
        // Naming the channel token is not enough: the template must also write the messages.
        let mentions = "{% for m in messages %}{{ m.content | replace('<|channel|>', '') }}{% endfor %}";
        assert!(!ChatTemplate::new(mentions, "", "").unwrap().is_harmony());
    }

    #[test]
    fn chat_templates_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<ChatTemplate>();
    }
}
