//! The top-level modules of the crate, and of `wdp-kubelet` below it, form no import cycle: data
//! flows one way (guest, sandbox, sink and validation, manager, servers, kubelet), and each module
//! builds only on those below it. `wdp-kubelet` (the kubelet API and the device-plugin servers)
//! also stays free of wdp and of any wasm runtime, so its servers reach what they serve only
//! through the traits wdp implements. The guest SDK (`guest-scanners/sdk`, built for wasm in
//! its own workspace) is held to the same rule here, where `cargo test --workspace` runs it.
//!
//! The test reads the crates' own sources and counts every `crate::<module>` path outside
//! comments and test modules as an edge from the module whose file it is in. A cycle fails the
//! test with its path, so a new upward import is caught where it is written.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules `lib.rs` declares under `#[cfg(test)]`: test code, whose imports do not count.
fn test_only(src: &Path) -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read src/lib.rs");
    let mut lines = lib.lines();
    let mut found = BTreeSet::new();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && let Some(name) = lines.next().and_then(|l| l.trim().strip_prefix("mod "))
        {
            found.insert(name.trim_end_matches(';').to_string());
        }
    }
    found
}

/// Each top-level module of `src` that is not test code, and the `.rs` files that make it up.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let test_only = test_only(src);
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("read src/") {
        let path = entry.expect("entry of src/").path();
        let Some(name) = path
            .file_stem()
            .and_then(|n| n.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        if test_only.contains(&name) {
            continue;
        }
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            modules.entry(name).or_insert_with(Vec::new).extend(files);
        } else if path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main" {
            modules.entry(name).or_insert_with(Vec::new).push(path);
        }
    }
    modules
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a module directory") {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level modules `source` names as `crate::<name>`, leaving out comments and everything
/// from a `#[cfg(test)]` module on (test modules end their files here).
fn imports(source: &str, known: &BTreeMap<String, Vec<PathBuf>>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        let line = line.trim_start();
        if line == "#[cfg(test)]" && lines.peek().is_some_and(|l| l.starts_with("mod ")) {
            break;
        }
        if line.starts_with("//") {
            continue;
        }
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::` at the start of a word only: not `wdp_crate::`.
            let word_start = line[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
            if word_start && known.contains_key(&name) {
                found.insert(name);
            }
        }
    }
    found
}

/// The import graph of the modules under `src`: module -> the modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    modules
        .iter()
        .map(|(name, files)| {
            let mut edges = BTreeSet::new();
            for file in files {
                let source = std::fs::read_to_string(file).expect("read a source file");
                edges.extend(imports(&source, &modules));
            }
            edges.remove(name);
            (name.clone(), edges)
        })
        .collect()
}

/// A cycle in `graph`, as the modules along it (the first repeated at the end), if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match marks.get(next) {
                Some(Mark::Open) => {
                    let start = path.iter().position(|n| n == next).unwrap_or(0);
                    let mut cycle = path[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(Mark::Done) => {}
                None => {
                    if let Some(cycle) = visit(next, graph, marks, path) {
                        return Some(cycle);
                    }
                }
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if !marks.contains_key(node)
            && let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

/// Fails with the cycle's path if the top-level modules of `src` import each other in a circle.
fn assert_acyclic(graph: &BTreeMap<String, BTreeSet<String>>) {
    if let Some(cycle) = find_cycle(graph) {
        panic!(
            "import cycle between top-level modules: {} (each imports the next; move the shared \
             part below all of them, or hand the upward call to a trait the upper module implements)",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn top_level_modules_import_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph(&src);
    assert!(graph.len() > 10, "found the crate's modules: {graph:?}");
    assert!(
        !graph.contains_key("layering") && graph.contains_key("sandbox"),
        "test-only modules are left out, the others kept: {graph:?}"
    );
    assert_acyclic(&graph);
}

#[test]
fn the_kubelet_crate_imports_one_way_and_knows_no_wasm() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/kubelet");
    let graph = graph(&root.join("src"));
    assert!(
        graph.contains_key("server") && graph.contains_key("register"),
        "found wdp-kubelet's modules: {graph:?}"
    );
    assert!(
        graph["server"].contains("register") && graph["server"].contains("dir"),
        "the servers build on registration and the directory watch: {graph:?}"
    );
    assert_acyclic(&graph);
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("read its Cargo.toml");
    let depends_on: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|name| *name == "wdp" || name.starts_with("wasm"))
        .collect();
    assert!(
        depends_on.is_empty(),
        "wdp-kubelet depends on {depends_on:?}: its servers must reach wdp through their traits"
    );
}

/// The guest SDK's modules build on each other one way too: the reads every source implements
/// (`reads`) and the globbing (`pathglob`) below the sources (`devfs`, `sysfs`), and the guest's
/// view that combines them (`hostfs`) above both.
#[test]
fn the_guest_sdk_imports_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-scanners/sdk/src");
    let graph = graph(&src);
    assert!(
        graph.contains_key("hostfs") && graph.contains_key("devfs") && graph.contains_key("sysfs"),
        "found the SDK's modules: {graph:?}"
    );
    assert!(
        graph["hostfs"].contains("devfs") && graph["hostfs"].contains("sysfs"),
        "the guest's view builds on both sources: {graph:?}"
    );
    assert_acyclic(&graph);
}

#[test]
fn a_cycle_is_found_and_named() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(
        find_cycle(&graph).map(|c| c.join(" -> ")).as_deref(),
        Some("a -> b -> c -> a")
    );
    let mut acyclic = graph.clone();
    acyclic.get_mut("c").map(BTreeSet::clear);
    assert_eq!(find_cycle(&acyclic), None);
}

#[test]
fn only_code_outside_tests_counts() {
    let known: BTreeMap<String, Vec<PathBuf>> = ["tree", "sandbox", "policy"]
        .into_iter()
        .map(|m| (m.to_string(), Vec::new()))
        .collect();
    let source = "use crate::tree::DeviceTree;\n// crate::policy in a comment\nlet x = my_crate::sandbox;\n#[cfg(test)]\nmod tests {\n    use crate::sandbox::Sandbox;\n}\n";
    assert_eq!(
        imports(source, &known),
        BTreeSet::from(["tree".to_string()])
    );
}
