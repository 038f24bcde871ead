//! `wdp snapshot` and `wdp scan --from-snapshot`: real scanners recorded over fixture trees with
//! mknod'ed device nodes, the archive's contents checked (with the library's reader and with
//! GNU tar), then replayed after the fixture is gone.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use wdp::hostfs::resolve::Kind;
use wdp::snapshot::archive::{self, Snapshot};
use wdp::snapshot::record::{Entry, Recording};
use wdp_tests::fixture::Fixture;
use wdp_tests::{guest, json_lines, wdp};

/// `wdp snapshot` of guest `name` over `f` into `out`, with extra `args`.
fn snapshot(name: &str, f: &Fixture, out: &Path, args: &[&str]) -> Output {
    let component = guest(name).display().to_string();
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    let out = out.display().to_string();
    let mut all = vec![
        "snapshot",
        "--component",
        &component,
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--output",
        &out,
    ];
    all.extend_from_slice(args);
    wdp(&all)
}

/// `wdp scan --once` of guest `name` over `f`: the tree the machine itself gives.
fn scan_once(name: &str, f: &Fixture, args: &[&str]) -> Value {
    let component = guest(name).display().to_string();
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    let mut all = vec![
        "scan",
        "--component",
        &component,
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--once",
    ];
    all.extend_from_slice(args);
    let out = wdp(&all);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    json_lines(&out.stdout).remove(0)
}

/// `wdp scan --from-snapshot <file>` with extra `args`.
fn replay(file: &Path, args: &[&str]) -> Output {
    let file = file.display().to_string();
    let mut all = vec!["scan", "--from-snapshot", &file];
    all.extend_from_slice(args);
    wdp(&all)
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sys_entry<'a>(s: &'a Snapshot, rel: &str) -> &'a Entry {
    s.sys
        .get(Path::new(rel))
        .unwrap_or_else(|| panic!("sys/{rel} is not in the snapshot: {:?}", s.sys.keys()))
}

fn contents(s: &Snapshot, rel: &str) -> String {
    let e = sys_entry(s, rel);
    assert_eq!(e.stat.kind, Kind::File, "sys/{rel}");
    String::from_utf8(e.contents.clone().expect("contents recorded")).expect("utf-8")
}

fn dev_kind(s: &Snapshot, rel: &str) -> Option<(Kind, u32)> {
    s.dev
        .entries()
        .find(|(p, _)| *p == Path::new(rel))
        .map(|(_, st)| (st.kind.clone(), st.mode))
}

