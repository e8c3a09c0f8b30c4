//! Market data without multicast: RC fan-out.
//!
//! For fabrics that route no multicast (many RoCE fabrics, most clouds), a
//! channel with `transport = "rc"` is carried over one RC connection per
//! subscriber: the publisher RDMA-WRITEs every datagram it seals into each
//! subscriber's ring, through the orders path's rings ([`crate::orders`],
//! whose core is [`crate::ring::proto`]). What travels is exactly what the
//! multicast path sends: the datagrams of [`PublisherState`]'s history, and
//! the recovery messages of [`super::wire`]; the subscriber feeds them to the
//! same [`SubscriberState`], so the application sees the same API
//! ([`Handler`], [`SnapshotSink`], [`Event`], sequences, snapshots).
//!
//! # Admission
//!
//! Subscribers connect through the orders handshake: both sides prove they
//! hold `auth.secret` by challenge-response ([`crate::auth`]) before any
//! frame is read. The orders token is derived from the secret with a
//! market-data prefix, so a market-data secret never opens an orders
//! listener that happens to use the same string. The first frame on a new
//! connection is a [`FanoutWelcome`] (channel, session, tag flag), then a
//! heartbeat carrying the next sequence, then datagrams.
//!
//! # A consistent start
//!
//! A subscriber receives datagrams from the one sealed after it was admitted.
//! The subscriber state machine does what it does on multicast: a first
//! datagram at most `recovery.join_replay_max` messages into the stream has
//! the start replayed from the publisher's history; further in it is a late
//! join, and the subscriber asks for a snapshot (over the same connection),
//! buffers the live datagrams meanwhile, and goes live at the snapshot's
//! sequence + 1. Nothing is ever lost on RC, so no other recovery happens.
//!
//! # Slow subscribers
//!
//! Each subscriber has its own cursor into the publisher's history. A
//! subscriber whose ring is full is skipped (the others go on) and resumes
//! from its cursor once it returns credit. It is dropped, with a
//! [`FanoutEvent::SubscriberDropped`] and a counter, when its ring stayed
//! full for `rc_fanout.slow_subscriber_ns` (it took nothing that long), or
//! when it fell so far behind that the history no longer holds the datagram
//! it needs next. A dropped subscriber sees [`Event::RecoveryLost`] and
//! [`RcFanoutSubscriber::connected`] turn false; its later polls connect
//! again, as a new subscriber that rejoins through a replay or a snapshot.
//!
//! What this module must not do: touch multicast, decide sequencing (that
//! is [`PublisherState`]'s and [`SubscriberState`]'s), allocate per message,
//! or log per message.

use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::clock::Mono;

use serde::Deserialize;
use zerocopy::byteorder::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::backoff::Backoff;
use super::budget::ByteBudget;
use super::config::{ConfigError, McastConfig, Transport};
use super::io::{NetError, PublishError, SNAPSHOT_CHUNK};
use super::publisher::{Pacer, PublisherState};
use super::server::{
    clamp_request, cut_to_request_bytes, queue_retransmit, request_gate, GateCounters,
    SnapshotCache,
};
use super::snapshot::{Handler, Snapshot, SnapshotSink};
use super::subscriber::{Event, SubscriberCounters, SubscriberState};
use super::transport::MdClaim;
use super::wire::{
    self, Line, RecoveryHeader, RecoveryMsg, FLAG_DATAGRAM_TAG, RECOVERY_HEADER_LEN,
};
use crate::orders::{
    ConnectProgress, Connecting, Connection, OfferError, OrdersConfig, OrdersError, OrdersListener,
};
use crate::ring::frame::frame_len;
use crate::verbs::RcOptions;

/// The ring stream every fan-out frame travels on.
pub const STREAM: u16 = 1;
/// Frame type of the publisher's [`FanoutWelcome`] (the first frame).
pub const FRAME_WELCOME: u16 = 0x4D01;
/// Frame type of one datagram, as the multicast path would send it.
pub const FRAME_DATAGRAM: u16 = 0x4D02;
/// Frame type of one or more recovery messages (retransmits, snapshots).
pub const FRAME_RECOVERY: u16 = 0x4D03;
/// Frame type of a subscriber's request (retransmit, snapshot).
pub const FRAME_REQUEST: u16 = 0x4D04;

/// [`FanoutWelcome::magic`].
pub const WELCOME_MAGIC: u32 = u32::from_le_bytes(*b"RBF1");

/// Frames a poll takes from one ring at most.
const POLL_LIMIT: usize = 64;
/// How often the publisher looks for new connections (a system call).
const CM_CHECK_NS: u64 = 1_000_000;
/// The same while a handshake is under way (the publisher's accepts, a
/// subscriber's connect).
const CM_STEP_NS: u64 = 50_000;
/// Events kept for [`RcFanoutPublisher::poll_event`]; older ones are dropped (counted).
const MAX_EVENTS: usize = 256;

/// The first frame on a fan-out connection: which stream this is.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned, Debug, Clone, Copy)]
#[repr(C)]
pub struct FanoutWelcome {
    /// [`WELCOME_MAGIC`].
    pub magic: U32,
    /// Channel id.
    pub channel: U16,
    /// [`FLAG_DATAGRAM_TAG`] if datagrams carry a tag.
    pub flags: u8,
    /// [`wire::VERSION`].
    pub version: u8,
    /// The publisher's session.
    pub session: U64,
}
const _: () = assert!(core::mem::size_of::<FanoutWelcome>() == 16);

/// Largest frame payload the fan-out sends: a retransmitted datagram with
/// its recovery header, or a snapshot chunk message.
pub fn max_frame_payload(max_datagram_payload: usize) -> usize {
    (max_datagram_payload + RECOVERY_HEADER_LEN).max(super::io::RC_MSG_LEN)
}

/// The `[rc_fanout]` table.
///
/// ```toml
/// [rc_fanout]
/// ring_size = 1048576            # each subscriber's ring (power of two)
/// slow_subscriber_ns = 1000000000 # a ring full this long: the subscriber is dropped
/// max_subscribers = 32
/// ```
///
/// Connection set-up is bounded by the top-level `connect_timeout_ms`, as
/// on multicast.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RcFanoutConfig {
    /// Bytes of each subscriber's ring (power of two, 64 KiB..=1 GiB, at
    /// least four of the largest frames).
    pub ring_size: usize,
    /// A subscriber whose ring stayed full this long is dropped.
    pub slow_subscriber_ns: u64,
    /// Subscribers at once; one more is refused (disconnected, counted).
    pub max_subscribers: usize,
}

impl Default for RcFanoutConfig {
    fn default() -> Self {
        RcFanoutConfig {
            ring_size: 1 << 20,
            slow_subscriber_ns: 1_000_000_000,
            max_subscribers: 32,
        }
    }
}

