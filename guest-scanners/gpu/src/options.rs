//! The scanner's configuration: upstream's command-line flags, read from environment variables.
//!
//! Why a module of its own: every option is validated the way upstream's `checkArgs` does (bad
//! PCI ids, both allow and deny lists, unknown modes), but the error names the environment
//! variable, the value and what is valid, since that message is all an operator sees.

use wdp_guest::config;

/// `-shared-dev-num`: containers that may share one GPU.
pub const SHARED_DEV_NUM_ENV: &str = "SHARED_DEV_NUM";
/// `-allow-ids`: comma-separated PCI device ids to advertise (e.g. `0x56a0,0x56a1`).
pub const ALLOW_IDS_ENV: &str = "ALLOW_IDS";
/// `-deny-ids`: comma-separated PCI device ids never to advertise.
pub const DENY_IDS_ENV: &str = "DENY_IDS";
/// `-bypath`: which `/dev/dri/by-path` entries a container gets (single, all, none).
pub const BYPATH_ENV: &str = "BYPATH";
/// `-enable-monitoring`: also advertise one device holding every GPU, for monitoring agents.
pub const ENABLE_MONITORING_ENV: &str = "ENABLE_MONITORING";
/// `-monitoring-mode`: one `monitoring` type (single) or one per driver (split).
pub const MONITORING_MODE_ENV: &str = "MONITORING_MODE";
/// Largest accepted `SHARED_DEV_NUM`.
pub const MAX_SHARED_DEV_NUM: u32 = 10_000;

/// Which GPUs are advertised, by PCI device id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdFilter {
    /// Every GPU.
    All,
    /// Only GPUs whose id occurs in this list (the raw value, matched as upstream does).
    Allow(String),
    /// Every GPU except those whose id occurs in this list.
    Deny(String),
}

impl IdFilter {
    /// True when a GPU whose `device` attribute's first line is `id` is advertised.
    ///
    /// Upstream tests `strings.Contains(list, id)`: a substring match on the raw list, which is
    /// exact for well-formed ids (`0x` plus four digits, validated) and is kept as is.
    pub fn admits(&self, id: &str) -> bool {
        match self {
            IdFilter::All => true,
            IdFilter::Allow(list) => list.contains(id),
            IdFilter::Deny(list) => !list.contains(id),
        }
    }
}

/// How `/dev/dri/by-path` reaches a container (`-bypath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bypath {
    /// The entries `pci-<the GPU's address>*`, each mounted read-only (upstream's default).
    Single,
    /// The whole directory, read-only.
    All,
    /// Nothing.
    None,
}

/// Shape of the monitoring resource (`-monitoring-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MonitoringMode {
    /// One type, `monitoring`, for every GPU (upstream's command-line default).
    Single,
    /// One type per driver: `i915_monitoring`, `xe_monitoring`.
    Split,
}

/// Everything configurable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    pub shared_dev_num: u32,
    pub filter: IdFilter,
    pub bypath: Bypath,
    /// None: monitoring off.
    pub monitoring: Option<MonitoringMode>,
}

impl Default for Options {
    /// Upstream's defaults, but for by-path mounts: off, because the host's default policy allows
    /// no mount and would refuse every tree holding one (`BYPATH=single` with
    /// `policy.allowed-mounts: [/dev/dri/by-path]` gives upstream's behaviour).
    fn default() -> Self {
        Options {
            shared_dev_num: 1,
            filter: IdFilter::All,
            bypath: Bypath::None,
            monitoring: None,
        }
    }
}

