//! `minfer serve` speaking the other APIs people point their tools at: Anthropic's Messages,
//! OpenAI's Responses and Ollama's, each driven by its official Python client (the scripts in
//! tests/server/) against the real binary on the tiny model, whose greedy answers are compared
//! with each other and never judged.

mod common;

use common::server::Server;

fn tiny() -> std::path::PathBuf {
    common::tiny_model("qwen2", "Q8_0")
}

fn run(server: &Server, script: &str, group: &str, extra: &[&str]) {
    let url = server.url("");
    let args: Vec<&str> = [url.as_str(), group].into_iter().chain(extra.iter().copied()).collect();
    server.run_python(script, &args);
}

#[test]
fn the_anthropic_client_gets_messages_streams_token_counts_tool_calls_and_its_errors() {
    let server = Server::start(&tiny(), &["--n-slots", "1"], &[]);
    run(&server, "tests/server/anthropic_client.py", "protocol", &[]);
}

#[test]
fn the_anthropic_client_authenticates_with_its_own_header() {
    let server = Server::start(&tiny(), &["--n-slots", "1", "--api-key", "sekrit"], &[]);
    run(&server, "tests/server/anthropic_client.py", "auth", &["sekrit"]);
}

#[test]
fn the_openai_client_gets_responses_plain_streamed_with_function_calls_and_schemas() {
    let server = Server::start(&tiny(), &["--n-slots", "1"], &[]);
    run(&server, "tests/server/responses_client.py", "protocol", &[]);
}

#[test]
fn the_ollama_client_chats_generates_lists_and_shows_through_its_own_api() {
    let server = Server::start(&tiny(), &["--n-slots", "1"], &[]);
    run(&server, "tests/server/ollama_client.py", "protocol", &[]);
}

/// A tiny Qwen3 whose template opens the reasoning (DeepSeek-R1's Qwen distill's), with a budget
/// of five tokens: the tiny model never closes it itself, so the forced closing tag is what
/// splits its reply.
fn thinking_server() -> Server {
    let template = common::fixtures().join("chat/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    Server::start(
        &common::tiny_model("qwen3", "Q8_0"),
        &[
            "--n-slots",
            "1",
            "--chat-template-file",
            template.to_str().unwrap(),
            "--reasoning-budget",
            "5",
        ],
        &[],
    )
}

#[test]
fn a_reasoning_budget_forces_the_closing_tag_after_exactly_its_tokens() {
    use serde_json::{json, Value};
    let server = thinking_server();
    let (_, end) = server.json("/tokenize", json!({"content": "</think>", "parse_special": true}));
    let end: Vec<u64> = end["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let ask = |extra: Value| {
        let mut body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": 16,
                              "temperature": 0, "logprobs": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, answer) = server.json("/v1/chat/completions", body);
        assert_eq!(status, 200, "{answer}");
        answer["choices"][0].clone()
    };
    let tokens = |choice: &Value| -> Vec<(u64, String)> {
        choice["logprobs"]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| (t["id"].as_u64().unwrap(), t["token"].as_str().unwrap().to_string()))
            .collect()
    };
    for budget in [5usize, 2, 0] {
        let choice = ask(json!({"reasoning_budget_tokens": if budget == 5 { -1 } else { budget as i64 }}));
        let tokens = tokens(&choice);
        let ids: Vec<u64> = tokens.iter().map(|t| t.0).collect();
        assert_eq!(ids[budget..budget + end.len()], end[..], "budget {budget}: {choice}");
        let reasoning: String = tokens[..budget].iter().map(|t| t.1.as_str()).collect();
        assert_eq!(
            choice["message"]["reasoning_content"].as_str().unwrap_or(""),
            reasoning.trim(),
            "{choice}"
        );
        let content: String = tokens[budget + end.len()..].iter().map(|t| t.1.as_str()).collect();
        assert_eq!(choice["message"]["content"], content.trim_start(), "{choice}");
    }
    // A grammar constrains what the model chooses; the forced tag is not its choice, so a
    // budget and a JSON answer go together.
    let choice = ask(json!({"reasoning_budget_tokens": 2, "response_format": {"type": "json_object"}}));
    let ids: Vec<u64> = tokens(&choice).iter().map(|t| t.0).collect();
    assert_eq!(ids[2..2 + end.len()], end[..], "{choice}");
}

