//! Recordings of the market-data bus as DBN: the mapping from normalized messages (what
//! `rocebus record` receives) to DBN records, and back (what `feed-handler replay` publishes).
//!
//! Owns the record conventions; opens no socket and reads no clock (receive times are given).
//! Conventions (also in the README, "Record and replay"):
//! - One file, mixed schemas (metadata `schema` unset), dataset `XNAS.ITCH`, publisher 2,
//!   `instrument_id` the ITCH stock locate. Metadata `start` is midnight US Eastern of the
//!   trading day (ITCH's time zero); `end` is unset. A `SymbolMappingMsg` (raw symbol ->
//!   instrument id) precedes the first record of each symbol.
//! - `ts_event`: the exchange time (midnight + ITCH nanoseconds); `ts_recv`: the recorder's
//!   receive time (UNIX ns); `ts_in_delta`: `ts_recv` minus the feed handler's receive time of
//!   the exchange packet (the normalized header's `ts_recv`), saturated to `i32`, 0 when the
//!   feed handler gave none; `sequence`: the bus sequence (low 32 bits), except for trades.
//! - BBO -> `Mbp1Msg`, action `N`, side `N`, flags `LAST|TOB|MBP`, `levels[0]` the BBO (an
//!   empty side: price `UNDEF_PRICE`, size and count 0).
//! - Level change -> `Mbp1Msg` without `TOB`: action `M` (level now has `size` shares) or `C`
//!   (level gone), side `B`/`A`, `price`, `size`, and in `levels[0]` the level on its side
//!   (price, size, orders), the other side undefined. `depth` 0 (the bus does not carry it).
//! - Trade -> `TradeMsg`: side is the aggressor's (`A` when a resting bid was hit, `B` when a
//!   resting ask was lifted, `N` for crosses), `sequence` the exchange match number (low 32
//!   bits). The ITCH message type (E/C/P/Q) is not kept; replay says E for a sided trade, Q
//!   otherwise.
//! - Trading status -> `StatusMsg` (halt, pause, quoting, trading; NASDAQ reason codes as DBN
//!   reasons, as `feed-handler export` maps them).
//! - Exchange feed loss (the feed handler's `FeedLoss`, announced on every channel, recorded
//!   once) -> `ErrorMsg` with code
//!   `SKIPPED_RECORDS_AFTER_SLOW_READING` and the text
//!   `rocebus feed loss: exchange sequences FROM..TO lost; every symbol suspect`.
//! - Unrecoverable loss on the bus itself (the recorder's subscriber gave up on a range) ->
//!   `ErrorMsg`, same code, text
//!   `rocebus bus loss: channel C sequences FROM..TO lost; every symbol of the channel suspect`,
//!   `ts_event` the time the loss was declared.
//! - Late-join snapshot (as delivered to the recorder): per symbol a clear record (`Mbp1Msg`
//!   action `R`, flags `SNAPSHOT|MBP`), its trading status (`StatusMsg`) if any, then one
//!   `Mbp1Msg` per level (action `A`, flags `SNAPSHOT|MBP`, `levels[0]` as for a level
//!   change); `ts_event` is the receive time, `sequence` the snapshot's bus sequence; the last
//!   record of a snapshot carries `LAST`.

use crate::book::Side;
use crate::dbnexport::{status_reason, Date, DATASET, PRICE_SCALE, PUBLISHER_ID};
use crate::itch::Stock;
use crate::normalized::{self, FeedLoss, Normalized, MAX_LEN};
use crate::view::MarketView;
use dbn::encode::{DbnEncoder, DynWriter, EncodeRecord};
use dbn::enums::{Compression, ErrorCode, SType, StatusAction, StatusReason};
use dbn::{
    flags, rtype, BidAskPair, ErrorMsg, FlagSet, Mbp1Msg, Metadata, RecordHeader, RecordRef,
    StatusMsg, SymbolMappingMsg, TradeMsg,
};
use rocebus::mcast::{Handler, RestoreError, SnapshotSink};
use std::io::Write;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::IntoBytes;

