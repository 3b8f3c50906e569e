//! Headless Chromium for browser tests: find it (or say why the test is skipped), load a page
//! with a virtual-time budget so its timers and polls run, and return the DOM after scripts ran
//! or a screenshot.

pub mod dom;

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Debian's package puts the browser here; CI installs it with apt.
pub const CHROMIUM: &str = "/usr/bin/chromium";
/// Set to `1` where a missing browser must fail the test instead of skipping it (CI).
pub const REQUIRE_ENV: &str = "ILB_REQUIRE_BROWSER";
/// Longest one Chromium run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);

/// The browser binary, or `None` (after printing a notice) when it is missing and not required.
/// Panics when it is missing and [`REQUIRE_ENV`] is `1`.
pub fn chromium() -> Option<PathBuf> {
    let path = PathBuf::from(CHROMIUM);
    if path.exists() {
        return Some(path);
    }
    if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
        panic!("{CHROMIUM} is missing and {REQUIRE_ENV}=1: install it with `apt-get install -y chromium`");
    }
    eprintln!(
        "NOTICE: skipping the browser test: {CHROMIUM} is not installed \
         (apt-get install -y chromium; set {REQUIRE_ENV}=1 to make this a failure)"
    );
    None
}

/// What to ask of one Chromium run.
pub enum Output<'a> {
    /// Print the serialised DOM after the virtual-time budget ran out.
    Dom,
    /// Save a PNG of the viewport.
    Screenshot { path: &'a Path, width: u32, height: u32 },
}

/// Loads `url` in a fresh profile, lets the page run for `budget` of virtual time (timers fire
/// back to back while the network is idle; fetches run in real time), and returns stdout.
pub fn run(browser: &Path, url: &str, budget: Duration, output: Output<'_>) -> String {
    static RUNS: AtomicU32 = AtomicU32::new(0);
    let profile = std::env::temp_dir().join(format!(
        "ilb-chromium-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&profile).expect("create the chromium profile dir");
    let mut command = Command::new(browser);
    command.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--mute-audio",
    ]);
    command.arg(format!("--user-data-dir={}", profile.display()));
    command.arg(format!("--virtual-time-budget={}", budget.as_millis()));
    match output {
        Output::Dom => {
            command.arg("--dump-dom");
        }
        Output::Screenshot { path, width, height } => {
            command.arg(format!("--screenshot={}", path.display()));
            command.arg(format!("--window-size={width},{height}"));
        }
    }
    command.arg(url).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // Its own process group, so a hung run can be killed with all its helper processes.
    command.process_group(0);
    let child = command.spawn().expect("start chromium");
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let pid = child.id();
    let waiter = std::thread::spawn(move || {
        let result = child.wait_with_output();
        let _ = done_tx.send(());
        result
    });
    if done_rx.recv_timeout(RUN_TIMEOUT).is_err() {
        // Kill only the browser we started (its process group, by id).
        let _ = Command::new("kill").args(["-9", "--", &format!("-{pid}")]).status();
        let _ = std::fs::remove_dir_all(&profile);
        panic!("chromium did not finish within {RUN_TIMEOUT:?}");
    }
    let out = waiter.join().expect("chromium waiter thread").expect("wait for chromium");
    let _ = std::fs::remove_dir_all(&profile);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "chromium exited with {}; stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