/// `tar -tvzf` of the archive: what a user sees with standard tools.
fn tar_listing(file: &Path) -> String {
    let out = std::process::Command::new("tar")
        .arg("-tvzf")
        .arg(file)
        .output()
        .expect("run tar");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The usb + serial machine the `generic` scanner reads, with things it never reads.
fn usb_machine(f: &Fixture) {
    f.char_dev("ttyUSB0", 188, 0)
        .char_dev("ttyUSB1", 188, 1)
        .char_dev("ttyS0", 4, 64)
        .char_dev("bus/usb/001/004", 189, 3)
        .char_dev("bus/usb/002/001", 189, 128);
    let key = "devices/pci0000:00/0000:00:14.0/usb1/1-1";
    let hub = "devices/pci0000:00/0000:00:14.0/usb2";
    for (dir, vendor, product, bus, dev) in [
        (key, "1050", "0407", "1", "4"),
        (hub, "1d6b", "0002", "2", "1"),
    ] {
        f.sys_file(&format!("{dir}/idVendor"), &format!("{vendor}\n"))
            .sys_file(&format!("{dir}/idProduct"), &format!("{product}\n"))
            .sys_file(&format!("{dir}/busnum"), &format!("{bus}\n"))
            .sys_file(&format!("{dir}/devnum"), &format!("{dev}\n"));
    }
    f.sys_file(&format!("{key}/serial"), "CC-0001\n")
        // In a directory the scanner reads files of, but never this one.
        .sys_file(&format!("{key}/manufacturer"), "UNREAD-MANUFACTURER\n")
        // Nowhere near what the scanner reads.
        .sys_file("class/net/eth0/address", "UNRELATED-MAC\n")
        .sys_link(
            "bus/usb/devices/1-1",
            "../../../devices/pci0000:00/0000:00:14.0/usb1/1-1",
        )
        .sys_link(
            "bus/usb/devices/usb2",
            "../../../devices/pci0000:00/0000:00:14.0/usb2",
        );
}

const DEVICES: &str = r#"DEVICES=[
    {"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
    {"name": "yubikey", "groups": [{"usb": [{"vendor": "1050", "product": "0407"}]}]}
]"#;

#[test]
fn generic_snapshot_holds_what_was_read_and_replays_without_the_fixture() {
    let f = Fixture::new();
    usb_machine(&f);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("case.tar.gz");
    let machine_tree = scan_once("generic", &f, &["--env", DEVICES]);
    assert!(
        machine_tree["yubikey"]
            .as_object()
            .is_some_and(|k| !k.is_empty())
    );

    let said = ok(&snapshot("generic", &f, &file, &["--env", DEVICES]));
    assert!(said.contains(&file.display().to_string()), "{said}");
    assert!(said.contains("device node(s)"), "{said}");

    let s = archive::read(&file).expect("read the snapshot back");
    let m = &s.manifest;
    assert_eq!(m.scanner, "generic");
    assert_eq!(m.component, "generic.wasm");
    assert_eq!(m.env, [("DEVICES".to_string(), DEVICES[8..].to_string())]);
    assert_eq!(
        m.tree, machine_tree,
        "the manifest holds the machine's tree"
    );
    assert_eq!(m.component_sha256.len(), 64);
    assert!(m.kernel_release.as_deref().is_some_and(|k| !k.is_empty()));
    assert_eq!(
        s.component.as_deref(),
        Some(&std::fs::read(guest("generic")).unwrap()[..]),
        "the component travels with the case"
    );

    // /sys: the link the scanner followed, the attributes it read, with their contents.
    assert_eq!(
        sys_entry(&s, "bus/usb/devices/1-1").stat.kind,
        Kind::Symlink("../../../devices/pci0000:00/0000:00:14.0/usb1/1-1".into())
    );
    let key = "devices/pci0000:00/0000:00:14.0/usb1/1-1";
    assert_eq!(contents(&s, &format!("{key}/idVendor")), "1050\n");
    assert_eq!(contents(&s, &format!("{key}/serial")), "CC-0001\n");
    assert_eq!(
        contents(&s, "devices/pci0000:00/0000:00:14.0/usb2/devnum"),
        "1\n"
    );
    // What it never read is not there at all.
    assert!(
        !s.sys
            .contains_key(Path::new(&format!("{key}/manufacturer")))
    );
    assert!(
        s.sys.keys().all(|p| !p.starts_with("class")),
        "{:?}",
        s.sys.keys()
    );
    let whole = std::fs::read(&file).unwrap();
    let mut text = Vec::new();
    flate_decode(&whole, &mut text);
    let text = String::from_utf8_lossy(&text);
    assert!(!text.contains("UNREAD-MANUFACTURER") && !text.contains("UNRELATED-MAC"));

    // /dev: metadata of the nodes (their real mode, whatever the umask made it), as tar device
    // entries with no contents.
    let mode = |rel: &str| {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(f.dev().join(rel)).unwrap().mode() & 0o7777
    };
    let usb0 = Kind::Char {
        major: 188,
        minor: 0,
    };
    assert_eq!(dev_kind(&s, "ttyUSB0"), Some((usb0, mode("ttyUSB0"))));
    let key_node = Kind::Char {
        major: 189,
        minor: 3,
    };
    assert_eq!(
        dev_kind(&s, "bus/usb/001/004"),
        Some((key_node, mode("bus/usb/001/004")))
    );
    let listing = tar_listing(&file);
    let line = listing
        .lines()
        .find(|l| l.ends_with(" dev/ttyUSB0"))
        .unwrap_or_else(|| panic!("dev/ttyUSB0 not listed by tar:\n{listing}"));
    assert!(line.starts_with('c') && line.contains("188,0"), "{line}");

    // The machine is gone; the case replays from the archive alone, with the recorded component.
    drop(f);
    let out = replay(&file, &[]);
    let stdout = ok(&out);
    assert_eq!(json_lines(stdout.as_bytes()), [machine_tree]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("equals the one recorded"), "{stderr}");
}

/// Decompresses a gzip stream with the system's gzip (the archive's bytes, as a user has them).
fn flate_decode(gz: &[u8], out: &mut Vec<u8>) {
    use std::io::Write;
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run gzip");
    child.stdin.take().unwrap().write_all(gz).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    out.extend(o.stdout);
}

/// Rewrites the snapshot at `file` with `edit` applied to its /sys entries.
fn edit(file: &Path, edit: impl FnOnce(&mut Snapshot)) -> PathBuf {
    let mut s = archive::read(file).unwrap();
    edit(&mut s);
    let rec = Recording {
        sys: s.sys.clone(),
        dev: s
            .dev
            .entries()
            .map(|(p, st)| {
                (
                    p.clone(),
                    Entry {
                        stat: st.clone(),
                        contents: None,
                    },
                )
            })
            .collect(),
        truncated: Vec::new(),
    };
    let edited = file.with_file_name("edited.tar.gz");
    let component = s.component.clone().unwrap_or_default();
    archive::write(&edited, &s.manifest, &component, &rec, 0).unwrap();
    edited
}

#[test]
fn an_edited_attribute_makes_the_replay_report_the_difference() {
    let f = Fixture::new();
    usb_machine(&f);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("case.tar.gz");
    ok(&snapshot("generic", &f, &file, &["--env", DEVICES]));
    drop(f);
    // Unchanged, rewritten by the library: still equal (the rewrite itself changes nothing).
    let same = edit(&file, |_| {});
    ok(&replay(&same, &[]));

    // The key now claims another vendor: the scanner no longer matches it.
    let edited = edit(&file, |s| {
        let e = s
            .sys
            .get_mut(Path::new(
                "devices/pci0000:00/0000:00:14.0/usb1/1-1/idVendor",
            ))
            .unwrap();
        e.contents = Some(b"dead\n".to_vec());
    });
    let out = replay(&edited, &[]);
    assert_eq!(out.status.code(), Some(1), "a difference exits 1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("differs from the one recorded"), "{stderr}");
    assert!(
        stderr.contains("/yubikey"),
        "the difference names the path: {stderr}"
    );
    // The replayed tree is still printed, for the author to look at.
    let trees = json_lines(&out.stdout);
    assert_eq!(trees.len(), 1);
    assert_eq!(trees[0]["yubikey"], serde_json::json!({}), "{}", trees[0]);
}

#[test]
fn a_damaged_snapshot_is_a_clear_error_naming_the_file() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("kvm.tar.gz");
    ok(&snapshot("kvm", &f, &file, &["--env", "SLOTS=2"]));
    let whole = std::fs::read(&file).unwrap();

    let cases: [(&str, Vec<u8>); 3] = [
        ("garbage.tar.gz", b"this is not an archive".to_vec()),
        ("truncated.tar.gz", whole[..whole.len() / 2].to_vec()),
        ("empty.tar.gz", Vec::new()),
    ];
    for (name, bytes) in cases {
        let bad = out_dir.path().join(name);
        std::fs::write(&bad, bytes).unwrap();
        let out = replay(&bad, &[]);
        assert!(!out.status.success(), "{name} replayed");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("{} is not a usable wdp snapshot", bad.display())),
            "{name}: {stderr}"
        );
    }
    let missing = out_dir.path().join("missing.tar.gz");
    let out = replay(&missing, &[]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");

    // And the good one still replays (kvm, over a /dev that exists only in the archive).
    drop(f);
    let out = replay(&file, &[]);
    let tree = &json_lines(ok(&out).as_bytes())[0];
    assert_eq!(tree["kvm"].as_object().map(|o| o.len()), Some(2));
}

