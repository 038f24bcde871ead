//! What every catalogue test does: run `wdp scan --once` over a fixture and compare the ids of
//! its tree, write a `wdp run` config of one scanner.

use std::path::PathBuf;

use serde_json::Value;
use wdp_tests::fixture::Fixture;
use wdp_tests::{guest, json_lines, wdp};

/// The one tree `wdp scan --once` prints for scanner `name` over `f` with `env` (`KEY=VALUE`);
/// fails the test, with the scanner's stderr, when the scan fails.
pub fn scan_once(name: &str, f: &Fixture, env: &[&str]) -> Value {
    scan_once_allowing(name, f, env, &[])
}

/// [`scan_once`] with mounts below each of `allow` allowed (`--allow-mount`).
pub fn scan_once_allowing(name: &str, f: &Fixture, env: &[&str], allow: &[&str]) -> Value {
    let out = scan_allowing(name, f, env, allow);
    assert!(
        out.status.success(),
        "wdp scan {name} {env:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut trees = json_lines(&out.stdout);
    assert_eq!(trees.len(), 1, "--once prints one tree");
    trees.remove(0)
}

/// `wdp scan --once` of scanner `name` over `f` with `env`, for runs expected to fail.
pub fn scan(name: &str, f: &Fixture, env: &[&str]) -> std::process::Output {
    scan_allowing(name, f, env, &[])
}

/// [`scan`] with mounts below each of `allow` allowed (`--allow-mount`).
pub fn scan_allowing(
    name: &str,
    f: &Fixture,
    env: &[&str],
    allow: &[&str],
) -> std::process::Output {
    let component = guest(name).display().to_string();
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    // One compile cache for every catalogue test: each scanner is compiled once per build.
    let cache = format!("{}/test-compile-cache", env!("WDP_TARGET_DIR"));
    let mut args = vec![
        "scan",
        "--component",
        &component,
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--once",
        "--compile-cache",
        &cache,
    ];
    for e in env {
        args.extend(["--env", e]);
    }
    for m in allow {
        args.extend(["--allow-mount", m]);
    }
    wdp(&args)
}

/// The device ids of each type in a `wdp scan` JSON tree, sorted: `{"i915": ["card0-0"]}`.
pub fn ids(tree: &Value) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = tree
        .as_object()
        .map(|types| {
            types
                .iter()
                .map(|(t, devs)| {
                    let mut ids: Vec<String> = devs
                        .as_object()
                        .map(|d| d.keys().cloned().collect())
                        .unwrap_or_default();
                    ids.sort();
                    (t.clone(), ids)
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// `(type, ids)` pairs in the form [`ids`] gives, sorted as it sorts: what a test expects.
pub fn ids_of<S: AsRef<str>>(pairs: &[(&str, &[S])]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = pairs
        .iter()
        .map(|(t, ids)| {
            let mut ids: Vec<String> = ids.iter().map(|s| s.as_ref().to_string()).collect();
            ids.sort();
            (t.to_string(), ids)
        })
        .collect();
    out.sort();
    out
}

/// A config with one scanner `name` (its component is the guest of the same name) serving
/// `namespace`, with `env` as YAML flow-map entries (e.g. `"SHARED_DEV_NUM: 2"`), and the same
/// component as its post-allocator when `post_allocator`.
pub fn one_scanner_config(
    f: &Fixture,
    name: &str,
    namespace: &str,
    env: &[&str],
    post_allocator: bool,
) -> PathBuf {
    let component = guest(name);
    let hook = if post_allocator {
        format!("    post-allocator: {}\n", component.display())
    } else {
        String::new()
    };
    f.write_config(&format!(
            "scanners:\n  - name: {name}\n    component: {}\n    namespace: {namespace}\n    env: {{ {} }}\n{hook}",
            component.display(),
            env.join(", ")
        ),
    )
}
