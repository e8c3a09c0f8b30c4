//! The orders path: one RC connection per peer pair carrying framed
//! messages on several streams in both directions, through the rings of
//! [`crate::ring`].
//!
//! ```no_run
//! use rocebus::orders::{OrdersConfig, OrdersListener, Connection};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = OrdersConfig { token: "s3cret".into(), ..OrdersConfig::default() };
//! // Gateway side:
//! let listener = OrdersListener::bind("198.18.0.1:7470".parse()?, cfg.clone())?;
//! // Engine side (another process or host):
//! let conn = Connection::connect("198.18.0.1:7470".parse()?, &cfg, Duration::from_secs(5))?;
//! let orders = conn.publication(1);
//! let mut claim = orders.try_claim(7, 64)?; // message type 7, 64 bytes, in registered memory
//! claim.copy_from_slice(&[0u8; 64]);
//! claim.commit();
//! conn.flush()?;
//! // Gateway side:
//! let gw = listener.accept(Duration::from_secs(5))?.expect("a connection");
//! gw.subscription().poll(|f| println!("stream {} type {} {} bytes", f.stream_id, f.msg_type, f.payload.len()), 16)?;
//! # Ok(()) }
//! ```
//!
//! A [`Connection`] is used from one thread (it is `Send`, not `Sync`):
//! the busy-polling thread that owns it publishes, polls and flushes. Its
//! hot-path calls never allocate, lock, log or make system calls; they
//! return small `Copy` errors.

mod fanin;

pub use fanin::{ConnId, ConnectionSet, FanIn, SetError, SetStats};

use crate::auth::{self, Initiator, Purpose, Responder};
use crate::ring::frame::{
    self, frame_len, handshake_context_with, AcceptHello, ConnectHello, FanInGrant,
    HandshakeContext, Hello, ACCEPT_FANIN_LEN, FLAG_FANIN, HELLO_MAGIC, PROOF_LEN, PROOF_OFF,
};
use crate::ring::mem::{IncomingRing, Staging};
use crate::ring::proto::{control_word, CREDIT_OFF};
use crate::ring::{ClaimRefused, FrameError, Receiver, Sender};
use crate::verbs::cm::{self, Listener};
use crate::verbs::{
    Access, CompletionQueue, Context, ProtectionDomain, QpCaps, QpType, QueuePair, RcOptions,
    SendWr, Sge, VerbsError, WcStatus, WorkCompletion,
};
use arrayvec::ArrayVec;
use std::cell::{Cell, RefCell, RefMut};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

/// Configuration of the orders path.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct OrdersConfig {
    /// Bytes of each incoming ring (power of two).
    pub ring_size: usize,
    /// Largest message payload (at most a quarter of the ring minus a header).
    pub max_payload: usize,
    /// Shared secret both sides must hold. It never travels: each side
    /// proves it knows it by a challenge-response in the handshake
    /// ([`crate::auth`]).
    pub token: String,
    /// Send queue depth.
    pub send_queue_depth: u32,
    /// Frames up to this size (bytes, header included) are posted inline.
    pub max_inline: u32,
    /// Request a completion every this many work requests.
    pub signal_every: u32,
    /// Largest single RDMA WRITE (0: no limit; a flush of many frames is
    /// one WRITE per contiguous run). Soft-RoCE (rxe in Linux 6.1) has
    /// failed retransmitted multi-packet WRITEs with "remote invalid
    /// request" under packet loss in our two-host tests; setting this to
    /// the path MTU keeps every WRITE one packet there.
    pub max_write_bytes: usize,
    /// RC knobs.
    pub rc: RcOptions,
    /// Connection set-up timeout, milliseconds (also how long a listener
    /// waits for a pending handshake to complete).
    pub connect_timeout_ms: u64,
    /// Largest ring (bytes, power of two) a peer may ask us to mirror: our
    /// staging area for it is that large. A larger request is refused
    /// before anything is allocated; a listener's larger reply is refused
    /// by the connector. At least `ring_size`.
    pub max_peer_ring_size: usize,
    /// Listener: handshakes in progress at once (each holds a queue pair and
    /// one of our rings until the peer's proof arrives or it times out);
    /// one more request is refused.
    pub max_pending_handshakes: usize,
    /// Listener: connections (pending and established) from one IP address;
    /// one more request from it is refused.
    pub max_connections_per_peer: usize,
    /// Listener: slots of its fan-in activity summary (0: off). Each
    /// accepted connection gets one while they last and marks it after
    /// every flush (one more one-byte WRITE), so a [`ConnectionSet`] or
    /// [`FanIn`] polls only connections with new frames. At most 65536.
    pub fanin_slots: usize,
}

