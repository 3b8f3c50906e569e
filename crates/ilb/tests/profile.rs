//! `ilb profile` against a live simulated engine (`ilb engine-sim`, l4 profile): the printed
//! block is TOML a fleet config accepts as it is — a profile and its measured curves, loads
//! increasing, latencies rising with load — and progress goes to stderr.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Engine(Child);

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn engine() -> (Engine, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["engine-sim", "--listen", "127.0.0.1:0", "--profile", "l4", "--model", "m", "--log", "warn"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("ilb engine-sim starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("engine line");
    let url = line.trim().rsplit(' ').next().expect("url").to_owned();
    (Engine(child), url)
}

#[test]
fn profile_prints_a_profile_block_the_fleet_config_accepts() {
    let (_engine, url) = engine();
    let output = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["profile", "--engine", &url, "--name", "l4", "--seconds", "8", "--step-seconds", "1"])
        .args(["--prompt-words", "100", "--max-tokens", "16", "--min-requests", "2"])
        .output()
        .expect("ilb profile runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "ilb profile failed:\n{stderr}");
    assert!(
        stderr.contains("step 1: ") && stderr.contains("of 8 s spent"),
        "no progress on stderr:\n{stderr}"
    );
    let fleet = format!(
        "[[clusters]]\nid = \"a\"\nregion = \"a\"\n[[engines]]\nid = \"e\"\nurl = \"{url}\"\nmodel = \"m\"\n\
         region = \"a\"\nprofile = \"l4\"\n{stdout}"
    );
    let config: ilb_planning::config::FleetConfig =
        toml::from_str(&fleet).unwrap_or_else(|e| panic!("not fleet TOML: {e}\n{stdout}"));
    config.validate().unwrap_or_else(|e| panic!("invalid: {e}\n{stdout}"));
    let profile = &config.profiles["l4"];
    let curves = &config.control_plane.measured_curves["l4"];
    let ttft = curves.ttft_curve.as_ref().expect("a TTFT curve");
    assert!(ttft.len() >= 2, "{stdout}");
    let top = ttft.last().expect("points")[0];
    assert!(
        profile.capacity_rps > top,
        "capacity {} not above the highest good load {top}",
        profile.capacity_rps
    );
    assert!(ttft.windows(2).all(|w| w[1][0] > w[0][0]), "loads not increasing: {ttft:?}");
    assert!(profile.ttft_t0_ms > 0.0 && profile.tbot_t0_ms > 0.0, "{stdout}");
}

#[test]
fn profile_of_an_unreachable_engine_fails_with_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args([
            "profile",
            "--engine",
            "http://127.0.0.1:9",
            "--model",
            "m",
            "--seconds",
            "2",
            "--step-seconds",
            "1",
        ])
        .output()
        .expect("ilb profile runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("error:"), "{stderr}");
}

#[test]
fn profile_at_given_rates_measures_exactly_those_steps() {
    let (_engine, url) = engine();
    let run = |rates: &str| {
        Command::new(env!("CARGO_BIN_EXE_ilb"))
            .args(["profile", "--engine", &url, "--step-seconds", "2", "--seconds", "2", "--rates", rates])
            .args(["--prompt-words", "50", "--max-tokens", "8", "--min-requests", "1"])
            .output()
            .expect("ilb profile runs")
    };
    let output = run("1,3");
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "ilb profile failed:\n{stderr}");
    assert!(stderr.contains("step 2/2: 3.00 req/s") && !stderr.contains("step 3/"), "{stderr}");
    let rows: Vec<&str> = stdout.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for row in rows {
        let fields: Vec<&str> = row.split(' ').collect();
        assert_eq!(fields.len(), 4, "{row}");
        assert!(fields[0].parse::<f64>().is_ok() && fields[1].parse::<f64>().is_ok(), "{row}");
    }
    let output = run("1,-2");
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--rates takes positive rates"));
}

#[test]
fn a_profile_checked_at_other_rates_predicts_what_they_measure() {
    let (_engine, url) = engine();
    let ilb = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_ilb"))
            .args([
                "profile",
                "--engine",
                &url,
                "--name",
                "l4",
                "--prompt-words",
                "100",
                "--max-tokens",
                "16",
            ])
            .args(args)
            .output()
            .expect("ilb profile runs")
    };
    let output = ilb(&["--seconds", "8", "--step-seconds", "1", "--min-requests", "2"]);
    assert!(output.status.success(), "ilb profile failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let dir = std::env::temp_dir().join(format!("ilb-profile-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("l4.toml");
    std::fs::write(&file, &output.stdout).expect("profile written");
    let file = file.to_str().expect("utf-8 path");

    let output = ilb(&["--step-seconds", "2", "--min-requests", "1", "--rates", "2,5", "--check", file]);
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "ilb profile --check failed:\n{stderr}");
    let rows: Vec<Vec<&str>> =
        stdout.lines().filter(|l| !l.starts_with('#')).map(|l| l.split(' ').collect()).collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    for row in &rows {
        // load, TTFT measured / predicted / error, TBOT measured / predicted / error, past knee.
        assert_eq!(row.len(), 8, "{row:?}");
        let number = |i: usize| row[i].parse::<f64>().unwrap_or_else(|_| panic!("{row:?}"));
        let (measured, predicted) = (number(1), number(2));
        // A loaded test machine moves TTFT a little; a misread profile would be far off.
        assert!(
            predicted > 0.5 * measured && predicted < 2.0 * measured,
            "TTFT predicted {predicted} against {measured} measured:\n{stdout}"
        );
        assert!(row[3].ends_with('%') && row[6].ends_with('%'), "{row:?}");
    }

    let output = Command::new(env!("CARGO_BIN_EXE_ilb"))
        .args(["profile", "--engine", &url, "--name", "h100", "--rates", "1", "--check", file])
        .output()
        .expect("ilb profile runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("has no [profiles.h100]"), "{stderr}");
    assert!(!stderr.contains("idle:"), "the file is read before the engine is loaded:\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
