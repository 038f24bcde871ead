//! What a real node's kubelet expects of a plugin, beyond the order of its calls: advice that
//! stays advice (GetPreferredAllocation), topology only where there is one, answers within
//! kubelet's deadlines, and CDI specs that outlive the process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tonic::Code;
use wdp_kubelet::api;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;
use wdp_tests::{guest, resolve_cdi};

/// One `kvm` scanner (one slot, rescanning only on a change) serving `devices.example.com/kvm`.
fn kvm_config(f: &Fixture) -> PathBuf {
    f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {}
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
",
        guest("kvm").display()
    ))
}

/// A `static_tree` scanner of namespace `<name>.example.com` with `test_allocator` as its hook.
fn allocator_scanner(name: &str, env: &str, timeout: &str) -> String {
    format!(
        "  - name: {name}
    component: {tree_guest}
    post-allocator: {allocator}
    namespace: {name}.example.com
    env: {{ TREE: '{{\"gpu\": {{\"card0\": {{}}, \"card1\": {{}}, \"card2\": {{}}, \"card3\": {{}}}}}}', {env} }}
    limits: {{ call-timeout: {timeout} }}
",
        tree_guest = guest("static_tree").display(),
        allocator = guest("test_allocator").display(),
    )
}

fn preferred(available: &[&str], must: &[&str], size: i32) -> api::PreferredAllocationRequest {
    api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: available.iter().map(|s| s.to_string()).collect(),
            must_include_device_i_ds: must.iter().map(|s| s.to_string()).collect(),
            allocation_size: size,
        }],
    }
}

