//! `cursor-byok ca`: create the CA if missing and tell the user how to trust it; `ca trust`,
//! `ca export`, `ca untrust`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::args::{CaAction, CertFormat};
use crate::setup::os::Os;
use crate::setup::trust::{self, Applied, CaFiles, Group};
use crate::tls::{CaOrigin, CertificateAuthority};

pub fn run(data_dir: &Path, action: Option<CaAction>) -> anyhow::Result<()> {
    match action {
        None => show(data_dir),
        Some(CaAction::Trust { apply }) => trust_cmd(data_dir, apply),
        Some(CaAction::Export { format, out }) => export(data_dir, format, out.as_deref()),
        Some(CaAction::Untrust) => untrust(data_dir),
    }
}

pub fn show(data_dir: &Path) -> anyhow::Result<()> {
    let (ca, origin) = CertificateAuthority::load_or_create(data_dir)?;
    match origin {
        CaOrigin::Created => {
            println!("Created a new CA for this install (its key never leaves this machine).")
        }
        CaOrigin::Loaded => println!("Using the existing CA."),
    }
    println!("certificate (PEM): {}", ca.cert_path().display());
    println!("certificate (DER): {}", ca.der_path().display());
    println!("private key:       {} (mode 0600)", ca.key_path().display());
    println!("SHA-256:           {}", ca.fingerprint());
    println!();
    println!("Trust it (once), then restart Cursor:");
    print_groups(&trust::trust_groups(&CaFiles::of(&ca)));
    println!();
    println!("`cursor-byok ca trust --apply` runs the commands for this machine.");
    Ok(())
}

fn trust_cmd(data_dir: &Path, apply: bool) -> anyhow::Result<()> {
    let (ca, _) = CertificateAuthority::load_or_create(data_dir)?;
    let files = CaFiles::of(&ca);
    println!("CA: {} (SHA-256 {})", files.pem.display(), ca.fingerprint());
    if !apply {
        println!("Commands to trust it (then restart Cursor):");
        print_groups(&trust::trust_groups(&files));
        println!();
        println!("Run them yourself, or `cursor-byok ca trust --apply` for this machine.");
        return Ok(());
    }
    let mut failed = 0;
    for step in trust::apply_trust(&files) {
        match step {
            Applied::Ran { command } => println!("[ok]   {command}"),
            Applied::Failed { command, reason } => {
                failed += 1;
                println!("[FAIL] {command}: {reason}");
            }
            Applied::Skipped { command, reason } if command.is_empty() => {
                println!("[todo] {reason}")
            }
            Applied::Skipped { command, reason } => println!("[todo] {command}   ({reason})"),
        }
    }
    if failed > 0 {
        anyhow::bail!("{failed} command(s) failed; the messages above say why");
    }
    println!("Restart Cursor so it picks up the new trust settings; `cursor-byok doctor` checks.");
    Ok(())
}

fn export(data_dir: &Path, format: CertFormat, out: Option<&Path>) -> anyhow::Result<()> {
    let (ca, _) = CertificateAuthority::load_or_create(data_dir)?;
    let bytes: Vec<u8> = match format {
        CertFormat::Pem => ca.cert_pem().as_bytes().to_vec(),
        CertFormat::Der => ca.cert_der().as_ref().to_vec(),
    };
    match out {
        Some(path) => {
            std::fs::write(path, &bytes)
                .with_context(|| format!("cannot write {}", path.display()))?;
            eprintln!("wrote the CA certificate to {}", path.display());
        }
        None => {
            let mut stdout = std::io::stdout().lock();
            if format == CertFormat::Der && stdout.is_terminal() {
                anyhow::bail!("DER is binary: pass --out FILE or redirect the output");
            }
            stdout.write_all(&bytes)?;
            stdout.flush()?;
        }
    }
    Ok(())
}

fn untrust(data_dir: &Path) -> anyhow::Result<()> {
    // Guidance only, and without creating a CA just to remove it.
    let files = CaFiles {
        pem: std::path::absolute(data_dir.join("ca.pem"))?,
        der: std::path::absolute(data_dir.join("ca.der"))?,
        home: dirs::home_dir().unwrap_or_else(|| PathBuf::from("~")),
    };
    println!("To stop trusting the cursor-byok CA:");
    print_groups(&trust::untrust_groups(&files));
    println!();
    println!("Then: `cursor-byok setup cursor --undo` restores Cursor's settings, and deleting");
    println!("{} removes the CA for good.", data_dir.display());
    Ok(())
}

/// Per OS, the commands; this machine's OS is marked.
fn print_groups(groups: &[Group]) {
    let here = Os::current();
    for os in [Os::MacOs, Os::Windows, Os::Linux] {
        let mine = if here == Some(os) {
            "  (this machine)"
        } else {
            ""
        };
        println!("  {}{mine}", os.name());
        let of_os: Vec<&Group> = groups.iter().filter(|g| g.os == os).collect();
        if of_os.iter().any(|g| g.alternative) {
            println!("    one of, for the system store (needs root):");
        }
        for g in of_os {
            println!("    # {}", g.title);
            for s in &g.steps {
                println!("    {}", s.shell());
            }
        }
    }
}
