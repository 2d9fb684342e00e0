//! The generation loop: prefill the prompt in one batch, then sample and decode one token at a
//! time, streaming text as it completes, until an end-of-generation token, a stop string
//! (matched across token boundaries) or the token limit. The decisions are the [`Sequence`]'s;
//! this loop only drives a session with them.

use super::{EngineError, Sequence, Session};
use crate::grammar::Grammar;
use crate::sampling::SamplingParams;
use crate::tokenizer::Tokenizer;
use std::time::{Duration, Instant};

/// What to generate and when to stop.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Generation stops before any of these strings; they are not printed.
    pub stop: Vec<String>,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// How each next token is chosen (penalties, top-k, top-p, temperature, seed).
    pub sampling: SamplingParams,
    /// A grammar the output must follow (GBNF, a JSON schema, ...); only the tokens it allows
    /// are sampled, and the generation ends where it is complete.
    pub grammar: Option<Grammar>,
    /// Render control tokens as text in the output.
    pub special: bool,
    /// When the context fills: `Some(n_keep)` shifts it (llama.cpp's context shift: keep the
    /// first `n_keep` tokens, discard half of the rest, go on); `None` stops the generation
    /// with [`StopReason::ContextFull`].
    pub context_shift: Option<usize>,
    /// A limit on a thinking model's reasoning, its closing tag forced when it is spent.
    pub reasoning_budget: Option<super::ReasoningBudget>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 512,
            stop: Vec::new(),
            ignore_eos: false,
            sampling: SamplingParams::default(),
            grammar: None,
            special: false,
            context_shift: None,
            reasoning_budget: None,
        }
    }
}

/// Why a generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The model produced an end-of-generation token (EOS, `<|im_end|>`, ...).
    EndOfGeneration,
    /// The text reached one of the stop strings.
    StopString,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The KV cache is full: the last token was sampled but there is no cell to evaluate it in.
    ContextFull,
    /// The observer asked to stop ([`GenerationObserver::interrupted`]): a user's Ctrl-C.
    Interrupted,
}

/// Counts and timings of one generation, in llama.cpp's two calibres (prefill, decode).
#[derive(Clone, Debug, Default)]
pub struct GenerationStats {
    /// Prompt tokens prefilled (those not already in the KV cache).
    pub n_prompt: usize,
    /// Prompt tokens reused from the KV cache instead of prefilled.
    pub n_cached: usize,
    /// Wall time of the prefill.
    pub prompt_time: Duration,
    /// Forward passes the prefill took (the prompt in chunks of the session's `n_ubatch`).
    pub n_prompt_passes: usize,
    /// Tokens sampled (the last one included, even when it ended the generation).
    pub n_generated: usize,
    /// Wall time of the decode steps and sampling.
    pub gen_time: Duration,
    /// Context shifts made while generating.
    pub n_shifts: usize,
    /// Tokens the context shifts discarded.
    pub n_discarded: usize,
    /// Tokens a drafter proposed (speculative decoding), and how many of them the target kept.
    pub n_drafted: usize,
    /// See `n_drafted`.
    pub n_accepted: usize,
}

