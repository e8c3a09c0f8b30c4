//! `feed-handler`: decode, generate, replay and inspect NASDAQ ITCH 5.0, and run the service;
//! the logic is in the library.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use feed_handler::binaryfile::{StreamReader, MIN_CHUNK};
use feed_handler::capture::{self, CaptureReader};
use feed_handler::config::Config;
use feed_handler::generate::{generate_binaryfile, GenConfig};
use feed_handler::inspect::{self, Symbols, TimeOfDay};
use feed_handler::itch;
use feed_handler::pcap::WireFilter;
use feed_handler::service::{RunOptions, Service};
use feed_handler::udp::{Pacing, ReplayConfig, Replayer};
use rocebus::counters::{counters_path, default_dir};
use signal_hook::consts::{SIGINT, SIGTERM};
use std::io::{BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::ops::ControlFlow;
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// NASDAQ TotalView-ITCH 5.0 feed handler and tools: run the service, inspect captures,
/// generate synthetic days, play the exchange.
#[derive(Debug, Parser)]
#[command(version, about, after_long_help = CAPTURE_FORMATS)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What every command that takes a capture file reads.
const CAPTURE_FORMATS: &str = "\
Capture files (decode, book, bbo, export, throughput, replay, run --capture), told apart by \
their first bytes, not their names:
  - BinaryFILE: a 2-byte big-endian length before each ITCH 5.0 message (or all-zero \
prefixes, detected);
  - pcap (microsecond or nanosecond, either byte order; little-endian \"modified\" pcap) and \
pcapng captures of MoldUDP64 over UDP: Ethernet with or without VLAN tags (802.1Q, QinQ), Linux cooked (SLL, SLL2), raw IP or \
loopback; IPv4 and IPv6 (extension headers too), fragments reassembled. The ITCH messages of the first MoldUDP64 session with \
data are read in sequence order: an A and a B feed in one file are delivered once, packets \
of other sessions dropped. A summary goes to stderr: the session and sequences read, \
sequence ranges missing from every feed (count, first and last missing), and the counts of \
what was skipped (non-UDP frames, payloads that are not MoldUDP64, records cut by the snap \
length). --dst-port and --dst-addr keep only the feed's datagrams;
  - any of these gzip-compressed (e.g. NASDAQ's sample files as downloaded, .gz).";

/// Which datagrams of a packet capture (pcap, pcapng) are read; BinaryFILE ignores these.
#[derive(Debug, Clone, Default, clap::Args)]
struct WireArgs {
    /// Packet captures only: read UDP datagrams to this destination port alone (repeat the
    /// option, or separate with commas, for an A and a B feed on two ports); default: every
    /// port. Datagrams left out are counted in the summary on stderr.
    #[arg(long = "dst-port", value_name = "PORT", value_delimiter = ',')]
    dst_port: Vec<u16>,
    /// Packet captures only: read UDP datagrams to this destination address alone, e.g. the
    /// feed's multicast group (repeat, or separate with commas, for the A and B groups);
    /// default: every address.
    #[arg(long = "dst-addr", value_name = "IP", value_delimiter = ',')]
    dst_addr: Vec<IpAddr>,
}

impl WireArgs {
    fn filter(&self) -> WireFilter {
        WireFilter {
            dst_ports: self.dst_port.clone(),
            dst_addrs: self.dst_addr.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every message of a capture as one JSON object per line.
    ///
    /// Field names are the specification's in snake case; prices are decimal strings with
    /// their implied decimals; timestamps are nanoseconds since midnight. Files whose length
    /// prefixes are all zero are detected and read by message type. Bad records are counted
    /// and reported on stderr.
    Decode {
        /// The capture: BinaryFILE (2-byte big-endian length before each message), or a pcap
        /// or pcapng capture of MoldUDP64, either possibly gzip-compressed (see `--help` of
        /// `feed-handler` itself).
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
    },
    /// Print the full-depth order book of one or all symbols at a time of day.
    ///
    /// Applies the capture's messages to the feed handler's own books up to and including
    /// the last one timestamped at or before `--at` (ITCH timestamps are nanoseconds since
    /// midnight), or all of them without `--at`. Per symbol, the price levels are printed
    /// side by side, best first: bid size, orders and price | ask price, size and orders.
    /// Without `--symbol`, every symbol with at least one resting order is printed.
    Book {
        /// The capture (BinaryFILE, pcap or pcapng, possibly gzipped; as for `decode`).
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
        /// Only this symbol (e.g. AAPL); an error if the capture has no such symbol by then.
        #[arg(long)]
        symbol: Option<String>,
        /// Price levels shown per side.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
        depth: u32,
        /// Time of day, HH:MM:SS with up to 9 fraction digits (e.g. 09:30:00.000000000);
        /// default: the end of the file.
        #[arg(long, value_name = "HH:MM:SS.nnnnnnnnn", value_parser = inspect::parse_time_of_day)]
        at: Option<u64>,
    },
    /// Write every top-of-book change of a capture as CSV.
    ///
    /// One row each time the best bid or best ask of a symbol changes price, size or order
    /// count, after the message that changed it, in feed order. Columns:
    /// locate,symbol,timestamp,bid_price,bid_size,bid_orders,ask_price,ask_size,ask_orders, with
    /// timestamps in nanoseconds since midnight, prices as decimals with 4 places, and an
    /// empty side as empty fields. Progress goes to stderr about every second on long files.
    Bbo {
        /// The capture (BinaryFILE, pcap or pcapng, possibly gzipped; as for `decode`).
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
        /// Write the CSV here instead of stdout.
        #[arg(short, long, value_name = "OUT.csv")]
        output: Option<PathBuf>,
    },
    /// Write a capture as Databento Binary Encoding (DBN version 3), as XNAS.ITCH.
    ///
    /// One schema per file; `instrument_id` is the ITCH stock locate, with symbol mapping
    /// records and metadata mappings from the stock directory. ITCH times are nanoseconds
    /// since midnight US Eastern time: `--date` gives the day, DBN times are UNIX
    /// nanoseconds. A capture has no receive time: `ts_recv` is `ts_event`, flagged
    /// F_BAD_TS_RECV. Prices are DBN fixed point (1e-9). An output name ending in `.zst` is
    /// Zstandard-compressed. docs/feed-handler.md's "DBN export" section has the record conventions.
    Export {
        /// The capture (BinaryFILE, pcap or pcapng, possibly gzipped; as for `decode`).
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
        /// Record schema.
        #[arg(long, value_enum)]
        schema: feed_handler::dbnexport::ExportSchema,
        /// Trading date of the capture, YYYY-MM-DD (US Eastern).
        #[arg(long, value_parser = feed_handler::dbnexport::Date::parse)]
        date: feed_handler::dbnexport::Date,
        /// Output file (`.dbn`, or `.dbn.zst` for Zstandard).
        #[arg(short, long, value_name = "OUT.dbn[.zst]")]
        output: PathBuf,
    },
    /// Measure decode + full-depth books over a capture: messages per second.
    ///
    /// Reads the capture in 8 MiB chunks, decodes every message and applies it to the feed
    /// handler's books, counting top-of-book changes (the work of `bbo` without the CSV).
    /// Prints one line: `RESULT msgs_per_sec=R messages=N bbo_changes=B secs=S`, timed from
    /// opening the file to the last message. `cargo xtask bench books` runs it against
    /// itch-book.
    Throughput {
        /// The capture (BinaryFILE, pcap or pcapng, possibly gzipped; as for `decode`).
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
    },
    /// Write a deterministic, seeded ITCH 5.0 day as a BinaryFILE capture.
    Generate {
        /// RNG seed: the same seed and options give the same bytes.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Total messages, including system events and the stock directory.
        #[arg(long, default_value_t = 1_000_000)]
        messages: u64,
        /// Number of symbols.
        #[arg(long, default_value_t = 100)]
        symbols: u16,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Send a capture as MoldUDP64 to a group and serve retransmission requests; or publish
    /// a DBN bus recording on the market-data bus.
    ///
    /// A BinaryFILE capture goes to `--group` as an exchange would send it. A DBN file
    /// (`rocebus record` output, `.dbn` or `.dbn.zst`; also the trades and status files of
    /// `feed-handler export`) is published on the channels of `[market_data]` of `--config`
    /// from `publish.local_ip`, as normalized messages (symbols partitioned by stock locate as
    /// `feed-handler run` does, feed and bus losses as feed-loss messages on every channel),
    /// serving retransmissions and snapshots of what it published to late joiners.
    /// docs/feed-handler.md's "Record and replay" section says what survives the round trip.
    Replay {
        /// The capture (BinaryFILE, pcap or pcapng, possibly gzipped; as for `decode`) or DBN
        /// recording.
        file: PathBuf,
        #[command(flatten)]
        wire: WireArgs,
        /// Capture: destination, e.g. 239.1.1.1:26477 (multicast, TTL 1, loopback on) or a
        /// unicast address.
        #[arg(long)]
        group: Option<SocketAddr>,
        /// DBN recording: the feed handler configuration whose `[market_data]` and
        /// `publish.local_ip` are used.
        #[arg(long, default_value = "configs/feed-handler.toml")]
        config: PathBuf,
        /// Messages (records) per second (default: as fast as possible).
        #[arg(long, conflicts_with = "realtime")]
        rate: Option<u64>,
        /// Pace by the messages' timestamps (ITCH timestamps; DBN `ts_event`).
        #[arg(long)]
        realtime: bool,
        /// UDP port of the retransmission server (0: any free port, printed on start).
        #[arg(long, default_value_t = 0)]
        retrans_port: u16,
        /// MoldUDP64 session name (up to 10 characters).
        #[arg(long, default_value = "ROCEBUS001")]
        session: String,
        /// Keep serving re-requests this many milliseconds after the last one.
        #[arg(long, default_value_t = 2000)]
        linger_ms: u64,
        /// DBN recording: publish nothing until this many subscribers are connected (over
        /// all channels; their handshakes are served meanwhile), so a recorder started first
        /// gets the replay from its first record; fails after 60 s with fewer.
        #[arg(long, value_name = "N", default_value_t = 0)]
        wait_subscribers: usize,
        /// Testing: drop every Nth data packet on first send to exercise re-requests.
        #[arg(long, hide = true)]
        drop_every: Option<u32>,
        /// Capture: megabytes of the most recent messages kept to answer re-requests (the
        /// capture is read as it is sent; older requests go unanswered and are counted).
        #[arg(long, value_name = "MB", default_value_t = 256)]
        history_mb: usize,
    },
    /// Run the feed handler: MoldUDP64 → ITCH → order books → normalized market data on the bus.
    ///
    /// Receives the exchange feed from the UDP multicast group of `[feed]` (or reads the
    /// BinaryFILE capture of `feed.capture` / `--capture`), re-requests MoldUDP64 gaps from
    /// `feed.retrans_server`, keeps full-depth books per symbol, and publishes BBO, level
    /// changes, trades and trading status on the rocebus market-data channels of
    /// `[market_data]`, symbols partitioned by stock locate modulo the number of channels.
    /// Each channel's publisher serves retransmissions and, to late joiners, a snapshot of the
    /// books of its symbols.
    ///
    /// The loop busy-polls (`service.idle`), optionally pinned (`service.core`). Counters
    /// (packets, messages, gaps, re-requests, recovered, malformed, published, bus
    /// back-pressure, ...) live in the shared-memory file `$ROCEBUS_DIR/feed-handler.counters`
    /// (default directory /dev/shm/rocebus), shown live by `rocebus stat`. Bad input is
    /// counted and logged at most `service.bad_input_log_per_sec` times a second.
    /// Stops on SIGINT or SIGTERM, after `--duration`, or with `--exit-on-end-of-session`.
    /// RUST_LOG=info shows progress on stderr.
    Run {
        /// The service configuration (TOML; unknown keys are errors).
        #[arg(long, default_value = "configs/feed-handler.toml")]
        config: PathBuf,
        /// Read this capture instead of the network (overrides `feed.capture`): BinaryFILE,
        /// pcap or pcapng, possibly gzipped (as for `decode`).
        #[arg(long)]
        capture: Option<PathBuf>,
        /// With a packet capture: as `--dst-port`/`--dst-addr` of `decode` (override
        /// `feed.capture_dst_ports` / `feed.capture_dst_addrs`).
        #[command(flatten)]
        wire: WireArgs,
        /// Stop after this many seconds (fractions allowed).
        #[arg(long)]
        duration: Option<f64>,
        /// Stop once the feed's end of session arrived and everything before it was
        /// delivered (or the capture was read), after serving bus recovery to connected
        /// subscribers (see `service.linger_ms`).
        #[arg(long)]
        exit_on_end_of_session: bool,
        /// Before reading the feed, serve the bus until this many subscribers are connected
        /// (at most 60 s; an error then): a capture replayed to recorders that must see it
        /// from its first message. A live feed is buffered by the socket meanwhile.
        #[arg(long, default_value_t = 0)]
        wait_subscribers: usize,
        /// Write the counters here instead of `$ROCEBUS_DIR/feed-handler.counters`.
        #[arg(long)]
        counters: Option<PathBuf>,
    },
}

fn main() -> std::process::ExitCode {
    rocebus_bin_support::main(|| dispatch().map(|()| std::process::ExitCode::SUCCESS))
}

fn dispatch() -> Result<()> {
    rocebus_bin_support::init_logging("error")?;
    match Cli::parse().command {
        Command::Decode { file, wire } => decode(&file, &wire.filter()),
        Command::Book {
            file,
            wire,
            symbol,
            depth,
            at,
        } => book(&file, &wire.filter(), symbol.as_deref(), depth, at),
        Command::Bbo { file, wire, output } => bbo(&file, &wire.filter(), output.as_deref()),
        Command::Throughput { file, wire } => throughput(&file, &wire.filter()),
        Command::Export {
            file,
            wire,
            schema,
            date,
            output,
        } => export(&file, &wire.filter(), schema, date, &output),
        Command::Generate {
            seed,
            messages,
            symbols,
            output,
        } => {
            let (bytes, _) = generate_binaryfile(&GenConfig {
                seed,
                messages,
                symbols,
            });
            std::fs::write(&output, bytes)
                .with_context(|| format!("cannot write {}", output.display()))
        }
        Command::Replay {
            file,
            wire,
            group,
            config,
            rate,
            realtime,
            retrans_port,
            session,
            linger_ms,
            wait_subscribers,
            drop_every,
            history_mb,
        } => {
            if is_dbn(&file)? {
                return replay_dbn(&file, &config, rate, realtime, linger_ms, wait_subscribers);
            }
            let Some(group) = group else {
                bail!(
                    "{}: a capture is replayed to --group ADDR:PORT",
                    file.display()
                );
            };
            // Streamed: memory is a chunk of the capture and the retransmission history.
            let mut input = open(&file, &wire.filter())?;
            let mut reader = StreamReader::new(&mut input);
            reader.start().map_err(|e| read_error(&file, e))?;
            let mut cfg = ReplayConfig::new(group);
            cfg.retrans_bind = SocketAddr::from((Ipv4Addr::UNSPECIFIED, retrans_port));
            cfg.session = session;
            cfg.linger = Duration::from_millis(linger_ms);
            cfg.drop_every = drop_every;
            cfg.pacing = match (rate, realtime) {
                (_, true) => Pacing::Realtime,
                (Some(r), _) => Pacing::MessagesPerSecond(r),
                (None, false) => Pacing::Unpaced,
            };
            cfg.history_bytes = history_mb.saturating_mul(1 << 20);
            let mut replayer = Replayer::new(cfg).context("cannot open UDP sockets for replay")?;
            eprintln!(
                "replaying {} to {group}; retransmission server on {}",
                file.display(),
                replayer.retrans_addr()?
            );
            let stats = replayer
                .run_stream(reader)
                .with_context(|| format!("sending to {group} failed"))?;
            report_stream(&file, &input);
            eprintln!("{stats:?}");
            if stats.messages == 0 {
                return Err(no_messages(&file));
            }
            Ok(())
        }
        Command::Run {
            config,
            capture,
            wire,
            duration,
            exit_on_end_of_session,
            wait_subscribers,
            counters,
        } => run(
            &config,
            capture,
            &wire,
            duration,
            RunFlags {
                exit_on_end_of_session,
                wait_subscribers,
            },
            counters,
        ),
    }
}

/// A publisher never starts with a guessable `[market_data.auth] secret`: it keys the
/// recovery port's admission and the datagram tags, and one captured handshake lets anyone
/// test guesses offline. Empty (no authentication, for a trusted fabric) stays allowed.
fn check_secret(path: &Path, cfg: &Config) -> Result<()> {
    let secret = &cfg.market_data.auth.secret;
    if secret.is_empty() {
        return Ok(());
    }
    rocebus::auth::check_secret(secret)
        .with_context(|| format!("{}: market_data.auth.secret", path.display()))
        .context("fix the configuration file and start again")
}

/// `run`'s flags that go to [`RunOptions`] as they are.
struct RunFlags {
    exit_on_end_of_session: bool,
    wait_subscribers: usize,
}

fn run(
    config: &Path,
    capture: Option<PathBuf>,
    wire: &WireArgs,
    duration: Option<f64>,
    flags: RunFlags,
    counters: Option<PathBuf>,
) -> Result<()> {
    let mut cfg = Config::load(config)?;
    check_secret(config, &cfg)?;
    if capture.is_some() {
        cfg.feed.capture = capture;
    }
    if !wire.dst_port.is_empty() {
        cfg.feed.capture_dst_ports = wire.dst_port.clone();
    }
    if !wire.dst_addr.is_empty() {
        cfg.feed.capture_dst_addrs = wire.dst_addr.clone();
    }
    let duration = match duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            bail!("--duration must be a positive number of seconds")
        }
        d => d.map(Duration::from_secs_f64),
    };
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }
    cfg.rdma
        .prepare_process(cfg.market_data.publisher_pinned_bytes())
        .with_context(|| format!("cannot start the feed handler ({})", config.display()))?;
    let counters = counters.unwrap_or_else(|| counters_path(&default_dir(), "feed-handler"));
    let local_ip = cfg.publish.local_ip;
    let mut service = Service::new(cfg, Some(&counters)).with_context(|| {
        format!(
            "cannot start the feed handler ({}): is {local_ip} the address of an RDMA device? \
             (`rdma link` lists them; in development run it inside `cargo xtask vm`)",
            config.display()
        )
    })?;
    tracing::info!(counters = %counters.display(), "feed handler running");
    let totals = service.run(
        &RunOptions {
            duration,
            exit_on_end_of_session: flags.exit_on_end_of_session,
            wait_subscribers: flags.wait_subscribers,
        },
        &stop,
    )?;
    eprintln!("{totals:?}");
    Ok(())
}

/// A DBN file (plain or Zstandard) rather than a BinaryFILE capture: by its first bytes.
fn is_dbn(file: &Path) -> Result<bool> {
    use std::io::Read as _;
    let mut head = [0u8; 4];
    let mut f =
        std::fs::File::open(file).with_context(|| format!("cannot read {}", file.display()))?;
    let n = f
        .read(&mut head)
        .with_context(|| format!("cannot read {}", file.display()))?;
    Ok(head[..n].starts_with(b"DBN") || head[..n] == [0x28, 0xb5, 0x2f, 0xfd])
}

fn replay_dbn(
    file: &Path,
    config: &Path,
    rate: Option<u64>,
    realtime: bool,
    linger_ms: u64,
    wait_subscribers: usize,
) -> Result<()> {
    use feed_handler::busreplay::{replay, ReplayPace};
    let cfg = Config::load(config)?;
    check_secret(config, &cfg)?;
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(&stop))
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }
    let pace = match (rate, realtime) {
        (_, true) => ReplayPace::Recorded(1.0),
        (Some(r), _) => ReplayPace::Rate(r.max(1)),
        (None, false) => ReplayPace::Unpaced,
    };
    let local_ip = cfg.publish.local_ip;
    eprintln!(
        "replaying {} on {} market-data channels from {local_ip}",
        file.display(),
        cfg.market_data.channels.len()
    );
    let totals = replay(
        file,
        &cfg.market_data,
        local_ip,
        pace,
        Duration::from_millis(linger_ms),
        wait_subscribers,
        &stop,
    )
    .with_context(|| {
        format!(
            "replaying {} failed: is {local_ip} the address of an RDMA device? (`rdma link` \
             lists them; in development run it inside `cargo xtask vm`)",
            file.display()
        )
    })?;
    println!("{totals:?}");
    Ok(())
}

/// The capture at `file` as a stream of BinaryFILE bytes (see `CAPTURE_FORMATS`).
fn open(file: &Path, filter: &WireFilter) -> Result<CaptureReader> {
    capture::open(file, filter).with_context(|| format!("cannot read {}", file.display()))
}

/// An error reading a capture stream; a file that is no BinaryFILE (`detect`'s error) says so.
fn read_error(file: &Path, e: std::io::Error) -> anyhow::Error {
    let not_binaryfile = e
        .get_ref()
        .is_some_and(|inner| inner.is::<feed_handler::binaryfile::DetectError>());
    let what = if not_binaryfile {
        format!("{} is not a BinaryFILE capture", file.display())
    } else {
        format!("cannot read {}", file.display())
    };
    anyhow::Error::new(e).context(what)
}

/// For a packet capture read as a stream: what was read, skipped and missing, on stderr.
fn report_stream(file: &Path, input: &CaptureReader) {
    if let Some(w) = input.wire_report() {
        eprintln!("{}: {}: {w}", file.display(), input.kind());
    }
}

/// After `book` or `bbo` read a whole file: a file without one ITCH message is not a capture.
fn check_read(file: &Path, counters: &feed_handler::binaryfile::ReaderCounters) -> Result<()> {
    if counters.bad_records > 0 || counters.unread_bytes > 0 {
        eprintln!(
            "{}: {} bad records skipped, {} bytes unread",
            file.display(),
            counters.bad_records,
            counters.unread_bytes
        );
    }
    if counters.messages == 0 {
        return Err(no_messages(file));
    }
    Ok(())
}

fn no_messages(file: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "no ITCH message could be read from {} (expected a BinaryFILE capture: a 2-byte \
         big-endian length before each ITCH 5.0 message; or a pcap/pcapng capture of \
         MoldUDP64 carrying ITCH 5.0, whose datagrams --dst-port/--dst-addr select)",
        file.display()
    )
}

