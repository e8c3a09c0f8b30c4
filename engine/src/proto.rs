//! Engine binary protocol: the frames trading engines and the gateway exchange over the
//! rocebus orders path.
//!
//! Every frame is one `#[repr(C)]` zerocopy struct, **little-endian** throughout (engines and
//! gateway run on x86_64/aarch64 hosts; no exchange dictates the order here, so we pick the
//! one that costs nothing). A frame starts with an 8-byte [`Header`]: message type, protocol
//! version, total frame length (header included) and a 4-byte sequence number: on responses
//! the gateway's per-engine response sequence (1, 2, …; see [`Header::seq`]), zero on
//! requests. Prices are signed fixed-point with 4 implied decimals (`1_234_500` = 123.45);
//! quantities are whole units.
//!
//! This module owns the byte layout only; it must not know about risk, FIX or transport.
//! Decoding never panics: [`Request::decode`] and [`Response::decode`] return
//! [`DecodeError`] for anything short, unknown or out of range.

use std::fmt;

use rocebus::auth;
use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Protocol version carried in every header.
pub const VERSION: u8 = 1;

/// Fixed-point scale of prices: 4 implied decimals.
pub const PRICE_SCALE: i64 = 10_000;

/// Message type codes (the first header byte).
pub mod msg_type {
    /// Engine → gateway: new order.
    pub const NEW_ORDER: u8 = b'N';
    /// Engine → gateway: cancel an open order.
    pub const CANCEL: u8 = b'C';
    /// Engine → gateway: change price/quantity of an open order.
    pub const REPLACE: u8 = b'R';
    /// Engine → gateway: cancel all open orders of an account/symbol.
    pub const MASS_CANCEL: u8 = b'M';
    /// Gateway → engine: order accepted by the venue.
    pub const ACK: u8 = b'a';
    /// Gateway → engine: request rejected (risk, session or venue).
    pub const REJECT: u8 = b'j';
    /// Gateway → engine: order completely filled.
    pub const FILL: u8 = b'f';
    /// Gateway → engine: order partially filled.
    pub const PARTIAL_FILL: u8 = b'p';
    /// Gateway → engine: order canceled.
    pub const CANCELED: u8 = b'c';
    /// Gateway → engine: order replaced.
    pub const REPLACED: u8 = b'r';
    /// Gateway → engine: the venue changed an order after the fact (trade cancel or
    /// correct, a fill beyond the order quantity or after the order was final); applies to
    /// final orders too.
    pub const NOTICE: u8 = b'n';
    /// Engine → gateway: first frame of a connection, names the engine ([`super::Logon`]).
    pub const LOGON: u8 = b'L';
    /// Gateway → engine: answer to a logon ([`super::LogonAck`]).
    pub const LOGON_ACK: u8 = b'l';
    /// Gateway → engine: the current state of an order, unnumbered ([`super::OrderStatus`]).
    pub const STATUS: u8 = b's';
    /// Both ways, after the logon: "still here" ([`super::Heartbeat`]), unnumbered. Each
    /// side sends one every [`super::LogonAck::heartbeat_ms`]; a side that hears nothing
    /// from its peer for its timeout treats the connection as dead.
    pub const HEARTBEAT: u8 = b'h';
    /// Gateway → engine, before an accepting [`super::LogonAck`]: request numbers the
    /// gateway never took below its last taken one ([`super::RequestHoles`]).
    pub const REQUEST_HOLES: u8 = b'H';
}

/// Orders-path stream carrying engine requests (engine → gateway) and responses
/// (gateway → engine). Each frame's rocebus message type is the engine message type byte
/// ([`msg_type`]) and its payload is the whole engine frame, header included.
pub const ORDERS_STREAM: u16 = 1;

/// An instrument symbol: up to 8 ASCII bytes, right-padded with spaces (ITCH style), so it
/// can be a hash key without allocation.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Default,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(transparent)]
pub struct Symbol(pub [u8; 8]);

impl Symbol {
    /// Builds a symbol from text; `None` if longer than 8 bytes, empty or not printable ASCII.
    pub fn new(s: &str) -> Option<Symbol> {
        Symbol::from_bytes(s.as_bytes())
    }

    /// Builds a symbol from bytes (e.g. a FIX field); same rules as [`Symbol::new`].
    pub fn from_bytes(b: &[u8]) -> Option<Symbol> {
        if b.is_empty() || b.len() > 8 || !b.iter().all(|c| c.is_ascii_graphic()) {
            return None;
        }
        let mut out = [b' '; 8];
        out[..b.len()].copy_from_slice(b);
        Some(Symbol(out))
    }

    /// The symbol without padding.
    pub fn as_bytes(&self) -> &[u8] {
        let end = self
            .0
            .iter()
            .rposition(|&c| c != b' ' && c != 0)
            .map_or(0, |i| i + 1);
        &self.0[..end]
    }

    /// The symbol as text (lossy for non-ASCII bytes, which [`Symbol::new`] never produces).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or("?")
    }

    /// True for the all-blank symbol (used by MassCancel as "every symbol").
    pub fn is_blank(&self) -> bool {
        self.as_bytes().is_empty()
    }
}

impl fmt::Debug for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Symbol({:?})", self.as_str())
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Order side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Side {
    /// Buy.
    Buy = b'B',
    /// Sell.
    Sell = b'S',
}

impl Side {
    fn from_u8(b: u8) -> Option<Side> {
        match b {
            b'B' => Some(Side::Buy),
            b'S' => Some(Side::Sell),
            _ => None,
        }
    }
}

/// Time in force.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum TimeInForce {
    /// Good for the day.
    Day = b'0',
    /// Immediate or cancel.
    Ioc = b'3',
}

impl TimeInForce {
    fn from_u8(b: u8) -> Option<TimeInForce> {
        match b {
            b'0' => Some(TimeInForce::Day),
            b'3' => Some(TimeInForce::Ioc),
            _ => None,
        }
    }
}

