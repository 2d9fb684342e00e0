//! SentencePiece's BPE as llama.cpp runs it (`tokenizer.ggml.model = llama`): the text's spaces
//! written as `▁`, split into UTF-8 characters, and the adjacent pair whose joined text is the
//! highest-scoring token merged first (leftmost among equal scores), until no pair is a token;
//! a piece that is no token is re-split along the merges that made it, and what is left falls
//! back to byte tokens `<0xXX>`. The same queue, tie-breaking and re-segmentation as llama.cpp's
//! `llm_tokenizer_spm_session`, so the ids are llama.cpp's.
//!
//! Owns the merge loop of one fragment; the fragments (special tokens split out, the space
//! prefix) are the tokenizer's.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// What a SentencePiece vocabulary needs beyond its texts: each token's score and each byte's
/// fallback token.
pub struct Spm {
    pub(super) scores: Vec<f32>,
    pub(super) byte_tokens: Box<[Option<u32>; 256]>,
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: higher score first, then the leftmost.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// The length of the UTF-8 sequence a lead byte starts (llama.cpp's `unicode_len_utf8`: a
/// continuation or invalid byte counts as one).
fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(lead >> 4) as usize]
}

impl Spm {
    /// Append the ids of `text` (already escaped: spaces as `▁`) to `out`.
    pub fn tokenize(&self, text: &[u8], text_to_id: &HashMap<String, u32>, out: &mut Vec<u32>) {
        let mut symbols = Vec::new();
        let mut offs = 0;
        while offs < text.len() {
            let n = utf8_len(text[offs]).min(text.len() - offs);
            let index = symbols.len();
            symbols.push(Symbol {
                start: offs,
                n,
                prev: index.checked_sub(1),
                next: (offs + n < text.len()).then_some(index + 1),
            });
            offs += n;
        }
        if symbols.is_empty() {
            return;
        }
        let id_of = |bytes: &[u8]| std::str::from_utf8(bytes).ok().and_then(|s| text_to_id.get(s).copied());
        let mut queue = BinaryHeap::new();
        let mut rev_merge: HashMap<Vec<u8>, (usize, usize)> = HashMap::new();
        let try_add = |symbols: &[Symbol],
                       left: Option<usize>,
                       right: Option<usize>,
                       queue: &mut BinaryHeap<Bigram>,
                       rev: &mut HashMap<Vec<u8>, (usize, usize)>| {
            let (Some(left), Some(right)) = (left, right) else {
                return;
            };
            let (l, r) = (symbols[left], symbols[right]);
            let joined = &text[l.start..l.start + l.n + r.n];
            let Some(id) = id_of(joined) else { return };
            let Some(&score) = self.scores.get(id as usize) else {
                return;
            };
            queue.push(Bigram {
                left,
                right,
                score,
                size: joined.len(),
            });
            rev.insert(joined.to_vec(), (left, right));
        };
        for i in 1..symbols.len() {
            try_add(&symbols, Some(i - 1), Some(i), &mut queue, &mut rev_merge);
        }
        while let Some(bigram) = queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // One side was merged away, or grew, since this pair was queued.
            if l.n == 0 || r.n == 0 || l.n + r.n != bigram.size {
                continue;
            }
            symbols[bigram.left].n += r.n;
            symbols[bigram.right].n = 0;
            symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            let left = symbols[bigram.left];
            try_add(&symbols, left.prev, Some(bigram.left), &mut queue, &mut rev_merge);
            try_add(&symbols, Some(bigram.left), left.next, &mut queue, &mut rev_merge);
        }
        let mut i = Some(0);
        while let Some(at) = i {
            self.resegment(text, &symbols, at, &rev_merge, &id_of, out);
            i = symbols[at].next;
        }
    }

    fn resegment(
        &self,
        text: &[u8],
        symbols: &[Symbol],
        at: usize,
        rev_merge: &HashMap<Vec<u8>, (usize, usize)>,
        id_of: &dyn Fn(&[u8]) -> Option<u32>,
        out: &mut Vec<u32>,
    ) {
        let s = symbols[at];
        let bytes = &text[s.start..s.start + s.n];
        if let Some(id) = id_of(bytes) {
            out.push(id);
            return;
        }
        match rev_merge.get(bytes) {
            Some(&(left, right)) => {
                self.resegment(text, symbols, left, rev_merge, id_of, out);
                self.resegment(text, symbols, right, rev_merge, id_of, out);
            }
            // Bytes without a token of their own (llama.cpp would stop there) are dropped.
            None => out.extend(bytes.iter().filter_map(|&b| self.byte_tokens[b as usize])),
        }
    }
}

/// The text with each space written as SentencePiece's `▁` (llama.cpp's
/// `llama_escape_whitespace`).
pub fn escape_whitespace(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 4);
    for &b in text {
        if b == b' ' {
            out.extend_from_slice("▁".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}
