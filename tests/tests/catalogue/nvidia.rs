//! `nvidia` scanner: NVIDIA GPUs bound to the `nvidia` driver, as NVIDIA/k8s-device-plugin
//! offers them (`nvidia.com/gpu`, nodes `/dev/nvidiactl`, `/dev/nvidia-uvm`,
//! `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`, `/dev/nvidiaN` with "rw", and
//! `NVIDIA_VISIBLE_DEVICES` per container), with PCI addresses as ids in place of NVML's UUIDs.

use serde_json::json;
use tonic::Code;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;

use super::common::{ids, one_scanner_config, scan, scan_once};

const RESOURCE: &str = "nvidia.com/gpu";
/// An A100 (3D controller) on NUMA node 0.
const A100: &str = "0000:3b:00.0";
/// A GeForce RTX 3090 (VGA, with its HD audio function) on NUMA node 1.
const RTX: &str = "0000:86:00.0";

/// A two-socket server: an A100 and an RTX 3090 bound to `nvidia`; a second A100 given to a VM
/// (`vfio-pci`); an NVSwitch bound to `nvidia` (not a GPU, no `/dev/nvidiaN`); the RTX's audio
/// function; the Intel iGPU. Nodes as `nvidia-modprobe` makes them: `/dev/nvidiaN` 195:N,
/// `nvidiactl` 195:255, `nvidia-modeset` 195:254, `nvidia-uvm*` on a dynamic major.
pub(crate) fn server() -> Fixture {
    let f = Fixture::new();
    let gpu = |bdf: &str, device: &str, class: &str, numa: &str, driver: &str| {
        f.pci_device(
            bdf,
            &[
                ("vendor", "0x10de"),
                ("device", device),
                ("class", class),
                ("numa_node", numa),
            ],
        );
        f.pci_bind(bdf, driver);
    };
    gpu(RTX, "0x2204", "0x030000", "1", "nvidia");
    gpu("0000:86:00.1", "0x1aef", "0x040300", "1", "snd_hda_intel");
    gpu(A100, "0x20b0", "0x030200", "0", "nvidia");
    gpu("0000:af:00.0", "0x20b0", "0x030200", "1", "vfio-pci");
    gpu("0000:d8:00.0", "0x1af1", "0x068000", "1", "nvidia");
    f.pci_device(
        "0000:00:02.0",
        &[
            ("vendor", "0x8086"),
            ("device", "0x3e92"),
            ("class", "0x030000"),
        ],
    );
    f.pci_bind("0000:00:02.0", "i915");
    f.char_dev("nvidia0", 195, 0)
        .char_dev("nvidia1", 195, 1)
        .char_dev("nvidiactl", 195, 255)
        .char_dev("nvidia-modeset", 195, 254)
        .char_dev("nvidia-uvm", 509, 0)
        .char_dev("nvidia-uvm-tools", 509, 1)
        .char_dev("dri/card0", 226, 0);
    f
}

fn node(path: &str) -> serde_json::Value {
    json!({"container_path": path, "host_path": path, "permissions": "rw"})
}

const CONTROL: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

