//! `minfer bench`: its flags, read as llama-bench reads its own (comma lists, ranges such as
//! `-p 64-512*2`, every flag of its usage either honoured or refused by name with the reason),
//! turned into bench options, and the rows written in the formats asked for, on standard output
//! (`-o`) and standard error (`-oe`). Measuring is `crate::cli::bench`'s (and
//! `crate::cli::batched_bench`'s for `--npl`).
//!
//! llama-bench's multi-letter single-dash flags (`-ngl`, `-oe`, `-mmp`, ...) reach this parser
//! as their long names, rewritten by `crate::cli::llama_flags`.

use crate::args::*;
use crate::cli::bench::{self, BenchOptions, BenchResult, Devices, LoadMode, MarkdownTable};
use minfer::graph::DType;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

/// Run `minfer bench` as its flags say.
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    if args.llama.version {
        // llama-bench's --version prints its build and exits.
        println!("minfer {}", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }
    // Every flag is checked before a model is read or fetched.
    let llama = args.llama_options()?;
    if let Some(token) = &args.hf_token {
        // What minfer's downloads read, as llama-bench's -hft is what its downloads send.
        std::env::set_var("HF_TOKEN", token);
    }
    let mut models: Vec<PathBuf> = args
        .model
        .iter()
        .cloned()
        .chain(args.model_flag.iter().cloned())
        .collect();
    models.extend(args.hf_repo.iter().map(|repo| PathBuf::from(format!("hf:{repo}"))));
    anyhow::ensure!(
        !models.is_empty(),
        "bench needs a model: minfer bench MODEL, -m MODEL or -hf OWNER/REPO[:QUANT]"
    );
    if !args.n_parallel.is_empty() {
        return run_batched(&args, &llama, &models);
    }
    // Checked before the model is read.
    let grammar = args.grammar.spec()?.map(|(_, spec)| spec);
    let options = BenchOptions {
        n_prompt: args.n_prompt.iter().flat_map(|r| r.unsigned()).collect(),
        n_gen: args.n_gen.iter().flat_map(|r| r.unsigned()).collect(),
        pg: args.pg.clone(),
        n_depth: args.n_depth.iter().flat_map(|r| r.unsigned()).collect(),
        n_batch: args.batch_size.iter().flat_map(|r| r.unsigned()).collect(),
        n_ubatch: args.ubatch_size.iter().flat_map(|r| r.unsigned()).collect(),
        type_k: llama.type_k,
        type_v: llama.type_v,
        flash_attn: llama.flash_attn,
        load_mode: llama.load_mode,
        devices: llama.devices,
        n_threads: if args.threads.is_empty() {
            vec![minfer::engine::default_threads()]
        } else {
            args.threads.iter().flat_map(|r| r.unsigned()).collect()
        },
        repetitions: args.repetitions,
        warmup: !args.no_warmup,
        delay: Duration::from_secs(args.delay),
        progress: args.progress || args.verbose,
        verbose: args.verbose,
        backend: args.backend.clone(),
        n_gpu_layers: llama.n_gpu_layers,
        seed: 1,
        bandwidth: args.bandwidth,
        handoff: args.handoff,
        grammar,
        profile: args.profile,
    };
    let mut out = Printer::new(args.output, std::io::stdout(), &options);
    let mut err = Printer::new(args.output_err, std::io::stderr(), &options);
    out.begin()?;
    err.begin()?;
    let mut results = Vec::new();
    // Each model runs every test in turn, as llama-bench's outermost loop.
    for model in &models {
        let model = model_path(model)?;
        results.extend(bench::run_bench(&model, &options, |r| {
            out.row(r)?;
            err.row(r)
        })?);
    }
    out.end(&results)?;
    err.end(&results)?;
    Ok(())
}

/// `--npl`: llama-batched-bench's measurement, with one model, layer count and thread count.
fn run_batched(args: &BenchArgs, llama: &LlamaOptions, models: &[PathBuf]) -> anyhow::Result<()> {
    anyhow::ensure!(models.len() == 1, "--npl measures one model at a time");
    anyhow::ensure!(
        llama.n_gpu_layers.len() <= 1,
        "-ngl takes one layer count here (only `bench` without --npl takes a list)"
    );
    let threads: Vec<usize> = args.threads.iter().flat_map(|r| r.unsigned()).collect();
    anyhow::ensure!(
        threads.len() <= 1,
        "--npl measures one thread count at a time; give -t once"
    );
    let model = model_path(&models[0])?;
    use crate::cli::batched_bench;
    let options = batched_bench::BatchedOptions {
        n_prompt: args.n_prompt.iter().flat_map(|r| r.unsigned()).collect(),
        n_gen: args.n_gen.iter().flat_map(|r| r.unsigned()).collect(),
        n_parallel: args.n_parallel.clone(),
        n_threads: threads.first().copied().unwrap_or_else(minfer::engine::default_threads),
        backend: args.backend.clone(),
        n_gpu_layers: llama.n_gpu_layers.first().and_then(|&n| usize::try_from(n).ok()),
        seed: 1,
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(batched_bench::markdown_header().as_bytes())?;
    batched_bench::run_batched(&model, &options, |r| {
        stdout.write_all(batched_bench::markdown_row(r).as_bytes())?;
        stdout.flush()
    })?;
    Ok(())
}

/// One output of the rows (`-o` on standard output, `-oe` on standard error), written as
/// llama-bench's printer of that format writes it: the markdown table, JSON lines and SQL row by
/// row as each test ends; JSON and CSV at the end, when the run-wide figures (`--bandwidth`,
/// `--handoff`) are in every row.
struct Printer<'o, W: Write> {
    format: BenchFormat,
    out: W,
    options: &'o BenchOptions,
    table: Option<MarkdownTable>,
}

