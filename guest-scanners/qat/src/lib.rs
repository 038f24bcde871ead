//! `qat`: Intel QuickAssist (QAT) virtual functions for DPDK and QATlib, in place of Intel's
//! QAT device plugin in DPDK mode (`cmd/qat_plugin/dpdkdrv/dpdkdrv.go` in
//! intel/intel-device-plugins-for-kubernetes; serve it under namespace `qat.intel.com`).
//!
//! **Reads** (see [`discover`] for the exact rules): the PFs bound to the PF drivers
//! (`/sys/bus/pci/drivers/4xxx/*`) and their `virtfn*` links, or in a VM every PCI function
//! whose `device` id is a QAT VF id; each VF's `driver`, `device`, `physfn`, `iommu_group`
//! (and its `name`) or `uio/`; the PF's `qat/state`, `qat/cfg_services` and `driver`; debugfs
//! `/sys/kernel/debug/qat_<pf driver>_<PF>/{dev_cfg,heartbeat/status}`; the device nodes through
//! devfs.
//!
//! **Reports** one device per VF, id = its PCI address (`0000:6b:00.1`), typed by the services
//! its PF runs (`cy`, `dc`, `sym`, `asym`, `asym-dc`, `sym-dc`, `decomp`, ...) for Gen4/Gen6
//! VFs, `generic` otherwise. With `vfio-pci`: nodes `/dev/vfio/<group>` (or
//! `/dev/vfio/noiommu-<group>`) and `/dev/vfio/vfio`; with `igb_uio`: node `/dev/uioN` and a
//! writable mount of `/sys/class/uio/uioN/device` (the host config must then allow it:
//! `policy: { allowed-mounts: [/sys/class/uio] }`). Env `QAT<n>=<address>`, `n` the VF's
//! 1-based place in the VF list. Unhealthy when the PF's heartbeat status reads `-1`, and when
//! a VF seen before is no longer usable (it vanished, or lost its driver or node). A VF whose
//! PF's services changed moves to its new type without leaving an Unhealthy copy behind.
//!
//! **Post-allocate** (this component is also the scanner's post-allocator): in each
//! container's response the `QAT<n>` envs are renamed `QAT0`, `QAT1`, ... in the order of `n`,
//! so a container counts its VFs from zero whatever it got.
//!
//! **Environment:**
//!
//! * `DPDK_DRIVER` (default `vfio-pci`; `vfio-pci` or `igb_uio`): the driver VFs must be bound to.
//! * `KERNEL_VF_DRIVERS` (default `4xxxvf,420xxvf`): comma-separated kernel VF drivers whose
//!   devices are served, any of `dh895xccvf c4xxxvf c3xxxvf 4xxxvf 420xxvf 6xxxvf c6xxvf
//!   d15xxvf`; their PF drivers are the names without `vf`.
//! * `MAX_NUM_DEVICES` (default 64; 1 ..= 4096): the most VFs served.
//! * `RESCAN_INTERVAL_MS` (default 30000; upstream scans every 5 s): longest wait between scans.
//!   The host wakes the scanner earlier when /dev changes (a VF's group node comes or goes) and
//!   when a driver is bound or unbound; a heartbeat failure in debugfs or reconfigured services
//!   wait for the next rescan: set 5000 to notice them as soon as upstream does.
//!
//! **Deliberate differences from upstream:**
//!
//! * A VF not bound to the DPDK driver is not rebound (a sandboxed guest cannot write to sysfs):
//!   it is left out, with one line on stderr saying so; bind VFs beforehand (Intel's
//!   `qat-init.sh` does). A VF whose IOMMU group, uio device or device node is missing is left
//!   out the same way, where upstream exits. A VF served before and left out now is reported
//!   Unhealthy until it is usable again.
//! * Envs are renumbered per container and in a fixed order (upstream: random map order, and the
//!   renamed map is shared by all containers of a request, which then accumulate each other's).
//! * Services that are empty or not a valid resource name type the VF `generic` (upstream would
//!   serve an empty or invalid resource name); debugfs is always `/sys/kernel/debug` (upstream
//!   derives it from the PF's sysfs path, which only works for a PF right below its root bus).
//! * No `-allocation-policy` (GetPreferredAllocation): kubelet's own choice applies.

