//! Speculative decoding: a cheap drafter proposes the next tokens, the target model evaluates
//! the last accepted token and every proposal in one batched forward pass, and the generation
//! keeps each proposal for as long as it is the token the target's own sampling picks.
//!
//! Every emitted token is drawn by the generation's [`Sequence`] from the target's logits at its
//! position, with the history up to it, exactly as plain decoding draws it; a proposal only
//! decides how many of those positions one forward pass computes. The output is therefore the
//! one plain decoding gives (greedy or seeded), as far as a batch row's logits equal a
//! one-token pass's. What is rejected is dropped from the target's cache, and the drafter
//! resynchronises with the accepted history on its next call.
//!
//! This module owns the drafters (a draft model, prompt lookup) and the verifying loop; it
//! knows no CLI or server.

use super::generate::{
    prefill, stop_and_report, GenerateOptions, GenerationObserver, GenerationResult, GenerationStats, StopReason,
};
use super::{EngineError, Model, Sequence, Session};
use crate::sampling::argmax;
use crate::tokenizer::{TokenType, Tokenizer};
use std::sync::Arc;
use std::time::Instant;

/// Proposes the tokens that may follow a context.
pub trait Drafter {
    /// Up to `max` tokens that may follow `context` (the prompt and every accepted token).
    fn draft(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>, EngineError>;
}

/// Prompt lookup (llama.cpp's `ngram-simple`): where the last `size_n` tokens occurred before,
/// propose the `size_m` tokens that followed them then. Free, and right whenever the output
/// repeats its input: code edits, summaries, quotations.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Tokens of the context's end that must match.
    pub size_n: usize,
    /// Most tokens proposed from a match.
    pub size_m: usize,
}

impl Drafter for NgramDrafter {
    fn draft(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        let n = self.size_n.max(1);
        if context.len() <= n {
            return Ok(Vec::new());
        }
        let key = &context[context.len() - n..];
        // The most recent earlier occurrence: the likeliest to continue the same way.
        let found = (0..context.len() - n)
            .rev()
            .find(|&start| &context[start..start + n] == key);
        Ok(match found {
            Some(start) => {
                let from = start + n;
                context[from..(from + self.size_m.min(max)).min(context.len())].to_vec()
            }
            None => Vec::new(),
        })
    }
}

/// A smaller model of the same vocabulary as the drafter: it proposes its own greedy
/// continuation, stopping early where its best token's probability falls below `p_min`.
pub struct ModelDrafter {
    session: Session,
    p_min: f32,
    /// The target's vocabulary size: a draft with more rows (padding) must not propose ids
    /// the target cannot evaluate.
    n_vocab_target: usize,
}

impl ModelDrafter {
    /// A drafter over `draft`, with `n_ctx` tokens of context (the target's), after checking
    /// that it shares `target`'s vocabulary.
    pub fn new(draft: &Model, target: &Tokenizer, n_ctx: usize, p_min: f32) -> Result<Self, EngineError> {
        check_compatible(target, draft.tokenizer()).map_err(EngineError::IncompatibleDraft)?;
        Ok(ModelDrafter {
            session: Session::new(draft, n_ctx),
            p_min,
            n_vocab_target: target.n_vocab(),
        })
    }
}

impl Drafter for ModelDrafter {
    fn draft(&mut self, context: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        if max == 0 || context.is_empty() || context.len() + max > self.session.n_ctx() {
            return Ok(Vec::new());
        }
        // Keep the cached prefix the context still has (all of it, when a window cache no
        // longer holds its window); the last token is evaluated again for the logits of the
        // first proposal.
        let keep = self.session.reuse_prefix(0, context)?;
        let missing = &context[keep..];
        // After a check the draft lacks a token or two: one at a time, they reuse the
        // one-token graph that drafting runs on, where a small batch would rebuild it twice.
        let chunk = if missing.len() <= 4 { 1 } else { self.session.n_ubatch() };
        for tokens in missing.chunks(chunk) {
            self.session.eval(tokens, 1)?;
        }
        let mut drafts = Vec::with_capacity(max);
        loop {
            let logits = self.session.last_logits()?;
            let (best, p) = best_with_probability(logits, self.p_min > 0.0)?;
            if p < self.p_min || best as usize >= self.n_vocab_target {
                break;
            }
            drafts.push(best);
            if drafts.len() == max {
                break;
            }
            self.session.eval(&[best], 1)?;
        }
        Ok(drafts)
    }
}

/// The argmax of a logits row (the sampler's, ties to the lowest id) and, when asked, its
/// softmax probability (1 otherwise).
fn best_with_probability(logits: &[f32], with_probability: bool) -> Result<(u32, f32), EngineError> {
    let best = argmax(logits)?;
    if !with_probability {
        return Ok((best, 1.0));
    }
    let max = f64::from(logits[best as usize]);
    let total: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    Ok((best, (1.0 / total) as f32))
}

