//! Sequencing and gap recovery for one MoldUDP64 session, as an I/O-free state machine.
//!
//! Feed it packets with [`GapTracker::on_packet`]; it hands messages to the caller strictly
//! in sequence order. Packets ahead of a gap are copied into a bounded buffer (the only
//! allocation, and only while a gap is open); in-order packets are delivered straight from
//! the caller's bytes. [`GapTracker::poll_request`] says which re-request to send,
//! [`GapTracker::poll_timeout`] when to call [`GapTracker::handle_timeout`], which retries
//! and finally gives a gap up as lost so the stream does not stall forever: the loss is
//! counted and handed to the caller ([`Deliver::loss`]) before the messages after it, so
//! downstream can say that what it built may be wrong.
//!
//! # What the tracker trusts
//! - **Session**: it locks onto the session of the first packet it accepts (or only ever
//!   onto [`GapConfig::session`] when set). Packets of any other session are counted
//!   ([`Counters::wrong_session`]) and dropped; the locked session and sequencing are kept.
//!   NASDAQ starts one session per trading day, so a session change means a new day: the
//!   feed handler is restarted for it, it never switches sessions mid-run.
//! - **Sequence window**: a packet (data, heartbeat or end of session) starting more than
//!   [`GapConfig::max_sequence_ahead`] beyond the highest sequence known to exist is counted
//!   ([`Counters::far_ahead`]) and dropped, so one forged or corrupt sequence number can
//!   neither open a gap of billions of messages nor skip the stream past the real one. A
//!   real jump (an outage longer than the window, or a start late in the day) is accepted
//!   once [`GapConfig::reanchor_packets`] consecutive far-ahead packets of the session agree
//!   (each starting at or after the previous one, within the window of it): the range
//!   before them becomes an ordinary gap, re-requested or reported lost.
//! - **Jumps need corroboration**: the source filter is by address, so anyone who can send
//!   from the exchange's IP can forge a header. A packet (data, heartbeat or end of session)
//!   starting more than [`GapConfig::claim_threshold`] beyond the highest sequence known is
//!   only a *claim*: it is counted ([`Counters::claimed`]) and dropped, opens no gap, sends
//!   no request and declares no loss. The stream's own packets decide: new data within the
//!   threshold, or a heartbeat at (or just past) the highest sequence known, disproves the
//!   claim ([`Counters::claims_disproved`]), since a source that really skipped sends
//!   neither any more; a claim that has stood [`GapConfig::claim_timeout`] with no
//!   such packet and is backed by [`GapConfig::claim_packets`] far-ahead packets of the
//!   session is accepted ([`Counters::claims_accepted`]), and the packet that confirms it is
//!   taken as an ordinary gap. A real jump is recovered `claim_timeout` late (the packets
//!   dropped meanwhile are re-requested with the gap); a forger has to silence the real
//!   source, heartbeats included, for `claim_timeout` to move the stream. The timeout is
//!   longer than the exchange's heartbeat interval (1 s for NASDAQ) so an idle feed
//!   disproves a claim in time.

use super::{Kind, Packet, PacketError, Request};
use rocebus::clock::Mono;
use std::collections::BTreeMap;
use std::time::Duration;

/// Where the tracker starts expecting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartPolicy {
    /// At the first packet seen (a late joiner recovers state from a snapshot instead).
    FirstSeen,
    /// At this sequence number (1 to recover the whole session).
    Sequence(u64),
}

