//! `idxd`: work queues of Intel Data Streaming Accelerator (DSA) and In-Memory Analytics
//! Accelerator (IAA) devices driven by the kernel's `idxd` driver, in place of Intel's DSA and
//! IAA plugins (`pkg/idxd/plugin.go` with `cmd/dsa_plugin` and `cmd/iaa_plugin` in
//! intel/intel-device-plugins-for-kubernetes). One component serves both: run it with
//! `IDXD_DEVICE: dsa` under namespace `dsa.intel.com`, with `IDXD_DEVICE: iax` under
//! `iaa.intel.com`.
//!
//! **Reads** the work queues `/sys/bus/dsa/devices/<dsa|iax>*/wq*/state` (IAA devices are
//! `iax<N>` on the same `dsa` bus) and, for each `enabled` one, its `mode` (`shared` or
//! `dedicated`) and `type` (`user`, `kernel`, ...). For a `user` queue, through devfs: the node
//! `/dev/<dsa|iax>/<wq>` must be a character device and `/dev/char/<major>:<minor>` a symlink
//! resolving to it (libaccel-config opens the queue through that link).
//!
//! **Reports** type `wq-<type>-<mode>` (e.g. `wq-user-dedicated`, `wq-user-shared`) with ids
//! `wq-<type>-<mode>-<wq>-<i>` (e.g. `wq-user-shared-wq0.1-0`): `SHARED_DEV_NUM` ids for a
//! shared queue, one otherwise. A `user` queue's devices have both nodes (rw); other types have
//! none. No envs, no mounts. A queue served before and not usable now (disabled, node gone) is
//! reported Unhealthy until it is usable again; one whose type or mode changed moves to its new
//! type without leaving Unhealthy copies behind.
//!
//! **Environment:**
//!
//! * `IDXD_DEVICE` (required; `dsa` or `iax`): which accelerator's queues to serve. Required
//!   because the namespace is chosen in the host config: a default would silently serve DSA
//!   queues as `iaa.intel.com` resources when it was forgotten.
//! * `SHARED_DEV_NUM` (default 1; 1 ..= 1000), upstream's `-shared-dev-num`: how many
//!   containers may share one shared work queue.
//! * `RESCAN_INTERVAL_MS` (default 30000; upstream scans every 5 s): longest wait between scans.
//!   The host wakes the scanner earlier when /dev changes, as it does when a user queue is
//!   enabled or disabled; changes only sysfs shows (a kernel queue, a mode change) wait for the
//!   next rescan.
//!
//! **Deliberate differences from upstream:** an enabled queue whose attributes cannot be read,
//! or a user queue whose node or `/dev/char` link is missing or wrong, is left out (with one
//! line on stderr) where upstream's scan fails and the plugin exits. DSA's `-driver=vfio-pci`
//! mode is the `vfio` scanner (`VFIO_DEVICE_IDS: "0x0b25,0x11fb,0x1212"`).

use wdp_guest::tree::is_dev_type;

use wdp_guest::{
    DeviceInfo, TreeBuilder, config,
    devfs::NodeKind,
    health::Vanished,
    hostfs::{Host, HostFs},
    notes::{Notes, Scanned},
};

/// Which accelerator's queues to serve.
pub const DEVICE_ENV: &str = "IDXD_DEVICE";
/// How many containers may share one shared queue.
pub const SHARED_DEV_NUM_ENV: &str = "SHARED_DEV_NUM";
/// Upstream's default for `-shared-dev-num`.
pub const DEFAULT_SHARED_DEV_NUM: u32 = 1;
/// Largest accepted `SHARED_DEV_NUM`.
pub const MAX_SHARED_DEV_NUM: u32 = 1000;
/// Where the kernel links the char device numbers to their nodes.
pub const CHAR_DEV_DIR: &str = "/dev/char";

/// The scanner's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `dsa` or `iax`: the sysfs device prefix and the directory of the queue nodes in /dev.
    pub device: String,
    pub shared_dev_num: u32,
}

