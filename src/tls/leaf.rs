//! Leaf certificates minted from the install's CA, one process-wide key pair.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::{CertifiedKey, SigningKey, SingleCertAndKey};
use rustls::ServerConfig;

use super::{CertificateAuthority, TlsError};

/// ALPN offered by every intercepted or direct TLS endpoint: the client picks.
pub const SERVER_ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// How far back `not_before` goes, so a client with a slightly slow clock still accepts a leaf.
const BACKDATE: time::Duration = time::Duration::days(1);
const VALIDITY: time::Duration = time::Duration::days(365);

/// Signs leaves with the CA. The leaf key pair is generated once per process, so minting for a
/// new host costs one signature, not a key generation.
pub struct LeafMinter {
    ca: Arc<CertificateAuthority>,
    key: KeyPair,
    signing_key: Arc<dyn SigningKey>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for LeafMinter {
    // The key pair is private material: never print it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeafMinter")
            .field("ca", &self.ca)
            .finish_non_exhaustive()
    }
}

impl LeafMinter {
    pub fn new(ca: Arc<CertificateAuthority>) -> Result<Self, TlsError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let provider = super::crypto_provider();
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing_key = provider.key_provider.load_private_key(der)?;
        Ok(LeafMinter {
            ca,
            key,
            signing_key,
            provider,
        })
    }

    /// A leaf for `host` (a DNS name or an IP literal), signed by the CA.
    pub fn mint(&self, host: &str) -> Result<CertificateDer<'static>, TlsError> {
        let host = normalize_host(host)?;
        let mut params = CertificateParams::new(vec![host.clone()])
            .map_err(|_| TlsError::BadHost { host: host.clone() })?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host.as_str());
        dn.push(DnType::OrganizationName, "cursor-byok");
        params.distinguished_name = dn;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - BACKDATE;
        params.not_after = now + VALIDITY;
        params.serial_number = Some(super::random_serial());
        // AKI helps clients build the chain; `is_ca` stays `NoCa`, so rcgen writes no SKI.
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&self.key, self.ca.issuer())?;
        Ok(cert.der().clone())
    }

    /// A ready server config presenting a fresh leaf for `host`, chained to the CA.
    pub fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, TlsError> {
        let leaf = self.mint(host)?;
        let chain = vec![leaf, self.ca.cert_der().clone()];
        let certified = CertifiedKey::new(chain, self.signing_key.clone());
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
        config.alpn_protocols = SERVER_ALPN.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// Lower-case, without a trailing dot or IPv6 brackets; refuses empty names.
pub(crate) fn normalize_host(host: &str) -> Result<String, TlsError> {
    let trimmed = host.trim_end_matches('.');
    let trimmed = trimmed
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(trimmed);
    if trimmed.is_empty() || trimmed.len() > 253 {
        return Err(TlsError::BadHost { host: host.into() });
    }
    if let Ok(ip) = trimmed.parse::<IpAddr>() {
        return Ok(ip.to_string());
    }
    Ok(trimmed.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_names_and_ips() {
        assert_eq!(normalize_host("API2.Cursor.sh.").unwrap(), "api2.cursor.sh");
        assert_eq!(normalize_host("[::1]").unwrap(), "::1");
        assert!(normalize_host("").is_err());
    }

    #[test]
    fn refuses_names_rcgen_cannot_encode() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = CertificateAuthority::load_or_create(dir.path()).unwrap();
        let minter = LeafMinter::new(Arc::new(ca)).unwrap();
        assert!(minter.mint("bad\u{e9}host").is_err());
        assert!(minter.mint("api2.cursor.sh").is_ok());
        assert!(minter.mint("127.0.0.1").is_ok());
    }
}
