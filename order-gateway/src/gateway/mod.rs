//! The gateway core: an I/O-free state machine joining engines, risk, journal and FIX.
//!
//! # Sub-machines
//! [`Gateway`] is the composition of four owned sub-machines, each with its state in its own
//! file(s) and its own unit tests, and a little glue (identifiers, counters, the outputs):
//! - [`OrderBook`] (`order_book.rs`): every order of the day, its indexes (the engine's id,
//!   each request's FIX ClOrdID) and the open count;
//! - [`EngineSessions`] (`engine_sessions.rs`): per engine, logon as journaled, the
//!   numbered responses and their history (the replay cursor a reconnecting engine names),
//!   request numbers and holes, malformed frames and the cut-off, and the
//!   cancel-on-disconnect deadlines;
//! - the FIX [`Session`] (`crate::fix::session`): sequence numbers, logon, resend, timers,
//!   with its own snapshot;
//! - [`RiskEngine`] (`crate::risk`): checks, accounting, throttles.
//!
//! Beside them, not inside [`Gateway`]: [`EngineLinks`] (`engine_link.rs`), the engines'
//! live links (connections waiting for their logon and the logon timeout, heartbeats,
//! silence, the response backlog and its cap), owned by the service, which owns the
//! connections: live-only state on [`rocebus::clock::Mono`] time that replay never sees.
//! The journal's retry timers are [`crate::journal_health::JournalHealth`]'s.
//!
//! # The one contract
//! Every machine here, and the gateway they make up, follows quinn-proto's `Connection`
//! shape:
//! - **events in**: method calls carrying bytes or values and the time (`handle_*`, and the
//!   `on_*` entry points of [`Gateway`]: [`Gateway::on_engine_message`],
//!   [`Gateway::on_fix_bytes`], [`Gateway::on_engine_logon`], [`Gateway::on_timer`], ...);
//!   none of them reads a clock, touches a socket or a file;
//! - **outputs out**: what must leave goes into an [`Outputs`] (or is taken with a `poll_*`
//!   call, [`EngineSessions::poll_due`], [`EngineLinks::poll_output`],
//!   [`crate::journal_health::JournalHealth::poll_probe`]);
//! - **time**: `poll_timeout()` says when the machine next needs a timer call, in the time
//!   type of its deadlines (see below); the shell calls the timer entry point at or after it;
//! - **time values**: [`rocebus::clock::Now`] is read **once per loop turn** by the I/O
//!   shell (the service's loop, or the driver's entry points for tools) and passed in.
//!   Journal-fed machines (this one and its sub-machines) run on [`rocebus::clock::Wall`]
//!   (nanoseconds since the UNIX epoch, carried here as `u64`): the journal records the time
//!   of every decision and replay must decide the same, on this host or another; live-only
//!   timers run on [`rocebus::clock::Mono`] (a wall-clock step must not expire them).
//!
//! The order to call them, per turn: read `Now`; feed the events of the turn (engine frames,
//! venue bytes, market data, operator commands); call the timer entry point
//! ([`Gateway::on_timer`]); then drain the [`Outputs`] in the **write-ahead order**: append
//! `Outputs::journal` to the [`crate::journal::Journal`], then send `Outputs::fix` to the
//! venue, then deliver `Outputs::engine` (then `Outputs::info`). Nothing leaves before the
//! journal holds it.
//!
//! The engines' live links ride the same turn: each engine frame is also
//! [`EngineLinks::handle_frame`]; delivering a response is [`EngineLinks::queue_response`],
//! and the shell offers what [`EngineLinks::poll_response`] hands out, reporting each
//! offer's outcome ([`EngineLinks::handle_offered`]); engines the gateway cut off
//! ([`Outputs::kick`]) are [`EngineLinks::handle_cut_off`]. When
//! [`EngineLinks::poll_timeout`] is due the shell calls [`EngineLinks::handle_timeout`],
//! then carries out every [`EngineLinks::poll_output`]: heartbeats, closes, and disconnects,
//! each of which is fed back here as [`Gateway::on_engine_disconnect`] (its
//! cancel-on-disconnect) and flushed in the same turn.
//!
//! # Replay, and a replicated log
//! Recovery feeds every journal record back through [`Gateway::replay_record`], which applies
//! the same state transitions as live operation (the same sub-machine calls:
//! [`EngineSessions::handle_logon`], the [`OrderBook`] moves, the risk and session
//! restores) without emitting anything. A standby fed from a replicated log instead of the
//! journal uses the same entry point, record by record, in log order: nothing in a replayed
//! transition depends on a clock reading or on I/O, only on the record (which carries its
//! decision time). What is not in the log is live-only and says so
//! ([`Gateway::inherit_live_state`]: halts, references, the restart deadlines).
//!
//! Engine responses are numbered per engine, starting at one (the [`crate::proto::Header::seq`] of
//! each response), and the last `risk.response_history` (default [`RESPONSE_HISTORY`]) of
//! each engine are kept, so an engine
//! that reconnects gets what it missed ([`Gateway::responses_after`]). Responses are a pure
//! function of the journal (decisions, malformed requests, venue messages), so replay
//! rebuilds the numbers and the history too: a gateway restart loses neither.
//!
//! Identifiers: every accepted request gets a gateway id from one counter; a new order's id is
//! its order id and its FIX ClOrdID; cancels and replaces get their own ids (FIX wants a fresh
//! ClOrdID per request). Ids survive restarts because they are rebuilt from the journal.
//!
//! This module must not touch sockets or files.
//!
//! # Layout
//! [`Gateway`]'s methods are split by the flow they handle, each file an `impl Gateway`
//! block that moves the sub-machines above (they own the state):
//! - `engine`: engine frames in (malformed ones bounded, re-sent ones answered with a
//!   status), logons and disconnects (cancel-on-disconnect, also across restarts);
//! - `orders`: requests turned into decisions (risk checks, rejects) and the FIX orders and
//!   cancels that go out, the gateway's own cancels (kill switch, cancel-all) included;
//! - `venue`: the FIX side: transport events, framing, the session, application messages;
//! - `fills`: execution reports and cancel rejects applied to orders, risk and engines;
//! - `recovery`: journal replay and checkpoints;
//! - `records`: the journal records the gateway writes ([`record`], [`Decision`]);
//! - `tests` and `recovery_tests`: unit tests (the latter: FIX session recovery and the
//!   venue's execution reports).

