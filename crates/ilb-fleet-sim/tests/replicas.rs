//! Several data planes per cluster (`[control] data_planes`, `data_plane_sharing`) on the
//! bundled `replicas` scenario, shortened for debug builds: alone, they move conversations off
//! the engines holding their prefixes; sharing what they decide brings that back to what one
//! data plane does; runs stay deterministic; one data plane is what it always was.

use ilb_fleet_sim::scenario::Sharing;
use ilb_fleet_sim::{simulate, Options, PolicyResult, Scenario};

const REPLICAS: &str = include_str!("../../../scenarios/replicas.toml");

fn options(data_planes: u32, sharing: Sharing, seed: u64) -> Options {
    Options {
        duration_s: Some(60.0),
        seed: Some(seed),
        calibration_s: Some(20.0),
        data_planes: Some(data_planes),
        sharing: Some(sharing),
        ..Options::default()
    }
}

fn json(text: &str, options: &Options) -> String {
    let scenario = Scenario::from_toml(text).expect("valid scenario");
    ilb_fleet_sim::report::json(&simulate(&scenario, options).expect("simulation runs")).expect("json")
}

fn ilb(data_planes: u32, sharing: Sharing) -> PolicyResult {
    let scenario = Scenario::from_toml(REPLICAS).expect("bundled scenario is valid");
    let mut c = simulate(&scenario, &options(data_planes, sharing, 1)).expect("simulation runs");
    c.policies.remove("ilb").expect("the scenario runs ilb")
}

#[test]
fn four_data_planes_alone_move_conversations_and_sharing_brings_them_back() {
    let one = ilb(1, Sharing::None);
    let alone = ilb(4, Sharing::None);
    let peers = ilb(4, Sharing::Peers);
    let control_plane = ilb(4, Sharing::ControlPlane);
    let moves = |r: &PolicyResult| r.session_moves;
    let report = format!(
        "moves: one {:.3}, alone {:.3}, peers {:.3}, control plane {:.3}; hits: one {:.3}, alone {:.3}, \
         peers {:.3}, control plane {:.3}",
        moves(&one),
        moves(&alone),
        moves(&peers),
        moves(&control_plane),
        one.cache_hit_rate,
        alone.cache_hit_rate,
        peers.cache_hit_rate,
        control_plane.cache_hit_rate
    );
    // Seed 1, 60 s gives about: moves 3 % with one data plane, 22 % alone, 2.5 % with peers,
    // 5 % through the control plane; hit rates 79 %, 73 %, 79 %, 78 %.
    assert!(moves(&alone) > moves(&one) + 0.12, "{report}");
    assert!(alone.cache_hit_rate < one.cache_hit_rate - 0.03, "{report}");
    assert!(moves(&peers) < moves(&one) + 0.02, "{report}");
    assert!(peers.cache_hit_rate > one.cache_hit_rate - 0.01, "{report}");
    // A report period lets a few follow-ups through before their placement is known.
    assert!(moves(&control_plane) < moves(&one) + 0.05, "{report}");
    assert!(control_plane.cache_hit_rate > one.cache_hit_rate - 0.02, "{report}");
}

#[test]
fn several_data_planes_give_the_same_json_for_the_same_seed() {
    for sharing in [Sharing::None, Sharing::Peers, Sharing::ControlPlane] {
        let once = json(REPLICAS, &options(4, sharing, 3));
        assert_eq!(once, json(REPLICAS, &options(4, sharing, 3)), "{sharing:?}");
    }
    assert_ne!(
        json(REPLICAS, &options(4, Sharing::Peers, 3)),
        json(REPLICAS, &options(4, Sharing::None, 3)),
        "sharing changes the run"
    );
}

#[test]
fn one_data_plane_is_the_default_and_its_sharing_does_nothing() {
    let without = REPLICAS.replace("data_planes = 4\n", "").replace("data_plane_sharing = \"peers\"\n", "");
    assert_ne!(without, REPLICAS, "the scenario sets both");
    let default = Options { data_planes: None, sharing: None, ..options(1, Sharing::None, 2) };
    let expected = json(&without, &default);
    for sharing in [Sharing::None, Sharing::Peers, Sharing::ControlPlane] {
        assert_eq!(json(REPLICAS, &options(1, sharing, 2)), expected, "{sharing:?}");
    }
}
