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

/// What every row says about the model and the machine.
struct ModelInfo {
    filename: String,
    model_type: String,
    size: u64,
    n_params: u64,
    cpu_info: String,
    gpu_info: String,
    backends: String,
    /// Whether the CPU backend takes part (its kernels are then reported).
    uses_cpu: bool,
    /// Whether every layer and the head run on a GPU (its memory then bounds generation).
    all_on_gpu: bool,
}

impl ModelInfo {
    fn new(path: &Path, model: &minfer::engine::Model) -> Self {
        let file = model.file();
        let handles = model.backends().handles();
        let gpus: Vec<String> = handles
            .iter()
            .filter(|&&b| b != minfer::graph::Backend::CPU)
            .map(|b| b.to_string().to_uppercase())
            .collect();
        let gpu_info = model.backends().devices().iter().find_map(|d| d.device_name());
        let all_on_gpu = gpu_info.is_some()
            && model
                .backends()
                .n_gpu_layers()
                .is_none_or(|n| n > model.hparams().n_layer);
        ModelInfo {
            filename: path.display().to_string(),
            model_type: model_type(file),
            size: file.tensors().iter().map(|t| t.size).sum(),
            n_params: file.tensors().iter().map(|t| t.n_elements()).sum(),
            cpu_info: cpu_name().unwrap_or_default(),
            gpu_info: gpu_info.unwrap_or_default(),
            // As llama-bench's `get_backend`: the backends besides the CPU's, else `CPU`.
            backends: if gpus.is_empty() { "CPU".into() } else { gpus.join(",") },
            uses_cpu: handles.contains(&minfer::graph::Backend::CPU),
            all_on_gpu,
        }
    }
}

/// The model as llama.cpp describes it (`llama_model_desc`, llama-bench's `model_type`):
/// architecture, size class and file type, e.g. `qwen2 1B Q4_K - Medium`.
pub fn model_type(file: &GgufFile) -> String {
    let arch = file.metadata().get_str("general.architecture").unwrap_or("unknown");
    format!("{arch} {} {}", size_class(file, arch), file_type_name(file))
}

/// llama.cpp's size class of a model (`llm_type_name` of the type its loader sets from the
/// layer count, and for some sizes the width, head count or vocabulary), `?B` where it sets
/// none. It is not the parameter count: Qwen2.5 0.5B (24 layers of 896) is `1B`, SmolLM2 135M
/// (30 layers) `256M`. Only the architectures minfer runs are known here, as llama.cpp 0c1e570
/// classes them.
pub fn size_class(file: &GgufFile, arch: &str) -> &'static str {
    let m = file.metadata();
    let key = |name: &str| format!("{arch}.{name}");
    let uint = |name: &str| m.get_uint(&key(name)).ok();
    // A per-layer array (a head count may be one) stands for its first layer, as llama.cpp's
    // `n_head()` does.
    let first = |name: &str| {
        uint(name).or_else(|| {
            use minfer::gguf::Array;
            match m.get_array(&key(name)).ok()? {
                Array::U32(v) => v.first().map(|&x| u64::from(x)),
                Array::I32(v) => v.first().and_then(|&x| u64::try_from(x).ok()),
                Array::U64(v) => v.first().copied(),
                Array::I64(v) => v.first().and_then(|&x| u64::try_from(x).ok()),
                _ => None,
            }
        })
    };
    // Multi-token-prediction layers are not counted (`n_layer()`).
    let n_layer = uint("block_count")
        .unwrap_or(0)
        .saturating_sub(uint("nextn_predict_layers").unwrap_or(0));
    let n_embd = uint("embedding_length").unwrap_or(0);
    let n_head = first("attention.head_count").unwrap_or(0);
    let n_head_kv = first("attention.head_count_kv").unwrap_or(n_head);
    let n_expert = uint("expert_count").unwrap_or(0);
    let n_vocab = uint("vocab_size").or_else(|| m.get_array("tokenizer.ggml.tokens").ok().map(|a| a.len() as u64));
    let class = match arch {
        "gemma" => match n_layer {
            18 => "2B",
            28 => "7B",
            _ => "",
        },
        "gemma2" => match n_layer {
            26 => "2B",
            42 => "9B",
            46 => "27B",
            _ => "",
        },
        "gemma3" => match n_layer {
            18 => "270M",
            26 => "1B",
            32 => "8B",
            34 => "4B",
            48 => "12B",
            62 => "27B",
            _ => "",
        },
        "gpt-oss" => match n_layer {
            24 => "20B",
            36 => "120B",
            _ => "",
        },
        "granite" => match (n_layer, n_embd) {
            (32, _) => "3B",
            (40, 2048) => "2B",
            (40, 2560) => "3B",
            (40, 4096) => "8B",
            (64, _) => "30B",
            _ => "",
        },
        "llama" if n_expert == 8 => match n_layer {
            32 => "8x7B",
            56 => "8x22B",
            _ => "",
        },
        "llama" => match n_layer {
            16 | 22 => "1B",
            26 | 28 => "3B",
            30 => "256M",
            // Granite's vocabulary has 49152 tokens.
            32 => match n_vocab.unwrap_or(0) {
                49152 => "3B",
                v if v < 40000 => "7B",
                _ => "8B",
            },
            36 => "8B",
            40 => "13B",
            48 => "34B",
            60 => "30B",
            80 if n_head == n_head_kv => "65B",
            80 => "70B",
            _ => "",
        },
        "phi3" => match n_layer {
            24 => "1B",
            32 => "3B",
            40 => "14B",
            _ => "",
        },
        "qwen2" => match n_layer {
            24 if n_embd == 1024 => "0.5B",
            24 => "1B",
            28 if n_embd == 1536 => "1.5B",
            28 | 32 => "7B",
            36 => "3B",
            40 if n_head == 20 => "4B",
            40 => "13B",
            48 => "14B",
            64 => "32B",
            80 => "70B",
            _ => "",
        },
        "qwen2moe" => match n_layer {
            24 => "A2.7B",
            28 => "57B.A14B",
            _ => "",
        },
        "qwen3" => match n_layer {
            28 if n_embd == 1024 => "0.6B",
            28 => "1.7B",
            36 if n_embd == 2560 => "4B",
            36 => "8B",
            40 => "14B",
            64 => "32B",
            _ => "",
        },
        "qwen3moe" => match n_layer {
            48 => "30B.A3B",
            94 => "235B.A22B",
            _ => "",
        },
        _ => "",
    };
    if class.is_empty() {
        "?B"
    } else {
        class
    }
}

