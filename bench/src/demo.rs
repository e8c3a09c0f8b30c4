//! The demo's sample trading engine (`sample-engine`, run by `cargo xtask demo`).
//!
//! It shows an engine embedding rocebus end to end: it subscribes to the feed handler's
//! normalized market data on the UD multicast bus, keeps a best bid/offer per traded symbol,
//! and on a fixed schedule sends a day limit order that joins the book (buy at the best bid,
//! sell at the best ask, alternating) to the order gateway over RC; acks, fills and rejects
//! come back on the same connection.
//!
//! It is also the demo's measuring instrument, so the figures are honest:
//! - order round trip: from the order's *intended* send time on the fixed schedule
//!   ([`FixedRateSchedule`]) to the venue's ack arriving back in the engine, so a stall
//!   anywhere shows as the latency every scheduled order would have seen (coordinated
//!   omission corrected);
//! - market-data latency: from the kernel's receive stamp of the exchange packet the feed
//!   handler reads (a raw-socket probe, [`tap`]) to the engine's handler, per normalized
//!   message (matched by its ITCH timestamp).
//!
//! The round trip is taken on CLOCK_MONOTONIC inside the engine ([`monotonic_ns`]); the
//! market-data latency on CLOCK_REALTIME, the clock of the kernel's stamps, read on the same
//! host ([`realtime_ns`]).
//!
//! Split as the rest of rocebus: [`Strategy`], [`OrderTimes`] and [`MdView`] are I/O-free
//! and tested here; [`run`] is the thin loop that moves bytes. The module owns no wire format
//! (those are `rocebus_md::normalized` and `rocebus_engine::proto`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use rocebus::counters::{counters_path, default_dir, Counter, CountersFile, Kind};
use rocebus::idle::{pin_current_thread, IdleStrategy, Idler};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::net::SubscriberCountersExport;
use rocebus::mcast::{Event, Handler, McastSubscriber, RestoreError, SnapshotSink};
use rocebus::orders::{OfferError, OrdersConfig};
use rocebus_engine::client::{ClientError, EngineSession};
use rocebus_engine::proto::{RejectReason, Response, Side, Symbol};
use rocebus_md::normalized::{self, Normalized};
use serde::Deserialize;

pub mod tap;

use crate::report::{
    plot_percentiles, summary_table, write_hgrm_file, FixedRateSchedule, LatencyRecorder,
    PlotFormat, Summary,
};

/// The clocks of the report's figures, as named in the report.
pub const CLOCK_NAME: &str = "order round trip on CLOCK_MONOTONIC (engine); market data from the \
kernel's receive stamp of the exchange packet (SO_TIMESTAMPNS, CLOCK_REALTIME) to CLOCK_REALTIME \
in the engine's handler, same host";

/// Nanoseconds of CLOCK_MONOTONIC: the same clock in every process of the host, so a stamp
/// taken in the feed handler can be compared with one taken in the engine.
#[allow(unsafe_code)]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_MONOTONIC is supported by every Linux kernel (the call cannot fail with it).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

// ---------------------------------------------------------------------------------------
// Configuration

/// The engine's configuration file (`configs/demo/sample-engine.toml`). Unknown keys are
/// errors; relative paths are relative to the configuration file's folder.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the order gateway listens and who we are.
    pub gateway: GatewayConfig,
    /// The market-data bus.
    pub market_data: MarketDataConfig,
    /// What the strategy trades and how often.
    pub strategy: StrategyConfig,
    /// The polling thread.
    #[serde(default)]
    pub engine: LoopConfig,
}

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's RC listen address, `ip:port`.
    pub addr: SocketAddr,
    /// Our engine id (the gateway's `[[risk.engines]]` entry).
    pub engine_id: u32,
    /// Our engine's secret (that entry's `token`).
    pub engine_token: String,
    /// The account orders are sent for.
    pub account: u32,
    /// The orders path; `token` must match the gateway's.
    pub orders: OrdersConfig,
    /// How long to keep trying to connect (the gateway may still be starting), ms.
    #[serde(default = "default_connect_ms")]
    pub connect_timeout_ms: u64,
    /// How long the gateway may be silent (no frame, no heartbeat) before the engine
    /// declares it dead and stops sending, ms.
    #[serde(default = "default_gateway_timeout_ms")]
    pub gateway_timeout_ms: u64,
}

fn default_connect_ms() -> u64 {
    20_000
}

fn default_gateway_timeout_ms() -> u64 {
    rocebus_engine::client::DEFAULT_GATEWAY_TIMEOUT.as_millis() as u64
}

/// `[market_data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketDataConfig {
    /// The market-data path configuration (`McastConfig` TOML), shared with the feed handler.
    pub config: PathBuf,
    /// Channels to subscribe to (default: every channel of `config`).
    #[serde(default)]
    pub channels: Vec<u16>,
    /// Our address on the RDMA device.
    pub local: IpAddr,
    /// The feed handler's address (its recovery service).
    pub publisher: IpAddr,
    /// The exchange feed's group and port (the feed handler's `feed.group`): the latency
    /// probe watches packets sent there (absent: market-data latency not measured).
    #[serde(default)]
    pub exchange_feed: Option<std::net::SocketAddrV4>,
}

/// `[strategy]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyConfig {
    /// Symbols traded (up to [`MAX_SYMBOLS`]).
    pub symbols: Vec<String>,
    /// Orders per second on the fixed schedule.
    pub orders_per_second: u64,
    /// Shares per order.
    pub quantity: u32,
}

/// `[engine]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopConfig {
    /// Core to pin the polling thread to (absent: not pinned).
    #[serde(default)]
    pub core: Option<usize>,
    /// Idle strategy when a pass found no work.
    #[serde(default)]
    pub idle: IdleStrategy,
}