/// Why a request was rejected. The numeric value is on the wire (`Reject::reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
#[non_exhaustive]
pub enum RejectReason {
    /// The engine is not granted the account.
    AccountNotGranted = 1,
    /// The account is not configured.
    UnknownAccount = 2,
    /// Quantity zero or above the per-order maximum.
    MaxQuantity = 3,
    /// Notional above the per-order maximum.
    MaxNotional = 4,
    /// Price outside the collar around the reference price.
    PriceCollar = 5,
    /// No reference price for the symbol (fail closed).
    NoReferencePrice = 6,
    /// Reference price older than the allowed age (fail closed).
    StaleReferencePrice = 7,
    /// Open plus executed notional would exceed the credit limit.
    CreditLimit = 8,
    /// Position would exceed the limit.
    PositionLimit = 9,
    /// Too many open orders on the account.
    MaxOpenOrders = 10,
    /// Order-rate throttle exceeded.
    Throttled = 11,
    /// Client order id already used by this engine.
    DuplicateClientOrderId = 12,
    /// Symbol on the restricted list.
    RestrictedSymbol = 13,
    /// Symbol halted by the feed.
    Halted = 14,
    /// Outside the trading-hours window.
    OutsideTradingHours = 15,
    /// The engine's kill switch is on.
    KillSwitchEngine = 16,
    /// The account's kill switch is on.
    KillSwitchAccount = 17,
    /// The global kill switch is on.
    KillSwitchGlobal = 18,
    /// Cancel/replace for an order the gateway does not know (or not open).
    UnknownOrder = 19,
    /// The venue rejected the order.
    VenueReject = 20,
    /// The venue rejected the cancel or replace.
    VenueCancelReject = 21,
    /// The FIX session to the venue is not up.
    SessionDown = 22,
    /// The engine frame could not be decoded.
    Malformed = 23,
    /// Price not positive (limit orders only).
    InvalidPrice = 24,
    /// A cancel or replace is already pending on this order.
    PendingChange = 25,
    /// Not taken: the gateway could not journal the request (disk full or failing). Sent
    /// unnumbered; nothing happened, and the same request (same number and id) may be sent
    /// again once the gateway takes requests again.
    JournalUnavailable = 26,
    /// Open plus executed notional of all accounts would exceed the firm's credit limit.
    FirmCreditLimit = 27,
    /// Open notional of all accounts (buys and sells added) would exceed the firm's gross
    /// limit.
    FirmGrossNotional = 28,
    /// Too many open orders across all accounts.
    FirmMaxOpenOrders = 29,
    /// The same order (account, symbol, side, quantity, price) was accepted too many times
    /// within the repeated-order window.
    RepeatedOrder = 30,
    /// Decided and journaled, but the gateway stopped before the FIX message carrying it
    /// reached the journal, so it never went to the venue (the journal is written before
    /// anything is sent): nothing happened there. Answered when the gateway starts again,
    /// for a new order (the order is closed) or a cancel or replace (the order stands as it
    /// was); the same request may be sent again under a new id.
    NotSent = 31,
}

impl RejectReason {
    /// Decodes the wire value.
    pub fn from_u16(v: u16) -> Option<RejectReason> {
        use RejectReason::*;
        const ALL: [RejectReason; 31] = [
            AccountNotGranted,
            UnknownAccount,
            MaxQuantity,
            MaxNotional,
            PriceCollar,
            NoReferencePrice,
            StaleReferencePrice,
            CreditLimit,
            PositionLimit,
            MaxOpenOrders,
            Throttled,
            DuplicateClientOrderId,
            RestrictedSymbol,
            Halted,
            OutsideTradingHours,
            KillSwitchEngine,
            KillSwitchAccount,
            KillSwitchGlobal,
            UnknownOrder,
            VenueReject,
            VenueCancelReject,
            SessionDown,
            Malformed,
            InvalidPrice,
            PendingChange,
            JournalUnavailable,
            FirmCreditLimit,
            FirmGrossNotional,
            FirmMaxOpenOrders,
            RepeatedOrder,
            NotSent,
        ];
        ALL.into_iter().find(|r| *r as u16 == v)
    }
}

/// Frame header, 8 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Header {
    /// One of [`msg_type`].
    pub msg_type: u8,
    /// [`VERSION`].
    pub version: u8,
    /// Total frame length in bytes, header included.
    pub length: U16,
    /// Responses: the engine's response sequence number, assigned by the gateway (first
    /// response 1, +1 per response, kept across reconnects and gateway restarts), so an
    /// engine that reconnects names the last one it processed in its [`Logon`] and gets the
    /// rest replayed. Zero on frames built before the gateway stamps them, and on
    /// unnumbered informational responses ([`OrderStatus`], "not taken" rejects).
    ///
    /// Requests: the engine's request sequence number (first request 1, +1 per request,
    /// kept across reconnects and restarts of either side; 0: unnumbered). The gateway
    /// journals the highest it has taken and answers a logon with it
    /// ([`LogonAck::last_request_seq`]): every later request was not taken and may be sent
    /// again with the same number and id. A request numbered at or below that is a re-send
    /// of one already taken: it is answered with an [`OrderStatus`] and not acted on again.
    pub seq: U32,
}

impl Header {
    fn new(msg_type: u8, length: usize) -> Header {
        // Frame sizes are compile-time constants below 64 KiB (asserted below).
        Header {
            msg_type,
            version: VERSION,
            length: U16::new(length as u16),
            seq: U32::ZERO,
        }
    }
}

/// Engine → gateway: new limit order. 48 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct NewOrder {
    /// Header, type [`msg_type::NEW_ORDER`].
    pub header: Header,
    /// Engine-chosen id, unique per engine for the life of the journal.
    pub cl_ord_id: U64,
    /// Account to trade for.
    pub account: U32,
    /// Quantity.
    pub qty: U32,
    /// Limit price, 4 implied decimals.
    pub price: I64,
    /// Instrument.
    pub symbol: Symbol,
    /// `b'B'` or `b'S'`.
    pub side: u8,
    /// Time in force, `b'0'` day or `b'3'` IOC.
    pub tif: u8,
    /// Zero.
    pub pad: [u8; 6],
}

/// Engine → gateway: cancel an order. 16 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Cancel {
    /// Header, type [`msg_type::CANCEL`].
    pub header: Header,
    /// The order to cancel.
    pub cl_ord_id: U64,
}

/// Engine → gateway: replace quantity and price of an order; the order keeps its id. 32 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Replace {
    /// Header, type [`msg_type::REPLACE`].
    pub header: Header,
    /// The order to change.
    pub cl_ord_id: U64,
    /// New total quantity.
    pub qty: U32,
    /// Zero.
    pub pad: U32,
    /// New limit price.
    pub price: I64,
}

/// Engine → gateway: cancel every open order of this engine matching account and symbol.
/// 24 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MassCancel {
    /// Header, type [`msg_type::MASS_CANCEL`].
    pub header: Header,
    /// Account, 0 = every account of the engine.
    pub account: U32,
    /// Zero.
    pub pad: U32,
    /// Symbol, blank = every symbol.
    pub symbol: Symbol,
}

/// Gateway → engine: the venue accepted the order. 24 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Ack {
    /// Header, type [`msg_type::ACK`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// Gateway order id (also the FIX ClOrdID of the original order).
    pub order_id: U64,
}

/// Gateway → engine: a request was rejected. 24 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Reject {
    /// Header, type [`msg_type::REJECT`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// A [`RejectReason`] value.
    pub reason: U16,
    /// Message type of the rejected request.
    pub request: u8,
    /// Zero.
    pub pad: [u8; 5],
}

/// Gateway → engine: execution (type [`msg_type::FILL`] or [`msg_type::PARTIAL_FILL`]).
/// 40 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Fill {
    /// Header.
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// Quantity of this execution.
    pub last_qty: U32,
    /// Quantity still open.
    pub leaves_qty: U32,
    /// Price of this execution.
    pub last_px: I64,
    /// Total executed so far.
    pub cum_qty: U32,
    /// Zero.
    pub pad: U32,
}

/// Gateway → engine: the order is canceled. 24 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Canceled {
    /// Header, type [`msg_type::CANCELED`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// Quantity that was still open.
    pub canceled_qty: U32,
    /// Zero.
    pub pad: U32,
}

/// Gateway → engine: the order was replaced. 32 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Replaced {
    /// Header, type [`msg_type::REPLACED`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// New total quantity.
    pub qty: U32,
    /// Quantity still open after the replace.
    pub leaves_qty: U32,
    /// New price.
    pub price: I64,
}

