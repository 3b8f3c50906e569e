//! ARCHITECTURE.md lists the modules of the layered crates (the data plane, the planning model,
//! the control plane's shell and the optimizer) leaves first, each importing only modules above
//! it in the list, so imports point one way and no two modules import each other. This test
//! reads those lists from ARCHITECTURE.md itself and each crate's sources, and fails when a
//! module names one listed after it (`use crate::x`, `use crate::{a, b::c}` or an inline
//! `crate::x::f()` path), when a module is missing from the list or a listed one does not exist,
//! or when a module outside tests uses an item of `lib.rs` (which sits above them all).
#![allow(clippy::disallowed_methods)] // a test of the source tree reads it

use std::collections::BTreeMap;
use std::path::Path;

const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");

/// The crates whose modules ARCHITECTURE.md lists in layers.
const LAYERED: &[&str] = &["ilb-dataplane", "ilb-planning", "ilb-controlplane", "ilb-optimizer"];

/// A crate's modules in ARCHITECTURE.md's order. The list is the bullets of the crate's
/// section (`### `krate``) before its first **Invariant:** line; a module is a backticked
/// `name.rs` or `name/` that starts a bullet or a sentence (after `.` or `;`). Files of a
/// directory module are named inside parentheses, so they are not taken for modules.
fn documented_order(markdown: &str, krate: &str) -> Vec<String> {
    let heading = format!("\n### `{krate}`\n");
    let section = markdown
        .split(heading.as_str())
        .nth(1)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no \"### `{krate}`\" section"));
    let mut bullets: Vec<String> = Vec::new();
    for line in section.lines() {
        if line.starts_with("**Invariant:**") || line.starts_with("### ") {
            break;
        }
        if let Some(first) = line.strip_prefix("- ") {
            bullets.push(first.to_owned());
        } else if let (Some(bullet), Some(more)) = (bullets.last_mut(), line.strip_prefix("  ")) {
            bullet.push(' ');
            bullet.push_str(more.trim());
        }
    }
    let mut order = Vec::new();
    for bullet in &bullets {
        // Odd pieces are inside backticks.
        let pieces: Vec<&str> = bullet.split('`').collect();
        for (i, quoted) in pieces.iter().enumerate().skip(1).step_by(2) {
            let before = pieces[..i].concat();
            let starts_sentence = before.trim_end().is_empty() || before.trim_end().ends_with(['.', ';']);
            let name = quoted.strip_suffix(".rs").or_else(|| quoted.strip_suffix('/'));
            if let Some(name) = name.filter(|n| is_module_name(n)) {
                if starts_sentence {
                    order.push(name.to_owned());
                }
            }
        }
    }
    order
}

fn is_module_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// `source` with comments and the contents of string and character literals blanked out
/// (newlines kept, so offsets keep their line numbers).
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&chars, i) {
            // A raw string: r"..." or r#"..."#.
            let hashes = chars[i + 1..].iter().take_while(|c| **c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let end = format!("\"{}", "#".repeat(hashes));
            let body_start = i + 2 + hashes;
            let rest: String = chars[body_start..].iter().collect();
            let body_len = rest.find(&end).map_or(rest.chars().count(), |b| rest[..b].chars().count());
            out.push('"');
            for c in &chars[body_start..body_start + body_len] {
                blank(&mut out, *c);
            }
            out.push('"');
            i = body_start + body_len + end.chars().count();
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                let skip = if chars[i] == '\\' { 2 } else { 1 };
                for c in chars.iter().skip(i).take(skip) {
                    blank(&mut out, *c);
                }
                i += skip;
            }
            out.push('"');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or else a lifetime.
            let len = if next == Some('\\') {
                chars.get(i + 3..).and_then(|rest| rest.iter().position(|c| *c == '\'')).map(|p| p + 4)
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(3)
            } else {
                None
            };
            match len {
                Some(len) => {
                    out.push_str(&" ".repeat(len));
                    i += len;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// The byte ranges of `#[cfg(test)] mod name { .. }` blocks in cleaned code.
fn test_modules(code: &str) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    for (at, _) in code.match_indices("#[cfg(test)]") {
        let rest = &code[at..];
        let Some(open) = rest.find(['{', ';']) else { continue };
        if !rest[..open].contains("mod ") || rest.as_bytes()[open] != b'{' {
            continue;
        }
        let mut depth = 0;
        for (offset, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        ranges.push(at..at + open + offset);
                        break;
                    }
                }
                _ => {}
            }
        }
    }
    ranges
}