/// Most symbols one engine trades (the quote table is a fixed array, searched linearly).
pub const MAX_SYMBOLS: usize = 64;

/// A configuration file that cannot be used; the message names the file, the key and the
/// problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or unknown, missing or mistyped keys (toml's message names the key).
    #[error("config {path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// toml's description, with the key and line.
        message: String,
    },
    /// A value parses but cannot be used.
    #[error("config {path}: {key}: {problem}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl EngineConfig {
    /// Reads, parses and validates `path`; relative paths inside are made relative to its
    /// folder.
    pub fn load(path: &Path) -> Result<EngineConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut cfg = EngineConfig::parse(&text).map_err(|e| match e {
            ParseError::Toml(message) => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            ParseError::Invalid(key, problem) => ConfigError::Invalid {
                path: path.to_owned(),
                key,
                problem,
            },
        })?;
        if cfg.market_data.config.is_relative() {
            let dir = path.parent().unwrap_or(Path::new("."));
            cfg.market_data.config = dir.join(&cfg.market_data.config);
        }
        Ok(cfg)
    }

    fn parse(text: &str) -> Result<EngineConfig, ParseError> {
        let cfg: EngineConfig =
            toml::from_str(text).map_err(|e| ParseError::Toml(e.to_string()))?;
        let invalid = |key, problem: &str| Err(ParseError::Invalid(key, problem.to_owned()));
        let s = &cfg.strategy;
        if s.symbols.is_empty() || s.symbols.len() > MAX_SYMBOLS {
            return invalid(
                "strategy.symbols",
                &format!("give 1 to {MAX_SYMBOLS} symbols"),
            );
        }
        if let Some(bad) = s.symbols.iter().find(|s| Symbol::new(s).is_none()) {
            return invalid(
                "strategy.symbols",
                &format!("{bad:?} is not a symbol (1 to 8 printable ASCII characters)"),
            );
        }
        if s.orders_per_second == 0 || s.orders_per_second > 1_000_000 {
            return invalid("strategy.orders_per_second", "must be 1 to 1000000");
        }
        if s.quantity == 0 {
            return invalid("strategy.quantity", "must be at least 1");
        }
        if cfg.gateway.orders.token.is_empty() {
            return invalid(
                "gateway.orders.token",
                "is empty: set the gateway's [service.orders] token",
            );
        }
        Ok(cfg)
    }
}

enum ParseError {
    Toml(String),
    Invalid(&'static str, String),
}

// ---------------------------------------------------------------------------------------
// Strategy (I/O-free)

/// Best bid and offer of one symbol, prices with 4 implied decimals; 0 means the side is
/// empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quote {
    /// Best bid price.
    pub bid: u32,
    /// Best ask price.
    pub ask: u32,
}

/// What the strategy wants to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIntent {
    /// Instrument.
    pub symbol: Symbol,
    /// Side.
    pub side: Side,
    /// Shares.
    pub qty: u32,
    /// Limit price, 4 implied decimals.
    pub price: i64,
}

/// The sample strategy: joins the book of each traded symbol in turn, buying at the best
/// bid and selling at the best ask alternately, so the position stays near flat.
#[derive(Debug, Clone)]
pub struct Strategy {
    symbols: Vec<(Symbol, Quote)>,
    next: usize,
    sells: Vec<bool>,
    /// Per symbol: trading is halted, paused or quotation-only (the gateway would reject
    /// orders as `Halted`), as the last status message said.
    halted: Vec<bool>,
    qty: u32,
}

impl Strategy {
    /// A strategy trading `symbols` (already validated) `qty` shares at a time.
    pub fn new(symbols: &[Symbol], qty: u32) -> Strategy {
        Strategy {
            symbols: symbols.iter().map(|s| (*s, Quote::default())).collect(),
            next: 0,
            sells: vec![false; symbols.len()],
            halted: vec![false; symbols.len()],
            qty,
        }
    }

    /// Applies a trading status (ITCH state: b'H' halted, b'P' paused, b'Q' quotation
    /// only, b'T' trading); returns false if the symbol is not traded. No orders go out for
    /// a symbol that cannot trade: the gateway's risk would only reject them.
    pub fn on_status(&mut self, stock: &[u8; 8], state: u8) -> bool {
        match self.symbols.iter().position(|(s, _)| &s.0 == stock) {
            Some(i) => {
                self.halted[i] = matches!(state, b'H' | b'P' | b'Q');
                true
            }
            None => false,
        }
    }

    /// Applies one BBO update; returns false if the symbol is not traded.
    pub fn on_bbo(&mut self, stock: &[u8; 8], quote: Quote) -> bool {
        match self.symbols.iter_mut().find(|(s, _)| &s.0 == stock) {
            Some((_, q)) => {
                *q = quote;
                true
            }
            None => false,
        }
    }

    /// The current quote of `symbol`.
    pub fn quote(&self, symbol: Symbol) -> Option<Quote> {
        self.symbols
            .iter()
            .find(|(s, _)| *s == symbol)
            .map(|(_, q)| *q)
    }

    /// Forgets every quote (after a market-data re-synchronisation).
    pub fn clear_quotes(&mut self) {
        for (_, q) in &mut self.symbols {
            *q = Quote::default();
        }
    }

    /// The next order: the next symbol (round robin) that is trading and whose book has the
    /// side it is due to trade; `None` while no traded symbol has a usable quote.
    pub fn next_order(&mut self) -> Option<OrderIntent> {
        let n = self.symbols.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let (symbol, q) = self.symbols[i];
            let sell = self.sells[i];
            let price = if sell { q.ask } else { q.bid };
            if price == 0 || self.halted[i] {
                continue;
            }
            self.next = (i + 1) % n;
            self.sells[i] = !sell;
            return Some(OrderIntent {
                symbol,
                side: if sell { Side::Sell } else { Side::Buy },
                qty: self.qty,
                price: i64::from(price),
            });
        }
        None
    }
}

