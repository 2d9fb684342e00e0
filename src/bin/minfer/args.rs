//! The flags every command shares, as clap types: a run's (`RunArgs`), loading a model and its
//! session (`LoadArgs`, `ModelArgs`, `CacheArgs`), sampling, constraining the output, and the
//! small readers of file arguments. Turning flags into the engine's options happens here, once;
//! what a command does with them is its own file's.

use anyhow::Context;
use minfer::gguf::GgufFile;
use std::io::Read;
use std::path::{Path, PathBuf};

/// `--reasoning-budget`'s value: -1 or more.
pub(crate) fn reasoning_budget(value: &str) -> Result<i64, String> {
    match value.parse::<i64>() {
        Ok(n) if n >= -1 && n <= i32::MAX as i64 => Ok(n),
        _ => Err(format!("'{value}' is not -1 (no limit) or a number of tokens")),
    }
}

/// The budget a `--reasoning-budget` value means: -1 none.
pub(crate) fn budget_tokens(n: i64) -> Option<usize> {
    usize::try_from(n).ok()
}

/// `--reasoning-format`'s value.
pub(crate) fn reasoning_format(name: &str) -> Result<minfer::template::reasoning::ReasoningFormat, String> {
    minfer::template::reasoning::ReasoningFormat::from_name(name)
        .ok_or_else(|| format!("'{name}' is not one of none, deepseek, deepseek-legacy, auto"))
}

