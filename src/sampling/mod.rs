//! Token sampling: maps one row of logits plus the recent token history to one token id, with the
//! samplers, names and defaults of llama.cpp's common sampler.
//!
//! This module owns the parameters, their checks, the sampler chain's order and the state a
//! generation carries (the generator, Mirostat's `mu`, scratch buffers). It knows nothing of
//! models, tokenizers or generation loops: it never computes logits, never decodes a token, and
//! keeps no history of its own (the caller passes the tokens so far on every call, so a rewound
//! or edited conversation needs no sampler reset). What needs token text (DRY's sequence
//! breakers) comes in already turned into token ids, as a [`DryBreakers`].
//!
//! The chain is llama.cpp's: the logit bias, then the stages of [`SamplingParams::samplers`]
//! (by default penalties, DRY, top-n-sigma, top-k, typical, top-p, min-p, XTC, temperature),
//! then a draw from the softmax; with Mirostat on, the logit bias, temperature and Mirostat
//! instead. Temperature 0 is greedy: the stages before the temperature still apply (as in
//! llama.cpp, where the temperature sampler keeps only the best token of what reaches it), then
//! the best logit wins, ties going to the lowest id.
//!
//! Draws come from xoshiro256** (Blackman and Vigna) seeded through splitmix64, one 64-bit output
//! per draw, one per XTC roll and none for a greedy pick. Every step orders candidates totally
//! (higher logit first, then lower id) and sums in list order, which the inputs fix, so a seed
//! and the same inputs give the same tokens on every platform and with any standard library
//! sort implementation.

mod dry;
mod filters;
mod mirostat;
mod rng;

pub use dry::DryBreakers;

use dry::{DryParams, DryScratch};
use filters::{
    apply_logit_bias, apply_min_p, apply_penalties, apply_top_k, apply_top_n_sigma, apply_top_p, apply_typical,
    apply_xtc, divide_logits, greedy, weigh,
};
use rng::Xoshiro256StarStar;

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
    /// A name in a sampler list that is not one of llama.cpp's sampler names (or one minfer
    /// does not implement).
    #[error("unknown sampler '{name}': expected one of {}", SamplerKind::NAMES)]
    UnknownSampler {
        /// The name as given.
        name: String,
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
    /// A logit bias names a token that is not a row index.
    #[error("logit bias token {token} is outside the logits row of {n_vocab} entries")]
    LogitBiasOutOfRange {
        /// The biased token.
        token: u32,
        /// The logits row's length.
        n_vocab: usize,
    },
}

/// One stage of the chain, under llama.cpp's names (`--samplers`, the server's `samplers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SamplerKind {
    /// Repetition, frequency and presence penalties.
    Penalties,
    /// DRY.
    Dry,
    /// Top-n-sigma.
    TopNSigma,
    /// Top-k.
    TopK,
    /// Locally typical sampling.
    TypicalP,
    /// Top-p (nucleus).
    TopP,
    /// Min-p.
    MinP,
    /// XTC.
    Xtc,
    /// Temperature.
    Temperature,
}

impl SamplerKind {
    /// llama.cpp's default order (`common_params_sampling::samplers`).
    pub const DEFAULT_CHAIN: [SamplerKind; 9] = [
        SamplerKind::Penalties,
        SamplerKind::Dry,
        SamplerKind::TopNSigma,
        SamplerKind::TopK,
        SamplerKind::TypicalP,
        SamplerKind::TopP,
        SamplerKind::MinP,
        SamplerKind::Xtc,
        SamplerKind::Temperature,
    ];

    /// The canonical names, for messages.
    pub const NAMES: &'static str = "penalties, dry, top_n_sigma, top_k, typ_p, top_p, min_p, xtc, temperature";

