//! `minfer bench`: prompt-processing and generation throughput in llama-bench's terms, so the
//! two engines can be compared row by row and llama-bench's scripts read our rows.
//!
//! A `pp<N>` test evaluates a batch of N random tokens from an empty context in one call; a
//! `tg<N>` test starts from an empty context and generates N tokens one at a time (each the
//! next random token, so no sampling is timed). Each test runs once to warm up (the whole prompt
//! for pp, one token for tg, as llama-bench does) and then `repetitions` timed times. The runs
//! are nested as llama-bench nests them (`-ngl`, `-lm`, `-dev`, `-b`, `-ub`, `-ctk`, `-ctv`,
//! `-fa`, `-t`, `-d`, then the pp, tg and pg tests), so the rows come in its order.
//!
//! The rows are written as llama-bench writes them ([`LLAMA_BENCH_FIELDS`]: the same 42 fields
//! in the same order, typed and quoted as it types and quotes them, in CSV, JSON, JSON lines,
//! SQL and its markdown table), minfer's own fields after them. This module measures and
//! formats; it prints nothing itself but the progress lines `--progress` and `-v` ask for, on
//! standard error.

mod model_info;
mod output;

pub use model_info::*;
pub use output::*;

use super::run::{load, LoadOptions, RunError};
use minfer::engine::profile::{ProfileObserver, ProfileRecorder};
use minfer::engine::{eval_preparing, EngineError, GenerateOptions, Sequence, Session};
use minfer::gguf::GgufFile;
use minfer::grammar::{Grammar, GrammarError};
use minfer::graph::DType;
use minfer::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Every `-p` and `-n` is 0.
    #[error("nothing to measure: every prompt size (-p) and generation length (-n) is 0")]
    NoTests,
    /// A `-t` of 0.
    #[error("the thread count must be at least 1")]
    ZeroThreads,
    /// `-r 0`.
    #[error("the repetition count (-r) must be at least 1")]
    ZeroRepetitions,
    /// A `-b` or `-ub` of 0.
    #[error("-b and -ub must be at least 1 (got {flag} 0)")]
    ZeroBatch {
        /// The flag given 0.
        flag: &'static str,
    },
    /// The largest test does not fit in the model's training context.
    #[error("a test needs {needed} tokens of context, more than the model's {n_ctx_train}")]
    ContextTooLarge {
        /// Tokens the largest test needs.
        needed: usize,
        /// The model's training context.
        n_ctx_train: usize,
    },
    /// Loading the model failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// An evaluation failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The `--json-schema` or `--grammar` does not compile.
    #[error("the grammar cannot be used: {0}")]
    Grammar(#[from] GrammarError),
    /// A result could not be written.
    #[error("cannot write the results: {0}")]
    Write(#[from] std::io::Error),
    /// A device could not measure its memory's bandwidth.
    #[error("measuring the bandwidth: {0}")]
    Measure(String),
}

/// How the weights are read (llama-bench's `-lm`, `load_mode`; its older `-mmp 0|1` is `none`
/// or `mmap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadMode {
    /// llama.cpp's default: mapped where the system can map (minfer always can).
    Auto,
    /// Read into memory, not mapped.
    None,
    /// Mapped.
    Mmap,
    /// Read into memory and locked there.
    Mlock,
    /// Mapped and locked.
    MmapMlock,
}

impl LoadMode {
    /// llama.cpp's name for it (`llama_load_mode_name`), the `load_mode` field.
    pub fn name(self) -> &'static str {
        match self {
            LoadMode::Auto => "auto",
            LoadMode::None => "none",
            LoadMode::Mmap => "mmap",
            LoadMode::Mlock => "mlock",
            LoadMode::MmapMlock => "mmap+mlock",
        }
    }

    /// The mode llama-bench's `-lm` names `name`, or why minfer cannot read a model that way.
    pub fn parse(name: &str) -> Result<Self, String> {
        Ok(match name {
            "auto" => LoadMode::Auto,
            "none" => LoadMode::None,
            "mmap" => LoadMode::Mmap,
            "mlock" => LoadMode::Mlock,
            "mmap+mlock" => LoadMode::MmapMlock,
            "dio" => return Err("minfer has no direct-I/O reader: use none, mmap, mlock or mmap+mlock".into()),
            other => {
                return Err(format!(
                    "'{other}' is not a load mode: auto, none, mmap, mlock, mmap+mlock or dio"
                ))
            }
        })
    }

    fn open_options(self) -> minfer::gguf::OpenOptions {
        minfer::gguf::OpenOptions {
            no_mmap: matches!(self, LoadMode::None | LoadMode::Mlock),
            mlock: matches!(self, LoadMode::Mlock | LoadMode::MmapMlock),
        }
    }
}

/// Which devices run the model (llama-bench's `-dev`, `devices`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Devices {
    /// Every usable one, as `--backend` and `MINFER_BACKENDS` allow (llama-bench's default).
    Auto,
    /// None but the CPU.
    None,
}

impl Devices {
    /// llama-bench's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Devices::Auto => "auto",
            Devices::None => "none",
        }
    }
}

