//! ARCHITECTURE.md lists the control plane shell's modules leaves first, each importing only
//! modules above it in the list, so imports point one way and no two modules import each
//! other. This test fails when a module names (`crate::x`) one listed after it, or when a
//! module is missing from the list. The order is written below; keep it the same as
//! ARCHITECTURE.md's.
#![allow(clippy::disallowed_methods)] // a test of the source tree reads it

use std::collections::BTreeMap;
use std::path::Path;

/// The modules in the order of ARCHITECTURE.md's code map: each may use only those before it.
const ORDER: &[&str] = &[
    "clock",
    "scrape",
    "publish",
    "guard",
    "telemetry",
    "dashboard",
    "events",
    "registrar",
    "discovery",
    "api",
    "run",
];

/// The `crate::` module names each top-level module's files use, comments left out.
fn imports(src: &Path) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).unwrap();
            let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
            let module = top.trim_end_matches(".rs").to_owned();
            if module == "lib" {
                continue;
            }
            let uses = out.entry(module.clone()).or_default();
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
                for (i, _) in line.match_indices("crate::") {
                    let name: String = line[i + "crate::".len()..]
                        .chars()
                        .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if !name.is_empty() && name != module {
                        uses.push((name, relative.display().to_string()));
                    }
                }
            }
        }
    }
    out
}

/// Every way `graph` breaks `order`: a module not in it, a module of it that does not exist, a
/// use of a module listed later (or of no module).
fn problems(graph: &BTreeMap<String, Vec<(String, String)>>, order: &[&str]) -> Vec<String> {
    let position = |m: &str| order.iter().position(|o| *o == m);
    let mut problems = Vec::new();
    for missing in order.iter().filter(|m| !graph.contains_key(**m)) {
        problems.push(format!("module `{missing}` is listed but has no source file"));
    }
    for (module, uses) in graph {
        let Some(at) = position(module) else {
            problems.push(format!("module `{module}` is not in ORDER (nor in ARCHITECTURE.md's code map)"));
            continue;
        };
        for (used, file) in uses {
            match position(used) {
                Some(p) if p < at => {}
                Some(_) => problems.push(format!("{file}: `{module}` uses `crate::{used}`, listed after it")),
                None => problems.push(format!("{file}: `crate::{used}` is not a module in ORDER")),
            }
        }
    }
    problems
}

#[test]
fn modules_import_only_modules_listed_before_them() {
    let graph = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let problems = problems(&graph, ORDER);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_check_sees_a_use_that_points_up() {
    let graph = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let reversed: Vec<&str> = ORDER.iter().rev().copied().collect();
    assert!(problems(&graph, &reversed)
        .iter()
        .any(|p| p.contains("`run` uses `crate::events`, listed after it")));
    assert!(!problems(&graph, &ORDER[1..]).is_empty(), "a module left out of the list is reported");
}