const DAY_NS: u64 = 86_400 * 1_000_000_000;
const FEED_LOSS_PREFIX: &str = "rocebus feed loss: exchange sequences ";
const BUS_LOSS_PREFIX: &str = "rocebus bus loss: channel ";

/// What a recording holds so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordCounters {
    /// Bus messages recorded (all kinds).
    pub messages: u64,
    /// BBO messages.
    pub bbo: u64,
    /// Level changes.
    pub levels: u64,
    /// Trades.
    pub trades: u64,
    /// Trading status changes.
    pub status: u64,
    /// Exchange feed losses announced by the feed handler (once each, though the feed
    /// handler announces each on every channel).
    pub feed_losses: u64,
    /// Unrecoverable losses of the bus seen by the recorder.
    pub bus_losses: u64,
    /// Bus messages lost in those (sum of `to - from`).
    pub bus_lost_messages: u64,
    /// Snapshots recorded.
    pub snapshots: u64,
    /// Snapshots refused (corrupt or of another layout).
    pub rejected_snapshots: u64,
    /// Bus messages that are not normalized messages (dropped, counted).
    pub malformed: u64,
    /// Symbol mapping records written.
    pub symbols: u64,
    /// DBN records written, all kinds.
    pub records: u64,
}

/// Midnight US Eastern (ITCH time zero) of the trading day that UNIX time `unix_ns` falls in.
pub fn eastern_midnight_of(unix_ns: u64) -> u64 {
    let days = i64::try_from(unix_ns / DAY_NS).unwrap_or(0);
    // The Eastern date is the UTC date or the day before.
    let mut best = 0;
    for d in [days - 1, days] {
        let m = Date::from_days_since_epoch(d).eastern_midnight_unix_ns();
        if m <= unix_ns {
            best = m;
        }
    }
    best
}

fn px(p: u32) -> i64 {
    i64::from(p) * PRICE_SCALE
}

fn unpx(p: i64) -> u32 {
    if p == dbn::UNDEF_PRICE {
        return 0;
    }
    u32::try_from(p / PRICE_SCALE).unwrap_or(0)
}

fn clamp32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The bus's side byte (b'B' / b'S') as DBN's (b'B' / b'A').
fn dbn_side(itch: u8) -> u8 {
    match itch {
        b'B' => b'B',
        b'S' => b'A',
        _ => b'N',
    }
}

fn level_pair(side: u8, price: i64, size: u32, count: u32) -> BidAskPair {
    let mut p = BidAskPair {
        bid_px: dbn::UNDEF_PRICE,
        ask_px: dbn::UNDEF_PRICE,
        ..Default::default()
    };
    if side == b'B' {
        (p.bid_px, p.bid_sz, p.bid_ct) = (price, size, count);
    } else {
        (p.ask_px, p.ask_sz, p.ask_ct) = (price, size, count);
    }
    p
}

fn status_action(state: u8) -> StatusAction {
    match state {
        b'H' => StatusAction::Halt,
        b'P' => StatusAction::Pause,
        b'Q' => StatusAction::Quoting,
        b'T' => StatusAction::Trading,
        _ => StatusAction::None,
    }
}

/// A NASDAQ reason code that `status_reason` maps to `reason` (the inverse, one code each).
fn reason_code(reason: u16) -> [u8; 4] {
    const CODES: [&[u8; 4]; 17] = [
        b"T1  ", b"T2  ", b"T3  ", b"T5  ", b"T6  ", b"T8  ", b"T12 ", b"H4  ", b"H9  ", b"H10 ",
        b"O1  ", b"IPO1", b"MWC1", b"MWC2", b"MWC0", b"H11 ", b"LUDP",
    ];
    CODES
        .iter()
        .find(|c| status_reason(c) as u16 == reason && reason != StatusReason::None as u16)
        .map_or([b' '; 4], |c| **c)
}

