//! [`Connection`]: one established orders connection (both directions)
//! and the I/O it does: connecting, posting RDMA WRITEs, reaping their
//! completions, returning credit, noticing a lost peer. Sending goes
//! through [`Publication`](super::Publication), receiving through
//! [`Subscription`](super::Subscription); both borrow the connection
//! mutably, so nothing else can use it while a claim is open.
//!
//! The ring protocol itself (frames, seals, credit arithmetic) is
//! [`crate::ring::proto`]'s; this module must not decide any of it, only
//! move the bytes it names.

use super::fanin;
use super::listener::PeerSlot;
use super::{OfferError, OrdersConfig};
use crate::admission::{Cookie, CookieReply};
use crate::auth::{self, Initiator, Purpose};
use crate::ring::frame::{
    self, frame_len, handshake_context_with, AcceptHello, ConnectHello, FanInGrant, Hello,
    FLAG_COOKIE, FLAG_FANIN, HELLO_MAGIC, PROOF_OFF,
};
use crate::ring::mem::{IncomingRing, Staging, StagingWrite};
use crate::ring::proto::{control_word, CREDIT_OFF};
use crate::ring::{FrameError, Receiver, Sender};
use crate::verbs::cm;
use crate::verbs::{
    Access, CompletionQueue, Context, ProtectionDomain, QpCaps, QpType, QueuePair, SendWr, Sge,
    VerbsError, WcStatus, WorkCompletion, WriteFlags,
};
use arrayvec::ArrayVec;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// Errors of connection set-up and of a failed connection.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrdersError {
    /// A verbs or rdma_cm call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The configuration is invalid.
    #[error("invalid orders configuration: {0}")]
    Config(String),
    /// The peer's handshake was not a rocebus hello.
    #[error("peer {peer} sent an invalid handshake: {why}")]
    BadHello {
        /// Who.
        peer: String,
        /// What was wrong.
        why: &'static str,
    },
    /// The peer failed the challenge-response: it does not hold the same
    /// token (or replayed an old handshake, or the hellos were altered).
    #[error("peer {peer} failed to prove it holds the orders token")]
    WrongToken {
        /// Who.
        peer: String,
    },
    /// The listener refused our connect request without a word: it did not
    /// accept our proof of the token (or took it for a replay: made too far
    /// from its clock). A listener says nothing more to a peer that has not
    /// proved it holds the token.
    #[error("the listener at {peer} refused us without a reason: it did not accept our proof of the orders token (check that both sides have the same `token` and the same rocebus version, and that the two hosts' clocks agree within the listener's `request_max_age_ms`)")]
    Unproved {
        /// Who.
        peer: String,
    },
    /// The peer's ring is larger than `max_peer_ring_size`.
    #[error("peer {peer} asks for a ring of 2^{log2} bytes, above max_peer_ring_size")]
    RingTooLarge {
        /// Who.
        peer: String,
        /// log2 of the size asked for.
        log2: u16,
    },
    /// The peer broke the ring protocol (garbage in our ring).
    #[error("peer broke the ring protocol: {0}")]
    Corrupt(#[from] FrameError),
    /// The peer is gone: a work request failed or it disconnected.
    #[error("connection lost: {0}")]
    PeerLost(PeerLost),
}

/// How a connection was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PeerLost {
    /// A work request completed with an error (e.g. retries exhausted).
    #[error("work request failed with {0:?}")]
    Completion(WcStatus),
    /// The peer disconnected (rdma_cm DISCONNECTED).
    #[error("peer disconnected")]
    Disconnected,
    /// We closed it after a protocol violation.
    #[error("closed after a protocol violation")]
    Closed,
    /// We closed it because the peer had been silent longer than the application's
    /// liveness timeout (no frame, not even a heartbeat): its host or process is presumed
    /// dead even though no work request has failed yet.
    #[error("closed: the peer was silent past the liveness timeout")]
    Silent,
}

/// Connection counters (plain values; snapshot with [`Connection::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnStats {
    /// Frames sent.
    pub frames_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Flushes (each: one RDMA WRITE, two when it wraps).
    pub flushes: u64,
    /// Claims refused for lack of credit.
    pub back_pressured: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
    /// Credit writes sent.
    pub credits_sent: u64,
    /// Credit words from the peer refused: behind the credit already taken
    /// or beyond what was ever sent (each value once). An honest peer
    /// never writes one; one beyond what was sent closes the connection
    /// ([`crate::ring::BadCredit`]).
    pub bad_credits: u64,
}

/// Credit words refused on every connection of this process
/// ([`ConnStats::bad_credits`] summed, closed connections included): what
/// `rocebus stat` shows, and what paces the log.
static BAD_CREDITS: AtomicU64 = AtomicU64::new(0);

/// Credit words refused on every orders connection (and RC fan-out
/// subscriber) of this process so far: forged or corrupt credits from
/// admitted peers ([`ConnStats::bad_credits`]).
pub fn bad_credits_total() -> u64 {
    // ORDERING: Relaxed: a statistic, nothing is published with it.
    BAD_CREDITS.load(Ordering::Relaxed)
}

pub(super) struct SendSide {
    pub(super) tx: Sender<Staging>,
    remote_addr: u64,
    remote_rkey: u32,
}

pub(super) struct RecvSide {
    pub(super) rx: Receiver,
    /// Where each payload is copied before the handler sees it:
    /// `max_payload` rounded up to 8, allocated once.
    pub(super) scratch: Box<[u8]>,
}

/// The queue pair and what posting to it needs: send-queue accounting and
/// whether the connection is lost. Kept apart from [`SendSide`] so that a
/// flush can lend the staging memory to the requests it posts while this
/// is borrowed mutably (two fields, two borrows: no run-time check).
///
/// Field order is drop order: the queue pair before the completion queue
/// (it also holds an `Arc` of it).
pub(super) struct Link {
    qp: QueuePair,
    cq: Arc<CompletionQueue>,
    /// The prepared WRITE of a staging run (and the fan-in mark after it).
    write: StagingWrite,
    sq: SendQueue,
    pub(super) lost: Option<PeerLost>,
    max_inline: usize,
    /// Longest single WRITE (`usize::MAX` when the configuration sets no
    /// limit: decided once, not per flush).
    pub(super) max_write: usize,
    /// Requests one prepared post puts on the send queue (the write, and
    /// the fan-in mark when granted).
    requests: u64,
}

