//! The host-memory tier of the prompt cache (llama-server's `--cache-ram`): copies of cached
//! prefixes' K and V rows, in the cache's own types, kept after their cells were evicted, so
//! that a prompt that comes back is restored ([`Session::restore_prefix`]) instead of read
//! again. Bounded in bytes; the least recently used copy goes first.
//!
//! This file only keeps and finds copies: the session reads and writes the rows, and the
//! server decides when to save and when to restore.

#[cfg(doc)]
use super::session::Session;
use std::sync::Arc;

/// One sequence's tokens at positions `0..` and, per KV layer, the stored bytes of their K and
/// V rows, one row per token in position order.
#[derive(Debug, Clone)]
pub struct SavedPrefix {
    /// The tokens, position `i` at index `i`.
    pub tokens: Vec<u32>,
    /// The KV layers, in the order their rows are in `rows`.
    pub(super) layers: Vec<usize>,
    /// Bytes of one K row and one V row.
    pub(super) row_bytes: (usize, usize),
    /// Every layer's K rows then V rows, layer after layer, in one allocation: a copy freed
    /// is a mapping given back to the system, not holes in the heap.
    pub(super) rows: Vec<u8>,
}

impl SavedPrefix {
    /// Host bytes the copy holds.
    pub fn bytes(&self) -> usize {
        self.rows.len() + 4 * self.tokens.len()
    }

    /// Layer number `i`'s K (`v = false`) or V rows for positions `from..to`.
    pub(super) fn layer_rows(&self, i: usize, v: bool, from: usize, to: usize) -> &[u8] {
        let (k, vb) = self.row_bytes;
        let n = self.tokens.len();
        let start = i * n * (k + vb) + if v { n * k } else { 0 };
        let row = if v { vb } else { k };
        &self.rows[start + from * row..start + to * row]
    }
}

struct Entry {
    prefix: Arc<SavedPrefix>,
    last_used: u64,
}

/// Copies of evicted prefixes within a byte budget; see the module documentation.
pub struct HostCache {
    budget: usize,
    entries: Vec<Entry>,
    clock: u64,
    held: usize,
}

impl HostCache {
    /// An empty cache that holds at most `budget` bytes.
    pub fn new(budget: usize) -> Self {
        HostCache {
            budget,
            entries: Vec::new(),
            clock: 0,
            held: 0,
        }
    }

    /// Bytes held now.
    pub fn bytes(&self) -> usize {
        self.held
    }

    /// Copies held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no copy is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keeps `prefix`, evicting the least recently used copies to make room. A copy that a held
    /// one already starts with adds nothing and is dropped; held copies that `prefix` starts
    /// with are replaced by it. One larger than the whole budget is not kept.
    pub fn insert(&mut self, prefix: SavedPrefix) {
        let size = prefix.bytes();
        if size > self.budget || prefix.tokens.is_empty() {
            return;
        }
        self.clock += 1;
        if let Some(held) = self
            .entries
            .iter_mut()
            .find(|e| e.prefix.tokens.starts_with(&prefix.tokens))
        {
            held.last_used = self.clock;
            return;
        }
        let mut held = self.held;
        self.entries.retain(|e| {
            let superseded = prefix.tokens.starts_with(&e.prefix.tokens);
            if superseded {
                held -= e.prefix.bytes();
            }
            !superseded
        });
        self.held = held;
        while self.held + size > self.budget {
            let Some(lru) = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used) else {
                break;
            };
            self.held -= self.entries.swap_remove(lru).prefix.bytes();
        }
        self.held += size;
        self.entries.push(Entry {
            prefix: Arc::new(prefix),
            last_used: self.clock,
        });
    }

    /// The copy sharing the longest prefix with `prompt`, and that length (counted as used).
    pub fn best(&mut self, prompt: &[u32]) -> Option<(Arc<SavedPrefix>, usize)> {
        let common = |e: &Entry| e.prefix.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let (n, i) = (0..self.entries.len())
            .map(|i| (common(&self.entries[i]), i))
            .filter(|&(n, _)| n > 0)
            .max()?;
        self.clock += 1;
        let entry = &mut self.entries[i];
        entry.last_used = self.clock;
        Some((Arc::clone(&entry.prefix), n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(tokens: &[u32], row: usize) -> SavedPrefix {
        SavedPrefix {
            tokens: tokens.to_vec(),
            layers: vec![0],
            row_bytes: (row, row),
            rows: vec![0u8; 2 * tokens.len() * row],
        }
    }

    #[test]
    fn a_copy_that_extends_a_held_one_replaces_it_and_a_shorter_one_adds_nothing() {
        let mut cache = HostCache::new(1 << 20);
        cache.insert(prefix(&[1, 2, 3], 8));
        cache.insert(prefix(&[1, 2, 3, 4, 5], 8));
        assert_eq!(cache.len(), 1);
        cache.insert(prefix(&[1, 2], 8));
        assert_eq!(cache.len(), 1);
        assert_eq!(cache.bytes(), 5 * 16 + 20);
        assert_eq!(cache.best(&[1, 2, 3, 9]).map(|(_, n)| n), Some(3));
        assert!(cache.best(&[7]).is_none());
    }

    #[test]
    fn the_least_recently_used_copy_goes_first_when_the_budget_is_full() {
        let mut cache = HostCache::new(3 * (4 * 16 + 16));
        cache.insert(prefix(&[1, 1, 1, 1], 8));
        cache.insert(prefix(&[2, 2, 2, 2], 8));
        cache.insert(prefix(&[3, 3, 3, 3], 8));
        // Using the first makes the second the least recent.
        assert!(cache.best(&[1]).is_some());
        cache.insert(prefix(&[4, 4, 4, 4], 8));
        assert_eq!(cache.len(), 3);
        assert!(cache.best(&[2]).is_none());
        assert!(cache.best(&[1]).is_some() && cache.best(&[4]).is_some());
        assert!(cache.bytes() <= 3 * 80);
        // Larger than the whole budget: not kept.
        cache.insert(prefix(&[5; 100], 8));
        assert!(cache.best(&[5]).is_none());
    }
}
