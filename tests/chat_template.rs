//! Chat templates against transformers: every conversation in `fixtures/chat/` must render byte
//! for byte as transformers 5.24.0 rendered it (provenance in `fixtures/chat/README.md`), and the
//! load-time and input checks must refuse what cannot be rendered.

mod common;

use minfer::gguf::{GgufFile, Metadata};
use minfer::template::{ChatTemplate, TemplateError};
use serde_json::{json, Map, Value as Json};
use std::path::PathBuf;

fn chat_fixtures() -> PathBuf {
    common::fixtures().join("chat")
}

fn read(path: PathBuf) -> String {
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn jsonl(name: &str) -> Vec<Json> {
    read(chat_fixtures().join(name))
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn no_extra() -> Map<String, Json> {
    Map::new()
}

/// The case's conversation rendered with `template`.
fn render_case(template: &ChatTemplate, case: &Json) -> Result<String, TemplateError> {
    let messages = case["messages"].as_array().expect("messages is an array");
    let tools = case["tools"].as_array().map(Vec::as_slice);
    let add_generation_prompt = case["add_generation_prompt"].as_bool().expect("add_generation_prompt");
    let extra = case.get("extra").and_then(Json::as_object).cloned().unwrap_or_default();
    template.render(messages, tools, add_generation_prompt, &extra)
}

fn user(content: &str) -> Json {
    json!({"role": "user", "content": content})
}

#[test]
fn qwen25_template_renders_every_reference_conversation_like_transformers() {
    let tiny = GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap();
    let from_model = ChatTemplate::from_metadata(tiny.metadata()).unwrap();
    assert!(!from_model.is_builtin_chatml());
    let from_fixture = ChatTemplate::new(&read(chat_fixtures().join("qwen25.jinja")), "", "").unwrap();

    let cases = jsonl("chat_qwen25.jsonl");
    assert_eq!(cases.len(), 9);
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let expected = case["rendered"].as_str().unwrap();
        for template in [&from_model, &from_fixture] {
            let rendered = render_case(template, case).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(rendered, expected, "case {name}");
        }
    }
}

#[test]
fn qwen3_qwq_qwen3_coder_and_deepseek_r1_templates_render_like_transformers() {
    let cases = jsonl("chat_templates.jsonl");
    assert_eq!(cases.len(), 28);
    for case in &cases {
        let file = case["template"].as_str().unwrap();
        let name = format!("{file} / {}", case["name"].as_str().unwrap());
        let source = read(chat_fixtures().join("templates").join(file));
        // transformers rendered these without special tokens (DeepSeek's `{{ bos_token }}` printed
        // nothing), so none are given here either.
        let template = ChatTemplate::new(&source, "", "").unwrap_or_else(|e| panic!("{name}: {e}"));
        let result = render_case(&template, case);
        match case["error"].as_str() {
            None => {
                let rendered = result.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(rendered, case["rendered"].as_str().unwrap(), "case {name}");
            }
            Some(expected) => {
                let err = result.expect_err(&format!("{name}: transformers refused with {expected:?}"));
                // A template's own raise_exception message must come through unchanged; other
                // failures (Python TypeErrors) are worded differently by minijinja.
                if source.contains(expected) {
                    assert!(err.to_string().contains(expected), "{name}: {err}");
                }
            }
        }
    }
}

#[test]
fn llama_mistral_phi_granite_smollm_and_gemma_templates_render_like_transformers() {
    let cases = jsonl("chat_templates_llama.jsonl");
    assert_eq!(cases.len(), 17 * 7);
    let mut failures = Vec::new();
    for case in &cases {
        let file = case["template"].as_str().unwrap();
        let name = format!("{file} / {}", case["name"].as_str().unwrap());
        let source = read(chat_fixtures().join("templates").join(file));
        // A template that cannot render a plain conversation is refused at load; transformers
        // must have refused its cases too.
        let result = ChatTemplate::new(&source, "", "").and_then(|template| render_case(&template, case));
        // A template that prints today's date was rendered by transformers on a frozen clock:
        // only the outcome can be compared.
        let date_dependent = case["date_dependent"].as_bool().unwrap_or(false);
        match (case["error"].as_str(), result) {
            (None, Ok(rendered)) if date_dependent || rendered == case["rendered"].as_str().unwrap() => {}
            // Two known differences, both Python's rather than the template's: Jinja2's `Markup`
            // escapes whatever is added to a `|safe` string (functionary v3.1 prints its tools'
            // JSON that way, quotes as `&#34;`), and iterating `tools = None` raises a TypeError
            // (the Hermes tool-use templates loop over `tools` unguarded). minfer, like llama.cpp,
            // prints the JSON as it is and loops over no tools.
            (None, Ok(rendered)) if rendered == case["rendered"].as_str().unwrap().replace("&#34;", "\"") => {}
            (Some(e), Ok(_)) if e.contains("'NoneType' object is not iterable") && case["tools"].is_null() => {}
            (None, Ok(rendered)) => failures.push(format!(
                "{name}: rendered\n{rendered:?}\ntransformers:\n{:?}",
                case["rendered"].as_str().unwrap()
            )),
            (None, Err(e)) => failures.push(format!("{name}: refused ({e}), transformers rendered it")),
            (Some(expected), Ok(_)) => failures.push(format!("{name}: rendered, transformers refused ({expected})")),
            (Some(expected), Err(err)) => {
                // A template's own raise_exception message comes through unchanged.
                if source.contains(expected) && !err.to_string().contains(expected) {
                    failures.push(format!("{name}: refused with {err}, transformers with {expected}"));
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

/// Today's date as the templates' `strftime_now("%Y-%m-%d")` prints it, read twice around `f`
/// so that a render that straddles midnight is run again.
fn on_one_date<T>(mut f: impl FnMut() -> T) -> (String, T) {
    let clock = ChatTemplate::new("{{ strftime_now('%Y-%m-%d') }}", "", "").unwrap();
    let today = || clock.render(&[user("x")], None, false, &no_extra()).unwrap();
    loop {
        let before = today();
        let value = f();
        if today() == before {
            return (before, value);
        }
    }
}

#[test]
fn the_gpt_oss_template_renders_reasoning_tool_calls_and_reasoning_effort_like_transformers() {
    let cases = jsonl("chat_templates_gpt_oss.jsonl");
    assert_eq!(cases.len(), 8);
    let source = read(chat_fixtures().join("templates/openai-gpt-oss-120b.jinja"));
    let template = ChatTemplate::new(&source, "", "").unwrap();
    assert!(template.is_harmony());
    for case in &cases {
        let name = case["name"].as_str().unwrap();
        let (today, result) = on_one_date(|| render_case(&template, case));
        match (case["rendered"].as_str(), result) {
            // transformers rendered on a frozen clock; the template prints the date once.
            (Some(expected), Ok(rendered)) => {
                let frozen = format!("Current date: {}\n", case["date"].as_str().unwrap());
                assert_eq!(expected.matches(&frozen).count(), 1, "{name}");
                let expected = expected.replace(&frozen, &format!("Current date: {today}\n"));
                assert_eq!(rendered, expected, "case {name}");
            }
            (None, Err(err)) => {
                let raised = case["error"].as_str().unwrap();
                assert!(err.to_string().contains(raised), "{name}: {err}");
            }
            (expected, result) => panic!("{name}: transformers {expected:?}, minfer {result:?}"),
        }
    }
    // Each reasoning level the server accepts reaches the template's system message.
    let low = cases.iter().find(|c| c["name"] == "tool_round_trip_low").unwrap();
    for effort in ["low", "medium", "high"] {
        let mut case = low.clone();
        case["extra"]["reasoning_effort"] = json!(effort);
        let rendered = render_case(&template, &case).unwrap();
        assert!(rendered.contains(&format!("\n\nReasoning: {effort}\n\n")), "{effort}");
    }
}

/// llama.cpp's whole collection of real templates (`scripts/fetch-llama-vocab.sh` fetches it):
/// every one compiles or is refused with an error, and renders each reference conversation or
/// refuses it with an error — never a panic.
#[test]
fn every_template_of_llama_cpps_collection_renders_or_refuses_without_a_panic() {
    let dir = PathBuf::from(std::env::var_os("HOME").expect("HOME is set"))
        .join(".cache/minfer/llama-vocab-0c1e570/templates");
    let dir = std::env::var_os("MINFER_LLAMA_VOCAB")
        .map(|d| PathBuf::from(d).join("templates"))
        .unwrap_or(dir);
    assert!(
        dir.is_dir(),
        "{} is missing; run scripts/fetch-llama-vocab.sh (scripts/test.sh does)",
        dir.display()
    );
    let conversations = jsonl("chat_templates.jsonl");
    let (mut rendered, mut refused, mut templates) = (0, Vec::new(), 0);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    for path in &paths {
        templates += 1;
        let source = read(path.clone());
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let outcome = std::panic::catch_unwind(|| match ChatTemplate::new(&source, "<s>", "</s>") {
            Err(e) => vec![Err(e.to_string())],
            Ok(t) => conversations
                .iter()
                .take(7)
                .map(|c| render_case(&t, c).map_err(|e| e.to_string()))
                .collect(),
        });
        let results = outcome.unwrap_or_else(|_| panic!("{file}: the template panicked"));
        for r in results {
            match r {
                Ok(_) => rendered += 1,
                Err(e) => {
                    assert!(!e.is_empty(), "{file}: an empty error");
                    refused.push(format!("{file}: {e}"));
                }
            }
        }
    }
    assert!(templates >= 70, "only {templates} templates in {}", dir.display());
    eprintln!(
        "{templates} templates: {rendered} renderings, {} refusals",
        refused.len()
    );
}

#[test]
fn chatml_is_used_when_the_metadata_has_no_template() {
    let template = ChatTemplate::from_metadata(&Metadata::new()).unwrap();
    assert!(template.is_builtin_chatml());
    assert_eq!((template.bos_token(), template.eos_token()), ("", ""));
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        user("Hi"),
        json!({"role": "assistant", "content": "Hello"}),
        user("Bye"),
    ];
    assert_eq!(
        template.render(&messages, None, true, &no_extra()).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
         <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn a_template_with_a_syntax_error_is_refused_at_load_with_the_minijinja_message() {
    let source = "{% for message in messages %}\n{{ message.content }}\n{% if %}\n{% endfor %}";
    let err = ChatTemplate::new(source, "", "").unwrap_err();
    let TemplateError::Compile { message } = &err else {
        panic!("expected a compile error, got {err:?}");
    };
    assert!(message.contains("syntax error"), "{message}");
    assert!(
        message.contains("chat_template:3"),
        "the message names the line: {message}"
    );
}

#[test]
fn a_template_that_raises_for_every_conversation_is_refused_at_load() {
    let source = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}";
    let err = ChatTemplate::new(source, "", "").unwrap_err();
    let TemplateError::Probe { message } = &err else {
        panic!("expected a probe error, got {err:?}");
    };
    assert!(
        message.contains("Conversation roles must alternate user/assistant/user/assistant/..."),
        "{message}"
    );
    assert!(message.contains("chat_template:1"), "{message}");
}

#[test]
fn a_template_that_only_refuses_system_messages_loads_and_refuses_them_when_rendering() {
    let source = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}\
                  {% endif %}<{{ m.role }}>{{ m.content }}{% endfor %}";
    let template = ChatTemplate::new(source, "", "").unwrap();
    assert_eq!(
        template.render(&[user("Hi")], None, true, &no_extra()).unwrap(),
        "<user>Hi"
    );
    let err = template
        .render(
            &[json!({"role": "system", "content": "x"}), user("Hi")],
            None,
            true,
            &no_extra(),
        )
        .unwrap_err();
    assert!(matches!(&err, TemplateError::Render { message } if message.contains("System role not supported")));
}

#[test]
fn content_given_as_an_array_of_text_parts_renders_like_the_joined_string() {
    let template =
        ChatTemplate::from_metadata(GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap().metadata()).unwrap();
    let parts = json!({"role": "user", "content": [
        {"type": "text", "text": "First part."},
        {"type": "text", "text": "Second part, 日本語."},
    ]});
    let joined = user("First part.\nSecond part, 日本語.");
    assert_eq!(
        template.render(&[parts], None, true, &no_extra()).unwrap(),
        template.render(&[joined], None, true, &no_extra()).unwrap()
    );
}

#[test]
fn a_message_without_a_role_is_refused_with_an_error_naming_its_index() {
    let template = ChatTemplate::chatml();
    let messages = [
        user("Hi"),
        json!({"role": "assistant", "content": "Hello"}),
        json!({"content": "Who am I?"}),
    ];
    let err = template.render(&messages, None, true, &no_extra()).unwrap_err();
    assert!(
        matches!(&err, TemplateError::InvalidMessage { index: 2, field, .. } if field == "role"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "invalid message 2, field 'role': is missing");
}

#[test]
fn content_of_an_unsupported_type_is_refused_naming_the_field() {
    let template = ChatTemplate::chatml();
    let cases = [
        (json!({"role": "user", "content": 42}), "content"),
        (json!({"role": "user", "content": {"text": "hi"}}), "content"),
        (
            json!({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}),
            "content[0].type",
        ),
        (
            json!({"role": "user", "content": [{"type": "text"}]}),
            "content[0].text",
        ),
        (
            json!({"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}),
            "content[1]",
        ),
        (json!({"role": 1, "content": "hi"}), "role"),
        (json!("just a string"), ""),
    ];
    for (message, expected_field) in cases {
        let err = template
            .render(&[user("Hi"), message.clone()], None, true, &no_extra())
            .unwrap_err();
        assert!(
            matches!(&err, TemplateError::InvalidMessage { index: 1, field, .. } if field == expected_field),
            "{message}: {err:?}"
        );
    }
}

#[test]
fn extra_variables_reach_the_template_but_cannot_replace_the_conversation() {
    let template = ChatTemplate::new(
        "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% if enable_thinking is false %}/no_think{% endif %}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    assert_eq!(
        template.render(&[user("Hi")], None, true, &extra).unwrap(),
        "<s>Hi/no_think"
    );
    extra.insert("bos_token".into(), json!("[BOS]"));
    assert_eq!(
        template.render(&[user("Hi")], None, true, &extra).unwrap(),
        "[BOS]Hi/no_think"
    );
    extra.insert("messages".into(), json!([]));
    let err = template.render(&[user("Hi")], None, true, &extra).unwrap_err();
    assert!(
        matches!(&err, TemplateError::InvalidInput { name, .. } if name == "messages"),
        "{err:?}"
    );
}

#[test]
fn transformers_helpers_behave_as_in_python() {
    // Expected output is what jinja2 3.1.6 renders with transformers' environment and helpers.
    let source = "{{ messages[0].content.strip().split(' ') | tojson }}|\
                  {% if tools %}{{ tools[0] | tojson(indent=2) }}{% endif %}|{{ none is iterable }}|{{ 1e-05 }}|\
                  {{ messages[0].content.startswith(' a') }}|{{ strftime_now('%Y') | length }}|{{ {} is sequence }}|\
                  {{ 2.5e20 | string }}";
    let template = ChatTemplate::new(source, "", "").unwrap();
    let tools = [json!({"name": "f", "enum": ["<a>", "b&c"]})];
    assert_eq!(
        template.render(&[user(" a b ")], Some(&tools), false, &no_extra()).unwrap(),
        "[\"a\", \"b\"]|{\n  \"name\": \"f\",\n  \"enum\": [\n    \"<a>\",\n    \"b&c\"\n  ]\n}|False|1e-05|True|4|True|2.5e+20"
    );
}

#[test]
fn rendering_odd_json_returns_errors_instead_of_panicking() {
    let template =
        ChatTemplate::from_metadata(GgufFile::open(common::tiny_model("qwen2", "F32")).unwrap().metadata()).unwrap();
    let mut deep = json!("leaf");
    for _ in 0..200 {
        deep = json!([deep]);
    }
    let odd_messages = [
        vec![],
        vec![json!(null)],
        vec![json!({"role": "assistant", "content": null})],
        vec![json!({"role": "assistant", "tool_calls": "not a list"})],
        vec![json!({"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": deep.clone()}}]})],
        vec![json!({"role": "tool"})],
        vec![json!({"role": "user", "content": "x", "extra": {"a": [1.5e300, -0.0, u64::MAX, i64::MIN]}})],
    ];
    for messages in &odd_messages {
        // Any outcome but a panic is acceptable; the content of these is the template's business.
        let _ = template.render(messages, None, true, &no_extra());
        let _ = template.render(
            messages,
            Some(&[json!(null), json!([1, {"a": deep.clone()}])]),
            false,
            &no_extra(),
        );
    }
    let err = template
        .render(&[user("Hi")], Some(&[deep.clone()]), true, &no_extra())
        .unwrap_err();
    assert!(
        matches!(&err, TemplateError::InvalidInput { name, .. } if name == "tools[0]"),
        "{err:?}"
    );
}

#[test]
fn the_largest_conversation_a_request_can_carry_renders_within_the_fuel_budget() {
    // The server's limits (8 MiB body, 2,048 messages, 128 tools), filled: every fixture template
    // must render it, or the fuel that stops hostile templates would refuse real requests.
    let content = "word ".repeat(800);
    // Each message its own (Mistral's templates print the tools before every user message equal
    // to the last one).
    let messages: Vec<Json> = (0..2048)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("{i} {content}")}))
        .collect();
    let tools: Vec<Json> = (0..128)
        .map(|i| {
            json!({"type": "function", "function": {
                "name": format!("f{i}"), "description": "d".repeat(500),
                "parameters": {"type": "object", "properties": {"a": {"type": "string", "description": "x".repeat(300)}}}
            }})
        })
        .collect();
    let mut sources = vec![("qwen25.jinja".to_string(), read(chat_fixtures().join("qwen25.jinja")))];
    for entry in std::fs::read_dir(chat_fixtures().join("templates")).unwrap() {
        let path = entry.unwrap().path();
        sources.push((path.file_name().unwrap().to_string_lossy().to_string(), read(path)));
    }
    assert_eq!(sources.len(), 23);
    let mut rendered_by = 0;
    for (name, source) in &sources {
        // A template that refuses this conversation for its own reasons (Mistral's nine-character
        // tool call ids, a template that wants `functions`) is not the budget's concern; one
        // that runs out of fuel or output is.
        let result = ChatTemplate::new(source, "", "<|im_end|>")
            .and_then(|t| t.render(&messages, Some(&tools), true, &no_extra()));
        match result {
            Ok(rendered) => {
                assert!(rendered.len() > 8_000_000, "{name}");
                rendered_by += 1;
            }
            Err(e @ (TemplateError::OutOfFuel { .. } | TemplateError::TooLong { .. })) => panic!("{name}: {e}"),
            Err(_) => {}
        }
    }
    assert!(
        rendered_by >= 15,
        "only {rendered_by} templates rendered the largest conversation"
    );
}
