//! Subscriber state machine: A/B arbitration, in-order delivery, gap
//! recovery, and re-synchronisation from snapshots.
//!
//! Parts, each an owned sub-machine in its own file with its own tests
//! (quinn's `Connection` over its parts, Aeron's receiver over its
//! `LossDetector`); [`SubscriberState`] composes them and decides nothing
//! of its own beyond the composition (phases, events, counters, delivery):
//! - `arbitration`: what an arriving datagram is to the stream (the first
//!   copy of A, B or a retransmission is used, later ones are counted
//!   duplicates);
//! - `reorder`: the out-of-order buffer and the holes in it;
//! - `loss`: the loss detector (requests, the A/B window, the retry wait,
//!   give-up);
//! - `resync`: jump corroboration and the snapshot transfer;
//! - `tolerance`: gap-tolerant delivery's stall timer;
//! - `link_watch`: the recovery link's state and the dead-link rule.
//!
//! Inputs: datagrams (with the line they came on), recovery messages from RC,
//! and the passage of time ([`SubscriberState::handle_timeout`]). Outputs:
//! messages to a [`Handler`], requests to send
//! ([`SubscriberState::poll_transmit`]) and events
//! ([`SubscriberState::poll_event`]). All memory is allocated in
//! [`SubscriberState::new`]; the in-order path delivers straight from the
//! caller's receive buffer without copying.
//!
//! Phases: `Idle` until the first datagram; `Live` while delivering;
//! `Resyncing` after an unrecoverable loss, a late join or a publisher
//! restart, until a snapshot is applied. While resyncing, live datagrams are
//! buffered (the oldest evicted when the buffer is full) and delivered after
//! the snapshot from its sequence + 1 on.
//!
//! A/B arbitration window: with two lines, a hole seen on one line is often
//! filled by the other a moment later. A hole is therefore requested only if
//! it is still open `ab_grace_ns` after it was seen (0: at once, which is
//! what a single line uses).
//!
//! Session: the subscriber follows only the session the publisher announced
//! over the authenticated recovery connection
//! ([`SubscriberState::announce_session`]); datagrams of any other session
//! (a restarted publisher not yet reconnected to, or a forger on the fabric)
//! are dropped and counted, never adopted. A new announcement resets the
//! state and re-synchronises from a snapshot.
//!
//! Datagram tags: with a key set ([`SubscriberState::set_datagram_key`]),
//! every datagram must end with the publisher's 8-byte tag over the rest of
//! it; a datagram without a valid tag is dropped and counted before anything
//! else is looked at.
//!
//! Recovery link: the I/O layer reports its RC connection going down and up
//! ([`SubscriberState::set_recovery_link`]). While it is down, multicast is
//! still delivered in order; a hole that outlives the arbitration window
//! cannot be recovered and becomes an [`Event::UnrecoverableLoss`] (then a
//! re-synchronisation, whose snapshot is requested once the link is back).
//!
//! Large messages: fragment datagrams are delivered in sequence like any
//! datagram, into a [`Reassembler`] allocated once (`max_message_bytes`);
//! the handler gets the whole message with the sequence of its last
//! fragment. A fragment that does not continue the message under way is
//! dropped and counted.
//!
//! Gap-tolerant delivery (`gap_tolerance_ns > 0`; 0 is strict, the
//! default): a hole at the delivery point that stays open that long, or is
//! known unrecoverable (not in the history, retries exhausted, link down,
//! buffer full), is skipped instead of re-synchronising: the handler's
//! [`Handler::on_gap`] and an [`Event::GapSkipped`] report the lost range,
//! a large message cut by the hole is dropped, and delivery goes on after
//! it. Strict subscribers never skip.
//!
//! Jumps need corroboration (without datagram tags, anyone who can put a
//! datagram of the announced session on the fabric can forge a header): a
//! live datagram or heartbeat starting more than `claim_threshold` beyond
//! the highest sequence known is only a claim. It is counted
//! ([`SubscriberCounters::claimed`]) and dropped: no hole, no request, no
//! loss. New data of the stream, or a heartbeat at the highest sequence
//! known, disproves it; it is accepted once it has stood `claim_timeout_ns`
//! with no such datagram, backed by `claim_packets` far-ahead datagrams.
//! Retransmissions (over the authenticated recovery connection) and tagged
//! datagrams are never claims. While re-synchronising, nothing is known to
//! anchor a jump against, so heartbeats do not raise the highest sequence
//! and, once the snapshot is applied, it is recomputed from the snapshot
//! and the buffered datagrams that follow it within the threshold; buffered
//! datagrams beyond are dropped as claims.

use std::collections::VecDeque;

use super::fragment::{Push, Reassembler};
use super::snapshot::{Handler, SnapshotSink};
use super::wire::{
    self, BufferTooSmall, Datagram, Line, OneMessageHeader, RecoveryMsg, RetransmitRequest,
};
use crate::auth::{DatagramKey, DATAGRAM_TAG_LEN};
use crate::clock::Mono;

mod arbitration;
mod link_watch;
mod loss;
mod reorder;
mod resync;
mod tolerance;

use arbitration::{arbitrate, count_duplicate, count_received, Arrival, Source};
use link_watch::{LinkChange, RecoveryLink};
pub use link_watch::{LinkWatch, DEAD_LINK_TIMEOUTS};
use loss::LossDetector;
use reorder::{Holes, ReorderBuffer};
use resync::{Jump, JumpGuard, SnapshotTransfer};
use tolerance::Tolerance;

