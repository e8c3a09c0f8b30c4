//! The market-data path on real RDMA: the thin I/O shell around
//! [`PublisherState`] and [`SubscriberState`].
//!
//! - [`McastPublisher`]: one UD queue pair sending every flushed datagram of
//!   the history to line A and (optionally) line B, joined through rdma_cm,
//!   paced per configuration, with heartbeats when idle; and a recovery
//!   service: an rdma_cm [`Listener`] on the channel's port whose RC
//!   connections carry the recovery messages of [`super::wire`] (retransmits
//!   from the history, snapshots from the application's [`Snapshot`]).
//! - [`McastSubscriber`]: one UD queue pair per line with receives kept
//!   posted, one RC connection to the publisher's recovery service; feeds the
//!   state machine and sends the requests it asks for.
//!
//! Admission and sources: the recovery connection is admitted by the
//! challenge-response of [`crate::auth`] (see [`super::wire`]'s "Recovery
//! admission"); through it the subscriber learns the publisher's session,
//! UD queue pair and GID, and drops (counts) every datagram from another
//! queue pair or GID before it is parsed. Both sides use the channel's
//! configured `qkey`. The recovery port bounds what any client costs: a
//! connection cap, a handshake deadline, per-connection token buckets for
//! retransmit and snapshot requests, a cap on messages per request, a
//! bounded outbox, snapshots serialised at most once per
//! `recovery_server.snapshot_reuse_ns` whoever asks, and clients that take
//! nothing (no receive posted: RNR retries are bounded; or no progress for
//! `stall_timeout_ns`) are dropped. Each refusal and drop is counted and
//! logged at most `log_per_sec` times a second.
//!
//! Both are driven by `poll(now, ..)`, which never blocks, allocates or logs
//! per message. Connection management runs as non-blocking rdma_cm steps
//! checked at most once per [`CM_CHECK_NS`]: the publisher accepts a
//! recovery connection across polls (a connecting subscriber cannot stall
//! publishing), and a subscriber whose recovery connection dies keeps
//! delivering multicast, reports it ([`Event::RecoveryLost`]) and reconnects
//! with exponential back-off (`recovery.reconnect_min_ns` ..
//! `reconnect_max_ns`). Setting up a connection allocates its queue pair
//! and buffers (rare, not per message); a recovery connection's outbox
//! grows, amortised, to its largest burst of answers, up to
//! `recovery_server.max_outbox_bytes`. Buffers are the verbs layer's [`PooledQp`] rings, so
//! there is no `unsafe` here. Protocol decisions belong to the state
//! machines, not to this module.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrayvec::ArrayVec;
use zerocopy::FromBytes;

use super::config::{ChannelConfig, McastConfig, RecoveryServerConfig};
use super::publisher::{ClaimError, Pacer, PublisherState, RetransmitReply};
use super::repair::{RepairConfig, RepairCounters, RepairDecision, RepairPlanner};
use super::snapshot::{encode_snapshot, Handler, Snapshot, SnapshotSink};
use super::status::{PublisherEvent, StatusReporter, SubscriberRow, SubscriberTable};
use super::subscriber::{Event, SubscriberCounters, SubscriberState};
use super::wire::SubscriberStatus;
use super::wire::{
    self, Hello, Line, RecoveryHeader, RecoveryMsg, RetransmitRequest, Welcome, FLAG_DATAGRAM_TAG,
    RECOVERY_HEADER_LEN, WELCOME_SIGNED_LEN,
};
use crate::auth::{Initiator, Key, Responder, Tag};
use crate::verbs::cm::{self, Connection, Listener, McastMembership};
use crate::verbs::{
    Access, AddressHandle, Context, Dest, Gid, PoolConfig, PoolError, PooledQp, ProtectionDomain,
    QpType, RcOptions, StageError, VerbsError,
};
use zerocopy::IntoBytes;

/// Size of one RC message (a send slot of the recovery service, a receive
/// slot of the subscriber). Several recovery messages share one.
pub const RC_MSG_LEN: usize = 4096;
/// Snapshot bytes per SnapshotChunk, so a chunk fills one RC message.
pub const SNAPSHOT_CHUNK: usize = RC_MSG_LEN - wire::snapshot_chunk_len(0);

/// Datagrams and recovery messages up to this many bytes are posted inline
/// (copied into the work request at post time): a latency-bound publisher's
/// single small datagram then costs the device no MR lookup or DMA read.
/// 220 B fits every RoCE device's UD and RC inline limit, as in the orders path.
pub const INLINE_MAX: u32 = 220;

const CM_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a recovery connection may take to set up, across polls.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the publisher keeps an accepted connection waiting for
/// ESTABLISHED. Longer than [`CONNECT_TIMEOUT`]: when the subscriber's RTU
/// is lost, rdma_cm resends its REP only after the CM response timeout
/// (about 4 s by default), and a connection dropped before that is
/// established on the subscriber's side only, a link that takes requests
/// and never answers.
const PENDING_TIMEOUT: Duration = Duration::from_secs(10);
/// A recovery link is dropped and re-established after this many request
/// timeouts in a row with nothing received over it.
pub const DEAD_LINK_TIMEOUTS: u64 = 3;

/// An idle subscriber polls its recovery connection's CQ once in this many
/// turns (see [`McastSubscriber::poll`]).
const IDLE_LINK_POLLS: u32 = 64;
/// How often connection management (new, closed and half-set-up
/// connections) is looked at: each look is a system call on the rdma_cm
/// channel, so not once per loop.
pub const CM_CHECK_NS: u64 = 1_000_000;
/// The same while a connection is being set up, so each handshake step
/// waits little.
const CM_STEP_NS: u64 = 50_000;

/// Nanoseconds on a process-wide monotonic clock, the `now` the state
/// machines take.
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Why the market-data I/O failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The configuration has no such channel.
    #[error("channel {0} is not in the market-data configuration")]
    NoChannel(u16),
    /// A verb or rdma_cm call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A buffer pool failed (including failed send completions).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The publisher's answer to the recovery handshake was refused: it
    /// does not know the shared secret (or is not a rocebus publisher), or
    /// the two sides disagree on the channel or on datagram tags.
    #[error("recovery admission to {publisher} failed: {reason}")]
    Admission {
        /// The publisher's recovery address.
        publisher: SocketAddr,
        /// What was wrong.
        reason: &'static str,
    },
    /// The channel is configured with another `transport`: multicast
    /// channels are served by [`McastPublisher`]/[`McastSubscriber`], RC
    /// fan-out ones by [`super::rcfanout`]; [`super::MdPublisher`] and
    /// [`super::MdSubscriber`] pick the right one from the configuration.
    #[error("channel {channel} is configured with transport = \"{configured}\": use the matching publisher and subscriber (MdPublisher/MdSubscriber pick it from the configuration)")]
    WrongTransport {
        /// The channel.
        channel: u16,
        /// Its configured transport.
        configured: &'static str,
    },
    /// Both lines of a channel came out of their joins with the same
    /// multicast GID: the A/B copies would land on one queue pair twice.
    #[error("lines A and B of channel {channel} joined the same multicast GID {mgid}")]
    LinesShareGroup {
        /// The channel.
        channel: u16,
        /// The GID both joins returned.
        mgid: String,
    },
}

/// Why [`McastPublisher::publish`] refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Larger than fits in a datagram.
    #[error(transparent)]
    Claim(#[from] ClaimError),
}

/// I/O counters of a publisher (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherIoStats {
    /// Datagrams multicast (each on every enabled line).
    pub datagrams_sent: u64,
    /// Heartbeats multicast.
    pub heartbeats_sent: u64,
    /// Datagrams overwritten in the history before pacing let them out.
    pub unsent_overwritten: u64,
    /// Recovery connections accepted.
    pub connections_accepted: u64,
    /// Recovery connections that failed to set up (or timed out doing so).
    pub connections_failed: u64,
    /// Recovery connections closed (peer disconnected or send failed).
    pub connections_closed: u64,
    /// Retransmit requests served.
    pub retransmit_requests: u64,
    /// Snapshots served.
    pub snapshots_served: u64,
    /// Requests dropped because the connection's outbox was full, or
    /// undecodable.
    pub requests_dropped: u64,
    /// Connect requests refused before any set-up: the connection cap was
    /// reached, or the hello was not a rocebus hello for this channel with
    /// the same datagram-tag setting.
    pub connections_refused: u64,
    /// Connections dropped because their first message was not a valid
    /// proof of the shared secret (a wrong secret or a replayed handshake).
    pub auth_failures: u64,
    /// Connections dropped because no proof came within
    /// `recovery_server.handshake_timeout_ns`.
    pub handshake_timeouts: u64,
    /// Retransmit requests dropped by the per-connection rate limit.
    pub requests_rate_limited: u64,
    /// Snapshot requests dropped by the per-connection rate limit.
    pub snapshots_rate_limited: u64,
    /// Retransmit requests cut to `recovery.max_request_messages`.
    pub requests_clamped: u64,
    /// Snapshots serialised (the rest of `snapshots_served` reused one).
    pub snapshots_built: u64,
    /// Connections dropped because their client took nothing: RNR retries
    /// exhausted (no receive posted) or no send progress for
    /// `recovery_server.stall_timeout_ns`.
    pub clients_stalled: u64,
    /// Datagrams retransmitted by unicast, over recovery connections.
    pub repair_unicast_datagrams: u64,
    /// Datagrams retransmitted on multicast (a loss several subscribers
    /// shared, see [`super::repair`]), each once on every enabled line.
    pub repair_multicast_datagrams: u64,
    /// Retransmit requests answered by nothing because a multicast
    /// retransmit had just covered them.
    pub repair_requests_covered: u64,
    /// Retransmit requests answered by nothing because an answer sent to
    /// the same subscriber within `recovery_server.repair_holdoff_ns`
    /// covers them (retries that crossed their answer).
    pub repair_requests_suppressed: u64,
    /// Subscriber status reports taken.
    pub status_reports: u64,
    /// Subscriber status reports dropped as invalid (another channel or
    /// session, or a position ahead of the publisher's).
    pub status_invalid: u64,
}

