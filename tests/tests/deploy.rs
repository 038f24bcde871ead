//! The deployment (`deploy/`, and the `Containerfile` as far as text goes) checked without a
//! cluster (tests/tests/image.rs builds the image and runs the DaemonSet's command in it as the
//! pod runs it, with every privilege it drops):
//!
//! * every manifest the kustomization lists is parsed into the typed Kubernetes API structs
//!   (k8s-openapi) and must survive the round trip unchanged: k8s-openapi ignores unknown fields
//!   when it deserializes, so a misspelled field shows up as a field the round trip dropped;
//! * the pod's least-privilege properties, its probes and its paths are checked on the typed
//!   DaemonSet and on its pod as `wdp_tests::daemonset` reads it for the image's run, against the
//!   ConfigMap's config as `wdp::config` reads it;
//! * the Containerfile and scripts/image.sh are checked against the repository (the scanners
//!   staged are the bundled ones) and against what the manifests and the book name in the
//!   image;
//! * DRA mode's Component (`deploy/dra/`) is rendered onto `deploy/` (and compared with kubectl's
//!   rendering where kubectl exists), parsed the same way, and checked: the DRA pod is the
//!   device-plugin pod plus a token, NODE_NAME and kubelet's DRA dirs; the RBAC rules; the
//!   admission policy's CEL evaluated over admission requests; each DeviceClass's CEL selector
//!   evaluated on the slices wdp-dra builds from the ConfigMap's scanners over a fixture.
//!
//! The manifests and the config are read from `deploy/`; only what differs between a node and this
//! test (the component files: the ones built from source stand in for the image's) is moved.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, Namespace, PodSpec, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::serde::Serialize;
use k8s_openapi::serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use wdp_tests::daemonset::{Pod, Source, configmap_devices};
use wdp_tests::fixture::Fixture;
use wdp_tests::repo;

/// Where the image installs the bundled scanners (the Containerfile's destination).
pub(crate) const IMAGE_SCANNERS: &str = "/usr/lib/wdp/scanners/";

/// The host's resident memory at its first start with 12 scanners, while compiling (the largest
/// figure in bench/RESULTS.md, "First start (compiling): 64.5 MiB"): the pod's memory limit must
/// cover it plus what the host may hold for every guest.
const MEASURED_FIRST_START_BYTES: u64 = 65 << 20;

fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Rendering the kustomization

/// One rendered object: the file it came from, and the document as JSON.
#[derive(Debug, Clone)]
pub(crate) struct Doc {
    pub(crate) file: String,
    pub(crate) value: Value,
}

impl Doc {
    pub(crate) fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub(crate) fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }
}

/// Every YAML document in `text`, as JSON values (empty documents skipped).
pub(crate) fn yaml_documents(text: &str) -> Result<Vec<Value>, String> {
    let mut docs = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).map_err(|e| e.to_string())?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The keys of `kustomization.yaml` this renderer implements; anything else is refused, so the
/// test never checks less than `kubectl apply -k` would apply.
const KUSTOMIZATION_KEYS: [&str; 4] = ["apiVersion", "kind", "resources", "images"];

/// Renders `dir`'s kustomization as `kubectl kustomize` does for the keys it uses: the listed
/// resource files, in order, with the `images` overrides applied.
pub(crate) fn render(dir: &Path) -> Result<Vec<Doc>, String> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml"))
        .map_err(|e| format!("kustomization.yaml: {e}"))?;
    let k: Value = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    let map = k.as_object().ok_or("kustomization.yaml is not a map")?;
    for key in map.keys() {
        if !KUSTOMIZATION_KEYS.contains(&key.as_str()) {
            return Err(format!(
                "kustomization.yaml: key {key:?} is not rendered by this test: teach render() it"
            ));
        }
    }
    if k["apiVersion"] != "kustomize.config.k8s.io/v1beta1" || k["kind"] != "Kustomization" {
        return Err(
            "kustomization.yaml: not a kustomize.config.k8s.io/v1beta1 Kustomization".into(),
        );
    }
    let resources = k["resources"]
        .as_array()
        .ok_or("kustomization.yaml: no resources list")?;
    let mut docs = Vec::new();
    for r in resources {
        let file = r.as_str().ok_or("a resource is not a string")?;
        let local = Path::new(file);
        if file.contains("://") || local.is_absolute() || file.contains("..") {
            return Err(format!(
                "resource {file:?}: only files beside kustomization.yaml"
            ));
        }
        let text = std::fs::read_to_string(dir.join(local)).map_err(|e| format!("{file}: {e}"))?;
        for value in yaml_documents(&text).map_err(|e| format!("{file}: {e}"))? {
            docs.push(Doc {
                file: file.to_string(),
                value,
            });
        }
    }
    for image in k["images"].as_array().into_iter().flatten() {
        for key in image.as_object().ok_or("an image is not a map")?.keys() {
            if !["name", "newName", "newTag"].contains(&key.as_str()) {
                return Err(format!("images: key {key:?} is not rendered by this test"));
            }
        }
        let name = image["name"].as_str().ok_or("an image has no name")?;
        for doc in &mut docs {
            for c in pod_containers_mut(&mut doc.value) {
                let Some(current) = c["image"].as_str() else {
                    continue;
                };
                let (current_name, current_tag) = split_image(current);
                if current_name != name {
                    continue;
                }
                let new_name = image["newName"].as_str().unwrap_or(current_name);
                let tag = image["newTag"].as_str().or(current_tag);
                c["image"] = match tag {
                    Some(tag) => format!("{new_name}:{tag}"),
                    None => new_name.to_string(),
                }
                .into();
            }
        }
    }
    Ok(docs)
}

/// `registry:5000/wdp:1.0` -> (`registry:5000/wdp`, Some(`1.0`)); digests are not used here.
pub(crate) fn split_image(image: &str) -> (&str, Option<&str>) {
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], Some(&image[slash + i + 1..])),
        None => (image, None),
    }
}

/// The containers of a workload's pod template, as JSON.
fn pod_containers_mut(doc: &mut Value) -> Vec<&mut Value> {
    // pointer_mut, not indexing: indexing a missing key would insert it.
    let mut out = Vec::new();
    if let Some(Value::Object(spec)) = doc.pointer_mut("/spec/template/spec") {
        for (key, list) in spec.iter_mut() {
            if key == "containers" || key == "initContainers" {
                out.extend(list.as_array_mut().into_iter().flatten());
            }
        }
    }
    out
}

pub(crate) fn rendered() -> Vec<Doc> {
    render(&repo().join("deploy")).unwrap_or_else(|e| panic!("deploy/: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Strict typed parsing

/// `doc` parsed as `T`, refused unless serializing it back gives `doc` again: a field the typed
/// struct does not know (a typo) is dropped by the round trip and named here.
///
/// The one normalisation: YAML `key:` with no value is null, which the typed struct reads as
/// absent and never writes back; nulls are removed before comparing. Quantities (`128Mi`) and
/// int-or-string ports are kept verbatim by k8s-openapi, and defaults are not filled in, so
/// nothing else needs normalising.
pub(crate) fn strict<T: DeserializeOwned + Serialize>(doc: &Value) -> Result<T, String> {
    let typed: T =
        serde_json::from_value(doc.clone()).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("does not serialize: {e}"))?;
    let mut problems = Vec::new();
    compare("", &without_nulls(doc), &back, &mut problems);
    if problems.is_empty() {
        Ok(typed)
    } else {
        Err(problems.join("; "))
    }
}

fn without_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// Every difference between the written `original` and the round trip `back`, by path.
fn compare(path: &str, original: &Value, back: &Value, problems: &mut Vec<String>) {
    match (original, back) {
        (Value::Object(a), Value::Object(b)) => {
            let at = |k: &str| match path {
                "" => k.to_string(),
                _ => format!("{path}.{k}"),
            };
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => compare(&at(k), v, w, problems),
                    None => problems.push(format!("unknown field {}", at(k))),
                }
            }
            for k in b.keys().filter(|k| !a.contains_key(*k)) {
                problems.push(format!("field {} appeared in the round trip", at(k)));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                compare(&format!("{path}[{i}]"), v, w, problems);
            }
        }
        (a, b) if a == b => {}
        (a, b) => problems.push(format!("{path}: {a} became {b}")),
    }
}

