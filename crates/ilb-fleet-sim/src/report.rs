//! The comparison as text (a Markdown table, also what `ilb simulate` prints) and as JSON;
//! and the same scenario over several seeds as Markdown tables of mean (min–max) per policy
//! ([`seeds`]).

use crate::metrics::{PolicyResult, TransientStats};
use crate::Comparison;
use std::fmt::Write;

/// The summary table: one row per policy, in run order.
pub fn table(c: &Comparison) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| policy | e2e mean | e2e p50 | e2e p99 | ttft mean | ttft p50 | ttft p99 | cache hit | goodput | shed | failed | util mean±sd | churn/period | osc/h | churn steady | osc/h steady | largest move steady |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for name in &c.order {
        let Some(r) = c.policies.get(name) else { continue };
        let _ = writeln!(
            out,
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}% | {:.1} | {:.1}% | {} | {:.2}±{:.2} | {:.2}% | {:.1} | {} | {} | {} |",
            r.e2e_ms.mean,
            r.e2e_ms.p50,
            r.e2e_ms.p99,
            r.ttft_ms.mean,
            r.ttft_ms.p50,
            r.ttft_ms.p99,
            100.0 * r.cache_hit_rate,
            r.goodput_rps,
            100.0 * r.shed_rate,
            r.failed,
            r.utilisation_mean,
            r.utilisation_spread,
            100.0 * r.weight_churn,
            r.oscillation,
            r.steady_churn.map_or_else(|| "—".to_owned(), |c| format!("{:.2}%", 100.0 * c)),
            r.steady_oscillation.map_or_else(|| "—".to_owned(), |o| format!("{o:.1}")),
            r.steady_largest_move.map_or_else(|| "—".to_owned(), |m| format!("{:.1}%", 100.0 * m)),
        );
    }
    let _ = writeln!(out, "\nlatencies in ms (network included), goodput in req/s with TTFT within the SLO");
    if let Some(ilb) = c.policies.get("ilb") {
        if let Some(p) = ilb.steady_state_e2e_ms.or(ilb.predicted_e2e_ms) {
            let delta = 100.0 * (ilb.e2e_ms.mean - p) / p;
            let _ = writeln!(
                out,
                "ilb: optimizer-predicted mean latency at steady state {p:.1} ms, simulated {:.1} ms ({delta:+.1} %)",
                ilb.e2e_ms.mean
            );
        }
        if let Some(r) = ilb.replan_s {
            let _ = writeln!(out, "ilb: re-planned around failed engines within {r:.1} s");
        }
    }
    let events = c.policies.values().map(|r| r.transients.len()).max().unwrap_or(0);
    if events > 0 {
        let _ = writeln!(
            out,
            "\n| event | policy | re-plan s | settle s | e2e mean during | e2e p99 during | ttft mean during | e2e mean before | shed | failed |"
        );
        let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for e in 0..events {
            for name in &c.order {
                let Some(r) = c.policies.get(name) else { continue };
                let Some(t) = r.transients.get(e) else { continue };
                let secs = |v: Option<f64>| match (r.plans, v) {
                    (false, _) => "n/a".to_owned(),
                    (true, None) => "never".to_owned(),
                    (true, Some(v)) => format!("{v:.1}"),
                };
                let _ = writeln!(
                    out,
                    "| {} | {name} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1}% | {} |",
                    event_label(t),
                    secs(t.replan_s),
                    secs(t.settle_s),
                    t.e2e_ms.mean,
                    t.e2e_ms.p99,
                    t.ttft_ms.mean,
                    t.before_e2e_ms.mean,
                    100.0 * t.shed as f64 / t.arrivals.max(1) as f64,
                    t.failed,
                );
            }
        }
    }
    out
}

fn event_label(t: &TransientStats) -> String {
    format!("{} at {:.0} s ({:.0} s)", t.kind, t.at_s, t.window_s)
}

/// Mean, min and max of some values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Spread> {
        let values: Vec<f64> = values.into_iter().collect();
        if values.is_empty() {
            return None;
        }
        let mean = values.iter().sum::<f64>() / values.len() as f64;
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Some(Spread { mean, min, max })
    }

    /// `mean (min–max)` with `decimals` digits, each value multiplied by `scale`.
    fn show(&self, scale: f64, decimals: usize, unit: &str) -> String {
        format!(
            "{:.d$}{unit} ({:.d$}–{:.d$})",
            self.mean * scale,
            self.min * scale,
            self.max * scale,
            d = decimals
        )
    }
}

