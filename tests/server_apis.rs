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
