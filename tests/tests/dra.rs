//! `frontend: dra`: the real `wdp run` serving a bundled scanner (kvm, over a fixture /dev)
//! through kubelet's DRA API, against the test API server (`wdp_dra::apiserver::standin`) and
//! the DRA kubelet stand-in (`wdp_dra::kubelet`), beside a scanner of the same config still
//! served through the device-plugin API to the device-plugin kubelet stand-in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerExtendedResourceRequest, Pod, PodExtendedResourceClaimStatus, PodSpec,
    PodStatus, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimConsumerReference,
    ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use wdp_dra::apiserver::standin::{ApiServerStandIn, allocated_claim, validate};
use wdp_dra::kubelet::{KubeletStandIn, Options as KubeletOptions, PodError};
use wdp_dra::plugin::ClaimRef;
use wdp_dra::proto::dra_v1;
use wdp_dra::proto::health_v1alpha1::HealthStatus;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{Host, Seen};
use wdp_tests::http::http_get;
use wdp_tests::write_renamed;
use wdp_tests::{eventually, eventually_showing, eventually_within, guest, resolve_cdi};

pub(crate) const DRIVER: &str = "devices.example.com";
pub(crate) const NODE: &str = "node-1";

/// kubelet's two directories for DRA drivers, in the fixture.
pub(crate) struct KubeletDirs {
    pub(crate) plugins: PathBuf,
    pub(crate) registry: PathBuf,
}

impl KubeletDirs {
    pub(crate) fn new(f: &Fixture) -> Self {
        let dirs = KubeletDirs {
            plugins: f.path().join("kubelet/plugins"),
            registry: f.path().join("kubelet/plugins_registry"),
        };
        std::fs::create_dir_all(&dirs.plugins).unwrap();
        std::fs::create_dir_all(&dirs.registry).unwrap();
        dirs
    }
}

/// `kvm` (two slots) through DRA with CDI specs in `<fixture>/cdi`, and `net`, the same guest
/// under another namespace, through the device-plugin API.
fn config(f: &Fixture, dirs: &KubeletDirs, api: &ApiServerStandIn) -> PathBuf {
    let net = format!(
        "  - name: net
    component: {guest}
    namespace: net.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
",
        guest = guest("kvm").display(),
    );
    kvm_config(f, dirs, api, "SLOTS: 2, RESCAN_INTERVAL_MS: 200", &net)
}

/// `kvm` with the environment `env` through DRA with CDI specs in `<fixture>/cdi`, the
/// scanners `more` after it, and the node's settings for kubelet's directories and the API
/// server stand-in.
pub(crate) fn kvm_config(
    f: &Fixture,
    dirs: &KubeletDirs,
    api: &ApiServerStandIn,
    env: &str,
    more: &str,
) -> PathBuf {
    f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {guest}
    namespace: {DRIVER}
    env: {{ {env} }}
    cdi: {{ dir: {cdi} }}
    frontend: dra
{more}node:
  name: {NODE}
  plugins-dir: {plugins}
  plugins-registry-dir: {registry}
  api-server: http://{addr}
",
        guest = guest("kvm").display(),
        cdi = f.path().join("cdi").display(),
        plugins = dirs.plugins.display(),
        registry = dirs.registry.display(),
        addr = api.addr(),
    ))
}

/// Waits until `kubelet` has no registration of the driver (its socket gone, seen by the
/// watcher).
pub(crate) async fn until_deregistered(kubelet: &KubeletStandIn) {
    eventually("kubelet's watcher deregistered the driver", || async {
        kubelet
            .registered(DRIVER, Duration::ZERO)
            .await
            .is_none()
            .then_some(())
    })
    .await;
}

/// A fixture with /dev/kvm, kubelet's directories in it, the API server stand-in and
/// [`config`]'s file.
pub(crate) async fn setup() -> (Fixture, KubeletDirs, ApiServerStandIn, PathBuf) {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let dirs = KubeletDirs::new(&f);
    let api = ApiServerStandIn::start()
        .await
        .expect("the API server stand-in");
    let config = config(&f, &dirs, &api);
    (f, dirs, api, config)
}

/// `wdp run` of `config` beside a DRA kubelet (started with `options`) and a device-plugin
/// kubelet, until the driver is registered and kvm-0 and kvm-1 are published.
pub(crate) async fn serve_registered(
    f: &Fixture,
    dirs: &KubeletDirs,
    api: &ApiServerStandIn,
    config: &Path,
    options: KubeletOptions,
) -> (KubeletStandIn, wdp_kubelet::standin::StandIn, Seen, Host) {
    let kubelet = KubeletStandIn::start_with(&dirs.registry, api, NODE, options);
    let (dp_kubelet, seen, host) = wdp_tests::host::serve(f, config, &f.plugin_dir());
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered");
    until_published(api, &["kvm-0", "kvm-1"]).await;
    (kubelet, dp_kubelet, seen, host)
}

/// The (pool, device) names of the driver's slices on the node, sorted; every slice valid by
/// the API server's rules.
fn published(api: &ApiServerStandIn) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for slice in api.slices() {
        assert_eq!(validate(&slice), Vec::<String>::new(), "{slice:?}");
        if slice.spec.driver != DRIVER || slice.spec.node_name.as_deref() != Some(NODE) {
            continue;
        }
        for d in slice.spec.devices.unwrap_or_default() {
            out.push((slice.spec.pool.name.clone(), d.name));
        }
    }
    out.sort();
    out
}

