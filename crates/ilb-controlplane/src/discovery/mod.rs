//! Engine discovery: a source lists the addresses of a group's engines, and every address
//! becomes an engine with the group's shared fields ([`EngineGroup::engine`]).
//!
//! A source implements [`Resolve`]: one call, one listing. `run_group` calls it every
//! `resolve_interval_ms`, debounces removals with a [`Tracker`] (an address is removed only
//! after it is missing from two listings in a row, so one short answer does not drain an
//! engine), and sends the group's engines to the control loop when they change. A listing
//! that fails (the server does not answer) changes nothing: only an answer removes engines.
//!
//! `dns` is the one source shipped (A/AAAA, or SRV). Another source, such as Kubernetes
//! EndpointSlices, is a new module here implementing [`Resolve`] (it may keep a watch open
//! and return its current set on each call), plus a field in [`EngineGroup`] that selects it
//! in `Discovery::sync`.

pub mod dns;

use crate::events::{ControlHandles, Event};
use ilb_planning::config::EngineGroup;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Listings a source needs to miss an address in a row before it is removed.
pub const MISSES_TO_REMOVE: u32 = 2;

/// A source of engine addresses.
pub trait Resolve: Send + 'static {
    /// The group's addresses now. `Ok(vec![])` means the source answered that there are none;
    /// `Err` that it could not answer (the current set then stays).
    fn resolve(&mut self) -> impl Future<Output = Result<Vec<SocketAddr>, String>> + Send;
}

/// The addresses of one group, with removals debounced.
#[derive(Debug)]
pub struct Tracker {
    /// Address → listings in a row that missed it.
    known: BTreeMap<SocketAddr, u32>,
    misses_to_remove: u32,
}

impl Tracker {
    pub fn new(misses_to_remove: u32) -> Tracker {
        Tracker { known: BTreeMap::new(), misses_to_remove: misses_to_remove.max(1) }
    }

    /// Folds in one listing; true if the set of addresses changed.
    pub fn update(&mut self, found: &[SocketAddr]) -> bool {
        let mut changed = false;
        for misses in self.known.values_mut() {
            *misses += 1;
        }
        for addr in found {
            if self.known.insert(*addr, 0).is_none() {
                changed = true;
            }
        }
        let before = self.known.len();
        let limit = self.misses_to_remove;
        self.known.retain(|_, misses| *misses < limit);
        changed || self.known.len() != before
    }

    /// The current addresses, sorted.
    pub fn addresses(&self) -> Vec<SocketAddr> {
        self.known.keys().copied().collect()
    }
}

/// Resolves `group` with `source` until shutdown, sending its engines whenever they change
/// (and after the first answer).
pub(crate) async fn run_group(
    group: EngineGroup,
    mut source: impl Resolve,
    events: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tracker = Tracker::new(MISSES_TO_REMOVE);
    let mut sent = false;
    let every = Duration::from_millis(group.resolve_interval_ms);
    loop {
        let listing = tokio::select! {
            l = source.resolve() => l,
            _ = shutdown.changed() => return,
        };
        match listing {
            Ok(found) => {
                if tracker.update(&found) || !sent {
                    let engines = tracker.addresses().into_iter().map(|a| group.engine(a)).collect();
                    tracing::debug!(group = %group.id, addresses = ?tracker.addresses(), "discovered engines");
                    if events.send(Event::Discovered { group: group.id.clone(), engines }).await.is_err() {
                        return;
                    }
                    sent = true;
                }
            }
            Err(error) => tracing::warn!(group = %group.id, %error, "discovery failed; engines unchanged"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

/// One discovery task per group; restarted when the group's definition changes.
#[derive(Default)]
pub(crate) struct Discovery {
    running: HashMap<String, (EngineGroup, tokio::task::AbortHandle)>,
}

impl Discovery {
    pub(crate) fn sync(&mut self, control: &ControlHandles, groups: &[EngineGroup]) {
        let mut keep = HashMap::with_capacity(groups.len());
        for group in groups {
            match self.running.remove(&group.id) {
                Some((running, handle)) if running == *group => {
                    keep.insert(group.id.clone(), (running, handle));
                }
                previous => {
                    if let Some((_, handle)) = previous {
                        handle.abort();
                    }
                    let source = dns::DnsSource::new(group);
                    let task = tokio::spawn(run_group(
                        group.clone(),
                        source,
                        control.events.clone(),
                        control.shutdown.clone(),
                    ));
                    keep.insert(group.id.clone(), (group.clone(), task.abort_handle()));
                }
            }
        }
        for (_, (_, handle)) in self.running.drain() {
            handle.abort();
        }
        self.running = keep;
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        for (_, (_, handle)) in self.running.drain() {
            handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    #[test]
    fn an_address_goes_after_two_missing_listings_and_comes_back_at_once() {
        let mut t = Tracker::new(2);
        assert!(t.update(&[addr(1), addr(2)]));
        assert!(!t.update(&[addr(1), addr(2)]));
        // Missing once: kept.
        assert!(!t.update(&[addr(1)]));
        assert_eq!(t.addresses(), vec![addr(1), addr(2)]);
        // Back before the second miss: the count starts again.
        assert!(!t.update(&[addr(1), addr(2)]));
        assert!(!t.update(&[addr(1)]));
        assert!(t.update(&[addr(1)]));
        assert_eq!(t.addresses(), vec![addr(1)]);
        assert!(t.update(&[addr(1), addr(3)]));
        assert_eq!(t.addresses(), vec![addr(1), addr(3)]);
        // An empty answer counts as a miss of everything.
        assert!(!t.update(&[]));
        assert!(t.update(&[]));
        assert!(t.addresses().is_empty());
    }
}
