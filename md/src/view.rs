//! The subscriber side of the feed: a price-level view of every symbol rebuilt from the
//! normalized messages on the bus, and the L2 snapshot late joiners start from.
//!
//! Owns [`MarketView`] (implements rocebus's [`Handler`] and [`SnapshotSink`], so a
//! `McastSubscriber` drives it directly) and the L2 snapshot layout, written from a full
//! book by the feed handler (`feed_handler::view::write_book_l2`, through [`write_l2`]) and from a view by [`MarketView`]
//! itself. It knows nothing of queue pairs or sockets.
//!
//! L2 snapshot layout, all integers little-endian (like every normalized message):
//!   `L2Header { magic "RBL2", version u16, reserved u16, symbols u32 }`, then per symbol
//!   `L2Symbol { locate u16, stock [8], trading_state u8, reason [4], reserved u8, bids u32,
//!   asks u32 }` followed by its bid levels then its ask levels, best first, each
//!   `L2Level { price u32, orders u32, shares u64 }`. Symbols ascend by locate; a symbol with
//!   no level and no trading action is left out, so equal books give equal bytes whichever
//!   side wrote them.

use crate::normalized::{self, Normalized, NormalizedError};
use crate::types::{Level, Side, Stock};
use rocebus::mcast::{Handler, RestoreError, Snapshot, SnapshotSink};
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

const L2_MAGIC: [u8; 4] = *b"RBL2";
const L2_VERSION: u16 = 1;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct L2Header {
    magic: [u8; 4],
    version: U16,
    reserved: U16,
    symbols: U32,
}
const _: () = assert!(core::mem::size_of::<L2Header>() == 12);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct L2Symbol {
    locate: U16,
    stock: [u8; 8],
    trading_state: u8,
    reason: [u8; 4],
    reserved: u8,
    bids: U32,
    asks: U32,
}
const _: () = assert!(core::mem::size_of::<L2Symbol>() == 24);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
struct L2Level {
    price: U32,
    orders: U32,
    shares: U64,
}
const _: () = assert!(core::mem::size_of::<L2Level>() == 16);

/// Why L2 snapshot bytes were refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum L2Error {
    /// Shorter than its counts say.
    #[error("L2 snapshot truncated")]
    Truncated,
    /// Not an L2 snapshot.
    #[error("not an L2 snapshot (bad magic)")]
    BadMagic,
    /// Written by an unknown version.
    #[error("L2 snapshot version {0} is not supported")]
    Version(u16),
    /// Bytes after the last symbol, symbols out of order, unsorted or empty levels.
    #[error("L2 snapshot is inconsistent")]
    Inconsistent,
}

/// One symbol as the bus shows it: trading state and price levels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SymbolView {
    /// Symbol.
    pub stock: Stock,
    /// Last ITCH trading state ('H', 'P', 'Q', 'T'), or b' ' before any.
    pub trading_state: u8,
    /// Reason code of the last trading action.
    pub reason: [u8; 4],
    /// Ascending toward the best, like the book's: the best level is last.
    bids: Vec<Level>,
    asks: Vec<Level>,
}

impl SymbolView {
    fn new(stock: Stock) -> Self {
        Self {
            stock,
            trading_state: b' ',
            reason: [b' '; 4],
            bids: Vec::new(),
            asks: Vec::new(),
        }
    }

    /// Best bid and best offer.
    pub fn bbo(&self) -> (Option<Level>, Option<Level>) {
        (self.bids.last().copied(), self.asks.last().copied())
    }

    /// Levels of one side, best first.
    pub fn depth(&self, side: Side) -> impl Iterator<Item = &Level> + '_ {
        match side {
            Side::Bid => self.bids.iter().rev(),
            Side::Ask => self.asks.iter().rev(),
        }
    }

    fn is_empty(&self) -> bool {
        self.bids.is_empty() && self.asks.is_empty() && self.trading_state == b' '
    }

    /// Sets a level to `level` (removing it when its shares are 0).
    fn set_level(&mut self, side: Side, level: Level) {
        let key = |p: u32| match side {
            Side::Bid => p,
            Side::Ask => u32::MAX - p,
        };
        let levels = match side {
            Side::Bid => &mut self.bids,
            Side::Ask => &mut self.asks,
        };
        match levels.binary_search_by_key(&key(level.price), |l| key(l.price)) {
            Ok(i) if level.shares == 0 => {
                levels.remove(i);
            }
            Ok(i) => levels[i] = level,
            Err(_) if level.shares == 0 => {}
            Err(i) => levels.insert(i, level),
        }
    }
}

/// Totals kept by a [`MarketView`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ViewCounters {
    /// Messages applied.
    pub messages: u64,
    /// Of those, trades.
    pub trades: u64,
    /// BBO messages that disagreed with the levels received before them (must stay 0: the
    /// feed handler sends every level change before the BBO it causes).
    pub bbo_mismatches: u64,
    /// Messages that were not valid normalized messages (skipped).
    pub malformed: u64,
    /// Snapshots applied.
    pub snapshots: u64,
    /// Snapshots refused as corrupt.
    pub rejected_snapshots: u64,
    /// Exchange feed losses announced by the feed handler (its books may be wrong since).
    pub feed_losses: u64,
}

