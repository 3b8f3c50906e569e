//! Documentation that must stay true to the code:
//! - `docs/config.md` is generated from the doc comments of the config types; this test
//!   regenerates it and fails on any difference (`ILB_BLESS=1 cargo test -p ilb --test docs`
//!   rewrites it). Its last two sections are hand-written here (`FLEET_CHANGES`,
//!   `STABILITY_KNOBS`).
//! - every metric the Grafana dashboard queries is documented in `docs/metrics.md`.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (source file, struct, TOML table it is read from)
const SECTIONS: &[(&str, &str, &str)] = &[
    ("crates/ilb-dataplane/src/config.rs", "DataPlaneSection", "[data_plane]"),
    ("crates/ilb-dataplane/src/config.rs", "TimeoutsSection", "[data_plane.timeouts]"),
    ("crates/ilb/src/tls.rs", "ListenerTlsSection", "[data_plane.tls] and [control_plane.tls]"),
    (
        "crates/ilb/src/tls.rs",
        "ClientTlsSection",
        "[data_plane.engine_tls], [data_plane.control_plane_tls] and [control_plane.engine_tls]",
    ),
    ("crates/ilb-planning/src/config.rs", "ControlPlaneSettings", "[control_plane]"),
    ("crates/ilb-planning/src/config.rs", "OutlierSettings", "[control_plane.outliers]"),
    ("crates/ilb-planning/src/config.rs", "Region", "[[regions]]"),
    ("crates/ilb-planning/src/config.rs", "NetworkSettings", "[network]"),
    ("crates/ilb-planning/src/config.rs", "LinkLatency", "[[network.latency]]"),
    ("crates/ilb-planning/src/config.rs", "Cluster", "[[clusters]]"),
    ("crates/ilb-planning/src/config.rs", "ClassRule", "[[classes]]"),
    ("crates/ilb-planning/src/config.rs", "Profile", "[profiles.NAME]"),
    ("crates/ilb-planning/src/config.rs", "Engine", "[[engines]]"),
    ("crates/ilb-planning/src/config.rs", "EngineGroup", "[[engine_groups]]"),
    ("crates/ilb-planning/src/fleet/members.rs", "Registration", "POST /v1/engines (JSON body)"),
];

/// Appended to the generated reference: how the fleet changes while the control plane runs.
const FLEET_CHANGES: &str = "
## Changing the fleet while it runs

- **Reload.** `ilb control-plane --config FILE` checks the file's modification time every
  `--watch-ms` (default 1000; 0 = only on SIGHUP) and re-reads it on SIGHUP. A valid file is
  applied as a diff: engines added, removed or changed; regions, clusters, classes, profiles,
  groups and settings replaced. Engines whose `url`, `model` and `profile` stayed keep their
  signals, fitted history and penalties. An invalid file is refused with the field-named reason
  (logged, and in `/v1/state` under `membership.config.rejected`); the running configuration
  stays. A changed `control_plane.listen` needs a restart (`membership.config.needs_restart`).
  `ilb control-plane --check-config FILE` validates a file and exits (0 and `ok`, or 1 and the
  reason).
- **Registration.** With `control_plane.token` set, `POST /v1/engines` (header
  `Authorization: Bearer TOKEN`, body above) registers an engine or renews its lease; the same
  call is the heartbeat. `DELETE /v1/engines/{id}` removes it at once; a lease not renewed
  within `ttl_s` removes it at the next solve tick. Without a token registration is off (403).
  Errors: 400 names the invalid field, 409 an id the file or a discovery group already uses.
  `ilb engine-sim --register URL [--token T] [--region R] [--register-profile P] [--ttl-s S]`
  registers its engines, renews every `ttl_s / 3`, and deregisters and drains on Ctrl-C.
