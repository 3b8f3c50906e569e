//! In-flight accounting: [`InFlight`] counts one attempt against its engine, its class and
//! the class's share of the engine from the moment it is sent until its response body ends
//! (the streamed body owns it, `body.rs`), and records how the attempt went: the engine's
//! latency histograms, success or failure for the local guard, and a stored response's engine.

use crate::clock;
use crate::engines::{EngineState, Outcome, Verdict};
use crate::shared::Shared;
use crate::state::{ClassState, Installed};
use crate::upstream::Conn;
use ilb_core::classify;
use ilb_core::table::ClassTable;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Arc;
use tokio::time::Instant;

/// Counts one request against its engine and class from send until the response body ends.
pub struct InFlight {
    shared: Arc<Shared>,
    engine: Arc<EngineState>,
    class: Arc<ClassState>,
    /// This class's requests in flight on this engine.
    class_engine: Arc<AtomicU32>,
    /// When the request was sent to the engine.
    pub started: Instant,
    finished: bool,
}

impl InFlight {
    pub fn start(
        shared: &Arc<Shared>,
        installed: &Installed,
        class: &ClassTable,
        candidate: usize,
    ) -> InFlight {
        let engine = Arc::clone(&installed.engines[class.candidates[candidate].engine_idx]);
        let class_engine = Arc::clone(&installed.class_engine_in_flight[class.seq][candidate]);
        let class = Arc::clone(&installed.classes[class.seq]);
        engine.in_flight.fetch_add(1, Relaxed);
        engine.counters.attempts.fetch_add(1, Relaxed);
        class.in_flight.fetch_add(1, Relaxed);
        class_engine.fetch_add(1, Relaxed);
        shared.load_changed();
        InFlight {
            shared: Arc::clone(shared),
            engine,
            class,
            class_engine,
            started: clock::now(),
            finished: false,
        }
    }

    pub fn engine_id(&self) -> &str {
        self.engine.id.as_str()
    }

    /// Records how the attempt ended (once), for the guard as [`Verdict::of`] judges it; a
    /// client that went away records nothing.
    pub fn finish(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        self.engine.counters.duration.observe_micros(clock::since(self.started).as_micros() as u64);
        match Verdict::of(outcome) {
            Verdict::Healthy => self.engine.record_success(),
            Verdict::Neutral => {}
            Verdict::Failed => self.shared.engine_failed(&self.engine),
        }
    }

    /// The response body was read to its end: its connection may carry another request.
    pub fn release_conn(&self, conn: Conn) {
        let shared = &self.shared;
        self.engine.pool.push(conn, shared.pool_clock.ms(), &shared.config.upstream_pool);
    }

    /// A chunk of a streamed response body arrived at `now`; `previous` is when the one before
    /// it did (none for the first). Feeds the first-chunk and chunk-gap figures reported to the
    /// control plane.
    pub fn stream_chunk(&self, previous: Option<Instant>, now: Instant) {
        let counters = &self.engine.counters;
        match previous {
            None => counters.first_chunk.observe_micros(now.duration_since(self.started).as_micros() as u64),
            Some(before) => counters.chunk_gap.observe_micros(now.duration_since(before).as_micros() as u64),
        }
    }

    /// The answer ended cleanly having generated `tokens` (`body.rs`, `TokenCount`).
    pub fn answered_tokens(&self, tokens: u64) {
        self.engine.counters.output_tokens.observe(tokens);
    }

    /// Remembers that this request's engine stored the response `id` (Responses API).
    pub fn remember_response(&self, id: &str, tag: u32, now_s: u32) {
        self.shared.responses.put(classify::response_key(id), tag, now_s);
    }

    /// The engine's response head arrived.
    pub fn first_byte(&self) {
        self.engine.counters.ttfb.observe_micros(clock::since(self.started).as_micros() as u64);
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.engine.in_flight.fetch_sub(1, Relaxed);
        self.class.in_flight.fetch_sub(1, Relaxed);
        self.class_engine.fetch_sub(1, Relaxed);
        self.shared.waiters.slot_freed();
        self.shared.load_changed();
    }
}
