//! `wdp run` end to end: real wasm scanners over fixture trees, served over real Unix sockets to
//! the kubelet stand-in (which behaves as kubelet: cleans the directory, dials back inside
//! Register, streams ListAndWatch).

use std::path::Path;
use std::time::{Duration, Instant};

use tonic::Code;
use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::{Host, Launch, Seen, serve, sockets};

fn kvm_and_serial_config(f: &Fixture) -> std::path::PathBuf {
    let devices = r#"[{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}]"#;
    f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {kvm}
    namespace: devices.example.com
    env: {{ SLOTS: 2, RESCAN_INTERVAL_MS: 600000 }}
  - name: serial
    component: {generic}
    namespace: serial.example.com
    env:
      RESCAN_INTERVAL_MS: 600000
      DEVICES: '{devices}'
",
        kvm = guest("kvm").display(),
        generic = guest("generic").display(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_reach_kubelet_and_follow_hotplug() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("ttyUSB0", 188, 0);
    let config = kvm_and_serial_config(&f);
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);

    seen.devices("devices.example.com/kvm", &["kvm-0", "kvm-1"])
        .await;
    seen.devices("serial.example.com/serial", &["ttyUSB0"])
        .await;
    assert_eq!(
        kubelet.resources(),
        ["devices.example.com/kvm", "serial.example.com/serial"]
    );
    assert_eq!(
        sockets(&plugins),
        [
            "devices.example.com-kvm.sock",
            "kubelet.sock",
            "serial.example.com-serial.sock"
        ]
    );

    // Hot-plug: a new device of a served type, and a new type.
    f.char_dev("ttyUSB1", 188, 1);
    seen.devices("serial.example.com/serial", &["ttyUSB0", "ttyUSB1"])
        .await;
    f.char_dev("fuse", 10, 229);
    seen.devices("devices.example.com/fuse", &["fuse-0", "fuse-1"])
        .await;

    // Unplug: the device vanishes from its list; a type with no node left is removed entirely.
    f.remove_dev("ttyUSB0");
    seen.devices("serial.example.com/serial", &["ttyUSB1"])
        .await;
    f.remove_dev("fuse");
    seen.ended("devices.example.com/fuse").await;
    assert!(!plugins.join("devices.example.com-fuse.sock").exists());

    // Allocate: the default response, and an unknown id.
    let r = kubelet
        .allocate("devices.example.com/kvm", &["kvm-1"])
        .await
        .unwrap();
    assert_eq!(r.container_responses.len(), 1);
    let c = &r.container_responses[0];
    assert_eq!(c.devices.len(), 1);
    assert_eq!(c.devices[0].host_path, "/dev/kvm");
    assert_eq!(c.devices[0].container_path, "/dev/kvm");
    assert_eq!(c.devices[0].permissions, "rw");
    assert!(c.mounts.is_empty() && c.envs.is_empty() && c.cdi_devices.is_empty());
    let e = kubelet
        .allocate("devices.example.com/kvm", &["kvm-7"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("kvm-7"), "{}", e.message());

    // No hooks configured: the optional calls are advertised as unavailable.
    let options = kubelet.options("devices.example.com/kvm").unwrap();
    assert!(!options.get_preferred_allocation_available && !options.pre_start_required);

    // SIGTERM: a clean exit, every plugin socket removed.
    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    assert_eq!(sockets(&plugins), ["kubelet.sock"]);
    kubelet.stop().await;
}

/// A host whose stderr is a pipe with no reader left (its log collector gone) keeps serving,
/// and on SIGTERM still exits cleanly with every plugin socket removed: the log lines it cannot
/// write are dropped, not reported on that same stderr (which panicked the host as it stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_whose_log_reader_is_gone_still_stops_cleanly() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("ttyUSB0", 188, 0);
    let config = kvm_and_serial_config(&f);
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let mut child = Host::command(&config, &plugins, &f, &Launch::test(&f))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn wdp run");
    seen.devices("serial.example.com/serial", &["ttyUSB0"])
        .await;
    // The reader goes; the host's next log lines meet a broken pipe.
    drop(child.stderr.take());
    f.char_dev("ttyUSB1", 188, 1);
    seen.devices("serial.example.com/serial", &["ttyUSB0", "ttyUSB1"])
        .await;
    let pid = child.id().expect("running").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("run kill");
    assert!(sent.success());
    let status = tokio::time::timeout(Duration::from_secs(60), child.wait())
        .await
        .expect("the host stops")
        .expect("wait for the host");
    assert!(status.success(), "exit status {status}");
    assert_eq!(sockets(&plugins), ["kubelet.sock"]);
    kubelet.stop().await;
}

