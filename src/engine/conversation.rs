//! A conversation's tokens over a session's sequence 0, for a chat that renders the whole
//! conversation again each turn: what the KV cache already holds is kept, only the new tokens
//! are prefilled, and the context is shifted when it fills, as llama.cpp's conversation mode
//! does.
//!
//! The stream is every token evaluated so far, in order; the session holds a window of it, the
//! first `n_keep` tokens and then everything after the `dropped` tokens that context shifts
//! discarded. A new turn's tokens are matched against the stream: the common prefix stays, the
//! rest of the window is removed and the new tokens are prefilled (a template that rewrites an
//! earlier turn costs re-reading from there on). Only a rewrite inside what was already shifted
//! out cannot be matched; the session then starts over from the new tokens.
//!
//! This file owns the stream's bookkeeping; rendering, generation and terminals are the caller's.

use super::{EngineError, Session};

/// See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct TokenStream {
    /// Every token evaluated into sequence 0 since the last start, shifted out or not.
    history: Vec<u32>,
    /// Tokens discarded by context shifts (those after the first `n_keep`).
    dropped: usize,
}

/// What [`TokenStream::prepare`] left to do: generate from `prompt`, of which the session
/// already holds the first `n_cached` tokens (`generate_cached`'s arguments).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The session's window followed by the new tokens.
    pub prompt: Vec<u32>,
    /// Tokens of `prompt` the session holds.
    pub n_cached: usize,
    /// Tokens the shifts made for this turn discarded.
    pub n_discarded: usize,
}

impl TokenStream {
    /// An empty stream, for a session about to start (it is reset on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream whose session already holds `tokens` in sequence 0 (a saved session loaded).
    pub fn resume(tokens: Vec<u32>) -> Self {
        TokenStream {
            history: tokens,
            dropped: 0,
        }
    }

    /// Tokens discarded by context shifts so far.
    pub fn dropped(&self) -> usize {
        self.dropped
    }

    /// Make `session` ready to continue the conversation whose whole token sequence is
    /// `tokens`: keep what it holds of them, remove the rest, and when the new tokens do not fit,
    /// shift the context (keeping `n_keep`) if `shift`, else fail with
    /// [`EngineError::ContextFull`].
    pub fn prepare(
        &mut self,
        session: &mut Session,
        tokens: &[u32],
        n_keep: usize,
        shift: bool,
    ) -> Result<Prepared, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyBatch);
        }
        let held = session.seq_tokens(0);
        let window_ok = held.len() + self.dropped == self.history.len();
        let mut common = self.history.iter().zip(tokens).take_while(|(a, b)| a == b).count();
        // The last token is always evaluated again, for the logits of the first new one.
        common = common.min(tokens.len() - 1);
        // Going back further than a window cache holds starts over too.
        if !window_ok
            || (self.dropped > 0 && common < n_keep + self.dropped)
            || !session.holds_window(0, common - self.dropped)
        {
            session.reset();
            self.history.clear();
            self.dropped = 0;
            common = 0;
        }
        session.seq_rm(Some(0), (common - self.dropped) as i32, i32::MAX)?;
        self.history.truncate(common);
        let new = &tokens[common..];
        let n_ctx = session.n_ctx();
        let mut n_discarded = 0;
        // Room for the new tokens and at least one generated token.
        while session.n_past() + new.len() >= n_ctx && shift {
            let n_past = session.n_past();
            let n_keep = n_keep.min(n_past);
            let n_discard = (n_past - n_keep) / 2;
            if n_discard == 0 {
                break;
            }
            session.shift_context(n_keep, n_discard)?;
            self.dropped += n_discard;
            n_discarded += n_discard;
        }
        let n_past = session.n_past();
        if n_past + new.len() >= n_ctx {
            if !shift {
                return Err(EngineError::ContextFull {
                    needed: n_past + new.len() + 1,
                    n_past,
                    n_tokens: new.len(),
                    n_ctx,
                });
            }
            // More new tokens than the context holds: start over from the kept start and the
            // most recent tokens, half a context of them, as a shift would have left it.
            let keep = n_keep.min(n_ctx / 2).min(tokens.len() - 1);
            let tail = ((n_ctx - keep) / 2).max(1).min(tokens.len() - keep);
            session.reset();
            self.history = tokens.to_vec();
            self.dropped = tokens.len() - keep - tail;
            let mut prompt = tokens[..keep].to_vec();
            prompt.extend_from_slice(&tokens[tokens.len() - tail..]);
            return Ok(Prepared {
                prompt,
                n_cached: 0,
                n_discarded: n_discarded + self.dropped,
            });
        }
        self.history.extend_from_slice(new);
        let mut prompt = session.seq_tokens(0);
        let n_cached = prompt.len();
        prompt.extend_from_slice(new);
        Ok(Prepared {
            prompt,
            n_cached,
            n_discarded,
        })
    }

    /// Record what a generation evaluated after [`TokenStream::prepare`] (which recorded the
    /// prompt): the generated tokens that went into the cache, with `n_discarded` tokens
    /// shifted out while it ran.
    pub fn record(&mut self, session: &Session, n_discarded: usize) {
        self.dropped += n_discarded;
        let held = session.seq_tokens(0);
        let evaluated = (self.dropped + held.len()).saturating_sub(self.history.len());
        self.history
            .extend_from_slice(&held[held.len() - evaluated.min(held.len())..]);
    }

    /// Forget everything (the session must be reset with it, or hold a prefix of what comes
    /// next).
    pub fn clear(&mut self) {
        self.history.clear();
        self.dropped = 0;
    }
}