/// Static parameters of one subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// Channel id; datagrams of other channels are dropped and counted.
    pub channel: u16,
    /// Largest datagram accepted (header included).
    pub max_datagram: usize,
    /// Datagrams that can be held out of order.
    pub max_buffered: usize,
    /// Retransmit requests in flight at once.
    pub max_outstanding: usize,
    /// Least time to wait for a retransmission before asking again.
    pub recovery_timeout_ns: u64,
    /// Most time to wait before asking again. Above `recovery_timeout_ns`
    /// the wait adapts as TCP's retransmit timer does (RFC 6298): it is the
    /// measured time from asking for a range to having it (smoothed, plus
    /// four mean deviations), at least `recovery_timeout_ns`; each time a
    /// request goes unanswered it doubles, up to this, until a request
    /// asked once is answered again. At or below `recovery_timeout_ns` (0
    /// included) the wait is `recovery_timeout_ns`, fixed.
    pub max_recovery_timeout_ns: u64,
    /// Re-requests of a range before it is declared lost.
    pub max_retries: u32,
    /// Time without snapshot progress before the snapshot is asked again.
    pub snapshot_timeout_ns: u64,
    /// A/B arbitration window: how long a hole may stay open, waiting for
    /// the other line, before it is requested. 0 requests at once (use 0
    /// with a single line).
    pub ab_grace_ns: u64,
    /// A first datagram that starts at most this many messages into the
    /// stream is taken as a subscriber present from the start that lost the
    /// first datagrams: the missing start is requested from the publisher's
    /// history like any gap. Further in, it is a late join and a snapshot is
    /// asked for. 0: only a stream seen from its first message skips the
    /// snapshot.
    pub join_replay_max: u64,
    /// Most messages asked for in one retransmit request; larger holes are
    /// split (the publisher answers no more per request).
    pub max_request_messages: u64,
    /// Largest message reassembled from fragments (the reassembly buffer,
    /// allocated once); 0 drops every fragment.
    pub max_message_bytes: usize,
    /// Gap-tolerant delivery: a hole at the delivery point open this long
    /// (or known unrecoverable) is skipped and reported instead of
    /// re-synchronising. 0: strict (never skip).
    pub gap_tolerance_ns: u64,
    /// Untagged datagrams starting more than this many messages beyond the
    /// highest sequence known are claims (see the module documentation).
    pub claim_threshold: u64,
    /// Far-ahead datagrams (the first included) that must back a claim
    /// before it is accepted.
    pub claim_packets: u32,
    /// How long a claim must stand with no new datagram of the stream
    /// before it is accepted (longer than a few heartbeat intervals).
    pub claim_timeout_ns: u64,
}

/// Where the subscriber stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No datagram of the announced session seen yet.
    Idle,
    /// Delivering in order.
    Live,
    /// Waiting for a snapshot; live datagrams are buffered.
    Resyncing,
}

/// Something the application should know about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Messages `[from, to)` cannot be recovered (not in the publisher's
    /// history, retries exhausted, or the buffer overflowed). The subscriber
    /// re-synchronises from a snapshot next, which also covers later holes.
    UnrecoverableLoss {
        /// First lost sequence.
        from: u64,
        /// One past the last lost sequence.
        to: u64,
    },
    /// The publisher announced a new session over the recovery connection
    /// (it restarted); state is reset and a snapshot requested.
    SessionChanged {
        /// Previous session.
        old: u64,
        /// New session.
        new: u64,
    },
    /// A re-synchronisation or late join started; a snapshot is requested.
    ResyncStarted,
    /// A snapshot was applied; delivery resumes at `seq + 1`.
    SnapshotApplied {
        /// The snapshot's sequence.
        seq: u64,
    },
    /// The recovery connection is down: multicast is still delivered, but
    /// holes become [`Event::UnrecoverableLoss`] until it is back.
    RecoveryLost,
    /// The recovery connection is back; a pending snapshot is requested.
    RecoveryRestored,
    /// Gap-tolerant delivery skipped sequences `[from, to)` (never
    /// repaired); delivery goes on at `to`. The handler saw
    /// [`Handler::on_gap`] with the same range first.
    GapSkipped {
        /// First skipped sequence.
        from: u64,
        /// One past the last skipped sequence.
        to: u64,
    },
}

/// A recovery request to send over RC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// Ask the publisher for a range.
    Retransmit(RetransmitRequest),
    /// Ask the snapshot server for a snapshot.
    Snapshot {
        /// Channel id.
        channel: u16,
        /// Session the subscriber follows.
        session: u64,
    },
}

impl Request {
    /// Encodes the request into `out`; returns the bytes written.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, BufferTooSmall> {
        match self {
            Request::Retransmit(r) => r.encode(out),
            Request::Snapshot { channel, session } => {
                wire::encode_snapshot_request(out, *channel, *session)
            }
        }
    }
}