impl Default for OrdersConfig {
    fn default() -> Self {
        Self {
            ring_size: 1 << 20,
            max_payload: 16 * 1024,
            token: String::new(),
            send_queue_depth: 512,
            max_inline: 220,
            signal_every: 64,
            max_write_bytes: 0,
            rc: RcOptions::default(),
            connect_timeout_ms: 5000,
            max_peer_ring_size: 16 << 20,
            max_pending_handshakes: 8,
            max_connections_per_peer: 16,
            fanin_slots: 0,
        }
    }
}

impl OrdersConfig {
    /// Checks the values; the error names the key.
    pub fn validate(&self) -> Result<(), String> {
        if !self.ring_size.is_power_of_two() || self.ring_size < 4096 {
            return Err(format!(
                "ring_size: {} is not a power of two >= 4096",
                self.ring_size
            ));
        }
        if self.ring_size > 1 << 31 {
            return Err(format!("ring_size: {} exceeds 2 GiB", self.ring_size));
        }
        if frame_len(self.max_payload) * 4 > self.ring_size {
            return Err(format!(
                "max_payload: {} is more than a quarter of ring_size {} (minus the 16-byte header)",
                self.max_payload, self.ring_size
            ));
        }
        if self.send_queue_depth < 16 {
            return Err("send_queue_depth: must be at least 16".into());
        }
        if self.signal_every == 0 || self.signal_every * 2 > self.send_queue_depth {
            return Err("signal_every: must be between 1 and half of send_queue_depth".into());
        }
        if self.rc.timeout > 31 || self.rc.retry_count > 7 || self.rc.rnr_retry > 7 {
            return Err("rc: timeout <= 31, retry_count <= 7, rnr_retry <= 7".into());
        }
        if (self.max_inline as usize) < PROOF_LEN {
            return Err(format!(
                "max_inline: must be at least {PROOF_LEN} (the handshake proof is sent inline)"
            ));
        }
        if !self.max_peer_ring_size.is_power_of_two()
            || self.max_peer_ring_size < self.ring_size
            || self.max_peer_ring_size > 1 << 31
        {
            return Err(format!(
                "max_peer_ring_size: {} is not a power of two between ring_size ({}) and 2 GiB",
                self.max_peer_ring_size, self.ring_size
            ));
        }
        if self.max_pending_handshakes == 0 || self.max_pending_handshakes > 1024 {
            return Err("max_pending_handshakes: must be between 1 and 1024".into());
        }
        if self.fanin_slots > 1 << 16 {
            return Err(format!("fanin_slots: {} is above 65536", self.fanin_slots));
        }
        if self.max_connections_per_peer == 0 {
            return Err("max_connections_per_peer: must be at least 1".into());
        }
        Ok(())
    }
}

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

/// Why `try_claim`/`offer` could not take a message. `Copy`, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The receiver has not consumed enough: try again later (never
    /// blocks, never drops).
    #[error("back-pressured: the peer's ring is full")]
    BackPressured,
    /// Larger than the connection's maximum payload.
    #[error("message larger than max_payload")]
    TooLarge,
    /// Another claim of this connection is still open.
    #[error("another claim is still open")]
    ClaimOpen,
    /// The message type is reserved.
    #[error("message type reserved for rocebus")]
    ReservedType,
    /// The connection is lost.
    #[error("connection lost: {0}")]
    Lost(PeerLost),
}

/// One received frame, valid for the duration of the handler call.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Stream id.
    pub stream_id: u16,
    /// Message type.
    pub msg_type: u16,
    /// Connection sequence.
    pub seq: u64,
    /// The payload: a copy the connection took out of its registered ring
    /// (memory the peer writes by RDMA; it is never lent out directly, so
    /// whatever the peer writes there cannot change these bytes).
    pub payload: &'a [u8],
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
}

struct SendSide {
    tx: Sender<Staging>,
    remote_addr: u64,
    remote_rkey: u32,
}

struct RecvSide {
    rx: Receiver,
    /// Where each payload is copied before the handler sees it:
    /// `max_payload` rounded up to 8, allocated once.
    scratch: Box<[u8]>,
}

struct Sq {
    posted: u64,
    completed: u64,
    since_signal: u32,
}