/// llama.cpp's name of the file's type (`llama_model_ftype_name`): `general.file_type`'s, or
/// when the file has none, `(guessed) ` and the type of most tensors' (`Q4_K - Medium` for
/// Q4_K), as its loader guesses.
pub fn file_type_name(file: &GgufFile) -> String {
    if let Ok(id) = file.metadata().get_uint("general.file_type") {
        return match super::info::file_type_name(id) {
            "unknown" => "unknown, may not work".to_string(),
            name => name.to_string(),
        };
    }
    // The type of the most tensors; a tie goes to the type that reached the count first, in
    // the order of the tensors' names.
    let mut tensors: Vec<_> = file.tensors().iter().collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut counts: Vec<(minfer::quant::GgmlType, usize)> = Vec::new();
    let mut best: Option<(minfer::quant::GgmlType, usize)> = None;
    for t in tensors {
        let n = match counts.iter_mut().find(|(ty, _)| *ty == t.ggml_type) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                counts.push((t.ggml_type, 1));
                1
            }
        };
        if best.is_none_or(|(_, max)| n > max) {
            best = Some((t.ggml_type, n));
        }
    }
    let guessed = best.map_or(0, |(ty, _)| guessed_file_type(ty.name()));
    format!("(guessed) {}", super::info::file_type_name(guessed))
}

/// The `llama_ftype` llama.cpp's loader guesses for a file mostly of the ggml type `name`;
/// all F32 (0) for a type it does not map (MXFP4 among them).
fn guessed_file_type(name: &str) -> u64 {
    match name {
        "F16" => 1,
        "BF16" => 32,
        "Q4_0" => 2,
        "Q4_1" => 3,
        "Q5_0" => 8,
        "Q5_1" => 9,
        "Q8_0" => 7,
        "Q2_K" => 10,
        "Q3_K" => 12,
        "Q4_K" => 15,
        "Q5_K" => 17,
        "Q6_K" => 18,
        "TQ1_0" => 36,
        "TQ2_0" => 37,
        "IQ2_XXS" => 19,
        "IQ2_XS" => 20,
        "IQ2_S" => 28,
        "IQ3_XXS" => 23,
        "IQ1_S" => 24,
        "IQ1_M" => 31,
        "IQ4_NL" => 25,
        "IQ4_XS" => 30,
        "IQ3_S" => 26,
        "NVFP4" => 39,
        "Q1_0" => 40,
        "Q2_0" => 41,
        _ => 0,
    }
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

/// llama-bench's fields (`test::get_fields`, llama.cpp 0c1e570), in its order: CSV's first 42
/// columns, JSON's first 42 keys (then `samples_ns` and `samples_ts`), the SQL table's columns.
pub const LLAMA_BENCH_FIELDS: [&str; 42] = [
    "build_commit",
    "build_number",
    "cpu_info",
    "gpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "cpu_mask",
    "cpu_strict",
    "poll",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "n_cpu_moe",
    "split_mode",
    "main_gpu",
    "no_kv_offload",
    "flash_attn",
    "devices",
    "tensor_split",
    "tensor_buft_overrides",
    "load_mode",
    "lazy_mode",
    "embeddings",
    "no_op_offload",
    "no_host",
    "repack",
    "fit_target",
    "fit_min_ctx",
    "n_prompt",
    "n_gen",
    "n_depth",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
];

/// How llama-bench types a field (`test::get_field_type`): JSON writes a string quoted, a
/// boolean as `true`/`false`, a number bare; SQL declares TEXT, INTEGER or REAL.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// Quoted text.
    String,
    /// 0 or 1 in CSV and SQL, `false` or `true` in JSON.
    Bool,
    /// A decimal integer.
    Int,
    /// A decimal with six places.
    Float,
}

