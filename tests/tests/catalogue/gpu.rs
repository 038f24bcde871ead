//! `gpu`: Intel GPUs as Intel's GPU plugin serves them (`gpu.intel.com/i915`, `gpu.intel.com/xe`),
//! over a machine with an integrated GPU on i915, a discrete GPU on xe with its MEI (GSC)
//! device, and an AMD GPU; DRM nodes, udev by-path links and class links as the kernel and udev
//! make them.

use serde_json::{Value, json};
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::serve;

use super::common::{ids, ids_of, scan_allowing, scan_once_allowing};

/// The DRM major (`/proc/devices`: 226 drm).
const DRM_MAJOR: u32 = 226;
/// The dynamic major the kernel gave "mei".
const MEI_MAJOR: u32 = 239;
/// What a container may mount from the GPU scanner: the by-path links.
const ALLOW_BYPATH: &str = "/dev/dri/by-path";

/// `(address, vendor, device id, driver, card minor)`; the render node's minor is 128 + card's.
const GPUS: [(&str, &str, &str, &str, u32); 3] = [
    // Raptor Lake-P integrated graphics.
    ("0000:00:02.0", "0x8086", "0xa7a0", "i915", 0),
    // Arc B580 (Battlemage), xe by default.
    ("0000:03:00.0", "0x8086", "0xe20b", "xe", 1),
    // Radeon RX 6900 XT.
    ("0000:04:00.0", "0x1002", "0x73bf", "amdgpu", 2),
];

/// One DRM device `name` (`card0`, `renderD128`) of the PCI function at `dir`: its sysfs
/// directory with `dev` and the `device` link back to the function, the class link, the
/// `/sys/dev/char` link, and the node in /dev/dri.
fn drm_node(f: &Fixture, dir: &str, bdf: &str, name: &str, minor: u32) {
    let node_dir = format!("{dir}/drm/{name}");
    f.sys_file(
        &format!("{node_dir}/dev"),
        &format!("{DRM_MAJOR}:{minor}\n"),
    );
    f.sys_link(&format!("{node_dir}/device"), &format!("../../../{bdf}"));
    f.sys_link(&format!("class/drm/{name}"), &format!("../../{node_dir}"));
    f.sys_link(
        &format!("dev/char/{DRM_MAJOR}:{minor}"),
        &format!("../../{node_dir}"),
    );
    f.char_dev(&format!("dri/{name}"), DRM_MAJOR, minor);
}

/// The GPU at `bdf` with card minor `n`: PCI function, driver, card and render nodes, by-path
/// links (udev's `pci-<BDF>-card` and `-render`).
fn gpu(f: &Fixture, bdf: &str, vendor: &str, id: &str, driver: &str, n: u32) -> String {
    let dir = f.pci_device(
        bdf,
        &[
            ("vendor", vendor),
            ("device", id),
            ("class", "0x030000"),
            ("numa_node", "-1"),
        ],
    );
    f.pci_bind(bdf, driver);
    drm_node(f, &dir, bdf, &format!("card{n}"), n);
    drm_node(f, &dir, bdf, &format!("renderD{}", 128 + n), 128 + n);
    f.dev_link(
        &format!("dri/by-path/pci-{bdf}-card"),
        &format!("../card{n}"),
    );
    f.dev_link(
        &format!("dri/by-path/pci-{bdf}-render"),
        &format!("../renderD{}", 128 + n),
    );
    dir
}

pub(crate) fn machine(f: &Fixture) {
    f.sys_file("class/drm/version", "drm 1.1.0 20060810\n");
    for (bdf, vendor, id, driver, n) in GPUS {
        let dir = gpu(f, bdf, vendor, id, driver, n);
        if driver == "i915" {
            // SR-IOV capable, no VFs enabled; and the legacy control node older kernels made.
            f.sys_file(&format!("{dir}/sriov_numvfs"), "0\n");
            drm_node(f, &dir, bdf, "controlD64", 64);
        }
        if driver == "xe" {
            // The graphics security controller's MEI device (`/dev/mei0`).
            let mei = format!("{dir}/xe.mei-gscfi.768/mei/mei0");
            f.sys_file(&format!("{mei}/dev"), &format!("{MEI_MAJOR}:0\n"));
            f.sys_link(
                "class/mei/mei0",
                "../../devices/pci0000:00/0000:03:00.0/xe.mei-gscfi.768/mei/mei0",
            );
            f.char_dev("mei0", MEI_MAJOR, 0);
        }
    }
}

/// `wdp scan --once` of the gpu scanner with by-path mounts allowed (as the config would).
fn scan_gpu(f: &Fixture, env: &[&str]) -> std::process::Output {
    scan_allowing("gpu", f, env, &[ALLOW_BYPATH])
}

/// [`scan_gpu`], failing the test unless it gives one tree.
fn scan_ok(f: &Fixture, env: &[&str]) -> Value {
    scan_once_allowing("gpu", f, env, &[ALLOW_BYPATH])
}

