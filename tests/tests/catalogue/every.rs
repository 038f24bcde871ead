//! Every bundled scanner at once, each over its catalogue fixture: the CDI specs the host writes
//! for what they report load under the rules of the version they declare, and that version is
//! the lowest their content needs.

use std::path::Path;

use serde_json::{Value, json};
use wdp::cdi::{schema, version};
use wdp_tests::fixture::{Fixture, PCI_ROOT};
use wdp_tests::host::serve;
use wdp_tests::{guest, json_lines};

use crate::common::{plugin_dir, scan_allowing, write_config};

/// One way to start a bundled scanner: its options and allowed mounts, over a fixture.
pub(crate) struct Case {
    /// The component (`guest-scanners/<scanner>`), also the scanner's name.
    pub scanner: &'static str,
    pub namespace: &'static str,
    /// The scanner's env.
    pub env: Vec<(&'static str, String)>,
    /// `policy.allowed-mounts`.
    pub allowed_mounts: Vec<&'static str>,
    pub fixture: fn() -> Fixture,
}

impl Case {
    fn new(scanner: &'static str, namespace: &'static str, fixture: fn() -> Fixture) -> Case {
        Case {
            scanner,
            namespace,
            env: Vec::new(),
            allowed_mounts: Vec::new(),
            fixture,
        }
    }

    fn env(mut self, key: &'static str, value: &str) -> Case {
        self.env.push((key, value.to_string()));
        self
    }

    fn allow(mut self, path: &'static str) -> Case {
        self.allowed_mounts.push(path);
        self
    }

    /// `scanner: options`, for messages.
    pub fn label(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{} [{}]", self.scanner, env.join(" "))
    }

    /// The tree `wdp scan --once` reports over `f` with this case's options and mounts; `Err`
    /// with the scanner's stderr when the scan fails or the tree is refused.
    pub fn scan(&self, f: &Fixture) -> Result<Value, String> {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let env: Vec<&str> = env.iter().map(String::as_str).collect();
        let out = scan_allowing(self.scanner, f, &env, &self.allowed_mounts);
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(json_lines(&out.stdout).remove(0))
    }

    /// This case as one scanner entry of a `wdp run` config, with `extra` keys (e.g. `cdi`).
    pub fn config_entry(&self, extra: Value) -> Value {
        let mut env: serde_json::Map<String, Value> = self
            .env
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(v.as_str())))
            .collect();
        env.insert("RESCAN_INTERVAL_MS".into(), "600000".into());
        let mut entry = json!({
            "name": self.scanner,
            "component": guest(self.scanner),
            "namespace": self.namespace,
            "env": env,
        });
        if !self.allowed_mounts.is_empty() {
            entry["policy"] = json!({"allowed-mounts": self.allowed_mounts});
        }
        for (k, v) in extra.as_object().into_iter().flatten() {
            entry[k] = v.clone();
        }
        entry
    }
}

/// Each fixture builder of the catalogue as a `fn() -> Fixture`.
fn with(build: fn(&Fixture)) -> Fixture {
    let f = Fixture::new();
    build(&f);
    f
}

fn gpus() -> Fixture {
    with(crate::gpu::machine)
}
fn npus() -> Fixture {
    with(crate::npu::machine)
}
fn sgx() -> Fixture {
    with(crate::sgx::machine)
}
fn dlbs() -> Fixture {
    with(crate::dlb::machine)
}
fn qat() -> Fixture {
    with(crate::qat::gen4)
}
fn idxd() -> Fixture {
    with(crate::idxd::machine)
}
fn vfio() -> Fixture {
    with(crate::vfio::machine)
}
fn generic() -> Fixture {
    with(crate::host::two_node_machine)
}
fn kvm() -> Fixture {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232)
        .char_dev("net/tun", 10, 200)
        .char_dev("vhost-net", 10, 238)
        .char_dev("fuse", 10, 229);
    f
}

/// QAT's fixture with one VF bound to igb_uio (its uio node and class link).
fn qat_igb_uio() -> Fixture {
    let f = qat();
    f.pci_bind("0000:6b:00.3", "igb_uio");
    f.sys_dir(&format!("{PCI_ROOT}/0000:6b:00.3/uio/uio0"));
    f.sys_link(
        "class/uio/uio0",
        &format!("../../{PCI_ROOT}/0000:6b:00.3/uio/uio0"),
    );
    f.char_dev("uio0", 239, 0);
    f
}

/// Every bundled scanner with only the options it requires.
pub(crate) fn defaults() -> Vec<Case> {
    vec![
        Case::new("gpu", "gpu.intel.com", gpus).allow("/dev/dri/by-path"),
        Case::new("npu", "npu.intel.com", npus),
        Case::new("sgx", "sgx.intel.com", sgx),
        Case::new("dlb", "dlb.intel.com", dlbs),
        Case::new("qat", "qat.intel.com", qat),
        Case::new("idxd", "dsa.intel.com", idxd).env("IDXD_DEVICE", "dsa"),
        Case::new("vfio", "dsa.intel.com", vfio).env("VFIO_DEVICE_IDS", "0x0b25,0x11fb,0x1212"),
        Case::new("nvidia", "nvidia.com", crate::nvidia::server),
        Case::new("usb", "usb.example.com", crate::usb::workstation)
            .env("USB_DEVICES", "1050:0407,0403:6001:A12345"),
        Case::new("serial", "serial.example.com", crate::serial::bench),
        Case::new("generic", "generic.example.com", generic).env("DEVICES", crate::host::DEVICES),
        Case::new("kvm", "devices.example.com", kvm),
    ]
}

