//! llama.cpp's GBNF grammar format, read with llama.cpp's own rules (`llama-grammar.cpp`) and
//! written out as the Lark-like text llguidance compiles.
//!
//! This module owns the syntax only: it reports errors by line and column, refuses undefined
//! and twice-defined rules, and refuses a grammar whose `root` can never finish (no finite text
//! derives from it, so constrained generation could only run to its token limit). It knows
//! nothing of tokens or vocabularies; what the text means is llguidance's business.
//!
//! The translation keeps every terminal a single lexeme inside a parser rule: a string literal
//! becomes a Lark string and a character class a one-character regular expression, so the
//! repetitions stay in the Earley parser, as in llama.cpp, and llguidance's greedy lexer never
//! has to choose between a long and a short reading of a character run.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;

/// The most repetitions a `{m,n}` bound may ask for: llama.cpp's `MAX_REPETITION_THRESHOLD`.
/// A larger minimum is refused and a larger maximum means no maximum, as there.
const MAX_REPETITIONS: u64 = 2000;

/// How deep parentheses may nest: the parser recurses once per level, and a hostile grammar
/// must not exhaust the stack.
const MAX_NESTING: usize = 64;

/// The most terminals (strings, character classes, `.`, tokens) a grammar may have. Compiling
/// grows faster than linearly with them (50,000 alternatives take seconds, 200,000 minutes), and
/// a server compiles what any client sends; llama.cpp's largest example has a few hundred.
pub const MAX_TERMINALS: usize = 10_000;

/// How deep rules may refer to rules, from `root` along the first path that reaches each:
/// compiling walks that chain recursively, and a server compiles what any client sends. Real
/// grammars are a few dozen deep (llama.cpp's C grammar: 20); a chain of unit rules
/// (`a ::= b`, `b ::= c`, ...) a thousand long is an attack on the stack, not a grammar.
pub const MAX_RULE_DEPTH: usize = 256;

/// A GBNF text that could not be read, with where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GBNF grammar, line {line}, column {column}: {message}")]
pub struct GbnfError {
    /// 1-based line of the offending character.
    pub line: usize,
    /// 1-based column (in characters) of the offending character.
    pub column: usize,
    /// What was wrong there.
    pub message: String,
}

/// One grammar symbol with its repetition.
#[derive(Debug, Clone)]
struct Item {
    term: Term,
    /// Minimum and maximum (`None`: unbounded) repetitions; `(1, Some(1))` for a plain symbol.
    repeat: (u64, Option<u64>),
}

#[derive(Debug, Clone)]
enum Term {
    Literal(String),
    Class { negated: bool, ranges: Vec<(char, char)> },
    AnyChar,
    Token(String),
    Rule { name: String, at: usize },
    Group(Vec<Vec<Item>>),
}

struct Rule {
    name: String,
    at: usize,
    alternatives: Vec<Vec<Item>>,
}

/// Translates GBNF `text` into llguidance's Lark syntax, whose start rule derives `root`.
pub fn to_lark(text: &str) -> Result<String, GbnfError> {
    let rules = Parser {
        text,
        pos: 0,
        depth: 0,
        terminals: 0,
    }
    .parse()?;
    let mut out = String::from("start: r_root\n");
    for rule in &rules {
        let _ = write!(out, "{}: ", rule_name(&rule.name));
        write_alternatives(&mut out, &rule.alternatives);
        out.push('\n');
    }
    Ok(out)
}

/// A GBNF name ([a-zA-Z0-9-]+) as a Lark rule name ([a-z][_a-z0-9-]*), one to one: uppercase
/// letters become `_` and the letter, since GBNF names have no `_` of their own.
fn rule_name(name: &str) -> String {
    let mut out = String::from("r_");
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn write_alternatives(out: &mut String, alternatives: &[Vec<Item>]) {
    for (i, sequence) in alternatives.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        let items: Vec<&Item> = sequence.iter().filter(|item| !is_empty(item)).collect();
        if items.is_empty() {
            // The empty alternative: llguidance reads `""` as matching nothing.
            out.push_str("\"\"");
        }
        for (j, item) in items.into_iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            write_item(out, item);
        }
    }
}

