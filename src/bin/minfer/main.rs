//! The `minfer` binary: parses flags, calls the library, maps errors to exit codes.

use anyhow::Context;
use clap::{Parser, Subcommand};
use minfer::gguf::split::SplitLimit;
use minfer::gguf::GgufFile;
use minfer::tokenizer::Tokenizer;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

mod bench;
mod generate;

use bench::{bench_grammar, bench_model, run_bench};
use generate::*;

#[derive(Parser)]
#[command(
    name = "minfer",
    version,
    about = "A pure-Rust LLM inference engine for GGUF models",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  minfer model.gguf 'Write a haiku about Rust'\n  echo 'def fib(n):' | minfer model.gguf --no-template --greedy -n 64\n  minfer info model.gguf --tensors\n  minfer bench model.gguf -p 512 -n 128 -t 1,2\n  minfer serve model.gguf --port 8080\n  minfer hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:Q4_K_M 'Write a haiku about Rust'\n  minfer pull ollama:qwen2.5-coder:0.5b\n\nMODEL is a GGUF file, a file name in the model cache ($MINFER_MODELS, default\n~/.cache/minfer/models), hf:OWNER/REPO[:QUANT] or ollama:NAME[:TAG]; a reference the cache\nlacks is fetched into it first."
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

/// Generate text: `minfer MODEL [PROMPT]`.
#[derive(clap::Args)]
struct RunArgs {
    /// The model: a GGUF file, a name in the model cache, hf:OWNER/REPO[:QUANT] or
    /// ollama:NAME[:TAG].
    model: Option<PathBuf>,
    /// The prompt, sent as one user turn through the model's chat template (standard input if
    /// absent).
    prompt: Option<String>,
    /// The GGUF model file (llama.cpp's -m; the same as giving it first).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    model_flag: Option<PathBuf>,
    /// The prompt (llama.cpp's -p; the same as giving it after the model).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with = "prompt_file")]
    prompt_flag: Option<String>,
    /// Read the prompt from FILE (llama.cpp's -f; '-' for standard input).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// Process escapes (\n, \t, \\, \", \', \xHH) in the prompt and the stop strings, as
    /// llama.cpp's -e does.
    #[arg(short = 'e', long)]
    escape: bool,
    /// Send the prompt as raw text, without the chat template.
    #[arg(long)]
    no_template: bool,
    /// Most tokens to generate (per reply with --cnv); -1: no limit (with context shifting,
    /// until stopped); -2: until the context is full.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// When the context fills, keep this many tokens from its start and discard half of the
    /// rest (-1: the whole prompt). Default: 0, or the system prompt with --cnv.
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    keep: Option<i64>,
    /// Stop with an error when the context is full, instead of shifting it.
    #[arg(long)]
    no_context_shift: bool,
    /// A conversation in the terminal (llama.cpp's -cnv): type a turn, read the reply, go on.
    #[arg(long, alias = "conversation", conflicts_with_all = ["prompt", "no_template"])]
    cnv: bool,
    /// Save the session (tokens and KV cache) to FILE after the prompt is read (after each
    /// turn with --cnv), and start from it when it exists: a prompt sharing its prefix
    /// prefills only the rest (llama.cpp's --prompt-cache).
    #[arg(long, alias = "prompt-cache", value_name = "FILE")]
    session: Option<PathBuf>,
    /// The system prompt of the conversation (llama.cpp's -sys).
    #[arg(long, value_name = "TEXT", requires = "cnv")]
    system_prompt: Option<String>,
    /// Stop before this text (repeatable; matched across token boundaries; llama.cpp's -r).
    #[arg(short = 'r', long = "stop", alias = "reverse-prompt", value_name = "STR")]
    stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Colour the generated text (ANSI), to tell it from the prompt and the user's turns.
    #[arg(long)]
    color: bool,
    /// Print nothing on standard error but errors: no timing line, no drawn seed.
    #[arg(long)]
    log_disable: bool,
    /// Constrain the output to a JSON schema (llama.cpp's -j), given inline: only text that
    /// validates can be generated.
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA")]
    json_schema: Option<String>,
    /// Constrain the output to the JSON schema in FILE (llama.cpp's -jf).
    #[arg(long = "json-schema-file", visible_alias = "jf", value_name = "FILE")]
    json_schema_file: Option<PathBuf>,
    /// Constrain the output to one JSON object (OpenAI's json_object mode).
    #[arg(long)]
    json: bool,
    /// Constrain the output to a GBNF grammar (llama.cpp's format), given inline.
    #[arg(long, value_name = "GRAMMAR")]
    grammar: Option<String>,
    #[command(flatten)]
    draft: minfer::cli::draft::DraftArgs,
    /// Constrain the output to the GBNF grammar in FILE.
    #[arg(long, value_name = "FILE")]
    grammar_file: Option<PathBuf>,
    #[command(flatten)]
    load: LoadArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Write the graph the run uses as Graphviz DOT, then exit.
    #[arg(long, value_name = "FILE")]
    dump_graph: Option<PathBuf>,
    /// Write the graph the run uses as JSON (the visualizer's schema), then exit.
    #[arg(long, value_name = "FILE")]
    dump_graph_json: Option<PathBuf>,
}

