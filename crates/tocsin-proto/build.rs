//! Generates the gRPC code from `proto/` with protox, a pure-Rust protobuf
//! compiler: no `protoc` needs to be installed.

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Read at run time, not baked in with `env!`: clones sharing one build
    // cache reuse one compiled build script, which must find this clone's
    // protos (a baked-in path named whichever clone compiled it first).
    let root = std::path::PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    let files = ["tocsin/v1/timer.proto", "tocsin/v1/raft.proto", "tocsin/v1/admin.proto"];
    let fds = protox::compile(files.iter().map(|f| root.join(f)), [&root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("tocsin_descriptor.bin"), fds.encode_to_vec())?;
    // `bytes` fields are `bytes::Bytes`: payloads pass from request to log to
    // record to delivery without copies.
    tonic_prost_build::configure().bytes(".").build_client(true).build_server(true).compile_fds(fds)?;
    println!("cargo:rerun-if-changed={}", root.display());
    Ok(())
}
