//! FIX 4.4 initiator session: logon, heartbeats and test requests, sequence numbers, resend
//! requests and gap fills in both directions, logout, session-level rejects.
//!
//! I/O-free: inbound frames and `now` go in, outbound bytes are appended to a caller buffer,
//! and [`SessionEvent`]s come out. Sequence numbers are not persisted here: the gateway
//! journals every frame sent and received and rebuilds the session with
//! [`Session::replay_outbound`] and [`Session::replay_inbound`]. Application messages sent are
//! kept (raw) so a ResendRequest can be served with PossDupFlag; admin messages are answered
//! with SequenceReset-GapFill.
//!
//! Recovery follows FIX 4.4 (Volume 2) and QuickFIX's `Session`:
//! - A Logon with ResetSeqNumFlag (141=Y) from the venue resets both sequence numbers to 1
//!   and is answered with our own Logon carrying 141=Y (MsgSeqNum 1); the venue's next
//!   in-sequence Logon with 141=Y confirms our answer and is not a new reset (QuickFIX would
//!   answer it again, and two such engines then trade Logons forever).
//! - SequenceReset-Reset (123 absent or N) ignores MsgSeqNum and sets the next expected
//!   number to NewSeqNo; a NewSeqNo below it is answered with Reject 373=5 (QuickFIX does the
//!   same), as is a GapFill going backwards.
//! - Messages ahead of a gap are queued ([`QUEUE_LIMIT`] messages and [`QUEUE_MAX_BYTES`]
//!   bytes at most, see [`Session::set_queue_max_bytes`]; beyond either they are dropped
//!   and come back with the resend, which asks up to infinity) and handed back in order by
//!   [`Session::next_queued`] once the gap is filled, as QuickFIX's `nextQueued` does.
//! - SendingTime (52) is checked as QuickFIX's `verify` does, before the CompIDs and the
//!   sequence number: missing, Reject 373=1; not a UTCTimestamp, 373=6; further than
//!   `max_latency_secs` from `now` (CheckLatency/MaxLatency), 373=10 then Logout. A
//!   PossDupFlag=Y message other than a SequenceReset needs OrigSendingTime (122): missing,
//!   373=1; later than SendingTime, 373=10 then Logout (QuickFIX's doPossDup, QuickFIX/J's
//!   validatePossDup in sequence too). A rejected message takes its number when it was the
//!   expected one (not a Logon or SequenceReset), and [`Session::rejected_in`] tells the
//!   caller to journal it as taken but not processed. The clock is the caller's `now`.
//! - A message below the expected number without PossDupFlag=Y, a SequenceReset-GapFill
//!   included, ends the session with QuickFIX's Logout text "MsgSeqNum too low, expecting
//!   N but received M".
//! - A ResendRequest that is not being answered (`next_in` does not move for the resend
//!   timeout, by default the heartbeat interval) is sent again and counted; QuickFIX itself
//!   has no such timer and waits for the next message from the venue instead.
//!
//! The resend store is bounded and allocated once: a ring of [`RESEND_SLOTS`] slots of
//! [`RESEND_SLOT_LEN`] bytes, slot = sequence number modulo the ring size, so storing a sent
//! message is one copy and never grows memory on the order path. A ResendRequest reaching
//! further back than the ring (or a message longer than a slot) is answered with
//! SequenceReset-GapFill over what is no longer held, which FIX allows for messages the
//! sender chooses not to resend (stale orders), and counted in
//! [`SessionCounters::gap_filled_unavailable`]: orders that old are stale by the time a
//! venue asks, and the journal keeps every frame sent for reconciliation.
//!
//! # Layout
//! One `impl Session` block per concern, over the private state defined here:
//! - `inbound`: what the venue sends (header checks, sequence numbers, the queue ahead
//!   of a gap, SequenceReset, what the session state allows);
//! - `resend`: ResendRequests both ways and the bounded store of what we sent;
//! - `logon`: Logon (ours, the venue's, resets) and Logout refusals;
//! - `snapshot`: checkpoints and journal replay;
//! - `tests`: unit tests.

