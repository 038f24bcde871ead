//! The host's Prometheus metrics: what an operator (and a test) reads to see how scanners,
//! guests and kubelet calls behave, without parsing logs.
//!
//! [`ScannerMetrics`] and [`ResourceMetrics`] are one scanner's and one resource's series. They
//! are plain values the code that sees an event updates directly (atomics, and the library's own
//! short lock for a histogram): nothing can block a guest or an Allocate. They belong to no
//! registry: a scanner's series live in its `Guest`, shared by its instances, its hooks, its
//! supervisor and its manager, from before it starts. What `/metrics` exports is whatever the
//! host is serving at the moment of the scrape ([`Live`], implemented by the shared status), so
//! a stopped scanner's series leave with it and a reload never orphans a series.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::TypedMetric;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};

/// Bucket bounds of a scan (wake-up to notify), in seconds: a Rust scanner over a handful of
/// devices takes about a millisecond, 1000 devices about 8 ms, 10000 devices hundreds of ms
/// (bench/RESULTS.md); a first scan includes instantiation.
const SCAN_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// Bucket bounds of an Allocate and of a hook call, in seconds: the host's own part of an
/// Allocate is ~60 µs without a hook (bench/RESULTS.md's 157 µs median includes the client's gRPC
/// round trip), ~330 µs with a Rust post-allocator (p99 under 1 ms); a hook's deadline is 5 s
/// by default.
const CALL_BUCKETS: [f64; 14] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0,
];

/// The guest hooks whose calls are timed.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Hook {
    /// `post-allocate`.
    PostAllocate,
    /// `get-preferred-allocation`.
    GetPreferredAllocation,
    /// `pre-start-container`.
    PreStartContainer,
}

impl Hook {
    const ALL: [Hook; 3] = [
        Hook::PostAllocate,
        Hook::GetPreferredAllocation,
        Hook::PreStartContainer,
    ];

    /// The WIT function's name, as the `hook` label shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::PostAllocate => "post-allocate",
            Hook::GetPreferredAllocation => "get-preferred-allocation",
            Hook::PreStartContainer => "pre-start-container",
        }
    }
}

/// One scanner's series; shared by its instances, its supervisor, its manager and its hooks.
#[derive(Debug)]
pub struct ScannerMetrics {
    /// Trees that passed validation and the policy.
    pub trees_accepted: Counter,
    /// Trees refused as a whole.
    pub trees_refused: Counter,
    /// Notified trees replaced by a later one, and notified changes merged into pending ones,
    /// before they were validated: a burst of notifies reaches kubelet as its latest tree.
    pub notifies_coalesced: Counter,
    /// Times the guest failed and was (or would have been) restarted.
    pub failures: Counter,
    /// Unix seconds of the last accepted tree.
    last_scan: Gauge,
    /// Bytes of linear memory of the running scanner instance (hook instances are not counted).
    memory: Gauge,
    scan_duration: Histogram,
    /// One histogram per [`Hook`], in `Hook::ALL` order.
    hooks: [Histogram; 3],
    /// When the running instance last woke up and has not notified since.
    woke: Mutex<Option<Instant>>,
    /// The DRA driver the scanner is served as, and 1 while kubelet has it registered; None for
    /// a scanner served through device plugins.
    dra: Mutex<Option<(String, Gauge)>>,
}

impl Default for ScannerMetrics {
    fn default() -> Self {
        ScannerMetrics {
            trees_accepted: Counter::default(),
            trees_refused: Counter::default(),
            notifies_coalesced: Counter::default(),
            failures: Counter::default(),
            last_scan: Gauge::default(),
            memory: Gauge::default(),
            scan_duration: Histogram::new(SCAN_BUCKETS),
            hooks: Hook::ALL.map(|_| Histogram::new(CALL_BUCKETS)),
            woke: Mutex::new(None),
            dra: Mutex::new(None),
        }
    }
}

