//! The server's counters and gauges, and their Prometheus text rendering for `GET /metrics`.
//!
//! Everything here is a lock-free atomic except the per-route request counts, so recording
//! never waits on a generation. This file only counts: it decides nothing and reads no
//! request.
//!
//! The names, types and labels are a stable interface for Prometheus scraping, each listed in
//! the metrics table of docs/server.md: rename nothing, and add a metric to the table with the code.
//! Beside minfer's own `minfer_*` names, llama-server's `llamacpp:*` metrics are rendered under
//! its names, types and meanings, so that dashboards made for llama-server read minfer unchanged.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

#[derive(Default)]
pub struct Metrics {
    /// (route, status) → responses.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Speculative decoding: tokens proposed and checked, and those kept.
    pub draft_tokens: AtomicU64,
    pub draft_tokens_accepted: AtomicU64,
    prompt_micros: AtomicU64,
    generation_micros: AtomicU64,
    ttft_micros: AtomicU64,
    ttft_count: AtomicU64,
    pub queue_depth: AtomicUsize,
    pub slots_busy: AtomicUsize,
    /// The most slots generating at once so far.
    pub slots_busy_max: AtomicUsize,
    pub slots_total: AtomicUsize,
    /// Whether each slot is generating, for `/slots`.
    pub slot_processing: Mutex<Vec<bool>>,
    pub cancelled: AtomicU64,
    pub internal_errors: AtomicU64,
    /// Requests refused with 503 because `--queue-max` requests were already waiting.
    pub rejected: AtomicU64,
    /// Forward passes run, and the slots busy in each summed over them.
    pub n_decode: AtomicU64,
    pub n_busy_slots: AtomicU64,
    /// The most cells one slot has held at the end of a run (prompt and generated tokens).
    pub n_tokens_max: AtomicUsize,
    /// Cells of cached prefixes (idle slots' tokens) evicted to make room.
    pub cache_evicted_cells: AtomicU64,
    /// Runs preempted because the cache was full (each resumed later).
    pub preemptions: AtomicU64,
    /// The host tier of the prompt cache (`--cache-ram`): bytes held, prompts that took a copy
    /// back, and the tokens restored instead of read.
    pub host_cache_bytes: AtomicUsize,
    pub host_cache_hits: AtomicU64,
    pub host_cache_tokens: AtomicU64,
    /// Speculative decoding: steps that checked proposals.
    pub draft_checks: AtomicU64,
    /// Tokens generated that took a decode step of their own: each run's first token comes
    /// from the prompt's last pass, so it is not counted (llama-server's generation rate).
    gen_steps: AtomicU64,
    /// When the server started, in seconds since the epoch (`Process-Start-Time-Unix`).
    pub started: AtomicU64,
}

fn micros(d: Duration) -> u64 {
    d.as_micros().min(u64::MAX as u128) as u64
}

impl Metrics {
    pub fn record_response(&self, route: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *map.entry((route.to_string(), status)).or_default() += 1;
    }

    /// One finished generation's work.
    pub fn record_generation(&self, stats: &crate::engine::GenerationStats) {
        self.prompt_tokens.fetch_add(stats.n_prompt as u64, Ordering::Relaxed);
        self.prompt_tokens_cached
            .fetch_add(stats.n_cached as u64, Ordering::Relaxed);
        self.completion_tokens
            .fetch_add(stats.n_generated as u64, Ordering::Relaxed);
        self.gen_steps
            .fetch_add(stats.n_generated.saturating_sub(1) as u64, Ordering::Relaxed);
        self.draft_tokens.fetch_add(stats.n_drafted as u64, Ordering::Relaxed);
        self.draft_tokens_accepted
            .fetch_add(stats.n_accepted as u64, Ordering::Relaxed);
        self.prompt_micros
            .fetch_add(micros(stats.prompt_time), Ordering::Relaxed);
        self.generation_micros
            .fetch_add(micros(stats.gen_time), Ordering::Relaxed);
    }

    /// Embedding work: prompt tokens read in `n_passes` forward passes over `elapsed` (as
    /// llama-server counts an embedding's prompt and its decode calls; nothing is generated).
    pub fn record_embedding(&self, n_tokens: usize, n_passes: u64, elapsed: Duration) {
        self.prompt_tokens.fetch_add(n_tokens as u64, Ordering::Relaxed);
        self.n_decode.fetch_add(n_passes, Ordering::Relaxed);
        self.prompt_micros.fetch_add(micros(elapsed), Ordering::Relaxed);
    }