use rustc_hash::FxHashSet;

use crate::fix::{Session, SessionConfig};
use crate::journal::encode_record;
use crate::proto::{Response, Symbol};
use crate::risk::{RiskConfig, RiskConfigError, RiskEngine};

mod engine;
mod engine_frame;
mod engine_link;
mod engine_sessions;
mod fills;
pub mod holes;
mod order_book;
mod orders;
mod records;
mod recovery;
mod venue;

pub use engine_frame::EngineFrame;
pub use engine_link::{
    Admission, CloseReason, ConnId, DisconnectReason, EngineLinks, LinkConfig, LinkCounters,
    LinkOutput, Offered,
};
pub use engine_sessions::{EngineSessions, MalformedVerdict};
use order_book::Change;
pub use order_book::{Order, OrderBook, OrderStatus};
pub use records::{
    describe, kind_name, record, Decision, DecisionTrailer, Field, MALFORMED_KEPT, ORIGIN_ENGINE,
    ORIGIN_GATEWAY, SESSION_DISCONNECT, SESSION_LOGON,
};
// Owned by risk, with `risk.response_history`; the gateway's path stays.
pub use crate::risk::RESPONSE_HISTORY;

/// Engine identifier, named in the engine's logon and checked against its token.
pub type EngineId = u32;

/// What the driver must do after a call.
#[derive(Debug, Default)]
pub struct Outputs {
    /// Responses to deliver to engines.
    pub engine: Vec<(EngineId, Response)>,
    /// Unnumbered informational responses (order status for re-sent requests), delivered
    /// after `engine`; neither journaled nor kept for replay.
    pub info: Vec<(EngineId, Response)>,
    /// FIX bytes to send to the venue.
    pub fix: Vec<u8>,
    /// Journal records to append before anything else leaves.
    pub journal: Vec<u8>,
    /// Number of records in `journal`.
    pub journal_records: u32,
    /// The FIX transport must be closed.
    pub disconnect: bool,
    /// Engines whose connections must be closed (they sent `max_malformed_frames`): the
    /// driver closes them, which runs cancel-on-disconnect.
    pub kick: Vec<EngineId>,
    /// `engine[..stamped]` carry their response sequence numbers.
    stamped: usize,
}

