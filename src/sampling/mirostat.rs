//! Mirostat v1 and v2 (Basu et al.), as llama.cpp implements them: truncate the distribution so
//! that the surprise of the drawn token tracks a target `tau`, adjusting the bound `mu` after
//! every token by the learning rate `eta`.
//!
//! This module owns the truncations and the `mu` update. It must not draw or keep `mu` itself:
//! the sampler holds `mu` for the length of a generation (a fresh or reset sampler starts at
//! `2 · tau`), draws with its own generator, and reports the drawn token's probability back
//! through [`update_mu`].

use super::filters::{apply_top_k, better, weigh};
use super::{Candidate, SamplingError};

/// How many of the best tokens v1 reads to estimate the Zipf exponent (llama.cpp's `m`).
const M: usize = 100;

/// Mirostat v1's truncation: estimates the Zipf exponent `s` from the best `m` probabilities,
/// derives the `k` whose expected surprise is `mu`, and keeps the best `k`, sorted. The list
/// is left sorted best first and weighed at temperature 1. Only tokens with a probability take
/// part in the estimate: llama.cpp would divide by a zero probability there.
pub(super) fn truncate_v1(candidates: &mut Vec<Candidate>, mu: f64, n_vocab: usize) -> Result<f64, SamplingError> {
    let total = weigh(candidates, 1.0)?;
    let n = candidates.len();
    let m = M.min(n);
    candidates.select_nth_unstable_by(m - 1, better);
    candidates[..m].sort_unstable_by(better);
    let viable = candidates[..m].iter().take_while(|c| c.weight > 0.0).count();
    let (mut sum_ti_bi, mut sum_ti_sq) = (0.0f64, 0.0f64);
    for i in 0..(M - 1).min(viable.saturating_sub(1)) {
        let t_i = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b_i = (candidates[i].weight / total / (candidates[i + 1].weight / total)).ln();
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
    }
    let k = if sum_ti_sq > 0.0 {
        let s_hat = sum_ti_bi / sum_ti_sq;
        let epsilon_hat = s_hat - 1.0;
        ((epsilon_hat * 2f64.powf(mu)) / (1.0 - (n_vocab as f64).powf(-epsilon_hat))).powf(1.0 / s_hat)
    } else {
        // One viable token: the estimate has no data and the best token is the answer.
        1.0
    };
    // llama.cpp truncates k to an integer, at least 1; a k beyond the list (or an undefined
    // one, +inf) keeps everything, and NaN keeps the best token.
    if k.is_finite() && (k as usize) < n {
        apply_top_k(candidates, (k as usize).max(1) as i32);
    } else if k.is_nan() {
        apply_top_k(candidates, 1);
    } else {
        // The tail past `m` is in no defined order after the selection.
        candidates.sort_unstable_by(better);
    }
    weigh(candidates, 1.0)
}

/// Mirostat v2's truncation: keeps the tokens whose surprise `-log2 p` is at most `mu`, at
/// least the best one, sorted best first and weighed at temperature 1.
pub(super) fn truncate_v2(candidates: &mut Vec<Candidate>, mu: f64) -> Result<f64, SamplingError> {
    let total = weigh(candidates, 1.0)?;
    let best = *candidates
        .iter()
        .min_by(|a, b| better(a, b))
        .expect("weigh refuses an empty list");
    candidates.retain(|c| -(c.weight / total).log2() <= mu);
    if candidates.is_empty() {
        candidates.push(best);
    }
    candidates.sort_unstable_by(better);
    weigh(candidates, 1.0)
}

/// The next `mu` after drawing a token of probability `p`: `mu - eta · (-log2 p - tau)`.
pub(super) fn update_mu(mu: f64, tau: f32, eta: f32, p: f64) -> f64 {
    let surprise = -p.log2();
    mu - f64::from(eta) * (surprise - f64::from(tau))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(logits: &[f32]) -> Vec<Candidate> {
        Candidate::from_logits(logits).collect()
    }

    #[test]
    fn v2_keeps_the_best_token_even_when_every_surprise_exceeds_mu() {
        let mut list = candidates(&[0.0, 0.0, 0.0]);
        let total = truncate_v2(&mut list, 0.5).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].id, 0);
        assert_eq!(total, 1.0);
    }

    #[test]
    fn v1_with_one_viable_token_keeps_it() {
        let mut list = candidates(&[f32::NEG_INFINITY, 2.0, f32::NEG_INFINITY]);
        truncate_v1(&mut list, 10.0, 3).unwrap();
        assert_eq!(list.iter().map(|c| c.id).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn a_surprise_on_target_leaves_mu_unchanged() {
        assert_eq!(update_mu(10.0, 3.0, 0.1, 0.125), 10.0);
        assert!((update_mu(10.0, 5.0, 0.1, 0.5) - 10.4).abs() < 1e-6);
    }
}