/// A symbol that derives only the empty string, which Lark's `{0}` cannot say.
fn is_empty(item: &Item) -> bool {
    item.repeat.1 == Some(0) || matches!(&item.term, Term::Literal(s) if s.is_empty())
}

fn write_item(out: &mut String, item: &Item) {
    match &item.term {
        Term::Literal(s) => out.push_str(&serde_json::to_string(s).expect("a string serializes")),
        Term::Class { negated, ranges } => {
            out.push_str("/[");
            if *negated {
                out.push('^');
            }
            for &(low, high) in ranges {
                // Every character escaped by code point: no character of the class can then
                // close the regular expression, the class, or mean a range or an escape.
                let _ = write!(out, "\\x{{{:X}}}", low as u32);
                if high != low {
                    let _ = write!(out, "-\\x{{{:X}}}", high as u32);
                }
            }
            out.push_str("]/");
        }
        Term::AnyChar => out.push_str("/(?s:.)/"),
        Term::Token(name) => out.push_str(name),
        Term::Rule { name, .. } => out.push_str(&rule_name(name)),
        Term::Group(alternatives) => {
            out.push('(');
            write_alternatives(out, alternatives);
            out.push(')');
        }
    }
    match item.repeat {
        (1, Some(1)) => {}
        (0, None) => out.push('*'),
        (1, None) => out.push('+'),
        (0, Some(1)) => out.push('?'),
        (m, None) => {
            let _ = write!(out, "{{{m},}}");
        }
        (m, Some(n)) if m == n => {
            let _ = write!(out, "{{{m}}}");
        }
        (m, Some(n)) => {
            let _ = write!(out, "{{{m},{n}}}");
        }
    }
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
    terminals: usize,
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '-'
}

