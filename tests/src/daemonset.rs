//! The pod of deploy/'s DaemonSet, as kubelet would start wdp from it: the command, arguments,
//! environment, volume mounts and what backs each, probes, limits and the security settings; and
//! the device nodes its ConfigMap's scanners serve ([`configmap_devices`]).
//!
//! Read here once for every test that runs or checks what the DaemonSet runs (the manifest
//! checks, the image's podman run), so they all read the same fields the same way and a field
//! the manifest moves or renames breaks one reader, not several. Manifest text is the tests' own
//! input: a field that is missing or of the wrong type panics with its name.

use std::path::Path;

use serde_json::Value;

use crate::fixture::Fixture;

/// The DaemonSet's pod, its one container's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Pod {
    /// The container's `command`.
    pub command: Vec<String>,
    /// The container's `args` (`run` and its flags).
    pub args: Vec<String>,
    /// The container's environment given as values, name and value (`valueFrom` entries, which
    /// only kubelet can resolve, are left out).
    pub env: Vec<(String, String)>,
    /// Each volume mount, with the volume behind it.
    pub mounts: Vec<Mount>,
    /// The path of the HTTP readiness probe.
    pub readiness_path: String,
    /// The path of the HTTP liveness probe.
    pub liveness_path: String,
    /// The `prometheus.io/path` annotation of the pod template, where Prometheus scrapes.
    pub scrape_path: Option<String>,
    /// The container's memory limit, as written (`512Mi`).
    pub memory_limit: String,
    /// `terminationGracePeriodSeconds`.
    pub grace_seconds: u64,
    /// How the process runs.
    pub security: Security,
}

/// The pod's and the container's security settings, as a runtime applies them.
#[derive(Debug, Clone, PartialEq)]
pub struct Security {
    /// The pod's `runAsUser`.
    pub run_as_user: Option<u64>,
    /// The pod's `runAsGroup`.
    pub run_as_group: Option<u64>,
    /// The pod's `hostNetwork`.
    pub host_network: Option<bool>,
    /// The container's `privileged`.
    pub privileged: Option<bool>,
    /// The container's `allowPrivilegeEscalation`.
    pub allow_privilege_escalation: Option<bool>,
    /// The container's `readOnlyRootFilesystem`.
    pub read_only_root: Option<bool>,
    /// The capabilities dropped.
    pub drop: Vec<String>,
    /// The capabilities added.
    pub add: Vec<String>,
    /// The pod's seccomp profile type.
    pub seccomp: Option<String>,
}

/// One volume mount of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The volume's name.
    pub volume: String,
    /// Where it is mounted in the container.
    pub path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// What backs it.
    pub source: Source,
}

/// What backs a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A directory of the node (`hostPath`).
    HostPath(String),
    /// A ConfigMap, by name.
    ConfigMap(String),
    /// A pod-scoped `emptyDir`.
    EmptyDir,
    /// Any other kind of volume.
    Other,
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

fn strings(v: &Value, what: &str) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| str_of(s, what).to_string())
        .collect()
}

