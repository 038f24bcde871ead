//! `notifier.notify`, `notify-with-attributes` and `notify-changes`, lifted by the host within
//! the guest's memory limit.
//!
//! wasmtime's generated bindings lift a call's arguments into host `String`s and `Vec`s before
//! the host function runs, copying every string on its own. A list entry is a pointer and a
//! length, so a guest can point a million entries at the same 64 KiB of its memory: its 16 MiB
//! would become 64 GB of host strings before any rule looks. So these functions are shadowed in
//! the linker with ones that take lazy handles into guest memory ([`WasmList`], [`WasmStr`]) and
//! copy out of them piece by piece, charging each allocation, as [`crate::footprint`] counts it,
//! against the guest's memory limit *before* making it. A tree that would exceed it is never
//! lifted: the guest is stopped (rule `tree-host-memory`), having held at most its limit.

use std::mem::size_of;

use wasmtime::component::{ComponentType, Lift, Linker, WasmList, WasmStr};
use wasmtime::{AsContext, StoreContextMut};

use super::GuestState;
use super::state::Stopped;
use crate::bindings::types;
use crate::footprint::heap;

/// The notifier instance the host defines; guests importing 0.1.0 or 0.1.1 are matched to it by
/// semver.
const NOTIFIER: &str = "wdp:device-plugin/notifier@0.1.2";

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawGroup {
    #[component(name = "dev-type")]
    dev_type: WasmStr,
    devices: WasmList<RawDevice>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawGroupChanges {
    #[component(name = "dev-type")]
    dev_type: WasmStr,
    changed: WasmList<RawDevice>,
    removed: WasmList<WasmStr>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawDevice {
    id: WasmStr,
    info: RawInfo,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawInfo {
    health: types::Health,
    nodes: WasmList<RawSpec>,
    mounts: WasmList<RawMount>,
    envs: WasmList<(WasmStr, WasmStr)>,
    annotations: WasmList<(WasmStr, WasmStr)>,
    #[component(name = "numa-nodes")]
    numa_nodes: Option<WasmList<u32>>,
    #[component(name = "cdi-devices")]
    cdi_devices: WasmList<WasmStr>,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawSpec {
    #[component(name = "container-path")]
    container_path: WasmStr,
    #[component(name = "host-path")]
    host_path: WasmStr,
    permissions: WasmStr,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawMount {
    #[component(name = "container-path")]
    container_path: WasmStr,
    #[component(name = "host-path")]
    host_path: WasmStr,
    #[component(name = "read-only")]
    read_only: bool,
}

#[derive(ComponentType, Lift)]
#[component(record)]
struct RawAttributes {
    #[component(name = "dev-type")]
    dev_type: WasmStr,
    id: WasmStr,
    attributes: WasmList<(WasmStr, RawValue)>,
    capacities: WasmList<(WasmStr, WasmStr)>,
}

#[derive(ComponentType, Lift)]
#[component(variant)]
enum RawValue {
    #[component(name = "boolean")]
    Boolean(bool),
    #[component(name = "int")]
    Int(i64),
    #[component(name = "text")]
    Text(WasmStr),
    #[component(name = "version")]
    Version(WasmStr),
}

/// Shadows the generated `notify`, `notify-with-attributes` and `notify-changes` in `linker`
/// (which already has the scanner world linked).
pub fn install(linker: &mut Linker<GuestState>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut instance = linker.instance(NOTIFIER)?;
    instance.func_wrap_async("notify", |mut store, (tree,): (WasmList<RawGroup>,)| {
        Box::new(async move {
            let (tree, attributes, bytes) = lift(&mut store, &tree, None)?;
            store.data_mut().notified(tree, attributes, bytes).await
        })
    })?;
    instance.func_wrap_async(
        "notify-with-attributes",
        |mut store, (tree, attributes): (WasmList<RawGroup>, WasmList<RawAttributes>)| {
            Box::new(async move {
                let (tree, attributes, bytes) = lift(&mut store, &tree, Some(&attributes))?;
                store.data_mut().notified(tree, attributes, bytes).await
            })
        },
    )?;
    instance.func_wrap_async(
        "notify-changes",
        |mut store, (changes, attributes): (WasmList<RawGroupChanges>, WasmList<RawAttributes>)| {
            Box::new(async move {
                let (changes, attributes, bytes) = lift_changes(&mut store, &changes, &attributes)?;
                let applied = store.data_mut().changed(changes, attributes, bytes).await?;
                Ok((applied,))
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

type Store<'s, 'a> = &'s mut StoreContextMut<'a, GuestState>;

/// What the lifted tree holds so far, and the guest's limit it may not pass.
struct Charge {
    spent: usize,
    max: usize,
}

impl Charge {
    fn take(&mut self, bytes: usize) -> wasmtime::Result<()> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > self.max {
            return Err(Stopped::TreeHostMemory { max: self.max }.into());
        }
        Ok(())
    }
}

/// The tree and attributes, and what their host form was charged.
fn lift(
    store: Store<'_, '_>,
    tree: &WasmList<RawGroup>,
    attributes: Option<&WasmList<RawAttributes>>,
) -> wasmtime::Result<(types::DeviceTree, Vec<types::DeviceAttributes>, usize)> {
    let max = usize::try_from(store.data().guest.limits.memory).unwrap_or(usize::MAX);
    let mut charge = Charge { spent: 0, max };
    charge.take(size_of::<types::DeviceTree>() + size_of::<Vec<types::DeviceAttributes>>())?;
    let tree = list(store, &mut charge, tree, |s, c, g| {
        Ok(types::DeviceGroup {
            dev_type: text(s, c, &g.dev_type)?,
            devices: list(s, c, &g.devices, device)?,
        })
    })?;
    let attributes = match attributes {
        None => Vec::new(),
        Some(attributes) => device_attributes(store, &mut charge, attributes)?,
    };
    Ok((tree, attributes, charge.spent))
}

/// A guest's changes and their attributes, and what their host form was charged.
fn lift_changes(
    store: Store<'_, '_>,
    changes: &WasmList<RawGroupChanges>,
    attributes: &WasmList<RawAttributes>,
) -> wasmtime::Result<(
    Vec<types::GroupChanges>,
    Vec<types::DeviceAttributes>,
    usize,
)> {
    let max = usize::try_from(store.data().guest.limits.memory).unwrap_or(usize::MAX);
    let mut charge = Charge { spent: 0, max };
    charge
        .take(size_of::<Vec<types::GroupChanges>>() + size_of::<Vec<types::DeviceAttributes>>())?;
    let changes = list(store, &mut charge, changes, |s, c, g| {
        Ok(types::GroupChanges {
            dev_type: text(s, c, &g.dev_type)?,
            changed: list(s, c, &g.changed, device)?,
            removed: list(s, c, &g.removed, |s, c, id| text(s, c, &id))?,
        })
    })?;
    let attributes = device_attributes(store, &mut charge, attributes)?;
    Ok((changes, attributes, charge.spent))
}

fn device(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: RawDevice,
) -> wasmtime::Result<types::Device> {
    Ok(types::Device {
        id: text(store, charge, &raw.id)?,
        info: info(store, charge, &raw.info)?,
    })
}

fn device_attributes(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: &WasmList<RawAttributes>,
) -> wasmtime::Result<Vec<types::DeviceAttributes>> {
    list(store, charge, raw, |s, c, a| {
        Ok(types::DeviceAttributes {
            dev_type: text(s, c, &a.dev_type)?,
            id: text(s, c, &a.id)?,
            attributes: list(s, c, &a.attributes, |s, c, (name, value)| {
                Ok((text(s, c, &name)?, self::value(s, c, &value)?))
            })?,
            capacities: pairs(s, c, &a.capacities)?,
        })
    })
}

/// Copies a list out, its array charged before it is allocated.
fn list<R: Lift, O>(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: &WasmList<R>,
    mut each: impl FnMut(Store<'_, '_>, &mut Charge, R) -> wasmtime::Result<O>,
) -> wasmtime::Result<Vec<O>> {
    charge.take(heap(raw.len().saturating_mul(size_of::<O>())))?;
    let mut out = Vec::with_capacity(raw.len());
    for i in 0..raw.len() {
        let Some(item) = raw.get(&mut *store, i) else {
            break;
        };
        out.push(each(store, charge, item?)?);
    }
    Ok(out)
}

/// Copies a string out, charged before it is allocated (a UTF-8 guest string is validated in
/// place).
fn text(store: Store<'_, '_>, charge: &mut Charge, raw: &WasmStr) -> wasmtime::Result<String> {
    let s = raw.to_str(store.as_context())?;
    charge.take(heap(s.len()))?;
    Ok(s.into_owned())
}

fn pairs(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: &WasmList<(WasmStr, WasmStr)>,
) -> wasmtime::Result<Vec<(String, String)>> {
    list(store, charge, raw, |s, c, (a, b)| {
        Ok((text(s, c, &a)?, text(s, c, &b)?))
    })
}

fn value(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: &RawValue,
) -> wasmtime::Result<types::AttributeValue> {
    Ok(match raw {
        RawValue::Boolean(b) => types::AttributeValue::Boolean(*b),
        RawValue::Int(i) => types::AttributeValue::Int(*i),
        RawValue::Text(s) => types::AttributeValue::Text(text(store, charge, s)?),
        RawValue::Version(s) => types::AttributeValue::Version(text(store, charge, s)?),
    })
}

fn info(
    store: Store<'_, '_>,
    charge: &mut Charge,
    raw: &RawInfo,
) -> wasmtime::Result<types::DeviceInfo> {
    Ok(types::DeviceInfo {
        health: raw.health,
        nodes: list(store, charge, &raw.nodes, |s, c, n| {
            Ok(types::DeviceSpec {
                container_path: text(s, c, &n.container_path)?,
                host_path: text(s, c, &n.host_path)?,
                permissions: text(s, c, &n.permissions)?,
            })
        })?,
        mounts: list(store, charge, &raw.mounts, |s, c, m| {
            Ok(types::Mount {
                container_path: text(s, c, &m.container_path)?,
                host_path: text(s, c, &m.host_path)?,
                read_only: m.read_only,
            })
        })?,
        envs: pairs(store, charge, &raw.envs)?,
        annotations: pairs(store, charge, &raw.annotations)?,
        numa_nodes: match &raw.numa_nodes {
            None => None,
            Some(numa) => Some(list(store, charge, numa, |_, _, n| Ok(n))?),
        },
        cdi_devices: list(store, charge, &raw.cdi_devices, |s, c, d| text(s, c, &d))?,
    })
}
