//! Scanners written in Python, JavaScript and C, run by the same host as the Rust ones: through
//! `wdp scan` over fixture trees (real character devices), and end to end through `wdp run` and
//! the kubelet stand-in, with an Allocate (and the JavaScript guest's post-allocator).
//!
//! The components come from `make guests` (`target/guests/{python,js,c}/<name>.wasm`, see
//! [`lang_guest`]). Python and JavaScript components take 10 s or more each to compile on two
//! cores, so every run here shares one compiled-component cache under target/ ([`cache_dir`]):
//! each component is compiled once per change, not once per test.

use std::collections::{BTreeMap, HashSet};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Mutex;

use serde_json::{Value, json};
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;
use wdp_tests::{json_lines, lang_guest, wdp, wdp_bin};

/// The compiled-component cache the tests of this file share.
fn cache_dir() -> PathBuf {
    PathBuf::from(env!("WDP_TARGET_DIR")).join("lang-tests/compiled")
}

/// Components already compiled into [`cache_dir`] by this test process.
static COMPILED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

/// Makes sure `component` is in [`cache_dir`] before tests use it, compiling it once (with a dry
/// run over an empty fixture) while other tests wait: two concurrent misses would compile the
/// same 18 MB component twice on a two-core machine.
fn compiled(component: &Path) {
    let mut done = COMPILED.lock().unwrap_or_else(|p| p.into_inner());
    if done.get_or_insert_with(HashSet::new).contains(component) {
        return;
    }
    let f = Fixture::new();
    let out = scan_at(component, &f, &["--once"]);
    assert!(
        out.status.success(),
        "{} over an empty fixture: {}",
        component.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    done.get_or_insert_with(HashSet::new)
        .insert(component.to_path_buf());
}

fn scan_at(component: &Path, f: &Fixture, extra: &[&str]) -> Output {
    std::process::Command::new(wdp_bin())
        .arg("scan")
        .arg("--component")
        .arg(component)
        .arg("--sys-root")
        .arg(f.sys())
        .arg("--dev-root")
        .arg(f.dev())
        .arg("--compile-cache")
        .arg(cache_dir())
        .args(extra)
        // info: the guest's own stderr is logged at info level
        .env("RUST_LOG", "info")
        .output()
        .expect("run wdp scan")
}

/// `wdp scan --component <component> ... <extra>` over the fixture, with the shared cache.
fn scan(component: &Path, f: &Fixture, extra: &[&str]) -> Output {
    compiled(component);
    scan_at(component, f, extra)
}

/// The one tree of a successful `--once` scan.
fn tree(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "wdp scan failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trees = json_lines(&out.stdout);
    assert_eq!(trees.len(), 1, "--once prints exactly one tree");
    trees.into_iter().next().unwrap()
}

/// The error of a scan that must fail.
fn failure(out: &Output) -> String {
    assert!(!out.status.success(), "the scan should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A device as `wdp scan` prints it: healthy, nodes at the same path in the container ("rw").
fn device(nodes: &[&str], envs: Value, annotations: Value) -> Value {
    device_with(nodes, envs, annotations, "Healthy")
}

fn device_with(nodes: &[&str], envs: Value, annotations: Value, health: &str) -> Value {
    let nodes: Vec<Value> = nodes
        .iter()
        .map(|p| json!({"container_path": p, "host_path": p, "permissions": "rw"}))
        .collect();
    json!({
        "health": health,
        "nodes": nodes,
        "mounts": [],
        "envs": envs,
        "annotations": annotations,
        "numa_nodes": null,
        "cdi_devices": []
    })
}

/// `wdp run` over the fixture with `scanner_yaml` (one entry of `scanners:`), serving into
/// `<fixture>/plugins`. `wdp run` keeps its cache in `<fixture>/compiled`: seed it from the
/// shared cache so the run loads `components` instead of compiling them again.
fn run_config(f: &Fixture, scanner_yaml: &str, components: &[&Path]) -> (PathBuf, PathBuf) {
    for c in components {
        compiled(c);
    }
    let seed = f.path().join("compiled");
    std::fs::create_dir_all(&seed).unwrap();
    std::fs::set_permissions(&seed, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    for entry in std::fs::read_dir(cache_dir())
        .unwrap()
        .filter_map(Result::ok)
    {
        // `<key>.cwasm` and its `<key>.cwasm.sha256`; not temporary files being written.
        if entry.file_name().to_string_lossy().contains(".cwasm") {
            std::fs::copy(entry.path(), seed.join(entry.file_name())).unwrap();
        }
    }
    let config = f.path().join("wdp.yaml");
    std::fs::write(&config, format!("scanners:\n{scanner_yaml}")).unwrap();
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    (config, plugins)
}

fn sorted_envs(envs: &std::collections::HashMap<String, String>) -> BTreeMap<&str, &str> {
    envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
}

// ---- Python: hidraw ------------------------------------------------------------------------

fn hidraw() -> PathBuf {
    lang_guest("python", "hidraw")
}

/// A HID device as sysfs shows it: `class/hidraw/<node>` links to the node's directory under the
/// HID device, whose `uevent` has HID_ID and HID_NAME; `<node>/device` links back up.
fn hid_device(f: &Fixture, node: &str, usb_port: &str, hid_id: &str, name: &str) {
    let (bus, vendor, product) = {
        let mut p = hid_id.split(':');
        (p.next().unwrap(), p.next().unwrap(), p.next().unwrap())
    };
    let hid = format!(
        "devices/pci0000:00/0000:00:14.0/usb1/{usb_port}/{usb_port}:1.0/{}:{}:{}.0001",
        &bus[bus.len() - 4..],
        &vendor[vendor.len() - 4..],
        &product[product.len() - 4..]
    );
    f.sys_file(
        &format!("{hid}/uevent"),
        &format!("DRIVER=hid-generic\nHID_ID={hid_id}\nHID_NAME={name}\nHID_PHYS=usb-0000:00:14.0-{usb_port}/input0\nHID_UNIQ=\n"),
    )
    .sys_link(
        &format!("{hid}/hidraw/{node}/device"),
        &format!("../../../{}", hid.rsplit('/').next().unwrap()),
    )
    .sys_link(
        &format!("class/hidraw/{node}"),
        &format!("../../{hid}/hidraw/{node}"),
    );
}

fn yubikey_and_receiver(f: &Fixture) {
    hid_device(
        f,
        "hidraw0",
        "1-2",
        "0003:00001050:00000407",
        "Yubico YubiKey OTP+FIDO+CCID",
    );
    hid_device(
        f,
        "hidraw1",
        "1-3",
        "0003:0000046D:0000C52B",
        "Logitech USB Receiver",
    );
    f.char_dev("hidraw0", 240, 0)
        .char_dev("hidraw1", 240, 1)
        // a node without sysfs entry: cannot be identified
        .char_dev("hidraw7", 240, 7)
        // other nodes the scanner must ignore
        .char_dev("hidraw", 240, 99)
        .char_dev("ttyUSB0", 188, 0);
    // not a character device
    std::fs::write(f.dev().join("hidraw9"), "").unwrap();
}

#[test]
fn python_hidraw_scans_a_fixture_exactly() {
    let f = Fixture::new();
    yubikey_and_receiver(&f);
    let out = scan(&hidraw(), &f, &["--once"]);
    let yubikey = json!({"hid.wdp.dev/id": "0003:1050:0407", "hid.wdp.dev/name": "Yubico YubiKey OTP+FIDO+CCID"});
    let receiver =
        json!({"hid.wdp.dev/id": "0003:046d:c52b", "hid.wdp.dev/name": "Logitech USB Receiver"});
    assert_eq!(
        tree(&out),
        json!({"hidraw": {
            "hidraw0": device(&["/dev/hidraw0"], json!({}), yubikey.clone()),
            "hidraw1": device(&["/dev/hidraw1"], json!({}), receiver),
            "hidraw7": device_with(&["/dev/hidraw7"], json!({}), json!({}), "Unhealthy"),
        }})
    );

    // HID_IDS keeps matching devices only; an unidentified node cannot match.
    let out = scan(&hidraw(), &f, &["--once", "--env", "HID_IDS=0003:1050:*"]);
    assert_eq!(
        tree(&out),
        json!({"hidraw": {"hidraw0": device(&["/dev/hidraw0"], json!({}), yubikey)}})
    );
    let out = scan(&hidraw(), &f, &["--once", "--env", "HID_IDS=0005:*:*"]);
    assert_eq!(tree(&out), json!({"hidraw": {}}));
}

#[test]
fn python_hidraw_bad_configuration_names_variable_value_and_what_is_valid() {
    let f = Fixture::new();
    let err = failure(&scan(
        &hidraw(),
        &f,
        &["--once", "--env", "HID_IDS=0003:1050:0407,usb:*:*"],
    ));
    assert!(err.contains("scanner hidraw failed"), "{err}");
    assert!(
        err.contains(
            "HID_IDS='0003:1050:0407,usb:*:*' is not valid: entry 2 ('usb:*:*') has bus 'usb', which is neither hex nor '*'"
        ),
        "{err}"
    );
    assert!(err.contains("e.g. 0003:1050:0407,0005:*:*"), "{err}");
    let err = failure(&scan(
        &hidraw(),
        &f,
        &["--once", "--env", "RESCAN_INTERVAL_MS=soon"],
    ));
    assert!(
        err.contains("RESCAN_INTERVAL_MS='soon' is not valid: expected an integer"),
        "{err}"
    );
}

/// The Python guest's probe mode tries what the sandbox must refuse. A loopback listener makes a
/// leaked socket observable: the connection would reach it.
#[test]
fn python_guest_cannot_open_sockets_or_read_outside_sys() {
    let f = Fixture::new();
    yubikey_and_receiver(&f);
    f.sys_dir("class/hidraw");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let out = scan(
        &hidraw(),
        &f,
        &[
            "--once",
            "--env",
            "SANDBOX_PROBE=1",
            "--env",
            &format!("PROBE_PORT={port}"),
        ],
    );
    let t = tree(&out);
    let report = t["probe"]["report"]["annotations"]
        .as_object()
        .unwrap_or_else(|| panic!("no probe report in {t}"));
    let outcome = |probe: &str| {
        report[probe]
            .as_str()
            .unwrap_or_else(|| panic!("probe {probe} missing from {report:?}"))
            .to_string()
    };
    // WASI reports a refused capability as EPERM; a path outside every preopen does not exist.
    for (probe, denial) in [
        ("socket-connect", "denied: PermissionError"),
        ("read-etc-hostname", "denied: FileNotFoundError"),
        ("read-sys-dotdot", "denied: PermissionError"),
        ("read-dev-node", "denied: FileNotFoundError"),
        ("write-sys", "denied: PermissionError"),
    ] {
        let got = outcome(probe);
        assert!(got.starts_with(denial), "{probe}: {got}");
    }
    assert_eq!(report.len(), 5, "{report:?}");
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        ErrorKind::WouldBlock,
        "the guest's connection reached the listener"
    );
    // The guest's stderr reaches the host's log, attributed to the scanner.
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("probe socket-connect: denied: PermissionError"),
        "{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_hidraw_serves_kubelet_follows_hotplug_and_allocates() {
    let f = Fixture::new();
    yubikey_and_receiver(&f);
    let component = hidraw();
    let (config, plugins) = run_config(
        &f,
        &format!(
            "  - name: hidraw
    component: {}
    namespace: hid.example.com
    env: {{ HID_IDS: '0003:*:*', RESCAN_INTERVAL_MS: 600000 }}
",
            component.display()
        ),
        &[&component],
    );
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("hid.example.com/hidraw", &["hidraw0", "hidraw1"])
        .await;

    // Hot-plug: the scanner waits in wait-for-change (the rescan interval is 10 minutes).
    hid_device(
        &f,
        "hidraw2",
        "1-4",
        "0003:00001209:00005BF0",
        "SoloKeys Solo 2",
    );
    f.char_dev("hidraw2", 240, 2);
    seen.devices("hid.example.com/hidraw", &["hidraw0", "hidraw1", "hidraw2"])
        .await;
    f.remove_dev("hidraw1");
    seen.devices("hid.example.com/hidraw", &["hidraw0", "hidraw2"])
        .await;

    let r = kubelet
        .allocate("hid.example.com/hidraw", &["hidraw2"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(nodes, [("/dev/hidraw2", "/dev/hidraw2", "rw")]);
    assert_eq!(
        sorted_envs(&c.annotations),
        BTreeMap::from([
            ("hid.wdp.dev/id", "0003:1209:5bf0"),
            ("hid.wdp.dev/name", "SoloKeys Solo 2")
        ])
    );
    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

// ---- JavaScript: sound (scanner + post-allocator) -------------------------------------------

fn sound() -> PathBuf {
    lang_guest("js", "sound")
}

fn two_sound_cards(f: &Fixture) {
    // card 0: on-board (no by-id name); card 1: a USB interface; card 2: half-created (no control)
    for (i, node) in [
        "controlC0",
        "pcmC0D0p",
        "pcmC0D0c",
        "hwC0D0",
        "controlC1",
        "pcmC1D0p",
        "pcmC1D0c",
        "midiC1D0",
        "pcmC2D0p",
    ]
    .iter()
    .enumerate()
    {
        f.char_dev(&format!("snd/{node}"), 116, i as u32 + 2);
    }
    f.char_dev("snd/timer", 116, 33)
        .char_dev("snd/seq", 116, 1)
        .dev_link(
            "snd/by-id/usb-Focusrite_Scarlett_2i2_USB-00",
            "../controlC1",
        )
        .dev_link("snd/by-path/pci-0000:00:1f.3", "../controlC0");
}

#[test]
fn js_sound_scans_a_fixture_exactly() {
    let f = Fixture::new();
    two_sound_cards(&f);
    let card0 = |extra: &[&str]| {
        let mut nodes = vec![
            "/dev/snd/controlC0",
            "/dev/snd/hwC0D0",
            "/dev/snd/pcmC0D0c",
            "/dev/snd/pcmC0D0p",
            "/dev/snd/timer",
        ];
        nodes.extend(extra);
        device(&nodes, json!({"ALSA_CARD": "0"}), json!({}))
    };
    let card1 = |extra: &[&str]| {
        let mut nodes = vec![
            "/dev/snd/controlC1",
            "/dev/snd/midiC1D0",
            "/dev/snd/pcmC1D0c",
            "/dev/snd/pcmC1D0p",
            "/dev/snd/timer",
        ];
        nodes.extend(extra);
        device(
            &nodes,
            json!({"ALSA_CARD": "1"}),
            json!({"sound.wdp.dev/card1": "usb-Focusrite_Scarlett_2i2_USB-00"}),
        )
    };
    let out = scan(&sound(), &f, &["--once"]);
    assert_eq!(
        tree(&out),
        json!({"sound": {"card0": card0(&[]), "card1": card1(&[])}})
    );

    let out = scan(
        &sound(),
        &f,
        &[
            "--once",
            "--env",
            "SOUND_MATCH=Scarlett",
            "--env",
            "SOUND_SEQUENCER=true",
        ],
    );
    assert_eq!(
        tree(&out),
        json!({"sound": {"card1": card1(&["/dev/snd/seq"])}})
    );

    // No /dev/snd at all: the type is served with no devices.
    let empty = Fixture::new();
    assert_eq!(
        tree(&scan(&sound(), &empty, &["--once"])),
        json!({"sound": {}})
    );
}

#[test]
fn js_sound_bad_configuration_names_variable_value_and_what_is_valid() {
    let f = Fixture::new();
    let err = failure(&scan(
        &sound(),
        &f,
        &["--once", "--env", "SOUND_SEQUENCER=yes"],
    ));
    assert!(err.contains("scanner sound failed"), "{err}");
    assert!(
        err.contains("SOUND_SEQUENCER=\"yes\" is not valid: expected true or false"),
        "{err}"
    );
    let err = failure(&scan(
        &sound(),
        &f,
        &["--once", "--env", "SOUND_MATCH=Focusrite,,x"],
    ));
    assert!(
        err.contains("SOUND_MATCH=\"Focusrite,,x\" is not valid: entry 2 (\"\") is empty"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn js_sound_serves_kubelet_and_its_post_allocator_picks_the_default_card() {
    let f = Fixture::new();
    two_sound_cards(&f);
    let component = sound();
    let (config, plugins) = run_config(
        &f,
        &format!(
            "  - name: sound
    component: {c}
    post-allocator: {c}
    namespace: sound.example.com
    env: {{ RESCAN_INTERVAL_MS: 600000 }}
",
            c = component.display()
        ),
        &[&component],
    );
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("sound.example.com/sound", &["card0", "card1"])
        .await;

    // Hot-plug: card 2's control node appears; it becomes a device.
    f.char_dev("snd/controlC2", 116, 40);
    seen.devices("sound.example.com/sound", &["card0", "card1", "card2"])
        .await;

    // Kubelet's order is card1, card0. The host's default answer keeps the last device's
    // ALSA_CARD (0); the hook makes the first one the container's default card.
    let r = kubelet
        .allocate("sound.example.com/sound", &["card1", "card0"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    assert_eq!(
        sorted_envs(&c.envs),
        BTreeMap::from([("ALSA_CARD", "1"), ("SOUND_CARDS", "1,0")])
    );
    let nodes: Vec<_> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(
        nodes,
        [
            "/dev/snd/controlC1",
            "/dev/snd/midiC1D0",
            "/dev/snd/pcmC1D0c",
            "/dev/snd/pcmC1D0p",
            "/dev/snd/timer",
            "/dev/snd/controlC0",
            "/dev/snd/hwC0D0",
            "/dev/snd/pcmC0D0c",
            "/dev/snd/pcmC0D0p",
        ]
    );
    assert_eq!(
        sorted_envs(&c.annotations),
        BTreeMap::from([("sound.wdp.dev/card1", "usb-Focusrite_Scarlett_2i2_USB-00")])
    );

    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

// ---- C: v4l ---------------------------------------------------------------------------------

fn v4l() -> PathBuf {
    lang_guest("c", "v4l")
}

/// A USB camera on port `port` with nodes `videoN` for each of `numbers` (index 0, 1, ...), as
/// sysfs shows it: the nodes under the USB interface, each with `name`, `index` and a `device`
/// link to the interface, and linked from class/video4linux.
fn usb_camera(f: &Fixture, port: &str, numbers: &[u32], name: &str) {
    let interface = format!("devices/pci0000:00/0000:00:14.0/usb1/{port}/{port}:1.0");
    for (index, n) in numbers.iter().enumerate() {
        let node = format!("{interface}/video4linux/video{n}");
        f.sys_file(&format!("{node}/name"), &format!("{name}\n"))
            .sys_file(&format!("{node}/index"), &format!("{index}\n"))
            .sys_link(&format!("{node}/device"), &format!("../../../{port}:1.0"))
            .sys_link(
                &format!("class/video4linux/video{n}"),
                &format!("../../{node}"),
            );
    }
}

fn cameras(f: &Fixture) {
    usb_camera(f, "1-6", &[0, 1], "Integrated Camera: Integrated C");
    // v4l2loopback: a virtual device, no parent
    f.sys_file(
        "devices/virtual/video4linux/video3/name",
        "Dummy video device (0x0000)\n",
    )
    .sys_file("devices/virtual/video4linux/video3/index", "0\n")
    .sys_link(
        "class/video4linux/video3",
        "../../devices/virtual/video4linux/video3",
    )
    // in sysfs, but udev has not made its node yet
    .sys_file("devices/virtual/video4linux/video5/name", "Late\n")
    .sys_link(
        "class/video4linux/video5",
        "../../devices/virtual/video4linux/video5",
    );
    f.char_dev("video0", 81, 0)
        .char_dev("video1", 81, 1)
        .char_dev("video3", 81, 3)
        // a node without sysfs entry is no V4L device
        .char_dev("video9", 81, 9);
}

#[test]
fn c_v4l_scans_a_fixture_exactly() {
    let f = Fixture::new();
    cameras(&f);
    let camera = device(&["/dev/video0", "/dev/video1"], json!({}), json!({}));
    let dummy = device(&["/dev/video3"], json!({}), json!({}));
    let out = scan(&v4l(), &f, &["--once"]);
    assert_eq!(
        tree(&out),
        json!({"video": {"1-6:1.0": camera.clone(), "video3": dummy}})
    );
    let out = scan(
        &v4l(),
        &f,
        &["--once", "--env", "V4L_NAMES=Webcam, Integrated"],
    );
    assert_eq!(tree(&out), json!({"video": {"1-6:1.0": camera}}));
    // No /sys/class/video4linux (videodev not loaded): the type is served with no devices.
    let empty = Fixture::new();
    assert_eq!(
        tree(&scan(&v4l(), &empty, &["--once"])),
        json!({"video": {}})
    );
}

#[test]
fn c_v4l_bad_configuration_names_variable_value_and_what_is_valid() {
    let f = Fixture::new();
    let err = failure(&scan(&v4l(), &f, &["--once", "--env", "V4L_NAMES=C920,"]));
    assert!(err.contains("scanner v4l failed"), "{err}");
    assert!(
        err.contains("V4L_NAMES=\"C920,\" is not valid: entry 2 (\"\") is empty; expected a comma-separated list of parts of device names"),
        "{err}"
    );
    let err = failure(&scan(
        &v4l(),
        &f,
        &["--once", "--env", "RESCAN_INTERVAL_MS=0"],
    ));
    assert!(
        err.contains("RESCAN_INTERVAL_MS=\"0\" is not valid: expected an integer from 1 to 4294967295 (default 30000)"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_v4l_serves_kubelet_follows_hotplug_and_allocates() {
    let f = Fixture::new();
    cameras(&f);
    let component = v4l();
    let (config, plugins) = run_config(
        &f,
        &format!(
            "  - name: v4l
    component: {}
    namespace: video.example.com
    env: {{ RESCAN_INTERVAL_MS: 600000 }}
",
            component.display()
        ),
        &[&component],
    );
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("video.example.com/video", &["1-6:1.0", "video3"])
        .await;

    // A second camera: sysfs first, then udev makes its nodes; it becomes one device.
    usb_camera(&f, "1-7", &[6, 7], "HD Pro Webcam C920");
    f.char_dev("video6", 81, 6).char_dev("video7", 81, 7);
    seen.devices("video.example.com/video", &["1-6:1.0", "1-7:1.0", "video3"])
        .await;
    // The late node appears.
    f.char_dev("video5", 81, 5);
    seen.devices(
        "video.example.com/video",
        &["1-6:1.0", "1-7:1.0", "video3", "video5"],
    )
    .await;

    let r = kubelet
        .allocate("video.example.com/video", &["1-7:1.0"])
        .await
        .unwrap();
    let nodes = wdp_tests::node_specs(&r.container_responses[0]);
    assert_eq!(
        nodes,
        [
            ("/dev/video6", "/dev/video6", "rw"),
            ("/dev/video7", "/dev/video7", "rw")
        ]
    );
    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

// ---- the artefacts themselves -------------------------------------------------------------

/// Each component implements the world it claims, and none imports wasi:http: componentize-js
/// adds it unless built with `-d http fetch-event`, and the host provides none (a component that
/// imports it cannot be instantiated; trapping stubs would only hide that).
#[test]
fn components_implement_their_worlds_and_import_no_http() {
    for (component, world) in [
        (hidraw(), "world:    scanner\n"),
        (sound(), "world:    scanner and hooks"),
        (v4l(), "world:    scanner\n"),
    ] {
        let out = wdp(&["inspect", &component.display().to_string()]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(world), "{}: {text}", component.display());
        assert!(text.contains("wdp:device-plugin/devfs@0.1.2"), "{text}");
        assert!(
            !text.contains("wasi:http"),
            "{}: {text}",
            component.display()
        );
    }
}

#[test]
#[should_panic(expected = "`make guests` builds it")]
fn a_missing_language_guest_says_how_to_build_it() {
    lang_guest("python", "no-such-guest");
}
