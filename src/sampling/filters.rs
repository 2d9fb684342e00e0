//! The per-stage functions of the chain that need no state across tokens: logit bias,
//! repetition penalties, top-k, top-p, min-p, locally typical, top-n-sigma, XTC, temperature,
//! and the final weighing, greedy pick and draw.
//!
//! Each function takes the candidate list as the chain left it and changes it in place with
//! llama.cpp's semantics. None of them orders the chain, reads the tokenizer or keeps state:
//! the chain in `mod.rs` decides which run and in what order, and passes in the one generator
//! output XTC needs. Every ordering goes through [`better`], a total order, and every sum runs
//! in list order, so the result is the same whatever sort algorithm the standard library uses.

use super::rng::Xoshiro256StarStar;
use super::{Candidate, SamplingError, SamplingParams};
use std::cmp::Ordering;

/// Best first: higher logit, then lower id. The order is total (ids are unique), so sorting and
/// selecting give one answer whatever the algorithm. -0.0 and 0.0 compare equal, so they tie on
/// the id; NaN cannot reach here, but the fallback keeps the order total even so.
pub(super) fn better(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or_else(|| b.logit.total_cmp(&a.logit))
        .then(a.id.cmp(&b.id))
}

/// Where token `id` sits in the list. While no stage has reordered or shortened the list, a
/// token's index is its id, so the common case costs one probe; otherwise a scan, as llama.cpp's
/// logit bias falls back to searching.
pub(super) fn position_of(candidates: &[Candidate], id: u32) -> Option<usize> {
    match candidates.get(id as usize) {
        Some(c) if c.id == id => Some(id as usize),
        _ => candidates.iter().position(|c| c.id == id),
    }
}

/// llama.cpp's logit bias: each entry is added to its token's logit (entries for one token add
/// up), -inf banning it. Runs first, on the full row, so every id is at its own index.
pub(super) fn apply_logit_bias(candidates: &mut [Candidate], bias: &[(u32, f32)]) -> Result<(), SamplingError> {
    for &(token, b) in bias {
        let Some(c) = candidates.get_mut(token as usize) else {
            return Err(SamplingError::LogitBiasOutOfRange {
                token,
                n_vocab: candidates.len(),
            });
        };
        c.logit += b;
    }
    Ok(())
}