/// What to measure. Sizes of 0 are skipped, as in llama-bench. Each list is one of
/// llama-bench's parameters: every combination of their values is a run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Prompt sizes (`-p`): one `pp` test each.
    pub n_prompt: Vec<usize>,
    /// Generation lengths (`-n`): one `tg` test each.
    pub n_gen: Vec<usize>,
    /// Prompt-then-generation pairs (`-pg P,N`): one `ppP+tgN` test each, timed as a whole.
    pub pg: Vec<(usize, usize)>,
    /// Context depths (`-d`): every test runs once per depth, after that many tokens were
    /// evaluated untimed.
    pub n_depth: Vec<usize>,
    /// Most prompt tokens one evaluation is given (`-b`, llama-bench's default 2048).
    pub n_batch: Vec<usize>,
    /// Prompt tokens per forward pass (`-ub`, llama-bench's default 512); a prompt is read in
    /// passes of the smaller of this and `-b`.
    pub n_ubatch: Vec<usize>,
    /// KV cache element types of K (`-ctk`, f16 by default).
    pub type_k: Vec<DType>,
    /// KV cache element types of V (`-ctv`).
    pub type_v: Vec<DType>,
    /// Flash attention as asked (`-fa`): -1 auto, 1 on (minfer's attention is always the fused
    /// kernel, so off is refused before this).
    pub flash_attn: Vec<i32>,
    /// How the weights are read (`-lm`).
    pub load_mode: Vec<LoadMode>,
    /// Which devices take part (`-dev`).
    pub devices: Vec<Devices>,
    /// Thread counts (`-t`).
    pub n_threads: Vec<usize>,
    /// Timed runs per test, after one warm-up run.
    pub repetitions: usize,
    /// Whether each test runs once untimed first (`--no-warmup` turns it off).
    pub warmup: bool,
    /// A pause before each test, to cool off (`--delay`).
    pub delay: Duration,
    /// Print a line on standard error as each test starts and runs (`--progress`).
    pub progress: bool,
    /// Also say on standard error what each load gave (`-v`).
    pub verbose: bool,
    /// `--backend`, as for `minfer MODEL`.
    pub backend: Option<String>,
    /// Layers on the GPU as asked (`-ngl`, a list): one run of every test per value; a negative
    /// value (llama-bench's default -1) runs every layer on the highest-priority backend.
    pub n_gpu_layers: Vec<i64>,
    /// Seed of the random token ids.
    pub seed: u64,
    /// Also measure the memory read bandwidth at each thread count, and with it the bound it
    /// puts on generation (`--bandwidth`).
    pub bandwidth: bool,
    /// Also measure what handing a node to the CPU thread pool costs at each thread count
    /// (`--handoff`).
    pub handoff: bool,
    /// A grammar (`--json-schema`, `--grammar`) whose cost to measure: each test that generates
    /// then runs twice, sampling each token (llama.cpp's default chain) without and with the
    /// grammar's mask, in place of llama-bench's random tokens.
    pub grammar: Option<minfer::grammar::GrammarSpec>,
    /// Also time every node of the timed runs and report where each test's time went
    /// (`--profile`): by op kind, weight matrix and layer.
    pub profile: bool,
}

impl Default for BenchOptions {
    /// llama-bench's defaults.
    fn default() -> Self {
        BenchOptions {
            n_prompt: vec![512],
            n_gen: vec![128],
            pg: Vec::new(),
            n_depth: vec![0],
            n_batch: vec![2048],
            n_ubatch: vec![minfer::engine::PREFILL_CHUNK],
            type_k: vec![DType::F16],
            type_v: vec![DType::F16],
            flash_attn: vec![-1],
            load_mode: vec![LoadMode::Auto],
            devices: vec![Devices::Auto],
            n_threads: vec![minfer::engine::default_threads()],
            repetitions: 5,
            warmup: true,
            delay: Duration::ZERO,
            progress: false,
            verbose: false,
            backend: None,
            n_gpu_layers: vec![-1],
            seed: 1,
            bandwidth: false,
            handoff: false,
            grammar: None,
            profile: false,
        }
    }
}

/// One run's parameters but the test: one value of each of `BenchOptions`' lists but the
/// depths, in llama-bench's nesting.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    n_gpu_layers: i64,
    load_mode: LoadMode,
    devices: Devices,
    n_batch: usize,
    n_ubatch: usize,
    type_k: DType,
    type_v: DType,
    flash_attn: i32,
    n_threads: usize,
}

impl Config {
    /// What the model is loaded with: a change reloads it (minfer's thread count is the
    /// model's).
    fn model_key(&self) -> (i64, LoadMode, Devices, usize) {
        (self.n_gpu_layers, self.load_mode, self.devices, self.n_threads)
    }

    /// What the session is opened with: a change opens a new one over the same model.
    fn session_key(&self) -> (usize, usize, DType, DType) {
        (self.n_batch, self.n_ubatch, self.type_k, self.type_v)
    }

    /// Prompt tokens per forward pass: llama.cpp splits each `-b` batch into passes of `-ub`.
    fn pass(&self) -> usize {
        self.n_batch.min(self.n_ubatch)
    }
}

/// Every [`Config`] of `options`, nested as llama-bench nests its parameters (the first
/// outermost), so that the rows come in its order.
fn configs(options: &BenchOptions) -> Vec<Config> {
    let mut out = vec![Config {
        n_gpu_layers: -1,
        load_mode: LoadMode::Auto,
        devices: Devices::Auto,
        n_batch: 2048,
        n_ubatch: minfer::engine::PREFILL_CHUNK,
        type_k: DType::F16,
        type_v: DType::F16,
        flash_attn: -1,
        n_threads: 1,
    }];
    fn expand<T: Copy>(out: Vec<Config>, values: &[T], set: impl Fn(&mut Config, T)) -> Vec<Config> {
        if values.is_empty() {
            return out;
        }
        let set = &set;
        out.into_iter()
            .flat_map(|c| {
                values.iter().map(move |&v| {
                    let mut c = c;
                    set(&mut c, v);
                    c
                })
            })
            .collect()
    }
    out = expand(out, &options.n_gpu_layers, |c, v| c.n_gpu_layers = v);
    out = expand(out, &options.load_mode, |c, v| c.load_mode = v);
    out = expand(out, &options.devices, |c, v| c.devices = v);
    out = expand(out, &options.n_batch, |c, v| c.n_batch = v);
    out = expand(out, &options.n_ubatch, |c, v| c.n_ubatch = v);
    out = expand(out, &options.type_k, |c, v| c.type_k = v);
    out = expand(out, &options.type_v, |c, v| c.type_v = v);
    out = expand(out, &options.flash_attn, |c, v| c.flash_attn = v);
    out = expand(out, &options.n_threads, |c, v| c.n_threads = v);
    out
}

