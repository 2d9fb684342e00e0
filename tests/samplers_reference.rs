//! Each of llama.cpp's optional samplers against a plain f64 implementation written here from
//! llama.cpp's definition (`src/llama-sampler.cpp`), on fixed logit rows with ties and -inf
//! entries: the same tokens must keep a probability, and each probability must agree within
//! 1e-6.

use minfer::sampling::{DryBreakers, Mirostat, Sampler, SamplerKind, SamplingParams};
use std::collections::BTreeMap;

const NEG_INF: f32 = f32::NEG_INFINITY;

/// The rows every sampler is checked on: distinct values, ties, and masked tokens.
fn rows() -> Vec<Vec<f32>> {
    vec![
        vec![2.0, 1.0, 1.0, 0.5, -1.0, NEG_INF, 3.0, 0.0],
        vec![0.3, 0.3, 0.3, 0.3],
        vec![5.0, NEG_INF, 4.0, 4.0, 1.0, -3.0, NEG_INF, 2.5, 2.5, 0.0],
        vec![1.2, -0.7, 0.4, 2.9, 2.2, -1.5, 0.9, 0.1, 1.7, -0.2, 3.4, 0.6],
    ]
}

/// Every sampler off: temperature `t` alone.
fn plain(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        repeat_penalty: 1.0,
        ..SamplingParams::default()
    }
}

/// The tokens our chain leaves with a probability, and those probabilities.
fn ours(params: &SamplingParams, logits: &[f32], history: &[u32]) -> BTreeMap<u32, f64> {
    distribution(&mut Sampler::new(params.clone()).unwrap(), logits, history)
}

fn distribution(sampler: &mut Sampler, logits: &[f32], history: &[u32]) -> BTreeMap<u32, f64> {
    let list = sampler.build_candidates(logits, history).unwrap();
    let total: f64 = list.iter().map(|c| c.weight).sum();
    list.iter()
        .filter(|c| c.weight > 0.0)
        .map(|c| (c.id, c.weight / total))
        .collect()
}

fn assert_same(ours: &BTreeMap<u32, f64>, reference: &BTreeMap<u32, f64>, what: &str) {
    assert_eq!(
        ours.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "{what}: kept tokens differ\nours {ours:?}\nreference {reference:?}"
    );
    for (id, p) in reference {
        assert!(
            (ours[id] - p).abs() < 1e-6,
            "{what}: token {id}: ours {} reference {p}",
            ours[id]
        );
    }
}

/// A token with its logit, as the reference implementations pass them around.
#[derive(Clone, Copy, Debug)]
struct Tok {
    id: u32,
    logit: f64,
}

fn toks(logits: &[f32]) -> Vec<Tok> {
    logits
        .iter()
        .enumerate()
        .map(|(i, &l)| Tok {
            id: i as u32,
            logit: f64::from(l),
        })
        .collect()
}

