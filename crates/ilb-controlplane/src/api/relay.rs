//! The data planes of one cluster share what they decide through the control plane: each
//! report carries what its data plane decided since the previous one (`Report::replica`: new
//! and moved conversations and stored responses), and the answer carries
//! what the cluster's other data planes reported since (`ReportAnswer`). So replicas behind a
//! Service that report to a control plane route as one without naming each other (`--peer`
//! does the same directly, faster).
//!
//! No consensus and no durable state: messages are kept in memory, per cluster, for
//! [`KEEP`], at most [`MAX_KEPT`] of them and [`MAX_KEPT_ENTRIES`] entries. A data plane that reports to several
//! control-plane replicas hears the same message from each (learning one twice changes
//! nothing); one whose answer is lost, or that reports less often than [`KEEP`], misses some,
//! which costs a cache miss, never a failed request.

use ilb_core::deltas::Deltas;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

/// How long a message is kept for the cluster's other data planes (ten report periods).
pub const KEEP: Duration = Duration::from_secs(10);

/// Most messages kept per cluster.
pub const MAX_KEPT: usize = 1024;

/// Most entries (conversations, responses, engine loads) kept per cluster, over all its
/// messages: a few MB, and an answer that fits the data plane's limit.
pub const MAX_KEPT_ENTRIES: usize = 1 << 19;

/// Most clusters relayed for; a report from a further one is relayed nothing.
const MAX_CLUSTERS: usize = 4096;

#[derive(Default)]
pub struct Relay {
    clusters: Mutex<HashMap<String, Cluster>>,
}

#[derive(Default)]
struct Cluster {
    /// Messages in arrival order: (number, arrival, reporting instance, message).
    kept: VecDeque<(u64, Instant, String, Arc<Deltas>)>,
    /// Entries in `kept`.
    entries: usize,
    /// The number the next message gets.
    next: u64,
    /// Per reporting instance: the first number it has not been given yet, and when it last
    /// reported.
    given: HashMap<String, (u64, Instant)>,
}

impl Relay {
    /// Keeps `deltas` from `instance` of `cluster` (if any) and returns the messages of the
    /// cluster's other instances it has not been given yet, oldest first (on its first report,
    /// all those kept).
    pub fn exchange(
        &self,
        cluster: &str,
        instance: &str,
        deltas: Option<Deltas>,
        now: Instant,
    ) -> Vec<Arc<Deltas>> {
        let mut clusters = self.clusters.lock().unwrap_or_else(|p| p.into_inner());
        if !clusters.contains_key(cluster) {
            if clusters.len() >= MAX_CLUSTERS {
                clusters.retain(|_, c| c.given.values().any(|&(_, at)| now.duration_since(at) < KEEP));
            }
            if clusters.len() >= MAX_CLUSTERS {
                return Vec::new();
            }
        }
        let c = clusters.entry(cluster.to_owned()).or_default();
        c.drop_old(now);
        c.given.retain(|_, &mut (_, at)| now.duration_since(at) <= KEEP);
        let from = c.given.get(instance).map_or(0, |&(from, _)| from);
        let out = c
            .kept
            .iter()
            .filter(|(n, _, from_instance, _)| *n >= from && from_instance != instance)
            .map(|(_, _, _, d)| Arc::clone(d))
            .collect();
        // A message that says nothing is not kept. Data planes no longer relay their requests
        // in flight (`ilb_dataplane::report`); an older one's are still passed on, and its
        // "none in flight" lapses at the receivers after `replicas::stale_after` instead.
        let says_something =
            |d: &Deltas| !(d.affinity.is_empty() && d.responses.is_empty() && d.in_flight.is_empty());
        if let Some(deltas) = deltas.filter(says_something) {
            c.entries += entries(&deltas);
            c.kept.push_back((c.next, now, instance.to_owned(), Arc::new(deltas)));
            c.next += 1;
            c.drop_old(now);
        }
        c.given.insert(instance.to_owned(), (c.next, now));
        out
    }
}

fn entries(deltas: &Deltas) -> usize {
    deltas.affinity.len() + deltas.responses.len() + deltas.in_flight.len()
}

impl Cluster {
    /// Drops the messages older than [`KEEP`], then the oldest while more than [`MAX_KEPT`]
    /// messages or [`MAX_KEPT_ENTRIES`] entries are kept.
    fn drop_old(&mut self, now: Instant) {
        while let Some((_, at, _, deltas)) = self.kept.front() {
            let full = self.kept.len() > MAX_KEPT || self.entries > MAX_KEPT_ENTRIES;
            if !full && now.duration_since(*at) <= KEEP {
                break;
            }
            self.entries -= entries(deltas);
            self.kept.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deltas(instance: &str, key: u64) -> Deltas {
        Deltas { instance: instance.into(), affinity: vec![(key, 7)], ..Default::default() }
    }

    fn keys(out: &[Arc<Deltas>]) -> Vec<u64> {
        out.iter().flat_map(|d| d.affinity.iter().map(|&(k, _)| k)).collect()
    }

    #[test]
    fn each_instance_gets_the_others_messages_once_in_order() {
        let relay = Relay::default();
        let t = crate::clock::now();
        assert!(relay.exchange("c", "a", Some(deltas("a", 1)), t).is_empty());
        assert!(relay.exchange("c", "a", Some(deltas("a", 2)), t).is_empty(), "not its own");
        assert_eq!(
            keys(&relay.exchange("c", "b", Some(deltas("b", 3)), t)),
            vec![1, 2],
            "all kept, first time"
        );
        assert_eq!(keys(&relay.exchange("c", "a", None, t)), vec![3]);
        assert!(relay.exchange("c", "b", None, t).is_empty(), "nothing new");
        assert!(relay.exchange("other", "x", None, t).is_empty(), "clusters apart");
    }

    #[test]
    fn a_message_that_says_nothing_is_not_kept() {
        let relay = Relay::default();
        let t = crate::clock::now();
        relay.exchange("c", "a", Some(Deltas { instance: "a".into(), ..Default::default() }), t);
        relay.exchange("c", "a", Some(deltas("a", 1)), t);
        let given = relay.exchange("c", "b", None, t);
        assert_eq!(given.len(), 1, "the empty message was kept: {given:?}");
        assert_eq!(keys(&given), vec![1]);
    }

    #[test]
    fn messages_expire_and_their_number_is_bounded() {
        let relay = Relay::default();
        let t = crate::clock::now();
        relay.exchange("c", "a", Some(deltas("a", 1)), t);
        assert!(relay.exchange("c", "b", None, t + KEEP + Duration::from_millis(1)).is_empty(), "expired");
        for key in 0..(MAX_KEPT as u64 + 10) {
            relay.exchange("c", "a", Some(deltas("a", key)), t + KEEP);
        }
        let got = relay.exchange("c", "new", None, t + KEEP);
        assert_eq!(got.len(), MAX_KEPT);
        assert_eq!(keys(&got)[0], 10, "the oldest went first");
    }

    #[test]
    fn the_entries_kept_are_bounded() {
        let relay = Relay::default();
        let t = crate::clock::now();
        let big = |instance: &str| Deltas {
            instance: instance.into(),
            affinity: (0..MAX_KEPT_ENTRIES as u64 / 3).map(|k| (k, 7)).collect(),
            ..Default::default()
        };
        for _ in 0..5 {
            relay.exchange("c", "a", Some(big("a")), t);
        }
        let got = relay.exchange("c", "b", None, t);
        assert_eq!(got.len(), 3, "three of the five fit");
        assert!(got.iter().map(|d| entries(d)).sum::<usize>() <= MAX_KEPT_ENTRIES);
    }
}