/// The string attribute `key` of device `device` in the driver's slices.
fn attribute(api: &ApiServerStandIn, device: &str, key: &str) -> Option<String> {
    api.slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .find(|d| d.name == device)?
        .attributes?
        .get(key)?
        .string
        .clone()
}

/// The UIDs of the driver's slices: a slice deleted and created again has a new one.
fn slice_uids(api: &ApiServerStandIn) -> Vec<String> {
    api.slices()
        .into_iter()
        .filter(|s| s.spec.driver == DRIVER)
        .filter_map(|s| s.metadata.uid)
        .collect()
}

pub(crate) async fn until_published(api: &ApiServerStandIn, devices: &[&str]) {
    let want: Vec<(String, String)> = devices
        .iter()
        .map(|d| (NODE.to_string(), d.to_string()))
        .collect();
    eventually(&format!("slices with {devices:?}"), || async {
        (published(api) == want).then_some(())
    })
    .await;
}

/// What the driver's checkpoint on disk holds: each prepared claim's UID and the
/// `<pool>/<device>` of its devices. No file: nothing prepared.
pub(crate) fn checkpointed(dirs: &KubeletDirs) -> BTreeMap<String, Vec<String>> {
    let path = dirs.plugins.join(DRIVER).join("checkpoint.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return BTreeMap::new();
    };
    let file: serde_json::Value = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
    let claims = file["claims"].as_object().cloned().unwrap_or_default();
    claims
        .into_iter()
        .map(|(uid, claim)| {
            let devices = claim["devices"].as_array().cloned().unwrap_or_default();
            let names = devices
                .iter()
                .map(|d| {
                    format!(
                        "{}/{}",
                        d["pool"].as_str().unwrap_or("?"),
                        d["device"].as_str().unwrap_or("?")
                    )
                })
                .collect();
            (uid, names)
        })
        .collect()
}

/// Every device the checkpoint `held` gives to more than one claim.
pub(crate) fn in_two_claims(held: &BTreeMap<String, Vec<String>>) -> Vec<String> {
    let mut seen = std::collections::BTreeSet::new();
    held.values()
        .flatten()
        .filter(|d| !seen.insert(d.as_str()))
        .cloned()
        .collect()
}

/// The CDI spec files of `dir`, each file's name and contents.
pub(crate) fn cdi_specs(dir: &Path) -> BTreeMap<String, String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            (e.file_name().to_string_lossy().into_owned(), text)
        })
        .collect()
}

/// A claim as the scheduler leaves it: `request` allocated `device` of this driver's pool.
pub(crate) fn allocated(name: &str, request: &str, device: &str) -> ResourceClaim {
    allocated_claim("default", name, DRIVER, NODE, &[(request, device)])
}

pub(crate) fn claim_ref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: claim.metadata.namespace.clone().unwrap_or_default(),
        uid: claim.metadata.uid.clone().unwrap_or_default(),
        name: claim.metadata.name.clone().unwrap_or_default(),
    }
}