/// The send queue's accounting, without I/O: which posts ask for a
/// completion (selective signaling) and when posting must wait for room.
///
/// Requests are counted cumulatively; each signaled request's `wr_id` is
/// the count up to and including it, so its completion frees everything
/// before it. A post is signaled when `signal_every` requests went
/// unsignaled or when more than half the queue is unaccounted for (so a
/// completion frees room long before the queue is full), and waits while
/// the queue has no room.
///
/// Both rules fold into one number, [`fast_until`](Self::fast): a post
/// that keeps the count at or below it is unsignaled and has room, and
/// looks at nothing else. Everything else (a signal due, room short, the
/// connection closed) takes the slow path, which reaps first.
#[derive(Debug, Clone)]
pub(super) struct SendQueue {
    posted: u64,
    completed: u64,
    last_signal: u64,
    signal_every: u64,
    depth: u64,
    fast_until: u64,
    closed: bool,
}

impl SendQueue {
    pub(super) fn new(signal_every: u32, depth: u64) -> Self {
        let mut q = Self {
            posted: 0,
            completed: 0,
            last_signal: 0,
            signal_every: signal_every.max(1) as u64,
            depth,
            fast_until: 0,
            closed: false,
        };
        q.refresh();
        q
    }

    fn refresh(&mut self) {
        self.fast_until = if self.closed {
            0
        } else {
            (self.last_signal + self.signal_every - 1).min(self.completed + self.depth / 2)
        };
    }

    /// Whether `n` more requests go unsignaled with no further look.
    #[inline]
    pub(super) fn fast(&self, n: u64) -> bool {
        self.posted + n <= self.fast_until
    }

    /// Whether the queue has room for `n` more requests.
    pub(super) fn has_room(&self, n: u64) -> bool {
        self.posted + n - self.completed <= self.depth
    }

    /// Whether a post of `n` more requests must ask for a completion.
    pub(super) fn must_signal(&self, n: u64) -> bool {
        let p = self.posted + n;
        p >= self.last_signal + self.signal_every || p - self.completed > self.depth / 2
    }

    /// The `wr_id` the last of `n` requests posted now carries.
    #[inline]
    pub(super) fn next_wr_id(&self, n: u64) -> u64 {
        self.posted + n
    }

    /// `n` requests were posted, the last signaled or not.
    #[inline]
    pub(super) fn on_posted(&mut self, n: u64, signaled: bool) {
        self.posted += n;
        if signaled {
            self.last_signal = self.posted;
            self.refresh();
        }
    }

    /// The signaled request `wr_id` completed (so did everything before it).
    /// An id beyond what was posted frees no more than was posted.
    pub(super) fn on_completed(&mut self, wr_id: u64) {
        self.completed = self.completed.max(wr_id.min(self.posted));
        self.refresh();
    }

    /// Every later post takes the slow path (which reports the loss).
    pub(super) fn close(&mut self) {
        self.closed = true;
        self.refresh();
    }
}

/// An established orders connection (both directions).
///
/// Every call that moves bytes takes `&mut self` (directly or through the
/// [`Publication`](super::Publication) or
/// [`Subscription`](super::Subscription) that borrows it), so the
/// compiler, not a run-time check, keeps a claim from being open across a
/// flush or a poll.
///
/// Field order is drop order: the queue pair goes first, so no request can
/// be outstanding when the staging and ring regions are deregistered.
pub struct Connection {
    pub(super) link: Link,
    /// Our slot in the listener's activity summary (accepted side): its
    /// registration goes after the QP's.
    pub(super) fanin: Option<fanin::GrantedSlot>,
    /// Where we mark the peer's summary after each flush (connecting side).
    mark: Option<fanin::Mark>,
    cm: cm::Connection,
    pub(super) send: SendSide,
    pub(super) recv: RecvSide,
    pub(super) stats: ConnStats,
    /// Empty polls in a row (see [`check_cm`](Self::check_cm)).
    idle_polls: u32,
    /// The consumer position the current run of empty polls started at.
    idle_since: u64,
    /// Whether [`poll_event`](Self::poll_event) reported the loss already.
    pub(super) loss_reported: bool,
    /// The sender's refused credits already counted and logged.
    bad_credits_seen: u64,
    peer_credit_addr: u64,
    pub(super) ring: IncomingRing,
    _pd: Arc<ProtectionDomain>,
    binding: [u8; 2 * auth::NONCE_LEN],
    /// The listener's count of connections from this peer's address
    /// (released when the connection is dropped).
    _slot: Option<PeerSlot>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.cm.peer())
            .finish()
    }
}

static CONN_IDS: AtomicU64 = AtomicU64::new(1);

/// Most RDMA WRITEs posted with one doorbell by a flush.
const WRS_PER_DOORBELL: usize = 8;

/// Empty polls in a row between two checks for a disconnect event.
pub const CM_CHECK_IDLE_POLLS: u32 = 1024;

pub(super) struct Resources {
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) qp: QueuePair,
    pub(super) ring: IncomingRing,
}

pub(super) fn resources(ctx: &Arc<Context>, cfg: &OrdersConfig) -> Result<Resources, OrdersError> {
    let pd = ProtectionDomain::new(ctx)?;
    let cq = CompletionQueue::new(ctx, cfg.send_queue_depth * 2)?;
    let qp = QueuePair::new(
        &pd,
        QpType::Rc,
        &cq,
        &cq,
        QpCaps {
            max_send_wr: cfg.send_queue_depth,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: cfg.max_inline,
        },
    )?;
    let ring = IncomingRing::new(&pd, cfg.ring_size)?;
    Ok(Resources { pd, cq, qp, ring })
}