/// Whether a draft model's tokenizer can propose tokens for the target's: the same text and
/// kind for every id both have, and the same BOS and EOS. The error names the first difference.
pub fn check_compatible(target: &Tokenizer, draft: &Tokenizer) -> Result<(), String> {
    if target.bos() != draft.bos() || target.eos() != draft.eos() {
        return Err(format!(
            "the draft's BOS/EOS tokens are {:?}/{:?} where the target's are {:?}/{:?}",
            draft.bos(),
            draft.eos(),
            target.bos(),
            target.eos()
        ));
    }
    let shared = target.n_vocab().min(draft.n_vocab());
    for id in 0..shared as u32 {
        let (t, d) = (target.token_text(id), draft.token_text(id));
        let control = |tk: &Tokenizer| tk.token_type(id) == Some(TokenType::Control);
        if t != d || control(target) != control(draft) {
            return Err(format!(
                "token {id} is {:?} in the draft model and {:?} in the target",
                d.unwrap_or(""),
                t.unwrap_or("")
            ));
        }
    }
    Ok(())
}

/// Where proposals come from, loaded once and shared: every generation (every server slot)
/// gets its own [`Drafter`] from it, with a draft state of its own.
#[derive(Clone)]
pub enum DraftSource {
    /// Prompt lookup (`--spec-type ngram-simple`).
    Lookup(NgramDrafter),
    /// A draft model (`--model-draft`), its weights shared by every drafter.
    Model {
        /// The loaded draft model.
        model: Arc<Model>,
        /// Proposals stop where the draft's best token is less likely than this.
        p_min: f32,
    },
}

impl std::fmt::Debug for DraftSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DraftSource::Lookup(lookup) => f.debug_tuple("Lookup").field(lookup).finish(),
            DraftSource::Model { model, p_min } => f
                .debug_struct("Model")
                .field("path", &model.path())
                .field("p_min", p_min)
                .finish(),
        }
    }
}

impl DraftSource {
    /// A drafter for one generation of `target`'s vocabulary with `n_ctx` positions.
    pub fn drafter(&self, target: &Tokenizer, n_ctx: usize) -> Result<Box<dyn Drafter + Send>, EngineError> {
        Ok(match self {
            DraftSource::Lookup(lookup) => Box::new(lookup.clone()),
            DraftSource::Model { model, p_min } => Box::new(ModelDrafter::new(model, target, n_ctx, *p_min)?),
        })
    }
}

/// How many tokens to draft.
#[derive(Clone, Copy, Debug)]
pub struct DraftOptions {
    /// Most tokens proposed per step (llama.cpp's `--draft-max`).
    pub max: usize,
    /// Fewer proposals than this are not checked (`--draft-min`): the step decodes one token.
    pub min: usize,
}

