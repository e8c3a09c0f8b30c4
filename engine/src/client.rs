//! The engine-side library: encodes requests, decodes responses and tracks the engine's own
//! orders. Engines embed it.
//!
//! [`Client`] owns no transport (the caller moves the bytes); [`EngineSession`] is a
//! [`Client`] bound to a rocebus orders connection to the gateway: it logs on with the
//! engine's id and secret, writes requests straight into the connection's registered send
//! memory (`try_claim`) and applies the responses it polls.
//!
//! Responses are numbered per engine by the gateway. The [`Client`] remembers the last one
//! it applied; after a lost connection, [`EngineSession::resume`] logs on again with that
//! number and the gateway replays everything after it (the acks, fills and the cancels of
//! cancel-on-disconnect the engine missed) before anything new, so each response is applied
//! exactly once. A response numbered at or below the last applied is refused as
//! [`ClientError::Duplicate`] without touching the book.
//!
//! Requests are numbered too. The logon answer carries the last request number the gateway
//! journaled: every request after it was not taken (the gateway died, or its journal was
//! full, before recording it). [`Client::not_taken`] lists them and
//! [`EngineSession::resend_not_taken`] sends them again with the same numbers and ids; a
//! request the gateway had taken after all is answered with an unnumbered
//! [`Response::Status`] and never acted on twice. A listed request stays listed across
//! logons until it is sent again, even once the gateway took later numbers: it keeps such
//! holes and takes them when they come.
//!
//! ```no_run
//! use rocebus_engine::client::EngineSession;
//! use rocebus_engine::proto::{Side, Symbol, PRICE_SCALE};
//! use rocebus::orders::OrdersConfig;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = OrdersConfig { token: "s3cret".into(), ..OrdersConfig::default() };
//! let mut s = EngineSession::connect(
//!     &cfg, "198.18.0.1:7470".parse()?, 1, "engine-1-secret", 1,
//! )?;
//! let id = s.new_order(1, Symbol::new("AAPL").unwrap(), Side::Buy, 100, 189 * PRICE_SCALE)?;
//! s.flush()?;
//! while !s.client().order(id).unwrap().state.is_final() {
//!     s.poll(|r| println!("{r:?}"), 64)?;
//! }
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use rocebus::counters::{AllocateCounter, CountersError};
use rocebus::orders::{
    ConnectProgress, Connecting, Connection, OfferError, OrdersConfig, OrdersError, PeerLost,
};
use rocebus::rdma_settings::export::RdmaCountersExport;
use rocebus::verbs::RcOptions;
use rustc_hash::FxHashMap;
use zerocopy::{Immutable, IntoBytes};

use crate::liveness::Liveness;
use crate::proto::{
    engine_key, msg_type, pad_token, Cancel, DecodeError, Heartbeat, Logon, LogonAck, LogonStatus,
    MassCancel, NewOrder, RejectReason, Replace, Request, RequestHoles, Response, Side, Symbol,
    TimeInForce, ORDERS_STREAM,
};

/// How long the gateway may be silent (no frame, not even a heartbeat) before an
/// [`EngineSession`] declares it dead, unless set with
/// [`EngineSession::set_gateway_timeout`] (an engine's `gateway_timeout_ms`).
pub const DEFAULT_GATEWAY_TIMEOUT: Duration = Duration::from_millis(5000);

/// Polls between two looks at the clock for heartbeats and silence (a count, not a clock:
/// reading the clock costs a system call on some virtual machines). Every flush looks for a
/// heartbeat due; silence is judged by polls only, right after they read the ring.
const POLLS_PER_CHECK: u32 = 16;

/// Where an order stands, as the engine sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrderState {
    /// Sent, no answer yet.
    PendingNew,
    /// Acknowledged by the venue, nothing executed.
    New,
    /// Partially executed.
    PartiallyFilled,
    /// Completely executed (final).
    Filled,
    /// Canceled (final).
    Canceled,
    /// Rejected (final).
    Rejected(RejectReason),
}

impl OrderState {
    /// True once no more responses can change the order.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            OrderState::Filled | OrderState::Canceled | OrderState::Rejected(_)
        )
    }
}

/// One order as tracked by the client.
#[derive(Clone, Copy, Debug)]
pub struct OwnOrder {
    /// Instrument.
    pub symbol: Symbol,
    /// Side.
    pub side: Side,
    /// Total quantity (after replaces).
    pub qty: u32,
    /// Limit price (after replaces).
    pub price: i64,
    /// Executed quantity.
    pub cum_qty: u32,
    /// State.
    pub state: OrderState,
}

/// What a response did to the client's book.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClientError {
    /// The bytes are not a response.
    Decode(DecodeError),
    /// A response for an order this client never sent.
    UnknownOrder(u64),
    /// A response for an order already final (a duplicate answer).
    AlreadyFinal(u64),
    /// A response numbered at or below the last one applied (a replay overlap); ignored.
    Duplicate(u32),
}

/// A request frame the client numbers.
trait Numbered: Copy {
    fn header_mut(&mut self) -> &mut crate::proto::Header;
    fn request(self) -> Request;
}

macro_rules! numbered {
    ($($t:ident),*) => {$(
        impl Numbered for $t {
            fn header_mut(&mut self) -> &mut crate::proto::Header {
                &mut self.header
            }
            fn request(self) -> Request {
                Request::$t(self)
            }
        }
    )*};
}
numbered!(NewOrder, Cancel, Replace, MassCancel);

/// Requests kept until a logon answer says they were taken: enough for any burst between
/// two logons; the oldest are dropped past it (they were taken long ago in practice).
pub const UNCONFIRMED_MAX: usize = 1 << 16;

/// Engine-side order client.
#[derive(Debug)]
pub struct Client {
    next_id: u64,
    last_seq: u32,
    /// Number of the next request.
    next_request: u32,
    /// Requests sent and not yet confirmed taken by a logon answer, oldest first.
    unconfirmed: VecDeque<Request>,
    /// Requests a logon answer (or a `JournalUnavailable` reject) said were not taken.
    not_taken: Vec<Request>,
    orders: FxHashMap<u64, OwnOrder>,
    position: FxHashMap<Symbol, i64>,
}

