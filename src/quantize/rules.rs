//! Which type each tensor gets: llama-quantize's `llama_tensor_get_type` for the file types
//! we write (`src/llama-quant.cpp` at llama.cpp 0c1e570), in the order it visits the tensors.
//!
//! The rules read only names, shapes and a few hyper-parameters, never tensor data, so a plan
//! can be checked against llama-quantize's own choices for a model without its weights
//! (`tests/llama_quantize_mixes.rs`). The mixes of the IQ types below IQ4 are left out (their
//! quantizers need an importance matrix and the grid searches), and so are the branches that
//! depend on an importance matrix, which `quantize` does not take yet.

use super::FileType;
use crate::gguf::{Array, Metadata, Result as GgufResult};
use crate::quant::GgmlType;

/// What the rules need of a tensor.
#[derive(Clone, Copy, Debug)]
pub struct TensorMeta<'a> {
    /// The tensor name (`blk.3.attn_v.weight`).
    pub name: &'a str,
    /// Dimensions in ggml order, ne0 (the row) first.
    pub shape: &'a [u64],
    /// The type it has in the input.
    pub ggml_type: GgmlType,
}

/// The hyper-parameters the rules read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFacts {
    /// `general.architecture` (`qwen2`).
    pub arch: String,
    /// `{arch}.block_count`: the layer count the feed-forward rules divide.
    pub n_layer: u32,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u32,
    /// Query heads per KV head (`n_gqa()` of the first layer; 0 when the file says no KV
    /// heads): the Q2_K mix gives the attention values more bits from 4 on.
    pub n_gqa: u32,
    /// Whether llama.cpp classifies the model as a 70B (its attention values get Q5_K where
    /// they would get Q4_K).
    pub is_70b: bool,
    /// Whether an importance matrix is given (`--imatrix`): a few rules of the mixes depend on
    /// it. Not a fact of the file: [`ModelFacts::from_metadata`] leaves it false.
    pub has_imatrix: bool,
}

impl ModelFacts {
    /// Read from a model's metadata; a missing architecture or block count is an error naming
    /// the key.
    pub fn from_metadata(metadata: &Metadata) -> GgufResult<Self> {
        let arch = metadata.get_str("general.architecture")?.to_string();
        let n_layer = metadata.get_uint(&format!("{arch}.block_count"))? as u32;
        let key = |k: &str| format!("{arch}.{k}");
        let n_expert = match metadata.get(&key("expert_count")) {
            Some(_) => metadata.get_uint(&key("expert_count"))? as u32,
            None => 0,
        };
        // llama.cpp's model type (`load_hparams` per architecture): 80-layer Llama 2/3 with
        // grouped KV heads, Qwen2, OLMo and DeciLM, and the 68-layer JAIS2 are its 70Bs.
        let heads_differ = || -> bool {
            let (h, kv) = (key("attention.head_count"), key("attention.head_count_kv"));
            match (metadata.get_uint(&h), metadata.get_uint(&kv)) {
                (Ok(h), Ok(kv)) => h != kv,
                _ => false,
            }
        };
        // `head_count_kv` defaults to `head_count`; either may be a per-layer array, of which
        // llama.cpp's `n_gqa()` reads the first layer's.
        let heads = |k: &str| -> GgufResult<Option<u64>> {
            match metadata.get(&key(k)) {
                None => Ok(None),
                Some(crate::gguf::Value::Array(a)) => Ok(match a {
                    Array::U32(v) => v.first().map(|&n| u64::from(n)),
                    Array::I32(v) => v.first().and_then(|&n| u64::try_from(n).ok()),
                    Array::U64(v) => v.first().copied(),
                    _ => None,
                }),
                Some(_) => metadata.get_uint(&key(k)).map(Some),
            }
        };
        let n_head = heads("attention.head_count")?.unwrap_or(0);
        let n_head_kv = heads("attention.head_count_kv")?.unwrap_or(n_head);
        let n_gqa = n_head.checked_div(n_head_kv).unwrap_or(0) as u32;
        let is_70b = match (arch.as_str(), n_layer) {
            ("llama", 80) => heads_differ(),
            ("qwen2" | "olmo" | "deci", 80) | ("jais2", 68) => true,
            _ => false,
        };
        Ok(ModelFacts {
            arch,
            n_layer,
            n_expert,
            n_gqa,
            is_70b,
            has_imatrix: false,
        })
    }
}

