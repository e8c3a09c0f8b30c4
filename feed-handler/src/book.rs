//! Full-depth order books for every symbol of an ITCH feed, with L2 levels and BBO.
//!
//! Owns book state and the [`Event`]s derived from it; knows nothing of sockets or of how
//! events are published ([`crate::publish`] does that).
//!
//! Structure: orders by reference in `orders::Orders` (a paged direct index: ITCH
//! references are handed out in increasing order and unique per day, so an order is found by
//! indexing, not hashing, for E/C/X/D/U), and per symbol and side a `Vec` of price levels
//! sorted so that the best level is the **last** element. Most activity is at or near the
//! top of the book, where a sorted vector inserts and removes with a short `memmove` and
//! finds a level by a search galloping from the best end in contiguous memory (the lines
//! near the top are the hot ones); a `BTreeMap` would chase pointers for the same work. Symbols are a `Vec` indexed by stock locate (a dense u16 per day), so no
//! hashing per message for the symbol. Whether a message changed the top of book is read
//! from the position of the level it touched, not by comparing the top before and after.
//!
//! Steady-state updates rarely allocate (the level vectors grow to the day's peak and stay
//! there; order pages are recycled through a few spares). Inconsistent input (unknown order, over-execution) is counted, never a panic.

use crate::itch::{Message, Stock};
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

pub use rocebus_md::{Level, Side};

/// One side's levels, best last.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Levels {
    /// Sorted ascending by `key`, so the best level is last.
    levels: Vec<Level>,
}

impl Levels {
    /// Sort key: bids best = highest price, asks best = lowest price; both ascend to the best.
    fn key(side: Side, price: u32) -> u32 {
        match side {
            Side::Bid => price,
            Side::Ask => u32::MAX - price,
        }
    }

    /// Like `binary_search`, but galloping from the best end first: most activity is at or
    /// near the top of the book, where this touches one or two cache lines that are hot,
    /// while a plain binary search starts at the middle of the side, usually cold.
    fn find(&self, side: Side, price: u32) -> Result<usize, usize> {
        let k = Self::key(side, price);
        let key = |l: &Level| Self::key(side, l.price);
        // Every level at or after `hi` has a key above `k`.
        let (mut lo, mut hi, mut step) = (0, self.levels.len(), 1);
        while hi > 0 {
            let probe = hi.saturating_sub(step);
            if key(&self.levels[probe]) <= k {
                lo = probe;
                break;
            }
            hi = probe;
            step *= 2;
        }
        match self.levels[lo..hi].binary_search_by_key(&k, key) {
            Ok(i) => Ok(lo + i),
            Err(i) => Err(lo + i),
        }
    }

    /// Adds one order's shares; returns the level after the change and whether it is the
    /// best level (the top of the book changed, since an order has at least one share).
    fn add(&mut self, side: Side, price: u32, shares: u32) -> (Level, bool) {
        match self.find(side, price) {
            Ok(i) => {
                let top = i + 1 == self.levels.len();
                let l = &mut self.levels[i];
                l.shares += u64::from(shares);
                l.orders += 1;
                (*l, top)
            }
            Err(i) => {
                let l = Level {
                    price,
                    shares: u64::from(shares),
                    orders: 1,
                };
                self.levels.insert(i, l);
                (l, i + 1 == self.levels.len())
            }
        }
    }

    /// Removes shares (and the order if `order_gone`); returns the level after the change
    /// (shares 0 when the level disappeared) and whether it was the best level, or `None`
    /// when there is no such level.
    fn remove(
        &mut self,
        side: Side,
        price: u32,
        shares: u32,
        order_gone: bool,
    ) -> Option<(Level, bool)> {
        let i = self.find(side, price).ok()?;
        let top = i + 1 == self.levels.len();
        let l = &mut self.levels[i];
        l.shares = l.shares.saturating_sub(u64::from(shares));
        if order_gone {
            l.orders = l.orders.saturating_sub(1);
        }
        let after = *l;
        if after.orders == 0 {
            self.levels.remove(i);
            let gone = Level {
                price,
                shares: 0,
                orders: 0,
            };
            return Some((gone, top));
        }
        Some((after, top))
    }