/// llama.cpp's `llama_sampler_penalties_apply`, same f32 arithmetic. `scratch` is reused to count
/// the window without a map. The list may be in any order (a user's chain can put the penalties
/// after a truncation).
pub(super) fn apply_penalties(
    candidates: &mut [Candidate],
    window: &[u32],
    scratch: &mut Vec<u32>,
    params: &SamplingParams,
) {
    if window.is_empty() || params.penalties_are_neutral() {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(window);
    scratch.sort_unstable();
    for run in scratch.chunk_by(|a, b| a == b) {
        let Some(at) = position_of(candidates, run[0]) else {
            continue;
        };
        let candidate = &mut candidates[at];
        let count = run.len() as f32;
        let mut logit = candidate.logit;
        // Dividing a negative logit would make the token more likely, hence the multiplication.
        if logit <= 0.0 {
            logit *= params.repeat_penalty;
        } else {
            logit /= params.repeat_penalty;
        }
        logit -= count * params.frequency_penalty + params.presence_penalty;
        // Only an overflowing division meeting an overflowing subtraction (absurd parameters)
        // gets here; a NaN would poison every comparison after it, so the token is dropped.
        if logit.is_nan() {
            logit = f32::NEG_INFINITY;
        }
        candidate.logit = logit;
    }
}

/// The best candidate under [`better`] (ties to the lowest id), whatever order the list is in.
pub(super) fn greedy(candidates: &[Candidate]) -> Result<u32, SamplingError> {
    let mut best = candidates.first().ok_or(SamplingError::EmptyLogits)?;
    for c in candidates {
        if better(c, best) == Ordering::Less {
            best = c;
        }
    }
    if best.logit == f32::NEG_INFINITY {
        return Err(SamplingError::NoViableToken);
    }
    Ok(best.id)
}

/// Up to this `k`, top-k is one pass that keeps the best `k` seen so far: nearly every
/// candidate of a vocabulary is turned away by one comparison with the k-th best, where a
/// selection moves the whole list (`cargo bench --bench sampling`: the default chain's token
/// went from 1.57 ms to 0.18 ms on 151,936 logits).
const SCAN_TOP_K: usize = 256;

/// Keeps the `k` best candidates, sorted best first, and says whether the list is now sorted.
/// A small `k` is a scan; a large one a selection, then a sort of the `k` kept. Either keeps
/// the same candidates in the same order, since [`better`] is a total order.
pub(super) fn apply_top_k(candidates: &mut Vec<Candidate>, k: i32) -> bool {
    let n = candidates.len();
    let k = match usize::try_from(k) {
        Ok(k) if k > 0 && k < n => k,
        _ => return false,
    };
    if k <= SCAN_TOP_K {
        // The best `m` seen so far live sorted at the front of the list itself, so the scan
        // allocates nothing: the slots it overwrites were all read already.
        let mut m = 0;
        for i in 0..n {
            let c = candidates[i];
            if m == k && better(&c, &candidates[k - 1]) != Ordering::Less {
                continue;
            }
            let at = candidates[..m].partition_point(|b| better(b, &c) == Ordering::Less);
            let end = if m == k { k - 1 } else { m };
            candidates.copy_within(at..end, at + 1);
            candidates[at] = c;
            m = (m + 1).min(k);
        }
        candidates.truncate(k);
        return true;
    }
    candidates.select_nth_unstable_by(k - 1, better);
    candidates.truncate(k);
    candidates.sort_unstable_by(better);
    true
}

/// llama.cpp's min-p: keeps the candidates whose logit is at least the best one's plus
/// `ln(min_p)` (probability at least `min_p` times the best's), in their order; the best one
/// always stays. 0 keeps them all.
pub(super) fn apply_min_p(candidates: &mut Vec<Candidate>, min_p: f32) {
    if min_p <= 0.0 || candidates.len() <= 1 {
        return;
    }
    let max = candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    let min_logit = max + min_p.ln();
    candidates.retain(|c| c.logit >= min_logit);
}

/// Keeps the smallest best-first prefix whose probability reaches `top_p`, at least one
/// candidate (llama.cpp's `min_keep` of 1). An unsorted list is ordered in growing chunks, so a
/// peaked distribution costs a few selections over the vocabulary rather than a full sort.
pub(super) fn apply_top_p(candidates: &mut Vec<Candidate>, top_p: f32, sorted: bool) -> Result<(), SamplingError> {
    if top_p >= 1.0 {
        return Ok(());
    }
    // Summed before any reordering: in id order or in sorted order, both fixed by the inputs.
    let total = weigh(candidates, 1.0)?;
    let n = candidates.len();
    let mut cumulative = 0.0f64;
    let mut done = 0;
    let mut chunk = if sorted { n } else { 256 };
    while done < n {
        let end = n.min(done.saturating_add(chunk));
        if !sorted {
            if end < n {
                candidates[done..].select_nth_unstable_by(end - done - 1, better);
            }
            candidates[done..end].sort_unstable_by(better);
        }
        for i in done..end {
            cumulative += candidates[i].weight / total;
            // llama.cpp compares in f32, so a cutoff such as 0.8 falls where a user writing the
            // decimal expects it rather than on an f64 rounding of it.
            if cumulative as f32 >= top_p {
                candidates.truncate(i + 1);
                return Ok(());
            }
        }
        done = end;
        chunk = chunk.saturating_mul(2);
    }
    Ok(())
}

/// llama.cpp's locally typical sampling (`typ_p`): ranks the candidates by how far their
/// surprise `-ln p` lies from the distribution's entropy and keeps the closest ones until their
/// probability exceeds `typical_p`, at least one. The list is left in that ranking, as llama.cpp
/// leaves it. A zero probability counts as `0 · ln 0 = 0` in the entropy and ranks last; llama.cpp
/// would compute NaN there (a masked token), which orders nothing.
pub(super) fn apply_typical(candidates: &mut Vec<Candidate>, typical_p: f32) -> Result<(), SamplingError> {
    if typical_p >= 1.0 || candidates.len() <= 1 {
        return Ok(());
    }
    let total = weigh(candidates, 1.0)?;
    let probability = |c: &Candidate| c.weight / total;
    let entropy: f64 = candidates
        .iter()
        .map(probability)
        .filter(|&p| p > 0.0)
        .map(|p| -p * p.ln())
        .sum();
    let mut ranked: Vec<(f64, f64, Candidate)> = candidates
        .iter()
        .map(|c| {
            let p = probability(c);
            let distance = if p > 0.0 {
                (-p.ln() - entropy).abs()
            } else {
                f64::INFINITY
            };
            (distance, p, *c)
        })
        .collect();
    // Equal distances (equal logits, or two logits mirrored around the entropy) fall back to
    // the candidates' own order, so the ranking is total.
    ranked.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then_with(|| better(&a.2, &b.2)));
    let mut cumulative = 0.0f64;
    let mut keep = ranked.len();
    for (i, (_, p, _)) in ranked.iter().enumerate() {
        cumulative += p;
        // Strictly above, in f32, as llama.cpp compares.
        if cumulative as f32 > typical_p {
            keep = i + 1;
            break;
        }
    }
    candidates.clear();
    candidates.extend(ranked[..keep].iter().map(|r| r.2));
    Ok(())
}

