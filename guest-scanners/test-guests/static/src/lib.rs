//! `static_tree`: a test scanner that serves exactly the tree its environment describes, so host
//! tests can shape any tree (envs for renumbering hooks, unhealthy devices, NUMA nodes).
//!
//! Env `TREE`: `{"<dev-type>": {"<id>": {"health": "Unhealthy", "nodes": ["/dev/x"],
//! "envs": {"K": "V"}, "numa": [0]}}}`; every key of a device is optional (healthy, no nodes).
//! It notifies that tree once, then waits for the host to stop it.

use wdp_guest::json::{self, Value};
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config, devfs};

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
        let path = node.as_str().ok_or("nodes: expected strings")?;
        info = info.node(path, path, "rw");
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

struct Static;

impl wdp_guest::Scanner for Static {
    fn scan() -> Result<(), String> {
        let text = config::env_var("TREE").ok_or("TREE is not set")?;
        wdp_guest::notify(&parse_tree(&text)?);
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
    }
}