    fn best(&self) -> Option<Level> {
        self.levels.last().copied()
    }
}

/// The book of one symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolBook {
    /// Symbol.
    pub stock: Stock,
    /// Last trading state from 'H' ('H', 'P', 'Q', 'T'), or b' ' before any.
    pub trading_state: u8,
    /// Reason code of the last trading action.
    pub reason: [u8; 4],
    /// A NASDAQ operational halt ('h' with market code 'Q') is in effect.
    pub operational_halt: bool,
    bids: Levels,
    asks: Levels,
}

impl SymbolBook {
    fn new(stock: Stock) -> Self {
        Self {
            stock,
            trading_state: b' ',
            reason: [b' '; 4],
            operational_halt: false,
            bids: Levels::default(),
            asks: Levels::default(),
        }
    }

    /// The state trading actually is in: b'H' while an operational halt is in effect,
    /// otherwise the last trading action's state. This is what the normalized
    /// `TradingStatus` carries, so a consumer checking for b'H' sees both kinds of halt.
    pub fn state(&self) -> u8 {
        if self.operational_halt {
            b'H'
        } else {
            self.trading_state
        }
    }

    fn side_mut(&mut self, side: Side) -> &mut Levels {
        match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        }
    }

    /// Best bid and best offer.
    pub fn bbo(&self) -> (Option<Level>, Option<Level>) {
        (self.bids.best(), self.asks.best())
    }

    /// Levels of one side, best first.
    pub fn depth(&self, side: Side) -> impl Iterator<Item = &Level> + '_ {
        match side {
            Side::Bid => self.bids.levels.iter().rev(),
            Side::Ask => self.asks.levels.iter().rev(),
        }
    }
}

mod orders;

/// Asks the CPU to bring `value`'s cache line in for reading: a hint, no effect on state.
#[inline(always)]
fn prefetch_read<T>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `_mm_prefetch` is a hint: it reads nothing architecturally and never faults,
    // whatever the address (here a live reference anyway). SSE, which it needs, is part of
    // the x86_64 baseline.
    #[allow(unsafe_code)]
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(std::ptr::from_ref(value).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Order {
    locate: u16,
    side: Side,
    price: u32,
    shares: u32,
}

/// A change derived from the feed, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Best bid or offer changed (price, size or order count).
    Bbo {
        /// Stock locate.
        locate: u16,
        /// Symbol.
        stock: Stock,
        /// Nanoseconds since midnight.
        timestamp: u64,
        /// Best bid, if any.
        bid: Option<Level>,
        /// Best offer, if any.
        ask: Option<Level>,
    },
    /// A price level changed; `level.shares == 0` means it is gone.
    Level {
        /// Stock locate.
        locate: u16,
        /// Symbol.
        stock: Stock,
        /// Nanoseconds since midnight.
        timestamp: u64,
        /// Side.
        side: Side,
        /// The level after the change.
        level: Level,
    },
    /// An execution or off-book trade.
    Trade {
        /// Stock locate.
        locate: u16,
        /// Symbol.
        stock: Stock,
        /// Nanoseconds since midnight.
        timestamp: u64,
        /// Side of the resting order, if known.
        side: Option<Side>,
        /// Price, 4 implied decimals.
        price: u32,
        /// Shares.
        shares: u64,
        /// Exchange match number.
        match_number: u64,
        /// The ITCH message type it came from ('E', 'C', 'P' or 'Q').
        source: u8,
    },
    /// A trading action ('H').
    TradingStatus {
        /// Stock locate.
        locate: u16,
        /// Symbol.
        stock: Stock,
        /// Nanoseconds since midnight.
        timestamp: u64,
        /// 'H', 'P', 'Q' or 'T'.
        state: u8,
        /// Reason code.
        reason: [u8; 4],
    },
}