impl Pod {
    /// The pod of `daemonset`, a DaemonSet manifest with one container (YAML parses into this
    /// JSON value as it is).
    pub fn of(daemonset: &Value) -> Pod {
        let template = &daemonset["spec"]["template"];
        let pod = &template["spec"];
        let containers = pod["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "one container");
        let c = &containers[0];
        let volumes = pod["volumes"].as_array().expect("volumes");
        let mounts = c["volumeMounts"]
            .as_array()
            .expect("volumeMounts")
            .iter()
            .map(|m| {
                let name = str_of(&m["name"], "a mount's volume");
                let volume = volumes
                    .iter()
                    .find(|v| v["name"].as_str() == Some(name))
                    .unwrap_or_else(|| panic!("mount {name} has no volume"));
                let source = if let Some(path) = volume["hostPath"]["path"].as_str() {
                    Source::HostPath(path.to_string())
                } else if let Some(cm) = volume["configMap"]["name"].as_str() {
                    Source::ConfigMap(cm.to_string())
                } else if volume.get("emptyDir").is_some() {
                    Source::EmptyDir
                } else {
                    Source::Other
                };
                Mount {
                    volume: name.to_string(),
                    path: str_of(&m["mountPath"], "a mountPath").to_string(),
                    read_only: m["readOnly"].as_bool() == Some(true),
                    source,
                }
            })
            .collect();
        let probe = |name: &str| str_of(&c[name]["httpGet"]["path"], name).to_string();
        let sc = &c["securityContext"];
        let pod_sc = &pod["securityContext"];
        Pod {
            command: strings(&c["command"], "command"),
            args: strings(&c["args"], "an argument"),
            env: c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| {
                    let value = e["value"].as_str()?;
                    Some((
                        str_of(&e["name"], "env name").to_string(),
                        value.to_string(),
                    ))
                })
                .collect(),
            mounts,
            readiness_path: probe("readinessProbe"),
            liveness_path: probe("livenessProbe"),
            scrape_path: template["metadata"]["annotations"]["prometheus.io/path"]
                .as_str()
                .map(str::to_string),
            memory_limit: str_of(&c["resources"]["limits"]["memory"], "the memory limit")
                .to_string(),
            grace_seconds: pod["terminationGracePeriodSeconds"]
                .as_u64()
                .expect("terminationGracePeriodSeconds"),
            security: Security {
                run_as_user: pod_sc["runAsUser"].as_u64(),
                run_as_group: pod_sc["runAsGroup"].as_u64(),
                host_network: pod["hostNetwork"].as_bool(),
                privileged: sc["privileged"].as_bool(),
                allow_privilege_escalation: sc["allowPrivilegeEscalation"].as_bool(),
                read_only_root: sc["readOnlyRootFilesystem"].as_bool(),
                drop: strings(&sc["capabilities"]["drop"], "a capability"),
                add: strings(&sc["capabilities"]["add"], "a capability"),
                seccomp: pod_sc["seccompProfile"]["type"]
                    .as_str()
                    .map(str::to_string),
            },
        }
    }

    /// `wdp run`'s flags in the arguments, as (flag, value) pairs (`--flag value` or
    /// `--flag=value`).
    pub fn flags(&self) -> Vec<(String, String)> {
        assert_eq!(
            self.args.first().map(String::as_str),
            Some("run"),
            "{:?}",
            self.args
        );
        let mut flags = Vec::new();
        let mut rest = self.args[1..].iter();
        while let Some(flag) = rest.next() {
            assert!(flag.starts_with("--"), "{flag:?} is not a flag");
            let (flag, value) = match flag.split_once('=') {
                Some((f, v)) => (f.to_string(), v.to_string()),
                None => (
                    flag.clone(),
                    rest.next()
                        .unwrap_or_else(|| panic!("{flag} has no value"))
                        .clone(),
                ),
            };
            flags.push((flag, value));
        }
        flags
    }

    /// The value of flag `name`; panics when the DaemonSet does not pass it.
    pub fn flag(&self, name: &str) -> String {
        self.flags()
            .into_iter()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("the DaemonSet does not pass {name}"))
    }

    /// The port of `--metrics-addr` (`HOST:PORT`): where the probes and the scrape go.
    pub fn metrics_port(&self) -> u16 {
        let addr = self.flag("--metrics-addr");
        addr.rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("--metrics-addr {addr} is not HOST:PORT"))
    }

    /// The volume mount holding `path` (the deepest one); panics when none does, as the path
    /// would then be in the image.
    pub fn mount_of(&self, path: &str) -> &Mount {
        self.mounts
            .iter()
            .filter(|m| Path::new(path).starts_with(&m.path))
            .max_by_key(|m| m.path.len())
            .unwrap_or_else(|| panic!("{path} is on no volume mount: it would be in the image"))
    }
}

impl Mount {
    /// The node directory behind it, if it is a hostPath volume.
    pub fn host_path(&self) -> Option<&str> {
        match &self.source {
            Source::HostPath(path) => Some(path),
            _ => None,
        }
    }
}

/// Gives `f` the device nodes of every scanner deploy/configmap.yaml configures (the virtual
/// devices kvm, tun, vhost-net and fuse, two USB serial adapters): the node the shipped config is
/// run or evaluated against, so each resource it serves has a device.
pub fn configmap_devices(f: &Fixture) -> &Fixture {
    f.char_dev("kvm", 10, 232)
        .char_dev("net/tun", 10, 200)
        .char_dev("vhost-net", 10, 238)
        .char_dev("fuse", 10, 229)
        .char_dev("ttyUSB0", 188, 0)
        .char_dev("ttyACM0", 166, 0)
}
