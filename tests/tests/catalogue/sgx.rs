//! `sgx`: SGX enclaves as Intel's SGX plugin serves them (`sgx.intel.com/enclave` and
//! `sgx.intel.com/provision`), over a machine with the in-tree driver's two misc nodes and four
//! online CPUs.

use serde_json::json;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;
use wdp_tests::{guest, json_lines, wdp_bin};

use super::common::{ids, ids_of, one_scanner_config, scan, scan_once};

/// The misc major, and the minors the kernel gave the SGX nodes.
const MISC_MAJOR: u32 = 10;
const ENCLAVE_MINOR: u32 = 125;
const PROVISION_MINOR: u32 = 126;

pub(crate) fn machine(f: &Fixture) {
    f.char_dev("sgx_enclave", MISC_MAJOR, ENCLAVE_MINOR)
        .char_dev("sgx_provision", MISC_MAJOR, PROVISION_MINOR);
    for (name, minor) in [
        ("sgx_enclave", ENCLAVE_MINOR),
        ("sgx_provision", PROVISION_MINOR),
    ] {
        let dir = format!("devices/virtual/misc/{name}");
        f.sys_file(&format!("{dir}/dev"), &format!("{MISC_MAJOR}:{minor}\n"));
        f.sys_link(&format!("class/misc/{name}"), &format!("../../{dir}"));
    }
    f.sys_file("devices/system/cpu/online", "0-3\n");
}

fn slots(base: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{base}-{i}")).collect()
}

#[test]
fn enclave_and_provision_devices_as_configured() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("sgx", &f, &["ENCLAVE_LIMIT=3", "PROVISION_LIMIT=2"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("enclave", &slots("sgx-enclave", 3)),
            ("provision", &slots("sgx-provision", 2))
        ])
    );
    let mut dev = tree["enclave"]["sgx-enclave-2"].clone();
    // The host fills NUMA nodes from sysfs; that is tested with the host, not here.
    dev.as_object_mut().unwrap().remove("numa_nodes");
    assert_eq!(
        dev,
        json!({
            "health": "Healthy",
            "nodes": [
                {"container_path": "/dev/sgx_enclave", "host_path": "/dev/sgx_enclave", "permissions": "rw"}
            ],
            "mounts": [],
            "envs": {},
            "annotations": {},
            "cdi_devices": []
        })
    );
    assert_eq!(
        tree["provision"]["sgx-provision-1"]["nodes"][0]["host_path"],
        "/dev/sgx_provision"
    );
}

#[test]
fn limits_default_to_110_or_pods_per_core_times_cpus_and_are_checked() {
    let f = Fixture::new();
    machine(&f);
    let tree = scan_once("sgx", &f, &[]);
    assert_eq!(
        ids(&tree),
        ids_of(&[
            ("enclave", &slots("sgx-enclave", 110)),
            ("provision", &slots("sgx-provision", 110))
        ])
    );
    // Ten pods per core on four online CPUs; an explicit limit still wins, 0 drops the type.
    let tree = scan_once("sgx", &f, &["PODS_PER_CORE=10", "PROVISION_LIMIT=0"]);
    assert_eq!(
        ids(&tree),
        ids_of(&[("enclave", &slots("sgx-enclave", 40))])
    );

    let bad: [(&[&str], &str); 4] = [
        (&["ENCLAVE_LIMIT=-1"], "ENCLAVE_LIMIT=\"-1\" is not valid"),
        (
            &["PROVISION_LIMIT=99999"],
            "PROVISION_LIMIT=\"99999\" is not valid",
        ),
        (&["PODS_PER_CORE=ten"], "PODS_PER_CORE=\"ten\" is not valid"),
        (
            &["PODS_PER_CORE=5000"],
            "PODS_PER_CORE=5000 x 4 CPUs is more than 16384 devices per type",
        ),
    ];
    for (env, want) in bad {
        let out = scan("sgx", &f, env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} must fail");
        assert!(stderr.contains(want), "{env:?}: {stderr}");
    }
}

#[test]
fn without_both_nodes_nothing_is_served_and_the_log_says_why() {
    let f = Fixture::new();
    machine(&f);
    f.remove_dev("sgx_provision");
    // With the guest's own log lines (info), which `scan` leaves out.
    let component = guest("sgx").display().to_string();
    let out = std::process::Command::new(wdp_bin())
        .args(["scan", "--component", &component, "--once", "--sys-root"])
        .arg(f.sys())
        .arg("--dev-root")
        .arg(f.dev())
        .env("RUST_LOG", "info")
        .output()
        .expect("run wdp");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(json_lines(&out.stdout), [json!({})]);
    assert!(
        stderr.contains("no SGX provision node /dev/sgx_provision"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_and_a_vanished_node_turns_unhealthy() {
    let f = Fixture::new();
    machine(&f);
    let config = one_scanner_config(
        &f,
        "sgx",
        "sgx.intel.com",
        &[
            "ENCLAVE_LIMIT: 2",
            "PROVISION_LIMIT: 1",
            "RESCAN_INTERVAL_MS: 600000",
        ],
        false,
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let (enclave, provision) = ("sgx.intel.com/enclave", "sgx.intel.com/provision");
    seen.devices(enclave, &["sgx-enclave-0", "sgx-enclave-1"])
        .await;
    seen.devices(provision, &["sgx-provision-0"]).await;

    let r = kubelet
        .allocate(enclave, &["sgx-enclave-0", "sgx-enclave-1"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let nodes = wdp_tests::node_specs(c);
    // Both devices share one node: kubelet gets it once.
    assert_eq!(nodes, [("/dev/sgx_enclave", "/dev/sgx_enclave", "rw")]);
    assert!(c.mounts.is_empty() && c.envs.is_empty() && c.annotations.is_empty());

    // The provisioning node goes (upstream then serves nothing): every device turns Unhealthy,
    // and the host's log says why.
    f.remove_dev("sgx_provision");
    seen.health(provision, "sgx-provision-0", "Unhealthy").await;
    seen.health(enclave, "sgx-enclave-1", "Unhealthy").await;
    assert!(
        host.log()
            .contains("no SGX provision node /dev/sgx_provision"),
        "{}",
        host.log()
    );
    f.char_dev("sgx_provision", MISC_MAJOR, PROVISION_MINOR);
    seen.health(provision, "sgx-provision-0", "Healthy").await;
    seen.health(enclave, "sgx-enclave-1", "Healthy").await;

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
