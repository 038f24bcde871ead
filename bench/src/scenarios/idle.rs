//! The idle host: every bundled Rust scanner loaded in one `wdp run`, then left alone. Its
//! resident memory, and whether it wakes up more often than the 30 s safety rescan (anything
//! else would be a scanner polling).
//!
//! It returns its rows rather than pushing them to the report: it runs in a task of its own beside
//! other rows (`main` says which), and the report stays with the main task.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, ensure};
use tokio::sync::oneshot;
use wdp_bench::fixtures::{self, demo_fixture, demo_resources, scanner_yaml, write_config};
use wdp_bench::procfs::Mapping;

use super::shared::{Ctx, expect, expect_quiet, guest, ms};
use crate::e2e::{self, kubelet};
use crate::report::Row;

/// Every bundled Rust scanner, one `wdp run` of `ctx.wdp` (`build` names it), idle: resident
/// memory and wake-ups, over `window` from the moment every resource is listed. `idling` is told
/// then: from there on this row only watches (the driver runs other rows beside it).
pub async fn run(
    ctx: &Ctx,
    build: &str,
    window: Duration,
    idling: oneshot::Sender<()>,
) -> Result<(Vec<Row>, Vec<(String, String)>)> {
    println!(
        "\n== idle host, every bundled Rust scanner loaded (the next rows run beside its window) =="
    );
    let (f, _demo) = demo_fixture();
    let resources = demo_resources();
    let (_, demo_text) = fixtures::demo_config(&f);
    // The demo's two scanners as they are, then every other bundled scanner with its defaults.
    let mut entries = vec![
        demo_text
            .split_once("scanners:\n")
            .map(|(_, s)| s.to_string())
            .context("demo config has scanners:")?,
    ];
    let others = [
        "gpu", "qat", "idxd", "sgx", "npu", "dlb", "vfio", "nvidia", "usb", "serial",
    ];
    for name in others {
        // The three that have no default for what they select (they fail without it).
        let env: &[(&str, &str)] = match name {
            "idxd" => &[("IDXD_DEVICE", "dsa")],
            "vfio" => &[("VFIO_DEVICE_IDS", "0x0b25")],
            "usb" => &[("USB_DEVICES", "1050:0407")],
            _ => &[],
        };
        entries.push(scanner_yaml(
            name,
            &guest(name),
            &format!("{name}.wdp.dev"),
            env,
            None,
        ));
    }
    let config = write_config(&f, &entries);
    let (_kubelet, mut obs) = kubelet(&f.plugin_dir())?;
    // A first start compiles the ten scanners no earlier row used: its memory includes the
    // compiler's (its peak, VmHWM, is while compiling). Measured as long after its start as the
    // warm one is, then the host is restarted from the warm cache, as on any restart.
    let cold = {
        let host = ctx.start(&f, &config)?;
        expect(&mut obs, &host, "demo resources", ms(120_000), |o| {
            o.all_streaming(&resources)
        })
        .await?;
        tokio::time::sleep(SETTLE).await;
        let mem = wdp_bench::procfs::memory(host.pid())?;
        host.stop().await?;
        expect_quiet(&mut obs, &resources).await;
        obs.forget();
        mem
    };
    // JSON logs, with the change watcher's trace events: kernel uevents (which describe the real
    // machine, whatever the fixture) wake every scanner, and the timeline says which bursts they
    // explain.
    let host = ctx.launch(
        &f,
        &config,
        "info,wdp::sandbox::watch=trace",
        &["--log-format", "json"],
    )?;
    expect(&mut obs, &host, "demo resources", ms(60_000), |o| {
        o.all_streaming(&resources)
    })
    .await?;
    // Nobody listening only means nothing waits for this row.
    let _ = idling.send(());
    let pid = host.pid();
    // (second, wake-ups, threads that exited) for every second with any.
    let mut timeline: Vec<(u64, u64, usize)> = Vec::new();
    let mut last = wdp_bench::procfs::thread_switches(pid)?;
    let begin = Instant::now();
    let begin_wall = SystemTime::now();
    let mut second = 0u64;
    // Memory and CPU from the end of the start-up's aftermath (see SETTLE) on, and the highest
    // resident memory from there to the end (the host hands back what its start-up made resident;
    // its rescans map again what they run).
    let mut settled = None;
    let mut highest = (0u64, 0u64); // (VmRSS KiB, second)
    // (second, memory) every second from the steady state on (see STEADY_FROM).
    let mut steady_samples: Vec<(u64, wdp_bench::procfs::Memory)> = Vec::new();
    while begin.elapsed() < window {
        second += 1;
        tokio::time::sleep_until((begin + Duration::from_secs(second)).into()).await;
        if second == SETTLE.as_secs() {
            settled = Some((
                wdp_bench::procfs::memory(pid)?,
                wdp_bench::procfs::cpu_ticks(pid)?,
                wdp_bench::procfs::smaps(pid)?,
            ));
        }
        if second >= SETTLE.as_secs() {
            let now = wdp_bench::procfs::memory(pid)?;
            if now.vm_rss > highest.0 {
                highest = (now.vm_rss, second);
            }
            if second >= STEADY_FROM.as_secs() {
                steady_samples.push((second, now));
            }
        }
        let now = wdp_bench::procfs::thread_switches(pid)?;
        let woke: u64 = now
            .iter()
            .map(|(tid, n)| n.saturating_sub(last.get(tid).copied().unwrap_or(0)))
            .sum();
        let exited = last.keys().filter(|t| !now.contains_key(t)).count();
        if woke > 0 || exited > 0 {
            timeline.push((second, woke, exited));
        }
        last = now;
    }
    let cpu1 = wdp_bench::procfs::cpu_ticks(pid)?;
    let mem_end = wdp_bench::procfs::memory(pid)?;
    let maps_end = wdp_bench::procfs::smaps(pid)?;
    let settle = SETTLE.as_secs();
    let (mem, cpu0, maps) = settled.with_context(|| {
        format!(
            "the idle window ({window:?}) is shorter than the start-up's aftermath ({settle} s)"
        )
    })?;
    let log = host.log();
    host.stop().await?;
    let scanners = 2 + others.len();
    let failed = log.matches("scanner failed").count();
    // A failing scanner restarts with backoff (1 s doubling): that would be measured as wake-ups.
    ensure!(
        failed == 0,
        "{failed} scanner failures in the idle host's log: the idle figures would be wrong:\n{}",
        log.lines()
            .filter(|l| l.contains("scanner failed"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let secs = window.as_secs();
    // Kernel uevents in the window, by second (1-based like the timeline).
    let uevents: Vec<u64> = e2e::read_json_log(&log)
        .iter()
        .filter(|e| e.message == "kernel uevent")
        .filter_map(|e| e.at.duration_since(begin_wall).ok())
        .map(|d| d.as_secs() + 1)
        .filter(|s| *s <= secs)
        .collect();
    let total: u64 = timeline
        .iter()
        .filter(|(s, _, _)| *s > settle)
        .map(|(_, n, _)| n)
        .sum();
    // A uevent, or a rescan, starts an episode: its scans, then (10 s later) the exit of the
    // blocking-pool threads its file reads used. The start-up's own episode (the first `settle`
    // seconds) and wake-ups a uevent explains are set aside; the rest are merged into episodes,
    // which must be as far apart as the 30 s safety rescan.
    let explained = |s: u64| uevents.iter().any(|u| s + 1 >= *u && s <= u + 12);
    let mut spans: Vec<(u64, u64)> = Vec::new(); // (first second, last second)
    for &(s, _, _) in timeline
        .iter()
        .filter(|(s, _, _)| *s > settle && !explained(*s))
    {
        match spans.last_mut() {
            Some(span) if s <= span.1 + 12 => span.1 = s,
            _ => spans.push((s, s)),
        }
    }
    let episodes: Vec<u64> = spans.iter().map(|(first, _)| *first).collect();
    let shortest_gap = episodes.windows(2).map(|w| w[1] - w[0]).min();
    let met = shortest_gap.is_none_or(|g| g >= 25);
    let rss_mib = mem.vm_rss as f64 / 1024.0;
    let highest_mib = highest.0 as f64 / 1024.0;
    let first_start = format!(
        "First start (compiling): peak {:.1} MiB, {:.1} MiB at {settle} s",
        cold.vm_hwm as f64 / 1024.0,
        cold.vm_rss as f64 / 1024.0
    );
    let memory_row = match Steady::of(&steady_samples) {
        Some(st) => Row::value(
            &format!("resident memory, idle, {scanners} Rust scanners loaded (steady state)"),
            "<= 12 MiB, anonymous <= 5 MiB",
            format!("{:.1} MiB", st.median_kib as f64 / 1024.0),
            format!("{highest_mib:.1} MiB peak"),
            Some(st.median_kib <= 12 * 1024 && st.anon_kib <= 5 * 1024),
            &format!(
                "{build}, started from the warm compile cache: the median VmRSS from {} s (after three safety rescans and their hand-backs) to {secs} s, {} samples; anonymous {} KiB, file-backed {} KiB (medians), anonymous slope {:+.1} MiB/h; the peak from {settle} s on at {} s; {rss_mib:.1} MiB at {settle} s (anon {} KiB, file {} KiB; {} threads); where: the section Idle memory. {first_start}",
                STEADY_FROM.as_secs(),
                st.samples,
                st.anon_kib,
                st.file_kib,
                st.anon_slope_kib_per_hour / 1024.0,
                highest.1,
                mem.rss_anon,
                mem.rss_file,
                mem.threads,
            ),
        ),
        // `--quick`: too short a window for a steady state.
        None => Row::value(
            &format!("resident memory, idle, {scanners} Rust scanners loaded (steady state)"),
            "<= 12 MiB, anonymous <= 5 MiB",
            format!("{highest_mib:.1} MiB"),
            format!("{rss_mib:.1} MiB at {settle} s"),
            None,
            &format!(
                "{build}: a window of {secs} s ends before the steady state ({} s): the highest VmRSS from {settle} s on, not judged. {first_start}",
                STEADY_FROM.as_secs()
            ),
        ),
    };
    let rows = vec![
        memory_row,
        Row::value(
            "CPU when nothing changes: wake-ups",
            "none more often than the 30 s rescan",
            format!("{} episodes in {} s", episodes.len(), secs - settle),
            match shortest_gap {
                Some(g) => format!("{g} s apart at least"),
                None => "-".into(),
            },
            Some(met),
            &format!(
                "{total} context switches over all threads in {} s, {} kernel uevents; CPU {} ticks; see the timeline",
                secs - settle,
                uevents.len(),
                cpu1.saturating_sub(cpu0)
            ),
        ),
    ];
    let tl = if timeline.is_empty() {
        "none".to_string()
    } else {
        timeline
            .iter()
            .map(|(s, n, exited)| {
                let mut t = format!("{s}: {n}");
                if *exited > 0 {
                    t += &format!(" ({exited} threads exited)");
                }
                if uevents.contains(s) {
                    t += " (uevent)";
                }
                t
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let wdp = std::fs::canonicalize(&ctx.wdp).unwrap_or_else(|_| ctx.wdp.clone());
    let cache = std::fs::canonicalize(&ctx.cache).unwrap_or_else(|_| ctx.cache.clone());
    let details = vec![
        (
            "Idle memory".into(),
            format!(
                "Where the idle row's {:.1} MiB are ({build}, `/proc/<pid>/smaps` {settle} s after \
                 every resource was listed), and the {:.1} MiB at the end of the window (after its \
                 safety rescans: what they run is mapped again; KiB resident):\n\n{}",
                rss_mib,
                mem_end.vm_rss as f64 / 1024.0,
                breakdown_table(
                    &breakdown(&maps, &wdp, &cache),
                    &breakdown(&maps_end, &wdp, &cache)
                )
            ),
        ),
        (
            "Idle timeline".into(),
            format!(
                "Wake-ups (voluntary + involuntary context switches, summed over threads) of the idle \
             host, per second after all resources were listed (second: count): {tl}.\n\nThe first \
             {settle} s are the start-up's own episode (scanners entering wait-for-change, then \
             tokio's blocking-pool threads exiting after their 10 s keep-alive) and are not \
             counted. Episodes after it not explained by a kernel uevent start at seconds \
             {episodes:?}; kernel uevents at seconds {uevents:?}.\n"
            ),
        ),
    ];
    for r in &rows {
        r.print();
    }
    Ok((rows, details))
}

/// The start-up's aftermath, set aside: longer than tokio's 10 s blocking-thread keep-alive.
const SETTLE: Duration = Duration::from_secs(12);

/// Where the steady state starts: after the third default 30 s safety rescan (at about 90 s) and
/// the hand-back 2 s after it, with time to spare.
const STEADY_FROM: Duration = Duration::from_secs(100);

/// Resident memory at steady state, from one sample a second.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Steady {
    samples: usize,
    /// Median VmRSS.
    median_kib: u64,
    /// Median RssAnon and RssFile.
    anon_kib: u64,
    file_kib: u64,
    /// The least-squares slope of RssAnon over the samples: a leak shows as a steady climb.
    anon_slope_kib_per_hour: f64,
}

impl Steady {
    /// `None` for fewer than two samples (a window that ends before the steady state).
    fn of(samples: &[(u64, wdp_bench::procfs::Memory)]) -> Option<Steady> {
        if samples.len() < 2 {
            return None;
        }
        let median = |f: fn(&wdp_bench::procfs::Memory) -> u64| {
            let mut v: Vec<u64> = samples.iter().map(|(_, m)| f(m)).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        let n = samples.len() as f64;
        let mean_t = samples.iter().map(|(t, _)| *t as f64).sum::<f64>() / n;
        let mean_a = samples.iter().map(|(_, m)| m.rss_anon as f64).sum::<f64>() / n;
        let (mut cov, mut var) = (0.0, 0.0);
        for (t, m) in samples {
            let dt = *t as f64 - mean_t;
            cov += dt * (m.rss_anon as f64 - mean_a);
            var += dt * dt;
        }
        let per_second = if var > 0.0 { cov / var } else { 0.0 };
        Some(Steady {
            samples: samples.len(),
            median_kib: median(|m| m.vm_rss),
            anon_kib: median(|m| m.rss_anon),
            file_kib: median(|m| m.rss_file),
            anon_slope_kib_per_hour: per_second * 3600.0,
        })
    }
}

/// What one kind of mapping holds: its resident KiB (of which anonymous), how many mappings, and
/// for the compiled components each file's resident KiB.
#[derive(Debug, Default)]
struct Part {
    rss: u64,
    anonymous: u64,
    mappings: usize,
    each: Vec<(String, u64)>,
}

/// The idle host's mappings by what they hold, in a fixed order (empty parts included):
/// `binary` is the `wdp` measured and `cache` the compile cache, both canonical.
fn breakdown(maps: &[Mapping], binary: &Path, cache: &Path) -> Vec<(&'static str, Part)> {
    const GIB: u64 = 1 << 20; // in KiB
    let names = [
        "wdp's binary: code",
        "wdp's binary: read-only data",
        "wdp's binary: relocated and writable data",
        "compiled components (code and metadata mapped from the compile cache)",
        "shared libraries",
        "heap (brk)",
        "malloc arenas of other threads",
        "wasm linear memories (data segments mapped from the compile cache included)",
        "stacks (threads and guests' fibers)",
        "main thread's stack",
        "other anonymous memory",
        "other",
    ];
    let mut parts: Vec<(&'static str, Part)> =
        names.iter().map(|n| (*n, Part::default())).collect();
    let binary = binary.to_string_lossy();
    let cache = cache.to_string_lossy();
    let unreadable = |m: &Mapping| m.perms.starts_with("---") && m.path.is_empty();
    let adjacent = |a: &Mapping, b: &Mapping| a.end() == b.start;
    let mut kinds: Vec<Option<usize>> = maps
        .iter()
        .enumerate()
        .map(|(i, m)| {
            if unreadable(m) {
                return None; // guard regions and reservations: nothing resident
            }
            let prev = i.checked_sub(1).map(|p| &maps[p]);
            let guard_below = prev.is_some_and(|p| adjacent(p, m) && unreadable(p));
            let next = maps.get(i + 1);
            let reserved_above = next.is_some_and(|n| adjacent(m, n) && unreadable(n));
            Some(if m.path == *binary {
                if m.perms.contains('x') {
                    0
                } else if !m.perms.contains('w') && m.anonymous == 0 {
                    1
                } else {
                    2
                }
            } else if m.path.starts_with(&*cache) {
                3
            } else if m.path.contains(".so") {
                4
            } else if m.path == "[heap]" {
                5
            } else if m.path == "[stack]" {
                9
            } else if !m.path.is_empty() {
                11
            } else if guard_below && prev.is_some_and(|p| p.size <= 64) {
                8 // a stack sits on a guard page
            } else if reserved_above {
                6 // an arena's heap is followed by the rest of its 64 MiB
            } else {
                10
            })
        })
        .collect();
    // A linear memory is what lies between its guard region and the rest of its reservation
    // (4 GiB and more): its stack and heap, and the data segments mapped from the compiled file.
    for (j, m) in maps.iter().enumerate() {
        if !(unreadable(m) && m.size >= GIB) {
            continue;
        }
        let mut i = j;
        while i > 0 && adjacent(&maps[i - 1], &maps[i]) && !unreadable(&maps[i - 1]) {
            i -= 1;
            kinds[i] = Some(7);
        }
    }
    for (m, kind) in maps.iter().zip(kinds) {
        let Some(kind) = kind else { continue };
        let part = &mut parts[kind].1;
        part.rss += m.rss;
        part.anonymous += m.anonymous;
        part.mappings += 1;
        if kind == 3 {
            match part.each.iter_mut().find(|(path, _)| *path == m.path) {
                Some((_, rss)) => *rss += m.rss,
                None => part.each.push((m.path.clone(), m.rss)),
            }
        }
    }
    parts
}

/// Two breakdowns (idle, and at the end of the window) side by side as a markdown table.
fn breakdown_table(idle: &[(&'static str, Part)], end: &[(&'static str, Part)]) -> String {
    let mut t = String::from(
        "| what | idle KiB | of it anonymous | mappings | at the end KiB | of it anonymous |\n\
         |---|---|---|---|---|---|\n",
    );
    for ((name, p), (_, e)) in idle.iter().zip(end) {
        let mut name = name.to_string();
        if !p.each.is_empty() {
            let mut each: Vec<u64> = p.each.iter().map(|(_, rss)| *rss).collect();
            each.sort_unstable_by(|a, b| b.cmp(a));
            let mut each_end: Vec<u64> = e.each.iter().map(|(_, rss)| *rss).collect();
            each_end.sort_unstable_by(|a, b| b.cmp(a));
            let list = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
            name += &format!(
                "; {} files, KiB each, largest first: idle {}; at the end {}",
                each.len(),
                list(&each),
                list(&each_end)
            );
        }
        t += &format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            p.rss, p.anonymous, p.mappings, e.rss, e.anonymous
        );
    }
    let total = |parts: &[(&'static str, Part)]| parts.iter().map(|(_, p)| p.rss).sum::<u64>();
    t += &format!("| total | {} | | | {} | |\n", total(idle), total(end));
    t
}
