//! The Cursor wire schema (`agent.v1`, `aiserver.v1`), generated from `proto/` by `build.rs`.
//!
//! Generated code refers across packages as `super::super::…`, so the modules nest exactly as
//! the package names do.

pub mod inspect;
pub mod wire;

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod agent {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/agent.v1.rs"));
    }
}

#[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
pub mod aiserver {
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/aiserver.v1.rs"));
    }
}

/// The encoded `FileDescriptorSet` of everything in `proto/`, for reflection in tests and tools.
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptors.bin"));

/// A KV blob id: SHA-256 of the blob's bytes (Cursor's convention).
pub fn blob_id(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}