fn book(
    file: &Path,
    filter: &WireFilter,
    symbol: Option<&str>,
    depth: u32,
    at: Option<u64>,
) -> Result<()> {
    // Streamed: memory is the books and a chunk, whatever the capture's size.
    let mut input = open(file, filter)?;
    let got = inspect::book_at(&mut input, at).map_err(|e| read_error(file, e))?;
    // With `--at`, a packet capture's summary covers what was read up to that time.
    report_stream(file, &input);
    // With `--at` only what was read is judged; that includes the first later message.
    check_read(file, &got.reader)?;
    let symbols = match symbol {
        Some(name) => {
            inspect::check_symbol(&got.book, name, at).map_err(|e| {
                let known: Vec<&str> = got
                    .book
                    .symbols()
                    .filter_map(|(_, b)| b.stock.as_str())
                    .take(10)
                    .collect();
                anyhow::anyhow!(
                    "{e}; symbols in {} include: {}",
                    file.display(),
                    if known.is_empty() {
                        "(none)".to_owned()
                    } else {
                        known.join(", ")
                    }
                )
            })?;
            Symbols::Named(name)
        }
        None => Symbols::NonEmpty,
    };
    let mut out = BufWriter::new(std::io::stdout().lock());
    match got.last_timestamp {
        Some(t) => writeln!(
            out,
            "# {}: book after {} messages, the last at {}",
            file.display(),
            got.applied,
            TimeOfDay(t)
        ),
        None => writeln!(
            out,
            "# {}: no message at or before that time",
            file.display()
        ),
    }
    .and_then(|()| inspect::write_book(&mut out, &got.book, symbols, depth as usize))
    .and_then(|()| out.flush())
    .or_else(quiet_broken_pipe)
}