impl Outputs {
    /// Empties every queue (keeps capacity).
    pub fn clear(&mut self) {
        self.engine.clear();
        self.info.clear();
        self.fix.clear();
        self.journal.clear();
        self.journal_records = 0;
        self.disconnect = false;
        self.kick.clear();
        self.stamped = 0;
    }

    fn record(&mut self, kind: u8, parts: &[&[u8]]) {
        encode_record(&mut self.journal, kind, parts);
        self.journal_records += 1;
    }
}

/// Gateway counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GatewayCounters {
    /// Engine frames that did not decode.
    pub malformed_engine: u64,
    /// FIX frames that failed framing or field syntax.
    pub malformed_fix: u64,
    /// Application messages rejected at session level (missing/bad fields).
    pub rejected_app: u64,
    /// Execution reports for unknown ClOrdIDs.
    pub unknown_exec: u64,
    /// Re-sent requests (numbered at or below the last taken) answered with a status.
    pub resent_requests: u64,
    /// Cancel-on-disconnects run late: after a restart for an engine that did not log on
    /// again in time, or once the venue session was back for one that dropped while it was
    /// down.
    pub deferred_cancel_on_disconnect: u64,
    /// Execution reports applied before (same ExecID, or a fill not raising CumQty): ignored.
    pub duplicate_execs: u64,
    /// Executions beyond the order quantity (CumQty > OrderQty).
    pub overfills: u64,
    /// Executions on orders already final.
    pub late_fills: u64,
    /// Trade cancels (ExecType H) applied.
    pub trade_cancels: u64,
    /// Trade corrections (ExecType G) applied.
    pub trade_corrections: u64,
    /// Trade cancels/corrections whose ExecRefID was not known (applied from CumQty).
    pub trade_refs_unknown: u64,
    /// Venue answers after the order was final that changed nothing (late cancel or reject).
    pub late_answers: u64,
    /// Order messages the venue refused with a BusinessMessageReject or a session Reject.
    pub venue_refused: u64,
    /// Accepted requests whose order message never reached the journal (the gateway
    /// stopped in between, so it never went out), rejected `NotSent` at the next start.
    pub not_sent: u64,
    /// OrderStatusRequests sent at logon: for orders in doubt, or for every live order
    /// after a logon that reset sequence numbers.
    pub status_requests: u64,
    /// Executions applied from a status answer (ExecType I) whose CumQty was above what
    /// the gateway had applied: reports it never read (lost in a sequence reset).
    pub status_fills: u64,
    /// Status answers whose CumQty was below what the gateway had applied: not applied.
    pub status_mismatch: u64,
    /// Engine connections cut off for sending `max_malformed_frames` malformed frames.
    pub malformed_disconnects: u64,
    /// Frames from an engine cut off, before it logged on again: neither taken nor journaled.
    pub frames_after_cutoff: u64,
    /// Fills whose LastQty was not their CumQty's growth (applied by CumQty).
    pub inconsistent_fills: u64,
}

/// The gateway state machine.
#[derive(Debug)]
pub struct Gateway {
    risk: RiskEngine,
    session: Session,
    /// Every order of the day and its indexes.
    book: OrderBook,
    /// Per engine: logon, response numbering and history, request numbers, malformed
    /// frames, cancel-on-disconnect deadlines.
    engines: EngineSessions,
    next_id: u64,
    inbuf: Vec<u8>,
    body: Vec<u8>,
    counters: GatewayCounters,
    /// ExecIDs applied (duplicates, trade cancel/correct references).
    execs: crate::execs::ExecLog,
    /// Replaying the journal: state changes only, no logging.
    replaying: bool,
    /// Discard sink for replay.
    scratch: Outputs,
    /// A checkpoint record replay could not read (the start must stop).
    replay_error: Option<crate::checkpoint::CheckpointError>,
    /// Replay: FIX ClOrdIDs of accepted requests whose order message (D, F or G) the
    /// journal has not shown yet, nor any venue answer to them. Left over at the end, they
    /// were never sent if the journal was group-committed ([`Gateway::close_unsent`]),
    /// and are in doubt otherwise ([`Gateway::leave_unsent_in_doubt`]).
    unsent: FxHashSet<u64>,
    /// Live only: orders a gateway cancel (kill switch, cancel-all, mass cancel,
    /// cancel-on-disconnect) found with a replace in flight, cancelled once it is answered.
    cancel_after_change: Vec<u64>,
}

