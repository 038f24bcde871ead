//! `wdp snapshot --redact NAME`: keep the values of some /sys attributes (serial numbers, MAC
//! addresses) out of a snapshot while keeping it replayable.
//!
//! Each distinct value of a /sys file named NAME becomes `redacted-<n>`, in the file and
//! wherever the same text appears in the manifest: the configuration (an `--env` that selects a
//! device by serial) and the recorded tree (an id built from it, as a key or a value). A scanner
//! that uses such a value verbatim then replays to the same tree; one that parses it (a serial
//! as a number) sees the placeholder, and its replay reports the difference.

use std::collections::BTreeMap;

use super::record::Recording;

/// Values shorter than this are redacted in files but not searched for elsewhere: "1" would
/// match everywhere.
const MIN_SEARCHED: usize = 4;

/// Redacts the contents of every recorded /sys file named one of `names`; returns the
/// replacements made (original text, placeholder) for the caller to apply to the manifest.
pub fn redact_files(rec: &mut Recording, names: &[String]) -> Vec<(String, String)> {
    let mut placeholders: BTreeMap<String, String> = BTreeMap::new();
    let mut n = 0usize;
    for (path, entry) in rec.sys.iter_mut() {
        let named = path
            .file_name()
            .and_then(|f| f.to_str())
            .is_some_and(|f| names.iter().any(|n| n == f));
        let Some(bytes) = entry.contents.as_mut().filter(|_| named) else {
            continue;
        };
        let text = String::from_utf8_lossy(bytes).into_owned();
        let value = text.trim_end_matches('\n').to_string();
        let placeholder = placeholders
            .entry(value.clone())
            .or_insert_with(|| {
                n += 1;
                format!("redacted-{n}")
            })
            .clone();
        let newline = if text.ends_with('\n') { "\n" } else { "" };
        *bytes = format!("{placeholder}{newline}").into_bytes();
    }
    placeholders
        .into_iter()
        .filter(|(value, _)| value.trim().len() >= MIN_SEARCHED)
        .collect()
}

/// `text` with every replacement applied.
pub fn apply(text: &str, replacements: &[(String, String)]) -> String {
    replacements
        .iter()
        .fold(text.to_string(), |t, (from, to)| t.replace(from.trim(), to))
}

/// `value` with every replacement applied to every string in it, object keys included.
pub fn apply_json(
    value: &serde_json::Value,
    replacements: &[(String, String)],
) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::String(s) => Value::String(apply(s, replacements)),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| apply_json(v, replacements)).collect())
        }
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (apply(k, replacements), apply_json(v, replacements)))
                .collect(),
        ),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hostfs::resolve::{Kind, Stat};
    use crate::snapshot::record::Entry;
    use std::path::PathBuf;

    #[test]
    fn values_become_placeholders_everywhere() {
        let file = |s: &str| Entry {
            stat: Stat {
                kind: Kind::File,
                mode: 0o444,
            },
            contents: Some(s.as_bytes().to_vec()),
        };
        let mut rec = Recording::default();
        rec.sys.insert(PathBuf::from("a/serial"), file("CC-0001\n"));
        rec.sys.insert(PathBuf::from("b/serial"), file("CC-0001\n"));
        rec.sys.insert(PathBuf::from("c/serial"), file("1\n"));
        rec.sys.insert(PathBuf::from("a/idVendor"), file("1050\n"));
        let r = redact_files(&mut rec, &["serial".into()]);
        let text = |p: &str| {
            String::from_utf8(rec.sys[&PathBuf::from(p)].contents.clone().unwrap()).unwrap()
        };
        assert_eq!(text("a/serial"), "redacted-1\n");
        assert_eq!(text("b/serial"), "redacted-1\n");
        assert_eq!(text("c/serial"), "redacted-2\n");
        assert_eq!(text("a/idVendor"), "1050\n");
        assert_eq!(r, [("CC-0001".to_string(), "redacted-1".to_string())]);
        let tree = serde_json::json!({"usb": {"usb-1050-CC-0001": {"envs": {"S": "CC-0001"}}}});
        assert_eq!(
            apply_json(&tree, &r),
            serde_json::json!({"usb": {"usb-1050-redacted-1": {"envs": {"S": "redacted-1"}}}})
        );
    }
}
