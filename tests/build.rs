//! Builds every guest in `guest-scanners/` for wasm32-wasip2, so the tests always run guests
//! compiled from the current source. The guests have their own workspace and target directory
//! (`target/guests`), shared with `make guests`: the host build never compiles them.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("tests/ is inside the workspace")
        .to_path_buf();
    let guests = root.join("guest-scanners");
    let target_dir = root.join("target/guests");
    for watched in ["guest-scanners", "wit"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--manifest-path")
        .arg(guests.join("Cargo.toml"))
        .args(["--target", "wasm32-wasip2", "--release", "--locked"])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's settings are for the host target, not for the guests.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_PROFILE_RELEASE_DEBUG",
        // Under `cargo clippy` the outer build runs through clippy-driver; the guests are
        // linted by `make lint` for their own target, not here.
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CLIPPY_ARGS",
        "CLIPPY_CONF_DIR",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().expect("cannot run cargo to build the guests");
    assert!(
        status.success(),
        "building the guests failed (is the wasm32-wasip2 target installed? `make setup` adds it)"
    );
    let out = target_dir.join("wasm32-wasip2/release");
    println!("cargo:rustc-env=WDP_GUESTS_DIR={}", out.display());
    println!(
        "cargo:rustc-env=WDP_TARGET_DIR={}",
        root.join("target").display()
    );
}
