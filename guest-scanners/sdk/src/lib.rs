//! `wdp-guest`: the SDK for wdp device scanners and hooks written in Rust.
//!
//! A guest is a WebAssembly component (`cargo build --target wasm32-wasip2`) that implements one
//! of the worlds of the WIT package `wdp:device-plugin@0.1.0` (see `wit/device-plugin.wit`). This
//! crate holds the wit-bindgen bindings for every world (sharing one set of types), the export
//! macros, and the helpers a scanner needs so that it stays short:
//!
//! * [`sysfs`]: read attributes, symlink names and class directories under `/sys` (std::fs);
//! * [`devfs`]: list, stat and glob `/dev` through the host's metadata-only `devfs` interface;
//! * [`hostfs`]: both behind one trait ([`hostfs::HostFs`]), with an in-memory fake for unit
//!   tests ([`hostfs::FakeFs`]) and the one `realpath` walk;
//! * [`pci`]: PCI addresses, ids, bound drivers and IOMMU groups;
//! * [`usb`]: attached USB devices (ids, serial numbers, `/dev/bus/usb` nodes);
//! * [`envs`]: per-device numbered envs (`QAT3`), renumbered per container by a post-allocator;
//! * [`notes`]: problems a scanner reports once per episode, not once per scan;
//! * [`health`]: devices that vanish are reported Unhealthy until they come back;
//! * [`tree`]: build [`DeviceInfo`] values and a [`DeviceTree`];
//! * [`scan`]: the scan loop ([`run`]): scan, notify when the tree changed, wait for a change;
//! * [`config`] and [`json`]: read configuration from environment variables, with error messages
//!   that name the variable, the value and what would be valid.
//!
//! A complete scanner:
//!
//! ```no_run
//! use wdp_guest::{DeviceInfo, DeviceTree, TreeBuilder, devfs};
//!
//! fn scan_once() -> Result<DeviceTree, String> {
//!     let mut tree = TreeBuilder::new();
//!     for m in devfs::glob_dev("/dev/ttyUSB*")? {
//!         let id = wdp_guest::tree::id_from_path(&m.path);
//!         tree.add("serial", id, DeviceInfo::new().node(&m.path, &m.path, "rw"));
//!     }
//!     Ok(tree.build())
//! }
//!
//! wdp_guest::export_scan_loop!(scan_once);
//! # fn main() {}
//! ```
//!
//! Export macros (each takes a unit struct implementing the matching trait):
//!
//! | macro                                  | world                        | trait                    |
//! |----------------------------------------|------------------------------|--------------------------|
//! | [`export_scanner!`]                    | `scanner-plugin`             | [`Scanner`]              |
//! | [`export_post_allocator!`]             | `post-allocator-plugin`      | [`PostAllocator`]        |
//! | [`export_device_plugin!`]              | `device-plugin`              | both of the above        |
//! | [`export_preferred_allocator!`]        | `preferred-allocator-plugin` | [`PreferredAllocator`]   |
//! | [`export_pre_starter!`]                | `pre-starter-plugin`         | [`PreStarter`]           |
//! | [`export_scan_loop!`] (a function)     | `scanner-plugin`             | generated, calls [`run`] |
//!
//! A component exports exactly what its macro names: the bindings of every world live in this
//! crate with their exports removed, and each export macro adds the full world of its own export
//! to the component that invokes it.
//!
//! Off wasm (for `cargo test` on the build machine) every host import is an `unreachable!()` stub:
//! keep the logic worth testing in plain functions that take their inputs as arguments, as the
//! helpers here do (e.g. [`pathglob::glob_with`], [`scan::ChangeFilter`], [`config::parse_u32`]).

pub mod config;
pub mod devfs;
pub mod envs;
pub mod health;
pub mod hostfs;
pub mod json;
pub mod notes;
pub mod pathglob;
pub mod pci;
pub mod scan;
pub mod sysfs;
pub mod tree;
pub mod usb;

/// The raw wit-bindgen bindings, one module per world. All worlds share the types of
/// `bindings::scanner::wdp::device_plugin::types` (re-exported as [`types`]). Prefer the
/// re-exports and helpers at the crate root; these are here for what they do not cover.
pub mod bindings {
    /// World `scanner-plugin`: imports `notifier` and `devfs`, exports `scanner`.
    pub mod scanner {
        wit_bindgen::generate!({
            path: "contract",
            world: "scanner-plugin",
            additional_derives: [PartialEq, Eq],
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "wdp_guest::bindings::scanner",
        });
    }

    /// World `post-allocator-plugin`: exports `post-allocator`.
    pub mod post_allocator {
        wit_bindgen::generate!({
            path: "contract",
            world: "post-allocator-plugin",
            additional_derives: [PartialEq, Eq],
            with: {
                "wdp:device-plugin/types@0.1.0": crate::bindings::scanner::wdp::device_plugin::types,
            },
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "wdp_guest::bindings::post_allocator",
        });
    }