/// Softmax over the tokens, -inf giving 0.
fn softmax(tokens: &[Tok]) -> Vec<f64> {
    let max = tokens.iter().map(|t| t.logit).fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = tokens.iter().map(|t| (t.logit - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// The final distribution: softmax of logit / temperature over what is left.
fn finish(tokens: &[Tok], temperature: f64) -> BTreeMap<u32, f64> {
    let scaled: Vec<Tok> = tokens
        .iter()
        .map(|t| Tok {
            id: t.id,
            logit: t.logit / temperature,
        })
        .collect();
    tokens
        .iter()
        .zip(softmax(&scaled))
        .filter(|(_, p)| *p > 0.0)
        .map(|(t, p)| (t.id, p))
        .collect()
}

/// Best first, ties to the lower id: llama.cpp's sort with the tie order made explicit.
fn sort_best_first(tokens: &mut [Tok]) {
    tokens.sort_by(|a, b| b.logit.partial_cmp(&a.logit).unwrap().then(a.id.cmp(&b.id)));
}

// ---- locally typical ----

/// llama.cpp's `llama_sampler_typical_apply`, with 0 · ln 0 = 0.
fn reference_typical(tokens: &[Tok], p: f64) -> Vec<Tok> {
    let mut tokens = tokens.to_vec();
    sort_best_first(&mut tokens);
    let probs = softmax(&tokens);
    let entropy: f64 = probs.iter().filter(|&&q| q > 0.0).map(|q| -q * q.ln()).sum();
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    let score = |i: usize| {
        if probs[i] > 0.0 {
            (-probs[i].ln() - entropy).abs()
        } else {
            f64::INFINITY
        }
    };
    order.sort_by(|&a, &b| score(a).partial_cmp(&score(b)).unwrap().then(a.cmp(&b)));
    let mut cum = 0.0;
    let mut keep = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += probs[idx];
        if cum as f32 > p as f32 {
            keep = i + 1;
            break;
        }
    }
    order[..keep].iter().map(|&i| tokens[i]).collect()
}

#[test]
fn typical_keeps_the_tokens_closest_to_the_entropy_as_llama_cpp_does() {
    for logits in rows() {
        for typical_p in [0.0, 0.2, 0.5, 0.83, 0.95] {
            for temperature in [1.0, 0.5, 1.7] {
                let params = SamplingParams {
                    typical_p,
                    ..plain(temperature)
                };
                let reference = finish(
                    &reference_typical(&toks(&logits), f64::from(typical_p)),
                    f64::from(temperature),
                );
                assert_same(
                    &ours(&params, &logits, &[]),
                    &reference,
                    &format!("typical {typical_p} at temperature {temperature} on {logits:?}"),
                );
            }
        }
    }
}

#[test]
fn typical_at_zero_keeps_exactly_one_token() {
    for logits in rows() {
        let params = SamplingParams {
            typical_p: 0.0,
            ..plain(1.0)
        };
        assert_eq!(ours(&params, &logits, &[]).len(), 1, "{logits:?}");
    }
}

// ---- top-n-sigma ----

/// llama.cpp's `llama_sampler_top_n_sigma_apply`: `n <= 0` does nothing.
fn reference_top_n_sigma(tokens: &[Tok], n: f64) -> Vec<Tok> {
    if n <= 0.0 {
        return tokens.to_vec();
    }
    let finite: Vec<f64> = tokens.iter().map(|t| t.logit).filter(|l| l.is_finite()).collect();
    let max = finite.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mean = finite.iter().sum::<f64>() / finite.len() as f64;
    let std = (finite.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / finite.len() as f64).sqrt();
    tokens.iter().copied().filter(|t| t.logit >= max - n * std).collect()
}

#[test]
fn top_n_sigma_keeps_the_logits_within_n_deviations_of_the_best() {
    for logits in rows() {
        for n in [-1.0, 0.0, 0.3, 1.0, 2.0] {
            for temperature in [1.0, 0.6] {
                let params = SamplingParams {
                    top_n_sigma: n,
                    ..plain(temperature)
                };
                let reference = finish(
                    &reference_top_n_sigma(&toks(&logits), f64::from(n)),
                    f64::from(temperature),
                );
                assert_same(
                    &ours(&params, &logits, &[]),
                    &reference,
                    &format!("top-n-sigma {n} at temperature {temperature} on {logits:?}"),
                );
            }
        }
    }
}

#[test]
fn top_n_sigma_at_zero_is_off_as_in_llama_cpp() {
    let logits = &rows()[0];
    let params = SamplingParams {
        top_n_sigma: 0.0,
        ..plain(1.0)
    };
    assert_same(&ours(&params, logits, &[]), &ours(&plain(1.0), logits, &[]), "n = 0");
    assert_eq!(ours(&params, logits, &[]).len(), 7);
}

// ---- XTC ----

/// llama.cpp's `llama_sample_xtc_apply` once the roll has passed.
fn reference_xtc(tokens: &[Tok], threshold: f64) -> Vec<Tok> {
    let mut tokens = tokens.to_vec();
    if threshold > 0.5 || tokens.len() < 2 {
        return tokens;
    }
    sort_best_first(&mut tokens);
    let probs = softmax(&tokens);
    let above = probs.iter().take_while(|&&p| p as f32 >= threshold as f32).count();
    if above > 1 {
        tokens.drain(..above - 1);
    }
    tokens
}

#[test]
fn xtc_at_probability_one_always_removes_the_top_choices() {
    for logits in rows() {
        for threshold in [0.05, 0.1, 0.2, 0.3, 0.6] {
            for temperature in [1.0, 0.8] {
                let params = SamplingParams {
                    xtc_probability: 1.0,
                    xtc_threshold: threshold,
                    ..plain(temperature)
                };
                let reference = finish(
                    &reference_xtc(&toks(&logits), f64::from(threshold)),
                    f64::from(temperature),
                );
                assert_same(
                    &ours(&params, &logits, &[]),
                    &reference,
                    &format!("XTC threshold {threshold} at temperature {temperature} on {logits:?}"),
                );
            }
        }
    }
}

#[test]
fn xtc_at_probability_zero_changes_nothing() {
    for logits in rows() {
        let params = SamplingParams {
            xtc_probability: 0.0,
            xtc_threshold: 0.05,
            ..plain(1.0)
        };
        assert_same(&ours(&params, &logits, &[]), &finish(&toks(&logits), 1.0), "XTC off");
    }
}

#[test]
fn xtc_keeps_one_token_when_every_token_is_above_the_threshold() {
    let params = SamplingParams {
        xtc_probability: 1.0,
        xtc_threshold: 0.2,
        ..plain(1.0)
    };
    // Four ties at 0.25: the last of them by id stays.
    let kept = ours(&params, &[0.3, 0.3, 0.3, 0.3], &[]);
    assert_eq!(kept.keys().copied().collect::<Vec<_>>(), [3]);
}

#[test]
fn xtc_at_half_probability_acts_on_about_half_the_seeds_and_repeats_for_a_seed() {
    let logits = &rows()[3];
    let removed = finish(&reference_xtc(&toks(logits), 0.1), 1.0);
    let unchanged = finish(&toks(logits), 1.0);
    let mut acted = 0;
    for seed in 0..400 {
        let params = SamplingParams {
            xtc_probability: 0.5,
            xtc_threshold: 0.1,
            seed,
            ..plain(1.0)
        };
        let got = ours(&params, logits, &[]);
        assert_eq!(got, ours(&params, logits, &[]), "seed {seed} must repeat");
        if got.len() == removed.len() {
            assert_same(&got, &removed, "XTC acted");
            acted += 1;
        } else {
            assert_same(&got, &unchanged, "XTC passed");
        }
    }
    assert!((150..250).contains(&acted), "XTC acted on {acted} of 400 seeds");
}

// ---- DRY ----

/// DRY from its definition rather than llama.cpp's Z-algorithm: for each earlier position, the
/// longest run of tokens ending there that equals the end of the window, capped by the nearest
/// sequence breaker; the token that followed a run of at least `allowed` tokens gets
/// `multiplier · base^(run - allowed)`, its longest run counting.
fn reference_dry(
    tokens: &mut [Tok],
    history: &[u32],
    breakers: &[Vec<u32>],
    multiplier: f64,
    base: f64,
    allowed: usize,
    last_n: usize,
) {
    let window = &history[history.len().saturating_sub(last_n)..];
    let n = window.len();
    if n <= allowed {
        return;
    }
    let from_end = |i: usize| window[n - 1 - i];
    let mut limit = n;
    'scan: for i in 0..n {
        let mut longest: Option<usize> = None;
        for b in breakers.iter().filter(|b| b[0] == from_end(i)) {
            let tail = &b[1..];
            if tail.len() <= i && (0..tail.len()).all(|o| tail[o] == from_end(i - o - 1)) {
                longest = Some(longest.map_or(tail.len(), |l: usize| l.max(tail.len())));
            }
        }
        if let Some(l) = longest {
            limit = i - l;
            break 'scan;
        }
    }
    if limit < allowed {
        return;
    }
    let mut longest_run: BTreeMap<u32, usize> = BTreeMap::new();
    for j in 0..n - 1 {
        let mut run = 0;
        while run <= j && window[j - run] == window[n - 1 - run] {
            run += 1;
        }
        let run = run.min(limit);
        if run >= allowed {
            let next = window[j + 1];
            let e = longest_run.entry(next).or_insert(0);
            *e = (*e).max(run);
        }
    }
    for (token, run) in longest_run {
        if breakers.iter().any(|b| b.len() == 1 && b[0] == token) {
            continue;
        }
        if let Some(t) = tokens.iter_mut().find(|t| t.id == token) {
            t.logit -= multiplier * base.powi((run - allowed) as i32);
        }
    }
}

fn dry_params(multiplier: f32, base: f32, allowed: usize, last_n: usize) -> SamplingParams {
    SamplingParams {
        dry_multiplier: multiplier,
        dry_base: base,
        dry_allowed_length: allowed,
        dry_penalty_last_n: last_n,
        ..plain(1.0)
    }
}

fn dry_check(history: &[u32], breakers: &[Vec<u32>], multiplier: f32, base: f32, allowed: usize, last_n: usize) {
    let logits = &rows()[3];
    let mut reference = toks(logits);
    reference_dry(
        &mut reference,
        history,
        breakers,
        f64::from(multiplier),
        f64::from(base),
        allowed,
        last_n,
    );
    let mut sampler = Sampler::new(dry_params(multiplier, base, allowed, last_n))
        .unwrap()
        .with_dry_breakers(DryBreakers::from_token_sequences(breakers));
    assert_same(
        &distribution(&mut sampler, logits, history),
        &finish(&reference, 1.0),
        &format!("DRY {multiplier} {base} {allowed} {last_n} on {history:?} with {breakers:?}"),
    );
}

#[test]
fn dry_penalises_the_token_that_would_extend_a_repeated_ngram() {
    // "1 2 3" is repeated; 4 followed it, so 4 is penalised by 0.8 · 1.75^(3 - 2).
    let history = [5, 1, 2, 3, 4, 6, 1, 2, 3];
    dry_check(&history, &[], 0.8, 1.75, 2, 64);
    let mut reference = toks(&rows()[3]);
    reference_dry(&mut reference, &history, &[], 0.8, 1.75, 2, 64);
    assert!((reference[4].logit - (2.2 - 0.8 * 1.75)).abs() < 1e-6);
}

#[test]
fn dry_stops_a_repeat_at_a_sequence_breaker_in_the_history() {
    // The repeat "1 2 9 3" crosses the breaker 9, one token back: nothing is long enough.
    dry_check(&[1, 2, 9, 3, 4, 7, 1, 2, 9, 3], &[vec![9]], 1.0, 2.0, 2, 64);
    let mut unchanged = toks(&rows()[3]);
    reference_dry(
        &mut unchanged,
        &[1, 2, 9, 3, 4, 7, 1, 2, 9, 3],
        &[vec![9]],
        1.0,
        2.0,
        2,
        64,
    );
    assert!(unchanged.iter().zip(toks(&rows()[3])).all(|(a, b)| a.logit == b.logit));
    // Further back, the breaker caps the repeat at the tokens after it.
    dry_check(
        &[1, 2, 3, 4, 9, 1, 2, 3, 4, 5, 8, 1, 2, 3, 4],
        &[vec![9]],
        1.0,
        2.0,
        2,
        64,
    );
    // A two-token breaker counts only whole.
    dry_check(&[10, 11, 1, 2, 3, 4, 10, 1, 2, 3], &[vec![10, 11]], 1.0, 2.0, 1, 64);
    dry_check(&[10, 11, 1, 2, 3, 4, 10, 11, 1, 2, 3], &[vec![10, 11]], 1.0, 2.0, 1, 64);
}

#[test]
fn dry_never_penalises_a_single_token_breaker() {
    dry_check(&[3, 9, 5, 3], &[vec![9]], 1.0, 1.75, 1, 64);
    dry_check(&[3, 9, 5, 3, 9, 5, 3], &[vec![9]], 1.0, 1.75, 0, 64);
}

#[test]
fn dry_reads_only_its_last_n_tokens() {
    let history = [1, 2, 3, 4, 0, 0, 0, 7, 1, 2, 3];
    dry_check(&history, &[], 1.0, 1.75, 2, 64);
    dry_check(&history, &[], 1.0, 1.75, 2, 6);
    dry_check(&history, &[], 1.0, 1.75, 2, usize::MAX);
    dry_check(&history, &[], 1.0, 1.75, 2, 0);
}

#[test]
fn dry_matches_its_definition_on_random_histories() {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = |m: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % m
    };
    for round in 0..300 {
        let len = 1 + next(80) as usize;
        let alphabet = 2 + next(5);
        let history: Vec<u32> = (0..len).map(|_| next(alphabet) as u32).collect();
        let breakers = match round % 3 {
            0 => vec![],
            1 => vec![vec![1]],
            _ => vec![vec![2, 3], vec![0, 1, 2]],
        };
        let allowed = next(4) as usize;
        let last_n = [usize::MAX, 8, 32][round % 3];
        dry_check(&history, &breakers, 0.5, 1.5, allowed, last_n);
    }
}

