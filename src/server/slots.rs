//! Slots and the scheduler: `--n-slots` generation threads, each owning one [`Session`] (its
//! own graph cache and KV cache) over the one shared [`Model`] (weights, backends and their
//! thread pool: a slot generating alone uses every thread), and the FIFO queue of jobs waiting
//! for one.
//!
//! A job goes to an idle slot at once, preferring the slot whose cached tokens share the
//! longest prefix with its prompt; with none idle it queues, and a slot that finishes takes the
//! oldest queued job. A slot keeps its KV after a job, and its session knows which tokens that KV
//! holds (`Session::reuse_prefix`), so a follow-up that extends the same
//! conversation prefills only its new tokens. Tokens flow back to the HTTP side over a channel;
//! a job whose receiver is gone (the client disconnected) or whose cancel flag is set stops at
//! its next token and frees the slot. A failure or a panic inside a generation is reported to
//! its job as [`Event::Failed`], the slot's context is reset, and the slot serves on.
//!
//! This file must not parse requests or shape responses: it runs token lists and reports
//! events.

use super::metrics::Metrics;
use super::peer::Peer;
use crate::engine::{generate_cached, GenerateOptions, GenerationObserver, Model, Session, StopReason};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, PoisonError};
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

/// One generation of a job: a choice of the response.
#[derive(Debug, Clone)]
pub struct Run {
    /// The choice's `index` in the response.
    pub index: usize,
    pub prompt: Vec<u32>,
    pub seed: u64,
    pub max_tokens: usize,
}

/// One request's work: its runs, in order, on one slot.
pub struct Job {
    pub runs: Vec<Run>,
    /// Sampling, stop strings; `max_tokens` and the seed come from each run.
    pub options: GenerateOptions,
    /// Report log-probabilities with this many alternatives per token.
    pub logprobs: Option<usize>,
    pub events: UnboundedSender<Event>,
    pub cancel: Arc<AtomicBool>,
    /// The client's socket, watched for a hang-up between tokens; `None` when it was already
    /// half-closed as the request started (it waits for the answer) or cannot be watched.
    pub peer: Option<Arc<Peer>>,
    pub arrived: Instant,
    /// Fail inside the slot on purpose (the server's fault injection, for testing recovery).
    pub fault: bool,
}

impl Job {
    fn abandoned(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
            || self.events.is_closed()
            || self.peer.as_ref().is_some_and(|p| p.hung_up())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens at this position, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A sampled token's log-probability (only when the job asked for them), sent before the
    /// text the token completes.
    Logprob { index: usize, logprob: TokenLogprob },
    /// Generated text, whole UTF-8 characters only.
    Text { index: usize, text: String },
    /// A run ended.
    Done {
        index: usize,
        reason: StopReason,
        n_prompt: usize,
        n_cached: usize,
        n_generated: usize,
    },
    /// The job failed inside the server; no more events follow.
    Failed(String),
}

struct SlotState {
    idle: bool,
    /// The tokens in the slot's KV cache, as of when it last went idle.
    cached: Vec<u32>,
    tx: mpsc::Sender<Job>,
}

struct State {
    queue: VecDeque<Job>,
    slots: Vec<SlotState>,
}

struct Shared {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
    /// The model the sessions run (its tokenizer turns tokens back into text).
    model: Arc<Model>,
    /// Set at shutdown: every generation stops at its next token.
    stop_all: AtomicBool,
}

#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Scheduler {
    /// Starts one thread per session.
    pub fn start(sessions: Vec<Session>, model: Arc<Model>, metrics: Arc<Metrics>) -> std::io::Result<Self> {
        let mut slots = Vec::new();
        let mut receivers = Vec::new();
        for _ in &sessions {
            let (tx, rx) = mpsc::channel();
            slots.push(SlotState {
                idle: true,
                cached: Vec::new(),
                tx,
            });
            receivers.push(rx);
        }
        metrics.slots_total.store(slots.len(), Ordering::Relaxed);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                slots,
            }),
            metrics,
            model,
            stop_all: AtomicBool::new(false),
        });
        for (id, (session, rx)) in sessions.into_iter().zip(receivers).enumerate() {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("slot-{id}"))
                .spawn(move || worker(id, session, rx, &shared))?;
        }
        Ok(Scheduler { shared })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `job` on an idle slot now, or queues it behind the jobs already waiting.
    pub fn submit(&self, job: Job) {
        let mut state = self.lock();
        let prompt = job.runs.first().map(|r| r.prompt.as_slice()).unwrap_or(&[]);
        let best = state
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.idle)
            .max_by_key(|(id, s)| (common_prefix(&s.cached, prompt), std::cmp::Reverse(*id)))
            .map(|(id, _)| id);
        match best {
            Some(id) => {
                let slot = &mut state.slots[id];
                slot.idle = false;
                self.shared.metrics.slots_busy.fetch_add(1, Ordering::Relaxed);
                // The worker holds the receiver for the life of the process.
                let _ = slot.tx.send(job);
            }
            None => {
                state.queue.push_back(job);
                self.shared
                    .metrics
                    .queue_depth
                    .store(state.queue.len(), Ordering::Relaxed);
            }
        }
    }

    /// Stops every generation at its next token and drops every queued job (their clients see
    /// the stream end).
    pub fn cancel_all(&self) {
        self.shared.stop_all.store(true, Ordering::Relaxed);
        let mut state = self.lock();
        state.queue.clear();
        self.shared.metrics.queue_depth.store(0, Ordering::Relaxed);
    }
}

