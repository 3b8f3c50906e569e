//! Identifier newtypes. Plain strings on the wire; distinct types in code so that an engine id
//! can never be passed where a cluster id is expected.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            pub fn new(s: impl Into<String>) -> Self {
                Self(s.into())
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self(s.to_owned())
            }
        }
    };
}

string_id!(
    /// An inference engine (one serving endpoint, possibly many replicas behind it).
    EngineId
);
string_id!(
    /// A front-end cluster, where a data plane runs.
    ClusterId
);
string_id!(
    /// A served model name, as clients put it in the `model` field.
    ModelName
);
string_id!(
    /// A traffic class within one cluster and model (e.g. `default`, `eu-resident`).
    ClassId
);

/// Monotonically increasing snapshot version. A data plane never installs a version lower
/// than the one it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct SnapshotVersion(pub u64);

impl fmt::Display for SnapshotVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
