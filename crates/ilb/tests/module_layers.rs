//! ARCHITECTURE.md lists the modules of the layered crates (the data plane, the planning model,
//! the control plane's shell and the optimizer) and of the binary's `ilb demo` leaves first, each
//! importing only modules above it in the list, so imports point one way and no two modules
//! import each other. This test reads those lists from ARCHITECTURE.md itself and the sources,
//! and fails when a module names one listed after it (`use crate::x`, `use crate::{a, b::c}`, an
//! inline `crate::x::f()` path, or `super::x` from a file directly below the root), when a module
//! is missing from the list or a listed one does not exist, or when a module outside tests uses
//! an item of the root file (`lib.rs`, `mod.rs`), which sits above them all.
#![allow(clippy::disallowed_methods)] // a test of the source tree reads it

use std::collections::BTreeMap;
use std::path::Path;

const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");

/// A tree of modules whose order ARCHITECTURE.md lists: a crate, or the binary's `cmd/demo/`.
struct Tree {
    /// The ARCHITECTURE.md section that lists the modules (`### `section``).
    section: &'static str,
    /// The tree's directory, under `crates/`.
    dir: &'static str,
    /// The file that wires the modules together and sits above them (`lib`, `mod`).
    root: &'static str,
    /// The root's path below `crate::` (empty for a crate).
    path: &'static [&'static str],
}

/// The layered crates, and `ilb demo` (listed in the binary's section).
const LAYERED: &[Tree] = &[
    Tree { section: "ilb-dataplane", dir: "ilb-dataplane/src", root: "lib", path: &[] },
    Tree { section: "ilb-planning", dir: "ilb-planning/src", root: "lib", path: &[] },
    Tree { section: "ilb-controlplane", dir: "ilb-controlplane/src", root: "lib", path: &[] },
    Tree { section: "ilb-optimizer", dir: "ilb-optimizer/src", root: "lib", path: &[] },
    Tree { section: "ilb", dir: "ilb/src/cmd/demo", root: "mod", path: &["cmd", "demo"] },
];

fn tree(section: &str) -> &'static Tree {
    LAYERED.iter().find(|t| t.section == section).expect("a layered tree")
}

