//! Applying a new engine set or new settings to a running [`Fleet`] as a diff: engines that did
//! not change keep their signals, fitted history, penalties and measured round trips; new
//! engines start empty; removed engines are forgotten.

use super::{EngineRuntime, Fleet};
use crate::config::FleetConfig;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// What [`Fleet::apply_config`] changed, by engine id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Same id, other fields. Those with a new URL, model or profile start with fresh signals
    /// (they are another engine as far as measurements go) and are in `reset` too.
    pub changed: Vec<String>,
    pub reset: Vec<String>,
}

impl FleetDiff {
    /// No engine was added, removed or changed.
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty() && self.changed.is_empty()
    }
}

impl Fleet {
    /// Replaces the configuration (which must have passed [`FleetConfig::validate`]) and
    /// carries every engine's runtime state over by id. Reports of clusters that no longer
    /// exist are dropped; a new smoothing time constant applies to every average from now on.
    pub fn apply_config(&mut self, config: FleetConfig) -> FleetDiff {
        self.apply_config_at(config, None)
    }

    /// As [`Fleet::apply_config`] at `now`: new engines count as up until the staleness bound
    /// has passed since `now` without a scrape (see [`Fleet::health`]).
    pub fn apply_config_at(&mut self, config: FleetConfig, now: Option<super::Now>) -> FleetDiff {
        let tau = Duration::from_millis(config.control_plane.smoothing_ms);
        let mut diff = FleetDiff::default();
        let old_configs = std::mem::take(&mut self.config.engines);
        let old_runtimes = std::mem::take(&mut self.engines);
        let mut old: HashMap<String, (crate::config::Engine, EngineRuntime)> =
            old_configs.into_iter().zip(old_runtimes).map(|(c, r)| (c.id.clone(), (c, r))).collect();
        let mut engines = Vec::with_capacity(config.engines.len());
        for e in &config.engines {
            let runtime = match old.remove(&e.id) {
                None => {
                    diff.added.push(e.id.clone());
                    EngineRuntime { added: now, ..EngineRuntime::new(tau) }
                }
                Some((previous, runtime)) => {
                    if previous != *e {
                        diff.changed.push(e.id.clone());
                    }
                    if previous.url != e.url || previous.model != e.model || previous.profile != e.profile {
                        diff.reset.push(e.id.clone());
                        EngineRuntime { added: now, ..EngineRuntime::new(tau) }
                    } else {
                        let mut runtime = runtime;
                        runtime.set_tau(tau);
                        runtime
                    }
                }
            };
            engines.push(runtime);
        }
        diff.removed = old.into_keys().collect();
        diff.removed.sort();
        let reset: HashSet<&str> = diff.reset.iter().chain(&diff.removed).map(String::as_str).collect();
        self.rtt.retain(|(_, engine), _| !reset.contains(engine.as_str()));
        for rtt in self.rtt.values_mut() {
            rtt.set_tau(tau);
        }
        let clusters: HashSet<&str> = config.clusters.iter().map(|c| c.id.as_str()).collect();
        self.instances.retain(|(cluster, _), _| clusters.contains(cluster.as_str()));
        self.engine_index = config.engines.iter().enumerate().map(|(idx, e)| (e.id.clone(), idx)).collect();
        self.engines = engines;
        self.config = config;
        diff
    }

    /// The index of engine `id`, if it is in the fleet.
    pub fn engine_idx(&self, id: &str) -> Option<usize> {
        self.engine_index.get(id).copied()
    }
}