pub(crate) fn is<T: k8s_openapi::Resource>(doc: &Value) -> bool {
    doc["apiVersion"] == T::API_VERSION && doc["kind"] == T::KIND
}

/// Parses `doc` strictly as whichever of the kinds deploy/ uses it is.
fn check_typed(doc: &Value) -> Result<(), String> {
    if is::<Namespace>(doc) {
        strict::<Namespace>(doc).map(drop)
    } else if is::<ServiceAccount>(doc) {
        strict::<ServiceAccount>(doc).map(drop)
    } else if is::<ConfigMap>(doc) {
        strict::<ConfigMap>(doc).map(drop)
    } else if is::<DaemonSet>(doc) {
        strict::<DaemonSet>(doc).map(drop)
    } else {
        Err(format!(
            "{} {}: no typed check for this kind: add it to check_typed",
            doc["apiVersion"], doc["kind"]
        ))
    }
}

/// The one object of type `T` in the rendering.
pub(crate) fn one<T: k8s_openapi::Resource + DeserializeOwned + Serialize>(docs: &[Doc]) -> T {
    let found: Vec<&Doc> = docs.iter().filter(|d| is::<T>(&d.value)).collect();
    assert_eq!(found.len(), 1, "exactly one {} expected", T::KIND);
    strict(&found[0].value).unwrap_or_else(|e| panic!("{}: {e}", found[0].file))
}

#[test]
fn every_manifest_is_a_typed_kubernetes_object_without_unknown_fields() {
    let docs = rendered();
    let kinds: BTreeSet<&str> = docs.iter().map(Doc::kind).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["ConfigMap", "DaemonSet", "Namespace", "ServiceAccount"])
    );
    for doc in &docs {
        check_typed(&doc.value).unwrap_or_else(|e| panic!("{}: {e}", doc.file));
    }
    // Every namespaced object lives in the one namespace the kustomization creates.
    let ns: Namespace = one(&docs);
    let ns = ns.metadata.name.expect("the namespace has a name");
    for doc in docs.iter().filter(|d| d.kind() != "Namespace") {
        assert_eq!(
            doc.value["metadata"]["namespace"],
            *ns,
            "{} {} is not in namespace {ns}",
            doc.kind(),
            doc.name()
        );
    }
}

#[test]
fn a_misspelled_or_mistyped_field_is_refused() {
    let docs = rendered();
    let daemonset = docs
        .iter()
        .find(|d| d.kind() == "DaemonSet")
        .expect("a DaemonSet")
        .value
        .clone();
    check_typed(&daemonset).expect("the DaemonSet as written passes");

    // A typo: k8s-openapi alone would silently ignore it (the pod would run with a writable root).
    let mut typo = daemonset.clone();
    let sc = typo["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        .as_object_mut()
        .expect("the container has a securityContext");
    let v = sc.remove("readOnlyRootFilesystem").expect("set");
    sc.insert("readOnlyRootFileSytem".into(), v);
    assert!(
        serde_json::from_value::<DaemonSet>(typo.clone()).is_ok(),
        "k8s-openapi accepts the typo: the round trip is what catches it"
    );
    let err = check_typed(&typo).unwrap_err();
    assert_eq!(
        err,
        "unknown field spec.template.spec.containers[0].securityContext.readOnlyRootFileSytem"
    );

    // A field added at the wrong level, and a field with the wrong type.
    let mut misplaced = daemonset.clone();
    misplaced["spec"]["hostNetwork"] = true.into();
    assert_eq!(
        check_typed(&misplaced).unwrap_err(),
        "unknown field spec.hostNetwork"
    );
    let mut mistyped = daemonset.clone();
    mistyped["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] =
        "false".into();
    assert!(
        check_typed(&mistyped)
            .unwrap_err()
            .starts_with("does not parse"),
    );
    // An unquoted YAML boolean where Kubernetes wants a string (an annotation).
    let mut unquoted = daemonset;
    unquoted["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] = true.into();
    assert!(
        check_typed(&unquoted)
            .unwrap_err()
            .starts_with("does not parse")
    );

    // The same check over YAML text, as the files are read.
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetdata: {name: x}\ndata: {a: b}\n";
    let doc = &yaml_documents(cm).unwrap()[0];
    assert_eq!(
        check_typed(doc).unwrap_err(),
        "unknown field metdata; field metadata appeared in the round trip"
    );
    let unknown_kind = &yaml_documents("apiVersion: v1\nkind: Secret\n").unwrap()[0];
    assert!(
        check_typed(unknown_kind)
            .unwrap_err()
            .contains("no typed check")
    );
}

#[test]
fn the_renderer_refuses_what_it_does_not_implement() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [a.yaml]\npatches: []\n",
    )
    .unwrap();
    assert!(render(dir.path()).unwrap_err().contains("\"patches\""));
    assert_eq!(split_image("wdp"), ("wdp", None));
    assert_eq!(
        split_image("registry:5000/x/wdp:0.1"),
        ("registry:5000/x/wdp", Some("0.1"))
    );
}

/// Compares this test's rendering with kubectl's where kubectl exists (it is not part of the
/// project's toolchain; without it this comparison is skipped, and said so).
#[test]
fn kubectl_kustomize_renders_the_same_objects() {
    compare_with_kubectl(&repo().join("deploy"), rendered());
}

/// `kubectl kustomize dir` against `ours`, object by object (matched by kind and name), every
/// field of ours as kubectl renders it; skipped, and said so, where kubectl is not installed.
fn compare_with_kubectl(dir: &Path, ours: Vec<Doc>) {
    let out = match std::process::Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir)
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("kubectl is not installed: rendering compared with nothing but this test's");
            return;
        }
        Err(e) => panic!("kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let key = |v: &Value| format!("{}/{}", v["kind"], v["metadata"]["name"]);
    let mut theirs = yaml_documents(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let mut ours: Vec<Value> = ours.into_iter().map(|d| d.value).collect();
    theirs.sort_by_key(key);
    ours.sort_by_key(key);
    assert_eq!(theirs.len(), ours.len());
    for (t, o) in theirs.iter().zip(&ours) {
        let mut problems = Vec::new();
        compare("", o, t, &mut problems);
        assert!(problems.is_empty(), "{}: {problems:?}", key(o));
    }
}

// ---------------------------------------------------------------------------------------------
// The pod

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .template
        .spec
        .as_ref()
        .expect("the DaemonSet has a pod spec")
}

fn the_container(ds: &DaemonSet) -> &Container {
    let pod = pod_spec(ds);
    assert_eq!(pod.containers.len(), 1, "one container");
    assert!(pod.init_containers.as_ref().is_none_or(Vec::is_empty));
    &pod.containers[0]
}

