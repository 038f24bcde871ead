//! Every bundled scanner through `frontend: dra`: each over its catalogue fixture
//! (`catalogue::every::defaults`, the fixtures the device-plugin tests use), `wdp run` publishes
//! its tree to the API server stand-in, which validates every slice with the API's rules, once the
//! DRA kubelet stand-in registered the driver.

use std::time::Instant;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};
use serde_json::json;
use wdp_dra::apiserver::standin::{ApiServerStandIn, validate};
use wdp_dra::kubelet::KubeletStandIn;
use wdp_tests::eventually;
use wdp_tests::host::Host;

use crate::catalogue::every::defaults;

const NODE: &str = "node-1";

/// The attribute `key` of `device`.
fn attribute<'a>(device: &'a Device, key: &str) -> Option<&'a DeviceAttribute> {
    device.attributes.as_ref()?.get(key)
}

/// Each of the twelve bundled scanners, with only its required options, served through DRA:
/// its slices are valid (names DNS labels, attributes and pool by the API's rules), one pool
/// named after the node, and they hold exactly the tree's healthy devices (what device-plugin
/// mode advertises as healthy for the same tree), each with its dev-type and raw id, and
/// `resource.kubernetes.io/numaNode` exactly where the tree puts the device on one NUMA node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bundled_scanner_publishes_valid_slices() {
    let cases = defaults();
    assert_eq!(cases.len(), 12, "the bundled scanners");
    let mut numa_seen = 0;
    for case in cases {
        let started = Instant::now();
        let f = (case.fixture)();
        let tree = case
            .scan(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        // (dev-type, raw id, NUMA node when exactly one) of every healthy device.
        let mut want: Vec<(String, String, Option<i64>)> = Vec::new();
        for (dev_type, devices) in tree.as_object().into_iter().flatten() {
            for (id, info) in devices.as_object().into_iter().flatten() {
                if info["health"] != "Healthy" {
                    continue;
                }
                let numa = match info["numa_nodes"].as_array().map(Vec::as_slice) {
                    Some([n]) => n.as_i64(),
                    _ => None,
                };
                want.push((dev_type.clone(), id.clone(), numa));
            }
        }
        want.sort();
        assert!(!want.is_empty(), "{}: no healthy device", case.label());

        let api = ApiServerStandIn::start()
            .await
            .expect("the API server stand-in");
        let plugins = f.plugin_dir();
        let kubelet = f.path().join("kubelet");
        let entry = case.config_entry(json!({
            "cdi": {"dir": f.path().join("cdi")},
            "frontend": "dra",
        }));
        let config = json!({
            "scanners": [entry],
            "node": {
                "name": NODE,
                "plugins-dir": kubelet.join("plugins"),
                "plugins-registry-dir": kubelet.join("plugins_registry"),
                "api-server": format!("http://{}", api.addr()),
            },
        });
        let config = f.write_config(&serde_yaml_ng::to_string(&config).unwrap());
        // Slices are published once kubelet registered the driver.
        let _kubelet = KubeletStandIn::start(&kubelet.join("plugins_registry"), &api, NODE);
        let host = Host::start(&config, &plugins, &f);
        let devices: Vec<Device> = eventually(
            &format!("{}: {} devices published", case.label(), want.len()),
            || async {
                let slices = api.slices();
                let devices: Vec<Device> = slices
                    .iter()
                    .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
                    .collect();
                (devices.len() == want.len()).then_some(devices)
            },
        )
        .await;
        let slices = api.slices();
        for slice in &slices {
            assert_eq!(validate(slice), Vec::<String>::new(), "{}", case.label());
            assert_eq!(
                slice.spec.driver, case.namespace,
                "the driver: the namespace"
            );
            assert_eq!(slice.spec.node_name.as_deref(), Some(NODE));
            assert_eq!(slice.spec.pool.name, NODE, "one pool, named after the node");
        }
        let mut got: Vec<(String, String, Option<i64>)> = devices
            .iter()
            .map(|d| {
                let string = |key: &str| {
                    attribute(d, key)
                        .and_then(|a| a.string.clone())
                        .unwrap_or_else(|| panic!("{}: {} has no {key}", case.label(), d.name))
                };
                let numa = attribute(d, "resource.kubernetes.io/numaNode").map(|a| {
                    a.int
                        .unwrap_or_else(|| panic!("{}: numaNode is an int", case.label()))
                });
                (string("type"), string("id"), numa)
            })
            .collect();
        got.sort();
        assert_eq!(got, want, "{}", case.label());
        numa_seen += got.iter().filter(|(_, _, n)| n.is_some()).count();
        assert!(host.terminate().await.success(), "{}", case.label());
        eprintln!(
            "{}: {} devices in {} slice(s), {:?}",
            case.label(),
            got.len(),
            slices.len(),
            started.elapsed()
        );
    }
    assert!(
        numa_seen > 0,
        "some fixture has NUMA: the attribute was checked"
    );
}