/// Receives book events. Implemented for closures.
pub trait EventSink {
    /// Called once per event, in feed order.
    fn on_event(&mut self, event: &Event);
}

impl<F: FnMut(&Event)> EventSink for F {
    fn on_event(&mut self, event: &Event) {
        self(event)
    }
}

/// Inconsistencies met while applying the feed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BookCounters {
    /// Messages applied (all types).
    pub messages: u64,
    /// E/C/X/D/U naming an order that is not in the book.
    pub unknown_orders: u64,
    /// A/F/U adding an order reference already in the book.
    pub duplicate_orders: u64,
    /// Executions or cancels of more shares than the order had (clamped).
    pub overfills: u64,
    /// Adds with a buy/sell indicator other than 'B' or 'S'.
    pub bad_sides: u64,
    /// A/F/U adding an order of zero shares (not booked: a level of no shares would read as
    /// a deleted level, and a snapshot holding one would not restore).
    pub zero_share_adds: u64,
    /// 'h' operational halts for BX or PSX (market code other than 'Q'): not this market's.
    pub other_market_halts: u64,
    /// 'h' with an action other than 'H' or 'T' (ignored).
    pub bad_halt_actions: u64,
}

/// All symbols' books. See the module docs.
#[derive(Debug, Clone, Default)]
pub struct Book {
    symbols: Vec<Option<SymbolBook>>,
    orders: orders::Orders,
    counters: BookCounters,
}

impl PartialEq for Book {
    /// Same symbols, states and resting orders (counters are not state).
    fn eq(&self, other: &Self) -> bool {
        let trim =
            |v: &[Option<SymbolBook>]| v.iter().rposition(Option::is_some).map_or(0, |i| i + 1);
        self.symbols[..trim(&self.symbols)] == other.symbols[..trim(&other.symbols)]
            && self.orders == other.orders
    }
}
impl Eq for Book {}

impl Book {
    /// An empty book.
    pub fn new() -> Self {
        Self::default()
    }

    /// Totals so far.
    pub fn counters(&self) -> &BookCounters {
        &self.counters
    }

    /// The book of `locate`, if that symbol was seen.
    pub fn symbol(&self, locate: u16) -> Option<&SymbolBook> {
        self.symbols
            .get(usize::from(locate))
            .and_then(Option::as_ref)
    }

    /// The first book whose symbol is `name`.
    pub fn symbol_by_name(&self, name: &str) -> Option<(u16, &SymbolBook)> {
        self.symbols().find(|(_, b)| b.stock.as_str() == Some(name))
    }

