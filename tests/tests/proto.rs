//! The kubelet API checked in as `crates/kubelet/src/v1beta1.rs` is exactly what prost and tonic
//! generate from `proto/deviceplugin.proto` with the versions in Cargo.lock. `make proto` (this
//! test with `WDP_WRITE_GENERATED=1`) rewrites the file after a change to the proto or an upgrade.

use std::path::Path;

#[test]
fn checked_in_kubelet_api_is_what_the_proto_generates() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the workspace");
    let proto_dir = root.join("proto");
    let checked_in = root.join("crates/kubelet/src/v1beta1.rs");

    let descriptors = protox::compile([proto_dir.join("deviceplugin.proto")], [&proto_dir])
        .expect("compile proto/deviceplugin.proto");
    let out = tempfile::tempdir().unwrap();
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        // Encoded once per update by the servers, with a type of its own (`list.rs`).
        .extern_path(
            ".v1beta1.ListAndWatchResponse",
            "crate::list::ListAndWatchResponse",
        )
        .out_dir(out.path())
        .compile_fds(descriptors)
        .expect("generate the Rust code");
    let generated = std::fs::read_to_string(out.path().join("v1beta1.rs")).unwrap();

    if std::env::var_os("WDP_WRITE_GENERATED").is_some() {
        std::fs::write(&checked_in, &generated).unwrap();
        eprintln!("wrote {}", checked_in.display());
        return;
    }
    let current = std::fs::read_to_string(&checked_in).unwrap_or_default();
    assert!(
        current == generated,
        "{} is not what {} generates ({} lines checked in, {} generated): run `make proto`",
        checked_in.display(),
        proto_dir.join("deviceplugin.proto").display(),
        current.lines().count(),
        generated.lines().count(),
    );
}
