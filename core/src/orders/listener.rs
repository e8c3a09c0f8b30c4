//! [`OrdersListener`]: accepting orders connections. Admission is decided
//! here, before a peer gets anything; what an accepted connection does is
//! [`Connection`]'s.
//!
//! The initiator proves first ([`crate::auth`]): a connect request whose
//! first proof of the token does not check out is rejected with no private
//! data, before any queue pair, CQ, PD or memory region is made and before
//! it is counted against any cap; a stranger learns nothing keyed by the
//! token and nothing naming our rings or queue pairs. For a proved request
//! ([`crate::admission`]): under load (`cookie_when_pending` handshakes in
//! progress) it must echo an address-bound cookie first (else it is
//! answered a reject carrying one, and nothing is kept); then the
//! per-address caps (`max_pending_per_peer`, below `max_pending_handshakes`,
//! and `max_connections_per_peer`), then the total. Only then are verbs
//! resources made and the accept, with the responder's proof, sent.
//!
//! All of that runs on the listener's own thread (`rocebus-listen`), never
//! on the thread that calls [`OrdersListener::accept`]: reading rdma_cm
//! events, checking proofs and cookies, rejecting, making a proved peer's
//! queue pair and ring and completing its handshake are system calls that
//! cost a stranger's flood milliseconds per request under emulation. The
//! application's thread only takes proven connections off a bounded
//! channel: one non-blocking receive per `accept(Duration::ZERO)`,
//! whatever the flood (`rdma_orders_a_flood_of_strangers_costs_the_serving_thread_no_listener_work`).
//!
//! The thread answers only for an application that is there. Before the
//! first `accept` it reads no request: they wait in rdma_cm's queue, as
//! they did for the inline listener (a service binds before its loop runs;
//! the gateway's engines, let in at `bind`, had their first orders rejected
//! `SessionDown` before its venue session could be up). From then on it
//! completes handshakes whether or not the application is calling `accept`
//! at that moment, but not for an application that has stopped: once
//! `accept` has not been called for `accept_stall_ms` (the
//! serving thread frozen, a host stopped in a debugger), proved requests
//! are refused with a reason and the peer tries again. Inline, such a
//! request went unanswered until the application came back; answered by
//! the thread, the peer would take itself for connected to an application
//! that cannot serve it (an RC fan-out subscriber admitted by a frozen
//! publisher never gets its welcome, and gives the link up by silence
//! again: `rdma_md_rc_fanout_frozen_publisher_is_noticed_by_silence`).

use super::connection::{check_hello, hello, resources, Resources};
use super::{fanin, Connection, FanIn, OrdersConfig, OrdersError};
use crate::admission::{
    self, Admit, CookieJar, CookieReply, PendingRefusal, Replay, ReplayGuard, REPLAY_GUARD_CAPACITY,
};
use crate::auth::{self, Purpose, Responder};
use crate::ring::frame::{
    handshake_context_with, AcceptHello, ConnectHello, FanInGrant, HandshakeContext, Hello,
    ACCEPT_FANIN_LEN, FLAG_COOKIE, FLAG_FANIN, HELLO_MAGIC,
};
use crate::verbs::cm::{self, Listener};
use crate::verbs::{Access, Context};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// Why a listener refused or dropped a peer, counted in [`ListenerStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    Unproved,
    Replayed,
    BadHello,
    RingTooLarge,
    PendingFull,
    PeerPending,
    PeerLimit,
    BadProof,
    HandshakeFailed,
    NotAccepting,
}

impl Refusal {
    /// What the peer is told in the reject's private data.
    fn reason(self) -> &'static str {
        match self {
            Refusal::Unproved | Refusal::Replayed => "",
            Refusal::BadHello => "rocebus: bad handshake",
            Refusal::RingTooLarge => "rocebus: ring larger than the listener's max_peer_ring_size",
            Refusal::PendingFull => "rocebus: too many pending handshakes, try again",
            Refusal::PeerPending => {
                "rocebus: too many pending handshakes from this address, try again"
            }
            Refusal::PeerLimit => "rocebus: too many connections from this address",
            Refusal::BadProof => "rocebus: wrong proof",
            Refusal::HandshakeFailed => "rocebus: handshake failed",
            Refusal::NotAccepting => {
                "rocebus: the listener's application is not accepting connections, try again"
            }
        }
    }
}

/// A listener's counters of refused and failed handshakes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections handed to the application.
    pub accepted: u64,
    /// Requests without a valid first proof of the token: strangers,
    /// junk, an older version, a cookie from another address or too old.
    /// Rejected with no private data; nothing allocated or kept.
    pub unproved: u64,
    /// Proved requests answered before (a captured request played again),
    /// or made too long before or after the listener's clock: rejected with
    /// no private data, before the cookie; nothing allocated or kept
    /// ([`ReplayGuard`]).
    pub replayed: u64,
    /// Proved requests answered a cookie (the listener was under load and
    /// they carried none): nothing allocated or kept.
    pub cookies_sent: u64,
    /// Proved requests that echoed a valid cookie and were answered.
    pub cookies_echoed: u64,
    /// Proved requests whose ring is too small for our frames (rejected
    /// with a reason).
    pub bad_hello: u64,
    /// Requests for a ring above `max_peer_ring_size` (rejected before
    /// anything was allocated).
    pub ring_too_large: u64,
    /// Requests refused because `max_pending_handshakes` were in progress.
    pub pending_full: u64,
    /// Requests refused because their address already had
    /// `max_pending_per_peer` handshakes in progress.
    pub peer_pending: u64,
    /// Requests refused because their address already had
    /// `max_connections_per_peer` connections.
    pub peer_limit: u64,
    /// Answered handshakes whose final initiator proof was wrong: a
    /// replayed connect request, or altered hellos (disconnected).
    pub bad_proof: u64,
    /// Accepted requests that never completed: no ESTABLISHED, no proof in
    /// time, or the peer went away (its connect fails; it may retry).
    pub handshake_failed: u64,
    /// Proved requests refused because the application had not called
    /// `accept` for `accept_stall_ms` (rejected with the reason, nothing
    /// allocated): a peer is not handed a connection nobody serves.
    pub not_accepting: u64,
}

