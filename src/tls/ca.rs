//! The install's certificate authority: generated once, never shipped, key file mode 0600.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256,
};
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};

use super::TlsError;

const KEY_FILE: &str = "ca.key.pem";
const CERT_FILE: &str = "ca.pem";
const DER_FILE: &str = "ca.der";
const COMMON_NAME: &str = "cursor-byok local CA";

/// The CA: its certificate and the issuer that signs leaves.
pub struct CertificateAuthority {
    dir: PathBuf,
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for CertificateAuthority {
    // The issuer holds the private key: keep it out of every debug print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("dir", &self.dir)
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

/// What `load_or_create` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaOrigin {
    Created,
    Loaded,
}

impl CertificateAuthority {
    /// Load the CA from `dir`, or generate it there if it does not exist yet.
    pub fn load_or_create(dir: &Path) -> Result<(Self, CaOrigin), TlsError> {
        let key_path = dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        if key_path.exists() && cert_path.exists() {
            return Ok((Self::load(dir)?, CaOrigin::Loaded));
        }
        Ok((Self::create(dir)?, CaOrigin::Created))
    }

    fn load(dir: &Path) -> Result<Self, TlsError> {
        let key_path = dir.join(KEY_FILE);
        check_key_permissions(&key_path)?;
        let key_pem = read(&key_path)?;
        let cert_pem = read(&dir.join(CERT_FILE))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| TlsError::Ca {
            path: key_path.clone(),
            reason: format!("not a usable private key: {e}"),
        })?;
        let cert_der = rustls_pemfile::certs(&mut cert_pem.as_bytes())
            .next()
            .and_then(Result::ok)
            .ok_or_else(|| TlsError::Ca {
                path: dir.join(CERT_FILE),
                reason: "no PEM certificate found".into(),
            })?;
        let issuer = Issuer::from_ca_cert_der(&cert_der, key).map_err(|e| TlsError::Ca {
            path: dir.join(CERT_FILE),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
        Ok(CertificateAuthority {
            dir: dir.to_path_buf(),
            cert_pem,
            cert_der,
            issuer,
        })
    }

    fn create(dir: &Path) -> Result<Self, TlsError> {
        let io = |path: &Path, e: std::io::Error| TlsError::Ca {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(TlsError::Rcgen)?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, COMMON_NAME);
        dn.push(DnType::OrganizationName, "cursor-byok");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::days(1);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(super::random_serial());
        let cert = params.self_signed(&key).map_err(TlsError::Rcgen)?;
        let cert_pem = cert.pem();
        let cert_der = cert.der().clone();

        // The key is written first, with 0600 from the moment it exists; the certificate last,
        // so a half-written CA is never mistaken for a complete one.
        let key_path = dir.join(KEY_FILE);
        write_private(&key_path, key.serialize_pem().as_bytes()).map_err(|e| io(&key_path, e))?;
        let der_path = dir.join(DER_FILE);
        fs::write(&der_path, cert_der.as_ref()).map_err(|e| io(&der_path, e))?;
        let cert_path = dir.join(CERT_FILE);
        fs::write(&cert_path, &cert_pem).map_err(|e| io(&cert_path, e))?;

        let issuer = Issuer::new(params, key);
        Ok(CertificateAuthority {
            dir: dir.to_path_buf(),
            cert_pem,
            cert_der,
            issuer,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    pub fn cert_path(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    pub fn der_path(&self) -> PathBuf {
        self.dir.join(DER_FILE)
    }

    pub fn key_path(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }

    /// SHA-256 of the DER certificate, colon-separated upper-case hex (as browsers show it).
    pub fn fingerprint(&self) -> String {
        Sha256::digest(self.cert_der.as_ref())
            .iter()
            .map(|b| format!("{b:02X}"))
            .collect::<Vec<_>>()
            .join(":")
    }

    pub(crate) fn issuer(&self) -> &Issuer<'static, KeyPair> {
        &self.issuer
    }
}

fn read(path: &Path) -> Result<String, TlsError> {
    fs::read_to_string(path).map_err(|e| TlsError::Ca {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Create `path` readable by its owner only (0600 on Unix) and write `data` to it.
pub(crate) fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(data)?;
    f.sync_all()
}

/// Refuse a CA key that others can read: it can impersonate any host to this machine.
fn check_key_permissions(path: &Path) -> Result<(), TlsError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = fs::metadata(path)
            .map_err(|e| TlsError::Ca {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(TlsError::Ca {
                path: path.to_path_buf(),
                reason: format!(
                    "private key is readable by others (mode {:o}); run `chmod 600 {}`",
                    mode & 0o777,
                    path.display()
                ),
            });
        }
    }
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_loaded_with_same_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let (a, origin) = CertificateAuthority::load_or_create(dir.path()).unwrap();
        assert_eq!(origin, CaOrigin::Created);
        let (b, origin) = CertificateAuthority::load_or_create(dir.path()).unwrap();
        assert_eq!(origin, CaOrigin::Loaded);
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_eq!(fs::read(b.der_path()).unwrap(), a.cert_der().as_ref());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(a.key_path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(!format!("{a:?}").contains("PRIVATE"));
    }

    #[cfg(unix)]
    #[test]
    fn refuses_a_world_readable_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, _) = CertificateAuthority::load_or_create(dir.path()).unwrap();
        fs::set_permissions(a.key_path(), fs::Permissions::from_mode(0o644)).unwrap();
        let err = CertificateAuthority::load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
}
