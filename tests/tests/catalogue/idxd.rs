//! `idxd`: DSA and IAA work queues, as Intel's `pkg/idxd` serves them for `cmd/dsa_plugin`
//! (`dsa.intel.com/wq-<type>-<mode>`) and `cmd/iaa_plugin` (`iaa.intel.com/...`), over a
//! Sapphire Rapids-like machine laid out as the kernel lays it out: `dsa0`/`dsa2`/`iax1` below
//! their PCI functions with their `wq<dev>.<n>` directories, every one linked from
//! `/sys/bus/dsa/devices`, enabled user queues with a `/dev/<dsa|iax>/<wq>` node and the
//! `/dev/char/<major>:<minor>` link udev makes to it.

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, ids_of, one_scanner_config, scan, scan_once};

/// Dynamic majors of the idxd char devices, one region per device type.
const DSA_MAJOR: u32 = 236;
const IAX_MAJOR: u32 = 235;

/// One work queue: (device, PCI function, queue, state, mode, type, minor of its node).
type Queue = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    u32,
);

#[rustfmt::skip]
const QUEUES: [Queue; 7] = [
    ("dsa0", "0000:6a:01.0", "wq0.0", "enabled", "dedicated", "user", 0),
    ("dsa0", "0000:6a:01.0", "wq0.1", "enabled", "shared", "user", 1),
    // Disabled: the kernel has no node for it.
    ("dsa0", "0000:6a:01.0", "wq0.2", "disabled", "shared", "user", 2),
    // A kernel queue: served without nodes, as upstream does.
    ("dsa0", "0000:6a:01.0", "wq0.3", "enabled", "dedicated", "kernel", 3),
    ("dsa2", "0000:6f:01.0", "wq2.0", "enabled", "shared", "user", 4),
    ("iax1", "0000:6a:02.0", "wq1.0", "enabled", "shared", "user", 0),
    ("iax1", "0000:6a:02.0", "wq1.1", "enabled", "dedicated", "user", 1),
];

/// The sysfs directory of an idxd device below its PCI function (root bus = the bus number).
fn dev_dir(dev: &str, bdf: &str) -> String {
    format!("devices/pci0000:{}/{bdf}/{dev}", &bdf[5..7])
}

pub(crate) fn machine(f: &Fixture) {
    for (dev, bdf, id) in [
        ("dsa0", "0000:6a:01.0", "0x0b25"),
        ("iax1", "0000:6a:02.0", "0x0cfe"),
        ("dsa2", "0000:6f:01.0", "0x0b25"),
    ] {
        let dir = dev_dir(dev, bdf);
        let pci = dir.rsplit_once('/').map(|(p, _)| p.to_string()).unwrap();
        f.sys_file(&format!("{pci}/vendor"), "0x8086\n")
            .sys_file(&format!("{pci}/device"), &format!("{id}\n"))
            .sys_link(
                &format!("bus/pci/devices/{bdf}"),
                &format!("../../../{pci}"),
            )
            .sys_file(&format!("{dir}/state"), "enabled\n")
            .sys_link(
                &format!("bus/dsa/devices/{dev}"),
                &format!("../../../{dir}"),
            );
    }
    for (dev, bdf, wq, state, mode, ty, minor) in QUEUES {
        let wq_dir = format!("{}/{wq}", dev_dir(dev, bdf));
        f.sys_file(&format!("{wq_dir}/state"), &format!("{state}\n"))
            .sys_file(&format!("{wq_dir}/mode"), &format!("{mode}\n"))
            .sys_file(&format!("{wq_dir}/type"), &format!("{ty}\n"))
            .sys_file(&format!("{wq_dir}/size"), "16\n")
            .sys_link(
                &format!("bus/dsa/devices/{wq}"),
                &format!("../../../{wq_dir}"),
            );
        if state == "enabled" && ty == "user" {
            enable_node(f, dev, wq, minor);
        }
    }
}

/// What the kernel and udev add when a user queue is enabled: the node and its char link.
fn enable_node(f: &Fixture, dev: &str, wq: &str, minor: u32) {
    let class = &dev[..3];
    let major = if class == "dsa" { DSA_MAJOR } else { IAX_MAJOR };
    f.char_dev(&format!("{class}/{wq}"), major, minor).dev_link(
        &format!("char/{major}:{minor}"),
        &format!("../{class}/{wq}"),
    );
}

#[test]
fn enabled_queues_by_type_and_mode() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("idxd", &f, &["IDXD_DEVICE=dsa"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("wq-kernel-dedicated", &["wq-kernel-dedicated-wq0.3-0"]),
            ("wq-user-dedicated", &["wq-user-dedicated-wq0.0-0"]),
            (
                "wq-user-shared",
                &["wq-user-shared-wq0.1-0", "wq-user-shared-wq2.0-0"]
            ),
        ])
    );
    let mut dev = tree["wq-user-shared"]["wq-user-shared-wq2.0-0"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    dev.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        dev,
        json!({
            "health": "Healthy",
            "nodes": [
                {"container_path": "/dev/dsa/wq2.0", "host_path": "/dev/dsa/wq2.0", "permissions": "rw"},
                {"container_path": "/dev/char/236:4", "host_path": "/dev/char/236:4", "permissions": "rw"}
            ],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "cdi_devices": []
        })
    );
    assert_eq!(
        tree["wq-kernel-dedicated"]["wq-kernel-dedicated-wq0.3-0"]["nodes"],
        json!([])
    );
}

