//! The QAT scanner's settings, from environment variables named after upstream's flags.
//!
//! Why separate: the parsing is pure (values in, settings or an error message out), so it is
//! unit-tested off wasm; every error names the variable, the value and what would be valid,
//! because that message is all an operator sees in the host's log.

use wdp_guest::config;

/// `-dpdk-driver`: the driver the VFs must be bound to (`vfio-pci` or `igb_uio`).
pub const DPDK_DRIVER_ENV: &str = "DPDK_DRIVER";
/// `-kernel-vf-drivers`: comma-separated kernel VF drivers whose devices are served.
pub const KERNEL_VF_DRIVERS_ENV: &str = "KERNEL_VF_DRIVERS";
/// `-max-num-devices`: the most VFs served.
pub const MAX_NUM_DEVICES_ENV: &str = "MAX_NUM_DEVICES";

/// Upstream's default for `-kernel-vf-drivers`: the Gen4 (4xxx, 401xx, 402xx) and 420xx VFs.
pub const DEFAULT_KERNEL_VF_DRIVERS: &str = "4xxxvf,420xxvf";
/// Upstream's default for `-max-num-devices`.
pub const DEFAULT_MAX_NUM_DEVICES: u32 = 64;
/// Largest accepted `MAX_NUM_DEVICES`: far above any machine's VF count, and it keeps one tree
/// within the host's per-type cap.
pub const MAX_MAX_NUM_DEVICES: u32 = 4096;

/// QAT VF PCI device id -> the kernel driver of such VFs (upstream's `qatDeviceDriver`): the
/// valid `KERNEL_VF_DRIVERS` entries, and the ids looked for when no PF is visible (in a VM).
pub const VF_DEVICE_DRIVERS: [(&str, &str); 11] = [
    ("0442", "dh895xccvf"),
    ("0443", "dh895xccvf"),
    ("18a1", "c4xxxvf"),
    ("19e3", "c3xxxvf"),
    ("4941", "4xxxvf"),
    ("4943", "4xxxvf"),
    ("4945", "4xxxvf"),
    ("4947", "420xxvf"),
    ("4949", "6xxxvf"),
    ("37c9", "c6xxvf"),
    ("6f55", "d15xxvf"),
];

/// The driver that gives user space (DPDK, QATlib) access to a VF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DpdkDriver {
    /// Nodes `/dev/vfio/<group>` and `/dev/vfio/vfio`.
    VfioPci,
    /// Node `/dev/uioN` and a mount of `/sys/class/uio/uioN/device`.
    IgbUio,
}

impl DpdkDriver {
    /// The kernel's name of the driver, as in `/sys/bus/pci/drivers/<name>`.
    pub fn name(self) -> &'static str {
        match self {
            DpdkDriver::VfioPci => "vfio-pci",
            DpdkDriver::IgbUio => "igb_uio",
        }
    }
}

/// Everything the scan depends on besides the machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub dpdk_driver: DpdkDriver,
    /// Kernel VF drivers (`4xxxvf`, ...), in the configured order: PFs are searched in it.
    pub kernel_vf_drivers: Vec<String>,
    pub max_devices: usize,
}

impl Config {
    /// The settings from `get(name)` (None: unset).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        let dpdk = config::parse_choice(
            DPDK_DRIVER_ENV,
            get(DPDK_DRIVER_ENV).as_deref(),
            "vfio-pci",
            &["vfio-pci", "igb_uio"],
        )?;
        let dpdk_driver = if dpdk == "igb_uio" {
            DpdkDriver::IgbUio
        } else {
            DpdkDriver::VfioPci
        };
        let max = config::parse_u32(
            MAX_NUM_DEVICES_ENV,
            get(MAX_NUM_DEVICES_ENV).as_deref(),
            DEFAULT_MAX_NUM_DEVICES,
            1..=MAX_MAX_NUM_DEVICES,
        )?;
        Ok(Config {
            dpdk_driver,
            kernel_vf_drivers: parse_kernel_vf_drivers(get(KERNEL_VF_DRIVERS_ENV).as_deref())?,
            max_devices: max as usize,
        })
    }

    /// The settings from the guest's environment.
    pub fn from_env() -> Result<Config, String> {
        Config::parse(config::env_var)
    }
}