/// Runs of one scenario with different seeds (the same policies), as Markdown: a heading, a
/// table with one row per policy giving mean (min–max) over the seeds, a table per scenario
/// event when there are events (re-plan and settle times, latency during the transient), and
/// a one-line comparison of `ilb` with `feedback`. Empty if `runs` is.
pub fn seeds(runs: &[Comparison]) -> String {
    let mut out = String::new();
    let Some(first) = runs.first() else { return out };
    let seeds: Vec<String> = runs.iter().map(|c| c.seed.to_string()).collect();
    let _ = writeln!(
        out,
        "### `{}`: seeds {} ({} simulated s, warm-up {} s)\n",
        first.scenario,
        seeds.join(", "),
        first.duration_s,
        first.warmup_s
    );
    let _ = writeln!(
        out,
        "| policy | e2e mean ms | e2e p99 ms | ttft mean ms | cache hit | churn/period | reversals/h | churn steady | rev/h steady | largest move steady | shed | failed |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let show = |rs: &[&PolicyResult], f: fn(&PolicyResult) -> f64, scale: f64, d: usize, unit: &str| {
        Spread::of(rs.iter().map(|r| f(r))).map_or_else(|| "—".to_owned(), |s| s.show(scale, d, unit))
    };
    // Over the seeds that have the figure (a run without steady demand has none).
    let some =
        |rs: &[&PolicyResult], f: fn(&PolicyResult) -> Option<f64>, scale: f64, d: usize, unit: &str| {
            Spread::of(rs.iter().filter_map(|r| f(r)))
                .map_or_else(|| "—".to_owned(), |s| s.show(scale, d, unit))
        };
    for name in &first.order {
        let rs = per_seed(runs, name);
        if rs.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            show(&rs, |r| r.e2e_ms.mean, 1.0, 0, ""),
            show(&rs, |r| r.e2e_ms.p99, 1.0, 0, ""),
            show(&rs, |r| r.ttft_ms.mean, 1.0, 0, ""),
            show(&rs, |r| r.cache_hit_rate, 100.0, 1, "%"),
            show(&rs, |r| r.weight_churn, 100.0, 2, "%"),
            show(&rs, |r| r.oscillation, 1.0, 1, ""),
            some(&rs, |r| r.steady_churn, 100.0, 2, "%"),
            some(&rs, |r| r.steady_oscillation, 1.0, 1, ""),
            some(&rs, |r| r.steady_largest_move, 100.0, 1, "%"),
            show(&rs, |r| r.shed_rate, 100.0, 2, "%"),
            show(&rs, |r| r.failed as f64, 1.0, 0, ""),
        );
    }
    event_tables(&mut out, runs, &first.order);
    let _ = writeln!(out, "\n{}", versus(runs, "ilb", "feedback"));
    out
}

/// Policy `name`'s result of each run that has one.
fn per_seed<'r>(runs: &'r [Comparison], name: &str) -> Vec<&'r PolicyResult> {
    runs.iter().filter_map(|c| c.policies.get(name)).collect()
}

/// One table per scenario event (policies in `order`): re-plan and settle times, and latency
/// during the transient, as mean (min–max) over the seeds.
fn event_tables(out: &mut String, runs: &[Comparison], order: &[String]) {
    let events = runs.iter().flat_map(|c| c.policies.values()).map(|r| r.transients.len()).max().unwrap_or(0);
    for e in 0..events {
        let Some(label) =
            runs.iter().flat_map(|c| c.policies.values()).find_map(|r| r.transients.get(e)).map(event_label)
        else {
            continue;
        };
        let _ = writeln!(out, "\nEvent {e}: {label}\n");
        let _ = writeln!(
            out,
            "| policy | re-plan s | settle s | e2e mean during | e2e p99 during | ttft mean during | e2e mean before | shed during | failed |"
        );
        let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        for name in order {
            let ts: Vec<(&PolicyResult, &TransientStats)> = per_seed(runs, name)
                .into_iter()
                .filter_map(|r| r.transients.get(e).map(|t| (r, t)))
                .collect();
            if ts.is_empty() {
                continue;
            }
            let secs = |f: fn(&TransientStats) -> Option<f64>| {
                if !ts.iter().all(|(r, _)| r.plans) {
                    return "n/a".to_owned();
                }
                let got: Vec<f64> = ts.iter().filter_map(|(_, t)| f(t)).collect();
                let never = ts.len() - got.len();
                match (Spread::of(got), never) {
                    (None, _) => "never".to_owned(),
                    (Some(s), 0) => s.show(1.0, 1, ""),
                    (Some(s), k) => format!("{} (never on {k} of {})", s.show(1.0, 1, ""), ts.len()),
                }
            };
            let val = |f: fn(&TransientStats) -> f64, scale: f64, d: usize, unit: &str| {
                Spread::of(ts.iter().map(|(_, t)| f(t)))
                    .map_or_else(|| "—".to_owned(), |s| s.show(scale, d, unit))
            };
            let _ = writeln!(
                out,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |",
                secs(|t| t.replan_s),
                secs(|t| t.settle_s),
                val(|t| t.e2e_ms.mean, 1.0, 0, ""),
                val(|t| t.e2e_ms.p99, 1.0, 0, ""),
                val(|t| t.ttft_ms.mean, 1.0, 0, ""),
                val(|t| t.before_e2e_ms.mean, 1.0, 0, ""),
                val(|t| t.shed as f64 / t.arrivals.max(1) as f64, 100.0, 2, "%"),
                val(|t| t.failed as f64, 1.0, 0, ""),
            );
        }
    }
}

