//! The vocabulary every other ilb crate speaks, and the pure parts of the request path.
//!
//! - [`ids`]: newtypes for engine, cluster, model, class and snapshot identifiers.
//! - [`snapshot`]: the versioned routing-snapshot wire format and its validation.
//! - [`slots`]: the weighted consistent-hashing slot table (minimal movement on weight change).
//! - [`table`]: a validated snapshot compiled into an immutable routing table, and `pick`.
//! - [`classify`]: reading model, constraints and affinity key out of a request.
//! - [`priority`]: the request priority levels, lowest first, and values per level.
//! - [`admission`]: which requests are shed or may wait for a slot, by priority (pure, so that
//!   the fleet simulator runs the data plane's rules).
//! - [`constraint`]: which engines a traffic class may use.
//! - [`deltas`]: what one data-plane replica tells the others of its cluster (affinity and
//!   stored-response changes, requests in flight).
//! - [`bounds`]: the range of every number that enters from outside (configs, registrations,
//!   reports), and [`redact`]: the rule that keeps secrets out of error messages.
//!
//! **Invariant:** nothing here does IO, reads the clock or spawns tasks; time and randomness
//! come in as arguments. This is what lets the fleet simulator run this exact code.

// No product function over `too-many-lines-threshold` (clippy.toml) lines; tests may be longer.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// No unsafe code (the workspace's one `unsafe` is the optimizer's cache prefetch hint).
#![forbid(unsafe_code)]

pub mod admission;
pub mod affinity;
pub mod bounds;
pub mod classify;
pub mod constraint;
pub mod deltas;
pub mod holds;
pub mod ids;
pub mod metrics;
pub mod priority;
pub mod redact;
pub mod report;
pub mod slots;
pub mod snapshot;
pub mod table;

pub use ids::{ClassId, ClusterId, EngineId, ModelName, SnapshotVersion};

/// Stable 64-bit hash used for affinity keys and slot probing. Stable across versions and
/// processes, so every data plane of a cluster maps a key to the same slot.
#[inline]
pub fn stable_hash(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