/// Intended send times of the orders, by order id, allocated once for the whole run.
#[derive(Debug, Clone)]
pub struct OrderTimes {
    first_id: u64,
    intended: Vec<u64>,
}

impl OrderTimes {
    /// Room for `capacity` orders with ids from `first_id`.
    pub fn new(first_id: u64, capacity: usize) -> OrderTimes {
        OrderTimes {
            first_id,
            intended: vec![0; capacity],
        }
    }

    /// True when `id` has no slot (the run sent more orders than planned).
    pub fn is_full(&self, id: u64) -> bool {
        self.slot(id).is_none()
    }

    fn slot(&self, id: u64) -> Option<usize> {
        let i = usize::try_from(id.checked_sub(self.first_id)?).ok()?;
        (i < self.intended.len()).then_some(i)
    }

    /// Remembers that order `id` was due at `intended_ns`.
    pub fn set(&mut self, id: u64, intended_ns: u64) {
        if let Some(i) = self.slot(id) {
            self.intended[i] = intended_ns;
        }
    }

    /// Takes the intended time of `id` (each order is measured once: its first answer).
    pub fn take(&mut self, id: u64) -> Option<u64> {
        let i = self.slot(id)?;
        let t = std::mem::take(&mut self.intended[i]);
        (t != 0).then_some(t)
    }
}

/// Nanoseconds of CLOCK_REALTIME, the clock of the kernel's receive stamps
/// ([`tap`]).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Market-data counts seen by the handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MdCounts {
    /// Messages delivered.
    pub messages: u64,
    /// BBO updates of traded symbols.
    pub bbo_traded: u64,
    /// Trading status changes of traded symbols (a halted symbol is not quoted).
    pub status_traded: u64,
    /// Messages that were not normalized messages (counted, dropped).
    pub malformed: u64,
    /// Snapshots applied (the quote table restarts empty).
    pub restores: u64,
    /// Messages whose exchange packet the probe did not see (no latency recorded).
    pub unstamped: u64,
}

/// The engine's market-data handler: feeds BBOs into the strategy and records latency.
#[derive(Debug)]
pub struct MdView {
    /// The strategy it feeds.
    pub strategy: Strategy,
    /// Receive-to-handler latency.
    pub latency: LatencyRecorder,
    /// Counts.
    pub counts: MdCounts,
    /// Arrival times of the exchange's messages (absent: latency not measured).
    pub stamps: Option<tap::StampTable>,
    /// Messages handled before their packet's stamp reached the table (the probe's thread
    /// can lag the bus): (ITCH timestamp, handled at), resolved by [`MdView::resolve`].
    pending: Vec<(u64, u64)>,
    clock: fn() -> u64,
}

/// Messages waiting for their stamp; beyond this they are counted as unstamped.
const MAX_PENDING: usize = 8192;

impl MdView {
    /// A view feeding `strategy`; with `stamps`, each message's latency is `clock()` (read
    /// once per message) minus its exchange packet's arrival.
    pub fn new(
        strategy: Strategy,
        stamps: Option<tap::StampTable>,
        clock: fn() -> u64,
    ) -> anyhow::Result<Self> {
        Ok(MdView {
            strategy,
            latency: LatencyRecorder::new()?,
            counts: MdCounts::default(),
            stamps,
            pending: Vec::with_capacity(MAX_PENDING),
            clock,
        })
    }
}

impl MdView {
    /// Records the messages whose stamps arrived since they were handled; with `last`,
    /// counts the rest as unstamped. Call after draining the probe.
    pub fn resolve(&mut self, last: bool) {
        let Some(stamps) = &self.stamps else { return };
        let (latency, counts) = (&mut self.latency, &mut self.counts);
        self.pending.retain(|&(ts, handled)| match stamps.get(ts) {
            Some(received) => {
                latency.record(received, handled);
                false
            }
            None if last => {
                counts.unstamped += 1;
                false
            }
            None => true,
        });
    }
}

impl Handler for MdView {
    fn on_message(&mut self, _seq: u64, msg: &[u8]) {
        self.counts.messages += 1;
        let m = match normalized::decode(msg) {
            Ok(m) => m,
            Err(_) => {
                self.counts.malformed += 1;
                return;
            }
        };
        if let Some(stamps) = &self.stamps {
            let itch_ts = match m {
                Normalized::Bbo(x) => x.header.timestamp.get(),
                Normalized::Level(x) => x.header.timestamp.get(),
                Normalized::Trade(x) => x.header.timestamp.get(),
                Normalized::Status(x) => x.header.timestamp.get(),
                Normalized::FeedLoss(x) => x.header.timestamp.get(),
            };
            let now = (self.clock)();
            match stamps.get(itch_ts) {
                Some(received) => self.latency.record(received, now),
                None if self.pending.len() < MAX_PENDING => self.pending.push((itch_ts, now)),
                None => self.counts.unstamped += 1,
            }
        }
        match m {
            Normalized::Bbo(b) => {
                let quote = Quote {
                    bid: b.bid_price.get(),
                    ask: b.ask_price.get(),
                };
                if self.strategy.on_bbo(&b.header.stock, quote) {
                    self.counts.bbo_traded += 1;
                }
            }
            Normalized::Status(st) if self.strategy.on_status(&st.header.stock, st.state) => {
                self.counts.status_traded += 1;
            }
            _ => {}
        }
    }
}

