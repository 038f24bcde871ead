//! `test_hooks`: a post-allocate hook for the host's tests (world `post-allocator-plugin`; it
//! exports nothing else).
//!
//! Env `HOOK_MODE` (default `renumber`):
//!
//! * `renumber`: like Intel's QAT/VFIO plugins, within each container response every env whose
//!   key is `<PREFIX><digits>` is renamed to `<PREFIX>0`, `<PREFIX>1`, ... in the order of the
//!   original keys (by number, then by key), per prefix; values and positions are kept, other envs
//!   are untouched. Env `HOOK_PREFIX`, when set, limits this to that one prefix.
//! * `fail`: returns `Err("hook refused")`.
//! * `hang`: spins forever.
//! * `panic`: `panic!("hook panic")`.
//! * `echo`: returns the responses unchanged.
//! * `residue`: looks through its whole linear memory for what an earlier call in the same memory
//!   would have left there (each requested device ID with its bits inverted, a form no request
//!   carries), answers how many it found as env `RESIDUE` of the first response, then leaves
//!   the inverted IDs behind, never freed: in a static, and repeated through a heap buffer of
//!   4 MiB (past what a host may keep resident between instances). A fresh instance finds 0.

use std::hint::black_box;
use wdp_guest::{ContainerAllocateRequest, ContainerAllocateResponse, config};

/// Every value of `HOOK_MODE`.
pub const MODES: [&str; 9] = [
    "renumber",
    "fail",
    "hang",
    "panic",
    "echo",
    "mount-root",
    "node-outside-dev",
    "wrong-count",
    "residue",
];

/// What `residue` leaves in static memory.
static LEFT_IN_STATIC: std::sync::Mutex<[u8; 256]> = std::sync::Mutex::new([0; 256]);

/// How many times each of `ids`, bits inverted, occurs in this instance's linear memory.
#[cfg(target_arch = "wasm32")]
fn residue_of(ids: &[&[u8]]) -> usize {
    let size = core::arch::wasm32::memory_size(0) * 65536;
    let byte = |at: usize| {
        // Every address below the memory's size is readable in wasm; volatile so that the
        // bytes are read from memory as they are (address 0 is never read: it starts at 1).
        unsafe { core::ptr::read_volatile(core::ptr::with_exposed_provenance::<u8>(at)) }
    };
    let mut found = 0;
    for id in ids.iter().filter(|id| !id.is_empty()) {
        // The inverted ID is compared byte by byte, never built: the search leaves no copy.
        found += (1..size.saturating_sub(id.len()))
            .filter(|&at| id.iter().enumerate().all(|(j, &b)| byte(at + j) == !b))
            .count();
    }
    found
}

#[cfg(not(target_arch = "wasm32"))]
fn residue_of(_ids: &[&[u8]]) -> usize {
    0
}

/// The `residue` mode's leavings: `ids` inverted, in a static and through a leaked heap buffer.
fn leave(ids: &[&[u8]]) {
    let inverted: Vec<u8> = ids.iter().flat_map(|id| id.iter().map(|b| !b)).collect();
    if let Ok(mut left) = LEFT_IN_STATIC.lock() {
        let n = inverted.len().min(left.len());
        left[..n].copy_from_slice(&inverted[..n]);
    }
    if !inverted.is_empty() {
        let heap: Vec<u8> = inverted.iter().copied().cycle().take(4 << 20).collect();
        std::mem::forget(heap);
    }
}

/// Splits `key` into a non-empty prefix and its trailing decimal number (`QAT12` -> `("QAT",
/// 12)`); None when there are no trailing digits, nothing before them, or the number is too big.
pub fn split_numbered(key: &str) -> Option<(&str, u64)> {
    let prefix = key.trim_end_matches(|c: char| c.is_ascii_digit());
    if prefix.is_empty() || prefix.len() == key.len() {
        return None;
    }
    Some((prefix, key[prefix.len()..].parse().ok()?))
}

/// Renumbers the `<PREFIX><digits>` keys of `envs` (only `only_prefix` when given) to
/// `<PREFIX>0..`, per prefix, in order of (number, original key); positions and values are kept.
pub fn renumber(
    mut envs: Vec<(String, String)>,
    only_prefix: Option<&str>,
) -> Vec<(String, String)> {
    // (index, prefix, number, original key)
    let mut numbered: Vec<(usize, String, u64, String)> = envs
        .iter()
        .enumerate()
        .filter_map(|(i, (k, _))| {
            let (prefix, n) = split_numbered(k)?;
            if only_prefix.is_some_and(|p| p != prefix) {
                return None;
            }
            Some((i, prefix.to_string(), n, k.clone()))
        })
        .collect();
    numbered.sort_by(|a, b| (&a.1, a.2, &a.3).cmp(&(&b.1, b.2, &b.3)));
    let mut rank = 0usize;
    for j in 0..numbered.len() {
        if j > 0 && numbered[j].1 != numbered[j - 1].1 {
            rank = 0;
        }
        let (i, prefix) = (numbered[j].0, &numbered[j].1);
        envs[i].0 = format!("{prefix}{rank}");
        rank += 1;
    }
    envs
}