impl GenerationStats {
    /// Prefill speed in tokens per second.
    pub fn prompt_tok_per_s(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generation speed in tokens per second.
    pub fn gen_tok_per_s(&self) -> f64 {
        self.n_generated as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }

    /// The timing line printed at the end of a run.
    pub fn summary(&self) -> String {
        let shifts = match self.n_shifts {
            0 => String::new(),
            n => format!(" | Context shifts: {n}"),
        };
        let drafts = match self.n_drafted {
            0 => String::new(),
            n => format!(
                " | Drafted: {n}, accepted {} ({:.1} %)",
                self.n_accepted,
                100.0 * self.n_accepted as f64 / n as f64
            ),
        };
        let passes = match self.n_prompt_passes {
            0 | 1 => String::new(),
            n => format!(", {n} passes"),
        };
        format!(
            "Prefill: {} tokens in {:.2} s ({:.1} tok/s{passes}) | Generated: {} tokens in {:.2} s ({:.1} tok/s) | Total: {:.2} s{shifts}{drafts}",
            self.n_prompt,
            self.prompt_time.as_secs_f64(),
            self.prompt_tok_per_s(),
            self.n_generated,
            self.gen_time.as_secs_f64(),
            self.gen_tok_per_s(),
            (self.prompt_time + self.gen_time).as_secs_f64()
        )
    }
}

/// What a generation produced.
#[derive(Clone, Debug)]
pub struct GenerationResult {
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// The text emitted (without the stop string).
    pub text: Vec<u8>,
    /// Why it ended.
    pub stop_reason: StopReason,
    /// Counts and timings.
    pub stats: GenerationStats,
}

/// What the generation loop reports as it goes. Either method may return an error to end the
/// generation at once (a closed output, a cancelled request); it comes back as
/// [`EngineError::Output`].
pub trait GenerationObserver {
    /// Called for each sampled token, before its text, with the logits row it was sampled from
    /// (the raw model output, before penalties and temperature).
    fn on_token(&mut self, _token: u32, _logits: &[f32]) -> Result<(), String> {
        Ok(())
    }

    /// Called with each piece of text as it becomes final.
    fn on_text(&mut self, text: &[u8]) -> Result<(), String>;

    /// Asked before each chunk of the prompt is prefilled: `true` ends the generation there
    /// (a client that left while a long prompt was being read), with [`EngineError::Output`].
    fn cancelled(&self) -> bool {
        false
    }