/// Writes what a market-data subscriber delivers as DBN records. One per recording; hand
/// [`Recorder::channel`] to `McastSubscriber::poll` (it is the [`Handler`] and
/// [`SnapshotSink`]), and tell it of unrecoverable losses with [`Recorder::bus_loss`].
///
/// A write error stops the recording: it is kept for [`Recorder::take_error`] and later
/// records are dropped. Recording a message does not allocate (a new symbol's mapping record
/// and loss and snapshot records do).
pub struct Recorder<W: Write> {
    enc: DbnEncoder<DynWriter<'static, W>>,
    midnight: u64,
    /// Locates whose symbol mapping was written.
    mapped: Vec<bool>,
    /// Snapshot bytes being received, per channel index.
    staging: Vec<Vec<u8>>,
    ts_recv: u64,
    counters: RecordCounters,
    error: Option<dbn::Error>,
    /// Feed losses recorded lately, `(from, to)`: the feed handler announces each on every
    /// channel, the recording holds it once.
    recent_losses: [(u64, u64); 16],
    next_loss: usize,
}

impl<W: Write> std::fmt::Debug for Recorder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("midnight", &self.midnight)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// The recorder as one channel's subscriber sees it (its snapshot staging is per channel).
#[derive(Debug)]
pub struct ChannelRecorder<'a, W: Write> {
    rec: &'a mut Recorder<W>,
    index: usize,
}

impl<W: Write> Recorder<W> {
    /// Starts a recording of the trading day starting at `midnight` (UNIX ns of midnight US
    /// Eastern, see [`eastern_midnight_of`]) with `channels` channels, written to `out`,
    /// Zstandard-compressed when `zstd`.
    pub fn new(out: W, zstd: bool, midnight: u64, channels: usize) -> Result<Self, dbn::Error> {
        let metadata = Metadata::builder()
            .dataset(DATASET)
            .schema(None)
            .start(midnight)
            .stype_in(Some(SType::RawSymbol))
            .stype_out(SType::InstrumentId)
            .build();
        let compression = if zstd {
            Compression::Zstd
        } else {
            Compression::None
        };
        let enc = DbnEncoder::new(DynWriter::new(out, compression)?, &metadata)?;
        Ok(Self {
            enc,
            midnight,
            mapped: vec![false; usize::from(u16::MAX) + 1],
            staging: vec![Vec::new(); channels.max(1)],
            ts_recv: 0,
            counters: RecordCounters::default(),
            error: None,
            recent_losses: [(0, 0); 16],
            next_loss: 0,
        })
    }

    /// Sets the receive time (UNIX ns) stamped on what is recorded next; call once per poll.
    pub fn set_ts_recv(&mut self, ts_recv: u64) {
        self.ts_recv = ts_recv;
    }

    /// Totals so far.
    pub fn counters(&self) -> &RecordCounters {
        &self.counters
    }

    /// The first write error, if any (the recording stopped there).
    pub fn take_error(&mut self) -> Option<dbn::Error> {
        self.error.take()
    }

