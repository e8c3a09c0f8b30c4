//! Reference prices and halts from the rocebus market-data bus, for pre-trade risk.
//!
//! [`FeedState`] is the I/O-free part: it takes the feed handler's normalized messages
//! ([`rocebus_md::normalized`]), its L2 snapshots and the subscriber's events, and turns
//! them into [`MarketEvent`]s. [`BusMarketData`] is the thin shell that owns one
//! [`MdSubscriber`] per channel (UD multicast or RC fan-out, as the channel's `transport`
//! says) and is polled by the service loop (no thread of its own;
//! it neither allocates nor logs per message).
//!
//! # What the gateway believes
//! - **Reference price** ([`ReferenceSource`], `market_data.reference`): by default the BBO
//!   midpoint when both sides are quoted, else the last trade price; or the last trade price
//!   only. A one-sided book with no trade yet gives no reference: orders reject with
//!   `NoReferencePrice`.
//! - **Halts**: an ITCH trading state of `H` (halted), `P` (paused) or `Q` (quotation only)
//!   halts the symbol; `T` resumes it. A symbol with no trading action yet is not halted.
//! - **Freshness**: risk rejects a reference older than `risk.reference_max_age_ms`. A
//!   reference is renewed by every message about its symbol and, while the channel is healthy
//!   (live, heard from within `confirm_ms`, no gap being recovered), re-confirmed every
//!   `confirm_ms`: an unchanged quote on a quiet symbol is still the true quote. When the bus
//!   falls silent, references age out and orders reject (fail closed).
//! - **Gaps** (fail closed): an unrecoverable loss, a publisher restart (new session), a
//!   re-synchronisation, a failed subscriber, or an exchange feed loss the feed handler could
//!   not recover (its [`normalized::FeedLoss`] message, sent on every channel) may have
//!   hidden a halt or a price move.
//!   Every reference of that channel is marked stale at once ([`MarketEvent::Stale`]) and
//!   stays stale until the channel's next snapshot has been applied; halts then come from the
//!   snapshot's trading states and references from its books (trades from before the gap
//!   are forgotten). A channel vouches for nothing until its first snapshot, or until its
//!   first message if the subscriber followed the session from sequence 1. A lost recovery connection alone
//!   invalidates nothing: multicast still arrives in sequence, and any hole while it is down
//!   is reported as an unrecoverable loss (above). A subscriber that fails outright is
//!   dropped, its channel invalidated, and a new one connected every `reconnect_ms`.
//!
//! The contract between a market-data input and the service, [`MarketDataInput`] and
//! [`MarketEvent`], is defined here (the service re-exports it), so this module never
//! imports the service.
//!
//! This module must not touch risk state directly: it only emits events.

use std::net::IpAddr;
use std::path::PathBuf;

use rocebus::clock::{now_ns, Mono};
use rocebus::counters::{AllocateCounter, Counter, CountersError, Kind};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::io::SubscriberCountersExport;
use rocebus::mcast::{Event, Handler, MdSubscriber, NetError, Phase, RestoreError, SnapshotSink};
use rocebus_md::normalized::{self, Normalized};
use rocebus_md::view::MarketView;
use serde::Deserialize;

use crate::invalid::Invalid;
use crate::proto::Symbol;

/// One event from the market-data bus that risk needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarketEvent {
    /// A reference price (4 implied decimals) for the price collar.
    Reference {
        /// Instrument.
        symbol: Symbol,
        /// Price.
        price: i64,
    },
    /// Trading in a symbol halted or resumed.
    Halt {
        /// Instrument.
        symbol: Symbol,
        /// True: halted.
        halted: bool,
    },
    /// The bus can no longer vouch for the symbol's reference price (a gap that may have
    /// hidden a move or a halt): orders reject as stale until the next `Reference`.
    Stale {
        /// Instrument.
        symbol: Symbol,
    },
}

/// Where the service takes market data from; polled on every loop pass.
pub trait MarketDataInput {
    /// Hands the events available now to `sink` and returns how many; never blocks.
    fn poll(&mut self, sink: &mut dyn FnMut(MarketEvent)) -> usize;

    /// Allocates the input's own counters in the service's counters table, so they show
    /// in the gateway's counters file next to the service's (`rocebus stat`). Called once
    /// by [`Service::run`](crate::service::Service::run) before its loop; the default has none.
    fn register_counters(&mut self, _table: &dyn AllocateCounter) -> Result<(), CountersError> {
        Ok(())
    }

    /// Stores the current values in the counters [`register_counters`](Self::register_counters)
    /// allocated; called by the service every housekeeping turn (about once a millisecond).
    fn update_counters(&mut self) {}
}

/// Which price the collar is measured against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReferenceSource {
    /// BBO midpoint when both sides are quoted, else the last trade.
    #[default]
    Midpoint,
    /// Last trade price only.
    LastTrade,
}

fn default_confirm_ms() -> u64 {
    100
}

fn default_reconnect_ms() -> u64 {
    1000
}

/// `[market_data]` of the gateway config: where reference prices and halts come from.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketDataConfig {
    /// The market-data path configuration: a `McastConfig` file, or a file with a
    /// `[market_data]` table holding one (the feed handler's own config). Relative to the
    /// gateway config's folder.
    pub config: PathBuf,
    /// Channel ids to subscribe to (default: every channel of `config`).
    #[serde(default)]
    pub channels: Vec<u16>,
    /// Our address on the RDMA device.
    pub local: IpAddr,
    /// The feed handler's address (its recovery and snapshot service).
    pub publisher: IpAddr,
    /// `"midpoint"` (default) or `"last_trade"`.
    #[serde(default)]
    pub reference: ReferenceSource,
    /// Re-confirmation period of unchanged references while the bus is healthy; must be
    /// below half of `risk.reference_max_age_ms`.
    #[serde(default = "default_confirm_ms")]
    pub confirm_ms: u64,
    /// Time between attempts to (re)connect a channel's subscriber.
    #[serde(default = "default_reconnect_ms")]
    pub reconnect_ms: u64,
}