/// Generate text: `minfer MODEL [PROMPT]`.
#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The model: a GGUF file, a name in the model cache, hf:OWNER/REPO[:QUANT] or
    /// ollama:NAME[:TAG].
    pub(crate) model: Option<PathBuf>,
    /// The prompt, sent as one user turn through the model's chat template (standard input if
    /// absent).
    pub(crate) prompt: Option<String>,
    /// The GGUF model file (llama.cpp's -m; the same as giving it first).
    #[arg(short = 'm', long = "model", value_name = "FILE")]
    pub(crate) model_flag: Option<PathBuf>,
    /// The prompt (llama.cpp's -p; the same as giving it after the model).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT", conflicts_with = "prompt_file")]
    pub(crate) prompt_flag: Option<String>,
    /// Read the prompt from FILE (llama.cpp's -f; '-' for standard input).
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub(crate) prompt_file: Option<PathBuf>,
    /// Process escapes (\n, \t, \\, \", \', \xHH) in the prompt and the stop strings: the
    /// default, as in llama.cpp (-e); --no-escape turns it off.
    #[arg(short = 'e', long)]
    pub(crate) escape: bool,
    /// Take the prompt and the stop strings as written, backslashes and all.
    #[arg(long, conflicts_with = "escape")]
    pub(crate) no_escape: bool,
    /// Send the prompt as raw text, without the chat template.
    #[arg(long)]
    pub(crate) no_template: bool,
    /// Where a thinking model's reasoning goes (llama.cpp's --reasoning-format): `auto` (the
    /// default) and `deepseek` write it to standard error, dimmed on a terminal, and only the
    /// answer to standard output; `none` and `deepseek-legacy` print the reply as generated.
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = reasoning_format)]
    pub(crate) reasoning_format: minfer::template::reasoning::ReasoningFormat,
    /// Tokens a thinking model may reason before its closing tag is forced (llama.cpp's
    /// --reasoning-budget): -1, the default, no limit; 0: it answers without reasoning.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true, value_parser = reasoning_budget)]
    pub(crate) reasoning_budget: i64,
    /// Text forced before the closing tag when the reasoning budget is spent (llama.cpp's
    /// --reasoning-budget-message).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub(crate) reasoning_budget_message: String,
    /// Most tokens to generate (per reply with --cnv); -1, the default as in llama.cpp: no
    /// limit (until the end of generation, or the context is full; with --context-shift, until
    /// stopped); -2: until the context is full.
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = -1,
        allow_negative_numbers = true
    )]
    pub(crate) n_predict: i64,
    /// When the context fills, keep this many tokens from its start and discard half of the
    /// rest (-1: the whole prompt). Default: 0, or the system prompt with --cnv.
    #[arg(long, allow_negative_numbers = true, value_name = "N")]
    pub(crate) keep: Option<i64>,
    /// When the context fills, shift it (drop the older half past --keep) and go on. Off by
    /// default, as in llama.cpp: a full context ends the generation.
    #[arg(long, overrides_with = "no_context_shift")]
    pub(crate) context_shift: bool,
    /// Stop when the context is full instead of shifting it (the default).
    #[arg(long, overrides_with = "context_shift")]
    pub(crate) no_context_shift: bool,
    /// A conversation in the terminal (llama.cpp's -cnv): type a turn, read the reply, go on. A
    /// prompt given with -p or -f is its first turn.
    #[arg(long, alias = "conversation", conflicts_with_all = ["prompt", "no_template"])]
    pub(crate) cnv: bool,
    /// Never start a conversation, even with no prompt on a terminal (llama.cpp's -no-cnv): the
    /// prompt is read from standard input.
    #[arg(long, alias = "no-conversation", conflicts_with = "cnv")]
    pub(crate) no_cnv: bool,
    /// Answer one turn and exit (llama.cpp's -st): the prompt, or standard input, is answered
    /// once, as with --no-cnv.
    #[arg(long, conflicts_with = "cnv")]
    pub(crate) single_turn: bool,
    /// Save the session (tokens and KV cache) to FILE after the prompt is read (after each
    /// turn with --cnv), and start from it when it exists: a prompt sharing its prefix
    /// prefills only the rest (llama.cpp's --prompt-cache).
    #[arg(long, alias = "prompt-cache", value_name = "FILE")]
    pub(crate) session: Option<PathBuf>,
    /// The system prompt (llama.cpp's -sys): of the conversation with --cnv, else of the one
    /// turn.
    #[arg(long, value_name = "TEXT", conflicts_with = "system_prompt_file")]
    pub(crate) system_prompt: Option<String>,
    /// The system prompt from FILE (llama.cpp's -sysf).
    #[arg(long, value_name = "FILE")]
    pub(crate) system_prompt_file: Option<PathBuf>,
    /// Stop before this text (repeatable; matched across token boundaries; llama.cpp's -r).
    #[arg(short = 'r', long = "stop", alias = "reverse-prompt", value_name = "STR")]
    pub(crate) stop: Vec<String>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// Colour the generated text (ANSI), to tell it from the prompt and the user's turns: on,
    /// off or auto (on when standard output is a terminal; llama.cpp's -co). --color alone is on.
    #[arg(long, value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on")]
    pub(crate) color: Option<String>,
    /// Print control tokens the model generates as their text (llama.cpp's -sp).
    #[arg(long)]
    pub(crate) special: bool,
    /// Print nothing on standard error but errors: no timing line, no drawn seed.
    #[arg(long)]
    pub(crate) log_disable: bool,
    #[command(flatten)]
    pub(crate) grammar: GrammarArgs,
    #[command(flatten)]
    pub(crate) draft: crate::cli::draft::DraftArgs,
    #[command(flatten)]
    pub(crate) load: LoadArgs,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    /// Write the graph the run uses as Graphviz DOT, then exit.
    #[arg(long, value_name = "FILE")]
    pub(crate) dump_graph: Option<PathBuf>,
    /// Write the graph the run uses as JSON (the visualizer's schema), then exit.
    #[arg(long, value_name = "FILE")]
    pub(crate) dump_graph_json: Option<PathBuf>,
}

impl RunArgs {
    /// Whether to colour the generated text: `--color` on, off or auto (a terminal's).
    pub(crate) fn color(&self) -> anyhow::Result<bool> {
        match self.color.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("off" | "0" | "false" | "no") => Ok(false),
            Some("on" | "1" | "true" | "yes") => Ok(true),
            Some("auto") => Ok(std::io::IsTerminal::is_terminal(&std::io::stdout())),
            Some(other) => anyhow::bail!("--color {other}: expected on, off or auto"),
        }
    }
}

/// Loading a model and opening its one session: the model's flags and the session's.
#[derive(clap::Args, Clone)]
pub(crate) struct LoadArgs {
    /// Context size in tokens (clamped to the model's maximum; llama.cpp's -c). 0, the
    /// default: the model's training context, smaller where its KV cache would not fit in
    /// memory beside the weights and 1 GiB (never below 4096), as llama.cpp computes it.
    #[arg(short = 'c', long = "n-ctx", alias = "ctx-size", default_value_t = 0)]
    pub(crate) n_ctx: usize,
    /// Most prompt tokens one forward pass reads (llama.cpp's -b); the prompt is read in passes
    /// of the smaller of this and --ubatch-size. The logits do not depend on it.
    #[arg(short = 'b', long = "batch-size", value_name = "N")]
    pub(crate) batch_size: Option<usize>,
    /// Most prompt tokens one forward pass reads (llama.cpp's -ub; default 512).
    #[arg(long = "ubatch-size", value_name = "N")]
    pub(crate) ubatch_size: Option<usize>,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
    #[command(flatten)]
    pub(crate) model: ModelArgs,
}