/// Subscriber counters: plain values, copied out by
/// [`SubscriberState::counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberCounters {
    /// Datagrams received on line A (valid, this channel).
    pub received_a: u64,
    /// Datagrams received on line B.
    pub received_b: u64,
    /// Retransmitted datagrams received over RC.
    pub received_retransmit: u64,
    /// Line A datagrams dropped as already seen.
    pub duplicates_a: u64,
    /// Line B datagrams dropped as already seen.
    pub duplicates_b: u64,
    /// Retransmitted datagrams dropped as already seen.
    pub duplicates_retransmit: u64,
    /// Messages delivered to the handler.
    pub delivered: u64,
    /// Holes detected in the sequence.
    pub gaps_detected: u64,
    /// Messages that arrived by retransmission and were used.
    pub messages_recovered: u64,
    /// Retransmit requests handed out by `poll_transmit`.
    pub retransmit_requests: u64,
    /// Retransmit requests or snapshots that timed out.
    pub timeouts: u64,
    /// UnrecoverableLoss events.
    pub unrecoverable: u64,
    /// Snapshot requests handed out.
    pub snapshot_requests: u64,
    /// Snapshots applied.
    pub snapshots_applied: u64,
    /// Snapshots rejected (bad length, CRC, order, or by the application).
    pub snapshots_rejected: u64,
    /// Datagrams put in the out-of-order buffer.
    pub out_of_order_buffered: u64,
    /// High-water mark of the out-of-order buffer (datagrams).
    pub max_buffered: u64,
    /// Buffered datagrams evicted while resyncing (buffer full).
    pub evicted: u64,
    /// Undecodable input dropped (datagrams or recovery messages).
    pub malformed_dropped: u64,
    /// Valid input for another channel dropped.
    pub foreign_dropped: u64,
    /// Datagrams (and retransmissions) of a session other than the one the
    /// publisher announced, or before any announcement, dropped.
    pub wrong_session_dropped: u64,
    /// Datagrams whose tag was missing or wrong (tags on), dropped.
    pub bad_tag_dropped: u64,
    /// Publisher session changes (announced).
    pub session_changes: u64,
    /// Receive queue ran low (reported by the I/O layer).
    pub receive_queue_low: u64,
    /// Events dropped because `poll_event` was not called often enough.
    pub events_dropped: u64,
    /// Holes filled (by the other line, or a retransmission already under
    /// way) inside the A/B arbitration window, so never requested.
    pub gaps_filled_by_other_line: u64,
    /// Holes declared lost because the recovery connection was down.
    pub lost_while_link_down: u64,
    /// Times the recovery connection was reported down.
    pub recovery_link_lost: u64,
    /// Large messages reassembled and delivered (also in `delivered`).
    pub large_messages: u64,
    /// Fragments dropped: larger than `max_message_bytes`, or not the
    /// continuation of the message under way (forged, stray, or after a
    /// skipped hole).
    pub fragments_dropped: u64,
    /// Large messages under way dropped incomplete (a hole was skipped in
    /// them, or a new one started in their middle).
    pub partial_messages_dropped: u64,
    /// Holes skipped by gap-tolerant delivery.
    pub gaps_skipped: u64,
    /// Sequences skipped by gap-tolerant delivery.
    pub sequences_skipped: u64,
    /// Datagrams beyond the claim threshold held as an unconfirmed jump
    /// (dropped), including buffered ones dropped after a snapshot.
    pub claimed: u64,
    /// Claims disproved by new datagrams of the stream.
    pub claims_disproved: u64,
    /// Claims accepted as a real jump.
    pub claims_accepted: u64,
    /// Answers from the publisher that a range asked for was never sent
    /// (a heartbeat ahead of the stream, within the claim threshold, forged
    /// or stray, made us ask): the range was forgotten, not declared lost.
    pub not_yet_published: u64,
}

const EVENT_CAPACITY: usize = 64;

/// The subscriber's protocol state. See the module documentation.
#[derive(Debug)]
pub struct SubscriberState {
    cfg: SubscriberConfig,
    phase: Phase,
    session: u64,
    /// Next sequence to deliver (meaningful when Live).
    next_seq: u64,
    /// One past the highest sequence known to exist.
    high: u64,
    /// Datagrams ahead of the delivery point.
    buffer: ReorderBuffer,
    /// The holes asked for or waiting to be, and the retry wait.
    loss: LossDetector,
    snapshot: SnapshotTransfer,
    events: VecDeque<Event>,
    counters: SubscriberCounters,
    /// The recovery connection as the I/O layer reports it.
    link: RecoveryLink,
    /// A session was announced: datagrams of `session` only are accepted.
    announced: bool,
    /// Datagram tag key (tags required when set).
    key: Option<DatagramKey>,
    /// The latency path's prebuilt header (see [`Self::on_datagram`]): set
    /// once a session is announced.
    one_message: Option<OneMessageHeader>,
    /// Large message reassembly.
    reasm: Reassembler,
    /// Gap-tolerant delivery's stall timer.
    tolerance: Tolerance,
    /// Far-ahead datagrams not yet corroborated (see the module
    /// documentation).
    jumps: JumpGuard,
    /// `Some` when the stream and the answers come over one reliable,
    /// in-order connection (RC fan-out): when its receive ring was last
    /// found empty (see [`Self::link_drained`]).
    drained_at: Option<u64>,
}

impl SubscriberState {
    /// Allocates the out-of-order buffer (`max_buffered * max_datagram` bytes)
    /// and the bounded queues.
    pub fn new(mut cfg: SubscriberConfig) -> Self {
        cfg.max_buffered = cfg.max_buffered.clamp(1, u32::MAX as usize);
        cfg.max_outstanding = cfg.max_outstanding.max(1);
        cfg.max_datagram = cfg.max_datagram.min(u32::MAX as usize);
        cfg.max_request_messages = cfg.max_request_messages.max(1);
        SubscriberState {
            phase: Phase::Idle,
            session: 0,
            next_seq: 1,
            high: 1,
            buffer: ReorderBuffer::new(cfg.max_buffered, cfg.max_datagram),
            loss: LossDetector::new(&cfg),
            snapshot: SnapshotTransfer::new(&cfg),
            events: VecDeque::with_capacity(EVENT_CAPACITY),
            counters: SubscriberCounters::default(),
            link: RecoveryLink::new(),
            announced: false,
            key: None,
            one_message: None,
            reasm: Reassembler::new(cfg.max_message_bytes),
            tolerance: Tolerance::new(cfg.gap_tolerance_ns),
            jumps: JumpGuard::new(&cfg),
            drained_at: None,
            cfg,
        }
    }

    /// The stream and the answers to our requests arrive over one
    /// reliable, in-order connection (RC fan-out), not as datagrams that
    /// may be lost: a request reaches the publisher, and its answer
    /// arrives behind everything written to the connection before it. It
    /// is late because the publisher is busy (its outbox waits for room in
    /// our ring) or because the application has not read the backlog
    /// ahead of it; it is missing only if the publisher refused the
    /// request (its rate limit, outbox bound or repair budget), which a
    /// well-behaved subscriber rarely meets. So a request is asked again
    /// after `wait_ns` (fixed: the link's silence bound, which the I/O
    /// layer passes), and only once the connection's receive ring was
    /// found empty after that deadline
    /// ([`link_drained`](Self::link_drained)); the same holds for a
    /// snapshot's timer. A subscriber reading a backlog slowly is then not
    /// made to ask again, and to declare ranges lost, for answers queued
    /// behind it (CI 12-07: a recorder joining 10,000 messages in gave
    /// `1..4097` up as lost after the 200 us-100 ms multicast waits while
    /// the answer was on its way).
    pub(crate) fn set_in_order_link(&mut self, wait_ns: u64) {
        self.drained_at = Some(0);
        self.loss
            .fix_wait(wait_ns.max(self.cfg.recovery_timeout_ns).max(1));
    }

