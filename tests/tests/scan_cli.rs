//! `wdp scan`, the binary, over fixture trees and over this machine's real /dev.

use std::path::Path;

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::{guest, json_lines, wdp};

fn scan(component: &Path, f: &Fixture, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "scan".to_string(),
        "--component".into(),
        component.display().to_string(),
        "--sys-root".into(),
        f.sys().display().to_string(),
        "--dev-root".into(),
        f.dev().display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    wdp(&args)
}

#[test]
fn kvm_over_a_fixture_prints_the_documented_json() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("net/tun", 10, 200);
    // vhost-net and fuse are absent: their types must be too.
    let out = scan(&guest("kvm"), &f, &["--env", "SLOTS=2", "--once"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trees = json_lines(&out.stdout);
    assert_eq!(trees.len(), 1, "--once prints exactly one tree");
    let device = |path: &str| {
        json!({
            "health": "Healthy",
            "nodes": [{"container_path": path, "host_path": path, "permissions": "rw"}],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "numa_nodes": null,
            "cdi_devices": []
        })
    };
    assert_eq!(
        trees[0],
        json!({
            "kvm": {"kvm-0": device("/dev/kvm"), "kvm-1": device("/dev/kvm")},
            "tun": {"tun-0": device("/dev/net/tun"), "tun-1": device("/dev/net/tun")},
        })
    );
}

#[test]
fn table_format_lists_every_device() {
    let f = Fixture::new();
    f.char_dev("fuse", 10, 229);
    let out = scan(
        &guest("kvm"),
        &f,
        &["--env", "SLOTS=3", "--once", "--format", "table"],
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("# tree 1: 1 type(s), 3 device(s)"),
        "{text}"
    );
    for id in ["fuse-0", "fuse-1", "fuse-2"] {
        assert!(text.contains(id), "{text}");
    }
}

#[test]
fn generic_matches_globs_and_usb_ids() {
    let f = Fixture::new();
    f.char_dev("ttyUSB0", 188, 0)
        .char_dev("ttyUSB1", 188, 1)
        .char_dev("ttyS0", 4, 64)
        .char_dev("bus/usb/001/004", 189, 3)
        .char_dev("bus/usb/002/001", 189, 128);
    // A YubiKey on bus 1 and a hub on bus 2, linked from bus/usb/devices as sysfs does.
    f.sys_file(
        "devices/pci0000:00/0000:00:14.0/usb1/1-1/idVendor",
        "1050\n",
    )
    .sys_file(
        "devices/pci0000:00/0000:00:14.0/usb1/1-1/idProduct",
        "0407\n",
    )
    .sys_file("devices/pci0000:00/0000:00:14.0/usb1/1-1/busnum", "1\n")
    .sys_file("devices/pci0000:00/0000:00:14.0/usb1/1-1/devnum", "4\n")
    .sys_file("devices/pci0000:00/0000:00:14.0/usb2/idVendor", "1d6b\n")
    .sys_file("devices/pci0000:00/0000:00:14.0/usb2/idProduct", "0002\n")
    .sys_file("devices/pci0000:00/0000:00:14.0/usb2/busnum", "2\n")
    .sys_file("devices/pci0000:00/0000:00:14.0/usb2/devnum", "1\n")
    .sys_link(
        "bus/usb/devices/1-1",
        "../../../devices/pci0000:00/0000:00:14.0/usb1/1-1",
    )
    .sys_link(
        "bus/usb/devices/usb2",
        "../../../devices/pci0000:00/0000:00:14.0/usb2",
    );
    let devices = r#"[
        {"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
        {"name": "yubikey", "groups": [{"usb": [{"vendor": "1050", "product": "0407"}]}]}
    ]"#;
    let env = format!("DEVICES={devices}");
    let out = scan(&guest("generic"), &f, &["--env", &env, "--once"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = &json_lines(&out.stdout)[0];
    let serial = tree["serial"].as_object().unwrap();
    let serial_ids: Vec<_> = serial.keys().collect();
    assert_eq!(serial_ids, ["ttyUSB0", "ttyUSB1"]);
    assert_eq!(serial["ttyUSB1"]["nodes"][0]["host_path"], "/dev/ttyUSB1");
    let yubikey = tree["yubikey"].as_object().unwrap();
    assert_eq!(yubikey.len(), 1, "{yubikey:?}");
    let (_, key) = yubikey.iter().next().unwrap();
    assert_eq!(key["nodes"][0]["host_path"], "/dev/bus/usb/001/004");
}

#[test]
fn a_bad_configuration_fails_naming_the_scanner_and_the_cause() {
    let f = Fixture::new();
    let out = scan(&guest("kvm"), &f, &["--env", "SLOTS=lots", "--once"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scanner kvm failed"), "{err}");
    assert!(err.contains("SLOTS"), "{err}");
}

#[test]
fn a_trapping_guest_exits_non_zero_with_its_panic() {
    let f = Fixture::new();
    let out = scan(&guest("hostile"), &f, &["--env", "ATTACK=panic"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scanner hostile failed"), "{err}");
    assert!(err.contains("hostile panic"), "{err}");
}

/// A scanner notifies only changes, so after a refused tree `--once` would wait forever for
/// another: it exits non-zero naming the rule instead.
#[test]
fn once_ends_with_a_refused_tree() {
    let f = Fixture::new();
    let tree = r#"TREE={"t": {"a": {"nodes": ["/dev/missing"]}}}"#;
    let out = scan(&guest("static_tree"), &f, &["--env", tree, "--once"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tree refused (node-exists)"), "{err}");
}

#[test]
fn bad_inputs_are_explained() {
    let f = Fixture::new();
    let missing = f.path().join("nope.wasm");
    let out = scan(&missing, &f, &[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("nope.wasm"), "{err}");
    // The cause is said once, not again by the error chain.
    let enoent = "No such file or directory (os error 2)";
    assert_eq!(err.matches(enoent).count(), 1, "{err}");

    let missing_root = f.path().join("no-dev");
    let out = wdp(&[
        "scan",
        "--component",
        &guest("kvm").display().to_string(),
        "--dev-root",
        &missing_root.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "error: cannot open the dev root {}: {enoent}\n",
        missing_root.display()
    );
    assert_eq!(err, want);
    let missing_config = f.path().join("no.yaml");
    let out = wdp(&["run", "--config", &missing_config.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!(
        "error: cannot read config {}: {enoent}\n",
        missing_config.display()
    );
    assert_eq!(err, want);

    let not_wasm = f.path().join("text.wasm");
    std::fs::write(&not_wasm, "hello").unwrap();
    let out = scan(&not_wasm, &f, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a valid wasm component: it is not WebAssembly at all"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // A hook is not a scanner.
    let out = scan(&guest("test_hooks"), &f, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not export wdp:device-plugin/scanner"),
        "{err}"
    );

    let out = scan(&guest("kvm"), &f, &["--env", "NOEQUALS"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("expected KEY=VALUE"), "{err}");
    let out = scan(&guest("kvm"), &f, &["--memory", "lots"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a memory size"), "{err}");
}

/// The same binary over this machine's real /sys and /dev.
#[test]
fn finds_this_machines_real_devices() {
    let present: Vec<&str> = [
        ("kvm", "/dev/kvm"),
        ("fuse", "/dev/fuse"),
        ("tun", "/dev/net/tun"),
    ]
    .into_iter()
    .filter(|(_, p)| {
        std::fs::symlink_metadata(p)
            .map(|m| std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()))
            .unwrap_or(false)
    })
    .map(|(t, _)| t)
    .collect();
    if present.is_empty() {
        eprintln!("skipped: none of /dev/kvm, /dev/fuse, /dev/net/tun exists here");
        return;
    }
    let out = wdp(&[
        "scan",
        "--component",
        &guest("kvm").display().to_string(),
        "--env",
        "SLOTS=1",
        "--once",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = &json_lines(&out.stdout)[0];
    for dev_type in present {
        assert_eq!(
            tree[dev_type][format!("{dev_type}-0")]["health"],
            "Healthy",
            "{dev_type} missing from {tree}"
        );
    }
}

/// The compiled-component cache: the second load is a hit; a tampered entry is rejected, rebuilt,
/// and the scanner still runs.
#[test]
fn compiled_components_are_cached_and_checked() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let cache = f.path().join("compiled");
    let run = || {
        std::process::Command::new(wdp_tests::wdp_bin())
            .args(["scan", "--once", "--env", "SLOTS=1", "--compile-cache"])
            .arg(&cache)
            .arg("--component")
            .arg(guest("kvm"))
            .arg("--sys-root")
            .arg(f.sys())
            .arg("--dev-root")
            .arg(f.dev())
            .env("RUST_LOG", "info")
            .output()
            .expect("run wdp")
    };
    let logs = |out: &std::process::Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            json_lines(&out.stdout)[0]["kvm"]["kvm-0"]["health"],
            "Healthy"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let first = logs(&run());
    assert!(
        first.contains("component compiled") && first.contains("Miss"),
        "{first}"
    );
    let second = logs(&run());
    assert!(
        second.contains("loaded from the compiled-component cache"),
        "{second}"
    );

    let entries: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        entries.len(),
        2,
        "the payload and its checksum: {entries:?}"
    );
    let payload = entries
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "cwasm"))
        .expect("a .cwasm entry");
    let mut bytes = std::fs::read(payload).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(payload, bytes).unwrap();
    let third = logs(&run());
    assert!(
        third.contains("cache entry rejected; recompiling") && third.contains("checksum mismatch"),
        "{third}"
    );
    let fourth = logs(&run());
    assert!(
        fourth.contains("loaded from the compiled-component cache"),
        "{fourth}"
    );
}