/// Where an order stands, in an [`OrderStatus`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum OrdState {
    /// The gateway has no order with this id for the engine (never taken, or the id of a
    /// rejected new order: see [`OrderStatus::reason`]).
    Unknown = 0,
    /// Sent to the venue, not yet acknowledged.
    PendingNew = 1,
    /// Live at the venue (see `cum_qty` for partial fills).
    Open = 2,
    /// Completely filled.
    Filled = 3,
    /// Canceled (or otherwise ended at the venue with quantity left).
    Canceled = 4,
    /// Rejected (by risk checks or the venue; see [`OrderStatus::reason`]).
    Rejected = 5,
}

impl OrdState {
    /// Decodes the wire value.
    pub fn from_u8(v: u8) -> Option<OrdState> {
        use OrdState::*;
        [Unknown, PendingNew, Open, Filled, Canceled, Rejected]
            .into_iter()
            .find(|s| *s as u8 == v)
    }
}

/// Gateway → engine: the current state of an order, sent unnumbered (header `seq` 0) in
/// answer to a re-sent request the gateway had already taken. Informational: it never
/// repeats a fill (the numbered responses carry those). 40 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OrderStatus {
    /// Header, type [`msg_type::STATUS`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// Current total quantity.
    pub qty: U32,
    /// Executed so far.
    pub cum_qty: U32,
    /// Current limit price.
    pub price: I64,
    /// An [`OrdState`].
    pub state: u8,
    /// Message type of the re-sent request this answers.
    pub request: u8,
    /// For `Rejected`: a [`RejectReason`] value when known, else 0.
    pub reason: U16,
    /// The request sequence number of the re-sent request.
    pub request_seq: U32,
}

/// What a [`Notice`] reports. The numeric value is on the wire (`Notice::kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum NoticeKind {
    /// An execution on an order that was already final (its position counts).
    LateFill = 1,
    /// The venue executed more than the order quantity (CumQty > OrderQty).
    Overfill = 2,
    /// The venue canceled an execution (ExecType H): `exec_qty_delta` is negative.
    TradeCancel = 3,
    /// The venue corrected an execution (ExecType G): `exec_qty_delta` is new minus old.
    TradeCorrect = 4,
}

impl NoticeKind {
    /// Decodes the wire value.
    pub fn from_u8(v: u8) -> Option<NoticeKind> {
        use NoticeKind::*;
        [LateFill, Overfill, TradeCancel, TradeCorrect]
            .into_iter()
            .find(|k| *k as u8 == v)
    }
}

/// Gateway → engine: something the venue did to an order after the fact. The engine applies
/// `exec_qty_delta` to its position (in the order's side) and takes `cum_qty`/`leaves_qty`
/// as the order's new state, even when the order is final. 48 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Notice {
    /// Header, type [`msg_type::NOTICE`].
    pub header: Header,
    /// The engine's order id.
    pub cl_ord_id: U64,
    /// Change of the order's executed quantity (negative for a trade cancel).
    pub exec_qty_delta: I64,
    /// Price of the execution added or corrected (of the one removed, for a trade cancel).
    pub last_px: I64,
    /// Total executed after the change.
    pub cum_qty: U32,
    /// Quantity still open after the change (0: the order stays final).
    pub leaves_qty: U32,
    /// A [`NoticeKind`] value.
    pub kind: u8,
    /// Zero.
    pub pad: [u8; 7],
}

impl Notice {
    /// The kind (decode validated it).
    pub fn kind(&self) -> NoticeKind {
        NoticeKind::from_u8(self.kind).unwrap_or(NoticeKind::LateFill)
    }
}

/// Longest engine token (`[[risk.engines]] token`): configured tokens are 1..=32 bytes.
pub const TOKEN_LEN: usize = 32;

/// Engine → gateway: the first frame on an orders connection; the gateway processes no
/// request of the connection before it. 48 bytes.
///
/// The engine's token never travels: the logon carries a proof that the engine holds it,
/// a keyed BLAKE3 tag ([`rocebus::auth`], purpose `EngineLogon`) over the engine id, the
/// last response number and the orders connection's [`session_binding`] (both handshake
/// nonces, the gateway's fresh for every connection). A logon captured on one connection
/// is worthless on any other.
///
/// [`session_binding`]: rocebus::orders::Connection::session_binding
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Logon {
    /// Header, type [`msg_type::LOGON`].
    pub header: Header,
    /// The engine id its configuration grants accounts to (`[[risk.engines]]`).
    pub engine_id: U32,
    /// The last response sequence number ([`Header::seq`]) the engine processed (0: none);
    /// the gateway replays every later response it still has before new ones.
    pub last_response_seq: U32,
    /// [`logon_proof`] of the fields above with the engine's key.
    pub proof: [u8; auth::TAG_LEN],
    /// The oldest request number whose fate the engine does not know (sent, and neither
    /// confirmed taken by a logon answer nor listed as not taken); 0: none. The gateway
    /// lists its holes from there ([`RequestHoles`]). Not covered by the proof: it only
    /// narrows what the gateway tells this (authenticated) connection.
    pub oldest_unsure: U32,
    /// Zero.
    pub reserved: [u8; 12],
}

/// Outcome of a logon, on the wire in [`LogonAck::status`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum LogonStatus {
    /// The engine may send requests.
    Accepted = 0,
    /// No `[[risk.engines]]` entry has this id.
    UnknownEngine = 1,
    /// Another connection of this engine is live.
    AlreadyConnected = 2,
    /// The first frame was not a valid logon.
    BadLogon = 3,
    /// The engine's token does not match its `[[risk.engines]]` entry.
    BadToken = 4,
    /// The engine asked for responses after a sequence number the gateway never sent
    /// (`last_response_seq` above the gateway's last): the engine and gateway disagree on
    /// history (e.g. a journal was replaced), so nothing is replayed.
    BadSequence = 5,
    /// The responses after the engine's `last_response_seq` are no longer held (history
    /// bounded, see `gateway::RESPONSE_HISTORY`).
    ReplayUnavailable = 6,
}

impl LogonStatus {
    /// Decodes the wire value.
    pub fn from_u16(v: u16) -> Option<LogonStatus> {
        [
            LogonStatus::Accepted,
            LogonStatus::UnknownEngine,
            LogonStatus::AlreadyConnected,
            LogonStatus::BadLogon,
            LogonStatus::BadToken,
            LogonStatus::BadSequence,
            LogonStatus::ReplayUnavailable,
        ]
        .into_iter()
        .find(|s| *s as u16 == v)
    }
}

/// Gateway → engine: answer to [`Logon`]; anything but `Accepted` is followed by a
/// disconnect. 24 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct LogonAck {
    /// Header, type [`msg_type::LOGON_ACK`].
    pub header: Header,
    /// The engine id of the logon.
    pub engine_id: U32,
    /// A [`LogonStatus`].
    pub status: U16,
    /// The heartbeat interval, milliseconds, both ways ([`msg_type::HEARTBEAT`]): the
    /// gateway sends one this often and expects the engine to do the same (it disconnects
    /// an engine silent for its `engine_timeout_ms`). 0: this gateway sends none (an older
    /// one, which left the field zero).
    pub heartbeat_ms: U16,
    /// The gateway's last response sequence number for this engine: once the engine has
    /// processed this one, the replay of what it missed is complete (0 when refused).
    pub last_response_seq: U32,
    /// The highest request sequence number ([`Header::seq`]) of this engine the gateway has
    /// journaled (0 when refused or none): requests numbered above it were not taken.
    pub last_request_seq: U32,
}