/// One tensor of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Planned {
    /// Its index in the list the plan was made from.
    pub index: usize,
    /// The type it is written in.
    pub ggml_type: GgmlType,
    /// The type the rules chose when its rows do not split into that type's blocks (the
    /// planned type is then llama.cpp's fallback).
    pub fell_back_from: Option<GgmlType>,
}

/// The broad roles the rules tell apart (`tensor_category`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttentionQkv,
    AttentionKvB,
    AttentionV,
    AttentionK,
    AttentionQ,
    AttentionOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    // The order of the tests is llama.cpp's: `attn_qkv` also contains `attn_q`, and so on.
    if name == "output.weight" {
        return Category::Output;
    }
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        return Category::TokenEmbd;
    }
    let table = [
        ("attn_qkv.weight", Category::AttentionQkv),
        ("attn_kv_b.weight", Category::AttentionKvB),
        ("attn_v.weight", Category::AttentionV),
        ("attn_k.weight", Category::AttentionK),
        ("attn_q.weight", Category::AttentionQ),
        ("attn_output.weight", Category::AttentionOutput),
        ("ffn_up", Category::FfnUp),
        ("ffn_gate", Category::FfnGate),
        ("ffn_down", Category::FfnDown),
    ];
    table
        .into_iter()
        .find(|(pat, _)| name.contains(pat))
        .map_or(Category::Other, |(_, c)| c)
}

fn is_attn_v(c: Category) -> bool {
    matches!(
        c,
        Category::AttentionV | Category::AttentionQkv | Category::AttentionKvB
    )
}

/// ggml's `ggml_n_dims`: trailing dimensions of 1 do not count, so a `[256, 1]` tensor is 1-D.
fn n_dims(shape: &[u64]) -> usize {
    shape.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// `tensor_allows_quantization`: 2-D and larger weights, except norms, routers and the small
/// tables llama.cpp keeps as they are.
fn allows_quantization(name: &str, shape: &[u64]) -> bool {
    const KEEP: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    n_dims(shape) >= 2
        && name.ends_with("weight")
        && name != "position_embd.weight"
        && name != "token_types.weight"
        && !KEEP.iter().any(|k| name.contains(k))
}

/// The layer of a `blk.N.` name as llama.cpp's `sscanf("blk.%d.")` reads it, or -1.
fn layer_of(name: &str) -> i64 {
    let Some(rest) = name.strip_prefix("blk.") else {
        return -1;
    };
    let rest = rest.trim_start();
    let (sign, digits) = match rest.as_bytes().first() {
        Some(b'-') => (-1, &rest[1..]),
        Some(b'+') => (1, &rest[1..]),
        _ => (1, rest),
    };
    let end = digits.bytes().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
    digits[..end].parse::<i64>().map_or(-1, |n| sign * n)
}

/// The order llama-quantize visits and writes tensors in (its loader's `weights_map` sorts by
/// layer, then by name; tensors outside the layers first), as indices into `tensors`.
pub fn llama_order(tensors: &[TensorMeta]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (tensors[a].name, tensors[b].name);
        layer_of(a).cmp(&layer_of(b)).then(a.as_bytes().cmp(b.as_bytes()))
    });
    order
}

/// llama.cpp's fallback for rows that do not split into `ty`'s blocks (`tensor_type_fallback`),
/// or `ty` when they do.
fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let to = match ty {
        GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        // A 32-value block type has nothing smaller to fall back to: F16 below.
        other => other,
    };
    if ncols.is_multiple_of(to.block_size() as u64) {
        to
    } else {
        GgmlType::F16
    }
}

/// The counters llama-quantize keeps while it walks the tensors (`quantize_state_impl`).
struct State<'a> {
    facts: &'a ModelFacts,
    ftype: FileType,
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
}