    /// The recorder for the subscriber of channel index `index` (0-based, below `channels`).
    pub fn channel(&mut self, index: usize) -> ChannelRecorder<'_, W> {
        let index = index.min(self.staging.len() - 1);
        ChannelRecorder { rec: self, index }
    }

    fn put<R: dbn::encode::DbnEncodable>(&mut self, rec: &R) {
        if self.error.is_some() {
            return;
        }
        match self.enc.encode_record(rec) {
            Ok(()) => self.counters.records += 1,
            Err(e) => self.error = Some(e),
        }
    }

    fn map_symbol(&mut self, locate: u16, stock: [u8; 8], ts_event: u64) {
        if locate == 0 || self.mapped[usize::from(locate)] {
            return;
        }
        self.mapped[usize::from(locate)] = true;
        let symbol = Stock(stock);
        let raw = symbol.as_str().unwrap_or("");
        match SymbolMappingMsg::new(
            u32::from(locate),
            ts_event,
            SType::RawSymbol,
            raw,
            SType::InstrumentId,
            &locate.to_string(),
            self.midnight,
            self.midnight + DAY_NS,
        ) {
            Ok(m) => {
                self.put(&m);
                self.counters.symbols += 1;
            }
            Err(e) => self.error = Some(e),
        }
    }

    fn hd<R: dbn::HasRType>(&self, rtype: u8, locate: u16, ts_event: u64) -> RecordHeader {
        RecordHeader::new::<R>(rtype, PUBLISHER_ID, u32::from(locate), ts_event)
    }

    fn delta(&self, fh_recv: u64) -> i32 {
        if fh_recv == 0 {
            return 0;
        }
        let d = i128::from(self.ts_recv) - i128::from(fh_recv);
        d.clamp(i128::from(i32::MIN), i128::from(i32::MAX)) as i32
    }

    /// Records one bus message (sequence `seq` on its channel).
    pub fn message(&mut self, seq: u64, msg: &[u8]) {
        let Ok(m) = normalized::decode(msg) else {
            self.counters.malformed += 1;
            return;
        };
        let h = match m {
            Normalized::Bbo(x) => &x.header,
            Normalized::Level(x) => &x.header,
            Normalized::Trade(x) => &x.header,
            Normalized::Status(x) => &x.header,
            Normalized::FeedLoss(x) => &x.header,
        };
        let (locate, ts) = (h.stock_locate.get(), self.midnight + h.timestamp.get());
        let (ts_recv, delta) = (self.ts_recv, self.delta(h.ts_recv.get()));
        self.map_symbol(locate, h.stock, ts);
        self.counters.messages += 1;
        let sequence = seq as u32;
        match m {
            Normalized::Bbo(b) => {
                self.counters.bbo += 1;
                let side = |p: u32, s: u64, n: u32| {
                    if p == 0 && s == 0 && n == 0 {
                        (dbn::UNDEF_PRICE, 0, 0)
                    } else {
                        (px(p), clamp32(s), n)
                    }
                };
                let (bid_px, bid_sz, bid_ct) =
                    side(b.bid_price.get(), b.bid_shares.get(), b.bid_orders.get());
                let (ask_px, ask_sz, ask_ct) =
                    side(b.ask_price.get(), b.ask_shares.get(), b.ask_orders.get());
                let rec = Mbp1Msg {
                    hd: self.hd::<Mbp1Msg>(rtype::MBP_1, locate, ts),
                    price: dbn::UNDEF_PRICE,
                    size: 0,
                    action: b'N' as i8,
                    side: b'N' as i8,
                    flags: FlagSet::new(flags::LAST | flags::TOB | flags::MBP),
                    depth: 0,
                    ts_recv,
                    ts_in_delta: delta,
                    sequence,
                    levels: [BidAskPair {
                        bid_px,
                        ask_px,
                        bid_sz,
                        ask_sz,
                        bid_ct,
                        ask_ct,
                    }],
                };
                self.put(&rec);
            }
            Normalized::Level(l) => {
                self.counters.levels += 1;
                let side = dbn_side(l.side);
                let (price, size) = (px(l.price.get()), clamp32(l.shares.get()));
                let rec = Mbp1Msg {
                    hd: self.hd::<Mbp1Msg>(rtype::MBP_1, locate, ts),
                    price,
                    size,
                    action: (if size == 0 { b'C' } else { b'M' }) as i8,
                    side: side as i8,
                    flags: FlagSet::new(flags::LAST | flags::MBP),
                    depth: 0,
                    ts_recv,
                    ts_in_delta: delta,
                    sequence,
                    levels: [level_pair(side, price, size, l.orders.get())],
                };
                self.put(&rec);
            }
            Normalized::Trade(t) => {
                self.counters.trades += 1;
                // The bus names the resting order's side; DBN the aggressor's.
                let aggressor = match t.side {
                    b'B' => b'A',
                    b'S' => b'B',
                    _ => b'N',
                };
                let rec = TradeMsg {
                    hd: self.hd::<TradeMsg>(rtype::MBP_0, locate, ts),
                    price: px(t.price.get()),
                    size: clamp32(t.shares.get()),
                    action: b'T' as i8,
                    side: aggressor as i8,
                    flags: FlagSet::new(flags::LAST),
                    depth: 0,
                    ts_recv,
                    ts_in_delta: delta,
                    sequence: t.match_number.get() as u32,
                };
                self.put(&rec);
            }
            Normalized::Status(s) => {
                self.counters.status += 1;
                let rec = self.status(locate, ts, s.state, &s.reason);
                self.put(&rec);
            }
            Normalized::FeedLoss(f) => {
                let range = (f.from.get(), f.to.get());
                if self.recent_losses.contains(&range) {
                    // Already recorded from another channel.
                    self.counters.messages -= 1;
                    return;
                }
                self.recent_losses[self.next_loss] = range;
                self.next_loss = (self.next_loss + 1) % self.recent_losses.len();
                self.counters.feed_losses += 1;
                let text = format!(
                    "{FEED_LOSS_PREFIX}{}..{} lost; every symbol suspect",
                    f.from.get(),
                    f.to.get()
                );
                let mut rec = ErrorMsg::new(
                    ts,
                    Some(ErrorCode::SkippedRecordsAfterSlowReading),
                    &text,
                    true,
                );
                rec.hd.publisher_id = PUBLISHER_ID;
                self.put(&rec);
            }
        }
    }

    fn status(&self, locate: u16, ts: u64, state: u8, reason: &[u8; 4]) -> StatusMsg {
        let yn = |b: bool| (if b { b'Y' } else { b'N' }) as i8;
        StatusMsg {
            hd: self.hd::<StatusMsg>(rtype::STATUS, locate, ts),
            ts_recv: self.ts_recv,
            action: status_action(state) as u16,
            reason: status_reason(reason) as u16,
            trading_event: 0,
            is_trading: yn(state == b'T'),
            is_quoting: yn(state == b'T' || state == b'Q'),
            is_short_sell_restricted: b'~' as i8,
            _reserved: [0; 7],
        }
    }

    /// Records an unrecoverable loss of bus messages `[from, to)` on channel `channel` (its
    /// id), declared now (the receive time set last).
    pub fn bus_loss(&mut self, channel: u16, from: u64, to: u64) {
        self.counters.bus_losses += 1;
        self.counters.bus_lost_messages += to.saturating_sub(from);
        let text = format!(
            "{BUS_LOSS_PREFIX}{channel} sequences {from}..{to} lost; every symbol of the channel suspect"
        );
        let mut rec = ErrorMsg::new(
            self.ts_recv,
            Some(ErrorCode::SkippedRecordsAfterSlowReading),
            &text,
            true,
        );
        rec.hd.publisher_id = PUBLISHER_ID;
        self.put(&rec);
    }

    /// Records a snapshot (L2 layout, see [`crate::view`]) taken at bus sequence `seq`.
    fn snapshot(&mut self, seq: u64, l2: &[u8]) -> Result<(), RestoreError> {
        let mut view = MarketView::new();
        if view.restore_l2(l2).is_err() {
            self.counters.rejected_snapshots += 1;
            return Err(RestoreError);
        }
        self.counters.snapshots += 1;
        let (ts, sequence) = (self.ts_recv, seq as u32);
        let snap = flags::SNAPSHOT | flags::MBP;
        // Records are built first so the last one can carry LAST.
        let mut out: Vec<Result<Mbp1Msg, StatusMsg>> = Vec::new();
        for (locate, s) in view.symbols() {
            self.map_symbol(locate, s.stock.0, ts);
            out.push(Ok(Mbp1Msg {
                hd: self.hd::<Mbp1Msg>(rtype::MBP_1, locate, ts),
                price: dbn::UNDEF_PRICE,
                size: 0,
                action: b'R' as i8,
                side: b'N' as i8,
                flags: FlagSet::new(snap),
                depth: 0,
                ts_recv: ts,
                ts_in_delta: 0,
                sequence,
                levels: [BidAskPair {
                    bid_px: dbn::UNDEF_PRICE,
                    ask_px: dbn::UNDEF_PRICE,
                    ..Default::default()
                }],
            }));
            if s.trading_state != b' ' {
                out.push(Err(self.status(locate, ts, s.trading_state, &s.reason)));
            }
            for (side, byte) in [(Side::Bid, b'B'), (Side::Ask, b'A')] {
                for (depth, l) in s.depth(side).enumerate() {
                    let (price, size) = (px(l.price), clamp32(l.shares));
                    out.push(Ok(Mbp1Msg {
                        hd: self.hd::<Mbp1Msg>(rtype::MBP_1, locate, ts),
                        price,
                        size,
                        action: b'A' as i8,
                        side: byte as i8,
                        flags: FlagSet::new(snap),
                        depth: u8::try_from(depth).unwrap_or(u8::MAX),
                        ts_recv: ts,
                        ts_in_delta: 0,
                        sequence,
                        levels: [level_pair(byte, price, size, l.orders)],
                    }));
                }
            }
        }
        // The last Mbp1 record of the snapshot carries LAST.
        if let Some(Ok(last)) = out.iter_mut().rev().find(|r| r.is_ok()) {
            last.flags = FlagSet::new(snap | flags::LAST);
        }
        for r in &out {
            match r {
                Ok(m) => self.put(m),
                Err(s) => self.put(s),
            }
        }
        Ok(())
    }

    /// Ends the recording: the Zstandard frame is finished and everything flushed.
    pub fn finish(mut self) -> Result<RecordCounters, dbn::Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.enc.get_mut().finish()?;
        self.enc
            .get_mut()
            .flush()
            .map_err(|e| dbn::Error::io(e, "flushing the recording"))?;
        Ok(self.counters)
    }

    /// Flushes what was recorded so far to the writer (call every second or so, so a crash
    /// loses little).
    pub fn flush(&mut self) -> Result<(), dbn::Error> {
        self.enc.flush()
    }
}

