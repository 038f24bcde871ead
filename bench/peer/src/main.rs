//! The peer of `make bench`: a device plugin built on `k8s-device-plugin-lib`, the way its
//! `static_device_plugin` example is, serving a fixed list of devices under one resource name.
//!
//! ```text
//! wdp-bench-peer PLUGIN_DIR RESOURCE DEVICE_PATH...
//! ```
//!
//! Each device is read-write, its id the file name of its path. The crate always serves and
//! registers in `/var/lib/kubelet/device-plugins/`; to run it against the bench's kubelet
//! stand-in unchanged, this process enters a mount namespace of its own where PLUGIN_DIR is
//! bind-mounted there (over a tmpfs on `/var/lib`, so nothing outside the namespace changes).
//! Needs root, as the bench does.

use std::ffi::CString;
use std::io;
use std::path::Path;
use std::process::ExitCode;

use k8s_device_plugin_lib::{Device, DevicePlugin, DevicePluginService, StaticDevicePlugin};

/// Where the crate puts its socket and looks for kubelet's.
const KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wdp-bench-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> io::Result<()> {
    let mut args = std::env::args_os().skip(1);
    let (Some(plugin_dir), Some(resource)) = (args.next(), args.next()) else {
        return Err(io::Error::other(
            "usage: wdp-bench-peer PLUGIN_DIR RESOURCE DEVICE_PATH...",
        ));
    };
    let resource = resource
        .into_string()
        .map_err(|_| io::Error::other("RESOURCE is not UTF-8"))?;
    let mut devices = Vec::new();
    for path in args {
        let path = path
            .into_string()
            .map_err(|_| io::Error::other("a DEVICE_PATH is not UTF-8"))?;
        let id = Path::new(&path)
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| io::Error::other(format!("{path}: no file name")))?
            .to_owned();
        devices.push(Device::rdwr(id, path));
    }
    // Before any other thread exists: a multi-threaded process cannot enter a mount namespace.
    enter_namespace(Path::new(&plugin_dir))?;
    let service = DevicePluginService::new(StaticDevicePlugin::new(devices));
    let plugin = DevicePlugin::new(&resource, service).map_err(io::Error::other)?;
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(plugin.run())
}

/// A private mount namespace in which `plugin_dir` is [`KUBELET_DIR`].
fn enter_namespace(plugin_dir: &Path) -> io::Result<()> {
    // SAFETY: plain system calls on C strings that outlive them; the process has one thread.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS), "unshare(CLONE_NEWNS)")?;
        // Nothing mounted here propagates back to the parent namespace.
        check(
            libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ),
            "make / private",
        )?;
        check(
            libc::mount(
                c"tmpfs".as_ptr(),
                c"/var/lib".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            ),
            "mount a tmpfs on /var/lib",
        )?;
    }
    std::fs::create_dir_all(KUBELET_DIR)?;
    let source = CString::new(plugin_dir.as_os_str().as_encoded_bytes())
        .map_err(|_| io::Error::other("PLUGIN_DIR holds a NUL byte"))?;
    let target = CString::new(KUBELET_DIR).map_err(io::Error::other)?;
    // SAFETY: as above.
    unsafe {
        check(
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            ),
            "bind-mount PLUGIN_DIR",
        )
    }
}

fn check(rc: libc::c_int, what: &str) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        Err(io::Error::new(e.kind(), format!("{what}: {e}")))
    }
}