/// The whole life of a DRA scanner: registered through the plugin watcher, its devices
/// published as valid slices, a claim prepared with the CDI ids Allocate gives the same device
/// (the spec on disk resolves them), the same answer twice and across a wdp restart, an unknown
/// claim unprepared, a hot-plugged device published, slices back after a kubelet restart wiped
/// them, sockets gone and CDI specs and checkpoint kept at SIGTERM; the device-plugin scanner of
/// the same config served as before throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dra_scanner_is_published_prepared_and_survives_restarts() {
    let (f, dirs, api, config) = setup().await;
    f.char_dev("net/tun", 10, 200);
    // /dev/kvm's sysfs device sits below a PCI function: its placement reaches the slices.
    let function = f.pci_device("0000:00:1f.0", &[]);
    f.sys_dir(&format!("{function}/misc/kvm"));
    f.sys_dir("dev/char");
    f.sys_link("dev/char/10:232", &format!("../../{function}/misc/kvm"));
    let plugins = f.plugin_dir();
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    let started = Instant::now();
    let (dp_kubelet, mut seen, host) = wdp_tests::host::serve(&f, &config, &plugins);

    let registered = kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("the driver registers through the plugin watcher");
    assert_eq!(registered.version, "v1.DRAPlugin", "the newest service");
    assert_eq!(
        registered.endpoint,
        dirs.plugins.join(DRIVER).join("dra.sock")
    );
    assert!(dirs.registry.join(format!("{DRIVER}-reg.sock")).exists());
    until_published(&api, &["kvm-0", "kvm-1", "tun-0", "tun-1"]).await;
    let published_after = started.elapsed();
    let pci = |device: &str| {
        (
            attribute(&api, device, "resource.kubernetes.io/pciBusID"),
            attribute(&api, device, "resource.kubernetes.io/pcieRoot"),
        )
    };
    assert_eq!(
        pci("kvm-1"),
        (Some("0000:00:1f.0".into()), Some("pci0000:00".into()))
    );
    assert_eq!(pci("tun-0"), (None, None), "no sysfs device: no placement");
    assert_eq!(
        attribute(&api, "kvm-1", "id").as_deref(),
        Some("kvm-1"),
        "the raw id"
    );

    // The device-plugin scanner: its resources on kubelet's device-plugin socket, none of the
    // DRA scanner's there.
    seen.devices("net.example.com/kvm", &["kvm-0"]).await;
    seen.devices("net.example.com/tun", &["tun-0"]).await;
    assert!(!seen.listed(&format!("{DRIVER}/kvm")));
    let admitted = dp_kubelet
        .admit("pod-dp", "app", "net.example.com/tun", 1)
        .await
        .expect("Allocate through the device-plugin front-end");
    assert_eq!(admitted.devices[0].host_path, "/dev/net/tun");

    // A claim allocated kvm-1: prepared with the CDI name Allocate would give kvm-1.
    let claim = api.insert_claim(allocated("vm", "kvm", "kvm-1"));
    let want = vec![dra_v1::Device {
        request_names: vec!["kvm".into()],
        pool_name: NODE.into(),
        device_name: "kvm-1".into(),
        cdi_device_ids: vec![format!("{DRIVER}/kvm=kvm-1")],
    }];
    let first = Instant::now();
    let answer = kubelet.prepare(DRIVER, &[claim_ref(&claim)]).await.unwrap();
    let first = first.elapsed();
    let entry = &answer[claim.metadata.uid.as_deref().unwrap()];
    assert_eq!((entry.error.as_str(), &entry.devices), ("", &want));
    let edits = resolve_cdi(&f.path().join("cdi"), &want[0].cdi_device_ids[0])
        .expect("the runtime resolves the CDI id");
    assert_eq!(edits["deviceNodes"][0]["path"], "/dev/kvm");
    let repeated = Instant::now();
    let again = kubelet.prepare(DRIVER, &[claim_ref(&claim)]).await.unwrap();
    let repeated = repeated.elapsed();
    assert_eq!(again, answer, "prepared twice, one answer");
    // Informative, printed with --nocapture: the first call includes the stand-in's connecting
    // (it keeps one connection per driver after, as kubelet does).
    eprintln!(
        "wdp run start to slices published: {published_after:?}; Prepare: {first:?} first, {repeated:?} repeated (checkpointed)"
    );

    // A claim nobody prepared (deleted before kubelet unprepared it): success.
    let unknown = ClaimRef {
        namespace: "default".into(),
        uid: "no-such-uid".into(),
        name: "gone".into(),
    };
    let out = kubelet.unprepare(DRIVER, &[unknown]).await.unwrap();
    assert_eq!(out["no-such-uid"], "");

    // Hot-plug: /dev/fuse appears, its slots reach the slices and the health stream.
    let mut health = kubelet.health(DRIVER).await.expect("the health stream");
    f.char_dev("fuse", 10, 229);
    until_published(
        &api,
        &["fuse-0", "fuse-1", "kvm-0", "kvm-1", "tun-0", "tun-1"],
    )
    .await;
    let healthy = HealthStatus::Healthy as i32;
    loop {
        let message = tokio::time::timeout(Duration::from_secs(20), health.message())
            .await
            .expect("a health message within 20 s")
            .expect("the health stream")
            .expect("the stream stays open");
        let mut listed: Vec<(String, i32)> = message
            .devices
            .iter()
            .filter_map(|d| Some((d.device.as_ref()?.device_name.clone(), d.health)))
            .collect();
        listed.sort();
        if listed.iter().any(|(name, _)| name == "fuse-0") {
            let names: Vec<&str> = listed.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                ["fuse-0", "fuse-1", "kvm-0", "kvm-1", "tun-0", "tun-1"]
            );
            assert!(listed.iter().all(|(_, h)| *h == healthy), "{listed:?}");
            break;
        }
    }
    drop(health);

    // wdp restarts: sockets removed at SIGTERM, specs and checkpoint kept; the same answer.
    assert!(host.terminate().await.success());
    let dra_socket = dirs.plugins.join(DRIVER).join("dra.sock");
    let reg_socket = dirs.registry.join(format!("{DRIVER}-reg.sock"));
    assert!(!dra_socket.exists() && !reg_socket.exists());
    assert!(dirs.plugins.join(DRIVER).join("checkpoint.json").exists());
    assert!(resolve_cdi(&f.path().join("cdi"), &want[0].cdi_device_ids[0]).is_some());
    let host = Host::start(&config, &plugins, &f);
    eventually("the driver registered again", || async {
        (kubelet.registrations(DRIVER) >= 2).then_some(())
    })
    .await;
    let after = kubelet.prepare(DRIVER, &[claim_ref(&claim)]).await.unwrap();
    assert_eq!(after, answer, "prepared across a wdp restart, one answer");

    // kubelet restarts: it wipes the node's slices, and the driver's registration brings them
    // back.
    kubelet.stop();
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered with the new kubelet");
    until_published(
        &api,
        &["fuse-0", "fuse-1", "kvm-0", "kvm-1", "tun-0", "tun-1"],
    )
    .await;

    let out = kubelet
        .unprepare(DRIVER, &[claim_ref(&claim)])
        .await
        .unwrap();
    assert_eq!(out[claim.metadata.uid.as_deref().unwrap()], "");
    assert!(host.terminate().await.success());
    drop(seen);
    dp_kubelet.stop().await;
}

