//! `minfer bench` on the tiny model: llama-bench's rows and fields, in JSON and markdown, and
//! its refusals. No test looks at a speed beyond its being positive.

mod common;

use std::process::{Command, Output};

/// `minfer bench` on the tiny model, fenced to the CPU: the rows these tests read say `CPU`
/// on a machine with a GPU too.
fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .env("MINFER_BACKENDS", "cpu")
        .arg("bench")
        .arg(common::tiny_model("qwen2", "Q4_K"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "minfer bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

#[test]
fn json_output_has_one_llama_bench_row_per_test_and_thread_count() {
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "2", "-t", "1,2", "-o", "json"]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let shape: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["n_threads"].as_u64().unwrap(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shape, [(1, 16, 0), (1, 0, 4), (2, 16, 0), (2, 0, 4)]);

    let file = std::fs::metadata(common::tiny_model("qwen2", "Q4_K")).unwrap().len();
    for r in &rows {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["stddev_ts"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["avg_ns"].as_u64().unwrap() > 0, "{r}");
        assert!(r["stddev_ns"].is_u64(), "{r}");
        let ts = r["samples_ts"].as_array().unwrap();
        let ns = r["samples_ns"].as_array().unwrap();
        assert_eq!((ts.len(), ns.len()), (2, 2), "{r}");
        // Each rate is the run's tokens over its time, to the six digits llama-bench writes.
        let n_tokens = r["n_prompt"].as_f64().unwrap() + r["n_gen"].as_f64().unwrap();
        for (t, n) in ts.iter().zip(ns) {
            let want = n_tokens * 1e9 / n.as_f64().unwrap();
            assert!((t.as_f64().unwrap() - want).abs() <= 5e-6 * want, "{r}");
        }
        assert!(r["model_filename"].as_str().unwrap().ends_with("tiny-qwen2-Q4_K.gguf"));
        assert!(r["model_type"].as_str().unwrap().starts_with("qwen2 "), "{r}");
        // Tensor bytes: most of the file, never more.
        let size = r["model_size"].as_u64().unwrap();
        assert!(
            size > file / 2 && size < file,
            "model_size {size} for a {file}-byte file"
        );
        assert!(r["model_n_params"].as_u64().unwrap() > 1_000_000, "{r}");
        assert!(r["peak_rss_bytes"].as_u64().unwrap() > 1_000_000, "{r}");
    }
}

#[test]
fn markdown_output_is_llama_benchs_table() {
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "2", "-t", "1,2"]));
    let lines: Vec<&str> = out.lines().collect();
    // On the CPU, llama-bench's columns: no `ngl`, and `threads` always.
    let llama = std::fs::read_to_string(common::fixtures().join("bench/llama-bench.md")).unwrap();
    assert_eq!(lines[..2], llama.lines().take(2).collect::<Vec<_>>()[..], "{out}");
    let rows: Vec<Vec<&str>> = lines[2..6]
        .iter()
        .map(|l| l.trim_matches('|').split('|').map(str::trim).collect())
        .collect();
    let tests: Vec<(&str, &str)> = rows.iter().map(|r| (r[4], r[5])).collect();
    assert_eq!(
        tests,
        [("1", "pp16"), ("1", "tg4"), ("2", "pp16"), ("2", "tg4")],
        "{out}"
    );
    for r in &rows {
        assert_eq!(r[3], "CPU");
        assert!(r[1].ends_with(" MiB") && r[2].ends_with(" M"), "{r:?}");
        let (mean, sd) = r[6].split_once(" ± ").expect("mean ± stddev");
        assert!(mean.parse::<f64>().unwrap() > 0.0 && sd.parse::<f64>().unwrap() >= 0.0);
    }
    assert!(out.contains("peak RSS:"), "{out}");
}

