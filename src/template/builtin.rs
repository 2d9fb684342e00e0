//! llama.cpp's built-in chat templates by name (`--chat-template chatml`), as Jinja text that
//! renders what llama.cpp's own C++ formatting of the same name renders (checked against it on
//! a conversation with and without a system message: `tests/fixtures/chat/llama_cpp_builtin_templates.jsonl`).
//! Only the names; a model's own template and `--chat-template-file` go through
//! [`ChatTemplate`](super::ChatTemplate) as they are. Like llama.cpp's built-ins, these print no
//! BOS: the tokenizer adds one where the model asks for it.
//!
//! Every piece is printed by an expression and every tag trims the template's own whitespace,
//! so the output is exactly the pieces.

/// The names of every built-in template llama.cpp 0c1e570 has (`llama_chat_builtin_templates`),
/// whether or not minfer has it: a name here that [`builtin`] lacks is refused by name.
pub const LLAMA_CPP_NAMES: &[&str] = &[
    "bailing",
    "bailing-think",
    "bailing2",
    "chatglm3",
    "chatglm4",
    "chatml",
    "command-r",
    "deepseek",
    "deepseek-ocr",
    "deepseek2",
    "deepseek3",
    "exaone-moe",
    "exaone3",
    "exaone4",
    "falcon3",
    "gemma",
    "gigachat",
    "glmedge",
    "gpt-oss",
    "granite",
    "granite-4.0",
    "granite-4.1",
    "grok-2",
    "hunyuan-dense",
    "hunyuan-moe",
    "hunyuan-vl",
    "kimi-k2",
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "llama3",
    "llama4",
    "megrez",
    "minicpm",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "monarch",
    "openchat",
    "orion",
    "pangu-embedded",
    "phi3",
    "phi4",
    "rwkv-world",
    "seed_oss",
    "smolvlm",
    "solar-open",
    "vicuna",
    "vicuna-orca",
    "yandex",
    "zephyr",
];

/// The Jinja text of llama.cpp's built-in template `name`, where minfer has it.
pub fn builtin(name: &str) -> Option<&'static str> {
    BUILTINS.iter().find(|(n, _)| *n == name).map(|&(_, text)| text)
}

/// The names [`builtin`] knows.
pub fn builtin_names() -> impl Iterator<Item = &'static str> {
    BUILTINS.iter().map(|&(name, _)| name)
}

/// llama-2's `[INST]` turns: `sys` how a system message is printed (`<<SYS>>` or not), `bos`
/// whether a later turn opens with `<s>`, `strip` whether contents are trimmed.
macro_rules! llama2 {
    ($sys:literal, $bos:literal, $strip:literal) => {
        concat!(
            "{%- set ns = namespace(inside=true) -%}{{ '[INST] ' }}",
            "{%- for m in messages -%}",
            "{%- set c = m.content | trim if ",
            $strip,
            " else m.content -%}",
            "{%- if not ns.inside -%}{%- set ns.inside = true -%}{{ '",
            $bos,
            "[INST] ' }}{%- endif -%}",
            "{%- if m.role == 'system' -%}",
            $sys,
            "{%- elif m.role == 'user' -%}{{ c + ' [/INST]' }}",
            "{%- else -%}{{ c + '</s>' }}{%- set ns.inside = false -%}{%- endif -%}",
            "{%- endfor -%}"
        )
    };
}

/// Mistral's `[INST]` turns before v7: `lead` before `[INST]` and `[/INST]`, `trail` after
/// `[INST]` and before a reply, `trim` whether replies are trimmed.
macro_rules! mistral {
    ($lead:literal, $trail:literal, $trim:literal) => {
        concat!(
            "{%- set ns = namespace(inside=false) -%}",
            "{%- for m in messages -%}",
            "{%- if not ns.inside -%}{{ '",
            $lead,
            "[INST]",
            $trail,
            "' }}{%- set ns.inside = true -%}{%- endif -%}",
            "{%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}",
            "{%- elif m.role == 'user' -%}{{ m.content + '",
            $lead,
            "[/INST]' }}",
            "{%- else -%}{{ '",
            $trail,
            "' + (m.content | trim if ",
            $trim,
            " else m.content) + '</s>' }}{%- set ns.inside = false -%}{%- endif -%}",
            "{%- endfor -%}"
        )
    };
}

