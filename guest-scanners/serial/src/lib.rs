//! `serial`: USB serial adapters (ttyUSB, ttyACM) named by their stable udev `by-id` links, so a
//! device keeps its id when the kernel renumbers it.
//!
//! Reads `/dev/serial/by-id` through devfs. udev makes one symlink there per serial port, named
//! after the adapter's vendor, model, serial number and interface, pointing at the kernel's node:
//! `usb-FTDI_FT232R_USB_UART_A12345-if00-port0 -> ../../ttyUSB0`. Each link whose target is a
//! character device under /dev is one device:
//!
//! * id: the link's name, made id-safe by [`sanitize_id`] (characters other than letters, digits,
//!   `.`, `_`, `-` become `_`); a name longer than kubelet's 63 characters keeps its first 54
//!   and gets `-` and 8 hex digits of a hash (FNV-1a) of the whole name, so it stays unique and
//!   stable ([`device_id`]);
//! * node: the link's target (`/dev/ttyUSB1`) as the host path, permissions "rw". A device
//!   re-enumerated from ttyUSB0 to ttyUSB1 keeps its id, and the next Allocate hands out the new
//!   node. In the container (`CONTAINER_PATHS`) it appears at the kernel path, at
//!   `/dev/serial/by-id/<name>`, or both (default): programs configured with the stable by-id
//!   path keep working in the container, where udev does not run.
//!
//! Configuration:
//!
//! * `SERIAL_TYPE` (default `serial`): the device type (kubelet resource `<namespace>/<type>`);
//!   1 to 63 letters, digits, `-`, `_`, `.`, starting and ending with a letter or digit.
//! * `SERIAL_MATCH` (default: every device): comma-separated patterns; a device is kept when any
//!   matches its name (the by-id name, or the kernel name of an unnamed device). A pattern with
//!   `*` (any run of characters) or `?` (one character) must match the whole name; any other
//!   pattern matches a substring (`FTDI`, `usb-Silicon_Labs_*-port0`). Patterns cannot hold `/`.
//! * `INCLUDE_UNNAMED` (`true` or `false`, default `false`): also offer `/dev/ttyUSB*` and
//!   `/dev/ttyACM*` character devices that no by-id link points at (a node without udev), with
//!   the kernel name as id (`ttyUSB3`) and the kernel path in the container. Such ids follow the
//!   kernel's numbering, so they are not stable across re-enumeration.
//! * `CONTAINER_PATHS` (`both`, `kernel` or `by-id`, default `both`): where a named device's node
//!   appears in the container.
//! * `RESCAN_INTERVAL_MS` (default 30000): longest wait between scans (udev changing
//!   /dev/serial/by-id wakes the scanner at once).
//!
//! The type is always in the tree, with zero devices when nothing matches. A device whose link
//! or node goes away stays listed, Unhealthy, until it comes back ([`Vanished`]).
//!
//! Replaces squat/generic-device-plugin's path groups over `/dev/ttyUSB*` (ids `ttyUSB0` follow
//! the kernel's numbering, so a re-plug can swap two adapters between pods) and Akri's udev
//! discovery of serial devices (which matches udev rules and names instances by a hash). The
//! by-id names are udev's own stable names; the sandbox has no udev database to match rules on.

use wdp_guest::config::{self, excerpt};
use wdp_guest::health::Vanished;
use wdp_guest::tree::{is_dev_type, sanitize_id};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, devfs};

/// Where udev puts the stable links.
pub const BY_ID_DIR: &str = "/dev/serial/by-id";
/// Kernel nodes offered by `INCLUDE_UNNAMED`.
pub const KERNEL_GLOBS: [&str; 2] = ["/dev/ttyUSB*", "/dev/ttyACM*"];
/// The environment variable with the device type.
pub const TYPE_ENV: &str = "SERIAL_TYPE";
/// The device type when `SERIAL_TYPE` is unset.
pub const DEFAULT_TYPE: &str = "serial";
/// The environment variable with the name filter.
pub const MATCH_ENV: &str = "SERIAL_MATCH";
/// The environment variable that admits devices without a by-id link.
pub const UNNAMED_ENV: &str = "INCLUDE_UNNAMED";
/// The environment variable choosing the container paths.
pub const PATHS_ENV: &str = "CONTAINER_PATHS";
/// kubelet's limit on device ids.
pub const MAX_ID_LEN: usize = 63;

/// Where a named device's node appears in the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerPaths {
    /// At the kernel path and at the by-id path.
    Both,
    /// At the kernel path only (`/dev/ttyUSB0`).
    Kernel,
    /// At the by-id path only.
    ById,
}

/// The scanner's configuration, from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `SERIAL_TYPE`.
    pub dev_type: String,
    /// `SERIAL_MATCH`; empty: every device.
    pub patterns: Vec<String>,
    /// `INCLUDE_UNNAMED`.
    pub include_unnamed: bool,
    /// `CONTAINER_PATHS`.
    pub container_paths: ContainerPaths,
}