/// The type llama-bench gives `field` (text for any it does not list).
pub fn field_type(field: &str) -> FieldType {
    match field {
        "build_number" | "n_batch" | "n_ubatch" | "n_threads" | "poll" | "model_size" | "model_n_params"
        | "n_gpu_layers" | "main_gpu" | "n_prompt" | "n_gen" | "n_depth" | "avg_ns" | "stddev_ns" | "no_op_offload"
        | "n_cpu_moe" | "fit_target" | "fit_min_ctx" | "flash_attn" => FieldType::Int,
        "no_kv_offload" | "cpu_strict" | "embeddings" | "no_host" | "repack" => FieldType::Bool,
        "avg_ts" | "stddev_ts" => FieldType::Float,
        _ => FieldType::String,
    }
}

/// A double as C++'s `ostream <<` writes it (`%g`: six significant digits, no trailing zeros),
/// as llama-bench writes `samples_ts`.
fn fmt_g(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x.is_nan() { "nan".into() } else { format!("{x}") };
    }
    let trim = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    // The exponent after rounding to six digits decides between the two notations.
    let sci = format!("{x:.5e}");
    let (mantissa, exp) = sci.split_once('e').expect("`{:e}` writes an exponent");
    let exp: i32 = exp.parse().expect("`{:e}` writes a decimal exponent");
    if !(-4..6).contains(&exp) {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim(mantissa.to_string()), exp.abs())
    } else {
        trim(format!("{x:.*}", (5 - exp) as usize))
    }
}

/// `[ 1, 2 ]`, as llama-bench writes a list in JSON.
fn json_list(items: impl Iterator<Item = String>) -> String {
    format!("[ {} ]", items.collect::<Vec<_>>().join(", "))
}

/// One of llama-bench's values in JSON (`format_json_value`): text quoted, booleans as words,
/// numbers bare.
fn json_value(field: &str, value: &str) -> String {
    match field_type(field) {
        FieldType::String => serde_json::to_string(value).expect("a string serializes"),
        FieldType::Bool => (value != "0").to_string(),
        FieldType::Int | FieldType::Float => value.to_string(),
    }
}

/// The rows as llama-bench's `-o json`: an array of objects, each its 42 fields, `samples_ns`
/// and `samples_ts` laid out as it lays them out, then minfer's fields.
pub fn to_json(results: &[BenchResult]) -> String {
    let rows: Vec<String> = results.iter().map(json_object).collect();
    format!("[\n{}\n]\n", rows.join(",\n"))
}

fn json_object(r: &BenchResult) -> String {
    let mut out = String::from("  {\n");
    for (field, value) in LLAMA_BENCH_FIELDS.iter().zip(r.llama_values()) {
        out += &format!("    \"{field}\": {},\n", json_value(field, &value));
    }
    out += &format!(
        "    \"samples_ns\": {},\n",
        json_list(r.samples_ns.iter().map(u64::to_string))
    );
    out += &format!(
        "    \"samples_ts\": {}",
        json_list(r.samples_ts.iter().map(|&t| fmt_g(t)))
    );
    for (name, value) in r.extras() {
        out += &format!(",\n    \"{name}\": {value}");
    }
    out + "\n  }"
}

/// One row as llama-bench's `-o jsonl` writes it (one object a line, its spacing), minfer's
/// fields last.
pub fn to_json_line(r: &BenchResult) -> String {
    let mut out = String::from("{");
    for (field, value) in LLAMA_BENCH_FIELDS.iter().zip(r.llama_values()) {
        out += &format!("\"{field}\": {}, ", json_value(field, &value));
    }
    out += &format!(
        "\"samples_ns\": {},\"samples_ts\": {}",
        json_list(r.samples_ns.iter().map(u64::to_string)),
        json_list(r.samples_ts.iter().map(|&t| fmt_g(t)))
    );
    for (name, value) in r.extras() {
        out += &format!(", \"{name}\": {value}");
    }
    out + "}\n"
}

/// A CSV cell as llama-bench writes every cell: quoted, quotes doubled.
fn csv_cell(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

/// The CSV columns after llama-bench's: the samples (space-separated), then each of minfer's
/// fields that any row has, in [`BenchResult::extras`]' order.
fn csv_extra_columns(results: &[BenchResult]) -> Vec<&'static str> {
    let mut columns = vec!["samples_ns", "samples_ts"];
    for r in results {
        for (name, _) in r.extras() {
            if !columns.contains(&name) {
                columns.push(name);
            }
        }
    }
    columns
}