/// The logon key an engine's token gives (both the engine and the gateway derive it).
pub fn engine_key(token: &[u8]) -> auth::Key {
    auth::Key::derive(token, auth::Purpose::EngineLogon)
}

/// The proof in a [`Logon`]: the engine id and last response number, bound to one orders
/// connection by its `binding` (`Connection::session_binding`).
pub fn logon_proof(
    key: &auth::Key,
    engine_id: u32,
    last_response_seq: u32,
    binding: &[u8],
) -> auth::Tag {
    key.tag(&[
        b"logon",
        &engine_id.to_le_bytes(),
        &last_response_seq.to_le_bytes(),
        binding,
    ])
}

impl Logon {
    /// Builds a logon frame for the connection whose session binding is `binding`.
    pub fn new(engine_id: u32, key: &auth::Key, last_response_seq: u32, binding: &[u8]) -> Logon {
        Logon {
            header: Header::new(msg_type::LOGON, size_of::<Logon>()),
            engine_id: U32::new(engine_id),
            last_response_seq: U32::new(last_response_seq),
            proof: logon_proof(key, engine_id, last_response_seq, binding),
            oldest_unsure: U32::ZERO,
            reserved: [0; 12],
        }
    }

    /// The same logon asking for the gateway's holes from request `seq` on (0: none).
    pub fn with_oldest_unsure(mut self, seq: u32) -> Logon {
        self.oldest_unsure = U32::new(seq);
        self
    }

    /// Whether the proof was made with `key` for the connection bound by `binding`
    /// (constant-time compare).
    pub fn verify(&self, key: &auth::Key, binding: &[u8]) -> bool {
        let parts: [&[u8]; 4] = [
            b"logon",
            &self.engine_id.get().to_le_bytes(),
            &self.last_response_seq.get().to_le_bytes(),
            binding,
        ];
        key.verify(&parts, &self.proof)
    }

    /// Decodes a logon frame.
    pub fn decode(bytes: &[u8]) -> Result<Logon, DecodeError> {
        check_header(bytes, |t| {
            (t == msg_type::LOGON).then_some(size_of::<Logon>())
        })?;
        read(bytes)
    }
}

/// A configured token zero-padded to [`TOKEN_LEN`]; `None` if empty or too long (the
/// length check of `[[risk.engines]] token`).
pub fn pad_token(token: &[u8]) -> Option<[u8; TOKEN_LEN]> {
    if token.is_empty() || token.len() > TOKEN_LEN {
        return None;
    }
    let mut out = [0u8; TOKEN_LEN];
    out[..token.len()].copy_from_slice(token);
    Some(out)
}

impl LogonAck {
    /// Builds a logon answer.
    pub fn new(
        engine_id: u32,
        status: LogonStatus,
        last_response_seq: u32,
        last_request_seq: u32,
    ) -> LogonAck {
        LogonAck {
            header: Header::new(msg_type::LOGON_ACK, size_of::<LogonAck>()),
            engine_id: U32::new(engine_id),
            status: U16::new(status as u16),
            heartbeat_ms: U16::ZERO,
            last_response_seq: U32::new(last_response_seq),
            last_request_seq: U32::new(last_request_seq),
        }
    }

    /// The same answer announcing heartbeats every `ms` milliseconds (at most 65535).
    pub fn with_heartbeat_ms(mut self, ms: u16) -> LogonAck {
        self.heartbeat_ms = U16::new(ms);
        self
    }

    /// Decodes a logon answer (the status must be a known value).
    pub fn decode(bytes: &[u8]) -> Result<(LogonAck, LogonStatus), DecodeError> {
        check_header(bytes, |t| {
            (t == msg_type::LOGON_ACK).then_some(size_of::<LogonAck>())
        })?;
        let m: LogonAck = read(bytes)?;
        let s = LogonStatus::from_u16(m.status.get()).ok_or(DecodeError::InvalidField("status"))?;
        Ok((m, s))
    }
}

/// Request numbers in one [`RequestHoles`] frame at most.
pub const HOLES_PER_FRAME: usize = 60;

/// Gateway → engine, after a logon it accepts and before its [`LogonAck`]: request numbers
/// at or above the logon's [`Logon::oldest_unsure`] and below
/// [`LogonAck::last_request_seq`] that the gateway never took (holes: a request answered
/// "not taken" while later ones were taken). An engine must not take those for taken: it
/// sends them again (the gateway takes a hole when it comes). In ascending order over one
/// or more frames; `more` set on the last frame sent says the gateway had more holes than
/// it sends (the engine then treats every request above the last listed one as unsure).
/// Unnumbered. 252 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RequestHoles {
    /// Header, type [`msg_type::REQUEST_HOLES`].
    pub header: Header,
    /// Entries of `seqs` in use (1..=[`HOLES_PER_FRAME`]).
    pub count: U16,
    /// 1: holes beyond these were not sent; 0 otherwise.
    pub more: U16,
    /// The hole request numbers, ascending; entries past `count` are zero.
    pub seqs: [U32; HOLES_PER_FRAME],
}

const _: () = assert!(size_of::<RequestHoles>() == 252);

impl RequestHoles {
    /// A frame listing `seqs` (at most [`HOLES_PER_FRAME`], ascending).
    pub fn new(seqs: &[u32], more: bool) -> RequestHoles {
        let mut m = RequestHoles {
            header: Header::new(msg_type::REQUEST_HOLES, size_of::<RequestHoles>()),
            count: U16::new(seqs.len().min(HOLES_PER_FRAME) as u16),
            more: U16::new(u16::from(more)),
            seqs: [U32::ZERO; HOLES_PER_FRAME],
        };
        for (d, s) in m.seqs.iter_mut().zip(seqs) {
            *d = U32::new(*s);
        }
        m
    }

    /// The listed numbers.
    pub fn holes(&self) -> impl Iterator<Item = u32> + '_ {
        self.seqs[..usize::from(self.count.get())]
            .iter()
            .map(|s| s.get())
    }

    /// Decodes a holes frame (the count must be 1..=[`HOLES_PER_FRAME`], `more` 0 or 1).
    pub fn decode(bytes: &[u8]) -> Result<RequestHoles, DecodeError> {
        check_header(bytes, |t| {
            (t == msg_type::REQUEST_HOLES).then_some(size_of::<RequestHoles>())
        })?;
        let m: RequestHoles = read(bytes)?;
        if !(1..=HOLES_PER_FRAME).contains(&usize::from(m.count.get())) {
            return Err(DecodeError::InvalidField("count"));
        }
        if m.more.get() > 1 {
            return Err(DecodeError::InvalidField("more"));
        }
        Ok(m)
    }
}

/// Both ways: "still here" ([`msg_type::HEARTBEAT`]), unnumbered (`seq` zero); any frame
/// counts as a sign of life, so a side that is sending anyway need not add these. 16 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Heartbeat {
    /// Header, type [`msg_type::HEARTBEAT`].
    pub header: Header,
    /// The sender's clock, nanoseconds since the UNIX epoch (diagnostics only).
    pub sent_ns: U64,
}

