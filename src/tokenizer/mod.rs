//! Text to token ids and back: the byte-level BPE tokenizer (`tokenizer.ggml.model = gpt2`)
//! built from GGUF metadata, with the model's pre-tokenizer and special tokens.
//!
//! Owns the vocabulary, merges, special-token matching and detokenization (one-shot and
//! streaming). Knows nothing of models or generation. Behaviour follows llama.cpp's
//! `llama_tokenize` / `llama_token_to_piece`, against which it is tested.

mod bpe;
mod gemma4;
mod pretokenize;
mod spm;
mod stream;
mod unicode;

pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

use crate::gguf::{Array, GgufError, Metadata};
use std::collections::HashMap;
use std::ops::Range;

/// A token's type, as `tokenizer.ggml.token_type` stores it (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// `LLAMA_TOKEN_TYPE_UNDEFINED`: decodes to nothing.
    Undefined = 0,
    /// `LLAMA_TOKEN_TYPE_NORMAL`: ordinary BPE text, stored byte-mapped.
    Normal = 1,
    /// `LLAMA_TOKEN_TYPE_UNKNOWN`: the `<unk>` token; decoded like a control token.
    Unknown = 2,
    /// `LLAMA_TOKEN_TYPE_CONTROL`: e.g. `<|im_start|>`; matched in text only with
    /// `parse_special`, decoded to its text only with `special`.
    Control = 3,
    /// `LLAMA_TOKEN_TYPE_USER_DEFINED`: e.g. `<tool_call>`; always matched in text and always
    /// decoded to its text.
    UserDefined = 4,
    /// `LLAMA_TOKEN_TYPE_UNUSED`: a placeholder slot; decodes to nothing.
    Unused = 5,
    /// `LLAMA_TOKEN_TYPE_BYTE`: a SentencePiece `<0xXX>` byte token; unused by byte-level BPE,
    /// decodes to nothing.
    Byte = 6,
}

impl TokenType {
    fn from_i32(v: i32) -> Option<Self> {
        Some(match v {
            0 => TokenType::Undefined,
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => return None,
        })
    }
}

/// Why a tokenizer could not be built from a model's metadata.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A `tokenizer.ggml.*` key is missing or of the wrong type.
    #[error(transparent)]
    Metadata(#[from] GgufError),
    /// `tokenizer.ggml.model` is none of `gpt2`, `llama` and `gemma4` (e.g. `bert`'s WordPiece,
    /// `t5`'s Unigram).
    #[error("unsupported tokenizer model '{model}' (tokenizer.ggml.model); minfer supports 'gpt2' (byte-level BPE), 'llama' (SentencePiece) and 'gemma4' (SentencePiece-style BPE)")]
    UnsupportedModel {
        /// The `tokenizer.ggml.model` value.
        model: String,
    },
    /// `tokenizer.ggml.pre` names a pre-tokenizer minfer does not implement.
    #[error("unknown pre-tokenizer '{pre}' (tokenizer.ggml.pre); minfer supports: {}", pretokenize::PreTokenizer::names().collect::<Vec<_>>().join(", "))]
    UnknownPreTokenizer {
        /// The `tokenizer.ggml.pre` value.
        pre: String,
    },
    /// `tokenizer.ggml.tokens`, `merges` or `token_type` is an array of the wrong element type.
    #[error("metadata key '{key}' must be an array of {expected}")]
    BadArray {
        /// The metadata key.
        key: &'static str,
        /// The element type required.
        expected: &'static str,
    },
    /// `tokenizer.ggml.token_type` does not have one entry per token.
    #[error("tokenizer.ggml.token_type has {types} entries for {tokens} tokens")]
    TypeCountMismatch {
        /// Length of `tokenizer.ggml.token_type`.
        types: usize,
        /// Length of `tokenizer.ggml.tokens` (n_vocab).
        tokens: usize,
    },
    /// A `tokenizer.ggml.token_type` entry is not one of the [`TokenType`] values 0 to 6.
    #[error("tokenizer.ggml.token_type[{index}] = {value} is not a token type")]
    BadTokenType {
        /// The token id.
        index: usize,
        /// The value found.
        value: i32,
    },
    /// A `tokenizer.ggml.merges` entry has no space between its two parts.
    #[error("merge #{index} '{merge}' is not two tokens separated by a space")]
    BadMerge {
        /// The merge's rank (its index in the array).
        index: usize,
        /// The merge as stored.
        merge: String,
    },
    /// A special token id key (`tokenizer.ggml.bos_token_id`, ...) is not below n_vocab.
    #[error("{key} = {id} is outside the vocabulary of {n_vocab} tokens")]
    TokenIdOutOfRange {
        /// The metadata key.
        key: &'static str,
        /// The id found.
        id: u64,
        /// The vocabulary size.
        n_vocab: usize,
    },
}

