//! Pre-tokenization: splitting text into the words BPE merges within, by the rules of the
//! model's `tokenizer.ggml.pre`.
//!
//! `qwen2` is the regex
//! `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
//! implemented by hand: the look-ahead `(?!\S)` rules out Rust's `regex` crate, and a hand
//! scanner is several times faster than a backtracking engine (see `benches/tokenize.rs`).
//!
//! `gpt-2` (and the names llama.cpp gives the same rule: `mpt`, `olmo`, `phi-2`, ...) is GPT-2's
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`, scanned as
//! llama.cpp's `unicode_regex_split_custom_gpt2` scans it (contractions lower-case only; a space
//! joins only the word after it). `smollm` (and `starcoder`, `refact`, `command-r`, ...) first
//! cuts every `\p{N}` character out as a word of its own, then splits the text between with
//! GPT-2's rule.
//!
//! `gpt-4o` (gpt-oss's o200k vocabulary; llama.cpp gives `llama4`, `kanana2`, `talkie` and
//! `minimax-m2` the same regex) is tiktoken's o200k rule as llama.cpp rewrote it for
//! `std::regex`:
//! `[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
//! Upper and lower case are only ASCII's there: llama.cpp has no scanner of its own for this
//! regex and runs it over text where every non-ASCII letter is one and the same byte, which is
//! both `[^a-z]` and `[^A-Z]`. So `ÉA` splits as `É`, `A` (tiktoken keeps it whole), and combining
//! marks are no letters (tiktoken's `\p{M}` joins them to their word). `split_gpt4o` follows
//! `std::regex`'s backtracking to the same words.
//!
//! Every scanner works on bytes that need not be valid UTF-8: an invalid byte is one unit of class
//! `Other`, so any byte string round-trips through the tokenizer.

use super::unicode::{classify, CharClass};

/// The pre-tokenizers minfer implements, by their `tokenizer.ggml.pre` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `qwen2`: the Qwen2 regex given in the module docs.
    Qwen2,
    /// `qwen35`: Qwen2's regex with combining marks counted as letters (`[\p{L}\p{M}]+`).
    Qwen35,
    /// `llama-bpe` (Llama 3) and its aliases: Qwen2's regex with digits in runs of up to three
    /// (`\p{N}{1,3}`); whole words found in the vocabulary skip the merges (llama.cpp's
    /// `ignore_merges`).
    Llama3,
    /// `gpt-2` and its aliases: GPT-2's regex.
    Gpt2,
    /// `smollm` and its aliases: each digit alone, then GPT-2's regex between them.
    DigitsThenGpt2,
    /// `deepseek-llm`: llama.cpp's six regexes for it, applied in turn (see [`DEEPSEEK_LLM`]).
    DeepseekLlm,
    /// `deepseek-coder`: llama.cpp's five regexes for it, applied in turn (see [`DEEPSEEK_CODER`]).
    DeepseekCoder,
    /// `falcon`: punctuation runs, GPT-2's regex, then runs of three digits (see [`FALCON`]).
    Falcon,
    /// `gpt-4o` and its aliases: words split before an ASCII capital that follows lower case,
    /// contractions kept on their word, digits in runs of up to three, punctuation with the
    /// newlines and slashes after it (see the module docs).
    Gpt4o,
}