impl Heartbeat {
    /// A heartbeat stamped `sent_ns`.
    pub fn new(sent_ns: u64) -> Heartbeat {
        Heartbeat {
            header: Header::new(msg_type::HEARTBEAT, size_of::<Heartbeat>()),
            sent_ns: U64::new(sent_ns),
        }
    }

    /// Decodes a heartbeat.
    pub fn decode(bytes: &[u8]) -> Result<Heartbeat, DecodeError> {
        check_header(bytes, |t| {
            (t == msg_type::HEARTBEAT).then_some(size_of::<Heartbeat>())
        })?;
        read(bytes)
    }
}

const _: () = assert!(size_of::<Header>() == 8);
const _: () = assert!(size_of::<Heartbeat>() == 16);
const _: () = assert!(size_of::<Logon>() == 48);
const _: () = assert!(size_of::<LogonAck>() == 24);
const _: () = assert!(size_of::<NewOrder>() == 48);
const _: () = assert!(size_of::<Cancel>() == 16);
const _: () = assert!(size_of::<Replace>() == 32);
const _: () = assert!(size_of::<MassCancel>() == 24);
const _: () = assert!(size_of::<Ack>() == 24);
const _: () = assert!(size_of::<Reject>() == 24);
const _: () = assert!(size_of::<Fill>() == 40);
const _: () = assert!(size_of::<Canceled>() == 24);
const _: () = assert!(size_of::<Replaced>() == 32);
const _: () = assert!(size_of::<OrderStatus>() == 40);
const _: () = assert!(size_of::<Notice>() == 48);

/// Why a frame could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than a header or than the header's length.
    #[error("frame truncated")]
    Truncated,
    /// Header length disagrees with the size of its message type.
    #[error("bad frame length {0}")]
    BadLength(u16),
    /// Unsupported protocol version.
    #[error("unsupported version {0}")]
    BadVersion(u8),
    /// Unknown message type.
    #[error("unknown message type {0:#x}")]
    UnknownType(u8),
    /// A field holds a value outside its domain (side, tif, reason, symbol).
    #[error("invalid field {0}")]
    InvalidField(&'static str),
}

/// A decoded engine request (copied out of the frame: each is at most 48 bytes).
#[derive(Clone, Copy, Debug)]
pub enum Request {
    /// New order.
    NewOrder(NewOrder),
    /// Cancel.
    Cancel(Cancel),
    /// Replace.
    Replace(Replace),
    /// Mass cancel.
    MassCancel(MassCancel),
}

/// A decoded gateway response.
#[derive(Clone, Copy, Debug)]
pub enum Response {
    /// Ack.
    Ack(Ack),
    /// Reject.
    Reject(Reject),
    /// Fill or partial fill (see the header type).
    Fill(Fill),
    /// Canceled.
    Canceled(Canceled),
    /// Replaced.
    Replaced(Replaced),
    /// Order status (unnumbered, informational).
    Status(OrderStatus),
    /// Notice (informational, applies to final orders too).
    Notice(Notice),
}

/// Validates the header of `bytes` against the expected frame size of its type.
fn check_header(
    bytes: &[u8],
    size_of_type: impl Fn(u8) -> Option<usize>,
) -> Result<(u8, usize), DecodeError> {
    let (h, _) = Header::read_from_prefix(bytes).map_err(|_| DecodeError::Truncated)?;
    if h.version != VERSION {
        return Err(DecodeError::BadVersion(h.version));
    }
    let size = size_of_type(h.msg_type).ok_or(DecodeError::UnknownType(h.msg_type))?;
    if usize::from(h.length.get()) != size {
        return Err(DecodeError::BadLength(h.length.get()));
    }
    if bytes.len() < size {
        return Err(DecodeError::Truncated);
    }
    Ok((h.msg_type, size))
}

fn read<T: FromBytes>(bytes: &[u8]) -> Result<T, DecodeError> {
    T::read_from_prefix(bytes)
        .map(|(t, _)| t)
        .map_err(|_| DecodeError::Truncated)
}

impl Request {
    /// Decodes one request from the front of `bytes`; returns it and the frame length.
    pub fn decode(bytes: &[u8]) -> Result<(Request, usize), DecodeError> {
        let (ty, size) = check_header(bytes, |t| match t {
            msg_type::NEW_ORDER => Some(size_of::<NewOrder>()),
            msg_type::CANCEL => Some(size_of::<Cancel>()),
            msg_type::REPLACE => Some(size_of::<Replace>()),
            msg_type::MASS_CANCEL => Some(size_of::<MassCancel>()),
            _ => None,
        })?;
        let req = match ty {
            msg_type::NEW_ORDER => {
                let m: NewOrder = read(bytes)?;
                if Side::from_u8(m.side).is_none() {
                    return Err(DecodeError::InvalidField("side"));
                }
                if TimeInForce::from_u8(m.tif).is_none() {
                    return Err(DecodeError::InvalidField("tif"));
                }
                // Canonical form only (space padding), so symbols compare equal as map keys.
                if Symbol::from_bytes(m.symbol.as_bytes()) != Some(m.symbol) {
                    return Err(DecodeError::InvalidField("symbol"));
                }
                Request::NewOrder(m)
            }
            msg_type::CANCEL => Request::Cancel(read(bytes)?),
            msg_type::REPLACE => Request::Replace(read(bytes)?),
            _ => Request::MassCancel(read(bytes)?),
        };
        Ok((req, size))
    }

    /// The request sequence number ([`Header::seq`]; 0: unnumbered).
    pub fn seq(&self) -> u32 {
        self.header().seq.get()
    }

    /// Numbers the request.
    pub fn set_seq(&mut self, seq: u32) {
        let h = match self {
            Request::NewOrder(m) => &mut m.header,
            Request::Cancel(m) => &mut m.header,
            Request::Replace(m) => &mut m.header,
            Request::MassCancel(m) => &mut m.header,
        };
        h.seq = U32::new(seq);
    }

    fn header(&self) -> &Header {
        match self {
            Request::NewOrder(m) => &m.header,
            Request::Cancel(m) => &m.header,
            Request::Replace(m) => &m.header,
            Request::MassCancel(m) => &m.header,
        }
    }

    /// The message type ([`msg_type`]).
    pub fn msg_type(&self) -> u8 {
        self.header().msg_type
    }

    /// The engine's client order id the request refers to (0 for MassCancel).
    pub fn cl_ord_id(&self) -> u64 {
        match self {
            Request::NewOrder(m) => m.cl_ord_id.get(),
            Request::Cancel(m) => m.cl_ord_id.get(),
            Request::Replace(m) => m.cl_ord_id.get(),
            Request::MassCancel(_) => 0,
        }
    }

    /// The request's wire bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Request::NewOrder(m) => m.as_bytes(),
            Request::Cancel(m) => m.as_bytes(),
            Request::Replace(m) => m.as_bytes(),
            Request::MassCancel(m) => m.as_bytes(),
        }
    }
}

impl NewOrder {
    /// Builds a new-order frame.
    pub fn new(
        cl_ord_id: u64,
        account: u32,
        symbol: Symbol,
        side: Side,
        qty: u32,
        price: i64,
        tif: TimeInForce,
    ) -> NewOrder {
        NewOrder {
            header: Header::new(msg_type::NEW_ORDER, size_of::<NewOrder>()),
            cl_ord_id: U64::new(cl_ord_id),
            account: U32::new(account),
            qty: U32::new(qty),
            price: I64::new(price),
            symbol,
            side: side as u8,
            tif: tif as u8,
            pad: [0; 6],
        }
    }