impl ScannerMetrics {
    /// Adds one to `counter`.
    pub fn bump(counter: &Counter) {
        counter.inc();
    }

    /// A counter's current value.
    pub fn get(counter: &Counter) -> u64 {
        counter.get()
    }

    /// The scanner's instance starts a scan: at instantiation, and whenever `wait-for-change`
    /// returns (a change, or the guest's own rescan interval).
    pub fn woke(&self) {
        *self.woke.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    }

    /// The scanner notified a tree: the scan that began at the last wake-up is over. Notifies
    /// without a wake-up in between (a guest that sleeps on its own) are not timed.
    pub fn notified(&self) {
        let woke = self.woke.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(woke) = woke {
            self.scan_duration.observe(woke.elapsed().as_secs_f64());
        }
    }

    /// A tree was accepted now.
    pub fn accepted_now(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or_default();
        self.last_scan.set(i64::try_from(now).unwrap_or(i64::MAX));
    }

    /// Unix seconds of the last accepted tree; 0 before the first.
    pub fn last_scan(&self) -> i64 {
        self.last_scan.get()
    }

    /// A new scanner instance starts with no memory.
    pub fn memory_reset(&self) {
        self.memory.set(0);
    }

    /// A linear memory of the scanner instance grew by `bytes` (or was created with that size).
    pub fn memory_grew(&self, bytes: usize) {
        self.memory.inc_by(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// Bytes of linear memory of the running scanner instance.
    pub fn memory(&self) -> i64 {
        self.memory.get()
    }

    /// The scanner is served as DRA driver `driver`, which kubelet has `registered` or not.
    pub fn dra_registered(&self, driver: &str, registered: bool) {
        let mut dra = self.dra.lock().unwrap_or_else(|p| p.into_inner());
        let (_, gauge) = dra.get_or_insert_with(|| (driver.to_owned(), Gauge::default()));
        gauge.set(i64::from(registered));
    }

    /// One call of `hook` took `elapsed`.
    pub fn hook_called(&self, hook: Hook, elapsed: Duration) {
        let index = Hook::ALL.iter().position(|h| *h == hook).unwrap_or(0);
        self.hooks[index].observe(elapsed.as_secs_f64());
    }
}

/// One resource's series.
#[derive(Debug, Clone)]
pub struct ResourceMetrics {
    allocations_ok: Counter,
    allocations_error: Counter,
    allocate_duration: Histogram,
    healthy: Gauge,
    unhealthy: Gauge,
    /// GetPreferredAllocation calls answered "no preference" because the hook failed.
    preferred_fallbacks: Counter,
    /// kubelet's ListAndWatch stream ended while both sides kept running: registered again.
    stream_losses: Counter,
    /// Registrations kubelet answered with an error (or not in time).
    registration_failures: Counter,
    /// Served through DRA: only the device counts apply (kubelet makes no Allocate calls and
    /// holds no stream or registration per resource; the driver's registration is
    /// `wdp_dra_driver_registered`).
    dra: bool,
}

impl Default for ResourceMetrics {
    fn default() -> Self {
        ResourceMetrics {
            allocations_ok: Counter::default(),
            allocations_error: Counter::default(),
            allocate_duration: Histogram::new(CALL_BUCKETS),
            healthy: Gauge::default(),
            unhealthy: Gauge::default(),
            preferred_fallbacks: Counter::default(),
            stream_losses: Counter::default(),
            registration_failures: Counter::default(),
            dra: false,
        }
    }
}

impl ResourceMetrics {
    /// The series of a dev-type served through DRA: its device counts alone, under the same
    /// family as a device-plugin resource's, so one dashboard or alert covers both front-ends.
    pub fn dra() -> Self {
        ResourceMetrics {
            dra: true,
            ..ResourceMetrics::default()
        }
    }

    /// One Allocate answered (`ok`) or failed, after `elapsed`.
    pub fn allocated(&self, elapsed: Duration, ok: bool) {
        if ok {
            self.allocations_ok.inc();
        } else {
            self.allocations_error.inc();
        }
        self.allocate_duration.observe(elapsed.as_secs_f64());
    }

    /// A GetPreferredAllocation answered "no preference": the hook failed, timed out or answered
    /// the wrong number of containers.
    pub fn preferred_fallback(&self) {
        self.preferred_fallbacks.inc();
    }

    /// kubelet's ListAndWatch stream ended while it kept running; the resource registers again.
    pub fn stream_lost(&self) {
        self.stream_losses.inc();
    }

    /// kubelet answered a registration of the resource with an error; it is retried.
    pub fn registration_failed(&self) {
        self.registration_failures.inc();
    }

    /// The resource now lists these many devices.
    pub fn devices(&self, healthy: usize, unhealthy: usize) {
        self.healthy.set(i64::try_from(healthy).unwrap_or(i64::MAX));
        self.unhealthy
            .set(i64::try_from(unhealthy).unwrap_or(i64::MAX));
    }
}

/// Receives every running scanner's name and series, and every served resource's.
pub type Visit<'a> = dyn FnMut(&[(&str, &ScannerMetrics)], &[(&str, &ResourceMetrics)]) + 'a;

/// What the host serves at the moment of a scrape.
pub trait Live: fmt::Debug + Send + Sync + 'static {
    /// Calls `f` with every running scanner's name and series, and every served resource's.
    fn with_series(&self, f: &mut Visit<'_>);
}

/// The files wdp keeps on disk, as the `kind` label of the disk-write series names them: an
/// operator alerts on a full or read-only disk by what it costs.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub enum DiskFile {
    /// A CDI spec (`cdi:` scanners).
    Cdi,
    /// A DRA driver's prepared-claims checkpoint.
    Checkpoint,
    /// An entry of the compiled-component cache.
    CompileCache,
}

impl DiskFile {
    const ALL: [DiskFile; 3] = [DiskFile::Cdi, DiskFile::Checkpoint, DiskFile::CompileCache];

