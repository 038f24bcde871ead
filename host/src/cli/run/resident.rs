//! Handing back the memory that loading a config made resident and a running host does not use.
//!
//! Loading touches code and data that serving never runs again: the command line and config
//! parsing, the compile cache's checks, linking, instantiation and, on a first start, the whole
//! compiler. Each touched page of the binary, its shared libraries and the compiled components
//! stays mapped into the process (and counted in its resident memory) for as long as it runs,
//! with its neighbours (the kernel maps page-cache folios, up to 2 MiB, whole), and glibc keeps
//! what the blocking pool's threads freed in their arenas. An idle host with the 12 bundled
//! scanners held 19 of its 31 MiB as the binary's pages that way (bench/NOTES.md).
//!
//! [`release`] returns both: the heap's free pages (`malloc_trim`), and the pages of every
//! read-only, private file mapping that holds nothing but the file's own bytes, which it asks the
//! kernel to reclaim (`MADV_PAGEOUT`). Such a page is only the page cache's: reclaiming it
//! discards nothing, and the next access reads the same bytes again. What the host goes on
//! running comes back; what only start-up ran does not, neither in the process's resident memory
//! nor in the page cache its memory cgroup is charged for. Pages other processes map too are
//! left where they are.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::sandbox::rescans::Rescans;

/// How long after a config was prepared the host hands memory back: by then the scanners it
/// started have been instantiated and have made their first scan (milliseconds for a Rust guest),
/// so what they touch again is what they run, and the start-up's own pages are gone.
pub const AFTER: Duration = Duration::from_secs(2);

/// Hands back, [`AFTER`] each round of safety rescans, what the round mapped again: a rescan runs
/// the scanners' discovery and the host's listing and validation, code that serving between
/// rescans does not run, and without this an idle host with the 12 bundled scanners kept about
/// 9 MiB more from its first rescan on. The scanners of one config rescan within a second or so
/// of each other, so the rescans announced while this waits are one round. Runs until the
/// process ends; the run command spawns it once, with its sandbox.
pub async fn after_rescans(rescans: Arc<Rescans>) {
    loop {
        rescans.next().await;
        tokio::time::sleep(AFTER).await;
        // The rest of the round, announced during the wait: handed back now, with the first.
        let _ = rescans.next().now_or_never();
        let started = Instant::now();
        // Reading smaps and advising each mapping is blocking work of a few milliseconds.
        let Ok(released) = tokio::task::spawn_blocking(release).await else {
            continue;
        };
        tracing::debug!(
            rescans = rescans.count(),
            mappings = released.mappings,
            kib = released.kib,
            elapsed = ?started.elapsed(),
            "handed back what the safety rescans mapped again"
        );
    }
}

/// What [`release`] handed back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Released {
    /// File mappings whose pages the kernel was asked to reclaim.
    pub mappings: usize,
    /// Their resident KiB before.
    pub kib: u64,
}

/// Hands the heap's free pages back and has the kernel reclaim the clean pages of read-only file
/// mappings. Best effort: a host that cannot read its own smaps, or a kernel without
/// `MADV_PAGEOUT` (before 5.4), only keeps its pages.
pub fn release() -> Released {
    trim_heap();
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return Released::default();
    };
    let mut released = Released::default();
    for region in droppable(&smaps) {
        // SAFETY: MADV_PAGEOUT changes no byte of any mapping: the kernel writes a page out (or
        // drops it, when the file holds it already) and reads it back on the next access, and
        // leaves what it cannot reclaim where it is. So the range may be stale (unmapped since
        // smaps was read, or mapped again as anything, heap or linear memory): it costs at worst
        // a fault, never data. The call only takes an address range; no memory is accessed here.
        let rc = unsafe {
            libc::madvise(
                region.start as *mut libc::c_void,
                region.len,
                libc::MADV_PAGEOUT,
            )
        };
        if rc != 0 {
            // EINVAL: a kernel without MADV_PAGEOUT, and nothing else is tried (only reclaim is
            // harmless on a range that may no longer be what smaps said). ENOMEM: the range was
            // unmapped since.
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            continue;
        }
        released.mappings += 1;
        released.kib += region.rss_kib;
    }
    released
}

