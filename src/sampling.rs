//! Token sampling: maps one row of logits plus the recent token history to one token id, with the
//! samplers and defaults of llama.cpp's common sampler.
//!
//! This module owns the sampler chain and its random number generator and nothing else. It knows
//! nothing of models, tokenizers or generation loops: it never computes logits, never decodes a
//! token, and keeps no history of its own (the caller passes the tokens so far on every call, so
//! a rewound or edited conversation needs no sampler reset).
//!
//! The chain runs in llama.cpp's order: repetition penalties over the last `penalty_last_n`
//! tokens, top-k, top-p, temperature, then a draw from the softmax. Temperature 0 is greedy: the
//! penalties still apply (as in llama.cpp, where the temperature sampler keeps only the best
//! token after the penalties), then the best logit wins, ties going to the lowest id.
//!
//! Draws come from xoshiro256** (Blackman and Vigna) seeded through splitmix64, one 64-bit output
//! per draw and none for a greedy pick. Every step orders candidates totally (higher logit first,
//! then lower id) and sums in that order, so a seed and the same inputs give the same tokens on
//! every platform and with any standard library sort implementation.

use std::cmp::Ordering;

/// What a sampler refuses. Parameter errors name the field and the value, so a user-facing layer
/// can hand them back as they are.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// A [`SamplingParams`] field is out of its range (or NaN).
    #[error("invalid sampling parameter {name} = {value}: {expected}")]
    InvalidParameter {
        /// The field's name.
        name: &'static str,
        /// The value given.
        value: f32,
        /// What the field accepts, as the message states it.
        expected: &'static str,
    },
    /// The logits row has no entries, so there is no token to pick.
    #[error("the logits row is empty")]
    EmptyLogits,
    /// NaN or +inf: a broken forward pass, which no sampler can rank. -inf is allowed, it is how
    /// a token gets masked out.
    #[error("logits[{index}] is {value}; a logits row must hold finite values or -inf")]
    InvalidLogit {
        /// The offending token id.
        index: usize,
        /// Its logit.
        value: f32,
    },
    /// Every candidate is -inf, so there is nothing to choose from (for instance a mask that
    /// allows no token).
    #[error("every candidate logit is -inf: no token can be sampled")]
    NoViableToken,
    /// A token in the penalty window is not a row index; the history and the logits belong to
    /// different vocabularies.
    #[error("history token {token} is outside the logits row of {n_vocab} entries")]
    TokenOutOfRange {
        /// The history token.
        token: u32,
        /// The logits row's length.
        n_vocab: usize,
    },
}

/// The sampler settings, with llama.cpp's names and meanings. Validated once, by
/// [`Sampler::new`] (or [`SamplingParams::validate`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits after top-k and top-p; 0 picks the best token (greedy). Finite, >= 0.
    pub temperature: f32,
    /// Keep the `top_k` highest logits; 0 or less keeps them all.
    pub top_k: i32,
    /// Keep the smallest set of best tokens whose probability reaches `top_p`; in (0, 1], and 1
    /// keeps them all.
    pub top_p: f32,
    /// Keep the tokens whose probability is at least `min_p` times the best one's (llama.cpp's
    /// min-p, applied after top-p); in [0, 1], and 0 keeps them all.
    pub min_p: f32,
    /// Divides a positive logit of a token in the window, multiplies a non-positive one; 1 is
    /// off. Finite, > 0.
    pub repeat_penalty: f32,
    /// Subtracted once per occurrence in the window; 0 is off. Finite, may be negative.
    pub frequency_penalty: f32,
    /// Subtracted once from every token in the window; 0 is off. Finite, may be negative.
    pub presence_penalty: f32,
    /// How many of the most recent history tokens the penalties read; 0 turns penalties off and
    /// `usize::MAX` reads the whole history (llama.cpp's -1).
    pub penalty_last_n: usize,
    /// Seeds the generator; the same seed and inputs give the same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    /// llama.cpp's sampling defaults for the samplers implemented here, with two choices of our
    /// own: a fixed seed (llama.cpp draws a random one), so a run is reproducible unless the caller
    /// asks otherwise, and a repeat penalty of 1.1, llama.cpp's long-standing value (its current
    /// releases ship 1.0, off).
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.1,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: 42,
        }
    }
}