// ---- Mirostat ----

/// Zipf-like logits, so that Mirostat v1's estimate lands inside the vocabulary.
fn zipf_logits(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| -1.1 * ((i + 1) as f32).ln() + 0.01 * ((i * 7919 % 13) as f32))
        .collect()
}

/// llama.cpp's Mirostat v1 truncation at `mu`.
fn reference_mirostat_v1(tokens: &[Tok], mu: f64) -> Vec<Tok> {
    let mut tokens = tokens.to_vec();
    sort_best_first(&mut tokens);
    let p = softmax(&tokens);
    let n = tokens.len();
    let (mut num, mut den) = (0.0, 0.0);
    for i in 0..(100 - 1).min(n - 1) {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = (p[i] / p[i + 1]).ln();
        num += t * b;
        den += t * t;
    }
    let s = num / den;
    let eps = s - 1.0;
    let k = ((eps * 2f64.powf(mu)) / (1.0 - (n as f64).powf(-eps))).powf(1.0 / s);
    let k = (k as usize).clamp(1, n);
    tokens.truncate(k);
    tokens
}

/// llama.cpp's Mirostat v2 truncation at `mu`.
fn reference_mirostat_v2(tokens: &[Tok], mu: f64) -> Vec<Tok> {
    let mut tokens = tokens.to_vec();
    sort_best_first(&mut tokens);
    let p = softmax(&tokens);
    let keep = p.iter().take_while(|&&q| -q.log2() <= mu).count().max(1);
    tokens.truncate(keep);
    tokens
}

