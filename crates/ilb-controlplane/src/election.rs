//! One planner among the control-plane replicas, chosen through etcd (`--etcd URL`).
//!
//! Without etcd every replica plans and publishes on its own, and versions are wall-clock
//! milliseconds (`publish.rs`). With etcd the replicas agree on one plan by this rule:
//!
//! 1. Each replica holds an etcd lease (`lease_ttl_s`, kept alive every third of it) and
//!    campaigns with it through etcd's election API under `{prefix}/leader`. etcd makes the
//!    replica whose key is oldest the leader; its key's create revision is the **term**. A
//!    later leader's key was created later, so terms only grow.
//! 2. Only the leader publishes: each round gets version `2^52 + term·2^24 + n` (n counts the
//!    leader's rounds), is published locally and written to `{prefix}/round` in a transaction
//!    that succeeds only while the leader key still has that create revision. A replica whose
//!    write fails, whose keep-alive fails, or that has not had a keep-alive answer for a lease
//!    period (measured from when it was sent, so the lease cannot have lapsed earlier at etcd)
//!    stops publishing at once and campaigns again.
//! 3. Every replica watches `{prefix}/round` and publishes the leader's rounds as they are
//!    (same body, same version), so a data plane gets the same plan from whichever replica it
//!    polls. Followers keep solving (their `/v1/state` shows their own solve, and their planner
//!    stays warm for a takeover) but publish nothing of their own.
//!
//! A data plane installs a version only if it is at least the one it holds, and every version
//! of a later term is larger than every version of an earlier one: no plan of a deposed leader
//! is installed after one of its successor, whatever the clocks say. Versions start above the
//! wall-clock ones (2^52 > any Unix-ms time), so data planes move from a replica without etcd
//! to one with it; going back needs the data planes restarted.
//!
//! The engine holds (`guard.rs`) stay per replica: each follows its own scrapes.

use crate::api::ApiState;
use crate::etcd::etcdserverpb::kv_client::KvClient;
use crate::etcd::etcdserverpb::lease_client::LeaseClient;
use crate::etcd::etcdserverpb::watch_client::WatchClient;
use crate::etcd::etcdserverpb::{compare, request_op, watch_request};
use crate::etcd::etcdserverpb::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, PutRequest, RangeRequest,
    RangeResponse, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use crate::etcd::v3electionpb::election_client::ElectionClient;
use crate::etcd::v3electionpb::{CampaignRequest, LeaderKey};
use crate::events::Event;
use bytes::Bytes;
use ilb_core::snapshot::Snapshot;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_stream::{Stream, StreamExt};
use tonic::codec::Streaming;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

/// Versions under etcd start here, above every wall-clock (Unix ms) version.
pub const VERSION_BASE: u64 = 1 << 52;
// Above wall-clock versions until the year 2100.
const _: () = assert!(VERSION_BASE > 4_102_444_800_000);

/// Rounds one term can number (2^24: a year of rounds every two seconds).
const ROUNDS_PER_TERM: u64 = 1 << 24;

/// Largest round written to etcd (its default request limit is 1.5 MiB).
const MAX_ROUND_BYTES: usize = 1_400_000;

/// `[control_plane.etcd]` or `--etcd`: where the replicas elect their planner.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// etcd endpoints, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix of this control plane's election and rounds, e.g. `/ilb/prod`.
    pub prefix: String,
    /// Lease time to live: how long a dead leader holds the role.
    pub lease_ttl: Duration,
    /// This replica's name in the election (shown as the leader's value).
    pub name: String,
}

/// The leader's term and how long its lease surely lasts; `None` while following.
#[derive(Debug, Default)]
pub(crate) struct Leadership {
    inner: Mutex<Option<Term>>,
}

#[derive(Debug)]
struct Term {
    term: u64,
    leader_key: Vec<u8>,
    rounds: u64,
    /// Until when the lease is certainly alive at etcd (last keep-alive sent + ttl).
    valid_until: Instant,
}

impl Leadership {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Term>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The version of the next round this replica may publish, or `None` if it is not the
    /// leader or its lease may have lapsed (then it steps down at once).
    pub(crate) fn next_version(&self, now: Instant) -> Option<u64> {
        let mut inner = self.lock();
        let term = inner.as_mut()?;
        if now >= term.valid_until || term.rounds + 1 >= ROUNDS_PER_TERM {
            tracing::warn!(term = term.term, "leadership given up: lease not confirmed or term exhausted");
            *inner = None;
            return None;
        }
        term.rounds += 1;
        Some(VERSION_BASE + term.term * ROUNDS_PER_TERM + term.rounds)
    }