#[test]
fn nvidia_scan_reports_bound_gpus_by_pci_address() {
    let f = server();
    let tree = scan_once("nvidia", &f, &[]);
    // PCI order gives the A100 minor 0 and the RTX minor 1 (the driver's boot-time numbering).
    assert_eq!(
        ids(&tree),
        [("gpu".to_string(), vec![A100.to_string(), RTX.to_string()])]
    );
    let mut nodes: Vec<_> = CONTROL.iter().map(|p| node(p)).collect();
    nodes.push(node("/dev/nvidia1"));
    assert_eq!(
        tree["gpu"][RTX],
        json!({
            "health": "Healthy",
            "nodes": nodes,
            "mounts": [],
            "envs": {},
            "annotations": {},
            "numa_nodes": [1],
            "cdi_devices": [],
        })
    );
    assert_eq!(tree["gpu"][A100]["nodes"][4], node("/dev/nvidia0"));
    assert_eq!(tree["gpu"][A100]["numa_nodes"], json!([0]));

    // Control nodes are optional, as in NVIDIA's device specs; a GPU without its own node is not
    // offered, nor is one whose node has another minor than the driver would have given it.
    f.remove_dev("nvidia-uvm-tools")
        .remove_dev("nvidia-modeset")
        .remove_dev("nvidia0")
        .char_dev("nvidia0", 195, 7);
    let tree = scan_once("nvidia", &f, &[]);
    assert_eq!(ids(&tree), [("gpu".to_string(), vec![RTX.to_string()])]);
    assert_eq!(
        tree["gpu"][RTX]["nodes"],
        json!([
            node("/dev/nvidiactl"),
            node("/dev/nvidia-uvm"),
            node("/dev/nvidia1")
        ])
    );

    // No NVIDIA GPU at all: the type is still advertised, with no devices.
    let empty = Fixture::new();
    assert_eq!(scan_once("nvidia", &empty, &[]), json!({"gpu": {}}));
}

