//! Wasm against native: the `generic` scanner as a component in the wdp sandbox, against its own
//! discovery code compiled for this machine (`generic-native`, run as a process: a fresh
//! instance's first scan, the state it keeps built and the tree made), over the same fixture.
//! The wasm scan is timed to the moment its tree reaches the host's sink, lifted out of the guest
//! (the boundary's cost counted) and before the host's own work on it, which the native scan does
//! not do: the same work on both sides, measured as it happens rather than estimated by
//! subtracting medians taken elsewhere. The warm instance's span also leaves out the delivery of
//! the change (inotify to a woken task), which the native scan, timed inside its process, does not
//! wait for.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use tokio::sync::mpsc;
use tokio_util::task::AbortOnDropHandle;
use wdp::bindings::types;
use wdp::hostfs::DevFs;
use wdp::policy::Policy;
use wdp::sandbox::watch::ChangeWatcher;
use wdp::sandbox::{Guest, Roots, Sandbox, SinkClosed, TreeSink};
use wdp::scanner::{EventSink, Scanner, ScannerEvent};
use wdp::topology::Topology;
use wdp_bench::fixtures::{self, BenchFixture, Fixture};
use wdp_bench::stats::{Summary, human};

use super::shared::{guest, ms};
use super::sizes::Sizes;
use crate::e2e::Jitter;
use crate::report::{Report, Row};

/// `generic-native` from `--native BIN` instead of this tree's build.
pub static NATIVE: OnceLock<PathBuf> = OnceLock::new();

