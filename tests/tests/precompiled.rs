//! Cold start from a precompiled directory: what `wdp precompile` writes, `wdp run --precompiled`
//! loads, so that a start with an empty compile cache compiles nothing and writes nothing there,
//! nor into the precompiled directory, which belongs to the image.

use std::path::{Path, PathBuf};

use wdp_kubelet::standin::StandIn;
use wdp_tests::fixture::Fixture;
use wdp_tests::host::{Host, Seen};
use wdp_tests::{guest, wdp};

const NAMESPACE: &str = "devices.wdp.dev";

/// Every file under `dir` with its contents, sorted; empty when `dir` is absent.
fn contents(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<_> = entries
        .map(|e| {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            (path, bytes)
        })
        .collect();
    out.sort();
    out
}

fn text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_cache_starts_from_what_precompile_wrote() {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    let precompiled = f.path().join("precompiled");
    let out = wdp(&[
        "precompile",
        "--out",
        precompiled.to_str().unwrap(),
        guest("kvm").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let printed = String::from_utf8_lossy(&out.stdout);
    let entry = PathBuf::from(printed.trim());
    assert_eq!(entry.parent(), Some(precompiled.as_path()), "{printed}");
    assert_eq!(entry.extension().unwrap(), "cwasm");
    let shipped = contents(&precompiled);
    assert_eq!(
        shipped.len(),
        2,
        "payload and checksum: {:?}",
        shipped.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );

    let config = f.write_config(&format!(
        "scanners:\n  - name: kvm\n    component: {}\n    namespace: {NAMESPACE}\n    env: {{ SLOTS: 1, RESCAN_INTERVAL_MS: 600000 }}\n",
        guest("kvm").display()
    ));
    let log = serve_kvm(&f, &config, &precompiled).await;
    assert!(
        log.contains("component loaded from the precompiled components"),
        "{log}"
    );
    assert!(log.contains("cache=Precompiled"), "{log}");
    assert!(!log.contains("component compiled"), "{log}");
    assert_eq!(
        contents(&f.path().join("compiled")),
        Vec::new(),
        "nothing compiled into the writable cache"
    );
    assert!(
        contents(&precompiled) == shipped,
        "the precompiled directory is untouched"
    );

    // The next start with another engine's directory (here: none of its entries match) compiles
    // into the writable cache as before.
    let elsewhere = f.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let log = serve_kvm(&f, &config, &elsewhere).await;
    assert!(log.contains("component compiled"), "{log}");
    assert_eq!(contents(&f.path().join("compiled")).len(), 2);
    assert!(contents(&elsewhere).is_empty());
}

/// Serves `config` (kvm, one slot) with `--precompiled precompiled` until kvm-0 is served, then
/// stops; returns the host's log.
async fn serve_kvm(f: &Fixture, config: &Path, precompiled: &Path) -> String {
    let plugins = f.plugin_dir();
    let (kubelet, seen) = StandIn::start(&plugins).unwrap();
    let mut seen = Seen::new(seen);
    let host = Host::start_with(
        config,
        &plugins,
        f,
        &["--precompiled", precompiled.to_str().unwrap()],
    );
    seen.devices(&format!("{NAMESPACE}/kvm"), &["kvm-0"]).await;
    // Components load before anything is served: their lines are in the log by now.
    let log = host.log();
    assert!(host.terminate().await.success());
    kubelet.stop().await;
    log
}

/// Each failure names the file or directory at fault, and --help says what the output is tied
/// to.
#[test]
fn precompile_errors_name_the_path() {
    let f = Fixture::new();
    let out_dir = f.path().join("out");
    let out_arg = out_dir.to_str().unwrap();
    let missing = f.path().join("missing.wasm");
    let out = wdp(&["precompile", "--out", out_arg, missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("cannot read component {}", missing.display())),
        "{}",
        text(&out)
    );

    let not_wasm = f.path().join("notes.wasm");
    std::fs::write(&not_wasm, "not wasm").unwrap();
    let out = wdp(&["precompile", "--out", out_arg, not_wasm.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!(
            "{} is not a valid wasm component",
            not_wasm.display()
        )),
        "{}",
        text(&out)
    );

    // The output directory is a file: nothing can be written there.
    let file = f.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    let out = wdp(&[
        "precompile",
        "--out",
        file.to_str().unwrap(),
        guest("kvm").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out).contains(&format!("cannot write {}", file.display())),
        "{}",
        text(&out)
    );
    assert!(!out_dir.exists(), "nothing written for the failed runs");

    let help = wdp(&["precompile", "--help"]);
    let help = text(&help);
    for needle in ["--precompiled", "CPU", "version"] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
}