/// The DaemonSet's pod as every test that runs or checks its command reads it.
fn pod_of(ds: &DaemonSet) -> Pod {
    Pod::of(&serde_json::to_value(ds).expect("a DaemonSet serializes"))
}

/// The volume `name` of the pod.
fn volume_of<'a>(ds: &'a DaemonSet, name: &str) -> &'a Volume {
    pod_spec(ds)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("mount {name} has no volume"))
}

fn host_path(v: &Volume) -> Option<&str> {
    v.host_path.as_ref().map(|h| h.path.as_str())
}

fn writable(m: &VolumeMount) -> bool {
    m.read_only != Some(true)
}

/// The host paths the pod may write to: kubelet's plugin dir and the CDI dir, nothing else.
const WRITABLE_HOST_PATHS: [&str; 2] = ["/var/lib/kubelet/device-plugins", "/var/run/cdi"];

#[test]
fn the_pod_has_least_privilege() {
    let docs = rendered();
    let ds: DaemonSet = one(&docs);
    let pod = pod_spec(&ds);
    let c = the_container(&ds);

    // Host namespaces, API access.
    assert_ne!(pod.host_network, Some(true), "no host network");
    assert_ne!(pod.host_pid, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
    assert_ne!(
        pod.host_users,
        Some(false),
        "user namespaces stop kernel uevents"
    );
    assert_eq!(pod.automount_service_account_token, Some(false));
    let sa: ServiceAccount = one(&docs);
    assert_eq!(pod.service_account_name, sa.metadata.name);
    assert_eq!(sa.automount_service_account_token, Some(false));
    for port in c.ports.iter().flatten() {
        assert_eq!(port.host_port, None, "no host port");
    }

    // The process: uid 0 (see daemonset.yaml) but no capability, no escalation, read-only root.
    let pod_sc = pod
        .security_context
        .as_ref()
        .expect("a pod securityContext");
    let sc = c
        .security_context
        .as_ref()
        .expect("a container securityContext");
    assert_ne!(sc.privileged, Some(true), "not privileged");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    assert!(
        caps.add.as_ref().is_none_or(Vec::is_empty),
        "no capability is added: {:?}",
        caps.add
    );
    let seccomp = sc
        .seccomp_profile
        .as_ref()
        .or(pod_sc.seccomp_profile.as_ref());
    assert_eq!(seccomp.map(|s| s.type_.as_str()), Some("RuntimeDefault"));
    assert_eq!(
        sc.run_as_user.or(pod_sc.run_as_user),
        Some(0),
        "the uid is stated"
    );

    // Volumes: hostPath mounts read-only (submounts too where the runtime can), except the two
    // that must be written; any other writable volume is pod-scoped.
    let mut writable_host = BTreeSet::new();
    for m in c.volume_mounts.iter().flatten() {
        let v = volume_of(&ds, &m.name);
        assert!(
            m.sub_path.is_none(),
            "{}: subPath mounts never update",
            m.name
        );
        match host_path(v) {
            Some(path) if writable(m) => {
                assert_eq!(m.mount_path, path, "{}: mounted at its host path", m.name);
                writable_host.insert(path);
            }
            Some(_) => assert!(
                matches!(
                    m.recursive_read_only.as_deref(),
                    Some("Enabled" | "IfPossible")
                ),
                "{}: read-only hostPath mounts are read-only recursively where possible",
                m.name
            ),
            None if writable(m) => {
                let empty = v.empty_dir.as_ref();
                assert!(
                    empty.is_some_and(|e| e.size_limit.is_some()),
                    "{}: the only other writable volume is a size-limited emptyDir",
                    m.name
                )
            }
            None => {}
        }
    }
    assert_eq!(writable_host, BTreeSet::from(WRITABLE_HOST_PATHS));
    for v in pod.volumes.iter().flatten() {
        assert!(
            c.volume_mounts.iter().flatten().any(|m| m.name == v.name),
            "volume {} is not mounted",
            v.name
        );
    }

    // Placement and updates.
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let tolerations = pod.tolerations.as_deref().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none()),
        "tolerates every taint: {tolerations:?}"
    );
    let strategy = ds
        .spec
        .update_strategy
        .as_ref()
        .expect("an update strategy");
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.as_ref().expect("rollingUpdate");
    assert!(rolling.max_unavailable.is_some());
    assert_eq!(
        rolling.max_surge,
        Some(IntOrString::Int(0)),
        "two wdp pods on one node would serve the same sockets"
    );
}

#[test]
fn the_paths_wdp_uses_are_on_the_right_mounts() {
    let docs = rendered();
    let pod = pod_of(&one(&docs));

    // The config: a whole ConfigMap volume (reloads see updates), naming the rendered ConfigMap
    // and a key it has.
    let config = PathBuf::from(pod.flag("--config"));
    let m = pod.mount_of(&config.display().to_string());
    assert_eq!(Path::new(&m.path), config.parent().unwrap());
    let cm: ConfigMap = one(&docs);
    assert_eq!(
        Some(&m.source),
        cm.metadata.name.clone().map(Source::ConfigMap).as_ref()
    );
    let key = config.file_name().unwrap().to_str().unwrap();
    assert!(cm.data.as_ref().is_some_and(|d| d.contains_key(key)));

    // /sys and /dev: the node's, read-only, where the flags say.
    for (flag_name, host) in [("--sys-root", "/sys"), ("--dev-root", "/dev")] {
        let root = pod.flag(flag_name);
        let m = pod.mount_of(&root);
        assert_eq!(
            (m.path.as_str(), m.host_path()),
            (root.as_str(), Some(host))
        );
        assert!(m.read_only, "{host} is mounted read-only");
    }
    // kubelet's plugin dir, writable, at its standard place.
    let plugins = pod.flag("--plugin-dir");
    let m = pod.mount_of(&plugins);
    assert_eq!(m.path, plugins);
    assert_eq!(m.host_path(), Some(wdp_kubelet::DEFAULT_PLUGIN_DIR));
    assert!(!m.read_only);

    // The caches: on the writable emptyDir.
    let loaded = load_as_in_the_image(&config_yaml(&docs), &tempfile::tempdir().unwrap());
    for cache in [
        PathBuf::from(pod.flag("--compile-cache")),
        loaded.oci.cache_dir.clone(),
    ] {
        let m = pod.mount_of(&cache.display().to_string());
        assert!(
            m.source == Source::EmptyDir && !m.read_only,
            "{}",
            cache.display()
        );
    }
    // CDI specs: written where the node's runtime reads them.
    let mut cdi_dirs = 0;
    for s in &loaded.scanners {
        let Some(cdi) = &s.cdi else { continue };
        let dir = cdi.dir.display().to_string();
        let m = pod.mount_of(&dir);
        assert_eq!(m.path, dir, "scanner {}: the CDI dir itself", s.name);
        assert!(matches!(m.host_path(), Some("/var/run/cdi" | "/etc/cdi")));
        assert!(!m.read_only);
        cdi_dirs += 1;
    }
    assert!(cdi_dirs > 0, "the CDI mount is used");
}