/// The engine keeps only BBOs, which the live stream refreshes: a snapshot (late join or
/// re-synchronisation) is accepted and its bytes skipped, and the quote table starts empty,
/// so the strategy waits for fresh BBOs instead of trading on stale ones.
impl SnapshotSink for MdView {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _data: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, _snapshot_seq: u64) -> Result<(), RestoreError> {
        self.strategy.clear_quotes();
        self.counts.restores += 1;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Order flow counts and the report

/// Order-path counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderCounts {
    /// Orders sent.
    pub sent: u64,
    /// Acks received.
    pub acks: u64,
    /// Fills (full or partial) received.
    pub fills: u64,
    /// Rejects received (risk or venue).
    pub rejects: u64,
    /// Cancels received.
    pub canceled: u64,
    /// Scheduled sends skipped because no traded symbol had a quote yet.
    pub skipped_no_quote: u64,
    /// Sends that found the RC ring full (retried at once, latency still counts from the
    /// intended time).
    pub back_pressured: u64,
    /// Responses the client could not apply (unknown or already-final orders).
    pub bad_responses: u64,
}

/// Market-data subscriber totals over all channels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusCounts {
    /// Messages delivered.
    pub delivered: u64,
    /// Gaps detected.
    pub gaps: u64,
    /// Messages recovered by retransmission.
    pub recovered: u64,
    /// Unrecoverable-loss events.
    pub unrecoverable: u64,
    /// Snapshots applied.
    pub snapshots: u64,
}

/// Everything the report says.
#[derive(Debug)]
pub struct Outcome {
    /// Seconds of trading.
    pub seconds: f64,
    /// Orders per second scheduled.
    pub rate: u64,
    /// Market-data view (counts and latency).
    pub md: MdCounts,
    /// Bus totals.
    pub bus: BusCounts,
    /// Order-path counts.
    pub orders: OrderCounts,
    /// Rejects by reason code.
    pub rejects_by_reason: Vec<(RejectReason, u64)>,
    /// Market-data latency histogram.
    pub md_latency: Histogram<u64>,
    /// Order round-trip histogram.
    pub rtt: Histogram<u64>,
}

impl Outcome {
    /// The report text.
    pub fn report(&self) -> String {
        let mut s = String::new();
        let line = |s: &mut String, t: String| {
            s.push_str(&t);
            s.push('\n');
        };
        line(
            &mut s,
            format!("rocebus demo report ({:.1} s of trading)", self.seconds),
        );
        line(&mut s, format!("clock: {CLOCK_NAME}"));
        line(
            &mut s,
            format!(
                "order round trip: intended send time on a fixed {} orders/s schedule -> venue ack back in the engine \
                 (coordinated omission corrected)",
                self.rate
            ),
        );
        line(
            &mut s,
            "market data: exchange packet arrival at the host (kernel stamp of the packet the feed handler reads) -> engine handler".into(),
        );
        let mut rows = Vec::new();
        if !self.md_latency.is_empty() {
            rows.push(("market data", Summary::of(&self.md_latency)));
        }
        if !self.rtt.is_empty() {
            rows.push(("order round trip", Summary::of(&self.rtt)));
        }
        if !rows.is_empty() {
            s.push_str(&summary_table(&rows));
        }
        if self.md_latency.is_empty() {
            line(
                &mut s,
                "market data latency: not measured (no exchange packet seen by the probe: \
                 market_data.exchange_feed unset, or no CAP_NET_RAW)"
                    .into(),
            );
        }

        let b = &self.bus;
        line(
            &mut s,
            format!(
                "market data: {} messages delivered ({} BBOs of traded symbols), {} gaps, {} recovered, \
                 {} unrecovered, {} snapshots, {} malformed, {} without a packet stamp",
                b.delivered, self.md.bbo_traded, b.gaps, b.recovered, b.unrecoverable, b.snapshots,
                self.md.malformed, self.md.unstamped
            ),
        );
        let o = &self.orders;
        line(
            &mut s,
            format!(
                "orders: {} sent, {} acks, {} fills, {} rejects, {} canceled, {} skipped (no quote), \
                 {} back-pressured, {} bad responses",
                o.sent, o.acks, o.fills, o.rejects, o.canceled, o.skipped_no_quote, o.back_pressured,
                o.bad_responses
            ),
        );
        for (reason, n) in &self.rejects_by_reason {
            line(&mut s, format!("  rejects {reason:?}: {n}"));
        }
        s
    }

    /// One machine-readable line, `RESULT key=value ...`, for `cargo xtask demo` and tests.
    pub fn result_line(&self) -> String {
        let q = |h: &Histogram<u64>, p: f64| {
            if h.is_empty() {
                0
            } else {
                h.value_at_quantile(p)
            }
        };
        format!(
            "RESULT md_messages={} md_gaps={} md_recovered={} md_unrecoverable={} md_latency_count={} \
             md_p50_ns={} md_p99_ns={} orders={} acks={} fills={} rejects={} rtt_count={} rtt_p50_ns={} \
             rtt_p99_ns={} rtt_max_ns={}",
            self.bus.delivered,
            self.bus.gaps,
            self.bus.recovered,
            self.bus.unrecoverable,
            self.md_latency.len(),
            q(&self.md_latency, 0.5),
            q(&self.md_latency, 0.99),
            self.orders.sent,
            self.orders.acks,
            self.orders.fills,
            self.orders.rejects,
            self.rtt.len(),
            q(&self.rtt, 0.5),
            q(&self.rtt, 0.99),
            self.rtt.max(),
        )
    }