/// The model's own flags: threads, backends, `-ngl`, how the file is read, its template.
#[derive(clap::Args, Clone)]
pub(crate) struct ModelArgs {
    /// Threads (default: the number of physical cores; shared by every slot of a server).
    #[arg(short = 't', long = "threads")]
    pub(crate) threads: Option<usize>,
    /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
    #[arg(long, value_name = "NAME")]
    pub(crate) backend: Option<String>,
    #[command(flatten)]
    pub(crate) compat: AccelArgs,
    #[command(flatten)]
    pub(crate) file: ModelFileArgs,
}

impl ModelArgs {
    /// The engine's options for the model, built here once for every command that loads one.
    pub(crate) fn options(&self) -> anyhow::Result<minfer::engine::ModelOptions> {
        self.compat.check_flash_attn()?;
        let compat = AccelArgs {
            backend_given: self.backend.is_some() || std::env::var_os("MINFER_BACKENDS").is_some(),
            ..self.compat.clone()
        };
        Ok(minfer::engine::ModelOptions {
            n_threads: self.threads,
            backend: self.backend.clone(),
            open: self.file.open_options(),
            chat_template: self.file.chat_template()?,
            n_gpu_layers: compat.n_gpu_layers()?,
        })
    }
}

/// The flags that constrain the output (at most one may be given).
#[derive(clap::Args, Clone, Default)]
pub(crate) struct GrammarArgs {
    /// Constrain the output to a JSON schema (llama.cpp's -j), given inline: only text that
    /// validates can be generated.
    #[arg(short = 'j', long = "json-schema", value_name = "SCHEMA")]
    pub(crate) json_schema: Option<String>,
    /// Constrain the output to the JSON schema in FILE (llama.cpp's -jf).
    #[arg(long = "json-schema-file", visible_alias = "jf", value_name = "FILE")]
    pub(crate) json_schema_file: Option<PathBuf>,
    /// Constrain the output to one JSON object (OpenAI's json_object mode).
    #[arg(long)]
    pub(crate) json: bool,
    /// Constrain the output to a GBNF grammar (llama.cpp's format), given inline.
    #[arg(long, value_name = "GRAMMAR")]
    pub(crate) grammar: Option<String>,
    /// Constrain the output to the GBNF grammar in FILE.
    #[arg(long, value_name = "FILE")]
    pub(crate) grammar_file: Option<PathBuf>,
}

impl GrammarArgs {
    /// The grammar the flags ask for, with the flag that gave it; at most one may be given. A
    /// schema that is not JSON, or a GBNF text that does not parse, is an error naming the flag and
    /// the line and column.
    pub(crate) fn spec(&self) -> anyhow::Result<Option<(String, minfer::grammar::GrammarSpec)>> {
        use minfer::grammar::GrammarSpec;
        let text = |file: &Path| -> anyhow::Result<String> {
            String::from_utf8(read_text_arg(file)?).with_context(|| format!("{} is not UTF-8", file.display()))
        };
        let schema = |flag: &str, text: &str| -> anyhow::Result<GrammarSpec> {
            let value: serde_json::Value = serde_json::from_str(text).with_context(|| format!("{flag} is not JSON"))?;
            anyhow::ensure!(
                value.is_object() || value.is_boolean(),
                "{flag} must be a JSON Schema: an object (or true/false), not {value}"
            );
            Ok(GrammarSpec::JsonSchema(value))
        };
        let gbnf = |flag: &str, text: String| -> anyhow::Result<GrammarSpec> {
            // Parsed now, for the error to come before the model loads; compiled after.
            minfer::grammar::gbnf::to_lark(&text).with_context(|| format!("{flag} does not parse"))?;
            Ok(GrammarSpec::Gbnf(text))
        };
        let mut given = Vec::new();
        if let Some(s) = &self.json_schema {
            given.push(("--json-schema".to_string(), schema("--json-schema", s)?));
        }
        if let Some(f) = &self.json_schema_file {
            let flag = format!("--json-schema-file {}", f.display());
            given.push((flag.clone(), schema(&flag, &text(f)?)?));
        }
        if self.json {
            given.push(("--json".to_string(), GrammarSpec::JsonObject));
        }
        if let Some(g) = &self.grammar {
            given.push(("--grammar".to_string(), gbnf("--grammar", g.clone())?));
        }
        if let Some(f) = &self.grammar_file {
            let flag = format!("--grammar-file {}", f.display());
            given.push((flag.clone(), gbnf(&flag, text(f)?)?));
        }
        anyhow::ensure!(
            given.len() <= 1,
            "{} and {} both constrain the output: give one",
            given.first().map_or("", |g| g.0.as_str()),
            given.get(1).map_or("", |g| g.0.as_str())
        );
        Ok(given.pop())
    }
}