/// An established orders connection (both directions).
///
/// Field order is drop order: the queue pair goes first, so no request can
/// be outstanding when the staging and ring regions are deregistered.
pub struct Connection {
    qp: QueuePair,
    /// Our slot in the listener's activity summary (accepted side): its
    /// registration goes after the QP's.
    fanin: Option<fanin::GrantedSlot>,
    /// Where we mark the peer's summary after each flush (connecting side).
    mark: Option<fanin::Mark>,
    cm: cm::Connection,
    send: RefCell<SendSide>,
    recv: RefCell<RecvSide>,
    sq: RefCell<Sq>,
    lost: Cell<Option<PeerLost>>,
    stats: RefCell<ConnStats>,
    idle_polls: Cell<u32>,
    cfg_signal_every: u32,
    cfg_max_inline: u32,
    cfg_max_write: usize,
    sq_depth: u64,
    peer_credit_addr: u64,
    ring: IncomingRing,
    cq: Arc<CompletionQueue>,
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

/// Empty polls between two checks for a disconnect event.
pub const CM_CHECK_IDLE_POLLS: u32 = 1024;

struct Resources {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    qp: QueuePair,
    ring: IncomingRing,
}

fn resources(ctx: &Arc<Context>, cfg: &OrdersConfig) -> Result<Resources, OrdersError> {
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

fn hello(cfg: &OrdersConfig, ring: &IncomingRing, flags: u16) -> Hello {
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
fn check_hello(peer: &str, h: &Hello, cfg: &OrdersConfig) -> Result<(), OrdersError> {
    if h.magic.get() != HELLO_MAGIC {
        return Err(OrdersError::BadHello {
            peer: peer.into(),
            why: "bad magic (not a rocebus RBO2 handshake)",
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

impl Connection {
    fn from_parts(
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
        let tx = Sender::new(
            staging,
            cfg.max_payload.min(peer.max_payload.get() as usize),
        );
        Ok(Self {
            send: RefCell::new(SendSide {
                tx,
                remote_addr: peer.ring_addr.get(),
                remote_rkey: peer.ring_rkey.get(),
            }),
            recv: RefCell::new(RecvSide {
                rx: Receiver::new(cfg.ring_size, cfg.max_payload, cfg.ring_size / 4),
                scratch: vec![0u8; cfg.max_payload.next_multiple_of(8)].into_boxed_slice(),
            }),
            sq: RefCell::new(Sq {
                posted: 0,
                completed: 0,
                since_signal: 0,
            }),
            lost: Cell::new(None),
            stats: RefCell::new(ConnStats::default()),
            idle_polls: Cell::new(0),
            cfg_signal_every: cfg.signal_every,
            cfg_max_inline: res.qp.caps().max_inline_data.min(cfg.max_inline),
            cfg_max_write: cfg.max_write_bytes,
            sq_depth: res.qp.caps().max_send_wr as u64,
            peer_credit_addr: peer.ring_addr.get() + peer_size as u64 + CREDIT_OFF as u64,
            ring: res.ring,
            cm,
            qp: res.qp,
            fanin: fanin.0,
            mark: fanin.1,
            cq: res.cq,
            _pd: res.pd,
            binding,
            _slot: slot,
        })
    }

    /// Connects to an [`OrdersListener`] at `addr`: both sides prove they
    /// hold the token (challenge-response, see [`crate::auth`]); a listener
    /// that cannot is refused here, and our own proof goes first over the
    /// new connection, before any frame.
    pub fn connect(
        addr: SocketAddr,
        cfg: &OrdersConfig,
        timeout: Duration,
    ) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let resolved = cm::resolve(addr, None, timeout)?;
        let ctx = Context::open(resolved.device_name().as_deref())?;
        let res = resources(&ctx, cfg)?;
        let ini = Initiator::new(auth::Key::derive(cfg.token.as_bytes(), Purpose::Orders));
        // We always offer to mark a fan-in slot: it costs nothing unless
        // the listener grants one.
        let mine = ConnectHello {
            hello: hello(cfg, &res.ring, FLAG_FANIN),
            nonce: ini.nonce(),
        };
        let (conn, theirs) = resolved.connect(
            &res.qp,
            &cfg.rc,
            Access::REMOTE_WRITE,
            mine.as_bytes(),
            timeout,
        )?;
        let peer = conn.peer();
        let checked = AcceptHello::read_from_prefix(&theirs)
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
        binding[..auth::NONCE_LEN].copy_from_slice(&mine.nonce);
        binding[auth::NONCE_LEN..].copy_from_slice(&theirs.nonce);
        let mark = grant.map(|g| fanin::Mark {
            addr: g.addr.get(),
            rkey: g.rkey.get(),
        });
        let c = Self::from_parts(res, conn, &theirs.hello, cfg, binding, None, (None, mark))?;
        c.send_proof(&ti).map_err(OrdersError::PeerLost)?;
        Ok(c)
    }

    /// Writes our handshake proof into the peer's proof slot: one inline
    /// WRITE, posted before any frame (RC executes in order, so the peer
    /// sees it before anything else we send).
    fn send_proof(&self, ti: &auth::Tag) -> Result<(), PeerLost> {
        let bytes = frame::proof_bytes(ti);
        let sge = [Sge::inline(&bytes)];
        let (addr, rkey) = {
            let s = self.send.borrow();
            (
                s.remote_addr + s.tx.state().size() as u64 + PROOF_OFF as u64,
                s.remote_rkey,
            )
        };
        let mut wrs = [SendWr::write(0, &sge, addr, rkey).inline()];
        self.post(&mut wrs)
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

    /// A publication on `stream_id`.
    pub fn publication(&self, stream_id: u16) -> Publication<'_> {
        Publication {
            conn: self,
            stream_id,
        }
    }

    /// The subscription to everything the peer sends (frames carry their
    /// stream id: dispatch on it in the handler).
    pub fn subscription(&self) -> Subscription<'_> {
        Subscription { conn: self }
    }

    /// Counters.
    pub fn stats(&self) -> ConnStats {
        *self.stats.borrow()
    }

    /// Whether the connection is lost (and why).
    pub fn lost(&self) -> Option<PeerLost> {
        self.lost.get()
    }

    fn fail(&self, why: PeerLost) -> PeerLost {
        if self.lost.get().is_none() {
            self.lost.set(Some(why));
        }
        self.lost.get().unwrap_or(why)
    }

    /// Reaps send completions; an error completion marks the connection lost.
    fn reap(&self) -> Result<(), PeerLost> {
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
                let mut sq = self.sq.borrow_mut();
                sq.completed = sq.completed.max(w.wr_id());
            }
            if n < wc.len() {
                return Ok(());
            }
        }
    }

    /// Posts `wrs` (1..=3 requests), signaling the last when due, waiting
    /// for send-queue room if needed (bounded: the device completes work on
    /// its own; a dead peer ends in an error completion).
    fn post(&self, wrs: &mut [SendWr<'_>]) -> Result<(), PeerLost> {
        if let Some(l) = self.lost.get() {
            return Err(l);
        }
        let n = wrs.len() as u64;
        loop {
            let (posted, completed) = {
                let sq = self.sq.borrow();
                (sq.posted, sq.completed)
            };
            if posted + n - completed <= self.sq_depth {
                break;
            }
            self.reap()?;
            std::hint::spin_loop();
        }
        let mut sq = self.sq.borrow_mut();
        sq.since_signal += n as u32;
        let signal = sq.since_signal >= self.cfg_signal_every
            || sq.posted + n - sq.completed > self.sq_depth / 2;
        let last_id = sq.posted + n;
        let last = wrs.len() - 1;
        // The wr_id is the cumulative count of requests posted up to and
        // including this one, so a completion frees everything before it.
        wrs[last].set_wr_id(last_id);
        if signal {
            sq.since_signal = 0;
            wrs[last].set_signaled();
        }
        let r = crate::ring::mem::post_ring_writes(&self.qp, wrs);
        if r.is_err() {
            drop(sq);
            return Err(self.fail(PeerLost::Completion(WcStatus::Other(0))));
        }
        sq.posted += n;
        Ok(())
    }

    /// Writes everything claimed since the last flush: one RDMA WRITE per
    /// contiguous run (two when it wraps), inline when small, one doorbell.
    pub fn flush(&self) -> Result<(), OfferError> {
        let mut send = self.send.borrow_mut();
        if send.tx.state().unflushed() == 0 {
            drop(send);
            return self.reap().map_err(OfferError::Lost);
        }
        let (ranges, n) = send.tx.take_flush();
        let (remote, rkey) = (send.remote_addr, send.remote_rkey);
        let max = if self.cfg_max_write == 0 {
            usize::MAX
        } else {
            self.cfg_max_write
        };
        // The usual case, one run that fits one write, is posted as a single
        // request built on the stack, without the chunk arrays (whose frame
        // alone cost ~100 instructions per post under callgrind).
        let r = if n == 1 && ranges[0].1 <= max {
            let (off, len) = ranges[0];
            let sge = [range_sge(send.tx.staging(), (off, len))];
            let wr = self.write_wr(&sge, remote + off as u64, rkey, len);
            match self.mark {
                None => self.post(&mut [wr]),
                // The fan-in mark rides the same doorbell, after the frames
                // (RC places it after them: see crate::ring::fanin).
                Some(m) => {
                    let msge = [Sge::inline(&fanin::MARK_BYTE)];
                    self.post(&mut [wr, SendWr::write(0, &msge, m.addr, m.rkey).inline()])
                }
            }
        } else {
            self.post_runs(send.tx.staging(), remote, rkey, &ranges[..n], max)
                .and_then(|()| self.post_mark())
        };
        drop(send);
        self.stats.borrow_mut().flushes += 1;
        r.map_err(OfferError::Lost)
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
        if len <= self.cfg_max_inline as usize {
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
        &self,
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
        &self,
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
    fn post_mark(&self) -> Result<(), PeerLost> {
        let Some(m) = self.mark else {
            return Ok(());
        };
        let sge = [Sge::inline(&fanin::MARK_BYTE)];
        self.post(&mut [SendWr::write(0, &sge, m.addr, m.rkey).inline()])
    }

    /// Whether this connection marks a fan-in slot at its peer after each
    /// flush (the peer's listener granted one).
    pub fn marks_fanin(&self) -> bool {
        self.mark.is_some()
    }

    fn send_credit(&self, consumed: u64) -> Result<(), PeerLost> {
        let bytes = control_word(consumed);
        let sge = [Sge::inline(&bytes)];
        let mut wrs = [SendWr::write(
            0,
            &sge,
            self.peer_credit_addr,
            self.send.borrow().remote_rkey,
        )
        .inline()];
        self.post(&mut wrs)?;
        self.stats.borrow_mut().credits_sent += 1;
        Ok(())
    }

    /// Checks rdma_cm events for a disconnect. That is a system call, so
    /// only every [`CM_CHECK_IDLE_POLLS`] empty polls (a count, not a clock:
    /// reading the clock costs a system call on some virtual machines).
    fn check_cm(&self) -> Result<(), PeerLost> {
        let n = self.idle_polls.get().wrapping_add(1);
        self.idle_polls.set(n);
        if n % CM_CHECK_IDLE_POLLS != 0 {
            return Ok(());
        }
        match self.cm.poll_disconnected() {
            Ok(false) => Ok(()),
            _ => Err(self.fail(PeerLost::Disconnected)),
        }
    }

    /// Waits (busy-polling, bounded by `timeout`) until everything sent so
    /// far was consumed by the peer; for orderly shutdown and tests.
    pub fn drain(&self, timeout: Duration) -> Result<bool, OfferError> {
        self.flush()?;
        let t = Instant::now();
        loop {
            let done = {
                let mut s = self.send.borrow_mut();
                s.tx.refresh_credit(&self.ring);
                s.tx.state().in_flight() == 0
            };
            if done {
                return Ok(true);
            }
            if t.elapsed() > timeout {
                return Ok(false);
            }
            self.subscription()
                .poll(|_| {}, 0)
                .map_err(|_| OfferError::Lost(self.lost().unwrap_or(PeerLost::Closed)))?;
            std::thread::yield_now();
        }
    }

    /// Disconnects.
    pub fn close(&self) {
        self.fail(PeerLost::Closed);
        let _ = self.cm.disconnect();
    }

    /// Disconnects because the peer was silent past the application's liveness timeout:
    /// from now on every call reports [`PeerLost::Silent`].
    pub fn close_silent(&self) {
        self.fail(PeerLost::Silent);
        let _ = self.cm.disconnect();
    }
}

fn range_sge(staging: &Staging, (off, len): (usize, usize)) -> Sge<'_> {
    Sge::new(staging.mr(), off, len).unwrap_or_else(|_| Sge::inline(&[]))
}

/// Sends on one stream of a connection.
#[derive(Debug, Clone, Copy)]
pub struct Publication<'c> {
    conn: &'c Connection,
    stream_id: u16,
}

/// A claimed frame in registered memory: fill it, then [`commit`](Claim::commit).
/// Dropping it without committing abandons it (nothing is sent).
pub struct Claim<'c> {
    send: RefMut<'c, SendSide>,
    conn: &'c Connection,
    len: usize,
}

impl std::fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim").field("len", &self.len).finish()
    }
}

impl<'c> Publication<'c> {
    /// The stream id.
    pub fn stream_id(&self) -> u16 {
        self.stream_id
    }