#[test]
fn iaa_queues_and_sharing() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("idxd", &f, &["IDXD_DEVICE=iax", "SHARED_DEV_NUM=3"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("wq-user-dedicated", &["wq-user-dedicated-wq1.1-0"]),
            (
                "wq-user-shared",
                &[
                    "wq-user-shared-wq1.0-0",
                    "wq-user-shared-wq1.0-1",
                    "wq-user-shared-wq1.0-2"
                ]
            ),
        ])
    );
    assert_eq!(
        tree["wq-user-dedicated"]["wq-user-dedicated-wq1.1-0"]["nodes"][1]["host_path"],
        "/dev/char/235:1"
    );

    // A wrong /dev/char link leaves the queue out, as upstream refuses it.
    f.remove_dev("char/235:1");
    f.dev_link("char/235:1", "../iax/wq1.0");
    let tree = scan_once("idxd", &f, &["IDXD_DEVICE=iax"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("wq-user-shared", &["wq-user-shared-wq1.0-0"])])
    );

    for (envs, start) in [
        (&[][..], "IDXD_DEVICE is not set"),
        (&["IDXD_DEVICE=iaa"][..], "IDXD_DEVICE=\"iaa\" is not valid"),
        (
            &["IDXD_DEVICE=dsa", "SHARED_DEV_NUM=0"][..],
            "SHARED_DEV_NUM=\"0\" is not valid",
        ),
    ] {
        let out = scan("idxd", &f, envs);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{envs:?} must fail");
        assert!(stderr.contains(start), "{envs:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_queue_turns_unhealthy_and_allocate_gives_its_nodes() {
    let f = Fixture::new();
    machine(&f);
    let config = one_scanner_config(
        &f,
        "idxd",
        "dsa.intel.com",
        &[
            "IDXD_DEVICE: dsa",
            "SHARED_DEV_NUM: 2",
            "RESCAN_INTERVAL_MS: 600000",
        ],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let shared = "dsa.intel.com/wq-user-shared";
    seen.devices(
        shared,
        &[
            "wq-user-shared-wq0.1-0",
            "wq-user-shared-wq0.1-1",
            "wq-user-shared-wq2.0-0",
            "wq-user-shared-wq2.0-1",
        ],
    )
    .await;
    seen.devices(
        "dsa.intel.com/wq-user-dedicated",
        &["wq-user-dedicated-wq0.0-0"],
    )
    .await;

    let r = kubelet
        .allocate(shared, &["wq-user-shared-wq0.1-1"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    assert_eq!(
        nodes,
        [
            ("/dev/dsa/wq0.1", "/dev/dsa/wq0.1", "rw"),
            ("/dev/char/236:1", "/dev/char/236:1", "rw")
        ]
    );
    assert!(c.envs.is_empty() && c.mounts.is_empty() && c.annotations.is_empty());

    // Disabling the queue: the kernel drops its node, udev its link (a /dev change).
    f.sys_file(
        "devices/pci0000:6f/0000:6f:01.0/dsa2/wq2.0/state",
        "disabled\n",
    );
    f.remove_dev("char/236:4").remove_dev("dsa/wq2.0");
    seen.health(shared, "wq-user-shared-wq2.0-0", "Unhealthy")
        .await;
    seen.health(shared, "wq-user-shared-wq2.0-1", "Unhealthy")
        .await;
    seen.health(shared, "wq-user-shared-wq0.1-0", "Healthy")
        .await;
    let e = kubelet
        .allocate(shared, &["wq-user-shared-wq2.0-0"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");

    f.sys_file(
        "devices/pci0000:6f/0000:6f:01.0/dsa2/wq2.0/state",
        "enabled\n",
    );
    enable_node(&f, "dsa2", "wq2.0", 4);
    seen.health(shared, "wq-user-shared-wq2.0-0", "Healthy")
        .await;
    seen.health(shared, "wq-user-shared-wq2.0-1", "Healthy")
        .await;

    // Switching wq0.1 to dedicated (disable, write mode, enable): its devices move to the
    // dedicated type and leave no Unhealthy copies in the shared one.
    let wq = "devices/pci0000:6a/0000:6a:01.0/dsa0/wq0.1";
    f.sys_file(&format!("{wq}/state"), "disabled\n");
    f.remove_dev("char/236:1").remove_dev("dsa/wq0.1");
    f.sys_file(&format!("{wq}/mode"), "dedicated\n")
        .sys_file(&format!("{wq}/state"), "enabled\n");
    enable_node(&f, "dsa0", "wq0.1", 1);
    seen.devices(
        "dsa.intel.com/wq-user-dedicated",
        &["wq-user-dedicated-wq0.0-0", "wq-user-dedicated-wq0.1-0"],
    )
    .await;
    seen.devices(
        shared,
        &["wq-user-shared-wq2.0-0", "wq-user-shared-wq2.0-1"],
    )
    .await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