/// One row: one test of one run. Its first 42 fields are llama-bench's
/// ([`BenchResult::llama_values`]); the rest are minfer's ([`BenchResult::extras`]).
#[derive(Clone, Debug)]
pub struct BenchResult {
    /// `minfer` and the crate version minfer was built as (llama-bench: its commit).
    pub build_commit: String,
    /// The CPU's model name.
    pub cpu_info: String,
    /// The GPU's name when one took part (empty otherwise).
    pub gpu_info: String,
    /// The GPU backends taking part, comma-separated, or `CPU` when none did (llama-bench's
    /// `backends`: the backends it has besides the CPU's).
    pub backends: String,
    /// The model's path.
    pub model_filename: String,
    /// `{architecture} {size} {file type}`, as llama.cpp describes a model ([`model_type`]).
    pub model_type: String,
    /// Bytes of all tensors.
    pub model_size: u64,
    /// Elements of all tensors.
    pub model_n_params: u64,
    /// Most prompt tokens one evaluation is given (`-b`).
    pub n_batch: usize,
    /// Prompt tokens per forward pass (`-ub`), as asked (passes are of the smaller of this and
    /// `n_batch`, as in llama.cpp).
    pub n_ubatch: usize,
    /// CPU threads of the test.
    pub n_threads: usize,
    /// KV cache element type of K (`f16`, llama-bench's default).
    pub type_k: String,
    /// KV cache element type of V (`f16`).
    pub type_v: String,
    /// Layers on the GPU as asked (`-ngl`): -1, llama-bench's default, for every layer.
    pub n_gpu_layers: i64,
    /// Flash attention as asked (`-fa`): -1 auto, 1 on.
    pub flash_attn: i32,
    /// The devices asked for (`-dev`): `auto` or `none`.
    pub devices: String,
    /// How the weights were read (`-lm`).
    pub load_mode: String,
    /// Prompt tokens of a prompt-processing test (0 for a generation test).
    pub n_prompt: usize,
    /// Tokens of a generation test (0 for a prompt-processing test).
    pub n_gen: usize,
    /// Tokens already in the context when the test starts (`-d`).
    pub n_depth: usize,
    /// When the test started, ISO 8601 UTC.
    pub test_time: String,
    /// Mean time of a repetition, in nanoseconds.
    pub avg_ns: u64,
    /// Standard deviation of the repetitions' times, in nanoseconds.
    pub stddev_ns: u64,
    /// Mean speed over the repetitions, tokens per second.
    pub avg_ts: f64,
    /// Standard deviation of the repetitions' speeds.
    pub stddev_ts: f64,
    /// Each repetition's time, in nanoseconds.
    pub samples_ns: Vec<u64>,
    /// Each repetition's speed, tokens per second.
    pub samples_ts: Vec<f64>,
    /// The process's peak resident memory when the test ended (`VmHWM`), if the system says.
    pub peak_rss_bytes: Option<u64>,
    /// With `--bandwidth`: the memory read bandwidth at this thread count, in GB/s ...
    pub mem_read_gbs: Option<f64>,
    /// With `--bandwidth` and every layer on a GPU: the device memory's copy bandwidth (bytes
    /// read plus written per second), GB/s, which then bounds generation instead of the host's.
    pub device_copy_gbs: Option<f64>,
    /// ... the bytes of weights a generated token reads ...
    pub weight_bytes_per_token: Option<u64>,
    /// ... and the generation rate that bandwidth allows, tokens/s.
    pub gen_bound_ts: Option<f64>,
    /// The CPU kernels that multiplied the weights in this test, by weight type: e.g.
    /// `avx512-vnni gemm (Q4_K, Q6_K)` (empty when no CPU backend took part).
    pub kernels: String,
    /// The decoding kernel chosen for each quantized weight type of the model on this CPU, and
    /// why ([`kernel_choices`]; empty when no CPU backend took part).
    pub kernel_choices: Vec<String>,
    /// With `--handoff`: what one node's hand-off to the thread pool costs at this thread count.
    pub handoff: Option<Handoff>,
    /// How the generated tokens were chosen: empty for llama-bench's random tokens, `sampled`,
    /// or `constrained` (sampled under the `--json-schema` or `--grammar` mask).
    pub generation: String,
    /// With `--profile`: where the timed runs' time went.
    pub profile: Option<minfer::engine::profile::Profile>,
}

/// What handing one node to the CPU thread pool costs (publish the job, every worker runs it,
/// the caller waits for all): the time of a pool run whose job does nothing.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Handoff {
    /// Nanoseconds per run, runs back to back (the workers are still spinning).
    pub back_to_back_ns: f64,
    /// Nanoseconds per run after 100 µs of serial work on the caller (about a decode step's
    /// longest gap between two parallel nodes; the workers are still spinning), the pause itself
    /// not counted.
    pub after_pause_ns: f64,
    /// Nanoseconds per run after a pause longer than the workers' spin: they have parked and
    /// must be woken.
    pub parked_ns: f64,
}

/// Measures [`Handoff`] on a fresh pool of `n_threads` threads (its default spin).
pub fn measure_handoff(n_threads: usize) -> Handoff {
    use minfer::backends::cpu::pool::ThreadPool;
    use std::time::{Duration, Instant};
    let pool = ThreadPool::new(n_threads);
    let job = |i: usize, n: usize| {
        std::hint::black_box((i, n));
    };
    for _ in 0..1000 {
        pool.run(job);
    }
    const RUNS: u32 = 20_000;
    let start = Instant::now();
    for _ in 0..RUNS {
        pool.run(job);
    }
    let back_to_back_ns = start.elapsed().as_nanos() as f64 / f64::from(RUNS);
    // Serial work on the caller (a spin: sleeping would hand the core to the workers), then one
    // timed run.
    let after = |pause: Duration, runs: u32| {
        let mut total = Duration::ZERO;
        for _ in 0..runs {
            let until = Instant::now() + pause;
            while Instant::now() < until {
                std::hint::spin_loop();
            }
            let start = Instant::now();
            pool.run(job);
            total += start.elapsed();
        }
        total.as_nanos() as f64 / f64::from(runs)
    };
    Handoff {
        back_to_back_ns,
        after_pause_ns: after(Duration::from_micros(100), 500),
        parked_ns: after(pool.spin() + Duration::from_micros(100), 100),
    }
}