/// One line: `a`'s mean e2e latency against `b`'s over the seeds, and on how many seeds `a`
/// was lower (mean and p99).
pub fn versus(runs: &[Comparison], a: &str, b: &str) -> String {
    let pairs: Vec<(&PolicyResult, &PolicyResult)> =
        runs.iter().filter_map(|c| Some((c.policies.get(a)?, c.policies.get(b)?))).collect();
    let name = runs.first().map_or("", |c| c.scenario.as_str());
    if pairs.is_empty() {
        return format!("`{name}`: no runs with both {a} and {b}");
    }
    let mean = |rs: &mut dyn Iterator<Item = f64>| Spread::of(rs).map_or(0.0, |s| s.mean);
    let (ma, mb) =
        (mean(&mut pairs.iter().map(|p| p.0.e2e_ms.mean)), mean(&mut pairs.iter().map(|p| p.1.e2e_ms.mean)));
    let lower_mean = pairs.iter().filter(|p| p.0.e2e_ms.mean < p.1.e2e_ms.mean).count();
    let lower_p99 = pairs.iter().filter(|p| p.0.e2e_ms.p99 < p.1.e2e_ms.p99).count();
    format!(
        "`{name}`: {a} mean e2e {ma:.0} ms vs {b} {mb:.0} ms ({:+.1} %); {a} lower on {lower_mean} of {n} seeds (mean), {lower_p99} of {n} (p99)",
        100.0 * (ma - mb) / mb.max(1e-9),
        n = pairs.len()
    )
}

/// The comparison as pretty JSON (deterministic: ordered maps, no wall-clock fields).
pub fn json(c: &Comparison) -> Result<String, serde_json::Error> {
    serde_json::to_string_pretty(c)
}