impl Config {
    /// The settings from `get(name)` (None: unset).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let device = match get(DEVICE_ENV) {
            None => {
                return Err(format!(
                    "{DEVICE_ENV} is not set: expected dsa (DSA, namespace dsa.intel.com) or \
                     iax (IAA, namespace iaa.intel.com)"
                ));
            }
            Some(v) => config::parse_choice(DEVICE_ENV, Some(&v), "dsa", &["dsa", "iax"])
                .map_err(|e| e.replace(" (default dsa)", ""))?,
        };
        let shared_dev_num = config::parse_u32(
            SHARED_DEV_NUM_ENV,
            get(SHARED_DEV_NUM_ENV).as_deref(),
            DEFAULT_SHARED_DEV_NUM,
            1..=MAX_SHARED_DEV_NUM,
        )?;
        Ok(Config {
            device: device.to_string(),
            shared_dev_num,
        })
    }

    /// The glob of the queues' `state` attributes (upstream's `statePattern`).
    pub fn state_pattern(&self) -> String {
        format!("/sys/bus/dsa/devices/{}*/wq*/state", self.device)
    }
}

/// The nodes of user queue `wq` (upstream's `getDevNodes`): `/dev/<device>/<wq>` and its
/// `/dev/char/<major>:<minor>` link; Err says what is wrong.
pub fn queue_nodes(m: &impl HostFs, device: &str, wq: &str) -> Result<DeviceInfo, String> {
    let node = format!("/dev/{device}/{wq}");
    let st = m.stat(&node).map_err(|_| format!("{node} is missing"))?;
    if st.kind != NodeKind::CharDevice {
        return Err(format!("{node} is not a character device"));
    }
    let link = format!("{CHAR_DEV_DIR}/{}:{}", st.major, st.minor);
    match m.stat(&link) {
        Ok(l) if l.kind == NodeKind::Symlink => {}
        Ok(_) => return Err(format!("{link} is not a symlink")),
        Err(_) => return Err(format!("{link} is missing")),
    }
    // upstream's filepath.EvalSymlinks
    match m.realpath(&link) {
        Some(target) if target == node => {}
        Some(target) => return Err(format!("{link} points to {target}, not {node}")),
        None => return Err(format!("{link} does not resolve")),
    }
    Ok(DeviceInfo::new()
        .node(&node, &node, "rw")
        .node(&link, &link, "rw"))
}

/// One scan of the machine `m` shows (upstream's `scan`).
pub fn scan(m: &impl HostFs, cfg: &Config) -> Scanned {
    let mut tree = TreeBuilder::new();
    let mut notes = Vec::new();
    for state_path in m.glob(&cfg.state_pattern()) {
        let Some(dir) = state_path.strip_suffix("/state") else {
            continue;
        };
        let wq = dir.rsplit('/').next().unwrap_or(dir);
        if m.read_attr(&state_path).as_deref() != Some("enabled") {
            continue;
        }
        let (Some(mode), Some(wq_type)) = (
            m.read_attr(&format!("{dir}/mode")),
            m.read_attr(&format!("{dir}/type")),
        ) else {
            notes.push(format!(
                "work queue {wq}: mode or type unreadable: not served"
            ));
            continue;
        };
        let dev_type = format!("wq-{wq_type}-{mode}");
        if !is_dev_type(&dev_type) {
            notes.push(format!(
                "work queue {wq}: {dev_type:?} is not a resource name: not served"
            ));
            continue;
        }
        let info = if wq_type == "user" {
            match queue_nodes(m, &cfg.device, wq) {
                Ok(info) => info,
                Err(why) => {
                    notes.push(format!("work queue {wq}: {why}: not served"));
                    continue;
                }
            }
        } else {
            DeviceInfo::new()
        };
        let amount = if mode == "shared" {
            cfg.shared_dev_num
        } else {
            1
        };
        tree.add_shared(&dev_type, &format!("{dev_type}-{wq}"), amount, info);
    }
    Scanned {
        tree: tree.build(),
        notes,
    }
}

/// The queue name in a device id `<dev_type>-<wq>-<i>` (`wq0.1` in `wq-user-shared-wq0.1-0`).
pub fn queue_of(dev_type: &str, id: &str) -> String {
    let rest = id
        .strip_prefix(dev_type)
        .and_then(|r| r.strip_prefix('-'))
        .unwrap_or(id);
    rest.rsplit_once('-').map_or(rest, |(wq, _)| wq).to_string()
}

