//! What the host adds to every scanner's tree: NUMA affinity derived from sysfs where the guest
//! gave none (Intel's `pkg/topology` walk), and CDI spec files with the CDI names Allocate
//! returns. The `generic` scanner stands in for any scanner: it never sets either itself.

use serde_json::{Value, json};
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::serve;

use super::common::scan_once;

pub(crate) const DEVICES: &str = r#"[{"name":"gpu","groups":[{"paths":[{"path":"/dev/dri/card*"}]}]},{"name":"vfio","groups":[{"paths":[{"path":"/dev/vfio/1*"}]}]}]"#;

/// Three GPUs and a VFIO group on a two-node machine, linked as the kernel links them:
/// `/sys/dev/char/MAJ:MIN` -> the device's directory below its PCI function, whose `numa_node`
/// and `local_cpulist` give the affinity; `/dev/vfio/12` -> `devices/virtual/vfio/12`, whose
/// IOMMU group holds a function on node 1.
pub(crate) fn two_node_machine(f: &Fixture) {
    let gpus = [
        ("0000:00:02.0", "0", "0-3", 0),
        ("0000:00:03.0", "1", "4-7", 1),
        // -1: the firmware gives no affinity.
        ("0000:00:05.0", "-1", "0-7", 2),
    ];
    for (bdf, numa, cpus, n) in gpus {
        let dir = f.pci_device(
            bdf,
            &[
                ("vendor", "0x8086"),
                ("numa_node", numa),
                ("local_cpulist", cpus),
            ],
        );
        f.sys_dir(&format!("{dir}/drm/card{n}"));
        f.sys_link(
            &format!("dev/char/226:{n}"),
            &format!("../../{dir}/drm/card{n}"),
        );
        f.char_dev(&format!("dri/card{n}"), 226, n);
    }
    f.pci_device(
        "0000:00:04.0",
        &[("numa_node", "1"), ("local_cpulist", "4-7")],
    );
    f.pci_iommu_group("0000:00:04.0", "12");
    f.sys_dir("devices/virtual/vfio/12");
    f.sys_link("dev/char/243:12", "../../devices/virtual/vfio/12");
    f.char_dev("vfio/12", 243, 12);
}

#[test]
fn numa_nodes_are_derived_from_sysfs_when_the_guest_gives_none() {
    let f = Fixture::new();
    two_node_machine(&f);
    let tree = scan_once("generic", &f, &[&format!("DEVICES={DEVICES}")]);
    let numa = |t: &str, id: &str| tree[t][id]["numa_nodes"].clone();
    assert_eq!(numa("gpu", "dri_card0"), json!([0]));
    assert_eq!(numa("gpu", "dri_card1"), json!([1]));
    assert_eq!(numa("gpu", "dri_card2"), Value::Null, "numa_node -1");
    assert_eq!(
        numa("vfio", "vfio_12"),
        json!([1]),
        "through the IOMMU group"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_specs_follow_the_devices_and_allocate_names_them() {
    let f = Fixture::new();
    two_node_machine(&f);
    let cdi_dir = f.path().join("cdi");
    let config = f.write_config(&format!(
            "scanners:\n  - name: gpu\n    component: {}\n    namespace: gpu.example.com\n    env:\n      RESCAN_INTERVAL_MS: 600000\n      DEVICES: '{DEVICES}'\n    cdi: {{ dir: {} }}\n",
            guest("generic").display(),
            cdi_dir.display()
        ),
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let gpu = "gpu.example.com/gpu";
    seen.devices(gpu, &["dri_card0", "dri_card1", "dri_card2"])
        .await;
    assert_eq!(
        seen.numa(gpu, "dri_card1"),
        Some(vec![1]),
        "kubelet gets the topology"
    );
    assert_eq!(seen.numa(gpu, "dri_card2"), Some(vec![]));

    let spec_path = cdi_dir.join("wdp-gpu.example.com-gpu.json");
    let spec = || -> Value {
        serde_json::from_slice(&std::fs::read(&spec_path).expect("spec file")).expect("JSON")
    };
    let s = spec();
    assert_eq!(
        s["cdiVersion"], "0.3.0",
        "nodes alone: the first CDI release"
    );
    assert_eq!(s["kind"], "gpu.example.com/gpu");
    let names: Vec<&str> = s["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["dri_card0", "dri_card1", "dri_card2"]);
    assert_eq!(
        s["devices"][1]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/dri/card1", "permissions": "rw"}]),
        "a host path equal to the path is left out"
    );
    assert!(cdi_dir.join("wdp-gpu.example.com-vfio.json").is_file());

    let r = kubelet.allocate(gpu, &["dri_card1"]).await.unwrap();
    let c = &r.container_responses[0];
    let cdi: Vec<&str> = c.cdi_devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(cdi, ["gpu.example.com/gpu=dri_card1"]);
    assert_eq!(
        c.devices[0].host_path, "/dev/dri/card1",
        "the default answer stays"
    );

    // Hot-unplug: the spec is rewritten without the device before kubelet hears of it.
    f.remove_dev("dri/card2");
    seen.devices(gpu, &["dri_card0", "dri_card1"]).await;
    assert_eq!(spec()["devices"].as_array().unwrap().len(), 2);
    // The last VFIO node goes: so does its resource's spec.
    f.remove_dev("vfio/12");
    let vfio_spec = cdi_dir.join("wdp-gpu.example.com-vfio.json");
    seen.until("the vfio spec removed", |_| !vfio_spec.exists())
        .await;

    // Stopping removes nothing: kubelet replays the names on container restarts meanwhile.
    assert!(host.terminate().await.success());
    let left: Vec<String> = std::fs::read_dir(&cdi_dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        left,
        ["wdp-gpu.example.com-gpu.json"],
        "specs kept on shutdown"
    );
    kubelet.stop().await;
}
