//! `minfer serve`: its flags, checked and turned into the server's configuration.

use crate::args::*;
use anyhow::Context;
use std::path::PathBuf;

/// `minfer serve`'s flags.
#[derive(clap::Args)]
pub(crate) struct ServeArgs {
    /// The GGUF model file (or -m FILE, as llama-server takes it).
    pub(crate) model: Option<PathBuf>,
    /// The GGUF model file (llama-server's -m).
    #[arg(short = 'm', long = "model", value_name = "FILE", conflicts_with = "model")]
    pub(crate) model_flag: Option<PathBuf>,
    /// Serve every GGUF model in this directory, each loaded when a request first names it in
    /// its `model` field (llama-server's router mode); without a model or --models-dir, the
    /// model cache (`minfer list`) is the directory.
    #[arg(long, value_name = "DIR")]
    pub(crate) models_dir: Option<PathBuf>,
    /// With several models: most loaded at once; the least recently used idle one is unloaded
    /// to make room (also when memory would not hold the next).
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) models_max: u32,
    /// The model's name in /v1/models and in every response's `model` field (llama-server's
    /// --alias); the file's name without `.gguf` by default.
    #[arg(long, value_name = "NAME")]
    pub(crate) alias: Option<String>,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port to listen on (0 picks a free one; the address is printed on standard error).
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Most concurrent generations (slots). Default: as many as the KV cache admits (up to 64;
    /// 4 with a draft model, whose drafters hold a cache per slot, with --no-kv-unified, or for
    /// a model with sliding-window layers, whose slots each keep a window).
    #[arg(long = "n-slots", alias = "parallel", value_name = "N")]
    pub(crate) n_slots: Option<usize>,
    /// The server's whole KV cache in tokens (cells), shared by every generation, as
    /// llama-server's -c is; each generation may hold up to the model's training context of
    /// it. 0, the default: the model's training context, fit to memory as the CLI's -c 0 is.
    #[arg(short = 'c', long = "n-ctx", alias = "ctx-size", default_value_t = 0)]
    pub(crate) n_ctx: usize,
    /// One KV cache for all slots (the default): requests are admitted while the cells they
    /// need fit, cached prompts are shared by any slot and evicted least recently used first.
    /// --no-kv-unified splits -c evenly between the slots instead.
    #[arg(long = "no-kv-unified", alias = "no-kvu", action = clap::ArgAction::SetFalse)]
    pub(crate) kv_unified: bool,
    /// MiB of host memory for cached prompts evicted from the KV cache (llama-server's
    /// --cache-ram): a prompt that starts with one gets its rows back instead of reading it
    /// again. -1: no limit; 0: none.
    #[arg(long = "cache-ram", alias = "cram", value_name = "MIB", default_value_t = 8192, allow_negative_numbers = true,
          value_parser = clap::value_parser!(i64).range(-1..))]
    pub(crate) cache_ram: i64,
    /// Require this key as 'Authorization: Bearer KEY' (also MINFER_API_KEY).
    #[arg(
        long,
        env = "MINFER_API_KEY",
        hide_env_values = true,
        conflicts_with = "api_key_file"
    )]
    pub(crate) api_key: Option<String>,
    /// Read the API key from the first line of FILE (llama-server's --api-key-file).
    #[arg(long, value_name = "FILE")]
    pub(crate) api_key_file: Option<PathBuf>,
    /// Seconds a request's body may take to arrive and a response write may make no progress
    /// (llama-server's -to: sets --body-timeout and --write-timeout).
    #[arg(long, value_name = "SECONDS")]
    pub(crate) timeout: Option<f64>,
    /// Largest request body accepted, in bytes (larger ones get 413).
    #[arg(long, default_value_t = minfer::server::DEFAULT_MAX_BODY_BYTES)]
    pub(crate) max_body_bytes: usize,
    /// Seconds in-flight requests may run after SIGINT/SIGTERM (once the listener is
    /// closed) before they are cancelled.
    #[arg(long, default_value_t = 10.0)]
    pub(crate) shutdown_timeout: f64,
    /// Seconds after SIGINT/SIGTERM during which /ready answers 503 but connections are
    /// still accepted and served, for balancers that poll /ready; then the listener closes.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) drain_delay: f64,
    /// Requests that may wait for a slot while all are busy; more are answered 503 with
    /// Retry-After, and /ready answers 503 while the queue is full. Default: no bound
    /// (beyond --max-connections).
    #[arg(long, value_name = "N")]
    pub(crate) queue_max: Option<usize>,
    /// Seconds a connection may take to send a request's headers, idle keep-alive time
    /// included; slower connections are closed.
    #[arg(long, default_value_t = minfer::server::DEFAULT_HEADER_TIMEOUT_S)]
    pub(crate) header_timeout: f64,
    /// Seconds a request's body may take to arrive after its headers (slower ones get 408).
    #[arg(long, default_value_t = minfer::server::DEFAULT_BODY_TIMEOUT_S)]
    pub(crate) body_timeout: f64,
    /// Seconds a response write may make no progress (a client that does not read) before
    /// the connection is closed.
    #[arg(long, default_value_t = minfer::server::DEFAULT_WRITE_TIMEOUT_S)]
    pub(crate) write_timeout: f64,
    /// Most connections open at once; further ones wait in the listen backlog.
    #[arg(long, default_value_t = minfer::server::DEFAULT_MAX_CONNECTIONS)]
    pub(crate) max_connections: usize,
    /// Read control-token text in messages (`<|im_start|>`, `<|im_end|>`) as control tokens,
    /// as llama.cpp's server does. By default it stays plain text, so a user cannot forge
    /// a system turn; the template's own markers are control tokens either way.
    #[arg(long)]
    pub(crate) special_in_content: bool,
    #[command(flatten)]
    pub(crate) cache: CacheArgs,
    #[command(flatten)]
    pub(crate) model_args: ModelArgs,
    /// Answer GET /slots with each slot's state (llama-server's --slots).
    #[arg(long)]
    pub(crate) slots: bool,
    /// Do not serve the chat page at / (llama-server's --no-webui).
    #[arg(long)]
    pub(crate) no_webui: bool,
    /// Serve embeddings (llama-server's --embeddings): /v1/embeddings, /embedding and Ollama's
    /// /api/embed, beside generation; inputs share passes of up to --batch-size tokens.
    #[arg(long, visible_alias = "embedding")]
    pub(crate) embeddings: bool,
    /// Serve reranking (llama-server's --reranking): --embeddings with pooling rank, for a
    /// model with a rank head (a reranker); enables /rerank and /v1/rerank.
    #[arg(long, visible_alias = "rerank")]
    pub(crate) reranking: bool,
    /// How the embeddings pool token rows: none, mean, cls, last or rank (default: the model's
    /// pooling_type, else last).
    #[arg(long, value_name = "P", value_parser = parse_pooling)]
    pub(crate) pooling: Option<minfer::models::pooling::Pooling>,
    /// How embeddings are scaled when a request does not say (its `embd_normalize`):
    /// llama.cpp's integers, -1 none, 0 max absolute, 1 taxicab, 2 euclidean, p > 2 a p-norm.
    #[arg(long, default_value_t = 2, allow_negative_numbers = true, value_name = "N")]
    pub(crate) embd_normalize: i32,
    /// Tokens one forward pass takes at most: every generating slot's next token, then
    /// chunks of the prompts being read (llama.cpp's -b; -ub is the same here).
    #[arg(short = 'b', long, alias = "ubatch-size", default_value_t = minfer::server::DEFAULT_BATCH_SIZE)]
    pub(crate) batch_size: usize,
    /// Let browser pages from ORIGIN call the server (repeatable; `*` for any origin). None
    /// by default.
    #[arg(long = "cors-origin", value_name = "ORIGIN", value_delimiter = ',')]
    pub(crate) cors_origins: Vec<String>,
    /// A name besides localhost and loopback addresses that a server on loopback without an
    /// API key answers in the Host header (repeatable; `*` for any): a proxy's upstream name.
    #[arg(long = "allowed-host", value_name = "NAME")]
    pub(crate) allowed_hosts: Vec<String>,
    #[command(flatten)]
    pub(crate) draft: crate::cli::draft::DraftArgs,
    /// Tokens a request that sets no limit (`max_tokens`, `n_predict`) generates at most
    /// (llama-server's -n); -1, the default: until the end of its context.
    #[arg(short = 'n', long = "n-predict", allow_negative_numbers = true, value_name = "N")]
    pub(crate) n_predict: Option<i64>,
    /// A stop string of every request that sends none (llama-server's -r; repeatable).
    #[arg(long = "stop", value_name = "STRING")]
    pub(crate) stop: Vec<String>,
    /// Requests that do not say otherwise generate past end-of-generation tokens
    /// (llama-server's --ignore-eos).
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// llama-server's answer under `__verbose` beside every OpenAI one, as a request's
    /// `verbose` asks (llama-server's --verbose).
    #[arg(short = 'v', long)]
    pub(crate) verbose: bool,
    /// Where a thinking model's reasoning goes in chat replies (llama-server's
    /// --reasoning-format): `auto` (the default) and `deepseek` put it in `reasoning_content`
    /// where the chat template thinks, `deepseek-legacy` there and in the content too, `none`
    /// leaves it in the content. A request's `reasoning_format` wins.
    #[arg(long, value_name = "FORMAT", default_value = "auto", value_parser = reasoning_format)]
    pub(crate) reasoning_format: minfer::template::reasoning::ReasoningFormat,
    /// Whether a thinking model thinks (llama-server's -rea/--reasoning): the template variable
    /// `enable_thinking` of requests that do not set it, true unless `off`.
    #[arg(long, value_name = "on|off|auto", value_parser = ["on", "off", "auto"])]
    pub(crate) reasoning: Option<String>,
    /// Tokens a thinking model may reason before its closing tag is forced, for requests that
    /// set no `reasoning_budget_tokens` (llama-server's --reasoning-budget): -1, the default,
    /// no limit; 0: answers without reasoning.
    #[arg(long, value_name = "N", default_value_t = -1, allow_negative_numbers = true,
          value_parser = crate::args::reasoning_budget)]
    pub(crate) reasoning_budget: i64,
    /// Text forced before the closing tag when the budget is spent (llama-server's
    /// --reasoning-budget-message).
    #[arg(long, value_name = "TEXT", default_value = "")]
    pub(crate) reasoning_budget_message: String,
    /// The sampling a request gets for the fields it leaves out, as llama-server's flags set it.
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
}

