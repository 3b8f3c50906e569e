//! Scenarios where planning should matter (issue 14, item 4), each run with seeds 1, 2 and 3
//! at the bundled file's own (short) duration and calibration, and each asserting what the
//! scenario is for: `ilb` against the policies the scenario is built to beat, on every seed.
//! The fleets are six small engines so that a seed runs in seconds in a debug build; the
//! means over all policies are in crates/ilb-fleet-sim/README.md (`ilb simulate --seeds`).

use ilb_fleet_sim::metrics::TransientStats;
use ilb_fleet_sim::{simulate, Comparison, Options, PolicyResult, Scenario};

const SEEDS: [u64; 3] = [1, 2, 3];

fn runs(text: &str, policies: &[&str]) -> Vec<Comparison> {
    let scenario = Scenario::from_toml(text).expect("bundled scenario is valid");
    SEEDS
        .iter()
        .map(|&seed| {
            let options = Options {
                seed: Some(seed),
                policies: Some(policies.iter().map(|p| (*p).to_owned()).collect()),
                ..Options::default()
            };
            simulate(&scenario, &options).expect("simulation runs")
        })
        .collect()
}

/// `ilb`'s mean end-to-end latency is below each of `others`' on every seed.
fn ilb_mean_below(runs: &[Comparison], others: &[&str], of: fn(&PolicyResult) -> f64, what: &str) {
    for c in runs {
        let ilb = of(&c.policies["ilb"]);
        for name in others {
            let other = of(&c.policies[*name]);
            assert!(ilb < other, "{} seed {}: {what} ilb {ilb:.1} vs {name} {other:.1}", c.scenario, c.seed);
        }
    }
}

/// Issue 14's targets at steady demand, over the seeds: ilb moves at most 0.3 % of traffic per
/// solve period and reverses a weight at most a third as often as `feedback`.
fn steady_targets(runs: &[Comparison]) {
    let mean = |f: fn(&PolicyResult) -> Option<f64>, policy: &str| {
        runs.iter().map(|c| f(&c.policies[policy]).expect("steady demand after the warm-up")).sum::<f64>()
            / runs.len() as f64
    };
    let churn = mean(|r| r.steady_churn, "ilb");
    assert!(churn <= 0.003, "ilb moved {:.2} % of traffic per period at steady demand", 100.0 * churn);
    let (ilb, feedback) = (mean(|r| r.steady_oscillation, "ilb"), mean(|r| r.steady_oscillation, "feedback"));
    assert!(
        3.0 * ilb <= feedback,
        "reversals per hour at steady demand: ilb {ilb:.1}, feedback {feedback:.1}"
    );
}

fn transient<'a>(c: &'a Comparison, policy: &str) -> &'a TransientStats {
    c.policies[policy].transients.first().expect("the scenario has an event")
}

#[test]
fn far_regions_ilb_keeps_short_requests_near_home() {
    let runs = runs(include_str!("../../../scenarios/far-regions.toml"), &["nearest", "feedback", "ilb"]);
    // Network-blind `feedback` sends requests across oceans; `nearest` queues the EU's excess.
    ilb_mean_below(&runs, &["feedback", "nearest"], |r| r.e2e_ms.mean, "mean e2e");
    ilb_mean_below(&runs, &["feedback", "nearest"], |r| r.ttft_ms.mean, "mean ttft");
    for c in &runs {
        assert_eq!(c.policies["ilb"].failed, 0, "seed {}", c.seed);
    }
}

#[test]
fn hot_residency_ilb_keeps_the_bound_traffic_home_and_spills_the_free_traffic() {
    let runs = runs(include_str!("../../../scenarios/hot-residency.toml"), &["nearest", "feedback", "ilb"]);
    ilb_mean_below(&runs, &["feedback", "nearest"], |r| r.e2e_ms.mean, "mean e2e");
    for c in &runs {
        for (name, r) in &c.policies {
            assert_eq!(r.residency_violations, 0, "{name} seed {}", c.seed);
        }
        assert_eq!(c.policies["ilb"].failed, 0, "seed {}", c.seed);
    }
    // The spill from eu-west follows the residency-bound class's demand, which is noisier
    // than Poisson (conversations): moving the demand band only as far as the measurement
    // leaves it took steady churn from 0.26 % to 0.12 % on seeds 1–3.
    steady_targets(&runs);
}