pub mod config;
pub mod discover;

use wdp_guest::{
    ContainerAllocateRequest, ContainerAllocateResponse, envs, health::Vanished, hostfs::Host,
    notes::Notes,
};

use crate::config::Config;

struct Qat;

impl wdp_guest::Scanner for Qat {
    fn scan() -> Result<(), String> {
        let cfg = Config::from_env()?;
        let mut vanished = Vanished::new();
        let mut notes = Notes::new();
        wdp_guest::run(|| {
            let scan = discover::scan(&Host, &cfg);
            notes.print(scan.notes);
            Ok(vanished.mark_moving(scan.tree, |_, id| id.to_string()))
        })
    }
}

impl wdp_guest::PostAllocator for Qat {
    fn post_allocate(
        _dev_type: String,
        _requests: Vec<ContainerAllocateRequest>,
        responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        Ok(envs::renumber_responses(responses, discover::ENV_PREFIX))
    }
}

wdp_guest::export_device_plugin!(Qat);

#[cfg(test)]
mod tests {
    use super::*;
    use wdp_guest::{DeviceInfo, TreeBuilder};

    #[test]
    fn a_vf_that_changed_type_leaves_no_ghost() {
        let info = DeviceInfo::new();
        let tree = |groups: &[(&str, &[&str])]| {
            let mut t = TreeBuilder::new();
            for (ty, ids) in groups {
                t.group(ty);
                for id in *ids {
                    t.add(ty, *id, info.clone());
                }
            }
            t.build()
        };
        let mut v = Vanished::new();
        v.mark(tree(&[("cy", &["a", "b"])]));
        // The PF went from cy to dc: a and b moved; c vanished from dc earlier stays a ghost.
        v.mark(tree(&[("dc", &["c"])]));
        let now = tree(&[("dc", &["a", "b"])]);
        let marked = v.mark_moving(now, |_, id| id.to_string());
        let got: Vec<String> = marked
            .iter()
            .flat_map(|g| {
                g.devices
                    .iter()
                    .map(move |d| format!("{}/{} {:?}", g.dev_type, d.id, d.info.health))
            })
            .collect();
        assert_eq!(
            got,
            [
                "dc/a Health::Healthy",
                "dc/b Health::Healthy",
                "dc/c Health::Unhealthy"
            ]
        );
        // A device of the same type that is Unhealthy in the scan itself (heartbeat) stays.
        let sick = vec![wdp_guest::DeviceGroup {
            dev_type: "dc".into(),
            devices: vec![wdp_guest::Device {
                id: "a".into(),
                info: DeviceInfo::new().unhealthy(),
            }],
        }];
        assert_eq!(
            Vanished::new().mark_moving(sick.clone(), |_, id| id.to_string()),
            sick
        );
    }

    #[test]
    fn post_allocate_renumbers_each_container_on_its_own() {
        let resp = |envs: &[(&str, &str)]| ContainerAllocateResponse {
            envs: envs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            mounts: Vec::new(),
            devices: Vec::new(),
            annotations: Vec::new(),
            cdi_devices: Vec::new(),
        };
        let out = <Qat as wdp_guest::PostAllocator>::post_allocate(
            "cy".into(),
            Vec::new(),
            vec![
                resp(&[("QAT12", "0000:6b:01.3"), ("QAT3", "0000:6b:00.3")]),
                resp(&[("QAT7", "0000:6b:00.7")]),
            ],
        )
        .unwrap();
        let pairs = |r: &ContainerAllocateResponse| {
            let mut e = r.envs.clone();
            e.sort();
            e
        };
        assert_eq!(
            pairs(&out[0]),
            [
                ("QAT0".to_string(), "0000:6b:00.3".to_string()),
                ("QAT1".to_string(), "0000:6b:01.3".to_string())
            ]
        );
        assert_eq!(
            pairs(&out[1]),
            [("QAT0".to_string(), "0000:6b:00.7".to_string())]
        );
    }
}
