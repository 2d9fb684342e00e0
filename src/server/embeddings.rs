//! Embeddings and reranking over HTTP: llama-server's `/embedding` (and `/embeddings`),
//! OpenAI's `/v1/embeddings`, and `/rerank` (`/v1/rerank`, `/reranking`, `/v1/reranking`) in
//! Jina's and Cohere's shape, or TEI's when the body has `texts`. Ollama's `/api/embed` reads
//! through [`EmbedService`] too, in its own file.
//!
//! Requests are read and tokenized here and handed to one embedding thread that owns an
//! [`Embedder`]: requests queued together share its forward passes. It runs beside the
//! generating slots, over the same model. `--embeddings` starts it (`--reranking` with pooling
//! `rank`); without it each route answers 501 with llama-server's message. Nothing here
//! computes a vector.

use super::error::ApiError;
use super::metrics::Metrics;
use super::request::{self, Fields};
use super::routes::{self, App};
use crate::engine::{check_inputs, EmbedError, Embedder, Model, Normalize, Rows};
use crate::models::pooling::Pooling;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::{mpsc, Arc};

/// Inputs waiting for the embedding thread, and where their vectors go.
struct Job {
    inputs: Vec<Vec<u32>>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<Rows>, String>>,
}

/// The embedding thread's door: inputs in, unnormalized pooled rows out.
pub struct EmbedService {
    jobs: mpsc::Sender<Job>,
    pooling: Pooling,
    n_ubatch: usize,
    n_embd: usize,
    /// What a request that does not say gets (`--embd-normalize`).
    normalize: Normalize,
}

/// Inputs one request may send: OpenAI's limit. The answer holds a vector per input, so the
/// bound is on its size as much as on the work.
pub const MAX_INPUTS: usize = 2048;

/// Rows one request may ask for with pooling `none` (one per token): 8192 rows of a 4096-wide
/// model are about 600 MB of JSON.
const MAX_TOKEN_ROWS: usize = 8192;

impl EmbedService {
    /// Starts the embedding thread over `model`: passes of up to `n_batch` tokens and
    /// `n_seq_max` inputs, pooled by `pooling` (else the model's rule, else `last`), scaled by
    /// `normalize` unless a request says otherwise.
    pub fn start(
        model: &Model,
        pooling: Option<Pooling>,
        (n_batch, n_seq_max): (usize, usize),
        normalize: Normalize,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EmbedError> {
        let embedder = Embedder::for_model(model, pooling, n_batch, n_seq_max)?;
        let (jobs, rx) = mpsc::channel::<Job>();
        let service = EmbedService {
            jobs,
            pooling: embedder.pooling(),
            n_ubatch: embedder.n_ubatch(),
            n_embd: embedder.n_embd(),
            normalize,
        };
        std::thread::Builder::new()
            .name("minfer-embed".into())
            .stack_size(super::REQUEST_STACK_BYTES)
            .spawn(move || serve_jobs(embedder, rx, &metrics))
            .map_err(|e| EmbedError::Engine(crate::engine::EngineError::Output(e.to_string())))?;
        Ok(service)
    }

    /// The pooling rule in force.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Values in each vector.
    pub fn n_embd(&self) -> usize {
        self.n_embd
    }

    /// The most tokens an input may have.
    pub fn n_ubatch(&self) -> usize {
        self.n_ubatch
    }

    /// Each input's pooled rows, unnormalized; an empty or too long input is refused (as
    /// llama-server words it) before anything runs. The inputs' count was bounded where the
    /// request was read ([`check_count`]).
    pub async fn embed(&self, inputs: Vec<Vec<u32>>) -> Result<Vec<Rows>, ApiError> {
        let n_tokens: usize = inputs.iter().map(Vec::len).sum();
        if self.pooling == Pooling::None && n_tokens > MAX_TOKEN_ROWS {
            return Err(ApiError::bad_request(format!(
                "{n_tokens} tokens in one request with pooling 'none' (a vector per token); at most {MAX_TOKEN_ROWS}"
            )));
        }
        match check_inputs(&inputs, self.n_ubatch) {
            Err(EmbedError::EmptyInput { .. }) => return Err(ApiError::bad_request("Input content cannot be empty")),
            Err(EmbedError::InputTooLong { n_tokens, n_ubatch, .. }) => {
                return Err(ApiError::bad_request(format!(
                    "input ({n_tokens} tokens) is too large to process. increase the physical batch size (current batch size: {n_ubatch})"
                )))
            }
            Err(e) => return Err(ApiError::internal(e.to_string())),
            Ok(()) => {}
        }
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Job { inputs, reply })
            .map_err(|_| ApiError::internal("the embedding thread has stopped"))?;
        rx.await
            .map_err(|_| ApiError::internal("the embedding thread has stopped"))?
            .map_err(ApiError::internal)
    }
}

