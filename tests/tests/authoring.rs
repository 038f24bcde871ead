//! Scanners written, built, tested and shipped outside this repository, as an author would:
//! `wdp new` into a temporary directory, the commands of the project's own README (build, test,
//! dry-run, push) with only that language's tools, `wdp scan` over its fixture, and `wdp run`
//! from the pushed `oci://` reference against the kubelet stand-in (list, Allocate through the
//! post-allocator). Also: the SDK as `cargo package` packs it, the contract as a WIT package
//! fetched by name (`wkg`, `cargo component`), the bundled scanners built with `cargo component`,
//! and a guest of another contract version refused at load.
//!
//! The toolchains are the ones `make setup` installs under target/tools (cargo-component, wkg,
//! wasm-tools, wit-bindgen, componentize-py, the preview-1 adapter); npm's own cache serves the
//! JavaScript project's `npm install`. Cargo builds share target/authoring/cargo, which a real
//! author's build would not change.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;
use wdp_tests::registry::TestRegistry;
use wdp_tests::{guest, wdp_bin};

/// The repository's target directory.
fn target() -> PathBuf {
    PathBuf::from(env!("WDP_TARGET_DIR"))
}

/// Where `make setup` installed the guest toolchains.
fn tools() -> PathBuf {
    std::env::var_os("TOOLS").map_or_else(|| target().join("tools"), PathBuf::from)
}

/// PATH with the toolchains and this build's `wdp` in front.
fn path() -> std::ffi::OsString {
    let wdp_dir = wdp_bin().parent().expect("wdp's directory").to_path_buf();
    let mut dirs = vec![tools().join("bin"), tools().join("venv/bin"), wdp_dir];
    dirs.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(dirs).expect("PATH")
}

/// The preview-1 reactor adapter `make setup` fetched (for the C projects).
fn adapter() -> PathBuf {
    let path = tools().join("adapters/wasi_snapshot_preview1.reactor-48.0.8.wasm");
    assert!(
        path.exists(),
        "{} is missing: run `make setup`",
        path.display()
    );
    path
}

/// Runs `sh -c line` in `dir` with the toolchains on PATH and `env`; fails the test, with the
/// output, unless it succeeds.
fn sh(dir: &Path, line: &str, env: &[(&str, &std::ffi::OsStr)]) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(line)
        .current_dir(dir)
        .env("PATH", path())
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (*k, *v)))
        .output()
        .unwrap_or_else(|e| panic!("run {line:?}: {e}"));
    assert!(
        out.status.success(),
        "{line:?} in {} failed:\n{}{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `wdp` with `args`, its toolchain PATH, in `dir`.
fn wdp_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(wdp_bin())
        .args(args)
        .current_dir(dir)
        .env("PATH", path())
        .env("RUST_LOG", "warn")
        .output()
        .expect("run wdp")
}

/// `wdp scan --component <component>` over the fixture `f`, with `extra` arguments, in `dir`.
fn scan_over(dir: &Path, component: &str, f: &Fixture, extra: &[&str]) -> Output {
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    let mut args = vec![
        "scan",
        "--component",
        component,
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
    ];
    args.extend_from_slice(extra);
    wdp_in(dir, &args)
}

/// The commands of a project README's "The four commands" block, comments stripped, in order:
/// build, test, dry-run, push.
fn readme_commands(project: &Path) -> [String; 4] {
    let readme = std::fs::read_to_string(project.join("README.md")).expect("README.md");
    let block = readme
        .split("## The four commands")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("README.md has a \"The four commands\" sh block");
    let lines: Vec<String> = block
        .lines()
        .map(|l| l.split(" # ").next().unwrap_or(l).trim().to_string())
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .try_into()
        .unwrap_or_else(|l| panic!("four commands, not {l:?}"))
}