impl MarketDataConfig {
    /// Loads and validates the market-data path configuration named by `config`.
    pub fn load_bus(&self) -> Result<McastConfig, Invalid> {
        let invalid = |p: String| {
            Err((
                "market_data.config".to_owned(),
                format!("{}: {p}", self.config.display()),
            ))
        };
        let text = match std::fs::read_to_string(&self.config) {
            Ok(t) => t,
            Err(e) => return invalid(e.to_string()),
        };
        let mut table: toml::Table = match toml::from_str(&text) {
            Ok(t) => t,
            Err(e) => return invalid(e.to_string()),
        };
        let bus: Result<McastConfig, _> = match table.remove("market_data") {
            Some(v) => McastConfig::from_value(v),
            None => McastConfig::from_value(toml::Value::Table(table)),
        };
        let bus = match bus {
            Ok(b) => b,
            Err(e) => return invalid(e.to_string()),
        };
        if let Err(e) = bus.validate() {
            return invalid(e.to_string());
        }
        Ok(bus)
    }

    /// Checks the values against the bus configuration and the reference age limit.
    pub fn validate(&self, bus: &McastConfig, reference_max_age_ms: u64) -> Result<(), Invalid> {
        let key = |k: &str| format!("market_data.{k}");
        if let Some(&c) = self.channels.iter().find(|&&c| bus.channel(c).is_none()) {
            return Err((
                key("channels"),
                format!("channel {c} is not in {}", self.config.display()),
            ));
        }
        if self.confirm_ms == 0 || self.confirm_ms.saturating_mul(2) >= reference_max_age_ms {
            return Err((
                key("confirm_ms"),
                format!(
                    "{} must be at least 1 and below half of risk.reference_max_age_ms \
                     ({reference_max_age_ms}), or healthy references would go stale",
                    self.confirm_ms
                ),
            ));
        }
        if self.reconnect_ms == 0 {
            return Err((key("reconnect_ms"), "must be at least 1".into()));
        }
        Ok(())
    }

    /// The channel ids to subscribe to.
    pub fn channel_ids(&self, bus: &McastConfig) -> Vec<u16> {
        if self.channels.is_empty() {
            bus.channels.iter().map(|c| c.id).collect()
        } else {
            self.channels.clone()
        }
    }
}

/// Totals kept by a [`FeedState`] (plain values).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MarketCounters {
    /// Normalized messages taken.
    pub messages: u64,
    /// Messages that were not valid normalized messages, or named an invalid symbol (dropped).
    pub malformed: u64,
    /// Reference events emitted (messages and confirmations).
    pub references: u64,
    /// Halt or resume events emitted.
    pub halts: u64,
    /// Stale events emitted.
    pub stale: u64,
    /// Gaps that invalidated a channel (loss, new session, resync, lost connection, feed loss).
    pub invalidations: u64,
    /// Exchange feed losses announced by the feed handler.
    pub feed_losses: u64,
    /// Snapshots applied.
    pub snapshots: u64,
    /// Snapshots refused as corrupt.
    pub snapshots_rejected: u64,
}

/// What the gateway knows of one symbol (indexed by ITCH stock locate).
#[derive(Clone, Copy, Debug)]
struct Entry {
    symbol: Symbol,
    /// Index of the channel it arrived on.
    channel: usize,
    known: bool,
    halted: bool,
    bid: u32,
    ask: u32,
    last: u32,
    /// Risk holds a reference for it that the bus vouches for.
    live: bool,
}

impl Entry {
    const EMPTY: Entry = Entry {
        symbol: Symbol([b' '; 8]),
        channel: 0,
        known: false,
        halted: false,
        bid: 0,
        ask: 0,
        last: 0,
        live: false,
    };
}

/// One channel's protocol-side state.
#[derive(Debug)]
struct ChannelState {
    /// Between a gap and the next applied snapshot: nothing is vouched for.
    resyncing: bool,
    /// Snapshot bytes are parsed with the feed handler's own L2 reader (rare path).
    view: MarketView,
}

const LOCATES: usize = 1 << 16;

/// The I/O-free mapping from the bus to risk events. See the module documentation.
#[derive(Debug)]
pub struct FeedState {
    source: ReferenceSource,
    entries: Box<[Entry]>,
    /// Locates seen, in arrival order (capacity for every locate: never reallocates).
    active: Vec<u16>,
    channels: Vec<ChannelState>,
    counters: MarketCounters,
}

/// True for the ITCH trading states in which no order may trade.
fn is_halt_state(state: u8) -> bool {
    matches!(state, b'H' | b'P' | b'Q')
}

impl FeedState {
    /// A state for `channels` channels (indices `0..channels`), all awaiting a snapshot.
    pub fn new(channels: usize, source: ReferenceSource) -> FeedState {
        FeedState {
            source,
            entries: vec![Entry::EMPTY; LOCATES].into_boxed_slice(),
            active: Vec::with_capacity(LOCATES),
            channels: (0..channels)
                .map(|_| ChannelState {
                    resyncing: true,
                    view: MarketView::new(),
                })
                .collect(),
            counters: MarketCounters::default(),
        }
    }

    /// Totals so far.
    pub fn counters(&self) -> MarketCounters {
        self.counters
    }

    /// True while channel `ch` vouches for nothing (before its first snapshot, after a gap).
    pub fn is_resyncing(&self, ch: usize) -> bool {
        self.channels.get(ch).is_none_or(|c| c.resyncing)
    }

    /// The reference an entry's quotes give, by the configured source.
    fn reference(&self, e: &Entry) -> Option<i64> {
        let last = (e.last > 0).then_some(i64::from(e.last));
        match self.source {
            ReferenceSource::LastTrade => last,
            ReferenceSource::Midpoint if e.bid > 0 && e.ask > 0 => {
                Some((i64::from(e.bid) + i64::from(e.ask)) / 2)
            }
            ReferenceSource::Midpoint => last,
        }
    }