use super::codec::{Message, MessageWriter, SOH};
use super::tag;

mod inbound;
mod logon;
mod resend;
mod snapshot;

use logon::{expected_in_text, refusal_text};
pub use logon::{redact_password, REDACTED, REFUSAL_TEXT_MAX};
use resend::SentStore;
pub use resend::{RESEND_SLOTS, RESEND_SLOT_LEN};

/// A secret (the FIX Password): its `Debug` never shows it, and it has no `Display`, so
/// it cannot end up in a log line or an error message by accident.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret.
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Session parameters.
#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionConfig {
    /// Our SenderCompID.
    pub sender_comp_id: String,
    /// The venue's CompID.
    pub target_comp_id: String,
    /// Heartbeat interval in seconds.
    pub heartbeat_secs: u32,
    /// How long an unanswered ResendRequest waits before it is sent again, milliseconds
    /// (0: one heartbeat interval).
    pub resend_timeout_ms: u32,
    /// Username (553) on every Logon we send; none when absent.
    #[serde(default)]
    pub username: Option<String>,
    /// Password (554) on every Logon we send; none when absent.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Every Logon we send carries ResetSeqNumFlag (141=Y) with MsgSeqNum 1 and both
    /// directions start again at 1, as QuickFIX's ResetOnLogon=Y.
    #[serde(default)]
    pub reset_on_logon: bool,
    /// Largest difference between an inbound message's SendingTime (52) and our clock,
    /// seconds, beyond which the message is rejected (373=10) and the session logged out,
    /// as QuickFIX's CheckLatency=Y / MaxLatency. 0: not checked. The session's default is
    /// 0; the config file's (`[fix] max_latency_secs`) is QuickFIX's 120.
    #[serde(default)]
    pub max_latency_secs: u32,
}

/// Session state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// No transport.
    Disconnected,
    /// Logon sent, waiting for the venue's Logon.
    LogonSent,
    /// Logged on.
    Active,
    /// Logout sent, waiting for the answer.
    LogoutSent,
}

/// What an inbound frame meant to the session.
// `App` carries the message with its field index (a few hundred bytes, on the stack): the
// event is returned once per frame and never stored, and boxing it would allocate per
// message on the hot path.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug)]
pub enum SessionEvent<'a> {
    /// Nothing for the application.
    None,
    /// The venue answered our Logon.
    LoggedOn,
    /// An application message, in sequence, to process (and journal).
    App(Message<'a>),
    /// The session is over: close the transport.
    Disconnect,
}

/// Counters for monitoring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionCounters {
    /// Frames dropped for bad BeginString, BodyLength or CheckSum.
    pub garbled: u64,
    /// Session-level Rejects (35=3) we sent.
    pub rejects_sent: u64,
    /// Session-level Rejects we received.
    pub rejects_received: u64,
    /// ResendRequests we sent.
    pub resend_requests_sent: u64,
    /// Application messages we resent with PossDupFlag.
    pub messages_resent: u64,
    /// SequenceReset-GapFill messages we sent.
    pub gap_fills_sent: u64,
    /// Inbound PossDup duplicates ignored.
    pub duplicates_ignored: u64,
    /// Resend requests reaching back past the bounded store (gap-filled there instead).
    pub gap_filled_unavailable: u64,
    /// Application messages sent that were too long to keep for resends.
    pub too_long_to_keep: u64,
    /// Sequence resets accepted from the venue (Logon 141=Y, SequenceReset-Reset).
    pub resets_received: u64,
    /// ResendRequests sent again because the first went unanswered.
    pub resend_timeouts: u64,
    /// Messages ahead of a gap held until the gap was filled.
    pub queued: u64,
    /// Messages ahead of a gap dropped because the queue was full (they come back with the
    /// resend).
    pub queue_overflow: u64,
    /// Messages refused for their SendingTime (missing, malformed, further than
    /// `max_latency_secs` from our clock) or, with PossDupFlag=Y, their OrigSendingTime
    /// (missing, malformed, later than SendingTime).
    pub sending_time_problems: u64,
    /// Logouts from the venue answering our Logon (the venue refused the session).
    pub logons_refused: u64,
    /// Logouts from the venue saying our MsgSeqNum is too low ("MsgSeqNum too low,
    /// expecting N but received M"): resending the same Logon cannot help.
    pub seq_too_low_logouts: u64,
    /// Connections dropped for a message the session state does not allow (QuickFIX's
    /// `validLogonState`): anything but Logon, Logout, SequenceReset or Reject before the
    /// venue's Logon, or a second Logon without ResetSeqNumFlag.
    pub out_of_state: u64,
    /// Well-framed messages with a BeginString other than FIX.4.4 (logged out).
    pub wrong_begin_string: u64,
}