/// The `tokenizer.ggml.pre` names of each pre-tokenizer, as llama.cpp's `llama_vocab` maps them
/// (names llama.cpp gives other rules, or extra behaviour minfer lacks, are not here).
const NAMES: &[(&str, PreTokenizer)] = &[
    ("qwen2", PreTokenizer::Qwen2),
    ("qwen35", PreTokenizer::Qwen35),
    ("llama3", PreTokenizer::Llama3),
    ("llama-v3", PreTokenizer::Llama3),
    ("llama-bpe", PreTokenizer::Llama3),
    ("falcon3", PreTokenizer::Llama3),
    ("falcon-h1", PreTokenizer::Llama3),
    ("pixtral", PreTokenizer::Llama3),
    ("midm-2.0", PreTokenizer::Llama3),
    ("lfm2", PreTokenizer::Llama3),
    ("gpt-2", PreTokenizer::Gpt2),
    ("phi-2", PreTokenizer::Gpt2),
    ("jina-es", PreTokenizer::Gpt2),
    ("jina-de", PreTokenizer::Gpt2),
    ("gigachat", PreTokenizer::Gpt2),
    ("jina-v2-es", PreTokenizer::Gpt2),
    ("jina-v2-de", PreTokenizer::Gpt2),
    ("a.x-4.0", PreTokenizer::Gpt2),
    ("mellum", PreTokenizer::Gpt2),
    ("modern-bert", PreTokenizer::Gpt2),
    ("exaone4", PreTokenizer::Gpt2),
    ("mpt", PreTokenizer::Gpt2),
    ("olmo", PreTokenizer::Gpt2),
    ("jais", PreTokenizer::Gpt2),
    ("trillion", PreTokenizer::Gpt2),
    ("granite-docling", PreTokenizer::Gpt2),
    ("deepseek-llm", PreTokenizer::DeepseekLlm),
    ("deepseek-coder", PreTokenizer::DeepseekCoder),
    ("falcon", PreTokenizer::Falcon),
    ("smollm", PreTokenizer::DigitsThenGpt2),
    ("starcoder", PreTokenizer::DigitsThenGpt2),
    ("refact", PreTokenizer::DigitsThenGpt2),
    ("command-r", PreTokenizer::DigitsThenGpt2),
    ("exaone", PreTokenizer::DigitsThenGpt2),
    ("minerva-7b", PreTokenizer::DigitsThenGpt2),
    ("mellum2", PreTokenizer::DigitsThenGpt2),
    ("gpt-4o", PreTokenizer::Gpt4o),
    ("llama4", PreTokenizer::Gpt4o),
    ("kanana2", PreTokenizer::Gpt4o),
    ("talkie", PreTokenizer::Gpt4o),
    ("minimax-m2", PreTokenizer::Gpt4o),
];