/// Hands the heap memory the blocking pool's threads freed back to the kernel. Components compile
/// (and cache entries are checked) on those threads, and glibc keeps what each freed in its arena:
/// without this a first start idled near its compile-time peak.
fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only takes glibc's own arena locks and releases free pages; it
    // touches no memory that is in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One mapping whose resident pages may be reclaimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Region {
    start: usize,
    len: usize,
    rss_kib: u64,
}

/// The mappings of `smaps` (the text of `/proc/<pid>/smaps`) whose resident pages are only the
/// file's bytes: private, not writable, backed by a file still linked (not deleted, not a memfd),
/// resident, with no anonymous page.
fn droppable(smaps: &str) -> Vec<Region> {
    fn finish(current: Option<(Region, bool)>, anonymous: u64, out: &mut Vec<Region>) {
        if let Some((region, true)) = current
            && anonymous == 0
            && region.rss_kib > 0
        {
            out.push(region);
        }
    }
    let mut out = Vec::new();
    let mut current: Option<(Region, bool)> = None;
    let mut anonymous = 0u64;
    for line in smaps.lines() {
        if let Some((region, eligible)) = header(line) {
            finish(current.take(), anonymous, &mut out);
            current = Some((region, eligible));
            anonymous = 0;
        } else if let Some((key, kib)) = field(line) {
            match (key, current.as_mut()) {
                ("Rss", Some((region, _))) => region.rss_kib = kib,
                ("Anonymous", Some(_)) => anonymous = kib,
                _ => {}
            }
        }
    }
    finish(current, anonymous, &mut out);
    out
}

/// A mapping's header line (`start-end perms offset dev inode [path]`): its range, and whether
/// what backs it allows dropping its pages.
fn header(line: &str) -> Option<(Region, bool)> {
    let mut parts = line.splitn(6, ' ');
    let (start, end) = parts.next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = parts.next()?.as_bytes();
    let _offset = parts.next()?;
    let _dev = parts.next()?;
    let inode = parts.next()?;
    let path = parts.next().unwrap_or("").trim();
    let eligible = perms.len() == 4
        && perms[1] == b'-'
        && perms[3] == b'p'
        && inode != "0"
        && path.starts_with('/')
        && !path.starts_with("/memfd:")
        && !path.ends_with("(deleted)");
    Some((
        Region {
            start,
            len: end.checked_sub(start)?,
            rss_kib: 0,
        },
        eligible,
    ))
}