pub(super) fn hello(cfg: &OrdersConfig, ring: &IncomingRing, flags: u16) -> Hello {
    Hello {
        magic: HELLO_MAGIC.into(),
        ring_log2: (cfg.ring_size.trailing_zeros() as u16).into(),
        flags: flags.into(),
        ring_addr: ring.mr().addr().into(),
        ring_rkey: ring.mr().rkey().into(),
        max_payload: (cfg.max_payload as u32).into(),
        conn_id: CONN_IDS.fetch_add(1, Ordering::Relaxed).into(), // ORDERING: a unique id, no data published.
    }
}

/// Checks the peer's hello: magic, and a ring our frames fit and we agree
/// to mirror (`max_peer_ring_size`).
pub(super) fn check_hello(peer: &str, h: &Hello, cfg: &OrdersConfig) -> Result<(), OrdersError> {
    if h.magic.get() != HELLO_MAGIC {
        return Err(OrdersError::BadHello {
            peer: peer.into(),
            why: "bad magic (not a rocebus RBO4 handshake)",
        });
    }
    let log2 = h.ring_log2.get();
    if log2 > 31 || 1usize << log2 > cfg.max_peer_ring_size {
        return Err(OrdersError::RingTooLarge {
            peer: peer.into(),
            log2,
        });
    }
    if log2 < 12 || frame_len(cfg.max_payload) * 4 > 1usize << log2 {
        return Err(OrdersError::BadHello {
            peer: peer.into(),
            why: "ring too small for our max_payload",
        });
    }
    Ok(())
}

fn bad_hello(peer: &str, why: &'static str) -> OrdersError {
    OrdersError::BadHello {
        peer: peer.into(),
        why,
    }
}

/// Our hello, nonce and first proof for a connect request (over `cookie`
/// when the listener asked for one). We always offer to mark a fan-in
/// slot: it costs nothing unless the listener grants one.
fn initiate(
    cfg: &OrdersConfig,
    res: &Resources,
    cookie: Option<&Cookie>,
) -> (Initiator, ConnectHello) {
    let ini = Initiator::new(auth::Key::derive(cfg.token.as_bytes(), Purpose::Orders));
    let flags = FLAG_FANIN | if cookie.is_some() { FLAG_COOKIE } else { 0 };
    let mut mine = ConnectHello {
        hello: hello(cfg, &res.ring, flags),
        nonce_tail: [0; 8],
        proof: [0; auth::TAG_LEN],
    };
    mine.set_nonce(&ini.nonce());
    mine.proof = ini.first_proof(mine.hello.as_bytes(), cookie.map_or(&[][..], |c| &c[..]));
    (ini, mine)
}

/// What a failed connect attempt means for the next one: the listener
/// asked for a cookie (connect again, once, with it), or refused.
fn after_reject(e: VerbsError, cookie: &Option<Cookie>) -> Result<Cookie, OrdersError> {
    match &e {
        VerbsError::ConnectionRejected {
            private_data,
            status: 28,
            peer,
            ..
        } => {
            if let (None, Some(c)) = (cookie, CookieReply::parse(private_data)) {
                return Ok(c);
            }
            if private_data.iter().all(|&b| b == 0) {
                return Err(OrdersError::Unproved { peer: peer.clone() });
            }
            Err(e.into())
        }
        _ => Err(e.into()),
    }
}

/// One connect attempt's local half: our queue pair and ring, our
/// initiator and the connect request made over them (over the listener's
/// cookie on a retry). Both ways of connecting make and retry it here.
struct Attempt {
    res: Resources,
    ini: Initiator,
    mine: ConnectHello,
}

impl Attempt {
    fn new(
        ctx: &Arc<Context>,
        cfg: &OrdersConfig,
        cookie: Option<&Cookie>,
    ) -> Result<Self, OrdersError> {
        let res = resources(ctx, cfg)?;
        let (ini, mine) = initiate(cfg, &res, cookie);
        Ok(Attempt { res, ini, mine })
    }

    /// After this attempt failed with `e`: the next one, if the listener
    /// is under load and asked us to prove our address (once per connect,
    /// `cookie` is what we echoed so far), made from the start with its
    /// cookie on the same device; else the error.
    fn retry(
        self,
        e: VerbsError,
        cookie: &Option<Cookie>,
        cfg: &OrdersConfig,
    ) -> Result<(Attempt, Cookie), OrdersError> {
        let c = after_reject(e, cookie)?;
        let ctx = self.res.pd.context().clone();
        drop(self);
        Ok((Attempt::new(&ctx, cfg, Some(&c))?, c))
    }

    /// The listener answered: see [`Connection::finish_connect`].
    fn finish(
        self,
        conn: cm::Connection,
        theirs: &[u8],
        cfg: &OrdersConfig,
    ) -> Result<Connection, OrdersError> {
        Connection::finish_connect(self.res, conn, theirs, &self.ini, &self.mine, cfg)
    }
}

/// A connection being made without blocking (see
/// [`Connection::start`]). Dropping it abandons the attempt.
/// Field order: the queue pair (in `attempt`) goes before the rdma_cm id.
pub struct Connecting {
    attempt: Attempt,
    cm: cm::Connecting,
    cfg: OrdersConfig,
    to: (SocketAddr, IpAddr),
    /// The listener's cookie, once it asked for one (one retry with it).
    cookie: Option<Cookie>,
}

impl std::fmt::Debug for Connecting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connecting")
            .field("cm", &self.cm)
            .finish_non_exhaustive()
    }
}

/// Where a non-blocking connect stands.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum ConnectProgress {
    /// Not connected yet: poll again later.
    Pending(Connecting),
    /// Connected and admitted; our proof is on its way.
    Done(Connection),
}

