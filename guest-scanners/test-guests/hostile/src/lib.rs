//! `hostile`: an adversarial scanner for the host's sandbox tests (world `scanner-plugin`).
//!
//! Env `ATTACK` picks the behaviour (default `probe`):
//!
//! * `probe`: runs every probe below, notifies ONE tree (dev-type `probe`, device `report`, whose
//!   `annotations` are `(probe-name, outcome)` pairs; outcome `denied: <error>` or `LEAKED: <excerpt>`),
//!   then returns Ok. Probes: `read-etc-passwd`, `sys-dotdot`, `sys-abs-symlink`,
//!   `sys-rel-symlink`, `sys-write`, `sys-create`, `dev-read-std`, `sys-dev-node`,
//!   `devfs-dotdot`, `devfs-escape-link`, `devfs-outside`, `tcp-connect` (to
//!   `127.0.0.1:$TCP_PORT`, default 1), `host-env`, `fd-magic`.
//! * `memory`: allocates and touches 1 GiB, 1 MiB at a time.
//! * `spin`: loops forever without calling the host.
//! * `panic`: `panic!("hostile panic")`.
//! * `recursion`: recurses without bound.
//! * `flood`: notifies 10,000 trees (dev-type `flood`, one device `n<i>`, i = 0..9999) as fast as
//!   it can, then returns Ok.
//! * `notify-then-spin`: notifies one tree (dev-type `before`, device `x`), then spins.
//! * `batch-probe`: the probes of the batched `hostfs` calls (contract 0.1.1), reported as
//!   `probe` does: one `read-files` call over [`BATCH_READS`] (annotation `read-<i>` per path:
//!   a path that was read `LEAKED: <excerpt>`, except `/sys/ok`, reported `read: <contents>`),
//!   then `list-dir` of each of [`BATCH_LISTS`] (`list-<i>`, `LEAKED` when an entry comes back).
//! * the attacks on the time, threads and memory of the host's filesystem calls:
//!   [`hostfs_attacks`].
//! * `giant-capacity`, `wide-text`, `attribute-flood`, `many-devices`: attacks on the output
//!   policy through `notify-with-attributes`, in [`output_attacks`].
//! * `lift-alias`, `read-alias`: attacks on how the host copies arguments out of the guest, in
//!   [`lift_attacks`].
//! * `changes-out-of-step`, `changes-flood`, `changes-alias`: attacks through `notify-changes`,
//!   and `dir-changes` through `devfs.read-dir-changes` (contract 0.1.2), in [`changes_attacks`].

mod hostfs_attacks;

use std::fmt::Display;
use std::fs::{self, OpenOptions};
use std::hint::black_box;
use std::io::{Read, Write};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config, devfs, notify};

pub mod changes_attacks;
pub mod lift_attacks;
pub mod output_attacks;

/// Every value of `ATTACK`.
pub const ATTACKS: [&str; 21] = [
    "probe",
    "memory",
    "spin",
    "panic",
    "recursion",
    "flood",
    "notify-then-spin",
    "bad-tree",
    "raw-out-of-bounds",
    "raw-bad-utf8",
    "batch-probe",
    "giant-capacity",
    "wide-text",
    "attribute-flood",
    "many-devices",
    "lift-alias",
    "read-alias",
    "changes-out-of-step",
    "changes-flood",
    "changes-alias",
    "dir-changes",
];

/// The paths `batch-probe` reads in one `read-files` call: every way out of /sys a single read
/// is refused, and `/sys/ok`, a plain attribute that must be read.
pub const BATCH_READS: [&str; 8] = [
    "/sys/ok",
    "/etc/passwd",
    "/sys/../etc/passwd",
    "/sys/escape-abs/passwd",
    "/sys/escape-rel/passwd",
    "/sys/devnode",
    "/dev/null",
    "sys/ok",
];

/// The directories `batch-probe` lists with `list-dir`: outside /dev and /sys, or leading out.
pub const BATCH_LISTS: [&str; 5] = [
    "/etc",
    "/sys/..",
    "/sys/escape-abs",
    "/sys/escape-rel",
    "/dev/escape",
];

/// Every value of `BAD` (with `ATTACK=bad-tree`): one way each to break the output policy.
pub const BAD_TREES: [&str; 17] = [
    "node-outside-dev",
    "node-dotdot",
    "node-missing",
    "node-escape-link",
    "mount-root",
    "mount-etc",
    "permissions",
    "env-name",
    "duplicate-ids",
    "long-id",
    "dev-type",
    "giant-tree",
    "giant-string",
    "too-many-types",
    "cdi-name",
    "annotation-key",
    "relative-container-path",
];