/// kubelet refusing the driver's registration keeps the host not ready, with kubelet's reason,
/// and nothing is published (kubelet would neither prepare the devices nor delete the slices);
/// a kubelet that registers the driver gets its slices, and one that refuses it after has them
/// withdrawn (its start-up wipe is not repaired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_registration_is_on_readyz() {
    let (f, dirs, api, config) = setup().await;
    let refusing = || {
        KubeletStandIn::start_refusing(
            &dirs.registry,
            &api,
            NODE,
            Some("driver name already registered".into()),
        )
    };
    let kubelet = refusing();
    let refused = "scanner kvm: DRA driver devices.example.com: kubelet refused the registration: driver name already registered";
    let (host, dp_kubelet) = not_ready_for(&f, &config, refused).await;
    assert!(kubelet.registrations(DRIVER) >= 1);
    assert_eq!(
        published(&api),
        Vec::<(String, String)>::new(),
        "nothing published for a refused driver"
    );
    assert!(
        host.log().contains("kubelet refused the DRA driver"),
        "{}",
        host.log()
    );

    // A kubelet that registers it: published.
    kubelet.stop();
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered");
    until_published(&api, &["kvm-0", "kvm-1"]).await;

    // Refused again (a new kubelet): withdrawn, and not published again.
    kubelet.stop();
    let _kubelet = refusing();
    // One withdrawal per refusal: the first kubelet's, then this one's.
    host.logged("ResourceSlices withdrawn", 2).await;
    // The absence of a republish, which a running publisher does within milliseconds of the
    // start-up wipe's watch event: looked at for two seconds.
    for _ in 0..40 {
        assert_eq!(
            published(&api),
            Vec::<(String, String)>::new(),
            "a refused driver's slices published again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// A driver kubelet never calls (no kubelet, or one not watching this registry directory) is
/// loud: after the bound, a warning naming the registration socket and what to check, the reason
/// on /readyz, the registration metric at 0; nothing is published before kubelet registers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_kubelet_never_calls_is_warned_about_and_publishes_nothing() {
    let (f, dirs, api, config) = setup().await;
    let plugins = f.plugin_dir();
    let (dp_kubelet, observed) =
        wdp_kubelet::standin::StandIn::start(&plugins).expect("the device-plugin stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = Host::start_with_metrics(&config, &plugins, &f).await;
    seen.devices("net.example.com/kvm", &["kvm-0"]).await;
    let socket = dirs.registry.join(format!("{DRIVER}-reg.sock"));
    let reason = format!(
        "scanner kvm: DRA driver {DRIVER}: kubelet has not called GetInfo on {} within 10s",
        socket.display()
    );
    eventually_within(
        Duration::from_secs(60),
        &format!("/readyz with {reason:?}"),
        || async {
            let (code, body) = http_get(&addr, "/readyz").await.ok()?;
            (code == 503 && body.contains(&reason)).then_some(())
        },
    )
    .await;
    let log = host.log();
    assert!(
        log.contains("kubelet has not called GetInfo on the DRA registration socket")
            && log.contains(&socket.display().to_string()),
        "{log}"
    );
    let registered = format!("wdp_dra_driver_registered{{scanner=\"kvm\",driver=\"{DRIVER}\"}}");
    let (_, metrics) = http_get(&addr, "/metrics").await.unwrap();
    assert!(metrics.contains(&format!("{registered} 0\n")), "{metrics}");
    assert_eq!(
        published(&api),
        Vec::<(String, String)>::new(),
        "nothing published before a registration"
    );

    // kubelet comes: registered, published, ready.
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered");
    until_published(&api, &["kvm-0", "kvm-1"]).await;
    eventually("ready", || async {
        let (code, _) = http_get(&addr, "/readyz").await.ok()?;
        (code == 200).then_some(())
    })
    .await;
    let (_, metrics) = http_get(&addr, "/metrics").await.unwrap();
    assert!(metrics.contains(&format!("{registered} 1\n")), "{metrics}");
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// `wdp run` of `config`, until its device-plugin scanner serves and `/readyz` answers 503 with
/// `reason` as the one line besides its heading (the device-plugin scanner ready meanwhile).
async fn not_ready_for(
    f: &Fixture,
    config: &Path,
    reason: &str,
) -> (Host, wdp_kubelet::standin::StandIn) {
    let plugins = f.plugin_dir();
    let (dp_kubelet, observed) =
        wdp_kubelet::standin::StandIn::start(&plugins).expect("the device-plugin stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = Host::start_with_metrics(config, &plugins, f).await;
    seen.devices("net.example.com/kvm", &["kvm-0"]).await;
    let body = eventually_showing(&format!("/readyz with {reason:?}"), || async {
        let (code, body) = http_get(&addr, "/readyz")
            .await
            .map_err(|e| e.to_string())?;
        assert_eq!(code, 503, "ready though it should not be: {body}");
        // The device-plugin scanner's resource registers meanwhile: then only the driver is
        // left.
        if body.contains(reason) && !body.contains("net.example.com") {
            Ok(body)
        } else {
            Err(format!("/readyz said:\n{body}"))
        }
    })
    .await;
    assert_eq!(body.lines().count(), 2, "{body}");
    (host, dp_kubelet)
}

/// Hot reload adds and removes DRA scanners: removed, its sockets go (and kubelet's watcher
/// deregisters it) while the device-plugin scanner stays; added back, it registers and publishes
/// again; a reload breaking a DRA rule (no CDI) is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_adds_and_removes_dra_scanners() {
    let (f, dirs, api, config) = setup().await;
    let full = std::fs::read_to_string(&config).unwrap();
    let (kubelet, dp_kubelet, mut seen, host) =
        serve_registered(&f, &dirs, &api, &config, KubeletOptions::default()).await;
    seen.devices("net.example.com/kvm", &["kvm-0"]).await;
    let reg_socket = dirs.registry.join(format!("{DRIVER}-reg.sock"));

    // Without its cdi: refused, the driver stays.
    write_renamed(
        &config,
        &full.replacen(
            &format!("    cdi: {{ dir: {} }}\n", f.path().join("cdi").display()),
            "",
            1,
        ),
    );
    let log = host.logged("config reload refused", 1).await;
    assert!(
        log.contains("scanners[0].cdi: is required with frontend: dra"),
        "{log}"
    );
    assert!(reg_socket.exists());

    // The DRA scanner removed: its sockets go, the other scanner is untouched.
    let (_, net) = full.split_once("  - name: net").unwrap();
    write_renamed(&config, &format!("scanners:\n  - name: net{net}"));
    host.logged("removed [kvm]", 1).await;
    eventually("the DRA sockets removed", || async {
        (!reg_socket.exists() && !dirs.plugins.join(DRIVER).join("dra.sock").exists()).then_some(())
    })
    .await;
    assert_eq!(
        seen.registrations("net.example.com/kvm"),
        1,
        "not restarted"
    );
    until_deregistered(&kubelet).await;

    // Added back: registered again, slices published.
    write_renamed(&config, &full);
    eventually("registered again", || async {
        (kubelet.registrations(DRIVER) >= 2).then_some(())
    })
    .await;
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered again");
    until_published(&api, &["kvm-0", "kvm-1"]).await;
    assert_eq!(
        seen.registrations("net.example.com/kvm"),
        1,
        "not restarted"
    );
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// A DRA driver that cannot start (in-cluster API server configuration, outside a cluster)
/// serves nothing and keeps the host not ready with why; the device-plugin scanner is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_without_its_api_server_is_on_readyz() {
    let (f, dirs, api, config) = setup().await;
    let text = std::fs::read_to_string(&config).unwrap();
    let in_cluster = text.replace(&format!("http://{}", api.addr()), "in-cluster");
    assert_ne!(in_cluster, text);
    std::fs::write(&config, in_cluster).unwrap();
    let (host, dp_kubelet) = not_ready_for(
        &f,
        &config,
        "scanner kvm: DRA driver devices.example.com: the API server",
    )
    .await;
    assert!(!dirs.registry.join(format!("{DRIVER}-reg.sock")).exists());
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// The pod kubelet admits in the extended-resource path: containers `a` and `b` each with
/// `resources.limits: devices.example.com/kvm: 1`, and the status the scheduler leaves: its claim
/// `claim` and which request serves which container.
fn extended_resource_pod(uid: &str, claim: &str) -> Pod {
    let container = |name: &str| Container {
        name: name.into(),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([(
                format!("{DRIVER}/kvm"),
                Quantity("1".into()),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mapping = |container: &str, request: &str| ContainerExtendedResourceRequest {
        container_name: container.into(),
        resource_name: format!("{DRIVER}/kvm"),
        request_name: request.into(),
    };
    Pod {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            name: Some("vm-pair".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container("a"), container("b")],
            ..Default::default()
        }),
        status: Some(PodStatus {
            extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                resource_claim_name: claim.into(),
                request_mappings: vec![
                    mapping("a", "container-0-request-0"),
                    mapping("b", "container-1-request-0"),
                ],
            }),
            ..Default::default()
        }),
    }
}

/// The claim the scheduler makes for [`extended_resource_pod`]: one request per container
/// (named as the scheduler names them), `container-0-request-0` allocated kvm-0 and
/// `container-1-request-0` kvm-1, reserved for the pod with UID `reserved_for`.
fn scheduler_claim(name: &str, reserved_for: &str) -> ResourceClaim {
    let request = |name: &str| DeviceRequest {
        name: name.into(),
        exactly: Some(ExactDeviceRequest {
            device_class_name: "kvm.devices.wdp.dev".into(),
            count: Some(1),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut claim = allocated_claim(
        "default",
        name,
        DRIVER,
        NODE,
        &[
            ("container-0-request-0", "kvm-0"),
            ("container-1-request-0", "kvm-1"),
        ],
    );
    claim.metadata.annotations = Some(BTreeMap::from([(
        "resource.kubernetes.io/extended-resource-claim".into(),
        "true".into(),
    )]));
    claim.spec = Some(ResourceClaimSpec {
        devices: Some(DeviceClaim {
            requests: Some(vec![
                request("container-0-request-0"),
                request("container-1-request-0"),
            ]),
            ..Default::default()
        }),
    });
    if let Some(status) = claim.status.as_mut() {
        status.reserved_for = Some(vec![ResourceClaimConsumerReference {
            resource: "pods".into(),
            name: "vm-pair".into(),
            uid: reserved_for.into(),
            ..Default::default()
        }]);
    }
    claim
}

/// The extended-resource path end to end: a pod whose two containers each ask `limits: devices.example.com/kvm: 1`
/// on a node where the kvm scanner runs with `frontend: dra`, and the claim the scheduler made
/// for it; the DRA kubelet stand-in prepares it through wdp and each container gets the CDI ids
/// of its own request's device only. They, and the edits of the spec files they name, are what
/// the same scanner's Allocate gives for the same devices in device-plugin mode. A claim
/// reserved for another pod is refused; the pod's claim is unprepared when it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_asking_for_an_extended_resource_gets_each_container_its_own_devices() {
    let (f, dirs, api, config) = setup().await;
    let plugins = f.plugin_dir();
    let (kubelet, dp_kubelet, mut seen, host) =
        serve_registered(&f, &dirs, &api, &config, KubeletOptions::default()).await;

    // Reserved for another pod: kubelet refuses before calling the driver.
    api.insert_claim(scheduler_claim("vm-pair-other", "another-pod"));
    let refused = kubelet
        .prepare_pod(&extended_resource_pod("pod-uid-1", "vm-pair-other"))
        .await
        .expect_err("not reserved for this pod");
    assert!(matches!(refused, PodError::NotReserved { .. }), "{refused}");

    api.insert_claim(scheduler_claim(
        "vm-pair-extended-resources-x7k2p",
        "pod-uid-1",
    ));
    let pod = extended_resource_pod("pod-uid-1", "vm-pair-extended-resources-x7k2p");
    let got = kubelet
        .prepare_pod(&pod)
        .await
        .expect("the pod's claim prepared");
    let a = vec![format!("{DRIVER}/kvm=kvm-0")];
    let b = vec![format!("{DRIVER}/kvm=kvm-1")];
    assert_eq!(
        got,
        BTreeMap::from([("a".to_string(), a.clone()), ("b".to_string(), b.clone())]),
        "each container its own request's device"
    );
    let dra_edits: Vec<serde_json::Value> = [&a[0], &b[0]]
        .iter()
        .map(|id| resolve_cdi(&f.path().join("cdi"), id).expect("the runtime resolves it"))
        .collect();
    assert_eq!(dra_edits[0]["deviceNodes"][0]["path"], "/dev/kvm");
    assert_eq!(
        kubelet.prepare_pod(&pod).await.expect("admitted again"),
        got,
        "one answer"
    );
    kubelet.unprepare_pod(&pod).await.expect("unprepared");
    assert!(
        !std::fs::read_to_string(dirs.plugins.join(DRIVER).join("checkpoint.json"))
            .unwrap()
            .contains("x7k2p"),
        "the claim left the driver's checkpoint"
    );
    assert!(host.terminate().await.success());

    // The same scanner in device-plugin mode: Allocate of the same devices, one container each.
    let dp_config = f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {guest}
    namespace: {DRIVER}
    env: {{ SLOTS: 2, RESCAN_INTERVAL_MS: 600000 }}
    cdi: {{ dir: {cdi} }}
",
        guest = guest("kvm").display(),
        cdi = f.path().join("cdi-dp").display(),
    ));
    let host = Host::start(&dp_config, &plugins, &f);
    seen.devices(&format!("{DRIVER}/kvm"), &["kvm-0", "kvm-1"])
        .await;
    for (device, ids, edits) in [("kvm-0", &a, &dra_edits[0]), ("kvm-1", &b, &dra_edits[1])] {
        let answer = dp_kubelet
            .allocate(&format!("{DRIVER}/kvm"), &[device])
            .await
            .expect("Allocate in device-plugin mode");
        let names: Vec<String> = answer.container_responses[0]
            .cdi_devices
            .iter()
            .map(|d| d.name.clone())
            .collect();
        assert_eq!(&names, ids, "{device}: the CDI ids Allocate gives");
        assert_eq!(
            resolve_cdi(&f.path().join("cdi-dp"), &names[0]).as_ref(),
            Some(edits),
            "{device}: the same edits"
        );
    }
    assert!(host.terminate().await.success());
    drop(seen);
    dp_kubelet.stop().await;
}

/// kubelet's two wipes of slices and a watch event lost on the way: the driver gone longer than
/// kubelet's wiping delay (shortened here) loses its slices, and the next wdp publishes them
/// again; a kubelet starting deletes every slice of its node, and they come back; at rest wdp
/// makes no request but its watch (resumed after each timeout, never a list), and slices deleted
/// while the watch heard nothing of it come back when the watch resumes and the API server
/// replays what it missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_come_back_after_kubelet_wipes_them_and_after_a_lost_watch_event() {
    let (f, dirs, api, config) = setup().await;
    let plugins = f.plugin_dir();
    let options = KubeletOptions {
        wiping_delay: Duration::from_millis(300),
        ..KubeletOptions::default()
    };
    let (kubelet, dp_kubelet, seen, host) =
        serve_registered(&f, &dirs, &api, &config, options.clone()).await;

    // wdp stops: its sockets go, kubelet deregisters the driver and wipes its slices.
    assert!(host.terminate().await.success());
    until_published(&api, &[]).await;
    let host = Host::start(&config, &plugins, &f);
    until_published(&api, &["kvm-0", "kvm-1"]).await;
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered again");

    // kubelet starts again: every slice of its node deleted, and published again.
    kubelet.stop();
    let before = slice_uids(&api);
    let kubelet = KubeletStandIn::start_with(&dirs.registry, &api, NODE, options);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered with the new kubelet");
    until_published(&api, &["kvm-0", "kvm-1"]).await;
    let after = slice_uids(&api);
    assert!(
        before.iter().all(|uid| !after.contains(uid)),
        "deleted and created again: {before:?} then {after:?}"
    );

    // At rest, over several watch timeouts (the API server ends the watch, wdp resumes it):
    // no list and no write, only the open watch.
    let (lists, writes) = (api.lists(), api.writes());
    for _ in 0..3 {
        let watches = api.watches();
        api.end_watches();
        eventually_within(Duration::from_secs(15), "the watch resumed", || async {
            (api.watches() > watches).then_some(())
        })
        .await;
    }
    assert_eq!(
        (api.lists(), api.writes()),
        (lists, writes),
        "nothing but the watch at rest"
    );

    // The deletion's events lost on the way: nothing heard, nothing repaired...
    api.lose_watch_events(true);
    assert!(api.wipe_slices(Some(NODE), Some(DRIVER)) > 0);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        published(&api),
        Vec::<(String, String)>::new(),
        "nothing heard, nothing repaired yet"
    );
    // ...until the watch ends (its timeout) and is resumed from where it was: the API server
    // replays the changes since, and the slices come back without a list.
    api.lose_watch_events(false);
    api.end_watches();
    eventually_within(
        Duration::from_secs(30),
        "slices back through the resumed watch",
        || async { (published(&api).len() == 2).then_some(()) },
    )
    .await;
    assert_eq!(api.lists(), lists, "resumed, not listed again");
    assert!(host.terminate().await.success());
    drop(seen);
    dp_kubelet.stop().await;
}

/// Outside a pod: `api-server: kubeconfig:PATH` (relative to the config file) reaches an API
/// server over TLS, trusting the kubeconfig's CA and authenticated by its client certificate
/// (the stand-in wants a token it is never given, so only the certificate can authenticate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_a_client_certificate_reaches_a_tls_api_server() {
    use base64::Engine as _;
    use wdp_dra::apiserver::standin::Options as ApiOptions;
    const TESTDATA: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../crates/dra/src/apiserver/testdata"
    );
    let read = |name: &str| std::fs::read(Path::new(TESTDATA).join(name)).unwrap();
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);

    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let dirs = KubeletDirs::new(&f);
    let api = ApiServerStandIn::start_with(ApiOptions {
        tls: Some((read("cert.pem"), read("key.pem"))),
        token: Some("never-sent".into()),
        client_ca: Some(read("client-ca.pem")),
        ..ApiOptions::default()
    })
    .await
    .expect("the TLS API server stand-in");
    let config = config(&f, &dirs, &api);
    let text = std::fs::read_to_string(&config).unwrap();
    let with_kubeconfig = text.replace(
        &format!("api-server: http://{}", api.addr()),
        "api-server: kubeconfig:kube/config",
    );
    assert_ne!(with_kubeconfig, text);
    std::fs::create_dir_all(config.parent().unwrap().join("kube")).unwrap();
    std::fs::write(
        config.parent().unwrap().join("kube/config"),
        format!(
            "apiVersion: v1
kind: Config
current-context: node
clusters:
- name: test
  cluster:
    server: https://127.0.0.1:{port}
    certificate-authority-data: {ca}
users:
- name: node-1
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: node
  context: {{cluster: test, user: node-1}}
",
            port = api.addr().port(),
            ca = b64(&read("cert.pem")),
            cert = b64(&read("client-cert.pem")),
            key = b64(&read("client-key.pem")),
        ),
    )
    .unwrap();
    write_renamed(&config, &with_kubeconfig);

    let (kubelet, dp_kubelet, _seen, host) =
        serve_registered(&f, &dirs, &api, &config, KubeletOptions::default()).await;
    assert!(api.by_certificate() > 0);
    assert_eq!(api.unauthorized(), 0);

    assert!(host.terminate().await.success());
    kubelet.stop();
    dp_kubelet.stop().await;
}

