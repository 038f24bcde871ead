//! Fixture trees and configurations the benchmarks run on. Device nodes are real character
//! devices (mknod, through `wdp_tests::fixture`): run as root.

use std::path::{Path, PathBuf};

use wdp::bindings::types as wit;

pub use wdp_tests::fixture::{Fixture, Tmpfs};

/// Mounts a tmpfs on `dir` (created if missing) for as long as the guard lives, as a node's
/// `/dev` (devtmpfs) and `/run` (where `/var/run/cdi` lives) are: on the disk file system of the
/// temp directory (ext4 here) listing 10,000 nodes or fsyncing a CDI spec costs several times
/// more, which would measure the disk, not wdp. Where this process may not mount, nothing is
/// mounted and the run says that `what` stays on disk.
pub fn tmpfs(dir: &Path, what: &str) -> std::io::Result<Option<Tmpfs>> {
    std::fs::create_dir_all(dir)?;
    let mounted = Tmpfs::mount(dir, "mode=755");
    if mounted.is_none() {
        eprintln!(
            "wdp-bench: cannot mount a tmpfs on {}; {what} stay on the temp directory's file system",
            dir.display()
        );
    }
    Ok(mounted)
}

/// A fixture whose dev root is a tmpfs ([`tmpfs`]): its listing and stat costs are a node's, not ext4's
/// (its directory index and inode reads were the top of the 10,000-device profile).
pub struct BenchFixture {
    /// Declared first: unmounted on drop before the fixture removes its files.
    _tmpfs: Option<Tmpfs>,
    fixture: Fixture,
}

impl BenchFixture {
    /// A new fixture, its dev root on a fresh tmpfs when this process may mount one.
    pub fn new() -> Self {
        let fixture = Fixture::new();
        let tmpfs = tmpfs(&fixture.dev(), "device nodes").ok().flatten();
        BenchFixture {
            _tmpfs: tmpfs,
            fixture,
        }
    }
}

impl Default for BenchFixture {
    fn default() -> Self {
        Self::new()
    }
}

impl std::ops::Deref for BenchFixture {
    type Target = Fixture;
    fn deref(&self) -> &Fixture {
        &self.fixture
    }
}

/// Major number of the bulk fixture nodes (240-254 are reserved for local use).
pub const BULK_MAJOR: u32 = 240;

/// Makes `n` character devices `dev/<dir>/d0` .. `d<n-1>`.
pub fn bulk(f: &Fixture, dir: &str, n: usize) {
    for i in 0..n {
        f.char_dev(&format!("{dir}/d{i}"), BULK_MAJOR, i as u32);
    }
}

/// The `DEVICES` value of a `generic` type `name` made of every match of `glob`.
pub fn generic_devices(name: &str, glob: &str) -> String {
    format!(r#"[{{"name":"{name}","groups":[{{"paths":[{{"path":"{glob}"}}]}}]}}]"#)
}

/// One scanner entry of a `wdp run` configuration (YAML), with `env` given verbatim as
/// (key, value) pairs and an optional post-allocator.
pub fn scanner_yaml(
    name: &str,
    component: &Path,
    namespace: &str,
    env: &[(&str, &str)],
    post_allocator: Option<&Path>,
) -> String {
    let mut s = format!(
        "  - name: {name}\n    component: {}\n    namespace: {namespace}\n",
        component.display()
    );
    if !env.is_empty() {
        s.push_str("    env:\n");
        for (k, v) in env {
            // Single-quoted YAML scalars take JSON verbatim (it has no single quotes here).
            s.push_str(&format!("      {k}: '{v}'\n"));
        }
    }
    if let Some(hook) = post_allocator {
        s.push_str(&format!("    post-allocator: {}\n", hook.display()));
    }
    s
}

/// Writes `scanners:` + `entries` as the fixture's config ([`Fixture::write_config`]) and returns
/// its path.
pub fn write_config(f: &Fixture, entries: &[String]) -> PathBuf {
    f.write_config(&format!("scanners:\n{}", entries.concat()))
}

/// The repository root (this crate lives in `<root>/bench`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/ is inside the repository")
        .to_path_buf()
}

