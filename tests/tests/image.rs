//! The shipped image, built and run: `scripts/image.sh` builds the `Containerfile` with podman, and
//! podman runs the image as `deploy/daemonset.yaml` runs it, against the kubelet stand-in in this
//! process.
//!
//! The image is built from the binary the tests already built (`target/debug/wdp`, through
//! `scripts/image.sh --binary`, the same script and Containerfile as `make image`), not from a
//! release build: `make test` would otherwise spend many minutes building wasmtime a second time.
//! Everything else in it (libraries, CA bundle, scanners) is what `make image` ships.
//!
//! The container is started from the DaemonSet's own fields (as `wdp_tests::daemonset` reads them):
//! its command, arguments and env, uid 0, every capability dropped, no-new-privileges, a read-only
//! root filesystem (without the tmpfs mounts podman adds by default: Kubernetes adds none), its
//! memory limit, and each volume mount at its path with its mode: the fixture's /sys and /dev
//! read-only at /host/sys and /host/dev, the plugin dir (where the stand-in's `kubelet.sock` is)
//! and the CDI dir writable, an empty directory for the emptyDir, and the ConfigMap's `wdp.yaml`
//! laid out as kubelet lays out a ConfigMap volume. The component paths in the config are the
//! image's own.
//!
//! The network is the container's own (`--network none`: its loopback only), as the DaemonSet has
//! no host network; the probes (and Prometheus's scrape, at the pod's annotation) are made as
//! kubelet makes them, on the pod's address and the metrics port, from inside the container's
//! network namespace. No port is published on the machine, so runs in parallel never collide.
//!
//! podman keeps its storage in a temp directory (`wdp_tests::podman`). Skipped (with the reason
//! printed) only where podman cannot run any container.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use wdp_kubelet::standin::StandIn;
use wdp_tests::daemonset::{Pod, Source, configmap_devices};
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{Seen, sockets};
use wdp_tests::podman::{Podman, RUN_LIMITS};
use wdp_tests::repo;

/// The tag the test builds (its own storage: no other image has it).
const IMAGE: &str = "localhost/wdp:test";
/// The container's name in the test's podman.
const NAME: &str = "wdp";

/// udev's by-id names of the fixture's two serial adapters (for the `serial-by-id` entry).
const FTDI: &str = "usb-FTDI_FT232R_USB_UART_A12345-if00-port0";
const ARDUINO: &str = "usb-Arduino__www.arduino.cc__0043_85736323838351F0E1A0-if00";