    /// All symbols seen, by locate.
    pub fn symbols(&self) -> impl Iterator<Item = (u16, &SymbolBook)> + '_ {
        self.symbols
            .iter()
            .enumerate()
            .filter_map(|(i, b)| Some((i as u16, b.as_ref()?)))
    }

    /// Resting orders.
    pub fn order_count(&self) -> usize {
        self.orders.len()
    }

    fn symbol_mut(&mut self, locate: u16, stock: Option<Stock>) -> &mut SymbolBook {
        let i = usize::from(locate);
        if self.symbols.len() <= i {
            self.symbols.resize_with(i + 1, || None);
        }
        let slot = &mut self.symbols[i];
        match (slot, stock) {
            (Some(b), Some(s)) => {
                b.stock = s;
                b
            }
            (Some(b), None) => b,
            (slot @ None, s) => slot.insert(SymbolBook::new(s.unwrap_or_default())),
        }
    }

    /// Starts loading what applying `message` will read first, the resting order it names
    /// (executions, cancels, deletes, replaces): a hint with no effect on the books. A pass
    /// that holds its next messages calls it some messages before [`apply`](Self::apply),
    /// so the miss on an order added long ago overlaps the work in between. (Fetching the
    /// order's levels too, half-way, was slower: `books` CPU 0.74-0.93 s against 0.69-0.78.)
    #[inline]
    pub fn prefetch(&self, message: &Message<'_>) {
        let reference = match *message {
            Message::OrderExecuted(m) => m.order_reference_number.get(),
            Message::OrderExecutedWithPrice(m) => m.order_reference_number.get(),
            Message::OrderCancel(m) => m.order_reference_number.get(),
            Message::OrderDelete(m) => m.order_reference_number.get(),
            Message::OrderReplace(m) => m.original_order_reference_number.get(),
            _ => return,
        };
        self.orders.prefetch(reference);
    }

    /// Applies one ITCH message, sending the resulting events to `sink`.
    pub fn apply(&mut self, message: &Message<'_>, sink: &mut impl EventSink) {
        self.counters.messages += 1;
        let h = message.header();
        let locate = h.stock_locate.get();
        let ts = h.timestamp.nanos();
        match *message {
            Message::StockDirectory(m) => {
                self.symbol_mut(locate, Some(m.stock));
            }
            Message::StockTradingAction(m) => {
                let b = self.symbol_mut(locate, Some(m.stock));
                b.trading_state = m.trading_state;
                b.reason = m.reason;
                let state = b.state();
                sink.on_event(&Event::TradingStatus {
                    locate,
                    stock: m.stock,
                    timestamp: ts,
                    state,
                    reason: m.reason,
                });
            }
            // Only NASDAQ's own operational halts stop trading on this feed's market; the
            // BX and PSX ones are counted and otherwise ignored.
            Message::OperationalHalt(m) if m.market_code != b'Q' => {
                self.counters.other_market_halts += 1;
            }
            Message::OperationalHalt(m) => {
                let halted = match m.operational_halt_action {
                    b'H' => true,
                    b'T' => false,
                    _ => {
                        self.counters.bad_halt_actions += 1;
                        return;
                    }
                };
                let b = self.symbol_mut(locate, Some(m.stock));
                if b.operational_halt != halted {
                    b.operational_halt = halted;
                    let (state, reason) = (b.state(), b.reason);
                    sink.on_event(&Event::TradingStatus {
                        locate,
                        stock: m.stock,
                        timestamp: ts,
                        state,
                        reason,
                    });
                }
            }
            Message::AddOrder(m) => self.add(
                locate,
                ts,
                m.order_reference_number.get(),
                m.buy_sell_indicator,
                m.shares.get(),
                m.price.get(),
                Some(m.stock),
                sink,
            ),
            Message::AddOrderMpid(m) => self.add(
                locate,
                ts,
                m.order_reference_number.get(),
                m.buy_sell_indicator,
                m.shares.get(),
                m.price.get(),
                Some(m.stock),
                sink,
            ),
            Message::OrderExecuted(m) => {
                let r = m.order_reference_number.get();
                if let Some(o) = self.reduce(ts, r, m.executed_shares.get(), sink) {
                    let stock = self.symbol_mut(o.locate, None).stock;
                    sink.on_event(&Event::Trade {
                        locate: o.locate,
                        stock,
                        timestamp: ts,
                        side: Some(o.side),
                        price: o.price,
                        shares: u64::from(o.shares),
                        match_number: m.match_number.get(),
                        source: b'E',
                    });
                }
            }
            Message::OrderExecutedWithPrice(m) => {
                let r = m.order_reference_number.get();
                if let Some(o) = self.reduce(ts, r, m.executed_shares.get(), sink) {
                    if m.printable == b'Y' {
                        let stock = self.symbol_mut(o.locate, None).stock;
                        sink.on_event(&Event::Trade {
                            locate: o.locate,
                            stock,
                            timestamp: ts,
                            side: Some(o.side),
                            price: m.execution_price.get(),
                            shares: u64::from(o.shares),
                            match_number: m.match_number.get(),
                            source: b'C',
                        });
                    }
                }
            }
            Message::OrderCancel(m) => {
                self.reduce(
                    ts,
                    m.order_reference_number.get(),
                    m.cancelled_shares.get(),
                    sink,
                );
            }
            Message::OrderDelete(m) => {
                self.reduce(ts, m.order_reference_number.get(), u32::MAX, sink);
            }
            Message::OrderReplace(m) => {
                let r = m.original_order_reference_number.get();
                let Some(old) = self.orders.get(r).copied() else {
                    self.counters.unknown_orders += 1;
                    return;
                };
                let before = self.bbo_of(old.locate);
                self.remove_quiet(ts, r, u32::MAX, sink);
                self.add_quiet(
                    old.locate,
                    ts,
                    m.new_order_reference_number.get(),
                    old.side,
                    m.shares.get(),
                    m.price.get(),
                    None,
                    sink,
                );
                self.emit_bbo_if_changed(old.locate, ts, before, sink);
            }
            Message::Trade(m) => {
                sink.on_event(&Event::Trade {
                    locate,
                    stock: m.stock,
                    timestamp: ts,
                    side: Side::from_itch(m.buy_sell_indicator),
                    price: m.price.get(),
                    shares: u64::from(m.shares.get()),
                    match_number: m.match_number.get(),
                    source: b'P',
                });
            }
            // A cross of zero shares reports that no cross happened.
            Message::CrossTrade(m) if m.shares.get() > 0 => {
                sink.on_event(&Event::Trade {
                    locate,
                    stock: m.stock,
                    timestamp: ts,
                    side: None,
                    price: m.cross_price.get(),
                    shares: m.shares.get(),
                    match_number: m.match_number.get(),
                    source: b'Q',
                });
            }
            _ => {}
        }
    }

    fn bbo_of(&self, locate: u16) -> (Option<Level>, Option<Level>) {
        self.symbol(locate).map_or((None, None), SymbolBook::bbo)
    }

    /// Emits the symbol's top of book as it is now.
    fn emit_bbo(&self, locate: u16, ts: u64, sink: &mut impl EventSink) {
        let Some(b) = self.symbol(locate) else { return };
        let (bid, ask) = b.bbo();
        sink.on_event(&Event::Bbo {
            locate,
            stock: b.stock,
            timestamp: ts,
            bid,
            ask,
        });
    }

    fn emit_bbo_if_changed(
        &self,
        locate: u16,
        ts: u64,
        before: (Option<Level>, Option<Level>),
        sink: &mut impl EventSink,
    ) {
        let Some(b) = self.symbol(locate) else { return };
        let (bid, ask) = b.bbo();
        if (bid, ask) != before {
            sink.on_event(&Event::Bbo {
                locate,
                stock: b.stock,
                timestamp: ts,
                bid,
                ask,
            });
        }
    }

    #[allow(clippy::too_many_arguments)] // the fields of an add, shared by A, F and U
    fn add(
        &mut self,
        locate: u16,
        ts: u64,
        reference: u64,
        side: u8,
        shares: u32,
        price: u32,
        stock: Option<Stock>,
        sink: &mut impl EventSink,
    ) {
        let Some(side) = Side::from_itch(side) else {
            self.counters.bad_sides += 1;
            return;
        };
        // An add changes the top of book exactly when it lands on the best level (a new one
        // or the old one, which grows): no need to compare the top before and after.
        if self.add_quiet(locate, ts, reference, side, shares, price, stock, sink) {
            self.emit_bbo(locate, ts, sink);
        }
    }

    /// Adds an order and emits its level change, not the BBO; returns whether the order
    /// went to its side's best level, i.e. whether the top of book changed.
    #[allow(clippy::too_many_arguments)]
    fn add_quiet(
        &mut self,
        locate: u16,
        ts: u64,
        reference: u64,
        side: Side,
        shares: u32,
        price: u32,
        stock: Option<Stock>,
        sink: &mut impl EventSink,
    ) -> bool {
        if self.orders.contains(reference) {
            self.counters.duplicate_orders += 1;
            return false;
        }
        if shares == 0 {
            self.counters.zero_share_adds += 1;
            return false;
        }
        self.orders.insert_new(
            reference,
            Order {
                locate,
                side,
                price,
                shares,
            },
        );
        let b = self.symbol_mut(locate, stock);
        let (level, top) = b.side_mut(side).add(side, price, shares);
        sink.on_event(&Event::Level {
            locate,
            stock: b.stock,
            timestamp: ts,
            side,
            level,
        });
        top
    }

    /// Removes up to `shares` from an order (deleting it at zero); emits level and BBO.
    /// Returns the order with `shares` set to the amount actually removed.
    fn reduce(
        &mut self,
        ts: u64,
        reference: u64,
        shares: u32,
        sink: &mut impl EventSink,
    ) -> Option<Order> {
        let (removed, top) = self.remove_quiet(ts, reference, shares, sink)?;
        if top {
            self.emit_bbo(removed.locate, ts, sink);
        }
        Some(removed)
    }

    /// Removes up to `shares` from an order and emits its level change, not the BBO.
    /// Returns the order with `shares` set to the amount removed, and whether that changed
    /// the top of book (shares came off the best level).
    fn remove_quiet(
        &mut self,
        ts: u64,
        reference: u64,
        shares: u32,
        sink: &mut impl EventSink,
    ) -> Option<(Order, bool)> {
        let Some(o) = self.orders.get_mut(reference) else {
            self.counters.unknown_orders += 1;
            return None;
        };
        // u32::MAX is a delete: all remaining shares, not an overfill.
        if shares > o.shares && shares != u32::MAX {
            self.counters.overfills += 1;
        }
        let take = shares.min(o.shares);
        let gone = take == o.shares;
        let removed = Order { shares: take, ..*o };
        if gone {
            // Taken out whole: an order of zero shares would read as an empty slot.
            self.orders.remove(reference);
        } else {
            o.shares -= take;
        }
        let b = self.symbol_mut(removed.locate, None);
        let mut top = false;
        if let Some((level, was_best)) =
            b.side_mut(removed.side)
                .remove(removed.side, removed.price, take, gone)
        {
            top = was_best && take > 0;
            sink.on_event(&Event::Level {
                locate: removed.locate,
                stock: b.stock,
                timestamp: ts,
                side: removed.side,
                level,
            });
        }
        Some((removed, top))
    }
}

