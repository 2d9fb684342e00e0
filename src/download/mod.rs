//! Models by name: what a model argument refers to, and fetching it into the model cache.
//!
//! A model argument is a path, the name of a file already in the cache, `hf:OWNER/REPO[:QUANT]`
//! (a GGUF file of a Hugging Face repository, every part of a split model) or
//! `ollama:NAME[:TAG]` (the model layer of an Ollama registry image). [`resolve`] turns one into
//! a local path, fetching only what the cache lacks; [`pull`] always asks the server which file
//! the reference means now, and fetches it unless the cache already holds those bytes.
//!
//! What is fetched is verified against the sha256 the server published before it takes its
//! final name in the cache; until then it is a `.part` file that the next run resumes with a
//! range request. One lock per model keeps two processes from fetching the same file at once.
//! Where each cached model came from is kept in a sidecar beside it (`NAME.gguf.json`).
//!
//! This module knows HTTP, the two registries' listings and the cache; it must not know GGUF
//! beyond file names (reading headers is the caller's business) and never prints: progress goes
//! to a [`Progress`] the caller passes.

pub mod cache;
mod fetch;
mod hf;
mod http;
mod ollama;

pub use cache::{CacheEntry, Sidecar, SidecarFile};

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The Hugging Face endpoint when `HF_ENDPOINT` is not set.
pub const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";
/// The Ollama registry when `MINFER_OLLAMA_REGISTRY` is not set.
pub const DEFAULT_OLLAMA_REGISTRY: &str = "https://registry.ollama.ai";
/// Seconds a connection or a read may take when `MINFER_HTTP_TIMEOUT` is not set.
pub const DEFAULT_TIMEOUT_S: f64 = 30.0;
/// Seconds one file's download (or one listing or manifest request) may take in all when
/// `MINFER_HTTP_DEADLINE` is not set: a day, longer than any model takes on a working link.
pub const DEFAULT_DEADLINE_S: f64 = 86_400.0;
/// Bytes per second a body must average over each `MINFER_HTTP_TIMEOUT` window when
/// `MINFER_HTTP_MIN_RATE` is not set.
pub const DEFAULT_MIN_RATE: u64 = 1024;
/// The quant `hf:OWNER/REPO` picks when the reference names none.
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// Why a model reference could not be turned into a local file.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The reference does not parse.
    #[error("model reference {reference}: {reason}")]
    BadReference {
        /// What was given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A path (a name with a directory) to no file.
    #[error("model {}: no such file", path.display())]
    NoSuchFile {
        /// What was given.
        path: PathBuf,
    },
    /// A plain name that is neither a file nor in the cache.
    #[error("model {name}: no such file, and no model of that name in the cache {} (`minfer list` shows what is there; hf:OWNER/REPO[:QUANT] or ollama:NAME[:TAG] fetch one)", cache.display())]
    NotFound {
        /// What was given.
        name: String,
        /// The cache that was searched.
        cache: PathBuf,
    },
    /// An environment variable holds a value that cannot be used.
    #[error("{var}={value:?}: {reason}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server could not be reached, or the connection failed before a response came.
    #[error("cannot fetch {url}: {reason}")]
    Transport {
        /// What was asked for.
        url: String,
        /// What went wrong.
        reason: String,
    },
    /// No byte came for the configured time.
    #[error("{url}: no answer for {seconds} s, giving up (MINFER_HTTP_TIMEOUT sets the limit){}", resume_hint(*.partial))]
    Timeout {
        /// What was asked for.
        url: String,
        /// The limit.
        seconds: f64,
        /// Whether what arrived is kept for the next run to resume.
        partial: bool,
    },
    /// The body came slower than the minimum rate over a whole window.
    #[error("{url}: {rate:.1} bytes/s over the last {window:.1} s, below the minimum of {min_rate} bytes/s, giving up (MINFER_HTTP_MIN_RATE sets the minimum, 0 turns the check off){}", resume_hint(*.partial))]
    TooSlow {
        /// What was asked for.
        url: String,
        /// The rate measured over the window, in bytes per second.
        rate: f64,
        /// The window's length in seconds.
        window: f64,
        /// The minimum rate, in bytes per second.
        min_rate: u64,
        /// Whether what arrived is kept for the next run to resume.
        partial: bool,
    },
    /// The request (a file's whole download, or one listing) ran past its deadline.
    #[error("{url}: not done after {seconds} s, giving up (MINFER_HTTP_DEADLINE sets the limit){}", resume_hint(*.partial))]
    Deadline {
        /// What was asked for.
        url: String,
        /// The limit.
        seconds: f64,
        /// Whether what arrived is kept for the next run to resume.
        partial: bool,
    },
    /// The server answered with an error status.
    #[error("{url}: the server answered HTTP {status}{}", if .detail.is_empty() { String::new() } else { format!(" ({})", .detail) })]
    Status {
        /// What was asked for.
        url: String,
        /// The status code.
        status: u16,
        /// The server's explanation, shortened, if it gave one.
        detail: String,
    },
    /// A Hugging Face repository that does not exist.
    #[error("hf:{repo}: no such repository at {endpoint}")]
    RepoNotFound {
        /// `OWNER/REPO`.
        repo: String,
        /// The endpoint asked.
        endpoint: String,
    },
    /// A Hugging Face repository that needs a token, or a better one.
    #[error("hf:{repo}: access refused (HTTP {status}): {}", if *.token_given { "the token in HF_TOKEN does not grant access to it (a gated repository must be accepted on its page first)" } else { "the repository is gated or private, or does not exist; set HF_TOKEN to a token with access" })]
    Unauthorized {
        /// `OWNER/REPO`.
        repo: String,
        /// 401 or 403.
        status: u16,
        /// Whether a token was sent.
        token_given: bool,
    },
    /// No GGUF file of the repository matches the quant asked for.
    #[error("hf:{repo}: no GGUF file for {quant}; the quants available are: {}", .available.join(", "))]
    NoSuchQuant {
        /// `OWNER/REPO`.
        repo: String,
        /// What was asked for.
        quant: String,
        /// What the repository has.
        available: Vec<String>,
    },
    /// A reference that matches more than one model of a repository.
    #[error("hf:{repo}: {what} matches several models: {}; name the quant (hf:{repo}:QUANT)", .files.join(", "))]
    Ambiguous {
        /// `OWNER/REPO`.
        repo: String,
        /// The quant asked for, or "no quant".
        what: String,
        /// The candidates' file names.
        files: Vec<String>,
    },
    /// A repository without GGUF files.
    #[error("hf:{repo}: the repository has no GGUF file")]
    NoGguf {
        /// `OWNER/REPO`.
        repo: String,
    },
    /// A split model whose parts are not all listed.
    #[error("hf:{repo}: {prefix} is split in {count} parts, but the repository lists only {found}")]
    MissingParts {
        /// `OWNER/REPO`.
        repo: String,
        /// The parts' common prefix.
        prefix: String,
        /// The parts the names announce.
        count: u32,
        /// The parts found.
        found: usize,
    },
    /// An Ollama image that does not exist.
    #[error("ollama:{name}:{tag}: no such model at {registry}")]
    OllamaNotFound {
        /// The model name.
        name: String,
        /// The tag.
        tag: String,
        /// The registry asked.
        registry: String,
    },
    /// A response whose content cannot be used.
    #[error("{url}: unexpected response: {reason}")]
    BadResponse {
        /// What was asked for.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The connection ended before the whole file came.
    #[error("{name}: the download stopped after {got} of {expected} bytes ({reason}); run again to resume")]
    Interrupted {
        /// The file.
        name: String,
        /// Bytes held now.
        got: u64,
        /// The file's size.
        expected: u64,
        /// What ended it.
        reason: String,
    },
    /// The server sent more bytes than the file has.
    #[error("{name}: the server sent more than the {expected} bytes published for it; the partial file was deleted")]
    TooLong {
        /// The file.
        name: String,
        /// The published size.
        expected: u64,
    },
    /// The bytes do not hash to the published digest.
    #[error("{name}: sha256 mismatch: expected {expected}, got {got}; the download was deleted")]
    HashMismatch {
        /// The file.
        name: String,
        /// The published digest.
        expected: String,
        /// The digest of what arrived.
        got: String,
    },
    /// A file of the same name, from elsewhere, is already in the cache.
    #[error("{}: a different file of that name is already in the cache{}; move it away to fetch {reference}", path.display(), .source_ref.as_ref().map(|s| format!(" (from {s})")).unwrap_or_default())]
    Conflict {
        /// The cache path.
        path: PathBuf,
        /// Where the file there came from, if known.
        source_ref: Option<String>,
        /// What was being fetched.
        reference: String,
    },
    /// A file of the cache could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

fn resume_hint(partial: bool) -> &'static str {
    if partial {
        "; what arrived is kept, run again to resume"
    } else {
        ""
    }
}

impl DownloadError {
    fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DownloadError + '_ {
        move |source| DownloadError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Where models are cached and fetched from, and how long and how slowly the network may
/// run.
#[derive(Debug, Clone)]
pub struct Config {
    /// The model cache directory.
    pub cache_dir: PathBuf,
    /// The Hugging Face endpoint, without a trailing slash.
    pub hf_endpoint: String,
    /// The Hugging Face token, sent as `Authorization: Bearer`.
    pub hf_token: Option<String>,
    /// The Ollama registry, without a trailing slash.
    pub ollama_registry: String,
    /// How long a connection, or any read, may take; also the window the minimum rate is
    /// measured over.
    pub timeout: Duration,
    /// How long one file's download, or one listing or manifest request, may take in all.
    pub deadline: Duration,
    /// The fewest bytes per second a body may average over a window of `timeout`; 0 turns the
    /// check off.
    pub min_rate: u64,
}

impl Config {
    /// The configuration the environment gives, as the Hugging Face tools read it:
    /// `MINFER_MODELS` (default `~/.cache/minfer/models`), `HF_ENDPOINT`, `HF_TOKEN` (else the
    /// token file `HF_TOKEN_PATH`, `$HF_HOME/token` or `~/.cache/huggingface/token`),
    /// `MINFER_OLLAMA_REGISTRY`, `MINFER_HTTP_TIMEOUT` (seconds), `MINFER_HTTP_DEADLINE`
    /// (seconds) and `MINFER_HTTP_MIN_RATE` (bytes per second).
    pub fn from_env() -> Result<Config, DownloadError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let seconds = |name: &'static str, default: f64| match var(name) {
            None => Ok(Duration::from_secs_f64(default)),
            Some(v) => parse_timeout(&v).ok_or_else(|| DownloadError::BadEnv {
                var: name,
                value: v.clone(),
                reason: "expected a number of seconds above 0".into(),
            }),
        };
        let timeout = seconds("MINFER_HTTP_TIMEOUT", DEFAULT_TIMEOUT_S)?;
        let deadline = seconds("MINFER_HTTP_DEADLINE", DEFAULT_DEADLINE_S)?;
        let min_rate = match var("MINFER_HTTP_MIN_RATE") {
            None => DEFAULT_MIN_RATE,
            Some(v) => v.trim().parse::<u64>().map_err(|_| DownloadError::BadEnv {
                var: "MINFER_HTTP_MIN_RATE",
                value: v.clone(),
                reason: "expected a whole number of bytes per second (0 turns the check off)".into(),
            })?,
        };
        let hf_endpoint = var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_HF_ENDPOINT.into());
        let ollama_registry = var("MINFER_OLLAMA_REGISTRY").unwrap_or_else(|| DEFAULT_OLLAMA_REGISTRY.into());
        for (name, url) in [
            ("HF_ENDPOINT", &hf_endpoint),
            ("MINFER_OLLAMA_REGISTRY", &ollama_registry),
        ] {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(DownloadError::BadEnv {
                    var: if name == "HF_ENDPOINT" {
                        "HF_ENDPOINT"
                    } else {
                        "MINFER_OLLAMA_REGISTRY"
                    },
                    value: url.clone(),
                    reason: "expected an http:// or https:// URL".into(),
                });
            }
        }
        Ok(Config {
            cache_dir: cache::default_dir(),
            hf_endpoint: hf_endpoint.trim_end_matches('/').to_string(),
            hf_token: var("HF_TOKEN").or_else(hf_token_file),
            ollama_registry: ollama_registry.trim_end_matches('/').to_string(),
            timeout,
            deadline,
            min_rate,
        })
    }
}

