//! Several data planes per front-end cluster (`[control] data_planes`), each with its own
//! affinity table and its own in-flight counts, and what they tell each other
//! (`[control] data_plane_sharing`).
//!
//! A cluster's data planes install the same snapshots (they pull the same thing) and share the
//! cluster's planned shedding (`dataplane`), but each one remembers only the conversations it
//! placed and counts only the requests it sent: a follow-up that reaches another data plane
//! than the one that placed its conversation is a new key there, and goes where that data
//! plane's hash and counts say, often away from the engine holding its KV cache.
//!
//! Sharing runs the product's own pieces where they are pure: each data plane's
//! [`AffinityTable`] keeps a journal of the keys it placed or moved, its message is the
//! [`Deltas`] type (`AffinityTable::changes_since`, [`Deltas::list`]) with its requests in
//! flight per engine tag, and a receiver takes the entries in with [`AffinityTable::learn`]
//! and adds the senders' latest counts to its own when it picks, as the data plane's
//! `peer_in_flight` does. The sending, relaying and folding around them live in
//! `ilb_dataplane::replicas` and `ilb_controlplane::api::relay`, which this crate may not
//! depend on; this module replicates their semantics in virtual time with no loss:
//!
//! - `peers`: every 5 ms (the data plane's shortest gap between two messages, `MIN_GAP`) every
//!   data plane of a cluster sends what changed and all the others learn it at once (a
//!   network transit of well under a millisecond left out);
//! - `control-plane`: each data plane reports once per `report_period_s`, the cluster's data
//!   planes at evenly spread phases; a report carries the reporter's message without its counts
//!   (as `ilb_dataplane::report` sends it) and its answer the latest message of each other data
//!   plane that it has not learned yet, as the relay does.
//!
//! Messages are not serialised (the wire format has its own tests), and a peer's load never
//! goes stale: no data plane of the simulator falls silent.

use super::{Load, Topology};
use crate::scenario::Sharing;
use ilb_core::affinity::{self, affinity_tag, AffinityTable, Change};
use ilb_core::deltas::Deltas;
use ilb_engine_sim::Nanos;
use std::collections::HashMap;

/// How often data planes that share directly send what changed: the data plane's `MIN_GAP`.
pub const PEER_GAP_NS: Nanos = 5_000_000;

/// Keys a data plane's journal holds between two messages, as the data plane's `JOURNAL_LEN`.
const JOURNAL_LEN: usize = 1 << 14;

/// One data plane of a cluster.
struct Replica {
    affinity: AffinityTable,
    /// Where its next message starts in its table's journal.
    cursor: u64,
    /// Per simulator engine: the other data planes' requests in flight there, as they last said.
    peer_in_flight: Vec<u32>,
    /// Per other data plane of the cluster: the number of its latest message learned here and
    /// that message's counts per simulator engine.
    peers: Vec<(u64, Vec<(usize, u32)>)>,
}

/// Every cluster's data planes.
pub(super) struct Replicas {
    /// `[cluster][data plane]`.
    clusters: Vec<Vec<Replica>>,
    /// `[cluster][data plane]`: its latest message and its number (0: none yet).
    latest: Vec<Vec<(u64, Deltas)>>,
    sharing: Sharing,
    /// Per cluster: its streams.
    cluster_streams: Vec<Vec<usize>>,
    /// Per simulator engine: its affinity tag, and back.
    engine_tags: Vec<u32>,
    engine_by_tag: HashMap<u32, usize>,
    scratch: Vec<Change>,
}

impl Replicas {
    pub fn new(topology: &Topology) -> Replicas {
        let n_planes = topology.data_planes.max(1);
        // Only data planes that tell others what they changed need the journal.
        let journal = n_planes > 1 && topology.sharing != Sharing::None;
        let replica = || Replica {
            affinity: if journal {
                AffinityTable::with_journal(affinity::DEFAULT_ENTRIES, affinity::DEFAULT_TTL_S, JOURNAL_LEN)
            } else {
                AffinityTable::new(affinity::DEFAULT_ENTRIES, affinity::DEFAULT_TTL_S)
            },
            cursor: 0,
            peer_in_flight: vec![0; topology.n_engines],
            peers: vec![(0, Vec::new()); n_planes],
        };
        let engine_tags: Vec<u32> =
            topology.engine_entries.iter().map(|e| affinity_tag(e.id.as_str())).collect();
        Replicas {
            clusters: (0..topology.n_clusters).map(|_| (0..n_planes).map(|_| replica()).collect()).collect(),
            latest: (0..topology.n_clusters).map(|_| vec![(0, Deltas::default()); n_planes]).collect(),
            sharing: if n_planes > 1 { topology.sharing } else { Sharing::None },
            cluster_streams: (0..topology.n_clusters)
                .map(|c| {
                    (0..topology.stream_cluster.len()).filter(|&s| topology.stream_cluster[s] == c).collect()
                })
                .collect(),
            engine_by_tag: engine_tags.iter().enumerate().map(|(j, &tag)| (tag, j)).collect(),
            engine_tags,
            scratch: Vec::new(),
        }
    }