/// Checks a comma-separated PCI id list as upstream's `validatePCIDeviceIDs` does: every item,
/// trimmed, must be `0x` and four lower-case hex digits.
pub fn check_id_list(name: &str, value: &str) -> Result<(), String> {
    for id in value.split(',').map(str::trim) {
        let well_formed = id.len() == 6
            && id.starts_with("0x")
            && id[2..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if !well_formed {
            let what = if id.is_empty() {
                "an empty PCI id".to_string()
            } else {
                format!("the PCI id {id:?}")
            };
            return Err(format!(
                "{name}={:?} is not valid: it has {what}; expected comma-separated ids such as \
                 0x56a0,0x56a1 (0x and four lower-case hex digits)",
                config::excerpt(value, 80)
            ));
        }
    }
    Ok(())
}

/// A boolean as Go's `flag` package reads one (`strconv.ParseBool`).
pub fn parse_bool(name: &str, value: Option<&str>, default: bool) -> Result<bool, String> {
    match value.map(str::trim) {
        None => Ok(default),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(format!(
            "{name}={:?} is not valid: expected true or false (default {default})",
            config::excerpt(other, 80)
        )),
    }
}

/// Reads the options from `env` (a variable's value, None when unset).
pub fn parse(env: impl Fn(&str) -> Option<String>) -> Result<Options, String> {
    let shared_dev_num = config::parse_u32(
        SHARED_DEV_NUM_ENV,
        env(SHARED_DEV_NUM_ENV).as_deref(),
        1,
        1..=MAX_SHARED_DEV_NUM,
    )?;
    // Upstream treats an empty list as no list.
    let allow = env(ALLOW_IDS_ENV).filter(|v| !v.is_empty());
    let deny = env(DENY_IDS_ENV).filter(|v| !v.is_empty());
    let filter = match (allow, deny) {
        (Some(a), Some(d)) => {
            return Err(format!(
                "{ALLOW_IDS_ENV}={:?} and {DENY_IDS_ENV}={:?} are both set: use one or the other",
                config::excerpt(&a, 80),
                config::excerpt(&d, 80)
            ));
        }
        (Some(a), None) => {
            check_id_list(ALLOW_IDS_ENV, &a)?;
            IdFilter::Allow(a)
        }
        (None, Some(d)) => {
            check_id_list(DENY_IDS_ENV, &d)?;
            IdFilter::Deny(d)
        }
        (None, None) => IdFilter::All,
    };
    let bypath = match config::parse_choice(
        BYPATH_ENV,
        env(BYPATH_ENV).as_deref(),
        "none",
        &["single", "all", "none"],
    )? {
        "all" => Bypath::All,
        "single" => Bypath::Single,
        _ => Bypath::None,
    };
    // Validated even when monitoring is off, as upstream does.
    let mode = match config::parse_choice(
        MONITORING_MODE_ENV,
        env(MONITORING_MODE_ENV).as_deref(),
        "single",
        &["single", "split"],
    )? {
        "split" => MonitoringMode::Split,
        _ => MonitoringMode::Single,
    };
    let monitoring = parse_bool(
        ENABLE_MONITORING_ENV,
        env(ENABLE_MONITORING_ENV).as_deref(),
        false,
    )?
    .then_some(mode);
    Ok(Options {
        shared_dev_num,
        filter,
        bypath,
        monitoring,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_with(vars: &[(&str, &str)]) -> Result<Options, String> {
        parse(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn defaults_are_upstreams_but_by_path() {
        assert_eq!(parse_with(&[]), Ok(Options::default()));
        assert_eq!(Options::default().bypath, Bypath::None);
        assert_eq!(
            parse_with(&[("BYPATH", "single")]).unwrap().bypath,
            Bypath::Single
        );
        let o = parse_with(&[
            ("SHARED_DEV_NUM", "3"),
            ("DENY_IDS", "0x56a0, 0x56a1"),
            ("BYPATH", "none"),
            ("ENABLE_MONITORING", "true"),
            ("MONITORING_MODE", "split"),
        ])
        .unwrap();
        assert_eq!(o.shared_dev_num, 3);
        assert_eq!(o.filter, IdFilter::Deny("0x56a0, 0x56a1".into()));
        assert_eq!(o.bypath, Bypath::None);
        assert_eq!(o.monitoring, Some(MonitoringMode::Split));
        let o = parse_with(&[("ENABLE_MONITORING", "1"), ("ALLOW_IDS", "")]).unwrap();
        assert_eq!(o.monitoring, Some(MonitoringMode::Single));
        assert_eq!(o.filter, IdFilter::All, "an empty list is no list");
    }

    #[test]
    fn bad_values_name_the_variable() {
        let cases = [
            (
                vec![("SHARED_DEV_NUM", "0")],
                "SHARED_DEV_NUM=\"0\" is not valid",
            ),
            (
                vec![("ALLOW_IDS", "0x56A0")],
                "ALLOW_IDS=\"0x56A0\" is not valid",
            ),
            (vec![("DENY_IDS", "0x56a0,")], "an empty PCI id"),
            (
                vec![("ALLOW_IDS", "0x56a0"), ("DENY_IDS", "0x56a1")],
                "are both set",
            ),
            (vec![("BYPATH", "some")], "BYPATH=\"some\" is not valid"),
            (
                vec![("MONITORING_MODE", "both")],
                "MONITORING_MODE=\"both\" is not valid",
            ),
            (
                vec![("ENABLE_MONITORING", "yes")],
                "ENABLE_MONITORING=\"yes\" is not valid",
            ),
        ];
        for (vars, want) in cases {
            let e = parse_with(&vars).unwrap_err();
            assert!(e.contains(want), "{vars:?}: {e}");
        }
    }

    #[test]
    fn filters_match_substrings_as_upstream() {
        let allow = IdFilter::Allow("0x56a0,0x56a1".into());
        assert!(allow.admits("0x56a0") && !allow.admits("0x4680"));
        let deny = IdFilter::Deny("0x56a0".into());
        assert!(!deny.admits("0x56a0") && deny.admits("0x56a1"));
        assert!(IdFilter::All.admits("anything"));
    }
}