/// How the text between special tokens becomes ids.
enum Kind {
    /// Byte-level BPE (`gpt2`): the pre-tokenizer's words, each merged by rank.
    Bpe {
        merges: bpe::Merges,
        byte_tokens: Box<[u32; 256]>,
        pre: PreTokenizer,
    },
    /// SentencePiece (`llama`): each fragment merged by score, with byte fallback;
    /// `add_space_prefix` puts a space before a fragment at the start or after a special token.
    Spm { spm: spm::Spm, add_space_prefix: bool },
    /// SentencePiece-style BPE (`gemma4`): `▁` for spaces, merges over characters, `<0xXX>`
    /// fallback ([`gemma4`]).
    SpmBpe {
        merges: bpe::Merges,
        byte_tokens: Box<[Option<u32>; 256]>,
    },
}

/// A tokenizer from GGUF metadata — byte-level BPE (`tokenizer.ggml.model = gpt2`) or
/// SentencePiece (`llama`): vocabulary, merges or scores, pre-tokenizer and special tokens, as
/// llama.cpp's `llama_vocab` holds them.
pub struct Tokenizer {
    /// Token texts as stored in the file (byte-mapped for normal tokens).
    texts: Vec<String>,
    types: Vec<TokenType>,
    /// What each token decodes to, without and with control tokens rendered.
    pieces: Vec<Vec<u8>>,
    text_to_id: HashMap<String, u32>,
    kind: Kind,
    /// Control and unknown tokens (matched only when parsing specials) and user-defined tokens
    /// (always matched), longest text first.
    specials: Vec<u32>,
    /// Special tokens that swallow the whitespace after them when matched (llama.cpp's
    /// `LLAMA_TOKEN_ATTR_RSTRIP`, which it sets by model name: Phi-3's).
    rstrip: std::collections::HashSet<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: `encode` with `add_special` appends EOS (embedding
    /// models that pool the last token, such as Qwen3-Embedding, ask for it).
    add_eos: bool,
    /// The tokens that end a generation ([`eog_tokens`]), as llama.cpp's `special_eog_ids`.
    eog: std::collections::HashSet<u32>,
}

fn string_array<'a>(m: &'a Metadata, key: &'static str) -> Result<&'a [String], TokenizerError> {
    match m.get_array(key)? {
        Array::String(v) => Ok(v),
        _ => Err(TokenizerError::BadArray {
            key,
            expected: "strings",
        }),
    }
}

impl Tokenizer {
    /// Build the tokenizer from a model's `tokenizer.ggml.*` metadata.
    pub fn from_metadata(m: &Metadata) -> Result<Self, TokenizerError> {
        let model = m.get_str("tokenizer.ggml.model")?;
        if !matches!(model, "gpt2" | "llama" | "gemma4") {
            return Err(TokenizerError::UnsupportedModel {
                model: model.to_string(),
            });
        }
        // Pieces as SentencePiece writes them: `▁` for a space, `<0xXX>` for a byte.
        let spm = model != "gpt2";

        let texts = string_array(m, "tokenizer.ggml.tokens")?.to_vec();
        let n_vocab = texts.len();
        let types: Vec<TokenType> = match m.get("tokenizer.ggml.token_type") {
            None => vec![TokenType::Normal; n_vocab],
            Some(_) => {
                let raw = match m.get_array("tokenizer.ggml.token_type")? {
                    Array::I32(v) => v,
                    _ => {
                        return Err(TokenizerError::BadArray {
                            key: "tokenizer.ggml.token_type",
                            expected: "INT32",
                        })
                    }
                };
                if raw.len() != n_vocab {
                    return Err(TokenizerError::TypeCountMismatch {
                        types: raw.len(),
                        tokens: n_vocab,
                    });
                }
                raw.iter()
                    .enumerate()
                    .map(|(index, &value)| {
                        TokenType::from_i32(value).ok_or(TokenizerError::BadTokenType { index, value })
                    })
                    .collect::<Result<_, _>>()?
            }
        };

        let mut text_to_id = HashMap::with_capacity(n_vocab);
        for (id, t) in texts.iter().enumerate() {
            // The first of duplicated texts wins, as in llama.cpp's token_to_id map.
            text_to_id.entry(t.clone()).or_insert(id as u32);
        }

        let kind = match model {
            "llama" => Self::spm_kind(m, &text_to_id, n_vocab)?,
            "gemma4" => Kind::SpmBpe {
                merges: merges_of(m, &text_to_id)?,
                byte_tokens: Box::new(spm_byte_tokens(&text_to_id)),
            },
            _ => Self::bpe_kind(m, &text_to_id)?,
        };
        let byte_chars = bpe::byte_to_char_table();
        let mut char_to_byte = HashMap::with_capacity(256);
        for (b, &c) in byte_chars.iter().enumerate() {
            char_to_byte.insert(c, b as u8);
        }
        let pieces = texts
            .iter()
            .zip(&types)
            .map(|(text, ty)| match ty {
                TokenType::Normal if spm => text.replace('▁', " ").into_bytes(),
                TokenType::Normal => {
                    let mut bytes = Vec::with_capacity(text.len());
                    for c in text.chars() {
                        match char_to_byte.get(&c) {
                            Some(&b) => bytes.push(b),
                            // Not from the byte map (a hand-added token): keep its UTF-8.
                            None => bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
                        }
                    }
                    bytes
                }
                TokenType::Byte if spm => spm_byte(text).map(|b| vec![b]).unwrap_or_default(),
                TokenType::UserDefined | TokenType::Control | TokenType::Unknown => text.as_bytes().to_vec(),
                TokenType::Unused | TokenType::Byte | TokenType::Undefined => Vec::new(),
            })
            .collect();

        let mut specials: Vec<u32> = (0..n_vocab as u32)
            .filter(|&id| {
                matches!(
                    types[id as usize],
                    TokenType::Control | TokenType::UserDefined | TokenType::Unknown
                ) && !texts[id as usize].is_empty()
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(texts[id as usize].len()));
        let rstrip = rstrip_tokens(m, &specials, &text_to_id);

        let token_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match m.get(key) {
                None => Ok(None),
                Some(_) => {
                    let id = m.get_uint(key)?;
                    if id as usize >= n_vocab {
                        return Err(TokenizerError::TokenIdOutOfRange { key, id, n_vocab });
                    }
                    Ok(Some(id as u32))
                }
            }
        };
        let add_bos = match m.get("tokenizer.ggml.add_bos_token") {
            None => false,
            Some(_) => m.get_bool("tokenizer.ggml.add_bos_token")?,
        };
        // llama.cpp adds BOS for `gemma4` whatever the file says (its workaround for Gemma 4).
        let add_bos = add_bos || model == "gemma4";
        let add_eos = match m.get("tokenizer.ggml.add_eos_token") {
            None => false,
            Some(_) => m.get_bool("tokenizer.ggml.add_eos_token")?,
        };

        let eos = token_id("tokenizer.ggml.eos_token_id")?;
        let eot = token_id("tokenizer.ggml.eot_token_id")?;
        let eom = token_id("tokenizer.ggml.eom_token_id")?;
        let mut fim = Vec::with_capacity(FIM_EOG.len());
        for (key, candidates) in FIM_EOG {
            fim.push(match token_id(key)? {
                Some(id) => Some(id),
                None => candidates.iter().find_map(|t| text_to_id.get(*t).copied()),
            });
        }
        let eog = eog_tokens(&texts, &text_to_id, fim, [eos, eot, eom]);
        Ok(Tokenizer {
            bos: token_id("tokenizer.ggml.bos_token_id")?,
            eos,
            eot,
            pad: token_id("tokenizer.ggml.padding_token_id")?,
            eog,
            texts,
            types,
            pieces,
            text_to_id,
            kind,
            specials,
            rstrip,
            add_bos,
            add_eos,
        })
    }

