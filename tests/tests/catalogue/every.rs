//! Every bundled scanner at once, each over its catalogue fixture: with only its required options
//! it gives a tree the host's default policy accepts; the example entries of `deploy/` and the
//! catalogue page of the book parse and serve as written; and the CDI specs the host writes for what they report
//! load under the rules of the version they declare, the lowest their content needs.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use wdp::cdi::schema;
use wdp::cdi_version as version;
use wdp_tests::fixture::{Fixture, PCI_ROOT};
use wdp_tests::host::serve;
use wdp_tests::{guest, json_lines};

use super::common::scan_allowing;

/// One way to start a bundled scanner: its options and allowed mounts, over a fixture.
pub(crate) struct Case {
    /// The component (`guest-scanners/<scanner>`), also the scanner's name.
    pub scanner: String,
    pub namespace: String,
    /// The scanner's env.
    pub env: Vec<(String, String)>,
    /// `policy.allowed-mounts`.
    pub allowed_mounts: Vec<String>,
    pub fixture: fn() -> Fixture,
}

impl Case {
    fn new(scanner: &str, namespace: &str, fixture: fn() -> Fixture) -> Case {
        Case {
            scanner: scanner.into(),
            namespace: namespace.into(),
            env: Vec::new(),
            allowed_mounts: Vec::new(),
            fixture,
        }
    }

    fn env(mut self, key: &str, value: &str) -> Case {
        self.env.push((key.into(), value.into()));
        self
    }