#[test]
fn surge_ilb_replans_from_the_demand_reports_and_has_the_lowest_latency_during_the_surge() {
    let runs = runs(include_str!("../../../scenarios/surge.toml"), &["nearest", "feedback", "ilb"]);
    for c in &runs {
        let ilb = transient(c, "ilb");
        let replan = ilb.replan_s.expect("ilb re-planned for the surge");
        // The data planes' demand is smoothed over 5 s, solves run every 2 s and snapshots are
        // pulled 1 s later: two time constants (86 % of the step) plus a solve and a pull make
        // 13 s. Measured: 5–7 s hashing new conversations blindly, 5–11 s placing them by load
        // (whose better-spread local load makes the first spill a little smaller), 7–13 s
        // with the demand band moved only as far as the measurement leaves it.
        assert!(replan <= 13.0, "seed {}: ilb re-planned after {replan} s", c.seed);
        for name in ["feedback", "nearest"] {
            let other = transient(c, name);
            assert!(
                ilb.e2e_ms.mean < other.e2e_ms.mean,
                "seed {}: mean e2e during the surge: ilb {:.1} vs {name} {:.1}",
                c.seed,
                ilb.e2e_ms.mean,
                other.e2e_ms.mean
            );
        }
    }
}

/// What holds on the grey engine: ilb cuts the slow engine's share within 30 s and beats
/// round-robin during the minute after the slowdown. Printed rather than asserted, against
/// `feedback`: re-plan times (ilb 5–7 s on seeds 1–3, `feedback` 5–9 s) and the mean during
/// that minute (ilb 703–743 ms, `feedback` 735–755).
#[test]
fn grey_engine_ilb_moves_traffic_off_the_slow_engine_and_beats_round_robin_during_it() {
    let runs = runs(include_str!("../../../scenarios/grey-engine.toml"), &["round-robin", "feedback", "ilb"]);
    for c in &runs {
        let ilb = transient(c, "ilb");
        let replan = ilb.replan_s.expect("ilb moved traffic off the grey engine");
        assert!(replan <= 30.0, "seed {}: ilb cut the grey engine's share after {replan} s", c.seed);
        let round_robin = transient(c, "round-robin");
        assert!(
            ilb.e2e_ms.mean < round_robin.e2e_ms.mean,
            "seed {}: mean e2e after the slowdown: ilb {:.1} vs round-robin {:.1}",
            c.seed,
            ilb.e2e_ms.mean,
            round_robin.e2e_ms.mean
        );
        let feedback = transient(c, "feedback");
        println!(
            "seed {}: after the slowdown ilb {:.1} ms (re-plan {replan} s), feedback {:.1} ms (re-plan {:?} s)",
            c.seed, ilb.e2e_ms.mean, feedback.e2e_ms.mean, feedback.replan_s
        );
    }
    // Once the grey engine is penalised, its traffic does not swing back and forth: a deep
    // penalty is lifted in doubling steps, each judged on the traffic it brings (halving it
    // moved 13–16 % of all traffic each way every 30 s on seed 2).
    steady_targets(&runs);
}

/// During the outage ilb is ahead of `feedback` on every seed. Before engines that took the
/// failed region's traffic were spared outlier judgement while the fleet settled, seed 3's
/// outage penalised one of them, the plan shed for the withheld capacity, and ilb was behind
/// (967 ms against 953).
#[test]
fn peak_outage_ilb_replans_at_once_loses_only_in_flight_requests_and_beats_feedback_during_it() {
    let runs = runs(include_str!("../../../scenarios/peak-outage.toml"), &["nearest", "feedback", "ilb"]);
    for c in &runs {
        let ilb = &c.policies["ilb"];
        let outage = transient(c, "ilb");
        let replan = outage.replan_s.expect("ilb re-planned around the outage");
        // The next solve (every 2 s) plus the snapshot pull (1 s).
        assert!(replan <= 3.0 + 1e-9, "seed {}: re-planned after {replan} s", c.seed);
        assert_eq!(ilb.failed, ilb.failed_in_flight, "seed {}: lost beyond the in-flight requests", c.seed);
        assert!(c.policies["nearest"].failed_no_engine > 0, "nearest has nowhere to send b's traffic");
        let feedback = transient(c, "feedback");
        assert!(
            outage.e2e_ms.mean < feedback.e2e_ms.mean,
            "seed {}: mean e2e during the outage: ilb {:.1} vs feedback {:.1}",
            c.seed,
            outage.e2e_ms.mean,
            feedback.e2e_ms.mean
        );
        assert_eq!(outage.shed, 0, "seed {}: shed during the outage", c.seed);
    }
}