    /// The entry of `locate`, (re)bound to `stock` on channel `ch`. A locate that now names
    /// another symbol (a new trading day) first loses what it knew.
    fn entry(
        &mut self,
        ch: usize,
        locate: u16,
        symbol: Symbol,
        sink: &mut dyn FnMut(MarketEvent),
    ) -> &mut Entry {
        let i = usize::from(locate);
        let e = self.entries[i];
        if !e.known {
            self.active.push(locate);
        } else if e.symbol != symbol || e.channel != ch {
            if e.live {
                self.counters.stale += 1;
                sink(MarketEvent::Stale { symbol: e.symbol });
            }
        } else {
            return &mut self.entries[i];
        }
        self.entries[i] = Entry {
            symbol,
            channel: ch,
            known: true,
            ..Entry::EMPTY
        };
        &mut self.entries[i]
    }

    /// Emits the reference of `locate` if its channel vouches for it.
    fn publish_reference(&mut self, locate: u16, sink: &mut dyn FnMut(MarketEvent)) {
        let e = self.entries[usize::from(locate)];
        if self.is_resyncing(e.channel) {
            return;
        }
        if let Some(price) = self.reference(&e) {
            self.entries[usize::from(locate)].live = true;
            self.counters.references += 1;
            sink(MarketEvent::Reference {
                symbol: e.symbol,
                price,
            });
        }
    }

    /// One normalized message delivered in order on channel `ch` with bus sequence `seq`.
    /// Malformed input is counted and dropped.
    ///
    /// Sequence 1 means the subscriber has followed the publisher's session from its start
    /// (it then goes live without a snapshot): the channel's state is complete from here on.
    pub fn on_message(
        &mut self,
        ch: usize,
        seq: u64,
        msg: &[u8],
        sink: &mut dyn FnMut(MarketEvent),
    ) {
        self.counters.messages += 1;
        if seq == 1 && self.is_resyncing(ch) && ch < self.channels.len() {
            self.start_session(ch);
        }
        let Ok(m) = normalized::decode(msg) else {
            self.counters.malformed += 1;
            return;
        };
        let h = match m {
            // The exchange feed lost messages about any symbol: like a bus gap, nothing on
            // this channel is vouched for until its next snapshot.
            Normalized::FeedLoss(_) => {
                self.counters.feed_losses += 1;
                self.invalidate(ch, sink);
                return;
            }
            Normalized::Bbo(b) => &b.header,
            Normalized::Trade(t) => &t.header,
            Normalized::Status(s) => &s.header,
            // Levels: the BBO message that follows a top-of-book change carries what we use.
            Normalized::Level(_) => return,
        };
        let (Some(symbol), true) = (symbol_of(&h.stock), ch < self.channels.len()) else {
            self.counters.malformed += 1;
            return;
        };
        let locate = h.stock_locate.get();
        let e = self.entry(ch, locate, symbol, sink);
        match m {
            Normalized::Bbo(b) => {
                e.bid = b.bid_price.get();
                e.ask = b.ask_price.get();
            }
            Normalized::Trade(t) => e.last = t.price.get(),
            Normalized::Status(s) => {
                let halted = is_halt_state(s.state);
                if halted != e.halted {
                    e.halted = halted;
                    self.counters.halts += 1;
                    sink(MarketEvent::Halt { symbol, halted });
                }
                return;
            }
            Normalized::Level(_) | Normalized::FeedLoss(_) => return,
        }
        self.publish_reference(locate, sink);
    }

    /// Channel `ch` is complete from the start of a session: nothing older applies.
    fn start_session(&mut self, ch: usize) {
        for &l in &self.active {
            let e = &mut self.entries[usize::from(l)];
            if e.channel == ch {
                (e.bid, e.ask, e.last) = (0, 0, 0);
            }
        }
        self.channels[ch].resyncing = false;
    }