impl<'o, W: Write> Printer<'o, W> {
    fn new(format: BenchFormat, out: W, options: &'o BenchOptions) -> Self {
        Printer {
            format,
            out,
            options,
            table: None,
        }
    }

    /// What comes before the first row: SQL's table.
    fn begin(&mut self) -> std::io::Result<()> {
        if let BenchFormat::Sql = self.format {
            self.out.write_all(bench::sql_header().as_bytes())?;
        }
        self.out.flush()
    }

    fn row(&mut self, r: &BenchResult) -> std::io::Result<()> {
        let text = match self.format {
            BenchFormat::Md => {
                // The table's columns depend on the backend, known with the first row.
                let mut text = String::new();
                let table = self.table.get_or_insert_with(|| {
                    let table = MarkdownTable::new(self.options, &r.backends);
                    text = table.header();
                    table
                });
                text + &table.row(r)
            }
            BenchFormat::Jsonl => bench::to_json_line(r),
            BenchFormat::Sql => bench::sql_row(r),
            BenchFormat::Json | BenchFormat::Csv | BenchFormat::None => return Ok(()),
        };
        self.out.write_all(text.as_bytes())?;
        self.out.flush()
    }

    fn end(&mut self, results: &[BenchResult]) -> std::io::Result<()> {
        match self.format {
            BenchFormat::Md => {
                self.out.write_all(bench::markdown_footer(results).as_bytes())?;
                for r in results {
                    if let Some(profile) = &r.profile {
                        let title = format!("\n### Profile: {} at {} threads\n\n", r.test_name(), r.n_threads);
                        self.out.write_all(title.as_bytes())?;
                        self.out.write_all(profile.to_markdown().as_bytes())?;
                    }
                }
            }
            BenchFormat::Json => self.out.write_all(bench::to_json(results).as_bytes())?,
            BenchFormat::Csv => self.out.write_all(bench::to_csv(results).as_bytes())?,
            BenchFormat::Jsonl | BenchFormat::Sql | BenchFormat::None => {}
        }
        self.out.flush()
    }
}

/// llama-bench's output formats (`-o`, `-oe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum BenchFormat {
    /// Its markdown table.
    Md,
    /// A JSON array of rows.
    Json,
    /// One JSON object a line, as each test ends.
    Jsonl,
    /// A header of the field names, then a line per test.
    Csv,
    /// `CREATE TABLE IF NOT EXISTS llama_bench`, then an INSERT per test.
    Sql,
    /// Nothing.
    None,
}

/// `-pg P,N`: a prompt size and a generation length.
pub(crate) fn parse_pg(s: &str) -> Result<(usize, usize), String> {
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

/// The integers of one of llama-bench's number lists (`-p`, `-n`, `-d`, `-b`, `-ub`, `-t`,
/// `-ngl`, ...), as its `parse_int_range` reads them: comma-separated items, each `N`,
/// `FIRST-LAST` (step 1), `FIRST-LAST+STEP` or `FIRST-LAST*FACTOR`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct IntList(pub(crate) Vec<i64>);

impl IntList {
    /// The values as sizes: only lists read without negatives reach here, so none is negative.
    fn unsigned(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().map(|&v| usize::try_from(v).unwrap_or(0))
    }
}

/// llama-bench's `parse_int_range`: `-p 1-5` is 1,2,3,4,5, `-p 64-512*2` is 64,128,256,512,
/// `-t 1-8+3` is 1,4,7; a range that does not grow, or text that is none of these, is refused.
pub(crate) fn parse_int_range(s: &str, allow_negative: bool) -> Result<Vec<i64>, String> {
    let bad =
        || format!("'{s}' is not a number list: N, FIRST-LAST, FIRST-LAST+STEP or FIRST-LAST*FACTOR, comma-separated");
    let mut out = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (item, tail) = match rest.split_once(',') {
            Some((item, tail)) => (item, tail),
            None => (rest, ""),
        };
        rest = tail;
        // first[-last[(+|*)step]], first with a sign only where negatives are allowed.
        let digits = |t: &str| -> Option<(i64, usize)> {
            let n = t.bytes().take_while(u8::is_ascii_digit).count();
            let v: i32 = t[..n].parse().ok()?;
            Some((i64::from(v), n))
        };
        let sign = usize::from(allow_negative && item.starts_with('-'));
        let (first, n) = digits(&item[sign..]).ok_or_else(bad)?;
        let first = if sign == 1 { -first } else { first };
        let mut at = sign + n;
        let (mut last, mut op, mut step) = (first, b'+', 1);
        if item[at..].starts_with('-') {
            let (v, n) = digits(&item[at + 1..]).ok_or_else(bad)?;
            last = v;
            at += 1 + n;
            if let Some(&o) = item.as_bytes().get(at).filter(|o| b"+*".contains(o)) {
                let (v, n) = digits(&item[at + 1..]).ok_or_else(bad)?;
                (op, step) = (o, v);
                at += 1 + n;
            }
        }
        if at != item.len() {
            return Err(bad());
        }
        let mut i = first;
        while i <= last {
            out.push(i);
            let next = if op == b'+' { i + step } else { i * step };
            if next <= i {
                return Err(format!("'{s}': the range {item} does not grow"));
            }
            i = next;
        }
    }
    Ok(out)
}

fn int_list(s: &str) -> Result<IntList, String> {
    parse_int_range(s, false).map(IntList)
}

fn signed_int_list(s: &str) -> Result<IntList, String> {
    parse_int_range(s, true).map(IntList)
}