impl SamplingParams {
    /// Pure argmax: temperature 0 and every penalty at its neutral value, so the result depends
    /// on the logits alone.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..SamplingParams::default()
        }
    }

    /// Checks every field; the error names the first invalid one.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let invalid = |name, value, expected| Err(SamplingError::InvalidParameter { name, value, expected });
        // Written so that NaN fails every check.
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return invalid(
                "temperature",
                self.temperature,
                "must be a finite number >= 0 (0 picks the most likely token)",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return invalid("top_p", self.top_p, "must lie in (0, 1] (1 disables top-p)");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return invalid("min_p", self.min_p, "must lie in [0, 1] (0 disables min-p)");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return invalid(
                "repeat_penalty",
                self.repeat_penalty,
                "must be a finite number > 0 (1 disables it)",
            );
        }
        if !self.frequency_penalty.is_finite() {
            return invalid(
                "frequency_penalty",
                self.frequency_penalty,
                "must be a finite number (0 disables it)",
            );
        }
        if !self.presence_penalty.is_finite() {
            return invalid(
                "presence_penalty",
                self.presence_penalty,
                "must be a finite number (0 disables it)",
            );
        }
        Ok(())
    }

    fn penalties_are_neutral(&self) -> bool {
        self.penalty_last_n == 0
            || (self.repeat_penalty == 1.0 && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0)
    }
}

/// The index of the highest logit, ties going to the lowest index; the same row checks as
/// [`Sampler::sample`].
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    check_row(logits)?;
    let mut best = 0;
    for (i, &logit) in logits.iter().enumerate() {
        // Strictly greater, so the first of equal logits (-0.0 and 0.0 included) stays.
        if logit > logits[best] {
            best = i;
        }
    }
    if logits[best] == f32::NEG_INFINITY {
        return Err(SamplingError::NoViableToken);
    }
    Ok(best as u32)
}

/// A configured sampler chain with its generator state and scratch buffers. Reuse one across the
/// tokens of a generation: the buffers keep their capacity, so sampling allocates only while they
/// grow to the vocabulary size.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256StarStar,
    candidates: Vec<Candidate>,
    window: Vec<u32>,
    /// The sum of the candidates' weights, once [`Sampler::build_candidates`] has weighed them
    /// (temperature above 0); `None` for a greedy pick.
    total: Option<f64>,
}

impl Sampler {
    /// A sampler for `params`, its generator seeded from `params.seed`; fails on invalid params.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: Xoshiro256StarStar::from_seed(params.seed),
            candidates: Vec::new(),
            // The penalty window's scratch at its full size now, so that it does not grow during
            // a generation (bounded: the window is a user's number).
            window: Vec::with_capacity(params.penalty_last_n.min(1 << 16)),
            total: None,
        })
    }

    /// The settings the sampler was made with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Restarts the random sequence from the seed, so the next draws repeat those of a fresh
    /// sampler.
    pub fn reset(&mut self) {
        self.rng = Xoshiro256StarStar::from_seed(self.params.seed);
    }

    /// Picks the next token from one row of logits (one entry per vocabulary id). `history` is
    /// every token so far, oldest first, prompt included as llama.cpp counts it; only its last
    /// `penalty_last_n` tokens are read. Neither input is modified.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        self.build_candidates(logits, history)?;
        self.draw()
    }

    /// The first half of [`Sampler::sample`]: the candidate list of one logits row after the
    /// penalties and, above temperature 0, top-k, top-p and the temperature's weights. Whatever
    /// constrains or inspects the choice (a grammar's mask, a speculative verifier's
    /// probabilities) goes between this and [`Sampler::draw`].
    pub fn build_candidates(&mut self, logits: &[f32], history: &[u32]) -> Result<&[Candidate], SamplingError> {
        self.total = None;
        // A failed build leaves no list behind for `draw` to pick from.
        self.candidates.clear();
        check_row(logits)?;
        let window = &history[history.len().saturating_sub(self.params.penalty_last_n)..];
        if let Some(&token) = window.iter().find(|&&t| t as usize >= logits.len()) {
            return Err(SamplingError::TokenOutOfRange {
                token,
                n_vocab: logits.len(),
            });
        }

        self.candidates.clear();
        self.candidates
            .extend(logits.iter().enumerate().map(|(id, &logit)| Candidate {
                id: id as u32,
                logit,
                weight: 0.0,
            }));
        apply_penalties(&mut self.candidates, window, &mut self.window, &self.params);

        if self.params.temperature == 0.0 {
            // Top-k and top-p always keep the best candidate (ties to the lowest id, as here), so
            // they cannot change a greedy pick and are skipped.
            return Ok(&self.candidates);
        }
        let sorted = apply_top_k(&mut self.candidates, self.params.top_k);
        apply_top_p(&mut self.candidates, self.params.top_p, sorted)?;
        apply_min_p(&mut self.candidates, self.params.min_p);
        self.total = Some(weigh(&mut self.candidates, self.params.temperature)?);
        Ok(&self.candidates)
    }

    /// The second half of [`Sampler::sample`]: the token chosen from the list the last
    /// [`Sampler::build_candidates`] left (the best one at temperature 0, else a draw of the
    /// generator). Without a list it is an error.
    pub fn draw(&mut self) -> Result<u32, SamplingError> {
        if self.candidates.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        match self.total.take() {
            None => greedy(&self.candidates),
            Some(total) => Ok(draw(&self.candidates, total, self.rng.next_f64())),
        }
    }
}