struct Hooks;

impl wdp_guest::PostAllocator for Hooks {
    fn post_allocate(
        _dev_type: String,
        requests: Vec<ContainerAllocateRequest>,
        responses: Vec<ContainerAllocateResponse>,
    ) -> Result<Vec<ContainerAllocateResponse>, String> {
        match config::env_choice("HOOK_MODE", "renumber", &MODES)? {
            "renumber" => {
                let prefix = config::env_var("HOOK_PREFIX");
                Ok(responses
                    .into_iter()
                    .map(|mut r| {
                        r.envs = renumber(std::mem::take(&mut r.envs), prefix.as_deref());
                        r
                    })
                    .collect())
            }
            "fail" => Err("hook refused".into()),
            "hang" => {
                let mut x = 0u64;
                loop {
                    x = black_box(x.wrapping_add(1));
                }
            }
            "panic" => panic!("hook panic"),
            "echo" => Ok(responses),
            // Attacks on the host's output policy: each answer must fail that Allocate only.
            "mount-root" => Ok(responses
                .into_iter()
                .map(|mut r| {
                    r.mounts.push(wdp_guest::types::Mount {
                        container_path: "/host".into(),
                        host_path: "/".into(),
                        read_only: false,
                    });
                    r
                })
                .collect()),
            "node-outside-dev" => Ok(responses
                .into_iter()
                .map(|mut r| {
                    r.devices.push(wdp_guest::types::DeviceSpec {
                        container_path: "/dev/sda".into(),
                        host_path: "/etc/shadow".into(),
                        permissions: "rw".into(),
                    });
                    r
                })
                .collect()),
            "wrong-count" => Ok(Vec::new()),
            "residue" => {
                let ids: Vec<&[u8]> = requests
                    .iter()
                    .flat_map(|r| r.device_ids.iter().map(|id| id.as_bytes()))
                    .collect();
                let found = residue_of(&ids);
                leave(&ids);
                let mut responses = responses;
                if let Some(first) = responses.first_mut() {
                    first.envs.push(("RESIDUE".into(), found.to_string()));
                }
                Ok(responses)
            }
            other => Err(format!("HOOK_MODE={other:?} is not handled")),
        }
    }
}

wdp_guest::export_post_allocator!(Hooks);

#[cfg(test)]
mod tests {
    use super::*;

    fn envs(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn splits() {
        assert_eq!(split_numbered("QAT12"), Some(("QAT", 12)));
        assert_eq!(split_numbered("VFIO_BDF1"), Some(("VFIO_BDF", 1)));
        assert_eq!(split_numbered("QAT"), None);
        assert_eq!(split_numbered("12"), None);
        assert_eq!(split_numbered(""), None);
        assert_eq!(split_numbered("X99999999999999999999999"), None);
    }

    #[test]
    fn renumbers_per_prefix_in_key_order() {
        let got = renumber(
            envs(&[
                ("QAT10", "0000:3d:01.2"),
                ("OTHER", "x"),
                ("QAT2", "0000:3d:01.1"),
                ("VFIO_BDF5", "b"),
                ("QAT3", "0000:3d:01.0"),
                ("VFIO_BDF1", "a"),
            ]),
            None,
        );
        assert_eq!(
            got,
            envs(&[
                ("QAT2", "0000:3d:01.2"),
                ("OTHER", "x"),
                ("QAT0", "0000:3d:01.1"),
                ("VFIO_BDF1", "b"),
                ("QAT1", "0000:3d:01.0"),
                ("VFIO_BDF0", "a"),
            ])
        );
    }

    #[test]
    fn prefix_filter_and_passthrough() {
        let got = renumber(envs(&[("QAT5", "a"), ("PY3", "b")]), Some("QAT"));
        assert_eq!(got, envs(&[("QAT0", "a"), ("PY3", "b")]));
        assert!(renumber(vec![], None).is_empty());
        assert_eq!(renumber(envs(&[("A", "1")]), None), envs(&[("A", "1")]));
    }
}