    /// The in-order connection's receive ring was found empty at `now`
    /// (see [`set_in_order_link`](Self::set_in_order_link); ignored
    /// otherwise).
    pub(crate) fn link_drained(&mut self, now: u64) {
        if let Some(t) = &mut self.drained_at {
            *t = now;
        }
    }

    /// The time up to which deadlines may have passed: `now`, or on an
    /// in-order connection the last time its ring was empty.
    fn timers_due(&self, now: u64) -> u64 {
        self.drained_at.map_or(now, |t| t.min(now))
    }

    /// Requires a valid tag made with `key` at the end of every datagram
    /// (`None`: no tags). Set before the first datagram.
    pub fn set_datagram_key(&mut self, key: Option<DatagramKey>) {
        self.key = key;
        self.prebuild_header();
    }

    /// What the latency path compares a datagram's header with: this
    /// channel and the announced session.
    fn prebuild_header(&mut self) {
        self.one_message = self
            .announced
            .then(|| OneMessageHeader::new(self.cfg.channel, self.session));
    }

    /// The session the publisher announced over the authenticated recovery
    /// connection. The first announcement sets it; a different one later (a
    /// restarted publisher) raises [`Event::SessionChanged`], forgets the
    /// old session and re-synchronises from a snapshot. The same session
    /// again (a reconnect) changes nothing.
    pub fn announce_session(&mut self, now: u64, session: u64) {
        if self.announced && session == self.session {
            return;
        }
        let first = !self.announced;
        self.announced = true;
        if first && self.phase == Phase::Idle {
            self.session = session;
            self.prebuild_header();
            return;
        }
        self.counters.session_changes += 1;
        self.push_event(Event::SessionChanged {
            old: self.session,
            new: session,
        });
        self.reset();
        self.session = session;
        self.prebuild_header();
        if self.phase != Phase::Idle {
            self.start_resync(now);
        }
    }

    /// Current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }
    /// Publisher session being followed (0 before the first announcement).
    pub fn session(&self) -> u64 {
        self.session
    }
    /// Next sequence the handler will see (when Live).
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// Counters.
    pub fn counters(&self) -> SubscriberCounters {
        self.counters
    }
    /// Requests or snapshots that timed out so far (`counters().timeouts`
    /// without copying every counter).
    pub fn timeouts(&self) -> u64 {
        self.counters.timeouts
    }
    /// Far-ahead datagrams held as unconfirmed claims so far
    /// (`counters().claimed` without copying every counter).
    pub fn claimed(&self) -> u64 {
        self.counters.claimed
    }
    /// Whether an answer from the recovery service may be on its way: a
    /// retransmit request or a snapshot request is open. The I/O layer polls
    /// the recovery connection on every turn only then.
    pub fn expects_recovery(&self) -> bool {
        !self.loss.is_empty() || self.phase == Phase::Resyncing
    }
    /// Datagrams currently buffered out of order.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }
    /// Retransmit requests in flight, and holes waiting in the arbitration
    /// window.
    pub fn outstanding(&self) -> usize {
        self.loss.len()
    }
    /// Whether the recovery connection is reported up.
    pub fn recovery_link_up(&self) -> bool {
        self.link.is_up()
    }
    /// How long a request asked for the first time waits before it is asked
    /// again (see [`SubscriberConfig::max_recovery_timeout_ns`]).
    pub fn retry_wait_ns(&self) -> u64 {
        self.loss.retry_wait()
    }
    /// The smoothed measured repair time (0 before the first sample).
    pub fn repair_time_ns(&self) -> u64 {
        self.loss.repair_time()
    }

    /// For an I/O layer whose recovery connection is not made yet: marks
    /// it down without [`Event::RecoveryLost`] or a `recovery_link_lost`
    /// count, since no connection was lost (a subscriber made before its
    /// publisher listens would otherwise start with a loss report). Its
    /// coming up is reported as [`Event::RecoveryRestored`]. Only for a
    /// state that has taken nothing yet: afterwards it is
    /// [`set_recovery_link`](Self::set_recovery_link).
    pub(crate) fn start_link_down(&mut self) {
        debug_assert!(self.loss.is_empty() && self.events.is_empty());
        self.link.start_down();
    }

    /// The I/O layer's recovery connection went down (`up == false`) or
    /// came back. Down: raises [`Event::RecoveryLost`], and the holes
    /// requested so far (their answers will not come) are lost. Up: raises
    /// [`Event::RecoveryRestored`] and asks for the snapshot a resync waits
    /// for. Repeated reports of the same state are ignored.
    pub fn set_recovery_link(&mut self, now: u64, up: bool) {
        let Some(change) = self.link.report(up) else {
            return;
        };
        if change == LinkChange::Restored {
            self.push_event(Event::RecoveryRestored);
            if self.phase == Phase::Resyncing {
                self.request_snapshot(now);
            }
            return;
        }
        self.counters.recovery_link_lost += 1;
        self.push_event(Event::RecoveryLost);
        self.snapshot.abandon();
        // Requests already sent died with the connection; holes still in the
        // arbitration window get their chance in handle_timeout.
        if let Some((from, to)) = self.loss.first_asked() {
            self.lost_while_down(now, from, to);
        }
    }

    /// The I/O layer found its receive queue below the low-water mark.
    pub fn receive_queue_low(&mut self) {
        self.counters.receive_queue_low += 1;
    }