/// llama.cpp's top-n-sigma: keeps the candidates whose logit is within `n` standard deviations
/// of the best one, the deviation taken over the finite logits. `n <= 0` is off, as llama.cpp
/// treats it (0 does not mean "the best token only"). llama.cpp masks the rest to -inf; they are
/// removed here instead, which leaves the same distribution.
pub(super) fn apply_top_n_sigma(candidates: &mut Vec<Candidate>, n: f32) {
    if n <= 0.0 || candidates.len() <= 1 {
        return;
    }
    let finite = || candidates.iter().map(|c| c.logit).filter(|&l| l != f32::NEG_INFINITY);
    let count = finite().count();
    if count == 0 {
        return;
    }
    let max = finite().fold(f32::NEG_INFINITY, f32::max);
    let mean = finite().map(f64::from).sum::<f64>() / count as f64;
    let variance = finite().map(|l| (f64::from(l) - mean).powi(2)).sum::<f64>() / count as f64;
    let cutoff = f64::from(max) - f64::from(n) * variance.sqrt();
    candidates.retain(|c| f64::from(c.logit) >= cutoff);
}

/// llama.cpp's XTC ("exclude top choices"): with chance `probability`, removes every candidate
/// whose probability reaches `threshold` except the least likely of them. The roll takes one
/// output of the sampler's generator, and only when XTC could act (it is on and two or more
/// candidates remain), as llama.cpp rolls. Leaves the list sorted when it rolls.
pub(super) fn apply_xtc(
    candidates: &mut Vec<Candidate>,
    probability: f32,
    threshold: f32,
    sorted: &mut bool,
    rng: &mut Xoshiro256StarStar,
) -> Result<(), SamplingError> {
    if probability <= 0.0 || threshold > 0.5 || candidates.len() < 2 {
        return Ok(());
    }
    if rng.next_f64() > f64::from(probability) {
        return Ok(());
    }
    if !*sorted {
        candidates.sort_unstable_by(better);
        *sorted = true;
    }
    let total = weigh(candidates, 1.0)?;
    let above = candidates
        .iter()
        .take_while(|c| (c.weight / total) as f32 >= threshold)
        .count();
    if above > 1 {
        candidates.drain(..above - 1);
    }
    Ok(())
}

/// llama.cpp's temperature as a chain stage, the f32 `logit / temperature`, for a temperature
/// that is not the chain's last stage (the last one is folded into [`weigh`]).
pub(super) fn divide_logits(candidates: &mut [Candidate], temperature: f32) {
    for c in candidates {
        c.logit /= temperature;
    }
}

/// Sets every weight to exp((logit - max) / temperature), which is softmax(logit / temperature)
/// up to the returned normaliser without overflowing at tiny temperatures.
pub(super) fn weigh(candidates: &mut [Candidate], temperature: f32) -> Result<f64, SamplingError> {
    let max = candidates.iter().map(|c| c.logit).fold(f32::NEG_INFINITY, f32::max);
    if max == f32::NEG_INFINITY {
        return Err(SamplingError::NoViableToken);
    }
    let max_f64 = f64::from(max);
    let temperature = f64::from(temperature);
    let mut total = 0.0;
    for c in candidates.iter_mut() {
        c.weight = if max == f32::INFINITY {
            // Only penalty overflow makes +inf; the limit of the softmax shares the mass among
            // the infinite logits.
            if c.logit == max {
                1.0
            } else {
                0.0
            }
        } else {
            ((f64::from(c.logit) - max_f64) / temperature).exp()
        };
        total += c.weight;
    }
    Ok(total)
}

