//! `nvidia`: NVIDIA GPUs (resource `nvidia.com/gpu` with namespace `nvidia.com`), from sysfs and
//! devfs alone, with a post-allocator that sets `NVIDIA_VISIBLE_DEVICES` as NVIDIA's plugin does.
//!
//! **Reads.** Every PCI function under `/sys/bus/pci/devices` with vendor `0x10de`, a display
//! class (`class` `0x0300xx` VGA or `0x0302xx` 3D controller, the classes the `nvidia` driver
//! claims) and the `nvidia` driver bound, plus its `numa_node`. Through devfs: the GPU's node
//! `/dev/nvidiaN` and the control nodes `/dev/nvidiactl`, `/dev/nvidia-uvm`,
//! `/dev/nvidia-uvm-tools`, `/dev/nvidia-modeset`.
//!
//! **Reports** one device of type `gpu` per GPU, id its PCI address (`0000:3b:00.0`), with the
//! control nodes that exist followed by `/dev/nvidiaN`, each at the same path in the container
//! with permissions "rw" (NVIDIA's `--pass-device-specs` list and order), and NUMA node the
//! function's `numa_node` when it is not -1 (NVIDIA's plugin reads the same file; the host cannot
//! derive it, since the driver's nodes have no sysfs device). A GPU appears only when its
//! `/dev/nvidiaN` is a character device `195:N`. A GPU whose driver is unbound or whose node goes
//! away stays listed, Unhealthy, until it comes back ([`Vanished`]).
//!
//! **Which `/dev/nvidiaN`.** NVIDIA's plugin asks NVML for the minor number; the driver also shows
//! it in `/proc/driver/nvidia/gpus/<BDF>/information`. Neither is visible in the sandbox, and the
//! nodes are made by `nvidia-modprobe` with `mknod`, so sysfs has no link from a GPU to its node.
//! The driver gives each GPU it binds the lowest free minor, in the order it binds them, and at
//! boot it binds in PCI order. [`Minors`] replays that rule: the GPUs bound when the scanner
//! starts get 0, 1, ... in PCI address order; a GPU unbound later frees its minor and keeps the
//! others' (as the driver does); a GPU bound later takes the lowest free minor. Limits: a scanner
//! started after GPUs were unbound and rebound at runtime (e.g. passed to a VM and back) may pair
//! a GPU with the wrong node, and so may a kernel whose boot-time probe order is not PCI address
//! order (unusual bridge layouts); the `195:N` check catches a missing node, not a swapped one.
//!
//! **Id.** NVIDIA's plugin uses the GPU UUID from NVML, which sysfs does not show. The PCI address
//! is as stable across reboots as the hardware's slot, readable, and accepted by the NVIDIA
//! container runtime in `NVIDIA_VISIBLE_DEVICES` (libnvidia-container matches bus ids). The minor
//! is not: it depends on probe order.
//!
//! **Post-allocator** (export `post-allocator`, configure the same component as the scanner's
//! `post-allocator`): sets `NVIDIA_VISIBLE_DEVICES` in each container's response to the allocated
//! GPUs, comma-joined in request order, replica suffixes removed and duplicates dropped, so the
//! NVIDIA container runtime hook sees the same GPUs as the device nodes. A per-device env could
//! not do this: the host merges per-device envs with "last device wins".
//!
//! Configuration (NVIDIA's flags as environment variables):
//!
//! * `REPLICAS` (default 1, 1 ..= 1024): time-slicing. Above 1 each GPU is offered `REPLICAS`
//!   times with ids `<BDF>::0` .. `<BDF>::<REPLICAS-1>`, NVIDIA's annotated ids.
//! * `DEVICE_ID_STRATEGY` (`bdf` or `index`, default `bdf`): what `NVIDIA_VISIBLE_DEVICES` lists.
//!   `bdf` the PCI addresses; `index` each GPU's position in PCI order among the GPUs bound to
//!   `nvidia` at allocation time, which is NVML's enumeration order in practice (needed when the
//!   runtime resolves names through CDI specs generated with index names). NVIDIA's `uuid` is not
//!   available; `bdf` takes its place.
//! * `FAIL_REQUESTS_GREATER_THAN_ONE` (`true` or `false`, default `false`): with replicas, refuse a
//!   container asking for more than one (NVIDIA's `failRequestsGreaterThanOne`).
//! * `PASS_DEVICE_SPECS` (`true` or `false`, default `true`): `false` leaves the nodes out and
//!   relies on the NVIDIA container runtime to add them from `NVIDIA_VISIBLE_DEVICES`. NVIDIA's
//!   default is `false`; here `true`, so any runtime gets working devices.
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans.
//!
//! Replaces NVIDIA/k8s-device-plugin (`internal/plugin/server.go`, `internal/rm`) for whole GPUs.
//! Not covered: MIG devices and MPS (they need NVML), XID-event health (NVML events), GPU
//! Direct Storage and MOFED envs, CDI annotations (the host writes CDI specs), and the
//! `volume-mounts` device-list strategy.