impl RcFanoutConfig {
    /// Checks the values against the datagram size; the error names the key.
    pub fn validate(&self, max_datagram_payload: usize) -> Result<(), ConfigError> {
        let bad = |key: &str, reason: String| ConfigError::Invalid {
            key: format!("rc_fanout.{key}"),
            reason,
        };
        let frame = frame_len(max_frame_payload(max_datagram_payload));
        if !self.ring_size.is_power_of_two()
            || !(64 << 10..=1 << 30).contains(&self.ring_size)
            || self.ring_size < 4 * frame
        {
            return Err(bad(
                "ring_size",
                format!(
                    "{} must be a power of two within 65536..=2^30 and at least {} (four frames of {frame} bytes)",
                    self.ring_size,
                    4 * frame
                ),
            ));
        }
        if self.slow_subscriber_ns == 0 {
            return Err(bad("slow_subscriber_ns", "must be greater than 0".into()));
        }
        if !(1..=1024).contains(&self.max_subscribers) {
            return Err(bad("max_subscribers", "must be within 1..=1024".into()));
        }
        Ok(())
    }
}

/// The orders-path configuration of a fan-out channel: both sides build it
/// from the same market-data configuration.
fn orders_config(cfg: &McastConfig) -> OrdersConfig {
    let f = &cfg.rc_fanout;
    let mut o = OrdersConfig {
        ring_size: f.ring_size,
        max_payload: max_frame_payload(cfg.max_datagram_payload),
        // Domain-separated from an orders token of the same string.
        token: format!("rocebus market data over RC fan-out\0{}", cfg.auth.secret),
        rc: RcOptions {
            timeout: cfg.recovery.rc_timeout,
            ..RcOptions::default()
        },
        connect_timeout_ms: cfg.connect_timeout_ms,
        max_peer_ring_size: f.ring_size,
        max_connections_per_peer: f.max_subscribers,
        // Strangers' handshakes: the orders listener's caps, one address
        // checked first and never holding every slot (crate::admission).
        max_pending_handshakes: 8,
        max_pending_per_peer: 2,
        // A publisher whose thread has not polled for half the silence
        // bound admits no subscriber: it could not welcome it (the welcome
        // and everything after it are written by `poll`), and a subscriber
        // that heard nothing for the whole bound would give it up again.
        // Refused, the subscriber retries on its back-off and is in once
        // the publisher polls again.
        accept_stall_ms: (silence_bound(cfg) / 2 / 1_000_000).max(1),
        ..OrdersConfig::default()
    };
    // This host's transport settings, as every orders-path user applies them.
    cfg.rdma.apply_to_orders(&mut o);
    o
}

/// How long a subscriber hears nothing before it counts the publisher as
/// gone: `recovery.dead_link_ns`, at least ten heartbeat intervals.
fn silence_bound(cfg: &McastConfig) -> u64 {
    cfg.recovery
        .dead_link_ns
        .max(cfg.heartbeat_interval_ns.saturating_mul(10))
}

fn rc_channel(cfg: &McastConfig, channel: u16) -> Result<u16, NetError> {
    let ch = cfg.channel(channel).ok_or(NetError::NoChannel(channel))?;
    if ch.transport != Transport::Rc {
        return Err(NetError::WrongTransport {
            channel,
            configured: ch.transport.as_str(),
        });
    }
    Ok(ch.port)
}

/// Why the publisher dropped a subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanoutDrop {
    /// Its ring stayed full for `rc_fanout.slow_subscriber_ns`.
    Stalled,
    /// It fell further behind than the publisher's history reaches.
    BehindHistory,
    /// The connection failed (peer gone, or it broke the ring protocol).
    Lost,
}

/// What the publisher tells the application about its subscribers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FanoutEvent {
    /// A subscriber proved the secret and was admitted.
    SubscriberJoined {
        /// Its connection id.
        id: u32,
        /// Its address.
        peer: String,
    },
    /// A subscriber was dropped (the others are not affected).
    SubscriberDropped {
        /// Its connection id.
        id: u32,
        /// Its address.
        peer: String,
        /// Why.
        reason: FanoutDrop,
        /// Messages it had not been sent yet.
        behind: u64,
    },
}

/// Publisher counters (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanoutStats {
    /// Datagram frames written, summed over subscribers.
    pub datagrams_written: u64,
    /// Times a subscriber's ring was found full (it was skipped that turn).
    pub back_pressured: u64,
    /// Subscribers admitted.
    pub subscribers_joined: u64,
    /// Admitted connections refused because `max_subscribers` were connected.
    pub subscribers_refused: u64,
    /// Subscribers dropped because their ring stayed full too long.
    pub dropped_stalled: u64,
    /// Subscribers dropped because they fell out of the history.
    pub dropped_behind_history: u64,
    /// Subscribers whose connection failed.
    pub subscribers_lost: u64,
    /// Retransmit requests served (late joiners near the stream's start).
    pub retransmit_requests: u64,
    /// Heartbeat frames written to idle subscribers.
    pub heartbeats_written: u64,
    /// Snapshots served (late joiners).
    pub snapshots_served: u64,
    /// Snapshots serialised for them (one serves every request while its
    /// sequence is current and for `recovery_server.snapshot_reuse_ns`).
    pub snapshots_built: u64,
    /// Requests dropped by the per-connection rate limits.
    pub requests_rate_limited: u64,
    /// Requests dropped as undecodable, foreign, or with the outbox full.
    pub requests_dropped: u64,
    /// Retransmit requests cut to `recovery.max_request_messages`.
    pub requests_clamped: u64,
    /// Retransmit and snapshot requests dropped because the subscriber's
    /// repair budget (`recovery_server.repair_bytes_per_sec`,
    /// `repair_burst_bytes`) was spent.
    pub repair_budget_dropped: u64,
    /// Retransmit answers cut to `recovery_server.repair_request_bytes`.
    pub repair_requests_cut: u64,
    /// Local failures taking a connection (no resources).
    pub accept_errors: u64,
    /// Events dropped because nobody took them.
    pub events_dropped: u64,
}

/// One subscriber as the publisher sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanoutRow {
    /// Connection id.
    pub id: u32,
    /// Address.
    pub peer: String,
    /// Next sequence to be written into its ring.
    pub position: u64,
    /// Published messages not yet written into its ring.
    pub lag: u64,
}

/// The slow-subscriber policy for one subscriber, free of I/O: where its
/// stream stands in the publisher's history, and whether it has to go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberCursor {
    /// First sequence not yet written into its ring (a datagram boundary).
    next: u64,
    /// Since when nothing could be written (its ring full).
    blocked_since: Option<u64>,
}

impl SubscriberCursor {
    /// A subscriber whose stream starts at sequence `from`.
    pub fn new(from: u64) -> Self {
        SubscriberCursor {
            next: from,
            blocked_since: None,
        }
    }
    /// First sequence not yet written to it.
    pub fn next(&self) -> u64 {
        self.next
    }
    /// The history's next datagram for it starts at `first`: later than
    /// [`next`](Self::next) means what it needs was overwritten, and it
    /// cannot be given a contiguous stream any more.
    pub fn check(&self, first: u64) -> Result<(), FanoutDrop> {
        if first > self.next {
            Err(FanoutDrop::BehindHistory)
        } else {
            Ok(())
        }
    }
    /// A datagram ending before `end` was written into its ring.
    pub fn wrote(&mut self, end: u64) {
        self.next = end;
        self.blocked_since = None;
    }
    /// A turn that had something for it wrote nothing (its ring is full):
    /// `Err(Stalled)` once that has lasted `slow_ns`.
    pub fn blocked(&mut self, now: u64, slow_ns: u64) -> Result<(), FanoutDrop> {
        let since = *self.blocked_since.get_or_insert(now);
        if now.saturating_sub(since) >= slow_ns {
            Err(FanoutDrop::Stalled)
        } else {
            Ok(())
        }
    }
}