    /// Next event, if any. Events are kept in a bounded queue; call this after
    /// each input.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) may have a request
    /// (it has none when this is false): two compares, for an I/O layer's
    /// turn to skip the request path in the steady state.
    pub fn may_transmit(&self) -> bool {
        self.link.is_up() && (!self.loss.is_empty() || self.snapshot.needs_send())
    }

    /// Next request to send over RC, if any. Call after each input.
    pub fn poll_transmit(&mut self) -> Option<Request> {
        if !self.link.is_up() {
            return None;
        }
        if let Some((from, to)) = self.loss.poll_request() {
            self.counters.retransmit_requests += 1;
            return Some(Request::Retransmit(RetransmitRequest {
                channel: self.cfg.channel,
                session: self.session,
                from_seq: from,
                count: to - from,
            }));
        }
        if self.phase == Phase::Resyncing && self.snapshot.take_request() {
            self.counters.snapshot_requests += 1;
            return Some(Request::Snapshot {
                channel: self.cfg.channel,
                session: self.session,
            });
        }
        None
    }

    /// Earliest deadline at which [`handle_timeout`](Self::handle_timeout)
    /// has work.
    #[inline]
    pub fn poll_timeout(&self) -> Option<Mono> {
        // The steady state (nothing requested, not resyncing, no stall or
        // skip pending) has no deadline: four compares, no scan, inlined
        // into the caller's turn (the call cost as much as the compares).
        if self.loss.is_empty() && self.phase != Phase::Resyncing && !self.tolerance.pending() {
            return None;
        }
        self.earliest_deadline().map(Mono::from_nanos)
    }

    /// [`poll_timeout`](Self::poll_timeout) with something pending: kept
    /// out of line, so that the steady state's check inlines small.
    #[inline(never)]
    fn earliest_deadline(&self) -> Option<u64> {
        let retransmit = self.loss.poll_timeout();
        // No snapshot timer while the link is down: coming back asks anyway.
        let snapshot = (self.phase == Phase::Resyncing && self.link.is_up())
            .then_some(self.snapshot.deadline());
        let skip = self.tolerance.deadline();
        [retransmit, snapshot, skip].into_iter().flatten().min()
    }

    /// One datagram from a multicast line (GRH stripped, its source already
    /// checked by the I/O layer). Returns whether it was valid: well formed,
    /// tagged if tags are on, of this channel and the announced session.
    /// Only those count as a sign of life.
    pub fn on_datagram<H: Handler + ?Sized>(
        &mut self,
        now: u64,
        line: Line,
        bytes: &[u8],
        handler: &mut H,
    ) -> bool {
        // The latency path: the next datagram in order, holding one message,
        // in the steady state (live, nothing buffered, requested or known
        // to be missing). Two compares against the prebuilt header stand for
        // the format, channel and session checks, and the message goes to the
        // handler as `accept` would hand it out; anything else (a heartbeat,
        // a batch, a gap, a malformed or foreign datagram) takes the full
        // path, which counts the drops.
        if let Some(expect) = &self.one_message {
            // With tags on, the header and message are matched without the
            // tag, and the tag is checked before anything is delivered or
            // counted as received (a wrong one is dropped as the full path
            // drops it).
            let split = match &self.key {
                None => Some((bytes, &[][..])),
                Some(_) => split_tag(bytes),
            };
            if let Some((seq, msg)) = split.and_then(|(body, _)| expect.match_datagram(body)) {
                if seq == self.next_seq
                    && bytes.len() <= self.cfg.max_datagram
                    && self.high == seq
                    && self.phase == Phase::Live
                    && self.buffer.is_empty()
                    && self.loss.is_empty()
                    && self.jumps.is_clear()
                {
                    if let (Some(key), Some((body, tag))) = (&self.key, split) {
                        if !key.verify(body, tag) {
                            self.counters.bad_tag_dropped += 1;
                            return false;
                        }
                    }
                    count_received(&mut self.counters, line);
                    handler.on_message(seq, msg);
                    self.counters.delivered += 1;
                    self.next_seq = seq + 1;
                    self.high = self.next_seq;
                    return true;
                }
            }
        }
        let Some((d, bytes)) = self.check_datagram(bytes) else {
            return false;
        };
        count_received(&mut self.counters, line);
        self.accept(now, Source::Line(line), bytes, d, handler);
        true
    }

