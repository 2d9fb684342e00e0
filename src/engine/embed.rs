//! Embeddings and rerank scores: inputs packed as sequences of one forward pass whose graph
//! ends at the final norm (or a reranker's head), their rows pooled by the model's rule
//! (llama.cpp's `pooling_type`) and normalized by llama.cpp's `embd_normalize` integers.
//!
//! It owns one [`Session`] in an embeddings mode and empties its cache before every pass: an
//! input never sees another's cells, so a batch of inputs gives each the vector it gets alone.
//! It knows no transport and no text: inputs arrive as tokens.

use super::{Batch, EngineError, Session};
use crate::graph::GraphOutput;
use crate::models::pooling::Pooling;

/// Why inputs could not be embedded.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// An input with no tokens has no vector.
    #[error("input {index} is empty: it has no tokens to embed")]
    EmptyInput {
        /// The input's index.
        index: usize,
    },
    /// An input longer than one forward pass: every input's tokens are read in one pass.
    #[error(
        "input {index} has {n_tokens} tokens, more than the {n_ubatch} one pass reads; \
         shorten it or raise the physical batch size (-ub, with -b and -c at least as large)"
    )]
    InputTooLong {
        /// The input's index.
        index: usize,
        /// Its tokens.
        n_tokens: usize,
        /// Tokens one pass reads.
        n_ubatch: usize,
    },
    /// Rank pooling on a model without a classification head.
    #[error("pooling 'rank' needs a classification head (tensor cls.output.weight), which this model does not have")]
    NoRankHead,
    /// A rerank asked of a session that does not pool by rank.
    #[error("reranking needs pooling 'rank', but this model pools by '{pooling}' (start it with --pooling rank or --reranking)")]
    NotRanking {
        /// The session's pooling.
        pooling: Pooling,
    },
    /// An `--embd-normalize` value llama.cpp gives no meaning.
    #[error("embd_normalize {value} is invalid: -1 (none), 0 (max absolute, int16 range), 1 (taxicab), 2 (euclidean) or p > 2 (p-norm)")]
    BadNormalize {
        /// The value.
        value: i32,
    },
    /// The forward pass failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// How vectors are scaled after pooling: llama.cpp's `embd_normalize` integer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalize(i32);

impl Normalize {
    /// Euclidean (L2), llama.cpp's default.
    pub const EUCLIDEAN: Normalize = Normalize(2);
    /// No scaling.
    pub const NONE: Normalize = Normalize(-1);

    /// The rule for llama.cpp's integer: -1 none, 0 max absolute (to the int16 range), 1
    /// taxicab, 2 euclidean, p > 2 the p-norm.
    pub fn new(value: i32) -> Result<Normalize, EmbedError> {
        match value {
            -1.. => Ok(Normalize(value)),
            _ => Err(EmbedError::BadNormalize { value }),
        }
    }

    /// llama.cpp's integer.
    pub fn value(self) -> i32 {
        self.0
    }

    /// Scale `v` in place, as llama.cpp's `common_embd_normalize` does (its sums in f64).
    pub fn apply(self, v: &mut [f32]) {
        let sum: f64 = match self.0 {
            -1 => 1.0,
            0 => v.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64)) / 32760.0,
            2 => v.iter().map(|x| (x * x) as f64).sum::<f64>().sqrt(),
            p => {
                let p = p as f64;
                v.iter().map(|x| (x.abs() as f64).powf(p)).sum::<f64>().powf(1.0 / p)
            }
        };
        let norm = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
        v.iter_mut().for_each(|x| *x *= norm);
    }
}

/// Cosine similarity of two vectors, as llama.cpp's `common_embd_similarity_cos` (two zero
/// vectors are similar, one is not).
pub fn cosine_similarity(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        dot += (x * y) as f64;
        na += (x * x) as f64;
        nb += (y * y) as f64;
    }
    match (na == 0.0, nb == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        _ => (dot / (na.sqrt() * nb.sqrt())) as f32,
    }
}

/// `v` through a softmax in place, as ggml's `soft_max` (the sum in f64).
fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f64;
    for x in v.iter_mut() {
        *x = (*x - max).exp();
        sum += *x as f64;
    }
    let inv = (1.0 / sum) as f32;
    v.iter_mut().for_each(|x| *x *= inv);
}

