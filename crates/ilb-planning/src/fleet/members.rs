//! Where the fleet's engines come from, and how the set changes while the control plane runs.
//!
//! Three sources make up the engine set the planner sees (the `engines` of the effective
//! [`FleetConfig`]): the config file's `[[engines]]`, registrations with leases
//! (`POST /v1/engines`, renewed by the same call, removed by `DELETE` or when the lease runs
//! out), and discovery groups (`[[engine_groups]]`, see `crate::discovery`). An id belongs to
//! one source: a registration may not take the id of a file or discovered engine.
//!
//! Pure state like the rest of [`crate::fleet`]: every call takes `now`, and only the control
//! loop owns a [`Members`].

use crate::config::{Engine, FleetConfig};
use crate::fleet::Now;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest lease a registration may ask for, s.
pub const MAX_TTL_S: f64 = 3600.0;

/// The body of `POST /v1/engines`: register an engine, or renew its lease (the heartbeat).
/// Fields as in `[[engines]]`, plus the lease's length.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Registration {
    pub id: String,
    /// Base URL, `http://host:port`.
    pub url: String,
    pub model: String,
    pub region: String,
    /// Name of a configured `[profiles.NAME]`.
    pub profile: String,
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub residency: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_rps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// The lease, s, in (0, 3600]: without a renewal within it the engine is removed.
    pub ttl_s: f64,
}

fn one() -> u32 {
    1
}

impl Registration {
    pub fn engine(&self) -> Engine {
        Engine {
            id: self.id.clone(),
            url: self.url.clone(),
            model: self.model.clone(),
            region: self.region.clone(),
            profile: self.profile.clone(),
            replicas: self.replicas,
            capabilities: self.capabilities.clone(),
            residency: self.residency.clone(),
            capacity_rps: self.capacity_rps,
            max_in_flight: self.max_in_flight,
        }
    }
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// A field is invalid; the message names it (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// The id belongs to an engine of another source (HTTP 409).
    #[error("{0}")]
    Conflict(String),
}

/// What a registration did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RegisterOutcome {
    /// A new engine.
    Registered,
    /// The same engine again: only the lease was renewed.
    Renewed,
    /// A known id with changed fields: the engine is replaced and the lease renewed.
    Changed,
}

struct Lease {
    engine: Engine,
    ttl: Duration,
    registered: Now,
    renewed: Now,
}

/// The state of the configuration file as the control plane last read it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConfigStatus {
    /// Valid files applied since start (the first one included).
    pub applied: u64,
    /// When the running file was applied, Unix ms.
    pub applied_unix_ms: u64,
    /// The latest file that was refused, if it came after the running one.
    pub rejected: Option<Rejection>,
    /// Settings of the latest file that only take effect after a restart.
    pub needs_restart: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Rejection {
    /// Why, naming the field: "engines.e1.profile: unknown profile 'h200'".
    pub reason: String,
    pub unix_ms: u64,
}

/// `/v1/state`'s `membership`: where each engine came from, and the config file's state.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MembershipView {
    pub config: ConfigStatus,
    pub engines: Vec<MemberView>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MemberView {
    pub id: String,
    pub url: String,
    /// `config`, `registered` or `discovered`.
    pub source: &'static str,
    /// The discovery group of a discovered engine.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Time since the lease was last renewed, ms (registered engines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_age_ms: Option<u64>,
    /// The lease's length, ms (registered engines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_ttl_ms: Option<u64>,
    /// Time since the engine first registered, ms (registered engines).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_age_ms: Option<u64>,
}

/// The engine set's sources.
pub struct Members {
    file: FleetConfig,
    leases: BTreeMap<String, Lease>,
    /// Discovered engines by group id.
    discovered: BTreeMap<String, Vec<Engine>>,
    pub status: ConfigStatus,
}

impl Members {
    /// `file` must have passed [`FleetConfig::validate`].
    pub fn new(file: FleetConfig, unix_ms: u64) -> Members {
        Members {
            file,
            leases: BTreeMap::new(),
            discovered: BTreeMap::new(),
            status: ConfigStatus { applied: 1, applied_unix_ms: unix_ms, ..ConfigStatus::default() },
        }
    }

    /// The configuration as the file gave it (without registered or discovered engines).
    pub fn file(&self) -> &FleetConfig {
        &self.file
    }

    /// The file's configuration with every registered and discovered engine added: file
    /// engines first, then registered ones by id, then each group's discovered ones.
    pub fn effective(&self) -> FleetConfig {
        let mut config = self.file.clone();
        config.engines.extend(self.leases.values().map(|l| l.engine.clone()));
        for engines in self.discovered.values() {
            for e in engines {
                if !config.engines.iter().any(|known| known.id == e.id) {
                    config.engines.push(e.clone());
                }
            }
        }
        config
    }

    fn owner_of(&self, id: &str) -> Option<String> {
        if self.file.engines.iter().any(|e| e.id == id) {
            return Some("the config file".into());
        }
        self.discovered
            .iter()
            .find(|(_, engines)| engines.iter().any(|e| e.id == id))
            .map(|(group, _)| format!("discovery group '{group}'"))
    }