/// The probes, in report order.
pub const PROBES: [&str; 17] = [
    "read-etc-passwd",
    "sys-dotdot",
    "sys-abs-symlink",
    "sys-rel-symlink",
    "sys-write",
    "sys-create",
    "dev-read-std",
    "sys-dev-node",
    "devfs-dotdot",
    "devfs-escape-link",
    "devfs-outside",
    "tcp-connect",
    "host-env",
    "fd-magic",
    "sys-trailing-slash",
    "devfs-trailing-slash",
    "devfs-long-path",
];

/// Printable ASCII only, at most 80 characters: what a leak report carries.
pub fn clean(s: &str) -> String {
    let printable: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '.'
            }
        })
        .collect();
    config::excerpt(&printable, 80)
}

fn denied(e: impl Display) -> String {
    format!("denied: {}", clean(&e.to_string()))
}

fn leaked(what: impl Display) -> String {
    format!("LEAKED: {}", clean(&what.to_string()))
}

/// Opens `path` with std and reads at most 32 bytes (never more: /dev/zero is endless).
fn std_read(path: &str) -> Result<String, String> {
    let f = fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
    let mut buf = Vec::new();
    f.take(32)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{path}: opened, read failed: {e}"))?;
    Ok(format!(
        "{path}: {} bytes: {}",
        buf.len(),
        String::from_utf8_lossy(&buf)
    ))
}

fn read_probe(path: &str) -> String {
    match std_read(path) {
        Ok(got) => leaked(got),
        Err(e) => denied(e),
    }
}

/// Tries every path; LEAKED if any read works, else denied with the count and the first error.
fn read_any(paths: &[String]) -> String {
    let mut errors = Vec::new();
    let mut leaks = Vec::new();
    for p in paths {
        match std_read(p) {
            Ok(got) => leaks.push(got),
            Err(e) => errors.push(e),
        }
    }
    if !leaks.is_empty() {
        return leaked(leaks.join("; "));
    }
    match errors.first() {
        Some(first) => denied(format!("all {} paths, e.g. {first}", errors.len())),
        None => denied("no paths to try"),
    }
}

fn sys_write() -> String {
    let path = "/sys/class/wdptest/attr";
    match OpenOptions::new().write(true).open(path) {
        Err(e) => denied(format!("{path}: {e}")),
        Ok(mut f) => match f.write_all(b"hostile") {
            Ok(()) => leaked(format!("wrote 7 bytes to {path}")),
            Err(e) => denied(format!("{path}: opened for writing, write failed: {e}")),
        },
    }
}

fn sys_create() -> String {
    let path = "/sys/new-file";
    match OpenOptions::new().write(true).create_new(true).open(path) {
        Ok(_) => leaked(format!("created {path}")),
        Err(e) => denied(format!("{path}: {e}")),
    }
}

fn dev_read_std() -> String {
    let mut paths: Vec<String> = vec!["/dev/null".into(), "/dev/zero".into()];
    if let Ok(nodes) = devfs::read_dir("/dev") {
        for n in nodes {
            let p = format!("/dev/{}", n.name);
            if n.kind == devfs::NodeKind::CharDevice && !paths.contains(&p) {
                paths.push(p);
            }
        }
    }
    read_any(&paths)
}

fn devfs_stat(path: &str) -> String {
    match devfs::stat(path) {
        Ok(n) => leaked(format!("stat {path}: {:?}", n.kind)),
        Err(e) => denied(e),
    }
}

fn devfs_escape_link() -> String {
    let listed = devfs::read_dir("/dev/escape");
    let stat = devfs::stat("/dev/escape/passwd");
    match (listed, stat) {
        (Ok(nodes), _) if !nodes.is_empty() => {
            let names: Vec<&str> = nodes.iter().take(5).map(|n| n.name.as_str()).collect();
            leaked(format!("read-dir /dev/escape: {}", names.join(",")))
        }
        (_, Ok(n)) => leaked(format!("stat /dev/escape/passwd: {:?}", n.kind)),
        (Ok(_), Err(e)) => denied(format!("read-dir /dev/escape: empty; stat: {e}")),
        (Err(e1), Err(e2)) => denied(format!("read-dir: {e1}; stat: {e2}")),
    }
}