    /// Asked before each token is sampled: `true` ends the generation there, as a normal
    /// result with [`StopReason::Interrupted`] (what was generated so far stays in the session).
    fn interrupted(&self) -> bool {
        false
    }
}

/// Prompt tokens prefilled per forward pass unless the session says otherwise
/// ([`Session::set_n_ubatch`](super::Session::set_n_ubatch); llama.cpp's default `n_ubatch`): a
/// long prompt is read in chunks, so a cancellation takes effect within one chunk. Each row is computed
/// independently of the others in its batch, so the chunking changes no logit.
pub const PREFILL_CHUNK: usize = 512;

struct TextOnly<F>(F);

impl<F: FnMut(&[u8]) -> Result<(), String>> GenerationObserver for TextOnly<F> {
    fn on_text(&mut self, text: &[u8]) -> Result<(), String> {
        (self.0)(text)
    }
}

/// Generate from `prompt` (already tokenized), calling `on_text` with each piece of text as it
/// becomes final. The session continues from its current context.
pub fn generate(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    on_text: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<GenerationResult, EngineError> {
    run(session, tokenizer, prompt, 0, options, &mut TextOnly(on_text))
}

/// Generate from `prompt`, the whole context, of which the session already holds the first
/// `n_cached` tokens (a prefix kept from an earlier generation): only the rest is prefilled.
/// `n_cached` must equal the session's `n_past` and be less than the prompt's length, since the
/// last prompt token must be evaluated to get the logits of the first new one.
pub fn generate_cached(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    n_cached: usize,
    options: &GenerateOptions,
    observer: &mut impl GenerationObserver,
) -> Result<GenerationResult, EngineError> {
    if n_cached != session.n_past() || n_cached >= prompt.len() {
        return Err(EngineError::BadCachedPrefix {
            n_cached,
            n_past: session.n_past(),
            n_prompt: prompt.len(),
        });
    }
    run(session, tokenizer, prompt, n_cached, options, observer)
}

/// The loop: prefill what the session does not hold, then sample, report and decode one token
/// at a time on a [`Sequence`] until it finishes.
fn run(
    session: &mut Session,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    n_cached: usize,
    options: &GenerateOptions,
    observer: &mut impl GenerationObserver,
) -> Result<GenerationResult, EngineError> {
    let mut sequence = Sequence::new(tokenizer, prompt, options)?;
    let mut stats = GenerationStats {
        n_prompt: prompt.len() - n_cached,
        n_cached,
        ..Default::default()
    };
    prefill(session, &mut sequence, &prompt[n_cached..], observer, &mut stats)?;
    let gen_start = Instant::now();
    while sequence.finished().is_none() {
        if observer.interrupted() {
            stop_and_report(&mut sequence, observer, StopReason::Interrupted)?;
            break;
        }
        // Sampling reads the logits where the session keeps them: no vocabulary-sized copy.
        let logits = session.last_logits()?;
        let token = sequence.sample(logits)?;
        observer.on_token(token, logits).map_err(EngineError::Output)?;
        let step = sequence.accept(token);
        let text = sequence.text(step.text);
        if !text.is_empty() {
            observer.on_text(text).map_err(EngineError::Output)?;
        }
        if step.finished.is_none() {
            if session.kv().n_used() >= session.n_ctx() {
                if let Some(n_keep) = options.context_shift {
                    let n_past = session.n_past();
                    let n_keep = n_keep.min(n_past.saturating_sub(2));
                    let n_discard = (n_past - n_keep) / 2;
                    session.shift_context(n_keep, n_discard)?;
                    stats.n_shifts += 1;
                    stats.n_discarded += n_discard;
                    session.eval(&[token], 1)?;
                    continue;
                }
                stop_and_report(&mut sequence, observer, StopReason::ContextFull)?;
                break;
            }
            eval_preparing(session, &mut sequence, &[token])?;
        }
    }
    stats.n_generated = sequence.generated().len();
    stats.gen_time = gen_start.elapsed();
    Ok(sequence.into_result(stats))
}

/// Reads `tokens` (the prompt past what the session holds) in passes of the session's
/// `n_ubatch`, the grammar's first mask computed meanwhile; a cancellation is checked before
/// each pass. Fills the prompt's passes and time in `stats`.
pub(super) fn prefill(
    session: &mut Session,
    sequence: &mut Sequence,
    tokens: &[u32],
    observer: &impl GenerationObserver,
    stats: &mut GenerationStats,
) -> Result<(), EngineError> {
    let start = Instant::now();
    for chunk in tokens.chunks(session.n_ubatch()) {
        if observer.cancelled() {
            return Err(EngineError::Output("cancelled while reading the prompt".into()));
        }
        eval_preparing(session, sequence, chunk)?;
        stats.n_prompt_passes += 1;
    }
    stats.prompt_time = start.elapsed();
    Ok(())
}

/// Ends the generation for `reason` and reports the text that releases.
pub(super) fn stop_and_report(
    sequence: &mut Sequence,
    observer: &mut impl GenerationObserver,
    reason: StopReason,
) -> Result<(), EngineError> {
    let text = sequence.stop(reason);
    let text = sequence.text(text);
    if !text.is_empty() {
        observer.on_text(text).map_err(EngineError::Output)?;
    }
    Ok(())
}

/// Evaluates `tokens` and, for a constrained generation, computes the grammar's next mask on a
/// second thread meanwhile, so that the mask costs the step little more than its thread's
/// share of the cores.
pub fn eval_preparing(session: &mut Session, sequence: &mut Sequence, tokens: &[u32]) -> Result<(), EngineError> {
    if !sequence.is_constrained() {
        session.eval(tokens, 1)?;
        return Ok(());
    }
    std::thread::scope(|scope| {
        let mask = scope.spawn(|| sequence.prepare());
        let evaluated = session.eval(tokens, 1).map(|_| ());
        let prepared = mask
            .join()
            .unwrap_or_else(|_| Err(crate::grammar::GrammarError::Step("the mask computation panicked".into()).into()));
        evaluated.and(prepared)
    })
}
