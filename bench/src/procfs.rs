//! What `/proc` says about a process and the machine: resident memory, context switches, CPU time.

use std::path::Path;

/// Memory figures from `/proc/<pid>/status`, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    pub vm_rss: u64,
    pub vm_hwm: u64,
    pub rss_anon: u64,
    pub rss_file: u64,
    pub threads: u64,
}

fn status_field(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Resident memory of `pid`.
pub fn memory(pid: u32) -> std::io::Result<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    Ok(Memory {
        vm_rss: status_field(&text, "VmRSS"),
        vm_hwm: status_field(&text, "VmHWM"),
        rss_anon: status_field(&text, "RssAnon"),
        rss_file: status_field(&text, "RssFile"),
        threads: status_field(&text, "Threads"),
    })
}

/// One mapping of `/proc/<pid>/smaps`, sizes in KiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// Its first address.
    pub start: u64,
    /// Its length, in KiB.
    pub size: u64,
    /// `rwxp` or `rwxs`, `-` for what is not allowed.
    pub perms: String,
    /// The file mapped, a pseudo-path (`[heap]`, `[stack]`, ...), or empty for anonymous memory.
    pub path: String,
    /// What of it is resident.
    pub rss: u64,
    /// What of that is anonymous (not the file's pages: written copies, or anonymous memory).
    pub anonymous: u64,
}

impl Mapping {
    /// Just past its last address.
    pub fn end(&self) -> u64 {
        self.start + self.size * 1024
    }
}

/// Every mapping of `pid`, in address order.
pub fn smaps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse_smaps(&std::fs::read_to_string(format!(
        "/proc/{pid}/smaps"
    ))?))
}

/// The mappings of an smaps text.
pub fn parse_smaps(text: &str) -> Vec<Mapping> {
    let mut out: Vec<Mapping> = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(6, ' ');
        let range = parts.next().unwrap_or_default();
        if let Some((start, end)) = range.split_once('-')
            && let (Ok(start), Ok(end)) =
                (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        {
            let perms = parts.next().unwrap_or_default().to_string();
            let path = parts.nth(3).unwrap_or_default().trim().to_string();
            out.push(Mapping {
                start,
                size: end.saturating_sub(start) / 1024,
                perms,
                path,
                rss: 0,
                anonymous: 0,
            });
        } else if let Some(m) = out.last_mut() {
            match line.split_once(':') {
                Some(("Rss", _)) => m.rss = status_field(line, "Rss"),
                Some(("Anonymous", _)) => m.anonymous = status_field(line, "Anonymous"),
                _ => {}
            }
        }
    }
    out
}

/// Context switches (voluntary + involuntary) of each thread of `pid`, by thread id. Compare two
/// snapshots thread by thread: a thread that exits takes its count with it.
pub fn thread_switches(pid: u32) -> std::io::Result<std::collections::HashMap<u32, u64>> {
    let mut out = std::collections::HashMap::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let task = task?;
        let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(task.path().join("status")) else {
            continue; // a thread that just exited
        };
        let n = status_field(&text, "voluntary_ctxt_switches")
            + status_field(&text, "nonvoluntary_ctxt_switches");
        out.insert(tid, n);
    }
    Ok(out)
}

/// User plus system CPU time of `pid`, in clock ticks (`utime` + `stime` of `/proc/<pid>/stat`).
pub fn cpu_ticks(pid: u32) -> std::io::Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces; fields are counted after its closing parenthesis.
    let rest = text.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // After ")": state is field 3 of stat(5), so utime (14) and stime (15) are at 11 and 12.
    Ok(get(11) + get(12))
}

/// The machine the numbers come from.
#[derive(Debug, Clone, Default)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
    pub mem_total_mib: u64,
    pub load_avg: String,
}

impl MachineInfo {
    pub fn read() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
            .unwrap_or_else(|| "unknown".into());
        let kernel = read_trimmed("/proc/sys/kernel/osrelease");
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        MachineInfo {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            kernel,
            mem_total_mib: status_field(&meminfo, "MemTotal") / 1024,
            load_avg: load_avg(),
        }
    }
}

/// The first three fields of `/proc/loadavg`.
pub fn load_avg() -> String {
    read_trimmed("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn read_trimmed(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// True when this process runs as root (real uid 0, from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        })
        .unwrap_or(false)
}
