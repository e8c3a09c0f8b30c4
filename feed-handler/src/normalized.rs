//! Normalized market-data messages: what the feed handler publishes on the bus.
//!
//! Owns the wire layout only. Every message is a `#[repr(C)]` zerocopy struct, all integers
//! **little-endian** (our own frames use the host order of every machine we run on, x86_64
//! and aarch64, so subscribers read fields without byte swapping), starting with a 28-byte
//! [`Header`]. Prices keep ITCH's 4 implied decimals; `timestamp` is the exchange's time
//! (nanoseconds since midnight, ITCH), `ts_recv` the feed handler's receive time of the
//! exchange packet (UNIX nanoseconds, see [`Header::ts_recv`]), so a subscriber measures feed
//! latency as its own `CLOCK_REALTIME` minus `ts_recv`. Each message names its symbol, so a
//! subscriber needs no directory to use it.
//!
//! Version 2 added `ts_recv` (8 bytes after `timestamp`); version 1 messages are refused by
//! [`decode`] ([`NormalizedError::Version`]): run feed handler and subscribers of one release.

use crate::book::{Event, Level, Side};
use crate::itch::Stock;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Kind byte of a [`Bbo`].
pub const KIND_BBO: u8 = 1;
/// Kind byte of a [`LevelChange`].
pub const KIND_LEVEL: u8 = 2;
/// Kind byte of a [`Trade`].
pub const KIND_TRADE: u8 = 3;
/// Kind byte of a [`TradingStatus`].
pub const KIND_STATUS: u8 = 4;
/// Kind byte of a [`FeedLoss`].
pub const KIND_FEED_LOSS: u8 = 5;

/// Common header of every normalized message.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct Header {
    /// One of the `KIND_*` constants.
    pub kind: u8,
    /// Layout version, currently 1.
    pub version: u8,
    /// ITCH stock locate of the symbol (valid for the trading day).
    pub stock_locate: U16,
    /// Symbol, space padded.
    pub stock: [u8; 8],
    /// Exchange timestamp, nanoseconds since midnight.
    pub timestamp: U64,
    /// When the feed handler received the exchange packet this message comes from, UNIX
    /// nanoseconds (`CLOCK_REALTIME`): the kernel's receive stamp of the MoldUDP64 datagram
    /// (`SO_TIMESTAMPNS`), or, where the kernel gave none, the time `recvmsg` returned.
    /// Messages held back behind a gap carry the stamp of the packet that released them (the
    /// time they became deliverable); a [`FeedLoss`] the time the loss was declared. Read
    /// from a capture file (`feed.capture`): the time the service read the batch of records.
    /// 0: unknown (e.g. encoded by [`encode`] outside the feed handler).
    pub ts_recv: U64,
}
const _: () = assert!(core::mem::size_of::<Header>() == 28);

/// Layout version written in [`Header::version`] (2: `ts_recv` added).
pub const VERSION: u8 = 2;

/// Best bid and offer. An empty side has price, shares and orders 0.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct Bbo {
    /// `kind` = [`KIND_BBO`].
    pub header: Header,
    /// Best bid price.
    pub bid_price: U32,
    /// Best ask price.
    pub ask_price: U32,
    /// Shares at the best bid.
    pub bid_shares: U64,
    /// Shares at the best ask.
    pub ask_shares: U64,
    /// Orders at the best bid.
    pub bid_orders: U32,
    /// Orders at the best ask.
    pub ask_orders: U32,
}
const _: () = assert!(core::mem::size_of::<Bbo>() == 60);

/// One price level after a change; shares 0 means the level is gone.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct LevelChange {
    /// `kind` = [`KIND_LEVEL`].
    pub header: Header,
    /// b'B' or b'S'.
    pub side: u8,
    /// Zero.
    pub reserved: [u8; 3],
    /// Price.
    pub price: U32,
    /// Total shares at the level.
    pub shares: U64,
    /// Orders at the level.
    pub orders: U32,
}
const _: () = assert!(core::mem::size_of::<LevelChange>() == 48);

