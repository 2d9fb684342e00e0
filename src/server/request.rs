//! Reading OpenAI request bodies: JSON values into the typed requests the handlers run, with
//! every refusal a 400 that names the field (`messages[2].role`, `temperature`) and says what
//! was expected.
//!
//! Fields are read by hand rather than derived, so that a wrong type is reported by its name
//! instead of by a byte offset. Every field llama-server reads is read the same way on every
//! endpoint: honoured, or, where minfer cannot do what it asks, a 400 naming it unless it is at
//! the value that turns it off ([`llama_server_fields`]). Soft limits are llama-server's: a
//! `temperature` below 0 is greedy, and `top_p`, `min_p` and XTC's numbers are clamped to
//! [0, 1], as it clamps them. Unknown fields are ignored, as llama-server and OpenAI's clients
//! expect (`metadata`, `parallel_tool_calls`), and named on standard error with
//! `MINFER_SERVE_DEBUG=1`; `user` is only echoed, as the session id a load balancer may hash
//! on. `chat_template_kwargs` and `reasoning_effort` are the chat template's variables, checked
//! here and rendered by the handler. This file must not render templates, tokenize or touch the
//! scheduler: it only checks shapes and ranges.

use super::error::ApiError;
use crate::grammar::GrammarSpec;
use crate::sampling::{Mirostat, SamplerKind, SamplingError, SamplingParams};
use crate::template::reasoning::ReasoningFormat;
use serde_json::{Map, Value as Json};

/// Most completions one request may ask for (`n`, and prompts times `n` for completions).
pub const MAX_CHOICES: usize = 16;
/// Most stop strings, and the longest one in bytes.
const MAX_STOPS: usize = 16;
const MAX_STOP_LEN: usize = 256;
/// Most alternatives per position that `top_logprobs` / `logprobs` may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;
/// Most messages in one chat request, and most tools: OpenAI's own limits.
pub const MAX_MESSAGES: usize = 2048;
pub const MAX_TOOLS: usize = 128;

/// Parses `bytes` under the JSON value budget and reads the value with `read` (`chat`,
/// `completion`): all a handler does before it renders or tokenizes.
pub fn from_body<T>(bytes: &[u8], read: impl FnOnce(&Json) -> Result<T, ApiError>) -> Result<T, ApiError> {
    let value =
        super::body::parse(bytes, super::body::MAX_JSON_VALUES).map_err(|e| ApiError::bad_request(e.to_string()))?;
    read(&value)
}

