//! The wire format of what one data-plane replica tells the others of its cluster: entries of
//! its affinity table and of its stored-response table that changed, and its requests in
//! flight per engine.
//!
//! Replicas behind one Service each see only the requests that reach them. Without this, a
//! follow-up that lands on a replica which did not place its conversation goes where that
//! replica's own table and counts say, away from the engine holding its KV cache. A delta
//! names an engine by its [`crate::affinity::affinity_tag`], which every replica derives from
//! the engine's id, so replicas with different snapshot versions still agree on it.
//!
//! The format is JSON (`{"instance": "...", "affinity": [[key, tag], ...], "responses":
//! [...], "in_flight": [[tag, count], ...]}`). A message is untrusted input: [`Deltas::parse`]
//! refuses one that is malformed, too long or names tag 0, and says why.

use crate::affinity::Change;
use serde::{Deserialize, Serialize};

/// Most entries of each list one message may carry.
pub const MAX_ENTRIES: usize = 1 << 15;

/// Longest instance name, bytes.
pub const MAX_INSTANCE_BYTES: usize = 128;

/// Largest message, bytes: room for [`MAX_ENTRIES`] in each list.
pub const MAX_BYTES: usize = 4 << 20;

/// One replica's changes since its previous message, and its load.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deltas {
    /// The sending replica (random per process), so that a replica ignores its own messages
    /// and keeps one load figure per peer.
    pub instance: String,
    /// Affinity keys and the engine (tag) that now holds each conversation.
    #[serde(default)]
    pub affinity: Vec<(u64, u32)>,
    /// Stored-response keys and the engine (tag) that stored each response.
    #[serde(default)]
    pub responses: Vec<(u64, u32)>,
    /// Requests the sender has in flight, per engine tag (engines without any left out).
    #[serde(default)]
    pub in_flight: Vec<(u32, u32)>,
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeltasError {
    #[error("deltas message is {0} bytes, more than {MAX_BYTES}")]
    TooLarge(usize),
    #[error("malformed deltas message: {0}")]
    Json(#[from] serde_json::Error),
    #[error("deltas message: instance must be 1 to {MAX_INSTANCE_BYTES} bytes")]
    Instance,
    #[error("deltas message: {list} has {len} entries, more than {MAX_ENTRIES}")]
    TooMany { list: &'static str, len: usize },
    #[error("deltas message: {list} names engine tag 0, which no engine has")]
    ZeroTag { list: &'static str },
}

impl Deltas {
    /// Parses and checks a message.
    pub fn parse(bytes: &[u8]) -> Result<Deltas, DeltasError> {
        if bytes.len() > MAX_BYTES {
            return Err(DeltasError::TooLarge(bytes.len()));
        }
        let deltas: Deltas = serde_json::from_slice(bytes)?;
        deltas.validate()?;
        Ok(deltas)
    }

    /// Checks the limits (a sender keeps within them too).
    pub fn validate(&self) -> Result<(), DeltasError> {
        if self.instance.is_empty() || self.instance.len() > MAX_INSTANCE_BYTES {
            return Err(DeltasError::Instance);
        }
        let lists = [
            ("affinity", self.affinity.len(), self.affinity.iter().any(|&(_, t)| t == 0)),
            ("responses", self.responses.len(), self.responses.iter().any(|&(_, t)| t == 0)),
            ("in_flight", self.in_flight.len(), self.in_flight.iter().any(|&(t, _)| t == 0)),
        ];
        for (list, len, zero) in lists {
            if len > MAX_ENTRIES {
                return Err(DeltasError::TooMany { list, len });
            }
            if zero {
                return Err(DeltasError::ZeroTag { list });
            }
        }
        Ok(())
    }

    /// Whether the message carries nothing but an instance name.
    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty() && self.responses.is_empty() && self.in_flight.is_empty()
    }

    /// A table's changes as a list of this format, the newest [`MAX_ENTRIES`] at most.
    pub fn list(changes: &[Change]) -> Vec<(u64, u32)> {
        let from = changes.len().saturating_sub(MAX_ENTRIES);
        changes[from..].iter().map(|c| (c.key_hash, c.engine_tag)).collect()
    }

    /// A list of this format as changes to learn.
    pub fn changes(list: &[(u64, u32)]) -> impl Iterator<Item = Change> + '_ {
        list.iter().map(|&(key_hash, engine_tag)| Change { key_hash, engine_tag })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, expected: Result<(), &str>) {
        let parsed = Deltas::parse(json.as_bytes()).map(|_| ()).map_err(|e| e.to_string());
        match (parsed, expected) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) => assert!(got.contains(want), "{got:?} should say {want:?}"),
            (got, want) => panic!("{json}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn parses_good_messages_and_refuses_bad_ones_with_the_reason() {
        check(r#"{"instance":"a","affinity":[[18446744073709551615,7]],"in_flight":[[7,3]]}"#, Ok(()));
        check(r#"{"instance":"a"}"#, Ok(()));
        check(r#"{"instance":""}"#, Err("instance must be"));
        check(r#"{"instance":"a","affinity":[[1,0]]}"#, Err("affinity names engine tag 0"));
        check(r#"{"instance":"a","in_flight":[[0,1]]}"#, Err("in_flight names engine tag 0"));
        check(r#"{"instance":"a","affinity":[[1]]}"#, Err("malformed"));
        check(r#"{"instance":"a","affinity":[[-1,2]]}"#, Err("malformed"));
        check(r#"{"instance":"a","extra":1}"#, Err("unknown field"));
        check("not json", Err("malformed"));
        let long = format!(r#"{{"instance":"{}"}}"#, "x".repeat(MAX_INSTANCE_BYTES + 1));
        check(&long, Err("instance must be"));
    }

    #[test]
    fn refuses_oversized_messages() {
        let too_many =
            Deltas { instance: "a".into(), responses: vec![(1, 1); MAX_ENTRIES + 1], ..Default::default() };
        let json = serde_json::to_string(&too_many).expect("serialises");
        check(&json, Err("responses has 32769 entries"));
        check(&" ".repeat(MAX_BYTES + 1), Err("more than 4194304"));
    }

    #[test]
    fn round_trips_and_keeps_the_newest_entries() {
        let changes: Vec<Change> =
            (0..MAX_ENTRIES as u64 + 2).map(|k| Change { key_hash: k, engine_tag: 1 }).collect();
        let list = Deltas::list(&changes);
        assert_eq!(list.len(), MAX_ENTRIES);
        assert_eq!(list[0].0, 2, "the oldest two dropped");
        let deltas = Deltas { instance: "a".into(), affinity: list, ..Default::default() };
        let json = serde_json::to_vec(&deltas).expect("serialises");
        assert_eq!(Deltas::parse(&json).expect("parses"), deltas);
    }
}
