//! The demo's changing fleet: two more engines that register themselves with the control
//! plane like `ilb engine-sim --register` does. `engine-e` (region c) registers at the start and
//! leaves at 80 s (deregisters, finishes its requests, stops); `engine-d` (region b) joins at
//! 30 s. The console says when, and the plan lines show the split following.

use super::args::DemoArgs;
use super::stack::spawn_engine;
use crate::cmd::engine_sim::{leave, registration};
use ilb_controlplane::Registrar;
use ilb_engine_sim::HardwareProfile;
use std::time::Duration;

/// The bearer token the demo's control plane requires for reports and registrations.
pub const TOKEN: &str = "demo-token";
const TTL_S: f64 = 6.0;

/// Runs the joins and the leave; returns when the last change is done (or on an error).
pub async fn run(
    args: DemoArgs,
    model: &'static str,
    cp_url: String,
    profiles: [(String, HardwareProfile); 2],
) {
    let [(c_profile, c_hardware), (b_profile, b_hardware)] = profiles;
    let start = crate::clock::now();
    let say = |what: String| println!("── t={:>3}s fleet: {what}", crate::clock::since(start).as_secs());
    let Ok(leaving) = spawn_engine(&args, 3, "engine-e", model, c_hardware).await else {
        say("engine-e could not start".into());
        return;
    };
    let mut e = Registrar::spawn(&cp_url, TOKEN, registration(&leaving, model, "c", &c_profile, TTL_S));
    if e.registered(Duration::from_secs(10)).await {
        say(format!("engine-e registered at {} (region c); it leaves at 80 s", leaving.url()));
    }
    tokio::time::sleep_until(start + Duration::from_secs(30)).await;
    let Ok(joining) = spawn_engine(&args, 4, "engine-d", model, b_hardware).await else {
        say("engine-d could not start".into());
        return;
    };
    let mut d = Registrar::spawn(&cp_url, TOKEN, registration(&joining, model, "b", &b_profile, TTL_S));
    if d.registered(Duration::from_secs(10)).await {
        say(format!("engine-d joined at {} (region b)", joining.url()));
    }
    tokio::time::sleep_until(start + Duration::from_secs(80)).await;
    say("engine-e leaves: deregistered, draining".into());
    leave(vec![e], std::slice::from_ref(&leaving)).await;
    say(format!("engine-e drained ({} requests served) and stopped", leaving.stats().requests_served));
    leaving.shutdown().await;
    // engine-d stays until the demo ends; its lease keeps being renewed.
    std::future::pending::<()>().await;
    drop((d, joining));
}