/// What a request gets for the fields it leaves out: the server's defaults (no repeat penalty;
/// no min-p on the OpenAI endpoints, llama.cpp's 0.05 on `/completion`), changed by the
/// sampling flags given; `--seed -1` (the default) lets each request draw its own seed.
pub(crate) fn request_defaults(
    sampling: &SamplingArgs,
    n_predict: Option<i64>,
) -> anyhow::Result<minfer::server::RequestDefaults> {
    let mut defaults = minfer::server::RequestDefaults::default();
    let given = sampling.params()?;
    if let Some(min_p) = sampling.min_p {
        defaults.native_min_p = min_p;
    }
    defaults.sampling = minfer::sampling::SamplingParams {
        min_p: sampling.min_p.unwrap_or(defaults.sampling.min_p),
        seed: defaults.sampling.seed,
        ..given
    };
    if sampling.greedy {
        defaults.native_min_p = defaults.sampling.min_p;
    }
    defaults.seed = (sampling.seed != -1).then_some(given.seed);
    defaults.n_predict = match n_predict {
        None | Some(-1 | -2) => None,
        Some(n) => Some(
            usize::try_from(n)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| anyhow::anyhow!("-n {n} is out of range: it must be -1 (no limit) or 1 or more"))?,
        ),
    };
    Ok(defaults)
}

