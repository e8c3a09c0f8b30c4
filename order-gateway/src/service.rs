//! The gateway service: one polling thread that accepts engines over the rocebus orders
//! path, feeds their frames into the [`Gateway`] (through [`FixDriver`], which owns the
//! journal and the venue link), sends the responses back over RC, keeps the FIX session up,
//! applies market data and does cancel-on-disconnect when an engine's connection is lost.
//!
//! Engines: two secrets, two jobs, neither of which travels. The orders token
//! (`[service.orders] token`) is the transport gate: the rocebus listener admits a
//! connection only once the peer proved it holds it (challenge-response, see
//! `rocebus::auth`), within the listener's limits, before the service sees it. The engine
//! token (`[[risk.engines]] token`, one per engine) authenticates the engine id: the first
//! frame of a connection must be a [`Logon`] naming the id and carrying a proof made with
//! that engine's token over this connection's handshake nonces, checked in constant time
//! before the engine is bound; a wrong one (or one replayed from another connection) is
//! answered with [`LogonStatus::BadToken`], counted, and the connection closed, so engine
//! A's token cannot log on as engine B. The id decides the accounts the engine may trade, and
//! only one connection per engine id may be live. Requests and responses travel on
//! [`ORDERS_STREAM`] (see [`crate::proto`]).
//!
//! Reconnects: the logon names the last response the engine processed; the service replays
//! every later one the gateway still holds ([`Gateway::responses_after`]) ahead of anything
//! new, through the same backlog as live responses, so nothing is lost or doubled.
//!
//! Each loop pass: market data, engine frames (batched: one journal write and one venue
//! write per batch, write-ahead as [`FixDriver`] documents), venue bytes and timers, engine
//! responses, and every millisecond the housekeeping that makes system calls (accepting
//! connections, logons, venue reconnects, counters). The hot path does not allocate in
//! steady state; a response an engine's ring cannot take now waits in that engine's
//! backlog (never dropped while the engine is connected).
//!
//! This module owns threads, the listener and the engine connections, and decides nothing
//! about them: risk, FIX and journal logic stay in the I/O-free [`Gateway`], and the
//! engines' live links (logon timeout and the pending cap, heartbeats, silence, the
//! response backlog and its cap) in the I/O-free [`EngineLinks`]; this shell reads the
//! clock once per turn, feeds them events and carries out their outputs.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use rocebus::counters::{
    counters_path, default_dir, AllocateCounter, Counter, CountersError, CountersFile, Kind,
    LocalCounters,
};
use rocebus::idle::{IdleStrategy, Idler};
use rocebus::orders::{Connection, FanIn, OfferError, OrdersConfig, OrdersError, OrdersListener};
use rocebus::rdma_settings::export::RdmaCountersExport;
use rocebus::ring::fanin::Visit;
use zerocopy::IntoBytes;

use crate::config::Config;
use crate::control::ControlServer;
use crate::driver::{DriverError, FixDriver, TcpLink, VenueLink};
use crate::engine_io::{self, WireError};
use crate::fix::SessionState;
use crate::gateway::{
    Admission, CloseReason, ConnId, DisconnectReason, EngineId, EngineLinks, Gateway, LinkConfig,
};
use crate::proto::{
    engine_key, msg_type, Heartbeat, Logon, LogonAck, LogonStatus, RequestHoles, Response, Symbol,
    HOLES_PER_FRAME, ORDERS_STREAM,
};
use crate::risk::RiskConfig;
use rocebus::clock::{Mono, Now};

// The market-data contract lives in `market` (which must not import the service); the
// service's paths stay.
pub use crate::market::{MarketDataInput, MarketEvent};

/// No market data (static reference prices from the config only).
#[derive(Clone, Copy, Debug, Default)]
pub struct NoMarketData;

impl MarketDataInput for NoMarketData {
    fn poll(&mut self, _sink: &mut dyn FnMut(MarketEvent)) -> usize {
        0
    }
}

/// Events sent from another thread (e.g. a market-data subscriber).
impl MarketDataInput for mpsc::Receiver<MarketEvent> {
    fn poll(&mut self, sink: &mut dyn FnMut(MarketEvent)) -> usize {
        let mut n = 0;
        // Bounded so a flood of market data cannot starve the order path.
        while n < 256 {
            match self.try_recv() {
                Ok(ev) => {
                    sink(ev);
                    n += 1;
                }
                Err(_) => break,
            }
        }
        n
    }
}

/// Shared between the service thread and whoever supervises it.
#[derive(Debug, Default)]
pub struct ServiceControl {
    stop: AtomicBool,
    fix_active: AtomicBool,
    engines: AtomicU32,
}

impl ServiceControl {
    /// A fresh control block.
    pub fn new() -> Arc<ServiceControl> {
        Arc::new(ServiceControl::default())
    }

    /// Asks the service to log out and return from [`Service::run`].
    pub fn stop(&self) {
        // ORDERING: Release, pairs with the Acquire in `stopping`; nothing else is published.
        self.stop.store(true, Ordering::Release);
    }

    fn stopping(&self) -> bool {
        // ORDERING: Acquire, pairs with the Release in `stop`.
        self.stop.load(Ordering::Acquire)
    }

    /// True once [`stop`](Self::stop) was called (by a signal, `control stop`, a thread).
    pub fn is_stopping(&self) -> bool {
        self.stopping()
    }

    /// From now on SIGTERM and SIGINT call [`stop`](Self::stop): the clean stop (FIX
    /// Logout, checkpoint, engines disconnected; `order-gateway run` then exits 0). A thread
    /// waits for the signals, so nothing runs inside a signal handler.
    pub fn stop_on_signals(self: &Arc<Self>) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let control = Arc::clone(self);
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    tracing::warn!(signal, "clean stop requested by a signal");
                    control.stop();
                }
            })?;
        Ok(())
    }

    /// True while the FIX session is logged on (updated every millisecond).
    pub fn is_fix_active(&self) -> bool {
        // ORDERING: Relaxed; a status flag, no other memory is read on its strength.
        self.fix_active.load(Ordering::Relaxed)
    }

    /// Engines currently logged on (updated every millisecond).
    pub fn engines_connected(&self) -> u32 {
        // ORDERING: Relaxed; a status value, as `is_fix_active`.
        self.engines.load(Ordering::Relaxed)
    }
}