    /// llama.cpp's canonical name (`common_sampler_type_to_str`).
    pub fn name(self) -> &'static str {
        match self {
            SamplerKind::Penalties => "penalties",
            SamplerKind::Dry => "dry",
            SamplerKind::TopNSigma => "top_n_sigma",
            SamplerKind::TopK => "top_k",
            SamplerKind::TypicalP => "typ_p",
            SamplerKind::TopP => "top_p",
            SamplerKind::MinP => "min_p",
            SamplerKind::Xtc => "xtc",
            SamplerKind::Temperature => "temperature",
        }
    }

    /// llama.cpp's one-letter code (`common_sampler_type_to_chr`), what a server request's
    /// `samplers` string holds.
    pub fn code(self) -> char {
        match self {
            SamplerKind::Penalties => 'e',
            SamplerKind::Dry => 'd',
            SamplerKind::TopNSigma => 's',
            SamplerKind::TopK => 'k',
            SamplerKind::TypicalP => 'y',
            SamplerKind::TopP => 'p',
            SamplerKind::MinP => 'm',
            SamplerKind::Xtc => 'x',
            SamplerKind::Temperature => 't',
        }
    }

    /// A stage from its name, case-insensitively: the canonical names, their kebab-case and
    /// no-underscore forms (`top-k`, `topk`), and the aliases llama.cpp accepts (`nucleus`,
    /// `temp`, `typ`) or that its flags use (`typical`, `typical_p`, `typical-p`).
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let canonical = lower.replace('-', "_");
        Some(match canonical.as_str() {
            "penalties" => SamplerKind::Penalties,
            "dry" => SamplerKind::Dry,
            "top_n_sigma" | "topnsigma" => SamplerKind::TopNSigma,
            "top_k" | "topk" => SamplerKind::TopK,
            "typ_p" | "typp" | "typ" | "typical" | "typical_p" | "typicalp" => SamplerKind::TypicalP,
            "top_p" | "topp" | "nucleus" => SamplerKind::TopP,
            "min_p" | "minp" => SamplerKind::MinP,
            "xtc" => SamplerKind::Xtc,
            "temperature" | "temp" => SamplerKind::Temperature,
            _ => return None,
        })
    }

    /// A stage from its one-letter code.
    pub fn from_code(code: char) -> Option<Self> {
        Self::DEFAULT_CHAIN.into_iter().find(|k| k.code() == code)
    }

    /// A `;`-separated list of names, as `--samplers` takes it (`top_k;temp`). Blank entries
    /// (a trailing `;`) are skipped; an unknown name is an error naming it.
    pub fn parse_list(list: &str) -> Result<Vec<Self>, SamplingError> {
        list.split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|name| Self::from_name(name).ok_or_else(|| SamplingError::UnknownSampler { name: name.to_string() }))
            .collect()
    }

    /// A string of one-letter codes (`kpt`), as llama-server reads a `samplers` string.
    pub fn parse_codes(codes: &str) -> Result<Vec<Self>, SamplingError> {
        codes
            .chars()
            .map(|c| Self::from_code(c).ok_or_else(|| SamplingError::UnknownSampler { name: c.to_string() }))
            .collect()
    }
}

/// Which Mirostat, if any, replaces the chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mirostat {
    /// The chain of [`SamplingParams::samplers`] (llama.cpp's `--mirostat 0`).
    #[default]
    Off,
    /// Mirostat (llama.cpp's 1).
    V1,
    /// Mirostat 2.0 (llama.cpp's 2).
    V2,
}

impl Mirostat {
    /// From llama.cpp's number; `None` outside 0, 1, 2.
    pub fn from_number(n: i64) -> Option<Self> {
        match n {
            0 => Some(Mirostat::Off),
            1 => Some(Mirostat::V1),
            2 => Some(Mirostat::V2),
            _ => None,
        }
    }

    /// llama.cpp's number: 0, 1 or 2.
    pub fn number(self) -> u8 {
        match self {
            Mirostat::Off => 0,
            Mirostat::V1 => 1,
            Mirostat::V2 => 2,
        }
    }
}

