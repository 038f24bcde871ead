//! The results table, printed as rows are measured and written as `RESULTS.md`.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, SystemTime};

use wdp_bench::procfs::MachineInfo;
use wdp_bench::stats::{Summary, human};

/// One line of the table.
pub struct Row {
    pub what: String,
    pub target: String,
    pub median: String,
    pub p99: String,
    pub n: String,
    /// None: no target (a reference figure).
    pub met: Option<bool>,
    pub how: String,
}

impl Row {
    /// A timed row; `met` judges the summary against the target.
    pub fn timed(
        what: &str,
        target: &str,
        samples: &[Duration],
        met: impl Fn(&Summary) -> bool,
        how: &str,
    ) -> Row {
        let s = Summary::of(samples);
        let has_target = target.contains("<=");
        Row {
            what: what.into(),
            target: target.into(),
            median: s.map_or("-".into(), |s| human(s.median)),
            p99: s.map_or("-".into(), |s| human(s.p99)),
            n: samples.len().to_string(),
            met: s.filter(|_| has_target).map(|s| met(&s)),
            how: how.into(),
        }
    }

    /// A row of one measured value (memory, a ratio, a count).
    pub fn value(
        what: &str,
        target: &str,
        value: String,
        second: String,
        met: Option<bool>,
        how: &str,
    ) -> Row {
        Row {
            what: what.into(),
            target: target.into(),
            median: value,
            p99: second,
            n: "1".into(),
            met,
            how: how.into(),
        }
    }

    pub fn print(&self) {
        println!(
            "  {:<58} median {:>10}  p99 {:>10}  (n={}, target {}){}",
            self.what,
            self.median,
            self.p99,
            self.n,
            self.target,
            match self.met {
                Some(true) => "  met",
                Some(false) => "  NOT MET",
                None => "",
            }
        );
    }
}

/// Everything one run measured.
pub struct Report {
    pub rows: Vec<Row>,
    /// (title, markdown body)
    pub details: Vec<(String, String)>,
    pub criterion: Vec<CriterionResult>,
    pub event_plug: Option<Summary>,
    pub event_unplug: Option<Summary>,
    pub poll_plug: Option<Summary>,
    pub poll_unplug: Option<Summary>,
    pub profile: String,
    pub build_seconds: Option<f64>,
    pub run_seconds: f64,
    pub quick: bool,
    machine: MachineInfo,
    date: SystemTime,
}

impl Report {
    pub fn new(profile: &str, build_seconds: Option<f64>, quick: bool) -> Self {
        let machine = MachineInfo::read();
        println!(
            "machine: {} x {}, kernel {}, {} MiB, load {}",
            machine.nproc,
            machine.cpu_model,
            machine.kernel,
            machine.mem_total_mib,
            machine.load_avg
        );
        Report {
            rows: Vec::new(),
            details: Vec::new(),
            criterion: Vec::new(),
            event_plug: None,
            event_unplug: None,
            poll_plug: None,
            poll_unplug: None,
            profile: profile.into(),
            build_seconds,
            run_seconds: 0.0,
            quick,
            machine,
            date: SystemTime::now(),
        }
    }

    pub fn push(&mut self, row: Row) {
        row.print();
        self.rows.push(row);
    }

    /// The event-driven loop against the poller, measured in this run.
    pub fn hotplug_ratio(&mut self) {
        let pairs = [
            ("appears", self.event_plug, self.poll_plug),
            ("removed", self.event_unplug, self.poll_unplug),
        ];
        let mut body = String::from(
            "Both loops run generic's discovery code on the same fixture, in this run.\n\n\
             | change | event-driven median | poll (5 s) median | poll p99 | ratio of medians |\n\
             |---|---|---|---|---|\n",
        );
        let mut any = false;
        for (what, event, poll) in pairs {
            if let (Some(e), Some(p)) = (event, poll) {
                any = true;
                let ratio = p.median.as_secs_f64() / e.median.as_secs_f64().max(1e-9);
                let _ = writeln!(
                    body,
                    "| node {what} | {} | {} | {} | {ratio:.0}x faster |",
                    human(e.median),
                    human(p.median),
                    human(p.p99)
                );
                println!(
                    "  hot-plug, node {what}: event-driven {} vs poll {} median ({ratio:.0}x)",
                    human(e.median),
                    human(p.median)
                );
            }
        }
        if any {
            self.details
                .push(("Hot-plug: event-driven vs poll mode".into(), body));
        }
    }

    /// Reads every benchmark criterion wrote under `dir` (`<id>/new/*.json`).
    pub fn read_criterion(&mut self, dir: &Path) {
        let mut found = Vec::new();
        collect_criterion(dir, &mut found);
        found.sort_by(|a, b| a.id.cmp(&b.id));
        self.criterion = found;
    }