    /// Claims `len` bytes for a message of type `msg_type` (below
    /// 0xFF00), in the staging memory the device will send from.
    #[inline]
    pub fn try_claim(&self, msg_type: u16, len: usize) -> Result<Claim<'c>, OfferError> {
        if let Some(l) = self.conn.lost.get() {
            return Err(OfferError::Lost(l));
        }
        let mut send = self
            .conn
            .send
            .try_borrow_mut()
            .map_err(|_| OfferError::ClaimOpen)?;
        match send
            .tx
            .claim(self.stream_id, msg_type, len, &self.conn.ring)
        {
            Ok(()) => {}
            Err(ClaimRefused::TooLarge) => return Err(OfferError::TooLarge),
            Err(ClaimRefused::ReservedType) => return Err(OfferError::ReservedType),
            Err(ClaimRefused::BackPressured) => {
                self.conn.stats.borrow_mut().back_pressured += 1;
                return Err(OfferError::BackPressured);
            }
        }
        Ok(Claim {
            send,
            conn: self.conn,
            len,
        })
    }

    /// Copies `payload` into a frame and commits it (not yet flushed).
    #[inline]
    pub fn offer(&self, msg_type: u16, payload: &[u8]) -> Result<(), OfferError> {
        let mut c = self.try_claim(msg_type, payload.len())?;
        c.copy_from_slice(payload);
        c.commit();
        Ok(())
    }