/// Reads the configuration from the four values (None: unset), in the order `SERIAL_TYPE`,
/// `SERIAL_MATCH`, `INCLUDE_UNNAMED`, `CONTAINER_PATHS`.
pub fn parse_config(
    dev_type: Option<&str>,
    patterns: Option<&str>,
    include_unnamed: Option<&str>,
    container_paths: Option<&str>,
) -> Result<Config, String> {
    let dev_type = match dev_type {
        None => DEFAULT_TYPE.to_string(),
        Some(raw) if is_dev_type(raw.trim()) => raw.trim().to_string(),
        Some(raw) => {
            return Err(format!(
                "{TYPE_ENV}={:?} is not valid: expected 1 to 63 letters, digits, '-', '_' or '.', \
                 starting and ending with a letter or digit (default {DEFAULT_TYPE})",
                excerpt(raw, 80)
            ));
        }
    };
    let patterns = parse_patterns(patterns)?;
    let include_unnamed =
        config::parse_choice(UNNAMED_ENV, include_unnamed, "false", &["true", "false"])? == "true";
    let container_paths = match config::parse_choice(
        PATHS_ENV,
        container_paths,
        "both",
        &["both", "kernel", "by-id"],
    )? {
        "kernel" => ContainerPaths::Kernel,
        "by-id" => ContainerPaths::ById,
        _ => ContainerPaths::Both,
    };
    Ok(Config {
        dev_type,
        patterns,
        include_unnamed,
        container_paths,
    })
}

/// Reads `SERIAL_MATCH` (None or blank: no filter).
pub fn parse_patterns(value: Option<&str>) -> Result<Vec<String>, String> {
    let Some(raw) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(Vec::new());
    };
    raw.split(',')
        .enumerate()
        .map(|(i, p)| {
            let p = p.trim();
            if p.is_empty() || p.contains('/') {
                Err(format!(
                    "{MATCH_ENV}={:?} is not valid: pattern {} is {}: expected comma-separated \
                     substrings or globs (* and ?) of /dev/serial/by-id names, without '/', e.g. \
                     FTDI,usb-Silicon_Labs_*",
                    excerpt(raw, 200),
                    i + 1,
                    if p.is_empty() { "empty" } else { "a path" },
                ))
            } else {
                Ok(p.to_string())
            }
        })
        .collect()
}

/// Whether `name` matches the glob `pattern` (`*` any run, `?` one character), wholly.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    // Where the last `*` was, and the name position it currently absorbs up to.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Whether `name` passes the `SERIAL_MATCH` patterns (all names do when there are none).
pub fn selected(patterns: &[String], name: &str) -> bool {
    patterns.is_empty()
        || patterns.iter().any(|p| {
            if p.contains(['*', '?']) {
                glob_match(p, name)
            } else {
                name.contains(p.as_str())
            }
        })
}

/// 32-bit FNV-1a: a tiny, fixed hash, so a shortened id is the same on every node and release.
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The device id for a by-id (or kernel) name: see the crate doc.
pub fn device_id(name: &str) -> String {
    let id = sanitize_id(name);
    if id.len() <= MAX_ID_LEN {
        return id;
    }
    // sanitize_id leaves ASCII only, so any byte index is a char boundary.
    format!("{}-{:08x}", &id[..MAX_ID_LEN - 9], fnv1a(name))
}