struct Idxd;

impl wdp_guest::Scanner for Idxd {
    fn scan() -> Result<(), String> {
        let cfg = Config::parse(config::env_var)?;
        let mut vanished = Vanished::new();
        let mut notes = Notes::new();
        wdp_guest::run(|| {
            let scan = scan(&Host, &cfg);
            notes.print(scan.notes);
            Ok(vanished.mark_moving(scan.tree, queue_of))
        })
    }
}

wdp_guest::export_scanner!(Idxd);

#[cfg(test)]
mod tests {
    use super::*;
    use wdp_guest::hostfs::FakeFs;
    use wdp_guest::tree::type_ids;

    /// Queue `wq` of device `dev` in sysfs, with its state, mode and type.
    fn queue(fs: &mut FakeFs, dev: &str, wq: &str, state: &str, mode: &str, ty: &str) {
        let dir = format!("/sys/bus/dsa/devices/{dev}/{wq}");
        fs.file(&format!("{dir}/state"), state)
            .file(&format!("{dir}/mode"), mode)
            .file(&format!("{dir}/type"), ty);
    }

    /// The node of user queue `wq` in `/dev/<class>` and its `/dev/char` link.
    fn user_node(fs: &mut FakeFs, class: &str, wq: &str, minor: u32) {
        fs.char_dev(&format!("/dev/{class}/{wq}"), 236, minor).link(
            &format!("/dev/char/236:{minor}"),
            &format!("../{class}/{wq}"),
        );
    }

    fn cfg(device: &str, shared: u32) -> Config {
        Config {
            device: device.into(),
            shared_dev_num: shared,
        }
    }

    fn ids(s: &Scanned) -> Vec<String> {
        type_ids(&s.tree)
    }

    fn fake() -> FakeFs {
        let mut m = FakeFs::new();
        m.dir("/dev/dsa").dir("/dev/iax").dir("/dev/char");
        queue(&mut m, "dsa0", "wq0.0", "enabled", "dedicated", "user");
        queue(&mut m, "dsa0", "wq0.1", "enabled", "shared", "user");
        queue(&mut m, "dsa0", "wq0.2", "disabled", "shared", "user");
        queue(&mut m, "dsa0", "wq0.3", "enabled", "dedicated", "kernel");
        queue(&mut m, "iax1", "wq1.0", "enabled", "shared", "user");
        user_node(&mut m, "dsa", "wq0.0", 0);
        user_node(&mut m, "dsa", "wq0.1", 1);
        user_node(&mut m, "iax", "wq1.0", 2);
        m
    }

    #[test]
    fn settings() {
        let get = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(
            Config::parse(get(&[("IDXD_DEVICE", "iax")])),
            Ok(cfg("iax", 1))
        );
        assert_eq!(
            Config::parse(get(&[("IDXD_DEVICE", "dsa"), ("SHARED_DEV_NUM", "4")])),
            Ok(cfg("dsa", 4))
        );
        let e = Config::parse(get(&[])).unwrap_err();
        assert!(e.starts_with("IDXD_DEVICE is not set"), "{e}");
        let e = Config::parse(get(&[("IDXD_DEVICE", "iaa")])).unwrap_err();
        assert_eq!(
            e,
            "IDXD_DEVICE=\"iaa\" is not valid: expected one of dsa, iax"
        );
        let e = Config::parse(get(&[("IDXD_DEVICE", "dsa"), ("SHARED_DEV_NUM", "0")])).unwrap_err();
        assert!(e.starts_with("SHARED_DEV_NUM=\"0\" is not valid"), "{e}");
        assert_eq!(
            cfg("iax", 1).state_pattern(),
            "/sys/bus/dsa/devices/iax*/wq*/state"
        );
    }