use std::collections::{BTreeMap, BTreeSet};

use wdp_guest::config::{self, env_var};
use wdp_guest::health::Vanished;
use wdp_guest::{
    ContainerAllocateRequest, ContainerAllocateResponse, DeviceInfo, DeviceTree, TreeBuilder,
    devfs, pci, sysfs,
};

/// NVIDIA's PCI vendor id, as [`pci::id_attr`] gives it.
pub const VENDOR: &str = "10de";
/// The driver whose GPUs get `/dev/nvidiaN` nodes.
pub const DRIVER: &str = "nvidia";
/// The character major of `/dev/nvidia*`.
pub const MAJOR: u32 = 195;
/// Minors 254 and 255 are `nvidia-modeset` and `nvidiactl`.
pub const MAX_GPU_MINOR: u32 = 253;
/// The device type: kubelet sees `nvidia.com/gpu`.
pub const DEV_TYPE: &str = "gpu";
/// The env the NVIDIA container runtime reads.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// Nodes every GPU needs next to its own, given when present (NVIDIA's optional device specs).
pub const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

/// Time-slicing replicas per GPU (NVIDIA's `sharing.timeSlicing.resources[].replicas`).
pub const REPLICAS_ENV: &str = "REPLICAS";
/// What `NVIDIA_VISIBLE_DEVICES` lists (NVIDIA's `--device-id-strategy`).
pub const ID_STRATEGY_ENV: &str = "DEVICE_ID_STRATEGY";
/// Refuse more than one replica per container (NVIDIA's `failRequestsGreaterThanOne`).
pub const FAIL_GT_ONE_ENV: &str = "FAIL_REQUESTS_GREATER_THAN_ONE";
/// Give device nodes in the tree (NVIDIA's `--pass-device-specs`).
pub const PASS_SPECS_ENV: &str = "PASS_DEVICE_SPECS";
/// Largest accepted `REPLICAS`.
pub const MAX_REPLICAS: u32 = 1024;

/// What `NVIDIA_VISIBLE_DEVICES` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdStrategy {
    /// PCI addresses: stable, and matched by libnvidia-container as bus ids.
    Bdf,
    /// Positions in PCI order: what CDI specs generated with index names know.
    Index,
}

/// The configuration, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `REPLICAS`: 1 offers whole GPUs under their plain addresses.
    pub replicas: u32,
    /// `DEVICE_ID_STRATEGY`.
    pub id_strategy: IdStrategy,
    /// `FAIL_REQUESTS_GREATER_THAN_ONE`.
    pub fail_requests_greater_than_one: bool,
    /// `PASS_DEVICE_SPECS`.
    pub pass_device_specs: bool,
}

fn boolean(name: &str, value: Option<&str>, default: &'static str) -> Result<bool, String> {
    Ok(config::parse_choice(name, value, default, &["true", "false"])? == "true")
}

/// Reads the configuration from the values of `REPLICAS`, `DEVICE_ID_STRATEGY`,
/// `FAIL_REQUESTS_GREATER_THAN_ONE` and `PASS_DEVICE_SPECS` (None: unset).
pub fn parse_config(
    replicas: Option<&str>,
    id_strategy: Option<&str>,
    fail_gt_one: Option<&str>,
    pass_specs: Option<&str>,
) -> Result<Config, String> {
    Ok(Config {
        replicas: config::parse_u32(REPLICAS_ENV, replicas, 1, 1..=MAX_REPLICAS)?,
        id_strategy: match config::parse_choice(
            ID_STRATEGY_ENV,
            id_strategy,
            "bdf",
            &["bdf", "index"],
        )? {
            "index" => IdStrategy::Index,
            _ => IdStrategy::Bdf,
        },
        fail_requests_greater_than_one: boolean(FAIL_GT_ONE_ENV, fail_gt_one, "false")?,
        pass_device_specs: boolean(PASS_SPECS_ENV, pass_specs, "true")?,
    })
}

