//! `rocebus record`: the I/O shell around [`feed_handler::busrecord::Recorder`] (which owns
//! the mapping to DBN): subscribers, signals, the output file, progress.

use std::fs::File;
use std::io::BufWriter;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use feed_handler::busrecord::{eastern_midnight_of, RecordCounters, Recorder};
use feed_handler::dbnexport::Date;
use feed_handler::udp::unix_now_ns;
use rocebus::clock::Mono;
use rocebus::counters::{counters_path, default_dir, CountersFile};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{Event, MdSubscriber};
use rocebus::rdma_settings::export::RdmaCountersExport;
use rocebus::rdma_settings::RdmaSettings;

#[derive(Debug, clap::Args)]
pub struct RecordArgs {
    /// Market-data configuration: the feed handler's config (its `[market_data]` table is
    /// used) or a bare rocebus market-data file (configs/md.toml).
    #[arg(long)]
    config: PathBuf,
    /// Channel id to record (repeat for several); default: every channel of the config.
    #[arg(long = "channel", value_name = "ID")]
    channels: Vec<u16>,
    /// Our address on the RDMA device.
    #[arg(long)]
    local: IpAddr,
    /// The publisher's address (the feed handler's `publish.local_ip`): recovery and
    /// snapshots come from there.
    #[arg(long)]
    publisher: IpAddr,
    /// Output file; a name ending in `.zst` is Zstandard-compressed.
    #[arg(short, long, value_name = "OUT.dbn[.zst]")]
    output: PathBuf,
    /// Trading date, YYYY-MM-DD (US Eastern): bus times are nanoseconds since its midnight.
    /// Default: today in US Eastern time.
    #[arg(long, value_parser = Date::parse)]
    date: Option<Date>,
    /// Stop this many seconds after the command starts (fractions allowed), waiting for the
    /// publishers included: a publisher that never answers ends the command with an error
    /// when the time is up.
    #[arg(long)]
    duration: Option<f64>,
    /// Progress line on stderr every this many milliseconds (0: none).
    #[arg(long, default_value_t = 1000)]
    progress_ms: u64,
    /// Counters file for `rocebus stat` (the GID the recorder receives on, with its type,
    /// netdev and MTU, the traffic class, registered memory: `rdma.*`)
    /// [default: $ROCEBUS_DIR/record.counters].
    #[arg(long, value_name = "PATH")]
    counters: Option<PathBuf>,
}

/// `RUST_LOG` when unset: warnings, and the `rdma settings` and `recorder GID` lines.
pub const LOG_FILTER: &str = "warn,rocebus::rdma_settings=info";

/// Where the kernel lists RDMA devices.
const RDMA_SYSFS: &str = "/sys/class/infiniband";

/// The `[market_data]` table of `path`, or the whole file when it has none.
fn load_bus(path: &Path) -> anyhow::Result<McastConfig> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("{} is not TOML", path.display()))?;
    // The file's top-level [rdma] (a feed handler's config, or md.toml's own).
    let rdma = RdmaSettings::from_table(&table)
        .with_context(|| format!("{}: invalid [rdma] table", path.display()))?;
    let bus = match table.remove("market_data") {
        Some(toml::Value::Table(t)) => toml::to_string(&t)?,
        Some(_) => bail!("{}: market_data is not a table", path.display()),
        None => text,
    };
    let mut bus = McastConfig::from_toml_str(&bus)
        .with_context(|| format!("{}: not a market-data configuration", path.display()))?;
    rdma.apply_to_mcast(&mut bus);
    Ok(bus)
}

fn summary(c: &RecordCounters) -> String {
    format!(
        "{} messages (bbo {}, levels {}, trades {}, status {}, feed losses {}), {} bus losses \
         ({} messages lost), {} snapshots ({} refused), {} malformed, {} symbols, {} DBN records",
        c.messages,
        c.bbo,
        c.levels,
        c.trades,
        c.status,
        c.feed_losses,
        c.bus_losses,
        c.bus_lost_messages,
        c.snapshots,
        c.rejected_snapshots,
        c.malformed,
        c.symbols,
        c.records
    )
}