/// Messages ahead of a gap held at most (each a few hundred bytes).
pub const QUEUE_LIMIT: usize = 1 << 13;
/// Bytes of messages ahead of a gap held at most by default (64 MiB): without it the count
/// alone let a venue, or anyone between, make the queue hold 8,192 messages of up to 1 MiB.
/// A message that would pass it is dropped (counted in `queue_overflow`) and comes back
/// with the resend, which asks up to infinity.
pub const QUEUE_MAX_BYTES: usize = 64 << 20;

fn is_app(msg_type: &[u8]) -> bool {
    !matches!(msg_type, b"0" | b"1" | b"2" | b"3" | b"4" | b"5" | b"A")
}

/// The session state machine.
#[derive(Debug)]
pub struct Session {
    cfg: SessionConfig,
    state: SessionState,
    next_out: u64,
    next_in: u64,
    last_sent: u64,
    last_recv: u64,
    logon_sent_at: u64,
    test_request_at: Option<u64>,
    /// We asked for a resend; set while `next_in` is not beyond this.
    resend_until: Option<u64>,
    /// When the outstanding ResendRequest was sent or last made progress.
    resend_at: u64,
    /// How long an outstanding ResendRequest may make no progress (ns).
    resend_timeout: Option<u64>,
    /// Our last Logon carried 141=Y (an answer to the venue's reset Logon, or our own reset
    /// with `reset_on_logon`): the venue's next in-sequence Logon 141=Y confirms it.
    answered_reset: bool,
    /// The venue logged us out saying it expects this MsgSeqNum from us, above what we
    /// sent: set until [`Session::clear_venue_expects`].
    venue_expects: Option<u64>,
    /// The Text (58) of the venue's last Logout answering our Logon, cleaned and cut to
    /// [`REFUSAL_TEXT_MAX`] bytes ("" when it had none).
    logon_refusal: Option<Box<str>>,
    /// Inbound messages accepted (in sequence, resets, rejected-and-consumed).
    accepted_in: u64,
    /// Of those, rejected-and-consumed: their numbers were taken, their contents not.
    rejected_in: u64,
    /// Messages ahead of a gap, by sequence number (raw frames).
    queue: std::collections::BTreeMap<u64, Vec<u8>>,
    /// Bytes of the frames in `queue`.
    queue_bytes: usize,
    /// Bound of `queue_bytes`.
    queue_max_bytes: usize,
    store: SentStore,
    writer: MessageWriter,
    counters: SessionCounters,
}

impl Session {
    /// A fresh session (sequence numbers 1/1).
    pub fn new(cfg: SessionConfig) -> Session {
        Session {
            cfg,
            state: SessionState::Disconnected,
            next_out: 1,
            next_in: 1,
            last_sent: 0,
            last_recv: 0,
            logon_sent_at: 0,
            test_request_at: None,
            resend_until: None,
            resend_at: 0,
            resend_timeout: None,
            answered_reset: false,
            venue_expects: None,
            logon_refusal: None,
            accepted_in: 0,
            rejected_in: 0,
            queue: std::collections::BTreeMap::new(),
            queue_bytes: 0,
            queue_max_bytes: QUEUE_MAX_BYTES,
            store: SentStore::default(),
            writer: MessageWriter::default(),
            counters: SessionCounters::default(),
        }
    }

