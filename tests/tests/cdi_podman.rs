//! A real CDI consumer no one here wrote: Debian's podman (4.3, with runc; `make setup` installs
//! both) resolves the CDI names Allocate returns from the spec directory `wdp run` writes, and
//! the container sees what wdp promised: the device nodes (type, major, minor, and the device
//! cgroup's permissions), the env variables and a read-only mount.
//!
//! podman 4.3 reads specs only from `/etc/cdi` and `/var/run/cdi`, and stats each node's host
//! path in its own `/dev`. So each podman runs in a mount namespace of its own where the
//! fixture's dev root lies over `/dev` (an overlay, so podman stats the fixture's nodes), a
//! fresh tmpfs is `/dev/shm` (podman's locks), and wdp's spec directory is bound at `/etc/cdi`
//! (`/var/run/cdi` hidden): nothing of the machine's own is written or seen. The image is one
//! static program (`tests/probe/cdi-probe.c`) that prints what the container sees, run with
//! `--rootfs`; podman keeps its state in a temp directory (`wdp_tests::podman`).

use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags};
use serde_json::Value;
use wdp::cdi::schema;
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::serve;
use wdp_tests::podman::{self, RUN_LIMITS};

/// The probe's major: 120-127 are reserved for local use and never given to a driver, so an
/// open that passes the device cgroup fails with ENXIO, one that does not with EPERM.
const PROBE_MAJOR: u32 = 121;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn podman_resolves_wdp_devices_from_the_specs_wdp_writes() {
    if let Err(why) = podman::which("podman").and(podman::which("runc")) {
        println!("skipped: {why} (`make setup` installs podman and runc)");
        return;
    }
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232)
        .char_dev("net/tun", 10, 200)
        .char_dev("wdp/probe0", PROBE_MAJOR, 7);
    let share = f.path().join("share");
    std::fs::create_dir_all(&share).unwrap();
    std::fs::write(share.join("file"), "from the host\n").unwrap();
    let cdi_dir = f.path().join("cdi");
    let tree = serde_json::json!({"probe": {"probe-0": {
        "nodes": [{"host": "/dev/wdp/probe0", "container": "/dev/wdp-probe", "permissions": "r"}],
        "envs": {"WDP_PROBE": "probe-0"},
        "mounts": [{"host": share, "container": "/data", "read-only": true}],
    }}});
    let config = f.path().join("wdp.yaml");
    std::fs::write(
        &config,
        format!(
            "scanners:\n  - name: kvm\n    component: {kvm}\n    namespace: devices.wdp.dev\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n    cdi: {{ dir: {cdi} }}\n  - name: probe\n    component: {tree_guest}\n    namespace: test.wdp.dev\n    env: {{ TREE: '{tree}' }}\n    policy: {{ allowed-mounts: [{share}] }}\n    cdi: {{ dir: {cdi}, format: yaml }}\n",
            kvm = guest("kvm").display(),
            tree_guest = guest("static_tree").display(),
            cdi = cdi_dir.display(),
            share = share.display(),
        ),
    )
    .unwrap();
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let resources = [
        "devices.wdp.dev/kvm",
        "devices.wdp.dev/tun",
        "test.wdp.dev/probe",
    ];
    seen.all_listed(&resources).await;

    // The names kubelet hands the runtime, from Allocate.
    let mut names = Vec::new();
    for (resource, id) in resources.iter().zip(["kvm-0", "tun-0", "probe-0"]) {
        let answer = kubelet.allocate(resource, &[id]).await.unwrap();
        let cdi = &answer.container_responses[0].cdi_devices;
        names.extend(cdi.iter().map(|d| d.name.clone()));
    }
    assert_eq!(
        names,
        [
            "devices.wdp.dev/kvm=kvm-0",
            "devices.wdp.dev/tun=tun-0",
            "test.wdp.dev/probe=probe-0"
        ]
    );

    // Each spec declares the lowest version its content needs and keeps that version's rules:
    // nodes alone 0.3.0; a node with its own host path 0.5.0 (its mount's type alone: 0.4.0).
    for (file, version) in [
        ("wdp-devices.wdp.dev-kvm.json", "0.3.0"),
        ("wdp-devices.wdp.dev-tun.json", "0.3.0"),
        ("wdp-test.wdp.dev-probe.yaml", "0.5.0"),
    ] {
        let text = std::fs::read_to_string(cdi_dir.join(file)).expect(file);
        let doc: Value = serde_yaml_ng::from_str(&text).expect(file);
        assert_eq!(doc["cdiVersion"], version, "{file}");
        schema::check(&doc).unwrap_or_else(|e| panic!("{file}: {e}"));
    }

    let podman = Podman::new(&f, &cdi_dir);
    let paths = ["/dev/kvm", "/dev/net/tun", "/dev/wdp-probe", "/data/file"];
    // Without the CDI names the container has none of it: what follows is CDI's doing.
    let plain = match podman.run(&[], &paths).await {
        Ok(seen) => seen,
        Err(why) => {
            println!("skipped: podman cannot run a container here: {why}");
            return;
        }
    };
    for path in ["/dev/kvm", "/dev/wdp-probe", "/data/file"] {
        assert!(plain.missing(path), "{path} without CDI: {}", plain.text);
    }
    assert_eq!(plain.env("WDP_PROBE"), None);

    let seen_in = podman
        .run(&names, &paths)
        .await
        .unwrap_or_else(|why| panic!("podman refused wdp's devices: {why}"));
    let eperm = Errno::PERM.raw_os_error();
    let kvm = seen_in.node("/dev/kvm");
    assert_eq!((kvm.kind, kvm.major, kvm.minor), ('c', 10, 232));
    assert!(kvm.read != eperm && kvm.write != eperm, "rw: {kvm:?}");
    let tun = seen_in.node("/dev/net/tun");
    assert_eq!((tun.kind, tun.major, tun.minor), ('c', 10, 200));
    let probe = seen_in.node("/dev/wdp-probe");
    assert_eq!(
        (probe.major, probe.minor),
        (PROBE_MAJOR, 7),
        "from its host path"
    );
    assert_eq!(
        (probe.read, probe.write),
        (Errno::NXIO.raw_os_error(), eperm),
        "permissions r: reading passes the device cgroup, writing does not"
    );
    assert_eq!(seen_in.env("WDP_PROBE"), Some("probe-0"));
    let (write, first_line) = seen_in.file("/data/file");
    assert_eq!(first_line, "from the host");
    assert_eq!(write, Errno::ROFS.raw_os_error(), "a read-only mount");
    let options = seen_in.mount_options("/data").expect("/data is a mount");
    assert!(options.split(',').any(|o| o == "ro"), "{options}");

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// A podman whose state lives in a temp directory and whose `/dev` and `/etc/cdi` are the
/// fixture's (see the file's comment).
struct Podman {
    podman: podman::Podman,
    rootfs: PathBuf,
    namespace: Namespace,
}

