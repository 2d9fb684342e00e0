//! `minfer bench`: the flags turned into bench options, and the rows written in the format
//! asked for. Measuring is `minfer::cli::bench`'s.

use super::*;

/// `bench`'s `--json-schema` or `--grammar`, checked before the model is read.
pub(super) fn bench_grammar(
    json_schema: Option<String>,
    grammar: Option<String>,
) -> anyhow::Result<Option<minfer::grammar::GrammarSpec>> {
    use minfer::grammar::GrammarSpec;
    if let Some(text) = json_schema {
        let schema = serde_json::from_str(&text).context("--json-schema is not JSON")?;
        return Ok(Some(GrammarSpec::JsonSchema(schema)));
    }
    if let Some(text) = grammar {
        minfer::grammar::gbnf::to_lark(&text).context("--grammar does not parse")?;
        return Ok(Some(GrammarSpec::Gbnf(text)));
    }
    Ok(None)
}

/// The model of `bench`: the positional argument or `-m` (clap lets exactly one through).
pub(super) fn bench_model(model: Option<PathBuf>, flag: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let model = model
        .or(flag)
        .ok_or_else(|| anyhow::anyhow!("bench needs a model: minfer bench MODEL or -m MODEL"))?;
    model_path(&model)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_bench(
    model: &Path,
    n_gpu_layers: Vec<Option<usize>>,
    n_prompt: Vec<usize>,
    n_gen: Vec<usize>,
    pg: Vec<(usize, usize)>,
    n_depth: Vec<usize>,
    n_ubatch: usize,
    threads: Vec<usize>,
    repetitions: usize,
    bandwidth: bool,
    handoff: bool,
    profile: bool,
    grammar: Option<minfer::grammar::GrammarSpec>,
    output: BenchFormat,
    backend: Option<String>,
) -> anyhow::Result<()> {
    use minfer::cli::bench;
    let options = bench::BenchOptions {
        n_prompt,
        n_gen,
        pg,
        n_depth,
        n_ubatch,
        n_threads: if threads.is_empty() {
            vec![minfer::engine::default_threads()]
        } else {
            threads
        },
        repetitions,
        backend,
        n_gpu_layers,
        bandwidth,
        handoff,
        grammar,
        profile,
        ..Default::default()
    };
    let mut stdout = std::io::stdout().lock();
    match output {
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