/// The sampler settings, with llama.cpp's names and meanings. Validated once, by
/// [`Sampler::new`] (or [`SamplingParams::validate`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits at the temperature stage; 0 picks the best token (greedy). Finite,
    /// >= 0.
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
    /// Locally typical sampling's `p` (llama.cpp's `typ_p`); in [0, 1], and 1 is off.
    pub typical_p: f32,
    /// Keep the tokens within `top_n_sigma` standard deviations of the best logit; 0 or less is
    /// off (llama.cpp's -1). Finite.
    pub top_n_sigma: f32,
    /// XTC's chance of acting on a token; in [0, 1], and 0 is off.
    pub xtc_probability: f32,
    /// XTC removes the tokens at least this likely but the least likely of them; in [0, 1], and
    /// above 0.5 XTC is off.
    pub xtc_threshold: f32,
    /// DRY's multiplier; 0 is off. Finite, >= 0.
    pub dry_multiplier: f32,
    /// DRY's base: the penalty grows as `base^(length - allowed_length)`. Finite, >= 1.
    pub dry_base: f32,
    /// Repeats up to this many tokens go unpenalised by DRY.
    pub dry_allowed_length: usize,
    /// How many of the most recent history tokens DRY scans; 0 turns it off and `usize::MAX`
    /// scans the whole history (llama.cpp's -1, the context size).
    pub dry_penalty_last_n: usize,
    /// DRY's sequence breakers as text. The sampler reads them only through the
    /// [`DryBreakers`] its caller builds from them with a tokenizer.
    pub dry_sequence_breakers: Vec<String>,
    /// Mirostat, which replaces the chain with temperature then Mirostat.
    pub mirostat: Mirostat,
    /// Mirostat's target surprise `tau` (llama.cpp's `--mirostat-ent`). Finite, >= 0.
    pub mirostat_tau: f32,
    /// Mirostat's learning rate `eta` (llama.cpp's `--mirostat-lr`). Finite, >= 0.
    pub mirostat_eta: f32,
    /// The chain's stages in order (llama.cpp's `--samplers`); a stage left out does not run
    /// (without `temperature`, no temperature applies, 0 included).
    pub samplers: Vec<SamplerKind>,
    /// Added to a token's logit before anything else; -inf bans the token. Finite or -inf.
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    /// llama.cpp's sampling defaults, with two choices of our own: a fixed seed (llama.cpp draws
    /// a random one), so a run is reproducible unless the caller asks otherwise, and a repeat
    /// penalty of 1.1, llama.cpp's long-standing value (its current releases ship 1.0, off).
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
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry_multiplier: 0.0,
            dry_base: 1.75,
            dry_allowed_length: 2,
            dry_penalty_last_n: 64,
            dry_sequence_breakers: ["\n", ":", "\"", "*"].map(String::from).to_vec(),
            mirostat: Mirostat::Off,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            samplers: SamplerKind::DEFAULT_CHAIN.to_vec(),
            logit_bias: Vec::new(),
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
        if !(0.0..=1.0).contains(&self.typical_p) {
            return invalid("typical_p", self.typical_p, "must lie in [0, 1] (1 disables it)");
        }
        if !self.top_n_sigma.is_finite() {
            return invalid(
                "top_n_sigma",
                self.top_n_sigma,
                "must be a finite number (0 or less disables it)",
            );
        }
        if !(0.0..=1.0).contains(&self.xtc_probability) {
            return invalid(
                "xtc_probability",
                self.xtc_probability,
                "must lie in [0, 1] (0 disables XTC)",
            );
        }
        if !(0.0..=1.0).contains(&self.xtc_threshold) {
            return invalid(
                "xtc_threshold",
                self.xtc_threshold,
                "must lie in [0, 1] (above 0.5 disables XTC)",
            );
        }
        if !(self.dry_multiplier.is_finite() && self.dry_multiplier >= 0.0) {
            return invalid(
                "dry_multiplier",
                self.dry_multiplier,
                "must be a finite number >= 0 (0 disables DRY)",
            );
        }
        if !(self.dry_base.is_finite() && self.dry_base >= 1.0) {
            return invalid("dry_base", self.dry_base, "must be a finite number >= 1");
        }
        if !(self.mirostat_tau.is_finite() && self.mirostat_tau >= 0.0) {
            return invalid("mirostat_tau", self.mirostat_tau, "must be a finite number >= 0");
        }
        if !(self.mirostat_eta.is_finite() && self.mirostat_eta >= 0.0) {
            return invalid("mirostat_eta", self.mirostat_eta, "must be a finite number >= 0");
        }
        if let Some(&(_, bias)) = self.logit_bias.iter().find(|(_, b)| b.is_nan() || *b == f32::INFINITY) {
            return invalid(
                "logit_bias",
                bias,
                "must be a finite number or -inf (which bans the token)",
            );
        }
        Ok(())
    }

    fn penalties_are_neutral(&self) -> bool {
        self.penalty_last_n == 0
            || (self.repeat_penalty == 1.0 && self.frequency_penalty == 0.0 && self.presence_penalty == 0.0)
    }

    /// Whether DRY changes anything, llama.cpp's test: a caller builds [`DryBreakers`] only then.
    pub fn dry_enabled(&self) -> bool {
        self.dry_multiplier != 0.0
            && self.dry_penalty_last_n != 0
            && self.samplers.contains(&SamplerKind::Dry)
            && self.mirostat == Mirostat::Off
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

/// Which tokens a constraint (a grammar, a tool-call format) allows; the chain drops the others
/// right after the penalties, see [`Sampler::build_candidates_masked`].
pub type TokenMask<'a> = &'a dyn Fn(u32) -> bool;

/// A configured sampler chain with its generator state and scratch buffers. Reuse one across the
/// tokens of a generation: Mirostat's `mu` carries over from token to token, and the buffers keep
/// their capacity, so sampling allocates only while they grow to the vocabulary size.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256StarStar,
    candidates: Vec<Candidate>,
    window: Vec<u32>,
    /// The sum of the candidates' weights, once [`Sampler::build_candidates`] has weighed them
    /// (temperature above 0); `None` for a greedy pick.
    total: Option<f64>,
    dry_breakers: DryBreakers,
    dry_scratch: DryScratch,
    /// Mirostat's running bound on the surprise.
    mu: f64,
}

