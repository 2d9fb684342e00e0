//! The slots' shared prompt cache: which cells a job may count on, and what gives way when they
//! run out. The session's one KV cache holds every slot's tokens; a job is admitted while the
//! cells it needs fit beside what the running jobs still expect ([`Engine::fits`]), the cached
//! tokens of idle slots count as free and are evicted least recently used first, from their
//! tails ([`Engine::make_room`]), after a copy to the host tier when there is one; a job whose
//! prompt starts as one being read waits to share it ([`Wait`]); and when the running jobs
//! outgrow the cache the one admitted last is preempted, to resume later bit for bit.
//!
//! This file decides about cells and slots only: it runs no pass, samples nothing and sends no
//! event.

use super::{common_prefix, Active, Engine};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Cells a job's reply is expected to take at admission, when its `max_tokens` allows as many:
/// a job is admitted while its prompt's new cells and this much of its reply fit beside what
/// the running jobs still expect (vLLM admits on the prompt alone; a margin keeps preemption
/// rare). A reply that outgrows it takes cached prefixes' cells, then a later job's.
pub const REPLY_RESERVE: usize = 256;

/// Positions evicted at a time from the tail of an idle slot's cached tokens: its prefix,
/// which other prompts may share, stays longest.
pub const EVICT_BLOCK: usize = 256;

/// Which run a waiting run waits for: the slot, the run's admission stamp (a slot that took
/// another run since is not it), and the prompt positions `0..len` it will share.
#[derive(Debug, Clone, Copy)]
pub(super) struct Wait {
    pub(super) slot: usize,
    pub(super) admitted: u64,
    pub(super) len: usize,
}