#[derive(clap::Args, Clone)]
struct LoadArgs {
    /// Context size in tokens (clamped to the model's maximum; llama.cpp's -c).
    #[arg(short = 'c', long = "n-ctx", alias = "ctx-size", default_value_t = 4096)]
    n_ctx: usize,
    /// Threads (default: the number of physical cores).
    #[arg(short = 't', long = "threads")]
    threads: Option<usize>,
    /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Most prompt tokens one forward pass reads (llama.cpp's -b); the prompt is read in passes
    /// of the smaller of this and --ubatch-size. The logits do not depend on it.
    #[arg(short = 'b', long = "batch-size", value_name = "N")]
    batch_size: Option<usize>,
    /// Most prompt tokens one forward pass reads (llama.cpp's -ub; default 512).
    #[arg(long = "ubatch-size", value_name = "N")]
    ubatch_size: Option<usize>,
    #[command(flatten)]
    cache: CacheArgs,
    #[command(flatten)]
    compat: AccelArgs,
    #[command(flatten)]
    file: ModelFileArgs,
}

/// How the model file is read and which chat template it is used with.
#[derive(clap::Args, Clone)]
struct ModelFileArgs {
    /// Read the model into memory instead of mapping it (llama.cpp's --no-mmap).
    #[arg(long)]
    no_mmap: bool,
    /// Lock the model's pages in memory so that they are never swapped out or dropped
    /// (llama.cpp's --mlock); refused with the reason when the system does not allow it.
    #[arg(long)]
    mlock: bool,
    /// Use the Jinja chat template in FILE instead of the model's own.
    #[arg(long, value_name = "FILE")]
    chat_template_file: Option<PathBuf>,
    /// llama.cpp's switch to its Jinja template engine: minfer always renders the model's
    /// template with Jinja, so this is accepted and changes nothing.
    #[arg(long)]
    jinja: bool,
}

impl ModelFileArgs {
    fn open_options(&self) -> minfer::gguf::OpenOptions {
        minfer::gguf::OpenOptions {
            no_mmap: self.no_mmap,
            mlock: self.mlock,
        }
    }

    /// The text of --chat-template-file, if given.
    fn chat_template(&self) -> anyhow::Result<Option<String>> {
        self.chat_template_file
            .as_ref()
            .map(|path| {
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read the chat template {}", path.display()))
            })
            .transpose()
    }
}

/// llama.cpp's accelerator flags: accepted where minfer does what they ask, refused by name
/// where it cannot.
#[derive(clap::Args, Clone)]
struct AccelArgs {
    /// Flash attention (llama.cpp's -fa): on, off, auto, 1 or 0. minfer's attention is always
    /// the fused, flash-style kernel, so off is refused.
    #[arg(long = "flash-attn", value_name = "on|off|auto")]
    flash_attn: Option<String>,
    /// Layers on the GPU (llama.cpp's -ngl): the last N, the output head too when N exceeds the
    /// layer count; 0 runs everything on the CPU; without it every layer runs on a usable GPU.
    /// `bench` takes a comma-separated list.
    #[arg(
        long = "n-gpu-layers",
        value_name = "N",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    n_gpu_layers: Vec<i64>,
}

impl AccelArgs {
    /// Refuses a flash-attention setting that cannot be honoured, naming the flag.
    fn check_flash_attn(&self) -> anyhow::Result<()> {
        if let Some(fa) = &self.flash_attn {
            match fa.to_ascii_lowercase().as_str() {
                "on" | "auto" | "1" | "true" => {}
                "off" | "0" | "false" => anyhow::bail!(
                    "-fa {fa} cannot be honoured: minfer's attention is always the fused (flash-style) kernel"
                ),
                _ => anyhow::bail!("-fa {fa}: expected on, off, auto, 1 or 0"),
            }
        }
        Ok(())
    }