impl BenchResult {
    /// `pp512`, `tg128`, or `pp512+tg128`, with ` @ d512` at a depth, as llama-bench names tests.
    pub fn test_name(&self) -> String {
        let test = match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, n) => format!("tg{n}"),
            (p, n) => format!("pp{p}+tg{n}"),
        };
        let test = match self.n_depth {
            0 => test,
            d => format!("{test} @ d{d}"),
        };
        match self.generation.as_str() {
            "" => test,
            how => format!("{test} {how}"),
        }
    }

    fn new(model: &ModelInfo, config: &Config, n_prompt: usize, n_gen: usize, test_time: String) -> Self {
        BenchResult {
            build_commit: format!("minfer {}", env!("CARGO_PKG_VERSION")),
            cpu_info: model.cpu_info.clone(),
            gpu_info: model.gpu_info.clone(),
            backends: model.backends.clone(),
            model_filename: model.filename.clone(),
            model_type: model.model_type.clone(),
            model_size: model.size,
            model_n_params: model.n_params,
            n_batch: config.n_batch,
            n_ubatch: config.n_ubatch,
            n_threads: config.n_threads,
            type_k: kv_type_name(config.type_k).into(),
            type_v: kv_type_name(config.type_v).into(),
            n_gpu_layers: config.n_gpu_layers,
            flash_attn: config.flash_attn,
            devices: config.devices.name().into(),
            load_mode: config.load_mode.name().into(),
            n_prompt,
            n_gen,
            n_depth: 0,
            test_time,
            avg_ns: 0,
            stddev_ns: 0,
            avg_ts: 0.0,
            stddev_ts: 0.0,
            samples_ns: Vec::new(),
            samples_ts: Vec::new(),
            peak_rss_bytes: None,
            mem_read_gbs: None,
            device_copy_gbs: None,
            weight_bytes_per_token: None,
            gen_bound_ts: None,
            kernels: String::new(),
            kernel_choices: Vec::new(),
            handoff: None,
            generation: String::new(),
            profile: None,
        }
    }

    /// Fill the statistics from the timed runs, as llama-bench computes them: tokens per second
    /// per run, then the mean and sample standard deviation of those.
    fn set_samples(&mut self, samples_ns: Vec<u64>) {
        let n_tokens = (self.n_prompt + self.n_gen) as f64;
        self.samples_ts = samples_ns.iter().map(|&ns| 1e9 * n_tokens / ns.max(1) as f64).collect();
        let ns: Vec<f64> = samples_ns.iter().map(|&ns| ns as f64).collect();
        self.avg_ns = mean(&ns) as u64;
        self.stddev_ns = stddev(&ns) as u64;
        self.avg_ts = mean(&self.samples_ts);
        self.stddev_ts = stddev(&self.samples_ts);
        self.samples_ns = samples_ns;
    }

    /// The values of [`LLAMA_BENCH_FIELDS`], as llama-bench's `test::get_values` writes them:
    /// integers in decimal, booleans as 0 or 1, rates with six decimals. The parameters minfer
    /// takes only at llama-bench's default value (`bench.rs` refuses any other) are written as
    /// that default.
    pub fn llama_values(&self) -> [String; 42] {
        let b = |v: bool| u8::from(v).to_string();
        [
            self.build_commit.clone(),
            BUILD_NUMBER.to_string(),
            self.cpu_info.clone(),
            self.gpu_info.clone(),
            self.backends.clone(),
            self.model_filename.clone(),
            self.model_type.clone(),
            self.model_size.to_string(),
            self.model_n_params.to_string(),
            self.n_batch.to_string(),
            self.n_ubatch.to_string(),
            self.n_threads.to_string(),
            // cpu_mask, cpu_strict, poll: minfer does not pin or tune its threads.
            "0x0".into(),
            b(false),
            "50".into(),
            self.type_k.clone(),
            self.type_v.clone(),
            self.n_gpu_layers.to_string(),
            // n_cpu_moe, split_mode, main_gpu, no_kv_offload: one device holds each layer whole.
            "0".into(),
            "layer".into(),
            "0".into(),
            b(false),
            self.flash_attn.to_string(),
            self.devices.clone(),
            // tensor_split, tensor_buft_overrides: as above.
            "0.00".into(),
            "none".into(),
            self.load_mode.clone(),
            // lazy_mode, embeddings, no_op_offload, no_host, repack, fit_target, fit_min_ctx.
            "auto".into(),
            b(false),
            "0".into(),
            b(false),
            b(true),
            "0".into(),
            "0".into(),
            self.n_prompt.to_string(),
            self.n_gen.to_string(),
            self.n_depth.to_string(),
            self.test_time.clone(),
            self.avg_ns.to_string(),
            self.stddev_ns.to_string(),
            format!("{:.6}", self.avg_ts),
            format!("{:.6}", self.stddev_ts),
        ]
    }

    /// minfer's fields, after llama-bench's (and after `samples_ns` and `samples_ts` in JSON):
    /// the peak resident memory and the kernels always, the rest when measured or chosen.
    pub fn extras(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::{json, Value};
        let mut out = vec![
            ("peak_rss_bytes", json!(self.peak_rss_bytes)),
            ("kernels", json!(self.kernels)),
        ];
        let mut some = |name: &'static str, v: Option<Value>| {
            if let Some(v) = v {
                out.push((name, v));
            }
        };
        some("mem_read_gbs", self.mem_read_gbs.map(|v| json!(v)));
        some("device_copy_gbs", self.device_copy_gbs.map(|v| json!(v)));
        some("weight_bytes_per_token", self.weight_bytes_per_token.map(|v| json!(v)));
        some("gen_bound_ts", self.gen_bound_ts.map(|v| json!(v)));
        some(
            "kernel_choices",
            (!self.kernel_choices.is_empty()).then(|| json!(self.kernel_choices)),
        );
        some("handoff", self.handoff.map(|h| json!(h)));
        some(
            "generation",
            (!self.generation.is_empty()).then(|| json!(self.generation)),
        );
        some("profile", self.profile.as_ref().map(|p| json!(p)));
        out
    }
}

