//! Slots and the scheduler (continuous batching): one engine loop owns the one [`Session`],
//! whose KV sequences `0..n_slots` are the slots, over the shared [`Model`] (weights, backends
//! and their thread pool). Each step is one forward pass over the next token of every
//! generating slot (and the proposals of the slots that draft) plus chunks of the prompts being
//! read (at most `--batch-size` tokens, [`STEP_TOKENS`] by default), so the weights are read
//! once per step for all the streams, a request alone runs on every thread, and a long prompt
//! does not stall the streams already running. Every slot samples
//! from its own row; a row's logits do not depend on the other rows of its batch, so each
//! stream gets the tokens it would get alone.
//!
//! Jobs wait in a FIFO queue (refused, with `--queue-max`, once that many wait for a slot
//! while every slot is busy); a free slot takes the oldest — by memory (the default), only once
//! the cells it needs fit ([`prompt_cache`]) — and among free slots the one whose
//! cached tokens share the longest prefix with its prompt. A slot keeps its KV cells after a
//! job (`Session::reuse_prefix`), so a follow-up that extends the same conversation prefills
//! only its new tokens; a prompt whose longest cached start is another slot's shares those
//! cells. A shared prefix counts only where the job keeps at least half of what
//! the slot holds; otherwise (a new conversation that shares only a system prompt) the job
//! takes the least recently used idle slot, empty ones first, instead of wiping the cells of
//! a conversation that may come back (llama-server's slot-similarity rule, on the slot's
//! side). Tokens flow back to the HTTP side over a channel; a job whose receiver is gone, whose
//! cancel flag is set or whose client hung up stops at the next step and frees the slot. A
//! failure or a panic inside a pass is reported to the jobs of that pass as [`Event::Failed`],
//! their slots' cells are cleared, and the loop serves on.
//!
//! This file must not parse requests or shape responses: it runs token lists and reports
//! events.

mod prompt_cache;

use super::metrics::Metrics;
use super::peer::Peer;
use crate::engine::{
    Batch, DraftOptions, Drafter, EngineError, GenerateOptions, GenerationStats, HostCache, Model, Sequence, Session,
    StopReason,
};
use prompt_cache::{Wait, REPLY_RESERVE};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};
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
    /// Report them after the sampler chain (the distribution the token was drawn from) rather
    /// than the model's own (llama-server's `post_sampling_probs`).
    pub post_sampling: bool,
    /// Run on this slot only (llama-server's `id_slot`), waiting for it to be free.
    pub id_slot: Option<usize>,
    /// Reuse the slot's cached prefix of the prompt (llama-server's `cache_prompt`); without
    /// it the slot's cells are cleared and the whole prompt is read.
    pub cache_prompt: bool,
    /// Report the prompt's progress as its chunks are read (`return_progress`).
    pub progress: bool,
    /// Send the run's timings with every piece of text (`timings_per_token`).
    pub timings_per_token: bool,
    /// The request's number among all the server has taken, shown by `/slots` as `id_task`.
    pub task: u64,
    /// The request's settings as `/slots` shows them (opaque here).
    pub settings: Arc<serde_json::Value>,
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

/// One run's counts and times, llama-server's `timings`: the prompt tokens read and found
/// cached, how long reading took (from the slot's start to the first token), the tokens
/// generated and how long from the first to the last, and the speculative proposals.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RunTimings {
    pub n_prompt: usize,
    pub n_cached: usize,
    pub prompt: Duration,
    pub n_generated: usize,
    pub gen: Duration,
    pub n_drafted: usize,
    pub n_accepted: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A sampled token's log-probability (only when the job asked for them), sent before the
    /// text the token completes.
    Logprob { index: usize, logprob: TokenLogprob },
    /// Generated text, whole UTF-8 characters only, with the tokens sampled since the last
    /// text (those whose text this completes), and the run's timings so far when the job
    /// asked for them with every piece.
    Text {
        index: usize,
        text: String,
        tokens: Vec<u32>,
        /// The slot generating it.
        slot: usize,
        timings: Option<RunTimings>,
    },
    /// How much of the prompt is in the slot's cells (only when the job asked): sent as the
    /// run starts and after each chunk of the prompt is read.
    Progress {
        index: usize,
        total: usize,
        cache: usize,
        processed: usize,
        timings: RunTimings,
    },
    /// A run ended.
    Done {
        index: usize,
        reason: StopReason,
        n_prompt: usize,
        n_cached: usize,
        n_generated: usize,
        /// The slot that ran it.
        slot: usize,
        /// Every token generated.
        tokens: Vec<u32>,
        /// Cells the slot holds after the run (prompt and generated tokens).
        n_cells: usize,
        timings: RunTimings,
        /// The stop string that ended it, else empty.
        stopping_word: String,
    },
    /// The job failed inside the server; no more events follow.
    Failed(String),
    /// The job's own grammar could not go on (past llguidance's limits, which some grammars
    /// reach only after their first token): the request's fault, not the server's. No more
    /// events follow.
    Refused(String),
}

/// What `/slots` shows of one slot: whether it is generating, and its current or last job.
#[derive(Debug, Clone, Default)]
pub struct SlotView {
    pub processing: bool,
    /// The job's `task` number; `None` before the slot's first job.
    pub task: Option<u64>,
    pub settings: Option<Arc<serde_json::Value>>,
    /// The run's prompt.
    pub prompt: Arc<Vec<u32>>,
    pub n_cached: usize,
    pub n_prompt_processed: usize,
    pub n_decoded: usize,
    /// Tokens the run may still generate; -1 when idle.
    pub n_remain: i64,
    pub has_next_token: bool,
    pub has_new_line: bool,
    /// The run's text so far.
    pub generated: String,
}

struct Shared {
    /// Jobs waiting for a slot, in arrival order.
    queue: Mutex<VecDeque<Job>>,
    /// Each slot's state, for `/slots`.
    views: Mutex<Vec<SlotView>>,
    /// Wakes the engine loop when a job arrives or the server stops.
    wake: Condvar,
    metrics: Arc<Metrics>,
    /// The model the session runs (its tokenizer turns tokens back into text).
    model: Arc<Model>,
    /// Set at shutdown: every generation stops at its next step.
    stop_all: AtomicBool,
    /// Set when the model is unloaded: no job is taken any more, and the engine loop ends once
    /// its slots are idle, dropping the session.
    closed: AtomicBool,
    n_slots: usize,
    /// Jobs that may wait for a slot; `None`: any number.
    queue_max: Option<usize>,
    /// The slots draft (speculative decoding).
    speculative: bool,
    /// The oldest queued job waits for KV room, not for a slot: every job queued now waits,
    /// idle slots or not (for `--queue-max`).
    waiting_for_room: AtomicBool,
}

