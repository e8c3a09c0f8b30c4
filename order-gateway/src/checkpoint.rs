//! Checkpoints: the gateway's whole recoverable state as one journal record.
//!
//! A journal grows with the day; replaying it from the start made restart time grow with
//! it (about 10 s of CPU per million orders). When the journal reaches
//! `journal.segment_bytes`, and when the gateway stops, the driver asks the core for a
//! checkpoint and starts a new *segment*: a fresh journal file whose first record
//! ([`crate::gateway::record::CHECKPOINT`]) holds everything replay would have rebuilt from
//! the old one. The old file is kept beside it as `FILE.N`, N its segment number (never
//! deleted by the gateway); the new segment's superblock names it by number, sealed length
//! and chain value, so an archive that goes missing or is replaced is seen at the next
//! start ([`crate::journal`]), and `journal repair` can rebuild a segment whose checkpoint
//! is damaged from it.
//! Restart reads the checkpoint and replays only the records after it.
//!
//! What a checkpoint holds, and what it leaves out on purpose:
//! - every open order, and every order that became final since the previous checkpoint
//!   (late fills, trade busts and cancel-rejects of a just-finished order still find it);
//!   orders final before that are dropped, so memory and restart time stay bounded. An
//!   execution report for a dropped order is counted as an unknown order and logged;
//! - risk: per account the open and executed notional, open orders and positions, kill
//!   switches, and every engine order id seen today (duplicate-id checks stay exact);
//! - per engine the last request number journaled, the numbered responses kept for replay,
//!   and whether it was logged on (cancel-on-disconnect across restarts);
//! - the throttles' sliding windows, the repeated-order check's recent orders, firm-wide
//!   exposure, and malformed frames per engine since its logon;
//! - the FIX session's sequence numbers and the sent messages kept for resends;
//! - recent ExecIDs of the orders kept (duplicates are still applied once).
//!
//! Reference prices and halts are not journaled at all (they come from the market-data bus
//! after a restart), and neither are counters.
//!
//! The encoding is postcard (serde) behind a version byte; a checkpoint this version cannot
//! read stops the start with an error rather than being skipped.

use serde::{Deserialize, Serialize};

/// Version of the layout below; bump on any change.
pub const VERSION: u8 = 1;

/// The gateway core's part.
#[derive(Debug, Serialize, Deserialize)]
pub struct GatewayState {
    /// Next gateway order/request id.
    pub next_id: u64,
    /// Orders kept: `(id, order)`.
    pub orders: Vec<(u64, OrderState)>,
    /// Venue request ids (FIX ClOrdIDs) of the kept orders: `(request id, order id)`.
    pub by_request: Vec<(u64, u64)>,
    /// Per engine: last response number and the responses kept for replay (wire bytes).
    pub responses: Vec<(u32, u32, Vec<Vec<u8>>)>,
    /// Per engine: highest request number journaled.
    pub last_request: Vec<(u32, u32)>,
    /// Engines logged on.
    pub connected: Vec<u32>,
    /// Malformed frames per engine since its last logon.
    pub malformed: Vec<(u32, u32)>,
    /// Recent ExecIDs of the kept orders, oldest first.
    pub execs: Vec<ExecState>,
    /// Risk.
    pub risk: RiskState,
    /// FIX session.
    pub session: SessionState,
    /// Executed notional of the kept orders with executions: `(id, sum of qty x price)`.
    /// Encoded after the rest (a trailer), so checkpoints of the same version written
    /// before it existed still read (their orders' notional is then estimated from their
    /// limit price). Bytes after the trailer are fields this gateway does not know: the
    /// start stops on them rather than half-read the checkpoint.
    #[serde(skip)]
    pub notional: Vec<(u64, i128)>,
}

/// What follows [`GatewayState`] in a checkpoint payload (absent in older ones).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Trailer {
    notional: Vec<(u64, i128)>,
}

/// One order.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct OrderState {
    /// Owning engine.
    pub engine: u32,
    /// The engine's id.
    pub cl_ord_id: u64,
    /// Account.
    pub account: u32,
    /// Symbol.
    pub symbol: [u8; 8],
    /// Side byte.
    pub side: u8,
    /// Quantity.
    pub qty: u32,
    /// Price.
    pub price: i64,
    /// Executed.
    pub cum_qty: u32,
    /// 0 pending new, 1 open, 2 done.
    pub status: u8,
    /// ClOrdID the venue knows it by.
    pub venue_cl_ord_id: u64,
    /// A cancel (`qty` None) or replace in flight: `(request id, Some((qty, price)))`.
    pub pending: Option<(u64, Option<(u32, i64)>)>,
}

