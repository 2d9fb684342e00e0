//! DRY ("don't repeat yourself", from Koboldcpp, as llama.cpp ports it): penalises the tokens
//! that would extend a sequence already repeated in the recent history, more the longer the
//! repeat, with sequence breakers (newlines, punctuation) cutting the repeats short.
//!
//! This module owns the penalty and the processed form of the breakers. It must stay free of
//! tokenizer knowledge: breakers are text, and turning them into token sequences needs each
//! token's bytes and a tokenizer, so [`DryBreakers::new`] takes both as closures that the caller
//! builds from its tokenizer, once per generation.

use super::filters::position_of;
use super::Candidate;

/// llama.cpp truncates a breaker to this many bytes...
const MAX_BREAKER_BYTES: usize = 40;
/// ...and the token sequence that completes one to this many tokens, which bounds the scan.
const MAX_TAIL_TOKENS: usize = 20;

/// The sequence breakers as token sequences: for each head token, the tails that complete a
/// breaker after it (empty when the head's text contains a whole breaker). llama.cpp's
/// `dry_processed_breakers`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DryBreakers {
    /// Sorted by head then tail, without duplicates, so a head's tails are one range found by
    /// binary search and the order of the input does not matter.
    entries: Vec<(u32, Vec<u32>)>,
}

impl DryBreakers {
    /// llama.cpp's `get_overlapping_token_sequences` for each breaker: a token whose text
    /// contains the breaker is a breaker by itself; a token whose text ends with the start of the
    /// breaker heads a breaker completed by the tokens of the rest of it. `piece` gives token
    /// `id`'s bytes (control tokens as their text, as llama.cpp detokenizes them here) and
    /// `tokenize` the tokens of some bytes (no special-token parsing, no BOS). Empty breakers
    /// are skipped; long ones are cut to 40 bytes, as llama.cpp cuts them.
    pub fn new<B, P, T>(breakers: &[String], n_vocab: usize, mut piece: P, mut tokenize: T) -> Self
    where
        B: AsRef<[u8]>,
        P: FnMut(u32) -> B,
        T: FnMut(&[u8]) -> Vec<u32>,
    {
        let breakers: Vec<&[u8]> = breakers
            .iter()
            .map(|b| &b.as_bytes()[..b.len().min(MAX_BREAKER_BYTES)])
            .filter(|b| !b.is_empty())
            .collect();
        let mut entries = Vec::new();
        if breakers.is_empty() {
            return DryBreakers { entries };
        }
        for id in 0..n_vocab as u32 {
            let word = piece(id);
            let word = word.as_ref();
            for breaker in &breakers {
                if contains(word, breaker) {
                    entries.push((id, Vec::new()));
                    continue;
                }
                // Each place where the word's end overlaps the breaker's start.
                for pos in 0..word.len() {
                    let overlap = word.len() - pos;
                    if overlap < breaker.len() && word[pos..] == breaker[..overlap] {
                        let mut tail = tokenize(&breaker[overlap..]);
                        tail.truncate(MAX_TAIL_TOKENS);
                        entries.push((id, tail));
                    }
                }
            }
        }
        Self::from_entries(entries)
    }

    /// Breakers given as token sequences (first token the head), as llama.cpp's
    /// `llama_sampler_init_dry_testing` takes them; empty sequences are skipped.
    pub fn from_token_sequences(sequences: &[Vec<u32>]) -> Self {
        Self::from_entries(
            sequences
                .iter()
                .filter_map(|s| s.split_first().map(|(&head, tail)| (head, tail.to_vec())))
                .collect(),
        )
    }

    fn from_entries(mut entries: Vec<(u32, Vec<u32>)>) -> Self {
        entries.sort_unstable();
        entries.dedup();
        DryBreakers { entries }
    }