/// The options that put more into a spec: by-path mounts and monitoring, igb_uio's writable
/// mount, replicas, a by-id container path, a generic mount.
fn richer() -> Vec<Case> {
    let mount = r#"[{"name":"dri","groups":[{"paths":[{"path":"/dev/dri","type":"Mount","readOnly":true}]}]}]"#;
    vec![
        Case::new("gpu", "gpu.intel.com", gpus)
            .env("BYPATH", "all")
            .env("ENABLE_MONITORING", "true")
            .allow("/dev/dri/by-path"),
        Case::new("qat", "qat.intel.com", qat_igb_uio)
            .env("DPDK_DRIVER", "igb_uio")
            .allow("/sys/class/uio"),
        Case::new("nvidia", "nvidia.com", crate::nvidia::server).env("REPLICAS", "2"),
        Case::new("serial", "serial.example.com", crate::serial::bench)
            .env("CONTAINER_PATHS", "by-id"),
        Case::new("generic", "generic.example.com", generic)
            .env("DEVICES", mount)
            .allow("/dev/dri"),
    ]
}

/// The CDI spec files in `dir`: name and document.
fn specs(dir: &Path) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(dir)
        .map(|entries| entries.flatten().collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap();
            let doc = if name.ends_with(".yaml") {
                serde_yaml_ng::from_str(&text).unwrap()
            } else {
                serde_json::from_str(&text).unwrap()
            };
            (name, doc)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cdi_spec_of_the_catalogue_loads_as_the_lowest_version_it_needs() {
    // (spec file, version) for each case, in order: what each family's content needs.
    let want: Vec<Vec<(&str, &str)>> = vec![
        vec![("i915", "0.4.0"), ("xe", "0.4.0")],
        vec![("accel", "0.3.0")],
        vec![("enclave", "0.3.0"), ("provision", "0.3.0")],
        // Ids that are node paths (`/dev/dlb0`) are no CDI names: no spec.
        vec![],
        // PCI addresses start with a digit.
        vec![("cy", "0.5.0"), ("dc", "0.5.0")],
        vec![("wq-user-dedicated", "0.3.0"), ("wq-user-shared", "0.3.0")],
        vec![("vfio", "0.5.0")],
        vec![("gpu", "0.5.0")],
        // `vvvv-pppp-...` ids start with a digit too.
        vec![("usb", "0.5.0")],
        // Each port at its kernel path and at its by-id path: a host path of its own.
        vec![("serial", "0.5.0")],
        vec![("gpu", "0.3.0"), ("vfio", "0.3.0")],
        vec![
            ("fuse", "0.3.0"),
            ("kvm", "0.3.0"),
            ("tun", "0.3.0"),
            ("vhost-net", "0.3.0"),
        ],
        // Mounts have a type (monitoring gets every node, no mount).
        vec![("i915", "0.4.0"), ("monitoring", "0.3.0"), ("xe", "0.4.0")],
        vec![("cy", "0.5.0")],
        vec![("gpu", "0.5.0")],
        vec![("serial", "0.5.0")],
        vec![("dri", "0.4.0")],
    ];
    let cases: Vec<Case> = defaults().into_iter().chain(richer()).collect();
    assert_eq!(cases.len(), want.len());
    for (i, (case, want)) in cases.iter().zip(want).enumerate() {
        let f = (case.fixture)();
        let tree = case
            .scan(&f)
            .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        let types: Vec<&String> = tree.as_object().unwrap().keys().collect();
        assert!(!types.is_empty(), "{}: an empty tree", case.label());
        let cdi_dir = f.path().join("cdi");
        let format = if i % 2 == 0 { "json" } else { "yaml" };
        let entry = case.config_entry(json!({"cdi": {"dir": cdi_dir, "format": format}}));
        let config = write_config(
            &f,
            &serde_yaml_ng::to_string(&json!({"scanners": [entry]})).unwrap(),
        );
        let plugins = plugin_dir(&f);
        let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
        let resources: Vec<String> = types
            .iter()
            .map(|t| format!("{}/{t}", case.namespace))
            .collect();
        let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
        seen.all_listed(&resources).await;

        let mut got = Vec::new();
        for (file, doc) in specs(&cdi_dir) {
            let declared = schema::check(&doc).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(
                declared,
                version::minimum(&doc),
                "{file}: the lowest version"
            );
            let dev_type = file
                .strip_prefix(&format!("wdp-{}-", case.namespace))
                .and_then(|t| t.rsplit_once('.'))
                .map(|(t, _)| t.to_string())
                .unwrap_or_else(|| panic!("{file}: named after its resource"));
            got.push((dev_type, declared.as_str()));
        }
        let want: Vec<(String, &str)> = want.iter().map(|(t, v)| (t.to_string(), *v)).collect();
        assert_eq!(got, want, "{}: {tree}", case.label());
        assert!(host.terminate().await.success());
        kubelet.stop().await;
    }
}