struct FanoutSub {
    id: u32,
    conn: Connection,
    peer: String,
    cursor: SubscriberCursor,
    /// Recovery answers not yet written, whole messages.
    outbox: Vec<u8>,
    out_pos: usize,
    requests: Pacer,
    snapshots: Pacer,
    /// Bytes of recovery answers written on its behalf: its repair budget.
    budget: ByteBudget,
    doomed: Option<FanoutDrop>,
    /// When a datagram or heartbeat frame was last written to it.
    written_at: u64,
}

/// Limits applied to requests, from the configuration.
#[derive(Debug, Clone, Copy)]
struct Limits {
    max_outbox: usize,
    max_request_messages: u64,
    max_frame: usize,
    requests_per_sec: u64,
    request_burst: u64,
    snapshots_per_sec: u64,
    snapshot_burst: u64,
    snapshot_reuse_ns: u64,
    repair_bytes_per_sec: u64,
    repair_burst_bytes: u64,
    repair_request_bytes: u64,
    heartbeat_ns: u64,
    /// A heartbeat goes out this long after the last write even if the
    /// subscriber has not returned credit for it (a quarter of its silence
    /// bound, see [`silence_bound`]).
    quiet_ns: u64,
    slow_ns: u64,
    max_subscribers: usize,
    tags: bool,
}

/// A market-data publisher for one `transport = "rc"` channel: the same
/// publishing API as [`super::McastPublisher`], fanning every datagram out
/// to each subscriber's ring. See the module documentation.
pub struct RcFanoutPublisher {
    state: PublisherState,
    // Field order: connections before the listener that made them.
    subs: Vec<FanoutSub>,
    listener: OrdersListener,
    limits: Limits,
    snapshots: SnapshotCache,
    events: VecDeque<FanoutEvent>,
    stats: FanoutStats,
    next_cm_check: u64,
    next_id: u32,
}