/// [`generate`](super::generate) with a drafter: the same tokens, in fewer forward passes when
/// the proposals are good. The stats count the proposals and how many were kept. Context shift
/// is not supported here; a full context ends the generation.
pub fn generate_speculative(
    session: &mut Session,
    drafter: &mut dyn Drafter,
    draft: DraftOptions,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    observer: &mut impl GenerationObserver,
) -> Result<GenerationResult, EngineError> {
    let mut sequence = Sequence::new(tokenizer, prompt, options)?;
    let n_cached = session.reuse_prefix(0, prompt)?.min(prompt.len().saturating_sub(1));
    session.truncate(n_cached);
    let mut stats = GenerationStats {
        n_prompt: prompt.len() - n_cached,
        n_cached,
        ..Default::default()
    };
    prefill(session, &mut sequence, &prompt[n_cached..], observer, &mut stats)?;
    let gen_start = Instant::now();
    // The rows to sample from: after the prompt, its last row; after a check, one per kept
    // proposal and one more.
    let mut rows = 1;
    let mut proposals: Vec<u32> = Vec::new();
    'generation: while sequence.finished().is_none() {
        let logits = session.last_logits()?;
        let n_vocab = logits.len() / rows;
        let mut token = 0;
        for row in 0..rows {
            if observer.interrupted() {
                stop_and_report(&mut sequence, observer, StopReason::Interrupted)?;
                break 'generation;
            }
            let logits = &session.last_logits()?[row * n_vocab..][..n_vocab];
            token = sequence.sample(logits)?;
            observer.on_token(token, logits).map_err(EngineError::Output)?;
            let step = sequence.accept(token);
            let text = sequence.text(step.text);
            if !text.is_empty() {
                observer.on_text(text).map_err(EngineError::Output)?;
            }
            if step.finished.is_some() {
                break 'generation;
            }
            if row < proposals.len() {
                if proposals[row] != token {
                    // The target disagrees: its token stands, the rest of the check is void.
                    session.truncate(session.n_past() - (proposals.len() - row));
                    break;
                }
                stats.n_accepted += 1;
            }
        }
        // `token` is the target's own, not yet evaluated: check it with the next proposals.
        if session.n_past() >= session.n_ctx() {
            stop_and_report(&mut sequence, observer, StopReason::ContextFull)?;
            break;
        }
        let room = session.n_ctx() - session.n_past() - 1;
        // The check's last row gives a token too: one proposal fewer than the tokens left.
        let wanted = draft
            .max
            .min(room)
            .min(options.max_tokens.saturating_sub(sequence.generated().len() + 1));
        proposals = if wanted > 0 {
            drafter.draft(sequence.history(), wanted)?
        } else {
            Vec::new()
        };
        if proposals.len() < draft.min.max(1) {
            proposals.clear();
        }
        stats.n_drafted += proposals.len();
        let mut batch = Vec::with_capacity(1 + proposals.len());
        batch.push(token);
        batch.extend_from_slice(&proposals);
        rows = batch.len();
        session.eval(&batch, rows)?;
    }
    stats.n_generated = sequence.generated().len();
    stats.gen_time = gen_start.elapsed();
    Ok(sequence.into_result(stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_proposes_what_followed_the_latest_earlier_match() {
        let mut drafter = NgramDrafter { size_n: 2, size_m: 3 };
        let context = [1, 2, 3, 4, 5, 9, 1, 2, 7, 8, 1, 2];
        // [1, 2] last occurred before at 6, followed by 7, 8, 1.
        assert_eq!(drafter.draft(&context, 16).unwrap(), [7, 8, 1]);
        assert_eq!(drafter.draft(&context, 2).unwrap(), [7, 8]);
        assert!(drafter.draft(&[5, 6, 7], 16).unwrap().is_empty());
        // A match at the very end proposes only what is there.
        assert_eq!(drafter.draft(&[3, 3, 3], 16).unwrap(), [3]);
    }

    /// The standard rule (propose x drawn from q; keep it with probability min(1, p(x)/q(x)),
    /// else draw from the normalised residual max(0, p - q)) gives exactly p. With a greedy
    /// draft, q is one-hot on the proposal x, and the rule is this loop's check: the target
    /// draws y from p and x is kept when y = x (probability p(x)); when it is not, y was drawn
    /// from p without x, which is the residual.
    #[test]
    fn the_acceptance_rule_gives_the_targets_distribution_and_a_greedy_draft_makes_it_a_draw() {
        let p = [0.5, 0.2, 0.2, 0.1, 0.0];
        let rule = |q: &[f64]| -> Vec<f64> {
            let excess: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
            let total: f64 = excess.iter().sum();
            let residual: Vec<f64> = excess.iter().map(|e| e / total).collect();
            let mut out = vec![0.0; p.len()];
            for x in 0..p.len() {
                if q[x] == 0.0 {
                    continue;
                }
                let keep = (p[x] / q[x]).min(1.0);
                out[x] += q[x] * keep;
                for (y, r) in residual.iter().enumerate() {
                    out[y] += q[x] * (1.0 - keep) * r;
                }
            }
            out
        };
        let close = |a: &[f64], b: &[f64]| a.iter().zip(b).all(|(a, b)| (a - b).abs() < 1e-12);
        assert!(close(&rule(&[0.1, 0.6, 0.1, 0.0, 0.2]), &p));
        for x in 0..4 {
            let mut q = [0.0; 5];
            q[x] = 1.0;
            assert!(close(&rule(&q), &p));
            // The draw-and-compare check: kept with probability p(x); otherwise p without x.
            let excess: Vec<f64> = p.iter().zip(q).map(|(p, q)| (p - q).max(0.0)).collect();
            let total: f64 = excess.iter().sum();
            let without_x: Vec<f64> = (0..5).map(|y| if y == x { 0.0 } else { p[y] / (1.0 - p[x]) }).collect();
            assert!(close(&excess.iter().map(|e| e / total).collect::<Vec<_>>(), &without_x));
        }
    }

    #[test]
    fn the_best_token_and_its_probability_come_from_a_softmax() {
        let (best, p) = best_with_probability(&[0.0, 2.0f32.ln(), f32::NEG_INFINITY, 0.0], true).unwrap();
        assert_eq!(best, 1);
        assert!((p - 0.5).abs() < 1e-6);
        assert_eq!(best_with_probability(&[1.0, 1.0], false).unwrap(), (0, 1.0));
    }
}
