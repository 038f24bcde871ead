//! `wdp new`: a standalone scanner project in Rust, Python, JavaScript or C.
//!
//! A project is the scanner's source (every character device matching a glob under /dev, healthy
//! or not, optionally with a post-allocator), the contract it is built against, a build that uses
//! only its language's own tools, a fixture with the tree `wdp scan` must report over it, a test
//! that checks that, and a README with the commands to build, test, dry-run and ship it.
//!
//! Everything is embedded in this binary at build time (see `host/build.rs`): the templates of
//! `host/templates/`, and the SDK and WIT this host was built with, so a guest made by `wdp new`
//! speaks exactly the host's contract, offline.

pub mod render;
pub mod toolchain;

use std::path::{Path, PathBuf};

use wdp_oci::contract;

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded.rs"));
}

pub use embedded::{CONTRACT_WIT, SDK};

/// A language `wdp new` writes projects in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lang {
    /// Rust with the `wdp-guest` SDK: cargo component (or cargo for wasm32-wasip2)
    Rust,
    /// Python: componentize-py
    Python,
    /// JavaScript: componentize-js (jco), installed by npm into the project
    Js,
    /// C: wit-bindgen c, clang with wasi-libc, wasm-tools
    C,
}

impl Lang {
    /// Every language, in `--help` order.
    pub const ALL: [Lang; 4] = [Lang::Rust, Lang::Python, Lang::Js, Lang::C];

    /// The name on the command line and of its template directory.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::C => "c",
        }
    }
}

/// What to write.
#[derive(Debug, Clone)]
pub struct Options {
    /// The scanner's name: its device type, package and file names.
    pub name: String,
    /// The language of the project.
    pub lang: Lang,
    /// Export a post-allocator too (world `device-plugin`).
    pub post_allocator: bool,
}

impl Options {
    /// The world the scanner implements.
    pub fn world(&self) -> &'static str {
        if self.post_allocator {
            "device-plugin"
        } else {
            "scanner-plugin"
        }
    }

    /// The command that builds the project, as its README gives it.
    pub fn build_command(&self) -> String {
        match self.lang {
            Lang::Rust => "cargo component build --release".into(),
            Lang::Python => format!(
                "componentize-py -d wit -w {} componentize app -o {}.wasm",
                self.world(),
                self.name
            ),
            Lang::Js => "npm install && npm run build".into(),
            Lang::C => "make ADAPTER=/path/to/wasi_snapshot_preview1.reactor.wasm".into(),
        }
    }
}

/// Why a project was not written.
#[derive(Debug, thiserror::Error)]
pub enum ScaffoldError {
    #[error(
        "{0:?} is not a valid scanner name: expected lower-case words of letters and digits joined by '-', each starting with a letter, at most 40 characters (e.g. \"acme-npu\"); give one with --name"
    )]
    /// The project name is not usable.
    Name(String),
    #[error("{} is not empty: give a new or empty directory", .0.display())]
    /// The target directory is not empty.
    NotEmpty(PathBuf),
    #[error("{path}: {error}", path = .path.display())]
    /// A file could not be written.
    Io {
        /// The path concerned.
        path: PathBuf,
        /// The underlying error, whole.
        error: std::io::Error,
    },
    #[error("template {path}: {error}")]
    /// A template could not be rendered.
    Template {
        /// The path concerned.
        path: String,
        /// The underlying error, whole.
        error: render::RenderError,
    },
}

/// Checks a scanner name: kebab-case words each starting with a letter (what a WIT identifier, a
/// device type, a crate and a file name all accept).
pub fn check_name(name: &str) -> Result<(), ScaffoldError> {
    let word_ok = |w: &str| {
        w.starts_with(|c: char| c.is_ascii_lowercase())
            && w.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    if name.len() <= 40 && name.split('-').all(word_ok) {
        Ok(())
    } else {
        Err(ScaffoldError::Name(name.into()))
    }
}

/// The version of the embedded SDK crate (its manifest's `version`).
pub fn sdk_version() -> &'static str {
    let manifest = SDK
        .iter()
        .find(|(p, _)| *p == "Cargo.toml")
        .and_then(|(_, b)| std::str::from_utf8(b).ok())
        .unwrap_or_default();
    manifest
        .lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or("0.0.0")
}

