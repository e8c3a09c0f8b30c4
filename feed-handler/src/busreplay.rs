//! `feed-handler replay FILE.dbn[.zst]`: a bus recording (or an export's trades/status file)
//! published on the market-data bus again, as normalized messages.
//!
//! The I/O shell: reads records with the `dbn` decoder, converts them with
//! [`crate::busrecord::Replayer`], publishes through [`BusSink`] (symbols partitioned by
//! stock locate over the configured channels, as `feed-handler run` does; feed losses on
//! every channel), and serves late joiners the snapshot of what it has published (one
//! [`MarketView`] per channel). Never outruns the publishers: while more than half of a
//! channel's history is flushed but not yet sent (pacing), it waits.

use crate::bus::{wait_for_subscribers, BusSink, NoSubscribers};
use crate::busrecord::{Replayed, Replayer};
use crate::normalized::MAX_LEN;
use crate::publish::MdSink;
use crate::udp::unix_now_ns;
use crate::view::MarketView;
use dbn::decode::{DecodeRecordRef, DynDecoder};
use dbn::VersionUpgradePolicy;
use rocebus::clock::{now_ns, Mono};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{NetError, Snapshot};
use std::net::IpAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How fast to publish.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReplayPace {
    /// As fast as the publishers' pacing allows.
    Unpaced,
    /// This many records per second.
    Rate(u64),
    /// At the recorded speed (by `ts_event`), times `speed`.
    Recorded(f64),
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayTotals {
    /// DBN records read.
    pub records: u64,
    /// Normalized messages published (a feed loss counts once per channel).
    pub published: u64,
    /// Feed-loss records replayed (exchange or bus losses of the recording).
    pub losses: u64,
    /// Symbol mappings read.
    pub mappings: u64,
    /// Snapshot clear records (no bus equivalent: skipped).
    pub snapshot_clears: u64,
    /// Records with no bus equivalent (skipped).
    pub unsupported: u64,
    /// Messages the publishers refused (too large: never for normalized messages).
    pub refused: u64,
}

/// Why a replay failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The file could not be opened or read as DBN.
    #[error("cannot read {path} as DBN")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: dbn::Error,
    },
    /// The bus publishers failed.
    #[error("market-data bus on {local_ip}")]
    Bus {
        /// Our address.
        local_ip: IpAddr,
        /// Why.
        #[source]
        source: NetError,
    },
    /// Fewer subscribers than asked for connected in time.
    #[error(transparent)]
    NoSubscribers(#[from] NoSubscribers),
}

/// Records published between two polls of the publishers when nothing makes the replay wait.
const POLL_EVERY: u64 = 64;

/// One channel's view as a snapshot at the channel's last published sequence.
struct ViewAt<'a> {
    view: &'a MarketView,
    seq: u64,
}

impl Snapshot for ViewAt<'_> {
    fn snapshot_seq(&self) -> u64 {
        self.seq
    }
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        self.view.write_l2(out);
    }
}

fn poll(sink: &mut BusSink, views: &[MarketView], now: u64) -> Result<usize, NetError> {
    let mut sent = 0;
    for (i, v) in views.iter().enumerate() {
        let i = i as u16;
        let seq = sink.last_seq(i);
        sent += sink.poll_channel(i, Mono::from_nanos(now), &ViewAt { view: v, seq })?;
    }
    Ok(sent)
}