fn node(path: &str) -> Value {
    json!({"container_path": path, "host_path": path, "permissions": "rw"})
}

fn ro_mount(path: &str) -> Value {
    json!({"container_path": path, "host_path": path, "read_only": true})
}

fn host_paths(list: &Value) -> Vec<String> {
    list.as_array()
        .expect("a list")
        .iter()
        .map(|n| n["host_path"].as_str().expect("host_path").to_string())
        .collect()
}

#[test]
fn intel_gpus_are_served_per_driver_with_their_nodes_and_bypath_links() {
    let f = Fixture::new();
    machine(&f);
    // By default no by-path mounts: the host's default policy allows none.
    let defaults = scan_ok(&f, &[]);
    assert_eq!(defaults["i915"]["card0-0"]["mounts"], json!([]));
    let tree = scan_ok(&f, &["BYPATH=single"]);
    // The AMD GPU is not Intel's; controlD64 is never given; one device per GPU by default.
    assert_eq!(
        ids(&tree),
        ids_of(&[("i915", &["card0-0"]), ("xe", &["card1-0"])])
    );
    let mut card0 = tree["i915"]["card0-0"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    card0.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        card0,
        json!({
            "health": "Healthy",
            "nodes": [node("/dev/dri/card0"), node("/dev/dri/renderD128")],
            "mounts": [
                ro_mount("/dev/dri/by-path/pci-0000:00:02.0-card"),
                ro_mount("/dev/dri/by-path/pci-0000:00:02.0-render"),
            ],
            "envs": {},
            "annotations": {},
            "cdi_devices": []
        })
    );
    assert_eq!(
        host_paths(&tree["xe"]["card1-0"]["mounts"]),
        [
            "/dev/dri/by-path/pci-0000:03:00.0-card",
            "/dev/dri/by-path/pci-0000:03:00.0-render"
        ]
    );
}

#[test]
fn options_share_filter_mount_and_monitor() {
    let f = Fixture::new();
    machine(&f);

    let tree = scan_ok(&f, &["SHARED_DEV_NUM=3"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("i915", &["card0-0", "card0-1", "card0-2"]),
            ("xe", &["card1-0", "card1-1", "card1-2"])
        ])
    );
    assert_eq!(
        tree["xe"]["card1-2"], tree["xe"]["card1-0"],
        "one description"
    );

    // Allow and deny lists hold PCI device ids, matched against the first line of `device`.
    let tree = scan_ok(&f, &["ALLOW_IDS=0xe20b,0x56a0"]);
    assert_eq!(ids(&tree), ids_of(&[("xe", &["card1-0"])]));
    let tree = scan_ok(&f, &["DENY_IDS=0xe20b"]);
    assert_eq!(ids(&tree), ids_of(&[("i915", &["card0-0"])]));

    let tree = scan_ok(&f, &["BYPATH=all"]);
    assert_eq!(
        tree["i915"]["card0-0"]["mounts"],
        json!([ro_mount("/dev/dri/by-path")])
    );
    let tree = scan_ok(&f, &["BYPATH=none"]);
    assert_eq!(tree["xe"]["card1-0"]["mounts"], json!([]));

    // Monitoring: one device holding every Intel GPU's nodes and the MEI node.
    let tree = scan_ok(&f, &["ENABLE_MONITORING=true"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("i915", &["card0-0"]),
            ("monitoring", &["all"]),
            ("xe", &["card1-0"])
        ])
    );
    assert_eq!(
        host_paths(&tree["monitoring"]["all"]["nodes"]),
        [
            "/dev/dri/card0",
            "/dev/dri/renderD128",
            "/dev/dri/card1",
            "/dev/dri/renderD129",
            "/dev/mei0"
        ]
    );
    assert_eq!(tree["monitoring"]["all"]["mounts"], json!([]));
    let tree = scan_ok(&f, &["ENABLE_MONITORING=true", "MONITORING_MODE=split"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("i915", &["card0-0"]),
            ("i915_monitoring", &["all"]),
            ("xe", &["card1-0"]),
            ("xe_monitoring", &["all"])
        ])
    );
    assert_eq!(
        host_paths(&tree["xe_monitoring"]["all"]["nodes"]),
        ["/dev/dri/card1", "/dev/dri/renderD129", "/dev/mei0"]
    );

    let bad: [(&[&str], &str); 5] = [
        (&["SHARED_DEV_NUM=0"], "SHARED_DEV_NUM=\"0\" is not valid"),
        (&["ALLOW_IDS=e20b"], "ALLOW_IDS=\"e20b\" is not valid"),
        (
            &["ALLOW_IDS=0xe20b", "DENY_IDS=0xa7a0"],
            "ALLOW_IDS=\"0xe20b\" and DENY_IDS=\"0xa7a0\" are both set",
        ),
        (&["BYPATH=some"], "BYPATH=\"some\" is not valid"),
        (
            &["MONITORING_MODE=both"],
            "MONITORING_MODE=\"both\" is not valid",
        ),
    ];
    for (env, want) in bad {
        let out = scan_gpu(&f, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} must fail");
        assert!(stderr.contains(want), "{env:?}: {stderr}");
    }
}