/// The `generic` scanner over the same 1,000-node fixture: as a wasm component in the sandbox,
/// and its own discovery code compiled natively.
pub async fn run(sizes: &Sizes, report: &mut Report) -> Result<()> {
    let n = sizes.wasm_devices;
    println!("\n== wasm scanner vs the same logic native, {n} devices ==");
    let f = BenchFixture::new();
    fixtures::bulk(&f, "bench", n);
    // Each match as a mount rather than a device node: the scan is the same glob and the same
    // tree building, but the host's own work on the tree (which both sides pay, and which is
    // subtracted below) shrinks to validation: no node-exists stat and no NUMA lookup per device.
    let devices =
        r#"[{"name":"bench","groups":[{"paths":[{"path":"/dev/bench/d*","type":"Mount"}]}]}]"#
            .to_string();
    let policy = Arc::new(Policy {
        allowed_mounts: vec!["/dev/bench".into()],
        ..Policy::default()
    });

    // The wasm side: the real component in the wdp sandbox over the same fixture.
    let sandbox = Sandbox::new(Roots {
        sys: f.sys(),
        dev: f.dev(),
    })?;
    let component = sandbox.load(&guest("generic")).await?;
    let pre = component.scanner()?;
    let scanner = Scanner {
        guest: Guest::new(
            "generic",
            vec![
                ("DEVICES".into(), devices.clone()),
                ("RESCAN_INTERVAL_MS".into(), "600000".into()),
            ],
        ),
        policy: policy.clone(),
        pre,
    };
    let topology = Arc::new(Topology::new(&f.sys()));
    let sink = |tx, handed: &Handed| -> Box<dyn TreeSink> {
        Box::new(Timed {
            inner: Box::new(EventSink::for_scanner(
                &sandbox,
                &scanner,
                topology.clone(),
                tx,
            )),
            handed: handed.clone(),
        })
    };
    // A fresh instance, its scan running on a task of its own (aborted when dropped: an early
    // return stops the guest too); the channel its trees come out of; when its instantiation
    // began and ended, the end taken before the scan can start.
    let scanning = |handed: &Handed| {
        let (tx, rx) = mpsc::channel(4);
        let store = sandbox.store(&scanner.guest, sink(tx, handed));
        async {
            let mut store = store?;
            let began = Instant::now();
            let plugin = scanner.pre.instantiate_async(&mut store).await?;
            let ended = Instant::now();
            let task = AbortOnDropHandle::new(tokio::spawn(async move {
                plugin
                    .wdp_device_plugin_scanner()
                    .call_scan(&mut store)
                    .await
            }));
            anyhow::Ok((task, rx, began, ended))
        }
    };
    let devfs = DevFs::open(&f.dev())?;
    let host_topology = Topology::new(&f.sys());
    let tree = fixtures::synthetic_tree("bench", "bench", n, true);

    // The three spans the ratio is made of, taken in alternated rounds: this VM's speed moves
    // from one minute to the next (the native scan's median alone by up to 2x between runs), so
    // spans taken in blocks minutes apart would compare different minutes, not wasm and native.
    let rounds = sizes.wasm_rounds.max(1);
    let per_round = |total: usize| total.div_ceil(rounds);
    let mut native_std = Vec::new();
    let mut host_check = Vec::new();
    let mut cold = Vec::new();
    let mut cold_handed = Vec::new();
    let mut instantiate = Vec::new();
    for _ in 0..rounds {
        // Native: generic's config.rs + discover.rs compiled for this machine, over std::fs.
        native_std.extend(native_scans(&f, &devices, n, per_round(sizes.native_runs)).await?);
        // What the host does with a notified tree, natively, on the same tree: policy
        // (node-exists for every node), conversion, NUMA lookups.
        for i in 0..(per_round(sizes.native_runs) + 10) {
            let groups = tree.clone();
            let t0 = Instant::now();
            let mut checked = policy.check_tree(groups, &devfs)?;
            host_topology.fill(&mut checked, &devfs);
            let d = t0.elapsed();
            std::hint::black_box(checked);
            if i >= 10 {
                host_check.push(d);
            }
        }
        // Cold: a fresh instance's first scan, from the end of instantiation to its tree handed
        // to the host (the row), and to the tree validated.
        for _ in 0..per_round(sizes.wasm_cold) {
            let handed = Handed::default();
            let (task, mut rx, t_inst, t0) = scanning(&handed).await?;
            instantiate.push(t0 - t_inst);
            let first = rx.recv().await;
            cold.push(t0.elapsed());
            cold_handed.push(handed.since(t0)?);
            drop(task);
            match first {
                Some(ScannerEvent::Tree(t)) => ensure!(t.device_count() == n, "wasm tree size"),
                other => bail!("expected a tree from the wasm scanner, got {other:?}"),
            }
        }
    }
    // Warm: one instance, a node added and removed in turn; each change is timed from the
    // mknod or unlink to the validated tree. What the kernel and the runtime take to deliver
    // the change (inotify to a woken task) is measured first, with no guest running, by a
    // watcher of our own, and subtracted: timing from that watcher's wake-up while the guest
    // runs is not a start the guest waits for (when the guest's task wakes first, the span
    // loses part of the scan: medians of a third of the scan were seen on a quiet machine).
    let watcher = ChangeWatcher::start(&f.dev(), &f.sys(), None);
    let mut woke = watcher.subscribe();
    let extra = format!("bench/d{n}");
    let mut delivery = Vec::new();
    for i in 0..sizes.wasm_warm {
        tokio::time::sleep(ms(5)).await;
        woke.borrow_and_update();
        let t0 = Instant::now();
        if i % 2 == 0 {
            f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
        } else {
            f.remove_dev(&extra);
        }
        tokio::time::timeout(Duration::from_secs(10), woke.changed()).await??;
        delivery.push(t0.elapsed());
    }
    if f.dev().join(&extra).exists() {
        f.remove_dev(&extra);
        tokio::time::sleep(ms(5)).await;
    }
    let handed = Handed::default();
    let (task, mut rx, _, _) = scanning(&handed).await?;
    let first = rx.recv().await;
    ensure!(matches!(first, Some(ScannerEvent::Tree(_))), "first tree");
    let mut warm = Vec::new();
    let mut warm_total = Vec::new();
    let mut warm_handed = Vec::new();
    let mut jitter = Jitter::new();
    for i in 0..sizes.wasm_warm {
        tokio::time::sleep(jitter.between(ms(10), ms(30))).await;
        woke.borrow_and_update();
        let t0 = Instant::now();
        let want = if i % 2 == 0 {
            f.char_dev(&extra, fixtures::BULK_MAJOR, n as u32);
            n + 1
        } else {
            f.remove_dev(&extra);
            n
        };
        tokio::time::timeout(Duration::from_secs(10), woke.changed()).await??;
        let t_w = Instant::now();
        let got = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await?
            .context("scanner stopped")?;
        let t1 = Instant::now();
        match got {
            ScannerEvent::Tree(t) => ensure!(t.device_count() == want, "warm tree size"),
            other => bail!("expected a tree, got {other:?}"),
        }
        warm.push(t1 - t_w);
        warm_total.push(t1 - t0);
        warm_handed.push(handed.since(t0)?);
    }
    drop(task);
    drop(watcher);

    let med = |v: &[Duration]| Summary::of(v).map(|s| s.median).unwrap_or_default();
    let std_m = med(&native_std);
    let warm_scan = med(&warm_handed).saturating_sub(med(&delivery));
    let cold_scan = med(&cold_handed);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    // Judged on the fresh instance: its first scan is what the native scan does (the whole
    // fixture discovered, the state kept between scans built). A warm instance follows the
    // change (the host's directory changes, one device built and told): not the same work.
    let r_cold = ratio(cold_scan, std_m);
    report.push(Row::value(
        &format!("wasm scanner vs the same logic native, {n} devices"),
        "<= 1.5x native",
        format!("{r_cold:.2}x"),
        format!(
            "{:.2}x warm instance (follows the change)",
            ratio(warm_scan, std_m)
        ),
        Some(r_cold <= 1.5),
        &format!(
            "generic over `/dev/bench/d*` (as mounts), a fresh instance's first scan; scan medians: wasm {}, native {}; taken in {rounds} alternated rounds",
            human(cold_scan),
            human(std_m)
        ),
    ));
    let line = |name: &str, v: &[Duration]| -> String {
        match Summary::of(v) {
            Some(s) => format!(
                "| {name} | {} | {} | {} |\n",
                human(s.median),
                human(s.p99),
                s.n
            ),
            None => format!("| {name} | - | - | 0 |\n"),
        }
    };
    let mut t = String::from(
        "Medians are of the measured spans. The wasm scans are timed to the moment the tree \
         reaches the host's sink (lifted out of the guest, before the host's own work on it, \
         which is shown apart); the warm one less the delivery of the change (mknod/unlink to \
         a woken watcher, no guest running).\n\n\
         | span | median | p99 | n |\n|---|---|---|---|\n",
    );
    t += &line(
        "native scan (`generic-native`: parse DEVICES + a fresh instance's first scan over std::fs)",
        &native_std,
    );
    t += &line(
        "host work on the notified tree (validation, policy), native",
        &host_check,
    );
    t += &line("wasm: instantiate a fresh instance", &instantiate);
    t += &line(
        "wasm, fresh instance: first scan, to the tree lifted into the host",
        &cold_handed,
    );
    t += &line(
        "wasm, fresh instance: first scan + notify + host work, to the validated tree",
        &cold,
    );
    t += &line(
        "wasm, warm instance: wake-up to validated tree (scan + notify + host work)",
        &warm,
    );
    t += &line(
        "wasm, warm instance: mknod/unlink to the tree lifted into the host",
        &warm_handed,
    );
    t += &line(
        "wasm, warm instance: mknod/unlink to validated tree",
        &warm_total,
    );
    t += &line(
        "delivery of a change: mknod/unlink to a woken watcher, no guest running",
        &delivery,
    );
    t += &format!(
        "\nEstimated wasm scan, fresh instance (the whole fixture discovered, as natively): {} = \
         {:.2}x native. Warm instance (the change followed): {} = {:.2}x.\n",
        human(cold_scan),
        ratio(cold_scan, std_m),
        human(warm_scan),
        ratio(warm_scan, std_m)
    );
    report
        .details
        .push((format!("Wasm vs native, {n} devices"), t));
    Ok(())
}

