//! Observability of a running `wdp run --metrics-addr`: `/metrics` moving with real events
//! (hot-plug, Allocate through the kubelet stand-in, hook calls, failing and refused guests),
//! `/healthz`, `/readyz` before and after registration and while kubelet is away, `/status` and
//! `wdp status`, and the book's metrics reference checked against what the host exports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{Host, Seen};
use wdp_tests::http::http_get;
use wdp_tests::write_renamed;
use wdp_tests::{eventually, guest};

/// `wdp run` over the fixture with its HTTP endpoint on a free port; returns the host and the
/// address it listens on (from its log).
async fn start(f: &Fixture, config: &Path, plugins: &Path) -> (Host, String) {
    let host = Host::start_with(config, plugins, f, &["--metrics-addr", "127.0.0.1:0"]);
    let addr = eventually("the metrics address in the host's log", || async {
        let log = strip_ansi(&host.log());
        let line = log.lines().find(|l| l.contains("serving /metrics"))?;
        let addr = line.split("addr=").nth(1)?.split_whitespace().next()?;
        Some(addr.to_string())
    })
    .await;
    (host, addr)
}

/// The log without terminal colour codes.
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) && c != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One GET; the status code and the body, failing the test when there is no answer.
async fn get(addr: &str, path: &str) -> (u16, String) {
    http_get(addr, path).await.unwrap_or_else(|e| panic!("{e}"))
}

async fn metrics(addr: &str) -> String {
    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200, "{body}");
    body
}

/// The value of the sample `series` (name and labels exactly as exported), if present.
fn value(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let rest = line.strip_prefix(series)?.strip_prefix(' ')?;
        rest.split_whitespace().next()?.parse().ok()
    })
}

/// Like [`value`], failing the test when the series is missing.
fn must(metrics: &str, series: &str) -> f64 {
    value(metrics, series).unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

/// `wdp` with `args`, off the async runtime.
async fn wdp(args: &[&str]) -> std::process::Output {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        wdp_tests::wdp(&args)
    })
    .await
    .unwrap()
}

const QAT_TREE: &str = r#"{"generic": {
    "0000:3d:01.0": {"nodes": ["/dev/vfio/10", "/dev/vfio/vfio"], "envs": {"QAT7": "0000:3d:01.0"}},
    "0000:3d:01.1": {"nodes": ["/dev/vfio/11", "/dev/vfio/vfio"], "envs": {"QAT9": "0000:3d:01.1"}},
    "0000:3d:01.2": {"health": "Unhealthy", "nodes": ["/dev/vfio/12"]}
}}"#;

/// kvm (two slots), a generic serial scanner, and a static QAT tree with a post-allocate hook.
fn three_scanners(f: &Fixture) -> PathBuf {
    f.char_dev("kvm", 10, 232)
        .char_dev("ttyUSB0", 188, 0)
        .char_dev("vfio/vfio", 10, 196)
        .char_dev("vfio/10", 243, 0)
        .char_dev("vfio/11", 243, 1)
        .char_dev("vfio/12", 243, 2);
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
  - name: qat
    component: {tree}
    post-allocator: {hooks}
    namespace: qat.example.com
    env: {{ HOOK_MODE: renumber, TREE: '{tree_json}' }}
",
        kvm = guest("kvm").display(),
        generic = guest("generic").display(),
        tree = guest("static_tree").display(),
        hooks = guest("test_hooks").display(),
        tree_json = QAT_TREE.replace('\n', " "),
    ))
}

