//! The window cache's bookkeeping (the sliding-window half of llama.cpp's ISWA cache): the
//! cells of the windowed layers (Gemma's local layers), which keep, for each sequence, only the
//! positions its next tokens can still see — the last `n_swa` — plus room for one batch. A
//! long context then costs those layers a window, not a context. This file decides which window
//! cell each token takes and which cells a batch may drop; it never touches values, and the
//! other layers' cells are the full cache's ([`KvCells`]).
//!
//! A token at position `p` sees positions `p - n_swa + 1 ..= p` (llama.cpp's
//! `is_masked_swa`: masked when `p - p0 >= n_swa`). Before a batch is placed, each of its
//! sequences drops the cells no token of the batch can see, those at or below its first new
//! position minus `n_swa`; later tokens of the sequence come at higher positions, so they never
//! need them either. What cannot come back is the window of an earlier position: resuming a
//! sequence below what it held (a shorter prefix, an edited turn) needs the window cache to still
//! hold that position's window, which [`KvWindow::holds_window`] tells and [`KvWindow::place`]
//! checks, refusing by name rather than attending to less.

use super::batch::{Batch, SeqId};
use super::{EngineError, KvCells, MAX_SEQUENCES};
use crate::graph::DType;
use crate::models::HParams;

/// Bytes the K and V regions of every layer of a model take in a cache of `n_ctx` cells whose
/// windowed layers keep `n_ctx_swa` cells (0: full regions for them too).
pub fn kv_cache_bytes(hp: &HParams, type_k: DType, type_v: DType, n_ctx: usize, n_ctx_swa: usize) -> usize {
    let per_cell = type_k.bytes(hp.n_kv_embd()) + type_v.bytes(hp.n_kv_embd());
    (0..hp.n_layer)
        .map(|il| {
            per_cell
                * if n_ctx_swa > 0 && hp.is_swa(il) {
                    n_ctx_swa
                } else {
                    n_ctx
                }
        })
        .sum()
}

/// The window cache's cells; see the module documentation.
#[derive(Clone, Debug)]
pub struct KvWindow {
    cells: KvCells,
    n_swa: usize,
    /// Per sequence: the position below which the window need not hold what the full cache
    /// holds — after a context shift, the kept first tokens it dropped long before (llama.cpp's
    /// window cache has lost them too, and attends without them). 0 otherwise.
    floor: Vec<i32>,
}

impl KvWindow {
    /// Cells a window cache needs (llama.cpp's `size_swa` without its padding): each sequence's
    /// window, and one pass of `n_ubatch` tokens.
    pub fn size(n_swa: usize, n_seq_max: usize, n_ubatch: usize) -> usize {
        n_swa * n_seq_max + n_ubatch
    }

    /// `n_ctx_swa` free window cells of `n_swa` positions for up to `n_seq_max` sequences.
    pub fn new(n_ctx_swa: usize, n_seq_max: usize, n_swa: usize) -> Result<Self, EngineError> {
        Ok(KvWindow {
            cells: KvCells::new(n_ctx_swa, n_seq_max)?,
            n_swa: n_swa.max(1),
            floor: vec![0; n_seq_max],
        })
    }

    /// The cells (for the sequence operations, which apply to both caches alike).
    pub fn cells(&self) -> &KvCells {
        &self.cells
    }

    /// The cells, to change.
    pub fn cells_mut(&mut self) -> &mut KvCells {
        &mut self.cells
    }

    /// After a context shift of `seq`: its tokens below what the window holds now (the kept
    /// first ones, dropped when the sequence went a window past them) are not asked for again.
    pub fn set_floor_after_shift(&mut self, seq: SeqId) {
        let lowest = self.cells.seq_cells(seq).first().map(|&c| self.cells.cell_pos(c));
        if let (Some(floor), Some(lowest)) = (self.floor.get_mut(seq), lowest) {
            *floor = lowest;
        }
    }

    /// `seq` starts over: nothing it held before is excused.
    pub fn forget(&mut self, seq: SeqId) {
        if let Some(floor) = self.floor.get_mut(seq) {
            *floor = 0;
        }
    }

    /// Positions a token sees through the window.
    pub fn n_swa(&self) -> usize {
        self.n_swa
    }

