//! The `minfer` binary: parses flags, calls the library, maps errors to exit codes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use minfer::gguf::GgufFile;
use std::path::PathBuf;
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
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Info { model, tensors } => {
            let file = GgufFile::open(&model).with_context(|| format!("cannot read model {}", model.display()))?;
            print!("{}", minfer::cli::info::render(&file, tensors));
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