/// A trade.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct Trade {
    /// `kind` = [`KIND_TRADE`].
    pub header: Header,
    /// Side of the resting order: b'B', b'S', or b' ' when unknown (crosses).
    pub side: u8,
    /// ITCH message type it came from: b'E', b'C', b'P' or b'Q'.
    pub source: u8,
    /// Zero.
    pub reserved: [u8; 2],
    /// Price.
    pub price: U32,
    /// Shares.
    pub shares: U64,
    /// Exchange match number.
    pub match_number: U64,
}
const _: () = assert!(core::mem::size_of::<Trade>() == 52);

/// A trading status change.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct TradingStatus {
    /// `kind` = [`KIND_STATUS`].
    pub header: Header,
    /// ITCH trading state: b'H' halted, b'P' paused, b'Q' quotation only, b'T' trading.
    pub state: u8,
    /// Zero.
    pub reserved: [u8; 3],
    /// ITCH reason code.
    pub reason: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<TradingStatus>() == 36);

/// The exchange feed lost messages the feed handler could not recover (its re-requests
/// went unanswered after every retry, or no retransmission server is configured). What
/// they said is unknown: a halt or a price move may be among them, so every symbol of the
/// channel is suspect from here on. Published on every channel, in sequence with the
/// messages around it: what was published before it is from before the loss.
///
/// The header names no symbol (`stock_locate` 0, `stock` all spaces: "every symbol of this
/// channel"); its timestamp is the exchange time of the last message before the loss.
#[derive(
    FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy, PartialEq, Eq,
)]
#[repr(C)]
pub struct FeedLoss {
    /// `kind` = [`KIND_FEED_LOSS`], no symbol.
    pub header: Header,
    /// First lost MoldUDP64 sequence number.
    pub from: U64,
    /// One past the last lost MoldUDP64 sequence number.
    pub to: U64,
}
const _: () = assert!(core::mem::size_of::<FeedLoss>() == 44);

impl FeedLoss {
    /// The message for the loss of `[from, to)`, after exchange time `timestamp`.
    pub fn new(from: u64, to: u64, timestamp: u64) -> Self {
        Self {
            header: header(KIND_FEED_LOSS, 0, Stock([b' '; 8]), timestamp, 0),
            from: U64::new(from),
            to: U64::new(to),
        }
    }
}

/// Largest normalized message, for stack buffers.
pub const MAX_LEN: usize = 60;