impl std::fmt::Debug for RcFanoutPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcFanoutPublisher")
            .field("session", &self.state.session())
            .field("next_seq", &self.state.next_seq())
            .field("subscribers", &self.subs.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RcFanoutPublisher {
    /// Listens for subscribers on `local`:`channel.port` (the RDMA device
    /// owning `local` serves them). Never waits for a subscriber.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        session: u64,
        local: IpAddr,
    ) -> Result<Self, NetError> {
        let port = rc_channel(cfg, channel)?;
        if cfg.auth.secret.is_empty() {
            tracing::warn!(
                channel,
                "market data (rc fan-out): auth.secret is empty, so the handshake proves nothing: set a shared secret"
            );
        }
        let listener = OrdersListener::bind(orders_config(cfg), SocketAddr::new(local, port))?;
        let mut state = PublisherState::new(cfg.publisher(channel, session));
        state.set_datagram_key(cfg.datagram_key());
        let rs = &cfg.recovery_server;
        Ok(RcFanoutPublisher {
            state,
            subs: Vec::with_capacity(cfg.rc_fanout.max_subscribers),
            listener,
            limits: Limits {
                max_outbox: rs.max_outbox_bytes,
                max_request_messages: cfg.recovery.max_request_messages,
                max_frame: max_frame_payload(cfg.max_datagram_payload),
                requests_per_sec: rs.requests_per_sec,
                request_burst: rs.request_burst,
                snapshots_per_sec: rs.snapshots_per_sec,
                snapshot_burst: rs.snapshot_burst,
                snapshot_reuse_ns: rs.snapshot_reuse_ns,
                repair_bytes_per_sec: rs.repair_bytes_per_sec,
                repair_burst_bytes: rs.repair_burst_bytes,
                repair_request_bytes: rs.repair_request_bytes,
                heartbeat_ns: cfg.heartbeat_interval_ns,
                quiet_ns: silence_bound(cfg) / 4,
                slow_ns: cfg.rc_fanout.slow_subscriber_ns,
                max_subscribers: cfg.rc_fanout.max_subscribers,
                tags: cfg.auth.datagram_tag,
            },
            snapshots: SnapshotCache::default(),
            events: VecDeque::with_capacity(MAX_EVENTS),
            stats: FanoutStats::default(),
            next_cm_check: 0,
            next_id: 0,
        })
    }

    /// The protocol state (sequence, history, counters).
    pub fn state(&self) -> &PublisherState {
        &self.state
    }
    /// Counters.
    pub fn stats(&self) -> FanoutStats {
        self.stats
    }
    /// Handshakes refused or failed (wrong secret, limits), as the orders
    /// listener counts them.
    pub fn listener_stats(&self) -> crate::orders::ListenerStats {
        self.listener.stats()
    }
    /// Subscribers connected.
    pub fn connections(&self) -> usize {
        self.subs.len()
    }
    /// Every subscriber: position and lag (allocates; not for the hot path).
    pub fn subscribers(&self) -> Vec<FanoutRow> {
        let next = self.state.next_seq();
        self.subs
            .iter()
            .map(|s| FanoutRow {
                id: s.id,
                peer: s.peer.clone(),
                position: s.cursor.next(),
                lag: next.saturating_sub(s.cursor.next()),
            })
            .collect()
    }
    /// The next event (a subscriber joined or was dropped).
    pub fn poll_event(&mut self) -> Option<FanoutEvent> {
        self.events.pop_front()
    }

    /// Appends one message to the open datagram (writing out a full one
    /// first) and returns its sequence, as [`super::McastPublisher::offer`].
    pub fn offer(&mut self, now: Mono, msg: &[u8]) -> Result<u64, PublishError> {
        let now = now.as_nanos();
        let p = self.state.publish_flushing(msg)?;
        if p.output.is_due() {
            self.fan_out(now);
        }
        Ok(p.seq)
    }

    /// Claims `len` bytes for the next message, as
    /// [`super::McastPublisher::try_claim`].
    pub fn try_claim(&mut self, now: Mono, len: usize) -> Result<MdClaim<'_, Self>, PublishError> {
        self.prepare_claim(now.as_nanos(), len)?;
        Ok(MdClaim::new(self, now))
    }

    /// The protocol state, to fill and abandon a claim.
    pub(crate) fn state_mut(&mut self) -> &mut PublisherState {
        &mut self.state
    }

    /// Makes room for a claim of `len` bytes and claims it in the state.
    pub(crate) fn prepare_claim(&mut self, now: u64, len: usize) -> Result<(), PublishError> {
        if self.state.make_room(len).is_due() {
            self.fan_out(now);
        }
        self.state.try_claim(len)?;
        Ok(())
    }

    /// Commits the claimed message; its sequence (0: nothing was claimed).
    pub(crate) fn commit_claim(&mut self, now: u64) -> u64 {
        let Some(p) = self.state.commit_flushing() else {
            return 0;
        };
        if p.output.is_due() {
            self.fan_out(now);
        }
        p.seq
    }

    /// Seals the open datagram and writes it to every subscriber that has room.
    pub fn flush(&mut self, now: Mono) -> Result<(), NetError> {
        let now = now.as_nanos();
        self.state.flush();
        self.fan_out(now);
        self.reap();
        Ok(())
    }

    /// Does all pending work once: flushes on the batching timer, writes
    /// what each subscriber is missing, serves their requests (snapshots
    /// from `snapshot`), admits new subscribers and drops slow or lost ones.
    /// Returns the datagram frames written. Never blocks.
    pub fn poll(&mut self, now: Mono, snapshot: &impl Snapshot) -> Result<usize, NetError> {
        let now = now.as_nanos();
        let before = self.stats.datagrams_written;
        self.state.poll_flush(now);
        self.fan_out(now);
        self.heartbeats(now);
        for sub in &mut self.subs {
            if sub.doomed.is_none() {
                serve(
                    sub,
                    now,
                    &mut self.state,
                    snapshot,
                    &mut self.snapshots,
                    &self.limits,
                    &mut self.stats,
                );
            }
        }
        if now >= self.next_cm_check {
            self.accept(now);
            self.next_cm_check = now
                + if self.listener.pending() > 0 {
                    CM_STEP_NS
                } else {
                    CM_CHECK_NS
                };
        }
        self.reap();
        Ok((self.stats.datagrams_written - before) as usize)
    }

    /// Writes every sealed datagram each subscriber is missing, as far as
    /// its ring takes; a full ring skips that subscriber only.
    fn fan_out(&mut self, now: u64) {
        let end = self.state.unflushed_seq();
        for sub in &mut self.subs {
            if sub.cursor.next() < end && sub.doomed.is_none() {
                write_datagrams(sub, &self.state, end, now, &self.limits, &mut self.stats);
            }
        }
    }

    /// Writes a heartbeat (the next sequence, as on multicast) to each
    /// caught-up subscriber that was written nothing for
    /// `heartbeat_interval_ns` and has consumed everything written to it,
    /// or was written nothing for a quarter of its silence bound whatever it
    /// consumed: so a subscriber of an idle publisher still hears from it,
    /// and one that hears nothing for long knows the publisher is gone (a
    /// host that died sends no disconnect). A subscriber that takes nothing
    /// gets four heartbeats per silence bound at most.
    fn heartbeats(&mut self, now: u64) {
        let end = self.state.unflushed_seq();
        let (hb_ns, quiet_ns) = (self.limits.heartbeat_ns, self.limits.quiet_ns);
        let due = |sub: &mut FanoutSub| {
            let idle = now.saturating_sub(sub.written_at);
            sub.doomed.is_none()
                && sub.cursor.next() >= end
                && idle >= hb_ns
                && (idle >= quiet_ns || sub.conn.unconsumed() == 0)
        };
        // Most calls find no subscriber due and build no heartbeat.
        let Some(first) = self.subs.iter_mut().position(due) else {
            return;
        };
        let bytes = self.state.heartbeat();
        // The first one is tested again: writing to one subscriber changes no other's.
        for sub in self.subs[first..].iter_mut() {
            if !due(sub) {
                continue;
            }
            match sub
                .conn
                .publication(STREAM)
                .offer_and_flush(FRAME_DATAGRAM, bytes)
            {
                Ok(()) => {
                    sub.written_at = now;
                    self.stats.heartbeats_written += 1;
                }
                // Room comes back with its credit; the next poll tries again.
                Err(OfferError::BackPressured) => {}
                Err(_) => sub.doomed = Some(FanoutDrop::Lost),
            }
        }
    }

    /// Takes one finished handshake, if any, without waiting.
    fn accept(&mut self, now: u64) {
        let mut conn = match self.listener.accept(Duration::ZERO) {
            Ok(Some(c)) => c,
            Ok(None) => return,
            Err(e) => {
                self.stats.accept_errors += 1;
                if self.stats.accept_errors.is_power_of_two() {
                    tracing::warn!(error = %e, count = self.stats.accept_errors, "rc fan-out: taking a subscriber failed (logged at counts 1, 2, 4, ...)");
                }
                return;
            }
        };
        let peer = conn.peer();
        if self.subs.len() >= self.limits.max_subscribers {
            self.stats.subscribers_refused += 1;
            if self.stats.subscribers_refused.is_power_of_two() {
                tracing::warn!(%peer, max = self.limits.max_subscribers, "rc fan-out: subscriber refused, rc_fanout.max_subscribers reached (logged at counts 1, 2, 4, ...)");
            }
            conn.close();
            return;
        }
        let welcome = FanoutWelcome {
            magic: WELCOME_MAGIC.into(),
            channel: self.state.config().channel.into(),
            flags: if self.limits.tags {
                FLAG_DATAGRAM_TAG
            } else {
                0
            },
            version: wire::VERSION,
            session: self.state.session().into(),
        };
        let cursor = self.state.unflushed_seq();
        let mut p = conn.publication(STREAM);
        // A fresh ring has room for both; a failure means the peer is gone.
        let ok = p.offer(FRAME_WELCOME, welcome.as_bytes()).is_ok()
            && p.offer(FRAME_DATAGRAM, self.state.heartbeat()).is_ok()
            && p.flush().is_ok();
        if !ok {
            self.stats.subscribers_lost += 1;
            return;
        }
        self.next_id = self.next_id.wrapping_add(1);
        let l = &self.limits;
        self.subs.push(FanoutSub {
            id: self.next_id,
            conn,
            peer: peer.clone(),
            cursor: SubscriberCursor::new(cursor),
            outbox: Vec::new(),
            out_pos: 0,
            requests: Pacer::new(l.requests_per_sec, l.request_burst),
            snapshots: Pacer::new(l.snapshots_per_sec, l.snapshot_burst),
            budget: ByteBudget::new(l.repair_bytes_per_sec, l.repair_burst_bytes),
            doomed: None,
            written_at: now,
        });
        self.stats.subscribers_joined += 1;
        tracing::info!(%peer, id = self.next_id, from_seq = cursor, "rc fan-out: subscriber joined");
        self.push_event(FanoutEvent::SubscriberJoined {
            id: self.next_id,
            peer,
        });
    }

    /// Drops the subscribers marked for it, with an event each.
    fn reap(&mut self) {
        let mut i = 0;
        while i < self.subs.len() {
            let Some(reason) = self.subs[i].doomed else {
                i += 1;
                continue;
            };
            let mut s = self.subs.swap_remove(i);
            s.conn.close();
            match reason {
                FanoutDrop::Stalled => self.stats.dropped_stalled += 1,
                FanoutDrop::BehindHistory => self.stats.dropped_behind_history += 1,
                FanoutDrop::Lost => self.stats.subscribers_lost += 1,
            }
            let behind = self.state.next_seq().saturating_sub(s.cursor.next());
            tracing::warn!(peer = %s.peer, id = s.id, ?reason, behind, "rc fan-out: subscriber dropped");
            self.push_event(FanoutEvent::SubscriberDropped {
                id: s.id,
                peer: s.peer,
                reason,
                behind,
            });
        }
    }

    fn push_event(&mut self, e: FanoutEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(e);
    }
}