    /// The side (validated by [`Request::decode`]; Buy for an unvalidated bad byte).
    pub fn side(&self) -> Side {
        Side::from_u8(self.side).unwrap_or(Side::Buy)
    }

    /// The time in force (Day for an unvalidated bad byte).
    pub fn tif(&self) -> TimeInForce {
        TimeInForce::from_u8(self.tif).unwrap_or(TimeInForce::Day)
    }
}

impl Cancel {
    /// Builds a cancel frame.
    pub fn new(cl_ord_id: u64) -> Cancel {
        Cancel {
            header: Header::new(msg_type::CANCEL, size_of::<Cancel>()),
            cl_ord_id: U64::new(cl_ord_id),
        }
    }
}

impl Replace {
    /// Builds a replace frame.
    pub fn new(cl_ord_id: u64, qty: u32, price: i64) -> Replace {
        Replace {
            header: Header::new(msg_type::REPLACE, size_of::<Replace>()),
            cl_ord_id: U64::new(cl_ord_id),
            qty: U32::new(qty),
            pad: U32::ZERO,
            price: I64::new(price),
        }
    }
}

impl MassCancel {
    /// Builds a mass-cancel frame; `account` 0 and a blank symbol widen the scope.
    pub fn new(account: u32, symbol: Symbol) -> MassCancel {
        MassCancel {
            header: Header::new(msg_type::MASS_CANCEL, size_of::<MassCancel>()),
            account: U32::new(account),
            pad: U32::ZERO,
            symbol,
        }
    }
}

impl Response {
    /// Decodes one response from the front of `bytes`; returns it and the frame length.
    pub fn decode(bytes: &[u8]) -> Result<(Response, usize), DecodeError> {
        let (ty, size) = check_header(bytes, |t| match t {
            msg_type::ACK => Some(size_of::<Ack>()),
            msg_type::REJECT => Some(size_of::<Reject>()),
            msg_type::FILL | msg_type::PARTIAL_FILL => Some(size_of::<Fill>()),
            msg_type::CANCELED => Some(size_of::<Canceled>()),
            msg_type::REPLACED => Some(size_of::<Replaced>()),
            msg_type::STATUS => Some(size_of::<OrderStatus>()),
            msg_type::NOTICE => Some(size_of::<Notice>()),
            _ => None,
        })?;
        let resp = match ty {
            msg_type::ACK => Response::Ack(read(bytes)?),
            msg_type::REJECT => {
                let m: Reject = read(bytes)?;
                if RejectReason::from_u16(m.reason.get()).is_none() {
                    return Err(DecodeError::InvalidField("reason"));
                }
                Response::Reject(m)
            }
            msg_type::FILL | msg_type::PARTIAL_FILL => Response::Fill(read(bytes)?),
            msg_type::CANCELED => Response::Canceled(read(bytes)?),
            msg_type::STATUS => {
                let m: OrderStatus = read(bytes)?;
                if OrdState::from_u8(m.state).is_none() {
                    return Err(DecodeError::InvalidField("state"));
                }
                Response::Status(m)
            }
            msg_type::NOTICE => {
                let m: Notice = read(bytes)?;
                if NoticeKind::from_u8(m.kind).is_none() {
                    return Err(DecodeError::InvalidField("kind"));
                }
                Response::Notice(m)
            }
            _ => Response::Replaced(read(bytes)?),
        };
        Ok((resp, size))
    }

    /// The response's wire bytes.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Response::Ack(m) => m.as_bytes(),
            Response::Reject(m) => m.as_bytes(),
            Response::Fill(m) => m.as_bytes(),
            Response::Canceled(m) => m.as_bytes(),
            Response::Replaced(m) => m.as_bytes(),
            Response::Status(m) => m.as_bytes(),
            Response::Notice(m) => m.as_bytes(),
        }
    }

    /// The response sequence number stamped by the gateway ([`Header::seq`]; 0: unstamped).
    pub fn seq(&self) -> u32 {
        self.header().seq.get()
    }

    /// Stamps the response sequence number.
    pub fn set_seq(&mut self, seq: u32) {
        let h = match self {
            Response::Ack(m) => &mut m.header,
            Response::Reject(m) => &mut m.header,
            Response::Fill(m) => &mut m.header,
            Response::Canceled(m) => &mut m.header,
            Response::Replaced(m) => &mut m.header,
            Response::Status(m) => &mut m.header,
            Response::Notice(m) => &mut m.header,
        };
        h.seq = U32::new(seq);
    }

    fn header(&self) -> &Header {
        match self {
            Response::Ack(m) => &m.header,
            Response::Reject(m) => &m.header,
            Response::Fill(m) => &m.header,
            Response::Canceled(m) => &m.header,
            Response::Replaced(m) => &m.header,
            Response::Status(m) => &m.header,
            Response::Notice(m) => &m.header,
        }
    }

    /// The engine's client order id the response is about.
    pub fn cl_ord_id(&self) -> u64 {
        match self {
            Response::Ack(m) => m.cl_ord_id.get(),
            Response::Reject(m) => m.cl_ord_id.get(),
            Response::Fill(m) => m.cl_ord_id.get(),
            Response::Canceled(m) => m.cl_ord_id.get(),
            Response::Replaced(m) => m.cl_ord_id.get(),
            Response::Status(m) => m.cl_ord_id.get(),
            Response::Notice(m) => m.cl_ord_id.get(),
        }
    }

    /// Builds an ack.
    pub fn ack(cl_ord_id: u64, order_id: u64) -> Response {
        Response::Ack(Ack {
            header: Header::new(msg_type::ACK, size_of::<Ack>()),
            cl_ord_id: U64::new(cl_ord_id),
            order_id: U64::new(order_id),
        })
    }

    /// Builds a reject of a request of type `request`.
    pub fn reject(cl_ord_id: u64, request: u8, reason: RejectReason) -> Response {
        Response::Reject(Reject {
            header: Header::new(msg_type::REJECT, size_of::<Reject>()),
            cl_ord_id: U64::new(cl_ord_id),
            reason: U16::new(reason as u16),
            request,
            pad: [0; 5],
        })
    }

    /// Builds a fill (`leaves_qty == 0`) or partial fill.
    pub fn fill(
        cl_ord_id: u64,
        last_qty: u32,
        last_px: i64,
        cum_qty: u32,
        leaves_qty: u32,
    ) -> Response {
        let ty = if leaves_qty == 0 {
            msg_type::FILL
        } else {
            msg_type::PARTIAL_FILL
        };
        Response::Fill(Fill {
            header: Header::new(ty, size_of::<Fill>()),
            cl_ord_id: U64::new(cl_ord_id),
            last_qty: U32::new(last_qty),
            leaves_qty: U32::new(leaves_qty),
            last_px: I64::new(last_px),
            cum_qty: U32::new(cum_qty),
            pad: U32::ZERO,
        })
    }

    /// Builds a canceled notice.
    pub fn canceled(cl_ord_id: u64, canceled_qty: u32) -> Response {
        Response::Canceled(Canceled {
            header: Header::new(msg_type::CANCELED, size_of::<Canceled>()),
            cl_ord_id: U64::new(cl_ord_id),
            canceled_qty: U32::new(canceled_qty),
            pad: U32::ZERO,
        })
    }

    /// Builds an unnumbered order status answering a re-sent request.
    #[allow(clippy::too_many_arguments)]
    pub fn status(
        cl_ord_id: u64,
        state: OrdState,
        qty: u32,
        cum_qty: u32,
        price: i64,
        request: u8,
        reason: Option<RejectReason>,
        request_seq: u32,
    ) -> Response {
        Response::Status(OrderStatus {
            header: Header::new(msg_type::STATUS, size_of::<OrderStatus>()),
            cl_ord_id: U64::new(cl_ord_id),
            qty: U32::new(qty),
            cum_qty: U32::new(cum_qty),
            price: I64::new(price),
            state: state as u8,
            request,
            reason: U16::new(reason.map_or(0, |r| r as u16)),
            request_seq: U32::new(request_seq),
        })
    }

    /// Builds a notice.
    pub fn notice(
        cl_ord_id: u64,
        kind: NoticeKind,
        exec_qty_delta: i64,
        last_px: i64,
        cum_qty: u32,
        leaves_qty: u32,
    ) -> Response {
        Response::Notice(Notice {
            header: Header::new(msg_type::NOTICE, size_of::<Notice>()),
            cl_ord_id: U64::new(cl_ord_id),
            exec_qty_delta: I64::new(exec_qty_delta),
            last_px: I64::new(last_px),
            cum_qty: U32::new(cum_qty),
            leaves_qty: U32::new(leaves_qty),
            kind: kind as u8,
            pad: [0; 7],
        })
    }

    /// Builds a replaced notice.
    pub fn replaced(cl_ord_id: u64, qty: u32, leaves_qty: u32, price: i64) -> Response {
        Response::Replaced(Replaced {
            header: Header::new(msg_type::REPLACED, size_of::<Replaced>()),
            cl_ord_id: U64::new(cl_ord_id),
            qty: U32::new(qty),
            leaves_qty: U32::new(leaves_qty),
            price: I64::new(price),
        })
    }
}

