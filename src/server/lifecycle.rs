//! The server's life as a load balancer or an orchestrator sees it: loading the model, ready,
//! draining after SIGINT/SIGTERM; and what `GET /ready` answers in each, with "full" when
//! every slot is busy and `--queue-max` requests already wait.
//!
//! `/health` says the process is alive (a liveness probe restarts it when it stops answering);
//! `/ready` says whether to send it work (a readiness probe or an active health check takes it
//! out of rotation while it is 503). This file only holds the phase and names the answers: it
//! binds, accepts and stops nothing (`mod.rs` does) and queues nothing (`slots.rs` does).
//! "Serving at scale" in docs/server.md describes how the pieces meet.

use axum::http::StatusCode;
use std::sync::atomic::{AtomicU8, Ordering};

/// Where the process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Bound and answering `/health` and `/ready`; the model is not loaded yet.
    Loading,
    /// Serving.
    Ready,
    /// A signal came: no longer ready, finishing what it holds.
    Draining,
}

/// The phase, shared by the accept loop, the signal handler and the handlers.
#[derive(Debug)]
pub struct Lifecycle(AtomicU8);

impl Default for Lifecycle {
    fn default() -> Self {
        Lifecycle(AtomicU8::new(Phase::Loading as u8))
    }
}

impl Lifecycle {
    pub fn phase(&self) -> Phase {
        match self.0.load(Ordering::Acquire) {
            0 => Phase::Loading,
            1 => Phase::Ready,
            _ => Phase::Draining,
        }
    }

    /// The model is loaded: ready, unless a signal came while it loaded (draining stays).
    pub fn loaded(&self) {
        let _ = self.0.compare_exchange(
            Phase::Loading as u8,
            Phase::Ready as u8,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// A signal came: never ready again.
    pub fn drain(&self) {
        self.0.store(Phase::Draining as u8, Ordering::Release);
    }
}

/// What `GET /ready` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Loading,
    Ready,
    /// Every slot is busy and `--queue-max` requests wait: a new one would be refused.
    Full,
    Draining,
}

impl Readiness {
    /// 200 only when a request sent now would be taken.
    pub fn status(self) -> StatusCode {
        match self {
            Readiness::Ready => StatusCode::OK,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `status` field of `/ready`'s body.
    pub fn name(self) -> &'static str {
        match self {
            Readiness::Loading => "loading",
            Readiness::Ready => "ready",
            Readiness::Full => "full",
            Readiness::Draining => "draining",
        }
    }

    /// The answer for `phase`, given whether the queue is full (asked only when it matters).
    pub fn of(phase: Phase, full: impl FnOnce() -> bool) -> Self {
        match phase {
            Phase::Loading => Readiness::Loading,
            Phase::Draining => Readiness::Draining,
            Phase::Ready if full() => Readiness::Full,
            Phase::Ready => Readiness::Ready,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_during_loading_is_not_undone_when_the_model_arrives() {
        let life = Lifecycle::default();
        assert_eq!(life.phase(), Phase::Loading);
        life.drain();
        life.loaded();
        assert_eq!(life.phase(), Phase::Draining);
        let life = Lifecycle::default();
        life.loaded();
        assert_eq!(life.phase(), Phase::Ready);
    }

    #[test]
    fn only_a_ready_server_with_room_answers_200() {
        let answers: Vec<(Readiness, StatusCode)> = [
            (Phase::Loading, true),
            (Phase::Ready, false),
            (Phase::Ready, true),
            (Phase::Draining, false),
        ]
        .into_iter()
        .map(|(phase, full)| {
            let r = Readiness::of(phase, || full);
            (r, r.status())
        })
        .collect();
        assert_eq!(
            answers,
            [
                (Readiness::Loading, StatusCode::SERVICE_UNAVAILABLE),
                (Readiness::Ready, StatusCode::OK),
                (Readiness::Full, StatusCode::SERVICE_UNAVAILABLE),
                (Readiness::Draining, StatusCode::SERVICE_UNAVAILABLE),
            ]
        );
    }
}