/// The DRM major.
const DRM: u32 = 226;

/// One Intel GPU on i915 at 0000:00:02.0 as the kernel and udev show it: PCI function with its
/// driver link, DRM nodes with class and /sys/dev/char links, by-path links, NUMA node 0.
fn gpu_machine(f: &Fixture) {
    let bdf = "0000:00:02.0";
    let dir = f.pci_device(
        bdf,
        &[
            ("vendor", "0x8086"),
            ("device", "0xa7a0"),
            ("class", "0x030000"),
            ("numa_node", "0"),
            ("local_cpulist", "0-3"),
        ],
    );
    f.pci_bind(bdf, "i915");
    for (name, minor) in [("card0", 0), ("renderD128", 128)] {
        let node_dir = format!("{dir}/drm/{name}");
        f.sys_file(&format!("{node_dir}/dev"), &format!("{DRM}:{minor}\n"));
        f.sys_link(&format!("{node_dir}/device"), &format!("../../../{bdf}"));
        f.sys_link(&format!("class/drm/{name}"), &format!("../../{node_dir}"));
        f.sys_link(
            &format!("dev/char/{DRM}:{minor}"),
            &format!("../../{node_dir}"),
        );
        f.char_dev(&format!("dri/{name}"), DRM, minor);
    }
    f.dev_link(&format!("dri/by-path/pci-{bdf}-card"), "../card0");
    f.dev_link(&format!("dri/by-path/pci-{bdf}-render"), "../renderD128");
}

