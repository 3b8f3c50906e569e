//! Documentation that must stay true to the code:
//! - `docs/config.md` is generated from the doc comments of the config types; this test
//!   regenerates it and fails on any difference (`ILB_BLESS=1 cargo test -p ilb --test docs`
//!   rewrites it).
//! - every metric the Grafana dashboard queries is documented in `docs/metrics.md`.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// (source file, struct, TOML table it is read from)
const SECTIONS: &[(&str, &str, &str)] = &[
    ("crates/ilb/src/config.rs", "DataPlaneSection", "[data_plane]"),
    ("crates/ilb/src/config.rs", "TimeoutsSection", "[data_plane.timeouts]"),
    ("crates/ilb/src/tls.rs", "ListenerTlsSection", "[data_plane.tls] and [control_plane.tls]"),
    (
        "crates/ilb/src/tls.rs",
        "ClientTlsSection",
        "[data_plane.engine_tls], [data_plane.control_plane_tls] and [control_plane.engine_tls]",
    ),
    ("crates/ilb-controlplane/src/config.rs", "ControlPlaneSettings", "[control_plane]"),
    ("crates/ilb-controlplane/src/config.rs", "OutlierSettings", "[control_plane.outliers]"),
    ("crates/ilb-controlplane/src/config.rs", "Region", "[[regions]]"),
    ("crates/ilb-controlplane/src/config.rs", "NetworkSettings", "[network]"),
    ("crates/ilb-controlplane/src/config.rs", "LinkLatency", "[[network.latency]]"),
    ("crates/ilb-controlplane/src/config.rs", "Cluster", "[[clusters]]"),
    ("crates/ilb-controlplane/src/config.rs", "ClassRule", "[[classes]]"),
    ("crates/ilb-controlplane/src/config.rs", "Profile", "[profiles.NAME]"),
    ("crates/ilb-controlplane/src/config.rs", "Engine", "[[engines]]"),
];

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