/// One ExecID entry (see `crate::execs`).
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct ExecState {
    /// Order.
    pub order: u64,
    /// ExecID length.
    pub len: u16,
    /// ExecID's first bytes.
    pub head: [u8; 24],
    /// ExecID hash.
    pub hash: u64,
    /// Quantity and price of the execution.
    pub trade: (u32, i64),
}

/// Risk.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RiskState {
    /// Global kill switch.
    pub global_kill: bool,
    /// Engines whose kill switch is on.
    pub killed_engines: Vec<u32>,
    /// Accounts.
    pub accounts: Vec<AccountState>,
    /// Engine order ids seen: `(engine, cl_ord_id)`.
    pub seen_ids: Vec<(u32, u64)>,
    /// Firm-wide open notional, executed notional and open orders.
    pub firm: (i128, i128, u64),
    /// The repeated-order check's accepted new orders, oldest first: `(account, symbol,
    /// side, qty, price, time)`.
    pub identical: Vec<(u32, [u8; 8], u8, u32, i64, u64)>,
    /// Orders the repeated-order check forgot early.
    pub identical_evicted: u64,
}

/// A throttle's sliding window.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct WindowState {
    /// Per slot counts.
    pub slots: Vec<u32>,
    /// Newest slot number.
    pub head: u64,
    /// Sum of the slots.
    pub total: u64,
}

/// One account's risk state.
#[derive(Debug, Serialize, Deserialize)]
pub struct AccountState {
    /// Account.
    pub id: u32,
    /// Kill switch.
    pub killed: bool,
    /// Open notional (price-scale units).
    pub open_notional: i128,
    /// Executed notional (price-scale units).
    pub executed_notional: i128,
    /// Open orders.
    pub open_orders: u32,
    /// Positions: `(symbol, net, open buy, open sell)`.
    pub positions: Vec<([u8; 8], i64, i64, i64)>,
    /// Throttles of new orders, cancels and replaces.
    pub throttle: Vec<WindowState>,
}

/// The FIX session.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct SessionState {
    /// Next MsgSeqNum we send.
    pub next_out: u64,
    /// Next MsgSeqNum we expect.
    pub next_in: u64,
    /// Inbound messages accepted.
    pub accepted_in: u64,
    /// We answered a reset Logon and wait for its confirmation.
    pub answered_reset: bool,
    /// Sent application messages kept for resends: `(seq, raw frame)`, ascending.
    pub sent: Vec<(u64, Vec<u8>)>,
}

/// A checkpoint, or any journal record, that replay cannot read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Written by another version of the gateway.
    #[error(
        "journal checkpoint has layout version {found}, this gateway reads {VERSION}: run \
         the gateway version that wrote it, or start from an archived segment"
    )]
    Version {
        /// Version found.
        found: u8,
    },
    /// Encoding failed (a bug: the state is plain data).
    #[error("journal checkpoint could not be encoded: {0}")]
    Encode(String),
    /// A journal record replay does not know (written by a newer gateway?): the start stops
    /// rather than half-read the journal.
    #[error(
        "the journal holds {0}, which this gateway does not know (written by a newer \
         version?): run the gateway version that wrote it; `order-gateway journal dump` shows \
         the record"
    )]
    UnknownRecord(String),
    /// The bytes do not decode (the record's CRC passed, so this is a bug, not damage).
    #[error("journal checkpoint does not decode: {0}")]
    Decode(String),
}

/// Encodes `state` behind the version byte.
pub fn encode(state: &GatewayState) -> Result<Vec<u8>, CheckpointError> {
    let mut buf = vec![VERSION];
    postcard::to_io(state, &mut buf).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    let trailer = Trailer {
        notional: state.notional.clone(),
    };
    postcard::to_io(&trailer, &mut buf).map_err(|e| CheckpointError::Encode(e.to_string()))?;
    Ok(buf)
}

/// Decodes a checkpoint payload.
pub fn decode(payload: &[u8]) -> Result<GatewayState, CheckpointError> {
    match payload.split_first() {
        Some((&VERSION, rest)) => {
            let (mut state, rest): (GatewayState, _) = postcard::take_from_bytes(rest)
                .map_err(|e| CheckpointError::Decode(e.to_string()))?;
            if !rest.is_empty() {
                let (t, rest): (Trailer, _) = postcard::take_from_bytes(rest)
                    .map_err(|e| CheckpointError::Decode(e.to_string()))?;
                if !rest.is_empty() {
                    // Fields a newer gateway added: never half-read.
                    return Err(CheckpointError::UnknownRecord(format!(
                        "a checkpoint with {} bytes of fields after its last known one",
                        rest.len()
                    )));
                }
                state.notional = t.notional;
            }
            Ok(state)
        }
        Some((&found, _)) => Err(CheckpointError::Version { found }),
        None => Err(CheckpointError::Decode("empty".into())),
    }
}
