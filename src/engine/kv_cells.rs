//! The bookkeeping over a session's KV cache (llama.cpp's `llama_kv_cells` and the sequence
//! operations of its memory interface): which cell holds which token, at which position, for
//! which sequences. The K and V values themselves live in the allocator's persistent per-layer
//! regions (one row per cell); this file decides where each new token goes and which cells each
//! token may attend to, and never touches the values.
//!
//! A cell may belong to several sequences at once (a copied prefix is shared, not duplicated).
//! Each sequence keeps its cells ordered by position, which is the order attention reads them
//! in, so a sequence's result does not depend on where its cells are or what else is cached.

use super::batch::{Batch, SeqId};
use super::EngineError;

/// Sequences a cache can hold at once (one bit each in a cell's membership).
pub const MAX_SEQUENCES: usize = 64;

/// Cells, their tokens, positions and sequences; see the module documentation.
#[derive(Clone, Debug)]
pub struct KvCells {
    /// Per cell: its position, or -1 when free.
    pos: Vec<i32>,
    /// Per cell: the sequences holding it, bit `s` for sequence `s`.
    seqs: Vec<u64>,
    /// Per cell: the token whose K and V it holds.
    tokens: Vec<u32>,
    /// Per sequence: its cells, ordered by position.
    lists: Vec<Vec<u32>>,
    n_used: usize,
    /// Cells one sequence may hold (all of them unless limited).
    max_per_seq: usize,
}

impl KvCells {
    /// `n_ctx` free cells for up to `n_seq_max` sequences (1 ..= [`MAX_SEQUENCES`]).
    pub fn new(n_ctx: usize, n_seq_max: usize) -> Result<Self, EngineError> {
        if n_seq_max == 0 || n_seq_max > MAX_SEQUENCES {
            return Err(EngineError::TooManySequences {
                n_seq_max,
                max: MAX_SEQUENCES,
            });
        }
        Ok(KvCells {
            pos: vec![-1; n_ctx],
            seqs: vec![0; n_ctx],
            tokens: vec![0; n_ctx],
            // Whole lists now, so that decoding never grows them.
            lists: (0..n_seq_max).map(|_| Vec::with_capacity(n_ctx)).collect(),
            n_used: 0,
            max_per_seq: n_ctx,
        })
    }

    /// Limit each sequence to `n` cells (a server's slots: each its own share of the cache).
    pub fn set_max_per_seq(&mut self, n: usize) {
        self.max_per_seq = n.min(self.n_ctx());
    }

    /// Cells one sequence may hold.
    pub fn max_per_seq(&self) -> usize {
        self.max_per_seq
    }

    /// Cells in all.
    pub fn n_ctx(&self) -> usize {
        self.pos.len()
    }

    /// Sequences the cache can hold.
    pub fn n_seq_max(&self) -> usize {
        self.lists.len()
    }

    /// Cells holding a token.
    pub fn n_used(&self) -> usize {
        self.n_used
    }

    /// Cells holding no token.
    pub fn n_free(&self) -> usize {
        self.n_ctx() - self.n_used
    }

    /// Cells held only by sequences in `seqs` (bit `s` for sequence `s`): what removing all of
    /// them would free. A cell another sequence also holds stays.
    pub fn held_only_by(&self, seqs: u64) -> usize {
        self.seqs.iter().filter(|&&m| m != 0 && m & !seqs == 0).count()
    }

    /// Of `seq`'s cells at positions below `p1`, those held only by sequences in `seqs`.
    pub fn prefix_held_only_by(&self, seq: SeqId, p1: i32, seqs: u64) -> usize {
        self.seq_cells(seq)
            .iter()
            .take_while(|&&c| self.pos[c as usize] < p1)
            .filter(|&&c| self.seqs[c as usize] & !seqs == 0)
            .count()
    }

    /// The cells of `seq`, ordered by position.
    pub fn seq_cells(&self, seq: SeqId) -> &[u32] {
        self.lists.get(seq).map_or(&[], |l| l.as_slice())
    }

    /// The position of a cell (-1 when free).
    pub fn cell_pos(&self, cell: u32) -> i32 {
        self.pos[cell as usize]
    }

    /// The highest position `seq` holds, if it holds any.
    pub fn seq_pos_max(&self, seq: SeqId) -> Option<i32> {
        self.seq_cells(seq).last().map(|&c| self.pos[c as usize])
    }