#[test]
fn mirostat_truncates_and_updates_mu_over_several_tokens_as_llama_cpp_does() {
    let logits = zipf_logits(200);
    for version in [Mirostat::V1, Mirostat::V2] {
        for (tau, eta, temperature) in [(5.0f32, 0.1f32, 1.0f32), (3.0, 0.3, 0.7), (8.0, 0.5, 1.3)] {
            let params = SamplingParams {
                mirostat: version,
                mirostat_tau: tau,
                mirostat_eta: eta,
                // Mirostat replaces the chain: these must not act.
                top_k: 2,
                top_p: 0.1,
                typical_p: 0.1,
                ..plain(temperature)
            };
            let mut sampler = Sampler::new(params).unwrap();
            let mut mu = 2.0 * f64::from(tau);
            assert_eq!(sampler.mirostat_mu(), mu);
            let scaled: Vec<Tok> = toks(&logits)
                .into_iter()
                .map(|t| Tok {
                    id: t.id,
                    logit: t.logit / f64::from(temperature),
                })
                .collect();
            for step in 0..12 {
                let kept = match version {
                    Mirostat::V1 => reference_mirostat_v1(&scaled, mu),
                    _ => reference_mirostat_v2(&scaled, mu),
                };
                let reference = finish(&kept, 1.0);
                let what = format!("{version:?} tau {tau} eta {eta} temperature {temperature} step {step}");
                assert_same(&distribution(&mut sampler, &logits, &[]), &reference, &what);
                let token = sampler.draw().unwrap();
                mu -= f64::from(eta) * (-reference[&token].log2() - f64::from(tau));
                assert!(
                    (sampler.mirostat_mu() - mu).abs() < 1e-6,
                    "{what}: mu {} against {mu}",
                    sampler.mirostat_mu()
                );
            }
            sampler.reset();
            assert_eq!(sampler.mirostat_mu(), 2.0 * f64::from(tau));
        }
    }
}