    /// [`offer`](Self::offer) then [`Connection::flush`].
    #[inline]
    pub fn offer_and_flush(&self, msg_type: u16, payload: &[u8]) -> Result<(), OfferError> {
        self.offer(msg_type, payload)?;
        self.conn.flush()
    }
}

impl Claim<'_> {
    /// Commits the frame: it goes out with the next flush.
    #[inline]
    pub fn commit(mut self) {
        self.send.tx.commit();
        let mut st = self.conn.stats.borrow_mut();
        st.frames_sent += 1;
        st.bytes_sent += self.len as u64;
    }
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.send.tx.payload()
    }
}

impl std::ops::DerefMut for Claim<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.send.tx.payload_mut()
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        // After commit() this finds no open claim: a no-op.
        self.send.tx.abandon();
    }
}

/// Receives everything the peer sends on a connection.
#[derive(Debug, Clone, Copy)]
pub struct Subscription<'c> {
    conn: &'c Connection,
}

impl Subscription<'_> {
    /// Delivers up to `limit` frames to `handler`, in order; returns how
    /// many. Also returns credit to the peer, reaps send completions and,
    /// when idle, notices a disconnect. A protocol violation by the peer
    /// closes the connection and is returned as an error.
    #[inline]
    pub fn poll<F: FnMut(Frame<'_>)>(
        &self,
        mut handler: F,
        limit: usize,
    ) -> Result<usize, OrdersError> {
        let conn = self.conn;
        if let Some(l) = conn.lost.get() {
            return Err(OrdersError::PeerLost(l));
        }
        let mut recv = conn.recv.borrow_mut();
        let mut delivered = 0;
        let (mut frames, mut bytes) = (0u64, 0u64);
        let RecvSide { rx, scratch } = &mut *recv;
        while delivered < limit {
            let info = match rx.poll(&conn.ring, scratch) {
                Ok(Some(i)) => i,
                Ok(None) => break, // the next frame has not arrived
                Err(e) => {
                    drop(recv);
                    return Err(self.violation(e));
                }
            };
            handler(Frame {
                stream_id: info.stream_id,
                msg_type: info.msg_type,
                seq: info.seq,
                payload: &scratch[..info.len as usize],
            });
            delivered += 1;
            frames += 1;
            bytes += info.len as u64;
        }
        if frames > 0 {
            let mut st = conn.stats.borrow_mut();
            st.frames_received += frames;
            st.bytes_received += bytes;
        }
        let idle = delivered == 0;
        let due = recv.rx.take_credit(delivered);
        drop(recv);
        if let Some(c) = due {
            conn.send_credit(c).map_err(OrdersError::PeerLost)?;
        }
        if idle {
            // Our own pending frames and completions, and the peer's health.
            conn.flush()
                .map_err(|_| OrdersError::PeerLost(conn.lost().unwrap_or(PeerLost::Closed)))?;
            conn.check_cm().map_err(OrdersError::PeerLost)?;
        }
        Ok(delivered)
    }

    fn violation(&self, e: FrameError) -> OrdersError {
        self.conn.close();
        OrdersError::Corrupt(e)
    }
}

