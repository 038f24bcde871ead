//! Embeds what `wdp new` writes into a scanner project: the templates (`templates/`), the guest
//! SDK as `cargo package` packs it (`guest-scanners/sdk`: its manifest, README, sources and WIT)
//! and the contract (`wit/`), so a project always gets the SDK and WIT this binary was built with.
//!
//! The generated file lists every file with `include_bytes!`, so the compiler tracks each one;
//! the directories are watched here so that an added or removed file is seen too.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Every file under `dir`, relative to it, sorted; `keep` picks them by relative path.
fn files(dir: &Path, keep: &dyn Fn(&str) -> bool) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        println!("cargo:rerun-if-changed={}", d.display());
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                todo.push(path);
                continue;
            }
            let rel = path
                .strip_prefix(dir)
                .expect("below dir")
                .to_str()
                .unwrap_or_else(|| panic!("{}: not UTF-8", path.display()))
                .to_string();
            if keep(&rel) {
                out.push((rel, path));
            }
        }
    }
    out.sort();
    out
}

fn table(out: &mut String, name: &str, doc: &str, entries: &[(String, PathBuf)]) {
    writeln!(out, "/// {doc}\npub static {name}: &[(&str, &[u8])] = &[").unwrap();
    for (rel, path) in entries {
        writeln!(
            out,
            "    ({rel:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .unwrap();
    }
    writeln!(out, "];").unwrap();
}

fn main() {
    let host = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = host.parent().expect("host/ is inside the repository");
    let mut out = String::new();
    table(
        &mut out,
        "TEMPLATES",
        "The templates, by path below `host/templates/`.",
        &files(&host.join("templates"), &|_| true),
    );
    // What `cargo package` packs (the SDK's `include` list); a test compares the two.
    let sdk = root.join("guest-scanners/sdk");
    table(
        &mut out,
        "SDK",
        "The guest SDK crate, by path below `guest-scanners/sdk/`.",
        &files(&sdk, &|rel| {
            rel == "Cargo.toml"
                || rel == "README.md"
                || (rel.starts_with("src/") && rel.ends_with(".rs"))
                || (rel.starts_with("contract/") && rel.ends_with(".wit"))
        }),
    );
    for (name, doc, file) in [
        (
            "CONTRACT_WIT",
            "The contract, `wit/device-plugin.wit`.",
            root.join("wit/device-plugin.wit"),
        ),
        (
            "WASI_CLI_ENVIRONMENT_WIT",
            "`wasi:cli/environment`, which JavaScript worlds add to read their configuration.",
            root.join("guest-scanners/js/wit/deps/wasi-cli/environment.wit"),
        ),
    ] {
        println!("cargo:rerun-if-changed={}", file.display());
        writeln!(
            out,
            "/// {doc}\npub static {name}: &[u8] = include_bytes!({:?});",
            file.display().to_string()
        )
        .unwrap();
    }
    let dest =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("embedded.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
