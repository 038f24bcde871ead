//! `gpu`: Intel GPUs (i915 and xe drivers), in place of Intel's GPU device plugin
//! (`cmd/gpu_plugin/gpu_plugin.go` in intel/intel-device-plugins-for-kubernetes, sysfs mode),
//! resource namespace `gpu.intel.com`.
//!
//! Reads, for every `/sys/class/drm/card<N>`:
//! * `device/vendor` must be `0x8086`, and `device/drm` must exist;
//! * with `ALLOW_IDS`/`DENY_IDS`, the first line of `device/device` (the PCI device id);
//! * `device/sriov_numvfs`: a readable value other than `0` and `-1` marks a PF whose VFs are
//!   enabled; it is skipped (its VFs are GPUs of their own);
//! * `device/driver`: the bound driver's name is the device type (`i915`, `xe`; `i915` when none
//!   is bound, as upstream);
//! * `device/drm/*` except `controlD<N>`: each becomes the node `/dev/dri/<entry>`, which must
//!   exist in /dev (stat through devfs), e.g. `/dev/dri/card0` and `/dev/dri/renderD128`. A card
//!   without nodes is skipped.
//!
//! Each GPU is advertised as `SHARED_DEV_NUM` devices `card<N>-0` .. `card<N>-<SHARED_DEV_NUM-1>`
//! sharing one description: its nodes ("rw": even reading metrics needs write access) and the
//! by-path mounts below; no envs or annotations. Allocate returns those nodes and mounts.
//!
//! By-path mounts (`BYPATH`), from `/dev/dri/by-path` (listed through devfs):
//! * `single`: every entry named `pci-<BDF>*`, mounted read-only at the same path, where BDF is
//!   the PCI address of the card: the parent directory of `drm/card<N>` in the resolved
//!   `/sys/class/drm/card<N>` (it must be a full PCI address, else no mounts);
//! * `all`: `/dev/dri/by-path` itself, read-only;
//! * `none` (default): no mounts.
//!
//! The host refuses mounts the scanner's policy does not allow, and its default policy allows
//! none: so by-path mounts are off unless asked for, and `single` or `all` need
//! `policy: { allowed-mounts: [/dev/dri/by-path] }` too (without it every tree is refused, and
//! the log and `/readyz` say which mount to allow).
//!
//! Monitoring (`ENABLE_MONITORING=true`): one more device, id `all`, holding the nodes of every
//! advertised GPU plus their MEI nodes (`/dev/<x>` for each `device/*.mei-*/mei/<x>`), for
//! monitoring agents; its type is `monitoring` (`MONITORING_MODE=single`, the default, as
//! upstream's command line) or `<driver>_monitoring` per driver (`split`).
//!
//! Health: a device seen before whose card or nodes disappear (driver unbound) stays listed as
//! Unhealthy with its last description until it returns ([`wdp_guest::health::Vanished`]); a GPU
//! that comes back on the other driver moves to that type and is no longer listed under the old
//! one. Upstream has no health signal without its Level-Zero or xpumd sidecars.
//!
//! Environment (upstream flag in brackets):
//! * `SHARED_DEV_NUM` (default 1, 1 ..= 10000) [`-shared-dev-num`];
//! * `ALLOW_IDS`, `DENY_IDS` (default unset; at most one of them): comma-separated PCI device ids
//!   such as `0x56a0,0x56a1` [`-allow-ids`, `-deny-ids`];
//! * `BYPATH` (`single`, `all`, `none` (default)) [`-bypath`];
//! * `ENABLE_MONITORING` (`true`/`false`, default false) [`-enable-monitoring`];
//! * `MONITORING_MODE` (`single` (default), `split`) [`-monitoring-mode`];
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans (upstream: every 5 s; here
//!   a change under /dev or /sys wakes the scanner at once).
//!
//! Deliberate differences from upstream:
//! * `BYPATH` defaults to `none` (upstream: `single`): a default the host's default policy
//!   accepts. Set `BYPATH=single` and allow `/dev/dri/by-path` for upstream's mounts.
//! * Not offered: `-allocation-policy` (GetPreferredAllocation: kubelet then picks among the
//!   free devices itself, so with `SHARED_DEV_NUM` > 1 a multi-GPU request may get two shares of
//!   one GPU where upstream's policies prefer distinct GPUs; a separate preferred-allocator
//!   component could add it), Level-Zero and xpumd health management and their temperature
//!   limits (they need sockets to sidecars), WSL (`-wsl`, type `dxg`). CDI specs are the host's
//!   business, not the scanner's.
//! * Whether `/dev/dri/by-path` is readable is checked at every scan (upstream checks once at
//!   start and never adds by-path mounts if it was unreadable then).
//! * MEI nodes of the monitoring device must exist in /dev (upstream adds them unchecked; the host
//!   refuses nodes that do not exist). Duplicate nodes in it are dropped.
//! * `numa-nodes` is left to the host for every device (upstream gives the monitoring device no
//!   topology; the host derives the union of its GPUs' NUMA nodes).

pub mod options;

use std::collections::BTreeMap;

use options::{Bypath, MonitoringMode, Options};
use wdp_guest::health::Vanished;
use wdp_guest::hostfs::{Host, HostFs};
use wdp_guest::{DeviceInfo, DeviceSpec, DeviceTree, TreeBuilder, config, pci};

/// The DRM class directory.
pub const DRM_CLASS: &str = "/sys/class/drm";
/// Where DRM nodes live in /dev.
pub const DRI_DIR: &str = "/dev/dri";
/// The udev by-path links of DRM nodes.
pub const BYPATH_DIR: &str = "/dev/dri/by-path";
/// Intel's PCI vendor id as sysfs prints it.
pub const VENDOR_INTEL: &str = "0x8086";
/// The device type when no driver is bound (upstream's default).
pub const DEFAULT_DEV_TYPE: &str = "i915";
/// The id of the monitoring device.
pub const MONITOR_ID: &str = "all";
/// The monitoring type in single mode.
pub const MONITOR_TYPE_SINGLE: &str = "monitoring";
/// The suffix of a driver's monitoring type in split mode.
pub const MONITOR_SUFFIX: &str = "_monitoring";

/// True for `card<N>` (upstream's `^card[0-9]+$`).
pub fn is_card_name(name: &str) -> bool {
    digits_after(name, "card")
}

/// True for `controlD<N>` (upstream's `^controlD[0-9]+$`): legacy control nodes are not given.
pub fn is_control_name(name: &str) -> bool {
    digits_after(name, "controlD")
}

fn digits_after(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The PCI address in a card's resolved sysfs path
/// (`/sys/devices/pci0000:00/0000:00:02.0/drm/card0` gives `0000:00:02.0`): the directory
/// holding `drm/<card>`, if it is a PCI address.
pub fn bdf_from_path(resolved: &str, card: &str) -> Option<String> {
    let parent = resolved.strip_suffix(&format!("/drm/{card}"))?;
    let bdf = parent.rsplit('/').next()?;
    pci::is_bdf(bdf).then(|| bdf.to_string())
}

/// True when the card's `sriov_numvfs` (None: unreadable) says it is a PF with VFs enabled.
pub fn is_pf_with_vfs(sriov_numvfs: Option<&str>) -> bool {
    !matches!(sriov_numvfs.map(str::trim), None | Some("0" | "-1"))
}

fn rw(path: &str) -> DeviceSpec {
    DeviceSpec {
        host_path: path.to_string(),
        container_path: path.to_string(),
        permissions: "rw".to_string(),
    }
}

/// The by-path mounts, (host path, container path), of a card at PCI address `bdf` in mode
/// `bypath`, with `entries` the contents of `/dev/dri/by-path` (None: unreadable, so none).
pub fn bypath_mounts(
    bypath: Bypath,
    entries: Option<&[String]>,
    bdf: Option<&str>,
) -> Vec<(String, String)> {
    let Some(entries) = entries else {
        return Vec::new();
    };
    match (bypath, bdf) {
        (Bypath::None, _) | (Bypath::Single, None) => Vec::new(),
        (Bypath::All, _) => vec![(BYPATH_DIR.to_string(), BYPATH_DIR.to_string())],
        (Bypath::Single, Some(bdf)) => {
            let prefix = format!("pci-{bdf}");
            entries
                .iter()
                .filter(|e| e.starts_with(&prefix))
                .map(|e| {
                    let p = format!("{BYPATH_DIR}/{e}");
                    (p.clone(), p)
                })
                .collect()
        }
    }
}

/// The tree for the machine `fs` shows, under `opts`.
pub fn tree(fs: &impl HostFs, opts: &Options) -> DeviceTree {
    let m = Cards(fs);
    let mut t = TreeBuilder::new();
    // Monitoring type -> its nodes, in the order GPUs are found.
    let mut monitor: BTreeMap<String, Vec<DeviceSpec>> = BTreeMap::new();
    let bypath_entries = match opts.bypath {
        Bypath::None => None,
        _ => m.bypath_entries(),
    };
    for card in m.drm_entries() {
        if !is_card_name(&card) {
            continue;
        }
        if m.attr(&card, "vendor").as_deref().map(str::trim) != Some(VENDOR_INTEL) {
            continue;
        }
        let Some(drm_files) = m.drm_files(&card) else {
            continue;
        };
        if opts.filter != options::IdFilter::All {
            let Some(raw) = m.attr(&card, "device") else {
                continue;
            };
            let id = raw.split('\n').next().unwrap_or_default();
            if !opts.filter.admits(id) {
                continue;
            }
        }
        if is_pf_with_vfs(m.attr(&card, "sriov_numvfs").as_deref()) {
            continue;
        }
        let dev_type = m.driver(&card).unwrap_or_else(|| DEFAULT_DEV_TYPE.into());
        let nodes: Vec<DeviceSpec> = drm_files
            .iter()
            .filter(|f| !is_control_name(f))
            .map(|f| format!("{DRI_DIR}/{f}"))
            .filter(|p| m.dev_exists(p))
            .map(|p| rw(&p))
            .collect();
        if nodes.is_empty() {
            continue;
        }
        let bdf = match opts.bypath {
            Bypath::Single => m.bdf(&card),
            _ => None,
        };
        let mut info = DeviceInfo::new();
        info.nodes = nodes.clone();
        for (host, container) in
            bypath_mounts(opts.bypath, bypath_entries.as_deref(), bdf.as_deref())
        {
            info = info.mount(host, container, true);
        }
        t.add_shared(&dev_type, &card, opts.shared_dev_num, info);

        if let Some(mode) = opts.monitoring {
            let key = match mode {
                MonitoringMode::Single => MONITOR_TYPE_SINGLE.to_string(),
                MonitoringMode::Split => format!("{dev_type}{MONITOR_SUFFIX}"),
            };
            let specs = monitor.entry(key).or_default();
            let mei = m
                .mei_names(&card)
                .into_iter()
                .map(|n| format!("/dev/{n}"))
                .filter(|p| m.dev_exists(p))
                .map(|p| rw(&p));
            for spec in nodes.into_iter().chain(mei) {
                if !specs.iter().any(|s| s.host_path == spec.host_path) {
                    specs.push(spec);
                }
            }
        }
    }
    for (dev_type, nodes) in monitor {
        let mut info = DeviceInfo::new();
        info.nodes = nodes;
        t.add(&dev_type, MONITOR_ID, info);
    }
    t.build()
}

/// The reads [`tree`] makes, by card: `card` is a name in `/sys/class/drm` (`card0`).
struct Cards<'a, F>(&'a F);

impl<F: HostFs> Cards<'_, F> {
    fn card_dir(card: &str) -> String {
        format!("{DRM_CLASS}/{card}")
    }
    /// The entries of `/sys/class/drm`, sorted.
    fn drm_entries(&self) -> Vec<String> {
        self.0.names(DRM_CLASS)
    }
    /// The raw contents of `/sys/class/drm/<card>/device/<attr>`.
    fn attr(&self, card: &str, attr: &str) -> Option<String> {
        self.0
            .read(&format!("{}/device/{attr}", Self::card_dir(card)))
            .ok()
    }
    /// The entries of `/sys/class/drm/<card>/device/drm`, sorted; None when it does not exist.
    fn drm_files(&self, card: &str) -> Option<Vec<String>> {
        let dir = format!("{}/device/drm", Self::card_dir(card));
        self.0.realpath(&dir)?;
        Some(self.0.names(&dir))
    }
    /// The name of the driver bound to the card's device.
    fn driver(&self, card: &str) -> Option<String> {
        self.0
            .link_name(&format!("{}/device/driver", Self::card_dir(card)))
    }
    /// The PCI address of the card's device, from its resolved sysfs path.
    fn bdf(&self, card: &str) -> Option<String> {
        bdf_from_path(&self.0.resolve_sys(&Self::card_dir(card))?, card)
    }
    /// The names in every `/sys/class/drm/<card>/device/*.mei-*/mei` directory.
    fn mei_names(&self, card: &str) -> Vec<String> {
        let pattern = format!("{}/device/*.mei-*/mei", Self::card_dir(card));
        self.0
            .glob(&pattern)
            .into_iter()
            .flat_map(|dir| self.0.names(&dir))
            .collect()
    }
    /// True when `path` exists under /dev.
    fn dev_exists(&self, path: &str) -> bool {
        self.0.exists(path)
    }
    /// The names in `/dev/dri/by-path`, sorted; None when it cannot be read.
    fn bypath_entries(&self) -> Option<Vec<String>> {
        let nodes = self.0.list(BYPATH_DIR).ok()?;
        Some(nodes.into_iter().map(|n| n.name).collect())
    }
}

/// What identifies a device across types, for [`Vanished::mark_moving`]: a GPU's id (`card1-0`),
/// since rebinding it from i915 to xe moves it to another type rather than making it vanish; a
/// monitoring device by its type too, since every monitoring type has the same id `all`.
pub fn identity(dev_type: &str, id: &str) -> String {
    if dev_type == MONITOR_TYPE_SINGLE || dev_type.ends_with(MONITOR_SUFFIX) {
        format!("{dev_type}/{id}")
    } else {
        id.to_string()
    }
}

struct Gpu;

impl wdp_guest::Scanner for Gpu {
    fn scan() -> Result<(), String> {
        let opts = options::parse(config::env_var)?;
        let mut vanished = Vanished::new();
        wdp_guest::run(|| Ok(vanished.mark_moving(tree(&Host, &opts), identity)))
    }
}

wdp_guest::export_scanner!(Gpu);

#[cfg(test)]
mod tests;