/// Every distinct kernel VF driver name, in table order (for error messages).
fn known_vf_drivers() -> Vec<&'static str> {
    let mut names: Vec<&str> = Vec::new();
    for (_, d) in VF_DEVICE_DRIVERS {
        if !names.contains(&d) {
            names.push(d);
        }
    }
    names
}

/// Reads `KERNEL_VF_DRIVERS` (None: the default): a comma-separated list of known VF drivers.
/// Unlike upstream, blanks around entries are allowed.
pub fn parse_kernel_vf_drivers(value: Option<&str>) -> Result<Vec<String>, String> {
    let raw = value.unwrap_or(DEFAULT_KERNEL_VF_DRIVERS);
    let known = known_vf_drivers();
    let mut out = Vec::new();
    for entry in raw.split(',').map(str::trim) {
        if !known.contains(&entry) {
            return Err(format!(
                "{KERNEL_VF_DRIVERS_ENV}={:?} is not valid: {:?} is not a QAT VF driver; \
                 expected a comma-separated list of {} (default {DEFAULT_KERNEL_VF_DRIVERS})",
                config::excerpt(raw, 80),
                config::excerpt(entry, 40),
                known.join(", ")
            ));
        }
        if !out.iter().any(|d| d == entry) {
            out.push(entry.to_string());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<Config, String> {
        Config::parse(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_are_upstreams() {
        assert_eq!(
            parse(&[]),
            Ok(Config {
                dpdk_driver: DpdkDriver::VfioPci,
                kernel_vf_drivers: vec!["4xxxvf".into(), "420xxvf".into()],
                max_devices: 64,
            })
        );
    }

    #[test]
    fn settings() {
        let c = parse(&[
            ("DPDK_DRIVER", "igb_uio"),
            ("KERNEL_VF_DRIVERS", "c6xxvf, d15xxvf,c6xxvf"),
            ("MAX_NUM_DEVICES", "2"),
        ])
        .unwrap();
        assert_eq!(c.dpdk_driver, DpdkDriver::IgbUio);
        assert_eq!(c.dpdk_driver.name(), "igb_uio");
        assert_eq!(c.kernel_vf_drivers, ["c6xxvf", "d15xxvf"]);
        assert_eq!(c.max_devices, 2);
    }

    #[test]
    fn bad_values_name_the_variable() {
        // Upstream's own rejected examples (dpdkdrv_test.go TestNewDevicePlugin).
        let e = parse(&[("DPDK_DRIVER", "uio")]).unwrap_err();
        assert!(e.starts_with("DPDK_DRIVER=\"uio\" is not valid"), "{e}");
        assert!(e.contains("vfio-pci, igb_uio"), "{e}");
        for bad in ["c6xxxvf", "c6xxvf:d15xxvf", "", "4xxxvf,"] {
            let e = parse(&[("KERNEL_VF_DRIVERS", bad)]).unwrap_err();
            assert!(
                e.starts_with(&format!("KERNEL_VF_DRIVERS={bad:?} is not valid")),
                "{e}"
            );
            assert!(
                e.contains("4xxxvf, 420xxvf, 6xxxvf, c6xxvf, d15xxvf"),
                "{e}"
            );
        }
        for bad in ["0", "x", "4097"] {
            let e = parse(&[("MAX_NUM_DEVICES", bad)]).unwrap_err();
            assert!(
                e.starts_with(&format!("MAX_NUM_DEVICES={bad:?} is not valid")),
                "{e}"
            );
        }
    }
}