impl ListenerStats {
    fn count(&mut self, r: Refusal) -> u64 {
        let c = match r {
            Refusal::Unproved => &mut self.unproved,
            Refusal::Replayed => &mut self.replayed,
            Refusal::BadHello => &mut self.bad_hello,
            Refusal::RingTooLarge => &mut self.ring_too_large,
            Refusal::PendingFull => &mut self.pending_full,
            Refusal::PeerPending => &mut self.peer_pending,
            Refusal::PeerLimit => &mut self.peer_limit,
            Refusal::BadProof => &mut self.bad_proof,
            Refusal::HandshakeFailed => &mut self.handshake_failed,
            Refusal::NotAccepting => &mut self.not_accepting,
        };
        *c += 1;
        *c
    }
}

/// Counts connections per peer address, shared between a listener and the
/// connections it made (each holds a [`PeerSlot`]).
type PeerCounts = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One connection's place in its listener's per-address count; released
/// on drop.
#[derive(Debug)]
pub(super) struct PeerSlot {
    counts: PeerCounts,
    ip: IpAddr,
}

impl PeerSlot {
    /// Takes a slot for `ip` unless it already has `max`.
    fn take(counts: &PeerCounts, ip: IpAddr, max: usize) -> Option<PeerSlot> {
        let mut m = counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(PeerSlot {
            counts: counts.clone(),
            ip,
        })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// Where a pending handshake stands.
enum Stage {
    /// Accept sent, waiting for ESTABLISHED.
    Accepting(cm::Accepting),
    /// Established, waiting for the initiator's proof in the proof slot.
    Proving(cm::Connection),
}

/// What one look at a pending handshake found.
enum Step {
    Wait(Stage),
    Proven(cm::Connection),
    Fail(Refusal, String),
}

/// A handshake the listener answered and is completing without blocking.
/// Field order is drop order: the cm id, then the QP before the ring.
struct Pending {
    stage: Option<Stage>,
    res: Resources,
    theirs: Hello,
    responder: Responder,
    ctx: HandshakeContext,
    binding: [u8; 2 * auth::NONCE_LEN],
    peer: String,
    ip: IpAddr,
    slot: PeerSlot,
    fanin: Option<fanin::GrantedSlot>,
    deadline: Instant,
}

/// The longest the listener thread sleeps in rdma_cm with no handshake in
/// progress. The handle's `drop` wakes it at once (it closes the other end
/// of the thread's wake socket), so this bounds nothing a caller waits for;
/// it is long so that an idle listener costs its process nothing: at 10 ms
/// its wakes put rc-latency's p99 at 1.32-1.63 of perftest's in a 2-vCPU
/// guest where two threads busy-poll, at 1 s 0.96 (`docs/benchmarks.md`).
/// The thread notices the application's `accept` calls only when it wakes,
/// so the wait is also at most a quarter of `accept_stall_ms`
/// ([`idle_wait`]): an application that stopped is then found away within
/// 1.25 times the bound.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// The listener thread's idle wait for a bound of `accept_stall_ms` (0:
/// never away): [`IDLE_WAIT`], or a quarter of the bound if shorter, at
/// least [`PENDING_WAIT`].
fn idle_wait(accept_stall_ms: u64) -> Duration {
    match accept_stall_ms {
        0 => IDLE_WAIT,
        ms => Duration::from_millis(ms / 4).clamp(PENDING_WAIT, IDLE_WAIT),
    }
}

/// How often a handshake in progress is looked at (its ESTABLISHED event
/// and the initiator's proof, which arrives as an RDMA write with no event).
/// rdma_cm's channel is waited on with `poll`, whose timeout is whole
/// milliseconds: anything shorter is 0, and the thread would spin on a CPU
/// for as long as a handshake is pending (a stranger holding one for
/// `connect_timeout_ms` would hold a core).
const PENDING_WAIT: Duration = Duration::from_millis(1);

/// What the listener thread shares with the [`OrdersListener`] handle.
struct Shared {
    stop: AtomicBool,
    stats: Mutex<ListenerStats>,
    /// Handshakes in progress.
    pending: AtomicUsize,
    /// Calls of `accept` so far (the handle's count; only its changes mean
    /// anything): the application is there ([`AppWatch`]).
    looks: AtomicU64,
    /// An `accept` is waiting for a connection right now.
    waiting: AtomicBool,
}

/// Whether the application behind a listener is still taking connections,
/// as the listener thread sees it: a proved request that comes while the
/// application has not called `accept` for `accept_stall_ms` is refused
/// (`rdma_md_rc_fanout_frozen_publisher_is_noticed_by_silence`: a frozen
/// publisher admits no subscriber it cannot welcome). I/O-free: the thread
/// feeds it what the handle published and its own clock.
#[derive(Debug)]
struct AppWatch {
    stall_ns: u64,
    /// The handle's count of `accept` calls when it last changed.
    looks: u64,
    /// When the count last changed, or an `accept` was seen waiting; `None`
    /// before the first call.
    looked_at: Option<u64>,
}

impl AppWatch {
    /// Watching an application that has not called `accept` yet, with a
    /// bound of `stall_ms` (0: never away).
    fn new(stall_ms: u64) -> Self {
        AppWatch {
            stall_ns: stall_ms.saturating_mul(1_000_000),
            looks: 0,
            looked_at: None,
        }
    }

    /// What the handle published: its count of `accept` calls, and whether
    /// one is waiting right now.
    fn observe(&mut self, looks: u64, waiting: bool, now: u64) {
        if looks != self.looks || waiting {
            self.looks = looks;
            self.looked_at = Some(self.looked_at.map_or(now, |t| t.max(now)));
        }
    }

    /// Whether the application has called `accept` at all: until it has,
    /// requests wait in rdma_cm's queue, unread, as they did for an inline
    /// listener (binding is not serving: a service binds before its loop
    /// runs).
    fn started(&self) -> bool {
        self.looked_at.is_some()
    }

    /// How long the application has been away since its last call, if
    /// longer than the bound.
    fn away(&self, now: u64) -> Option<Duration> {
        let away = now.saturating_sub(self.looked_at?);
        (self.stall_ns > 0 && away > self.stall_ns).then(|| Duration::from_nanos(away))
    }
}

/// Accepts orders connections, admitting only peers that prove they hold
/// the token (challenge-response, [`crate::auth`]) and within the
/// configured limits.
///
/// Admission runs on a thread of the listener's own (see the module
/// documentation): handshakes in progress (up to `max_pending_handshakes`)
/// are completed as their events and proofs arrive, while new requests are
/// taken and strangers refused, whether or not the application is calling
/// [`accept`](Self::accept) at that moment (from its first call on; until
/// then requests wait in rdma_cm's queue, unread). A connection reaches the application only
/// once the initiator's proof checked out; until then no frame of it is
/// read and no credit returned. Proven connections the application has not
/// taken yet (at most `max_pending_handshakes` wait on the channel; more
/// are held by the thread) still count against the pending caps, so an
/// application that stops accepting stops the listener admitting; and one
/// that has not called `accept` for `accept_stall_ms` (its thread frozen)
/// gets no new connection: proved requests are refused with the reason
/// until it calls `accept` again.
pub struct OrdersListener {
    port: u16,
    /// Calls of `accept` so far (published in [`Shared::looks`]).
    looks: u64,
    ready: mpsc::Receiver<Result<Connection, OrdersError>>,
    shared: Arc<Shared>,
    peers: PeerCounts,
    /// The fan-in activity summary (`fanin_slots > 0`).
    activity: Option<Arc<fanin::Activity>>,
    /// The write end of the thread's wake socket: dropped (closed) to wake
    /// the thread from its idle wait.
    wake: Option<UnixStream>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for OrdersListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrdersListener")
            .field("port", &self.port)
            .field("pending", &self.pending())
            .field("stats", &self.stats())
            .finish()
    }
}

impl OrdersListener {
    /// Listens on `addr` and starts the listener's thread.
    pub fn bind(cfg: OrdersConfig, addr: SocketAddr) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let activity = match cfg.fanin_slots {
            0 => None,
            n => Some(fanin::Activity::new(n)?),
        };
        let listener = Listener::bind(addr)?;
        let port = listener.local_port();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            stats: Mutex::new(ListenerStats::default()),
            pending: AtomicUsize::new(0),
            looks: AtomicU64::new(0),
            waiting: AtomicBool::new(false),
        });
        let peers: PeerCounts = Arc::new(Mutex::new(HashMap::new()));
        let (tx, ready) = mpsc::sync_channel(cfg.max_pending_handshakes.max(1));
        let (wake, woken) = UnixStream::pair().map_err(|e| {
            OrdersError::Verbs(crate::verbs::VerbsError::Cm {
                op: "the listener thread's wake socket",
                source: e,
            })
        })?;
        let admitter = Admitter {
            key: auth::Key::derive(cfg.token.as_bytes(), Purpose::Orders),
            pending: Vec::with_capacity(cfg.max_pending_handshakes),
            pending_ips: Vec::with_capacity(cfg.max_pending_handshakes),
            held: Vec::new(),
            // A cookie lives one to two handshake times.
            cookies: CookieJar::new(cfg.connect_timeout_ms.max(1) * 1_000_000),
            replays: ReplayGuard::new(cfg.request_max_age_ms * 1_000_000, REPLAY_GUARD_CAPACITY),
            peers: peers.clone(),
            stats: ListenerStats::default(),
            app: AppWatch::new(cfg.accept_stall_ms),
            activity: activity.clone(),
            shared: shared.clone(),
            listener,
            woken,
            tx,
            cfg,
        };
        let thread = std::thread::Builder::new()
            .name("rocebus-listen".into())
            .spawn(move || admitter.run())
            .map_err(|e| {
                OrdersError::Verbs(crate::verbs::VerbsError::Cm {
                    op: "spawn the listener thread",
                    source: e,
                })
            })?;
        Ok(Self {
            port,
            looks: 0,
            ready,
            shared,
            peers,
            activity,
            wake: Some(wake),
            thread: Some(thread),
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// A scanner of this listener's fan-in summary (disabled, scanning
    /// nothing, when `fanin_slots` is 0). See [`ConnectionSet`](super::ConnectionSet) for the
    /// whole receive loop.
    pub fn fan_in(&self) -> FanIn {
        FanIn::new(self.activity.clone())
    }

    /// Counters of refused and failed handshakes (as the listener thread
    /// last published them: a refusal is counted before the peer is
    /// answered).
    pub fn stats(&self) -> ListenerStats {
        *self.shared.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        // ORDERING: Relaxed: a count read for its own value; pairs with
        // the Relaxed store in `Admitter::publish`, nothing is read through it.
        self.shared.pending.load(Ordering::Relaxed)
    }

    /// Connections (pending or established, not yet dropped) from `ip`.
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        let m = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ip).copied().unwrap_or(0)
    }

    /// Connection requests refused (bad hello, limits) or dropped for a
    /// wrong proof.
    pub fn refused(&self) -> u64 {
        let s = self.stats();
        s.unproved
            + s.replayed
            + s.bad_hello
            + s.ring_too_large
            + s.pending_full
            + s.peer_pending
            + s.peer_limit
            + s.bad_proof
            + s.not_accepting
    }

    /// Accepted requests whose handshake then failed: the peer's
    /// confirmation or proof was lost or late, or it gave up and went away.
    pub fn failed_handshakes(&self) -> u64 {
        self.stats().handshake_failed
    }

    /// Waits up to `timeout` for a connection whose handshake completed
    /// (the initiator's proof checked out); `Ok(None)` on timeout. With
    /// `Duration::ZERO` it never waits and makes no system call: one look
    /// at the channel the listener thread fills. Refusals and failures are
    /// the thread's, counted ([`stats`](Self::stats)) and logged at a
    /// bounded rate. Local failures the thread met (no device, no
    /// resources for a proved peer) are returned, one per call.
    ///
    /// Each call tells the listener the application is there: one that
    /// has not called for `accept_stall_ms` gets no new connection (proved
    /// requests are refused, "not accepting connections, try again").
    pub fn accept(&mut self, timeout: Duration) -> Result<Option<Connection>, OrdersError> {
        self.looked();
        let got = if timeout.is_zero() {
            match self.ready.try_recv() {
                Ok(r) => Some(r),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return Err(thread_gone()),
            }
        } else {
            // ORDERING: Relaxed: a flag read for its own value by the
            // listener thread's `AppWatch` (Relaxed load in `watch_app`);
            // nothing is handed over through it.
            self.shared.waiting.store(true, Ordering::Relaxed);
            let r = self.ready.recv_timeout(timeout);
            // ORDERING: Relaxed: as above.
            self.shared.waiting.store(false, Ordering::Relaxed);
            // The wait's end is a look too (the thread may have missed the flag).
            self.looked();
            match r {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Err(thread_gone()),
            }
        };
        got.transpose()
    }

    /// Publishes one more call of `accept` (a plain store: this handle is
    /// the only writer).
    fn looked(&mut self) {
        self.looks = self.looks.wrapping_add(1);
        // ORDERING: Relaxed: a count the listener thread reads only for
        // whether it changed (Relaxed load in `watch_app`); nothing is
        // handed over through it.
        self.shared.looks.store(self.looks, Ordering::Relaxed);
    }
}