#[test]
fn gpu_snapshot_keeps_the_sysfs_links_and_numa_through_the_round_trip() {
    let f = Fixture::new();
    gpu_machine(&f);
    // By-path mounts on, so the scanner reads /dev/dri/by-path.
    let allow = [
        "--allow-mount",
        "/dev/dri/by-path",
        "--env",
        "BYPATH=single",
    ];
    let machine_tree = scan_once("gpu", &f, &allow);
    assert_eq!(
        machine_tree["i915"]["card0-0"]["numa_nodes"],
        serde_json::json!([0]),
        "the host derived NUMA from sysfs: {machine_tree}"
    );
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("gpu.tar.gz");
    ok(&snapshot("gpu", &f, &file, &allow));

    let s = archive::read(&file).unwrap();
    let link = |rel: &str| match &sys_entry(&s, rel).stat.kind {
        Kind::Symlink(t) => t.clone(),
        other => panic!("sys/{rel} is {other:?}, not a symlink"),
    };
    assert_eq!(
        link("devices/pci0000:00/0000:00:02.0/driver"),
        "../../../bus/pci/drivers/i915"
    );
    assert_eq!(
        link("class/drm/card0"),
        "../../devices/pci0000:00/0000:00:02.0/drm/card0"
    );
    // The host's own NUMA lookup: /sys/dev/char/MAJ:MIN and the function's numa_node.
    assert_eq!(
        link("dev/char/226:0"),
        "../../devices/pci0000:00/0000:00:02.0/drm/card0"
    );
    assert_eq!(
        contents(&s, "devices/pci0000:00/0000:00:02.0/numa_node"),
        "0\n"
    );
    assert_eq!(
        dev_kind(&s, "dri/by-path/pci-0000:00:02.0-card"),
        Some((Kind::Symlink("../card0".into()), 0o777))
    );
    assert_eq!(
        dev_kind(&s, "dri/renderD128").map(|k| k.0),
        Some(Kind::Char {
            major: DRM,
            minor: 128
        })
    );

    drop(f);
    let out = replay(&file, &[]);
    assert_eq!(json_lines(ok(&out).as_bytes()), [machine_tree]);
}