/// llama-bench's `build_number` (the commit count of its checkout); minfer has none, and says 0.
pub const BUILD_NUMBER: u32 = 0;

/// ggml's name of a KV cache type (`ggml_type_name`): `f16`, `q8_0`, `f32`.
fn kv_type_name(t: DType) -> &'static str {
    match t {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Q8_0 => "q8_0",
        DType::I32 => "i32",
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// The sample standard deviation (n - 1), 0 for fewer than two values; llama-bench's formula.
fn stddev(v: &[f64]) -> f64 {
    if v.len() <= 1 {
        return 0.0;
    }
    let n = v.len() as f64;
    let m = mean(v);
    let sq: f64 = v.iter().map(|x| x * x).sum();
    (sq / (n - 1.0) - m * m * n / (n - 1.0)).max(0.0).sqrt()
}

fn cpu_name() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|v| v.trim().to_string())
}

/// The process's peak resident set size (`VmHWM` in /proc/self/status), in bytes.
pub fn peak_rss_bytes() -> Option<u64> {
    parse_vm_hwm(&std::fs::read_to_string("/proc/self/status").ok()?)
}

fn parse_vm_hwm(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let mut parts = line["VmHWM:".len()..].split_whitespace();
    let value: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some("kB") => value.checked_mul(1024),
        _ => None,
    }
}

/// Seeded xorshift64 for the token ids (llama-bench draws them with `std::rand`).
struct TokenRng(u64);

impl TokenRng {
    fn token(&mut self, n_vocab: usize) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n_vocab as u64) as u32
    }
}

/// The first token of a sequence: BOS if the model wants one, else a random id.
fn first_token(bos: Option<u32>, rng: &mut TokenRng, n_vocab: usize) -> u32 {
    bos.unwrap_or_else(|| rng.token(n_vocab))
}

/// What stays loaded from one run to the next: the model and its session, and what was read
/// off them.
struct Held {
    config: Config,
    loaded: super::run::Loaded,
    info: ModelInfo,
    per_token: u64,
    device_gbs: Option<f64>,
    grammar: Option<Grammar>,
}