    /// Whether every position `full` holds for `seq` that a token at `pos` would see through the
    /// window (`pos - n_swa + 1 .. pos`) is held here too: whether `seq` can go on at `pos`.
    pub fn holds_window(&self, full: &KvCells, seq: SeqId, pos: i32) -> bool {
        let floor = self.floor.get(seq).copied().unwrap_or(0);
        let p0 = pos.saturating_sub(self.n_swa as i32 - 1).max(floor);
        full.count_in(seq, p0, pos) == self.cells.count_in(seq, p0, pos)
    }

    /// Give every token of `batch` a window cell, written to `cells`, after checking that each
    /// sequence's window is held ([`KvWindow::holds_window`] as `full`, the full cache, holds
    /// its tokens) and dropping the cells no token of the batch sees. The batch has been
    /// checked by `full`'s placement (sequences in range, positions rising).
    pub fn place(&mut self, full: &KvCells, batch: &Batch, cells: &mut Vec<i32>) -> Result<(), EngineError> {
        let mut first = [None::<i32>; MAX_SEQUENCES];
        for (&seq, &pos) in batch.seq_ids().iter().zip(batch.positions()) {
            if first[seq].is_none() {
                first[seq] = Some(pos);
                if !self.holds_window(full, seq, pos) {
                    return Err(EngineError::WindowLost {
                        seq,
                        pos,
                        n_swa: self.n_swa,
                    });
                }
            }
        }
        for (seq, pos) in first.iter().enumerate().filter_map(|(s, p)| p.map(|p| (s, p))) {
            // Positions at or below `pos - n_swa` are masked for `pos` and everything after.
            self.cells
                .seq_rm(Some(seq), i32::MIN, pos.saturating_sub(self.n_swa as i32 - 1))?;
        }
        // Sequences outside the batch keep what they held while there is room (a server may
        // still resume one of them a little earlier); when the batch needs their room, each
        // keeps only the window of its next position, as llama.cpp reuses the cells masked
        // for every holder's next token. The cache's size, a window per sequence and one pass,
        // then always fits the batch.
        if self.cells.n_used() + batch.len() > self.cells.n_ctx() {
            for seq in (0..self.cells.n_seq_max()).filter(|&s| first[s].is_none()) {
                if let Some(last) = self.cells.seq_pos_max(seq) {
                    let next = last.saturating_add(1);
                    self.cells
                        .seq_rm(Some(seq), i32::MIN, next.saturating_sub(self.n_swa as i32 - 1))?;
                }
            }
        }
        self.cells.place(batch, cells).map_err(|e| match e {
            EngineError::ContextFull { n_tokens, .. } => EngineError::WindowFull {
                n_tokens,
                n_ctx_swa: self.cells.n_ctx(),
            },
            e => e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions(w: &KvWindow, seq: SeqId) -> Vec<i32> {
        w.cells()
            .seq_cells(seq)
            .iter()
            .map(|&c| w.cells().cell_pos(c))
            .collect()
    }

    #[test]
    fn a_sequence_keeps_only_the_positions_its_next_tokens_see() {
        let (mut full, mut w) = (KvCells::new(128, 1).unwrap(), KvWindow::new(8, 1, 4).unwrap());
        let (mut cf, mut cw) = (Vec::new(), Vec::new());
        for (chunk, p0) in [(&[1u32, 2, 3][..], 0), (&[4, 5, 6, 7][..], 3), (&[8][..], 7)] {
            let batch = Batch::for_sequence(chunk, p0, 0, 1);
            full.place(&batch, &mut cf).unwrap();
            w.place(&full, &batch, &mut cw).unwrap();
        }
        // Position 7 was placed after dropping what position 7 cannot see (3 and below).
        assert_eq!(positions(&w, 0), [4, 5, 6, 7]);
        // 100 more tokens one by one never need more than the window and the token.
        for p in 8..108 {
            let batch = Batch::for_sequence(&[9], p, 0, 1);
            full.place(&batch, &mut cf).unwrap();
            w.place(&full, &batch, &mut cw).unwrap();
        }
        assert_eq!(positions(&w, 0), [104, 105, 106, 107]);
        assert_eq!(w.cells().n_used(), 4);
    }

    #[test]
    fn going_back_below_the_window_is_refused_by_name_and_within_it_is_not() {
        let (mut full, mut w) = (KvCells::new(64, 1).unwrap(), KvWindow::new(8, 1, 4).unwrap());
        let (mut cf, mut cw) = (Vec::new(), Vec::new());
        let batch = Batch::for_sequence(&[1, 2, 3, 4, 5, 6, 7, 8], 0, 0, 1);
        full.place(&batch, &mut cf).unwrap();
        w.place(&full, &batch, &mut cw).unwrap();
        // Position 8 comes after one more token: the window holds 5..=8 afterwards.
        let batch = Batch::for_sequence(&[9], 8, 0, 1);
        full.place(&batch, &mut cf).unwrap();
        w.place(&full, &batch, &mut cw).unwrap();
        // Dropping the last two tokens: position 7 sees 4..=6, and 4 is gone.
        full.seq_rm(Some(0), 7, i32::MAX).unwrap();
        w.cells_mut().seq_rm(Some(0), 7, i32::MAX).unwrap();
        assert!(!w.holds_window(&full, 0, 7));
        let err = w
            .place(&full, &Batch::for_sequence(&[7], 7, 0, 1), &mut cw)
            .unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::WindowLost {
                    seq: 0,
                    pos: 7,
                    n_swa: 4
                }
            ),
            "{err}"
        );
        // Dropping one token only is fine: position 8 sees 5..=7, all held.
        let (mut full, mut w) = (KvCells::new(64, 1).unwrap(), KvWindow::new(8, 1, 4).unwrap());
        for p in 0..10 {
            let batch = Batch::for_sequence(&[1], p, 0, 1);
            full.place(&batch, &mut cf).unwrap();
            w.place(&full, &batch, &mut cw).unwrap();
        }
        full.seq_rm(Some(0), 9, i32::MAX).unwrap();
        w.cells_mut().seq_rm(Some(0), 9, i32::MAX).unwrap();
        assert!(w.holds_window(&full, 0, 9));
        // A fresh sequence needs no window.
        assert!(w.holds_window(&full, 0, 0));
    }

    #[test]
    fn a_batch_larger_than_the_window_cache_is_refused_by_name() {
        let (mut full, mut w) = (KvCells::new(64, 1).unwrap(), KvWindow::new(8, 1, 4).unwrap());
        let (mut cf, mut cw) = (Vec::new(), Vec::new());
        let batch = Batch::for_sequence(&[1; 9], 0, 0, 1);
        full.place(&batch, &mut cf).unwrap();
        let err = w.place(&full, &batch, &mut cw).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::WindowFull {
                    n_tokens: 9,
                    n_ctx_swa: 8
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn sequences_outside_a_batch_give_up_what_their_next_token_cannot_see_when_it_needs_room() {
        // Four sequences of a window of 6 in 4 * 6 + 8 cells: each reads an 8-token prompt in a
        // pass of its own, which leaves the others holding 5 + 8 cells until the last prompt
        // needs their room.
        let (mut full, mut w) = (KvCells::new(256, 4).unwrap(), KvWindow::new(32, 4, 6).unwrap());
        let (mut cf, mut cw) = (Vec::new(), Vec::new());
        for seq in 0..4 {
            for p0 in [0, 8] {
                let batch = Batch::for_sequence(&[1; 8], p0, seq, 1);
                full.place(&batch, &mut cf).unwrap();
                w.place(&full, &batch, &mut cw).unwrap();
            }
        }
        // The last pass left its own sequence 5 old cells and 8 new, the others what their
        // next token (position 16) sees: 11..=15.
        assert_eq!(positions(&w, 3), (3..16).collect::<Vec<_>>());
        for seq in 0..3 {
            assert_eq!(positions(&w, seq), [11, 12, 13, 14, 15], "sequence {seq}");
            assert!(w.holds_window(&full, seq, 16));
        }
    }

    #[test]
    fn each_sequence_drops_only_its_own_cells_and_shared_ones_stay_for_the_others() {
        let (mut full, mut w) = (KvCells::new(64, 2).unwrap(), KvWindow::new(16, 2, 2).unwrap());
        let (mut cf, mut cw) = (Vec::new(), Vec::new());
        let batch = Batch::for_sequence(&[1, 2, 3], 0, 0, 1);
        full.place(&batch, &mut cf).unwrap();
        w.place(&full, &batch, &mut cw).unwrap();
        full.seq_cp(0, 1, 0, 3).unwrap();
        w.cells_mut().seq_cp(0, 1, 0, 3).unwrap();
        let batch = Batch::for_sequence(&[4, 5], 3, 0, 1);
        full.place(&batch, &mut cf).unwrap();
        w.place(&full, &batch, &mut cw).unwrap();
        assert_eq!(positions(&w, 0), [2, 3, 4]);
        assert_eq!(positions(&w, 1), [0, 1, 2], "sequence 1 still sees its own window");
        assert!(w.holds_window(&full, 1, 3));
    }
}
