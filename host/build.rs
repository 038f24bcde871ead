//! Generates the kubelet Device Plugin API (v1beta1) from `proto/` with protox, a pure-Rust
//! protobuf compiler, so no system `protoc` is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_dir = "../proto";
    let file = format!("{proto_dir}/deviceplugin.proto");
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([&file], [proto_dir])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(descriptors)?;
    Ok(())
}