impl Drop for OrdersListener {
    fn drop(&mut self) {
        // ORDERING: Relaxed: a stop flag, nothing handed over through it;
        // the join below is the synchronisation.
        self.shared.stop.store(true, Ordering::Relaxed);
        // Closing our end makes the thread's end readable: its idle wait
        // returns at once and it sees the flag.
        drop(self.wake.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The error of an `accept` whose listener thread is gone (it panicked).
fn thread_gone() -> OrdersError {
    OrdersError::Verbs(crate::verbs::VerbsError::Cm {
        op: "the orders listener thread",
        source: std::io::Error::other("the listener thread stopped"),
    })
}

/// The listener thread's state: admission, handshakes in progress, and the
/// proven connections not yet handed over.
struct Admitter {
    listener: Listener,
    cfg: OrdersConfig,
    key: auth::Key,
    cookies: CookieJar,
    replays: ReplayGuard,
    pending: Vec<Pending>,
    /// The addresses of `pending` and `held`, rebuilt for each request's admission.
    pending_ips: Vec<IpAddr>,
    /// Proven connections the channel had no room for (the application is
    /// not accepting): handed over first, counted against the pending caps.
    held: Vec<(IpAddr, Connection)>,
    peers: PeerCounts,
    stats: ListenerStats,
    /// Whether the application is still calling `accept`.
    app: AppWatch,
    /// The fan-in activity summary (`fanin_slots > 0`).
    activity: Option<Arc<fanin::Activity>>,
    shared: Arc<Shared>,
    /// The thread's end of the wake socket (readable once the handle is
    /// dropped); only polled.
    woken: UnixStream,
    tx: SyncSender<Result<Connection, OrdersError>>,
}

impl Admitter {
    /// Serves requests and handshakes until the handle is dropped.
    fn run(mut self) {
        // ORDERING: Relaxed: see `OrdersListener::drop`.
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.turn().is_err() {
                return;
            }
        }
    }

    /// One look at everything: hand over what is proven, move handshakes
    /// on, then wait (briefly with handshakes in progress) for one request
    /// and decide it. `Err` once the handle is gone.
    fn turn(&mut self) -> Result<(), ()> {
        self.watch_app(crate::clock::now_ns());
        if !self.app.started() {
            // Nothing is pending or held before the first `accept`; requests
            // wait in rdma_cm's queue (its backlog) until then.
            std::thread::sleep(PENDING_WAIT);
            return Ok(());
        }
        self.hand_over()?;
        loop {
            match self.progress() {
                Ok(Some((ip, c))) => self.held.push((ip, c)),
                Ok(None) => break,
                Err(e) => self.send(e)?,
            }
        }
        self.hand_over()?;
        let wait = if self.pending.is_empty() && self.held.is_empty() {
            idle_wait(self.cfg.accept_stall_ms)
        } else {
            PENDING_WAIT
        };
        let r = match self
            .listener
            .next_request_or_wake(wait, Some(self.woken.as_fd()))
        {
            Ok(Some(req)) => self.on_request(req),
            Ok(None) => Ok(()),
            Err(e) => Err(e.into()),
        };
        self.publish();
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.send(e),
        }
    }

    /// Hands held connections to the application while the channel has
    /// room. The counters go first: whoever takes a connection sees it
    /// counted `accepted` and no longer pending.
    fn hand_over(&mut self) -> Result<(), ()> {
        self.publish();
        while !self.held.is_empty() {
            let (ip, c) = self.held.remove(0);
            match self.tx.try_send(Ok(c)) {
                Ok(()) => {}
                Err(TrySendError::Full(Ok(c))) => {
                    self.held.insert(0, (ip, c));
                    break;
                }
                Err(_) => return Err(()),
            }
        }
        Ok(())
    }

    /// Hands a local failure to the application. Never waits (the handle's
    /// `drop` joins this thread): with the channel full of connections the
    /// application has not taken, the error is logged and dropped. `Err`
    /// once the handle is gone.
    fn send(&mut self, e: OrdersError) -> Result<(), ()> {
        match self.tx.try_send(Err(e)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(Err(e))) => {
                tracing::warn!(error = %e, "orders listener: a local failure not handed over (the application is not accepting)");
                Ok(())
            }
            Err(_) => Err(()),
        }
    }

