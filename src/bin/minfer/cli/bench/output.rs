//! `minfer bench`'s rows as llama-bench writes them: its 42 fields in its order, typed and quoted
//! as it types and quotes them, in CSV, JSON, JSON lines, SQL and its markdown table, with
//! minfer's own fields after them. Formatting only: what is measured is the parent module's.

use super::*;

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
    use crate::cli::bench::tests::row;

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
}
