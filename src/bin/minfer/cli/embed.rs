//! `minfer embed`: texts in, one pooled vector each out, printed as llama-embedding prints them
//! with `--embd-output-format` (`json`, `array`, `json+`). The engine pools and normalizes;
//! this file only reads the inputs and writes the numbers.

use minfer::engine::{cosine_similarity, Embedder, Model, Normalize};
use minfer::graph::DType;
use minfer::models::pooling::Pooling;
use std::fmt::Write;

/// How the vectors are printed (llama-embedding's `--embd-output-format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// `{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}]}`.
    Json,
    /// `json` plus `"cosineSimilarity"`, the inputs' pairwise cosines (with two inputs or more).
    JsonPlus,
    /// `[[...], [...]]`.
    Array,
}

impl OutputFormat {
    /// The format named as llama-embedding names it.
    pub fn parse(name: &str) -> anyhow::Result<OutputFormat> {
        Ok(match name {
            "json" => OutputFormat::Json,
            "json+" => OutputFormat::JsonPlus,
            "array" => OutputFormat::Array,
            other => anyhow::bail!("--embd-output-format {other}: expected json, json+ or array"),
        })
    }
}

/// The inputs: each TEXT, then each non-empty line of FILE (llama-embedding's one prompt a
/// line), in order.
pub fn inputs(texts: &[String], file: Option<&[u8]>) -> anyhow::Result<Vec<String>> {
    let mut inputs = texts.to_vec();
    if let Some(bytes) = file {
        let text = std::str::from_utf8(bytes).map_err(|e| anyhow::anyhow!("the input file is not UTF-8: {e}"))?;
        inputs.extend(text.lines().filter(|l| !l.trim().is_empty()).map(str::to_string));
    }
    anyhow::ensure!(!inputs.is_empty(), "nothing to embed: give a TEXT or -f FILE");
    Ok(inputs)
}

/// Every input embedded in one embedder over `model`: one vector each (one per token with
/// pooling `none`, all of them in order).
pub fn embed(
    model: &Model,
    inputs: &[String],
    pooling: Option<Pooling>,
    normalize: Normalize,
    n_batch: usize,
    kv_types: (DType, DType),
) -> anyhow::Result<Vec<Vec<f32>>> {
    let tokens: Vec<Vec<u32>> = inputs.iter().map(|t| model.encode(t)).collect();
    let mut embedder = Embedder::for_model(model, pooling, n_batch, inputs.len())?;
    embedder.set_kv_types(kv_types.0, kv_types.1)?;
    let rows = embedder.embed(&tokens, normalize)?;
    Ok(rows.into_iter().flatten().collect())
}

/// The vectors as llama-embedding's `format` prints them, every value in full f32 precision.
pub fn render(vectors: &[Vec<f32>], format: OutputFormat) -> String {
    let row = |v: &[f32]| serde_json::to_string(v).expect("floats serialize");
    let mut out = String::new();
    if format == OutputFormat::Array {
        let rows: Vec<String> = vectors.iter().map(|v| row(v)).collect();
        return format!("[{}]\n", rows.join(","));
    }
    out.push_str("{\n  \"object\": \"list\",\n  \"data\": [\n");
    for (i, v) in vectors.iter().enumerate() {
        let sep = if i + 1 < vectors.len() { "," } else { "" };
        let _ = writeln!(
            out,
            "    {{\n      \"object\": \"embedding\",\n      \"index\": {i},\n      \"embedding\": {}\n    }}{sep}",
            row(v)
        );
    }
    out.push_str("  ]");
    if format == OutputFormat::JsonPlus && vectors.len() > 1 {
        out.push_str(",\n  \"cosineSimilarity\": [\n");
        for (i, a) in vectors.iter().enumerate() {
            let cells: Vec<String> = vectors
                .iter()
                .map(|b| format!("{:.2}", cosine_similarity(a, b)))
                .collect();
            let sep = if i + 1 < vectors.len() { "," } else { "" };
            let _ = writeln!(out, "    [{}]{sep}", cells.join(", "));
        }
        out.push_str("  ]");
    }
    out.push_str("\n}\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_output_is_llama_embeddings_list_and_array_is_bare_rows() {
        let v = vec![vec![0.5f32, -1.0], vec![1.0, 0.0]];
        let json: serde_json::Value = serde_json::from_str(&render(&v, OutputFormat::Json)).unwrap();
        assert_eq!(json["object"], "list");
        assert_eq!(json["data"][1]["index"], 1);
        assert_eq!(json["data"][0]["embedding"], serde_json::json!([0.5, -1.0]));
        assert!(json.get("cosineSimilarity").is_none());
        let plus: serde_json::Value = serde_json::from_str(&render(&v, OutputFormat::JsonPlus)).unwrap();
        assert_eq!(plus["cosineSimilarity"][0][0], 1.0);
        let array: serde_json::Value = serde_json::from_str(&render(&v, OutputFormat::Array)).unwrap();
        assert_eq!(array, serde_json::json!([[0.5, -1.0], [1.0, 0.0]]));
    }

    #[test]
    fn inputs_are_the_texts_then_the_files_non_empty_lines() {
        let got = inputs(&["a".into()], Some(b"b\n\n c \n")).unwrap();
        assert_eq!(got, ["a", "b", " c "]);
        assert!(inputs(&[], None).is_err());
        assert!(OutputFormat::parse("raw").is_err());
    }
}
