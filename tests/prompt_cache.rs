//! The server's shared prompt cache, end to end: one KV cache for every slot (`-c` is the whole
//! budget), requests admitted by the cells they need rather than by a slot count, prompts that
//! share a start reading it once, generations preempted when the cache fills and resumed bit
//! for bit, and the host-memory tier (`--cache-ram`) giving an evicted prompt back. Every answer
//! is checked against the same request read from scratch (`cache_prompt: false`).

mod common;

use common::server::Server;

fn tiny() -> std::path::PathBuf {
    common::tiny_model("qwen2", "Q8_0")
}

fn n_tokens(server: &Server, text: &str) -> usize {
    let (_, tokens) = server.json("/tokenize", serde_json::json!({ "content": text }));
    tokens["tokens"].as_array().unwrap().len()
}

/// Greedy `/completion` of `prompt`, `n_predict` tokens whatever the end of text says.
fn complete(server: &Server, prompt: &str, n_predict: usize, cache_prompt: bool) -> serde_json::Value {
    let (status, body) = server.json(
        "/completion",
        serde_json::json!({"prompt": prompt, "n_predict": n_predict, "temperature": 0,
               "ignore_eos": true, "cache_prompt": cache_prompt}),
    );
    assert_eq!(status, 200, "{body}\n{}", server.log());
    body
}

/// Sends every prompt at once, each on its own connection; the answers in the prompts' order.
fn all_at_once(server: &Server, prompts: &[String], n_predict: usize) -> Vec<serde_json::Value> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(move || complete(server, p, n_predict, true)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn sixteen_requests_sharing_a_system_prompt_run_at_once_in_a_cache_that_holds_four_copies() {
    // Sized on a first server: the system prompt's tokens and one request's.
    let system = "You are a coding agent. Tools: read_file, write_file, run_tests, search. ".repeat(24);
    let questions: Vec<String> = (0..16).map(|i| format!("Task {i}: fix bug number {i}.")).collect();
    let prompts: Vec<String> = questions.iter().map(|q| format!("{system}{q}")).collect();
    let n_predict = 24;
    let (n_system, n_prompt) = {
        let probe = Server::start(&tiny(), &["-c", "4096"], &[]);
        (n_tokens(&probe, &system), n_tokens(&probe, &prompts[15]))
    };
    let n_ctx = 4 * (n_prompt + n_predict);
    assert!(n_system > 300, "a long shared start: {n_system} tokens");
    let server = Server::start(&tiny(), &["-c", &n_ctx.to_string()], &[]);
    let answers = all_at_once(&server, &prompts, n_predict);
    let busy_max = server.metric("minfer_slots_busy_max");
    let prefilled = server.metric("minfer_prompt_tokens_total") as usize;
    assert!(
        busy_max >= 8.0,
        "{busy_max} generations at once in {n_ctx} cells (four copies of one)\n{}",
        server.log()
    );
    // Read from scratch, the 16 prompts are 16 system prompts; shared, about one.
    assert!(
        prefilled < 2 * n_system + 16 * (n_prompt - n_system),
        "{prefilled} prompt tokens prefilled for 16 prompts sharing {n_system}\n{}",
        server.log()
    );
    for i in [0, 7, 15] {
        let fresh = complete(&server, &prompts[i], n_predict, false);
        assert_eq!(answers[i]["content"], fresh["content"], "request {i}");
        assert_eq!(answers[i]["tokens_predicted"], n_predict);
    }
    // A cap on concurrent generations still holds where one is asked for.
    let capped = Server::start(&tiny(), &["-c", &n_ctx.to_string(), "-np", "4"], &[]);
    all_at_once(&capped, &prompts[..8], n_predict);
    assert!(capped.metric("minfer_slots_busy_max") <= 4.0);
}

#[test]
fn generations_that_outgrow_the_cache_are_preempted_and_resume_to_the_answers_they_give_alone() {
    // Two replies of 400 tokens are admitted together (each expects 256 at first) but do not
    // both fit in 600 cells: the later one gives way and comes back.
    let server = Server::start(&tiny(), &["-c", "600"], &[]);
    let prompts = ["Once upon a time".to_string(), "In a galaxy far away".to_string()];
    let answers = all_at_once(&server, &prompts, 400);
    let preemptions = server.metric("minfer_preemptions_total");
    assert!(preemptions >= 1.0, "no preemption\n{}", server.log());
    for (prompt, answer) in prompts.iter().zip(&answers) {
        assert_eq!(answer["tokens_predicted"], 400);
        let alone = complete(&server, prompt, 400, false);
        assert_eq!(answer["content"], alone["content"], "{prompt}");
    }
}

#[test]
fn a_prompt_evicted_to_host_memory_comes_back_without_being_read_again() {
    let server = Server::start(&tiny(), &["-c", "320", "--cache-ram", "16"], &[]);
    let long =
        |topic: &str| format!("Notes on {topic}: ") + &format!("the {topic} is described here at length. ").repeat(24);
    let first = long("river");
    let n_first = n_tokens(&server, &first);
    assert!((150..300).contains(&n_first), "{n_first} tokens");
    let before = complete(&server, &first, 8, true);
    // Two other long prompts take the cells; the first's are evicted, copied to host memory.
    complete(&server, &long("mountain"), 8, true);
    complete(&server, &long("forest"), 8, true);
    assert!(server.metric("minfer_kv_evicted_cells_total") > 0.0);
    assert!(server.metric("minfer_host_cache_bytes") > 0.0);
    let again = complete(&server, &first, 8, true);
    let cached = again["timings"]["cache_n"].as_u64().unwrap() as usize;
    assert_eq!(cached, n_first - 1, "all but the last token restored\n{}", server.log());
    assert!(server.metric("minfer_host_cache_hits_total") >= 1.0);
    assert_eq!(again["content"], before["content"]);
    let fresh = complete(&server, &first, 8, false);
    assert_eq!(again["content"], fresh["content"]);
}
