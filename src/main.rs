//! The `minfer` binary: parses flags, calls the library, maps errors to exit codes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "minfer", version, about = "A pure-Rust LLM inference engine for GGUF models")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's format, hyper-parameters, tokenizer and tensor summary.
    ///
    /// Example: minfer info ~/.cache/minfer/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf --tensors
    Info {
        /// The GGUF file (for a split model, any of its parts).
        model: PathBuf,
        /// Also print the tensor table (name, type, shape, offset, size).
        #[arg(long)]
        tensors: bool,
    },
    /// Tokenize a text with the model's tokenizer and print the tokens.
    ///
    /// Examples:
    ///   minfer tokenize MODEL 'Hello world'
    ///   minfer tokenize MODEL --ids '<|im_start|>user'
    ///   minfer tokenize MODEL --file prompt.txt --no-special
    #[command(verbatim_doc_comment)]
    Tokenize {
        /// The GGUF file whose tokenizer to use.
        model: PathBuf,
        /// The text to tokenize (or use --file).
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        text: Option<String>,
        /// Read the text from this file ('-' for standard input).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Print only a JSON array of the ids.
        #[arg(long)]
        ids: bool,
        /// Treat special-token text such as <|im_start|> as plain text.
        #[arg(long)]
        no_special: bool,
    },
    /// Render a conversation with the model's chat template and print the prompt exactly.
    ///
    /// MESSAGES is an OpenAI-style JSON array of {"role", "content"} objects (assistant
    /// messages may carry "tool_calls"); TOOLS a JSON array of tool definitions.
    ///
    /// Example: minfer render MODEL --messages chat.json --tools tools.json
    Render {
        /// The GGUF file whose template to use (ChatML if it has none).
        model: PathBuf,
        /// JSON file with the messages array ('-' for standard input).
        #[arg(long)]
        messages: PathBuf,
        /// JSON file with the tools array.
        #[arg(long)]
        tools: Option<PathBuf>,
        /// Do not append the assistant turn's opening.
        #[arg(long)]
        no_generation_prompt: bool,
    },
}

fn read_json_array(path: &Path, what: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let bytes = read_text_arg(path)?;
    let value: serde_json::Value =
        serde_json::from_slice(&bytes).with_context(|| format!("{} is not valid JSON", path.display()))?;
    match value {
        serde_json::Value::Array(items) => Ok(items),
        other => anyhow::bail!(
            "{} must hold a JSON array of {what}, found {}",
            path.display(),
            json_kind(&other)
        ),
    }
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn open_model(model: &Path) -> anyhow::Result<GgufFile> {
    GgufFile::open(model).with_context(|| format!("cannot read model {}", model.display()))
}

fn read_text_arg(file: &Path) -> anyhow::Result<Vec<u8>> {
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
        return Ok(bytes);
    }
    std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info { model, tensors } => {
            let file = open_model(&model)?;
            print!("{}", minfer::cli::info::render(&file, tensors));
        }
        Command::Tokenize {
            model,
            text,
            file,
            ids,
            no_special,
        } => {
            let gguf = open_model(&model)?;
            let tokenizer = Tokenizer::from_metadata(gguf.metadata())
                .with_context(|| format!("cannot build the tokenizer of {}", model.display()))?;
            let bytes = match (text, file) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(file)) => read_text_arg(&file)?,
                (None, None) => unreachable!("clap requires TEXT or --file"),
            };
            let tokens = tokenizer.encode_bytes(&bytes, false, !no_special);
            let out = if ids {
                minfer::cli::tokenize::ids_json(&tokens) + "\n"
            } else {
                minfer::cli::tokenize::pieces_table(&tokenizer, &tokens)
            };
            std::io::stdout().write_all(out.as_bytes())?;
        }
        Command::Render {
            model,
            messages,
            tools,
            no_generation_prompt,
        } => {
            let gguf = open_model(&model)?;
            let template = minfer::template::ChatTemplate::from_metadata(gguf.metadata())
                .with_context(|| format!("the chat template of {} cannot be used", model.display()))?;
            let messages = read_json_array(&messages, "messages")?;
            let tools = tools.map(|t| read_json_array(&t, "tools")).transpose()?;
            let prompt = template.render(
                &messages,
                tools.as_deref(),
                !no_generation_prompt,
                &serde_json::Map::new(),
            )?;
            std::io::stdout().write_all(prompt.as_bytes())?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
