//! `feed-handler export`: a capture as Databento Binary Encoding (DBN, version 3) through the
//! `dbn` crate, in the shape of Databento's own `XNAS.ITCH` data so their tools read it.
//!
//! Owns the mapping from ITCH 5.0 messages to DBN records; reads captures, writes bytes, opens
//! no socket. Conventions (also in the README):
//! - Dataset `XNAS.ITCH`, publisher 2 (`XNAS.ITCH` on `XNAS`); `instrument_id` is the ITCH
//!   stock locate (Databento assigns its own ids; ours are valid for the capture's day only).
//!   Metadata: `stype_in` raw symbol, `stype_out` instrument id, `symbols` every symbol of the
//!   stock directory, one mapping interval per symbol for the day, `start`/`end` the first
//!   message's time and one past the last's. The stream starts with one `SymbolMappingMsg`
//!   per symbol, at the time of its stock directory message.
//! - Times: ITCH timestamps are nanoseconds since midnight, US Eastern time; DBN's are UNIX
//!   nanoseconds, so the exporter needs the trading date (`--date`) and applies the US
//!   daylight-saving rule. A capture file holds no receive time: `ts_recv` is `ts_event`,
//!   `ts_in_delta` 0, and every record that has flags carries `F_BAD_TS_RECV`.
//!   `sequence` is the message's position in the capture, from 1.
//! - Prices: ITCH's 4 implied decimals become DBN's fixed point of 1e-9 (times 100,000).
//! - `mbo`: add (A/F) is `A`; an execution (E, or C when printable) is `T` (side of the
//!   aggressor, the opposite of the resting order's; order id 0) then `F` (the resting order,
//!   its side, the executed shares) then `C` (the executed shares leave the book: `T` and `F`
//!   do not change a book in DBN); a non-printable C omits the `T`; cancel (X) is `C` with
//!   the cancelled shares; delete (D) is `C` with the shares left; replace (U) is `C` of the
//!   old order then `A` of the new one; a non-cross trade (P) is `T` with side `N`. The last
//!   record of each ITCH message carries `F_LAST`. Each symbol starts with a clear-book
//!   record (`R`) at its stock directory message.
//! - `mbp-1` / `mbp-10`: one record per book change within the top 1 / 10 levels of a side
//!   (action `A` add, `C` cancel, delete or execution, `M` a replace at the same price;
//!   price and size of the order change; `depth` the level's index), and one `T` per trade;
//!   `levels` is the book after the message.
//! - `trades`: executions (E; C when printable) and non-cross trades (P). Crosses (Q) are not
//!   exported (the issue's scope; they are in `feed-handler decode`).
//! - `status`: stock trading actions (H) and NASDAQ operational halts (h, market Q), with
//!   `is_trading`/`is_quoting`, and Reg SHO (Y) state in `is_short_sell_restricted`.
//! - `definition`: one `InstrumentDefMsg` per stock directory message (R): raw symbol,
//!   instrument class `K` (stock), exchange `XNAS`, currency `USD`, round lot size.

use crate::binaryfile::StreamReader;
use crate::book::{Book, Event, Level, Side};
use crate::itch::{Message, Stock};
use dbn::encode::{DbnEncodable, DbnEncoder, DynWriter, EncodeRecord};
use dbn::enums::{Compression, SType, Schema, StatusAction, StatusReason};
use dbn::{
    flags, rtype, BidAskPair, FlagSet, InstrumentDefMsg, MappingInterval, MboMsg, Mbp10Msg,
    Mbp1Msg, Metadata, RecordHeader, StatusMsg, SymbolMapping, SymbolMappingMsg, TradeMsg,
};
use rustc_hash::FxHashMap;
use std::io::{self, Read, Write};
use std::num::NonZeroU64;
use std::ops::ControlFlow;

