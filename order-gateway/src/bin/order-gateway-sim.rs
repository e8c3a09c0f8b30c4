//! `order-gateway-sim`: `order-gateway run` with the in-process venue simulator
//! ([`order_gateway::sim::SimVenue`]) in place of the FIX TCP venue. The demo's default venue.
//!
//! Everything else is the real gateway: engines over RC, risk, journal, the FIX session and
//! order logic (the simulator parses and answers the FIX bytes). `[fix] venue_addr` is
//! ignored. To fold into `order-gateway run --venue sim`, move `main` there.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use order_gateway::config::Config;
use order_gateway::driver::FixDriver;
use order_gateway::service::{NoMarketData, Service, ServiceControl, ServiceOptions};
use order_gateway::sim::SimVenue;

/// Order gateway with a built-in venue simulator (every order acked and filled at its limit
/// price at once), for demos and benchmarks without a FIX venue. Same configuration file as
/// `order-gateway run`; `[fix] venue_addr` is not used.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// Configuration file (configs/order-gateway.toml documents every key).
    #[arg(short, long, default_value = "configs/order-gateway.toml")]
    config: PathBuf,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let cli = Cli::parse();
    let cfg = Config::load(&cli.config).context("fix the configuration file and start again")?;
    let driver = FixDriver::with_link(
        SimVenue::new(),
        cfg.fix.session(),
        &cfg.risk,
        &cfg.journal.path,
        cfg.journal.fsync,
    )
    .with_context(|| format!("open the journal {}", cfg.journal.path.display()))?;
    let mut service = Service::new(
        driver,
        &cfg.risk,
        ServiceOptions::from_config(&cfg)?,
        ServiceControl::new(),
    )
    .with_context(|| {
        format!(
            "listen for engines on {}: is an RDMA device up (`cargo xtask vm`, or `rdma link add`)?",
            cfg.service.listen
        )
    })?;
    tracing::info!(listen = %cfg.service.listen, "order gateway running with the venue simulator");
    service.run(&mut NoMarketData)?;
    Ok(())
}