const RESOURCES: [&str; 3] = [
    "devices.example.com/kvm",
    "serial.example.com/serial",
    "qat.example.com/generic",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_readiness_follow_real_events() {
    let f = Fixture::new();
    let config = three_scanners(&f);
    let plugins = f.plugin_dir();
    // No kubelet yet: everything is served, nothing can be registered.
    let (host, addr) = start(&f, &config, &plugins).await;

    assert_eq!(get(&addr, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(&addr, "/nothing-here").await.0, 404);
    let body = eventually("/readyz naming every unregistered resource", || async {
        let (code, body) = get(&addr, "/readyz").await;
        assert_eq!(code, 503, "ready without a kubelet: {body}");
        let all = RESOURCES
            .iter()
            .all(|r| body.contains(&format!("- resource {r}: not registered with kubelet\n")));
        all.then_some(body)
    })
    .await;
    assert!(body.starts_with("not ready:\n"), "{body}");
    let m = metrics(&addr).await;
    let devices = |r: &str, health: &str| {
        format!("wdp_resource_devices{{resource=\"{r}\",health=\"{health}\"}}")
    };
    assert_eq!(
        must(&m, &devices("serial.example.com/serial", "healthy")),
        1.0
    );
    assert_eq!(
        must(&m, &devices("devices.example.com/kvm", "healthy")),
        2.0
    );
    assert_eq!(
        must(&m, &devices("qat.example.com/generic", "healthy")),
        2.0
    );
    assert_eq!(
        must(&m, &devices("qat.example.com/generic", "unhealthy")),
        1.0
    );

    // kubelet arrives: every resource registers, the host becomes ready.
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    eventually("/readyz 200", || async {
        let (code, body) = get(&addr, "/readyz").await;
        (code == 200).then_some(()).or_else(|| {
            assert_eq!(code, 503, "{body}");
            None
        })
    })
    .await;
    assert_eq!(get(&addr, "/readyz").await.1, "ready\n");

    // Hot-plug: the gauge is set before the new list goes out to kubelet.
    f.char_dev("ttyUSB1", 188, 1);
    seen.devices("serial.example.com/serial", &["ttyUSB0", "ttyUSB1"])
        .await;
    let m = metrics(&addr).await;
    assert_eq!(
        must(&m, &devices("serial.example.com/serial", "healthy")),
        2.0
    );

    // Allocate through the stand-in: counted by result, timed, before kubelet has the answer.
    let allocations = |r: &str, result: &str| {
        format!("wdp_resource_allocations_total{{resource=\"{r}\",result=\"{result}\"}}")
    };
    let kvm = "devices.example.com/kvm";
    let before = metrics(&addr).await;
    assert_eq!(must(&before, &allocations(kvm, "ok")), 0.0);
    kubelet
        .allocate(kvm, &["kvm-1"])
        .await
        .expect("allocate kvm-1");
    kubelet
        .allocate(kvm, &["kvm-7"])
        .await
        .expect_err("kvm-7 does not exist");
    let m = metrics(&addr).await;
    assert_eq!(must(&m, &allocations(kvm, "ok")), 1.0);
    assert_eq!(must(&m, &allocations(kvm, "error")), 1.0);
    let count = format!("wdp_resource_allocate_duration_seconds_count{{resource=\"{kvm}\"}}");
    assert_eq!(must(&m, &count), 2.0);
    let inf =
        format!("wdp_resource_allocate_duration_seconds_bucket{{le=\"+Inf\",resource=\"{kvm}\"}}");
    assert_eq!(must(&m, &inf), 2.0);

    // A hooked Allocate times the post-allocate call under its scanner.
    let hook = "wdp_hook_call_duration_seconds_count{scanner=\"qat\",hook=\"post-allocate\"}";
    assert_eq!(must(&m, hook), 0.0);
    let r = kubelet
        .allocate("qat.example.com/generic", &["0000:3d:01.0"])
        .await
        .expect("hooked allocate");
    assert_eq!(r.container_responses[0].envs["QAT0"], "0000:3d:01.0");
    let m = metrics(&addr).await;
    assert_eq!(must(&m, hook), 1.0);
    assert_eq!(must(&m, &allocations("qat.example.com/generic", "ok")), 1.0);

    // Per scanner: trees, the last scan, the scan timing and the guest's memory.
    for scanner in ["kvm", "serial", "qat"] {
        let s = |name: &str| format!("wdp_scanner_{name}{{scanner=\"{scanner}\"}}");
        assert!(must(&m, &s("trees_accepted_total")) >= 1.0, "{scanner}");
        assert_eq!(must(&m, &s("trees_refused_total")), 0.0, "{scanner}");
        assert_eq!(must(&m, &s("restarts_total")), 0.0, "{scanner}");
        assert!(
            must(&m, &s("last_scan_timestamp_seconds")) > 1.7e9,
            "{scanner}"
        );
        assert!(
            must(&m, &s("scan_duration_seconds_count")) >= 1.0,
            "{scanner}"
        );
        // At least the guest's initial linear memory, at most its 64 MiB cap.
        let memory = must(&m, &s("guest_memory_bytes"));
        assert!(
            (65536.0..=64.0 * 1048576.0).contains(&memory),
            "{scanner}: {memory}"
        );
    }
    assert!(must(&m, "wdp_scanner_trees_accepted_total{scanner=\"serial\"}") >= 2.0);

    // `wdp status`: the tables name every resource; --json is the /status document.
    let out = wdp(&["status", "--addr", &addr]).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("wdp 0.1.0: ready\n"), "{text}");
    for r in RESOURCES {
        assert!(text.contains(r), "{r} not in:\n{text}");
    }
    let out = wdp(&["status", "--addr", &addr, "--json"]).await;
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json is JSON");
    assert_eq!(json["ready"], true, "{json}");
    let scanners = json["scanners"].as_array().expect("scanners");
    let names: Vec<&str> = scanners.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["kvm", "qat", "serial"]);
    for s in scanners {
        assert_eq!(s["state"], "serving", "{s}");
        for r in s["resources"].as_array().expect("resources") {
            assert_eq!(r["registered"], true, "{r}");
        }
    }
    let serial = &scanners[2]["resources"][0];
    assert_eq!(serial["name"], "serial.example.com/serial");
    assert_eq!(
        (serial["healthy"].as_u64(), serial["unhealthy"].as_u64()),
        (Some(2), Some(0))
    );
    let (code, body) = get(&addr, "/status").await;
    assert_eq!(code, 200);
    let served: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(served["scanners"][0]["name"], "kvm");

    // kubelet goes away: its registrations went with it, so the host is not ready...
    kubelet.stop().await;
    eventually("/readyz 503 while kubelet is away", || async {
        let (code, body) = get(&addr, "/readyz").await;
        let all = RESOURCES
            .iter()
            .all(|r| body.contains(&format!("- resource {r}: not registered with kubelet\n")));
        (code == 503 && all).then_some(())
    })
    .await;
    assert_eq!(get(&addr, "/healthz").await.0, 200, "alive all the same");
    // ...until the next kubelet accepts them again.
    let (kubelet, _observed) = StandIn::start(&plugins).expect("restart the kubelet stand-in");
    eventually("/readyz 200 after kubelet came back", || async {
        (get(&addr, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_refused_guests_are_counted_and_keep_the_host_not_ready() {
    let f = Fixture::new();
    let hostile = guest("hostile");
    let config = f.write_config(&format!(
        "scanners:
  - name: panicky
    component: {h}
    namespace: panicky.example.com
    env: {{ ATTACK: panic }}
  - name: refusing
    component: {h}
    namespace: refusing.example.com
    env: {{ ATTACK: bad-tree, BAD: node-outside-dev }}
",
        h = hostile.display()
    ));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = start(&f, &config, &plugins).await;
    seen.devices("refusing.example.com/good", &["g"]).await;

    // The panicking guest is restarted with backoff (1 s, then 2 s): each failure counts.
    let restarts = "wdp_scanner_restarts_total{scanner=\"panicky\"}";
    eventually("two restarts of the panicking guest", || async {
        (value(&metrics(&addr).await, restarts)? >= 2.0).then_some(())
    })
    .await;
    let m = metrics(&addr).await;
    assert_eq!(
        must(&m, "wdp_scanner_trees_accepted_total{scanner=\"panicky\"}"),
        0.0
    );
    assert_eq!(
        must(
            &m,
            "wdp_scanner_last_scan_timestamp_seconds{scanner=\"panicky\"}"
        ),
        0.0
    );
    // The refusing guest's good tree is served, its bad one counted and refused.
    let refused = "wdp_scanner_trees_refused_total{scanner=\"refusing\"}";
    eventually("the refused tree counted", || async {
        (value(&metrics(&addr).await, refused)? >= 1.0).then_some(())
    })
    .await;
    let m = metrics(&addr).await;
    assert_eq!(
        must(&m, "wdp_scanner_trees_accepted_total{scanner=\"refusing\"}"),
        1.0
    );
    assert_eq!(
        must(&m, "wdp_scanner_restarts_total{scanner=\"refusing\"}"),
        0.0
    );

    // Not ready: one scanner never had a tree. The other is ready (its good tree is served
    // and registered) even though its last tree was refused.
    let body = eventually("/readyz naming only the panicking scanner", || async {
        let (code, body) = get(&addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        (!body.contains("refusing")).then_some(body)
    })
    .await;
    assert!(
        body.contains("- scanner panicky: failed before its first tree: "),
        "{body}"
    );
    assert!(body.contains("panicked"), "the guest's own cause: {body}");

    let out = wdp(&["status", "--addr", &addr, "--json"]).await;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("--json is JSON");
    assert_eq!(json["ready"], false);
    let panicky = &json["scanners"][0];
    assert_eq!(panicky["name"], "panicky");
    assert_eq!(panicky["state"], "restarting");
    assert!(panicky["restarts"].as_u64() >= Some(2), "{panicky}");
    assert!(panicky["resources"].as_array().is_some_and(Vec::is_empty));
    let refusing = &json["scanners"][1];
    assert_eq!(refusing["state"], "refused");
    assert!(
        refusing["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("/dev")),
        "{refusing}"
    );
    assert_eq!(refusing["resources"][0]["registered"], true);
    let text = wdp(&["status", "--addr", &addr]).await;
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with("wdp 0.1.0: NOT READY\n  - scanner panicky"),
        "{text}"
    );
    assert!(text.contains("panicky: last error: "), "{text}");

    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

/// A port nothing listens on (just released by us).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[tokio::test]
async fn status_of_an_unreachable_host_fails_naming_the_address() {
    let addr = format!("127.0.0.1:{}", free_port());
    let out = wdp(&["status", "--addr", &addr]).await;
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot get the status of the wdp host at {addr}"))
            && err.contains(&format!("--metrics-addr {addr}")),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[tokio::test]
async fn a_metrics_address_in_use_is_fatal_and_named() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n",
        guest("kvm").display()
    ));
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let arg = |p: PathBuf| p.display().to_string();
    let out = wdp(&[
        "run",
        "--config",
        &arg(config),
        "--plugin-dir",
        &arg(f.plugin_dir()),
        "--compile-cache",
        &arg(f.path().join("compiled")),
        "--sys-root",
        &arg(f.sys()),
        "--dev-root",
        &arg(f.dev()),
        "--metrics-addr",
        &addr,
    ])
    .await;
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen on {addr} for /metrics")),
        "{err}"
    );
}

/// One metric family as exported: `(name as queried, type, label names, help)`.
type Family = (String, String, BTreeSet<String>, String);

/// The families of a scrape, by the name a query uses (counters with `_total`, infos with
/// `_info`), with the labels their samples carry (`le` aside).
fn families(scrape: &str) -> BTreeMap<String, Family> {
    let mut help = BTreeMap::new();
    let mut kind = BTreeMap::new();
    for line in scrape.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name.to_string(), text.to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, t) = rest.split_once(' ').unwrap_or((rest, ""));
            kind.insert(name.to_string(), t.to_string());
        }
    }
    let mut out = BTreeMap::new();
    for (family, t) in &kind {
        let queried = match t.as_str() {
            "counter" => format!("{family}_total"),
            "info" => format!("{family}_info"),
            _ => family.clone(),
        };
        let mut labels = BTreeSet::new();
        for line in scrape.lines().filter(|l| l.starts_with(family.as_str())) {
            let Some((_, rest)) = line.split_once('{') else {
                continue;
            };
            let Some((inside, _)) = rest.split_once('}') else {
                continue;
            };
            for pair in inside.split("\",") {
                if let Some((key, _)) = pair.split_once('=')
                    && key != "le"
                {
                    labels.insert(key.to_string());
                }
            }
        }
        let h = help.get(family).cloned().unwrap_or_default();
        out.insert(queried.clone(), (queried, t.clone(), labels, h));
    }
    out
}

/// The table the metrics reference should have between the markers, for a failure message.
fn table(families: &BTreeMap<String, Family>) -> String {
    let mut out = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for (name, t, labels, help) in families.values() {
        let labels: Vec<String> = labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{name}` | {t} | {} | {help} |\n",
            labels.join(", ")
        ));
    }
    out
}

/// The metrics reference's table, between `<!-- metrics:begin -->` and `<!-- metrics:end -->`.
fn documented_table() -> Result<BTreeMap<String, Family>, String> {
    let page = wdp_tests::book::read(METRICS_PAGE);
    let section = wdp_tests::book::marked(&page, "metrics").ok_or_else(|| {
        format!("{METRICS_PAGE} has no <!-- metrics:begin --> ... <!-- metrics:end --> section")
    })?;
    parse_table(section)
}

/// The book's page every metric is listed on.
const METRICS_PAGE: &str = "docs/src/reference/metrics.md";

/// The rows of a metrics table (as [`table`] writes it), by metric name.
fn parse_table(section: &str) -> Result<BTreeMap<String, Family>, String> {
    let mut rows = BTreeMap::new();
    for line in section
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("| `"))
    {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        let [name, t, labels, help] = cells[..] else {
            return Err(format!(
                "a row of {METRICS_PAGE}'s table has not 4 cells: {line}"
            ));
        };
        let name = name.trim_matches('`').to_string();
        let labels = labels
            .split(',')
            .map(|l| l.trim().trim_matches('`').to_string())
            .filter(|l| !l.is_empty())
            .collect();
        rows.insert(
            name.clone(),
            (name, t.to_string(), labels, help.to_string()),
        );
    }
    Ok(rows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_reference_matches_what_the_host_exports() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    // A scanner with a hook and a served resource, and one served through DRA: every family
    // then has a series.
    let api = wdp_dra::apiserver::standin::ApiServerStandIn::start()
        .await
        .expect("the API server stand-in");
    let config = f.write_config(&format!(
        "scanners:
  - name: kvm
    component: {kvm}
    post-allocator: {hooks}
    namespace: devices.example.com
    env: {{ HOOK_MODE: renumber }}
  - name: kvm-dra
    component: {kvm}
    namespace: dra.example.com
    cdi: {{ dir: {cdi} }}
    frontend: dra
node:
  name: node-1
  plugins-dir: {kubelet}/plugins
  plugins-registry-dir: {kubelet}/plugins_registry
  api-server: http://{addr}
",
        kvm = guest("kvm").display(),
        hooks = guest("test_hooks").display(),
        cdi = f.path().join("cdi").display(),
        kubelet = f.path().join("kubelet").display(),
        addr = api.addr(),
    ));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = start(&f, &config, &plugins).await;
    seen.all_listed(&["devices.example.com/kvm"]).await;
    let scrape = eventually("the DRA driver's series", || async {
        let scrape = metrics(&addr).await;
        scrape
            .contains("wdp_dra_driver_registered{")
            .then_some(scrape)
    })
    .await;
    let exported = families(&scrape);
    host.terminate().await;
    kubelet.stop().await;

    for (name, (_, t, labels, _)) in &exported {
        assert!(name.starts_with("wdp_"), "{name}");
        assert!(
            !labels.is_empty() || t == "gauge",
            "{name} has no series: {exported:?}"
        );
    }
    // What the failure message offers is what the check accepts.
    assert_eq!(parse_table(&table(&exported)).as_ref(), Ok(&exported));
    let documented = documented_table().unwrap_or_else(|e| {
        panic!(
            "{e}; the table, from this scrape:\n<!-- metrics:begin -->\n{}<!-- metrics:end -->",
            table(&exported)
        )
    });
    assert!(
        documented == exported,
        "{METRICS_PAGE}'s table differs from what the host exports; it should read:\n{}",
        table(&exported)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_takes_a_removed_scanner_out_and_counts_refusals() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232).char_dev("ttyUSB0", 188, 0);
    let kvm = format!(
        "  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
        guest("kvm").display()
    );
    let serial = format!(
        "  - name: serial\n    component: {}\n    namespace: serial.example.com\n    env:\n      RESCAN_INTERVAL_MS: 600000\n      DEVICES: '{}'\n",
        guest("generic").display(),
        r#"[{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}]"#
    );
    let config = f.write_config(&format!("scanners:\n{kvm}{serial}"));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = start(&f, &config, &plugins).await;
    seen.all_listed(&["devices.example.com/kvm", "serial.example.com/serial"])
        .await;
    let m = metrics(&addr).await;
    assert_eq!(
        must(&m, "wdp_config_reloads_total{result=\"success\"}"),
        0.0
    );
    assert_eq!(must(&m, "wdp_config_last_reload_success"), 1.0);
    assert!(m.contains("scanner=\"serial\""), "{m}");

    // Serial is removed: its scanner, its resource and their series leave /status and /metrics.
    write_renamed(&config, &format!("scanners:\n{kvm}"));
    seen.ended("serial.example.com/serial").await;
    // The reload is counted once applied, right after the scanner is gone.
    let m = eventually("the serial scanner gone, the reload counted", || async {
        let m = metrics(&addr).await;
        let counted = value(&m, "wdp_config_reloads_total{result=\"success\"}")? == 1.0;
        (counted && !m.contains("serial")).then_some(m)
    })
    .await;
    assert_eq!(
        must(
            &m,
            "wdp_resource_devices{resource=\"devices.example.com/kvm\",health=\"healthy\"}"
        ),
        1.0
    );
    let (code, body) = get(&addr, "/status").await;
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["ready"], true, "{json}");
    let names: Vec<&str> = json["scanners"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert_eq!(names, ["kvm"]);

    // A config that fails its checks is refused and counted; the old one keeps running.
    write_renamed(&config, "scanners: [ {} ]\n");
    eventually("the refused reload counted", || async {
        let m = metrics(&addr).await;
        (value(&m, "wdp_config_reloads_total{result=\"failure\"}")? == 1.0).then_some(())
    })
    .await;
    let m = metrics(&addr).await;
    assert_eq!(must(&m, "wdp_config_last_reload_success"), 0.0);
    assert_eq!(must(&m, "wdp_scanner_restarts_total{scanner=\"kvm\"}"), 0.0);
    assert_eq!(get(&addr, "/readyz").await, (200, "ready\n".into()));

    let status = host.terminate().await;
    assert!(status.success(), "exit status {status}");
    kubelet.stop().await;
}

/// The sys root as a runtime without recursive read-only mounts leaves `/host/sys` (containerd
/// 1.6 with `recursiveReadOnly: IfPossible`): a read-only bind whose sub-mount (cgroupfs there,
/// a tmpfs here) stays writable. Made in the child's own mount namespace before it execs wdp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writable_mount_under_a_read_only_sys_root_is_warned_of_and_reported() {
    use rustix::mount::{MountFlags, MountPropagationFlags};
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;

    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    f.sys_dir("fs/cgroup");
    let sys = std::fs::canonicalize(f.sys()).unwrap();
    let cgroup = sys.join("fs/cgroup");
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n",
        guest("kvm").display()
    ));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("start the kubelet stand-in");
    let mut seen = Seen::new(observed);

    let mut cmd = tokio::process::Command::new(wdp_tests::wdp_bin());
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--sys-root")
        .arg(&sys)
        .arg("--dev-root")
        .arg(f.dev())
        .arg("--compile-cache")
        .arg(f.path().join("compiled"))
        .args(["--metrics-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "info");
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    let (sys_c, cgroup_c) = (c(&sys), c(&cgroup));
    // SAFETY: raw syscalls only, on strings prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS)?;
            rustix::mount::mount_change(
                c"/",
                MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
            )?;
            rustix::mount::mount(c"tmpfs", &cgroup_c, c"tmpfs", MountFlags::empty(), None)?;
            // A recursive bind made read-only at its top only, as `readOnly: true` alone is.
            rustix::mount::mount_bind_recursive(&sys_c, &sys_c)?;
            rustix::mount::mount_remount(&sys_c, MountFlags::BIND | MountFlags::RDONLY, c"")?;
            Ok(())
        });
    }
    let host = Host::spawn(&mut cmd, &f.path().join("wdp-run.log")).expect("start wdp run");
    seen.all_listed(&["devices.example.com/kvm"]).await;

    let writable = format!("{} (tmpfs)", cgroup.display());
    let log = eventually("the warning in the host's log", || async {
        let log = strip_ansi(&host.log());
        log.lines()
            .find(|l| l.contains("WARN") && l.contains("mounts under it are writable"))
            .map(str::to_owned)
    })
    .await;
    assert!(
        log.contains(&writable) && log.contains("recursiveReadOnly"),
        "{log}"
    );
    let addr = {
        let log = strip_ansi(&host.log());
        let line = log
            .lines()
            .find(|l| l.contains("serving /metrics"))
            .expect("the metrics address in the log")
            .to_owned();
        line.split("addr=")
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        must(
            &metrics(&addr).await,
            "wdp_host_writable_mounts{root=\"sys\"}"
        ),
        1.0
    );
    let (code, body) = get(&addr, "/status").await;
    assert_eq!(code, 200, "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let listed: Vec<&str> = status["writable_mounts"]
        .as_array()
        .expect("writable_mounts in /status")
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert!(listed.contains(&writable.as_str()), "{listed:?}");
    assert!(
        !listed
            .iter()
            .any(|m| m.starts_with(&format!("{} (", sys.display()))),
        "the sys root itself is read-only: {listed:?}"
    );

    host.terminate().await;
    kubelet.stop().await;
}

