//! The contract's minor versions on a host built with the latest (0.1.2): a guest built against
//! 0.1.0 (the `legacy` test guest, its WIT pinned) is served beside guests built with the SDK
//! against 0.1.2;
//! a guest of another line is refused with the versions this host speaks; typed attributes reach
//! the validated tree or refuse it by their rule; the batched `hostfs` reads are confined as the
//! single ones are.

use std::time::Duration;

use wdp::sandbox::GuestLimits;
use wdp::scanner::{RestartPolicy, ScannerEvent};
use wdp::tree::AttributeValue;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::serve;
use wdp_tests::{guest, ids, run_guest, sandbox};

/// The contract names in a component's bytes, e.g. `wdp:device-plugin/devfs@0.1.0`.
fn contract_names(wasm: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(wasm);
    let mut names: Vec<String> = text
        .match_indices("wdp:device-plugin/")
        .filter_map(|(i, _)| {
            let rest = &text[i..];
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || ":/-@.".contains(c)))?;
            Some(rest[..end].trim_end_matches('.').to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn the_legacy_guest_is_built_against_0_1_0_and_the_sdk_against_0_1_2() {
    let legacy = contract_names(&std::fs::read(guest("legacy")).unwrap());
    assert!(
        legacy.contains(&"wdp:device-plugin/notifier@0.1.0".to_string())
            && legacy.iter().all(|n| n.contains("@0.1.0")),
        "{legacy:?}"
    );
    let generic = contract_names(&std::fs::read(guest("generic")).unwrap());
    assert!(
        generic.contains(&"wdp:device-plugin/hostfs@0.1.2".to_string())
            && generic.iter().all(|n| n.contains("@0.1.2")),
        "{generic:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_0_1_0_guest_and_0_1_2_guests_are_served_to_kubelet() {
    let f = Fixture::new();
    f.char_dev("legacy/a", 10, 200)
        .char_dev("legacy/b", 10, 201)
        .char_dev("kvm", 10, 232)
        .char_dev("ttyUSB0", 188, 0);
    let devices = r#"[{"name": "serial", "groups": [{"paths": [{"path": "/dev/ttyUSB*"}]}]}]"#;
    let config = f.path().join("wdp.yaml");
    std::fs::write(
        &config,
        format!(
            "scanners:
  - name: legacy
    component: {legacy}
    namespace: legacy.example.com
  - name: kvm
    component: {kvm}
    namespace: devices.example.com
    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}
  - name: serial
    component: {generic}
    namespace: serial.example.com
    env:
      RESCAN_INTERVAL_MS: 600000
      DEVICES: '{devices}'
",
            legacy = guest("legacy").display(),
            kvm = guest("kvm").display(),
            generic = guest("generic").display(),
        ),
    )
    .unwrap();
    let plugins = f.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let (_kubelet, mut seen, _host) = serve(&f, &config, &plugins);

    seen.devices("legacy.example.com/legacy", &["a", "b"]).await;
    seen.devices("devices.example.com/kvm", &["kvm-0"]).await;
    seen.devices("serial.example.com/serial", &["ttyUSB0"])
        .await;
    // The 0.1.0 guest's wait-for-change is served too: it follows hot-plug.
    f.char_dev("legacy/c", 10, 202);
    seen.devices("legacy.example.com/legacy", &["a", "b", "c"])
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_of_another_line_is_refused_with_the_versions_spoken() {
    let f = Fixture::new();
    let sandbox = sandbox(&f);
    // The legacy guest with its contract names moved to 0.2.0: same length, so the component
    // stays well-formed and only its version differs.
    let bytes = std::fs::read(guest("legacy")).unwrap();
    let (from, to) = (b"wdp:device-plugin/", b"@0.1.0");
    let mut moved = bytes.clone();
    let mut i = 0;
    let mut count = 0;
    while let Some(at) = moved[i..].windows(from.len()).position(|w| w == from) {
        let start = i + at;
        let end = start
            + moved[start..]
                .iter()
                .take(64)
                .position(|&b| b == b'@')
                .unwrap_or(0);
        if moved[end..].starts_with(to) {
            moved[end..end + to.len()].copy_from_slice(b"@0.2.0");
            count += 1;
        }
        i = start + from.len();
    }
    assert!(count > 0, "no contract names found in the legacy guest");
    let path = f.path().join("next-line.wasm");
    std::fs::write(&path, &moved).unwrap();
    let err = match sandbox.load(&path).await {
        Ok(_) => panic!("a 0.2.0 guest was loaded"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("built for wdp:device-plugin@0.2.0"), "{err}");
    assert!(
        err.contains("this host speaks wdp:device-plugin@0.1 (built with wdp:device-plugin@0.1.2)"),
        "{err}"
    );
}

const TREE: &str = r#"{"gpu": {"card0": {}, "card1": {}}}"#;

async fn static_guest_event(f: &Fixture, attributes: &str) -> ScannerEvent {
    let sandbox = sandbox(f);
    let mut running = run_guest(
        &sandbox,
        "static_tree",
        &[("TREE", TREE), ("ATTRIBUTES", attributes)],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    tokio::time::timeout(Duration::from_secs(30), running.events.recv())
        .await
        .expect("an event in time")
        .expect("the channel open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_attributes_reach_the_validated_tree() {
    let f = Fixture::new();
    let attrs = r#"{"gpu": {"card0": {"attributes": {"model": "A100", "ecc": true, "cores": 108,
        "gpu.example.com/fw": {"version": "1.2.3"}}, "capacities": {"memory": "80Gi"}}}}"#;
    let tree = match static_guest_event(&f, attrs).await {
        ScannerEvent::Tree(t) => t,
        other => panic!("expected a tree, got {other:?}"),
    };
    assert_eq!(ids(&tree, "gpu"), ["card0", "card1"]);
    let card0 = &tree.0["gpu"]["card0"].attributes;
    assert_eq!(
        card0.attributes["model"],
        AttributeValue::String("A100".into())
    );
    assert_eq!(card0.attributes["ecc"], AttributeValue::Bool(true));
    assert_eq!(card0.attributes["cores"], AttributeValue::Int(108));
    assert_eq!(
        card0.attributes["gpu.example.com/fw"],
        AttributeValue::Version("1.2.3".into())
    );
    assert_eq!(card0.capacities["memory"], "80Gi");
    assert!(tree.0["gpu"]["card1"].attributes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_attribute_refuses_the_tree_naming_device_attribute_and_rule() {
    let f = Fixture::new();
    for (attrs, name, rule) in [
        (
            r#"{"gpu": {"card1": {"attributes": {"resource.kubernetes.io/pciBusID": "x"}}}}"#,
            "resource.kubernetes.io/pciBusID",
            "attribute-reserved-prefix",
        ),
        (
            r#"{"gpu": {"card1": {"capacities": {"memory": "80GB"}}}}"#,
            "memory",
            "capacity-quantity",
        ),
        (
            r#"{"gpu": {"card1": {"attributes": {"fw": {"version": "v1"}}}}}"#,
            "fw",
            "attribute-version",
        ),
        (
            r#"{"gpu": {"card7": {"attributes": {"model": "x"}}}}"#,
            "",
            "attribute-device-exists",
        ),
    ] {
        match static_guest_event(&f, attrs).await {
            ScannerEvent::Refused(e) => {
                assert_eq!(e.rule(), rule, "{e}");
                let text = e.to_string();
                assert!(text.contains("\"gpu\""), "{text}");
                assert!(text.contains("card"), "{text}");
                assert!(text.contains(&format!("{name:?}")), "{text}");
            }
            other => panic!("{attrs}: expected a refusal, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_reads_and_listings_are_confined_like_single_ones() {
    let f = Fixture::new();
    f.sys_file("ok", "fine\n")
        .sys_link("escape-abs", "/etc")
        .sys_link("escape-rel", "../../../../../../../../etc")
        .dev_link("escape", "/etc")
        .char_dev("null", 1, 3);
    wdp_tests::fixture::mknod_char(&f.sys().join("devnode"), 1, 3);
    let sandbox = sandbox(&f);
    let mut running = run_guest(
        &sandbox,
        "hostile",
        &[("ATTACK", "batch-probe")],
        GuestLimits::default(),
        RestartPolicy::Never,
    )
    .await;
    let tree = running.next_tree().await;
    let report = &tree.0["probe"]["report"].annotations;
    // 8 batched reads, 5 listings.
    assert_eq!(report.len(), 13, "{report:#?}");
    // (the guest reports the newline as '.')
    assert_eq!(
        report["read-0"], "read: fine.",
        "the plain attribute is read"
    );
    for (probe, outcome) in report.iter().filter(|(k, _)| *k != "read-0") {
        assert!(outcome.starts_with("denied: "), "{probe}: {outcome}");
    }
    // The device node under /sys is refused as no regular file, never opened for reading.
    assert_eq!(
        report["read-5"], "denied: ReadError::NotAFile",
        "{report:#?}"
    );
}

/// Through `frontend: dra`: the 0.1.1 guest (notify-with-attributes)'s typed attributes and capacities reach its
/// ResourceSlice (valid by the API server's rules), and the 0.1.0 guest is published beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attributes_reach_resource_slices_and_a_0_1_0_guest_is_published_too() {
    use wdp_dra::apiserver::standin::{ApiServerStandIn, validate};
    use wdp_dra::kubelet::KubeletStandIn;

    let f = Fixture::new();
    f.char_dev("legacy/a", 10, 200);
    let registry = f.path().join("kubelet/plugins_registry");
    let plugins_dra = f.path().join("kubelet/plugins");
    std::fs::create_dir_all(&registry).unwrap();
    std::fs::create_dir_all(&plugins_dra).unwrap();
    let api = ApiServerStandIn::start()
        .await
        .expect("the API server stand-in");
    let attrs = r#"{"gpu": {"card0": {"attributes": {"model": "A100", "cores": 108}, "capacities": {"memory": "80Gi"}}}}"#;
    let config = f.write_config(&format!(
        "scanners:
  - name: attrs
    component: {static_tree}
    namespace: attrs.example.com
    env:
      TREE: '{TREE}'
      ATTRIBUTES: '{attrs}'
    cdi: {{ dir: {cdi} }}
    frontend: dra
  - name: legacy
    component: {legacy}
    namespace: legacy.example.com
    cdi: {{ dir: {cdi} }}
    frontend: dra
node:
  name: node-1
  plugins-dir: {plugins}
  plugins-registry-dir: {registry}
  api-server: http://{addr}
",
        static_tree = guest("static_tree").display(),
        legacy = guest("legacy").display(),
        cdi = f.path().join("cdi").display(),
        plugins = plugins_dra.display(),
        registry = registry.display(),
        addr = api.addr(),
    ));
    let _kubelet = KubeletStandIn::start(&registry, &api, "node-1");
    let plugins = f.plugin_dir();
    let (_dp_kubelet, _seen, _host) = serve(&f, &config, &plugins);

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let slices = api.slices();
        for slice in &slices {
            assert_eq!(validate(slice), Vec::<String>::new(), "{slice:?}");
        }
        let devices = |driver: &str| -> Vec<_> {
            slices
                .iter()
                .filter(|s| s.spec.driver == driver)
                .flat_map(|s| s.spec.devices.clone().unwrap_or_default())
                .collect()
        };
        let gpus = devices("attrs.example.com");
        let legacy = devices("legacy.example.com");
        if let (Some(card0), false) = (gpus.iter().find(|d| d.name == "card0"), legacy.is_empty()) {
            let a = card0.attributes.clone().unwrap_or_default();
            assert_eq!(a["model"].string.as_deref(), Some("A100"), "{card0:?}");
            assert_eq!(a["cores"].int, Some(108), "{card0:?}");
            let c = card0.capacity.clone().unwrap_or_default();
            assert_eq!(c["memory"].value.0, "80Gi", "{card0:?}");
            assert_eq!(legacy.len(), 1, "{legacy:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "slices never showed both drivers: {slices:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
