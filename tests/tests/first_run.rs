//! A newcomer's first run: `make demo` (scripts/prerequisites.sh, then scripts/demo.sh) and what
//! they read in a terminal or a log file.
//!
//! * Logs carry colour codes only on a terminal, and not there either under `NO_COLOR`: a log
//!   written to a file or a pipe (`kubectl logs`, the demo's interleaved output, CI) has no escape
//!   sequence. The terminal is a real pseudo-terminal, made by util-linux's `script`.
//! * scripts/prerequisites.sh names every missing tool with how to install it, and is silent when
//!   nothing is missing.
//! * scripts/demo.sh, run as `make demo` runs it (the test build's binary and demo/wdp.yaml, over
//!   this machine's /sys and /dev): it prints what is served once wdp is ready, stops wdp before
//!   the stand-in, and so ends without a warning and with no socket of wdp's left behind, both
//!   after DEMO_DURATION and on Ctrl-C (SIGINT to the script, which it then exits 0 from).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use wdp_tests::fixture::Fixture;
use wdp_tests::{guest, repo, wdp_bin};

const ESC: char = '\u{1b}';

/// A fixture with /dev/kvm.
fn kvm_fixture() -> Fixture {
    let f = Fixture::new();
    f.char_dev("kvm", 10, 232);
    f
}

/// `wdp scan --once` of the kvm guest over a fixture: a command that logs (the component's
/// compile, at info) and exits.
fn scan_args(f: &Fixture) -> Vec<String> {
    vec![
        "scan".into(),
        "--component".into(),
        guest("kvm").display().to_string(),
        "--sys-root".into(),
        f.sys().display().to_string(),
        "--dev-root".into(),
        f.dev().display().to_string(),
        "--once".into(),
    ]
}

#[test]
fn a_log_written_to_a_pipe_has_no_colour_codes() {
    let f = kvm_fixture();
    let out = Command::new(wdp_bin())
        .args(scan_args(&f))
        .env_remove("NO_COLOR")
        .env("RUST_LOG", "info")
        .output()
        .expect("run wdp scan");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("INFO"), "no log line to check: {stderr}");
    assert!(
        !stderr.contains(ESC),
        "escape sequences in a piped log: {stderr:?}"
    );
}

/// `wdp scan` on a pseudo-terminal (`script`), with `NO_COLOR` as given; what the terminal showed.
fn on_a_terminal(f: &Fixture, no_color: Option<&str>) -> String {
    let command = std::iter::once(wdp_bin().display().to_string())
        .chain(scan_args(f))
        .map(|a| format!("'{a}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let mut cmd = Command::new("script");
    // -q: no banner; -e: the command's exit status; -c: the command; /dev/null: no typescript.
    cmd.args(["-q", "-e", "-c", &command, "/dev/null"])
        .env("RUST_LOG", "info")
        .stdin(Stdio::null());
    match no_color {
        Some(v) => cmd.env("NO_COLOR", v),
        None => cmd.env_remove("NO_COLOR"),
    };
    let out = cmd.output().expect("run script (util-linux)");
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("INFO"), "no log line to check: {shown}");
    shown
}

#[test]
fn a_terminal_gets_colours_unless_no_color_is_set() {
    let f = kvm_fixture();
    assert!(
        on_a_terminal(&f, None).contains(ESC),
        "no colour on a terminal"
    );
    // NO_COLOR set and not empty turns them off; set but empty does not (no-color.org).
    let shown = on_a_terminal(&f, Some("1"));
    assert!(!shown.contains(ESC), "colours under NO_COLOR=1: {shown:?}");
    assert!(
        on_a_terminal(&f, Some("")).contains(ESC),
        "NO_COLOR= (empty) must not count"
    );
}

/// A directory of symlinks to `tools` (found on this PATH), for a PATH holding only them.
fn path_of(dir: &Path, tools: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let target = String::from_utf8_lossy(&found.stdout).trim().to_string();
        assert!(!target.is_empty(), "{tool} is not installed here");
        std::os::unix::fs::symlink(&target, dir.join(tool)).unwrap();
    }
    dir.to_path_buf()
}