/// What both endpoints share: sampling, limits, streaming.
#[derive(Debug, Clone)]
pub struct Common {
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`; `None` runs to the end of the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// `None`: each request draws its own seed.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub n: usize,
    /// Alternatives per token to report, `Some(0)` for the chosen token's log-probability only.
    pub logprobs: Option<usize>,
    /// Keep generating past end-of-generation tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// The grammar the reply must follow (`response_format`, llama-server's `json_schema` or
    /// `grammar`), with the field that gave it, for a compile error to name.
    pub grammar: Option<(String, GrammarSpec)>,
    /// OpenAI's `user`, when a string: echoed as `X-Session-Id` when the request sent none.
    /// Any other type is ignored, as the field was before it was read.
    pub user: Option<String>,
    /// `logit_bias` entries given as text, each of whose tokens gets the bias (llama-server's
    /// form); the handler tokenizes them.
    pub logit_bias_text: Vec<(String, f32)>,
    /// The rest of llama-server's fields.
    pub llama: LlamaFields,
    /// The reasoning budget as tokens, once the handler knows the template's tags.
    pub reasoning_budget: Option<crate::engine::ReasoningBudget>,
}

/// llama-server's own request fields beyond sampling, the same on every endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaFields {
    /// Log-probabilities after the sampler chain (`post_sampling_probs`).
    pub post_sampling_probs: bool,
    /// The slot to run on (`id_slot`; -1 or absent: any).
    pub id_slot: Option<usize>,
    /// Reuse the slot's cached prefix (`cache_prompt`, on by default).
    pub cache_prompt: bool,
    /// The generated token ids in the answer (`return_tokens`).
    pub return_tokens: bool,
    /// Prompt progress in the stream (`return_progress`).
    pub return_progress: bool,
    /// `timings` with every streamed chunk (`timings_per_token`).
    pub timings_per_token: bool,
    /// llama-server's own answer under `__verbose` beside an OpenAI one (`verbose`).
    pub verbose: bool,
    /// Only these fields of `/completion`'s answer, `a/b` taken from inside `a`
    /// (`response_fields`).
    pub response_fields: Vec<String>,
    /// An SSE comment after this many seconds without a frame (`sse_ping_interval`; 30 by
    /// default, 0 or less: never).
    pub sse_ping_interval: i64,
    /// `n_keep`, `n_discard`: only read by a context shift, which the server does not make (a
    /// generation ends at a full context, as llama-server's does by default).
    pub n_keep: i64,
    pub n_discard: i64,
    /// Where a chat reply's reasoning goes (`reasoning_format`; the server's `--reasoning-format`
    /// when absent).
    pub reasoning_format: ReasoningFormat,
    /// Tokens a thinking model may reason before its closing tag is forced
    /// (`reasoning_budget_tokens`, or `thinking_budget_tokens`; -1 or absent: the server's
    /// `--reasoning-budget`; `None`: no limit), and the text forced before the tag
    /// (`reasoning_budget_message`).
    pub reasoning_budget: Option<usize>,
    pub reasoning_budget_message: String,
}

impl Default for LlamaFields {
    fn default() -> Self {
        LlamaFields {
            post_sampling_probs: false,
            id_slot: None,
            cache_prompt: true,
            return_tokens: false,
            return_progress: false,
            timings_per_token: false,
            verbose: false,
            response_fields: Vec::new(),
            sse_ping_interval: 30,
            n_keep: 0,
            n_discard: 0,
            reasoning_format: ReasoningFormat::Auto,
            reasoning_budget: None,
            reasoning_budget_message: String::new(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ChatRequest {
    pub common: Common,
    /// The messages as the template receives them (roles checked, tool-call arguments parsed).
    pub messages: Vec<Json>,
    /// The tool definitions to render, `None` when absent or `tool_choice` is `"none"`.
    pub tools: Option<Vec<Json>>,
    pub tool_choice: ToolChoice,
    /// Variables for the chat template beside the conversation: llama-server's
    /// `chat_template_kwargs`, each key a variable, and `reasoning_effort` ([`template_kwargs`]).
    pub template_kwargs: Map<String, Json>,
    /// Whether the rendering ends by opening the assistant's turn (`add_generation_prompt`,
    /// true unless the request says false).
    pub add_generation_prompt: bool,
    /// A final assistant message's text, which the reply continues (llama-server's prefill,
    /// vLLM's `continue_final_message`): the turn is opened and this text follows, unclosed;
    /// the message itself is then not among `messages`.
    pub prefill: Option<String>,
}

/// Whether the reply must call a tool. `"none"` is not here: it removes the tools instead.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides (also when no tools are offered).
    Auto,
    /// Some call, to any offered tool.
    Required,
    /// A call to this function, which is among the tools offered.
    Function(String),
}

/// One prompt of a completion request, as llama-server reads them: text, token ids, or both
/// mixed in one sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// Texts and ids in order (`[12, 34, "text", 56]`): the first piece, if text, gets the BOS.
    Mixed(Vec<PromptPiece>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptPiece {
    Text(String),
    Token(u32),
}

/// The `prompt` field of `/v1/completions` and `/completion`, as llama-server reads it: a text;
/// an array holding any integer, which is one prompt (ids, or ids and texts mixed); any other
/// array, whose every element is a prompt (a text, such an array, or an object); or an object
/// `{"prompt_string": ...}` (with `multimodal_data`, refused: minfer reads no images).
fn prompts(f: &Fields) -> Result<Vec<Prompt>, ApiError> {
    let value = f
        .get("prompt")
        .ok_or_else(|| ApiError::field("prompt", "prompt is required"))?;
    prompt_list("prompt", value)
}

/// A field holding prompts in llama-server's shapes (`prompt`, the embeddings' `input`): a
/// text, an array holding any integer (one prompt), or an array of prompts.
pub(super) fn prompt_list(name: &str, value: &Json) -> Result<Vec<Prompt>, ApiError> {
    let prompts = match value {
        Json::Array(items) if items.is_empty() => {
            return Err(ApiError::field(name, format!("{name} must not be an empty array")))
        }
        Json::Array(items) if !items.iter().any(is_integer) => items
            .iter()
            .enumerate()
            .map(|(i, item)| subprompt(&format!("{name}[{i}]"), item))
            .collect::<Result<_, _>>()?,
        other => vec![subprompt(name, other)?],
    };
    Ok(prompts)
}

fn is_integer(v: &Json) -> bool {
    v.as_i64().is_some() || v.as_u64().is_some()
}

/// One prompt at `path`: a text, ids (with texts mixed in), or `{"prompt_string"}`.
fn subprompt(path: &str, value: &Json) -> Result<Prompt, ApiError> {
    match value {
        Json::String(s) => Ok(Prompt::Text(s.clone())),
        Json::Array(items) if !items.is_empty() && items.iter().all(is_integer) => {
            Ok(Prompt::Tokens(token_ids(path, items)?))
        }
        Json::Array(items) if !items.is_empty() && items.iter().all(|v| is_integer(v) || v.is_string()) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Json::String(s) => Ok(PromptPiece::Text(s.clone())),
                _ => Ok(PromptPiece::Token(
                    token_ids(path, std::slice::from_ref(v)).map_err(|_| {
                        ApiError::field(
                            format!("{path}[{i}]"),
                            format!("{path}[{i}] must be a token id (an integer ≥ 0)"),
                        )
                    })?[0],
                )),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Mixed),
        Json::Object(map) if map.contains_key("prompt_string") => {
            if map.get("multimodal_data").is_some_and(|v| !v.is_null()) {
                return Err(ApiError::field(
                    format!("{path}.multimodal_data"),
                    "multimodal data was sent, but minfer reads text only (no images or audio)",
                ));
            }
            let inner = format!("{path}.prompt_string");
            match &map["prompt_string"] {
                v @ (Json::String(_) | Json::Array(_)) => subprompt(&inner, v),
                other => Err(ApiError::field(
                    &inner,
                    format!(
                        "{inner} must be a string or an array of token ids and strings, not {}",
                        kind(other)
                    ),
                )),
            }
        }
        other => Err(ApiError::field(
            path,
            format!(
                "{path} must be a string, an array of token ids (strings may be mixed in), or an object with \
                 prompt_string, not {}",
                kind(other)
            ),
        )),
    }
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompts: Vec<Prompt>,
}

/// A JSON object's fields, read with errors that name them.
pub(super) struct Fields<'a> {
    map: &'a Map<String, Json>,
    prefix: String,
}

/// The strings of array `name`, an item of another type refused naming its index.
pub fn strings(name: &str, items: &[Json]) -> Result<Vec<String>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Json::String(s) => Ok(s.clone()),
            other => Err(ApiError::field(
                format!("{name}[{i}]"),
                format!("{name}[{i}] must be a string, not {}", kind(other)),
            )),
        })
        .collect()
}

pub fn kind(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a boolean",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "an array",
        Json::Object(_) => "an object",
    }
}

impl<'a> Fields<'a> {
    pub(super) fn of(value: &'a Json, name: &str) -> Result<Self, ApiError> {
        match value {
            Json::Object(map) => Ok(Fields {
                map,
                prefix: name.to_string(),
            }),
            other => Err(if name.is_empty() {
                ApiError::bad_request(format!("the request body must be a JSON object, not {}", kind(other)))
            } else {
                ApiError::field(name, format!("{name} must be an object, not {}", kind(other)))
            }),
        }
    }

    fn path(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// The field, with JSON null read as absent (OpenAI accepts null for every optional field).
    pub(super) fn get(&self, name: &str) -> Option<&'a Json> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    pub(super) fn wrong(&self, name: &str, expected: &str, got: &Json) -> ApiError {
        let path = self.path(name);
        ApiError::field(&path, format!("{path} must be {expected}, not {}", kind(got)))
    }

    fn out_of_range(&self, name: &str, value: impl std::fmt::Display, expected: &str) -> ApiError {
        let path = self.path(name);
        ApiError::field(&path, format!("{path} = {value} is out of range: {expected}"))
    }

    pub(super) fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(name, "a boolean", other)),
        }
    }

    pub(super) fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong(name, "a string", other)),
        }
    }

    /// A number within `[min, max]`.
    fn number(&self, name: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Number(n)) => {
                let v = n.as_f64().unwrap_or(f64::NAN);
                if !(v >= min && v <= max) {
                    return Err(self.out_of_range(name, n, &format!("expected a number from {min} to {max}")));
                }
                Ok(Some(v as f32))
            }
            Some(other) => Err(self.wrong(name, "a number", other)),
        }
    }

    /// A number, clamped into `[min, max]` as llama-server clamps its soft-limited fields.
    fn clamped(&self, name: &str, min: f64, max: f64) -> Result<Option<f32>, ApiError> {
        Ok(self
            .number(name, f64::MIN, f64::MAX)?
            .map(|v| (v as f64).clamp(min, max) as f32))
    }

    /// An integer within `[min, max]`.
    pub(super) fn integer(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Number(n)) => {
                let v = n.as_i64().or_else(|| n.as_u64().map(|_| i64::MAX));
                match v {
                    Some(v) if v >= min && v <= max => Ok(Some(v)),
                    Some(_) => Err(self.out_of_range(name, n, &format!("expected an integer from {min} to {max}"))),
                    None => Err(self.wrong(name, "an integer", &Json::Number(n.clone()))),
                }
            }
            Some(other) => Err(self.wrong(name, "an integer", other)),
        }
    }
}

/// The fields every endpoint reads. `logprobs` differs between them and is read by the caller;
/// llama-server's `n_probs` stands for it where the caller found none.
fn common(f: &Fields, logprobs: Option<usize>, d: &RequestDefaults) -> Result<Common, ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(v) => Fields::of(v, "stream_options")?.bool("include_usage")?.unwrap_or(false),
    };
    let max_tokens = match f.integer("max_completion_tokens", 1, u32::MAX as i64)? {
        Some(n) => Some(n),
        None => match f.integer("max_tokens", 1, u32::MAX as i64)? {
            Some(n) => Some(n),
            // llama.cpp's name; -1 (and -2, to the end of the context) mean no limit.
            None => match f.integer("n_predict", -2, u32::MAX as i64)? {
                Some(0) => return Err(f.out_of_range("n_predict", 0, "expected -1, -2, or a count from 1")),
                Some(n) if n < 0 => None,
                None => d.n_predict.map(|n| n as i64),
                other => other,
            },
        },
    };
    let defaults = &d.sampling;
    // OpenAI allows top_p = 0, meaning the most likely token only; the smallest positive value
    // keeps exactly that token in the top-p sampler.
    let top_p = f
        .clamped("top_p", 0.0, 1.0)?
        .map(|p| p.max(f32::MIN_POSITIVE))
        .unwrap_or(defaults.top_p);
    let penalty_last_n = match f.integer("repeat_last_n", -1, i32::MAX as i64)? {
        None => defaults.penalty_last_n,
        Some(-1) => usize::MAX,
        Some(n) => n as usize,
    };
    let (logit_bias, logit_bias_text) = match f.get("logit_bias") {
        None => (Vec::new(), Vec::new()),
        Some(v) => logit_bias(v)?,
    };
    let sampling = SamplingParams {
        // llama-server's temperature has no upper bound, and below 0 it is greedy.
        temperature: f
            .clamped("temperature", 0.0, f32::MAX as f64)?
            .unwrap_or(defaults.temperature),
        top_k: f
            .integer("top_k", i64::MIN, i64::MAX)?
            .map_or(defaults.top_k, |k| k.clamp(0, i32::MAX as i64) as i32),
        top_p,
        min_p: f.clamped("min_p", 0.0, 1.0)?.unwrap_or(defaults.min_p),
        repeat_penalty: match f.number("repeat_penalty", 0.0, 100.0)? {
            Some(p) if p <= 0.0 => return Err(f.out_of_range("repeat_penalty", p, "expected a number above 0")),
            Some(p) => p,
            None => defaults.repeat_penalty,
        },
        frequency_penalty: f.number("frequency_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        presence_penalty: f.number("presence_penalty", -2.0, 2.0)?.unwrap_or(0.0),
        penalty_last_n,
        seed: defaults.seed,
        typical_p: f.number("typical_p", 0.0, 1.0)?.unwrap_or(defaults.typical_p),
        top_n_sigma: f.number("top_n_sigma", -100.0, 100.0)?.unwrap_or(defaults.top_n_sigma),
        xtc_probability: f
            .clamped("xtc_probability", 0.0, 1.0)?
            .unwrap_or(defaults.xtc_probability),
        xtc_threshold: f.clamped("xtc_threshold", 0.0, 1.0)?.unwrap_or(defaults.xtc_threshold),
        dry_multiplier: f
            .number("dry_multiplier", 0.0, 100.0)?
            .unwrap_or(defaults.dry_multiplier),
        // llama-server replaces a base below 1 (which would turn DRY off) with its default.
        dry_base: f
            .number("dry_base", 0.0, 100.0)?
            .filter(|&b| b >= 1.0)
            .unwrap_or(defaults.dry_base),
        dry_allowed_length: f
            .integer("dry_allowed_length", 0, i32::MAX as i64)?
            .map_or(defaults.dry_allowed_length, |n| n as usize),
        dry_penalty_last_n: match f.integer("dry_penalty_last_n", -1, i32::MAX as i64)? {
            None => defaults.dry_penalty_last_n,
            // llama.cpp's -1, the context size: everything there is of the history.
            Some(-1) => usize::MAX,
            Some(n) => n as usize,
        },
        dry_sequence_breakers: match f.get("dry_sequence_breakers") {
            None => defaults.dry_sequence_breakers.clone(),
            Some(v) => dry_sequence_breakers(v)?,
        },
        mirostat: f
            .integer("mirostat", i64::MIN, i64::MAX)?
            .and_then(|m| Mirostat::from_number(m.clamp(0, 2)))
            .unwrap_or(defaults.mirostat),
        mirostat_tau: f.number("mirostat_tau", 0.0, 100.0)?.unwrap_or(defaults.mirostat_tau),
        mirostat_eta: f.number("mirostat_eta", 0.0, 100.0)?.unwrap_or(defaults.mirostat_eta),
        samplers: match f.get("samplers") {
            None => defaults.samplers.clone(),
            Some(v) => samplers(v)?,
        },
        logit_bias,
    };
    let seed = match f.get("seed") {
        None => d.seed,
        Some(Json::Number(n)) => match (n.as_u64(), n.as_i64()) {
            // llama-server's seed is 32 bits, and -1 (its LLAMA_DEFAULT_SEED) asks for a random one.
            (Some(u), _) if u == u32::MAX as u64 => None,
            (Some(u), _) => Some(u),
            (None, Some(-1)) => None,
            // OpenAI's seed is a signed 64-bit integer; its bits are the generator's seed.
            (None, Some(i)) => Some(i as u64),
            _ => return Err(f.wrong("seed", "an integer", &Json::Number(n.clone()))),
        },
        Some(other) => return Err(f.wrong("seed", "an integer", other)),
    };
    let stop = match f.get("stop") {
        None => d.stop.clone(),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(items)) => {
            if items.len() > MAX_STOPS {
                return Err(ApiError::field(
                    "stop",
                    format!("stop has {} strings; at most {MAX_STOPS} are allowed", items.len()),
                ));
            }
            strings("stop", items)?
        }
        Some(other) => return Err(f.wrong("stop", "a string or an array of strings", other)),
    };
    // An empty stop string would end every generation at once; llama-server skips it.
    let stop: Vec<String> = stop.into_iter().filter(|s| !s.is_empty()).collect();
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_LEN) {
        return Err(ApiError::field(
            "stop",
            format!(
                "a stop string has {} bytes; at most {MAX_STOP_LEN} are allowed",
                long.len()
            ),
        ));
    }
    let n = match f.integer("n_cmpl", 1, MAX_CHOICES as i64)? {
        Some(n) => n,
        None => f.integer("n", 1, MAX_CHOICES as i64)?.unwrap_or(1),
    } as usize;
    let logprobs = match logprobs {
        Some(n) => Some(n),
        None => f
            .integer("n_probs", 0, MAX_TOP_LOGPROBS as i64)?
            .filter(|&n| n > 0)
            .map(|n| n as usize),
    };
    Ok(Common {
        stream,
        include_usage,
        max_tokens: max_tokens.map(|n| n as usize),
        sampling,
        seed,
        stop,
        n,
        logprobs,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(d.ignore_eos),
        grammar: grammar(f)?,
        user: f.get("user").and_then(Json::as_str).map(str::to_string),
        logit_bias_text,
        llama: llama_server_fields(f, d)?,
        reasoning_budget: None,
    })
}

/// A field, whether a value leaves it off, and that value as the refusal names it.
type OffValue = (&'static str, fn(&Json) -> bool, &'static str);

/// llama-server's fields minfer cannot honour, each with whether a value leaves it off (then it
/// is read and changes nothing, as in llama-server); any other value is a 400 naming the field,
/// since the output would not be what was asked for.
const UNSUPPORTED: [OffValue; 11] = [
    ("dynatemp_range", is_zero, "0"),
    ("adaptive_target", is_negative, "a negative number"),
    ("min_keep", is_zero, "0"),
    ("n_indent", is_zero, "0"),
    ("n_cache_reuse", is_zero, "0"),
    ("t_max_predict_ms", is_not_positive, "0 or -1"),
    ("lora", is_empty_array, "[]"),
    ("grammar_lazy", is_false, "false"),
    ("grammar_triggers", is_empty_array, "[]"),
    ("preserved_tokens", is_empty_array, "[]"),
    ("reasoning_control", is_false, "false"),
];

/// Fields llama-server's own chat handler sets for its parser: a client sending one at its
/// neutral value changes nothing; another value would need that parser.
const PARSER_FIELDS: [OffValue; 4] = [
    ("chat_format", is_zero, "0 (content only)"),
    ("chat_parser", is_empty_string, "\"\""),
    ("generation_prompt", is_empty_string, "\"\""),
    ("parse_tool_calls", is_false, "false"),
];

fn is_zero(v: &Json) -> bool {
    v.as_f64() == Some(0.0)
}
fn is_negative(v: &Json) -> bool {
    v.as_f64().is_some_and(|x| x < 0.0)
}
fn is_not_positive(v: &Json) -> bool {
    v.as_f64().is_some_and(|x| x <= 0.0)
}
fn is_empty_array(v: &Json) -> bool {
    v.as_array().is_some_and(Vec::is_empty)
}
fn is_false(v: &Json) -> bool {
    v == &Json::Bool(false)
}
fn is_empty_string(v: &Json) -> bool {
    v.as_str() == Some("")
}

/// Every field one of the endpoints reads: any other is ignored, and named on standard error
/// with `MINFER_SERVE_DEBUG=1` (a misspelt field is otherwise silent, as in llama-server).
#[rustfmt::skip]
const KNOWN_FIELDS: &[&str] = &[
    // Sampling and limits, every endpoint.
    "stream", "stream_options", "max_tokens", "max_completion_tokens", "n_predict", "temperature",
    "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "frequency_penalty",
    "presence_penalty", "typical_p", "top_n_sigma", "xtc_probability", "xtc_threshold",
    "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "mirostat", "mirostat_tau", "mirostat_eta", "samplers", "logit_bias",
    "seed", "stop", "n", "n_cmpl", "ignore_eos", "response_format", "json_schema", "grammar", "user",
    "logprobs", "n_probs", "model", "dynatemp_exponent", "adaptive_decay", "backend_sampling",
    "reasoning_budget_start_tag", "reasoning_budget_end_tags", "reasoning_budget_end_tag",
    "reasoning_budget_message", "reasoning_format", "reasoning_budget_tokens", "thinking_budget_tokens",
    // llama-server's request options.
    "post_sampling_probs", "id_slot", "cache_prompt", "return_tokens", "return_progress",
    "timings_per_token", "verbose", "response_fields", "sse_ping_interval", "n_keep", "n_discard",
    // Chat.
    "messages", "tools", "tool_choice", "top_logprobs", "chat_template_kwargs", "reasoning_effort",
    "parallel_tool_calls", "add_generation_prompt", "continue_final_message",
    // Completions.
    "prompt", "echo", "suffix", "input_prefix", "input_suffix", "input_extra",
];

/// llama-server's fields beyond sampling: the options it reads on every endpoint, the fields
/// minfer refuses unless off, and the debug line naming fields nobody reads.
fn llama_server_fields(f: &Fields, d: &RequestDefaults) -> Result<LlamaFields, ApiError> {
    for (name, off, off_text) in UNSUPPORTED.iter().chain(PARSER_FIELDS.iter()) {
        if let Some(v) = f.get(name) {
            if !off(v) {
                return Err(ApiError::field(
                    *name,
                    format!("{name} is not supported by minfer (leave it out, or send {off_text}, which turns it off)"),
                ));
            }
        }
    }
    f.number("dynatemp_exponent", f64::MIN, f64::MAX)?;
    f.number("adaptive_decay", 0.0, 0.99)?;
    f.bool("backend_sampling")?;
    if debug_enabled() {
        let unknown: Vec<&str> = f
            .map
            .keys()
            .map(String::as_str)
            .filter(|k| !KNOWN_FIELDS.contains(k) && !UNSUPPORTED.iter().chain(PARSER_FIELDS.iter()).any(|u| u.0 == *k))
            .collect();
        if !unknown.is_empty() {
            eprintln!(
                "minfer serve: debug: request fields ignored (unknown): {}",
                unknown.join(", ")
            );
        }
    }
    let defaults = LlamaFields::default();
    let response_fields = match f.get("response_fields") {
        None => Vec::new(),
        Some(Json::Array(items)) => strings("response_fields", items)?,
        Some(other) => return Err(f.wrong("response_fields", "an array of field names", other)),
    };
    Ok(LlamaFields {
        post_sampling_probs: f.bool("post_sampling_probs")?.unwrap_or(false),
        id_slot: f
            .integer("id_slot", -1, crate::engine::MAX_SEQUENCES as i64 - 1)?
            .filter(|&s| s >= 0)
            .map(|s| s as usize),
        cache_prompt: f.bool("cache_prompt")?.unwrap_or(defaults.cache_prompt),
        return_tokens: f.bool("return_tokens")?.unwrap_or(false),
        return_progress: f.bool("return_progress")?.unwrap_or(false),
        timings_per_token: f.bool("timings_per_token")?.unwrap_or(false),
        verbose: f.bool("verbose")?.unwrap_or(d.verbose),
        response_fields,
        sse_ping_interval: f
            .integer("sse_ping_interval", -1, i32::MAX as i64)?
            .unwrap_or(defaults.sse_ping_interval),
        n_keep: f.integer("n_keep", -1, i32::MAX as i64)?.unwrap_or(0),
        n_discard: f.integer("n_discard", 0, i32::MAX as i64)?.unwrap_or(0),
        reasoning_budget: match f.integer("reasoning_budget_tokens", -1, i32::MAX as i64)? {
            Some(-1) | None => match f.integer("thinking_budget_tokens", -1, i32::MAX as i64)? {
                Some(-1) | None => d.reasoning_budget,
                Some(n) => Some(n as usize),
            },
            Some(n) => Some(n as usize),
        },
        reasoning_budget_message: f
            .str("reasoning_budget_message")?
            .map_or_else(|| d.reasoning_budget_message.clone(), str::to_string),
        reasoning_format: match f.str("reasoning_format")? {
            None => d.reasoning_format,
            Some(name) => ReasoningFormat::from_name(name).ok_or_else(|| {
                ApiError::field(
                    "reasoning_format",
                    format!("reasoning_format '{name}' is not one of none, deepseek, deepseek-legacy, auto"),
                )
            })?,
        },
    })
}

/// Whether `MINFER_SERVE_DEBUG` is set (to anything but empty or 0): debug lines on standard
/// error, read once.
pub fn debug_enabled() -> bool {
    static DEBUG: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DEBUG.get_or_init(|| std::env::var("MINFER_SERVE_DEBUG").is_ok_and(|v| !v.is_empty() && v != "0"))
}

/// The output constraint a request asks for: OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema` with its `schema`), or llama-server's own `json_schema` (a
/// schema) or `grammar` (GBNF). At most one. A GBNF text is parsed here, so that its error
/// names the line and column; schemas are checked when compiled.
fn grammar(f: &Fields) -> Result<Option<(String, GrammarSpec)>, ApiError> {
    let mut given: Vec<(String, GrammarSpec)> = Vec::new();
    if let Some(format) = f.get("response_format") {
        let format_fields = Fields::of(format, "response_format")?;
        match format_fields.str("type")? {
            Some("text") => {}
            Some("json_object") => match format_fields.get("schema") {
                // llama-server's extension: a schema beside json_object.
                Some(schema) => given.push((
                    "response_format.schema".into(),
                    schema_spec("response_format.schema", schema)?,
                )),
                None => given.push(("response_format".into(), GrammarSpec::JsonObject)),
            },
            Some("json_schema") => {
                let inner = format_fields.get("json_schema").ok_or_else(|| {
                    ApiError::field(
                        "response_format.json_schema",
                        "response_format.json_schema is required when the type is json_schema",
                    )
                })?;
                let inner = Fields::of(inner, "response_format.json_schema")?;
                inner.str("name")?;
                inner.bool("strict")?;
                let schema = inner.get("schema").ok_or_else(|| {
                    ApiError::field(
                        "response_format.json_schema.schema",
                        "response_format.json_schema.schema is required",
                    )
                })?;
                let field = "response_format.json_schema.schema";
                given.push((field.into(), schema_spec(field, schema)?));
            }
            Some(other) => {
                return Err(ApiError::field(
                    "response_format.type",
                    format!("response_format.type '{other}' is not one of text, json_object, json_schema"),
                ))
            }
            None => {
                return Err(ApiError::field(
                    "response_format.type",
                    "response_format.type is required",
                ))
            }
        }
    }
    if let Some(schema) = f.get("json_schema") {
        given.push(("json_schema".into(), schema_spec("json_schema", schema)?));
    }
    if let Some(text) = f.str("grammar")? {
        if let Err(e) = crate::grammar::gbnf::to_lark(text) {
            return Err(ApiError::field("grammar", format!("grammar does not parse: {e}")));
        }
        given.push(("grammar".into(), GrammarSpec::Gbnf(text.to_string())));
    }
    if given.len() > 1 {
        return Err(ApiError::field(
            given[1].0.clone(),
            format!("{} and {} both constrain the output: send one", given[0].0, given[1].0),
        ));
    }
    Ok(given.pop())
}