    /// Marks every reference of channel `ch` stale until its next snapshot is applied.
    pub fn invalidate(&mut self, ch: usize, sink: &mut dyn FnMut(MarketEvent)) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        c.resyncing = true;
        self.counters.invalidations += 1;
        for &l in &self.active {
            let e = &mut self.entries[usize::from(l)];
            if e.channel == ch && e.live {
                e.live = false;
                self.counters.stale += 1;
                sink(MarketEvent::Stale { symbol: e.symbol });
            }
        }
    }

    /// A subscriber event of channel `ch`.
    pub fn on_event(&mut self, ch: usize, ev: Event, sink: &mut dyn FnMut(MarketEvent)) {
        match ev {
            Event::UnrecoverableLoss { .. }
            | Event::SessionChanged { .. }
            | Event::ResyncStarted => self.invalidate(ch, sink),
            Event::SnapshotApplied { .. } => self.revalidate(ch, sink),
            // Multicast still arrives in sequence while the recovery connection is down, and
            // every hole is then reported as an unrecoverable loss (handled above): nothing
            // can hide behind the outage itself.
            Event::RecoveryLost | Event::RecoveryRestored => {}
            // Only a gap-tolerant subscriber skips holes (the gateway's are strict, the
            // default): it chose fresh data over complete data, and no snapshot follows to
            // revalidate, so the references stay as the next messages set them.
            Event::GapSkipped { .. } => {}
        }
    }

    /// The channel's snapshot is in and later messages flow: vouch for its references again.
    fn revalidate(&mut self, ch: usize, sink: &mut dyn FnMut(MarketEvent)) {
        let Some(c) = self.channels.get_mut(ch) else {
            return;
        };
        c.resyncing = false;
        for i in 0..self.active.len() {
            let l = self.active[i];
            if self.entries[usize::from(l)].channel == ch {
                self.publish_reference(l, sink);
            }
        }
    }

    /// Re-confirms the live references of the channels marked in `healthy` (by index), up to
    /// `max` symbols from `*cursor` (an index into the symbols seen); advances the cursor and
    /// returns true when the walk wrapped (the cursor is back at 0).
    pub fn confirm(
        &mut self,
        healthy: &[bool],
        cursor: &mut usize,
        max: usize,
        sink: &mut dyn FnMut(MarketEvent),
    ) -> bool {
        let end = cursor.saturating_add(max).min(self.active.len());
        for i in *cursor..end {
            let l = self.active[i];
            let e = self.entries[usize::from(l)];
            if e.live && healthy.get(e.channel).copied().unwrap_or(false) {
                self.publish_reference(l, sink);
            }
        }
        *cursor = end;
        if end >= self.active.len() {
            *cursor = 0;
            return true;
        }
        false
    }

    /// A snapshot transfer for channel `ch` starts: the channel is re-synchronising.
    pub fn restore_begin(&mut self, ch: usize, sink: &mut dyn FnMut(MarketEvent)) {
        if !self.is_resyncing(ch) {
            self.invalidate(ch, sink);
        }
        if let Some(c) = self.channels.get_mut(ch) {
            c.view.begin_restore();
        }
    }

    /// The next piece of channel `ch`'s snapshot.
    pub fn restore_chunk(&mut self, ch: usize, data: &[u8]) -> Result<(), RestoreError> {
        match self.channels.get_mut(ch) {
            Some(c) => c.view.restore_chunk(data),
            None => Err(RestoreError),
        }
    }

    /// Channel `ch`'s snapshot is complete: quotes and halts of its symbols are replaced by
    /// the snapshot's (halt changes are emitted now; references when the subscriber reports
    /// the snapshot applied, see [`FeedState::on_event`]).
    pub fn restore_finish(
        &mut self,
        ch: usize,
        seq: u64,
        sink: &mut dyn FnMut(MarketEvent),
    ) -> Result<(), RestoreError> {
        let Some(c) = self.channels.get_mut(ch) else {
            return Err(RestoreError);
        };
        if c.view.finish_restore(seq).is_err() {
            self.counters.snapshots_rejected += 1;
            return Err(RestoreError);
        }
        self.counters.snapshots += 1;
        // The snapshot is the channel's whole state: quotes it leaves out are empty, and it
        // carries no trades (a trade from before the gap is no reference after it).
        for &l in &self.active {
            let e = &mut self.entries[usize::from(l)];
            if e.channel == ch {
                (e.bid, e.ask, e.last) = (0, 0, 0);
            }
        }
        let view = std::mem::take(&mut self.channels[ch].view);
        for (locate, s) in view.symbols() {
            let Some(symbol) = symbol_of(&s.stock.0) else {
                self.counters.malformed += 1;
                continue;
            };
            let (bid, ask) = s.bbo();
            let halted = is_halt_state(s.trading_state);
            let e = self.entry(ch, locate, symbol, sink);
            e.bid = bid.map_or(0, |l| l.price);
            e.ask = ask.map_or(0, |l| l.price);
            if halted != e.halted {
                e.halted = halted;
                self.counters.halts += 1;
                sink(MarketEvent::Halt { symbol, halted });
            }
        }
        self.channels[ch].view = view;
        Ok(())
    }
}

/// The gateway symbol of a space-padded feed symbol; `None` if it is not printable ASCII.
fn symbol_of(stock: &[u8; 8]) -> Option<Symbol> {
    let end = stock.iter().rposition(|&c| c != b' ').map_or(0, |i| i + 1);
    Symbol::from_bytes(&stock[..end])
}

/// Hands one channel's deliveries to the [`FeedState`] (what `MdSubscriber::poll` drives).
struct Apply<'a> {
    feed: &'a mut FeedState,
    ch: usize,
    sink: &'a mut dyn FnMut(MarketEvent),
}

impl Handler for Apply<'_> {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.feed.on_message(self.ch, seq, msg, self.sink);
    }
}

impl SnapshotSink for Apply<'_> {
    fn begin_restore(&mut self) {
        self.feed.restore_begin(self.ch, self.sink);
    }

    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.feed.restore_chunk(self.ch, data)
    }

    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        self.feed.restore_finish(self.ch, snapshot_seq, self.sink)
    }
}

/// One subscribed channel.
struct ChannelIo {
    id: u16,
    sub: Option<MdSubscriber>,
    /// Last time a datagram or recovery message arrived (monotonic ns).
    heard: u64,
    next_connect: u64,
}

/// How one of [`MarketCounters`] is read.
type MarketField = fn(&MarketCounters) -> u64;

/// The [`FeedState`] totals published in the gateway's counters file: label and field.
const MARKET_COUNTERS: &[(&str, MarketField)] = &[
    ("md messages", |c| c.messages),
    ("md malformed messages", |c| c.malformed),
    ("md reference updates", |c| c.references),
    ("md halts and resumes", |c| c.halts),
    ("md references made stale", |c| c.stale),
    ("md channel invalidations (gaps)", |c| c.invalidations),
    ("md snapshots applied", |c| c.snapshots),
    ("md snapshots rejected", |c| c.snapshots_rejected),
];

/// The input's counters in the gateway's counters table (see
/// [`MarketDataInput::register_counters`]).
struct Exported {
    subscribed: Counter,
    feed: Vec<(Counter, MarketField)>,
    /// One per entry of `BusMarketData::channels`, labelled `md.ch<id>.<name>`. A channel
    /// subscribed again after a failure starts its counters from zero (Prometheus reads
    /// that as a counter reset).
    channels: Vec<SubscriberCountersExport>,
}

/// References re-confirmed per poll call: bounds the work one pass adds to the order path.
const CONFIRM_BATCH: usize = 256;

/// The market-data bus as the service's [`MarketDataInput`]. See the module documentation.
pub struct BusMarketData {
    feed: FeedState,
    bus: McastConfig,
    channels: Vec<ChannelIo>,
    local: IpAddr,
    publisher: IpAddr,
    confirm_ns: u64,
    reconnect_ns: u64,
    /// Next confirmation cycle start, and where the current one stands.
    next_cycle: u64,
    cycle: Option<usize>,
    /// Per channel: may it re-confirm in the current cycle (decided at the cycle's start).
    healthy: Vec<bool>,
    exported: Option<Exported>,
}