impl<W: Write> Handler for ChannelRecorder<'_, W> {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.rec.message(seq, msg);
    }
}

impl<W: Write> SnapshotSink for ChannelRecorder<'_, W> {
    fn begin_restore(&mut self) {
        self.rec.staging[self.index].clear();
    }

    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.rec.staging[self.index].extend_from_slice(data);
        Ok(())
    }

    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        let bytes = std::mem::take(&mut self.rec.staging[self.index]);
        let r = self.rec.snapshot(snapshot_seq, &bytes);
        self.rec.staging[self.index] = bytes;
        self.rec.staging[self.index].clear();
        r
    }
}

/// One DBN record as a bus message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// A normalized message for the channel of `locate`: `bytes[..len]`.
    Message {
        /// Stock locate (the channel is `locate % channels`).
        locate: u16,
        /// Message length.
        len: usize,
    },
    /// A normalized message for every channel (a feed loss): `bytes[..len]`.
    Broadcast {
        /// Message length.
        len: usize,
    },
    /// A symbol mapping, remembered for the records that follow.
    Mapping,
    /// A snapshot's clear-book record: the bus has no such message (dropped, counted).
    SnapshotClear,
    /// A record with no bus equivalent (e.g. MBO or definition records), counted.
    Unsupported,
}

/// Turns DBN records back into normalized messages (the inverse of [`Recorder`]'s mapping:
/// recording what this produces gives the same records, receive times aside). Also reads the
/// trades and status files of `feed-handler export`.
#[derive(Debug)]
pub struct Replayer {
    symbols: Vec<[u8; 8]>,
    midnight: u64,
}

