//! Container environment variables numbered per device, renumbered per container.
//!
//! Why: Intel's QAT and VFIO plugins give each device an env such as `QAT7=0000:3d:01.0` whose
//! number is its position in the whole scan, and their post-allocate hook renames the envs a
//! container receives to `QAT0`, `QAT1`, ... so that software in the container can count from
//! zero whatever devices it got. Upstream renames in Go's random map order and shares one map
//! across all container responses (so a second container also receives the first one's envs);
//! [`renumber`] is the deterministic, per-container version both scanners use.

use crate::ContainerAllocateResponse;

/// Splits `key` into `prefix` and its decimal number: `QAT12` with prefix `QAT` gives 12. None
/// when `key` does not start with `prefix` followed by at least one digit and only digits, or
/// when the number does not fit in a u64.
pub fn numbered(key: &str, prefix: &str) -> Option<u64> {
    let digits = key.strip_prefix(prefix)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Renames every `<prefix><number>` key of one container's `envs` to `<prefix>0`,
/// `<prefix>1`, ... in the order of the original numbers (ties, such as `QAT01` and `QAT1`, by
/// key), keeping values and positions; other envs are left alone.
///
/// Upstream renames in random order; ordering by the original number gives the same set of
/// names with a stable assignment: the original numbers follow the scan order (PCI address
/// order), so `<prefix>0` is always the container's lowest-numbered device.
pub fn renumber(mut envs: Vec<(String, String)>, prefix: &str) -> Vec<(String, String)> {
    // (number, original key, index in envs)
    let mut found: Vec<(u64, String, usize)> = envs
        .iter()
        .enumerate()
        .filter_map(|(i, (k, _))| Some((numbered(k, prefix)?, k.clone(), i)))
        .collect();
    found.sort();
    for (rank, (_, _, i)) in found.into_iter().enumerate() {
        envs[i].0 = format!("{prefix}{rank}");
    }
    envs
}

/// [`renumber`] applied to each container's response on its own: the whole of a
/// post-allocator whose only rewrite is the numbered envs (QAT's and VFIO's).
pub fn renumber_responses(
    responses: Vec<ContainerAllocateResponse>,
    prefix: &str,
) -> Vec<ContainerAllocateResponse> {
    responses
        .into_iter()
        .map(|mut r| {
            r.envs = renumber(std::mem::take(&mut r.envs), prefix);
            r
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn numbered_keys() {
        assert_eq!(numbered("QAT12", "QAT"), Some(12));
        assert_eq!(numbered("QAT0", "QAT"), Some(0));
        assert_eq!(numbered("VFIO_BDF3", "VFIO_BDF"), Some(3));
        for not in [
            "QAT",
            "QATX1",
            "QAT1a",
            "qat1",
            "XQAT1",
            "QAT-1",
            "QAT99999999999999999999",
        ] {
            assert_eq!(numbered(not, "QAT"), None, "{not}");
        }
    }

    #[test]
    fn renumbers_by_original_number_not_by_key_order() {
        // The order the host hands them over in (a BTreeMap): by key, so QAT13 before QAT6.
        let got = renumber(
            envs(&[
                ("OTHER", "x"),
                ("QAT13", "0000:3d:01.2"),
                ("QAT21", "0000:3d:01.4"),
                ("QAT29", "0000:3d:01.1"),
                ("QAT6", "0000:3d:01.3"),
            ]),
            "QAT",
        );
        assert_eq!(
            got,
            envs(&[
                ("OTHER", "x"),
                ("QAT1", "0000:3d:01.2"),
                ("QAT2", "0000:3d:01.4"),
                ("QAT3", "0000:3d:01.1"),
                ("QAT0", "0000:3d:01.3"),
            ])
        );
    }

    #[test]
    fn other_prefixes_and_empty_lists_are_untouched() {
        assert!(renumber(Vec::new(), "QAT").is_empty());
        let mixed = envs(&[
            ("VFIO_BDF4", "a"),
            ("QAT2", "b"),
            ("QAT01", "c"),
            ("QAT1", "d"),
        ]);
        assert_eq!(
            renumber(mixed, "QAT"),
            envs(&[
                ("VFIO_BDF4", "a"),
                ("QAT2", "b"),
                ("QAT0", "c"),
                ("QAT1", "d")
            ])
        );
    }
}