fn channel_of(cfg: &McastConfig, channel: u16) -> Result<&ChannelConfig, NetError> {
    let ch = cfg.channel(channel).ok_or(NetError::NoChannel(channel))?;
    // A `transport = "rc"` channel has no groups: see super::rcfanout.
    if ch.transport != super::config::Transport::Multicast {
        return Err(NetError::WrongTransport {
            channel,
            configured: ch.transport.as_str(),
        });
    }
    Ok(ch)
}

fn rc_options(cfg: &McastConfig) -> RcOptions {
    RcOptions {
        timeout: cfg.recovery.rc_timeout,
        ..RcOptions::default()
    }
}

/// The recovery port's queue pairs: RNR retries bounded, so a client that
/// never posts a receive fails our sends instead of holding them for ever.
fn server_rc_options(cfg: &McastConfig) -> RcOptions {
    RcOptions {
        rnr_retry: cfg.recovery_server.rnr_retry,
        ..rc_options(cfg)
    }
}

/// The GID a RoCE v2 device sends from for local address `ip` (its
/// IPv4-mapped form for IPv4), as a receiver reads it off the datagram.
fn gid_of(ip: IpAddr) -> Gid {
    Gid(match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    })
}

/// Warns (once per constructor call) that an empty `auth.secret` admits anyone.
fn warn_if_open(cfg: &McastConfig, channel: u16) {
    if cfg.auth.secret.is_empty() {
        tracing::warn!(
            channel,
            "market data: auth.secret is empty, so the recovery handshake proves nothing: set a shared secret"
        );
    }
}

/// At most `per_sec` log lines a second (the counters count every event).
#[derive(Debug, Clone, Copy)]
struct LogBudget {
    per_sec: u32,
    window: u64,
    used: u32,
}

impl LogBudget {
    fn new(per_sec: u32) -> Self {
        LogBudget {
            per_sec,
            window: 0,
            used: 0,
        }
    }
    fn allow(&mut self, now: u64) -> bool {
        if now.saturating_sub(self.window) >= 1_000_000_000 {
            self.window = now;
            self.used = 0;
        }
        self.used += 1;
        self.used <= self.per_sec
    }
}

/// Length of the recovery message at the start of `bytes` (from its header).
fn recovery_len(bytes: &[u8]) -> Option<usize> {
    let (h, _) = RecoveryHeader::ref_from_prefix(bytes).ok()?;
    let len = h.len.get() as usize;
    (RECOVERY_HEADER_LEN..=bytes.len())
        .contains(&len)
        .then_some(len)
}

struct LineTx {
    ah: AddressHandle,
    qpn: u32,
    qkey: u32,
    enabled: bool,
    _membership: McastMembership,
}

/// A market-data publisher for one channel: multicast sender plus recovery
/// service. See the module documentation.
pub struct McastPublisher {
    state: PublisherState,
    pacer: Pacer,
    // Field order: the queue pairs go before what they reference.
    ud: PooledQp,
    lines: ArrayVec<LineTx, 2>,
    server: RecoveryServer,
    /// The multicast retransmit in progress: `[from, to)` still to send.
    mcast_repair: Option<(u64, u64)>,
    /// First sequence not yet multicast.
    sent_upto: u64,
    last_send: u64,
    heartbeat_interval: u64,
    stats: PublisherIoStats,
}

impl std::fmt::Debug for McastPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McastPublisher")
            .field("session", &self.state.session())
            .field("next_seq", &self.state.next_seq())
            .field("sent_upto", &self.sent_upto)
            .field("stats", &self.stats)
            .field("ud", &self.ud)
            .finish_non_exhaustive()
    }
}