impl std::fmt::Debug for BusMarketData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusMarketData")
            .field(
                "channels",
                &self.channels.iter().map(|c| c.id).collect::<Vec<_>>(),
            )
            .field("counters", &self.feed.counters)
            .finish_non_exhaustive()
    }
}

impl BusMarketData {
    /// An input for `cfg` over the validated `bus` configuration; subscribes to no channel yet
    /// (see [`BusMarketData::connect`]; [`MarketDataInput::poll`] retries every
    /// `reconnect_ms`).
    pub fn new(cfg: &MarketDataConfig, bus: McastConfig) -> BusMarketData {
        let ids = cfg.channel_ids(&bus);
        let n = ids.len();
        BusMarketData {
            feed: FeedState::new(ids.len(), cfg.reference),
            channels: ids
                .into_iter()
                .map(|id| ChannelIo {
                    id,
                    sub: None,
                    heard: 0,
                    next_connect: 0,
                })
                .collect(),
            bus,
            local: cfg.local,
            publisher: cfg.publisher,
            confirm_ns: cfg.confirm_ms.saturating_mul(1_000_000),
            reconnect_ns: cfg.reconnect_ms.saturating_mul(1_000_000),
            next_cycle: 0,
            cycle: None,
            healthy: vec![false; n],
            exported: None,
        }
    }

    /// Subscribes the channels not subscribed yet (blocks for the connection handshakes,
    /// up to 10 s each when the feed handler does not answer); returns how many are
    /// subscribed. Failures are logged and retried by `poll`. For tests and tools: the
    /// gateway uses [`start`](Self::start).
    pub fn connect(&mut self) -> usize {
        self.subscribe(MdSubscriber::connect)
    }

    /// Subscribes the channels not subscribed yet without waiting on the feed handler: the
    /// multicast lines are joined now, each recovery connection is made by later polls
    /// ([`MdSubscriber::new`]); returns how many are subscribed. This is what the
    /// service's reconnects use, so a feed handler that is down never holds the order loop.
    pub fn start(&mut self) -> usize {
        self.subscribe(MdSubscriber::new)
    }

    fn subscribe(
        &mut self,
        open: fn(&McastConfig, u16, IpAddr, IpAddr) -> Result<MdSubscriber, NetError>,
    ) -> usize {
        let now = now_ns();
        for c in &mut self.channels {
            if c.sub.is_some() {
                continue;
            }
            c.next_connect = now.saturating_add(self.reconnect_ns);
            match open(&self.bus, c.id, self.local, self.publisher) {
                Ok(s) => {
                    tracing::info!(channel = c.id, publisher = %self.publisher, "market data subscribed");
                    c.sub = Some(s);
                    c.heard = now;
                }
                Err(e) => tracing::warn!(
                    channel = c.id,
                    publisher = %self.publisher,
                    error = %e,
                    "market data: cannot subscribe (is the feed handler running?); references stay stale, retrying"
                ),
            }
        }
        self.channels.iter().filter(|c| c.sub.is_some()).count()
    }

    /// The protocol-side state (counters, resync flags).
    pub fn feed(&self) -> &FeedState {
        &self.feed
    }

    /// True when every channel is subscribed, live and past its first snapshot.
    pub fn is_live(&self) -> bool {
        self.channels.iter().enumerate().all(|(i, c)| {
            c.sub
                .as_ref()
                .is_some_and(|s| s.state().phase() == Phase::Live)
                && !self.feed.is_resyncing(i)
        })
    }

    /// True if channel `i` may re-confirm its references now.
    fn healthy(&self, i: usize, now: u64) -> bool {
        let c = &self.channels[i];
        let Some(s) = &c.sub else { return false };
        let st = s.state();
        st.phase() == Phase::Live
            && st.outstanding() == 0
            && st.buffered() == 0
            && now.saturating_sub(c.heard) <= self.confirm_ns
            && !self.feed.is_resyncing(i)
    }
}

impl MarketDataInput for BusMarketData {
    fn register_counters(&mut self, table: &dyn AllocateCounter) -> Result<(), CountersError> {
        let subscribed = table.allocate_counter("md channels subscribed", Kind::Gauge, 0)?;
        let feed = MARKET_COUNTERS
            .iter()
            .map(|&(label, field)| Ok((table.allocate_counter(label, Kind::Counter, 0)?, field)))
            .collect::<Result<_, CountersError>>()?;
        let channels = self
            .channels
            .iter()
            .map(|c| SubscriberCountersExport::new(table, &format!("md.ch{}", c.id)))
            .collect::<Result<_, CountersError>>()?;
        self.exported = Some(Exported {
            subscribed,
            feed,
            channels,
        });
        Ok(())
    }

    fn update_counters(&mut self) {
        let Some(x) = &self.exported else { return };
        let totals = self.feed.counters();
        for (counter, field) in &x.feed {
            counter.set(field(&totals));
        }
        let mut subscribed = 0;
        for (c, export) in self.channels.iter().zip(&x.channels) {
            if let Some(sub) = &c.sub {
                subscribed += 1;
                export.update(sub);
            }
        }
        x.subscribed.set(subscribed);
    }