impl Podman {
    fn new(f: &Fixture, cdi_dir: &Path) -> Podman {
        let podman = podman::Podman::new().expect("podman and runc are installed");
        let rootfs = podman.dir().join("rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("probe/cdi-probe.c");
        let cc = std::process::Command::new("cc")
            .args(["-static", "-O2", "-o"])
            .arg(rootfs.join("probe"))
            .arg(&source)
            .output()
            .expect("run cc (`make setup` installs gcc)");
        assert!(
            cc.status.success(),
            "cc -static {}: {}",
            source.display(),
            String::from_utf8_lossy(&cc.stderr)
        );
        let namespace = Namespace::new(podman.dir(), &f.dev(), cdi_dir);
        Podman {
            podman,
            rootfs,
            namespace,
        }
    }

    /// Runs the probe over `paths` with `--device` for each of `devices`; what it printed, or
    /// why podman failed.
    async fn run(&self, devices: &[String], paths: &[&str]) -> Result<Probe, String> {
        let mut cmd = self.podman.command();
        cmd.args(["run", "--rm", "--network", "none"])
            .args(RUN_LIMITS);
        for device in devices {
            cmd.args(["--device", device]);
        }
        cmd.arg("--rootfs")
            .arg(&self.rootfs)
            .arg("/probe")
            .args(paths);
        let namespace = self.namespace.clone();
        // SAFETY: the closure makes raw syscalls only, on strings prepared before the fork.
        unsafe {
            cmd.pre_exec(move || namespace.enter());
        }
        let out: Output = tokio::time::timeout(std::time::Duration::from_secs(120), cmd.output())
            .await
            .map_err(|_| "podman did not finish within 120 s".to_string())?
            .map_err(|e| format!("cannot run podman: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "podman exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(Probe {
            text: String::from_utf8_lossy(&out.stdout).into_owned(),
        })
    }
}

/// The mounts that make podman's view, as C strings made before any fork.
#[derive(Clone)]
struct Namespace {
    dev_stage: CString,
    dev_lower: CString,
    dev_shm: CString,
    etc_lower: CString,
    cdi_dir: CString,
    hide_run_cdi: bool,
}

impl Namespace {
    fn new(dir: &Path, fixture_dev: &Path, cdi_dir: &Path) -> Namespace {
        let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
        let stage = dir.join("dev");
        std::fs::create_dir_all(&stage).unwrap();
        // An /etc layer that only adds an empty `cdi` to bind the spec directory on.
        let etc = dir.join("etc-layer");
        std::fs::create_dir_all(etc.join("cdi")).unwrap();
        let lower = |top: &Path, below: &str| {
            CString::new(format!("lowerdir={}:{below}", top.display())).unwrap()
        };
        Namespace {
            dev_shm: c(&stage.join("shm")),
            dev_lower: lower(fixture_dev, "/dev"),
            dev_stage: c(&stage),
            etc_lower: lower(&etc, "/etc"),
            cdi_dir: c(cdi_dir),
            hide_run_cdi: Path::new("/run/cdi").is_dir(),
        }
    }

    /// In the forked child: a mount namespace of its own, then the mounts.
    fn enter(&self) -> std::io::Result<()> {
        use rustix::mount::{mount, mount_bind, mount_change, mount_move};
        let overlay = |target: &CStr, lower: &CStr| {
            mount(c"overlay", target, c"overlay", MountFlags::empty(), lower)
        };
        // SAFETY: a new mount namespace for this single-threaded child about to exec.
        unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)? };
        mount_change(
            c"/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )?;
        overlay(&self.dev_stage, &self.dev_lower)?;
        mount(
            c"tmpfs",
            self.dev_shm.as_c_str(),
            c"tmpfs",
            MountFlags::empty(),
            None,
        )?;
        mount_move(self.dev_stage.as_c_str(), c"/dev")?;
        overlay(c"/etc", &self.etc_lower)?;
        mount_bind(self.cdi_dir.as_c_str(), c"/etc/cdi")?;
        if self.hide_run_cdi {
            mount(c"tmpfs", c"/run/cdi", c"tmpfs", MountFlags::RDONLY, None)?;
        }
        Ok(())
    }
}

/// What the probe printed.
struct Probe {
    text: String,
}

/// A device node as the container sees it: type, numbers, and the errno of opening it for
/// reading and for writing (0: it opened).
#[derive(Debug)]
struct Node {
    kind: char,
    major: u32,
    minor: u32,
    read: i32,
    write: i32,
}

impl Probe {
    fn line(&self, kind: &str, path: &str) -> Option<Vec<&str>> {
        self.text
            .lines()
            .map(|l| l.split(' ').collect::<Vec<_>>())
            .find(|w| w.len() > 1 && w[0] == kind && w[1] == path)
    }

    fn missing(&self, path: &str) -> bool {
        self.line("missing", path).is_some()
    }

    fn node(&self, path: &str) -> Node {
        let w = self
            .line("node", path)
            .unwrap_or_else(|| panic!("no node {path} in the container:\n{}", self.text));
        let number = |i: usize| w[i].parse::<u32>().unwrap();
        let errno = |i: usize| w[i].parse::<i32>().unwrap();
        Node {
            kind: w[2].chars().next().unwrap(),
            major: number(3),
            minor: number(4),
            read: errno(5),
            write: errno(6),
        }
    }

    /// A file's write errno and first line.
    fn file(&self, path: &str) -> (i32, String) {
        let w = self
            .line("file", path)
            .unwrap_or_else(|| panic!("no file {path} in the container:\n{}", self.text));
        (w[2].parse().unwrap(), w[3..].join(" "))
    }

    fn env(&self, name: &str) -> Option<&str> {
        let prefix = format!("env {name}=");
        self.text.lines().find_map(|l| l.strip_prefix(&prefix))
    }

    fn mount_options(&self, point: &str) -> Option<&str> {
        self.line("mount", point).map(|w| w[2])
    }
}