/// Run every test of `options` on the model at `path`, calling `on_result` with each row as it
/// completes, and return all rows.
pub fn run_bench(
    path: &Path,
    options: &BenchOptions,
    mut on_result: impl FnMut(&BenchResult) -> std::io::Result<()>,
) -> Result<Vec<BenchResult>, BenchError> {
    let prompts: Vec<usize> = options.n_prompt.iter().copied().filter(|&p| p > 0).collect();
    let gens: Vec<usize> = options.n_gen.iter().copied().filter(|&n| n > 0).collect();
    let pairs: Vec<(usize, usize)> = options.pg.iter().copied().filter(|&(p, n)| p + n > 0).collect();
    if prompts.is_empty() && gens.is_empty() && pairs.is_empty() {
        return Err(BenchError::NoTests);
    }
    if options.n_threads.contains(&0) {
        return Err(BenchError::ZeroThreads);
    }
    if options.repetitions == 0 {
        return Err(BenchError::ZeroRepetitions);
    }
    for (flag, sizes) in [("-b", &options.n_batch), ("-ub", &options.n_ubatch)] {
        if sizes.contains(&0) {
            return Err(BenchError::ZeroBatch { flag });
        }
    }
    let depths: &[usize] = if options.n_depth.is_empty() {
        &[0]
    } else {
        &options.n_depth
    };
    let longest = prompts
        .iter()
        .chain(&gens)
        .copied()
        .chain(pairs.iter().map(|&(p, n)| p + n));
    let needed = longest.max().unwrap_or(1) + depths.iter().copied().max().unwrap_or(0);
    let tests: Vec<(usize, usize)> = prompts
        .iter()
        .map(|&p| (p, 0))
        .chain(gens.iter().map(|&n| (0, n)))
        .chain(pairs.iter().copied())
        .collect();
    let configs = configs(options);
    // With a grammar, each generating test runs twice (sampled, then constrained).
    let n_modes = if options.grammar.is_some() { 2 } else { 1 };
    let per_depth: usize = tests.iter().map(|&(_, n)| if n == 0 { 1 } else { n_modes }).sum();
    let n_rows = configs.len() * depths.len() * per_depth;
    let mut rng = TokenRng(options.seed.max(1));
    let mut results = Vec::new();
    // A GPU's copy bandwidth, measured once for the process (at the first test held to it).
    let mut device_bandwidth: Option<Option<f64>> = None;
    let mut current: Option<Held> = None;
    for config in configs {
        let session_options = minfer::engine::SessionOptions {
            n_ctx: needed,
            n_ubatch: Some(config.pass()),
            type_k: config.type_k,
            type_v: config.type_v,
            ..Default::default()
        };
        match &mut current {
            // The same model, another cache or pass size: a new session over it.
            Some(c) if c.config.model_key() == config.model_key() => {
                if c.config.session_key() != config.session_key() {
                    c.loaded.session = Session::with_options(&c.loaded.model, &session_options)?;
                }
                c.config = config;
            }
            _ => {
                // Dropped first, so that two models are never held at once.
                drop(current.take());
                let load_options = LoadOptions {
                    model: minfer::engine::ModelOptions {
                        n_threads: Some(config.n_threads),
                        backend: match config.devices {
                            Devices::Auto => options.backend.clone(),
                            Devices::None => Some("cpu".into()),
                        },
                        n_gpu_layers: usize::try_from(config.n_gpu_layers).ok(),
                        open: config.load_mode.open_options(),
                        ..Default::default()
                    },
                    session: session_options,
                };
                let loaded = load(path, &load_options)?;
                let info = ModelInfo::new(path, &loaded.model);
                if options.verbose {
                    eprintln!(
                        "minfer bench: loaded {} ({}) on {}, {} threads, -ngl {}, load mode {}",
                        info.filename,
                        info.model_type,
                        info.backends,
                        config.n_threads,
                        config.n_gpu_layers,
                        config.load_mode.name()
                    );
                }
                // Every layer and the head on a GPU: its memory bounds generation, not the host's.
                let device_gbs = if options.bandwidth && info.all_on_gpu {
                    *device_bandwidth.get_or_insert_with(|| {
                        device_copy_bandwidth(&loaded.model).unwrap_or_else(|e| {
                            eprintln!("bench: {e}; generation is held to the host's bandwidth instead");
                            None
                        })
                    })
                } else {
                    None
                };
                let grammar = match &options.grammar {
                    Some(spec) => Some(loaded.model.compile_grammar(spec)?),
                    None => None,
                };
                current = Some(Held {
                    config,
                    per_token: weight_bytes_per_token(loaded.model.file()),
                    loaded,
                    info,
                    device_gbs,
                    grammar,
                });
            }
        }
        let Some(Held {
            loaded,
            info,
            per_token,
            device_gbs,
            grammar,
            ..
        }) = &mut current
        else {
            unreachable!("a model was loaded above");
        };
        let n_ctx_train = loaded.session.model().hparams().n_ctx_train;
        if loaded.session.n_ctx() < needed {
            return Err(BenchError::ContextTooLarge { needed, n_ctx_train });
        }
        let n_vocab = loaded.session.model().hparams().n_vocab;
        let tokenizer = loaded.model.tokenizer();
        let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
        let session = &mut loaded.session;
        // With a grammar, each generating test runs sampled, then sampled under the grammar.
        let modes: Vec<Option<Generation>> = match grammar {
            None => vec![None],
            Some(g) => vec![Some(Generation::Sampled), Some(Generation::Constrained(g))],
        };
        let runs = depths
            .iter()
            .flat_map(|d| tests.iter().map(move |t| (d, t)))
            .flat_map(|(d, &(p, n))| {
                let modes = if n == 0 { &modes[..1] } else { &modes[..] };
                modes
                    .iter()
                    .map(move |m| (d, p, n, if n == 0 { None } else { m.clone() }))
            });
        for (&n_depth, n_prompt, n_gen, generation) in runs {
            let row = results.len() + 1;
            let progress = |what: &str| {
                if options.progress {
                    eprintln!("minfer bench: benchmark {row}/{n_rows}: {what}");
                }
            };
            progress("starting");
            // Cool off before the test, as llama-bench's --delay does.
            std::thread::sleep(options.delay);
            let mut result = BenchResult::new(info, &config, n_prompt, n_gen, utc_now());
            result.generation = generation.as_ref().map_or("", Generation::name).to_string();
            result.n_depth = n_depth;
            if info.uses_cpu {
                // A prompt is read in passes of `pass` tokens; generation one token a step.
                result.kernels = cpu_kernels(&loaded.model, n_prompt.min(config.pass()).max(1));
                result.kernel_choices = kernel_choices(loaded.model.file());
            }
            let mut samples = Vec::with_capacity(options.repetitions);
            let recorder = options.profile.then(ProfileRecorder::shared);
            let first = if options.warmup { 0 } else { 1 };
            for rep in first..=options.repetitions {
                let warm_up = rep == 0;
                progress(&if warm_up {
                    "warmup run".to_string()
                } else {
                    format!("run {rep}/{}", options.repetitions)
                });
                if let (Some(recorder), 1) = (&recorder, rep) {
                    session.add_step_observer(Box::new(ProfileObserver(Arc::clone(recorder))));
                }
                let test = Test {
                    n_depth,
                    n_prompt,
                    // The warm-up generates one token: enough to build every graph shape.
                    n_gen: if warm_up { n_gen.min(1) } else { n_gen },
                };
                let ns = time_test(session, test, bos, &mut rng, n_vocab, tokenizer, generation.as_ref())?;
                if !warm_up {
                    samples.push(ns);
                }
            }
            if let Some(recorder) = recorder {
                session.pop_step_observer();
                result.profile = Some(recorder.lock().unwrap_or_else(PoisonError::into_inner).profile());
            }
            result.set_samples(samples);
            result.peak_rss_bytes = peak_rss_bytes();
            if options.bandwidth {
                result.weight_bytes_per_token = Some(*per_token);
                result.device_copy_gbs = *device_gbs;
            }
            on_result(&result)?;
            results.push(result);
        }
    }
    if options.handoff {
        for &n_threads in &options.n_threads {
            let handoff = measure_handoff(n_threads);
            for r in results.iter_mut().filter(|r| r.n_threads == n_threads) {
                r.handoff = Some(handoff);
            }
        }
    }
    if options.bandwidth {
        // After every test, so that the buffer does not count in their peak RSS.
        for &n_threads in &options.n_threads {
            let gbs = host_bandwidth(n_threads)?;
            for r in results.iter_mut().filter(|r| r.n_threads == n_threads) {
                r.mem_read_gbs = Some(gbs);
                r.gen_bound_ts = r.weight_bytes_per_token.map(|b| gen_bound(b, gbs, r.device_copy_gbs));
            }
        }
    }
    Ok(results)
}

/// The CPU device's kernels for the matrices a token of `model` reads, as it names them
/// ([`BackendDevice::matmul_kernels`](minfer::graph::BackendDevice::matmul_kernels)).
fn cpu_kernels(model: &minfer::engine::Model, n_tokens: usize) -> String {
    let matrices: Vec<_> = tensors_read_per_token(model.file())
        .filter(|t| t.shape.len() == 2)
        .map(|t| (t.ggml_type, t.shape.clone()))
        .collect();
    model
        .backends()
        .devices()
        .iter()
        .find(|d| d.handle() == minfer::graph::Backend::CPU)
        .and_then(|cpu| cpu.matmul_kernels(&matrices, n_tokens))
        .unwrap_or_default()
}

/// Weights for a CPU device that only measures its memory.
struct NoWeights;

impl minfer::graph::TensorSource for NoWeights {
    fn weight(&self, _: &str) -> Option<minfer::graph::Weight<'_>> {
        None
    }
}