impl Connecting {
    /// Takes the steps rdma_cm has events for, without blocking. Past
    /// `connect_timeout_ms`, on a reject (nobody listens) or a failed
    /// admission it is an error, and the attempt is over.
    pub fn poll(self) -> Result<ConnectProgress, OrdersError> {
        let Connecting {
            attempt,
            cm,
            cfg,
            to,
            cookie,
        } = self;
        let mine = attempt.mine.as_bytes();
        match cm.poll(&attempt.res.qp, &cfg.rc, Access::REMOTE_WRITE, mine) {
            Ok(cm::ConnectProgress::Pending(cm)) => Ok(ConnectProgress::Pending(Connecting {
                attempt,
                cm,
                cfg,
                to,
                cookie,
            })),
            Ok(cm::ConnectProgress::Done(conn, theirs)) => {
                Ok(ConnectProgress::Done(attempt.finish(conn, &theirs, &cfg)?))
            }
            // The listener is under load and asks us to prove our address:
            // again, from the start, with its cookie.
            Err(e) => {
                let (attempt, c) = attempt.retry(e, &cookie, &cfg)?;
                let timeout = Duration::from_millis(cfg.connect_timeout_ms);
                let cm = cm::start_connect(to.0, Some(to.1), timeout)?;
                Ok(ConnectProgress::Pending(Connecting {
                    attempt,
                    cm,
                    cfg,
                    to,
                    cookie: Some(c),
                }))
            }
        }
    }
}

impl Connection {
    pub(super) fn from_parts(
        res: Resources,
        cm: cm::Connection,
        peer: &Hello,
        cfg: &OrdersConfig,
        binding: [u8; 2 * auth::NONCE_LEN],
        slot: Option<PeerSlot>,
        fanin: (Option<fanin::GrantedSlot>, Option<fanin::Mark>),
    ) -> Result<Self, OrdersError> {
        let peer_size = 1usize << peer.ring_log2.get();
        // The staging area mirrors the peer's ring, whose size we learn
        // from its hello.
        let staging = Staging::new(&res.pd, peer_size)?;
        // Our sender writes into the peer's ring with our max_payload
        // (checked against its size in check_hello); its receiver enforces
        // its own max_payload, ours ours.
        let mut tx = Sender::new(
            staging,
            cfg.max_payload.min(peer.max_payload.get() as usize),
        );
        tx.set_max_write(max_write(cfg));
        let caps = res.qp.caps();
        let write = StagingWrite::new(
            tx.staging(),
            peer.ring_addr.get(),
            peer.ring_rkey.get(),
            fanin.1.map(|m| (m.addr, m.rkey)),
        );
        let requests = write.requests();
        Ok(Self {
            send: SendSide {
                tx,
                remote_addr: peer.ring_addr.get(),
                remote_rkey: peer.ring_rkey.get(),
            },
            recv: RecvSide {
                rx: Receiver::new(cfg.ring_size, cfg.max_payload, cfg.ring_size / 4),
                scratch: vec![0u8; cfg.max_payload.next_multiple_of(8)].into_boxed_slice(),
            },
            stats: ConnStats::default(),
            idle_polls: 0,
            idle_since: 0,
            loss_reported: false,
            bad_credits_seen: 0,
            peer_credit_addr: peer.ring_addr.get() + peer_size as u64 + CREDIT_OFF as u64,
            ring: res.ring,
            cm,
            link: Link {
                write,
                sq: SendQueue::new(cfg.signal_every, caps.max_send_wr as u64),
                lost: None,
                max_inline: caps.max_inline_data.min(cfg.max_inline) as usize,
                max_write: max_write(cfg),
                requests,
                qp: res.qp,
                cq: res.cq,
            },
            fanin: fanin.0,
            mark: fanin.1,
            _pd: res.pd,
            binding,
            _slot: slot,
        })
    }

