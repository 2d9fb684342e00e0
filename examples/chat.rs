//! A conversation in the terminal, through the library API: each line read from stdin is a user
//! turn; the whole conversation is rendered again with the model's chat template, and only the
//! tokens after the longest prefix already in the session's KV cache are prefilled (so a
//! template that rewrites earlier turns still works, at the cost of re-reading them).
//!
//! ```sh
//! cargo run --release --example chat -- MODEL.gguf [SYSTEM_PROMPT] [-n MAX_TOKENS_PER_REPLY]
//! ```

use minfer::engine::{generate_cached, GenerateOptions, GenerationObserver, Model, ModelOptions, Session};
use minfer::sampling::SamplingParams;
use serde_json::{json, Value};
use std::error::Error;
use std::io::{BufRead, Write};

/// Streams the reply to stdout and keeps its text for the conversation.
struct Reply<W: Write> {
    out: W,
    text: Vec<u8>,
}

impl<W: Write> GenerationObserver for Reply<W> {
    fn on_text(&mut self, text: &[u8]) -> Result<(), String> {
        self.text.extend_from_slice(text);
        self.out
            .write_all(text)
            .and_then(|()| self.out.flush())
            .map_err(|e| e.to_string())
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let usage = "usage: chat MODEL.gguf [SYSTEM_PROMPT] [-n MAX_TOKENS_PER_REPLY]";
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut max_tokens = 256;
    if let Some(i) = args.iter().position(|a| a == "-n") {
        max_tokens = args.get(i + 1).ok_or(usage)?.parse()?;
        args.drain(i..i + 2);
    }
    let mut args = args.into_iter();
    let path = args.next().ok_or(usage)?;
    let model = Model::load(&path, &ModelOptions::default())?;
    let mut session = Session::new(&model, 4096);
    let mut messages: Vec<Value> = args
        .next()
        .map(|s| json!({"role": "system", "content": s}))
        .into_iter()
        .collect();
    // The tokens whose K/V the session holds, in order.
    let mut cached: Vec<u32> = Vec::new();
    let options = GenerateOptions {
        max_tokens,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };

    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        messages.push(json!({"role": "user", "content": line}));
        let prompt = model.encode(&model.template().render(&messages, None, true, &Default::default())?);
        if prompt.len() + options.max_tokens > session.n_ctx() {
            return Err(format!("the conversation no longer fits in {} tokens", session.n_ctx()).into());
        }
        // Keep the longest common prefix; the last prompt token is always evaluated, for the
        // logits of the first new token.
        let n_cached = cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        session.truncate(n_cached);
        let mut reply = Reply {
            out: std::io::stdout().lock(),
            text: Vec::new(),
        };
        let result = generate_cached(&mut session, model.tokenizer(), &prompt, n_cached, &options, &mut reply)?;
        writeln!(reply.out)?;
        eprintln!(
            "[{} of {} prompt tokens reused] {}",
            n_cached,
            prompt.len(),
            result.stats.summary()
        );
        cached = [prompt.as_slice(), &result.tokens].concat();
        cached.truncate(session.n_past());
        messages.push(json!({"role": "assistant", "content": String::from_utf8_lossy(&reply.text)}));
    }
    Ok(())
}
