//! Streaming detokenization: turning tokens into text one at a time without ever emitting a
//! character split across tokens.
//!
//! Byte-level BPE tokens are byte strings; one character's UTF-8 bytes may span several
//! tokens. The decoder holds back an incomplete trailing sequence until the bytes that complete
//! it arrive. Bytes that can never form a character (invalid UTF-8 in the model's output) are
//! passed through as soon as that is certain, so nothing is lost: the concatenation of all
//! pieces plus [`StreamDecoder::finish`] equals the one-shot decode.

use super::Tokenizer;

/// Detokenizes one token at a time, holding back a UTF-8 sequence split across tokens until it completes.
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// `special`: whether control tokens render as their text (as in [`Tokenizer::decode`]).
    pub fn new(tokenizer: &'a Tokenizer, special: bool) -> Self {
        StreamDecoder {
            tokenizer,
            special,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the bytes that are now complete (possibly none).
    pub fn push(&mut self, token: u32) -> Vec<u8> {
        self.pending
            .extend_from_slice(self.tokenizer.token_to_piece(token, self.special));
        let ready = complete_prefix_len(&self.pending);
        let rest = self.pending.split_off(ready);
        std::mem::replace(&mut self.pending, rest)
    }

    /// Flush whatever is held back (an incomplete sequence at the end of the stream).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.pending)
    }
}

/// Length of the longest prefix of `bytes` that does not end inside an incomplete (but still
/// completable) UTF-8 sequence.
fn complete_prefix_len(bytes: &[u8]) -> usize {
    let mut start = 0;
    loop {
        match std::str::from_utf8(&bytes[start..]) {
            Ok(_) => return bytes.len(),
            // An incomplete sequence at the very end: hold it back.
            Err(e) if e.error_len().is_none() => return start + e.valid_up_to(),
            // An invalid sequence: it will never become valid, pass it through and go on.
            Err(e) => start += e.valid_up_to() + e.error_len().unwrap_or(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::complete_prefix_len;

    #[test]
    fn an_incomplete_trailing_character_is_held_back() {
        assert_eq!(complete_prefix_len("ab".as_bytes()), 2);
        assert_eq!(complete_prefix_len(b"ab\xe6\x97"), 2);
        assert_eq!(complete_prefix_len(b"\xe6\x97\xa5"), 3);
        assert_eq!(
            complete_prefix_len(b"\xff\xe6"),
            1,
            "the invalid byte passes, the lead byte waits"
        );
        assert_eq!(
            complete_prefix_len(b"\xe6x"),
            2,
            "a lead byte followed by ASCII can never complete"
        );
    }
}