fn prerequisites(path: &Path) -> Output {
    Command::new(repo().join("scripts/prerequisites.sh"))
        .env("PATH", path)
        .output()
        .expect("run scripts/prerequisites.sh")
}

#[test]
fn missing_prerequisites_are_each_named_with_how_to_install_them() {
    let dir = tempfile::tempdir().unwrap();
    // What the script itself runs on, and nothing of what the demo needs.
    let shell = ["bash", "sed", "awk", "sort", "head", "uname", "dirname"];
    let bare = path_of(&dir.path().join("bare"), &shell);
    let out = prerequisites(&bare);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("https://sh.rustup.rs"), "{err}");
    assert!(err.contains("apt-get install gcc"), "{err}");

    let full: Vec<&str> = shell
        .iter()
        .copied()
        .chain(["rustup", "cargo", "rustc", "cc"])
        .collect();
    let all = path_of(&dir.path().join("all"), &full);
    let out = prerequisites(&all);
    assert!(
        out.status.success() && out.stderr.is_empty() && out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends `signal` to `pid` (the script, which stops what it started on its way out).
fn signal(pid: u32, signal: &str) {
    Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .ok();
}

/// Runs scripts/demo.sh as `make demo` does. With `duration` it ends by itself that long after
/// its summary; without, it is interrupted (SIGINT, as Ctrl-C) once it says it is serving.
/// Checks what every clean demo shows, and returns its stdout.
fn demo(duration: Option<&str>) -> String {
    let mut cmd = Command::new(repo().join("scripts/demo.sh"));
    cmd.arg(wdp_bin())
        .arg(repo().join("demo/wdp.yaml"))
        .env_remove("NO_COLOR")
        .env_remove("RUST_LOG")
        .env_remove("DEMO_DURATION")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = duration {
        cmd.env("DEMO_DURATION", d);
    }
    let mut child = cmd.spawn().expect("run scripts/demo.sh");
    let pid = child.id();
    // stdout line by line, so the test sees "serving until Ctrl-C" when it comes.
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.contains("until Ctrl-C") {
                tx.send(()).ok();
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    if duration.is_none() {
        let serving = rx.recv_timeout(Duration::from_secs(300)).is_ok();
        signal(pid, "-INT");
        assert!(serving, "the demo never said it was serving");
    }
    while child.try_wait().expect("wait for the demo").is_none() {
        if Instant::now() > deadline {
            signal(pid, "-TERM");
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("the demo's output");
    let stdout = reader.join().expect("the stdout reader");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let all = format!("{stdout}\n--- stderr ---\n{stderr}");
    assert!(out.status.success(), "{all}");
    assert!(stdout.contains("== what wdp serves"), "{all}");
    assert!(
        stdout.contains(&format!("wdp {}: ready", env!("CARGO_PKG_VERSION"))),
        "wdp was not ready when the summary was printed: {all}"
    );
    assert!(
        !all.contains(ESC),
        "escape sequences in the demo's output: {all:?}"
    );
    let complaints: Vec<&str> = all
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        complaints.is_empty(),
        "warnings in a clean demo: {complaints:#?}\n{all}"
    );
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("== demo stopped")
            && last.contains("sockets it left in the plugin dir: 0"),
        "{all}"
    );
    stdout
}

#[test]
fn the_demo_says_what_it_serves_and_stops_cleanly() {
    // Counted from the summary on: the test waits for the script, not for this.
    let stdout = demo(Some("1s"));
    assert!(stdout.contains("serving for 1s more =="), "{stdout}");
}

#[test]
fn a_demo_stopped_with_ctrl_c_stops_cleanly() {
    demo(None);
}