/// A `Key:   N kB` line of a mapping.
fn field(line: &str) -> Option<(&str, u64)> {
    let (key, rest) = line.split_once(':')?;
    let value = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some((key, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    const PAGES: usize = 64;

    /// The tests that release and then count resident pages run one at a time: another's
    /// release would drop the pages one has just touched.
    static RELEASING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn page() -> usize {
        // SAFETY: sysconf only reads a system constant.
        usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
    }

    /// A private mapping of a new file of `PAGES` pages, each page filled with its index.
    fn map_file(dir: &tempfile::TempDir, name: &str, prot: i32) -> (*mut u8, usize) {
        let len = PAGES * page();
        let mut file = std::fs::File::create(dir.path().join(name)).unwrap();
        for i in 0..PAGES {
            file.write_all(&vec![i as u8; page()]).unwrap();
        }
        // Clean pages, as the binary's and the compile cache's are: reclaim needs no writeback.
        file.sync_all().unwrap();
        let file = std::fs::File::open(dir.path().join(name)).unwrap();
        // SAFETY: a fresh mapping of a file this test owns; unmapped by the test.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        (ptr.cast(), len)
    }

    /// Resident KiB of the mapping at `ptr`, from this process's smaps.
    fn rss_of(ptr: *mut u8) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut found = false;
        for line in smaps.lines() {
            if let Some((region, _)) = header(line) {
                found = region.start == ptr as usize;
            } else if found && let Some(("Rss", kib)) = field(line) {
                return kib;
            }
        }
        panic!("no mapping at {ptr:?}");
    }

    fn touch(ptr: *mut u8, len: usize) -> u64 {
        // SAFETY: reads within the mapping.
        (0..len)
            .step_by(page())
            .map(|o| u64::from(unsafe { ptr.add(o).read_volatile() }))
            .sum()
    }

    #[test]
    fn reclaims_clean_file_pages_and_keeps_their_bytes() {
        let _one = RELEASING.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        let (ptr, len) = map_file(&dir, "clean", libc::PROT_READ);
        let sum = touch(ptr, len);
        let before = rss_of(ptr);
        assert_eq!(before as usize, len / 1024, "every page was touched");
        let released = release();
        assert!(released.kib >= before, "{released:?}");
        assert_eq!(rss_of(ptr), 0, "its pages were reclaimed");
        assert_eq!(touch(ptr, len), sum, "the same bytes come back");
        assert_eq!(rss_of(ptr) as usize, len / 1024);
        // SAFETY: the test's own mapping.
        unsafe { libc::munmap(ptr.cast(), len) };
    }

    #[test]
    fn keeps_written_pages_and_writable_mappings() {
        let _one = RELEASING.lock().unwrap_or_else(|p| p.into_inner());
        let dir = tempfile::tempdir().unwrap();
        // Written, then made read-only (as relocated data is): its copies must stay.
        let (written, len) = map_file(&dir, "written", libc::PROT_READ | libc::PROT_WRITE);
        // SAFETY: writes within the mapping, then changes its protection.
        unsafe {
            written.write_volatile(0xaa);
            assert_eq!(libc::mprotect(written.cast(), len, libc::PROT_READ), 0);
        }
        let (writable, _) = map_file(&dir, "writable", libc::PROT_READ | libc::PROT_WRITE);
        let sum = touch(writable, len);
        let before = (rss_of(written), rss_of(writable));
        release();
        // SAFETY: reads within the mapping.
        assert_eq!(
            unsafe { written.read_volatile() },
            0xaa,
            "the written copy kept"
        );
        assert_eq!((rss_of(written), rss_of(writable)), before);
        assert_eq!(touch(writable, len), sum);
        // SAFETY: the test's own mappings.
        unsafe {
            libc::munmap(written.cast(), len);
            libc::munmap(writable.cast(), len);
        }
    }

    #[test]
    fn only_private_read_only_linked_files_with_no_anonymous_page() {
        let smaps = "\
1000-3000 r-xp 00000000 fd:01 42   /usr/bin/wdp
Rss:                   8 kB
Anonymous:             0 kB
3000-4000 r--p 00002000 fd:01 42   /usr/bin/wdp
Rss:                   4 kB
Anonymous:             4 kB
4000-5000 rw-p 00003000 fd:01 42   /usr/bin/wdp
Rss:                   4 kB
Anonymous:             0 kB
5000-6000 r--s 00000000 fd:01 43   /var/lib/shared
Rss:                   4 kB
Anonymous:             0 kB
6000-7000 r--p 00000000 00:01 44   /memfd:wasm-memory-image (deleted)
Rss:                   4 kB
Anonymous:             0 kB
7000-8000 r-xp 00000000 fd:01 45   /var/lib/wdp/compiled/a b.cwasm (deleted)
Rss:                   4 kB
Anonymous:             0 kB
8000-9000 r--p 00000000 00:00 0   [vvar]
Rss:                   4 kB
Anonymous:             0 kB
9000-a000 r--p 00000000 fd:01 46   /usr/lib/libc.so.6
Rss:                   0 kB
Anonymous:             0 kB
a000-c000 r--p 00000000 fd:01 47   /var/lib/wdp/compiled/a b.cwasm
Rss:                   8 kB
Anonymous:             0 kB
";
        assert_eq!(
            droppable(smaps),
            vec![
                Region {
                    start: 0x1000,
                    len: 0x2000,
                    rss_kib: 8
                },
                Region {
                    start: 0xa000,
                    len: 0x2000,
                    rss_kib: 8
                }
            ]
        );
    }
}