/// Whether every input can be embedded: none empty, none longer than one pass of `n_ubatch`
/// tokens. [`Embedder::embed`] checks this first; a caller that batches several requests
/// checks each before it joins them, so that one bad input fails only its own request.
pub fn check_inputs(inputs: &[Vec<u32>], n_ubatch: usize) -> Result<(), EmbedError> {
    for (index, input) in inputs.iter().enumerate() {
        if input.is_empty() {
            return Err(EmbedError::EmptyInput { index });
        }
        if input.len() > n_ubatch {
            return Err(EmbedError::InputTooLong {
                index,
                n_tokens: input.len(),
                n_ubatch,
            });
        }
    }
    Ok(())
}

/// One input's vectors: one row when pooled, one per token for pooling `none`.
pub type Rows = Vec<Vec<f32>>;

/// A session that embeds; see the module documentation.
///
/// ```
/// use minfer::engine::{Embedder, Model, ModelOptions, Normalize, Session};
///
/// let model = Model::load("tests/fixtures/models/tiny-qwen3-Q4_K.gguf", &ModelOptions::default())?;
/// let session = Session::with_sequences(&model, 512, 4)?;
/// let mut embedder = Embedder::new(session, None)?; // the file's rule, else `last`
/// let inputs = [model.encode("red green"), model.encode("one two three")];
/// let vectors = embedder.embed(&inputs, Normalize::EUCLIDEAN)?;
/// assert_eq!(vectors[1][0].len(), model.hparams().n_embd);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Embedder {
    session: Session,
    pooling: Pooling,
    batch: Batch,
    /// Forward passes run so far.
    n_passes: u64,
}

impl Embedder {
    /// An embedder over `session` (its sequences and cells bound how many inputs share a
    /// pass), pooling by `pooling`, else the model's `pooling_type`, else `last` (a decoder
    /// model's causal attention has seen the whole input only at its last token).
    pub fn new(mut session: Session, pooling: Option<Pooling>) -> Result<Embedder, EmbedError> {
        let hp = session.model().hparams();
        let pooling = pooling.or(hp.pooling).unwrap_or(Pooling::Last);
        if pooling == Pooling::Rank && hp.rank_head.is_none() {
            return Err(EmbedError::NoRankHead);
        }
        session.set_output(match pooling {
            Pooling::Rank => GraphOutput::Rank,
            _ => GraphOutput::Embeddings,
        });
        Ok(Embedder {
            session,
            pooling,
            batch: Batch::new(),
            n_passes: 0,
        })
    }

    /// An embedder over a new session of `model` whose passes read up to `n_batch` tokens of
    /// up to `n_seq_max` inputs (at most [`MAX_SEQUENCES`](super::MAX_SEQUENCES)).
    pub fn for_model(
        model: &super::Model,
        pooling: Option<Pooling>,
        n_batch: usize,
        n_seq_max: usize,
    ) -> Result<Embedder, EmbedError> {
        let n_seq_max = n_seq_max.clamp(1, super::MAX_SEQUENCES);
        let mut session = Session::with_sequences(model, n_batch.max(1), n_seq_max)?;
        session.set_n_ubatch(n_batch)?;
        Self::new(session, pooling)
    }

    /// Store the KV cache as `type_k` and `type_v` (`-ctk`, `-ctv`).
    pub fn set_kv_types(&mut self, type_k: crate::graph::DType, type_v: crate::graph::DType) -> Result<(), EmbedError> {
        Ok(self.session.set_kv_types(type_k, type_v)?)
    }

    /// The pooling rule in force.
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Values in each vector: n_embd, or the rank head's classes.
    pub fn n_embd(&self) -> usize {
        self.session.output_width()
    }

    /// Tokens one pass reads: the most an input may have.
    pub fn n_ubatch(&self) -> usize {
        self.session.n_ubatch().min(self.session.n_ctx())
    }

    /// Forward passes run so far (llama.cpp's decode calls, for metrics).
    pub fn n_passes(&self) -> u64 {
        self.n_passes
    }

    /// The session (for its backends and graph, in traces and tests).
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Each input's vectors, pooled and scaled by `normalize` (rank scores are not scaled).
    /// Inputs share passes as sequences, as many as the session holds and one pass reads.
    pub fn embed(&mut self, inputs: &[Vec<u32>], normalize: Normalize) -> Result<Vec<Rows>, EmbedError> {
        let n_ubatch = self.n_ubatch();
        check_inputs(inputs, n_ubatch)?;
        let n_seq_max = self.session.n_seq_max();
        let mut out = Vec::with_capacity(inputs.len());
        let mut first = 0;
        while first < inputs.len() {
            let (mut end, mut n_tokens) = (first, 0);
            while end < inputs.len() && end - first < n_seq_max && n_tokens + inputs[end].len() <= n_ubatch {
                n_tokens += inputs[end].len();
                end += 1;
            }
            self.pass(&inputs[first..end], &mut out)?;
            first = end;
        }
        if self.pooling != Pooling::Rank {
            out.iter_mut().flatten().for_each(|row| normalize.apply(row));
        }
        Ok(out)
    }