// ---- Snapshot -------------------------------------------------------------------------
//
// Layout, all integers little-endian:
//   SnapshotHeader { magic "RBKS", version u16, reserved u16, symbols u32, orders u64 }
//   `symbols` x SnapshotSymbol { locate u16, stock [8], trading_state u8, reason [4], flags u8 }
//     (flags bit 0: operational halt in effect; version-1 snapshots from before it wrote 0)
//   `orders`  x SnapshotOrder  { reference u64, locate u16, side u8 ('B'/'S'), reserved u8, price u32, shares u32 }
// Orders are written sorted by reference so equal books give equal bytes. Levels are not
// written: they are derived from the orders on restore.

const SNAPSHOT_MAGIC: [u8; 4] = *b"RBKS";
const SNAPSHOT_VERSION: u16 = 1;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct SnapshotHeader {
    magic: [u8; 4],
    version: U16,
    reserved: U16,
    symbols: U32,
    orders: U64,
}
const _: () = assert!(core::mem::size_of::<SnapshotHeader>() == 20);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct SnapshotSymbol {
    locate: U16,
    stock: [u8; 8],
    trading_state: u8,
    reason: [u8; 4],
    flags: u8,
}
const _: () = assert!(core::mem::size_of::<SnapshotSymbol>() == 16);
const FLAG_OPERATIONAL_HALT: u8 = 1;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct SnapshotOrder {
    reference: U64,
    locate: U16,
    side: u8,
    reserved: u8,
    price: U32,
    shares: U32,
}
const _: () = assert!(core::mem::size_of::<SnapshotOrder>() == 20);