pub fn record(args: &RecordArgs) -> anyhow::Result<()> {
    let cfg = load_bus(&args.config)?;
    let ids: Vec<u16> = if args.channels.is_empty() {
        cfg.channels.iter().map(|c| c.id).collect()
    } else {
        args.channels.clone()
    };
    if let Some(id) = ids.iter().find(|&&id| cfg.channel(id).is_none()) {
        bail!("channel {id} is not in {}", args.config.display());
    }
    if ids.is_empty() {
        bail!("{} has no channel", args.config.display());
    }
    cfg.rdma
        .prepare_process(cfg.subscriber_pinned_bytes(ids.len()))
        .with_context(|| format!("cannot record the bus of {}", args.config.display()))?;
    // The duration counts from the start: waiting for a publisher is part of it.
    let start = Instant::now();
    let duration = match args.duration {
        Some(d) if !(d.is_finite() && d > 0.0) => {
            bail!("--duration must be a positive number of seconds")
        }
        d => d.map(Duration::from_secs_f64),
    };
    let midnight = args.date.map_or_else(
        || eastern_midnight_of(unix_now_ns()),
        |d| d.eastern_midnight_unix_ns(),
    );
    // Without any RDMA device no publisher can ever be reached: say so now instead of
    // waiting (for ever without --duration).
    if !std::fs::read_dir(RDMA_SYSFS).is_ok_and(|mut d| d.next().is_some()) {
        bail!(
            "no RDMA device ({RDMA_SYSFS} is empty or missing): run where {} is the address \
             of an RDMA device (`cargo xtask vm`, or `rdma link add`)",
            args.local
        );
    }
    let counters = args
        .counters
        .clone()
        .unwrap_or_else(|| counters_path(&default_dir(), "record"));
    // The GID the subscribers join and connect from, logged too. A recording does not stop
    // for want of its counters: a file that cannot be made is a warning.
    let rdma = CountersFile::create(&counters, 16)
        .and_then(|file| {
            let e = RdmaCountersExport::for_address(
                &file,
                "rdma",
                cfg.rdma.ud_class(),
                args.local,
                "recorder",
            )?;
            Ok((file, e))
        })
        .map_err(|e| eprintln!("rocebus record: no counters for rocebus stat: {e}"))
        .ok();
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop))
            .context("cannot install the SIGINT/SIGTERM handlers")?;
    }
    let file = File::create(&args.output)
        .with_context(|| format!("cannot create {}", args.output.display()))?;
    let zstd = args.output.extension().is_some_and(|e| e == "zst");
    let mut rec = Recorder::new(BufWriter::new(file), zstd, midnight, ids.len())
        .context("cannot start the DBN stream")?;
    // Wait for the publisher of each channel: with the recovery link up from the start, the
    // beginning of a session published before we joined comes from its history
    // (`recovery.join_replay_max`), later joins from a snapshot, and no hole is given up for
    // want of a link.
    let mut subs = Vec::with_capacity(ids.len());
    for &id in &ids {
        let mut said = false;
        let sub = loop {
            // Either transport, as the channel's `transport` says (multicast or rc).
            match MdSubscriber::connect(&cfg, id, args.local, args.publisher) {
                Ok(s) => break s,
                Err(e) => {
                    // ORDERING: Relaxed: a flag with no data attached.
                    if stop.load(Ordering::Relaxed) {
                        bail!("stopped before the publisher of channel {id} answered");
                    }
                    if duration.is_some_and(|d| start.elapsed() >= d) {
                        bail!(
                            "the publisher of channel {id} at {} did not answer within \
                             --duration ({e})",
                            args.publisher
                        );
                    }
                    if !said {
                        said = true;
                        eprintln!(
                            "rocebus record: waiting for the publisher of channel {id} at {} \
                             ({e}); is {} the address of an RDMA device?",
                            args.publisher, args.local
                        );
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        };
        subs.push(sub);
    }
    eprintln!(
        "rocebus record: recording channels {ids:?} to {}; stop with SIGINT or SIGTERM",
        args.output.display()
    );
    let recording = Instant::now();
    let progress = Duration::from_millis(args.progress_ms);
    let mut next_progress = recording + progress;
    let mut next_flush = recording + Duration::from_secs(1);
    // ORDERING: Relaxed: a flag with no data attached; re-read every pass.
    while !stop.load(Ordering::Relaxed) && duration.is_none_or(|d| start.elapsed() < d) {
        let now = Mono::now();
        rec.set_ts_recv(unix_now_ns());
        let mut work = 0;
        for (i, (s, &id)) in subs.iter_mut().zip(&ids).enumerate() {
            work += s
                .poll(now, &mut rec.channel(i), 64)
                .with_context(|| format!("receiving channel {id} failed"))?;
            while let Some(ev) = s.poll_event() {
                match ev {
                    Event::UnrecoverableLoss { from, to } => {
                        rec.bus_loss(id, from, to);
                        eprintln!("rocebus record: channel {id}: messages {from}..{to} lost");
                    }
                    other => eprintln!("rocebus record: channel {id}: {other:?}"),
                }
            }
        }
        if let Some(e) = rec.take_error() {
            return Err(e).with_context(|| format!("writing {} failed", args.output.display()));
        }
        let t = Instant::now();
        if t >= next_flush {
            next_flush = t + Duration::from_secs(1);
            if let Some((_, r)) = &rdma {
                r.update();
            }
            rec.flush()
                .with_context(|| format!("writing {} failed", args.output.display()))?;
        }
        if !progress.is_zero() && t >= next_progress {
            next_progress = t + progress;
            eprintln!("rocebus record: {}", summary(rec.counters()));
        }
        if work == 0 {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
    for s in &mut subs {
        s.disconnect();
    }
    let totals = rec
        .finish()
        .with_context(|| format!("finishing {} failed", args.output.display()))?;
    println!(
        "rocebus record: {}: {}",
        args.output.display(),
        summary(&totals)
    );
    Ok(())
}
