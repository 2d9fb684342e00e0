//! SentencePiece-style BPE (`tokenizer.ggml.model = gemma4`, llama.cpp's
//! `LLAMA_VOCAB_PRE_TYPE_GEMMA4`): spaces become `▁` (U+2581), the text is split only into runs
//! of newlines and runs of everything else, and each run is merged by rank from its characters
//! (raw UTF-8, not GPT-2's byte map); a run of newlines that is a token is taken whole, and a
//! character the vocabulary lacks falls back to its bytes' `<0xXX>` tokens. This file turns one
//! text fragment into ids; the vocabulary, the merges and the special tokens are the caller's.

use super::bpe::Merges;
use std::collections::HashMap;

/// Tokenize `text` (a fragment between special tokens) into `out`; `symbols` is scratch.
pub fn tokenize(
    text: &[u8],
    merges: &Merges,
    byte_tokens: &[Option<u32>; 256],
    text_to_id: &HashMap<String, u32>,
    symbols: &mut Vec<u32>,
    out: &mut Vec<u32>,
) {
    let escaped = super::spm::escape_whitespace(text);
    let mut rest = &escaped[..];
    while !rest.is_empty() {
        let newlines = rest[0] == b'\n';
        let len = rest
            .iter()
            .position(|&b| (b == b'\n') != newlines)
            .unwrap_or(rest.len());
        let (word, tail) = rest.split_at(len);
        rest = tail;
        if newlines {
            // llama.cpp looks a run of newlines up whole before merging it.
            if let Some(&id) = std::str::from_utf8(word).ok().and_then(|w| text_to_id.get(w)) {
                out.push(id);
                continue;
            }
        }
        symbols.clear();
        for chunk in word.utf8_chunks() {
            for c in chunk.valid().chars() {
                match text_to_id.get(c.encode_utf8(&mut [0; 4]) as &str) {
                    Some(&id) => symbols.push(id),
                    None => push_bytes(c.encode_utf8(&mut [0; 4]).as_bytes(), byte_tokens, symbols),
                }
            }
            push_bytes(chunk.invalid(), byte_tokens, symbols);
        }
        merges.apply(symbols, out);
    }
}

/// The `<0xXX>` tokens of `bytes`; a byte without one is dropped, as llama.cpp drops it.
fn push_bytes(bytes: &[u8], byte_tokens: &[Option<u32>; 256], symbols: &mut Vec<u32>) {
    symbols.extend(bytes.iter().filter_map(|&b| byte_tokens[b as usize]));
}
