//! Disk faults lose nothing: every file `wdp run` writes (CDI specs, the DRA checkpoint, the
//! compile cache) on a tmpfs filled to its last byte or remounted read-only. The previous file
//! stays whole, the failure is logged once with its path and errno, `/readyz` and
//! `wdp_disk_write_failing` say what is degraded, the write is retried once the disk frees with
//! nothing else changing, and kubelet is never told what is not on disk.

use std::path::{Path, PathBuf};
use std::time::Duration;

use wdp_dra::apiserver::standin::{ApiServerStandIn, allocated_claim};
use wdp_dra::kubelet::KubeletStandIn;
use wdp_dra::plugin::ClaimRef;
use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::{Fixture, Tmpfs};
use wdp_tests::host::{Host, Seen};
use wdp_tests::http::http_get;
use wdp_tests::{eventually, eventually_showing, guest, resolve_cdi};

use crate::dra::{KubeletDirs, NODE, kvm_config};

/// The scanners' namespace: in DRA mode, the driver's name too (the DRA module's driver).
const NAMESPACE: &str = crate::dra::DRIVER;

/// A tmpfs of 64 KiB on `dir` (made if missing), unmounted when dropped.
fn small_disk(dir: &Path, options: &str) -> Tmpfs {
    std::fs::create_dir_all(dir).unwrap();
    Tmpfs::mount(dir, &format!("size=64k,{options}")).expect("mount a tmpfs (tests run as root)")
}

/// Fills the file system of `dir` to its last byte with one file, and returns it.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    for chunk in [4096, 1] {
        let bytes = vec![0u8; chunk];
        loop {
            match file.write(&bytes) {
                Ok(n) if n > 0 => {}
                Err(e) if e.raw_os_error() != Some(28) => panic!("filling {}: {e}", dir.display()),
                _ => break,
            }
        }
    }
    path
}