/// A one-document manifest from `deploy/` (as JSON values: what [`Pod::of`] reads).
fn manifest(name: &str) -> Value {
    let path = repo().join("deploy").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

/// Lays `text` out as kubelet lays out a ConfigMap volume at `dir` (the file is a link through
/// `..data` to a timestamped directory), or updates it as kubelet does: a new timestamped
/// directory, `..data` swapped to it by a rename, the old one removed.
fn write_configmap(dir: &Path, key: &str, text: &str, generation: u32) {
    let data = format!("..2026_12_01_12_00_00.{generation:09}");
    std::fs::create_dir_all(dir.join(&data)).unwrap();
    std::fs::write(dir.join(&data).join(key), text).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&data, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if !dir.join(key).exists() {
        std::os::unix::fs::symlink(format!("..data/{key}"), dir.join(key)).unwrap();
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// The config an operator gets by following the ConfigMap's comment: the commented
/// `serial-by-id` entry uncommented, and the generic `serial` entry it replaces removed.
fn serial_by_id_instead_of_generic(config: &str) -> String {
    let mut out = Vec::new();
    let mut uncommenting = false;
    for line in config.lines() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed == "# - name: serial-by-id" {
            uncommenting = true;
        } else if !trimmed.starts_with("#   ") {
            uncommenting = false;
        }
        match trimmed.strip_prefix("# ").filter(|_| uncommenting) {
            Some(entry) => out.push(format!("{indent}{entry}")),
            None => out.push(line.to_string()),
        }
    }
    let mut doc: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&out.join("\n")).expect("the edited config");
    let scanners = doc["scanners"].as_sequence_mut().expect("scanners");
    let before = scanners.len();
    scanners.retain(|s| s["name"].as_str() != Some("serial"));
    assert_eq!(scanners.len(), before - 1, "one generic serial entry");
    assert!(
        scanners
            .iter()
            .any(|s| s["name"].as_str() == Some("serial-by-id")),
        "the ConfigMap has a commented serial-by-id entry"
    );
    serde_yaml_ng::to_string(&doc).unwrap()
}

/// `GET path` on `127.0.0.1:port` in the network namespace of process `pid` (the container's,
/// where the pod's address is): the status code and body.
async fn http_get_in(pid: u32, port: u16, path: &str) -> Result<(u16, String), String> {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    let path = path.to_string();
    let get = move || -> Result<(u16, String), String> {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).map_err(|e| e.to_string())?;
        // Only this thread moves (it exists for this one request); a socket stays in the
        // namespace it was made in.
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| format!("setns: {e}"))?;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(|e| e.to_string())?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
        s.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        let mut response = String::new();
        s.read_to_string(&mut response).map_err(|e| e.to_string())?;
        let status = response
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("not an HTTP response: {response:?}"))?;
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string());
        Ok((status, body.unwrap_or_default()))
    };
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(get)
            .join()
            .unwrap_or_else(|_| Err("the request thread panicked".into()))
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Polls `GET path` until it answers `want`, failing after 20 s; the body it answered.
async fn until_status(pid: u32, port: u16, path: &str, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let got = http_get_in(pid, port, path).await;
        if let Ok((status, body)) = &got
            && *status == want
        {
            return body.clone();
        }
        assert!(
            Instant::now() < deadline,
            "GET {path} never answered {want}; last: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A field of `/proc/<pid>/status` (`CapEff`, `NoNewPrivs`, `Uid`), its first word.
fn proc_status(pid: u32, key: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("wdp runs");
    let line = status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    line.split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// Whether podman can run a container at all here, told apart from a broken image: a container
/// whose root holds one static program (cc, which `make setup-podman` installs).
async fn podman_runs_a_container(podman: &Podman) -> Result<(), String> {
    let rootfs = podman.dir().join("control");
    std::fs::create_dir_all(&rootfs).map_err(|e| e.to_string())?;
    let source = podman.dir().join("true.c");
    std::fs::write(&source, "int main(void) { return 0; }\n").map_err(|e| e.to_string())?;
    let cc = std::process::Command::new("cc")
        .args(["-static", "-o"])
        .arg(rootfs.join("true"))
        .arg(&source)
        .output()
        .map_err(|e| format!("cc: {e}"))?;
    if !cc.status.success() {
        return Err(format!(
            "cc -static: {}",
            String::from_utf8_lossy(&cc.stderr)
        ));
    }
    let rootfs = rootfs.display().to_string();
    let mut args = vec!["run", "--rm", "--network", "none"];
    args.extend(RUN_LIMITS);
    args.extend(["--rootfs", &rootfs, "/true"]);
    podman.output(&args).await.map(drop)
}

/// The container's log so far (wdp logs to stderr, which `podman logs` prints on its own).
fn container_logs(podman: &Podman) -> String {
    match std::process::Command::new("podman")
        .envs(podman.env())
        .args(["logs", NAME])
        .output()
    {
        Ok(out) => format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(e) => format!("(cannot run podman logs: {e})"),
    }
}

/// Prints the container's log if the test fails.
struct LogsOnPanic<'a>(&'a Podman);

impl Drop for LogsOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- podman logs {NAME} ----\n{}", container_logs(self.0));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_as_the_daemonset_runs_it() {
    let podman = match Podman::new() {
        Ok(p) => p,
        Err(why) => {
            println!("skipped: {why} (`make setup-podman` installs podman and runc)");
            return;
        }
    };

    // The image, by the script `make image` runs, from the binary the tests test.
    let started = Instant::now();
    let build = tokio::process::Command::new(repo().join("scripts/image.sh"))
        .arg("--binary")
        .arg(wdp_tests::wdp_bin())
        .args(["--tag", IMAGE])
        .envs(podman.env())
        .output()
        .await
        .expect("run scripts/image.sh");
    assert!(
        build.status.success(),
        "scripts/image.sh: {}{}",
        String::from_utf8_lossy(&build.stdout),
        String::from_utf8_lossy(&build.stderr)
    );
    println!("image built in {:.1} s", started.elapsed().as_secs_f64());
    let mut version_args = vec!["run", "--rm", "--network", "none"];
    version_args.extend(RUN_LIMITS);
    version_args.extend([IMAGE, "--version"]);
    match podman.output(&version_args).await {
        Ok(out) => assert_eq!(out.trim(), format!("wdp {}", env!("CARGO_PKG_VERSION"))),
        Err(why) => match podman_runs_a_container(&podman).await {
            Err(control) => {
                println!("skipped: podman cannot run a container here: {control}");
                return;
            }
            Ok(()) => panic!("podman runs containers, but not the image: {why}"),
        },
    }

    // The node: devices of both configured scanners (and udev's by-id links of the serial
    // adapters, for the edited config), kubelet's plugin dir as kubelet makes it (root's, 0750),
    // and the other volumes as kubelet prepares them before the container starts.
    let f = Fixture::new();
    configmap_devices(&f)
        .dev_link(&format!("serial/by-id/{FTDI}"), "../../ttyUSB0")
        .dev_link(&format!("serial/by-id/{ARDUINO}"), "../../ttyACM0");
    let plugins = f.path().join("device-plugins");
    let cdi = f.path().join("cdi");
    let state = f.path().join("state");
    let config_dir = f.path().join("config");
    for dir in [&plugins, &cdi, &state, &config_dir] {
        std::fs::create_dir(dir).unwrap();
    }
    std::fs::set_permissions(
        &plugins,
        std::os::unix::fs::PermissionsExt::from_mode(0o750),
    )
    .unwrap();
    let configmap = manifest("configmap.yaml");
    let config = str_of(&configmap["data"]["wdp.yaml"], "the ConfigMap's wdp.yaml");
    write_configmap(&config_dir, "wdp.yaml", config, 1);

    // The DaemonSet's pod, field by field.
    let pod = Pod::of(&manifest("daemonset.yaml"));
    let sc = &pod.security;
    assert_eq!((sc.run_as_user, sc.run_as_group), (Some(0), Some(0)));
    assert_eq!(sc.host_network, Some(false));
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root, Some(true));
    assert_eq!(sc.drop, ["ALL"]);
    assert!(sc.add.is_empty());
    // seccomp RuntimeDefault: podman applies its default profile unless told otherwise.
    assert_eq!(sc.seccomp.as_deref(), Some("RuntimeDefault"));
    let grace = pod.grace_seconds;
    let memory = pod.memory_limit.replace("Mi", "m").replace("Gi", "g");
    let grace_arg = grace.to_string();
    let mut run: Vec<String> = [
        "run",
        "--detach",
        "--name",
        NAME,
        "--user",
        "0:0",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        "--read-only-tmpfs=false",
        "--network",
        "none",
        "--memory",
        &memory,
        "--stop-timeout",
        &grace_arg,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    run.extend(RUN_LIMITS.iter().map(|s| s.to_string()));
    for (name, value) in &pod.env {
        run.extend(["--env".into(), format!("{name}={value}")]);
    }
    for m in &pod.mounts {
        let source = match &m.source {
            Source::ConfigMap(_) => config_dir.clone(),
            Source::EmptyDir => state.clone(),
            Source::HostPath(path) => match path.as_str() {
                "/sys" => f.sys(),
                "/dev" => f.dev(),
                "/var/lib/kubelet/device-plugins" => plugins.clone(),
                "/var/run/cdi" => cdi.clone(),
                other => panic!("hostPath {other}: the test has no stand-in for it"),
            },
            Source::Other => panic!("volume {}: the test has no stand-in for it", m.volume),
        };
        let mode = if m.read_only { "ro" } else { "rw" };
        run.extend([
            "--volume".into(),
            format!("{}:{}:{mode}", source.display(), m.path),
        ]);
    }
    assert_eq!(pod.command.len(), 1, "{:?}", pod.command);
    run.extend(["--entrypoint".into(), pod.command[0].clone()]);
    run.push(IMAGE.into());
    run.extend(pod.args.iter().cloned());
    let port = pod.metrics_port();

    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let _logs = LogsOnPanic(&podman);
    let started = Instant::now();
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    podman.output(&run).await.expect("podman run");

    let resources = [
        "devices.wdp.dev/kvm",
        "devices.wdp.dev/tun",
        "devices.wdp.dev/vhost-net",
        "devices.wdp.dev/fuse",
        "generic.wdp.dev/serial",
    ];
    seen.all_listed(&resources).await;
    seen.devices("generic.wdp.dev/serial", &["ttyACM0", "ttyUSB0"])
        .await;
    println!(
        "every resource registered {:.1} s after podman run",
        started.elapsed().as_secs_f64()
    );
    let mut sorted = resources.to_vec();
    sorted.sort();
    assert_eq!(kubelet.resources(), sorted);

    // The process is the image's wdp, as the pod runs it: uid 0, no capability, no_new_privs.
    let pid: u32 = podman
        .output(&["inspect", "--format", "{{.State.Pid}}", NAME])
        .await
        .expect("podman inspect")
        .trim()
        .parse()
        .expect("a pid");
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/exe"))
            .unwrap()
            .file_name()
            .unwrap(),
        "wdp"
    );
    assert_eq!(proc_status(pid, "Uid"), "0");
    for key in ["CapEff", "CapPrm", "CapInh", "CapBnd", "CapAmb"] {
        assert_eq!(
            u64::from_str_radix(&proc_status(pid, key), 16),
            Ok(0),
            "{key}"
        );
    }
    assert_eq!(proc_status(pid, "NoNewPrivs"), "1");

    // The probes and the scrape target, on the paths and port the DaemonSet gives them.
    until_status(pid, port, &pod.readiness_path, 200).await;
    until_status(pid, port, &pod.liveness_path, 200).await;
    let scrape = pod
        .scrape_path
        .as_deref()
        .expect("a prometheus.io/path annotation");
    let metrics = until_status(pid, port, scrape, 200).await;
    assert!(metrics.contains("# TYPE"), "Prometheus text: {metrics}");

    // Its bundled scanners came precompiled with the image (built and run on this machine, so
    // its CPU features match): loaded, not compiled, and nothing written into the emptyDir's
    // compile cache.
    let logs = container_logs(&podman);
    let precompiled = logs.matches("component loaded from the precompiled components");
    assert_eq!(precompiled.count(), 2, "kvm and generic: {logs}");
    assert!(!logs.contains("component compiled"), "{logs}");
    let compiled = state.join("compiled");
    assert!(!compiled.exists(), "{} was not created", compiled.display());
    // It wrote where the DaemonSet lets it: the CDI specs.
    let kvm_spec = cdi.join("wdp-devices.wdp.dev-kvm.json");
    assert!(kvm_spec.is_file(), "{} was written", kvm_spec.display());
    let answer = kubelet
        .allocate("devices.wdp.dev/kvm", &["kvm-0"])
        .await
        .expect("Allocate");
    assert_eq!(
        answer.container_responses[0].cdi_devices[0].name,
        "devices.wdp.dev/kvm=kvm-0"
    );

    // A ConfigMap update, as kubelet applies one (the `..data` swap): the generic serial entry
    // replaced by the by-id one. Its resource goes, the new one registers; kvm is untouched.
    let kvm_registrations = seen.registrations("devices.wdp.dev/kvm");
    write_configmap(
        &config_dir,
        "wdp.yaml",
        &serial_by_id_instead_of_generic(config),
        2,
    );
    seen.ended("generic.wdp.dev/serial").await;
    let mut by_id = [FTDI, ARDUINO];
    by_id.sort();
    seen.devices("serial.wdp.dev/serial", &by_id).await;
    assert_eq!(
        seen.registrations("devices.wdp.dev/kvm"),
        kvm_registrations,
        "kvm was not restarted by the reload"
    );
    until_status(pid, port, &pod.readiness_path, 200).await;
    let specs_before_stop: Vec<String> = std::fs::read_dir(&cdi)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(specs_before_stop.contains(&"wdp-serial.wdp.dev-serial.json".to_string()));

    // podman stop: SIGTERM, then SIGKILL after the grace period. wdp exits 0 well within it,
    // removes its sockets and leaves its CDI specs for the containers kubelet restarts meanwhile.
    let stopping = Instant::now();
    podman
        .output(&["stop", "--time", &grace_arg, NAME])
        .await
        .expect("podman stop");
    let stopped_in = stopping.elapsed();
    println!("podman stop took {:.1} s", stopped_in.as_secs_f64());
    assert!(
        stopped_in < Duration::from_secs(grace),
        "stopped by SIGKILL after the grace period"
    );
    let exit = podman
        .output(&["inspect", "--format", "{{.State.ExitCode}}", NAME])
        .await
        .expect("podman inspect");
    assert_eq!(exit.trim(), "0", "wdp's exit code");
    assert_eq!(sockets(&plugins), ["kubelet.sock"]);
    for spec in &specs_before_stop {
        assert!(cdi.join(spec).is_file(), "{spec} outlives the container");
    }
    kubelet.stop().await;
}