    #[test]
    fn enabled_queues_typed_by_type_and_mode() {
        let m = fake();
        let s = scan(&m, &cfg("dsa", 3));
        assert_eq!(
            ids(&s),
            [
                "wq-user-dedicated/wq-user-dedicated-wq0.0-0",
                "wq-user-shared/wq-user-shared-wq0.1-0",
                "wq-user-shared/wq-user-shared-wq0.1-1",
                "wq-user-shared/wq-user-shared-wq0.1-2",
                "wq-kernel-dedicated/wq-kernel-dedicated-wq0.3-0",
            ]
        );
        let user = &s.tree[0].devices[0].info;
        let nodes: Vec<&str> = user.nodes.iter().map(|n| n.host_path.as_str()).collect();
        assert_eq!(nodes, ["/dev/dsa/wq0.0", "/dev/char/236:0"]);
        assert!(
            s.tree[2].devices[0].info.nodes.is_empty(),
            "kernel queues have no nodes"
        );
        assert!(s.notes.is_empty(), "{:?}", s.notes);

        let s = scan(&m, &cfg("iax", 2));
        assert_eq!(
            ids(&s),
            [
                "wq-user-shared/wq-user-shared-wq1.0-0",
                "wq-user-shared/wq-user-shared-wq1.0-1"
            ]
        );
    }

    #[test]
    fn broken_user_queues_are_left_out_with_a_note() {
        let mut m = fake();
        m.remove("/dev/dsa/wq0.0");
        m.link("/dev/char/236:1", "../dsa/wq0.0");
        let s = scan(&m, &cfg("dsa", 1));
        assert_eq!(ids(&s), ["wq-kernel-dedicated/wq-kernel-dedicated-wq0.3-0"]);
        assert_eq!(
            s.notes,
            [
                "work queue wq0.0: /dev/dsa/wq0.0 is missing: not served",
                "work queue wq0.1: /dev/char/236:1 does not resolve: not served",
            ]
        );
        let mut m = fake();
        m.link("/dev/char/236:1", "/dev/dsa/wq0.0")
            .file("/dev/dsa/wq0.0", "")
            .char_dev("/dev/char/236:0", 236, 0);
        let s = scan(&m, &cfg("dsa", 1));
        assert_eq!(
            s.notes,
            [
                "work queue wq0.0: /dev/dsa/wq0.0 is not a character device: not served",
                "work queue wq0.1: /dev/char/236:1 points to /dev/dsa/wq0.0, not /dev/dsa/wq0.1: not served",
            ]
        );
    }

    #[test]
    fn a_queue_that_changed_mode_leaves_no_ghost() {
        assert_eq!(
            queue_of("wq-user-shared", "wq-user-shared-wq0.1-12"),
            "wq0.1"
        );
        let mut m = fake();
        let c = cfg("dsa", 2);
        let mut v = Vanished::new();
        v.mark(scan(&m, &c).tree);
        queue(&mut m, "dsa0", "wq0.1", "enabled", "dedicated", "user");
        queue(&mut m, "dsa0", "wq0.3", "disabled", "dedicated", "kernel");
        let now = scan(&m, &c).tree;
        let t = v.mark_moving(now, queue_of);
        let got: Vec<String> = t
            .iter()
            .flat_map(|g| {
                g.devices
                    .iter()
                    .map(move |d| format!("{} {:?}", d.id, d.info.health))
            })
            .collect();
        assert_eq!(
            got,
            [
                "wq-user-dedicated-wq0.0-0 Health::Healthy",
                "wq-user-dedicated-wq0.1-0 Health::Healthy",
                "wq-kernel-dedicated-wq0.3-0 Health::Unhealthy",
            ]
        );
        let types: Vec<&str> = t.iter().map(|g| g.dev_type.as_str()).collect();
        assert_eq!(types, ["wq-user-dedicated", "wq-kernel-dedicated"]);
    }

    #[test]
    fn dev_links_resolve_through_relative_and_absolute_hops() {
        let mut m = fake();
        m.link("/dev/a", "char/236:0")
            .link("/dev/b", "/dev/a")
            .link("/dev/loop", "loop");
        assert_eq!(m.realpath("/dev/b").as_deref(), Some("/dev/dsa/wq0.0"));
        assert_eq!(m.realpath("/dev/loop"), None);
        assert_eq!(m.realpath("/dev/missing"), None);
    }
}