impl Parser<'_> {
    fn error(&self, at: usize, message: impl Into<String>) -> GbnfError {
        let before = &self.text[..at.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError {
            line,
            column,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.text[self.pos..].chars().next()
    }

    fn peek2(&self) -> Option<char> {
        self.text[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// llama.cpp's `parse_space`: blanks and `#` comments, and line ends where `newline_ok`.
    fn skip_space(&mut self, newline_ok: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => self.pos += 1,
                '\r' | '\n' if newline_ok => self.pos += 1,
                '#' => {
                    while !matches!(self.peek(), None | Some('\r' | '\n')) {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.pos += 1;
        }
        if self.pos == start {
            return Err(self.error(start, "expected a rule name"));
        }
        Ok(self.text[start..self.pos].to_string())
    }

    fn parse(mut self) -> Result<Vec<Rule>, GbnfError> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut defined: HashMap<String, usize> = HashMap::new();
        self.skip_space(true);
        while self.pos < self.text.len() {
            let at = self.pos;
            let name = self.name()?;
            self.skip_space(false);
            if !self.text[self.pos..].starts_with("::=") {
                return Err(self.error(self.pos, format!("expected ::= after the rule name `{name}`")));
            }
            self.pos += 3;
            self.skip_space(true);
            let alternatives = self.alternatives(false)?;
            match self.peek() {
                None | Some('\n') => {}
                Some('\r') if self.peek2() == Some('\n') => self.pos += 1,
                Some('\r') => {}
                Some(c) => {
                    return Err(self.error(
                        self.pos,
                        format!("unexpected `{c}`: expected a symbol, `|` or the end of the line"),
                    ))
                }
            }
            self.skip_space(true);
            if let Some(&first) = defined.get(&name) {
                let earlier = self.error(rules[first].at, "");
                return Err(self.error(
                    at,
                    format!("rule `{name}` is defined twice (first on line {})", earlier.line),
                ));
            }
            defined.insert(name.clone(), rules.len());
            rules.push(Rule { name, at, alternatives });
        }
        if !defined.contains_key("root") {
            return Err(self.error(0, "the grammar has no `root` rule, where generation starts"));
        }
        for rule in &rules {
            self.check_references(&rule.alternatives, &defined)?;
        }
        self.check_productive(&rules, &defined)?;
        self.check_depth(&rules, &defined)?;
        Ok(rules)
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Item>>, GbnfError> {
        let mut alternatives = vec![self.sequence(nested)?];
        while self.peek() == Some('|') {
            self.pos += 1;
            self.skip_space(true);
            alternatives.push(self.sequence(nested)?);
        }
        Ok(alternatives)
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Item>, GbnfError> {
        let mut items: Vec<Item> = Vec::new();
        while let Some(c) = self.peek() {
            let start = self.pos;
            let term = match c {
                '"' => {
                    self.pos += 1;
                    let mut literal = String::new();
                    loop {
                        match self.peek() {
                            None => return Err(self.error(start, "this string is never closed")),
                            Some('"') => break,
                            Some(_) => literal.push(self.char()?),
                        }
                    }
                    self.pos += 1;
                    Term::Literal(literal)
                }
                '[' => self.class()?,
                '.' => {
                    self.pos += 1;
                    Term::AnyChar
                }
                '<' => Term::Token(self.token()?),
                '!' => {
                    return Err(self.error(
                        start,
                        "token negation `!<...>` is not supported; write the allowed text instead",
                    ))
                }
                '(' => {
                    if self.depth >= MAX_NESTING {
                        return Err(self.error(start, format!("parentheses nest deeper than {MAX_NESTING}")));
                    }
                    self.pos += 1;
                    self.skip_space(true);
                    self.depth += 1;
                    let alternatives = self.alternatives(true)?;
                    self.depth -= 1;
                    if self.peek() != Some(')') {
                        return Err(self.error(self.pos, "expected `)` to close the group"));
                    }
                    self.pos += 1;
                    Term::Group(alternatives)
                }
                '*' | '+' | '?' | '{' => {
                    let repeat = self.repetition()?;
                    let Some(last) = items.last_mut() else {
                        return Err(self.error(start, format!("`{c}` follows nothing it could repeat")));
                    };
                    if last.repeat != (1, Some(1)) {
                        // llama.cpp repeats the repeated symbol; a group keeps that meaning.
                        let inner = std::mem::replace(
                            last,
                            Item {
                                term: Term::AnyChar,
                                repeat: (1, Some(1)),
                            },
                        );
                        last.term = Term::Group(vec![vec![inner]]);
                    }
                    last.repeat = repeat;
                    self.skip_space(nested);
                    continue;
                }
                c if is_word_char(c) => {
                    let name = self.name()?;
                    Term::Rule { name, at: start }
                }
                _ => break,
            };
            if !matches!(term, Term::Rule { .. } | Term::Group(_)) {
                self.terminals += 1;
                if self.terminals > MAX_TERMINALS {
                    return Err(self.error(
                        start,
                        format!("the grammar has more than {MAX_TERMINALS} terminals (strings and character classes), more than can be compiled promptly"),
                    ));
                }
            }
            items.push(Item {
                term,
                repeat: (1, Some(1)),
            });
            self.skip_space(nested);
        }
        Ok(items)
    }

    /// One character of a string or class, with llama.cpp's escapes.
    fn char(&mut self) -> Result<char, GbnfError> {
        let start = self.pos;
        let c = self
            .bump()
            .ok_or_else(|| self.error(start, "unexpected end of the grammar"))?;
        if c != '\\' {
            return Ok(c);
        }
        let escape = self
            .bump()
            .ok_or_else(|| self.error(start, "unexpected end of the grammar"))?;
        let digits = match escape {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            't' => return Ok('\t'),
            'r' => return Ok('\r'),
            'n' => return Ok('\n'),
            '\\' | '"' | '[' | ']' | '-' => return Ok(escape),
            other => return Err(self.error(start, format!("unknown escape `\\{other}`"))),
        };
        let hex = self.text.get(self.pos..self.pos + digits).unwrap_or("");
        let value = (hex.len() == digits && hex.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u32::from_str_radix(hex, 16).ok())
            .flatten()
            .ok_or_else(|| self.error(start, format!("`\\{escape}` needs {digits} hexadecimal digits")))?;
        self.pos += digits;
        char::from_u32(value).ok_or_else(|| self.error(start, format!("U+{value:X} is not a character")))
    }

    fn class(&mut self) -> Result<Term, GbnfError> {
        let start = self.pos;
        self.pos += 1;
        let negated = self.peek() == Some('^');
        if negated {
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                None => return Err(self.error(start, "this character class is never closed")),
                Some(']') => break,
                Some(_) => {}
            }
            let low = self.char()?;
            let mut high = low;
            if self.peek() == Some('-') && !matches!(self.peek2(), Some(']') | None) {
                self.pos += 1;
                let at = self.pos;
                high = self.char()?;
                if high < low {
                    return Err(self.error(at, format!("the range {low:?}-{high:?} runs backwards")));
                }
            }
            ranges.push((low, high));
        }
        self.pos += 1;
        if ranges.is_empty() && !negated {
            return Err(self.error(start, "an empty character class `[]` matches nothing"));
        }
        if ranges.is_empty() {
            // `[^]`: every character.
            return Ok(Term::AnyChar);
        }
        Ok(Term::Class { negated, ranges })
    }

    /// `<name>` or `<[id]>`: a token of the vocabulary, llguidance's syntax too.
    fn token(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        let end = self.text[start..]
            .find('>')
            .map(|i| start + i + 1)
            .ok_or_else(|| self.error(start, "this token reference is never closed with `>`"))?;
        let token = &self.text[start..end];
        if token.len() <= 2 || token[1..token.len() - 1].contains(['<', ' ', '\t', '\n', '\r']) {
            return Err(self.error(start, format!("`{token}` is not a token reference")));
        }
        self.pos = end;
        Ok(token.to_string())
    }

    fn repetition(&mut self) -> Result<(u64, Option<u64>), GbnfError> {
        let start = self.pos;
        match self.bump() {
            Some('*') => return Ok((0, None)),
            Some('+') => return Ok((1, None)),
            Some('?') => return Ok((0, Some(1))),
            _ => {}
        }
        self.skip_space(false);
        let min = self
            .integer()?
            .ok_or_else(|| self.error(self.pos, "expected a repetition count after `{`"))?;
        self.skip_space(false);
        let max = match self.bump() {
            Some('}') => Some(min),
            Some(',') => {
                self.skip_space(false);
                let max = self.integer()?;
                self.skip_space(false);
                if self.bump() != Some('}') {
                    return Err(self.error(start, "expected `}` to close the repetition"));
                }
                max
            }
            _ => return Err(self.error(start, "expected `,` or `}` in the repetition")),
        };
        if min > MAX_REPETITIONS {
            return Err(self.error(
                start,
                format!("{min} repetitions is more than the limit of {MAX_REPETITIONS}"),
            ));
        }
        if let Some(max) = max {
            if max < min {
                return Err(self.error(
                    start,
                    format!("the repetition {{{min},{max}}} has its maximum below its minimum"),
                ));
            }
        }
        Ok((min, max.filter(|&m| m <= MAX_REPETITIONS)))
    }

    fn integer(&mut self) -> Result<Option<u64>, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        if start == self.pos {
            return Ok(None);
        }
        // Too many digits to count is more than any limit.
        Ok(Some(self.text[start..self.pos].parse().unwrap_or(u64::MAX)))
    }

    fn check_references(&self, alternatives: &[Vec<Item>], defined: &HashMap<String, usize>) -> Result<(), GbnfError> {
        for item in alternatives.iter().flatten() {
            match &item.term {
                Term::Rule { name, at } if !defined.contains_key(name) => {
                    return Err(self.error(*at, format!("undefined rule `{name}`")));
                }
                Term::Group(inner) => self.check_references(inner, defined)?,
                _ => {}
            }
        }
        Ok(())
    }

    /// Refuses rules that refer to each other more than [`MAX_RULE_DEPTH`] deep, found by a
    /// depth-first walk from `root` with an explicit stack (so the check itself cannot overflow).
    fn check_depth(&self, rules: &[Rule], defined: &HashMap<String, usize>) -> Result<(), GbnfError> {
        fn references(alternatives: &[Vec<Item>], defined: &HashMap<String, usize>, out: &mut Vec<usize>) {
            for item in alternatives.iter().flatten() {
                match &item.term {
                    Term::Rule { name, .. } => out.extend(defined.get(name)),
                    Term::Group(inner) => references(inner, defined, out),
                    _ => {}
                }
            }
        }
        let edges: Vec<Vec<usize>> = rules
            .iter()
            .map(|rule| {
                let mut to = Vec::new();
                references(&rule.alternatives, defined, &mut to);
                to
            })
            .collect();
        let root = defined["root"];
        let mut visited = vec![false; rules.len()];
        visited[root] = true;
        // Each entry: a rule on the current path and the next of its references to follow.
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        while let Some((rule, next)) = path.last_mut() {
            let Some(&to) = edges[*rule].get(*next) else {
                path.pop();
                continue;
            };
            *next += 1;
            if visited[to] {
                continue;
            }
            visited[to] = true;
            path.push((to, 0));
            if path.len() > MAX_RULE_DEPTH {
                return Err(self.error(
                    rules[to].at,
                    format!(
                        "rules refer to rules more than {MAX_RULE_DEPTH} deep (root → {} → … → {}): over the limit",
                        rules[path[1].0].name, rules[to].name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a `root` from which no finite text derives. A rule is productive when one of its
    /// alternatives has only productive symbols; the fixed point finds them all.
    fn check_productive(&self, rules: &[Rule], defined: &HashMap<String, usize>) -> Result<(), GbnfError> {
        let mut productive: HashSet<&str> = HashSet::new();
        loop {
            let before = productive.len();
            for rule in rules {
                if !productive.contains(rule.name.as_str()) && derives(&rule.alternatives, &productive) {
                    productive.insert(&rule.name);
                }
            }
            if productive.len() == before {
                break;
            }
        }
        if productive.contains("root") {
            return Ok(());
        }
        let mut stuck: Vec<&str> = rules
            .iter()
            .map(|r| r.name.as_str())
            .filter(|n| !productive.contains(n))
            .collect();
        stuck.sort_unstable();
        let root = &rules[defined["root"]];
        Err(self.error(
            root.at,
            format!(
                "the grammar can never finish: no finite text derives from `root` (these rules only ever refer back to each other: {})",
                stuck.join(", ")
            ),
        ))
    }
}

fn derives(alternatives: &[Vec<Item>], productive: &HashSet<&str>) -> bool {
    alternatives.iter().any(|sequence| {
        sequence.iter().all(|item| {
            item.repeat.0 == 0
                || match &item.term {
                    Term::Rule { name, .. } => productive.contains(name.as_str()),
                    Term::Group(inner) => derives(inner, productive),
                    _ => true,
                }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> GbnfError {
        to_lark(text).unwrap_err()
    }

    #[test]
    fn terminals_become_single_lexemes_and_names_stay_distinct() {
        let lark =
            to_lark("root ::= Item item* \"a\\\"b\" [^a-c\\]] . \nItem ::= [x]{2,3} | \"\"\nitem ::= \"y\"?").unwrap();
        assert_eq!(
            lark,
            "start: r_root\n\
             r_root: r__item r_item* \"a\\\"b\" /[^\\x{61}-\\x{63}\\x{5D}]/ /(?s:.)/\n\
             r__item: /[\\x{78}]/{2,3} | \"\"\n\
             r_item: \"y\"?\n"
        );
    }

    #[test]
    fn newlines_end_a_rule_except_inside_parentheses_or_after_a_bar() {
        let lark = to_lark("root ::= (\n  \"a\"\n  | \"b\" ) |\n \"c\" # comment\n\n").unwrap();
        assert_eq!(lark, "start: r_root\nr_root: (\"a\" | \"b\") | \"c\"\n");
    }

    #[test]
    fn repetition_bounds_follow_llama_cpp() {
        assert!(to_lark("root ::= \"a\"{0,5000}").unwrap().contains("\"a\"*"));
        assert!(to_lark("root ::= \"a\"{3,}").unwrap().contains("\"a\"{3,}"));
        assert!(to_lark("root ::= \"a\"{0} \"b\"").unwrap().contains("r_root: \"b\""));
        assert!(error("root ::= \"a\"{2001}").message.contains("limit of 2000"));
        assert!(error("root ::= \"a\"{3,2}").message.contains("maximum below"));
    }

    #[test]
    fn errors_name_the_line_and_column() {
        let e = error("root ::= word\nword ::= [a-z]+ nope\n");
        assert_eq!((e.line, e.column), (2, 17), "{e}");
        assert!(e.message.contains("undefined rule `nope`"));
        let e = error("root ::= \"a\"\nroot ::= \"b\"\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("defined twice (first on line 1)"));
        assert!(error("root := \"a\"").message.contains("expected ::="));
        assert!(error("root ::= \"a").message.contains("never closed"));
        assert!(error("root ::= [a-").message.contains("never closed"));
        assert!(error("root ::= \"\\q\"").message.contains("unknown escape"));
        assert!(error("root ::= \"\\uD800\"").message.contains("not a character"));
        assert!(error("start ::= \"a\"").message.contains("no `root` rule"));
        assert!(error("root ::= * \"a\"").message.contains("follows nothing"));
    }

    #[test]
    fn a_grammar_that_can_never_finish_is_refused() {
        let e = error("root ::= \"a\" root\n");
        assert!(e.message.contains("can never finish"), "{e}");
        let e = error("root ::= x\nx ::= \"(\" y \")\"\ny ::= x | \"-\" y\n");
        assert!(e.message.contains("x, y"), "{e}");
        // Optional self-reference is fine.
        to_lark("root ::= \"a\" root?\n").unwrap();
        to_lark("root ::= \"a\" | \"(\" root \")\"\n").unwrap();
    }

    #[test]
    fn rules_chained_deeper_than_the_limit_are_refused_naming_the_rule() {
        let chain = |n: usize| {
            let mut text = String::from("root ::= r1\n");
            for i in 1..n {
                text.push_str(&format!("r{i} ::= r{}\n", i + 1));
            }
            text.push_str(&format!("r{n} ::= \"a\"\n"));
            text
        };
        to_lark(&chain(MAX_RULE_DEPTH - 1)).unwrap();
        let e = error(&chain(1000));
        assert!(e.message.contains("more than 256 deep"), "{e}");
        assert!(e.message.contains(&format!("r{MAX_RULE_DEPTH}")), "{e}");
        assert_eq!(e.line, MAX_RULE_DEPTH + 1, "{e}");
        // Wide is fine: a thousand rules side by side under root.
        let mut wide = String::from("root ::= ");
        wide.push_str(&(0..1000).map(|i| format!("w{i}")).collect::<Vec<_>>().join(" | "));
        wide.push('\n');
        for i in 0..1000 {
            wide.push_str(&format!("w{i} ::= \"{i}\"\n"));
        }
        to_lark(&wide).unwrap();
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_stack_overflow() {
        let text = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(error(&text).message.contains("nest deeper"));
    }
}
