//! `order-gateway`: runs the gateway service (engines over RC, risk, journal, FIX 4.4).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use order_gateway::config::Config;
use order_gateway::service::{NoMarketData, Service, ServiceControl};

/// Order gateway: trading engines connect over the rocebus orders path (RDMA RC), the
/// gateway applies pre-trade risk, journals every event and speaks FIX 4.4 to the venue.
///
/// One polling thread does everything (pin it with `service.core`). State survives a crash:
/// on start the journal rebuilds open orders, positions and FIX sequence numbers. Counters
/// are readable live with `rocebus stat order-gateway`. Logs go to stderr (RUST_LOG=info).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the gateway until killed.
    Run {
        /// Configuration file (configs/order-gateway.toml documents every key).
        #[arg(short, long, default_value = "configs/order-gateway.toml")]
        config: PathBuf,
    },
    /// Check a configuration file and exit (non-zero with file, key and problem if bad).
    Check {
        /// Configuration file.
        #[arg(short, long, default_value = "configs/order-gateway.toml")]
        config: PathBuf,
    },
}

fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    Config::load(path).context("fix the configuration file and start again")
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().cmd {
        Cmd::Check { config } => {
            load(&config)?;
            println!("{}: ok", config.display());
            Ok(())
        }
        Cmd::Run { config } => {
            let cfg = load(&config)?;
            let control = ServiceControl::new();
            let mut service = Service::from_config(&cfg, control).with_context(|| {
                format!(
                    "start the gateway (journal {}, engines on {}): is an RDMA device up \
                     (`cargo xtask vm`, or `rdma link add`) and the journal readable?",
                    cfg.journal.path.display(),
                    cfg.service.listen
                )
            })?;
            tracing::info!(listen = %cfg.service.listen, venue = %cfg.fix.venue_addr, "order gateway running");
            service.run(&mut NoMarketData)?;
            Ok(())
        }
    }
}