    /// The current term, if leading and the lease is still confirmed (a busy election task may
    /// not have stepped down yet when its lease's confirmation ran out).
    pub fn term(&self) -> Option<u64> {
        let now = crate::clock::now();
        self.lock().as_ref().filter(|t| now < t.valid_until).map(|t| t.term)
    }

    fn lead(&self, term: u64, leader_key: Vec<u8>, valid_until: Instant) {
        *self.lock() = Some(Term { term, leader_key, rounds: 0, valid_until });
    }

    fn confirm(&self, valid_until: Instant) {
        if let Some(term) = self.lock().as_mut() {
            term.valid_until = term.valid_until.max(valid_until);
        }
    }

    fn step_down(&self) {
        if let Some(term) = self.lock().take() {
            tracing::warn!(term = term.term, "no longer the leader; publishing stops");
        }
    }

    fn leader_key(&self) -> Option<(u64, Vec<u8>)> {
        self.lock().as_ref().map(|t| (t.term, t.leader_key.clone()))
    }
}

/// One published round as written to etcd.
#[derive(Serialize, Deserialize)]
pub(crate) struct Round {
    pub version: u64,
    pub snapshots: BTreeMap<String, Snapshot>,
}

/// What the election task shares with the control loop.
pub(crate) struct Election {
    pub leadership: Arc<Leadership>,
    /// The leader's newest round, for the election task to write to etcd.
    pub rounds: watch::Sender<Option<Bytes>>,
}

impl Election {
    /// Hands the leader's round (published here already) to the election task for etcd.
    pub(crate) fn share(&self, version: u64, snapshots: BTreeMap<String, Snapshot>) {
        match serde_json::to_vec(&Round { version, snapshots }) {
            Ok(bytes) => {
                self.rounds.send_replace(Some(Bytes::from(bytes)));
            }
            Err(e) => {
                tracing::error!(error = %e, "round does not serialize; followers keep the previous one")
            }
        }
    }
}

/// Runs the campaign, the keep-alives, the leader's writes and the followers' watch until
/// shutdown; reconnects after any failure (following meanwhile: nothing is published).
pub(crate) async fn run(
    options: EtcdOptions,
    leadership: Arc<Leadership>,
    mut rounds: watch::Receiver<Option<Bytes>>,
    state: Arc<ApiState>,
    events: mpsc::Sender<Event>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let publisher = &state.publisher;
        let session = Session { options: &options, leadership: &leadership, publisher, events: &events };
        let result = tokio::select! {
            r = session.run(&mut rounds) => r,
            _ = shutdown.changed() => Ok(()),
        };
        leadership.step_down();
        if *shutdown.borrow() {
            return;
        }
        if let Err(error) = result {
            tracing::warn!(%error, "etcd session ended; campaigning again");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = shutdown.changed() => return,
        }
    }
}

struct Session<'a> {
    options: &'a EtcdOptions,
    leadership: &'a Leadership,
    publisher: &'a crate::publish::Publisher,
    events: &'a mpsc::Sender<Event>,
}