/// A job refused because every slot is busy and `--queue-max` jobs already wait.
#[derive(Debug)]
pub struct QueueFull;

#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
    /// The engine loop's thread, joined when the model is unloaded.
    engine: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

/// How many leading tokens `held` (what a slot's cells hold, in position order) shares with `b`.
fn common_prefix(held: impl Iterator<Item = u32>, b: &[u32]) -> usize {
    held.zip(b).take_while(|(x, y)| x == *y).count()
}

/// How much a job reuses of a slot that holds `held` tokens, `shared` of them a prefix of its
/// prompt: the prefix when it keeps at least half of them (the same conversation, or a branch of
/// it), else nothing, so that sharing a system prompt does not outbid an empty slot.
fn reuse(shared: usize, held: usize) -> usize {
    if shared * 2 >= held {
        shared
    } else {
        0
    }
}

/// Whether a job submitted behind `queued` others, with `idle` slots free, is refused under
/// `--queue-max max`: only a job that would wait can be, so with `max` 0 one that an idle slot
/// takes at once still gets in.
fn refuses(queued: usize, idle: usize, max: usize) -> bool {
    queued >= idle && queued - idle >= max
}

/// Tokens one forward pass takes at most by default (`--batch-size`): every generating slot's
/// next token, and prompt chunks up to the rest (llama.cpp's `n_batch`), so a long prompt
/// shares the passes with the streams already running instead of stalling them.
pub const STEP_TOKENS: usize = 512;

/// How the engine loop runs its slots.
pub struct SlotConfig {
    /// Slots: KV sequences `0..n_slots` of the session, at most [`crate::engine::MAX_SEQUENCES`].
    pub n_slots: usize,
    /// Positions each slot may hold.
    pub n_ctx: usize,
    /// The slots share the session's whole cache (`--kv-unified`, the default): a job is
    /// admitted while the cells it needs fit, cached prefixes are evicted least recently used
    /// first, and a running job is preempted (and resumed later, bit for bit) when the cache
    /// runs out. Otherwise each slot has its own `n_ctx` cells, and a free slot always admits.
    pub by_memory: bool,
    /// The host tier of the prompt cache (`--cache-ram`), in bytes: idle slots' cached tokens
    /// are copied there before their cells are evicted, and restored into a slot whose prompt
    /// starts with them. `None`: none.
    pub cache_ram: Option<usize>,
    /// Tokens a pass takes at most (at least one per slot).
    pub step_tokens: usize,
    /// Speculative decoding: one drafter per slot, and how many proposals a step checks.
    pub drafters: Option<(Vec<Box<dyn Drafter + Send>>, DraftOptions)>,
    /// Jobs that may wait while every slot is busy (`--queue-max`); `None`: any number.
    pub queue_max: Option<usize>,
}