    /// The `kind` label.
    pub fn as_str(self) -> &'static str {
        match self {
            DiskFile::Cdi => "cdi",
            DiskFile::Checkpoint => "checkpoint",
            DiskFile::CompileCache => "compile-cache",
        }
    }
}

/// The outcome label of a config reload.
const RELOAD_SUCCESS: [(&str, &str); 1] = [("result", "success")];
const RELOAD_FAILURE: [(&str, &str); 1] = [("result", "failure")];

/// The registry of one host: build info and config reloads, plus the live series of [`Live`].
pub struct Metrics {
    registry: Registry,
    reloads: Family<[(&'static str, &'static str); 1], Counter>,
    last_reload_ok: Gauge,
    writable_mounts: Family<[(&'static str, &'static str); 1], Gauge>,
    disk_failing: Family<[(&'static str, &'static str); 1], Gauge>,
    disk_failures: Family<[(&'static str, &'static str); 1], Counter>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// Every family under the `wdp_` prefix. Help texts are what `/metrics` shows and what
    /// the book's metrics reference (docs/src/reference/metrics.md) is checked against.
    pub fn new(live: impl Live) -> Self {
        let mut registry = Registry::with_prefix("wdp");
        // `register` ends a help text with a period; the live families below write their own.
        registry.register(
            "build",
            "The wdp version serving these metrics",
            Info::new([("version", env!("CARGO_PKG_VERSION"))]),
        );
        let reloads = Family::<[(&'static str, &'static str); 1], Counter>::default();
        // Both series exist from the start: a rate over a counter that appears late loses its
        // first increment.
        let _ = reloads.get_or_create(&RELOAD_SUCCESS);
        let _ = reloads.get_or_create(&RELOAD_FAILURE);
        registry.register(
            "config_reloads",
            "Config reloads (file change or SIGHUP), by result (success or failure)",
            reloads.clone(),
        );
        let last_reload_ok = Gauge::default();
        last_reload_ok.set(1);
        registry.register(
            "config_last_reload_success",
            "1 if the last config reload succeeded (or none was tried), 0 if it was refused",
            last_reload_ok.clone(),
        );
        let writable_mounts = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        let _ = writable_mounts.get_or_create(&[("root", "sys")]);
        let _ = writable_mounts.get_or_create(&[("root", "dev")]);
        registry.register(
            "host_writable_mounts",
            "Mounts at or under the sys or dev root (--sys-root, --dev-root) that are not read-only, as /proc/self/mountinfo showed them at start; 0 when the root is read-only all the way down",
            writable_mounts.clone(),
        );
        let disk_failing = Family::<[(&'static str, &'static str); 1], Gauge>::default();
        let disk_failures = Family::<[(&'static str, &'static str); 1], Counter>::default();
        for kind in DiskFile::ALL {
            let _ = disk_failing.get_or_create(&[("kind", kind.as_str())]);
            let _ = disk_failures.get_or_create(&[("kind", kind.as_str())]);
        }
        registry.register(
            "disk_write_failing",
            "1 while the last write of some file of this kind (cdi, checkpoint, compile-cache) failed (a full or read-only disk): the previous file stays, the write is retried, and /readyz names the file (the compile cache excepted: it only costs compile time)",
            disk_failing.clone(),
        );
        registry.register(
            "disk_write_failures",
            "Writes of a file of this kind (cdi, checkpoint, compile-cache) that failed, retries included",
            disk_failures.clone(),
        );
        registry.register_collector(Box::new(LiveCollector(live)));
        Metrics {
            registry,
            reloads,
            last_reload_ok,
            writable_mounts,
            disk_failing,
            disk_failures,
        }
    }

