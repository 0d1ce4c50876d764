//! Compiles the CSI protocol into Rust (messages and the gRPC services) with protox, a
//! protobuf compiler in Rust, so a build needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/csi/csi.proto");
    let descriptors = protox::compile(["csi.proto"], ["src/csi"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
