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
        /// The gateway's configuration file: only `[service] control_socket` is read (no
        /// password or other setting is needed).
        #[arg(short, long, default_value = "configs/order-gateway.toml")]
        config: PathBuf,
        /// The control socket itself, instead of reading it from the configuration.
        #[arg(long, value_name = "PATH", conflicts_with = "config")]
        socket: Option<PathBuf>,
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
    /// bad offset, whether its archived segments FILE.N chain with it, and records this
    /// gateway does not know.
    ///
    /// Exit codes: 0 clean; 1 a torn tail only (an interrupted last write past the durable
    /// point: the gateway cuts it on start, safe to open); 2 damaged (the gateway refuses to
    /// start: damage inside the durable part, segments that do not chain, a current segment
    /// that lost the day its archives hold, or records it does not know); 3 not a journal or
    /// unreadable (missing file, bad magic, format 1, I/O error). Usage errors exit 64.
    ///
    /// With --json, one JSON object on stdout instead (same exit codes): `file`,
    /// `exit_code`, `verdict` (`clean`, `torn_tail`, `damaged` or `unreadable`), `file_len`,
    /// `segment`, `records`, `by_kind`, `durable_len`, `intact_len`, `problems` (the lines
    /// the text output would print) and, when unreadable, `error`.
    Verify {
        /// Journal file (`[journal] path` of the gateway's config).
        file: PathBuf,
        /// One JSON object on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Print every readable record: offset, length, kind and decoded fields, one line each
    /// (with --json one JSON object per line), then where reading stopped. Exit codes as for
    /// `verify`.
    Dump {
        /// Journal file (the current segment or an archive FILE.N).
        file: PathBuf,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Move everything from the first damaged record to the end into FILE.quarantine.N
    /// (never deletes), then cut the journal there so the gateway can start. Records moved
    /// aside are no longer replayed: order ids and FIX sequence numbers recorded in them may
    /// be reused, so reconcile with the venue. The gateway must be stopped. Never leaves an
    /// empty day: a segment whose checkpoint is damaged is rebuilt from the archive FILE.N it
    /// was started from (the damaged file goes to quarantine whole); it refuses, changing
    /// nothing, what it cannot rebuild (that archive missing or damaged, a current segment
    /// missing or empty beside its archives, segments that do not chain, both superblock
    /// copies bad).
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
        record::CUT => "checkpoint cuts".into(),
        k => format!("kind {k}"),
    }
}

