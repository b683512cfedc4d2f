//! Compiles `proto/` and the vendored kubelet protos (`vendor/kubelet/`) with protox (pure Rust:
//! no system `protoc`) and generates the tonic code.

use std::path::PathBuf;

/// The kubelet's plugin protos, vendored from kubernetes/kubelet (see `vendor/kubelet/README.md`).
const KUBELET: [&str; 3] = [
    "pkg/apis/pluginregistration/v1/api.proto",
    "pkg/apis/dra/v1/api.proto",
    "pkg/apis/dra/v1beta1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/gpuwarden/v1/gpuwarden.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").ok_or("OUT_DIR not set")?);
    // The encoded descriptors serve gRPC reflection.
    std::fs::write(
        out.join("gpuwarden_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // No transport constructors: `AgentServiceClient::connect` would clash with the `Connect`
    // RPC; clients are made with `::new(channel)`.
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(fds)?;

    // The kubelet's files import nothing, so they compile as fetched, from their own root.
    for file in KUBELET {
        println!("cargo:rerun-if-changed=vendor/kubelet/{file}");
    }
    let kubelet = protox::compile(KUBELET, ["vendor/kubelet"])?;
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(kubelet)?;
    Ok(())
}
