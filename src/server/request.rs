//! Reading OpenAI request bodies: JSON values into the typed requests the handlers run, with
//! every refusal a 400 that names the field (`messages[2].role`, `temperature`) and says what
//! was expected.
//!
//! Fields are read by hand rather than derived, so that a wrong type is reported by its name
//! instead of by a byte offset. Unknown fields are ignored, as OpenAI's own clients send fields
//! minfer has no use for (`metadata`, `parallel_tool_calls`); `user` is only echoed, as the
//! session id a load balancer may hash on. `chat_template_kwargs` and `reasoning_effort` are
//! the chat template's variables, checked here and rendered by the handler. This file must not render
//! templates, tokenize or touch the scheduler: it only checks shapes and ranges.

use super::error::ApiError;
use crate::grammar::GrammarSpec;
use crate::sampling::{Mirostat, SamplerKind, SamplingError, SamplingParams};
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
pub fn from_body<T>(bytes: &[u8], read: fn(&Json) -> Result<T, ApiError>) -> Result<T, ApiError> {
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

#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct CompletionRequest {
    pub common: Common,
    pub prompts: Vec<Prompt>,
}

/// A JSON object's fields, read with errors that name them.
struct Fields<'a> {
    map: &'a Map<String, Json>,
    prefix: String,
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
    fn of(value: &'a Json, name: &str) -> Result<Self, ApiError> {
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
    fn get(&self, name: &str) -> Option<&'a Json> {
        self.map.get(name).filter(|v| !v.is_null())
    }

    fn wrong(&self, name: &str, expected: &str, got: &Json) -> ApiError {
        let path = self.path(name);
        ApiError::field(&path, format!("{path} must be {expected}, not {}", kind(got)))
    }

    fn out_of_range(&self, name: &str, value: impl std::fmt::Display, expected: &str) -> ApiError {
        let path = self.path(name);
        ApiError::field(&path, format!("{path} = {value} is out of range: {expected}"))
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.get(name) {
            None => Ok(None),
            Some(Json::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong(name, "a boolean", other)),
        }
    }

    fn str(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
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

    /// An integer within `[min, max]`.
    fn integer(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
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

/// The fields both endpoints read. `logprobs` differs between them and is read by the caller.
fn common(f: &Fields, logprobs: Option<usize>) -> Result<Common, ApiError> {
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
                other => other,
            },
        },
    };
    let defaults = server_sampling_defaults();
    // OpenAI allows top_p = 0, meaning the most likely token only; the smallest positive value
    // keeps exactly that token in the top-p sampler.
    let top_p = f
        .number("top_p", 0.0, 1.0)?
        .map(|p| p.max(f32::MIN_POSITIVE))
        .unwrap_or(defaults.top_p);
    let penalty_last_n = match f.integer("repeat_last_n", -1, i32::MAX as i64)? {
        None => defaults.penalty_last_n,
        Some(-1) => usize::MAX,
        Some(n) => n as usize,
    };
    let sampling = SamplingParams {
        temperature: f.number("temperature", 0.0, 2.0)?.unwrap_or(defaults.temperature),
        top_k: f
            .integer("top_k", i32::MIN as i64, i32::MAX as i64)?
            .map_or(defaults.top_k, |k| k as i32),
        top_p,
        min_p: f.number("min_p", 0.0, 1.0)?.unwrap_or(defaults.min_p),
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
            .number("xtc_probability", 0.0, 1.0)?
            .unwrap_or(defaults.xtc_probability),
        xtc_threshold: f.number("xtc_threshold", 0.0, 1.0)?.unwrap_or(defaults.xtc_threshold),
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
            None => defaults.dry_sequence_breakers,
            Some(v) => dry_sequence_breakers(v)?,
        },
        mirostat: f
            .integer("mirostat", 0, 2)?
            .and_then(Mirostat::from_number)
            .unwrap_or(defaults.mirostat),
        mirostat_tau: f.number("mirostat_tau", 0.0, 100.0)?.unwrap_or(defaults.mirostat_tau),
        mirostat_eta: f.number("mirostat_eta", 0.0, 100.0)?.unwrap_or(defaults.mirostat_eta),
        samplers: match f.get("samplers") {
            None => defaults.samplers,
            Some(v) => samplers(v)?,
        },
        logit_bias: match f.get("logit_bias") {
            None => Vec::new(),
            Some(v) => logit_bias(v)?,
        },
    };
    let seed = match f.get("seed") {
        None => None,
        Some(Json::Number(n)) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Some(u),
            // OpenAI's seed is a signed 64-bit integer; its bits are the generator's seed.
            (None, Some(i)) => Some(i as u64),
            _ => return Err(f.wrong("seed", "an integer", &Json::Number(n.clone()))),
        },
        Some(other) => return Err(f.wrong("seed", "an integer", other)),
    };
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Json::String(s)) => vec![s.clone()],
        Some(Json::Array(items)) => {
            if items.len() > MAX_STOPS {
                return Err(ApiError::field(
                    "stop",
                    format!("stop has {} strings; at most {MAX_STOPS} are allowed", items.len()),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, s)| match s {
                    Json::String(s) => Ok(s.clone()),
                    other => Err(ApiError::field(
                        format!("stop[{i}]"),
                        format!("stop[{i}] must be a string, not {}", kind(other)),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(other) => return Err(f.wrong("stop", "a string or an array of strings", other)),
    };
    if let Some(long) = stop.iter().find(|s| s.len() > MAX_STOP_LEN) {
        return Err(ApiError::field(
            "stop",
            format!(
                "a stop string has {} bytes; at most {MAX_STOP_LEN} are allowed",
                long.len()
            ),
        ));
    }
    let n = f.integer("n", 1, MAX_CHOICES as i64)?.unwrap_or(1) as usize;
    Ok(Common {
        stream,
        include_usage,
        max_tokens: max_tokens.map(|n| n as usize),
        sampling,
        seed,
        stop,
        n,
        logprobs,
        ignore_eos: f.bool("ignore_eos")?.unwrap_or(false),
        grammar: grammar(f)?,
        user: f.get("user").and_then(Json::as_str).map(str::to_string),
    })
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
/// (-inf). Ids are checked against the vocabulary where it is known, when the request starts.
fn logit_bias(value: &Json) -> Result<Vec<(u32, f32)>, ApiError> {
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
    match value {
        Json::Object(map) => {
            if map.len() > MAX_LOGIT_BIAS {
                return Err(too_many(map.len()));
            }
            map.iter()
                .map(|(key, v)| {
                    let path = format!("{NAME}.{key}");
                    let token = key.parse::<u32>().map_err(|_| {
                        ApiError::field(&path, format!("{NAME} key '{key}' is not a token id (an integer >= 0)"))
                    })?;
                    Ok((token, bias(&path, v)?))
                })
                .collect()
        }
        Json::Array(items) => {
            if items.len() > MAX_LOGIT_BIAS {
                return Err(too_many(items.len()));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, pair)| {
                    let path = format!("{NAME}[{i}]");
                    match pair.as_array().map(Vec::as_slice) {
                        Some([id, b]) => {
                            let token = id.as_u64().filter(|&t| t <= u32::MAX as u64).ok_or_else(|| {
                                ApiError::field(
                                    format!("{path}[0]"),
                                    format!("{path}[0] must be a token id (an integer >= 0)"),
                                )
                            })?;
                            Ok((token as u32, bias(&format!("{path}[1]"), b)?))
                        }
                        _ => Err(ApiError::field(
                            &path,
                            format!("{path} must be a [token id, bias] pair"),
                        )),
                    }
                })
                .collect()
        }
        other => Err(ApiError::field(
            NAME,
            format!(
                "{NAME} must be an object of token ids to biases or an array of [id, bias] pairs, not {}",
                kind(other)
            ),
        )),
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

pub fn chat(body: &Json) -> Result<ChatRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.integer("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
    if top.is_some() && !logprobs {
        return Err(ApiError::field(
            "top_logprobs",
            "top_logprobs requires logprobs to be true",
        ));
    }
    let common = common(&f, logprobs.then_some(top.unwrap_or(0) as usize))?;
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
    Ok(ChatRequest {
        common,
        messages,
        tools,
        tool_choice,
        template_kwargs: template_kwargs(&f)?,
    })
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
fn template_kwargs(f: &Fields) -> Result<Map<String, Json>, ApiError> {
    const KWARGS: &str = "chat_template_kwargs";
    let mut kwargs = match f.get(KWARGS) {
        None => Map::new(),
        Some(Json::Object(map)) => map.clone(),
        Some(other) => return Err(f.wrong(KWARGS, "an object of template variables", other)),
    };
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

pub fn completion(body: &Json) -> Result<CompletionRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let logprobs = f.integer("logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|n| n as usize);
    let common = common(&f, logprobs)?;
    if f.bool("echo")?.unwrap_or(false) {
        return Err(ApiError::field("echo", "echo is not supported"));
    }
    if f.str("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::field("suffix", "suffix is not supported"));
    }
    let prompts = match f.get("prompt") {
        None => return Err(ApiError::field("prompt", "prompt is required")),
        Some(Json::String(s)) => vec![Prompt::Text(s.clone())],
        Some(Json::Array(items)) if items.is_empty() => {
            return Err(ApiError::field("prompt", "prompt must not be an empty array"))
        }
        Some(Json::Array(items)) => {
            if items.iter().all(Json::is_number) {
                vec![Prompt::Tokens(token_ids("prompt", items)?)]
            } else {
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| match item {
                        Json::String(s) => Ok(Prompt::Text(s.clone())),
                        Json::Array(ids) => Ok(Prompt::Tokens(token_ids(&format!("prompt[{i}]"), ids)?)),
                        other => Err(ApiError::field(
                            format!("prompt[{i}]"),
                            format!(
                                "prompt[{i}] must be a string or an array of token ids, not {}",
                                kind(other)
                            ),
                        )),
                    })
                    .collect::<Result<_, _>>()?
            }
        }
        Some(other) => return Err(f.wrong("prompt", "a string or an array", other)),
    };
    if prompts.len() * common.n > MAX_CHOICES {
        return Err(ApiError::field(
            "prompt",
            format!(
                "{} prompts × n = {} asks for {} completions; at most {MAX_CHOICES} are allowed",
                prompts.len(),
                common.n,
                prompts.len() * common.n
            ),
        ));
    }
    Ok(CompletionRequest { common, prompts })
}

/// A body of llama-server's own `/completion`: one prompt (text, or token ids) and the common
/// fields under llama-server's names and defaults (min-p 0.05, as llama.cpp; no repeat penalty).
#[derive(Debug, Clone)]
pub struct NativeRequest {
    pub common: Common,
    pub prompt: Prompt,
}

/// llama-server's fields that minfer does not have, with the value that leaves them off: a
/// request setting one otherwise is refused naming it, since the output would not be what it
/// asked for.
const NATIVE_SAMPLERS_OFF: [(&str, f64); 2] = [("n_probs", 0.0), ("dynatemp_range", 0.0)];

/// The fields `/completion` and `/infill` share.
fn native_common(f: &Fields) -> Result<Common, ApiError> {
    for (name, off) in NATIVE_SAMPLERS_OFF {
        match f.get(name) {
            None => {}
            Some(Json::Number(n)) if n.as_f64() == Some(off) => {}
            Some(_) => {
                return Err(ApiError::field(
                    name,
                    format!("{name} is not supported (leave it out, or at {off}, which turns it off)"),
                ))
            }
        }
    }
    if f.get("n").is_some() {
        return Err(ApiError::field(
            "n",
            "n is not a /completion field: send one request per completion",
        ));
    }
    let mut common = common(f, None)?;
    if f.get("min_p").is_none() {
        common.sampling.min_p = crate::sampling::SamplingParams::default().min_p;
    }
    Ok(common)
}

pub fn native_completion(body: &Json) -> Result<NativeRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let common = native_common(&f)?;
    let prompt = match f.get("prompt") {
        None => return Err(ApiError::field("prompt", "prompt is required")),
        Some(Json::String(s)) => Prompt::Text(s.clone()),
        Some(Json::Array(items)) if !items.is_empty() && items.iter().all(Json::is_number) => {
            Prompt::Tokens(token_ids("prompt", items)?)
        }
        Some(other) => {
            return Err(f.wrong(
                "prompt",
                "a string or an array of token ids (one prompt per request)",
                other,
            ))
        }
    };
    Ok(NativeRequest { common, prompt })
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

pub fn infill(body: &Json) -> Result<InfillRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let common = native_common(&f)?;
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
        Some(Json::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| {
                let chunk = Fields::of(item, &format!("input_extra[{i}]"))?;
                Ok((
                    chunk.str("filename")?.unwrap_or_default().to_string(),
                    chunk.str("text")?.unwrap_or_default().to_string(),
                ))
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
            (
                json!({"messages": [{"role": "user", "content": "x"}], "temperature": 7}),
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
        assert_eq!(with("min_p", json!(2)).unwrap_err().param.as_deref(), Some("min_p"));
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
            ("xtc_probability", json!(-0.1), "xtc_probability"),
            ("xtc_threshold", json!(2), "xtc_threshold"),
            ("dry_multiplier", json!(-1), "dry_multiplier"),
            ("dry_allowed_length", json!(-1), "dry_allowed_length"),
            ("dry_penalty_last_n", json!(-2), "dry_penalty_last_n"),
            ("dry_sequence_breakers", json!([]), "dry_sequence_breakers"),
            ("dry_sequence_breakers", json!("\n"), "dry_sequence_breakers"),
            ("dry_sequence_breakers", json!(["a", 3]), "dry_sequence_breakers[1]"),
            ("mirostat", json!(3), "mirostat"),
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

    #[test]
    fn native_fields_without_an_implementation_are_still_refused_unless_off() {
        for (field, value) in [("n_probs", json!(5)), ("dynatemp_range", json!(0.5))] {
            assert_eq!(native_with(field, value).unwrap_err().param.as_deref(), Some(field));
        }
        assert!(native_with("n_probs", json!(0)).is_ok());
        assert!(native_with("dynatemp_range", json!(0)).is_ok());
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
    fn logit_bias_refuses_bad_ids_values_and_shapes_by_name() {
        for (value, param) in [
            (json!({"15": 101}), "logit_bias.15"),
            (json!({"15": -100.5}), "logit_bias.15"),
            (json!({"15": true}), "logit_bias.15"),
            (json!({"15": "1"}), "logit_bias.15"),
            (json!({"hello": 1}), "logit_bias.hello"),
            (json!({"-1": 1}), "logit_bias.-1"),
            (json!([[1, 200]]), "logit_bias[0][1]"),
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
        assert!(kwargs(json!({})).unwrap().template_kwargs.is_empty());
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
        assert!(kwargs(json!({"reasoning_effort": null, "chat_template_kwargs": null}))
            .unwrap()
            .template_kwargs
            .is_empty());
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
    fn a_completion_prompt_may_be_text_texts_or_token_ids() {
        let p = |v: Json| completion(&json!({"prompt": v})).map(|r| r.prompts);
        assert_eq!(p(json!("a")).unwrap(), vec![Prompt::Text("a".into())]);
        assert_eq!(p(json!(["a", "b"])).unwrap().len(), 2);
        assert_eq!(p(json!([1, 2])).unwrap(), vec![Prompt::Tokens(vec![1, 2])]);
        assert_eq!(p(json!([[1], [2, 3]])).unwrap().len(), 2);
        assert_eq!(p(json!([1, "a"])).unwrap_err().param.as_deref(), Some("prompt[0]"));
        assert_eq!(p(json!([-1])).unwrap_err().param.as_deref(), Some("prompt[0]"));
    }
}
