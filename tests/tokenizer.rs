//! The byte-level BPE tokenizer against llama.cpp's tokenization of the real model, plus
//! round-trip and streaming properties over random (even invalid UTF-8) byte strings, and the
//! hand-written pre-tokenizers' splits against reference splits (a regex engine's, llama.cpp's).

mod common;

use minfer::gguf::{GgufFile, Metadata, Value};
use minfer::tokenizer::{Tokenizer, TokenizerError};
use std::sync::OnceLock;

fn qwen25() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        let file = GgufFile::open(common::default_model()).unwrap();
        Tokenizer::from_metadata(file.metadata()).unwrap()
    })
}

#[test]
fn every_reference_string_tokenizes_exactly_as_llama_cpp() {
    let t = qwen25();
    let cases = std::fs::read_to_string(common::fixtures().join("tokenizer/tokenize_qwen25.jsonl")).unwrap();
    let mut n = 0;
    for line in cases.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = case["text"].as_str().unwrap();
        let expected: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let ours = t.encode(text, false, true);
        assert_eq!(ours, expected, "text {text:?}");
        assert_eq!(t.decode(&ours, true), text.as_bytes(), "decode of {text:?}");
        n += 1;
    }
    assert!(n >= 25, "only {n} cases");
}

#[test]
fn special_token_text_is_plain_text_when_specials_are_off() {
    let t = qwen25();
    let im_start = t.token_id("<|im_start|>").unwrap();
    assert_eq!(t.encode("<|im_start|>user", false, true)[0], im_start);
    let plain = t.encode("<|im_start|>user", false, false);
    assert!(!plain.contains(&im_start), "{plain:?}");
    assert_eq!(t.decode(&plain, false), b"<|im_start|>user");
    // User-defined tokens are matched even without special parsing, as in llama.cpp.
    assert_eq!(
        t.encode("<tool_call>", false, false),
        [t.token_id("<tool_call>").unwrap()]
    );
}

#[test]
fn control_tokens_decode_to_text_only_when_asked() {
    let t = qwen25();
    let ids = t.encode("<|im_start|>hi<|im_end|>", false, true);
    assert_eq!(t.decode(&ids, true), b"<|im_start|>hi<|im_end|>");
    assert_eq!(t.decode(&ids, false), b"hi");
    assert!(t.is_eog(t.token_id("<|im_end|>").unwrap()));
    assert!(t.is_eog(t.token_id("<|endoftext|>").unwrap()));
    assert!(!t.is_eog(t.token_id("<|im_start|>").unwrap()));
}

#[test]
fn the_real_tokenizer_reports_its_special_ids() {
    let t = qwen25();
    assert_eq!(t.n_vocab(), 151936);
    assert_eq!(t.bos(), Some(151643));
    assert_eq!(t.eos(), Some(151645));
    assert!(!t.add_bos());
    assert_eq!(
        t.encode("Hello", true, true),
        t.encode("Hello", false, true),
        "Qwen adds no BOS"
    );
}

fn random_text(rng: &mut common::Rng) -> Vec<u8> {
    const PIECES: &[&str] = &[
        "the",
        " quick",
        "Brown",
        " fox",
        "'s",
        "'LL",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\n\n\n",
        "      ",
        "0",
        "42",
        "3.14159",
        "日本語",
        "中文",
        "한국어",
        "🚀",
        "👩‍💻",
        "é",
        "e\u{301}",
        "<|im_start|>",
        "<|im_end|>",
        "<tool_call>",
        "(",
        ")",
        "{",
        "}",
        "::",
        "->",
        "\u{a0}",
        "\u{3000}",
        "Ⅻ",
        "٣",
        "_",
        "--",
        "!!!",
        "x",
        "\u{feff}",
    ];
    let mut out = Vec::new();
    for _ in 0..rng.below(40) {
        match rng.below(10) {
            // A random byte: often invalid UTF-8.
            0 => out.push(rng.next() as u8),
            // A truncated multi-byte character.
            1 => {
                let c = ["日", "🚀", "é"][rng.below(3)].as_bytes();
                out.extend_from_slice(&c[..1 + rng.below(c.len() - 1)]);
            }
            // A long whitespace or digit run.
            2 => {
                let unit = [" ", "\n", "7", "\t "][rng.below(4)];
                for _ in 0..rng.below(30) {
                    out.extend_from_slice(unit.as_bytes());
                }
            }
            _ => out.extend_from_slice(PIECES[rng.below(PIECES.len())].as_bytes()),
        }
    }
    out
}

