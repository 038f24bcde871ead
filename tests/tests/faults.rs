//! Host-side faults: each gives a clear log line, no crash, and recovery once the fault is gone.

use std::time::Duration;

use wdp_kubelet::api::Empty;
use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::{Fixture, Tmpfs};
use wdp_tests::host::{Host, Seen, serve};
use wdp_tests::{EVENT_TIMEOUT, guest};

fn kvm_config(f: &Fixture) -> std::path::PathBuf {
    let path = f.path().join("wdp.yaml");
    std::fs::write(
        &path,
        format!(
            "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
            guest("kvm").display()
        ),
    )
    .unwrap();
    path
}

fn setup() -> (Fixture, std::path::PathBuf, std::path::PathBuf) {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let config = kvm_config(&f);
    (f, plugins, config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_socket_missing_at_start() {
    let (f, plugins, config) = setup();
    let host = Host::start(&config, &plugins, &f);
    host.logged("kubelet socket absent; waiting for it", 1)
        .await;
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// A "kubelet" that accepts connections and never answers: registration must not hang for
/// ever, and a real kubelet appearing afterwards is registered with at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_that_never_answers_register() {
    let (f, plugins, config) = setup();
    let socket = plugins.join("kubelet.sock");
    let mute = tokio::net::UnixListener::bind(&socket).unwrap();
    let (dialed, mut dials) = tokio::sync::watch::channel(0usize);
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = mute.accept().await {
            conns.push(conn); // hold, never speak
            dialed.send_replace(conns.len());
        }
    });
    let host = Host::start(&config, &plugins, &f);
    // The host dials the mute kubelet and waits for Register's answer.
    tokio::time::timeout(EVENT_TIMEOUT, dials.wait_for(|n| *n > 0))
        .await
        .expect("the host dials the mute kubelet")
        .unwrap();
    held.abort();
    // The real kubelet replaces the mute one (it removes the old socket as kubelet does).
    std::fs::remove_file(&socket).unwrap();
    let started = std::time::Instant::now();
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "registration waited out the mute kubelet: {:?}",
        started.elapsed()
    );
    host.logged("registered with kubelet", 1).await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// kubelet dropping ListAndWatch streams at random moments: each new stream gets the full list
/// at once, and a long-lived stream keeps receiving updates throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_closed_at_random() {
    let (f, plugins, config) = setup();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    let client = kubelet.client("devices.example.com/kvm").unwrap();
    // A deterministic "random" schedule (xorshift), so a failure reproduces.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    for round in 0..40 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let mut c = client.clone();
        let mut stream = c.list_and_watch(Empty {}).await.unwrap().into_inner();
        let first = tokio::time::timeout(EVENT_TIMEOUT, stream.message())
            .await
            .expect("first list in time")
            .unwrap()
            .expect("a list");
        assert_eq!(first.devices.len(), 1, "round {round}");
        tokio::time::sleep(Duration::from_millis(x % 20)).await;
        drop(stream); // closed at a random moment
    }
    // The stand-in's own stream saw none of that: a hot-plug still reaches it.
    f.char_dev("fuse", 10, 229);
    seen.devices("devices.example.com/fuse", &["fuse-0"]).await;
    let r = kubelet
        .allocate("devices.example.com/kvm", &["kvm-0"])
        .await
        .unwrap();
    assert_eq!(r.container_responses[0].devices[0].host_path, "/dev/kvm");
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The plugin directory becomes read-only: the socket cannot be created; once writable again,
/// the resource is served and registered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plugin_dir_not_writable() {
    let (f, plugins, config) = setup();
    let Some(tmpfs) = Tmpfs::mount(&plugins, "rw,size=1m") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root with mount rights)");
        return;
    };
    let remount = |opts: &str| assert!(tmpfs.remount(opts), "remount {opts}");
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    remount("ro");
    let host = Host::start(&config, &plugins, &f);
    host.logged("cannot listen; retrying", 1).await;
    assert!(
        host.log().contains("Read-only file system"),
        "{}",
        host.log()
    );
    remount("rw");
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The config file deleted while running: nothing changes; the host still serves and still
/// follows a kubelet restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_deleted_while_running() {
    let (f, plugins, config) = setup();
    let (kubelet, mut seen, host) = serve(&f, &config, &plugins);
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    std::fs::remove_file(&config).unwrap();
    kubelet.stop().await;
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    Seen::new(seen)
        .devices("devices.example.com/kvm", &["kvm-0"])
        .await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// Components that cannot run are refused before anything starts, naming scanner and file.
#[test]
fn components_that_are_not_scanners_are_refused_at_start() {
    let (f, plugins, _) = setup();
    let not_wasm = f.path().join("notes.wasm");
    std::fs::write(&not_wasm, "this is not wasm").unwrap();
    // The smallest valid core module: header and version, no sections.
    let core_module = f.path().join("core.wasm");
    std::fs::write(&core_module, b"\0asm\x01\0\0\0").unwrap();
    for (component, needle) in [
        (
            not_wasm.clone(),
            "notes.wasm is not a valid wasm component: it is not WebAssembly at all",
        ),
        (
            core_module,
            "core.wasm is not a valid wasm component: it is a core wasm module (build it for wasm32-wasip2, or wrap it with `wasm-tools component new`)",
        ),
        (
            guest("test_hooks"),
            "does not export wdp:device-plugin/scanner",
        ),
    ] {
        let config = f.path().join("bad.yaml");
        std::fs::write(
            &config,
            format!(
                "scanners:\n  - name: odd\n    component: {}\n    namespace: x.example.com\n",
                component.display()
            ),
        )
        .unwrap();
        let out = wdp_tests::wdp_run_to_exit(&f, &config);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("scanner odd") && err.contains(needle), "{err}");
        // One line, the cause said once (no parser dump, no chain repeating the message).
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(wdp_tests::host::sockets(&plugins).is_empty());
    }
}