#[test]
fn mirostat_at_temperature_zero_is_greedy() {
    let logits = zipf_logits(50);
    for version in [Mirostat::V1, Mirostat::V2] {
        let mut sampler = Sampler::new(SamplingParams {
            mirostat: version,
            ..plain(0.0)
        })
        .unwrap();
        for _ in 0..5 {
            assert_eq!(sampler.sample(&logits, &[]).unwrap(), 0);
        }
    }
}

// ---- the chain's order, temperature and logit bias ----

/// llama.cpp's top-p on a best-first list.
fn reference_top_p(tokens: &[Tok], p: f64) -> Vec<Tok> {
    let mut tokens = tokens.to_vec();
    sort_best_first(&mut tokens);
    let probs = softmax(&tokens);
    let mut cum = 0.0;
    let keep = probs
        .iter()
        .position(|q| {
            cum += q;
            cum as f32 >= p as f32
        })
        .map_or(tokens.len(), |i| i + 1);
    tokens.truncate(keep);
    tokens
}

#[test]
fn a_temperature_placed_first_divides_the_logits_the_later_samplers_see() {
    for logits in rows() {
        for temperature in [0.5f32, 2.0] {
            let params = SamplingParams {
                top_p: 0.7,
                samplers: SamplerKind::parse_list("temperature;top_p").unwrap(),
                ..plain(temperature)
            };
            let divided: Vec<Tok> = toks(&logits)
                .into_iter()
                .map(|t| Tok {
                    id: t.id,
                    logit: t.logit / f64::from(temperature),
                })
                .collect();
            let reference = finish(&reference_top_p(&divided, 0.7), 1.0);
            assert_same(
                &ours(&params, &logits, &[]),
                &reference,
                &format!("temperature {temperature} first"),
            );
            // Last, as by default, top-p sees the undivided logits.
            let last = SamplingParams {
                samplers: SamplerKind::parse_list("top_p;temperature").unwrap(),
                ..params
            };
            let reference = finish(&reference_top_p(&toks(&logits), 0.7), f64::from(temperature));
            assert_same(
                &ours(&last, &logits, &[]),
                &reference,
                &format!("temperature {temperature} last"),
            );
        }
    }
}