    /// One buffer from the recovery channel, holding one or more recovery
    /// messages. `app` receives the recovered messages and the snapshot.
    pub fn on_recovery<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        mut bytes: &[u8],
        app: &mut A,
    ) {
        while !bytes.is_empty() {
            let Ok((msg, used)) = wire::decode_recovery(bytes) else {
                self.counters.malformed_dropped += 1;
                return;
            };
            bytes = &bytes[used..];
            self.on_recovery_msg(now, msg, app);
        }
    }

    /// Deadlines passed: re-request or give up. With gap-tolerant delivery,
    /// skipping a hole delivers what was buffered behind it to `handler`.
    pub fn handle_timeout<H: Handler + ?Sized>(&mut self, now: u64, handler: &mut H) {
        let due = self.timers_due(now);
        loop {
            let holes = self.buffer.holes(self.next_seq, self.high);
            let link_up = self.link.is_up();
            let Some(e) = self
                .loss
                .expire(now, due, &holes, link_up, &mut self.counters)
            else {
                break;
            };
            let gone = if e.link_down {
                self.lost_while_down(now, e.from, e.to)
            } else {
                self.give_up(now, e.from, e.to)
            };
            if gone {
                return;
            }
        }
        if self.tolerance.enabled() && self.phase == Phase::Live {
            self.skip_gaps(now, handler);
        }
        if self.phase == Phase::Resyncing && self.link.is_up() && self.snapshot.deadline() <= due {
            self.counters.timeouts += 1;
            self.request_snapshot(now);
        }
        if self.phase == Phase::Live {
            self.request_holes(now);
        }
    }

    // -- input validation ---------------------------------------------------

    /// Checks the tag (if on), the format, the channel and the session;
    /// returns the datagram and its bytes without the tag.
    fn check_datagram<'a>(&mut self, bytes: &'a [u8]) -> Option<(Datagram<'a>, &'a [u8])> {
        if bytes.len() > self.cfg.max_datagram {
            self.counters.malformed_dropped += 1;
            return None;
        }
        let bytes = match &self.key {
            None => bytes,
            Some(key) => {
                let Some((body, tag)) = split_tag(bytes) else {
                    self.counters.bad_tag_dropped += 1;
                    return None;
                };
                if !key.verify(body, tag) {
                    self.counters.bad_tag_dropped += 1;
                    return None;
                }
                body
            }
        };
        let Ok(d) = Datagram::parse(bytes) else {
            self.counters.malformed_dropped += 1;
            return None;
        };
        if d.channel() != self.cfg.channel {
            self.counters.foreign_dropped += 1;
            return None;
        }
        if !self.announced || d.session() != self.session {
            self.counters.wrong_session_dropped += 1;
            return None;
        }
        Some((d, bytes))
    }

    fn on_recovery_msg<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        msg: RecoveryMsg<'_>,
        app: &mut A,
    ) {
        match msg {
            RecoveryMsg::RetransmitData { datagram, .. } => {
                let Some((d, datagram)) = self.check_datagram(datagram) else {
                    return;
                };
                self.counters.received_retransmit += 1;
                if self.phase != Phase::Idle {
                    self.accept(now, Source::Retransmit, datagram, d, app);
                }
            }
            RecoveryMsg::NotAvailable(na) => {
                if na.channel != self.cfg.channel {
                    self.counters.foreign_dropped += 1;
                } else if na.session == self.session
                    && self.phase == Phase::Live
                    && na.from_seq >= na.oldest_available
                {
                    // Not older than the history but beyond what the
                    // publisher ever sent (its authenticated word).
                    self.never_published(now, na.from_seq);
                } else if na.session == self.session && self.phase == Phase::Live {
                    let to = na.from_seq.saturating_add(na.count);
                    if let Some((from, to)) = self.missing_in(na.from_seq, to) {
                        if !self.give_up(now, from, to) {
                            self.skip_gaps(now, app);
                        }
                    }
                }
            }
            RecoveryMsg::SnapshotChunk {
                channel,
                session,
                snapshot_seq,
                offset,
                data,
            } => {
                if channel != self.cfg.channel {
                    self.counters.foreign_dropped += 1;
                } else if session == self.session && self.phase == Phase::Resyncing {
                    self.on_snapshot_chunk(now, snapshot_seq, offset, data, app);
                }
            }
            RecoveryMsg::SnapshotEnd(end) => {
                if end.channel != self.cfg.channel {
                    self.counters.foreign_dropped += 1;
                } else if end.session == self.session && self.phase == Phase::Resyncing {
                    self.on_snapshot_end(now, end, app);
                }
            }
            // Requests are for publishers and snapshot servers.
            RecoveryMsg::RetransmitRequest(_)
            | RecoveryMsg::SnapshotRequest { .. }
            | RecoveryMsg::SubscriberStatus(_)
            | RecoveryMsg::AuthProof { .. } => {
                self.counters.malformed_dropped += 1;
            }
        }
    }

    // -- the sequencing core ------------------------------------------------

    fn accept<H: Handler + ?Sized>(
        &mut self,
        now: u64,
        src: Source,
        bytes: &[u8],
        d: Datagram<'_>,
        handler: &mut H,
    ) {
        // The session is the announced one (check_datagram).
        if self.phase == Phase::Live && src != Source::Retransmit && self.key.is_none() {
            match self.jumps.check(
                now,
                self.high.max(self.next_seq),
                self.next_seq,
                d.first_seq(),
                d.end_seq(),
                d.is_heartbeat(),
            ) {
                Jump::Within => {}
                Jump::Held => {
                    self.counters.claimed += 1;
                    return;
                }
                Jump::Accepted => self.counters.claims_accepted += 1,
                Jump::Disproved => self.counters.claims_disproved += 1,
            }
        }
        if self.phase == Phase::Idle {
            if d.first_seq() <= 1 + self.cfg.join_replay_max {
                // Present from the start of the stream: nothing to restore;
                // what came before this datagram is a gap from sequence 1.
                self.phase = Phase::Live;
            } else {
                self.start_resync(now);
            }
        }

        if d.is_heartbeat() {
            // While resyncing there is nothing to check a heartbeat's claim
            // against: the snapshot and the buffered datagrams set `high`.
            if self.phase == Phase::Live && d.first_seq() > self.high {
                if self.phase == Phase::Live {
                    self.counters.gaps_detected += 1;
                }
                self.high = d.first_seq();
                if self.phase == Phase::Live {
                    self.request_holes(now);
                    self.track_stall(now);
                }
            }
            return;
        }

        let live = self.phase == Phase::Live;
        match arbitrate(
            live,
            self.next_seq,
            d.first_seq(),
            d.end_seq(),
            &self.buffer,
        ) {
            Arrival::Duplicate => {
                count_duplicate(&mut self.counters, src);
                return;
            }
            Arrival::Deliver => {
                self.deliver(src, d, handler);
                // The steady state (nothing buffered, requested or known to
                // be missing) has nothing to drain, retire or request.
                if !self.buffer.is_empty() || !self.loss.is_empty() || self.high > self.next_seq {
                    self.drain(handler);
                    self.after_progress(now);
                }
                return;
            }
            Arrival::Overlaps => {
                // Same session, different datagram boundaries: not from our
                // publisher.
                self.counters.malformed_dropped += 1;
                return;
            }
            Arrival::Ahead => {}
        }

        // Ahead of the delivery point (or resyncing): buffer it.
        if self.buffer.is_full() {
            if self.phase == Phase::Live {
                // Too far behind to wait for the holes: give up on the first
                // one and re-synchronise (evicting below), or, gap-tolerant,
                // skip it, which frees what it held up.
                let to = self.buffer.first().unwrap_or(d.first_seq());
                if !self.give_up(now, self.next_seq, to) {
                    self.skip_gaps(now, handler);
                    if !self.buffer.is_full() {
                        return self.accept(now, src, bytes, d, handler);
                    }
                }
            }
            if self.buffer.first().is_some_and(|f| f > d.first_seq()) {
                self.counters.evicted += 1;
                return;
            }
            if self.buffer.evict_first() {
                self.counters.evicted += 1;
            }
        }
        // bytes.len() <= max_datagram: checked in check_datagram.
        if !self.buffer.insert(d.first_seq(), d.end_seq(), bytes) {
            return;
        }
        self.counters.out_of_order_buffered += 1;
        self.counters.max_buffered = self.counters.max_buffered.max(self.buffer.len() as u64);
        if src == Source::Retransmit {
            self.counters.messages_recovered += u64::from(d.count());
        }
        if self.phase == Phase::Live {
            if d.first_seq() > self.high {
                self.counters.gaps_detected += 1;
            }
            self.high = self.high.max(d.end_seq());
            // Retire requests that this datagram completed.
            let holes = self.buffer.holes(self.next_seq, self.high);
            self.loss
                .filled(now, d.first_seq(), d.end_seq(), &holes, &mut self.counters);
            self.request_holes(now);
            self.track_stall(now);
        } else {
            self.high = self.high.max(d.end_seq());
        }
    }

    /// The publisher answered that nothing at or after `end` was ever sent:
    /// the highest sequence known beyond it and beyond the data received
    /// came from a heartbeat ahead of the stream (forged, within the claim
    /// threshold), so it is forgotten, and the requests beyond, not declared
    /// lost. A real heartbeat seen after the answer was made is forgotten
    /// too, and learnt again from the publisher's next one.
    fn never_published(&mut self, now: u64, end: u64) {
        let data_end = self
            .buffer
            .end()
            .unwrap_or(self.next_seq)
            .max(self.next_seq);
        let high = end.max(data_end);
        if high >= self.high {
            return;
        }
        self.counters.not_yet_published += 1;
        self.high = high;
        self.loss.forget_from(high);
        self.track_stall(now);
    }

    /// After a snapshot: one past the last sequence that follows `next_seq`
    /// in the buffered datagrams without a jump beyond the claim threshold
    /// (any jump when tags are on). Buffered datagrams beyond it were never
    /// corroborated: they are dropped and counted as claims.
    fn verify_high(&mut self) {
        let (keep, high) =
            self.jumps
                .corroborated(self.next_seq, self.key.is_some(), self.buffer.spans());
        self.counters.claimed += self.buffer.truncate(keep);
        self.high = high;
        self.jumps.clear();
    }

    /// Delivers the messages of `d` from `next_seq` on; `d` starts at or
    /// before `next_seq` and ends after it.
    fn deliver<H: Handler + ?Sized>(&mut self, src: Source, d: Datagram<'_>, handler: &mut H) {
        let skip = self.next_seq - d.first_seq();
        Self::hand_out(&mut self.reasm, &mut self.counters, d, skip, handler);
        if src == Source::Retransmit {
            self.counters.messages_recovered += d.end_seq() - self.next_seq;
        }
        self.next_seq = d.end_seq();
        self.high = self.high.max(self.next_seq);
    }

    /// Hands the messages of `d` after the first `skip` to the handler, or
    /// its fragment to the reassembler (and a completed message on).
    fn hand_out<H: Handler + ?Sized>(
        reasm: &mut Reassembler,
        counters: &mut SubscriberCounters,
        d: Datagram<'_>,
        skip: u64,
        handler: &mut H,
    ) {
        // The one branch small messages pay for large ones.
        if d.is_fragment() {
            // A fragment datagram holds one sequence, so skip is 0.
            if let Some(f) = d.fragment() {
                match reasm.push(f) {
                    Push::Complete(msg) => {
                        handler.on_message(f.seq, msg);
                        counters.delivered += 1;
                        counters.large_messages += 1;
                    }
                    Push::Partial => {}
                    Push::Dropped(_) => counters.fragments_dropped += 1,
                }
            }
            return;
        }
        let mut n = 0;
        for (seq, msg) in d.messages().skip(skip as usize) {
            handler.on_message(seq, msg);
            n += 1;
        }
        counters.delivered += n;
    }

    /// Delivers buffered datagrams that have become in order.
    fn drain<H: Handler + ?Sized>(&mut self, handler: &mut H) {
        while let Some(b) = self.buffer.pop_ready(self.next_seq) {
            if b.end > self.next_seq {
                let bytes = self.buffer.bytes(&b);
                // Validated before it was buffered; a failure here would mean
                // memory corruption, so the datagram is skipped, not trusted.
                if let Ok(d) = Datagram::parse(bytes) {
                    let skip = self.next_seq - d.first_seq();
                    Self::hand_out(&mut self.reasm, &mut self.counters, d, skip, handler);
                }
                self.next_seq = b.end;
            }
            self.buffer.release(b);
        }
    }

    /// After `next_seq` moved: retire covered requests and ask for holes.
    fn after_progress(&mut self, now: u64) {
        let progress = self.loss.progress(now, self.next_seq);
        self.counters.gaps_filled_by_other_line += progress.filled_in_grace;
        // A range marked lost may be at the delivery point now.
        if progress.lost_open {
            self.tolerance.mark_due();
        }
        self.request_holes(now);
        self.track_stall(now);
    }

    /// Gap-tolerant: (re)starts the stall timer when delivery waits at a new
    /// point, stops it when nothing is missing.
    fn track_stall(&mut self, now: u64) {
        let stalled = self.phase == Phase::Live && self.high > self.next_seq;
        self.tolerance.track(now, stalled, self.next_seq);
    }

    /// Gap-tolerant: skips the holes at the delivery point that are known
    /// lost or have stalled delivery for `gap_tolerance_ns`, delivering what
    /// was buffered behind each.
    fn skip_gaps<H: Handler + ?Sized>(&mut self, now: u64, handler: &mut H) {
        while self.phase == Phase::Live {
            let Some((from, to)) = self.next_hole(self.next_seq) else {
                break;
            };
            // A range known lost starting at the delivery point is skipped
            // up to its end (what follows in the hole may still come); a
            // hole that outlived the bound, whole.
            let lost_to = self.loss.lost_to(from).map(|t| t.min(to));
            let Some(to) = self.tolerance.skip_to(now, self.next_seq, to, lost_to) else {
                break;
            };
            self.counters.gaps_skipped += 1;
            self.counters.sequences_skipped += to - from;
            if self.reasm.abandon() {
                self.counters.partial_messages_dropped += 1;
            }
            handler.on_gap(from, to);
            self.push_event(Event::GapSkipped { from, to });
            self.next_seq = to;
            self.high = self.high.max(to);
            self.drain(handler);
            self.after_progress(now);
        }
        self.tolerance.clear_due();
    }

    /// What is missing between the delivery point and `high`.
    fn holes(&self) -> Holes<'_> {
        self.buffer.holes(self.next_seq, self.high)
    }

    fn next_hole(&self, cursor: u64) -> Option<(u64, u64)> {
        self.holes().next_hole(cursor)
    }

    fn missing_in(&self, from: u64, to: u64) -> Option<(u64, u64)> {
        self.holes().missing_in(from, to)
    }

    /// Opens requests for holes not yet covered, up to `max_outstanding`.
    fn request_holes(&mut self, now: u64) {
        let holes = self.buffer.holes(self.next_seq, self.high);
        if let Some((from, to)) = self.loss.open(now, &holes, self.link.is_up()) {
            self.lost_while_down(now, from, to);
        }
    }

    // -- loss, resync and snapshots -----------------------------------------

    fn unrecoverable(&mut self, now: u64, from: u64, to: u64) {
        self.counters.unrecoverable += 1;
        self.push_event(Event::UnrecoverableLoss { from, to });
        self.start_resync(now);
    }

    /// `[from, to)` cannot be recovered. Strict: an UnrecoverableLoss and a
    /// re-synchronisation (returns true: the outstanding requests are
    /// gone). Gap-tolerant: the range is marked lost, replacing the
    /// requests for it, for [`skip_gaps`](Self::skip_gaps) to skip once it
    /// is at the delivery point (returns false).
    fn give_up(&mut self, now: u64, from: u64, to: u64) -> bool {
        if !self.tolerance.enabled() || self.phase != Phase::Live {
            self.unrecoverable(now, from, to);
            return true;
        }
        self.loss.mark_lost(now, from, to);
        self.tolerance.mark_due();
        false
    }

    /// A hole that cannot be asked for: the recovery link is down. Returns
    /// what [`give_up`](Self::give_up) does.
    fn lost_while_down(&mut self, now: u64, from: u64, to: u64) -> bool {
        self.counters.lost_while_link_down += 1;
        self.give_up(now, from, to)
    }

    fn start_resync(&mut self, now: u64) {
        self.phase = Phase::Resyncing;
        self.loss.clear();
        self.tolerance.reset();
        if self.reasm.abandon() {
            self.counters.partial_messages_dropped += 1;
        }
        self.push_event(Event::ResyncStarted);
        self.request_snapshot(now);
    }

    fn request_snapshot(&mut self, now: u64) {
        self.snapshot.request(now);
    }

    fn reject_snapshot(&mut self, now: u64) {
        self.counters.snapshots_rejected += 1;
        self.request_snapshot(now);
    }

    /// Forgets everything about the current session.
    fn reset(&mut self) {
        self.buffer.clear();
        self.loss.clear();
        self.next_seq = 1;
        self.high = 1;
        self.jumps.clear();
        self.tolerance.reset();
        self.reasm.abandon();
    }

    fn on_snapshot_chunk<A: SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        seq: u64,
        offset: u64,
        data: &[u8],
        app: &mut A,
    ) {
        if offset == 0 {
            app.begin_restore();
        }
        if !self.snapshot.chunk(seq, offset, data) || app.restore_chunk(data).is_err() {
            self.reject_snapshot(now);
            return;
        }
        self.snapshot.progress(now);
    }

    fn on_snapshot_end<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        end: wire::SnapshotEnd,
        app: &mut A,
    ) {
        // None: the tail of a transfer already rejected; a new one is
        // asked for.
        let Some(finish) = self.snapshot.finish(&end) else {
            return;
        };
        if finish.begin {
            app.begin_restore();
        }
        if !finish.valid || app.finish_restore(end.snapshot_seq).is_err() {
            return self.reject_snapshot(now);
        }
        self.counters.snapshots_applied += 1;
        self.push_event(Event::SnapshotApplied {
            seq: end.snapshot_seq,
        });
        self.phase = Phase::Live;
        self.next_seq = end.snapshot_seq + 1;
        self.verify_high();
        self.drain(app);
        if self.next_hole(self.next_seq).is_some() {
            // Live data buffered during the resync starts after the snapshot.
            self.counters.gaps_detected += 1;
        }
        self.after_progress(now);
    }

    fn push_event(&mut self, ev: Event) {
        if self.events.len() == EVENT_CAPACITY {
            self.events.pop_front();
            self.counters.events_dropped += 1;
        }
        self.events.push_back(ev);
    }
}

/// A tagged datagram's body and tag (`None` if shorter than a tag).
fn split_tag(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    bytes.split_at_checked(bytes.len().checked_sub(DATAGRAM_TAG_LEN)?)
}

#[cfg(test)]
mod tests;
