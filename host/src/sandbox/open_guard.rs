//! What a guest may open under its read-only `/sys` preopen: directories and regular files only.
//!
//! `FsPerms::ReadOnly` stops writes but still lets a guest open *any* file it can reach, and a sys
//! root that holds a device node, a FIFO or a socket (a bind mount, a crafted fixture) would let a
//! guest read device contents or block a host thread on a FIFO. So `open-at` is shadowed in the
//! linker: the entry is looked at first (`stat-at`, with the guest's own symlink flags and the
//! same capability-confined resolution), and anything but a directory or a regular file is
//! refused with `not-permitted` before any open happens.
//!
//! The sys root is the operator's, never writable by guests, so nothing a guest does can swap an
//! entry between the look and the open.

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{WasiFilesystemCtxView, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorFlags, DescriptorType, ErrorCode, Host, HostDescriptor, OpenFlags,
    PathFlags,
};

use super::GuestState;

/// The `wasi:filesystem/types` instance wasmtime-wasi 48 defines; guests importing an older
/// 0.2.x are matched to it by semver, so this one shadow covers them all.
pub(super) const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

pub(super) type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);
pub(super) type OpenAtResult = (Result<Resource<Descriptor>, ErrorCode>,);

/// Replaces `[method]descriptor.open-at` in `linker` (which already has wasmtime-wasi linked).
pub fn install(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store, (fd, path_flags, path, oflags, flags): OpenAtParams| {
            Box::new(async move {
                let mut fs = store.data_mut().filesystem();
                open_at(&mut fs, fd, path_flags, path, oflags, flags).await
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The guarded `open-at`: also what the recording hooks (`wdp snapshot`) delegate to.
pub(super) async fn open_at(
    fs: &mut WasiFilesystemCtxView<'_>,
    fd: Resource<Descriptor>,
    path_flags: PathFlags,
    path: String,
    oflags: OpenFlags,
    flags: DescriptorFlags,
) -> wasmtime::Result<OpenAtResult> {
    let look = Resource::new_borrow(fd.rep());
    let kind = match HostDescriptor::stat_at(fs, look, path_flags, path.clone()).await {
        Ok(stat) => Some(stat.type_),
        // Not found and the like: let open-at report it (it may be a create, which the read-only
        // preopen refuses with its own error).
        Err(_) => None,
    };
    if let Some(kind) = kind
        && !matches!(
            kind,
            DescriptorType::Directory | DescriptorType::RegularFile
        )
    {
        return Ok((Err(ErrorCode::NotPermitted),));
    }
    let opened = HostDescriptor::open_at(fs, fd, path_flags, path, oflags, flags).await;
    Ok((match opened {
        Ok(descriptor) => Ok(descriptor),
        Err(e) => Err(fs.convert_error_code(e)?),
    },))
}
