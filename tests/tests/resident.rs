//! What `wdp run` keeps resident once a config is loaded: shortly after loading, the host hands
//! back the pages loading touched (the binary's start-up code, the components' compiled code)
//! and goes on serving, the dropped pages mapped again as they run; and again after each round of
//! safety rescans, which map back what they run. The mechanism itself (which
//! mappings, their bytes kept) is tested in the host's `cli::run::resident`.

use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::guest;
use wdp_tests::host::{Host, Launch, Seen};

const VIDEO: &str = "example.com/video";

/// `line` without terminal colour codes (`ESC [ ... letter`).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The field `key=N` of a log line.
fn field(line: &str, key: &str) -> u64 {
    line.split(&format!(" {key}="))
        .nth(1)
        .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
}

/// After loading, the host logs what it handed back (something: at least the compiler's and the
/// start-up's pages), then still serves a hot-plugged node, running the guest code it dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_pages_are_handed_back_and_serving_goes_on() {
    let f = Fixture::new();
    f.char_dev("video0", 81, 0);
    let config = f.write_config(&format!(
        "scanners:
  - name: video
    component: {}
    namespace: example.com
    env:
      RESCAN_INTERVAL_MS: 600000
      DEVICES: '[{{\"name\": \"video\", \"groups\": [{{\"paths\": [{{\"path\": \"/dev/video*\"}}]}}]}}]'
",
        guest("generic").display()
    ));
    let plugins = f.plugin_dir();
    let (_kubelet, observed) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(observed);
    let launch = Launch {
        log_filter: "info,wdp::cli::run=debug",
        ..Launch::test(&f)
    };
    let host = Host::launch(&config, &plugins, &f, &launch).unwrap();
    seen.devices(VIDEO, &["video0"]).await;
    let log = host
        .logged("handed back what loading the config made resident", 1)
        .await;
    let line = log
        .lines()
        .map(plain)
        .find(|l| l.contains("handed back what loading"))
        .unwrap();
    assert!(
        field(&line, "mappings") > 0 && field(&line, "kib") > 0,
        "{line}"
    );

    f.char_dev("video1", 81, 1);
    seen.devices(VIDEO, &["video0", "video1"]).await;
}

/// A scanner that rescans every 200 ms: the host hands memory back after a round of its rescans,
/// one hand-back for the several rescans that start while it waits, and still serves a
/// hot-plugged node afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescans_are_followed_by_a_hand_back() {
    let f = Fixture::new();
    f.char_dev("video0", 81, 0);
    let config = f.write_config(&format!(
        "scanners:
  - name: video
    component: {}
    namespace: example.com
    env:
      RESCAN_INTERVAL_MS: 200
      DEVICES: '[{{\"name\": \"video\", \"groups\": [{{\"paths\": [{{\"path\": \"/dev/video*\"}}]}}]}}]'
",
        guest("generic").display()
    ));
    let plugins = f.plugin_dir();
    let (_kubelet, observed) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(observed);
    let launch = Launch {
        log_filter: "info,wdp::cli::run=debug",
        ..Launch::test(&f)
    };
    let host = Host::launch(&config, &plugins, &f, &launch).unwrap();
    seen.devices(VIDEO, &["video0"]).await;
    const NEEDLE: &str = "handed back what the safety rescans mapped again";
    let log = host.logged(NEEDLE, 2).await;
    let lines: Vec<String> = log
        .lines()
        .map(plain)
        .filter(|l| l.contains(NEEDLE))
        .collect();
    // Each hand-back follows the rescans of the 2 s before it: about ten of them, counted once.
    let (first, second) = (field(&lines[0], "rescans"), field(&lines[1], "rescans"));
    assert!(first >= 1 && second >= first + 2, "{lines:#?}");
    assert!(field(&lines[1], "mappings") > 0, "{lines:#?}");

    f.char_dev("video1", 81, 1);
    seen.devices(VIDEO, &["video0", "video1"]).await;
}
