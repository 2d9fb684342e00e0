//! Context shifting (llama.cpp's): the first tokens kept, a range after them discarded, the rest
//! moved down with K turned back by RoPE instead of evaluated again. Checked where exactness is
//! defined: the moved K rows against an f64 RoPE of the same keys at their new positions, and a
//! whole sequence shifted back against prefilling it at the shifted positions. (A fresh prefill
//! of only the kept tokens is no reference: their K and V were computed with the discarded
//! tokens in context.) Attention after a removed range is `tests/sequences.rs`' business.

mod common;

use minfer::engine::{Batch, Model, ModelOptions, Session};
use minfer::graph::DType;

fn load(arch: &str, ty: &str) -> Model {
    let options = ModelOptions {
        n_threads: Some(2),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    Model::load(common::tiny_model(arch, ty), &options).unwrap()
}

/// Exactness is defined for an f32 cache: an f16 one rounds each shifted row again.
fn f32_cache(mut session: Session) -> Session {
    session.set_kv_types(DType::F32, DType::F32).unwrap();
    session
}

fn prompt(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    let n_vocab = model.hparams().n_vocab as u64;
    let mut rng = common::Rng(seed);
    (0..n).map(|_| (rng.next() % n_vocab.min(3000)) as u32).collect()
}

/// Turn each head of `row` by `delta` positions in f64, with the exact angles
/// `delta * base^(-2i / n_rot)` and NeoX pairing `(i, i + n_rot / 2)`.
fn rope_f64(row: &[f32], delta: f64, model: &Model) -> Vec<f64> {
    let hp = model.hparams();
    let mut out: Vec<f64> = row.iter().map(|&x| x as f64).collect();
    for head in out.chunks_exact_mut(hp.head_dim) {
        for i in 0..hp.n_rot / 2 {
            let theta = delta * (hp.rope_freq_base as f64).powf(-2.0 * i as f64 / hp.n_rot as f64);
            let (x0, x1) = (head[i], head[i + hp.n_rot / 2]);
            head[i] = x0 * theta.cos() - x1 * theta.sin();
            head[i + hp.n_rot / 2] = x0 * theta.sin() + x1 * theta.cos();
        }
    }
    out
}

#[test]
fn shifted_k_rows_equal_an_f64_rope_of_the_same_keys_at_their_new_positions() {
    for arch in ["qwen2", "qwen3"] {
        let model = load(arch, "F32");
        let row = model.hparams().n_kv_embd();
        let mut session = f32_cache(Session::new(&model, 64));
        session.eval(&prompt(&model, 40, 7), 1).unwrap();
        let (n_keep, n_discard) = (4, 10);
        let before: Vec<Vec<f32>> = (0..model.hparams().n_layer)
            .flat_map(|l| [session.kv_rows(l, false).unwrap(), session.kv_rows(l, true).unwrap()])
            .collect();
        session.shift_context(n_keep, n_discard).unwrap();
        assert_eq!(session.n_past(), 30);
        let mut worst = 0f64;
        for layer in 0..model.hparams().n_layer {
            let (k0, v0) = (&before[2 * layer], &before[2 * layer + 1]);
            let k = session.kv_rows(layer, false).unwrap();
            let v = session.kv_rows(layer, true).unwrap();
            for cell in 0..30 {
                let from = if cell < n_keep { cell } else { cell + n_discard };
                let (old_k, new_k) = (&k0[from * row..][..row], &k[cell * row..][..row]);
                // V moves unchanged; K of the kept cells too.
                assert_eq!(
                    &v[cell * row..][..row],
                    &v0[from * row..][..row],
                    "{arch} layer {layer} V cell {cell}"
                );
                if cell < n_keep {
                    assert_eq!(new_k, old_k, "{arch} layer {layer} kept K cell {cell}");
                    continue;
                }
                // The key at its old position `from`, turned back to the key itself and then to
                // its new position `cell`, all in f64.
                let key = rope_f64(old_k, -(from as f64), &model);
                let key: Vec<f32> = key.iter().map(|&x| x as f32).collect();
                let expected = rope_f64(&key, cell as f64, &model);
                for (&got, &want) in new_k.iter().zip(&expected) {
                    let err = (got as f64 - want).abs() / want.abs().max(1.0);
                    worst = worst.max(err);
                }
            }
        }
        eprintln!("{arch}: worst relative error of a shifted K value {worst:e}");
        assert!(worst < 1e-4, "{arch}: worst relative error {worst:e}");
    }
}

#[test]
fn a_sequence_shifted_back_gives_the_logits_of_prefilling_it_at_the_shifted_positions() {
    for (arch, ty) in [("qwen2", "F32"), ("qwen3", "F32"), ("qwen2", "Q4_K")] {
        let model = load(arch, ty);
        let tokens = prompt(&model, 30, 11);
        let next = tokens[3];
        let delta = 20;
        // Prefilled at positions 20..50, then moved to 0..30.
        let mut shifted = f32_cache(Session::new(&model, 64));
        shifted.decode(&Batch::for_sequence(&tokens, delta, 0, 1)).unwrap();
        shifted.shift_context(0, delta).unwrap();
        assert_eq!(shifted.n_past(), tokens.len());
        shifted.eval(&[next], 1).unwrap();
        // Prefilled at 0..30 directly.
        let mut direct = f32_cache(Session::new(&model, 64));
        direct.eval(&tokens, 1).unwrap();
        direct.eval(&[next], 1).unwrap();
        let (a, b) = (shifted.last_logits().unwrap(), direct.last_logits().unwrap());
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        eprintln!("{arch} {ty}: max |Δlogit| {worst:e}");
        assert!(worst < 1e-3, "{arch} {ty}: max |Δlogit| {worst}");
    }
}

#[test]
fn generation_past_the_context_shifts_it_and_produces_every_token() {
    let model = load("qwen2", "Q8_0");
    let mut session = Session::new(&model, 256);
    let options = minfer::engine::GenerateOptions {
        max_tokens: 700,
        ignore_eos: true,
        sampling: minfer::sampling::SamplingParams::greedy(),
        context_shift: Some(4),
        ..Default::default()
    };
    let result = minfer::engine::generate(
        &mut session,
        model.tokenizer(),
        &prompt(&model, 20, 3),
        &options,
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(result.tokens.len(), 700);
    assert!(result.stats.n_shifts >= 3, "{} shifts", result.stats.n_shifts);
    assert!(session.n_past() <= 256);
    // Without shifting, the same generation stops at the end of the context.
    let mut session = Session::new(&model, 256);
    let options = minfer::engine::GenerateOptions {
        context_shift: None,
        ..options
    };
    let result = minfer::engine::generate(
        &mut session,
        model.tokenizer(),
        &prompt(&model, 20, 3),
        &options,
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(result.stop_reason, minfer::engine::StopReason::ContextFull);
}

#[test]
fn the_cli_generates_all_700_tokens_asked_for_in_a_256_token_context() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_minfer"))
        .arg(common::tiny_model("qwen2", "Q8_0"))
        .args([
            "hi",
            "-n",
            "700",
            "--n-ctx",
            "256",
            "--ignore-eos",
            "--greedy",
            "--context-shift",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("Generated: 700 tokens"), "{err}");
    assert!(err.contains("Context shifts:"), "{err}");
}

#[test]
fn a_token_stream_keeps_the_common_prefix_and_prefills_only_what_follows() {
    use minfer::engine::TokenStream;
    let model = load("qwen2", "Q8_0");
    let mut session = Session::new(&model, 64);
    let mut stream = TokenStream::new();
    let first = prompt(&model, 20, 5);
    let prepared = stream.prepare(&mut session, &first, 0, true).unwrap();
    assert_eq!((prepared.n_cached, prepared.prompt.len()), (0, 20));
    session.eval(&prepared.prompt, 1).unwrap();
    stream.record(&session, 0);
    // The next turn extends the first: only its new tokens (and the last old one, whose
    // logits are needed) are left to prefill.
    let mut second = first.clone();
    second.extend(prompt(&model, 10, 6));
    let prepared = stream.prepare(&mut session, &second, 0, true).unwrap();
    assert_eq!(prepared.n_cached, 20);
    assert_eq!(prepared.prompt, second);
    session.eval(&prepared.prompt[prepared.n_cached..], 1).unwrap();
    stream.record(&session, 0);
    // A rewrite at token 12 keeps 12 and reads the rest again.
    let mut rewritten = second.clone();
    rewritten[12] = (rewritten[12] + 1) % 3000;
    let prepared = stream.prepare(&mut session, &rewritten, 0, true).unwrap();
    assert_eq!(prepared.n_cached, 12);
    assert_eq!(session.n_past(), 12);
}

#[test]
fn a_token_stream_longer_than_the_context_shifts_keeping_its_start() {
    use minfer::engine::TokenStream;
    let model = load("qwen2", "Q8_0");
    let mut session = Session::new(&model, 64);
    let mut stream = TokenStream::new();
    let mut tokens = prompt(&model, 40, 8);
    let prepared = stream.prepare(&mut session, &tokens, 4, true).unwrap();
    session.eval(&prepared.prompt, 1).unwrap();
    stream.record(&session, 0);
    // 30 more do not fit beside 40: half of the 36 after the kept 4 goes.
    tokens.extend(prompt(&model, 30, 9));
    let prepared = stream.prepare(&mut session, &tokens, 4, true).unwrap();
    assert_eq!(prepared.n_discarded, 18);
    assert_eq!(stream.dropped(), 18);
    assert_eq!(prepared.n_cached, 22);
    assert_eq!(&prepared.prompt[..4], &tokens[..4]);
    assert_eq!(&prepared.prompt[4..], &tokens[22..]);
    // Without shifting, the same turn is refused and the session is left as it was.
    let mut session = Session::new(&model, 64);
    let mut stream = TokenStream::new();
    let prepared = stream.prepare(&mut session, &tokens[..40], 4, false).unwrap();
    session.eval(&prepared.prompt, 1).unwrap();
    stream.record(&session, 0);
    let err = stream.prepare(&mut session, &tokens, 4, false).unwrap_err();
    assert!(matches!(err, minfer::engine::EngineError::ContextFull { .. }), "{err}");
}