/// A fixture with the project's fixture/sys and the nodes of its fixture/dev.txt.
fn fixture_of(project: &Path) -> Fixture {
    let f = Fixture::new();
    sh(
        project,
        &format!("cp -a fixture/sys/. '{}'", f.sys().display()),
        &[],
    );
    let listing = std::fs::read_to_string(project.join("fixture/dev.txt")).expect("dev.txt");
    for line in listing
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
    {
        let [name, "c", major, minor, mode] = line.split_whitespace().collect::<Vec<_>>()[..]
        else {
            panic!("dev.txt: {line:?}");
        };
        f.char_dev(name, major.parse().unwrap(), minor.parse().unwrap());
        let mode = u32::from_str_radix(mode, 8).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(f.dev().join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
    }
    f
}

/// What an author does, in `lang`: `wdp new` (with a post-allocator), the README's build and
/// test, an independent `wdp scan` over the fixture (the tree holds Healthy and Unhealthy
/// devices as the fixture says), the dry-run, the push to `registry`, and `wdp run` from the
/// pushed reference against the kubelet stand-in: the devices listed, one allocated through the
/// post-allocator. `prepare` runs between `wdp new` and the build; `component` is where the
/// build leaves the component, in the project; `unhealthy` is the fixture's Unhealthy device.
async fn author(lang: &str, prepare: impl FnOnce(&Path), component: &str, unhealthy: &str) {
    let registry = TestRegistry::start();
    let env = &[];
    let work = tempfile::tempdir().expect("temp dir");
    let project = work.path().join(format!("acme-{lang}"));
    let out = wdp_in(
        work.path(),
        &[
            "new",
            &project.display().to_string(),
            "--lang",
            lang,
            "--name",
            "acme",
            "--with-post-allocator",
        ],
    );
    assert!(
        out.status.success(),
        "wdp new: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    prepare(&project);
    let [build, test, dry_run, push] = readme_commands(&project);
    let adapter = adapter().display().to_string();
    let local = |c: &str| c.replace("/path/to/wasi_snapshot_preview1.reactor.wasm", &adapter);
    sh(&project, &local(&build), env);
    sh(&project, &local(&test), env);
    let component = project.join(component);

    // The project's test passed; check the same thing from here, and that the fixture holds
    // both kinds of device.
    let f = fixture_of(&project);
    let expected = project.join("fixture/expected.json");
    let tree: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expected).unwrap()).unwrap();
    let health: Vec<(&str, &str)> = tree["acme"]
        .as_object()
        .expect("type acme")
        .iter()
        .map(|(id, d)| (id.as_str(), d["health"].as_str().unwrap()))
        .collect();
    let want: Vec<(&str, &str)> = ["acme0", "acme1", "acme2"]
        .map(|id| {
            (
                id,
                if id == unhealthy {
                    "Unhealthy"
                } else {
                    "Healthy"
                },
            )
        })
        .to_vec();
    assert_eq!(health, want);
    let scan = scan_over(
        &project,
        &component.display().to_string(),
        &f,
        &[
            "--expect",
            &expected.display().to_string(),
            // The cache `wdp run` uses below: an interpreter's component compiles once here.
            "--compile-cache",
            &f.path().join("compiled").display().to_string(),
        ],
    );
    assert!(
        scan.status.success(),
        "{}",
        String::from_utf8_lossy(&scan.stderr)
    );
    // And a tree that differs is a failure naming the difference.
    let mut other = tree.clone();
    other["acme"]["acme2"]["health"] = if unhealthy == "acme2" {
        "Healthy".into()
    } else {
        "Unhealthy".into()
    };
    let other_file = f.path().join("other.json");
    std::fs::write(&other_file, other.to_string()).unwrap();
    let differs = scan_over(
        &project,
        &component.display().to_string(),
        &f,
        &[
            "--expect",
            &other_file.display().to_string(),
            "--compile-cache",
            &f.path().join("compiled").display().to_string(),
        ],
    );
    let err = String::from_utf8_lossy(&differs.stderr);
    assert!(!differs.status.success(), "{err}");
    assert!(err.contains("(1 difference(s)"), "{err}");
    assert!(err.contains("/acme/acme2/health: recorded"), "{err}");

    // The dry-run on this machine (no such devices: an empty type) and the push.
    let table = sh(&project, &dry_run, env);
    assert!(table.contains("1 type(s), 0 device(s)"), "{table}");
    let repository = format!("{}/scanners/acme-{lang}", registry.addr);
    let push = push.replace("registry.example/scanners/acme", &repository) + " --insecure";
    let digest = sh(&project, &push, env).trim().to_string();
    assert!(digest.starts_with("sha256:"), "{digest}");

    // Served from the registry, allocated through the post-allocator.
    let reference = format!("oci://{}:0.1.0@{digest}", repository);
    let config = f.path().join("wdp.yaml");
    std::fs::write(
        &config,
        format!(
            "scanners:
  - name: acme
    component: {reference}
    post-allocator: {reference}
    namespace: devices.example.com
    env: {{ RESCAN_INTERVAL_MS: 600000 }}
oci:
  cache-dir: {cache}
  insecure-registries: ['{addr}']
",
            cache = f.path().join("oci-cache").display(),
            addr = registry.addr
        ),
    )
    .unwrap();
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let resource = "devices.example.com/acme";
    seen.devices(resource, &["acme0", "acme1", "acme2"]).await;
    seen.health(resource, unhealthy, "Unhealthy").await;
    let healthy = if unhealthy == "acme0" {
        "acme1"
    } else {
        "acme0"
    };
    let r = kubelet
        .allocate(resource, &[healthy])
        .await
        .unwrap_or_else(|e| panic!("Allocate: {e}\n{}", host.log()));
    let c = &r.container_responses[0];
    let envs: HashMap<&str, &str> = c
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(envs.get("ACME_DEVICES"), Some(&healthy), "{envs:?}");
    let node = format!("/dev/{healthy}");
    assert_eq!(
        wdp_tests::node_specs(c),
        [(node.as_str(), node.as_str(), "rw")]
    );
    host.terminate().await;
}

