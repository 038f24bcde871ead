//! `sgx`: Intel SGX enclaves, in place of Intel's SGX device plugin
//! (`cmd/sgx_plugin/sgx_plugin.go` in intel/intel-device-plugins-for-kubernetes), resource
//! namespace `sgx.intel.com`.
//!
//! Reads only /dev (through devfs): `/dev/sgx_enclave` and `/dev/sgx_provision` must both exist
//! (as upstream, which assumes an in-tree SGX driver providing both); otherwise the tree is empty
//! and a line on stderr (the host's log, once per episode) says which node is missing. With both
//! present:
//!
//! * type `enclave`: devices `sgx-enclave-0` .. `sgx-enclave-<ENCLAVE_LIMIT-1>`, each giving the
//!   container `/dev/sgx_enclave` ("rw");
//! * type `provision`: devices `sgx-provision-0` .. `sgx-provision-<PROVISION_LIMIT-1>`, each
//!   giving `/dev/sgx_provision` ("rw").
//!
//! No mounts, envs or annotations; Allocate returns the node(s) of the allocated devices.
//!
//! Environment:
//! * `ENCLAVE_LIMIT`, `PROVISION_LIMIT` (0 ..= 16384; upstream `-enclave-limit`,
//!   `-provision-limit`): devices of each type. Default: `PODS_PER_CORE` × the number of online
//!   CPUs (`/sys/devices/system/cpu/online`) when `PODS_PER_CORE` is set and not empty, else 110
//!   (kubelet's default pod limit: one enclave per pod). 0 leaves the type out.
//! * `PODS_PER_CORE` (0 ..= 16384): as upstream's environment variable of the same name.
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans.
//!
//! Deliberate differences from upstream:
//! * Upstream scans once and never again; here the scanner keeps watching, so SGX nodes that
//!   appear later are advertised, and devices whose node vanishes are reported Unhealthy
//!   ([`wdp_guest::health::Vanished`]) until it returns.
//! * A `PODS_PER_CORE` that is not a number is an error naming it (upstream logs and uses 110).
//! * The CPU count is the online CPUs in sysfs; upstream's Go `runtime.NumCPU` counts the CPUs
//!   in the plugin's affinity mask, the same on a node where the plugin is not CPU-pinned.
//! * The deprecated `-dcap-infra-resources` (types `qe` and `registration`) is not offered:
//!   `registration` needs a CDI spec mounting a fresh efivarfs, which a scanner cannot express.
//! * Upstream gives these devices no NUMA topology on purpose; here `numa-nodes` is left to the
//!   host, which finds no NUMA node for these non-PCI nodes.

use wdp_guest::health::Vanished;
use wdp_guest::notes::Notes;
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config, devfs};

/// The enclave node.
pub const ENCLAVE_NODE: &str = "/dev/sgx_enclave";
/// The provisioning node.
pub const PROVISION_NODE: &str = "/dev/sgx_provision";
/// Device type of enclave devices.
pub const TYPE_ENCLAVE: &str = "enclave";
/// Device type of provisioning devices.
pub const TYPE_PROVISION: &str = "provision";
/// Devices per type when nothing says otherwise (kubelet's default `--max-pods`).
pub const DEFAULT_LIMIT: u32 = 110;
/// Largest accepted limit: the host's default cap on devices per type.
pub const MAX_LIMIT: u32 = 16_384;
/// The environment variable with the number of enclave devices.
pub const ENCLAVE_LIMIT_ENV: &str = "ENCLAVE_LIMIT";
/// The environment variable with the number of provision devices.
pub const PROVISION_LIMIT_ENV: &str = "PROVISION_LIMIT";
/// The environment variable upstream multiplies by the CPU count for the default limits.
pub const PODS_PER_CORE_ENV: &str = "PODS_PER_CORE";
/// Where the kernel lists the online CPUs (`0-3,8-11`).
pub const CPU_ONLINE: &str = "/sys/devices/system/cpu/online";

