//! The llama architecture on a real model, SmolLM2-135M-Instruct Q4_1 (`scripts/fetch-model.sh
//! smollm2`), against llama.cpp 0c1e570 on the same file (tests/fixtures/smollm2-logits) and
//! against the exact f64 forward (tests/fixtures/smollm2-exact): tokenization, last-position
//! logits, greedy continuations up to the first near-tie, and a chat through the server with the
//! model's own template.
//!
//! The logit bounds: this small model amplifies rounding (Q8 activations, an f16 KV cache) more
//! than the Qwen models do. llama.cpp itself lands up to 1.40 from the exact logits (cosine
//! 0.99773), and moves by up to 1.51 (cosine 0.99870) when only its flash attention is switched
//! off; so minfer is held to cosine >= 0.998 and max |dlogit| <= 1.5 against llama.cpp (measured:
//! 0.99875 and 1.35), and to the band llama.cpp keeps around the exact logits, cosine >= 0.997
//! and max |dlogit| <= 2.0 (measured: 0.99768 and 1.68), with the same top-1 wherever the
//! reference's top-1/top-2 gap is at least 0.25.

mod common;

use common::server::Server;
use common::Loaded;
use minfer::sampling::argmax;
use std::sync::{Mutex, OnceLock};

fn model() -> &'static Mutex<Loaded> {
    static MODEL: OnceLock<Mutex<Loaded>> = OnceLock::new();
    MODEL.get_or_init(|| common::load_reference_model(common::smollm2()))
}

fn cases() -> Vec<common::ReferenceCase> {
    common::reference_cases("smollm2-logits")
}

#[test]
fn smollm2_tokenizes_every_reference_prompt_as_llama_cpp() {
    let loaded = model().lock().unwrap();
    for case in cases() {
        assert_eq!(loaded.model.encode(&case.prompt), case.tokens, "prompt {}", case.index);
    }
}

#[test]
fn smollm2_last_position_logits_match_llama_cpp() {
    let mut loaded = model().lock().unwrap();
    let (mut report, mut failed) = (Vec::new(), false);
    for case in cases() {
        loaded.session.reset();
        let ours = loaded.session.eval(&case.tokens, 1).unwrap().to_vec();
        let reference = common::read_f32(&common::fixtures().join(format!("smollm2-logits/{}.f32", case.index)));
        let exact = common::read_f32(&common::fixtures().join(format!("smollm2-exact/{}.f32", case.index)));
        assert_eq!(ours.len(), reference.len());
        let max_abs = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        let (d_ref, cos_ref) = (max_abs(&ours, &reference), common::cosine(&ours, &reference));
        let (d_exact, cos_exact) = (max_abs(&ours, &exact), common::cosine(&ours, &exact));
        let top1 = (argmax(&ours).unwrap(), argmax(&reference).unwrap());
        let ok = cos_ref >= 0.998
            && d_ref <= 1.5
            && cos_exact >= 0.997
            && d_exact <= 2.0
            && (case.top2_gap < 0.25 || top1.0 == top1.1);
        report.push(format!(
            "prompt {}: llama.cpp max |dlogit| {d_ref:.4} cosine {cos_ref:.6}; exact {d_exact:.4} {cos_exact:.6}; \
             top-1 {} vs {} (gap {:.3}){}",
            case.index,
            top1.0,
            top1.1,
            case.top2_gap,
            if ok { "" } else { "  <- out of bounds" }
        ));
        failed |= !ok;
    }
    eprintln!("{}", report.join("\n"));
    assert!(!failed, "{}", report.join("\n"));
}

#[test]
fn smollm2_greedy_continuations_match_llama_cpp_up_to_the_first_near_tie() {
    let mut loaded = model().lock().unwrap();
    common::check_greedy_continuations(&mut loaded, &cases(), 64);
}

#[test]
fn a_chat_with_smollm2_through_the_server_renders_its_template_and_answers_as_llama_cpp() {
    // Reference prompt 9 is SmolLM2's own template rendered for this one user message (with the
    // template's default system prompt) and the assistant's turn opened; llama.cpp's greedy
    // answer to it is clear (no near-tie) up to and past its end of turn.
    const QUESTION: &str = "What is 2+2?";
    let case = cases().into_iter().find(|c| c.index == 9).unwrap();
    let expected = {
        let loaded = model().lock().unwrap();
        let messages = [serde_json::json!({"role": "user", "content": QUESTION})];
        let templated = loaded
            .model
            .template()
            .render(&messages, None, true, &serde_json::Map::new())
            .unwrap();
        assert_eq!(templated, case.prompt);
        let comparable = case.gaps.iter().position(|&g| g < 0.25).unwrap_or(case.greedy.len());
        let end = case.greedy.iter().position(|&t| t == 2).unwrap();
        assert!(end < comparable, "llama.cpp's answer ends before its first near-tie");
        String::from_utf8(loaded.model.tokenizer().decode(&case.greedy[..end], false)).unwrap()
    };
    assert_eq!(expected, "The answer to this classic math problem is 4.");

    let server = Server::start(&common::smollm2(), &["--n-slots", "1", "--n-ctx", "512"], &[]);
    let (status, reply) = server.json(
        "/v1/chat/completions",
        serde_json::json!({
            "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0,
            "max_tokens": 64,
        }),
    );
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["choices"][0]["message"]["content"], expected.as_str(), "{reply}");
    assert_eq!(reply["choices"][0]["finish_reason"], "stop", "{reply}");
}