fn parse_timeout(v: &str) -> Option<Duration> {
    let s: f64 = v.trim().parse().ok()?;
    (s.is_finite() && s > 0.0 && s < 1e9).then(|| Duration::from_secs_f64(s))
}

/// The token `huggingface-cli login` saved, where the Hugging Face tools look for it.
fn hf_token_file() -> Option<String> {
    let path = std::env::var_os("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
        let home = std::env::var_os("HF_HOME").map(PathBuf::from).or_else(|| {
            let base = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(base.join("huggingface"))
        })?;
        Some(home.join("token"))
    })?;
    // A token is a few dozen bytes; anything large is not one.
    let meta = std::fs::metadata(&path).ok()?;
    if meta.len() > 4096 {
        return None;
    }
    let token = std::fs::read_to_string(path).ok()?;
    let token = token.trim();
    (!token.is_empty()).then(|| token.to_string())
}

/// What a model argument names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A file on disk, or the name of one in the cache.
    Local(String),
    /// A GGUF model of a Hugging Face repository.
    Hf {
        /// `OWNER/REPO`.
        repo: String,
        /// The quant asked for (matched case-insensitively against the file names).
        quant: Option<String>,
    },
    /// The model layer of an Ollama registry image.
    Ollama {
        /// `NAME` or `USER/NAME`.
        name: String,
        /// The tag (`latest` when none is given).
        tag: String,
    },
}

