//! Every long-running subcommand stops cleanly on SIGTERM (what Kubernetes, systemd and `kill`
//! send), as on Ctrl-C: it drains and exits with status 0 instead of dying by the signal.
#![allow(clippy::disallowed_methods)] // the test starts the binary and polls it with a deadline

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Starts `ilb ARGS`, waits for its first line on stdout (it serves), sends SIGTERM and returns
/// how it ended (at most 30 s later).
fn terminated(args: &[&str]) -> std::process::ExitStatus {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["--log", "warn"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(!line.is_empty(), "ilb {args:?} printed nothing");
    let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    panic!("ilb {args:?} still runs 30 s after SIGTERM");
}

#[test]
fn sigterm_stops_every_server_cleanly() {
    let engine = ["--engine", "http://127.0.0.1:9"];
    let config = std::env::temp_dir().join(format!("ilb-stop-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        "[control_plane]\nlisten = \"127.0.0.1:0\"\n[[clusters]]\nid = \"a\"\nregion = \"a\"\n\
         [profiles.gpu]\ncapacity_rps = 10.0\nttft_t0_ms = 30.0\nttft_b_ms = 10.0\n\
         [[engines]]\nid = \"e0\"\nurl = \"http://127.0.0.1:9\"\nmodel = \"m\"\nregion = \"a\"\nprofile = \"gpu\"\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let cases: [Vec<&str>; 4] = [
        vec!["control-plane", "--config", config],
        ["data-plane", "--listen", "127.0.0.1:0"].iter().chain(&engine).copied().collect(),
        ["epp", "--listen", "127.0.0.1:0"].iter().chain(&engine).copied().collect(),
        vec!["engine-sim", "--listen", "127.0.0.1:0", "--count", "1"],
    ];
    for args in cases {
        let status = terminated(&args);
        assert!(status.success(), "ilb {args:?} ended with {status} on SIGTERM");
    }
}