    /// A write of a `kind` file failed.
    pub fn disk_write_failed(&self, kind: DiskFile) {
        self.disk_failures
            .get_or_create(&[("kind", kind.as_str())])
            .inc();
    }

    /// Whether some `kind` file's last write failed.
    pub fn disk_failing(&self, kind: DiskFile, failing: bool) {
        self.disk_failing
            .get_or_create(&[("kind", kind.as_str())])
            .set(i64::from(failing));
    }

    /// `count` mounts at or under the root `root` (`sys` or `dev`) are writable.
    pub fn writable_mounts(&self, root: &'static str, count: usize) {
        self.writable_mounts
            .get_or_create(&[("root", root)])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A config reload was applied.
    pub fn reload_succeeded(&self) {
        self.reloads.get_or_create(&RELOAD_SUCCESS).inc();
        self.last_reload_ok.set(1);
    }

    /// A config reload was refused; the old config keeps running.
    pub fn reload_failed(&self) {
        self.reloads.get_or_create(&RELOAD_FAILURE).inc();
        self.last_reload_ok.set(0);
    }

    /// Everything, in the OpenMetrics text format (ending with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would be a bug in an encoder.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!(error = %e, "cannot encode the metrics");
        }
        out
    }
}

#[derive(Debug)]
struct LiveCollector<L>(L);