    /// Looks at what the handle published about `accept` calls.
    fn watch_app(&mut self, now: u64) {
        // ORDERING: Relaxed: pairs with the Relaxed stores in
        // `OrdersListener::accept`/`looked`; values read for their own sake.
        let looks = self.shared.looks.load(Ordering::Relaxed);
        // ORDERING: Relaxed: as above.
        let waiting = self.shared.waiting.load(Ordering::Relaxed);
        self.app.observe(looks, waiting, now);
    }

    /// Publishes the counters and the pending count to the handle.
    fn publish(&self) {
        *self.shared.stats.lock().unwrap_or_else(|p| p.into_inner()) = self.stats;
        // ORDERING: Relaxed: pairs with the Relaxed load in `OrdersListener::pending`.
        self.shared
            .pending
            .store(self.pending.len(), Ordering::Relaxed);
    }

    /// Counts a refusal and logs it, at most at counts 1, 2, 4, 8, ... per
    /// reason (a stranger's flood costs a counter, not the log).
    fn refuse(&mut self, why: Refusal, peer: &str, detail: &dyn std::fmt::Display) {
        let n = self.stats.count(why);
        self.publish();
        if n.is_power_of_two() {
            tracing::warn!(%peer, count = n, reason = why.reason(), %detail, "orders connection refused (logged at counts 1, 2, 4, ...)");
        }
    }

