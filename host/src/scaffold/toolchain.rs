//! What each language's build needs installed, and the check that it is on PATH: a project whose
//! first build would fail on a missing compiler is refused before it is written, with the tool
//! and how to install it.

use std::path::{Path, PathBuf};

use super::Lang;

/// A program a language's build runs, and how to install it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// The program looked for on `PATH`.
    pub program: &'static str,
    /// How to install it.
    pub install: &'static str,
}

const fn tool(program: &'static str, install: &'static str) -> Tool {
    Tool { program, install }
}

const RUST: &[Tool] = &[
    tool(
        "cargo",
        "install Rust with rustup, then `rustup target add wasm32-wasip1 wasm32-wasip2`",
    ),
    tool(
        "cargo-component",
        "cargo install --locked cargo-component@0.21.1",
    ),
];
const PYTHON: &[Tool] = &[
    tool(
        "python3",
        "install Python 3 (Debian: apt-get install python3 python3-venv)",
    ),
    tool(
        "componentize-py",
        "pip install componentize-py==0.25.1 (in a venv on PATH)",
    ),
];
const JS: &[Tool] = &[
    tool(
        "node",
        "install Node.js 20 or newer (Debian: apt-get install nodejs npm)",
    ),
    tool("npm", "install npm (Debian: apt-get install npm)"),
];
const C: &[Tool] = &[
    tool(
        "clang",
        "apt-get install clang lld wasi-libc libclang-rt-dev-wasm32 (Debian 12)",
    ),
    tool(
        "wit-bindgen",
        "cargo install --locked wit-bindgen-cli@0.63.0",
    ),
    tool("wasm-tools", "cargo install --locked wasm-tools@1.263.0"),
    tool("make", "apt-get install make"),
];

/// The tools `lang`'s build and test run (besides `wdp` itself).
pub fn tools(lang: Lang) -> &'static [Tool] {
    match lang {
        Lang::Rust => RUST,
        Lang::Python => PYTHON,
        Lang::Js => JS,
        Lang::C => C,
    }
}

/// The tools of `lang` not found on `path` (a PATH value).
pub fn missing(lang: Lang, path: Option<&std::ffi::OsStr>) -> Vec<Tool> {
    let dirs: Vec<PathBuf> = path
        .map(|p| std::env::split_paths(p).collect())
        .unwrap_or_default();
    tools(lang)
        .iter()
        .filter(|t| !dirs.iter().any(|d| is_executable(&d.join(t.program))))
        .copied()
        .collect()
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_counts_when_an_executable_of_its_name_is_on_path() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("wit-bindgen");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        let path = std::env::join_paths([dir.path()]).unwrap();
        let names = |m: Vec<Tool>| m.iter().map(|t| t.program).collect::<Vec<_>>();
        // Not executable yet: missing with the rest.
        assert_eq!(
            names(missing(Lang::C, Some(&path))),
            ["clang", "wit-bindgen", "wasm-tools", "make"]
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            names(missing(Lang::C, Some(&path))),
            ["clang", "wasm-tools", "make"]
        );
        assert_eq!(missing(Lang::Js, None).len(), 2);
    }
}