#[test]
fn decoding_the_encoding_of_any_bytes_gives_them_back() {
    let t = qwen25();
    let mut rng = common::Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..3000 {
        let text = random_text(&mut rng);
        let ids = t.encode_bytes(&text, false, false);
        assert_eq!(t.decode(&ids, false), text, "ids {ids:?}");
    }
}

#[test]
fn streamed_decoding_equals_one_shot_decoding_and_never_splits_a_character() {
    let t = qwen25();
    let mut rng = common::Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..3000 {
        let text = random_text(&mut rng);
        let ids = t.encode_bytes(&text, false, true);
        let mut stream = t.stream_decoder(true);
        let mut streamed = Vec::new();
        for &id in &ids {
            let piece = stream.push(id);
            // A piece may contain invalid bytes only where the text itself had them.
            if std::str::from_utf8(&text).is_ok() {
                assert!(std::str::from_utf8(&piece).is_ok(), "broken UTF-8 piece {piece:?}");
            }
            streamed.extend_from_slice(&piece);
        }
        streamed.extend_from_slice(&stream.finish());
        assert_eq!(streamed, t.decode(&ids, true));
    }
}

#[test]
fn a_character_split_across_tokens_is_held_back_until_complete() {
    let t = qwen25();
    // Find a character whose encoding spans several tokens (rare CJK / emoji are byte-split).
    let text = "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🦀";
    let ids = t.encode(text, false, false);
    assert!(
        ids.len() > text.chars().count(),
        "expected byte-split tokens, got {ids:?}"
    );
    let mut stream = t.stream_decoder(false);
    let mut held_back = 0;
    for &id in &ids {
        let piece = stream.push(id);
        std::str::from_utf8(&piece).expect("every piece is valid UTF-8");
        if piece.is_empty() {
            held_back += 1;
        }
    }
    assert!(held_back > 0, "some tokens should have been held back");
    assert!(stream.finish().is_empty());
}

fn tiny_metadata() -> Metadata {
    GgufFile::open(common::tiny_model("qwen2", "F32"))
        .unwrap()
        .metadata()
        .clone()
}

#[test]
fn an_unknown_pre_tokenizer_is_refused_naming_it() {
    let mut m = tiny_metadata();
    m.set("tokenizer.ggml.pre", Value::String("chatglm-bpe".into()));
    let err = Tokenizer::from_metadata(&m).err().unwrap();
    assert!(
        matches!(err, TokenizerError::UnknownPreTokenizer { ref pre } if pre == "chatglm-bpe"),
        "{err}"
    );
    assert!(err.to_string().contains("'chatglm-bpe'"));
}

#[test]
fn missing_merges_are_refused_naming_the_key() {
    let mut w = minfer::gguf::GgufWriter::new();
    for (k, v) in tiny_metadata().iter().filter(|(k, _)| *k != "tokenizer.ggml.merges") {
        w.set(k, v.clone());
    }
    let err = Tokenizer::from_metadata(w.metadata()).err().unwrap();
    assert_eq!(err.to_string(), "metadata key 'tokenizer.ggml.merges' is missing");
}