/// Every symbol's price levels and trading state, rebuilt from normalized messages.
///
/// Feed it with [`MarketView::apply`], or hand it to `McastSubscriber::poll` (it is a
/// [`Handler`] and a [`SnapshotSink`]; one view per channel, since sequences and snapshots
/// are per channel). Applying a message does not allocate once a symbol's level vectors have
/// grown to their peak.
#[derive(Debug, Clone, Default)]
pub struct MarketView {
    symbols: Vec<Option<SymbolView>>,
    last_seq: u64,
    counters: ViewCounters,
    staged: Vec<u8>,
}

impl MarketView {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Totals so far.
    pub fn counters(&self) -> &ViewCounters {
        &self.counters
    }

    /// Bus sequence of the last message reflected (0: none).
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// The view of `locate`, if any message named it.
    pub fn symbol(&self, locate: u16) -> Option<&SymbolView> {
        self.symbols
            .get(usize::from(locate))
            .and_then(Option::as_ref)
    }

    /// All symbols seen, by locate.
    pub fn symbols(&self) -> impl Iterator<Item = (u16, &SymbolView)> + '_ {
        self.symbols
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as u16, s.as_ref()?)))
    }

    fn symbol_mut(&mut self, locate: u16, stock: [u8; 8]) -> &mut SymbolView {
        let i = usize::from(locate);
        if self.symbols.len() <= i {
            self.symbols.resize_with(i + 1, || None);
        }
        let s = self.symbols[i].get_or_insert_with(|| SymbolView::new(Stock(stock)));
        s.stock = Stock(stock);
        s
    }

    /// Applies one normalized message; a malformed one is counted and skipped.
    pub fn apply(&mut self, msg: &[u8]) -> Result<(), NormalizedError> {
        let m = match normalized::decode(msg) {
            Ok(m) => m,
            Err(e) => {
                self.counters.malformed += 1;
                return Err(e);
            }
        };
        self.counters.messages += 1;
        match m {
            Normalized::Level(l) => {
                let side = if l.side == b'B' { Side::Bid } else { Side::Ask };
                let level = Level {
                    price: l.price.get(),
                    shares: l.shares.get(),
                    orders: l.orders.get(),
                };
                self.symbol_mut(l.header.stock_locate.get(), l.header.stock)
                    .set_level(side, level);
            }
            Normalized::Bbo(b) => {
                let s = self.symbol_mut(b.header.stock_locate.get(), b.header.stock);
                let flat =
                    |l: Option<Level>| l.map_or((0, 0, 0), |l| (l.price, l.shares, l.orders));
                let (bid, ask) = s.bbo();
                let sent = (
                    (b.bid_price.get(), b.bid_shares.get(), b.bid_orders.get()),
                    (b.ask_price.get(), b.ask_shares.get(), b.ask_orders.get()),
                );
                if (flat(bid), flat(ask)) != sent {
                    self.counters.bbo_mismatches += 1;
                }
            }
            Normalized::Trade(t) => {
                self.symbol_mut(t.header.stock_locate.get(), t.header.stock);
                self.counters.trades += 1;
            }
            Normalized::Status(st) => {
                let s = self.symbol_mut(st.header.stock_locate.get(), st.header.stock);
                s.trading_state = st.state;
                s.reason = st.reason;
            }
            Normalized::FeedLoss(_) => self.counters.feed_losses += 1,
        }
        Ok(())
    }

    /// Appends the view as an L2 snapshot (see the module docs).
    pub fn write_l2(&self, out: &mut Vec<u8>) {
        write_l2(
            self.symbols()
                .filter(|(_, s)| !s.is_empty())
                .map(|(l, s)| L2Entry {
                    locate: l,
                    stock: s.stock,
                    trading_state: s.trading_state,
                    reason: s.reason,
                    n_bids: s.bids.len(),
                    n_asks: s.asks.len(),
                    bids: s.depth(Side::Bid),
                    asks: s.depth(Side::Ask),
                }),
            out,
        );
    }

    /// The view as L2 snapshot bytes (equal views give equal bytes).
    pub fn l2(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_l2(&mut out);
        out
    }

    /// Replaces the symbols with those of an L2 snapshot; on error nothing changes.
    pub fn restore_l2(&mut self, bytes: &[u8]) -> Result<(), L2Error> {
        let (h, mut rest) = L2Header::ref_from_prefix(bytes).map_err(|_| L2Error::Truncated)?;
        if h.magic != L2_MAGIC {
            return Err(L2Error::BadMagic);
        }
        if h.version.get() != L2_VERSION {
            return Err(L2Error::Version(h.version.get()));
        }
        let mut symbols: Vec<Option<SymbolView>> = Vec::new();
        for _ in 0..h.symbols.get() {
            let (s, after) = L2Symbol::ref_from_prefix(rest).map_err(|_| L2Error::Truncated)?;
            let n_bids = usize::try_from(s.bids.get()).map_err(|_| L2Error::Truncated)?;
            let n_asks = usize::try_from(s.asks.get()).map_err(|_| L2Error::Truncated)?;
            let (bids, after) = <[L2Level]>::ref_from_prefix_with_elems(after, n_bids)
                .map_err(|_| L2Error::Truncated)?;
            let (asks, after) = <[L2Level]>::ref_from_prefix_with_elems(after, n_asks)
                .map_err(|_| L2Error::Truncated)?;
            rest = after;
            let locate = usize::from(s.locate.get());
            if locate < symbols.len() {
                return Err(L2Error::Inconsistent);
            }
            symbols.resize_with(locate + 1, || None);
            let mut v = SymbolView::new(Stock(s.stock));
            v.trading_state = s.trading_state;
            v.reason = s.reason;
            for (side, levels, out) in [
                (Side::Bid, bids, &mut v.bids),
                (Side::Ask, asks, &mut v.asks),
            ] {
                // Written best first; kept best last.
                let key = |p: u32| match side {
                    Side::Bid => p,
                    Side::Ask => u32::MAX - p,
                };
                out.reserve(levels.len());
                for l in levels.iter().rev() {
                    if l.shares.get() == 0
                        || out
                            .last()
                            .is_some_and(|prev: &Level| key(prev.price) >= key(l.price.get()))
                    {
                        return Err(L2Error::Inconsistent);
                    }
                    out.push(Level {
                        price: l.price.get(),
                        shares: l.shares.get(),
                        orders: l.orders.get(),
                    });
                }
            }
            symbols[locate] = Some(v);
        }
        if !rest.is_empty() {
            return Err(L2Error::Inconsistent);
        }
        self.symbols = symbols;
        Ok(())
    }
}