impl McastPublisher {
    /// Opens the device owning `local`, joins the channel's groups, and
    /// listens for recovery connections on `local`:`channel.port`.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        session: u64,
        local: IpAddr,
    ) -> Result<Self, NetError> {
        let ch = channel_of(cfg, channel)?;
        warn_if_open(cfg, channel);
        let ctx = Context::open_for_ip(local)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let ud = PooledQp::new(
            &pd,
            QpType::Ud,
            PoolConfig {
                recv_slots: 0,
                recv_len: 0,
                recv_batch: 1,
                recv_low_water: 0,
                send_slots: 256,
                send_len: cfg.max_datagram_payload,
                signal_every: 16,
                dests_per_send: 2,
                max_inline: INLINE_MAX,
            },
        )?;
        let mut lines = ArrayVec::new();
        for group in std::iter::once(ch.line_a).chain(ch.line_b) {
            let m = McastMembership::join(local, group, false, CM_TIMEOUT)?;
            cm::check_device(&ctx, m.device_name())?;
            if lines.is_empty() {
                ud.qp().activate_ud(m.port_num(), ch.qkey, 0)?;
            }
            lines.push(LineTx {
                ah: m.address_handle(&pd)?,
                qpn: m.remote_qpn(),
                qkey: ch.qkey,
                enabled: true,
                _membership: m,
            });
        }
        let addr = SocketAddr::new(local, ch.port);
        let listener = Listener::bind(addr)?;
        let mut state = PublisherState::new(cfg.publisher(channel, session));
        state.set_datagram_key(cfg.datagram_key());
        let identity = Welcome {
            magic: wire::WELCOME_MAGIC.into(),
            version: wire::VERSION,
            flags: if cfg.auth.datagram_tag {
                FLAG_DATAGRAM_TAG
            } else {
                0
            },
            channel: channel.into(),
            reserved: 0.into(),
            session: session.into(),
            qpn: ud.qp().qpn().into(),
            reserved2: 0.into(),
            gid: gid_of(local).0,
            nonce: [0; crate::auth::NONCE_LEN],
            tag: [0; crate::auth::TAG_LEN],
        };
        let limits = cfg.recovery_server;
        Ok(McastPublisher {
            sent_upto: state.next_seq(),
            state,
            pacer: Pacer::new(cfg.pacing.max_datagrams_per_sec, cfg.pacing.burst),
            ud,
            lines,
            mcast_repair: None,
            server: RecoveryServer {
                addr,
                listener: Some(listener),
                pd,
                conns: Vec::new(),
                pending: Vec::new(),
                opts: server_rc_options(cfg),
                key: cfg.recovery_key(),
                identity,
                limits,
                max_request_messages: cfg.recovery.max_request_messages,
                shared: Shared {
                    scratch: Vec::new(),
                    snapshot: Vec::new(),
                    snapshot_at: None,
                    log: LogBudget::new(limits.log_per_sec),
                    planner: RepairPlanner::new(RepairConfig {
                        multicast: limits.multicast_repair,
                        window_ns: limits.repair_window_ns,
                        holdoff_ns: limits.repair_holdoff_ns,
                    }),
                    table: SubscriberTable::new(limits.lag_alert_messages),
                    subscribers: 0,
                },
                next_conn_id: 0,
                next_disconnect_check: 0,
            },
            last_send: 0,
            heartbeat_interval: cfg.heartbeat_interval_ns,
            stats: PublisherIoStats::default(),
        })
    }

    /// The protocol state (sequence, history, counters).
    pub fn state(&self) -> &PublisherState {
        &self.state
    }
    /// I/O counters.
    pub fn io_stats(&self) -> PublisherIoStats {
        self.stats
    }
    /// Every admitted subscriber: address, position, lag, rate, requests,
    /// as of the last poll (see [`super::status`]).
    pub fn subscribers(&self) -> &[SubscriberRow] {
        self.server.shared.table.rows()
    }
    /// The next event about subscribers (one fell behind the
    /// `recovery_server.lag_alert_messages` bound, or caught up again).
    pub fn poll_event(&mut self) -> Option<PublisherEvent> {
        self.server.shared.table.poll_event()
    }
    /// How retransmit requests were answered (unicast, multicast, covered).
    pub fn repair_counters(&self) -> RepairCounters {
        self.server.shared.planner.counters()
    }
    /// Recovery connections currently open (admitted or still proving
    /// themselves; not those still being set up).
    pub fn connections(&self) -> usize {
        self.server.conns.len()
    }
    /// Recovery connections that proved the shared secret.
    pub fn admitted_connections(&self) -> usize {
        self.server
            .conns
            .iter()
            .filter(|c| c.auth.is_none())
            .count()
    }
    /// Stops the recovery service (closing its connections and no longer
    /// listening) or starts it again, e.g. for maintenance or to test how
    /// subscribers live without it. Multicast goes on either way.
    pub fn set_recovery_enabled(&mut self, enabled: bool) -> Result<(), NetError> {
        let srv = &mut self.server;
        if !enabled {
            self.stats.connections_closed += srv.conns.len() as u64;
            srv.conns.clear();
            srv.shared.table.clear();
            srv.pending.clear();
            srv.listener = None;
        } else if srv.listener.is_none() {
            srv.listener = Some(Listener::bind(srv.addr)?);
        }
        Ok(())
    }
    /// Stops (or resumes) sending on `line`, e.g. to test a cut line.
    pub fn set_line_enabled(&mut self, line: Line, enabled: bool) {
        if let Some(l) = self.lines.get_mut(line as usize) {
            l.enabled = enabled;
        }
    }

    /// Appends one message to the open datagram (flushing it first if full)
    /// and returns its sequence. Sending happens in [`poll`](Self::poll) and
    /// [`flush`](Self::flush).
    ///
    /// A message larger than one datagram (up to `max_message_bytes`) is
    /// sealed as fragment datagrams at once and sent as pacing allows, here
    /// and in later polls: publish the next one once
    /// [`unsent_datagrams`](Self::unsent_datagrams) is small, or a history
    /// smaller than the backlog overwrites fragments before they are sent.
    pub fn publish(&mut self, now: u64, msg: &[u8]) -> Result<u64, PublishError> {
        match self.state.publish(msg) {
            Ok(seq) if msg.len() > self.state.max_message_len() => {
                self.pump(now);
                // As in pump, a failed post is left to the next one.
                let _ = self.ud.post_staged(&dests_of(&self.lines));
                Ok(seq)
            }
            Ok(seq) => Ok(seq),
            Err(ClaimError::Full) => {
                self.state.flush();
                self.pump(now);
                Ok(self.state.publish(msg)?)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Claims `len` bytes for the next message (flushing a full datagram
    /// first): write the message into the slice, then
    /// [`commit`](Self::commit). A claim larger than one datagram (up to
    /// `max_message_bytes`) is staged and fragmented at commit.
    pub fn try_claim(&mut self, now: u64, len: usize) -> Result<&mut [u8], PublishError> {
        if len <= self.state.max_message_len()
            && matches!(self.state.try_claim(len), Err(ClaimError::Full))
        {
            self.state.flush();
            self.pump(now);
        }
        Ok(self.state.try_claim(len)?)
    }

    /// Commits the claimed message and returns its sequence (`None` if
    /// nothing was claimed). A large message's fragments are sent as pacing
    /// allows, here and in later polls.
    pub fn commit(&mut self, now: u64) -> Option<u64> {
        let fragments = self.state.counters().fragments;
        let seq = self.state.commit()?;
        if self.state.counters().fragments != fragments {
            self.pump(now);
            // As in pump, a failed post is left to the next one.
            let _ = self.ud.post_staged(&dests_of(&self.lines));
        }
        Some(seq)
    }

    /// Flushed datagrams not sent yet (waiting for pacing or send slots).
    pub fn unsent_datagrams(&self) -> u64 {
        let mut n = 0;
        let mut seq = self.sent_upto;
        while let Some((_, end, _)) = self.state.sealed_from(seq) {
            n += 1;
            seq = end;
        }
        n
    }

    /// Seals the open datagram now and sends what pacing allows.
    pub fn flush(&mut self, now: u64) -> Result<(), NetError> {
        self.state.flush();
        if self.send_direct(now)? {
            return Ok(());
        }
        self.pump(now);
        self.ud.post_staged(&dests_of(&self.lines))?;
        Ok(())
    }

    /// The latency path: when the datagram just sealed is the only one
    /// unsent, nothing is staged and it fits inline, it is posted straight
    /// from the history (no copy into a send slot). `Ok(false)`: not
    /// applicable, nothing done.
    fn send_direct(&mut self, now: u64) -> Result<bool, NetError> {
        if self.ud.has_staged() || self.ud.sends_in_flight() >= self.ud.send_slots() {
            return Ok(false);
        }
        let Some((first, end, bytes)) = self.state.sealed_from(self.sent_upto) else {
            return Ok(false);
        };
        if first != self.sent_upto
            || end != self.state.unflushed_seq()
            || bytes.len() > self.ud.max_inline()
            || !self.pacer.try_acquire(now)
        {
            return Ok(false);
        }
        // Cannot decline now (nothing staged, it fits, a slot is free) but
        // for no enabled line, where the datagram counts as sent, as in pump.
        self.ud.send_inline(bytes, &dests_of(&self.lines))?;
        self.sent_upto = end;
        self.last_send = now;
        self.stats.datagrams_sent += 1;
        Ok(true)
    }

    /// Stages flushed, unsent datagrams as pacing and the send ring allow;
    /// posts full batches. Errors are left to the next post.
    fn pump(&mut self, now: u64) {
        while let Some((first, end, bytes)) = self.state.sealed_from(self.sent_upto) {
            if first > self.sent_upto {
                self.stats.unsent_overwritten += 1;
            }
            if !self.pacer.try_acquire(now) {
                return;
            }
            match self.ud.stage(bytes) {
                Ok(()) => {}
                Err(StageError::BatchFull) => {
                    let dests = dests_of(&self.lines);
                    if self.ud.post_staged(&dests).is_err() || self.ud.stage(bytes).is_err() {
                        return;
                    }
                }
                Err(StageError::RingFull) => {
                    if self.ud.poll_send().is_err() || self.ud.stage(bytes).is_err() {
                        return;
                    }
                }
                Err(StageError::TooLarge { .. }) => {}
            }
            self.sent_upto = end;
            self.last_send = now;
            self.stats.datagrams_sent += 1;
        }
    }

    /// Does all pending work once: flushes on the batching timer, multicasts,
    /// sends a heartbeat when idle, reclaims send slots, and serves recovery
    /// (accepting connections, answering retransmit requests from the
    /// history and snapshot requests from `snapshot`). Returns the datagrams
    /// sent. Never blocks.
    pub fn poll(&mut self, now: u64, snapshot: &impl Snapshot) -> Result<usize, NetError> {
        let before = self.stats.datagrams_sent;
        self.state.poll_flush(now);
        self.pump(now);
        if self.sent_upto == self.state.unflushed_seq()
            && now.saturating_sub(self.last_send) >= self.heartbeat_interval
        {
            let hb = self.state.heartbeat();
            if self.ud.stage(hb).is_ok() {
                self.stats.heartbeats_sent += 1;
            }
            self.last_send = now;
        }
        if self.ud.has_staged() {
            self.ud.post_staged(&dests_of(&self.lines))?;
        }
        self.ud.reclaim()?;
        self.server
            .poll(now, &mut self.state, snapshot, &mut self.stats);
        self.send_multicast_repairs()?;
        let published = self.state.next_seq();
        self.server.shared.table.handle_timeout(now, published);
        Ok((self.stats.datagrams_sent - before) as usize)
    }

    /// Multicasts the ranges the repair planner chose, from the history (the
    /// original datagrams, byte for byte), as far as the send ring takes;
    /// the rest goes on in the next poll. Pacing does not apply: a repair
    /// replaces datagrams that were paced once already.
    fn send_multicast_repairs(&mut self) -> Result<(), NetError> {
        let mut staged = false;
        loop {
            let (from, to) = match self.mcast_repair {
                Some(r) => r,
                None => match self.server.shared.planner.poll_transmit() {
                    Some(r) => r,
                    None => break,
                },
            };
            self.mcast_repair = None;
            let Some((first, end, bytes)) = self.state.sealed_from(from) else {
                continue;
            };
            if first >= to {
                continue;
            }
            match self.ud.stage(bytes) {
                Ok(()) => {
                    staged = true;
                    self.stats.repair_multicast_datagrams += 1;
                }
                // Cannot happen (it was sent once); skip it.
                Err(StageError::TooLarge { .. }) => {}
                Err(StageError::BatchFull) => {
                    self.ud.post_staged(&dests_of(&self.lines))?;
                    self.mcast_repair = Some((from, to));
                    continue;
                }
                Err(StageError::RingFull) => {
                    self.mcast_repair = Some((from, to));
                    if self.ud.poll_send()? == 0 {
                        break;
                    }
                    continue;
                }
            }
            if end < to {
                self.mcast_repair = Some((end, to));
            }
        }
        if staged {
            self.ud.post_staged(&dests_of(&self.lines))?;
        }
        Ok(())
    }
}

fn dests_of(lines: &[LineTx]) -> ArrayVec<Dest<'_>, 2> {
    lines
        .iter()
        .filter(|l| l.enabled)
        .map(|l| Dest::Ud {
            ah: &l.ah,
            qpn: l.qpn,
            qkey: l.qkey,
        })
        .collect()
}

/// The handshake a connection must still complete: the responder state,
/// the bytes both proofs cover (hello, then the welcome up to its nonce),
/// and when the proof must have arrived.
struct PendingAuth {
    responder: Responder,
    ctx: [u8; HELLO_LEN + WELCOME_SIGNED_LEN],
    deadline: u64,
}

const HELLO_LEN: usize = std::mem::size_of::<Hello>();

struct ServerConn {
    /// Distinguishes the connections' requests in the repair planner.
    id: u32,
    qp: PooledQp,
    conn: Connection,
    outbox: Vec<u8>,
    out_pos: usize,
    /// `Some` until the client's proof checked: nothing is served before.
    auth: Option<PendingAuth>,
    requests: Pacer,
    snapshots: Pacer,
    /// Last time the outbox was empty or something of it was sent.
    progress_at: u64,
    peer: String,
}

/// An accepted connection waiting for ESTABLISHED.
struct PendingConn {
    qp: PooledQp,
    accepting: cm::Accepting,
    deadline: u64,
    auth: PendingAuth,
    peer: String,
}

/// What every connection's serving shares.
struct Shared {
    scratch: Vec<u8>,
    /// The encoded snapshot messages last built, and (sequence, time) of
    /// their making.
    snapshot: Vec<u8>,
    snapshot_at: Option<(u64, u64)>,
    log: LogBudget,
    /// Unicast or multicast for each retransmit request.
    planner: RepairPlanner,
    /// Admitted connections, as of the start of this poll.
    subscribers: usize,
    /// What the subscribers report.
    table: SubscriberTable,
}

struct RecoveryServer {
    addr: SocketAddr,
    /// None while the service is disabled.
    listener: Option<Listener>,
    pd: Arc<ProtectionDomain>,
    conns: Vec<ServerConn>,
    pending: Vec<PendingConn>,
    opts: RcOptions,
    key: Key,
    /// The welcome without nonce and proof: channel, flags, session, QPN, GID.
    identity: Welcome,
    limits: RecoveryServerConfig,
    max_request_messages: u64,
    shared: Shared,
    next_disconnect_check: u64,
    next_conn_id: u32,
}

/// Why a recovery connection was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DropReason {
    /// Its first message was not a valid proof.
    AuthFailed,
    /// It took nothing for too long.
    Stalled,
    /// A verbs operation failed (error completion: the peer went away, or
    /// RNR retries ran out because it posts no receive).
    Io,
}

impl RecoveryServer {
    /// Takes one connect request, if any: refuses it if the connection cap
    /// is reached or its hello is wrong, else answers it with the welcome
    /// without waiting for the handshake to finish (see [`Self::progress`]).
    fn accept(&mut self, now: u64, stats: &mut PublisherIoStats) -> Result<(), NetError> {
        let Some(listener) = &self.listener else {
            return Ok(());
        };
        let Some(req) = listener.next_request(Duration::ZERO)? else {
            return Ok(());
        };
        let peer = req.peer();
        let refusal = if self.conns.len() + self.pending.len() >= self.limits.max_connections {
            Some("busy: recovery connection limit reached")
        } else {
            match Hello::read_from_prefix(req.private_data()) {
                Err(_) => Some("not a rocebus recovery hello"),
                Ok((h, _)) if h.magic.get() != wire::HELLO_MAGIC || h.version != wire::VERSION => {
                    Some("not a rocebus recovery hello")
                }
                Ok((h, _)) if h.channel != self.identity.channel => Some("wrong channel"),
                Ok((h, _)) if h.flags != self.identity.flags => {
                    Some("auth.datagram_tag differs between publisher and subscriber")
                }
                Ok(_) => None,
            }
        };
        if let Some(reason) = refusal {
            stats.connections_refused += 1;
            if self.shared.log.allow(now) {
                tracing::warn!(%peer, reason, refused = stats.connections_refused, "recovery connection refused");
            }
            let mut msg = ArrayVec::<u8, 96>::new();
            let _ = msg.try_extend_from_slice(b"rocebus: ");
            let _ = msg.try_extend_from_slice(&reason.as_bytes()[..reason.len().min(80)]);
            req.reject(&msg)?;
            return Ok(());
        }
        let Ok((hello, _)) = Hello::read_from_prefix(req.private_data()) else {
            return Ok(());
        };
        let mut ctx = [0u8; HELLO_LEN + WELCOME_SIGNED_LEN];
        ctx[..HELLO_LEN].copy_from_slice(hello.as_bytes());
        ctx[HELLO_LEN..].copy_from_slice(self.identity.signed());
        let (responder, tr) = Responder::new(self.key.clone(), hello.nonce, &ctx);
        let mut welcome = self.identity;
        welcome.nonce = responder.nonce();
        welcome.tag = tr;
        let mut qp = PooledQp::new(
            &self.pd,
            QpType::Rc,
            PoolConfig {
                recv_slots: 32,
                recv_len: 256,
                recv_batch: 8,
                recv_low_water: 4,
                send_slots: 64,
                send_len: RC_MSG_LEN,
                signal_every: 8,
                dests_per_send: 1,
                max_inline: INLINE_MAX,
            },
        )?;
        let accepting = req.start_accept(qp.qp(), &self.opts, Access::LOCAL, welcome.as_bytes())?;
        // In RTS already: receives go up before the subscriber's proof and
        // first request can arrive.
        qp.post_receives()?;
        self.pending.push(PendingConn {
            qp,
            accepting,
            deadline: now + PENDING_TIMEOUT.as_nanos() as u64,
            auth: PendingAuth {
                responder,
                ctx,
                deadline: 0,
            },
            peer,
        });
        Ok(())
    }

    /// Moves established connections to `conns`; drops failed ones.
    /// Connection set-up only, so the Vec shuffle does not matter.
    fn progress(&mut self, now: u64, stats: &mut PublisherIoStats) {
        let l = &self.limits;
        for p in std::mem::take(&mut self.pending) {
            match p.accepting.poll() {
                Ok(cm::AcceptProgress::Done(conn)) => {
                    self.next_conn_id = self.next_conn_id.wrapping_add(1);
                    self.conns.push(ServerConn {
                        id: self.next_conn_id,
                        qp: p.qp,
                        conn,
                        outbox: Vec::with_capacity(RC_MSG_LEN * 4),
                        out_pos: 0,
                        auth: Some(PendingAuth {
                            deadline: now.saturating_add(l.handshake_timeout_ns),
                            ..p.auth
                        }),
                        requests: Pacer::new(l.requests_per_sec, l.request_burst),
                        snapshots: Pacer::new(l.snapshots_per_sec, l.snapshot_burst),
                        progress_at: now,
                        peer: p.peer,
                    });
                    stats.connections_accepted += 1;
                }
                Ok(cm::AcceptProgress::Pending(accepting)) if now < p.deadline => {
                    self.pending.push(PendingConn { accepting, ..p });
                }
                Ok(cm::AcceptProgress::Pending(_)) | Err(_) => stats.connections_failed += 1,
            }
        }
    }

    fn poll(
        &mut self,
        now: u64,
        state: &mut PublisherState,
        snapshot: &impl Snapshot,
        stats: &mut PublisherIoStats,
    ) {
        // Connection management costs a system call (poll on the rdma_cm
        // channel): at most once per CM_CHECK_NS, not per loop.
        let check_disconnect = now >= self.next_disconnect_check;
        if check_disconnect {
            if self.accept(now, stats).is_err() {
                stats.connections_failed += 1;
            }
            self.progress(now, stats);
            let step = if self.pending.is_empty() {
                CM_CHECK_NS
            } else {
                CM_STEP_NS
            };
            self.next_disconnect_check = now + step;
        }
        self.shared.subscribers = self.conns.iter().filter(|c| c.auth.is_none()).count();
        self.shared.planner.handle_timeout(now);
        let mut i = 0;
        while i < self.conns.len() {
            let c = &mut self.conns[i];
            let verdict = if c.auth.as_ref().is_some_and(|a| now >= a.deadline) {
                stats.handshake_timeouts += 1;
                Some("no proof of the shared secret in time")
            } else {
                let limits = Limits {
                    max_outbox: self.limits.max_outbox_bytes,
                    max_request_messages: self.max_request_messages,
                    snapshot_reuse_ns: self.limits.snapshot_reuse_ns,
                    stall_timeout_ns: self.limits.stall_timeout_ns,
                };
                match serve(c, now, state, snapshot, &mut self.shared, &limits, stats) {
                    Ok(()) if check_disconnect && c.conn.poll_disconnected().unwrap_or(true) => {
                        Some("")
                    }
                    Ok(()) => None,
                    Err(DropReason::AuthFailed) => {
                        stats.auth_failures += 1;
                        Some("wrong proof of the shared secret (wrong secret or a replayed handshake)")
                    }
                    Err(DropReason::Stalled) => {
                        stats.clients_stalled += 1;
                        Some("client takes nothing (no receive posted)")
                    }
                    Err(DropReason::Io) => Some(""),
                }
            };
            let Some(reason) = verdict else {
                i += 1;
                continue;
            };
            stats.connections_closed += 1;
            if !reason.is_empty() && self.shared.log.allow(now) {
                tracing::warn!(peer = %c.peer, reason, "recovery connection dropped");
            }
            self.shared.table.remove(c.id);
            self.conns.swap_remove(i);
        }
    }
}

/// The per-connection limits [`serve`] applies.
struct Limits {
    max_outbox: usize,
    max_request_messages: u64,
    snapshot_reuse_ns: u64,
    stall_timeout_ns: u64,
}

/// Answers what arrived on one connection and sends what its outbox holds.
fn serve(
    c: &mut ServerConn,
    now: u64,
    state: &mut PublisherState,
    snapshot: &impl Snapshot,
    shared: &mut Shared,
    limits: &Limits,
    stats: &mut PublisherIoStats,
) -> Result<(), DropReason> {
    let ServerConn {
        id,
        qp,
        outbox,
        out_pos,
        auth,
        requests,
        snapshots,
        progress_at,
        peer,
        ..
    } = c;
    let our_channel = state.config().channel;
    let mut auth_failed = false;
    let recv = qp.poll_recv(|mut bytes| {
        while !bytes.is_empty() && !auth_failed {
            let Ok((msg, used)) = wire::decode_recovery(bytes) else {
                stats.requests_dropped += 1;
                auth_failed = auth.is_some();
                return;
            };
            bytes = &bytes[used..];
            if let Some(a) = auth {
                // The first message must be the proof; nothing else is
                // looked at before it checked.
                match msg {
                    RecoveryMsg::AuthProof { channel, tag }
                        if channel == our_channel && a.responder.on_proof(&tag, &a.ctx).is_ok() =>
                    {
                        *auth = None;
                        // Admission only: the one allocation per subscriber.
                        shared.table.add(*id, peer.clone());
                    }
                    _ => auth_failed = true,
                }
                continue;
            }
            match msg {
                RecoveryMsg::RetransmitRequest(r) => {
                    if !requests.try_acquire(now) {
                        stats.requests_rate_limited += 1;
                        continue;
                    }
                    if outbox.len() > limits.max_outbox {
                        stats.requests_dropped += 1;
                        continue;
                    }
                    stats.retransmit_requests += 1;
                    shared.table.on_request(*id);
                    let r = if r.count > limits.max_request_messages {
                        stats.requests_clamped += 1;
                        RetransmitRequest {
                            count: limits.max_request_messages,
                            ..r
                        }
                    } else {
                        r
                    };
                    let (channel, session) = (our_channel, state.session());
                    // What is ours and still in the history may be answered
                    // on multicast; the rest goes back by unicast, with its
                    // NotAvailable.
                    let r = if r.channel == our_channel
                        && r.session == session
                        && r.from_seq >= state.oldest_available()
                    {
                        let end = r.from_seq.saturating_add(r.count);
                        match shared.planner.on_request(
                            now,
                            *id,
                            r.from_seq,
                            end,
                            shared.subscribers,
                        ) {
                            RepairDecision::Unicast { from, to } => RetransmitRequest {
                                from_seq: from,
                                count: to - from,
                                ..r
                            },
                            RepairDecision::Multicast { .. } => continue,
                            RepairDecision::Covered => {
                                stats.repair_requests_covered += 1;
                                continue;
                            }
                            RepairDecision::Suppressed => {
                                stats.repair_requests_suppressed += 1;
                                continue;
                            }
                        }
                    } else {
                        r
                    };
                    state.answer_retransmit(&r, |reply| {
                        let start = outbox.len();
                        let n = match reply {
                            RetransmitReply::Data(d) => {
                                stats.repair_unicast_datagrams += 1;
                                outbox.resize(start + RECOVERY_HEADER_LEN + d.len(), 0);
                                wire::encode_retransmit_data(
                                    &mut outbox[start..],
                                    channel,
                                    session,
                                    d,
                                )
                            }
                            RetransmitReply::NotAvailable(na) => {
                                outbox.resize(start + wire::NotAvailable::LEN, 0);
                                na.encode(&mut outbox[start..])
                            }
                        };
                        outbox.truncate(start + n.unwrap_or(0));
                    });
                }
                RecoveryMsg::SnapshotRequest { channel, .. } if channel == our_channel => {
                    if !snapshots.try_acquire(now) {
                        stats.snapshots_rate_limited += 1;
                        continue;
                    }
                    if outbox.len() > limits.max_outbox {
                        stats.requests_dropped += 1;
                        continue;
                    }
                    stats.snapshots_served += 1;
                    // One serialisation serves every request while its
                    // sequence is current, and for snapshot_reuse_ns after
                    // it was made whatever the sequence: a subscriber
                    // fetches what came after it from the history.
                    let seq = snapshot.snapshot_seq();
                    let fresh = shared.snapshot_at.is_some_and(|(at_seq, at)| {
                        at_seq == seq || now.saturating_sub(at) < limits.snapshot_reuse_ns
                    });
                    if !fresh {
                        stats.snapshots_built += 1;
                        shared.scratch.clear();
                        snapshot.write_snapshot(&mut shared.scratch);
                        shared.snapshot.clear();
                        let cache = &mut shared.snapshot;
                        encode_snapshot(
                            channel,
                            state.session(),
                            seq,
                            &shared.scratch,
                            SNAPSHOT_CHUNK,
                            |m| cache.extend_from_slice(m),
                        );
                        shared.snapshot_at = Some((seq, now));
                    }
                    outbox.extend_from_slice(&shared.snapshot);
                }
                RecoveryMsg::SubscriberStatus(st) => {
                    let published = state.next_seq();
                    match shared.table.on_status(
                        now,
                        *id,
                        &st,
                        our_channel,
                        state.session(),
                        published,
                    ) {
                        Ok(()) => stats.status_reports += 1,
                        Err(e) => {
                            stats.status_invalid += 1;
                            if shared.log.allow(now) {
                                tracing::warn!(%peer, error = %e, "subscriber status dropped");
                            }
                        }
                    }
                }
                _ => stats.requests_dropped += 1,
            }
        }
    });
    if auth_failed {
        return Err(DropReason::AuthFailed);
    }
    recv.map_err(|_| DropReason::Io)?;
    let sent_from = *out_pos;
    send_outbox(qp, outbox, out_pos).map_err(|e| match e {
        NetError::Pool(PoolError::SendCompletion {
            status: crate::verbs::WcStatus::RnrRetryExceeded,
            ..
        }) => DropReason::Stalled,
        _ => DropReason::Io,
    })?;
    if outbox.is_empty() || *out_pos != sent_from {
        *progress_at = now;
    } else if now.saturating_sub(*progress_at) >= limits.stall_timeout_ns {
        return Err(DropReason::Stalled);
    }
    Ok(())
}

/// Packs whole recovery messages of `outbox` into RC messages and posts
/// what the send ring takes.
fn send_outbox(
    qp: &mut PooledQp,
    outbox: &mut Vec<u8>,
    out_pos: &mut usize,
) -> Result<(), NetError> {
    while *out_pos < outbox.len() {
        let mut end = *out_pos;
        while let Some(len) = recovery_len(&outbox[end..]) {
            if end + len - *out_pos > qp.send_capacity() {
                break;
            }
            end += len;
        }
        if end == *out_pos {
            // Cannot happen (we encoded every message, each fits a slot);
            // drop the rest rather than loop.
            outbox.clear();
            *out_pos = 0;
            break;
        }
        match qp.stage(&outbox[*out_pos..end]) {
            Ok(()) => *out_pos = end,
            Err(StageError::BatchFull) => {
                qp.post_staged(&[Dest::Connected])?;
            }
            Err(_) => {
                if qp.poll_send()? == 0 {
                    break;
                }
            }
        }
    }
    if *out_pos == outbox.len() {
        outbox.clear();
        *out_pos = 0;
    }
    qp.post_staged(&[Dest::Connected])?;
    qp.reclaim()?;
    Ok(())
}

/// I/O counters of a subscriber (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberIoStats {
    /// Datagrams received on line A (before validation).
    pub datagrams_a: u64,
    /// Datagrams received on line B (before validation).
    pub datagrams_b: u64,
    /// RC messages received from the recovery service.
    pub recovery_messages: u64,
    /// Requests sent to the recovery service.
    pub requests_sent: u64,
    /// Requests dropped because the RC send ring was full (asked again on
    /// timeout).
    pub requests_dropped: u64,
    /// Times the recovery connection was found dead (error completion or
    /// disconnect).
    pub connections_lost: u64,
    /// Reconnections to the recovery service that succeeded.
    pub reconnects: u64,
    /// Reconnection attempts that failed (each followed by a longer wait).
    pub reconnect_failures: u64,
    /// Recovery connections dropped because [`DEAD_LINK_TIMEOUTS`] requests
    /// in a row went unanswered (counted in `connections_lost` too).
    pub unanswered_links: u64,
    /// Datagrams dropped unparsed because they came from another queue pair
    /// or GID than the publisher announced over the recovery connection.
    pub foreign_source_dropped: u64,
    /// Reconnections whose admission failed (the publisher's proof was
    /// wrong, or the two sides disagree on the channel or datagram tags).
    pub auth_failures: u64,
    /// Status reports sent to the publisher.
    pub status_sent: u64,
}