/// Tuning of a [`GapTracker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GapConfig {
    /// Where to start.
    pub start: StartPolicy,
    /// The only session to accept; `None` locks onto the first accepted packet's.
    pub session: Option<[u8; 10]>,
    /// Whether a retransmission server answers re-requests. Without one, a gap is given up
    /// as lost after one `retransmit_timeout` (the wait lets reordered packets arrive).
    pub retransmission: bool,
    /// How long to wait for a re-request's answer before asking again.
    pub retransmit_timeout: Duration,
    /// Re-sends of one request before its gap is given up as lost.
    pub max_retries: u32,
    /// Largest count asked in one request.
    pub max_request_count: u16,
    /// Bytes of out-of-order packets kept while a gap is open; later packets are dropped
    /// (and re-requested once the gap before them closes).
    pub max_buffered_bytes: usize,
    /// Largest distance, in messages, a packet may start beyond the highest sequence known
    /// to exist; farther packets are dropped (see the module docs).
    pub max_sequence_ahead: u64,
    /// Consecutive, agreeing far-ahead packets after which the tracker accepts the jump
    /// (1 accepts any jump at once).
    pub reanchor_packets: u32,
    /// Largest distance, in messages, a packet may start beyond the highest sequence known
    /// and be acted on at once; farther packets are claims (see the module docs).
    pub claim_threshold: u64,
    /// Far-ahead packets of the session (the first included) that must back a claim
    /// before it is accepted.
    pub claim_packets: u32,
    /// How long a claim must stand with no packet of the stream (see the module docs)
    /// before it is accepted (zero, with `claim_packets` 1, accepts any jump at once).
    pub claim_timeout: Duration,
}

impl Default for GapConfig {
    fn default() -> Self {
        Self {
            start: StartPolicy::Sequence(1),
            session: None,
            retransmission: true,
            retransmit_timeout: Duration::from_millis(50),
            max_retries: 5,
            max_request_count: 1000,
            max_buffered_bytes: 16 << 20,
            max_sequence_ahead: 1_000_000,
            reanchor_packets: 3,
            claim_threshold: 1000,
            claim_packets: 3,
            claim_timeout: Duration::from_millis(2500),
        }
    }
}

/// Messages `[from, to)` of the session that will never be delivered: the re-requests for
/// them went unanswered after every retry, or there is no retransmission server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Loss {
    /// First lost sequence number.
    pub from: u64,
    /// One past the last lost sequence number.
    pub to: u64,
}

/// Where [`GapTracker::handle_timeout`] hands what it releases, in order.
pub trait Deliver {
    /// The message with this sequence number, in sequence order.
    fn message(&mut self, sequence: u64, message: &[u8]);
    /// A range given up; called before any message that follows it.
    fn loss(&mut self, loss: Loss);
}

/// Totals kept by a [`GapTracker`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets accepted (any kind, right session).
    pub packets: u64,
    /// Messages delivered.
    pub messages: u64,
    /// Heartbeats seen.
    pub heartbeats: u64,
    /// Packets carrying only messages already delivered.
    pub duplicates: u64,
    /// Gaps detected (a packet or heartbeat beyond the highest sequence seen).
    pub gaps: u64,
    /// Re-requests sent (including retries).
    pub requests: u64,
    /// Messages asked for in those requests.
    pub re_requested: u64,
    /// Messages delivered that had been missing when a later packet arrived.
    pub recovered: u64,
    /// Requests that timed out.
    pub timeouts: u64,
    /// Messages given up as lost after the retries ran out.
    pub lost: u64,
    /// Packets that were not valid MoldUDP64.
    pub malformed: u64,
    /// Packets of another session (dropped).
    pub wrong_session: u64,
    /// Packets starting beyond the sequence window (dropped).
    pub far_ahead: u64,
    /// Jumps beyond the window accepted after agreeing far-ahead packets.
    pub reanchors: u64,
    /// Packets beyond the claim threshold held as an unconfirmed claim (dropped).
    pub claimed: u64,
    /// Claims disproved by the stream's own packets (new data, or a heartbeat at the
    /// highest sequence known).
    pub claims_disproved: u64,
    /// Claims accepted as a real jump (corroborated and unanswered by the stream).
    pub claims_accepted: u64,
    /// Gaps given up as lost (each handed on as a [`Loss`]).
    pub unrecoverable: u64,
    /// Out-of-order packets dropped because the buffer was full.
    pub buffer_overflows: u64,
}

/// What became of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its new messages (if any) were delivered.
    Delivered,
    /// It is ahead of a gap and was kept for later.
    Buffered,
    /// Ahead of a gap, and the buffer was full: dropped, will be re-requested.
    Dropped,
    /// Everything in it had been delivered already.
    Duplicate,
    /// It belongs to another session: ignored.
    WrongSession,
    /// It starts too far beyond the highest sequence known to exist: ignored.
    FarAhead,
    /// It starts beyond the claim threshold: held as an unconfirmed claim, not acted on.
    Claimed,
}