/// How the model file is read and which chat template it is used with.
#[derive(clap::Args, Clone)]
pub(crate) struct ModelFileArgs {
    /// Read the model into memory instead of mapping it (llama.cpp's --no-mmap).
    #[arg(long)]
    pub(crate) no_mmap: bool,
    /// Lock the model's pages in memory so that they are never swapped out or dropped
    /// (llama.cpp's --mlock); refused with the reason when the system does not allow it.
    #[arg(long)]
    pub(crate) mlock: bool,
    /// Use the Jinja chat template in FILE instead of the model's own.
    #[arg(long, value_name = "FILE", conflicts_with = "chat_template")]
    pub(crate) chat_template_file: Option<PathBuf>,
    /// Use this chat template instead of the model's own: Jinja text, or the name of one of
    /// llama.cpp's built-in templates (chatml, llama3, gemma, mistral-v7, …), as llama.cpp's
    /// --chat-template takes.
    #[arg(long, value_name = "JINJA")]
    pub(crate) chat_template: Option<String>,
    /// llama.cpp's switch to its Jinja template engine: minfer always renders the model's
    /// template with Jinja, so this is accepted and changes nothing.
    #[arg(long)]
    pub(crate) jinja: bool,
}

impl ModelFileArgs {
    pub(crate) fn open_options(&self) -> minfer::gguf::OpenOptions {
        minfer::gguf::OpenOptions {
            no_mmap: self.no_mmap,
            mlock: self.mlock,
        }
    }

