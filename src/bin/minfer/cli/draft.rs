//! The speculative-decoding flags shared by a run and `serve` (llama.cpp's names), checked
//! before any model is read, and the drafter they choose. Drafting and checking themselves
//! belong to the engine; this file only reads flags.

use minfer::engine::{DraftOptions, DraftSource, LoadError, Model, ModelOptions, NgramDrafter};
use std::path::PathBuf;
use std::sync::Arc;

/// `--model-draft`, `--draft-max`, `--draft-min`, `--draft-p-min`, `--spec-type` and the
/// prompt-lookup sizes.
#[derive(clap::Args, Clone, Debug)]
pub struct DraftArgs {
    /// Speculative decoding with a draft model (llama.cpp's -md): a smaller model of the same
    /// vocabulary proposes tokens, the model checks them in one pass; the output is unchanged.
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// Most tokens drafted per step.
    #[arg(long = "draft-max", visible_alias = "spec-draft-n-max", default_value_t = 16)]
    pub draft_max: usize,
    /// Fewer drafted tokens than this are not checked.
    #[arg(long = "draft-min", visible_alias = "spec-draft-n-min", default_value_t = 0)]
    pub draft_min: usize,
    /// The draft model stops proposing where its best token is less likely than this.
    #[arg(long = "draft-p-min", visible_alias = "spec-draft-p-min", default_value_t = 0.75)]
    pub draft_p_min: f32,
    /// Speculative decoding without a draft model: `ngram-simple` (prompt lookup) proposes what
    /// followed the last tokens where they occurred before in the prompt or the output.
    #[arg(long = "spec-type", value_name = "TYPE")]
    pub spec_type: Option<String>,
    /// Prompt lookup: tokens of the context's end that must match.
    #[arg(long = "spec-ngram-simple-size-n", default_value_t = 12)]
    pub ngram_size_n: usize,
    /// Prompt lookup: most tokens proposed from a match.
    #[arg(long = "spec-ngram-simple-size-m", default_value_t = 32)]
    pub ngram_size_m: usize,
}

/// A flag that cannot be honoured, with the flag named.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct DraftFlagError(String);

/// The drafter the flags chose, before any model is loaded.
#[derive(Clone, Debug)]
pub enum DraftChoice {
    /// `--spec-type ngram-simple`.
    Lookup(NgramDrafter),
    /// `--model-draft FILE`.
    Model {
        /// The draft model's file.
        path: PathBuf,
        /// `--draft-p-min`.
        p_min: f32,
    },
}

impl DraftArgs {
    /// The drafter the flags ask for, or none; a bad or contradictory flag is an error naming it.
    pub fn choice(&self) -> Result<Option<DraftChoice>, DraftFlagError> {
        let fail = |text: String| Err(DraftFlagError(text));
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            return fail(format!(
                "--draft-p-min {} is out of range: it must lie in [0, 1]",
                self.draft_p_min
            ));
        }
        match (&self.model_draft, self.spec_type.as_deref()) {
            (Some(_), Some(_)) => fail("--model-draft and --spec-type both choose a drafter: give one".into()),
            (None, None) => Ok(None),
            (None, Some("ngram-simple")) if self.ngram_size_n == 0 => {
                fail("--spec-ngram-simple-size-n must be at least 1".into())
            }
            (None, Some("ngram-simple")) => Ok(Some(DraftChoice::Lookup(NgramDrafter {
                size_n: self.ngram_size_n,
                size_m: self.ngram_size_m,
            }))),
            (None, Some(other)) => fail(format!(
                "--spec-type {other} is not known: the speculative types are ngram-simple (or --model-draft FILE)"
            )),
            (Some(path), None) => Ok(Some(DraftChoice::Model {
                path: path.clone(),
                p_min: self.draft_p_min,
            })),
        }
    }

    /// How many tokens a step drafts: prompt lookup proposes what its match has, up to its
    /// own length.
    pub fn options(&self) -> DraftOptions {
        DraftOptions {
            max: if self.spec_type.is_some() {
                self.ngram_size_m
            } else {
                self.draft_max
            },
            min: self.draft_min,
        }
    }
}

impl DraftChoice {
    /// Loads what the choice needs (a draft model, with the target's load options).
    pub fn load(self, options: &ModelOptions) -> Result<DraftSource, LoadError> {
        Ok(match self {
            DraftChoice::Lookup(lookup) => DraftSource::Lookup(lookup),
            DraftChoice::Model { path, p_min } => DraftSource::Model {
                model: Arc::new(Model::load(&path, options)?),
                p_min,
            },
        })
    }
}