impl Default for Replayer {
    fn default() -> Self {
        Self::new()
    }
}

impl Replayer {
    /// A replayer knowing no symbol yet.
    pub fn new() -> Self {
        Self {
            symbols: vec![[b' '; 8]; usize::from(u16::MAX) + 1],
            midnight: 0,
        }
    }

    fn header(&mut self, kind: u8, rec: &RecordHeader, ts_recv: u64) -> normalized::Header {
        let ts = rec.ts_event;
        if ts < self.midnight || ts >= self.midnight + DAY_NS {
            self.midnight = eastern_midnight_of(ts);
        }
        let locate = u16::try_from(rec.instrument_id).unwrap_or(0);
        normalized::Header {
            kind,
            version: normalized::VERSION,
            stock_locate: U16::new(locate),
            stock: self.symbols[usize::from(locate)],
            timestamp: U64::new(ts - self.midnight),
            ts_recv: U64::new(ts_recv),
        }
    }

    /// Converts `rec` into `out`, stamping `ts_recv` (UNIX ns, the replay's own time of
    /// publication, 0 for unknown) as the feed handler's receive time.
    pub fn convert(
        &mut self,
        rec: RecordRef<'_>,
        ts_recv: u64,
        out: &mut [u8; MAX_LEN],
    ) -> Replayed {
        let put = |out: &mut [u8; MAX_LEN], b: &[u8]| {
            out[..b.len()].copy_from_slice(b);
            b.len()
        };
        if let Some(m) = rec.get::<SymbolMappingMsg>() {
            if let (Ok(locate), Ok(sym)) = (u16::try_from(m.hd.instrument_id), m.stype_in_symbol())
            {
                self.symbols[usize::from(locate)] = Stock::new(sym).0;
            }
            return Replayed::Mapping;
        }
        if let Some(m) = rec.get::<Mbp1Msg>() {
            let f = m.flags.raw();
            let locate = u16::try_from(m.hd.instrument_id).unwrap_or(0);
            if f & flags::SNAPSHOT != 0 && m.action == b'R' as i8 {
                return Replayed::SnapshotClear;
            }
            let l = &m.levels[0];
            if f & flags::TOB != 0 {
                let side = |p: i64, s: u32, n: u32| {
                    if p == dbn::UNDEF_PRICE {
                        (0, 0, 0)
                    } else {
                        (unpx(p), u64::from(s), n)
                    }
                };
                let (bp, bs, bn) = side(l.bid_px, l.bid_sz, l.bid_ct);
                let (ap, as_, an) = side(l.ask_px, l.ask_sz, l.ask_ct);
                let b = normalized::Bbo {
                    header: self.header(normalized::KIND_BBO, &m.hd, ts_recv),
                    bid_price: U32::new(bp),
                    ask_price: U32::new(ap),
                    bid_shares: U64::new(bs),
                    ask_shares: U64::new(as_),
                    bid_orders: U32::new(bn),
                    ask_orders: U32::new(an),
                };
                let len = put(out, b.as_bytes());
                return Replayed::Message { locate, len };
            }
            let (side, orders) = match m.side as u8 {
                b'B' => (b'B', l.bid_ct),
                b'A' => (b'S', l.ask_ct),
                _ => return Replayed::Unsupported,
            };
            let size = if m.action == b'C' as i8 && f & flags::SNAPSHOT == 0 {
                0
            } else {
                m.size
            };
            let lc = normalized::LevelChange {
                header: self.header(normalized::KIND_LEVEL, &m.hd, ts_recv),
                side,
                reserved: [0; 3],
                price: U32::new(unpx(m.price)),
                shares: U64::new(u64::from(size)),
                orders: U32::new(orders),
            };
            let len = put(out, lc.as_bytes());
            return Replayed::Message { locate, len };
        }
        if let Some(t) = rec.get::<TradeMsg>() {
            let locate = u16::try_from(t.hd.instrument_id).unwrap_or(0);
            let (side, source) = match t.side as u8 {
                b'A' => (b'B', b'E'),
                b'B' => (b'S', b'E'),
                _ => (b' ', b'Q'),
            };
            let m = normalized::Trade {
                header: self.header(normalized::KIND_TRADE, &t.hd, ts_recv),
                side,
                source,
                reserved: [0; 2],
                price: U32::new(unpx(t.price)),
                shares: U64::new(u64::from(t.size)),
                match_number: U64::new(u64::from(t.sequence)),
            };
            let len = put(out, m.as_bytes());
            return Replayed::Message { locate, len };
        }
        if let Some(s) = rec.get::<StatusMsg>() {
            let locate = u16::try_from(s.hd.instrument_id).unwrap_or(0);
            let state = match s.action {
                a if a == StatusAction::Halt as u16 => b'H',
                a if a == StatusAction::Pause as u16 => b'P',
                a if a == StatusAction::Quoting as u16 => b'Q',
                a if a == StatusAction::Trading as u16 => b'T',
                _ => return Replayed::Unsupported,
            };
            let m = normalized::TradingStatus {
                header: self.header(normalized::KIND_STATUS, &s.hd, ts_recv),
                state,
                reserved: [0; 3],
                reason: reason_code(s.reason),
            };
            let len = put(out, m.as_bytes());
            return Replayed::Message { locate, len };
        }
        if let Some(e) = rec.get::<ErrorMsg>() {
            let Some((from, to)) = e.err().ok().and_then(parse_loss) else {
                return Replayed::Unsupported;
            };
            let mut m = FeedLoss::new(from, to, 0);
            m.header = self.header(normalized::KIND_FEED_LOSS, &e.hd, ts_recv);
            m.header.stock_locate = U16::new(0);
            m.header.stock = [b' '; 8];
            let len = put(out, m.as_bytes());
            return Replayed::Broadcast { len };
        }
        Replayed::Unsupported
    }
}