    /// The text of --chat-template or --chat-template-file, if given.
    pub(crate) fn chat_template(&self) -> anyhow::Result<Option<String>> {
        if let Some(text) = &self.chat_template {
            // llama.cpp takes the name of one of its built-in templates, or Jinja text.
            if let Some(builtin) = minfer::template::builtin(text) {
                return Ok(Some(builtin.to_string()));
            }
            let have = || minfer::template::builtin_names().collect::<Vec<_>>().join(", ");
            anyhow::ensure!(
                !minfer::template::LLAMA_CPP_NAMES.contains(&text.as_str()),
                "--chat-template {text}: llama.cpp's built-in template {text} is not among minfer's ({}); give its Jinja text or --chat-template-file",
                have()
            );
            anyhow::ensure!(
                text.contains("{%") || text.contains("{{"),
                "--chat-template {text}: neither Jinja text nor the name of a built-in template ({})",
                have()
            );
            return Ok(Some(text.clone()));
        }
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
pub(crate) struct AccelArgs {
    /// Flash attention (llama.cpp's -fa): on, off, auto, 1 or 0. minfer's attention is always
    /// the fused, flash-style kernel, so off is refused.
    #[arg(long = "flash-attn", value_name = "on|off|auto")]
    pub(crate) flash_attn: Option<String>,
    /// Layers on the GPU (llama.cpp's -ngl): the last N, the output head too when N exceeds the
    /// layer count; 0 runs everything on the CPU; without it every layer runs on a usable GPU.
    /// `bench` takes a comma-separated list.
    #[arg(
        long = "n-gpu-layers",
        value_name = "N",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub(crate) n_gpu_layers: Vec<i64>,
    /// Whether `--backend` names the backends (set by the command, not a flag): then `-ngl`
    /// without a usable GPU is refused rather than run on the CPU.
    #[arg(skip)]
    pub(crate) backend_given: bool,
}

impl AccelArgs {
    /// Refuses a flash-attention setting that cannot be honoured, naming the flag.
    pub(crate) fn check_flash_attn(&self) -> anyhow::Result<()> {
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

    /// `-ngl`'s one layer count (`None` without the flag). What it means for the backends is
    /// the engine's ([`minfer::engine::ModelOptions::n_gpu_layers`]).
    pub(crate) fn n_gpu_layers(&self) -> anyhow::Result<Option<usize>> {
        let list = self.n_gpu_layers_list()?;
        anyhow::ensure!(
            list.len() == 1,
            "-ngl takes one layer count here (only `bench` without --npl takes a list)"
        );
        Ok(list[0])
    }

    /// Every value of an `-ngl` list (`bench`; `[None]` without the flag). As llama.cpp does, a
    /// layer count above 0 on a machine without a usable GPU warns once and runs on the CPU
    /// (0), unless `--backend` names the backends: that asks for a device, and is refused.
    pub(crate) fn n_gpu_layers_list(&self) -> anyhow::Result<Vec<Option<usize>>> {
        if self.n_gpu_layers.is_empty() {
            return Ok(vec![None]);
        }
        let list = self
            .n_gpu_layers
            .iter()
            .map(|&n| {
                usize::try_from(n)
                    .map(Some)
                    .map_err(|_| anyhow::anyhow!("-ngl {n} is out of range: give a layer count of 0 or more"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        if !self.backend_given && list.iter().any(|n| n.is_some_and(|n| n > 0)) {
            if let Err(why) = minfer::engine::usable_gpu() {
                eprintln!("warning: -ngl asks for GPU layers, and no GPU is usable here ({why}): running on the CPU");
                return Ok(list.into_iter().map(|_| Some(0)).collect());
            }
        }
        Ok(list)
    }
}

/// How the KV cache stores K and V.
#[derive(clap::Args, Clone)]
pub(crate) struct CacheArgs {
    /// How the KV cache stores K: f32, f16 or q8_0 (llama.cpp's -ctk).
    #[arg(long, default_value = "f16", value_parser = minfer::graph::DType::kv_cache_type)]
    pub(crate) cache_type_k: minfer::graph::DType,
    /// How the KV cache stores V: f32, f16 or q8_0 (llama.cpp's -ctv).
    #[arg(long, default_value = "f16", value_parser = minfer::graph::DType::kv_cache_type)]
    pub(crate) cache_type_v: minfer::graph::DType,
    /// Full-size KV regions for a model's sliding-window layers (Gemma's local layers), as
    /// llama.cpp's --swa-full: more memory, but any earlier position can be gone back to and
    /// sessions can be saved. Without it those layers keep only their window.
    #[arg(long)]
    pub(crate) swa_full: bool,
}

impl LoadArgs {
    /// The model's options and its session's.
    pub(crate) fn options(&self) -> anyhow::Result<crate::cli::run::LoadOptions> {
        for (flag, n) in [("--batch-size", self.batch_size), ("--ubatch-size", self.ubatch_size)] {
            anyhow::ensure!(n != Some(0), "{flag} 0 is out of range: it must be at least 1");
        }
        Ok(crate::cli::run::LoadOptions {
            model: self.model.options()?,
            session: minfer::engine::SessionOptions {
                n_ctx: self.n_ctx,
                n_seq_max: 1,
                kv_unified: false,
                type_k: self.cache.cache_type_k,
                type_v: self.cache.cache_type_v,
                n_ubatch: match (self.batch_size, self.ubatch_size) {
                    (None, None) => None,
                    (b, ub) => Some(b.unwrap_or(usize::MAX).min(ub.unwrap_or(usize::MAX))),
                },
                swa_full: self.cache.swa_full,
            },
        })
    }
}

#[derive(clap::Args)]
pub(crate) struct SamplingArgs {
    /// Sampling temperature (0 = greedy).
    #[arg(long = "temp", default_value_t = 0.8)]
    pub(crate) temperature: f32,
    /// Keep the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 40, allow_negative_numbers = true)]
    pub(crate) top_k: i32,
    /// Keep the smallest set of tokens whose probability reaches P.
    #[arg(long, default_value_t = 0.95)]
    pub(crate) top_p: f32,
    /// Keep the tokens whose probability is at least P times the best one's (0 = off; default
    /// 0.05, as in llama.cpp).
    #[arg(long, value_name = "P")]
    pub(crate) min_p: Option<f32>,
    /// Penalise repeating the last --repeat-last-n tokens.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub(crate) frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub(crate) presence_penalty: f32,
    /// Tokens of history the penalties look at.
    #[arg(long, default_value_t = 64)]
    pub(crate) repeat_last_n: usize,
    /// Random seed; -1 (the default) draws one, printed on stderr so that the run can be
    /// repeated.
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    pub(crate) seed: i64,
    /// Always pick the most likely token (same as --temp 0, without penalties).
    #[arg(long)]
    pub(crate) greedy: bool,
    /// Locally typical sampling, parameter p (1.0 = off).
    #[arg(long = "typical", visible_alias = "typical-p", default_value_t = 1.0)]
    pub(crate) typical_p: f32,
    /// Keep the tokens within N standard deviations of the best logit (-1 = off).
    #[arg(long, default_value_t = -1.0, allow_negative_numbers = true)]
    pub(crate) top_n_sigma: f32,
    /// XTC's chance of removing the most likely tokens (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) xtc_probability: f32,
    /// XTC removes the tokens at least this likely but the least likely of them (above 0.5 = off).
    #[arg(long, default_value_t = 0.1)]
    pub(crate) xtc_threshold: f32,
    /// DRY repetition penalty multiplier (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub(crate) dry_multiplier: f32,
    /// DRY base: the penalty is multiplier * base^(repeat length - allowed length).
    #[arg(long, default_value_t = 1.75)]
    pub(crate) dry_base: f32,
    /// Repeats up to this many tokens go unpenalised by DRY.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true)]
    pub(crate) dry_allowed_length: i64,
    /// Tokens of history DRY scans (-1 = the whole context, 0 = off).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub(crate) dry_penalty_last_n: i64,
    /// A DRY sequence breaker; repeat the flag for several. The first one given replaces the
    /// defaults ("\n", ":", "\"", "*"); "none" clears them.
    #[arg(long = "dry-sequence-breaker", value_name = "STRING")]
    pub(crate) dry_sequence_breakers: Vec<String>,
    /// Mirostat sampling: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (top-k, top-p, typical and the
    /// other samplers are then not used).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    pub(crate) mirostat: i64,
    /// Mirostat learning rate, parameter eta.
    #[arg(long, default_value_t = 0.1)]
    pub(crate) mirostat_lr: f32,
    /// Mirostat target entropy, parameter tau.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) mirostat_ent: f32,
    /// The samplers to run, in order, separated by ';' (llama.cpp's names; default:
    /// penalties;dry;top_n_sigma;top_k;typ_p;top_p;min_p;xtc;temperature).
    #[arg(long, value_name = "LIST")]
    pub(crate) samplers: Option<String>,
}

impl SamplingArgs {
    /// `--seed`: -1 draws one (which [`Self::say_drawn_seed`] reports once the model has
    /// loaded, so that the run can be repeated).
    pub(crate) fn seed(&self) -> anyhow::Result<u64> {
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
    pub(crate) fn say_drawn_seed(&self, params: &minfer::sampling::SamplingParams) {
        if self.seed == -1 && !self.greedy && params.temperature > 0.0 {
            eprintln!("seed: {0} (drawn; --seed {0} repeats this run)", params.seed);
        }
    }

    pub(crate) fn params(&self) -> anyhow::Result<minfer::sampling::SamplingParams> {
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
            min_p: self.min_p.unwrap_or(defaults.min_p),
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
pub(crate) fn flag_error(e: &minfer::sampling::SamplingError) -> String {
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

pub(crate) fn read_json_array(path: &Path, what: &str) -> anyhow::Result<Vec<serde_json::Value>> {
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

pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
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
pub(crate) fn model_path(arg: &Path) -> anyhow::Result<PathBuf> {
    Ok(crate::cli::pull::resolve_model(arg)?)
}

pub(crate) fn open_model(model: &Path) -> anyhow::Result<GgufFile> {
    let model = &model_path(model)?;
    GgufFile::open(model).with_context(|| format!("cannot read model {}", model.display()))
}

pub(crate) fn read_text_arg(file: &Path) -> anyhow::Result<Vec<u8>> {
    if file == Path::new("-") {
        let mut bytes = Vec::new();
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("cannot read standard input")?;
        return Ok(bytes);
    }
    std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
}
