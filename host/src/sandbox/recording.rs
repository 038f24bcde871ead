//! The recording hooks of `wdp snapshot`: the path-taking `wasi:filesystem/types` methods a
//! scanner uses to read /sys, shadowed in the linker to note each path in a [`Recorder`] before
//! delegating to wasmtime-wasi (and, for `open-at`, to the [`open_guard`]).
//!
//! A path is noted relative to the sys root: the base descriptor's real host path (from
//! `/proc/self/fd`) plus the path the guest gave. What the path held is read only at the end
//! (see [`crate::snapshot::record`]); the answers the guest gets are wasmtime-wasi's own.
//! Only the linker `wdp snapshot` builds has these hooks: a normal host pays nothing for them.

use std::sync::Arc;

use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{self, WasiFilesystemCtxView, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    Descriptor, DescriptorStat, DirectoryEntryStream, ErrorCode, Host, HostDescriptor, PathFlags,
};

use super::GuestState;
use super::open_guard::{self, FILESYSTEM_TYPES, OpenAtParams};
use crate::hostfs::record::{Access, Recorder};

/// Shadows `open-at`, `stat-at`, `readlink-at` and `read-directory` in `linker` (which already
/// has wasmtime-wasi and the open guard linked) to note every path in `recorder`.
pub fn install(linker: &mut Linker<GuestState>, recorder: Arc<Recorder>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    let r = recorder.clone();
    types.func_wrap_async(
        "[method]descriptor.open-at",
        move |mut store, (fd, path_flags, path, oflags, flags): OpenAtParams| {
            let r = r.clone();
            Box::new(async move {
                let mut fs = store.data_mut().filesystem();
                let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
                note(&r, &fs, &fd, &path, Access::Open { follow });
                open_guard::open_at(&mut fs, fd, path_flags, path, oflags, flags).await
            })
        },
    )?;
    let r = recorder.clone();
    types.func_wrap_async(
        "[method]descriptor.stat-at",
        move |mut store, (fd, path_flags, path): (Resource<Descriptor>, PathFlags, String)| {
            let r = r.clone();
            Box::new(async move {
                let mut fs = store.data_mut().filesystem();
                let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
                note(&r, &fs, &fd, &path, Access::Stat { follow });
                let stat = HostDescriptor::stat_at(&mut fs, fd, path_flags, path).await;
                Ok::<(Result<DescriptorStat, ErrorCode>,), wasmtime::Error>((match stat {
                    Ok(s) => Ok(s),
                    Err(e) => Err(fs.convert_error_code(e)?),
                },))
            })
        },
    )?;
    let r = recorder.clone();
    types.func_wrap_async(
        "[method]descriptor.readlink-at",
        move |mut store, (fd, path): (Resource<Descriptor>, String)| {
            let r = r.clone();
            Box::new(async move {
                let mut fs = store.data_mut().filesystem();
                note(&r, &fs, &fd, &path, Access::ReadLink);
                let target = HostDescriptor::readlink_at(&mut fs, fd, path).await;
                Ok::<(Result<String, ErrorCode>,), wasmtime::Error>((match target {
                    Ok(t) => Ok(t),
                    Err(e) => Err(fs.convert_error_code(e)?),
                },))
            })
        },
    )?;
    let r = recorder;
    types.func_wrap_async(
        "[method]descriptor.read-directory",
        move |mut store, (fd,): (Resource<Descriptor>,)| {
            let r = r.clone();
            Box::new(async move {
                let mut fs = store.data_mut().filesystem();
                note(&r, &fs, &fd, "", Access::ReadDir);
                let stream = HostDescriptor::read_directory(&mut fs, fd).await;
                Ok::<(Result<Resource<DirectoryEntryStream>, ErrorCode>,), wasmtime::Error>((
                    match stream {
                        Ok(s) => Ok(s),
                        Err(e) => Err(fs.convert_error_code(e)?),
                    },
                ))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Notes `path` relative to the directory descriptor `fd`; a file descriptor or a stale handle
/// is left for wasmtime-wasi to refuse.
fn note(
    recorder: &Recorder,
    fs: &WasiFilesystemCtxView<'_>,
    fd: &Resource<Descriptor>,
    path: &str,
    access: Access,
) {
    let look: Resource<Descriptor> = Resource::new_borrow(fd.rep());
    if let Ok(filesystem::Descriptor::Dir(dir)) = fs.table.get(&look) {
        recorder.sys_at(&dir.dir, path, access);
    }
}