#[test]
fn temperature_zero_stays_greedy_in_any_order_and_a_chain_without_temperature_ignores_it() {
    let logits = &rows()[3];
    for order in [
        "temperature;top_k;top_p",
        "top_k;temperature",
        "min_p;xtc;temperature;typ_p",
    ] {
        let params = SamplingParams {
            samplers: SamplerKind::parse_list(order).unwrap(),
            ..plain(0.0)
        };
        let mut sampler = Sampler::new(params).unwrap();
        for _ in 0..5 {
            assert_eq!(sampler.sample(logits, &[]).unwrap(), 10, "{order}");
        }
    }
    // As in llama.cpp, a chain without the temperature stage samples the softmax as it is.
    let params = SamplingParams {
        samplers: vec![SamplerKind::TopK],
        ..plain(0.0)
    };
    assert_same(
        &ours(&params, logits, &[]),
        &finish(&toks(logits), 1.0),
        "no temperature stage",
    );
}

#[test]
fn greedy_picks_among_what_xtc_left_as_llama_cpp_does() {
    // XTC before the temperature removes the two best tokens (10 and 3); greedy takes the next.
    let params = SamplingParams {
        xtc_probability: 1.0,
        xtc_threshold: 0.15,
        ..plain(0.0)
    };
    let logits = &rows()[3];
    let reference = reference_xtc(&toks(logits), 0.15);
    let best = reference
        .iter()
        .max_by(|a, b| a.logit.partial_cmp(&b.logit).unwrap().then(b.id.cmp(&a.id)))
        .unwrap()
        .id;
    assert_eq!(Sampler::new(params).unwrap().sample(logits, &[]).unwrap(), best);
    assert_ne!(best, 10);
}

