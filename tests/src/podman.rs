//! Debian's podman (4.3, with runc; `make setup-podman` installs both) as the tests run it: its
//! images, containers and state in a temp directory of its own, so that nothing of the machine's
//! own storage is read or written and tests in other worktrees never meet.
//!
//! podman and buildah read `CONTAINERS_CONF` and `CONTAINERS_STORAGE_CONF`: the settings are
//! written there rather than passed as flags, so that `scripts/image.sh` (which runs `podman
//! build`) uses the same storage as the `podman run` after it.

use std::path::{Path, PathBuf};
use std::process::Stdio;

/// `Ok` if `program` is on PATH, else why not.
pub fn which(program: &str) -> Result<(), String> {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false);
    found
        .then_some(())
        .ok_or_else(|| format!("{program} is not installed"))
}

/// `podman run` options every test container needs on this kind of machine: podman's default
/// rlimits exceed what runc may set where the sandbox lacks `CAP_SYS_RESOURCE`.
pub const RUN_LIMITS: [&str; 4] = [
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1024:1024",
];

/// A podman whose storage and state live in a temp directory; containers left running are
/// removed on drop.
pub struct Podman {
    dir: tempfile::TempDir,
}

impl Podman {
    /// A fresh, empty podman, or why there cannot be one (podman or runc missing).
    pub fn new() -> Result<Podman, String> {
        which("podman").and(which("runc"))?;
        let dir = tempfile::tempdir().map_err(|e| format!("a temp dir for podman: {e}"))?;
        let at = |name: &str| dir.path().join(name).display().to_string();
        // vfs: overlayfs on overlayfs is refused by some kernels; runc: crun, podman's default,
        // refuses some cgroup layouts (hybrid v1/v2); cgroupfs and file events: no systemd.
        let storage = format!(
            "[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n",
            at("storage"),
            at("run")
        );
        let engine = format!(
            "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\ntmp_dir = \"{}\"\n",
            at("libpod")
        );
        std::fs::write(dir.path().join("storage.conf"), storage)
            .and_then(|()| std::fs::write(dir.path().join("containers.conf"), engine))
            .map_err(|e| format!("podman's config files: {e}"))?;
        Ok(Podman { dir })
    }

    /// The temp directory (for files a test wants removed with podman's state).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The environment that points podman (and buildah, and scripts running them) here.
    pub fn env(&self) -> [(&'static str, PathBuf); 2] {
        [
            ("CONTAINERS_CONF", self.dir.path().join("containers.conf")),
            (
                "CONTAINERS_STORAGE_CONF",
                self.dir.path().join("storage.conf"),
            ),
        ]
    }

    /// `podman` with this environment.
    pub fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("podman");
        cmd.envs(self.env());
        cmd
    }

    /// Runs `podman args...` to completion: its stdout, or why it failed.
    pub async fn output(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|e| format!("cannot run podman: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "podman {} exited with {}: {}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // A container still running (a failed test) would keep its conmon and mounts alive.
        let _ = std::process::Command::new("podman")
            .envs(self.env())
            .args(["rm", "--all", "--force", "--time", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