#[test]
fn a_byte_without_a_token_is_dropped_as_llama_cpp_drops_it() {
    let mut m = tiny_metadata();
    let Some(Value::Array(minfer::gguf::Array::String(tokens))) = m.get("tokenizer.ggml.tokens").cloned() else {
        panic!("tokens");
    };
    let mut tokens = tokens;
    let newline = tokens.iter().position(|t| t == "Ċ").unwrap();
    tokens[newline] = "NOT-A-BYTE".into();
    m.set(
        "tokenizer.ggml.tokens",
        Value::Array(minfer::gguf::Array::String(tokens)),
    );
    let tok = Tokenizer::from_metadata(&m).unwrap();
    let with = tok.encode("a\nb", false, false);
    // The newline's byte has no token: the words around it tokenize as they would alone.
    assert_eq!(with.len(), 2, "{with:?}");
    assert_eq!(
        with,
        [tok.encode("a", false, false), tok.encode("b", false, false)].concat()
    );
}

#[test]
fn an_unsupported_tokenizer_model_is_refused_naming_it() {
    let mut m = tiny_metadata();
    // WordPiece (BERT) and Unigram (T5) are not implemented.
    for model in ["bert", "t5"] {
        m.set("tokenizer.ggml.model", Value::String(model.into()));
        let err = Tokenizer::from_metadata(&m).err().unwrap();
        assert!(err.to_string().contains(&format!("'{model}'")), "{err}");
    }
    // SentencePiece needs its scores, and says so by key.
    m.set("tokenizer.ggml.model", Value::String("llama".into()));
    let err = Tokenizer::from_metadata(&m).err().unwrap();
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
}

#[test]
fn the_tiny_models_tokenizer_parses_specials_to_single_ids() {
    let t = Tokenizer::from_metadata(&tiny_metadata()).unwrap();
    assert_eq!(t.encode("<|endoftext|>", false, true), [4000]);
    assert_eq!(t.encode("<|im_start|>", false, true), [4001]);
    assert_eq!(t.encode("<|im_end|>", false, true), [4002]);
    let ids = t.encode("The quick brown fox jumps over the lazy dog.", false, true);
    assert_eq!(t.decode(&ids, false), b"The quick brown fox jumps over the lazy dog.");
}

/// The Qwen2 pre-tokenizer regex, for a backtracking engine that supports its look-ahead.
pub const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

#[test]
fn the_hand_written_qwen2_splitter_agrees_with_the_regex_on_random_text() {
    let re = fancy_regex::Regex::new(QWEN2_PATTERN).unwrap();
    let mut rng = common::Rng(0x1234_5678_9abc_def1);
    let mut checked = 0;
    for _ in 0..5000 {
        let lossy = String::from_utf8_lossy(&random_text(&mut rng)).into_owned();
        let text = lossy.as_str();
        let expected: Vec<&str> = re.find_iter(text).map(|m| m.unwrap().as_str()).collect();
        let mut ranges = Vec::new();
        minfer::tokenizer::PreTokenizer::Qwen2.split(text.as_bytes(), &mut ranges);
        let ours: Vec<&str> = ranges.into_iter().map(|r| &text[r]).collect();
        assert_eq!(ours, expected, "text {text:?}");
        checked += 1;
    }
    assert_eq!(checked, 5000);
}

#[test]
fn the_gpt4o_splitter_cuts_every_reference_text_where_llama_cpp_does() {
    let cases = std::fs::read_to_string(common::fixtures().join("tokenizer/pretokenize_gpt4o.jsonl")).unwrap();
    let mut n = 0;
    for line in cases.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = case["text"].as_str().unwrap();
        let mut expected = Vec::new();
        let mut at = 0;
        for len in case["words"].as_array().unwrap() {
            let end = at + len.as_u64().unwrap() as usize;
            expected.push(&text[at..end]);
            at = end;
        }
        let mut ranges = Vec::new();
        minfer::tokenizer::PreTokenizer::Gpt4o.split(text.as_bytes(), &mut ranges);
        let ours: Vec<&str> = ranges.into_iter().map(|r| &text[r]).collect();
        assert_eq!(ours, expected, "text {text:?}");
        n += 1;
    }
    // The hand-written cases and the 3000 random strings of scripts/llama-cpp-pretokenize.cpp.
    assert!(n >= 3000, "only {n} cases");
}