    /// World `preferred-allocator-plugin`: exports `preferred-allocator`.
    pub mod preferred_allocator {
        wit_bindgen::generate!({
            path: "contract",
            world: "preferred-allocator-plugin",
            additional_derives: [PartialEq, Eq],
            with: {
                "wdp:device-plugin/types@0.1.0": crate::bindings::scanner::wdp::device_plugin::types,
            },
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "wdp_guest::bindings::preferred_allocator",
        });
    }

    /// World `pre-starter-plugin`: exports `pre-starter`.
    pub mod pre_starter {
        wit_bindgen::generate!({
            path: "contract",
            world: "pre-starter-plugin",
            additional_derives: [PartialEq, Eq],
            pub_export_macro: true,
            export_macro_name: "export",
            default_bindings_module: "wdp_guest::bindings::pre_starter",
        });
    }
}

/// The WIT data model (`wdp:device-plugin/types`), shared by every world.
pub mod types {
    pub use crate::bindings::scanner::wdp::device_plugin::types::*;
}

pub use types::{
    ContainerAllocateRequest, ContainerAllocateResponse, ContainerPreferredAllocationRequest,
    Device, DeviceGroup, DeviceInfo, DeviceSpec, DeviceTree, Health, Mount,
};

/// The `scanner` export: `fn scan() -> Result<(), String>`, called once; loop inside (see [`run`]).
pub use bindings::scanner::exports::wdp::device_plugin::scanner::Guest as Scanner;

/// The `post-allocator` export: rewrite the host's default Allocate responses.
pub use bindings::post_allocator::exports::wdp::device_plugin::post_allocator::Guest as PostAllocator;

/// The `preferred-allocator` export: answer kubelet's GetPreferredAllocation.
pub use bindings::preferred_allocator::exports::wdp::device_plugin::preferred_allocator::Guest as PreferredAllocator;

/// The `pre-starter` export: answer kubelet's PreStartContainer.
pub use bindings::pre_starter::exports::wdp::device_plugin::pre_starter::Guest as PreStarter;

pub use scan::{notify, run};
pub use tree::TreeBuilder;

/// Exports a [`Scanner`] implementation as the component's `scanner` (world `scanner-plugin`).
///
/// `wdp_guest::export_scanner!(MyScanner);` where `struct MyScanner;` implements
/// [`wdp_guest::Scanner`](crate::Scanner). Invoke it once, at the crate root of a `cdylib`.
#[macro_export]
macro_rules! export_scanner {
    ($ty:ident) => {
        $crate::bindings::scanner::export!($ty with_types_in $crate::bindings::scanner);
    };
}

/// Exports a [`PostAllocator`] implementation as the component's `post-allocator` (world
/// `post-allocator-plugin`): the component then exports nothing else.
#[macro_export]
macro_rules! export_post_allocator {
    ($ty:ident) => {
        $crate::bindings::post_allocator::export!($ty with_types_in $crate::bindings::post_allocator);
    };
}

/// Exports both `scanner` and `post-allocator` from one type (world `device-plugin`): the type
/// implements [`Scanner`] and [`PostAllocator`].
///
/// ```no_run
/// use wdp_guest::{ContainerAllocateRequest as Req, ContainerAllocateResponse as Resp};
///
/// struct Plugin;
/// impl wdp_guest::Scanner for Plugin {
///     fn scan() -> Result<(), String> {
///         wdp_guest::run(|| Ok(Vec::new()))
///     }
/// }
/// impl wdp_guest::PostAllocator for Plugin {
///     fn post_allocate(_: String, _: Vec<Req>, r: Vec<Resp>) -> Result<Vec<Resp>, String> {
///         Ok(r)
///     }
/// }
/// wdp_guest::export_device_plugin!(Plugin);
/// # fn main() {}
/// ```
#[macro_export]
macro_rules! export_device_plugin {
    ($ty:ident) => {
        $crate::export_scanner!($ty);
        $crate::export_post_allocator!($ty);
    };
}

/// Exports a [`PreferredAllocator`] implementation (world `preferred-allocator-plugin`).
#[macro_export]
macro_rules! export_preferred_allocator {
    ($ty:ident) => {
        $crate::bindings::preferred_allocator::export!(
            $ty with_types_in $crate::bindings::preferred_allocator
        );
    };
}

/// Exports a [`PreStarter`] implementation (world `pre-starter-plugin`).
#[macro_export]
macro_rules! export_pre_starter {
    ($ty:ident) => {
        $crate::bindings::pre_starter::export!($ty with_types_in $crate::bindings::pre_starter);
    };
}

/// The shortest scanner: `wdp_guest::export_scan_loop!(scan_once);` where
/// `fn scan_once() -> Result<DeviceTree, String>` describes the devices once. Defines a hidden
/// scanner type whose `scan` is [`run`]`(scan_once)` and exports it (world `scanner-plugin`).
#[macro_export]
macro_rules! export_scan_loop {
    ($scan:path) => {
        #[doc(hidden)]
        pub struct __WdpScanLoop;
        impl $crate::Scanner for __WdpScanLoop {
            fn scan() -> ::core::result::Result<(), ::std::string::String> {
                $crate::run($scan)
            }
        }
        $crate::export_scanner!(__WdpScanLoop);
    };
}