fn schema_spec(field: &str, schema: &Json) -> Result<GrammarSpec, ApiError> {
    match schema {
        Json::Object(_) | Json::Bool(_) => {
            schema_budget(field, schema)?;
            Ok(GrammarSpec::JsonSchema(schema.clone()))
        }
        other => Err(ApiError::field(
            field,
            format!("{field} must be a JSON Schema (an object), not {}", kind(other)),
        )),
    }
}

/// A schema deeper or larger than the grammar compiler may walk, refused naming the field.
fn schema_budget(field: &str, schema: &Json) -> Result<(), ApiError> {
    crate::grammar::check_schema(schema).map_err(|e| {
        ApiError::field(
            field,
            format!("{field} cannot be used: JSON schema over the budget: {e}"),
        )
    })
}

/// Most `dry_sequence_breakers`, and the longest one in bytes (DRY reads its first 40 bytes):
/// each costs a pass over the vocabulary when the generation starts.
const MAX_DRY_BREAKERS: usize = 16;
const MAX_DRY_BREAKER_LEN: usize = 256;
/// Most stages in `samplers`, and most `logit_bias` entries.
const MAX_SAMPLERS: usize = 32;
const MAX_LOGIT_BIAS: usize = 1024;

/// llama-server's `dry_sequence_breakers`: a non-empty array of strings.
fn dry_sequence_breakers(value: &Json) -> Result<Vec<String>, ApiError> {
    const NAME: &str = "dry_sequence_breakers";
    let Json::Array(items) = value else {
        return Err(ApiError::field(
            NAME,
            format!("{NAME} must be a non-empty array of strings, not {}", kind(value)),
        ));
    };
    if items.is_empty() || items.len() > MAX_DRY_BREAKERS {
        return Err(ApiError::field(
            NAME,
            format!(
                "{NAME} has {} strings; from 1 to {MAX_DRY_BREAKERS} are allowed",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Json::String(s) if s.len() <= MAX_DRY_BREAKER_LEN => Ok(s.clone()),
            Json::String(s) => Err(ApiError::field(
                format!("{NAME}[{i}]"),
                format!(
                    "{NAME}[{i}] has {} bytes; at most {MAX_DRY_BREAKER_LEN} are allowed",
                    s.len()
                ),
            )),
            other => Err(ApiError::field(
                format!("{NAME}[{i}]"),
                format!("{NAME}[{i}] must be a string, not {}", kind(other)),
            )),
        })
        .collect()
}

/// llama-server's `samplers`: an array of sampler names, or a string of one-letter codes
/// (`"kpt"`); a string with `;` is read as names, as `--samplers` writes them.
fn samplers(value: &Json) -> Result<Vec<SamplerKind>, ApiError> {
    const NAME: &str = "samplers";
    let refuse = |e: SamplingError| ApiError::field(NAME, format!("{NAME}: {e}"));
    let chain = match value {
        Json::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Json::String(name) => SamplerKind::from_name(name).ok_or_else(|| {
                    ApiError::field(
                        format!("{NAME}[{i}]"),
                        format!(
                            "{NAME}[{i}] '{name}' is not a sampler name; expected one of {}",
                            SamplerKind::NAMES
                        ),
                    )
                }),
                other => Err(ApiError::field(
                    format!("{NAME}[{i}]"),
                    format!("{NAME}[{i}] must be a string, not {}", kind(other)),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Json::String(s) if s.contains(';') => SamplerKind::parse_list(s).map_err(refuse)?,
        Json::String(s) => SamplerKind::parse_codes(s).map_err(refuse)?,
        other => {
            return Err(ApiError::field(
                NAME,
                format!(
                    "{NAME} must be an array of sampler names or a string of sampler letters, not {}",
                    kind(other)
                ),
            ))
        }
    };
    if chain.len() > MAX_SAMPLERS {
        return Err(ApiError::field(
            NAME,
            format!("{NAME} has {} stages; at most {MAX_SAMPLERS} are allowed", chain.len()),
        ));
    }
    Ok(chain)
}

/// `logit_bias`, in OpenAI's form (an object from token id strings to a bias) or llama-server's
/// (an array of `[id, bias]` pairs); a bias lies in [-100, 100], and `false` bans the token
/// (-inf). As in llama-server, a key or pair that names text instead of an id biases each
/// token of that text (returned apart, for the handler to tokenize). Ids are checked against
/// the vocabulary where it is known, when the request starts.
#[allow(clippy::type_complexity)]
fn logit_bias(value: &Json) -> Result<(Vec<(u32, f32)>, Vec<(String, f32)>), ApiError> {
    const NAME: &str = "logit_bias";
    let bias = |path: &str, v: &Json| -> Result<f32, ApiError> {
        match v {
            Json::Bool(false) => Ok(f32::NEG_INFINITY),
            Json::Number(n) => match n.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok(b as f32),
                _ => Err(ApiError::field(
                    path,
                    format!("{path} = {n} is out of range: expected a number from -100 to 100"),
                )),
            },
            other => Err(ApiError::field(
                path,
                format!("{path} must be a number from -100 to 100 or false, not {}", kind(other)),
            )),
        }
    };
    let too_many = |n: usize| {
        ApiError::field(
            NAME,
            format!("{NAME} has {n} entries; at most {MAX_LOGIT_BIAS} are allowed"),
        )
    };
    let (mut ids, mut texts) = (Vec::new(), Vec::new());
    match value {
        Json::Object(map) => {
            if map.len() > MAX_LOGIT_BIAS {
                return Err(too_many(map.len()));
            }
            for (key, v) in map {
                let path = format!("{NAME}.{key}");
                let b = bias(&path, v)?;
                match key.parse::<i64>() {
                    Ok(id) if (0..=u32::MAX as i64).contains(&id) => ids.push((id as u32, b)),
                    Ok(_) => {
                        return Err(ApiError::field(
                            &path,
                            format!("{NAME} key '{key}' is not a token id (an integer >= 0)"),
                        ))
                    }
                    Err(_) => texts.push((key.clone(), b)),
                }
            }
        }
        Json::Array(items) => {
            if items.len() > MAX_LOGIT_BIAS {
                return Err(too_many(items.len()));
            }
            for (i, pair) in items.iter().enumerate() {
                let path = format!("{NAME}[{i}]");
                let Some([id, b]) = pair.as_array().map(Vec::as_slice) else {
                    return Err(ApiError::field(
                        &path,
                        format!("{path} must be a [token id or text, bias] pair"),
                    ));
                };
                let b = bias(&format!("{path}[1]"), b)?;
                match id {
                    Json::String(text) => texts.push((text.clone(), b)),
                    _ => {
                        let token = id.as_u64().filter(|&t| t <= u32::MAX as u64).ok_or_else(|| {
                            ApiError::field(
                                format!("{path}[0]"),
                                format!("{path}[0] must be a token id (an integer >= 0) or a text"),
                            )
                        })?;
                        ids.push((token as u32, b));
                    }
                }
            }
        }
        other => {
            return Err(ApiError::field(
                NAME,
                format!(
                    "{NAME} must be an object of token ids to biases or an array of [id, bias] pairs, not {}",
                    kind(other)
                ),
            ))
        }
    }
    Ok((ids, texts))
}

/// What a request gets for the fields it leaves out: the server's sampling flags (llama-server's
/// `--temp`, `--top-k`, `-s`, `-n`, … are defaults for every request, not overrides).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestDefaults {
    /// The OpenAI endpoints' sampling ([`server_sampling_defaults`] unless flags say otherwise).
    pub sampling: SamplingParams,
    /// Min-p of `/completion` and `/infill`, which keep llama.cpp's 0.05 where the OpenAI
    /// endpoints default to none; a server's `--min-p` sets both.
    pub native_min_p: f32,
    /// The seed of a request that sends none (`None`: each draws its own).
    pub seed: Option<u64>,
    /// The token limit of a request that sends none (`None`: the end of the context).
    pub n_predict: Option<usize>,
    /// The stop strings of a request that sends none (llama-server's `-r`).
    pub stop: Vec<String>,
    /// `ignore_eos` of a request that does not say (llama-server's `--ignore-eos`).
    pub ignore_eos: bool,
    /// `verbose` of a request that does not say: llama-server's `__verbose` beside every OpenAI
    /// answer (its `--verbose`).
    pub verbose: bool,
    /// Where a chat reply's reasoning goes when the request does not say (`--reasoning-format`).
    pub reasoning_format: ReasoningFormat,
    /// Template variables of a request that does not set them: `enable_thinking`, true unless
    /// `--reasoning off`.
    pub template_kwargs: Map<String, Json>,
    /// The reasoning budget of a request that sets none (`--reasoning-budget`; `None`: no
    /// limit).
    pub reasoning_budget: Option<usize>,
    /// The text forced before the closing tag when the budget is spent
    /// (`--reasoning-budget-message`).
    pub reasoning_budget_message: String,
}

impl Default for RequestDefaults {
    fn default() -> Self {
        RequestDefaults {
            sampling: server_sampling_defaults(),
            native_min_p: SamplingParams::default().min_p,
            seed: None,
            n_predict: None,
            stop: Vec::new(),
            ignore_eos: false,
            verbose: false,
            reasoning_format: ReasoningFormat::Auto,
            // llama-server passes `enable_thinking` to every template, true unless
            // `--reasoning off` (a template that closes the reasoning unless it is set, as
            // llama.cpp's copy of R1's does, thinks).
            template_kwargs: [("enable_thinking".to_string(), Json::Bool(true))]
                .into_iter()
                .collect(),
            reasoning_budget: None,
            reasoning_budget_message: String::new(),
        }
    }
}

/// The sampling the server uses for fields a request leaves out: the engine's (llama.cpp's)
/// defaults, except that the repeat penalty is off, as in OpenAI's API and llama.cpp's server,
/// so `temperature: 0` alone is greedy decoding.
pub fn server_sampling_defaults() -> SamplingParams {
    SamplingParams {
        repeat_penalty: 1.0,
        // OpenAI's API has no min-p: a request that does not send one gets the distribution
        // OpenAI clients expect.
        min_p: 0.0,
        ..SamplingParams::default()
    }
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

pub fn chat(body: &Json, d: &RequestDefaults) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::field(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        ));
    }
    let common = common(&f, logprobs.then_some(top.unwrap_or(0) as usize), d)?;
    let messages = match f.get("messages") {
        None => return Err(ApiError::field("messages", "messages is required")),
        Some(Json::Array(items)) if items.is_empty() => {
            return Err(ApiError::field("messages", "messages must hold at least one message"))
        }
        Some(Json::Array(items)) if items.len() > MAX_MESSAGES => {
            return Err(ApiError::field(
                "messages",
                format!(
                    "messages has {} messages; at most {MAX_MESSAGES} are allowed",
                    items.len()
                ),
            ))
        }
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(other) => return Err(f.wrong("messages", "an array of messages", other)),
    };
    let tools = match f.get("tools") {
        None => None,
        Some(Json::Array(items)) if items.len() > MAX_TOOLS => {
            return Err(ApiError::field(
                "tools",
                format!("tools has {} tools; at most {MAX_TOOLS} are allowed", items.len()),
            ))
        }
        Some(Json::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, t)| tool(i, t))
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => return Err(f.wrong("tools", "an array of tools", other)),
    };
    let tool_choice = match f.get("tool_choice") {
        None => Some(ToolChoice::Auto),
        Some(Json::String(s)) => match s.as_str() {
            "none" => None,
            "auto" => Some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            other => {
                return Err(ApiError::field(
                    "tool_choice",
                    format!("tool_choice '{other}' is not one of none, auto, required, or a function object"),
                ))
            }
        },
        Some(v @ Json::Object(_)) => {
            let choice = Fields::of(v, "tool_choice")?;
            let function = choice
                .get("function")
                .ok_or_else(|| ApiError::field("tool_choice.function", "tool_choice.function is required"))?;
            match Fields::of(function, "tool_choice.function")?.str("name")? {
                Some(name) => Some(ToolChoice::Function(name.to_string())),
                None => {
                    return Err(ApiError::field(
                        "tool_choice.function.name",
                        "tool_choice.function.name is required",
                    ))
                }
            }
        }
        Some(other) => return Err(f.wrong("tool_choice", "a string or an object", other)),
    };
    let tools = tools.filter(|t| !t.is_empty() && tool_choice.is_some());
    let offered = |name: &str| {
        tools
            .iter()
            .flatten()
            .any(|t| t["function"]["name"].as_str() == Some(name))
    };
    let tool_choice = match tool_choice {
        None | Some(ToolChoice::Auto) => ToolChoice::Auto,
        Some(ToolChoice::Required) if tools.is_none() => {
            return Err(ApiError::field(
                "tool_choice",
                "tool_choice 'required' needs at least one tool in tools",
            ))
        }
        Some(ToolChoice::Function(name)) if !offered(&name) => {
            return Err(ApiError::field(
                "tool_choice.function.name",
                format!("tool_choice names the function '{name}', which is not among the tools offered"),
            ))
        }
        Some(required) => required,
    };
    let (messages, add_generation_prompt, prefill) = opening(&f, messages)?;
    Ok(ChatRequest {
        common,
        messages,
        tools,
        tool_choice,
        template_kwargs: template_kwargs(&f, d)?,
        add_generation_prompt,
        prefill,
    })
}