/// Shared by the cargo builds here: dependencies compile once, across tests and runs.
fn cargo_target() -> PathBuf {
    target().join("authoring/cargo")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rust_built_with_cargo_component_against_the_packed_sdk() {
    // The SDK as `cargo package` packs it, verified (built from the packed files alone).
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-scanners/sdk");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let packed = Command::new(&cargo)
        .args(["package", "--allow-dirty", "--quiet", "--manifest-path"])
        .arg(sdk.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(cargo_target())
        .status()
        .expect("cargo package");
    assert!(packed.success(), "cargo package of wdp-guest failed");
    let unpacked = tempfile::tempdir().unwrap();
    let crate_file = cargo_target().join(format!(
        "package/wdp-guest-{}.crate",
        wdp::scaffold::sdk_version()
    ));
    sh(
        unpacked.path(),
        &format!("tar xzf '{}'", crate_file.display()),
        &[],
    );
    let packed_dir = unpacked
        .path()
        .join(format!("wdp-guest-{}", wdp::scaffold::sdk_version()));

    let target_dir = cargo_target().into_os_string();
    author(
        "rust",
        |project| {
            // The project's target/ is the shared one (its README's paths stay as they are).
            std::fs::create_dir_all(cargo_target()).unwrap();
            std::os::unix::fs::symlink(cargo_target(), project.join("target")).unwrap();
            // What `wdp new` vendored is what the package holds (cargo rewrites the manifest,
            // keeping the author's as Cargo.toml.orig), and the build uses the package itself.
            let vendor = project.join("vendor/wdp-guest");
            for (path, bytes) in wdp::scaffold::SDK {
                let packed_name = if *path == "Cargo.toml" {
                    "Cargo.toml.orig"
                } else {
                    path
                };
                let in_package = std::fs::read(packed_dir.join(packed_name))
                    .unwrap_or_else(|e| panic!("{packed_name} is not in the package: {e}"));
                assert_eq!(&in_package, bytes, "{path}");
                assert_eq!(std::fs::read(vendor.join(path)).unwrap(), *bytes, "{path}");
            }
            let listed = sh(
                &sdk,
                "cargo package --allow-dirty --list --quiet",
                &[("CARGO_TARGET_DIR", &target_dir)],
            );
            let mut listed: Vec<&str> = listed
                .lines()
                .filter(|l| {
                    !matches!(
                        *l,
                        "Cargo.toml.orig" | ".cargo_vcs_info.json" | "Cargo.lock"
                    )
                })
                .collect();
            listed.sort();
            let mut embedded: Vec<&str> = wdp::scaffold::SDK.iter().map(|(p, _)| *p).collect();
            embedded.sort();
            assert_eq!(
                listed, embedded,
                "host/build.rs embeds what cargo package packs"
            );
            std::fs::remove_dir_all(&vendor).unwrap();
            sh(
                project,
                &format!("cp -a '{}' vendor/wdp-guest", packed_dir.display()),
                &[],
            );
        },
        "target/wasm32-wasip1/release/acme.wasm",
        "acme1",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_built_with_componentize_py() {
    author("python", |_| {}, "acme.wasm", "acme1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn javascript_built_with_componentize_js() {
    let install = |project: &Path| {
        sh(
            project,
            "npm install --no-audit --no-fund --loglevel=error",
            &[],
        );
    };
    author("js", install, "acme.wasm", "acme2").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_built_with_wit_bindgen_clang_and_wasm_tools() {
    author("c", |_| {}, "acme.wasm", "acme1").await;
}

/// A C scanner built against a copy of the WIT of another major version is refused at load,
/// naming the versions this host speaks; the same project at the host's version loads.
#[test]
fn another_contract_version_is_refused_at_load() {
    let work = tempfile::tempdir().unwrap();
    let project = work.path().join("other");
    let out = wdp_in(
        work.path(),
        &["new", &project.display().to_string(), "--lang", "c"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wit = project.join("wit/device-plugin.wit");
    let text = std::fs::read_to_string(&wit).unwrap();
    std::fs::write(&wit, text.replace("@0.1.2", "@1.0.0")).unwrap();
    let make = format!("make ADAPTER='{}'", adapter().display());
    sh(&project, &make, &[]);
    let f = Fixture::new();
    let scan = |dir: &Path| scan_over(dir, "other.wasm", &f, &["--once"]);
    let refused = scan(&project);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("is refused: it is built for wdp:device-plugin@1.0.0")
            && err.contains(
                "this host speaks wdp:device-plugin@0.1 (built with wdp:device-plugin@0.1.2)"
            ),
        "{err}"
    );
    std::fs::write(&wit, text).unwrap();
    sh(&project, &format!("make clean && {make}"), &[]);
    let accepted = scan(&project);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
}

/// `wdp new` refuses before writing anything: missing tools (each with how to install it), a name
/// that is not one, a directory that is not empty.
#[test]
fn wdp_new_says_what_is_missing() {
    let work = tempfile::tempdir().unwrap();
    let project = work.path().join("acme");
    let dir = project.display().to_string();
    let out = Command::new(wdp_bin())
        .args(["new", &dir, "--lang", "c"])
        .env("PATH", work.path())
        .output()
        .expect("run wdp");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for line in [
        "a c scanner's build needs tools that are not on PATH:",
        "  clang: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32 (Debian 12)",
        "  wit-bindgen: cargo install --locked wit-bindgen-cli@0.63.0",
        "  wasm-tools: cargo install --locked wasm-tools@1.263.0",
    ] {
        assert!(err.contains(line), "{line:?} not in {err}");
    }
    assert!(!project.exists(), "nothing is written");

    let out = wdp_in(
        work.path(),
        &["new", &dir, "--lang", "c", "--name", "Acme_1"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("\"Acme_1\" is not a valid scanner name")
            && err.contains("give one with --name"),
        "{err}"
    );
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("notes.txt"), "mine").unwrap();
    let out = wdp_in(work.path(), &["new", &dir, "--lang", "c"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is not empty: give a new or empty directory"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&project).unwrap().count(),
        1,
        "nothing is written"
    );
}

/// The SDK's WIT is the contract's, byte for byte: `wit/` is the one source.
#[test]
fn the_sdk_carries_the_contract_unchanged() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let contract = std::fs::read(root.join("wit/device-plugin.wit")).unwrap();
    let copy = std::fs::read(root.join("guest-scanners/sdk/contract/device-plugin.wit")).unwrap();
    assert!(
        contract == copy,
        "guest-scanners/sdk/contract/device-plugin.wit differs from wit/device-plugin.wit, the contract: \
         cp wit/device-plugin.wit guest-scanners/sdk/contract/"
    );
}

/// A wkg configuration mapping the `wdp` namespace to the test registry, over plain HTTP, in
/// `home` (as XDG_CONFIG_HOME/wasm-pkg/config.toml, where wkg and cargo-component look).
fn wkg_config(home: &Path, registry: &TestRegistry) {
    let dir = home.join("wasm-pkg");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        format!(
            "[namespace_registries]\nwdp = \"{addr}\"\n\n[registry.\"{addr}\".oci]\nprotocol = \"http\"\n",
            addr = registry.addr
        ),
    )
    .unwrap();
}

/// The contract as a WIT package: `wkg publish` pushes what `make` built, `wkg get` fetches it
/// by name, and `cargo component` resolves `wdp:device-plugin` by name for a scanner that uses
/// its own bindings (no SDK), which then runs in `wdp scan`.
#[test]
fn the_contract_is_fetched_by_name() {
    let registry = TestRegistry::start();
    let home = tempfile::tempdir().unwrap();
    wkg_config(home.path(), &registry);
    let xdg = [
        ("XDG_CONFIG_HOME", home.path().as_os_str()),
        ("XDG_CACHE_HOME", home.path().as_os_str()),
    ];
    let package = target().join("wit/wdp_device-plugin@0.1.2.wasm");
    assert!(
        package.exists(),
        "{} is missing: `make wit-package` builds it",
        package.display()
    );
    sh(
        home.path(),
        &format!("wkg publish '{}'", package.display()),
        &xdg,
    );
    sh(
        home.path(),
        "wkg get wdp:device-plugin@0.1.2 --format wasm -o ./fetched.wasm && wkg get wdp:device-plugin@0.1.2 --format wit -o ./fetched.wit",
        &xdg,
    );
    assert_eq!(
        std::fs::read(home.path().join("fetched.wasm")).unwrap(),
        std::fs::read(&package).unwrap()
    );
    let wit = std::fs::read_to_string(home.path().join("fetched.wit")).unwrap();
    assert!(wit.contains("package wdp:device-plugin@0.1.2;"), "{wit}");
    assert!(wit.contains("world scanner-plugin"), "{wit}");

    let project = home.path().join("byname");
    std::fs::create_dir_all(project.join("src")).unwrap();
    std::fs::write(
        project.join("Cargo.toml"),
        r#"[package]
name = "byname"
version = "0.1.0"
edition = "2024"

[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen-rt = { version = "0.41.0", features = ["bitflags"] }

[package.metadata.component]
package = "example:byname"

[package.metadata.component.target]
package = "wdp:device-plugin"
version = "0.1.2"
world = "scanner-plugin"
"#,
    )
    .unwrap();
    std::fs::write(
        project.join("src/lib.rs"),
        r#"#[allow(warnings)]
mod bindings;

use bindings::exports::wdp::device_plugin::scanner::Guest;
use bindings::wdp::device_plugin::devfs::{self, NodeKind};
use bindings::wdp::device_plugin::notifier;
use bindings::wdp::device_plugin::types::{Device, DeviceGroup, DeviceInfo, DeviceSpec, Health};

struct Component;

impl Guest for Component {
    fn scan() -> Result<(), String> {
        let devices = devfs::read_dir("/dev")?
            .into_iter()
            .filter(|n| n.kind == NodeKind::CharDevice)
            .map(|n| {
                let path = format!("/dev/{}", n.name);
                Device {
                    id: n.name,
                    info: DeviceInfo {
                        health: Health::Healthy,
                        nodes: vec![DeviceSpec { container_path: path.clone(), host_path: path, permissions: "rw".into() }],
                        mounts: vec![],
                        envs: vec![],
                        annotations: vec![],
                        numa_nodes: None,
                        cdi_devices: vec![],
                    },
                }
            })
            .collect();
        notifier::notify(&[DeviceGroup { dev_type: "byname".into(), devices }]);
        Ok(())
    }
}

bindings::export!(Component with_types_in bindings);
"#,
    )
    .unwrap();
    let target_dir = cargo_target().join("byname").into_os_string();
    let mut env = xdg.to_vec();
    env.push(("CARGO_TARGET_DIR", &target_dir));
    sh(&project, "cargo component build --release", &env);
    let component = cargo_target().join("byname/wasm32-wasip1/release/byname.wasm");
    let f = Fixture::new();
    f.char_dev("widget0", 240, 7);
    let out = scan_over(&project, &component.display().to_string(), &f, &["--once"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(
        tree["byname"]["widget0"]["nodes"][0]["host_path"],
        "/dev/widget0"
    );
}

/// Two bundled scanners built with `cargo component build --release` (wasm32-wasip1, adapted)
/// are components of the same world as their `cargo build --target wasm32-wasip2` builds (the
/// same wdp exports and imports, `wdp inspect`), and report the same tree.
#[test]
fn bundled_scanners_build_with_cargo_component() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let guests = target().join("guests").into_os_string();
    sh(
        &root,
        "cargo component build --release --locked --manifest-path guest-scanners/Cargo.toml -p kvm -p generic",
        &[("CARGO_TARGET_DIR", &guests)],
    );
    let wdp_names = |file: &Path| {
        let out = wdp_in(&root, &["inspect", &file.display().to_string()]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        let world = text.lines().next().unwrap_or_default().to_string();
        let mut names: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("wdp:"))
            .map(String::from)
            .collect();
        names.sort();
        (world, names)
    };
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("ttyUSB0", 188, 0);
    let scan = |file: &Path, env: &str| {
        let out = scan_over(
            &root,
            &file.display().to_string(),
            &f,
            &["--env", env, "--once"],
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    for (name, env) in [
        ("kvm", "SLOTS=2"),
        (
            "generic",
            r#"DEVICES=[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]}]"#,
        ),
    ] {
        let adapted = target().join(format!("guests/wasm32-wasip1/release/{name}.wasm"));
        let native = guest(name);
        let (world, names) = wdp_names(&adapted);
        assert_eq!((world.clone(), names.clone()), wdp_names(&native), "{name}");
        assert!(world.contains("scanner"), "{world}");
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("wdp:device-plugin/scanner@"))
        );
        let tree = scan(&adapted, env);
        assert_eq!(tree, scan(&native, env), "{name}");
        assert!(
            tree.as_object().is_some_and(|t| !t.is_empty()),
            "{name}: {tree}"
        );
    }
}