    /// Writes `report.txt`, `result.txt`, the `.hgrm` files and the PNG and SVG plots of
    /// each measured path into `dir`; returns the files written.
    pub fn write(&self, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut files = Vec::new();
        let mut put = |name: &str, text: &str| -> anyhow::Result<()> {
            let p = dir.join(name);
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
            files.push(p);
            Ok(())
        };
        put("report.txt", &self.report())?;
        put("result.txt", &(self.result_line() + "\n"))?;
        for (stem, title, h) in [
            (
                "md-latency",
                "market data: exchange packet arrival -> engine handler",
                &self.md_latency,
            ),
            (
                "order-rtt",
                "order round trip: intended send -> venue ack -> engine",
                &self.rtt,
            ),
        ] {
            if h.is_empty() {
                continue;
            }
            let hgrm = dir.join(format!("{stem}.hgrm"));
            write_hgrm_file(&hgrm, h)?;
            files.push(hgrm);
            for (ext, format) in [("png", PlotFormat::Png), ("svg", PlotFormat::Svg)] {
                let p = dir.join(format!("{stem}.{ext}"));
                plot_percentiles(&p, format, title, &[("rocebus demo", h)])?;
                files.push(p);
            }
        }
        Ok(files)
    }
}

// ---------------------------------------------------------------------------------------
// The engine loop (I/O)

/// How long and where [`run`] runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Trading time after the gateway connection is up.
    pub duration: Duration,
    /// Print a progress line this often (0: never).
    pub progress: Duration,
    /// Publish counters in a counters file under this folder (`rocebus stat`).
    pub counters_dir: Option<PathBuf>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            duration: Duration::from_secs(30),
            progress: Duration::from_secs(1),
            counters_dir: Some(default_dir()),
        }
    }
}

/// The engine's live counters (`rocebus stat sample-engine`).
struct EngineCounters {
    md_messages: Counter,
    md_bbo: Counter,
    orders: Counter,
    acks: Counter,
    fills: Counter,
    rejects: Counter,
    skipped: Counter,
    back_pressured: Counter,
    _file: CountersFile,
    subs: Vec<SubscriberCountersExport>,
}

impl EngineCounters {
    fn open(dir: &Path, channels: &[u16]) -> anyhow::Result<EngineCounters> {
        let path = counters_path(dir, "sample-engine");
        let file = CountersFile::create(&path, 256)
            .with_context(|| format!("cannot create counters file {}", path.display()))?;
        let c = |label: &str| file.allocate_with(label, Kind::Counter, 0);
        let mut subs = Vec::new();
        for ch in channels {
            subs.push(SubscriberCountersExport::new(&file, &format!("md.ch{ch}"))?);
        }
        Ok(EngineCounters {
            md_messages: c("md messages handled")?,
            md_bbo: c("md bbo updates (traded symbols)")?,
            orders: c("orders sent")?,
            acks: c("acks")?,
            fills: c("fills")?,
            rejects: c("rejects")?,
            skipped: c("scheduled orders skipped (no quote)")?,
            back_pressured: c("orders back-pressured")?,
            subs,
            _file: file,
        })
    }

    fn update(&self, md: &MdCounts, o: &OrderCounts, subs: &[McastSubscriber]) {
        self.md_messages.set(md.messages);
        self.md_bbo.set(md.bbo_traded);
        self.orders.set(o.sent);
        self.acks.set(o.acks);
        self.fills.set(o.fills);
        self.rejects.set(o.rejects);
        self.skipped.set(o.skipped_no_quote);
        self.back_pressured.set(o.back_pressured);
        for (e, s) in self.subs.iter().zip(subs) {
            e.update(s);
        }
    }
}

fn bus_counts(subs: &[McastSubscriber]) -> BusCounts {
    let mut b = BusCounts::default();
    for s in subs {
        let c = s.counters();
        b.delivered += c.delivered;
        b.gaps += c.gaps_detected;
        b.recovered += c.messages_recovered;
        b.unrecoverable += c.unrecoverable;
        b.snapshots += c.snapshots_applied;
    }
    b
}

/// Loads the market-data path configuration from `path`: a `McastConfig` file, or any file
/// with a `[market_data]` table holding one (the feed handler's config).
pub fn load_market_data(path: &Path) -> anyhow::Result<McastConfig> {
    let what = || {
        format!(
            "market-data configuration {} (key market_data.config of the engine config)",
            path.display()
        )
    };
    let text = std::fs::read_to_string(path).with_context(what)?;
    let mut table: toml::Table = toml::from_str(&text).with_context(what)?;
    let cfg: McastConfig = match table.remove("market_data") {
        Some(v) => v.try_into(),
        None => toml::Value::Table(table).try_into(),
    }
    .with_context(what)?;
    cfg.validate().with_context(what)?;
    Ok(cfg)
}