/// What llama-bench's parameter flags come to, checked.
struct LlamaOptions {
    type_k: Vec<DType>,
    type_v: Vec<DType>,
    flash_attn: Vec<i32>,
    load_mode: Vec<LoadMode>,
    devices: Vec<Devices>,
    n_gpu_layers: Vec<i64>,
}

/// The refusal of a flag's value minfer cannot honour: the flag as llama-bench spells it, the
/// value, and why.
fn refuse(flag: &str, value: impl std::fmt::Display, why: &str) -> anyhow::Error {
    anyhow::anyhow!("{flag} {value} cannot be honoured: {why}")
}

/// A llama-bench boolean (`0` or `1`, as C++ streams read one).
fn bool01(flag: &str, value: &str) -> anyhow::Result<bool> {
    match value {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => anyhow::bail!("{flag} {value}: expected 0 or 1"),
    }
}

impl BenchArgs {
    /// llama-bench's parameters, each value honoured or refused by its flag with the reason;
    /// its options that change nothing minfer measures are checked the same way.
    fn llama_options(&self) -> anyhow::Result<LlamaOptions> {
        // Options minfer takes only at llama-bench's default, which is what it does.
        for v in &self.llama.cpu_mask {
            let zero = u128::from_str_radix(v.trim_start_matches("0x").trim_start_matches("0X"), 16) == Ok(0);
            if !zero {
                return Err(refuse("-C/--cpu-mask", v, "minfer does not pin its threads to CPUs"));
            }
        }
        for v in &self.llama.cpu_strict {
            if bool01("--cpu-strict", v)? {
                return Err(refuse("--cpu-strict", v, "minfer does not pin its threads to CPUs"));
            }
        }
        for &v in self.llama.poll.iter().flat_map(|l| &l.0) {
            if v != 50 {
                return Err(refuse(
                    "--poll",
                    v,
                    "minfer's idle workers spin for MINFER_SPIN_US microseconds (default 1000), not by a polling level",
                ));
            }
        }
        for &v in self.llama.n_cpu_moe.iter().flat_map(|l| &l.0) {
            if v != 0 {
                return Err(refuse(
                    "-ncmoe/--n-cpu-moe",
                    v,
                    "minfer keeps a layer's experts with the layer",
                ));
            }
        }
        for v in &self.llama.split_mode {
            if v != "layer" {
                return Err(refuse(
                    "-sm/--split-mode",
                    v,
                    "minfer runs a model on one GPU, split from the CPU by layers (-ngl): only layer",
                ));
            }
        }
        for &v in self.llama.main_gpu.iter().flat_map(|l| &l.0) {
            if v != 0 {
                return Err(refuse(
                    "-mg/--main-gpu",
                    v,
                    "minfer runs on the first usable GPU (--backend chooses the backend)",
                ));
            }
        }
        for v in &self.llama.no_kv_offload {
            if bool01("-nkvo/--no-kv-offload", v)? {
                return Err(refuse(
                    "-nkvo/--no-kv-offload",
                    v,
                    "minfer keeps each layer's KV cache on the layer's device",
                ));
            }
        }
        for v in &self.llama.lazy_mode {
            match v.as_str() {
                "auto" => {}
                "on" | "off" => {
                    return Err(refuse(
                        "-lzm/--lazy-mode",
                        v,
                        "minfer has no per-tensor lazy reading: a mapped file is paged in as it is read, -lm none reads it whole",
                    ))
                }
                _ => anyhow::bail!("-lzm/--lazy-mode {v}: expected on, auto or off"),
            }
        }
        for v in &self.llama.embeddings {
            if bool01("-embd/--embeddings", v)? {
                return Err(refuse(
                    "-embd/--embeddings",
                    v,
                    "minfer bench measures the logits' path, not embeddings",
                ));
            }
        }
        for v in &self.llama.tensor_split {
            let zero = v
                .split(['/', ';'])
                .all(|p| p.trim().parse::<f32>().is_ok_and(|x| x == 0.0));
            if !zero {
                return Err(refuse(
                    "-ts/--tensor-split",
                    v,
                    "minfer runs a model on one GPU: there is nothing to split",
                ));
            }
        }
        if let Some(v) = self.llama.override_tensor.first() {
            return Err(refuse(
                "-ot/--override-tensor",
                v,
                "minfer places tensors by layer only (-ngl)",
            ));
        }
        for v in &self.llama.no_op_offload {
            if bool01("-nopo/--no-op-offload", v)? {
                return Err(refuse(
                    "-nopo/--no-op-offload",
                    v,
                    "minfer has no op offload to turn off: each node runs where its layer is",
                ));
            }
        }
        for v in &self.llama.no_host {
            if bool01("--no-host", v)? {
                return Err(refuse("--no-host", v, "minfer has no host buffer type to skip"));
            }
        }
        for v in &self.llama.repack {
            if !bool01("--repack", v)? {
                return Err(refuse(
                    "--repack",
                    v,
                    "minfer's kernels choose their weight layout by measurement (MINFER_KERNEL forces one)",
                ));
            }
        }
        for (flag, values) in [
            ("-fitt/--fit-target", &self.llama.fit_target),
            ("-fitc/--fit-ctx", &self.llama.fit_ctx),
        ] {
            for v in values {
                if v.parse::<u64>() != Ok(0) {
                    return Err(refuse(
                        flag,
                        v,
                        "minfer does not fit a model to the device's memory: give -ngl",
                    ));
                }
            }
        }
        if let Some(v) = &self.llama.rpc {
            return Err(refuse("-rpc/--rpc", v, "minfer has no RPC backend"));
        }
        if let Some(v) = &self.llama.numa {
            return Err(refuse(
                "--numa",
                v,
                "minfer does not place its threads or memory by NUMA node",
            ));
        }
        if self.llama.prio != 0 {
            return Err(refuse(
                "--prio",
                self.llama.prio,
                "minfer runs at the priority it was started with (use nice)",
            ));
        }
        if self.llama.list_devices {
            anyhow::bail!(
                "--list-devices is not supported: minfer's backends are chosen by name with --backend (or MINFER_BACKENDS), and each row's backends field says which ran"
            );
        }
        if let Some(v) = &self.llama.hf_file {
            return Err(refuse(
                "-hff/--hf-file",
                v,
                "name the quant in the reference instead: -hf OWNER/REPO:QUANT",
            ));
        }
        if self.llama.offline {
            anyhow::bail!(
                "--offline cannot be honoured: minfer reads a model from its cache first and fetches only what the cache lacks, with no switch to forbid that"
            );
        }

        // Parameters minfer honours, each value a run.
        let cache_type = |flag: &str, values: &[String]| -> anyhow::Result<Vec<DType>> {
            values
                .iter()
                .map(|v| match DType::kv_cache_type(v) {
                    Ok(t) => Ok(t),
                    Err(_) if ["bf16", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl"].contains(&v.as_str()) => {
                        Err(refuse(flag, v, "minfer's KV cache stores f32, f16 or q8_0"))
                    }
                    Err(e) => Err(anyhow::anyhow!("{flag} {v}: {e}")),
                })
                .collect::<anyhow::Result<Vec<_>>>()
                // llama-bench's default, f16.
                .map(|types| if types.is_empty() { vec![DType::F16] } else { types })
        };
        let flash_attn = self
            .llama
            .flash_attn
            .iter()
            .map(|v| match v.as_str() {
                "on" | "enabled" | "true" | "1" => Ok(1),
                "auto" | "-1" => Ok(-1),
                "off" | "disabled" | "false" | "0" => Err(refuse(
                    "-fa",
                    v,
                    "minfer's attention is always the fused (flash-style) kernel",
                )),
                _ => Err(anyhow::anyhow!("-fa {v}: expected on, off or auto")),
            })
            .collect::<anyhow::Result<Vec<i32>>>()?;
        let mut load_mode = self
            .llama
            .load_mode
            .iter()
            .map(|v| LoadMode::parse(v).map_err(|why| anyhow::anyhow!("-lm/--load-mode {v}: {why}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        // llama-bench's older -mmp 0|1: read whole, or mapped.
        for v in &self.llama.mmap {
            load_mode.push(match bool01("-mmp/--mmap", v)? {
                true => LoadMode::Mmap,
                false => LoadMode::None,
            });
        }
        let devices = self
            .llama
            .device
            .iter()
            .map(|v| match v.trim() {
                "auto" => Ok(Devices::Auto),
                "none" => Ok(Devices::None),
                _ => Err(refuse(
                    "-dev/--device",
                    v,
                    "minfer chooses GPUs by backend (--backend cuda or wgpu), not by device name: give auto or none",
                )),
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(LlamaOptions {
            type_k: cache_type("-ctk/--cache-type-k", &self.llama.cache_type_k)?,
            type_v: cache_type("-ctv/--cache-type-v", &self.llama.cache_type_v)?,
            flash_attn: if flash_attn.is_empty() { vec![-1] } else { flash_attn },
            load_mode: if load_mode.is_empty() {
                vec![LoadMode::Auto]
            } else {
                load_mode
            },
            devices: if devices.is_empty() {
                vec![Devices::Auto]
            } else {
                devices
            },
            n_gpu_layers: if self.n_gpu_layers.is_empty() {
                vec![-1]
            } else {
                self.n_gpu_layers.iter().flat_map(|l| l.0.iter().copied()).collect()
            },
        })
    }
}

/// `minfer bench`'s flags: llama-bench's (under its long names; `crate::cli::llama_flags`
/// rewrites its single-dash ones), then minfer's own.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// The GGUF model file (or -m FILE).
    pub(crate) model: Option<PathBuf>,
    /// The GGUF model files, as llama-bench takes them (comma-separated or repeated): each runs
    /// every test in turn.
    #[arg(
        short = 'm',
        long = "model",
        value_name = "FILE",
        conflicts_with = "model",
        value_delimiter = ','
    )]
    pub(crate) model_flag: Vec<PathBuf>,
    /// A model from Hugging Face (llama-bench's -hf, -hfr): OWNER/REPO[:QUANT], fetched into the
    /// cache as hf:OWNER/REPO[:QUANT] is.
    #[arg(
        long = "hf-repo",
        alias = "hf_repo",
        value_name = "OWNER/REPO[:QUANT]",
        value_delimiter = ','
    )]
    pub(crate) hf_repo: Vec<String>,
    /// The Hugging Face token for -hf (llama-bench's -hft; else HF_TOKEN).
    #[arg(long = "hf-token", alias = "hf_token", value_name = "TOKEN")]
    pub(crate) hf_token: Option<String>,
    /// Prompt sizes in tokens: a list of N, FIRST-LAST, FIRST-LAST+STEP or FIRST-LAST*FACTOR.
    #[arg(short = 'p', long = "n-prompt", alias = "n_prompt", value_name = "N", value_parser = int_list, default_value = "512")]
    pub(crate) n_prompt: Vec<IntList>,
    /// Generation lengths in tokens (a list, as -p).
    #[arg(short = 'n', long = "n-gen", alias = "n_gen", value_name = "N", value_parser = int_list, default_value = "128")]
    pub(crate) n_gen: Vec<IntList>,
    /// A prompt-then-generation test, P prompt tokens then N generated ones, timed together
    /// (`ppP+tgN`; repeatable).
    #[arg(long = "pg", value_name = "P,N", value_parser = parse_pg)]
    pub(crate) pg: Vec<(usize, usize)>,
    /// Context depths (a list): each test runs after this many tokens were evaluated, untimed
    /// (`pp512 @ d1024`).
    #[arg(short = 'd', long = "n-depth", alias = "n_depth", value_name = "N", value_parser = int_list, default_value = "0")]
    pub(crate) n_depth: Vec<IntList>,
    /// Most prompt tokens one evaluation is given (a list); prompts are read in passes of the
    /// smaller of this and -ub.
    #[arg(short = 'b', long = "batch-size", alias = "batch_size", value_name = "N", value_parser = int_list, default_value = "2048")]
    pub(crate) batch_size: Vec<IntList>,
    /// Prompt tokens per forward pass (llama-bench's -ub; a list).
    #[arg(long = "ubatch-size", alias = "ubatch_size", value_name = "N", value_parser = int_list, default_value = "512")]
    pub(crate) ubatch_size: Vec<IntList>,
    /// Thread counts (a list; default: the number of physical cores).
    #[arg(short = 't', long = "threads", value_name = "N", value_parser = int_list)]
    pub(crate) threads: Vec<IntList>,
    /// Layers on the GPU (llama-bench's -ngl; a list, each a run): the last N, the head too when
    /// N exceeds the layer count; 0 keeps everything on the CPU; -1 (the default) every layer
    /// on a usable GPU.
    #[arg(long = "n-gpu-layers", alias = "n_gpu_layers", value_name = "N", value_parser = signed_int_list, allow_hyphen_values = true)]
    pub(crate) n_gpu_layers: Vec<IntList>,
    /// Seconds to pause before each test, to cool off (llama-bench's --delay).
    #[arg(long = "delay", value_name = "SECONDS", default_value_t = 0)]
    pub(crate) delay: u64,
    /// Timed repetitions of each test, after one warm-up run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub(crate) repetitions: usize,
    /// Skip the warm-up run of each test (llama-bench's --no-warmup).
    #[arg(long = "no-warmup", alias = "no_warmup")]
    pub(crate) no_warmup: bool,
    /// Print a line on standard error as each test starts and runs (llama-bench's --progress).
    #[arg(long)]
    pub(crate) progress: bool,
    /// Also say on standard error what each load gave, and the progress (llama-bench's -v).
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// Output format on standard output: llama-bench's markdown table, a JSON array, JSON lines
    /// (one object per test, as each ends), CSV, SQL (`CREATE TABLE IF NOT EXISTS llama_bench`
    /// and one INSERT per test) or none. Every format has llama-bench's fields in its order,
    /// minfer's after them.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = BenchFormat::Md)]
    pub(crate) output: BenchFormat,
    /// Output format on standard error, as -o (llama-bench's -oe; default none).
    #[arg(long = "output-err", alias = "output_err", value_enum, default_value_t = BenchFormat::None)]
    pub(crate) output_err: BenchFormat,
    /// llama-bench's parameters beyond the test sizes, threads and layers (boxed: they are
    /// many, and rarely given).
    #[command(flatten)]
    pub(crate) llama: Box<LlamaBenchArgs>,
    /// Also measure the memory read bandwidth at each thread count and report generation as
    /// a fraction of the rate it allows (weights read per token / bandwidth).
    #[arg(long)]
    pub(crate) bandwidth: bool,
    /// Also measure what handing one node to the CPU thread pool costs at each thread count
    /// (a pool run of an empty job, back to back and after a pause).
    #[arg(long)]
    pub(crate) handoff: bool,
    /// Also time every node of the timed runs and print where each test's time went: by op
    /// kind, weight matrix (with GB/s and GFLOP/s) and layer (in the JSON as `profile`).
    #[arg(long)]
    pub(crate) profile: bool,
    /// Measure what a constraint costs (`-j`, `--json-schema-file`, `--json`, `--grammar`,
    /// `--grammar-file`): each generation test runs twice, its tokens sampled without and then
    /// with the constraint's mask (instead of random tokens).
    #[command(flatten)]
    pub(crate) grammar: GrammarArgs,
    /// Parallel sequence counts (comma-separated): llama-batched-bench's measurement, each of
    /// -p prompt tokens and -n generated tokens, all sequences in one batch per step.
    #[arg(long = "npl", value_delimiter = ',')]
    pub(crate) n_parallel: Vec<usize>,
    /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
    #[arg(long, value_name = "NAME")]
    pub(crate) backend: Option<String>,
}

