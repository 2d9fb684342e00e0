//! Structured output: grammars and JSON schemas constrain what is sampled.
//!
//! On the tiny model (every commit): llama.cpp's own GBNF grammars compile, constrained
//! generations follow their grammar whatever the (random) model prefers, and bad grammars are
//! clear errors. On the default model (CI): JSON schemas, the openai client's parse helper,
//! forced tool calls and GBNF grammars through the server, each output judged by an independent
//! validator (`tests/server/structured_outputs.py`: the jsonschema package, parsers written
//! there).

mod common;

use common::server::Server;
use minfer::engine::{generate, GenerateOptions, Model, ModelOptions, Session};
use minfer::grammar::{gbnf, GrammarSpec};
use minfer::sampling::SamplingParams;
use std::process::{Command, Output};

fn tiny() -> Model {
    Model::load(common::tiny_model("qwen2", "Q8_0"), &ModelOptions::default()).unwrap()
}

/// `n` generations of the tiny model under `spec` at temperature 1, with different seeds.
fn constrained_outputs(model: &Model, spec: &GrammarSpec, n: u64) -> Vec<(String, bool)> {
    let grammar = model.compile_grammar(spec).unwrap();
    let prompt = model.encode("Once upon a time");
    (0..n)
        .map(|seed| {
            let mut session = Session::new(model, 512);
            let options = GenerateOptions {
                max_tokens: 200,
                sampling: SamplingParams {
                    temperature: 1.0,
                    top_k: 0,
                    top_p: 1.0,
                    min_p: 0.0,
                    seed,
                    ..SamplingParams::default()
                },
                grammar: Some(grammar.clone()),
                ..GenerateOptions::default()
            };
            let result = generate(&mut session, model.tokenizer(), &prompt, &options, |_| Ok(())).unwrap();
            let finished = result.stop_reason == minfer::engine::StopReason::EndOfGeneration;
            (String::from_utf8(result.text).unwrap(), finished)
        })
        .collect()
}

#[test]
fn every_llama_cpp_example_grammar_compiles_against_the_vocabulary() {
    let model = tiny();
    let dir = common::fixtures().join("grammars");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "gbnf") {
            let text = std::fs::read_to_string(&path).unwrap();
            model
                .compile_grammar(&GrammarSpec::Gbnf(text))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
    }
    assert_eq!(n, 8, "llama.cpp ships eight example grammars");
}

#[test]
fn a_random_model_under_a_grammar_writes_only_what_the_grammar_allows() {
    let model = tiny();
    // Choices: the whole output is one of them.
    let spec = GrammarSpec::Gbnf("root ::= (\"yes\" | \"no\" | \"maybe so\") \".\"\n".into());
    for (text, finished) in constrained_outputs(&model, &spec, 8) {
        assert!(finished, "{text:?}");
        assert!(["yes.", "no.", "maybe so."].contains(&text.as_str()), "{text:?}");
    }
    // A small CSV, checked line by line without the grammar.
    let csv = "root ::= \"a,b\\n\" row{1,3}\nrow ::= [0-9]{1,3} \",\" [a-z]{1,5} \"\\n\"\n";
    let mut finished_runs = 0;
    for (text, finished) in constrained_outputs(&model, &GrammarSpec::Gbnf(csv.into()), 8) {
        let mut lines = text.split('\n');
        assert_eq!(lines.next(), Some("a,b"), "{text:?}");
        let rows: Vec<&str> = lines.collect();
        for row in &rows[..rows.len() - 1] {
            let (number, word) = row.split_once(',').unwrap_or_else(|| panic!("{text:?}"));
            assert!(
                (1..=3).contains(&number.len()) && number.bytes().all(|b| b.is_ascii_digit()),
                "{text:?}"
            );
            assert!(
                (1..=5).contains(&word.len()) && word.bytes().all(|b| b.is_ascii_lowercase()),
                "{text:?}"
            );
        }
        if finished {
            finished_runs += 1;
            assert!((2..=4).contains(&rows.len()) && rows.last() == Some(&""), "{text:?}");
        }
    }
    assert!(finished_runs > 0);
}

#[test]
fn a_random_model_under_a_json_schema_writes_valid_json() {
    let model = tiny();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "color": {"enum": ["red", "green"]},
            "n": {"type": "integer", "minimum": 3, "maximum": 7}
        },
        "required": ["ok", "color", "n"],
        "additionalProperties": false
    });
    for (text, finished) in constrained_outputs(&model, &GrammarSpec::JsonSchema(schema), 6) {
        assert!(finished, "{text:?}");
        let value: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value["ok"].is_boolean(), "{text}");
        assert!(["red", "green"].contains(&value["color"].as_str().unwrap()), "{text}");
        assert!((3..=7).contains(&value["n"].as_i64().unwrap()), "{text}");
        assert_eq!(value.as_object().unwrap().len(), 3, "{text}");
    }
}

