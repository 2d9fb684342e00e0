//! The `minfer` binary: parses flags, calls the library, maps errors to exit codes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use minfer::gguf::split::SplitLimit;
use minfer::tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod args;
mod bench;
mod cli;
mod generate;
mod serve;

use args::*;
use generate::*;

#[derive(Parser)]
#[command(
    name = "minfer",
    version,
    about = "A pure-Rust LLM inference engine for GGUF models",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  minfer model.gguf 'Write a haiku about Rust'\n  echo 'def fib(n):' | minfer model.gguf --no-template --greedy -n 64\n  minfer info model.gguf --tensors\n  minfer bench model.gguf -p 512 -n 128 -t 1,2\n  minfer serve model.gguf --port 8080\n  minfer hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M 'Write a haiku about Rust'\n  minfer pull ollama:qwen2.5-coder:0.5b\n  minfer run qwen2.5-coder:0.5b            (a conversation, as `ollama run`)\n\nMODEL is a GGUF file, a file name in the model cache ($MINFER_MODELS, default\n~/.cache/minfer/models), hf:OWNER/REPO[:QUANT] or ollama:NAME[:TAG] (NAME:TAG alone is\nollama:NAME:TAG); a reference the cache lacks is fetched into it first."
)]
struct Cli {
    /// Record every forward pass (each executed node's op, layer, backend, shapes, start and
    /// duration) as a Chrome trace in FILE, for Perfetto or chrome://tracing.
    #[arg(long, global = true, value_name = "FILE", env = "MINFER_TRACE")]
    trace: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Fetch a model into the model cache without running it, and print its local path.
    ///
    /// REF is hf:OWNER/REPO[:QUANT] (a GGUF file of a Hugging Face repository; QUANT defaults to
    /// Q4_K_M, else the only model there) or ollama:NAME[:TAG] (an Ollama registry model; TAG
    /// defaults to latest). An interrupted download resumes; the file is verified against its
    /// published sha256 before it enters the cache.
    ///
    /// Examples:
    ///   minfer pull hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M
    ///   minfer pull ollama:qwen2.5-coder:0.5b
    #[command(verbatim_doc_comment)]
    Pull {
        /// hf:OWNER/REPO[:QUANT] or ollama:NAME[:TAG].
        reference: String,
    },
    /// List the models in the model cache: name, size, GGUF file type and source.
    List,
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
    /// Compute an importance matrix as llama-imatrix does (for quantize --imatrix).
    ///
    /// The text is cut into chunks of -c tokens; the squares of every layer matrix's input
    /// columns are summed over them, and written in llama-imatrix's GGUF form.
    ///
    /// Example: minfer imatrix model-f16.gguf -f calibration.txt -o imatrix.gguf
    #[command(verbatim_doc_comment)]
    Imatrix {
        /// The GGUF model.
        model: PathBuf,
        /// The calibration text.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The file to write.
        #[arg(short = 'o', long = "output", default_value = "imatrix.gguf")]
        output: PathBuf,
        /// Tokens per chunk.
        #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
        ctx_size: usize,
        /// At most this many chunks (default: all the text holds).
        #[arg(long)]
        chunks: Option<usize>,
        /// Also collect the output head's input (llama-imatrix's --process-output).
        #[arg(long)]
        process_output: bool,
        /// Threads (default: one per physical core).
        #[arg(short = 't', long)]
        threads: Option<usize>,
    },
    /// Quantize a GGUF file as llama-quantize does: its mixes' per-tensor rules, its bytes.
    ///
    /// Examples:
    ///   minfer quantize model-f16.gguf model-q4_k_m.gguf Q4_K_M
    ///   minfer quantize model-f16.gguf model-q8_0.gguf Q8_0 --pure
    #[command(verbatim_doc_comment)]
    Quantize {
        /// The GGUF file to read (for a split model, its first part).
        input: PathBuf,
        /// The GGUF file to write.
        output: PathBuf,
        /// The file type: Q4_K_M, Q4_K_S, Q5_K_M, Q5_K_S, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
        /// F16, BF16, F32 (Q4_K and Q5_K are aliases of Q4_K_M and Q5_K_M).
        ggml_type: String,
        /// Every matrix in TYPE's own type, without the mix's rules (llama-quantize's --pure).
        #[arg(long)]
        pure: bool,
        /// An importance matrix weighing the quantizers (llama-imatrix's GGUF or legacy .dat).
        #[arg(long, value_name = "FILE")]
        imatrix: Option<PathBuf>,
        /// Use the importance matrix only for the tensors whose names contain NAME (repeatable).
        #[arg(long = "include-weights", value_name = "NAME")]
        include_weights: Vec<String>,
        /// Do not use the importance matrix for the tensors whose names contain NAME
        /// (repeatable).
        #[arg(long = "exclude-weights", value_name = "NAME")]
        exclude_weights: Vec<String>,
        /// Threads (default: one per physical core).
        #[arg(short = 't', long)]
        threads: Option<usize>,
    },
    /// Split a GGUF file into parts as llama-gguf-split does (OUT_PREFIX-00001-of-0000N.gguf).
    ///
    /// Examples:
    ///   minfer split model.gguf parts/model --split-max-size 500M
    ///   minfer split model.gguf parts/model --split-max-tensors 128
    #[command(verbatim_doc_comment)]
    Split {
        /// The GGUF file to split.
        input: PathBuf,
        /// The parts' path without the -NNNNN-of-NNNNN.gguf suffix.
        out_prefix: String,
        /// At most this many tensors per part (the default, 128).
        #[arg(long, conflicts_with = "split_max_size")]
        split_max_tensors: Option<usize>,
        /// At most this much tensor data per part: N M or N G (decimal megabytes, gigabytes).
        #[arg(long)]
        split_max_size: Option<String>,
        /// The first part holds only the metadata.
        #[arg(long)]
        no_tensor_first_split: bool,
    },
    /// Merge a split GGUF model back into one file (the inverse of split).
    ///
    /// Example: minfer merge parts/model-00001-of-00003.gguf model.gguf
    Merge {
        /// A part of the split model (the first, or any).
        part: PathBuf,
        /// The file to write (it must not exist).
        output: PathBuf,
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
        /// Do not add the BOS token the file's tokenizer.ggml.add_bos_token asks for (added by
        /// default, as llama-tokenize adds it).
        #[arg(long)]
        no_bos: bool,
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
    /// Print the highest logits at the last position of a raw text (specials parsed, no
    /// template, no BOS unless the model asks for one): how numerics are compared with other
    /// engines.
    ///
    /// Example: minfer eval MODEL 'def fib(n):' --top 5 --out logits.f32
    Eval {
        model: PathBuf,
        text: String,
        /// How many of the highest logits to print as JSON [[id, logit], ...].
        #[arg(long, default_value_t = 20)]
        top: usize,
        /// Also write all last-position logits as little-endian f32.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Embed texts: each TEXT, and each line of -f FILE, pooled into one vector (as
    /// llama-embedding does), printed as JSON.
    ///
    /// Pooling is the file's pooling_type, else `last` (a decoder model without the key); the
    /// vectors are scaled by --embd-normalize (llama.cpp's integers: -1 none, 0 max absolute,
    /// 1 taxicab, 2 euclidean, the default, p > 2 a p-norm). Inputs share forward passes of up
    /// to -b tokens (default 2048); each is embedded as it would be alone.
    ///
    /// Examples:
    ///   minfer embed MODEL 'Hello world' 'Bonjour le monde' -o json+
    ///   minfer embed MODEL -f lines.txt --pooling mean --embd-normalize -1 -o array
    #[command(verbatim_doc_comment)]
    Embed {
        /// The GGUF model (a path, a cached name, hf:… or ollama:…).
        model: PathBuf,
        /// The texts to embed, one vector each.
        texts: Vec<String>,
        /// Also embed each non-empty line of FILE ('-' for standard input).
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: Option<PathBuf>,
        /// How token rows become one vector: none, mean, cls, last or rank.
        #[arg(long, value_name = "P")]
        pooling: Option<String>,
        /// How vectors are scaled (llama.cpp's integers; 2: euclidean).
        #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_name = "N")]
        embd_normalize: i32,
        /// Output format: json, json+ (with the cosine similarity matrix) or array.
        #[arg(
            short = 'o',
            long = "embd-output-format",
            default_value = "json",
            value_name = "FORMAT"
        )]
        embd_output_format: String,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Measure prompt processing and generation speed, as llama-bench does.
    ///
    /// Each -p size is a test (pp512: a batch of 512 random tokens from an empty context, in one
    /// evaluation) and each -n length another (tg128: 128 tokens generated one at a time from an
    /// empty context), repeated -r times after one warm-up run, for every -t thread count.
    /// Comma-separated lists give one row per combination. A size of 0 skips that kind of test.
    /// -pg P,N adds a test of P prompt tokens then N generated ones, timed together; -d runs
    /// every test after that many context tokens (evaluated untimed).
    ///
    /// Examples:
    ///   minfer bench MODEL
    ///   minfer bench MODEL -p 128,512 -n 64 -t 1,2 -r 3
    ///   minfer bench -m MODEL -pg 512,128 -d 0,1024 -o csv
    ///   minfer bench MODEL -p 0 -n 128 -o json > tg.json
    #[command(verbatim_doc_comment)]
    Bench(bench::BenchArgs),
    /// Watch a model run: a local page that draws its forward graph and, while it generates
    /// from a prompt typed there, shows each step's node timings and tokens/s live.
    ///
    /// Examples:
    ///   minfer viz MODEL                 (then open http://127.0.0.1:8081)
    ///   minfer viz MODEL --port 9000 -t 4
    #[command(verbatim_doc_comment)]
    Viz {
        /// The GGUF model (a path, a cached name, hf:… or ollama:…).
        model: PathBuf,
        /// Address to listen on (loopback unless told otherwise).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on (0 picks a free one; the address is printed on standard error).
        #[arg(long, default_value_t = 8081)]
        port: u16,
        #[command(flatten)]
        load: LoadArgs,
    },
    /// Serve the model over an OpenAI-compatible HTTP API.
    ///
    /// Endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET /health
    /// (alive), GET /ready (200 only when ready for work), GET /metrics (Prometheus). The port
    /// is bound before the model loads (after a download: an hf: or ollama: model, or a draft
    /// model, is fetched and a draft loaded first). Each slot generates one request at a time with its own
    /// KV cache; requests beyond the slots wait in order (503 beyond --queue-max of them).
    /// SIGINT/SIGTERM: /ready turns 503, the listener closes (after --drain-delay), in-flight
    /// requests finish (at most --shutdown-timeout seconds), then exit 0.
    ///
    /// Examples:
    ///   minfer serve MODEL
    ///   minfer serve MODEL --host 0.0.0.0 --port 8080 --n-slots 4 --api-key secret
    #[command(verbatim_doc_comment, version)]
    Serve(Box<serve::ServeArgs>),
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // A bad MINFER_KERNEL is refused by name before anything loads.
    minfer::quant::choice::check_env()?;
    if let Some(path) = &cli.trace {
        minfer::engine::trace::trace_to(path).with_context(|| format!("--trace: cannot create {}", path.display()))?;
    }
    let result = run_command(cli);
    if let Some((path, failure)) = minfer::engine::trace::trace_status() {
        match failure {
            Some(e) => eprintln!("error: the trace {} is incomplete: {e}", path.display()),
            None => eprintln!("trace written to {}", path.display()),
        }
    }
    result
}

fn run_command(cli: Cli) -> anyhow::Result<()> {
    let Some(command) = cli.command else {
        return run_generate(cli.run);
    };
    match command {
        Command::Pull { reference } => {
            let path = crate::cli::pull::pull(&reference)?;
            write_stdout(&format!("{}\n", path.display()))?;
        }
        Command::List => write_stdout(&crate::cli::pull::list()?)?,
        Command::Imatrix {
            model,
            file,
            output,
            ctx_size,
            chunks,
            process_output,
            threads,
        } => {
            let cmd = crate::cli::imatrix::ImatrixCommand {
                model: &model,
                text: &file,
                output: &output,
                n_ctx: ctx_size,
                max_chunks: chunks,
                process_output,
                n_threads: threads.unwrap_or_else(minfer::engine::default_threads),
            };
            crate::cli::imatrix::imatrix(&cmd, &mut std::io::stderr().lock())?;
        }
        Command::Quantize {
            input,
            output,
            ggml_type,
            pure,
            imatrix,
            include_weights,
            exclude_weights,
            threads,
        } => {
            let n_threads = threads.unwrap_or_else(minfer::engine::default_threads);
            let imatrix = crate::cli::quantize::ImatrixArgs {
                file: imatrix,
                include: include_weights,
                exclude: exclude_weights,
            };
            crate::cli::quantize::quantize(
                &input,
                &output,
                &ggml_type,
                pure,
                &imatrix,
                n_threads,
                &mut std::io::stderr().lock(),
            )
            .with_context(|| format!("cannot quantize {} to {ggml_type}", input.display()))?;
        }
        Command::Split {
            input,
            out_prefix,
            split_max_tensors,
            split_max_size,
            no_tensor_first_split,
        } => {
            let limit = match split_max_size {
                Some(size) => SplitLimit::MaxBytes(crate::cli::split::parse_size(&size)?),
                None => SplitLimit::MaxTensors(split_max_tensors.unwrap_or(128)),
            };
            crate::cli::split::split(
                &input,
                &out_prefix,
                limit,
                no_tensor_first_split,
                &mut std::io::stderr().lock(),
            )
            .with_context(|| format!("cannot split {}", input.display()))?;
        }
        Command::Merge { part, output } => {
            crate::cli::split::merge(&part, &output, &mut std::io::stderr().lock())
                .with_context(|| format!("cannot merge {} into {}", part.display(), output.display()))?;
        }
        Command::Info { model, tensors } => {
            let file = open_model(&model)?;
            let mut text = crate::cli::info::render(&file, tensors);
            // Whether minfer can run it: the architecture, its keys and tensors, their types.
            if let Err(e) = minfer::models::load_model(&file) {
                text += &format!("\nminfer cannot run this file: {e}\n");
            }
            // Where it would run: every backend of this build, as this machine offers it.
            text.push('\n');
            for entry in minfer::graph::registry::entries().iter().filter(|e| e.compiled) {
                text += &format!(
                    "backend {:<6} = {}\n",
                    entry.name,
                    minfer::backends::describe(entry.handle)
                );
            }
            write_stdout(&text)?;
        }
        Command::Tokenize {
            model,
            text,
            file,
            ids,
            no_special,
            no_bos,
        } => {
            let gguf = open_model(&model)?;
            let tokenizer = Tokenizer::from_metadata(gguf.metadata())
                .with_context(|| format!("cannot build the tokenizer of {}", model.display()))?;
            let bytes = match (text, file) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(file)) => read_text_arg(&file)?,
                (None, None) => unreachable!("clap requires TEXT or --file"),
            };
            let tokens = tokenizer.encode_bytes(&bytes, !no_bos, !no_special);
            let out = if ids {
                crate::cli::tokenize::ids_json(&tokens) + "\n"
            } else {
                crate::cli::tokenize::pieces_table(&tokenizer, &tokens)
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
        Command::Eval {
            model,
            text,
            top,
            out,
            load,
        } => {
            let mut loaded = crate::cli::run::load(&model_path(&model)?, &load.options()?)?;
            let logits = crate::cli::run::eval_last_logits(&mut loaded, &text)?;
            if let Some(path) = out {
                let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
            }
            write_stdout(&format!("{}\n", crate::cli::run::top_logits_json(&logits, top)))?;
        }
        Command::Embed {
            model,
            texts,
            file,
            pooling,
            embd_normalize,
            embd_output_format,
            load,
        } => {
            use crate::cli::embed;
            let format = embed::OutputFormat::parse(&embd_output_format)?;
            let pooling = pooling
                .map(|p| {
                    minfer::models::pooling::Pooling::parse(&p)
                        .ok_or_else(|| anyhow::anyhow!("--pooling {p}: expected none, mean, cls, last or rank"))
                })
                .transpose()?;
            let normalize = minfer::engine::Normalize::new(embd_normalize).context("--embd-normalize")?;
            let file = file.map(|f| read_text_arg(&f)).transpose()?;
            let inputs = embed::inputs(&texts, file.as_deref())?;
            let options = load.options()?;
            let model = minfer::engine::Model::load(model_path(&model)?, &options.model)?;
            let n_batch = options.session.n_ubatch.unwrap_or(2048);
            let kv_types = (options.session.type_k, options.session.type_v);
            let vectors = embed::embed(&model, &inputs, pooling, normalize, n_batch, kv_types)?;
            write_stdout(&embed::render(&vectors, format))?;
        }
        Command::Bench(args) => bench::run(args)?,
        Command::Viz {
            model,
            host,
            port,
            load,
        } => {
            let options = load.options()?;
            minfer::viz::serve(minfer::viz::VizConfig {
                model: model_path(&model)?,
                host,
                port,
                options: options.model,
                session: options.session,
            })?
        }
        Command::Serve(args) => serve::run(*args)?,
    }
    Ok(())
}

/// The error and its causes on one line, each cause once: a library error often names its
/// cause in its own message too, and anyhow's `{:#}` would repeat it.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
    }
    line
}

