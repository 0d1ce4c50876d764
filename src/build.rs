//! Compiles the gRPC protocols hydrator speaks into Rust with protox, a protobuf compiler in
//! Rust, so a build needs no `protoc` on the machine: CSI (`src/csi/csi.proto`, served) and
//! Dragonfly's dfdaemon (`src/p2p/*.proto`, a client only). The dfdaemon's server side is
//! generated too, into `OUT_DIR/test-server/`, for the test tree's stand-in; the binary never
//! includes it.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/csi/csi.proto");
    println!("cargo:rerun-if-changed=src/p2p/dfdaemon.proto");
    println!("cargo:rerun-if-changed=src/p2p/common.proto");
    let csi = protox::compile(["csi.proto"], ["src/csi"])?;
    tonic_prost_build::configure().compile_fds(csi)?;
    let dfdaemon = protox::compile(["dfdaemon.proto"], ["src/p2p"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(dfdaemon.clone())?;
    let test_server = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("test-server");
    std::fs::create_dir_all(&test_server)?;
    tonic_prost_build::configure()
        .build_client(false)
        .generate_default_stubs(true)
        .out_dir(test_server)
        .compile_fds(dfdaemon)?;
    Ok(())
}