    /// The byte-level BPE parts: the pre-tokenizer, each byte's token and the merges.
    fn bpe_kind(m: &Metadata, text_to_id: &HashMap<String, u32>) -> Result<Kind, TokenizerError> {
        let pre_name = m.get_str("tokenizer.ggml.pre")?;
        let pre = PreTokenizer::from_name(pre_name).ok_or_else(|| TokenizerError::UnknownPreTokenizer {
            pre: pre_name.to_string(),
        })?;
        let byte_chars = bpe::byte_to_char_table();
        // A byte whose GPT-2 character is not a token (SmolLM2's vocabulary lacks most control
        // bytes) is dropped from the output, as llama.cpp drops it; it merges with nothing.
        let mut byte_tokens = [bpe::NO_TOKEN; 256];
        for (b, &c) in byte_chars.iter().enumerate() {
            if let Some(&id) = text_to_id.get(c.encode_utf8(&mut [0; 4]) as &str) {
                byte_tokens[b] = id;
            }
        }
        Ok(Kind::Bpe {
            merges: merges_of(m, text_to_id)?,
            byte_tokens: Box::new(byte_tokens),
            pre,
        })
    }

    /// The SentencePiece parts: the scores, each byte's fallback token and the space prefix.
    fn spm_kind(m: &Metadata, text_to_id: &HashMap<String, u32>, n_vocab: usize) -> Result<Kind, TokenizerError> {
        let scores = match m.get_array("tokenizer.ggml.scores")? {
            Array::F32(v) => v.clone(),
            _ => {
                return Err(TokenizerError::BadArray {
                    key: "tokenizer.ggml.scores",
                    expected: "FLOAT32",
                })
            }
        };
        if scores.len() != n_vocab {
            return Err(TokenizerError::TypeCountMismatch {
                types: scores.len(),
                tokens: n_vocab,
            });
        }
        let byte_tokens = spm_byte_tokens(text_to_id);
        // llama.cpp's default for SentencePiece vocabularies is to add the prefix.
        let add_space_prefix = match m.get("tokenizer.ggml.add_space_prefix") {
            None => true,
            Some(_) => m.get_bool("tokenizer.ggml.add_space_prefix")?,
        };
        Ok(Kind::Spm {
            spm: spm::Spm {
                scores,
                byte_tokens: Box::new(byte_tokens),
            },
            add_space_prefix,
        })
    }