/// Starting the service failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// `service.core` names a core this thread cannot be pinned to.
    #[error("service.core")]
    Pin(#[source] rocebus::idle::PinError),
    /// Journal, risk or venue set-up failed.
    #[error(transparent)]
    Driver(#[from] DriverError),
    /// The RC listener could not be bound.
    #[error("listen for engines on {addr}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: OrdersError,
    },
    /// The control socket could not be bound.
    #[error("bind the control socket {path}")]
    Control {
        /// Socket path.
        path: std::path::PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// A value of the configuration is unusable.
    #[error("config {key}: {problem}")]
    Config {
        /// Key.
        key: String,
        /// Problem.
        problem: String,
    },
}

/// What the service needs besides the gateway core: the engine side and the loop.
#[derive(Clone, Debug)]
pub struct ServiceOptions {
    /// RC listen address.
    pub listen: SocketAddr,
    /// Orders path configuration (token, rings).
    pub orders: OrdersConfig,
    /// Core to pin the polling thread to.
    pub core: Option<usize>,
    /// Idle strategy of the polling thread.
    pub idle: IdleStrategy,
    /// Venue reconnect interval.
    pub reconnect: Duration,
    /// Time a connection has to send its logon.
    pub logon_timeout: Duration,
    /// How long a logged-on engine may be silent (no frame, no heartbeat) before it is
    /// disconnected and cancel-on-disconnect runs; after a restart, also the time an engine
    /// has to log on again before cancel-on-disconnect.
    pub engine_timeout: Duration,
    /// Heartbeat interval both ways (announced to engines in the logon answer; at most
    /// 65535 ms).
    pub heartbeat: Duration,
    /// Connections in their handshake, waiting for their logon or being closed after a
    /// refused one, at once; a connect request beyond this is rejected.
    pub max_pending_connections: usize,
    /// The operator's control socket (None: no control socket).
    pub control_socket: Option<std::path::PathBuf>,
    /// Publish counters in a counters file (else in process memory).
    pub counters_file: bool,
    /// Static reference prices, re-applied continuously.
    pub static_prices: Vec<(Symbol, i64)>,
    /// Responses that may wait for one engine whose ring is full; one more disconnects it.
    pub max_response_backlog: usize,
}

impl ServiceOptions {
    /// The options of a loaded configuration.
    pub fn from_config(cfg: &Config) -> Result<ServiceOptions, ServiceError> {
        let s = &cfg.service;
        Ok(ServiceOptions {
            listen: s.listen,
            orders: s.orders.clone(),
            core: s.core,
            idle: s.idle,
            reconnect: Duration::from_secs(s.reconnect_secs.max(1)),
            logon_timeout: Duration::from_millis(s.logon_timeout_ms),
            engine_timeout: Duration::from_millis(s.engine_timeout_ms),
            heartbeat: Duration::from_millis(s.heartbeat_ms),
            max_pending_connections: s.max_pending_connections,
            control_socket: Some(s.control_socket.clone()),
            counters_file: s.counters,
            static_prices: cfg
                .static_prices()
                .map_err(|(key, problem)| ServiceError::Config { key, problem })?,
            max_response_backlog: s.max_response_backlog,
        })
    }
}

/// Records in the gateway's counters table: the service's own (40) and the market-data
/// input's (9, and 18 per channel subscribed: room for 54 channels).
const COUNTERS_CAPACITY: u32 = 1024;

/// The gateway's counters table: its file, or process memory when it has none.
#[derive(Debug)]
enum Table {
    File(CountersFile),
    Local(LocalCounters),
}

impl AllocateCounter for Table {
    fn allocate_counter(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        match self {
            Table::File(f) => f.allocate_counter(label, kind, type_id),
            Table::Local(l) => l.allocate_counter(label, kind, type_id),
        }
    }
}

/// Service counters, in the counters file (`rocebus stat order-gateway`).
#[derive(Debug)]
struct Counters {
    /// Where they live; the market-data input allocates its own here too.
    table: Table,
    engines_connected: Counter,
    logons: Counter,
    logons_refused: Counter,
    logons_bad_token: Counter,
    responses_replayed: Counter,
    engine_disconnects: Counter,
    requests: Counter,
    responses: Counter,
    responses_dropped: Counter,
    responses_backlogged: Counter,
    backlog_disconnects: Counter,
    requests_held: Counter,
    stray_frames: Counter,
    venue_connects: Counter,
    fix_active: Counter,
    open_orders: Counter,
    malformed_engine: Counter,
    malformed_fix: Counter,
    connections_refused: Counter,
    handshakes_failed: Counter,
    bad_credits: Counter,
    pending_rejected: Counter,
    engines_silent: Counter,
    venue_connect_failures: Counter,
    journal_failures: Counter,
    journal_degraded: Counter,
    journal_durable_bytes: Counter,
    /// The core's and the FIX session's own counters, copied each housekeeping turn.
    core: Vec<(Counter, ReadCounter)>,
    /// The listener's GID and marking, and the registered memory (`rdma.*`).
    rdma: Option<RdmaCountersExport>,
}

/// Reads one of the core's counters.
type ReadCounter = fn(&Gateway) -> u64;

/// The core's counters published as they are: label and how to read it.
const CORE_COUNTERS: &[(&str, ReadCounter)] = &[
    ("engines disconnected: too many malformed frames", |g| {
        g.counters().malformed_disconnects
    }),
    ("engine frames dropped after a malformed cut-off", |g| {
        g.counters().frames_after_cutoff
    }),
    (
        "venue fills whose LastQty was not their CumQty's growth",
        |g| g.counters().inconsistent_fills,
    ),
    (
        "venue fills known only from a status answer (reports never read)",
        |g| g.counters().status_fills,
    ),
    (
        "venue status answers with CumQty below what was applied (not applied)",
        |g| g.counters().status_mismatch,
    ),
    (
        "repeated-order check: orders forgotten early (too many)",
        |g| g.risk().identical_evictions(),
    ),
    ("engine requests re-sent (answered with status)", |g| {
        g.counters().resent_requests
    }),
    (
        "cancel-on-disconnects run late (after a restart, or venue back)",
        |g| g.counters().deferred_cancel_on_disconnect,
    ),
    ("fix application messages rejected", |g| {
        g.counters().rejected_app
    }),
    ("fix execution reports for unknown orders", |g| {
        g.counters().unknown_exec
    }),
    ("fix duplicate executions ignored", |g| {
        g.counters().duplicate_execs
    }),
    ("fix overfills", |g| g.counters().overfills),
    ("fix fills on final orders", |g| g.counters().late_fills),
    ("fix trade cancels", |g| g.counters().trade_cancels),
    ("fix trade corrections", |g| g.counters().trade_corrections),
    ("fix late venue answers", |g| g.counters().late_answers),
    ("fix order messages refused", |g| g.counters().venue_refused),
    (
        "requests journaled but never sent, rejected at a restart",
        |g| g.counters().not_sent,
    ),
    ("fix garbled frames", |g| g.session().counters().garbled),
    ("fix session rejects sent", |g| {
        g.session().counters().rejects_sent
    }),
    ("fix session rejects received", |g| {
        g.session().counters().rejects_received
    }),
    ("fix resend requests sent", |g| {
        g.session().counters().resend_requests_sent
    }),
    ("fix resend request timeouts", |g| {
        g.session().counters().resend_timeouts
    }),
    ("fix messages resent", |g| {
        g.session().counters().messages_resent
    }),
    ("fix sequence resets received", |g| {
        g.session().counters().resets_received
    }),
    ("fix messages queued behind a gap", |g| {
        g.session().counters().queued
    }),
    ("fix queue overflows", |g| {
        g.session().counters().queue_overflow
    }),
    ("fix logons refused by the venue", |g| {
        g.session().counters().logons_refused
    }),
    ("fix logouts for our MsgSeqNum too low", |g| {
        g.session().counters().seq_too_low_logouts
    }),
    (
        "fix messages refused for SendingTime/OrigSendingTime",
        |g| g.session().counters().sending_time_problems,
    ),
];

impl Counters {
    fn new(opts: &ServiceOptions) -> Counters {
        let file = opts.counters_file;
        let local =
            || Table::Local(LocalCounters::new(COUNTERS_CAPACITY).expect("a valid capacity"));
        let table = if file {
            let path = counters_path(&default_dir(), "order-gateway");
            match CountersFile::create(&path, COUNTERS_CAPACITY) {
                Ok(f) => Table::File(f),
                Err(e) => {
                    tracing::warn!(error = %e, "counters stay in process memory");
                    local()
                }
            }
        } else {
            local()
        };
        let alloc = |label: &str, kind: Kind| {
            // 1024 slots for fewer than 64 labels under 104 bytes: allocation cannot fail.
            table
                .allocate_counter(label, kind, 0)
                .expect("counter slot")
        };
        use Kind::{Counter as C, Gauge as G};
        Counters {
            engines_connected: alloc("engines connected", G),
            logons: alloc("engine logons", C),
            logons_refused: alloc("engine logons refused", C),
            logons_bad_token: alloc("engine logons with a wrong token", C),
            responses_replayed: alloc("engine responses replayed on logon", C),
            engine_disconnects: alloc("engine disconnects (cancel-on-disconnect)", C),
            requests: alloc("engine requests", C),
            responses: alloc("engine responses sent", C),
            responses_dropped: alloc("engine responses dropped (engine gone)", C),
            responses_backlogged: alloc("engine responses back-pressured", C),
            backlog_disconnects: alloc("engines disconnected: response backlog full", C),
            requests_held: alloc("engine requests held: response backlog at half the cap", C),
            stray_frames: alloc("engine frames on unknown streams", C),
            venue_connects: alloc("venue connects", C),
            fix_active: alloc("fix session active", G),
            open_orders: alloc("open orders", G),
            malformed_engine: alloc("malformed engine frames", C),
            malformed_fix: alloc("malformed fix frames", C),
            connections_refused: alloc(
                "orders connections refused (bad hello, bad proof, limits)",
                C,
            ),
            handshakes_failed: alloc("orders connection handshakes failed", C),
            bad_credits: alloc(
                "engine credit words refused (forged or corrupt; beyond what was sent: closed)",
                C,
            ),
            pending_rejected: alloc(
                "orders connections rejected: too many pending (max_pending_connections)",
                C,
            ),
            engines_silent: alloc("engines disconnected: silent past engine_timeout_ms", C),
            venue_connect_failures: alloc("venue connect attempts failed", C),
            journal_failures: alloc("journal append failures (disk full or failing)", C),
            journal_degraded: alloc("journal unwritable: requests not taken", G),
            journal_durable_bytes: alloc("journal durable bytes", G),
            core: CORE_COUNTERS
                .iter()
                .map(|&(label, read)| (alloc(label, C), read))
                .collect(),
            // The GID engines reach the listener on, logged too.
            rdma: RdmaCountersExport::for_address(
                &table,
                "rdma",
                opts.orders.rc.class(),
                opts.listen.ip(),
                "engine listener",
            )
            .map_err(|e| tracing::warn!(error = %e, "rdma.* counters not published"))
            .ok(),
            table,
        }
    }
}

/// A logged-on engine's connection; its live link (heartbeats, silence, backlog) is
/// [`EngineLinks`]'.
struct EngineConn {
    id: EngineId,
    conn: Connection,
    /// Something was committed since the last flush.
    dirty: bool,
    /// Its slot in the listener's fan-in summary (none: polled every turn).
    slot: Option<usize>,
}

/// A connection that has not become an engine: waiting for its logon, or refused and
/// lingering for its answer to be read ([`EngineLinks`] decides when it goes).
struct Waiting {
    id: ConnId,
    conn: Connection,
}

/// Fan-in slots when `service.orders.fanin_slots` is 0: the gateway always polls its
/// engines through the fan-in summary.
const DEFAULT_FANIN_SLOTS: usize = 256;
/// Frames taken from one engine per poll.
const ENGINE_BATCH: usize = 64;

/// Polls one engine's ring: its requests go to the driver, any frame is a sign of life
/// for its link, a lost connection is reported to it ([`engine_io`]). Takes at most
/// [`ENGINE_BATCH`] frames and at most what flow control lets through
/// ([`EngineLinks::request_budget`]; zero: the poll only notices a lost connection).
/// Returns the frames taken, and whether it stopped at its limit (frames may be left).
fn poll_engine<L: VenueLink>(
    e: &mut EngineConn,
    driver: &mut FixDriver<L>,
    links: &mut EngineLinks,
    c: &Counters,
    now: Now,
) -> (usize, bool) {
    let id = e.id;
    let limit = links.request_budget(id).min(ENGINE_BATCH);
    let r = e.conn.subscription().poll(
        |f| {
            if f.stream_id != ORDERS_STREAM {
                c.stray_frames.inc();
            } else if engine_io::take_frame(driver, id, f.msg_type, f.payload, now.wall) {
                c.requests.inc();
            }
        },
        limit,
    );
    let n = *r.as_ref().unwrap_or(&0);
    let at_limit = r.is_ok() && n == limit;
    if engine_io::frames_polled(links, id, r.map_err(|_| ()), now.mono) {
        tracing::warn!(engine = id, "engine connection lost");
    }
    (n, at_limit)
}

/// The service's engine connections as [`engine_io`] writes to and closes them.
struct Wire<'a> {
    engines: &'a mut Vec<EngineConn>,
    pending: &'a mut Vec<Waiting>,
    closing: &'a mut Vec<Waiting>,
    by_slot: &'a mut [usize],
    unslotted: &'a mut Vec<usize>,
    counters: &'a Counters,
    opts: &'a ServiceOptions,
}