/// One entry of the candidate list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The token id.
    pub id: u32,
    /// The logit after the penalties.
    pub logit: f32,
    /// An unnormalised probability at the sampler's temperature; set only when the list was
    /// weighed (temperature above 0), else 0.
    pub weight: f64,
}

fn check_row(logits: &[f32]) -> Result<(), SamplingError> {
    if logits.is_empty() {
        return Err(SamplingError::EmptyLogits);
    }
    match logits.iter().position(|l| l.is_nan() || *l == f32::INFINITY) {
        Some(index) => Err(SamplingError::InvalidLogit {
            index,
            value: logits[index],
        }),
        None => Ok(()),
    }
}

/// Best first: higher logit, then lower id. The order is total (ids are unique), so sorting and
/// selecting give one answer whatever the algorithm. -0.0 and 0.0 compare equal, so they tie on
/// the id; NaN cannot reach here, but the fallback keeps the order total even so.
fn better(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .partial_cmp(&a.logit)
        .unwrap_or_else(|| b.logit.total_cmp(&a.logit))
        .then(a.id.cmp(&b.id))
}

/// llama.cpp's `llama_sampler_penalties_apply`, same f32 arithmetic. `candidates` must still be
/// in id order; `scratch` is reused to count the window without a map.
fn apply_penalties(candidates: &mut [Candidate], window: &[u32], scratch: &mut Vec<u32>, params: &SamplingParams) {
    if window.is_empty() || params.penalties_are_neutral() {
        return;
    }
    scratch.clear();
    scratch.extend_from_slice(window);
    scratch.sort_unstable();
    for run in scratch.chunk_by(|a, b| a == b) {
        let Some(candidate) = candidates.get_mut(run[0] as usize) else {
            continue;
        };
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

/// `candidates` must still be in id order: keeping the first of equal logits is then the
/// lowest-id rule, with a plain scan instead of the full comparator.
fn greedy(candidates: &[Candidate]) -> Result<u32, SamplingError> {
    let mut best = candidates.first().ok_or(SamplingError::EmptyLogits)?;
    for c in candidates {
        if c.logit > best.logit {
            best = c;
        }
    }
    if best.logit == f32::NEG_INFINITY {
        return Err(SamplingError::NoViableToken);
    }
    Ok(best.id)
}

/// Keeps the `k` best candidates, sorted best first, and says whether the list is now sorted.
/// Selection then a sort of the `k` kept avoids sorting a whole vocabulary for a small `k`.
fn apply_top_k(candidates: &mut Vec<Candidate>, k: i32) -> bool {
    let n = candidates.len();
    let k = match usize::try_from(k) {
        Ok(k) if k > 0 && k < n => k,
        _ => return false,
    };
    candidates.select_nth_unstable_by(k - 1, better);
    candidates.truncate(k);
    candidates.sort_unstable_by(better);
    true
}

/// llama.cpp's min-p: keeps the candidates whose logit is at least the best one's plus
/// `ln(min_p)` (probability at least `min_p` times the best's), in their order; the best one
/// always stays. 0 keeps them all.
fn apply_min_p(candidates: &mut Vec<Candidate>, min_p: f32) {
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
fn apply_top_p(candidates: &mut Vec<Candidate>, top_p: f32, sorted: bool) -> Result<(), SamplingError> {
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

/// Sets every weight to exp((logit - max) / temperature), which is softmax(logit / temperature)
/// up to the returned normaliser without overflowing at tiny temperatures.
fn weigh(candidates: &mut [Candidate], temperature: f32) -> Result<f64, SamplingError> {
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

/// Inverse-CDF draw over the weights in list order; `unit` lies in [0, 1).
fn draw(candidates: &[Candidate], total: f64, unit: f64) -> u32 {
    let target = unit * total;
    let mut cumulative = 0.0;
    for c in candidates {
        cumulative += c.weight;
        if cumulative > target {
            return c.id;
        }
    }
    // unit * total can round up to total; the last token with any mass is the one meant.
    candidates
        .iter()
        .rev()
        .find(|c| c.weight > 0.0)
        .or(candidates.first())
        .map_or(0, |c| c.id)
}

/// xoshiro256** 1.0 (Blackman and Vigna), the generator behind every draw. Small, fast, and fully
/// specified, so a seed means the same sequence everywhere.
#[derive(Debug, Clone)]
struct Xoshiro256StarStar {
    s: [u64; 4],
}

impl Xoshiro256StarStar {
    /// Expands the seed with splitmix64, as the xoshiro authors recommend; splitmix64 never
    /// yields four zero words, the one state xoshiro cannot leave.
    fn from_seed(seed: u64) -> Self {
        let mut state = seed;
        Xoshiro256StarStar {
            s: [
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
                splitmix64(&mut state),
            ],
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1): the top 53 bits, every value a multiple of 2^-53.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(logits: &[f32]) -> Vec<Candidate> {
        logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| Candidate {
                id: id as u32,
                logit,
                weight: 0.0,
            })
            .collect()
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
    fn splitmix64_reproduces_the_published_outputs_for_seed_zero() {
        let mut state = 0;
        let got: Vec<u64> = (0..4).map(|_| splitmix64(&mut state)).collect();
        assert_eq!(
            got,
            [
                0xe220a8397b1dcdaf,
                0x6e789e6aa1b965f4,
                0x06c45d188009454f,
                0xf88bb8a8724c81ec
            ]
        );
    }

    #[test]
    fn xoshiro256_star_star_reproduces_the_reference_outputs_from_state_1_2_3_4() {
        let mut rng = Xoshiro256StarStar { s: [1, 2, 3, 4] };
        let got: Vec<u64> = (0..10).map(|_| rng.next_u64()).collect();
        assert_eq!(
            got,
            [
                11520,
                0,
                1509978240,
                1215971899390074240,
                1216172134540287360,
                607988272756665600,
                16172922978634559625,
                8476171486693032832,
                10595114339597558777,
                2904607092377533576,
            ]
        );
    }

    #[test]
    fn unit_draws_stay_in_the_half_open_interval() {
        let mut rng = Xoshiro256StarStar::from_seed(7);
        for _ in 0..10_000 {
            let u = rng.next_f64();
            assert!((0.0..1.0).contains(&u));
        }
        assert_eq!(
            (u64::MAX >> 11) as f64 * (1.0 / (1u64 << 53) as f64),
            1.0 - f64::EPSILON / 2.0
        );
    }

    #[test]
    fn top_k_selection_matches_a_full_sort() {
        let logits = noisy_logits(5000, 1);
        let mut reference = candidates(&logits);
        reference.sort_by(better);
        for k in [1, 2, 40, 128, 4999] {
            let mut list = candidates(&logits);
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
    fn penalties_never_produce_nan() {
        let params = SamplingParams {
            repeat_penalty: 1e-30,
            frequency_penalty: 1e38,
            ..SamplingParams::default()
        };
        let mut list = candidates(&[1e10, 1.0]);
        apply_penalties(&mut list, &[0, 0, 0, 0], &mut Vec::new(), &params);
        assert_eq!(list[0].logit, f32::NEG_INFINITY);
        assert_eq!(Sampler::new(params).unwrap().sample(&[1e10, 1.0], &[0, 0, 0, 0]), Ok(1));
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
        assert_eq!(argmax(&[-0.0, 0.0]), Ok(0));
    }

    #[test]
    fn building_the_candidates_then_drawing_is_sampling_in_two_steps() {
        for temperature in [0.0, 0.7] {
            let params = SamplingParams {
                temperature,
                seed: 9,
                ..SamplingParams::default()
            };
            let (mut whole, mut split) = (Sampler::new(params).unwrap(), Sampler::new(params).unwrap());
            let mut history = vec![3u32, 5, 3];
            for row in 0..20 {
                let logits = noisy_logits(300, row);
                let expected = whole.sample(&logits, &history).unwrap();
                let listed = split.build_candidates(&logits, &history).unwrap().len();
                assert!(listed >= 1);
                assert_eq!(split.draw().unwrap(), expected, "temperature {temperature}, row {row}");
                history.push(expected);
            }
        }
        // Without a list there is nothing to draw from.
        let mut sampler = Sampler::new(SamplingParams::default()).unwrap();
        assert!(sampler.build_candidates(&[], &[]).is_err());
        assert_eq!(sampler.draw(), Err(SamplingError::EmptyLogits));
    }
}