/// Why a listener refused or dropped a peer, counted in [`ListenerStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    BadHello,
    RingTooLarge,
    PendingFull,
    PeerLimit,
    BadProof,
    HandshakeFailed,
}

impl Refusal {
    /// What the peer is told in the reject's private data.
    fn reason(self) -> &'static str {
        match self {
            Refusal::BadHello => "rocebus: bad handshake",
            Refusal::RingTooLarge => "rocebus: ring larger than the listener's max_peer_ring_size",
            Refusal::PendingFull => "rocebus: too many pending handshakes, try again",
            Refusal::PeerLimit => "rocebus: too many connections from this address",
            Refusal::BadProof => "rocebus: wrong proof",
            Refusal::HandshakeFailed => "rocebus: handshake failed",
        }
    }
}

/// A listener's counters of refused and failed handshakes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListenerStats {
    /// Connections handed to the application.
    pub accepted: u64,
    /// Requests that were not a rocebus RBO2 hello, or whose ring is too
    /// small for our frames (rejected with a reason).
    pub bad_hello: u64,
    /// Requests for a ring above `max_peer_ring_size` (rejected before
    /// anything was allocated).
    pub ring_too_large: u64,
    /// Requests refused because `max_pending_handshakes` were in progress.
    pub pending_full: u64,
    /// Requests refused because their address already had
    /// `max_connections_per_peer` connections.
    pub peer_limit: u64,
    /// Handshakes whose initiator proof was wrong: no shared secret, a
    /// replayed handshake, or altered hellos (disconnected).
    pub bad_proof: u64,
    /// Accepted requests that never completed: no ESTABLISHED, no proof in
    /// time, or the peer went away (its connect fails; it may retry).
    pub handshake_failed: u64,
}

