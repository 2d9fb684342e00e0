//! Speculative decoding changes the speed, never the output: with a draft model or prompt
//! lookup, a generation gives the tokens the plain loop gives, greedy or sampled with a seed,
//! on the tiny models (an F32 target with its Q4_0 twin as the draft: same vocabulary, different
//! numbers, so proposals are often wrong) and on the real model.

mod common;

use minfer::engine::{
    check_compatible, generate, generate_speculative, DraftOptions, Drafter, GenerateOptions, GenerationObserver,
    Model, ModelDrafter, ModelOptions, NgramDrafter, Session,
};
use minfer::sampling::SamplingParams;
use std::process::Command;

struct Quiet;

impl GenerationObserver for Quiet {
    fn on_text(&mut self, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

fn load(path: &std::path::Path) -> Model {
    Model::load(path, &ModelOptions::default()).unwrap()
}

/// The plain loop's tokens and the speculative loop's, for one prompt.
fn both(
    target: &Model,
    drafter: &mut dyn Drafter,
    prompt: &str,
    options: &GenerateOptions,
) -> (Vec<u32>, Vec<u32>, usize) {
    let tokens = target.encode(prompt);
    let mut plain_session = Session::new(target, 512);
    let plain = generate(&mut plain_session, target.tokenizer(), &tokens, options, |_| Ok(())).unwrap();
    let mut session = Session::new(target, 512);
    let draft = DraftOptions { max: 6, min: 0 };
    let fast = generate_speculative(
        &mut session,
        drafter,
        draft,
        target.tokenizer(),
        &tokens,
        options,
        &mut Quiet,
    )
    .unwrap();
    assert_eq!(fast.text, plain.text);
    (plain.tokens, fast.tokens, fast.stats.n_accepted)
}

const PROMPTS: [&str; 4] = [
    "Once upon a time",
    "def fibonacci(n):",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "1, 2, 3, 4, 5, 6,",
];

#[test]
fn a_draft_model_changes_no_token_greedy_or_sampled() {
    let target = load(&common::tiny_model("qwen2", "F32"));
    let draft = load(&common::tiny_model("qwen2", "Q4_0"));
    let mut accepted = 0;
    for sampling in [
        SamplingParams::greedy(),
        SamplingParams {
            temperature: 0.8,
            seed: 7,
            ..SamplingParams::default()
        },
    ] {
        let options = GenerateOptions {
            max_tokens: 64,
            ignore_eos: true,
            sampling,
            ..GenerateOptions::default()
        };
        for prompt in PROMPTS {
            let mut drafter = ModelDrafter::new(&draft, target.tokenizer(), 512, 0.0).unwrap();
            let (plain, fast, n) = both(&target, &mut drafter, prompt, &options);
            assert_eq!(fast, plain, "{prompt:?}");
            assert_eq!(fast.len(), 64);
            accepted += n;
        }
    }
    // The Q4_0 twin agrees often enough for the check to keep proposals, and not always.
    assert!(accepted > 0);
}

#[test]
fn prompt_lookup_changes_no_token() {
    let target = load(&common::tiny_model("qwen3", "Q8_0"));
    let options = GenerateOptions {
        max_tokens: 48,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    for prompt in PROMPTS {
        let mut drafter = NgramDrafter { size_n: 2, size_m: 8 };
        let (plain, fast, _) = both(&target, &mut drafter, prompt, &options);
        assert_eq!(fast, plain, "{prompt:?}");
    }
}

#[test]
fn a_draft_of_another_vocabulary_is_refused_naming_the_difference() {
    let qwen2 = load(&common::tiny_model("qwen2", "Q8_0"));
    let real = load(&common::default_model());
    let e = check_compatible(real.tokenizer(), qwen2.tokenizer()).unwrap_err();
    assert!(e.contains("BOS/EOS") || e.contains("token "), "{e}");
    assert!(ModelDrafter::new(&qwen2, real.tokenizer(), 256, 0.5).is_err());
    check_compatible(qwen2.tokenizer(), qwen2.tokenizer()).unwrap();
}

#[test]
fn the_cli_speculates_with_a_draft_model_or_prompt_lookup_and_prints_the_same_text() {
    let model = common::default_model();
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args([
                "-m",
                m,
                "-p",
                "Write a Python function that reverses a string.",
                "-n",
                "64",
                "--greedy",
            ])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (out.stdout, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (plain, _) = run(&[]);
    let (drafted, log) = run(&["-md", m, "--draft-max", "8"]);
    assert_eq!(drafted, plain);
    // The model drafting for itself keeps nearly every proposal: a batch row's logits and a
    // one-token pass's can differ in the last bits (the panel against the dot products), which
    // decides a near-tie now and then.
    let accepted = log
        .split("accepted ")
        .nth(1)
        .and_then(|rest| rest.split(" (").nth(1))
        .and_then(|pct| pct.split(' ').next())
        .and_then(|pct| pct.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no acceptance rate in: {log}"));
    assert!(accepted >= 90.0, "{log}");
    let (looked_up, _) = run(&["--spec-type", "ngram-simple"]);
    assert_eq!(looked_up, plain);
    let refused = |extra: &[&str], says: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
            .args(["-m", m, "-p", "hi", "-n", "4"])
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{extra:?}: {err}");
    };
    let tiny = common::tiny_model("qwen2", "Q8_0");
    refused(&["-md", tiny.to_str().unwrap()], "the draft model cannot be used");
    refused(&["--spec-type", "lookahead"], "--spec-type lookahead is not known");
    refused(&["--draft-p-min", "1.5"], "--draft-p-min 1.5 is out of range");
}

/// The proof on the real pair: the 1.5B checking the 0.5B's proposals prints what the
/// 1.5B prints alone, 128 greedy tokens on ten prompts (code and prose).
#[test]
fn the_1_5b_with_the_0_5b_as_its_draft_gives_its_own_greedy_text_on_ten_prompts() {
    let target = load(&common::model_1_5b());
    let draft = load(&common::default_model());
    let prompts = [
        "Write a Python function that checks whether a number is prime, with a docstring.",
        "Write a Python class for a stack with push, pop, peek and is_empty methods.",
        "Write a JavaScript function that debounces another function.",
        "Write a C function that reverses a singly linked list.",
        "Write a Rust function that counts the words in a string and returns a HashMap.",
        "Explain what a hash map is in two sentences.",
        "Write a SQL query that returns the ten most recent orders with their customer names.",
        "Write a bash script that counts the lines of every .py file in a directory.",
        "Write a Go function that merges two sorted slices of ints.",
        "What is the capital of France? Answer in one word, then give one fact about it.",
    ];
    let options = GenerateOptions {
        max_tokens: 128,
        sampling: SamplingParams::greedy(),
        ..GenerateOptions::default()
    };
    let (mut drafted, mut accepted) = (0, 0);
    for prompt in prompts {
        let messages = [serde_json::json!({"role": "user", "content": prompt})];
        let text = target
            .template()
            .render(&messages, None, true, &serde_json::Map::new())
            .unwrap();
        let tokens = target.encode(&text);
        let mut session = Session::new(&target, 1024);
        let plain = generate(&mut session, target.tokenizer(), &tokens, &options, |_| Ok(())).unwrap();
        let mut session = Session::new(&target, 1024);
        let mut drafter = ModelDrafter::new(&draft, target.tokenizer(), 1024, 0.75).unwrap();
        let draft_options = DraftOptions { max: 16, min: 0 };
        let fast = generate_speculative(
            &mut session,
            &mut drafter,
            draft_options,
            target.tokenizer(),
            &tokens,
            &options,
            &mut Quiet,
        )
        .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&fast.text),
            String::from_utf8_lossy(&plain.text),
            "{prompt:?}"
        );
        assert_eq!(fast.tokens, plain.tokens, "{prompt:?}");
        drafted += fast.stats.n_drafted;
        accepted += fast.stats.n_accepted;
    }
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(
        accepted * 2 > drafted,
        "the 0.5B should agree with the 1.5B most of the time"
    );
}

/// The chi-square quantile at upper tail `alpha` = 0.001 (z = 3.0902), by Wilson and Hilferty's
/// cube-root approximation: within a fraction of a percent for the degrees of freedom here.
fn chi_square_critical_0_001(df: usize) -> f64 {
    let (k, z) = (df as f64, 3.0902);
    let h = 2.0 / (9.0 * k);
    k * (1.0 - h + z * h.sqrt()).powi(3)
}

/// Sampling through a draft's proposals draws from the target's own distribution: over a fixed
/// set of seeds, the second generated token (kept from a checked row when the draft guessed the
/// first, drawn after a rejection otherwise) follows the exact marginal Σ p(t0)·p(t1 | t0) that
/// the target's sampler chain gives, at α = 0.001. The F32 model is the target, its Q4_0 twin
/// the draft.
#[test]
fn sampling_with_a_draft_follows_the_targets_distribution_by_a_chi_square_test() {
    let target = load(&common::tiny_model("qwen2", "F32"));
    let draft = load(&common::tiny_model("qwen2", "Q4_0"));
    let prompt = target.encode("Once upon a time");
    let sampling = SamplingParams {
        temperature: 1.5,
        ..SamplingParams::default()
    };
    // The exact marginal of the second token, from one-token passes and the sampler's weights.
    let weights = |history: &[u32]| -> Vec<(u32, f64)> {
        let mut session = Session::new(&target, 64);
        let logits = session.eval(history, 1).unwrap().to_vec();
        let mut sampler = minfer::sampling::Sampler::new(sampling.clone()).unwrap();
        let candidates = sampler.build_candidates(&logits, history).unwrap();
        let total: f64 = candidates.iter().map(|c| c.weight).sum();
        candidates.iter().map(|c| (c.id, c.weight / total)).collect()
    };
    let mut expected = std::collections::BTreeMap::<u32, f64>::new();
    for (t0, p0) in weights(&prompt) {
        let history: Vec<u32> = prompt.iter().copied().chain([t0]).collect();
        for (t1, p1) in weights(&history) {
            *expected.entry(t1).or_default() += p0 * p1;
        }
    }
    // A third token to make, so that the second is checked against a proposal.
    let options = |seed| GenerateOptions {
        max_tokens: 3,
        ignore_eos: true,
        sampling: SamplingParams {
            seed,
            ..sampling.clone()
        },
        ..GenerateOptions::default()
    };
    const N: u64 = 3000;
    let mut counts = std::collections::BTreeMap::<u32, u64>::new();
    let (mut kept, mut rejected) = (0, 0);
    let mut drafter = ModelDrafter::new(&draft, target.tokenizer(), 64, 0.0).unwrap();
    let mut session = Session::new(&target, 64);
    for seed in 0..N {
        let result = generate_speculative(
            &mut session,
            &mut drafter,
            DraftOptions { max: 1, min: 0 },
            target.tokenizer(),
            &prompt,
            &options(seed),
            &mut Quiet,
        )
        .unwrap();
        *counts.entry(result.tokens[1]).or_default() += 1;
        if result.stats.n_accepted > 0 {
            kept += 1;
        } else {
            rejected += 1;
        }
    }
    // Both halves of the rule ran: proposals kept and proposals replaced.
    assert!(kept > 100 && rejected > 100, "kept {kept}, rejected {rejected}");
    // Bins of at least 5 expected draws; the rest pooled into one.
    let (mut chi2, mut bins, mut pooled_expected, mut pooled_seen) = (0.0, 0, 0.0, 0u64);
    for (token, p) in &expected {
        let (e, seen) = (p * N as f64, counts.remove(token).unwrap_or(0));
        if e >= 5.0 {
            chi2 += (seen as f64 - e).powi(2) / e;
            bins += 1;
        } else {
            pooled_expected += e;
            pooled_seen += seen;
        }
    }
    assert!(counts.is_empty(), "tokens the target's chain never allows: {counts:?}");
    if pooled_expected >= 5.0 {
        chi2 += (pooled_seen as f64 - pooled_expected).powi(2) / pooled_expected;
        bins += 1;
    }
    let critical = chi_square_critical_0_001(bins - 1);
    eprintln!("chi-square {chi2:.1} over {bins} bins (critical {critical:.1}); kept {kept}, rejected {rejected}");
    assert!(bins >= 5, "the test needs a spread distribution, got {bins} bins");
    assert!(
        chi2 < critical,
        "chi-square {chi2:.1} >= {critical:.1} over {bins} bins"
    );
}

/// A server whose slots draft (a draft model, or prompt lookup) answers concurrent requests,
/// greedy and seeded, with the text the same server gives without drafting, and counts the
/// drafted and kept tokens in `/metrics`.
#[test]
fn the_server_drafts_per_slot_without_changing_any_answer_and_reports_the_counts() {
    let target = common::tiny_model("qwen2", "F32");
    let draft = common::tiny_model("qwen2", "Q4_0");
    let answers = |extra: &[&str]| {
        let server = common::server::Server::start(&target, &[&["--n-slots", "3"], extra].concat(), &[]);
        let bodies: Vec<serde_json::Value> = PROMPTS
            .iter()
            .enumerate()
            .flat_map(|(i, prompt)| {
                [
                    serde_json::json!({"prompt": prompt, "max_tokens": 40, "temperature": 0}),
                    serde_json::json!({"prompt": prompt, "max_tokens": 40, "temperature": 0.9, "seed": i}),
                ]
            })
            .collect();
        let texts: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = bodies
                .iter()
                .map(|body| {
                    let server = &server;
                    scope.spawn(move || {
                        let (status, reply) = server.json("/v1/completions", body.clone());
                        assert_eq!(status, 200, "{reply}");
                        reply["choices"][0]["text"].as_str().unwrap().to_string()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let counts = (
            server.metric("minfer_draft_tokens_total"),
            server.metric("minfer_draft_tokens_accepted_total"),
        );
        (texts, counts, server.log())
    };
    let (plain, (drafted, _), _) = answers(&[]);
    assert_eq!(drafted, 0.0);
    let d = draft.to_str().unwrap();
    let (with_draft, (drafted, kept), log) = answers(&["-md", d, "--draft-max", "4", "--draft-p-min", "0"]);
    assert_eq!(with_draft, plain, "{log}");
    assert!(
        drafted > 0.0 && kept > 0.0 && kept <= drafted,
        "{drafted} {kept}\n{log}"
    );
    assert!(log.contains("drafted "), "{log}");
    let (looked_up, _, log) = answers(&["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2"]);
    assert_eq!(looked_up, plain, "{log}");
}