/// The host memory's bandwidth with `n_threads` threads, as the CPU device measures it
/// ([`BackendDevice::copy_bandwidth`](minfer::graph::BackendDevice::copy_bandwidth)), GB/s.
fn host_bandwidth(n_threads: usize) -> Result<f64, BenchError> {
    use minfer::graph::BackendDevice;
    let cpu = minfer::backends::cpu::CpuDevice::new(std::sync::Arc::new(NoWeights), n_threads);
    let gbs = cpu.copy_bandwidth().map_err(|e| BenchError::Measure(e.to_string()))?;
    Ok(gbs.unwrap_or(0.0))
}

/// The decoding kernel chosen on this CPU for each quantized weight type `file` multiplies,
/// and why (`quant::choice`): `Q6_K: avx2 (measured: avx512-repacked 11.2 GB/s, ...)`.
pub fn kernel_choices(file: &GgufFile) -> Vec<String> {
    let choices = minfer::quant::choice::choices();
    let mut types: Vec<minfer::quant::GgmlType> = Vec::new();
    for t in tensors_read_per_token(file).filter(|t| t.shape.len() == 2) {
        if !types.contains(&t.ggml_type) {
            types.push(t.ggml_type);
        }
    }
    types
        .iter()
        .filter_map(|&ty| choices.get(ty))
        .map(|c| format!("{}: {}", c.ty, c.describe()))
        .collect()
}

/// Every tensor a generated token reads whole: all but the token embedding table, of which it
/// reads one row (unless the table is also the output projection).
fn tensors_read_per_token(file: &GgufFile) -> impl Iterator<Item = &minfer::gguf::TensorInfo> {
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    file.tensors()
        .iter()
        .filter(move |t| tied || t.name != "token_embd.weight")
}

/// Bytes of weights one generated token reads: every tensor but an untied embedding table, and
/// of a mixture of experts' expert tensors only the used share (a token's chosen experts).
pub fn weight_bytes_per_token(file: &GgufFile) -> u64 {
    let arch = file.metadata().get_str("general.architecture").unwrap_or_default();
    let share = super::info::expert_share(file, arch);
    tensors_read_per_token(file)
        .map(|t| match share {
            Some((used, n)) if t.name.contains("_exps.") => (t.size as u128 * used as u128 / n as u128) as u64,
            _ => t.size,
        })
        .sum()
}

/// The generation rate, tokens/s, that `bytes` of weights per token allow: over the device's
/// copy bandwidth when every layer ran on one (`device_gbs`), else over the host's read
/// bandwidth (`host_gbs`), both GB/s.
fn gen_bound(bytes: u64, host_gbs: f64, device_gbs: Option<f64>) -> f64 {
    device_gbs.unwrap_or(host_gbs) * 1e9 / bytes.max(1) as f64
}

/// The copy bandwidth of the first of `model`'s devices that measures its own memory (a GPU),
/// GB/s.
fn device_copy_bandwidth(model: &minfer::engine::Model) -> Result<Option<f64>, minfer::graph::BackendError> {
    // The host's is measured per thread count, after the tests.
    for device in model
        .backends()
        .devices()
        .iter()
        .filter(|d| d.handle() != minfer::graph::Backend::CPU)
    {
        if let Some(gbs) = device.copy_bandwidth()? {
            return Ok(Some(gbs));
        }
    }
    Ok(None)
}

/// One timed run: `n_depth` tokens evaluated untimed, then `n_prompt` tokens in one batch and
/// `n_gen` one at a time.
#[derive(Clone, Copy, Debug)]
struct Test {
    n_depth: usize,
    n_prompt: usize,
    n_gen: usize,
}

/// How a generating test chooses its tokens beyond llama-bench's random ones.
#[derive(Clone)]
enum Generation<'g> {
    /// Sampled from the logits with llama.cpp's default chain.
    Sampled,
    /// Sampled under the grammar's mask, which is computed while the forward pass runs.
    Constrained(&'g Grammar),
}

impl Generation<'_> {
    fn name(&self) -> &'static str {
        match self {
            Generation::Sampled => "sampled",
            Generation::Constrained(_) => "constrained",
        }
    }

    /// A fresh generation; a constrained one starts its grammar over whenever it completes, so
    /// that a test of any length measures the mask.
    fn sequence<'t>(&self, tokenizer: &'t Tokenizer) -> Result<Sequence<'t>, EngineError> {
        let options = GenerateOptions {
            max_tokens: usize::MAX,
            ignore_eos: matches!(self, Generation::Sampled),
            grammar: match self {
                Generation::Sampled => None,
                Generation::Constrained(g) => Some((*g).clone()),
            },
            ..GenerateOptions::default()
        };
        Sequence::new(tokenizer, &[], &options)
    }
}

/// Nanoseconds of `test`'s timed part, from an empty context; the tokens are random (the first
/// is BOS where the model adds one), or sampled after the first with `generation`.
fn time_test(
    session: &mut Session,
    test: Test,
    bos: Option<u32>,
    rng: &mut TokenRng,
    n_vocab: usize,
    tokenizer: &Tokenizer,
    generation: Option<&Generation>,
) -> Result<u64, EngineError> {
    session.reset();
    let mut first = Some(first_token(bos, rng, n_vocab));
    let mut batch = |n: usize, rng: &mut TokenRng| -> Vec<u32> {
        if n == 0 {
            return Vec::new();
        }
        let mut tokens: Vec<u32> = first.take().into_iter().collect();
        tokens.extend((tokens.len()..n).map(|_| rng.token(n_vocab)));
        tokens
    };
    // A prompt is read in passes of `n_ubatch` tokens, as llama.cpp reads it.
    let n_ubatch = session.n_ubatch();
    for chunk in batch(test.n_depth, rng).chunks(n_ubatch) {
        session.eval(chunk, 1)?;
    }
    let prompt = batch(test.n_prompt, rng);
    let mut token = batch(1, rng)[0];
    let mut sequence = generation.map(|g| g.sequence(tokenizer)).transpose()?;
    let start = Instant::now();
    for chunk in prompt.chunks(n_ubatch) {
        session.eval(chunk, 1)?;
    }
    for _ in 0..test.n_gen {
        let (Some(generation), Some(sequence)) = (generation, sequence.as_mut()) else {
            session.eval(&[token], 1)?;
            token = rng.token(n_vocab);
            continue;
        };
        eval_preparing(session, sequence, &[token])?;
        token = sequence.sample(session.last_logits()?)?;
        if sequence.accept(token).finished.is_some() {
            *sequence = generation.sequence(tokenizer)?;
        }
    }
    Ok(start.elapsed().as_nanos() as u64)
}

