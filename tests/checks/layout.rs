//! The modules of each crate form no cycle: a module that names another through a `crate::`
//! or `super::` path, or a child it declares, depends on it; no chain of those leads back. (Two
//! cycles in the engine and two in the operator were untangled once; this keeps them so.)
//! Test modules (`#[cfg(test)]` to the end of a file) and comments are not read.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

type Module = Vec<String>;

/// Every `.rs` file under `src`, by its module path (`mod.rs`, `lib.rs`, `main.rs` stand for
/// their directory).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, src: &Path, out: &mut BTreeMap<Module, PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, src, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path
                    .strip_prefix(src)
                    .expect("under src")
                    .with_extension("");
                let mut module: Module = relative
                    .iter()
                    .map(|part| part.to_string_lossy().into_owned())
                    .collect();
                if matches!(
                    module.last().map(String::as_str),
                    Some("mod" | "lib" | "main")
                ) {
                    module.pop();
                }
                out.insert(module, path);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The code a module's dependencies are read from: up to its inline test module
/// (`#[cfg(test)]` then `mod NAME {`), without comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            let next = lines.get(i + 1).map(|l| l.trim()).unwrap_or_default();
            lines[i].trim() == "#[cfg(test)]" && next.starts_with("mod ") && next.ends_with('{')
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// `code` with each `prefix::{a, b::c}` written out as `prefix::a, prefix::b::c` (nested
/// groups too), so that a grouped import names what it imports, not the prefix.
fn expand_groups(code: &str) -> String {
    let Some(open) = code.find("::{") else {
        return code.to_string();
    };
    let start = code[..open]
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .map_or(0, |at| at + 1);
    let prefix = &code[start..open];
    let mut depth = 0;
    let mut close = code.len();
    for (at, c) in code[open + 2..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    close = open + 2 + at;
                    break;
                }
            }
            _ => {}
        }
    }
    let inner = &code[(open + 3).min(close)..close];
    let mut items = Vec::new();
    let (mut level, mut from) = (0, 0);
    for (at, c) in inner.char_indices() {
        match c {
            '{' => level += 1,
            '}' => level -= 1,
            ',' if level == 0 => {
                items.push(&inner[from..at]);
                from = at + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[from..]);
    let written: Vec<String> = items
        .iter()
        .map(|item| item.trim())
        .filter(|item| !item.is_empty())
        .map(|item| format!("{prefix}::{item}"))
        .collect();
    let rest = code.get(close + 1..).unwrap_or_default();
    let written = expand_groups(&written.join(", "));
    format!("{}{written}{}", &code[..start], expand_groups(rest)).replace("::self", "")
}

/// Paths like `crate::a::b` and `super::super::c` in `code`, as their segments.
fn paths(code: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let code = expand_groups(code);
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .collect();
    for word in words {
        let segments: Vec<String> = word.split("::").map(str::to_string).collect();
        if segments.len() > 1 && matches!(segments[0].as_str(), "crate" | "super") {
            found.push(segments);
        }
    }
    found
}

/// The modules `module` depends on.
fn dependencies(module: &Module, file: &Path, all: &BTreeMap<Module, PathBuf>) -> BTreeSet<Module> {
    let text = code(file);
    let resolve = |full: Module| -> Option<Module> {
        (0..=full.len())
            .rev()
            .map(|n| full[..n].to_vec())
            .find(|prefix| all.contains_key(prefix))
    };
    let mut out = BTreeSet::new();
    for path in paths(&text) {
        let mut base = if path[0] == "crate" {
            Vec::new()
        } else {
            module.clone()
        };
        let mut rest = &path[..];
        if path[0] == "crate" {
            rest = &path[1..];
        } else {
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
        }
        base.extend(rest.iter().cloned());
        if let Some(target) = resolve(base) {
            out.insert(target);
        }
    }
    // A directory module names its children by their bare names (`run::start`); a `pub use`
    // that only shows a child's items at the parent's path is a facade, not a use.
    let text: String = without_reexports(&text);
    let own_dir = file
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
    if own_dir {
        for child in all
            .keys()
            .filter(|m| m.len() == module.len() + 1 && m.starts_with(module))
        {
            let name = child.last().expect("a child has a name");
            let named = text.match_indices(&format!("{name}::")).any(|(at, _)| {
                !text[..at].ends_with("::")
                    && !text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
            });
            if named {
                out.insert(child.clone());
            }
        }
    }
    out.remove(module);
    out
}

/// `code` without its `pub use ...;` items.
fn without_reexports(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("pub use ") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once(';').map_or("", |(_, after)| after);
    }
    out.push_str(rest);
    out
}