fn bbo(file: &Path, filter: &WireFilter, output: Option<&Path>) -> Result<()> {
    // Streamed: memory is the books and a chunk, whatever the capture's size.
    let mut input = open(file, filter)?;
    let kind = input.kind();
    let total_bytes = if kind.format == capture::Format::BinaryFile && !kind.gzip {
        std::fs::metadata(file).ok().map(|m| m.len())
    } else {
        None
    };
    // The output is created with the header, at the first message: a file that is no
    // capture, or holds no message, creates none.
    let mut out = LazyOutput {
        path: output,
        out: None,
        failed: None,
    };
    let start = Instant::now();
    let mut last_report = start;
    let progress = |p: inspect::Progress| {
        let now = Instant::now();
        if now.duration_since(last_report) >= Duration::from_secs(1) {
            last_report = now;
            let done = match p.total_bytes {
                Some(total) => format!("{:.0}%", 100.0 * p.bytes as f64 / total.max(1) as f64),
                None => format!("{} MB", p.bytes >> 20),
            };
            eprintln!(
                "bbo: {done} of {}, {} messages, {} rows, {:.0} s",
                file.display(),
                p.messages,
                p.rows,
                now.duration_since(start).as_secs_f64()
            );
        }
    };
    let totals =
        match inspect::write_bbo(&mut input, total_bytes, &mut out, progress).and_then(|t| {
            out.flush()?;
            Ok(t)
        }) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => {
                return Err(match out.failed {
                    Some(what) => anyhow::Error::new(e).context(what),
                    None => read_error(file, e),
                })
            }
        };
    report_stream(file, &input);
    check_read(file, &totals.reader)?;
    if start.elapsed() >= Duration::from_secs(1) {
        eprintln!(
            "bbo: {} messages, {} rows in {:.1} s",
            totals.messages,
            totals.rows,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// `bbo`'s output, created at the first write; remembers what failed on its side.
struct LazyOutput<'a> {
    /// The file, or stdout.
    path: Option<&'a Path>,
    out: Option<Box<dyn Write>>,
    /// What failed, if the output did.
    failed: Option<String>,
}

impl LazyOutput<'_> {
    fn get(&mut self) -> std::io::Result<&mut Box<dyn Write>> {
        let out: Box<dyn Write> = match (self.out.take(), self.path) {
            (Some(out), _) => out,
            (None, Some(path)) => match std::fs::File::create(path) {
                Ok(f) => Box::new(BufWriter::new(f)),
                Err(e) => {
                    self.failed = Some(format!("cannot create {}", path.display()));
                    return Err(e);
                }
            },
            (None, None) => Box::new(BufWriter::new(std::io::stdout().lock())),
        };
        Ok(self.out.insert(out))
    }

    fn failed<T>(&mut self, r: std::io::Result<T>) -> std::io::Result<T> {
        if r.is_err() && self.failed.is_none() {
            self.failed = Some(match self.path {
                Some(path) => format!("cannot write {}", path.display()),
                None => "cannot write to stdout".to_owned(),
            });
        }
        r
    }
}