/// The current time as ISO 8601 UTC (`2025-01-31T12:00:00Z`).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    iso8601(secs)
}

fn iso8601(unix_secs: u64) -> String {
    let (days, rem) = (unix_secs / 86_400, unix_secs % 86_400);
    // Howard Hinnant's days-to-civil, for days since 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn a_token_reads_every_weight_but_the_untied_embedding_table() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let file = GgufFile::open(dir.join("tiny-qwen2-Q8_0.gguf")).unwrap();
        let all: u64 = file.tensors().iter().map(|t| t.size).sum();
        let embd = file
            .tensors()
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .unwrap()
            .size;
        let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
        let expected = if tied { all } else { all - embd };
        assert_eq!(weight_bytes_per_token(&file), expected);
        assert!(weight_bytes_per_token(&file) > 0);
    }

    #[test]
    fn a_token_reads_only_its_chosen_experts_share_of_the_expert_tensors() {
        // The tiny gpt-oss: 4 of 8 experts used, an untied head.
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let file = GgufFile::open(dir.join("tiny-gpt-oss-F32.gguf")).unwrap();
        let size = |pick: &dyn Fn(&str) -> bool| -> u64 {
            file.tensors().iter().filter(|t| pick(&t.name)).map(|t| t.size).sum()
        };
        let experts = size(&|n| n.contains("_exps."));
        let dense = size(&|n| !n.contains("_exps.") && n != "token_embd.weight");
        assert!(experts > 0 && experts.is_multiple_of(2));
        assert_eq!(weight_bytes_per_token(&file), dense + experts / 2);
    }

    pub(super) fn info() -> ModelInfo {
        ModelInfo {
            filename: "m.gguf".into(),
            model_type: "qwen2 1B Q4_K - Medium".into(),
            size: 391_868_160,
            n_params: 494_032_768,
            cpu_info: "AMD EPYC".into(),
            gpu_info: String::new(),
            backends: "CPU".into(),
            uses_cpu: true,
            all_on_gpu: false,
        }
    }

    pub(super) fn row(n_prompt: usize, n_gen: usize, samples_ns: Vec<u64>) -> BenchResult {
        let mut config = configs(&BenchOptions::default())[0];
        config.n_threads = 2;
        let mut r = BenchResult::new(&info(), &config, n_prompt, n_gen, iso8601(0));
        r.set_samples(samples_ns);
        r
    }

    #[test]
    fn statistics_are_llama_benchs_per_run_rates_with_the_sample_deviation() {
        // 64 tokens in 0.5 s, 0.25 s and 0.25 s: 128, 256 and 256 t/s.
        let r = row(0, 64, vec![500_000_000, 250_000_000, 250_000_000]);
        assert_eq!(r.samples_ts, vec![128.0, 256.0, 256.0]);
        assert!((r.avg_ts - 640.0 / 3.0).abs() < 1e-9);
        // Sample variance of {128, 256, 256}: mean 213.33, squares of deviations sum to 10922.67.
        assert!((r.stddev_ts - (10_922.666_666_666_666_f64 / 2.0).sqrt()).abs() < 1e-6);
        assert_eq!(r.avg_ns, 333_333_333);
        assert_eq!(r.stddev_ns, 144_337_567);
        assert_eq!(row(512, 0, vec![1_000_000_000]).stddev_ts, 0.0);
    }

    #[test]
    fn generation_is_bounded_by_the_device_copy_bandwidth_when_every_layer_ran_on_a_gpu() {
        assert_eq!(gen_bound(400_000_000, 40.0, None), 100.0);
        assert_eq!(gen_bound(400_000_000, 40.0, Some(4000.0)), 10_000.0);
        assert_eq!(gen_bound(0, 40.0, None), 40e9, "no weights: no division by zero");
    }

    #[test]
    fn tests_are_named_as_llama_bench_names_them() {
        assert_eq!(row(512, 0, vec![1]).test_name(), "pp512");
        assert_eq!(row(0, 128, vec![1]).test_name(), "tg128");
        assert_eq!(row(16, 4, vec![1]).test_name(), "pp16+tg4");
        let mut deep = row(512, 0, vec![1]);
        deep.n_depth = 4096;
        assert_eq!(deep.test_name(), "pp512 @ d4096");
    }

    #[test]
    fn runs_nest_as_llama_benchs_parameters_do() {
        let options = BenchOptions {
            n_gpu_layers: vec![0, 99],
            n_ubatch: vec![256, 512],
            n_threads: vec![1, 2],
            ..Default::default()
        };
        let order: Vec<(i64, usize, usize)> = configs(&options)
            .iter()
            .map(|c| (c.n_gpu_layers, c.n_ubatch, c.n_threads))
            .collect();
        assert_eq!(
            order,
            [
                (0, 256, 1),
                (0, 256, 2),
                (0, 512, 1),
                (0, 512, 2),
                (99, 256, 1),
                (99, 256, 2),
                (99, 512, 1),
                (99, 512, 2)
            ]
        );
    }

    #[test]
    fn peak_rss_is_read_from_vm_hwm_in_kilobytes() {
        let status = "Name:\tminfer\nVmPeak:\t  900000 kB\nVmHWM:\t  596344 kB\nVmRSS:\t  1 kB\n";
        assert_eq!(parse_vm_hwm(status), Some(596_344 * 1024));
        assert_eq!(parse_vm_hwm("VmRSS:\t 12 kB\n"), None);
        assert!(peak_rss_bytes().is_some_and(|b| b > 0));
    }

    #[test]
    fn timestamps_are_iso_8601_utc() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(iso8601(1_735_689_599), "2024-12-31T23:59:59Z");
    }
}