    fn poll(&mut self, sink: &mut dyn FnMut(MarketEvent)) -> usize {
        let mono = Mono::now();
        let now = mono.as_nanos();
        let mut events = 0usize;
        let mut count = |ev: MarketEvent| {
            events += 1;
            sink(ev);
        };
        let mut reconnect = false;
        for (i, c) in self.channels.iter_mut().enumerate() {
            let Some(sub) = &mut c.sub else {
                reconnect |= now >= c.next_connect;
                continue;
            };
            let feed_losses = self.feed.counters.feed_losses;
            let mut app = Apply {
                feed: &mut self.feed,
                ch: i,
                sink: &mut count,
            };
            match sub.poll(mono, &mut app, 64) {
                Ok(n) => {
                    if n > 0 {
                        c.heard = now;
                    }
                    if self.feed.counters.feed_losses != feed_losses {
                        // Rare (one per exchange gap the feed handler gave up): worth a line.
                        tracing::warn!(
                            channel = c.id,
                            "exchange feed loss announced by the feed handler: references stale until the snapshot"
                        );
                    }
                    while let Some(ev) = sub.poll_event() {
                        // Rare, and worth knowing: no per-message logging here.
                        match ev {
                            Event::SnapshotApplied { .. } => {
                                tracing::info!(channel = c.id, ?ev, "market data in sync")
                            }
                            Event::RecoveryLost | Event::RecoveryRestored => tracing::warn!(
                                channel = c.id,
                                ?ev,
                                "market data recovery connection (any gap meanwhile is a loss)"
                            ),
                            _ => tracing::warn!(
                                channel = c.id,
                                ?ev,
                                "market data gap: references stale until the snapshot"
                            ),
                        }
                        self.feed.on_event(i, ev, &mut count);
                    }
                }
                Err(e) => {
                    tracing::warn!(channel = c.id, error = %e, "market data subscriber lost: references stale, reconnecting");
                    self.feed.invalidate(i, &mut count);
                    c.sub = None;
                    c.next_connect = now.saturating_add(self.reconnect_ns);
                }
            }
        }
        if self.cycle.is_none() && now >= self.next_cycle {
            self.cycle = Some(0);
            self.next_cycle = now.saturating_add(self.confirm_ns);
            for i in 0..self.channels.len() {
                self.healthy[i] = self.healthy(i, now);
            }
        }
        if let Some(mut cursor) = self.cycle {
            let done = self
                .feed
                .confirm(&self.healthy, &mut cursor, CONFIRM_BATCH, &mut count);
            self.cycle = (!done).then_some(cursor);
        }
        if reconnect {
            self.start();
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use feed_handler::book::{Event as BookEvent, Level, Side};
    use feed_handler::itch::Stock;

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    fn bytes(e: &BookEvent) -> Vec<u8> {
        let mut buf = [0u8; normalized::MAX_LEN];
        let n = feed_handler::normalized::encode(e, &mut buf);
        buf[..n].to_vec()
    }

    fn lvl(price: u32) -> Level {
        Level {
            price,
            shares: 100,
            orders: 1,
        }
    }

    fn bbo(locate: u16, s: &str, bid: Option<u32>, ask: Option<u32>) -> Vec<u8> {
        bytes(&BookEvent::Bbo {
            locate,
            stock: Stock::new(s),
            timestamp: 1,
            bid: bid.map(lvl),
            ask: ask.map(lvl),
        })
    }

    fn level(locate: u16, s: &str, side: Side, price: u32) -> Vec<u8> {
        bytes(&BookEvent::Level {
            locate,
            stock: Stock::new(s),
            timestamp: 1,
            side,
            level: lvl(price),
        })
    }

    fn trade(locate: u16, s: &str, price: u32) -> Vec<u8> {
        bytes(&BookEvent::Trade {
            locate,
            stock: Stock::new(s),
            timestamp: 2,
            side: None,
            price,
            shares: 10,
            match_number: 1,
            source: b'E',
        })
    }

    fn status(locate: u16, s: &str, state: u8) -> Vec<u8> {
        bytes(&BookEvent::TradingStatus {
            locate,
            stock: Stock::new(s),
            timestamp: 3,
            state,
            reason: *b"    ",
        })
    }

    /// A feed past its first (empty) snapshot on channel 0.
    fn live(source: ReferenceSource) -> FeedState {
        let mut f = FeedState::new(1, source);
        let mut none = |e: MarketEvent| panic!("unexpected {e:?}");
        f.restore_begin(0, &mut none);
        f.restore_chunk(0, &MarketView::new().l2()).unwrap();
        f.restore_finish(0, 0, &mut none).unwrap();
        f.on_event(0, Event::SnapshotApplied { seq: 0 }, &mut none);
        assert!(!f.is_resyncing(0));
        f
    }

    fn run(f: &mut FeedState, msg: &[u8]) -> Vec<MarketEvent> {
        let mut out = Vec::new();
        // Not the first message of a session (see `session_start_needs_no_snapshot`).
        f.on_message(0, 2, msg, &mut |e| out.push(e));
        out
    }

    fn reference(s: &str, price: i64) -> MarketEvent {
        MarketEvent::Reference {
            symbol: sym(s),
            price,
        }
    }

    #[test]
    fn midpoint_when_both_sides_else_last_trade() {
        let mut f = live(ReferenceSource::Midpoint);
        assert_eq!(run(&mut f, &bbo(1, "AAPL", Some(1_000_000), None)), []);
        assert_eq!(
            run(&mut f, &trade(1, "AAPL", 1_000_500)),
            [reference("AAPL", 1_000_500)]
        );
        assert_eq!(
            run(&mut f, &bbo(1, "AAPL", Some(1_000_000), Some(1_000_201))),
            [reference("AAPL", 1_000_100)]
        );
        // A later trade does not move a two-sided midpoint.
        assert_eq!(
            run(&mut f, &trade(1, "AAPL", 990_000)),
            [reference("AAPL", 1_000_100)]
        );
        assert_eq!(
            run(&mut f, &bbo(1, "AAPL", None, Some(1_000_201))),
            [reference("AAPL", 990_000)]
        );
        assert_eq!(f.counters().references, 4);
    }

    #[test]
    fn last_trade_source_ignores_quotes() {
        let mut f = live(ReferenceSource::LastTrade);
        assert_eq!(run(&mut f, &bbo(2, "MSFT", Some(10), Some(20))), []);
        assert_eq!(run(&mut f, &trade(2, "MSFT", 15)), [reference("MSFT", 15)]);
    }

    #[test]
    fn trading_status_halts_and_resumes_once() {
        let mut f = live(ReferenceSource::Midpoint);
        let halt = |h| MarketEvent::Halt {
            symbol: sym("IBM"),
            halted: h,
        };
        assert_eq!(run(&mut f, &status(3, "IBM", b'T')), []);
        assert_eq!(run(&mut f, &status(3, "IBM", b'H')), [halt(true)]);
        assert_eq!(run(&mut f, &status(3, "IBM", b'P')), []);
        assert_eq!(run(&mut f, &status(3, "IBM", b'T')), [halt(false)]);
        assert_eq!(run(&mut f, &status(3, "IBM", b'Q')), [halt(true)]);
    }

    #[test]
    fn malformed_input_is_counted_and_dropped() {
        let mut f = live(ReferenceSource::Midpoint);
        let good = trade(1, "AAPL", 100);
        assert_eq!(run(&mut f, &good[..good.len() - 1]), []);
        assert_eq!(run(&mut f, &[]), []);
        let mut bad_symbol = good.clone();
        bad_symbol[4] = 0x01;
        assert_eq!(run(&mut f, &bad_symbol), []);
        assert_eq!(f.counters().malformed, 3);
        assert_eq!(run(&mut f, &good), [reference("AAPL", 100)]);
    }

    #[test]
    fn nothing_is_vouched_for_before_the_first_snapshot() {
        let mut f = FeedState::new(1, ReferenceSource::Midpoint);
        assert!(f.is_resyncing(0));
        assert_eq!(run(&mut f, &trade(1, "AAPL", 100)), []);
        // The message still counts: the snapshot-applied event vouches for it.
        let mut out = Vec::new();
        f.on_event(0, Event::SnapshotApplied { seq: 1 }, &mut |e| out.push(e));
        assert_eq!(out, [reference("AAPL", 100)]);
    }

    #[test]
    fn session_start_needs_no_snapshot() {
        let mut f = FeedState::new(1, ReferenceSource::LastTrade);
        let mut out = Vec::new();
        f.on_message(0, 1, &trade(1, "AAPL", 100), &mut |e| out.push(e));
        assert!(!f.is_resyncing(0));
        assert_eq!(out, [reference("AAPL", 100)]);
        // After a gap, a later sequence vouches for nothing until the snapshot.
        out.clear();
        f.on_event(0, Event::ResyncStarted, &mut |e| out.push(e));
        f.on_message(0, 9, &trade(1, "AAPL", 101), &mut |e| out.push(e));
        assert_eq!(
            out,
            [MarketEvent::Stale {
                symbol: sym("AAPL")
            }]
        );
    }

    #[test]
    fn unrecoverable_loss_marks_stale_until_the_snapshot() {
        let mut f = live(ReferenceSource::Midpoint);
        run(&mut f, &bbo(1, "AAPL", Some(100), Some(200)));
        run(&mut f, &trade(2, "MSFT", 50));
        run(&mut f, &bbo(3, "ONESIDE", Some(100), None));
        let mut out = Vec::new();
        f.on_event(0, Event::UnrecoverableLoss { from: 5, to: 9 }, &mut |e| {
            out.push(e)
        });
        assert_eq!(
            out,
            [
                MarketEvent::Stale {
                    symbol: sym("AAPL")
                },
                MarketEvent::Stale {
                    symbol: sym("MSFT")
                }
            ]
        );
        assert_eq!(f.counters().stale, 2);
        // Messages during the resync (none should come, but a late one must not vouch).
        assert_eq!(run(&mut f, &trade(2, "MSFT", 51)), []);
        let mut cursor = 0;
        let mut confirmed = Vec::new();
        assert!(f.confirm(&[true], &mut cursor, 100, &mut |e| confirmed.push(e)));
        assert_eq!(confirmed, []);

        // The snapshot hid a halt of AAPL and a new quote of MSFT.
        let mut publisher = MarketView::new();
        for m in [
            level(1, "AAPL", Side::Bid, 110),
            level(1, "AAPL", Side::Ask, 130),
            status(1, "AAPL", b'H'),
            level(2, "MSFT", Side::Bid, 60),
            level(2, "MSFT", Side::Ask, 70),
        ] {
            publisher.apply(&m).unwrap();
        }
        out.clear();
        f.restore_begin(0, &mut |e| out.push(e));
        f.restore_chunk(0, &publisher.l2()).unwrap();
        f.restore_finish(0, 20, &mut |e| out.push(e)).unwrap();
        assert_eq!(
            out,
            [MarketEvent::Halt {
                symbol: sym("AAPL"),
                halted: true
            }]
        );
        out.clear();
        f.on_event(0, Event::SnapshotApplied { seq: 20 }, &mut |e| out.push(e));
        // Trades from before the gap are forgotten: MSFT's reference is its snapshot book;
        // ONESIDE has no two-sided book and no trade since, so no reference.
        assert_eq!(out, [reference("AAPL", 120), reference("MSFT", 65)]);
    }

    #[test]
    fn exchange_feed_loss_marks_stale_until_the_snapshot() {
        let mut f = live(ReferenceSource::Midpoint);
        run(&mut f, &bbo(1, "AAPL", Some(100), Some(200)));
        run(&mut f, &trade(2, "MSFT", 50));
        let loss = normalized::FeedLoss::new(1000, 1200, 5);
        let out = run(&mut f, zerocopy::IntoBytes::as_bytes(&loss));
        assert_eq!(
            out,
            [
                MarketEvent::Stale {
                    symbol: sym("AAPL")
                },
                MarketEvent::Stale {
                    symbol: sym("MSFT")
                }
            ]
        );
        assert!(f.is_resyncing(0));
        let c = f.counters();
        assert_eq!((c.feed_losses, c.invalidations, c.malformed), (1, 1, 0));
        // Quotes after the loss vouch for nothing, nor do confirmations: a halt may have
        // been lost.
        assert_eq!(run(&mut f, &bbo(1, "AAPL", Some(110), Some(210))), []);
        let mut cursor = 0;
        let mut confirmed = Vec::new();
        assert!(f.confirm(&[true], &mut cursor, 100, &mut |e| confirmed.push(e)));
        assert_eq!(confirmed, []);
        // The next snapshot (e.g. from a restarted feed handler) brings them back.
        let mut publisher = MarketView::new();
        for m in [
            level(1, "AAPL", Side::Bid, 110),
            level(1, "AAPL", Side::Ask, 130),
        ] {
            publisher.apply(&m).unwrap();
        }
        let mut out = Vec::new();
        f.restore_begin(0, &mut |e| out.push(e));
        f.restore_chunk(0, &publisher.l2()).unwrap();
        f.restore_finish(0, 9, &mut |e| out.push(e)).unwrap();
        f.on_event(0, Event::SnapshotApplied { seq: 9 }, &mut |e| out.push(e));
        assert_eq!(out, [reference("AAPL", 120)]);
    }

    #[test]
    fn corrupt_snapshot_is_refused_and_channel_stays_stale() {
        let mut f = live(ReferenceSource::Midpoint);
        run(&mut f, &trade(1, "AAPL", 100));
        let mut out = Vec::new();
        f.on_event(0, Event::SessionChanged { old: 1, new: 2 }, &mut |e| {
            out.push(e)
        });
        assert_eq!(out.len(), 1);
        f.restore_begin(0, &mut |e| out.push(e));
        f.restore_chunk(0, b"junk").unwrap();
        assert_eq!(
            f.restore_finish(0, 3, &mut |e| out.push(e)),
            Err(RestoreError)
        );
        assert_eq!(f.counters().snapshots_rejected, 1);
        assert!(f.is_resyncing(0));
    }

    #[test]
    fn confirm_walks_live_references_in_batches() {
        let mut f = live(ReferenceSource::LastTrade);
        for l in 1..=5u16 {
            run(&mut f, &trade(l, &format!("S{l}"), u32::from(l)));
        }
        run(&mut f, &bbo(9, "QUOTED", Some(1), Some(2)));
        let mut out = Vec::new();
        let mut cursor = 0;
        assert!(f.confirm(&[false], &mut cursor, 100, &mut |e| out.push(e)));
        assert_eq!(out, [], "an unhealthy channel confirms nothing");
        assert!(!f.confirm(&[true], &mut cursor, 4, &mut |e| out.push(e)));
        assert_eq!(out.len(), 4);
        assert!(f.confirm(&[true], &mut cursor, 4, &mut |e| out.push(e)));
        assert_eq!(cursor, 0);
        assert_eq!(out.len(), 5, "QUOTED has no trade: nothing to confirm");
        assert_eq!(out[4], reference("S5", 5));
    }

    #[test]
    fn reused_locate_forgets_the_old_symbol() {
        let mut f = live(ReferenceSource::LastTrade);
        run(&mut f, &trade(7, "OLD", 10));
        assert_eq!(
            run(&mut f, &trade(7, "NEW", 20)),
            [
                MarketEvent::Stale { symbol: sym("OLD") },
                reference("NEW", 20)
            ]
        );
    }

    fn cfg(text: &str) -> MarketDataConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn config_checks_name_the_key() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut c = cfg("config = \"x\"\nlocal = \"10.0.0.1\"\npublisher = \"10.0.0.2\"\n");
        assert_eq!(c.reference, ReferenceSource::Midpoint);
        assert_eq!(c.load_bus().unwrap_err().0, "market_data.config");
        c.config = root.join("configs/demo/feed-handler.toml");
        let bus = c.load_bus().unwrap();
        assert!(!c.channel_ids(&bus).is_empty());
        c.validate(&bus, 5000).unwrap();
        c.channels = vec![999];
        let (k, p) = c.validate(&bus, 5000).unwrap_err();
        assert_eq!(k, "market_data.channels");
        assert!(p.contains("999"), "{p}");
        c.channels.clear();
        c.confirm_ms = 3000;
        let (k, p) = c.validate(&bus, 5000).unwrap_err();
        assert_eq!(k, "market_data.confirm_ms");
        assert!(p.contains("reference_max_age_ms"), "{p}");
        assert!(toml::from_str::<MarketDataConfig>(
            "config = \"x\"\nlocal = \"10.0.0.1\"\npublisher = \"10.0.0.2\"\nreference = \"vwap\"\n"
        )
        .is_err());
    }

    /// The input's counters land in the table the service hands it: its totals, the
    /// subscribed-channels gauge and one block per channel; before any subscriber they read 0.
    #[test]
    fn counters_are_registered_per_channel() {
        let bus = McastConfig::from_toml_str(
            r#"
            [[channels]]
            id = 3
            name = "a"
            line_a = "239.1.1.3"
            port = 7000
            [[channels]]
            id = 4
            name = "b"
            line_a = "239.1.1.4"
            port = 7001
            "#,
        )
        .unwrap();
        let md = cfg("config = \"x\"\nlocal = \"10.0.0.1\"\npublisher = \"10.0.0.2\"\n");
        let mut input = BusMarketData::new(&md, bus);
        let table = rocebus::counters::LocalCounters::new(256).unwrap();
        input.register_counters(&table).unwrap();
        input.update_counters();
        let entries: Vec<_> = table.iter().collect();
        let per_channel = |ch: &str| entries.iter().filter(|e| e.label.starts_with(ch)).count();
        assert!(per_channel("md.ch3.") > 10, "{entries:?}");
        assert_eq!(per_channel("md.ch3."), per_channel("md.ch4."));
        assert_eq!(
            entries.len(),
            1 + MARKET_COUNTERS.len() + 2 * per_channel("md.ch3."),
            "{entries:?}"
        );
        let value = |label: &str| {
            entries
                .iter()
                .find(|e| e.label.as_str() == label)
                .unwrap_or_else(|| panic!("no counter {label:?}"))
                .value
        };
        assert_eq!(value("md channels subscribed"), 0);
        assert_eq!(value("md messages"), 0);
        assert_eq!(value("md.ch3.delivered"), 0);
        assert_eq!(value("md.ch4.gaps_detected"), 0);
        let gauge = entries
            .iter()
            .find(|e| e.label.as_str() == "md channels subscribed")
            .unwrap();
        assert_eq!(gauge.kind, Kind::Gauge);
    }
}