/// [`parse_config`] on the environment.
pub fn env_config() -> Result<Config, String> {
    parse_config(
        env_var(REPLICAS_ENV).as_deref(),
        env_var(ID_STRATEGY_ENV).as_deref(),
        env_var(FAIL_GT_ONE_ENV).as_deref(),
        env_var(PASS_SPECS_ENV).as_deref(),
    )
}

/// True for NVIDIA's vendor id and a class the `nvidia` driver drives: VGA (`0300xx`) or 3D
/// controller (`0302xx`), as [`pci::id_attr`] gives them.
pub fn is_gpu(vendor: &str, class: &str) -> bool {
    vendor == VENDOR && (class.starts_with("0300") || class.starts_with("0302"))
}

/// A GPU bound to `nvidia`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// PCI address, e.g. `0000:3b:00.0`.
    pub bdf: String,
    /// `numa_node`, None when -1 or unreadable.
    pub numa: Option<u32>,
}

/// Parses a `numa_node` attribute: None for -1 ("no affinity") or anything unreadable.
pub fn parse_numa(value: Option<&str>) -> Option<u32> {
    value?.trim().parse::<u32>().ok()
}

/// The GPUs bound to `nvidia` now, in PCI address order.
pub fn bound_gpus() -> Vec<Gpu> {
    pci::list()
        .into_iter()
        .filter_map(|bdf| {
            let dir = pci::device_dir(&bdf);
            let vendor = pci::id_attr(&dir, "vendor")?;
            let class = pci::id_attr(&dir, "class")?;
            if !is_gpu(&vendor, &class) || pci::driver(&dir).as_deref() != Some(DRIVER) {
                return None;
            }
            let numa = parse_numa(sysfs::read_attr(format!("{dir}/numa_node")).as_deref());
            Some(Gpu { bdf, numa })
        })
        .collect()
}

/// The driver's minor-number rule, replayed (see the crate doc): each GPU keeps its minor while
/// it stays bound; newly bound GPUs take the lowest free minors, in PCI address order.
#[derive(Debug, Default, Clone)]
pub struct Minors {
    by_bdf: BTreeMap<String, u32>,
}

impl Minors {
    /// No GPU seen yet: the next [`Minors::assign`] numbers the bound GPUs as the driver did at
    /// boot.
    pub fn new() -> Self {
        Self::default()
    }

    /// Updates the assignment for the GPUs bound now (`bound`, any order) and returns it.
    /// GPUs beyond [`MAX_GPU_MINOR`] get none.
    pub fn assign<'a>(
        &mut self,
        bound: impl IntoIterator<Item = &'a str>,
    ) -> &BTreeMap<String, u32> {
        let bound: BTreeSet<&str> = bound.into_iter().collect();
        self.by_bdf.retain(|bdf, _| bound.contains(bdf.as_str()));
        for bdf in bound {
            if self.by_bdf.contains_key(bdf) {
                continue;
            }
            let used: BTreeSet<u32> = self.by_bdf.values().copied().collect();
            if let Some(free) = (0..=MAX_GPU_MINOR).find(|m| !used.contains(m)) {
                self.by_bdf.insert(bdf.to_string(), free);
            }
        }
        &self.by_bdf
    }
}

/// The GPU's own node.
pub fn gpu_node(minor: u32) -> String {
    format!("/dev/nvidia{minor}")
}

/// The device ids of one GPU: its address, or `<bdf>::<i>` for each replica.
pub fn replica_ids(bdf: &str, replicas: u32) -> Vec<String> {
    if replicas <= 1 {
        vec![bdf.to_string()]
    } else {
        (0..replicas).map(|i| format!("{bdf}::{i}")).collect()
    }
}