/// Writes the datagrams `[sub.cursor, end)` from the history into one
/// subscriber's ring, as far as it has room; marks it for dropping when it
/// stayed full too long or fell out of the history.
fn write_datagrams(
    sub: &mut FanoutSub,
    state: &PublisherState,
    end: u64,
    now: u64,
    limits: &Limits,
    stats: &mut FanoutStats,
) {
    let mut p = sub.conn.publication(STREAM);
    let mut wrote = false;
    while sub.cursor.next() < end {
        let Some((first, next, bytes)) = state.sealed_from(sub.cursor.next()) else {
            break;
        };
        if let Err(why) = sub.cursor.check(first) {
            sub.doomed = Some(why);
            return;
        }
        match p.offer(FRAME_DATAGRAM, bytes) {
            Ok(()) => {
                sub.cursor.wrote(next);
                wrote = true;
                stats.datagrams_written += 1;
                sub.written_at = now;
            }
            Err(OfferError::BackPressured) => {
                stats.back_pressured += 1;
                break;
            }
            Err(_) => {
                sub.doomed = Some(FanoutDrop::Lost);
                return;
            }
        }
    }
    if wrote {
        if p.flush().is_err() {
            sub.doomed = Some(FanoutDrop::Lost);
        }
    } else if let Err(why) = sub.cursor.blocked(now, limits.slow_ns) {
        sub.doomed = Some(why);
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

/// What limits one subscriber's requests: its rate limits and its repair
/// budget.
struct RequestPacers<'a> {
    requests: &'a mut Pacer,
    snapshots: &'a mut Pacer,
    budget: &'a mut ByteBudget,
}

/// Answers one decoded request of a subscriber into its `outbox`, I/O-free:
/// rate limits, the outbox cap, then the repair budget (the recovery
/// server's: every byte of answer is charged; a retransmit answer is cut to
/// `repair_request_bytes`; a snapshot is served whole and may put the
/// budget into debt; a spent budget drops the request). Over `T` seconds a
/// subscriber gets at most `repair_burst_bytes + repair_bytes_per_sec * T +
/// max(repair_request_bytes, one snapshot)` of answers, as on the recovery
/// port ([`super::server`]).
#[allow(clippy::too_many_arguments)]
fn answer_request(
    msg: RecoveryMsg<'_>,
    now: u64,
    state: &mut PublisherState,
    snapshot: &impl Snapshot,
    cache: &mut SnapshotCache,
    limits: &Limits,
    stats: &mut FanoutStats,
    p: &mut RequestPacers<'_>,
    outbox: &mut Vec<u8>,
) {
    let our_channel = state.config().channel;
    let (queued, max_outbox) = (outbox.len() as u64, limits.max_outbox as u64);
    let gate = |stats: &mut FanoutStats, rate: &mut Pacer, budget: &mut ByteBudget| {
        let count = GateCounters {
            rate_limited: &mut stats.requests_rate_limited,
            outbox_full: &mut stats.requests_dropped,
            budget_spent: &mut stats.repair_budget_dropped,
        };
        request_gate(now, rate, queued, max_outbox, budget, count)
    };
    match msg {
        RecoveryMsg::RetransmitRequest(r) => {
            if !gate(stats, p.requests, p.budget) {
                return;
            }
            stats.retransmit_requests += 1;
            let (mut r, clamped) = clamp_request(r, limits.max_request_messages);
            stats.requests_clamped += u64::from(clamped);
            if r.channel == our_channel
                && r.session == state.session()
                && cut_to_request_bytes(state, &mut r, limits.repair_request_bytes)
            {
                stats.repair_requests_cut += 1;
            }
            let before = outbox.len();
            queue_retransmit(state, &r, outbox);
            p.budget.charge((outbox.len() - before) as u64);
        }
        RecoveryMsg::SnapshotRequest { channel, .. } if channel == our_channel => {
            if !gate(stats, p.snapshots, p.budget) {
                return;
            }
            stats.snapshots_served += 1;
            let (encoded, built) = cache.get(
                now,
                limits.snapshot_reuse_ns,
                state,
                SNAPSHOT_CHUNK,
                snapshot,
            );
            stats.snapshots_built += u64::from(built);
            outbox.extend_from_slice(encoded);
            // Served whole (a cut snapshot is useless).
            p.budget.charge(encoded.len() as u64);
        }
        _ => stats.requests_dropped += 1,
    }
}

/// Takes one subscriber's requests, answers them into its outbox, and
/// writes what of the outbox its ring takes.
fn serve(
    sub: &mut FanoutSub,
    now: u64,
    state: &mut PublisherState,
    snapshot: &impl Snapshot,
    cache: &mut SnapshotCache,
    limits: &Limits,
    stats: &mut FanoutStats,
) {
    let FanoutSub {
        conn,
        outbox,
        out_pos,
        requests,
        snapshots,
        budget,
        doomed,
        ..
    } = sub;
    let mut pacers = RequestPacers {
        requests,
        snapshots,
        budget,
    };
    let r = conn.subscription().poll(
        |f| {
            if f.msg_type != FRAME_REQUEST {
                stats.requests_dropped += 1;
                return;
            }
            let mut bytes = f.payload;
            while !bytes.is_empty() {
                let Ok((msg, used)) = wire::decode_recovery(bytes) else {
                    stats.requests_dropped += 1;
                    return;
                };
                bytes = &bytes[used..];
                answer_request(
                    msg,
                    now,
                    state,
                    snapshot,
                    cache,
                    limits,
                    stats,
                    &mut pacers,
                    outbox,
                );
            }
        },
        POLL_LIMIT,
    );
    if r.is_err() {
        *doomed = Some(FanoutDrop::Lost);
        return;
    }
    if *out_pos == outbox.len() {
        return;
    }
    let mut p = conn.publication(STREAM);
    let mut wrote = false;
    while *out_pos < outbox.len() {
        let mut end = *out_pos;
        while let Some(len) = recovery_len(&outbox[end..]) {
            if end + len - *out_pos > limits.max_frame {
                break;
            }
            end += len;
        }
        if end == *out_pos {
            // Cannot happen (every message was encoded here and fits a
            // frame); drop the rest rather than loop.
            *out_pos = outbox.len();
            break;
        }
        match p.offer(FRAME_RECOVERY, &outbox[*out_pos..end]) {
            Ok(()) => {
                *out_pos = end;
                wrote = true;
            }
            Err(OfferError::BackPressured) => break,
            Err(_) => {
                *doomed = Some(FanoutDrop::Lost);
                return;
            }
        }
    }
    if *out_pos >= outbox.len() {
        outbox.clear();
        *out_pos = 0;
    }
    if wrote && p.flush().is_err() {
        *doomed = Some(FanoutDrop::Lost);
    }
}

/// I/O counters of a fan-out subscriber (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FanoutSubscriberStats {
    /// Datagram frames received.
    pub datagrams: u64,
    /// Recovery frames received (retransmits, snapshot chunks).
    pub recovery_frames: u64,
    /// Requests sent to the publisher.
    pub requests_sent: u64,
    /// Requests dropped because the publisher's ring was full (asked again
    /// on timeout).
    pub requests_dropped: u64,
    /// Frames of an unknown type or a welcome that does not match.
    pub bad_frames: u64,
    /// Times the connection was lost.
    pub connections_lost: u64,
    /// Connections made by polls (the first one of a subscriber made with
    /// [`RcFanoutSubscriber::new`], and every one after a loss).
    pub reconnects: u64,
    /// Connection attempts that failed (each followed by a longer wait).
    pub reconnect_failures: u64,
    /// Connections given up because nothing (not even a heartbeat) came for
    /// the silence bound (counted in `connections_lost` too).
    pub silent_links: u64,
}