    /// The backend fence and the offloaded layers the flags ask for, as llama.cpp reads
    /// `-ngl`: 0 keeps every layer on the CPU, N runs the last N layers on the GPU (the output
    /// head too when N exceeds the layer count), and no flag runs all of them there. N above 0
    /// without a usable GPU is refused with the reason.
    fn placement(&self, backend: Option<String>) -> anyhow::Result<(Option<String>, Option<usize>)> {
        if self.n_gpu_layers.len() > 1 {
            anyhow::bail!("-ngl takes one layer count here (only `bench` without --npl takes a list)");
        }
        let (fence, list) = self.placements(backend)?;
        Ok((fence, list[0]))
    }

    /// [`AccelArgs::placement`] for every value of an `-ngl` list (`bench`): the fence, and the
    /// offload of each run (`[None]` without the flag).
    fn placements(&self, backend: Option<String>) -> anyhow::Result<(Option<String>, Vec<Option<usize>>)> {
        self.check_flash_attn()?;
        if self.n_gpu_layers.is_empty() {
            return Ok((backend, vec![None]));
        }
        let mut list = Vec::new();
        for &n in &self.n_gpu_layers {
            let n = usize::try_from(n)
                .map_err(|_| anyhow::anyhow!("-ngl {n} is out of range: give a layer count of 0 or more"))?;
            if n > 0 {
                if let Err(why) = minfer::backends::probe(minfer::graph::Backend::CUDA) {
                    anyhow::bail!(
                        "-ngl {n} asks for GPU layers, and no GPU backend is usable here ({why}); \
                         give -ngl 0 or leave it out"
                    );
                }
            }
            list.push(Some(n));
        }
        // Only -ngl 0, and no fence: the CPU alone.
        if backend.is_none() && list.iter().all(|n| *n == Some(0)) {
            return Ok((Some("cpu".into()), vec![None; list.len()]));
        }
        Ok((backend, list))
    }
}

/// How the KV cache stores K and V.
#[derive(clap::Args, Clone)]
struct CacheArgs {
    /// How the KV cache stores K: f32, f16 or q8_0 (llama.cpp's -ctk).
    #[arg(long, default_value = "f16", value_parser = minfer::graph::DType::kv_cache_type)]
    cache_type_k: minfer::graph::DType,
    /// How the KV cache stores V: f32, f16 or q8_0 (llama.cpp's -ctv).
    #[arg(long, default_value = "f16", value_parser = minfer::graph::DType::kv_cache_type)]
    cache_type_v: minfer::graph::DType,
}

impl LoadArgs {
    fn options(&self) -> anyhow::Result<minfer::cli::run::LoadOptions> {
        anyhow::ensure!(self.n_ctx >= 1, "--n-ctx 0 is out of range: it must be at least 1");
        let (backend, n_gpu_layers) = self.compat.placement(self.backend.clone())?;
        for (flag, n) in [("--batch-size", self.batch_size), ("--ubatch-size", self.ubatch_size)] {
            anyhow::ensure!(n != Some(0), "{flag} 0 is out of range: it must be at least 1");
        }
        Ok(minfer::cli::run::LoadOptions {
            n_ctx: self.n_ctx,
            n_threads: self.threads,
            backend,
            n_gpu_layers,
            kv_types: (self.cache.cache_type_k, self.cache.cache_type_v),
            open: self.file.open_options(),
            chat_template: self.file.chat_template()?,
            n_ubatch: match (self.batch_size, self.ubatch_size) {
                (None, None) => None,
                (b, ub) => Some(b.unwrap_or(usize::MAX).min(ub.unwrap_or(usize::MAX))),
            },
        })
    }
}

#[derive(clap::Args)]
struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    temperature: f32,
    /// Keep the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95)]
    top_p: f32,
    /// Keep the tokens whose probability is at least P times the best one's (0 = off).
    #[arg(long, default_value_t = 0.05)]
    min_p: f32,
    /// Penalise repeating the last --repeat-last-n tokens.
    #[arg(long, default_value_t = 1.1)]
    repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Tokens of history the penalties look at.
    #[arg(long, default_value_t = 64)]
    repeat_last_n: usize,
    /// Random seed; -1 (the default) draws one, printed on stderr so that the run can be
    /// repeated.
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    seed: i64,
    /// Always pick the most likely token (same as --temp 0, without penalties).
    #[arg(long)]
    greedy: bool,
    /// Locally typical sampling, parameter p (1.0 = off).
    #[arg(long = "typical", visible_alias = "typical-p", default_value_t = 1.0)]
    typical_p: f32,
    /// Keep the tokens within N standard deviations of the best logit (-1 = off).
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true)]
    top_n_sigma: f32,
    /// XTC's chance of removing the most likely tokens (0 = off).
    #[arg(long, default_value_t = 0.0)]
    xtc_probability: f32,
    /// XTC removes the tokens at least this likely but the least likely of them (above 0.5 = off).
    #[arg(long, default_value_t = 0.1)]
    xtc_threshold: f32,
    /// DRY repetition penalty multiplier (0 = off).
    #[arg(long, default_value_t = 0.0)]
    dry_multiplier: f32,
    /// DRY base: the penalty is multiplier * base^(repeat length - allowed length).
    #[arg(long, default_value_t = 1.75)]
    dry_base: f32,
    /// Repeats up to this many tokens go unpenalised by DRY.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    dry_allowed_length: i64,
    /// Tokens of history DRY scans (-1 = the whole context, 0 = off).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    dry_penalty_last_n: i64,
    /// A DRY sequence breaker; repeat the flag for several. The first one given replaces the
    /// defaults ("\n", ":", "\"", "*"); "none" clears them.
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    dry_sequence_breakers: Vec<String>,
    /// Mirostat sampling: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (top-k, top-p, typical and the
    /// other samplers are then not used).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    mirostat: i64,
    /// Mirostat learning rate, parameter eta.
    #[arg(long, default_value_t = 0.1)]
    mirostat_lr: f32,
    /// Mirostat target entropy, parameter tau.
    #[arg(long, default_value_t = 5.0)]
    mirostat_ent: f32,
    /// The samplers to run, in order, separated by ';' (llama.cpp's names; default:
    /// penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature).
    #[arg(long, value_name = "LIST")]
    samplers: Option<String>,
}

