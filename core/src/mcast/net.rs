//! The market-data path on real RDMA: the thin I/O shell around the
//! I/O-free state machines of [`super`].
//!
//! - [`McastPublisher`]: one UD queue pair sending what the
//!   [`SendSchedule`] lets out (flushed datagrams of the [`PublisherState`]'s
//!   history, paced; heartbeats when idle) to line A and (optionally) line
//!   B, joined through rdma_cm; and the recovery port: an rdma_cm
//!   [`Listener`] on the channel's port whose RC connections carry the
//!   recovery messages of [`super::wire`] to and from the
//!   [`RecoveryServer`], which decides admission, limits, answers and drops
//!   (see [`super::server`]).
//! - [`McastSubscriber`]: one UD queue pair per line with receives kept
//!   posted, one RC connection to the publisher's recovery service; feeds the
//!   [`SubscriberState`] and sends the requests it asks for.
//!
//! Admission and sources: the recovery connection is admitted by the
//! challenge-response of [`crate::auth`] (see [`super::wire`]'s "Recovery
//! admission"); through it the subscriber learns the publisher's session,
//! UD queue pair and GID, and drops (counts) every datagram from another
//! queue pair or GID before it is parsed. Both sides use the channel's
//! configured `qkey`. What the recovery port lets any client cost is the
//! [`RecoveryServer`]'s to decide; this shell reports to it what only the
//! transport sees (a connection established, an error completion, RNR
//! retries exhausted, a disconnect) and releases what it closes.
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

use super::config::{ChannelConfig, McastConfig};
use super::publisher::{ClaimError, Output, PublisherState};
use super::repair::RepairCounters;
use super::schedule::{SendSchedule, Transmit};
use super::server::{refusal_message, Admission, ClientHandshake, RecoveryServer, ServerConfig};
use super::snapshot::{Handler, Snapshot, SnapshotSink};
use super::status::{PublisherEvent, StatusReporter, SubscriberRow};
use super::subscriber::{Event, LinkWatch, SubscriberCounters, SubscriberState};
use super::wire::SubscriberStatus;
use super::wire::{self, Line, Welcome};
use crate::auth::Key;
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
pub use super::subscriber::DEAD_LINK_TIMEOUTS;

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
    /// When datagrams and heartbeats go out.
    schedule: SendSchedule,
    // Field order: the queue pairs go before what they reference.
    ud: PooledQp,
    lines: ArrayVec<LineTx, 2>,
    server: RecoveryServer,
    io: RecoveryIo,
    /// The multicast retransmit in progress: `[from, to)` still to send.
    mcast_repair: Option<(u64, u64)>,
    stats: PublisherIoStats,
}

