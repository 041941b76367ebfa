//! TLS: the install's CA, leaf certificates minted from it, and server configs per host.

mod ca;
mod cache;
mod leaf;

use std::path::PathBuf;
use std::sync::Arc;

pub use ca::{CaOrigin, CertificateAuthority};
pub use cache::{CertStore, DEFAULT_CAPACITY};
pub use leaf::{LeafMinter, SERVER_ALPN};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("CA at {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    #[error("TLS setup failed: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("`{host}` is not a host name a certificate can name")]
    BadHost { host: String },
}

/// The crypto provider every TLS config of ours uses, named explicitly so nothing depends on a
/// process-wide default being installed.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A random positive 16-byte serial number (RFC 5280 allows up to 20 octets).
pub(crate) fn random_serial() -> rcgen::SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive as a DER integer
    bytes[0] |= 0x01; // and never shortened by a leading zero
    rcgen::SerialNumber::from_slice(&bytes)
}