impl Reject {
    /// The reason (decode validated it; `Malformed` for an unvalidated bad value).
    pub fn reason(&self) -> RejectReason {
        RejectReason::from_u16(self.reason.get()).unwrap_or(RejectReason::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NewOrder{cl_ord_id 0x0102030405060708, account 7, qty 100, price 1_234_500, "AAPL", Buy, Day}.
    static NEW_ORDER_BYTES: [u8; 48] = [
        b'N', 1, 48, 0, 0, 0, 0, 0, // header
        8, 7, 6, 5, 4, 3, 2, 1, // cl_ord_id
        7, 0, 0, 0, // account
        100, 0, 0, 0, // qty
        0x44, 0xD6, 0x12, 0, 0, 0, 0, 0, // price 1_234_500
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ', // symbol
        b'B', b'0', 0, 0, 0, 0, 0, 0, // side, tif, pad
    ];

    /// Reject{cl_ord_id 9, reason PriceCollar (5), request 'N'}.
    static REJECT_BYTES: [u8; 24] = [
        b'j', 1, 24, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 5, 0, b'N', 0, 0, 0, 0, 0,
    ];

    #[test]
    fn new_order_fixed_bytes() {
        let sym = Symbol::new("AAPL").unwrap();
        let m = NewOrder::new(
            0x0102_0304_0506_0708,
            7,
            sym,
            Side::Buy,
            100,
            1_234_500,
            TimeInForce::Day,
        );
        assert_eq!(m.as_bytes(), &NEW_ORDER_BYTES);
        let (Request::NewOrder(d), n) = Request::decode(&NEW_ORDER_BYTES).unwrap() else {
            panic!("wrong type")
        };
        assert_eq!(n, 48);
        assert_eq!(d.cl_ord_id.get(), 0x0102_0304_0506_0708);
        assert_eq!(d.price.get(), 1_234_500);
        assert_eq!(d.symbol, sym);
        assert_eq!(d.side(), Side::Buy);
    }

    /// Logon{engine 3, last seq 5, proof zero}; LogonAck{engine 3, AlreadyConnected, last 9}.
    static LOGON_BYTES: [u8; 48] = [
        b'L', 1, 48, 0, 0, 0, 0, 0, // header
        3, 0, 0, 0, // engine
        5, 0, 0, 0, // last response seq
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // proof (set in the test)
        0, 0, 0, 0, // oldest unsure
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // reserved
    ];
    static LOGON_ACK_BYTES: [u8; 24] = [
        b'l', 1, 24, 0, 0, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0,
    ];

    #[test]
    fn logon_fixed_bytes() {
        let (key, binding) = (engine_key(b"k"), [7u8; 32]);
        let mut bytes = LOGON_BYTES;
        bytes[16..32].copy_from_slice(&logon_proof(&key, 3, 5, &binding));
        assert_eq!(Logon::new(3, &key, 5, &binding).as_bytes(), &bytes);
        let l = Logon::decode(&bytes).unwrap();
        assert_eq!((l.engine_id.get(), l.last_response_seq.get()), (3, 5));
        // The proof holds for this key and connection only, and covers the fields.
        assert!(l.verify(&key, &binding));
        assert!(!l.verify(&engine_key(b"j"), &binding));
        assert!(!l.verify(&key, &[8u8; 32]));
        let mut other = l;
        other.engine_id = U32::new(4);
        assert!(!other.verify(&key, &binding));
        assert!(!Logon::decode(&LOGON_BYTES).unwrap().verify(&key, &binding));
        // The oldest unsure request rides after the proof, outside it.
        let asked = Logon::new(3, &key, 5, &binding).with_oldest_unsure(0x0102_0304);
        assert_eq!(&asked.as_bytes()[32..36], &[4, 3, 2, 1]);
        assert!(asked.verify(&key, &binding));
        assert!(pad_token(b"").is_none());
        assert!(pad_token(&[b'x'; TOKEN_LEN + 1]).is_none());
        assert!(pad_token(&[b'x'; TOKEN_LEN]).is_some());
        let ack = LogonAck::new(3, LogonStatus::AlreadyConnected, 9, 0);
        assert_eq!(ack.as_bytes(), &LOGON_ACK_BYTES);
        let (m, s) = LogonAck::decode(&LOGON_ACK_BYTES).unwrap();
        assert_eq!(
            (m.engine_id.get(), s, m.last_response_seq.get()),
            (3, LogonStatus::AlreadyConnected, 9)
        );
        let mut bad = LOGON_ACK_BYTES;
        bad[12] = 9;
        assert_eq!(
            LogonAck::decode(&bad).unwrap_err(),
            DecodeError::InvalidField("status")
        );
        for s in [
            LogonStatus::BadToken,
            LogonStatus::BadSequence,
            LogonStatus::ReplayUnavailable,
        ] {
            assert_eq!(LogonStatus::from_u16(s as u16), Some(s));
        }
        assert!(Logon::decode(&LOGON_BYTES[..47]).is_err());
        assert!(Logon::decode(&LOGON_ACK_BYTES).is_err());
        assert!(Request::decode(&LOGON_BYTES).is_err());
    }

    #[test]
    fn heartbeat_fixed_bytes_and_logon_ack_interval() {
        const HEARTBEAT_BYTES: [u8; 16] = [
            b'h', 1, 16, 0, 0, 0, 0, 0, // header, unnumbered
            0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, // sent_ns
        ];
        let h = Heartbeat::new(0x0102_0304_0506_0708);
        assert_eq!(h.as_bytes(), &HEARTBEAT_BYTES);
        assert_eq!(
            Heartbeat::decode(&HEARTBEAT_BYTES).unwrap().sent_ns.get(),
            0x0102_0304_0506_0708
        );
        assert_eq!(
            Heartbeat::decode(&HEARTBEAT_BYTES[..15]).unwrap_err(),
            DecodeError::Truncated
        );
        // Not a request: an engine's heartbeat never reaches the order path as one.
        assert!(Request::decode(&HEARTBEAT_BYTES).is_err());
        assert!(Response::decode(&HEARTBEAT_BYTES).is_err());
        // The interval rides in the logon answer's former padding (bytes 14..16).
        let ack = LogonAck::new(3, LogonStatus::Accepted, 0, 0).with_heartbeat_ms(250);
        assert_eq!(&ack.as_bytes()[14..16], &[250, 0]);
        let (m, _) = LogonAck::decode(ack.as_bytes()).unwrap();
        assert_eq!(m.heartbeat_ms.get(), 250);
    }

    #[test]
    fn response_seq_lives_in_the_header() {
        let mut r = Response::fill(4, 1, 2, 3, 0);
        assert_eq!(r.seq(), 0);
        r.set_seq(0x0102_0304);
        assert_eq!(&r.as_bytes()[4..8], &[4, 3, 2, 1]);
        let (d, _) = Response::decode(r.as_bytes()).unwrap();
        assert_eq!(d.seq(), 0x0102_0304);
    }

    #[test]
    fn reject_fixed_bytes() {
        let r = Response::reject(9, msg_type::NEW_ORDER, RejectReason::PriceCollar);
        assert_eq!(r.as_bytes(), &REJECT_BYTES);
        let (Response::Reject(d), _) = Response::decode(&REJECT_BYTES).unwrap() else {
            panic!("wrong type")
        };
        assert_eq!(d.reason(), RejectReason::PriceCollar);
    }

    #[test]
    fn round_trips() {
        let sym = Symbol::new("MSFT").unwrap();
        for req in [
            Request::Cancel(Cancel::new(5)),
            Request::Replace(Replace::new(5, 10, -3)),
            Request::MassCancel(MassCancel::new(0, sym)),
        ] {
            let (d, n) = Request::decode(req.as_bytes()).unwrap();
            assert_eq!(n, req.as_bytes().len());
            assert_eq!(d.as_bytes(), req.as_bytes());
        }
        for resp in [
            Response::ack(1, 2),
            Response::fill(1, 10, 5, 10, 0),
            Response::fill(1, 10, 5, 10, 3),
            Response::canceled(1, 4),
            Response::replaced(1, 9, 3, 77),
        ] {
            let (d, n) = Response::decode(resp.as_bytes()).unwrap();
            assert_eq!(n, resp.as_bytes().len());
            assert_eq!(d.as_bytes(), resp.as_bytes());
        }
    }

    #[test]
    fn decode_rejects_bad_input() {
        assert_eq!(Request::decode(&[]).unwrap_err(), DecodeError::Truncated);
        assert_eq!(
            Request::decode(&NEW_ORDER_BYTES[..47]).unwrap_err(),
            DecodeError::Truncated
        );
        let mut b = NEW_ORDER_BYTES;
        b[0] = b'?';
        assert_eq!(
            Request::decode(&b).unwrap_err(),
            DecodeError::UnknownType(b'?')
        );
        let mut b = NEW_ORDER_BYTES;
        b[1] = 9;
        assert_eq!(Request::decode(&b).unwrap_err(), DecodeError::BadVersion(9));
        let mut b = NEW_ORDER_BYTES;
        b[2] = 47;
        assert_eq!(Request::decode(&b).unwrap_err(), DecodeError::BadLength(47));
        let mut b = NEW_ORDER_BYTES;
        b[40] = b'X';
        assert_eq!(
            Request::decode(&b).unwrap_err(),
            DecodeError::InvalidField("side")
        );
        let mut b = NEW_ORDER_BYTES;
        b[32] = 0;
        assert_eq!(
            Request::decode(&b).unwrap_err(),
            DecodeError::InvalidField("symbol")
        );
        // Responses are not requests.
        assert!(Request::decode(&REJECT_BYTES).is_err());
        let mut b = REJECT_BYTES;
        b[16] = 200;
        assert_eq!(
            Response::decode(&b).unwrap_err(),
            DecodeError::InvalidField("reason")
        );
    }

    #[test]
    fn decode_never_panics_on_any_prefix_or_byte_flip() {
        for len in 0..=NEW_ORDER_BYTES.len() {
            let _ = Request::decode(&NEW_ORDER_BYTES[..len]);
        }
        for i in 0..NEW_ORDER_BYTES.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = NEW_ORDER_BYTES;
                b[i] = v;
                let _ = Request::decode(&b);
                let _ = Response::decode(&b);
            }
        }
    }