impl Session<'_> {
    fn election_name(&self) -> String {
        format!("{}/leader", self.options.prefix)
    }

    fn round_key(&self) -> String {
        format!("{}/round", self.options.prefix)
    }

    /// One lease: campaign, keep it alive, write rounds while leading, follow the rounds.
    async fn run(&self, rounds: &mut watch::Receiver<Option<Bytes>>) -> Result<(), String> {
        let etcd = Etcd::connect(self.options)?;
        let ttl = self.options.lease_ttl;
        let lease = etcd.grant(ttl).await.map_err(|e| e.to_string())?;
        let (keeper, mut answers) = etcd.keep_alive(lease).await.map_err(|e| e.to_string())?;
        let campaign = etcd.campaign(self.election_name(), self.options.name.clone(), lease);
        let mut campaign = std::pin::pin!(campaign);
        let mut follower = std::pin::pin!(self.follow(&etcd));
        let mut elected = false;
        let mut tick = tokio::time::interval(ttl / 3);
        let mut sent_at = crate::clock::now();
        let mut confirmed_until = sent_at + ttl;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    sent_at = crate::clock::now();
                    let renew = LeaseKeepAliveRequest { id: lease };
                    keeper.send(renew).await.map_err(|e| format!("lease keep-alive: {e}"))?;
                }
                answer = answers.message() => match answer {
                    Ok(Some(a)) if a.ttl > 0 => {
                        confirmed_until = sent_at + ttl;
                        self.leadership.confirm(confirmed_until);
                    }
                    Ok(_) => return Err("lease expired".into()),
                    Err(e) => return Err(format!("lease keep-alive: {e}")),
                },
                _ = tokio::time::sleep_until(confirmed_until) => return Err("lease not confirmed within its ttl".into()),
                won = &mut campaign, if !elected => {
                    let won = won.map_err(|e| format!("campaign: {e}"))?;
                    let leader = won.ok_or("campaign answered without a leader key")?;
                    elected = true;
                    self.leadership.lead(leader.rev as u64, leader.key, confirmed_until);
                    tracing::info!(term = leader.rev, name = %self.options.name, "elected the planning leader");
                    // Plan at once rather than at the next tick.
                    let _ = self.events.send(Event::Elected).await;
                }
                changed = rounds.changed(), if elected => {
                    changed.map_err(|_| "the control loop stopped".to_string())?;
                    let round = rounds.borrow_and_update().clone();
                    if let Some(round) = round {
                        self.write(&etcd, round).await?;
                    }
                }
                ended = &mut follower => return ended,
            }
        }
    }

    /// Writes the leader's round, only while its leader key is the one it was elected with.
    async fn write(&self, etcd: &Etcd, round: Bytes) -> Result<(), String> {
        let Some((term, leader_key)) = self.leadership.leader_key() else { return Ok(()) };
        if round.len() > MAX_ROUND_BYTES {
            tracing::error!(bytes = round.len(), "round too large for etcd; followers keep the previous one");
            return Ok(());
        }
        let written = etcd
            .put_if_leader(leader_key, term as i64, self.round_key(), round.to_vec())
            .await
            .map_err(|e| format!("writing the round: {e}"))?;
        if !written {
            self.leadership.step_down();
            return Err("deposed: the leader key is gone".into());
        }
        Ok(())
    }

    /// Publishes every round the leader writes (this replica's own too, which changes nothing).
    async fn follow(&self, etcd: &Etcd) -> Result<(), String> {
        let key = self.round_key();
        let current = etcd.get(key.clone()).await.map_err(|e| format!("reading the round: {e}"))?;
        let mut from = current.header.map_or(0, |h| h.revision) + 1;
        if let Some(kv) = current.kvs.first() {
            self.adopt(&kv.value);
        }
        // The watch lasts while `_requests` (its request stream) is open.
        let (_requests, mut answers) =
            etcd.watch(key, from).await.map_err(|e| format!("watching the round: {e}"))?;
        while let Some(answer) = answers.message().await.map_err(|e| format!("watching the round: {e}"))? {
            if answer.canceled {
                tracing::warn!(reason = %answer.cancel_reason, "etcd canceled the round's watch");
                break;
            }
            for event in answer.events {
                if let Some(kv) = event.kv.filter(|kv| !kv.value.is_empty()) {
                    from = from.max(kv.mod_revision + 1);
                    self.adopt(&kv.value);
                }
            }
        }
        Err(format!("the round's watch ended (next revision {from})"))
    }

    fn adopt(&self, value: &[u8]) {
        match serde_json::from_slice::<Round>(value) {
            Ok(round) => {
                if self.publisher.publish_if_newer(round.version, &round.snapshots) {
                    tracing::debug!(version = round.version, "the leader's round published");
                }
            }
            Err(e) => tracing::error!(error = %e, "the round in etcd is not a round; ignored"),
        }
    }
}

/// The etcd calls of a session, over one channel balanced across the endpoints (it connects
/// lazily, with a connect timeout of 2 s). Every call but the campaign, which waits until this
/// replica is elected, must answer within the lease ttl (at least 2 s).
struct Etcd {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    watch: WatchClient<Channel>,
    election: ElectionClient<Channel>,
    timeout: Duration,
}

impl Etcd {
    /// The clients of the endpoints' channel (nothing connects before the first call).
    fn connect(options: &EtcdOptions) -> Result<Etcd, String> {
        if options.endpoints.is_empty() {
            return Err("no etcd endpoints".into());
        }
        let mut endpoints = Vec::with_capacity(options.endpoints.len());
        for url in &options.endpoints {
            let endpoint =
                Endpoint::from_shared(url.clone()).map_err(|e| format!("etcd endpoint '{url}': {e}"))?;
            endpoints.push(endpoint.connect_timeout(Duration::from_secs(2)));
        }
        let channel = Channel::balance_list(endpoints.into_iter());
        Ok(Etcd {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            election: ElectionClient::new(channel),
            timeout: options.lease_ttl.max(Duration::from_secs(2)),
        })
    }

    /// A new lease of `ttl` (whole seconds); its id.
    async fn grant(&self, ttl: Duration) -> Result<i64, Status> {
        let request = LeaseGrantRequest { ttl: ttl.as_secs() as i64, id: 0 };
        Ok(self.answer(self.lease.clone().lease_grant(request)).await?.id)
    }