    /// Refuses `req`, telling the peer why (a peer that proved the secret).
    fn reject(&mut self, req: cm::ConnectRequest, why: Refusal, detail: &dyn std::fmt::Display) {
        self.refuse(why, &req.peer(), detail);
        let _ = req.reject(why.reason().as_bytes());
    }

    /// Refuses `req` with no private data at all: what anyone who has not
    /// proved knowledge of the secret gets (no reason, no nonce, no proof,
    /// nothing that names this listener's queue pairs or rings).
    fn silence(&mut self, req: cm::ConnectRequest, detail: &dyn std::fmt::Display) {
        self.silence_for(req, Refusal::Unproved, detail);
    }

    fn silence_for(
        &mut self,
        req: cm::ConnectRequest,
        why: Refusal,
        detail: &dyn std::fmt::Display,
    ) {
        self.refuse(why, &req.peer(), detail);
        let _ = req.reject(&[]);
    }

    /// Checks a new request and answers it, or refuses it. The order is
    /// the admission's ([`crate::admission`]): the initiator's first proof
    /// (wrong: silence, nothing kept, nothing allocated), its hello, under
    /// load the cookie (missing: a reject carrying one, nothing kept), the
    /// address's pending cap, its connection cap, the total. Only then are
    /// a queue pair and a ring made and the accept, with the responder's
    /// proof, sent: at most `max_pending_handshakes` of them, each for a
    /// peer that proved it holds the token.
    fn on_request(&mut self, req: cm::ConnectRequest) -> Result<(), OrdersError> {
        let peer = req.peer();
        let ip = req.peer_ip().unwrap_or(IpAddr::from([0u8; 4]));
        let Ok((theirs, _)) = ConnectHello::read_from_prefix(req.private_data()) else {
            self.silence(req, &"connect data too short");
            return Ok(());
        };
        if theirs.hello.magic.get() != HELLO_MAGIC {
            self.silence(req, &"not a rocebus RBO4 hello");
            return Ok(());
        }
        let now = crate::clock::now_ns();
        let Some(cookie_ok) = first_proof(&self.key, &self.cookies, &theirs, &ip, now) else {
            self.silence(req, &"no valid proof of the token");
            return Ok(());
        };
        // A first proof answered before, or too old or too new to tell from
        // one: silence, before the cookie (a replay costs nothing at all).
        let (ni, made) = (theirs.nonce(), auth::nonce_time(&theirs.nonce()));
        let wall = crate::clock::Wall::now().as_nanos();
        if let Err(r) = self.replays.check(&ni, made, wall) {
            let detail = match r {
                Replay::Seen => "a connect request answered before (a replay)",
                Replay::TooOld => "a connect request made too long ago (request_max_age_ms)",
                Replay::FromTheFuture => {
                    "a connect request made in the future (clocks differ by more than request_max_age_ms)"
                }
            };
            self.silence_for(req, Refusal::Replayed, &detail);
            return Ok(());
        }
        // Proved: from here on the peer may be told why it is refused.
        if let Err(e) = check_hello(&peer, &theirs.hello, &self.cfg) {
            let why = match e {
                OrdersError::RingTooLarge { .. } => Refusal::RingTooLarge,
                _ => Refusal::BadHello,
            };
            self.reject(req, why, &e);
            return Ok(());
        }
        // An application that stopped calling `accept` (a frozen thread)
        // gets no new connection: its peer would be told it is connected,
        // and then hear nothing from it. Refused with the reason before
        // anything is made or kept; the peer tries again later.
        self.watch_app(now);
        if let Some(away) = self.app.away(now) {
            let detail = format_args!(
                "the application has not called accept for {away:?} (accept_stall_ms)"
            );
            self.reject(req, Refusal::NotAccepting, &detail);
            return Ok(());
        }
        let caps = self.cfg.pending_caps();
        self.pending_ips.clear();
        self.pending_ips.extend(self.pending.iter().map(|p| p.ip));
        self.pending_ips.extend(self.held.iter().map(|(ip, _)| *ip));
        let verdict = admission::admit(
            &caps,
            self.cfg.cookie_when_pending,
            cookie_ok,
            &ip,
            &self.pending_ips,
        );
        let room = match verdict {
            Admit::SendCookie => {
                self.stats.cookies_sent += 1;
                self.publish();
                let reply = CookieReply::new(self.cookies.mint(&ip, now));
                let _ = req.reject(reply.as_bytes());
                return Ok(());
            }
            Admit::Refuse(PendingRefusal::AddressFull) => {
                let max = caps.per_address;
                let detail = format_args!("{max} in progress from {ip}");
                self.reject(req, Refusal::PeerPending, &detail);
                return Ok(());
            }
            Admit::Refuse(PendingRefusal::Full) => Err(()),
            Admit::Slot => Ok(()),
        };
        let Some(slot) = PeerSlot::take(&self.peers, ip, self.cfg.max_connections_per_peer) else {
            let max = self.cfg.max_connections_per_peer;
            self.reject(req, Refusal::PeerLimit, &format_args!("{max} from {ip}"));
            return Ok(());
        };
        if room.is_err() {
            drop(slot);
            let max = caps.total;
            let detail = format_args!("{max} in progress");
            self.reject(req, Refusal::PendingFull, &detail);
            return Ok(());
        }
        if cookie_ok {
            self.stats.cookies_echoed += 1;
        }
        let ctx = Context::open(req.device_name().as_deref())?;
        let res = resources(&ctx, &self.cfg)?;
        // A fan-in slot for an initiator that will mark it, while slots last
        // (without one the connection is polled every turn).
        let granted = match &self.activity {
            Some(a) if theirs.hello.flags.get() & FLAG_FANIN != 0 => a.grant(&res.pd)?,
            _ => None,
        };
        let grant = granted.as_ref().map(|g| {
            let (addr, rkey) = g.remote();
            FanInGrant {
                addr: addr.into(),
                rkey: rkey.into(),
                slot: g.slot().into(),
            }
        });
        let flags = if grant.is_some() { FLAG_FANIN } else { 0 };
        let mine = hello(&self.cfg, &res.ring, flags);
        let hctx = handshake_context_with(&theirs.hello, &mine, grant.as_ref());
        let (responder, tr) = Responder::new(self.key.clone(), ni, hctx.as_bytes());
        let reply = AcceptHello {
            hello: mine,
            nonce: responder.nonce(),
            proof: tr,
        };
        let mut reply_bytes = [0u8; ACCEPT_FANIN_LEN];
        reply_bytes[..std::mem::size_of::<AcceptHello>()].copy_from_slice(reply.as_bytes());
        let reply_len = match &grant {
            Some(g) => {
                reply_bytes[std::mem::size_of::<AcceptHello>()..].copy_from_slice(g.as_bytes());
                ACCEPT_FANIN_LEN
            }
            None => std::mem::size_of::<AcceptHello>(),
        };
        let mut binding = [0u8; 2 * auth::NONCE_LEN];
        binding[..auth::NONCE_LEN].copy_from_slice(&ni);
        binding[auth::NONCE_LEN..].copy_from_slice(&reply.nonce);
        match req.start_accept(
            &res.qp,
            &self.cfg.rc,
            Access::REMOTE_WRITE,
            &reply_bytes[..reply_len],
        ) {
            Ok(a) => {
                // Answered: this first proof is spent.
                self.replays.record(&ni, made, wall);
                self.pending.push(Pending {
                    stage: Some(Stage::Accepting(a)),
                    res,
                    theirs: theirs.hello,
                    responder,
                    ctx: hctx,
                    binding,
                    peer,
                    ip,
                    slot,
                    fanin: granted,
                    deadline: Instant::now() + Duration::from_millis(self.cfg.connect_timeout_ms),
                })
            }
            // This one request failed (its id may be reset by the peer's
            // reject); local resources were made above.
            Err(e) => self.refuse(Refusal::HandshakeFailed, &peer, &e),
        }
        Ok(())
    }

