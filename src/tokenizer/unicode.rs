//! Unicode character classes the pre-tokenizer regexes use: `\p{L}`, `\p{N}`, `\p{P}` and `\s`.
//!
//! `\p{N}` and `\s` are exactly what `char::is_numeric` (general categories Nd, Nl, No) and
//! `char::is_whitespace` (the White_Space property) test. `\p{L}` has no std equivalent
//! (`is_alphabetic` also accepts marks and letter numbers), so its ranges are taken once from
//! the Unicode tables of `regex-syntax`, the crate behind Rust's regex engine.
//!
//! Those tables are newer than llama.cpp's (Unicode 15.1), which leave the characters added since
//! unassigned: of no class at all. Those characters are no letter, number, mark or punctuation
//! here either ([`NEWER_THAN_LLAMA_CPP`]), so every code point has the class llama.cpp gives it
//! (checked against its tables in `tests/fixtures/tokenizer/unicode_classes.txt`).

use std::sync::OnceLock;

/// The class of one character (or of one invalid byte, which is `Other`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CharClass {
    Letter,
    Number,
    Whitespace,
    Other,
}

/// The ranges of a Unicode class, from `regex-syntax`'s tables.
fn class_ranges(class: &str) -> Vec<(u32, u32)> {
    use regex_syntax::hir::{Class, HirKind};
    let hir = regex_syntax::Parser::new().parse(class).expect("a valid Unicode class");
    match hir.kind() {
        HirKind::Class(Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|r| (r.start() as u32, r.end() as u32))
            .collect(),
        other => unreachable!("{class} parsed as {other:?}"),
    }
}

fn letter_ranges() -> &'static [(u32, u32)] {
    static RANGES: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    RANGES.get_or_init(|| class_ranges(r"\p{L}"))
}

fn mark_ranges() -> &'static [(u32, u32)] {
    static RANGES: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    RANGES.get_or_init(|| class_ranges(r"\p{M}"))
}

/// The characters Unicode assigned after 15.1 (the version of llama.cpp's tables) that
/// `regex-syntax`'s tables or std make letters, numbers, marks or punctuation, in runs that also
/// cover the newer symbols and gaps between them (of no class in either). Garay, Gurung Khema,
/// Kirat Rai, Ol Onal, Sunuwar, Tulu-Tigalari, Egyptian hieroglyphs extended-A and a few more.
const NEWER_THAN_LLAMA_CPP: &[(u32, u32)] = &[
    (0x0897, 0x0897),
    (0x1B4E, 0x1B4F),
    (0x1B7F, 0x1B7F),
    (0x1C89, 0x1C8A),
    (0xA7CB, 0xA7CD),
    (0xA7DA, 0xA7DC),
    (0x105C0, 0x105F3),
    (0x10D40, 0x10D85),
    (0x10EC2, 0x10EFC),
    (0x11380, 0x113E2),
    (0x116D0, 0x116E3),
    (0x11BC0, 0x11BF9),
    (0x11DE0, 0x11DE9),
    (0x11F5A, 0x11F5A),
    (0x13460, 0x143FA),
    (0x16100, 0x16139),
    (0x16D40, 0x16D79),
    (0x16FF4, 0x16FF6),
    (0x18CFF, 0x18CFF),
    (0x1CCF0, 0x1CCF9),
    (0x1E5D0, 0x1E5FF),
];

/// Whether llama.cpp's tables leave `c` unassigned though ours give it a class.
fn newer_than_llama_cpp(c: char) -> bool {
    (c as u32) >= 0x0897 && in_ranges(NEWER_THAN_LLAMA_CPP, c)
}

/// Whether `c` has general category M (Mn, Mc, Me): a combining mark.
pub fn is_mark(c: char) -> bool {
    in_ranges(mark_ranges(), c) && !newer_than_llama_cpp(c)
}

fn punctuation_ranges() -> &'static [(u32, u32)] {
    static RANGES: OnceLock<Vec<(u32, u32)>> = OnceLock::new();
    RANGES.get_or_init(|| class_ranges(r"\p{P}"))
}

/// Whether `c` has general category L (Lu, Ll, Lt, Lm, Lo).
pub fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_alphabetic();
    }
    in_ranges(letter_ranges(), c) && !newer_than_llama_cpp(c)
}

/// Whether `c` has general category P (Pc, Pd, Ps, Pe, Pi, Pf, Po): in ASCII, the punctuation
/// but `$+<=>^`|~`, which are symbols (S).
pub fn is_punctuation(c: char) -> bool {
    in_ranges(punctuation_ranges(), c) && !newer_than_llama_cpp(c)
}

fn in_ranges(ranges: &[(u32, u32)], c: char) -> bool {
    let c = c as u32;
    ranges
        .binary_search_by(|&(start, end)| {
            if end < c {
                std::cmp::Ordering::Less
            } else if start > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

pub fn classify(c: char) -> CharClass {
    if is_letter(c) {
        CharClass::Letter
    } else if c.is_numeric() && !newer_than_llama_cpp(c) {
        CharClass::Number
    } else if c.is_whitespace() {
        CharClass::Whitespace
    } else {
        CharClass::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_numbers_and_spaces_are_classified_like_the_regex_classes() {
        assert_eq!(classify('a'), CharClass::Letter);
        assert_eq!(classify('語'), CharClass::Letter);
        assert_eq!(classify('é'), CharClass::Letter);
        assert_eq!(classify('\u{0301}'), CharClass::Other, "a combining mark is M, not L");
        assert_eq!(classify('Ⅻ'), CharClass::Number, "letter numbers are N, not L");
        assert_eq!(classify('٣'), CharClass::Number);
        assert_eq!(classify('\u{3000}'), CharClass::Whitespace);
        assert_eq!(classify('\u{a0}'), CharClass::Whitespace);
        for c in "!\"#%&'()*,-./:;?@[\\]_{}、。「」—…¿".chars() {
            assert!(is_punctuation(c), "{c:?} is punctuation");
        }
        for c in "$+<=>^`|~a1 €".chars() {
            assert!(!is_punctuation(c), "{c:?} is not punctuation");
        }
        assert_eq!(classify('🚀'), CharClass::Other);
        assert_eq!(classify('_'), CharClass::Other);
    }

    #[test]
    fn every_code_point_has_the_class_llama_cpp_gives_it() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/unicode_classes.txt");
        let runs = std::fs::read_to_string(path).unwrap();
        let mut next = 0;
        for line in runs.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let [first, last, class] = fields[..] else {
                panic!("bad line {line:?}")
            };
            let (first, last) = (
                u32::from_str_radix(first, 16).unwrap(),
                u32::from_str_radix(last, 16).unwrap(),
            );
            assert_eq!(first, next, "the runs cover every code point in order");
            next = last + 1;
            for c in (first..=last).filter_map(char::from_u32) {
                let ours = match classify(c) {
                    CharClass::Whitespace => "W",
                    CharClass::Number => "N",
                    CharClass::Letter => "L",
                    CharClass::Other if is_mark(c) => "M",
                    CharClass::Other if is_punctuation(c) => "P",
                    CharClass::Other => "O",
                };
                assert_eq!(ours, class, "U+{:04X}", c as u32);
            }
        }
        assert_eq!(next, 0x110000);
    }
}