/// A kubeconfig whose user runs a credential plugin: the driver does not start, and `/readyz`
/// names the file, the user, the field and what is supported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_with_an_exec_user_is_refused_on_readyz() {
    let (f, dirs, api, config) = setup().await;
    let kubeconfig = f.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "current-context: eks
clusters:
- name: prod
  cluster: {{server: 'https://{addr}', insecure-skip-tls-verify: true}}
users:
- name: admin
  user:
    exec: {{apiVersion: client.authentication.k8s.io/v1beta1, command: aws, args: [eks, get-token]}}
contexts:
- name: eks
  context: {{cluster: prod, user: admin}}
",
            addr = api.addr()
        ),
    )
    .unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let with_kubeconfig = text.replace(
        &format!("http://{}", api.addr()),
        &format!("kubeconfig:{}", kubeconfig.display()),
    );
    assert_ne!(with_kubeconfig, text);
    std::fs::write(&config, with_kubeconfig).unwrap();
    let (host, dp_kubelet) = not_ready_for(
        &f,
        &config,
        &format!(
            "scanner kvm: DRA driver devices.example.com: the API server: kubeconfig {}: user \"admin\" (context \"eks\"): exec: credential plugins are not run; supported: token, tokenFile, client-certificate(-data) with client-key(-data)",
            kubeconfig.display()
        ),
    )
    .await;
    assert!(!dirs.registry.join(format!("{DRIVER}-reg.sock")).exists());
    assert!(host.terminate().await.success());
    dp_kubelet.stop().await;
}

