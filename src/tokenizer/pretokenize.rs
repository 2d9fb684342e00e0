//! Pre-tokenization: splitting text into the words BPE merges within, by the rules of the
//! model's `tokenizer.ggml.pre`.
//!
//! `qwen2` is the regex
//! `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
//! implemented by hand: the look-ahead `(?!\S)` rules out Rust's `regex` crate, and a hand
//! scanner is several times faster than a backtracking engine (see `benches/tokenize.rs`). The
//! scanner works on bytes that need not be valid UTF-8: an invalid byte is one unit of class
//! `Other`, so any byte string round-trips through the tokenizer.

use super::unicode::{classify, CharClass};

/// The pre-tokenizers minfer implements, by their `tokenizer.ggml.pre` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `qwen2`: the Qwen2 regex given in the module docs.
    Qwen2,
}

impl PreTokenizer {
    /// The pre-tokenizer named `name` in `tokenizer.ggml.pre`, or `None` if minfer lacks it.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "qwen2" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    /// Append the byte ranges of the words of `text` to `out`.
    pub fn split(self, text: &[u8], out: &mut Vec<std::ops::Range<usize>>) {
        match self {
            PreTokenizer::Qwen2 => split_qwen2(text, out),
        }
    }
}

/// One character of the input (or one invalid byte).
#[derive(Clone, Copy)]
struct Unit {
    start: usize,
    ch: Option<char>,
    class: CharClass,
}

fn units(text: &[u8]) -> Vec<Unit> {
    let mut out = Vec::with_capacity(text.len());
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        // Decode one character; an invalid or truncated sequence yields one invalid byte.
        let valid = match std::str::from_utf8(&rest[..rest.len().min(4)]) {
            Ok(s) => s,
            Err(e) => std::str::from_utf8(&rest[..e.valid_up_to()]).unwrap_or(""),
        };
        match valid.chars().next() {
            Some(c) => {
                out.push(Unit {
                    start: pos,
                    ch: Some(c),
                    class: classify(c),
                });
                pos += c.len_utf8();
            }
            None => {
                out.push(Unit {
                    start: pos,
                    ch: None,
                    class: CharClass::Other,
                });
                pos += 1;
            }
        }
    }
    out
}

fn split_qwen2(text: &[u8], out: &mut Vec<std::ops::Range<usize>>) {
    let u = units(text);
    let n = u.len();
    let byte_at = |i: usize| if i < n { u[i].start } else { text.len() };
    let class = |i: usize| u.get(i).map(|x| x.class);
    let ch = |i: usize| u.get(i).and_then(|x| x.ch);
    let is_crlf = |i: usize| matches!(ch(i), Some('\r' | '\n'));

    let mut pos = 0;
    while pos < n {
        let start = pos;
        let c = ch(pos);
        let cls = u[pos].class;

        // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
        if c == Some('\'') {
            let lower = |i: usize| ch(i).map(|c| c.to_ascii_lowercase());
            let end = match (lower(pos + 1), lower(pos + 2)) {
                (Some('s' | 't' | 'm' | 'd'), _) => Some(pos + 2),
                (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(pos + 3),
                _ => None,
            };
            if let Some(end) = end {
                out.push(byte_at(start)..byte_at(end));
                pos = end;
                continue;
            }
        }

        // [^\r\n\p{L}\p{N}]?\p{L}+
        if !is_crlf(pos)
            && cls != CharClass::Number
            && (cls == CharClass::Letter || class(pos + 1) == Some(CharClass::Letter))
        {
            pos += 1;
            while class(pos) == Some(CharClass::Letter) {
                pos += 1;
            }
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        // \p{N}
        if cls == CharClass::Number {
            pos += 1;
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
        let punct_at = if c == Some(' ') { pos + 1 } else { pos };
        if class(punct_at) == Some(CharClass::Other) {
            pos = punct_at;
            while class(pos) == Some(CharClass::Other) {
                pos += 1;
            }
            while is_crlf(pos) {
                pos += 1;
            }
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        // Whitespace: \s*[\r\n]+ | \s+(?!\S) | \s+
        let mut end = pos;
        let mut last_newline_end = None;
        while class(end) == Some(CharClass::Whitespace) {
            if is_crlf(end) {
                last_newline_end = Some(end + 1);
            }
            end += 1;
        }
        let run = end - pos;
        pos = if let Some(nl_end) = last_newline_end {
            nl_end
        } else if run > 1 && end < n {
            // Leave the last space to the word that follows it.
            end - 1
        } else if run > 0 {
            end
        } else {
            pos + 1
        };
        out.push(byte_at(start)..byte_at(pos));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        PreTokenizer::Qwen2.split(text.as_bytes(), &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn qwen2_splits_words_digits_punctuation_and_spaces() {
        assert_eq!(words("Hello world"), ["Hello", " world"]);
        assert_eq!(words("I'M they'd"), ["I", "'M", " they", "'d"]);
        assert_eq!(words("x = 123;"), ["x", " =", " ", "1", "2", "3", ";"]);
        assert_eq!(words("a   b"), ["a", "  ", " b"]);
        assert_eq!(words("a  \n\n  b"), ["a", "  \n\n", " ", " b"]);
        assert_eq!(words("end  "), ["end", "  "]);
        assert_eq!(words("(x)\n"), ["(x", ")\n"]);
    }

    #[test]
    fn invalid_bytes_are_single_units_and_nothing_is_lost() {
        let text = b"ab\xffcd\xe6\x97";
        let mut ranges = Vec::new();
        PreTokenizer::Qwen2.split(text, &mut ranges);
        let joined: Vec<u8> = ranges.iter().flat_map(|r| text[r.clone()].to_vec()).collect();
        assert_eq!(joined, text);
    }
}