/// The embedding thread: each job, with every job queued behind it, in one embedder call.
fn serve_jobs(mut embedder: Embedder, rx: mpsc::Receiver<Job>, metrics: &Metrics) {
    while let Ok(first) = rx.recv() {
        // Queued jobs join while the group holds fewer than one request's worth of inputs.
        let mut n_inputs = first.inputs.len();
        let mut group = vec![first];
        while n_inputs < MAX_INPUTS {
            match rx.try_recv() {
                Ok(job) => {
                    n_inputs += job.inputs.len();
                    group.push(job);
                }
                Err(_) => break,
            }
        }
        let counts: Vec<usize> = group.iter().map(|j| j.inputs.len()).collect();
        let inputs: Vec<Vec<u32>> = group.iter_mut().flat_map(|j| std::mem::take(&mut j.inputs)).collect();
        let (start, passes) = (std::time::Instant::now(), embedder.n_passes());
        let result = embedder.embed(&inputs, Normalize::NONE);
        let n_tokens = inputs.iter().map(Vec::len).sum();
        metrics.record_embedding(n_tokens, embedder.n_passes() - passes, start.elapsed());
        match result {
            Ok(rows) => {
                let mut rows = rows.into_iter();
                for (job, n) in group.into_iter().zip(counts) {
                    let _ = job.reply.send(Ok(rows.by_ref().take(n).collect()));
                }
            }
            Err(e) => {
                for job in group {
                    let _ = job.reply.send(Err(e.to_string()));
                }
            }
        }
    }
}

/// The service, or llama-server's 501 for a server started without `--embeddings`.
fn service(app: &App) -> Result<&EmbedService, ApiError> {
    app.embeddings.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "This server does not support embeddings. Start it with `--embeddings`",
        )
    })
}

/// `n` inputs in field `name`, refused past [`MAX_INPUTS`] before any is tokenized.
pub fn check_count(name: &str, n: usize) -> Result<(), ApiError> {
    if n > MAX_INPUTS {
        return Err(ApiError::field(
            name,
            format!("{name} holds {n} inputs; at most {MAX_INPUTS} may be sent at once"),
        ));
    }
    Ok(())
}

/// `rows` scaled by `normalize` where they are pooled vectors: llama-server leaves per-token
/// rows and rank scores as they are, where llama-embedding (and so [`Embedder::embed`], which
/// the thread calls with [`Normalize::NONE`]) scales per-token rows too.
fn normalized(pooling: Pooling, normalize: Normalize, mut rows: Vec<Rows>) -> Vec<Rows> {
    if !matches!(pooling, Pooling::None | Pooling::Rank) {
        rows.iter_mut().flatten().for_each(|r| normalize.apply(r));
    }
    rows
}

/// Texts embedded for another API's shape (Ollama's): each tokenized as `/v1/embeddings` does
/// and, with `truncate`, cut to the longest input a pass reads; the pooled rows unnormalized,
/// the pooling, and the tokens read.
pub async fn embed_texts(
    app: &App,
    texts: Vec<String>,
    truncate: bool,
) -> Result<(Vec<Rows>, Pooling, usize), ApiError> {
    let service = service(app)?;
    let prompts = texts.into_iter().map(request::Prompt::Text).collect();
    let mut tokens = routes::encode_prompts(app, "input", prompts).await?;
    if truncate {
        tokens.iter_mut().for_each(|t| t.truncate(service.n_ubatch()));
    }
    let n_tokens = tokens.iter().map(Vec::len).sum();
    Ok((service.embed(tokens).await?, service.pooling(), n_tokens))
}

