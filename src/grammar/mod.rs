//! Constrained decoding: grammars and JSON schemas compiled against a model's vocabulary into
//! per-step token masks, with llguidance (the library llama.cpp, vLLM and SGLang use).
//!
//! This module owns the vocabulary's token trie, the compilation of a [`GrammarSpec`] (GBNF,
//! Lark, JSON Schema, any JSON object) into a [`Grammar`], and the [`Constraint`] that follows
//! one generation: which tokens may come next, and the grammar's state after each accepted
//! token. It never samples, never evaluates a model and never sees a logit; the sampler is
//! handed the mask.
//!
//! Every token's bytes are its decoded piece, so a grammar constrains the text the user sees;
//! control tokens are marked as special (llguidance's 0xFF prefix) and no grammar text can
//! produce them. Where the grammar may end, every end-of-generation token is allowed.

mod budget;
pub mod gbnf;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory, TokenParser};
use std::sync::Arc;

use crate::tokenizer::{TokenType, Tokenizer};

pub use budget::{check_schema, SchemaBudgetError, MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES};
pub use gbnf::GbnfError;

/// The longest token llguidance's trie can hold (its depth field is 10 bits); a longer token,
/// which only a hostile file has, is left out of every grammar rather than breaking the trie.
const MAX_TOKEN_BYTES: usize = 1000;

/// What a grammar is written in.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// llama.cpp's GBNF (`--grammar`, `--grammar-file`, the server's `grammar` field).
    Gbnf(String),
    /// llguidance's Lark-like syntax.
    Lark(String),
    /// A JSON Schema (`--json-schema`, `response_format` `json_schema`, a tool's parameters).
    JsonSchema(serde_json::Value),
    /// Any JSON object (`--json`, `response_format` `json_object`).
    JsonObject,
}

impl GrammarSpec {
    /// What kind of grammar this is, as an error message names it.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::Gbnf(_) => "GBNF grammar",
            GrammarSpec::Lark(_) => "Lark grammar",
            GrammarSpec::JsonSchema(_) => "JSON schema",
            GrammarSpec::JsonObject => "JSON object grammar",
        }
    }
}

/// Why a grammar could not be made or followed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GrammarError {
    /// The GBNF text does not parse; the error names the line and column.
    #[error(transparent)]
    Gbnf(#[from] GbnfError),
    /// The JSON schema is deeper or larger than a compile may be asked to walk.
    #[error("JSON schema over the budget: {0}")]
    SchemaBudget(#[from] SchemaBudgetError),
    /// llguidance refused the grammar or schema (a bad pattern, an unsupported keyword, a
    /// grammar over the size and time limits).
    #[error("invalid {kind}: {reason}")]
    Compile {
        /// [`GrammarSpec::kind`].
        kind: &'static str,
        /// llguidance's message.
        reason: String,
    },
    /// The vocabulary cannot carry a grammar (no end-of-generation token, too large).
    #[error("this model's vocabulary cannot be constrained: {0}")]
    Vocabulary(String),
    /// A token the grammar does not allow was accepted, or the mask could not be computed.
    #[error("the grammar could not follow the generation: {0}")]
    Step(String),
}

/// A model's vocabulary prepared for grammars: the token trie and llguidance's parser factory.
/// Building it reads every token once (a fraction of a second for 150,000 tokens); make one
/// per model and share it.
pub struct GrammarVocabulary {
    factory: ParserFactory,
    /// Every end-of-generation token: allowed wherever the grammar may end.
    eog: Vec<u32>,
    n_vocab: usize,
}

impl std::fmt::Debug for GrammarVocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocabulary")
            .field("n_vocab", &self.n_vocab)
            .field("eog", &self.eog)
            .finish()
    }
}

impl GrammarVocabulary {
    /// The vocabulary of `tokenizer`, for logits rows of `n_vocab` entries (the model's output
    /// may be wider than the tokenizer; the extra ids are never allowed).
    pub fn new(tokenizer: &Tokenizer, n_vocab: usize) -> Result<Self, GrammarError> {
        let n_vocab = n_vocab.max(tokenizer.n_vocab());
        if n_vocab >= 1 << 22 {
            return Err(GrammarError::Vocabulary(format!(
                "{n_vocab} tokens is more than the 4,194,304 a token trie holds"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let words: Vec<Vec<u8>> = (0..n_vocab as u32)
            .map(|id| {
                let mut word = match tokenizer.token_type(id) {
                    Some(TokenType::Control) => {
                        let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                        w.extend_from_slice(tokenizer.token_text(id).unwrap_or("").as_bytes());
                        w
                    }
                    _ => tokenizer.token_to_piece(id, false).to_vec(),
                };
                // Two tokens with the same bytes (only a hostile file has them) would give the
                // trie two leaves for one word; the first keeps it.
                if word.len() > MAX_TOKEN_BYTES || !seen.insert(word.clone()) {
                    word.clear();
                }
                word
            })
            .collect();
        let eog: Vec<u32> = (0..n_vocab as u32).filter(|&id| tokenizer.is_eog(id)).collect();
        let eos = tokenizer
            .eos()
            .filter(|&id| tokenizer.is_eog(id))
            .or(eog.first().copied())
            .ok_or_else(|| {
                GrammarError::Vocabulary("it has no end-of-generation token, which a grammar needs to end".into())
            })?;
        let mut info = TokRxInfo::new(n_vocab as u32, eos);
        info.tok_bos = tokenizer.bos();
        let trie = TokTrie::from(&info, &words);
        let env: llguidance::toktrie::TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Vocabulary(e.to_string()))?;
        factory.quiet();
        // An error names the fault, not the parser's whole state and grammar.
        factory.limits_mut().verbose_errors = false;
        Ok(GrammarVocabulary { factory, eog, n_vocab })
    }

    /// Compiles `spec`. Compilation is bounded by llguidance's limits (grammar size, lexer
    /// states, fuel), so a hostile grammar fails here instead of running long.
    pub fn compile(self: &Arc<Self>, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let top = match spec {
            GrammarSpec::Gbnf(text) => TopLevelGrammar::from_lark(gbnf::to_lark(text)?),
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
            GrammarSpec::JsonSchema(schema) => {
                check_schema(schema)?;
                TopLevelGrammar::from_json_schema(with_layout(schema))
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(&serde_json::json!({"type": "object"})))
            }
        };
        let parser = self.factory.create_parser(top).map_err(|e| GrammarError::Compile {
            kind: spec.kind(),
            reason: one_line(&e.to_string()),
        })?;
        let grammar = Grammar {
            parser,
            vocabulary: Arc::clone(self),
        };
        // llguidance builds its lexer lazily: a grammar that allows no text at all, or whose
        // lexer passes the size limits, fails only at its first mask. Found here, it is the
        // request's fault (a 400), not a failure of the generation.
        let refused = |reason: String| GrammarError::Compile {
            kind: spec.kind(),
            reason,
        };
        let mut probe = grammar.start();
        let first = probe
            .mask()
            .map_err(|e| refused(format!("it fails at its first token: {e}")))?;
        if first.iter().all(|&w| w == 0) {
            return Err(refused("it allows no token at all, not even the end".into()));
        }
        Ok(grammar)
    }

    /// The logits row length masks cover.
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }
}

/// JSON's layout as the models write it (`{"a": 1, "b": [2, 3]}`), one space after each
/// separator and no other whitespace, unless the schema sets llguidance's own `x-guidance`
/// options. Free whitespace would let a sampled model indent without end.
pub fn with_layout(schema: &serde_json::Value) -> serde_json::Value {
    let mut schema = schema.clone();
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(
            || serde_json::json!({"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": false}),
        );
    }
    schema
}

