//! The `DEVICES` configuration: squat/generic-device-plugin's device specs, as one JSON list.
//!
//! ```json
//! [{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]},
//!  {"name": "yubikey", "groups": [{"usb": [{"vendor": "1050", "product": "0407"}]}]}]
//! ```

use wdp_guest::config::excerpt;
use wdp_guest::json::{self, Value};
use wdp_guest::tree::is_dev_type;
use wdp_guest::{devfs, sysfs, usb};

/// The environment variable holding the configuration.
pub const DEVICES_ENV: &str = "DEVICES";

const EXAMPLE: &str = r#"[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]}]"#;

/// Largest accepted `count` and `limit`: keeps a typo from producing millions of devices.
pub const MAX_SHARE: u64 = 10_000;

/// One device type: kubelet sees the resource `<namespace>/<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceType {
    pub name: String,
    pub groups: Vec<Group>,
}

/// Nodes scheduled together as one device, `count` times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub paths: Vec<PathSpec>,
    pub usb: Vec<UsbSpec>,
    /// how many containers may share each device of this group (ids get `-0`..`-<count-1>`)
    pub count: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathType {
    /// a device node (cgroup device rule + node in the container)
    Device,
    /// a bind mount
    Mount,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathSpec {
    /// glob of host paths, under /dev (or /sys for `Mount`)
    pub path: String,
    /// where it appears in the container; None: the host path; ending in `/`: that directory
    /// plus the matched file's name
    pub mount_path: Option<String>,
    /// cgroup permissions for `Device` (default "rw")
    pub permissions: String,
    pub kind: PathType,
    /// for `Mount`
    pub read_only: bool,
    /// how many devices of the group may use one match of this path (default 1)
    pub limit: u32,
    /// no match is fine: the path is left out instead of yielding no devices
    pub optional: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsbSpec {
    pub vendor: u16,
    pub product: u16,
    pub serial: Option<String>,
}

/// Parses the value of `DEVICES` (None: unset). Every error names `DEVICES`, the offending value
/// and what is valid.
pub fn parse_devices(value: Option<&str>) -> Result<Vec<DeviceType>, String> {
    let Some(text) = value else {
        return Err(format!(
            "{DEVICES_ENV} is not set: expected a JSON list of device types, e.g. {EXAMPLE}"
        ));
    };
    let v = json::parse(text).map_err(|e| {
        format!(
            "{DEVICES_ENV}={:?} is not valid JSON ({e}): expected a JSON list of device types, e.g. {EXAMPLE}",
            excerpt(text, 200)
        )
    })?;
    let items = v.as_array().ok_or_else(|| {
        format!(
            "{DEVICES_ENV} = {} is not valid: expected a JSON list of device types, e.g. {EXAMPLE}",
            excerpt(&v.to_string(), 200)
        )
    })?;
    let mut out: Vec<DeviceType> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("{DEVICES_ENV}[{i}]");
        let dt = device_type(&at, item)?;
        if out.iter().any(|d| d.name == dt.name) {
            return Err(format!(
                "{at}.name = {:?} is not valid: the name is already used by an earlier device type",
                dt.name
            ));
        }
        out.push(dt);
    }
    Ok(out)
}

fn invalid(at: &str, v: &Value, valid: &str) -> String {
    format!(
        "{at} = {} is not valid: expected {valid}",
        excerpt(&v.to_string(), 200)
    )
}

/// The members of object `v`, refusing unknown ones (a typo would otherwise be ignored silently).
fn object<'a>(at: &str, v: &'a Value, fields: &[&str]) -> Result<&'a [(String, Value)], String> {
    let members = v
        .as_object()
        .ok_or_else(|| invalid(at, v, &format!("an object with {}", fields.join(", "))))?;
    for (k, _) in members {
        if !fields.contains(&k.as_str()) {
            return Err(format!(
                "{at}: unknown field {k:?}; valid fields: {}",
                fields.join(", ")
            ));
        }
    }
    Ok(members)
}

fn field<'a>(members: &'a [(String, Value)], key: &str) -> Option<&'a Value> {
    members
        .iter()
        .find(|(k, v)| k == key && *v != Value::Null)
        .map(|(_, v)| v)
}

fn string(at: &str, v: &Value, valid: &str) -> Result<String, String> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| invalid(at, v, valid))
}

fn boolean(at: &str, v: Option<&Value>) -> Result<bool, String> {
    match v {
        None => Ok(false),
        Some(v) => v.as_bool().ok_or_else(|| invalid(at, v, "true or false")),
    }
}

