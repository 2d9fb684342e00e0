//! The real model against llama.cpp: last-position logits and greedy continuations for the
//! reference prompts (tests/fixtures/qwen25-logits, made by llama.cpp 0c1e570 on the same
//! model). Bounds from the issue: cosine >= 0.999, max |dlogit| <= 1.0, same top-1 unless
//! llama.cpp's own top-1/top-2 gap is under 0.25, greedy identical up to the first step whose
//! reference gap is under 0.25 (llama.cpp itself moves by that much between batch shapes).

mod common;

use common::Loaded;
use minfer::engine::{generate, GenerateOptions, Session};
use minfer::sampling::{argmax, SamplingParams};
use std::sync::{Mutex, OnceLock};

fn model() -> &'static Mutex<Loaded> {
    static MODEL: OnceLock<Mutex<Loaded>> = OnceLock::new();
    MODEL.get_or_init(|| common::load_reference_model(common::default_model()))
}

/// The logits at the last position of `text` (specials parsed, no template), from an empty
/// context.
fn last_logits(loaded: &mut Loaded, text: &str) -> Vec<f32> {
    let tokens = loaded.model.encode(text);
    loaded.session.reset();
    loaded.session.eval(&tokens, 1).unwrap().to_vec()
}

fn cases() -> Vec<common::ReferenceCase> {
    common::reference_cases("qwen25-logits")
}

#[test]
fn last_position_logits_match_llama_cpp_for_every_reference_prompt() {
    let mut loaded = model().lock().unwrap();
    let mut report = Vec::new();
    for case in cases() {
        assert_eq!(
            loaded.model.encode(&case.prompt),
            case.tokens,
            "prompt {} tokens",
            case.index
        );
        let ours = last_logits(&mut loaded, &case.prompt);
        let reference = common::read_f32(&common::fixtures().join(format!("qwen25-logits/{}.f32", case.index)));
        assert_eq!(ours.len(), reference.len());
        let max_abs = ours
            .iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let cos = common::cosine(&ours, &reference);
        report.push(format!(
            "prompt {}: max |dlogit| {max_abs:.4}, cosine {cos:.6}",
            case.index
        ));
        assert!(
            cos >= 0.999 && max_abs <= 1.0,
            "prompt {}: max |dlogit| {max_abs}, cosine {cos}",
            case.index
        );
        if case.top2_gap >= 0.25 {
            assert_eq!(
                argmax(&ours),
                argmax(&reference),
                "prompt {}: top-1 differs",
                case.index
            );
        }
    }
    eprintln!("{}", report.join("\n"));
}

#[test]
fn greedy_continuations_match_llama_cpp_up_to_the_first_near_tie() {
    let mut loaded = model().lock().unwrap();
    for case in cases() {
        let comparable = case.gaps.iter().position(|&g| g < 0.25).unwrap_or(case.greedy.len());
        if comparable == 0 {
            continue;
        }
        let options = GenerateOptions {
            max_tokens: comparable,
            ignore_eos: true,
            sampling: SamplingParams::greedy(),
            ..Default::default()
        };
        let loaded = &mut *loaded;
        loaded.session.reset();
        let Loaded { model, session } = &mut *loaded;
        let result = generate(session, model.tokenizer(), &case.tokens, &options, |_| Ok(())).unwrap();
        assert_eq!(
            result.tokens,
            case.greedy[..comparable],
            "prompt {}: greedy tokens",
            case.index
        );
    }
}

#[test]
fn the_cli_greedy_output_is_llama_cpps_continuation() {
    // Prompt 4 has no near-tie in its 32 greedy steps, so the whole continuation must match.
    let case = cases()
        .into_iter()
        .find(|c| c.gaps.iter().all(|&g| g >= 0.25))
        .expect("a prompt without near-ties");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(common::default_model())
        .arg(&case.prompt)
        .args(["--no-template", "--greedy", "-n", "32", "--ignore-eos", "-t", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let loaded = model().lock().unwrap();
    let expected = loaded.model.tokenizer().decode(&case.greedy, false);
    assert_eq!(String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&expected));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Prefill:") && stderr.contains("Generated:") && stderr.contains("Total:"),
        "{stderr}"
    );
}

/// Qwen2.5's K rows carry outliers (blocks of 32 whose largest value is 100 to 160 while the
/// median is 2 to 8): a Q8_0 block's step is then over 1, so a Q8_0 K cache moves the logits
/// far more than a Q8_0 V cache (symmetric K quantization is known to break Qwen2.5). Both are
/// measured: the bounds (cosine 0.998, the same top-1 where llama.cpp's gap is over
/// 0.5) hold for a Q8_0 V cache; a Q8_0 K cache is reported, and must be the worse of the two
/// (which also shows that the K type is honoured).
#[test]
fn a_q8_0_kv_cache_against_llama_cpps_f16_one() {
    use minfer::graph::DType;
    let loaded = model().lock().unwrap();
    let mut report = Vec::new();
    let mut worsts = Vec::new();
    for (type_k, type_v) in [(DType::F16, DType::Q8_0), (DType::Q8_0, DType::Q8_0)] {
        let mut session = Session::new(&loaded.model, 1024);
        session.set_kv_types(type_k, type_v).unwrap();
        let mut worst = 1.0f64;
        let mut top1_kept = 0;
        let mut clear = 0;
        for case in cases() {
            let tokens = loaded.model.encode(&case.prompt);
            session.reset();
            let ours = session.eval(&tokens, 1).unwrap().to_vec();
            let reference = common::read_f32(&common::fixtures().join(format!("qwen25-logits/{}.f32", case.index)));
            let cos = common::cosine(&ours, &reference);
            worst = worst.min(cos);
            if case.top2_gap > 0.5 {
                clear += 1;
                top1_kept += usize::from(argmax(&ours) == argmax(&reference));
            }
        }
        report.push(format!(
            "K {} V {}: worst cosine {worst:.6}, top-1 kept on {top1_kept} of {clear} clear prompts",
            type_k.name(),
            type_v.name()
        ));
        if type_k == DType::F16 {
            assert!(worst >= 0.998 && top1_kept == clear, "{}", report.last().unwrap());
        }
        worsts.push(worst);
    }
    eprintln!("{}", report.join("\n"));
    assert!(worsts[1] < worsts[0], "{}", report.join("\n"));
}
