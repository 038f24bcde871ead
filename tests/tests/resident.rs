//! What `wdp run` keeps resident once a config is loaded: shortly after loading, the host hands
//! back the pages loading touched (the binary's start-up code, the components' compiled code)
//! and goes on serving, the dropped pages mapped again as they run. The mechanism itself (which
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
    let field = |key: &str| -> u64 {
        line.split(&format!(" {key}="))
            .nth(1)
            .and_then(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    assert!(field("mappings") > 0 && field("kib") > 0, "{line}");

    f.char_dev("video1", 81, 1);
    seen.devices(VIDEO, &["video0", "video1"]).await;
}