/// The driver's devices on the node in its slices, counted by their `type` attribute (the
/// dev-type).
fn published_types(api: &ApiServerStandIn) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for slice in api.slices() {
        if slice.spec.driver != DRIVER || slice.spec.node_name.as_deref() != Some(NODE) {
            continue;
        }
        for d in slice.spec.devices.unwrap_or_default() {
            let dev_type = d
                .attributes
                .as_ref()
                .and_then(|a| a.get("type")?.string.clone())
                .unwrap_or_default();
            *out.entry(dev_type).or_default() += 1;
        }
    }
    out
}

/// What `/status`, `wdp status` and `/metrics` say of the DRA scanner `kvm`'s resources, as
/// (dev-type, healthy, unhealthy, the driver's registration) each, or what disagrees.
async fn dra_resources_shown(addr: &str) -> Result<BTreeMap<String, (u64, u64)>, String> {
    let (_, body) = http_get(addr, "/status").await.map_err(|e| e.to_string())?;
    let status: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
    let kvm = status["scanners"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "kvm"))
        .ok_or_else(|| format!("no scanner kvm in {status}"))?;
    let mut shown = BTreeMap::new();
    for r in kvm["resources"].as_array().into_iter().flatten() {
        let name = r["name"].as_str().unwrap_or_default();
        let dev_type = name
            .strip_prefix(&format!("{DRIVER}/"))
            .ok_or_else(|| format!("{name} is not under {DRIVER}/"))?;
        if r["registered"] != true || r["dra_driver"] != DRIVER || !r["error"].is_null() {
            return Err(format!("{r}"));
        }
        let healthy = r["healthy"].as_u64().unwrap_or(u64::MAX);
        let unhealthy = r["unhealthy"].as_u64().unwrap_or(u64::MAX);
        shown.insert(dev_type.to_string(), (healthy, unhealthy));
    }

    // `wdp status`: one row per resource, the same counts, the driver named.
    let text = tokio::task::spawn_blocking({
        let addr = addr.to_string();
        move || wdp_tests::wdp(&["status", "--addr", &addr])
    })
    .await
    .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cells| cells.get(1) == Some(&"kvm") && cells[0].contains('/'))
        .collect();
    let mut printed = BTreeMap::new();
    for cells in rows {
        let want_tail = ["yes", "dra", &format!("({DRIVER})")];
        if cells.len() != 7 || [cells[2], cells[5], cells[6]] != want_tail {
            return Err(format!(
                "a resource row of `wdp status`: {cells:?} in\n{text}"
            ));
        }
        let dev_type = cells[0].trim_start_matches(&format!("{DRIVER}/"));
        let count = |c: &str| c.parse::<u64>().unwrap_or(u64::MAX);
        printed.insert(dev_type.to_string(), (count(cells[3]), count(cells[4])));
    }
    if printed != shown {
        return Err(format!(
            "`wdp status` printed\n{text}\nwhile /status has {shown:?}"
        ));
    }

    // `/metrics`: wdp_resource_devices as for a device-plugin resource, and nothing of
    // Allocate calls or kubelet streams, which DRA does not have per resource.
    let (_, metrics) = http_get(addr, "/metrics")
        .await
        .map_err(|e| e.to_string())?;
    let mut exported: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix(&format!("wdp_resource_devices{{resource=\"{DRIVER}/"))
        else {
            if line.contains(&format!("resource=\"{DRIVER}/")) {
                return Err(format!("a DRA dev-type in another family: {line}"));
            }
            continue;
        };
        let (dev_type, rest) = rest.split_once('"').unwrap_or_default();
        let value = rest
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| format!("no value in {line}"))?;
        let entry = exported.entry(dev_type.to_string()).or_default();
        if rest.contains("health=\"healthy\"") {
            entry.0 = value;
        } else {
            entry.1 = value;
        }
    }
    if exported != shown {
        return Err(format!(
            "/metrics has {exported:?} while /status has {shown:?}"
        ));
    }
    Ok(shown)
}