impl Write for LazyOutput<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let r = self.get().and_then(|o| o.write(buf));
        self.failed(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let r = match &mut self.out {
            Some(o) => o.flush(),
            None => Ok(()),
        };
        self.failed(r)
    }
}

/// CPU time of this thread so far as the scheduler counts it (first field of
/// `/proc/thread-self/schedstat`, ns); itch-book's side of `cargo xtask bench books` reads the
/// same. `None` where there is no such file.
fn thread_cpu_ns() -> Option<u64> {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn throughput(file: &Path, filter: &WireFilter) -> Result<()> {
    let cpu = thread_cpu_ns();
    let start = Instant::now();
    // Streamed, whatever the format: a gzip or packet capture is decoded chunk by chunk.
    let mut f =
        capture::open(file, filter).with_context(|| format!("cannot open {}", file.display()))?;
    let totals =
        inspect::books_pass(&mut f).with_context(|| format!("cannot read {}", file.display()))?;
    let secs = start.elapsed().as_secs_f64();
    report_stream(file, &f);
    let cpu = match (cpu, thread_cpu_ns()) {
        (Some(a), Some(b)) => format!(" cpu_secs={:.6}", b.saturating_sub(a) as f64 / 1e9),
        _ => String::new(),
    };
    check_read(file, &totals.reader)?;
    println!(
        "RESULT msgs_per_sec={:.1} messages={} bbo_changes={} secs={secs:.6}{cpu}",
        totals.messages as f64 / secs,
        totals.messages,
        totals.bbo_changes
    );
    Ok(())
}

fn export(
    file: &Path,
    filter: &WireFilter,
    schema: feed_handler::dbnexport::ExportSchema,
    date: feed_handler::dbnexport::Date,
    output: &Path,
) -> Result<()> {
    use feed_handler::dbnexport::{export_stream, ExportError, ExportOptions};
    // Streamed, in two passes over the file (the DBN metadata comes first and covers the
    // whole day): memory is the export's state and a chunk, whatever the capture's size.
    let (mut first, mut second) = (open(file, filter)?, open(file, filter)?);
    // A file that is no capture is refused before the output is created.
    StreamReader::with_chunk(open(file, filter)?, MIN_CHUNK)
        .start()
        .map_err(|e| read_error(file, e))?;
    let zstd = output.extension().is_some_and(|e| e == "zst");
    let out = BufWriter::new(
        std::fs::File::create(output)
            .with_context(|| format!("cannot create {}", output.display()))?,
    );
    let opts = ExportOptions { schema, date, zstd };
    let result = export_stream(&mut first, &mut second, &opts, out);
    report_stream(file, &second);
    let totals = match result {
        Ok(t) => t,
        Err(ExportError::Empty) => {
            let _ = std::fs::remove_file(output);
            return Err(no_messages(file));
        }
        Err(ExportError::Read(e)) => {
            let _ = std::fs::remove_file(output);
            return Err(read_error(file, e));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot write {}", output.display())),
    };
    eprintln!(
        "export: {} messages, {} symbols, {} records to {}{}",
        totals.messages,
        totals.symbols,
        totals.records,
        output.display(),
        if totals.unknown_orders > 0 {
            format!(" ({} messages named unknown orders)", totals.unknown_orders)
        } else {
            String::new()
        }
    );
    Ok(())
}

/// A reader that went away (`| head`) is not an error.
fn quiet_broken_pipe(e: std::io::Error) -> Result<()> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Ok(())
    } else {
        Err(e).context("cannot write to stdout")
    }
}