#[test]
fn bad_grammars_and_schemas_are_errors_that_say_where() {
    let model = tiny();
    let error = |spec: GrammarSpec| model.compile_grammar(&spec).unwrap_err().to_string();
    let e = error(GrammarSpec::Gbnf(
        "root ::= item+\nitem ::= \"a\" | undefined-rule\n".into(),
    ));
    assert!(e.contains("line 2, column 16: undefined rule `undefined-rule`"), "{e}");
    let e = error(GrammarSpec::Gbnf("root ::= \"(\" root \")\"\n".into()));
    assert!(e.contains("can never finish"), "{e}");
    let e = error(GrammarSpec::JsonSchema(
        serde_json::json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
    ));
    assert!(e.starts_with("invalid JSON schema") && e.contains("strin"), "{e}");
    let e = error(GrammarSpec::JsonSchema(
        serde_json::json!({"type": "string", "pattern": "(["}),
    ));
    assert!(e.contains("unclosed character class"), "{e}");
    let e = error(GrammarSpec::Lark("start: foo\n".into()));
    assert!(e.starts_with("invalid Lark grammar") && e.contains("foo"), "{e}");
    // A grammar past the size that compiles promptly is refused before compiling.
    let huge = format!(
        "root ::= {}\n",
        (0..=gbnf::MAX_TERMINALS)
            .map(|i| format!("\"w{i}\""))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let e = error(GrammarSpec::Gbnf(huge));
    assert!(e.contains("more than 10000 terminals"), "{e}");
    assert!(gbnf::to_lark("root ::= [").is_err());
}

fn minfer(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer")).args(args).output().unwrap()
}

#[test]
fn the_grammar_flags_constrain_a_run_and_refuse_bad_input_before_loading() {
    let model = common::tiny_model("qwen2", "Q8_0");
    let m = model.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["-m", m, "-p", "Hello", "-n", "60", "--temp", "1", "-s", "3"];
        args.extend_from_slice(extra);
        minfer(&args)
    };
    let out = run(&["--grammar", "root ::= \"A\" [0-9] \"!\""]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.len() == 3 && text.starts_with('A') && text.ends_with('!'),
        "{text:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("g.gbnf");
    std::fs::write(&file, "root ::= (\"x\" | \"y\"){4}\n").unwrap();
    let out = run(&["--grammar-file", file.to_str().unwrap()]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.len() == 4 && text.bytes().all(|b| b == b'x' || b == b'y'),
        "{text:?}"
    );
    let out = run(&[
        "-j",
        r#"{"type": "object", "properties": {"b": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false}"#,
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text == r#"{"b": true}"# || text == r#"{"b": false}"#, "{text:?}");
    let out = run(&["--json"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with('{'), "{text:?}");
    let refused = |extra: &[&str], says: &str| {
        let out = run(extra);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{extra:?}: {err}");
    };
    refused(&["--grammar", "root ::= a\n"], "--grammar does not parse");
    refused(
        &["--grammar", "root ::= \"a\" b\n"],
        "line 1, column 14: undefined rule `b`",
    );
    refused(&["-j", "{\"type\": "], "--json-schema is not JSON");
    refused(&["-j", "[1]"], "must be a JSON Schema");
    refused(&["-j", r#"{"type": "strin"}"#], "--json-schema cannot be used");
    refused(&["--json", "--grammar", "root ::= \"a\""], "both constrain the output");
    refused(
        &["--grammar-file", "/nonexistent.gbnf"],
        "cannot read /nonexistent.gbnf",
    );
}

fn structured(server: &Server, group: &str, extra: &[&str]) {
    let url = server.url("");
    let args: Vec<&str> = [url.as_str(), group].into_iter().chain(extra.iter().copied()).collect();
    server.run_python("tests/server/structured_outputs.py", &args);
}

#[test]
fn the_default_model_writes_valid_json_tool_calls_and_grammar_text_through_the_server() {
    let server = Server::start(&common::default_model(), &["--threads", "2"], &[]);
    // A share of the sweep: the first six schemas (up to string patterns and formats), one seed.
    structured(&server, "schemas", &["--schemas", "6", "--seeds", "1"]);
    structured(&server, "helper", &[]);
    structured(&server, "tools", &["--requests", "50"]);
    structured(&server, "gbnf", &["--seeds", "2"]);
}