#[test]
fn probes_scrape_annotations_and_metrics_addr_agree() {
    let docs = rendered();
    let ds: DaemonSet = one(&docs);
    let c = the_container(&ds);
    let addr: std::net::SocketAddr = pod_of(&ds)
        .flag("--metrics-addr")
        .parse()
        .expect("--metrics-addr is an address");
    assert!(
        addr.ip().is_unspecified(),
        "kubelet probes and Prometheus reach the pod's address"
    );
    let port = i32::from(addr.port());
    let resolve = |p: &IntOrString| match p {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => {
            c.ports
                .iter()
                .flatten()
                .find(|cp| cp.name.as_deref() == Some(name))
                .unwrap_or_else(|| panic!("no container port named {name}"))
                .container_port
        }
    };
    let probes = [
        ("liveness", &c.liveness_probe, "/healthz"),
        ("readiness", &c.readiness_probe, "/readyz"),
    ];
    for (what, probe, path) in probes {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .unwrap_or_else(|| panic!("a {what} probe over HTTP"));
        assert_eq!(resolve(&get.port), port, "{what} probe port");
        assert_eq!(get.path.as_deref(), Some(path), "{what} probe path");
    }
    let annotations = ds
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], port.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
}

#[test]
fn the_memory_limit_covers_the_host_and_every_guest_limit() {
    let docs = rendered();
    let ds: DaemonSet = one(&docs);
    let resources = the_container(&ds)
        .resources
        .as_ref()
        .expect("resources are set");
    let quantity = |map: &Option<BTreeMap<String, _>>, what: &str| {
        let q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity = map
            .as_ref()
            .and_then(|m| m.get("memory"))
            .unwrap_or_else(|| panic!("no memory {what}"));
        wdp::units::parse_size(&q.0).unwrap_or_else(|e| panic!("memory {what}: {e}"))
    };
    let limit = quantity(&resources.limits, "limit");
    let request = quantity(&resources.requests, "request");
    let config = load_as_in_the_image(&config_yaml(&docs), &tempfile::tempdir().unwrap());
    // What the host may hold for each scanner, in times its memory limit (the bound of
    // docs/src/security/output-policy.md).
    let held = |s: &wdp::config::ScannerConfig| {
        let cdi = s
            .cdi
            .as_ref()
            .map_or(0, |_| wdp::footprint::CDI_HELD_PER_SCANNER);
        (wdp::footprint::HELD_PER_SCANNER + cdi) * s.limits.memory
    };
    let guests: u64 = config.scanners.iter().map(held).sum();
    assert!(
        limit >= MEASURED_FIRST_START_BYTES + guests,
        "a memory limit of {limit} bytes does not cover the host's first start ({MEASURED_FIRST_START_BYTES}) and what it may hold for its guests ({guests})"
    );
    assert!(request <= limit);
}

// ---------------------------------------------------------------------------------------------
// The ConfigMap's config

pub(crate) fn config_yaml(docs: &[Doc]) -> String {
    let cm: ConfigMap = one(docs);
    cm.data
        .and_then(|mut d| d.remove("wdp.yaml"))
        .expect("the ConfigMap has wdp.yaml")
}

/// The config with each in-image component (`/usr/lib/wdp/scanners/X.wasm`) replaced by the same
/// guest built here (`target/guests/wasm32-wasip2/release/X.wasm`).
pub(crate) fn with_built_components(yaml: &str) -> serde_yaml_ng::Value {
    let mut config: serde_yaml_ng::Value = serde_yaml_ng::from_str(yaml).expect("config is YAML");
    let scanners = config
        .get_mut("scanners")
        .and_then(|s| s.as_sequence_mut())
        .expect("scanners list");
    for s in scanners {
        let s = s.as_mapping_mut().expect("a scanner is a map");
        for key in ["component", "post-allocator"] {
            let Some(value) = s.get_mut(key) else {
                continue;
            };
            let path = value.as_str().expect("a path").to_string();
            let name = path
                .strip_prefix(IMAGE_SCANNERS)
                .and_then(|n| n.strip_suffix(".wasm"))
                .unwrap_or_else(|| panic!("{key} {path:?} is not in {IMAGE_SCANNERS}"));
            *value = wdp_tests::guest(name).display().to_string().into();
        }
    }
    config
}

/// Loads the config as `wdp run` will in the image, with the built components in place.
fn load_as_in_the_image(yaml: &str, dir: &tempfile::TempDir) -> wdp::config::Config {
    let config = with_built_components(yaml);
    let path = dir.path().join("wdp.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    wdp::config::load(&path).unwrap_or_else(|e| panic!("the ConfigMap's config: {e}"))
}

#[test]
fn the_configmap_config_is_one_wdp_accepts() {
    let docs = rendered();
    let yaml = config_yaml(&docs);
    let dir = tempfile::tempdir().unwrap();
    let config = load_as_in_the_image(&yaml, &dir);
    assert!(!config.scanners.is_empty());
    // The config's own paths exist nowhere here: loading it unchanged fails on the first
    // component, naming it (so the substitution above is what made it load).
    let path = dir.path().join("as-is.yaml");
    std::fs::write(&path, &yaml).unwrap();
    let err = wdp::config::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("scanners[0].component") && err.contains(IMAGE_SCANNERS),
        "{err}"
    );
}

// ---------------------------------------------------------------------------------------------
// The Containerfile and scripts/image.sh

/// A Containerfile's instructions as (keyword, rest): comments dropped, continuation lines joined.
fn instructions(text: &str) -> Vec<(String, String)> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(start) => {
                current.push_str(start);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    logical
        .into_iter()
        .map(|line| {
            let (op, rest) = line.split_once(' ').unwrap_or((&line, ""));
            (op.to_ascii_uppercase(), rest.trim().to_string())
        })
        .collect()
}

/// The bundled scanners: the guest workspace's members, less the SDK and the test guests.
fn bundled_scanners() -> BTreeSet<String> {
    let manifest = read("guest-scanners/Cargo.toml");
    let members = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("members = ["))
        .expect("guest-scanners/Cargo.toml lists its members on one line");
    members
        .split(',')
        .map(|m| m.trim().trim_end_matches(']').trim().trim_matches('"'))
        .filter(|m| !m.is_empty() && *m != "sdk" && !m.starts_with("test-guests/"))
        .map(String::from)
        .collect()
}

/// Every component path under `/usr/lib/wdp/` that `text` names, commented examples included
/// (a placeholder such as `<name>.wasm` is not a path).
fn image_paths_in(text: &str) -> BTreeSet<String> {
    text.match_indices("/usr/lib/wdp/")
        .map(|(at, _)| {
            let rest = &text[at..];
            let end = rest
                .find(|c: char| c.is_whitespace() || "`\"',)}]".contains(c))
                .unwrap_or(rest.len());
            rest[..end].to_string()
        })
        .filter(|p| p.ends_with(".wasm") && !p.contains('<'))
        .collect()
}