fn count(at: &str, v: Option<&Value>) -> Result<u32, String> {
    match v {
        None => Ok(1),
        Some(v) => match v.as_u64() {
            Some(n @ 1..=MAX_SHARE) => Ok(n as u32),
            _ => Err(invalid(
                at,
                v,
                &format!("an integer from 1 to {MAX_SHARE} (default 1)"),
            )),
        },
    }
}

fn list<'a>(at: &str, v: Option<&'a Value>, what: &str) -> Result<&'a [Value], String> {
    match v {
        None => Ok(&[]),
        Some(v) => v
            .as_array()
            .ok_or_else(|| invalid(at, v, &format!("a list of {what}"))),
    }
}

fn device_type(at: &str, v: &Value) -> Result<DeviceType, String> {
    let m = object(at, v, &["name", "groups"])?;
    let name_at = format!("{at}.name");
    let name_v = field(m, "name").ok_or_else(|| format!("{at}: missing field \"name\""))?;
    let name = string(&name_at, name_v, "a string")?;
    if !is_dev_type(&name) {
        return Err(invalid(
            &name_at,
            name_v,
            "a resource name of at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        ));
    }
    let groups_at = format!("{at}.groups");
    let groups_v = list(&groups_at, field(m, "groups"), "groups")?;
    if groups_v.is_empty() {
        return Err(format!(
            "{groups_at}: missing or empty: expected a list of groups, e.g. [{{\"paths\":[{{\"path\":\"/dev/ttyUSB*\"}}]}}]"
        ));
    }
    let groups = groups_v
        .iter()
        .enumerate()
        .map(|(i, g)| group(&format!("{groups_at}[{i}]"), g))
        .collect::<Result<_, _>>()?;
    Ok(DeviceType { name, groups })
}

fn group(at: &str, v: &Value) -> Result<Group, String> {
    let m = object(at, v, &["paths", "usb", "count"])?;
    let paths_at = format!("{at}.paths");
    let paths = list(&paths_at, field(m, "paths"), "paths")?
        .iter()
        .enumerate()
        .map(|(i, p)| path(&format!("{paths_at}[{i}]"), p))
        .collect::<Result<Vec<_>, _>>()?;
    let usb_at = format!("{at}.usb");
    let usb = list(&usb_at, field(m, "usb"), "USB specs")?
        .iter()
        .enumerate()
        .map(|(i, u)| usb_spec(&format!("{usb_at}[{i}]"), u))
        .collect::<Result<Vec<_>, _>>()?;
    if paths.is_empty() && usb.is_empty() {
        return Err(format!(
            "{at}: needs \"paths\" or \"usb\" (a non-empty list), e.g. {{\"paths\":[{{\"path\":\"/dev/ttyUSB*\"}}]}}"
        ));
    }
    let count = count(&format!("{at}.count"), field(m, "count"))?;
    Ok(Group { paths, usb, count })
}

const PATH_FIELDS: &[&str] = &[
    "path",
    "mountPath",
    "permissions",
    "type",
    "readOnly",
    "limit",
    "optional",
];

fn path(at: &str, v: &Value) -> Result<PathSpec, String> {
    let m = object(at, v, PATH_FIELDS)?;
    let kind = match field(m, "type") {
        None => PathType::Device,
        Some(t) => match t.as_str() {
            Some("Device") => PathType::Device,
            Some("Mount") => PathType::Mount,
            _ => return Err(invalid(&format!("{at}.type"), t, "\"Device\" or \"Mount\"")),
        },
    };
    let path_at = format!("{at}.path");
    let path_v = field(m, "path").ok_or_else(|| format!("{at}: missing field \"path\""))?;
    let path = string(&path_at, path_v, "a string")?;
    let checked = match kind {
        PathType::Device => devfs::check_dev_pattern(&path),
        PathType::Mount => devfs::check_dev_pattern(&path).or_else(|_| {
            sysfs::check_sys_pattern(&path)
                .map_err(|_| "must be a path under /dev/ or /sys/".to_string())
        }),
    };
    if let Err(why) = checked {
        let valid = match kind {
            PathType::Device => "an absolute path or glob under /dev/ (e.g. \"/dev/ttyUSB*\")",
            PathType::Mount => "an absolute path or glob under /dev/ or /sys/",
        };
        return Err(format!("{}: {why}", invalid(&path_at, path_v, valid)));
    }
    let mount_path = match field(m, "mountPath") {
        None => None,
        Some(mp) => {
            let s = string(&format!("{at}.mountPath"), mp, "an absolute path")?;
            if !s.starts_with('/') || s.split('/').any(|c| c == "..") {
                return Err(invalid(
                    &format!("{at}.mountPath"),
                    mp,
                    "an absolute path without '..' (a trailing '/' appends the matched file's name)",
                ));
            }
            Some(s)
        }
    };
    let permissions = match field(m, "permissions") {
        None => "rw".to_string(),
        Some(p) => {
            let s = string(&format!("{at}.permissions"), p, "a string")?;
            let ok = !s.is_empty()
                && s.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
                && !s.chars().enumerate().any(|(i, c)| s[..i].contains(c));
            if !ok {
                return Err(invalid(
                    &format!("{at}.permissions"),
                    p,
                    "one or more of r, w, m (e.g. \"rw\", the default)",
                ));
            }
            s
        }
    };
    Ok(PathSpec {
        path,
        mount_path,
        permissions,
        kind,
        read_only: boolean(&format!("{at}.readOnly"), field(m, "readOnly"))?,
        limit: count(&format!("{at}.limit"), field(m, "limit"))?,
        optional: boolean(&format!("{at}.optional"), field(m, "optional"))?,
    })
}

/// A USB id: a string of 1 to 4 hex digits (optionally `0x`-prefixed), or a JSON number whose
/// digits are read as hex (as squat's plugin does: `1050` means 0x1050).
pub fn parse_usb_id(v: &Value) -> Option<u16> {
    match v {
        Value::String(s) | Value::Number(s) => usb::parse_id(s),
        _ => None,
    }
}

fn usb_spec(at: &str, v: &Value) -> Result<UsbSpec, String> {
    let m = object(at, v, &["vendor", "product", "serial"])?;
    let id = |key: &str| -> Result<u16, String> {
        let v = field(m, key).ok_or_else(|| format!("{at}: missing field {key:?}"))?;
        parse_usb_id(v).ok_or_else(|| {
            invalid(
                &format!("{at}.{key}"),
                v,
                "a USB id of 1 to 4 hex digits, e.g. \"1050\"",
            )
        })
    };
    let vendor = id("vendor")?;
    let product = id("product")?;
    let serial = match field(m, "serial") {
        None => None,
        Some(s) => Some(string(&format!("{at}.serial"), s, "a string")?).filter(|s| !s.is_empty()),
    };
    Ok(UsbSpec {
        vendor,
        product,
        serial,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let d = parse_devices(Some(
            r#"[{"name":"serial","groups":[{"paths":[{"path":"/dev/ttyUSB*"}]}]},
                {"name":"yubikey","groups":[{"usb":[{"vendor":"1050","product":"0407"}]}]}]"#,
        ))
        .unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].name, "serial");
        let p = &d[0].groups[0].paths[0];
        assert_eq!(p.path, "/dev/ttyUSB*");
        assert_eq!(p.permissions, "rw");
        assert_eq!(p.kind, PathType::Device);
        assert_eq!((p.limit, p.optional, p.read_only), (1, false, false));
        assert_eq!(p.mount_path, None);
        assert_eq!(d[0].groups[0].count, 1);
        assert_eq!(
            d[1].groups[0].usb,
            [UsbSpec {
                vendor: 0x1050,
                product: 0x0407,
                serial: None
            }]
        );
    }

    #[test]
    fn parses_every_field() {
        let d = parse_devices(Some(
            r#"[{"name":"gpu.v1","groups":[{"count":4,"paths":[
                {"path":"/dev/dri/card*","mountPath":"/dev/dri/","permissions":"mrw","type":"Device","limit":2},
                {"path":"/sys/class/drm","type":"Mount","readOnly":true,"optional":true}],
              "usb":[{"vendor":"0x1D6B","product":2,"serial":"abc"}]}]}]"#,
        ))
        .unwrap();
        let g = &d[0].groups[0];
        assert_eq!(g.count, 4);
        assert_eq!(g.paths[0].mount_path.as_deref(), Some("/dev/dri/"));
        assert_eq!(g.paths[0].permissions, "mrw");
        assert_eq!(g.paths[0].limit, 2);
        assert_eq!(g.paths[1].kind, PathType::Mount);
        assert!(g.paths[1].read_only && g.paths[1].optional);
        assert_eq!(g.usb[0].vendor, 0x1d6b);
        assert_eq!(g.usb[0].product, 2);
        assert_eq!(g.usb[0].serial.as_deref(), Some("abc"));
    }

    fn err(text: &str) -> String {
        parse_devices(Some(text)).unwrap_err()
    }

    #[test]
    fn errors_name_variable_value_and_what_is_valid() {
        let e = parse_devices(None).unwrap_err();
        assert!(
            e.contains("DEVICES is not set") && e.contains("/dev/ttyUSB*"),
            "{e}"
        );

        let e = err("[{name:1}]");
        assert!(
            e.starts_with("DEVICES=\"[{name:1}]\" is not valid JSON"),
            "{e}"
        );
        assert!(e.contains("at byte 2"), "{e}");

        let e = err(r#"{"name":"x"}"#);
        assert!(e.contains("expected a JSON list"), "{e}");

        let e = err(
            r#"[{"name":"serial","groups":[{"paths":[{"path":"/dev/tty*","type":"Block"}]}]}]"#,
        );
        assert_eq!(
            e,
            r#"DEVICES[0].groups[0].paths[0].type = "Block" is not valid: expected "Device" or "Mount""#
        );

        let e = err(r#"[{"name":"s","groups":[{"paths":[{"path":"/etc/passwd"}]}]}]"#);
        assert!(
            e.starts_with("DEVICES[0].groups[0].paths[0].path = \"/etc/passwd\" is not valid"),
            "{e}"
        );
        assert!(e.contains("under /dev/"), "{e}");

        let e = err(r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/../etc"}]}]}]"#);
        assert!(e.contains("'..'"), "{e}");

        let e = err(r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/x","mountpath":"/y"}]}]}]"#);
        assert!(
            e.contains("unknown field \"mountpath\"") && e.contains("mountPath"),
            "{e}"
        );

        let e = err(r#"[{"name":"s","groups":[{"count":0,"paths":[{"path":"/dev/x"}]}]}]"#);
        assert!(
            e.starts_with("DEVICES[0].groups[0].count = 0 is not valid"),
            "{e}"
        );

        let e =
            err(r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/x","permissions":"rwx"}]}]}]"#);
        assert!(e.contains("permissions = \"rwx\""), "{e}");
        assert!(
            err(r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/x","permissions":"rr"}]}]}]"#)
                .contains("permissions")
        );

        let e = err(r#"[{"name":"s","groups":[{"usb":[{"vendor":"zz","product":"1"}]}]}]"#);
        assert!(e.contains("vendor = \"zz\"") && e.contains("hex"), "{e}");

        let e = err(r#"[{"name":"s","groups":[{}]}]"#);
        assert!(e.contains("needs \"paths\" or \"usb\""), "{e}");

        let e = err(r#"[{"name":"s/x","groups":[{"paths":[{"path":"/dev/x"}]}]}]"#);
        assert!(e.contains("name = \"s/x\""), "{e}");

        let e = err(r#"[{"name":"s","groups":[]}]"#);
        assert!(e.contains("groups"), "{e}");

        let e = err(
            r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/x"}]}]},{"name":"s","groups":[{"paths":[{"path":"/dev/y"}]}]}]"#,
        );
        assert!(
            e.contains("DEVICES[1].name") && e.contains("already used"),
            "{e}"
        );

        let e = err(
            r#"[{"name":"s","groups":[{"paths":[{"path":"/dev/x","type":"Mount","mountPath":"rel"}]}]}]"#,
        );
        assert!(e.contains("mountPath = \"rel\""), "{e}");

        let e = err(r#"[{"name":"s","groups":[{"paths":[{"path":"/sys/x"}]}]}]"#);
        assert!(e.contains("path = \"/sys/x\""), "{e}");
        assert!(
            parse_devices(Some(
                r#"[{"name":"s","groups":[{"paths":[{"path":"/sys/x","type":"Mount"}]}]}]"#
            ))
            .is_ok()
        );
        assert_eq!(parse_devices(Some("[]")), Ok(vec![]));
    }

    #[test]
    fn usb_ids() {
        use Value::*;
        assert_eq!(parse_usb_id(&String("1050".into())), Some(0x1050));
        assert_eq!(parse_usb_id(&String("0x0407".into())), Some(0x0407));
        assert_eq!(parse_usb_id(&Number("1050".into())), Some(0x1050));
        assert_eq!(parse_usb_id(&String("12345".into())), None);
        assert_eq!(parse_usb_id(&String("".into())), None);
        assert_eq!(parse_usb_id(&Bool(true)), None);
    }

    #[test]
    fn names_are_resource_names() {
        let group = r#"[{"paths":[{"path":"/dev/fuse"}]}]"#;
        let devices = |name: &str| format!(r#"[{{"name":"{name}","groups":{group}}}]"#);
        assert!(parse_devices(Some(&devices("a.b-c_d9"))).is_ok());
        for bad in ["", "-a", "a/b"] {
            let e = parse_devices(Some(&devices(bad))).unwrap_err();
            assert!(e.contains("a resource name of at most 63"), "{bad:?}: {e}");
        }
    }
}