    /// Moves every pending handshake on; returns the first that completed,
    /// with its peer's address.
    fn progress(&mut self) -> Result<Option<(IpAddr, Connection)>, OrdersError> {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let stage = p.stage.take().expect("a pending handshake has a stage");
            let outcome = match stage {
                Stage::Accepting(a) => match a.poll() {
                    // The proof is the initiator's first write: it has our
                    // accept even if the CM has not heard its ready-to-use
                    // message (lost: the CM would wait seconds for it).
                    Ok(cm::AcceptProgress::Pending(a)) if p.res.ring.load_proof().is_some() => {
                        match a.established_by_traffic() {
                            Ok(c) => Step::Wait(Stage::Proving(c)),
                            Err(e) => Step::Fail(Refusal::HandshakeFailed, e.to_string()),
                        }
                    }
                    Ok(cm::AcceptProgress::Pending(a)) => Step::Wait(Stage::Accepting(a)),
                    Ok(cm::AcceptProgress::Done(c)) => Step::Wait(Stage::Proving(c)),
                    Err(e) => Step::Fail(Refusal::HandshakeFailed, e.to_string()),
                },
                Stage::Proving(c) => match p.res.ring.load_proof() {
                    Some(ti) => match p.responder.on_proof(&ti, p.ctx.as_bytes()) {
                        Ok(_) => Step::Proven(c),
                        Err(e) => {
                            let _ = c.disconnect();
                            Step::Fail(Refusal::BadProof, e.to_string())
                        }
                    },
                    None => match c.poll_disconnected() {
                        Ok(false) => Step::Wait(Stage::Proving(c)),
                        _ => Step::Fail(
                            Refusal::HandshakeFailed,
                            "peer went away before its proof".into(),
                        ),
                    },
                },
            };
            match outcome {
                Step::Wait(stage) if Instant::now() < p.deadline => {
                    p.stage = Some(stage);
                    i += 1;
                }
                Step::Wait(stage) => {
                    if let Stage::Proving(c) = &stage {
                        let _ = c.disconnect();
                    }
                    drop(stage);
                    let p = self.pending.swap_remove(i);
                    self.refuse(Refusal::HandshakeFailed, &p.peer, &"no proof in time");
                }
                Step::Proven(cm) => {
                    let p = self.pending.swap_remove(i);
                    self.stats.accepted += 1;
                    let ip = p.ip;
                    return Connection::from_parts(
                        p.res,
                        cm,
                        &p.theirs,
                        &self.cfg,
                        p.binding,
                        Some(p.slot),
                        (p.fanin, None),
                    )
                    .map(|c| Some((ip, c)));
                }
                Step::Fail(why, detail) => {
                    let p = self.pending.swap_remove(i);
                    self.refuse(why, &p.peer, &detail);
                }
            }
        }
        Ok(None)
    }
}