impl ModelRef {
    /// Parse a model argument. Only the `hf:` and `ollama:` prefixes are special; anything else
    /// is a local name.
    pub fn parse(reference: &str) -> Result<ModelRef, DownloadError> {
        let bad = |reason: &str| DownloadError::BadReference {
            reference: reference.to_string(),
            reason: reason.to_string(),
        };
        if let Some(rest) = reference.strip_prefix("hf:") {
            let (repo, quant) = match rest.split_once(':') {
                Some((repo, quant)) => (repo, Some(quant)),
                None => (rest, None),
            };
            let (owner, name) = repo
                .split_once('/')
                .ok_or_else(|| bad("expected hf:OWNER/REPO[:QUANT]"))?;
            if !valid_segment(owner) || !valid_segment(name) {
                return Err(bad(
                    "OWNER and REPO are letters, digits, '-', '_' and '.' (not starting with '.'), as on Hugging Face",
                ));
            }
            let quant = match quant {
                None => None,
                Some(q) if valid_segment(q) => Some(q.to_string()),
                Some(_) => return Err(bad("QUANT is letters, digits, '-', '_' and '.', such as Q4_K_M")),
            };
            return Ok(ModelRef::Hf {
                repo: repo.to_string(),
                quant,
            });
        }
        if let Some(rest) = reference.strip_prefix("ollama:") {
            let (name, tag) = match rest.rsplit_once(':') {
                Some((name, tag)) => (name, tag),
                None => (rest, "latest"),
            };
            let parts: Vec<&str> = name.split('/').collect();
            if parts.len() > 2 || !parts.iter().all(|p| valid_segment(p)) {
                return Err(bad("expected ollama:NAME[:TAG] or ollama:USER/NAME[:TAG]"));
            }
            if !valid_segment(tag) {
                return Err(bad("TAG is letters, digits, '-', '_' and '.', such as 0.5b"));
            }
            return Ok(ModelRef::Ollama {
                name: name.to_string(),
                tag: tag.to_string(),
            });
        }
        // Ollama's habit: a bare `NAME:TAG` (or `USER/NAME:TAG`) is an Ollama model. Only with
        // the tag: a bare name is a cache entry's, so a typo still gets "did you mean".
        if reference.contains(':') && !reference.starts_with(['.', '/', '~']) && !reference.contains('\\') {
            if let Ok(model_ref @ ModelRef::Ollama { .. }) = Self::parse(&format!("ollama:{reference}")) {
                return Ok(model_ref);
            }
        }
        Ok(ModelRef::Local(reference.to_string()))
    }