/// `text` on standard output. A reader that went away (`minfer info M | head`) ends the command
/// quietly, as a command stopped by SIGPIPE would, instead of the panic of `println!`.
fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        result => Ok(result?),
    }
}

fn main() -> ExitCode {
    // Mesa's Vulkan device-selection layer, which the GPU probe of every model load goes
    // through, connects to a Wayland display to order the devices and, with no session
    // (XDG_RUNTIME_DIR unset: a server, a container, CI), prints an "error:" line for nothing:
    // minfer orders the adapters itself. Set while the process has one thread.
    if std::env::var_os("XDG_RUNTIME_DIR").is_none() && std::env::var_os("NODEVICE_SELECT").is_none() {
        std::env::set_var("NODEVICE_SELECT", "1");
    }
    let command = <Cli as clap::CommandFactory>::command();
    let subcommands: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
    let mut raw: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Ollama's habit, `minfer run NAME [PROMPT]`: a run of NAME, and a conversation when no
    // prompt is given (unless a file named `run` is what was meant).
    let ollama_run = raw.get(1).is_some_and(|a| a == "run") && !std::path::Path::new("run").exists();
    if ollama_run {
        raw.remove(1);
    }
    let args = match crate::cli::llama_flags::expand(raw, &subcommands) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cli = Cli::parse_from(args);
    if ollama_run && cli.command.is_none() {
        let r = &mut cli.run;
        r.cnv |= r.prompt.is_none() && r.prompt_flag.is_none() && r.prompt_file.is_none();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