impl Default for Client {
    fn default() -> Client {
        Client {
            next_id: 0,
            last_seq: 0,
            next_request: 1,
            unconfirmed: VecDeque::new(),
            not_taken: Vec::new(),
            orders: FxHashMap::default(),
            position: FxHashMap::default(),
        }
    }
}

impl Client {
    /// A client whose first order id is `first_id` (ids must stay unique across restarts).
    pub fn new(first_id: u64) -> Client {
        Client {
            next_id: first_id,
            ..Client::default()
        }
    }

    /// Like [`Client::new`], with room for `orders` tracked orders before the table grows.
    pub fn with_capacity(first_id: u64, orders: usize) -> Client {
        Client {
            next_id: first_id,
            orders: FxHashMap::with_capacity_and_hasher(orders, Default::default()),
            unconfirmed: VecDeque::with_capacity(orders.min(UNCONFIRMED_MAX)),
            ..Client::default()
        }
    }

    /// Numbers `m` and keeps it until a logon answer confirms it was taken.
    fn number<T: Numbered>(&mut self, mut m: T) -> T {
        m.header_mut().seq = zerocopy::little_endian::U32::new(self.next_request);
        self.next_request = self.next_request.wrapping_add(1).max(1);
        self.track(m.request());
        m
    }

    /// `req` was sent (first, or again after it was listed as not taken): it is in flight
    /// until a logon answer says it was taken (or a reject says it was not). The oldest
    /// are dropped past [`UNCONFIRMED_MAX`].
    fn track(&mut self, req: Request) {
        if self.unconfirmed.len() == UNCONFIRMED_MAX {
            self.unconfirmed.pop_front();
        }
        self.unconfirmed.push_back(req);
    }

    /// Applies a logon answer's last taken request number: requests sent up to it are
    /// taken, every later one is moved to [`not_taken`](Self::not_taken). Requests already
    /// listed there stay listed whatever the number: they were not taken (a logon answer or
    /// a `JournalUnavailable` reject said so) and have not been sent again since, so the
    /// gateway cannot have taken them, even if it took later numbers (it keeps such holes
    /// and takes them when they come). Numbering continues after the gateway's, so a
    /// client that lost its state never reuses a number.
    pub fn on_logon(&mut self, last_request_seq: u32) {
        self.on_logon_with_holes(last_request_seq, &[], false);
    }

    /// [`on_logon`](Self::on_logon) with the holes the gateway listed before its answer
    /// ([`RequestHoles`]): requests numbered at or below `last_request_seq` that it never
    /// took are not taken either. `more`: the gateway had more holes than it listed, so
    /// every request above the last listed one is treated as not taken (sending a request
    /// the gateway took again is safe: it answers with an order status).
    pub fn on_logon_with_holes(&mut self, last_request_seq: u32, holes: &[u32], more: bool) {
        let mut holes = holes.to_vec();
        holes.sort_unstable();
        let beyond = if more {
            holes.last().copied().unwrap_or(0)
        } else {
            last_request_seq
        };
        let not_taken =
            |seq: u32| seq > last_request_seq || seq > beyond || holes.binary_search(&seq).is_ok();
        // Each request is in at most one of `unconfirmed` (fate unknown) and `not_taken`;
        // one sent again goes back to `unconfirmed` (see `track`), so neither is in order.
        // The rest was taken.
        for r in self.unconfirmed.drain(..) {
            if not_taken(r.seq()) {
                self.not_taken.push(r);
            }
        }
        self.not_taken.sort_unstable_by_key(|r| r.seq());
        self.not_taken.dedup_by_key(|r| r.seq());
        if self.next_request <= last_request_seq {
            self.next_request = last_request_seq.wrapping_add(1).max(1);
        }
    }

    /// Requests the gateway did not take (see [`on_logon`](Self::on_logon)), oldest first:
    /// send them again as they are (same number and id), or give them up.
    pub fn not_taken(&self) -> &[Request] {
        &self.not_taken
    }

    /// Takes the list of requests not taken (after sending them again, or to give up).
    /// They count as sent again: a later logon lists them again if the gateway did not
    /// take them.
    pub fn take_not_taken(&mut self) -> Vec<Request> {
        let taken = std::mem::take(&mut self.not_taken);
        for r in &taken {
            self.track(*r);
        }
        taken
    }

    /// The oldest request number whose fate is unknown (sent, not yet confirmed taken by a
    /// logon answer nor listed as not taken); 0: none. A logon names it so the gateway
    /// lists its holes from there ([`Logon::oldest_unsure`]).
    pub fn oldest_unsure(&self) -> u32 {
        self.unconfirmed.iter().map(|r| r.seq()).min().unwrap_or(0)
    }

    /// The number the next request will carry.
    pub fn next_request_seq(&self) -> u32 {
        self.next_request
    }

    /// The id the next new order will get.
    pub fn next_order_id(&self) -> u64 {
        self.next_id
    }

    /// Encodes a new order and starts tracking it; returns its id and frame.
    pub fn new_order(
        &mut self,
        account: u32,
        symbol: Symbol,
        side: Side,
        qty: u32,
        price: i64,
    ) -> (u64, NewOrder) {
        let id = self.next_id;
        self.next_id += 1;
        let m = self.number(NewOrder::new(
            id,
            account,
            symbol,
            side,
            qty,
            price,
            TimeInForce::Day,
        ));
        self.orders.insert(
            id,
            OwnOrder {
                symbol,
                side,
                qty,
                price,
                cum_qty: 0,
                state: OrderState::PendingNew,
            },
        );
        (id, m)
    }

    /// Encodes a cancel of `id` (numbered).
    pub fn cancel(&mut self, id: u64) -> Cancel {
        self.number(Cancel::new(id))
    }

    /// Encodes a replace of `id` (numbered).
    pub fn replace(&mut self, id: u64, qty: u32, price: i64) -> Replace {
        self.number(Replace::new(id, qty, price))
    }

    /// Encodes a mass cancel (numbered).
    pub fn mass_cancel(&mut self, account: u32, symbol: Symbol) -> MassCancel {
        self.number(MassCancel::new(account, symbol))
    }

    /// The sequence number of the last response applied (0: none); an engine that
    /// reconnects presents it so the gateway replays only what came after.
    pub fn last_response_seq(&self) -> u32 {
        self.last_seq
    }