/// `/status`, `wdp status` and `wdp_resource_devices` show a DRA scanner's dev-types as they
/// show device-plugin resources (`<namespace>/<dev-type>`, healthy and unhealthy), with as many
/// devices as its ResourceSlices hold, registered while kubelet has the driver, and they follow a
/// hot-plug and an unplug.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_metrics_count_the_devices_the_slices_hold() {
    let (f, dirs, api, config) = setup().await;
    let plugins = f.plugin_dir();
    let (dp_kubelet, observed) =
        wdp_kubelet::standin::StandIn::start(&plugins).expect("the device-plugin stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = Host::start_with_metrics(&config, &plugins, &f).await;
    let kubelet = KubeletStandIn::start(&dirs.registry, &api, NODE);
    kubelet
        .registered(DRIVER, Duration::from_secs(20))
        .await
        .expect("registered");
    seen.devices("net.example.com/kvm", &["kvm-0"]).await;

    let agree = |devices: &'static [&'static str]| {
        let (api, addr) = (&api, &addr);
        async move {
            until_published(api, devices).await;
            let slices = published_types(api);
            let want: BTreeMap<String, (u64, u64)> = slices
                .iter()
                .map(|(t, n)| (t.clone(), (*n as u64, 0)))
                .collect();
            eventually_showing(
                &format!("/status, `wdp status` and /metrics showing {want:?}"),
                || async {
                    let shown = dra_resources_shown(addr).await?;
                    if shown == want {
                        Ok(())
                    } else {
                        Err(format!("{shown:?}"))
                    }
                },
            )
            .await;
            slices
        }
    };
    let first = agree(&["kvm-0", "kvm-1"]).await;
    assert_eq!(first, BTreeMap::from([("kvm".to_string(), 2)]));

    // Hot-plug: /dev/fuse appears, its dev-type joins with its slots.
    f.char_dev("fuse", 10, 229);
    agree(&["fuse-0", "fuse-1", "kvm-0", "kvm-1"]).await;
    // Unplug: /dev/kvm goes, and its dev-type with it.
    f.remove_dev("kvm");
    let last = agree(&["fuse-0", "fuse-1"]).await;
    assert_eq!(last, BTreeMap::from([("fuse".to_string(), 2)]));

    // The device-plugin scanner's resources are still shown as such.
    let (_, body) = http_get(&addr, "/status").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let net = status["scanners"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == "net"))
        .expect("scanner net");
    for r in net["resources"].as_array().expect("resources") {
        assert!(r.get("dra_driver").is_none(), "{r}");
    }
    assert!(host.terminate().await.success());
    drop(seen);
    dp_kubelet.stop().await;
}