/// The absolute path a link at `dir/<name>` with stored target `target` points at, resolved
/// lexically; None unless it is strictly under /dev.
pub fn resolve_link(dir: &str, target: &str) -> Option<String> {
    let joined = if target.starts_with('/') {
        target.to_string()
    } else {
        format!("{dir}/{target}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for c in joined.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    (parts.len() >= 2 && parts[0] == "dev").then(|| format!("/{}", parts.join("/")))
}

/// A by-id link whose target is a character device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    /// The link's name in /dev/serial/by-id.
    pub name: String,
    /// The kernel node it points at, e.g. `/dev/ttyUSB0`.
    pub node: String,
}

/// The device tree: `named` devices (sorted by name) and, with `include_unnamed`, the
/// `kernel_nodes` no named device points at.
pub fn tree(cfg: &Config, named: &[Named], kernel_nodes: &[String]) -> DeviceTree {
    let mut t = TreeBuilder::new();
    t.group(&cfg.dev_type);
    for n in named.iter().filter(|n| selected(&cfg.patterns, &n.name)) {
        let by_id = format!("{BY_ID_DIR}/{}", n.name);
        let info = DeviceInfo::new();
        let info = match cfg.container_paths {
            ContainerPaths::Kernel => info.node(&n.node, &n.node, "rw"),
            ContainerPaths::ById => info.node(&n.node, &by_id, "rw"),
            ContainerPaths::Both => info
                .node(&n.node, &n.node, "rw")
                .node(&n.node, &by_id, "rw"),
        };
        t.add(&cfg.dev_type, device_id(&n.name), info);
    }
    if cfg.include_unnamed {
        for node in kernel_nodes {
            let name = node.rsplit('/').next().unwrap_or(node);
            if named.iter().any(|n| &n.node == node) || !selected(&cfg.patterns, name) {
                continue;
            }
            t.add(
                &cfg.dev_type,
                device_id(name),
                DeviceInfo::new().node(node, node, "rw"),
            );
        }
    }
    t.build()
}

/// The by-id links of this machine whose targets are character devices under /dev.
fn named_devices() -> Vec<Named> {
    let Ok(entries) = devfs::read_dir(BY_ID_DIR) else {
        return Vec::new();
    };
    let mut out: Vec<Named> = entries
        .into_iter()
        .filter(|e| e.kind == devfs::NodeKind::Symlink)
        .filter_map(|e| {
            let target = devfs::read_link(&format!("{BY_ID_DIR}/{}", e.name)).ok()?;
            let node = resolve_link(BY_ID_DIR, &target)?;
            devfs::exists_char_device(&node).then_some(Named { name: e.name, node })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The kernel's ttyUSB/ttyACM character devices, sorted by path.
fn kernel_nodes() -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for pattern in KERNEL_GLOBS {
        out.extend(
            devfs::glob_dev(pattern)?
                .into_iter()
                .filter(|m| m.node.kind == devfs::NodeKind::CharDevice)
                .map(|m| m.path),
        );
    }
    out.sort();
    Ok(out)
}

struct Serial;

impl wdp_guest::Scanner for Serial {
    fn scan() -> Result<(), String> {
        let env = |name: &str| config::env_var(name);
        let cfg = parse_config(
            env(TYPE_ENV).as_deref(),
            env(MATCH_ENV).as_deref(),
            env(UNNAMED_ENV).as_deref(),
            env(PATHS_ENV).as_deref(),
        )?;
        let mut vanished = Vanished::new();
        wdp_guest::run(move || {
            let kernel = if cfg.include_unnamed {
                kernel_nodes()?
            } else {
                Vec::new()
            };
            let now = tree(&cfg, &named_devices(), &kernel);
            Ok(vanished.mark(now))
        })
    }
}

wdp_guest::export_scanner!(Serial);

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        parse_config(None, None, None, None).unwrap()
    }

    fn named(name: &str, node: &str) -> Named {
        Named {
            name: name.into(),
            node: node.into(),
        }
    }

    fn ids(t: &DeviceTree) -> Vec<&str> {
        t[0].devices.iter().map(|d| d.id.as_str()).collect()
    }

    const FTDI: &str = "usb-FTDI_FT232R_USB_UART_A12345-if00-port0";
    const CP210X: &str =
        "usb-Silicon_Labs_CP2102N_USB_to_UART_Bridge_Controller_0001a2b3c4d5e6f7-if00-port0";

    #[test]
    fn config_defaults_and_errors() {
        assert_eq!(
            cfg(),
            Config {
                dev_type: "serial".into(),
                patterns: vec![],
                include_unnamed: false,
                container_paths: ContainerPaths::Both,
            }
        );
        let c = parse_config(
            Some("gps"),
            Some("FTDI, *port0"),
            Some("true"),
            Some("by-id"),
        )
        .unwrap();
        assert_eq!(c.dev_type, "gps");
        assert_eq!(c.patterns, ["FTDI", "*port0"]);
        assert!(c.include_unnamed);
        assert_eq!(c.container_paths, ContainerPaths::ById);
        let e = parse_config(Some("a/b"), None, None, None).unwrap_err();
        assert!(e.starts_with("SERIAL_TYPE=\"a/b\" is not valid"), "{e}");
        let e = parse_config(None, Some("FTDI,,x"), None, None).unwrap_err();
        assert!(
            e.starts_with("SERIAL_MATCH=\"FTDI,,x\" is not valid: pattern 2 is empty"),
            "{e}"
        );
        let e = parse_config(None, Some("../ttyS0"), None, None).unwrap_err();
        assert!(e.contains("pattern 1 is a path"), "{e}");
        let e = parse_config(None, None, Some("yes"), None).unwrap_err();
        assert!(
            e.starts_with("INCLUDE_UNNAMED=\"yes\" is not valid") && e.contains("true, false"),
            "{e}"
        );
        let e = parse_config(None, None, None, Some("host")).unwrap_err();
        assert!(
            e.starts_with("CONTAINER_PATHS=\"host\" is not valid") && e.contains("by-id"),
            "{e}"
        );
        assert!(
            parse_config(None, Some("  "), None, None)
                .unwrap()
                .patterns
                .is_empty()
        );
    }

    #[test]
    fn globs_and_substrings() {
        assert!(glob_match("*", ""));
        assert!(glob_match("usb-*-port0", FTDI));
        assert!(glob_match("usb-FTDI_*_A1234?-if00-port0", FTDI));
        assert!(
            !glob_match("usb-FTDI_*_A1234?-if00", FTDI),
            "globs match whole names"
        );
        assert!(glob_match("*a*b*c", "xaxxbyyc"));
        assert!(!glob_match("*a*b*c", "xaxxbyycd"));
        assert!(glob_match("a**b", "ab"));
        assert!(glob_match("a*", "a*b"), "a '*' in the name is no wildcard");
        assert!(!glob_match("?", ""));
        let p = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(selected(&[], FTDI));
        assert!(selected(&p(&["FTDI"]), FTDI));
        assert!(!selected(&p(&["ftdi"]), FTDI), "case-sensitive");
        assert!(selected(&p(&["Silicon", "A12345"]), FTDI));
        assert!(!selected(&p(&["usb-FTDI"]), "ttyUSB0"));
    }

    #[test]
    fn ids_fit_kubelet() {
        assert_eq!(device_id(FTDI), FTDI);
        assert_eq!(device_id("usb-Acme_a:b=c-if00"), "usb-Acme_a_b_c-if00");
        let long = device_id(CP210X);
        assert_eq!(long.len(), 63);
        assert!(
            long.starts_with("usb-Silicon_Labs_CP2102N_USB_to_UART_Bridge_Controller-"),
            "{long}"
        );
        assert_eq!(long, device_id(CP210X), "stable");
        let other = CP210X.replace("port0", "port1");
        assert_ne!(device_id(&other), long, "distinct names stay distinct");
        // Known FNV-1a 32 values.
        assert_eq!(fnv1a(""), 0x811c_9dc5);
        assert_eq!(fnv1a("a"), 0xe40c_292c);
    }

    #[test]
    fn links_resolve_under_dev_only() {
        assert_eq!(
            resolve_link(BY_ID_DIR, "../../ttyUSB0").as_deref(),
            Some("/dev/ttyUSB0")
        );
        assert_eq!(
            resolve_link(BY_ID_DIR, "/dev/ttyACM1").as_deref(),
            Some("/dev/ttyACM1")
        );
        assert_eq!(resolve_link(BY_ID_DIR, "../../../etc/x"), None);
        assert_eq!(resolve_link(BY_ID_DIR, "../../.."), None);
        assert_eq!(
            resolve_link(BY_ID_DIR, "../../"),
            None,
            "/dev itself is no node"
        );
    }

    #[test]
    fn named_unnamed_and_container_paths() {
        let devs = [
            named(FTDI, "/dev/ttyUSB1"),
            named("usb-Arduino_Uno_X1-if00", "/dev/ttyACM0"),
        ];
        let kernel = ["/dev/ttyACM0", "/dev/ttyUSB1", "/dev/ttyUSB7"].map(String::from);
        let t = tree(&cfg(), &devs, &kernel);
        assert_eq!(ids(&t), [FTDI, "usb-Arduino_Uno_X1-if00"]);
        let nodes: Vec<(&str, &str)> = t[0].devices[0]
            .info
            .nodes
            .iter()
            .map(|n| (n.host_path.as_str(), n.container_path.as_str()))
            .collect();
        assert_eq!(
            nodes,
            [
                ("/dev/ttyUSB1", "/dev/ttyUSB1"),
                (
                    "/dev/ttyUSB1",
                    "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A12345-if00-port0"
                ),
            ]
        );
        let c = Config {
            include_unnamed: true,
            container_paths: ContainerPaths::Kernel,
            ..cfg()
        };
        let t = tree(&c, &devs, &kernel);
        assert_eq!(ids(&t), [FTDI, "usb-Arduino_Uno_X1-if00", "ttyUSB7"]);
        assert_eq!(t[0].devices[0].info.nodes.len(), 1);
        assert_eq!(t[0].devices[2].info.nodes[0].container_path, "/dev/ttyUSB7");
        let c = Config {
            container_paths: ContainerPaths::ById,
            patterns: vec!["Arduino".into()],
            include_unnamed: true,
            ..cfg()
        };
        let t = tree(&c, &devs, &kernel);
        assert_eq!(
            ids(&t),
            ["usb-Arduino_Uno_X1-if00"],
            "the filter applies to unnamed names too"
        );
        assert_eq!(
            t[0].devices[0].info.nodes[0].container_path,
            "/dev/serial/by-id/usb-Arduino_Uno_X1-if00"
        );
        let empty = tree(&cfg(), &[], &[]);
        assert_eq!((empty.len(), empty[0].dev_type.as_str()), (1, "serial"));
    }
}