/// A jump beyond the claim threshold not yet corroborated by the stream.
#[derive(Debug, Clone, Copy)]
struct Claim {
    session: [u8; 10],
    /// When the first packet of the claim arrived (no packet of the stream since).
    since: Mono,
    /// Far-ahead packets backing it.
    packets: u32,
}

/// Far-ahead packets seen in a row: a jump is accepted once enough of them agree.
#[derive(Debug, Clone, Copy)]
struct FarRun {
    session: [u8; 10],
    last: u64,
    count: u32,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    from: u64,
    sent_at: Mono,
    attempts: u32,
    resend: bool,
}

/// Sequencing and gap recovery for one MoldUDP64 session. See the module docs.
#[derive(Debug)]
pub struct GapTracker {
    config: GapConfig,
    session: Option<[u8; 10]>,
    /// Next sequence number to deliver; `None` until the first packet.
    next: Option<u64>,
    /// One past the highest sequence number known to exist.
    high: u64,
    buffer: BTreeMap<u64, Vec<u8>>,
    buffered_bytes: usize,
    outstanding: Option<Outstanding>,
    far_run: Option<FarRun>,
    claim: Option<Claim>,
    ended: bool,
    counters: Counters,
}

impl GapTracker {
    /// A tracker that has seen nothing yet.
    pub fn new(config: GapConfig) -> Self {
        let next = match config.start {
            StartPolicy::FirstSeen => None,
            StartPolicy::Sequence(s) => Some(s),
        };
        Self {
            config,
            session: None,
            next,
            high: next.unwrap_or(0),
            buffer: BTreeMap::new(),
            buffered_bytes: 0,
            outstanding: None,
            far_run: None,
            claim: None,
            ended: false,
            counters: Counters::default(),
        }
    }

    /// Whether a retransmission server answers re-requests from now on.
    pub(super) fn set_retransmission(&mut self, on: bool) {
        self.config.retransmission = on;
    }

    /// Totals so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The session locked onto, once a packet has been accepted.
    pub fn session(&self) -> Option<[u8; 10]> {
        self.session
    }

    /// Next sequence number to be delivered.
    pub fn next_sequence(&self) -> Option<u64> {
        self.next
    }

    /// The end of session was seen and every message before it delivered (or given up).
    pub fn is_complete(&self) -> bool {
        self.ended && self.next.is_some_and(|n| n >= self.high)
    }