const QAT_TREE: &str = r#"{"generic": {
    "0000:3d:01.0": {"nodes": ["/dev/vfio/10", "/dev/vfio/vfio"], "envs": {"QAT7": "0000:3d:01.0"}},
    "0000:3d:01.1": {"nodes": ["/dev/vfio/11", "/dev/vfio/vfio"], "envs": {"QAT9": "0000:3d:01.1"}},
    "0000:3d:01.2": {"health": "Unhealthy", "nodes": ["/dev/vfio/12"]}
}}"#;

/// The device nodes of [`QAT_TREE`]: they must exist in the dev root (the output policy).
fn qat_nodes(f: &Fixture) {
    f.char_dev("vfio/vfio", 10, 196)
        .char_dev("vfio/10", 243, 0)
        .char_dev("vfio/11", 243, 1)
        .char_dev("vfio/12", 243, 2);
}

fn hook_scanner(name: &str, mode: &str, timeout: &str) -> String {
    format!(
        "  - name: {name}
    component: {tree}
    post-allocator: {hooks}
    namespace: {name}.example.com
    env: {{ HOOK_MODE: {mode}, TREE: '{tree_json}' }}
    limits: {{ call-timeout: {timeout} }}
",
        tree = guest("static_tree").display(),
        hooks = guest("test_hooks").display(),
        tree_json = QAT_TREE.replace('\n', " "),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn post_allocate_hooks_rewrite_fail_and_time_out_cleanly() {
    let f = Fixture::new();
    qat_nodes(&f);
    let config = f.write_config(&format!(
        "scanners:\n{}{}{}",
        hook_scanner("qat", "renumber", "5s"),
        hook_scanner("failing", "fail", "5s"),
        hook_scanner("hanging", "hang", "1s"),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let ids = ["0000:3d:01.0", "0000:3d:01.1", "0000:3d:01.2"];
    for ns in ["qat", "failing", "hanging"] {
        seen.devices(&format!("{ns}.example.com/generic"), &ids)
            .await;
    }

    // Renumbered as Intel's QAT plugin does; nodes de-duplicated by container path.
    let r = kubelet
        .allocate("qat.example.com/generic", &["0000:3d:01.1", "0000:3d:01.0"])
        .await
        .unwrap();
    let c = &r.container_responses[0];
    let mut envs: Vec<_> = c
        .envs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    envs.sort();
    assert_eq!(envs, [("QAT0", "0000:3d:01.0"), ("QAT1", "0000:3d:01.1")]);
    let nodes: Vec<_> = c.devices.iter().map(|d| d.host_path.as_str()).collect();
    assert_eq!(nodes, ["/dev/vfio/11", "/dev/vfio/vfio", "/dev/vfio/10"]);

    // An unhealthy device is refused before any hook runs.
    let e = kubelet
        .allocate("qat.example.com/generic", &["0000:3d:01.2"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    let e = kubelet
        .allocate("failing.example.com/generic", &["0000:3d:01.0"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Internal, "{e:?}");
    assert!(e.message().contains("hook refused"), "{}", e.message());

    let started = Instant::now();
    let e = kubelet
        .allocate("hanging.example.com/generic", &["0000:3d:01.0"])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // The host, and the well-behaved hook, are unaffected.
    let r = kubelet
        .allocate("qat.example.com/generic", &["0000:3d:01.0"])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].envs["QAT0"], "0000:3d:01.0");

    // The hook exports only post-allocator: nothing else is advertised or answered.
    let options = kubelet.options("qat.example.com/generic").unwrap();
    assert!(!options.get_preferred_allocation_available && !options.pre_start_required);
    let mut client = kubelet.client("qat.example.com/generic").unwrap();
    let e = client
        .get_preferred_allocation(wdp_kubelet::api::PreferredAllocationRequest::default())
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_and_pre_start_are_served_when_exported() {
    let f = Fixture::new();
    let tree = r#"{"gpu": {"card2": {}, "card0": {}, "card1": {}, "bad3": {}}}"#;
    let config = f.write_config(&format!(
        "scanners:
  - name: gpu
    component: {tree_guest}
    post-allocator: {allocator}
    namespace: gpu.example.com
    env: {{ TREE: '{tree}' }}
",
        tree_guest = guest("static_tree").display(),
        allocator = guest("test_allocator").display(),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("gpu.example.com/gpu", &["bad3", "card0", "card1", "card2"])
        .await;
    let options = kubelet.options("gpu.example.com/gpu").unwrap();
    assert!(options.get_preferred_allocation_available && options.pre_start_required);

    let mut client = kubelet.client("gpu.example.com/gpu").unwrap();
    let request =
        |available: &[&str], must: &[&str], size| wdp_kubelet::api::PreferredAllocationRequest {
            container_requests: vec![wdp_kubelet::api::ContainerPreferredAllocationRequest {
                available_device_i_ds: available.iter().map(|s| s.to_string()).collect(),
                must_include_device_i_ds: must.iter().map(|s| s.to_string()).collect(),
                allocation_size: size,
            }],
        };
    let r = client
        .get_preferred_allocation(request(&["card2", "card1", "card0"], &["card2"], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["card2", "card0"]);
    // The hook refuses (3 of 1 available): only advice is lost, the call answers no preference.
    let r = client
        .get_preferred_allocation(request(&["card0"], &[], 3))
        .await
        .unwrap()
        .into_inner();
    assert!(r.container_responses[0].device_i_ds.is_empty());
    assert!(host.log().contains("only 1 available"), "{}", host.log());

    let pre_start = |ids: &[&str]| wdp_kubelet::api::PreStartContainerRequest {
        devices_ids: ids.iter().map(|s| s.to_string()).collect(),
    };
    client
        .pre_start_container(pre_start(&["card0", "card1"]))
        .await
        .unwrap();
    let e = client
        .pre_start_container(pre_start(&["card0", "bad3"]))
        .await
        .unwrap_err();
    assert!(
        e.message().contains("bad3 failed its pre-start check"),
        "{}",
        e.message()
    );

    // No post-allocator export: Allocate is the default answer.
    let r = kubelet
        .allocate("gpu.example.com/gpu", &["card1"])
        .await
        .unwrap();
    assert_eq!(r.container_responses.len(), 1);

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// Nothing a guest returns can make kubelet mount or expose what the operator did not allow:
/// a refused tree never reaches kubelet (the last good one stays), and a hook answer that breaks
/// the policy fails that Allocate only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_violations_never_reach_kubelet() {
    let f = Fixture::new();
    f.char_dev("null", 1, 3);
    qat_nodes(&f);
    let config = f.write_config(&format!(
        "scanners:
  - name: bad
    component: {hostile}
    namespace: bad.example.com
    env: {{ ATTACK: bad-tree, BAD: mount-root }}
{}{}{}{}",
        hook_scanner("mount", "mount-root", "5s"),
        hook_scanner("node", "node-outside-dev", "5s"),
        hook_scanner("count", "wrong-count", "5s"),
        hook_scanner("qat", "renumber", "5s"),
        hostile = guest("hostile").display(),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("bad.example.com/good", &["g"]).await;
    let ids = ["0000:3d:01.0", "0000:3d:01.1", "0000:3d:01.2"];
    for ns in ["mount", "node", "count", "qat"] {
        seen.devices(&format!("{ns}.example.com/generic"), &ids)
            .await;
    }
    for (ns, needle) in [
        ("mount", "mount of host path \"/\""),
        (
            "node",
            "\"/etc/shadow\" of the response for container 0 must be under /dev",
        ),
        ("count", "returned 0 responses for 1 containers"),
    ] {
        let e = kubelet
            .allocate(&format!("{ns}.example.com/generic"), &["0000:3d:01.0"])
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::Internal, "{ns}: {e:?}");
        assert!(e.message().contains(needle), "{ns}: {}", e.message());
    }
    // A well-behaved hook beside them still answers.
    let r = kubelet
        .allocate("qat.example.com/generic", &["0000:3d:01.0"])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].envs["QAT0"], "0000:3d:01.0");
    // The refused type never reached kubelet; the log names the scanner, the rule and the value
    // (the bad tree came right after the good one: it is validated once their burst's interval
    // has passed, so the refusal is waited for).
    let log = host.logged("device tree refused", 1).await;
    assert!(
        !kubelet
            .resources()
            .contains(&"bad.example.com/bad".to_string())
    );
    assert!(
        log.contains("device tree refused")
            && log.contains("allowed-mounts")
            && log.contains("\"/\""),
        "{log}"
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// kubelet restarts (stop, sockets deleted, start) 20 times in a row; every resource registers
/// again each time. Also covers a host that starts before kubelet exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_resource_reregisters_after_each_kubelet_restart() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232)
        .char_dev("net/tun", 10, 200)
        .char_dev("ttyUSB0", 188, 0);
    let config = kvm_and_serial_config(&f);
    let plugins = f.plugin_dir();
    // The host comes up with no kubelet at all: it must wait, not exit.
    let host = Host::start(&config, &plugins, &f);
    host.logged("kubelet socket absent; waiting for it", 1)
        .await;
    let expected = [
        "devices.example.com/kvm",
        "devices.example.com/tun",
        "serial.example.com/serial",
    ];
    let (mut kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    seen.all_listed(&expected).await;

    let mut took = Vec::new();
    for _ in 0..20 {
        kubelet.stop().await;
        let started = Instant::now();
        // StandIn::start deletes every socket in the directory first, as kubelet does.
        let (k, s) = StandIn::start(&plugins).unwrap();
        kubelet = k;
        seen = Seen::new(s);
        seen.all_listed(&expected).await;
        took.push(started.elapsed());
        assert_eq!(kubelet.resources(), expected);
    }
    took.sort();
    eprintln!(
        "kubelet restart -> all {} resources registered with devices, 20 restarts: median {:?}, max {:?}",
        expected.len(),
        took[took.len() / 2],
        took[took.len() - 1]
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_fails_before_anything_starts() {
    let f = Fixture::new();
    let plugins = f.plugin_dir();
    let config = f.write_config(&format!(
            "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    limits: {{ memory: 64MB }}\n",
            guest("kvm").display()
        ),
    );
    let out = wdp_tests::wdp_run_to_exit(&f, &config);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("wdp.yaml"), "{err}");
    assert!(err.contains("scanners[0].limits.memory"), "{err}");
    assert!(sockets(&plugins).is_empty());

    // A name kubelet refuses on every attempt is refused before anything starts.
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.kubernetes.io\n",
        guest("kvm").display()
    ));
    let out = wdp_tests::wdp_run_to_exit(&f, &config);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("scanners[0].namespace: \"devices.kubernetes.io\": kubelet refuses")
            && err.contains("kubernetes.io namespace"),
        "{err}"
    );

    // A post-allocator that is not a hook is refused by name, too.
    let config = f.write_config(&format!(
            "scanners:\n  - name: kvm\n    component: {kvm}\n    namespace: devices.example.com\n    post-allocator: {kvm}\n",
            kvm = guest("kvm").display()
        ),
    );
    let out = wdp_tests::wdp_run_to_exit(&f, &config);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scanner kvm: post-allocator"), "{err}");
    assert!(err.contains("exports no hook"), "{err}");
}

/// Library level: the manager's diffing and lifecycle guarantees.
mod manager {
    use super::*;
    use std::sync::Arc;
    use wdp::manager::{Claims, Manager};
    use wdp::tree::{DeviceInfo, DeviceTree};
    use wdp_kubelet::dir::PluginDir;
    use wdp_kubelet::server::PluginSockets;

    fn tree(types: &[&str]) -> DeviceTree {
        let info = DeviceInfo::default();
        DeviceTree(
            types
                .iter()
                .map(|t| {
                    (
                        t.to_string(),
                        [("d0".to_string(), info.clone())].into_iter().collect(),
                    )
                })
                .collect(),
        )
    }

    fn kubelet(dir: &Path) -> Arc<PluginSockets> {
        Arc::new(PluginSockets {
            dir: PluginDir::watch(dir).unwrap(),
            socket: dir.join("kubelet.sock"),
        })
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn added_updated_removed_and_removed_before_started() {
        let f = Fixture::new();
        let plugins = f.plugin_dir();
        let k = kubelet(&plugins);
        let mut m = Manager::new("t".into(), "ns.example.com".into(), k, None, Arc::default());
        let d = m.apply(tree(&["a", "b"]));
        assert_eq!((d.added.len(), d.updated.len(), d.removed.len()), (2, 0, 0));
        // "b" goes away at once, before kubelet even exists: nothing may be left of it.
        let d = m.apply(tree(&["a"]));
        assert_eq!(d.removed, ["b"]);
        let (kubelet, seen) = StandIn::start(&plugins).unwrap();
        let mut seen = Seen::new(seen);
        seen.devices("ns.example.com/a", &["d0"]).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(kubelet.resources(), ["ns.example.com/a"]);
        assert_eq!(sockets(&plugins), ["kubelet.sock", "ns.example.com-a.sock"]);

        let mut changed = tree(&["a"]);
        changed
            .0
            .get_mut("a")
            .unwrap()
            .insert("d1".into(), tree(&["x"]).0["x"]["d0"].clone());
        let d = m.apply(changed.clone());
        assert_eq!(d.updated, ["a"]);
        seen.devices("ns.example.com/a", &["d0", "d1"]).await;
        assert!(m.apply(changed).is_empty());

        m.stop_all().await;
        assert_eq!(sockets(&plugins), ["kubelet.sock"]);
        kubelet.stop().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_scanners_cannot_serve_one_resource() {
        let f = Fixture::new();
        let plugins = f.plugin_dir();
        let k = kubelet(&plugins);
        let claims: Arc<Claims> = Arc::default();
        let ns = "ns.example.com".to_string();
        let mut first = Manager::new("first".into(), ns.clone(), k.clone(), None, claims.clone());
        let mut second = Manager::new("second".into(), ns, k, None, claims);
        first.apply(tree(&["gpu"]));
        second.apply(tree(&["gpu", "npu"]));
        assert_eq!(first.served(), ["gpu"]);
        assert_eq!(second.served(), ["npu"]);
        first.stop_all().await;
        second.stop_all().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_socket_path_too_long_is_refused() {
        let f = Fixture::new();
        let plugins = f.plugin_dir();
        let k = kubelet(&plugins);
        let long_ns = format!("{}.example.com", "a".repeat(60));
        let mut m = Manager::new("t".into(), long_ns, k, None, Arc::default());
        m.apply(tree(&[&"b".repeat(60)]));
        assert!(m.served().is_empty());
        let e = wdp_kubelet::names::Resource::new("ns.example.com", &"b".repeat(120), &plugins)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Unix sockets allow 107"), "{e}");
    }
}

/// A dev-type its scanner lists with no device is not registered (kubelet would keep the name on
/// the Node at capacity 0 for good): not once its tree is served, until its first device
/// appears; after that it stays registered with none left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_type_without_devices_is_registered_only_from_its_first_device() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = kvm_and_serial_config(&f);
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let host = Host::start_with(&config, &plugins, &f, &["--metrics-addr", "127.0.0.1:0"]);
    let addr = host.metrics_addr().await;
    seen.devices("devices.example.com/kvm", &["kvm-0", "kvm-1"])
        .await;
    // The serial scanner's tree, with its empty `serial` type, has been served.
    wdp_tests::eventually("the serial scanner's first tree accepted", || async {
        let (_, body) = wdp_tests::http::http_get(&addr, "/status").await.ok()?;
        let status: serde_json::Value = serde_json::from_str(&body).ok()?;
        let serial = status["scanners"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == "serial")?
            .clone();
        (serial["trees_accepted"].as_u64()? >= 1).then_some(())
    })
    .await;
    assert_eq!(kubelet.resources(), ["devices.example.com/kvm"]);
    assert!(!plugins.join("serial.example.com-serial.sock").exists());
    assert_eq!(seen.registrations("serial.example.com/serial"), 0);

    // Its first device: registered and listed.
    f.char_dev("ttyUSB0", 188, 0);
    seen.devices("serial.example.com/serial", &["ttyUSB0"])
        .await;
    assert_eq!(
        kubelet.resources(),
        ["devices.example.com/kvm", "serial.example.com/serial"]
    );
    // Its last device goes: still served, with an empty list.
    f.remove_dev("ttyUSB0");
    seen.devices("serial.example.com/serial", &[]).await;
    assert!(!seen.has_ended("serial.example.com/serial"));
    assert!(plugins.join("serial.example.com-serial.sock").exists());

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