impl State<'_> {
    /// `use_more_bits`: the first and last eighth of the layers, and every third between.
    fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
        i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
    }

    /// The layer a feed-forward tensor belongs to: the running count for a dense model, the
    /// name's layer for a mixture of experts (whose expert tensors are not in layer order).
    fn layer(&self, counter: i64, name: &str) -> i64 {
        if self.facts.n_expert > 1 {
            layer_of(name)
        } else {
            counter
        }
    }

    /// `llama_tensor_get_type_impl` for our file types.
    fn mix_type(&mut self, mut new_type: GgmlType, name: &str, ncols: u64, cat: Category) -> GgmlType {
        use FileType as F;
        use GgmlType as T;
        let ftype = self.ftype;
        let falcon = self.facts.arch == "falcon";
        let n_expert = self.facts.n_expert;
        let n_layer = self.facts.n_layer as i64;
        if cat == Category::Output || (self.has_tied_embeddings && cat == Category::TokenEmbd) {
            // A tied embedding is the output matrix too, so it gets the output's type.
            if falcon || !ncols.is_multiple_of(new_type.block_size() as u64) {
                new_type = T::Q8_0;
            } else if new_type != T::Q8_0 {
                new_type = T::Q6_K;
            }
        } else if cat == Category::TokenEmbd {
            // The ternary types leave an untied embedding in Q4_K; the others in the default.
            if matches!(ftype, F::TQ1_0 | F::TQ2_0) {
                new_type = T::Q4_K;
            }
        } else if is_attn_v(cat) {
            if ftype == F::Q2_K {
                new_type = if self.facts.n_gqa >= 4 { T::Q4_K } else { T::Q3_K };
            } else if ftype == F::Q2_K_S && self.facts.n_gqa >= 4 {
                new_type = T::Q4_K;
            } else if ftype == F::Q3_K_M {
                new_type = if self.i_attention_wv < 2 { T::Q5_K } else { T::Q4_K };
            } else if ftype == F::Q3_K_L || (matches!(ftype, F::IQ4_NL | F::IQ4_XS) && self.facts.n_gqa >= 4) {
                new_type = T::Q5_K;
            } else if matches!(ftype, F::Q4_K_M | F::Q5_K_M)
                && Self::use_more_bits(self.i_attention_wv, self.n_attention_wv)
            {
                new_type = T::Q6_K;
            } else if ftype == F::Q4_K_S && self.i_attention_wv < 4 {
                new_type = T::Q5_K;
            }
            if self.facts.is_70b && matches!(new_type, T::Q3_K | T::Q4_K) {
                new_type = T::Q5_K;
            }
            if n_expert == 8 {
                new_type = T::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttentionK {
            if n_expert == 8 {
                new_type = T::Q8_0;
            }
        } else if cat == Category::FfnDown {
            let i_layer = self.layer(self.i_ffn_down, name);
            if ftype == F::Q2_K {
                new_type = T::Q3_K;
            } else if ftype == F::Q2_K_S {
                if i_layer < n_layer / 8 {
                    new_type = T::Q4_K;
                }
            } else if ftype == F::Q3_K_M {
                new_type = if i_layer < n_layer / 16 {
                    T::Q5_K
                } else if !falcon || Self::use_more_bits(i_layer, n_layer) {
                    T::Q4_K
                } else {
                    T::Q3_K
                };
            } else if ftype == F::Q3_K_L {
                new_type = if falcon { T::Q4_K } else { T::Q5_K };
            } else if ftype == F::Q4_K_M {
                if falcon {
                    new_type = if i_layer < n_layer / 16 {
                        T::Q6_K
                    } else if Self::use_more_bits(i_layer, n_layer) {
                        T::Q5_K
                    } else {
                        T::Q4_K
                    };
                } else if Self::use_more_bits(i_layer, n_layer) {
                    new_type = T::Q6_K;
                }
            } else if matches!(ftype, F::IQ4_NL | F::IQ4_XS) && i_layer < n_layer / 8 && !self.facts.has_imatrix {
                new_type = T::Q5_K;
            } else if ftype == F::Q5_K_M && Self::use_more_bits(i_layer, n_layer) {
                new_type = T::Q6_K;
            } else if ftype == F::Q4_K_S && !falcon && i_layer < n_layer / 8 {
                new_type = T::Q5_K;
            } else if matches!(ftype, F::Q4_0 | F::Q5_0) && self.facts.has_imatrix && i_layer < n_layer / 8 {
                // llama.cpp guards the first feed-forward outputs only with an importance matrix,
                // so that a file made without one stays what it was before they existed.
                new_type = if ftype == F::Q4_0 { T::Q4_1 } else { T::Q5_1 };
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttentionOutput {
            if falcon {
                if ftype == F::Q3_K_L {
                    new_type = T::Q4_K;
                }
            } else if n_expert == 8 {
                if matches!(
                    ftype,
                    F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::Q4_K_S | F::Q4_K_M | F::IQ4_NL | F::IQ4_XS
                ) {
                    new_type = T::Q5_K;
                }
            } else {
                match ftype {
                    F::Q2_K => new_type = T::Q3_K,
                    F::Q3_K_M => new_type = T::Q4_K,
                    F::Q3_K_L => new_type = T::Q5_K,
                    _ => {}
                }
            }
        } else if cat == Category::FfnGate {
            self.i_ffn_gate += 1;
        } else if cat == Category::FfnUp {
            self.i_ffn_up += 1;
        }
        new_type
    }
}

/// The type of every tensor as llama-quantize chooses it for `ftype` (`pure`: every matrix in
/// the file type's own type, only the fallbacks applied), in llama-quantize's order.
pub fn plan(tensors: &[TensorMeta], facts: &ModelFacts, ftype: FileType, pure: bool) -> Vec<Planned> {
    let order = llama_order(tensors);
    let categories: Vec<Category> = tensors.iter().map(|t| category(t.name)).collect();
    let mut state = State {
        facts,
        ftype,
        n_attention_wv: categories.iter().filter(|&&c| is_attn_v(c)).count() as i64,
        i_attention_wv: 0,
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        has_tied_embeddings: !categories.contains(&Category::Output),
    };
    let default_type = ftype.default_type();
    order
        .into_iter()
        .map(|index| {
            let t = &tensors[index];
            let ncols = t.shape.first().copied().unwrap_or(1);
            if !allows_quantization(t.name, t.shape) {
                return Planned {
                    index,
                    ggml_type: t.ggml_type,
                    fell_back_from: None,
                };
            }
            // Float file types take no rules and no fallbacks (`ggml_is_quantized` is false).
            if matches!(default_type, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                return Planned {
                    index,
                    ggml_type: default_type,
                    fell_back_from: None,
                };
            }
            let chosen = if pure {
                default_type
            } else {
                state.mix_type(default_type, t.name, ncols, categories[index])
            };
            let ggml_type = fallback(chosen, ncols);
            Planned {
                index,
                ggml_type,
                fell_back_from: (ggml_type != chosen).then_some(chosen),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_sort_numerically_after_the_tensors_outside_them() {
        let names = [
            "blk.10.a.weight",
            "output.weight",
            "blk.2.b.weight",
            "blk.2.a.weight",
            "token_embd.weight",
        ];
        let tensors: Vec<_> = names
            .iter()
            .map(|&name| TensorMeta {
                name,
                shape: &[32, 32],
                ggml_type: GgmlType::F32,
            })
            .collect();
        let sorted: Vec<_> = llama_order(&tensors).into_iter().map(|i| names[i]).collect();
        assert_eq!(
            sorted,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a.weight",
                "blk.2.b.weight",
                "blk.10.a.weight"
            ]
        );
    }

    #[test]
    fn more_bits_go_to_the_first_and_last_eighth_and_every_third_layer_between() {
        let chosen: Vec<i64> = (0..24).filter(|&i| State::use_more_bits(i, 24)).collect();
        assert_eq!(chosen, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
    }

    #[test]
    fn rows_that_fit_no_block_fall_back_as_llama_cpp_does() {
        assert_eq!(fallback(GgmlType::Q4_K, 896), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q5_K, 896), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q6_K, 896), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q4_K, 4864), GgmlType::Q4_K);
        assert_eq!(fallback(GgmlType::Q4_K, 4832), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q4_K, 1024), GgmlType::Q4_K);
        assert_eq!(fallback(GgmlType::Q8_0, 48), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q6_K, 100), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Q3_K, 896), GgmlType::Q4_0);
        assert_eq!(fallback(GgmlType::Q2_K, 896), GgmlType::Q4_0);
    }

    #[test]
    fn a_trailing_dimension_of_one_does_not_make_a_matrix() {
        assert_eq!(n_dims(&[256, 1]), 1);
        assert!(!allows_quantization("blk.0.attn_q.weight", &[256, 1]));
        assert!(allows_quantization("blk.0.attn_q.weight", &[256, 2]));
        assert!(!allows_quantization("blk.0.attn_norm.weight", &[256, 2]));
        assert!(!allows_quantization("blk.0.attn_q.bias", &[256, 2]));
    }
}
