//! The gateway core: an I/O-free state machine joining engines, risk, journal and FIX.
//!
//! Inputs are method calls carrying bytes and `now` (nanoseconds since the UNIX epoch);
//! outputs go into an [`Outputs`] the driver drains **in this order**: append
//! `Outputs::journal` to the [`crate::journal::Journal`] (write-ahead), then send
//! `Outputs::fix` to the venue, then deliver `Outputs::engine`. Recovery feeds every journal
//! record back through [`Gateway::replay_record`], which applies the same state transitions
//! as live operation without emitting anything.
//!
//! Engine responses are numbered per engine, starting at one (the [`proto::Header::seq`] of
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

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::fix::session::{push_field, push_price, push_timestamp, push_uint};
use crate::fix::{split_frame, tag, Message, Session, SessionConfig, SessionEvent, SessionState};
use crate::journal::encode_record;
use crate::proto::{
    self, msg_type, LogonStatus, OrdState, RejectReason, Request, Response, Side, Symbol,
};
use crate::risk::{KillScope, OrderParams, RequestKind, RiskConfig, RiskConfigError, RiskEngine};

/// Engine identifier, named in the engine's logon and checked against its token.
pub type EngineId = u32;

/// Responses kept per engine for replay after a reconnect by default (about 2.7 MB per
/// engine; `risk.response_history` sets it). An engine that was away for more responses
/// than are kept is refused with [`LogonStatus::ReplayUnavailable`] and must rebuild its
/// state another way.
pub const RESPONSE_HISTORY: usize = 1 << 16;

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

/// Malformed-frame log lines: at most one per engine per this many nanoseconds (the rest
/// are summed into the next line).
const MALFORMED_LOG_INTERVAL_NS: u64 = 1_000_000_000;

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
    /// 0 = accepted, else a [`RejectReason`].
    pub reason: U16,
    /// Request type ([`msg_type`]).
    pub request: u8,
    /// Side byte.
    pub side: u8,
    /// Symbol.
    pub symbol: Symbol,
}

const _: () = assert!(size_of::<Decision>() == 56);

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

/// Where an order is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderStatus {
    /// Sent to the venue, not acknowledged.
    PendingNew,
    /// Live at the venue.
    Open,
    /// Filled, canceled or rejected.
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Change {
    Cancel,
    Replace { qty: u32, price: i64 },
}

/// A gateway order.
#[derive(Clone, Copy, Debug)]
pub struct Order {
    /// Owning engine.
    pub engine: EngineId,
    /// The engine's id.
    pub cl_ord_id: u64,
    /// Current terms.
    pub params: OrderParams,
    /// Executed quantity.
    pub cum_qty: u32,
    /// Status.
    pub status: OrderStatus,
    /// FIX ClOrdID the venue currently knows the order by.
    pub venue_cl_ord_id: u64,
    pending: Option<(u64, Change)>,
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
    /// OrderStatusRequests sent at logon for orders in doubt.
    pub status_requests: u64,
    /// Engine connections cut off for sending `max_malformed_frames` malformed frames.
    pub malformed_disconnects: u64,
    /// Frames from an engine cut off, before it logged on again: neither taken nor journaled.
    pub frames_after_cutoff: u64,
    /// Fills whose LastQty was not their CumQty's growth (applied by CumQty).
    pub inconsistent_fills: u64,
}

/// Per engine, malformed frames since its logon and the rate-limited log of them.
#[derive(Clone, Copy, Debug, Default)]
struct MalformedLog {
    /// Since the engine's last logon (journaled, so replay rebuilds it).
    count: u32,
    /// Live only: when the last line was logged, and frames not logged since.
    logged_at: u64,
    unlogged: u64,
}

/// One engine's numbered responses.
#[derive(Debug)]
struct ResponseLog {
    /// Sequence number of the newest response (0: none yet).
    last: u32,
    /// The newest responses, oldest first: seqs `last - len + 1 ..= last`.
    kept: VecDeque<Response>,
}

/// The gateway state machine.
#[derive(Debug)]
pub struct Gateway {
    risk: RiskEngine,
    session: Session,
    orders: FxHashMap<u64, Order>,
    /// Orders in `orders` whose status is not Done, kept as they change: the service reads
    /// it every millisecond, and `orders` keeps every order of the day.
    open_orders: usize,
    by_engine: FxHashMap<(EngineId, u64), u64>,
    by_request: FxHashMap<u64, u64>,
    responses: FxHashMap<EngineId, ResponseLog>,
    /// Per engine, the highest request sequence number journaled.
    last_request: FxHashMap<EngineId, u32>,
    /// Numbers below `last_request` never taken (a not-taken request sent again late).
    request_holes: crate::holes::Holes,
    /// Engines logged on, as the journal says (after a crash: those that were).
    connected: FxHashSet<EngineId>,
    /// After a restart: engines whose open orders are cancelled unless they log on again
    /// by the deadline (cancel-on-disconnect across crashes).
    cod_deadlines: Vec<(EngineId, u64)>,
    history: usize,
    next_id: u64,
    inbuf: Vec<u8>,
    body: Vec<u8>,
    counters: GatewayCounters,
    /// ExecIDs applied (duplicates, trade cancel/correct references).
    execs: crate::execs::ExecLog,
    /// Malformed frames per engine.
    malformed: FxHashMap<EngineId, MalformedLog>,
    /// Malformed frames that cut an engine off.
    max_malformed: u32,
    /// Replaying the journal: state changes only, no logging.
    replaying: bool,
    /// Discard sink for replay.
    scratch: Outputs,
    /// Orders already final at the last checkpoint: the next one leaves them out.
    retired: FxHashSet<u64>,
    /// A checkpoint record replay could not read (the start must stop).
    replay_error: Option<crate::checkpoint::CheckpointError>,
}

impl ResponseLog {
    fn new(history: usize) -> ResponseLog {
        ResponseLog {
            last: 0,
            kept: VecDeque::with_capacity(history),
        }
    }
}

/// Why an application message was rejected: (tag, FIX SessionRejectReason, text).
type AppReject = (u32, u32, &'static str);

fn side_fix(s: Side) -> &'static [u8] {
    match s {
        Side::Buy => b"1",
        Side::Sell => b"2",
    }
}

fn parse_u32(m: &Message<'_>, t: u32) -> Result<u32, AppReject> {
    // Quantities may come as decimals ("100" or "100.0"); whole units only.
    let v = m.require(t).map_err(|_| (t, 1, "required tag missing"))?;
    let int = v.split(|&c| c == b'.').next().unwrap_or(b"");
    std::str::from_utf8(int)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or((t, 6, "incorrect data format"))
}

impl Gateway {
    /// Builds a gateway with fresh state (replay the journal next).
    pub fn new(session: SessionConfig, risk: &RiskConfig) -> Result<Gateway, RiskConfigError> {
        Ok(Gateway {
            risk: RiskEngine::new(risk)?,
            session: Session::new(session),
            orders: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            open_orders: 0,
            by_engine: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            by_request: FxHashMap::with_capacity_and_hasher(1 << 16, Default::default()),
            responses: risk
                .engines
                .iter()
                .map(|e| (e.id, ResponseLog::new(risk.response_history)))
                .collect(),
            last_request: FxHashMap::default(),
            request_holes: Default::default(),
            connected: FxHashSet::default(),
            cod_deadlines: Vec::new(),
            history: risk.response_history,
            next_id: 1,
            inbuf: Vec::with_capacity(1 << 16),
            body: Vec::with_capacity(512),
            counters: GatewayCounters::default(),
            execs: crate::execs::ExecLog::default(),
            malformed: FxHashMap::default(),
            max_malformed: risk.max_malformed_frames,
            replaying: false,
            scratch: Outputs::default(),
            retired: FxHashSet::default(),
            replay_error: None,
        })
    }

    /// Takes from `old` the live state the journal does not hold (references, halts, kill
    /// switches), after a rebuild from the journal.
    pub fn inherit_live_state(&mut self, old: &Gateway) {
        self.risk.inherit_live_state(&old.risk);
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

    /// Keeps `n` responses per engine for replay instead of [`RESPONSE_HISTORY`] (before any
    /// response is produced; tests use a small `n`).
    pub fn with_response_history(mut self, n: usize) -> Gateway {
        self.history = n.max(1);
        for log in self.responses.values_mut() {
            *log = ResponseLog::new(self.history);
        }
        self
    }

    /// The sequence number of the newest response to `engine` (0: none yet).
    pub fn last_response_seq(&self, engine: EngineId) -> u32 {
        self.responses.get(&engine).map_or(0, |l| l.last)
    }

    /// The highest request sequence number of `engine` journaled (0: none): the logon
    /// answer tells the engine that every later request was not taken.
    pub fn last_request_seq(&self, engine: EngineId) -> u32 {
        self.last_request.get(&engine).copied().unwrap_or(0)
    }

    /// Notes the request number of a journaled frame (live and replay).
    fn note_request_seq(&mut self, engine: EngineId, bytes: &[u8]) {
        let seq = request_seq(bytes);
        if seq != 0 {
            let last = self.last_request.entry(engine).or_insert(0);
            self.request_holes.taken(engine, *last, seq);
            *last = (*last).max(seq);
        }
    }

    /// The responses to `engine` after sequence number `after`, oldest first, for an engine
    /// that logs on again: `BadSequence` if `after` is beyond the newest, `ReplayUnavailable`
    /// if some of them are no longer kept.
    pub fn responses_after(
        &self,
        engine: EngineId,
        after: u32,
    ) -> Result<impl Iterator<Item = &Response> + '_, LogonStatus> {
        let (last, kept) = self
            .responses
            .get(&engine)
            .map_or((0, None), |l| (l.last, Some(&l.kept)));
        if after > last {
            return Err(LogonStatus::BadSequence);
        }
        let missing = (last - after) as usize;
        let held = kept.map_or(0, VecDeque::len);
        if missing > held {
            return Err(LogonStatus::ReplayUnavailable);
        }
        Ok(kept
            .into_iter()
            .flat_map(move |k| k.range(held - missing..)))
    }

    /// Numbers the responses queued in `out` since the last call and keeps them for replay.
    fn seal(&mut self, out: &mut Outputs) {
        let history = self.history;
        for (engine, r) in &mut out.engine[out.stamped..] {
            let log = self
                .responses
                .entry(*engine)
                .or_insert_with(|| ResponseLog::new(history));
            // u32 numbers 4 billion responses per engine over the journal's life.
            log.last = log.last.wrapping_add(1);
            r.set_seq(log.last);
            if log.kept.len() == history {
                log.kept.pop_front();
            }
            log.kept.push_back(*r);
        }
        out.stamped = out.engine.len();
    }

    /// Order of `engine` with the engine's id `cl_ord_id`.
    pub fn order(&self, engine: EngineId, cl_ord_id: u64) -> Option<&Order> {
        self.by_engine
            .get(&(engine, cl_ord_id))
            .and_then(|id| self.orders.get(id))
    }

    /// Every order, keyed by gateway order id.
    pub fn orders(&self) -> impl Iterator<Item = (u64, &Order)> {
        self.orders.iter().map(|(k, v)| (*k, v))
    }

    /// Orders not yet final.
    pub fn open_order_count(&self) -> usize {
        self.open_orders
    }

    /// [`Self::open_order_count`] counted the slow way, to check the kept count in tests.
    #[cfg(test)]
    fn open_order_scan(&self) -> usize {
        self.orders
            .values()
            .filter(|o| o.status != OrderStatus::Done)
            .count()
    }

    /// Reference price from the market-data bus.
    pub fn on_reference_price(&mut self, symbol: Symbol, price: i64, now: u64) {
        self.risk.on_reference_price(symbol, price, now);
    }

    /// Halt state from the feed.
    pub fn on_halt(&mut self, symbol: Symbol, halted: bool) {
        self.risk.on_halt(symbol, halted);
    }