/// The names in `dir`, sorted: what a failed write may not leave behind.
fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// The value of the sample `series` (name and labels, as `/metrics` prints them).
async fn metric(addr: &str, series: &str) -> Option<f64> {
    let (_, text) = http_get(addr, "/metrics").await.ok()?;
    let prefix = format!("{series} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))?
        .parse()
        .ok()
}

/// Waits until the sample `series` reads `want`.
async fn metric_is(addr: &str, series: &str, want: f64) {
    eventually_showing(&format!("{series} = {want}"), || async {
        match metric(addr, series).await {
            Some(v) if v == want => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
}

/// Waits until `/readyz` answers `code` with a body holding `needle`.
async fn readyz(addr: &str, code: u16, needle: &str) {
    eventually_showing(&format!("/readyz {code} with {needle:?}"), || async {
        match http_get(addr, "/readyz").await {
            Ok((c, body)) if c == code && body.contains(needle) => Ok(()),
            Ok((c, body)) => Err(format!("{c} {body}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// How many times the host logged a failed write.
fn failures_logged(host: &Host) -> usize {
    host.log()
        .matches("cannot write; the previous file stays")
        .count()
}

/// The CDI names one Allocate of `id` hands out, and its device nodes' host paths.
async fn allocate(kubelet: &StandIn, resource: &str, id: &str) -> (Vec<String>, Vec<String>) {
    let answer = kubelet.allocate(resource, &[id]).await.unwrap();
    let container = &answer.container_responses[0];
    (
        container
            .cdi_devices
            .iter()
            .map(|d| d.name.clone())
            .collect(),
        container
            .devices
            .iter()
            .map(|d| d.host_path.clone())
            .collect(),
    )
}

/// CDI specs on a full, then read-only, spec directory: a restart onto the full disk keeps the
/// spec and its name; a device type hot-plugged meanwhile is served without a CDI name (its
/// nodes still in the answer), named on `/readyz` with the errno and in the metrics, logged once
/// however often it is retried, and written with its name served once the disk frees, with no
/// other change on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_specs_survive_a_full_and_a_read_only_disk() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let cdi = f.path().join("cdi");
    let disk = small_disk(&cdi, "rw");
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: {NAMESPACE}\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n    cdi: {{ dir: {} }}\n",
        guest("kvm").display(),
        cdi.display()
    ));
    let plugins = f.plugin_dir();
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    let kvm = format!("{NAMESPACE}/kvm");
    let (host, _) = Host::start_with_metrics(&config, &plugins, &f).await;
    seen.devices(&kvm, &["kvm-0"]).await;
    let kvm_spec = cdi.join(format!("wdp-{NAMESPACE}-kvm.json"));
    let kvm_name = format!("{NAMESPACE}/kvm=kvm-0");
    assert_eq!(
        allocate(&kubelet, &kvm, "kvm-0").await.0,
        [kvm_name.as_str()]
    );
    let before = std::fs::read(&kvm_spec).unwrap();
    assert!(host.terminate().await.success());

    // wdp restarts onto a full disk: the spec kubelet already handed out stays, and so does its
    // name (the spec on disk is the one it would write).
    let filler = fill(&cdi);
    let (host, addr) = Host::start_with_metrics(&config, &plugins, &f).await;
    seen.until("kvm registered again", |s| s.registrations(&kvm) >= 2)
        .await;
    readyz(&addr, 200, "ready").await;
    assert_eq!(
        allocate(&kubelet, &kvm, "kvm-0").await.0,
        [kvm_name.as_str()]
    );
    assert_eq!(std::fs::read(&kvm_spec).unwrap(), before);

    // A device type hot-plugged onto the full disk: served, without a CDI name the runtime
    // could not resolve.
    f.char_dev("fuse", 10, 229);
    let fuse = format!("{NAMESPACE}/fuse");
    seen.devices(&fuse, &["fuse-0"]).await;
    let fuse_spec = cdi.join(format!("wdp-{NAMESPACE}-fuse.json"));
    readyz(
        &addr,
        503,
        &format!(
            "CDI spec {} not written: No space left on device (os error 28)",
            fuse_spec.display()
        ),
    )
    .await;
    assert_eq!(
        allocate(&kubelet, &fuse, "fuse-0").await,
        (vec![], vec!["/dev/fuse".to_string()])
    );
    metric_is(&addr, "wdp_disk_write_failing{kind=\"cdi\"}", 1.0).await;
    // Retried with a backoff, logged once.
    eventually("three failed writes", || async {
        (metric(&addr, "wdp_disk_write_failures_total{kind=\"cdi\"}").await? >= 3.0).then_some(())
    })
    .await;
    assert_eq!(failures_logged(&host), 1, "{}", host.log());
    assert!(host.log().contains(&fuse_spec.display().to_string()));
    assert_eq!(std::fs::read(&kvm_spec).unwrap(), before);
    assert_eq!(
        names(&cdi),
        ["filler".to_string(), format!("wdp-{NAMESPACE}-kvm.json")],
        "no temporary file left"
    );

    // The disk frees: the spec is written and the name served, with nothing else changing.
    std::fs::remove_file(&filler).unwrap();
    let fuse_name = format!("{NAMESPACE}/fuse=fuse-0");
    eventually("fuse-0 allocated with its CDI name", || async {
        let (names, _) = allocate(&kubelet, &fuse, "fuse-0").await;
        (names == [fuse_name.clone()]).then_some(())
    })
    .await;
    let edits = resolve_cdi(&cdi, &fuse_name).expect("the runtime resolves the name");
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/fuse");
    readyz(&addr, 200, "ready").await;
    metric_is(&addr, "wdp_disk_write_failing{kind=\"cdi\"}", 0.0).await;
    host.logged("written again", 1).await;

    // Read-only: the same, with its errno.
    assert!(disk.remount("ro"));
    f.char_dev("net/tun", 10, 200);
    let tun = format!("{NAMESPACE}/tun");
    seen.devices(&tun, &["tun-0"]).await;
    readyz(&addr, 503, "Read-only file system (os error 30)").await;
    assert_eq!(
        allocate(&kubelet, &tun, "tun-0").await.0,
        Vec::<String>::new()
    );
    assert!(disk.remount("rw"));
    let tun_name = format!("{NAMESPACE}/tun=tun-0");
    eventually("tun-0 allocated with its CDI name", || async {
        let (names, _) = allocate(&kubelet, &tun, "tun-0").await;
        (names == [tun_name.clone()]).then_some(())
    })
    .await;
    assert!(resolve_cdi(&cdi, &tun_name).is_some());
    readyz(&addr, 200, "ready").await;
    assert_eq!(failures_logged(&host), 2, "one per fault: {}", host.log());
    assert_eq!(std::fs::read(&kvm_spec).unwrap(), before);

    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// The DRA checkpoint on a full disk: a claim whose preparation could not be checkpointed is
/// refused (its own error in the answer), the last checkpoint stays whole with no temporary file
/// beside it, `/readyz` and the metrics name it, the failure is logged once across kubelet's
/// retries, and the retry once the disk frees prepares the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_refused_when_its_checkpoint_cannot_be_written() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let dirs = KubeletDirs::new(&f);
    let driver_dir = dirs.plugins.join(NAMESPACE);
    let _disk = small_disk(&driver_dir, "rw");
    let api = ApiServerStandIn::start()
        .await
        .expect("the API server stand-in");
    let config = kvm_config(&f, &dirs, &api, "SLOTS: 2, RESCAN_INTERVAL_MS: 600000", "");
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    let (host, addr) = Host::start_with_metrics(&config, &f.plugin_dir(), &f).await;
    kubelet
        .registered(NAMESPACE, Duration::from_secs(20))
        .await
        .expect("registered");
    let claim = |name: &str, device: &str| {
        let c = api.insert_claim(allocated_claim(
            "default",
            name,
            NAMESPACE,
            NODE,
            &[("kvm", device)],
        ));
        ClaimRef {
            namespace: "default".into(),
            uid: c.metadata.uid.unwrap_or_default(),
            name: name.into(),
        }
    };
    let first = claim("first", "kvm-0");
    eventually_showing("the first claim prepared", || async {
        let answer = kubelet
            .prepare(NAMESPACE, std::slice::from_ref(&first))
            .await
            .map_err(|e| e.to_string())?;
        let error = &answer[&first.uid].error;
        error.is_empty().then_some(()).ok_or_else(|| error.clone())
    })
    .await;
    let checkpoint = driver_dir.join("checkpoint.json");
    let before = std::fs::read(&checkpoint).unwrap();
    let listed = names(&driver_dir);

    let filler = fill(&driver_dir);
    let second = claim("second", "kvm-1");
    for _ in 0..3 {
        let answer = kubelet
            .prepare(NAMESPACE, std::slice::from_ref(&second))
            .await
            .unwrap();
        let entry = &answer[&second.uid];
        assert!(
            entry.error.contains("checkpoint not written")
                && entry
                    .error
                    .contains("No space left on device (os error 28)"),
            "{entry:?}"
        );
        assert!(entry.devices.is_empty());
    }
    assert_eq!(
        std::fs::read(&checkpoint).unwrap(),
        before,
        "the last one, whole"
    );
    let mut with_filler = listed.clone();
    with_filler.push("filler".into());
    with_filler.sort();
    assert_eq!(names(&driver_dir), with_filler, "no temporary file left");
    readyz(
        &addr,
        503,
        &format!(
            "DRA checkpoint {} not written: No space left on device (os error 28)",
            checkpoint.display()
        ),
    )
    .await;
    metric_is(&addr, "wdp_disk_write_failing{kind=\"checkpoint\"}", 1.0).await;
    metric_is(
        &addr,
        "wdp_disk_write_failures_total{kind=\"checkpoint\"}",
        3.0,
    )
    .await;
    assert_eq!(failures_logged(&host), 1, "{}", host.log());
    // What is prepared is what the checkpoint holds: the first claim still answers.
    let again = kubelet
        .prepare(NAMESPACE, std::slice::from_ref(&first))
        .await
        .unwrap();
    assert_eq!(again[&first.uid].error, "");

    // The disk frees: kubelet's next retry prepares the claim.
    std::fs::remove_file(&filler).unwrap();
    let answer = kubelet
        .prepare(NAMESPACE, std::slice::from_ref(&second))
        .await
        .unwrap();
    assert_eq!(answer[&second.uid].error, "");
    assert_eq!(
        answer[&second.uid].devices[0].cdi_device_ids,
        [format!("{NAMESPACE}/kvm=kvm-1")]
    );
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&checkpoint).unwrap()).unwrap();
    assert!(saved["claims"].get(&second.uid).is_some(), "{saved}");
    readyz(&addr, 200, "ready").await;
    metric_is(&addr, "wdp_disk_write_failing{kind=\"checkpoint\"}", 0.0).await;

    assert!(host.terminate().await.success());
    kubelet.stop();
}

/// A read-only compile cache costs compile time only: the scanner is served from the component
/// compiled in memory, the host stays ready, and the failure is logged once and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_compile_cache_only_costs_compile_time() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let _disk = small_disk(&f.path().join("compiled"), "ro");
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: {NAMESPACE}\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
        guest("kvm").display()
    ));
    let plugins = f.plugin_dir();
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    let (host, addr) = Host::start_with_metrics(&config, &plugins, &f).await;
    seen.devices(&format!("{NAMESPACE}/kvm"), &["kvm-0"]).await;
    readyz(&addr, 200, "ready").await;
    metric_is(&addr, "wdp_disk_write_failing{kind=\"compile-cache\"}", 1.0).await;
    assert_eq!(failures_logged(&host), 1, "{}", host.log());
    assert!(
        host.log().contains("Read-only file system (os error 30)"),
        "{}",
        host.log()
    );
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