/// How the rendering ends, as llama-server decides it: a final assistant message is continued
/// (a prefill: the turn opened, its text after it, unclosed) unless the request says
/// `continue_final_message: false`; `continue_final_message: true` or `"content"` asks for that
/// explicitly (vLLM's form) and then `add_generation_prompt` must be false; two assistant
/// messages at the end, and continuing one with tool calls, are refused. A prefill's content
/// parts are joined as llama.cpp renders them, with a blank line.
fn opening(f: &Fields, mut messages: Vec<Json>) -> Result<(Vec<Json>, bool, Option<String>), ApiError> {
    let mut add = f.bool("add_generation_prompt")?.unwrap_or(true);
    let mut continued = match f.get("continue_final_message") {
        None | Some(Json::Bool(false)) => None,
        Some(Json::Bool(true)) => Some(true),
        Some(Json::String(s)) if s == "content" => Some(true),
        Some(Json::String(s)) if s == "reasoning_content" => return Err(ApiError::field(
            "continue_final_message",
            "continue_final_message 'reasoning_content' is not supported: minfer does not separate a reply's reasoning",
        )),
        Some(other) => return Err(f.wrong("continue_final_message", "true, false or 'content'", other)),
    };
    let is_assistant = |m: Option<&Json>| m.is_some_and(|m| m["role"] == "assistant");
    let ends_with_assistant = is_assistant(messages.last());
    if continued.is_none() && f.get("continue_final_message").is_none() && ends_with_assistant {
        if is_assistant(messages.len().checked_sub(2).and_then(|i| messages.get(i))) {
            return Err(ApiError::field(
                "messages",
                "the messages end with two assistant messages: at most one, the one the reply continues",
            ));
        }
        (continued, add) = (Some(true), false);
    }
    if continued.is_none() {
        return Ok((messages, add, None));
    }
    if add {
        return Err(ApiError::field(
            "continue_final_message",
            "continue_final_message and add_generation_prompt cannot both be true (send add_generation_prompt: false)",
        ));
    }
    if !ends_with_assistant {
        return Err(ApiError::field(
            "continue_final_message",
            "continue_final_message needs the last message to be the assistant's",
        ));
    }
    let last = messages.pop().unwrap_or_default();
    if last
        .get("tool_calls")
        .is_some_and(|c| c.as_array().is_some_and(|c| !c.is_empty()))
    {
        return Err(ApiError::field(
            "messages",
            "a final assistant message with tool calls cannot be continued",
        ));
    }
    let text = match &last["content"] {
        Json::String(s) => s.clone(),
        Json::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n\n"),
        _ => String::new(),
    };
    Ok((messages, true, Some(text)))
}