#[test]
fn the_logit_bias_applies_before_the_penalties() {
    let params = SamplingParams {
        repeat_penalty: 2.0,
        logit_bias: vec![(0, 1.0), (2, f32::NEG_INFINITY), (1, 0.25), (1, 0.25)],
        ..plain(1.0)
    };
    let logits = [1.0, 0.5, 4.0, 0.0];
    // Token 0: (1 + 1) / 2 = 1, not 1 / 2 + 1; token 1: both entries add; token 2 is banned.
    let reference = finish(
        &[
            Tok { id: 0, logit: 1.0 },
            Tok { id: 1, logit: 1.0 },
            Tok {
                id: 2,
                logit: f64::NEG_INFINITY,
            },
            Tok { id: 3, logit: 0.0 },
        ],
        1.0,
    );
    assert_same(&ours(&params, &logits, &[0]), &reference, "logit bias then penalties");
    let out_of_range = SamplingParams {
        logit_bias: vec![(4, 1.0)],
        ..plain(1.0)
    };
    assert!(Sampler::new(out_of_range).unwrap().sample(&logits, &[]).is_err());
}

#[test]
fn the_default_chain_is_llama_cpps_order() {
    let p = SamplingParams::default();
    assert_eq!(
        p.samplers.iter().map(|s| s.name()).collect::<Vec<_>>().join(";"),
        "penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature"
    );
    assert_eq!(p.typical_p, 1.0);
    assert_eq!(p.top_n_sigma, -1.0);
    assert_eq!((p.xtc_probability, p.xtc_threshold), (0.0, 0.1));
    assert_eq!(
        (p.dry_multiplier, p.dry_base, p.dry_allowed_length, p.dry_penalty_last_n),
        (0.0, 1.75, 2, 64)
    );
    assert_eq!(p.dry_sequence_breakers, ["\n", ":", "\"", "*"]);
    assert_eq!((p.mirostat, p.mirostat_tau, p.mirostat_eta), (Mirostat::Off, 5.0, 0.1));
}

#[test]
fn out_of_range_sampler_parameters_are_refused_naming_the_field() {
    for (name, params) in [
        (
            "typical_p",
            SamplingParams {
                typical_p: 1.5,
                ..plain(1.0)
            },
        ),
        (
            "top_n_sigma",
            SamplingParams {
                top_n_sigma: f32::NAN,
                ..plain(1.0)
            },
        ),
        (
            "xtc_probability",
            SamplingParams {
                xtc_probability: -0.5,
                ..plain(1.0)
            },
        ),
        (
            "xtc_threshold",
            SamplingParams {
                xtc_threshold: 1.5,
                ..plain(1.0)
            },
        ),
        (
            "dry_multiplier",
            SamplingParams {
                dry_multiplier: -1.0,
                ..plain(1.0)
            },
        ),
        (
            "dry_base",
            SamplingParams {
                dry_base: 0.5,
                ..plain(1.0)
            },
        ),
        (
            "mirostat_tau",
            SamplingParams {
                mirostat_tau: f32::INFINITY,
                ..plain(1.0)
            },
        ),
        (
            "mirostat_eta",
            SamplingParams {
                mirostat_eta: -0.1,
                ..plain(1.0)
            },
        ),
        (
            "logit_bias",
            SamplingParams {
                logit_bias: vec![(0, f32::INFINITY)],
                ..plain(1.0)
            },
        ),
    ] {
        let err = Sampler::new(params).unwrap_err();
        assert!(err.to_string().contains(name), "{name}: {err}");
    }
}