/// An embeddings body: the inputs (`input`, or llama-server's `content`, which asks for its own
/// answer shape), `encoding_format`, `embd_normalize`, `dimensions`.
struct EmbeddingsRequest {
    inputs: Vec<request::Prompt>,
    /// `content` was given: llama-server's answer, whatever the route.
    native: bool,
    base64: bool,
    normalize: Option<Normalize>,
    dimensions: Option<i64>,
    model: Option<String>,
}

fn read_embeddings(body: &Value) -> Result<EmbeddingsRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let (name, value, native) = match (f.get("input"), f.get("content")) {
        (Some(v), _) => ("input", v, false),
        (None, Some(v)) => ("content", v, true),
        (None, None) => return Err(ApiError::bad_request("\"input\" or \"content\" must be provided")),
    };
    let inputs = request::prompt_list(name, &content_parts_as_text(name, value)?)?;
    check_count(name, inputs.len())?;
    let base64 = match f.str("encoding_format")? {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::field(
                "encoding_format",
                format!("encoding_format '{other}' is not supported: the format to return the embeddings in can be either float or base64"),
            ))
        }
    };
    let normalize = f
        .integer("embd_normalize", -1, i32::MAX as i64)?
        .map(|n| Normalize::new(n as i32).map_err(|e| ApiError::field("embd_normalize", e.to_string())))
        .transpose()?;
    Ok(EmbeddingsRequest {
        inputs,
        native,
        base64,
        normalize,
        dimensions: f.integer("dimensions", 1, i64::MAX)?,
        model: f.str("model")?.map(str::to_string),
    })
}

/// `value` with every OpenAI content object (`{"content": [{"type": "text", "text": ...}]}`, an
/// input of its own or one of a list) replaced by its texts joined, as llama-server reads them;
/// a part that is not text is refused by name (minfer reads no images, audio or video).
fn content_parts_as_text(name: &str, value: &Value) -> Result<Value, ApiError> {
    let one = |path: &str, v: &Value| -> Result<Value, ApiError> {
        let Some(parts) = v.as_object().and_then(|o| o.get("content")) else {
            return Ok(v.clone());
        };
        let Value::Array(parts) = parts else {
            return Err(ApiError::field(
                format!("{path}.content"),
                format!("{path}.content must be an array of content parts"),
            ));
        };
        let mut text = String::new();
        for (i, part) in parts.iter().enumerate() {
            match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => text.push_str(t),
                (kind, _) => {
                    return Err(ApiError::field(
                        format!("{path}.content[{i}]"),
                        format!(
                            "{path}.content[{i}] of type {} is not supported: minfer embeds text parts only (no images, audio or video)",
                            kind.unwrap_or("(none)")
                        ),
                    ))
                }
            }
        }
        Ok(Value::String(text))
    };
    match value {
        Value::Array(items) => Ok(Value::Array(
            (items.iter().enumerate())
                .map(|(i, v)| one(&format!("{name}[{i}]"), v))
                .collect::<Result<_, _>>()?,
        )),
        other => one(name, other),
    }
}