    /// Applies one response frame; returns the decoded response.
    pub fn on_response(&mut self, bytes: &[u8]) -> Result<Response, ClientError> {
        let (resp, _) = Response::decode(bytes).map_err(ClientError::Decode)?;
        let seq = resp.seq();
        if seq != 0 {
            if seq <= self.last_seq {
                return Err(ClientError::Duplicate(seq));
            }
            // Counted as seen even if it does not apply below: the gateway sent it once.
            self.last_seq = seq;
        }
        let id = resp.cl_ord_id();
        match resp {
            // Informational: the numbered responses carry every change.
            Response::Status(_) => return Ok(resp),
            Response::Reject(r) if r.reason() == RejectReason::JournalUnavailable => {
                // Not taken: nothing happened; keep it to send again.
                if let Some(i) = self
                    .unconfirmed
                    .iter()
                    .position(|q| q.cl_ord_id() == id && q.msg_type() == r.request)
                {
                    if let Some(req) = self.unconfirmed.remove(i) {
                        if !self.not_taken.iter().any(|q| q.seq() == req.seq()) {
                            self.not_taken.push(req);
                        }
                    }
                }
                return Ok(resp);
            }
            _ => {}
        }
        let o = self
            .orders
            .get_mut(&id)
            .ok_or(ClientError::UnknownOrder(id))?;
        // A late answer to a cancel/replace (the order was filled or canceled meanwhile) and a
        // notice of what the venue did after the fact are information, not duplicates.
        let informational = match resp {
            Response::Reject(r) => r.request != msg_type::NEW_ORDER,
            Response::Notice(_) => true,
            _ => false,
        };
        if o.state.is_final() && !informational {
            return Err(ClientError::AlreadyFinal(id));
        }
        match resp {
            Response::Ack(_) => o.state = OrderState::New,
            Response::Reject(r) => {
                // Only a rejected new order is final; a rejected cancel/replace leaves it live.
                if r.request == msg_type::NEW_ORDER {
                    o.state = OrderState::Rejected(r.reason());
                }
            }
            Response::Fill(f) => {
                o.cum_qty = f.cum_qty.get();
                o.state = if f.leaves_qty.get() == 0 {
                    OrderState::Filled
                } else {
                    OrderState::PartiallyFilled
                };
                let signed = i64::from(f.last_qty.get()) * if o.side == Side::Buy { 1 } else { -1 };
                *self.position.entry(o.symbol).or_default() += signed;
            }
            Response::Canceled(_) => o.state = OrderState::Canceled,
            Response::Replaced(r) => {
                o.qty = r.qty.get();
                o.price = r.price.get();
            }
            Response::Status(_) => {}
            Response::Notice(n) => {
                o.cum_qty = n.cum_qty.get();
                let signed = n.exec_qty_delta.get() * if o.side == Side::Buy { 1 } else { -1 };
                *self.position.entry(o.symbol).or_default() += signed;
                if n.leaves_qty.get() > 0 {
                    // A trade cancel reopened quantity.
                    o.state = if o.cum_qty > 0 {
                        OrderState::PartiallyFilled
                    } else {
                        OrderState::New
                    };
                } else if !o.state.is_final() {
                    o.state = OrderState::Filled;
                }
            }
        }
        Ok(resp)
    }

    /// The tracked order `id`.
    pub fn order(&self, id: u64) -> Option<&OwnOrder> {
        self.orders.get(&id)
    }

    /// Every tracked order.
    pub fn orders(&self) -> impl Iterator<Item = (u64, &OwnOrder)> {
        self.orders.iter().map(|(k, v)| (*k, v))
    }

    /// Net position in `symbol` from the fills received.
    pub fn position(&self, symbol: Symbol) -> i64 {
        self.position.get(&symbol).copied().unwrap_or(0)
    }
}

/// Setting up an [`EngineSession`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The orders connection could not be established.
    #[error("connect to the gateway at {addr}")]
    Connect {
        /// Gateway address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: OrdersError,
    },
    /// The logon could not be sent.
    #[error("send logon: {0}")]
    Send(OfferError),
    /// The connection failed while waiting for the logon answer.
    #[error("connection lost during logon")]
    Lost(#[source] OrdersError),
    /// The gateway answered the logon with something else than a logon answer.
    #[error("bad logon answer: {0}")]
    BadAnswer(DecodeError),
    /// The token is empty or longer than [`crate::proto::TOKEN_LEN`] bytes.
    #[error("engine token must be 1..=32 bytes")]
    BadToken,
    /// The gateway refused the logon (unknown engine, wrong token, …).
    #[error("gateway refused engine {engine}: {status:?}")]
    Refused {
        /// Our engine id.
        engine: u32,
        /// Why.
        status: LogonStatus,
    },
    /// No answer in time.
    #[error("no logon answer within {0:?}")]
    Timeout(Duration),
}

impl SessionError {
    /// Whether the gateway refused the logon because it still holds a connection of this
    /// engine (`AlreadyConnected`): it lets that go after its engine timeout.
    pub fn is_already_connected(&self) -> bool {
        matches!(
            self,
            SessionError::Refused {
                status: LogonStatus::AlreadyConnected,
                ..
            }
        )
    }

    /// Whether another attempt may succeed: the gateway may still be starting (no listener, no answer yet), or not have noticed the engine's previous
    /// connection is gone (`AlreadyConnected`). A refusal for any other reason, a bad token
    /// or a bad answer will be the same next time.
    pub fn worth_retrying(&self) -> bool {
        match self {
            SessionError::Connect { .. }
            | SessionError::Send(_)
            | SessionError::Lost(_)
            | SessionError::Timeout(_) => true,
            SessionError::Refused { status, .. } => *status == LogonStatus::AlreadyConnected,
            SessionError::BadAnswer(_) | SessionError::BadToken => false,
        }
    }
}

/// [`EngineSession::resume`] failed: why, and the book to try again with.
#[derive(Debug, thiserror::Error)]
#[error("log on again to the gateway")]
pub struct ResumeError {
    /// Why.
    #[source]
    pub error: SessionError,
    /// The book that was to be resumed, unchanged.
    pub client: Box<Client>,
}

