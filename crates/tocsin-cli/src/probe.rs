//! `tocsin probe`: a health check usable from an image with no shell.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;

#[derive(clap::Args)]
pub struct ProbeArgs {
    /// The node's HTTP address.
    #[arg(long, default_value = "127.0.0.1:7071")]
    http: String,
    /// Check /healthz (alive) instead of /readyz (every shard has a leader).
    #[arg(long)]
    live: bool,
}

pub async fn run(args: ProbeArgs) -> anyhow::Result<ExitCode> {
    let path = if args.live { "healthz" } else { "readyz" };
    let mut builder = tocsin_contract::tls::http_client_builder().timeout(Duration::from_secs(2));
    // A node with client TLS serves its probes over https only: the
    // `--tls-*` flags say how to reach it.
    let mut authority = args.http.clone();
    let scheme = match crate::tls() {
        Some(tls) => {
            // Ask for the name the certificate carries, at the address given.
            if let Some(domain) = &tls.domain {
                let addr: std::net::SocketAddr =
                    args.http.parse().context("--tls-domain with probe needs --http as ip:port")?;
                builder = builder.resolve(domain, addr);
                authority = format!("{domain}:{}", addr.port());
            }
            builder = builder.tls_certs_only([reqwest::Certificate::from_pem(tls.ca_pem.as_bytes())?]);
            if let Some((cert, key)) = &tls.identity {
                builder = builder.identity(reqwest::Identity::from_pem(format!("{cert}\n{key}").as_bytes())?);
            }
            "https"
        }
        None => "http",
    };
    let client = builder.build()?;
    match client.get(format!("{scheme}://{authority}/{path}")).send().await {
        Ok(resp) if resp.status().is_success() => Ok(ExitCode::SUCCESS),
        Ok(resp) => {
            eprintln!("{path}: {}: {}", resp.status(), resp.text().await.unwrap_or_default().trim());
            Ok(ExitCode::FAILURE)
        }
        Err(e) => {
            eprintln!("{path}: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