impl SamplingArgs {
    /// `--seed`: -1 draws one (which [`Self::say_drawn_seed`] reports once the model has
    /// loaded, so that the run can be repeated).
    fn seed(&self) -> anyhow::Result<u64> {
        match self.seed {
            -1 => {
                use std::hash::{BuildHasher, Hasher};
                Ok(std::collections::hash_map::RandomState::new().build_hasher().finish() >> 1)
            }
            n => u64::try_from(n)
                .map_err(|_| anyhow::anyhow!("--seed {n} is out of range: it must be -1 (draw one) or 0 or more")),
        }
    }

    /// The drawn seed on stderr, where one was drawn and sampling uses it.
    fn say_drawn_seed(&self, params: &minfer::sampling::SamplingParams) {
        if self.seed == -1 && !self.greedy && params.temperature > 0.0 {
            eprintln!("seed: {0} (drawn; --seed {0} repeats this run)", params.seed);
        }
    }

    fn params(&self) -> anyhow::Result<minfer::sampling::SamplingParams> {
        anyhow::ensure!(
            self.top_k >= 0,
            "--top-k {} is out of range: it must be 0 (off) or more",
            self.top_k
        );
        if self.greedy {
            return Ok(minfer::sampling::SamplingParams::greedy());
        }
        let defaults = minfer::sampling::SamplingParams::default();
        let mirostat = minfer::sampling::Mirostat::from_number(self.mirostat).ok_or_else(|| {
            anyhow::anyhow!(
                "--mirostat {} is out of range: it must be 0 (off), 1 or 2",
                self.mirostat
            )
        })?;
        let dry_allowed_length = usize::try_from(self.dry_allowed_length).map_err(|_| {
            anyhow::anyhow!(
                "--dry-allowed-length {} is out of range: it must be 0 or more",
                self.dry_allowed_length
            )
        })?;
        let dry_penalty_last_n = match self.dry_penalty_last_n {
            -1 => usize::MAX,
            n => usize::try_from(n).map_err(|_| {
                anyhow::anyhow!(
                    "--dry-penalty-last-n {n} is out of range: it must be -1 (the whole context), 0 (off) or more"
                )
            })?,
        };
        let dry_sequence_breakers = if self.dry_sequence_breakers.is_empty() {
            defaults.dry_sequence_breakers
        } else {
            // As in llama.cpp, "none" clears what came before it.
            let mut breakers = Vec::new();
            for b in &self.dry_sequence_breakers {
                if b == "none" {
                    breakers.clear();
                } else {
                    breakers.push(b.clone());
                }
            }
            breakers
        };
        let samplers = match &self.samplers {
            None => defaults.samplers,
            Some(list) => minfer::sampling::SamplerKind::parse_list(list)
                .map_err(|e| anyhow::anyhow!("--samplers '{list}' is invalid: {e}"))?,
        };
        let params = minfer::sampling::SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_last_n: self.repeat_last_n,
            seed: self.seed()?,
            typical_p: self.typical_p,
            top_n_sigma: self.top_n_sigma,
            xtc_probability: self.xtc_probability,
            xtc_threshold: self.xtc_threshold,
            dry_multiplier: self.dry_multiplier,
            dry_base: self.dry_base,
            dry_allowed_length,
            dry_penalty_last_n,
            dry_sequence_breakers,
            mirostat,
            mirostat_tau: self.mirostat_ent,
            mirostat_eta: self.mirostat_lr,
            samplers,
            logit_bias: Vec::new(),
        };
        params.validate().map_err(|e| anyhow::anyhow!("{}", flag_error(&e)))?;
        Ok(params)
    }
}

