//! `order-gateway`: runs the gateway service (engines over RC, risk, journal, FIX 4.4).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use order_gateway::config::Config;
use order_gateway::driver::{FixDriver, VenueLink};
use order_gateway::market::BusMarketData;
use order_gateway::service::{
    MarketDataInput, NoMarketData, Service, ServiceControl, ServiceOptions,
};
use order_gateway::sim::SimVenue;

/// Order gateway: trading engines connect over the rocebus orders path (RDMA RC), the
/// gateway applies pre-trade risk, journals every event and speaks FIX 4.4 to the venue.
///
/// One polling thread does everything (pin it with `service.core`). State survives a crash:
/// on start the journal rebuilds open orders, positions and FIX sequence numbers. Counters
/// are readable live with `rocebus stat order-gateway`. Logs go to stderr (RUST_LOG=info).
///
/// Reference prices (price collar) and halts come from the rocebus market-data bus when the
/// config has a `[market_data]` section: the BBO midpoint (or last trade) and the trading
/// status the feed handler publishes; a reference older than `risk.reference_max_age_ms`,
/// or any reference after a gap in the feed until the next snapshot, rejects (fail closed).
/// Without it, `[reference_prices]` gives static prices (demos and tests only).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where orders go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Venue {
    /// The FIX 4.4 acceptor at `[fix] venue_addr`, over TCP.
    Fix,
    /// The in-process venue simulator: every order acked and filled at its limit price at
    /// once; `[fix] venue_addr` is not used. For demos and benchmarks. Everything else
    /// (engines over RC, risk, journal, FIX session and order logic) is the real gateway.
    Sim,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the gateway until killed.
    Run {
        /// Configuration file (configs/order-gateway.toml documents every key, including
        /// the optional `[market_data]` section).
        #[arg(short, long, default_value = "configs/order-gateway.toml")]
        config: PathBuf,
        /// The venue: `fix` (the FIX acceptor at `[fix] venue_addr`) or `sim` (the
        /// in-process simulator that fills every order at once, for demos and benchmarks).
        #[arg(long, value_enum, default_value_t = Venue::Fix)]
        venue: Venue,
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

/// The market-data input the config asks for; subscribes before the service starts.
fn market_input(cfg: &Config) -> anyhow::Result<Box<dyn MarketDataInput>> {
    let Some(md) = &cfg.market_data else {
        tracing::info!("no [market_data]: reference prices from [reference_prices] only");
        return Ok(Box::new(NoMarketData));
    };
    let bus = md
        .load_bus()
        .map_err(|(key, problem)| anyhow::anyhow!("{key}: {problem}"))
        .context("fix the configuration file and start again")?;
    let mut input = BusMarketData::new(md, bus);
    let subscribed = input.connect();
    tracing::info!(
        subscribed,
        publisher = %md.publisher,
        reference = ?md.reference,
        "market data from the bus (orders reject until each channel's first snapshot)"
    );
    Ok(Box::new(input))
}

fn serve<L: VenueLink>(mut service: Service<L>, cfg: &Config) -> anyhow::Result<()> {
    let mut market = market_input(cfg)?;
    service.run(market.as_mut())?;
    Ok(())
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
        Cmd::Run { config, venue } => {
            let cfg = load(&config)?;
            let rdma_hint = || {
                format!(
                    "start the gateway (journal {}, engines on {}): is an RDMA device up \
                     (`cargo xtask vm`, or `rdma link add`) and the journal readable?",
                    cfg.journal.path.display(),
                    cfg.service.listen
                )
            };
            match venue {
                Venue::Fix => {
                    let service = Service::from_config(&cfg, ServiceControl::new())
                        .with_context(rdma_hint)?;
                    tracing::info!(listen = %cfg.service.listen, venue = %cfg.fix.venue_addr, "order gateway running");
                    serve(service, &cfg)
                }
                Venue::Sim => {
                    let driver = FixDriver::with_link(
                        SimVenue::new(),
                        cfg.fix.session(),
                        &cfg.risk,
                        &cfg.journal.path,
                        cfg.journal.fsync,
                    )
                    .with_context(|| format!("open the journal {}", cfg.journal.path.display()))?;
                    let opts =
                        ServiceOptions::from_config(&cfg).context("fix the configuration")?;
                    let service = Service::new(driver, &cfg.risk, opts, ServiceControl::new())
                        .with_context(rdma_hint)?;
                    tracing::info!(listen = %cfg.service.listen, "order gateway running with the venue simulator");
                    serve(service, &cfg)
                }
            }
        }
    }
}