    pub fn markdown(&self, notes: Option<&str>) -> String {
        let m = &self.machine;
        let mut s = String::new();
        let _ = writeln!(s, "# wdp benchmark results\n");
        let _ = writeln!(
            s,
            "Written by `make bench` (`bench/src/main.rs`); do not edit by hand: the notes at the end \
             come from `bench/NOTES.md`.\n"
        );
        let _ = writeln!(s, "| | |\n|---|---|");
        let _ = writeln!(s, "| date | {} |", super::e2e::utc(self.date));
        let _ = writeln!(s, "| CPU | {} x {} |", m.nproc, m.cpu_model);
        let _ = writeln!(s, "| kernel | {} |", m.kernel);
        let _ = writeln!(s, "| memory | {} MiB |", m.mem_total_mib);
        let _ = writeln!(
            s,
            "| load average at start / end | {} / {} |",
            m.load_avg,
            wdp_bench::procfs::load_avg()
        );
        let _ = writeln!(
            s,
            "| profile | `{}` (host binary, driver and benches; see the notes) |",
            self.profile
        );
        if let Some(b) = self.build_seconds {
            let _ = writeln!(
                s,
                "| this run's build step | {b:.0} s (guests + host + benches; incremental if target/ was warm) |"
            );
        }
        let _ = writeln!(
            s,
            "| driver run time | {:.0} s{} |",
            self.run_seconds,
            if self.quick { " (`--quick`)" } else { "" }
        );
        let _ = writeln!(s);
        let _ = writeln!(s, "## Targets\n");
        let _ = writeln!(
            s,
            "Timed rows: median and nearest-rank p99 of n samples. A target given as one bound is \
             judged on the median, a p99 bound on the p99.\n"
        );
        let _ = writeln!(s, "| what | target | median | p99 | n | met | how |");
        let _ = writeln!(s, "|---|---|---|---|---|---|---|");
        for r in &self.rows {
            let met = match r.met {
                Some(true) => "yes",
                Some(false) => "**no**",
                None => "",
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {met} | {} |",
                r.what, r.target, r.median, r.p99, r.n, r.how
            );
        }
        for (title, body) in &self.details {
            let _ = writeln!(s, "\n### {title}\n\n{}", body.trim_end());
        }
        if !self.criterion.is_empty() {
            let _ = writeln!(
                s,
                "\n## Micro-benchmarks (criterion, `bench/benches/micro.rs`)\n"
            );
            let _ = writeln!(
                s,
                "Per-iteration time: criterion's median estimate, and the p99 over its samples \
                 (each sample is the mean of many iterations).\n"
            );
            let _ = writeln!(s, "| benchmark | median | p99 of samples | samples |");
            let _ = writeln!(s, "|---|---|---|---|");
            for c in &self.criterion {
                let _ = writeln!(
                    s,
                    "| `{}` | {} | {} | {} |",
                    c.id,
                    human(c.median),
                    human(c.p99),
                    c.samples
                );
            }
        }
        if let Some(notes) = notes {
            let _ = writeln!(s, "\n{}", notes.trim_end());
        }
        s
    }
}

/// Milestone name -> median over runs, as a markdown table.
pub fn phase_table(runs: &[Vec<(String, Duration)>]) -> String {
    let mut names: Vec<String> = Vec::new();
    for run in runs {
        for (n, _) in run {
            if !names.contains(n) {
                names.push(n.clone());
            }
        }
    }
    let mut s = String::from("| milestone after spawn | median | max |\n|---|---|---|\n");
    for name in names {
        let v: Vec<Duration> = runs
            .iter()
            .filter_map(|r| r.iter().find(|(n, _)| *n == name).map(|(_, d)| *d))
            .collect();
        if let Some(sum) = Summary::of(&v) {
            let _ = writeln!(s, "| {name} | {} | {} |", human(sum.median), human(sum.max));
        }
    }
    s
}

/// One criterion benchmark's result.
pub struct CriterionResult {
    pub id: String,
    pub median: Duration,
    pub p99: Duration,
    pub samples: usize,
}

fn collect_criterion(dir: &Path, out: &mut Vec<CriterionResult>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            if let Some(r) = read_one(&path) {
                out.push(r);
            }
        } else if path
            .file_name()
            .is_some_and(|n| n != "report" && n != "base")
        {
            collect_criterion(&path, out);
        }
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

fn read_one(new: &Path) -> Option<CriterionResult> {
    let bench = read_json(&new.join("benchmark.json"))?;
    let estimates = read_json(&new.join("estimates.json"))?;
    let sample = read_json(&new.join("sample.json"))?;
    let id = bench.get("full_id")?.as_str()?.to_string();
    let median = estimates.get("median")?.get("point_estimate")?.as_f64()?;
    let iters = sample.get("iters")?.as_array()?;
    let times = sample.get("times")?.as_array()?;
    let mut per_iter: Vec<Duration> = iters
        .iter()
        .zip(times)
        .filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()?.max(1.0)))
        .map(|ns| Duration::from_nanos(ns as u64))
        .collect();
    per_iter.sort();
    let p99 = Summary::of(&per_iter)?.p99;
    Some(CriterionResult {
        id,
        median: Duration::from_nanos(median as u64),
        p99,
        samples: per_iter.len(),
    })
}
