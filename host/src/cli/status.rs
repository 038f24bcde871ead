//! `wdp status`: ask a running host what it serves.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use hyper::header;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::status::{ScannerReport, StatusReport};

/// How long the whole exchange may take: the host answers from memory, at once.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Show what a running `wdp run` serves: its scanners (state, restarts, last scan, guest memory)
/// and their resources (registered with kubelet or not, healthy and unhealthy devices, served
/// through a device plugin or a DRA driver), and whether it is ready.
///
/// Reads GET /status from the host's --metrics-addr. Exits 1 when the host cannot be reached.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The host's --metrics-addr.
    #[arg(
        long,
        value_name = "ADDR",
        default_value = "127.0.0.1:9464",
        env = "WDP_STATUS_ADDR"
    )]
    addr: String,

    /// Print the host's /status document (JSON) instead of tables.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let body = tokio::time::timeout(TIMEOUT, fetch(&args.addr))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {TIMEOUT:?}"))
        .and_then(|r| r)
        .with_context(|| {
            format!(
                "cannot get the status of the wdp host at {}: is `wdp run` running there with --metrics-addr {}?",
                args.addr, args.addr
            )
        })?;
    let report: StatusReport = serde_json::from_slice(&body).with_context(|| {
        format!(
            "{} answered /status with something that is not a wdp status",
            args.addr
        )
    })?;
    if args.json {
        println!("{}", String::from_utf8_lossy(&body).trim_end());
    } else {
        print!("{}", render(&report, unix_now()));
    }
    Ok(ExitCode::SUCCESS)
}

/// GET /status over one HTTP/1 connection; the body of a 200.
async fn fetch(addr: &str) -> anyhow::Result<Bytes> {
    let stream = TcpStream::connect(addr).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let connection = tokio::spawn(connection);
    let request = hyper::Request::get("/status")
        .header(header::HOST, addr)
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    connection.abort();
    if !status.is_success() {
        anyhow::bail!(
            "/status answered {status}: {}",
            String::from_utf8_lossy(&body).trim()
        );
    }
    Ok(body)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The tables `wdp status` prints.
fn render(report: &StatusReport, now: u64) -> String {
    let mut out = format!(
        "wdp {}: {}\n",
        report.version,
        if report.ready { "ready" } else { "NOT READY" }
    );
    for reason in &report.not_ready {
        out.push_str(&format!("  - {reason}\n"));
    }
    out.push('\n');
    let mut scanners = vec![row(&[
        "SCANNER",
        "STATE",
        "RESTARTS",
        "TREES OK/REFUSED",
        "LAST SCAN",
        "MEMORY",
    ])];
    for s in &report.scanners {
        scanners.push(vec![
            s.name.clone(),
            s.state.as_str().to_string(),
            s.restarts.to_string(),
            format!("{}/{}", s.trees_accepted, s.trees_refused),
            last_scan(s, now),
            mib(s.guest_memory_bytes),
        ]);
    }
    out.push_str(&table(&scanners));
    let errors: Vec<_> = report
        .scanners
        .iter()
        .filter_map(|s| s.last_error.as_ref().map(|e| (&s.name, e)))
        .collect();
    if !errors.is_empty() {
        out.push('\n');
        for (name, error) in errors {
            out.push_str(&format!("{name}: last error: {error}\n"));
        }
    }
    out.push('\n');
    let mut resources = vec![row(&[
        "RESOURCE",
        "SCANNER",
        "REGISTERED",
        "HEALTHY",
        "UNHEALTHY",
        "FRONT-END",
    ])];
    for s in &report.scanners {
        for r in &s.resources {
            resources.push(vec![
                r.name.clone(),
                s.name.clone(),
                match (&r.error, r.registered) {
                    (Some(e), _) => format!("no: not served: {e}"),
                    (None, true) => "yes".into(),
                    (None, false) => "no".into(),
                },
                r.healthy.to_string(),
                r.unhealthy.to_string(),
                match &r.dra_driver {
                    Some(driver) => format!("dra ({driver})"),
                    None => "device-plugin".into(),
                },
            ]);
        }
    }
    if resources.len() == 1 {
        out.push_str("no resources served\n");
    } else {
        out.push_str(&table(&resources));
    }
    if !report.writable_mounts.is_empty() {
        out.push_str(&format!(
            "\nwritable under the sys and dev roots: {}\n",
            report.writable_mounts.join(", ")
        ));
    }
    out
}

fn row(cells: &[&str]) -> Vec<String> {
    cells.iter().map(|c| c.to_string()).collect()
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn last_scan(s: &ScannerReport, now: u64) -> String {
    match s.last_scan {
        None => "never".into(),
        Some(t) => format!("{}s ago", now.saturating_sub(t)),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Phase, ResourceReport};

    #[test]
    fn renders_scanners_and_resources() {
        let report = StatusReport {
            version: "0.1.0".into(),
            ready: false,
            not_ready: vec!["resource ns/kvm: not registered with kubelet".into()],
            scanners: vec![ScannerReport {
                name: "kvm".into(),
                state: Phase::Serving,
                restarts: 2,
                trees_accepted: 3,
                trees_refused: 1,
                last_scan: Some(990),
                guest_memory_bytes: 1 << 21,
                last_error: Some("trapped".into()),
                resources: vec![
                    ResourceReport {
                        name: "ns/kvm".into(),
                        registered: false,
                        healthy: 2,
                        unhealthy: 1,
                        error: None,
                        dra_driver: None,
                    },
                    ResourceReport {
                        name: "x.io/vfio".into(),
                        registered: true,
                        healthy: 330,
                        unhealthy: 0,
                        error: None,
                        dra_driver: Some("x.io".into()),
                    },
                ],
            }],
            writable_mounts: vec!["/host/sys/fs/cgroup (cgroup2)".into()],
        };
        let text = render(&report, 1000);
        assert!(
            text.starts_with("wdp 0.1.0: NOT READY\n  - resource ns/kvm"),
            "{text}"
        );
        assert!(
            text.contains("kvm      serving  2         3/1               10s ago    2.0 MiB\n"),
            "{text}"
        );
        assert!(text.contains("kvm: last error: trapped\n"), "{text}");
        assert!(
            text.ends_with(
                "\nwritable under the sys and dev roots: /host/sys/fs/cgroup (cgroup2)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ns/kvm     kvm      no          2        1          device-plugin\n"),
            "{text}"
        );
        assert!(
            text.contains("x.io/vfio  kvm      yes         330      0          dra (x.io)\n"),
            "{text}"
        );
    }
}
