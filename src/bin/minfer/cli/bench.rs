//! `minfer bench`: prompt-processing and generation throughput in llama-bench's terms, so the
//! two engines can be compared row by row and llama-bench's scripts read our JSON.
//!
//! A `pp<N>` test evaluates a batch of N random tokens from an empty context in one call; a
//! `tg<N>` test starts from an empty context and generates N tokens one at a time (each the
//! next random token, so no sampling is timed). Each test runs once to warm up (the whole prompt
//! for pp, one token for tg, as llama-bench does) and then `repetitions` timed times. Thread
//! counts are the outer loop, as in llama-bench: for each, the pp tests, then the tg tests.
//!
//! This module measures and formats; it prints nothing itself.

use super::run::{load, LoadOptions, RunError};
use minfer::engine::profile::{ProfileObserver, ProfileRecorder};
use minfer::engine::{eval_preparing, EngineError, GenerateOptions, Sequence, Session};
use minfer::gguf::GgufFile;
use minfer::grammar::{Grammar, GrammarError};
use minfer::tokenizer::Tokenizer;
use std::path::Path;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

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

/// What to measure. Sizes of 0 are skipped, as in llama-bench.
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
    /// Prompt tokens per forward pass (`-b`, `-ub`; llama-bench's default 512).
    pub n_ubatch: usize,
    /// Thread counts (`-t`).
    pub n_threads: Vec<usize>,
    /// Timed runs per test, after one warm-up run.
    pub repetitions: usize,
    /// `--backend`, as for `minfer MODEL`.
    pub backend: Option<String>,
    /// Layers on the GPU (`-ngl`, a list): one run of every test per value; `None` runs every
    /// layer on the highest-priority backend.
    pub n_gpu_layers: Vec<Option<usize>>,
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
    fn default() -> Self {
        BenchOptions {
            n_prompt: vec![512],
            n_gen: vec![128],
            pg: Vec::new(),
            n_depth: vec![0],
            n_ubatch: minfer::engine::PREFILL_CHUNK,
            n_threads: vec![minfer::engine::default_threads()],
            repetitions: 5,
            backend: None,
            n_gpu_layers: vec![None],
            seed: 1,
            bandwidth: false,
            handoff: false,
            grammar: None,
            profile: false,
        }
    }
}

/// One row: one test at one thread count. Field names are llama-bench's JSON fields (plus
/// `peak_rss_bytes`), in its order.
#[derive(Clone, Debug, serde::Serialize)]
pub struct BenchResult {
    /// The crate version minfer was built as.
    pub build_commit: String,
    /// The CPU's model name.
    pub cpu_info: String,
    /// The GPU's name when one took part (empty otherwise).
    pub gpu_info: String,
    /// The backends taking part, comma-separated.
    pub backends: String,
    /// The model's path as given.
    pub model_filename: String,
    /// `{architecture} {size label} {file type}`, as llama.cpp describes a model.
    pub model_type: String,
    /// Bytes of all tensors.
    pub model_size: u64,
    /// Elements of all tensors.
    pub model_n_params: u64,
    /// CPU threads of the test.
    pub n_threads: usize,
    /// KV cache element type of K (`f16`, llama-bench's default).
    pub type_k: String,
    /// KV cache element type of V (`f16`).
    pub type_v: String,
    /// Layers on the GPU (`-ngl`): the value asked for, the layer count plus the head when
    /// every layer ran there, 0 with no GPU.
    pub n_gpu_layers: usize,
    /// Whether the weights are memory-mapped (always).
    pub use_mmap: bool,
    /// Prompt tokens of a prompt-processing test (0 for a generation test).
    pub n_prompt: usize,
    /// Tokens of a generation test (0 for a prompt-processing test).
    pub n_gen: usize,
    /// Tokens already in the context when the test starts (`-d`).
    pub n_depth: usize,
    /// Prompt tokens per forward pass (`-b`, `-ub`).
    pub n_ubatch: usize,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mem_read_gbs: Option<f64>,
    /// With `--bandwidth` and every layer on a GPU: the device memory's copy bandwidth (bytes
    /// read plus written per second), GB/s, which then bounds generation instead of the host's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_copy_gbs: Option<f64>,
    /// ... the bytes of weights a generated token reads ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weight_bytes_per_token: Option<u64>,
    /// ... and the generation rate that bandwidth allows, tokens/s.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gen_bound_ts: Option<f64>,
    /// The CPU kernels that multiplied the weights in this test, by weight type: e.g.
    /// `avx512-vnni gemm (Q4_K, Q6_K)` (empty when no CPU backend took part).
    pub kernels: String,
    /// The decoding kernel chosen for each quantized weight type of the model on this CPU, and
    /// why ([`kernel_choices`]; empty when no CPU backend took part).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_choices: Vec<String>,
    /// With `--handoff`: what one node's hand-off to the thread pool costs at this thread count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handoff: Option<Handoff>,
    /// How the generated tokens were chosen: empty for llama-bench's random tokens, `sampled`,
    /// or `constrained` (sampled under the `--json-schema` or `--grammar` mask).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub generation: String,
    /// With `--profile`: where the timed runs' time went.
    #[serde(skip_serializing_if = "Option::is_none")]
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