    fn allow(mut self, path: &str) -> Case {
        self.allowed_mounts.push(path.into());
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
        let allow: Vec<&str> = self.allowed_mounts.iter().map(String::as_str).collect();
        let out = scan_allowing(&self.scanner, f, &env, &allow);
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
            .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
            .collect();
        env.insert("RESCAN_INTERVAL_MS".into(), "600000".into());
        let mut entry = json!({
            "name": self.scanner,
            "component": guest(&self.scanner),
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
    with(super::gpu::machine)
}
fn npus() -> Fixture {
    with(super::npu::machine)
}
fn sgx() -> Fixture {
    with(super::sgx::machine)
}
fn dlbs() -> Fixture {
    with(super::dlb::machine)
}
fn qat() -> Fixture {
    with(super::qat::gen4)
}
fn idxd() -> Fixture {
    with(super::idxd::machine)
}
fn vfio() -> Fixture {
    with(super::vfio::machine)
}
fn generic() -> Fixture {
    with(super::host::two_node_machine)
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
        Case::new("gpu", "gpu.intel.com", gpus),
        Case::new("npu", "npu.intel.com", npus),
        Case::new("sgx", "sgx.intel.com", sgx),
        Case::new("dlb", "dlb.intel.com", dlbs),
        Case::new("qat", "qat.intel.com", qat),
        Case::new("idxd", "dsa.intel.com", idxd).env("IDXD_DEVICE", "dsa"),
        Case::new("vfio", "dsa.intel.com", vfio).env("VFIO_DEVICE_IDS", "0x0b25,0x11fb,0x1212"),
        Case::new("nvidia", "nvidia.com", super::nvidia::server),
        Case::new("usb", "usb.example.com", super::usb::workstation)
            .env("USB_DEVICES", "1050:0407,0403:6001:A12345"),
        Case::new("serial", "serial.example.com", super::serial::bench),
        Case::new("generic", "generic.example.com", generic).env("DEVICES", super::host::DEVICES),
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
        Case::new("nvidia", "nvidia.com", super::nvidia::server).env("REPLICAS", "2"),
        Case::new("serial", "serial.example.com", super::serial::bench)
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
        vec![("i915", "0.3.0"), ("xe", "0.3.0")],
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
        let cdi_dir = f.path().join("cdi");
        let format = if i % 2 == 0 { "json" } else { "yaml" };
        let entry = case.config_entry(json!({"cdi": {"dir": cdi_dir, "format": format}}));
        let written = serve_until_listed(case, &f, &entry).await;
        let mut got = Vec::new();
        for (file, doc) in written {
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
        assert_eq!(got, want, "{}", case.label());
    }
}

/// Scans `case` over `f` (the tree must be accepted and non-empty), then runs `wdp run` with the
/// one scanner `entry` over `f` until every resource of that tree is listed to the kubelet
/// stand-in, and stops it cleanly; returns the CDI specs in `<f>/cdi` while it served.
async fn serve_until_listed(case: &Case, f: &Fixture, entry: &Value) -> Vec<(String, Value)> {
    let tree = case
        .scan(f)
        .unwrap_or_else(|e| panic!("{}: {e}", case.label()));
    let types: Vec<&String> = tree.as_object().unwrap().keys().collect();
    assert!(!types.is_empty(), "{}: an empty tree", case.label());
    let config = f.write_config(&serde_yaml_ng::to_string(&json!({"scanners": [entry]})).unwrap());
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(f, &config, &plugins);
    let resources: Vec<String> = types
        .iter()
        .map(|t| format!("{}/{t}", case.namespace))
        .collect();
    let resources: Vec<&str> = resources.iter().map(String::as_str).collect();
    seen.all_listed(&resources).await;
    let written = specs(&f.path().join("cdi"));
    assert!(host.terminate().await.success());
    kubelet.stop().await;
    written
}

#[test]
fn every_scanner_with_only_its_required_options_passes_the_default_policy() {
    let examples: Vec<Example> = served_entries()
        .into_iter()
        .chain(examples_of_configmap())
        .collect();
    for case in defaults() {
        let f = (case.fixture)();
        let tree = case
            .scan(&f)
            .unwrap_or_else(|e| panic!("{} under the default policy: {e}", case.label()));
        assert!(non_empty(&tree), "{}: an empty tree", case.label());
        // Again with the policy its example entry recommends.
        let example = examples
            .iter()
            .find(|e| e.component() == case.scanner)
            .unwrap_or_else(|| panic!("no example entry for {}", case.scanner));
        let recommended = Case {
            allowed_mounts: example.allowed_mounts(),
            ..case
        };
        let tree = recommended.scan(&f).unwrap_or_else(|e| {
            panic!(
                "{} with {:?}: {e}",
                recommended.label(),
                recommended.allowed_mounts
            )
        });
        assert!(non_empty(&tree), "{}: an empty tree", recommended.label());
    }
    // An example whose options add mounts, without its policy line: refused, and the refusal
    // names the mount and the line to add.
    for example in examples.iter().filter(|e| !e.allowed_mounts().is_empty()) {
        let bare = Case {
            allowed_mounts: Vec::new(),
            ..example.case()
        };
        let f = (bare.fixture)();
        let why = bare.scan(&f).expect_err("refused without its policy");
        let root = &example.allowed_mounts()[0];
        assert!(
            why.contains("allowed-mounts") && why.contains(root.as_str()),
            "{}: {why}",
            bare.label()
        );
    }
}

fn non_empty(tree: &Value) -> bool {
    tree.as_object().is_some_and(|types| {
        types
            .values()
            .any(|d| d.as_object().is_some_and(|d| !d.is_empty()))
    })
}

/// Where the in-image components live (`deploy/`, Containerfile).
const IMAGE_SCANNERS: &str = "/usr/lib/wdp/scanners/";

/// One scanner entry of a config, as YAML.
struct Example {
    /// The entry parsed.
    entry: serde_yaml_ng::Value,
}

impl Example {
    /// The entry's YAML text (a `- name: ...` list item).
    fn parse(text: &str) -> Example {
        let mut list: Vec<serde_yaml_ng::Value> =
            serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
        assert_eq!(list.len(), 1, "one entry:\n{text}");
        Example {
            entry: list.remove(0),
        }
    }

    fn name(&self) -> &str {
        self.entry["name"].as_str().expect("a name")
    }

    /// The in-image component's scanner name (`/usr/lib/wdp/scanners/<it>.wasm`).
    fn component(&self) -> String {
        in_image(self.entry["component"].as_str().expect("a component"))
    }

    fn allowed_mounts(&self) -> Vec<String> {
        self.entry["policy"]["allowed-mounts"]
            .as_sequence()
            .map(|l| {
                l.iter()
                    .filter_map(|p| p.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The entry's scanner, options and policy over its scanner's fixture.
    fn case(&self) -> Case {
        let scanner = self.component();
        let env = serde_json::to_value(&self.entry["env"]).unwrap();
        Case {
            namespace: self.entry["namespace"]
                .as_str()
                .expect("a namespace")
                .into(),
            env: env
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| {
                    let text = v
                        .as_str()
                        .map(String::from)
                        .unwrap_or_else(|| v.to_string());
                    (k.clone(), text)
                })
                .collect(),
            allowed_mounts: self.allowed_mounts(),
            fixture: fixture_of(&scanner),
            scanner,
        }
    }

    /// The entry as it runs here: built components, and `cdi.dir` in `cdi_dir` (never the
    /// machine's own).
    fn runnable(&self, cdi_dir: &Path) -> serde_yaml_ng::Value {
        let mut entry = self.entry.clone();
        let map = entry.as_mapping_mut().expect("an entry is a map");
        for key in ["component", "post-allocator"] {
            if let Some(v) = map.get_mut(key) {
                let built = guest(&in_image(v.as_str().expect("a path")));
                *v = built.display().to_string().into();
            }
        }
        if let Some(cdi) = map.get_mut("cdi").and_then(|c| c.as_mapping_mut()) {
            cdi.insert("dir".into(), cdi_dir.display().to_string().into());
        }
        entry
    }
}

/// `X` of `/usr/lib/wdp/scanners/X.wasm`.
fn in_image(path: &str) -> String {
    path.strip_prefix(IMAGE_SCANNERS)
        .and_then(|n| n.strip_suffix(".wasm"))
        .unwrap_or_else(|| panic!("{path:?} is not in {IMAGE_SCANNERS}"))
        .to_string()
}

fn repo_file(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The ConfigMap's `wdp.yaml`.
fn configmap_config() -> String {
    let cm: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&repo_file("deploy/configmap.yaml")).unwrap();
    cm["data"]["wdp.yaml"]
        .as_str()
        .expect("data.wdp.yaml")
        .to_string()
}

/// The commented entries of `text`: each `# - name:` line and the `#   ` lines after it at the
/// same indentation, uncommented.
fn commented_entries(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut indent: Option<usize> = None;
    for line in text.lines() {
        let at = line.len() - line.trim_start().len();
        let body = line.trim_start();
        if body.starts_with("# - name:") {
            indent = Some(at);
            out.push(format!("{}\n", &body[2..]));
        } else if let (Some(i), true) = (indent, body.starts_with("#   ")) {
            if at == i {
                out.last_mut()
                    .unwrap()
                    .push_str(&format!("{}\n", &body[2..]));
                continue;
            }
            indent = None;
        } else {
            indent = None;
        }
    }
    out
}

/// The entries the ConfigMap serves.
fn served_entries() -> Vec<Example> {
    let served: serde_yaml_ng::Value = serde_yaml_ng::from_str(&configmap_config()).unwrap();
    served["scanners"]
        .as_sequence()
        .expect("scanners")
        .iter()
        .map(|e| Example { entry: e.clone() })
        .collect()
}

/// The ConfigMap's commented entries.
fn examples_of_configmap() -> Vec<Example> {
    commented_entries(&configmap_config())
        .iter()
        .map(|t| Example::parse(t))
        .collect()
}

/// The catalogue page's example block, between its markers.
fn documented_examples() -> Vec<Example> {
    let block = wdp_tests::book::block(CATALOGUE_PAGE, "catalogue-examples");
    commented_entries(&block)
        .iter()
        .map(|t| Example::parse(t))
        .collect()
}

/// The book's page of the bundled scanners, which shows every example entry.
const CATALOGUE_PAGE: &str = "docs/src/catalogue/index.md";

/// The fixture an in-image scanner's example runs over.
fn fixture_of(scanner: &str) -> fn() -> Fixture {
    match scanner {
        // The served `generic` entry picks serial adapters.
        "generic" => super::serial::bench,
        other => {
            defaults()
                .into_iter()
                .find(|c| c.scanner == other)
                .unwrap_or_else(|| panic!("{other} is no bundled scanner"))
                .fixture
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_entries_parse_and_serve_as_written() {
    let commented = examples_of_configmap();
    let documented: Vec<String> = documented_examples()
        .iter()
        .map(|e| format!("{:?}", e.entry))
        .collect();
    let configmap: Vec<String> = commented.iter().map(|e| format!("{:?}", e.entry)).collect();
    assert_eq!(
        documented, configmap,
        "the examples of {CATALOGUE_PAGE} are the ConfigMap's"
    );

    // Every bundled scanner has an entry: served, or commented.
    let served = served_entries();
    let mut scanners: Vec<String> = served
        .iter()
        .chain(&commented)
        .map(Example::component)
        .collect();
    scanners.sort();
    scanners.dedup();
    let mut bundled: Vec<String> = defaults().into_iter().map(|c| c.scanner).collect();
    bundled.sort();
    assert_eq!(scanners, bundled, "an entry for every bundled scanner");

    // All uncommented at once: one valid config (names and resources apart).
    let dir = tempfile::tempdir().unwrap();
    let all: Vec<serde_yaml_ng::Value> = served
        .iter()
        .chain(&commented)
        .map(|e| e.runnable(&dir.path().join("cdi")))
        .collect();
    let path = dir.path().join("wdp.yaml");
    std::fs::write(
        &path,
        serde_yaml_ng::to_string(&json!({"scanners": all})).unwrap(),
    )
    .unwrap();
    let config = wdp::config::load(&path).unwrap_or_else(|e| panic!("every example at once: {e}"));
    assert_eq!(config.scanners.len(), served.len() + commented.len());

    // Each as written, over its scanner's fixture.
    for example in served.iter().chain(&commented) {
        let scanner = example.component();
        let f = fixture_of(&scanner)();
        let entry: Value = serde_json::to_value(example.runnable(&f.path().join("cdi"))).unwrap();
        let case = example.case();
        println!("example {}: {}", example.name(), case.label());
        let written = serve_until_listed(&case, &f, &entry).await;
        for (file, doc) in written {
            schema::check(&doc).unwrap_or_else(|e| panic!("{}: {file}: {e}", example.name()));
        }
    }
}
