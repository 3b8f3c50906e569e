//! Admission: planned load shedding by priority, and a bounded, priority-ordered wait when
//! every candidate engine is at its concurrency limit.
//!
//! **Shedding.** When the control plane plans to shed a fraction `s` of a class (its demand is
//! above usable capacity), the data plane sheds that fraction early, lowest priority first: a
//! background task turns the class's per-priority arrival rates into per-priority shed
//! probabilities (all of `low` before any `normal`, and so on), and the request path compares one
//! number. **Waiting.** A request whose candidates are all full waits (bounded in time and
//! in count) for a slot; a freed slot goes to the highest priority waiting.

use crate::server::Shared;
use ilb_core::classify::Priority;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Notify};

pub const PRIORITIES: usize = 4;

pub fn priority_index(p: Priority) -> usize {
    match p {
        Priority::Low => 0,
        Priority::Normal => 1,
        Priority::High => 2,
        Priority::Critical => 3,
    }
}

/// Per-priority shed probabilities that shed `shed_fraction` of the total rate, lowest
/// priority first.
pub fn shed_probabilities(shed_fraction: f64, rates: [f64; PRIORITIES]) -> [f64; PRIORITIES] {
    let total: f64 = rates.iter().sum();
    let mut remaining = (shed_fraction.clamp(0.0, 1.0) * total).max(0.0);
    let mut out = [0.0; PRIORITIES];
    for (p, rate) in rates.iter().enumerate() {
        if remaining <= 0.0 {
            break;
        }
        if *rate <= 0.0 {
            continue;
        }
        out[p] = (remaining / rate).min(1.0);
        remaining -= out[p] * rate;
    }
    out
}

/// Requests waiting for a free engine slot, by priority.
#[derive(Default)]
pub struct Waiters {
    waiting: [AtomicUsize; PRIORITIES],
    notify: [Notify; PRIORITIES],
    total: AtomicUsize,
}

impl Waiters {
    /// A slot was freed: wake the highest-priority waiter, if any.
    pub fn slot_freed(&self) {
        if self.total.load(Relaxed) == 0 {
            return;
        }
        if let Some(p) = (0..PRIORITIES).rev().find(|&p| self.waiting[p].load(Relaxed) > 0) {
            self.notify[p].notify_one();
        }
    }

    pub fn total(&self) -> usize {
        self.total.load(Relaxed)
    }

    /// Waits for a freed slot; false on timeout. The caller re-checks the engines either way.
    pub async fn wait(&self, priority: usize, timeout: Duration) -> bool {
        self.waiting[priority].fetch_add(1, Relaxed);
        self.total.fetch_add(1, Relaxed);
        let woken = tokio::time::timeout(timeout, self.notify[priority].notified()).await.is_ok();
        self.waiting[priority].fetch_sub(1, Relaxed);
        self.total.fetch_sub(1, Relaxed);
        woken
    }
}

/// Recomputes every class's shed probabilities twice a second from its arrivals.
pub async fn plan_shedding(shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let period = Duration::from_millis(500);
    let tau_s = 2.0;
    let alpha = 1.0 - (-period.as_secs_f64() / tau_s).exp();
    let mut last: HashMap<usize, ([u64; PRIORITIES], [f64; PRIORITIES])> = HashMap::new();
    let mut version = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = shutdown.changed() => return,
        }
        let Some(installed) = shared.routing.load() else { continue };
        if version != Some(installed.table.version) {
            // Class indices change meaning with a new table.
            last.clear();
            version = Some(installed.table.version);
        }
        for model in installed.table.models() {
            for class in &model.classes {
                let state = &installed.classes[class.seq];
                let counts: [u64; PRIORITIES] =
                    std::array::from_fn(|p| state.priority.priority_arrivals[p].load(Relaxed));
                let (before, mut rates) =
                    last.get(&class.seq).copied().unwrap_or((counts, [0.0; PRIORITIES]));
                for p in 0..PRIORITIES {
                    let rate = counts[p].saturating_sub(before[p]) as f64 / period.as_secs_f64();
                    rates[p] += alpha * (rate - rates[p]);
                }
                last.insert(class.seq, (counts, rates));
                let probabilities = shed_probabilities(class.shed_fraction, rates);
                for (slot, probability) in state.priority.shed_probability.iter().zip(probabilities) {
                    slot.store(probability.to_bits(), Relaxed);
                }
            }
        }
    }
}

/// Cumulative arrivals per priority and the current shed probability per priority of a class.
#[derive(Debug, Default)]
pub struct PriorityCounters {
    pub priority_arrivals: [AtomicU64; PRIORITIES],
    /// f64 bits.
    pub shed_probability: [AtomicU64; PRIORITIES],
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sheds_lowest_priority_first() {
        // 10 low, 50 normal, 30 high, 10 critical req/s; shed 30 % = 30 req/s.
        let p = shed_probabilities(0.3, [10.0, 50.0, 30.0, 10.0]);
        assert_eq!(p[0], 1.0);
        assert!((p[1] - 0.4).abs() < 1e-12);
        assert_eq!((p[2], p[3]), (0.0, 0.0));
        assert_eq!(shed_probabilities(0.0, [1.0; 4]), [0.0; 4]);
        assert_eq!(shed_probabilities(1.0, [1.0; 4]), [1.0; 4]);
        // Only critical traffic: critical is shed when the plan says so.
        assert_eq!(shed_probabilities(0.5, [0.0, 0.0, 0.0, 8.0])[3], 0.5);
    }

    #[tokio::test(start_paused = true)]
    async fn freed_slots_go_to_the_highest_priority() {
        let waiters = Arc::new(Waiters::default());
        let (w1, w2) = (waiters.clone(), waiters.clone());
        let normal = tokio::spawn(async move { w1.wait(1, Duration::from_secs(5)).await });
        let critical = tokio::spawn(async move { w2.wait(3, Duration::from_secs(5)).await });
        tokio::task::yield_now().await;
        while waiters.total() < 2 {
            tokio::task::yield_now().await;
        }
        waiters.slot_freed();
        assert!(critical.await.unwrap(), "critical woke first");
        assert!(!normal.await.unwrap(), "normal timed out");
    }
}