- **Discovery.** `[[engine_groups]]` are resolved by DNS; see the table above.
- **Data-plane replicas.** Several data planes of one cluster share conversation placements,
  stored-response engines and load. With a control plane they do so through it: each report
  carries what its data plane decided and the answer what the cluster's others did (about a
  report period late). Naming each other with `peers` (`--peer URL`) is faster: they post
  each other as requests start and end, and at least every `peer_interval_ms`
  ([deploy.md](deploy.md)).
- **Control-plane replicas.** Run several `ilb control-plane` from the same file. Give each
  data plane all of them (`--control-plane URL` repeated, or `control_plane = [..]`): it pulls
  snapshots from one, moves to the next when it stops answering, and reports to all. Give
  `ilb engine-sim --register` each of them too. A data plane never installs a version lower
  than it holds, whichever replica offers it. With etcd (`--etcd URL`, or
  `[control_plane.etcd]` with `endpoints`, `prefix` (default `/ilb/control-plane`),
  `lease_ttl_s` (default 2) and `name`), the replicas elect one planner on an etcd lease: only
  it publishes, every replica serves its plans (written to etcd, watched by the others), and
  versions are 2^52 + term·2^24 + n, the term being the leader's election-key revision, so a
  deposed leader's plan is never installed after its successor's; when the leader dies, another
  takes over once its lease lapses (about `lease_ttl_s`). Without etcd every replica plans on
  its own and versions are Unix-millisecond publication times, which order replicas' plans
  correctly only while their clocks agree to better than a solve period. Engine holds stay per
  replica in both cases.
- **Drain.** An engine that leaves by any route is absent from the next snapshot: data planes
  send it no new request, let its running responses finish, close its idle connections at once
  and each busy one when its response ends.
";

/// Appended after it: the stability settings and the optimizer constant they work with, together.
const STABILITY_KNOBS: &str = "
## The stability knobs

Four rules decide whether a published split changes; together they keep weights still while
only noise moves, and let them move at once for a real change. Three are settings of
`[control_plane]` (in the table above); the fourth is a constant of the optimizer. What each
did in the fleet simulator, and the variants tried instead, is in `docs/results.md`. To watch
them: `/v1/state` shows each class's measured demand, the band's centre it is planned from and
its headroom, and the metrics `ilb_controlplane_traffic_moved` and `ilb_controlplane_solve_gap`
show what each solve moved and what holding the previous split costs.

- **`demand_band_sigmas`** (default 3) protects against re-planning on measurement noise. Each
  class's demand is held within a band this many standard deviations of the EWMA's noise wide
  on each side (√(rate / 2·smoothing) for Poisson arrivals; a longer `smoothing_ms` makes the
  band narrower and the estimate slower). The class is planned at the band's top, so the band
  is also the headroom kept for bursts. Raise it when traffic is burstier than Poisson (long
  conversations, batches arriving together) and plans move at steady demand. Lower it, or set
  0, when small real changes must be followed at once and churn matters less. A wider band
  lags a drifting demand further and reserves more headroom.
- **`stability_ms`** (default 100) protects conversations' prefix caches. A plan must save this
  many ms of latency per req/s it moves before any class's weights change; a moved conversation
  pays the prefill of its cached prefix again. Set it near that cost on your engines: higher
  for long shared prefixes or slow prefill, 0 for traffic with no cache to lose (embeddings,
  short single-turn prompts). It does not delay real changes: after a demand jump of more than
  twice a class's band, or an engine joining, leaving or changing its capacity, the model is
  planned without it for three smoothing time constants.
- **`stability_tolerance`** (default 0.001) protects against moves whose saving is within the
  solver's own certified gap: a class keeps its weights while the plan's expected latency stays
  within this fraction of the new optimum. Rarely changed. Raising it (at most 0.1) holds
  weights through larger differences at that much expected latency; 0 turns it off.
- **The held headroom share** (`HELD_HEADROOM_SHARE` = 0.5 in
  `crates/ilb-optimizer/src/stability.rs`; not a setting) protects held weights from noise steps
  of the demand estimate on a full engine. A class that keeps its weights need only fit its
  engines without half its headroom; what the other half would put beyond an engine's usable
  capacity is planned on engines with room, and the weights stay. Half, because at steady
  demand the band's top sits about half a band above the mean, so the held weights must still
  carry the mean within capacity. A larger share holds weights through bigger steps but can pin
  a class to a full engine while its demand really rises; changing it is a code change.
