//! llama.cpp's own tokenizer test vectors (`models/ggml-vocab-*.gguf` with `.inp`/`.out`, from
//! llama.cpp 0c1e570; `scripts/fetch-llama-vocab.sh` fetches them, `scripts/test.sh` runs it):
//! every vocabulary minfer's tokenizer takes tokenizes every input to llama.cpp's ids
//! (`llama_tokenize` with add_special and parse_special off, as llama.cpp's test-tokenizer-0
//! calls it), and every other one is refused naming its tokenizer model or pre-tokenizer.

use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;
use std::path::PathBuf;

fn vocab_dir() -> PathBuf {
    let dir = std::env::var_os("MINFER_LLAMA_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/minfer/llama-vocab-0c1e570")
        });
    assert!(
        dir.join(".complete").exists(),
        "llama.cpp's vocabulary tests are missing at {}; run scripts/fetch-llama-vocab.sh (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// The test cases of `vocab`: each input and llama.cpp's ids, split as test-tokenizer-0 splits
/// them.
fn cases(vocab: &std::path::Path) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(vocab.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(vocab.with_extension("gguf.out")).unwrap();
    // test-tokenizer-0's split: a separator at the very end leaves no empty input after it.
    let sep = "\n__ggml_vocab_test__\n";
    let mut inputs: Vec<&str> = inp.split(sep).collect();
    if inp.ends_with(sep) {
        inputs.pop();
    }
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(inputs.len(), outputs.len(), "{}", vocab.display());
    inputs.into_iter().map(String::from).zip(outputs).collect()
}

#[test]
fn every_vocabulary_minfer_takes_tokenizes_llama_cpps_inputs_to_its_ids() {
    let dir = vocab_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "gguf") && p.with_extension("gguf.inp").exists())
        .collect();
    files.sort();
    let (mut passed, mut refused) = (Vec::new(), Vec::new());
    for path in &files {
        let name = path
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .trim_start_matches("ggml-vocab-")
            .to_string();
        let file = GgufFile::open(path).unwrap();
        let m = file.metadata();
        let tokenizer = match Tokenizer::from_metadata(m) {
            Ok(t) => t,
            Err(e) => {
                // Refused by name: the message names the file's tokenizer model or pre-tokenizer.
                let model = m.get_str("tokenizer.ggml.model").unwrap_or_default().to_string();
                let pre = m.get_str("tokenizer.ggml.pre").unwrap_or_default().to_string();
                let message = e.to_string();
                assert!(
                    message.contains(&format!("'{model}'")) || message.contains(&format!("'{pre}'")),
                    "{name}: the refusal names neither '{model}' nor '{pre}': {message}"
                );
                refused.push(format!("{name} ({message})"));
                continue;
            }
        };
        for (i, (text, expected)) in cases(path).iter().enumerate() {
            let got = tokenizer.encode(text, false, false);
            assert_eq!(&got, expected, "{name}: input {i} {text:?}");
        }
        passed.push(name);
    }
    eprintln!("tokenized as llama.cpp: {}", passed.join(", "));
    eprintln!("refused by name:\n  {}", refused.join("\n  "));
    for must in [
        "gpt-2",
        "mpt",
        "starcoder",
        "refact",
        "command-r",
        "qwen2",
        "llama-bpe",
        "llama-spm",
        "phi-3",
        "deepseek-llm",
        "deepseek-coder",
        "falcon",
        "qwen35",
        "gemma-4",
    ] {
        assert!(
            passed.iter().any(|p| p == must),
            "{must} should tokenize as llama.cpp does"
        );
    }
}

#[test]
fn phi3s_special_tokens_swallow_the_whitespace_after_them_as_llama_cpp_strips_it() {
    // llama.cpp marks Phi-3's special tokens RSTRIP by the model's name (the file has no token
    // attributes): the newline after `<|user|>` is not a token, nor the blanks after `</s>`;
    // after `<s>` they stay. The ids are `llama-tokenize -m ggml-vocab-phi-3.gguf -f FILE --ids`
    // of llama.cpp 0c1e570 (BOS added, specials parsed).
    let file = GgufFile::open(vocab_dir().join("ggml-vocab-phi-3.gguf")).unwrap();
    let tokenizer = Tokenizer::from_metadata(file.metadata()).unwrap();
    let text = "<|user|>\nHello  there<|end|>\n<|assistant|>\n  Hi<|end|> \t\nx</s>  y<s> z";
    assert_eq!(
        tokenizer.encode(text, true, true),
        [1, 32010, 15043, 29871, 727, 32007, 32001, 6324, 32007, 921, 2, 343, 1, 29871, 503]
    );
    // Without parsing specials the text is text.
    assert!(!tokenizer.encode(text, true, false).contains(&32010));
}

#[test]
fn gemma4s_tokenizer_adds_its_bos_parses_its_turn_tokens_and_decodes_back_to_the_text() {
    // `llama-tokenize -m ggml-vocab-gemma-4.gguf -f FILE --ids` of llama.cpp 0c1e570: BOS added
    // (llama.cpp forces it for gemma4), `<turn|>` a special token, the llama in byte tokens.
    let file = GgufFile::open(vocab_dir().join("ggml-vocab-gemma-4.gguf")).unwrap();
    let tokenizer = Tokenizer::from_metadata(file.metadata()).unwrap();
    let text = "Hello  world\n\n\tTabs and ünïcödé 🦙 text<turn|>\n   end";
    let ids = tokenizer.encode(text, true, true);
    assert_eq!(
        ids,
        [
            2, 9259, 138, 12392, 108, 255968, 76222, 532, 174898, 238527, 236755, 55515, 236859, 236743, 478, 397, 404,
            391, 1816, 106, 107, 139, 643
        ]
    );
    assert_eq!(String::from_utf8(tokenizer.decode(&ids[1..], true)).unwrap(), text);
}