impl Scheduler {
    /// Starts the engine loop over `session`, whose sequences `0..n_slots` are the slots, each
    /// allowed `n_ctx` positions.
    pub fn start(
        session: Session,
        config: SlotConfig,
        model: Arc<Model>,
        metrics: Arc<Metrics>,
    ) -> std::io::Result<Self> {
        metrics.slots_total.store(config.n_slots, Ordering::Relaxed);
        *metrics.slot_processing.lock().unwrap_or_else(PoisonError::into_inner) = vec![false; config.n_slots];
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            views: Mutex::new(vec![
                SlotView {
                    n_remain: -1,
                    ..Default::default()
                };
                config.n_slots
            ]),
            wake: Condvar::new(),
            metrics,
            model,
            stop_all: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            n_slots: config.n_slots,
            queue_max: config.queue_max,
            speculative: config.drafters.is_some(),
            waiting_for_room: AtomicBool::new(false),
        });
        let engine = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("engine".into())
            .stack_size(super::REQUEST_STACK_BYTES)
            .spawn(move || Engine::new(session, config, &engine).run())?;
        Ok(Scheduler {
            shared,
            engine: Arc::new(Mutex::new(Some(thread))),
        })
    }

    /// Ends the engine loop once the jobs it holds are done (a model being unloaded): queued
    /// jobs still run, new ones are refused. Blocks until the loop has ended and dropped its
    /// session.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Relaxed);
        self.shared.wake.notify_one();
        let thread = self.engine.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Job>> {
        self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `job`; the engine loop gives it a slot as soon as one is free. Refused when
    /// `--queue-max` jobs already wait for one.
    pub fn submit(&self, job: Job) -> Result<(), QueueFull> {
        let mut queue = self.queue();
        if self.full_with(queue.len()) || self.shared.closed.load(Ordering::Relaxed) {
            return Err(QueueFull);
        }
        queue.push_back(job);
        self.shared.metrics.queue_depth.store(queue.len(), Ordering::Relaxed);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Whether a job submitted now would be refused.
    pub fn full(&self) -> bool {
        let queue = self.queue();
        self.full_with(queue.len())
    }

    /// Whether `queued` jobs fill the queue. A queued job that an idle slot is about to take
    /// (the engine loop has not woken yet) is not waiting, so it does not count: with
    /// `--n-slots 1 --queue-max 1`, a request arriving at an idle server and the one after it
    /// are both taken. The busy count only falls once a slot is released, so this errs towards
    /// refusing for the moment between a job's end and its slot's release. While the oldest job
    /// waits for KV room, every queued job waits, idle slots or not.
    fn full_with(&self, queued: usize) -> bool {
        let Some(max) = self.shared.queue_max else {
            return false;
        };
        let busy = self.shared.metrics.slots_busy.load(Ordering::Relaxed);
        let idle = match self.shared.waiting_for_room.load(Ordering::Relaxed) {
            true => 0,
            false => self.shared.n_slots.saturating_sub(busy),
        };
        refuses(queued, idle, max)
    }

    /// Whether the slots draft (speculative decoding).
    pub fn speculative(&self) -> bool {
        self.shared.speculative
    }

    /// Each slot's state, slot 0 first.
    pub fn slot_views(&self) -> Vec<SlotView> {
        self.shared.views.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops every generation at its next step and drops every queued job (their clients see
    /// the stream end).
    pub fn cancel_all(&self) {
        self.shared.stop_all.store(true, Ordering::Relaxed);
        let mut queue = self.queue();
        queue.clear();
        self.shared.metrics.queue_depth.store(0, Ordering::Relaxed);
        self.shared.wake.notify_one();
    }
}

/// A slot's job in progress: which run (choice) it is on, that run's [`Sequence`], and how far
/// its prompt has been read.
struct Active<'t> {
    /// Shared by the slots that run the job's choices in parallel; the response's channel
    /// closes when the last of them lets go.
    job: Arc<Job>,
    /// The job's next run not yet started by any slot.
    next_run: Arc<AtomicUsize>,
    run: usize,
    /// A run waiting for another slot to read the start of its prompt, to share those cells
    /// rather than read them too: a choice started beside the job's first, or a prompt that
    /// starts as one being read does (16 agents sending one system prompt at once read it once).
    wait_for: Option<Wait>,
    seq: Sequence<'t>,
    /// Prompt tokens already in the slot's KV cells.
    next_prompt: usize,
    /// Tokens of the prompt found cached when the run started.
    n_cached: usize,
    /// The last sampled token, to be evaluated in the next pass.
    pending: Option<u32>,
    /// Bytes of an incomplete UTF-8 character, held until the rest arrives.
    utf8: Vec<u8>,
    n_generated: usize,
    started: Instant,
    prompt_time: Duration,
    gen_started: Option<Instant>,
    /// The proposals this step checks, while they stand.
    check: Option<Check>,
    /// Proposals checked, and kept, over the run.
    n_drafted: usize,
    n_accepted: usize,
    /// Tokens sampled whose text has not gone out yet.
    unsent: Vec<u32>,
    /// The slot the run is on.
    slot: usize,
    /// A chunk of the prompt went into this step's pass: its progress is reported after it.
    read_chunk: bool,
    /// When the job was admitted (the engine's clock): the job admitted last is preempted first.
    admitted: u64,
    /// After a preemption: the tokens to read again before the pending token (the prompt and
    /// what was generated before it), read as a prompt whose last row needs no logits.
    replay: Vec<u32>,
}

impl Active<'_> {
    /// What the slot reads before it generates: the prompt, or after a preemption the replay.
    fn to_read(&self) -> &[u32] {
        if self.replay.is_empty() {
            &self.job.runs[self.run].prompt
        } else {
            &self.replay
        }
    }

    /// Cells the run still expects to take: the rest of what it reads, and its reply up to
    /// [`REPLY_RESERVE`].
    fn outstanding(&self) -> usize {
        let left = self.job.runs[self.run].max_tokens.saturating_sub(self.n_generated);
        let read = self.next_prompt.max(self.wait_for.map_or(0, |w| w.len));
        self.to_read().len().saturating_sub(read) + left.min(REPLY_RESERVE)
    }

    /// The run's timings now: the prompt's time runs until the first token is sampled, the
    /// generation's from then on.
    fn timings(&self) -> RunTimings {
        let prompt_len = self.job.runs[self.run].prompt.len();
        RunTimings {
            n_prompt: self.next_prompt.min(prompt_len).saturating_sub(self.n_cached),
            n_cached: self.n_cached,
            prompt: match self.gen_started {
                Some(_) => self.prompt_time,
                None => self.started.elapsed(),
            },
            n_generated: self.n_generated,
            gen: self.gen_started.map_or(Duration::ZERO, |t| t.elapsed()),
            n_drafted: self.n_drafted,
            n_accepted: self.n_accepted,
        }
    }

    /// Whether the run's next token is pending (its prompt, or replay, read).
    fn generating(&self) -> bool {
        self.pending.is_some() && self.next_prompt >= self.to_read().len()
    }

    /// The run's prompt progress as an event.
    fn progress(&self, timings: RunTimings) -> Event {
        let prompt_len = self.job.runs[self.run].prompt.len();
        Event::Progress {
            index: self.job.runs[self.run].index,
            total: prompt_len,
            cache: self.n_cached,
            processed: self.next_prompt.min(prompt_len),
            timings,
        }
    }
}

/// A step's proposals for one slot: batch rows after the pending token's, at the positions
/// after `pos` (the pending token's).
struct Check {
    proposals: Vec<u32>,
    pos: usize,
    /// Proposals kept so far: the next row to sample is this one's.
    kept: usize,
}

/// The one loop that owns the session: every step, one forward pass over the next token of
/// every generating slot and chunks of the prompts being read.
struct Engine<'s> {
    session: Session,
    n_ctx: usize,
    /// Admission by memory, eviction and preemption ([`SlotConfig::by_memory`]).
    by_memory: bool,
    /// Runs preempted for memory, oldest admission first: they take free slots before any
    /// queued job.
    preempted: Vec<Active<'s>>,
    /// The host tier (`--cache-ram`).
    host: Option<HostCache>,
    /// Per slot: its cached tokens are in the host tier already (since its last job began).
    saved: Vec<bool>,
    /// Tokens a pass takes at most (at least one per slot).
    step_tokens: usize,
    shared: &'s Shared,
    slots: Vec<Option<Active<'s>>>,
    batch: Batch,
    /// Per batch row that wants logits: the row, its slot, and its place among the slot's
    /// rows of the step (0, then one per proposal).
    rows: Vec<(usize, usize, usize)>,
    /// Each slot's drafter (none without speculative decoding, or after it panicked).
    drafters: Vec<Option<Box<dyn Drafter + Send>>>,
    draft: DraftOptions,
    /// When each slot last took or ended a job, on the engine's clock (0: never); the least
    /// recent idle slot is evicted first, and taken first by a job that shares none of it.
    last_used: Vec<u64>,
    /// Counts job starts and ends.
    clock: u64,
}

