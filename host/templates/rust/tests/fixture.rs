//! The scanner over its fixture (fixture/): `wdp scan` must report exactly
//! fixture/expected.json. Build the component first (`cargo component build --release`, or
//! `cargo build --target wasm32-wasip2 --release`); `wdp` comes from PATH, or from `WDP`. The
//! fixture's device nodes are made with `mknod`, which needs root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

/// The newest component built by either build command (`COMPONENT` overrides).
fn component(root: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os("COMPONENT") {
        return PathBuf::from(path);
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let built = ["wasm32-wasip1", "wasm32-wasip2"]
        .map(|t| target.join(t).join("release/{{crate}}.wasm"))
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _): &(SystemTime, PathBuf)| *t);
    match built {
        Some((_, path)) => path,
        None => panic!(
            "no component in {}: build it first with `cargo component build --release` \
             (or `cargo build --target wasm32-wasip2 --release`)",
            target.display()
        ),
    }
}

/// Makes the nodes fixture/dev.txt lists (NAME TYPE MAJOR MINOR MODE) under `dev`.
fn make_dev(list: &Path, dev: &Path) {
    std::fs::create_dir_all(dev).expect("create the fixture's dev root");
    let text = std::fs::read_to_string(list).expect("read fixture/dev.txt");
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let [name, kind, major, minor, mode] = line.split_whitespace().collect::<Vec<_>>()[..]
        else {
            panic!("fixture/dev.txt: {line:?} is not NAME TYPE MAJOR MINOR MODE");
        };
        let status = Command::new("mknod")
            .args(["-m", mode])
            .arg(dev.join(name))
            .args([kind, major, minor])
            .status()
            .expect("run mknod");
        assert!(status.success(), "mknod {name} failed (it needs root)");
    }
}

#[test]
fn the_fixture_gives_the_expected_tree() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = root.join("fixture");
    let dev = std::env::temp_dir().join(format!("{{name}}-fixture-dev-{}", std::process::id()));
    make_dev(&fixture.join("dev.txt"), &dev);
    let wdp = std::env::var_os("WDP").unwrap_or_else(|| "wdp".into());
    let out = Command::new(&wdp)
        .arg("scan")
        .arg("--component")
        .arg(component(root))
        .arg("--sys-root")
        .arg(fixture.join("sys"))
        .arg("--dev-root")
        .arg(&dev)
        .arg("--expect")
        .arg(fixture.join("expected.json"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {wdp:?} (is wdp on PATH?): {e}"));
    let _ = std::fs::remove_dir_all(&dev);
    assert!(
        out.status.success(),
        "wdp scan over the fixture:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