/// kubelet restarting as a real one does, stopped (SIGTERM) and then killed: its `kubelet.sock`
/// stays in place, refusing connections, until the next kubelet starts. The ListAndWatch stream
/// that ends with it is no lost stream: `wdp_resource_stream_losses_total` stays 0, the log says
/// so at info level (no "registration failed", no "kubelet refused"), and each kubelet start is
/// followed by one registration. A stream cut while kubelet runs still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restarts_are_not_counted_as_lost_streams() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
        guest("kvm").display()
    ));
    let kvm = "devices.example.com/kvm";
    let losses = "wdp_resource_stream_losses_total{resource=\"devices.example.com/kvm\"}";
    let plugins = f.plugin_dir();
    let (mut kubelet, observed) = StandIn::start(&plugins).expect("the kubelet stand-in");
    let mut seen = Seen::new(observed);
    let (host, addr) = start(&f, &config, &plugins).await;
    seen.devices(kvm, &["kvm-0"]).await;
    let ready = |want: u16| {
        let addr = addr.clone();
        async move {
            eventually(&format!("/readyz answering {want}"), || async {
                (get(&addr, "/readyz").await.0 == want).then_some(())
            })
            .await
        }
    };
    ready(200).await;

    for killed in [false, true] {
        if killed {
            kubelet.crash().await;
        } else {
            kubelet.stop().await;
        }
        assert!(
            plugins.join("kubelet.sock").exists(),
            "kubelet leaves its socket"
        );
        // wdp saw kubelet go before the next one comes.
        ready(503).await;
        let (k, observed) = StandIn::start(&plugins).expect("the kubelet stand-in");
        kubelet = k;
        seen = Seen::new(observed);
        seen.devices(kvm, &["kvm-0"]).await;
        ready(200).await;
        assert_eq!(must(&metrics(&addr).await, losses), 0.0, "killed: {killed}");
        assert_eq!(seen.registrations(kvm), 1, "killed: {killed}");
    }
    let log = strip_ansi(&host.log());
    assert_eq!(
        log.matches("kubelet stopped (its socket refuses connections)")
            .count(),
        2,
        "{log}"
    );
    for wrong in [
        "registration failed",
        "kubelet refused",
        "stream ended while it kept running",
    ] {
        assert!(!log.contains(wrong), "{wrong:?} in:\n{log}");
    }

    // A stream kubelet drops while it runs is a loss, and one registration.
    assert!(kubelet.cut_stream(kvm));
    seen.until("registered again after a cut", |s| {
        s.registrations(kvm) >= 2
    })
    .await;
    seen.devices(kvm, &["kvm-0"]).await;
    assert_eq!(must(&metrics(&addr).await, losses), 1.0);
    // Nothing more registered meanwhile: one registration for the start, one for the cut.
    assert_eq!(seen.registrations(kvm), 2);
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}