/// A decoded normalized message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Normalized<'a> {
    Bbo(&'a Bbo),
    Level(&'a LevelChange),
    Trade(&'a Trade),
    Status(&'a TradingStatus),
    FeedLoss(&'a FeedLoss),
}

/// Why bytes are not a normalized message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NormalizedError {
    /// Unknown kind byte (or empty input).
    #[error("unknown normalized message kind {0}")]
    UnknownKind(u8),
    /// Unknown layout version.
    #[error("unsupported normalized message version {0}")]
    Version(u8),
    /// Length does not match the kind.
    #[error("normalized message of kind {kind} has {len} bytes")]
    Length {
        /// Kind byte.
        kind: u8,
        /// Bytes given.
        len: usize,
    },
}

/// Decodes one normalized message (exact length).
pub fn decode(bytes: &[u8]) -> Result<Normalized<'_>, NormalizedError> {
    let kind = bytes.first().copied().unwrap_or(0);
    let len_err = NormalizedError::Length {
        kind,
        len: bytes.len(),
    };
    if let Some(&v) = bytes.get(1) {
        if v != VERSION {
            return Err(NormalizedError::Version(v));
        }
    }
    Ok(match kind {
        KIND_BBO => Normalized::Bbo(Bbo::ref_from_bytes(bytes).map_err(|_| len_err)?),
        KIND_LEVEL => Normalized::Level(LevelChange::ref_from_bytes(bytes).map_err(|_| len_err)?),
        KIND_TRADE => Normalized::Trade(Trade::ref_from_bytes(bytes).map_err(|_| len_err)?),
        KIND_STATUS => {
            Normalized::Status(TradingStatus::ref_from_bytes(bytes).map_err(|_| len_err)?)
        }
        KIND_FEED_LOSS => {
            Normalized::FeedLoss(FeedLoss::ref_from_bytes(bytes).map_err(|_| len_err)?)
        }
        k => return Err(NormalizedError::UnknownKind(k)),
    })
}

fn header(kind: u8, locate: u16, stock: Stock, timestamp: u64, ts_recv: u64) -> Header {
    Header {
        kind,
        version: VERSION,
        stock_locate: U16::new(locate),
        stock: stock.0,
        timestamp: U64::new(timestamp),
        ts_recv: U64::new(ts_recv),
    }
}

/// Encodes a book event into `out` with `ts_recv` 0 (unknown); returns the bytes written.
pub fn encode(event: &Event, out: &mut [u8; MAX_LEN]) -> usize {
    encode_received(event, 0, out)
}

/// Encodes a book event into `out`, stamped with the receive time `ts_recv` (UNIX
/// nanoseconds, see [`Header::ts_recv`]); returns the bytes written (no allocation).
pub fn encode_received(event: &Event, ts_recv: u64, out: &mut [u8; MAX_LEN]) -> usize {
    fn put(out: &mut [u8; MAX_LEN], bytes: &[u8]) -> usize {
        out[..bytes.len()].copy_from_slice(bytes);
        bytes.len()
    }
    let side_byte = |s: Option<Side>| s.map_or(b' ', Side::to_itch);
    match *event {
        Event::Bbo {
            locate,
            stock,
            timestamp,
            bid,
            ask,
        } => {
            let z = Level {
                price: 0,
                shares: 0,
                orders: 0,
            };
            let (b, a) = (bid.unwrap_or(z), ask.unwrap_or(z));
            let m = Bbo {
                header: header(KIND_BBO, locate, stock, timestamp, ts_recv),
                bid_price: U32::new(b.price),
                ask_price: U32::new(a.price),
                bid_shares: U64::new(b.shares),
                ask_shares: U64::new(a.shares),
                bid_orders: U32::new(b.orders),
                ask_orders: U32::new(a.orders),
            };
            put(out, m.as_bytes())
        }
        Event::Level {
            locate,
            stock,
            timestamp,
            side,
            level,
        } => {
            let m = LevelChange {
                header: header(KIND_LEVEL, locate, stock, timestamp, ts_recv),
                side: side.to_itch(),
                reserved: [0; 3],
                price: U32::new(level.price),
                shares: U64::new(level.shares),
                orders: U32::new(level.orders),
            };
            put(out, m.as_bytes())
        }
        Event::Trade {
            locate,
            stock,
            timestamp,
            side,
            price,
            shares,
            match_number,
            source,
        } => {
            let m = Trade {
                header: header(KIND_TRADE, locate, stock, timestamp, ts_recv),
                side: side_byte(side),
                source,
                reserved: [0; 2],
                price: U32::new(price),
                shares: U64::new(shares),
                match_number: U64::new(match_number),
            };
            put(out, m.as_bytes())
        }
        Event::TradingStatus {
            locate,
            stock,
            timestamp,
            state,
            reason,
        } => {
            let m = TradingStatus {
                header: header(KIND_STATUS, locate, stock, timestamp, ts_recv),
                state,
                reserved: [0; 3],
                reason,
            };
            put(out, m.as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A level change: bid 10.0100 x 150, 1 order, AAPL locate 1 at 1000 ns, received at
    /// UNIX time 0x0102030405060708 ns.
    #[rustfmt::skip]
    static LEVEL_BYTES: [u8; 48] = [
        KIND_LEVEL, 2, 1, 0,                       // kind, version 2, locate (LE)
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ',
        0xe8, 0x03, 0, 0, 0, 0, 0, 0,              // timestamp 1000
        8, 7, 6, 5, 4, 3, 2, 1,                    // ts_recv
        b'B', 0, 0, 0,                             // side, reserved
        0x04, 0x87, 0x01, 0x00,                    // price 100100
        150, 0, 0, 0, 0, 0, 0, 0,                  // shares
        1, 0, 0, 0,                                // orders
    ];

    #[test]
    fn level_change_fixed_bytes() {
        let e = Event::Level {
            locate: 1,
            stock: Stock::new("AAPL"),
            timestamp: 1000,
            side: Side::Bid,
            level: Level {
                price: 100_100,
                shares: 150,
                orders: 1,
            },
        };
        let mut buf = [0u8; MAX_LEN];
        let n = encode_received(&e, 0x0102_0304_0506_0708, &mut buf);
        assert_eq!(&buf[..n], &LEVEL_BYTES[..]);
        let n = encode(&e, &mut buf);
        assert_eq!(&buf[20..28], &[0; 8], "encode leaves ts_recv unknown");
        assert_eq!(&buf[..20], &LEVEL_BYTES[..20]);
        assert_eq!(&buf[28..n], &LEVEL_BYTES[28..]);
        let Ok(Normalized::Level(m)) = decode(&LEVEL_BYTES) else {
            panic!("level")
        };
        assert_eq!(
            (m.price.get(), m.shares.get(), m.orders.get(), m.side),
            (100_100, 150, 1, b'B')
        );
        assert_eq!(m.header.ts_recv.get(), 0x0102_0304_0506_0708);
        // A version 1 message (no ts_recv) is refused, not misread.
        let mut v1 = LEVEL_BYTES[..40].to_vec();
        v1[1] = 1;
        assert_eq!(decode(&v1), Err(NormalizedError::Version(1)));
    }

    /// Messages 7..10 lost after exchange time 1000.
    #[rustfmt::skip]
    static FEED_LOSS_BYTES: [u8; 44] = [
        KIND_FEED_LOSS, 2, 0, 0,                   // kind, version 2, locate 0
        b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', // no symbol
        0xe8, 0x03, 0, 0, 0, 0, 0, 0,              // timestamp 1000
        0, 0, 0, 0, 0, 0, 0, 0,                    // ts_recv unknown
        7, 0, 0, 0, 0, 0, 0, 0,                    // from
        10, 0, 0, 0, 0, 0, 0, 0,                   // to
    ];

    #[test]
    fn feed_loss_fixed_bytes() {
        assert_eq!(FeedLoss::new(7, 10, 1000).as_bytes(), &FEED_LOSS_BYTES[..]);
        let Ok(Normalized::FeedLoss(m)) = decode(&FEED_LOSS_BYTES) else {
            panic!("feed loss")
        };
        assert_eq!((m.from.get(), m.to.get()), (7, 10));
        assert!(decode(&FEED_LOSS_BYTES[..43]).is_err());
    }

    #[test]
    fn every_kind_roundtrips() {
        let stock = Stock::new("MSFT");
        let events = [
            Event::Bbo {
                locate: 3,
                stock,
                timestamp: 5,
                bid: Some(Level {
                    price: 10,
                    shares: 20,
                    orders: 2,
                }),
                ask: None,
            },
            Event::Trade {
                locate: 3,
                stock,
                timestamp: 6,
                side: None,
                price: 11,
                shares: 1 << 40,
                match_number: 9,
                source: b'Q',
            },
            Event::TradingStatus {
                locate: 3,
                stock,
                timestamp: 7,
                state: b'H',
                reason: *b"T1  ",
            },
        ];
        let mut buf = [0u8; MAX_LEN];
        let n = encode(&events[0], &mut buf);
        let Ok(Normalized::Bbo(b)) = decode(&buf[..n]) else {
            panic!("bbo")
        };
        assert_eq!(
            (
                b.bid_price.get(),
                b.bid_shares.get(),
                b.bid_orders.get(),
                b.ask_price.get()
            ),
            (10, 20, 2, 0)
        );
        assert_eq!(b.header.stock, *b"MSFT    ");
        let n = encode(&events[1], &mut buf);
        let Ok(Normalized::Trade(t)) = decode(&buf[..n]) else {
            panic!("trade")
        };
        assert_eq!(
            (t.side, t.source, t.shares.get(), t.match_number.get()),
            (b' ', b'Q', 1 << 40, 9)
        );
        let n = encode(&events[2], &mut buf);
        let Ok(Normalized::Status(s)) = decode(&buf[..n]) else {
            panic!("status")
        };
        assert_eq!(
            (s.state, s.reason, s.header.timestamp.get()),
            (b'H', *b"T1  ", 7)
        );
        assert_eq!(
            decode(&buf[..n - 1]),
            Err(NormalizedError::Length {
                kind: KIND_STATUS,
                len: n - 1
            })
        );
        assert_eq!(decode(&[]), Err(NormalizedError::UnknownKind(0)));
        assert_eq!(decode(&[KIND_BBO, 9]), Err(NormalizedError::Version(9)));
    }
}
