//! Scenario parsing and validation: bad scenarios are refused with a message naming the field.

use ilb_fleet_sim::Scenario;

const BASE: &str = include_str!("../../../scenarios/residency.toml");

fn check(edit: impl Fn(&str) -> String, expected: &str) {
    let text = edit(BASE);
    let error = Scenario::from_toml(&text).expect_err("must be refused").to_string();
    assert!(error.contains(expected), "{error:?} does not mention {expected:?}");
}

#[test]
fn bundled_scenarios_parse() {
    for text in [
        include_str!("../../../scenarios/three-regions.toml"),
        include_str!("../../../scenarios/global-day.toml"),
        include_str!("../../../scenarios/region-outage.toml"),
        include_str!("../../../scenarios/overload.toml"),
        include_str!("../../../scenarios/far-regions.toml"),
        include_str!("../../../scenarios/hot-residency.toml"),
        include_str!("../../../scenarios/surge.toml"),
        include_str!("../../../scenarios/grey-engine.toml"),
        include_str!("../../../scenarios/peak-outage.toml"),
        include_str!("../../../scenarios/replicas.toml"),
        BASE,
    ] {
        Scenario::from_toml(text).expect("valid");
    }
    let global = Scenario::from_toml(include_str!("../../../scenarios/global-day.toml")).expect("valid");
    assert!(global.engines.len() >= 300 && global.regions.len() >= 6);
}

#[test]
fn errors_name_the_field() {
    check(|t| t.replace("duration_s = 240", "duration_s = -1"), "duration_s");
    check(|t| t.replace("hardware = \"h100\"", "hardware = \"tpu\""), "engines.eu.hardware");
    check(|t| t.replace("class = \"eu-only\"", "class = \"nowhere\""), "clusters.eu.demand[1].class");
    check(|t| t.replace("region = \"us\"\ndemand", "region = \"mars\"\ndemand"), "clusters.us.region");
    check(|t| t.replace("seed = 9", "seed = 9\nsurprise = 1"), "unknown field `surprise`");
    check(|t| t.replace("[control]", "[control]\nrho = 2.0"), "control.rho");
    check(
        |t| t.replace("[control]", "[control]\ndata_planes = 0"),
        "control.data_planes: 0 is not in [1, 32]",
    );
    check(|t| t.replace("[control]", "[control]\ndata_planes = 33"), "control.data_planes");
    check(
        |t| t.replace("[control]", "[control]\ndata_plane_sharing = \"gossip\""),
        "unknown variant `gossip`",
    );
    check(|t| t.replace("turns_mean = 3.0", "turns_mean = 0.5"), "workload.turns_mean");
    check(
        |t| format!("{t}\n[[events]]\nat_s = 10.0\nkind = \"slowdown\"\ngroup = \"eu\"\n"),
        "events[0].factor",
    );
    check(
        |t| format!("{t}\n[[events]]\nat_s = 10.0\nkind = \"engine_failure\"\n"),
        "events[0]: needs `group` or `region`",
    );
    check(
        |t| format!("{t}\n[[events]]\nat_s = 10.0\nkind = \"surge\"\nfactor = 2.0\nwindow_s = 0.0\n"),
        "events[0].window_s",
    );
    check(
        |t| t.replace("policies", "x").replace("seed = 9", "seed = 9\npolicies = [\"magic\"]"),
        "unknown policy 'magic'",
    );
}