/// Runs `generic-native` over the fixture and returns its timed scans.
async fn native_scans(f: &Fixture, devices: &str, n: usize, runs: usize) -> Result<Vec<Duration>> {
    let bin = NATIVE
        .get()
        .cloned()
        .unwrap_or_else(fixtures::generic_native_bin);
    let out = tokio::process::Command::new(&bin)
        .arg("--dev-root")
        .arg(f.dev())
        .arg("--sys-root")
        .arg(f.sys())
        .args(["--devices", devices, "--runs", &runs.to_string()])
        .output()
        .await
        .with_context(|| {
            format!(
                "run {} (built by `make bench`: cargo build --release -p generic-native in guest-scanners)",
                bin.display()
            )
        })?;
    ensure!(
        out.status.success(),
        "generic-native failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut lines = text.lines();
    let found = lines.next().and_then(|l| l.strip_prefix("devices "));
    ensure!(
        found == Some(&n.to_string()),
        "generic-native found {found:?} devices, expected {n}"
    );
    lines
        .map(|l| Ok(Duration::from_nanos(l.trim().parse()?)))
        .collect()
}

/// When a guest last handed a tree to its sink: shared between the sink and the timing loop.
#[derive(Clone, Default)]
struct Handed(Arc<Mutex<Option<Instant>>>);

impl Handed {
    /// A tree (or changes) handed now.
    fn mark(&self) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// From `t0` to the tree handed since, which is then forgotten.
    fn since(&self, t0: Instant) -> Result<Duration> {
        let at = self.0.lock().unwrap_or_else(PoisonError::into_inner).take();
        at.map(|at| at.saturating_duration_since(t0))
            .context("a tree arrived that the sink did not see handed")
    }
}

/// A sink that notes when the guest hands it a tree or changes (lifted, before the host's own
/// work on them), then passes them on.
struct Timed {
    inner: Box<dyn TreeSink>,
    handed: Handed,
}

impl TreeSink for Timed {
    fn notify(
        &mut self,
        tree: types::DeviceTree,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> Pin<Box<dyn Future<Output = Result<(), SinkClosed>> + Send + '_>> {
        self.handed.mark();
        self.inner.notify(tree, attributes, bytes)
    }

    fn changes(
        &mut self,
        changes: Vec<types::GroupChanges>,
        attributes: Vec<types::DeviceAttributes>,
        bytes: usize,
    ) -> Pin<Box<dyn Future<Output = Result<bool, SinkClosed>> + Send + '_>> {
        self.handed.mark();
        self.inner.changes(changes, attributes, bytes)
    }
}