/// The values `reasoning_effort` may take: what gpt-oss's template prints as its reasoning
/// level (`Reasoning: high`), and OpenAI's own.
pub const REASONING_EFFORTS: [&str; 3] = ["low", "medium", "high"];

/// Variables that only the renderer sets: the conversation itself.
const RENDERER_VARIABLES: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The chat template's extra variables, as llama-server passes them: every key of
/// `chat_template_kwargs` (an object) as a variable of that name, then the body's
/// `reasoning_effort`, which replaces the kwarg of that name. `reasoning_effort` is one of
/// [`REASONING_EFFORTS`] wherever it is given, and `enable_thinking` a boolean (a string
/// `"false"` would read as true); a kwarg may not stand for the conversation the renderer
/// passes. Each refusal names the field and the value.
fn template_kwargs(f: &Fields, d: &RequestDefaults) -> Result<Map<String, Json>, ApiError> {
    const KWARGS: &str = "chat_template_kwargs";
    let mut kwargs = match f.get(KWARGS) {
        None => Map::new(),
        Some(Json::Object(map)) => map.clone(),
        Some(other) => return Err(f.wrong(KWARGS, "an object of template variables", other)),
    };
    // The server's own (`--reasoning off`: enable_thinking false) under the request's.
    for (name, value) in &d.template_kwargs {
        kwargs.entry(name.clone()).or_insert_with(|| value.clone());
    }
    kwargs.retain(|_, v| !v.is_null());
    for (name, value) in &kwargs {
        let path = format!("{KWARGS}.{name}");
        if RENDERER_VARIABLES.contains(&name.as_str()) {
            return Err(ApiError::field(
                &path,
                format!("{path} cannot be passed: the server sets '{name}' from the request itself"),
            ));
        }
        match (name.as_str(), value) {
            ("reasoning_effort", v) => {
                reasoning_effort(&path, v)?;
            }
            ("enable_thinking", Json::Bool(_)) => {}
            ("enable_thinking", other) => {
                return Err(ApiError::field(
                    &path,
                    format!("{path} must be a boolean, not {}", kind(other)),
                ))
            }
            _ => {}
        }
    }
    if let Some(v) = f.get("reasoning_effort") {
        kwargs.insert(
            "reasoning_effort".into(),
            Json::from(reasoning_effort("reasoning_effort", v)?),
        );
    }
    Ok(kwargs)
}

/// A `reasoning_effort` value at `path`, checked against [`REASONING_EFFORTS`].
fn reasoning_effort<'a>(path: &str, value: &'a Json) -> Result<&'a str, ApiError> {
    match value {
        Json::String(s) if REASONING_EFFORTS.contains(&s.as_str()) => Ok(s),
        Json::String(s) => Err(ApiError::field(
            path,
            format!("{path} '{s}' is not one of {}", REASONING_EFFORTS.join(", ")),
        )),
        other => Err(ApiError::field(
            path,
            format!(
                "{path} must be one of {}, not {}",
                REASONING_EFFORTS.join(", "),
                kind(other)
            ),
        )),
    }
}

/// One message, checked; `developer` (OpenAI's newer name for system) becomes `system`, and
/// tool-call arguments sent as a JSON string become the object the templates expect.
fn message(index: usize, value: &Json) -> Result<Json, ApiError> {
    let name = format!("messages[{index}]");
    let f = Fields::of(value, &name)?;
    let role = match f.get("role") {
        None => return Err(ApiError::field(f.path("role"), format!("{}.role is required", name))),
        Some(Json::String(r)) => r.as_str(),
        Some(other) => return Err(f.wrong("role", "a string", other)),
    };
    if !ROLES.contains(&role) {
        return Err(ApiError::field(
            f.path("role"),
            format!("{name}.role '{role}' is not one of system, user, assistant, tool, developer"),
        ));
    }
    let mut out = f.map.clone();
    if role == "developer" {
        out.insert("role".into(), Json::from("system"));
    }
    match f.map.get("content") {
        None | Some(Json::Null) if role == "assistant" => {}
        None | Some(Json::Null) => {
            return Err(ApiError::field(
                f.path("content"),
                format!("{name}.content is required"),
            ))
        }
        Some(Json::String(_)) => {}
        Some(Json::Array(parts)) => {
            for (i, part) in parts.iter().enumerate() {
                let part_name = format!("{name}.content[{i}]");
                let p = Fields::of(part, &part_name)?;
                match p.str("type")? {
                    Some("text") => {}
                    Some(other) => {
                        return Err(ApiError::field(
                            p.path("type"),
                            format!("{part_name}.type is '{other}'; only text parts are supported"),
                        ))
                    }
                    None => return Err(ApiError::field(p.path("type"), format!("{part_name}.type is required"))),
                }
                if p.str("text")?.is_none() {
                    return Err(ApiError::field(p.path("text"), format!("{part_name}.text is required")));
                }
            }
        }
        Some(other) => return Err(f.wrong("content", "a string or an array of text parts", other)),
    }
    if let Some(calls) = f.get("tool_calls") {
        let Json::Array(calls) = calls else {
            return Err(f.wrong("tool_calls", "an array", calls));
        };
        let mut parsed = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            let call_name = format!("{name}.tool_calls[{i}]");
            let c = Fields::of(call, &call_name)?;
            let function = c
                .get("function")
                .ok_or_else(|| ApiError::field(c.path("function"), format!("{call_name}.function is required")))?;
            let fun = Fields::of(function, &c.path("function"))?;
            if fun.str("name")?.is_none() {
                return Err(ApiError::field(
                    fun.path("name"),
                    format!("{}.name is required", fun.prefix),
                ));
            }
            let mut function = fun.map.clone();
            if let Some(Json::String(args)) = fun.get("arguments") {
                if let Ok(obj @ Json::Object(_)) = serde_json::from_str::<Json>(args) {
                    function.insert("arguments".into(), obj);
                }
            }
            let mut call = c.map.clone();
            call.insert("function".into(), Json::Object(function));
            parsed.push(Json::Object(call));
        }
        out.insert("tool_calls".into(), Json::Array(parsed));
    }
    Ok(Json::Object(out))
}

fn tool(index: usize, value: &Json) -> Result<Json, ApiError> {
    let name = format!("tools[{index}]");
    let f = Fields::of(value, &name)?;
    match f.str("type")? {
        Some("function") => {}
        Some(other) => {
            return Err(ApiError::field(
                f.path("type"),
                format!("{name}.type is '{other}'; only function tools are supported"),
            ))
        }
        None => return Err(ApiError::field(f.path("type"), format!("{name}.type is required"))),
    }
    let function = f
        .get("function")
        .ok_or_else(|| ApiError::field(f.path("function"), format!("{name}.function is required")))?;
    let fun = Fields::of(function, &f.path("function"))?;
    if fun.str("name")?.is_none() {
        return Err(ApiError::field(
            fun.path("name"),
            format!("{}.name is required", fun.prefix),
        ));
    }
    fun.str("description")?;
    if let Some(p) = fun.get("parameters") {
        if !p.is_object() {
            return Err(fun.wrong("parameters", "a JSON schema object", p));
        }
        // The call grammar compiles it: over the budget it would be refused only then, or
        // not at all with tool_choice none; refused here, whatever the choice.
        schema_budget(&fun.path("parameters"), p)?;
    }
    Ok(value.clone())
}

pub fn completion(body: &Json, d: &RequestDefaults) -> Result<CompletionRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let logprobs = f.integer("logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|n| n as usize);
    let common = common(&f, logprobs, d)?;
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::field("echo", "echo is not supported"));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "suffix is not supported"));
    }
    let prompts = prompts(&f)?;
    within_choices(prompts.len(), common.n, "n")?;
    Ok(CompletionRequest { common, prompts })
}

/// Refuses `n_prompts` prompts answered `n` times each (`n_name`: the field that gave `n`) when
/// that is more than [`MAX_CHOICES`] completions.
fn within_choices(n_prompts: usize, n: usize, n_name: &str) -> Result<(), ApiError> {
    if n_prompts * n > MAX_CHOICES {
        return Err(ApiError::field(
            "prompt",
            format!(
                "{n_prompts} prompts × {n_name} = {n} asks for {} completions; at most {MAX_CHOICES} are allowed",
                n_prompts * n
            ),
        ));
    }
    Ok(())
}

/// A body of llama-server's own `/completion`: its prompts (each answered apart, `n_cmpl`
/// times) and the common fields under llama-server's names and defaults (min-p 0.05, as
/// llama.cpp; no repeat penalty).
#[derive(Debug, Clone)]
pub struct NativeRequest {
    pub common: Common,
    pub prompts: Vec<Prompt>,
}

/// The fields `/completion` and `/infill` share: the common ones, `logprobs` an alias of
/// `n_probs` (as llama-server reads it) and min-p at llama.cpp's default.
fn native_common(f: &Fields, d: &RequestDefaults) -> Result<Common, ApiError> {
    let logprobs = match f.get("n_probs") {
        Some(_) => None,
        None => f
            .integer("logprobs", 0, MAX_TOP_LOGPROBS as i64)?
            .filter(|&n| n > 0)
            .map(|n| n as usize),
    };
    let mut common = common(f, logprobs, d)?;
    if f.get("min_p").is_none() {
        common.sampling.min_p = d.native_min_p;
    }
    Ok(common)
}

pub fn native_completion(body: &Json, d: &RequestDefaults) -> Result<NativeRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let common = native_common(&f, d)?;
    let prompts = prompts(&f)?;
    within_choices(prompts.len(), common.n, "n_cmpl")?;
    Ok(NativeRequest { common, prompts })
}