    #[test]
    fn symbol_rules() {
        assert!(Symbol::new("").is_none());
        assert!(Symbol::new("TOOLONGSYM").is_none());
        assert!(Symbol::new("A B").is_none());
        assert_eq!(Symbol::new("IBM").unwrap().as_str(), "IBM");
        assert!(Symbol([b' '; 8]).is_blank());
    }
}

#[cfg(test)]
mod holes_tests {
    use super::*;

    #[test]
    fn request_holes_round_trip_and_refuse_bad_counts() {
        let m = RequestHoles::new(&[3, 9, 0x0102_0304], true);
        let b = m.as_bytes();
        assert_eq!(b.len(), 252);
        assert_eq!(&b[..4], &[b'H', VERSION, 252, 0]);
        assert_eq!(&b[8..12], &[3, 0, 1, 0], "count 3, more 1");
        assert_eq!(&b[12..16], &[3, 0, 0, 0]);
        assert_eq!(&b[20..24], &[4, 3, 2, 1]);
        let d = RequestHoles::decode(b).unwrap();
        assert_eq!(d.holes().collect::<Vec<_>>(), [3, 9, 0x0102_0304]);
        assert_eq!(d.more.get(), 1);
        let mut zero = m;
        zero.count = U16::ZERO;
        assert_eq!(
            RequestHoles::decode(zero.as_bytes()).unwrap_err(),
            DecodeError::InvalidField("count")
        );
        let mut big = m;
        big.count = U16::new(HOLES_PER_FRAME as u16 + 1);
        assert!(RequestHoles::decode(big.as_bytes()).is_err());
        let mut more = m;
        more.more = U16::new(2);
        assert!(RequestHoles::decode(more.as_bytes()).is_err());
        assert!(RequestHoles::decode(&b[..251]).is_err());
        // A full frame takes HOLES_PER_FRAME numbers and no more.
        let all: Vec<u32> = (1..=HOLES_PER_FRAME as u32 + 5).collect();
        let f = RequestHoles::new(&all, false);
        assert_eq!(f.holes().count(), HOLES_PER_FRAME);
    }
}
