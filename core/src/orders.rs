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

use crate::ring::frame::{
    self, frame_len, FrameHeader, Hello, HEADER_LEN, HELLO_MAGIC, TRAILER_LEN, TYPE_PADDING,
};
use crate::ring::mem::{IncomingRing, Staging, CREDIT_OFF};
use crate::ring::{ClaimRefused, FrameError, ReceiverState, SenderState};
use crate::verbs::cm::{self, Listener};
use crate::verbs::{
    Access, CompletionQueue, Context, ProtectionDomain, QpCaps, QpType, QueuePair, RcOptions,
    SendWr, Sge, VerbsError, WcStatus, WorkCompletion,
};
use arrayvec::ArrayVec;
use std::cell::{Cell, RefCell, RefMut};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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
    /// Shared secret both sides must present.
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
    /// Connection set-up timeout, milliseconds.
    pub connect_timeout_ms: u64,
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
    /// The peer presented another token.
    #[error("peer {peer} presented a wrong token")]
    WrongToken {
        /// Who.
        peer: String,
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
    /// The payload, in the registered ring.
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
    state: SenderState,
    staging: Staging,
    remote_addr: u64,
    remote_rkey: u32,
    claim: Option<crate::ring::ClaimPos>,
}

struct RecvSide {
    state: ReceiverState,
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

fn hello(cfg: &OrdersConfig, ring: &IncomingRing) -> Hello {
    Hello {
        magic: HELLO_MAGIC.into(),
        ring_log2: (cfg.ring_size.trailing_zeros() as u16).into(),
        flags: 0.into(),
        token_hash: frame::token_hash(&cfg.token).into(),
        ring_addr: ring.mr().addr().into(),
        ring_rkey: ring.mr().rkey().into(),
        max_payload: (cfg.max_payload as u32).into(),
        conn_id: CONN_IDS.fetch_add(1, Ordering::Relaxed).into(), // ORDERING: a unique id, no data published.
    }
}

/// Parses and checks the peer's hello: magic, token, and a ring our frames fit.
fn check_hello(peer: &str, bytes: &[u8], cfg: &OrdersConfig) -> Result<Hello, OrdersError> {
    let h = Hello::read_from_prefix(bytes)
        .map(|(h, _)| h)
        .map_err(|_| OrdersError::BadHello {
            peer: peer.into(),
            why: "too short",
        })?;
    if h.magic.get() != HELLO_MAGIC {
        return Err(OrdersError::BadHello {
            peer: peer.into(),
            why: "bad magic",
        });
    }
    if h.token_hash.get() != frame::token_hash(&cfg.token) {
        return Err(OrdersError::WrongToken { peer: peer.into() });
    }
    let log2 = h.ring_log2.get();
    if !(12..=31).contains(&log2) || frame_len(cfg.max_payload) * 4 > 1usize << log2 {
        return Err(OrdersError::BadHello {
            peer: peer.into(),
            why: "ring too small for our max_payload",
        });
    }
    Ok(h)
}

impl Connection {
    fn from_parts(
        res: Resources,
        cm: cm::Connection,
        peer: &Hello,
        cfg: &OrdersConfig,
    ) -> Result<Self, OrdersError> {
        let peer_size = 1usize << peer.ring_log2.get();
        // The staging area mirrors the peer's ring, whose size we learn
        // from its hello.
        let staging = Staging::new(&res.pd, peer_size)?;
        // Our sender writes into the peer's ring with our max_payload
        // (checked against its size in check_hello); its receiver enforces
        // its own max_payload, ours ours.
        let send_state = SenderState::new(
            peer_size,
            cfg.max_payload.min(peer.max_payload.get() as usize),
        );
        Ok(Self {
            send: RefCell::new(SendSide {
                state: send_state,
                staging,
                remote_addr: peer.ring_addr.get(),
                remote_rkey: peer.ring_rkey.get(),
                claim: None,
            }),
            recv: RefCell::new(RecvSide {
                state: ReceiverState::new(cfg.ring_size, cfg.max_payload, cfg.ring_size / 4),
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
            cq: res.cq,
            _pd: res.pd,
        })
    }

    /// Connects to an [`OrdersListener`] at `addr`.
    pub fn connect(
        addr: SocketAddr,
        cfg: &OrdersConfig,
        timeout: Duration,
    ) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        let resolved = cm::resolve(addr, None, timeout)?;
        let ctx = Context::open(resolved.device_name().as_deref())?;
        let res = resources(&ctx, cfg)?;
        let mine = hello(cfg, &res.ring);
        let (conn, theirs) = resolved.connect(
            &res.qp,
            &cfg.rc,
            Access::REMOTE_WRITE,
            mine.as_bytes(),
            timeout,
        )?;
        let peer = match check_hello(&conn.peer(), &theirs, cfg) {
            Ok(p) => p,
            Err(e) => {
                let _ = conn.disconnect();
                return Err(e);
            }
        };
        Self::from_parts(res, conn, &peer, cfg)
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
        if send.state.unflushed() == 0 {
            drop(send);
            return self.reap().map_err(OfferError::Lost);
        }
        let (ranges, n) = send.state.take_flush();
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
            let sge = [range_sge(&send.staging, (off, len))];
            self.post(&mut [self.write_wr(&sge, remote + off as u64, rkey, len)])
        } else {
            self.post_runs(&send.staging, remote, rkey, &ranges[..n], max)
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

    fn send_credit(&self, consumed: u64) -> Result<(), PeerLost> {
        let bytes = crate::ring::mem::control_word(consumed);
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
            let credit = self.ring.load_credit();
            let done = {
                let mut s = self.send.borrow_mut();
                if let Some(c) = credit {
                    s.state.on_credit(c);
                }
                s.state.in_flight() == 0
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
    stream_id: u16,
    msg_type: u16,
    len: usize,
    committed: bool,
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
        if msg_type >= frame::TYPE_RESERVED_MIN {
            return Err(OfferError::ReservedType);
        }
        let mut send = self
            .conn
            .send
            .try_borrow_mut()
            .map_err(|_| OfferError::ClaimOpen)?;
        let pos = match send.state.claim(len) {
            Ok(p) => p,
            Err(ClaimRefused::TooLarge) => return Err(OfferError::TooLarge),
            Err(ClaimRefused::BackPressured) => {
                // Refresh the credit word and retry once before refusing.
                if let Some(credit) = self.conn.ring.load_credit() {
                    send.state.on_credit(credit);
                }
                match send.state.claim(len) {
                    Ok(p) => p,
                    Err(_) => {
                        self.conn.stats.borrow_mut().back_pressured += 1;
                        return Err(OfferError::BackPressured);
                    }
                }
            }
        };
        send.claim = Some(pos);
        Ok(Claim {
            send,
            conn: self.conn,
            stream_id: self.stream_id,
            msg_type,
            len,
            committed: false,
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
        let pos = self.send.claim.take().expect("claim position");
        if let Some((off, pad)) = pos.padding {
            let seq = self.send.state.next_seq();
            let h = FrameHeader::new((pad - HEADER_LEN) as u32, 0, TYPE_PADDING, seq);
            self.send
                .staging
                .slice_mut(off, HEADER_LEN)
                .copy_from_slice(h.as_bytes());
        }
        let seq = self.send.state.next_seq() + pos.padding.is_some() as u64;
        let h = FrameHeader::new(self.len as u32, self.stream_id, self.msg_type, seq);
        let trailer_at = pos.offset + pos.total - TRAILER_LEN;
        let staging = &mut self.send.staging;
        staging
            .slice_mut(pos.offset, HEADER_LEN)
            .copy_from_slice(h.as_bytes());
        staging
            .slice_mut(trailer_at, TRAILER_LEN)
            .copy_from_slice(&frame::trailer_value(seq).to_le_bytes());
        let used = self.send.state.commit(&pos);
        debug_assert_eq!(used, seq);
        self.committed = true;
        let mut st = self.conn.stats.borrow_mut();
        st.frames_sent += 1;
        st.bytes_sent += self.len as u64;
    }
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let off = self.send.claim.as_ref().expect("open claim").offset;
        self.send.staging.slice(off + HEADER_LEN, self.len)
    }
}

impl std::ops::DerefMut for Claim<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let off = self.send.claim.as_ref().expect("open claim").offset;
        let len = self.len;
        self.send.staging.slice_mut(off + HEADER_LEN, len)
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.committed {
            self.send.claim = None;
        }
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
        while delivered < limit {
            let off = recv.state.offset();
            let h = conn.ring.read_header(off);
            let info = match frame::validate(
                &h,
                recv.state.consumed(),
                off,
                recv.state.size(),
                recv.state.expected_seq(),
                recv.state.max_payload(),
            ) {
                Ok(Some(i)) => i,
                Ok(None) => break, // the next frame has not arrived
                Err(e) => {
                    drop(recv);
                    return Err(self.violation(e));
                }
            };
            if info.msg_type != TYPE_PADDING {
                // The seal is the frame's last word: until it holds this
                // frame's value the frame is still being placed.
                let seal = conn.ring.read_trailer(off + info.total - TRAILER_LEN);
                if seal != frame::trailer_value(info.seq) {
                    break;
                }
                handler(Frame {
                    stream_id: info.stream_id,
                    msg_type: info.msg_type,
                    seq: info.seq,
                    payload: conn.ring.payload(off + HEADER_LEN, info.len as usize),
                });
                delivered += 1;
                frames += 1;
                bytes += info.len as u64;
            }
            recv.state.advance(info.total);
        }
        if frames > 0 {
            let mut st = conn.stats.borrow_mut();
            st.frames_received += frames;
            st.bytes_received += bytes;
        }
        let idle = delivered == 0;
        let due = recv.state.credit_due(delivered);
        if let Some(c) = due {
            recv.state.credit_sent(c);
        }
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

/// Accepts orders connections, checking each peer's token.
#[derive(Debug)]
pub struct OrdersListener {
    listener: Listener,
    cfg: OrdersConfig,
    refused: Cell<u64>,
    failed_handshakes: Cell<u64>,
}

impl OrdersListener {
    /// Listens on `addr`.
    pub fn bind(addr: SocketAddr, cfg: OrdersConfig) -> Result<Self, OrdersError> {
        cfg.validate().map_err(OrdersError::Config)?;
        Ok(Self {
            listener: Listener::bind(addr)?,
            cfg,
            refused: Cell::new(0),
            failed_handshakes: Cell::new(0),
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.listener.local_port()
    }

    /// Connection requests refused (wrong token or handshake).
    pub fn refused(&self) -> u64 {
        self.refused.get()
    }

    /// Accepted requests whose connection handshake then failed: the peer's
    /// confirmation was lost or late, or it gave up and went away.
    pub fn failed_handshakes(&self) -> u64 {
        self.failed_handshakes.get()
    }

    /// Waits up to `timeout` for a peer; `Ok(None)` on timeout. A peer with
    /// a wrong token or handshake is rejected (it gets the reason), counted,
    /// logged, and waiting goes on. So does a handshake that fails after the
    /// request was accepted (on a lossy link the CM's messages can time out);
    /// the peer sees its connect fail and may retry. Local failures (no
    /// device, no resources) are returned.
    pub fn accept(&self, timeout: Duration) -> Result<Option<Connection>, OrdersError> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(req) = self.listener.next_request(left)? else {
                return Ok(None);
            };
            let peer = req.peer();
            let theirs = match check_hello(&peer, req.private_data(), &self.cfg) {
                Ok(h) => h,
                Err(e) => {
                    self.refused.set(self.refused.get() + 1);
                    tracing::warn!(%peer, error = %e, "orders connection refused");
                    let reason = match e {
                        OrdersError::WrongToken { .. } => "rocebus: wrong token",
                        _ => "rocebus: bad handshake",
                    };
                    let _ = req.reject(reason.as_bytes());
                    continue;
                }
            };
            let ctx = Context::open(req.device_name().as_deref())?;
            let res = resources(&ctx, &self.cfg)?;
            let mine = hello(&self.cfg, &res.ring);
            let timeout = Duration::from_millis(self.cfg.connect_timeout_ms);
            let conn = match req.accept(
                &res.qp,
                &self.cfg.rc,
                Access::REMOTE_WRITE,
                mine.as_bytes(),
                timeout,
            ) {
                Ok(conn) => conn,
                // Everything here concerns this one request: its id may be
                // reset by the peer's reject (rdma_accept then fails), or the
                // confirmation never comes. Local resources were made above.
                Err(e) => {
                    self.failed_handshakes.set(self.failed_handshakes.get() + 1);
                    tracing::warn!(%peer, error = %e, "orders handshake failed; still listening");
                    continue;
                }
            };
            return Connection::from_parts(res, conn, &theirs, &self.cfg).map(Some);
        }
    }

    /// Never blocks: the next connect request that passed the token and hello checks,
    /// `Ok(None)` if none is waiting. Requests that fail the checks are rejected with the
    /// reason, counted and logged, as [`accept`](Self::accept) does. The caller decides
    /// whether to [`start`](PendingRequest::start) its handshake or
    /// [`reject`](PendingRequest::reject) it (e.g. too many pending connections).
    pub fn poll_request(&self) -> Result<Option<PendingRequest>, OrdersError> {
        loop {
            let Some(req) = self.listener.next_request(Duration::ZERO)? else {
                return Ok(None);
            };
            let peer = req.peer();
            match check_hello(&peer, req.private_data(), &self.cfg) {
                Ok(theirs) => return Ok(Some(PendingRequest { req, theirs, peer })),
                Err(e) => {
                    self.refused.set(self.refused.get() + 1);
                    tracing::warn!(%peer, error = %e, "orders connection refused");
                    let reason = match e {
                        OrdersError::WrongToken { .. } => "rocebus: wrong token",
                        _ => "rocebus: bad handshake",
                    };
                    let _ = req.reject(reason.as_bytes());
                }
            }
        }
    }
}

/// A connect request that passed the listener's checks, not answered yet
/// ([`OrdersListener::poll_request`]).
#[derive(Debug)]
pub struct PendingRequest {
    req: cm::ConnectRequest,
    theirs: Hello,
    peer: String,
}

impl PendingRequest {
    /// The requester's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Refuses it; the peer's connect fails with `reason` (at most 148 bytes are sent).
    pub fn reject(self, reason: &str) {
        let _ = self.req.reject(reason.as_bytes());
    }

    /// Sets up the connection's resources and answers the request without waiting for the
    /// peer's confirmation: poll the returned [`Handshake`] until it completes. A failure
    /// that concerns this request only is counted in
    /// [`OrdersListener::failed_handshakes`]; both kinds are returned.
    pub fn start(self, listener: &OrdersListener) -> Result<Handshake, OrdersError> {
        let cfg = &listener.cfg;
        let ctx = Context::open(self.req.device_name().as_deref())?;
        let res = resources(&ctx, cfg)?;
        let mine = hello(cfg, &res.ring);
        match self
            .req
            .start_accept(&res.qp, &cfg.rc, Access::REMOTE_WRITE, mine.as_bytes())
        {
            Ok(accepting) => Ok(Handshake {
                accepting,
                res,
                theirs: self.theirs,
                peer: self.peer,
                deadline: Instant::now() + Duration::from_millis(cfg.connect_timeout_ms),
            }),
            Err(e) => {
                listener.handshake_failed(&self.peer, &e);
                Err(e.into())
            }
        }
    }
}

/// An answered connect request waiting for the peer's confirmation
/// ([`PendingRequest::start`]). Dropping it abandons the connection.
pub struct Handshake {
    // Field order is drop order, as in `Connection`: the queue pair goes first.
    res: Resources,
    accepting: cm::Accepting,
    theirs: Hello,
    peer: String,
    deadline: Instant,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// Where a [`Handshake`] stands (set-up path, polled about once a millisecond: the size
/// difference of the variants costs nothing worth a box).
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum HandshakeProgress {
    /// Not confirmed yet: poll again later.
    Pending(Handshake),
    /// Established.
    Done(Connection),
}

impl Handshake {
    /// The peer's address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// Checks once, without blocking, whether the peer confirmed. A handshake that failed
    /// or passed `connect_timeout_ms` is an error, counted in
    /// [`OrdersListener::failed_handshakes`].
    pub fn poll(self, listener: &OrdersListener) -> Result<HandshakeProgress, OrdersError> {
        let Handshake {
            accepting,
            res,
            theirs,
            peer,
            deadline,
        } = self;
        match accepting.poll() {
            Ok(cm::AcceptProgress::Done(conn)) => {
                Connection::from_parts(res, conn, &theirs, &listener.cfg)
                    .map(HandshakeProgress::Done)
            }
            Ok(cm::AcceptProgress::Pending(accepting)) if Instant::now() < deadline => {
                Ok(HandshakeProgress::Pending(Handshake {
                    accepting,
                    res,
                    theirs,
                    peer,
                    deadline,
                }))
            }
            Ok(cm::AcceptProgress::Pending(_)) => {
                let e = VerbsError::CmTimeout {
                    expected: "ESTABLISHED",
                    ms: listener.cfg.connect_timeout_ms,
                };
                listener.handshake_failed(&peer, &e);
                Err(e.into())
            }
            Err(e) => {
                listener.handshake_failed(&peer, &e);
                Err(e.into())
            }
        }
    }
}

impl OrdersListener {
    fn handshake_failed(&self, peer: &str, e: &VerbsError) {
        self.failed_handshakes.set(self.failed_handshakes.get() + 1);
        tracing::warn!(%peer, error = %e, "orders handshake failed; still listening");
    }
}
