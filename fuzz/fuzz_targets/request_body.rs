//! Fuzz the server's request reader: `minfer::server::read_request_body` on arbitrary bytes, as
//! a chat body and as a completion body, then, for a chat body it accepts, the built-in ChatML
//! template's guarded render of its messages (control-token text kept apart).
//!
//! What must hold for every input:
//! * nothing panics, hangs or aborts, and every refusal is a 4xx (a body can be wrong, never
//!   the server);
//! * the reader allocates at most a constant factor of the input's size plus a fixed allowance
//!   (checked with a counting allocator, see `MAX_AMPLIFICATION`): its JSON value budget, not
//!   the body size alone, bounds what a body becomes;
//! * a guarded render gives back exactly the plain render's text, and each marked range holds a
//!   control-token text, with the built-in ChatML and, with `tools`, with the tiny Qwen2
//!   model's own template, which prints tool schemas and call arguments, keys included, through
//!   `tojson`;
//! * every grammar an accepted body carries (`json_schema`, `response_format`'s schema,
//!   `grammar`, each tool's `parameters`) compiles against the tiny model's vocabulary or is
//!   refused with an error, on the fuzzer's own thread: the depth budgets, not a large stack,
//!   keep a schema of chained `$ref`s or a GBNF chain of unit rules from overflowing it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::engine::{Model, ModelOptions};
use minfer::grammar::GrammarSpec;
use minfer::server::{read_request_body, BodyKind};
use minfer::template::ChatTemplate;
use std::sync::OnceLock;

/// The tiny Qwen2 model (its tokenizer, grammar vocabulary and chat template), loaded once; the
/// fuzzer runs from the repository's root.
fn model() -> &'static Model {
    static MODEL: OnceLock<Model> = OnceLock::new();
    MODEL.get_or_init(|| {
        Model::load("tests/fixtures/models/tiny-qwen2-Q8_0.gguf", &ModelOptions::default())
            .expect("run the fuzzer from the repository's root, where tests/fixtures/models is")
    })
}

/// Bytes the reader may have allocated at once, per byte of input: a parsed JSON value costs
/// a few tens of bytes however short its text (`0,` is two bytes).
const MAX_AMPLIFICATION: usize = 96;
/// Allowance for fixed costs (error messages, the first buckets of maps).
const FIXED_ALLOWANCE: usize = 1 << 20;

#[path = "counting_alloc.rs"]
mod counting_alloc;

const GUARDED: [&str; 3] = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"];

fuzz_target!(|data: &[u8]| {
    for kind in [BodyKind::Chat, BodyKind::Completion] {
        let (result, used) = counting_alloc::peak_during(|| read_request_body(kind, data));
        assert!(
            used <= MAX_AMPLIFICATION * data.len() + FIXED_ALLOWANCE,
            "{kind:?}: {used} bytes at once for a {}-byte body",
            data.len()
        );
        if let Err(e) = &result {
            assert!(e.status.is_client_error(), "{kind:?}: {} {}", e.status, e.message);
        }
        if result.is_ok() {
            if kind == BodyKind::Chat {
                render(data);
            }
            compile(data);
        }
    }
});

/// Every grammar of an accepted body, compiled against the tiny model's vocabulary.
fn compile(data: &[u8]) {
    let body: serde_json::Value = serde_json::from_slice(data).expect("an accepted body is JSON");
    let mut specs = Vec::new();
    for schema in [&body["json_schema"], &body["response_format"]["json_schema"]["schema"]] {
        if schema.is_object() || schema.is_boolean() {
            specs.push(GrammarSpec::JsonSchema(schema.clone()));
        }
    }
    if let Some(text) = body["grammar"].as_str() {
        specs.push(GrammarSpec::Gbnf(text.to_string()));
    }
    for tool in body["tools"].as_array().into_iter().flatten() {
        if tool["function"]["parameters"].is_object() {
            specs.push(GrammarSpec::JsonSchema(tool["function"]["parameters"].clone()));
        }
    }
    for spec in specs {
        // Compiled or refused: both are fine; a panic or an overflow is not.
        let _ = model().compile_grammar(&spec);
    }
}

/// The accepted chat body's messages through ChatML and, with tools, the tiny model's own
/// template, guarded and plain.
fn render(data: &[u8]) {
    let body: serde_json::Value = serde_json::from_slice(data).expect("an accepted body is JSON");
    let Some(messages) = body["messages"].as_array() else {
        panic!("an accepted chat body has messages");
    };
    render_with(&ChatTemplate::chatml(), messages, None);
    if let Some(tools) = body["tools"].as_array() {
        render_with(model().template(), messages, Some(tools));
    }
}

fn render_with(template: &ChatTemplate, messages: &[serde_json::Value], tools: Option<&[serde_json::Value]>) {
    let guarded: Vec<String> = GUARDED.map(String::from).to_vec();
    let extra = serde_json::Map::new();
    let plain = template.render(messages, tools, true, &extra);
    match template.render_guarded(messages, tools, true, &extra, &guarded) {
        Ok(rendered) => {
            assert_eq!(Some(&rendered.text), plain.as_ref().ok(), "guarded and plain renders differ");
            for range in &rendered.literal {
                let text = rendered.text.get(range.clone()).expect("a marked range lies on char boundaries");
                assert!(GUARDED.contains(&text), "marked {text:?}");
            }
        }
        Err(e) => assert!(plain.is_err(), "only the guarded render failed: {e}"),
    }
}