/// A [`Client`] connected to the gateway over the rocebus orders path.
///
/// Requests go out on [`ORDERS_STREAM`] with the engine message type as the frame type;
/// they are written into registered send memory and leave with the next
/// [`flush`](Self::flush) (or when [`poll`](Self::poll) finds nothing to read). Send and
/// poll never allocate except when the order table grows (size it with
/// `expected_orders`). Single-threaded, like the [`Connection`] it owns.
///
/// Liveness: the gateway announces a heartbeat interval in its logon answer. The session
/// sends a heartbeat when it has sent nothing for that long, and declares the gateway dead
/// once it has heard nothing from it (no frame, not even a heartbeat) for the gateway
/// timeout ([`DEFAULT_GATEWAY_TIMEOUT`], or [`set_gateway_timeout`](Self::set_gateway_timeout)):
/// it logs an error, closes the connection, and from then on every call fails with
/// [`PeerLost::Silent`] until the engine logs on again ([`resume`](Self::resume)).
/// Heartbeats go out from [`flush`](Self::flush) and every few [`poll`](Self::poll)s;
/// silence is judged every few polls. An engine must keep polling (it must anyway, to read
/// its responses); one that neither polls nor flushes for the gateway's
/// `engine_timeout_ms` is disconnected by the gateway.
#[derive(Debug)]
pub struct EngineSession {
    conn: Connection,
    client: Client,
    engine: u32,
    replay_until: u32,
    stray_frames: u64,
    /// Heartbeats and silence, on [`rocebus::clock::now_ns`] (nanoseconds).
    live: Liveness,
    /// A frame arrived since the last liveness check.
    heard: bool,
    polls: u32,
    /// The heartbeat interval the gateway announced (zero: it sends none).
    heartbeat: Duration,
    gateway_timeout: Duration,
}

/// A logon under way without blocking ([`EngineSession::start`]): the orders connection is
/// made, then the logon sent and the gateway's answer read, each step in
/// [`poll`](Self::poll). Dropping it abandons the attempt.
pub struct LoggingOn {
    step: LogonStep,
    ctx: LogonCtx,
}

/// What a logon keeps from step to step.
struct LogonCtx {
    client: Client,
    addr: SocketAddr,
    engine: u32,
    key: rocebus::auth::Key,
    /// The whole logon, set-up included, ends here (`connect_timeout_ms` after its start).
    deadline: Instant,
    timeout: Duration,
    /// The gateway's holes, which come before its answer.
    holes: Vec<u32>,
    more_holes: bool,
}

#[allow(clippy::large_enum_variant)]
enum LogonStep {
    Connecting(Connecting),
    Answer(Connection),
}

impl std::fmt::Debug for LoggingOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let step = match self.step {
            LogonStep::Connecting(_) => "connecting",
            LogonStep::Answer(_) => "awaiting the logon answer",
        };
        f.debug_struct("LoggingOn")
            .field("addr", &self.ctx.addr)
            .field("engine", &self.ctx.engine)
            .field("step", &step)
            .finish_non_exhaustive()
    }
}

/// Where a non-blocking logon stands ([`LoggingOn::poll`]).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum LogonProgress {
    /// No answer yet: poll again later.
    Pending(LoggingOn),
    /// Accepted: the session is ready.
    Done(EngineSession),
}

/// Frames read per [`LoggingOn::poll`] while waiting for the answer (the holes come first).
const LOGON_FRAMES_PER_POLL: usize = 32;

impl LoggingOn {
    /// Checks the token, makes the first step with `connect` (a connection made, or one
    /// being made) and, once connected, sends the logon.
    fn new(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        engine: u32,
        token: &str,
        client: Client,
        connect: impl FnOnce() -> Result<LogonStep, OrdersError>,
    ) -> Result<LoggingOn, ResumeError> {
        let started = Instant::now();
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let ctx = LogonCtx {
            client,
            addr,
            engine,
            key: engine_key(token.as_bytes()),
            deadline: started + timeout,
            timeout,
            holes: Vec::new(),
            more_holes: false,
        };
        if pad_token(token.as_bytes()).is_none() {
            return Err(ctx.fail(SessionError::BadToken));
        }
        let step = match connect() {
            Ok(LogonStep::Answer(mut conn)) => {
                if let Err(error) = send_logon(&mut conn, engine, &ctx.key, &ctx.client) {
                    return Err(ctx.fail(error));
                }
                LogonStep::Answer(conn)
            }
            Ok(step) => step,
            Err(source) => return Err(ctx.fail(SessionError::Connect { addr, source })),
        };
        Ok(LoggingOn { step, ctx })
    }

    /// Takes the steps that can be taken now, without blocking: the connection's set-up,
    /// sending the logon, reading the gateway's answer (frames after it, such as replayed
    /// responses, stay for [`EngineSession::poll`]). Past the config's `connect_timeout_ms`
    /// from the start, on a refusal or a lost connection it is an error that hands the book
    /// back, to try again with.
    pub fn poll(self) -> Result<LogonProgress, ResumeError> {
        let LoggingOn { step, mut ctx } = self;
        if Instant::now() > ctx.deadline {
            let t = ctx.timeout;
            return Err(ctx.fail(SessionError::Timeout(t)));
        }
        let mut conn = match step {
            LogonStep::Answer(conn) => conn,
            LogonStep::Connecting(c) => match c.poll() {
                Ok(ConnectProgress::Pending(c)) => {
                    let step = LogonStep::Connecting(c);
                    return Ok(LogonProgress::Pending(LoggingOn { step, ctx }));
                }
                Ok(ConnectProgress::Done(mut conn)) => {
                    if let Err(e) = send_logon(&mut conn, ctx.engine, &ctx.key, &ctx.client) {
                        return Err(ctx.fail(e));
                    }
                    conn
                }
                Err(source) => {
                    let addr = ctx.addr;
                    return Err(ctx.fail(SessionError::Connect { addr, source }));
                }
            },
        };
        let answer = match ctx.read_answer(&mut conn) {
            Ok(a) => a,
            Err(e) => return Err(ctx.fail(SessionError::Lost(e))),
        };
        match answer {
            None => {
                let step = LogonStep::Answer(conn);
                Ok(LogonProgress::Pending(LoggingOn { step, ctx }))
            }
            Some(Ok((ack, LogonStatus::Accepted))) => {
                let LogonCtx {
                    mut client,
                    engine,
                    holes,
                    more_holes,
                    ..
                } = ctx;
                client.on_logon_with_holes(ack.last_request_seq.get(), &holes, more_holes);
                let heartbeat = Duration::from_millis(u64::from(ack.heartbeat_ms.get()));
                let mut s = EngineSession {
                    conn,
                    client,
                    engine,
                    replay_until: ack.last_response_seq.get(),
                    stray_frames: 0,
                    live: Liveness::new(0, 0, 0),
                    heard: false,
                    polls: 0,
                    heartbeat,
                    gateway_timeout: DEFAULT_GATEWAY_TIMEOUT,
                };
                s.set_gateway_timeout(DEFAULT_GATEWAY_TIMEOUT);
                Ok(LogonProgress::Done(s))
            }
            Some(Ok((_, status))) => {
                let engine = ctx.engine;
                Err(ctx.fail(SessionError::Refused { engine, status }))
            }
            Some(Err(e)) => Err(ctx.fail(SessionError::BadAnswer(e))),
        }
    }
}

