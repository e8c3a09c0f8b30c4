//! Normalized market-data messages: what the feed handler publishes on the bus (the
//! encoders from book events are the feed handler's, `feed_handler::normalized::encode`).
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

use crate::types::Stock;
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
    /// 0: unknown (e.g. a [`header`] built outside the feed handler with no receive time).
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

/// The header of a message of `kind` for `stock` (locate `locate`), stamped with exchange time
/// `timestamp` and receive time `ts_recv`, at the current [`VERSION`].
pub fn header(kind: u8, locate: u16, stock: Stock, timestamp: u64, ts_recv: u64) -> Header {
    Header {
        kind,
        version: VERSION,
        stock_locate: U16::new(locate),
        stock: stock.0,
        timestamp: U64::new(timestamp),
        ts_recv: U64::new(ts_recv),
    }
}
