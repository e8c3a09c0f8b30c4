//! `order-gateway`: runs the gateway against a FIX 4.4 venue.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use order_gateway::config::Config;
use order_gateway::driver::FixDriver;

/// Order gateway: pre-trade risk, journal and FIX 4.4 to the venue.
///
/// Engines reach it over the rocebus orders path (wired by the rocebus transport); this binary
/// connects to the venue, recovers from its journal and keeps the FIX session alive.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Configuration file (see configs/order-gateway.toml for every key).
    #[arg(short, long, default_value = "configs/order-gateway.toml")]
    config: PathBuf,
    /// Seconds between reconnect attempts when the venue is unreachable.
    #[arg(long, default_value_t = 2)]
    reconnect_secs: u64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let cli = Cli::parse();
    let cfg = Config::load(&cli.config).context("fix the configuration file and start again")?;
    let mut driver = FixDriver::open(&cfg).with_context(|| {
        format!(
            "open the journal {} (move it away to start empty)",
            cfg.journal.path.display()
        )
    })?;
    tracing::info!(recovered = ?driver.recovery(), "journal recovered");
    loop {
        if !driver.is_connected() {
            if let Err(e) = driver.connect() {
                tracing::warn!(
                    "{:#}; retrying in {}s",
                    anyhow::Error::from(e),
                    cli.reconnect_secs
                );
                std::thread::sleep(Duration::from_secs(cli.reconnect_secs));
                continue;
            }
            tracing::info!(venue = %cfg.fix.venue_addr, "connected, logon sent");
        }
        driver.poll(Duration::from_millis(10))?;
    }
}