    /// Each input's relevance score: the rank head's first class (after the softmax llama.cpp
    /// applies for Qwen3 rerankers, the probability of "yes").
    pub fn rank(&mut self, inputs: &[Vec<u32>]) -> Result<Vec<f32>, EmbedError> {
        if self.pooling != Pooling::Rank {
            return Err(EmbedError::NotRanking { pooling: self.pooling });
        }
        let rows = self.embed(inputs, Normalize::NONE)?;
        Ok(rows.iter().map(|r| r[0][0]).collect())
    }

    /// One forward pass over `inputs` (each its own sequence, from position 0), their pooled
    /// rows appended to `out`.
    fn pass(&mut self, inputs: &[Vec<u32>], out: &mut Vec<Rows>) -> Result<(), EmbedError> {
        self.session.reset();
        self.batch.clear();
        for (seq, input) in inputs.iter().enumerate() {
            let n = input.len();
            for (pos, &token) in input.iter().enumerate() {
                let wanted = match self.pooling {
                    Pooling::None | Pooling::Mean => true,
                    Pooling::Cls => pos == 0,
                    Pooling::Last | Pooling::Rank => pos + 1 == n,
                };
                self.batch.add(token, pos as i32, seq, wanted);
            }
        }
        self.session.decode(&self.batch)?;
        self.n_passes += 1;
        let head_softmax = self.pooling == Pooling::Rank
            && (self.session.model().hparams().rank_head.as_ref()).is_some_and(|h| h.softmax);
        let mut row = 0;
        for input in inputs {
            let n = input.len();
            let rows = match self.pooling {
                Pooling::None => (row..row + n)
                    .map(|r| self.session.logits_ith(r).map(<[f32]>::to_vec))
                    .collect::<Result<Rows, _>>()?,
                Pooling::Mean => {
                    let mut sum = vec![0.0f32; self.n_embd()];
                    for r in row..row + n {
                        sum.iter_mut()
                            .zip(self.session.logits_ith(r)?)
                            .for_each(|(s, x)| *s += x);
                    }
                    let inv = 1.0 / n as f32;
                    sum.iter_mut().for_each(|s| *s *= inv);
                    vec![sum]
                }
                Pooling::Cls => vec![self.session.logits_ith(row)?.to_vec()],
                Pooling::Last => vec![self.session.logits_ith(row + n - 1)?.to_vec()],
                Pooling::Rank => {
                    let mut scores = self.session.logits_ith(row + n - 1)?.to_vec();
                    if head_softmax {
                        softmax(&mut scores);
                    }
                    vec![scores]
                }
            };
            out.push(rows);
            row += n;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalization_follows_llama_cpp_integers() {
        let v = [3.0f32, -4.0];
        let scaled = |n: i32| {
            let mut w = v;
            Normalize::new(n).unwrap().apply(&mut w);
            w
        };
        assert_eq!(scaled(-1), [3.0, -4.0]);
        assert_eq!(scaled(2), [0.6, -0.8]);
        let seventh = (1.0f64 / 7.0) as f32; // llama.cpp: 1/sum in f64, then the product in f32
        assert_eq!(scaled(1), [3.0 * seventh, -4.0 * seventh]);
        assert_eq!(scaled(0), [3.0 * (32760.0f64 / 4.0) as f32, -32760.0]);
        let p3 = (27.0f64 + 64.0).powf(1.0 / 3.0);
        assert_eq!(scaled(3), [(3.0 * (1.0 / p3) as f32), (-4.0 * (1.0 / p3) as f32)]);
        assert!(Normalize::new(-2).is_err());
        let mut zero = [0.0f32; 3];
        Normalize::EUCLIDEAN.apply(&mut zero);
        assert_eq!(zero, [0.0; 3]);
    }

    #[test]
    fn cosine_similarity_is_one_for_parallel_and_zero_for_a_zero_vector() {
        assert!((cosine_similarity(&[1.0, 2.0], &[2.0, 4.0]) - 1.0).abs() < 1e-7);
        assert_eq!(cosine_similarity(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine_similarity(&[0.0], &[0.0]), 1.0);
        assert!(cosine_similarity(&[1.0, 0.0], &[-1.0, 0.0]) + 1.0 < 1e-7);
    }
}