    /// The reference in its canonical spelling, as the cache's sidecars record it.
    pub fn canonical(&self) -> String {
        match self {
            ModelRef::Local(s) => s.clone(),
            ModelRef::Hf { repo, quant: None } => format!("hf:{repo}"),
            ModelRef::Hf { repo, quant: Some(q) } => format!("hf:{repo}:{}", q.to_ascii_uppercase()),
            ModelRef::Ollama { name, tag } => format!("ollama:{name}:{tag}"),
        }
    }
}

/// A name part of a reference: no separators, no `..`, nothing a URL or a path would read
/// differently.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 96
        && !s.starts_with('.')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// What a download reports while it runs, for the caller to show.
pub trait Progress {
    /// Another process is fetching `name`; this one waits for it.
    fn waiting(&mut self, _name: &str) {}
    /// `name` (`total` bytes) starts downloading, `resumed_from` of them already held.
    fn start(&mut self, _name: &str, _total: u64, _resumed_from: u64) {}
    /// `done` bytes of the current file are held.
    fn advance(&mut self, _done: u64) {}
    /// The current file is complete and verified.
    fn finish(&mut self) {}
}

/// A [`Progress`] that shows nothing.
pub struct NoProgress;

impl Progress for NoProgress {}

/// The local path of a model argument: an existing path as it is, a name in the cache, or an
/// `hf:`/`ollama:` reference, fetched only if the cache does not hold it yet. For a split model
/// the path is the first part's.
pub fn resolve(reference: &str, config: &Config, progress: &mut dyn Progress) -> Result<PathBuf, DownloadError> {
    if Path::new(reference).exists() {
        return Ok(PathBuf::from(reference));
    }
    let model_ref = ModelRef::parse(reference)?;
    match &model_ref {
        // Only a bare file name can be a cache entry's.
        ModelRef::Local(name) if Path::new(name).components().count() > 1 => Err(DownloadError::NoSuchFile {
            path: PathBuf::from(name),
        }),
        ModelRef::Local(name) => cache::find_name(&config.cache_dir, name)?.ok_or_else(|| DownloadError::NotFound {
            name: name.clone(),
            cache: config.cache_dir.clone(),
        }),
        _ => match cache::find_reference(&config.cache_dir, &model_ref.canonical())? {
            Some(path) => Ok(path),
            None => fetch_ref(&model_ref, config, progress),
        },
    }
}