/// The lost range of a loss record's text (feed or bus loss), if it is one.
fn parse_loss(text: &str) -> Option<(u64, u64)> {
    let range = if let Some(rest) = text.strip_prefix(FEED_LOSS_PREFIX) {
        rest
    } else {
        let rest = text.strip_prefix(BUS_LOSS_PREFIX)?;
        rest.split_once(" sequences ")?.1
    };
    let range = range.split(' ').next()?;
    let (from, to) = range.split_once("..")?;
    Some((from.parse().ok()?, to.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eastern_midnight_is_found_from_any_time_of_the_day() {
        // 2026-03-10 (daylight time, UTC-4): midnight is 04:00 UTC.
        let m = 1_773_115_200_000_000_000;
        assert_eq!(eastern_midnight_of(m), m);
        assert_eq!(eastern_midnight_of(m + DAY_NS - 1), m);
        assert_eq!(eastern_midnight_of(m - 1), m - DAY_NS);
        // 2026-01-15, standard time (UTC-5).
        let d = Date::new(2026, 1, 15).unwrap();
        let m = d.eastern_midnight_unix_ns();
        assert_eq!(eastern_midnight_of(m + 23 * 3_600_000_000_000), m);
        assert_eq!(
            Date::from_days_since_epoch(0),
            Date::new(1970, 1, 1).unwrap()
        );
        assert_eq!(
            Date::from_days_since_epoch(20_522),
            Date::new(2026, 3, 10).unwrap()
        );
        // Clamped to the years a Date may fall in.
        assert_eq!(
            Date::from_days_since_epoch(-5),
            Date::new(1970, 1, 1).unwrap()
        );
    }

    #[test]
    fn loss_texts_parse() {
        assert_eq!(
            parse_loss("rocebus feed loss: exchange sequences 7..10 lost; every symbol suspect"),
            Some((7, 10))
        );
        assert_eq!(
            parse_loss("rocebus bus loss: channel 3 sequences 100..164 lost; x"),
            Some((100, 164))
        );
        assert_eq!(parse_loss("something else"), None);
        assert_eq!(
            parse_loss("rocebus feed loss: exchange sequences 7..x"),
            None
        );
    }

    #[test]
    fn reason_codes_invert() {
        for code in [*b"T1  ", *b"LUDP", *b"MWC0", *b"    ", *b"ZZZZ"] {
            let r = status_reason(&code) as u16;
            assert_eq!(status_reason(&reason_code(r)) as u16, r);
        }
    }
}
