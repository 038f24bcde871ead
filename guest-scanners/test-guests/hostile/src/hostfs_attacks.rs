//! The `hostile` attacks on the host's filesystem calls: time, threads and memory the host spends
//! for a guest. Env `ATTACK` picks one; each reports what it got as devices of dev-type `answers`:
//!
//! * `hostfs-stuck-reads`: `read-files` of `BATCH` (default 1024) copies of `READ_PATH` per call,
//!   for ever (a tracefs `trace_pipe`: a read that waits for data that may never come). After
//!   answer i = 1, 2, 4, 8, ... it notifies one device `answered-<i>`.
//! * `hostfs-giant-batch`: `read-files` of 4096 paths cycling over `/sys/big/f0` ..
//!   `/sys/big/f<FILES-1>` (default 64 files), `REPEAT` times (default 8); notifies one device
//!   per distinct outcome: `read` (the whole answer came back), `too-large` (the host refused an
//!   answer that large) or `error: <excerpt>`. Then it waits for ever. With `GO_FILE` set, it
//!   starts once that file exists (through the preopen): a test measures the host from then on.
//! * `hostfs-giant-listing`: `list-dir /sys/wide` `REPEAT` times, outcomes as above (`listed`).
//! * `slow-preopen-reads`: `READS` (default 300) reads of `/sys/ok` through the /sys preopen,
//!   each followed by a 15 ms WASI sleep, the time a PCI `config` read through the preopen takes:
//!   a guest that spends its time blocked in WASI, not computing. Then notifies `done-<READS>`
//!   and waits for ever.
//! * `hostfs-bad-utf8`: notifies `good`/`g`, then calls `read-files` with a path that is not
//!   UTF-8 through the raw import; the host must trap it.

use wdp_guest::bindings::scanner::wdp::device_plugin::hostfs;
use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, config, devfs, notify};

use super::single;

/// Every value of `ATTACK` this module handles.
pub const ATTACKS: [&str; 5] = [
    "hostfs-stuck-reads",
    "hostfs-giant-batch",
    "hostfs-giant-listing",
    "slow-preopen-reads",
    "hostfs-bad-utf8",
];

/// Runs the attack `ATTACK` names when it is one of [`ATTACKS`]; `None` otherwise.
pub fn run() -> Option<Result<(), String>> {
    let attack = config::env_var("ATTACK").filter(|a| ATTACKS.contains(&a.as_str()))?;
    Some(match attack.as_str() {
        "hostfs-stuck-reads" => stuck_reads(),
        "hostfs-giant-batch" => giant(|| {
            let files = config::env_u32("FILES", 64, 1..=4096)?;
            let paths: Vec<String> = (0..4096)
                .map(|i| format!("/sys/big/f{}", i % files))
                .collect();
            Ok(hostfs::read_files(&paths).map(|_| "read"))
        }),
        "hostfs-giant-listing" => giant(|| Ok(hostfs::list_dir("/sys/wide").map(|_| "listed"))),
        "slow-preopen-reads" => slow_preopen_reads(),
        "hostfs-bad-utf8" => {
            notify(&single("good", "g"));
            raw_read_files_not_utf8();
            Err("LEAKED: the host accepted a path that is not UTF-8".into())
        }
        other => unreachable!("{other} is in ATTACKS"),
    })
}

fn answers(ids: &[String]) -> DeviceTree {
    let mut t = TreeBuilder::new();
    for id in ids {
        t.add("answers", id.as_str(), DeviceInfo::new());
    }
    t.build()
}

fn stuck_reads() -> Result<(), String> {
    let path = config::env_var("READ_PATH").ok_or("READ_PATH is not set")?;
    let batch = config::env_u32("BATCH", 1024, 1..=4096)? as usize;
    let paths = vec![path; batch];
    let mut answered = 0u64;
    loop {
        // Whatever it says (every read refused, the call abandoned): it answered.
        let _ = std::hint::black_box(hostfs::read_files(&paths));
        answered += 1;
        if answered.is_power_of_two() {
            notify(&single("answers", &format!("answered-{answered}")));
        }
    }
}

fn giant(call: impl Fn() -> Result<Result<&'static str, String>, String>) -> Result<(), String> {
    let repeat = config::env_u32("REPEAT", 8, 1..=1000)?;
    if let Some(go) = config::env_var("GO_FILE") {
        while std::fs::metadata(&go).is_err() {
            devfs::wait_for_change(100);
        }
    }
    let mut outcomes: Vec<String> = Vec::new();
    for _ in 0..repeat {
        let outcome = match call()? {
            Ok(what) => what.to_string(),
            Err(e) if e.contains("would hold more than") => "too-large".to_string(),
            Err(e) => format!(
                "error: {}",
                super::clean(&e).chars().take(50).collect::<String>()
            ),
        };
        if !outcomes.contains(&outcome) {
            outcomes.push(outcome);
        }
    }
    notify(&answers(&outcomes));
    loop {
        devfs::wait_for_change(u32::MAX);
    }
}

fn slow_preopen_reads() -> Result<(), String> {
    let reads = config::env_u32("READS", 300, 1..=100_000)?;
    for i in 0..reads {
        std::fs::read_to_string("/sys/ok").map_err(|e| format!("read {i} of /sys/ok: {e}"))?;
        std::thread::sleep(std::time::Duration::from_millis(15));
    }
    notify(&single("answers", &format!("done-{reads}")));
    loop {
        devfs::wait_for_change(u32::MAX);
    }
}

// The raw canonical-ABI import behind `hostfs.read-files(list<string>)`: (pointer, length, the
// return area).
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wdp:device-plugin/hostfs@0.1.2")]
unsafe extern "C" {
    #[link_name = "read-files"]
    fn raw_read_files(paths: *const u8, len: usize, ret: *mut u8);
}

/// One path whose bytes are not UTF-8: the host cannot lift the call's arguments.
#[cfg(target_arch = "wasm32")]
fn raw_read_files_not_utf8() {
    static BYTES: [u8; 9] = *b"/sys/\xff\xfeok";
    let record: [u32; 2] = [BYTES.as_ptr() as u32, BYTES.len() as u32];
    let mut ret = [0u32; 4];
    unsafe {
        raw_read_files(
            std::hint::black_box(record.as_ptr()).cast(),
            1,
            ret.as_mut_ptr().cast(),
        )
    }
}

#[cfg(not(target_arch = "wasm32"))]
fn raw_read_files_not_utf8() {
    unreachable!("host imports exist only on wasm")
}
