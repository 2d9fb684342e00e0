//! One answer from a model, through the library API: load a [`Model`], render the prompt with
//! the model's own chat template, open a [`Session`] and stream the generated text to stdout.
//!
//! ```sh
//! cargo run --release --example generate -- MODEL.gguf "Write a haiku about Rust" [N_TOKENS]
//! ```

use minfer::engine::{generate, GenerateOptions, Model, ModelOptions, Session};
use minfer::sampling::SamplingParams;
use std::error::Error;
use std::io::Write;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: generate MODEL.gguf PROMPT [N_TOKENS]";
    let path = args.next().ok_or(usage)?;
    let prompt = args.next().ok_or(usage)?;
    let max_tokens = args.next().map_or(Ok(64), |n| n.parse())?;

    // Threads and backends are the model's, shared by every session over it.
    let model = Model::load(&path, &ModelOptions::default())?;
    let messages = [serde_json::json!({"role": "user", "content": prompt})];
    let text = model.template().render(&messages, None, true, &Default::default())?;
    let tokens = model.encode(&text);

    let mut session = Session::new(&model, tokens.len() + max_tokens);
    let options = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    let mut stdout = std::io::stdout().lock();
    let result = generate(&mut session, model.tokenizer(), &tokens, &options, |bytes| {
        stdout
            .write_all(bytes)
            .and_then(|()| stdout.flush())
            .map_err(|e| e.to_string())
    })?;
    writeln!(stdout)?;
    eprintln!("{} ({:?})", result.stats.summary(), result.stop_reason);
    Ok(())
}