fn worker(id: usize, mut session: Session, rx: mpsc::Receiver<Job>, shared: &Shared) {
    while let Ok(job) = rx.recv() {
        let mut next = Some(job);
        while let Some(job) = next.take() {
            run_job(id, &mut session, &job, shared);
            // The job (and with it the response's channel) is dropped only after the slot is
            // marked idle, so a client that has seen its response complete sees a free slot.
            let _finished = job;
            let mut state = shared.state.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(job) = state.queue.pop_front() {
                if !job.abandoned() {
                    next = Some(job);
                    break;
                }
                shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            shared.metrics.queue_depth.store(state.queue.len(), Ordering::Relaxed);
            if next.is_none() {
                let slot = &mut state.slots[id];
                slot.idle = true;
                // What the session's KV holds, for choosing the slot of the next prompt.
                slot.cached = session.seq_tokens(0);
                shared.metrics.slots_busy.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

fn run_job(id: usize, session: &mut Session, job: &Job, shared: &Shared) {
    for run in &job.runs {
        if job.abandoned() || shared.stop_all.load(Ordering::Relaxed) {
            shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
            eprintln!("slot {id}: request cancelled before choice {}", run.index);
            return;
        }
        // The session keeps the longest prefix it holds (never the last prompt token, whose
        // logits give the first new one).
        let n_cached = match session.reuse_prefix(0, &run.prompt) {
            Ok(n) => n,
            Err(_) => {
                session.reset();
                0
            }
        };
        let mut options = job.options.clone();
        options.sampling.seed = run.seed;
        options.max_tokens = run.max_tokens;
        let mut observer = Observer {
            job,
            index: run.index,
            shared,
            pending: Vec::new(),
            tokens: Vec::new(),
        };
        let model = Arc::clone(&shared.model);
        let result = catch_unwind(AssertUnwindSafe(|| {
            if job.fault {
                panic!("fault injected on purpose (MINFER_SERVE_FAULT)");
            }
            generate_cached(
                session,
                model.tokenizer(),
                &run.prompt,
                n_cached,
                &options,
                &mut observer,
            )
        }));
        let failure = match result {
            Ok(Ok(result)) => {
                let tail = std::mem::take(&mut observer.pending);
                let _ = observer.send(Event::Text {
                    index: run.index,
                    text: String::from_utf8_lossy(&tail).into_owned(),
                });
                let stats = &result.stats;
                shared.metrics.record_generation(stats);
                eprintln!(
                    "slot {id}: prompt {} tokens ({} cached, {} prefilled in {:.3} s), generated {} tokens in {:.3} s ({:.1} tok/s), finish {:?}",
                    stats.n_cached + stats.n_prompt,
                    stats.n_cached,
                    stats.n_prompt,
                    stats.prompt_time.as_secs_f64(),
                    stats.n_generated,
                    stats.gen_time.as_secs_f64(),
                    stats.gen_tok_per_s(),
                    result.stop_reason,
                );
                let _ = observer.send(Event::Done {
                    index: run.index,
                    reason: result.stop_reason,
                    n_prompt: run.prompt.len(),
                    n_cached,
                    n_generated: result.tokens.len(),
                });
                continue;
            }
            Ok(Err(_)) if observer.stopped() => {
                // Everything evaluated so far stays in the session for the next job.
                shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
                eprintln!(
                    "slot {id}: request cancelled after {} tokens; slot freed",
                    observer.tokens.len()
                );
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(panic) => panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a generation thread panicked".into()),
        };
        session.reset();
        shared.metrics.internal_errors.fetch_add(1, Ordering::Relaxed);
        eprintln!("slot {id}: internal error: {failure}; slot reset");
        let _ = job.events.send(Event::Failed(failure));
        return;
    }
}

struct Observer<'a> {
    job: &'a Job,
    index: usize,
    shared: &'a Shared,
    /// Bytes of an incomplete UTF-8 character, held until the rest arrives.
    pending: Vec<u8>,
    tokens: Vec<u32>,
}

impl Observer<'_> {
    fn stopped(&self) -> bool {
        self.job.abandoned() || self.shared.stop_all.load(Ordering::Relaxed)
    }

    fn send(&self, event: Event) -> Result<(), String> {
        if matches!(&event, Event::Text { text, .. } if text.is_empty()) {
            return Ok(());
        }
        self.job
            .events
            .send(event)
            .map_err(|_| "the client went away".to_string())
    }
}

impl GenerationObserver for Observer<'_> {
    fn cancelled(&self) -> bool {
        self.stopped()
    }

    fn on_token(&mut self, token: u32, logits: &[f32]) -> Result<(), String> {
        if self.stopped() {
            return Err("cancelled".into());
        }
        if self.tokens.is_empty() && self.index == self.job.runs[0].index {
            self.shared.metrics.record_ttft(self.job.arrived.elapsed());
        }
        self.tokens.push(token);
        if let Some(top) = self.job.logprobs {
            let logprob = logprobs(logits, token, top);
            self.send(Event::Logprob {
                index: self.index,
                logprob,
            })?;
        }
        Ok(())
    }

    fn on_text(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.pending.extend_from_slice(bytes);
        let text = take_utf8(&mut self.pending);
        self.send(Event::Text {
            index: self.index,
            text,
        })
    }
}

/// The complete characters at the front of `bytes` (invalid bytes become U+FFFD); an
/// incomplete character at the end stays in `bytes`.
fn take_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(bytes) {
            Ok(s) => {
                out.push_str(s);
                bytes.clear();
                return out;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&bytes[..valid]).expect("checked"));
                match e.error_len() {
                    None => {
                        bytes.drain(..valid);
                        return out;
                    }
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        bytes.drain(..valid + bad);
                    }
                }
            }
        }
    }
}

/// The chosen token's log-probability under the model's distribution (the softmax of the raw
/// logits, before penalties and temperature, as OpenAI reports them), and the `top` most likely
/// tokens.
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() == top && l <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprob {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: best.into_iter().map(|(i, l)| (i, lp(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_probabilities_are_a_log_softmax_and_the_top_list_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let r = logprobs(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((r.logprob as f64 - (2.0 - z.ln())).abs() < 1e-5);
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 3, 2]);
    }

    #[test]
    fn utf8_split_across_pieces_is_held_back_until_complete() {
        let mut pending = "é".as_bytes()[..1].to_vec();
        assert_eq!(take_utf8(&mut pending), "");
        pending.push("é".as_bytes()[1]);
        pending.extend_from_slice(b"a\xffb");
        assert_eq!(take_utf8(&mut pending), "éa\u{FFFD}b");
        assert!(pending.is_empty());
    }

    #[test]
    fn the_common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