/// One of minfer's values as a CSV cell's text: lists space-separated (`; ` between texts),
/// objects as JSON, nothing empty.
fn csv_extra(value: &serde_json::Value) -> String {
    use serde_json::Value;
    match value {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join("; ")
        }
        Value::Array(items) => items.iter().map(Value::to_string).collect::<Vec<_>>().join(" "),
        other => other.to_string(),
    }
}

/// The rows as llama-bench's `-o csv`: its header and 42 quoted cells a line, then minfer's
/// columns ([`csv_extra_columns`]).
pub fn to_csv(results: &[BenchResult]) -> String {
    let extra = csv_extra_columns(results);
    let header: Vec<&str> = LLAMA_BENCH_FIELDS
        .iter()
        .copied()
        .chain(extra.iter().copied())
        .collect();
    let mut out = header.join(",") + "\n";
    for r in results {
        let extras = r.extras();
        let mut cells: Vec<String> = r.llama_values().iter().map(|v| csv_cell(v)).collect();
        for &column in &extra {
            let text = match column {
                "samples_ns" => r.samples_ns.iter().map(u64::to_string).collect::<Vec<_>>().join(" "),
                "samples_ts" => r.samples_ts.iter().map(|&t| fmt_g(t)).collect::<Vec<_>>().join(" "),
                name => extras
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or_else(String::new, |(_, v)| csv_extra(v)),
            };
            cells.push(csv_cell(&text));
        }
        out += &cells.join(",");
        out += "\n";
    }
    out
}

/// llama-bench's `-o sql` table: `CREATE TABLE IF NOT EXISTS llama_bench` with its 42 typed
/// columns, then a blank line. minfer's fields are not columns of it, so that its rows and
/// llama-bench's go into one table (JSON and CSV carry them).
pub fn sql_header() -> String {
    let columns: Vec<String> = LLAMA_BENCH_FIELDS
        .iter()
        .map(|f| {
            let ty = match field_type(f) {
                FieldType::String => "TEXT",
                FieldType::Bool | FieldType::Int => "INTEGER",
                FieldType::Float => "REAL",
            };
            format!("  {f} {ty}")
        })
        .collect();
    format!(
        "CREATE TABLE IF NOT EXISTS llama_bench (\n{}\n);\n\n",
        columns.join(",\n")
    )
}

/// One row as llama-bench's `-o sql` inserts it: every value quoted (a quote inside doubled,
/// which llama-bench leaves to chance).
pub fn sql_row(r: &BenchResult) -> String {
    let values: Vec<String> = r
        .llama_values()
        .iter()
        .map(|v| format!("'{}'", v.replace('\'', "''")))
        .collect();
    format!(
        "INSERT INTO llama_bench ({}) VALUES ({});\n",
        LLAMA_BENCH_FIELDS.join(", "),
        values.join(", ")
    )
}

/// llama-bench's markdown table: the columns it always shows (model, size, params, backend,
/// test, t/s), `ngl` where a GPU backend takes part, `threads` on the CPU or when `-t` was
/// given, and each parameter given other than at its default.
#[derive(Clone, Debug)]
pub struct MarkdownTable {
    fields: Vec<&'static str>,
}

impl MarkdownTable {
    /// The table for the runs of `options` on `backends` (the first row's, as llama-bench's
    /// `get_backend` says for its whole run).
    pub fn new(options: &BenchOptions, backends: &str) -> Self {
        let on_cpu = ["CPU", "BLAS", "ZenDNN"].iter().any(|b| backends.contains(b));
        let defaults = BenchOptions::default();
        let mut fields = vec!["model", "size", "params", "backend"];
        let mut show = |field, shown: bool| {
            if shown {
                fields.push(field);
            }
        };
        show("n_gpu_layers", !on_cpu);
        show("n_threads", on_cpu || options.n_threads != defaults.n_threads);
        show("n_batch", options.n_batch != defaults.n_batch);
        show("n_ubatch", options.n_ubatch != defaults.n_ubatch);
        show("type_k", options.type_k != defaults.type_k);
        show("type_v", options.type_v != defaults.type_v);
        show("flash_attn", options.flash_attn != defaults.flash_attn);
        show("devices", options.devices != defaults.devices);
        show("load_mode", options.load_mode != defaults.load_mode);
        fields.extend(["test", "t/s"]);
        MarkdownTable { fields }
    }

    /// The header and alignment lines.
    pub fn header(&self) -> String {
        let names: Vec<String> = self.fields.iter().map(|f| md_name(f).to_string()).collect();
        let mut out = self.line(&names);
        out += "|";
        for field in &self.fields {
            let w = md_width(field);
            let dashes = "-".repeat(w.unsigned_abs() as usize - 1);
            out += &format!(" {dashes}{} |", if w > 0 { ":" } else { "-" });
        }
        out + "\n"
    }

    /// One row.
    pub fn row(&self, r: &BenchResult) -> String {
        let values = r.llama_values();
        let cells: Vec<String> = self
            .fields
            .iter()
            .map(|&field| match field {
                "model" => r.model_type.clone(),
                "size" => human_size(r.model_size),
                "params" => human_params(r.model_n_params),
                "backend" => r.backends.clone(),
                "test" => r.test_name(),
                "t/s" => format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
                f => LLAMA_BENCH_FIELDS
                    .iter()
                    .position(|name| *name == f)
                    .map_or_else(String::new, |i| values[i].clone()),
            })
            .collect();
        self.line(&cells)
    }