/// The first segment of every path below `crate::` in cleaned code, with its byte offset: one
/// for `crate::a::b`, one per item for `crate::{a, b::c, d::{e, f}}`.
fn crate_paths(code: &str) -> Vec<(String, usize)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (at, _) in code.match_indices("crate") {
        let before_ok = at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        let rest = code[at + "crate".len()..].trim_start();
        let Some(tree) = rest.strip_prefix("::").filter(|_| before_ok) else { continue };
        let tree = tree.trim_start();
        let offset = code.len() - tree.len();
        if let Some(group) = tree.strip_prefix('{') {
            // Split the group's items at its top-level commas.
            let (mut depth, mut item_start) = (0, 0);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        found.extend(first_segment(&group[item_start..i], offset + 1 + item_start));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        found.extend(first_segment(&group[item_start..i], offset + 1 + item_start));
                        item_start = i + 1;
                    }
                    _ => {}
                }
            }
        } else {
            found.extend(first_segment(tree, offset));
        }
    }
    found
}

fn first_segment(item: &str, offset: usize) -> Option<(String, usize)> {
    let trimmed = item.trim_start();
    let name: String =
        trimmed.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '*').collect();
    (!name.is_empty()).then(|| (name, offset + item.len() - trimmed.len()))
}

/// A use of something under `crate::` by a file of a top-level module.
struct Use {
    name: String,
    /// `file:line`.
    place: String,
    in_test: bool,
}

/// The `crate::` uses of each top-level module's files (`lib.rs` left out).
fn imports(src: &Path) -> BTreeMap<String, Vec<Use>> {
    let mut out: BTreeMap<String, Vec<Use>> = BTreeMap::new();
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
            let code = code_only(&std::fs::read_to_string(&path).unwrap());
            let tests = test_modules(&code);
            for (name, offset) in crate_paths(&code) {
                if name != module && name != "self" {
                    let line = code[..offset].matches('\n').count() + 1;
                    let place = format!("src/{}:{line}", relative.display());
                    uses.push(Use { name, place, in_test: tests.iter().any(|t| t.contains(&offset)) });
                }
            }
        }
    }
    out
}

/// Every way `graph` breaks `order`: a module listed twice, a module not in it, a module of it
/// that does not exist, a use of a module listed later (or of no module), a use of `lib.rs`'s
/// items outside tests.
fn problems(graph: &BTreeMap<String, Vec<Use>>, order: &[String], krate: &str) -> Vec<String> {
    let position = |m: &str| order.iter().position(|o| o == m);
    let mut problems = Vec::new();
    for (i, listed) in order.iter().enumerate() {
        if order[..i].contains(listed) {
            problems.push(format!("module `{listed}` is listed twice in ARCHITECTURE.md"));
        }
    }
    for missing in order.iter().filter(|m| !graph.contains_key(*m)) {
        problems.push(format!("module `{missing}` is listed in ARCHITECTURE.md but has no source file"));
    }
    for (module, uses) in graph {
        let Some(at) = position(module) else {
            problems.push(format!("module `{module}` is not in ARCHITECTURE.md's list of {krate} modules"));
            continue;
        };
        for Use { name, place, in_test } in uses {
            if name == "*" {
                problems.push(format!("{place}: `{module}` glob-imports `crate::*`; name the modules"));
            } else if !is_module_name(name) {
                // An item of lib.rs (`DataPlane`, a re-export): lib.rs sits above every module.
                if !in_test {
                    problems.push(format!(
                        "{place}: `{module}` uses `crate::{name}` from lib.rs; use the module that defines it"
                    ));
                }
            } else {
                match position(name) {
                    Some(p) if p < at => {}
                    Some(_) => problems.push(format!(
                        "{place}: `{module}` uses `crate::{name}`, listed after it in ARCHITECTURE.md"
                    )),
                    None => problems.push(format!("{place}: `crate::{name}` is not a listed module")),
                }
            }
        }
    }
    problems
}

