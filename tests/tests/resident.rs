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

/// A host serving `/dev/video*` through the generic scanner, rescanning every `rescan_ms`, with
/// its run module's debug lines logged; its first device served.
struct Video {
    f: Fixture,
    host: Host,
    seen: Seen,
    _kubelet: StandIn,
}

async fn serve_video(rescan_ms: u32) -> Video {
    let f = Fixture::new();
    f.char_dev("video0", 81, 0);
    let config = f.write_config(&format!(
        "scanners:
  - name: video
    component: {}
    namespace: example.com
    env:
      RESCAN_INTERVAL_MS: {rescan_ms}
      DEVICES: '[{{\"name\": \"video\", \"groups\": [{{\"paths\": [{{\"path\": \"/dev/video*\"}}]}}]}}]'
",
        guest("generic").display()
    ));
    let plugins = f.plugin_dir();
    let (kubelet, observed) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(observed);
    let launch = Launch {
        log_filter: "info,wdp::cli::run=debug",
        ..Launch::test(&f)
    };
    let host = Host::launch(&config, &plugins, &f, &launch).unwrap();
    seen.devices(VIDEO, &["video0"]).await;
    Video {
        f,
        host,
        seen,
        _kubelet: kubelet,
    }
}

/// The log lines of `log` holding `needle`, without colour codes.
fn lines_with(log: &str, needle: &str) -> Vec<String> {
    log.lines()
        .map(plain)
        .filter(|l| l.contains(needle))
        .collect()
}

/// After loading, the host logs what it handed back (something: at least the compiler's and the
/// start-up's pages), then still serves a hot-plugged node, running the guest code it dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_pages_are_handed_back_and_serving_goes_on() {
    let mut v = serve_video(600_000).await;
    const NEEDLE: &str = "handed back what loading the config made resident";
    let lines = lines_with(&v.host.logged(NEEDLE, 1).await, NEEDLE);
    assert!(
        field(&lines[0], "mappings") > 0 && field(&lines[0], "kib") > 0,
        "{lines:#?}"
    );

    v.f.char_dev("video1", 81, 1);
    v.seen.devices(VIDEO, &["video0", "video1"]).await;
}

/// A scanner that rescans every 200 ms: the host hands memory back after a round of its rescans,
/// one hand-back for the several rescans that start while it waits, and still serves a
/// hot-plugged node afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescans_are_followed_by_a_hand_back() {
    let mut v = serve_video(200).await;
    const NEEDLE: &str = "handed back what the safety rescans mapped again";
    let lines = lines_with(&v.host.logged(NEEDLE, 2).await, NEEDLE);
    // Each hand-back follows the rescans of the 2 s before it: about ten of them, counted once.
    let (first, second) = (field(&lines[0], "rescans"), field(&lines[1], "rescans"));
    assert!(first >= 1 && second >= first + 2, "{lines:#?}");
    assert!(field(&lines[1], "mappings") > 0, "{lines:#?}");

    v.f.char_dev("video1", 81, 1);
    v.seen.devices(VIDEO, &["video0", "video1"]).await;
}