/// The DBN dataset we write.
pub const DATASET: &str = "XNAS.ITCH";
/// Databento's publisher id for `XNAS.ITCH` (Nasdaq TotalView-ITCH on Nasdaq).
pub const PUBLISHER_ID: u16 = 2;
/// ITCH price units (1e-4) to DBN's (1e-9).
pub const PRICE_SCALE: i64 = 100_000;

/// What `feed-handler export` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportSchema {
    /// Market by order.
    Mbo,
    /// Top of book, one level.
    #[value(name = "mbp-1")]
    Mbp1,
    /// Ten levels.
    #[value(name = "mbp-10")]
    Mbp10,
    /// Trades.
    Trades,
    /// Trading status.
    Status,
    /// Instrument definitions.
    Definition,
}

impl ExportSchema {
    fn dbn(self) -> Schema {
        match self {
            Self::Mbo => Schema::Mbo,
            Self::Mbp1 => Schema::Mbp1,
            Self::Mbp10 => Schema::Mbp10,
            Self::Trades => Schema::Trades,
            Self::Status => Schema::Status,
            Self::Definition => Schema::Definition,
        }
    }
}

/// A calendar date (the capture's trading day), 1970 to 2200. The calendar is the `time`
/// crate's (already the workspace's); this adds ITCH's time zero, midnight US Eastern.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Date(time::Date);

/// The years a [`Date`] may fall in.
const YEARS: std::ops::RangeInclusive<i32> = 1970..=2200;

/// Julian day number of 1970-01-01.
const UNIX_EPOCH_JULIAN_DAY: i64 = time::OffsetDateTime::UNIX_EPOCH.to_julian_day() as i64;

impl Date {
    /// The date `year`-`month`-`day`, if it exists and falls in 1970-2200.
    pub fn new(year: i32, month: u8, day: u8) -> Result<Self, String> {
        let month_ =
            time::Month::try_from(month).map_err(|_| format!("month {month} is not 1-12"))?;
        let d = time::Date::from_calendar_date(year, month_, day)
            .map_err(|_| format!("{year}-{month:02}-{day:02} is not a date"))?;
        if !YEARS.contains(&year) {
            return Err(format!("{year}: year out of range (1970-2200)"));
        }
        Ok(Self(d))
    }

    /// Parses `YYYY-MM-DD`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a date of the form YYYY-MM-DD");
        let mut it = s.split('-');
        let (Some(y), Some(m), Some(d), None) = (it.next(), it.next(), it.next(), it.next()) else {
            return Err(bad());
        };
        let (y, m, d) = (
            y.parse().map_err(|_| bad())?,
            m.parse().map_err(|_| bad())?,
            d.parse().map_err(|_| bad())?,
        );
        Self::new(y, m, d)
            .map_err(|_| format!("`{s}` is no date from 1970-01-01 to 2200-12-31 (YYYY-MM-DD)"))
    }

    /// The date `days` days after 1970-01-01, clamped to 1970-2200.
    pub fn from_days_since_epoch(days: i64) -> Self {
        let lo = time::Date::from_calendar_date(*YEARS.start(), time::Month::January, 1);
        let hi = time::Date::from_calendar_date(*YEARS.end(), time::Month::December, 31);
        let (lo, hi) = (lo.expect("a real date"), hi.expect("a real date"));
        let jd = (days + UNIX_EPOCH_JULIAN_DAY)
            .clamp(i64::from(lo.to_julian_day()), i64::from(hi.to_julian_day()));
        // In range by the clamp: from_julian_day cannot fail.
        Self(time::Date::from_julian_day(jd as i32).unwrap_or(lo))
    }

    /// Year.
    pub fn year(self) -> i32 {
        self.0.year()
    }

    /// Month, 1-12.
    pub fn month(self) -> u8 {
        self.0.month().into()
    }

    /// Day of the month, 1-31.
    pub fn day(self) -> u8 {
        self.0.day()
    }

    /// UTC offset of US Eastern time (`America/New_York`) at midnight starting this date, in
    /// hours (-4 or -5), from the IANA time-zone database jiff carries (so every year's rule:
    /// daylight time from the second Sunday of March to the first of November since 2007,
    /// the first Sunday of April to the last of October before; midnight of a switching
    /// Sunday is still the time before the switch, which happens at 2:00).
    pub fn eastern_offset_hours(self) -> i64 {
        i64::from(self.eastern_midnight().offset().seconds()) / 3600
    }

    /// UNIX nanoseconds of midnight US Eastern time on this date: ITCH's time zero.
    pub fn eastern_midnight_unix_ns(self) -> u64 {
        u64::try_from(self.eastern_midnight().timestamp().as_nanosecond()).unwrap_or(0)
    }

    /// Midnight starting this date in `America/New_York`.
    fn eastern_midnight(self) -> jiff::Zoned {
        let civil =
            jiff::civil::Date::new(self.0.year() as i16, self.month() as i8, self.day() as i8)
                .expect("1970-2200 dates exist in jiff's calendar");
        // Midnight is never skipped nor repeated in New York (the switches are at 2:00).
        civil
            .to_zoned(us_eastern().clone())
            .expect("a 1970-2200 midnight is in jiff's range")
    }
}