    /// Vocabulary size (n_vocab): the length of `tokenizer.ggml.tokens`.
    pub fn n_vocab(&self) -> usize {
        self.texts.len()
    }

    /// Number of usable merges: distinct pairs whose parts and result are all in the vocabulary.
    pub fn n_merges(&self) -> usize {
        match &self.kind {
            Kind::Bpe { merges, .. } => merges.len(),
            Kind::SpmBpe { merges, .. } => merges.len(),
            Kind::Spm { .. } => 0,
        }
    }

    /// `tokenizer.ggml.bos_token_id`, if the model has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.eot_token_id` (end of turn), if the model has one.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// `tokenizer.ggml.padding_token_id`, if the model has one.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// `tokenizer.ggml.add_bos_token` (false when absent): whether `encode` with `add_special` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `tokenizer.ggml.add_eos_token` (false when absent): whether `encode` with `add_special`
    /// appends EOS, as llama.cpp's tokenizer does.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// The token's text as stored in the vocabulary (byte-mapped for normal tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The [`TokenType`] of token `id`, or `None` if `id` is not below n_vocab.
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        self.types.get(id as usize).copied()
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// Whether generation stops at this token: llama.cpp's end-of-generation set
    /// ([`eog_tokens`]): EOS, EOT, EOM and the turn-ending control tokens (`<|im_end|>`,
    /// `<|eot_id|>`, harmony's `<|return|>` and `<|call|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Every end-of-generation token, in id order.
    pub fn eog(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eog.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Tokenize `text`. With `add_special`, a BOS token is prepended when the model asks for
    /// one (`tokenizer.ggml.add_bos_token`). With `parse_special`, control-token text such as
    /// `<|im_start|>` becomes its token; without, it is plain text (user-defined tokens such as
    /// `<tool_call>` are matched either way, as in llama.cpp).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// [`Tokenizer::encode`] for arbitrary bytes: invalid UTF-8 is tokenized byte by byte, so
    /// `decode(encode_bytes(b)) == b` for every byte string.
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_spans(text, add_special, parse_special, &[])
    }