impl<'s> Engine<'s> {
    fn new(session: Session, config: SlotConfig, shared: &'s Shared) -> Self {
        let (drafters, draft) = config.drafters.unwrap_or((Vec::new(), DraftOptions { max: 0, min: 0 }));
        Engine {
            session,
            n_ctx: config.n_ctx,
            by_memory: config.by_memory,
            preempted: Vec::new(),
            host: config.cache_ram.map(HostCache::new),
            saved: vec![false; config.n_slots],
            step_tokens: config.step_tokens.max(config.n_slots),
            shared,
            slots: (0..config.n_slots).map(|_| None).collect(),
            batch: Batch::new(),
            rows: Vec::new(),
            drafters: drafters.into_iter().map(Some).collect(),
            draft,
            last_used: vec![0; config.n_slots],
            clock: 0,
        }
    }

    fn metrics(&self) -> &'s Metrics {
        &self.shared.metrics
    }

    fn run(mut self) {
        loop {
            if !self.take_jobs() {
                return;
            }
            self.step();
        }
    }

    /// Gives queued jobs (oldest first) to idle slots, preferring the slot whose cached tokens
    /// share the longest prefix with the job's prompt; waits while there is nothing to do.
    /// Preempted runs come back first. By memory, a job starts only while the cells it needs
    /// fit ([`Engine::fits`]); the jobs behind it wait their turn. `false` when the process is
    /// going away.
    fn take_jobs(&mut self) -> bool {
        self.resume_preempted();
        let mut queue = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            // The oldest job that can start: one pinned to a busy slot waits for it while the
            // jobs behind it take the other slots.
            let mut next = 0;
            let mut waiting_for_room = !self.preempted.is_empty();
            while self.preempted.is_empty() && self.slots.iter().any(Option::is_none) && next < queue.len() {
                if queue[next]
                    .id_slot
                    .is_some_and(|s| self.slots.get(s).is_none_or(Option::is_some))
                {
                    next += 1;
                    continue;
                }
                if queue[next].abandoned() || self.shared.stop_all.load(Ordering::Relaxed) {
                    let job = queue.remove(next).expect("in the queue");
                    eprintln!(
                        "request cancelled before it started, after {:.3} s in the queue",
                        job.arrived.elapsed().as_secs_f64()
                    );
                    self.metrics().cancelled.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let job = &queue[next];
                // Read in place: copying each idle slot's tokens for every job would cost a context
                // of tokens per slot.
                let prompt: &[u32] = job.runs.first().map_or(&[], |r| &r.prompt);
                let kv = self.session.kv();
                let id = job.id_slot.unwrap_or_else(|| {
                    (0..self.slots.len())
                        .filter(|&id| self.slots[id].is_none())
                        .max_by_key(|&id| {
                            let held = kv.seq_cells(id).len();
                            (
                                reuse(common_prefix(kv.seq_tokens(id), prompt), held),
                                // An empty slot before one whose cached tokens may come back.
                                held == 0,
                                std::cmp::Reverse(self.last_used[id]),
                                std::cmp::Reverse(id),
                            )
                        })
                        .expect("a slot is idle")
                });
                let reply = job.runs.first().map_or(0, |r| r.max_tokens).min(REPLY_RESERVE);
                if !self.fits(id, prompt, job.cache_prompt, reply) {
                    waiting_for_room = true;
                    break;
                }
                let job = queue.remove(next).expect("in the queue");
                self.clock += 1;
                self.last_used[id] = self.clock;
                let (job, next_run) = (Arc::new(job), Arc::new(AtomicUsize::new(1)));
                self.begin(id, Arc::clone(&job), Arc::clone(&next_run), 0, None);
                self.fan_out(id, &job, &next_run);
            }
            self.metrics().queue_depth.store(queue.len(), Ordering::Relaxed);
            self.shared.waiting_for_room.store(waiting_for_room, Ordering::Relaxed);
            if self.slots.iter().any(Option::is_some) || !self.preempted.is_empty() {
                return true;
            }
            if self.shared.closed.load(Ordering::Relaxed) && queue.is_empty() {
                return false;
            }
            queue = self.shared.wake.wait(queue).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Starts run `run` of `job` on slot `id`: the slot keeps the longest prefix of the prompt
    /// it holds; the rest is read in the next steps.
    /// Runs more of the job's choices at once on free slots, when they continue the same
    /// prompt as the one slot `leader` runs (`n > 1`): they share its prompt cells.
    fn fan_out(&mut self, leader: usize, job: &Arc<Job>, next_run: &Arc<AtomicUsize>) {
        if !matches!(&self.slots[leader], Some(a) if Arc::ptr_eq(&a.job, job)) {
            return;
        }
        while let Some(id) = (0..self.slots.len()).find(|&id| self.slots[id].is_none()) {
            let run = next_run.load(Ordering::Relaxed);
            if run >= job.runs.len() || job.runs[run].prompt != job.runs[0].prompt {
                return;
            }
            next_run.store(run + 1, Ordering::Relaxed);
            let wait = Wait {
                slot: leader,
                admitted: self.slots[leader].as_ref().map_or(0, |a| a.admitted),
                len: job.runs[0].prompt.len().saturating_sub(1),
            };
            self.begin(id, Arc::clone(job), Arc::clone(next_run), run, Some(wait));
        }
    }

    fn begin(&mut self, id: usize, job: Arc<Job>, next_run: Arc<AtomicUsize>, run: usize, wait_for: Option<Wait>) {
        self.set_processing(id, true);
        if job.fault {
            self.fail(id, job, "fault injected on purpose (MINFER_SERVE_FAULT)".into());
            return;
        }
        if job.abandoned() || self.shared.stop_all.load(Ordering::Relaxed) {
            eprintln!("slot {id}: request cancelled before choice {}", job.runs[run].index);
            self.metrics().cancelled.fetch_add(1, Ordering::Relaxed);
            self.release(id, job);
            return;
        }
        let r = &job.runs[run];
        // What the slot held beyond the prompt's start is dropped: a cached conversation
        // evicted by count of slots rather than of cells, copied to the host tier first.
        let kept = self.session.kv().prefix_len(id, &r.prompt);
        if self.session.kv().seq_cells(id).len() > kept {
            self.save_to_host(id);
        }
        let free_before = self.session.kv().n_free();
        let n_cached = match wait_for {
            _ if !job.cache_prompt => {
                let _ = self.session.seq_rm(Some(id), 0, i32::MAX);
                0
            }
            // A choice beside the first shares the first's prompt cells once they are read.
            Some(_) => {
                let _ = self.session.seq_rm(Some(id), 0, i32::MAX);
                0
            }
            // The longest prefix of the prompt any slot holds (this one's own conversation, or a
            // system prompt another slot read) is shared, not read again.
            None => self.share_cached(id, &r.prompt),
        };
        let freed = self.session.kv().n_free().saturating_sub(free_before);
        self.metrics()
            .cache_evicted_cells
            .fetch_add(freed as u64, Ordering::Relaxed);
        let mut options = job.options.clone();
        options.sampling.seed = r.seed;
        options.max_tokens = r.max_tokens;
        let tokenizer = self.shared.model.tokenizer();
        match Sequence::new(tokenizer, &r.prompt, &options) {
            Ok(seq) => {
                self.update_view(id, |v| {
                    *v = SlotView {
                        processing: true,
                        task: Some(job.task),
                        settings: Some(Arc::clone(&job.settings)),
                        prompt: Arc::new(r.prompt.clone()),
                        n_cached,
                        n_prompt_processed: 0,
                        n_decoded: 0,
                        n_remain: r.max_tokens.min(i64::MAX as usize) as i64,
                        has_next_token: true,
                        has_new_line: false,
                        generated: String::new(),
                    }
                });
                self.slots[id] = Some(Active {
                    job,
                    next_run,
                    run,
                    wait_for,
                    seq,
                    next_prompt: n_cached,
                    n_cached,
                    pending: None,
                    utf8: Vec::new(),
                    n_generated: 0,
                    started: Instant::now(),
                    prompt_time: Duration::ZERO,
                    gen_started: None,
                    check: None,
                    n_drafted: 0,
                    n_accepted: 0,
                    unsent: Vec::new(),
                    slot: id,
                    read_chunk: false,
                    admitted: self.clock,
                    replay: Vec::new(),
                });
                self.saved[id] = false;
                self.restore_from_host(id);
                if let Some(active) = self.slots[id]
                    .as_ref()
                    .filter(|a| a.job.progress && a.wait_for.is_none())
                {
                    // Before any of the prompt is read: nothing processed, no time spent.
                    let _ = active.job.events.send(active.progress(RunTimings {
                        n_cached: active.n_cached,
                        ..Default::default()
                    }));
                }
                let job = Arc::clone(&self.slots[id].as_ref().expect("begun").job);
                if let Some(wait) = self.reader_ahead(id, &job.runs[run].prompt) {
                    self.slots[id].as_mut().expect("begun").wait_for = Some(wait);
                }
            }
            Err(e) => self.fail(id, job, e.to_string()),
        }
    }

    /// Frees slot `id` (its KV stays, for the next prompt that shares it). The job, and with it
    /// the response's channel, is dropped only after the slot counts as free, so a client that
    /// has seen its response complete sees a free slot.
    fn release(&mut self, id: usize, job: Arc<Job>) {
        self.slots[id] = None;
        self.clock += 1;
        self.last_used[id] = self.clock;
        self.update_view(id, |v| {
            v.processing = false;
            v.has_next_token = false;
            // The finished job's budget is no idle slot's.
            v.n_remain = -1;
            v.n_decoded = 0;
        });
        self.set_processing(id, false);
        drop(job);
    }

    /// Changes what `/slots` shows of slot `id`.
    fn update_view(&self, id: usize, f: impl FnOnce(&mut SlotView)) {
        let mut views = self.shared.views.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(view) = views.get_mut(id) {
            f(view);
        }
    }

    /// Marks slot `id` as generating or idle: its flag for `/slots`, and the busy count
    /// (`/health`, `/metrics`) when the flag changes.
    fn set_processing(&self, id: usize, on: bool) {
        let metrics = self.metrics();
        let mut state = metrics.slot_processing.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = state.get_mut(id).filter(|s| **s != on) {
            *s = on;
            if on {
                let busy = metrics.slots_busy.fetch_add(1, Ordering::Relaxed) + 1;
                metrics.slots_busy_max.fetch_max(busy, Ordering::Relaxed);
            } else {
                metrics.slots_busy.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The job failed inside the server: it is told, its slot's cells are cleared, and the
    /// slot serves on.
    fn fail(&mut self, id: usize, job: Arc<Job>, failure: String) {
        self.metrics().internal_errors.fetch_add(1, Ordering::Relaxed);
        eprintln!("slot {id}: internal error: {failure}; slot reset");
        self.end_early(id, job, Event::Failed(failure));
    }

    /// The job's grammar could not go on: as [`Engine::fail`], but not an internal error.
    fn refuse(&mut self, id: usize, job: Arc<Job>, reason: String) {
        eprintln!("slot {id}: the request's grammar stopped: {reason}; slot reset");
        self.end_early(id, job, Event::Refused(reason));
    }

    /// Ends a job before its runs are done: its slot's cells are cleared, `last` is its last
    /// event, and the slot serves on.
    fn end_early(&mut self, id: usize, job: Arc<Job>, last: Event) {
        let _ = self.session.seq_rm(Some(id), 0, i32::MAX);
        let _ = job.events.send(last);
        self.release(id, job);
    }

    /// One forward pass: cancelled slots are freed, every generating slot adds its next token,
    /// prompts add chunks up to the step's token budget; then each row with logits is sampled.
    fn step(&mut self) {
        self.batch.clear();
        self.rows.clear();
        let stop_all = self.shared.stop_all.load(Ordering::Relaxed);
        for id in 0..self.slots.len() {
            let Some(active) = &self.slots[id] else { continue };
            if stop_all || active.job.abandoned() {
                let active = self.slots[id].take().expect("checked");
                eprintln!(
                    "slot {id}: request cancelled after {} tokens; slot freed",
                    active.n_generated
                );
                self.metrics().cancelled.fetch_add(1, Ordering::Relaxed);
                self.release(id, active.job);
            }
        }
        // Room for every generating slot's next token: cached prefixes give way first, then
        // the runs admitted last.
        let generating = |slots: &[Option<Active>]| slots.iter().flatten().filter(|a| a.generating()).count();
        while self.by_memory && !self.make_room(generating(&self.slots)) && self.preempt() {}
        // Proposals take what the generating slots' own tokens leave of the step (and of the
        // free cells).
        let n_pending = generating(&self.slots);
        let mut spare = self.step_tokens.saturating_sub(n_pending);
        if self.by_memory {
            spare = spare.min(self.session.kv().n_free().saturating_sub(n_pending));
        }
        for id in 0..self.slots.len() {
            let Some(active) = &self.slots[id] else { continue };
            if !active.generating() {
                continue;
            }
            if let Some(token) = active.pending {
                let pos = self.session.kv().seq_pos_max(id).map_or(0, |p| p as usize + 1);
                // Without a free cell (one run fills the whole cache) the run ends as one that
                // fills its context does.
                if pos >= self.n_ctx || self.session.kv().n_free() <= self.batch.len() {
                    self.finish_context_full(id);
                    continue;
                }
                self.propose(id, pos, spare);
                self.rows.push((self.batch.len(), id, 0));
                self.batch.add(token, pos as i32, id, true);
                let check = self.slots[id].as_ref().and_then(|a| a.check.as_ref());
                for (k, &proposal) in check.map_or(&[][..], |c| &c.proposals).iter().enumerate() {
                    spare -= 1;
                    self.rows.push((self.batch.len(), id, k + 1));
                    self.batch.add(proposal, (pos + 1 + k) as i32, id, true);
                }
            }
        }
        self.share_prompts();
        for id in 0..self.slots.len() {
            let budget = self.step_tokens.saturating_sub(self.batch.len());
            if budget == 0 {
                break;
            }
            let Some(active) = &self.slots[id] else { continue };
            if active.wait_for.is_some() || active.next_prompt >= active.to_read().len() {
                continue;
            }
            let wanted = budget.min(active.to_read().len() - active.next_prompt);
            let budget = match self.by_memory {
                true => {
                    self.make_room(self.batch.len() + wanted);
                    wanted.min(self.session.kv().n_free().saturating_sub(self.batch.len()))
                }
                false => wanted,
            };
            if budget == 0 {
                break;
            }
            let active = self.slots[id].as_mut().expect("checked");
            let replay = !active.replay.is_empty();
            active.read_chunk = active.job.progress && !replay;
            let tokens = active.to_read();
            let end = tokens.len().min(active.next_prompt + budget);
            for pos in active.next_prompt..end {
                // A replay's last row needs no logits: the pending token comes after it.
                let last = pos + 1 == tokens.len() && !replay;
                if last {
                    self.rows.push((self.batch.len(), id, 0));
                }
                self.batch.add(tokens[pos], pos as i32, id, last);
            }
            let done = end == tokens.len();
            let active = self.slots[id].as_mut().expect("checked");
            active.next_prompt = end;
            if replay && done {
                active.replay = Vec::new();
            }
        }
        if self.batch.is_empty() {
            // Prompts that cannot get a cell: a later run gives way, or (alone) ends.
            if self.by_memory && !self.preempt() {
                let stuck =
                    (0..self.slots.len()).find(|&s| self.slots[s].as_ref().is_some_and(|a| a.wait_for.is_none()));
                if let Some(id) = stuck.filter(|_| self.session.kv().n_free() == 0) {
                    self.finish_context_full(id);
                }
            }
            return;
        }
        // The grammars' next masks are computed on a second thread while the pass runs. A
        // failure there is met again, and reported, when the slot samples.
        let (session, batch) = (&mut self.session, &self.batch);
        let mut constrained: Vec<_> = self
            .slots
            .iter_mut()
            .flatten()
            .filter(|active| active.seq.is_constrained())
            .collect();
        let decoded = std::thread::scope(|scope| {
            if !constrained.is_empty() {
                let masks = move || {
                    for active in &mut constrained {
                        let _ = catch_unwind(AssertUnwindSafe(|| active.seq.prepare()));
                    }
                };
                // Without a thread for it, the masks are computed when the slots sample.
                let _ = std::thread::Builder::new()
                    .stack_size(super::REQUEST_STACK_BYTES)
                    .spawn_scoped(scope, masks);
            }
            catch_unwind(AssertUnwindSafe(|| session.decode(batch)))
        });
        let failure = match decoded {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(panic) => Some(
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "the engine panicked".into()),
            ),
        };
        if let Some(failure) = failure {
            // Every job of the pass fails; their slots start over.
            let ids: Vec<usize> = self.batch.seq_ids().to_vec();
            for id in ids {
                if let Some(active) = self.slots[id].take() {
                    self.fail(id, active.job, failure.clone());
                }
            }
            return;
        }
        let metrics = self.metrics();
        metrics.n_decode.fetch_add(1, Ordering::Relaxed);
        let busy = self.slots.iter().filter(|s| s.is_some()).count();
        metrics.n_busy_slots.fetch_add(busy as u64, Ordering::Relaxed);
        // The prompts' progress, before the first token of a prompt read in full.
        for active in self.slots.iter_mut().flatten().filter(|a| a.read_chunk) {
            active.read_chunk = false;
            let _ = active.job.events.send(active.progress(active.timings()));
        }
        let rows = std::mem::take(&mut self.rows);
        for &(row, id, k) in &rows {
            // A proposal's row counts only while every proposal before it was kept.
            let wanted = k == 0
                || self.slots[id]
                    .as_ref()
                    .and_then(|a| a.check.as_ref())
                    .is_some_and(|c| c.kept == k);
            if wanted {
                self.sample(row, id);
            }
        }
        self.rows = rows;
    }

    /// Sets slot `id`'s proposals to check after its pending token at `pos` (its `check`), at
    /// most `spare`: what its drafter offers within the context, the tokens the run may still
    /// make and `--draft-max`; none below `--draft-min`. Drafting is optional: a drafter that fails
    /// proposes nothing this step (it resynchronises with the slot's tokens on its next call),
    /// and one that panics is dropped, the slot decoding plainly from then on.
    fn propose(&mut self, id: usize, pos: usize, spare: usize) {
        let active = self.slots[id].as_mut().expect("a generating slot");
        // Sampling ends every check (kept in full, cut short or finished); none outlives its step.
        debug_assert!(active.check.is_none(), "slot {id}: a check from an earlier step");
        let Some(drafter) = self.drafters.get_mut(id).and_then(Option::as_mut) else {
            return;
        };
        // The check's last row makes a token too: one proposal fewer than the tokens left.
        let left = active.job.runs[active.run]
            .max_tokens
            .saturating_sub(active.n_generated + 1);
        let wanted = self.draft.max.min(self.n_ctx - pos - 1).min(left).min(spare);
        if wanted == 0 {
            return;
        }
        let history = active.seq.history();
        let mut proposals = match catch_unwind(AssertUnwindSafe(|| drafter.draft(history, wanted))) {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => {
                eprintln!("slot {id}: drafting failed ({e}); this step decodes one token");
                return;
            }
            Err(_) => {
                eprintln!("slot {id}: the drafter panicked; the slot decodes without drafting from now on");
                self.drafters[id] = None;
                return;
            }
        };
        proposals.truncate(wanted);
        if proposals.len() < self.draft.min.max(1) {
            return;
        }
        active.n_drafted += proposals.len();
        self.shared.metrics.draft_checks.fetch_add(1, Ordering::Relaxed);
        active.check = Some(Check {
            proposals,
            pos,
            kept: 0,
        });
    }

    /// Samples slot `id`'s next token from batch row `row` and reports it.
    fn sample(&mut self, row: usize, id: usize) {
        let Some(mut active) = self.slots[id].take() else {
            return;
        };
        let logits = match self.session.logits_ith(row) {
            Ok(l) => l,
            Err(e) => return self.fail(id, active.job, e.to_string()),
        };
        if active.gen_started.is_none() {
            active.prompt_time = active.started.elapsed();
            active.gen_started = Some(Instant::now());
        }
        let post = active.job.logprobs.filter(|_| active.job.post_sampling);
        let mut after_chain = Vec::new();
        let sampled = match post {
            None => active.seq.sample(logits),
            Some(_) => active
                .seq
                .sample_inspect(logits, &mut |candidates: &[crate::sampling::Candidate]| {
                    after_chain = chain_probabilities(candidates)
                }),
        };
        let token = match sampled {
            Ok(t) => t,
            Err(e @ EngineError::Grammar(_)) => return self.refuse(id, active.job, e.to_string()),
            Err(e) => return self.fail(id, active.job, e.to_string()),
        };
        let index = active.job.runs[active.run].index;
        if active.n_generated == 0 && active.run == 0 {
            self.metrics().record_ttft(active.job.arrived.elapsed());
        }
        active.n_generated += 1;
        if let Some(top) = active.job.logprobs {
            let logprob = match post {
                Some(_) => chain_logprobs(&after_chain, token, top),
                None => logprobs(logits, token, top),
            };
            let _ = active.job.events.send(Event::Logprob { index, logprob });
        }
        let step = active.seq.accept(token);
        active.unsent.push(token);
        let text = active.seq.text(step.text).to_vec();
        let max_tokens = active.job.runs[active.run].max_tokens;
        let (n_generated, piece) = (active.n_generated, String::from_utf8_lossy(&text));
        self.update_view(id, |v| {
            v.n_decoded = n_generated;
            v.n_remain = max_tokens.saturating_sub(n_generated).min(i64::MAX as usize) as i64;
            v.has_new_line |= piece.contains('\n');
            if v.generated.len() < MAX_VIEW_TEXT {
                v.generated.push_str(&piece);
            }
        });
        send_text(&mut active, &text);
        if let Some(check) = &mut active.check {
            let k = check.kept;
            if step.finished.is_none() && check.proposals.get(k) == Some(&token) {
                // Already in the cache: the slot's next row samples the token after it.
                check.kept += 1;
                active.n_accepted += 1;
            } else {
                // The target's token stands; the proposals after it are void, and so are
                // their cells.
                if k < check.proposals.len() {
                    let _ = self.session.seq_rm(Some(id), (check.pos + 1 + k) as i32, i32::MAX);
                }
                active.check = None;
            }
        }
        match step.finished {
            Some(reason) => self.finish(id, active, reason),
            None => {
                active.pending = Some(token);
                self.slots[id] = Some(active);
            }
        }
    }

    /// The slot's context is full: the run ends there, as a generation that fills it does.
    fn finish_context_full(&mut self, id: usize) {
        let Some(mut active) = self.slots[id].take() else {
            return;
        };
        let range = active.seq.stop(StopReason::ContextFull);
        let text = active.seq.text(range).to_vec();
        send_text(&mut active, &text);
        self.finish(id, active, StopReason::ContextFull);
    }

    /// A run ended: its last text and `Done`, the metrics and the log line; then the job's next
    /// run on the same slot, or the slot is free.
    fn finish(&mut self, id: usize, mut active: Active<'s>, reason: StopReason) {
        let tail = std::mem::take(&mut active.utf8);
        let index = active.job.runs[active.run].index;
        let timings = active.job.timings_per_token.then(|| active.timings());
        let _ = send(
            &active.job,
            Event::Text {
                index,
                text: String::from_utf8_lossy(&tail).into_owned(),
                tokens: std::mem::take(&mut active.unsent),
                slot: id,
                timings,
            },
        );
        let n_prompt = active.job.runs[active.run].prompt.len();
        let stats = GenerationStats {
            n_prompt: n_prompt - active.n_cached,
            n_cached: active.n_cached,
            prompt_time: active.prompt_time,
            n_generated: active.n_generated,
            gen_time: active.gen_started.map_or(Duration::ZERO, |t| t.elapsed()),
            n_drafted: active.n_drafted,
            n_accepted: active.n_accepted,
            ..Default::default()
        };
        self.metrics().record_generation(&stats);
        let n_cells = self.session.kv().seq_pos_max(id).map_or(0, |p| p as usize + 1);
        self.metrics().n_tokens_max.fetch_max(n_cells, Ordering::Relaxed);
        eprintln!(
            "slot {id}: prompt {n_prompt} tokens ({} cached, {} prefilled in {:.3} s), generated {} tokens in {:.3} s ({:.1} tok/s), finish {reason:?}",
            stats.n_cached,
            stats.n_prompt,
            stats.prompt_time.as_secs_f64(),
            stats.n_generated,
            stats.gen_time.as_secs_f64(),
            stats.gen_tok_per_s(),
        );
        if stats.n_drafted > 0 {
            eprintln!(
                "slot {id}: drafted {} tokens, kept {} ({:.1} %)",
                stats.n_drafted,
                stats.n_accepted,
                100.0 * stats.n_accepted as f64 / stats.n_drafted as f64
            );
        }
        let timings = active.timings();
        self.update_view(id, |v| {
            v.n_prompt_processed = timings.n_prompt;
            v.has_next_token = false;
        });
        let _ = send(
            &active.job,
            Event::Done {
                index,
                reason,
                n_prompt,
                n_cached: active.n_cached,
                n_generated: active.n_generated,
                slot: id,
                tokens: active.seq.generated().to_vec(),
                n_cells,
                timings,
                stopping_word: active.seq.stopping_word().to_string(),
            },
        );
        let next = active.next_run.fetch_add(1, Ordering::Relaxed);
        if next < active.job.runs.len() {
            self.begin(id, active.job, active.next_run, next, None);
        } else {
            self.release(id, active.job);
        }
    }
}

/// The most text `/slots` keeps of a run's output.
const MAX_VIEW_TEXT: usize = 64 << 10;

/// Sends `bytes` of the slot's text once they make whole characters, with the tokens sampled
/// since the last text.
fn send_text(active: &mut Active<'_>, bytes: &[u8]) {
    active.utf8.extend_from_slice(bytes);
    let text = take_utf8(&mut active.utf8);
    if text.is_empty() {
        return;
    }
    let index = active.job.runs[active.run].index;
    let timings = active.job.timings_per_token.then(|| active.timings());
    let tokens = std::mem::take(&mut active.unsent);
    let _ = send(
        &active.job,
        Event::Text {
            index,
            text,
            tokens,
            slot: active.slot,
            timings,
        },
    );
}

/// Sends an event; empty text is not sent (an empty chunk would end a chunked body early).
fn send(job: &Job, event: Event) -> Result<(), String> {
    if matches!(&event, Event::Text { text, .. } if text.is_empty()) {
        return Ok(());
    }
    job.events.send(event).map_err(|_| "the client went away".to_string())
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

/// The distribution the sampler chain left, most likely first: each candidate still in the
/// running (a weight above 0) with its probability; after a greedy pick, the best token alone,
/// with probability 1, as llama.cpp reports it.
fn chain_probabilities(candidates: &[crate::sampling::Candidate]) -> Vec<(u32, f64)> {
    let total: f64 = candidates.iter().map(|c| c.weight).sum();
    let mut probs: Vec<(u32, f64)> = if total > 0.0 {
        candidates
            .iter()
            .filter(|c| c.weight > 0.0)
            .map(|c| (c.id, c.weight / total))
            .collect()
    } else {
        candidates
            .iter()
            .filter(|c| c.logit > f32::NEG_INFINITY)
            .max_by(|a, b| a.logit.total_cmp(&b.logit).then(b.id.cmp(&a.id)))
            .map(|c| vec![(c.id, 1.0)])
            .unwrap_or_default()
    };
    probs.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    probs
}

/// The chosen token's log-probability under the chain's distribution (`chain_probabilities`),
/// and the `top` most likely tokens of it (fewer when fewer remain).
fn chain_logprobs(probs: &[(u32, f64)], token: u32, top: usize) -> TokenLogprob {
    let ln = |p: f64| p.ln() as f32;
    TokenLogprob {
        token,
        logprob: probs
            .iter()
            .find(|&&(id, _)| id == token)
            .map_or(f32::NEG_INFINITY, |&(_, p)| ln(p)),
        top: probs.iter().take(top).map(|&(id, p)| (id, ln(p))).collect(),
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
    fn a_shared_system_prompt_alone_does_not_claim_a_slot_but_a_continuation_does() {
        // 20 tokens of system prompt in common with a slot holding a 150-token conversation.
        assert_eq!(reuse(20, 150), 0);
        assert_eq!(reuse(150, 150), 150);
        assert_eq!(reuse(75, 150), 75);
        assert_eq!(reuse(0, 0), 0);
    }

    #[test]
    fn a_queue_bound_refuses_only_jobs_that_would_wait() {
        // --queue-max 0: an idle slot takes the job; with none idle it would wait, refused.
        assert!(!refuses(0, 1, 0));
        assert!(refuses(1, 1, 0) && refuses(0, 0, 0));
        // --queue-max 1: one may wait behind the busy slots, not two.
        assert!(!refuses(0, 0, 1) && refuses(1, 0, 1));
        // Two queued, one idle slot: one already waits, so a third is refused.
        assert!(!refuses(2, 2, 1) && !refuses(1, 1, 1) && refuses(2, 1, 1));
    }

    #[test]
    fn the_common_prefix_counts_equal_leading_tokens() {
        assert_eq!(common_prefix([1, 2, 3].into_iter(), &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(std::iter::empty(), &[1]), 0);
    }

    #[test]
    fn probabilities_after_the_chain_are_the_weights_left_normalised_or_the_greedy_pick_alone() {
        use crate::sampling::Candidate;
        let c = |id: u32, logit: f32, weight: f64| Candidate { id, logit, weight };
        // Weighed: the candidates still in the running, most likely first.
        let probs = chain_probabilities(&[c(0, 1.0, 1.0), c(1, 3.0, 3.0), c(2, -9.0, 0.0)]);
        assert_eq!(probs, [(1, 0.75), (0, 0.25)]);
        let lp = chain_logprobs(&probs, 0, 1);
        assert!((lp.logprob - 0.25f32.ln()).abs() < 1e-6);
        assert_eq!(lp.top.len(), 1);
        assert_eq!(lp.top[0].0, 1);
        // Not in the list (banned): -inf.
        assert_eq!(chain_logprobs(&probs, 2, 5).logprob, f32::NEG_INFINITY);
        // Greedy (unweighed): the best logit alone, certain.
        let greedy = chain_probabilities(&[c(0, 1.0, 0.0), c(1, 3.0, 0.0), c(2, f32::NEG_INFINITY, 0.0)]);
        assert_eq!(greedy, [(1, 1.0)]);
    }
}
