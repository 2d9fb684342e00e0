//! A batch: the tokens of one forward pass, each with its position, its sequence and whether
//! its logits are wanted (llama.cpp's `llama_batch`). Several sequences may share a batch; the
//! session places each token in a KV cell and fills the graph's typed inputs from it.
//!
//! It holds data only: no cells, no graph.

/// A sequence id: which sequence of a session's KV cache a token belongs to.
pub type SeqId = usize;

/// The tokens of one forward pass; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Batch {
    tokens: Vec<u32>,
    positions: Vec<i32>,
    seq_ids: Vec<SeqId>,
    logits: Vec<bool>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Batch::default()
    }

    /// `tokens` of sequence `seq` at positions `first_pos..`, the last `n_out` wanting logits.
    pub fn for_sequence(tokens: &[u32], first_pos: usize, seq: SeqId, n_out: usize) -> Self {
        let mut batch = Batch::new();
        batch.push_sequence(tokens, first_pos, seq, n_out);
        batch
    }

    /// Append `tokens` of sequence `seq` at positions `first_pos..`, the last `n_out` wanting
    /// logits.
    pub fn push_sequence(&mut self, tokens: &[u32], first_pos: usize, seq: SeqId, n_out: usize) {
        let n = tokens.len();
        for (i, &token) in tokens.iter().enumerate() {
            self.add(token, (first_pos + i) as i32, seq, i + n_out >= n);
        }
    }

    /// Append one token.
    pub fn add(&mut self, token: u32, pos: i32, seq: SeqId, want_logits: bool) {
        self.tokens.push(token);
        self.positions.push(pos);
        self.seq_ids.push(seq);
        self.logits.push(want_logits);
    }

    /// Empty the batch, keeping its capacity (a decode step reuses one).
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.seq_ids.clear();
        self.logits.clear();
    }

    /// Tokens in the batch.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the batch holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The token ids.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Each token's position in its sequence.
    pub fn positions(&self) -> &[i32] {
        &self.positions
    }

    /// Each token's sequence.
    pub fn seq_ids(&self) -> &[SeqId] {
        &self.seq_ids
    }

    /// Whether each token's logits are wanted.
    pub fn logits(&self) -> &[bool] {
        &self.logits
    }

    /// Rows whose logits are wanted.
    pub fn n_outputs(&self) -> usize {
        self.logits.iter().filter(|&&l| l).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sequence_appends_consecutive_positions_with_logits_for_its_last_tokens() {
        let mut batch = Batch::for_sequence(&[5, 6, 7], 10, 2, 1);
        batch.push_sequence(&[8, 9], 0, 0, 2);
        assert_eq!(batch.tokens(), [5, 6, 7, 8, 9]);
        assert_eq!(batch.positions(), [10, 11, 12, 0, 1]);
        assert_eq!(batch.seq_ids(), [2, 2, 2, 0, 0]);
        assert_eq!(batch.logits(), [false, false, true, true, true]);
        assert_eq!(batch.n_outputs(), 3);
        batch.clear();
        assert!(batch.is_empty());
    }
}