/// What the image holds and what runs it agree, as far as text can tell: tests/tests/image.rs
/// builds the image and runs it as the DaemonSet does, which proves the rest (the libraries, the
/// entrypoint, the ConfigMap's components loading from their image paths). This checks what one
/// run cannot: that the scanners staged are exactly the bundled ones, and that every image path
/// the manifests and the book's pages name, commented examples included, is one the image
/// installs.
#[test]
fn the_image_installs_what_the_manifests_and_the_book_name() {
    let file = instructions(&read("Containerfile"));
    let script = read("scripts/image.sh");

    // Built from nothing a registry would have to provide.
    let froms: Vec<&str> = file
        .iter()
        .filter(|(op, _)| op == "FROM")
        .map(|(_, rest)| rest.as_str())
        .collect();
    assert_eq!(froms, ["scratch"]);

    // Every COPY source is a path the script stages in its context.
    let mut installed = BTreeMap::new();
    for (_, rest) in file.iter().filter(|(op, _)| op == "COPY") {
        let words: Vec<&str> = rest.split_whitespace().collect();
        let [src, dest] = words[..] else {
            panic!("COPY {rest}: one source and one destination")
        };
        assert!(
            script.contains(&format!("\"$context/{}", src.trim_end_matches('/'))),
            "COPY {src}: scripts/image.sh stages no $context/{src}"
        );
        installed.insert(src.to_string(), dest.to_string());
    }
    assert_eq!(
        installed.get("wdp").map(String::as_str),
        Some("/usr/bin/wdp")
    );
    assert_eq!(
        installed.get("scanners/").map(String::as_str),
        Some(IMAGE_SCANNERS)
    );
    // The bundled scanners precompiled, where `wdp run --precompiled` looks by default.
    assert_eq!(
        installed.get("compiled/").map(String::as_str),
        Some("/usr/lib/wdp/compiled/")
    );

    // The scanners staged are the bundled ones.
    let staged: BTreeSet<String> = script
        .lines()
        .find_map(|l| l.strip_prefix("scanners=\""))
        .and_then(|l| l.strip_suffix('"'))
        .expect("scripts/image.sh: scanners=\"...\" on one line")
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(
        staged,
        bundled_scanners(),
        "the image has every bundled scanner"
    );
    let in_image: BTreeSet<String> = staged
        .iter()
        .map(|name| format!("{IMAGE_SCANNERS}{name}.wasm"))
        .collect();

    // What the manifests run and name, and the book's examples, are in the image.
    let docs = rendered();
    let ds: DaemonSet = one(&docs);
    let c = the_container(&ds);
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/bin/wdp".to_string()][..])
    );
    let entrypoint = file
        .iter()
        .find(|(op, _)| op == "ENTRYPOINT")
        .expect("ENTRYPOINT");
    let entrypoint: Vec<String> = serde_json::from_str(&entrypoint.1).expect("exec form");
    assert_eq!(Some(&entrypoint[..]), c.command.as_deref());
    let book: String = wdp_tests::book::pages()
        .iter()
        .map(|page| read(&page.to_string_lossy()))
        .collect();
    for (source, text) in [
        ("deploy/configmap.yaml", read("deploy/configmap.yaml")),
        ("the book", book),
    ] {
        let named = image_paths_in(&text);
        assert!(!named.is_empty(), "{source} names no scanner in the image");
        let missing: Vec<&String> = named.difference(&in_image).collect();
        assert!(
            missing.is_empty(),
            "{source} names {missing:?}, not in the image"
        );
    }
    // The image the kustomization names is this version's (`make image` tags it so).
    let image = c.image.as_deref().unwrap_or_default();
    assert_eq!(
        split_image(image).1,
        Some(env!("CARGO_PKG_VERSION")),
        "{image}"
    );
    assert!(read("Makefile").contains("--tag localhost/wdp:$(VERSION)"));
}

/// The version of `name` in a Cargo.lock's text (its first entry).
fn locked(lock: &str, name: &str) -> String {
    let entry = format!("name = \"{name}\"\nversion = \"");
    let at = lock
        .find(&entry)
        .unwrap_or_else(|| panic!("{name} is not in Cargo.lock"));
    let rest = &lock[at + entry.len()..];
    rest[..rest.find('"').unwrap()].to_string()
}

/// What the image and every node run stays patchable: wasmtime on its 48 LTS line with patch
/// releases allowed (`~48.0.8`, not `=`), the guest toolchains' WASI adapter taken from the
/// locked wasmtime, an oci-client that does not log registry tokens (0.18), and `make audit`.
#[test]
fn dependencies_take_patch_releases_and_can_be_audited() {
    let manifest = read("Cargo.toml");
    for name in ["wasmtime", "wasmtime-wasi"] {
        let line = manifest
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("{name} is not a workspace dependency"));
        assert!(line.contains("version = \"~48.0."), "{line}");
    }
    let lock = read("Cargo.lock");
    for name in ["wasmtime", "wasmtime-wasi"] {
        assert!(locked(&lock, name).starts_with("48.0."), "{name}");
    }
    let oci = locked(&lock, "oci-client");
    let minor: u32 = oci.split('.').nth(1).unwrap().parse().unwrap();
    assert!(oci.starts_with("0.") && minor >= 18, "oci-client {oci}");
    let setup = read("scripts/setup-toolchains.sh");
    assert!(
        setup.contains("ADAPTER_VERSION=$(awk") && setup.contains("Cargo.lock"),
        "the adapter version follows Cargo.lock"
    );
    let make = read("Makefile");
    assert!(make.contains("\naudit:\n") && make.contains("$(CARGO) audit"));
}

// ---------------------------------------------------------------------------------------------
// DRA mode: the overlay deploy/dra/

/// The keys of deploy/dra/kustomization.yaml this renderer implements.
const OVERLAY_KEYS: [&str; 4] = ["apiVersion", "kind", "resources", "patches"];

/// Applies one RFC 6902 operation (`add`, `replace`, `remove`: what the overlay uses) to `doc`.
fn json_patch_op(doc: &mut Value, op: &Value) -> Result<(), String> {
    let path = op["path"].as_str().ok_or("a patch op without a path")?;
    let (parent, last) = path.rsplit_once('/').ok_or("a path without '/'")?;
    let target = doc
        .pointer_mut(parent)
        .ok_or_else(|| format!("{path}: no {parent}"))?;
    let value = op.get("value").cloned();
    match (op["op"].as_str(), target) {
        (Some("add"), Value::Array(list)) => {
            let value = value.ok_or("add without value")?;
            match last {
                "-" => list.push(value),
                i => list.insert(i.parse().map_err(|_| format!("{path}: index"))?, value),
            }
        }
        (Some("add"), Value::Object(map)) => {
            map.insert(last.to_string(), value.ok_or("add without value")?);
        }
        (Some("replace"), Value::Object(map)) if map.contains_key(last) => {
            map.insert(last.to_string(), value.ok_or("replace without value")?);
        }
        (Some("remove"), Value::Object(map)) if map.contains_key(last) => {
            map.remove(last);
        }
        (op, _) => return Err(format!("{path}: op {op:?} not applicable here")),
    }
    Ok(())
}