struct LineRx {
    line: Line,
    qp: PooledQp,
    membership: McastMembership,
}

/// The subscriber's recovery connection. Variant fields are dropped in
/// order: the queue pair before the rdma_cm id it was connected through.
enum Link {
    Up {
        rc: PooledQp,
        conn: Connection,
    },
    Connecting {
        rc: PooledQp,
        connecting: cm::Connecting,
        initiator: Initiator,
        hello: Hello,
    },
    Down,
}

/// What the publisher's welcome told an admitted subscriber.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    session: u64,
    source: (Gid, u32),
    proof: Tag,
}

fn hello_for(channel: u16, tags: bool, initiator: &Initiator) -> Hello {
    Hello {
        magic: wire::HELLO_MAGIC.into(),
        version: wire::VERSION,
        flags: if tags { FLAG_DATAGRAM_TAG } else { 0 },
        channel: channel.into(),
        reserved: 0.into(),
        nonce: initiator.nonce(),
    }
}

/// Checks the publisher's welcome against our hello: its proof of the
/// secret (over both), the channel and the tag setting.
fn admit(
    initiator: &Initiator,
    hello: &Hello,
    welcome: &[u8],
    publisher: SocketAddr,
) -> Result<Admitted, NetError> {
    let fail = |reason| NetError::Admission { publisher, reason };
    let Ok((w, _)) = Welcome::read_from_prefix(welcome) else {
        return Err(fail("the answer is not a rocebus recovery welcome"));
    };
    if w.magic.get() != wire::WELCOME_MAGIC || w.version != wire::VERSION {
        return Err(fail("the answer is not a rocebus recovery welcome"));
    }
    let mut ctx = [0u8; HELLO_LEN + WELCOME_SIGNED_LEN];
    ctx[..HELLO_LEN].copy_from_slice(hello.as_bytes());
    ctx[HELLO_LEN..].copy_from_slice(w.signed());
    let Ok((proof, _)) = initiator.on_response(&w.nonce, &w.tag, &ctx) else {
        return Err(fail(
            "the publisher's proof of the shared secret is wrong (auth.secret differs?)",
        ));
    };
    if w.channel != hello.channel {
        return Err(fail("the publisher serves another channel"));
    }
    if w.flags != hello.flags {
        return Err(fail(
            "auth.datagram_tag differs between publisher and subscriber",
        ));
    }
    Ok(Admitted {
        session: w.session.get(),
        source: (Gid(w.gid), w.qpn.get()),
        proof,
    })
}