fn decode(file: &Path, filter: &WireFilter) -> Result<()> {
    // Streamed: memory is one chunk, whatever the capture's size.
    let mut input = open(file, filter)?;
    let mut reader = StreamReader::new(&mut input);
    let stdout = std::io::stdout().lock();
    let mut out = BufWriter::new(stdout);
    let mut written = Ok(());
    reader
        .try_for_each(|m| {
            // Bad records are counted and logged (rate-limited) by the reader.
            let Ok(m) = m else {
                return ControlFlow::Continue(());
            };
            written = serde_json::to_writer(&mut out, &itch::to_json(&m))
                .map_err(std::io::Error::from)
                .and_then(|()| out.write_all(b"\n"));
            if written.is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .map_err(|e| read_error(file, e))?;
    let c = *reader.counters();
    let read_bytes = reader.position();
    drop(reader);
    report_stream(file, &input);
    written
        .and_then(|()| out.flush())
        .or_else(quiet_broken_pipe)?;
    if c.bad_records > 0 || c.unread_bytes > 0 {
        eprintln!(
            "{}: {} messages, {} bad records, {} bytes unread",
            file.display(),
            c.messages,
            c.bad_records,
            c.unread_bytes
        );
    }
    // An empty input is an error too: "nothing to decode" is never a silent success.
    if c.messages == 0 {
        if read_bytes == 0 && input.wire_report().is_none() {
            bail!("{} is empty: nothing to decode", file.display());
        }
        bail!("no ITCH message could be decoded from {}", file.display());
    }
    Ok(())
}
