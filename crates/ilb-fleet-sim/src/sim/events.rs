//! The event heap: one binary heap of events in virtual time, ordered by time then by the
//! order they were scheduled (so equal times are deterministic).

use crate::workload::Session;
use ilb_engine_sim::Nanos;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

#[derive(Debug)]
pub enum Event {
    /// The next session of a stream starts.
    SessionStart(usize),
    /// A later turn of a session arrives.
    Turn(Box<Session>),
    /// An engine's next event time (stale if the engine rescheduled since).
    Wake(usize),
    Scrape,
    Report,
    /// The policy's control loop runs.
    Tick,
    /// The policy installs what is due.
    PolicyWake,
    /// A cluster's data planes share what they decided: this one of each cluster (through
    /// the control plane), or all of them (peers).
    Share(Option<usize>),
    Sample,
    /// The scenario's timed event with this index.
    Scenario(usize),
}

struct Entry {
    at: Nanos,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    /// Reversed: the heap pops the earliest.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Default)]
pub struct Queue {
    heap: BinaryHeap<Entry>,
    seq: u64,
}

impl Queue {
    pub fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.heap.push(Entry { at, seq: self.seq, event });
    }

    pub fn pop(&mut self) -> Option<(Nanos, Event)> {
        self.heap.pop().map(|e| (e.at, e.event))
    }
}

pub fn nanos(seconds: f64) -> Nanos {
    (seconds.max(0.0) * 1e9).round() as Nanos
}

pub fn seconds(t: Nanos) -> f64 {
    t as f64 / 1e9
}