/// Why snapshot bytes could not be restored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Shorter than its header says.
    #[error("book snapshot truncated")]
    Truncated,
    /// Not a book snapshot.
    #[error("not a book snapshot (bad magic)")]
    BadMagic,
    /// Written by an unknown version.
    #[error("book snapshot version {0} is not supported")]
    Version(u16),
    /// An order with a side other than 'B'/'S', a duplicate reference, or bytes after the end.
    #[error("book snapshot is inconsistent")]
    Inconsistent,
}

impl Book {
    /// The book as bytes, for a late joiner (see the layout above [`SnapshotError`]).
    pub fn snapshot(&self) -> Vec<u8> {
        let symbols: Vec<_> = self.symbols().collect();
        let mut orders: Vec<_> = self.orders.iter().collect();
        orders.sort_unstable_by_key(|(r, _)| *r);
        let mut out = Vec::with_capacity(20 + symbols.len() * 16 + orders.len() * 20);
        let header = SnapshotHeader {
            magic: SNAPSHOT_MAGIC,
            version: U16::new(SNAPSHOT_VERSION),
            reserved: U16::new(0),
            symbols: U32::new(symbols.len() as u32),
            orders: U64::new(orders.len() as u64),
        };
        out.extend_from_slice(header.as_bytes());
        for (locate, b) in symbols {
            let s = SnapshotSymbol {
                locate: U16::new(locate),
                stock: b.stock.0,
                trading_state: b.trading_state,
                reason: b.reason,
                flags: if b.operational_halt {
                    FLAG_OPERATIONAL_HALT
                } else {
                    0
                },
            };
            out.extend_from_slice(s.as_bytes());
        }
        for (reference, o) in orders {
            let s = SnapshotOrder {
                reference: U64::new(reference),
                locate: U16::new(o.locate),
                side: o.side.to_itch(),
                reserved: 0,
                price: U32::new(o.price),
                shares: U32::new(o.shares),
            };
            out.extend_from_slice(s.as_bytes());
        }
        out
    }

