//! Several sequences in one session: batches that mix sequences of different lengths, and the KV
//! cache's sequence operations. The reference for every check is the same sequence run alone in
//! a session of its own (cells equal to positions, attention bounded by position), which is what
//! "masking the other sequences' cells" must reproduce bit for bit: every kernel computes a
//! token's row independently of the other rows of its batch, and attention reads a sequence's
//! cells in position order wherever they are.

mod common;

use minfer::engine::{Batch, EngineError, Model, ModelOptions, Session};
use minfer::graph::DType;
use std::path::Path;

fn load(path: &Path) -> Model {
    let options = ModelOptions {
        n_threads: Some(2),
        backend: Some("cpu".into()),
        ..Default::default()
    };
    Model::load(path, &options).unwrap()
}

/// Distinct pseudo-random prompts of the given lengths.
fn prompts(model: &Model, lengths: &[usize]) -> Vec<Vec<u32>> {
    let n_vocab = model.hparams().n_vocab as u64;
    let mut rng = common::Rng(0x5851_f42d_4c95_7f2d);
    lengths
        .iter()
        .map(|&n| (0..n).map(|_| (rng.next() % n_vocab.min(3000)) as u32).collect())
        .collect()
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .unwrap() as u32
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// One sequence alone: the logits of every prompt row, then of `steps` greedy decode steps.
fn alone(model: &Model, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut session = Session::new(model, 256);
    let n_vocab = model.hparams().n_vocab;
    let all = session.eval(prompt, prompt.len()).unwrap().to_vec();
    let mut rows: Vec<Vec<f32>> = all.chunks(n_vocab).map(<[f32]>::to_vec).collect();
    let mut picked = Vec::new();
    for _ in 0..steps {
        let next = argmax(rows.last().unwrap());
        picked.push(next);
        rows.push(session.eval(&[next], 1).unwrap().to_vec());
    }
    (rows, picked)
}

/// All `prompts` in one batch (every row wanting logits), then `steps` batches of one token
/// per sequence: each sequence's rows must be those it gets alone.
fn check_batched(model: &Model, lengths: &[usize], steps: usize) {
    let prompts = prompts(model, lengths);
    let n = prompts.len();
    let mut session = Session::with_sequences(model, 256, n).unwrap();
    let mut batch = Batch::new();
    for (seq, p) in prompts.iter().enumerate() {
        batch.push_sequence(p, 0, seq, p.len());
    }
    session.decode(&batch).unwrap();
    let references: Vec<_> = prompts.iter().map(|p| alone(model, p, steps)).collect();
    let mut row = 0;
    for (seq, p) in prompts.iter().enumerate() {
        for (i, reference) in references[seq].0[..p.len()].iter().enumerate() {
            let got = session.logits_ith(row).unwrap();
            assert!(same_bits(got, reference), "{lengths:?}: sequence {seq}, prompt row {i}");
            row += 1;
        }
    }
    for step in 0..steps {
        batch.clear();
        for (seq, p) in prompts.iter().enumerate() {
            batch.add(references[seq].1[step], (p.len() + step) as i32, seq, true);
        }
        session.decode(&batch).unwrap();
        for seq in 0..n {
            let reference = &references[seq].0[prompts[seq].len() + step];
            assert!(
                same_bits(session.logits_ith(seq).unwrap(), reference),
                "{lengths:?}: sequence {seq}, decode step {step}"
            );
        }
    }
}

#[test]
fn two_and_four_sequences_in_one_batch_get_the_logits_they_get_alone_on_the_tiny_models() {
    for (arch, ty) in [
        ("qwen2", "Q4_K"),
        ("qwen3", "Q8_0"),
        ("qwen2", "F16"),
        ("qwen3moe", "Q4_0"),
        ("mixtral", "Q4_0"),
    ] {
        let model = load(&common::tiny_model(arch, ty));
        check_batched(&model, &[7, 3], 3);
        check_batched(&model, &[2, 9, 1, 5], 2);
    }
}

#[test]
fn two_and_four_sequences_in_one_batch_get_the_logits_they_get_alone_on_the_real_model() {
    let model = load(&common::default_model());
    check_batched(&model, &[11, 4], 2);
    check_batched(&model, &[3, 8, 1, 6], 1);
}

/// The last-row logits of `tokens` run alone.
fn alone_last(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut session = Session::new(model, 256);
    session.eval(tokens, 1).unwrap().to_vec()
}

#[test]
fn a_copied_prefix_continues_in_two_sequences_as_two_separate_runs_would() {
    let model = load(&common::tiny_model("qwen2", "Q8_0"));
    let p = &prompts(&model, &[6])[0];
    let mut session = Session::with_sequences(&model, 64, 3).unwrap();
    session.decode(&Batch::for_sequence(p, 0, 0, 1)).unwrap();
    session.seq_cp(0, 1, 0, i32::MAX).unwrap();
    // The prefix's cells are shared, not copied.
    assert_eq!(session.kv().n_used(), p.len());
    let (a, b) = (41u32, 97u32);
    let mut batch = Batch::new();
    batch.add(a, p.len() as i32, 0, true);
    batch.add(b, p.len() as i32, 1, true);
    session.decode(&batch).unwrap();
    let with = |t: u32| [p.as_slice(), &[t]].concat();
    assert!(same_bits(session.logits_ith(0).unwrap(), &alone_last(&model, &with(a))));
    assert!(same_bits(session.logits_ith(1).unwrap(), &alone_last(&model, &with(b))));
}

#[test]
fn removed_cells_reach_no_token_and_a_kept_sequence_runs_on_alone() {
    let model = load(&common::tiny_model("qwen3", "Q4_K"));
    let ps = prompts(&model, &[5, 8, 4]);
    let mut session = Session::with_sequences(&model, 64, 3).unwrap();
    let mut batch = Batch::new();
    for (seq, p) in ps.iter().enumerate() {
        batch.push_sequence(p, 0, seq, 1);
    }
    session.decode(&batch).unwrap();

    // Remove the last three tokens of sequence 1 and continue it from position 5.
    session.seq_rm(Some(1), 5, i32::MAX).unwrap();
    assert_eq!(session.seq_tokens(1), ps[1][..5]);
    session.decode(&Batch::for_sequence(&[7, 8], 5, 1, 1)).unwrap();
    let expected = alone_last(&model, &[&ps[1][..5], &[7, 8]].concat());
    assert!(same_bits(session.last_logits().unwrap(), &expected));

    // Keep sequence 2 only: its cells stay, the others' are free, and it runs on as alone.
    session.seq_keep(2).unwrap();
    assert_eq!(session.kv().n_used(), ps[2].len());
    assert!(session.seq_tokens(0).is_empty());
    session.decode(&Batch::for_sequence(&[3], ps[2].len(), 2, 1)).unwrap();
    let expected = alone_last(&model, &[ps[2].as_slice(), &[3]].concat());
    assert!(same_bits(session.last_logits().unwrap(), &expected));
}

#[test]
fn a_prompt_shares_the_longest_prefix_another_sequence_holds_and_gets_the_logits_it_gets_alone() {
    check_shared_prefix(&load(&common::tiny_model("qwen3", "Q4_K")));
}

#[test]
fn a_shared_prefix_gives_the_logits_read_alone_on_the_real_model() {
    check_shared_prefix(&load(&common::default_model()));
}

/// Sequence 0 reads a system prompt and its own question; sequence 1 shares the system prompt's
/// cells and reads another question: its logits are those of its prompt read alone, also after
/// sequence 0 drops everything.
fn check_shared_prefix(model: &Model) {
    let ps = prompts(model, &[40, 5, 7]);
    let (system, a, b) = (&ps[0], &ps[1], &ps[2]);
    let (prompt_a, prompt_b) = ([system.as_slice(), a].concat(), [system.as_slice(), b].concat());
    let mut session = Session::with_sequences_of(model, 128, 2).unwrap();
    session.decode(&Batch::for_sequence(&prompt_a, 0, 0, 1)).unwrap();
    // Sequence 1 holds nothing of its own: it shares sequence 0's cells for the system prompt.
    let start = session.share_prefix(0, 1, &prompt_b).unwrap();
    assert_eq!(start, system.len());
    assert_eq!(
        session.kv().n_used(),
        prompt_a.len(),
        "the prefix's cells are shared, not copied"
    );
    session
        .decode(&Batch::for_sequence(&prompt_b[start..], start, 1, 1))
        .unwrap();
    assert!(same_bits(session.last_logits().unwrap(), &alone_last(model, &prompt_b)));
    // Sequence 0 dropping everything leaves sequence 1's shared cells in place.
    session.seq_rm(Some(0), 0, i32::MAX).unwrap();
    session
        .decode(&Batch::for_sequence(&[11], prompt_b.len(), 1, 1))
        .unwrap();
    let expected = alone_last(model, &[prompt_b.as_slice(), &[11]].concat());
    assert!(same_bits(session.last_logits().unwrap(), &expected));
    // A shorter prefix elsewhere does not replace a longer one of the sequence's own.
    assert_eq!(session.share_prefix(0, 1, &prompt_b).unwrap(), prompt_b.len() - 1);
}

#[test]
fn a_prefix_copied_to_host_memory_and_restored_elsewhere_gives_the_logits_read_alone() {
    let model = load(&common::tiny_model("qwen3", "Q4_K"));
    check_host_copy(&model, DType::F16);
    check_host_copy(&model, DType::Q8_0);
    check_host_copy(&load(&common::tiny_model("qwen2", "Q8_0")), DType::F32);
}

#[test]
fn a_prefix_restored_from_host_memory_gives_the_logits_read_alone_on_the_real_model() {
    check_host_copy(&load(&common::default_model()), DType::F16);
}

/// Sequence 0 reads a prompt across scattered cells (another sequence's tokens in between);
/// its copy is saved, its cells dropped, and sequence 1 restores part of it into other cells,
/// reads the rest and goes on: every logit is that of the prompt read alone.
fn check_host_copy(model: &Model, kv: DType) {
    let ps = prompts(model, &[30, 9, 6]);
    let (prompt, other) = ([ps[0].as_slice(), &ps[1]].concat(), &ps[2]);
    let mut session = Session::with_budget(model, 128, 3).unwrap();
    session.set_kv_types(kv, kv).unwrap();
    // Interleaved chunks: sequence 0's cells are not its positions.
    session.decode(&Batch::for_sequence(other, 0, 2, 1)).unwrap();
    session.decode(&Batch::for_sequence(&prompt[..20], 0, 0, 1)).unwrap();
    session
        .decode(&Batch::for_sequence(&[5, 6], other.len(), 2, 1))
        .unwrap();
    session.decode(&Batch::for_sequence(&prompt[20..], 20, 0, 1)).unwrap();
    let saved = session.save_prefix(0).unwrap();
    assert_eq!(saved.tokens, prompt);
    session.seq_rm(Some(0), 0, i32::MAX).unwrap();
    // Sequence 1 shares nothing: it restores the first 25 positions and reads the rest.
    assert_eq!(session.restore_prefix(1, &saved, 0, 25).unwrap(), 25);
    assert_eq!(session.seq_tokens(1), prompt[..25]);
    session.decode(&Batch::for_sequence(&prompt[25..], 25, 1, 1)).unwrap();
    let expected = {
        let mut alone = Session::new(model, 256);
        alone.set_kv_types(kv, kv).unwrap();
        alone.eval(&prompt, 1).unwrap().to_vec()
    };
    assert!(same_bits(session.last_logits().unwrap(), &expected), "KV {kv:?}");
    // A sequence that does not hold exactly the copy's first positions takes nothing.
    assert_eq!(session.restore_prefix(2, &saved, 0, 10).unwrap(), 0);
}

#[test]
fn a_prompt_reuses_the_longest_prefix_its_sequence_holds() {
    let model = load(&common::tiny_model("qwen2", "Q4_0"));
    let mut session = Session::new(&model, 64);
    session.eval(&[1, 2, 3, 4, 5], 1).unwrap();
    assert_eq!(session.reuse_prefix(0, &[1, 2, 3, 9, 9]).unwrap(), 3);
    assert_eq!(session.seq_tokens(0), [1, 2, 3]);
    assert_eq!(session.n_past(), 3);
    // A prompt the sequence holds whole keeps all but its last token, whose logits are needed.
    assert_eq!(session.reuse_prefix(0, &[1, 2, 3]).unwrap(), 2);
    session.eval(&[3], 1).unwrap();
    let expected = alone_last(&model, &[1, 2, 3]);
    assert!(same_bits(session.last_logits().unwrap(), &expected));
}

#[test]
fn a_batch_is_refused_whole_for_a_bad_sequence_position_or_size_and_the_cache_is_unchanged() {
    let model = load(&common::tiny_model("qwen2", "Q8_0"));
    let mut session = Session::with_sequences(&model, 16, 2).unwrap();
    session.decode(&Batch::for_sequence(&[1, 2, 3], 0, 0, 1)).unwrap();
    let mut batch = Batch::for_sequence(&[4], 3, 0, 1);
    batch.add(5, 0, 2, true);
    assert!(matches!(
        session.decode(&batch),
        Err(EngineError::SeqOutOfRange { seq: 2, n_seq_max: 2 })
    ));
    assert!(matches!(
        session.decode(&Batch::for_sequence(&[4], 1, 0, 1)),
        Err(EngineError::PositionOrder {
            seq: 0,
            pos: 1,
            after: 2
        })
    ));
    assert!(matches!(
        session.decode(&Batch::for_sequence(&[0; 14], 0, 1, 1)),
        Err(EngineError::ContextFull { .. })
    ));
    assert_eq!(session.kv().n_used(), 3);
    assert!(matches!(
        session.logits_ith(0),
        Err(EngineError::NoLogits { row: 0, .. })
    ));
    assert!(session.logits_ith(2).is_ok());
}
