//! An attack on how the host copies a notified tree out of the guest (`lift-alias`).
//!
//! The canonical ABI passes a string as a pointer and a length, so the entries of a list may all
//! point at the same bytes: the guest's memory holds them once, a host that copies each entry
//! into a string of its own holds them once per entry. `lift-alias` first notifies a good tree
//! (dev-type `good`, device `g`), then, through the raw `notify` import, one group `alias` of one
//! device `a` whose `cdi-devices` are `ENTRIES` (default 100,000) entries all pointing at the
//! same `BYTES` (default 65,536) bytes of `a`: about 800 KiB of guest memory, 6.5 GB as host
//! strings. The host must refuse it without copying it out; the call returns only if it did not.
//!
//! `read-alias` does the same to any other import: one `hostfs.read-files` call of `ENTRIES`
//! paths, all the same `BYTES` bytes.

use wdp_guest::{config, notify};

use crate::single;

/// The attacks of this module, as `ATTACK` names them.
pub const LIFT_ATTACKS: [&str; 2] = ["lift-alias", "read-alias"];

// The raw canonical-ABI import behind `notifier.notify(list<device-group>)`: (pointer, length).
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wdp:device-plugin/notifier@0.1.2")]
unsafe extern "C" {
    #[link_name = "notify"]
    fn raw_notify(groups: *const u8, len: usize);
}

// The raw canonical-ABI import behind `hostfs.read-files(list<string>)`: (pointer, length, the
// return area).
#[cfg(target_arch = "wasm32")]
#[link(wasm_import_module = "wdp:device-plugin/hostfs@0.1.2")]
unsafe extern "C" {
    #[link_name = "read-files"]
    fn raw_read_files(paths: *const u8, len: usize, ret: *mut u8);
}

/// Runs `attack` (one of [`LIFT_ATTACKS`]).
pub fn run(attack: &str) -> Result<(), String> {
    match attack {
        "lift-alias" | "read-alias" => {
            let entries = config::env_u32("ENTRIES", 100_000, 1..=1_000_000)? as usize;
            let bytes = config::env_u32("BYTES", 65_536, 1..=1 << 20)? as usize;
            notify(&single("good", "g"));
            if attack == "lift-alias" {
                alias(entries, bytes);
            } else {
                read_alias(entries, bytes);
            }
            Err("LEAKED: the host lifted aliased arguments".into())
        }
        other => Err(format!("ATTACK={other:?} is not a lift attack")),
    }
}

/// A device record `a` whose `cdi-devices` are `cdi`, as the canonical ABI lays it out: id, then
/// device-info (health, nodes, mounts, envs, annotations, numa-nodes: option<list<u32>>,
/// cdi-devices), 64 bytes.
#[cfg(target_arch = "wasm32")]
pub(crate) fn aliased_device(cdi: &[[u32; 2]]) -> [u32; 16] {
    let id: &'static str = "a";
    let mut device = [0u32; 16];
    device[0] = id.as_ptr() as u32;
    device[1] = id.len() as u32;
    device[14] = cdi.as_ptr() as u32;
    device[15] = cdi.len() as u32;
    device
}

#[cfg(target_arch = "wasm32")]
fn alias(entries: usize, bytes: usize) {
    use std::hint::black_box;
    let text = "a".repeat(bytes);
    // Every entry of `cdi-devices` is (pointer, length) of the same string.
    let cdi: Vec<[u32; 2]> = vec![[text.as_ptr() as u32, text.len() as u32]; entries];
    let device = aliased_device(&cdi);
    let dev_type = "alias";
    let group: [u32; 4] = [
        dev_type.as_ptr() as u32,
        dev_type.len() as u32,
        device.as_ptr() as u32,
        1,
    ];
    unsafe { raw_notify(black_box(group.as_ptr()).cast(), 1) };
    black_box((&text, &cdi, &device));
}

#[cfg(target_arch = "wasm32")]
fn read_alias(entries: usize, bytes: usize) {
    use std::hint::black_box;
    let path = format!("/sys/{}", "a".repeat(bytes.saturating_sub(5)));
    let paths: Vec<[u32; 2]> = vec![[path.as_ptr() as u32, path.len() as u32]; entries];
    let mut ret = [0u32; 4];
    unsafe {
        raw_read_files(
            black_box(paths.as_ptr()).cast(),
            paths.len(),
            ret.as_mut_ptr().cast(),
        )
    };
    black_box((&path, &paths));
}

#[cfg(not(target_arch = "wasm32"))]
fn alias(_: usize, _: usize) {
    unreachable!("host imports exist only on wasm")
}

#[cfg(not(target_arch = "wasm32"))]
fn read_alias(_: usize, _: usize) {
    unreachable!("host imports exist only on wasm")
}
