//! `wdp kubelet`: a kubelet stand-in that prints what device plugins report.

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use wdp_kubelet::api;
use wdp_kubelet::standin::{Observed, StandIn};

/// A kubelet stand-in for demos and experiments; never for production.
///
/// Cleans the plugin directory and listens on <plugin-dir>/kubelet.sock like kubelet, accepts
/// registrations (dialling each plugin back for its options), and prints every device list as it
/// streams in. With --allocate it also makes one Allocate call per resource, for its first healthy
/// device, and prints the response. Runs until Ctrl-C, or for --duration.
#[derive(Debug, Args)]
pub struct KubeletArgs {
    /// The device-plugin directory to serve in.
    #[arg(long, value_name = "DIR")]
    plugin_dir: PathBuf,

    /// Make one Allocate call per resource once it has a healthy device.
    #[arg(long)]
    allocate: bool,

    /// Stop after this long (e.g. 30s); default: until Ctrl-C.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    duration: Option<Duration>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s).map_err(|e| e.to_string())
}

pub async fn run(args: KubeletArgs) -> anyhow::Result<ExitCode> {
    let (standin, mut observed) = StandIn::start(&args.plugin_dir)
        .with_context(|| format!("cannot serve in {}", args.plugin_dir.display()))?;
    println!(
        "kubelet stand-in listening on {}",
        standin.socket().display()
    );
    let until = async {
        match args.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(until);
    let mut allocated = HashSet::new();
    loop {
        let event = tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = &mut until => break,
            event = observed.recv() => event,
        };
        let Some(event) = event else { break };
        match event {
            Observed::Registered {
                resource, options, ..
            } => println!(
                "registered {resource} (preferred allocation: {}, pre-start: {})",
                options.get_preferred_allocation_available, options.pre_start_required
            ),
            Observed::Devices {
                resource, devices, ..
            } => {
                println!("{resource}: {} device(s)", devices.len());
                for d in devices.iter() {
                    println!("  {:<32} {}{}", d.id, d.health, numa(d));
                }
                let first_healthy = devices.iter().find(|d| d.health == "Healthy");
                if let Some(device) = first_healthy.filter(|_| args.allocate)
                    && allocated.insert(resource.clone())
                {
                    match standin.allocate(&resource, &[&device.id]).await {
                        Ok(response) => print_allocation(&resource, &device.id, &response),
                        Err(status) => println!(
                            "allocate {resource} [{}] failed: {}",
                            device.id,
                            status.message()
                        ),
                    }
                }
            }
            Observed::StreamEnded { resource, .. } => println!("{resource}: stream ended"),
        }
    }
    standin.stop().await;
    Ok(ExitCode::SUCCESS)
}

fn numa(d: &api::Device) -> String {
    match &d.topology {
        Some(t) if !t.nodes.is_empty() => {
            let ids: Vec<String> = t.nodes.iter().map(|n| n.id.to_string()).collect();
            format!(" numa={}", ids.join(","))
        }
        _ => String::new(),
    }
}

fn print_allocation(resource: &str, id: &str, response: &api::AllocateResponse) {
    println!("allocate {resource} [{id}]:");
    for c in &response.container_responses {
        for d in &c.devices {
            println!(
                "  device {} -> {} ({})",
                d.host_path, d.container_path, d.permissions
            );
        }
        for m in &c.mounts {
            let ro = if m.read_only { "ro" } else { "rw" };
            println!("  mount  {} -> {} ({ro})", m.host_path, m.container_path);
        }
        let mut envs: Vec<_> = c.envs.iter().collect();
        envs.sort();
        for (k, v) in envs {
            println!("  env    {k}={v}");
        }
        for cdi in &c.cdi_devices {
            println!("  cdi    {}", cdi.name);
        }
    }
}