    /// State.
    pub fn state(&self) -> SessionState {
        self.state
    }

    /// Next sequence number we will send.
    pub fn next_out(&self) -> u64 {
        self.next_out
    }

    /// Next sequence number we expect.
    pub fn next_in(&self) -> u64 {
        self.next_in
    }

    /// Counters.
    pub fn counters(&self) -> SessionCounters {
        self.counters
    }

    /// Increases whenever an inbound message changed the inbound state (processed in sequence,
    /// a reset, or rejected and consumed): such a frame must be journaled as FIX_IN.
    pub fn accepted_in(&self) -> u64 {
        self.accepted_in
    }

    /// Increases whenever an inbound message was rejected and took its sequence number
    /// without being processed (with [`accepted_in`](Self::accepted_in)): such a frame must
    /// be journaled so that replay takes the number and nothing else.
    pub fn rejected_in(&self) -> u64 {
        self.rejected_in
    }

    /// Messages held ahead of a gap.
    pub fn queued_len(&self) -> usize {
        self.queue.len()
    }

    /// Bytes of the messages held ahead of a gap.
    pub fn queued_bytes(&self) -> usize {
        self.queue_bytes
    }

    /// Bounds the bytes held ahead of a gap (default [`QUEUE_MAX_BYTES`]); messages beyond
    /// are dropped and come back with the resend.
    pub fn set_queue_max_bytes(&mut self, bytes: usize) {
        self.queue_max_bytes = bytes;
    }

    /// The first queued frame, taken out.
    fn queue_pop_first(&mut self) -> Option<Vec<u8>> {
        let (_, f) = self.queue.pop_first()?;
        self.queue_bytes -= f.len();
        Some(f)
    }

    fn queue_clear(&mut self) {
        self.queue.clear();
        self.queue_bytes = 0;
    }

    /// Counts a frame dropped by the framing layer.
    pub fn count_garbled(&mut self) {
        self.counters.garbled += 1;
    }

    /// A frame we answered with a session Reject consumed its sequence number.
    pub fn consume_rejected(&mut self, seq: u64) {
        if seq == self.next_in {
            self.next_in += 1;
            self.accepted_in += 1;
            self.rejected_in += 1;
            self.resend_progress();
        }
    }