impl std::fmt::Debug for McastPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McastPublisher")
            .field("session", &self.state.session())
            .field("next_seq", &self.state.next_seq())
            .field("sent_upto", &self.schedule.sent_upto())
            .field("stats", &self.io_stats())
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
        let identity = Welcome::identity(
            channel,
            session,
            cfg.auth.datagram_tag,
            ud.qp().qpn(),
            gid_of(local).0,
        );
        let server = RecoveryServer::new(
            ServerConfig {
                limits: cfg.recovery_server,
                max_request_messages: cfg.recovery.max_request_messages,
                snapshot_chunk: SNAPSHOT_CHUNK,
                setup_timeout_ns: PENDING_TIMEOUT.as_nanos() as u64,
                outbox_capacity: RC_MSG_LEN * 4,
            },
            cfg.recovery_key(),
            identity,
        );
        Ok(McastPublisher {
            schedule: SendSchedule::new(
                state.next_seq(),
                cfg.pacing.max_datagrams_per_sec,
                cfg.pacing.burst,
                cfg.heartbeat_interval_ns,
            ),
            state,
            ud,
            lines,
            mcast_repair: None,
            server,
            io: RecoveryIo {
                addr,
                listener: Some(listener),
                pd,
                conns: Vec::new(),
                pending: Vec::new(),
                opts: server_rc_options(cfg),
                next_cm_check: 0,
            },
            stats: PublisherIoStats::default(),
        })
    }

    /// The protocol state (sequence, history, counters).
    pub fn state(&self) -> &PublisherState {
        &self.state
    }
    /// The recovery service's state machine (connections, counters).
    pub fn recovery_server(&self) -> &RecoveryServer {
        &self.server
    }
    /// I/O counters (the shell's, the schedule's and the recovery
    /// service's, in one value).
    pub fn io_stats(&self) -> PublisherIoStats {
        let (s, k) = (self.schedule.counters(), self.server.counters());
        PublisherIoStats {
            datagrams_sent: s.datagrams_sent,
            unsent_overwritten: s.unsent_overwritten,
            connections_accepted: k.connections_accepted,
            connections_failed: k.connections_failed + self.stats.connections_failed,
            connections_closed: k.connections_closed,
            retransmit_requests: k.retransmit_requests,
            snapshots_served: k.snapshots_served,
            requests_dropped: k.requests_dropped,
            connections_refused: k.connections_refused,
            auth_failures: k.auth_failures,
            handshake_timeouts: k.handshake_timeouts,
            requests_rate_limited: k.requests_rate_limited,
            snapshots_rate_limited: k.snapshots_rate_limited,
            requests_clamped: k.requests_clamped,
            snapshots_built: k.snapshots_built,
            clients_stalled: k.clients_stalled,
            repair_unicast_datagrams: k.repair_unicast_datagrams,
            repair_requests_covered: k.repair_requests_covered,
            repair_requests_suppressed: k.repair_requests_suppressed,
            status_reports: k.status_reports,
            status_invalid: k.status_invalid,
            ..self.stats
        }
    }
    /// Every admitted subscriber: address, position, lag, rate, requests,
    /// as of the last poll (see [`super::status`]).
    pub fn subscribers(&self) -> &[SubscriberRow] {
        self.server.subscribers()
    }
    /// The next event about subscribers (one fell behind the
    /// `recovery_server.lag_alert_messages` bound, or caught up again).
    pub fn poll_event(&mut self) -> Option<PublisherEvent> {
        self.server.poll_event()
    }
    /// How retransmit requests were answered (unicast, multicast, covered).
    pub fn repair_counters(&self) -> RepairCounters {
        self.server.repair_counters()
    }
    /// Recovery connections currently open (admitted or still proving
    /// themselves; not those still being set up).
    pub fn connections(&self) -> usize {
        self.server.connections()
    }
    /// Recovery connections that proved the shared secret.
    pub fn admitted_connections(&self) -> usize {
        self.server.admitted_connections()
    }
    /// Stops the recovery service (closing its connections and no longer
    /// listening) or starts it again, e.g. for maintenance or to test how
    /// subscribers live without it. Multicast goes on either way.
    pub fn set_recovery_enabled(&mut self, enabled: bool) -> Result<(), NetError> {
        let io = &mut self.io;
        if !enabled {
            self.server.close_all();
            io.conns.clear();
            io.pending.clear();
            io.listener = None;
        } else if io.listener.is_none() {
            io.listener = Some(Listener::bind(io.addr)?);
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
        let p = self.state.publish_flushing(msg)?;
        self.send_output(now, p.output);
        Ok(p.seq)
    }

    /// Claims `len` bytes for the next message (flushing a full datagram
    /// first): write the message into the slice, then
    /// [`commit`](Self::commit). A claim larger than one datagram (up to
    /// `max_message_bytes`) is staged and fragmented at commit.
    pub fn try_claim(&mut self, now: u64, len: usize) -> Result<&mut [u8], PublishError> {
        let output = self.state.make_room(len);
        self.send_output(now, output);
        Ok(self.state.try_claim(len)?)
    }

    /// Commits the claimed message and returns its sequence (`None` if
    /// nothing was claimed). A large message's fragments are sent as pacing
    /// allows, here and in later polls.
    pub fn commit(&mut self, now: u64) -> Option<u64> {
        let p = self.state.commit_flushing()?;
        self.send_output(now, p.output);
        Some(p.seq)
    }

    /// Sends what a publishing call sealed: a datagram sealed to make room
    /// joins the current batch of sends; fragments are posted at once.
    fn send_output(&mut self, now: u64, output: Output) {
        match output {
            Output::Nothing => {}
            Output::Sealed => self.pump(now),
            Output::Fragments => {
                self.pump(now);
                // As in pump, a failed post is left to the next one.
                let _ = self.ud.post_staged(&dests_of(&self.lines));
            }
        }
    }

    /// Flushed datagrams not sent yet (waiting for pacing or send slots).
    pub fn unsent_datagrams(&self) -> u64 {
        self.schedule.unsent_datagrams(&self.state)
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
        let Some((first, end, bytes)) = self.state.sealed_from(self.schedule.sent_upto()) else {
            return Ok(false);
        };
        if end != self.state.unflushed_seq()
            || bytes.len() > self.ud.max_inline()
            || !self.schedule.try_direct(now, first)
        {
            return Ok(false);
        }
        // Cannot decline now (nothing staged, it fits, a slot is free) but
        // for no enabled line, where the datagram counts as sent, as in pump.
        self.ud.send_inline(bytes, &dests_of(&self.lines))?;
        self.schedule.sent(now, end);
        Ok(true)
    }

    /// Stages what the schedule lets out (flushed datagrams as pacing
    /// allows, a heartbeat when one is due) as the send ring allows; posts
    /// full batches. Errors are left to the next post.
    fn pump(&mut self, now: u64) {
        while let Some(t) = self.schedule.poll_transmit(now, &mut self.state) {
            let (end, bytes) = match t {
                Transmit::Heartbeat(hb) => {
                    if self.ud.stage(hb).is_ok() {
                        self.stats.heartbeats_sent += 1;
                    }
                    continue;
                }
                Transmit::Datagram { end, bytes } => (end, bytes),
            };
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
                // Cannot be sent, ever: counts as sent.
                Err(StageError::TooLarge { .. }) => {}
            }
            self.schedule.sent(now, end);
        }
    }

    /// Does all pending work once: flushes on the batching timer, multicasts,
    /// sends a heartbeat when idle, reclaims send slots, and serves recovery
    /// (accepting connections, answering retransmit requests from the
    /// history and snapshot requests from `snapshot`). Returns the datagrams
    /// sent. Never blocks.
    pub fn poll(&mut self, now: u64, snapshot: &impl Snapshot) -> Result<usize, NetError> {
        let before = self.schedule.counters().datagrams_sent;
        self.state.poll_flush(now);
        self.schedule.handle_timeout(now, &self.state);
        self.pump(now);
        if self.ud.has_staged() {
            self.ud.post_staged(&dests_of(&self.lines))?;
        }
        self.ud.reclaim()?;
        self.poll_recovery(now, snapshot);
        self.send_multicast_repairs()?;
        Ok((self.schedule.counters().datagrams_sent - before) as usize)
    }

    /// The recovery service's I/O: connection management (at most once per
    /// [`CM_CHECK_NS`]), then each open connection's receives into the
    /// server and the server's answers out, then closing what it closed.
    fn poll_recovery(&mut self, now: u64, snapshot: &impl Snapshot) {
        let (io, server, state) = (&mut self.io, &mut self.server, &mut self.state);
        // Connection management costs a system call (poll on the rdma_cm
        // channel): at most once per CM_CHECK_NS, not per loop.
        let check_cm = now >= io.next_cm_check;
        if check_cm {
            if io.accept(now, server).is_err() {
                self.stats.connections_failed += 1;
            }
            io.progress(now, server);
            let step = if io.pending.is_empty() {
                CM_CHECK_NS
            } else {
                CM_STEP_NS
            };
            io.next_cm_check = now + step;
        }
        server.handle_timeout(now, state);
        for c in &mut io.conns {
            if !server.is_open(c.id) {
                continue;
            }
            let id = c.id;
            let recv =
                c.qp.poll_recv(|bytes| server.on_receive(now, id, bytes, state, snapshot));
            if recv.is_err() {
                server.on_transport_error(id, false);
                continue;
            }
            if let Err(e) = send_answers(&mut c.qp, server, now, id) {
                let stalled = matches!(
                    e,
                    NetError::Pool(PoolError::SendCompletion {
                        status: crate::verbs::WcStatus::RnrRetryExceeded,
                        ..
                    })
                );
                server.on_transport_error(id, stalled);
                continue;
            }
            if check_cm && c.conn.poll_disconnected().unwrap_or(true) {
                server.on_transport_error(id, false);
            }
        }
        while let Some((id, _)) = server.poll_closed(now) {
            io.release(id);
        }
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
                None => match self.server.poll_repair() {
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

/// An accepted recovery connection waiting for ESTABLISHED, by the
/// [`RecoveryServer`]'s connection id. Field order: the queue pair goes
/// before the rdma_cm id it is connected through.
struct PendingIo {
    id: u32,
    qp: PooledQp,
    accepting: cm::Accepting,
}

/// An established recovery connection's queue pair and rdma_cm id.
struct ConnIo {
    id: u32,
    qp: PooledQp,
    conn: Connection,
}

/// The recovery port's I/O: the rdma_cm listener and each connection's
/// queue pair. Decides nothing: [`RecoveryServer`] does.
struct RecoveryIo {
    addr: SocketAddr,
    /// None while the service is disabled.
    listener: Option<Listener>,
    pd: Arc<ProtectionDomain>,
    conns: Vec<ConnIo>,
    pending: Vec<PendingIo>,
    opts: RcOptions,
    next_cm_check: u64,
}

impl RecoveryIo {
    /// Takes one connect request, if any, to the server: rejects it with
    /// the server's reason, or answers it with the server's welcome without
    /// waiting for the handshake to finish (see [`Self::progress`]).
    fn accept(&mut self, now: u64, server: &mut RecoveryServer) -> Result<(), NetError> {
        let Some(listener) = &self.listener else {
            return Ok(());
        };
        let Some(req) = listener.next_request(Duration::ZERO)? else {
            return Ok(());
        };
        let (id, welcome) = match server.on_connect_request(now, req.peer(), req.private_data()) {
            Ok(w) => w,
            Err(refused) => {
                req.reject(&refusal_message(refused))?;
                return Ok(());
            }
        };
        let accepted = (|| {
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
            let accepting =
                req.start_accept(qp.qp(), &self.opts, Access::LOCAL, welcome.as_bytes())?;
            // In RTS already: receives go up before the subscriber's proof
            // and first request can arrive.
            qp.post_receives()?;
            Ok::<_, NetError>((qp, accepting))
        })();
        match accepted {
            Ok((qp, accepting)) => {
                self.pending.push(PendingIo { id, qp, accepting });
                Ok(())
            }
            Err(e) => {
                // The server counts it failed when it is closed.
                server.on_transport_error(id, false);
                Err(e)
            }
        }
    }

    /// Moves established connections to `conns` and tells the server; a
    /// failed set-up is reported to it (it also times out slow ones).
    /// Connection set-up only, so the Vec shuffle does not matter.
    fn progress(&mut self, now: u64, server: &mut RecoveryServer) {
        for p in std::mem::take(&mut self.pending) {
            match p.accepting.poll() {
                Ok(cm::AcceptProgress::Done(conn)) => {
                    server.on_established(now, p.id);
                    self.conns.push(ConnIo {
                        id: p.id,
                        qp: p.qp,
                        conn,
                    });
                }
                Ok(cm::AcceptProgress::Pending(accepting)) => {
                    self.pending.push(PendingIo { accepting, ..p });
                }
                Err(_) => server.on_transport_error(p.id, false),
            }
        }
    }

    /// Releases the transport of a connection the server closed.
    fn release(&mut self, id: u32) {
        if let Some(i) = self.conns.iter().position(|c| c.id == id) {
            self.conns.swap_remove(i);
        } else if let Some(i) = self.pending.iter().position(|c| c.id == id) {
            self.pending.swap_remove(i);
        }
    }
}

/// Sends what the server queued on connection `id`, packed into RC
/// messages, as far as the send ring takes.
fn send_answers(
    qp: &mut PooledQp,
    server: &mut RecoveryServer,
    now: u64,
    id: u32,
) -> Result<(), NetError> {
    while let Some(bytes) = server.poll_transmit(id, qp.send_capacity()) {
        let len = bytes.len();
        match qp.stage(bytes) {
            Ok(()) => server.transmitted(now, id, len),
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
        handshake: ClientHandshake,
    },
    Down,
}

/// Checks the publisher's welcome (see [`ClientHandshake::on_welcome`]).
fn admit(
    handshake: &ClientHandshake,
    welcome: &[u8],
    publisher: SocketAddr,
) -> Result<Admission, NetError> {
    handshake
        .on_welcome(welcome)
        .map_err(|reason| NetError::Admission { publisher, reason })
}

/// Sends the proof as the connection's first message.
fn send_proof(rc: &mut PooledQp, admitted: &Admission) -> Result<(), NetError> {
    // A fresh connection's send ring is empty: the send is taken.
    rc.send(&admitted.proof, &[Dest::Connected])?;
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
    /// The dead-link rule.
    watch: LinkWatch,
    /// Turns since the recovery connection's CQ was last polled.
    idle_link_turns: u32,
    /// When to report position and rate to the publisher.
    status: StatusReporter,
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
        let handshake =
            ClientHandshake::new(s.reconnect.key.clone(), channel, cfg.auth.datagram_tag);
        let (conn, welcome) = resolved.connect(
            rc.qp(),
            &s.reconnect.opts,
            Access::LOCAL,
            handshake.hello().as_bytes(),
            CM_TIMEOUT,
        )?;
        let admitted = match admit(&handshake, &welcome, publisher) {
            Ok(a) => a,
            Err(e) => {
                let _ = conn.disconnect();
                return Err(e);
            }
        };
        rc.post_receives()?;
        send_proof(&mut rc, &admitted)?;
        s.state.announce_session(now_ns(), admitted.session);
        s.source = (Gid(admitted.gid), admitted.qpn);
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
            watch: LinkWatch::new(cfg.recovery.dead_link_ns),
            idle_link_turns: 0,
            status: StatusReporter::new(cfg.recovery.status_interval_ns),
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
        // The dead-link rule (see LinkWatch).
        let up = matches!(self.link, Link::Up { .. });
        if self
            .watch
            .check(now, state, self.stats.recovery_messages, up)
        {
            self.stats.unanswered_links += 1;
            link_ok = false;
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
                        let handshake = ClientHandshake::new(r.key.clone(), r.channel, r.tags);
                        self.link = Link::Connecting {
                            rc,
                            connecting,
                            handshake,
                        };
                        r.next_check = now + CM_STEP_NS;
                    }
                    Err(_) => self.reconnect_failed(now),
                }
            }
            Link::Connecting {
                mut rc,
                connecting,
                handshake,
            } => match connecting.poll(
                rc.qp(),
                &r.opts,
                Access::LOCAL,
                handshake.hello().as_bytes(),
            ) {
                Ok(cm::ConnectProgress::Pending(connecting)) => {
                    self.link = Link::Connecting {
                        rc,
                        connecting,
                        handshake,
                    };
                    r.next_check = now + CM_STEP_NS;
                }
                Ok(cm::ConnectProgress::Done(conn, welcome)) => {
                    let admitted = match admit(&handshake, &welcome, r.publisher) {
                        Ok(a) => a,
                        Err(_) => {
                            let _ = conn.disconnect();
                            self.stats.auth_failures += 1;
                            return self.reconnect_failed(now);
                        }
                    };
                    if rc.post_receives().is_err() || send_proof(&mut rc, &admitted).is_err() {
                        return self.reconnect_failed(now);
                    }
                    self.link = Link::Up { rc, conn };
                    self.source = (Gid(admitted.gid), admitted.qpn);
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
