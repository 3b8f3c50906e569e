//! Fuzz target: engine registrations (`POST /v1/engines` bodies), which come from the network.
//!
//! A body is parsed as the API parses it and handed to the membership as the control loop
//! does. Checks: a registration that is accepted leaves a fleet config that still validates,
//! with every number inside `ilb_core::bounds`; a refusal never echoes the password or query
//! of the URL it was given (`ilb_core::redact`).

#![no_main]

use ilb_planning::fleet::members::{Members, RegisterError, Registration};
use ilb_planning::FleetConfig;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;
use std::time::Duration;

const FLEET: &str = r#"
[control_plane]
token = "fuzz-token"
[[regions]]
id = "a"
lat = 50.0
lon = 8.0
[[clusters]]
id = "a"
region = "a"
[profiles.gpu]
capacity_rps = 10.0
ttft_t0_ms = 50.0
ttft_b_ms = 10.0
[[engines]]
id = "e0"
url = "http://127.0.0.1:9000"
model = "m"
region = "a"
profile = "gpu"
"#;

fn fleet() -> &'static FleetConfig {
    static FLEET_CONFIG: OnceLock<FleetConfig> = OnceLock::new();
    FLEET_CONFIG.get_or_init(|| {
        let config: FleetConfig = toml::from_str(FLEET).expect("the fixture parses");
        config.validate().expect("the fixture is valid");
        config
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(registration) = serde_json::from_slice::<Registration>(data) else { return };
    let url = registration.url.clone();
    let mut members = Members::new(fleet().clone(), 0);
    match members.register(Duration::from_secs(1), registration) {
        Ok(_) => {
            let effective = members.effective();
            effective.validate().expect("an accepted registration leaves a valid fleet");
            for e in &effective.engines {
                let capacity = f64::from(e.replicas) * e.capacity_rps.unwrap_or(10.0);
                assert!(capacity.is_finite(), "engine {} has capacity {capacity}", e.id);
            }
        }
        Err(RegisterError::Invalid(why) | RegisterError::Conflict(why)) => {
            // A URL's user information is secret: the refusal may not quote it (it may quote
            // the same text where it also appears elsewhere in the URL, e.g. in the path).
            if let Some(scheme) = url.find("://") {
                let rest = &url[scheme + 3..];
                let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
                if let Some(at) = authority.rfind('@') {
                    let userinfo = &authority[..at];
                    let without = format!("{}{}", &url[..scheme + 3], &rest[at + 1..]);
                    if userinfo.len() >= 4 {
                        let (said, elsewhere) =
                            (why.matches(userinfo).count(), without.matches(userinfo).count());
                        assert!(said <= elsewhere, "{why:?} echoes {userinfo:?}");
                    }
                }
            }
        }
    }
});