    fn advance_in(&mut self, m: &Message<'_>) {
        self.accepted_in += 1;
        if m.msg_type() == b"A" && m.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y") {
            if self.answered_reset && m.seq() == Some(self.next_in) {
                // The venue's confirmation of our answer: an ordinary in-sequence Logon.
                self.next_in += 1;
                self.resend_progress();
            } else {
                // QuickFIX counts the reset Logon as number 1 whatever its MsgSeqNum.
                self.reset_numbers();
                self.next_in = 2;
                self.answered_reset = true;
            }
            return;
        }
        if m.msg_type() == b"4" {
            if let Ok(new) = m.uint(tag::NEW_SEQ_NO) {
                self.next_in = self.next_in.max(new);
                if m.get(tag::GAP_FILL_FLAG) != Some(b"Y") {
                    self.counters.resets_received += 1;
                }
            }
        } else if let Some(seq) = m.seq() {
            self.next_in = self.next_in.max(seq + 1);
        }
        self.resend_progress();
    }

    fn header(&mut self, msg_type: &[u8], seq: u64, now: u64) {
        let w = &mut self.writer;
        w.start(msg_type)
            .field(tag::SENDER_COMP_ID, self.cfg.sender_comp_id.as_bytes())
            .field(tag::TARGET_COMP_ID, self.cfg.target_comp_id.as_bytes())
            .uint(tag::MSG_SEQ_NUM, seq)
            .timestamp(tag::SENDING_TIME, now);
    }

    fn send_admin(
        &mut self,
        msg_type: &[u8],
        fields: impl FnOnce(&mut MessageWriter),
        now: u64,
        out: &mut Vec<u8>,
    ) {
        let seq = self.next_out;
        self.next_out += 1;
        self.header(msg_type, seq, now);
        fields(&mut self.writer);
        self.writer.finish(out);
        self.last_sent = now;
    }

    /// Sends an application message whose body fields (`tag=value\x01`…, no header) are
    /// `body`. Returns its sequence number.
    pub fn send_app(&mut self, msg_type: &[u8], body: &[u8], now: u64, out: &mut Vec<u8>) -> u64 {
        let seq = self.next_out;
        self.next_out += 1;
        self.header(msg_type, seq, now);
        self.writer.raw_fields(body);
        let start = self.writer.finish(out);
        if !self.store.push(seq, &out[start..]) {
            self.counters.too_long_to_keep += 1;
        }
        self.last_sent = now;
        seq
    }

    /// Transport lost.
    pub fn on_disconnect(&mut self) {
        self.state = SessionState::Disconnected;
    }

    /// Starts a logout.
    pub fn logout(&mut self, now: u64, out: &mut Vec<u8>) {
        if self.state == SessionState::Active {
            self.send_admin(b"5", |_| {}, now, out);
            self.state = SessionState::LogoutSent;
        }
    }

    /// Sends a session-level Reject of inbound `ref_seq`.
    pub fn reject(
        &mut self,
        ref_seq: u64,
        ref_tag: Option<u32>,
        reason: u32,
        text: &str,
        now: u64,
        out: &mut Vec<u8>,
    ) {
        self.reject_typed(ref_seq, b"", ref_tag, reason, text, now, out);
    }

    /// [`Session::reject`] naming the rejected message's type (RefMsgType 372) when known.
    #[allow(clippy::too_many_arguments)]
    pub fn reject_typed(
        &mut self,
        ref_seq: u64,
        ref_msg_type: &[u8],
        ref_tag: Option<u32>,
        reason: u32,
        text: &str,
        now: u64,
        out: &mut Vec<u8>,
    ) {
        self.counters.rejects_sent += 1;
        let mut ty = [0u8; 8];
        let n = ref_msg_type.len().min(ty.len());
        ty[..n].copy_from_slice(&ref_msg_type[..n]);
        self.send_admin(
            b"3",
            |w| {
                w.uint(tag::REF_SEQ_NUM, ref_seq);
                if let Some(t) = ref_tag {
                    w.uint(tag::REF_TAG_ID, u64::from(t));
                }
                if n > 0 {
                    w.field(tag::REF_MSG_TYPE, &ty[..n]);
                }
                w.uint(tag::SESSION_REJECT_REASON, u64::from(reason))
                    .field(tag::TEXT, text.as_bytes());
            },
            now,
            out,
        );
    }

    /// When [`on_timer`](Self::on_timer) next has something to do, in the same wall-clock
    /// nanoseconds it takes: `None` while no timer runs (not logged on, logging on or
    /// logging out), else `Some(t)`: call it once `now >= t`. Before `t` it does nothing
    /// and at `t` it acts (sends or disconnects), so a caller that calls it only when due
    /// behaves as one that calls it every turn (`on_timer_acts_exactly_from_poll_timeout`).
    pub fn poll_timeout(&self) -> Option<rocebus::clock::Wall> {
        let hb = u64::from(self.cfg.heartbeat_secs.max(1)) * 1_000_000_000;
        // `on_timer`'s tests are `now - since > limit`, so each fires at `since + limit + 1`.
        let at = match self.state {
            SessionState::LogonSent | SessionState::LogoutSent => self
                .logon_sent_at
                .max(self.last_sent)
                .saturating_add(2 * hb + 1),
            SessionState::Active => {
                let liveness = match self.test_request_at {
                    Some(at) => at.saturating_add(hb + 1),
                    None => self.last_recv.saturating_add(hb + hb / 5 + 1),
                };
                let resend = if self.resend_until.is_some() {
                    self.resend_at.saturating_add(self.resend_timeout() + 1)
                } else if !self.queue.is_empty() {
                    // A gap behind queued messages that no request covers: at once.
                    0
                } else {
                    u64::MAX
                };
                let heartbeat = self.last_sent.saturating_add(hb);
                liveness.min(resend).min(heartbeat)
            }
            _ => return None,
        };
        Some(rocebus::clock::Wall::from_nanos(at))
    }

    /// Timer: heartbeats, test requests, logon and test-request timeouts.
    pub fn on_timer(&mut self, now: u64, out: &mut Vec<u8>) -> SessionEvent<'static> {
        let hb = u64::from(self.cfg.heartbeat_secs.max(1)) * 1_000_000_000;
        match self.state {
            SessionState::LogonSent | SessionState::LogoutSent
                if now.saturating_sub(self.logon_sent_at.max(self.last_sent)) > 2 * hb =>
            {
                self.state = SessionState::Disconnected;
                SessionEvent::Disconnect
            }
            SessionState::Active => {
                if let Some(at) = self.test_request_at {
                    if now.saturating_sub(at) > hb {
                        self.state = SessionState::Disconnected;
                        return SessionEvent::Disconnect;
                    }
                } else if now.saturating_sub(self.last_recv) > hb + hb / 5 {
                    self.send_admin(
                        b"1",
                        |w| {
                            w.uint(tag::TEST_REQ_ID, now);
                        },
                        now,
                        out,
                    );
                    self.test_request_at = Some(now);
                }
                if self.resend_until.is_some()
                    && now.saturating_sub(self.resend_at) > self.resend_timeout()
                {
                    self.counters.resend_timeouts += 1;
                    let upto = self.resend_until.unwrap_or(self.next_in);
                    self.request_resend(upto, now, out);
                } else if self.resend_until.is_none() && !self.queue.is_empty() {
                    // A gap behind queued messages that no request covers (the one that
                    // did was satisfied before the rest arrived).
                    let upto = self.queue.keys().next().copied().unwrap_or(self.next_in);
                    self.request_resend(upto, now, out);
                }
                if now.saturating_sub(self.last_sent) >= hb {
                    self.send_admin(b"0", |_| {}, now, out);
                }
                SessionEvent::None
            }
            _ => SessionEvent::None,
        }
    }
}

