//! `minfer info`: a summary of a GGUF model in the spirit of llama.cpp's load-time dump —
//! format, size, file type, hyper-parameters, tokenizer, chat template, tensor types — and
//! optionally the full tensor table.
//!
//! It reads metadata only and must work for any GGUF file, including architectures minfer
//! cannot run: a missing key prints as `-`, never as an error.

use minfer::gguf::{Array, GgufFile, Metadata, Value};
use std::fmt::Write;

/// llama.cpp's `llama_model_ftype_name` for `general.file_type`: the file-type table's
/// (`minfer::quantize::llama_ftype_name`).
pub fn file_type_name(ftype: u64) -> &'static str {
    minfer::quantize::llama_ftype_name(ftype)
}

fn show_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::F32(x) => format!("{x}"),
        Value::F64(x) => format!("{x}"),
        Value::Bool(b) => b.to_string(),
        Value::Array(a) => format!("[{} × {}]", a.len(), a.element_type()),
        other => other.as_i128().map(|i| i.to_string()).unwrap_or_default(),
    }
}

/// What a model with sliding-window layers (Gemma's local layers) needs at its full context, with
/// the window cache its sessions keep and with `--swa-full`, as llama.cpp sizes them (one
/// sequence, passes of 512 tokens, an f16 cache). Only for a model minfer can run: the layer
/// pattern is the architecture's rule.
fn window_cache(w: &mut String, file: &GgufFile) {
    let Ok(model) = minfer::models::load_model(file) else {
        return;
    };
    let hp = model.hparams();
    let n_local = (0..hp.n_layer).filter(|&il| hp.is_swa(il)).count();
    if n_local == 0 {
        return;
    }
    use minfer::graph::DType;
    // At the model's training context: where the window cache matters most.
    let n_ctx = hp.n_ctx_train;
    let n_ctx_swa = minfer::engine::KvWindow::size(hp.n_swa, 1, minfer::engine::PREFILL_CHUNK);
    let mib = |n_ctx_swa| {
        minfer::engine::kv_cache_bytes(hp, DType::F16, DType::F16, n_ctx, n_ctx_swa) as f64 / (1 << 20) as f64
    };
    let _ = writeln!(
        w,
        "  {:<15}= {n_local} of {} layers see a {}-position window: f16 at n_ctx {n_ctx}, {:.1} MiB \
         (their window cache holds {n_ctx_swa} cells), {:.1} MiB with --swa-full",
        "sliding window",
        hp.n_layer,
        hp.n_swa,
        mib(n_ctx_swa),
        mib(0)
    );
}

/// A mixture-of-experts file's `(expert_used_count, expert_count)`: a decode step reads that
/// share of each expert tensor (`*_exps.*`). `None` for a dense model.
pub(crate) fn expert_share(file: &GgufFile, arch: &str) -> Option<(u64, u64)> {
    let m = file.metadata();
    let n_expert = m.get_uint(&format!("{arch}.expert_count")).ok()?;
    let n_used = m.get_uint(&format!("{arch}.expert_used_count")).ok()?;
    (n_expert > 0 && n_used > 0 && n_used <= n_expert).then_some((n_used, n_expert))
}

/// For a mixture-of-experts file (its `*_exps.*` tensors, `{arch}.expert_count` and
/// `expert_used_count`): the parameters a token works with, and the bytes a decode step reads —
/// every dense weight but the embedding (one row of it), and the used share of each expert
/// tensor (only the chosen experts' rows are read).
fn experts(w: &mut String, file: &GgufFile, arch: &str) {
    let Some((n_used, n_expert)) = expert_share(file, arch) else {
        return;
    };
    let share = |n: u64| (n as u128 * n_used as u128 / n_expert as u128) as u64;
    let (mut params, mut bytes, mut expert_params) = (0u64, 0u64, 0u64);
    for t in file.tensors() {
        if t.name.contains("_exps.") {
            expert_params += t.n_elements();
            params += share(t.n_elements());
            bytes += share(t.size);
        } else if t.name == "token_embd.weight" {
            params += t.n_elements();
            bytes += t
                .shape
                .get(1)
                .filter(|&&rows| rows > 0)
                .map_or(t.size, |rows| t.size / rows);
        } else {
            params += t.n_elements();
            bytes += t.size;
        }
    }
    let _ = writeln!(
        w,
        "active params  = {} a token ({n_used} of {n_expert} experts; {} of the experts' weights)",
        human_count(params),
        human_count(expert_params)
    );
    let _ = writeln!(
        w,
        "read per token = {} (the dense weights, the chosen experts' rows, one embedding row)",
        human_bytes(bytes)
    );
}

