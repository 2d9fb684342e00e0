//! Unicode character classes the pre-tokenizer regexes use: `\p{L}`, `\p{N}`, `\p{P}` and `\s`.
//!
//! `\p{N}` and `\s` are exactly what `char::is_numeric` (general categories Nd, Nl, No) and
//! `char::is_whitespace` (the White_Space property) test. `\p{L}` has no std equivalent
//! (`is_alphabetic` also accepts marks and letter numbers), so its ranges are taken once from
//! the Unicode tables of `regex-syntax`, the crate behind Rust's regex engine.

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

/// Whether `c` has general category M (Mn, Mc, Me): a combining mark.
pub fn is_mark(c: char) -> bool {
    in_ranges(mark_ranges(), c)
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
    in_ranges(letter_ranges(), c)
}

/// Whether `c` has general category P (Pc, Pd, Ps, Pe, Pi, Pf, Po): in ASCII, the punctuation
/// but `$+<=>^`|~`, which are symbols (S).
pub fn is_punctuation(c: char) -> bool {
    in_ranges(punctuation_ranges(), c)
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
    } else if c.is_numeric() {
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
}
