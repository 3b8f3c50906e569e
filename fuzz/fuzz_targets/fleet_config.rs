//! Fuzz target: the control plane's fleet config, as a reload reads it (a TOML file an
//! operator edits while the control plane runs).
//!
//! Checks: a config that validates plans without panicking, and every snapshot the plan
//! would publish passes the data planes' validation and compiles into a routing table; so no
//! accepted config can make the control plane publish what data planes refuse.

#![no_main]

use ilb_core::snapshot::Snapshot;
use ilb_core::table::RoutingTable;
use ilb_planning::fleet::Fleet;
use ilb_planning::planner::Planner;
use ilb_planning::FleetConfig;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = toml::from_str::<FleetConfig>(text) else { return };
    if config.validate().is_err() {
        return;
    }
    let fleet = Fleet::new(config.clone());
    let mut planner = Planner::for_config(&config);
    let round = planner.plan(&fleet, Duration::from_secs(1));
    for (cluster, snapshot) in round.snapshots(&fleet, 1, 1) {
        let json = serde_json::to_vec(&snapshot).expect("a snapshot serialises");
        let parsed = Snapshot::from_json(&json)
            .unwrap_or_else(|e| panic!("cluster {cluster}: published snapshot refused: {e}"));
        RoutingTable::compile(&parsed, None).expect("a valid snapshot compiles");
    }
});
