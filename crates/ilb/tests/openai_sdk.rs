//! The real-client test: the official `openai` Python SDK drives a data plane in quick mode in
//! front of two simulated engines (list models, chat, chat streaming with usage, legacy
//! completions streaming, and errors raising the SDK's own exception types).
//!
//! Python comes from `ILB_TEST_PYTHON` (set by `.ci/run`, which installs the SDK in a venv),
//! else `python3`. Without an importable `openai` the test says so and passes, unless
//! `ILB_REQUIRE_SDK=1` (as in CI), where it fails.

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
    let mut engines = Vec::new();
    for i in 0..2 {
        let config = EngineConfig {
            id: ilb_core::EngineId::new(format!("sim-{i}")),
            model: ilb_core::ModelName::new("sdk-model"),
            profile: HardwareProfile::h100(),
            seed: i,
            ..EngineConfig::default()
        };
        engines.push(ilb_engine_sim::spawn(config, "127.0.0.1:0".parse().unwrap()).await.unwrap());
    }
    let source = SnapshotSource::Discover {
        engines: engines.iter().map(|e| e.url()).collect(),
        interval: Duration::from_secs(30),
    };
    let dp = DataPlane::start(DataPlaneConfig::new("127.0.0.1:0".parse().unwrap()), source).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while dp.installed().is_none_or(|i| i.table.engines.len() < 2) {
        assert!(tokio::time::Instant::now() < deadline, "data plane never discovered the engines");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/check_openai.py");
    let url = dp.url();
    let output =
        tokio::task::spawn_blocking(move || Command::new(python).args([script, &url, "sdk-model"]).output())
            .await
            .unwrap()
            .expect("python runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "openai SDK checks failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("openai sdk checks passed"), "{stdout}");
}
