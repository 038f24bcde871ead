//! `static_tree`: a test scanner that serves exactly the tree its environment describes, so host
//! tests can shape any tree (envs for renumbering hooks, unhealthy devices, NUMA nodes).
//!
//! Env `TREE`: `{"<dev-type>": {"<id>": {"health": "Unhealthy", "nodes": ["/dev/x"],
//! "envs": {"K": "V"}, "numa": [0]}}}`; every key of a device is optional (healthy, no nodes).
//! A node is a path (the same in the container, `rw`) or `{"host": "/dev/x", "container":
//! "/dev/y", "permissions": "r"}`; `"mounts": [{"host": "/a", "container": "/b", "read-only":
//! true}]` adds mounts.
//! Env `ATTRIBUTES` (optional): `{"<dev-type>": {"<id>": {"attributes": {"model": "A100",
//! "ecc": true, "cores": 108, "fw": {"version": "1.2.3"}}, "capacities": {"memory": "80Gi"}}}}`:
//! typed attributes (a JSON string, bool, integer, or `{"version": ...}`) and capacities for
//! devices of the tree, notified with it through `notify-with-attributes` (contract 0.1.1).
//! It notifies that tree once, then waits for the host to stop it.

use wdp_guest::json::{self, Value};
use wdp_guest::{DeviceAttributes, DeviceInfo, DeviceTree, TreeBuilder, config, devfs};

/// Builds the tree described by `text` (the `TREE` variable).
pub fn parse_tree(text: &str) -> Result<DeviceTree, String> {
    let root = json::parse(text).map_err(|e| format!("TREE: {e}"))?;
    let types = root
        .as_object()
        .ok_or("TREE: expected an object of dev-types")?;
    let mut tree = TreeBuilder::new();
    for (dev_type, devices) in types {
        let devices = devices
            .as_object()
            .ok_or_else(|| format!("TREE.{dev_type}: expected an object of devices"))?;
        tree.group(dev_type);
        for (id, spec) in devices {
            tree.add(
                dev_type,
                id,
                device(spec).map_err(|e| format!("TREE.{dev_type}.{id}: {e}"))?,
            );
        }
    }
    Ok(tree.build())
}

fn device(spec: &Value) -> Result<DeviceInfo, String> {
    let mut info = DeviceInfo::new();
    if spec.get("health").and_then(Value::as_str) == Some("Unhealthy") {
        info = info.unhealthy();
    }
    for node in spec
        .get("nodes")
        .and_then(Value::as_array)
        .unwrap_or_default()
    {
        info = match node.as_str() {
            Some(path) => info.node(path, path, "rw"),
            None => {
                let host = field(node, "host", "nodes")?;
                let container = node.get("container").and_then(Value::as_str);
                let permissions = node.get("permissions").and_then(Value::as_str);
                info.node(host, container.unwrap_or(host), permissions.unwrap_or("rw"))
            }
        };
    }
    for mount in spec
        .get("mounts")
        .and_then(Value::as_array)
        .unwrap_or_default()
    {
        let host = field(mount, "host", "mounts")?;
        let container = field(mount, "container", "mounts")?;
        let read_only = mount.get("read-only").and_then(Value::as_bool);
        info = info.mount(host, container, read_only.unwrap_or(true));
    }
    for (k, v) in spec
        .get("envs")
        .and_then(Value::as_object)
        .unwrap_or_default()
    {
        info = info.env(k, v.as_str().ok_or("envs: expected string values")?);
    }
    if let Some(numa) = spec.get("numa").and_then(Value::as_array) {
        let ids: Option<Vec<u32>> = numa
            .iter()
            .map(|n| n.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect();
        info = info.numa_nodes(ids.ok_or("numa: expected small integers")?);
    }
    Ok(info)
}

/// The typed attributes described by `text` (the `ATTRIBUTES` variable).
pub fn parse_attributes(text: &str) -> Result<Vec<DeviceAttributes>, String> {
    let root = json::parse(text).map_err(|e| format!("ATTRIBUTES: {e}"))?;
    let types = root
        .as_object()
        .ok_or("ATTRIBUTES: expected an object of dev-types")?;
    let mut out = Vec::new();
    for (dev_type, devices) in types {
        let devices = devices
            .as_object()
            .ok_or_else(|| format!("ATTRIBUTES.{dev_type}: expected an object of devices"))?;
        for (id, spec) in devices {
            let mut b = wdp_guest::tree::attributes(dev_type, id);
            let at = format!("ATTRIBUTES.{dev_type}.{id}");
            let entries = |key: &str| spec.get(key).and_then(Value::as_object).unwrap_or_default();
            for (name, v) in entries("attributes") {
                b = match v {
                    Value::Bool(x) => b.bool(name, *x),
                    Value::String(x) => b.text(name, x),
                    Value::Number(n) => b.int(
                        name,
                        n.parse()
                            .map_err(|_| format!("{at}.{name}: not an integer"))?,
                    ),
                    other => {
                        let version = other.get("version").and_then(Value::as_str);
                        b.version(
                            name,
                            version.ok_or_else(|| format!("{at}.{name}: bad value"))?,
                        )
                    }
                };
            }
            for (name, q) in entries("capacities") {
                b = b.capacity(
                    name,
                    q.as_str()
                        .ok_or_else(|| format!("{at}.{name}: not a string"))?,
                );
            }
            out.push(b.build());
        }
    }
    Ok(out)
}

/// The string `key` of `value`, an entry of the list `list`.
fn field<'a>(value: &'a Value, key: &str, list: &str) -> Result<&'a str, String> {
    value
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| format!("{list}: expected a path or an object with a string {key:?}"))
}

struct Static;

impl wdp_guest::Scanner for Static {
    fn scan() -> Result<(), String> {
        let text = config::env_var("TREE").ok_or("TREE is not set")?;
        let tree = parse_tree(&text)?;
        match config::env_var("ATTRIBUTES") {
            Some(attrs) => wdp_guest::notify_with_attributes(&tree, &parse_attributes(&attrs)?),
            None => wdp_guest::notify(&tree),
        }
        loop {
            devfs::wait_for_change(u32::MAX);
        }
    }
}

wdp_guest::export_scanner!(Static);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses() {
        let t = parse_tree(
            r#"{"qat": {"a": {"nodes": ["/dev/vfio/1"], "envs": {"QAT1": "x"}}, "b": {"health": "Unhealthy"}}}"#,
        )
        .unwrap();
        assert_eq!(t[0].dev_type, "qat");
        assert_eq!(t[0].devices.len(), 2);
        assert!(parse_tree("[]").is_err());
        let t = parse_tree(
            r#"{"p": {"a": {"nodes": [{"host": "/dev/x", "container": "/dev/y", "permissions": "r"}], "mounts": [{"host": "/a", "container": "/b"}]}}}"#,
        )
        .unwrap();
        let info = &t[0].devices[0].info;
        assert_eq!(info.nodes[0].container_path, "/dev/y");
        assert_eq!(info.nodes[0].permissions, "r");
        assert!(info.mounts[0].read_only);
        assert!(parse_tree(r#"{"p": {"a": {"nodes": [{"container": "/dev/y"}]}}}"#).is_err());
    }
}
