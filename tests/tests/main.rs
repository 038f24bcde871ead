//! wdp's integration tests, in one test binary (`cargo test -p wdp-tests --test integration`):
//! wdp and wasmtime are linked once, not once per topic. Each topic is a module; a test's name
//! says its topic (`kubelet::...`, `catalogue::gpu::...`), and `-- kubelet::` runs one topic.
//!
//! All tests share one process and run in parallel threads, so none may change what is
//! process-wide: no environment variable is set (the ones read, `WDP_WRITE_GENERATED` in
//! `proto` and `WDP_SOAK_*` in `soak`, are the caller's), the working directory stays where it
//! is, and what needs a mount namespace or dropped privileges gets it in a child process (podman
//! in `cdi_podman` enters its namespace between fork and exec; `deploy` runs wdp under
//! `unshare` and `setpriv`), or in a thread of its own that ends with it (`image` makes its
//! probes from a thread that joins the container's network namespace). Every `wdp run` is a
//! child process of its own, and every in-process sandbox reads a fixture of its own. What is
//! shared is machine-wide anyway and was before: the kernel uevent `catalogue::qat` makes
//! reaches every listener on the machine, and the compile caches under target/ are written by
//! concurrent tests by design.

mod attacks;
mod attacks_hostfs;
mod attacks_output;
mod authoring;
mod book;
mod catalogue;
mod cdi_podman;
mod changes;
mod contract_minor;
mod deploy;
mod disk_faults;
mod dra;
mod dra_catalogue;
mod examples;
mod faults;
mod first_run;
mod image;
mod kubelet;
mod languages;
mod node;
mod observability;
mod oci;
mod precompiled;
mod proto;
mod release;
mod reload;
mod resident;
mod sandbox;
mod scan_cli;
mod snapshot;
mod soak;

/// With `autotests = false` cargo builds only this file and the modules it names: a test file
/// added beside it without a `mod` line here would never run. This fails instead.
#[test]
fn every_test_file_is_a_module() {
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let declared: Vec<String> = include_str!("main.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&here).expect("read tests/tests") {
        let path = entry.expect("a directory entry").path();
        let module = if path.is_dir() {
            path.join("mod.rs")
                .exists()
                .then(|| path.file_name().map(|n| n.to_string_lossy().into_owned()))
                .flatten()
        } else if path.extension().is_some_and(|e| e == "rs") {
            path.file_stem().map(|n| n.to_string_lossy().into_owned())
        } else {
            None
        };
        if let Some(module) = module
            && module != "main"
            && !declared.contains(&module)
        {
            missing.push(module);
        }
    }
    assert!(
        missing.is_empty(),
        "test files without a `mod` line in tests/tests/main.rs: {missing:?}"
    );
}
