//! Compiles the gRPC protocols hydrator speaks into Rust with protox, a protobuf compiler in
//! Rust, so a build needs no `protoc` on the machine: CSI (`src/csi/csi.proto`, served), the kubelet's
//! plugin registration (`src/csi/registration.proto`, served) and
//! Dragonfly's dfdaemon (`src/p2p/dfdaemon.proto`, a client only). The server sides of the
//! dfdaemon and of Dragonfly's scheduler (`src/p2p/scheduler.proto`) are generated too, into
//! `OUT_DIR/test-server/`, for the test tree's stand-ins; the binary never includes them.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=src/csi/csi.proto");
    println!("cargo:rerun-if-changed=src/csi/registration.proto");
    println!("cargo:rerun-if-changed=src/p2p/dfdaemon.proto");
    println!("cargo:rerun-if-changed=src/p2p/common.proto");
    println!("cargo:rerun-if-changed=src/p2p/scheduler.proto");
    println!("cargo:rerun-if-changed=src/p2p/errordetails.proto");
    let csi = protox::compile(["csi.proto", "registration.proto"], ["src/csi"])?;
    tonic_prost_build::configure().compile_fds(csi)?;
    let dfdaemon = protox::compile(["dfdaemon.proto"], ["src/p2p"])?;
    tonic_prost_build::configure()
        .build_server(false)
        .compile_fds(dfdaemon)?;
    let test_server = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join("test-server");
    std::fs::create_dir_all(&test_server)?;
    tonic_prost_build::configure()
        .build_client(false)
        .generate_default_stubs(true)
        .out_dir(test_server)
        .compile_fds(protox::compile(
            ["dfdaemon.proto", "scheduler.proto"],
            ["src/p2p"],
        )?)?;
    Ok(())
}