/// Runs of different fleets (`ilb simulate --random`), as Markdown: per baseline, on how many
/// fleets `ilb`'s mean and p99 end-to-end latency were at or below the baseline's, `ilb`'s
/// relative difference in mean and p99 over the fleets (mean, min–max) and the fleet where it
/// did worst; how often `ilb`'s own prediction (mean over its plans after the warm-up) was
/// within 5 % of the mean it delivered; then one row per fleet.
pub fn random_batch(runs: &[Comparison]) -> String {
    let mut out = String::new();
    let baselines: Vec<&String> = runs
        .iter()
        .flat_map(|c| c.order.iter())
        .filter(|p| p.as_str() != "ilb")
        .fold(Vec::new(), |mut seen, p| {
            if !seen.contains(&p) {
                seen.push(p);
            }
            seen
        });
    let _ = writeln!(out, "### ilb against each baseline over {} random fleets\n", runs.len());
    let _ = writeln!(
        out,
        "| baseline | ilb mean ≤ | ilb p99 ≤ | ilb mean vs baseline | ilb p99 vs baseline | worst fleet (mean) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for baseline in baselines {
        let pairs: Vec<(&str, &PolicyResult, &PolicyResult)> = runs
            .iter()
            .filter_map(|c| Some((c.scenario.as_str(), c.policies.get("ilb")?, c.policies.get(baseline)?)))
            .collect();
        if pairs.is_empty() {
            continue;
        }
        let relative = |a: f64, b: f64| (a - b) / b.max(1e-9);
        let mean_diff: Vec<f64> = pairs.iter().map(|p| relative(p.1.e2e_ms.mean, p.2.e2e_ms.mean)).collect();
        let p99_diff: Vec<f64> = pairs.iter().map(|p| relative(p.1.e2e_ms.p99, p.2.e2e_ms.p99)).collect();
        let (worst, worst_diff) = pairs
            .iter()
            .zip(&mean_diff)
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(("", 0.0), |(p, d)| (p.0, *d));
        let _ = writeln!(
            out,
            "| {baseline} | {} of {n} | {} of {n} | {} | {} | {worst} ({:+.1} %) |",
            mean_diff.iter().filter(|d| **d <= 0.0).count(),
            p99_diff.iter().filter(|d| **d <= 0.0).count(),
            Spread::of(mean_diff.iter().copied()).map_or(String::new(), |s| s.show(100.0, 1, " %")),
            Spread::of(p99_diff.iter().copied()).map_or(String::new(), |s| s.show(100.0, 1, " %")),
            100.0 * worst_diff,
            n = pairs.len(),
        );
    }
    let predictions: Vec<f64> = runs
        .iter()
        .filter_map(|c| {
            let ilb = c.policies.get("ilb")?;
            Some((ilb.predicted_e2e_ms? - ilb.e2e_ms.mean) / ilb.e2e_ms.mean.max(1e-9))
        })
        .collect();
    let _ = writeln!(
        out,
        "\nilb's predicted mean within 5 % of the delivered one on {} of {} fleets; error {}.\n",
        predictions.iter().filter(|e| e.abs() <= 0.05).count(),
        predictions.len(),
        Spread::of(predictions.iter().copied()).map_or(String::new(), |s| s.show(100.0, 1, " %")),
    );
    let _ =
        writeln!(out, "| fleet | ilb mean / p99 ms | feedback mean / p99 ms | ilb predicted ms | ilb shed |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for c in runs {
        let cell = |name: &str| {
            c.policies
                .get(name)
                .map_or("–".to_owned(), |r| format!("{:.0} / {:.0}", r.e2e_ms.mean, r.e2e_ms.p99))
        };
        let ilb = c.policies.get("ilb");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            c.scenario,
            cell("ilb"),
            cell("feedback"),
            ilb.and_then(|r| r.predicted_e2e_ms).map_or("–".to_owned(), |p| format!("{p:.0}")),
            ilb.map_or("–".to_owned(), |r| format!("{:.1} %", 100.0 * r.shed_rate)),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::LatencySummary;
    use std::collections::BTreeMap;

    fn run(seed: u64, ilb_ms: f64, feedback_ms: f64) -> Comparison {
        let result = |mean: f64, plans: bool, replan: Option<f64>| PolicyResult {
            e2e_ms: LatencySummary { mean, p50: mean, p99: 4.0 * mean },
            plans,
            transients: vec![TransientStats {
                kind: "surge".into(),
                at_s: 50.0,
                window_s: 50.0,
                replan_s: replan,
                e2e_ms: LatencySummary { mean: 2.0 * mean, p50: 0.0, p99: 0.0 },
                ..TransientStats::default()
            }],
            ..PolicyResult::default()
        };
        let mut policies = BTreeMap::new();
        policies.insert("nearest".to_owned(), result(900.0, false, None));
        policies.insert("feedback".to_owned(), result(feedback_ms, true, None));
        policies.insert("ilb".to_owned(), result(ilb_ms, true, Some(seed as f64)));
        Comparison {
            scenario: "s".into(),
            seed,
            duration_s: 100.0,
            warmup_s: 10.0,
            calibration: Vec::new(),
            policies,
            order: vec!["nearest".into(), "feedback".into(), "ilb".into()],
        }
    }

    #[test]
    fn seeds_show_mean_and_range_per_policy_and_transient() {
        let text = seeds(&[run(1, 100.0, 120.0), run(2, 140.0, 130.0), run(3, 120.0, 140.0)]);
        assert!(text.contains("seeds 1, 2, 3"), "{text}");
        assert!(text.contains("| ilb | 120 (100–140) | 480 (400–560) |"), "{text}");
        assert!(text.contains("| feedback | 130 (120–140) |"), "{text}");
        // Re-plan: ilb's times, feedback never, the baseline has no plans.
        assert!(text.contains("| ilb | 2.0 (1.0–3.0) | never | 240 (200–280) |"), "{text}");
        assert!(text.contains("| feedback | never | never |"), "{text}");
        assert!(text.contains("| nearest | n/a | n/a |"), "{text}");
        assert!(text.contains("ilb lower on 2 of 3 seeds (mean)"), "{text}");
        assert!(seeds(&[]).is_empty());
    }
}