    /// Connects to an [`OrdersListener`](super::OrdersListener) at `addr`:
    /// both sides prove they hold the token (challenge-response, see
    /// [`crate::auth`]); a listener that cannot is refused here, and our own
    /// proof goes first over the new connection, before any frame.
    ///
    /// Address resolution and the handshake are each bounded by
    /// `cfg.connect_timeout_ms`, the same setting that bounds a listener's
    /// wait for a peer's handshake. Blocks until then;
    /// [`start`](Self::start) does not.
    pub fn connect(cfg: &OrdersConfig, addr: SocketAddr) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let (mut attempt, mut cookie) = (None, None);
        loop {
            let resolved = cm::resolve_with_tos(addr, None, timeout, cfg.rc.traffic_class)?;
            let a = match attempt.take() {
                Some(a) => a,
                None => Attempt::new(
                    &Context::open(resolved.device_name().as_deref())?,
                    cfg,
                    None,
                )?,
            };
            let mine = a.mine.as_bytes();
            match resolved.connect(&a.res.qp, &cfg.rc, Access::REMOTE_WRITE, mine, timeout) {
                Ok((conn, theirs)) => return a.finish(conn, &theirs, cfg),
                // Under load: once more, with the listener's cookie.
                Err(e) => {
                    let (next, c) = a.retry(e, &cookie, cfg)?;
                    (attempt, cookie) = (Some(next), Some(c));
                }
            }
        }
    }

    /// Starts connecting to the listener at `addr` from local address
    /// `local` without waiting: the device owning `local` is opened and the
    /// ring registered now (local work, no peer involved); resolution and
    /// the handshake advance in [`Connecting::poll`], the whole bounded by
    /// `cfg.connect_timeout_ms`. The same admission as
    /// [`connect`](Self::connect).
    pub fn start(
        cfg: &OrdersConfig,
        addr: SocketAddr,
        local: IpAddr,
    ) -> Result<Connecting, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let timeout = Duration::from_millis(cfg.connect_timeout_ms);
        let attempt = Attempt::new(&Context::open_for_ip(local)?, cfg, None)?;
        let cm = cm::start_connect(addr, Some(local), timeout)?;
        Ok(Connecting {
            attempt,
            cm,
            cfg: cfg.clone(),
            to: (addr, local),
            cookie: None,
        })
    }

    /// The initiator's side after the listener's answer: checks its hello
    /// and proof, builds the connection and sends our proof first.
    fn finish_connect(
        res: Resources,
        conn: cm::Connection,
        theirs: &[u8],
        ini: &Initiator,
        mine: &ConnectHello,
        cfg: &OrdersConfig,
    ) -> Result<Self, OrdersError> {
        let peer = conn.peer();
        let checked = AcceptHello::read_from_prefix(theirs)
            .map_err(|_| bad_hello(&peer, "accept reply too short"))
            .and_then(|(a, rest)| {
                check_hello(&peer, &a.hello, cfg)?;
                if a.hello.flags.get() & FLAG_FANIN == 0 {
                    return Ok((a, None));
                }
                FanInGrant::read_from_prefix(rest)
                    .map(|(g, _)| (a, Some(g)))
                    .map_err(|_| bad_hello(&peer, "fan-in grant missing from the accept reply"))
            })
            .and_then(|(a, grant)| {
                let ctx = handshake_context_with(&mine.hello, &a.hello, grant.as_ref());
                ini.on_response(&a.nonce, &a.proof, ctx.as_bytes())
                    .map(|(ti, _)| ((a, grant), ti))
                    .map_err(|_| OrdersError::WrongToken { peer: peer.clone() })
            });
        let ((theirs, grant), ti) = match checked {
            Ok(x) => x,
            Err(e) => {
                let _ = conn.disconnect();
                return Err(e);
            }
        };
        let mut binding = [0u8; 2 * auth::NONCE_LEN];
        binding[..auth::NONCE_LEN].copy_from_slice(&mine.nonce());
        binding[auth::NONCE_LEN..].copy_from_slice(&theirs.nonce);
        let mark = grant.map(|g| fanin::Mark {
            addr: g.addr.get(),
            rkey: g.rkey.get(),
        });
        let mut c = Self::from_parts(res, conn, &theirs.hello, cfg, binding, None, (None, mark))?;
        c.send_proof(&ti).map_err(OrdersError::PeerLost)?;
        Ok(c)
    }

    /// Writes our handshake proof into the peer's proof slot: one inline
    /// WRITE, posted before any frame (RC executes in order, so the peer
    /// sees it before anything else we send).
    fn send_proof(&mut self, ti: &auth::Tag) -> Result<(), PeerLost> {
        let bytes = frame::proof_bytes(ti);
        let sge = [Sge::inline(&bytes)];
        let s = &self.send;
        let addr = s.remote_addr + s.tx.state().size() as u64 + PROOF_OFF as u64;
        let mut wrs = [SendWr::write(0, &sge, addr, s.remote_rkey).inline()];
        self.link.post(&mut wrs)
    }

    /// What identifies this connection's handshake to both sides: the
    /// initiator's nonce, then the responder's (public values, fresh for
    /// every connection). A proof made over them (e.g. an engine logon) is
    /// worthless on any other connection.
    pub fn session_binding(&self) -> [u8; 2 * auth::NONCE_LEN] {
        self.binding
    }

    /// The peer's address.
    pub fn peer(&self) -> String {
        self.cm.peer()
    }

    /// The GID this connection sends from (the entry its QP's address
    /// vector names, however it was chosen) with the port's active MTU: for
    /// start-up logs and `rocebus stat`
    /// ([`RdmaCountersExport`](crate::rdma_settings::export::RdmaCountersExport)).
    pub fn local_gid(&self) -> crate::verbs::Result<crate::verbs::LocalGid> {
        self.cm.local_gid(self.link.qp.source_gid_index()?)
    }

    /// The device's attributes of this connection's queue pair: what its `[rdma]` settings
    /// (path MTU, ACK timeout, retries, traffic class, service level, inline size) became.
    pub fn qp_attributes(&self) -> crate::verbs::Result<crate::verbs::QpAttributes> {
        self.link.qp.attributes()
    }

    /// The longest message this connection posts inline: `max_inline` of its configuration,
    /// at most what the device granted.
    pub fn max_inline(&self) -> usize {
        self.link.max_inline
    }

    /// A publication on `stream_id`. It borrows the connection mutably:
    /// make one where you send (it is free), not one per stream up front.
    #[inline]
    pub fn publication(&mut self, stream_id: u16) -> super::Publication<'_> {
        super::Publication::new(self, stream_id)
    }

    /// The subscription to everything the peer sends (frames carry their
    /// stream id: dispatch on it in the handler). It borrows the
    /// connection mutably, like a [`publication`](Self::publication).
    #[inline]
    pub fn subscription(&mut self) -> super::Subscription<'_> {
        super::Subscription::new(self)
    }

    /// Counters.
    pub fn stats(&self) -> ConnStats {
        let tx = &self.send.tx;
        let rx = &self.recv.rx;
        ConnStats {
            frames_sent: tx.frames(),
            bytes_sent: tx.bytes(),
            frames_received: rx.frames(),
            bytes_received: rx.bytes(),
            bad_credits: tx.bad_credits(),
            ..self.stats
        }
    }

    /// Bytes written into the peer's ring that it has not consumed yet, as
    /// its last credit says (reads the credit word; a peer returns credit
    /// after a quarter ring, or when idle).
    pub fn unconsumed(&mut self) -> u64 {
        self.send.tx.refresh_credit(&self.ring);
        self.check_credit();
        self.send.tx.state().in_flight()
    }

    /// After the sender read the peer's credit word: counts and logs the
    /// values it refused since the last look (the log at the process's
    /// counts 1, 2, 4, 8...), and closes the connection on a credit beyond
    /// what was ever sent, a protocol violation no honest peer commits
    /// ([`crate::ring::BadCredit`]). Returns the loss when it closed (or
    /// the connection was lost before).
    #[cold]
    #[inline(never)]
    pub(super) fn check_credit(&mut self) -> Option<PeerLost> {
        let tx = &self.send.tx;
        let new = tx.bad_credits() - self.bad_credits_seen;
        if new > 0 {
            self.bad_credits_seen = tx.bad_credits();
            // ORDERING: Relaxed: a statistic, nothing is published with it.
            let total = BAD_CREDITS.fetch_add(new, Ordering::Relaxed) + new;
            if (total - new + 1..=total).any(u64::is_power_of_two) {
                let why = tx
                    .last_bad_credit()
                    .map(|b| b.to_string())
                    .unwrap_or_default();
                tracing::warn!(peer = %self.cm.peer(), count = total, %why,
                    "orders peer wrote an impossible credit: refused (logged at counts 1, 2, 4, ...)");
            }
        }
        if let Some(v) = self.send.tx.credit_violation() {
            if self.link.lost.is_none() {
                tracing::warn!(peer = %self.cm.peer(), why = %v,
                    "orders peer wrote a credit beyond what it was sent: closing the connection (protocol violation)");
                self.close();
            }
        }
        self.link.lost
    }

    /// Whether the connection is lost (and why).
    pub fn lost(&self) -> Option<PeerLost> {
        self.link.lost
    }

    /// Writes everything claimed since the last flush: one RDMA WRITE per
    /// contiguous run (two when it wraps), inline when small, one doorbell.
    /// With nothing to write it only reaps send completions.
    #[inline]
    pub fn flush(&mut self) -> Result<(), OfferError> {
        let Self {
            link, send, stats, ..
        } = self;
        // The usual case, one run that fits one write, is posted through
        // the prepared WRITE; the fan-in mark, if granted, rides the same
        // doorbell after the frames (RC places it after them: see
        // crate::ring::fanin).
        if let Some((off, len)) = send.tx.take_run(link.max_write) {
            stats.flushes += 1;
            return link.post_staged(send.tx.staging(), off, len);
        }
        self.flush_rest()
    }

    /// Posts the run `off..off + len` of staging the sender just marked
    /// flushed (one unwrapped run of at most `max_write` bytes), as
    /// [`flush`](Self::flush) does.
    #[inline(always)]
    pub(super) fn post_run(&mut self, off: usize, len: usize) -> Result<(), OfferError> {
        self.stats.flushes += 1;
        self.link.post_staged(self.send.tx.staging(), off, len)
    }

    /// A flush with nothing to write (reaps send completions) or more
    /// than one write.
    #[inline(never)]
    fn flush_rest(&mut self) -> Result<(), OfferError> {
        if self.send.tx.state().unflushed() == 0 {
            return self.link.reap().map_err(OfferError::PeerLost);
        }
        self.flush_runs()
    }

    /// A flush that wraps or exceeds `max_write`: the runs cut into writes
    /// posted from arrays, then the mark.
    #[cold]
    #[inline(never)]
    fn flush_runs(&mut self) -> Result<(), OfferError> {
        let Self {
            link,
            send,
            mark,
            stats,
            ..
        } = self;
        let (ranges, n) = send.tx.take_flush();
        let (remote, rkey) = (send.remote_addr, send.remote_rkey);
        let r = link
            .post_runs(
                send.tx.staging(),
                remote,
                rkey,
                &ranges[..n],
                link.max_write,
            )
            .and_then(|()| link.post_mark(*mark));
        stats.flushes += 1;
        r.map_err(OfferError::PeerLost)
    }

    /// Whether this connection marks a fan-in slot at its peer after each
    /// flush (the peer's listener granted one).
    pub fn marks_fanin(&self) -> bool {
        self.mark.is_some()
    }

    pub(super) fn send_credit(&mut self, consumed: u64) -> Result<(), PeerLost> {
        let bytes = control_word(consumed);
        let sge = [Sge::inline(&bytes)];
        let mut wrs =
            [SendWr::write(0, &sge, self.peer_credit_addr, self.send.remote_rkey).inline()];
        self.link.post(&mut wrs)?;
        self.stats.credits_sent += 1;
        Ok(())
    }

    /// Checks rdma_cm events for a disconnect. That is a system call, so
    /// only after [`CM_CHECK_IDLE_POLLS`] empty polls in a row, and every
    /// as many after that while nothing arrives (a count, not a clock:
    /// reading the clock costs a system call on some virtual machines). A
    /// delivery restarts the count: a peer whose frames keep arriving is
    /// connected, and a wait for an answer that comes is no time for a
    /// system call. Counted over all empty polls instead, a ping-pong made
    /// the call in one round trip of every few dozen, and an answer that
    /// landed during it waited for it (see README, rc-latency). Called on
    /// empty polls only: a delivery shows as the consumer position having
    /// moved since the last call.
    pub(super) fn check_cm(&mut self) -> Result<(), PeerLost> {
        let consumed = self.recv.rx.state().consumed();
        if consumed != self.idle_since {
            self.idle_since = consumed;
            self.idle_polls = 0;
        }
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if self.idle_polls % CM_CHECK_IDLE_POLLS != 0 {
            return Ok(());
        }
        match self.cm.poll_disconnected() {
            Ok(false) => Ok(()),
            _ => Err(self.link.fail(PeerLost::Disconnected)),
        }
    }

    /// Waits (busy-polling, bounded by `timeout`) until everything sent so
    /// far was consumed by the peer; for orderly shutdown and tests.
    pub fn drain(&mut self, timeout: Duration) -> Result<bool, OfferError> {
        self.flush()?;
        let t = Instant::now();
        loop {
            self.send.tx.refresh_credit(&self.ring);
            if let Some(l) = self.check_credit() {
                return Err(OfferError::PeerLost(l));
            }
            if self.send.tx.state().in_flight() == 0 {
                return Ok(true);
            }
            if t.elapsed() > timeout {
                return Ok(false);
            }
            if self.subscription().poll(|_| {}, 0).is_err() {
                return Err(OfferError::PeerLost(
                    self.lost().unwrap_or(PeerLost::Closed),
                ));
            }
            std::thread::yield_now();
        }
    }

    /// Disconnects: from now on every call reports [`PeerLost::Closed`].
    pub fn close(&mut self) {
        self.link.fail(PeerLost::Closed);
        let _ = self.cm.disconnect();
    }

    /// Disconnects because the peer was silent past the application's liveness timeout:
    /// from now on every call reports [`PeerLost::Silent`].
    pub fn close_silent(&mut self) {
        self.link.fail(PeerLost::Silent);
        let _ = self.cm.disconnect();
    }
}