impl ListenerStats {
    fn count(&mut self, r: Refusal) -> u64 {
        let c = match r {
            Refusal::BadHello => &mut self.bad_hello,
            Refusal::RingTooLarge => &mut self.ring_too_large,
            Refusal::PendingFull => &mut self.pending_full,
            Refusal::PeerLimit => &mut self.peer_limit,
            Refusal::BadProof => &mut self.bad_proof,
            Refusal::HandshakeFailed => &mut self.handshake_failed,
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
struct PeerSlot {
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
    slot: PeerSlot,
    fanin: Option<fanin::GrantedSlot>,
    deadline: Instant,
}

/// Requests handled per `accept` call once its timeout has passed, so a
/// flood of requests cannot hold the caller's thread.
const REQUESTS_PER_CALL: usize = 16;

/// Accepts orders connections, admitting only peers that prove they hold
/// the token (challenge-response, [`crate::auth`]) and within the
/// configured limits.
///
/// Nothing here blocks on one peer: handshakes in progress (up to
/// `max_pending_handshakes`) are completed as their events and proofs
/// arrive, while new requests are taken. A connection reaches the
/// application only once the initiator's proof checked out; until then no
/// frame of it is read and no credit returned.
pub struct OrdersListener {
    listener: Listener,
    cfg: OrdersConfig,
    key: auth::Key,
    pending: RefCell<Vec<Pending>>,
    peers: PeerCounts,
    stats: Cell<ListenerStats>,
    /// The fan-in activity summary (`fanin_slots > 0`).
    activity: Option<Arc<fanin::Activity>>,
}

impl std::fmt::Debug for OrdersListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OrdersListener")
            .field("port", &self.local_port())
            .field("pending", &self.pending.borrow().len())
            .field("stats", &self.stats.get())
            .finish()
    }
}

impl OrdersListener {
    /// Listens on `addr`.
    pub fn bind(addr: SocketAddr, cfg: OrdersConfig) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let activity = match cfg.fanin_slots {
            0 => None,
            n => Some(fanin::Activity::new(n)?),
        };
        Ok(Self {
            activity,
            listener: Listener::bind(addr)?,
            key: auth::Key::derive(cfg.token.as_bytes(), Purpose::Orders),
            pending: RefCell::new(Vec::with_capacity(cfg.max_pending_handshakes)),
            peers: Arc::new(Mutex::new(HashMap::new())),
            stats: Cell::new(ListenerStats::default()),
            cfg,
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.listener.local_port()
    }

    /// A scanner of this listener's fan-in summary (disabled, scanning
    /// nothing, when `fanin_slots` is 0). See [`ConnectionSet`] for the
    /// whole receive loop.
    pub fn fan_in(&self) -> FanIn {
        FanIn::new(self.activity.clone())
    }

    /// Counters of refused and failed handshakes.
    pub fn stats(&self) -> ListenerStats {
        self.stats.get()
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.pending.borrow().len()
    }

    /// Connections (pending or established, not yet dropped) from `ip`.
    pub fn connections_from(&self, ip: IpAddr) -> usize {
        let m = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&ip).copied().unwrap_or(0)
    }

    /// Connection requests refused (bad hello, limits) or dropped for a
    /// wrong proof.
    pub fn refused(&self) -> u64 {
        let s = self.stats.get();
        s.bad_hello + s.ring_too_large + s.pending_full + s.peer_limit + s.bad_proof
    }

    /// Accepted requests whose handshake then failed: the peer's
    /// confirmation or proof was lost or late, or it gave up and went away.
    pub fn failed_handshakes(&self) -> u64 {
        self.stats.get().handshake_failed
    }

    /// Counts a refusal and logs it, at most at counts 1, 2, 4, 8, ... per
    /// reason (a stranger's flood costs a counter, not the log).
    fn refuse(&self, why: Refusal, peer: &str, detail: &dyn std::fmt::Display) {
        let mut s = self.stats.get();
        let n = s.count(why);
        self.stats.set(s);
        if n.is_power_of_two() {
            tracing::warn!(%peer, count = n, reason = why.reason(), %detail, "orders connection refused (logged at counts 1, 2, 4, ...)");
        }
    }

    /// Waits up to `timeout` for a peer to complete its handshake;
    /// `Ok(None)` on timeout. Requests are checked as they come (hello,
    /// ring size, pending and per-address limits; a refused one gets the
    /// reason in the reject), answered, and completed without blocking;
    /// refusals and failures are counted ([`stats`](Self::stats)), logged
    /// at a bounded rate, and waiting goes on. Local failures (no device,
    /// no resources) are returned.
    pub fn accept(&self, timeout: Duration) -> Result<Option<Connection>, OrdersError> {
        let deadline = Instant::now() + timeout;
        let mut late = 0;
        loop {
            if let Some(c) = self.progress()? {
                return Ok(Some(c));
            }
            let now = Instant::now();
            let left = deadline.saturating_duration_since(now);
            // With handshakes in progress, wake up often to look at them.
            let wait = if self.pending.borrow().is_empty() {
                left
            } else {
                left.min(Duration::from_micros(200))
            };
            match self.listener.next_request(wait)? {
                Some(req) => self.on_request(req)?,
                None if now >= deadline => return Ok(None),
                None => {}
            }
            if now >= deadline {
                late += 1;
                if late >= REQUESTS_PER_CALL {
                    return self.progress();
                }
            }
        }
    }