impl Handler for MarketView {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        // Malformed messages are counted in `apply`.
        let _ = self.apply(msg);
        self.last_seq = seq;
    }
}

impl SnapshotSink for MarketView {
    fn begin_restore(&mut self) {
        self.staged.clear();
    }

    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.staged.extend_from_slice(data);
        Ok(())
    }

    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        let staged = std::mem::take(&mut self.staged);
        let r = self.restore_l2(&staged);
        self.staged = staged;
        match r {
            Ok(()) => {
                self.last_seq = snapshot_seq;
                self.counters.snapshots += 1;
                Ok(())
            }
            Err(_) => {
                self.counters.rejected_snapshots += 1;
                Err(RestoreError)
            }
        }
    }
}

/// A view can serve snapshots too (e.g. a relay for late joiners).
impl Snapshot for MarketView {
    fn snapshot_seq(&self) -> u64 {
        self.last_seq
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        self.write_l2(out);
    }
}

/// One symbol of an L2 snapshot, for [`write_l2`].
#[derive(Debug)]
pub struct L2Entry<B, A> {
    /// Stock locate.
    pub locate: u16,
    /// Symbol.
    pub stock: Stock,
    /// ITCH trading state (b' ' when no trading action was seen).
    pub trading_state: u8,
    /// ITCH reason code.
    pub reason: [u8; 4],
    /// Number of bid levels `bids` yields.
    pub n_bids: usize,
    /// Number of ask levels `asks` yields.
    pub n_asks: usize,
    /// Bid levels, best first.
    pub bids: B,
    /// Ask levels, best first.
    pub asks: A,
}

/// Appends an L2 snapshot of `entries` (ascending locates) to `out`.
pub fn write_l2<'l, B, A>(entries: impl Iterator<Item = L2Entry<B, A>>, out: &mut Vec<u8>)
where
    B: Iterator<Item = &'l Level>,
    A: Iterator<Item = &'l Level>,
{
    let start = out.len();
    out.extend_from_slice(
        L2Header {
            magic: L2_MAGIC,
            version: U16::new(L2_VERSION),
            reserved: U16::new(0),
            symbols: U32::new(0),
        }
        .as_bytes(),
    );
    let mut n = 0u32;
    for e in entries {
        n += 1;
        let s = L2Symbol {
            locate: U16::new(e.locate),
            stock: e.stock.0,
            trading_state: e.trading_state,
            reason: e.reason,
            reserved: 0,
            bids: U32::new(e.n_bids as u32),
            asks: U32::new(e.n_asks as u32),
        };
        out.extend_from_slice(s.as_bytes());
        for l in e.bids.chain(e.asks) {
            let l = L2Level {
                price: U32::new(l.price),
                orders: U32::new(l.orders),
                shares: U64::new(l.shares),
            };
            out.extend_from_slice(l.as_bytes());
        }
    }
    // The symbol count is known only at the end: patch it in the header.
    out[start + 8..start + 12].copy_from_slice(&n.to_le_bytes());
}
