//! Latency profiles: the JSON shape shared with the optimizer, evaluation, combination of
//! TTFT and TBOT, the convex projection (properties) and the fits.

use ilb_planning::profile::{
    combine, fit_level, fit_piecewise, fit_queueing, fit_shape, project_convex_increasing, LatencyProfile,
    Objective, Observation, ProfileError, QueueingPrior,
};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

fn slopes(curve: &[(f64, f64)]) -> Vec<f64> {
    curve.windows(2).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).collect()
}

/// Convex and non-decreasing within a tolerance relative to the curve's scale.
fn assert_convex_increasing(curve: &[(f64, f64)], scale: f64) {
    let slopes = slopes(curve);
    let tolerance = 1e-7 * scale.max(1.0);
    for (index, slope) in slopes.iter().enumerate() {
        assert!(*slope >= -tolerance, "negative slope {slope} at {index}: {curve:?}");
        if index > 0 {
            assert!(*slope >= slopes[index - 1] - tolerance, "slope decreases at {index}: {curve:?}");
        }
    }
}

/// Observations every fit skips on an engine of capacity 100: at capacity, NaN, weightless.
fn unusable_at_capacity_100() -> [Observation; 3] {
    [
        Observation { load_rps: 100.0, latency_ms: 500.0, weight: 10.0 },
        Observation { load_rps: f64::NAN, latency_ms: 50.0, weight: 10.0 },
        Observation { load_rps: 50.0, latency_ms: 500.0, weight: 0.0 },
    ]
}

