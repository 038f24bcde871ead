//! Host bindings for the `wdp:device-plugin` worlds (`wit/`): the types every stage of the data
//! path speaks, in a module of their own so that each stage (sandbox, validation, allocation,
//! servers) imports them from here and none imports another stage just for its types.
//!
//! Each world gets its own `bindgen!` so a component is checked only against the exports it
//! claims (a scanner need not export `post-allocator`); the interfaces are generated once, in the
//! scanner world, and shared by the others through `with`.

// The generated items are the WIT's own: its comments document them where it has any.
#![allow(missing_docs)]

/// `scanner-plugin`: the imports every guest may use and the `scanner` export.
pub mod scanner {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "scanner-plugin",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// `post-allocator-plugin`: the `post-allocate` hook.
pub mod post_allocator {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "post-allocator-plugin",
        exports: { default: async },
        with: {
            "wdp:device-plugin/types": super::scanner::wdp::device_plugin::types,
        },
    });
}

/// `preferred-allocator-plugin`: the `get-preferred-allocation` hook.
pub mod preferred_allocator {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "preferred-allocator-plugin",
        exports: { default: async },
        with: {
            "wdp:device-plugin/types": super::scanner::wdp::device_plugin::types,
        },
    });
}

/// `pre-starter-plugin`: the `pre-start-container` hook.
pub mod pre_starter {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "pre-starter-plugin",
        exports: { default: async },
    });
}

/// WIT `hostfs` (0.1.1), named apart from the host's own [`crate::hostfs`] module it is served by.
pub use scanner::wdp::device_plugin::hostfs as wit_hostfs;
pub use scanner::wdp::device_plugin::{devfs, notifier, types};