    /// How many cells `seq` holds at positions `p0..p1`.
    pub fn count_in(&self, seq: SeqId, p0: i32, p1: i32) -> usize {
        let list = self.seq_cells(seq);
        let below = |p: i32| list.partition_point(|&c| self.pos[c as usize] < p);
        below(p1).saturating_sub(below(p0))
    }

    /// The tokens `seq` holds, in position order: what a prompt can reuse.
    pub fn seq_tokens(&self, seq: SeqId) -> impl Iterator<Item = u32> + '_ {
        self.seq_cells(seq).iter().map(|&c| self.tokens[c as usize])
    }

    /// How many of `prompt`'s first tokens `seq` holds at positions `0, 1, ...` in order: the
    /// prefix another sequence can share ([`KvCells::seq_cp`]) without a gap.
    pub fn prefix_len(&self, seq: SeqId, prompt: &[u32]) -> usize {
        self.seq_cells(seq)
            .iter()
            .zip(prompt)
            .enumerate()
            .take_while(|&(i, (&c, &t))| self.pos[c as usize] == i as i32 && self.tokens[c as usize] == t)
            .count()
    }

    /// Whether `seq`'s cells are exactly its positions `0, 1, ...` in order: attention can then
    /// bound each token by its position alone.
    pub fn is_identity(&self, seq: SeqId) -> bool {
        self.seq_cells(seq)
            .iter()
            .enumerate()
            .all(|(i, &c)| c as usize == i && self.pos[i] == i as i32)
    }

    fn check_seq(&self, seq: SeqId) -> Result<(), EngineError> {
        if seq < self.lists.len() {
            Ok(())
        } else {
            Err(EngineError::SeqOutOfRange {
                seq,
                n_seq_max: self.lists.len(),
            })
        }
    }

    /// Give every token of `batch` a free cell, written to `cells` (one per token): the cell
    /// equal to its position when that one is free (one sequence then keeps cells equal to
    /// positions), else the first free one. Each sequence's positions must rise above what it
    /// holds. On error nothing is placed.
    pub fn place(&mut self, batch: &Batch, cells: &mut Vec<i32>) -> Result<(), EngineError> {
        let n = batch.len();
        let free = self.n_ctx() - self.n_used;
        if n > free {
            return Err(EngineError::ContextFull {
                n_past: self.n_used,
                n_tokens: n,
                needed: self.n_used + n,
                n_ctx: self.n_ctx(),
            });
        }
        // Each sequence's last position so far in the batch (checked to rise, so the highest).
        let mut last_in_batch = [None::<i32>; MAX_SEQUENCES];
        let mut count_in_batch = [0usize; MAX_SEQUENCES];
        for (&seq, &pos) in batch.seq_ids().iter().zip(batch.positions()) {
            self.check_seq(seq)?;
            count_in_batch[seq] += 1;
            let held = self.lists[seq].len();
            if held + count_in_batch[seq] > self.max_per_seq {
                return Err(EngineError::ContextFull {
                    n_past: held,
                    n_tokens: count_in_batch[seq],
                    needed: held + count_in_batch[seq],
                    n_ctx: self.max_per_seq,
                });
            }
            let before = last_in_batch[seq].or(self.seq_pos_max(seq));
            if pos < 0 || before.is_some_and(|b| pos <= b) {
                return Err(EngineError::PositionOrder {
                    seq,
                    pos,
                    after: before.unwrap_or(-1),
                });
            }
            last_in_batch[seq] = Some(pos);
        }
        cells.clear();
        let mut next_free = 0;
        for i in 0..n {
            let (token, pos, seq) = (batch.tokens()[i], batch.positions()[i], batch.seq_ids()[i]);
            let cell = match usize::try_from(pos)
                .ok()
                .filter(|&p| p < self.n_ctx() && self.pos[p] < 0)
            {
                Some(p) => p,
                None => {
                    while self.pos[next_free] >= 0 {
                        next_free += 1;
                    }
                    next_free
                }
            };
            self.pos[cell] = pos;
            self.seqs[cell] = 1 << seq;
            self.tokens[cell] = token;
            self.lists[seq].push(cell as u32);
            self.n_used += 1;
            cells.push(cell as i32);
        }
        Ok(())
    }

    /// Undo a [`KvCells::place`] whose forward pass failed: free `cells`, the last ones of their
    /// sequences.
    pub fn unplace(&mut self, cells: &[i32]) {
        for &cell in cells.iter().rev() {
            let c = cell as usize;
            for list in &mut self.lists {
                if list.last() == Some(&(cell as u32)) {
                    list.pop();
                }
            }
            self.free(c);
        }
    }

    /// Free an occupied cell (callers free each once: when its last sequence leaves it).
    fn free(&mut self, cell: usize) {
        self.pos[cell] = -1;
        self.seqs[cell] = 0;
        self.n_used -= 1;
    }

    /// Remove the cells of `seq` (every sequence if `None`) at positions `p0..p1`; a cell no
    /// sequence holds any more is free.
    pub fn seq_rm(&mut self, seq: Option<SeqId>, p0: i32, p1: i32) -> Result<(), EngineError> {
        let seqs: Vec<SeqId> = match seq {
            Some(s) => {
                self.check_seq(s)?;
                vec![s]
            }
            None => (0..self.lists.len()).collect(),
        };
        for s in seqs {
            let mut list = std::mem::take(&mut self.lists[s]);
            list.retain(|&c| {
                let c = c as usize;
                let p = self.pos[c];
                if p < p0 || p >= p1 {
                    return true;
                }
                self.seqs[c] &= !(1 << s);
                if self.seqs[c] == 0 {
                    self.free(c);
                }
                false
            });
            self.lists[s] = list;
        }
        Ok(())
    }

    /// Give `dst` the cells `src` holds at positions `p0..p1`, shared (its own cells there are
    /// removed first).
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, p0: i32, p1: i32) -> Result<(), EngineError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        if src == dst {
            return Ok(());
        }
        self.seq_rm(Some(dst), p0, p1)?;
        let shared: Vec<u32> = self.lists[src]
            .iter()
            .copied()
            .filter(|&c| (p0..p1).contains(&self.pos[c as usize]))
            .collect();
        for &c in &shared {
            self.seqs[c as usize] |= 1 << dst;
        }
        let mut list = std::mem::take(&mut self.lists[dst]);
        list.extend(shared);
        list.sort_by_key(|&c| self.pos[c as usize]);
        self.lists[dst] = list;
        Ok(())
    }

    /// Remove every sequence but `seq` from the cache.
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        for s in (0..self.lists.len()).filter(|&s| s != seq) {
            self.seq_rm(Some(s), 0, i32::MAX)?;
        }
        Ok(())
    }

    /// Add `delta` to the positions of `seq`'s cells at `p0..p1` (a cell shared with another
    /// sequence moves for it too, as in llama.cpp); cells pushed below 0 are removed. Only the
    /// bookkeeping moves: the K rows keep the rotation of their old positions until the
    /// re-rotation that context shifting brings.
    pub fn seq_add(&mut self, seq: SeqId, p0: i32, p1: i32, delta: i32) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        let moved: Vec<u32> = self.lists[seq]
            .iter()
            .copied()
            .filter(|&c| (p0..p1).contains(&self.pos[c as usize]))
            .collect();
        let mut touched = 0u64;
        for &c in &moved {
            let c = c as usize;
            touched |= self.seqs[c];
            self.pos[c] = self.pos[c].saturating_add(delta);
        }
        for s in (0..self.lists.len()).filter(|&s| touched & (1 << s) != 0) {
            let mut list = std::mem::take(&mut self.lists[s]);
            list.sort_by_key(|&c| self.pos[c as usize]);
            self.lists[s] = list;
        }
        for s in (0..self.lists.len()).filter(|&s| touched & (1 << s) != 0) {
            self.seq_rm(Some(s), i32::MIN, 0)?;
        }
        Ok(())
    }

    /// Move `seq`'s cells to cells `0, 1, ...` in position order (llama.cpp's defragmentation,
    /// for the one-sequence case), in a cache that holds no other sequence. Returns, for each
    /// new cell, the cell whose K and V rows it must take. Positions do not change, so a
    /// sequence whose positions run from 0 without a gap is then an identity.
    pub fn compact(&mut self, seq: SeqId) -> Result<Vec<u32>, EngineError> {
        self.check_seq(seq)?;
        if let Some(other) = (0..self.lists.len()).find(|&s| s != seq && !self.lists[s].is_empty()) {
            return Err(EngineError::ShiftSharedCache { seq, other });
        }
        let from = self.lists[seq].clone();
        let moved: Vec<(i32, u32)> = from
            .iter()
            .map(|&c| (self.pos[c as usize], self.tokens[c as usize]))
            .collect();
        self.clear();
        for (cell, (pos, token)) in moved.into_iter().enumerate() {
            self.pos[cell] = pos;
            self.seqs[cell] = 1 << seq;
            self.tokens[cell] = token;
            self.lists[seq].push(cell as u32);
        }
        self.n_used = from.len();
        Ok(from)
    }

    /// Empty the cache and give `seq` the cells `0..tokens.len()`, token `i` at position
    /// `first + i` (a saved session coming back; its K and V rows are written by the caller).
    pub fn restore(&mut self, seq: SeqId, tokens: &[u32], first: i32) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        if tokens.len() > self.n_ctx() {
            return Err(EngineError::ContextFull {
                needed: tokens.len(),
                n_past: 0,
                n_tokens: tokens.len(),
                n_ctx: self.n_ctx(),
            });
        }
        self.clear();
        for (cell, &token) in tokens.iter().enumerate() {
            self.pos[cell] = first + cell as i32;
            self.seqs[cell] = 1 << seq;
            self.tokens[cell] = token;
            self.lists[seq].push(cell as u32);
        }
        self.n_used = tokens.len();
        Ok(())
    }

    /// Free every cell.
    pub fn clear(&mut self) {
        self.pos.fill(-1);
        self.seqs.fill(0);
        for list in &mut self.lists {
            list.clear();
        }
        self.n_used = 0;
    }

    /// The explicit-span inputs for `batch` (already placed): `index` gets, for each sequence
    /// of the batch in order of first appearance, its cells by position; `spans` gets, per
    /// token, the offset of its sequence's list and how many of those cells (positions up to its
    /// own) it sees. Returns how many entries of `index` it wrote; the rest is left as it was
    /// (nothing reads past the spans).
    pub fn fill_spans(&self, batch: &Batch, index: &mut [i32], spans: &mut Vec<i32>) -> usize {
        spans.clear();
        let mut used = 0;
        // (seq, offset) of the sequences written so far; a batch holds few sequences.
        let mut offsets: [(SeqId, usize); MAX_SEQUENCES] = [(usize::MAX, 0); MAX_SEQUENCES];
        let mut n_offsets = 0;
        for (&seq, &pos) in batch.seq_ids().iter().zip(batch.positions()) {
            let list = self.seq_cells(seq);
            let offset = match offsets[..n_offsets].iter().find(|(s, _)| *s == seq) {
                Some(&(_, offset)) => offset,
                None => {
                    for (slot, &c) in index[used..used + list.len()].iter_mut().zip(list) {
                        *slot = c as i32;
                    }
                    offsets[n_offsets] = (seq, used);
                    n_offsets += 1;
                    used += list.len();
                    used - list.len()
                }
            };
            let count = list.partition_point(|&c| self.pos[c as usize] <= pos);
            spans.push(offset as i32);
            spans.push(count as i32);
        }
        used
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells_of(kv: &KvCells, seq: SeqId) -> Vec<(u32, i32)> {
        kv.seq_cells(seq).iter().map(|&c| (c, kv.cell_pos(c))).collect()
    }

    #[test]
    fn only_cells_no_other_sequence_holds_count_as_freed_by_removing_a_set_of_sequences() {
        let mut kv = KvCells::new(16, 3).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2, 3, 4], 0, 0, 1), &mut cells)
            .unwrap();
        // Sequence 1 shares the first three cells and adds two; sequence 2 has one of its own.
        kv.seq_cp(0, 1, 0, 3).unwrap();
        kv.place(&Batch::for_sequence(&[7, 8], 3, 1, 1), &mut cells).unwrap();
        kv.place(&Batch::for_sequence(&[9], 0, 2, 1), &mut cells).unwrap();
        assert_eq!((kv.n_used(), kv.n_free()), (7, 9));
        assert_eq!(kv.held_only_by(1 << 1), 2);
        assert_eq!(kv.held_only_by(1 << 0), 1);
        assert_eq!(kv.held_only_by(1 << 0 | 1 << 1), 6);
        assert_eq!(kv.held_only_by(0b111), 7);
        // Of sequence 1's first four positions, one is its own; with 0 idle too, all four.
        assert_eq!(kv.prefix_held_only_by(1, 4, 1 << 1), 1);
        assert_eq!(kv.prefix_held_only_by(1, 4, 0b11), 4);
    }

    #[test]
    fn one_sequence_gets_cells_equal_to_its_positions() {
        let mut kv = KvCells::new(8, 1).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2, 3], 0, 0, 1), &mut cells).unwrap();
        kv.place(&Batch::for_sequence(&[4], 3, 0, 1), &mut cells).unwrap();
        assert_eq!(cells, [3]);
        assert!(kv.is_identity(0));
        assert_eq!(kv.seq_tokens(0).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert_eq!(kv.seq_pos_max(0), Some(3));
    }

    #[test]
    fn positions_that_do_not_rise_and_unknown_sequences_are_refused_and_nothing_is_placed() {
        let mut kv = KvCells::new(8, 2).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2], 0, 0, 1), &mut cells).unwrap();
        let err = kv.place(&Batch::for_sequence(&[3], 1, 0, 1), &mut cells).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::PositionOrder {
                    seq: 0,
                    pos: 1,
                    after: 1
                }
            ),
            "{err}"
        );
        let err = kv.place(&Batch::for_sequence(&[3], 0, 2, 1), &mut cells).unwrap_err();
        assert!(
            matches!(err, EngineError::SeqOutOfRange { seq: 2, n_seq_max: 2 }),
            "{err}"
        );
        let err = kv
            .place(&Batch::for_sequence(&[0; 7], 2, 1, 1), &mut cells)
            .unwrap_err();
        assert!(matches!(err, EngineError::ContextFull { .. }), "{err}");
        assert_eq!(kv.n_used(), 2);
    }

    #[test]
    fn a_copied_prefix_is_shared_and_freed_only_when_no_sequence_holds_it() {
        let mut kv = KvCells::new(8, 3).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2, 3, 4], 0, 0, 1), &mut cells)
            .unwrap();
        kv.seq_cp(0, 1, 0, 2).unwrap();
        assert_eq!(cells_of(&kv, 1), [(0, 0), (1, 1)]);
        assert_eq!(kv.n_used(), 4);
        // Sequence 1 continues at position 2 in a cell of its own.
        kv.place(&Batch::for_sequence(&[9], 2, 1, 1), &mut cells).unwrap();
        assert_eq!(cells, [4]);
        assert_eq!(kv.seq_tokens(1).collect::<Vec<_>>(), [1, 2, 9]);
        kv.seq_rm(Some(0), 0, i32::MAX).unwrap();
        assert_eq!(kv.n_used(), 3, "the shared cells stay for sequence 1");
        kv.seq_keep(2).unwrap();
        assert_eq!(kv.n_used(), 0);
    }

    #[test]
    fn a_sequence_limited_to_its_share_of_the_cells_cannot_take_more() {
        let mut kv = KvCells::new(8, 2).unwrap();
        kv.set_max_per_seq(4);
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2, 3], 0, 0, 1), &mut cells).unwrap();
        let err = kv
            .place(&Batch::for_sequence(&[4, 5], 3, 0, 1), &mut cells)
            .unwrap_err();
        assert!(matches!(err, EngineError::ContextFull { n_ctx: 4, .. }), "{err}");
        assert_eq!(kv.seq_cells(0).len(), 3, "a refused batch places nothing");
        // The other sequence still has its own four.
        kv.place(&Batch::for_sequence(&[6, 7, 8, 9], 0, 1, 1), &mut cells)
            .unwrap();
    }

    #[test]
    fn shifting_positions_keeps_lists_ordered_and_drops_cells_below_zero() {
        let mut kv = KvCells::new(8, 1).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2, 3, 4, 5], 0, 0, 1), &mut cells)
            .unwrap();
        kv.seq_rm(Some(0), 1, 3).unwrap();
        kv.seq_add(0, 3, i32::MAX, -2).unwrap();
        assert_eq!(cells_of(&kv, 0), [(0, 0), (3, 1), (4, 2)]);
        kv.seq_add(0, 0, i32::MAX, -1).unwrap();
        assert_eq!(cells_of(&kv, 0), [(3, 0), (4, 1)]);
        assert_eq!(kv.n_used(), 2);
    }

    #[test]
    fn spans_list_each_sequence_once_and_count_the_cells_up_to_each_token() {
        let mut kv = KvCells::new(8, 2).unwrap();
        let mut cells = Vec::new();
        kv.place(&Batch::for_sequence(&[1, 2], 0, 0, 1), &mut cells).unwrap();
        let mut batch = Batch::for_sequence(&[3], 2, 0, 1);
        batch.push_sequence(&[7, 8], 0, 1, 2);
        kv.place(&batch, &mut cells).unwrap();
        assert_eq!(cells, [2, 3, 4]);
        let mut index = vec![-5; 16];
        let mut spans = Vec::new();
        assert_eq!(kv.fill_spans(&batch, &mut index, &mut spans), 5);
        assert_eq!(&index[..5], [0, 1, 2, 3, 4]);
        assert!(index[5..].iter().all(|&c| c == -5), "left as it was");
        assert_eq!(spans, [0, 3, 3, 1, 3, 2]);
    }
}