/// Fetch an `hf:` or `ollama:` reference as the server lists it now, reusing what the cache
/// already holds of it (same name, same digest); returns the local path. A local name
/// resolves as in [`resolve`].
pub fn pull(reference: &str, config: &Config, progress: &mut dyn Progress) -> Result<PathBuf, DownloadError> {
    match ModelRef::parse(reference)? {
        ModelRef::Local(_) => resolve(reference, config, progress),
        model_ref => fetch_ref(&model_ref, config, progress),
    }
}

fn fetch_ref(model_ref: &ModelRef, config: &Config, progress: &mut dyn Progress) -> Result<PathBuf, DownloadError> {
    let client = http::Client::new(config);
    let plan = match model_ref {
        ModelRef::Hf { repo, quant } => hf::plan(&client, config, repo, quant.as_deref())?,
        ModelRef::Ollama { name, tag } => ollama::plan(&client, config, name, tag)?,
        ModelRef::Local(_) => unreachable!("local names are resolved without fetching"),
    };
    fetch::fetch_model(&client, config, &model_ref.canonical(), &plan, progress)
}

/// One file to fetch: where from, under which cache name, and what it must be.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RemoteFile {
    /// The URL (it may redirect).
    url: String,
    /// The file's name in the cache.
    name: String,
    /// Its size in bytes.
    size: u64,
    /// Its sha256, lowercase hex, where the server publishes one.
    sha256: Option<String>,
    /// The Hugging Face repository whose token the request carries (and whose name a 401
    /// names), for a file of one.
    auth_repo: Option<String>,
}