/// The device tree for `gpus` with `minors`; `control` lists the control nodes present, and
/// `node_ok(path, minor)` says whether `path` is the character device `195:minor`.
pub fn tree(
    cfg: &Config,
    gpus: &[Gpu],
    minors: &BTreeMap<String, u32>,
    control: &[&str],
    node_ok: impl Fn(&str, u32) -> bool,
) -> DeviceTree {
    let mut t = TreeBuilder::new();
    t.group(DEV_TYPE);
    for gpu in gpus {
        let Some(&minor) = minors.get(&gpu.bdf) else {
            continue;
        };
        let node = gpu_node(minor);
        if !node_ok(&node, minor) {
            continue;
        }
        let mut info = DeviceInfo::new();
        if cfg.pass_device_specs {
            for c in control.iter().copied().chain([node.as_str()]) {
                info = info.node(c, c, "rw");
            }
        }
        if let Some(n) = gpu.numa {
            info = info.numa_nodes([n]);
        }
        for id in replica_ids(&gpu.bdf, cfg.replicas) {
            t.add(DEV_TYPE, id, info.clone());
        }
    }
    t.build()
}

/// A device id without its replica suffix (`0000:3b:00.0::2` -> `0000:3b:00.0`).
pub fn gpu_of(id: &str) -> &str {
    id.split_once("::").map_or(id, |(bdf, _)| bdf)
}

/// The value of `NVIDIA_VISIBLE_DEVICES` for one container's `ids`, or why the request is
/// refused. `bound` is the GPUs bound to `nvidia` now, in PCI order (for `index`).
pub fn visible_devices(cfg: &Config, ids: &[String], bound: &[String]) -> Result<String, String> {
    if cfg.fail_requests_greater_than_one && ids.len() > 1 && ids.iter().any(|i| i.contains("::")) {
        return Err(format!(
            "request for {} shared GPUs is too large: {FAIL_GT_ONE_ENV} allows one per container",
            ids.len()
        ));
    }
    let mut out: Vec<String> = Vec::new();
    for id in ids {
        let bdf = gpu_of(id);
        let entry = match cfg.id_strategy {
            IdStrategy::Bdf => bdf.to_string(),
            IdStrategy::Index => bound
                .iter()
                .position(|b| b == bdf)
                .ok_or_else(|| format!("GPU {bdf} is no longer bound to {DRIVER}"))?
                .to_string(),
        };
        if !out.contains(&entry) {
            out.push(entry);
        }
    }
    Ok(out.join(","))
}

/// Sets `NVIDIA_VISIBLE_DEVICES` on each response (one per request, in order).
pub fn post_allocate(
    cfg: &Config,
    requests: &[ContainerAllocateRequest],
    mut responses: Vec<ContainerAllocateResponse>,
    bound: &[String],
) -> Result<Vec<ContainerAllocateResponse>, String> {
    for (request, response) in requests.iter().zip(responses.iter_mut()) {
        let value = visible_devices(cfg, &request.device_ids, bound)?;
        response.envs.retain(|(k, _)| k != VISIBLE_DEVICES);
        response.envs.push((VISIBLE_DEVICES.to_string(), value));
    }
    Ok(responses)
}

/// True when `path` is the character device `195:minor`.
fn is_gpu_node(path: &str, minor: u32) -> bool {
    matches!(devfs::stat(path), Ok(n) if n.kind == devfs::NodeKind::CharDevice
        && n.major == MAJOR && n.minor == minor)
}

struct Nvidia;

impl wdp_guest::Scanner for Nvidia {
    fn scan() -> Result<(), String> {
        let cfg = env_config()?;
        let mut minors = Minors::new();
        let mut vanished = Vanished::new();
        wdp_guest::run(move || {
            let gpus = bound_gpus();
            let assigned = minors.assign(gpus.iter().map(|g| g.bdf.as_str()));
            let control: Vec<&str> = CONTROL_NODES
                .into_iter()
                .filter(|p| devfs::exists_char_device(p))
                .collect();
            let now = tree(&cfg, &gpus, assigned, &control, is_gpu_node);
            Ok(vanished.mark(now))
        })
    }
}

