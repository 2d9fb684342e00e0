//! Tokenizer throughput on ~1 MB of mixed text with the default model's vocabulary, and the
//! hand-written qwen2 pre-tokenizer against the same rules run by a backtracking regex engine.
//!
//! Run: `cargo bench --bench tokenize` (needs the default model: scripts/fetch-model.sh).

use minfer::gguf::GgufFile;
use minfer::tokenizer::{PreTokenizer, Tokenizer};
use std::time::{Duration, Instant};

const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn corpus() -> String {
    let paragraphs = [
        "The small town by the river woke up slowly. Shops opened their doors, children walked to school, and the old baker sold fresh bread to everyone who passed by.\n\n",
        "fn main() {\n    let xs: Vec<u32> = (0..100).map(|i| i * i).collect();\n    println!(\"{:?}\", xs.iter().sum::<u32>());\n}\n",
        "SELECT name, COUNT(*) AS n FROM users WHERE created_at >= '2024-01-01' GROUP BY name ORDER BY n DESC;\n",
        "日本語のテキストです。中文文本和한국어 텍스트. Ünïcödé façade — naïve café 🚀🦀\n",
        "    def add(a, b):\n        return a + b  # 3.14159 2718 1e-10\n\n\n",
    ];
    let mut text = String::new();
    let mut i = 0usize;
    while text.len() < 1 << 20 {
        text.push_str(paragraphs[i % paragraphs.len()]);
        text.push_str(&format!("[{i}] "));
        i += 1;
    }
    text
}

fn best_of<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..runs {
        let t = Instant::now();
        let out = f();
        best = best.min(t.elapsed());
        last = Some(out);
    }
    (best, last.expect("at least one run"))
}

fn main() {
    let home = std::env::var("HOME").expect("HOME");
    let cache = std::env::var("MINFER_MODELS").unwrap_or_else(|_| format!("{home}/.cache/minfer/models"));
    let path = format!("{cache}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{e} (run scripts/fetch-model.sh)"));

    let (load, tokenizer) = best_of(3, || Tokenizer::from_metadata(file.metadata()).unwrap());
    println!("tokenizer load:            {:>8.1} ms", load.as_secs_f64() * 1e3);

    let text = corpus();
    let mb = text.len() as f64 / (1 << 20) as f64;
    let (encode, ids) = best_of(5, || tokenizer.encode(&text, false, true));
    println!(
        "encode {:.2} MB:            {:>8.1} ms  ({:.1} MB/s, {:.0} tokens/s, {} tokens)",
        mb,
        encode.as_secs_f64() * 1e3,
        mb / encode.as_secs_f64(),
        ids.len() as f64 / encode.as_secs_f64(),
        ids.len()
    );
    let (decode, bytes) = best_of(5, || tokenizer.decode(&ids, true));
    assert_eq!(bytes, text.as_bytes());
    println!("decode:                    {:>8.1} ms", decode.as_secs_f64() * 1e3);

    let (hand, words) = best_of(5, || {
        let mut ranges = Vec::new();
        PreTokenizer::Qwen2.split(text.as_bytes(), &mut ranges);
        ranges.len()
    });
    let re = fancy_regex::Regex::new(QWEN2_PATTERN).unwrap();
    let (regex, regex_words) = best_of(3, || re.find_iter(&text).count());
    assert_eq!(words, regex_words, "both splitters must find the same words");
    println!(
        "pre-tokenize, hand-written:{:>8.1} ms  ({words} words)",
        hand.as_secs_f64() * 1e3
    );
    println!(
        "pre-tokenize, fancy-regex: {:>8.1} ms  ({:.1}x slower)",
        regex.as_secs_f64() * 1e3,
        regex.as_secs_f64() / hand.as_secs_f64()
    );
}