    /// How many (head, tail) sequences there are.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is none: DRY then runs without breakers.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn tails(&self, head: u32) -> impl Iterator<Item = &[u32]> {
        let start = self.entries.partition_point(|e| e.0 < head);
        self.entries[start..]
            .iter()
            .take_while(move |e| e.0 == head)
            .map(|e| e.1.as_slice())
    }

    fn is_single_token_breaker(&self, token: u32) -> bool {
        self.tails(token).any(|t| t.is_empty())
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// DRY's settings, checked by `SamplingParams::validate`.
#[derive(Debug, Clone, Copy)]
pub(super) struct DryParams {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
}

/// Reused buffers, so that a generation allocates only while they grow to the window size.
#[derive(Debug, Clone, Default)]
pub(super) struct DryScratch {
    repeat_count: Vec<usize>,
    max_repeat: Vec<(u32, usize)>,
}

/// llama.cpp's `llama_sampler_dry_apply` over `window` (the last `dry_penalty_last_n` tokens,
/// oldest first): the same four steps (breaker limit, reverse Z-algorithm, longest repeat each
/// token would extend, penalty `multiplier · base^(length - allowed_length)`) with the same
/// float arithmetic.
pub(super) fn apply_dry(
    candidates: &mut [Candidate],
    window: &[u32],
    breakers: &DryBreakers,
    params: DryParams,
    scratch: &mut DryScratch,
) {
    let n = window.len();
    let allowed = params.allowed_length;
    if n <= allowed {
        return;
    }
    // llama.cpp indexes its ring buffer from the newest token; `rat(0)` is the last one.
    let rat = |i: usize| window[n - 1 - i];

    // Step 1: the nearest breaker bounds how far back a repeat may reach.
    let mut rep_limit = n;
    for i in 0..n {
        let mut longest: Option<usize> = None;
        for tail in breakers.tails(rat(i)) {
            let len = tail.len();
            if longest.is_none_or(|l| len > l) && len <= i && (0..len).all(|o| tail[o] == rat(i - o - 1)) {
                longest = Some(len);
            }
        }
        if let Some(len) = longest {
            rep_limit = i - len;
            break;
        }
    }
    if rep_limit < allowed {
        return;
    }

    // Step 2: for each position, how long a suffix of the window also ends there (capped at the
    // limit), by the Z-algorithm run backwards, linear in the window.
    let counts = &mut scratch.repeat_count;
    counts.clear();
    counts.resize(n, 0);
    let last = n - 1;
    let (mut lt, mut rt) = (0usize, 0usize);
    for k in 1..n {
        if k > rt {
            let mut m = 0;
            while m + k < n && rat(m) == rat(m + k) {
                m += 1;
            }
            counts[last - k] = m.min(rep_limit);
            if m > 0 {
                lt = k;
                rt = k + m - 1;
            }
        } else {
            let p = k - lt;
            let right_part_len = rt - k + 1;
            if counts[last - p] < right_part_len {
                counts[last - k] = counts[last - p].min(rep_limit);
            } else {
                let mut i = rt + 1;
                while i < n && rat(i) == rat(i - k) {
                    i += 1;
                }
                counts[last - k] = (i - k).min(rep_limit);
                lt = k;
                rt = i - 1;
            }
        }
    }

    // Step 3: the token after each repeat would extend it; keep each token's longest.
    let max_repeat = &mut scratch.max_repeat;
    max_repeat.clear();
    for (i, &len) in counts[..n - 1].iter().enumerate() {
        if len >= allowed {
            max_repeat.push((rat(n - 2 - i), len));
        }
    }
    // Longest first within a token, so that dedup keeps each token's maximum.
    max_repeat.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    max_repeat.dedup_by_key(|e| e.0);

    // Step 4: the penalties, with llama.cpp's clamp against overflowing f32.
    const FLOAT_MAX_LOG: f32 = 88.722_84;
    let max_exponent = if params.base > 1.000_001 {
        (FLOAT_MAX_LOG / params.base.ln()) as usize
    } else {
        0
    };
    for &(token, len) in max_repeat.iter() {
        if breakers.is_single_token_breaker(token) {
            continue;
        }
        let Some(at) = position_of(candidates, token) else {
            continue;
        };
        let mut exponent = len - allowed;
        if max_exponent > 0 && exponent > max_exponent {
            exponent = max_exponent;
        }
        // llama.cpp's std::pow(float, int) computes in double before the f32 subtraction.
        let penalty = (f64::from(params.multiplier) * f64::from(params.base).powi(exponent as i32)) as f32;
        candidates[at].logit -= penalty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breakers_from_text_find_whole_and_overlapping_tokens() {
        // Token texts: 0 "a", 1 "\n", 2 "x:", 3 "ab", 4 "b", 5 "c\nd".
        let vocab: [&[u8]; 6] = [b"a", b"\n", b"x:", b"ab", b"b", b"c\nd"];
        let tokenize = |bytes: &[u8]| -> Vec<u32> {
            match bytes {
                b"b" => vec![4],
                b"bc" => vec![4, 9],
                b"c" => vec![9],
                other => panic!("unexpected tail {other:?}"),
            }
        };
        let breakers = DryBreakers::new(
            &["\n".into(), ":".into(), "abc".into()],
            6,
            |id| vocab[id as usize],
            tokenize,
        );
        assert_eq!(
            breakers.entries,
            vec![(0, vec![4, 9]), (1, vec![]), (2, vec![]), (3, vec![9]), (5, vec![])]
        );
    }
}