/// llguidance's message on one line (a regex error points at the pattern over three), bounded
/// so that a hostile grammar cannot make a huge error.
fn one_line(message: &str) -> String {
    let mut line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 500 {
        let mut end = 500;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push('…');
    }
    line
}

/// A compiled grammar: start any number of generations on it with [`Grammar::start`].
#[derive(Clone)]
pub struct Grammar {
    parser: TokenParser,
    vocabulary: Arc<GrammarVocabulary>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammar").field("vocabulary", &self.vocabulary).finish()
    }
}

impl Grammar {
    /// A constraint at the grammar's start, for one generation.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: Matcher::new(Ok(self.parser.deep_clone())),
            vocabulary: Arc::clone(&self.vocabulary),
            mask: Vec::new(),
            mask_ready: false,
            broken: None,
        }
    }
}

/// One generation's place in its grammar.
pub struct Constraint {
    matcher: Matcher,
    vocabulary: Arc<GrammarVocabulary>,
    /// Allowed tokens, one bit per id (bit `id % 32` of word `id / 32`).
    mask: Vec<u32>,
    mask_ready: bool,
    /// Set when a token the grammar refuses was accepted: the text has left the grammar, and
    /// every later step is this error.
    broken: Option<GrammarError>,
}

impl Constraint {
    /// Computes the mask of the next token, if it is not known yet. Call it while the forward
    /// pass runs, so that [`Constraint::mask`] costs nothing after it.
    pub fn prepare(&mut self) -> Result<(), GrammarError> {
        if let Some(error) = &self.broken {
            return Err(error.clone());
        }
        if self.mask_ready {
            return Ok(());
        }
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| GrammarError::Step(one_line(&e.to_string())))?;
        let words = self.vocabulary.n_vocab.div_ceil(32);
        self.mask.clear();
        self.mask
            .extend_from_slice(&vob.as_slice()[..words.min(vob.as_slice().len())]);
        self.mask.resize(words, 0);
        let eos = self.vocabulary.factory.tok_env().tok_trie().eos_token();
        if allowed(&self.mask, eos) {
            for &id in &self.vocabulary.eog {
                self.mask[id as usize / 32] |= 1 << (id % 32);
            }
        }
        self.mask_ready = true;
        Ok(())
    }

    /// The tokens allowed next, one bit per id (see [`allowed`]).
    pub fn mask(&mut self) -> Result<&[u32], GrammarError> {
        self.prepare()?;
        Ok(&self.mask)
    }

    /// Advances the grammar by `token`. An end-of-generation token where the grammar may end
    /// finishes it; a token the grammar does not allow is an error.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        self.prepare()?;
        if !allowed(&self.mask, token) {
            let error = GrammarError::Step(format!("token {token} is not allowed here"));
            self.broken = Some(error.clone());
            return Err(error);
        }
        self.mask_ready = false;
        if self.vocabulary.eog.contains(&token) {
            // Every end-of-generation token ends the grammar as its EOS does.
            let eos = self.vocabulary.factory.tok_env().tok_trie().eos_token();
            return self.consume(eos);
        }
        self.consume(token)
    }

    fn consume(&mut self, token: u32) -> Result<(), GrammarError> {
        let result = self
            .matcher
            .consume_token(token)
            .map_err(|e| GrammarError::Step(one_line(&e.to_string())));
        if let Err(error) = &result {
            self.broken = Some(error.clone());
        }
        result
    }

    /// Whether the grammar is complete and allows nothing but the end.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

/// Whether `token` is set in a mask of [`Constraint::mask`]'s form.
pub fn allowed(mask: &[u32], token: u32) -> bool {
    mask.get(token as usize / 32)
        .is_some_and(|w| w & (1 << (token % 32)) != 0)
}