    /// The lease's keep-alive stream, its first request sent: each `LeaseKeepAliveRequest` sent
    /// on the sender renews the lease, and etcd answers each with the lease's ttl (0 or less: the
    /// lease has expired).
    async fn keep_alive(
        &self,
        lease: i64,
    ) -> Result<(mpsc::Sender<LeaseKeepAliveRequest>, Streaming<LeaseKeepAliveResponse>), Status> {
        let (requests, stream) = request_stream(LeaseKeepAliveRequest { id: lease });
        Ok((requests, self.answer(self.lease.clone().lease_keep_alive(stream)).await?))
    }

    /// Campaigns for `name` with the lease, until elected (no timeout: a follower waits here
    /// while the leader's lease lives): the leader key then held (its `rev` is the term).
    async fn campaign(&self, name: String, value: String, lease: i64) -> Result<Option<LeaderKey>, Status> {
        let request = CampaignRequest { name: name.into_bytes(), lease, value: value.into_bytes() };
        Ok(self.election.clone().campaign(request).await?.into_inner().leader)
    }

    /// Puts `value` at `key` if the leader key still has the create revision `term`; whether it
    /// did.
    async fn put_if_leader(
        &self,
        leader_key: Vec<u8>,
        term: i64,
        key: String,
        value: Vec<u8>,
    ) -> Result<bool, Status> {
        let still_leader = Compare {
            result: compare::CompareResult::Equal as i32,
            target: compare::CompareTarget::Create as i32,
            key: leader_key,
            range_end: Vec::new(),
            target_union: Some(compare::TargetUnion::CreateRevision(term)),
        };
        let put = PutRequest { key: key.into_bytes(), value, ..PutRequest::default() };
        let request = TxnRequest {
            compare: vec![still_leader],
            success: vec![RequestOp { request: Some(request_op::Request::RequestPut(put)) }],
            failure: Vec::new(),
        };
        Ok(self.answer(self.kv.clone().txn(request)).await?.succeeded)
    }

    /// The key's value, if any, and the store's revision.
    async fn get(&self, key: String) -> Result<RangeResponse, Status> {
        let request = RangeRequest { key: key.into_bytes(), ..RangeRequest::default() };
        self.answer(self.kv.clone().range(request)).await
    }

    /// Watches the key from `start_revision`. etcd ends the watch when the request stream
    /// closes: keep the returned sender while watching.
    async fn watch(
        &self,
        key: String,
        start_revision: i64,
    ) -> Result<(mpsc::Sender<WatchRequest>, Streaming<WatchResponse>), Status> {
        let create =
            WatchCreateRequest { key: key.into_bytes(), start_revision, ..WatchCreateRequest::default() };
        let (requests, stream) = request_stream(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
        });
        Ok((requests, self.answer(self.watch.clone().watch(stream)).await?))
    }

    /// A call's answer (for a stream: once it starts), or DEADLINE_EXCEEDED after the timeout.
    async fn answer<T>(
        &self,
        call: impl std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    ) -> Result<T, Status> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(answer) => Ok(answer?.into_inner()),
            Err(_) => {
                Err(Status::deadline_exceeded(format!("etcd did not answer within {:?}", self.timeout)))
            }
        }
    }
}

/// A gRPC request stream that starts with `first`, goes on with what is sent on the sender, and
/// ends when the sender is dropped.
fn request_stream<T: Send + 'static>(first: T) -> (mpsc::Sender<T>, impl Stream<Item = T> + Send + 'static) {
    let (sender, receiver) = mpsc::channel(16);
    (sender, tokio_stream::once(first).chain(tokio_stream::wrappers::ReceiverStream::new(receiver)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_grow_with_the_term_and_stop_when_the_lease_is_unconfirmed() {
        let leadership = Leadership::default();
        let now = crate::clock::now();
        assert_eq!(leadership.next_version(now), None, "a follower publishes nothing");
        leadership.lead(7, b"k7".to_vec(), now + Duration::from_secs(2));
        let first = leadership.next_version(now).expect("leading");
        assert_eq!(first, VERSION_BASE + 7 * ROUNDS_PER_TERM + 1);
        assert_eq!(leadership.next_version(now), Some(first + 1));
        // A later term beats every round of an earlier one.
        let later = Leadership::default();
        later.lead(8, b"k8".to_vec(), now + Duration::from_secs(2));
        assert!(
            later.next_version(now).expect("leading")
                > VERSION_BASE + 7 * ROUNDS_PER_TERM + ROUNDS_PER_TERM - 1
        );
        // The lease not confirmed in time: steps down, for good.
        assert_eq!(leadership.next_version(now + Duration::from_secs(2)), None);
        assert_eq!(leadership.term(), None);
    }
}