/// Whether a connect request's first proof checks out, as an
/// [`OrdersListener`] decides it before anything else: `None` if not (a
/// stranger, an old version, a cookie from another address or too old),
/// `Some(true)` if it covers a valid cookie of `ip`, `Some(false)` if it
/// carries none. One keyed hash or, with [`FLAG_COOKIE`], up to four;
/// nothing kept. Public for benchmarks (`rocebus-bench admission-cost`).
pub fn first_proof(
    key: &auth::Key,
    cookies: &CookieJar,
    theirs: &ConnectHello,
    ip: &IpAddr,
    now: u64,
) -> Option<bool> {
    let ni = theirs.nonce();
    let hello = theirs.hello.as_bytes();
    let claims = theirs.hello.flags.get() & FLAG_COOKIE != 0;
    cookies.proved(ip, now, claims, |c| {
        auth::check_first_proof(key, &ni, hello, c, &theirs.proof)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::FromZeros;

    /// A connect request as an initiator with `token` makes it, over
    /// `cookie` if any.
    fn request(token: &[u8], cookie: Option<&[u8]>) -> ConnectHello {
        let ini = auth::Initiator::new(auth::Key::derive(token, Purpose::Orders));
        let mut c = ConnectHello::new_zeroed();
        c.hello.magic = HELLO_MAGIC.into();
        c.hello.ring_log2 = 16.into();
        c.hello.flags = if cookie.is_some() { FLAG_COOKIE } else { 0 }.into();
        c.set_nonce(&ini.nonce());
        c.proof = ini.first_proof(c.hello.as_bytes(), cookie.unwrap_or(&[]));
        c
    }

    #[test]
    fn only_a_first_proof_of_the_token_gets_past_the_first_check() {
        const SEC: u64 = 1_000_000_000;
        let key = auth::Key::derive(b"the token", Purpose::Orders);
        let jar = CookieJar::with_key([3; 32], 5 * SEC);
        let ip = IpAddr::from([198, 18, 0, 1]);
        let other = IpAddr::from([198, 18, 0, 2]);
        let now = 100 * SEC;
        assert_eq!(
            first_proof(&key, &jar, &request(b"the token", None), &ip, now),
            Some(false)
        );
        // A stranger: another token, junk, an all-zero request.
        assert_eq!(
            first_proof(&key, &jar, &request(b"not it", None), &ip, now),
            None
        );
        assert_eq!(
            first_proof(&key, &jar, &ConnectHello::new_zeroed(), &ip, now),
            None
        );
        // Altered on the way (a bigger ring): the proof no longer fits.
        let mut r = request(b"the token", None);
        r.hello.ring_log2 = 30.into();
        assert_eq!(first_proof(&key, &jar, &r, &ip, now), None);
        // With the cookie of its own address, minted now or one period ago.
        let c = jar.mint(&ip, now);
        let with = request(b"the token", Some(&c));
        assert_eq!(first_proof(&key, &jar, &with, &ip, now), Some(true));
        assert_eq!(
            first_proof(&key, &jar, &with, &ip, now + 5 * SEC),
            Some(true)
        );
        // Too old, another address's, or claimed without one.
        assert_eq!(first_proof(&key, &jar, &with, &ip, now + 10 * SEC), None);
        assert_eq!(first_proof(&key, &jar, &with, &other, now), None);
        let mut claimed = request(b"the token", None);
        claimed.hello.flags = FLAG_COOKIE.into();
        assert_eq!(first_proof(&key, &jar, &claimed, &ip, now), None);
        // A stranger echoing a real cookie still has no proof.
        assert_eq!(
            first_proof(&key, &jar, &request(b"not it", Some(&c)), &ip, now),
            None
        );
    }

    /// The idle wait is a second, or a quarter of `accept_stall_ms` if
    /// that is shorter (the thread sees `accept` calls only when it wakes).
    #[test]
    fn the_idle_wait_is_a_second_or_a_quarter_of_the_stall_bound() {
        assert_eq!(idle_wait(0), IDLE_WAIT);
        assert_eq!(idle_wait(2000), Duration::from_millis(500));
        assert_eq!(idle_wait(60_000), IDLE_WAIT);
        assert_eq!(idle_wait(300), Duration::from_millis(75));
        assert_eq!(idle_wait(1), PENDING_WAIT);
    }

    #[test]
    fn an_application_that_stops_calling_accept_is_away_after_the_bound() {
        const MS: u64 = 1_000_000;
        let t0 = 5_000 * MS;
        let mut w = AppWatch::new(100);
        // Not started before the first call (the count has not moved).
        w.observe(0, false, t0);
        assert!(!w.started());
        // The first call starts it.
        w.observe(1, false, t0);
        assert!(w.started());
        assert_eq!(w.away(t0 + 100 * MS), None);
        assert_eq!(w.away(t0 + 101 * MS), Some(Duration::from_millis(101)));
        // A call of accept (the count moved) brings it back.
        w.observe(2, false, t0 + 150 * MS);
        assert_eq!(w.away(t0 + 200 * MS), None);
        // The same count seen again is no look: away 100 ms after the last.
        w.observe(2, false, t0 + 240 * MS);
        assert!(w.away(t0 + 251 * MS).is_some());
        // A blocking accept is looking for as long as it waits.
        w.observe(2, true, t0 + 900 * MS);
        assert_eq!(w.away(t0 + 1000 * MS), None);
        // A waiting first call starts it too.
        let mut first = AppWatch::new(100);
        first.observe(0, true, t0);
        assert!(first.started());
        // Off with 0 (once started).
        let mut off = AppWatch::new(0);
        off.observe(1, false, t0);
        assert_eq!(off.away(t0 + 3_600_000 * MS), None);
    }

    #[test]
    fn refusals_are_counted_per_reason() {
        let mut s = ListenerStats::default();
        assert_eq!(s.count(Refusal::RingTooLarge), 1);
        assert_eq!(s.count(Refusal::RingTooLarge), 2);
        s.count(Refusal::BadProof);
        assert_eq!((s.ring_too_large, s.bad_proof, s.bad_hello), (2, 1, 0));
        assert!(Refusal::PendingFull.reason().contains("pending handshakes"));
    }

    #[test]
    fn per_address_slots_are_bounded_and_released() {
        let counts: PeerCounts = Arc::new(Mutex::new(HashMap::new()));
        let ip = IpAddr::from([198, 18, 0, 2]);
        let a = PeerSlot::take(&counts, ip, 2).unwrap();
        let b = PeerSlot::take(&counts, ip, 2).unwrap();
        assert!(PeerSlot::take(&counts, ip, 2).is_none());
        assert!(PeerSlot::take(&counts, IpAddr::from([198, 18, 0, 3]), 2).is_some());
        drop(a);
        let _c = PeerSlot::take(&counts, ip, 2).unwrap();
        drop(b);
        drop(_c);
        assert!(counts.lock().unwrap().is_empty(), "no entry left behind");
    }
}