/// Sends the proof as the connection's first message.
fn send_proof(rc: &mut PooledQp, channel: u16, proof: &Tag) -> Result<(), NetError> {
    let mut msg = [0u8; wire::AUTH_PROOF_LEN];
    // The buffer is the message's size: encoding cannot fail.
    let n = wire::encode_auth_proof(&mut msg, channel, proof).unwrap_or(0);
    // A fresh connection's send ring is empty: the send is taken.
    rc.send(&msg[..n], &[Dest::Connected])?;
    Ok(())
}

/// Everything needed to (re)connect to the recovery service.
struct Reconnect {
    pd: Arc<ProtectionDomain>,
    key: Key,
    channel: u16,
    tags: bool,
    publisher: SocketAddr,
    local: IpAddr,
    opts: RcOptions,
    min_ns: u64,
    max_ns: u64,
    backoff_ns: u64,
    /// Next look at connection management (attempt, handshake step, or
    /// disconnect check).
    next_check: u64,
}

fn recovery_qp(pd: &Arc<ProtectionDomain>) -> Result<PooledQp, NetError> {
    Ok(PooledQp::new(
        pd,
        QpType::Rc,
        PoolConfig {
            recv_slots: 128,
            recv_len: RC_MSG_LEN,
            recv_batch: 16,
            recv_low_water: 16,
            send_slots: 32,
            send_len: 256,
            signal_every: 8,
            dests_per_send: 1,
            max_inline: INLINE_MAX,
        },
    )?)
}