impl Wire<'_> {
    fn conn(&mut self, engine: EngineId) -> Option<&mut EngineConn> {
        self.engines.iter_mut().find(|e| e.id == engine)
    }
}

/// Rebuilds the slot index after `engines` changed.
fn reindex(engines: &[EngineConn], by_slot: &mut [usize], unslotted: &mut Vec<usize>) {
    by_slot.fill(usize::MAX);
    unslotted.clear();
    for (i, e) in engines.iter().enumerate() {
        match e.slot {
            Some(s) => by_slot[s] = i,
            None => unslotted.push(i),
        }
    }
}

impl engine_io::EngineWire for Wire<'_> {
    fn engine_at(&self, i: usize) -> Option<EngineId> {
        self.engines.get(i).map(|e| e.id)
    }

    fn offer(&mut self, engine: EngineId, r: &Response) -> Result<(), WireError> {
        let Some(e) = self.conn(engine) else {
            return Err(WireError::Lost);
        };
        match offer(&mut e.conn, r) {
            Ok(()) => {
                e.dirty = true;
                Ok(())
            }
            Err(OfferError::BackPressured) => Err(WireError::BackPressured),
            Err(_) => Err(WireError::Lost),
        }
    }

    fn heartbeat(&mut self, engine: EngineId, now: rocebus::clock::Wall) -> Result<(), WireError> {
        match self.conn(engine) {
            Some(e) => send_heartbeat(e, now),
            None => Ok(()),
        }
    }

    fn flush(&mut self, engine: EngineId) -> bool {
        match self.conn(engine) {
            Some(e) if e.dirty => {
                e.dirty = false;
                e.conn.flush().is_ok()
            }
            _ => true,
        }
    }

    fn close_engine(&mut self, id: EngineId, reason: DisconnectReason) {
        if let Some(i) = self.engines.iter().position(|e| e.id == id) {
            let mut e = self.engines.remove(i);
            match reason {
                DisconnectReason::Silent(_) => e.conn.close_silent(),
                _ => e.conn.close(),
            }
            reindex(self.engines, self.by_slot, self.unslotted);
        }
        self.counters.engine_disconnects.inc();
        match reason {
            DisconnectReason::Silent(silent) => {
                tracing::warn!(
                    engine = id,
                    silent_ms = silent.as_millis() as u64,
                    engine_timeout_ms = self.opts.engine_timeout.as_millis() as u64,
                    "engine silent (no frame, no heartbeat; held: no response read): disconnecting it, \
                     canceling its orders"
                );
            }
            DisconnectReason::BacklogFull => {
                tracing::warn!(
                    engine = id,
                    max_response_backlog = self.opts.max_response_backlog,
                    "engine is not reading its responses: backlog full, disconnecting it, \
                     canceling its orders"
                );
            }
            DisconnectReason::CutOff | DisconnectReason::Lost => tracing::info!(
                engine = id,
                ?reason,
                "engine disconnected: canceling its open orders"
            ),
        }
    }

    fn close_conn(&mut self, id: ConnId, reason: CloseReason) {
        let at = |v: &Vec<Waiting>| v.iter().position(|w| w.id == id);
        let w = match (at(self.pending), at(self.closing)) {
            (Some(i), _) => self.pending.swap_remove(i),
            (None, Some(i)) => self.closing.swap_remove(i),
            (None, None) => return,
        };
        let mut conn = w.conn;
        if reason == CloseReason::LogonTimeout {
            tracing::warn!(peer = %conn.peer(), "no logon in time: closing");
        }
        conn.close();
    }
}