impl EngineRuntime {
    fn set_tau(&mut self, tau: Duration) {
        for ewma in [
            &mut self.ttft_ms,
            &mut self.tbot_ms,
            &mut self.request_rate,
            &mut self.cache_hit_rate,
            &mut self.error_rate,
        ] {
            ewma.set_tau(tau);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Engine;

    fn config(engines: &[(&str, &str)]) -> FleetConfig {
        let mut text = String::from(
            "[[clusters]]\nid = \"a\"\nregion = \"a\"\n[profiles.gpu]\ncapacity_rps = 10.0\nttft_t0_ms = 30.0\nttft_b_ms = 10.0\n",
        );
        for (id, url) in engines {
            text.push_str(&format!(
                "[[engines]]\nid = \"{id}\"\nurl = \"{url}\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n"
            ));
        }
        let config: FleetConfig = toml::from_str(&text).unwrap();
        config.validate().unwrap();
        config
    }

    #[test]
    fn unchanged_engines_keep_their_state_and_new_or_moved_ones_start_afresh() {
        let mut fleet =
            Fleet::new(config(&[("e0", "http://h:1"), ("e1", "http://h:2"), ("e2", "http://h:3")]));
        for (idx, e) in fleet.engines.iter_mut().enumerate() {
            e.penalty = 0.1 * (idx + 1) as f64;
            e.ttft_ms.update(Duration::from_secs(1), 50.0 + idx as f64);
        }
        let mut next = config(&[("e2", "http://h:3"), ("e1", "http://h:9"), ("e3", "http://h:4")]);
        next.engines[0].replicas = 2;
        let diff = fleet.apply_config(next);
        assert_eq!(diff.added, vec!["e3"]);
        assert_eq!(diff.removed, vec!["e0"]);
        assert_eq!(diff.changed, vec!["e2", "e1"]);
        assert_eq!(diff.reset, vec!["e1"]);
        let by_id = |fleet: &Fleet, id: &str| fleet.engine_idx(id).unwrap();
        // e2 changed only its replicas: its signals and penalty stay.
        let e2 = &fleet.engines[by_id(&fleet, "e2")];
        assert_eq!((e2.penalty, e2.ttft_ms.value()), (0.30000000000000004, Some(52.0)));
        // e1 moved to another URL: another engine as far as measurements go.
        let e1 = &fleet.engines[by_id(&fleet, "e1")];
        assert_eq!((e1.penalty, e1.ttft_ms.value()), (0.0, None));
        let e3 = &fleet.engines[by_id(&fleet, "e3")];
        assert_eq!((e3.penalty, e3.ttft_ms.value()), (0.0, None));
        assert_eq!(fleet.engine_idx("e0"), None);
        assert_eq!(
            fleet.config.engines.iter().map(|e: &Engine| e.id.as_str()).collect::<Vec<_>>(),
            ["e2", "e1", "e3"]
        );
        assert_eq!(fleet.nominal_capacity(by_id(&fleet, "e2")), 20.0);
        assert!(fleet.apply_config(fleet.config.clone()).is_empty());
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    #[test]
    fn an_engine_that_joins_late_counts_as_up_until_the_staleness_bound_passes_unscraped() {
        let text = "[[clusters]]\nid = \"a\"\nregion = \"a\"\n[profiles.gpu]\ncapacity_rps = 10.0\nttft_t0_ms = 30.0\nttft_b_ms = 10.0\n\
                    [[engines]]\nid = \"e0\"\nurl = \"http://h:1\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n";
        let config: FleetConfig = toml::from_str(text).unwrap();
        let mut fleet = Fleet::new(config.clone());
        let stale = Duration::from_millis(fleet.config.control_plane.signal_stale_ms);
        let joined = stale * 10;
        let mut next = config;
        let mut e1 = next.engines[0].clone();
        e1.id = "e1".into();
        e1.url = "http://h:2".into();
        next.engines.push(e1);
        fleet.apply_config_at(next, Some(joined));
        let e1 = fleet.engine_idx("e1").unwrap();
        assert_eq!(fleet.health(e1, joined), 1.0, "a new engine is planned before its first scrape");
        assert_eq!(fleet.health(e1, joined + stale), 1.0);
        assert_eq!(fleet.health(e1, joined + stale * 2), 0.0, "never scraped for longer than the bound");
        // An engine there from the start had its grace at start.
        assert_eq!(fleet.health(fleet.engine_idx("e0").unwrap(), joined), 0.0);
    }
}
