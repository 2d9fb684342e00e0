//! `minfer bench`: its flags, turned into bench options, and the rows written in the format
//! asked for. Measuring is `crate::cli::bench`'s (and `crate::cli::batched_bench`'s for `--npl`).

use crate::args::*;
use std::io::Write;
use std::path::PathBuf;

/// The thread counts to measure: the flag's, else the engine's default (one per physical core).
fn thread_counts(threads: Vec<usize>) -> Vec<usize> {
    if threads.is_empty() {
        vec![minfer::engine::default_threads()]
    } else {
        threads
    }
}

/// Run `minfer bench` as its flags say.
pub(crate) fn run(args: BenchArgs) -> anyhow::Result<()> {
    args.compat.check_flash_attn()?;
    let model = args
        .model
        .or(args.model_flag)
        .ok_or_else(|| anyhow::anyhow!("bench needs a model: minfer bench MODEL or -m MODEL"))?;
    let n_gpu_layers = args.compat.n_gpu_layers_list()?;
    if !args.n_parallel.is_empty() {
        anyhow::ensure!(
            n_gpu_layers.len() <= 1,
            "-ngl takes one layer count here (only `bench` without --npl takes a list)"
        );
        anyhow::ensure!(
            args.threads.len() <= 1,
            "--npl measures one thread count at a time; give -t once"
        );
        let model = model_path(&model)?;
        use crate::cli::batched_bench;
        let options = batched_bench::BatchedOptions {
            n_prompt: args.n_prompt,
            n_gen: args.n_gen,
            n_parallel: args.n_parallel,
            n_threads: thread_counts(args.threads)[0],
            backend: args.backend,
            n_gpu_layers: n_gpu_layers[0],
            seed: 1,
        };
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(batched_bench::markdown_header().as_bytes())?;
        batched_bench::run_batched(&model, &options, |r| {
            stdout.write_all(batched_bench::markdown_row(r).as_bytes())?;
            stdout.flush()
        })?;
        return Ok(());
    }
    anyhow::ensure!(
        args.batch_size >= 1 && args.ubatch_size >= 1,
        "-b and -ub must be at least 1 (got {} and {})",
        args.batch_size,
        args.ubatch_size
    );
    // Checked before the model is read.
    let grammar = args.grammar.spec()?.map(|(_, spec)| spec);
    let model = model_path(&model)?;
    use crate::cli::bench;
    let options = bench::BenchOptions {
        n_prompt: args.n_prompt,
        n_gen: args.n_gen,
        pg: args.pg,
        n_depth: args.n_depth,
        n_ubatch: args.batch_size.min(args.ubatch_size),
        n_threads: thread_counts(args.threads),
        repetitions: args.repetitions,
        backend: args.backend,
        n_gpu_layers,
        bandwidth: args.bandwidth,
        handoff: args.handoff,
        grammar,
        profile: args.profile,
        ..Default::default()
    };
    let model = &model;
    let mut stdout = std::io::stdout().lock();
    match args.output {
        BenchFormat::Md => {
            let mut header = Some(bench::markdown_header());
            let results = bench::run_bench(model, &options, |r| {
                if let Some(h) = header.take() {
                    stdout.write_all(h.as_bytes())?;
                }
                stdout.write_all(bench::markdown_row(r).as_bytes())?;
                stdout.flush()
            })?;
            stdout.write_all(bench::markdown_footer(&results).as_bytes())?;
            for r in &results {
                if let Some(profile) = &r.profile {
                    let title = format!("\n### Profile: {} at {} threads\n\n", r.test_name(), r.n_threads);
                    stdout.write_all(title.as_bytes())?;
                    stdout.write_all(profile.to_markdown().as_bytes())?;
                }
            }
        }
        BenchFormat::Json => {
            let results = bench::run_bench(model, &options, |_| Ok(()))?;
            stdout.write_all(bench::to_json(&results).as_bytes())?;
        }
        BenchFormat::Jsonl => {
            // Each row as its test ends; the run-wide figures (--bandwidth, --handoff) come after
            // every test, so they are in the final rows only as JSON would have them.
            bench::run_bench(model, &options, |r| {
                stdout.write_all(bench::to_json_line(r).as_bytes())?;
                stdout.flush()
            })?;
        }
        BenchFormat::Csv => {
            let results = bench::run_bench(model, &options, |_| Ok(()))?;
            stdout.write_all(bench::to_csv(&results).as_bytes())?;
        }
    }
    stdout.flush()?;
    Ok(())
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum BenchFormat {
    Md,
    Json,
    Jsonl,
    Csv,
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

/// `minfer bench`'s flags.
#[derive(clap::Args)]
pub(crate) struct BenchArgs {
    /// The GGUF model file (or -m FILE).
    #[arg(required_unless_present = "model_flag")]
    pub(crate) model: Option<PathBuf>,
    /// The GGUF model file, as llama-bench takes it.
    #[arg(short = 'm', long = "model", value_name = "FILE", conflicts_with = "model")]
    pub(crate) model_flag: Option<PathBuf>,
    /// A prompt-then-generation test, P prompt tokens then N generated ones, timed together
    /// (`ppP+tgN`; repeatable).
    #[arg(long = "pg", value_name = "P,N", value_parser = parse_pg)]
    pub(crate) pg: Vec<(usize, usize)>,
    /// Context depths (comma-separated): each test runs after this many tokens were
    /// evaluated, untimed (`pp512 @ d1024`).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub(crate) n_depth: Vec<usize>,
    /// Most prompt tokens one forward pass reads (llama-bench's -b); prompts are read in
    /// passes of the smaller of this and --ubatch-size.
    #[arg(short = 'b', long = "batch-size", value_name = "N", default_value_t = 2048)]
    pub(crate) batch_size: usize,
    /// Prompt tokens per forward pass (llama-bench's -ub).
    #[arg(long = "ubatch-size", value_name = "N", default_value_t = 512)]
    pub(crate) ubatch_size: usize,
    /// Prompt sizes in tokens (comma-separated).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub(crate) n_prompt: Vec<usize>,
    /// Generation lengths in tokens (comma-separated).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub(crate) n_gen: Vec<usize>,
    /// Thread counts (comma-separated; default: the number of physical cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub(crate) threads: Vec<usize>,
    /// Timed repetitions of each test, after one warm-up run.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub(crate) repetitions: usize,
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
    /// Output format: a markdown table, llama-bench's JSON array, JSON lines (one object per
    /// test, as each ends), or CSV with the JSON's field names as the header.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = BenchFormat::Md)]
    pub(crate) output: BenchFormat,
    /// Parallel sequence counts (comma-separated): llama-batched-bench's measurement, each of
    /// -p prompt tokens and -n generated tokens, all sequences in one batch per step.
    #[arg(long = "npl", value_delimiter = ',')]
    pub(crate) n_parallel: Vec<usize>,
    /// Run only on this backend (or comma-separated list); also MINFER_BACKENDS.
    #[arg(long, value_name = "NAME")]
    pub(crate) backend: Option<String>,
    #[command(flatten)]
    pub(crate) compat: AccelArgs,
}