impl Sampler {
    /// A sampler for `params`, its generator seeded from `params.seed`; fails on invalid params.
    /// DRY, if on, runs without sequence breakers until [`Sampler::with_dry_breakers`] gives
    /// them.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            rng: Xoshiro256StarStar::from_seed(params.seed),
            candidates: Vec::new(),
            // The penalty window's scratch at its full size now, so that it does not grow during
            // a generation (bounded: the window is a user's number).
            window: Vec::with_capacity(params.penalty_last_n.min(1 << 16)),
            total: None,
            dry_breakers: DryBreakers::default(),
            dry_scratch: DryScratch::default(),
            mu: 2.0 * f64::from(params.mirostat_tau),
            params,
        })
    }

    /// The sampler with DRY's sequence breakers, built by the caller from
    /// [`SamplingParams::dry_sequence_breakers`] and its tokenizer.
    pub fn with_dry_breakers(mut self, breakers: DryBreakers) -> Self {
        self.dry_breakers = breakers;
        self
    }

    /// The settings the sampler was made with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Mirostat's current bound `mu` (`2 · tau` until a Mirostat draw updates it).
    pub fn mirostat_mu(&self) -> f64 {
        self.mu
    }

    /// Restarts the random sequence from the seed and Mirostat's `mu` from `2 · tau`, so the
    /// next draws repeat those of a fresh sampler.
    pub fn reset(&mut self) {
        self.rng = Xoshiro256StarStar::from_seed(self.params.seed);
        self.mu = 2.0 * f64::from(self.params.mirostat_tau);
    }

    /// Picks the next token from one row of logits (one entry per vocabulary id). `history` is
    /// every token so far, oldest first, prompt included as llama.cpp counts it; only its last
    /// `penalty_last_n` (and `dry_penalty_last_n`) tokens are read. Neither input is modified.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        self.build_candidates(logits, history)?;
        self.draw()
    }

    /// The first half of [`Sampler::sample`]: the candidate list of one logits row after the
    /// chain and, above temperature 0, the final weights. Whatever inspects the choice (a
    /// speculative verifier's probabilities) goes between this and [`Sampler::draw`].
    pub fn build_candidates(&mut self, logits: &[f32], history: &[u32]) -> Result<&[Candidate], SamplingError> {
        self.build_candidates_masked(logits, history, None)
    }

    /// [`Sampler::build_candidates`] with the tokens `allowed` refuses dropped (their logit set
    /// to -inf) right after the penalties stage, before anything that reads probabilities; with
    /// no penalties stage in the chain (or with Mirostat), right after the logit bias. Every
    /// token refused is an error of the draw ([`SamplingError::NoViableToken`]).
    pub fn build_candidates_masked(
        &mut self,
        logits: &[f32],
        history: &[u32],
        allowed: Option<TokenMask>,
    ) -> Result<&[Candidate], SamplingError> {
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

        self.candidates.extend(Candidate::from_logits(logits));
        let result = apply_logit_bias(&mut self.candidates, &self.params.logit_bias)
            .and_then(|()| self.run_chain(window, history, allowed));
        if let Err(e) = result {
            self.candidates.clear();
            return Err(e);
        }
        Ok(&self.candidates)
    }

    fn run_chain(&mut self, window: &[u32], history: &[u32], allowed: Option<TokenMask>) -> Result<(), SamplingError> {
        let p = &self.params;
        let candidates = &mut self.candidates;
        let mask = |candidates: &mut [Candidate]| {
            if let Some(allowed) = allowed {
                for c in candidates.iter_mut().filter(|c| !allowed(c.id)) {
                    c.logit = f32::NEG_INFINITY;
                }
            }
        };

        if p.mirostat != Mirostat::Off {
            mask(candidates);
            if p.temperature == 0.0 {
                return Ok(());
            }
            divide_logits(candidates, p.temperature);
            let n_vocab = candidates.len();
            self.total = Some(match p.mirostat {
                Mirostat::V1 => mirostat::truncate_v1(candidates, self.mu, n_vocab)?,
                _ => mirostat::truncate_v2(candidates, self.mu)?,
            });
            return Ok(());
        }

        let chain = &p.samplers;
        let mask_at = chain
            .iter()
            .position(|&s| s == SamplerKind::Penalties)
            .map_or(0, |i| i + 1);
        let greedy_at = if p.temperature == 0.0 {
            chain.iter().position(|&s| s == SamplerKind::Temperature)
        } else {
            None
        };
        let mut sorted = false;
        let mut divisor = 1.0;
        for (i, &stage) in chain.iter().enumerate() {
            if i == mask_at {
                mask(candidates);
            }
            if let Some(at) = greedy_at {
                if i == at {
                    // The best candidate wins; the mask must have run by now.
                    if mask_at > i {
                        mask(candidates);
                    }
                    return Ok(());
                }
                // These always keep the best candidate, so before a greedy pick they cannot
                // change it and are skipped (a vocabulary-sized sort saved per token).
                if matches!(
                    stage,
                    SamplerKind::TopK | SamplerKind::TopP | SamplerKind::MinP | SamplerKind::TopNSigma
                ) {
                    continue;
                }
            }
            match stage {
                SamplerKind::Penalties => apply_penalties(candidates, window, &mut self.window, p),
                SamplerKind::Dry => {
                    if p.dry_enabled() {
                        let dry_window = &history[history.len().saturating_sub(p.dry_penalty_last_n)..];
                        let params = DryParams {
                            multiplier: p.dry_multiplier,
                            base: p.dry_base,
                            allowed_length: p.dry_allowed_length,
                        };
                        dry::apply_dry(
                            candidates,
                            dry_window,
                            &self.dry_breakers,
                            params,
                            &mut self.dry_scratch,
                        );
                    }
                }
                SamplerKind::TopNSigma => apply_top_n_sigma(candidates, p.top_n_sigma),
                SamplerKind::TopK => sorted |= apply_top_k(candidates, p.top_k),
                SamplerKind::TypicalP => {
                    if p.typical_p < 1.0 {
                        apply_typical(candidates, p.typical_p)?;
                        sorted = false;
                    }
                }
                SamplerKind::TopP => {
                    apply_top_p(candidates, p.top_p, sorted)?;
                    sorted |= p.top_p < 1.0;
                }
                SamplerKind::MinP => apply_min_p(candidates, p.min_p),
                SamplerKind::Xtc => apply_xtc(
                    candidates,
                    p.xtc_probability,
                    p.xtc_threshold,
                    &mut sorted,
                    &mut self.rng,
                )?,
                SamplerKind::Temperature => {
                    // Last in the chain (the default), the temperature is the weights' divisor,
                    // which keeps the f64 softmax exact at tiny temperatures; earlier, later
                    // stages must see the divided logits, llama.cpp's f32 `logit / temp`.
                    if i + 1 == chain.len() {
                        divisor = p.temperature;
                    } else {
                        divide_logits(candidates, p.temperature);
                    }
                }
            }
        }
        if mask_at >= chain.len() {
            mask(candidates);
        }
        if greedy_at.is_none() {
            self.total = Some(weigh(candidates, divisor)?);
        }
        Ok(())
    }

    /// The second half of [`Sampler::sample`]: the token chosen from the list the last
    /// [`Sampler::build_candidates`] left (the best one at temperature 0, else a draw of the
    /// generator). Without a list it is an error. With Mirostat on, the token's probability
    /// updates `mu`.
    pub fn draw(&mut self) -> Result<u32, SamplingError> {
        if self.candidates.is_empty() {
            return Err(SamplingError::EmptyLogits);
        }
        let (id, p) = match self.total.take() {
            // llama.cpp's temperature 0 leaves one token, of probability 1.
            None => (greedy(&self.candidates)?, 1.0),
            Some(total) => {
                let at = filters::draw(&self.candidates, total, self.rng.next_f64());
                let c = &self.candidates[at];
                (c.id, c.weight / total)
            }
        };
        if self.params.mirostat != Mirostat::Off {
            self.mu = mirostat::update_mu(self.mu, self.params.mirostat_tau, self.params.mirostat_eta, p);
        }
        Ok(id)
    }
}