/// Every node the demo configuration (`demo/wdp.yaml`) can serve, with this kernel's numbers:
/// given all of them, the demo serves exactly its 10 resources (kvm, tun, vhost-net, fuse from
/// `kvm`; serial, null, zero, full, urandom, tty from `generic`).
pub const DEMO_NODES: [(&str, u32, u32); 13] = [
    ("kvm", 10, 232),
    ("net/tun", 10, 200),
    ("vhost-net", 10, 238),
    ("fuse", 10, 229),
    ("ttyS0", 4, 64),
    ("ttyS1", 4, 65),
    ("ttyS2", 4, 66),
    ("ttyS3", 4, 67),
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];

/// Makes every [`DEMO_NODES`] node.
pub fn demo_nodes(f: &Fixture) {
    for (rel, major, minor) in DEMO_NODES {
        f.char_dev(rel, major, minor);
    }
}

/// `demo/wdp.yaml` itself, its relative component paths made absolute, written into the
/// fixture. Returns the config's path and its scanner entries (to extend it).
pub fn demo_config(f: &Fixture) -> (PathBuf, String) {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("demo/wdp.yaml")).expect("read demo/wdp.yaml");
    let text = text.replace(
        "component: ../target/",
        &format!("component: {}/target/", root.display()),
    );
    let path = f.path().join("demo.yaml");
    std::fs::write(&path, &text).expect("write demo config");
    (path, text)
}

/// The 10 resources the demo configuration serves over a fixture holding all its nodes.
pub fn demo_resources() -> Vec<String> {
    let mut r: Vec<String> = ["kvm", "tun", "vhost-net", "fuse"]
        .iter()
        .map(|t| format!("devices.wdp.dev/{t}"))
        .collect();
    r.extend(
        ["serial", "null", "zero", "full", "urandom", "tty"]
            .iter()
            .map(|t| format!("generic.wdp.dev/{t}")),
    );
    r
}

/// A fixture holding every [`DEMO_NODES`] node and the demo configuration; returns it with the
/// configuration's path.
pub fn demo_fixture() -> (BenchFixture, PathBuf) {
    let f = BenchFixture::new();
    demo_nodes(&f);
    let (config, _) = demo_config(&f);
    (f, config)
}

/// A tree of one type `dev_type` with `n` devices `<dir>_d<i>`, one node `/dev/<dir>/d<i>` each
/// (or, with `mounts`, one read-write mount of it), in the WIT form guests notify: what `generic`
/// reports for the glob `/dev/<dir>/d*` (of type `Device` or `Mount`) over [`bulk`] nodes.
pub fn synthetic_tree(dev_type: &str, dir: &str, n: usize, mounts: bool) -> Vec<wit::DeviceGroup> {
    let devices = (0..n)
        .map(|i| {
            let path = format!("/dev/{dir}/d{i}");
            let (nodes, mounts) = if mounts {
                let mount = wit::Mount {
                    container_path: path.clone(),
                    host_path: path,
                    read_only: false,
                };
                (Vec::new(), vec![mount])
            } else {
                let node = wit::DeviceSpec {
                    container_path: path.clone(),
                    host_path: path,
                    permissions: "rw".into(),
                };
                (vec![node], Vec::new())
            };
            wit::Device {
                id: format!("{dir}_d{i}"),
                info: wit::DeviceInfo {
                    health: wit::Health::Healthy,
                    nodes,
                    mounts,
                    envs: Vec::new(),
                    annotations: Vec::new(),
                    numa_nodes: None,
                    cdi_devices: Vec::new(),
                },
            }
        })
        .collect();
    vec![wit::DeviceGroup {
        dev_type: dev_type.into(),
        devices,
    }]
}

/// The native build of `generic`'s discovery (`make bench` builds it in the guest workspace).
pub fn generic_native_bin() -> PathBuf {
    repo_root().join("target/guests/release/generic-native")
}