fn print_scan(file: &std::path::Path, scan: &order_gateway::journal::Scan) {
    println!("{}: {} bytes", file.display(), scan.file_len);
    if let Some(sb) = &scan.superblock {
        println!(
            "  segment          {} (superblock: durable to byte {})",
            sb.segment, sb.durable
        );
    }
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

/// `journal verify` and `dump` exit codes (documented on `verify`).
const EXIT_TORN: u8 = 1;
const EXIT_DAMAGED: u8 = 2;
const EXIT_UNREADABLE: u8 = 3;
/// Usage errors (EX_USAGE), apart from every verify outcome.
const EXIT_USAGE: u8 = 64;

/// Reads `file` for `verify`/`dump`, handing each record to `each`; prints what is wrong
/// and returns the exit code.
fn read_journal(
    file: &std::path::Path,
    mut each: impl FnMut(order_gateway::journal::RecordView<'_>),
    summary: bool,
) -> u8 {
    // With --json the records alone go to stdout; what is wrong goes to stderr.
    let mut lines = Vec::new();
    let read = read_journal_into(file, &mut each, &mut lines);
    if let Some(e) = &read.error {
        eprintln!("{e}");
        return read.code;
    }
    if let (true, Some(scan)) = (summary, &read.scan) {
        print_scan(file, scan);
    }
    for l in lines {
        if summary {
            println!("{l}");
        } else {
            eprintln!("{l}");
        }
    }
    read.code
}

/// What reading a journal found.
struct JournalRead {
    /// The exit code.
    code: u8,
    /// The scan, when the file could be read as a journal.
    scan: Option<order_gateway::journal::Scan>,
    /// Why it could not be.
    error: Option<String>,
}

/// `journal verify --json`: one object on stdout; returns the exit code.
fn verify_json(file: &std::path::Path) -> u8 {
    let mut problems = Vec::new();
    let read = read_journal_into(file, &mut |_| {}, &mut problems);
    let verdict = match read.code {
        0 => "clean",
        EXIT_TORN => "torn_tail",
        EXIT_DAMAGED => "damaged",
        _ => "unreadable",
    };
    let problems: Vec<String> = problems
        .iter()
        .map(|l| l.trim().to_owned())
        .filter(|l| l != "clean")
        .collect();
    let mut v = serde_json::json!({
        "file": file.display().to_string(),
        "exit_code": read.code,
        "verdict": verdict,
        "problems": problems,
    });
    if let Some(e) = read.error {
        v["error"] = e.into();
    }
    if let Some(scan) = &read.scan {
        let by_kind: serde_json::Map<String, serde_json::Value> = scan
            .by_kind
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| (kind_name(k), (*n).into()))
            .collect();
        v["file_len"] = scan.file_len.into();
        v["segment"] = scan.superblock.as_ref().map(|sb| sb.segment).into();
        v["superblock_durable"] = scan.superblock.as_ref().map(|sb| sb.durable).into();
        v["records"] = scan.records().into();
        v["by_kind"] = by_kind.into();
        v["durable_len"] = scan.durable_len.into();
        v["intact_len"] = scan.valid_len.into();
    }
    println!("{v}");
    read.code
}

fn read_journal_into(
    file: &std::path::Path,
    each: &mut dyn FnMut(order_gateway::journal::RecordView<'_>),
    out: &mut Vec<String>,
) -> JournalRead {
    use order_gateway::gateway::describe;
    use order_gateway::journal::{self, Damage, JournalError};
    let mut unknown: Option<(u64, String)> = None;
    let scan = match journal::read_records(file, |r| {
        if let Err(what) = describe(r.kind, r.payload) {
            unknown.get_or_insert((r.offset, what));
        }
        each(r)
    }) {
        Ok(scan) => scan,
        Err(e @ JournalError::NoCurrentSegment { .. }) => {
            // The file itself is missing: unreadable, and the day is in the archives.
            return JournalRead {
                code: EXIT_UNREADABLE,
                scan: None,
                error: Some(anyhow_chain(&e)),
            };
        }
        Err(e) => {
            return JournalRead {
                code: EXIT_UNREADABLE,
                scan: None,
                error: Some(format!(
                    "{}: not readable as a journal: {}",
                    file.display(),
                    anyhow_chain(&e)
                )),
            };
        }
    };
    let mut code = match scan.damage {
        None => {
            if unknown.is_none() {
                out.push("  clean".to_owned());
            }
            0
        }
        Some(Damage::TornTail { offset, bytes }) => {
            out.push(format!(
                "  torn tail: {bytes} bytes from byte {offset} (an interrupted last write past \
                 the durable point; the gateway cuts it on start)"
            ));
            EXIT_TORN
        }
        Some(Damage::Corrupt {
            offset,
            what,
            next_intact,
        }) => {
            match next_intact {
                Some(n) => out.push(format!(
                    "  DAMAGED at byte {offset} ({what}); intact records follow at byte {n}: \
                     the gateway will not start on it"
                )),
                None => out.push(format!(
                    "  DAMAGED at byte {offset} ({what}), inside the durable part: the gateway \
                     will not start on it"
                )),
            }
            out.push(format!(
                "  `order-gateway journal repair {}` moves bytes {offset}.. aside (it refuses \
                 if that would start an empty day)",
                file.display()
            ));
            EXIT_DAMAGED
        }
        Some(Damage::Segments { archive, what }) => {
            out.push(format!(
                "  DAMAGED segments: {what} (at {}.{archive}): the gateway will not start on it",
                file.display()
            ));
            EXIT_DAMAGED
        }
        Some(Damage::NoCurrentSegment { state, archive }) => {
            out.push(format!(
                "  DAMAGED: this segment is {state} while archived segments up to {}.{archive} \
                 hold the day: the gateway will not start on it",
                file.display()
            ));
            EXIT_DAMAGED
        }
    };
    if let Some((offset, what)) = unknown {
        out.push(format!(
            "  UNKNOWN at byte {offset}: {what}, which this gateway does not know (written by \
             a newer version?): the gateway will not start on it"
        ));
        code = code.max(EXIT_DAMAGED);
    }
    // A segment switch a crash interrupted: the records after this file's are in FILE.next,
    // which the gateway's open (or `journal repair`) finishes first.
    let next = journal::next_segment_path(file);
    match journal::unfinished_switch(file) {
        Ok(true) => {
            let records = journal::verify(&next).map(|s| s.records()).unwrap_or(0);
            out.push(format!(
                "  {} follows: a segment switch a crash interrupted ({records} records after                  this file's); the gateway finishes it at start (this file archived, {}                  renamed over it)",
                next.display(),
                next.display()
            ));
        }
        Ok(false) if next.exists() => out.push(format!(
            "  {}: a leftover of an unfinished checkpoint (nothing in it is the journal's);              the gateway removes it at start",
            next.display()
        )),
        Ok(false) => {}
        Err(e) => {
            out.push(format!(
                "  DAMAGED beside a segment switch a crash interrupted ({}): {}: the gateway                  will not start on it",
                next.display(),
                anyhow_chain(&e)
            ));
            code = code.max(EXIT_DAMAGED);
        }
    }
    JournalRead {
        code,
        scan: Some(scan),
        error: None,
    }
}

fn anyhow_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn dump_record(r: order_gateway::journal::RecordView<'_>, json: bool) {
    use order_gateway::gateway::{describe, kind_name, Field};
    let name = kind_name(r.kind)
        .map(str::to_owned)
        .unwrap_or_else(|| format!("unknown_{}", r.kind));
    let fields = describe(r.kind, r.payload);
    if json {
        let mut line = format!(
            "{{\"offset\":{},\"len\":{},\"kind\":{},\"kind_name\":{}",
            r.offset,
            r.len,
            r.kind,
            json_str(&name)
        );
        match &fields {
            Ok(fields) => {
                for (k, v) in fields {
                    match v {
                        Field::Int(n) => line.push_str(&format!(",{}:{n}", json_str(k))),
                        Field::Text(t) => {
                            line.push_str(&format!(",{}:{}", json_str(k), json_str(t)))
                        }
                    }
                }
            }
            Err(what) => line.push_str(&format!(",\"unknown\":{}", json_str(what))),
        }
        line.push('}');
        println!("{line}");
    } else {
        let mut line = format!("{:>12} {:>6} {name}", r.offset, r.len);
        match &fields {
            Ok(fields) => {
                for (k, v) in fields {
                    match v {
                        Field::Int(n) => line.push_str(&format!(" {k}={n}")),
                        Field::Text(t) => line.push_str(&format!(" {k}={t:?}")),
                    }
                }
            }
            Err(what) => line.push_str(&format!(" UNKNOWN: {what}")),
        }
        println!("{line}");
    }
}

fn journal_cmd(cmd: JournalCmd) -> anyhow::Result<std::process::ExitCode> {
    use order_gateway::journal::{self, Damage};
    use std::process::ExitCode;
    match cmd {
        JournalCmd::Verify { file, json: false } => {
            Ok(ExitCode::from(read_journal(&file, |_| {}, true)))
        }
        JournalCmd::Verify { file, json: true } => Ok(ExitCode::from(verify_json(&file))),
        JournalCmd::Dump { file, json } => {
            let code = read_journal(&file, |r| dump_record(r, json), !json);
            Ok(ExitCode::from(code))
        }
        JournalCmd::Repair { file } => {
            let r = journal::repair(&file)?;
            if r.finished_switch {
                println!(
                    "  finished a segment switch a crash interrupted first, as the gateway's                      start does: the previous segment archived, {} renamed over {}",
                    journal::next_segment_path(&file).display(),
                    file.display()
                );
            }
            print_scan(&file, &r.scan);
            match (r.moved, r.rebuilt_from) {
                (Some((q, _)), Some((archive, carried))) => println!(
                    "  the segment's checkpoint was damaged: rebuilt it from {} (the day up to \
                     this segment's start) and the {carried} records after the checkpoint that \
                     its chain proves; the damaged file was moved whole to {} (records of it \
                     not carried over are no longer replayed: order ids and FIX sequence \
                     numbers in them may be reused, reconcile with the venue)",
                    archive.display(),
                    q.display()
                ),
                (None, _) => println!("  clean: nothing moved"),
                (Some((q, offset)), None) => {
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
    let mut bus = md
        .load_bus()
        .map_err(|(key, problem)| anyhow::anyhow!("{key}: {problem}"))
        .context("fix the configuration file and start again")?;
    // This host's transport settings, not the publisher's file's.
    cfg.rdma.apply_to_mcast(&mut bus);
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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version: exit 0
        Err(e) => {
            // Usage errors exit 64 (EX_USAGE), apart from `journal verify`'s outcomes 1-3.
            let _ = e.print();
            return Ok(std::process::ExitCode::from(EXIT_USAGE));
        }
    };
    match cli.cmd {
        Cmd::Check { config } => {
            load(&config)?;
            println!("{}: ok", config.display());
            Ok(std::process::ExitCode::SUCCESS)
        }
        Cmd::Journal { cmd } => journal_cmd(cmd),
        Cmd::Control {
            config,
            socket,
            command,
        } => {
            let path = &match socket {
                Some(s) => s,
                None => Config::control_socket_of(&config)
                    .context("find the control socket (or give it with --socket PATH)")?,
            };
            let line = command.join(" ");
            let parsed =
                order_gateway::control::parse(&line).map_err(|e| anyhow::anyhow!("{e}"))?;
            let json = parsed == order_gateway::control::Command::Status { json: true };
            let answer =
                order_gateway::control::request(path, &line, std::time::Duration::from_secs(5))
                    .with_context(|| {
                        format!(
                            "talk to the gateway's control socket {}: is the gateway running with \
                         this configuration (and are you allowed to open the socket)?",
                            path.display()
                        )
                    })?;
            if json {
                // One JSON object: the report after the `ok` line, or the error.
                match answer.strip_prefix("ok\n") {
                    Some(report) => print!("{report}"),
                    None => println!(
                        "{}",
                        serde_json::json!({ "error": answer.trim_end().trim_start_matches("error: ") })
                    ),
                }
            } else {
                print!("{answer}");
            }
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
            // Every configured engine connected, and the bus's receive rings.
            let engines = cfg.risk.engines.len().max(1) as u64;
            let pinned = engines * cfg.service.orders.pinned_bytes_per_connection()
                + cfg.market_data.as_ref().map_or(0, |md| {
                    md.load_bus().map_or(0, |bus| {
                        bus.subscriber_pinned_bytes(md.channels.len().max(1))
                    })
                });
            cfg.rdma
                .prepare_process(pinned)
                .context("fix the gateway's host or configuration and start again")?;
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