/// Retries `f` until it succeeds or `timeout` passes (peers may still be starting).
fn retry<T, E: std::fmt::Display>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, E>,
) -> anyhow::Result<T> {
    let t0 = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if t0.elapsed() >= timeout => {
                anyhow::bail!("{what}: {e} (gave up after {} s)", timeout.as_secs())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Runs the engine: subscribes, connects, trades for `opts.duration`, and returns what the
/// report needs. Prints a progress line every `opts.progress`.
pub fn run(cfg: &EngineConfig, opts: &RunOptions) -> anyhow::Result<Outcome> {
    let md_cfg = load_market_data(&cfg.market_data.config)?;
    let channels: Vec<u16> = if cfg.market_data.channels.is_empty() {
        md_cfg.channels.iter().map(|c| c.id).collect()
    } else {
        cfg.market_data.channels.clone()
    };
    let symbols: Vec<Symbol> = cfg
        .strategy
        .symbols
        .iter()
        .filter_map(|s| Symbol::new(s))
        .collect();
    let rate = cfg.strategy.orders_per_second;
    let capacity = (rate as f64 * (opts.duration.as_secs_f64() + 5.0) * 1.1) as usize + 16;

    if let Some(core) = cfg.engine.core {
        if !pin_current_thread(core) {
            eprintln!("sample-engine: could not pin to core {core}; running unpinned");
        }
    }
    let connect_timeout = Duration::from_millis(cfg.gateway.connect_timeout_ms);
    let mut subs = Vec::with_capacity(channels.len());
    for &ch in &channels {
        let s = retry(
            &format!(
                "subscribe to market-data channel {ch} (publisher {})",
                cfg.market_data.publisher
            ),
            connect_timeout,
            || {
                McastSubscriber::new(
                    &md_cfg,
                    ch,
                    cfg.market_data.local,
                    cfg.market_data.publisher,
                )
            },
        )?;
        subs.push(s);
    }
    let first_id = 1;
    let mut session = retry(
        &format!("connect to the order gateway at {}", cfg.gateway.addr),
        connect_timeout,
        || {
            EngineSession::connect_with_capacity(
                cfg.gateway.addr,
                &cfg.gateway.orders,
                cfg.gateway.engine_id,
                &cfg.gateway.engine_token,
                first_id,
                capacity,
                Duration::from_secs(5),
            )
        },
    )?;
    session.set_gateway_timeout(Duration::from_millis(cfg.gateway.gateway_timeout_ms));
    let counters = match &opts.counters_dir {
        Some(dir) => Some(EngineCounters::open(dir, &channels)?),
        None => None,
    };
    eprintln!(
        "sample-engine: engine {} on {} channel(s), trading {} symbol(s) at {rate} orders/s for {} s",
        cfg.gateway.engine_id,
        subs.len(),
        symbols.len(),
        opts.duration.as_secs()
    );

    let tap = match cfg.market_data.exchange_feed {
        Some(feed) => match tap::ExchangeTap::open(feed) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!(
                    "sample-engine: market-data latency not measured: cannot open the raw-socket \
                     probe for {feed} ({e}; it needs CAP_NET_RAW)"
                );
                None
            }
        },
        None => None,
    };
    let mut view = MdView::new(
        Strategy::new(&symbols, cfg.strategy.quantity),
        tap.as_ref().map(|_| tap::StampTable::new(18)),
        realtime_ns,
    )?;
    let mut rtt = LatencyRecorder::new()?;
    let mut times = OrderTimes::new(first_id, capacity);
    let mut o = OrderCounts::default();
    let mut reasons = [0u64; 64];
    let start = monotonic_ns();
    let end = start + opts.duration.as_nanos() as u64;
    let mut schedule = FixedRateSchedule::with_rate(start, rate)?;
    let mut idler = Idler::new(cfg.engine.idle);
    let progress_ns = opts.progress.as_nanos() as u64;
    let mut next_progress = start + progress_ns;
    let mut next_counters = start;
    let account = cfg.gateway.account;

    loop {
        let now = monotonic_ns();
        if now >= end {
            break;
        }
        let mut work = 0;
        // Exchange packet stamps first, so they are known when the bus delivers.
        if let (Some(t), Some(stamps)) = (&tap, &mut view.stamps) {
            if t.drain(stamps) > 0 {
                work += 1;
                view.resolve(false);
            }
        }
        for s in &mut subs {
            work += s.poll(now, &mut view)?;
            while let Some(ev) = s.poll_event() {
                if let Event::UnrecoverableLoss { from, to } = ev {
                    eprintln!("sample-engine: market data lost [{from}, {to}), re-synchronising");
                }
            }
        }
        work += session
            .poll(
                |r| match r {
                    Ok(Response::Ack(a)) => {
                        o.acks += 1;
                        if let Some(t) = times.take(a.cl_ord_id.get()) {
                            rtt.record(t, monotonic_ns());
                        }
                    }
                    Ok(Response::Fill(_)) => o.fills += 1,
                    Ok(Response::Reject(r)) => {
                        o.rejects += 1;
                        let code = usize::from(r.reason.get()).min(reasons.len() - 1);
                        reasons[code] += 1;
                        times.take(r.cl_ord_id.get());
                    }
                    Ok(Response::Canceled(_)) => o.canceled += 1,
                    Ok(_) => {}
                    Err(ClientError::AlreadyFinal(_) | ClientError::UnknownOrder(_)) | Err(_) => {
                        o.bad_responses += 1
                    }
                },
                64,
            )
            .context("the order gateway connection failed")?;
        // Every order due by now goes out, late ones at once: each keeps its intended time.
        let mut sent_now = false;
        while schedule.peek() <= now {
            let Some(intent) = view.strategy.next_order() else {
                schedule.next_send();
                o.skipped_no_quote += 1;
                continue;
            };
            match session.new_order(
                account,
                intent.symbol,
                intent.side,
                intent.qty,
                intent.price,
            ) {
                Ok(id) => {
                    if times.is_full(id) {
                        anyhow::bail!("more orders than planned ({capacity}): raise the capacity");
                    }
                    times.set(id, schedule.next_send());
                    o.sent += 1;
                    sent_now = true;
                }
                Err(OfferError::BackPressured) => {
                    // The strategy's turn is spent; the schedule is not: try again next pass.
                    o.back_pressured += 1;
                    break;
                }
                Err(e) => return Err(anyhow::anyhow!("send an order to the gateway: {e:?}")),
            }
        }
        if sent_now {
            session
                .flush()
                .map_err(|e| anyhow::anyhow!("send orders to the gateway: {e:?}"))?;
            work += 1;
        }
        if now >= next_counters {
            next_counters = now + 10_000_000;
            if let Some(c) = &counters {
                c.update(&view.counts, &o, &subs);
            }
        }
        if progress_ns > 0 && now >= next_progress {
            next_progress += progress_ns;
            let b = bus_counts(&subs);
            println!(
                "[{:>3.0} s] md {:>8} msgs  gaps {:>3}  recovered {:>5}  lost {}  | orders {:>6}  acks {:>6}  fills {:>6}  rejects {:>4}",
                (now - start) as f64 / 1e9,
                b.delivered,
                b.gaps,
                b.recovered,
                b.unrecoverable,
                o.sent,
                o.acks,
                o.fills,
                o.rejects
            );
        }
        idler.idle(work);
    }
    let seconds = (monotonic_ns() - start) as f64 / 1e9;
    if let (Some(t), Some(stamps)) = (&tap, &mut view.stamps) {
        std::thread::sleep(Duration::from_millis(100));
        t.drain(stamps);
    }
    view.resolve(true);
    // Collect the answers to the last orders (bounded wait).
    let drain_end = Instant::now() + Duration::from_secs(2);
    while o.acks + o.rejects < o.sent && Instant::now() < drain_end {
        session
            .poll(
                |r| match r {
                    Ok(Response::Ack(a)) => {
                        o.acks += 1;
                        if let Some(t) = times.take(a.cl_ord_id.get()) {
                            rtt.record(t, monotonic_ns());
                        }
                    }
                    Ok(Response::Fill(_)) => o.fills += 1,
                    Ok(Response::Reject(_)) => o.rejects += 1,
                    _ => {}
                },
                64,
            )
            .context("the order gateway connection failed")?;
    }
    if let Some(c) = &counters {
        c.update(&view.counts, &o, &subs);
    }
    session.close();
    if let Some(t) = &tap {
        if t.dropped() > 0 {
            eprintln!(
                "sample-engine: the latency probe dropped {} stamps (queue full)",
                t.dropped()
            );
        }
    }
    let rejects_by_reason = (0..reasons.len() as u16)
        .filter(|&r| reasons[usize::from(r)] > 0)
        .filter_map(|r| RejectReason::from_u16(r).map(|rr| (rr, reasons[usize::from(r)])))
        .collect();
    Ok(Outcome {
        seconds,
        rate,
        md: view.counts,
        bus: bus_counts(&subs),
        orders: o,
        rejects_by_reason,
        md_latency: view.latency.into_histogram(),
        rtt: rtt.into_histogram(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use feed_handler::book::{Event as BookEvent, Level, Side as BookSide};
    use feed_handler::itch::Stock;

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    const GOOD: &str = r#"
[gateway]
addr = "198.18.0.1:7470"
engine_id = 1
engine_token = "e"
account = 1
[gateway.orders]
token = "t"

[market_data]
config = "md.toml"
local = "198.18.0.1"
publisher = "198.18.0.1"

[strategy]
symbols = ["A", "B"]
orders_per_second = 100
quantity = 100
"#;

    #[test]
    fn config_errors_name_file_key_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            EngineConfig::load(&path)
        };
        let cfg = load(GOOD).unwrap();
        assert_eq!(cfg.market_data.config, dir.path().join("md.toml"));
        let e = load(&GOOD.replace("quantity = 100", "quantity = 0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("engine.toml") && e.contains("strategy.quantity"),
            "{e}"
        );
        let e = load(&GOOD.replace("quantity = 100", "quantity = 100\nqty = 3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine.toml") && e.contains("qty"), "{e}");
        let e = load(&GOOD.replace("\"B\"", "\"TOO-LONG-SYM\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("strategy.symbols") && e.contains("TOO-LONG-SYM"),
            "{e}"
        );
        let e = load(&GOOD.replace("token = \"t\"", "token = \"\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.orders.token"), "{e}");
        let e = EngineConfig::load(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }

    #[test]
    fn market_data_config_comes_from_the_feed_handlers_table_or_a_plain_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let fh = load_market_data(&root.join("configs/demo/feed-handler.toml")).unwrap();
        assert_eq!(fh.channels.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
        let plain = load_market_data(&root.join("configs/md.toml")).unwrap();
        assert!(!plain.channels.is_empty());
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[market_data]\nmax_datagram_payload = 1\n").unwrap();
        let e = format!("{:#}", load_market_data(&bad).unwrap_err());
        assert!(e.contains("bad.toml"), "{e}");
    }

    #[test]
    fn strategy_joins_the_book_alternating_sides_round_robin() {
        let mut s = Strategy::new(&[sym("A"), sym("B")], 100);
        assert_eq!(s.next_order(), None, "no quotes yet");
        assert!(s.on_bbo(
            &sym("B").0,
            Quote {
                bid: 990_000,
                ask: 1_010_000
            }
        ));
        assert!(!s.on_bbo(&sym("ZZ").0, Quote { bid: 1, ask: 2 }));
        let o = s.next_order().unwrap();
        assert_eq!(
            (o.symbol, o.side, o.price, o.qty),
            (sym("B"), Side::Buy, 990_000, 100)
        );
        let o = s.next_order().unwrap();
        assert_eq!(
            (o.symbol, o.side, o.price),
            (sym("B"), Side::Sell, 1_010_000)
        );
        s.on_bbo(&sym("A").0, Quote { bid: 500, ask: 0 });
        // A's buy is due (bid 500); then B; then A's sell has no ask, so B again.
        let seq: Vec<_> = (0..4)
            .map(|_| s.next_order().map(|o| (o.symbol, o.side)))
            .collect();
        assert_eq!(
            seq,
            [
                Some((sym("A"), Side::Buy)),
                Some((sym("B"), Side::Buy)),
                Some((sym("B"), Side::Sell)),
                Some((sym("B"), Side::Buy)),
            ]
        );
        // B halts: only A trades (its sell has no ask: nothing) until B trades again.
        assert!(s.on_status(&sym("B").0, b'H'));
        s.on_bbo(&sym("A").0, Quote { bid: 500, ask: 600 });
        let seq: Vec<_> = (0..3)
            .map(|_| s.next_order().map(|o| (o.symbol, o.side)))
            .collect();
        assert_eq!(
            seq,
            [
                Some((sym("A"), Side::Sell)),
                Some((sym("A"), Side::Buy)),
                Some((sym("A"), Side::Sell)),
            ]
        );
        assert!(s.on_status(&sym("B").0, b'T'));
        assert!(!s.on_status(&sym("ZZ").0, b'H'));
        assert_eq!(s.next_order().map(|o| o.symbol), Some(sym("B")));
        s.clear_quotes();
        assert_eq!(s.next_order(), None);
    }

    #[test]
    fn order_times_measure_each_order_once() {
        let mut t = OrderTimes::new(10, 2);
        assert!(t.is_full(9) && t.is_full(12) && !t.is_full(11));
        t.set(10, 1000);
        assert_eq!(t.take(10), Some(1000));
        assert_eq!(t.take(10), None, "a second answer is not measured again");
        assert_eq!(t.take(11), None, "never sent");
        assert_eq!(t.take(99), None);
    }

    fn encode(ev: &BookEvent) -> Vec<u8> {
        let mut buf = [0u8; normalized::MAX_LEN];
        let n = feed_handler::normalized::encode(ev, &mut buf);
        buf[..n].to_vec()
    }

    #[test]
    fn view_feeds_bbos_of_traded_symbols_and_counts_the_rest() {
        let mut stamps = tap::StampTable::new(8);
        stamps.insert(5, 1_000);
        let mut v = MdView::new(Strategy::new(&[sym("A")], 10), Some(stamps), || 1_700).unwrap();
        let lvl = |price| Level {
            price,
            shares: 100,
            orders: 1,
        };
        v.on_message(
            1,
            &encode(&BookEvent::Bbo {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 5,
                bid: Some(lvl(1_000_000)),
                ask: Some(lvl(1_000_100)),
            }),
        );
        v.on_message(
            2,
            &encode(&BookEvent::Level {
                locate: 2,
                stock: Stock::new("B"),
                timestamp: 6,
                side: BookSide::Bid,
                level: lvl(7),
            }),
        );
        v.on_message(3, b"\xff garbage");
        assert!(v.strategy.clone().next_order().is_some());
        v.on_message(
            4,
            &encode(&BookEvent::TradingStatus {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 5,
                state: b'H',
                reason: *b"T1  ",
            }),
        );
        assert_eq!(v.strategy.next_order(), None, "A is halted");
        assert_eq!(
            v.counts,
            MdCounts {
                messages: 4,
                bbo_traded: 1,
                status_traded: 1,
                malformed: 1,
                restores: 0,
                unstamped: 0,
            }
        );
        assert_eq!(
            v.strategy.quote(sym("A")),
            Some(Quote {
                bid: 1_000_000,
                ask: 1_000_100
            })
        );
        v.begin_restore();
        v.restore_chunk(b"anything").unwrap();
        v.finish_restore(9).unwrap();
        assert_eq!(v.strategy.quote(sym("A")), Some(Quote::default()));
        // The BBO and the status (ITCH timestamp 5) arrived at 1000 and were handled at
        // 1700; the level change (timestamp 6) waits for its stamp, which comes late (at
        // 1500).
        assert_eq!(
            (v.latency.histogram().len(), v.latency.histogram().max()),
            (2, 700)
        );
        v.stamps.as_mut().unwrap().insert(6, 1_500);
        v.resolve(false);
        assert_eq!(v.latency.histogram().len(), 3);
        // A message whose stamp never comes is counted once the run ends.
        v.on_message(
            4,
            &encode(&BookEvent::Bbo {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 99,
                bid: None,
                ask: None,
            }),
        );
        v.resolve(false);
        assert_eq!(v.counts.unstamped, 0);
        v.resolve(true);
        assert_eq!((v.counts.unstamped, v.latency.histogram().len()), (1, 3));
    }

    #[test]
    fn outcome_writes_report_hgrm_and_plots() {
        let mut rtt = LatencyRecorder::new().unwrap();
        for i in 0..1000u64 {
            rtt.record(1_000_000, 1_000_000 + 20_000 + i * 10);
        }
        let out = Outcome {
            seconds: 3.0,
            rate: 100,
            md: MdCounts {
                messages: 5,
                ..MdCounts::default()
            },
            bus: BusCounts {
                delivered: 5,
                ..BusCounts::default()
            },
            orders: OrderCounts {
                sent: 1000,
                acks: 1000,
                fills: 1000,
                rejects: 2,
                ..OrderCounts::default()
            },
            rejects_by_reason: vec![(RejectReason::PriceCollar, 2)],
            md_latency: LatencyRecorder::new().unwrap().into_histogram(),
            rtt: rtt.into_histogram(),
        };
        let text = out.report();
        assert!(text.contains("CLOCK_MONOTONIC"), "{text}");
        assert!(text.contains("order round trip"), "{text}");
        assert!(text.contains("PriceCollar: 2"), "{text}");
        assert!(text.contains("not measured"), "{text}");
        let line = out.result_line();
        assert!(line.starts_with("RESULT md_messages=5 "), "{line}");
        assert!(
            line.contains(" acks=1000 ") && line.contains(" rtt_count=1000 "),
            "{line}"
        );
        let dir = tempfile::tempdir().unwrap();
        match out.write(dir.path()) {
            Ok(files) => {
                for f in [
                    "report.txt",
                    "result.txt",
                    "order-rtt.hgrm",
                    "order-rtt.png",
                    "order-rtt.svg",
                ] {
                    let p = dir.path().join(f);
                    assert!(files.contains(&p), "{f} not listed");
                    assert!(std::fs::metadata(&p).unwrap().len() > 0, "{f} empty");
                }
                assert!(!dir.path().join("md-latency.hgrm").exists());
            }
            // Without a font (fonts-dejavu-core) plots cannot be drawn: that must be the
            // only reason, and the text files must be there.
            Err(e) => {
                assert!(format!("{e:#}").contains("font"), "{e:#}");
                assert!(dir.path().join("order-rtt.hgrm").exists());
            }
        }
    }
}
