//! Which versions of the contract (`wdp:device-plugin`) this host speaks, and the check that holds
//! a component's import and export names to them before it is compiled or linked.
//!
//! The promise follows semver as the component model applies it to package versions: versions on
//! one compatibility line (`0.1.*` while the contract is `0.x`, where the minor number is the
//! major one; `1.*` from 1.0) only ever add functions and interfaces the host provides, so a guest
//! built against any earlier version of the line keeps working on a newer host, and a guest built
//! against a later one loads as long as it uses only what this host provides. Anything that would
//! change or remove an item, or grow a record, starts a new line, and a host refuses a component
//! of a line it does not speak with the versions it does speak: that guest would otherwise fail
//! later, at link time, with a bare "import not found".

use semver::Version;

/// The contract's package name, as it prefixes interface names (`wdp:device-plugin/scanner@...`).
pub const PACKAGE: &str = "wdp:device-plugin";

/// The contract version this host was built with (`wit/device-plugin.wit`'s `package` line).
///
/// 0.1.1 added `hostfs` (listings with metadata and link targets, batched /sys reads) and
/// `notifier.notify-with-attributes`; 0.1.2 added `notifier.notify-changes` (only what changed
/// since the last notify). A guest built against an earlier version imports none of what came
/// later and links as before, since each version's interfaces are a superset of the last's.
pub const VERSION: &str = "0.1.2";

/// What to do with a core wasm module, which the contract does not cover (only components speak
/// it): said wherever one is refused, at pull and at load.
pub const CORE_MODULE_REMEDY: &str =
    "build it for wasm32-wasip2, or wrap it with `wasm-tools component new`";

/// Why a component's names are not of a contract version this host speaks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    /// The component names a version of another compatibility line.
    #[error(
        "it is built for {PACKAGE}@{version} ({name}); this host speaks {PACKAGE}@{} (built with {PACKAGE}@{VERSION}): rebuild it against {PACKAGE}@{VERSION} (`wdp new` writes that WIT; `wkg get {PACKAGE}@{VERSION}` fetches it)",
        line()
    )]
    Unsupported {
        /// The import or export name that carries the version.
        name: String,
        /// The version it names.
        version: String,
    },
    /// The component names the package without a version semver can parse.
    #[error(
        "{name} names {PACKAGE} without a valid version; this host speaks {PACKAGE}@{} (built with {PACKAGE}@{VERSION})",
        line()
    )]
    Unversioned {
        /// The import or export name.
        name: String,
    },
}

/// The compatibility line of this host, as `0.1` or `1`: what its error messages name.
pub fn line() -> String {
    let v = host_version();
    if v.major == 0 {
        format!("0.{}", v.minor)
    } else {
        v.major.to_string()
    }
}

fn host_version() -> Version {
    Version::parse(VERSION).expect("VERSION is a semver version")
}

/// Whether `version` is on this host's compatibility line.
pub fn speaks(version: &Version) -> bool {
    let host = host_version();
    if host.major == 0 {
        version.major == 0 && version.minor == host.minor
    } else {
        version.major == host.major
    }
}

/// Checks every contract name among `names` (a component's top-level imports and exports; other
/// packages are not the contract's business).
pub fn check<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), ContractError> {
    for name in names {
        let Some(rest) = name.strip_prefix(PACKAGE) else {
            continue;
        };
        // `wdp:device-plugin/<interface>@<version>`; a longer package name is another package.
        let Some(rest) = rest.strip_prefix('/') else {
            continue;
        };
        let version = rest
            .split_once('@')
            .and_then(|(_, v)| Version::parse(v).ok())
            .ok_or_else(|| ContractError::Unversioned { name: name.into() })?;
        if !speaks(&version) {
            return Err(ContractError::Unsupported {
                name: name.into(),
                version: version.to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_the_wit_packages() {
        let wit = include_str!("../../../wit/device-plugin.wit");
        assert!(
            wit.lines()
                .any(|l| l.trim() == format!("package {PACKAGE}@{VERSION};")),
            "wit/device-plugin.wit does not declare package {PACKAGE}@{VERSION}"
        );
    }

    #[test]
    fn one_line_is_accepted_and_others_are_refused_with_the_versions_spoken() {
        let ok = [
            "wdp:device-plugin/scanner@0.1.0",
            "wdp:device-plugin/hostfs@0.1.1",
            "wdp:device-plugin/devfs@0.1.7",
            "wasi:io/poll@0.2.6",
            "wdp:device-plugins-extra/x@9.0.0",
            "scan",
        ];
        assert_eq!(check(ok), Ok(()));
        for (name, version) in [
            ("wdp:device-plugin/scanner@1.0.0", "1.0.0"),
            ("wdp:device-plugin/devfs@0.2.0", "0.2.0"),
        ] {
            let err = check([name]).expect_err(name);
            assert_eq!(
                err,
                ContractError::Unsupported {
                    name: name.into(),
                    version: version.into()
                }
            );
            let text = err.to_string();
            assert!(
                text.contains(&format!("built for wdp:device-plugin@{version}")),
                "{text}"
            );
            assert!(
                text.contains(
                    "this host speaks wdp:device-plugin@0.1 (built with wdp:device-plugin@0.1.2)"
                ),
                "{text}"
            );
        }
        for name in ["wdp:device-plugin/scanner", "wdp:device-plugin/scanner@x"] {
            assert!(matches!(
                check([name]),
                Err(ContractError::Unversioned { .. })
            ));
        }
    }
}