impl PreTokenizer {
    /// The pre-tokenizer named `name` in `tokenizer.ggml.pre`, or `None` if minfer lacks it.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES.iter().find(|(n, _)| *n == name).map(|&(_, pre)| pre)
    }

    /// Every `tokenizer.ggml.pre` name minfer accepts, for error messages.
    pub fn names() -> impl Iterator<Item = &'static str> {
        NAMES.iter().map(|(n, _)| *n)
    }

    /// Whether a whole word that is a token is taken as it is, without merges (llama.cpp's
    /// `ignore_merges`, set for Llama 3's pre-tokenizers; not for `gpt-4o`, although tiktoken
    /// itself looks whole words up first).
    pub fn ignores_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Append the byte ranges of the words of `text` to `out`.
    pub fn split(self, text: &[u8], out: &mut Vec<std::ops::Range<usize>>) {
        match self {
            PreTokenizer::Qwen2 => split_qwen2(text, 1, false, out),
            PreTokenizer::Qwen35 => split_qwen2(text, 1, true, out),
            PreTokenizer::Llama3 => split_qwen2(text, 3, false, out),
            PreTokenizer::Gpt2 => {
                let u = units(text);
                split_gpt2(text, &u, 0..u.len(), out)
            }
            PreTokenizer::DeepseekLlm => split_steps(text, DEEPSEEK_LLM, out),
            PreTokenizer::DeepseekCoder => split_steps(text, DEEPSEEK_CODER, out),
            PreTokenizer::Falcon => split_steps(text, FALCON, out),
            PreTokenizer::Gpt4o => split_gpt4o(text, out),
            PreTokenizer::DigitsThenGpt2 => {
                let u = units(text);
                let mut run_start = 0;
                for (i, unit) in u.iter().enumerate() {
                    if unit.class == CharClass::Number {
                        split_gpt2(text, &u, run_start..i, out);
                        out.push(unit.start..u.get(i + 1).map_or(text.len(), |n| n.start));
                        run_start = i + 1;
                    }
                }
                split_gpt2(text, &u, run_start..u.len(), out);
            }
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

/// Where the contraction `'s|'t|'re|'ve|'m|'ll|'d` that starts at the apostrophe at `pos` ends
/// (`ch(i)` is the character at unit `i`, `None` past the piece), in any case letters or in
/// lower case only.
fn contraction_end(ch: &dyn Fn(usize) -> Option<char>, pos: usize, any_case: bool) -> Option<usize> {
    let letter = |i: usize| ch(i).map(|c| if any_case { c.to_ascii_lowercase() } else { c });
    match (letter(pos + 1), letter(pos + 2)) {
        (Some('s' | 't' | 'm' | 'd'), _) => Some(pos + 2),
        (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l')) => Some(pos + 3),
        _ => None,
    }
}

/// Qwen2's rule, with digits in runs of at most `max_digits` (1 for Qwen2, 3 for Llama 3).
fn split_qwen2(text: &[u8], max_digits: usize, marks_are_letters: bool, out: &mut Vec<std::ops::Range<usize>>) {
    let u = units(text);
    let n = u.len();
    let byte_at = |i: usize| if i < n { u[i].start } else { text.len() };
    // Qwen3.5's regex takes combining marks with the letters (`[\p{L}\p{M}]+`).
    let classes: Vec<CharClass> = u
        .iter()
        .map(|x| match x.ch {
            Some(c) if marks_are_letters && x.class == CharClass::Other && super::unicode::is_mark(c) => {
                CharClass::Letter
            }
            _ => x.class,
        })
        .collect();
    let class = |i: usize| classes.get(i).copied();
    let ch = |i: usize| u.get(i).and_then(|x| x.ch);
    let is_crlf = |i: usize| matches!(ch(i), Some('\r' | '\n'));

    let mut pos = 0;
    while pos < n {
        let start = pos;
        let c = ch(pos);
        let cls = classes[pos];

        // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
        if c == Some('\'') {
            if let Some(end) = contraction_end(&ch, pos, true) {
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

        // \p{N}{1,max_digits}
        if cls == CharClass::Number {
            pos += 1;
            while pos - start < max_digits && class(pos) == Some(CharClass::Number) {
                pos += 1;
            }
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

        pos = space_end(&class, &is_crlf, pos, n);
        out.push(byte_at(start)..byte_at(pos));
    }
}

/// Where `\s*[\r\n]+|\s+(?!\S)|\s+` matched at unit `pos` ends (of `n` units): through the
/// last newline of the whitespace run, else all of the run but the space before a word, else
/// (nothing matches) the one unit at `pos`.
fn space_end(
    class: &dyn Fn(usize) -> Option<CharClass>,
    is_crlf: &dyn Fn(usize) -> bool,
    pos: usize,
    n: usize,
) -> usize {
    let mut end = pos;
    let mut last_newline_end = None;
    while class(end) == Some(CharClass::Whitespace) {
        if is_crlf(end) {
            last_newline_end = Some(end + 1);
        }
        end += 1;
    }
    let run = end - pos;
    if let Some(nl_end) = last_newline_end {
        nl_end
    } else if run > 1 && end < n {
        // Leave the last space to the word that follows it.
        end - 1
    } else if run > 0 {
        end
    } else {
        pos + 1
    }
}

/// The `gpt-4o` rule (module docs), as `std::regex` matches it over llama.cpp's collapsed text.
fn split_gpt4o(text: &[u8], out: &mut Vec<std::ops::Range<usize>>) {
    let u = units(text);
    let n = u.len();
    let byte_at = |i: usize| if i < n { u[i].start } else { text.len() };
    let class = |i: usize| u.get(i).map(|x| x.class);
    let ch = |i: usize| u.get(i).and_then(|x| x.ch);
    let is_crlf = |i: usize| matches!(ch(i), Some('\r' | '\n'));
    let letter = |i: usize| class(i) == Some(CharClass::Letter);
    // `(?=[\p{L}])([^a-z])` and `(?=[\p{L}])([^A-Z])`: a non-ASCII letter is both.
    let upper = |i: usize| letter(i) && !matches!(ch(i), Some('a'..='z'));
    let lower = |i: usize| letter(i) && !matches!(ch(i), Some('A'..='Z'));

    let mut pos = 0;
    while pos < n {
        let start = pos;
        let cls = u[pos].class;

        // [^\r\n\p{L}\p{N}]? then `U*L+` or `U+L*`, then a contraction: the optional
        // character is taken whenever a letter follows it.
        let letters_at = if cls == CharClass::Letter {
            Some(pos)
        } else if !is_crlf(pos) && cls != CharClass::Number && letter(pos + 1) {
            Some(pos + 1)
        } else {
            None
        };
        if let Some(s) = letters_at {
            let mut upper_end = s;
            while upper(upper_end) {
                upper_end += 1;
            }
            let mut end = if lower(upper_end) {
                // `U*` then `L+` from an ASCII lower-case letter on.
                let mut e = upper_end;
                while lower(e) {
                    e += 1;
                }
                e
            } else if let Some(last) = (s..upper_end).rev().find(|&i| lower(i)) {
                // `U*` gives back letters until `L+` can take one: the last non-ASCII letter,
                // which ends the word before any ASCII capitals after it.
                last + 1
            } else {
                // Only ASCII capitals: `U+L*`.
                upper_end
            };
            if ch(end) == Some('\'') {
                if let Some(e) = contraction_end(&ch, end, true) {
                    end = e;
                }
            }
            out.push(byte_at(start)..byte_at(end));
            pos = end;
            continue;
        }

        // \p{N}{1,3}
        if cls == CharClass::Number {
            pos += 1;
            while pos - start < 3 && class(pos) == Some(CharClass::Number) {
                pos += 1;
            }
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
        let punct_at = if ch(pos) == Some(' ') { pos + 1 } else { pos };
        if class(punct_at) == Some(CharClass::Other) {
            pos = punct_at;
            while class(pos) == Some(CharClass::Other) {
                pos += 1;
            }
            while is_crlf(pos) || ch(pos) == Some('/') {
                pos += 1;
            }
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        pos = space_end(&class, &is_crlf, pos, n);
        out.push(byte_at(start)..byte_at(pos));
    }
}

/// One regex of a pre-tokenizer that llama.cpp runs through `std::regex` rather than a scanner of
/// its own: each piece so far is cut into its matches and the text between them.
#[derive(Clone, Copy)]
enum Step {
    /// `[C]`: every character of the class alone.
    Each(fn(char) -> bool),
    /// `\s?[C]+` (with the optional leading whitespace character) or `[C]+`.
    Run { space: bool, class: fn(char) -> bool },
    /// `\s+$`: the whitespace that ends the piece.
    TrailingSpace,
    /// `[C][C][C]`: three characters of the class together.
    Triple(fn(char) -> bool),
    /// GPT-2's regex, which llama.cpp runs through its own scanner ([`split_gpt2`]).
    Gpt2,
}

/// Whether `c` is whitespace as llama.cpp's regexes see it.
fn is_space(c: char) -> bool {
    classify(c) == CharClass::Whitespace
}

/// llama.cpp hands `std::regex` the text with every non-ASCII whitespace character replaced by
/// U+000B, so such a character is in no class of these regexes but `\s`.
fn in_class(c: char, ranges: &[(char, char)]) -> bool {
    !(c as u32 > 0x7f && is_space(c)) && ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi)
}

/// DeepSeek LLM's letters (its tokenizer's class, as llama.cpp lists it).
const DEEPSEEK_LETTERS: &[(char, char)] = &[
    ('A', 'Z'),
    ('a', 'z'),
    ('µ', 'µ'),
    ('À', 'Ö'),
    ('Ø', 'ö'),
    ('ø', 'ƺ'),
    ('Ƽ', 'ƿ'),
    ('Ǆ', 'ʓ'),
    ('ʕ', 'ʯ'),
    ('Ͱ', 'ͳ'),
    ('Ͷ', 'ͷ'),
    ('ͻ', 'ͽ'),
    ('Ϳ', 'Ϳ'),
    ('Ά', 'Ά'),
    ('Έ', 'Ί'),
    ('Ό', 'Ό'),
    ('Ύ', 'Ρ'),
    ('Σ', 'ϵ'),
    ('Ϸ', 'ҁ'),
    ('Ҋ', 'ԯ'),
    ('Ա', 'Ֆ'),
    ('Ⴀ', 'Ⴥ'),
    ('Ꭰ', 'Ᏽ'),
    ('ᏸ', 'ᏽ'),
    ('Ა', 'Ჺ'),
    ('Ჽ', 'Ჿ'),
    ('ᴀ', 'ᴫ'),
    ('ᵫ', 'ᵷ'),
    ('ᵹ', 'ᶚ'),
    ('Ḁ', 'ἕ'),
    ('Ἐ', 'Ἕ'),
    ('ἠ', 'ὅ'),
    ('Ὀ', 'Ὅ'),
    ('ὐ', 'ὗ'),
    ('Ὑ', 'Ὑ'),
    ('Ὓ', 'Ὓ'),
    ('Ὕ', 'Ὕ'),
    ('Ὗ', 'ώ'),
    ('ᾀ', 'ᾴ'),
    ('ᾶ', 'ᾼ'),
    ('ι', 'ι'),
    ('ῂ', 'ῄ'),
    ('ῆ', 'ῌ'),
    ('ῐ', 'ΐ'),
    ('ῖ', 'Ί'),
    ('ῠ', 'Ῥ'),
    ('ῲ', 'ῴ'),
    ('ῶ', 'ῼ'),
    ('ℂ', 'ℂ'),
    ('ℇ', 'ℇ'),
    ('ℊ', 'ℓ'),
    ('ℕ', 'ℕ'),
    ('ℙ', 'ℝ'),
    ('ℤ', 'ℤ'),
    ('Ω', 'Ω'),
    ('ℨ', 'ℨ'),
    ('K', 'ℭ'),
    ('ℯ', 'ℴ'),
    ('ℹ', 'ℹ'),
    ('ℼ', 'ℿ'),
    ('ⅅ', 'ⅉ'),
    ('ⅎ', 'ⅎ'),
    ('Ↄ', 'ↄ'),
    ('Ⰰ', 'ⱻ'),
    ('Ȿ', 'ⳤ'),
    ('Ⳬ', 'ⳮ'),
    ('Ⳳ', 'ⳳ'),
    ('Ꙁ', 'ꙭ'),
    ('Ꚁ', 'ꚛ'),
    ('Ꜣ', 'ꝯ'),
    ('ꝱ', 'ꞇ'),
    ('Ꞌ', 'ꞎ'),
    ('ꭰ', 'ꮿ'),
    ('ﬀ', 'ﬆ'),
    ('ﬓ', 'ﬗ'),
    ('Ａ', 'Ｚ'),
    ('ａ', 'ｚ'),
    ('𐐀', '𐑏'),
    ('𐒰', '𐓓'),
    ('𐓘', '𐓻'),
    ('𐲀', '𐲲'),
    ('𐳀', '𐳲'),
    ('𑢠', '𑣟'),
    ('𞤀', '𞥃'),
];

/// DeepSeek LLM's punctuation: ASCII's, its full-width forms, curly quotes and the ideographic
/// full stops.
const DEEPSEEK_PUNCT: &[(char, char)] = &[
    ('!', '/'),
    (':', '~'),
    ('！', '／'),
    ('：', '～'),
    ('‘', '‟'),
    ('　', '。'),
];

/// The CJK ranges DeepSeek LLM keeps together.
const DEEPSEEK_CJK: &[(char, char)] = &[('一', '龥'), ('ࠀ', '一'), ('가', '퟿')];

/// `deepseek-llm`'s regexes, in llama.cpp's order: `[\r\n]`, `\s?[letters]+`, `\s?[punct]+`,
/// `\s+$`, `[CJK]+`, `\p{N}+`.
const DEEPSEEK_LLM: &[Step] = &[
    Step::Each(is_newline),
    Step::Run {
        space: true,
        class: is_deepseek_letter,
    },
    Step::Run {
        space: true,
        class: is_deepseek_punct,
    },
    Step::TrailingSpace,
    Step::Run {
        space: false,
        class: is_deepseek_cjk,
    },
    Step::Run {
        space: false,
        class: is_number,
    },
];

/// `deepseek-coder`'s regexes, in llama.cpp's order: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`,
/// `[CJK]+` and `\p{N}` (each digit alone).
const DEEPSEEK_CODER: &[Step] = &[
    Step::Each(is_newline),
    Step::Run {
        space: true,
        class: is_collapsed_letter,
    },
    Step::Run {
        space: true,
        class: is_collapsed_punctuation,
    },
    Step::Run {
        space: false,
        class: is_deepseek_cjk,
    },
    Step::Each(is_number),
];

/// `falcon`'s regexes, in llama.cpp's order: ``[\p{P}\$\+<=>\^~\|`]+``, GPT-2's, and
/// `[0-9][0-9][0-9]`.
const FALCON: &[Step] = &[
    Step::Run {
        space: false,
        class: is_falcon_punctuation,
    },
    Step::Gpt2,
    Step::Triple(|c| c.is_ascii_digit()),
];

/// `\p{L}` as llama.cpp's collapsed regexes see it (non-ASCII whitespace is no letter).
fn is_collapsed_letter(c: char) -> bool {
    !is_space(c) && classify(c) == CharClass::Letter
}

/// `\p{P}` as llama.cpp's collapsed regexes see it.
fn is_collapsed_punctuation(c: char) -> bool {
    !(c as u32 > 0x7f && is_space(c)) && super::unicode::is_punctuation(c)
}

/// Falcon's punctuation class: `\p{P}` and the ASCII symbols `$+<=>^~|``.
fn is_falcon_punctuation(c: char) -> bool {
    is_collapsed_punctuation(c) || "$+<=>^~|`".contains(c)
}

fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}

fn is_deepseek_letter(c: char) -> bool {
    in_class(c, DEEPSEEK_LETTERS)
}

fn is_deepseek_punct(c: char) -> bool {
    in_class(c, DEEPSEEK_PUNCT)
}

fn is_deepseek_cjk(c: char) -> bool {
    in_class(c, DEEPSEEK_CJK)
}

fn is_number(c: char) -> bool {
    classify(c) == CharClass::Number
}

/// `steps` applied in turn to `text`: every piece of one step is cut by the next, as llama.cpp's
/// `unicode_regex_split` cuts its offsets regex after regex.
fn split_steps(text: &[u8], steps: &[Step], out: &mut Vec<std::ops::Range<usize>>) {
    let u = units(text);
    let ch = |i: usize| u[i].ch;
    // The whole text is the first piece.
    let mut pieces: Vec<std::ops::Range<usize>> = std::iter::once(0..u.len()).collect();
    for step in steps {
        let mut next = Vec::with_capacity(pieces.len());
        for piece in pieces {
            let (lo, hi) = (piece.start, piece.end);
            let mut last = lo;
            let emit = |m: std::ops::Range<usize>, last: &mut usize, next: &mut Vec<std::ops::Range<usize>>| {
                if m.start > *last {
                    next.push(*last..m.start);
                }
                *last = m.end;
                next.push(m);
            };
            let member = |i: usize, class: fn(char) -> bool| i < hi && ch(i).is_some_and(class);
            let space = |i: usize| i < hi && ch(i).is_some_and(is_space);
            if let Step::Gpt2 = step {
                // GPT-2's words, in bytes, back to units (every word starts on a unit).
                let mut words = Vec::new();
                split_gpt2(text, &u, lo..hi, &mut words);
                let unit_at = |b: usize| u.partition_point(|x| x.start < b);
                next.extend(words.into_iter().map(|w| unit_at(w.start)..unit_at(w.end)));
                continue;
            }
            if let Step::TrailingSpace = step {
                let mut t = hi;
                while t > lo && space(t - 1) {
                    t -= 1;
                }
                if t < hi {
                    emit(t..hi, &mut last, &mut next);
                }
                if last < hi {
                    next.push(last..hi);
                }
                continue;
            }
            let mut i = lo;
            while i < hi {
                let found = match *step {
                    Step::Each(class) => member(i, class).then(|| i..i + 1),
                    Step::Run { space: lead, class } => {
                        let start = if lead && space(i) && member(i + 1, class) {
                            Some(i + 1)
                        } else if member(i, class) {
                            Some(i)
                        } else {
                            None
                        };
                        start.map(|mut end| {
                            while member(end, class) {
                                end += 1;
                            }
                            i..end
                        })
                    }
                    Step::Triple(class) => {
                        (member(i, class) && member(i + 1, class) && member(i + 2, class)).then(|| i..i + 3)
                    }
                    Step::TrailingSpace | Step::Gpt2 => unreachable!("handled above"),
                };
                match found {
                    Some(m) => {
                        i = m.end;
                        emit(m, &mut last, &mut next);
                    }
                    None => i += 1,
                }
            }
            if last < hi {
                next.push(last..hi);
            }
        }
        pieces = next;
    }
    let byte_at = |i: usize| if i < u.len() { u[i].start } else { text.len() };
    out.extend(pieces.into_iter().map(|p| byte_at(p.start)..byte_at(p.end)));
}

/// GPT-2's rule on the units `span` of `text` (a piece of its own: nothing outside it is seen,
/// as llama.cpp's `unicode_regex_split_custom_gpt2` sees only its offsets).
fn split_gpt2(text: &[u8], u: &[Unit], span: std::ops::Range<usize>, out: &mut Vec<std::ops::Range<usize>>) {
    let (lo, hi) = (span.start, span.end);
    let byte_at = |i: usize| if i < u.len() { u[i].start } else { text.len() };
    let class = |i: usize| (i < hi).then(|| u[i].class);
    let ch = |i: usize| if i < hi { u[i].ch } else { None };
    let mut pos = lo;
    while pos < hi {
        let start = pos;
        let c = ch(pos);

        // 's|'t|'re|'ve|'m|'ll|'d (lower case only)
        if c == Some('\'') {
            if let Some(end) = contraction_end(&ch, pos, false) {
                out.push(byte_at(start)..byte_at(end));
                pos = end;
                continue;
            }
        }

        // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': a space joins the run after it.
        let lead = usize::from(c == Some(' '));
        let run_class = class(pos + lead);
        if let Some(cls @ (CharClass::Letter | CharClass::Number | CharClass::Other)) = run_class {
            pos += lead;
            while class(pos) == Some(cls) {
                pos += 1;
            }
            out.push(byte_at(start)..byte_at(pos));
            continue;
        }

        // \s+(?!\S) | \s+
        let mut end = pos;
        while class(end) == Some(CharClass::Whitespace) {
            end += 1;
        }
        let run = end - pos;
        pos = if run > 1 && end < hi {
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
        words_of(PreTokenizer::Qwen2, text)
    }

    fn words_of(pre: PreTokenizer, text: &str) -> Vec<&str> {
        let mut ranges = Vec::new();
        pre.split(text.as_bytes(), &mut ranges);
        ranges.into_iter().map(|r| &text[r]).collect()
    }

    #[test]
    fn gpt2_joins_one_leading_space_and_keeps_contractions_lower_case() {
        let w = |t| words_of(PreTokenizer::Gpt2, t);
        assert_eq!(w("Hello world"), ["Hello", " world"]);
        assert_eq!(w("I'M they'd"), ["I", "'", "M", " they", "'d"]);
        assert_eq!(w("x = 123;"), ["x", " =", " 123", ";"]);
        assert_eq!(w("a   b"), ["a", "  ", " b"]);
        assert_eq!(w("a\n\n b"), ["a", "\n\n", " b"]);
        assert_eq!(w("end  "), ["end", "  "]);
        assert_eq!(w("(x)\n"), ["(", "x", ")", "\n"]);
    }

    #[test]
    fn llama3_keeps_digits_in_runs_of_three_and_takes_contractions_in_any_case() {
        let w = |t| words_of(PreTokenizer::Llama3, t);
        assert_eq!(w("x = 1234567;"), ["x", " =", " ", "123", "456", "7", ";"]);
        assert_eq!(w("I'M they'd"), ["I", "'M", " they", "'d"]);
        assert!(PreTokenizer::Llama3.ignores_merges() && !PreTokenizer::Qwen2.ignores_merges());
    }

    #[test]
    fn deepseek_llm_applies_its_regexes_in_turn() {
        let w = |t| words_of(PreTokenizer::DeepseekLlm, t);
        assert_eq!(w("Hello world!\n"), ["Hello", " world", "!", "\n"]);
        assert_eq!(w("x = 1234  "), ["x", " =", " ", "1234", "  "]);
        assert_eq!(w("東京 tower"), ["東京", " tower"]);
    }

    #[test]
    fn smollm_cuts_every_digit_out_before_gpt2s_rule() {
        let w = |t| words_of(PreTokenizer::DigitsThenGpt2, t);
        assert_eq!(w("x = 123;"), ["x", " =", " ", "1", "2", "3", ";"]);
        assert_eq!(w("v2.0 it's"), ["v", "2", ".", "0", " it", "'s"]);
        // The spaces end their piece (the digit is cut out first), so nothing follows them there.
        assert_eq!(w("a  1"), ["a", "  ", "1"]);
    }

    #[test]
    fn gpt4o_splits_at_ascii_case_and_keeps_contractions_on_their_word() {
        let w = |t| words_of(PreTokenizer::Gpt4o, t);
        assert_eq!(
            w("CamelCase parseHTTPResponse"),
            ["Camel", "Case", " parse", "HTTPResponse"]
        );
        assert_eq!(w("DON'T they'Re I'M"), ["DON'T", " they'Re", " I'M"]);
        assert_eq!(w("x = 1234567;"), ["x", " =", " ", "123", "456", "7", ";"]);
        // Punctuation takes the newlines and slashes after it; a space before a word joins it.
        assert_eq!(w("a/b/c\n"), ["a", "/b", "/c", "\n"]);
        assert_eq!(w("x.//\n/y"), ["x", ".//\n/", "y"]);
        assert_eq!(w("a  \n\n  b"), ["a", "  \n\n", " ", " b"]);
        assert!(!PreTokenizer::Gpt4o.ignores_merges());
    }

    #[test]
    fn gpt4o_treats_a_non_ascii_letter_as_both_cases_and_a_mark_as_punctuation() {
        let w = |t| words_of(PreTokenizer::Gpt4o, t);
        // `U*` gives `É` back to `L+`, so the ASCII capitals after it are a word of their own.
        assert_eq!(w("ÉA ÉAb aÉB Été"), ["É", "A", " ÉAb", " aÉ", "B", " Été"]);
        assert_eq!(w("ÀÉÎ's"), ["ÀÉÎ's"]);
        // A combining mark is no letter: it leads the letters after it, or stands as punctuation.
        assert_eq!(w("e\u{301}e A\u{301}"), ["e", "\u{301}e", " A", "\u{301}"]);
    }

    #[test]
    fn every_name_maps_to_its_rule_and_others_are_unknown() {
        assert_eq!(PreTokenizer::from_name("smollm"), Some(PreTokenizer::DigitsThenGpt2));
        assert_eq!(PreTokenizer::from_name("gpt-2"), Some(PreTokenizer::Gpt2));
        assert_eq!(PreTokenizer::from_name("qwen2"), Some(PreTokenizer::Qwen2));
        assert_eq!(PreTokenizer::from_name("llama-bpe-ish"), None);
        assert!(PreTokenizer::names().any(|n| n == "starcoder"));
        assert_eq!(PreTokenizer::from_name("gpt-4o"), Some(PreTokenizer::Gpt4o));
        assert_eq!(PreTokenizer::from_name("minimax-m2"), Some(PreTokenizer::Gpt4o));
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
