//! Admission: planned load shedding by priority, and a bounded, priority-ordered wait when
//! every candidate engine is at its concurrency limit.
//!
//! The rules are `ilb_core::admission`'s (pure, shared with the fleet simulator); this module
//! runs them on the data plane's atomics and tokio. **Shedding.** A background task turns each
//! class's per-priority arrivals into per-priority shed probabilities every
//! [`SHED_PLAN_PERIOD`], and the request path compares one number ([`arrive`]).
//! **Waiting.** A request whose candidates are all full waits (bounded in time and in count,
//! `ilb_core::admission::remaining_wait`) for a slot; a freed slot goes to the highest priority
//! waiting ([`Waiters`]).

use crate::clock;
use crate::config::DataPlaneConfig;
use crate::state::{PriorityCounters, RoutingState};
use ilb_core::admission::{remaining_wait, ClassShedding, SHED_PLAN_PERIOD};
use ilb_core::priority::{PerPriority, Priority};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

/// Requests waiting for a free engine slot, by priority.
#[derive(Default)]
pub struct Waiters {
    waiting: PerPriority<AtomicUsize>,
    notify: PerPriority<Notify>,
    total: AtomicUsize,
}

impl Waiters {
    /// A slot was freed: wake the highest-priority waiter, if any.
    pub fn slot_freed(&self) {
        if self.total.load(Relaxed) == 0 {
            return;
        }
        if let Some((p, _)) = self.waiting.iter().rev().find(|(_, waiting)| waiting.load(Relaxed) > 0) {
            self.notify[p].notify_one();
        }
    }

    pub fn total(&self) -> usize {
        self.total.load(Relaxed)
    }

    /// Waits for a freed slot; false on timeout. The caller re-checks the engines either way.
    pub async fn wait(&self, priority: Priority, timeout: Duration) -> bool {
        self.waiting[priority].fetch_add(1, Relaxed);
        self.total.fetch_add(1, Relaxed);
        let woken = tokio::time::timeout(timeout, self.notify[priority].notified()).await.is_ok();
        self.waiting[priority].fetch_sub(1, Relaxed);
        self.total.fetch_sub(1, Relaxed);
        woken
    }
}

/// Recomputes every class's shed probabilities every [`SHED_PLAN_PERIOD`] from its arrivals
/// ([`ClassShedding::plan`]).
pub async fn plan_shedding(routing: &RoutingState, mut shutdown: watch::Receiver<bool>) {
    let mut classes: HashMap<usize, ClassShedding> = HashMap::new();
    let mut version = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SHED_PLAN_PERIOD) => {}
            _ = shutdown.changed() => return,
        }
        let Some(installed) = routing.current() else { continue };
        if version != Some(installed.table.version) {
            // Class indices change meaning with a new table.
            classes.clear();
            version = Some(installed.table.version);
        }
        for model in installed.table.models() {
            for class in &model.classes {
                let state = &installed.classes[class.seq];
                let counts = state.priority.arrivals.map(|count| count.load(Relaxed));
                let shedding = classes.entry(class.seq).or_insert_with(|| ClassShedding::new(counts));
                let probabilities = shedding.plan(counts, class.shed_fraction);
                for (p, slot) in state.priority.shed_probability.iter() {
                    slot.store(probabilities[p].to_bits(), Relaxed);
                }
            }
        }
    }
}

/// Counts an arrival of `priority` in a class and says whether to shed it
/// ([`ilb_core::admission::shed`] with a draw derived from `request_id`). Hot path: two relaxed
/// atomics.
pub fn arrive(counters: &PriorityCounters, priority: Priority, request_id: u64) -> bool {
    counters.arrivals[priority].fetch_add(1, Relaxed);
    ilb_core::admission::shed(shed_probability(counters, priority), unit_interval(request_id))
}

/// The share of `priority`'s requests the class sheds now.
pub fn shed_probability(counters: &PriorityCounters, priority: Priority) -> f64 {
    f64::from_bits(counters.shed_probability[priority].load(Relaxed))
}

/// Every usable engine is at its concurrency limit: waits for a freed slot for as long as
/// [`remaining_wait`] allows (`started`: when the request began waiting, set on its first
/// wait). `Err`: refused now, with how long it waited.
pub async fn wait_for_slot(
    waiters: &Waiters,
    config: &DataPlaneConfig,
    priority: Priority,
    started: &mut Option<Instant>,
) -> Result<(), Duration> {
    let waited = clock::since(*started.get_or_insert_with(clock::now));
    match remaining_wait(priority, waited, config.queue_wait, waiters.total(), config.max_waiting) {
        Some(remaining) => {
            waiters.wait(priority, remaining).await;
            Ok(())
        }
        None => Err(waited),
    }
}

/// A uniform number in [0, 1) from a request id (shedding decisions; no global RNG).
fn unit_interval(request_id: u64) -> f64 {
    (ilb_core::slots::mix(request_id ^ 0x5EED) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_to_the_highest_priority() {
        let waiters = Arc::new(Waiters::default());
        let (w1, w2) = (waiters.clone(), waiters.clone());
        let normal = tokio::spawn(async move { w1.wait(Priority::Normal, Duration::from_secs(5)).await });
        let critical = tokio::spawn(async move { w2.wait(Priority::Critical, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        while waiters.total() < 2 {
            tokio::task::yield_now().await;
        }
        waiters.slot_freed();
        assert!(critical.await.unwrap(), "critical woke first");
        assert!(!normal.await.unwrap(), "normal timed out");
    }
}
