//! The generation loop: prefill the prompt in one batch, then sample and decode one token at a
//! time, streaming text as it completes, until an end-of-generation token, a stop string
//! (matched across token boundaries) or the token limit.

use super::{EngineError, Session};
use crate::sampling::{Sampler, SamplingParams};
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
    /// Render control tokens as text in the output.
    pub special: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 512,
            stop: Vec::new(),
            ignore_eos: false,
            sampling: SamplingParams::default(),
            special: false,
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
    /// Tokens sampled (the last one included, even when it ended the generation).
    pub n_generated: usize,
    /// Wall time of the decode steps and sampling.
    pub gen_time: Duration,
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
        format!(
            "Prefill: {} tokens in {:.2} s ({:.1} tok/s) | Generated: {} tokens in {:.2} s ({:.1} tok/s) | Total: {:.2} s",
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

/// Holds back text that may be the beginning of a stop string, and finds stop strings that
/// span token boundaries.
struct StopMatcher<'a> {
    stops: &'a [String],
    text: Vec<u8>,
    emitted: usize,
}

impl<'a> StopMatcher<'a> {
    /// Add bytes; returns what can be emitted now and whether a stop string was reached.
    fn push(&mut self, bytes: &[u8]) -> (std::ops::Range<usize>, bool) {
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let search_from = self.emitted.saturating_sub(longest);
        self.text.extend_from_slice(bytes);
        let found = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| find(&self.text[search_from..], s.as_bytes()).map(|p| search_from + p))
            .min();
        if let Some(at) = found {
            let range = self.emitted..at.max(self.emitted);
            self.emitted = self.text.len();
            self.text.truncate(at.max(range.start));
            return (range, true);
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let mut hold = 0;
        for s in self.stops.iter().map(String::as_bytes) {
            for k in (1..s.len()).rev() {
                if k > hold && self.text.len() >= k && self.text.ends_with(&s[..k]) {
                    hold = k;
                    break;
                }
            }
        }
        let end = (self.text.len() - hold).max(self.emitted);
        let range = self.emitted..end;
        self.emitted = end;
        (range, false)
    }

    fn flush(&mut self) -> std::ops::Range<usize> {
        let range = self.emitted..self.text.len();
        self.emitted = self.text.len();
        range
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
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
}

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
    run(session, tokenizer, prompt.to_vec(), 0, options, &mut TextOnly(on_text))
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
    run(session, tokenizer, prompt.to_vec(), n_cached, options, observer)
}

fn emit(
    observer: &mut impl GenerationObserver,
    stops: &StopMatcher,
    range: std::ops::Range<usize>,
) -> Result<(), EngineError> {
    if range.is_empty() {
        return Ok(());
    }
    observer.on_text(&stops.text[range]).map_err(EngineError::Output)
}

/// The loop: `history[n_cached..]` is prefilled, and the penalties read the whole `history`.
fn run(
    session: &mut Session,
    tokenizer: &Tokenizer,
    mut history: Vec<u32>,
    n_cached: usize,
    options: &GenerateOptions,
    observer: &mut impl GenerationObserver,
) -> Result<GenerationResult, EngineError> {
    let mut sampler = Sampler::new(options.sampling)?;
    let mut stats = GenerationStats {
        n_prompt: history.len() - n_cached,
        n_cached,
        ..Default::default()
    };
    let mut decoder = tokenizer.stream_decoder(options.special);
    let mut stops = StopMatcher {
        stops: &options.stop,
        text: Vec::new(),
        emitted: 0,
    };
    let mut tokens = Vec::new();
    let start = Instant::now();
    session.eval(&history[n_cached..], 1)?;
    stats.prompt_time = start.elapsed();
    let gen_start = Instant::now();

    let mut reason = StopReason::MaxTokens;
    while tokens.len() < options.max_tokens {
        // Sampling reads the logits where the graph left them: no vocabulary-sized copy.
        let logits = session.last_logits()?;
        let token = sampler.sample(logits, &history)?;
        observer.on_token(token, logits).map_err(EngineError::Output)?;
        tokens.push(token);
        history.push(token);
        if tokenizer.is_eog(token) && !options.ignore_eos {
            reason = StopReason::EndOfGeneration;
            break;
        }
        let (range, stopped) = stops.push(&decoder.push(token));
        emit(observer, &stops, range)?;
        if stopped {
            reason = StopReason::StopString;
            break;
        }
        if tokens.len() == options.max_tokens {
            break;
        }
        session.eval(&[token], 1)?;
    }
    if reason != StopReason::StopString {
        let (range, stopped) = stops.push(&decoder.finish());
        emit(observer, &stops, range)?;
        if stopped {
            reason = StopReason::StopString;
        } else {
            let range = stops.flush();
            emit(observer, &stops, range)?;
        }
    }
    stats.n_generated = tokens.len();
    stats.gen_time = gen_start.elapsed();
    let text = stops.text;
    Ok(GenerationResult {
        tokens,
        text,
        stop_reason: reason,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher {
            stops: &stops,
            text: Vec::new(),
            emitted: 0,
        };
        let mut out = Vec::new();
        for p in pieces {
            let (r, stopped) = m.push(p.as_bytes());
            out.extend_from_slice(&m.text[r]);
            if stopped {
                return (String::from_utf8(out).unwrap(), true);
            }
        }
        let r = m.flush();
        out.extend_from_slice(&m.text[r]);
        (String::from_utf8(out).unwrap(), false)
    }

    #[test]
    fn a_stop_string_split_across_pieces_is_found_and_not_printed() {
        assert_eq!(run(&["END"], &["hello E", "N", "D more"]), ("hello ".into(), true));
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn a_partial_match_that_does_not_complete_is_printed() {
        assert_eq!(run(&["END"], &["hello E", "N", "x"]), ("hello ENx".into(), false));
        assert_eq!(run(&["END"], &["tail E"]), ("tail E".into(), false));
    }
}