/// llama-server's `/embedding` and `/embeddings`: `[{"index", "embedding": [[...]]}]`, one row
/// per input when pooled, one per token with pooling `none`.
pub async fn native(State(app): State<App>, req: Request) -> Response {
    answer(&app, req, false)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// OpenAI's `/v1/embeddings`: `{"object": "list", "data": [{"object": "embedding", "index",
/// "embedding"}], "model", "usage"}`, the vectors as floats or base64 little-endian f32.
pub async fn openai(State(app): State<App>, req: Request) -> Response {
    answer(&app, req, true)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn answer(app: &App, req: Request, openai: bool) -> Result<Response, ApiError> {
    let service = service(app)?;
    let body = routes::read_request(app, req, read_embeddings).await?;
    let openai = openai && !body.native;
    if openai && service.pooling() == Pooling::None {
        return Err(ApiError::bad_request(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    if let Some(d) = body.dimensions {
        if d as usize != service.n_embd() {
            return Err(ApiError::field(
                "dimensions",
                format!(
                    "dimensions = {d} is not supported: this model's embeddings have {} dimensions and it was not trained to be truncated",
                    service.n_embd()
                ),
            ));
        }
    }
    let tokens = routes::encode_prompts(app, "input", body.inputs).await?;
    let n_tokens: usize = tokens.iter().map(Vec::len).sum();
    let normalize = body.normalize.unwrap_or(service.normalize);
    let rows = normalized(service.pooling(), normalize, service.embed(tokens).await?);
    if !openai {
        let items: Vec<Value> = (rows.iter().enumerate())
            .map(|(index, r)| json!({"index": index, "embedding": r}))
            .collect();
        return Ok(Json(Value::Array(items)).into_response());
    }
    let data: Vec<Value> = (rows.iter().enumerate())
        .map(|(index, r)| match body.base64 {
            true => json!({"object": "embedding", "index": index, "embedding": base64_f32(&r[0]), "encoding_format": "base64"}),
            false => json!({"object": "embedding", "index": index, "embedding": r[0]}),
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": body.model.unwrap_or_else(|| app.model_id.clone()),
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

/// `v` as OpenAI's base64 embeddings: the little-endian f32 bytes, base64 (standard alphabet,
/// padded).
pub fn base64_f32(v: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n =
            (chunk[0] as u32) << 16 | (*chunk.get(1).unwrap_or(&0) as u32) << 8 | *chunk.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A rerank body: Jina's and Cohere's `query`, `documents`, `top_n`, `return_documents`, or
/// TEI's `texts` and `return_text`.
struct RerankRequest {
    query: String,
    documents: Vec<String>,
    top_n: usize,
    tei: bool,
    return_text: bool,
    model: Option<String>,
}

fn read_rerank(body: &Value) -> Result<RerankRequest, ApiError> {
    let f = Fields::of(body, "")?;
    let query = match f.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(ApiError::field("query", "\"query\" must be a string")),
        None => return Err(ApiError::field("query", "\"query\" must be provided")),
    };
    let tei = f.get("texts").is_some();
    let name = if tei { "texts" } else { "documents" };
    let documents: Vec<String> = match f.get(name) {
        Some(Value::Array(items)) if !items.is_empty() => items
            .iter()
            .enumerate()
            .map(|(i, d)| match d {
                Value::String(s) => Ok(s.clone()),
                // Cohere's documents may be `{"text": ...}` objects.
                Value::Object(o) if o.get("text").is_some_and(Value::is_string) => {
                    Ok(o["text"].as_str().unwrap_or_default().to_string())
                }
                other => Err(ApiError::field(
                    format!("{name}[{i}]"),
                    format!("{name}[{i}] must be a string, not {}", request::kind(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        _ => {
            return Err(ApiError::field(
                name,
                format!("\"{name}\" must be a non-empty string array"),
            ))
        }
    };
    check_count(name, documents.len())?;
    let top_n = f.integer("top_n", 0, i64::MAX)?.map_or(documents.len(), |n| n as usize);
    let return_text = f
        .bool(if tei { "return_text" } else { "return_documents" })?
        .unwrap_or(false);
    Ok(RerankRequest {
        query,
        documents,
        top_n,
        tei,
        return_text,
        model: f.str("model")?.map(str::to_string),
    })
}

/// The tokens llama-server scores for `query` and `document`: the model's rerank template
/// (`tokenizer.chat_template.rerank`, `{query}` and `{document}` replaced, specials parsed, no
/// BOS added), else BOS (if the model adds one), the query, EOS (if it adds one), the
/// document, EOS.
fn rerank_tokens(model: &Model, query: &str, document: &str) -> Vec<u32> {
    let tokenizer = model.tokenizer();
    let metadata = model.file().metadata();
    if let Ok(template) = metadata.get_str("tokenizer.chat_template.rerank") {
        let prompt = template.replace("{query}", query).replace("{document}", document);
        return tokenizer.encode(&prompt, false, true);
    }
    let mut tokens = Vec::new();
    if tokenizer.add_bos() {
        tokens.extend(tokenizer.bos());
    }
    tokens.extend(tokenizer.encode(query, false, false));
    if tokenizer.add_eos() {
        tokens.extend(tokenizer.eos());
    }
    tokens.extend(tokenizer.encode(document, false, false));
    if tokenizer.add_eos() {
        tokens.extend(tokenizer.eos());
    }
    tokens
}

/// `/rerank`: each document's relevance to the query (the rank head's score), best first,
/// the first `top_n`.
pub async fn rerank(State(app): State<App>, req: Request) -> Response {
    let result = async {
        let service = app
            .embeddings
            .as_ref()
            .filter(|s| s.pooling() == Pooling::Rank)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "This server does not support reranking. Start it with `--reranking`",
                )
            })?;
        let body = routes::read_request(&app, req, read_rerank).await?;
        let model = Arc::clone(&app.model);
        let (query, documents) = (body.query.clone(), body.documents.clone());
        let tokens = routes::blocking(move || {
            Ok(documents
                .iter()
                .map(|d| rerank_tokens(&model, &query, d))
                .collect::<Vec<_>>())
        })
        .await?;
        let n_tokens: usize = tokens.iter().map(Vec::len).sum();
        let rows = service.embed(tokens).await?;
        let mut ranked: Vec<(usize, f32)> = rows.iter().map(|r| r[0][0]).enumerate().collect();
        ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
        ranked.truncate(body.top_n);
        let score = if body.tei { "score" } else { "relevance_score" };
        let results: Vec<Value> = ranked
            .iter()
            .map(|&(index, s)| {
                let mut item = json!({"index": index, score: s});
                if body.return_text {
                    let text = &body.documents[index];
                    item[if body.tei { "text" } else { "document" }] =
                        if body.tei { json!(text) } else { json!({"text": text}) };
                }
                item
            })
            .collect();
        if body.tei {
            return Ok::<_, ApiError>(Json(Value::Array(results)).into_response());
        }
        Ok(Json(json!({
            "model": body.model.unwrap_or_else(|| app.model_id.clone()),
            "object": "list",
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "results": results,
        }))
        .into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_embeddings_are_the_little_endian_f32_bytes() {
        // 1.0f32 = 00 00 80 3f; -2.0 = 00 00 00 c0.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn embeddings_bodies_take_input_or_content_and_refuse_other_formats() {
        let r = read_embeddings(&json!({"input": ["a", [1, 2]], "encoding_format": "base64"})).unwrap();
        assert_eq!(r.inputs.len(), 2);
        assert!(r.base64 && !r.native);
        assert_eq!(r.normalize, None);
        let r = read_embeddings(&json!({"content": "a", "embd_normalize": -1})).unwrap();
        assert!(r.native);
        assert_eq!(r.normalize, Some(Normalize::NONE));
        assert!(read_embeddings(&json!({"input": "a", "encoding_format": "int8"})).is_err());
        assert!(read_embeddings(&json!({"model": "x"})).is_err());
        assert!(read_embeddings(&json!({"input": []})).is_err());
        let parts = json!({"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]});
        let r = read_embeddings(&json!({"input": ["hello world", parts]})).unwrap();
        assert_eq!(r.inputs[0], r.inputs[1]);
        let image = json!({"content": [{"type": "image_url", "image_url": {"url": "data:,"}}]});
        let err = read_embeddings(&json!({"input": image})).err().unwrap();
        assert!(err.message.contains("image_url"), "{}", err.message);
    }

    #[test]
    fn rerank_bodies_read_jina_cohere_and_tei_shapes() {
        let r = read_rerank(&json!({"query": "q", "documents": ["a", {"text": "b"}], "top_n": 1})).unwrap();
        assert_eq!((r.documents.len(), r.top_n, r.tei), (2, 1, false));
        let r = read_rerank(&json!({"query": "q", "texts": ["a"], "return_text": true})).unwrap();
        assert!(r.tei && r.return_text);
        assert!(read_rerank(&json!({"query": 1, "documents": ["a"]})).is_err());
        assert!(read_rerank(&json!({"query": "q", "documents": []})).is_err());
        assert!(read_rerank(&json!({"documents": ["a"]})).is_err());
        let many = vec!["d"; MAX_INPUTS + 1];
        let err = read_rerank(&json!({"query": "q", "documents": many})).err().unwrap();
        assert!(err.message.contains("2049 inputs"), "{}", err.message);
    }
}
