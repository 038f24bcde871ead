//! The kernel's device events (uevents), read from a `NETLINK_KOBJECT_UEVENT` socket.
//!
//! Why: sysfs is not a real filesystem and emits almost no inotify events, so a driver binding,
//! a PCI function appearing or a work queue being enabled changes /sys without waking anyone.
//! The kernel announces every such change on this socket (the same messages udev consumes), so
//! listening to it lets a scanner rescan the moment the kernel acts, with no polling. Only the
//! fact that something happened is used; the message text only filters out events that cannot
//! change a device inventory.

use std::io;
use std::os::fd::OwnedFd;

use rustix::net::netlink::{self, SocketAddrNetlink};
use rustix::net::{AddressFamily, RecvFlags, SocketFlags, SocketType};
use tokio::io::unix::AsyncFd;

/// The kernel's multicast group on the uevent socket (group 2 is udev's re-broadcast).
const KERNEL_GROUP: u32 = 1;
/// Largest uevent the kernel sends (`UEVENT_BUFFER_SIZE`).
const MAX_MESSAGE: usize = 2048;

/// A bound uevent socket.
#[derive(Debug)]
pub struct Uevents {
    fd: AsyncFd<OwnedFd>,
    buf: Vec<u8>,
}

impl Uevents {
    /// Subscribes to the kernel's uevents. Fails where netlink is unavailable (some sandboxes);
    /// the caller then relies on inotify and the rescan interval.
    pub fn open() -> io::Result<Self> {
        let fd = rustix::net::socket_with(
            AddressFamily::NETLINK,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            Some(netlink::KOBJECT_UEVENT),
        )?;
        rustix::net::bind(&fd, &SocketAddrNetlink::new(0, KERNEL_GROUP))?;
        // SAFETY: `fd` is an `OwnedFd` moved into the `AsyncFd`: it stays open, and is the same
        // descriptor, until the `AsyncFd` is dropped, which is all `register` asks.
        let fd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(io::Error::from)?;
        Ok(Uevents {
            fd,
            buf: vec![0; MAX_MESSAGE],
        })
    }

    /// Waits for the next kernel uevent that may change what devices exist, and returns its
    /// `ACTION`. Messages not sent by the kernel (port id 0) are ignored: only root may send on
    /// this group, but trusting the sender costs one check.
    pub async fn next(&mut self) -> io::Result<String> {
        loop {
            let mut guard = self.fd.readable().await?;
            let received = guard.try_io(|fd| {
                rustix::net::recvfrom(fd.get_ref(), &mut self.buf[..], RecvFlags::empty())
                    .map_err(io::Error::from)
            });
            let (len, from) = match received {
                Ok(Ok((len, _, from))) => (len, from),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                // ENOBUFS: the kernel dropped messages because we were slow; something happened.
                Ok(Err(e))
                    if e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) =>
                {
                    return Ok("overrun".into());
                }
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            };
            let from_kernel = from
                .and_then(|a| SocketAddrNetlink::try_from(a).ok())
                .is_some_and(|a| a.pid() == 0);
            if !from_kernel {
                continue;
            }
            if let Some(action) = relevant_action(&self.buf[..len.min(self.buf.len())]) {
                return Ok(action);
            }
        }
    }
}

/// The `ACTION` of a uevent message (`<action>@<devpath>\0KEY=VALUE\0...`) when it may change a
/// device inventory: anything that adds, removes, moves, binds or unbinds a device, and a
/// `change` of something with a device node. Frequent `change` events without a node (battery
/// levels, thermal zones) would only cost every scanner a rescan.
pub fn relevant_action(message: &[u8]) -> Option<String> {
    let mut action = None;
    let mut has_node = false;
    for field in message.split(|&b| b == 0) {
        if let Some(value) = field.strip_prefix(b"ACTION=") {
            action = Some(String::from_utf8_lossy(value).into_owned());
        } else if field.starts_with(b"DEVNAME=") {
            has_node = true;
        }
    }
    let action = action?;
    match action.as_str() {
        "add" | "remove" | "move" | "bind" | "unbind" | "online" | "offline" => Some(action),
        "change" if has_node => Some(action),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_that_can_change_devices() {
        let msg = |s: &str| s.replace('|', "\0").into_bytes();
        let bind = msg("bind@/devices/pci0000:00/0000:00:02.0|ACTION=bind|DRIVER=i915|SEQNUM=9");
        assert_eq!(relevant_action(&bind).as_deref(), Some("bind"));
        let battery =
            msg("change@/devices/x/power_supply/BAT0|ACTION=change|SUBSYSTEM=power_supply");
        assert_eq!(relevant_action(&battery), None);
        let node = msg("change@/devices/virtual/mem/null|ACTION=change|DEVNAME=null");
        assert_eq!(relevant_action(&node).as_deref(), Some("change"));
        assert_eq!(relevant_action(b"libudev\0garbage"), None);
    }
}