/// A market-data subscriber for one channel. See the module documentation.
pub struct McastSubscriber {
    state: SubscriberState,
    lines: ArrayVec<LineRx, 2>,
    /// The publisher's GID and UD queue pair, as its welcome announced:
    /// datagrams from anyone else are dropped.
    source: (Gid, u32),
    link: Link,
    reconnect: Reconnect,
    stats: SubscriberIoStats,
    /// Request timeouts in a row with nothing received over the link, and
    /// the counters they were last compared with.
    silent_timeouts: u64,
    /// Turns since the recovery connection's CQ was last polled.
    idle_link_turns: u32,
    /// When to report position and rate to the publisher.
    status: StatusReporter,
    seen_timeouts: u64,
    seen_answers: u64,
    seen_next: u64,
}

impl std::fmt::Debug for McastSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McastSubscriber")
            .field("phase", &self.state.phase())
            .field("next_seq", &self.state.next_seq())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl McastSubscriber {
    /// Opens the device owning `local`, joins the channel's line(s) with
    /// receives posted, and connects to the recovery service at
    /// `publisher`:`channel.port`, where it proves the shared secret and
    /// learns the session and the source to accept datagrams from, waiting
    /// for the connection (up to 10 s when the publisher does not answer).
    /// [`start`](Self::start) does not wait.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::join_lines(cfg, channel, local, publisher)?;
        let publisher = s.reconnect.publisher;
        let resolved = cm::resolve(publisher, Some(local), CM_TIMEOUT)?;
        let mut rc = recovery_qp(&s.reconnect.pd)?;
        let initiator = Initiator::new(s.reconnect.key.clone());
        let hello = hello_for(channel, cfg.auth.datagram_tag, &initiator);
        let (conn, welcome) = resolved.connect(
            rc.qp(),
            &s.reconnect.opts,
            Access::LOCAL,
            hello.as_bytes(),
            CM_TIMEOUT,
        )?;
        let admitted = match admit(&initiator, &hello, &welcome, publisher) {
            Ok(a) => a,
            Err(e) => {
                let _ = conn.disconnect();
                return Err(e);
            }
        };
        rc.post_receives()?;
        send_proof(&mut rc, channel, &admitted.proof)?;
        s.state.announce_session(now_ns(), admitted.session);
        s.source = admitted.source;
        s.link = Link::Up { rc, conn };
        Ok(s)
    }

    /// As [`new`](Self::new) without waiting for the recovery service: the
    /// lines are joined (on RoCE a local operation, no peer involved) and
    /// multicast is received at once; the recovery connection starts down
    /// and is made by [`poll`](Self::poll), with the same back-off as a
    /// reconnect after a lost link (a publisher that is down costs the
    /// caller nothing). Until it is up the subscriber behaves as after a
    /// lost link: gaps cannot be recovered meanwhile.
    pub fn start(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::join_lines(cfg, channel, local, publisher)?;
        s.state.set_recovery_link(0, false);
        Ok(s)
    }

    /// Everything but the recovery connection, which is left down.
    fn join_lines(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let ch = channel_of(cfg, channel)?;
        warn_if_open(cfg, channel);
        let ctx = Context::open_for_ip(local)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let mut lines = ArrayVec::new();
        for (line, group) in [(Line::A, Some(ch.line_a)), (Line::B, ch.line_b)] {
            let Some(group) = group else { continue };
            let m = McastMembership::join(local, group, false, CM_TIMEOUT)?;
            cm::check_device(&ctx, m.device_name())?;
            let mut qp = PooledQp::new(
                &pd,
                QpType::Ud,
                PoolConfig {
                    recv_slots: cfg.receive.depth,
                    recv_len: cfg.max_datagram_payload,
                    recv_batch: cfg.receive.replenish_batch,
                    recv_low_water: cfg.receive.low_water,
                    send_slots: 0,
                    send_len: 0,
                    signal_every: 1,
                    dests_per_send: 1,
                    max_inline: INLINE_MAX,
                },
            )?;
            if lines
                .first()
                .is_some_and(|l: &LineRx| l.membership.mgid() == m.mgid())
            {
                return Err(NetError::LinesShareGroup {
                    channel,
                    mgid: m.mgid().to_string(),
                });
            }
            qp.qp().activate_ud(m.port_num(), ch.qkey, 0)?;
            m.attach(qp.qp())?;
            qp.post_receives()?;
            lines.push(LineRx {
                line,
                qp,
                membership: m,
            });
        }
        let publisher = SocketAddr::new(publisher, ch.port);
        let key = cfg.recovery_key();
        // Until a publisher's welcome names its source and session, every
        // datagram counts as foreign and none is delivered.
        let mut state = SubscriberState::new(cfg.subscriber(channel));
        state.set_datagram_key(cfg.datagram_key());
        Ok(McastSubscriber {
            state,
            lines,
            source: (Gid::default(), 0),
            link: Link::Down,
            reconnect: Reconnect {
                pd,
                key,
                channel,
                tags: cfg.auth.datagram_tag,
                publisher,
                local,
                opts: rc_options(cfg),
                min_ns: cfg.recovery.reconnect_min_ns,
                max_ns: cfg.recovery.reconnect_max_ns,
                backoff_ns: cfg.recovery.reconnect_min_ns,
                next_check: 0,
            },
            stats: SubscriberIoStats::default(),
            silent_timeouts: 0,
            idle_link_turns: 0,
            status: StatusReporter::new(cfg.recovery.status_interval_ns),
            seen_timeouts: 0,
            seen_answers: 0,
            seen_next: 0,
        })
    }

    /// Each line's multicast GID, as its join returned it.
    pub fn line_groups(&self) -> ArrayVec<(Line, crate::verbs::Gid), 2> {
        self.lines
            .iter()
            .map(|l| (l.line, l.membership.mgid()))
            .collect()
    }
    /// The protocol state.
    pub fn state(&self) -> &SubscriberState {
        &self.state
    }
    /// Protocol counters (gaps, recoveries, duplicates, ...).
    pub fn counters(&self) -> SubscriberCounters {
        self.state.counters()
    }
    /// I/O counters.
    pub fn io_stats(&self) -> SubscriberIoStats {
        self.stats
    }
    /// Closes the recovery connection (the publisher sees it go). A later
    /// [`poll`](Self::poll) treats it as lost and reconnects.
    pub fn disconnect(&self) -> Result<(), NetError> {
        match &self.link {
            Link::Up { conn, .. } => Ok(conn.disconnect()?),
            _ => Ok(()),
        }
    }
    /// Whether the recovery connection is up.
    pub fn recovery_connected(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }
    /// Next event (unrecoverable loss, resync, snapshot applied, ...).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.state.poll_event()
    }

    /// Does all pending work once: takes received datagrams from every line
    /// and recovery messages from RC into the state machine (delivering in
    /// order to `app`), handles timers and sends the requests the state
    /// machine asks for. Returns the valid datagrams (from the publisher,
    /// of its session, well formed and tagged if tags are on) and recovery
    /// messages taken: only those are a sign of life. Never blocks,
    /// allocates or logs per message.
    ///
    /// A failing recovery connection is not an error here: it is reported
    /// through [`Event::RecoveryLost`] and re-established in later polls.
    /// Errors are the multicast receive side's only.
    pub fn poll<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        app: &mut A,
    ) -> Result<usize, NetError> {
        let mut taken = 0;
        let state = &mut self.state;
        let (gid, qpn) = self.source;
        let mut foreign = 0;
        for l in &mut self.lines {
            let line = l.line;
            let r = l.qp.poll_recv_from(|src, bytes| {
                if src.qpn != qpn || src.gid != gid {
                    foreign += 1;
                } else if state.on_datagram(now, line, bytes, app) {
                    taken += 1;
                }
            })?;
            if r.low {
                state.receive_queue_low();
            }
            match line {
                Line::A => self.stats.datagrams_a += r.received as u64,
                Line::B => self.stats.datagrams_b += r.received as u64,
            }
        }
        self.stats.foreign_source_dropped += foreign;
        let mut link_ok = true;
        // The recovery service only answers: its CQ is polled on every turn
        // while an answer may be coming, otherwise on every
        // IDLE_LINK_POLLS-th turn (for the error completions of a failed
        // connection), so an idle subscriber's turn costs one CQ poll per line.
        self.idle_link_turns += 1;
        let poll_link = state.expects_recovery() || self.idle_link_turns >= IDLE_LINK_POLLS;
        if let (true, Link::Up { rc, .. }) = (poll_link, &mut self.link) {
            self.idle_link_turns = 0;
            match rc.poll_recv(|bytes| state.on_recovery(now, bytes, app)) {
                Ok(r) => {
                    self.stats.recovery_messages += r.received as u64;
                    taken += r.received;
                }
                Err(_) => link_ok = false,
            }
        }
        if state.poll_timeout().is_some_and(|t| t <= now) {
            state.handle_timeout(now, app);
        }
        // A link that takes requests but never answers (the publisher's end
        // is gone without a disconnect reaching us) is dead: after
        // DEAD_LINK_TIMEOUTS rounds of timeouts in a row with nothing
        // received, drop it and reconnect.
        // Delivery that moved on is an answer too: a request covered by a
        // multicast repair is answered on the lines, not over the link.
        let timeouts = state.timeouts();
        if self.stats.recovery_messages != self.seen_answers
            || state.next_seq() != self.seen_next
            || !matches!(self.link, Link::Up { .. })
        {
            self.seen_answers = self.stats.recovery_messages;
            self.seen_next = state.next_seq();
            self.silent_timeouts = 0;
        }
        if timeouts != self.seen_timeouts {
            self.seen_timeouts = timeouts;
            self.silent_timeouts += 1;
            if self.silent_timeouts >= DEAD_LINK_TIMEOUTS {
                self.silent_timeouts = 0;
                self.stats.unanswered_links += 1;
                link_ok = false;
            }
        }
        if let Link::Up { rc, .. } = &mut self.link {
            if self.status.due(now) {
                let c = state.counters();
                if let Some(st) = self.status.poll_transmit(
                    now,
                    self.reconnect.channel,
                    state.session(),
                    state.next_seq(),
                    c.delivered,
                    c.retransmit_requests,
                ) {
                    link_ok &= send_status(rc, &st, &mut self.stats).is_ok();
                }
            }
            link_ok &= send_requests(rc, state, &mut self.stats).is_ok();
        }
        if !link_ok {
            self.link_lost(now);
        }
        if now >= self.reconnect.next_check {
            self.manage_link(now);
        }
        Ok(taken)
    }

    fn link_lost(&mut self, now: u64) {
        self.link = Link::Down;
        self.stats.connections_lost += 1;
        self.state.set_recovery_link(now, false);
        self.reconnect.backoff_ns = self.reconnect.min_ns;
        self.reconnect.next_check = now + self.reconnect.min_ns;
    }

    fn reconnect_failed(&mut self, now: u64) {
        self.link = Link::Down;
        self.stats.reconnect_failures += 1;
        let r = &mut self.reconnect;
        r.next_check = now + r.backoff_ns;
        r.backoff_ns = (r.backoff_ns * 2).min(r.max_ns);
    }

    /// Connection management, at most once per [`CM_CHECK_NS`] (more often
    /// while a handshake is under way): disconnect check, reconnect
    /// attempts with back-off, handshake steps. Nothing here waits.
    fn manage_link(&mut self, now: u64) {
        let r = &mut self.reconnect;
        // The usual case, an established link, is checked in place: moving
        // the link out and back would copy its queue pair's state twice.
        if let Link::Up { conn, .. } = &self.link {
            if conn.poll_disconnected().unwrap_or(true) {
                return self.link_lost(now);
            }
            r.next_check = now + CM_CHECK_NS;
            return;
        }
        match std::mem::replace(&mut self.link, Link::Down) {
            // Handled above; put back as it was.
            up @ Link::Up { .. } => self.link = up,
            Link::Down => {
                let started = recovery_qp(&r.pd).and_then(|rc| {
                    let connecting =
                        cm::start_connect(r.publisher, Some(r.local), CONNECT_TIMEOUT)?;
                    Ok((rc, connecting))
                });
                match started {
                    Ok((rc, connecting)) => {
                        let initiator = Initiator::new(r.key.clone());
                        let hello = hello_for(r.channel, r.tags, &initiator);
                        self.link = Link::Connecting {
                            rc,
                            connecting,
                            initiator,
                            hello,
                        };
                        r.next_check = now + CM_STEP_NS;
                    }
                    Err(_) => self.reconnect_failed(now),
                }
            }
            Link::Connecting {
                mut rc,
                connecting,
                initiator,
                hello,
            } => match connecting.poll(rc.qp(), &r.opts, Access::LOCAL, hello.as_bytes()) {
                Ok(cm::ConnectProgress::Pending(connecting)) => {
                    self.link = Link::Connecting {
                        rc,
                        connecting,
                        initiator,
                        hello,
                    };
                    r.next_check = now + CM_STEP_NS;
                }
                Ok(cm::ConnectProgress::Done(conn, welcome)) => {
                    let admitted = match admit(&initiator, &hello, &welcome, r.publisher) {
                        Ok(a) => a,
                        Err(_) => {
                            let _ = conn.disconnect();
                            self.stats.auth_failures += 1;
                            return self.reconnect_failed(now);
                        }
                    };
                    if rc.post_receives().is_err()
                        || send_proof(&mut rc, r.channel, &admitted.proof).is_err()
                    {
                        return self.reconnect_failed(now);
                    }
                    self.link = Link::Up { rc, conn };
                    self.source = admitted.source;
                    self.stats.reconnects += 1;
                    r.backoff_ns = r.min_ns;
                    r.next_check = now + CM_CHECK_NS;
                    // A restarted publisher announces its new session here
                    // (reset and resync); the same one changes nothing.
                    self.state.announce_session(now, admitted.session);
                    self.state.set_recovery_link(now, true);
                }
                Err(_) => self.reconnect_failed(now),
            },
        }
    }
}