/// A parameter error under the command-line flag that sets the field, so that the message
/// names what the user typed.
fn flag_error(e: &minfer::sampling::SamplingError) -> String {
    let minfer::sampling::SamplingError::InvalidParameter { name, value, expected } = e else {
        return e.to_string();
    };
    let flag = match *name {
        "temperature" => "--temp",
        "top_p" => "--top-p",
        "min_p" => "--min-p",
        "repeat_penalty" => "--repeat-penalty",
        "frequency_penalty" => "--frequency-penalty",
        "presence_penalty" => "--presence-penalty",
        "typical_p" => "--typical",
        "top_n_sigma" => "--top-n-sigma",
        "xtc_probability" => "--xtc-probability",
        "xtc_threshold" => "--xtc-threshold",
        "dry_multiplier" => "--dry-multiplier",
        "dry_base" => "--dry-base",
        "mirostat_tau" => "--mirostat-ent",
        "mirostat_eta" => "--mirostat-lr",
        _ => return e.to_string(),
    };
    format!("{flag} {value} is out of range: it {expected}")
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
    Bench {
        /// The GGUF model file (or -m FILE).
        #[arg(required_unless_present = "model_flag")]
        model: Option<PathBuf>,
        /// The GGUF model file, as llama-bench takes it.
        #[arg(short = 'm', long = "model", value_name = "FILE", conflicts_with = "model")]
        model_flag: Option<PathBuf>,
        /// A prompt-then-generation test, P prompt tokens then N generated ones, timed together
        /// (`ppP+tgN`; repeatable).
        #[arg(long = "pg", value_name = "P,N", value_parser = parse_pg)]
        pg: Vec<(usize, usize)>,
        /// Context depths (comma-separated): each test runs after this many tokens were
        /// evaluated, untimed (`pp512 @ d1024`).
        #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
        n_depth: Vec<usize>,
        /// Most prompt tokens one forward pass reads (llama-bench's -b); prompts are read in
        /// passes of the smaller of this and --ubatch-size.
        #[arg(short = 'b', long = "batch-size", value_name = "N", default_value_t = 2048)]
        batch_size: usize,
        /// Prompt tokens per forward pass (llama-bench's -ub).
        #[arg(long = "ubatch-size", value_name = "N", default_value_t = 512)]
        ubatch_size: usize,
        /// Prompt sizes in tokens (comma-separated).
        #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
        n_prompt: Vec<usize>,
        /// Generation lengths in tokens (comma-separated).
        #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
        n_gen: Vec<usize>,
        /// Thread counts (comma-separated; default: the number of physical cores).
        #[arg(short = 't', long = "threads", value_delimiter = ',')]
        threads: Vec<usize>,
        /// Timed repetitions of each test, after one warm-up run.
        #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
        repetitions: usize,
        /// Also measure the memory read bandwidth at each thread count and report generation as
        /// a fraction of the rate it allows (weights read per token / bandwidth).
        #[arg(long)]
        bandwidth: bool,
        /// Also measure what handing one node to the CPU thread pool costs at each thread count
        /// (a pool run of an empty job, back to back and after a pause).
        #[arg(long)]
        handoff: bool,
        /// Also time every node of the timed runs and print where each test's time went: by op
        /// kind, weight matrix (with GB/s and GFLOP/s) and layer (in the JSON as `profile`).
        #[arg(long)]
        profile: bool,
        /// Measure what a JSON schema's constraint costs: each generation test runs twice, its
        /// tokens sampled without and then with the schema's mask (instead of random tokens).
        #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA")]
        json_schema: Option<String>,
        /// As --json-schema, for a GBNF grammar.
        #[arg(long, value_name = "GRAMMAR", conflicts_with = "json_schema")]
        grammar: Option<String>,
        /// Output format: a markdown table, llama-bench's JSON array, JSON lines (one object per
        /// test, as each ends), or CSV with the JSON's field names as the header.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = BenchFormat::Md)]
        output: BenchFormat,
        /// Parallel sequence counts (comma-separated): llama-batched-bench's measurement, each of
        /// -p prompt tokens and -n generated tokens, all sequences in one batch per step.
        #[arg(long = "npl", value_delimiter = ',')]
        n_parallel: Vec<usize>,
        /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
        #[arg(long, value_name = "NAME")]
        backend: Option<String>,
        #[command(flatten)]
        compat: AccelArgs,
    },
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
    #[command(verbatim_doc_comment)]
    Serve {
        /// The GGUF model file.
        model: PathBuf,
        /// Address to listen on (loopback unless told otherwise).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        /// Port to listen on (0 picks a free one; the address is printed on standard error).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Concurrent generations, each with its own KV cache of --n-ctx tokens.
        #[arg(long = "n-slots", default_value_t = 4)]
        n_slots: usize,
        /// Context size of each slot in tokens (clamped to the model's maximum; llama.cpp's -c).
        #[arg(short = 'c', long = "n-ctx", alias = "ctx-size", default_value_t = 4096)]
        n_ctx: usize,
        /// CPU threads, shared by every slot: a request alone runs on all of them (default: the
        /// physical cores).
        #[arg(short = 't', long = "threads")]
        threads: Option<usize>,
        /// Require this key as 'Authorization: Bearer KEY' (also MINFER_API_KEY).
        #[arg(long, env = "MINFER_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Largest request body accepted, in bytes (larger ones get 413).
        #[arg(long, default_value_t = minfer::server::DEFAULT_MAX_BODY_BYTES)]
        max_body_bytes: usize,
        /// Seconds in-flight requests may run after SIGINT/SIGTERM (once the listener is
        /// closed) before they are cancelled.
        #[arg(long, default_value_t = 10.0)]
        shutdown_timeout: f64,
        /// Seconds after SIGINT/SIGTERM during which /ready answers 503 but connections are
        /// still accepted and served, for balancers that poll /ready; then the listener closes.
        #[arg(long, default_value_t = 0.0)]
        drain_delay: f64,
        /// Requests that may wait for a slot while all are busy; more are answered 503 with
        /// Retry-After, and /ready answers 503 while the queue is full. Default: no bound
        /// (beyond --max-connections).
        #[arg(long, value_name = "N")]
        queue_max: Option<usize>,
        /// Seconds a connection may take to send a request's headers, idle keep-alive time
        /// included; slower connections are closed.
        #[arg(long, default_value_t = minfer::server::DEFAULT_HEADER_TIMEOUT_S)]
        header_timeout: f64,
        /// Seconds a request's body may take to arrive after its headers (slower ones get 408).
        #[arg(long, default_value_t = minfer::server::DEFAULT_BODY_TIMEOUT_S)]
        body_timeout: f64,
        /// Seconds a response write may make no progress (a client that does not read) before
        /// the connection is closed.
        #[arg(long, default_value_t = minfer::server::DEFAULT_WRITE_TIMEOUT_S)]
        write_timeout: f64,
        /// Most connections open at once; further ones wait in the listen backlog.
        #[arg(long, default_value_t = minfer::server::DEFAULT_MAX_CONNECTIONS)]
        max_connections: usize,
        /// Read control-token text in messages (`<|im_start|>`, `<|im_end|>`) as control tokens,
        /// as llama.cpp's server does. By default it stays plain text, so a user cannot forge
        /// a system turn; the template's own markers are control tokens either way.
        #[arg(long)]
        special_in_content: bool,
        #[command(flatten)]
        cache: CacheArgs,
        #[command(flatten)]
        compat: AccelArgs,
        #[command(flatten)]
        file: ModelFileArgs,
        /// Answer GET /slots with each slot's state (llama-server's --slots).
        #[arg(long)]
        slots: bool,
        /// Do not serve the chat page at / (llama-server's --no-webui).
        #[arg(long)]
        no_webui: bool,
        /// llama-server's embeddings mode: refused, as minfer computes no pooled hidden states.
        #[arg(long)]
        embeddings: bool,
        /// Tokens one forward pass takes at most: every generating slot's next token, then
        /// chunks of the prompts being read (llama.cpp's -b; -ub is the same here).
        #[arg(short = 'b', long, alias = "ubatch-size", default_value_t = minfer::server::DEFAULT_BATCH_SIZE)]
        batch_size: usize,
        /// Let browser pages from ORIGIN call the server (repeatable; `*` for any origin). None
        /// by default.
        #[arg(long = "cors-origin", value_name = "ORIGIN")]
        cors_origins: Vec<String>,
        /// A name besides localhost and loopback addresses that a server on loopback without an
        /// API key answers in the Host header (repeatable; `*` for any): a proxy's upstream name.
        #[arg(long = "allowed-host", value_name = "NAME")]
        allowed_hosts: Vec<String>,
        /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
        #[arg(long, value_name = "NAME")]
        backend: Option<String>,
        #[command(flatten)]
        draft: minfer::cli::draft::DraftArgs,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum BenchFormat {
    Md,
    Json,
    Jsonl,
    Csv,
}

/// `-pg P,N`: a prompt size and a generation length.
fn parse_pg(s: &str) -> Result<(usize, usize), String> {
    let (p, n) = s
        .split_once(',')
        .ok_or_else(|| format!("-pg takes PROMPT,GEN (two sizes), got '{s}'"))?;
    let size = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("-pg {s}: '{v}' is not a token count"))
    };
    Ok((size(p)?, size(n)?))
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

/// A model argument as a local file: a cached name or an `hf:`/`ollama:` reference is looked up
/// in the model cache, and fetched into it if it is not there yet.
fn model_path(arg: &Path) -> anyhow::Result<PathBuf> {
    Ok(minfer::cli::pull::resolve_model(arg)?)
}

fn open_model(model: &Path) -> anyhow::Result<GgufFile> {
    let model = &model_path(model)?;
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
            let path = minfer::cli::pull::pull(&reference)?;
            println!("{}", path.display());
        }
        Command::List => print!("{}", minfer::cli::pull::list()?),
        Command::Quantize {
            input,
            output,
            ggml_type,
            pure,
            threads,
        } => {
            let n_threads = threads.unwrap_or_else(minfer::engine::default_threads);
            minfer::cli::quantize::quantize(
                &input,
                &output,
                &ggml_type,
                pure,
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
                Some(size) => SplitLimit::MaxBytes(minfer::cli::split::parse_size(&size)?),
                None => SplitLimit::MaxTensors(split_max_tensors.unwrap_or(128)),
            };
            minfer::cli::split::split(
                &input,
                &out_prefix,
                limit,
                no_tensor_first_split,
                &mut std::io::stderr().lock(),
            )
            .with_context(|| format!("cannot split {}", input.display()))?;
        }
        Command::Merge { part, output } => {
            minfer::cli::split::merge(&part, &output, &mut std::io::stderr().lock())
                .with_context(|| format!("cannot merge {} into {}", part.display(), output.display()))?;
        }
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
        Command::Eval {
            model,
            text,
            top,
            out,
            load,
        } => {
            let mut loaded = minfer::cli::run::load(&model_path(&model)?, &load.options()?)?;
            let logits = minfer::cli::run::eval_last_logits(&mut loaded, &text)?;
            if let Some(path) = out {
                let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
            }
            println!("{}", minfer::cli::run::top_logits_json(&logits, top));
        }
        Command::Bench {
            model,
            model_flag,
            n_prompt,
            n_gen,
            threads,
            n_parallel,
            backend,
            compat,
            ..
        } if !n_parallel.is_empty() => {
            let (backend, n_gpu_layers) = compat.placement(backend)?;
            let model = bench_model(model, model_flag)?;
            anyhow::ensure!(
                threads.len() <= 1,
                "--npl measures one thread count at a time; give -t once"
            );
            let options = minfer::cli::batched_bench::BatchedOptions {
                n_prompt,
                n_gen,
                n_parallel,
                n_threads: threads.first().copied().unwrap_or_else(minfer::engine::default_threads),
                backend,
                n_gpu_layers,
                seed: 1,
            };
            use minfer::cli::batched_bench;
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(batched_bench::markdown_header().as_bytes())?;
            batched_bench::run_batched(&model, &options, |r| {
                stdout.write_all(batched_bench::markdown_row(r).as_bytes())?;
                stdout.flush()
            })?;
        }
        Command::Bench {
            model,
            model_flag,
            pg,
            n_depth,
            batch_size,
            ubatch_size,
            n_prompt,
            n_gen,
            threads,
            repetitions,
            bandwidth,
            handoff,
            profile,
            json_schema,
            grammar,
            output,
            backend,
            compat,
            ..
        } => {
            let (backend, n_gpu_layers) = compat.placements(backend)?;
            anyhow::ensure!(
                batch_size >= 1 && ubatch_size >= 1,
                "-b and -ub must be at least 1 (got {batch_size} and {ubatch_size})"
            );
            run_bench(
                &bench_model(model, model_flag)?,
                n_gpu_layers,
                n_prompt,
                n_gen,
                pg,
                n_depth,
                batch_size.min(ubatch_size),
                threads,
                repetitions,
                bandwidth,
                handoff,
                profile,
                bench_grammar(json_schema, grammar)?,
                output,
                backend,
            )?
        }
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
                n_ctx: options.n_ctx,
                kv_types: options.kv_types,
                options: options.model_options(),
            })?
        }
        Command::Serve {
            model,
            host,
            port,
            n_slots,
            n_ctx,
            threads,
            api_key,
            max_body_bytes,
            shutdown_timeout,
            drain_delay,
            queue_max,
            header_timeout,
            body_timeout,
            write_timeout,
            max_connections,
            special_in_content,
            cache,
            compat,
            file,
            slots,
            no_webui,
            embeddings,
            batch_size,
            cors_origins,
            allowed_hosts,
            backend,
            draft,
        } => {
            let (backend, n_gpu_layers) = compat.placement(backend)?;
            let draft_choice = draft.choice()?;
            anyhow::ensure!(
                !embeddings,
                "--embeddings cannot be honoured: minfer computes no pooled hidden states (/v1/embeddings answers 501)"
            );
            let chat_template = file.chat_template()?;
            for (flag, seconds) in [("--shutdown-timeout", shutdown_timeout), ("--drain-delay", drain_delay)] {
                anyhow::ensure!(
                    seconds.is_finite() && (0.0..1e9).contains(&seconds),
                    "{flag} must be a number of seconds >= 0"
                );
            }
            for (flag, seconds) in [
                ("--header-timeout", header_timeout),
                ("--body-timeout", body_timeout),
                ("--write-timeout", write_timeout),
            ] {
                anyhow::ensure!(
                    seconds.is_finite() && seconds > 0.0 && seconds < 1e9,
                    "{flag} must be a number of seconds above 0"
                );
            }
            // clap reads an empty MINFER_API_KEY as unset; an empty key must be refused as the
            // flag's is, not turn authentication off.
            let api_key = api_key.or_else(|| std::env::var("MINFER_API_KEY").ok());
            // The draft model loads as the model will: same threads, backends and file options.
            let draft = match draft_choice {
                Some(choice) => {
                    let options = minfer::engine::ModelOptions {
                        n_threads: threads,
                        backend: backend.clone(),
                        open: file.open_options(),
                        chat_template: None,
                        // As the CLI's draft: the same split rule (and with -ngl 0, the CPU).
                        n_gpu_layers,
                    };
                    let source = resolve_draft(choice)?
                        .load(&options)
                        .context("cannot load the draft model")?;
                    Some((source, draft.options()))
                }
                None => None,
            };
            minfer::server::serve(minfer::server::ServerConfig {
                model: model_path(&model)?,
                host,
                port,
                n_slots,
                n_ctx,
                n_threads: threads,
                backend,
                n_gpu_layers,
                api_key,
                max_body_bytes,
                shutdown_timeout: std::time::Duration::from_secs_f64(shutdown_timeout),
                drain_delay: std::time::Duration::from_secs_f64(drain_delay),
                queue_max,
                header_timeout: std::time::Duration::from_secs_f64(header_timeout),
                body_timeout: std::time::Duration::from_secs_f64(body_timeout),
                write_timeout: std::time::Duration::from_secs_f64(write_timeout),
                max_connections,
                special_in_content,
                kv_types: (cache.cache_type_k, cache.cache_type_v),
                batch_size,
                cors_origins,
                allowed_hosts,
                open: file.open_options(),
                chat_template,
                slots_endpoint: slots,
                webui: !no_webui,
                draft,
            })?
        }
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

fn main() -> ExitCode {
    let args = match minfer::cli::llama_flags::expand(std::env::args_os()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(Cli::parse_from(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
