//! One generation as a state machine: a [`Sequence`] holds the token history, the sampler, the
//! stop-string matcher and the streaming detokenizer, takes a row of logits and returns the
//! next step. Whatever drives the forward passes — the single-shot loop, a conversation, a
//! batched scheduler, a speculative verifier — drives the same machine.
//!
//! It knows no session, no batch and no transport: the caller evaluates the tokens it accepts.

use super::generate::{GenerateOptions, GenerationResult, GenerationStats, StopReason};
use super::reasoning_budget::BudgetTracker;
use super::stop::StopMatcher;
use super::EngineError;
use crate::grammar::{allowed, Constraint};
use crate::sampling::{Candidate, DryBreakers, Sampler, SamplingParams};
use crate::tokenizer::{StreamDecoder, Tokenizer};
use std::ops::Range;

/// The sampler of one generation, with DRY's sequence breakers turned into token sequences
/// when DRY is on (a pass over the vocabulary, so only then).
fn sampler(tokenizer: &Tokenizer, params: &SamplingParams) -> Result<Sampler, EngineError> {
    let sampler = Sampler::new(params.clone())?;
    if !params.dry_enabled() || params.dry_sequence_breakers.is_empty() {
        return Ok(sampler);
    }
    // llama.cpp reads each token's text with control tokens rendered, and tokenizes a breaker's
    // remainder as plain text without BOS.
    let breakers = DryBreakers::new(
        &params.dry_sequence_breakers,
        tokenizer.n_vocab(),
        |id| tokenizer.token_to_piece(id, true),
        |bytes| tokenizer.encode_bytes(bytes, false, false),
    );
    Ok(sampler.with_dry_breakers(breakers))
}

/// What accepting a token produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The token accepted.
    pub token: u32,
    /// The bytes of text that became final with it: read them with [`Sequence::text`] before
    /// the next step. Often empty (a token may end inside a character or a possible stop string).
    pub text: Range<usize>,
    /// Set when the generation ended with this token; the token is then not to be evaluated.
    pub finished: Option<StopReason>,
}

/// A generation in progress; see the module documentation.
///
/// ```
/// use minfer::engine::{GenerateOptions, Model, ModelOptions, Sequence, Session};
///
/// let model = Model::load("tests/fixtures/models/tiny-qwen2-Q8_0.gguf", &ModelOptions::default())?;
/// let prompt = model.encode("Once upon a time");
/// let mut session = Session::new(&model, 128);
/// let mut sequence = Sequence::new(model.tokenizer(), &prompt, &GenerateOptions { max_tokens: 5, ..Default::default() })?;
/// session.eval(&prompt, 1)?;
/// while sequence.finished().is_none() {
///     let token = sequence.sample(session.last_logits()?)?;
///     let step = sequence.accept(token);
///     print!("{}", String::from_utf8_lossy(sequence.text(step.text)));
///     if step.finished.is_none() {
///         session.eval(&[token], 1)?;
///     }
/// }
/// assert!(sequence.generated().len() <= 5);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sequence<'t> {
    tokenizer: &'t Tokenizer,
    /// The prompt, then every accepted token: what the penalties look at.
    history: Vec<u32>,
    n_prompt: usize,
    sampler: Sampler,
    /// The grammar the output must follow, if any.
    constraint: Option<Constraint>,
    stops: StopMatcher,
    decoder: StreamDecoder<'t>,
    max_tokens: usize,
    ignore_eos: bool,
    finished: Option<StopReason>,
    /// The reasoning budget being spent, if the generation has one.
    budget: Option<BudgetTracker>,
}

impl<'t> Sequence<'t> {
    /// A generation continuing `prompt` (its whole context, already tokenized) under `options`.
    /// With `max_tokens` 0 it is finished from the start.
    pub fn new(tokenizer: &'t Tokenizer, prompt: &[u32], options: &GenerateOptions) -> Result<Self, EngineError> {
        Ok(Sequence {
            tokenizer,
            history: prompt.to_vec(),
            n_prompt: prompt.len(),
            sampler: sampler(tokenizer, &options.sampling)?,
            constraint: options.grammar.as_ref().map(|g| g.start()),
            stops: StopMatcher::new(&options.stop),
            decoder: tokenizer.stream_decoder(options.special),
            max_tokens: options.max_tokens,
            ignore_eos: options.ignore_eos,
            finished: (options.max_tokens == 0).then_some(StopReason::MaxTokens),
            budget: options.reasoning_budget.clone().map(BudgetTracker::new),
        })
    }