/// Writes a heartbeat stamped `now` into `e`'s ring (a full ring is no failure for the
/// links: the engine has responses to read).
fn send_heartbeat(e: &mut EngineConn, now: rocebus::clock::Wall) -> Result<(), WireError> {
    let hb = Heartbeat::new(now.as_nanos());
    let sent = e
        .conn
        .try_claim(
            ORDERS_STREAM,
            u16::from(msg_type::HEARTBEAT),
            size_of::<Heartbeat>(),
        )
        .map(|mut claim| {
            claim.copy_from_slice(hb.as_bytes());
            claim.commit();
        });
    match sent {
        Ok(()) => {
            e.dirty = true;
            Ok(())
        }
        Err(OfferError::BackPressured) => Err(WireError::BackPressured),
        Err(_) => Err(WireError::Lost),
    }
}

/// How long a refused connection is kept for its answer to be read.
const REFUSAL_LINGER: Duration = Duration::from_millis(100);
/// Connect requests looked at per housekeeping turn (more wait for the next turn).
const REQUESTS_PER_TURN: usize = 4;
/// A venue reconnect waits `reconnect` after a failure, doubling up to this many times it.
pub const MAX_BACKOFF_FACTOR: u32 = 4;

/// Writes a response straight into the connection's registered send memory.
fn offer(conn: &mut Connection, r: &Response) -> Result<(), OfferError> {
    let bytes = r.as_bytes();
    let mut claim = conn.try_claim(ORDERS_STREAM, u16::from(bytes[0]), bytes.len())?;
    claim.copy_from_slice(bytes);
    claim.commit();
    Ok(())
}

/// The verdict on a logon, and the gateway's last response number for the engine: the
/// engine must be configured, prove it holds its own token on this connection (`binding`:
/// the connection's session binding), not be connected already, and name a last response
/// the gateway can continue from.
fn logon_verdict(
    keys: &[(EngineId, rocebus::auth::Key)],
    binding: &[u8],
    connected: impl Fn(EngineId) -> bool,
    gw: &Gateway,
    logon: Option<&Logon>,
) -> (LogonStatus, u32) {
    let Some(l) = logon else {
        return (LogonStatus::BadLogon, 0);
    };
    let id = l.engine_id.get();
    let Some((_, key)) = keys.iter().find(|(e, _)| *e == id) else {
        return (LogonStatus::UnknownEngine, 0);
    };
    // Constant time (auth::Key::verify): how much of a guess matched must not show.
    if !l.verify(key, binding) {
        return (LogonStatus::BadToken, 0);
    }
    if connected(id) {
        return (LogonStatus::AlreadyConnected, 0);
    }
    match gw.responses_after(id, l.last_response_seq.get()) {
        Ok(_) => (LogonStatus::Accepted, gw.last_response_seq(id)),
        Err(status) => (status, 0),
    }
}

/// The gateway service.
pub struct Service<L: VenueLink = TcpLink> {
    driver: FixDriver<L>,
    listener: OrdersListener,
    /// The engines' live links: every decision about heartbeats, silence, backlogs, logon
    /// timeouts and the pending cap (this shell carries them out).
    links: EngineLinks,
    /// Logons refused by their verdict (the links count those that never came).
    logons_refused: u64,
    /// Each configured engine and its token as the logon carries it.
    engine_keys: Vec<(EngineId, rocebus::auth::Key)>,
    engines: Vec<EngineConn>,
    /// The listener's fan-in summary: engines with a slot are polled when they marked it.
    fanin: FanIn,
    /// Index in `engines` by fan-in slot (`usize::MAX`: none).
    by_slot: Vec<usize>,
    /// Engines without a slot, polled every turn.
    unslotted: Vec<usize>,
    /// The engine the next turn sweeps (polls whether marked or not: credit, disconnects).
    sweep: usize,
    /// Connections waiting for their logon.
    pending: Vec<Waiting>,
    /// Connections refused, lingering for their answer to be read.
    closing: Vec<Waiting>,
    /// When the venue is connected to next.
    venue_reconnect: VenueReconnect,
    opts: ServiceOptions,
    counters: Counters,
    control: Arc<ServiceControl>,
    operator: Option<ControlServer>,
}