impl LogonCtx {
    fn fail(self, error: SessionError) -> ResumeError {
        ResumeError {
            error,
            client: Box::new(self.client),
        }
    }

    /// Reads what has arrived of the gateway's holes and answer, one frame at a time (what
    /// follows the answer is the session's): the answer once it is there.
    #[allow(clippy::type_complexity)]
    fn read_answer(
        &mut self,
        conn: &mut Connection,
    ) -> Result<Option<Result<(LogonAck, LogonStatus), DecodeError>>, OrdersError> {
        let mut answer = None;
        for _ in 0..LOGON_FRAMES_PER_POLL {
            let (holes, more_holes) = (&mut self.holes, &mut self.more_holes);
            let read = conn.subscription().poll(
                |f| {
                    if f.msg_type != u16::from(msg_type::REQUEST_HOLES) {
                        answer = Some(LogonAck::decode(f.payload));
                        return;
                    }
                    match RequestHoles::decode(f.payload) {
                        // Bounded as the requests they can name are.
                        Ok(h) if holes.len() < UNCONFIRMED_MAX => {
                            holes.extend(h.holes());
                            *more_holes |= h.more.get() == 1;
                        }
                        Ok(_) => *more_holes = true,
                        Err(e) => answer = Some(Err(e)),
                    }
                },
                1,
            )?;
            if read == 0 || answer.is_some() {
                break;
            }
        }
        Ok(answer)
    }
}

/// Sends the logon on a new connection. The token stays here: the logon carries a proof
/// bound to this connection.
fn send_logon(
    conn: &mut Connection,
    engine: u32,
    key: &rocebus::auth::Key,
    client: &Client,
) -> Result<(), SessionError> {
    let logon = Logon::new(
        engine,
        key,
        client.last_response_seq(),
        &conn.session_binding(),
    )
    .with_oldest_unsure(client.oldest_unsure());
    conn.publication(ORDERS_STREAM)
        .offer_and_flush(u16::from(msg_type::LOGON), logon.as_bytes())
        .map_err(SessionError::Send)
}

impl EngineSession {
    /// Connects to the gateway at `addr`, logs on as `engine` with its `token` and waits for
    /// the answer. Order ids start at `first_order_id`. The whole logon, the connection's
    /// set-up included, is bounded by `cfg.connect_timeout_ms`. Blocks until then;
    /// [`start`](Self::start) does not.
    pub fn connect(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        engine: u32,
        token: &str,
        first_order_id: u64,
    ) -> Result<EngineSession, SessionError> {
        Self::connect_with_capacity(cfg, addr, engine, token, first_order_id, 1 << 16)
    }

    /// Connects and logs on as an engine's configuration says ([`GatewayConfig`]: address,
    /// engine id and token, orders path), retrying for up to its `connect_timeout_ms` while
    /// the gateway may still be starting (no listener, no answer yet) or has not noticed the
    /// engine's previous connection is gone (`AlreadyConnected`, retried for up to twice
    /// `connect_timeout_ms`: an attempt answered too late leaves the gateway holding it until
    /// its engine timeout); any other refusal is returned at once. The gateway is presumed dead after its `gateway_timeout_ms` of
    /// silence. Order ids start at `first_order_id` (unique across the engine's restarts);
    /// the book has room for `expected_orders` before it grows. Blocks.
    ///
    /// [`GatewayConfig`]: crate::config::GatewayConfig
    pub fn connect_configured(
        cfg: &crate::config::GatewayConfig,
        first_order_id: u64,
        expected_orders: usize,
    ) -> Result<EngineSession, SessionError> {
        let t0 = Instant::now();
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let mut session = loop {
            let elapsed = t0.elapsed();
            match Self::connect_with_capacity(
                &cfg.orders,
                cfg.addr,
                cfg.engine_id,
                &cfg.engine_token,
                first_order_id,
                expected_orders,
            ) {
                Ok(s) => break s,
                // A logon answered too late (a starved host) leaves the gateway holding the
                // half-made connection until its engine timeout lets it go: one more window.
                Err(e)
                    if e.worth_retrying()
                        && (elapsed < timeout
                            || (e.is_already_connected() && elapsed < 2 * timeout)) =>
                {
                    std::thread::sleep(Duration::from_millis(200))
                }
                Err(e) => return Err(e),
            }
        };
        session.set_gateway_timeout(Duration::from_millis(cfg.gateway_timeout_ms));
        Ok(session)
    }

    /// [`connect`](Self::connect) with room for `expected_orders` tracked orders.
    pub fn connect_with_capacity(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        engine: u32,
        token: &str,
        first_order_id: u64,
        expected_orders: usize,
    ) -> Result<EngineSession, SessionError> {
        let client = Client::with_capacity(first_order_id, expected_orders);
        Self::resume(cfg, addr, engine, token, client).map_err(|e| e.error)
    }