    /// Feeds one received packet; new messages go to `deliver(sequence_number, message)` in order.
    pub fn on_packet(
        &mut self,
        now: Mono,
        bytes: &[u8],
        deliver: &mut impl FnMut(u64, &[u8]),
    ) -> Result<Outcome, PacketError> {
        let packet = match Packet::parse(bytes) {
            Ok(p) => p,
            Err(e) => {
                self.counters.malformed += 1;
                return Err(e);
            }
        };
        if self
            .session
            .or(self.config.session)
            .is_some_and(|s| s != packet.session())
        {
            self.counters.wrong_session += 1;
            return Ok(Outcome::WrongSession);
        }
        if self.is_far_ahead(&packet) {
            self.counters.far_ahead += 1;
            return Ok(Outcome::FarAhead);
        }
        if self.is_claim(now, &packet) {
            self.counters.claimed += 1;
            return Ok(Outcome::Claimed);
        }
        self.session.get_or_insert(packet.session());
        self.counters.packets += 1;
        match packet.kind() {
            Kind::Heartbeat => self.counters.heartbeats += 1,
            Kind::EndOfSession => self.ended = true,
            Kind::Data => {}
        }
        let seq = packet.sequence_number();
        let end = packet.end_sequence();
        let next = *self.next.get_or_insert(seq);
        // The stream's own packets: new data, or a heartbeat at (or just past) the highest
        // sequence known. A source that really skipped sends neither any more.
        let of_stream = match packet.kind() {
            Kind::Data => end > next,
            _ => seq >= self.high.max(next),
        };
        if of_stream && self.claim.take().is_some() {
            self.counters.claims_disproved += 1;
        }
        if self.high < next {
            self.high = next;
        }
        let high_before = self.high;
        if seq > self.high {
            self.counters.gaps += 1;
        }
        self.high = self.high.max(end);

        if end <= next {
            if packet.kind() == Kind::Data {
                self.counters.duplicates += 1;
                return Ok(Outcome::Duplicate);
            }
            return Ok(Outcome::Delivered);
        }
        if seq > next {
            if packet.kind() != Kind::Data {
                // A heartbeat or end of session ahead of a gap has nothing to keep: how far
                // the stream goes is in `high` already. Kept, it would take the buffer slot
                // of the data packet that starts at the same sequence number.
                return Ok(Outcome::Delivered);
            }
            // A packet already kept at this sequence number is replaced only by one that
            // reaches further (a short retransmission answer, then the full packet).
            let kept = self.buffer.get(&seq).map(|b| {
                let end = Packet::parse(b).map_or(seq, |p| p.end_sequence());
                (end, b.len())
            });
            if kept.is_some_and(|(kept_end, _)| kept_end >= end) {
                self.counters.duplicates += 1;
                return Ok(Outcome::Duplicate);
            }
            let freed = kept.map_or(0, |(_, len)| len);
            if self.buffered_bytes - freed + bytes.len() > self.config.max_buffered_bytes {
                self.counters.buffer_overflows += 1;
                return Ok(Outcome::Dropped);
            }
            self.buffered_bytes = self.buffered_bytes - freed + bytes.len();
            self.buffer.insert(seq, bytes.to_vec());
            return Ok(Outcome::Buffered);
        }
        let delivered = self.deliver_from(&packet, deliver);
        if seq < high_before {
            // Part of this packet lay below what we already knew existed: it filled a gap.
            self.counters.recovered += delivered;
        }
        self.drain_buffer(deliver);
        self.settle_outstanding();
        Ok(Outcome::Delivered)
    }

    /// Whether `packet` starts beyond the window and is to be dropped. Tracks runs of
    /// far-ahead packets and says `false` (accept) once one is long enough.
    fn is_far_ahead(&mut self, packet: &Packet<'_>) -> bool {
        let Some(next) = self.next else {
            // FirstSeen, nothing accepted yet: the first packet anchors the stream.
            return false;
        };
        let window = self.config.max_sequence_ahead;
        let seq = packet.sequence_number();
        if seq <= self.high.max(next).saturating_add(window) {
            self.far_run = None;
            return false;
        }
        let count = match self.far_run {
            Some(r)
                if r.session == packet.session()
                    && seq >= r.last
                    && seq <= r.last.saturating_add(window) =>
            {
                r.count + 1
            }
            _ => 1,
        };
        if count >= self.config.reanchor_packets {
            self.far_run = None;
            self.counters.reanchors += 1;
            return false;
        }
        self.far_run = Some(FarRun {
            session: packet.session(),
            last: seq,
            count,
        });
        true
    }

    /// Whether `packet` starts beyond the claim threshold and is to be held as a claim (not
    /// acted on). Says `false` (accept) once the claim has stood `claim_timeout` backed by
    /// `claim_packets` packets; a packet of the stream clears it in `on_packet`.
    fn is_claim(&mut self, now: Mono, packet: &Packet<'_>) -> bool {
        let Some(next) = self.next else {
            return false;
        };
        let seq = packet.sequence_number();
        if seq
            <= self
                .high
                .max(next)
                .saturating_add(self.config.claim_threshold)
        {
            return false;
        }
        let claim = match self.claim {
            Some(c) if c.session == packet.session() => Claim {
                packets: c.packets.saturating_add(1),
                ..c
            },
            _ => Claim {
                session: packet.session(),
                since: now,
                packets: 1,
            },
        };
        if claim.packets >= self.config.claim_packets
            && now.saturating_since(claim.since) >= self.config.claim_timeout
        {
            self.claim = None;
            self.counters.claims_accepted += 1;
            return false;
        }
        self.claim = Some(claim);
        true
    }

