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
    /// Run the gateway until SIGTERM, SIGINT or `control stop` (a clean stop: FIX Logout,
    /// checkpoint, engines disconnected, exit 0).
    Run {
        /// Configuration file (configs/order-gateway.toml documents every key, including
        /// the optional `[market_data]` section). `[fix] password_env` names an environment
        /// variable read at start for the FIX Logon's Password.
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
    /// Control a running gateway through its control socket (`service.control_socket`):
    /// `kill [--account A]` (cancel open orders at the venue and reject new ones until
    /// `resume`; survives a restart), `resume [--account A]`, `cancel-all [--account A]`,
    /// `status` (venue session, journal, engines, open orders, kill switches, limits used),
    /// `venue-reconnect` (log on to the venue again after it logged us out for a MsgSeqNum
    /// too low), `stop` (a clean stop, as SIGTERM). State changes are answered once
    /// journaled durably; an `error` answer means nothing changed.
    Control {
        /// The gateway's configuration file (for the socket path).
        #[arg(short, long, default_value = "configs/order-gateway.toml")]
        config: PathBuf,
        /// The command and its options, e.g. `kill --account 7`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Inspect or repair a journal file (the gateway refuses to start on a damaged one).
    Journal {
        #[command(subcommand)]
        cmd: JournalCmd,
    },
}

#[derive(Debug, Subcommand)]
enum JournalCmd {
    /// Read a journal without changing it: records per kind, the durable length, the first
    /// bad offset. Exits 0 only for a clean journal (a torn tail, which the gateway cuts on
    /// start, exits 1; damage it refuses to start on exits 2).
    Verify {
        /// Journal file (`[journal] path` of the gateway's config).
        file: PathBuf,
    },
    /// Move everything from the first damaged record to the end into FILE.quarantine.N
    /// (never deletes), then cut the journal there so the gateway can start. Records moved
    /// aside are no longer replayed: order ids and FIX sequence numbers recorded in them may
    /// be reused, so reconcile with the venue. The gateway must be stopped.
    Repair {
        /// Journal file.
        file: PathBuf,
    },
}

fn kind_name(kind: usize) -> String {
    use order_gateway::gateway::record;
    match kind as u8 {
        order_gateway::journal::META => "commit records".into(),
        record::ENGINE_REQUEST => "engine requests".into(),
        record::DECISION => "decisions".into(),
        record::FIX_OUT => "FIX out".into(),
        record::FIX_IN => "FIX in".into(),
        record::ENGINE_SESSION => "engine sessions".into(),
        record::KILL => "kill switches".into(),
        record::ENGINE_MALFORMED => "malformed engine frames".into(),
        record::CHECKPOINT => "checkpoints".into(),
        record::FIX_IN_REJECTED => "FIX in, rejected".into(),
        record::NOT_SENT => "never sent".into(),
        k => format!("kind {k}"),
    }
}

fn print_scan(file: &std::path::Path, scan: &order_gateway::journal::Scan) {
    println!("{}: {} bytes", file.display(), scan.file_len);
    for (kind, n) in scan.by_kind.iter().enumerate().filter(|(_, n)| **n > 0) {
        println!("  {:<16} {n}", kind_name(kind));
    }
    println!("  records          {}", scan.records());
    println!(
        "  durable length   {} (end of the last commit record: what a power loss keeps)",
        scan.durable_len
    );
    println!("  intact length    {}", scan.valid_len);
}

fn journal_cmd(cmd: JournalCmd) -> anyhow::Result<std::process::ExitCode> {
    use order_gateway::journal::{self, Damage};
    use std::process::ExitCode;
    match cmd {
        JournalCmd::Verify { file } => {
            let scan = journal::verify(&file)?;
            print_scan(&file, &scan);
            Ok(match scan.damage {
                None => {
                    println!("  clean");
                    ExitCode::SUCCESS
                }
                Some(Damage::TornTail { offset, bytes }) => {
                    println!(
                        "  torn tail: {bytes} bytes from byte {offset} (an interrupted last \
                         write; the gateway cuts it on start)"
                    );
                    ExitCode::from(1)
                }
                Some(Damage::Corrupt {
                    offset,
                    what,
                    next_intact,
                }) => {
                    match next_intact {
                        Some(n) => println!(
                            "  DAMAGED at byte {offset} ({what}); intact records follow at \
                             byte {n}: the gateway will not start on it"
                        ),
                        None => println!("  DAMAGED at byte {offset} ({what})"),
                    }
                    println!(
                        "  `order-gateway journal repair {}` moves bytes {offset}.. aside",
                        file.display()
                    );
                    ExitCode::from(2)
                }
            })
        }
        JournalCmd::Repair { file } => {
            let r = journal::repair(&file)?;
            print_scan(&file, &r.scan);
            match r.moved {
                None => println!("  clean: nothing moved"),
                Some((q, offset)) => {
                    let kind = match r.scan.damage {
                        Some(Damage::TornTail { .. }) => "a torn tail",
                        _ => "damaged records and everything after them",
                    };
                    println!(
                        "  moved {} bytes ({kind}) from byte {offset} to {}; the journal now \
                         ends at byte {offset}",
                        r.scan.file_len - offset,
                        q.display()
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Loads and checks the configuration, secrets included: a gateway never starts (and
/// `check` never passes) with a guessable token.
fn load(path: &std::path::Path) -> anyhow::Result<Config> {
    let cfg = Config::load(path).context("fix the configuration file and start again")?;
    cfg.check_secrets()
        .map_err(|(key, problem)| anyhow::anyhow!("{}: {key} {problem}", path.display()))
        .context("fix the configuration file and start again")?;
    Ok(cfg)
}

/// The market-data input the config asks for; joins the bus before the service starts (the
/// recovery connections complete from the service's polls: a feed handler that is down
/// delays nothing).
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
    let subscribed = input.start();
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

fn main() -> std::process::ExitCode {
    rocebus_bin_support::main(run)
}

fn run() -> anyhow::Result<std::process::ExitCode> {
    rocebus_bin_support::init_logging("info")?;
    // A file-size limit (RLIMIT_FSIZE) must not kill the gateway: with SIGXFSZ caught, a
    // journal write past it fails with EFBIG and the gateway degrades like on a full disk.
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    match Cli::parse().cmd {
        Cmd::Check { config } => {
            load(&config)?;
            println!("{}: ok", config.display());
            Ok(std::process::ExitCode::SUCCESS)
        }
        Cmd::Journal { cmd } => journal_cmd(cmd),
        Cmd::Control { config, command } => {
            let cfg = load(&config)?;
            let path = &cfg.service.control_socket;
            let line = command.join(" ");
            order_gateway::control::parse(&line).map_err(|e| anyhow::anyhow!("{e}"))?;
            let answer =
                order_gateway::control::request(path, &line, std::time::Duration::from_secs(5))
                    .with_context(|| {
                        format!(
                            "talk to the gateway's control socket {}: is the gateway running with \
                         this configuration (and are you allowed to open the socket)?",
                            path.display()
                        )
                    })?;
            print!("{answer}");
            Ok(if answer.starts_with("ok") {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            })
        }
        Cmd::Run { config, venue } => {
            let cfg = load(&config)?;
            let journal_hint = || {
                format!(
                    "open the journal {} (checked before anything else)",
                    cfg.journal.path.display()
                )
            };
            let rdma_hint = || {
                format!(
                    "no engine can reach this gateway: is an RDMA device up (`cargo xtask vm`, \
                     or `rdma link add`) with the address of service.listen ({})?",
                    cfg.service.listen
                )
            };
            let opts = ServiceOptions::from_config(&cfg).context("fix the configuration")?;
            // The journal first: a damaged or locked journal fails the start with its own
            // error before any device or venue is looked at.
            match venue {
                Venue::Fix => {
                    let driver = FixDriver::open(&cfg).with_context(journal_hint)?;
                    let control = ServiceControl::new();
                    control
                        .stop_on_signals()
                        .context("install the SIGTERM/SIGINT handlers")?;
                    let service =
                        Service::new(driver, &cfg.risk, opts, control).with_context(rdma_hint)?;
                    tracing::info!(listen = %cfg.service.listen, venue = %cfg.fix.venue_addr, "order gateway running");
                    serve(service, &cfg)?;
                }
                Venue::Sim => {
                    let driver = FixDriver::with_link(
                        SimVenue::new(),
                        cfg.fix.session(),
                        &cfg.risk,
                        &cfg.journal.path,
                        cfg.journal.fsync,
                    )
                    .with_context(journal_hint)?;
                    let control = ServiceControl::new();
                    control
                        .stop_on_signals()
                        .context("install the SIGTERM/SIGINT handlers")?;
                    let service =
                        Service::new(driver, &cfg.risk, opts, control).with_context(rdma_hint)?;
                    tracing::info!(listen = %cfg.service.listen, "order gateway running with the venue simulator");
                    serve(service, &cfg)?;
                }
            }
            Ok(std::process::ExitCode::SUCCESS)
        }
    }
}
