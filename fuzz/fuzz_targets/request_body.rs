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
//!   control-token text.

#![no_main]

use libfuzzer_sys::fuzz_target;
use minfer::server::{read_request_body, BodyKind};
use minfer::template::ChatTemplate;

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
        if kind == BodyKind::Chat && result.is_ok() {
            render(data);
        }
    }
});

/// The accepted chat body's messages through ChatML, guarded and plain.
fn render(data: &[u8]) {
    let body: serde_json::Value = serde_json::from_slice(data).expect("an accepted body is JSON");
    let Some(messages) = body["messages"].as_array() else {
        panic!("an accepted chat body has messages");
    };
    let guarded: Vec<String> = GUARDED.map(String::from).to_vec();
    let chatml = ChatTemplate::chatml();
    let extra = serde_json::Map::new();
    let plain = chatml.render(messages, None, true, &extra);
    match chatml.render_guarded(messages, None, true, &extra, &guarded) {
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