/// A cycle in `graph`, if any, as the modules along it.
fn cycle(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &Module,
        graph: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        marks.insert(node.clone(), Mark::Open);
        stack.push(node.clone());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let from = stack.iter().position(|m| m == next).expect("on the stack");
                    let mut found = stack[from..].to_vec();
                    found.push(next.clone());
                    return Some(found);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(found) = visit(next, graph, marks, stack) {
                        return Some(found);
                    }
                }
            }
        }
        stack.pop();
        marks.insert(node.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node) {
            if let Some(found) = visit(node, graph, &mut marks, &mut Vec::new()) {
                return Some(found);
            }
        }
    }
    None
}

fn module_graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let all = modules(src);
    all.iter()
        .map(|(module, file)| (module.clone(), dependencies(module, file, &all)))
        .collect()
}

fn shown(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "crate".to_string()
            } else {
                m.join("::")
            }
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

#[test]
fn no_crate_has_an_import_cycle() {
    for src in [
        "src",
        "redlock/src",
        "localcluster/src",
        "quickstart/src",
        "testsupport/src",
    ] {
        let graph = module_graph(&Path::new(ROOT).join(src));
        assert!(
            graph.len() > 1 || src == "quickstart/src",
            "{src}: no modules read"
        );
        if let Some(found) = cycle(&graph) {
            panic!(
                "{src}: modules depend on each other in a cycle: {}",
                shown(&found)
            );
        }
    }
}

#[test]
fn grouped_imports_name_what_they_import() {
    let found = paths("use super::{env, volumes::{a, b}};\nuse crate::x::{self, y};");
    let shown: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(
        shown,
        [
            "super::env",
            "super::volumes::a",
            "super::volumes::b",
            "crate::x",
            "crate::x::y"
        ]
    );
}

#[test]
fn a_child_that_names_its_parents_item_is_a_cycle() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("engine")).expect("mkdir");
    std::fs::write(src.join("lib.rs"), "mod engine;\n").expect("write");
    std::fs::write(
        src.join("engine/mod.rs"),
        "mod batch;\npub struct Engine;\nfn f() { batch::send(); }\n",
    )
    .expect("write");
    std::fs::write(
        src.join("engine/batch.rs"),
        "use super::Engine;\npub fn send() {}\n",
    )
    .expect("write");
    let found = cycle(&module_graph(src)).map(|c| shown(&c));
    assert_eq!(found.as_deref(), Some("engine -> engine::batch -> engine"));
    // Named through a sibling module instead: no cycle.
    std::fs::write(src.join("engine/types.rs"), "pub struct Engine;\n").expect("write");
    std::fs::write(
        src.join("engine/mod.rs"),
        "mod batch;\nmod types;\nfn f() { batch::send(); }\n",
    )
    .expect("write");
    std::fs::write(
        src.join("engine/batch.rs"),
        "use super::types::Engine;\npub fn send() {}\n",
    )
    .expect("write");
    assert_eq!(cycle(&module_graph(src)).map(|c| shown(&c)), None);
}

/// `src/cli/` parses arguments and calls the subsystems, which never reach back up into it:
/// keeping a lease (the watchdog, its statuses) belongs to the lease runner in `src/elect/`,
/// which `exec` and `elect` share, and leader election is not filed as a front-end.
#[test]
fn command_line_files_keep_no_lease_and_hold_no_election() {
    let src = Path::new(ROOT).join("src");
    let is_cli = |module: &Module| module.first().is_some_and(|m| m == "cli");
    for (module, dependencies) in module_graph(&src) {
        // The crate root declares `cli`; every other module is a subsystem or below.
        let subsystem = !module.is_empty() && !is_cli(&module);
        if let Some(cli) = dependencies.iter().find(|d| subsystem && is_cli(d)) {
            panic!(
                "{} reaches up into the command line ({}): a subsystem is called by src/cli/, not the reverse",
                module.join("::"),
                cli.join("::")
            );
        }
    }
    assert!(
        !src.join("cli/elect").exists() && !src.join("cli/elect.rs").exists(),
        "leader election lives in src/elect/, not under src/cli/"
    );
    let cli: Vec<(Module, PathBuf)> = modules(&src)
        .into_iter()
        .filter(|(module, _)| is_cli(module))
        .collect();
    assert!(cli.len() > 1, "no module read under src/cli/");
    for (module, path) in cli {
        let code = code(&path);
        for lease_logic in ["Watchdog", "LeaseStatus"] {
            assert!(
                !code.contains(lease_logic),
                "{} names {lease_logic}: keeping a lease belongs to src/elect/lease_runner.rs",
                module.join("::")
            );
        }
    }
}