/// Renders the base `base` with the Component `dir` as `kubectl kustomize` does for the keys
/// used: the base's objects and the Component's resources, then each JSON patch of the
/// Component on the object its target names.
pub(crate) fn render_with_component(base: &Path, dir: &Path) -> Result<Vec<Doc>, String> {
    let text = std::fs::read_to_string(dir.join("kustomization.yaml"))
        .map_err(|e| format!("kustomization.yaml: {e}"))?;
    let k: Value = serde_yaml_ng::from_str(&text).map_err(|e| e.to_string())?;
    for key in k.as_object().ok_or("not a map")?.keys() {
        if !OVERLAY_KEYS.contains(&key.as_str()) {
            return Err(format!("key {key:?} is not rendered by this test"));
        }
    }
    if k["apiVersion"] != "kustomize.config.k8s.io/v1alpha1" || k["kind"] != "Component" {
        return Err("not a kustomize.config.k8s.io/v1alpha1 Component".into());
    }
    let mut docs = render(base)?;
    for r in k["resources"].as_array().ok_or("no resources")? {
        let file = r.as_str().ok_or("a resource is not a string")?;
        if file.contains('/') {
            return Err(format!(
                "resource {file:?}: only files beside the kustomization"
            ));
        }
        let text = std::fs::read_to_string(dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        for value in yaml_documents(&text).map_err(|e| format!("{file}: {e}"))? {
            docs.push(Doc {
                file: format!("dra/{file}"),
                value,
            });
        }
    }
    for patch in k["patches"].as_array().into_iter().flatten() {
        let target = &patch["target"];
        let file = patch["path"].as_str().ok_or("a patch without a path")?;
        for key in target.as_object().ok_or("a patch without a target")?.keys() {
            if !["kind", "name"].contains(&key.as_str()) {
                return Err(format!(
                    "patch target key {key:?} is not rendered by this test"
                ));
            }
        }
        let text = std::fs::read_to_string(dir.join(file)).map_err(|e| format!("{file}: {e}"))?;
        let ops: Value = serde_yaml_ng::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
        let mut hits = 0;
        for doc in docs.iter_mut().filter(|d| {
            d.value["kind"] == target["kind"] && d.value["metadata"]["name"] == target["name"]
        }) {
            for op in ops.as_array().ok_or("a JSON patch is a list")? {
                json_patch_op(&mut doc.value, op).map_err(|e| format!("{file}: {e}"))?;
            }
            hits += 1;
        }
        if hits != 1 {
            return Err(format!("{file}: its target matches {hits} objects"));
        }
    }
    Ok(docs)
}

pub(crate) fn rendered_dra() -> Vec<Doc> {
    render_with_component(&repo().join("deploy"), &repo().join("deploy/dra"))
        .unwrap_or_else(|e| panic!("deploy/dra/: {e}"))
}

/// [`check_typed`], and the kinds only DRA mode uses.
fn check_typed_dra(doc: &Value) -> Result<(), String> {
    if is::<ClusterRole>(doc) {
        strict::<ClusterRole>(doc).map(drop)
    } else if is::<ClusterRoleBinding>(doc) {
        strict::<ClusterRoleBinding>(doc).map(drop)
    } else if is::<ValidatingAdmissionPolicy>(doc) {
        strict::<ValidatingAdmissionPolicy>(doc).map(drop)
    } else if is::<ValidatingAdmissionPolicyBinding>(doc) {
        strict::<ValidatingAdmissionPolicyBinding>(doc).map(drop)
    } else if is::<DeviceClass>(doc) {
        strict::<DeviceClass>(doc).map(drop)
    } else {
        check_typed(doc)
    }
}

/// Every object of type `T` in the rendering.
pub(crate) fn all<T: k8s_openapi::Resource + DeserializeOwned + Serialize>(docs: &[Doc]) -> Vec<T> {
    docs.iter()
        .filter(|d| is::<T>(&d.value))
        .map(|d| strict(&d.value).unwrap_or_else(|e| panic!("{}: {e}", d.file)))
        .collect()
}

#[test]
fn the_dra_overlay_is_typed_kubernetes_objects_without_unknown_fields() {
    let docs = rendered_dra();
    let kinds: BTreeSet<&str> = docs.iter().map(Doc::kind).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "DeviceClass",
            "Namespace",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ])
    );
    for doc in &docs {
        check_typed_dra(&doc.value).unwrap_or_else(|e| panic!("{}: {e}", doc.file));
    }
    let cluster_scoped = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "DeviceClass",
    ];
    for doc in &docs {
        let namespace = &doc.value["metadata"]["namespace"];
        if cluster_scoped.contains(&doc.kind()) {
            assert!(
                namespace.is_null(),
                "{} {} is cluster-scoped",
                doc.kind(),
                doc.name()
            );
        } else {
            assert_eq!(namespace, "wdp-system", "{} {}", doc.kind(), doc.name());
        }
    }
    // A misspelled field in an overlay file is caught like one in the base.
    let mut typo = docs
        .iter()
        .find(|d| d.kind() == "DeviceClass")
        .unwrap()
        .value
        .clone();
    let spec = typo["spec"].as_object_mut().unwrap();
    let v = spec.remove("extendedResourceName").unwrap();
    spec.insert("extendedResourceNmae".into(), v);
    assert_eq!(
        check_typed_dra(&typo).unwrap_err(),
        "unknown field spec.extendedResourceNmae"
    );
    // And the renderer refuses what it does not implement.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\nresources: []\ncomponents: []\n",
    )
    .unwrap();
    let base = repo().join("deploy");
    let err = render_with_component(&base, dir.path()).unwrap_err();
    assert!(err.contains("\"components\""), "{err}");
    // The base names the Component, commented out, as the DRA chapter of the book says.
    assert!(read("deploy/kustomization.yaml").contains("\n# components:\n#   - dra\n"));
}

/// The DRA pod is the device-plugin pod plus its account's token, NODE_NAME and kubelet's two
/// DRA directories, nothing else; the device-plugin mode keeps no token and no role.
#[test]
fn the_dra_pod_adds_only_a_token_the_node_name_and_kubelets_dra_dirs() {
    let base = rendered();
    let dra = rendered_dra();
    let base_ds: DaemonSet = one(&base);
    let ds: DaemonSet = one(&dra);
    let pod = pod_spec(&ds);

    // The device-plugin mode is unchanged: no token, the roleless account.
    assert_eq!(
        pod_spec(&base_ds).automount_service_account_token,
        Some(false)
    );
    assert_eq!(
        pod_spec(&base_ds).service_account_name.as_deref(),
        Some("wdp")
    );
    // DRA mode: a token of the account wdp-dra, rendered here.
    assert_eq!(pod.automount_service_account_token, Some(true));
    let accounts: Vec<ServiceAccount> = all(&dra);
    let names: BTreeSet<_> = accounts
        .iter()
        .filter_map(|a| a.metadata.name.as_deref())
        .collect();
    assert_eq!(names, BTreeSet::from(["wdp", "wdp-dra"]));
    assert_eq!(pod.service_account_name.as_deref(), Some("wdp-dra"));

    // NODE_NAME from the downward API (the config's default node name).
    let c = the_container(&ds);
    let node_name = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME is set");
    let field = node_name
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref());
    assert_eq!(field.map(|f| f.field_path.as_str()), Some("spec.nodeName"));

    // kubelet's DRA dirs: writable, at their host paths (wdp tells kubelet socket paths as it
    // sees them), Directory (kubelet makes them).
    let mut writable_host = BTreeSet::new();
    for m in c.volume_mounts.iter().flatten().filter(|m| writable(m)) {
        let v = volume_of(&ds, &m.name);
        if let Some(path) = host_path(v) {
            assert_eq!(m.mount_path, path);
            writable_host.insert(path.to_string());
        }
    }
    let mut expected: BTreeSet<String> =
        WRITABLE_HOST_PATHS.iter().map(|p| p.to_string()).collect();
    expected.extend([
        "/var/lib/kubelet/plugins".into(),
        "/var/lib/kubelet/plugins_registry".into(),
    ]);
    assert_eq!(writable_host, expected);
    // They are where `wdp run` looks when the config's `node:` does not say (the ConfigMap's
    // does not), and kubelet makes them.
    let dra_pod = pod_of(&ds);
    for dir in [
        wdp::config::DEFAULT_KUBELET_PLUGINS_DIR,
        wdp::config::DEFAULT_KUBELET_PLUGINS_REGISTRY_DIR,
    ] {
        let m = dra_pod.mount_of(dir);
        assert_eq!(m.path, dir);
        assert_eq!(
            volume_of(&ds, &m.volume)
                .host_path
                .as_ref()
                .and_then(|h| h.type_.as_deref()),
            Some("Directory")
        );
    }
    assert!(
        !config_yaml(&dra).contains("\nnode:"),
        "the ConfigMap keeps the default dirs"
    );

    // Nothing else differs: take the additions out again and the pods are equal.
    let mut stripped = serde_json::to_value(&ds).unwrap();
    let spec = stripped.pointer_mut("/spec/template/spec").unwrap();
    spec["serviceAccountName"] = "wdp".into();
    spec["automountServiceAccountToken"] = false.into();
    let keep = |list: &mut Value, key: &str, drop: &[&str]| {
        list.as_array_mut()
            .unwrap()
            .retain(|e| !drop.contains(&e[key].as_str().unwrap_or_default()));
    };
    keep(
        &mut spec["volumes"],
        "name",
        &["plugins", "plugins-registry"],
    );
    keep(
        &mut spec["containers"][0]["volumeMounts"],
        "name",
        &["plugins", "plugins-registry"],
    );
    keep(&mut spec["containers"][0]["env"], "name", &["NODE_NAME"]);
    assert_eq!(stripped, serde_json::to_value(&base_ds).unwrap());
}