impl Link {
    /// Records why the connection is lost (the first reason sticks) and
    /// returns it.
    pub(super) fn fail(&mut self, why: PeerLost) -> PeerLost {
        self.sq.close();
        *self.lost.get_or_insert(why)
    }

    /// Reaps send completions; an error completion marks the connection lost.
    fn reap(&mut self) -> Result<(), PeerLost> {
        let mut wc = [
            WorkCompletion::empty(),
            WorkCompletion::empty(),
            WorkCompletion::empty(),
            WorkCompletion::empty(),
        ];
        loop {
            let n = match self.cq.poll(&mut wc) {
                Ok(n) => n,
                Err(_) => return Err(self.fail(PeerLost::Completion(WcStatus::Other(u32::MAX)))),
            };
            for w in &wc[..n] {
                if !w.is_success() {
                    return Err(self.fail(PeerLost::Completion(w.status())));
                }
                self.sq.on_completed(w.wr_id());
            }
            if n < wc.len() {
                return Ok(());
            }
        }
    }

    /// Posts `wrs` (1..=3 requests), signaling the last when due, waiting
    /// for send-queue room if needed (bounded: the device completes work on
    /// its own; a dead peer ends in an error completion).
    fn post(&mut self, wrs: &mut [SendWr<'_>]) -> Result<(), PeerLost> {
        let n = wrs.len() as u64;
        let signal = if self.sq.fast(n) {
            false
        } else {
            self.admit_slow(n)?
        };
        let last = wrs.len() - 1;
        // The wr_id is the cumulative count of requests posted up to and
        // including this one, so a completion frees everything before it.
        wrs[last].set_wr_id(self.sq.next_wr_id(n));
        if signal {
            wrs[last].set_signaled();
        }
        if crate::ring::mem::post_ring_writes(&self.qp, wrs).is_err() {
            return Err(self.fail(PeerLost::Completion(WcStatus::Other(0))));
        }
        self.sq.on_posted(n, signal);
        Ok(())
    }

    /// Posts staging bytes `off..off + len` (one run, at most `max_write`)
    /// through the prepared WRITE, with the fan-in mark if granted. The
    /// usual post (unsignaled, room known: [`SendQueue::fast`]) is inlined
    /// with its flags decided here; a signal due, room short or a lost
    /// connection go through [`post_staged_slow`](Self::post_staged_slow).
    /// The error is already the publication's (a connection lost), so the
    /// caller's `?` has no conversion to make.
    #[inline(always)]
    fn post_staged(&mut self, staging: &Staging, off: usize, len: usize) -> Result<(), OfferError> {
        let n = self.requests;
        if !self.sq.fast(n) {
            return self.post_staged_slow(staging, off, len);
        }
        self.post_staged_as(staging, off, len, false)
    }

    /// [`post_staged`](Self::post_staged) off its fast path: admits the
    /// post first (reaps, waits for room, decides the signal).
    #[inline(never)]
    fn post_staged_slow(
        &mut self,
        staging: &Staging,
        off: usize,
        len: usize,
    ) -> Result<(), OfferError> {
        let signaled = self
            .admit_slow(self.requests)
            .map_err(OfferError::PeerLost)?;
        self.post_staged_as(staging, off, len, signaled)
    }

    /// Posts the run as admitted, signaled or not.
    #[inline(always)]
    fn post_staged_as(
        &mut self,
        staging: &Staging,
        off: usize,
        len: usize,
        signaled: bool,
    ) -> Result<(), OfferError> {
        let n = self.requests;
        let flags = WriteFlags {
            inline: len <= self.max_inline,
            signaled,
        };
        let wr_id = self.sq.next_wr_id(n);
        if self
            .write
            .post(&self.qp, staging, off, len, flags, wr_id)
            .is_err()
        {
            return Err(OfferError::PeerLost(self.post_failed()));
        }
        self.sq.on_posted(n, signaled);
        Ok(())
    }

    /// A post the provider refused: the connection is lost.
    #[cold]
    #[inline(never)]
    fn post_failed(&mut self) -> PeerLost {
        self.fail(PeerLost::Completion(WcStatus::Other(0)))
    }

    /// The slow path of a post of `n` requests: reports a lost connection,
    /// reaps, waits for room (bounded: the device completes work on its
    /// own; a dead peer ends in an error completion), and says whether the
    /// post must be signaled.
    #[inline(never)]
    fn admit_slow(&mut self, n: u64) -> Result<bool, PeerLost> {
        if let Some(l) = self.lost {
            return Err(l);
        }
        self.reap()?;
        while !self.sq.has_room(n) {
            std::hint::spin_loop();
            self.reap()?;
        }
        Ok(self.sq.must_signal(n))
    }

    /// The RDMA WRITE of `len` bytes described by `sge` to `remote`: inline
    /// when small.
    fn write_wr<'a>(
        &self,
        sge: &'a [Sge<'a>; 1],
        remote: u64,
        rkey: u32,
        len: usize,
    ) -> SendWr<'a> {
        let w = SendWr::write(0, sge, remote, rkey);
        if len <= self.max_inline {
            w.inline()
        } else {
            w
        }
    }

    /// Cuts the runs `(offset, len)` of staging into writes of at most `max`
    /// bytes to the same offsets of the peer's ring, posted up to
    /// WRS_PER_DOORBELL per doorbell: fixed arrays, no allocation.
    #[inline(never)]
    fn post_runs(
        &mut self,
        staging: &Staging,
        remote: u64,
        rkey: u32,
        runs: &[(usize, usize)],
        max: usize,
    ) -> Result<(), PeerLost> {
        let mut chunks = ArrayVec::<(usize, usize), WRS_PER_DOORBELL>::new();
        for &(off, len) in runs {
            let (mut o, end) = (off, off + len);
            while o < end {
                let l = (end - o).min(max);
                chunks.push((o, l));
                o += l;
                if chunks.is_full() {
                    self.post_chunks(staging, remote, rkey, &chunks)?;
                    chunks.clear();
                }
            }
        }
        if !chunks.is_empty() {
            self.post_chunks(staging, remote, rkey, &chunks)?;
        }
        Ok(())
    }

    /// Posts one RDMA WRITE per `(offset, len)` of staging, to the same
    /// offsets of the peer's ring, with one doorbell.
    fn post_chunks(
        &mut self,
        staging: &Staging,
        remote: u64,
        rkey: u32,
        chunks: &[(usize, usize)],
    ) -> Result<(), PeerLost> {
        let sges: ArrayVec<[Sge<'_>; 1], WRS_PER_DOORBELL> =
            chunks.iter().map(|c| [range_sge(staging, *c)]).collect();
        let mut wrs: ArrayVec<SendWr<'_>, WRS_PER_DOORBELL> = chunks
            .iter()
            .zip(&sges)
            .map(|(&(off, len), sge)| self.write_wr(sge, remote + off as u64, rkey, len))
            .collect();
        self.post(&mut wrs)
    }

    /// Marks our fan-in slot at the peer, if it granted one (after a flush
    /// of several writes; the usual single write carries it along).
    #[inline(never)]
    fn post_mark(&mut self, mark: Option<fanin::Mark>) -> Result<(), PeerLost> {
        let Some(m) = mark else {
            return Ok(());
        };
        let sge = [Sge::inline(&fanin::MARK_BYTE)];
        self.post(&mut [SendWr::write(0, &sge, m.addr, m.rkey).inline()])
    }
}

