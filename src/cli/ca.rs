//! `cursor-byok ca`: create the CA if missing and tell the user how to trust it.

use std::path::Path;

use crate::tls::{CaOrigin, CertificateAuthority};

pub fn show(data_dir: &Path) -> anyhow::Result<()> {
    let (ca, origin) = CertificateAuthority::load_or_create(data_dir)?;
    let pem = ca.cert_path();
    let der = ca.der_path();
    match origin {
        CaOrigin::Created => {
            println!("Created a new CA for this install (its key never leaves this machine).")
        }
        CaOrigin::Loaded => println!("Using the existing CA."),
    }
    println!("certificate (PEM): {}", pem.display());
    println!("certificate (DER): {}", der.display());
    println!("private key:       {} (mode 0600)", ca.key_path().display());
    println!("SHA-256:           {}", ca.fingerprint());
    println!();
    println!("Trust it (once), then restart Cursor:");
    println!("  macOS:   security add-trusted-cert -r trustRoot -k ~/Library/Keychains/login.keychain-db \"{}\"", pem.display());
    println!(
        "  Windows: certutil -user -addstore Root \"{}\"",
        der.display()
    );
    println!("  Linux:   sudo cp \"{}\" /usr/local/share/ca-certificates/cursor-byok.crt && sudo update-ca-certificates", pem.display());
    println!("           certutil -d sql:$HOME/.pki/nssdb -A -t C,, -n cursor-byok -i \"{}\"   (Chromium/Electron NSS store)", pem.display());
    Ok(())
}