fn meta_or_dash(m: &Metadata, key: &str) -> String {
    m.get(key).map(show_value).unwrap_or_else(|| "-".to_string())
}

fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.2} GiB", n / (1024.0 * 1024.0 * 1024.0))
    } else {
        format!("{:.2} MiB", n / (1024.0 * 1024.0))
    }
}

fn human_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.2} K", n as f64 / 1e3),
        n => n.to_string(),
    }
}

fn token_text(m: &Metadata, id: u64) -> String {
    match m.get("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(tokens))) => tokens
            .get(id as usize)
            .map(|t| format!("{id} '{}'", t.escape_debug()))
            .unwrap_or_else(|| format!("{id} (out of range)")),
        _ => id.to_string(),
    }
}

/// Render the summary; with `tensors`, append the tensor table.
pub fn render(file: &GgufFile, tensors: bool) -> String {
    let m = file.metadata();
    let mut out = String::new();
    let arch = m.get_str("general.architecture").unwrap_or("-").to_string();
    let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
    let n_bytes: u64 = file.tensors().iter().map(|t| t.size).sum();
    let n_parts = file.paths().count();

    let w = &mut out;
    let _ = writeln!(w, "file format    = GGUF V{}", file.version());
    let _ = writeln!(
        w,
        "file size      = {} ({} bytes{})",
        human_bytes(file.file_size()),
        file.file_size(),
        if n_parts > 1 {
            format!(", {n_parts} parts")
        } else {
            String::new()
        }
    );
    match m.get_uint("general.file_type") {
        Ok(ft) => {
            let _ = writeln!(w, "file type      = {} ({ft})", file_type_name(ft));
        }
        Err(_) => {
            let _ = writeln!(w, "file type      = -");
        }
    }
    let bpw = if n_params > 0 {
        n_bytes as f64 * 8.0 / n_params as f64
    } else {
        0.0
    };
    let _ = writeln!(
        w,
        "model params   = {} ({n_params}, {bpw:.2} bits per weight)",
        human_count(n_params)
    );
    experts(w, file, &arch);
    let _ = writeln!(w, "architecture   = {arch}");
    let _ = writeln!(w, "name           = {}", meta_or_dash(m, "general.name"));

    let _ = writeln!(w, "\nhyper-parameters ({arch}.*)");
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let hp = |suffix: &str| meta_or_dash(m, &key(suffix));
    let n_embd = m.get_uint(&key("embedding_length")).ok();
    let n_head = m.get_uint(&key("attention.head_count")).ok();
    let n_head_kv = m.get_uint(&key("attention.head_count_kv")).ok().or(n_head);
    let head_dim = match (n_embd, n_head) {
        (Some(e), Some(h)) if h > 0 => Some(e / h),
        _ => None,
    };
    let n_embd_head_k = m.get_uint(&key("attention.key_length")).ok().or(head_dim);
    let n_embd_head_v = m.get_uint(&key("attention.value_length")).ok().or(head_dim);
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    let n_gqa = match (n_head, n_head_kv) {
        (Some(h), Some(kv)) if kv > 0 => Some(h / kv),
        _ => None,
    };
    let rows: [(&str, String); 11] = [
        ("n_ctx_train", hp("context_length")),
        ("n_embd", hp("embedding_length")),
        ("n_layer", hp("block_count")),
        ("n_head", hp("attention.head_count")),
        ("n_head_kv", opt(n_head_kv)),
        ("n_embd_head_k", opt(n_embd_head_k)),
        ("n_embd_head_v", opt(n_embd_head_v)),
        ("n_gqa", opt(n_gqa)),
        ("n_ff", hp("feed_forward_length")),
        ("f_norm_rms_eps", hp("attention.layer_norm_rms_epsilon")),
        ("rope_freq_base", hp("rope.freq_base")),
    ];
    for (name, value) in rows {
        let _ = writeln!(w, "  {name:<15}= {value}");
    }
    // What changes the computation only where a file has it: RoPE scaling, Granite's scales.
    let optional = [
        ("rope_scaling", "rope.scaling.type"),
        ("rope_scale", "rope.scaling.factor"),
        ("f_embd_scale", "embedding_scale"),
        ("f_resid_scale", "residual_scale"),
        ("f_attn_scale", "attention.scale"),
        ("f_logit_scale", "logit_scale"),
        ("n_expert", "expert_count"),
        ("n_expert_used", "expert_used_count"),
        ("n_ff_exp", "expert_feed_forward_length"),
        ("n_ff_shexp", "expert_shared_feed_forward_length"),
    ];
    for (name, suffix) in optional {
        if m.contains(&key(suffix)) {
            let _ = writeln!(w, "  {name:<15}= {}", hp(suffix));
        }
    }
    if let Ok(t) = file.tensor("rope_freqs.weight") {
        let _ = writeln!(
            w,
            "  {:<15}= {} frequency factors (rope_freqs.weight)",
            "rope_freqs",
            t.n_elements()
        );
    }
    // K and V of every layer, per token, in each cache type (`--cache-type-k/v`).
    if let (Some(n_layer), Some(kv), Some(dk), Some(dv)) = (
        m.get_uint(&key("block_count")).ok(),
        n_head_kv,
        n_embd_head_k,
        n_embd_head_v,
    ) {
        use minfer::graph::DType;
        let _ = writeln!(w, "\nKV cache (K and V of {n_layer} layers)");
        for dtype in [DType::F32, DType::F16, DType::Q8_0] {
            let per_token = n_layer as usize * (dtype.bytes((kv * dk) as usize) + dtype.bytes((kv * dv) as usize));
            let _ = writeln!(
                w,
                "  {:<15}= {per_token} bytes per token, {:.1} MiB at n_ctx 4096",
                dtype.name(),
                (per_token * 4096) as f64 / (1 << 20) as f64
            );
        }
        window_cache(w, file);
    }

    let _ = writeln!(w, "\ntokenizer");
    let n_vocab = m
        .get_array("tokenizer.ggml.tokens")
        .map(|a| a.len().to_string())
        .unwrap_or_else(|_| "-".into());
    let n_merges = m
        .get_array("tokenizer.ggml.merges")
        .map(|a| a.len().to_string())
        .unwrap_or_else(|_| "-".into());
    let _ = writeln!(
        w,
        "  {:<15}= {} (pre = {})",
        "model",
        meta_or_dash(m, "tokenizer.ggml.model"),
        meta_or_dash(m, "tokenizer.ggml.pre")
    );
    let _ = writeln!(w, "  {:<15}= {n_vocab}", "n_vocab");
    let _ = writeln!(w, "  {:<15}= {n_merges}", "n_merges");
    for (label, k) in [
        ("BOS token", "tokenizer.ggml.bos_token_id"),
        ("EOS token", "tokenizer.ggml.eos_token_id"),
        ("EOT token", "tokenizer.ggml.eot_token_id"),
        ("PAD token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Ok(id) = m.get_uint(k) {
            let _ = writeln!(w, "  {label:<15}= {}", token_text(m, id));
        }
    }
    let _ = writeln!(
        w,
        "  {:<15}= {}",
        "add_bos_token",
        meta_or_dash(m, "tokenizer.ggml.add_bos_token")
    );
    let template = match m.get_str("tokenizer.chat_template") {
        Ok(t) => format!("present ({} bytes)", t.len()),
        Err(_) => "absent (ChatML will be used)".to_string(),
    };
    let _ = writeln!(w, "  {:<15}= {template}", "chat template");

    let counts = file.tensor_type_counts();
    let summary: Vec<String> = counts.iter().map(|(t, n, _)| format!("{t} {n}")).collect();
    let _ = writeln!(w, "\ntensors: {} ({})", file.tensors().len(), summary.join(", "));
    for (t, n, bytes) in &counts {
        let _ = writeln!(w, "  {:<8} {n:>5} tensors {:>12}", t.name(), human_bytes(*bytes));
    }

    if tensors {
        let name_width = file.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
        let _ = writeln!(
            w,
            "\n{:>5}  {:<name_width$}  {:<6}  {:<24}  {:>12}  {:>12}",
            "#", "name", "type", "shape", "offset", "bytes"
        );
        for (i, t) in file.tensors().iter().enumerate() {
            let shape = format!(
                "[{}]",
                t.shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
            );
            let offset = if n_parts > 1 {
                format!("{}:{}", t.part + 1, t.offset)
            } else {
                t.offset.to_string()
            };
            let _ = writeln!(
                w,
                "{i:>5}  {:<name_width$}  {:<6}  {shape:<24}  {offset:>12}  {:>12}",
                t.name,
                t.ggml_type.name(),
                t.size
            );
        }
    }
    out
}