    /// Delivers the messages of `packet` at or after `next`, advancing it; returns how many.
    fn deliver_from(&mut self, packet: &Packet<'_>, deliver: &mut impl FnMut(u64, &[u8])) -> u64 {
        let Some(next) = self.next else { return 0 };
        let seq = packet.sequence_number();
        let skip = next.saturating_sub(seq);
        let mut n = 0;
        for (i, m) in packet.messages().enumerate() {
            let s = seq + i as u64;
            if (i as u64) < skip {
                continue;
            }
            deliver(s, m);
            n += 1;
        }
        self.counters.messages += n;
        self.next = Some(next.max(packet.end_sequence()));
        n
    }

    fn drain_buffer(&mut self, deliver: &mut impl FnMut(u64, &[u8])) {
        while let Some(entry) = self.buffer.first_entry() {
            let next = self.next.unwrap_or(0);
            if *entry.key() > next {
                break;
            }
            let bytes = entry.remove();
            self.buffered_bytes -= bytes.len();
            // Buffered bytes were parsed once already; parsing again cannot fail.
            if let Ok(p) = Packet::parse(&bytes) {
                self.deliver_from(&p, deliver);
            }
        }
    }

    /// Drops the outstanding request once delivery moved past its start. A server answers a
    /// request with one packet, which may hold fewer messages than asked (NASDAQ's do): the
    /// rest is asked for at once, with a fresh retry budget, instead of after a timeout that
    /// would also count against the retries; retries are for requests that got no answer.
    fn settle_outstanding(&mut self) {
        if let (Some(o), Some(next)) = (self.outstanding, self.next) {
            if next > o.from {
                self.outstanding = None;
            }
        }
    }

    /// End of the first missing range: the first buffered packet, or the highest known.
    fn gap_end(&self) -> u64 {
        self.buffer
            .keys()
            .next()
            .copied()
            .unwrap_or(self.high)
            .min(self.high)
    }

    /// A re-request to send now, if a gap is open and no request is waiting for its answer.
    pub fn poll_request(&mut self, now: Mono) -> Option<Request> {
        let session = self.session?;
        let next = self.next?;
        let gap_end = self.gap_end();
        if next >= gap_end {
            return None;
        }
        let count = u16::try_from(gap_end - next)
            .unwrap_or(u16::MAX)
            .min(self.config.max_request_count);
        let attempts = match self.outstanding {
            None => 1,
            Some(o) if o.resend => o.attempts,
            Some(_) => return None,
        };
        self.outstanding = Some(Outstanding {
            from: next,
            sent_at: now,
            attempts,
            resend: false,
        });
        if !self.config.retransmission {
            // Nothing to ask: the outstanding entry only times the wait for reordered
            // packets, after which `handle_timeout` gives the gap up.
            return None;
        }
        self.counters.requests += 1;
        self.counters.re_requested += u64::from(count);
        Some(Request {
            session,
            sequence_number: next,
            count,
        })
    }

    /// When [`Self::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Mono> {
        self.outstanding
            .filter(|o| !o.resend)
            .map(|o| o.sent_at + self.config.retransmit_timeout)
    }

    /// Handles an expired request: arranges a retry, or after `max_retries` (at once
    /// without a retransmission server) gives the missing range up as lost: hands the
    /// [`Loss`] to `out`, skips the range and delivers what was buffered after it.
    pub fn handle_timeout(&mut self, now: Mono, out: &mut impl Deliver) {
        let Some(mut o) = self.outstanding else {
            return;
        };
        if o.resend || now < o.sent_at + self.config.retransmit_timeout {
            return;
        }
        if self.config.retransmission {
            self.counters.timeouts += 1;
            if o.attempts <= self.config.max_retries {
                o.attempts += 1;
                o.resend = true;
                self.outstanding = Some(o);
                return;
            }
        }
        self.outstanding = None;
        let gap_end = self.gap_end();
        if let Some(next) = self.next {
            if gap_end > next {
                self.counters.lost += gap_end - next;
                self.counters.unrecoverable += 1;
                out.loss(Loss {
                    from: next,
                    to: gap_end,
                });
                self.next = Some(gap_end);
                self.drain_buffer(&mut |seq, m| out.message(seq, m));
            }
        }
    }
}