#[test]
fn the_dra_rbac_grants_what_the_front_end_does_to_its_account_only() {
    let docs = rendered_dra();
    let [role]: [ClusterRole; 1] = all(&docs).try_into().expect("one ClusterRole");
    let rules: BTreeSet<(String, String, Vec<String>)> = role
        .rules
        .iter()
        .flatten()
        .flat_map(|r| {
            let groups = r.api_groups.clone().unwrap_or_default();
            let resources = r.resources.clone().unwrap_or_default();
            assert!(r.resource_names.is_none() && r.non_resource_urls.is_none());
            groups.into_iter().flat_map(move |g| {
                let verbs = r.verbs.clone();
                resources
                    .clone()
                    .into_iter()
                    .map(move |res| (g.clone(), res, verbs.clone()))
            })
        })
        .collect();
    let verbs = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        BTreeSet::from([
            (
                "resource.k8s.io".into(),
                "resourceslices".into(),
                verbs(&[
                    "get", "list", "watch", "create", "update", "patch", "delete"
                ])
            ),
            (
                "resource.k8s.io".into(),
                "resourceclaims".into(),
                verbs(&["get"])
            ),
            ("".into(), "nodes".into(), verbs(&["get"])),
        ])
    );
    let [binding]: [ClusterRoleBinding; 1] = all(&docs).try_into().expect("one binding");
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(Some(&binding.role_ref.name), role.metadata.name.as_ref());
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(
        (
            subjects[0].kind.as_str(),
            subjects[0].name.as_str(),
            subjects[0].namespace.as_deref()
        ),
        ("ServiceAccount", "wdp-dra", Some("wdp-system"))
    );
}

/// A CEL program of the Kubernetes dialect's optional syntax (`[?k]`, `.?f`, `orValue`).
fn cel_program(expression: &str) -> (cel::Program, std::sync::Arc<cel::Env>) {
    let env = std::sync::Arc::new(cel::Env::stdlib().with_optional_support(true));
    let program = env
        .compile(expression)
        .unwrap_or_else(|e| panic!("CEL {expression:?}: {e:?}"));
    (program, env)
}

/// The admission policy's variables and validations evaluated with CEL over admission requests
/// as the API server builds them: wdp on node-a may create, update and delete node-a's slices,
/// and nothing of node-b's, nor anything without a node claim or without spec.nodeName.
#[test]
fn the_admission_policy_holds_each_wdp_to_its_own_nodes_slices() {
    let docs = rendered_dra();
    let [policy]: [ValidatingAdmissionPolicy; 1] = all(&docs).try_into().expect("one policy");
    let [binding]: [ValidatingAdmissionPolicyBinding; 1] =
        all(&docs).try_into().expect("one binding");
    let binding = binding.spec;
    assert_eq!(Some(&binding.policy_name), policy.metadata.name.as_ref());
    assert_eq!(binding.validation_actions, ["Deny".to_string()]);
    let spec = policy.spec.expect("a policy spec");
    assert_eq!(spec.failure_policy.as_deref(), Some("Fail"));
    let rules = spec
        .match_constraints
        .and_then(|m| m.resource_rules)
        .unwrap_or_default();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        rules[0].api_groups.as_deref(),
        Some(&["resource.k8s.io".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["resourceslices".to_string()][..])
    );
    let ops: BTreeSet<_> = rules[0]
        .operations
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    assert_eq!(ops, BTreeSet::from(["CREATE", "DELETE", "UPDATE"]));

    // As the API server hands objects to CEL: an unset field is absent, not null.
    let slice = |node: Option<&str>| {
        let mut spec = serde_json::json!({"driver": "devices.wdp.dev", "pool": {"name": "p"}});
        if let Some(n) = node {
            spec["nodeName"] = n.into();
        }
        serde_json::json!({ "spec": spec })
    };
    let request = |user: &str, node: Option<&str>, op: &str| {
        let mut extra = serde_json::Map::new();
        if let Some(n) = node {
            extra.insert(
                "authentication.kubernetes.io/node-name".into(),
                serde_json::json!([n]),
            );
        }
        serde_json::json!({"operation": op, "userInfo": {"username": user, "extra": extra}})
    };
    let evaluate =
        |expression: &str, request: &Value, object: &Value, old: &Value, vars: &Value| {
            let (program, env) = cel_program(expression);
            let mut ctx = cel::Context::with_env(env);
            ctx.add_variable("request", request).unwrap();
            ctx.add_variable("object", object).unwrap();
            ctx.add_variable("oldObject", old).unwrap();
            ctx.add_variable("variables", vars).unwrap();
            program
                .execute(&ctx)
                .unwrap_or_else(|e| panic!("CEL {expression:?}: {e:?}"))
        };
    // Admitted: whether every validation holds (matchConditions decide whether it applies).
    let admitted = |request: Value, object: Value, old: Value| -> Option<bool> {
        let none = serde_json::json!({});
        for c in spec.match_conditions.iter().flatten() {
            if evaluate(&c.expression, &request, &object, &old, &none) != cel::Value::Bool(true) {
                return None;
            }
        }
        let mut vars = serde_json::Map::new();
        for v in spec.variables.iter().flatten() {
            let value = evaluate(
                &v.expression,
                &request,
                &object,
                &old,
                &Value::Object(vars.clone()),
            );
            let cel::Value::String(s) = value else {
                panic!("{}: {value:?}", v.name)
            };
            vars.insert(v.name.clone(), s.to_string().into());
        }
        let vars = Value::Object(vars);
        Some(spec.validations.iter().flatten().all(|v| {
            evaluate(&v.expression, &request, &object, &old, &vars) == cel::Value::Bool(true)
        }))
    };
    let wdp = "system:serviceaccount:wdp-system:wdp-dra";
    let null = Value::Null;
    for op in ["CREATE", "UPDATE"] {
        assert_eq!(
            admitted(
                request(wdp, Some("node-a"), op),
                slice(Some("node-a")),
                null.clone()
            ),
            Some(true),
            "{op}"
        );
        assert_eq!(
            admitted(
                request(wdp, Some("node-a"), op),
                slice(Some("node-b")),
                null.clone()
            ),
            Some(false),
            "{op}"
        );
        assert_eq!(
            admitted(request(wdp, Some("node-a"), op), slice(None), null.clone()),
            Some(false),
            "{op}"
        );
        assert_eq!(
            admitted(request(wdp, None, op), slice(Some("node-a")), null.clone()),
            Some(false),
            "{op}"
        );
    }
    // A delete is judged by the slice deleted.
    assert_eq!(
        admitted(
            request(wdp, Some("node-a"), "DELETE"),
            null.clone(),
            slice(Some("node-a"))
        ),
        Some(true)
    );
    assert_eq!(
        admitted(
            request(wdp, Some("node-a"), "DELETE"),
            null.clone(),
            slice(Some("node-b"))
        ),
        Some(false)
    );
    // Others (kubelet wiping slices, the scheduler) are not held to it.
    assert_eq!(
        admitted(
            request("system:node:node-a", Some("node-a"), "DELETE"),
            null.clone(),
            slice(Some("node-b"))
        ),
        None
    );
    // The policy names the account the pod runs as.
    let ds: DaemonSet = one(&docs);
    assert_eq!(
        pod_spec(&ds)
            .service_account_name
            .as_deref()
            .map(|sa| format!("system:serviceaccount:wdp-system:{sa}")),
        Some(wdp.to_string())
    );
}

