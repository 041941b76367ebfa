//! TLS: the install's CA, leaf certificates minted from it, and server configs per host.

mod ca;

use std::path::PathBuf;

pub use ca::{CaOrigin, CertificateAuthority};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("CA at {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// A random positive 16-byte serial number (RFC 5280 allows up to 20 octets).
pub(crate) fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive as a DER integer
    bytes[0] |= 0x01; // and never shortened by a leading zero
    rcgen::SerialNumber::from_slice(&bytes)
}