/// The number of CPUs in a kernel CPU list such as `0-3,8-11\n` (None when it does not parse).
pub fn count_cpus(list: &str) -> Option<u32> {
    let mut n: u32 = 0;
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let cpu = part.parse::<u32>().ok()?;
                (cpu, cpu)
            }
        };
        n = n.checked_add(hi.checked_sub(lo)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The default limit: `PODS_PER_CORE` (`pods_per_core`, None or empty: unset) × the CPUs of
/// `cpu_online` (the contents of [`CPU_ONLINE`], read only when needed), or [`DEFAULT_LIMIT`].
pub fn default_limit(
    pods_per_core: Option<&str>,
    cpu_online: impl FnOnce() -> Option<String>,
) -> Result<u32, String> {
    let Some(raw) = pods_per_core.filter(|v| !v.is_empty()) else {
        return Ok(DEFAULT_LIMIT);
    };
    let per_core = config::parse_u32(PODS_PER_CORE_ENV, Some(raw), 0, 0..=MAX_LIMIT)?;
    let online = cpu_online().ok_or_else(|| {
        format!("{PODS_PER_CORE_ENV} is set but {CPU_ONLINE} cannot be read to count the CPUs")
    })?;
    let cpus = count_cpus(&online).ok_or_else(|| {
        format!("{PODS_PER_CORE_ENV} is set but {CPU_ONLINE} holds {online:?}, not a CPU list")
    })?;
    match per_core.checked_mul(cpus) {
        Some(n) if n <= MAX_LIMIT => Ok(n),
        _ => Err(format!(
            "{PODS_PER_CORE_ENV}={per_core} x {cpus} CPUs is more than {MAX_LIMIT} devices per \
             type: set {ENCLAVE_LIMIT_ENV} and {PROVISION_LIMIT_ENV}, or a smaller \
             {PODS_PER_CORE_ENV}"
        )),
    }
}

/// Reads one of the limits (`name`, `value` None: unset) with the default `default`.
pub fn parse_limit(name: &str, value: Option<&str>, default: u32) -> Result<u32, String> {
    config::parse_u32(name, value, default, 0..=MAX_LIMIT)
}

/// Devices per type, as configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub enclave: u32,
    pub provision: u32,
}

/// The tree when the enclave and provision nodes stat as `enclave` and `provision` (Err: why
/// not), with the reason for an empty tree.
pub fn tree(
    limits: Limits,
    enclave: Result<(), String>,
    provision: Result<(), String>,
) -> (DeviceTree, Option<String>) {
    let missing = match (enclave, provision) {
        (Err(e), _) => Some(format!("no SGX enclave node {ENCLAVE_NODE}: {e}")),
        (_, Err(e)) => Some(format!("no SGX provision node {PROVISION_NODE}: {e}")),
        _ => None,
    };
    if missing.is_some() {
        return (Vec::new(), missing);
    }
    let mut t = TreeBuilder::new();
    let devices = [
        (TYPE_ENCLAVE, "sgx-enclave", ENCLAVE_NODE, limits.enclave),
        (
            TYPE_PROVISION,
            "sgx-provision",
            PROVISION_NODE,
            limits.provision,
        ),
    ];
    for (dev_type, base, node, count) in devices {
        let info = DeviceInfo::new().node(node, node, "rw");
        t.add_shared(dev_type, base, count, info);
    }
    (t.build(), None)
}

/// Reads the configuration from the environment (and sysfs, for `PODS_PER_CORE`).
fn limits_from_env() -> Result<Limits, String> {
    let default = default_limit(config::env_var(PODS_PER_CORE_ENV).as_deref(), || {
        std::fs::read_to_string(CPU_ONLINE).ok()
    })?;
    let limit = |name: &str| parse_limit(name, config::env_var(name).as_deref(), default);
    Ok(Limits {
        enclave: limit(ENCLAVE_LIMIT_ENV)?,
        provision: limit(PROVISION_LIMIT_ENV)?,
    })
}