/// A device of a slice as DRA's CEL sees it: `device.driver`, `device.attributes[domain][name]`
/// (an unqualified attribute in the driver's domain), `device.capacity`.
fn cel_device(driver: &str, device: &k8s_openapi::api::resource::v1::Device) -> Value {
    let mut domains: BTreeMap<String, serde_json::Map<String, Value>> = BTreeMap::new();
    for (name, value) in device.attributes.iter().flatten() {
        let (domain, id) = name.split_once('/').unwrap_or((driver, name));
        let value = if let Some(s) = &value.string {
            s.clone().into()
        } else if let Some(i) = value.int {
            i.into()
        } else if let Some(b) = value.bool {
            b.into()
        } else {
            value.version.clone().into()
        };
        domains
            .entry(domain.to_string())
            .or_default()
            .insert(id.to_string(), value);
    }
    serde_json::json!({"driver": driver, "attributes": domains, "capacity": {}})
}

/// Every DeviceClass bridges one type the ConfigMap's scanners serve, and every such type has
/// one: the types are what the scanners report over a fixture with their devices, and each
/// class's selector, evaluated with CEL, picks exactly its type's devices from the slices wdp-dra
/// builds from those trees (with the driver a scanner would have in DRA mode).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_device_class_bridges_one_served_type_and_selects_its_devices() {
    let docs = rendered_dra();
    let config = load_as_in_the_image(&config_yaml(&docs), &tempfile::tempdir().unwrap());
    let f = Fixture::new();
    configmap_devices(&f);
    let sandbox = wdp_tests::sandbox(&f);
    // (extended resource name, driver, device name) of every published device.
    let mut published: Vec<(String, String, String, Value)> = Vec::new();
    for s in &config.scanners {
        let wdp::config::ComponentSource::File(path) = &s.component else {
            panic!("{}: a file component", s.name)
        };
        let name = path.file_stem().unwrap().to_str().unwrap();
        let env: Vec<(&str, &str)> = s
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut running = wdp_tests::run_guest(
            &sandbox,
            name,
            &env,
            Default::default(),
            wdp::scanner::RestartPolicy::Never,
        )
        .await;
        let tree = running.next_tree().await;
        let driver = s
            .dra
            .as_ref()
            .map_or(s.namespace.clone(), |d| d.driver.clone());
        let pool = wdp_dra::seam::Pool {
            name: "node-a".into(),
            node_name: "node-a".into(),
            devices: tree
                .0
                .iter()
                .flat_map(|(dev_type, group)| {
                    group.keys().map(move |id| wdp_dra::seam::Device {
                        id: id.clone(),
                        dev_type: dev_type.clone(),
                        healthy: true,
                        ..Default::default()
                    })
                })
                .collect(),
        };
        assert!(
            !pool.devices.is_empty(),
            "{}: no device over the fixture",
            s.name
        );
        let slices: Vec<ResourceSlice> = wdp_dra::slices::pool_slices(&driver, &pool, 0);
        for slice in &slices {
            assert_eq!(
                wdp_dra::apiserver::standin::validate(slice),
                Vec::<String>::new()
            );
            for device in slice.spec.devices.iter().flatten() {
                let dev_type = device.attributes.as_ref().unwrap()[wdp_dra::slices::ATTR_TYPE]
                    .string
                    .clone()
                    .unwrap();
                published.push((
                    format!("{}/{dev_type}", s.namespace),
                    driver.clone(),
                    device.name.clone(),
                    cel_device(&driver, device),
                ));
            }
        }
    }
    let served: BTreeSet<&str> = published.iter().map(|p| p.0.as_str()).collect();
    let classes: Vec<DeviceClass> = all(&docs);
    let bridged: BTreeSet<&str> = classes
        .iter()
        .map(|c| {
            let spec = c.spec.as_ref().expect("a DeviceClass spec");
            spec.extended_resource_name
                .as_deref()
                .expect("extendedResourceName")
        })
        .collect();
    assert_eq!(bridged, served, "one DeviceClass per served type");
    assert_eq!(bridged.len(), classes.len(), "no type bridged twice");
    for class in &classes {
        let spec = class.spec.as_ref().unwrap();
        let resource = spec.extended_resource_name.as_deref().unwrap();
        let (namespace, dev_type) = resource.split_once('/').unwrap();
        assert_eq!(
            class.metadata.name.as_deref(),
            Some(format!("{dev_type}.{namespace}").as_str()),
            "named after its type"
        );
        let selectors = spec.selectors.as_deref().unwrap_or_default();
        assert_eq!(selectors.len(), 1, "{resource}");
        let expression = &selectors[0]
            .cel
            .as_ref()
            .expect("a CEL selector")
            .expression;
        let (program, env) = cel_program(expression);
        let mut picked = BTreeSet::new();
        for (r, _, name, device) in &published {
            let mut ctx = cel::Context::with_env(env.clone());
            ctx.add_variable("device", device).unwrap();
            match program.execute(&ctx) {
                Ok(cel::Value::Bool(true)) => {
                    picked.insert((r.as_str(), name.as_str()));
                }
                Ok(cel::Value::Bool(false)) => {}
                other => panic!("{resource}: {expression:?} on {device}: {other:?}"),
            }
        }
        let want: BTreeSet<(&str, &str)> = published
            .iter()
            .filter(|p| p.0 == resource)
            .map(|p| (p.0.as_str(), p.2.as_str()))
            .collect();
        assert!(!want.is_empty());
        let wrong: Vec<_> = picked.symmetric_difference(&want).take(5).collect();
        assert!(
            wrong.is_empty(),
            "{resource}: {expression} picks {} devices, {} are of its type; some differences: {wrong:?}",
            picked.len(),
            want.len()
        );
    }
}

/// As [`kubectl_kustomize_renders_the_same_objects`], for deploy/ with the DRA Component, as a
/// kustomization of one's own includes them.
#[test]
fn kubectl_kustomize_renders_the_dra_component_the_same() {
    // kustomize takes only relative paths: the kustomization goes beside deploy/ (in target/).
    let dir = tempfile::tempdir_in(repo().join("target")).unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [../../deploy]\ncomponents: [../../deploy/dra]\n",
    )
    .unwrap();
    compare_with_kubectl(dir.path(), rendered_dra());
}
