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

/// A server whose template opens the reasoning (DeepSeek-R1's), with a budget of five tokens:
/// the tiny model never closes it itself, so the forced closing tag is what splits its reply.
fn thinking_server() -> Server {
    let template = common::fixtures().join("chat/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    Server::start(
        &tiny(),
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
}

#[test]
fn a_thinking_models_reasoning_is_apart_from_its_answer_on_every_api() {
    let server = thinking_server();
    for script in ["anthropic_client.py", "responses_client.py", "ollama_client.py"] {
        run(&server, &format!("tests/server/{script}"), "thinking", &[]);
    }
}