/// llama-bench's parameter and option flags that `minfer bench` honours at more than their
/// defaults only in part (cache types, flash attention, devices, load modes) or not at all.
#[derive(clap::Args)]
pub(crate) struct LlamaBenchArgs {
    /// Print minfer's version and exit (llama-bench's --version).
    #[arg(long)]
    pub(crate) version: bool,
    /// llama-bench's -hff: refused (name the quant in -hf OWNER/REPO:QUANT).
    #[arg(long = "hf-file", alias = "hf_file", value_name = "FILE", hide = true)]
    pub(crate) hf_file: Option<String>,
    /// llama-bench's --offline: refused (minfer fetches only what its cache lacks).
    #[arg(long, hide = true)]
    pub(crate) offline: bool,
    /// KV cache type of K (llama-bench's -ctk; a list): f16, q8_0 or f32.
    #[arg(
        long = "cache-type-k",
        alias = "cache_type_k",
        value_name = "TYPE",
        value_delimiter = ','
    )]
    pub(crate) cache_type_k: Vec<String>,
    /// KV cache type of V (llama-bench's -ctv; a list).
    #[arg(
        long = "cache-type-v",
        alias = "cache_type_v",
        value_name = "TYPE",
        value_delimiter = ','
    )]
    pub(crate) cache_type_v: Vec<String>,
    /// llama-bench's CPU affinity mask: only 0x0 (minfer does not pin its threads).
    #[arg(
        short = 'C',
        long = "cpu-mask",
        alias = "cpu_mask",
        value_name = "HEX",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) cpu_mask: Vec<String>,
    /// llama-bench's --cpu-strict: only 0.
    #[arg(
        long = "cpu-strict",
        alias = "cpu_strict",
        value_name = "0|1",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) cpu_strict: Vec<String>,
    /// llama-bench's --poll: only 50, its default.
    #[arg(long = "poll", value_name = "0...100", value_parser = int_list, hide = true)]
    pub(crate) poll: Vec<IntList>,
    /// llama-bench's -ncmoe: only 0 (minfer keeps a layer's experts with the layer).
    #[arg(long = "n-cpu-moe", alias = "n_cpu_moe", value_name = "N", value_parser = int_list, hide = true)]
    pub(crate) n_cpu_moe: Vec<IntList>,
    /// llama-bench's -sm: only layer.
    #[arg(
        long = "split-mode",
        alias = "split_mode",
        value_name = "MODE",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) split_mode: Vec<String>,
    /// llama-bench's -mg: only 0.
    #[arg(long = "main-gpu", alias = "main_gpu", value_name = "I", value_parser = int_list, hide = true)]
    pub(crate) main_gpu: Vec<IntList>,
    /// llama-bench's -nkvo: only 0.
    #[arg(
        long = "no-kv-offload",
        alias = "no_kv_offload",
        value_name = "0|1",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) no_kv_offload: Vec<String>,
    /// Flash attention (llama-bench's -fa; a list): on or auto; minfer's attention is always the
    /// fused, flash-style kernel, so off is refused.
    #[arg(
        long = "flash-attn",
        alias = "flash_attn",
        value_name = "on|off|auto",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub(crate) flash_attn: Vec<String>,
    /// Devices (llama-bench's -dev; a list): auto (the default) or none (the CPU alone).
    #[arg(long = "device", value_name = "auto|none", value_delimiter = ',')]
    pub(crate) device: Vec<String>,
    /// How the weights are read (llama-bench's -lm; a list): auto or mmap (mapped), none (read
    /// whole), mlock (read whole and locked), mmap+mlock.
    #[arg(long = "load-mode", alias = "load_mode", value_name = "MODE", value_delimiter = ',')]
    pub(crate) load_mode: Vec<String>,
    /// Older llama-bench's -mmp 0|1 (a list): -lm none or mmap.
    #[arg(long = "mmap", value_name = "0|1", value_delimiter = ',')]
    pub(crate) mmap: Vec<String>,
    /// llama-bench's -lzm: only auto.
    #[arg(
        long = "lazy-mode",
        alias = "lazy_mode",
        value_name = "MODE",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) lazy_mode: Vec<String>,
    /// llama-bench's -embd: only 0.
    #[arg(long = "embeddings", value_name = "0|1", value_delimiter = ',', hide = true)]
    pub(crate) embeddings: Vec<String>,
    /// llama-bench's -ts: only 0 (one GPU).
    #[arg(
        long = "tensor-split",
        alias = "tensor_split",
        value_name = "TS",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) tensor_split: Vec<String>,
    /// llama-bench's -ot: refused.
    #[arg(
        long = "override-tensor",
        alias = "override_tensor",
        value_name = "PATTERN=TYPE",
        hide = true
    )]
    pub(crate) override_tensor: Vec<String>,
    /// llama-bench's -nopo: only 0.
    #[arg(
        long = "no-op-offload",
        alias = "no_op_offload",
        value_name = "0|1",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) no_op_offload: Vec<String>,
    /// llama-bench's --no-host: only 0.
    #[arg(
        long = "no-host",
        alias = "no_host",
        value_name = "0|1",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) no_host: Vec<String>,
    /// llama-bench's --repack: only 1.
    #[arg(long = "repack", value_name = "0|1", value_delimiter = ',', hide = true)]
    pub(crate) repack: Vec<String>,
    /// llama-bench's -fitt: only 0.
    #[arg(
        long = "fit-target",
        alias = "fit_target",
        value_name = "MiB",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) fit_target: Vec<String>,
    /// llama-bench's -fitc: only 0.
    #[arg(
        long = "fit-ctx",
        alias = "fit_ctx",
        value_name = "N",
        value_delimiter = ',',
        hide = true
    )]
    pub(crate) fit_ctx: Vec<String>,
    /// llama-bench's -rpc: refused.
    #[arg(long = "rpc", value_name = "SERVERS", hide = true)]
    pub(crate) rpc: Option<String>,
    /// llama-bench's --numa: refused.
    #[arg(long = "numa", value_name = "MODE", hide = true)]
    pub(crate) numa: Option<String>,
    /// llama-bench's --prio: only 0.
    #[arg(
        long = "prio",
        value_name = "-1|0|1|2|3",
        default_value_t = 0,
        allow_negative_numbers = true,
        hide = true
    )]
    pub(crate) prio: i32,
    /// llama-bench's --list-devices: refused (--backend names the backend).
    #[arg(long = "list-devices", alias = "list_devices", hide = true)]
    pub(crate) list_devices: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn number_lists_are_read_as_llama_bench_reads_its_ranges() {
        let r = |s| parse_int_range(s, false);
        assert_eq!(r("512").unwrap(), [512]);
        assert_eq!(r("128,512").unwrap(), [128, 512]);
        assert_eq!(r("1-5").unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(r("1-5+1").unwrap(), [1, 2, 3, 4, 5]);
        assert_eq!(r("1-8+3").unwrap(), [1, 4, 7]);
        assert_eq!(r("64-512*2").unwrap(), [64, 128, 256, 512]);
        assert_eq!(r("1,4-6,16").unwrap(), [1, 4, 5, 6, 16]);
        // A trailing comma ends the list, as llama-bench's `(?:,|$)` lets it.
        assert_eq!(r("1,2,").unwrap(), [1, 2]);
        for bad in ["x", "1-", "1-5+", "1-5|2", "1,,2", "-1", "1 2", "99999999999"] {
            assert!(r(bad).is_err(), "{bad}");
        }
        // A range that does not grow is refused, not looped over.
        assert!(r("0-4*2").unwrap_err().contains("does not grow"));
        assert!(r("1-4+0").is_err());
        assert_eq!(parse_int_range("-1", true).unwrap(), [-1]);
        assert_eq!(parse_int_range("-1,0,99", true).unwrap(), [-1, 0, 99]);
    }

    /// The flags as `minfer bench` receives them (llama_flags has rewritten the single-dash
    /// ones to their long names).
    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        use clap::{Args, FromArgMatches};
        let command = BenchArgs::augment_args(clap::Command::new("bench"));
        let matches = command.try_get_matches_from(std::iter::once("bench").chain(args.iter().copied()))?;
        BenchArgs::from_arg_matches(&matches)
    }

    fn refusal(args: &[&str]) -> String {
        match parse(args) {
            Ok(a) => a.llama_options().err().map(|e| e.to_string()).unwrap_or_default(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn llama_benchs_parameters_are_lists_and_ranges_as_it_reads_them() {
        let a = parse(&[
            "-m",
            "a.gguf,b.gguf",
            "-p",
            "16-64*2",
            "-n",
            "4",
            "-t",
            "1-2",
            "--n-gpu-layers",
            "-1,0",
            "--flash-attn",
            "on,auto",
            "--cache-type-k",
            "f16,q8_0",
            "--load-mode",
            "none",
            "--mmap",
            "1",
            "--device",
            "none",
            "-b",
            "256",
            "--ubatch-size",
            "64,128",
            "-o",
            "sql",
            "--output-err",
            "jsonl",
        ])
        .unwrap();
        assert_eq!(a.model_flag, [PathBuf::from("a.gguf"), PathBuf::from("b.gguf")]);
        assert_eq!(a.n_prompt, [IntList(vec![16, 32, 64])]);
        assert_eq!(a.threads, [IntList(vec![1, 2])]);
        assert_eq!((a.output, a.output_err), (BenchFormat::Sql, BenchFormat::Jsonl));
        let l = a.llama_options().unwrap();
        assert_eq!(l.n_gpu_layers, [-1, 0]);
        assert_eq!(l.flash_attn, [1, -1]);
        assert_eq!(l.type_k, [DType::F16, DType::Q8_0]);
        assert_eq!(l.type_v, [DType::F16]);
        assert_eq!(l.load_mode, [LoadMode::None, LoadMode::Mmap]);
        assert_eq!(l.devices, [Devices::None]);
        // Without the flags: llama-bench's defaults.
        let l = parse(&["m.gguf"]).unwrap().llama_options().unwrap();
        assert_eq!(
            (l.n_gpu_layers, l.flash_attn, l.load_mode, l.devices),
            (vec![-1], vec![-1], vec![LoadMode::Auto], vec![Devices::Auto])
        );
    }

    /// llama-bench's multi-letter single-dash flags (llama.cpp 0c1e570's `print_usage`, and
    /// older llama-bench's `-mmp`) and the long flag of `minfer bench` each one is: what
    /// `crate::cli::llama_flags` rewrites for `bench` (a parser of ordinary flags would read
    /// `-mmp 0` as `-m mp 0`).
    const LLAMA_BENCH_DASH_FLAGS: &[(&str, &str)] = &[
        ("-oe", "--output-err"),
        ("-fitt", "--fit-target"),
        ("-fitc", "--fit-ctx"),
        ("-rpc", "--rpc"),
        ("-hf", "--hf-repo"),
        ("-hfr", "--hf-repo"),
        ("-hff", "--hf-file"),
        ("-hft", "--hf-token"),
        ("-pg", "--pg"),
        ("-ub", "--ubatch-size"),
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
        ("-ngl", "--n-gpu-layers"),
        ("-ncmoe", "--n-cpu-moe"),
        ("-sm", "--split-mode"),
        ("-mg", "--main-gpu"),
        ("-nkvo", "--no-kv-offload"),
        ("-fa", "--flash-attn"),
        ("-dev", "--device"),
        ("-lm", "--load-mode"),
        ("-lzm", "--lazy-mode"),
        ("-embd", "--embeddings"),
        ("-ts", "--tensor-split"),
        ("-ot", "--override-tensor"),
        ("-nopo", "--no-op-offload"),
        ("-mmp", "--mmap"),
    ];

    #[test]
    fn every_flag_of_llama_benchs_usage_is_a_flag_of_minfer_bench() {
        use clap::Args;
        let command = BenchArgs::augment_args(clap::Command::new("bench"));
        let longs: Vec<String> = command
            .get_arguments()
            .flat_map(|a| {
                a.get_long_and_visible_aliases()
                    .into_iter()
                    .flatten()
                    .chain(a.get_all_aliases().into_iter().flatten())
            })
            .map(|l| format!("--{l}"))
            .collect();
        let shorts: Vec<String> = command
            .get_arguments()
            .filter_map(|a| a.get_short())
            .map(|c| format!("-{c}"))
            .collect();
        // Its long flags (llama-bench also reads `--n_prompt` as `--n-prompt`) and one-letter ones.
        for flag in [
            "--numa",
            "--repetitions",
            "--prio",
            "--delay",
            "--output",
            "--output-err",
            "--list-devices",
            "--verbose",
            "--progress",
            "--no-warmup",
            "--fit-target",
            "--fit-ctx",
            "--rpc",
            "--model",
            "--hf-repo",
            "--hf-file",
            "--hf-token",
            "--offline",
            "--n-prompt",
            "--n-gen",
            "--n-depth",
            "--batch-size",
            "--ubatch-size",
            "--cache-type-k",
            "--cache-type-v",
            "--threads",
            "--cpu-mask",
            "--cpu-strict",
            "--poll",
            "--n-gpu-layers",
            "--n-cpu-moe",
            "--split-mode",
            "--main-gpu",
            "--no-kv-offload",
            "--flash-attn",
            "--device",
            "--load-mode",
            "--lazy-mode",
            "--embeddings",
            "--tensor-split",
            "--override-tensor",
            "--no-op-offload",
            "--no-host",
            "--repack",
            "--version",
            "--n_prompt",
            "--batch_size",
            "--no_warmup",
        ] {
            assert!(longs.contains(&flag.to_string()), "{flag}");
        }
        for flag in ["-r", "-o", "-v", "-m", "-p", "-n", "-d", "-b", "-t", "-C"] {
            assert!(shorts.contains(&flag.to_string()), "{flag}");
        }
        for (dash, long) in LLAMA_BENCH_DASH_FLAGS {
            assert!(longs.contains(&long.to_string()), "{dash} -> {long}");
        }
    }

    #[test]
    fn the_older_mmap_flag_is_a_load_mode_not_a_model_name() {
        // `-mmp 0` arrives as `--mmap 0`: the weights read whole, the model untouched.
        let a = parse(&["-m", "m.gguf", "--mmap", "0"]).unwrap();
        assert_eq!(a.model_flag, [PathBuf::from("m.gguf")]);
        assert_eq!(a.llama_options().unwrap().load_mode, [LoadMode::None]);
        assert!(refusal(&["m.gguf", "--mmap", "2"]).contains("expected 0 or 1"));
    }

    #[test]
    fn each_parameter_minfer_cannot_honour_is_refused_by_its_flag_with_the_reason() {
        for (args, flag) in [
            (&["--flash-attn", "off"][..], "-fa off cannot be honoured"),
            (&["-C", "0xff"], "-C/--cpu-mask 0xff cannot be honoured"),
            (&["--cpu-strict", "1"], "--cpu-strict 1 cannot be honoured"),
            (&["--poll", "0"], "--poll 0 cannot be honoured"),
            (&["--n-cpu-moe", "4"], "-ncmoe/--n-cpu-moe 4 cannot be honoured"),
            (&["--split-mode", "row"], "-sm/--split-mode row cannot be honoured"),
            (&["--main-gpu", "1"], "-mg/--main-gpu 1 cannot be honoured"),
            (&["--no-kv-offload", "1"], "-nkvo/--no-kv-offload 1 cannot be honoured"),
            (&["--device", "CUDA0"], "-dev/--device CUDA0 cannot be honoured"),
            (
                &["--load-mode", "dio"],
                "-lm/--load-mode dio: minfer has no direct-I/O reader",
            ),
            (&["--lazy-mode", "on"], "-lzm/--lazy-mode on cannot be honoured"),
            (&["--embeddings", "1"], "-embd/--embeddings 1 cannot be honoured"),
            (&["--tensor-split", "1/1"], "-ts/--tensor-split 1/1 cannot be honoured"),
            (
                &["--override-tensor", "exps=CPU"],
                "-ot/--override-tensor exps=CPU cannot be honoured",
            ),
            (&["--no-op-offload", "1"], "-nopo/--no-op-offload 1 cannot be honoured"),
            (&["--no-host", "1"], "--no-host 1 cannot be honoured"),
            (&["--repack", "0"], "--repack 0 cannot be honoured"),
            (&["--fit-target", "512"], "-fitt/--fit-target 512 cannot be honoured"),
            (&["--fit-ctx", "4096"], "-fitc/--fit-ctx 4096 cannot be honoured"),
            (&["--rpc", "host:50052"], "-rpc/--rpc host:50052 cannot be honoured"),
            (&["--numa", "distribute"], "--numa distribute cannot be honoured"),
            (&["--prio", "2"], "--prio 2 cannot be honoured"),
            (&["--list-devices"], "--list-devices is not supported"),
            (&["--hf-file", "x.gguf"], "-hff/--hf-file x.gguf cannot be honoured"),
            (&["--offline"], "--offline cannot be honoured"),
            (
                &["--cache-type-k", "q4_0"],
                "-ctk/--cache-type-k q4_0 cannot be honoured",
            ),
        ] {
            let mut all = vec!["m.gguf"];
            all.extend(args);
            let err = refusal(&all);
            assert!(err.contains(flag), "{args:?}: {err}");
        }
        // llama-bench's defaults, given explicitly, are what minfer does.
        let defaults = [
            "m.gguf",
            "-C",
            "0x0",
            "--cpu-strict",
            "0",
            "--poll",
            "50",
            "--n-cpu-moe",
            "0",
            "--split-mode",
            "layer",
            "--main-gpu",
            "0",
            "--no-kv-offload",
            "0",
            "--lazy-mode",
            "auto",
            "--embeddings",
            "0",
            "--tensor-split",
            "0",
            "--no-op-offload",
            "0",
            "--no-host",
            "0",
            "--repack",
            "1",
            "--fit-target",
            "0",
            "--fit-ctx",
            "0",
            "--prio",
            "0",
        ];
        assert!(parse(&defaults).unwrap().llama_options().is_ok());
    }
}