/// Sends a status report over the recovery connection (dropped, counted,
/// if the send ring is full: the next one follows within an interval).
fn send_status(
    rc: &mut PooledQp,
    st: &SubscriberStatus,
    stats: &mut SubscriberIoStats,
) -> Result<(), NetError> {
    if rc
        .stage_with(SubscriberStatus::LEN, |buf| st.encode(buf).unwrap_or(0))
        .is_ok()
    {
        stats.status_sent += 1;
        rc.post_staged(&[Dest::Connected])?;
    } else {
        stats.requests_dropped += 1;
    }
    Ok(())
}

/// Sends what the state machine asks for over the recovery connection.
fn send_requests(
    rc: &mut PooledQp,
    state: &mut SubscriberState,
    stats: &mut SubscriberIoStats,
) -> Result<(), NetError> {
    let mut staged = false;
    while let Some(req) = state.poll_transmit() {
        let mut res = rc.stage_with(64, |buf| req.encode(buf).unwrap_or(0));
        if res == Err(StageError::RingFull) {
            rc.poll_send()?;
            res = rc.stage_with(64, |buf| req.encode(buf).unwrap_or(0));
        }
        if res.is_ok() {
            staged = true;
            stats.requests_sent += 1;
        } else {
            stats.requests_dropped += 1;
        }
    }
    if staged {
        rc.post_staged(&[Dest::Connected])?;
    }
    rc.reclaim()?;
    Ok(())
}