/// The largest single WRITE the config allows (`max_write_bytes`, 0: no limit).
fn max_write(cfg: &OrdersConfig) -> usize {
    match cfg.max_write_bytes {
        0 => usize::MAX,
        m => m,
    }
}

fn range_sge(staging: &Staging, (off, len): (usize, usize)) -> Sge<'_> {
    Sge::new(staging.mr(), off, len).unwrap_or_else(|_| Sge::inline(&[]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer_hello(log2: u16) -> Hello {
        Hello {
            magic: HELLO_MAGIC.into(),
            ring_log2: log2.into(),
            flags: 0.into(),
            ring_addr: 0x1000.into(),
            ring_rkey: 1.into(),
            max_payload: 1024.into(),
            conn_id: 1.into(),
        }
    }

    /// Posts `n` requests the way `Link` does; returns whether signaled.
    fn post(q: &mut SendQueue, n: u64) -> Option<bool> {
        let signal = if q.fast(n) {
            false
        } else {
            if q.closed || !q.has_room(n) {
                return None;
            }
            q.must_signal(n)
        };
        q.on_posted(n, signal);
        Some(signal)
    }

    #[test]
    fn send_queue_signals_once_per_signal_every_with_prompt_completions() {
        let mut q = SendQueue::new(16, 128);
        let mut signals = 0;
        for _ in 0..1600 {
            if post(&mut q, 1).unwrap() {
                signals += 1;
                // The completion arrives before the next post.
                q.on_completed(q.posted);
            }
        }
        assert_eq!(signals, 100);
        // Two requests per post (the write and the fan-in mark).
        let mut q = SendQueue::new(16, 128);
        let mut signals = 0;
        for _ in 0..800 {
            if post(&mut q, 2).unwrap() {
                signals += 1;
                q.on_completed(q.posted);
            }
        }
        assert_eq!(signals, 100);
    }

    #[test]
    fn send_queue_past_half_signals_every_post_and_waits_when_full() {
        let mut q = SendQueue::new(1000, 64);
        // No completion arrives: after half the queue, every post signals.
        let flags: Vec<bool> = (0..64).map(|_| post(&mut q, 1).unwrap()).collect();
        assert!(flags[..32].iter().all(|s| !s), "{flags:?}");
        assert!(flags[32..].iter().all(|s| *s), "{flags:?}");
        // Full: the next post must wait instead of overfilling.
        assert!(!q.fast(1));
        assert!(!q.has_room(1));
        assert_eq!(post(&mut q, 1), None);
        // A completion of the first 40 frees room: 25 unaccounted for is
        // below half, so the fast path resumes until half again.
        q.on_completed(40);
        assert!(q.has_room(1));
        assert!(q.fast(1));
        let flags: Vec<bool> = (0..10).map(|_| post(&mut q, 1).unwrap()).collect();
        assert_eq!(flags, [vec![false; 8], vec![true; 2]].concat());
    }

    #[test]
    fn send_queue_closed_always_takes_the_slow_path() {
        let mut q = SendQueue::new(16, 128);
        assert!(q.fast(1));
        q.close();
        assert!(!q.fast(1));
        q.on_completed(0);
        assert!(!q.fast(1));
        assert_eq!(post(&mut q, 1), None);
    }

    #[test]
    fn send_queue_completion_beyond_posted_frees_no_more_than_posted() {
        let mut q = SendQueue::new(4, 8);
        for _ in 0..3 {
            post(&mut q, 1).unwrap();
        }
        q.on_completed(u64::MAX);
        assert_eq!(q.completed, 3);
        // Room is exactly the depth again, not more.
        assert!(q.has_room(8));
        assert!(!q.has_room(9));
    }

    #[test]
    fn hellos_beyond_the_limits_are_refused_by_reason() {
        let c = OrdersConfig::default();
        assert!(check_hello("p", &peer_hello(20), &c).is_ok());
        assert!(check_hello("p", &peer_hello(24), &c).is_ok());
        for log2 in [25, 31, 32, u16::MAX] {
            assert!(
                matches!(
                    check_hello("p", &peer_hello(log2), &c),
                    Err(OrdersError::RingTooLarge { .. })
                ),
                "{log2}"
            );
        }
        // Too small for our 16 KiB frames.
        assert!(matches!(
            check_hello("p", &peer_hello(12), &c),
            Err(OrdersError::BadHello { .. })
        ));
        let mut old = peer_hello(20);
        old.magic = u32::from_le_bytes(*b"RBO1").into();
        assert!(matches!(
            check_hello("p", &old, &c),
            Err(OrdersError::BadHello { .. })
        ));
    }
}
