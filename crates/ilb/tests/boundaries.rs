//! The crate boundaries of ARCHITECTURE.md, checked on `cargo metadata`'s resolved graph: a
//! crate must not depend, directly or through others (normal dependencies only, for this
//! machine's platform), on the crates its rules ban. Also: the binary's own `clippy.toml` keeps
//! the workspace's clock bans word for word (it only drops the file and environment ones).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// The workspace's crates, which a rule may name together.
const ILB_CRATES: &[&str] = &[
    "ilb",
    "ilb-core",
    "ilb-optimizer",
    "ilb-tls",
    "ilb-engine-sim",
    "ilb-dataplane",
    "ilb-planning",
    "ilb-controlplane",
    "ilb-epp",
    "ilb-fleet-sim",
];

/// (crate, crates it must not depend on, why). ARCHITECTURE.md states each under its crate.
fn rules() -> Vec<(&'static str, Vec<&'static str>, &'static str)> {
    let mut rules = vec![
        ("ilb-core", vec!["tokio", "hyper", "mio"], "the pure core has no runtime and no IO"),
        ("ilb-optimizer", vec!["tokio", "hyper", "mio"], "the optimizer is a pure library"),
        ("ilb-engine-sim", vec!["ilb-dataplane", "ilb-controlplane"], "the engine simulator stands alone"),
        (
            "ilb-dataplane",
            vec!["ilb-controlplane", "ilb-optimizer"],
            "the data plane never needs the control plane",
        ),
        ("ilb-dataplane", vec!["tonic"], "gRPC stays in the EPP, out of the data plane"),
        (
            "ilb-epp",
            vec!["ilb-controlplane"],
            "the EPP is the data plane's routing behind a gateway, not a control plane",
        ),
        (
            "ilb-controlplane",
            vec!["ilb-dataplane", "ilb-engine-sim"],
            "the control plane never depends on the data plane",
        ),
        (
            "ilb-planning",
            vec![
                "tokio",
                "hyper",
                "mio",
                "hickory-resolver",
                "ilb-tls",
                "ilb-dataplane",
                "ilb-engine-sim",
                "ilb-controlplane",
            ],
            "the planning model does no I/O: no runtime, HTTP, DNS or TLS, nothing of the other planes",
        ),
        (
            "ilb-fleet-sim",
            vec!["ilb-controlplane"],
            "the fleet simulator runs the planning model, not the control plane's shell",
        ),
    ];
    // The shared TLS crate sits below both planes and the simulator: no other ilb crate.
    let others: Vec<&str> = ILB_CRATES.iter().copied().filter(|c| *c != "ilb-tls").collect();
    rules.push(("ilb-tls", others, "ilb-tls depends on no other ilb crate"));
    // The fleet simulator sits above the product: only the binary (and tests) may use it.
    for krate in ILB_CRATES.iter().copied().filter(|c| !["ilb", "ilb-fleet-sim"].contains(c)) {
        rules.push((krate, vec!["ilb-fleet-sim"], "nothing but the binary depends on the fleet simulator"));
    }
    rules
}

