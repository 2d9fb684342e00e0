//! The gemma3 architecture on a real model, Gemma 3 270M Q4_K_M (`scripts/fetch-model.sh
//! gemma3`), against llama.cpp 0c1e570 on the same file (tests/fixtures/gemma3-logits): BOS added
//! as the file says, tokenization, last-position logits on prompts shorter and much longer than
//! the model's 512-position window (its local layers then see only the last 512 positions),
//! and greedy continuations up to the first near-tie.
//!
//! The logit bounds: llama.cpp does not hold this model to 1.0 / 0.999 against itself. Its own
//! runs with flash attention off, or with an f32 KV cache as well, land up to 2.93 from its
//! default run (cosine 0.99818 at worst, on these prompts): Gemma's large activations amplify the
//! rounding of Q8 activations and f16 attention. minfer is held to that band — max |dlogit|
//! <= 3.0 and cosine >= 0.998 (measured: 2.65 and 0.99885) — and to the same top-1 wherever the
//! reference's top-1/top-2 gap is at least 0.25, and its greedy text to llama.cpp's.

mod common;

use common::Loaded;
use minfer::sampling::argmax;
use std::sync::{Mutex, OnceLock};

fn model() -> &'static Mutex<Loaded> {
    static MODEL: OnceLock<Mutex<Loaded>> = OnceLock::new();
    MODEL.get_or_init(|| common::load_reference_model(common::gemma3()))
}

fn cases() -> Vec<common::ReferenceCase> {
    common::reference_cases("gemma3-logits")
}

#[test]
fn gemma3_tokenizes_every_reference_prompt_as_llama_cpp_with_its_bos() {
    let loaded = model().lock().unwrap();
    for case in cases() {
        assert_eq!(loaded.model.encode(&case.prompt), case.tokens, "prompt {}", case.index);
        assert_eq!(case.tokens[0], 2, "prompt {} starts with <bos>", case.index);
    }
}

#[test]
fn gemma3_last_position_logits_match_llama_cpp_within_and_beyond_the_window() {
    let mut loaded = model().lock().unwrap();
    let (mut report, mut failed) = (Vec::new(), false);
    let mut beyond = 0;
    for case in cases() {
        loaded.session.reset();
        let ours = loaded.session.eval(&case.tokens, 1).unwrap().to_vec();
        let reference = common::read_f32(&common::fixtures().join(format!("gemma3-logits/{}.f32", case.index)));
        assert_eq!(ours.len(), reference.len());
        let d = ours
            .iter()
            .zip(&reference)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        let cos = common::cosine(&ours, &reference);
        let top1 = (argmax(&ours).unwrap(), argmax(&reference).unwrap());
        let ok = cos >= 0.998 && d <= 3.0 && (case.top2_gap < 0.25 || top1.0 == top1.1);
        beyond += usize::from(case.tokens.len() > 512);
        report.push(format!(
            "prompt {} ({} tokens): max |dlogit| {d:.4} cosine {cos:.6}; top-1 {} vs {} (gap {:.3}){}",
            case.index,
            case.tokens.len(),
            top1.0,
            top1.1,
            case.top2_gap,
            if ok { "" } else { "  <- out of bounds" }
        ));
        failed |= !ok;
    }
    eprintln!("{}", report.join("\n"));
    assert!(!failed, "{}", report.join("\n"));
    assert!(
        beyond >= 2,
        "the references must hold prompts longer than the 512-position window"
    );
}

#[test]
fn gemma3_greedy_continuations_match_llama_cpp_up_to_the_first_near_tie() {
    let mut loaded = model().lock().unwrap();
    common::check_greedy_continuations(&mut loaded, &cases(), 64);
}

/// With a context past window and pass (2048 cells), the local layers keep a window cache of
/// 1024 cells (512 positions and one 512-token pass, llama.cpp's size), read through explicit
/// cell lists once the prompt outgrows it; the logits are the full cache's bits, and the
/// greedy text after them too.
#[test]
fn gemma3_with_its_window_cache_gives_the_full_caches_logits_beyond_the_window() {
    let mut loaded = model().lock().unwrap();
    let Loaded { model, session: full } = &mut *loaded;
    let mut windowed = minfer::engine::Session::new(model, 2048);
    assert_eq!(windowed.n_ctx_swa(), 1024);
    for case in cases().iter().filter(|c| c.tokens.len() > 512) {
        windowed.reset();
        let mut ours = Vec::new();
        for chunk in case.tokens.chunks(512) {
            ours = windowed.eval(chunk, 1).unwrap().to_vec();
        }
        let cells = windowed.kv_window().unwrap().cells().seq_cells(0).len();
        assert!(cells < case.tokens.len(), "prompt {}: {cells} window cells", case.index);
        full.reset();
        let expected = full.eval(&case.tokens, 1).unwrap();
        assert!(
            ours.iter().zip(expected).all(|(a, b)| a.to_bits() == b.to_bits()),
            "prompt {}: the window cache's last logits differ from the full cache's",
            case.index
        );
        for step in 0..16 {
            let next = argmax(&ours).unwrap();
            ours = windowed.eval(&[next], 1).unwrap().to_vec();
            let expected = full.eval(&[next], 1).unwrap();
            assert_eq!(ours, expected, "prompt {}: decode step {step}", case.index);
        }
    }
}

/// Context shifts past the window on the real model, the window cache smaller than the context.
/// With the 867-token prompt in 1100 cells (passes of 64: a window cache of 576), the shift
/// discards more than a window, so the kept first tokens are out of every later token's window
/// anyway: 260 greedy tokens are the full caches' own. With the 594-token prompt in 640 cells
/// (passes of 16: 528), the shift discards less than a window: the full caches' local layers
/// then see the kept first tokens again, which the window cache dropped long before (as
/// llama.cpp's does once it wraps); it goes on over what it holds, and the text stays varied.
#[test]
fn gemma3_generates_through_context_shifts_past_the_window() {
    use minfer::engine::{generate, GenerateOptions, Session, SessionOptions};
    let loaded = model().lock().unwrap();
    let run = |n_prompt: usize, n_ctx: usize, n_ubatch: usize, max_tokens: usize, swa_full: bool| {
        let case = cases().into_iter().find(|c| c.tokens.len() == n_prompt).unwrap();
        let options = GenerateOptions {
            max_tokens,
            ignore_eos: true,
            sampling: minfer::sampling::SamplingParams::greedy(),
            context_shift: Some(64),
            ..Default::default()
        };
        let session_options = SessionOptions {
            n_ctx,
            n_ubatch: Some(n_ubatch),
            swa_full,
            ..Default::default()
        };
        let mut session = Session::with_options(&loaded.model, &session_options).unwrap();
        assert_eq!(session.n_ctx_swa(), if swa_full { 0 } else { 512 + n_ubatch });
        let result = generate(&mut session, loaded.model.tokenizer(), &case.tokens, &options, |_| {
            Ok(())
        })
        .unwrap();
        assert!(result.stats.n_shifts >= 1, "the context never shifted");
        result.tokens
    };
    assert_eq!(run(867, 1100, 64, 260, false), run(867, 1100, 64, 260, true));
    let tokens = run(594, 640, 16, 96, false);
    let tail = &tokens[48..];
    let distinct: std::collections::HashSet<_> = tail.iter().collect();
    assert!(distinct.len() > 8, "{tail:?}");
}