fn sources(krate: &str) -> BTreeMap<String, Vec<Use>> {
    imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src"))
}

fn order(krate: &str) -> Vec<String> {
    documented_order(&std::fs::read_to_string(ARCHITECTURE).unwrap(), krate)
}

#[test]
fn modules_import_only_modules_listed_before_them() {
    for krate in LAYERED {
        let order = order(krate);
        let problems = problems(&sources(krate), &order, krate);
        assert!(
            problems.is_empty(),
            "{krate} module layers (ARCHITECTURE.md order {order:?}):\n{}",
            problems.join("\n")
        );
    }
}

#[test]
fn the_lists_are_read_from_architecture_md() {
    for (krate, first, last, inside) in [
        ("ilb-dataplane", "clock", "server", &["codec", "conn", "origin", "lib"][..]),
        ("ilb-planning", "prom", "view", &["members", "fit", "lib"][..]),
        ("ilb-controlplane", "clock", "run", &["dns", "engines", "lib"][..]),
        ("ilb-optimizer", "problem", "gen", &["lib"][..]),
    ] {
        let order = order(krate);
        assert_eq!(order.first().map(String::as_str), Some(first), "{krate}: {order:?}");
        assert_eq!(order.last().map(String::as_str), Some(last), "{krate}: {order:?}");
        for inside in inside {
            assert!(
                !order.iter().any(|m| m == inside),
                "{krate}: `{inside}` is not a top-level module: {order:?}"
            );
        }
    }
}

#[test]
fn the_check_sees_a_use_that_points_up() {
    for (krate, upward) in [
        ("ilb-dataplane", "`proxy` uses `crate::shared`, listed after it"),
        ("ilb-planning", "`planner` uses `crate::plan`, listed after it"),
        ("ilb-controlplane", "`run` uses `crate::events`, listed after it"),
        ("ilb-optimizer", "`coarse` uses `crate::newton`, listed after it"),
    ] {
        let (graph, order) = (sources(krate), order(krate));
        let reversed: Vec<String> = order.iter().rev().cloned().collect();
        let reported = problems(&graph, &reversed, krate);
        assert!(reported.iter().any(|p| p.contains(upward)), "{krate}: {reported:?}");
        assert!(!problems(&graph, &order[1..], krate).is_empty(), "{krate}: a module left out is reported");
    }
}

#[test]
fn grouped_and_inline_paths_are_seen() {
    let code = code_only(
        "use crate::{alpha, beta::Gamma, delta::{e, f}};\n\
         // crate::commented\n\
         let s = \"crate::quoted\"; let r = r#\"crate::raw\"#; let c = '\"';\n\
         fn f() { crate::epsilon::call(); ilb_crate::not_this(); }\n\
         use crate::\n    {zeta,\n     eta};\n",
    );
    let names: Vec<String> = crate_paths(&code).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["alpha", "beta", "delta", "epsilon", "zeta", "eta"]);
    let code = code_only(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::DataPlane;\n}\nuse crate::Outside;\n",
    );
    let tests = test_modules(&code);
    let in_test: Vec<(String, bool)> =
        crate_paths(&code).into_iter().map(|(n, at)| (n, tests.iter().any(|t| t.contains(&at)))).collect();
    assert_eq!(in_test, [("DataPlane".to_owned(), true), ("Outside".to_owned(), false)]);
}
