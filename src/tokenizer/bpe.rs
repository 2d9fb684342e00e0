//! Byte-level BPE: the GPT-2 byte-to-character mapping and the merge loop over one word.
//!
//! Merges are applied lowest rank first, and among equal pairs leftmost first, as llama.cpp's
//! `llm_tokenizer_bpe_session` does; a heap keeps a long word O(n log n).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's reversible map from bytes to printable characters: printable Latin-1 bytes map to
/// themselves, the rest to U+0100 onwards in byte order (so space is `Ġ`, newline `Ċ`).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xa1..=0xac | 0xae..=0xff);
        table[b as usize] = if printable {
            b as char
        } else {
            let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
            next += 1;
            c
        };
    }
    table
}

/// The symbol of a byte the vocabulary has no token for: it merges with nothing and is left out
/// of the output (llama.cpp's BPE session skips a byte it cannot find a token for).
pub const NO_TOKEN: u32 = u32::MAX;

/// A merge table: the rank of each mergeable pair of token ids and the id of the result.
#[derive(Default)]
pub struct Merges {
    pairs: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    pub fn insert(&mut self, left: u32, right: u32, rank: u32, merged: u32) {
        // A duplicated merge keeps its first (best) rank, as a rank table built in order would.
        self.pairs.entry((left, right)).or_insert((rank, merged));
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.pairs.get(&(left, right)).copied()
    }

    /// Merge the symbols `ids` (initially one token per byte, [`NO_TOKEN`] for a byte without
    /// one) of one word, appending the final token ids to `out`.
    pub fn apply(&self, ids: &[u32], out: &mut Vec<u32>) {
        match ids.len() {
            0 => return,
            1 => return out.extend(ids.iter().filter(|&&id| id != NO_TOKEN)),
            _ => {}
        }
        // A doubly linked list of live symbols over the initial positions.
        let n = ids.len();
        let mut id = ids.to_vec();
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        let mut next: Vec<usize> = (1..=n).collect();
        let mut alive = vec![true; n];
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<_>, id: &[u32], left: usize, right: usize| {
            if let Some((rank, merged)) = self.get(id[left], id[right]) {
                heap.push(Reverse((rank, left, right, id[left], id[right], merged)));
            }
        };
        for i in 0..n - 1 {
            push(&mut heap, &id, i, i + 1);
        }
        while let Some(Reverse((_, left, right, left_id, right_id, merged))) = heap.pop() {
            // Stale entries: a side was merged away or changed since this pair was queued.
            if !alive[left] || !alive[right] || next[left] != right || id[left] != left_id || id[right] != right_id {
                continue;
            }
            id[left] = merged;
            alive[right] = false;
            next[left] = next[right];
            if next[left] < n {
                prev[next[left]] = left;
                push(&mut heap, &id, left, next[left]);
            }
            if prev[left] < n {
                push(&mut heap, &id, prev[left], left);
            }
        }
        let mut i = 0;
        while i < n {
            if id[i] != NO_TOKEN {
                out.push(id[i]);
            }
            i = next[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_table_is_gpt2s() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0], '\u{100}');
        let mut sorted = t.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), 256, "the map is one to one");
    }

    #[test]
    fn merges_apply_lowest_rank_first_and_leftmost_among_equals() {
        // Symbols a=0 b=1; ab=2 (rank 0), bb=3 (rank 1), abb=4 (rank 2).
        let mut m = Merges::default();
        m.insert(0, 1, 0, 2);
        m.insert(1, 1, 1, 3);
        m.insert(2, 1, 2, 4);
        let mut out = Vec::new();
        m.apply(&[0, 1, 1], &mut out);
        assert_eq!(out, [4], "a b b -> ab b -> abb");
        out.clear();
        m.apply(&[1, 1, 1], &mut out);
        assert_eq!(out, [3, 1], "b b b -> bb b (leftmost pair first)");
    }
}