    /// Logs on again with the book of an earlier session (see [`into_client`]): the gateway
    /// replays every response after [`Client::last_response_seq`] before new ones; they
    /// arrive through [`poll`](Self::poll) like any other. Requests the gateway never took
    /// are listed in [`Client::not_taken`] ([`resend_not_taken`](Self::resend_not_taken)
    /// sends them again safely). On failure the book comes back
    /// in the error, to try again with (the gateway refuses a second connection of an engine
    /// with `AlreadyConnected` until it has noticed the first one is gone). Blocks for at
    /// most `cfg.connect_timeout_ms`; [`start`](Self::start) is the same without blocking.
    ///
    /// [`into_client`]: Self::into_client
    pub fn resume(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        engine: u32,
        token: &str,
        client: Client,
    ) -> Result<EngineSession, ResumeError> {
        let mut l = LoggingOn::new(cfg, addr, engine, token, client, || {
            Connection::connect(cfg, addr).map(LogonStep::Answer)
        })?;
        loop {
            match l.poll()? {
                LogonProgress::Pending(p) => {
                    l = p;
                    std::hint::spin_loop();
                }
                LogonProgress::Done(s) => return Ok(s),
            }
        }
    }

    /// Starts logging on to the gateway at `addr` from local address `local` (the address
    /// whose RDMA device carries the connection) with the book `client` (a new
    /// [`Client`], or one from [`into_client`](Self::into_client) to resume), without
    /// waiting: the device is opened and the ring registered now; the connection, the logon
    /// and its answer advance in [`LoggingOn::poll`]. The same logon as
    /// [`resume`](Self::resume), bounded by `cfg.connect_timeout_ms`.
    pub fn start(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        local: IpAddr,
        engine: u32,
        token: &str,
        client: Client,
    ) -> Result<LoggingOn, ResumeError> {
        LoggingOn::new(cfg, addr, engine, token, client, || {
            Connection::start(cfg, addr, local).map(LogonStep::Connecting)
        })
    }

    /// Declares the gateway dead after `timeout` of silence (an engine's
    /// `gateway_timeout_ms`); counted from now. At least twice the gateway's heartbeat
    /// interval is sensible: a shorter one is raised to that, with a warning. A gateway that
    /// announced no heartbeats (an older one) is never declared dead this way.
    pub fn set_gateway_timeout(&mut self, timeout: Duration) {
        let mut timeout = timeout;
        if !self.heartbeat.is_zero() && timeout < 2 * self.heartbeat {
            tracing::warn!(
                gateway_timeout_ms = timeout.as_millis() as u64,
                heartbeat_ms = self.heartbeat.as_millis() as u64,
                "gateway timeout below twice the heartbeat interval: using twice the interval"
            );
            timeout = 2 * self.heartbeat;
        }
        self.gateway_timeout = timeout;
        let now = self.now();
        let (interval, timeout_ns) = if self.heartbeat.is_zero() {
            (0, 0)
        } else {
            (self.heartbeat.as_nanos() as u64, timeout.as_nanos() as u64)
        };
        self.live = Liveness::new(now, interval, timeout_ns);
    }

    /// The gateway timeout in force.
    pub fn gateway_timeout(&self) -> Duration {
        self.gateway_timeout
    }