/// A body of llama-server's `/infill`: the code before and after the cursor, other files of
/// the project for context (`input_extra`: `{"filename", "text"}`), and text that follows the
/// middle marker (`prompt`).
#[derive(Debug, Clone)]
pub struct InfillRequest {
    pub common: Common,
    pub prefix: String,
    pub suffix: String,
    pub extra: Vec<(String, String)>,
    pub prompt: String,
}

/// Most `input_extra` chunks an infill takes.
const MAX_EXTRA_CHUNKS: usize = 256;

pub fn infill(body: &Json, d: &RequestDefaults) -> Result<InfillRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let common = native_common(&f, d)?;
    let text = |name: &str| -> Result<String, ApiError> { Ok(f.str(name)?.unwrap_or_default().to_string()) };
    let extra = match f.get("input_extra") {
        None => Vec::new(),
        Some(Json::Array(items)) if items.len() > MAX_EXTRA_CHUNKS => {
            return Err(ApiError::field(
                "input_extra",
                format!(
                    "input_extra has {} chunks; at most {MAX_EXTRA_CHUNKS} are allowed",
                    items.len()
                ),
            ))
        }
        // As llama-server checks them: each chunk's text is required, its file name optional.
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let chunk = Fields::of(item, &format!("input_extra[{i}]"))?;
                let filename = chunk.str("filename")?.unwrap_or_default().to_string();
                let text = chunk
                    .str("text")?
                    .ok_or_else(|| ApiError::field(chunk.path("text"), format!("input_extra[{i}].text is required")))?;
                Ok((filename, text.to_string()))
            })
            .collect::<Result<_, ApiError>>()?,
        Some(other) => return Err(f.wrong("input_extra", "an array of {filename, text} objects", other)),
    };
    Ok(InfillRequest {
        common,
        prefix: text("input_prefix")?,
        suffix: text("input_suffix")?,
        extra,
        prompt: text("prompt")?,
    })
}

/// A `/tokenize` body: the text, and whether to add BOS, parse control-token text and return
/// pieces (llama-server's defaults: no, yes, no).
pub fn tokenize(body: &Json) -> Result<(String, bool, bool, bool), ApiError> {
    let f = Fields::of(body, "")?;
    let content = f
        .str("content")?
        .ok_or_else(|| ApiError::field("content", "content is required"))?;
    Ok((
        content.to_string(),
        f.bool("add_special")?.unwrap_or(false),
        f.bool("parse_special")?.unwrap_or(true),
        f.bool("with_pieces")?.unwrap_or(false),
    ))
}

/// A `/detokenize` body: `{"tokens": [id, ...]}` (an empty list is empty text).
pub fn detokenize(body: &Json) -> Result<Vec<u32>, ApiError> {
    let f = Fields::of(body, "")?;
    match f.get("tokens") {
        None => Err(ApiError::field("tokens", "tokens is required")),
        Some(Json::Array(items)) if items.is_empty() => Ok(Vec::new()),
        Some(Json::Array(items)) => token_ids("tokens", items),
        Some(other) => Err(f.wrong("tokens", "an array of token ids", other)),
    }
}