fn sys_trailing_slash() -> String {
    for path in [
        "/sys/escape-abs/",
        "/sys/escape-rel/",
        "/sys/escape-abs/passwd/",
    ] {
        if let Ok(entries) = fs::read_dir(path) {
            let names: Vec<String> = entries
                .filter_map(Result::ok)
                .take(3)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            return leaked(format!("read-dir {path}: {}", names.join(",")));
        }
    }
    read_any(&[
        "/sys/escape-abs/passwd/".into(),
        "/sys/escape-rel/passwd/".into(),
    ])
}

fn devfs_trailing_slash() -> String {
    match (
        devfs::read_dir("/dev/escape/"),
        devfs::stat("/dev/escape/passwd/"),
    ) {
        (Ok(nodes), _) if !nodes.is_empty() => {
            leaked(format!("read-dir /dev/escape/: {}", nodes.len()))
        }
        (_, Ok(n)) => leaked(format!("stat /dev/escape/passwd/: {:?}", n.kind)),
        (Ok(_), Err(e)) => denied(format!("empty; {e}")),
        (Err(e1), Err(e2)) => denied(format!("{e1}; {e2}")),
    }
}

/// The tree for `BAD=kind`: valid except for one thing.
pub fn bad_tree(kind: &str) -> DeviceTree {
    let node = |path: &str| DeviceInfo::new().node(path, "/dev/x", "rw");
    let good = || node("/dev/null");
    let mut t = TreeBuilder::new();
    match kind {
        "node-outside-dev" => {
            t.add("bad", "x", node("/etc/shadow"));
        }
        "node-dotdot" => {
            t.add("bad", "x", node("/dev/../etc/shadow"));
        }
        "node-missing" => {
            t.add("bad", "x", node("/dev/does-not-exist"));
        }
        "node-escape-link" => {
            t.add("bad", "x", node("/dev/escape/shadow"));
        }
        "mount-root" => {
            t.add("bad", "x", good().mount("/", "/host", false));
        }
        "mount-etc" => {
            t.add("bad", "x", good().mount("/etc", "/etc", true));
        }
        "permissions" => {
            t.add(
                "bad",
                "x",
                DeviceInfo::new().node("/dev/null", "/dev/x", "rwx"),
            );
        }
        "env-name" => {
            t.add("bad", "x", good().env("LD_PRELOAD=/x.so FOO", "1"));
        }
        "duplicate-ids" => {
            // TreeBuilder keeps the first of a repeated id: build the group by hand.
            let group = t.group("bad");
            for _ in 0..2 {
                group.devices.push(wdp_guest::types::Device {
                    id: "twin".into(),
                    info: good(),
                });
            }
        }
        "long-id" => {
            t.add("bad", "i".repeat(64), good());
        }
        "dev-type" => {
            t.add("../../etc", "x", good());
        }
        "giant-tree" => {
            // Pushed directly: the builder's duplicate check is linear per add.
            let info = good();
            t.group("bad")
                .devices
                .extend((0..20_000).map(|i| wdp_guest::types::Device {
                    id: format!("d{i}"),
                    info: info.clone(),
                }));
        }
        "giant-string" => {
            t.add("bad", "x", good().env("BIG", "x".repeat(8 << 20)));
        }
        "too-many-types" => {
            for i in 0..1000 {
                t.add(&format!("t{i}"), "x", good());
            }
        }
        "cdi-name" => {
            t.add("bad", "x", good().cdi_device("not-qualified"));
        }
        "annotation-key" => {
            t.add("bad", "x", good().annotation("-bad key-", "1"));
        }
        "relative-container-path" => {
            t.add(
                "bad",
                "x",
                DeviceInfo::new().node("/dev/null", "dev/x", "rw"),
            );
        }
        other => unreachable!("unknown bad tree {other}"),
    }
    t.build()
}

// The raw canonical-ABI import behind `notifier.notify(list<device-group>)`: (pointer, length).
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wdp:device-plugin/notifier@0.1.2")]
unsafe extern "C" {
    #[link_name = "notify"]
    fn raw_notify(groups: *const u8, len: usize);
}