";

/// (field, type, doc comment)
type Field = (String, String, String);

/// The doc comment and fields of `pub struct name`, read from the source text.
fn fields(source: &str, name: &str) -> Option<(String, Vec<Field>)> {
    let start = source.find(&format!("pub struct {name} {{"))?;
    let struct_doc: Vec<&str> = source[..start]
        .lines()
        .rev()
        .skip_while(|l| l.trim().is_empty())
        .take_while(|l| l.trim_start().starts_with("///") || l.trim_start().starts_with("#["))
        .filter_map(|l| l.trim_start().strip_prefix("///"))
        .map(str::trim)
        .collect();
    let struct_doc = struct_doc.into_iter().rev().collect::<Vec<_>>().join(" ");
    let body = &source[start..];
    let body = &body[body.find('{')? + 1..body.find("\n}")?];
    let mut out = Vec::new();
    let mut doc = Vec::new();
    for line in body.lines().map(str::trim) {
        if let Some(d) = line.strip_prefix("///") {
            doc.push(d.trim().to_owned());
        } else if let Some(field) = line.strip_prefix("pub ") {
            let (name, ty) = field.split_once(':')?;
            out.push((name.trim().to_owned(), ty.trim().trim_end_matches(',').to_owned(), doc.join(" ")));
            doc.clear();
        } else if !line.starts_with("#[") {
            doc.clear();
        }
    }
    Some((struct_doc, out))
}

fn generate() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the doc comments of the config types by `crates/ilb/tests/docs.rs`\n\
         (`ILB_BLESS=1 cargo test -p ilb --test docs` regenerates it). One TOML file holds a\n\
         `[data_plane]` table for `ilb data-plane --config` and the fleet tables for\n\
         `ilb control-plane --config`. Unknown fields are errors; every error names its field.\n",
    );
    for (file, name, table) in SECTIONS {
        let source = std::fs::read_to_string(root().join(file)).unwrap();
        let Some((doc, fields)) = fields(&source, name) else { continue };
        out.push_str(&format!("\n## `{table}`\n\n"));
        if !doc.is_empty() {
            out.push_str(&format!("{doc}\n\n"));
        }
        out.push_str("| field | type | meaning |\n|---|---|---|\n");
        for (field, ty, doc) in fields {
            let ty = ty.replace('|', "\\|");
            out.push_str(&format!("| `{field}` | `{ty}` | {} |\n", doc.replace('|', "\\|")));
        }
    }
    out.push_str(FLEET_CHANGES);
    out.push_str(STABILITY_KNOBS);
    out
}

#[test]
fn config_reference_matches_the_doc_comments() {
    let path = root().join("docs/config.md");
    let generated = generate();
    if std::env::var("ILB_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let current = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        current == generated,
        "docs/config.md is out of date with the config types; run `ILB_BLESS=1 cargo test -p ilb --test docs`"
    );
}

#[test]
fn grafana_queries_only_documented_metrics() {
    let dashboard = std::fs::read_to_string(root().join("docs/grafana/ilb.json")).unwrap();
    let documented = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    let mut checked = 0;
    for (i, _) in dashboard.match_indices("ilb_") {
        let name: String =
            dashboard[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let base = name.trim_end_matches("_bucket");
        // Families documented with a shared prefix (`ilb_controlplane_engine_running`, `_waiting`)
        // are matched by their last word.
        let last = base.rsplit('_').next().unwrap_or(base);
        assert!(
            documented.contains(base)
                || documented.contains(&format!("`_{last}`"))
                || documented.contains(&format!("_{last}`")),
            "{base} is queried by the dashboard but not documented"
        );
        checked += 1;
    }
    assert!(checked > 10);
}
