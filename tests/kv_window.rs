//! The window cache (llama.cpp's ISWA cache) on the tiny Gemma 3 model, whose window of 6
//! positions is far shorter than its prompts: read in passes of 4 tokens, its local layers keep
//! 10 cells, and every logit still matches llama.cpp's, and the full cache's bits
//! (`--swa-full`), through long prompts, decoding, batching several sequences, prefix reuse, a
//! context shift and saved sessions.

mod common;

use minfer::engine::{generate, Batch, EngineError, GenerateOptions, Model, ModelOptions, Session, SessionOptions};
use minfer::sampling::SamplingParams;

const N_UBATCH: usize = 4;

fn model() -> Model {
    let options = ModelOptions {
        n_threads: Some(2),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    Model::load(common::tiny_model("gemma3", "Q4_0"), &options).unwrap()
}

fn session(model: &Model, swa_full: bool, n_seq_max: usize) -> Session {
    let options = SessionOptions {
        n_ctx: 512,
        n_seq_max,
        n_ubatch: Some(N_UBATCH),
        swa_full,
        ..Default::default()
    };
    Session::with_options(model, &options).unwrap()
}

/// The reference prompts' tokens, and llama.cpp's logits at every position where recorded.
fn cases() -> Vec<(Vec<u32>, Option<Vec<f32>>)> {
    let dir = common::fixtures().join("tiny-reference/tiny-gemma3-Q4_0");
    std::fs::read_to_string(dir.join("prompts.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let case: serde_json::Value = serde_json::from_str(line).unwrap();
            let tokens = case["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect();
            let logits = case["logits_file"].as_str().map(|f| common::read_f32(&dir.join(f)));
            (tokens, logits)
        })
        .collect()
}

/// Every position's logits, the prompt read in passes of [`N_UBATCH`] tokens.
fn eval_in_passes(session: &mut Session, tokens: &[u32]) -> Vec<f32> {
    session.reset();
    let mut all = Vec::new();
    for chunk in tokens.chunks(N_UBATCH) {
        all.extend_from_slice(session.eval(chunk, chunk.len()).unwrap());
    }
    all
}

#[test]
fn the_local_layers_keep_only_their_window_and_every_logit_matches_llama_cpp_and_the_full_cache() {
    let model = model();
    let hp = model.def().hparams();
    assert_eq!(hp.n_swa, 6, "the fixture's window");
    let (mut windowed, mut full) = (session(&model, false, 1), session(&model, true, 1));
    assert_eq!(windowed.n_ctx_swa(), 6 + N_UBATCH);
    assert_eq!(full.n_ctx_swa(), 0);
    // f16 K and V: 4 bytes a value per cell; the local layers hold 10 cells, the others 512.
    let n_local = (0..hp.n_layer).filter(|&il| hp.is_swa(il)).count();
    assert!(n_local > 0 && n_local < hp.n_layer);
    let per_cell = 4 * hp.n_kv_embd();
    assert_eq!(
        windowed.kv_bytes(),
        per_cell * (n_local * 10 + (hp.n_layer - n_local) * 512)
    );
    assert_eq!(full.kv_bytes(), per_cell * hp.n_layer * 512);
    let n_vocab = hp.n_vocab;
    let mut checked = 0;
    for (tokens, reference) in cases() {
        let ours = eval_in_passes(&mut windowed, &tokens);
        let local = (0..hp.n_layer).find(|&il| hp.is_swa(il)).unwrap();
        assert_eq!(windowed.kv_rows(local, false).unwrap().len(), 10 * hp.n_kv_embd());
        let window = windowed.kv_window().expect("a window cache");
        assert!(window.cells().n_used() <= 6 + N_UBATCH);
        if tokens.len() > 10 {
            assert_eq!(window.cells().seq_cells(0).len(), 6 + (tokens.len() - 1) % N_UBATCH);
        }
        full.reset();
        let expected = full.eval(&tokens, tokens.len()).unwrap();
        assert!(
            ours.iter().zip(expected).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{} tokens: the window cache's logits differ from the full cache's",
            tokens.len()
        );
        if let Some(reference) = reference {
            for (pos, (o, r)) in ours.chunks(n_vocab).zip(reference.chunks(n_vocab)).enumerate() {
                let max_abs = o.iter().zip(r).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                let cos = common::cosine(o, r);
                assert!(max_abs <= 3.0 && cos >= 0.995, "position {pos}: {max_abs}, {cos}");
                checked += 1;
            }
        }
    }
    assert!(checked > 50, "{checked} positions against llama.cpp");
}

#[test]
fn decoding_past_the_window_and_a_context_shift_give_the_full_caches_tokens() {
    let model = model();
    let prompt = &cases()[5].0;
    let options = GenerateOptions {
        max_tokens: 40,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    let mut runs = Vec::new();
    for swa_full in [false, true] {
        let mut s = session(&model, swa_full, 1);
        let first = generate(&mut s, model.tokenizer(), &prompt[..30], &options, |_| Ok(())).unwrap();
        // Keep 4 tokens, drop 20 after them, and go on from the shifted cache.
        s.shift_context(4, 20).unwrap();
        let n_past = s.n_past();
        let mut next = *first.tokens.last().unwrap();
        let mut after = Vec::new();
        for _ in 0..30 {
            let logits = s.eval(&[next], 1).unwrap();
            next = argmax(logits);
            after.push(logits.to_vec());
        }
        assert_eq!(s.n_past(), n_past + 30);
        runs.push((first.tokens, after));
    }
    assert_eq!(runs[0].0, runs[1].0, "greedy tokens before the shift");
    // The K-shift turns each cache's rows alike (the window's are the full cache's last ones),
    // so the logits after it are the same bits.
    for (step, (w, f)) in runs[0].1.iter().zip(&runs[1].1).enumerate() {
        assert_eq!(w, f, "step {step} after the shift");
    }
}

fn argmax(v: &[f32]) -> u32 {
    (0..v.len()).fold(0, |best, i| if v[i] > v[best] { i } else { best }) as u32
}

#[test]
fn sequences_batched_through_the_window_cache_get_the_logits_they_get_alone() {
    let model = model();
    let cases = cases();
    let (a, b) = (&cases[5].0[..37], &cases[4].0);
    let mut alone = session(&model, true, 1);
    let expected_a = alone.eval(a, 1).unwrap().to_vec();
    alone.reset();
    let expected_b = alone.eval(b, 1).unwrap().to_vec();
    let mut s = session(&model, false, 2);
    assert_eq!(s.n_ctx_swa(), 2 * 6 + N_UBATCH);
    // Both prompts in passes of at most N_UBATCH tokens in all, interleaved.
    let (mut ia, mut ib) = (0, 0);
    let (mut last_a, mut last_b) = (None, None);
    while ia < a.len() || ib < b.len() {
        let mut batch = Batch::new();
        let na = (a.len() - ia).min(N_UBATCH / 2);
        let nb = (b.len() - ib).min(N_UBATCH - na);
        if na > 0 {
            batch.push_sequence(&a[ia..ia + na], ia, 0, usize::from(ia + na == a.len()));
        }
        if nb > 0 {
            batch.push_sequence(&b[ib..ib + nb], ib, 1, usize::from(ib + nb == b.len()));
        }
        s.decode(&batch).unwrap();
        if ia + na == a.len() && na > 0 {
            last_a = Some(s.logits_ith(na - 1).unwrap().to_vec());
        }
        if ib + nb == b.len() && nb > 0 {
            last_b = Some(s.logits_ith(na + nb - 1).unwrap().to_vec());
        }
        (ia, ib) = (ia + na, ib + nb);
    }
    assert_eq!(last_a.unwrap(), expected_a);
    assert_eq!(last_b.unwrap(), expected_b);
}

#[test]
fn a_prefix_whose_window_is_gone_is_read_again_and_a_recent_one_is_reused() {
    let model = model();
    let prompt = &cases()[5].0;
    let mut s = session(&model, false, 1);
    eval_in_passes(&mut s, &prompt[..60]);
    // The same conversation going on: everything but the last token is kept.
    let mut longer = prompt[..60].to_vec();
    longer.extend_from_slice(&prompt[60..64]);
    assert_eq!(s.reuse_prefix(0, &longer).unwrap(), 60);
    // A prompt that leaves it at token 30: the window before 30 is long gone.
    let mut edited = prompt[..30].to_vec();
    edited.push(7);
    assert_eq!(s.reuse_prefix(0, &edited).unwrap(), 0);
    assert_eq!(s.n_past(), 0);
    // Going back below the window by hand is refused by name, not computed over less.
    eval_in_passes(&mut s, &prompt[..60]);
    s.truncate(40);
    let err = s.eval(&[7], 1).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::WindowLost {
                seq: 0,
                pos: 40,
                n_swa: 6
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--swa-full"), "{err}");
}

#[test]
fn a_saved_session_needs_the_full_cache_and_loads_into_a_window_cache() {
    let model = model();
    let prompt = &cases()[5].0[..50];
    let mut windowed = session(&model, false, 1);
    eval_in_passes(&mut windowed, prompt);
    let err = windowed.export_state().unwrap_err();
    assert!(
        matches!(err, EngineError::WindowNotSaved { n_past: 50, n_swa: 6 }),
        "{err}"
    );
    let mut full = session(&model, true, 1);
    full.eval(prompt, 1).unwrap();
    let (tokens, layers) = full.export_state().unwrap();
    let expected = full.eval(&[7], 1).unwrap().to_vec();
    let layers: Vec<(&[u8], &[u8])> = layers.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
    windowed.import_state(&tokens, &layers).unwrap();
    assert_eq!(windowed.kv_window().unwrap().cells().seq_cells(0).len(), 6);
    assert_eq!(windowed.eval(&[7], 1).unwrap(), expected);
}

struct Quiet;

impl minfer::engine::GenerationObserver for Quiet {
    fn on_text(&mut self, _: &[u8]) -> Result<(), String> {
        Ok(())
    }
}

#[test]
fn speculative_decoding_over_a_window_cache_changes_no_token() {
    use minfer::engine::{generate_speculative, DraftOptions, ModelDrafter, NgramDrafter};
    let model = model();
    let options = GenerateOptions {
        max_tokens: 64,
        ignore_eos: true,
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    let mut accepted = 0;
    for (tokens, _) in cases() {
        let mut full = session(&model, true, 1);
        let plain = generate(&mut full, model.tokenizer(), &tokens, &options, |_| Ok(())).unwrap();
        // Passes of 16 tokens hold a check of the last token and 8 proposals.
        let mut windowed = Session::with_options(
            &model,
            &SessionOptions {
                n_ctx: 512,
                n_ubatch: Some(16),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(windowed.n_ctx_swa(), 6 + 16);
        let draft = DraftOptions { max: 8, min: 0 };
        // Prompt lookup, and the model drafting for itself over a window cache of its own.
        let mut lookup = NgramDrafter { size_n: 2, size_m: 8 };
        let mut itself = ModelDrafter::new(&model, model.tokenizer(), 2048, 0.0).unwrap();
        for drafter in [&mut lookup as &mut dyn minfer::engine::Drafter, &mut itself] {
            windowed.reset();
            let fast = generate_speculative(
                &mut windowed,
                drafter,
                draft,
                model.tokenizer(),
                &tokens,
                &options,
                &mut Quiet,
            )
            .unwrap();
            assert_eq!(fast.tokens, plain.tokens, "{} prompt tokens", tokens.len());
            accepted += fast.stats.n_accepted;
        }
    }
    assert!(
        accepted > 0,
        "no proposal was ever accepted: nothing was rolled back either"
    );
}

#[test]
fn a_conversation_edited_back_past_the_window_is_read_again_from_the_start() {
    use minfer::engine::TokenStream;
    let model = model();
    let tokens = &cases()[5].0;
    let mut s = session(&model, false, 1);
    let mut stream = TokenStream::new();
    let p = stream.prepare(&mut s, &tokens[..60], 0, false).unwrap();
    for chunk in p.prompt[p.n_cached..].chunks(N_UBATCH) {
        s.eval(chunk, 1).unwrap();
    }
    // The next turn extends the conversation: all but its last token are cached.
    let p = stream.prepare(&mut s, &tokens[..64], 0, false).unwrap();
    assert_eq!(p.n_cached, 60);
    // An edit at token 30 (a regenerated turn) leaves the window behind: start over.
    let mut edited = tokens[..30].to_vec();
    edited.extend_from_slice(&[7, 8, 9]);
    let p = stream.prepare(&mut s, &edited, 0, false).unwrap();
    assert_eq!((p.n_cached, s.n_past()), (0, 0));
    let mut last = Vec::new();
    for chunk in p.prompt.chunks(N_UBATCH) {
        last = s.eval(chunk, 1).unwrap().to_vec();
    }
    let mut full = session(&model, true, 1);
    assert_eq!(last, full.eval(&edited, 1).unwrap());
}
