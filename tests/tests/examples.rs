//! `examples/`, checked without a cluster: every file is parsed into the typed Kubernetes API
//! (k8s-openapi) and must survive the round trip unchanged (no unknown or misspelled field, as
//! deploy.rs checks deploy/); the names the workloads use are ones deploy/ serves (a
//! device-plugin resource of a scanner in deploy/'s ConfigMap, a DeviceClass of deploy/dra/, an
//! extended resource a DeviceClass bridges and the mixed node serves through DRA); and the mixed
//! node's config is one wdp's config parser accepts, replacing deploy/'s ConfigMap by name.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use wdp_tests::repo;

use crate::deploy::{Doc, all, config_yaml, rendered, rendered_dra, strict, with_built_components};

/// Every document of every `examples/*.yaml`, by file.
fn examples() -> Vec<Doc> {
    let dir = repo().join("examples");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for path in files {
        let file = format!("examples/{}", path.file_name().unwrap().to_string_lossy());
        let text = std::fs::read_to_string(&path).unwrap();
        let values = crate::deploy::yaml_documents(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(!values.is_empty(), "{file}: no document");
        docs.extend(values.into_iter().map(|value| Doc {
            file: file.clone(),
            value,
        }));
    }
    docs
}

/// The documents of one example file.
fn file(docs: &[Doc], name: &str) -> Vec<Doc> {
    let found: Vec<Doc> = docs
        .iter()
        .filter(|d| d.file == format!("examples/{name}"))
        .cloned()
        .collect();
    assert!(!found.is_empty(), "examples/{name} is missing");
    found
}

/// Extended resources a pod's containers ask for (`<namespace>/<name>` in their limits).
fn extended_resources(pod: &Pod) -> BTreeSet<String> {
    let spec = pod.spec.as_ref().expect("a pod spec");
    spec.containers
        .iter()
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref())
        .flat_map(|l| l.keys())
        .filter(|k| k.contains('/'))
        .cloned()
        .collect()
}

/// The scanners of a config text: name -> (namespace, `frontend`, DRA driver: `dra.driver`, by
/// default the namespace).
fn scanners(config: &str) -> BTreeMap<String, (String, String, String)> {
    let value: serde_yaml_ng::Value = serde_yaml_ng::from_str(config).expect("a YAML config");
    value["scanners"]
        .as_sequence()
        .expect("a scanners list")
        .iter()
        .map(|s| {
            let text = |k: &str| s[k].as_str().map(str::to_string);
            let namespace = text("namespace").expect("a namespace");
            let driver = s["dra"]["driver"]
                .as_str()
                .map_or_else(|| namespace.clone(), str::to_string);
            (
                text("name").expect("a name"),
                (
                    namespace,
                    text("frontend").unwrap_or_else(|| "device-plugin".into()),
                    driver,
                ),
            )
        })
        .collect()
}

#[test]
fn every_example_is_a_typed_kubernetes_object_without_unknown_fields() {
    let docs = examples();
    for doc in &docs {
        let typed = match (doc.value["apiVersion"].as_str(), doc.kind()) {
            (Some("v1"), "Pod") => strict::<Pod>(&doc.value).map(drop),
            (Some("v1"), "ConfigMap") => strict::<ConfigMap>(&doc.value).map(drop),
            (Some("resource.k8s.io/v1"), "ResourceClaim") => {
                strict::<ResourceClaim>(&doc.value).map(drop)
            }
            (v, k) => Err(format!(
                "{v:?} {k}: no typed check for this kind: add it here"
            )),
        };
        typed.unwrap_or_else(|e| panic!("{} {}: {e}", doc.file, doc.name()));
    }
    let names: Vec<(&str, &str)> = docs.iter().map(|d| (d.kind(), d.name())).collect();
    let unique: BTreeSet<&(&str, &str)> = names.iter().collect();
    assert_eq!(
        unique.len(),
        names.len(),
        "two examples of one kind share a name: {names:?}"
    );
}

#[test]
fn the_device_plugin_pod_asks_for_what_deploy_serves() {
    let docs = examples();
    let deploy = rendered();
    let pods: Vec<Pod> = all(&file(&docs, "device-plugin-pod.yaml"));
    let [pod] = &pods[..] else { panic!("one pod") };
    let wanted = extended_resources(pod);
    assert!(!wanted.is_empty(), "the pod asks for no device");
    // Served by deploy/'s ConfigMap through the device-plugin front-end: the namespace is a
    // device-plugin scanner's, and the name one its DeviceClass bridges (deploy.rs checks that
    // the DeviceClasses name exactly the types the ConfigMap's scanners serve).
    let served = scanners(&config_yaml(&deploy));
    let classes: Vec<DeviceClass> = all(&rendered_dra());
    let bridged: BTreeSet<String> = classes
        .iter()
        .filter_map(|c| c.spec.as_ref()?.extended_resource_name.clone())
        .collect();
    for resource in &wanted {
        let namespace = resource.split('/').next().unwrap();
        assert!(
            served
                .values()
                .any(|(ns, frontend, _)| ns == namespace && frontend == "device-plugin"),
            "{resource}: no device-plugin scanner of deploy/configmap.yaml has namespace {namespace}"
        );
        assert!(
            bridged.contains(resource),
            "{resource}: not a type deploy/ serves"
        );
    }
}