/// When the service (re)connects to the venue: at once at start, then after each failure
/// `reconnect` later, doubling up to [`MAX_BACKOFF_FACTOR`] times it for failures in a row.
/// A Logon the venue refused (answered with a Logout) counts as a failure too, so a venue
/// that refuses us is not sent the same Logon every `reconnect`; and after a "MsgSeqNum too
/// low" Logout nothing is tried until an operator releases it
/// ([`Gateway::reconnect_hold`], `venue-reconnect` on the control socket).
///
/// The service polls it every millisecond with its driver; public so that tests can drive
/// it against a venue with a [`FixDriver`] of their own (the service needs an RDMA device
/// for its engine listener).
#[derive(Debug)]
pub struct VenueReconnect {
    reconnect: Duration,
    /// Venue connect attempts failed in a row (for the back-off).
    failures: u32,
    /// The session's `logons_refused` when last looked at.
    logons_refused_seen: u64,
    /// No connect starts before this.
    next: Mono,
}

/// What a [`VenueReconnect::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VenueConnect {
    /// Nothing completed or failed (connected, waiting, held, or a connect under way).
    Idle,
    /// A connect completed: the Logon was sent.
    Connected,
    /// A connect failed; the next one backs off.
    Failed,
}

impl VenueReconnect {
    /// The first connect is due at `now`; `reconnect` is the back-off's first wait.
    pub fn new(reconnect: Duration, now: Mono) -> VenueReconnect {
        VenueReconnect {
            reconnect,
            failures: 0,
            logons_refused_seen: 0,
            next: now,
        }
    }

    /// Starts a connect of `driver` when one is due (not connected, not held, the back-off
    /// elapsed at `now`) and drives one under way; never waits.
    pub fn poll<L: VenueLink>(&mut self, driver: &mut FixDriver<L>, now: Now) -> VenueConnect {
        let t = now.mono;
        // Failures in a row end when the venue accepts our Logon, not when the socket
        // opens: a venue that refuses every Logon is backed off like one that refuses the
        // connection.
        if self.failures != 0
            && driver.is_connected()
            && driver.gateway().session().state() == SessionState::Active
        {
            self.failures = 0;
        }
        if !driver.is_connecting() && !driver.is_connected() {
            let gw = driver.gateway();
            // Counted even while held, so the operator's release connects at once (the
            // wait has run meanwhile) and the back-off goes on from there.
            let refused = gw.session().counters().logons_refused;
            if refused != self.logons_refused_seen {
                self.logons_refused_seen = refused;
                let wait = self.back_off(t);
                if gw.reconnect_hold().is_none() {
                    let reason = gw.session().logon_refusal().unwrap_or_default();
                    tracing::warn!(
                        refused,
                        reason,
                        "the venue refused our Logon; retrying in {wait:?}"
                    );
                }
            }
            if gw.reconnect_hold().is_some() {
                return VenueConnect::Idle;
            }
        }
        let result = if driver.is_connecting() {
            driver.poll_connect_at(now)
        } else if !driver.is_connected() && t >= self.next {
            driver
                .start_connect_at(now)
                .and_then(|()| driver.poll_connect_at(now))
        } else {
            return VenueConnect::Idle;
        };
        match result {
            Ok(true) => {
                tracing::info!(venue = %driver.link().describe(), "venue connected, logon sent");
                VenueConnect::Connected
            }
            Ok(false) => VenueConnect::Idle,
            Err(e) => {
                let wait = self.back_off(t);
                tracing::warn!("{:#}; retrying in {:?}", anyhow::Error::from(e), wait);
                VenueConnect::Failed
            }
        }
    }

    /// Venue failures in a row (failed connects and refused Logons); 0 once a Logon is
    /// accepted.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// One more venue failure in a row: the next connect waits `reconnect`, doubling up to
    /// [`MAX_BACKOFF_FACTOR`] times it.
    fn back_off(&mut self, t: Mono) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let factor = 1u32 << self.failures.saturating_sub(1).min(2);
        let wait = self.reconnect * factor.min(MAX_BACKOFF_FACTOR);
        self.next = t + wait;
        wait
    }
}

impl<L: VenueLink> std::fmt::Debug for Service<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("listen", &self.opts.listen)
            .field("engines", &self.engines.len())
            .finish_non_exhaustive()
    }
}

impl Service<TcpLink> {
    /// Opens the journal (recovering state) and binds the engine listener, from `cfg`.
    pub fn from_config(
        cfg: &Config,
        control: Arc<ServiceControl>,
    ) -> Result<Service, ServiceError> {
        let driver = FixDriver::open(cfg)?;
        Service::new(
            driver,
            &cfg.risk,
            ServiceOptions::from_config(cfg)?,
            control,
        )
    }
}