#[test]
fn nvidia_env_options_and_bad_values() {
    let f = server();
    let tree = scan_once("nvidia", &f, &["REPLICAS=3"]);
    let want: Vec<String> = [A100, RTX]
        .iter()
        .flat_map(|b| (0..3).map(move |i| format!("{b}::{i}")))
        .collect();
    assert_eq!(ids(&tree), [("gpu".to_string(), want)]);
    assert_eq!(
        tree["gpu"][format!("{RTX}::2")]["nodes"][4],
        node("/dev/nvidia1")
    );

    // Without device specs the NVIDIA runtime adds the nodes; NUMA affinity is still given.
    let tree = scan_once("nvidia", &f, &["PASS_DEVICE_SPECS=false"]);
    assert_eq!(tree["gpu"][RTX]["nodes"], json!([]));
    assert_eq!(tree["gpu"][RTX]["numa_nodes"], json!([1]));

    for (env, valid) in [
        ("REPLICAS=0", "from 1 to 1024"),
        ("REPLICAS=many", "from 1 to 1024"),
        ("DEVICE_ID_STRATEGY=uuid", "bdf, index"),
        ("FAIL_REQUESTS_GREATER_THAN_ONE=yes", "true, false"),
        ("PASS_DEVICE_SPECS=1", "true, false"),
    ] {
        let out = scan("nvidia", &f, &[env]);
        assert!(!out.status.success(), "{env} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        let (name, value) = env.split_once('=').unwrap();
        assert!(
            err.contains(&format!("{name}=\"{value}\" is not valid")) && err.contains(valid),
            "{env}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_allocate_sets_visible_devices_per_container() {
    let f = server();
    let nvidia = wdp_tests::guest("nvidia").display().to_string();
    let config = f.write_config(&format!(
            "scanners:
  - name: nvidia
    component: {nvidia}
    post-allocator: {nvidia}
    namespace: nvidia.com
    env: {{ RESCAN_INTERVAL_MS: 600000 }}
  - name: nvidia-shared
    component: {nvidia}
    post-allocator: {nvidia}
    namespace: shared.nvidia.com
    env: {{ RESCAN_INTERVAL_MS: 600000, REPLICAS: 2, DEVICE_ID_STRATEGY: index, FAIL_REQUESTS_GREATER_THAN_ONE: 'true' }}
"
        ),
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(RESOURCE, &[A100, RTX]).await;
    let shared = "shared.nvidia.com/gpu";
    let replicas = [
        format!("{A100}::0"),
        format!("{A100}::1"),
        format!("{RTX}::0"),
        format!("{RTX}::1"),
    ];
    let replica_refs: Vec<&str> = replicas.iter().map(String::as_str).collect();
    seen.devices(shared, &replica_refs).await;

    // Two GPUs in one container: the control nodes once, each GPU's node, and the list the
    // NVIDIA container runtime reads, in request order.
    let r = kubelet.allocate(RESOURCE, &[RTX, A100]).await.unwrap();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    let paths = wdp_tests::node_specs(c);
    let mut want: Vec<(&str, &str, &str)> = CONTROL.iter().map(|p| (*p, *p, "rw")).collect();
    want.extend([
        ("/dev/nvidia1", "/dev/nvidia1", "rw"),
        ("/dev/nvidia0", "/dev/nvidia0", "rw"),
    ]);
    assert_eq!(paths, want);
    assert_eq!(c.envs.len(), 1, "{:?}", c.envs);
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], format!("{RTX},{A100}"));
    assert!(c.mounts.is_empty() && c.annotations.is_empty());

    // Time-slicing with index ids: a replica of the RTX is GPU 1 in PCI order.
    let r = kubelet
        .allocate(shared, &[replicas[3].as_str()])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], "1");
    assert_eq!(c.devices.last().unwrap().host_path, "/dev/nvidia1");
    // ... and more than one replica per container is refused, as NVIDIA's option does.
    let e = kubelet
        .allocate(shared, &[replicas[0].as_str(), replicas[3].as_str()])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(
        e.message().contains("FAIL_REQUESTS_GREATER_THAN_ONE"),
        "{}",
        e.message()
    );
    drop(host);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_missing_node_is_unhealthy_at_once() {
    let f = server();
    // A long rescan interval: only the host's /dev watch can wake the scanner in time.
    let config = one_scanner_config(
        &f,
        "nvidia",
        "nvidia.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        true,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(RESOURCE, &[A100, RTX]).await;
    seen.health(RESOURCE, A100, "Healthy").await;

    f.remove_dev("nvidia0");
    seen.health(RESOURCE, A100, "Unhealthy").await;
    seen.health(RESOURCE, RTX, "Healthy").await;
    let e = kubelet.allocate(RESOURCE, &[A100]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    f.char_dev("nvidia0", 195, 0);
    seen.health(RESOURCE, A100, "Healthy").await;
    let r = kubelet.allocate(RESOURCE, &[A100]).await.unwrap();
    assert_eq!(
        r.container_responses[0].devices.last().unwrap().host_path,
        "/dev/nvidia0"
    );
    drop(host);
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_unbound_gpu_is_unhealthy_and_others_keep_their_node() {
    let f = server();
    // A rebind changes links below `bus/pci/drivers/<driver>`, which the host watches: no
    // rescan interval is needed to see it.
    let config = one_scanner_config(
        &f,
        "nvidia",
        "nvidia.com",
        &["RESCAN_INTERVAL_MS: 600000"],
        true,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(RESOURCE, &[A100, RTX]).await;

    // The A100 goes to a VM: the driver frees minor 0 and the RTX keeps /dev/nvidia1.
    f.pci_bind(A100, "vfio-pci");
    seen.health(RESOURCE, A100, "Unhealthy").await;
    seen.health(RESOURCE, RTX, "Healthy").await;
    let r = kubelet.allocate(RESOURCE, &[RTX]).await.unwrap();
    let c = &r.container_responses[0];
    assert_eq!(c.devices.last().unwrap().host_path, "/dev/nvidia1");
    assert_eq!(c.envs["NVIDIA_VISIBLE_DEVICES"], RTX);

    // Back to `nvidia`: the lowest free minor, 0, as the driver would give it.
    f.pci_bind(A100, "nvidia");
    seen.health(RESOURCE, A100, "Healthy").await;
    let r = kubelet.allocate(RESOURCE, &[A100]).await.unwrap();
    assert_eq!(
        r.container_responses[0].devices.last().unwrap().host_path,
        "/dev/nvidia0"
    );
    drop(host);
    kubelet.stop().await;
}