/// One entry of the candidate list.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The token id.
    pub id: u32,
    /// The logit after the chain's changes (bias, penalties, DRY, an early temperature).
    pub logit: f32,
    /// An unnormalised probability at the sampler's temperature; set only when the list was
    /// weighed (temperature above 0), else 0.
    pub weight: f64,
}

impl Candidate {
    /// One unweighed candidate per entry of a logits row, in id order.
    pub fn from_logits(logits: &[f32]) -> impl Iterator<Item = Candidate> + '_ {
        logits.iter().enumerate().map(|(id, &logit)| Candidate {
            id: id as u32,
            logit,
            weight: 0.0,
        })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random logits in about [-8, 8), with repeats so ties occur.
    fn noisy_logits(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = Xoshiro256StarStar::from_seed(seed);
        (0..n).map(|_| ((rng.next_u64() >> 54) as f32 - 512.0) / 64.0).collect()
    }

    #[test]
    fn building_the_candidates_then_drawing_is_sampling_in_two_steps() {
        for temperature in [0.0, 0.7] {
            let params = SamplingParams {
                temperature,
                seed: 9,
                ..SamplingParams::default()
            };
            let (mut whole, mut split) = (Sampler::new(params.clone()).unwrap(), Sampler::new(params).unwrap());
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

    #[test]
    fn a_mask_drops_the_tokens_it_refuses_before_the_draw() {
        let logits = [5.0, 4.0, 3.0, 2.0];
        let even = |id: u32| id.is_multiple_of(2);
        for temperature in [0.0, 1.0] {
            let mut sampler = Sampler::new(SamplingParams {
                temperature,
                ..SamplingParams::default()
            })
            .unwrap();
            for _ in 0..20 {
                sampler.build_candidates_masked(&logits, &[], Some(&even)).unwrap();
                assert!(sampler.draw().unwrap().is_multiple_of(2));
            }
        }
        let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        sampler.build_candidates_masked(&logits, &[], Some(&|_| false)).unwrap();
        assert_eq!(sampler.draw(), Err(SamplingError::NoViableToken));
    }

    #[test]
    fn sampler_names_read_llama_cpp_spellings_and_aliases() {
        let chain =
            SamplerKind::parse_list("penalties;DRY;top-n-sigma;topk;typical;typical_p;typ_p;nucleus;min_p;xtc;temp;")
                .unwrap();
        assert_eq!(
            chain,
            [
                SamplerKind::Penalties,
                SamplerKind::Dry,
                SamplerKind::TopNSigma,
                SamplerKind::TopK,
                SamplerKind::TypicalP,
                SamplerKind::TypicalP,
                SamplerKind::TypicalP,
                SamplerKind::TopP,
                SamplerKind::MinP,
                SamplerKind::Xtc,
                SamplerKind::Temperature,
            ]
        );
        assert_eq!(
            SamplerKind::parse_list("top_k;wizard"),
            Err(SamplingError::UnknownSampler { name: "wizard".into() })
        );
        assert_eq!(
            SamplerKind::parse_codes("edskypmxt").unwrap(),
            SamplerKind::DEFAULT_CHAIN
        );
        for kind in SamplerKind::DEFAULT_CHAIN {
            assert_eq!(SamplerKind::from_name(kind.name()), Some(kind));
        }
    }
}