#[test]
fn zero_sizes_skip_tests_and_nothing_to_run_is_an_error() {
    let out = stdout(&bench(&["-p", "0", "-n", "3", "-r", "1", "-t", "1", "-o", "json"]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0]["n_prompt"].as_u64(), rows[0]["n_gen"].as_u64()),
        (Some(0), Some(3))
    );

    let out = bench(&["-p", "0", "-n", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to measure"));
    let out = bench(&["-p", "4", "-n", "0", "-t", "0"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("thread count"));
}

#[test]
fn a_test_longer_than_the_models_context_is_refused() {
    let out = bench(&["-p", "100000", "-n", "0", "-r", "1", "-t", "1"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("needs 100000 tokens of context"), "{err}");
}

#[test]
fn with_bandwidth_generation_is_reported_against_the_rate_the_memory_allows() {
    let out = stdout(&bench(&[
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "json",
        "--bandwidth",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let r = &rows[0];
    let gbs = r["mem_read_gbs"].as_f64().unwrap();
    let bytes = r["weight_bytes_per_token"].as_u64().unwrap();
    let bound = r["gen_bound_ts"].as_f64().unwrap();
    assert!(gbs > 0.0 && bytes > 0, "{r}");
    assert!((bound - gbs * 1e9 / bytes as f64).abs() <= 1e-6 * bound, "{r}");

    let md = stdout(&bench(&["-p", "0", "-n", "4", "-r", "1", "-t", "1", "--bandwidth"]));
    assert!(
        md.contains("tg4 at 1 threads:") && md.contains("% of the bandwidth bound"),
        "{md}"
    );
    let plain = stdout(&bench(&["-p", "0", "-n", "4", "-r", "1", "-t", "1", "-o", "json"]));
    assert!(!plain.contains("mem_read_gbs"), "{plain}");
}

/// `minfer bench` with llama-bench's own way of naming the model (`-m`) and no positional one.
fn bench_m(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_minfer"))
        .env("MINFER_BACKENDS", "cpu")
        .args(["bench", "-m"])
        .arg(common::tiny_model("qwen2", "Q4_K"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn llama_benchs_model_flag_prompt_generation_pairs_and_depths_give_its_rows() {
    let out = stdout(&bench_m(&[
        "-p", "16", "-n", "4", "-pg", "16,4", "-d", "0,24", "-r", "1", "-t", "1", "-o", "jsonl",
    ]));
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shape: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            (
                r["n_depth"].as_u64().unwrap(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shape,
        [(0, 16, 0), (0, 0, 4), (0, 16, 4), (24, 16, 0), (24, 0, 4), (24, 16, 4)]
    );
    for r in &rows {
        assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["type_k"], "f16");
    }
    let md = stdout(&bench_m(&[
        "-pg", "16,4", "-d", "24", "-p", "0", "-n", "0", "-r", "1", "-t", "1",
    ]));
    assert!(md.contains("pp16+tg4 @ d24 |"), "{md}");
    // The kernels each test ran are named under the table.
    assert!(md.contains("pp16+tg4 @ d24 at 1 threads: "), "{md}");
}

#[test]
fn csv_output_has_a_line_per_test_and_the_samples_in_one_cell() {
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "2", "-t", "1", "-o", "csv"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    let header: Vec<&str> = lines[0].split(',').collect();
    for field in [
        "model_type",
        "n_threads",
        "n_prompt",
        "n_gen",
        "n_depth",
        "avg_ts",
        "samples_ts",
    ] {
        assert!(header.contains(&field), "{field} missing from {}", lines[0]);
    }
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    // The kernels cell may hold commas (`repacked (Q8_0), gemm (Q8_0)`): it is quoted.
    let first = csv_fields(lines[1]);
    assert_eq!(first.len(), header.len(), "{}", lines[1]);
    assert_eq!(first[col("n_prompt")], "\"16\"");
    assert_eq!(
        csv_fields(lines[2]).get(col("n_gen")).map(String::as_str),
        Some("\"4\"")
    );
    // Two repetitions: the samples are one quoted, space-separated cell.
    assert_eq!(first[col("samples_ns")].trim_matches('"').split(' ').count(), 2);
}

/// The fields of a CSV line, split at the commas outside double quotes (quotes kept).
fn csv_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            ',' if !quoted => {
                fields.push(String::new());
                continue;
            }
            _ => {}
        }
        fields.last_mut().expect("one field at least").push(c);
    }
    fields
}

#[test]
fn the_model_twice_or_a_malformed_pair_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_minfer"))
        .args(["bench", "a.gguf", "-m", "b.gguf"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--model"));
    let err = bench_m(&["-pg", "16"]);
    assert!(!err.status.success());
    assert!(String::from_utf8_lossy(&err.stderr).contains("-pg takes PROMPT,GEN"));
}

#[test]
fn the_ubatch_size_splits_the_prompt_and_both_sizes_are_reported_as_asked() {
    let out = stdout(&bench_m(&[
        "-p", "64", "-n", "0", "-ub", "4", "-r", "1", "-t", "1", "-o", "json",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (rows[0]["n_batch"].as_u64(), rows[0]["n_ubatch"].as_u64()),
        (Some(2048), Some(4))
    );
    // Passes of 4 tokens are below the matrix-matrix kernel's threshold: the dot products ran.
    assert!(!rows[0]["kernels"].as_str().unwrap().contains("gemm"), "{}", rows[0]);
    // -b below -ub: passes of -b tokens, each size reported as given, as llama-bench does.
    let out = stdout(&bench_m(&[
        "-p", "64", "-n", "0", "-b", "4", "-r", "1", "-t", "1", "-o", "json",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (rows[0]["n_batch"].as_u64(), rows[0]["n_ubatch"].as_u64()),
        (Some(4), Some(512))
    );
    assert!(!rows[0]["kernels"].as_str().unwrap().contains("gemm"), "{}", rows[0]);
}

/// `--profile` adds where each test's time went: op kinds, weight matrices and layers, whose
/// times add up to the time inside nodes, with rates for the matrix products only; Markdown
/// output prints the tables after the rows.
#[test]
fn the_profile_splits_each_tests_time_by_op_matrix_and_layer() {
    let out = stdout(&bench(&[
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
        "-o",
        "json",
        "--profile",
    ]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    for row in &rows {
        let p = &row["profile"];
        // Two timed runs: the prompt in one pass each, or four tokens each.
        let steps = if row["n_prompt"].as_u64() == Some(16) { 2 } else { 8 };
        assert_eq!(p["n_steps"], steps, "{p}");
        let node_s = p["node_seconds"].as_f64().unwrap();
        assert!(node_s > 0.0 && node_s <= p["step_seconds"].as_f64().unwrap());
        for table in ["ops", "layers", "matmuls"] {
            let sum: f64 = p[table]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["seconds"].as_f64().unwrap())
                .sum();
            assert!(
                (sum - node_s).abs() <= 1e-6 + node_s * 1e-6 || table == "matmuls",
                "{table}: {p}"
            );
        }
        let ops = p["ops"].as_array().unwrap();
        let matmul = ops.iter().find(|r| r["name"] == "MatMul").expect("a MatMul row");
        assert!(matmul["gb_per_s"].as_f64().unwrap() > 0.0 && matmul["gflop_per_s"].as_f64().unwrap() > 0.0);
        let rms = ops.iter().find(|r| r["name"] == "RmsNorm").expect("an RmsNorm row");
        assert!(rms.get("gb_per_s").is_none());
        // The tiny model's two layers, then the embedding and the head.
        let layers: Vec<&str> = p["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(layers, ["layer 0", "layer 1", "outside layers"]);
        assert!(p["matmuls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"].as_str().unwrap().starts_with("ffn_down.weight")));
    }
    let md = stdout(&bench(&["-p", "16", "-n", "0", "-r", "1", "-t", "1", "--profile"]));
    assert!(
        md.contains("### Profile: pp16 at 1 threads") && md.contains("| weight matrix |"),
        "{md}"
    );
}

#[test]
fn gpu_layers_are_a_field_as_asked_and_a_list_runs_each_value() {
    let usable = minfer::backends::probe(minfer::graph::Backend::CUDA).is_ok();
    // -ngl 0 (twice) keeps everything on the CPU: one run per value, reported as asked.
    let out = stdout(&bench(&["-p", "8", "-n", "2", "-r", "1", "-ngl", "0,0", "-o", "json"]));
    let rows: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 4, "{out}");
    for r in &rows {
        assert_eq!(r["n_gpu_layers"].as_i64(), Some(0), "{r}");
        assert_eq!(r["gpu_info"].as_str(), Some(""), "{r}");
        assert_eq!(r["backends"].as_str(), Some("CPU"), "{r}");
    }
    // Without -ngl: llama-bench's -1 (every layer where a GPU can take them).
    let out = stdout(&bench(&["-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"]));
    let row: serde_json::Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(row["n_gpu_layers"].as_i64(), Some(-1), "{row}");
    // On the CPU llama-bench's table has no `ngl` column.
    let table = stdout(&bench(&["-p", "8", "-n", "0", "-r", "1", "-ngl", "0"]));
    assert!(!table.lines().next().unwrap().contains("ngl"), "{table}");
    if !usable {
        // Layers on a GPU without one: refused with the reason, before the model is read.
        let out = bench(&["-p", "8", "-n", "0", "-ngl", "0,99"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("-ngl 99 asks for GPU layers, and no GPU backend is usable here"),
            "{err}"
        );
    }
}

/// llama-bench's output of the same tests (`tests/fixtures/bench/README.md` says how it was
/// made).
fn llama_bench(format: &str) -> String {
    std::fs::read_to_string(common::fixtures().join(format!("bench/llama-bench.{format}"))).unwrap()
}

/// What kind of value a JSON value is: llama-bench's integers, rates, text and booleans.
fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Bool(_) => "bool",
        serde_json::Value::Number(n) if n.is_f64() => "float",
        serde_json::Value::Number(_) => "int",
        serde_json::Value::String(_) => "text",
        serde_json::Value::Array(_) => "list",
        _ => "other",
    }
}

#[test]
fn json_rows_have_llama_benchs_keys_in_its_order_with_its_types_then_minfers() {
    let llama: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_str(&llama_bench("json")).unwrap();
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "json"]));
    let ours: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_str(&out).unwrap();
    assert_eq!(ours.len(), llama.len());
    for (theirs, ours) in llama.iter().zip(&ours) {
        let keys: Vec<&String> = ours.keys().collect();
        let their_keys: Vec<&String> = theirs.keys().collect();
        assert_eq!(keys[..their_keys.len()], their_keys[..], "{out}");
        assert_eq!(their_keys.len(), 44, "42 fields, samples_ns and samples_ts");
        for (key, value) in theirs {
            assert_eq!(
                kind(&ours[key]),
                kind(value),
                "{key}: {} against llama-bench's {value}",
                ours[key]
            );
        }
        // What minfer cannot choose is written as llama-bench writes its default CPU run.
        for key in [
            "n_batch",
            "n_ubatch",
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
            "backends",
            "gpu_info",
        ] {
            assert_eq!(ours[key], theirs[key], "{key}");
        }
        assert_eq!(keys[44..46], ["peak_rss_bytes", "kernels"], "{out}");
    }
    // JSON lines: the same keys, one object a line.
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "jsonl"]));
    for (theirs, ours) in llama_bench("jsonl").lines().zip(out.lines()) {
        let theirs: serde_json::Map<String, serde_json::Value> = serde_json::from_str(theirs).unwrap();
        let ours: serde_json::Map<String, serde_json::Value> = serde_json::from_str(ours).unwrap();
        assert!(ours.keys().take(44).eq(theirs.keys()), "{ours:?}");
    }
}

#[test]
fn csv_has_llama_benchs_header_and_quoting_then_minfers_columns() {
    let llama = llama_bench("csv");
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "csv"]));
    let header: Vec<&str> = out.lines().next().unwrap().split(',').collect();
    let their_header: Vec<&str> = llama.lines().next().unwrap().split(',').collect();
    assert_eq!(their_header.len(), 42);
    assert_eq!(header[..42], their_header[..], "{out}");
    assert_eq!(
        header[42..46],
        ["samples_ns", "samples_ts", "peak_rss_bytes", "kernels"]
    );
    // Every cell quoted, as llama-bench quotes them, and of the kind its cell is.
    let kind = |cell: &str| {
        let v = cell.trim_matches('"');
        if v.parse::<i64>().is_ok() {
            "int"
        } else if v.parse::<f64>().is_ok() {
            "float"
        } else {
            "text"
        }
    };
    for (theirs, ours) in llama.lines().skip(1).zip(out.lines().skip(1)) {
        let (theirs, ours) = (csv_fields(theirs), csv_fields(ours));
        assert_eq!(ours.len(), header.len());
        for ((name, t), o) in their_header.iter().zip(&theirs).zip(&ours) {
            assert!(o.starts_with('"') && o.ends_with('"'), "{name}: {o}");
            // build_commit is text in both, a hash in one and `minfer X.Y.Z` in the other.
            assert_eq!(kind(o), kind(t), "{name}: {o} against llama-bench's {t}");
        }
    }
}

#[test]
fn sql_is_llama_benchs_table_and_both_engines_rows_go_into_it() {
    let llama = llama_bench("sql");
    let out = stdout(&bench(&["-p", "16", "-n", "4", "-r", "1", "-t", "1", "-o", "sql"]));
    let table = |sql: &str| sql.split("\n\n").next().unwrap().to_string();
    assert_eq!(table(&out), table(&llama));
    let columns = |sql: &str| -> Vec<String> {
        sql.lines()
            .filter(|l| l.starts_with("INSERT"))
            .map(|l| l.split(") VALUES").next().unwrap().to_string())
            .collect()
    };
    assert_eq!(columns(&out), columns(&llama));
    // Both scripts into one SQLite database, as llama.cpp's compare-llama-bench.py reads them.
    let dir = std::env::temp_dir().join(format!("minfer-bench-sql-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("minfer.sql"), &out).unwrap();
    let check = Command::new(common::python())
        .arg("-c")
        .arg(
            "import sqlite3, sys\n\
             db = sqlite3.connect(':memory:')\n\
             for f in sys.argv[1:]: db.executescript(open(f).read())\n\
             print(db.execute('SELECT COUNT(*), COUNT(DISTINCT build_commit), SUM(n_gen) FROM llama_bench').fetchone())",
        )
        .arg(common::fixtures().join("bench/llama-bench.sql"))
        .arg(dir.join("minfer.sql"))
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    assert_eq!(String::from_utf8_lossy(&check.stdout).trim(), "(4, 2, 8)");
}

#[test]
fn number_ranges_the_error_stream_and_no_output_are_as_in_llama_bench() {
    // -p 8-16*2 is 8 and 16; -o none prints nothing, --output-err (-oe) writes to stderr.
    let out = bench(&[
        "-p",
        "8-16*2",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "none",
        "--output-err",
        "jsonl",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.stdout.is_empty());
    let prompts: Vec<u64> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["n_prompt"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(prompts, [8, 16]);
}

#[test]
fn load_modes_cache_types_and_flash_attention_are_runs_reported_as_asked() {
    let out = stdout(&bench(&[
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "--load-mode",
        "none,mmap",
        "--mmap",
        "0",
        "-ctk",
        "q8_0",
        "-fa",
        "on",
        "-o",
        "jsonl",
    ]));
    let rows: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let modes: Vec<&str> = rows.iter().map(|r| r["load_mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["none", "mmap", "none"]);
    for r in &rows {
        assert_eq!(
            (r["type_k"].as_str(), r["type_v"].as_str()),
            (Some("q8_0"), Some("f16"))
        );
        assert_eq!(r["flash_attn"].as_i64(), Some(1));
    }
    // The table shows each parameter given other than at its default, as llama-bench does.
    let table = stdout(&bench(&[
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "--load-mode",
        "none",
    ]));
    assert!(table.lines().next().unwrap().contains("|         lm |"), "{table}");
}

#[test]
fn a_llama_bench_parameter_minfer_cannot_honour_is_refused_by_its_flag_with_the_reason() {
    for (args, want) in [
        (
            &["--no-kv-offload", "1"][..],
            "-nkvo/--no-kv-offload 1 cannot be honoured: ",
        ),
        (&["-fa", "off"], "-fa off cannot be honoured: "),
        (&["--device", "CUDA0"], "-dev/--device CUDA0 cannot be honoured: "),
        (&["-p", "1-x"], "'1-x' is not a number list"),
    ] {
        let out = bench(args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn llama_benchs_short_flags_mmp_and_oe_are_read_as_llama_bench_reads_them() {
    let out = bench_m(&[
        "-p", "8", "-n", "0", "-r", "1", "-t", "1", "-mmp", "0", "-o", "jsonl", "-oe", "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let row: serde_json::Value = serde_json::from_str(stdout(&out).lines().next().unwrap()).unwrap();
    assert_eq!(row["load_mode"], "none");
    // -oe json: the same rows, as JSON, on standard error.
    let err = String::from_utf8_lossy(&out.stderr);
    let start = err.find('[').expect("a JSON array on standard error");
    let rows: serde_json::Value = serde_json::from_str(err[start..].trim()).unwrap();
    assert_eq!(rows[0]["load_mode"], "none");
}

/// The proof a llama-bench user asks for: scripts/check-bench-columns.py loads llama-bench's CSV
/// (tests/fixtures/bench) and this binary's into one pandas frame — no column renamed or added
/// among llama-bench's 42, each keeping its type — with the virtualenv's pandas.
#[test]
fn a_llama_bench_csv_and_minfers_load_into_one_pandas_frame() {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/check-bench-columns.py");
    let out = Command::new(common::python())
        .arg(script)
        .args(["--binary", env!("CARGO_BIN_EXE_minfer")])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(text.contains("ok: the same 42 columns"), "{text}");
}