/// The resolved graph: package name → the names of its normal dependencies on this platform.
struct Graph {
    deps: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    fn load() -> Graph {
        let cargo = env!("CARGO");
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
        // This machine's platform only: other platforms' packages need not be downloaded, so
        // this runs offline once the workspace has been built.
        let version = Command::new(cargo).arg("-vV").output().expect("run `cargo -vV`");
        let version = String::from_utf8_lossy(&version.stdout).into_owned();
        let host =
            version.lines().find_map(|l| l.strip_prefix("host: ")).expect("`cargo -vV` names the host");
        let output = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--offline", "--filter-platform", host])
            .arg("--manifest-path")
            .arg(manifest)
            .output()
            .expect("run `cargo metadata`");
        assert!(
            output.status.success(),
            "cargo metadata failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
        let names: BTreeMap<&str, &str> = metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| (p["id"].as_str().expect("package id"), p["name"].as_str().expect("package name")))
            .collect();
        let mut deps = BTreeMap::new();
        for node in metadata["resolve"]["nodes"].as_array().expect("resolve.nodes") {
            let name = names[node["id"].as_str().expect("node id")].to_owned();
            let normal = node["deps"]
                .as_array()
                .expect("node deps")
                .iter()
                .filter(|d| d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null())))
                .map(|d| names[d["pkg"].as_str().expect("dep pkg")].to_owned());
            deps.entry(name).or_insert_with(BTreeSet::new).extend(normal);
        }
        Graph { deps }
    }

    /// The shortest chain of normal dependencies from `from` to `to`, if there is one.
    fn path(&self, from: &str, to: &str) -> Option<Vec<String>> {
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(at) = queue.pop_front() {
            if at == to {
                let mut path = vec![to.to_owned()];
                let mut step = to;
                while let Some(previous) = came_from.get(step) {
                    path.push((*previous).to_owned());
                    step = previous;
                }
                path.reverse();
                return Some(path);
            }
            for next in self.deps.get(at).into_iter().flatten() {
                let next = next.as_str();
                if next != from && !came_from.contains_key(next) {
                    came_from.insert(next, at);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// Every rule that `graph` breaks, with the chain of dependencies that breaks it.
fn violations(graph: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    for (krate, banned, why) in rules() {
        assert!(graph.deps.contains_key(krate), "`{krate}` is not in the workspace's resolved graph");
        for banned in banned {
            if let Some(path) = graph.path(krate, banned) {
                found.push(format!("{krate} must not depend on {banned} ({why}): {}", path.join(" -> ")));
            }
        }
    }
    found
}

#[test]
fn crates_keep_their_boundaries() {
    let graph = Graph::load();
    let found = violations(&graph);
    assert!(found.is_empty(), "crate boundaries broken (ARCHITECTURE.md):\n{}", found.join("\n"));
}

#[test]
fn the_check_sees_dependencies_that_exist() {
    let graph = Graph::load();
    // Direct and transitive normal dependencies are seen...
    assert!(graph.path("ilb", "tokio").is_some(), "the check does not see ilb -> tokio");
    assert!(graph.path("ilb", "mio").is_some(), "the check does not see ilb -> tokio -> mio");
    assert!(
        graph.path("ilb-dataplane", "ilb-tls").is_some(),
        "the check does not see ilb-dataplane -> ilb-tls"
    );
    // ...and a rule that the graph breaks is reported with its chain.
    let mut broken = Graph { deps: graph.deps.clone() };
    broken.deps.get_mut("ilb-tls").unwrap().insert("ilb-core".to_owned());
    broken.deps.get_mut("ilb-core").unwrap().insert("ilb-engine-sim".to_owned());
    let found = violations(&broken);
    assert!(
        found
            .iter()
            .any(|v| v.starts_with("ilb-tls must not depend on ilb-core")
                && v.ends_with("ilb-tls -> ilb-core")),
        "{found:?}"
    );
    assert!(found.iter().any(|v| v.starts_with("ilb-core must not depend on tokio")), "{found:?}");
    // Dev-dependencies are not normal ones: ilb's tests use ilb-tls's `test-certs`, not a rule.
    assert!(graph.path("ilb-core", "proptest").is_none(), "a dev-dependency was taken for a normal one");
}

/// The `disallowed-methods` entries of a clippy.toml, as (path, reason) pairs.
fn disallowed_methods(file: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("cannot read {file}: {e}"));
    let config: toml::Table = toml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    config["disallowed-methods"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no disallowed-methods"))
        .iter()
        .map(|m| (m["path"].as_str().unwrap().to_owned(), m["reason"].as_str().unwrap().to_owned()))
        .collect()
}

#[test]
fn the_binary_bans_the_clock_as_the_workspace_does() {
    let workspace = disallowed_methods(concat!(env!("CARGO_MANIFEST_DIR"), "/../../clippy.toml"));
    let binary = disallowed_methods(concat!(env!("CARGO_MANIFEST_DIR"), "/clippy.toml"));
    // The entries the binary leaves out are exactly those whose reason is that only the
    // binary may do it (read files, the environment or argv).
    let expected: Vec<_> =
        workspace.iter().filter(|(_, reason)| !reason.contains("only the binary")).cloned().collect();
    assert!(expected.iter().any(|(path, _)| path == "std::time::Instant::now"), "{expected:?}");
    assert!(workspace.iter().any(|(path, _)| path == "std::fs::read_to_string"), "{workspace:?}");
    let missing: Vec<_> = expected.iter().filter(|e| !binary.contains(e)).collect();
    let extra: Vec<_> = binary.iter().filter(|e| !expected.contains(e)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "crates/ilb/clippy.toml must list the workspace clippy.toml's entries other than the file and \
         environment ones, word for word; missing: {missing:?}; not in the workspace's: {extra:?}"
    );
}
