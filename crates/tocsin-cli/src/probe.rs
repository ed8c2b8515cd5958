//! `tocsin probe`: a health check usable from an image with no shell.

use std::process::ExitCode;
use std::time::Duration;

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
    let client = tocsin_contract::tls::http_client_builder().timeout(Duration::from_secs(2)).build()?;
    match client.get(format!("http://{}/{path}", args.http)).send().await {
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