    /// The heartbeat interval the gateway announced at logon (zero: none).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat
    }

    /// True once the gateway was declared dead for its silence (every call then fails with
    /// [`PeerLost::Silent`]; log on again with [`resume`](Self::resume)).
    pub fn gateway_silent(&self) -> bool {
        self.conn.lost() == Some(PeerLost::Silent)
    }

    /// The crate's one clock ([`rocebus::clock::now_ns`]), which the liveness state machine
    /// takes as `now` like every other.
    fn now(&self) -> u64 {
        rocebus::clock::now_ns()
    }

    /// Heartbeat when due, and (`judge`: only right after reading the ring, so frames
    /// waiting there are not mistaken for silence) the gateway's silence: declares it dead
    /// past the timeout.
    fn check_liveness(&mut self, judge: bool) -> Result<(), PeerLost> {
        if let Some(l) = self.conn.lost() {
            return Err(l);
        }
        let now = self.now();
        let live = &mut self.live;
        if std::mem::take(&mut self.heard) {
            live.on_heard(now);
        }
        if judge && live.is_expired(now) {
            tracing::error!(
                engine = self.engine,
                silent_ms = live.silent_for(now) / 1_000_000,
                gateway_timeout_ms = self.gateway_timeout.as_millis() as u64,
                "gateway silent (no frame, no heartbeat): presumed dead; orders are refused until the engine logs on again"
            );
            self.conn.close_silent();
            return Err(PeerLost::Silent);
        }
        if live.poll_transmit(now) {
            let hb = Heartbeat::new(crate::unix_nanos());
            match self.conn.try_claim(
                ORDERS_STREAM,
                u16::from(msg_type::HEARTBEAT),
                size_of::<Heartbeat>(),
            ) {
                Ok(mut claim) => {
                    claim.copy_from_slice(hb.as_bytes());
                    claim.commit();
                    live.on_sent(now);
                }
                // The gateway's ring is full of our requests: it has something to read.
                Err(OfferError::BackPressured) => live.on_sent(now),
                Err(OfferError::PeerLost(l)) => return Err(l),
                Err(_) => {}
            }
        }
        Ok(())
    }

    /// Closes the connection (the gateway cancels the engine's open orders) and hands back
    /// the book, to [`resume`](Self::resume) with.
    pub fn into_client(mut self) -> Client {
        self.conn.close();
        self.client
    }

    /// True once every response the gateway had sent when this session logged on has been
    /// applied (the replay of what was missed is over).
    pub fn caught_up(&self) -> bool {
        self.client.last_response_seq() >= self.replay_until
    }

    /// Our engine id.
    pub fn engine_id(&self) -> u32 {
        self.engine
    }

    /// The order book of this engine.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The order book, to give up requests not taken ([`Client::take_not_taken`]) while
    /// connected. Requests must go through the session's own methods: one encoded here is
    /// numbered and tracked but never sent (the gateway lists it as a hole at the next
    /// logon once it took a later number).
    pub fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// The orders connection (stats, loss state).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The `rdma.*` lines of `rocebus stat` for the connection to the gateway, allocated in
    /// `table` (the engine's counters file): the GID it sends from, as its queue pair names
    /// it, with the port's MTU, and the marking of `rc` (the `[rdma]`-applied options it
    /// connected with); the GID is logged once too (`gateway connection GID`). A GID that
    /// cannot be read is a warning and leaves its lines out.
    pub fn export_rdma(
        &self,
        table: &impl AllocateCounter,
        rc: &RcOptions,
    ) -> Result<RdmaCountersExport, CountersError> {
        RdmaCountersExport::logged(
            table,
            "rdma",
            rc.class(),
            self.conn.local_gid(),
            "gateway connection",
        )
    }

    /// Frames received on another stream than [`ORDERS_STREAM`] (dropped).
    pub fn stray_frames(&self) -> u64 {
        self.stray_frames
    }

    /// Claims room first, so a refused claim numbers and tracks nothing.
    fn send<T: IntoBytes + Immutable>(
        &mut self,
        ty: u8,
        build: impl FnOnce(&mut Client) -> T,
    ) -> Result<(), OfferError> {
        let mut claim = self
            .conn
            .try_claim(ORDERS_STREAM, u16::from(ty), size_of::<T>())?;
        claim.copy_from_slice(build(&mut self.client).as_bytes());
        claim.commit();
        Ok(())
    }

    /// Sends again, as they were (same numbers and ids), the requests the gateway did not
    /// take ([`Client::not_taken`]); returns how many went out. On `BackPressured` the rest
    /// stay listed: poll, then call again.
    pub fn resend_not_taken(&mut self) -> Result<usize, OfferError> {
        let mut sent = 0;
        while let Some(req) = self.client.not_taken.first().copied() {
            let bytes = req.as_bytes();
            let mut claim =
                self.conn
                    .try_claim(ORDERS_STREAM, u16::from(req.msg_type()), bytes.len())?;
            claim.copy_from_slice(bytes);
            claim.commit();
            self.client.not_taken.remove(0);
            self.client.track(req);
            sent += 1;
        }
        Ok(sent)
    }

    /// Queues a new day limit order; returns its id. On `BackPressured` nothing was sent or
    /// tracked: poll, then try again.
    pub fn new_order(
        &mut self,
        account: u32,
        symbol: Symbol,
        side: Side,
        qty: u32,
        price: i64,
    ) -> Result<u64, OfferError> {
        // Claim first so a refused claim leaves the book untouched.
        let mut claim = self.conn.try_claim(
            ORDERS_STREAM,
            u16::from(msg_type::NEW_ORDER),
            size_of::<NewOrder>(),
        )?;
        let (id, m) = self.client.new_order(account, symbol, side, qty, price);
        claim.copy_from_slice(m.as_bytes());
        claim.commit();
        Ok(id)
    }

    /// Queues a cancel of order `id`.
    pub fn cancel(&mut self, id: u64) -> Result<(), OfferError> {
        self.send(msg_type::CANCEL, |c| c.cancel(id))
    }

    /// Queues a replace of order `id`.
    pub fn replace(&mut self, id: u64, qty: u32, price: i64) -> Result<(), OfferError> {
        self.send(msg_type::REPLACE, |c| c.replace(id, qty, price))
    }

    /// Queues a mass cancel (account 0: all of the engine's accounts; blank symbol: all).
    pub fn mass_cancel(&mut self, account: u32, symbol: Symbol) -> Result<(), OfferError> {
        self.send(msg_type::MASS_CANCEL, |c| c.mass_cancel(account, symbol))
    }

    /// Sends everything queued (and a heartbeat when one is due). Fails with
    /// [`PeerLost::Silent`] once a poll declared the gateway dead.
    pub fn flush(&mut self) -> Result<(), OfferError> {
        self.check_liveness(false).map_err(OfferError::PeerLost)?;
        self.conn.flush()
    }

    /// Applies up to `limit` responses to the book, handing each (or why it did not apply)
    /// to `on_response`; returns how many frames were read.
    pub fn poll(
        &mut self,
        mut on_response: impl FnMut(Result<Response, ClientError>),
        limit: usize,
    ) -> Result<usize, OrdersError> {
        let (client, stray) = (&mut self.client, &mut self.stray_frames);
        let n = self.conn.subscription().poll(
            |f| {
                if f.stream_id != ORDERS_STREAM {
                    *stray += 1;
                } else if f.msg_type != u16::from(msg_type::HEARTBEAT) {
                    on_response(client.on_response(f.payload));
                }
            },
            limit,
        )?;
        if n > 0 {
            self.heard = true;
        }
        self.polls = self.polls.wrapping_add(1);
        if self.polls % POLLS_PER_CHECK == 0 {
            self.check_liveness(true).map_err(OrdersError::PeerLost)?;
        }
        Ok(n)
    }

    /// Disconnects (the gateway cancels the engine's open orders).
    pub fn close(&mut self) {
        self.conn.close();
    }
}

