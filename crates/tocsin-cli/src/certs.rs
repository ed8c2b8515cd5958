//! `tocsin certs init|issue|client`: a cluster CA and node certificates
//! for mTLS on the peer port, and client certificates for the client
//! ports' TLS (see docs/security.md). The files are what `peer_tls.dir`
//! expects: `ca.pem`, and `node-<id>.pem` with `node-<id>.key` for each
//! node; a client's are `client-<name>.pem` and `client-<name>.key`.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::path::PathBuf;

use anyhow::Context as _;
use anyhow::bail;
use clap::Subcommand;
use tocsin_node::peer_tls;

#[derive(Subcommand, Debug)]
pub enum CertsCommand {
    /// Create a cluster CA: DIR/ca.pem (give it to every node) and
    /// DIR/ca.key (keep it off the nodes; it signs node certificates).
    Init {
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// Days the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
        /// The CA's common name.
        #[arg(long, default_value = "Tocsin cluster CA")]
        name: String,
        /// Replace a CA already in DIR (every node certificate it signed
        /// stops verifying).
        #[arg(long)]
        force: bool,
    },
    /// Issue certificates for nodes, signed by DIR's CA: DIR/node-<id>.pem
    /// and DIR/node-<id>.key, naming node-<id>.peer.tocsin (the identity
    /// peers check) and any --host.
    Issue {
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// Node ids, comma-separated or repeated.
        #[arg(long = "node", value_delimiter = ',', required = true)]
        nodes: Vec<u64>,
        /// Extra DNS names or IP addresses to put in each certificate.
        #[arg(long = "host", value_delimiter = ',')]
        hosts: Vec<String>,
        /// Days each certificate is valid.
        #[arg(long, default_value_t = 825)]
        days: u32,
        /// Replace certificates already in DIR.
        #[arg(long)]
        force: bool,
    },
    /// Issue a client certificate signed by DIR's CA, for nodes whose
    /// client ports require one (client_tls.client_ca_file):
    /// DIR/client-<name>.pem and DIR/client-<name>.key. It names no node,
    /// so the peer port refuses it.
    Client {
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The client's name (the certificate's common name).
        #[arg(long)]
        name: String,
        /// Days the certificate is valid.
        #[arg(long, default_value_t = 825)]
        days: u32,
        /// Replace a certificate already in DIR.
        #[arg(long)]
        force: bool,
    },
}

/// DIR's CA, to sign with.
fn read_ca(dir: &Path) -> anyhow::Result<peer_tls::Issued> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read_to_string(&path)
            .with_context(|| format!("reading {} (create a CA with `tocsin certs init`)", path.display()))
    };
    Ok(peer_tls::Issued { cert_pem: read("ca.pem")?, key_pem: read("ca.key")? })
}

pub fn run(cmd: CertsCommand) -> anyhow::Result<std::process::ExitCode> {
    match cmd {
        CertsCommand::Init { dir, days, name, force } => {
            let (cert, key) = (dir.join("ca.pem"), dir.join("ca.key"));
            refuse_overwrite(&[&cert, &key], force)?;
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let ca = peer_tls::new_ca(&name, days)?;
            write(&cert, &ca.cert_pem, false)?;
            write(&key, &ca.key_pem, true)?;
            println!("wrote {} and {} (valid {days} days)", cert.display(), key.display());
            println!("next: tocsin certs issue --dir {} --node 1,2,3", dir.display());
        }
        CertsCommand::Issue { dir, nodes, hosts, days, force } => {
            if nodes.contains(&0) {
                bail!("--node: node ids start at 1");
            }
            let ca = read_ca(&dir)?;
            let files: Vec<(u64, PathBuf, PathBuf)> = nodes
                .iter()
                .map(|id| (*id, dir.join(format!("node-{id}.pem")), dir.join(format!("node-{id}.key"))))
                .collect();
            let existing: Vec<&PathBuf> = files.iter().flat_map(|(_, c, k)| [c, k]).collect();
            refuse_overwrite(&existing, force)?;
            for (id, cert, key) in &files {
                let issued = peer_tls::issue_node(&ca, *id, &hosts, days)?;
                write(cert, &issued.cert_pem, false)?;
                write(key, &issued.key_pem, true)?;
                println!("node {id}: wrote {} and {} ({})", cert.display(), key.display(), peer_tls::node_name(*id));
            }
        }
        CertsCommand::Client { dir, name, days, force } => {
            // The name becomes part of two file names.
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                bail!("--name: letters, digits, '-', '_' and '.' only");
            }
            let ca = read_ca(&dir)?;
            let (cert, key) = (dir.join(format!("client-{name}.pem")), dir.join(format!("client-{name}.key")));
            refuse_overwrite(&[&cert, &key], force)?;
            let issued = peer_tls::issue_client(&ca, &name, days)?;
            write(&cert, &issued.cert_pem, false)?;
            write(&key, &issued.key_pem, true)?;
            println!("client {name}: wrote {} and {} (valid {days} days)", cert.display(), key.display());
        }
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Nothing is written when any target exists and `force` is not given.
fn refuse_overwrite(paths: &[&PathBuf], force: bool) -> anyhow::Result<()> {
    let existing: Vec<String> = paths.iter().filter(|p| p.exists()).map(|p| p.display().to_string()).collect();
    if !existing.is_empty() && !force {
        bail!("{} already exist(s); nothing written (--force replaces)", existing.join(", "));
    }
    Ok(())
}

/// Writes `text` to `path`, readable by its owner only when `private`.
fn write(path: &Path, text: &str, private: bool) -> anyhow::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(if private { 0o600 } else { 0o644 })
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