#[test]
fn a_thinking_models_reasoning_is_apart_from_its_answer_on_every_api() {
    let server = thinking_server();
    for script in ["anthropic_client.py", "responses_client.py", "ollama_client.py"] {
        run(&server, &format!("tests/server/{script}"), "thinking", &[]);
    }
}

#[test]
fn a_router_gives_each_model_its_own_answers_and_serves_them_in_turn_under_models_max() {
    use serde_json::{json, Value};
    let models = [
        ("tiny-qwen2", tiny()),
        ("tiny-llama", common::tiny_model("llama", "Q8_0")),
        ("qwen2.5-coder", common::default_model()),
    ];
    let ask = |server: &Server, model: &str| -> String {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "Name a colour."}],
                          "max_tokens": 8, "temperature": 0});
        let (status, answer) = server.json("/v1/chat/completions", body);
        assert_eq!(status, 200, "{model}: {answer}");
        answer["choices"][0]["message"]["content"].as_str().unwrap().to_string()
    };
    let args = ["--n-slots", "1", "-c", "512"];
    let alone: Vec<String> = models
        .iter()
        .map(|(_, path)| ask(&Server::start(path, &args, &[]), "any"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    for (name, path) in &models {
        std::os::unix::fs::symlink(path, dir.path().join(format!("{name}.gguf"))).unwrap();
    }
    let mut all = args.to_vec();
    all.extend(["--models-max", "1"]);
    let server = Server::start_models(dir.path(), &all);
    let (status, _) = server.request("GET", "/ready", "", b"");
    assert_eq!(status, 200, "ready once it listens, before any model is loaded");
    let idle_kb = server.memory_kb("VmRSS");
    let (_, list) = server.request("GET", "/v1/models", "", b"");
    let list: Value = serde_json::from_str(&list).unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["qwen2.5-coder", "tiny-llama", "tiny-qwen2"]);
    // Interleaved, one at a time: each model's own answer, loaded and unloaded in turn.
    for _ in 0..2 {
        for ((name, _), expected) in models.iter().zip(&alone) {
            assert_eq!(&ask(&server, name), expected, "{name}");
        }
    }
    // At once: each waits for the one before it to finish, and none is lost.
    std::thread::scope(|s| {
        let handles: Vec<_> = models.iter().map(|(name, _)| s.spawn(|| ask(&server, name))).collect();
        for (handle, expected) in handles.into_iter().zip(&alone) {
            assert_eq!(&handle.join().unwrap(), expected);
        }
    });
    let log = server.log();
    assert!(log.matches("unloaded model").count() >= 6, "{log}");
    assert!(server.metric("minfer_model_unloads_total") >= 6.0);
    // The last model asked is a tiny one (the real one was unloaded before it): its memory is
    // back near the idle level (weights mapped and cache freed).
    ask(&server, "tiny-qwen2");
    let after_kb = server.memory_kb("VmRSS");
    assert!(
        after_kb < idle_kb + 150 * 1024,
        "RSS {after_kb} kB after unloading, {idle_kb} kB idle"
    );
    // Names are looked up in the listing, never joined into a path.
    for (name, status) in [("../tiny-qwen2", 404), ("/etc/passwd", 404), ("nope", 404)] {
        let (got, body) = server.json(
            "/v1/chat/completions",
            json!({"model": name, "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(got, status, "{name}: {body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(name), "{body}");
    }
    let (status, body) = server.json(
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(status, 400, "{body}");
    let (_, ps) = server.request("GET", "/api/ps", "", b"");
    assert!(ps.contains("\"tiny-qwen2\""), "{ps}");
    // Without a key on loopback, a foreign Host (DNS rebinding) loads nothing.
    let body = json!({"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}]}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: attacker.example\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let (status, text) = server.raw(request.as_bytes());
    assert_eq!(status, 403, "{text}");
    let (_, ps) = server.request("GET", "/api/ps", "", b"");
    assert!(!ps.contains("\"tiny-llama\""), "{ps}");
}

#[test]
fn a_model_loading_holds_up_only_the_requests_for_it() {
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    for (name, path) in [("a", tiny()), ("b", common::tiny_model("llama", "Q8_0"))] {
        std::os::unix::fs::symlink(path, dir.path().join(format!("{name}.gguf"))).unwrap();
    }
    let flag = format!("--models-dir={}", dir.path().display());
    // Every load takes three seconds more than it would.
    let server = Server::start_until(
        std::path::Path::new(&flag),
        &["--n-slots", "1", "-c", "256"],
        &[("MINFER_SERVE_LOAD_DELAY", "3")],
        "listening on http://",
    );
    let ask = |model: &str| {
        let body = json!({"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2});
        server.json("/v1/chat/completions", body).0
    };
    assert_eq!(ask("b"), 200);
    let a_done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            assert_eq!(ask("a"), 200);
            a_done.store(true, Ordering::SeqCst);
        });
        // `a` is loading (its log line is out); `b` answers meanwhile.
        while !server.log().contains("loading model a ") {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(ask("b"), 200);
        assert!(
            !a_done.load(Ordering::SeqCst),
            "b waited for a's load:\n{}",
            server.log()
        );
    });
    assert!(a_done.load(Ordering::SeqCst));
}

#[test]
fn bad_input_on_every_new_endpoint_gets_that_apis_error_shape_and_the_server_serves_on() {
    use serde_json::Value;
    let server = Server::start(&tiny(), &["--n-slots", "1"], &[]);
    let nested = "[".repeat(100_000);
    let cases: &[(&str, &str, &str)] = &[
        ("/v1/messages", "[]", "anthropic"),
        ("/v1/messages", "not json", "anthropic"),
        ("/v1/messages", &nested, "anthropic"),
        ("/v1/messages", r#"{"max_tokens": 4, "messages": "hi"}"#, "anthropic"),
        (
            "/v1/messages",
            r#"{"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "audio"}]}]}"#,
            "anthropic",
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 1000000000000000, "messages": [{"role": "user", "content": "x"}]}"#,
            "anthropic",
        ),
        (
            "/v1/messages",
            r#"{"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": 5}]}"#,
            "anthropic",
        ),
        ("/v1/messages/count_tokens", "{}", "anthropic"),
        (
            "/v1/messages",
            r#"{"max_tokens": 4, "messages": [{"role": "user", "content": "x"}], "n": 2}"#,
            "anthropic",
        ),
        ("/v1/responses", r#"{"input": {"x": 1}}"#, "openai"),
        ("/v1/responses", r#"{"input": [{"type": "function_call"}]}"#, "openai"),
        (
            "/v1/responses",
            r#"{"input": "x", "max_output_tokens": 1000000000000000}"#,
            "openai",
        ),
        ("/v1/responses", &nested, "openai"),
        ("/api/chat", r#"{"messages": 5}"#, "ollama"),
        ("/api/chat", r#"{"messages": [], "options": [1]}"#, "ollama"),
        (
            "/api/chat",
            r#"{"messages": [{"role": "robot", "content": "x"}]}"#,
            "ollama",
        ),
        ("/api/generate", r#"{"prompt": 5}"#, "ollama"),
        ("/api/generate", &nested, "ollama"),
    ];
    for (path, body, shape) in cases {
        let (status, text) = server.post(path, body);
        let what = &body[..body.len().min(80)];
        assert!((400..500).contains(&status), "{path} {what}: {status} {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path} {what}: {text}"));
        let message = match *shape {
            "anthropic" => {
                assert_eq!(v["type"], "error", "{path}: {v}");
                v["error"]["message"].as_str()
            }
            "ollama" => v["error"].as_str(),
            _ => v["error"]["message"].as_str(),
        };
        assert!(message.is_some_and(|m| !m.is_empty()), "{path} {what}: {v}");
    }
    let (status, _) = server.post(
        "/api/chat",
        r#"{"messages": [{"role": "user", "content": "x"}], "stream": false, "options": {"num_predict": 1}}"#,
    );
    assert_eq!(status, 200);
}
