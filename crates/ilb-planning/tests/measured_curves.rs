//! Measured latency curves (`control_plane.measured_curves`): validation names the field, a
//! given curve replaces its signal's queueing profile (loads scaled by the engine's replicas),
//! and without curves the plan's latency profile is the queueing one exactly as before.

use ilb_planning::config::FleetConfig;
use ilb_planning::fleet::Fleet;
use ilb_planning::profile::LatencyProfile;

fn config(curves: &str, objective: &str) -> Result<FleetConfig, String> {
    let text = format!(
        "[control_plane]\nobjective = \"{objective}\"\nexpected_output_tokens = 100.0\n{curves}\n\
         [[clusters]]\nid = \"a\"\nregion = \"r\"\n\
         [profiles.gpu]\ncapacity_rps = 10.0\nttft_t0_ms = 50.0\nttft_b_ms = 10.0\n\
         tbot_t0_ms = 15.0\ntbot_b_ms = 2.0\n\
         [[engines]]\nid = \"e0\"\nurl = \"http://127.0.0.1:9000\"\nmodel = \"m\"\nregion = \"r\"\n\
         profile = \"gpu\"\nreplicas = 2\n"
    );
    let config: FleetConfig = toml::from_str(&text).map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    Ok(config)
}

#[test]
fn invalid_curves_are_rejected_with_the_field_named() {
    let cases = [
        ("ttft_curve = [[1.0, 50.0]]", "gpu.ttft_curve: needs at least 2 points"),
        ("tbot_curve = [[1.0, 15.0], [1.0, 16.0]]", "gpu.tbot_curve[1]: loads must be strictly increasing"),
        ("tbot_curve = [[2.0, 15.0], [1.0, 16.0]]", "gpu.tbot_curve[1]: loads must be strictly increasing"),
        ("ttft_curve = [[1.0, -5.0], [2.0, 16.0]]", "gpu.ttft_curve[0] latency: -5 is not in [0, 3600000]"),
        ("ttft_curve = [[1.0, nan], [2.0, 16.0]]", "gpu.ttft_curve[0] latency: NaN is not in [0, 3600000]"),
        ("ttft_curve = [[1e308, 5.0], [inf, 16.0]]", "gpu.ttft_curve[0] load: 1e308 is not in [0, 10000000]"),
    ];
    for (curve, expected) in cases {
        let error = config(&format!("[control_plane.measured_curves.gpu]\n{curve}"), "ttft").unwrap_err();
        assert!(error.contains(expected), "{curve}: {error}");
    }
    let unknown =
        config("[control_plane.measured_curves.tpu]\nttft_curve = [[1.0, 5.0], [2.0, 6.0]]", "ttft");
    assert!(unknown.unwrap_err().contains("control_plane.measured_curves.tpu: unknown profile"));
}

#[test]
fn without_curves_the_profile_is_the_queueing_one() {
    let fleet = Fleet::new(config("", "ttft_plus_decode").unwrap());
    assert_eq!(
        fleet.latency_profile(0),
        // e2e = TTFT + (100 − 1) tokens × TBOT.
        LatencyProfile::Queueing { t0_ms: 50.0 + 99.0 * 15.0, b_ms: 10.0 + 99.0 * 2.0 }
    );
}

#[test]
fn a_measured_curve_replaces_its_signal_scaled_by_replicas() {
    let curves = "[control_plane.measured_curves.gpu]\nttft_curve = [[2.0, 60.0], [6.0, 80.0], [9.0, 200.0]]";
    let fleet = Fleet::new(config(curves, "ttft").unwrap());
    // Two replicas: per-replica loads double, and the curve passes through every point
    // (smoothed between them: `LatencyProfile::through_measured`).
    let profile = fleet.latency_profile(0);
    assert!(matches!(profile, LatencyProfile::Piecewise(_)), "{profile:?}");
    for (load, ms) in [(4.0, 60.0), (12.0, 80.0), (18.0, 200.0)] {
        let got = profile.latency_ms(load, 20.0);
        assert!((got - ms).abs() < 1e-9, "{load} req/s: {got} ms, measured {ms}");
    }
    let curves = "[control_plane.measured_curves.gpu]\ntbot_curve = [[2.0, 15.0], [8.0, 21.0]]";
    let fleet = Fleet::new(config(curves, "ttft_plus_decode").unwrap());
    let profile = fleet.latency_profile(0);
    assert!(matches!(profile, LatencyProfile::Piecewise(_)), "{profile:?}");
    // TTFT stays queueing (t0 50, b 10, capacity 20); TBOT is linear (two points make a chord) from
    // 15 ms at 4 req/s to 21 ms at 16 req/s, so at 10 req/s: 50 + 10·10/10 + (100 − 1)·18 = 1842 ms.
    let at_10 = profile.latency_ms(10.0, 20.0);
    assert!((at_10 - 1842.0).abs() < 1.0, "{at_10}");
    // Flat below the first knot: 50 + 99·15 at zero load.
    assert!((profile.latency_ms(0.0, 20.0) - 1535.0).abs() < 1.0, "{}", profile.latency_ms(0.0, 20.0));
}