/// The files of a project: (path relative to its directory, contents).
pub fn files(options: &Options) -> Result<Vec<(PathBuf, Vec<u8>)>, ScaffoldError> {
    let Options {
        name,
        lang,
        post_allocator,
    } = options;
    check_name(name)?;
    let world = options.world();
    let world_c = world.replace('-', "_");
    let crate_name = name.replace('-', "_");
    let upper = crate_name.to_ascii_uppercase();
    let vars = [
        ("name", name.as_str()),
        ("crate", crate_name.as_str()),
        ("NAME", upper.as_str()),
        ("world", world),
        ("world_c", world_c.as_str()),
        ("contract_version", contract::VERSION),
        ("wdp_version", env!("CARGO_PKG_VERSION")),
        ("sdk_version", sdk_version()),
    ];
    let flags = [("post-allocator", *post_allocator)];

    // The language's files over the shared ones (a language may replace a shared file).
    let own = format!("{}/", lang.name());
    let mut out: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    for (prefix, strip) in [("common/", "common/"), (own.as_str(), own.as_str())] {
        for (path, bytes) in embedded::TEMPLATES
            .iter()
            .filter(|(p, _)| p.starts_with(prefix))
        {
            let rel = &path[strip.len()..];
            let rel = match rel {
                "gitignore" => ".gitignore",
                other => other,
            };
            let template_error = |error| ScaffoldError::Template {
                path: path.to_string(),
                error,
            };
            let text = std::str::from_utf8(bytes)
                .map_err(|_| template_error(render::RenderError::NotText))?;
            let rel = render::render(rel, &vars, &flags).map_err(template_error)?;
            let contents = render::render(text, &vars, &flags).map_err(template_error)?;
            out.retain(|(p, _)| *p != Path::new(&rel));
            out.push((rel.into(), contents.into_bytes()));
        }
    }
    // The contract and, for Rust, the SDK: verbatim, as this binary was built with them.
    match lang {
        Lang::Rust => {
            for (path, bytes) in SDK {
                out.push((Path::new("vendor/wdp-guest").join(path), bytes.to_vec()));
            }
        }
        Lang::Python | Lang::C => {
            out.push(("wit/device-plugin.wit".into(), CONTRACT_WIT.to_vec()));
        }
        Lang::Js => {
            let deps = Path::new("wit/deps");
            out.push((
                deps.join("wdp-device-plugin/device-plugin.wit"),
                CONTRACT_WIT.to_vec(),
            ));
            out.push((
                deps.join("wasi-cli/environment.wit"),
                embedded::WASI_CLI_ENVIRONMENT_WIT.to_vec(),
            ));
        }
    }
    out.sort();
    Ok(out)
}

/// Writes the project into `dir`, which must not exist or be empty. Returns the files written.
pub fn write(dir: &Path, options: &Options) -> Result<Vec<PathBuf>, ScaffoldError> {
    let files = files(options)?;
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |error| ScaffoldError::Io { path, error }
    };
    match std::fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(ScaffoldError::NotEmpty(dir.into()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(dir)(e)),
    }
    let mut written = Vec::with_capacity(files.len());
    for (rel, contents) in files {
        let path = dir.join(&rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, contents).map_err(io(&path))?;
        written.push(rel);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_template_renders_in_every_language_with_and_without_a_post_allocator() {
        for lang in Lang::ALL {
            for post_allocator in [false, true] {
                let options = Options {
                    name: "acme-npu".into(),
                    lang,
                    post_allocator,
                };
                let files = files(&options).unwrap_or_else(|e| panic!("{lang:?}: {e}"));
                for (path, contents) in &files {
                    let text = String::from_utf8_lossy(contents);
                    assert!(
                        !text.contains("{{#") && !text.contains("{{/") && !text.contains("{{^"),
                        "{lang:?} {}: a section tag is left",
                        path.display()
                    );
                    let has = text.contains("ACME_NPU_DEVICES");
                    if has && !path.starts_with("vendor") {
                        assert!(post_allocator, "{lang:?} {}", path.display());
                    }
                }
                let paths: Vec<_> = files.iter().map(|(p, _)| p.clone()).collect();
                for shared in [
                    "fixture/dev.txt",
                    "fixture/expected.json",
                    "README.md",
                    ".gitignore",
                ] {
                    assert!(paths.contains(&PathBuf::from(shared)), "{lang:?}: {shared}");
                }
            }
        }
    }

    #[test]
    fn names_follow_wit_identifiers() {
        for ok in ["acme", "acme-npu", "x2", "a-b2-c"] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Acme",
            "acme_npu",
            "2x",
            "acme-2x",
            "acme-",
            "-acme",
            &"a".repeat(41),
        ] {
            let err = check_name(bad).expect_err(bad).to_string();
            assert!(err.contains("give one with --name"), "{err}");
        }
    }

    #[test]
    fn the_sdk_version_is_its_manifests() {
        assert_eq!(sdk_version(), "0.1.0");
    }

    #[test]
    fn a_project_goes_into_a_new_or_empty_directory_only() {
        let dir = tempfile::tempdir().unwrap();
        let options = Options {
            name: "acme".into(),
            lang: Lang::C,
            post_allocator: false,
        };
        let target = dir.path().join("acme");
        let written = write(&target, &options).unwrap();
        assert!(written.contains(&PathBuf::from("scanner.c")));
        assert_eq!(
            std::fs::read(target.join("wit/device-plugin.wit")).unwrap(),
            CONTRACT_WIT
        );
        let err = write(&target, &options).unwrap_err().to_string();
        assert!(
            err.ends_with("is not empty: give a new or empty directory"),
            "{err}"
        );
    }
}