impl<L: VenueLink> Service<L> {
    /// A service around an opened driver; binds the engine listener. Engines that were
    /// logged on when the gateway last stopped (or have open orders) get
    /// `engine_timeout` to log on again before their orders are cancelled.
    pub fn new(
        mut driver: FixDriver<L>,
        risk: &RiskConfig,
        opts: ServiceOptions,
        control: Arc<ServiceControl>,
    ) -> Result<Service<L>, ServiceError> {
        let mut orders = opts.orders.clone();
        if orders.fanin_slots == 0 {
            orders.fanin_slots = DEFAULT_FANIN_SLOTS;
        }
        // At least 2, and one address's cap below the total, so one address
        // can never hold every handshake slot (rocebus::admission).
        orders.max_pending_handshakes = orders
            .max_pending_handshakes
            .min(opts.max_pending_connections)
            .max(2);
        orders.max_pending_per_peer = orders
            .max_pending_per_peer
            .min(orders.max_pending_handshakes - 1);
        orders.cookie_when_pending = orders
            .cookie_when_pending
            .min(orders.max_pending_handshakes - 1);
        let listener =
            OrdersListener::bind(orders, opts.listen).map_err(|source| ServiceError::Listen {
                addr: opts.listen,
                source,
            })?;
        let operator = match &opts.control_socket {
            Some(path) => {
                Some(
                    ControlServer::bind(path).map_err(|source| ServiceError::Control {
                        path: path.clone(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let timeout = opts.engine_timeout.as_nanos() as u64;
        // Building the service is a turn of its own: its one clock read.
        let now = Now::read();
        driver.stage(|gw, _| gw.arm_restart_cancel_on_disconnect(now.wall.as_nanos(), timeout));
        for (engine, _) in driver.gateway().restart_deadlines() {
            tracing::info!(
                engine,
                timeout_ms = opts.engine_timeout.as_millis() as u64,
                "engine was logged on or has open orders: cancelling them unless it logs on again in time"
            );
        }
        let fanin = listener.fan_in();
        Ok(Service {
            by_slot: vec![usize::MAX; fanin.slots()],
            unslotted: Vec::new(),
            sweep: 0,
            fanin,
            driver,
            listener,
            links: EngineLinks::new(LinkConfig {
                logon_timeout: opts.logon_timeout,
                engine_timeout: opts.engine_timeout,
                heartbeat: opts.heartbeat,
                max_pending: opts.max_pending_connections,
                max_backlog: opts.max_response_backlog,
                refusal_linger: REFUSAL_LINGER,
            }),
            logons_refused: 0,
            // RiskEngine::new (the driver's) has validated every token.
            engine_keys: risk
                .engines
                .iter()
                .map(|e| (e.id, engine_key(e.token.as_bytes())))
                .collect(),
            engines: Vec::with_capacity(risk.engines.len()),
            pending: Vec::new(),
            closing: Vec::new(),
            venue_reconnect: VenueReconnect::new(opts.reconnect, now.mono),
            counters: Counters::new(&opts),
            opts,
            control,
            operator,
        })
    }

    /// The gateway core (state after [`run`](Self::run) returned, for tests and tools).
    pub fn gateway(&self) -> &Gateway {
        self.driver.gateway()
    }

    /// The driver (venue link, journal).
    pub fn driver(&self) -> &FixDriver<L> {
        &self.driver
    }

    /// Runs the loop on this thread until [`ServiceControl::stop`]; then logs out of the
    /// venue. Pins the thread first if the options name a core.
    pub fn run(&mut self, market: &mut dyn MarketDataInput) -> Result<(), ServiceError> {
        if let Some(core) = self.opts.core {
            rocebus::idle::pin_to(core).map_err(ServiceError::Pin)?;
        }
        if let Err(e) = market.register_counters(&self.counters.table) {
            tracing::warn!(error = %e, "market-data counters not published");
        }
        let mut idler = Idler::new(self.opts.idle);
        let mut next_housekeeping = Mono::ZERO;
        while !self.control.stopping() {
            let mut work = 0;
            // The turn's one clock read: every machine below gets this time.
            let now = Now::read();
            let driver = &mut self.driver;
            work += market.poll(&mut |ev| {
                driver.stage(|gw, _| match ev {
                    MarketEvent::Reference { symbol, price } => {
                        gw.on_reference_price(symbol, price, now.wall.as_nanos())
                    }
                    MarketEvent::Halt { symbol, halted } => gw.on_halt(symbol, halted),
                    // Observed at the epoch: older than any age limit, so stale at once.
                    MarketEvent::Stale { symbol } => gw.on_reference_price(symbol, 0, 0),
                })
            });
            work += self.poll_engines(now);
            work += self.poll_venue(now)?;
            if now.mono >= next_housekeeping {
                next_housekeeping = now.mono + Duration::from_millis(1);
                self.poll_venue_connect(now);
                work += self.housekeeping(now)?;
                market.update_counters();
            }
            idler.idle(work);
        }
        self.shutdown()
    }

    /// Engine frames into the gateway, batched per engine; any frame is a sign of life,
    /// heartbeats are nothing more. Engines are found through the fan-in summary (those
    /// that marked it since the last turn), plus engines without a slot, plus one engine
    /// swept per turn whatever its mark (its idle poll returns credit and notices a
    /// disconnect).
    fn poll_engines(&mut self, now: Now) -> usize {
        let Service {
            engines,
            driver,
            counters: c,
            links,
            fanin,
            by_slot,
            unslotted,
            sweep,
            ..
        } = self;
        let count = engines.len();
        let mut work = 0;
        let mut wasted = 0;
        let mut poll = |i: usize| poll_engine(&mut engines[i], driver, links, c, now);
        fanin.scan(|slot| {
            let i = by_slot[slot];
            if i == usize::MAX {
                // A connection still logging on (its frames are read by housekeeping).
                wasted += 1;
                return Visit::Done;
            }
            let (n, at_limit) = poll(i);
            work += n;
            if n == 0 && !at_limit {
                wasted += 1;
            }
            // At its limit (the batch, or flow control holding its requests): frames may
            // be left that will not mark the slot again, so look again next turn.
            if at_limit {
                Visit::Again
            } else {
                Visit::Done
            }
        });
        for &i in unslotted.iter() {
            work += poll(i).0;
        }
        if count > 0 {
            *sweep = (*sweep + 1) % count;
            work += poll(*sweep).0;
        }
        for _ in 0..wasted {
            fanin.count_wasted();
        }
        work
    }

    /// Rebuilds the slot index after `engines` changed.
    fn reindex_engines(&mut self) {
        reindex(&self.engines, &mut self.by_slot, &mut self.unslotted);
    }

    /// The links, the driver and the engine connections, borrowed apart for [`engine_io`].
    fn parts(&mut self) -> (&mut EngineLinks, &mut FixDriver<L>, Wire<'_>) {
        (
            &mut self.links,
            &mut self.driver,
            Wire {
                engines: &mut self.engines,
                pending: &mut self.pending,
                closing: &mut self.closing,
                by_slot: &mut self.by_slot,
                unslotted: &mut self.unslotted,
                counters: &self.counters,
                opts: &self.opts,
            },
        )
    }

    /// Venue bytes, timers, then the write-ahead flush that hands responses to engines
    /// (through their links), then what the links decided ([`engine_io::poll_venue`]).
    fn poll_venue(&mut self, now: Now) -> Result<usize, ServiceError> {
        let (links, driver, mut wire) = self.parts();
        Ok(engine_io::poll_venue(links, driver, &mut wire, now)?)
    }

    /// Starts a venue connect when due and drives one under way ([`VenueReconnect`]);
    /// never waits.
    fn poll_venue_connect(&mut self, now: Now) {
        match self.venue_reconnect.poll(&mut self.driver, now) {
            VenueConnect::Connected => self.counters.venue_connects.inc(),
            VenueConnect::Failed => self.counters.venue_connect_failures.inc(),
            VenueConnect::Idle => {}
        }
    }

    /// New connections, never waiting on a peer: the listener checks requests and moves
    /// handshakes on on its own thread, and `accept(Duration::ZERO)` only takes a proven
    /// connection off its channel (a stranger's flood costs this thread nothing,
    /// `rdma_orders_a_flood_of_strangers_costs_the_serving_thread_no_listener_work`; at
    /// most `max_pending_connections` handshakes, the
    /// `orders.max_pending_handshakes` cap lowered to it, are in progress: one more is
    /// rejected by the listener with the reason); a completed one is admitted by the links
    /// or, past `max_pending_connections` waiting, closed at once. Then refused ones whose
    /// answer was read are reported to the links (which close them, or at their linger).
    fn poll_connections(&mut self, now: Mono) -> usize {
        let mut work = 0;
        for _ in 0..REQUESTS_PER_TURN {
            let mut conn = match self.listener.accept(Duration::ZERO) {
                Ok(Some(conn)) => conn,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    break;
                }
            };
            work += 1;
            match self.links.handle_accepted(now) {
                Admission::Pending(id) => {
                    tracing::info!(peer = %conn.peer(), "engine connection, waiting for logon");
                    self.pending.push(Waiting { id, conn });
                }
                Admission::OverCap { rejected, log } => {
                    if log {
                        tracing::warn!(
                            peer = %conn.peer(),
                            max_pending_connections = self.opts.max_pending_connections,
                            rejected,
                            "orders connection closed: too many connections waiting for their logon"
                        );
                    }
                    conn.close();
                }
            }
        }
        for w in &mut self.closing {
            if !matches!(w.conn.drain(Duration::ZERO), Ok(false)) {
                self.links.handle_answer_read(w.id);
            }
        }
        work
    }

    /// The links' timers when due (heartbeats, silence, logon timeouts, lingers), then
    /// what the links decided, carried out ([`engine_io::poll_links`]).
    fn poll_links(&mut self, now: Now) -> Result<(), ServiceError> {
        let (links, driver, mut wire) = self.parts();
        Ok(engine_io::poll_links(links, driver, &mut wire, now)?)
    }

    /// The parts that make system calls: accept, logons, heartbeats, static prices,
    /// counters.
    fn housekeeping(&mut self, now: Now) -> Result<usize, ServiceError> {
        let mut work = 0;
        for &(symbol, price) in &self.opts.static_prices {
            self.driver
                .stage(|gw, _| gw.on_reference_price(symbol, price, now.wall.as_nanos()));
        }
        work += self.poll_connections(now.mono);
        work += self.poll_logons(now.mono);
        self.poll_links(now)?;
        if let Some(op) = &mut self.operator {
            let (driver, engines, control) = (&mut self.driver, self.engines.len(), &self.control);
            work += op.poll(|line| {
                let answer = crate::control::execute(line, driver, engines, now.wall.as_nanos());
                if crate::control::parse(line) == Ok(crate::control::Command::Stop) {
                    control.stop();
                }
                answer
            });
        }
        let gw = self.driver.gateway();
        let active = gw.session().state() == SessionState::Active;
        let c = &self.counters;
        c.fix_active.set(u64::from(active));
        if let Some(r) = &c.rdma {
            r.update();
        }
        c.engines_connected.set(self.engines.len() as u64);
        c.open_orders.set(gw.open_order_count() as u64);
        c.malformed_engine.set(gw.counters().malformed_engine);
        c.malformed_fix.set(gw.counters().malformed_fix);
        c.connections_refused.set(self.listener.refused());
        let l = self.links.counters();
        c.pending_rejected
            .set(self.listener.stats().pending_full + l.over_cap);
        c.logons_refused.set(self.logons_refused + l.logon_timeouts);
        c.responses.set(l.responses_sent);
        c.responses_backlogged.set(l.back_pressured);
        c.responses_dropped.set(l.dropped);
        c.engines_silent.set(l.silent);
        c.backlog_disconnects.set(l.backlog_full);
        c.requests_held.set(l.held);
        c.handshakes_failed.set(self.listener.failed_handshakes());
        c.bad_credits.set(rocebus::orders::bad_credits_total());
        c.journal_failures.set(self.driver.journal_failures());
        c.journal_degraded.set(u64::from(self.driver.is_degraded()));
        c.journal_durable_bytes
            .set(self.driver.journal_durable_len());
        for (counter, read) in &c.core {
            counter.set(read(gw));
        }
        // ORDERING: Relaxed; status for supervisors, see `ServiceControl::is_fix_active`.
        self.control.fix_active.store(active, Ordering::Relaxed);
        // ORDERING: Relaxed; as above.
        self.control
            .engines
            .store(self.engines.len() as u32, Ordering::Relaxed);
        Ok(work)
    }

    /// First frames of new connections: logon or refusal (their timeout is the links').
    fn poll_logons(&mut self, now: Mono) -> usize {
        let mut work = 0;
        let mut i = 0;
        while i < self.pending.len() {
            let w = &mut self.pending[i];
            let mut logon = None;
            let r = w.conn.subscription().poll(
                |f| {
                    logon = Some(if u16::from(msg_type::LOGON) == f.msg_type {
                        Logon::decode(f.payload).ok()
                    } else {
                        None
                    })
                },
                1,
            );
            match (r, logon) {
                (Ok(_), None) => i += 1,
                (Ok(_), Some(l)) => {
                    work += 1;
                    let w = self.pending.swap_remove(i);
                    self.logon(w, l, now);
                }
                (Err(_), _) => {
                    let w = self.pending.swap_remove(i);
                    self.links.handle_conn_gone(w.id);
                }
            }
        }
        work
    }

    fn logon(&mut self, w: Waiting, logon: Option<Logon>, now: Mono) {
        let Waiting { id: cid, mut conn } = w;
        let id = logon.map_or(0, |l| l.engine_id.get());
        let (status, last) = logon_verdict(
            &self.engine_keys,
            &conn.session_binding(),
            |e| self.links.is_linked(e),
            self.driver.gateway(),
            logon.as_ref(),
        );
        let taken = if status == LogonStatus::Accepted {
            self.driver.gateway().last_request_seq(id)
        } else {
            0
        };
        let heartbeat_ms = self.opts.heartbeat.as_millis().min(u128::from(u16::MAX)) as u16;
        let ack = LogonAck::new(id, status, last, taken).with_heartbeat_ms(heartbeat_ms);
        // The holes below `taken` go first, so the engine has them when it reads the
        // answer; a ring that cannot take them fails the logon (the engine tries again).
        let from = logon.map_or(0, |l| l.oldest_unsure.get());
        let holes = if status == LogonStatus::Accepted {
            send_holes(&mut conn, self.driver.gateway(), id, from)
        } else {
            Ok(0)
        };
        let sent = holes.and_then(|_| {
            conn.publication(ORDERS_STREAM)
                .offer_and_flush(u16::from(msg_type::LOGON_ACK), ack.as_bytes())
        });
        // What it missed is queued in its link's backlog, offered once it is on the wire,
        // by the loop like live responses ([`engine_io::logon`]).
        let after = logon.map_or(0, |l| l.last_response_seq.get());
        let replayed = if status == LogonStatus::Accepted && sent.is_ok() {
            engine_io::logon(&mut self.links, &mut self.driver, cid, id, after, now)
        } else {
            None
        };
        if let Some(replayed) = replayed {
            tracing::info!(engine = id, peer = %conn.peer(), last_response_seq = last, last_request_seq = taken, "engine logged on");
            self.counters.logons.inc();
            self.counters.responses_replayed.add(replayed as u64);
            let slot = self.fanin.slot_of(&conn);
            self.engines.push(EngineConn {
                id,
                slot,
                conn,
                dirty: false,
            });
            self.reindex_engines();
            let (links, _, mut wire) = self.parts();
            engine_io::offer_queued(links, &mut wire, id, now);
            if let Some(s) = slot {
                // Its marks before now were taken while it was logging on: look at it on
                // the next turn whatever its mark.
                self.fanin.revisit(s);
            }
        } else {
            tracing::warn!(engine = id, peer = %conn.peer(), ?status, "engine logon refused");
            self.logons_refused += 1;
            if status == LogonStatus::BadToken {
                self.counters.logons_bad_token.inc();
            }
            // Let the answer reach the engine before the disconnect, without waiting here:
            // the links close the connection once the answer was read, or at the linger.
            self.links.handle_refused(cid, now);
            self.closing.push(Waiting { id: cid, conn });
        }
    }

    /// The clean stop ([`ServiceControl::stop`]: SIGTERM, SIGINT, `control stop`): FIX
    /// Logout and a bounded wait for the venue's ([`STOP_LOGOUT_WAIT`]), journal synced and
    /// a checkpoint (the next start reads one record instead of today's), then the engines
    /// get what is still queued for them and their connections are closed: the engine
    /// protocol has no goodbye frame, a closed connection is how an engine learns the
    /// gateway went away (it reconnects and logs on again to a restarted one). No
    /// cancel-on-disconnect runs for them: the restart's deadlines guard their orders.
    fn shutdown(&mut self) -> Result<(), ServiceError> {
        let links = &mut self.links;
        let report = self.driver.stop(STOP_LOGOUT_WAIT, |engine, r| {
            links.queue_response(engine, r)
        })?;
        let (links, _, mut wire) = self.parts();
        // The clean stop's last offers: the turn's clock is gone, read one.
        engine_io::offer_all(links, &mut wire, Now::read().mono);
        for e in &mut self.engines {
            let _ = e.conn.drain(Duration::from_millis(100));
            e.conn.close();
        }
        tracing::info!(
            logout_sent = report.logout_sent,
            logout_answered = report.logout_answered,
            checkpoint = report.checkpoint,
            engines = self.engines.len(),
            "stopped cleanly"
        );
        Ok(())
    }
}

/// How long a clean stop waits for the venue's Logout answering ours (FIX 4.4 Vol. 2
/// suggests a few seconds; the engines' gateway timeout is longer).
pub const STOP_LOGOUT_WAIT: Duration = Duration::from_secs(2);

/// Hole frames an accepting logon answer is preceded by at most; past them the last frame
/// says there were more ([`RequestHoles::more`]).
const MAX_HOLE_FRAMES: usize = 16;

/// Offers `engine`'s request holes from `from` on (0: the engine asked for none) as
/// [`RequestHoles`] frames; returns how many were listed. Not flushed: the answer that
/// follows flushes them with it.
fn send_holes(
    conn: &mut Connection,
    gw: &Gateway,
    engine: EngineId,
    from: u32,
) -> Result<usize, OfferError> {
    if from == 0 {
        return Ok(0);
    }
    let (holes, more) = gw.request_holes(engine, from, MAX_HOLE_FRAMES * HOLES_PER_FRAME);
    let frames = holes.len().div_ceil(HOLES_PER_FRAME);
    let mut p = conn.publication(ORDERS_STREAM);
    for (i, chunk) in holes.chunks(HOLES_PER_FRAME).enumerate() {
        let f = RequestHoles::new(chunk, more && i + 1 == frames);
        p.offer(u16::from(msg_type::REQUEST_HOLES), f.as_bytes())?;
    }
    Ok(holes.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fix::SessionConfig;
    use crate::gateway::Outputs;

    fn gateway() -> Gateway {
        let risk: RiskConfig = toml::from_str(
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
            token = "alpha"
            [[engines]]
            id = 2
            accounts = [7]
            token = "beta"
            "#,
        )
        .unwrap();
        let session = SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        };
        Gateway::new(session, &risk).unwrap()
    }

    fn tokens() -> Vec<(EngineId, rocebus::auth::Key)> {
        vec![(1, engine_key(b"alpha")), (2, engine_key(b"beta"))]
    }

    const BINDING: [u8; 32] = [5; 32];

    fn verdict(gw: &Gateway, engine: u32, token: &[u8], last: u32) -> (LogonStatus, u32) {
        let l = Logon::new(engine, &engine_key(token), last, &BINDING);
        logon_verdict(&tokens(), &BINDING, |e| e == 2, gw, Some(&l))
    }

    #[test]
    fn each_engine_logs_on_with_its_own_token_only() {
        let gw = gateway();
        assert_eq!(verdict(&gw, 1, b"alpha", 0), (LogonStatus::Accepted, 0));
        // Engine 2's token does not open engine 1, nor does a prefix or an extension.
        assert_eq!(verdict(&gw, 1, b"beta", 0).0, LogonStatus::BadToken);
        assert_eq!(verdict(&gw, 1, b"alph", 0).0, LogonStatus::BadToken);
        assert_eq!(verdict(&gw, 1, b"alphaa", 0).0, LogonStatus::BadToken);
        assert_eq!(verdict(&gw, 9, b"alpha", 0).0, LogonStatus::UnknownEngine);
        // The token is checked before "already connected" says the engine is live.
        assert_eq!(verdict(&gw, 2, b"alpha", 0).0, LogonStatus::BadToken);
        assert_eq!(verdict(&gw, 2, b"beta", 0).0, LogonStatus::AlreadyConnected);
        assert_eq!(
            logon_verdict(&tokens(), &BINDING, |_| false, &gw, None).0,
            LogonStatus::BadLogon
        );
        // A logon made for another connection (a replay) is refused.
        let l = Logon::new(1, &engine_key(b"alpha"), 0, &[6; 32]);
        assert_eq!(
            logon_verdict(&tokens(), &BINDING, |_| false, &gw, Some(&l)).0,
            LogonStatus::BadToken
        );
    }

    #[test]
    fn logon_names_a_response_the_gateway_can_continue_from() {
        let mut gw = gateway();
        let mut out = Outputs::default();
        // Three rejects (the FIX session is down) numbered 1..=3 for engine 1.
        for cl in 1..=3u64 {
            let m = crate::proto::Cancel::new(cl);
            gw.on_engine_message(1, m.as_bytes(), 0, &mut out);
        }
        assert_eq!(verdict(&gw, 1, b"alpha", 0), (LogonStatus::Accepted, 3));
        assert_eq!(verdict(&gw, 1, b"alpha", 3), (LogonStatus::Accepted, 3));
        assert_eq!(verdict(&gw, 1, b"alpha", 4).0, LogonStatus::BadSequence);
    }

    /// The backlog cap is at most half the response history, so that what an engine
    /// disconnected for a full backlog missed (the backlog, its unread ring, the cancels
    /// that follow) is still kept for its replay. Found by the simulator: the rule was "at
    /// least the history" (so a logon's replay fit in the backlog; it no longer counts), which
    /// made such an engine's replay impossible (`simulator::tests::
    /// a_backlog_cap_as_large_as_the_history_loses_responses`).
    #[test]
    fn max_response_backlog_is_at_most_half_the_response_history() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let mut cfg = Config::parse(&text).unwrap();
        assert_eq!(cfg.service.max_response_backlog, 32768);
        cfg.validate().unwrap();
        cfg.service.max_response_backlog = cfg.risk.response_history / 2;
        cfg.validate().unwrap();
        for bad in [
            0,
            cfg.risk.response_history / 2 + 1,
            cfg.risk.response_history,
        ] {
            cfg.service.max_response_backlog = bad;
            let (key, why) = cfg.validate().unwrap_err();
            assert_eq!(key, "service.max_response_backlog", "{bad}");
            assert!(why.contains("half"), "{why}");
        }
    }
}