    /// The affinity table of data plane `data_plane` of cluster `c`.
    pub fn affinity(&self, c: usize, data_plane: usize) -> &AffinityTable {
        &self.clusters[c][data_plane].affinity
    }

    /// Per simulator engine, the requests the other data planes of cluster `c` said they have in
    /// flight there, as `data_plane` knows them; `None` when they share nothing.
    pub fn peer_in_flight(&self, c: usize, data_plane: usize) -> Option<&[u32]> {
        (self.sharing != Sharing::None).then(|| self.clusters[c][data_plane].peer_in_flight.as_slice())
    }

    /// Data plane `data_plane` of every cluster sends what it changed and learns the others'
    /// latest messages (`None`: every data plane sends, then every one learns, as peers do).
    pub fn share(&mut self, now: Nanos, topology: &Topology, load: &Load, data_plane: Option<usize>) {
        let now_s = (now / 1_000_000_000) as u32;
        for c in 0..self.clusters.len() {
            let planes = match data_plane {
                Some(r) => r..r + 1,
                None => 0..self.clusters[c].len(),
            };
            for r in planes.clone() {
                self.send(c, r, now_s, topology, load);
            }
            for r in planes {
                self.learn(c, r, now_s);
            }
        }
    }

    /// Data plane `r` of cluster `c`'s message: the entries changed since its previous one and
    /// its requests in flight per engine, as `ilb_dataplane::replicas::collect` makes it.
    fn send(&mut self, c: usize, r: usize, now_s: u32, topology: &Topology, load: &Load) {
        let replica = &mut self.clusters[c][r];
        self.scratch.clear();
        replica.affinity.changes_since(&mut replica.cursor, now_s, &mut self.scratch);
        let (n, n_streams) = (topology.n_engines, topology.stream_cluster.len());
        let in_flight = (0..n)
            .map(|j| {
                let count = self.cluster_streams[c]
                    .iter()
                    .map(|&s| load.data_plane_stream_engine_in_flight[(r * n_streams + s) * n + j])
                    .sum::<u32>();
                (self.engine_tags[j], count)
            })
            .filter(|&(_, count)| count > 0 && self.sharing == Sharing::Peers)
            .take(ilb_core::deltas::MAX_ENTRIES)
            .collect();
        let deltas = Deltas {
            instance: format!("{}/{r}", topology.cluster_ids[c]),
            affinity: Deltas::list(&self.scratch),
            responses: Vec::new(),
            in_flight,
        };
        debug_assert!(deltas.validate().is_ok(), "a data plane's own message is within the limits");
        let (number, latest) = &mut self.latest[c][r];
        *number += 1;
        *latest = deltas;
    }

    /// Data plane `r` of cluster `c` learns the others' latest messages it has not learned yet:
    /// their entries (last writer wins) and their loads, as `ilb_dataplane::replicas::learn`
    /// and `fold_loads` do.
    fn learn(&mut self, c: usize, r: usize, now_s: u32) {
        let replica = &mut self.clusters[c][r];
        let mut learned = false;
        for (sender, (number, deltas)) in self.latest[c].iter().enumerate() {
            let known = &mut replica.peers[sender];
            if sender == r || *number <= known.0 {
                continue;
            }
            for change in Deltas::changes(&deltas.affinity) {
                replica.affinity.learn(change, now_s);
            }
            known.0 = *number;
            known.1.clear();
            known.1.extend(
                deltas
                    .in_flight
                    .iter()
                    .filter_map(|&(tag, count)| Some((*self.engine_by_tag.get(&tag)?, count))),
            );
            learned = true;
        }
        if learned {
            replica.peer_in_flight.iter_mut().for_each(|count| *count = 0);
            for &(j, count) in replica.peers.iter().flat_map(|(_, counts)| counts) {
                replica.peer_in_flight[j] = replica.peer_in_flight[j].saturating_add(count);
            }
        }
    }
}