    /// Rebuilds a book from [`Book::snapshot`] bytes.
    pub fn restore(bytes: &[u8]) -> Result<Self, SnapshotError> {
        let (h, rest) =
            SnapshotHeader::ref_from_prefix(bytes).map_err(|_| SnapshotError::Truncated)?;
        if h.magic != SNAPSHOT_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        if h.version.get() != SNAPSHOT_VERSION {
            return Err(SnapshotError::Version(h.version.get()));
        }
        let n_symbols = usize::try_from(h.symbols.get()).map_err(|_| SnapshotError::Truncated)?;
        let n_orders = usize::try_from(h.orders.get()).map_err(|_| SnapshotError::Truncated)?;
        let (symbols, rest) = <[SnapshotSymbol]>::ref_from_prefix_with_elems(rest, n_symbols)
            .map_err(|_| SnapshotError::Truncated)?;
        let (orders, rest) = <[SnapshotOrder]>::ref_from_prefix_with_elems(rest, n_orders)
            .map_err(|_| SnapshotError::Truncated)?;
        if !rest.is_empty() {
            return Err(SnapshotError::Inconsistent);
        }
        let mut book = Book::new();
        for s in symbols {
            let b = book.symbol_mut(s.locate.get(), Some(Stock(s.stock)));
            b.trading_state = s.trading_state;
            b.reason = s.reason;
            b.operational_halt = s.flags & FLAG_OPERATIONAL_HALT != 0;
        }
        book.orders.reserve_far(
            orders
                .iter()
                .filter(|o| o.reference.get() >= orders::DIRECT_LIMIT)
                .count(),
        );
        let mut discard = |_: &Event| {};
        for o in orders {
            let side = Side::from_itch(o.side).ok_or(SnapshotError::Inconsistent)?;
            if o.shares.get() == 0 {
                return Err(SnapshotError::Inconsistent);
            }
            let before = book.counters.duplicate_orders;
            book.add_quiet(
                o.locate.get(),
                0,
                o.reference.get(),
                side,
                o.shares.get(),
                o.price.get(),
                None,
                &mut discard,
            );
            if book.counters.duplicate_orders != before {
                return Err(SnapshotError::Inconsistent);
            }
        }
        Ok(book)
    }
}

#[cfg(test)]
mod tests;