/// Decodes a request (re-exported for engines that log their own traffic).
pub fn decode_request(bytes: &[u8]) -> Result<Request, DecodeError> {
    Request::decode(bytes).map(|(r, _)| r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::OrdState;
    use zerocopy::IntoBytes;

    #[test]
    fn tracks_order_life() {
        let mut c = Client::new(100);
        let sym = Symbol::new("AAPL").unwrap();
        let (id, m) = c.new_order(1, sym, Side::Buy, 10, 5);
        assert_eq!(id, 100);
        assert_eq!(decode_request(m.as_bytes()).unwrap().cl_ord_id(), 100);
        c.on_response(Response::ack(id, 7).as_bytes()).unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::New);
        c.on_response(Response::fill(id, 4, 5, 4, 6).as_bytes())
            .unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::PartiallyFilled);
        c.on_response(Response::fill(id, 6, 5, 10, 0).as_bytes())
            .unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::Filled);
        assert_eq!(c.position(sym), 10);
        assert_eq!(
            c.on_response(Response::canceled(id, 0).as_bytes())
                .unwrap_err(),
            ClientError::AlreadyFinal(id)
        );
        assert_eq!(
            c.on_response(Response::ack(999, 1).as_bytes()).unwrap_err(),
            ClientError::UnknownOrder(999)
        );
        let (id2, _) = c.new_order(1, sym, Side::Sell, 10, 5);
        c.on_response(Response::reject(id2, msg_type::NEW_ORDER, RejectReason::Halted).as_bytes())
            .unwrap();
        assert_eq!(
            c.order(id2).unwrap().state,
            OrderState::Rejected(RejectReason::Halted)
        );
    }

    #[test]
    fn requests_are_numbered_and_a_logon_answer_says_which_were_not_taken() {
        let mut c = Client::new(1);
        let sym = Symbol::new("AAPL").unwrap();
        let seqs: Vec<u32> = (0..5)
            .map(|_| {
                let (_, m) = c.new_order(1, sym, Side::Buy, 10, 5);
                decode_request(m.as_bytes()).unwrap().seq()
            })
            .collect();
        assert_eq!(seqs, [1, 2, 3, 4, 5]);
        let cancel = c.cancel(2);
        assert_eq!(cancel.header.seq.get(), 6);
        // The gateway journaled up to 3: 4, 5 and the cancel were not taken.
        c.on_logon(3);
        let not: Vec<(u32, u64)> = c
            .not_taken()
            .iter()
            .map(|r| (r.seq(), r.cl_ord_id()))
            .collect();
        assert_eq!(not, [(4, 4), (5, 5), (6, 2)]);
        // Numbering goes on. A request not sent again stays listed even when the gateway
        // took later numbers: it cannot have taken this one (a hole).
        assert_eq!(c.next_request_seq(), 7);
        let (_, m7) = c.new_order(1, sym, Side::Buy, 10, 5);
        assert_eq!(decode_request(m7.as_bytes()).unwrap().seq(), 7);
        c.on_logon(7);
        let not: Vec<u32> = c.not_taken().iter().map(|r| r.seq()).collect();
        assert_eq!(not, [4, 5, 6], "holes below a taken number are kept");
        // Sent again (as resend_not_taken does) and confirmed by a later logon: cleared.
        // take_not_taken counts as sending them again.
        assert_eq!(c.take_not_taken().len(), 3);
        c.on_logon(7);
        assert!(c.not_taken().is_empty());
        // Sent again and the connection lost before the answer: a logon that did not take
        // them lists them again.
        let mut d = Client::new(1);
        for _ in 0..3 {
            d.new_order(1, sym, Side::Buy, 10, 5);
        }
        d.on_logon(1);
        assert_eq!(d.take_not_taken().len(), 2);
        d.on_logon(1);
        let not: Vec<u32> = d.not_taken().iter().map(|r| r.seq()).collect();
        assert_eq!(not, [2, 3]);
        // The gateway's holes below its last taken number are not taken either; with
        // `more`, nothing above the last listed one is known to be taken.
        let mut h = Client::new(1);
        for _ in 0..6 {
            h.new_order(1, sym, Side::Buy, 10, 5);
        }
        assert_eq!(h.oldest_unsure(), 1);
        h.on_logon_with_holes(6, &[4, 2], false);
        let not: Vec<u32> = h.not_taken().iter().map(|r| r.seq()).collect();
        assert_eq!(not, [2, 4]);
        assert_eq!(h.oldest_unsure(), 0, "every fate is known");
        let mut m = Client::new(1);
        for _ in 0..6 {
            m.new_order(1, sym, Side::Buy, 10, 5);
        }
        m.on_logon_with_holes(5, &[2], true);
        let not: Vec<u32> = m.not_taken().iter().map(|r| r.seq()).collect();
        assert_eq!(not, [2, 3, 4, 5, 6]);
        // A client that lost its state continues after the gateway's number.
        let mut fresh = Client::new(1000);
        fresh.on_logon(41);
        assert_eq!(fresh.next_request_seq(), 42);
        assert!(fresh.not_taken().is_empty());
    }

    #[test]
    fn status_answers_and_not_taken_rejects_are_accepted_and_change_nothing() {
        let mut c = Client::new(1);
        let sym = Symbol::new("AAPL").unwrap();
        let (id, _) = c.new_order(1, sym, Side::Buy, 10, 5);
        c.on_response(Response::ack(id, 7).as_bytes()).unwrap();
        let st = Response::status(id, OrdState::Open, 10, 0, 5, msg_type::NEW_ORDER, None, 1);
        c.on_response(st.as_bytes()).unwrap();
        assert_eq!(c.order(id).unwrap().state, OrderState::New);
        // Unknown to this client (it lost its state): still informational, not an error.
        let other = Response::status(77, OrdState::Filled, 1, 1, 5, msg_type::NEW_ORDER, None, 9);
        c.on_response(other.as_bytes()).unwrap();
        // A journal-full reject: the request is listed as not taken; the order stays pending.
        let (id2, _) = c.new_order(1, sym, Side::Buy, 10, 5);
        let r = Response::reject(id2, msg_type::NEW_ORDER, RejectReason::JournalUnavailable);
        c.on_response(r.as_bytes()).unwrap();
        c.on_response(r.as_bytes()).unwrap();
        assert_eq!(c.order(id2).unwrap().state, OrderState::PendingNew);
        assert_eq!(c.not_taken().len(), 1);
        assert_eq!(c.not_taken()[0].cl_ord_id(), id2);
        // A later request is taken and the engine logs on again before sending id2 again:
        // the gateway's number is past id2's, which still was not taken.
        let (id3, m3) = c.new_order(1, sym, Side::Buy, 10, 5);
        c.on_logon(decode_request(m3.as_bytes()).unwrap().seq());
        assert_eq!(
            c.not_taken().len(),
            1,
            "the JournalUnavailable hole is kept"
        );
        assert_eq!(c.not_taken()[0].cl_ord_id(), id2);
        assert_ne!(id2, id3);
    }

    #[test]
    fn numbered_responses_apply_once() {
        let mut c = Client::new(1);
        let (id, _) = c.new_order(1, Symbol::new("AAPL").unwrap(), Side::Buy, 10, 5);
        let mut ack = Response::ack(id, 7);
        ack.set_seq(1);
        let mut fill = Response::fill(id, 4, 5, 4, 6);
        fill.set_seq(2);
        c.on_response(ack.as_bytes()).unwrap();
        c.on_response(fill.as_bytes()).unwrap();
        assert_eq!(c.last_response_seq(), 2);
        // A replay that overlaps what was applied changes nothing.
        assert_eq!(
            c.on_response(fill.as_bytes()).unwrap_err(),
            ClientError::Duplicate(2)
        );
        assert_eq!(
            c.on_response(ack.as_bytes()).unwrap_err(),
            ClientError::Duplicate(1)
        );
        assert_eq!(c.order(id).unwrap().cum_qty, 4);
        assert_eq!(c.order(id).unwrap().state, OrderState::PartiallyFilled);
    }
}