const BUILTINS: &[(&str, &str)] = &[
    (
        "chatml",
        "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}",
    ),
    ("llama2", llama2!("{{ c + '\\n' }}", "", "false")),
    ("llama2-sys", llama2!("{{ '<<SYS>>\\n' + c + '\\n<</SYS>>\\n\\n' }}", "", "false")),
    ("llama2-sys-bos", llama2!("{{ '<<SYS>>\\n' + c + '\\n<</SYS>>\\n\\n' }}", "<s>", "false")),
    ("llama2-sys-strip", llama2!("{{ '<<SYS>>\\n' + c + '\\n<</SYS>>\\n\\n' }}", "", "true")),
    (
        "llama3",
        "{%- for m in messages -%}{{ '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}",
    ),
    (
        "llama4",
        "{%- for m in messages -%}{{ '<|header_start|>' + m.role + '<|header_end|>\\n\\n' + m.content | trim + '<|eot|>' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|header_start|>assistant<|header_end|>\\n\\n' }}{%- endif -%}",
    ),
    (
        "gemma",
        "{%- set ns = namespace(system='') -%}\
         {%- for m in messages -%}\
         {%- if m.role == 'system' -%}{%- set ns.system = ns.system + m.content | trim -%}\
         {%- else -%}\
         {%- set role = 'model' if m.role == 'assistant' else m.role -%}\
         {{ '<start_of_turn>' + role + '\\n' }}\
         {%- if ns.system and role != 'model' -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}\
         {{ m.content | trim + '<end_of_turn>\\n' }}\
         {%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}",
    ),
    (
        "phi3",
        "{%- for m in messages -%}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
    ),
    (
        "phi4",
        "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '<|im_sep|>' + m.content + '<|im_end|>' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|im_start|>assistant<|im_sep|>' }}{%- endif -%}",
    ),
    (
        "zephyr",
        "{%- for m in messages -%}{{ '<|' + m.role + '|>\\n' + m.content + '<|endoftext|>\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
    ),
    (
        "falcon3",
        "{%- for m in messages -%}{{ '<|' + m.role + '|>\\n' + m.content + '\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
    ),
    ("mistral-v1", mistral!(" ", " ", "false")),
    ("mistral-v3", mistral!("", " ", "true")),
    ("mistral-v3-tekken", mistral!("", "", "false")),
    (
        "mistral-v7",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ '[SYSTEM_PROMPT] ' + m.content + '[/SYSTEM_PROMPT]' }}\
         {%- elif m.role == 'user' -%}{{ '[INST] ' + m.content + '[/INST]' }}\
         {%- else -%}{{ ' ' + m.content + '</s>' }}{%- endif -%}\
         {%- endfor -%}",
    ),
    (
        "mistral-v7-tekken",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ '[SYSTEM_PROMPT]' + m.content + '[/SYSTEM_PROMPT]' }}\
         {%- elif m.role == 'user' -%}{{ '[INST]' + m.content + '[/INST]' }}\
         {%- else -%}{{ m.content + '</s>' }}{%- endif -%}\
         {%- endfor -%}",
    ),
    (
        "vicuna",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}\
         {%- elif m.role == 'user' -%}{{ 'USER: ' + m.content + '\\n' }}\
         {%- elif m.role == 'assistant' -%}{{ 'ASSISTANT: ' + m.content + '</s>\\n' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}",
    ),
    (
        "vicuna-orca",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ 'SYSTEM: ' + m.content + '\\n' }}\
         {%- elif m.role == 'user' -%}{{ 'USER: ' + m.content + '\\n' }}\
         {%- elif m.role == 'assistant' -%}{{ 'ASSISTANT: ' + m.content + '</s>\\n' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ 'ASSISTANT:' }}{%- endif -%}",
    ),
    (
        "deepseek",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content }}\
         {%- elif m.role == 'user' -%}{{ '### Instruction:\\n' + m.content + '\\n' }}\
         {%- elif m.role == 'assistant' -%}{{ '### Response:\\n' + m.content + '\\n<|EOT|>\\n' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '### Response:\\n' }}{%- endif -%}",
    ),
    (
        "deepseek2",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}\
         {%- elif m.role == 'user' -%}{{ 'User: ' + m.content + '\\n\\n' }}\
         {%- elif m.role == 'assistant' -%}{{ 'Assistant: ' + m.content + '<｜end▁of▁sentence｜>' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}",
    ),
    (
        "deepseek3",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}\
         {%- elif m.role == 'user' -%}{{ '<｜User｜>' + m.content }}\
         {%- elif m.role == 'assistant' -%}{{ '<｜Assistant｜>' + m.content + '<｜end▁of▁sentence｜>' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<｜Assistant｜>' }}{%- endif -%}",
    ),
    (
        "command-r",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ '<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>' + m.content | trim + '<|END_OF_TURN_TOKEN|>' }}\
         {%- elif m.role == 'user' -%}{{ '<|START_OF_TURN_TOKEN|><|USER_TOKEN|>' + m.content | trim + '<|END_OF_TURN_TOKEN|>' }}\
         {%- elif m.role == 'assistant' -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' + m.content | trim + '<|END_OF_TURN_TOKEN|>' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' }}{%- endif -%}",
    ),
    (
        "granite",
        "{%- for m in messages -%}{{ '<|start_of_role|>' + m.role + '<|end_of_role|>' + m.content + '<|end_of_text|>\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|start_of_role|>assistant<|end_of_role|>' }}{%- endif -%}",
    ),
    (
        "openchat",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content + '<|end_of_turn|>' }}\
         {%- else -%}{{ 'GPT4 Correct ' + m.role[:1] | upper + m.role[1:] + ': ' + m.content + '<|end_of_turn|>' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ 'GPT4 Correct Assistant:' }}{%- endif -%}",
    ),
    (
        "monarch",
        "{%- for m in messages -%}{{ ('' if loop.first else '<s>') + m.role + '\\n' + m.content + '</s>\\n' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<s>assistant\\n' }}{%- endif -%}",
    ),
    (
        "megrez",
        "{%- for m in messages -%}{{ '<|role_start|>' + m.role + '<|role_end|>' + m.content + '<|turn_end|>' }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|role_start|>assistant<|role_end|>' }}{%- endif -%}",
    ),
    (
        "chatglm4",
        "{{ '[gMASK]<sop>' }}{%- for m in messages -%}{{ '<|' + m.role + '|>\\n' + m.content }}{%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '<|assistant|>\\n' }}{%- endif -%}",
    ),
    (
        "exaone3",
        "{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ '[|system|]' + m.content | trim + '[|endofturn|]\\n' }}\
         {%- elif m.role == 'user' -%}{{ '[|user|]' + m.content | trim + '\\n' }}\
         {%- elif m.role == 'assistant' -%}{{ '[|assistant|]' + m.content | trim + '[|endofturn|]\\n' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ '[|assistant|]' }}{%- endif -%}",
    ),
    (
        "minicpm",
        "{%- for m in messages -%}\
         {%- if m.role == 'user' -%}{{ '<用户>' + m.content | trim + '<AI>' }}{%- else -%}{{ m.content | trim }}{%- endif -%}\
         {%- endfor -%}",
    ),
    (
        "smolvlm",
        "{{ '<|im_start|>' }}{%- for m in messages -%}\
         {%- if m.role == 'system' -%}{{ m.content + '\\n\\n' }}\
         {%- elif m.role == 'user' -%}{{ 'User: ' + m.content + '<end_of_utterance>\\n' }}\
         {%- else -%}{{ 'Assistant: ' + m.content + '<end_of_utterance>\\n' }}{%- endif -%}\
         {%- endfor -%}\
         {%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}",
    ),
    (
        "orion",
        "{%- set ns = namespace(system='') -%}\
         {%- for m in messages -%}\
         {%- if m.role == 'system' -%}{%- set ns.system = ns.system + m.content -%}\
         {%- elif m.role == 'user' -%}{{ 'Human: ' }}\
         {%- if ns.system -%}{{ ns.system + '\\n\\n' }}{%- set ns.system = '' -%}{%- endif -%}\
         {{ m.content + '\\n\\nAssistant: </s>' }}\
         {%- else -%}{{ m.content + '</s>' }}{%- endif -%}\
         {%- endfor -%}",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::ChatTemplate;
    use serde_json::{json, Value};

    fn fixture() -> Vec<Value> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/chat/llama_cpp_builtin_templates.jsonl"
        );
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn every_builtin_renders_what_llama_cpp_renders_under_its_name() {
        let system = json!({"role": "system", "content": "You are a helpful assistant"});
        let turns = json!([
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there"},
            {"role": "user", "content": "Who are you"},
            {"role": "assistant", "content": "   I am an assistant   "},
            {"role": "user", "content": "Another question"},
        ]);
        let mut checked = 0;
        for case in fixture() {
            let name = case["name"].as_str().unwrap();
            let Some(text) = builtin(name) else { continue };
            let mut messages = turns.as_array().unwrap().clone();
            if case["with_system"] == true {
                messages.insert(0, system.clone());
            }
            let rendered = ChatTemplate::new(text, "", "")
                .unwrap()
                .render(&messages, None, true, &Default::default())
                .unwrap();
            assert_eq!(
                rendered,
                case["prompt"].as_str().unwrap(),
                "{name}, system: {}",
                case["with_system"]
            );
            checked += 1;
        }
        assert_eq!(checked, 2 * builtin_names().count());
    }

    #[test]
    fn the_names_are_llama_cpps_own() {
        let mut from_llama_cpp: Vec<String> = fixture()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        from_llama_cpp.dedup();
        assert_eq!(from_llama_cpp, LLAMA_CPP_NAMES);
        for name in builtin_names() {
            assert!(LLAMA_CPP_NAMES.contains(&name), "{name}");
        }
    }
}