    /// Time from a request's arrival in the queue to its first generated token.
    pub fn record_ttft(&self, ttft: Duration) {
        self.ttft_micros.fetch_add(micros(ttft), Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn render(&self) -> String {
        use std::fmt::Write;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, String)>| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let requests: Vec<(String, String)> = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|((route, status), n)| (format!("{{route=\"{route}\",status=\"{status}\"}}"), n.to_string()))
            .collect();
        metric(
            "minfer_requests_total",
            "counter",
            "HTTP responses by route and status.",
            requests,
        );
        let plain = |v: String| vec![(String::new(), v)];
        metric(
            "minfer_prompt_tokens_total",
            "counter",
            "Prompt tokens prefilled.",
            plain(load(&self.prompt_tokens).to_string()),
        );
        metric(
            "minfer_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens reused from a slot's KV cache instead of prefilled.",
            plain(load(&self.prompt_tokens_cached).to_string()),
        );
        metric(
            "minfer_completion_tokens_total",
            "counter",
            "Tokens generated.",
            plain(load(&self.completion_tokens).to_string()),
        );
        metric(
            "minfer_draft_tokens_total",
            "counter",
            "Speculative decoding: drafted tokens checked by the model.",
            plain(load(&self.draft_tokens).to_string()),
        );
        metric(
            "minfer_draft_tokens_accepted_total",
            "counter",
            "Speculative decoding: drafted tokens the model kept.",
            plain(load(&self.draft_tokens_accepted).to_string()),
        );
        let prompt_s = load(&self.prompt_micros) as f64 / 1e6;
        let gen_s = load(&self.generation_micros) as f64 / 1e6;
        metric(
            "minfer_prompt_seconds_total",
            "counter",
            "Time spent prefilling, summed over slots.",
            plain(format!("{prompt_s:.6}")),
        );
        metric(
            "minfer_generation_seconds_total",
            "counter",
            "Time spent generating, summed over slots.",
            plain(format!("{gen_s:.6}")),
        );
        let rate = |tokens: u64, s: f64| if s > 0.0 { tokens as f64 / s } else { 0.0 };
        metric(
            "minfer_prompt_tokens_per_second",
            "gauge",
            "Prefill speed of one slot, averaged over all requests so far.",
            plain(format!("{:.3}", rate(load(&self.prompt_tokens), prompt_s))),
        );
        metric(
            "minfer_generation_tokens_per_second",
            "gauge",
            "Generation speed of one slot, averaged over all requests so far.",
            plain(format!("{:.3}", rate(load(&self.completion_tokens), gen_s))),
        );
        metric(
            "minfer_time_to_first_token_seconds",
            "summary",
            "Time from a request's arrival to its first token, queueing included.",
            vec![
                ("_sum".into(), format!("{:.6}", load(&self.ttft_micros) as f64 / 1e6)),
                ("_count".into(), load(&self.ttft_count).to_string()),
            ],
        );
        metric(
            "minfer_queue_depth",
            "gauge",
            "Requests waiting for a slot.",
            plain(self.queue_depth.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "minfer_slots_busy",
            "gauge",
            "Slots generating now.",
            plain(self.slots_busy.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "minfer_slots_busy_max",
            "gauge",
            "The most slots generating at once since the server started.",
            plain(self.slots_busy_max.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "minfer_kv_evicted_cells_total",
            "counter",
            "KV cells of cached prompts (idle slots' tokens) evicted to make room, least recently used first.",
            plain(load(&self.cache_evicted_cells).to_string()),
        );
        metric(
            "minfer_preemptions_total",
            "counter",
            "Generations preempted because the KV cache was full (each resumed later, output unchanged).",
            plain(load(&self.preemptions).to_string()),
        );
        metric(
            "minfer_host_cache_bytes",
            "gauge",
            "Bytes of cached prompts held in host memory (--cache-ram).",
            plain(self.host_cache_bytes.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "minfer_host_cache_hits_total",
            "counter",
            "Prompts that took KV rows back from host memory (--cache-ram).",
            plain(load(&self.host_cache_hits).to_string()),
        );
        metric(
            "minfer_host_cache_tokens_total",
            "counter",
            "Prompt tokens restored from host memory instead of prefilled (--cache-ram).",
            plain(load(&self.host_cache_tokens).to_string()),
        );
        metric(
            "minfer_slots_total",
            "gauge",
            "Slots configured (--n-slots).",
            plain(self.slots_total.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "minfer_requests_cancelled_total",
            "counter",
            "Generations stopped because the client went away or the server shut down.",
            plain(load(&self.cancelled).to_string()),
        );
        metric(
            "minfer_internal_errors_total",
            "counter",
            "Generations that failed inside the server (answered 500).",
            plain(load(&self.internal_errors).to_string()),
        );
        metric(
            "minfer_requests_rejected_total",
            "counter",
            "Requests refused with 503 because every slot was busy and --queue-max requests were waiting.",
            plain(load(&self.rejected).to_string()),
        );
        self.render_llamacpp(&mut out);
        out
    }

    /// llama-server's `llamacpp:*` metrics (its `to_metrics`): the counters, then the gauges,
    /// each with its HELP and TYPE lines.
    fn render_llamacpp(&self, out: &mut String) {
        use std::fmt::Write;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
        let prompt_s = load(&self.prompt_micros) / 1e6;
        let gen_s = load(&self.generation_micros) / 1e6;
        let rate = |n: f64, s: f64| if s > 0.0 { n / s } else { 0.0 };
        let counters = [
            (
                "prompt_tokens_total",
                "Number of prompt tokens processed, excluding cached tokens",
                load(&self.prompt_tokens),
            ),
            (
                "prompt_tokens_cached_total",
                "Number of prompt tokens reused from the cache",
                load(&self.prompt_tokens_cached),
            ),
            ("prompt_seconds_total", "Total time spent processing prompts", prompt_s),
            (
                "tokens_predicted_total",
                "Number of generation tokens processed",
                load(&self.completion_tokens),
            ),
            (
                "tokens_predicted_seconds_total",
                "Total time spent generating tokens",
                gen_s,
            ),
            (
                "n_decode_total",
                "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
                load(&self.n_decode),
            ),
            (
                "n_tokens_max",
                "Largest observed sequence length (prompt + generation)",
                self.n_tokens_max.load(Ordering::Relaxed) as f64,
            ),
            (
                "spec_decode_num_draft_tokens_total",
                "Speculative: Total draft tokens generated",
                load(&self.draft_tokens),
            ),
            (
                "spec_decode_num_accepted_tokens_total",
                "Speculative: Total draft tokens accepted by the target model",
                load(&self.draft_tokens_accepted),
            ),
            (
                "spec_decode_num_drafts_total",
                "Speculative: Total speculative decoding verification steps",
                load(&self.draft_checks),
            ),
        ];
        let n_decode = load(&self.n_decode);
        let gauges = [
            (
                "prompt_tokens_seconds",
                "Average prompt throughput in tokens/s",
                rate(load(&self.prompt_tokens), prompt_s),
            ),
            (
                "predicted_tokens_seconds",
                "Average generation throughput in tokens/s",
                rate(load(&self.gen_steps), gen_s),
            ),
            (
                "requests_processing",
                "Number of requests processing",
                self.slots_busy.load(Ordering::Relaxed) as f64,
            ),
            (
                "requests_deferred",
                "Number of requests deferred",
                self.queue_depth.load(Ordering::Relaxed) as f64,
            ),
            (
                "n_busy_slots_per_decode",
                "Average number of busy slots per llama_decode() call",
                load(&self.n_busy_slots) / n_decode.max(1.0),
            ),
        ];
        for (kind, items) in [("counter", &counters[..]), ("gauge", &gauges[..])] {
            for (name, help, value) in items {
                let _ = writeln!(
                    out,
                    "# HELP llamacpp:{name} {help}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_servers_metrics_are_rendered_under_its_names_and_types_beside_minfers() {
        let m = Metrics::default();
        m.record_generation(&crate::engine::GenerationStats {
            n_prompt: 10,
            n_cached: 4,
            n_generated: 5,
            prompt_time: Duration::from_millis(100),
            gen_time: Duration::from_millis(400),
            ..Default::default()
        });
        m.n_decode.fetch_add(6, Ordering::Relaxed);
        m.n_busy_slots.fetch_add(9, Ordering::Relaxed);
        let text = m.render();
        let value = |name: &str| -> f64 {
            let line = text
                .lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .unwrap_or_else(|| panic!("no {name} in\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        for (name, kind) in [
            ("llamacpp:prompt_tokens_total", "counter"),
            ("llamacpp:tokens_predicted_total", "counter"),
            ("llamacpp:n_decode_total", "counter"),
            ("llamacpp:spec_decode_num_drafts_total", "counter"),
            ("llamacpp:predicted_tokens_seconds", "gauge"),
            ("llamacpp:requests_processing", "gauge"),
            ("llamacpp:n_busy_slots_per_decode", "gauge"),
        ] {
            assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
            assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        }
        assert_eq!(value("llamacpp:prompt_tokens_total"), 10.0);
        assert_eq!(value("llamacpp:prompt_tokens_cached_total"), 4.0);
        assert_eq!(value("llamacpp:tokens_predicted_total"), 5.0);
        assert_eq!(value("llamacpp:n_decode_total"), 6.0);
        assert_eq!(value("llamacpp:n_busy_slots_per_decode"), 1.5);
        // Four decode steps (the first token is free) in 0.4 s.
        assert_eq!(value("llamacpp:predicted_tokens_seconds"), 10.0);
        assert_eq!(value("minfer_prompt_tokens_total"), 10.0);
    }
}
