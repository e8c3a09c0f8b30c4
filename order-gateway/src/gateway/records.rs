//! What the gateway writes to the journal: the record kinds ([`record`]) and the payloads
//! whose layout is the gateway's ([`Decision`] and its [`DecisionTrailer`], the engine
//! session events, the kept bytes of a malformed frame). Journals are read back by
//! recovery and by `order-gateway journal`, so these layouts only ever grow.
//!
//! Must not touch sockets or files.

use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::proto::Symbol;

/// Journal record kinds.
pub mod record {
    /// Raw engine request: `engine u32 LE` + frame bytes.
    pub const ENGINE_REQUEST: u8 = 1;
    /// A risk/gateway decision: [`super::Decision`].
    pub const DECISION: u8 = 2;
    /// FIX frames sent: one per record (journals of earlier versions may hold several).
    pub const FIX_OUT: u8 = 3;
    /// One FIX frame received and processed in sequence.
    pub const FIX_IN: u8 = 4;
    /// An engine session event: `engine u32 LE` + [`super::SESSION_LOGON`] or
    /// [`super::SESSION_DISCONNECT`].
    pub const ENGINE_SESSION: u8 = 5;
    /// A kill switch turned on or off: scope `u8` (0 global, 1 engine, 2 account), id
    /// `u32 LE`, on `u8`.
    pub const KILL: u8 = 6;
    /// An engine frame that did not decode: `engine u32 LE`, the frame's length `u32 LE`,
    /// then at most [`super::MALFORMED_KEPT`] of its first bytes (what its reject is made
    /// of), so garbage costs the journal a bounded record.
    pub const ENGINE_MALFORMED: u8 = 7;
    /// A checkpoint: the whole recoverable state ([`crate::checkpoint`]), first record of a
    /// journal segment.
    pub const CHECKPOINT: u8 = 8;
    /// One FIX frame received and rejected at the session level (a CompID or SendingTime
    /// problem) whose sequence number was taken: replay takes the number, and applies
    /// nothing of the message.
    pub const FIX_IN_REJECTED: u8 = 9;
    /// An accepted request whose order message never reached the journal (the gateway
    /// stopped between the two records), answered `NotSent` at the next start: its FIX
    /// ClOrdID, `u64 LE`. Replayed, it closes the request again, so the answer is given once.
    pub const NOT_SENT: u8 = 10;
}

/// Bytes of a malformed engine frame the journal keeps.
pub const MALFORMED_KEPT: usize = 64;

/// [`Decision`] trailer `origin`: the engine's own request (counted by the throttles).
pub const ORIGIN_ENGINE: u8 = 0;
/// [`Decision`] trailer `origin`: a cancel the gateway made (kill switch, cancel-all, mass
/// cancel, cancel-on-disconnect); never throttled.
pub const ORIGIN_GATEWAY: u8 = 1;

/// What follows a [`Decision`] in its journal record: when it was decided and who asked,
/// so recovery rebuilds the throttle and repeated-order windows. Journals written before it
/// existed have bare decisions: those replay without their windows.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DecisionTrailer {
    /// Decision time, nanoseconds since the UNIX epoch.
    pub now: U64,
    /// [`ORIGIN_ENGINE`] or [`ORIGIN_GATEWAY`].
    pub origin: u8,
}

const _: () = assert!(size_of::<DecisionTrailer>() == 9);

/// [`record::ENGINE_SESSION`] event: the engine logged on.
pub const SESSION_LOGON: u8 = 1;
/// [`record::ENGINE_SESSION`] event: the engine's connection ended (cancel-on-disconnect ran).
pub const SESSION_DISCONNECT: u8 = 2;

/// Journal payload of a decision on an engine request. 48 bytes, little-endian.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Decision {
    /// Engine.
    pub engine: U32,
    /// Account.
    pub account: U32,
    /// Engine's order id.
    pub cl_ord_id: U64,
    /// Gateway order id (0 when rejected).
    pub order_id: U64,
    /// Gateway request id (= FIX ClOrdID of the request; 0 when rejected).
    pub request_id: U64,
    /// Price (new order or replace).
    pub price: I64,
    /// Quantity (new order or replace).
    pub qty: U32,
    /// 0 = accepted, else a [`RejectReason`](crate::proto::RejectReason).
    pub reason: U16,
    /// Request type ([`msg_type`](crate::proto::msg_type)).
    pub request: u8,
    /// Side byte.
    pub side: u8,
    /// Symbol.
    pub symbol: Symbol,
}

const _: () = assert!(size_of::<Decision>() == 56);
