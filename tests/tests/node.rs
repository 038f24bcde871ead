//! What a real node's kubelet expects of a plugin, beyond the order of its calls: advice that
//! stays advice (GetPreferredAllocation), topology only where there is one, answers within
//! kubelet's deadlines, and CDI specs that outlive the process.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tonic::Code;
use wdp::kubelet::api;
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::serve;

fn write_config(f: &Fixture, yaml: &str) -> PathBuf {
    let path = f.path().join("wdp.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn plugin_dir(f: &Fixture) -> PathBuf {
    let dir = f.path().join("plugins");
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    let config = write_config(
        &f,
        &format!(
            "scanners:\n{}{}",
            allocator_scanner("greedy", "PREFERRED_MODE: greedy", "5s"),
            allocator_scanner("slow", "PREFERRED_MODE: sleep", "500ms"),
        ),
    );
    let plugins = plugin_dir(&f);
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
    assert!(host.log().contains("get-preferred-allocation hook failed; no preference"));

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// An empty TopologyInfo tells kubelet the device is NUMA-aware and on no node; no nodes from a
/// guest is sent as no topology at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_numa_list_is_sent_as_no_topology() {
    let f = Fixture::new();
    let config = write_config(
        &f,
        &format!(
            "scanners:
  - name: acc
    component: {}
    namespace: acc.example.com
    env: {{ TREE: '{{\"acc\": {{\"none\": {{\"numa\": []}}, \"one\": {{\"numa\": [1]}}, \"unset\": {{}}}}}}' }}
",
            guest("static_tree").display()
        ),
    );
    let plugins = plugin_dir(&f);
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
    let config = write_config(
        &f,
        &format!(
            "scanners:\n{}",
            allocator_scanner("pre", "PRE_START_MODE: sleep", "2m")
        ),
    );
    let plugins = plugin_dir(&f);
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices(
        "pre.example.com/gpu",
        &["card0", "card1", "card2", "card3"],
    )
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
    assert!(e.message().contains("no answer within 25s"), "{}", e.message());
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