    fn line(&self, cells: &[String]) -> String {
        let mut line = String::from("|");
        for (field, cell) in self.fields.iter().zip(cells) {
            let width = md_width(field);
            let w = width.unsigned_abs() as usize;
            if width < 0 {
                line += &format!(" {cell:<w$} |");
            } else {
                line += &format!(" {cell:>w$} |");
            }
        }
        line + "\n"
    }
}

/// llama-bench's width of a markdown column (`get_field_width`): negative is left-aligned.
fn md_width(field: &str) -> i32 {
    match field {
        "model" => -30,
        "t/s" => 20,
        "size" | "params" => 10,
        "n_gpu_layers" | "flash_attn" | "repack" => 3,
        "n_threads" | "n_batch" => 7,
        "n_ubatch" => 8,
        "type_k" | "type_v" | "split_mode" => 6,
        "load_mode" => 10,
        "devices" => -12,
        "test" => 15,
        "no_op_offload" | "no_host" => 4,
        f => {
            let w = f.len().max(10) as i32;
            if field_type(f) == FieldType::String {
                -w
            } else {
                w
            }
        }
    }
}

/// llama-bench's heading of a markdown column (`get_field_display_name`).
fn md_name(field: &str) -> &str {
    match field {
        "n_gpu_layers" => "ngl",
        "split_mode" => "sm",
        "n_threads" => "threads",
        "no_kv_offload" => "nkvo",
        "flash_attn" => "fa",
        "load_mode" => "lm",
        "embeddings" => "embd",
        "no_op_offload" => "nopo",
        "no_host" => "noh",
        "repack" => "rpk",
        "devices" => "dev",
        "tensor_split" => "ts",
        "tensor_buft_overrides" => "ot",
        "fit_target" => "fitt",
        "fit_min_ctx" => "fitc",
        f => f,
    }
}

/// The line under the table: the build, the instruction set the kernels chose, and the peak
/// resident memory of the whole run.
pub fn markdown_footer(results: &[BenchResult]) -> String {
    let rss = results
        .iter()
        .filter_map(|r| r.peak_rss_bytes)
        .max()
        .map_or_else(|| "unknown".to_string(), |b| format!("{:.2} MiB", b as f64 / MIB));
    let mut footer = format!(
        "\nbuild: minfer {} | simd: {}{} | peak RSS: {rss}\n",
        env!("CARGO_PKG_VERSION"),
        minfer::quant::simd::simd_level(),
        if minfer::quant::simd::amx() { " + amx" } else { "" }
    );
    // The GPU as its driver reports it (a wgpu adapter's API, driver and kernel layout too).
    if let Some(gpu) = results.iter().map(|r| r.gpu_info.as_str()).find(|g| !g.is_empty()) {
        footer += &format!("device: {gpu}\n");
    }
    let mut reported = Vec::new();
    for r in results.iter() {
        if let Some(h) = r.handoff.filter(|_| !reported.contains(&r.n_threads)) {
            reported.push(r.n_threads);
            footer += &format!(
                "hand-off per node at {} threads: {:.2} µs back to back, {:.2} µs after a 100 µs pause, \
                 {:.2} µs once the workers have parked\n",
                r.n_threads,
                h.back_to_back_ns / 1e3,
                h.after_pause_ns / 1e3,
                h.parked_ns / 1e3
            );
        }
    }
    for r in results.iter().filter(|r| !r.kernels.is_empty()) {
        footer += &format!("{} at {} threads: {}\n", r.test_name(), r.n_threads, r.kernels);
    }
    if let Some(r) = results.iter().find(|r| !r.kernel_choices.is_empty()) {
        footer += &choices_lines(&r.kernel_choices);
    }
    for r in results.iter().filter(|r| r.n_gen > 0 && r.n_prompt == 0) {
        if let (Some(gbs), Some(bytes), Some(bound)) = (r.mem_read_gbs, r.weight_bytes_per_token, r.gen_bound_ts) {
            let measured = match r.device_copy_gbs {
                Some(device) => format!("{device:.1} GB/s device copy"),
                None => format!("{gbs:.1} GB/s read"),
            };
            footer += &format!(
                "{} at {} threads: {:.2} tok/s is {:.0} % of the bandwidth bound {:.1} tok/s \
                 ({measured}, {:.1} MB of weights per token)\n",
                r.test_name(),
                r.n_threads,
                r.avg_ts,
                100.0 * r.avg_ts / bound,
                bound,
                bytes as f64 / 1e6
            );
        }
    }
    footer
}