/// kubelet picks at random among more ids than it asked for, and fails the pod when the call
/// fails: a hook's answer is trimmed to the size, starts with the must-include ids and holds only
/// offered ids; a hook that times out answers "no preference" and the pod goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_is_shaped_and_never_fails_the_pod() {
    let f = Fixture::new();
    let config = f.write_config(&format!(
        "scanners:\n{}{}",
        allocator_scanner("greedy", "PREFERRED_MODE: greedy", "5s"),
        allocator_scanner("slow", "PREFERRED_MODE: sleep", "500ms"),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    let all = ["card0", "card1", "card2", "card3"];
    for ns in ["greedy", "slow"] {
        seen.devices(&format!("{ns}.example.com/gpu"), &all).await;
    }

    // The hook answers an id never offered, every id twice, in reverse, without card1.
    let mut client = kubelet.client("greedy.example.com/gpu").unwrap();
    let r = client
        .get_preferred_allocation(preferred(&["card0", "card1", "card2"], &["card1"], 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.container_responses[0].device_i_ds, ["card1", "card2"]);

    let mut client = kubelet.client("slow.example.com/gpu").unwrap();
    let started = Instant::now();
    let r = client
        .get_preferred_allocation(preferred(&all, &[], 1))
        .await
        .expect("a hook that times out answers no preference, not an error")
        .into_inner();
    assert_eq!(r.container_responses.len(), 1);
    assert!(r.container_responses[0].device_i_ds.is_empty());
    assert!(started.elapsed() < Duration::from_secs(10));
    // The pod's Allocate goes on as if the plugin had no preference.
    kubelet
        .allocate("slow.example.com/gpu", &["card3"])
        .await
        .unwrap();
    assert!(
        host.log()
            .contains("get-preferred-allocation hook failed; no preference")
    );

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// An empty TopologyInfo tells kubelet the device is NUMA-aware and on no node; no nodes from a
/// guest is sent as no topology at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_numa_list_is_sent_as_no_topology() {
    let f = Fixture::new();
    let config = f.write_config(&format!(
            "scanners:
  - name: acc
    component: {}
    namespace: acc.example.com
    env: {{ TREE: '{{\"acc\": {{\"none\": {{\"numa\": []}}, \"one\": {{\"numa\": [1]}}, \"unset\": {{}}}}}}' }}
",
            guest("static_tree").display()
        ),
    );
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("acc.example.com/acc", &["none", "one", "unset"])
        .await;
    assert_eq!(seen.topology("acc.example.com/acc", "none"), Some(None));
    assert_eq!(seen.topology("acc.example.com/acc", "unset"), Some(None));
    assert_eq!(
        seen.topology("acc.example.com/acc", "one"),
        Some(Some(vec![1]))
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// kubelet gives PreStartContainer 30 s and then fails the container: a hook allowed a longer
/// `call-timeout` still answers, with an error, before that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pre_start_hook_answers_within_kubelets_deadline() {
    let f = Fixture::new();
    let config = f.write_config(&format!(
        "scanners:\n{}",
        allocator_scanner("pre", "PRE_START_MODE: sleep", "2m")
    ));
    let plugins = f.plugin_dir();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("pre.example.com/gpu", &["card0", "card1", "card2", "card3"])
        .await;
    let mut client = kubelet.client("pre.example.com/gpu").unwrap();
    let started = Instant::now();
    let e = client
        .pre_start_container(api::PreStartContainerRequest {
            devices_ids: vec!["card0".into()],
        })
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    assert!(
        e.message().contains("no answer within 25s"),
        "{}",
        e.message()
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(
        host.log()
            .contains("limits.call-timeout is longer than kubelet allows PreStartContainer"),
        "{}",
        host.log()
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// CDI specs outlive the process: kubelet replays an Allocate answer's CDI names on every
/// container restart, also while wdp is stopped or crashed. A spec is removed only by a running
/// wdp that no longer serves its resource; at start wdp takes over its own specs and nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_specs_outlive_the_process_and_only_wdps_are_reconciled() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("ttyUSB0", 188, 0);
    let cdi = f.path().join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let spec = |name: &str, kind: &str| {
        let path = cdi.join(name);
        let text = format!("{{\"cdiVersion\": \"0.6.0\", \"kind\": \"{kind}\", \"devices\": []}}");
        std::fs::write(&path, text).unwrap();
        path
    };
    // Another vendor's spec, a spec of a resource no longer configured, one of a type the
    // scanner no longer reports, and a file whose name says wdp and whose kind does not.
    let vendor = spec("vendor.json", "vendor.example.com/gpu");
    let unconfigured = spec("wdp-old.example.com-x.json", "old.example.com/x");
    let vanished = spec(
        "wdp-devices.example.com-gone.json",
        "devices.example.com/gone",
    );
    let impostor = spec(
        "wdp-devices.example.com-fake.json",
        "other.example.com/fake",
    );
    let kvm_config = |format: &str| {
        format!(
            "scanners:
  - name: kvm
    component: {}
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
    cdi: {{ dir: {}, format: {format} }}
",
            guest("kvm").display(),
            cdi.display()
        )
    };
    let config = f.write_config(&kvm_config("json"));
    let plugins = f.plugin_dir();
    let json = cdi.join("wdp-devices.example.com-kvm.json");
    let yaml = cdi.join("wdp-devices.example.com-kvm.yaml");
    let kvm = "devices.example.com/kvm";

    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(kvm, &["kvm-0"]).await;
    let r = kubelet.allocate(kvm, &["kvm-0"]).await.unwrap();
    let names: Vec<&str> = r.container_responses[0]
        .cdi_devices
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    assert_eq!(names, ["devices.example.com/kvm=kvm-0"]);
    // What the runtime resolves the name against.
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(written["kind"], kvm);
    assert_eq!(written["devices"][0]["name"], "kvm-0");
    assert!(
        !unconfigured.exists(),
        "no configured scanner serves old.example.com"
    );
    assert!(!vanished.exists(), "the scanner's first tree has no 'gone'");
    assert!(vendor.exists() && impostor.exists(), "not wdp's");

    // A clean stop, then a crash: the spec stays for the containers kubelet restarts meanwhile.
    assert!(host.terminate().await.success());
    assert!(json.exists(), "SIGTERM removed the spec");
    let host = wdp_tests::host::Host::start(&config, &plugins, &f);
    seen.until("kvm registered again", |s| s.registrations(kvm) >= 2)
        .await;
    host.signal("KILL");
    drop(host);
    assert!(json.exists(), "a crash removed the spec");

    // The format changes while wdp is down: the next start leaves one file, in the new format.
    std::fs::write(&config, kvm_config("yaml")).unwrap();
    let host = wdp_tests::host::Host::start(&config, &plugins, &f);
    seen.until("kvm registered again", |s| s.registrations(kvm) >= 3)
        .await;
    // The first tree's specs are written, and their predecessors settled, before it is served.
    assert!(yaml.exists() && !json.exists(), "one spec per resource");

    // A reload that removes the scanner: its resource is no longer served, its spec goes.
    let serial = format!(
        "scanners:
  - name: serial
    component: {}
    namespace: serial.example.com
    env:
      RESCAN_INTERVAL_MS: 600000
      DEVICES: '[{{\"name\": \"serial\", \"groups\": [{{\"paths\": [{{\"path\": \"/dev/ttyUSB*\"}}]}}]}}]'
",
        guest("generic").display()
    );
    let staged = f.path().join("wdp.yaml.new");
    std::fs::write(&staged, serial).unwrap();
    std::fs::rename(&staged, &config).unwrap();
    seen.devices("serial.example.com/serial", &["ttyUSB0"])
        .await;
    seen.ended(kvm).await;
    // Removed once the new config's scanners are started (then "config reloaded" is logged).
    host.logged("config reloaded", 1).await;
    assert!(!yaml.exists(), "a removed scanner's spec stayed");
    assert!(vendor.exists() && impostor.exists());
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// A ListAndWatch stream that ends while kubelet keeps running: kubelet marks the devices
/// unhealthy, stops the endpoint and never calls ListAndWatch on it again, so wdp registers
/// again at once and the new endpoint lists them healthy. Every cut recovers. A killed kubelet
/// (its `kubelet.sock` left behind, stale) is followed by a new one, served as after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_is_registered_again_and_a_crashed_kubelet_is_followed() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = kvm_config(&f);
    let plugins = f.plugin_dir();
    let kvm = "devices.example.com/kvm";
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(kvm, &["kvm-0"]).await;
    for cut in 1..=5 {
        let before = seen.registrations(kvm);
        assert!(kubelet.cut_stream(kvm));
        seen.until(
            &format!("the end of the stream and a new registration, cut {cut}"),
            |s| s.stream_ends(kvm) >= cut && s.registrations(kvm) > before,
        )
        .await;
        // The end cleared the list: this one comes from the new stream.
        seen.devices(kvm, &["kvm-0"]).await;
        seen.health(kvm, "kvm-0", "Healthy").await;
        assert_eq!(kubelet.stopped(kvm), Some(false), "a new, live endpoint");
        assert_eq!(kubelet.health(kvm, "kvm-0").as_deref(), Some("Healthy"));
        kubelet.allocate(kvm, &["kvm-0"]).await.unwrap();
    }
    assert_eq!(seen.stream_ends(kvm), 5);
    assert!(
        host.log()
            .contains("stream ended while it kept running; registering again"),
        "{}",
        host.log()
    );

    kubelet.crash().await;
    assert!(
        plugins.join("kubelet.sock").exists(),
        "a crash leaves the socket"
    );
    let (kubelet, observed) = wdp_kubelet::standin::StandIn::start(&plugins).unwrap();
    let mut seen = wdp_tests::host::Seen::new(observed);
    seen.devices(kvm, &["kvm-0"]).await;
    kubelet.allocate(kvm, &["kvm-0"]).await.unwrap();
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The plugin directory removed (with kubelet stopped) and created again by the next kubelet:
/// wdp serves and registers in the new directory without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_directory_removed_and_created_again_is_served_again() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = kvm_config(&f);
    let plugins = f.plugin_dir();
    let kvm = "devices.example.com/kvm";
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(kvm, &["kvm-0"]).await;
    kubelet.stop().await;
    for round in 0..2 {
        kubelet_gone(&plugins, &f.path().join(format!("removed-{round}")));
        let (kubelet, observed) = wdp_kubelet::standin::StandIn::start(&plugins).unwrap();
        let mut seen = wdp_tests::host::Seen::new(observed);
        seen.devices(kvm, &["kvm-0"]).await;
        kubelet.allocate(kvm, &["kvm-0"]).await.unwrap();
        kubelet.stop().await;
    }
    assert!(
        host.log().contains("plugin directory created again"),
        "{}",
        host.log()
    );
    assert!(host.terminate().await.success());
}

/// Takes the plugin directory away at once (a rename, then its removal), as `rm -rf` of a
/// stopped kubelet's root would, without racing the host's own rebinding into it.
fn kubelet_gone(plugins: &std::path::Path, aside: &std::path::Path) {
    let _ = std::fs::remove_file(plugins.join("kubelet.sock"));
    std::fs::rename(plugins, aside).unwrap();
    std::fs::remove_dir_all(aside).unwrap();
}

/// kubelet's checkpoint at work: a container admitted once starts again from the cached
/// Allocate answer, its CDI name resolved against the spec directory, while wdp is stopped and
/// across kubelet's own crash; kubelet re-admits it without a new Allocate once the device is
/// registered and healthy again, and a second pod gets the device nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_restart_from_kubelets_checkpoint_while_wdp_is_away() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let cdi = f.path().join("cdi");
    let config = f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {}
    namespace: devices.example.com
    env: {{ SLOTS: 2, RESCAN_INTERVAL_MS: 600000 }}
    cdi: {{ dir: {} }}
",
        guest("kvm").display(),
        cdi.display()
    ));
    let plugins = f.plugin_dir();
    let kvm = "devices.example.com/kvm";
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(kvm, &["kvm-0", "kvm-1"]).await;
    let admitted = kubelet.admit("pod-1", "app", kvm, 1).await.unwrap();
    let name = admitted.cdi_devices[0].name.clone();
    assert_eq!(name, "devices.example.com/kvm=kvm-0");
    assert_eq!(kubelet.allocate_calls(), 1);
    let edits = resolve_cdi(&cdi, &name).expect("the runtime resolves the name");
    // The node is where the container sees it too: the spec gives only its path.
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/kvm");

    // wdp stops (a rolling update): the container restarts from the checkpoint.
    assert!(host.terminate().await.success());
    let restarted = kubelet.start_container("pod-1", "app", kvm).await.unwrap();
    assert_eq!(restarted, admitted);
    assert!(resolve_cdi(&cdi, &name).is_some(), "the spec outlived wdp");

    // kubelet crashes and comes back while wdp is away: only sockets were removed.
    kubelet.crash().await;
    let (kubelet, observed) = wdp_kubelet::standin::StandIn::start(&plugins).unwrap();
    assert!(plugins.join("kubelet_internal_checkpoint").exists());
    let restarted = kubelet.start_container("pod-1", "app", kvm).await.unwrap();
    assert_eq!(restarted, admitted);
    assert!(resolve_cdi(&cdi, &name).is_some());
    let e = kubelet.admit("pod-1", "app", kvm, 1).await.unwrap_err();
    assert!(
        e.message().contains("cannot allocate unregistered device"),
        "{e:?}"
    );

    // wdp is back: the pod is re-admitted from the checkpoint, without Allocate.
    let host = wdp_tests::host::Host::start(&config, &plugins, &f);
    let mut seen = wdp_tests::host::Seen::new(observed);
    seen.devices(kvm, &["kvm-0", "kvm-1"]).await;
    assert_eq!(
        kubelet.admit("pod-1", "app", kvm, 1).await.unwrap(),
        admitted
    );
    assert_eq!(kubelet.allocate_calls(), 0);
    let second = kubelet.admit("pod-2", "app", kvm, 1).await.unwrap();
    assert_eq!(second.cdi_devices[0].name, "devices.example.com/kvm=kvm-1");
    assert_eq!(kubelet.allocate_calls(), 1);
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The stand-in asks for a preferred allocation and runs PreStartContainer only because the
/// plugin advertised them: the packed hook picks the first id in order, and its pre-start check
/// refuses that one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_calls_the_optional_rpcs_a_plugin_advertises() {
    let f = Fixture::new();
    let config = f.write_config(&format!(
        "scanners:
  - name: gpu
    component: {}
    post-allocator: {}
    namespace: gpu.example.com
    env: {{ TREE: '{{\"gpu\": {{\"card0\": {{}}, \"bad1\": {{}}, \"card2\": {{}}}}}}' }}
",
        guest("static_tree").display(),
        guest("test_allocator").display()
    ));
    let plugins = f.plugin_dir();
    let gpu = "gpu.example.com/gpu";
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(gpu, &["bad1", "card0", "card2"]).await;
    let r = kubelet.admit("pod-1", "app", gpu, 1).await.unwrap();
    assert_eq!(r.devices.len(), 0, "no nodes in this tree");
    let e = kubelet
        .start_container("pod-1", "app", gpu)
        .await
        .unwrap_err();
    assert!(
        e.message().contains("bad1 failed its pre-start check"),
        "{e:?}"
    );
    let r = kubelet.admit("pod-2", "app", gpu, 2).await.unwrap();
    assert!(r.cdi_devices.is_empty());
    kubelet.start_container("pod-2", "app", gpu).await.unwrap();
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