#[test]
fn a_pf_with_vfs_gives_way_to_its_vfs() {
    let f = Fixture::new();
    machine(&f);
    // Two VFs enabled on the integrated GPU: the PF is no longer advertised, its VFs are (they
    // are GPUs of their own, card3 and card4, on i915; a VF has no sriov_numvfs).
    f.sys_file("devices/pci0000:00/0000:00:02.0/sriov_numvfs", "2\n");
    for (bdf, n) in [("0000:00:02.1", 3), ("0000:00:02.2", 4)] {
        gpu(&f, bdf, "0x8086", "0xa7a0", "i915", n);
    }
    let tree = scan_ok(&f, &["BYPATH=single"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("i915", &["card3-0", "card4-0"]), ("xe", &["card1-0"])])
    );
    assert_eq!(
        host_paths(&tree["i915"]["card4-0"]["mounts"]),
        [
            "/dev/dri/by-path/pci-0000:00:02.2-card",
            "/dev/dri/by-path/pci-0000:00:02.2-render"
        ]
    );
}

/// A `wdp run` config serving the gpu scanner with by-path mounts allowed.
fn config(f: &Fixture, env: &str) -> std::path::PathBuf {
    f.write_config(&format!(
            "scanners:\n  - name: gpu\n    component: {}\n    namespace: gpu.intel.com\n    env: {{ RESCAN_INTERVAL_MS: 600000{env} }}\n    policy: {{ allowed-mounts: [{ALLOW_BYPATH}] }}\n",
            guest("gpu").display()
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_gives_the_gpu_nodes_and_its_bypath_links() {
    let f = Fixture::new();
    machine(&f);
    let config = config(&f, ", BYPATH: single, SHARED_DEV_NUM: 2");
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("gpu.intel.com/i915", &["card0-0", "card0-1"])
        .await;
    seen.devices("gpu.intel.com/xe", &["card1-0", "card1-1"])
        .await;

    let r = kubelet
        .allocate("gpu.intel.com/xe", &["card1-1"])
        .await
        .unwrap();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(
        nodes,
        [
            ("/dev/dri/card1", "/dev/dri/card1", "rw"),
            ("/dev/dri/renderD129", "/dev/dri/renderD129", "rw")
        ]
    );
    let mounts: Vec<(&str, &str, bool)> = c
        .mounts
        .iter()
        .map(|m| (m.host_path.as_str(), m.container_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "/dev/dri/by-path/pci-0000:03:00.0-card",
                "/dev/dri/by-path/pci-0000:03:00.0-card",
                true
            ),
            (
                "/dev/dri/by-path/pci-0000:03:00.0-render",
                "/dev/dri/by-path/pci-0000:03:00.0-render",
                true
            )
        ]
    );
    assert!(c.envs.is_empty() && c.annotations.is_empty());

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbinding_the_driver_turns_the_gpu_unhealthy_until_it_returns() {
    let f = Fixture::new();
    machine(&f);
    let config = config(&f, "");
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let xe = "gpu.intel.com/xe";
    seen.devices(xe, &["card1-0"]).await;

    // Unbinding xe removes what the driver registered: the DRM devices (class links and
    // directories) and, through devtmpfs and udev, the nodes and by-path links. The /dev changes
    // wake the scanner (the rescan interval is ten minutes).
    let dir = "devices/pci0000:00/0000:03:00.0";
    f.pci_unbind("0000:03:00.0");
    for (name, minor) in [("card1", 1), ("renderD129", 129)] {
        std::fs::remove_file(f.sys().join(format!("class/drm/{name}"))).unwrap();
        std::fs::remove_file(f.sys().join(format!("dev/char/{DRM_MAJOR}:{minor}"))).unwrap();
        f.remove_dev(&format!("dri/{name}"));
    }
    std::fs::remove_dir_all(f.sys().join(format!("{dir}/drm"))).unwrap();
    f.remove_dev("dri/by-path/pci-0000:03:00.0-card")
        .remove_dev("dri/by-path/pci-0000:03:00.0-render");
    seen.health(xe, "card1-0", "Unhealthy").await;
    seen.health("gpu.intel.com/i915", "card0-0", "Healthy")
        .await;

    // Rebinding brings it all back: the same device, Healthy again.
    f.pci_bind("0000:03:00.0", "xe");
    drm_node(&f, dir, "0000:03:00.0", "card1", 1);
    drm_node(&f, dir, "0000:03:00.0", "renderD129", 129);
    f.dev_link("dri/by-path/pci-0000:03:00.0-card", "../card1")
        .dev_link("dri/by-path/pci-0000:03:00.0-render", "../renderD129");
    seen.health(xe, "card1-0", "Healthy").await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
