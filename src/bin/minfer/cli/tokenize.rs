//! `minfer tokenize`: what the tokenizer makes of a text, as llama.cpp's `llama-tokenize`
//! shows it (one `id -> 'piece'` line per token), or just the ids as a JSON array.

use minfer::tokenizer::Tokenizer;
use std::fmt::Write;

/// One line per token: the id, right-aligned, and the piece it decodes to (control tokens
/// shown as their text), escaped so that whitespace and invalid bytes are visible.
pub fn pieces_table(tokenizer: &Tokenizer, ids: &[u32]) -> String {
    let mut out = String::new();
    for &id in ids {
        let piece = tokenizer.token_to_piece(id, true);
        let _ = writeln!(out, "{id:>8} -> '{}'", escape_bytes(piece));
    }
    out
}

/// The ids as a JSON array, e.g. `[9707, 1879]`.
pub fn ids_json(ids: &[u32]) -> String {
    let list: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("[{}]", list.join(", "))
}

fn escape_bytes(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.extend(chunk.valid().chars().flat_map(char::escape_debug));
        for b in chunk.invalid() {
            let _ = write!(out, "\\x{b:02x}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_escape_whitespace_quotes_and_invalid_bytes() {
        assert_eq!(escape_bytes(b"a b\n'\xff"), "a b\\n\\'\\xff");
        assert_eq!(ids_json(&[1, 22, 333]), "[1, 22, 333]");
        assert_eq!(ids_json(&[]), "[]");
    }
}