#[test]
fn json_shapes_match_the_optimizer() {
    let queueing = LatencyProfile::Queueing { t0_ms: 60.0, b_ms: 15.0 };
    assert_eq!(serde_json::to_string(&queueing).unwrap(), r#"{"queueing":{"t0_ms":60.0,"b_ms":15.0}}"#);
    let piecewise = LatencyProfile::Piecewise(vec![(0.0, 60.0), (50.0, 75.0)]);
    assert_eq!(serde_json::to_string(&piecewise).unwrap(), r#"{"piecewise":[[0.0,60.0],[50.0,75.0]]}"#);
    let parsed: LatencyProfile = serde_json::from_str(r#"{"piecewise": [[0, 60], [50, 75.5]]}"#).unwrap();
    assert_eq!(parsed, LatencyProfile::Piecewise(vec![(0.0, 60.0), (50.0, 75.5)]));
    assert!(serde_json::from_str::<LatencyProfile>(r#"{"queueing":{"t0_ms":1,"b_ms":2,"c":3}}"#).is_err());
    let objective: Objective =
        serde_json::from_str(r#"{"ttft_plus_decode":{"expected_output_tokens":250}}"#).unwrap();
    assert_eq!(objective, Objective::TtftPlusDecode { expected_output_tokens: 250.0 });
    assert_eq!(serde_json::from_str::<Objective>(r#""ttft""#).unwrap(), Objective::Ttft);
}

#[test]
fn evaluation() {
    let queueing = LatencyProfile::Queueing { t0_ms: 60.0, b_ms: 15.0 };
    assert_eq!(queueing.latency_ms(0.0, 100.0), 60.0);
    assert_eq!(queueing.latency_ms(50.0, 100.0), 75.0);
    assert_eq!(queueing.latency_ms(100.0, 100.0), f64::INFINITY);
    let piecewise = LatencyProfile::Piecewise(vec![(10.0, 60.0), (50.0, 80.0), (90.0, 160.0)]);
    assert_eq!(piecewise.latency_ms(0.0, 100.0), 60.0, "flat below the first knot");
    assert_eq!(piecewise.latency_ms(30.0, 100.0), 70.0);
    assert_eq!(piecewise.latency_ms(50.0, 100.0), 80.0);
    assert_eq!(piecewise.latency_ms(100.0, 100.0), 180.0, "last slope beyond the last knot");
}

#[test]
fn validation() {
    assert_eq!(LatencyProfile::Queueing { t0_ms: 1.0, b_ms: 2.0 }.validate(), Ok(()));
    assert_eq!(
        LatencyProfile::Queueing { t0_ms: -1.0, b_ms: 2.0 }.validate(),
        Err(ProfileError::InvalidQueueing)
    );
    assert_eq!(LatencyProfile::Piecewise(vec![]).validate(), Err(ProfileError::EmptyPiecewise));
    assert_eq!(
        LatencyProfile::Piecewise(vec![(0.0, 1.0), (0.0, 2.0)]).validate(),
        Err(ProfileError::UnsortedKnots { index: 1 })
    );
    assert_eq!(
        LatencyProfile::Piecewise(vec![(0.0, f64::NAN)]).validate(),
        Err(ProfileError::InvalidKnot { index: 0 })
    );
}

#[test]
fn combine_queueing_is_exact() {
    let ttft = LatencyProfile::Queueing { t0_ms: 60.0, b_ms: 15.0 };
    let tbot = LatencyProfile::Queueing { t0_ms: 20.0, b_ms: 2.0 };
    assert_eq!(combine(&ttft, &tbot, Objective::Ttft, 100.0), ttft);
    let combined = combine(&ttft, &tbot, Objective::TtftPlusDecode { expected_output_tokens: 100.0 }, 100.0);
    assert_eq!(combined, LatencyProfile::Queueing { t0_ms: 2060.0, b_ms: 215.0 });
}

#[test]
fn combine_mixed_shapes_tabulates_a_convex_curve() {
    let ttft = LatencyProfile::Piecewise(vec![(0.0, 50.0), (40.0, 60.0), (80.0, 120.0)]);
    let tbot = LatencyProfile::Queueing { t0_ms: 20.0, b_ms: 2.0 };
    let objective = Objective::TtftPlusDecode { expected_output_tokens: 10.0 };
    let combined = combine(&ttft, &tbot, objective, 100.0);
    let LatencyProfile::Piecewise(knots) = &combined else { panic!("expected piecewise") };
    assert!(combined.validate().is_ok());
    assert_convex_increasing(knots, 1000.0);
    for load in [0.0, 20.0, 40.0, 80.0] {
        let expected = ttft.latency_ms(load, 100.0) + 10.0 * tbot.latency_ms(load, 100.0);
        let got = combined.latency_ms(load, 100.0);
        assert!((got - expected).abs() / expected < 0.01, "at {load}: {got} vs {expected}");
    }
}

#[test]
fn fit_recovers_queueing_parameters_from_noiseless_data() {
    let capacity = 100.0;
    let truth = LatencyProfile::Queueing { t0_ms: 55.0, b_ms: 22.0 };
    let observations: Vec<Observation> = (1..=40)
        .map(|i| {
            let load = f64::from(i) * 2.2;
            Observation { load_rps: load, latency_ms: truth.latency_ms(load, capacity), weight: 1.0 }
        })
        .collect();
    // No prior: exact.
    let data_only = QueueingPrior { t0_ms: 0.0, b_ms: 0.0, weight: 0.0 };
    let LatencyProfile::Queueing { t0_ms, b_ms } = fit_queueing(data_only, capacity, &observations) else {
        panic!("expected queueing")
    };
    assert!((t0_ms - 55.0).abs() < 1e-6 && (b_ms - 22.0).abs() < 1e-6, "{t0_ms} {b_ms}");
    // A wrong prior worth one observation barely moves a 40-point fit.
    let wrong_prior = QueueingPrior { t0_ms: 80.0, b_ms: 11.0, weight: 0.2 };
    let LatencyProfile::Queueing { t0_ms, b_ms } = fit_queueing(wrong_prior, capacity, &observations) else {
        panic!("expected queueing")
    };
    assert!((t0_ms / 55.0 - 1.0).abs() < 0.01 && (b_ms / 22.0 - 1.0).abs() < 0.01, "{t0_ms} {b_ms}");
}

#[test]
fn fit_with_few_points_stays_near_the_prior() {
    let prior = QueueingPrior { t0_ms: 60.0, b_ms: 15.0, weight: 50.0 };
    // Two noisy points at one load: the level moves a little, the shape stays the prior's.
    let observations = [
        Observation { load_rps: 30.0, latency_ms: 90.0, weight: 1.0 },
        Observation { load_rps: 30.0, latency_ms: 70.0, weight: 1.0 },
    ];
    let LatencyProfile::Queueing { t0_ms, b_ms } = fit_queueing(prior, 100.0, &observations) else {
        panic!("expected queueing")
    };
    assert!((t0_ms - 60.0).abs() < 3.0 && (b_ms - 15.0).abs() < 3.0, "{t0_ms} {b_ms}");
    assert_eq!(
        fit_queueing(prior, 100.0, &[]),
        LatencyProfile::Queueing { t0_ms: 60.0, b_ms: 15.0 },
        "no data: the prior"
    );
    let junk = [Observation { load_rps: f64::NAN, latency_ms: 1.0, weight: 1.0 }];
    assert_eq!(fit_queueing(prior, 100.0, &junk), LatencyProfile::Queueing { t0_ms: 60.0, b_ms: 15.0 });
}

#[test]
fn fit_never_returns_negative_coefficients() {
    let data_only = QueueingPrior { t0_ms: 0.0, b_ms: 0.0, weight: 0.0 };
    // Latency falling with load.
    let falling: Vec<Observation> = (0..10)
        .map(|i| Observation { load_rps: f64::from(i) * 9.0, latency_ms: 100.0 - f64::from(i), weight: 1.0 })
        .collect();
    let LatencyProfile::Queueing { t0_ms, b_ms } = fit_queueing(data_only, 100.0, &falling) else { panic!() };
    assert!(t0_ms >= 0.0 && b_ms == 0.0);
}

#[test]
fn level_fit_scales_a_measured_curve_to_what_is_observed() {
    let curve = LatencyProfile::Piecewise(vec![(0.0, 40.0), (50.0, 50.0), (90.0, 80.0), (100.0, 120.0)]);
    let capacity = 100.0;
    // Production runs 10 % slower than the curve, at loads spread over three bins.
    let observed: Vec<Observation> = [30.0, 60.0, 88.0]
        .iter()
        .map(|&load| Observation {
            load_rps: load,
            latency_ms: 1.1 * curve.latency_ms(load, capacity),
            weight: 50.0,
        })
        .collect();
    let fitted = fit_level(&curve, 0.0, capacity, &observed);
    for load in [0.0, 45.0, 95.0] {
        let ratio = fitted.latency_ms(load, capacity) / curve.latency_ms(load, capacity);
        assert!((ratio - 1.1).abs() < 1e-12, "{load}: {ratio}");
    }
    // A prior worth as much as the observations pulls halfway back.
    let ratio = fit_level(&curve, 150.0, capacity, &observed).latency_ms(50.0, capacity) / 50.0;
    assert!((ratio - 1.05).abs() < 1e-12, "{ratio}");
    // Loads at capacity, NaN and weightless observations are ignored; nothing usable keeps the curve.
    let unusable = unusable_at_capacity_100();
    assert_eq!(fit_level(&curve, 0.0, capacity, &unusable), curve);
    assert_eq!(fit_level(&curve, 0.0, 0.0, &observed), curve);
}

#[test]
fn level_fit_compares_bins_at_their_mean_load() {
    // Load fluctuating around 82.5 req/s across the curve's kink at 82; the latency seen is the
    // curve's at the mean load. Against the curve at the bin's mean load the level is right;
    // each window against the curve at its own load would read 125 / 132.1 and scale by 0.95.
    let curve = LatencyProfile::Piecewise(vec![(0.0, 40.0), (82.0, 60.0), (90.0, 100.0)]);
    let observed = [
        Observation { load_rps: 80.5, latency_ms: 62.5, weight: 1.0 },
        Observation { load_rps: 84.5, latency_ms: 62.5, weight: 1.0 },
    ];
    let fitted = fit_level(&curve, 0.0, 100.0, &observed);
    assert!((fitted.latency_ms(82.5, 100.0) - 62.5).abs() < 1e-9, "{}", fitted.latency_ms(82.5, 100.0));
}

#[test]
fn shape_fit_follows_dense_data_and_keeps_the_prior_elsewhere() {
    // The prior is too steep near capacity: the fleet runs 70–85 % of capacity with latency
    // rising linearly from 60 to 75 ms, where the prior says 73–107 ms.
    let capacity = 100.0;
    let prior = LatencyProfile::Queueing { t0_ms: 50.0, b_ms: 10.0 };
    let truth = |load: f64| 60.0 + (load - 70.0);
    let observed: Vec<Observation> = (0..=150)
        .map(|i| {
            let load = 70.0 + f64::from(i) * 0.1;
            Observation { load_rps: load, latency_ms: truth(load), weight: 1000.0 }
        })
        .collect();
    let LatencyProfile::Piecewise(knots) = fit_shape(&prior, 200.0, capacity, &observed) else {
        panic!("a shaped fit is piecewise");
    };
    let fitted = LatencyProfile::Piecewise(knots.clone());
    assert_convex_increasing(&knots, 100.0);
    // Where the data are, the curve is theirs (within the convex projection's smoothing).
    for load in [72.5, 77.5, 82.5] {
        let error = fitted.latency_ms(load, capacity) - truth(load);
        assert!(error.abs() < 1.0, "{load}: {} against {}", fitted.latency_ms(load, capacity), truth(load));
    }
    // Below the data the prior's shape is scaled by the nearest data, so its level follows
    // (the prior is 23 % above the truth at 72.5 req/s) and the curve still rises towards them.
    let idle = fitted.latency_ms(0.0, capacity);
    assert!(idle < 50.0 && idle > 30.0, "idle {idle}");
    // Beyond the data it keeps rising steeply, as the prior does.
    assert!(fitted.latency_ms(95.0, capacity) > truth(95.0) + 20.0, "{knots:?}");
    // The prior's weight pulls a thinly observed bin towards the prior.
    let thin = [Observation { load_rps: 50.0, latency_ms: 40.0, weight: 200.0 }];
    let half_way = fit_shape(&prior, 200.0, capacity, &thin).latency_ms(50.0, capacity);
    assert!((half_way - 50.0).abs() < 1e-6, "{half_way}");
    // Nothing usable (at capacity, NaN, weightless) or no capacity: the prior unchanged.
    let unusable = unusable_at_capacity_100();
    assert_eq!(fit_shape(&prior, 200.0, capacity, &unusable), prior);
    assert_eq!(fit_shape(&prior, 200.0, 0.0, &observed), prior);
    assert_eq!(fit_shape(&prior, f64::NAN, f64::INFINITY, &observed), prior);
}

#[test]
fn piecewise_fit_bins_and_projects() {
    let truth = LatencyProfile::Queueing { t0_ms: 50.0, b_ms: 10.0 };
    let observations: Vec<Observation> = (0..200)
        .map(|i| {
            let load = f64::from(i) * 0.45;
            // Deterministic zig-zag noise of ±3 ms.
            let noise = if i % 2 == 0 { 3.0 } else { -3.0 };
            Observation { load_rps: load, latency_ms: truth.latency_ms(load, 100.0) + noise, weight: 1.0 }
        })
        .collect();
    let knots: Vec<f64> = (0..=9).map(|i| f64::from(i) * 10.0).collect();
    let fitted = fit_piecewise(&observations, &knots).unwrap();
    let LatencyProfile::Piecewise(points) = &fitted else { panic!() };
    assert_convex_increasing(points, 100.0);
    for &(load, latency) in points {
        assert!((latency - truth.latency_ms(load, 100.0)).abs() < 8.0, "at {load}: {latency}");
    }
    assert!(fit_piecewise(&observations[..1], &knots).is_none());
}

#[test]
fn convexified_piecewise_is_valid() {
    let noisy =
        LatencyProfile::Piecewise(vec![(50.0, 70.0), (0.0, 60.0), (25.0, 66.0), (75.0, 69.0), (90.0, 140.0)]);
    let clean = noisy.convexified();
    assert!(clean.validate().is_ok());
    let LatencyProfile::Piecewise(points) = &clean else { panic!() };
    assert_convex_increasing(points, 100.0);
}

/// Random curves: loads strictly increasing (random gaps), latencies anything.
fn arbitrary_curve() -> impl Strategy<Value = Vec<(f64, f64)>> {
    proptest::collection::vec((0.1f64..20.0, -100.0f64..400.0), 1..40).prop_map(|steps| {
        let mut load = 0.0;
        steps
            .into_iter()
            .map(|(gap, latency)| {
                load += gap;
                (load, latency)
            })
            .collect()
    })
}

/// Random convex non-decreasing curves: non-negative, non-decreasing slopes.
fn convex_curve() -> impl Strategy<Value = Vec<(f64, f64)>> {
    (0.0f64..200.0, proptest::collection::vec((0.1f64..20.0, 0.0f64..3.0), 1..40)).prop_map(
        |(start, steps)| {
            let (mut load, mut latency, mut slope) = (0.0, start, 0.0);
            let mut curve = vec![(load, latency)];
            for (gap, slope_increase) in steps {
                slope += slope_increase;
                load += gap;
                latency += slope * gap;
                curve.push((load, latency));
            }
            curve
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, rng_seed: RngSeed::Fixed(1), ..ProptestConfig::default() })]

    #[test]
    fn projection_is_convex_and_non_decreasing(curve in arbitrary_curve()) {
        let projected = project_convex_increasing(&curve);
        prop_assert_eq!(projected.len(), curve.len());
        for (before, after) in curve.iter().zip(&projected) {
            prop_assert_eq!(before.0, after.0);
        }
        assert_convex_increasing(&projected, 400.0);
    }

    #[test]
    fn projection_leaves_convex_curves_unchanged(curve in convex_curve()) {
        let projected = project_convex_increasing(&curve);
        let scale = curve.iter().map(|p| p.1.abs()).fold(1.0, f64::max);
        for (before, after) in curve.iter().zip(&projected) {
            prop_assert!((before.1 - after.1).abs() <= 1e-6 * scale, "{:?} -> {:?}", curve, projected);
        }
    }

    #[test]
    fn measured_points_give_a_valid_convex_curve_through_their_projection(curve in arbitrary_curve()) {
        let joined = LatencyProfile::through_measured(&curve);
        prop_assert!(joined.validate().is_ok(), "{:?}", joined);
        let LatencyProfile::Piecewise(knots) = &joined else { panic!("{joined:?}") };
        assert_convex_increasing(knots, 400.0);
        // Through the projected points (clamped at zero, as every profile is): each span of the
        // joined curve starts and ends on one.
        for (x, y) in project_convex_increasing(&curve) {
            let got = joined.latency_ms(x, f64::INFINITY);
            prop_assert!((got - y.max(0.0)).abs() <= 1e-5 * 400.0, "{}: {} against {}", x, got, y);
        }
    }

    #[test]
    fn projection_is_a_projection(curve in arbitrary_curve()) {
        // Projecting twice changes nothing, and the projection is no farther from the data
        // than the best flat line (which is itself convex and non-decreasing).
        let once = project_convex_increasing(&curve);
        let twice = project_convex_increasing(&once);
        for (a, b) in once.iter().zip(&twice) {
            prop_assert!((a.1 - b.1).abs() <= 1e-6 * 400.0);
        }
        let mean = curve.iter().map(|p| p.1).sum::<f64>() / curve.len() as f64;
        let error_flat: f64 = curve.iter().map(|p| (p.1 - mean).powi(2)).sum();
        let error_projected: f64 = curve.iter().zip(&once).map(|(p, q)| (p.1 - q.1).powi(2)).sum();
        prop_assert!(error_projected <= error_flat * (1.0 + 1e-9) + 1e-9);
    }

    #[test]
    fn shape_fit_is_always_a_valid_convex_curve(
        t0 in 0.0f64..500.0,
        b in 0.0f64..100.0,
        capacity in 0.5f64..2000.0,
        prior_weight in prop_oneof![Just(0.0), 0.0f64..1e5],
        points in prop::collection::vec((-0.1f64..1.2, 0.0f64..5000.0, -1.0f64..1e4), 0..60),
    ) {
        // Loads from below idle to past capacity, latencies anywhere, weights of both signs.
        let prior = LatencyProfile::Queueing { t0_ms: t0, b_ms: b };
        let observations: Vec<Observation> = points
            .iter()
            .map(|&(f, latency_ms, weight)| Observation { load_rps: f * capacity, latency_ms, weight })
            .collect();
        match fit_shape(&prior, prior_weight, capacity, &observations) {
            LatencyProfile::Piecewise(knots) => {
                prop_assert!(LatencyProfile::Piecewise(knots.clone()).validate().is_ok(), "{:?}", knots);
                let scale = knots.iter().map(|k| k.1).fold(1.0, f64::max);
                assert_convex_increasing(&knots, scale);
            }
            unchanged => prop_assert_eq!(unchanged, prior),
        }
    }

    #[test]
    fn fit_recovers_random_queueing_parameters(t0 in 5.0f64..500.0, b in 0.5f64..100.0, capacity in 5.0f64..2000.0) {
        let truth = LatencyProfile::Queueing { t0_ms: t0, b_ms: b };
        let observations: Vec<Observation> = (1..=20)
            .map(|i| {
                let load = capacity * 0.04 * f64::from(i);
                Observation { load_rps: load, latency_ms: truth.latency_ms(load, capacity), weight: 1.0 }
            })
            .collect();
        // Data only: this checks the solver, not the regularisation.
        let prior = QueueingPrior { t0_ms: t0 * 1.5, b_ms: b * 0.5, weight: 0.0 };
        let LatencyProfile::Queueing { t0_ms, b_ms } = fit_queueing(prior, capacity, &observations) else {
            panic!("expected queueing")
        };
        prop_assert!((t0_ms / t0 - 1.0).abs() < 0.01, "t0 {} vs {}", t0_ms, t0);
        prop_assert!((b_ms / b - 1.0).abs() < 0.01, "b {} vs {}", b_ms, b);
    }
}

#[test]
fn measured_points_are_joined_by_a_smooth_convex_curve() {
    // Points of t0 + b·y/(c − y) with t0 40, b 10, c 100 at a quarter, a half, three quarters
    // and 95 % of capacity.
    let queueing = LatencyProfile::Queueing { t0_ms: 40.0, b_ms: 10.0 };
    let points: Vec<(f64, f64)> =
        [25.0, 50.0, 75.0, 95.0].iter().map(|&y| (y, queueing.latency_ms(y, 100.0))).collect();
    let joined = LatencyProfile::through_measured(&points);
    let LatencyProfile::Piecewise(knots) = &joined else { panic!("{joined:?}") };
    assert_convex_increasing(knots, 1.0);
    // Through every point.
    for &(y, ms) in &points {
        assert!((joined.latency_ms(y, 100.0) - ms).abs() < 1e-9, "{y}: {joined:?}");
    }
    // Between them, below the chord and nearer the curve than it.
    let chords = LatencyProfile::Piecewise(points.clone());
    for y in [40.0, 60.0, 85.0, 90.0] {
        let (truth, got, chord) =
            (queueing.latency_ms(y, 100.0), joined.latency_ms(y, 100.0), chords.latency_ms(y, 100.0));
        assert!(
            got < chord && (got - truth).abs() < chord - truth,
            "{y}: {got}, chord {chord}, truth {truth}"
        );
    }
    // No kink at a measured point: the slope changes there by less than a fifth of the jump
    // between the chords either side.
    let slopes = slopes(knots);
    let chord = |j: usize| (points[j + 1].1 - points[j].1) / (points[j + 1].0 - points[j].0);
    for (i, &(y, _)) in points.iter().enumerate().take(points.len() - 1).skip(1) {
        let at = knots.iter().position(|&(x, _)| x == y).expect("a knot at each point");
        let jump = slopes[at] - slopes[at - 1];
        assert!(jump < 0.2 * (chord(i) - chord(i - 1)), "{y}: {slopes:?}");
    }
    // Straight points stay straight, extended beyond the last; concave ones are projected first.
    let line = LatencyProfile::through_measured(&[(0.0, 10.0), (10.0, 20.0), (20.0, 30.0)]);
    assert!((line.latency_ms(5.0, f64::INFINITY) - 15.0).abs() < 1e-9, "{line:?}");
    assert!((line.latency_ms(30.0, f64::INFINITY) - 40.0).abs() < 1e-9, "{line:?}");
    let concave = LatencyProfile::through_measured(&[(0.0, 10.0), (10.0, 28.0), (20.0, 30.0)]);
    let LatencyProfile::Piecewise(knots) = &concave else { panic!("{concave:?}") };
    assert_convex_increasing(knots, 30.0);
}