/// A tree's modules in ARCHITECTURE.md's order. The list is the bullets of its section
/// (`### `section``) before its first **Invariant:** line; a module is a backticked
/// `name.rs` or `name/` that starts a bullet or a sentence (after `.` or `;`). Files of a
/// directory module are named inside parentheses, so they are not taken for modules.
fn documented_order(markdown: &str, section: &str) -> Vec<String> {
    let heading = format!("\n### `{section}`\n");
    let section = markdown
        .split(heading.as_str())
        .nth(1)
        .unwrap_or_else(|| panic!("ARCHITECTURE.md has no \"### `{section}`\" section"));
    let mut bullets: Vec<String> = Vec::new();
    for line in section.lines() {
        if line.starts_with("**Invariant:**") || line.starts_with("### ") || line.starts_with("## ") {
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

/// Every path that starts with `keyword::` in cleaned code (`keyword` being `crate` or `super`),
/// its use tree flattened, with each item's byte offset: `crate::a::b` gives `a::b`, and
/// `crate::{a, b::{c, d as e}}` gives `a`, `b::c` and `b::d`. For `super::super::x` it gives
/// `super::x`.
fn paths_below(code: &str, keyword: &str) -> Vec<(Vec<String>, usize)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (at, _) in code.match_indices(keyword) {
        let ident_before = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
        // A `super` after `::` continues a path that an earlier match already read.
        let continues_path = code[..at].trim_end().ends_with("::");
        let rest = code[at + keyword.len()..].trim_start();
        if ident_before || continues_path || !rest.starts_with("::") {
            continue;
        }
        use_tree(code, code.len() - rest.len() + 2, &mut Vec::new(), &mut found);
    }
    found
}

/// Reads the use tree at `at` (after `prefix::`) into `found`, one path per item; returns where
/// it ends.
fn use_tree(code: &str, at: usize, prefix: &mut Vec<String>, found: &mut Vec<(Vec<String>, usize)>) -> usize {
    let skip_space = |i: usize| code.len() - code[i..].trim_start().len();
    let depth = prefix.len();
    let mut i = skip_space(at);
    let item_at = i;
    loop {
        if code[i..].starts_with('{') {
            i += 1;
            loop {
                i = use_tree(code, i, prefix, found);
                // On past a rename (`b as c`) to the item's end.
                i += code[i..].find([',', '}']).unwrap_or(code.len() - i);
                let comma = code[i..].starts_with(',');
                i = (i + 1).min(code.len());
                if !comma {
                    break;
                }
            }
            break;
        }
        let name_len = code[i..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '*'))
            .unwrap_or(code.len() - i);
        if name_len == 0 {
            break;
        }
        prefix.push(code[i..i + name_len].to_owned());
        i = skip_space(i + name_len);
        if code[i..].starts_with("::") {
            i = skip_space(i + 2);
        } else {
            found.push((prefix.clone(), item_at));
            break;
        }
    }
    prefix.truncate(depth);
    i
}

/// A use of one of the tree's modules, or of an item of its root, by a file of a top-level module.
struct Use {
    name: String,
    /// `file:line`.
    place: String,
    in_test: bool,
}

/// The uses each top-level module's files make of the tree's modules and its root's items (the
/// root file left out): `crate::` paths through the tree's root, and `super::` paths that climb
/// exactly to it (from a file's top level, or from its `#[cfg(test)]` module one level deeper;
/// other inline modules are not told apart).
fn imports(tree: &Tree) -> BTreeMap<String, Vec<Use>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(tree.dir);
    let mut out: BTreeMap<String, Vec<Use>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
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
            let relative = path.strip_prefix(&src).unwrap();
            let top = relative.components().next().unwrap().as_os_str().to_string_lossy();
            let module = top.trim_end_matches(".rs").to_owned();
            if module == tree.root {
                continue;
            }
            // The `super`s that lead from the file's top level to the root.
            let depth =
                relative.components().count() - usize::from(path.file_name().is_some_and(|f| f == "mod.rs"));
            let uses = out.entry(module.clone()).or_default();
            let code = code_only(&std::fs::read_to_string(&path).unwrap());
            let tests = test_modules(&code);
            let in_test = |offset: usize| tests.iter().any(|t| t.contains(&offset));
            let mut named = Vec::new();
            for (path, offset) in paths_below(&code, "crate") {
                let through_root =
                    path.len() > tree.path.len() && path.iter().zip(tree.path).all(|(a, b)| a == b);
                if through_root {
                    named.push((path[tree.path.len()].clone(), offset));
                }
            }
            for (path, offset) in paths_below(&code, "super") {
                let climbs = 1 + path.iter().take_while(|s| *s == "super").count();
                if climbs == depth + usize::from(in_test(offset)) && path.len() >= climbs {
                    named.push((path[climbs - 1].clone(), offset));
                }
            }
            for (name, offset) in named {
                if name != module && name != "self" {
                    let line = code[..offset].matches('\n').count() + 1;
                    let place = format!("{}/{}:{line}", tree.dir, relative.display());
                    uses.push(Use { name, place, in_test: in_test(offset) });
                }
            }
        }
    }
    out
}

/// Every way `graph` breaks `order`: a module listed twice, a module not in it, a module of it
/// that does not exist, a use of a module listed later (or of no module), a use of the root's
/// items outside tests.
fn problems(graph: &BTreeMap<String, Vec<Use>>, order: &[String], tree: &Tree) -> Vec<String> {
    let position = |m: &str| order.iter().position(|o| o == m);
    let root: String = tree.path.iter().map(|segment| format!("{segment}::")).collect();
    let (section, root_file) = (tree.section, format!("{}.rs", tree.root));
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
            problems.push(format!("module `{module}` is not in ARCHITECTURE.md's list of {section} modules"));
            continue;
        };
        for Use { name, place, in_test } in uses {
            if name == "*" {
                problems.push(format!("{place}: `{module}` glob-imports `crate::{root}*`; name the modules"));
            } else if !is_module_name(name) {
                // An item of the root (`DataPlane`, a re-export): the root sits above every module.
                if !in_test {
                    problems.push(format!(
                        "{place}: `{module}` uses `crate::{root}{name}` from {root_file}; use the module that defines it"
                    ));
                }
            } else {
                match position(name) {
                    Some(p) if p < at => {}
                    Some(_) => problems.push(format!(
                        "{place}: `{module}` uses `crate::{root}{name}`, listed after it in ARCHITECTURE.md"
                    )),
                    None => problems.push(format!("{place}: `crate::{root}{name}` is not a listed module")),
                }
            }
        }
    }
    problems
}