    /// The sampler, for whatever acts between building the candidates and the draw.
    pub fn sampler_mut(&mut self) -> &mut Sampler {
        &mut self.sampler
    }

    /// The next token from one row of logits (the model's output after the last accepted
    /// token, or after the prompt), under the penalties of the history and, with a grammar,
    /// among the tokens it allows: the others are -inf before the filters see the row, so
    /// top-k, top-p and the rest choose among valid continuations only.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, EngineError> {
        if let Some(token) = self.forced() {
            return Ok(token);
        }
        let Some(constraint) = &mut self.constraint else {
            return Ok(self.sampler.sample(logits, &self.history)?);
        };
        let mask = constraint.mask()?;
        self.sampler
            .build_candidates_masked(logits, &self.history, Some(&|id| allowed(mask, id)))?;
        Ok(self.sampler.draw()?)
    }

    /// [`Sequence::sample`], showing `inspect` the candidate list the sampler chain left (the
    /// grammar's mask applied) before the draw: what a server reports as the probabilities
    /// after sampling. The token drawn is the one [`Sequence::sample`] would draw.
    pub fn sample_inspect(
        &mut self,
        logits: &[f32],
        inspect: &mut dyn FnMut(&[Candidate]),
    ) -> Result<u32, EngineError> {
        if let Some(token) = self.forced() {
            // The chain did not choose it: it was the only candidate.
            inspect(&[Candidate {
                id: token,
                logit: logits.get(token as usize).copied().unwrap_or(0.0),
                weight: 1.0,
            }]);
            return Ok(token);
        }
        let candidates = match &mut self.constraint {
            None => self.sampler.build_candidates(logits, &self.history)?,
            Some(constraint) => {
                let mask = constraint.mask()?;
                self.sampler
                    .build_candidates_masked(logits, &self.history, Some(&|id| allowed(mask, id)))?
            }
        };
        inspect(candidates);
        Ok(self.sampler.draw()?)
    }

    /// The token the reasoning budget forces next (its closing tag, once the budget is spent),
    /// taken whatever the logits say.
    fn forced(&self) -> Option<u32> {
        self.budget.as_ref().and_then(BudgetTracker::forced)
    }

    /// Computes what the grammar allows next, if there is one, so that the next
    /// [`Sequence::sample`] does not wait for it: call it while the forward pass runs.
    pub fn prepare(&mut self) -> Result<(), EngineError> {
        match &mut self.constraint {
            Some(constraint) => Ok(constraint.prepare()?),
            None => Ok(()),
        }
    }

    /// Whether a grammar constrains this generation.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Take `token` as the next one of the generation (sampled here, or proposed elsewhere and
    /// verified): its text is decoded and checked against the stop strings, and the generation
    /// ends at an end-of-generation token, a stop string or the token limit.
    ///
    /// With a grammar, the token advances it; a token the grammar refuses (one proposed
    /// elsewhere) leaves it broken, and the next [`Sequence::sample`] says so. An
    /// end-of-generation token ends a constrained generation even with `ignore_eos`: the
    /// grammar allows one only where its text is complete.
    pub fn accept(&mut self, token: u32) -> Step {
        // A token the reasoning budget forces is outside any grammar: the grammar constrains
        // what the model chooses, and the closing tag is not its choice.
        let forced = self.budget.as_ref().is_some_and(BudgetTracker::forcing);
        self.history.push(token);
        if let Some(budget) = &mut self.budget {
            budget.accept(&self.history);
        }
        let n_generated = self.history.len() - self.n_prompt;
        let mut grammar_done = false;
        if let Some(constraint) = self.constraint.as_mut().filter(|_| !forced) {
            // A refusal is kept by the constraint and reported by the next `sample`.
            grammar_done = constraint.accept(token).is_ok() && self.tokenizer.is_eog(token);
        }
        if self.tokenizer.is_eog(token) && (!self.ignore_eos || grammar_done) {
            return self.finish(token, None, StopReason::EndOfGeneration);
        }
        let (text, stopped) = self.stops.push(&self.decoder.push(token));
        if stopped {
            self.finished = Some(StopReason::StopString);
            return Step {
                token,
                text,
                finished: self.finished,
            };
        }
        if n_generated >= self.max_tokens {
            return self.finish(token, Some(text), StopReason::MaxTokens);
        }
        Step {
            token,
            text,
            finished: None,
        }
    }

    /// End the generation for `reason`, releasing the text held back (a partial character, a
    /// partial stop string), which may itself complete a stop string.
    fn finish(&mut self, token: u32, text: Option<Range<usize>>, reason: StopReason) -> Step {
        let (tail, stopped) = self.stops.push(&self.decoder.finish());
        let text = text.map_or(tail.start, |t| t.start)..tail.end;
        let (text, reason) = if stopped {
            (text, StopReason::StopString)
        } else {
            let rest = self.stops.flush();
            (text.start..rest.end, reason)
        };
        self.finished = Some(reason);
        Step {
            token,
            text,
            finished: self.finished,
        }
    }

    /// End the generation now for a reason the caller decides (a full context, a cancellation),
    /// releasing the text held back; returns its range, for [`Sequence::text`]. A sequence that
    /// already ended keeps its reason.
    pub fn stop(&mut self, reason: StopReason) -> Range<usize> {
        if self.finished.is_some() {
            return 0..0;
        }
        let token = self.history.last().copied().unwrap_or(0);
        self.finish(token, None, reason).text
    }

    /// Bytes of the generated text (a [`Step`]'s range).
    pub fn text(&self, range: Range<usize>) -> &[u8] {
        &self.stops.text[range]
    }

    /// The stop string that ended the generation ([`StopReason::StopString`]), else empty:
    /// llama-server's `stopping_word`.
    pub fn stopping_word(&self) -> &str {
        self.stops.matched.as_deref().unwrap_or("")
    }

    /// Why the generation ended, once it has.
    pub fn finished(&self) -> Option<StopReason> {
        self.finished
    }

    /// The prompt and every accepted token.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// The accepted tokens.
    pub fn generated(&self) -> &[u32] {
        &self.history[self.n_prompt..]
    }

    /// The result of a finished (or abandoned) generation, with the caller's timings.
    pub fn into_result(self, stats: GenerationStats) -> GenerationResult {
        GenerationResult {
            tokens: self.history[self.n_prompt..].to_vec(),
            text: self.stops.text,
            stop_reason: self.finished.unwrap_or(StopReason::MaxTokens),
            stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_with_an_inspector_draws_what_sample_draws_and_shows_the_chains_candidates() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny-qwen2-Q8_0.gguf");
        let file = crate::gguf::GgufFile::open(&path).unwrap();
        let tokenizer = Tokenizer::from_metadata(file.metadata()).unwrap();
        let options = GenerateOptions {
            max_tokens: 16,
            sampling: SamplingParams {
                seed: 7,
                ..SamplingParams::default()
            },
            ..Default::default()
        };
        let mut plain = Sequence::new(&tokenizer, &[1, 2, 3], &options).unwrap();
        let mut inspected = Sequence::new(&tokenizer, &[1, 2, 3], &options).unwrap();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..8 {
            let logits: Vec<f32> = (0..tokenizer.n_vocab())
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state % 1000) as f32 / 100.0
                })
                .collect();
            let mut seen = Vec::new();
            let a = plain.sample(&logits).unwrap();
            let b = inspected
                .sample_inspect(&logits, &mut |c: &[Candidate]| seen = c.to_vec())
                .unwrap();
            assert_eq!(a, b);
            // Top-k 40 left its candidates, weighed, the drawn one among them.
            let weighed: Vec<&Candidate> = seen.iter().filter(|c| c.weight > 0.0).collect();
            assert!(!weighed.is_empty() && weighed.len() <= 40, "{}", weighed.len());
            assert!(weighed.iter().any(|c| c.id == b));
            plain.accept(a);
            inspected.accept(b);
        }
    }
}
