//! How a model's hidden states become one vector per input: the pooling rule (llama.cpp's
//! `pooling_type`) and the classification head of a reranker (`cls.output.weight`), read and
//! checked at load for every architecture. This file describes; the engine pools
//! ([`crate::engine::embed`]) and the graph applies the head ([`super::blocks::output_head`]).

use super::{check_tensor, f32_vector, HParams, ModelError};
use crate::gguf::GgufFile;

/// How the rows of the final norm become one vector per input (llama.cpp's
/// `llama_pooling_type`, with its integers in the file's `{arch}.pooling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pooling {
    /// Every token's row, unpooled (`0`).
    None,
    /// The average of the input's rows (`1`).
    Mean,
    /// The first token's row (`2`, BERT's `[CLS]`).
    Cls,
    /// The last token's row (`3`): what a decoder model's causal attention has seen whole.
    Last,
    /// The classification head on the last token's row (causal models) or the first's: a
    /// relevance score (`4`, a reranker).
    Rank,
}

impl Pooling {
    /// The rule for llama.cpp's integer (`-1`, unspecified, is `None` here: the caller's default).
    pub fn from_llama(value: i64) -> Option<Option<Pooling>> {
        Some(match value {
            -1 => None,
            0 => Some(Pooling::None),
            1 => Some(Pooling::Mean),
            2 => Some(Pooling::Cls),
            3 => Some(Pooling::Last),
            4 => Some(Pooling::Rank),
            _ => return None,
        })
    }

    /// The rule named as llama.cpp's `--pooling` names it.
    pub fn parse(name: &str) -> Option<Pooling> {
        Some(match name {
            "none" => Pooling::None,
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            "last" => Pooling::Last,
            "rank" => Pooling::Rank,
            _ => return None,
        })
    }

    /// The name `--pooling` takes.
    pub fn name(self) -> &'static str {
        match self {
            Pooling::None => "none",
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::Rank => "rank",
        }
    }
}

impl std::fmt::Display for Pooling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A reranker's classification head: `cls.output.weight` (`[n_embd, n_cls]`) and its optional
/// bias, applied to the pooled row. Qwen3-Reranker's two rows are the head's "yes" and "no"
/// rows, and its score is the softmax's first value (as llama.cpp computes it).
#[derive(Clone, Debug, PartialEq)]
pub struct RankHead {
    /// The head's weight and type.
    pub weight: super::blocks::WeightRef,
    /// `cls.output.bias`, F32 `[n_cls]`, if the file has it.
    pub bias: Option<String>,
    /// Classes: the head's output width.
    pub n_cls: usize,
    /// Whether the scores go through a softmax (llama.cpp does so for Qwen3 rerankers).
    pub softmax: bool,
}

/// The file's pooling rule (`{arch}.pooling_type`, `None` when absent or `-1`) and its rank head
/// (`cls.output.weight`), checked; the dense-and-tanh head of BERT-style rerankers
/// (`cls.weight`) and non-causal attention (`{arch}.attention.causal = false`) are refused by
/// name.
pub(crate) fn load(
    file: &GgufFile,
    arch: &str,
    hp: &HParams,
) -> Result<(Option<Pooling>, Option<RankHead>), ModelError> {
    let m = file.metadata();
    let key = format!("{arch}.pooling_type");
    let pooling = match m.contains(&key) {
        true => {
            let value = m.get_uint(&key)?;
            Pooling::from_llama(value.min(i64::MAX as u64) as i64).ok_or_else(|| ModelError::Unsupported {
                what: format!("{key} = {value}"),
                reason: "llama.cpp's pooling types are -1 (unspecified), 0 none, 1 mean, 2 cls, 3 last and 4 rank"
                    .into(),
            })?
        }
        false => None,
    };
    // Encoder models (BERT's kind) attend both ways; minfer's attention is causal, and running
    // one causally would silently give other vectors.
    let causal = format!("{arch}.attention.causal");
    if m.contains(&causal) && !m.get_bool(&causal)? {
        return Err(ModelError::Unsupported {
            what: format!("{causal} = false"),
            reason: "non-causal attention (an encoder model) is not supported".into(),
        });
    }
    if file.tensor("cls.weight").is_ok() {
        return Err(ModelError::Unsupported {
            what: "tensor 'cls.weight'".into(),
            reason: "a dense-and-tanh classification head (BERT-style rerankers) is not supported; \
                     heads of one projection (cls.output.weight) are"
                .into(),
        });
    }
    let head = match file.tensor("cls.output.weight") {
        Err(_) => None,
        Ok(info) => {
            let n_cls = info.shape.get(1).copied().unwrap_or(0);
            if n_cls == 0 || info.shape.len() != 2 {
                return Err(ModelError::BadShape {
                    name: "cls.output.weight".into(),
                    expected: vec![hp.n_embd as u64, n_cls.max(1)],
                    got: info.shape.clone(),
                });
            }
            let ty = check_tensor(file, "cls.output.weight", &[hp.n_embd as u64, n_cls])?;
            let bias = match file.tensor("cls.output.bias") {
                Ok(_) => {
                    f32_vector(file, "cls.output.bias", n_cls)?;
                    Some("cls.output.bias".to_string())
                }
                Err(_) => None,
            };
            Some(RankHead {
                weight: ("cls.output.weight".to_string(), ty),
                bias,
                n_cls: n_cls as usize,
                softmax: arch == "qwen3",
            })
        }
    };
    if pooling == Some(Pooling::Rank) && head.is_none() {
        return Err(ModelError::MissingTensor {
            name: "cls.output.weight (the rank head pooling_type = 4 needs)".into(),
        });
    }
    Ok((pooling, head))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_cpp_pooling_integers_map_to_rules_and_unknown_ones_to_nothing() {
        assert_eq!(Pooling::from_llama(-1), Some(None));
        assert_eq!(Pooling::from_llama(1), Some(Some(Pooling::Mean)));
        assert_eq!(Pooling::from_llama(4), Some(Some(Pooling::Rank)));
        assert_eq!(Pooling::from_llama(5), None);
        for p in [Pooling::None, Pooling::Mean, Pooling::Cls, Pooling::Last, Pooling::Rank] {
            assert_eq!(Pooling::parse(p.name()), Some(p));
        }
        assert_eq!(Pooling::parse("max"), None);
    }
}