fn stat(path: &str) -> Result<(), String> {
    devfs::stat(path).map(|_| ())
}

struct Sgx;

impl wdp_guest::Scanner for Sgx {
    fn scan() -> Result<(), String> {
        let limits = limits_from_env()?;
        let mut vanished = Vanished::new();
        let mut notes = Notes::new();
        wdp_guest::run(|| {
            let (t, reason) = tree(limits, stat(ENCLAVE_NODE), stat(PROVISION_NODE));
            notes.print(
                reason
                    .map(|r| format!("sgx: advertising no SGX devices: {r}"))
                    .into_iter()
                    .collect(),
            );
            Ok(vanished.mark(t))
        })
    }
}

wdp_guest::export_scanner!(Sgx);

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        enclave: 3,
        provision: 2,
    };

    #[test]
    fn cpu_lists() {
        assert_eq!(count_cpus("0-3\n"), Some(4));
        assert_eq!(count_cpus("0-3,8-11"), Some(8));
        assert_eq!(count_cpus("0,2,4-5"), Some(4));
        assert_eq!(count_cpus("0"), Some(1));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus("x"), None);
    }

    #[test]
    fn default_limits() {
        let never = || -> Option<String> { panic!("sysfs read without PODS_PER_CORE") };
        assert_eq!(default_limit(None, never), Ok(110));
        assert_eq!(
            default_limit(Some(""), never),
            Ok(110),
            "empty is unset, as upstream"
        );
        assert_eq!(default_limit(Some("10"), || Some("0-3\n".into())), Ok(40));
        assert_eq!(default_limit(Some("0"), || Some("0-3\n".into())), Ok(0));
        let e = default_limit(Some("ten"), || Some("0-3".into())).unwrap_err();
        assert!(e.starts_with("PODS_PER_CORE=\"ten\" is not valid"), "{e}");
        let e = default_limit(Some("10"), || None).unwrap_err();
        assert!(e.contains(CPU_ONLINE), "{e}");
        let e = default_limit(Some("1000"), || Some("0-63".into())).unwrap_err();
        assert!(e.contains("ENCLAVE_LIMIT"), "{e}");
        assert_eq!(parse_limit("ENCLAVE_LIMIT", Some("7"), 110), Ok(7));
        assert_eq!(parse_limit("ENCLAVE_LIMIT", None, 40), Ok(40));
        let e = parse_limit("PROVISION_LIMIT", Some("-1"), 110).unwrap_err();
        assert!(e.starts_with("PROVISION_LIMIT=\"-1\" is not valid"), "{e}");
    }

    #[test]
    fn both_nodes_or_nothing() {
        let (t, why) = tree(LIMITS, Ok(()), Ok(()));
        assert_eq!(why, None);
        let ids: Vec<Vec<&str>> = t
            .iter()
            .map(|g| g.devices.iter().map(|d| d.id.as_str()).collect())
            .collect();
        assert_eq!(t[0].dev_type, "enclave");
        assert_eq!(t[1].dev_type, "provision");
        assert_eq!(
            ids,
            [
                vec!["sgx-enclave-0", "sgx-enclave-1", "sgx-enclave-2"],
                vec!["sgx-provision-0", "sgx-provision-1"]
            ]
        );
        assert_eq!(t[1].devices[0].info.nodes[0].host_path, PROVISION_NODE);

        let (t, why) = tree(LIMITS, Ok(()), Err("not found".into()));
        assert!(t.is_empty());
        assert_eq!(
            why.as_deref(),
            Some("no SGX provision node /dev/sgx_provision: not found")
        );
        let (t, _) = tree(
            Limits {
                enclave: 0,
                provision: 1,
            },
            Ok(()),
            Ok(()),
        );
        assert_eq!(t.len(), 1, "a limit of 0 leaves its type out");
    }
}