/// The connection to the publisher in its states.
#[allow(clippy::large_enum_variant)]
enum FanLink {
    Up(Connection),
    Connecting(Connecting),
    Down,
}

/// Everything needed to (re)connect, and when to try next.
struct Dial {
    publisher: SocketAddr,
    local: IpAddr,
    cfg: OrdersConfig,
    /// Next look at the connection's set-up (attempt or handshake step), and
    /// the wait after a failed attempt.
    backoff: Backoff,
}

/// A market-data subscriber for one `transport = "rc"` channel: the same
/// API as [`super::McastSubscriber`] over one RC connection to the
/// publisher. See the module documentation.
pub struct RcFanoutSubscriber {
    state: SubscriberState,
    link: FanLink,
    dial: Dial,
    /// When the connection last brought a frame (or came up).
    heard_at: u64,
    /// Silence after which the publisher counts as gone:
    /// `recovery.dead_link_ns`, at least ten heartbeat intervals.
    silence_ns: u64,
    channel: u16,
    tags: bool,
    stats: FanoutSubscriberStats,
    req: [u8; 64],
}

impl std::fmt::Debug for RcFanoutSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcFanoutSubscriber")
            .field("phase", &self.state.phase())
            .field("next_seq", &self.state.next_seq())
            .field("connected", &self.connected())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl RcFanoutSubscriber {
    /// Opens the subscriber for `channel` without waiting for the
    /// publisher: the connection to `publisher`:`channel.port` (through the
    /// authenticated orders handshake, from the device owning `local`) is
    /// made by [`poll`](Self::poll), each attempt bounded by
    /// `connect_timeout_ms`, retried after `recovery.reconnect_min_ns`
    /// doubling up to `recovery.reconnect_max_ns`, as is every connection
    /// lost later. It is reported as [`Event::RecoveryRestored`] when it
    /// comes up (not preceded by [`Event::RecoveryLost`]: nothing was
    /// lost). Errors are the configuration's only (no such channel, a
    /// multicast channel, bad values).
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::unconnected(cfg, channel, local, publisher)?;
        s.state.start_link_down();
        Ok(s)
    }

    /// As [`new`](Self::new), then waits for the connection (up to
    /// `connect_timeout_ms`): an error if the publisher is down or refuses
    /// us. For tools and tests that want a connected subscriber before they
    /// go on; an engine's loop uses [`new`](Self::new), which never waits.
    /// `local` is not used here: the route to `publisher` picks the device.
    pub fn connect(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::unconnected(cfg, channel, local, publisher)?;
        let conn = Connection::connect(&s.dial.cfg, s.dial.publisher)?;
        s.link = FanLink::Up(conn);
        s.heard_at = crate::clock::now_ns();
        Ok(s)
    }

    fn unconnected(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let port = rc_channel(cfg, channel)?;
        let ocfg = orders_config(cfg);
        ocfg.validate().map_err(OrdersError::Config)?;
        let mut state = SubscriberState::new(cfg.subscriber(channel));
        state.set_datagram_key(cfg.datagram_key());
        // Answers come in order behind the stream and are never lost: a
        // request is asked again after the silence bound, once the ring was
        // read empty (a slow reader is not made to give the start up).
        state.set_in_order_link(silence_bound(cfg));
        Ok(RcFanoutSubscriber {
            state,
            link: FanLink::Down,
            dial: Dial {
                publisher: SocketAddr::new(publisher, port),
                local,
                cfg: ocfg,
                backoff: Backoff::new(cfg.recovery.reconnect_min_ns, cfg.recovery.reconnect_max_ns),
            },
            heard_at: 0,
            silence_ns: silence_bound(cfg),
            channel,
            tags: cfg.auth.datagram_tag,
            stats: FanoutSubscriberStats::default(),
            req: [0; 64],
        })
    }

    /// The protocol state.
    pub fn state(&self) -> &SubscriberState {
        &self.state
    }
    /// Protocol counters (delivered, snapshots applied, ...).
    pub fn counters(&self) -> SubscriberCounters {
        self.state.counters()
    }
    /// I/O counters.
    pub fn io_stats(&self) -> FanoutSubscriberStats {
        self.stats
    }
    /// Whether the connection to the publisher is up.
    pub fn connected(&self) -> bool {
        matches!(self.link, FanLink::Up(_))
    }
    /// Closes the connection (the publisher sees it go), reported as
    /// [`Event::RecoveryLost`]. A later [`poll`](Self::poll) connects
    /// again.
    pub fn disconnect(&mut self) {
        if let FanLink::Up(mut c) = std::mem::replace(&mut self.link, FanLink::Down) {
            c.close();
            self.state.set_recovery_link(crate::clock::now_ns(), false);
        }
    }
    /// Next event (snapshot applied, resync, connection lost, ...).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.state.poll_event()
    }

    /// Does all pending work once: takes up to `fragment_limit` frames the
    /// publisher wrote into the state machine (delivering in order to `app`), handles
    /// timers and sends the requests the state machine asks for. Returns
    /// the valid datagrams and recovery frames taken. Never blocks,
    /// allocates or logs per message. A lost connection is reported once,
    /// as [`Event::RecoveryLost`], not as an error, and made again by later
    /// polls (see [`new`](Self::new)); while it is down a poll only steps
    /// the connection's set-up, at most once per 50 us.
    pub fn poll<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: Mono,
        app: &mut A,
        fragment_limit: usize,
    ) -> Result<usize, NetError> {
        let now = now.as_nanos();
        let FanLink::Up(conn) = &mut self.link else {
            if self.dial.backoff.due(now) {
                self.manage_link(now);
            }
            return Ok(0);
        };
        let state = &mut self.state;
        let stats = &mut self.stats;
        let (channel, tags) = (self.channel, self.tags);
        let mut taken = 0;
        let mut broken = false;
        let r = conn.subscription().poll(
            |f| match f.msg_type {
                FRAME_DATAGRAM => {
                    stats.datagrams += 1;
                    if state.on_datagram(now, Line::A, f.payload, app) {
                        taken += 1;
                    }
                }
                FRAME_RECOVERY => {
                    stats.recovery_frames += 1;
                    state.on_recovery(now, f.payload, app);
                    taken += 1;
                }
                FRAME_WELCOME => match FanoutWelcome::read_from_prefix(f.payload) {
                    Ok((w, _))
                        if w.magic.get() == WELCOME_MAGIC
                            && w.version == wire::VERSION
                            && w.channel.get() == channel
                            && (w.flags & FLAG_DATAGRAM_TAG != 0) == tags =>
                    {
                        state.announce_session(now, w.session.get());
                    }
                    _ => {
                        stats.bad_frames += 1;
                        broken = true;
                    }
                },
                _ => stats.bad_frames += 1,
            },
            fragment_limit,
        );
        // A live publisher writes at least a heartbeat every
        // `heartbeat_interval_ns` (see `RcFanoutPublisher::heartbeats`); one
        // that died sends no disconnect, and our ring simply stays empty.
        if matches!(r, Ok(n) if n > 0) {
            self.heard_at = now;
        }
        // Fewer frames than asked for: the ring is read empty, so whatever
        // the publisher wrote before now (any answer it sent) is taken.
        if matches!(r, Ok(n) if n < fragment_limit) {
            state.link_drained(now);
        }
        let silent = now.saturating_sub(self.heard_at) > self.silence_ns;
        if silent && r.is_ok() && !broken {
            stats.silent_links += 1;
        }
        let mut ok = r.is_ok() && !broken && !silent;
        if ok && state.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
            state.handle_timeout(now, app);
        }
        let mut sent = false;
        while ok {
            let Some(req) = state.poll_transmit() else {
                break;
            };
            let n = req.encode(&mut self.req).unwrap_or(0);
            match conn
                .publication(STREAM)
                .offer(FRAME_REQUEST, &self.req[..n])
            {
                Ok(()) => {
                    stats.requests_sent += 1;
                    sent = true;
                }
                Err(OfferError::BackPressured) => stats.requests_dropped += 1,
                Err(_) => ok = false,
            }
        }
        if sent && conn.flush().is_err() {
            ok = false;
        }
        if !ok {
            if let FanLink::Up(mut c) = std::mem::replace(&mut self.link, FanLink::Down) {
                c.close();
            }
            self.stats.connections_lost += 1;
            self.state.set_recovery_link(now, false);
            self.dial.backoff.lost(now);
        }
        Ok(taken)
    }

    /// One step of the connection's set-up: an attempt when it is down (and
    /// its back-off has passed), a handshake step while it is being made.
    /// Nothing here waits.
    fn manage_link(&mut self, now: u64) {
        let d = &mut self.dial;
        let step = match std::mem::replace(&mut self.link, FanLink::Down) {
            up @ FanLink::Up(_) => {
                self.link = up;
                return;
            }
            FanLink::Down => {
                Connection::start(&d.cfg, d.publisher, d.local).map(ConnectProgress::Pending)
            }
            FanLink::Connecting(c) => c.poll(),
        };
        match step {
            Ok(ConnectProgress::Pending(c)) => {
                self.link = FanLink::Connecting(c);
                d.backoff.check_after(now, CM_STEP_NS);
            }
            Ok(ConnectProgress::Done(conn)) => {
                self.link = FanLink::Up(conn);
                self.heard_at = now;
                self.stats.reconnects += 1;
                d.backoff.connected();
                self.state.set_recovery_link(now, true);
            }
            Err(e) => {
                self.stats.reconnect_failures += 1;
                if self.stats.reconnect_failures.is_power_of_two() {
                    tracing::warn!(publisher = %d.publisher, error = %e, failures = self.stats.reconnect_failures,
                        "market data over RC: cannot connect to the publisher; retrying");
                }
                d.backoff.failed(now);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 41: RC fan-out answers draw on the same repair budget as the
    /// recovery port: every byte of retransmit answers and snapshots is
    /// charged, a retransmit answer is cut to `repair_request_bytes`, a spent
    /// budget drops requests, and over the run the subscriber got at most
    /// burst + rate x T + one item. Without the budget the 50 requests below
    /// were all answered (about 50 x 3 x 58 bytes).
    #[test]
    fn rc_fanout_answers_draw_on_the_repair_budget() {
        use crate::mcast::publisher::PublisherConfig;
        use crate::mcast::wire::RetransmitRequest;
        struct App;
        impl Snapshot for App {
            fn snapshot_seq(&self) -> u64 {
                100
            }
            fn write_snapshot(&self, out: &mut Vec<u8>) {
                out.extend_from_slice(&[7u8; 2500]);
            }
        }
        let mut state = PublisherState::new(PublisherConfig {
            channel: 3,
            session: 77,
            max_datagram: 64,
            max_messages: 1,
            flush_interval_ns: 0,
            history_depth: 1000,
            max_message_bytes: 0,
        });
        for i in 0..100u64 {
            let _ = state.publish_flushing(&i.to_le_bytes()).unwrap();
        }
        state.flush();
        let limits = Limits {
            max_outbox: 1 << 20,
            max_request_messages: 20,
            max_frame: 4096,
            requests_per_sec: 1_000_000,
            request_burst: 1_000,
            snapshots_per_sec: 1_000_000,
            snapshot_burst: 1_000,
            snapshot_reuse_ns: 0,
            repair_bytes_per_sec: 1_000,
            repair_burst_bytes: 1_000,
            repair_request_bytes: 200,
            heartbeat_ns: 1,
            quiet_ns: 1,
            slow_ns: 1,
            max_subscribers: 1,
            tags: false,
        };
        let (mut requests, mut snapshots) =
            (Pacer::new(1_000_000, 1_000), Pacer::new(1_000_000, 1_000));
        let mut budget = ByteBudget::new(limits.repair_bytes_per_sec, limits.repair_burst_bytes);
        let mut p = RequestPacers {
            requests: &mut requests,
            snapshots: &mut snapshots,
            budget: &mut budget,
        };
        let (mut cache, mut stats, mut outbox) =
            (SnapshotCache::default(), FanoutStats::default(), Vec::new());
        for k in 0..50u64 {
            let r = RetransmitRequest {
                channel: 3,
                session: 77,
                from_seq: 1 + k,
                count: 20,
            };
            answer_request(
                RecoveryMsg::RetransmitRequest(r),
                0,
                &mut state,
                &App,
                &mut cache,
                &limits,
                &mut stats,
                &mut p,
                &mut outbox,
            );
        }
        // One answer: a datagram of 34 bytes with its header, three fit 200.
        let one = RECOVERY_HEADER_LEN + 34;
        assert_eq!(
            (stats.retransmit_requests, stats.repair_requests_cut),
            (6, 6),
            "{stats:?}"
        );
        assert_eq!(stats.repair_budget_dropped, 44);
        assert_eq!(outbox.len(), 6 * 3 * one);
        assert!(outbox.len() <= 1_000 + 200, "burst + one item");
        // Spent: a snapshot waits; a second later it is served whole.
        let snap = RecoveryMsg::SnapshotRequest {
            channel: 3,
            session: 77,
        };
        answer_request(
            snap,
            0,
            &mut state,
            &App,
            &mut cache,
            &limits,
            &mut stats,
            &mut p,
            &mut outbox,
        );
        assert_eq!(
            (stats.snapshots_served, stats.repair_budget_dropped),
            (0, 45)
        );
        let snap = RecoveryMsg::SnapshotRequest {
            channel: 3,
            session: 77,
        };
        answer_request(
            snap,
            1_000_000_000,
            &mut state,
            &App,
            &mut cache,
            &limits,
            &mut stats,
            &mut p,
            &mut outbox,
        );
        assert_eq!(stats.snapshots_served, 1);
        // ... and its debt keeps the next request out.
        let r = RetransmitRequest {
            channel: 3,
            session: 77,
            from_seq: 1,
            count: 1,
        };
        answer_request(
            RecoveryMsg::RetransmitRequest(r),
            2_000_000_000,
            &mut state,
            &App,
            &mut cache,
            &limits,
            &mut stats,
            &mut p,
            &mut outbox,
        );
        assert_eq!(stats.repair_budget_dropped, 46);
    }

    const RC: &str = "[auth]\nsecret = \"s\"\n[[channels]]\nid = 3\nname = \"bbo\"\ntransport = \"rc\"\nport = 7700\n";

    fn key_of(text: &str) -> String {
        match McastConfig::from_toml_str(text) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn rc_transport_parses_with_defaults() {
        let cfg = McastConfig::from_toml_str(RC).unwrap();
        let ch = cfg.channel(3).unwrap();
        assert_eq!(ch.transport, Transport::Rc);
        assert!(ch.line_a.is_unspecified() && ch.line_b.is_none());
        assert_eq!(cfg.rc_fanout, RcFanoutConfig::default());
        assert_eq!(rc_channel(&cfg, 3).unwrap(), 7700);
        let o = orders_config(&cfg);
        assert_eq!(o.validate(), Ok(()));
        assert!(
            !o.token.is_empty() && o.token != "s",
            "domain-separated token"
        );
        assert_eq!(o.max_payload, 4096);
        // The multicast default is unchanged, and asks for its groups.
        let m = McastConfig::from_toml_str(
            "[[channels]]\nid = 1\nname = \"a\"\nline_a = \"239.0.0.1\"\nport = 1\n",
        )
        .unwrap();
        assert_eq!(m.channels[0].transport, Transport::Multicast);
        assert!(matches!(
            rc_channel(&m, 1),
            Err(NetError::WrongTransport {
                configured: "multicast",
                ..
            })
        ));
    }

    #[test]
    fn config_errors_name_the_key() {
        assert_eq!(
            key_of(&RC.replace("port = 7700", "port = 7700\nline_a = \"239.1.1.1\"")),
            "channels[0].line_a"
        );
        assert_eq!(
            key_of(&RC.replace("port = 7700", "port = 7700\nline_b = \"239.1.1.2\"")),
            "channels[0].line_b"
        );
        assert_eq!(
            key_of(&RC.replace("transport = \"rc\"\n", "")),
            "channels[0].line_a"
        );
        for (bad, key) in [
            ("ring_size = 100000", "rc_fanout.ring_size"),
            ("ring_size = 16384", "rc_fanout.ring_size"),
            ("slow_subscriber_ns = 0", "rc_fanout.slow_subscriber_ns"),
            ("max_subscribers = 0", "rc_fanout.max_subscribers"),
        ] {
            assert_eq!(key_of(&format!("[rc_fanout]\n{bad}\n{RC}")), key, "{bad}");
        }
        // A typo in the transport is a parse error, not a default.
        assert!(matches!(
            McastConfig::from_toml_str(&RC.replace("\"rc\"", "\"rdma\"")),
            Err(ConfigError::Parse(_))
        ));
        // 4 KiB datagrams need rings of four 4,144-byte frames.
        let big = format!("max_datagram_payload = 4096\n[rc_fanout]\nring_size = 65536\n{RC}");
        assert!(McastConfig::from_toml_str(&big).is_ok());
    }

    #[test]
    fn a_full_ring_is_skipped_then_dropped_after_the_bound() {
        let mut c = SubscriberCursor::new(100);
        assert_eq!(c.check(100), Ok(()));
        c.wrote(164);
        assert_eq!(c.next(), 164);
        // Full: skipped, not dropped, until slow_ns has passed.
        assert_eq!(c.blocked(1_000, 500), Ok(()));
        assert_eq!(c.blocked(1_499, 500), Ok(()));
        // Progress resets the clock.
        c.wrote(200);
        assert_eq!(c.blocked(1_600, 500), Ok(()));
        assert_eq!(c.blocked(2_099, 500), Ok(()));
        assert_eq!(c.blocked(2_100, 500), Err(FanoutDrop::Stalled));
    }

    #[test]
    fn falling_out_of_the_history_is_a_drop() {
        let c = SubscriberCursor::new(50);
        // The oldest datagram the history still has starts later.
        assert_eq!(c.check(51), Err(FanoutDrop::BehindHistory));
        assert_eq!(
            c.check(40),
            Ok(()),
            "a datagram that began earlier still holds 50"
        );
    }

    #[test]
    fn example_configs_are_valid() {
        let rc = McastConfig::from_toml_str(include_str!("../../../configs/md-rc.toml")).unwrap();
        assert_eq!(rc.channels[0].transport, Transport::Rc);
        let m = McastConfig::from_toml_str(include_str!("../../../configs/md.toml")).unwrap();
        assert_eq!(m.channels[0].transport, Transport::Multicast);
        assert_eq!(m.rc_fanout, RcFanoutConfig::default());
    }

    #[test]
    fn welcome_has_a_fixed_layout() {
        let w = FanoutWelcome {
            magic: WELCOME_MAGIC.into(),
            channel: 3.into(),
            flags: FLAG_DATAGRAM_TAG,
            version: wire::VERSION,
            session: 0x0102_0304_0506_0708.into(),
        };
        const BYTES: [u8; 16] = [b'R', b'B', b'F', b'1', 3, 0, 1, 1, 8, 7, 6, 5, 4, 3, 2, 1];
        assert_eq!(w.as_bytes(), &BYTES);
        let (back, _) = FanoutWelcome::read_from_prefix(&BYTES).unwrap();
        assert_eq!(back.session.get(), 0x0102_0304_0506_0708);
        assert!(FanoutWelcome::read_from_prefix(&BYTES[..15]).is_err());
    }

    #[test]
    fn recovery_messages_are_split_by_their_length() {
        let mut out = vec![0u8; 256];
        let n = wire::encode_snapshot_request(&mut out, 3, 9).unwrap();
        assert_eq!(recovery_len(&out[..n]), Some(n));
        assert_eq!(recovery_len(&out[..n - 1]), None);
        assert_eq!(recovery_len(&[]), None);
    }

    /// Both ends of an RC fan-out channel build its connections from the market-data
    /// file's `[rdma]` table as every orders-path user does (`apply_to_orders`): inline
    /// size, traffic class, service level, retries, MTU; unset keys keep the channel's own
    /// values (its ACK timeout is `[recovery] rc_timeout`).
    #[test]
    fn fan_out_connections_carry_the_rdma_table() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/md.toml");
        let text = std::fs::read_to_string(path).unwrap();
        let plain = McastConfig::from_toml_str(&text).unwrap();
        let o = orders_config(&plain);
        assert_eq!(o.max_inline, crate::rdma_settings::DEFAULT_MAX_INLINE);
        assert_eq!(o.rc.timeout, plain.recovery.rc_timeout);
        let mut cfg = plain.clone();
        cfg.rdma.max_inline = Some(64);
        cfg.rdma.traffic_class = 138;
        cfg.rdma.service_level = 3;
        cfg.rdma.retry_count = Some(2);
        cfg.rdma.ack_timeout = Some(9);
        let o = orders_config(&cfg);
        assert_eq!(o.max_inline, 64);
        assert_eq!(
            (
                o.rc.traffic_class,
                o.rc.service_level,
                o.rc.retry_count,
                o.rc.timeout
            ),
            (138, 3, 2, 9)
        );
    }
}