/// Inverse-CDF draw over the weights in list order; `unit` lies in [0, 1). Returns the index
/// in the list.
pub(super) fn draw(candidates: &[Candidate], total: f64, unit: f64) -> usize {
    let target = unit * total;
    let mut cumulative = 0.0;
    for (i, c) in candidates.iter().enumerate() {
        cumulative += c.weight;
        if cumulative > target {
            return i;
        }
    }
    // unit * total can round up to total; the last token with any mass is the one meant.
    candidates.iter().rposition(|c| c.weight > 0.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(logits: &[f32]) -> Vec<Candidate> {
        Candidate::from_logits(logits).collect()
    }

    fn ids(candidates: &[Candidate]) -> Vec<u32> {
        candidates.iter().map(|c| c.id).collect()
    }

    /// Deterministic pseudo-random logits in about [-8, 8), with repeats so ties occur.
    fn noisy_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Xoshiro256StarStar::from_seed(seed);
        (0..n).map(|_| ((rng.next_u64() >> 54) as f32 - 512.0) / 64.0).collect()
    }

    #[test]
    fn top_k_selection_matches_a_full_sort() {
        let logits = noisy_logits(5000, 1);
        let mut reference = candidates(&logits);
        reference.sort_by(better);
        for k in [1, 2, 40, 128, 256, 257, 4999] {
            let mut list = candidates(&logits);
            assert!(apply_top_k(&mut list, k));
            assert_eq!(ids(&list), ids(&reference[..k as usize]), "k = {k}");
        }
        // Many ties, -inf, and a list out of id order (a chain that sorted before top-k): the
        // scan and the selection keep the same candidates in the same order.
        let tied: Vec<f32> = (0..3000)
            .map(|i| if i % 11 == 0 { f32::NEG_INFINITY } else { (i % 7) as f32 })
            .collect();
        let mut reference = candidates(&tied);
        reference.sort_by(better);
        for k in [1, 5, 40, 256, 300] {
            let mut list = candidates(&tied);
            list.reverse();
            assert!(apply_top_k(&mut list, k));
            assert_eq!(ids(&list), ids(&reference[..k as usize]), "k = {k}");
        }
    }

    #[test]
    fn top_k_disabled_or_too_large_leaves_the_list_in_id_order() {
        let logits = noisy_logits(50, 2);
        for k in [0, -1, 50, 51, i32::MAX] {
            let mut list = candidates(&logits);
            assert!(!apply_top_k(&mut list, k));
            assert_eq!(ids(&list), (0..50).collect::<Vec<_>>());
        }
    }

    #[test]
    fn chunked_top_p_matches_the_prefix_of_a_full_sort() {
        for (n, seed) in [(300, 3), (5000, 4), (152_064, 5)] {
            let logits = noisy_logits(n, seed);
            let mut reference = candidates(&logits);
            reference.sort_by(better);
            let max = f64::from(reference[0].logit);
            let weights: Vec<f64> = reference.iter().map(|c| (f64::from(c.logit) - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for top_p in [0.05f32, 0.5, 0.9, 0.999] {
                let mut cumulative = 0.0;
                let expected = weights
                    .iter()
                    .position(|w| {
                        cumulative += w / total;
                        cumulative as f32 >= top_p
                    })
                    .map_or(n, |i| i + 1);
                let mut list = candidates(&logits);
                apply_top_p(&mut list, top_p, false).unwrap();
                assert_eq!(list.len(), expected, "n = {n}, top_p = {top_p}");
                assert_eq!(ids(&list), ids(&reference[..expected]), "n = {n}, top_p = {top_p}");
            }
        }
    }

    #[test]
    fn top_p_below_every_single_probability_keeps_one_candidate() {
        let mut list = candidates(&[1.0, 1.0, 1.0, 1.0]);
        apply_top_p(&mut list, 1e-6, false).unwrap();
        assert_eq!(ids(&list), [0]);
    }

    #[test]
    fn min_p_keeps_the_tokens_within_its_factor_of_the_best_probability() {
        // Probabilities proportional to e^logit: 1, e^-1 = 0.37, e^-3 = 0.05, e^-5 = 0.007.
        let mut list = candidates(&[0.0, -1.0, -3.0, -5.0]);
        apply_min_p(&mut list, 0.1);
        assert_eq!(ids(&list), [0, 1]);
        let mut list = candidates(&[0.0, -1.0, -3.0, -5.0]);
        apply_min_p(&mut list, 0.04);
        assert_eq!(ids(&list), [0, 1, 2]);
        let mut list = candidates(&[0.0, -1.0, -3.0, -5.0]);
        apply_min_p(&mut list, 0.0);
        assert_eq!(list.len(), 4);
        let mut list = candidates(&[2.0, 9.0]);
        apply_min_p(&mut list, 1.0);
        assert_eq!(ids(&list), [1]);
    }

    #[test]
    fn penalties_count_each_distinct_token_of_the_window() {
        let params = SamplingParams {
            repeat_penalty: 2.0,
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplingParams::default()
        };
        let mut list = candidates(&[3.0, -1.0, 0.0, 5.0]);
        let mut scratch = Vec::new();
        apply_penalties(&mut list, &[1, 0, 1, 2, 1], &mut scratch, &params);
        let logits: Vec<f32> = list.iter().map(|c| c.logit).collect();
        // Token 0 (once, positive) is divided, token 1 (three times, negative) multiplied, token 2
        // (once, zero) multiplied, token 3 untouched.
        assert_eq!(
            logits,
            [3.0 / 2.0 - 0.5 - 0.25, -2.0 - 1.5 - 0.25, 0.0 - 0.5 - 0.25, 5.0]
        );
    }

    #[test]
    fn penalties_find_their_tokens_in_a_reordered_list() {
        let params = SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::default()
        };
        let mut list = candidates(&[3.0, -1.0, 0.0, 5.0]);
        list.sort_by(better);
        list.truncate(3);
        apply_penalties(&mut list, &[0, 1, 3], &mut Vec::new(), &params);
        let got: Vec<(u32, f32)> = list.iter().map(|c| (c.id, c.logit)).collect();
        assert_eq!(got, [(3, 2.5), (0, 1.5), (2, 0.0)]);
    }

    #[test]
    fn penalties_never_produce_nan() {
        let params = SamplingParams {
            repeat_penalty: 1e-30,
            frequency_penalty: 1e38,
            ..SamplingParams::default()
        };
        let mut list = candidates(&[1e10, 1.0]);
        apply_penalties(&mut list, &[0, 0, 0, 0], &mut Vec::new(), &params);
        assert_eq!(list[0].logit, f32::NEG_INFINITY);
        assert_eq!(
            super::super::Sampler::new(params)
                .unwrap()
                .sample(&[1e10, 1.0], &[0, 0, 0, 0]),
            Ok(1)
        );
    }

    #[test]
    fn weights_of_infinite_logits_share_the_mass() {
        let mut list = candidates(&[f32::INFINITY, 3.0, f32::INFINITY]);
        assert_eq!(weigh(&mut list, 0.5), Ok(2.0));
        assert_eq!(list.iter().map(|c| c.weight).collect::<Vec<_>>(), [1.0, 0.0, 1.0]);
    }

    #[test]
    fn a_draw_at_the_top_of_the_unit_interval_lands_on_the_last_token_with_mass() {
        let mut list = candidates(&[0.0, 0.0, f32::NEG_INFINITY]);
        let total = weigh(&mut list, 1.0).unwrap();
        assert_eq!(draw(&list, total, 0.0), 0);
        assert_eq!(draw(&list, total, 0.5), 1);
        assert_eq!(draw(&list, total, 1.0), 1);
    }

    #[test]
    fn negative_and_positive_zero_tie_on_the_id() {
        let list = candidates(&[-0.0, 0.0]);
        assert_eq!(better(&list[0], &list[1]), Ordering::Less);
        assert_eq!(greedy(&list), Ok(0));
        assert_eq!(super::super::argmax(&[-0.0, 0.0]), Ok(0));
    }

    #[test]
    fn greedy_picks_the_best_candidate_of_a_list_in_any_order() {
        let mut list = candidates(&[1.0, 4.0, 4.0, -2.0]);
        list.reverse();
        assert_eq!(greedy(&list), Ok(1));
    }

    #[test]
    fn top_n_sigma_at_zero_or_below_keeps_every_candidate() {
        for n in [0.0, -1.0] {
            let mut list = candidates(&[5.0, 0.0, -5.0]);
            apply_top_n_sigma(&mut list, n);
            assert_eq!(ids(&list), [0, 1, 2]);
        }
    }

    #[test]
    fn xtc_at_probability_one_removes_all_but_the_last_token_above_the_threshold() {
        // Probabilities about 0.49, 0.30, 0.18, 0.03.
        let mut list = candidates(&[2.0, 1.5, 1.0, -0.8]);
        let mut sorted = false;
        let mut rng = Xoshiro256StarStar::from_seed(1);
        apply_xtc(&mut list, 1.0, 0.15, &mut sorted, &mut rng).unwrap();
        assert_eq!(ids(&list), [2, 3]);
        assert!(sorted);
    }
}
