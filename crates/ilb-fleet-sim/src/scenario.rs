//! Scenario files: the TOML a user writes ([`ScenarioFile`], unknown fields rejected) and the
//! validated, index-resolved [`Scenario`] the simulator runs. Every doc comment on a field is
//! user documentation (see `docs/simulate.md`); every validation error names the field.

mod random;
mod raw;
mod validate;

pub use random::{random_fleet, RANDOM_POLICIES};
pub use raw::*;
pub use validate::{allows as validate_allows, Scenario, ScenarioError, SimEngineSpec, Stream};

/// Every policy the simulator knows, in the order reports list them.
pub const POLICIES: [&str; 6] = ["round-robin", "random", "nearest", "least-loaded", "feedback", "ilb"];

impl Scenario {
    /// Parses and validates a scenario from TOML text.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| ScenarioError(format!("{e}")))?;
        Scenario::new(file)
    }
}
