//! The real-client test: the official `openai` Python SDK drives a data plane in quick mode in
//! front of two simulated engines (list models, chat, chat streaming with usage, legacy
//! completions streaming, and errors raising the SDK's own exception types); once in plain
//! http, once with TLS on both hops (a TLS listener whose CA the SDK is given, https engines).
//!
//! Python comes from `ILB_TEST_PYTHON` (set by `.ci/run`, which installs the SDK in a venv),
//! else `python3`. Without an importable `openai` the test says so and passes, unless
//! `ILB_REQUIRE_SDK=1` (as in CI), where it fails.
#![allow(clippy::disallowed_methods)] // tests read the clock for their hang-guard deadlines

use ilb_dataplane::{DataPlane, DataPlaneConfig, SnapshotSource};
use ilb_engine_sim::{EngineConfig, HardwareProfile};
use std::process::Command;
use std::time::Duration;

fn python() -> Option<String> {
    let python = std::env::var("ILB_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let importable =
        Command::new(&python).args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if importable {
        return Some(python);
    }
    assert!(
        std::env::var("ILB_REQUIRE_SDK").as_deref() != Ok("1"),
        "ILB_REQUIRE_SDK=1 but `{python}` cannot import openai"
    );
    eprintln!("skipping: `{python}` cannot import openai (run .ci/run, or pip install openai)");
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_the_data_plane() {
    let Some(python) = python() else { return };
    run_sdk(python, None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_against_a_tls_data_plane_with_a_custom_ca() {
    let Some(python) = python() else { return };
    run_sdk(python, Some(ilb_tls::testing::TestCa::new("sdk test ca"))).await;
}

/// Engines and a data plane in quick mode (TLS on both hops with `ca`), then the SDK script.
async fn run_sdk(python: String, ca: Option<ilb_tls::testing::TestCa>) {
    let server_tls = |ca: &ilb_tls::testing::TestCa| {
        ilb_tls::ServerTls::new(&ca.issue(&["127.0.0.1"]).identity(), ilb_tls::ClientAuth::None).unwrap()
    };
    let mut engines = Vec::new();
    for i in 0..2 {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("sim-{i}")),
            model: ilb_core::ModelName::new("sdk-model"),
            profile: HardwareProfile::h100(),
            seed: i,
            tls: ca.as_ref().map(server_tls),
            ..EngineConfig::default()
        };
        engines.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let source = SnapshotSource::Discover {
        engines: engines.iter().map(|e| e.url()).collect(),
        interval: Duration::from_secs(30),
    };
    let mut config = DataPlaneConfig::new("127.0.0.1:0".parse().unwrap());
    let mut ca_file = None;
    if let Some(ca) = &ca {
        let roots = vec![ca.der()];
        config.engine_tls =
            Some(ilb_tls::ClientTls::new(&ilb_tls::ClientOptions { roots, identity: None }).unwrap());
        config.listener_tls = Some(server_tls(ca));
        config.https_only = true;
        let path = std::env::temp_dir().join(format!("ilb-sdk-ca-{}.pem", std::process::id()));
        std::fs::write(&path, ca.pem()).unwrap();
        ca_file = Some(path);
    }
    let dp = DataPlane::start(config, source).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dp.installed().is_none_or(|i| i.table.engines.len() < 2) {
        assert!(tokio::time::Instant::now() < deadline, "data plane never discovered the engines");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check_openai.py");
    let mut args = vec![script.to_owned(), dp.url(), "sdk-model".to_owned()];
    if let Some(path) = &ca_file {
        assert!(args[1].starts_with("https://"));
        args.push(path.display().to_string());
    }
    let output = tokio::task::spawn_blocking(move || Command::new(python).args(&args).output())
        .await
        .unwrap()
        .expect("python runs");
    if let Some(path) = ca_file {
        let _ = std::fs::remove_file(path);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "openai SDK checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("openai sdk checks passed"), "{stdout}");
}