/// A model to fetch: its files (the parts of a split model in order) and where it came from.
#[derive(Debug, Clone)]
struct Plan {
    /// `hf:OWNER/REPO` or `ollama:NAME`: a cached file of the same name from the same origin is
    /// an older version, which may be replaced.
    origin: String,
    files: Vec<RemoteFile>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_into_their_kinds() {
        assert_eq!(
            ModelRef::parse("hf:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF:q4_k_m").unwrap(),
            ModelRef::Hf {
                repo: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF".into(),
                quant: Some("q4_k_m".into())
            }
        );
        assert_eq!(
            ModelRef::parse("hf:a/b").unwrap(),
            ModelRef::Hf {
                repo: "a/b".into(),
                quant: None
            }
        );
        assert_eq!(
            ModelRef::parse("ollama:qwen2.5-coder:0.5b").unwrap(),
            ModelRef::Ollama {
                name: "qwen2.5-coder".into(),
                tag: "0.5b".into()
            }
        );
        assert_eq!(
            ModelRef::parse("ollama:someone/model").unwrap(),
            ModelRef::Ollama {
                name: "someone/model".into(),
                tag: "latest".into()
            }
        );
        assert_eq!(
            ModelRef::parse("models/x.gguf").unwrap(),
            ModelRef::Local("models/x.gguf".into())
        );
    }

    #[test]
    fn a_bare_name_with_a_tag_is_an_ollama_model_and_one_without_stays_a_cache_name() {
        let ollama = |name: &str, tag: &str| ModelRef::Ollama {
            name: name.into(),
            tag: tag.into(),
        };
        assert_eq!(
            ModelRef::parse("qwen2.5-coder:0.5b").unwrap(),
            ollama("qwen2.5-coder", "0.5b")
        );
        assert_eq!(
            ModelRef::parse("someone/model:q4").unwrap(),
            ollama("someone/model", "q4")
        );
        assert_eq!(
            ModelRef::parse("qwen2.5-coder:0.5b").unwrap().canonical(),
            "ollama:qwen2.5-coder:0.5b"
        );
        for local in [
            "qwen2.5-coder",
            "./a:b.gguf",
            "/models/a:b.gguf",
            "C:\\models\\a.gguf",
            "a/b/c:d",
        ] {
            assert_eq!(
                ModelRef::parse(local).unwrap(),
                ModelRef::Local(local.into()),
                "{local}"
            );
        }
    }

    #[test]
    fn references_that_could_escape_a_url_or_the_cache_are_refused() {
        for bad in [
            "hf:owner",
            "hf:/repo",
            "hf:owner/../x",
            "hf:owner/repo/extra",
            "hf:owner/repo:Q4?x=1",
            "ollama:",
            "ollama:a/b/c",
            "ollama:../x",
            "ollama:name:",
            "ollama:name:tag/x",
        ] {
            let err = ModelRef::parse(bad).unwrap_err();
            assert!(err.to_string().contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn the_canonical_spelling_uppercases_the_quant_and_names_the_tag() {
        assert_eq!(ModelRef::parse("hf:a/b:q8_0").unwrap().canonical(), "hf:a/b:Q8_0");
        assert_eq!(ModelRef::parse("ollama:x").unwrap().canonical(), "ollama:x:latest");
    }

    #[test]
    fn a_timeout_is_a_positive_number_of_seconds() {
        assert_eq!(parse_timeout("1.5"), Some(Duration::from_millis(1500)));
        for bad in ["0", "-1", "nan", "inf", "x", ""] {
            assert_eq!(parse_timeout(bad), None, "{bad}");
        }
    }
}
