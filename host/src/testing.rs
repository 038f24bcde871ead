//! What the unit tests of several modules make on disk: real device nodes in fixture roots.

use std::path::Path;

/// `mknod` of a character device `major:minor` with permission bits `mode` at `path` (tests run
/// as root; where they cannot, the caller decides what stands in).
pub fn char_device(path: &Path, major: u32, minor: u32, mode: u32) -> std::io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::makedev(major, minor),
    )
    .map_err(Into::into)
}