/// Appends `tag=value\x01` to a body buffer (for building [`Session::send_app`] bodies).
pub fn push_field(body: &mut Vec<u8>, tag: u32, value: &[u8]) {
    push_uint_raw(body, u64::from(tag));
    body.push(b'=');
    body.extend_from_slice(value);
    body.push(SOH);
}

/// Appends `tag=<decimal>\x01` to a body buffer.
pub fn push_uint(body: &mut Vec<u8>, tag: u32, v: u64) {
    push_uint_raw(body, u64::from(tag));
    body.push(b'=');
    push_uint_raw(body, v);
    body.push(SOH);
}

/// Appends a price field (4-decimal fixed point as a FIX decimal).
pub fn push_price(body: &mut Vec<u8>, tag: u32, px: i64) {
    push_uint_raw(body, u64::from(tag));
    body.push(b'=');
    if px < 0 {
        body.push(b'-');
    }
    let a = px.unsigned_abs();
    let scale = crate::proto::PRICE_SCALE.unsigned_abs();
    push_uint_raw(body, a / scale);
    body.push(b'.');
    let frac = a % scale;
    let mut s = scale / 10;
    while s > 0 {
        body.push(b'0' + ((frac / s) % 10) as u8);
        s /= 10;
    }
    body.push(SOH);
}

/// Appends a UTCTimestamp field.
pub fn push_timestamp(body: &mut Vec<u8>, tag: u32, unix_nanos: u64) {
    push_uint_raw(body, u64::from(tag));
    body.push(b'=');
    super::codec::write_utc_timestamp(body, unix_nanos);
    body.push(SOH);
}

fn push_uint_raw(body: &mut Vec<u8>, mut v: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    body.extend_from_slice(&buf[i..]);
}

#[cfg(test)]
mod tests;