/// Publishes the records of `path` on the bus of `cfg` from `local_ip`, then serves
/// recovery for `linger`. With `wait_subscribers` > 0 it first serves handshakes, publishing
/// nothing, until that many subscribers are connected (over all channels; an error after
/// [`WAIT_SUBSCRIBERS_LIMIT`](crate::bus::WAIT_SUBSCRIBERS_LIMIT)): a recording of the replay
/// then starts at its first record.
/// Stops early when `stop` is set.
pub fn replay(
    path: &Path,
    cfg: &McastConfig,
    local_ip: IpAddr,
    pace: ReplayPace,
    linger: Duration,
    wait_subscribers: usize,
    stop: &AtomicBool,
) -> Result<ReplayTotals, ReplayError> {
    let read_err = |source| ReplayError::Read {
        path: path.display().to_string(),
        source,
    };
    let bus_err = |source| ReplayError::Bus { local_ip, source };
    let mut dec =
        DynDecoder::from_file(path, VersionUpgradePolicy::UpgradeToV3).map_err(read_err)?;
    let session = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
        .max(1);
    let mut sink = BusSink::new(cfg, session, local_ip).map_err(bus_err)?;
    let channels = sink.channels();
    let mut views: Vec<MarketView> = (0..channels).map(|_| MarketView::new()).collect();
    let backlog_limit = (cfg.history_depth / 2).max(1) as u64;
    let mut conv = Replayer::new();
    let mut totals = ReplayTotals::default();
    let mut buf = [0u8; MAX_LEN];
    wait_for_subscribers(wait_subscribers, stop, |now| {
        sink.set_now(now);
        poll(&mut sink, &views, now.as_nanos()).map_err(bus_err)?;
        Ok::<_, ReplayError>(sink.connections())
    })?;
    let start = Instant::now();
    let mut first_ts: Option<u64> = None;
    let mut last_progress = Instant::now();
    // ORDERING: Relaxed: a flag with no data attached; re-read every record.
    while !stop.load(Ordering::Relaxed) {
        let Some(rec) = dec.decode_record_ref().map_err(read_err)? else {
            break;
        };
        totals.records += 1;
        // When this record is due, in nanoseconds since the start.
        let due = match pace {
            ReplayPace::Unpaced => 0,
            ReplayPace::Rate(r) => totals.records.saturating_mul(1_000_000_000) / r.max(1),
            ReplayPace::Recorded(speed) => {
                let ts = rec.header().ts_event;
                let first = *first_ts.get_or_insert(ts);
                (ts.saturating_sub(first) as f64 / speed) as u64
            }
        };
        let replayed = conv.convert(rec, unix_now_ns(), &mut buf);
        // Every POLL_EVERY records (publishing sends full datagrams itself), and while
        // waiting until the record is due or every publisher has room: poll the publishers.
        let mut now = now_ns();
        sink.set_now(Mono::from_nanos(now));
        if totals.records % POLL_EVERY == 0 {
            poll(&mut sink, &views, now).map_err(bus_err)?;
        }
        loop {
            let behind = (0..channels).any(|i| sink.backlog(i) > backlog_limit);
            let elapsed = start.elapsed().as_nanos() as u64;
            // ORDERING: Relaxed: the stop flag carries no data (as above).
            if (!behind && elapsed >= due) || stop.load(Ordering::Relaxed) {
                break;
            }
            if !behind && due - elapsed > 200_000 {
                std::thread::sleep(Duration::from_micros(100));
            }
            now = now_ns();
            sink.set_now(Mono::from_nanos(now));
            poll(&mut sink, &views, now).map_err(bus_err)?;
        }
        let mut publish = |sink: &mut BusSink, ch: u16, len: usize| {
            match sink.publish(ch, &buf[..len]) {
                Ok(()) => {
                    totals.published += 1;
                    // Published messages are valid normalized messages: apply cannot fail.
                    let _ = views[usize::from(ch)].apply(&buf[..len]);
                }
                Err(_) => totals.refused += 1,
            }
        };
        match replayed {
            Replayed::Message { locate, len } => publish(&mut sink, locate % channels, len),
            Replayed::Broadcast { len } => {
                totals.losses += 1;
                for ch in 0..channels {
                    publish(&mut sink, ch, len);
                }
            }
            Replayed::Mapping => totals.mappings += 1,
            Replayed::SnapshotClear => totals.snapshot_clears += 1,
            Replayed::Unsupported => totals.unsupported += 1,
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            tracing::info!(
                records = totals.records,
                published = totals.published,
                "replaying"
            );
        }
    }
    sink.flush(Mono::now()).map_err(bus_err)?;
    // Serve recovery (retransmissions, snapshots) to the subscribers before leaving.
    let until = Instant::now() + linger;
    // ORDERING: Relaxed: the stop flag carries no data (as above).
    while Instant::now() < until && !stop.load(Ordering::Relaxed) {
        let now = now_ns();
        let work = poll(&mut sink, &views, now).map_err(bus_err)?;
        if work == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
    sink.flush(Mono::now()).map_err(bus_err)?;
    Ok(totals)
}