impl Engine<'_> {
    /// Whether a run that reads `tokens` on idle slot `id` (keeping the cached prefix it
    /// would share, with `cache`) and expects `reply` cells of reply fits the cache now: free
    /// cells and those only idle slots hold (evictable, less the prefix it keeps) cover what
    /// the running jobs still expect and what it needs. Always true with a slot's own cells
    /// (not by memory) and when nothing runs: an idle cache is the whole budget.
    pub(super) fn fits(&self, id: usize, tokens: &[u32], cache: bool, reply: usize) -> bool {
        if !self.by_memory || self.slots.iter().all(Option::is_none) {
            return true;
        }
        let kv = self.session.kv();
        let idle = self.idle_mask();
        let (src, kept) = match cache {
            true => {
                let src = self.prefix_source(id, tokens);
                (src, kv.prefix_len(src, tokens).min(tokens.len().saturating_sub(1)))
            }
            false => (id, 0),
        };
        let room = (kv.n_free() + kv.held_only_by(idle)).saturating_sub(kv.prefix_held_only_by(src, kept as i32, idle));
        // A prompt being read that this one starts with will be shared, not read again.
        let ahead = match cache {
            true => self.reader_prefix(id, tokens).map_or(0, |(_, len)| len),
            false => 0,
        };
        let committed: usize = self.slots.iter().flatten().map(Active::outstanding).sum();
        room >= committed + tokens.len() - kept.max(ahead) + reply
    }

    /// The idle slots, bit `s` for slot `s`.
    fn idle_mask(&self) -> u64 {
        (0..self.slots.len())
            .filter(|&s| self.slots[s].is_none())
            .fold(0, |mask, s| mask | 1 << s)
    }

    /// Preempted runs take idle slots again, oldest admission first, while they fit: each
    /// shares what the cache still holds of its tokens and reads the rest.
    pub(super) fn resume_preempted(&mut self) {
        let stop_all = self.shared.stop_all.load(Ordering::Relaxed);
        for active in self.preempted.extract_if(.., |a| stop_all || a.job.abandoned()) {
            eprintln!("a preempted request was cancelled after {} tokens", active.n_generated);
            self.shared.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        while let Some(first) = self.preempted.first() {
            let tokens = first.to_read();
            let kv = self.session.kv();
            let Some(id) = (0..self.slots.len())
                .filter(|&id| self.slots[id].is_none())
                .max_by_key(|&id| (kv.prefix_len(id, tokens), std::cmp::Reverse(self.last_used[id])))
            else {
                return;
            };
            let reply = first.job.runs[first.run].max_tokens.saturating_sub(first.n_generated);
            if !self.fits(id, tokens, true, reply.min(REPLY_RESERVE)) {
                return;
            }
            let mut active = self.preempted.remove(0);
            let tokens = active.to_read().to_vec();
            let kept = self.share_cached(id, &tokens);
            eprintln!(
                "slot {id}: resumes a preempted run after {} tokens ({kept} of {} still cached)",
                active.n_generated,
                tokens.len()
            );
            active.next_prompt = kept;
            active.slot = id;
            self.clock += 1;
            self.last_used[id] = self.clock;
            self.set_processing(id, true);
            self.update_view(id, |v| {
                v.processing = true;
                v.has_next_token = true;
            });
            self.slots[id] = Some(active);
        }
    }

    /// Makes `n` cells free if the idle slots' cached cells allow: the least recently used
    /// idle slot's last [`EVICT_BLOCK`] positions go first, so shared prefixes stay longest.
    /// `false` when the idle slots hold no more.
    pub(super) fn make_room(&mut self, n: usize) -> bool {
        while self.session.kv().n_free() < n {
            let kv = self.session.kv();
            let victim = (0..self.slots.len())
                .filter(|&s| self.slots[s].is_none() && !kv.seq_cells(s).is_empty())
                .min_by_key(|&s| (self.last_used[s], s));
            let Some(victim) = victim else {
                return false;
            };
            self.save_to_host(victim);
            let kv = self.session.kv();
            let last = kv.seq_pos_max(victim).unwrap_or(0).max(0) as usize;
            let from = (last / EVICT_BLOCK * EVICT_BLOCK) as i32;
            let before = kv.n_free();
            let _ = self.session.seq_rm(Some(victim), from, i32::MAX);
            let freed = self.session.kv().n_free() - before;
            self.metrics()
                .cache_evicted_cells
                .fetch_add(freed as u64, Ordering::Relaxed);
        }
        true
    }

    /// Copies slot `id`'s cached tokens to the host tier, if there is one and they are not
    /// there already (once between two of the slot's jobs).
    pub(super) fn save_to_host(&mut self, id: usize) {
        let Some(host) = &mut self.host else { return };
        if std::mem::replace(&mut self.saved[id], true) {
            return;
        }
        match self.session.save_prefix(id) {
            Ok(prefix) => host.insert(prefix),
            Err(e) => eprintln!("slot {id}: its cached tokens were not copied to host memory: {e}"),
        }
        self.shared
            .metrics
            .host_cache_bytes
            .store(host.bytes(), Ordering::Relaxed);
    }

    /// Slot `id`'s run, just begun, takes from the host tier the longest copy of its prompt
    /// beyond what its cells share (all but the prompt's last token, whose logits it needs):
    /// rows written back, not computed again.
    pub(super) fn restore_from_host(&mut self, id: usize) {
        let (Some(host), Some(active)) = (&mut self.host, &self.slots[id]) else {
            return;
        };
        let prompt = &active.job.runs[active.run].prompt;
        let from = active.next_prompt;
        if !active.job.cache_prompt || active.wait_for.is_some() || from + 1 >= prompt.len() {
            return;
        }
        let Some((saved, common)) = host.best(prompt) else {
            return;
        };
        let to = common.min(prompt.len() - 1);
        if to <= from {
            return;
        }
        if !self.make_room(to - from) {
            return;
        }
        match self.session.restore_prefix(id, &saved, from, to) {
            Ok(to) if to > from => {
                let metrics = self.metrics();
                metrics.host_cache_hits.fetch_add(1, Ordering::Relaxed);
                metrics
                    .host_cache_tokens
                    .fetch_add((to - from) as u64, Ordering::Relaxed);
                eprintln!("slot {id}: {} prompt tokens restored from host memory", to - from);
                let active = self.slots[id].as_mut().expect("checked");
                active.next_prompt = to;
                active.n_cached = to;
                self.update_view(id, |v| v.n_cached = to);
            }
            Ok(_) => {}
            Err(e) => eprintln!("slot {id}: the host copy of its prompt was not restored: {e}"),
        }
    }

    /// Preempts the run admitted last (when another runs beside it) to give its cells back:
    /// its slot becomes idle with its cells as a cached prefix (evicted as any), and the run
    /// waits to resume, reading its prompt and what it generated again (bit for bit what it
    /// held) before its pending token. `false` when no run can give way.
    pub(super) fn preempt(&mut self) -> bool {
        let running: Vec<usize> = (0..self.slots.len())
            .filter(|&s| self.slots[s].as_ref().is_some_and(|a| a.wait_for.is_none()))
            .collect();
        if running.len() < 2 {
            return false;
        }
        let id = *running
            .iter()
            .max_by_key(|&&s| self.slots[s].as_ref().map_or(0, |a| a.admitted))
            .expect("two run");
        let mut active = self.slots[id].take().expect("running");
        if active.pending.is_some() {
            let history = active.seq.history();
            active.replay = history[..history.len() - 1].to_vec();
        }
        active.next_prompt = 0;
        eprintln!(
            "slot {id}: preempted after {} generated tokens: the cache is full",
            active.n_generated
        );
        self.metrics().preemptions.fetch_add(1, Ordering::Relaxed);
        // Evicted first among the idle slots: the runs still going need the room.
        self.last_used[id] = 0;
        self.set_processing(id, false);
        self.update_view(id, |v| {
            v.processing = false;
            v.has_next_token = false;
        });
        let at = self.preempted.partition_point(|a| a.admitted < active.admitted);
        self.preempted.insert(at, active);
        true
    }

    /// The slot whose cells hold the longest prefix of `prompt` (`id` itself on a tie), busy or
    /// idle: its cells at those positions never change while it runs, and sharing them keeps
    /// them for `id` whatever it does next.
    pub(super) fn prefix_source(&self, id: usize, prompt: &[u32]) -> usize {
        let kv = self.session.kv();
        let own = kv.prefix_len(id, prompt);
        (0..self.slots.len())
            .map(|s| (kv.prefix_len(s, prompt), s))
            .filter(|&(len, _)| len > own)
            .max_by_key(|&(len, s)| (len, std::cmp::Reverse(s)))
            .map_or(id, |(_, s)| s)
    }

    /// Slot `id` keeps or takes the longest start of `tokens` that any slot holds
    /// ([`Engine::prefix_source`], `Session::share_prefix`) and drops the rest of its cells;
    /// returns where reading starts. A failure leaves it empty, to read everything.
    pub(super) fn share_cached(&mut self, id: usize, tokens: &[u32]) -> usize {
        let src = self.prefix_source(id, tokens);
        self.session.share_prefix(src, id, tokens).unwrap_or_else(|_| {
            let _ = self.session.seq_rm(Some(id), 0, i32::MAX);
            0
        })
    }

    /// Runs waiting for another's prompt ([`Wait`]): once that run has read the positions they
    /// share, they take its cells for them (shared, not copied) and read the rest themselves. A
    /// run that is gone (finished, preempted, cancelled) leaves them to share whatever the
    /// cache holds of their prompt, and read the rest.
    pub(super) fn share_prompts(&mut self) {
        for id in 0..self.slots.len() {
            let Some(active) = &self.slots[id] else { continue };
            let Some(wait) = active.wait_for else { continue };
            let leader = self.slots[wait.slot]
                .as_ref()
                .filter(|l| l.admitted == wait.admitted && l.wait_for.is_none() && l.replay.is_empty());
            let own_job = leader.is_some_and(|l| Arc::ptr_eq(&l.job, &active.job));
            let shared = match leader {
                Some(l) if l.next_prompt < wait.len => continue,
                Some(_) => self
                    .session
                    .seq_cp(wait.slot, id, 0, wait.len as i32)
                    .is_ok()
                    .then_some(wait.len),
                None => None,
            };
            let prompt = active.job.runs[active.run].prompt.clone();
            let next = match shared {
                Some(len) => len,
                None if active.job.cache_prompt => self.share_cached(id, &prompt),
                None => 0,
            };
            let active = self.slots[id].as_mut().expect("checked");
            active.wait_for = None;
            active.next_prompt = next;
            // Another request's reading saved this one's: cached, as far as it is concerned.
            if !own_job && active.job.cache_prompt {
                active.n_cached = next;
                self.update_view(id, |v| v.n_cached = next);
            }
        }
    }

    /// A run already reading a longer start of `prompt` than slot `id` holds: slot `id` waits
    /// for it ([`Wait`]) instead of reading the same positions beside it.
    pub(super) fn reader_ahead(&self, id: usize, prompt: &[u32]) -> Option<Wait> {
        let active = self.slots[id].as_ref()?;
        if !active.job.cache_prompt || active.wait_for.is_some() || !self.by_memory {
            return None;
        }
        let (slot, len) = self.reader_prefix(id, prompt)?;
        (len > active.next_prompt).then(|| Wait {
            slot,
            admitted: self.slots[slot].as_ref().map_or(0, |a| a.admitted),
            len,
        })
    }

    /// The running slot (not `id`) that is reading a prompt sharing the longest start with
    /// `prompt` that it has not read yet, and that length (at most all of `prompt` but its
    /// last token).
    fn reader_prefix(&self, id: usize, prompt: &[u32]) -> Option<(usize, usize)> {
        (0..self.slots.len())
            .filter(|&s| s != id)
            .filter_map(|s| {
                let l = self.slots[s].as_ref()?;
                if l.wait_for.is_some() || !l.replay.is_empty() || l.pending.is_some() {
                    return None;
                }
                let len = common_prefix(l.to_read().iter().copied(), prompt).min(prompt.len().saturating_sub(1));
                (len > l.next_prompt).then_some((len, s))
            })
            .max()
            .map(|(len, s)| (s, len))
    }
}