fn token_ids(name: &str, items: &[Json]) -> Result<Vec<u32>, ApiError> {
    if items.is_empty() {
        return Err(ApiError::field(name, format!("{name} must not be empty")));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .filter(|&id| id <= u32::MAX as u64)
                .map(|id| id as u32)
                .ok_or_else(|| {
                    ApiError::field(
                        format!("{name}[{i}]"),
                        format!("{name}[{i}] must be a token id (an integer ≥ 0)"),
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // The readers with a server's default flags.
    fn chat(body: &Json) -> Result<ChatRequest, ApiError> {
        super::chat(body, &RequestDefaults::default())
    }
    fn completion(body: &Json) -> Result<CompletionRequest, ApiError> {
        super::completion(body, &RequestDefaults::default())
    }
    fn native_completion(body: &Json) -> Result<NativeRequest, ApiError> {
        super::native_completion(body, &RequestDefaults::default())
    }
    fn infill(body: &Json) -> Result<InfillRequest, ApiError> {
        super::infill(body, &RequestDefaults::default())
    }

    #[test]
    fn a_minimal_chat_request_reads_with_the_server_defaults() {
        let r = chat(&json!({"model": "x", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        assert_eq!(r.common.n, 1);
        assert!(!r.common.stream);
        assert_eq!(r.common.sampling, server_sampling_defaults());
        assert_eq!(r.common.max_tokens, None);
        assert!(r.tools.is_none());
    }

    #[test]
    fn errors_name_the_field_at_fault() {
        let cases = [
            (json!({"messages": "hi"}), "messages"),
            (json!({}), "messages"),
            (
                json!({"messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0].role",
            ),
            (json!({"messages": [{"content": "x"}]}), "messages[0].role"),
            (
                json!({"messages": [{"role": "user", "content": 3}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (json!({"messages": [{"role": "user", "content": "x"}], "n": 0}), "n"),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}),
                "max_tokens",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "stop": [1]}),
                "stop[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}),
                "top_logprobs",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
                "tools[0].function",
            ),
        ];
        for (body, field) in cases {
            let err = chat(&body).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(field), "{body}: {}", err.message);
            assert!(err.message.contains(field), "{body}: {}", err.message);
        }
    }

    #[test]
    fn fields_that_would_change_the_output_are_honoured_or_refused_by_name() {
        let base = || json!({"messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Json| {
            let mut b = base();
            b[k] = v;
            chat(&b)
        };
        assert_eq!(with("n_predict", json!(4)).unwrap().common.max_tokens, Some(4));
        assert_eq!(with("n_predict", json!(-1)).unwrap().common.max_tokens, None);
        assert_eq!(
            with("n_predict", json!(0)).unwrap_err().param.as_deref(),
            Some("n_predict")
        );
        assert!(with("response_format", json!({"type": "text"}))
            .unwrap()
            .common
            .grammar
            .is_none());
        assert!(with("logit_bias", json!({})).is_ok());
        assert_eq!(with("min_p", json!(0.2)).unwrap().common.sampling.min_p, 0.2);
        assert_eq!(with("min_p", json!("0.2")).unwrap_err().param.as_deref(), Some("min_p"));
    }

    fn chat_with(field: &str, value: Json) -> Result<ChatRequest, ApiError> {
        let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
        body[field] = value;
        chat(&body)
    }

    fn native_with(field: &str, value: Json) -> Result<NativeRequest, ApiError> {
        let mut body = json!({"prompt": "x"});
        body[field] = value;
        native_completion(&body)
    }

    #[test]
    fn llama_server_sampler_fields_are_read_on_every_endpoint() {
        let chat_sampling = |k: &str, v: Json| chat_with(k, v).unwrap().common.sampling;
        let native_sampling = |k: &str, v: Json| native_with(k, v).unwrap().common.sampling;
        let completion_sampling = |k: &str, v: Json| {
            let mut body = json!({"prompt": "x"});
            body[k] = v;
            completion(&body).unwrap().common.sampling
        };
        for read in [
            &chat_sampling as &dyn Fn(&str, Json) -> SamplingParams,
            &native_sampling,
            &completion_sampling,
        ] {
            assert_eq!(read("typical_p", json!(0.5)).typical_p, 0.5);
            assert_eq!(read("top_n_sigma", json!(1.5)).top_n_sigma, 1.5);
            assert_eq!(read("xtc_probability", json!(0.5)).xtc_probability, 0.5);
            assert_eq!(read("xtc_threshold", json!(0.2)).xtc_threshold, 0.2);
            assert_eq!(read("dry_multiplier", json!(0.8)).dry_multiplier, 0.8);
            assert_eq!(read("dry_base", json!(2.0)).dry_base, 2.0);
            assert_eq!(read("dry_allowed_length", json!(3)).dry_allowed_length, 3);
            assert_eq!(read("dry_penalty_last_n", json!(128)).dry_penalty_last_n, 128);
            assert_eq!(read("dry_penalty_last_n", json!(-1)).dry_penalty_last_n, usize::MAX);
            assert_eq!(
                read("dry_sequence_breakers", json!(["\n", "###"])).dry_sequence_breakers,
                ["\n", "###"]
            );
            assert_eq!(read("mirostat", json!(2)).mirostat, Mirostat::V2);
            assert_eq!(read("mirostat_tau", json!(3.0)).mirostat_tau, 3.0);
            assert_eq!(read("mirostat_eta", json!(0.2)).mirostat_eta, 0.2);
            assert_eq!(
                read("samplers", json!(["top_k", "temperature"])).samplers,
                [SamplerKind::TopK, SamplerKind::Temperature]
            );
            assert_eq!(
                read("samplers", json!("kt")).samplers,
                [SamplerKind::TopK, SamplerKind::Temperature]
            );
            assert_eq!(
                read("samplers", json!("top_k;temp")).samplers,
                [SamplerKind::TopK, SamplerKind::Temperature]
            );
        }
        // llama-server replaces a DRY base below 1 with its default.
        assert_eq!(chat_sampling("dry_base", json!(0.5)).dry_base, 1.75);
        let defaults = chat_sampling("seed", json!(1));
        assert_eq!(defaults.samplers, SamplerKind::DEFAULT_CHAIN);
        assert_eq!(defaults.dry_sequence_breakers, ["\n", ":", "\"", "*"]);
        assert_eq!(defaults.mirostat, Mirostat::Off);
    }

    #[test]
    fn sampler_fields_out_of_range_are_refused_by_name() {
        for (field, value, param) in [
            ("typical_p", json!(1.5), "typical_p"),
            ("typical_p", json!("high"), "typical_p"),
            ("top_n_sigma", json!(1000), "top_n_sigma"),
            ("dry_multiplier", json!(-1), "dry_multiplier"),
            ("dry_allowed_length", json!(-1), "dry_allowed_length"),
            ("dry_penalty_last_n", json!(-2), "dry_penalty_last_n"),
            ("dry_sequence_breakers", json!([]), "dry_sequence_breakers"),
            ("dry_sequence_breakers", json!("\n"), "dry_sequence_breakers"),
            ("dry_sequence_breakers", json!(["a", 3]), "dry_sequence_breakers[1]"),
            ("mirostat", json!(1.5), "mirostat"),
            ("mirostat_tau", json!(-1), "mirostat_tau"),
            ("mirostat_eta", json!(-1), "mirostat_eta"),
            ("samplers", json!(["top_k", "wizard"]), "samplers[1]"),
            ("samplers", json!("kq"), "samplers"),
            ("samplers", json!(3), "samplers"),
        ] {
            for err in [
                chat_with(field, value.clone()).unwrap_err(),
                native_with(field, value.clone()).unwrap_err(),
            ] {
                assert_eq!(err.param.as_deref(), Some(param), "{field} = {value}: {}", err.message);
                assert!(err.message.contains(field), "{field} = {value}: {}", err.message);
            }
        }
    }

    fn completion_with(field: &str, value: Json) -> Result<CompletionRequest, ApiError> {
        let mut body = json!({"prompt": "x"});
        body[field] = value;
        completion(&body)
    }

    /// The field's error on each endpoint, chat, `/v1/completions` and `/completion`.
    fn refusals(field: &str, value: Json) -> [Option<String>; 3] {
        [
            chat_with(field, value.clone()).err().and_then(|e| e.param),
            completion_with(field, value.clone()).err().and_then(|e| e.param),
            native_with(field, value).err().and_then(|e| e.param),
        ]
    }

    #[test]
    fn llama_server_fields_minfer_cannot_honour_are_refused_by_name_on_every_endpoint_unless_off() {
        for (field, on, off) in [
            ("dynatemp_range", json!(0.5), json!(0)),
            ("adaptive_target", json!(0.5), json!(-1)),
            ("min_keep", json!(2), json!(0)),
            ("n_indent", json!(4), json!(0)),
            ("n_cache_reuse", json!(256), json!(0)),
            ("t_max_predict_ms", json!(500), json!(-1)),
            ("lora", json!([{"id": 0, "scale": 1.0}]), json!([])),
            ("grammar_lazy", json!(true), json!(false)),
            ("grammar_triggers", json!([{"type": 0, "value": "x"}]), json!([])),
            ("preserved_tokens", json!(["<x>"]), json!([])),
            ("reasoning_control", json!(true), json!(false)),
            ("chat_format", json!(3), json!(0)),
            ("parse_tool_calls", json!(true), json!(false)),
        ] {
            let named = Some(field.to_string());
            assert_eq!(
                refusals(field, on.clone()),
                [named.clone(), named.clone(), named],
                "{field} = {on}"
            );
            assert_eq!(refusals(field, off.clone()), [None, None, None], "{field} = {off}");
            // Null is absent, as for every field.
            assert_eq!(refusals(field, Json::Null), [None, None, None], "{field} = null");
        }
    }

    #[test]
    fn llama_server_options_are_read_the_same_on_every_endpoint() {
        let body = json!({"id_slot": 1, "cache_prompt": false, "return_tokens": true, "return_progress": true,
                          "timings_per_token": true, "verbose": true, "post_sampling_probs": true,
                          "response_fields": ["content", "timings/prompt_n"], "sse_ping_interval": -1,
                          "n_keep": 4, "n_discard": 8, "backend_sampling": true, "dynatemp_exponent": 2,
                          "reasoning_format": "deepseek-legacy", "reasoning_budget_tokens": 12,
                          "reasoning_budget_message": "Done."});
        let expected = LlamaFields {
            post_sampling_probs: true,
            id_slot: Some(1),
            cache_prompt: false,
            return_tokens: true,
            return_progress: true,
            timings_per_token: true,
            verbose: true,
            response_fields: vec!["content".into(), "timings/prompt_n".into()],
            sse_ping_interval: -1,
            n_keep: 4,
            n_discard: 8,
            reasoning_format: ReasoningFormat::DeepseekLegacy,
            reasoning_budget: Some(12),
            reasoning_budget_message: "Done.".into(),
        };
        let mut chat_body = body.clone();
        chat_body["messages"] = json!([{"role": "user", "content": "x"}]);
        let mut prompt_body = body.clone();
        prompt_body["prompt"] = json!("x");
        assert_eq!(chat(&chat_body).unwrap().common.llama, expected);
        assert_eq!(completion(&prompt_body).unwrap().common.llama, expected);
        assert_eq!(native_completion(&prompt_body).unwrap().common.llama, expected);
        // The defaults: any slot, the prefix reused, pings every 30 s.
        let defaults = native_with("seed", json!(1)).unwrap().common.llama;
        assert_eq!(defaults, LlamaFields::default());
        assert!(defaults.cache_prompt && defaults.id_slot.is_none() && defaults.sse_ping_interval == 30);
        assert_eq!(native_with("id_slot", json!(-1)).unwrap().common.llama.id_slot, None);
        assert_eq!(
            native_with("id_slot", json!(-2)).unwrap_err().param.as_deref(),
            Some("id_slot")
        );
    }

    #[test]
    fn a_reasoning_budget_is_read_from_either_name_and_minus_one_means_the_servers() {
        let budget = |extra: Json| {
            chat_with("messages", json!([{"role": "user", "content": "x"}]))
                .map(|_| ())
                .and_then(|_| {
                    let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
                    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
                    super::chat(
                        &body,
                        &RequestDefaults {
                            reasoning_budget: Some(9),
                            ..Default::default()
                        },
                    )
                })
                .map(|r| (r.common.llama.reasoning_budget, r.common.llama.reasoning_budget_message))
        };
        assert_eq!(budget(json!({})).unwrap(), (Some(9), String::new()));
        assert_eq!(budget(json!({"reasoning_budget_tokens": 3})).unwrap().0, Some(3));
        assert_eq!(budget(json!({"thinking_budget_tokens": 0})).unwrap().0, Some(0));
        assert_eq!(budget(json!({"reasoning_budget_tokens": -1})).unwrap().0, Some(9));
        assert_eq!(
            budget(json!({"reasoning_budget_tokens": 4, "reasoning_budget_message": "Enough."})).unwrap(),
            (Some(4), "Enough.".to_string())
        );
        assert_eq!(
            budget(json!({"reasoning_budget_tokens": -2}))
                .unwrap_err()
                .param
                .as_deref(),
            Some("reasoning_budget_tokens")
        );
    }

    #[test]
    fn n_probs_asks_for_log_probabilities_on_every_endpoint_and_logprobs_is_its_alias_on_completion() {
        assert_eq!(native_with("n_probs", json!(5)).unwrap().common.logprobs, Some(5));
        assert_eq!(native_with("logprobs", json!(3)).unwrap().common.logprobs, Some(3));
        assert_eq!(native_with("n_probs", json!(0)).unwrap().common.logprobs, None);
        assert_eq!(chat_with("n_probs", json!(4)).unwrap().common.logprobs, Some(4));
        assert_eq!(completion_with("n_probs", json!(2)).unwrap().common.logprobs, Some(2));
        // OpenAI's own fields win where given.
        let mut body =
            json!({"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 2, "n_probs": 9});
        assert_eq!(chat(&body).unwrap().common.logprobs, Some(2));
        body["logprobs"] = json!(false);
        body["top_logprobs"] = Json::Null;
        assert_eq!(chat(&body).unwrap().common.logprobs, Some(9));
    }

    #[test]
    fn a_temperature_below_zero_is_greedy_and_soft_limits_are_clamped_as_llama_server_clamps_them() {
        let read = |k: &str, v: Json| native_with(k, v).unwrap().common.sampling;
        assert_eq!(read("temperature", json!(-1)).temperature, 0.0);
        assert_eq!(read("temperature", json!(3.5)).temperature, 3.5);
        assert_eq!(read("top_p", json!(1.5)).top_p, 1.0);
        assert_eq!(read("min_p", json!(-0.5)).min_p, 0.0);
        assert_eq!(read("xtc_probability", json!(-0.1)).xtc_probability, 0.0);
        assert_eq!(read("xtc_threshold", json!(2)).xtc_threshold, 1.0);
        assert_eq!(read("top_k", json!(-5)).top_k, 0);
        assert_eq!(read("mirostat", json!(3)).mirostat, Mirostat::V2);
        // A seed of -1 (llama-server's "random") draws one; others are kept.
        assert_eq!(native_with("seed", json!(-1)).unwrap().common.seed, None);
        assert_eq!(native_with("seed", json!(4294967295u64)).unwrap().common.seed, None);
        assert_eq!(native_with("seed", json!(7)).unwrap().common.seed, Some(7));
        // Empty stop strings are skipped; n_cmpl is n.
        assert_eq!(native_with("stop", json!(["", "\n"])).unwrap().common.stop, ["\n"]);
        assert_eq!(native_with("n_cmpl", json!(3)).unwrap().common.n, 3);
        assert_eq!(native_with("n", json!(2)).unwrap().common.n, 2);
    }

    #[test]
    fn a_final_assistant_message_is_continued_as_llama_server_continues_it() {
        let read = |messages: Json, extra: Json| {
            let mut body = json!({"messages": messages});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            chat(&body)
        };
        let user = json!({"role": "user", "content": "Hi"});
        let assistant = |content: Json| json!({"role": "assistant", "content": content});
        // A prefill: the message leaves the list, its text continued after the opened turn.
        let r = read(json!([user, assistant(json!("Hel"))]), json!({})).unwrap();
        assert_eq!(
            (r.messages.len(), r.add_generation_prompt, r.prefill.as_deref()),
            (1, true, Some("Hel"))
        );
        let parts = json!([{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]);
        let r = read(json!([user, assistant(parts)]), json!({})).unwrap();
        assert_eq!(r.prefill.as_deref(), Some("Wh\n\nill"));
        // vLLM's explicit form needs add_generation_prompt false; false keeps the message whole.
        let explicit = json!({"continue_final_message": true, "add_generation_prompt": false});
        assert_eq!(
            read(json!([user, assistant(json!("x"))]), explicit)
                .unwrap()
                .prefill
                .as_deref(),
            Some("x")
        );
        let r = read(
            json!([user, assistant(json!("x"))]),
            json!({"continue_final_message": false}),
        )
        .unwrap();
        assert_eq!((r.messages.len(), r.prefill), (2, None));
        let r = read(json!([user]), json!({"add_generation_prompt": false})).unwrap();
        assert_eq!((r.add_generation_prompt, r.prefill), (false, None));
        for (messages, extra, param) in [
            (
                json!([user, assistant(json!("x"))]),
                json!({"continue_final_message": true}),
                "continue_final_message",
            ),
            (
                json!([user]),
                json!({"continue_final_message": true, "add_generation_prompt": false}),
                "continue_final_message",
            ),
            (
                json!([user, assistant(json!("a")), assistant(json!("b"))]),
                json!({}),
                "messages",
            ),
            (
                json!([user, assistant(json!("x"))]),
                json!({"continue_final_message": "reasoning_content", "add_generation_prompt": false}),
                "continue_final_message",
            ),
            (
                json!([user, assistant(json!("x"))]),
                json!({"continue_final_message": 3}),
                "continue_final_message",
            ),
        ] {
            assert_eq!(read(messages, extra).unwrap_err().param.as_deref(), Some(param));
        }
    }

    #[test]
    fn infill_chunks_need_their_text_and_a_string_file_name() {
        let with = |extra: Json| infill(&json!({"input_prefix": "a", "input_suffix": "b", "input_extra": [extra]}));
        for (extra, param) in [
            (json!({}), "input_extra[0].text"),
            (json!({"filename": "ok"}), "input_extra[0].text"),
            (json!({"filename": 123}), "input_extra[0].filename"),
            (json!({"filename": 123, "text": "abc"}), "input_extra[0].filename"),
            (json!({"filename": "f", "text": 456}), "input_extra[0].text"),
        ] {
            assert_eq!(
                with(extra.clone()).unwrap_err().param.as_deref(),
                Some(param),
                "{extra}"
            );
        }
        let r = with(json!({"text": "t"})).unwrap();
        assert_eq!(r.extra, [(String::new(), "t".to_string())]);
    }

    #[test]
    fn logit_bias_reads_the_openai_object_and_the_llama_server_pairs() {
        let bias = |v: Json| chat_with("logit_bias", v).unwrap().common.sampling.logit_bias;
        let mut object = bias(json!({"15": -100, "7": 2.5}));
        object.sort_by_key(|e| e.0);
        assert_eq!(object, [(7, 2.5), (15, -100.0)]);
        assert_eq!(bias(json!([[3, 1.0], [4, false]])), [(3, 1.0), (4, f32::NEG_INFINITY)]);
        assert_eq!(bias(json!({"9": false})), [(9, f32::NEG_INFINITY)]);
        assert!(bias(json!({})).is_empty());
        let native = native_with("logit_bias", json!([[1, -1]])).unwrap();
        assert_eq!(native.common.sampling.logit_bias, [(1, -1.0)]);
        let mut body = json!({"prompt": "x", "logit_bias": {"2": 1}});
        assert_eq!(completion(&body).unwrap().common.sampling.logit_bias, [(2, 1.0)]);
        body["logit_bias"] = json!({"2": 101});
        assert_eq!(completion(&body).unwrap_err().param.as_deref(), Some("logit_bias.2"));
    }

    #[test]
    fn logit_bias_given_as_text_is_kept_for_the_handler_to_tokenize_in_both_forms() {
        let common = chat_with("logit_bias", json!({"7": 1, " the ": -100})).unwrap().common;
        assert_eq!(common.sampling.logit_bias, [(7, 1.0)]);
        assert_eq!(common.logit_bias_text, [(" the ".to_string(), -100.0)]);
        let common = native_with("logit_bias", json!([[" a ", false], [3, 2]]))
            .unwrap()
            .common;
        assert_eq!(common.sampling.logit_bias, [(3, 2.0)]);
        assert_eq!(common.logit_bias_text, [(" a ".to_string(), f32::NEG_INFINITY)]);
    }

    #[test]
    fn logit_bias_refuses_bad_ids_values_and_shapes_by_name() {
        for (value, param) in [
            (json!({"15": 101}), "logit_bias.15"),
            (json!({"15": -100.5}), "logit_bias.15"),
            (json!({"15": true}), "logit_bias.15"),
            (json!({"15": "1"}), "logit_bias.15"),
            (json!({"-1": 1}), "logit_bias.-1"),
            (json!([[1, 200]]), "logit_bias[0][1]"),
            (json!([[1.5, 2]]), "logit_bias[0][0]"),
            (json!([[-1, 1]]), "logit_bias[0][0]"),
            (json!([[1]]), "logit_bias[0]"),
            (json!([5]), "logit_bias[0]"),
            (json!("15"), "logit_bias"),
        ] {
            let err = chat_with("logit_bias", value.clone()).unwrap_err();
            assert_eq!(err.param.as_deref(), Some(param), "{value}: {}", err.message);
            assert!(err.message.contains("logit_bias"), "{value}: {}", err.message);
        }
    }

    #[test]
    fn output_constraints_are_read_from_openai_and_llama_server_fields() {
        let with = |extra: Json| {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            chat(&body)
        };
        let spec = |extra: Json| with(extra).unwrap().common.grammar.unwrap();
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        assert_eq!(
            spec(json!({"response_format": {"type": "json_object"}})),
            ("response_format".to_string(), GrammarSpec::JsonObject)
        );
        let named = json!({"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": schema}});
        assert_eq!(
            spec(json!({"response_format": named})),
            (
                "response_format.json_schema.schema".to_string(),
                GrammarSpec::JsonSchema(schema.clone())
            )
        );
        assert_eq!(
            spec(json!({"json_schema": schema})).1,
            GrammarSpec::JsonSchema(schema.clone())
        );
        assert_eq!(
            spec(json!({"grammar": "root ::= \"a\""})).1,
            GrammarSpec::Gbnf("root ::= \"a\"".into())
        );
        let refused = |extra: Json| with(extra).unwrap_err();
        let e = refused(json!({"grammar": "root ::= nope"}));
        assert_eq!(e.param.as_deref(), Some("grammar"));
        assert!(
            e.message.contains("line 1, column 10: undefined rule `nope`"),
            "{}",
            e.message
        );
        let e = refused(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}));
        assert_eq!(e.param.as_deref(), Some("response_format.json_schema.schema"));
        let e = refused(json!({"response_format": {"type": "json_schema", "json_schema": {"schema": 3}}}));
        assert!(e.message.contains("must be a JSON Schema"), "{}", e.message);
        let e = refused(json!({"response_format": {"type": "yaml"}}));
        assert_eq!(e.param.as_deref(), Some("response_format.type"));
        let e = refused(json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}));
        assert_eq!(e.param.as_deref(), Some("grammar"));
        assert!(e.message.contains("both constrain"), "{}", e.message);
    }

    #[test]
    fn more_messages_or_tools_than_openai_allows_are_refused_by_count() {
        let message = json!({"role": "user", "content": "x"});
        let err = chat(&json!({"messages": vec![message.clone(); MAX_MESSAGES + 1]})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("messages"));
        assert!(err.message.contains("at most 2048"), "{}", err.message);
        assert!(chat(&json!({"messages": vec![message.clone(); MAX_MESSAGES]})).is_ok());
        let tool = json!({"type": "function", "function": {"name": "f"}});
        let err = chat(&json!({"messages": [message], "tools": vec![tool; MAX_TOOLS + 1]})).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tools"));
    }

    #[test]
    fn tool_choice_reads_as_auto_required_or_a_named_offered_function() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let choice =
            |c: Json| chat(&json!({"messages": [{"role": "user", "content": "x"}], "tools": tools, "tool_choice": c}));
        assert_eq!(choice(json!("auto")).unwrap().tool_choice, ToolChoice::Auto);
        assert_eq!(choice(json!("required")).unwrap().tool_choice, ToolChoice::Required);
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            choice(named).unwrap().tool_choice,
            ToolChoice::Function("get_weather".into())
        );
        let none = choice(json!("none")).unwrap();
        assert!(none.tools.is_none() && none.tool_choice == ToolChoice::Auto);
        let unknown = choice(json!({"type": "function", "function": {"name": "rm_rf"}})).unwrap_err();
        assert_eq!(unknown.param.as_deref(), Some("tool_choice.function.name"));
        assert!(unknown.message.contains("'rm_rf'"), "{}", unknown.message);
        let without_tools = chat(&json!({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}));
        assert_eq!(without_tools.unwrap_err().param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn tool_call_arguments_sent_as_a_string_reach_the_template_as_an_object() {
        let r = chat(&json!({"messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        ]}))
        .unwrap();
        assert_eq!(r.messages[1]["tool_calls"][0]["function"]["arguments"], json!({"a": 1}));
    }

    #[test]
    fn chat_template_kwargs_become_template_variables_and_reasoning_effort_replaces_its_kwarg() {
        let kwargs = |extra: Json| {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            chat(&body)
        };
        // Only the server's default beside a request that sets none: thinking on.
        let defaults = json!({"enable_thinking": true});
        assert_eq!(Json::Object(kwargs(json!({})).unwrap().template_kwargs), defaults);
        let r = kwargs(json!({"chat_template_kwargs": {"enable_thinking": false, "builtin_tools": ["python"], "reasoning_effort": "low"}}))
            .unwrap();
        assert_eq!(
            Json::Object(r.template_kwargs),
            json!({"enable_thinking": false, "builtin_tools": ["python"], "reasoning_effort": "low"})
        );
        // The body's field wins over the kwarg, as in llama-server.
        let r =
            kwargs(json!({"chat_template_kwargs": {"reasoning_effort": "low"}, "reasoning_effort": "high"})).unwrap();
        assert_eq!(r.template_kwargs["reasoning_effort"], "high");
        for effort in REASONING_EFFORTS {
            assert_eq!(
                kwargs(json!({"reasoning_effort": effort})).unwrap().template_kwargs["reasoning_effort"],
                effort
            );
        }
        // A null field is an absent one.
        assert_eq!(
            Json::Object(
                kwargs(json!({"reasoning_effort": null, "chat_template_kwargs": null}))
                    .unwrap()
                    .template_kwargs
            ),
            defaults
        );
    }

    #[test]
    fn a_reasoning_effort_or_kwarg_the_template_cannot_take_is_refused_naming_the_field_and_value() {
        let refused = |extra: Json| {
            let mut body = json!({"messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            let err = chat(&body).unwrap_err();
            (err.param.unwrap_or_default(), err.message)
        };
        let (param, message) = refused(json!({"reasoning_effort": "extreme"}));
        assert_eq!(param, "reasoning_effort");
        assert!(
            message.contains("'extreme'") && message.contains("low, medium, high"),
            "{message}"
        );
        let (param, message) = refused(json!({"chat_template_kwargs": {"reasoning_effort": "max"}}));
        assert_eq!(param, "chat_template_kwargs.reasoning_effort");
        assert!(message.contains("'max'"), "{message}");
        assert_eq!(refused(json!({"reasoning_effort": 3})).0, "reasoning_effort");
        assert_eq!(
            refused(json!({"chat_template_kwargs": "high"})).0,
            "chat_template_kwargs"
        );
        assert_eq!(
            refused(json!({"chat_template_kwargs": {"enable_thinking": "false"}})).0,
            "chat_template_kwargs.enable_thinking"
        );
        assert_eq!(
            refused(json!({"chat_template_kwargs": {"messages": []}})).0,
            "chat_template_kwargs.messages"
        );
    }

    #[test]
    fn a_completion_prompt_is_read_as_llama_server_reads_it_on_both_endpoints() {
        for read in [
            (|v: Json| completion(&json!({"prompt": v})).map(|r| r.prompts))
                as fn(Json) -> Result<Vec<Prompt>, ApiError>,
            |v: Json| native_completion(&json!({"prompt": v})).map(|r| r.prompts),
        ] {
            assert_eq!(read(json!("a")).unwrap(), vec![Prompt::Text("a".into())]);
            assert_eq!(read(json!(["a", "b"])).unwrap().len(), 2);
            assert_eq!(read(json!([1, 2])).unwrap(), vec![Prompt::Tokens(vec![1, 2])]);
            assert_eq!(read(json!([[1], [2, 3]])).unwrap().len(), 2);
            // Ids with text mixed in: one prompt.
            assert_eq!(
                read(json!([1, "a", 2])).unwrap(),
                vec![Prompt::Mixed(vec![
                    PromptPiece::Token(1),
                    PromptPiece::Text("a".into()),
                    PromptPiece::Token(2)
                ])]
            );
            // An object with the prompt's text, alone or among others.
            assert_eq!(
                read(json!({"prompt_string": "hi"})).unwrap(),
                vec![Prompt::Text("hi".into())]
            );
            assert_eq!(
                read(json!([[1, 2], {"prompt_string": "hi"}, "x"])).unwrap(),
                vec![
                    Prompt::Tokens(vec![1, 2]),
                    Prompt::Text("hi".into()),
                    Prompt::Text("x".into())
                ]
            );
            // Images cannot be read, and no prompt is no prompt.
            assert_eq!(
                read(json!({"prompt_string": "hi", "multimodal_data": ["aGk="]}))
                    .unwrap_err()
                    .param
                    .as_deref(),
                Some("prompt.multimodal_data")
            );
            assert_eq!(read(json!([-1])).unwrap_err().param.as_deref(), Some("prompt[0]"));
            assert_eq!(read(json!([1, -1])).unwrap_err().param.as_deref(), Some("prompt[1]"));
            assert_eq!(
                read(json!([1, "a", -1])).unwrap_err().param.as_deref(),
                Some("prompt[2]")
            );
            assert_eq!(read(json!([])).unwrap_err().param.as_deref(), Some("prompt"));
            assert_eq!(read(json!([{"x": 1}])).unwrap_err().param.as_deref(), Some("prompt[0]"));
            assert_eq!(read(json!(5)).unwrap_err().param.as_deref(), Some("prompt"));
        }
    }
}