    /// [`Tokenizer::encode`] with special tokens parsed except inside `literal`: control-token
    /// text that overlaps one of those byte ranges stays plain text. A server renders messages
    /// into one prompt and marks where the messages' own text landed, so that the template's
    /// `<|im_start|>` is a control token and a user's `<|im_start|>` is not, in one pass (BPE
    /// splits stay what tokenizing the whole prompt gives).
    pub fn encode_with_literal_spans(&self, text: &str, add_special: bool, literal: &[Range<usize>]) -> Vec<u32> {
        self.encode_spans(text.as_bytes(), add_special, true, literal)
    }

    /// The texts of the control tokens (`<|im_start|>`, `<|endoftext|>`, ...): what
    /// `parse_special` turns into tokens, and what must stay text when it comes from a user.
    pub fn control_token_texts(&self) -> Vec<String> {
        self.specials
            .iter()
            .filter(|&&id| self.types[id as usize] != TokenType::UserDefined)
            .map(|&id| self.texts[id as usize].clone())
            .filter(|text| !text.is_empty())
            .collect()
    }

    fn encode_spans(&self, text: &[u8], add_special: bool, parse_special: bool, literal: &[Range<usize>]) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.kind {
            Kind::Bpe {
                merges,
                byte_tokens,
                pre,
            } => self.encode_bpe(text, parse_special, literal, (merges, byte_tokens, *pre), &mut out),
            Kind::SpmBpe { merges, byte_tokens } => {
                let mut symbols = Vec::new();
                for fragment in self.partition_specials(text, parse_special, literal) {
                    match fragment {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(range) => gemma4::tokenize(
                            &text[range],
                            merges,
                            byte_tokens,
                            &self.text_to_id,
                            &mut symbols,
                            &mut out,
                        ),
                    }
                }
            }
            Kind::Spm { spm, add_space_prefix } => {
                // A space before the first fragment and after each special token, as llama.cpp's
                // SentencePiece path does (`is_prev_special` starts true).
                let mut prev_special = true;
                for fragment in self.partition_specials(text, parse_special, literal) {
                    match fragment {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        // llama.cpp makes no fragment of empty text (an empty input gives no ids).
                        Fragment::Text(range) if range.is_empty() => {}
                        Fragment::Text(range) => {
                            let mut raw = Vec::with_capacity(range.len() + 1);
                            if *add_space_prefix && prev_special {
                                raw.push(b' ');
                            }
                            raw.extend_from_slice(&text[range]);
                            spm.tokenize(&spm::escape_whitespace(&raw), &self.text_to_id, &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// The byte-level BPE of the text between special tokens: the pre-tokenizer's words, each
    /// taken whole where the pre-tokenizer ignores merges and the word is a token, else merged.
    fn encode_bpe(
        &self,
        text: &[u8],
        parse_special: bool,
        literal: &[Range<usize>],
        (merges, byte_tokens, pre): (&bpe::Merges, &[u32; 256], PreTokenizer),
        out: &mut Vec<u32>,
    ) {
        let mut words = Vec::new();
        let mut symbols = Vec::new();
        let mut word_text = String::new();
        // The byte map, only for a pre-tokenizer that looks whole words up (not on every call).
        let byte_chars = pre.ignores_merges().then(bpe::byte_to_char_table);
        for fragment in self.partition_specials(text, parse_special, literal) {
            match fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text(range) => {
                    let fragment = &text[range.clone()];
                    words.clear();
                    pre.split(fragment, &mut words);
                    for word in &words {
                        if let Some(byte_chars) = &byte_chars {
                            word_text.clear();
                            word_text.extend(fragment[word.clone()].iter().map(|&b| byte_chars[b as usize]));
                            if let Some(&id) = self.text_to_id.get(&word_text) {
                                out.push(id);
                                continue;
                            }
                        }
                        symbols.clear();
                        symbols.extend(fragment[word.clone()].iter().map(|&b| byte_tokens[b as usize]));
                        merges.apply(&symbols, out);
                    }
                }
            }
        }
    }

    /// Split `text` into special tokens and the text between them, matching the longest
    /// special token first (llama.cpp's `tokenizer_st_partition`). A control token overlapping
    /// a `literal` range is not matched there.
    fn partition_specials(&self, text: &[u8], parse_special: bool, literal: &[Range<usize>]) -> Vec<Fragment> {
        let mut fragments = vec![Fragment::Text(0..text.len())];
        for &id in &self.specials {
            let ty = self.types[id as usize];
            if !parse_special && ty != TokenType::UserDefined {
                continue;
            }
            let needle = self.texts[id as usize].as_bytes();
            let mut next = Vec::with_capacity(fragments.len());
            for fragment in fragments {
                let Fragment::Text(range) = fragment else {
                    next.push(fragment);
                    continue;
                };
                let mut start = range.start;
                let mut search = range.start;
                while let Some(at) = find(&text[search..range.end], needle).map(|at| search + at) {
                    let end = at + needle.len();
                    if ty != TokenType::UserDefined && literal.iter().any(|l| l.start < end && at < l.end) {
                        search = at + 1;
                        continue;
                    }
                    if at > start {
                        next.push(Fragment::Text(start..at));
                    }
                    next.push(Fragment::Token(id));
                    start = end;
                    if self.rstrip.contains(&id) {
                        // C's isspace, as llama.cpp strips.
                        while start < range.end && matches!(text[start], b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') {
                            start += 1;
                        }
                    }
                    search = start;
                }
                if start < range.end {
                    next.push(Fragment::Text(start..range.end));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// The bytes token `id` decodes to. Control tokens decode to their text only when
    /// `special` is set; unused tokens and out-of-range ids decode to nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> &[u8] {
        match self.types.get(id as usize) {
            Some(TokenType::Control | TokenType::Unknown) if !special => &[],
            Some(_) => &self.pieces[id as usize],
            None => &[],
        }
    }

    /// Concatenate the pieces of `ids`.
    pub fn decode(&self, ids: &[u32], special: bool) -> Vec<u8> {
        ids.iter()
            .flat_map(|&id| self.token_to_piece(id, special).iter().copied())
            .collect()
    }

    /// A decoder that turns tokens into text one at a time, never splitting a character.
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, special)
    }
}

/// Token texts that end a generation, whatever the token's type: llama.cpp's list
/// (`llama_vocab::impl::load`, llama.cpp 0c1e570), in its order.
const EOG_TEXTS: [&str; 22] = [
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>", // o200k_harmony (gpt-oss)
    "<|call|>",   // o200k_harmony
    "<|flush|>",  // solar-open
    "<|calls|>",  // solar-open
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>", // paddleocr
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// The fill-in-the-middle pad, repository and file-separator tokens, which llama.cpp also ends
/// a generation at: the metadata's ids where given, else the first of these texts the
/// vocabulary has (llama.cpp's lists).
const FIM_EOG: [(&str, &[&str]); 3] = [
    (
        "tokenizer.ggml.fim_pad_token_id",
        &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    ),
    (
        "tokenizer.ggml.fim_rep_token_id",
        &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    ),
    ("tokenizer.ggml.fim_sep_token_id", &["<|file_sep|>"]),
];

/// The end-of-generation set, built as llama.cpp builds `special_eog_ids`: the FIM pad,
/// repository and separator tokens (`fim`), every token whose text is in [`EOG_TEXTS`], and EOS,
/// EOT and EOM (`special`). Then two of llama.cpp's rules by text. Harmony (gpt-oss's
/// o200k_harmony) ends its turns with `<|return|>` or `<|call|>`, solar-open with `<|flush|>` or
/// `<|calls|>`, and both close each message of a turn (the reasoning before the answer) with
/// `<|end|>`: a set holding a call token (`<|call|>` or `<|calls|>`) and `<|return|>` or
/// `<|flush|>` drops `<|end|>`, even where it is EOS or EOT, so that the model goes on from its
/// reasoning to its answer. Gemma 4 and PLaMo write `</s>` as text, so a set with `<|tool_response>`
/// or `<|plamo:eos|>` drops `</s>`.
///
/// llama.cpp also retypes the tokens it finds by text as control tokens; minfer keeps the
/// vocabulary's types, which decides only how they tokenize and print, never whether they end
/// a generation.
fn eog_tokens(
    texts: &[String],
    text_to_id: &HashMap<String, u32>,
    fim: impl IntoIterator<Item = Option<u32>>,
    special: [Option<u32>; 3],
) -> std::collections::HashSet<u32> {
    let mut eog: std::collections::HashSet<u32> = fim.into_iter().flatten().collect();
    eog.extend(EOG_TEXTS.iter().filter_map(|text| text_to_id.get(*text).copied()));
    eog.extend(special.into_iter().flatten());
    let holds = |eog: &std::collections::HashSet<u32>, text: &str| eog.iter().any(|&id| texts[id as usize] == text);
    let call = holds(&eog, "<|call|>") || holds(&eog, "<|calls|>");
    if call && (holds(&eog, "<|return|>") || holds(&eog, "<|flush|>")) {
        eog.retain(|&id| texts[id as usize] != "<|end|>");
    }
    if holds(&eog, "<|tool_response>") || holds(&eog, "<|plamo:eos|>") {
        eog.retain(|&id| texts[id as usize] != "</s>");
    }
    eog
}

/// The merge table of `tokenizer.ggml.merges` (`left right` by rank) over the vocabulary's ids.
fn merges_of(m: &Metadata, text_to_id: &HashMap<String, u32>) -> Result<bpe::Merges, TokenizerError> {
    let mut merges = bpe::Merges::default();
    for (index, merge) in string_array(m, "tokenizer.ggml.merges")?.iter().enumerate() {
        let (left, right) = merge.split_once(' ').ok_or_else(|| TokenizerError::BadMerge {
            index,
            merge: merge.clone(),
        })?;
        // A merge whose parts or result are not in the vocabulary can never fire.
        let (Some(&l), Some(&r), Some(&merged)) = (
            text_to_id.get(left),
            text_to_id.get(right),
            text_to_id.get(&format!("{left}{right}")),
        ) else {
            continue;
        };
        merges.insert(l, r, index as u32, merged);
    }
    Ok(merges)
}

/// Each byte's fallback token: `<0xXX>`, else the byte as a one-byte text (llama.cpp's
/// `byte_to_token`).
fn spm_byte_tokens(text_to_id: &HashMap<String, u32>) -> [Option<u32>; 256] {
    std::array::from_fn(|b| {
        text_to_id
            .get(&format!("<0x{b:02X}>"))
            .or_else(|| std::str::from_utf8(&[b as u8]).ok().and_then(|t| text_to_id.get(t)))
            .copied()
    })
}

/// The special tokens llama.cpp gives `LLAMA_TOKEN_ATTR_RSTRIP` (the GGUF file does not carry
/// token attributes, so llama.cpp's `llama_vocab::load` sets them by `general.name`): for a model
/// whose name holds "phi-3" or "phi3", every special token and `</s>`, but not `<unk>`, `<s>` and
/// `<|endoftext|>` (HF's `rstrip` on Phi-3's added tokens).
fn rstrip_tokens(m: &Metadata, specials: &[u32], text_to_id: &HashMap<String, u32>) -> std::collections::HashSet<u32> {
    let name = m.get_str("general.name").unwrap_or_default().to_lowercase();
    if !(name.contains("phi-3") || name.contains("phi3")) {
        return Default::default();
    }
    let mut set: std::collections::HashSet<u32> = specials.iter().copied().collect();
    set.extend(text_to_id.get("</s>"));
    for text in ["<unk>", "<s>", "<|endoftext|>"] {
        if let Some(id) = text_to_id.get(text) {
            set.remove(id);
        }
    }
    set
}

enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// The byte a SentencePiece byte token `<0xXX>` stands for.
fn spm_byte(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > haystack.len() {
        return None;
    }
    let first = needle[0];
    let mut i = 0;
    while i + needle.len() <= haystack.len() {
        match haystack[i..haystack.len() - needle.len() + 1]
            .iter()
            .position(|&b| b == first)
        {
            None => return None,
            Some(p) => {
                i += p;
                if &haystack[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;

    /// A byte-level BPE vocabulary of `specials` (text, type) after two normal tokens, with EOS
    /// and EOT where given.
    fn vocabulary(specials: &[(&str, TokenType)], eos: Option<&str>, eot: Option<&str>) -> Tokenizer {
        let mut texts = vec!["a".to_string(), "b".to_string()];
        let mut types = vec![TokenType::Normal as i32; 2];
        for (text, ty) in specials {
            texts.push(text.to_string());
            types.push(*ty as i32);
        }
        let id = |text: &str| Value::U32(texts.iter().position(|t| t == text).unwrap() as u32);
        let mut m = Metadata::new();
        m.set("tokenizer.ggml.model", Value::String("gpt2".into()));
        m.set("tokenizer.ggml.pre", Value::String("qwen2".into()));
        m.set("tokenizer.ggml.merges", Value::Array(Array::String(Vec::new())));
        m.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        if let Some(eos) = eos {
            m.set("tokenizer.ggml.eos_token_id", id(eos));
        }
        if let Some(eot) = eot {
            m.set("tokenizer.ggml.eot_token_id", id(eot));
        }
        m.set("tokenizer.ggml.tokens", Value::Array(Array::String(texts)));
        Tokenizer::from_metadata(&m).unwrap()
    }

    fn eog_texts(t: &Tokenizer) -> Vec<&str> {
        t.eog().into_iter().map(|id| t.token_text(id).unwrap()).collect()
    }

    use TokenType::{Control, Normal, UserDefined};

    /// gpt-oss's special tokens, as its GGUF files type them.
    const HARMONY: [(&str, TokenType); 8] = [
        ("<|endoftext|>", Control),
        ("<|start|>", Control),
        ("<|channel|>", Control),
        ("<|message|>", Control),
        ("<|end|>", Control),
        ("<|return|>", Control),
        ("<|call|>", Control),
        ("<|constrain|>", Control),
    ];

    #[test]
    fn a_harmony_vocabulary_ends_at_return_and_call_but_not_at_end() {
        let t = vocabulary(&HARMONY, Some("<|return|>"), None);
        assert_eq!(eog_texts(&t), ["<|endoftext|>", "<|return|>", "<|call|>"]);
        // Even as EOT (llama.cpp finds `<|end|>` as EOT by its text), it ends no generation.
        let t = vocabulary(&HARMONY, Some("<|return|>"), Some("<|end|>"));
        assert!(!t.is_eog(t.token_id("<|end|>").unwrap()));
        // Without `<|call|>`, `<|end|>` is the turn end it is for Phi-3.
        let phi3 = vocabulary(
            &[("<|endoftext|>", Control), ("<|end|>", Control)],
            Some("<|endoftext|>"),
            None,
        );
        assert_eq!(eog_texts(&phi3), ["<|endoftext|>", "<|end|>"]);
        let solar = [("<|end|>", Control), ("<|flush|>", Control), ("<|calls|>", Control)];
        assert_eq!(eog_texts(&vocabulary(&solar, None, None)), ["<|flush|>", "<|calls|>"]);
    }

    #[test]
    fn end_of_generation_texts_count_whatever_their_type_as_in_llama_cpp() {
        // Qwen's vocabularies hold `</s>` as a normal token, which llama.cpp ends at; its FIM
        // pad, repository and separator tokens end a generation too.
        let qwen = [
            ("</s>", Normal),
            ("<|endoftext|>", Control),
            ("<|im_start|>", Control),
            ("<|im_end|>", Control),
            ("<|fim_pad|>", Control),
            ("<|repo_name|>", Control),
            ("<|file_sep|>", Control),
            ("<tool_call>", UserDefined),
        ];
        let t = vocabulary(&qwen, Some("<|endoftext|>"), None);
        assert_eq!(
            eog_texts(&t),
            [
                "</s>",
                "<|endoftext|>",
                "<|im_end|>",
                "<|fim_pad|>",
                "<|repo_name|>",
                "<|file_sep|>"
            ]
        );
        // Gemma 4 writes `</s>` as text: with `<|tool_response>` in the set, it is no end.
        let gemma4 = [
            ("</s>", UserDefined),
            ("<turn|>", Control),
            ("<|tool_response>", UserDefined),
        ];
        assert_eq!(
            eog_texts(&vocabulary(&gemma4, None, None)),
            ["<turn|>", "<|tool_response>"]
        );
    }
}