/// Writes one family: its description, then one sample set per labelled series.
fn family<'m, L: EncodeLabelSet, M: EncodeMetric + TypedMetric + 'm>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: impl IntoIterator<Item = (L, &'m M)>,
) -> fmt::Result {
    let mut family = encoder.encode_descriptor(name, help, unit, M::TYPE)?;
    for (labels, metric) in series {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

fn scanner_families(
    e: &mut DescriptorEncoder,
    scanners: &[(&str, &ScannerMetrics)],
) -> fmt::Result {
    let by = |f: fn(&ScannerMetrics) -> &Counter| {
        scanners
            .iter()
            .map(move |(name, m)| ([("scanner", *name)], f(m)))
    };
    family(
        e,
        "scanner_restarts",
        "Times the scanner's guest failed (trap, error, CPU or memory overrun) and was restarted.",
        None,
        by(|m| &m.failures),
    )?;
    family(
        e,
        "scanner_trees_accepted",
        "Device trees the scanner notified that passed validation and the policy.",
        None,
        by(|m| &m.trees_accepted),
    )?;
    family(
        e,
        "scanner_trees_refused",
        "Device trees the scanner notified that were refused as a whole (the last good tree stays served).",
        None,
        by(|m| &m.trees_refused),
    )?;
    family(
        e,
        "scanner_notifies_coalesced",
        "Notified trees replaced by a later one of the same burst, and notified changes merged into pending ones, before validation (a scanner's trees reach kubelet at most every 100 ms, the latest winning).",
        None,
        by(|m| &m.notifies_coalesced),
    )?;
    let gauges = |f: fn(&ScannerMetrics) -> &Gauge| {
        scanners
            .iter()
            .map(move |(name, m)| ([("scanner", *name)], f(m)))
    };
    family(
        e,
        "scanner_last_scan_timestamp",
        "Unix time of the scanner's last accepted tree.",
        Some(&Unit::Seconds),
        gauges(|m| &m.last_scan),
    )?;
    family(
        e,
        "scanner_guest_memory",
        "Linear memory of the scanner's running guest instance.",
        Some(&Unit::Bytes),
        gauges(|m| &m.memory),
    )?;
    family(
        e,
        "scanner_scan_duration",
        "Time from the scanner's wake-up (instance start, or the return of wait-for-change) to its next notify.",
        Some(&Unit::Seconds),
        scanners
            .iter()
            .map(|(name, m)| ([("scanner", *name)], &m.scan_duration)),
    )?;
    let dra: Vec<([(&str, String); 2], Gauge)> = scanners
        .iter()
        .filter_map(|(name, m)| {
            let dra = m.dra.lock().unwrap_or_else(|p| p.into_inner());
            let (driver, gauge) = dra.as_ref()?;
            Some((
                [("scanner", name.to_string()), ("driver", driver.clone())],
                gauge.clone(),
            ))
        })
        .collect();
    family(
        e,
        "dra_driver_registered",
        "1 while kubelet has the scanner's DRA driver registered, 0 while it has not called, not answered or refused the registration (/readyz says which).",
        None,
        dra.iter().map(|(labels, gauge)| (labels.clone(), gauge)),
    )?;
    family(
        e,
        "hook_call_duration",
        "Time of one guest hook call, instantiation included, by scanner and hook.",
        Some(&Unit::Seconds),
        scanners.iter().flat_map(|(name, m)| {
            Hook::ALL
                .iter()
                .zip(&m.hooks)
                .map(move |(hook, h)| ([("scanner", *name), ("hook", hook.as_str())], h))
        }),
    )
}

fn resource_families(
    e: &mut DescriptorEncoder,
    resources: &[(&str, &ResourceMetrics)],
) -> fmt::Result {
    family(
        e,
        "resource_devices",
        "Devices the resource lists to kubelet (device plugin) or publishes in ResourceSlices (DRA), by health.",
        None,
        resources.iter().flat_map(|(name, m)| {
            [
                ([("resource", *name), ("health", "healthy")], &m.healthy),
                ([("resource", *name), ("health", "unhealthy")], &m.unhealthy),
            ]
        }),
    )?;
    family(
        e,
        "resource_allocations",
        "Allocate calls kubelet made for the resource, by result (ok or error).",
        None,
        resources
            .iter()
            .filter(|(_, m)| !m.dra)
            .flat_map(|(name, m)| {
                [
                    ([("resource", *name), ("result", "ok")], &m.allocations_ok),
                    (
                        [("resource", *name), ("result", "error")],
                        &m.allocations_error,
                    ),
                ]
            }),
    )?;
    family(
        e,
        "resource_allocate_duration",
        "Time the host took to answer one Allocate, post-allocate hook included.",
        Some(&Unit::Seconds),
        resources
            .iter()
            .filter(|(_, m)| !m.dra)
            .map(|(name, m)| ([("resource", *name)], &m.allocate_duration)),
    )?;
    family(
        e,
        "resource_preferred_allocation_fallbacks",
        "GetPreferredAllocation calls answered with no preference because the hook failed, timed out or answered the wrong number of containers.",
        None,
        resources
            .iter()
            .filter(|(_, m)| !m.dra)
            .map(|(name, m)| ([("resource", *name)], &m.preferred_fallbacks)),
    )?;
    family(
        e,
        "resource_stream_losses",
        "kubelet's ListAndWatch stream for the resource ended while wdp and kubelet kept running; each one is followed by a new registration. A stream that ends because kubelet stopped is not counted.",
        None,
        resources
            .iter()
            .filter(|(_, m)| !m.dra)
            .map(|(name, m)| ([("resource", *name)], &m.stream_losses)),
    )?;
    family(
        e,
        "resource_registration_failures",
        "Registrations of the resource kubelet answered with an error or not in time; each is retried with a backoff, and the last reason is on /readyz.",
        None,
        resources
            .iter()
            .filter(|(_, m)| !m.dra)
            .map(|(name, m)| ([("resource", *name)], &m.registration_failures)),
    )
}

impl<L: Live> Collector for LiveCollector<L> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let mut result = Ok(());
        self.0.with_series(&mut |scanners, resources| {
            result = scanner_families(&mut encoder, scanners)
                .and_then(|()| resource_families(&mut encoder, resources));
        });
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[derive(Debug, Default)]
    struct Fixed {
        kvm: Arc<ScannerMetrics>,
        resource: ResourceMetrics,
        empty: bool,
    }

    impl Live for Arc<Mutex<Fixed>> {
        fn with_series(&self, f: &mut Visit<'_>) {
            let fixed = self.lock().unwrap();
            if fixed.empty {
                f(&[], &[]);
            } else {
                f(&[("kvm", &fixed.kvm)], &[("ns/kvm", &fixed.resource)]);
            }
        }
    }

    #[test]
    fn exports_what_is_live() {
        let live = Arc::new(Mutex::new(Fixed::default()));
        let metrics = Metrics::new(live.clone());
        {
            let fixed = live.lock().unwrap();
            ScannerMetrics::bump(&fixed.kvm.failures);
            fixed.kvm.woke();
            fixed.kvm.notified();
            fixed.kvm.notified(); // no wake-up in between: not timed
            fixed.resource.devices(2, 1);
            fixed.resource.allocated(Duration::from_micros(200), true);
            fixed.resource.preferred_fallback();
            fixed.resource.stream_lost();
        }
        metrics.reload_failed();
        let text = metrics.encode();
        for want in [
            "wdp_scanner_restarts_total{scanner=\"kvm\"} 1\n",
            "wdp_scanner_scan_duration_seconds_count{scanner=\"kvm\"} 1\n",
            "wdp_build_info{version=\"",
            "wdp_resource_devices{resource=\"ns/kvm\",health=\"unhealthy\"} 1\n",
            "wdp_resource_allocations_total{resource=\"ns/kvm\",result=\"ok\"} 1\n",
            "wdp_resource_allocate_duration_seconds_bucket{le=\"0.00025\",resource=\"ns/kvm\"} 1\n",
            "wdp_hook_call_duration_seconds_count{scanner=\"kvm\",hook=\"post-allocate\"} 0\n",
            "wdp_config_reloads_total{result=\"failure\"} 1\n",
            "wdp_resource_preferred_allocation_fallbacks_total{resource=\"ns/kvm\"} 1\n",
            "wdp_resource_stream_losses_total{resource=\"ns/kvm\"} 1\n",
            "wdp_config_last_reload_success 0\n",
            "# HELP wdp_scanner_scan_duration_seconds Time from",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        live.lock().unwrap().empty = true;
        let text = metrics.encode();
        assert!(!text.contains("kvm"), "{text}");
        // A family stays described with no series.
        assert!(
            text.contains("# TYPE wdp_scanner_restarts counter\n"),
            "{text}"
        );
    }
}
