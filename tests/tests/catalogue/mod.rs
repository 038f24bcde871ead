//! The scanner catalogue (`guest-scanners/<name>`), each scanner over a fixture tree shaped like
//! the real sysfs and /dev of its device family: through `wdp scan` (the tree it reports) and end
//! to end through `wdp run` and the kubelet stand-in (what kubelet sees and what Allocate
//! returns). Device ids and resource names are those of the upstream plugin each one replaces.

mod common;
pub(crate) mod every;
mod host;

mod dlb;
mod gpu;
mod idxd;
mod npu;
mod nvidia;
mod qat;
mod serial;
mod sgx;
mod usb;
mod vfio;