    /// Refuses `req`, telling the peer why.
    fn reject(&self, req: cm::ConnectRequest, why: Refusal, detail: &dyn std::fmt::Display) {
        self.refuse(why, &req.peer(), detail);
        let _ = req.reject(why.reason().as_bytes());
    }

    /// Checks a new request and answers it, or refuses it with a reason.
    /// Everything a stranger can make us do before it proves anything is
    /// bounded: no allocation for a refused request, and at most
    /// `max_pending_handshakes` answered ones (one queue pair and one ring
    /// of our `ring_size` each).
    fn on_request(&self, req: cm::ConnectRequest) -> Result<(), OrdersError> {
        let peer = req.peer();
        let Ok((theirs, _)) = ConnectHello::read_from_prefix(req.private_data()) else {
            self.reject(req, Refusal::BadHello, &"connect data too short");
            return Ok(());
        };
        if let Err(e) = check_hello(&peer, &theirs.hello, &self.cfg) {
            let why = match e {
                OrdersError::RingTooLarge { .. } => Refusal::RingTooLarge,
                _ => Refusal::BadHello,
            };
            self.reject(req, why, &e);
            return Ok(());
        }
        if self.pending.borrow().len() >= self.cfg.max_pending_handshakes {
            let max = self.cfg.max_pending_handshakes;
            self.reject(
                req,
                Refusal::PendingFull,
                &format_args!("{max} in progress"),
            );
            return Ok(());
        }
        let ip = req.peer_ip().unwrap_or(IpAddr::from([0u8; 4]));
        let Some(slot) = PeerSlot::take(&self.peers, ip, self.cfg.max_connections_per_peer) else {
            let max = self.cfg.max_connections_per_peer;
            self.reject(req, Refusal::PeerLimit, &format_args!("{max} from {ip}"));
            return Ok(());
        };
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
        let (responder, tr) = Responder::new(self.key.clone(), theirs.nonce, hctx.as_bytes());
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
        binding[..auth::NONCE_LEN].copy_from_slice(&theirs.nonce);
        binding[auth::NONCE_LEN..].copy_from_slice(&reply.nonce);
        match req.start_accept(
            &res.qp,
            &self.cfg.rc,
            Access::REMOTE_WRITE,
            &reply_bytes[..reply_len],
        ) {
            Ok(a) => self.pending.borrow_mut().push(Pending {
                stage: Some(Stage::Accepting(a)),
                res,
                theirs: theirs.hello,
                responder,
                ctx: hctx,
                binding,
                peer,
                slot,
                fanin: granted,
                deadline: Instant::now() + Duration::from_millis(self.cfg.connect_timeout_ms),
            }),
            // This one request failed (its id may be reset by the peer's
            // reject); local resources were made above.
            Err(e) => self.refuse(Refusal::HandshakeFailed, &peer, &e),
        }
        Ok(())
    }

    /// Moves every pending handshake on; returns the first that completed.
    fn progress(&self) -> Result<Option<Connection>, OrdersError> {
        let mut pending = self.pending.borrow_mut();
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let stage = p.stage.take().expect("a pending handshake has a stage");
            let outcome = match stage {
                Stage::Accepting(a) => match a.poll() {
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
                    let p = pending.swap_remove(i);
                    self.refuse(Refusal::HandshakeFailed, &p.peer, &"no proof in time");
                }
                Step::Proven(cm) => {
                    let p = pending.swap_remove(i);
                    let mut s = self.stats.get();
                    s.accepted += 1;
                    self.stats.set(s);
                    return Connection::from_parts(
                        p.res,
                        cm,
                        &p.theirs,
                        &self.cfg,
                        p.binding,
                        Some(p.slot),
                        (p.fanin, None),
                    )
                    .map(Some);
                }
                Step::Fail(why, detail) => {
                    let p = pending.swap_remove(i);
                    self.refuse(why, &p.peer, &detail);
                }
            }
        }
        Ok(None)
    }
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

    #[test]
    fn limits_have_safe_defaults_and_are_validated() {
        let c = OrdersConfig::default();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(c.max_peer_ring_size, 16 << 20);
        let bad = |f: fn(&mut OrdersConfig), key: &str| {
            let mut c = OrdersConfig::default();
            f(&mut c);
            let e = c.validate().unwrap_err();
            assert!(e.starts_with(key), "{e}");
        };
        bad(|c| c.max_peer_ring_size = 3 << 20, "max_peer_ring_size");
        bad(|c| c.max_peer_ring_size = 1 << 19, "max_peer_ring_size");
        bad(|c| c.max_peer_ring_size = 1 << 32, "max_peer_ring_size");
        bad(|c| c.max_pending_handshakes = 0, "max_pending_handshakes");
        bad(
            |c| c.max_connections_per_peer = 0,
            "max_connections_per_peer",
        );
        bad(|c| c.max_inline = 16, "max_inline");
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
