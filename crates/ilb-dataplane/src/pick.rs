//! Choosing a request's engine among its class's candidates on the installed table: the
//! pinned engine of a stored response, else `ClassTable::select` (the remembered engine, the
//! weighted consistent hash within the load bound), skipping engines that fail the request's
//! constraints, are ejected or held, were already tried, or are at their `max_in_flight`.
//! The request path and `/debug/route` ask the same function.

use crate::state::Installed;
use ilb_core::affinity::AffinityTable;
use ilb_core::table::{within_load_bound, ClassTable, Constraints};
use std::sync::atomic::Ordering::Relaxed;

/// Why no candidate could be picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoCandidate {
    /// Usable engines exist but every one is at its `max_in_flight`.
    Saturated,
    /// No engine is usable: all ejected, already tried, or failing the constraints.
    Unavailable,
}

/// What a pick takes besides the class and the key.
pub(crate) struct Pick<'a> {
    /// Candidates already tried by this request.
    pub tried: &'a [usize],
    /// The candidate that must serve the request if it can (the engine that stored the
    /// response it continues), whatever its weight and load bound.
    pub pinned: Option<usize>,
    pub affinity: &'a AffinityTable,
    pub now_s: u32,
    /// Place keys the affinity table has never seen by load (`place_new_keys_by_load`).
    pub place_new_by_load: bool,
}

/// Picks a candidate: the pinned one if it is usable, else weighted consistent hashing on the
/// key, skipping engines that fail the request's constraints, are ejected, were already tried,
/// or are full; first with the load bound, then without it. Hot path.
pub(crate) fn choose(
    installed: &Installed,
    class: &ClassTable,
    constraints: &Constraints<'_>,
    key_hash: u64,
    pick: Pick<'_>,
) -> Result<usize, NoCandidate> {
    let Pick { tried, pinned, affinity, now_s, place_new_by_load } = pick;
    // With peers, the counts include the other replicas' requests as they last said, so that
    // replicas behind one Service place by the load all of them put on an engine.
    let class_state = &installed.classes[class.seq];
    let class_load = (class_state.in_flight.load(Relaxed) + class_state.peer_in_flight.load(Relaxed)) as f64;
    let healthy = |candidate: usize| {
        let c = &class.candidates[candidate];
        !tried.contains(&candidate)
            && !installed.engines[c.engine_idx].is_ejected()
            && !installed.engines[c.engine_idx].is_held()
            && (constraints.is_empty() || constraints.allow(&installed.table.engines[c.engine_idx]))
    };
    let has_room = |candidate: usize| {
        let c = &class.candidates[candidate];
        let limit = installed.table.engines[c.engine_idx].max_in_flight;
        limit == 0 || installed.engines[c.engine_idx].in_flight.load(Relaxed) < limit
    };
    // The bound compares like with like: this class's requests on the candidate against the
    // class's share there (the engine's own count also holds other classes').
    let class_engine = &installed.class_engine_in_flight[class.seq];
    let load = |candidate: usize| {
        let peers = installed.engines[class.candidates[candidate].engine_idx].peer_in_flight.load(Relaxed);
        (class_engine[candidate].load(Relaxed) + peers) as f64
    };
    let bounded = |candidate: usize| {
        within_load_bound(load(candidate), class.candidates[candidate].load_share, class_load)
            && healthy(candidate)
            && has_room(candidate)
    };
    if let Some(c) = pinned.filter(|&c| healthy(c)) {
        // Only this engine has the stored response: wait for its room rather than go elsewhere.
        return if has_room(c) { Ok(c) } else { Err(NoCandidate::Saturated) };
    }
    // A conversation stays on the engine that holds its KV cache while that engine keeps a
    // weight and room (and, placing by load, is not far more loaded per unit of weight than
    // its hash pick); only then does the hash decide.
    let new_by_load: Option<&dyn Fn(usize) -> f64> = place_new_by_load.then_some(&load);
    if let Some(c) =
        class.select(key_hash, affinity, now_s, bounded, |c| healthy(c) && has_room(c), new_by_load)
    {
        return Ok(c);
    }
    if class.pick(key_hash, healthy).is_some() {
        Err(NoCandidate::Saturated)
    } else {
        Err(NoCandidate::Unavailable)
    }
}