impl Gateway {
    /// Builds a gateway with fresh state (replay the journal next).
    pub fn new(session: SessionConfig, risk: &RiskConfig) -> Result<Gateway, RiskConfigError> {
        Ok(Gateway {
            risk: RiskEngine::new(risk)?,
            session: Session::new(session),
            book: OrderBook::new(),
            engines: EngineSessions::new(
                risk.engines.iter().map(|e| e.id),
                risk.response_history,
                risk.max_malformed_frames,
            ),
            next_id: 1,
            inbuf: Vec::with_capacity(1 << 16),
            body: Vec::with_capacity(512),
            counters: GatewayCounters::default(),
            execs: crate::execs::ExecLog::default(),
            replaying: false,
            scratch: Outputs::default(),
            replay_error: None,
            unsent: FxHashSet::default(),
            cancel_after_change: Vec::new(),
        })
    }

    /// Takes from `old` the live state the journal does not hold, after a rebuild from the
    /// journal: references and halts, and the cancel-on-disconnect deadlines armed at the
    /// start ([`arm_restart_cancel_on_disconnect`](Self::arm_restart_cancel_on_disconnect)
    /// runs once, so a rebuild without them would leave those engines' orders open at the
    /// venue for good). Kill switches come from the journal (they are durable before they
    /// are acknowledged).
    pub fn inherit_live_state(&mut self, old: &Gateway) {
        self.risk.inherit_live_state(&old.risk);
        self.engines.inherit_live_state(&old.engines);
    }

    /// Risk state.
    pub fn risk(&self) -> &RiskEngine {
        &self.risk
    }

    /// FIX session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Counters.
    pub fn counters(&self) -> GatewayCounters {
        self.counters
    }

    /// The venue logged us out because our MsgSeqNum is too low and said which it expects:
    /// the driver must not log on again with the same numbers (it would be refused the
    /// same way, for ever) until an operator acts ([`release_reconnect_hold`]).
    ///
    /// [`release_reconnect_hold`]: Self::release_reconnect_hold
    pub fn reconnect_hold(&self) -> Option<u64> {
        self.session.venue_expects()
    }

    /// An operator dealt with [`reconnect_hold`](Self::reconnect_hold): logging on again is
    /// allowed.
    pub fn release_reconnect_hold(&mut self) {
        self.session.clear_venue_expects();
    }

    /// Order of `engine` with the engine's id `cl_ord_id`.
    pub fn order(&self, engine: EngineId, cl_ord_id: u64) -> Option<&Order> {
        self.book.by_engine(engine, cl_ord_id)
    }

    /// Every order, keyed by gateway order id.
    pub fn orders(&self) -> impl Iterator<Item = (u64, &Order)> {
        self.book.iter()
    }

    /// Orders not yet final.
    pub fn open_order_count(&self) -> usize {
        self.book.open_count()
    }

    /// Requests sent and not yet answered by the venue: new orders not acknowledged, and
    /// cancels or replaces pending (a scan of the day's orders: for the operator's status).
    pub fn unacknowledged(&self) -> (usize, usize) {
        self.book.unacknowledged()
    }

    /// [`Self::open_order_count`] counted the slow way, to check the kept count in tests.
    #[cfg(test)]
    fn open_order_scan(&self) -> usize {
        self.book.open_scan()
    }

    /// Reference price from the market-data bus.
    pub fn on_reference_price(&mut self, symbol: Symbol, price: i64, now: u64) {
        self.risk.on_reference_price(symbol, price, now);
    }

    /// Halt state from the feed.
    pub fn on_halt(&mut self, symbol: Symbol, halted: bool) {
        self.risk.on_halt(symbol, halted);
    }
}

#[cfg(test)]
pub(crate) mod tests;

#[cfg(test)]
mod recovery_tests;