/// kubelet answering the registration with an error: wdp logs kubelet's reason, counts it,
/// keeps it on `/readyz`, and retries until kubelet takes the resource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_kubelet_refuses_is_on_readyz_with_kubelets_reason() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: devices.example.com\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
        guest("kvm").display()
    ));
    let kvm = "devices.example.com/kvm";
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).expect("the kubelet stand-in");
    let reason = "no more device plugins on this node";
    kubelet.refuse(Some(reason.into()));
    let mut seen = Seen::new(observed);
    let (host, addr) = start(&f, &config, &plugins).await;
    let line =
        format!("resource {kvm}: not registered with kubelet: registration failed: {reason}");
    eventually(&format!("/readyz with {line:?}"), || async {
        let (code, body) = get(&addr, "/readyz").await;
        (code == 503 && body.contains(&line)).then_some(())
    })
    .await;
    let failures = format!("wdp_resource_registration_failures_total{{resource=\"{kvm}\"}}");
    assert!(must(&metrics(&addr).await, &failures) >= 1.0);
    let log = strip_ansi(&host.log());
    assert!(
        log.contains("registration failed; retrying") && log.contains(reason),
        "{log}"
    );

    kubelet.refuse(None);
    seen.devices(kvm, &["kvm-0"]).await;
    eventually("ready", || async {
        (get(&addr, "/readyz").await.0 == 200).then_some(())
    })
    .await;
    assert!(host.terminate().await.success());
    kubelet.stop().await;
}
