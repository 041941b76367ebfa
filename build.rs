//! Compiles `proto/` with protox (no `protoc` binary needed) and prost.
//! The encoded descriptor set is kept in OUT_DIR so tests can compare it with the schema tables.

use std::path::PathBuf;

const FILES: &[&str] = &[
    "proto/agent/v1/agent.proto",
    "proto/aiserver/v1/agent_deps.proto",
    "proto/aiserver/v1/aiserver.proto",
    "proto/aiserver/v1/cmdk.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for f in FILES {
        println!("cargo:rerun-if-changed={f}");
    }
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let fds = protox::compile(FILES, ["proto"])?;
    std::fs::write(
        out.join("descriptors.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    prost_build::Config::new()
        // Blobs and frames are passed around without copying.
        .bytes(["."])
        .compile_fds(fds)?;
    Ok(())
}