type CounterField = fn(&SubscriberCounters, &SubscriberIoStats) -> u64;

/// The subscriber counters worth watching live, by label.
const EXPORTED: &[(&str, CounterField)] = &[
    ("received_a", |c, _| c.received_a),
    ("received_b", |c, _| c.received_b),
    ("received_retransmit", |c, _| c.received_retransmit),
    ("duplicates_a", |c, _| c.duplicates_a),
    ("duplicates_b", |c, _| c.duplicates_b),
    ("delivered", |c, _| c.delivered),
    ("gaps_detected", |c, _| c.gaps_detected),
    ("messages_recovered", |c, _| c.messages_recovered),
    ("retransmit_requests", |c, _| c.retransmit_requests),
    ("timeouts", |c, _| c.timeouts),
    ("unrecoverable", |c, _| c.unrecoverable),
    ("snapshots_applied", |c, _| c.snapshots_applied),
    ("receive_queue_low", |c, _| c.receive_queue_low),
    ("malformed_dropped", |c, _| c.malformed_dropped),
    ("foreign_source_dropped", |_, io| io.foreign_source_dropped),
    ("wrong_session_dropped", |c, _| c.wrong_session_dropped),
    ("bad_tag_dropped", |c, _| c.bad_tag_dropped),
    ("requests_dropped", |_, io| io.requests_dropped),
    ("gaps_filled_by_other_line", |c, _| {
        c.gaps_filled_by_other_line
    }),
    ("connections_lost", |_, io| io.connections_lost),
    ("reconnects", |_, io| io.reconnects),
];

/// A subscriber's counters published in a shared-memory
/// [`CountersFile`](crate::counters::CountersFile) (what `rocebus stat`
/// reads). Counters are allocated once; [`update`](Self::update) only stores
/// values, so it can run every few milliseconds from the polling loop.
pub struct SubscriberCountersExport {
    counters: Vec<(crate::counters::Counter, CounterField)>,
}

impl std::fmt::Debug for SubscriberCountersExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubscriberCountersExport")
            .field("counters", &self.counters.len())
            .finish()
    }
}

impl SubscriberCountersExport {
    /// Allocates `<prefix>.<name>` counters in `file` (a
    /// [`CountersFile`](crate::counters::CountersFile), or
    /// [`LocalCounters`](crate::counters::LocalCounters)).
    pub fn new<A: crate::counters::AllocateCounter + ?Sized>(
        file: &A,
        prefix: &str,
    ) -> Result<Self, crate::counters::CountersError> {
        let counters = EXPORTED
            .iter()
            .map(|(name, field)| {
                let label = format!("{prefix}.{name}");
                let c = file.allocate_counter(&label, crate::counters::Kind::Counter, 0)?;
                Ok((c, *field))
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        Ok(SubscriberCountersExport { counters })
    }

    /// Stores the subscriber's current values.
    pub fn update(&self, s: &McastSubscriber) {
        let (c, io) = (s.counters(), s.io_stats());
        for (counter, field) in &self.counters {
            counter.set(field(&c, &io));
        }
    }
}

/// Counters of one subscriber slot of a [`PublisherCountersExport`].
struct SlotCounters {
    ipv4: crate::counters::Counter,
    position: crate::counters::Counter,
    lag: crate::counters::Counter,
    msgs_per_sec: crate::counters::Counter,
    repairs_asked: crate::counters::Counter,
}

/// A publisher's counters in a shared-memory
/// [`CountersFile`](crate::counters::CountersFile) (what `rocebus stat`
/// reads): its repair counters, and one row of gauges per subscriber it sees
/// (`<prefix>.sub<k>.ipv4` (shown as an address by `rocebus stat`),
/// `.position`, `.lag`, `.msgs_per_sec`, `.repairs_asked`), for the first
/// `slots` subscribers in order of admission; unused slots read 0.
/// Allocated once; [`update`](Self::update) only stores values.
pub struct PublisherCountersExport {
    totals: Vec<(crate::counters::Counter, PublisherField)>,
    subscribers: crate::counters::Counter,
    slots: Vec<SlotCounters>,
}

impl std::fmt::Debug for PublisherCountersExport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherCountersExport")
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

type PublisherField = fn(&PublisherIoStats) -> u64;

/// The publisher-wide counters exported, by label.
const PUBLISHER_EXPORTED: &[(&str, PublisherField)] = &[
    ("datagrams_sent", |s| s.datagrams_sent),
    ("retransmit_requests", |s| s.retransmit_requests),
    ("repair_unicast_datagrams", |s| s.repair_unicast_datagrams),
    ("repair_multicast_datagrams", |s| {
        s.repair_multicast_datagrams
    }),
    ("repair_requests_covered", |s| s.repair_requests_covered),
    ("repair_requests_suppressed", |s| {
        s.repair_requests_suppressed
    }),
    ("status_reports", |s| s.status_reports),
    ("status_invalid", |s| s.status_invalid),
];

impl PublisherCountersExport {
    /// Allocates the counters under `prefix` in `file`, with `slots`
    /// subscriber rows.
    pub fn new<A: crate::counters::AllocateCounter + ?Sized>(
        file: &A,
        prefix: &str,
        slots: usize,
    ) -> Result<Self, crate::counters::CountersError> {
        use crate::counters::Kind;
        let totals = PUBLISHER_EXPORTED
            .iter()
            .map(|(name, field)| {
                let c = file.allocate_counter(&format!("{prefix}.{name}"), Kind::Counter, 0)?;
                Ok((c, *field))
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        let subscribers =
            file.allocate_counter(&format!("{prefix}.subscribers"), Kind::Gauge, 0)?;
        let slots = (0..slots)
            .map(|k| {
                let g = |name: &str, kind| {
                    file.allocate_counter(&format!("{prefix}.sub{k}.{name}"), kind, 0)
                };
                Ok(SlotCounters {
                    ipv4: g("ipv4", Kind::Gauge)?,
                    position: g("position", Kind::Gauge)?,
                    lag: g("lag", Kind::Gauge)?,
                    msgs_per_sec: g("msgs_per_sec", Kind::Gauge)?,
                    repairs_asked: g("repairs_asked", Kind::Counter)?,
                })
            })
            .collect::<Result<_, crate::counters::CountersError>>()?;
        Ok(PublisherCountersExport {
            totals,
            subscribers,
            slots,
        })
    }

    /// Stores the publisher's current values.
    pub fn update(&self, p: &McastPublisher) {
        let io = p.io_stats();
        for (c, field) in &self.totals {
            c.set(field(&io));
        }
        let rows = p.subscribers();
        self.subscribers.set(rows.len() as u64);
        for (i, slot) in self.slots.iter().enumerate() {
            let r = rows.get(i);
            let ipv4 = match r.and_then(|r| r.addr) {
                Some(IpAddr::V4(a)) => u64::from(u32::from(a)),
                _ => 0,
            };
            slot.ipv4.set(ipv4);
            slot.position.set(r.map_or(0, |r| r.next_seq));
            slot.lag.set(r.map_or(0, |r| r.lag));
            slot.msgs_per_sec.set(r.map_or(0, |r| r.msgs_per_sec));
            slot.repairs_asked.set(r.map_or(0, |r| r.requests_received));
        }
    }
}
