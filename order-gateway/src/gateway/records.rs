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
    /// A checkpoint cut (empty payload): the state here is the one the next segment's
    /// checkpoint holds. Applied where it stands, live and in replay
    /// ([`crate::gateway::Gateway::checkpoint_written`]: orders final before the previous
    /// cut are forgotten); the checkpoint itself is built afterwards, off the service
    /// thread, by replaying the segment up to this record ([`crate::checkpoint_writer`]).
    pub const CUT: u8 = crate::journal::CUT;
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

/// One decoded field of a record, for `order-gateway journal dump`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Field {
    /// A number.
    Int(i128),
    /// Text (FIX frames with SOH shown as `|`, names, symbols).
    Text(String),
}

/// The name of a record kind this gateway writes, `None` for a kind it does not know
/// (`journal verify` and `dump`; kind 0 is the journal's own commit record).
pub fn kind_name(kind: u8) -> Option<&'static str> {
    Some(match kind {
        crate::journal::META => "commit",
        record::ENGINE_REQUEST => "engine_request",
        record::DECISION => "decision",
        record::FIX_OUT => "fix_out",
        record::FIX_IN => "fix_in",
        record::ENGINE_SESSION => "engine_session",
        record::KILL => "kill",
        record::ENGINE_MALFORMED => "engine_malformed",
        record::CHECKPOINT => "checkpoint",
        record::FIX_IN_REJECTED => "fix_in_rejected",
        record::NOT_SENT => "not_sent",
        record::CUT => "cut",
        _ => return None,
    })
}

/// Decodes a record's fields as far as its layout allows. `Err` says what replay would
/// refuse in it: a kind, kill scope or engine session event this gateway does not know, or
/// a payload too short for its kind (the same checks as replay's, so `journal verify`
/// reports what the start would stop on).
pub fn describe(kind: u8, payload: &[u8]) -> Result<Vec<(&'static str, Field)>, String> {
    let int = |v: i128| Field::Int(v);
    let u32_at = |at: usize| -> Option<i128> {
        Some(u32::from_le_bytes(payload.get(at..at + 4)?.try_into().ok()?).into())
    };
    let fix = |p: &[u8]| Field::Text(String::from_utf8_lossy(p).replace('\u{1}', "|"));
    let short = || {
        format!(
            "a {} record of {} bytes",
            kind_name(kind).unwrap_or("?"),
            payload.len()
        )
    };
    Ok(match kind {
        crate::journal::META => match payload {
            [1, end @ ..] if end.len() == 8 => vec![(
                "end",
                int(u64::from_le_bytes(end.try_into().unwrap_or_default()).into()),
            )],
            // A seal: four bytes that end the segment's chain where the next one starts.
            [crate::journal::META_SEAL, fix @ ..] if fix.len() == 4 => vec![(
                "seal",
                int(u32::from_le_bytes(fix.try_into().unwrap_or_default()).into()),
            )],
            _ => return Err(short()),
        },
        record::ENGINE_REQUEST | record::ENGINE_MALFORMED => {
            let engine = u32_at(0).ok_or_else(short)?;
            let mut f = vec![("engine", int(engine))];
            if kind == record::ENGINE_MALFORMED {
                f.push(("frame_len", int(u32_at(4).ok_or_else(short)?)));
                f.push(("kept", int(payload.len().saturating_sub(8) as i128)));
            } else {
                f.push(("frame_len", int(payload.len() as i128 - 4)));
            }
            f
        }
        record::DECISION => {
            let (d, rest) = Decision::read_from_prefix(payload).map_err(|_| short())?;
            if !rest.is_empty() && rest.len() != size_of::<DecisionTrailer>() {
                return Err(format!(
                    "a decision of {} bytes (fields after its trailer)",
                    payload.len()
                ));
            }
            let sym = String::from_utf8_lossy(&d.symbol.0)
                .trim_end_matches(['\0', ' '])
                .to_owned();
            let mut f = vec![
                ("engine", int(d.engine.get().into())),
                ("account", int(d.account.get().into())),
                ("cl_ord_id", int(d.cl_ord_id.get().into())),
                ("order_id", int(d.order_id.get().into())),
                ("request_id", int(d.request_id.get().into())),
                ("request", Field::Text(char::from(d.request).to_string())),
                ("side", int(d.side.into())),
                ("symbol", Field::Text(sym)),
                ("qty", int(d.qty.get().into())),
                ("price", int(d.price.get().into())),
                ("reason", int(d.reason.get().into())),
            ];
            if let Ok((t, _)) = DecisionTrailer::read_from_prefix(rest) {
                f.push(("now_ns", int(t.now.get().into())));
                f.push(("origin", int(t.origin.into())));
            }
            f
        }
        record::FIX_OUT | record::FIX_IN | record::FIX_IN_REJECTED => vec![("fix", fix(payload))],
        record::ENGINE_SESSION => {
            let engine = u32_at(0).ok_or_else(short)?;
            let event = match payload.get(4) {
                Some(&SESSION_LOGON) => "logon",
                Some(&SESSION_DISCONNECT) => "disconnect",
                Some(ev) => return Err(format!("an engine session event {ev}")),
                None => return Err(short()),
            };
            vec![
                ("engine", int(engine)),
                ("event", Field::Text(event.into())),
            ]
        }
        record::KILL => {
            let [tag, a, b, c, d, on] = *payload else {
                return Err(format!("a kill switch record of {} bytes", payload.len()));
            };
            let scope = match tag {
                0 => "global",
                1 => "engine",
                2 => "account",
                _ => return Err(format!("a kill switch of scope {tag}")),
            };
            vec![
                ("scope", Field::Text(scope.into())),
                ("id", int(u32::from_le_bytes([a, b, c, d]).into())),
                ("on", int((on != 0).into())),
            ]
        }
        record::CHECKPOINT => vec![
            ("version", int((*payload.first().ok_or_else(short)?).into())),
            ("bytes", int(payload.len() as i128)),
        ],
        record::NOT_SENT => {
            let id = <[u8; 8]>::try_from(payload).map_err(|_| short())?;
            vec![("request_id", int(u64::from_le_bytes(id).into()))]
        }
        record::CUT if payload.is_empty() => vec![],
        record::CUT => return Err(format!("a cut record of {} bytes", payload.len())),
        k => return Err(format!("a record of kind {k}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describe_refuses_what_replay_refuses_and_reads_the_rest() {
        assert!(describe(99, &[]).is_err());
        assert!(describe(record::KILL, &[7, 0, 0, 0, 0, 1]).is_err());
        assert!(describe(record::ENGINE_SESSION, &[1, 0, 0, 0, 9]).is_err());
        assert!(describe(record::DECISION, &[0; 10]).is_err());
        assert_eq!(
            describe(record::KILL, &[2, 7, 0, 0, 0, 1]).unwrap(),
            [
                ("scope", Field::Text("account".into())),
                ("id", Field::Int(7)),
                ("on", Field::Int(1))
            ]
        );
        assert_eq!(
            describe(record::FIX_OUT, b"8=FIX.4.4\x019=5\x01").unwrap(),
            [("fix", Field::Text("8=FIX.4.4|9=5|".into()))]
        );
    }
}