    fn new(model: &ModelInfo, n_threads: usize, n_prompt: usize, n_gen: usize, test_time: String) -> Self {
        BenchResult {
            build_commit: format!("minfer {}", env!("CARGO_PKG_VERSION")),
            cpu_info: model.cpu_info.clone(),
            gpu_info: model.gpu_info.clone(),
            backends: model.backends.clone(),
            model_filename: model.filename.clone(),
            model_type: model.model_type.clone(),
            model_size: model.size,
            model_n_params: model.n_params,
            n_threads,
            type_k: "f16".into(),
            type_v: "f16".into(),
            n_gpu_layers: model.n_gpu_layers,
            use_mmap: true,
            n_prompt,
            n_gen,
            n_depth: 0,
            n_ubatch: minfer::engine::PREFILL_CHUNK,
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
    n_gpu_layers: usize,
}

impl ModelInfo {
    fn new(path: &Path, model: &minfer::engine::Model) -> Self {
        let file = model.file();
        let m = file.metadata();
        let arch = m.get_str("general.architecture").unwrap_or("unknown");
        let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
        let size_label = m
            .get_str("general.size_label")
            .map(str::to_string)
            .unwrap_or_else(|_| params_label(n_params));
        let ftype = m
            .get_uint("general.file_type")
            .map_or("unknown", super::info::file_type_name);
        let backends: Vec<String> = model
            .backends()
            .handles()
            .iter()
            .map(|b| b.to_string().to_uppercase())
            .collect();
        let gpu_info = model.backends().devices().iter().find_map(|d| d.device_name());
        let n_gpu_layers = match (&gpu_info, model.backends().n_gpu_layers()) {
            (None, _) => 0,
            (Some(_), Some(n)) => n,
            // Every layer and the head.
            (Some(_), None) => model.hparams().n_layer + 1,
        };
        ModelInfo {
            filename: path.display().to_string(),
            model_type: format!("{arch} {size_label} {ftype}"),
            size: file.tensors().iter().map(|t| t.size).sum(),
            n_params,
            cpu_info: cpu_name().unwrap_or_default(),
            gpu_info: gpu_info.unwrap_or_default(),
            backends: backends.join(","),
            n_gpu_layers,
        }
    }
}

/// `0.5B`, `1.8B`, `135M`: a size label for a model whose metadata has none.
fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round())
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
    let mut rng = TokenRng(options.seed.max(1));
    let mut results = Vec::new();
    // A GPU's copy bandwidth, measured once for the process (at the first test held to it).
    let mut device_bandwidth: Option<Option<f64>> = None;
    let runs = options
        .n_gpu_layers
        .iter()
        .flat_map(|&ngl| options.n_threads.iter().map(move |&t| (ngl, t)));
    for (n_gpu_layers, n_threads) in runs {
        let load_options = LoadOptions {
            model: minfer::engine::ModelOptions {
                n_threads: Some(n_threads),
                backend: options.backend.clone(),
                n_gpu_layers,
                ..Default::default()
            },
            // llama-bench's default cache (f16), so that the figures compare.
            session: minfer::engine::SessionOptions {
                n_ctx: needed,
                n_ubatch: Some(options.n_ubatch),
                ..Default::default()
            },
        };
        let mut loaded = load(path, &load_options)?;
        let n_ctx_train = loaded.session.model().hparams().n_ctx_train;
        if loaded.session.n_ctx() < needed {
            return Err(BenchError::ContextTooLarge { needed, n_ctx_train });
        }
        let info = ModelInfo::new(path, &loaded.model);
        let per_token = weight_bytes_per_token(loaded.model.file());
        // Every layer and the head on a GPU: its memory bounds generation, not the host's.
        let device_gbs = if options.bandwidth && info.n_gpu_layers > loaded.model.hparams().n_layer {
            *device_bandwidth.get_or_insert_with(|| {
                device_copy_bandwidth(&loaded.model).unwrap_or_else(|e| {
                    eprintln!("bench: {e}; generation is held to the host's bandwidth instead");
                    None
                })
            })
        } else {
            None
        };
        let n_vocab = loaded.session.model().hparams().n_vocab;
        let tokenizer = loaded.model.tokenizer();
        let bos = tokenizer.add_bos().then(|| tokenizer.bos()).flatten();
        let session = &mut loaded.session;

        let grammar = match &options.grammar {
            Some(spec) => Some(loaded.model.compile_grammar(spec)?),
            None => None,
        };
        let tests: Vec<(usize, usize)> = prompts
            .iter()
            .map(|&p| (p, 0))
            .chain(gens.iter().map(|&n| (0, n)))
            .chain(pairs.iter().copied())
            .collect();
        // With a grammar, each generating test runs sampled, then sampled under the grammar.
        let modes: Vec<Option<Generation>> = match &grammar {
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
            let mut result = BenchResult::new(&info, n_threads, n_prompt, n_gen, utc_now());
            result.generation = generation.as_ref().map_or("", Generation::name).to_string();
            result.n_depth = n_depth;
            result.n_ubatch = options.n_ubatch;
            if info.backends.split(',').any(|b| b == "CPU") {
                // A prompt is one batch of `n_prompt` tokens; generation one token a step.
                result.kernels = cpu_kernels(&loaded.model, n_prompt.min(options.n_ubatch).max(1));
                result.kernel_choices = kernel_choices(loaded.model.file());
            }
            let mut samples = Vec::with_capacity(options.repetitions);
            let recorder = options.profile.then(ProfileRecorder::shared);
            for rep in 0..=options.repetitions {
                let warm_up = rep == 0;
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
                result.weight_bytes_per_token = Some(per_token);
                result.device_copy_gbs = device_gbs;
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

/// llama-bench's column widths: negative is left-aligned.
const COLUMNS: [(&str, i32); 8] = [
    ("model", -30),
    ("size", 10),
    ("params", 10),
    ("backend", -10),
    ("ngl", 3),
    ("threads", 7),
    ("test", 15),
    ("t/s", 20),
];

fn table_row(cells: &[String]) -> String {
    let mut line = String::from("|");
    for ((_, width), cell) in COLUMNS.iter().zip(cells) {
        let w = width.unsigned_abs() as usize;
        if *width < 0 {
            line += &format!(" {cell:<w$} |");
        } else {
            line += &format!(" {cell:>w$} |");
        }
    }
    line + "\n"
}

/// The markdown table's header and alignment lines.
pub fn markdown_header() -> String {
    let names: Vec<String> = COLUMNS.iter().map(|(name, _)| name.to_string()).collect();
    let mut out = table_row(&names);
    out += "|";
    for (_, width) in COLUMNS {
        let w = width.unsigned_abs() as usize;
        if width < 0 {
            out += &format!(" {} |", "-".repeat(w));
        } else {
            out += &format!(" {}: |", "-".repeat(w - 1));
        }
    }
    out + "\n"
}

/// One markdown table row.
pub fn markdown_row(r: &BenchResult) -> String {
    table_row(&[
        r.model_type.clone(),
        human_size(r.model_size),
        human_params(r.model_n_params),
        r.backends.clone(),
        r.n_gpu_layers.to_string(),
        r.n_threads.to_string(),
        r.test_name(),
        format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
    ])
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

/// One row as a line of JSON (llama-bench's `-o jsonl`).
pub fn to_json_line(result: &BenchResult) -> String {
    serde_json::to_string(result).expect("bench results always serialize") + "\n"
}

/// The rows as CSV (llama-bench's `-o csv`): a header of the JSON field names, then one line
/// per row; lists are space-separated, text is quoted, absent values are empty.
pub fn to_csv(results: &[BenchResult]) -> String {
    let rows: Vec<serde_json::Map<String, serde_json::Value>> = results
        .iter()
        .filter_map(|r| match serde_json::to_value(r) {
            Ok(serde_json::Value::Object(map)) => Some(map),
            _ => None,
        })
        .collect();
    let mut columns: Vec<&String> = Vec::new();
    for key in rows.iter().flat_map(|row| row.keys()) {
        if !columns.contains(&key) {
            columns.push(key);
        }
    }
    let cell = |v: Option<&serde_json::Value>| -> String {
        use serde_json::Value;
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        match v {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => quote(s),
            Some(Value::Array(items)) => {
                let items: Vec<String> = items.iter().map(|i| i.to_string()).collect();
                quote(&items.join(" "))
            }
            Some(Value::Object(_)) => quote(&v.map(|v| v.to_string()).unwrap_or_default()),
            Some(other) => other.to_string(),
        }
    };
    let mut out = columns.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(",") + "\n";
    for row in &rows {
        let line: Vec<String> = columns.iter().map(|c| cell(row.get(*c))).collect();
        out += &line.join(",");
        out += "\n";
    }
    out
}

/// The rows as a JSON array of llama-bench-shaped objects.
pub fn to_json(results: &[BenchResult]) -> String {
    serde_json::to_string_pretty(results).expect("bench results always serialize") + "\n"
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

    fn row(n_prompt: usize, n_gen: usize, samples_ns: Vec<u64>) -> BenchResult {
        let info = ModelInfo {
            filename: "m.gguf".into(),
            model_type: "qwen2 0.5B Q4_K - Medium".into(),
            size: 391_868_160,
            n_params: 494_032_768,
            cpu_info: String::new(),
            gpu_info: String::new(),
            backends: "CPU".into(),
            n_gpu_layers: 0,
        };
        let mut r = BenchResult::new(&info, 2, n_prompt, n_gen, iso8601(0));
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
        assert!(to_json_line(&gpu).contains("\"device_copy_gbs\":4000.0"));
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
    fn the_markdown_table_has_llama_benchs_columns_and_alignment() {
        let header = markdown_header();
        let lines: Vec<&str> = header.lines().collect();
        assert_eq!(
            lines[0],
            "| model                          |       size |     params | backend    | ngl | threads |            test |                  t/s |"
        );
        assert_eq!(
            lines[1],
            "| ------------------------------ | ---------: | ---------: | ---------- | --: | ------: | --------------: | -------------------: |"
        );
        let r = row(512, 0, vec![4_000_000_000, 4_000_000_000]);
        assert_eq!(
            markdown_row(&r),
            "| qwen2 0.5B Q4_K - Medium       | 373.71 MiB |   494.03 M | CPU        |   0 |       2 |           pp512 |        128.00 ± 0.00 |\n"
        );
    }

    #[test]
    fn json_rows_carry_llama_benchs_field_names() {
        let r = row(0, 128, vec![2_000_000_000, 1_000_000_000]);
        let v: serde_json::Value = serde_json::from_str(&to_json(&[r])).unwrap();
        let o = &v[0];
        for key in [
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "n_threads",
            "n_prompt",
            "n_gen",
            "avg_ts",
            "stddev_ts",
            "samples_ts",
            "avg_ns",
            "stddev_ns",
            "samples_ns",
            "test_time",
            "peak_rss_bytes",
        ] {
            assert!(o.get(key).is_some(), "missing {key}");
        }
        assert_eq!(o["n_gen"], 128);
        assert_eq!(o["samples_ts"], serde_json::json!([64.0, 128.0]));
        assert_eq!(o["test_time"], "1970-01-01T00:00:00Z");
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