/// `America/New_York` from the time-zone database compiled into the binary (jiff's
/// `tzdb-bundle-always`): no system tzdata needed.
pub fn us_eastern() -> &'static jiff::tz::TimeZone {
    static TZ: std::sync::OnceLock<jiff::tz::TimeZone> = std::sync::OnceLock::new();
    TZ.get_or_init(|| {
        jiff::tz::db()
            .get("America/New_York")
            .expect("the bundled time-zone database has America/New_York")
    })
}

/// How to export.
#[derive(Debug, Clone, Copy)]
pub struct ExportOptions {
    /// Record schema.
    pub schema: ExportSchema,
    /// Trading date of the capture.
    pub date: Date,
    /// Zstandard compression (`.dbn.zst`).
    pub zstd: bool,
}

/// Totals of one export.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExportTotals {
    /// ITCH messages read.
    pub messages: u64,
    /// Symbols in the stock directory (symbol mapping records written).
    pub symbols: u64,
    /// Records written, symbol mappings included.
    pub records: u64,
    /// E/C/X/D/U naming an order that is not live (skipped).
    pub unknown_orders: u64,
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The capture has no message.
    #[error("no ITCH message in the capture")]
    Empty,
    /// The DBN encoder refused or could not write.
    #[error("DBN encoding failed")]
    Dbn(#[source] dbn::Error),
    /// The capture could not be read (or is no BinaryFILE: the source is then a
    /// [`crate::binaryfile::DetectError`]).
    #[error("cannot read the capture")]
    Read(#[source] io::Error),
}

impl From<dbn::Error> for ExportError {
    fn from(e: dbn::Error) -> Self {
        Self::Dbn(e)
    }
}

#[derive(Debug, Clone, Copy)]
struct Order {
    locate: u16,
    side: Side,
    price: u32,
    shares: u32,
}

fn px(p: u32) -> i64 {
    i64::from(p) * PRICE_SCALE
}

fn dbn_side(s: Side) -> i8 {
    (match s {
        Side::Bid => b'B',
        Side::Ask => b'A',
    }) as i8
}

fn opposite(s: Side) -> Side {
    match s {
        Side::Bid => Side::Ask,
        Side::Ask => Side::Bid,
    }
}

fn symbol_str(s: &Stock) -> String {
    s.as_str().unwrap_or("").to_owned()
}

fn c_chars<const N: usize>(s: &str) -> [i8; N] {
    let mut out = [0i8; N];
    for (o, b) in out.iter_mut().zip(s.bytes().take(N - 1)) {
        *o = b as i8;
    }
    out
}

/// One record being built from an ITCH message, before `F_LAST` is known.
#[derive(Debug, Clone, Copy)]
struct Change {
    action: u8,
    side: u8,
    price: i64,
    size: u32,
    order_id: u64,
    locate: u16,
}

/// Exports the capture in `data` to `out` (a file of DBN, zstd-compressed when asked).
pub fn export(
    data: &[u8],
    opts: &ExportOptions,
    out: impl Write,
) -> Result<ExportTotals, ExportError> {
    export_stream(data, data, opts, out)
}

/// [`export`] of a capture read as a stream twice, `first` and `second` each reading it
/// from the start (e.g. two [`crate::capture::open`]s of the file): the DBN metadata, written
/// first, holds the stock directory and time span of the whole day. Memory is the export's
/// state and a chunk of the stream, whatever the capture's size.
pub fn export_stream(
    first: impl Read,
    second: impl Read,
    opts: &ExportOptions,
    out: impl Write,
) -> Result<ExportTotals, ExportError> {
    let midnight = opts.date.eastern_midnight_unix_ns();
    // First pass: the directory and the time span, which the metadata holds up front.
    let mut directory: Vec<(u16, Stock, u64)> = Vec::new();
    let (mut first_ts, mut last) = (None, 0u64);
    StreamReader::new(first)
        .for_each(|m| {
            let Ok(m) = m else { return };
            let t = m.header().timestamp.nanos();
            first_ts.get_or_insert(t);
            last = last.max(t);
            if let Message::StockDirectory(d) = m {
                let locate = d.header.stock_locate.get();
                if !directory.iter().any(|&(l, _, _)| l == locate) {
                    directory.push((locate, d.stock, t));
                }
            }
        })
        .map_err(ExportError::Read)?;
    let first = first_ts;
    let Some(first) = first else {
        return Err(ExportError::Empty);
    };
    let date = opts.date.0;
    let next_day = date.next_day().unwrap_or(date);
    let metadata = Metadata::builder()
        .dataset(DATASET)
        .schema(Some(opts.schema.dbn()))
        .start(midnight + first)
        .end(NonZeroU64::new(midnight + last + 1))
        .stype_in(Some(SType::RawSymbol))
        .stype_out(SType::InstrumentId)
        .symbols(directory.iter().map(|(_, s, _)| symbol_str(s)).collect())
        .mappings(
            directory
                .iter()
                .map(|(l, s, _)| SymbolMapping {
                    raw_symbol: symbol_str(s),
                    intervals: vec![MappingInterval {
                        start_date: date,
                        end_date: next_day,
                        symbol: l.to_string(),
                    }],
                })
                .collect(),
        )
        .build();
    let compression = if opts.zstd {
        Compression::Zstd
    } else {
        Compression::None
    };
    let writer = DynWriter::new(out, compression)?;
    let mut enc = DbnEncoder::new(writer, &metadata)?;
    let mut totals = ExportTotals::default();
    let start_of_day = midnight + first;
    for (locate, stock, t) in &directory {
        let rec = SymbolMappingMsg::new(
            u32::from(*locate),
            midnight + t,
            SType::RawSymbol,
            &symbol_str(stock),
            SType::InstrumentId,
            &locate.to_string(),
            start_of_day,
            midnight + last + 1,
        )?;
        enc.encode_record(&rec)?;
        totals.symbols += 1;
        totals.records += 1;
    }
    let mut state = Exporter {
        opts: *opts,
        midnight,
        orders: FxHashMap::default(),
        book: Book::new(),
        reg_sho: FxHashMap::default(),
        op_halt: FxHashMap::default(),
        states: FxHashMap::default(),
        changes: Vec::with_capacity(4),
        levels: Vec::with_capacity(4),
        sequence: 0,
        totals,
    };
    let mut failed = Ok(());
    StreamReader::new(second)
        .try_for_each(|m| {
            let Ok(m) = m else {
                return ControlFlow::Continue(());
            };
            state.totals.messages += 1;
            state.sequence = state.sequence.wrapping_add(1);
            failed = state.message(&m, &mut enc);
            if failed.is_ok() {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
        .map_err(ExportError::Read)?;
    failed?;
    enc.get_mut().finish()?;
    Ok(state.totals)
}

struct Exporter {
    opts: ExportOptions,
    midnight: u64,
    orders: FxHashMap<u64, Order>,
    book: Book,
    reg_sho: FxHashMap<u16, u8>,
    op_halt: FxHashMap<u16, bool>,
    /// Last trading action state per locate.
    states: FxHashMap<u16, u8>,
    changes: Vec<Change>,
    /// Level events of the message being applied: (side, price).
    levels: Vec<(Side, u32)>,
    sequence: u32,
    totals: ExportTotals,
}

impl Exporter {
    fn hd<R: dbn::HasRType>(&self, rtype: u8, locate: u16, ts: u64) -> RecordHeader {
        RecordHeader::new::<R>(rtype, PUBLISHER_ID, u32::from(locate), self.midnight + ts)
    }

    fn put<R: DbnEncodable>(
        &mut self,
        enc: &mut impl EncodeRecord,
        rec: &R,
    ) -> Result<(), ExportError> {
        enc.encode_record(rec)?;
        self.totals.records += 1;
        Ok(())
    }

    /// The order changes of one ITCH message, applied to `orders`.
    fn order_changes(&mut self, m: &Message<'_>) {
        self.changes.clear();
        let locate = m.header().stock_locate.get();
        let add = |orders: &mut FxHashMap<u64, Order>,
                   changes: &mut Vec<Change>,
                   id: u64,
                   side: Option<Side>,
                   shares: u32,
                   price: u32| {
            let Some(side) = side else { return };
            if shares == 0 {
                return;
            }
            orders.insert(
                id,
                Order {
                    locate,
                    side,
                    price,
                    shares,
                },
            );
            changes.push(Change {
                action: b'A',
                side: dbn_side(side) as u8,
                price: px(price),
                size: shares,
                order_id: id,
                locate,
            });
        };
        match *m {
            Message::AddOrder(a) => add(
                &mut self.orders,
                &mut self.changes,
                a.order_reference_number.get(),
                Side::from_itch(a.buy_sell_indicator),
                a.shares.get(),
                a.price.get(),
            ),
            Message::AddOrderMpid(a) => add(
                &mut self.orders,
                &mut self.changes,
                a.order_reference_number.get(),
                Side::from_itch(a.buy_sell_indicator),
                a.shares.get(),
                a.price.get(),
            ),
            Message::OrderExecuted(e) => self.execute(
                e.order_reference_number.get(),
                e.executed_shares.get(),
                None,
                true,
            ),
            Message::OrderExecutedWithPrice(e) => self.execute(
                e.order_reference_number.get(),
                e.executed_shares.get(),
                Some(e.execution_price.get()),
                e.printable == b'Y',
            ),
            Message::OrderCancel(x) => self.reduce(
                x.order_reference_number.get(),
                Some(x.cancelled_shares.get()),
            ),
            Message::OrderDelete(d) => self.reduce(d.order_reference_number.get(), None),
            Message::OrderReplace(u) => {
                let old = u.original_order_reference_number.get();
                let side = self.orders.get(&old).map(|o| o.side);
                if side.is_none() {
                    self.totals.unknown_orders += 1;
                    return;
                }
                self.reduce(old, None);
                add(
                    &mut self.orders,
                    &mut self.changes,
                    u.new_order_reference_number.get(),
                    side,
                    u.shares.get(),
                    u.price.get(),
                );
            }
            Message::Trade(p) => self.changes.push(Change {
                action: b'T',
                side: b'N',
                price: px(p.price.get()),
                size: p.shares.get(),
                order_id: 0,
                locate,
            }),
            _ => {}
        }
    }

    fn execute(&mut self, id: u64, shares: u32, price: Option<u32>, printable: bool) {
        let Some(o) = self.orders.get(&id).copied() else {
            self.totals.unknown_orders += 1;
            return;
        };
        let shares = shares.min(o.shares);
        let price = px(price.unwrap_or(o.price));
        if printable {
            self.changes.push(Change {
                action: b'T',
                side: dbn_side(opposite(o.side)) as u8,
                price,
                size: shares,
                order_id: 0,
                locate: o.locate,
            });
        }
        self.changes.push(Change {
            action: b'F',
            side: dbn_side(o.side) as u8,
            price,
            size: shares,
            order_id: id,
            locate: o.locate,
        });
        self.reduce(id, Some(shares));
    }

    /// Cancels `shares` of an order (all of it with `None`).
    fn reduce(&mut self, id: u64, shares: Option<u32>) {
        let Some(o) = self.orders.get_mut(&id) else {
            self.totals.unknown_orders += 1;
            return;
        };
        let gone = shares.unwrap_or(o.shares).min(o.shares);
        o.shares -= gone;
        let o = *o;
        if o.shares == 0 {
            self.orders.remove(&id);
        }
        self.changes.push(Change {
            action: b'C',
            side: dbn_side(o.side) as u8,
            price: px(o.price),
            size: gone,
            order_id: id,
            locate: o.locate,
        });
    }

    fn flags(last: bool) -> FlagSet {
        let mut f = flags::BAD_TS_RECV;
        if last {
            f |= flags::LAST;
        }
        FlagSet::new(f)
    }

    fn message(&mut self, m: &Message<'_>, enc: &mut impl EncodeRecord) -> Result<(), ExportError> {
        let ts = m.header().timestamp.nanos();
        let locate = m.header().stock_locate.get();
        match self.opts.schema {
            ExportSchema::Mbo => {
                if let Message::StockDirectory(_) = m {
                    let rec = MboMsg {
                        hd: self.hd::<MboMsg>(rtype::MBO, locate, ts),
                        order_id: 0,
                        price: dbn::UNDEF_PRICE,
                        size: 0,
                        flags: Self::flags(true),
                        channel_id: 0,
                        action: b'R' as i8,
                        side: b'N' as i8,
                        ts_recv: self.midnight + ts,
                        ts_in_delta: 0,
                        sequence: self.sequence,
                    };
                    return self.put(enc, &rec);
                }
                self.order_changes(m);
                let n = self.changes.len();
                for i in 0..n {
                    let c = self.changes[i];
                    let rec = MboMsg {
                        hd: self.hd::<MboMsg>(rtype::MBO, c.locate, ts),
                        order_id: c.order_id,
                        price: c.price,
                        size: c.size,
                        flags: Self::flags(i + 1 == n),
                        channel_id: 0,
                        action: c.action as i8,
                        side: c.side as i8,
                        ts_recv: self.midnight + ts,
                        ts_in_delta: 0,
                        sequence: self.sequence,
                    };
                    self.put(enc, &rec)?;
                }
            }
            ExportSchema::Trades => {
                self.order_changes(m);
                let trades: Vec<Change> = self
                    .changes
                    .iter()
                    .filter(|c| c.action == b'T')
                    .copied()
                    .collect();
                for c in trades {
                    let rec = TradeMsg {
                        hd: self.hd::<TradeMsg>(rtype::MBP_0, c.locate, ts),
                        price: c.price,
                        size: c.size,
                        action: b'T' as i8,
                        side: c.side as i8,
                        flags: Self::flags(true),
                        depth: 0,
                        ts_recv: self.midnight + ts,
                        ts_in_delta: 0,
                        sequence: self.sequence,
                    };
                    self.put(enc, &rec)?;
                }
            }
            ExportSchema::Mbp1 | ExportSchema::Mbp10 => self.mbp(m, ts, enc)?,
            ExportSchema::Status => self.status(m, ts, locate, enc)?,
            ExportSchema::Definition => {
                if let Message::StockDirectory(d) = m {
                    let mut rec = InstrumentDefMsg {
                        hd: self.hd::<InstrumentDefMsg>(rtype::INSTRUMENT_DEF, locate, ts),
                        ts_recv: self.midnight + ts,
                        display_factor: dbn::FIXED_PRICE_SCALE,
                        min_lot_size_round_lot: i32::try_from(d.round_lot_size.get())
                            .unwrap_or(i32::MAX),
                        raw_symbol: c_chars(&symbol_str(&d.stock)),
                        asset: c_chars(&symbol_str(&d.stock)),
                        exchange: c_chars("XNAS"),
                        currency: c_chars("USD"),
                        instrument_class: b'K' as i8,
                        security_update_action: b'A' as i8,
                        ..Default::default()
                    };
                    rec.raw_instrument_id = u64::from(locate);
                    self.put(enc, &rec)?;
                }
            }
        }
        Ok(())
    }

    fn mbp(
        &mut self,
        m: &Message<'_>,
        ts: u64,
        enc: &mut impl EncodeRecord,
    ) -> Result<(), ExportError> {
        let top = if self.opts.schema == ExportSchema::Mbp1 {
            1
        } else {
            10
        };
        self.order_changes(m);
        self.levels.clear();
        let levels = &mut self.levels;
        self.book.apply(m, &mut |e: &Event| {
            if let Event::Level { side, level, .. } = *e {
                levels.push((side, level.price));
            }
        });
        // One record per changed level in the top (in the order of the order changes), one
        // per trade.
        let mut out: Vec<(Change, u8)> = Vec::with_capacity(self.changes.len());
        let replace_same_price = matches!(m, Message::OrderReplace(_))
            && self.changes.len() == 2
            && self.changes[0].price == self.changes[1].price;
        for (i, c) in self.changes.iter().enumerate() {
            match c.action {
                b'T' => out.push((*c, 0)),
                b'F' => {}
                _ => {
                    if replace_same_price && i == 0 {
                        continue;
                    }
                    let side = if c.side == b'B' { Side::Bid } else { Side::Ask };
                    let price = u32::try_from(c.price / PRICE_SCALE).unwrap_or(0);
                    if !self.levels.contains(&(side, price)) {
                        continue;
                    }
                    let Some(book) = self.book.symbol(c.locate) else {
                        continue;
                    };
                    let better = book
                        .depth(side)
                        .take_while(|l| match side {
                            Side::Bid => l.price > price,
                            Side::Ask => l.price < price,
                        })
                        .count();
                    if better < top {
                        let mut c = *c;
                        if replace_same_price {
                            c.action = b'M';
                        }
                        out.push((c, better as u8));
                    }
                }
            }
        }
        let n = out.len();
        for (i, (c, depth)) in out.into_iter().enumerate() {
            let book = self.book.symbol(c.locate);
            let pair = |k: usize| {
                let level = |s: Side| book.and_then(|b| b.depth(s).nth(k).copied());
                to_pair(level(Side::Bid), level(Side::Ask))
            };
            let (action, side) = (c.action as i8, c.side as i8);
            let flags = Self::flags(i + 1 == n);
            let ts_recv = self.midnight + ts;
            if top == 1 {
                let rec = Mbp1Msg {
                    hd: self.hd::<Mbp1Msg>(rtype::MBP_1, c.locate, ts),
                    price: c.price,
                    size: c.size,
                    action,
                    side,
                    flags,
                    depth,
                    ts_recv,
                    ts_in_delta: 0,
                    sequence: self.sequence,
                    levels: [pair(0)],
                };
                self.put(enc, &rec)?;
            } else {
                let rec = Mbp10Msg {
                    hd: self.hd::<Mbp10Msg>(rtype::MBP_10, c.locate, ts),
                    price: c.price,
                    size: c.size,
                    action,
                    side,
                    flags,
                    depth,
                    ts_recv,
                    ts_in_delta: 0,
                    sequence: self.sequence,
                    levels: std::array::from_fn(pair),
                };
                self.put(enc, &rec)?;
            }
        }
        Ok(())
    }

    fn status(
        &mut self,
        m: &Message<'_>,
        ts: u64,
        locate: u16,
        enc: &mut impl EncodeRecord,
    ) -> Result<(), ExportError> {
        let (state, reason) = match *m {
            Message::StockTradingAction(h) => {
                self.states.insert(locate, h.trading_state);
                if self.op_halt.get(&locate).copied().unwrap_or(false) {
                    (b'H', StatusReason::Operational)
                } else {
                    (h.trading_state, status_reason(&h.reason))
                }
            }
            Message::OperationalHalt(h) if h.market_code == b'Q' => {
                let halted = h.operational_halt_action == b'H';
                self.op_halt.insert(locate, halted);
                if halted {
                    (b'H', StatusReason::Operational)
                } else {
                    (
                        self.states.get(&locate).copied().unwrap_or(b'T'),
                        StatusReason::None,
                    )
                }
            }
            Message::RegShoRestriction(y) => {
                self.reg_sho.insert(locate, y.reg_sho_action);
                return Ok(());
            }
            _ => return Ok(()),
        };
        let action = match state {
            b'H' => StatusAction::Halt,
            b'P' => StatusAction::Pause,
            b'Q' => StatusAction::Quoting,
            b'T' => StatusAction::Trading,
            _ => StatusAction::None,
        };
        let yn = |b: bool| (if b { b'Y' } else { b'N' }) as i8;
        let ssr = match self.reg_sho.get(&locate) {
            Some(b'0') => b'N' as i8,
            Some(_) => b'Y' as i8,
            None => b'~' as i8,
        };
        let rec = StatusMsg {
            hd: self.hd::<StatusMsg>(rtype::STATUS, locate, ts),
            ts_recv: self.midnight + ts,
            action: action as u16,
            reason: reason as u16,
            trading_event: 0,
            is_trading: yn(state == b'T'),
            is_quoting: yn(state == b'T' || state == b'Q'),
            is_short_sell_restricted: ssr,
            _reserved: [0; 7],
        };
        self.put(enc, &rec)
    }
}

fn to_pair(bid: Option<Level>, ask: Option<Level>) -> BidAskPair {
    let mut p = BidAskPair::default();
    if let Some(b) = bid {
        p.bid_px = px(b.price);
        p.bid_sz = u32::try_from(b.shares).unwrap_or(u32::MAX);
        p.bid_ct = b.orders;
    }
    if let Some(a) = ask {
        p.ask_px = px(a.price);
        p.ask_sz = u32::try_from(a.shares).unwrap_or(u32::MAX);
        p.ask_ct = a.orders;
    }
    p
}

/// NASDAQ's trading action reason codes in DBN's terms.
pub(crate) fn status_reason(code: &[u8; 4]) -> StatusReason {
    match code {
        b"T1  " => StatusReason::NewsPending,
        b"T2  " => StatusReason::NewsReleased,
        b"T3  " => StatusReason::NewsAndResumptionTimes,
        b"T5  " | b"LUDP" => StatusReason::LuldPause,
        b"T6  " | b"H11 " => StatusReason::Regulatory,
        b"T8  " => StatusReason::Etf,
        b"T12 " => StatusReason::AdditionalInformationRequested,
        b"H4  " => StatusReason::NonCompliance,
        b"H9  " => StatusReason::FilingsNotCurrent,
        b"H10 " => StatusReason::SecTradingSuspension,
        b"O1  " => StatusReason::Operational,
        b"IPO1" | b"IPOQ" | b"IPOE" => StatusReason::NewIssue,
        b"MWC1" => StatusReason::MarketWideHaltLevel1,
        b"MWC2" => StatusReason::MarketWideHaltLevel2,
        b"MWC0" | b"MWCQ" => StatusReason::MarketEvent,
        _ => StatusReason::None,
    }
}

#[cfg(test)]
mod tests;