impl wdp_guest::PostAllocator for Nvidia {
    fn post_allocate(
        _dev_type: String,
        requests: Vec<ContainerAllocateRequest>,
        responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        let cfg = env_config()?;
        let bound: Vec<String> = match cfg.id_strategy {
            IdStrategy::Index => bound_gpus().into_iter().map(|g| g.bdf).collect(),
            IdStrategy::Bdf => Vec::new(),
        };
        post_allocate(&cfg, &requests, responses, &bound)
    }
}

wdp_guest::export_device_plugin!(Nvidia);

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        parse_config(None, None, None, None).unwrap()
    }

    fn gpu(bdf: &str, numa: Option<u32>) -> Gpu {
        Gpu {
            bdf: bdf.into(),
            numa,
        }
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn config() {
        assert_eq!(
            cfg(),
            Config {
                replicas: 1,
                id_strategy: IdStrategy::Bdf,
                fail_requests_greater_than_one: false,
                pass_device_specs: true,
            }
        );
        let c = parse_config(Some("4"), Some("index"), Some("true"), Some("false")).unwrap();
        assert_eq!((c.replicas, c.id_strategy), (4, IdStrategy::Index));
        assert!(c.fail_requests_greater_than_one && !c.pass_device_specs);
        let e = parse_config(Some("0"), None, None, None).unwrap_err();
        assert!(
            e.starts_with("REPLICAS=\"0\" is not valid") && e.contains("1 to 1024"),
            "{e}"
        );
        let e = parse_config(None, Some("uuid"), None, None).unwrap_err();
        assert!(
            e.starts_with("DEVICE_ID_STRATEGY=\"uuid\" is not valid") && e.contains("bdf, index"),
            "{e}"
        );
        let e = parse_config(None, None, Some("1"), None).unwrap_err();
        assert!(e.starts_with("FAIL_REQUESTS_GREATER_THAN_ONE=\"1\""), "{e}");
        let e = parse_config(None, None, None, Some("yes")).unwrap_err();
        assert!(e.starts_with("PASS_DEVICE_SPECS=\"yes\""), "{e}");
    }

    #[test]
    fn gpu_classes() {
        assert!(is_gpu("10de", "030000"));
        assert!(is_gpu("10de", "030200"));
        assert!(!is_gpu("10de", "040300"), "HD audio function");
        assert!(!is_gpu("10de", "068000"), "NVSwitch");
        assert!(!is_gpu("8086", "030000"));
        assert_eq!(parse_numa(Some("1")), Some(1));
        assert_eq!(parse_numa(Some("-1")), None);
        assert_eq!(parse_numa(None), None);
    }

    #[test]
    fn minors_follow_the_drivers_first_free_rule() {
        let mut m = Minors::new();
        let got = |m: &BTreeMap<String, u32>| -> Vec<(String, u32)> {
            m.iter().map(|(k, v)| (k.clone(), *v)).collect()
        };
        let a = "0000:3b:00.0";
        let b = "0000:86:00.0";
        let c = "0000:af:00.0";
        // At start: PCI order, whatever order sysfs listed them in.
        assert_eq!(
            got(m.assign([c, a, b])),
            [(a.into(), 0), (b.into(), 1), (c.into(), 2)]
        );
        // Unbinding `a` keeps the others' minors.
        assert_eq!(got(m.assign([b, c])), [(b.into(), 1), (c.into(), 2)]);
        // Rebinding takes the lowest free minor.
        assert_eq!(
            got(m.assign([a, b, c])),
            [(a.into(), 0), (b.into(), 1), (c.into(), 2)]
        );
        m.assign([c]);
        let d = "0000:00:05.0";
        assert_eq!(
            got(m.assign([d, b, c])),
            [(d.into(), 0), (b.into(), 1), (c.into(), 2)],
            "first free slots go in PCI order"
        );
    }

    #[test]
    fn tree_nodes_numa_and_replicas() {
        let gpus = [
            gpu("0000:3b:00.0", Some(0)),
            gpu("0000:86:00.0", None),
            gpu("0000:af:00.0", Some(1)),
        ];
        let minors: BTreeMap<String, u32> = [
            ("0000:3b:00.0", 0),
            ("0000:86:00.0", 1),
            ("0000:af:00.0", 2),
        ]
        .into_iter()
        .map(|(b, m)| (b.to_string(), m))
        .collect();
        let control = ["/dev/nvidiactl", "/dev/nvidia-uvm"];
        // nvidia2 is missing: that GPU is not usable yet.
        let t = tree(&cfg(), &gpus, &minors, &control, |p, m| {
            p == gpu_node(m) && m != 2
        });
        assert_eq!(t[0].dev_type, "gpu");
        let ids: Vec<&str> = t[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:3b:00.0", "0000:86:00.0"]);
        let info = &t[0].devices[1].info;
        let nodes: Vec<(&str, &str, &str)> = info
            .nodes
            .iter()
            .map(|n| {
                (
                    n.host_path.as_str(),
                    n.container_path.as_str(),
                    n.permissions.as_str(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/nvidiactl", "/dev/nvidiactl", "rw"),
                ("/dev/nvidia-uvm", "/dev/nvidia-uvm", "rw"),
                ("/dev/nvidia1", "/dev/nvidia1", "rw"),
            ]
        );
        assert_eq!(info.numa_nodes, None);
        assert_eq!(t[0].devices[0].info.numa_nodes, Some(vec![0]));
        assert!(info.envs.is_empty());

        let c = Config {
            replicas: 2,
            pass_device_specs: false,
            ..cfg()
        };
        let t = tree(&c, &gpus[..1], &minors, &control, |_, _| true);
        let ids: Vec<&str> = t[0].devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, ["0000:3b:00.0::0", "0000:3b:00.0::1"]);
        assert!(t[0].devices[0].info.nodes.is_empty());
        // No GPU: the type is still there, empty.
        let t = tree(&cfg(), &[], &minors, &control, |_, _| true);
        assert!(t[0].devices.is_empty());
    }

    #[test]
    fn visible_devices_by_bdf_and_index() {
        let bound = strings(&["0000:3b:00.0", "0000:86:00.0", "0000:af:00.0"]);
        let ids = strings(&["0000:af:00.0::1", "0000:3b:00.0::0", "0000:af:00.0::0"]);
        assert_eq!(
            visible_devices(&cfg(), &ids, &bound).unwrap(),
            "0000:af:00.0,0000:3b:00.0"
        );
        let index = Config {
            id_strategy: IdStrategy::Index,
            ..cfg()
        };
        assert_eq!(visible_devices(&index, &ids, &bound).unwrap(), "2,0");
        let e = visible_devices(&index, &strings(&["0000:01:00.0"]), &bound).unwrap_err();
        assert!(e.contains("0000:01:00.0 is no longer bound"), "{e}");
        let strict = Config {
            fail_requests_greater_than_one: true,
            ..cfg()
        };
        let e = visible_devices(&strict, &ids, &bound).unwrap_err();
        assert!(e.contains("FAIL_REQUESTS_GREATER_THAN_ONE"), "{e}");
        assert!(visible_devices(&strict, &ids[..1], &bound).is_ok());
        assert!(
            visible_devices(&strict, &bound, &bound).is_ok(),
            "whole GPUs are not limited"
        );
    }

    #[test]
    fn post_allocate_sets_one_env_per_container() {
        let requests = [
            ContainerAllocateRequest {
                device_ids: strings(&["0000:86:00.0", "0000:3b:00.0"]),
            },
            ContainerAllocateRequest {
                device_ids: strings(&["0000:af:00.0"]),
            },
        ];
        let response = |envs: Vec<(String, String)>| ContainerAllocateResponse {
            envs,
            mounts: vec![],
            devices: vec![],
            annotations: vec![],
            cdi_devices: vec![],
        };
        let stale = vec![
            (VISIBLE_DEVICES.to_string(), "x".to_string()),
            ("A".into(), "1".into()),
        ];
        let out = post_allocate(
            &cfg(),
            &requests,
            vec![response(stale), response(vec![])],
            &[],
        )
        .unwrap();
        assert_eq!(
            out[0].envs,
            [
                ("A".to_string(), "1".to_string()),
                (
                    VISIBLE_DEVICES.to_string(),
                    "0000:86:00.0,0000:3b:00.0".to_string()
                )
            ]
        );
        assert_eq!(
            out[1].envs,
            [(VISIBLE_DEVICES.to_string(), "0000:af:00.0".to_string())]
        );
    }
}