#[test]
fn replay_with_another_component_says_so() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("kvm.tar.gz");
    ok(&snapshot("kvm", &f, &file, &["--env", "SLOTS=2"]));
    drop(f);
    // Another build of a scanner (here: another scanner) over the same case: noted, and its
    // different tree is reported.
    let other = guest("static_tree").display().to_string();
    let out = replay(&file, &["--component", &other]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is not the recorded component kvm.wasm"),
        "{stderr}"
    );
    // --env overrides the recorded configuration.
    let out = replay(&file, &["--env", "SLOTS=3"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/kvm/kvm-2: only replayed"), "{stderr}");
}

#[test]
fn a_failing_scanner_is_recorded_and_its_failure_replayed() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("kvm-fails.tar.gz");
    let out = snapshot("kvm", &f, &file, &["--env", "SLOTS=lots"]);
    let said = ok(&out);
    assert!(said.contains("reported no tree (failed)"), "{said}");
    let m = archive::read(&file).unwrap().manifest;
    assert_eq!(m.tree, Value::Null);
    let error = m.error.expect("the failure is recorded");
    assert!(error.contains("SLOTS=\"lots\" is not valid"), "{error}");
    drop(f);

    // Reproduced: the same failure, exit 0.
    let out = replay(&file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("the scanner fails as it did"), "{stderr}");
    // Fixed (here: configured right): the recorded failure is gone, which is a difference.
    let out = replay(&file, &["--env", "SLOTS=1"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no tree was recorded"), "{stderr}");
}

#[test]
fn redacted_serials_leave_the_archive_and_the_case_still_replays() {
    let f = Fixture::new();
    usb_machine(&f);
    // Selected by its serial: the value is in the configuration, the device id and /sys.
    let env = r#"DEVICES=[{"name": "key", "groups": [{"usb": [{"vendor": "1050", "product": "0407", "serial": "CC-0001"}]}]}]"#;
    let machine_tree = scan_once("generic", &f, &["--env", env]);
    assert!(
        machine_tree["key"]["usb-1050-0407-CC-0001"].is_object(),
        "{machine_tree}"
    );
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("redacted.tar.gz");
    ok(&snapshot(
        "generic",
        &f,
        &file,
        &["--env", env, "--redact", "serial"],
    ));

    let mut text = Vec::new();
    flate_decode(&std::fs::read(&file).unwrap(), &mut text);
    assert!(
        !String::from_utf8_lossy(&text).contains("CC-0001"),
        "the serial is nowhere in the archive"
    );
    let s = archive::read(&file).unwrap();
    assert_eq!(
        contents(&s, "devices/pci0000:00/0000:00:14.0/usb1/1-1/serial"),
        "redacted-1\n"
    );
    assert_eq!(s.manifest.redacted, ["serial"]);
    assert!(s.manifest.tree["key"]["usb-1050-0407-redacted-1"].is_object());
    drop(f);
    let out = replay(&file, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("equals the one recorded"), "{stderr}");
}

#[test]
fn a_scanner_of_the_run_config_is_recorded_as_the_host_runs_it() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("net/tun", 10, 200);
    let config = f.path().join("wdp.yaml");
    std::fs::write(
        &config,
        format!(
            "scanners:\n  - name: virt\n    component: {}\n    namespace: devices.kubevirt.io\n    env: {{ SLOTS: 3 }}\n    limits: {{ memory: 96Mi, call-timeout: 7s }}\n",
            guest("kvm").display()
        ),
    )
    .unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("virt.tar.gz");
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    let config = config.display().to_string();
    let out = wdp(&[
        "snapshot",
        "--config",
        &config,
        "--scanner",
        "virt",
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--output",
        &file.display().to_string(),
    ]);
    ok(&out);
    let m = archive::read(&file).unwrap().manifest;
    assert_eq!(m.scanner, "virt");
    assert_eq!(m.component, "kvm.wasm");
    assert_eq!(m.env, [("SLOTS".to_string(), "3".to_string())]);
    let limits = m.limits.expect("limits recorded");
    assert_eq!((limits.memory, limits.call_timeout_ms), (96 << 20, 7000));
    assert_eq!(m.tree["kvm"].as_object().map(|o| o.len()), Some(3));
    assert_eq!(m.tree["tun"].as_object().map(|o| o.len()), Some(3));

    let out = wdp(&[
        "snapshot",
        "--config",
        &config,
        "--scanner",
        "nope",
        "-o",
        "/nonexistent",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has no scanner named \"nope\""), "{stderr}");

    // As out of a pod whose image has no tar or cat: the archive on stdout, the summary on
    // stderr.
    let out = wdp(&[
        "snapshot",
        "--config",
        &config,
        "--scanner",
        "virt",
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--output",
        "-",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("wrote the snapshot to stdout"));
    let piped = out_dir.path().join("piped.tar.gz");
    std::fs::write(&piped, &out.stdout).unwrap();
    assert_eq!(archive::read(&piped).unwrap().manifest.tree, m.tree);

    drop(f);
    ok(&replay(&file, &[]));
    ok(&replay(&piped, &[]));
}

/// One HID device as sysfs shows it (the layout of the `languages` tests): `class/hidraw/<node>`
/// links to the node under the HID device, whose `uevent` names it.
fn hid_machine(f: &Fixture) {
    let hid = "devices/pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/0003:1050:0407.0001";
    f.sys_file(
        &format!("{hid}/uevent"),
        "DRIVER=hid-generic\nHID_ID=0003:00001050:00000407\nHID_NAME=Yubico YubiKey\n\
         HID_PHYS=usb-0000:00:14.0-1-2/input0\nHID_UNIQ=\n",
    )
    .sys_link(
        &format!("{hid}/hidraw/hidraw0/device"),
        "../../../0003:1050:0407.0001",
    )
    .sys_link(
        "class/hidraw/hidraw0",
        &format!("../../{hid}/hidraw/hidraw0"),
    );
    f.char_dev("hidraw0", 240, 0);
}

#[test]
fn a_python_scanner_round_trips_too() {
    let f = Fixture::new();
    hid_machine(&f);
    let component = wdp_tests::lang_guest("python", "hidraw");
    let out_dir = tempfile::tempdir().unwrap();
    let cache = out_dir.path().join("compiled").display().to_string();
    let file = out_dir.path().join("hidraw.tar.gz");
    let (sys, dev) = (f.sys().display().to_string(), f.dev().display().to_string());
    let out = wdp(&[
        "snapshot",
        "--component",
        &component.display().to_string(),
        "--sys-root",
        &sys,
        "--dev-root",
        &dev,
        "--compile-cache",
        &cache,
        "--output",
        &file.display().to_string(),
    ]);
    ok(&out);
    let s = archive::read(&file).unwrap();
    assert!(
        s.manifest.tree["hidraw"]["hidraw0"].is_object(),
        "{}",
        s.manifest.tree
    );
    assert_eq!(
        sys_entry(&s, "class/hidraw/hidraw0").stat.kind,
        Kind::Symlink(
            "../../devices/pci0000:00/0000:00:14.0/usb1/1-2/1-2:1.0/0003:1050:0407.0001/hidraw/hidraw0"
                .into()
        )
    );
    drop(f);
    let out = replay(&file, &["--compile-cache", &cache]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("equals the one recorded"), "{stderr}");
}