fn order(tree: &Tree) -> Vec<String> {
    documented_order(&std::fs::read_to_string(ARCHITECTURE).unwrap(), tree.section)
}

#[test]
fn modules_import_only_modules_listed_before_them() {
    for tree in LAYERED {
        let order = order(tree);
        let problems = problems(&imports(tree), &order, tree);
        assert!(
            problems.is_empty(),
            "{} module layers (ARCHITECTURE.md order {order:?}):\n{}",
            tree.dir,
            problems.join("\n")
        );
    }
}

#[test]
fn the_lists_are_read_from_architecture_md() {
    for (section, first, last, inside) in [
        ("ilb-dataplane", "clock", "server", &["codec", "conn", "origin", "lib"][..]),
        ("ilb-planning", "prom", "view", &["members", "fit", "lib"][..]),
        ("ilb-controlplane", "clock", "run", &["dns", "engines", "lib"][..]),
        ("ilb-optimizer", "problem", "gen", &["lib"][..]),
        ("ilb", "args", "scenario", &["mod", "main", "config", "traffic"][..]),
    ] {
        let order = order(tree(section));
        assert_eq!(order.first().map(String::as_str), Some(first), "{section}: {order:?}");
        assert_eq!(order.last().map(String::as_str), Some(last), "{section}: {order:?}");
        for inside in inside {
            assert!(
                !order.iter().any(|m| m == inside),
                "{section}: `{inside}` is not a top-level module: {order:?}"
            );
        }
    }
}

#[test]
fn the_check_sees_a_use_that_points_up() {
    for (section, upward) in [
        ("ilb-dataplane", "`proxy` uses `crate::shared`, listed after it"),
        ("ilb-planning", "`planner` uses `crate::plan`, listed after it"),
        ("ilb-controlplane", "`run` uses `crate::events`, listed after it"),
        ("ilb-optimizer", "`coarse` uses `crate::newton`, listed after it"),
        // Written `super::fleet`.
        ("ilb", "`worked_example` uses `crate::cmd::demo::fleet`, listed after it"),
    ] {
        let tree = tree(section);
        let (graph, order) = (imports(tree), order(tree));
        let reversed: Vec<String> = order.iter().rev().cloned().collect();
        let reported = problems(&graph, &reversed, tree);
        assert!(reported.iter().any(|p| p.contains(upward)), "{section}: {reported:?}");
        assert!(!problems(&graph, &order[1..], tree).is_empty(), "{section}: a module left out is reported");
    }
}

#[test]
fn grouped_inline_and_relative_paths_are_seen() {
    let paths = |code: &str, keyword: &str| -> Vec<String> {
        paths_below(&code_only(code), keyword).into_iter().map(|(path, _)| path.join("::")).collect()
    };
    let code = "use crate::{alpha, beta::Gamma as G, delta::{e, f,}};\n\
         // crate::commented\n\
         let s = \"crate::quoted\"; let r = r#\"crate::raw\"#; let c = '\"';\n\
         fn f() { crate::epsilon::call(); ilb_crate::not_this(); }\n\
         use crate::\n    {zeta,\n     eta};\n";
    assert_eq!(
        paths(code, "crate"),
        ["alpha", "beta::Gamma", "delta::e", "delta::f", "epsilon::call", "zeta", "eta"]
    );
    let code = "use super::stack::{addr, DemoArgs};\nuse super::super::traffic;\nfn g() { superb::no(); }\n";
    assert_eq!(paths(code, "super"), ["stack::addr", "stack::DemoArgs", "super::traffic"]);
    let code = code_only(
        "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::DataPlane;\n}\nuse crate::Outside;\n",
    );
    let tests = test_modules(&code);
    let in_test: Vec<(String, bool)> = paths_below(&code, "crate")
        .into_iter()
        .map(|(path, at)| (path.join("::"), tests.iter().any(|t| t.contains(&at))))
        .collect();
    assert_eq!(in_test, [("DataPlane".to_owned(), true), ("Outside".to_owned(), false)]);
}
