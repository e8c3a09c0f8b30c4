//! `feed-handler`: decode, generate and replay NASDAQ ITCH 5.0; the logic is in the library.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use feed_handler::binaryfile::Reader;
use feed_handler::generate::{generate_binaryfile, GenConfig};
use feed_handler::itch;
use feed_handler::udp::{Pacing, ReplayConfig, Replayer};
use std::io::{BufWriter, Write};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// NASDAQ TotalView-ITCH 5.0 tools: inspect captures, generate synthetic days, play the exchange.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print every message of a BinaryFILE capture as one JSON object per line.
    ///
    /// Field names are the specification's in snake case; prices are decimal strings with
    /// their implied decimals; timestamps are nanoseconds since midnight. Files whose length
    /// prefixes are all zero are detected and read by message type. Bad records are counted
    /// and reported on stderr.
    Decode {
        /// The capture (BinaryFILE: 2-byte big-endian length before each message).
        file: PathBuf,
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
    /// Send a capture as MoldUDP64 to a group and serve retransmission requests.
    Replay {
        /// The capture (BinaryFILE).
        file: PathBuf,
        /// Destination, e.g. 239.1.1.1:26477 (multicast, TTL 1, loopback on) or a unicast address.
        #[arg(long)]
        group: SocketAddr,
        /// Messages per second (default: as fast as possible).
        #[arg(long, conflicts_with = "realtime")]
        rate: Option<u64>,
        /// Pace by the messages' ITCH timestamps.
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
        /// Testing: drop every Nth data packet on first send to exercise re-requests.
        #[arg(long, hide = true)]
        drop_every: Option<u32>,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Decode { file } => decode(&file),
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
            group,
            rate,
            realtime,
            retrans_port,
            session,
            linger_ms,
            drop_every,
        } => {
            let data = read(&file)?;
            let mut reader = Reader::new(&data)
                .with_context(|| format!("{} is not a BinaryFILE capture", file.display()))?;
            let messages: Vec<&[u8]> = reader
                .by_ref()
                .filter_map(Result::ok)
                .map(|m| m.as_bytes())
                .collect();
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
            let mut replayer = Replayer::new(cfg).context("cannot open UDP sockets for replay")?;
            eprintln!(
                "replaying {} messages to {group}; retransmission server on {}",
                messages.len(),
                replayer.retrans_addr()?
            );
            let stats = replayer
                .run(&messages)
                .with_context(|| format!("sending to {group} failed"))?;
            eprintln!("{stats:?}");
            Ok(())
        }
    }
}

fn read(file: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))
}

fn decode(file: &PathBuf) -> Result<()> {
    let data = read(file)?;
    let mut reader = Reader::new(&data)
        .with_context(|| format!("{} is not a BinaryFILE capture", file.display()))?;
    let stdout = std::io::stdout().lock();
    let mut out = BufWriter::new(stdout);
    for m in reader.by_ref() {
        // Bad records are counted and logged (rate-limited) by the reader.
        let Ok(m) = m else { continue };
        serde_json::to_writer(&mut out, &itch::to_json(&m))?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    let c = reader.counters();
    if c.bad_records > 0 || c.unread_bytes > 0 {
        eprintln!(
            "{}: {} messages, {} bad records, {} bytes unread",
            file.display(),
            c.messages,
            c.bad_records,
            c.unread_bytes
        );
    }
    if c.messages == 0 && !data.is_empty() {
        bail!("no ITCH message could be decoded from {}", file.display());
    }
    Ok(())
}
