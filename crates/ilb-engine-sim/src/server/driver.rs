//! The model driver: one task per engine advancing the [`EngineModel`] in real time with tokio
//! timers, and fanning produced tokens out to the requests waiting for them.
//!
//! The model sits behind a `std::sync::Mutex` rather than being owned by the task behind a
//! channel: `/metrics`, `stats()` and `set_faults` then read or change it synchronously
//! without a round trip, and a submit is one short critical section. The lock is never held
//! across an `.await`, and every critical section is O(batch) at most.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{watch, Notify};

use super::metrics::{FinishedReason, Metrics};
use crate::clock;
use crate::model::{EngineModel, Nanos, Outcome, TokenEvent};

/// A request waiting for tokens.
pub struct LiveEntry {
    pub tokens: UnboundedSender<TokenEvent>,
    pub arrival: Nanos,
    pub last_token_at: Nanos,
    pub reason: FinishedReason,
}

/// The model and the requests it is serving.
pub struct State {
    pub model: EngineModel,
    pub live: HashMap<u64, LiveEntry>,
}

/// What the driver shares with the HTTP handlers.
pub struct ModelCell {
    state: Mutex<State>,
    /// Wakes the driver after a submit (a new iteration may start now) or a fault change.
    pub wake: Notify,
    pub epoch: tokio::time::Instant,
}

impl ModelCell {
    pub fn new(model: EngineModel) -> Self {
        Self {
            state: Mutex::new(State { model, live: HashMap::new() }),
            wake: Notify::new(),
            epoch: clock::now(),
        }
    }

    /// Locks the state; a panic elsewhere while holding it does not make it unusable.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn now(&self) -> Nanos {
        clock::model_now(self.epoch)
    }
}

/// Drop guard of a request in the model: if the response is dropped before the request
/// finished (the client disconnected), the sequence is aborted and its KV blocks freed.
pub struct LiveRequest {
    pub cell: Arc<ModelCell>,
    pub metrics: Arc<Metrics>,
    pub id: u64,
}

impl Drop for LiveRequest {
    fn drop(&mut self) {
        let mut state = self.cell.lock();
        if state.live.remove(&self.id).is_some() {
            state.model.abort(self.id);
            self.metrics.finished(FinishedReason::Abort);
            drop(state);
            // Freed blocks may let a waiting request in.
            self.cell.wake.notify_one();
        }
    }
}

/// Runs iterations as their time comes until `shutdown` turns true.
pub async fn run(cell: Arc<ModelCell>, metrics: Arc<Metrics>, mut shutdown: watch::Receiver<bool>) {
    let mut tokens = Vec::new();
    let mut outcomes: Vec<Outcome> = Vec::new();
    loop {
        let next = {
            let mut state = cell.lock();
            let now = cell.now();
            tokens.clear();
            outcomes.clear();
            state.model.step_until(now, &mut tokens, &mut outcomes);
            dispatch(&mut state, &tokens, &metrics);
            state.model.next_iteration_time()
        };
        let deadline = match next {
            Some(at) => cell.epoch + Duration::from_nanos(at),
            None => cell.epoch + Duration::from_secs(86_400 * 365),
        };
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {}
            _ = cell.wake.notified() => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    // Dropping the senders ends every waiting response.
                    cell.lock().live.clear();
                    return;
                }
            }
        }
    }
}

fn dispatch(state: &mut State, tokens: &[TokenEvent], metrics: &Metrics) {
    for token in tokens {
        let Some(entry) = state.live.get_mut(&token.id) else { continue };
        if token.index == 1 {
            metrics.ttft.observe_ns(token.at.saturating_sub(entry.arrival));
        } else {
            metrics.itl.observe_ns(token.at.saturating_sub(entry.last_token_at));
        }
        entry.last_token_at = token.at;
        let delivered = entry.tokens.send(*token).is_ok();
        if token.finished {
            metrics.e2e.observe_ns(token.at.saturating_sub(entry.arrival));
            metrics.generated.observe_count(u64::from(token.index));
            metrics.finished(entry.reason);
            state.live.remove(&token.id);
        } else if !delivered {
            // The response is gone without its guard having run (cannot normally happen).
            state.live.remove(&token.id);
            state.model.abort(token.id);
            metrics.finished(FinishedReason::Abort);
        }
    }
}