/// Check `minfer serve`'s flags, load the draft model if one is asked for, and serve until a
/// signal stops the server.
pub(crate) fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    let model_options = args.model_args.options()?;
    let model = args.model.take().or(args.model_flag.take());
    anyhow::ensure!(
        model.is_none() || args.models_dir.is_none(),
        "give one model or --models-dir, not both"
    );
    // Without a model: every model of the directory, the cache by default.
    let models = match &model {
        Some(_) => None,
        None => Some(minfer::server::ModelsConfig {
            dir: args
                .models_dir
                .clone()
                .unwrap_or_else(minfer::download::cache::default_dir),
            max: args.models_max as usize,
        }),
    };
    if let Some(seconds) = args.timeout {
        (args.body_timeout, args.write_timeout) = (seconds, seconds);
    }
    if let Some(file) = &args.api_key_file {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("cannot read --api-key-file {}", file.display()))?;
        let keys: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        anyhow::ensure!(
            keys.len() == 1,
            "--api-key-file {}: minfer takes exactly one key (the file has {})",
            file.display(),
            keys.len()
        );
        args.api_key = Some(keys[0].to_string());
    }
    let draft_choice = args.draft.choice()?;
    // Without -np the cache decides how many run at once, up to the most its cells can tell
    // apart; a draft model's drafters each hold a cache, so they keep llama-server's 4.
    let n_slots = args.n_slots.unwrap_or(match args.kv_unified && draft_choice.is_none() {
        true => minfer::server::MAX_SLOTS,
        false => 4,
    });
    // Split between the slots, -c is each one's share (llama-server's way without --kv-unified).
    let n_ctx = match args.kv_unified {
        true => args.n_ctx,
        false if args.n_ctx > 0 => (args.n_ctx / n_slots.max(1)).max(1),
        false => 0,
    };
    let mut defaults = minfer::server::RequestDefaults {
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        verbose: args.verbose,
        reasoning_format: args.reasoning_format,
        reasoning_budget: crate::args::budget_tokens(args.reasoning_budget),
        reasoning_budget_message: args.reasoning_budget_message.clone(),
        ..request_defaults(&args.sampling, args.n_predict)?
    };
    // Thinking is on by default (`on` and `auto` leave it so); `-rea off` turns it off.
    if args.reasoning.as_deref() == Some("off") {
        defaults.template_kwargs.insert("enable_thinking".into(), false.into());
    }
    if args.reranking {
        anyhow::ensure!(
            args.pooling.is_none_or(|p| p == minfer::models::pooling::Pooling::Rank),
            "--reranking pools by rank; --pooling {} contradicts it",
            args.pooling.map_or("", |p| p.name())
        );
        args.pooling = Some(minfer::models::pooling::Pooling::Rank);
    }
    for (flag, seconds) in [
        ("--shutdown-timeout", args.shutdown_timeout),
        ("--drain-delay", args.drain_delay),
    ] {
        anyhow::ensure!(
            seconds.is_finite() && (0.0..1e9).contains(&seconds),
            "{flag} must be a number of seconds >= 0"
        );
    }
    for (flag, seconds) in [
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
        ("--write-timeout", args.write_timeout),
    ] {
        anyhow::ensure!(
            seconds.is_finite() && seconds > 0.0 && seconds < 1e9,
            "{flag} must be a number of seconds above 0"
        );
    }
    // clap reads an empty MINFER_API_KEY as unset; an empty key must be refused as the flag's
    // is, not turn authentication off.
    let api_key = args.api_key.or_else(|| std::env::var("MINFER_API_KEY").ok());
    // The draft model loads as the model will: same threads, backends, -ngl and file options,
    // its own chat template.
    let draft = match draft_choice {
        Some(choice) => {
            let options = minfer::engine::ModelOptions {
                chat_template: None,
                ..model_options.clone()
            };
            let source = crate::generate::resolve_draft(choice)?
                .load(&options)
                .context("cannot load the draft model")?;
            Some((source, args.draft.options()))
        }
        None => None,
    };
    let seconds = std::time::Duration::from_secs_f64;
    minfer::server::serve(minfer::server::ServerConfig {
        model: match &model {
            Some(model) => model_path(model)?,
            None => PathBuf::new(),
        },
        alias: args.alias,
        host: args.host,
        port: args.port,
        model_options,
        session: minfer::engine::SessionOptions {
            n_ctx,
            n_seq_max: n_slots,
            kv_unified: args.kv_unified,
            type_k: args.cache.cache_type_k,
            type_v: args.cache.cache_type_v,
            // A step takes up to --batch-size tokens in one pass: the window cache, where the
            // model has one, holds that beside the slots' windows.
            n_ubatch: Some(args.batch_size.max(n_slots)),
            swa_full: args.cache.swa_full,
        },
        api_key,
        max_body_bytes: args.max_body_bytes,
        shutdown_timeout: seconds(args.shutdown_timeout),
        drain_delay: seconds(args.drain_delay),
        queue_max: args.queue_max,
        header_timeout: seconds(args.header_timeout),
        body_timeout: seconds(args.body_timeout),
        write_timeout: seconds(args.write_timeout),
        max_connections: args.max_connections,
        special_in_content: args.special_in_content,
        batch_size: args.batch_size,
        n_slots_auto: args.n_slots.is_none(),
        cache_ram: match args.cache_ram {
            0 => None,
            -1 => Some(usize::MAX),
            mib => Some((mib as usize).saturating_mul(1 << 20)),
        },
        embeddings: args.embeddings || args.reranking,
        pooling: args.pooling,
        embd_normalize: minfer::engine::Normalize::new(args.embd_normalize).context("--embd-normalize")?,
        cors_origins: args.cors_origins,
        allowed_hosts: args.allowed_hosts,
        slots_endpoint: args.slots,
        webui: !args.no_webui,
        draft,
        defaults,
        models,
    })?;
    Ok(())
}