/// Calls notify with a list the host cannot lift: the host must trap this guest, nothing else.
#[cfg(target_arch = "wasm32")]
fn raw_notify_attack(kind: &str) {
    match kind {
        // A list of a billion 16-byte records: far past the end of linear memory.
        "raw-out-of-bounds" => unsafe { raw_notify(8 as *const u8, 1 << 30) },
        // One device-group whose dev-type string is not UTF-8.
        _ => {
            static BYTES: [u8; 4] = [0xff, 0xfe, 0xc3, 0x28];
            let record: [u32; 4] = [BYTES.as_ptr() as u32, BYTES.len() as u32, 0, 0];
            unsafe { raw_notify(black_box(record.as_ptr()).cast(), 1) }
        }
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn raw_notify_attack(_: &str) {
    unreachable!("host imports exist only on wasm")
}

/// The `batch-probe` outcomes: (probe name, outcome), reads then listings.
#[cfg(target_arch = "wasm32")]
fn batch_probes() -> Vec<(String, String)> {
    use wdp_guest::bindings::scanner::wdp::device_plugin::hostfs;
    let paths: Vec<String> = BATCH_READS.map(String::from).to_vec();
    let mut out = Vec::new();
    match hostfs::read_files(&paths) {
        Ok(results) => {
            for (i, (path, r)) in paths.iter().zip(results).enumerate() {
                let outcome = match r {
                    Ok(got) if path == "/sys/ok" => format!("read: {}", clean(&got)),
                    Ok(got) => leaked(got),
                    Err(e) => denied(format!("{e:?}")),
                };
                out.push((format!("read-{i}"), outcome));
            }
        }
        Err(e) => out.push(("read-files".into(), denied(e))),
    }
    for (i, dir) in BATCH_LISTS.iter().enumerate() {
        let outcome = match hostfs::list_dir(dir) {
            Ok(entries) if !entries.is_empty() => leaked(format!(
                "{} entries, e.g. {}",
                entries.len(),
                entries[0].name
            )),
            Ok(_) => denied("empty"),
            Err(e) => denied(e),
        };
        out.push((format!("list-{i}"), outcome));
    }
    out
}

#[cfg(not(target_arch = "wasm32"))]
fn batch_probes() -> Vec<(String, String)> {
    unreachable!("host imports exist only on wasm")
}

fn tcp_connect(port: u16) -> String {
    match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(_) => leaked(format!("connected to 127.0.0.1:{port}")),
        Err(e) => denied(format!("127.0.0.1:{port}: {e}")),
    }
}

/// The `host-env` outcome for the variable names a guest sees.
pub fn host_env_outcome(names: &[String]) -> String {
    if names.iter().any(|n| n == "PATH" || n == "HOME") {
        leaked(format!("host environment: {}", names.join(", ")))
    } else {
        format!("denied: only [{}]", names.join(", "))
    }
}

fn fd_magic() -> String {
    let paths: Vec<String> = [
        "/sys/../proc/self/environ",
        "/proc/self/environ",
        "/sys/../proc/self/fd/0",
        "/proc/self/fd/0",
        "/dev/fd/0",
        "/dev/stdin",
        "/sys/../dev/fd/0",
    ]
    .map(String::from)
    .to_vec();
    read_any(&paths)
}

/// Runs every probe: (name, outcome), in [`PROBES`] order.
fn probes(tcp_port: u16) -> Vec<(String, String)> {
    let mut names: Vec<String> = std::env::vars_os()
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    names.sort();
    let outcomes = [
        read_probe("/etc/passwd"),
        read_probe("/sys/../etc/passwd"),
        read_probe("/sys/escape-abs/passwd"),
        read_probe("/sys/escape-rel/passwd"),
        sys_write(),
        sys_create(),
        dev_read_std(),
        read_probe("/sys/devnode"),
        devfs_stat("/dev/../etc/passwd"),
        devfs_escape_link(),
        devfs_stat("/etc/passwd"),
        tcp_connect(tcp_port),
        host_env_outcome(&names),
        fd_magic(),
        sys_trailing_slash(),
        devfs_trailing_slash(),
        devfs_stat(&format!("/dev/{}", "a/".repeat(3000))),
    ];
    PROBES.iter().map(|p| p.to_string()).zip(outcomes).collect()
}

/// The report tree: dev-type `probe`, one device `report` carrying the outcomes as annotations
/// (probe names contain `-`, which env names may not).
pub fn report_tree(outcomes: Vec<(String, String)>) -> DeviceTree {
    let info = outcomes
        .into_iter()
        .fold(DeviceInfo::new(), |info, (k, v)| info.annotation(k, v));
    let mut t = TreeBuilder::new();
    t.add("probe", "report", info);
    t.build()
}

/// A tree with one device `id` of type `dev_type`.
pub fn single(dev_type: &str, id: &str) -> DeviceTree {
    let mut t = TreeBuilder::new();
    t.add(dev_type, id, DeviceInfo::new());
    t.build()
}

fn spin() -> ! {
    let mut x = 0u64;
    loop {
        x = black_box(x.wrapping_add(1));
    }
}

fn memory() -> Result<(), String> {
    const MIB: usize = 1 << 20;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for i in 0..1024usize {
        let mut chunk = vec![0u8; MIB];
        for page in chunk.chunks_mut(4096) {
            page[0] = (i as u8) | 1;
        }
        chunks.push(black_box(chunk));
    }
    black_box(&chunks);
    Err("LEAKED: allocated and touched 1 GiB: the memory cap was not enforced".into())
}

#[inline(never)]
fn recurse(depth: u64) -> u64 {
    let pad = black_box([depth; 32]);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    black_box(recurse(black_box(depth + 1))).wrapping_add(pad[7])
}

struct Hostile;

impl wdp_guest::Scanner for Hostile {
    fn scan() -> Result<(), String> {
        if let Some(outcome) = hostfs_attacks::run() {
            return outcome;
        }
        let attack = config::env_choice("ATTACK", "probe", &ATTACKS)?;
        match attack {
            "probe" => {
                let port = config::env_u32("TCP_PORT", 1, 1..=65535)? as u16;
                notify(&report_tree(probes(port)));
                Ok(())
            }
            "batch-probe" => {
                notify(&report_tree(batch_probes()));
                Ok(())
            }
            "memory" => memory(),
            "spin" => spin(),
            "panic" => panic!("hostile panic"),
            "recursion" => {
                black_box(recurse(black_box(0)));
                Ok(())
            }
            "flood" => {
                for i in 0..10_000 {
                    notify(&single("flood", &format!("n{i}")));
                }
                Ok(())
            }
            "bad-tree" => {
                let kind = config::env_choice("BAD", "node-outside-dev", &BAD_TREES)?;
                notify(&single("good", "g"));
                notify(&bad_tree(kind));
                // Stay up: the host must keep serving the good tree.
                loop {
                    devfs::wait_for_change(u32::MAX);
                }
            }
            "raw-out-of-bounds" | "raw-bad-utf8" => {
                notify(&single("good", "g"));
                raw_notify_attack(attack);
                Err("LEAKED: the host accepted an unliftable notify".into())
            }
            a if output_attacks::OUTPUT_ATTACKS.contains(&a) => output_attacks::run(a),
            a if lift_attacks::LIFT_ATTACKS.contains(&a) => lift_attacks::run(a),
            a if changes_attacks::CHANGES_ATTACKS.contains(&a) => changes_attacks::run(a),
            "notify-then-spin" => {
                notify(&single("before", "x"));
                spin()
            }
            other => Err(format!("ATTACK={other:?} is not handled")),
        }
    }
}

wdp_guest::export_scanner!(Hostile);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_shape() {
        let t = report_tree(vec![("host-env".into(), "denied: only [ATTACK]".into())]);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].dev_type, "probe");
        assert_eq!(t[0].devices[0].id, "report");
        assert_eq!(
            t[0].devices[0].info.annotations,
            [("host-env".to_string(), "denied: only [ATTACK]".to_string())]
        );
    }

    #[test]
    fn outcomes() {
        assert_eq!(
            host_env_outcome(&["ATTACK".into(), "TCP_PORT".into()]),
            "denied: only [ATTACK, TCP_PORT]"
        );
        assert!(host_env_outcome(&["HOME".into()]).starts_with("LEAKED: "));
        assert!(host_env_outcome(&["PATH".into()]).starts_with("LEAKED: "));
        assert_eq!(clean("root:x:0:0\n\u{1}é"), "root:x:0:0...");
        assert_eq!(clean(&"a".repeat(200)).len(), 80);
        // on the build machine /etc/passwd is readable: the probe must say so
        assert!(read_probe("/etc/passwd").starts_with("LEAKED: /etc/passwd: "));
        assert!(read_probe("/nonexistent/x").starts_with("denied: /nonexistent/x: "));
        assert!(read_any(&["/dev/zero".into()]).starts_with("LEAKED: /dev/zero: 32 bytes"));
    }

    #[test]
    fn probe_names_are_unique() {
        let mut p = PROBES.to_vec();
        p.sort();
        p.dedup();
        assert_eq!(p.len(), PROBES.len());
        assert_eq!(single("before", "x")[0].devices[0].id, "x");
    }
}