#[test]
fn the_dra_examples_use_deploys_classes_on_the_mixed_node() {
    let docs = examples();
    let classes: BTreeMap<String, DeviceClass> = all::<DeviceClass>(&rendered_dra())
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c))
        .collect();
    let mixed_docs = file(&docs, "mixed-node-configmap.yaml");
    let mixed: ConfigMap = all(&mixed_docs).pop().expect("the mixed node's ConfigMap");
    let mixed = mixed
        .data
        .and_then(|mut d| d.remove("wdp.yaml"))
        .expect("wdp.yaml");
    let mixed = scanners(&mixed);
    // The DRA drivers of the mixed node.
    let drivers: BTreeSet<&str> = mixed
        .values()
        .filter(|(_, f, _)| f == "dra")
        .map(|(_, _, driver)| driver.as_str())
        .collect();
    let class_on_mixed_node = |name: &str| {
        let class = classes
            .get(name)
            .unwrap_or_else(|| panic!("DeviceClass {name} is not in deploy/dra/"));
        let cel = &class.spec.as_ref().unwrap().selectors.as_ref().unwrap()[0]
            .cel
            .as_ref()
            .unwrap()
            .expression;
        assert!(
            drivers
                .iter()
                .any(|d| cel.contains(&format!("device.driver == \"{d}\""))),
            "DeviceClass {name} selects a driver the mixed node does not run through DRA: {cel}"
        );
        class
    };

    // The claim and the pod that uses it.
    let claim_docs = file(&docs, "dra-claim.yaml");
    let claims: Vec<ResourceClaim> = all(&claim_docs);
    let [claim] = &claims[..] else {
        panic!("one ResourceClaim")
    };
    let requests = &claim
        .spec
        .as_ref()
        .unwrap()
        .devices
        .as_ref()
        .unwrap()
        .requests;
    let requests = requests.as_ref().expect("requests");
    assert!(!requests.is_empty());
    for r in requests {
        let exactly = r.exactly.as_ref().expect("an exact request");
        class_on_mixed_node(&exactly.device_class_name);
    }
    let pods: Vec<Pod> = all(&claim_docs);
    let [pod] = &pods[..] else { panic!("one pod") };
    let spec = pod.spec.as_ref().unwrap();
    let pod_claims: BTreeMap<&str, Option<&str>> = spec
        .resource_claims
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.resource_claim_name.as_deref()))
        .collect();
    assert_eq!(
        pod_claims.values().copied().collect::<Vec<_>>(),
        [claim.metadata.name.as_deref()],
        "the pod uses the example's claim"
    );
    for c in &spec.containers {
        for used in c.resources.iter().flat_map(|r| r.claims.iter().flatten()) {
            assert!(
                pod_claims.contains_key(used.name.as_str()),
                "container {} uses claim {}, which the pod does not list",
                c.name,
                used.name
            );
        }
    }
    assert!(
        spec.containers
            .iter()
            .any(|c| c.resources.as_ref().is_some_and(|r| r.claims.is_some())),
        "no container uses the claim"
    );

    // The extended-resource pod: each resource is bridged by a class of a DRA driver there.
    let pods: Vec<Pod> = all(&file(&docs, "dra-extended-resource-pod.yaml"));
    let [pod] = &pods[..] else { panic!("one pod") };
    let wanted = extended_resources(pod);
    assert!(!wanted.is_empty(), "the pod asks for no extended resource");
    for resource in &wanted {
        let (name, _) = classes
            .iter()
            .find(|(_, c)| {
                c.spec
                    .as_ref()
                    .and_then(|s| s.extended_resource_name.as_deref())
                    == Some(resource.as_str())
            })
            .unwrap_or_else(|| panic!("{resource}: no DeviceClass of deploy/dra/ bridges it"));
        class_on_mixed_node(name);
    }
}

#[test]
fn the_mixed_node_config_replaces_deploys_and_wdp_accepts_it() {
    let docs = examples();
    let cms: Vec<ConfigMap> = all(&file(&docs, "mixed-node-configmap.yaml"));
    let [cm] = &cms[..] else {
        panic!("one ConfigMap")
    };
    // Applied over deploy/'s ConfigMap: the same object.
    let deploy_cm: ConfigMap = all(&rendered()).pop().expect("deploy/'s ConfigMap");
    assert_eq!(cm.metadata.name, deploy_cm.metadata.name);
    assert_eq!(cm.metadata.namespace, deploy_cm.metadata.namespace);
    let yaml = cm
        .data
        .as_ref()
        .and_then(|d| d.get("wdp.yaml"))
        .expect("wdp.yaml");
    let frontends: BTreeSet<String> = scanners(yaml).into_values().map(|(_, f, _)| f).collect();
    assert_eq!(
        frontends,
        BTreeSet::from(["device-plugin".to_string(), "dra".to_string()]),
        "a mixed node serves through both front-ends"
    );

    // Parsed as `wdp run` parses it in the image: the components are the ones built here, and
    // the node's name, which the DaemonSet gives as NODE_NAME, is set in the file.
    let mut config = with_built_components(yaml);
    config.as_mapping_mut().unwrap().insert(
        "node".into(),
        serde_yaml_ng::from_str("{name: node-1}").unwrap(),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wdp.yaml");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    let parsed = wdp::config::load(&path)
        .unwrap_or_else(|e| panic!("examples/mixed-node-configmap.yaml: {e}"));
    let dra: Vec<&str> = parsed
        .scanners
        .iter()
        .filter(|s| s.dra.is_some())
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(dra, ["kvm"], "kvm is the scanner served through DRA");
}