/// A `--pooling` value by llama.cpp's name.
fn parse_pooling(name: &str) -> Result<minfer::models::pooling::Pooling, String> {
    minfer::models::pooling::Pooling::parse(name)
        .ok_or_else(|| format!("'{name}': expected none, mean, cls, last or rank"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        sampling: SamplingArgs,
        #[arg(short = 'n', allow_negative_numbers = true)]
        n_predict: Option<i64>,
    }

    fn defaults(args: &[&str]) -> anyhow::Result<minfer::server::RequestDefaults> {
        let flags = Flags::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))?;
        request_defaults(&flags.sampling, flags.n_predict)
    }

    #[test]
    fn a_server_without_sampling_flags_gives_requests_its_usual_defaults() {
        assert_eq!(defaults(&[]).unwrap(), minfer::server::RequestDefaults::default());
    }

    #[test]
    fn sampling_flags_become_the_defaults_of_every_request() {
        let d = defaults(&[
            "--temp", "0.2", "--top-k", "5", "--seed", "7", "-n", "12", "--min-p", "0.1",
        ])
        .unwrap();
        assert_eq!((d.sampling.temperature, d.sampling.top_k), (0.2, 5));
        assert_eq!((d.seed, d.n_predict), (Some(7), Some(12)));
        assert_eq!((d.sampling.min_p, d.native_min_p), (0.1, 0.1));
        let unchanged = minfer::server::RequestDefaults::default();
        assert_eq!(d.sampling.repeat_penalty, unchanged.sampling.repeat_penalty);
        assert_eq!(defaults(&["-n", "-1"]).unwrap().n_predict, None);
        assert!(defaults(&["-n", "0"])
            .unwrap_err()
            .to_string()
            .contains("-n 0 is out of range"));
        assert!(defaults(&["--temp", "nan"]).is_err());
    }
}