/// The lines that say which decoding kernel each weight type got on this CPU and why, where the
/// choice was cached, and how to force another.
fn choices_lines(choices: &[String]) -> String {
    let c = minfer::quant::choice::choices();
    let timed = if c.measured_in.is_zero() {
        String::new()
    } else {
        format!(", timed in {:.0} ms on this start", c.measured_in.as_secs_f64() * 1e3)
    };
    let cache = c
        .cache
        .as_ref()
        .map_or_else(|| "not cached".to_string(), |p| format!("cached in {}", p.display()));
    let mut out = format!(
        "decoding kernels on {} ({cache}{timed}; MINFER_KERNEL forces one):\n",
        c.cpu
    );
    for line in choices {
        out += &format!("  {line}\n");
    }
    if let Some(e) = &c.refused {
        out += &format!("  {e}: measured instead\n");
    }
    out
}

const MIB: f64 = 1024.0 * 1024.0;

fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    if b < 1024.0 * MIB {
        format!("{:.2} MiB", b / MIB)
    } else {
        format!("{:.2} GiB", b / (1024.0 * MIB))
    }
}

fn human_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

#[cfg(test)]
mod tests {
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

    fn info() -> ModelInfo {
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

    fn row(n_prompt: usize, n_gen: usize, samples_ns: Vec<u64>) -> BenchResult {
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
    fn the_bound_of_a_row_on_a_gpu_is_its_device_copy_bandwidth_and_the_footer_says_so() {
        let mut host = row(0, 128, vec![1_000_000_000]);
        (host.mem_read_gbs, host.weight_bytes_per_token) = (Some(40.0), Some(400_000_000));
        host.gen_bound_ts = Some(100.0);
        let mut gpu = host.clone();
        gpu.device_copy_gbs = Some(4000.0);
        gpu.gen_bound_ts = Some(10_000.0);
        let footer = markdown_footer(&[host, gpu.clone()]);
        let lines: Vec<&str> = footer.lines().filter(|l| l.contains("bandwidth bound")).collect();
        assert_eq!(lines.len(), 2, "{footer}");
        assert!(lines[0].contains("(40.0 GB/s read, 400.0 MB"), "{}", lines[0]);
        assert!(lines[1].contains("(4000.0 GB/s device copy, 400.0 MB"), "{}", lines[1]);
        assert!(
            lines[1].contains("is 1 % of the bandwidth bound 10000.0 tok/s"),
            "{}",
            lines[1]
        );
        assert!(to_json_line(&gpu).contains("\"device_copy_gbs\": 4000.0"));
        assert!(!to_json_line(&row(0, 1, vec![1])).contains("device_copy_gbs"));
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
    fn the_markdown_table_has_llama_benchs_columns_and_no_ngl_column_on_the_cpu() {
        // llama-bench's own table for a CPU run (its CPU build, llama.cpp 0c1e570).
        let options = BenchOptions::default();
        let table = MarkdownTable::new(&options, "CPU");
        let header = table.header();
        let lines: Vec<&str> = header.lines().collect();
        assert_eq!(
            lines[0],
            "| model                          |       size |     params | backend    | threads |            test |                  t/s |"
        );
        assert_eq!(
            lines[1],
            "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |"
        );
        let r = row(512, 0, vec![4_000_000_000, 4_000_000_000]);
        assert_eq!(
            table.row(&r),
            "| qwen2 1B Q4_K - Medium         | 373.71 MiB |   494.03 M | CPU        |       2 |           pp512 |        128.00 ± 0.00 |\n"
        );
        // On a GPU backend: `ngl`, and `threads` only when -t was given; each parameter given
        // other than at its default is a column, as llama-bench adds them.
        let options = BenchOptions {
            n_ubatch: vec![128],
            flash_attn: vec![1],
            load_mode: vec![LoadMode::None],
            ..Default::default()
        };
        let table = MarkdownTable::new(&options, "CUDA");
        let mut gpu = row(512, 0, vec![1_000_000_000]);
        (gpu.backends, gpu.n_gpu_layers, gpu.n_ubatch, gpu.flash_attn) = ("CUDA".into(), 99, 128, 1);
        gpu.load_mode = "none".into();
        assert_eq!(
            table.header().lines().next().unwrap(),
            "| model                          |       size |     params | backend    | ngl | n_ubatch |  fa |         lm |            test |                  t/s |"
        );
        assert_eq!(
            table.row(&gpu),
            "| qwen2 1B Q4_K - Medium         | 373.71 MiB |   494.03 M | CUDA       |  99 |      128 |   1 |       none |           pp512 |        512.00 ± 0.00 |\n"
        );
    }

    #[test]
    fn every_format_has_llama_benchs_fields_in_its_order_then_minfers() {
        let mut r = row(16, 0, vec![145_115_789]);
        r.peak_rss_bytes = Some(1 << 20);
        r.kernels = "avx2 gemm (Q4_K)".into();
        let values = r.llama_values();
        assert_eq!(values.len(), LLAMA_BENCH_FIELDS.len());
        // As llama-bench 0c1e570 writes a CPU row: its defaults where minfer has no choice.
        let by_name = |f: &str| values[LLAMA_BENCH_FIELDS.iter().position(|n| *n == f).unwrap()].as_str();
        for (field, want) in [
            ("build_number", "0"),
            ("n_batch", "2048"),
            ("n_ubatch", "512"),
            ("cpu_mask", "0x0"),
            ("cpu_strict", "0"),
            ("poll", "50"),
            ("n_gpu_layers", "-1"),
            ("split_mode", "layer"),
            ("flash_attn", "-1"),
            ("devices", "auto"),
            ("tensor_split", "0.00"),
            ("tensor_buft_overrides", "none"),
            ("load_mode", "auto"),
            ("lazy_mode", "auto"),
            ("repack", "1"),
            ("avg_ts", "110.256783"),
            ("stddev_ts", "0.000000"),
        ] {
            assert_eq!(by_name(field), want, "{field}");
        }

        let csv = to_csv(std::slice::from_ref(&r));
        let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
        assert_eq!(header[..42], LLAMA_BENCH_FIELDS);
        assert_eq!(header[42..], ["samples_ns", "samples_ts", "peak_rss_bytes", "kernels"]);
        // Every cell quoted, as llama-bench quotes them.
        assert!(csv.lines().nth(1).unwrap().starts_with("\"minfer "), "{csv}");
        assert!(csv.contains(",\"-1\",\"0\",\"layer\","), "{csv}");
        assert!(
            csv.ends_with(",\"145115789\",\"110.257\",\"1048576\",\"avx2 gemm (Q4_K)\"\n"),
            "{csv}"
        );

        let json = to_json(std::slice::from_ref(&r));
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        let keys: Vec<&str> = v[0].as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys[..42], LLAMA_BENCH_FIELDS);
        assert_eq!(keys[42..], ["samples_ns", "samples_ts", "peak_rss_bytes", "kernels"]);
        // llama-bench's types: booleans as words, integers and rates bare, its layout.
        assert!(json.contains("    \"cpu_strict\": false,\n"), "{json}");
        assert!(json.contains("    \"repack\": true,\n"), "{json}");
        assert!(json.contains("    \"flash_attn\": -1,\n"), "{json}");
        assert!(json.contains("    \"avg_ts\": 110.256783,\n"), "{json}");
        assert!(
            json.contains("    \"samples_ns\": [ 145115789 ],\n    \"samples_ts\": [ 110.257 ],\n"),
            "{json}"
        );
        assert!(json.starts_with("[\n  {\n    \"build_commit\": \"minfer "), "{json}");
        assert!(json.ends_with("\n  }\n]\n"), "{json}");

        let line = to_json_line(&r);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys[..42], LLAMA_BENCH_FIELDS);
        assert!(
            line.contains("\"samples_ns\": [ 145115789 ],\"samples_ts\": [ 110.257 ], \"peak_rss_bytes\": 1048576"),
            "{line}"
        );

        let sql = sql_header() + &sql_row(&r);
        assert!(sql
            .starts_with("CREATE TABLE IF NOT EXISTS llama_bench (\n  build_commit TEXT,\n  build_number INTEGER,\n"));
        assert!(sql
            .contains("  avg_ts REAL,\n  stddev_ts REAL\n);\n\nINSERT INTO llama_bench (build_commit, build_number, "));
        assert!(
            sql.contains("'0x0', '0', '50', 'f16', 'f16', '-1', '0', 'layer', '0', '0', '-1', 'auto', '0.00', 'none', 'auto', 'auto', '0', '0', '0', '1', '0', '0', '16', '0', '0', "),
            "{sql}"
        );
    }

    #[test]
    fn rates_in_samples_are_written_as_cpp_streams_write_doubles() {
        for (x, want) in [
            (110.256_783, "110.257"),
            (19.820_214, "19.8202"),
            (5.0, "5"),
            (0.0, "0"),
            (1_234_567.0, "1.23457e+06"),
            (0.000_012_345_6, "1.23456e-05"),
            (999_999.6, "1e+06"),
            (0.5, "0.5"),
        ] {
            assert_eq!(fmt_g(x), want, "{x}");
        }
    }

    #[test]
    fn a_quote_in_a_value_is_escaped_in_each_format() {
        let mut r = row(16, 0, vec![1]);
        r.model_filename = "it's \"m\".gguf".into();
        assert!(to_csv(std::slice::from_ref(&r)).contains(",\"it's \"\"m\"\".gguf\","));
        assert!(sql_row(&r).contains(", 'it''s \"m\".gguf', "));
        let v: serde_json::Value = serde_json::from_str(&to_json_line(&r)).unwrap();
        assert_eq!(v["model_filename"], "it's \"m\".gguf");
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
    fn models_are_typed_as_llama_bench_types_them() {
        // tests/fixtures/bench/model-types.txt: llama-bench's model_type of each file.
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let fixture = std::fs::read_to_string(root.join("tests/fixtures/bench/model-types.txt")).unwrap();
        let cache = std::env::var_os("MINFER_MODELS")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/minfer/models")));
        let mut checked = 0;
        for line in fixture.lines().filter(|l| !l.starts_with('#')) {
            let (name, want) = line.split_once('|').unwrap();
            let tiny = root.join("tests/fixtures/models").join(name);
            // The tiny models are always there; the cache's only where fetched.
            let path = match (tiny.exists(), cache.as_ref().map(|c| c.join(name))) {
                (true, _) => tiny,
                (false, Some(cached)) if cached.exists() => cached,
                _ => continue,
            };
            let file = GgufFile::open(&path).unwrap();
            assert_eq!(model_type(&file), want, "{name}");
            checked += 1;
        }
        assert!(checked >= 52, "only {checked} models checked");
    }

    /// A file with `metadata` and one Q4_K matrix, two Q8_0 ones and one F32 vector: mostly Q8_0.
    fn metadata_file(name: &str, metadata: &[(&str, minfer::gguf::Value)]) -> GgufFile {
        use minfer::quant::GgmlType;
        let mut w = minfer::gguf::GgufWriter::new();
        for (key, value) in metadata {
            w.set(*key, value.clone());
        }
        w.add_tensor("a.weight", GgmlType::Q4_K, &[256], vec![0; 144]).unwrap();
        w.add_tensor("b.weight", GgmlType::Q8_0, &[32], vec![0; 34]).unwrap();
        w.add_tensor("c.weight", GgmlType::Q8_0, &[32], vec![0; 34]).unwrap();
        w.add_tensor("d.weight", GgmlType::F32, &[4], vec![0; 16]).unwrap();
        let path = std::env::temp_dir().join(format!("minfer-bench-{}-{name}.gguf", std::process::id()));
        w.write_file(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file
    }

    #[test]
    fn size_classes_follow_llama_cpps_layer_count_and_width_rules() {
        use minfer::gguf::Value;
        let model = |name: &str, arch: &str, kv: &[(&str, u32)]| {
            let mut m: Vec<(String, Value)> = vec![
                ("general.architecture".into(), Value::String(arch.into())),
                ("general.file_type".into(), Value::U32(15)),
            ];
            m.extend(kv.iter().map(|(k, v)| (format!("{arch}.{k}"), Value::U32(*v))));
            let m: Vec<(&str, Value)> = m.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
            model_type(&metadata_file(name, &m))
        };
        let qwen = |layers, embd| model("q", "qwen2", &[("block_count", layers), ("embedding_length", embd)]);
        assert_eq!(qwen(24, 896), "qwen2 1B Q4_K - Medium", "Qwen2.5 0.5B");
        assert_eq!(qwen(24, 1024), "qwen2 0.5B Q4_K - Medium", "Qwen1.5 0.5B");
        assert_eq!(qwen(28, 1536), "qwen2 1.5B Q4_K - Medium");
        assert_eq!(qwen(28, 3584), "qwen2 7B Q4_K - Medium");
        assert_eq!(qwen(2, 256), "qwen2 ?B Q4_K - Medium");
        let llama = |layers, vocab, experts| {
            model(
                "l",
                "llama",
                &[
                    ("block_count", layers),
                    ("vocab_size", vocab),
                    ("expert_count", experts),
                ],
            )
        };
        assert_eq!(llama(32, 32000, 0), "llama 7B Q4_K - Medium");
        assert_eq!(llama(32, 128256, 0), "llama 8B Q4_K - Medium");
        assert_eq!(llama(32, 49152, 0), "llama 3B Q4_K - Medium");
        assert_eq!(llama(32, 32000, 8), "llama 8x7B Q4_K - Medium");
        assert_eq!(llama(30, 49152, 0), "llama 256M Q4_K - Medium", "SmolLM2 135M");
        let gpt = |layers| model("g", "gpt-oss", &[("block_count", layers)]);
        assert_eq!(gpt(24), "gpt-oss 20B Q4_K - Medium");
        assert_eq!(gpt(36), "gpt-oss 120B Q4_K - Medium");
        assert_eq!(
            model("m", "qwen3moe", &[("block_count", 48)]),
            "qwen3moe 30B.A3B Q4_K - Medium"
        );
        assert_eq!(model("x", "mamba", &[("block_count", 64)]), "mamba ?B Q4_K - Medium");
    }

    #[test]
    fn a_file_without_a_file_type_is_named_by_its_commonest_tensor_type_as_guessed() {
        use minfer::gguf::Value;
        let file = metadata_file(
            "guess",
            &[
                ("general.architecture", Value::String("qwen2".into())),
                ("qwen2.block_count", Value::U32(28)),
                ("qwen2.embedding_length", Value::U32(1536)),
            ],
        );
        assert_eq!(model_type(&file), "qwen2 1.5B (guessed) Q8_0");
        let unknown = metadata_file(
            "unknown",
            &[
                ("general.architecture", Value::String("qwen2".into())),
                ("general.file_type", Value::U32(4)),
            ],
        );
        assert_eq!(model_type(&unknown), "qwen2 ?B unknown, may not work");
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