    /// Registers an engine or renews its lease.
    pub fn register(
        &mut self,
        now: Now,
        registration: Registration,
    ) -> Result<RegisterOutcome, RegisterError> {
        let ttl = registration.ttl_s;
        if !(ttl.is_finite() && ttl > 0.0 && ttl <= MAX_TTL_S) {
            return Err(RegisterError::Invalid(format!("ttl_s: {ttl} is not in (0, {MAX_TTL_S}]")));
        }
        let engine = registration.engine();
        // A registering engine runs: unlike the file, a registration may not say zero replicas.
        ilb_core::bounds::check_count("replicas", u64::from(engine.replicas), &ilb_core::bounds::REPLICAS)
            .map_err(|e| RegisterError::Invalid(e.to_string()))?;
        self.file.validate_engine(&engine, "registration").map_err(|e| RegisterError::Invalid(e.0))?;
        if let Some(owner) = self.owner_of(&engine.id) {
            return Err(RegisterError::Conflict(format!(
                "id: engine '{}' is already defined by {owner}",
                engine.id
            )));
        }
        let ttl = Duration::from_secs_f64(ttl);
        match self.leases.get_mut(&engine.id) {
            Some(lease) => {
                lease.renewed = now;
                lease.ttl = ttl;
                if lease.engine == engine {
                    Ok(RegisterOutcome::Renewed)
                } else {
                    lease.engine = engine;
                    Ok(RegisterOutcome::Changed)
                }
            }
            None => {
                self.leases.insert(engine.id.clone(), Lease { engine, ttl, registered: now, renewed: now });
                Ok(RegisterOutcome::Registered)
            }
        }
    }

    /// Removes a registered engine now; false if no such registration.
    pub fn deregister(&mut self, id: &str) -> bool {
        self.leases.remove(id).is_some()
    }

    /// Removes registrations whose lease ran out; returns their ids.
    pub fn expire(&mut self, now: Now) -> Vec<String> {
        let expired: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| now.saturating_sub(l.renewed) > l.ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &expired {
            self.leases.remove(id);
        }
        expired
    }

    /// Replaces the file's configuration (which must have passed [`FleetConfig::validate`]).
    /// Registrations the new file makes invalid (their profile or region is gone, or a file
    /// engine now has their id) and groups it no longer declares are dropped; returns what was
    /// dropped and why.
    pub fn set_file(&mut self, file: FleetConfig, unix_ms: u64) -> Vec<String> {
        self.file = file;
        self.status.applied += 1;
        self.status.applied_unix_ms = unix_ms;
        self.status.rejected = None;
        let mut dropped = Vec::new();
        let file = &self.file;
        self.leases.retain(|id, lease| {
            let why = if file.engines.iter().any(|e| e.id == *id) {
                Some("the config file now defines this id".to_owned())
            } else {
                file.validate_engine(&lease.engine, "registration").err().map(|e| e.0)
            };
            match why {
                Some(why) => {
                    dropped.push(format!("registered engine '{id}' dropped: {why}"));
                    false
                }
                None => true,
            }
        });
        self.discovered.retain(|group, _| {
            let keep = file.engine_groups.iter().any(|g| g.id == *group);
            if !keep {
                dropped.push(format!("discovery group '{group}' removed"));
            }
            keep
        });
        dropped
    }

    /// Records a refused config file; the running configuration stays.
    pub fn reject(&mut self, reason: String, unix_ms: u64) {
        self.status.rejected = Some(Rejection { reason, unix_ms });
    }

    /// Replaces the engines discovered for `group`; true if they changed. Ignored (false) for
    /// a group the file does not declare (a resolution that raced a reload).
    pub fn set_discovered(&mut self, group: &str, engines: Vec<Engine>) -> bool {
        if !self.file.engine_groups.iter().any(|g| g.id == group) {
            return false;
        }
        let previous = self.discovered.insert(group.to_owned(), engines);
        previous.as_ref() != self.discovered.get(group)
    }

    /// Registered engine ids.
    pub fn registered(&self) -> impl Iterator<Item = &str> {
        self.leases.keys().map(String::as_str)
    }

    pub fn view(&self, now: Now) -> MembershipView {
        let ms = |d: Duration| d.as_millis() as u64;
        let mut engines: Vec<MemberView> = self
            .file
            .engines
            .iter()
            .map(|e| MemberView {
                id: e.id.clone(),
                url: e.url.clone(),
                source: "config",
                group: None,
                lease_age_ms: None,
                lease_ttl_ms: None,
                registered_age_ms: None,
            })
            .collect();
        engines.extend(self.leases.values().map(|l| MemberView {
            id: l.engine.id.clone(),
            url: l.engine.url.clone(),
            source: "registered",
            group: None,
            lease_age_ms: Some(ms(now.saturating_sub(l.renewed))),
            lease_ttl_ms: Some(ms(l.ttl)),
            registered_age_ms: Some(ms(now.saturating_sub(l.registered))),
        }));
        for (group, list) in &self.discovered {
            engines.extend(list.iter().map(|e| MemberView {
                id: e.id.clone(),
                url: e.url.clone(),
                source: "discovered",
                group: Some(group.clone()),
                lease_age_ms: None,
                lease_ttl_ms: None,
                registered_age_ms: None,
            }));
        }
        MembershipView { config: self.status.clone(), engines }
    }
}