    /// FIX transport connected: logs on.
    pub fn on_connect(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        self.session.on_connect(now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// FIX transport lost.
    pub fn on_disconnect(&mut self) {
        self.session.on_disconnect();
        self.inbuf.clear();
    }

    /// Timers (heartbeat, test request, timeouts, cancel-on-disconnect after a restart).
    pub fn on_timer(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        if matches!(
            self.session.on_timer(now, &mut out.fix),
            SessionEvent::Disconnect
        ) {
            out.disconnect = true;
        }
        Self::journal_out(out, start);
        // Cancels need the venue: a deadline that passed while it was down fires once the
        // session is up.
        if !self.cod_deadlines.is_empty() && self.session.state() == SessionState::Active {
            let mut i = 0;
            while i < self.cod_deadlines.len() {
                let (engine, deadline) = self.cod_deadlines[i];
                if now >= deadline {
                    self.cod_deadlines.swap_remove(i);
                    self.counters.deferred_cancel_on_disconnect += 1;
                    self.on_engine_disconnect(engine, now, out);
                } else {
                    i += 1;
                }
            }
        }
    }

    /// After a restart (journal replayed): every engine that was logged on when the
    /// gateway stopped, or that has open orders, must log on again within `timeout_ns`,
    /// else its open orders are cancelled at the venue, as if its connection had dropped.
    pub fn arm_restart_cancel_on_disconnect(&mut self, now: u64, timeout_ns: u64) {
        let mut engines: Vec<EngineId> = self.connected.iter().copied().collect();
        engines.extend(
            self.orders
                .values()
                .filter(|o| o.status != OrderStatus::Done)
                .map(|o| o.engine),
        );
        engines.sort_unstable();
        engines.dedup();
        self.cod_deadlines = engines
            .into_iter()
            .map(|e| (e, now.saturating_add(timeout_ns)))
            .collect();
    }

    /// Engines that must log on again before their restart deadline, with the deadline.
    pub fn restart_deadlines(&self) -> &[(EngineId, u64)] {
        &self.cod_deadlines
    }

    /// An engine logged on: journaled (so a restart knows whose orders to guard), and its
    /// restart deadline, if any, is met.
    pub fn on_engine_logon(&mut self, engine: EngineId, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_LOGON]],
        );
        self.connected.insert(engine);
        self.cod_deadlines.retain(|(e, _)| *e != engine);
        self.reset_malformed(engine);
    }

    /// A new connection of `engine` starts with a clean slate (live and replay).
    fn reset_malformed(&mut self, engine: EngineId) {
        if let Some(m) = self.malformed.get_mut(&engine) {
            m.count = 0;
        }
    }

    /// Malformed frames `engine` sent since it last logged on.
    pub fn malformed_since_logon(&self, engine: EngineId) -> u32 {
        self.malformed.get(&engine).map_or(0, |m| m.count)
    }

    /// Starts a FIX logout.
    pub fn logout(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        self.session.logout(now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// Journals the FIX frames written since `start`, one record per frame, so a record is
    /// never larger than one message whatever a resend answers with.
    fn journal_out(out: &mut Outputs, start: usize) {
        let mut rest = &out.fix[start..];
        while !rest.is_empty() {
            // The session writes whole frames; should one ever not split, it goes whole.
            let n = split_frame(rest).map_or(rest.len(), |n| n.clamp(1, rest.len()));
            encode_record(&mut out.journal, record::FIX_OUT, &[&rest[..n]]);
            out.journal_records += 1;
            rest = &rest[n..];
        }
    }

    /// Turns a kill switch on or off; turning it on cancels the open orders in its scope.
    /// Journaled, so it survives a restart.
    pub fn set_kill(&mut self, scope: KillScope, on: bool, now: u64, out: &mut Outputs) {
        let (tag, id) = match scope {
            KillScope::Global => (0u8, 0u32),
            KillScope::Engine(e) => (1, e),
            KillScope::Account(a) => (2, a),
        };
        out.record(record::KILL, &[&[tag], &id.to_le_bytes(), &[u8::from(on)]]);
        self.risk.set_kill(scope, on);
        if on {
            self.cancel_where(now, out, |o| match scope {
                KillScope::Global => true,
                KillScope::Engine(e) => o.engine == e,
                KillScope::Account(a) => o.params.account == a,
            });
        }
        self.seal(out);
    }

    /// Cancels every open order (of `account`, if given) at the venue, without blocking new
    /// ones (the operator's cancel-all).
    pub fn cancel_all(&mut self, account: Option<u32>, now: u64, out: &mut Outputs) {
        self.cancel_where(now, out, |o| account.is_none_or(|a| o.params.account == a));
        self.seal(out);
    }

    /// Cancel-on-disconnect: cancels every open order of `engine`.
    pub fn on_engine_disconnect(&mut self, engine: EngineId, now: u64, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_DISCONNECT]],
        );
        self.connected.remove(&engine);
        self.cod_deadlines.retain(|(e, _)| *e != engine);
        self.reset_malformed(engine);
        if self.session.state() != SessionState::Active {
            // The cancels need the venue: they go out as soon as the session is up again
            // (unless the engine logs on first), not rejected as SessionDown to nobody.
            self.cod_deadlines.push((engine, 0));
            self.seal(out);
            return;
        }
        self.cancel_where(now, out, |o| o.engine == engine);
        self.seal(out);
    }

    fn cancel_where(&mut self, now: u64, out: &mut Outputs, pred: impl Fn(&Order) -> bool) {
        let mut targets: Vec<(EngineId, u64)> = self
            .orders
            .values()
            .filter(|o| o.status != OrderStatus::Done && o.pending.is_none() && pred(o))
            .map(|o| (o.engine, o.cl_ord_id))
            .collect();
        targets.sort_unstable();
        for (engine, cl) in targets {
            self.handle_cancel(engine, cl, ORIGIN_GATEWAY, now, out);
        }
    }

    /// One engine frame.
    pub fn on_engine_message(
        &mut self,
        engine: EngineId,
        bytes: &[u8],
        now: u64,
        out: &mut Outputs,
    ) {
        self.engine_message(engine, bytes, now, out);
        self.seal(out);
    }

    /// A request that does not decode: journaled (its first [`MALFORMED_KEPT`] bytes),
    /// answered with a Malformed reject, counted, logged at most once a second per engine;
    /// the one that reaches `max_malformed_frames` since the engine's logon cuts it off.
    fn on_malformed(&mut self, engine: EngineId, bytes: &[u8], now: u64, out: &mut Outputs) {
        let kept = &bytes[..bytes.len().min(MALFORMED_KEPT)];
        out.record(
            record::ENGINE_MALFORMED,
            &[
                &engine.to_le_bytes(),
                &(bytes.len() as u32).to_le_bytes(),
                kept,
            ],
        );
        self.counters.malformed_engine += 1;
        let max = self.max_malformed;
        let m = self.malformed.entry(engine).or_default();
        m.count = m.count.saturating_add(1);
        m.unlogged += 1;
        let cut_off = m.count == max;
        let quiet = self.replaying;
        if !quiet && (cut_off || now.saturating_sub(m.logged_at) >= MALFORMED_LOG_INTERVAL_NS) {
            tracing::warn!(
                engine,
                frames = m.unlogged,
                since_logon = m.count,
                max_malformed_frames = max,
                "malformed engine frames (answered Malformed)"
            );
            m.logged_at = now;
            m.unlogged = 0;
        }
        if cut_off {
            self.counters.malformed_disconnects += 1;
            if !quiet {
                tracing::warn!(
                    engine,
                    max_malformed_frames = max,
                    "engine sent too many malformed frames: disconnecting it \
                     (cancel-on-disconnect); nothing more is taken from it until it logs on \
                     again"
                );
            }
            if !out.kick.contains(&engine) {
                out.kick.push(engine);
            }
        }
        Self::malformed(engine, kept, out);
    }

    /// A request that does not decode is answered with a Malformed reject (live and replay).
    fn malformed(engine: EngineId, bytes: &[u8], out: &mut Outputs) {
        let cl = bytes
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        let ty = bytes.first().copied().unwrap_or(0);
        out.engine
            .push((engine, Response::reject(cl, ty, RejectReason::Malformed)));
    }

    fn engine_message(&mut self, engine: EngineId, bytes: &[u8], now: u64, out: &mut Outputs) {
        if self.malformed_since_logon(engine) >= self.max_malformed {
            // Cut off (its connection is being closed): nothing is taken, and its logon
            // answer will say so (last request taken).
            self.counters.frames_after_cutoff += 1;
            return;
        }
        let seq = request_seq(bytes);
        if seq != 0
            && seq <= self.last_request_seq(engine)
            && !self.request_holes.contains(engine, seq)
        {
            // Taken before (the engine could not know: it lost our answer or its state).
            // Answered with where the order stands; never acted on, nor journaled, again.
            if let Ok((req, _)) = Request::decode(bytes) {
                self.answer_resend(engine, &req, out);
            }
            self.counters.resent_requests += 1;
            return;
        }
        let req = match Request::decode(bytes) {
            Ok((r, _)) => r,
            Err(_) => {
                self.note_request_seq(engine, bytes);
                return self.on_malformed(engine, bytes, now, out);
            }
        };
        out.record(record::ENGINE_REQUEST, &[&engine.to_le_bytes(), bytes]);
        self.note_request_seq(engine, bytes);
        match req {
            Request::NewOrder(m) => self.handle_new(engine, &m, now, out),
            Request::Cancel(m) => {
                self.handle_cancel(engine, m.cl_ord_id.get(), ORIGIN_ENGINE, now, out)
            }
            Request::Replace(m) => self.handle_replace(engine, &m, now, out),
            Request::MassCancel(m) => {
                let (account, symbol) = (m.account.get(), m.symbol);
                self.cancel_where(now, out, |o| {
                    o.engine == engine
                        && (account == 0 || o.params.account == account)
                        && (symbol.is_blank() || o.params.symbol == symbol)
                });
            }
        }
    }

    /// The unnumbered status answer to a re-sent request.
    fn answer_resend(&self, engine: EngineId, req: &Request, out: &mut Outputs) {
        let cl = req.cl_ord_id();
        if matches!(req, Request::MassCancel(_)) {
            return; // no order to report on; its cancels went out when it was taken
        }
        let status = match self.order(engine, cl) {
            Some(o) => {
                let state = match o.status {
                    OrderStatus::PendingNew => OrdState::PendingNew,
                    OrderStatus::Open => OrdState::Open,
                    OrderStatus::Done if o.cum_qty >= o.params.qty => OrdState::Filled,
                    OrderStatus::Done => OrdState::Canceled,
                };
                let p = o.params;
                Response::status(
                    cl,
                    state,
                    p.qty,
                    o.cum_qty,
                    p.price,
                    req.msg_type(),
                    None,
                    req.seq(),
                )
            }
            None if req.msg_type() == msg_type::NEW_ORDER && self.risk.is_seen(engine, cl) => {
                // Rejected when taken: the reason is in the responses still kept.
                let reason = self.responses.get(&engine).and_then(|l| {
                    l.kept.iter().rev().find_map(|r| match r {
                        Response::Reject(x)
                            if x.cl_ord_id.get() == cl && x.request == msg_type::NEW_ORDER =>
                        {
                            Some(x.reason())
                        }
                        _ => None,
                    })
                });
                Response::status(
                    cl,
                    OrdState::Rejected,
                    0,
                    0,
                    0,
                    req.msg_type(),
                    reason,
                    req.seq(),
                )
            }
            None => Response::status(
                cl,
                OrdState::Unknown,
                0,
                0,
                0,
                req.msg_type(),
                None,
                req.seq(),
            ),
        };
        out.info.push((engine, status));
    }

    fn decision(out: &mut Outputs, d: &Decision, t: DecisionTrailer) {
        out.record(record::DECISION, &[d.as_bytes(), t.as_bytes()]);
    }

    #[allow(clippy::too_many_arguments)]
    fn reject_request(
        engine: EngineId,
        cl: u64,
        request: u8,
        reason: RejectReason,
        out: &mut Outputs,
        d: Option<Decision>,
        t: DecisionTrailer,
    ) {
        let d = d.unwrap_or_else(|| Decision {
            engine: U32::new(engine),
            account: U32::ZERO,
            cl_ord_id: U64::new(cl),
            order_id: U64::ZERO,
            request_id: U64::ZERO,
            price: I64::ZERO,
            qty: U32::ZERO,
            reason: U16::ZERO,
            request,
            side: 0,
            symbol: Symbol::default(),
        });
        Self::decision(
            out,
            &Decision {
                reason: U16::new(reason as u16),
                ..d
            },
            t,
        );
        out.engine
            .push((engine, Response::reject(cl, request, reason)));
    }

    fn handle_new(&mut self, engine: EngineId, m: &proto::NewOrder, now: u64, out: &mut Outputs) {
        let cl = m.cl_ord_id.get();
        let params = OrderParams {
            account: m.account.get(),
            symbol: m.symbol,
            side: m.side(),
            qty: m.qty.get(),
            price: m.price.get(),
        };
        let mut d = Decision {
            engine: U32::new(engine),
            account: m.account,
            cl_ord_id: m.cl_ord_id,
            order_id: U64::ZERO,
            request_id: U64::ZERO,
            price: m.price,
            qty: m.qty,
            reason: U16::ZERO,
            request: msg_type::NEW_ORDER,
            side: m.side,
            symbol: m.symbol,
        };
        let t = trailer(now, ORIGIN_ENGINE);
        let verdict = if self.session.state() != SessionState::Active {
            Err(RejectReason::SessionDown)
        } else {
            self.risk.check_new(engine, cl, &params, now)
        };
        // Ids are single-use whatever the verdict (replay marks every decision the same way).
        self.risk.mark_seen(engine, cl);
        if let Err(reason) = verdict {
            Self::reject_request(engine, cl, msg_type::NEW_ORDER, reason, out, Some(d), t);
            return;
        }
        let id = self.next_id;
        d.order_id = U64::new(id);
        d.request_id = U64::new(id);
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::CL_ORD_ID, id);
        push_uint(b, tag::ACCOUNT, u64::from(params.account));
        push_field(b, tag::SYMBOL, params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(params.side));
        self.send_order_body(b"D", params.qty, Some(params.price), m.tif, now, out);
    }

    /// Appends TransactTime, OrderQty, OrdType/Price, TimeInForce to `self.body` and sends it.
    fn send_order_body(
        &mut self,
        ty: &[u8],
        qty: u32,
        price: Option<i64>,
        tif: u8,
        now: u64,
        out: &mut Outputs,
    ) {
        let b = &mut self.body;
        push_timestamp(b, tag::TRANSACT_TIME, now);
        push_uint(b, tag::ORDER_QTY, u64::from(qty));
        if let Some(px) = price {
            push_field(b, tag::ORD_TYPE, b"2");
            push_price(b, tag::PRICE, px);
            if ty == b"D" {
                push_field(b, tag::TIME_IN_FORCE, &[tif]);
            }
        }
        let start = out.fix.len();
        self.session.send_app(ty, &self.body, now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// A cancel of one order: the engine's own (`ORIGIN_ENGINE`, throttled) or one the
    /// gateway makes (`ORIGIN_GATEWAY`: kill switch, cancel-all, mass cancel,
    /// cancel-on-disconnect; never throttled, or the operator would lose control).
    fn handle_cancel(
        &mut self,
        engine: EngineId,
        cl: u64,
        origin: u8,
        now: u64,
        out: &mut Outputs,
    ) {
        let t = trailer(now, origin);
        let Some(&oid) = self.by_engine.get(&(engine, cl)) else {
            return Self::reject_request(
                engine,
                cl,
                msg_type::CANCEL,
                RejectReason::UnknownOrder,
                out,
                None,
                t,
            );
        };
        let o = self.orders[&oid];
        let reason = if o.status == OrderStatus::Done {
            Some(RejectReason::UnknownOrder)
        } else if o.pending.is_some() {
            Some(RejectReason::PendingChange)
        } else if self.session.state() != SessionState::Active {
            Some(RejectReason::SessionDown)
        } else if origin == ORIGIN_ENGINE {
            self.risk.check_cancel(&o.params, now).err()
        } else {
            None
        };
        if let Some(r) = reason {
            return Self::reject_request(engine, cl, msg_type::CANCEL, r, out, None, t);
        }
        let id = self.next_id;
        let d = Decision {
            engine: U32::new(engine),
            account: U32::new(o.params.account),
            cl_ord_id: U64::new(cl),
            order_id: U64::new(oid),
            request_id: U64::new(id),
            price: I64::new(o.params.price),
            qty: U32::new(o.params.qty),
            reason: U16::ZERO,
            request: msg_type::CANCEL,
            side: o.params.side as u8,
            symbol: o.params.symbol,
        };
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::ORIG_CL_ORD_ID, o.venue_cl_ord_id);
        push_uint(b, tag::CL_ORD_ID, id);
        push_field(b, tag::SYMBOL, o.params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(o.params.side));
        self.send_order_body(b"F", o.params.qty, None, 0, now, out);
    }

    fn handle_replace(
        &mut self,
        engine: EngineId,
        m: &proto::Replace,
        now: u64,
        out: &mut Outputs,
    ) {
        let cl = m.cl_ord_id.get();
        let t = trailer(now, ORIGIN_ENGINE);
        let Some(&oid) = self.by_engine.get(&(engine, cl)) else {
            return Self::reject_request(
                engine,
                cl,
                msg_type::REPLACE,
                RejectReason::UnknownOrder,
                out,
                None,
                t,
            );
        };
        let o = self.orders[&oid];
        let new = OrderParams {
            qty: m.qty.get(),
            price: m.price.get(),
            ..o.params
        };
        let verdict = if o.status == OrderStatus::Done {
            Err(RejectReason::UnknownOrder)
        } else if o.pending.is_some() {
            Err(RejectReason::PendingChange)
        } else if self.session.state() != SessionState::Active {
            Err(RejectReason::SessionDown)
        } else if new.qty <= o.cum_qty {
            Err(RejectReason::MaxQuantity)
        } else {
            let leaves = o.params.qty - o.cum_qty;
            let new_open = OrderParams {
                qty: new.qty - o.cum_qty,
                ..new
            };
            self.risk
                .check_replace(engine, &o.params, leaves, &new_open, now)
        };
        if let Err(r) = verdict {
            return Self::reject_request(engine, cl, msg_type::REPLACE, r, out, None, t);
        }
        let id = self.next_id;
        let d = Decision {
            engine: U32::new(engine),
            account: U32::new(o.params.account),
            cl_ord_id: U64::new(cl),
            order_id: U64::new(oid),
            request_id: U64::new(id),
            price: m.price,
            qty: m.qty,
            reason: U16::ZERO,
            request: msg_type::REPLACE,
            side: o.params.side as u8,
            symbol: o.params.symbol,
        };
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::ORIG_CL_ORD_ID, o.venue_cl_ord_id);
        push_uint(b, tag::CL_ORD_ID, id);
        push_field(b, tag::SYMBOL, o.params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(o.params.side));
        self.send_order_body(b"G", new.qty, Some(new.price), 0, now, out);
    }

    /// State change of an accepted decision (live and replay).
    fn apply_decision(&mut self, d: &Decision) {
        let engine = d.engine.get();
        let cl = d.cl_ord_id.get();
        if d.request == msg_type::NEW_ORDER {
            self.risk.mark_seen(engine, cl);
        }
        if d.reason.get() != 0 {
            return;
        }
        let (oid, rid) = (d.order_id.get(), d.request_id.get());
        self.next_id = self.next_id.max(rid + 1);
        self.by_request.insert(rid, oid);
        match d.request {
            msg_type::NEW_ORDER => {
                let side = if d.side == Side::Sell as u8 {
                    Side::Sell
                } else {
                    Side::Buy
                };
                let params = OrderParams {
                    account: d.account.get(),
                    symbol: d.symbol,
                    side,
                    qty: d.qty.get(),
                    price: d.price.get(),
                };
                let replaced = self.orders.insert(
                    oid,
                    Order {
                        engine,
                        cl_ord_id: cl,
                        params,
                        cum_qty: 0,
                        status: OrderStatus::PendingNew,
                        venue_cl_ord_id: oid,
                        pending: None,
                    },
                );
                if replaced.is_none_or(|o| o.status == OrderStatus::Done) {
                    self.open_orders += 1;
                }
                self.by_engine.insert((engine, cl), oid);
                // Live, check_new already reserved; replay has to. Reserve here only on replay:
                // see replay_record.
            }
            msg_type::CANCEL => {
                if let Some(o) = self.orders.get_mut(&oid) {
                    o.pending = Some((rid, Change::Cancel));
                }
            }
            msg_type::REPLACE => {
                if let Some(o) = self.orders.get_mut(&oid) {
                    // The reservation stays on the old terms until the venue confirms the replace.
                    o.pending = Some((
                        rid,
                        Change::Replace {
                            qty: d.qty.get(),
                            price: d.price.get(),
                        },
                    ));
                }
            }
            _ => {}
        }
    }

    /// A checkpoint record replay could not read: the journal must not be used as if
    /// replayed (the caller stops the start with it).
    pub fn take_replay_error(&mut self) -> Option<crate::checkpoint::CheckpointError> {
        self.replay_error.take()
    }

    /// Whether a checkpoint keeps order `id`: live orders, and orders that became final
    /// since the previous checkpoint.
    fn kept(&self, id: u64, o: &Order) -> bool {
        o.status != OrderStatus::Done || !self.retired.contains(&id)
    }

    /// The recoverable state as a checkpoint payload ([`crate::checkpoint`]), for the first
    /// record ([`record::CHECKPOINT`]) of a new journal segment. Nothing changes until the
    /// driver has made it durable and calls [`checkpoint_written`](Self::checkpoint_written).
    pub fn checkpoint(&self) -> Result<Vec<u8>, crate::checkpoint::CheckpointError> {
        use crate::checkpoint::{GatewayState, OrderState};
        let mut orders: Vec<(u64, OrderState)> = self
            .orders
            .iter()
            .filter(|&(&id, o)| self.kept(id, o))
            .map(|(&id, o)| {
                let status = match o.status {
                    OrderStatus::PendingNew => 0,
                    OrderStatus::Open => 1,
                    OrderStatus::Done => 2,
                };
                let pending = o.pending.map(|(rid, c)| {
                    (
                        rid,
                        match c {
                            Change::Cancel => None,
                            Change::Replace { qty, price } => Some((qty, price)),
                        },
                    )
                });
                let p = o.params;
                (
                    id,
                    OrderState {
                        engine: o.engine,
                        cl_ord_id: o.cl_ord_id,
                        account: p.account,
                        symbol: p.symbol.0,
                        side: p.side as u8,
                        qty: p.qty,
                        price: p.price,
                        cum_qty: o.cum_qty,
                        status,
                        venue_cl_ord_id: o.venue_cl_ord_id,
                        pending,
                    },
                )
            })
            .collect();
        orders.sort_unstable_by_key(|(id, _)| *id);
        let keep = |id: &u64| self.orders.get(id).is_some_and(|o| self.kept(*id, o));
        let mut by_request: Vec<(u64, u64)> = self
            .by_request
            .iter()
            .filter(|(_, id)| keep(id))
            .map(|(&r, &id)| (r, id))
            .collect();
        by_request.sort_unstable();
        let mut responses: Vec<(u32, u32, Vec<Vec<u8>>)> = self
            .responses
            .iter()
            .map(|(&e, log)| {
                let kept = log.kept.iter().map(|r| r.as_bytes().to_vec()).collect();
                (e, log.last, kept)
            })
            .collect();
        responses.sort_unstable_by_key(|r| r.0);
        let mut last_request: Vec<(u32, u32)> =
            self.last_request.iter().map(|(&e, &n)| (e, n)).collect();
        last_request.sort_unstable();
        let mut connected: Vec<u32> = self.connected.iter().copied().collect();
        connected.sort_unstable();
        let mut malformed: Vec<(u32, u32)> = self
            .malformed
            .iter()
            .filter(|(_, m)| m.count > 0)
            .map(|(&e, m)| (e, m.count))
            .collect();
        malformed.sort_unstable();
        let state = GatewayState {
            next_id: self.next_id,
            orders,
            by_request,
            responses,
            last_request,
            connected,
            malformed,
            execs: self.execs.checkpoint_state(|id| keep(&id)),
            risk: self.risk.checkpoint_state(),
            session: self.session.checkpoint_state(),
        };
        crate::checkpoint::encode(&state)
    }

    /// The checkpoint from [`checkpoint`](Self::checkpoint) is durable: drop what it left
    /// out, so the live state is exactly what a restart from it rebuilds.
    pub fn checkpoint_written(&mut self) {
        let drop: Vec<u64> = self
            .orders
            .iter()
            .filter(|&(&id, o)| !self.kept(id, o))
            .map(|(&id, _)| id)
            .collect();
        for id in &drop {
            if let Some(o) = self.orders.remove(id) {
                self.by_engine.remove(&(o.engine, o.cl_ord_id));
            }
        }
        let orders = &self.orders;
        self.by_request.retain(|_, id| orders.contains_key(id));
        self.by_engine.retain(|_, id| orders.contains_key(id));
        self.retired = self
            .orders
            .iter()
            .filter(|(_, o)| o.status == OrderStatus::Done)
            .map(|(&id, _)| id)
            .collect();
        let state = self.execs.checkpoint_state(|id| orders.contains_key(&id));
        self.execs.restore_state(&state);
    }

    /// Replaces the whole recoverable state with a checkpoint's.
    fn restore_checkpoint(&mut self, s: &crate::checkpoint::GatewayState) {
        self.orders.clear();
        self.by_engine.clear();
        self.by_request.clear();
        self.retired.clear();
        self.open_orders = 0;
        for (id, o) in &s.orders {
            let symbol = Symbol(o.symbol);
            let side = if o.side == Side::Sell as u8 {
                Side::Sell
            } else {
                Side::Buy
            };
            let status = match o.status {
                0 => OrderStatus::PendingNew,
                1 => OrderStatus::Open,
                _ => OrderStatus::Done,
            };
            let pending = o.pending.map(|(rid, c)| {
                (
                    rid,
                    match c {
                        None => Change::Cancel,
                        Some((qty, price)) => Change::Replace { qty, price },
                    },
                )
            });
            let order = Order {
                engine: o.engine,
                cl_ord_id: o.cl_ord_id,
                params: OrderParams {
                    account: o.account,
                    symbol,
                    side,
                    qty: o.qty,
                    price: o.price,
                },
                cum_qty: o.cum_qty,
                status,
                venue_cl_ord_id: o.venue_cl_ord_id,
                pending,
            };
            if status == OrderStatus::Done {
                self.retired.insert(*id);
            } else {
                self.open_orders += 1;
            }
            self.by_engine.insert((o.engine, o.cl_ord_id), *id);
            self.orders.insert(*id, order);
        }
        self.by_request.extend(s.by_request.iter().copied());
        self.next_id = s.next_id;
        let history = self.history;
        for (engine, last, kept) in &s.responses {
            // Engines get a log with their first response, configured or not (see `seal`).
            let log = self
                .responses
                .entry(*engine)
                .or_insert_with(|| ResponseLog::new(history));
            log.last = *last;
            log.kept.clear();
            let skip = kept.len().saturating_sub(history);
            for bytes in &kept[skip..] {
                if let Ok((r, _)) = Response::decode(bytes) {
                    log.kept.push_back(r);
                }
            }
        }
        self.last_request = s.last_request.iter().copied().collect();
        self.connected = s.connected.iter().copied().collect();
        self.malformed.clear();
        for &(engine, count) in &s.malformed {
            self.malformed.entry(engine).or_default().count = count;
        }
        self.execs.restore_state(&s.execs);
        self.risk.restore_state(&s.risk);
        self.session.restore_state(&s.session);
    }

    /// Replays one journal record (recovery). Emits nothing, but numbers and keeps the
    /// engine responses the record produced live, so they can be replayed to engines.
    pub fn replay_record(&mut self, kind: u8, payload: &[u8]) {
        let mut scratch = std::mem::take(&mut self.scratch);
        self.replaying = true;
        self.replay_into(kind, payload, &mut scratch);
        self.replaying = false;
        self.seal(&mut scratch);
        scratch.clear();
        self.scratch = scratch;
    }

    fn replay_into(&mut self, kind: u8, payload: &[u8], scratch: &mut Outputs) {
        match kind {
            record::ENGINE_REQUEST => {
                let (Some(engine), Some(bytes)) = (payload.get(..4), payload.get(4..)) else {
                    return;
                };
                let id = u32::from_le_bytes(engine.try_into().unwrap_or_default());
                self.note_request_seq(id, bytes);
                if Request::decode(bytes).is_err() {
                    // Journals of earlier versions keep malformed frames whole, here.
                    self.counters.malformed_engine += 1;
                    Self::malformed(id, bytes, scratch);
                }
            }
            record::ENGINE_MALFORMED => {
                let (Some(engine), Some(kept)) = (payload.get(..4), payload.get(8..)) else {
                    return;
                };
                let engine = u32::from_le_bytes(engine.try_into().unwrap_or_default());
                self.note_request_seq(engine, kept);
                // `replaying` keeps it quiet; the cut-off is the same as live.
                self.on_malformed(engine, kept, 0, scratch);
            }
            record::DECISION => {
                let Ok((d, _)) = Decision::read_from_prefix(payload) else {
                    return;
                };
                if let Some(reason) = RejectReason::from_u16(d.reason.get()) {
                    let (engine, cl) = (d.engine.get(), d.cl_ord_id.get());
                    scratch
                        .engine
                        .push((engine, Response::reject(cl, d.request, reason)));
                }
                self.apply_decision(&d);
                let trailer = payload
                    .get(size_of::<Decision>()..)
                    .and_then(|t| DecisionTrailer::read_from_prefix(t).ok())
                    .map(|(t, _)| t);
                if d.reason.get() == 0 {
                    let p = self.orders.get(&d.order_id.get()).map(|o| o.params);
                    if let Some(p) = p {
                        if d.request == msg_type::NEW_ORDER {
                            self.risk.restore_open(&p);
                        }
                        if let Some(t) = trailer {
                            self.restore_windows(&d, &p, t);
                        }
                    }
                }
            }
            record::KILL => {
                if let [tag, a, b, c, d, on] = *payload {
                    let id = u32::from_le_bytes([a, b, c, d]);
                    let scope = match tag {
                        0 => Some(KillScope::Global),
                        1 => Some(KillScope::Engine(id)),
                        2 => Some(KillScope::Account(id)),
                        _ => None,
                    };
                    if let Some(scope) = scope {
                        // The cancels it caused are journaled as their own decisions.
                        self.risk.set_kill(scope, on != 0);
                    }
                }
            }
            record::ENGINE_SESSION => {
                if let (Some(e), Some(&ev)) = (payload.get(..4), payload.get(4)) {
                    let engine = u32::from_le_bytes(e.try_into().unwrap_or_default());
                    match ev {
                        SESSION_LOGON => {
                            self.connected.insert(engine);
                            self.reset_malformed(engine);
                        }
                        SESSION_DISCONNECT => {
                            self.connected.remove(&engine);
                            self.reset_malformed(engine);
                        }
                        _ => {}
                    }
                }
            }
            record::CHECKPOINT => match crate::checkpoint::decode(payload) {
                Ok(state) => self.restore_checkpoint(&state),
                Err(e) => {
                    if self.replay_error.is_none() {
                        self.replay_error = Some(e);
                    }
                }
            },
            record::FIX_OUT => self.session.replay_outbound(payload),
            record::FIX_IN => {
                if split_frame(payload).is_err() {
                    return;
                }
                let Ok(m) = Message::parse(payload) else {
                    // Rejected for its fields and consumed live: consume it again.
                    if let Some(seq) = find_seq(payload) {
                        self.session.consume_rejected(seq);
                    }
                    return;
                };
                self.session.replay_inbound(&m);
                if !matches!(m.msg_type(), b"0" | b"1" | b"2" | b"3" | b"4" | b"5" | b"A") {
                    let _ = self.apply_app(&m, scratch);
                }
            }
            _ => {}
        }
    }

    /// Counts an accepted decision in the throttle and repeated-order windows as its check
    /// did live (recovery).
    fn restore_windows(&mut self, d: &Decision, order: &OrderParams, t: DecisionTrailer) {
        let now = t.now.get();
        match d.request {
            msg_type::NEW_ORDER => self.risk.restore_request(RequestKind::New, order, now),
            msg_type::CANCEL if t.origin == ORIGIN_ENGINE => {
                self.risk.restore_request(RequestKind::Cancel, order, now)
            }
            msg_type::REPLACE => {
                let new = OrderParams {
                    qty: d.qty.get(),
                    price: d.price.get(),
                    ..*order
                };
                self.risk.restore_request(RequestKind::Replace, &new, now)
            }
            _ => {}
        }
    }

    /// Bytes from the venue.
    pub fn on_fix_bytes(&mut self, bytes: &[u8], now: u64, out: &mut Outputs) {
        let mut buf = std::mem::take(&mut self.inbuf);
        buf.extend_from_slice(bytes);
        let mut pos = 0;
        while pos < buf.len() {
            match split_frame(&buf[pos..]) {
                Ok(n) => {
                    self.on_frame(&buf[pos..pos + n], false, now, out);
                    self.drain_queued(now, out);
                    pos += n;
                }
                Err(crate::fix::FixError::Incomplete) => break,
                Err(
                    crate::fix::FixError::BadBeginString { skip }
                    | crate::fix::FixError::BadBodyLength { skip }
                    | crate::fix::FixError::BadChecksum { skip },
                ) => {
                    // Garbled frames are dropped (FIX spec); the gap they leave is resent.
                    self.counters.malformed_fix += 1;
                    self.session.count_garbled();
                    pos += skip.max(1);
                }
                Err(_) => {
                    self.counters.malformed_fix += 1;
                    pos = buf.len();
                }
            }
            if out.disconnect {
                break;
            }
        }
        buf.drain(..pos.min(buf.len()));
        self.inbuf = buf;
        self.seal(out);
    }

    /// Feeds the messages queued ahead of a gap that are now in sequence.
    fn drain_queued(&mut self, now: u64, out: &mut Outputs) {
        while !out.disconnect {
            let start = out.fix.len();
            let next = self.session.next_queued(now, &mut out.fix);
            Self::journal_out(out, start);
            let Some(frame) = next else { break };
            self.on_frame(&frame, true, now, out);
        }
    }

    fn on_frame(&mut self, frame: &[u8], queued: bool, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        let m = match Message::parse(frame) {
            Ok(m) => m,
            Err(e) => {
                self.counters.malformed_fix += 1;
                let seq = find_seq(frame);
                let (ref_tag, reason, text) = bad_field(frame, e);
                self.session.reject_typed(
                    seq.unwrap_or(0),
                    find_msg_type(frame).unwrap_or(b""),
                    ref_tag,
                    reason,
                    text,
                    now,
                    &mut out.fix,
                );
                tracing::warn!(seq, ?ref_tag, reason, text, "FIX message rejected");
                if let Some(seq) = seq {
                    let before = self.session.accepted_in();
                    self.session.consume_rejected(seq);
                    if self.session.accepted_in() != before {
                        // Journaled so a restart consumes the same number (replay_into).
                        out.record(record::FIX_IN, &[frame]);
                    }
                }
                Self::journal_out(out, start);
                return;
            }
        };
        let before = self.session.accepted_in();
        let ev = if queued {
            self.session.on_queued(m, now, &mut out.fix)
        } else {
            self.session.on_message(m, now, &mut out.fix)
        };
        if self.session.accepted_in() != before {
            out.record(record::FIX_IN, &[frame]);
        }
        match ev {
            SessionEvent::App(m) => {
                if let Err((t, reason, text)) = self.apply_app(&m, out) {
                    self.counters.rejected_app += 1;
                    let seq = m.seq().unwrap_or(0);
                    tracing::warn!(
                        seq,
                        tag = t,
                        reason,
                        text,
                        "FIX application message rejected"
                    );
                    self.session.reject_typed(
                        seq,
                        m.msg_type(),
                        Some(t),
                        reason,
                        text,
                        now,
                        &mut out.fix,
                    );
                }
            }
            SessionEvent::Disconnect => out.disconnect = true,
            SessionEvent::LoggedOn => self.query_orders_in_doubt(now, out),
            SessionEvent::None => {}
        }
        Self::journal_out(out, start);
    }

    /// At logon: an OrderStatusRequest (35=H) for every order sent and not yet acknowledged
    /// (after a crash or a lost connection the venue may or may not have it). The venue's
    /// answer (ExecType I) acknowledges those it has; for the others the session's resend
    /// handling delivers what is missing either way. Bounded per logon.
    fn query_orders_in_doubt(&mut self, now: u64, out: &mut Outputs) {
        const MAX_QUERIES: usize = 10_000;
        let mut doubt: Vec<(u64, u64)> = self
            .orders
            .iter()
            .filter(|(_, o)| o.status == OrderStatus::PendingNew)
            .map(|(&oid, o)| (oid, o.venue_cl_ord_id))
            .collect();
        doubt.sort_unstable();
        doubt.truncate(MAX_QUERIES);
        for (oid, venue_cl) in doubt {
            let Some(o) = self.orders.get(&oid) else {
                continue;
            };
            let (symbol, side) = (o.params.symbol, o.params.side);
            let b = &mut self.body;
            b.clear();
            push_uint(b, tag::CL_ORD_ID, venue_cl);
            push_field(b, tag::SYMBOL, symbol.as_bytes());
            push_field(b, tag::SIDE, side_fix(side));
            self.session.send_app(b"H", &self.body, now, &mut out.fix);
            self.counters.status_requests += 1;
        }
    }

    /// Applies an in-sequence application message (live and replay).
    fn apply_app(&mut self, m: &Message<'_>, out: &mut Outputs) -> Result<(), AppReject> {
        match m.msg_type() {
            b"8" => self.on_execution_report(m, out),
            b"9" => self.on_cancel_reject(m, out),
            _ => Ok(()),
        }
    }

    fn lookup(&mut self, m: &Message<'_>) -> Result<Option<(u64, u64)>, AppReject> {
        let req = m
            .require(tag::CL_ORD_ID)
            .map_err(|_| (tag::CL_ORD_ID, 1, "required tag missing"))?;
        // A ClOrdID that is not one of our numbers is an unknown order, not a bad message.
        let req = crate::fix::codec::parse_uint(req).unwrap_or(0);
        match self.by_request.get(&req) {
            Some(&oid) => Ok(Some((req, oid))),
            None => {
                self.counters.unknown_exec += 1;
                // Not ours, or an order final before the previous checkpoint: nothing to
                // apply it to, and an operator should know (a late fill moves the real
                // position). Logged at the 1st, 2nd, 4th, 8th... so a venue that floods
                // them cannot flood the log.
                if !self.replaying && self.counters.unknown_exec.is_power_of_two() {
                    tracing::warn!(
                        total = self.counters.unknown_exec,
                        cl_ord_id = req,
                        msg_type = %String::from_utf8_lossy(m.msg_type()),
                        exec_id = %String::from_utf8_lossy(m.get(tag::EXEC_ID).unwrap_or(b"")),
                        "venue report for an order the gateway does not hold: not applied"
                    );
                }
                Ok(None)
            }
        }
    }

    fn on_execution_report(&mut self, m: &Message<'_>, out: &mut Outputs) -> Result<(), AppReject> {
        // Every field needed is checked before anything changes, so a rejected report leaves
        // no trace but its (consumed) sequence number and the counters.
        let exec_type = m
            .require(tag::EXEC_TYPE)
            .map_err(|_| (tag::EXEC_TYPE, 1, "required tag missing"))?;
        if !matches!(
            exec_type,
            b"0" | b"1"
                | b"2"
                | b"3"
                | b"4"
                | b"5"
                | b"6"
                | b"7"
                | b"8"
                | b"9"
                | b"A"
                | b"B"
                | b"C"
                | b"D"
                | b"E"
                | b"F"
                | b"G"
                | b"H"
                | b"I"
                | b"L"
        ) {
            return Err((
                tag::EXEC_TYPE,
                5,
                "value is incorrect (out of range) for this tag",
            ));
        }
        for t in [tag::ORDER_ID, tag::EXEC_ID, tag::ORD_STATUS, tag::SIDE] {
            m.require(t).map_err(|_| (t, 1, "required tag missing"))?;
        }
        let exec_id = m.require(tag::EXEC_ID).unwrap_or(b"");
        let cum = parse_u32(m, tag::CUM_QTY)?;
        let leaves = parse_u32(m, tag::LEAVES_QTY)?;
        let trade = matches!(exec_type, b"F" | b"1" | b"2" | b"G");
        let (last_qty, last_px) = if trade {
            let q = parse_u32(m, tag::LAST_QTY)?;
            let px = m.price(tag::LAST_PX).map_err(|e| match e {
                crate::fix::FixError::MissingTag(_) => (tag::LAST_PX, 1, "required tag missing"),
                _ => (tag::LAST_PX, 6, "incorrect data format"),
            })?;
            (q, px)
        } else {
            (0, 0)
        };
        let exec_ref = if matches!(exec_type, b"G" | b"H") {
            m.require(tag::EXEC_REF_ID)
                .map_err(|_| (tag::EXEC_REF_ID, 1, "required tag missing"))?
        } else {
            b""
        };
        let Some((req, oid)) = self.lookup(m)? else {
            return Ok(());
        };
        if !self.execs.insert(oid, exec_id, (last_qty, last_px)) {
            // PossDup/PossResend copy, or the venue repeating itself: applied once already.
            self.counters.duplicate_execs += 1;
            return Ok(());
        }
        match exec_type {
            b"F" | b"1" | b"2" => return self.on_trade(oid, last_qty, last_px, cum, leaves, out),
            b"H" => return self.on_trade_change(oid, exec_ref, None, cum, leaves, out),
            b"G" => {
                let new = Some((last_qty, last_px));
                return self.on_trade_change(oid, exec_ref, new, cum, leaves, out);
            }
            _ => {}
        }
        let Some(o) = self.orders.get_mut(&oid) else {
            return Ok(());
        };
        if o.status == OrderStatus::Done {
            // A late cancel/reject for a final order: the engine was answered already.
            self.counters.late_answers += 1;
            return Ok(());
        }
        let cl = o.cl_ord_id;
        let engine = o.engine;
        match exec_type {
            b"0" if o.status == OrderStatus::PendingNew => {
                o.status = OrderStatus::Open;
                out.engine.push((engine, Response::ack(cl, oid)));
            }
            // Answer to an OrderStatusRequest: the venue has the order live (executions
            // arrive as their own reports, resent if need be).
            b"I" if o.status == OrderStatus::PendingNew
                && matches!(m.get(tag::ORD_STATUS), Some(b"0" | b"1" | b"2")) =>
            {
                o.status = OrderStatus::Open;
                out.engine.push((engine, Response::ack(cl, oid)));
            }
            b"4" | b"C" => {
                let leaves = o.params.qty.saturating_sub(o.cum_qty);
                o.status = OrderStatus::Done;
                self.open_orders -= 1;
                let p = o.params;
                self.risk.on_order_done(&p, leaves);
                out.engine.push((engine, Response::canceled(cl, leaves)));
            }
            b"5" => {
                if let Some((rid, Change::Replace { qty, price })) = o.pending {
                    if rid == req {
                        let old = o.params;
                        let old_open = OrderParams {
                            qty: old.qty.saturating_sub(o.cum_qty),
                            ..old
                        };
                        let new_open = OrderParams {
                            qty: qty.saturating_sub(o.cum_qty),
                            price,
                            ..old
                        };
                        self.risk.move_reservation(&old_open, &new_open);
                        o.params.qty = qty;
                        o.params.price = price;
                        o.venue_cl_ord_id = rid;
                        o.pending = None;
                        if o.status == OrderStatus::PendingNew {
                            o.status = OrderStatus::Open;
                        }
                        let leaves = qty.saturating_sub(o.cum_qty);
                        out.engine
                            .push((engine, Response::replaced(cl, qty, leaves, price)));
                    }
                }
            }
            b"8" => {
                let leaves = o.params.qty.saturating_sub(o.cum_qty);
                o.status = OrderStatus::Done;
                self.open_orders -= 1;
                let p = o.params;
                self.risk.on_order_done(&p, leaves);
                out.engine.push((
                    engine,
                    Response::reject(cl, msg_type::NEW_ORDER, RejectReason::VenueReject),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Quantity of `o` still reserved in risk: what is open while it is live.
    fn reserved(o: &Order) -> u32 {
        if o.status == OrderStatus::Done {
            0
        } else {
            o.params.qty.saturating_sub(o.cum_qty)
        }
    }

    /// A fill (ExecType F, or 1/2 of earlier FIX versions).
    fn on_trade(
        &mut self,
        oid: u64,
        last_qty: u32,
        last_px: i64,
        cum: u32,
        leaves: u32,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        let Some(o) = self.orders.get_mut(&oid) else {
            return Ok(());
        };
        if cum <= o.cum_qty {
            // CumQty did not grow: a repeat of a fill already applied under another ExecID.
            self.counters.duplicate_execs += 1;
            return Ok(());
        }
        let was_done = o.status == OrderStatus::Done;
        let reserved = Self::reserved(o);
        // What the order has left open follows CumQty, whatever LastQty says: a report whose
        // LastQty is not CumQty's growth (a venue bug, or fills we never saw) must not leave
        // the reservation out of step with the order.
        let grown = cum - o.cum_qty;
        let released = grown.min(reserved);
        if grown != last_qty {
            self.counters.inconsistent_fills += 1;
        }
        // Logged at the 1st, 2nd, 4th... so a venue that sends them all day cannot flood
        // the log.
        if grown != last_qty
            && !self.replaying
            && self.counters.inconsistent_fills.is_power_of_two()
        {
            tracing::warn!(
                total = self.counters.inconsistent_fills,
                order = oid,
                last_qty,
                cum,
                prev_cum = o.cum_qty,
                "execution report's LastQty is not its CumQty's growth"
            );
        }
        o.cum_qty = cum;
        if o.status == OrderStatus::PendingNew {
            o.status = OrderStatus::Open;
        }
        let overfill = cum > o.params.qty;
        let (p, cl, engine) = (o.params, o.cl_ord_id, o.engine);
        self.risk.on_execution(&p, last_qty, last_px, released);
        if overfill {
            self.counters.overfills += 1;
        }
        if was_done {
            self.counters.late_fills += 1;
            if !self.replaying {
                tracing::warn!(order = oid, last_qty, cum, "execution on a final order");
            }
            let kind = if overfill {
                proto::NoticeKind::Overfill
            } else {
                proto::NoticeKind::LateFill
            };
            out.engine.push((
                engine,
                Response::notice(cl, kind, i64::from(last_qty), last_px, cum, 0),
            ));
            return Ok(());
        }
        let leaves = if overfill { 0 } else { leaves };
        if leaves == 0 {
            // Final: whatever was reserved beyond this execution (an IOC remainder) goes too.
            if let Some(o) = self.orders.get_mut(&oid) {
                o.status = OrderStatus::Done;
            }
            self.open_orders -= 1;
            self.risk.on_order_done(&p, reserved - released);
        }
        out.engine
            .push((engine, Response::fill(cl, last_qty, last_px, cum, leaves)));
        if overfill {
            if !self.replaying {
                tracing::warn!(
                    order = oid,
                    qty = p.qty,
                    cum,
                    "over-fill: CumQty above OrderQty"
                );
            }
            out.engine.push((
                engine,
                Response::notice(cl, proto::NoticeKind::Overfill, 0, last_px, cum, 0),
            ));
        }
        Ok(())
    }

    /// A trade cancel (`new` None, ExecType H) or correct (`new` the corrected quantity and
    /// price, ExecType G) of execution `exec_ref`: positions and executed notional lose the
    /// old execution and gain the new one; the order takes the venue's CumQty and LeavesQty
    /// (a bust can make a filled order live again).
    fn on_trade_change(
        &mut self,
        oid: u64,
        exec_ref: &[u8],
        new: Option<(u32, i64)>,
        cum: u32,
        leaves: u32,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        let Some(o) = self.orders.get(&oid) else {
            return Ok(());
        };
        let (p, cl, engine, old_cum) = (o.params, o.cl_ord_id, o.engine, o.cum_qty);
        let old_reserved = Self::reserved(o);
        let was_open = o.status != OrderStatus::Done;
        let (new_qty, new_px) = new.unwrap_or((0, 0));
        let old = match self.execs.trade(oid, exec_ref) {
            Some(t) => t,
            None => {
                // Not remembered (too old, or never seen): what the venue's CumQty says.
                self.counters.trade_refs_unknown += 1;
                let q = (i64::from(old_cum) - i64::from(cum) + i64::from(new_qty)).max(0);
                (
                    u32::try_from(q).unwrap_or(0),
                    if new.is_some() { new_px } else { p.price },
                )
            }
        };
        self.risk.on_execution_reversed(&p, old.0, old.1);
        if new.is_some() {
            self.risk.on_execution(&p, new_qty, new_px, 0);
        }
        self.execs.set_trade(oid, exec_ref, (new_qty, new_px));
        let now_open = leaves > 0 && p.qty > cum;
        let new_reserved = if now_open { p.qty - cum } else { 0 };
        if let Some(o) = self.orders.get_mut(&oid) {
            o.cum_qty = cum;
            if was_open && !now_open {
                o.status = OrderStatus::Done;
            } else if !was_open && now_open {
                o.status = OrderStatus::Open;
            }
        }
        match (was_open, now_open) {
            (true, true) => self.risk.move_reservation(
                &OrderParams {
                    qty: old_reserved,
                    ..p
                },
                &OrderParams {
                    qty: new_reserved,
                    ..p
                },
            ),
            (true, false) => {
                self.open_orders -= 1;
                self.risk.on_order_done(&p, old_reserved);
            }
            (false, true) => {
                self.open_orders += 1;
                self.risk.restore_open(&OrderParams {
                    qty: new_reserved,
                    ..p
                });
            }
            (false, false) => {}
        }
        let (kind, px) = match new {
            None => {
                self.counters.trade_cancels += 1;
                (proto::NoticeKind::TradeCancel, old.1)
            }
            Some(_) => {
                self.counters.trade_corrections += 1;
                (proto::NoticeKind::TradeCorrect, new_px)
            }
        };
        let delta = i64::from(new_qty) - i64::from(old.0);
        if !self.replaying {
            tracing::warn!(
                order = oid,
                ?kind,
                delta,
                cum,
                leaves,
                "venue changed an execution"
            );
        }
        out.engine.push((
            engine,
            Response::notice(cl, kind, delta, px, cum, new_reserved),
        ));
        Ok(())
    }

    fn on_cancel_reject(&mut self, m: &Message<'_>, out: &mut Outputs) -> Result<(), AppReject> {
        let Some((req, oid)) = self.lookup(m)? else {
            return Ok(());
        };
        let Some(o) = self.orders.get_mut(&oid) else {
            return Ok(());
        };
        let Some((rid, change)) = o.pending else {
            self.counters.late_answers += 1;
            return Ok(());
        };
        if rid != req {
            self.counters.late_answers += 1;
            return Ok(());
        }
        // Answered even when a fill or cancel made the order final meanwhile: the engine
        // learns its request failed, and its client takes a cancel/replace reject of a
        // final order as information.
        o.pending = None;
        let request = match change {
            Change::Cancel => msg_type::CANCEL,
            Change::Replace { .. } => msg_type::REPLACE,
        };
        let (engine, cl) = (o.engine, o.cl_ord_id);
        out.engine.push((
            engine,
            Response::reject(cl, request, RejectReason::VenueCancelReject),
        ));
        Ok(())
    }
}

/// The request sequence number in an engine frame's header (0: unnumbered or no header).
fn trailer(now: u64, origin: u8) -> DecisionTrailer {
    DecisionTrailer {
        now: U64::new(now),
        origin,
    }
}

fn request_seq(frame: &[u8]) -> u32 {
    frame
        .get(4..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

/// Finds MsgType in a frame whose fields did not all parse.
fn find_msg_type(frame: &[u8]) -> Option<&[u8]> {
    let at = frame.windows(4).position(|w| w == b"\x0135=")? + 4;
    let len = frame[at..]
        .iter()
        .position(|&c| c == crate::fix::codec::SOH)?;
    Some(&frame[at..at + len])
}

/// RefTagID, SessionRejectReason and text for a frame whose fields do not parse: an empty
/// value is reason 4 (tag specified without a value), anything else 0 (invalid tag number),
/// as QuickFIX reports them.
fn bad_field(frame: &[u8], e: crate::fix::FixError) -> (Option<u32>, u32, &'static str) {
    let crate::fix::FixError::BadField(at) = e else {
        return (Some(tag::MSG_TYPE), 1, "MsgType missing or not first");
    };
    // `at` is relative to the body, which starts after BodyLength.
    let body = frame
        .iter()
        .skip(10)
        .position(|&c| c == crate::fix::codec::SOH)
        .map_or(0, |i| i + 11);
    let field = frame.get(body + at..).unwrap_or(b"");
    let field = &field[..field
        .iter()
        .position(|&c| c == crate::fix::codec::SOH)
        .unwrap_or(field.len())];
    match field.iter().position(|&c| c == b'=') {
        Some(eq) => {
            let t = std::str::from_utf8(&field[..eq])
                .ok()
                .and_then(|t| t.parse::<u32>().ok())
                .filter(|&t| t > 0);
            match t {
                Some(t) if eq + 1 == field.len() => (Some(t), 4, "tag specified without a value"),
                _ => (None, 0, "invalid tag number"),
            }
        }
        None => (None, 0, "invalid tag number"),
    }
}

/// Finds MsgSeqNum in a frame whose fields did not all parse.
fn find_seq(frame: &[u8]) -> Option<u64> {
    let at = frame.windows(4).position(|w| w == b"\x0134=")? + 4;
    let digits = frame[at..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    std::str::from_utf8(&frame[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::fix::MessageWriter;
    use crate::journal::decode_record;
    use crate::proto::{Cancel, NewOrder, Replace, TimeInForce, PRICE_SCALE};

    pub(crate) const SEC: u64 = 1_000_000_000;
    pub(crate) const T0: u64 = 1_704_207_600 * SEC;

    /// One account (7) and one engine (1); shared with `fix::recovery_tests`.
    pub(crate) fn risk() -> RiskConfig {
        toml::from_str(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 10000000
            max_position = 100000
            max_open_orders = 100
            max_orders_per_interval = 100
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#,
        )
        .unwrap()
    }

    pub(crate) fn session() -> SessionConfig {
        SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
        }
    }

    pub(crate) fn aapl() -> Symbol {
        Symbol::new("AAPL").unwrap()
    }

    struct Venue {
        seq: u64,
    }

    impl Venue {
        fn frame(&mut self, ty: &[u8], fields: &[(u32, &[u8])]) -> Vec<u8> {
            let mut w = MessageWriter::default();
            w.start(ty)
                .field(49, b"VENUE")
                .field(56, b"GW")
                .uint(34, self.seq)
                .timestamp(52, T0);
            self.seq += 1;
            for (t, v) in fields {
                w.field(*t, v);
            }
            let mut out = Vec::new();
            w.finish(&mut out);
            out
        }

        fn exec(&mut self, cl: u64, exec_type: &[u8], last: u32, cum: u32, leaves: u32) -> Vec<u8> {
            let cl = cl.to_string();
            let (last, cum, leaves) = (last.to_string(), cum.to_string(), leaves.to_string());
            self.frame(
                b"8",
                &[
                    (37, b"V1"),
                    (17, self.seq.to_string().as_bytes()),
                    (11, cl.as_bytes()),
                    (150, exec_type),
                    (39, b"0"),
                    (55, b"AAPL"),
                    (54, b"1"),
                    (32, last.as_bytes()),
                    (31, b"100.0"),
                    (14, cum.as_bytes()),
                    (151, leaves.as_bytes()),
                    (6, b"100"),
                ],
            )
        }
    }

    /// A logged-on gateway with a fresh reference price.
    fn active() -> (Gateway, Venue, Outputs) {
        let mut gw = Gateway::new(session(), &risk()).unwrap();
        let mut out = Outputs::default();
        gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        gw.on_connect(T0, &mut out);
        let mut v = Venue { seq: 1 };
        let logon = v.frame(b"A", &[(98, b"0"), (108, b"30")]);
        gw.on_fix_bytes(&logon, T0, &mut out);
        assert_eq!(gw.session().state(), SessionState::Active);
        (gw, v, out)
    }

    fn new_order(cl: u64, qty: u32, px: i64) -> NewOrder {
        NewOrder::new(
            cl,
            7,
            aapl(),
            Side::Buy,
            qty,
            px * PRICE_SCALE,
            TimeInForce::Day,
        )
    }

    fn last_fix(out: &Outputs) -> Vec<u8> {
        let mut rest = &out.fix[..];
        let mut last = Vec::new();
        while let Ok(n) = split_frame(rest) {
            last = rest[..n].to_vec();
            rest = &rest[n..];
        }
        last
    }

    #[test]
    fn new_order_goes_out_as_new_order_single_and_fills_come_back() {
        let (mut gw, mut v, mut out) = active();
        out.clear();
        gw.on_engine_message(1, new_order(42, 300, 100).as_bytes(), T0, &mut out);
        let f = last_fix(&out);
        let m = Message::parse(&f).unwrap();
        assert_eq!(m.msg_type(), b"D");
        let id = m.uint(tag::CL_ORD_ID).unwrap();
        assert_eq!(
            (m.get(55), m.get(54), m.get(38), m.get(44), m.get(40)),
            (
                Some(&b"AAPL"[..]),
                Some(&b"1"[..]),
                Some(&b"300"[..]),
                Some(&b"100.0000"[..]),
                Some(&b"2"[..])
            )
        );
        assert!(out.engine.is_empty());
        out.clear();
        gw.on_fix_bytes(&v.exec(id, b"0", 0, 0, 300), T0, &mut out);
        gw.on_fix_bytes(&v.exec(id, b"F", 100, 100, 200), T0, &mut out);
        gw.on_fix_bytes(&v.exec(id, b"F", 200, 300, 0), T0, &mut out);
        let got: Vec<u8> = out.engine.iter().map(|(_, r)| r.as_bytes()[0]).collect();
        assert_eq!(got, [msg_type::ACK, msg_type::PARTIAL_FILL, msg_type::FILL]);
        assert_eq!(gw.order(1, 42).unwrap().status, OrderStatus::Done);
        assert_eq!(gw.risk().position(7, aapl()), 300);
        assert_eq!(gw.risk().open_orders(7), 0);
        // A late duplicate report is ignored: the engine was answered once.
        out.clear();
        gw.on_fix_bytes(&v.exec(id, b"F", 200, 300, 0), T0, &mut out);
        assert!(out.engine.is_empty());
    }

    #[test]
    fn risk_and_session_rejects_reach_the_engine_with_reason() {
        let mut gw = Gateway::new(session(), &risk()).unwrap();
        let mut out = Outputs::default();
        gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
        let Response::Reject(r) = out.engine[0].1 else {
            panic!()
        };
        assert_eq!(r.reason(), RejectReason::SessionDown);
        let (mut gw, _, mut out) = active();
        out.clear();
        gw.on_engine_message(1, new_order(1, 10, 120).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(2, 5000, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(2, new_order(3, 10, 100).as_bytes(), T0, &mut out);
        let reasons: Vec<RejectReason> = out
            .engine
            .iter()
            .map(|(_, r)| match r {
                Response::Reject(r) => r.reason(),
                _ => panic!("not a reject"),
            })
            .collect();
        assert_eq!(
            reasons,
            [
                RejectReason::PriceCollar,
                RejectReason::MaxQuantity,
                RejectReason::AccountNotGranted
            ]
        );
        assert!(out.fix.is_empty(), "nothing rejected reaches the venue");
    }

    #[test]
    fn malformed_engine_and_fix_input_is_counted_not_fatal() {
        let (mut gw, mut v, mut out) = active();
        out.clear();
        gw.on_engine_message(1, &[b'N', 1, 48, 0], T0, &mut out);
        gw.on_engine_message(1, &[], T0, &mut out);
        assert_eq!(gw.counters().malformed_engine, 2);
        assert!(
            matches!(out.engine[0].1, Response::Reject(r) if r.reason() == RejectReason::Malformed)
        );
        // Bad checksum: dropped and counted.
        let mut f = v.frame(b"0", &[]);
        let l = f.len();
        f[l - 2] = b'0' + (f[l - 2] - b'0' + 1) % 10;
        gw.on_fix_bytes(&f, T0, &mut out);
        assert_eq!(gw.counters().malformed_fix, 1);
        // Garbage between frames.
        gw.on_fix_bytes(b"\x00\x01garbage8=FIY", T0, &mut out);
        assert!(gw.counters().malformed_fix >= 2);
        // An execution report missing ExecType: session-level Reject.
        v.seq = gw.session().next_in();
        out.clear();
        let bad = v.frame(b"8", &[(37, b"V"), (11, b"1")]);
        gw.on_fix_bytes(&bad, T0, &mut out);
        let m = Message::parse(&out.fix).unwrap();
        assert_eq!(
            (m.msg_type(), m.uint(tag::REF_TAG_ID)),
            (&b"3"[..], Ok(u64::from(tag::EXEC_TYPE)))
        );
        assert_eq!(gw.counters().rejected_app, 1);
        // Field syntax broken: Reject too, and the session goes on.
        let mut w = MessageWriter::default();
        w.start(b"8")
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, v.seq)
            .raw_fields(b"oops\x01");
        let mut f = Vec::new();
        w.finish(&mut f);
        out.clear();
        gw.on_fix_bytes(&f, T0, &mut out);
        assert_eq!(Message::parse(&out.fix).unwrap().msg_type(), b"3");
        assert_eq!(gw.session().state(), SessionState::Active);
    }

    #[test]
    fn cancel_replace_and_cancel_on_disconnect() {
        let (mut gw, mut v, mut out) = active();
        gw.on_engine_message(1, new_order(1, 500, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(2, 500, 100).as_bytes(), T0, &mut out);
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 500), T0, &mut out);
        out.clear();
        gw.on_engine_message(
            1,
            Replace::new(1, 400, 99 * PRICE_SCALE).as_bytes(),
            T0,
            &mut out,
        );
        let m = Message::parse(&out.fix).unwrap();
        assert_eq!(
            (m.msg_type(), m.uint(41), m.get(38)),
            (&b"G"[..], Ok(id1), Some(&b"400"[..]))
        );
        let rid = m.uint(11).unwrap();
        // A second change while one is pending is refused.
        gw.on_engine_message(1, Cancel::new(1).as_bytes(), T0, &mut out);
        assert!(
            matches!(out.engine.last().unwrap().1, Response::Reject(r) if r.reason() == RejectReason::PendingChange)
        );
        gw.on_fix_bytes(&v.exec(rid, b"5", 0, 0, 400), T0, &mut out);
        assert!(
            matches!(out.engine.last().unwrap().1, Response::Replaced(r) if r.qty.get() == 400)
        );
        assert_eq!(gw.order(1, 1).unwrap().params.price, 99 * PRICE_SCALE);
        assert_eq!(gw.risk().exposure(7).0, 400 * 99 + 500 * 100);
        out.clear();
        gw.on_engine_disconnect(1, T0, &mut out);
        let mut rest = &out.fix[..];
        let mut cancels = Vec::new();
        while let Ok(n) = split_frame(rest) {
            let m = Message::parse(&rest[..n]).unwrap();
            assert_eq!(m.msg_type(), b"F");
            cancels.push((m.uint(41).unwrap(), m.uint(11).unwrap()));
            rest = &rest[n..];
        }
        assert_eq!(cancels.len(), 2);
        for (_, req) in cancels {
            gw.on_fix_bytes(&v.exec(req, b"4", 0, 0, 0), T0, &mut out);
        }
        assert_eq!(gw.open_order_count(), 0);
        assert_eq!(gw.open_order_scan(), 0);
        assert_eq!(gw.risk().exposure(7), (0, 0));
    }

    #[test]
    fn open_order_count_is_kept_through_fills_cancels_and_rejects() {
        let (mut gw, mut v, mut out) = active();
        let check = |gw: &Gateway, n: usize| {
            assert_eq!((gw.open_order_count(), gw.open_order_scan()), (n, n));
        };
        for cl in 1..=4 {
            gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), T0, &mut out);
        }
        check(&gw, 4);
        let id = |gw: &Gateway, cl| gw.order(1, cl).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id(&gw, 1), b"0", 0, 0, 10), T0, &mut out);
        check(&gw, 4); // acked: still open
        gw.on_fix_bytes(&v.exec(id(&gw, 1), b"1", 4, 4, 6), T0, &mut out);
        check(&gw, 4); // partly filled
        gw.on_fix_bytes(&v.exec(id(&gw, 1), b"2", 6, 10, 0), T0, &mut out);
        check(&gw, 3); // filled
        gw.on_fix_bytes(&v.exec(id(&gw, 1), b"2", 6, 10, 0), T0, &mut out);
        check(&gw, 3); // a late duplicate report changes nothing
        gw.on_fix_bytes(&v.exec(id(&gw, 2), b"4", 0, 0, 0), T0, &mut out);
        check(&gw, 2); // canceled
        gw.on_fix_bytes(&v.exec(id(&gw, 3), b"8", 0, 0, 0), T0, &mut out);
        check(&gw, 1); // rejected by the venue
    }

    #[test]
    fn kill_switch_cancels_and_blocks() {
        let (mut gw, _, mut out) = active();
        gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
        out.clear();
        gw.set_kill(KillScope::Account(7), true, T0, &mut out);
        assert_eq!(Message::parse(&out.fix).unwrap().msg_type(), b"F");
        gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
        assert!(
            matches!(out.engine.last().unwrap().1, Response::Reject(r) if r.reason() == RejectReason::KillSwitchAccount)
        );
    }

    #[test]
    fn journal_replay_rebuilds_orders_positions_and_sequence_numbers() {
        let (mut gw, mut v, mut out) = active();
        let mut journal = Vec::new();
        gw.on_engine_message(1, new_order(1, 300, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(3, 10, 200).as_bytes(), T0, &mut out); // collar reject
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"F", 100, 100, 200), T0, &mut out);
        journal.extend_from_slice(&out.journal);
        let mut r = Gateway::new(session(), &risk()).unwrap();
        let mut rest = &journal[..];
        while let Some((k, p, n)) = decode_record(rest) {
            r.replay_record(k, p);
            rest = &rest[n..];
        }
        assert!(rest.is_empty());
        assert_eq!(
            (r.session().next_out(), r.session().next_in()),
            (gw.session().next_out(), gw.session().next_in())
        );
        assert_eq!(r.open_order_count(), 2);
        assert_eq!(gw.open_order_count(), gw.open_order_scan());
        assert_eq!(r.order(1, 1).unwrap().cum_qty, 100);
        assert_eq!(r.risk().position(7, aapl()), 100);
        assert_eq!(r.risk().exposure(7), gw.risk().exposure(7));
        assert_eq!(r.risk().open_orders(7), 2);
        // Ids are not reused, and engine ids stay single-use (including the rejected one).
        let mut out2 = Outputs::default();
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        r.on_engine_message(1, new_order(3, 10, 100).as_bytes(), T0, &mut out2);
        assert!(
            matches!(out2.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::SessionDown)
        );
        r.on_connect(T0, &mut out2);
        r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out2);
        out2.clear();
        r.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out2);
        assert!(
            matches!(out2.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::DuplicateClientOrderId)
        );
        r.on_engine_message(1, new_order(9, 10, 100).as_bytes(), T0, &mut out2);
        let m = Message::parse(&last_fix(&out2)).unwrap().uint(11).unwrap();
        assert!(m > gw.order(1, 2).unwrap().venue_cl_ord_id);
    }
    /// A venue ResendRequest answered with thousands of messages (several MiB of FIX) is
    /// journaled, and after a restart every record after it still replays.
    #[test]
    fn a_resend_of_several_mebibytes_is_journaled_and_everything_after_it_replays() {
        use crate::journal::{FsyncPolicy, Journal};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let big = r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            max_identical_orders = 0
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 100000000000
            max_position = 100000000
            max_open_orders = 100000
            max_orders_per_interval = 100000
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
        "#;
        let risk: RiskConfig = toml::from_str(big).unwrap();
        let (mut j, _) = Journal::open(&path, FsyncPolicy::Never, |_, _| {}).unwrap();
        let mut gw = Gateway::new(session(), &risk).unwrap();
        let mut out = Outputs::default();
        let flush = |out: &mut Outputs, j: &mut Journal| {
            j.append(&out.journal, out.journal_records).unwrap();
            out.clear();
        };
        gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        gw.on_connect(T0, &mut out);
        let mut v = Venue { seq: 1 };
        gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
        flush(&mut out, &mut j);
        for cl in 1..=6000 {
            gw.on_engine_message(1, new_order(cl, 1, 100).as_bytes(), T0, &mut out);
            flush(&mut out, &mut j);
        }
        let resend = v.frame(b"2", &[(7, b"1"), (16, b"0")]);
        gw.on_fix_bytes(&resend, T0, &mut out);
        assert!(out.fix.len() > 1 << 20, "resend of {} bytes", out.fix.len());
        flush(&mut out, &mut j);
        // Later history: a fill and one more order.
        let id = gw.order(1, 5999).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id, b"F", 1, 1, 0), T0, &mut out);
        gw.on_engine_message(1, new_order(6001, 1, 100).as_bytes(), T0, &mut out);
        flush(&mut out, &mut j);
        drop(j);
        let mut r = Gateway::new(session(), &risk).unwrap();
        let (_, stats) =
            Journal::open(&path, FsyncPolicy::Never, |k, p| r.replay_record(k, p)).unwrap();
        assert_eq!(stats.truncated_bytes, 0);
        assert_eq!(
            (r.session().next_out(), r.session().next_in()),
            (gw.session().next_out(), gw.session().next_in())
        );
        assert_eq!(r.order(1, 5999).unwrap().cum_qty, 1);
        assert!(r.order(1, 6001).is_some());
        assert_eq!(r.open_order_count(), gw.open_order_count());
    }

    /// Numbers a request frame as an engine's client does.
    fn numbered<T: IntoBytes + Immutable>(m: &T, seq: u32) -> Vec<u8> {
        let mut b = m.as_bytes().to_vec();
        b[4..8].copy_from_slice(&seq.to_le_bytes());
        b
    }

    /// A request taken before (even before a restart) is answered with the order's state,
    /// unnumbered, and neither journaled nor sent to the venue again.
    #[test]
    fn a_resent_request_is_answered_with_status_and_never_acted_on_twice() {
        let (mut gw, mut v, mut out) = active();
        let mut journal = Vec::new();
        gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
        gw.on_engine_message(1, &numbered(&new_order(2, 10, 200), 2), T0, &mut out); // collar
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"1", 100, 100, 200), T0, &mut out);
        assert_eq!(gw.last_request_seq(1), 2);
        journal.extend_from_slice(&out.journal);
        // After a restart the journal alone says what was taken.
        let mut r = replay(&journal);
        assert_eq!(r.last_request_seq(1), 2);
        assert_eq!(r.last_request_seq(2), 0);
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        r.on_connect(T0, &mut out);
        r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
        out.clear();
        r.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
        r.on_engine_message(1, &numbered(&new_order(2, 10, 200), 2), T0, &mut out);
        r.on_engine_message(1, &numbered(&Cancel::new(1), 2), T0, &mut out);
        assert!(out.fix.is_empty() && out.journal.is_empty() && out.engine.is_empty());
        let st: Vec<(u64, u8, u32, u16, u8)> = out
            .info
            .iter()
            .map(|(e, resp)| {
                assert_eq!(*e, 1);
                assert_eq!(resp.seq(), 0, "status answers are unnumbered");
                let Response::Status(s) = resp else {
                    panic!("{resp:?}")
                };
                (
                    s.cl_ord_id.get(),
                    s.state,
                    s.cum_qty.get(),
                    s.reason.get(),
                    s.request,
                )
            })
            .collect();
        assert_eq!(
            st,
            [
                (1, OrdState::Open as u8, 100, 0, msg_type::NEW_ORDER),
                (
                    2,
                    OrdState::Rejected as u8,
                    0,
                    RejectReason::PriceCollar as u16,
                    msg_type::NEW_ORDER
                ),
                (1, OrdState::Open as u8, 100, 0, msg_type::CANCEL),
            ]
        );
        assert_eq!(r.counters().resent_requests, 3);
        // The next number is a new request, acted on as usual.
        out.clear();
        r.on_engine_message(1, &numbered(&new_order(3, 10, 100), 3), T0, &mut out);
        assert!(!out.fix.is_empty() && out.info.is_empty());
        assert_eq!(r.last_request_seq(1), 3);
    }

    fn fix_types(out: &Outputs) -> Vec<Vec<u8>> {
        let mut rest = &out.fix[..];
        let mut types = Vec::new();
        while let Ok(n) = split_frame(rest) {
            types.push(Message::parse(&rest[..n]).unwrap().msg_type().to_vec());
            rest = &rest[n..];
        }
        types
    }

    /// An engine logged on when the gateway died has `engine_timeout` after the restart to
    /// log on again; if it does not, its open orders are cancelled at the venue.
    #[test]
    fn cancel_on_disconnect_survives_a_restart() {
        let (mut gw, mut v, mut out) = active();
        gw.on_engine_logon(1, &mut out);
        gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
        gw.on_engine_message(1, &numbered(&new_order(2, 300, 100), 2), T0, &mut out);
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
        let journal = out.journal.clone();
        let restart = |v: &mut Venue| {
            let mut r = replay(&journal);
            r.arm_restart_cancel_on_disconnect(T0, 5 * SEC);
            assert_eq!(r.restart_deadlines(), &[(1, T0 + 5 * SEC)]);
            let mut o = Outputs::default();
            r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
            r.on_connect(T0, &mut o);
            r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut o);
            o.clear();
            (r, o)
        };
        // The engine never comes back: both open orders are cancelled once the time is up.
        let (mut r, mut o) = restart(&mut v);
        r.on_timer(T0 + SEC, &mut o);
        assert!(!fix_types(&o).contains(&b"F".to_vec()));
        r.on_timer(T0 + 6 * SEC, &mut o);
        assert_eq!(fix_types(&o), [b"F".to_vec(), b"F".to_vec()]);
        assert_eq!(r.counters().deferred_cancel_on_disconnect, 1);
        assert!(r.restart_deadlines().is_empty());
        // It logs on in time: nothing is cancelled.
        let (mut r, mut o) = restart(&mut v);
        r.on_engine_logon(1, &mut o);
        r.on_timer(T0 + 6 * SEC, &mut o);
        assert!(!fix_types(&o).contains(&b"F".to_vec()));
        // A clean disconnect before the crash leaves nothing to guard.
        let mut clean = Outputs::default();
        let (mut g2, _, _) = active();
        g2.on_engine_logon(1, &mut clean);
        g2.on_engine_disconnect(1, T0, &mut clean);
        let mut r2 = replay(&clean.journal);
        r2.arm_restart_cancel_on_disconnect(T0, 5 * SEC);
        assert!(r2.restart_deadlines().is_empty());
    }

    /// A kill switch is journaled: after a restart it is still on, and new orders are
    /// rejected with its reason until it is turned off.
    #[test]
    fn kill_switches_survive_a_restart() {
        let (mut gw, mut v, mut out) = active();
        gw.set_kill(KillScope::Account(7), true, T0, &mut out);
        gw.set_kill(KillScope::Global, true, T0, &mut out);
        gw.set_kill(KillScope::Global, false, T0, &mut out);
        let mut r = replay(&out.journal);
        assert_eq!(r.risk().kills(), (false, vec![], vec![7]));
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        let mut o = Outputs::default();
        r.on_connect(T0, &mut o);
        r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut o);
        o.clear();
        r.on_engine_message(1, &numbered(&new_order(1, 10, 100), 1), T0, &mut o);
        assert!(
            matches!(o.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::KillSwitchAccount),
            "{:?}",
            o.engine
        );
    }

    /// An engine that drops while the venue session is down has its orders cancelled once
    /// the session is back, instead of cancels rejected as SessionDown to nobody.
    #[test]
    fn cancel_on_disconnect_waits_for_the_venue_session() {
        let (mut gw, mut v, mut out) = active();
        gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
        gw.on_disconnect();
        out.clear();
        gw.on_engine_disconnect(1, T0, &mut out);
        assert!(out.fix.is_empty() && out.engine.is_empty());
        gw.on_timer(T0 + SEC, &mut out);
        assert!(out.fix.is_empty());
        gw.on_connect(T0, &mut out);
        gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
        out.clear();
        gw.on_timer(T0 + 2 * SEC, &mut out);
        assert_eq!(fix_types(&out), [b"F".to_vec()]);
        assert!(gw.restart_deadlines().is_empty());
    }

    /// At a logon the venue is asked about every order sent and not yet acknowledged; an
    /// ExecType I answer that it has the order acknowledges it to the engine.
    #[test]
    fn orders_in_doubt_are_queried_at_logon() {
        let (mut gw, mut v, mut out) = active();
        gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
        gw.on_engine_message(1, &numbered(&new_order(2, 300, 100), 2), T0, &mut out);
        let (id1, id2) = (
            gw.order(1, 1).unwrap().venue_cl_ord_id,
            gw.order(1, 2).unwrap().venue_cl_ord_id,
        );
        gw.on_fix_bytes(&v.exec(id2, b"0", 0, 0, 300), T0, &mut out);
        // The connection drops before order 1 is acknowledged; the restarted session asks.
        gw.on_disconnect();
        out.clear();
        gw.on_connect(T0, &mut out);
        gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
        let mut rest = &out.fix[..];
        let mut queried = Vec::new();
        while let Ok(n) = split_frame(rest) {
            let m = Message::parse(&rest[..n]).unwrap();
            if m.msg_type() == b"H" {
                queried.push(m.uint(11).unwrap());
            }
            rest = &rest[n..];
        }
        assert_eq!(queried, [id1]);
        assert_eq!(gw.counters().status_requests, 1);
        out.clear();
        let mut status = v.exec(id1, b"I", 0, 0, 300);
        // v.exec writes OrdStatus 0 (New): the venue has it.
        assert!(status.windows(5).any(|w| w == b"\x0139=0"));
        gw.on_fix_bytes(&std::mem::take(&mut status), T0, &mut out);
        assert_eq!(gw.order(1, 1).unwrap().status, OrderStatus::Open);
        assert!(matches!(out.engine[..], [(1, Response::Ack(_))]));
    }

    fn replay(journal: &[u8]) -> Gateway {
        let mut r = Gateway::new(session(), &risk()).unwrap();
        let mut rest = journal;
        while let Some((k, p, n)) = decode_record(rest) {
            r.replay_record(k, p);
            rest = &rest[n..];
        }
        assert!(rest.is_empty());
        r
    }

    fn bytes<'a>(it: impl Iterator<Item = &'a Response>) -> Vec<Vec<u8>> {
        it.map(|r| r.as_bytes().to_vec()).collect()
    }

    #[test]
    fn responses_are_numbered_per_engine_kept_and_rebuilt_from_the_journal() {
        let (mut gw, mut v, mut out) = active();
        gw.on_engine_message(1, new_order(1, 300, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(2, 10, 200).as_bytes(), T0, &mut out); // collar
        gw.on_engine_message(1, &[b'N', 1, 48, 0], T0, &mut out); // malformed
        gw.on_engine_message(2, new_order(3, 10, 100).as_bytes(), T0, &mut out); // engine 2
        let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
        gw.on_fix_bytes(&v.exec(id1, b"F", 100, 100, 200), T0, &mut out);
        // The engine goes away: its order is canceled, the Canceled is numbered and kept.
        gw.on_engine_disconnect(1, T0, &mut out);
        let cancel = Message::parse(&last_fix(&out)).unwrap().uint(11).unwrap();
        gw.on_fix_bytes(&v.exec(cancel, b"4", 0, 100, 0), T0, &mut out);
        let numbered: Vec<(EngineId, u32, u8)> = out
            .engine
            .iter()
            .map(|(e, r)| (*e, r.seq(), r.as_bytes()[0]))
            .collect();
        assert_eq!(
            numbered,
            [
                (1, 1, msg_type::REJECT),
                (1, 2, msg_type::REJECT),
                (2, 1, msg_type::REJECT),
                (1, 3, msg_type::ACK),
                (1, 4, msg_type::PARTIAL_FILL),
                (1, 5, msg_type::CANCELED),
            ]
        );
        assert_eq!((gw.last_response_seq(1), gw.last_response_seq(2)), (5, 1));
        let engine1: Vec<Vec<u8>> =
            bytes(out.engine.iter().filter(|(e, _)| *e == 1).map(|(_, r)| r));
        // What an engine that processed response 2 missed: 3, 4, 5, byte for byte.
        assert_eq!(bytes(gw.responses_after(1, 2).unwrap()), engine1[2..]);
        assert_eq!(gw.responses_after(1, 5).unwrap().count(), 0);
        assert_eq!(
            gw.responses_after(1, 6).err(),
            Some(LogonStatus::BadSequence)
        );
        assert_eq!(gw.last_response_seq(99), 0);
        // A restart rebuilds numbers and history from the journal alone.
        let r = replay(&out.journal);
        assert_eq!((r.last_response_seq(1), r.last_response_seq(2)), (5, 1));
        assert_eq!(bytes(r.responses_after(1, 0).unwrap()), engine1);
        // And numbering continues where it stopped.
        let mut r = r;
        let mut out2 = Outputs::default();
        r.on_engine_message(1, &[], T0, &mut out2);
        assert_eq!(out2.engine[0].1.seq(), 6);
    }

    #[test]
    fn response_history_is_bounded() {
        let mut gw = Gateway::new(session(), &risk())
            .unwrap()
            .with_response_history(2);
        let mut out = Outputs::default();
        for _ in 0..5 {
            gw.on_engine_message(1, &[], T0, &mut out);
        }
        assert_eq!(gw.last_response_seq(1), 5);
        assert_eq!(gw.responses_after(1, 3).unwrap().count(), 2);
        assert_eq!(
            gw.responses_after(1, 2).err(),
            Some(LogonStatus::ReplayUnavailable)
        );
    }

    /// A gateway on [`risk`] with `extra` keys in `[risk]` and `account` keys added to the
    /// account, logged on, with a fresh reference price.
    fn active_with(extra: &str, account: &str) -> (Gateway, Venue, Outputs) {
        let text = format!(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            {extra}
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 10000000
            max_position = 100000
            max_open_orders = 100
            collar_bps = 500
            {account}
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#
        );
        let risk: RiskConfig = toml::from_str(&text).unwrap();
        let mut gw = Gateway::new(session(), &risk).unwrap();
        let mut out = Outputs::default();
        gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        gw.on_connect(T0, &mut out);
        let mut v = Venue { seq: 1 };
        let logon = v.frame(b"A", &[(98, b"0"), (108, b"30")]);
        gw.on_fix_bytes(&logon, T0, &mut out);
        assert_eq!(gw.session().state(), SessionState::Active);
        (gw, v, out)
    }

    /// Replays `journal` into a fresh gateway built like `like` (same risk config).
    fn replay_like(risk: &RiskConfig, journal: &[u8]) -> Gateway {
        let mut r = Gateway::new(session(), risk).unwrap();
        let mut rest = journal;
        while let Some((k, p, n)) = decode_record(rest) {
            r.replay_record(k, p);
            rest = &rest[n..];
        }
        assert!(rest.is_empty());
        r
    }

    fn reject_reasons(out: &Outputs) -> Vec<RejectReason> {
        out.engine
            .iter()
            .filter_map(|(_, r)| match r {
                Response::Reject(x) => Some(x.reason()),
                _ => None,
            })
            .collect()
    }

    const WINDOWS: &str = "max_identical_orders = 3";
    const ACCOUNT_WINDOWS: &str = "max_orders_per_interval = 5
            max_cancels_per_interval = 2
            max_replaces_per_interval = 1";

    fn windows_config() -> RiskConfig {
        toml::from_str(&format!(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            {WINDOWS}
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 10000000
            max_position = 100000
            max_open_orders = 100
            collar_bps = 500
            {ACCOUNT_WINDOWS}
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#
        ))
        .unwrap()
    }

    /// The engine's requests: three identical orders (the fourth rejects), two more new
    /// orders (the next is throttled), cancels and replaces up to their own limits.
    fn exhaust_windows(gw: &mut Gateway, out: &mut Outputs) {
        let t = T0 + SEC / 10;
        for cl in 1..=4 {
            gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), t, out);
        }
        gw.on_engine_message(1, new_order(5, 11, 100).as_bytes(), t, out);
        gw.on_engine_message(1, new_order(6, 12, 100).as_bytes(), t, out);
        gw.on_engine_message(1, new_order(7, 13, 100).as_bytes(), t, out);
        gw.on_engine_message(1, Replace::new(5, 20, 100 * PRICE_SCALE).as_bytes(), t, out);
        gw.on_engine_message(1, Replace::new(6, 20, 100 * PRICE_SCALE).as_bytes(), t, out);
        for cl in 1..=3 {
            gw.on_engine_message(1, Cancel::new(cl).as_bytes(), t, out);
        }
    }

    #[test]
    fn throttles_and_repeated_orders_reject_and_rebuild_from_the_journal() {
        let (mut gw, _v, mut out) = active_with(WINDOWS, ACCOUNT_WINDOWS);
        out.clear();
        exhaust_windows(&mut gw, &mut out);
        use RejectReason::{RepeatedOrder, Throttled};
        assert_eq!(
            reject_reasons(&out),
            [RepeatedOrder, Throttled, Throttled, Throttled]
        );
        let t = T0 + SEC / 2;
        let o = gw.order(1, 1).unwrap().params;
        assert_eq!(gw.risk().throttle_usage(7, t), [5, 2, 1]);
        assert_eq!(gw.risk().identical_count(&o, t), 3);
        // A restart: the windows are what they were, so the next requests get the same
        // answers from the rebuilt gateway as from the live one.
        let mut r = replay_like(&windows_config(), &out.journal);
        assert_eq!(r.risk().throttle_usage(7, t), [5, 2, 1]);
        assert_eq!(r.risk().identical_count(&o, t), 3);
        assert_eq!(r.risk().firm_exposure(), gw.risk().firm_exposure());
        let mut v = Venue { seq: 2 };
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        r.on_connect(T0, &mut Outputs::default());
        r.on_fix_bytes(
            &v.frame(b"A", &[(98, b"0"), (108, b"30")]),
            T0,
            &mut Outputs::default(),
        );
        assert_eq!(r.session().state(), SessionState::Active);
        for g in [&mut gw, &mut r] {
            let mut o2 = Outputs::default();
            g.on_engine_message(1, new_order(20, 14, 100).as_bytes(), t, &mut o2);
            g.on_engine_message(1, Cancel::new(6).as_bytes(), t, &mut o2);
            assert_eq!(reject_reasons(&o2), [Throttled, Throttled]);
        }
        // A window later everything is free again.
        let later = T0 + 2 * SEC;
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, later);
        let mut o3 = Outputs::default();
        r.on_engine_message(1, new_order(21, 10, 100).as_bytes(), later, &mut o3);
        r.on_engine_message(1, Cancel::new(6).as_bytes(), later, &mut o3);
        assert_eq!(reject_reasons(&o3), []);
    }

    /// Journals written before decisions carried their time still replay: orders and
    /// reservations as before, the windows empty.
    #[test]
    fn decisions_without_a_trailer_still_replay() {
        let (mut gw, _v, mut out) = active_with(WINDOWS, ACCOUNT_WINDOWS);
        exhaust_windows(&mut gw, &mut out);
        let mut old = Vec::new();
        let mut rest = &out.journal[..];
        while let Some((k, p, n)) = decode_record(rest) {
            let p = if k == record::DECISION {
                &p[..size_of::<Decision>()]
            } else {
                p
            };
            encode_record(&mut old, k, &[p]);
            rest = &rest[n..];
        }
        let r = replay_like(&windows_config(), &old);
        assert_eq!(r.open_order_count(), gw.open_order_count());
        assert_eq!(r.risk().exposure(7), gw.risk().exposure(7));
        assert_eq!(r.risk().throttle_usage(7, T0 + SEC / 2), [0, 0, 0]);
    }

    /// Kill switches, cancel-all and cancel-on-disconnect cancel whatever the engine's
    /// cancel throttle says: the operator stays in control.
    #[test]
    fn cancels_the_gateway_makes_are_never_throttled() {
        let (mut gw, _v, mut out) = active_with(
            "max_identical_orders = 0",
            "max_orders_per_interval = 100\nmax_cancels_per_interval = 1",
        );
        for cl in 1..=6 {
            gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), T0, &mut out);
        }
        out.clear();
        gw.on_engine_message(1, Cancel::new(1).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, Cancel::new(2).as_bytes(), T0, &mut out);
        assert_eq!(reject_reasons(&out), [RejectReason::Throttled]);
        out.clear();
        gw.cancel_all(Some(7), T0, &mut out);
        assert_eq!(fix_types(&out), vec![b"F".to_vec(); 5]);
        let pending = gw.orders().filter(|(_, o)| o.pending.is_some()).count();
        assert_eq!(pending, 6);
        assert_eq!(gw.risk().throttle_usage(7, T0), [6, 1, 0]);
        // Replayed, the gateway's cancels are not counted either.
        let r = replay(&out.journal);
        assert_eq!(r.risk().throttle_usage(7, T0)[1], 0);
    }

    #[test]
    fn malformed_frames_are_bounded_and_cut_the_engine_off() {
        let (mut gw, _v, mut out) =
            active_with("max_malformed_frames = 3", "max_orders_per_interval = 100");
        out.clear();
        // 16 KiB of garbage costs the journal its first 64 bytes.
        let mut big = vec![0xAAu8; 16 << 10];
        big[0] = msg_type::NEW_ORDER;
        gw.on_engine_message(1, &big, T0, &mut out);
        assert!(
            out.journal.len() < 100,
            "{} journal bytes",
            out.journal.len()
        );
        assert!(out.kick.is_empty());
        gw.on_engine_message(1, &[1, 2, 3], T0, &mut out);
        gw.on_engine_message(1, &[], T0, &mut out);
        assert_eq!(out.kick, [1]);
        assert_eq!(gw.counters().malformed_engine, 3);
        assert_eq!(gw.counters().malformed_disconnects, 1);
        assert_eq!(gw.malformed_since_logon(1), 3);
        assert_eq!(reject_reasons(&out), [RejectReason::Malformed; 3]);
        // Cut off: nothing more is taken, journaled or answered, valid or not.
        let (records, responses) = (out.journal_records, out.engine.len());
        gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
        for _ in 0..1000 {
            gw.on_engine_message(1, &big, T0, &mut out);
        }
        assert_eq!(
            (out.journal_records, out.engine.len()),
            (records, responses)
        );
        assert_eq!(gw.counters().frames_after_cutoff, 1001);
        assert_eq!(gw.counters().malformed_disconnects, 1);
        assert!(gw.order(1, 1).is_none());
        // The journal rebuilds the same count and the same responses.
        let risk = toml::from_str::<RiskConfig>(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            max_malformed_frames = 3
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 10000000
            max_position = 100000
            max_open_orders = 100
            max_orders_per_interval = 100
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#,
        )
        .unwrap();
        let r = replay_like(&risk, &out.journal);
        assert_eq!(r.malformed_since_logon(1), 3);
        assert_eq!(r.last_response_seq(1), gw.last_response_seq(1));
        assert_eq!(
            bytes(r.responses_after(1, 0).unwrap()),
            bytes(gw.responses_after(1, 0).unwrap())
        );
        // The service disconnects it; once it logs on again it is taken again.
        gw.on_engine_disconnect(1, T0, &mut out);
        assert_eq!(replay_like(&risk, &out.journal).malformed_since_logon(1), 0);
        gw.on_engine_logon(1, &mut out);
        out.clear();
        gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
        assert!(gw.order(1, 1).is_some());
        assert_eq!(gw.malformed_since_logon(1), 0);
    }

    #[test]
    fn response_history_comes_from_the_config() {
        let (mut gw, _v, mut out) =
            active_with("response_history = 2", "max_orders_per_interval = 100");
        for _ in 0..5 {
            gw.on_engine_message(1, &[], T0, &mut out);
        }
        assert_eq!(gw.responses_after(1, 3).unwrap().count(), 2);
        assert_eq!(
            gw.responses_after(1, 2).err(),
            Some(LogonStatus::ReplayUnavailable)
        );
    }

    /// Firm-wide limits reject with their own reasons, and survive a restart.
    #[test]
    fn firm_limits_reject_and_rebuild_from_the_journal() {
        let firm =
            "max_identical_orders = 0\n[firm]\nmax_open_orders = 2\nmax_gross_notional = 25000";
        let (mut gw, _v, mut out) = active_with(firm, "max_orders_per_interval = 100");
        out.clear();
        gw.on_engine_message(1, new_order(1, 100, 100).as_bytes(), T0, &mut out);
        gw.on_engine_message(1, new_order(2, 100, 101).as_bytes(), T0, &mut out);
        // 20_100 open, 25_000 allowed: 5_000 more is too much.
        gw.on_engine_message(1, new_order(3, 50, 100).as_bytes(), T0, &mut out);
        // Small enough, but the firm has its 2 open orders.
        gw.on_engine_message(1, new_order(4, 1, 100).as_bytes(), T0, &mut out);
        assert_eq!(
            reject_reasons(&out),
            [
                RejectReason::FirmGrossNotional,
                RejectReason::FirmMaxOpenOrders
            ]
        );
        assert_eq!(gw.risk().firm_exposure(), (2, 20_100, 0));
        let risk = toml::from_str::<RiskConfig>(&format!(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            {firm}
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 10000000
            max_position = 100000
            max_open_orders = 100
            max_orders_per_interval = 100
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#
        ))
        .unwrap();
        let r = replay_like(&risk, &out.journal);
        assert_eq!(r.risk().firm_exposure(), (2, 20_100, 0));
    }
}
