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

use super::codec::{Message, MessageWriter, SOH};
use super::tag;

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
}

/// Messages ahead of a gap held at most (each a few hundred bytes).
pub const QUEUE_LIMIT: usize = 1 << 13;
/// Bytes of messages ahead of a gap held at most by default (64 MiB): without it the count
/// alone let a venue, or anyone between, make the queue hold 8,192 messages of up to 1 MiB.
/// A message that would pass it is dropped (counted in `queue_overflow`) and comes back
/// with the resend, which asks up to infinity.
pub const QUEUE_MAX_BYTES: usize = 64 << 20;

/// Application messages kept for resends: the last this many sequence numbers.
pub const RESEND_SLOTS: usize = 1 << 14;
/// Largest message kept for resends (a NewOrderSingle is about 200 bytes).
pub const RESEND_SLOT_LEN: usize = 512;

/// Raw application messages we sent, for resends: a ring of fixed slots indexed by sequence
/// number, allocated once (8 MiB), so storing costs one copy and no allocation.
struct SentStore {
    bytes: Box<[u8]>,
    /// Per slot: the sequence number held (0: none) and the message length.
    slots: Box<[(u64, u16)]>,
}

impl std::fmt::Debug for SentStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.slots.iter().filter(|s| s.0 != 0).count();
        f.debug_struct("SentStore").field("held", &held).finish()
    }
}

impl Default for SentStore {
    fn default() -> SentStore {
        SentStore {
            bytes: vec![0; RESEND_SLOTS * RESEND_SLOT_LEN].into_boxed_slice(),
            slots: vec![(0, 0); RESEND_SLOTS].into_boxed_slice(),
        }
    }
}

impl SentStore {
    fn slot(seq: u64) -> usize {
        (seq % RESEND_SLOTS as u64) as usize
    }

    /// Keeps `raw` as message `seq`, replacing whatever held its slot; a message longer than
    /// a slot is not kept (a resend request for it is gap-filled).
    fn push(&mut self, seq: u64, raw: &[u8]) -> bool {
        let i = Self::slot(seq);
        if raw.len() > RESEND_SLOT_LEN {
            self.slots[i] = (0, 0);
            return false;
        }
        self.bytes[i * RESEND_SLOT_LEN..][..raw.len()].copy_from_slice(raw);
        // RESEND_SLOT_LEN fits u16.
        self.slots[i] = (seq, raw.len() as u16);
        true
    }

    /// Message `seq`, if still held.
    fn get(&self, seq: u64) -> Option<&[u8]> {
        let i = Self::slot(seq);
        let (held, len) = self.slots[i];
        (held == seq && seq != 0).then(|| &self.bytes[i * RESEND_SLOT_LEN..][..usize::from(len)])
    }
}

const _: () = assert!(RESEND_SLOT_LEN <= u16::MAX as usize);

/// Reject texts, QuickFIX's.
const SENDING_TIME_MISSING: &str = "Required tag missing";
const SENDING_TIME_FORMAT: &str = "Incorrect data format for value";
const SENDING_TIME_ACCURACY: &str = "SendingTime accuracy problem";

/// A header field that makes a message refused: the Reject's RefTagID (371),
/// SessionRejectReason (373) and Text, and whether a Logout follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeaderProblem {
    ref_tag: u32,
    reason: u32,
    text: &'static str,
    logout: bool,
}

impl HeaderProblem {
    /// 373=10, then Logout.
    fn inaccurate(ref_tag: u32) -> Self {
        HeaderProblem {
            ref_tag,
            reason: 10,
            text: SENDING_TIME_ACCURACY,
            logout: true,
        }
    }
}

/// The UTCTimestamp in field `t`: missing, 373=1; malformed, 373=6.
fn timestamp(m: &Message<'_>, t: u32) -> Result<u64, HeaderProblem> {
    let problem = |reason, text| HeaderProblem {
        ref_tag: t,
        reason,
        text,
        logout: false,
    };
    let v = m.get(t).ok_or(problem(1, SENDING_TIME_MISSING))?;
    super::codec::parse_utc_timestamp(v).ok_or(problem(6, SENDING_TIME_FORMAT))
}

/// OrigSendingTime (122) of a PossDupFlag=Y message other than a SequenceReset (QuickFIX
/// accepts one without it there, and so do we): missing, Reject 373=1; malformed, 373=6;
/// later than SendingTime, 373=10 then Logout (QuickFIX's doPossDup). `None`: good.
fn orig_sending_time_problem(m: &Message<'_>) -> Option<HeaderProblem> {
    if m.msg_type() == b"4" {
        return None;
    }
    let orig = match timestamp(m, tag::ORIG_SENDING_TIME) {
        Ok(t) => t,
        Err(p) => return Some(p),
    };
    // The SendingTime check came first: a bad one never gets here.
    let sent = timestamp(m, tag::SENDING_TIME).unwrap_or(u64::MAX);
    (orig > sent).then_some(HeaderProblem::inaccurate(tag::ORIG_SENDING_TIME))
}

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

    /// Sets how long an unanswered ResendRequest waits before it is sent again (default: the
    /// heartbeat interval).
    pub fn set_resend_timeout(&mut self, nanos: u64) {
        self.resend_timeout = Some(nanos.max(1));
    }

    fn resend_timeout(&self) -> u64 {
        self.resend_timeout
            .unwrap_or(match self.cfg.resend_timeout_ms {
                0 => u64::from(self.cfg.heartbeat_secs.max(1)) * 1_000_000_000,
                ms => u64::from(ms) * 1_000_000,
            })
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

    /// The MsgSeqNum the venue said it expects from us when it logged us out for a number
    /// too low ("MsgSeqNum too low, expecting N but received M", QuickFIX's words), if it
    /// did since [`clear_venue_expects`](Self::clear_venue_expects). Logging on again with
    /// the same numbers would be refused the same way; raising ours to N would skip
    /// messages the venue never got, so that is left to an operator.
    pub fn venue_expects(&self) -> Option<u64> {
        self.venue_expects
    }

    /// Why the venue last refused our Logon: the Text (58) of its Logout answering it
    /// (its first [`REFUSAL_TEXT_MAX`] bytes, cleaned; "" if it gave none), for the logs and the
    /// operator's `status`. `None` until a Logon is refused; kept after a later one is
    /// accepted (the counters say how many were refused).
    pub fn logon_refusal(&self) -> Option<&str> {
        self.logon_refusal.as_deref()
    }

    /// Forgets [`venue_expects`](Self::venue_expects) (an operator dealt with it).
    pub fn clear_venue_expects(&mut self) {
        self.venue_expects = None;
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

    /// True while a ResendRequest of ours is outstanding.
    pub fn resend_pending(&self) -> bool {
        self.resend_until.is_some()
    }

    /// The application message we sent as number `seq`, if still held for resends.
    pub fn sent_message(&self, seq: u64) -> Option<&[u8]> {
        self.store.get(seq)
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

    /// `next_in` moved: an outstanding resend is being answered (or is complete).
    fn resend_progress(&mut self) {
        if self.resend_until.is_some_and(|u| self.next_in > u) {
            self.resend_until = None;
        }
        self.answered_reset = false;
    }

    /// Both sides start again at 1 (Logon 141=Y): nothing sent before can be resent under
    /// its old number, and nothing queued is still in sequence.
    /// The journaled part of the session, for a checkpoint.
    pub fn checkpoint_state(&self) -> crate::checkpoint::SessionState {
        let mut sent: Vec<(u64, Vec<u8>)> = self
            .store
            .slots
            .iter()
            .enumerate()
            .filter(|(_, &(seq, _))| seq != 0)
            .map(|(i, &(seq, len))| {
                (
                    seq,
                    self.store.bytes[i * RESEND_SLOT_LEN..][..usize::from(len)].to_vec(),
                )
            })
            .collect();
        sent.sort_unstable_by_key(|(seq, _)| *seq);
        crate::checkpoint::SessionState {
            next_out: self.next_out,
            next_in: self.next_in,
            accepted_in: self.accepted_in,
            answered_reset: self.answered_reset,
            sent,
        }
    }

    /// Restores what [`checkpoint_state`](Self::checkpoint_state) took.
    pub fn restore_state(&mut self, s: &crate::checkpoint::SessionState) {
        self.next_out = s.next_out;
        self.next_in = s.next_in;
        self.accepted_in = s.accepted_in;
        self.answered_reset = s.answered_reset;
        self.store.slots.fill((0, 0));
        for (seq, raw) in &s.sent {
            let _ = self.store.push(*seq, raw);
        }
    }

    fn reset_numbers(&mut self) {
        self.restart_numbers();
        self.counters.resets_received += 1;
    }

    /// Both directions start again at 1 (a Logon 141=Y, the venue's or ours): what was sent
    /// before is no longer resent (a ResendRequest below the reset is gap-filled), and
    /// nothing queued is in sequence any more.
    fn restart_numbers(&mut self) {
        self.next_out = 1;
        self.next_in = 1;
        self.store.slots.fill((0, 0));
        self.queue_clear();
        self.resend_until = None;
    }

    /// Recovery: a frame (or several) we sent before the restart.
    ///
    /// A Logon with 141=Y is either our answer to the venue's reset Logon (journaled right
    /// after it, which already restarted both directions: `answered_reset` with nothing
    /// sent since, `next_out` 1) or our own reset (`reset_on_logon`), which restarts both
    /// directions here as [`on_connect`](Self::on_connect) did live.
    pub fn replay_outbound(&mut self, frames: &[u8]) {
        let mut rest = frames;
        while let Ok(n) = super::split_frame(rest) {
            if let Ok(m) = Message::parse(&rest[..n]) {
                if let (Some(seq), false) = (m.seq(), m.poss_dup()) {
                    if m.msg_type() == b"A"
                        && m.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y")
                        && !(self.answered_reset && self.next_out == 1)
                    {
                        self.restart_numbers();
                        self.answered_reset = true;
                    }
                    self.next_out = self.next_out.max(seq + 1);
                    if is_app(m.msg_type()) {
                        let _ = self.store.push(seq, &rest[..n]);
                    }
                }
            }
            rest = &rest[n..];
        }
    }

    /// Recovery: a frame we processed in sequence before the restart.
    pub fn replay_inbound(&mut self, m: &Message<'_>) {
        self.advance_in(m);
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

    /// Sends a Logon: EncryptMethod, HeartBtInt, ResetSeqNumFlag when `reset`, then
    /// Username and Password when configured (FIX 4.4 field order).
    fn send_logon(&mut self, reset: bool, now: u64, out: &mut Vec<u8>) {
        let hb = u64::from(self.cfg.heartbeat_secs);
        let seq = self.next_out;
        self.next_out += 1;
        self.header(b"A", seq, now);
        let w = &mut self.writer;
        w.uint(tag::ENCRYPT_METHOD, 0).uint(tag::HEART_BT_INT, hb);
        if reset {
            w.field(tag::RESET_SEQ_NUM_FLAG, b"Y");
        }
        if let Some(user) = &self.cfg.username {
            w.field(tag::USERNAME, user.as_bytes());
        }
        if let Some(password) = &self.cfg.password {
            w.field(tag::PASSWORD, password.expose().as_bytes());
        }
        w.finish(out);
        self.last_sent = now;
    }

    /// Our last Logon carried 141=Y and the venue has not confirmed it yet: a Logon 141=Y
    /// from the venue now confirms the reset rather than making a new one.
    pub fn reset_unconfirmed(&self) -> bool {
        self.answered_reset
    }

    /// Whether every Logon we send resets sequence numbers (`reset_on_logon`).
    pub fn resets_on_logon(&self) -> bool {
        self.cfg.reset_on_logon
    }

    /// Transport connected: send Logon. With `reset_on_logon` it carries 141=Y with
    /// MsgSeqNum 1 and both directions start again at 1; the venue's Logon 141=Y answering
    /// it confirms the reset.
    pub fn on_connect(&mut self, now: u64, out: &mut Vec<u8>) {
        let reset = self.cfg.reset_on_logon;
        if reset {
            self.restart_numbers();
        }
        self.send_logon(reset, now, out);
        self.state = SessionState::LogonSent;
        self.logon_sent_at = now;
        self.last_recv = now;
        self.test_request_at = None;
        self.resend_until = None;
        self.answered_reset = reset;
        // As QuickFIX's disconnect(): what was queued comes back with the next resend.
        self.queue_clear();
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

    /// One validated inbound frame.
    pub fn on_message<'a>(
        &mut self,
        m: Message<'a>,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        self.on_inbound(m, false, now, out)
    }

    /// [`on_message`](Self::on_message); `queued`: a message held ahead of a gap, whose
    /// SendingTime was checked against our clock when it arrived (a gap may take longer
    /// than `max_latency_secs` to fill).
    fn on_inbound<'a>(
        &mut self,
        m: Message<'a>,
        queued: bool,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        self.last_recv = now;
        self.test_request_at = None;
        let Some(seq) = m.seq() else {
            if m.get(tag::MSG_SEQ_NUM).is_some() {
                // Present but not a number: nothing to reference; rejected and dropped.
                self.reject(
                    0,
                    Some(tag::MSG_SEQ_NUM),
                    6,
                    "MsgSeqNum not a number",
                    now,
                    out,
                );
                return SessionEvent::None;
            }
            // FIX 4.4 Vol. 2: a message without MsgSeqNum is a serious error on the other
            // side; a Logout ends the connection.
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, b"MsgSeqNum missing");
                },
                now,
                out,
            );
            self.state = SessionState::Disconnected;
            return SessionEvent::Disconnect;
        };
        // QuickFIX's `verify` checks the time before the CompIDs and the sequence number.
        if let Some(p) = self.sending_time_problem(&m, !queued, now) {
            return self.refuse(&m, seq, p, now, out);
        }
        let sender_ok = m.get(tag::SENDER_COMP_ID) == Some(self.cfg.target_comp_id.as_bytes());
        if !sender_ok || m.get(tag::TARGET_COMP_ID) != Some(self.cfg.sender_comp_id.as_bytes()) {
            // FIX 4.4 Vol. 2 (and QuickFIX's doBadCompID): Reject 373=9, take the number if
            // it was the expected one (never skip a gap for it), then Logout and wait for the
            // answer (or the logout timeout).
            let ref_tag = if sender_ok {
                tag::TARGET_COMP_ID
            } else {
                tag::SENDER_COMP_ID
            };
            self.reject_typed(
                seq,
                m.msg_type(),
                Some(ref_tag),
                9,
                "CompID problem",
                now,
                out,
            );
            self.consume_rejected(seq);
            if self.state != SessionState::LogoutSent {
                self.send_admin(
                    b"5",
                    |w| {
                        w.field(tag::TEXT, b"CompID problem");
                    },
                    now,
                    out,
                );
                self.state = SessionState::LogoutSent;
            }
            return SessionEvent::None;
        }
        let ty = m.msg_type();
        if ty == b"5" {
            if self.state == SessionState::LogonSent {
                self.counters.logons_refused += 1;
                self.logon_refusal = Some(refusal_text(m.get(tag::TEXT).unwrap_or_default()));
            }
            if let Some(n) = m.get(tag::TEXT).and_then(expected_in_text) {
                self.counters.seq_too_low_logouts += 1;
                self.venue_expects = Some(n);
            }
            if seq == self.next_in {
                // Takes its number (QuickFIX's nextLogout), or the next session starts by
                // asking for it again.
                self.advance_in(&m);
            }
            if self.state != SessionState::LogoutSent {
                self.send_admin(b"5", |_| {}, now, out);
            }
            self.state = SessionState::Disconnected;
            return SessionEvent::Disconnect;
        }
        if ty == b"2" {
            // Served whatever its sequence number, or two sides both waiting on a gap deadlock.
            self.serve_resend(&m, now, out);
        }
        if ty == b"A" && m.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y") {
            return self.on_reset_logon(&m, seq, now, out);
        }
        if ty == b"4" && m.get(tag::GAP_FILL_FLAG) != Some(b"Y") {
            // SequenceReset-Reset: ignores MsgSeqNum.
            return self.on_sequence_reset(&m, seq, now, out);
        }
        let logon = ty == b"A";
        if logon {
            self.state = SessionState::Active;
            if seq >= self.next_in {
                if let Some(ev) = self.on_next_expected(&m, now, out) {
                    return ev;
                }
            }
        }
        if seq > self.next_in {
            // Ahead of a gap: kept for when the gap is filled (QuickFIX's doTargetTooHigh).
            let kept = self.queue.get(&seq).map_or(0, Vec::len);
            let bytes = self.queue_bytes - kept + m.raw().len();
            if (self.queue.len() < QUEUE_LIMIT || kept > 0) && bytes <= self.queue_max_bytes {
                self.queue_bytes = bytes;
                if self.queue.insert(seq, m.raw().to_vec()).is_none() {
                    self.counters.queued += 1;
                }
            } else {
                self.counters.queue_overflow += 1;
            }
            if self.resend_until.is_none() {
                self.request_resend(seq, now, out);
            }
            return if logon {
                SessionEvent::LoggedOn
            } else {
                SessionEvent::None
            };
        }
        if seq < self.next_in {
            if m.poss_dup() {
                // QuickFIX's doPossDup: a duplicate must still be a well-formed one.
                if let Some(p) = orig_sending_time_problem(&m) {
                    return self.refuse(&m, seq, p, now, out);
                }
                self.counters.duplicates_ignored += 1;
                return SessionEvent::None;
            }
            // A lower sequence number without PossDup is unrecoverable (FIX 4.4 Vol. 2),
            // a SequenceReset-GapFill included: log out, in QuickFIX's words (a venue's
            // operator searches for them).
            let text = format!(
                "MsgSeqNum too low, expecting {} but received {seq}",
                self.next_in
            );
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, text.as_bytes());
                },
                now,
                out,
            );
            self.state = SessionState::Disconnected;
            return SessionEvent::Disconnect;
        }
        if m.poss_dup() {
            // In sequence too (QuickFIX/J's validatePossDup, FIX 4.4 Vol. 2 test cases
            // 2f and 2g).
            if let Some(p) = orig_sending_time_problem(&m) {
                return self.refuse(&m, seq, p, now, out);
            }
        }
        if ty == b"4" {
            // GapFill in sequence: NewSeqNo must move forward (QuickFIX rejects it otherwise
            // and leaves the expected number where it was).
            match m.uint(tag::NEW_SEQ_NO) {
                Ok(new) if new > self.next_in => {}
                Ok(_) => {
                    self.reject_typed(
                        seq,
                        b"4",
                        Some(tag::NEW_SEQ_NO),
                        5,
                        "NewSeqNo too low",
                        now,
                        out,
                    );
                    return SessionEvent::None;
                }
                Err(_) => {
                    self.reject_typed(
                        seq,
                        b"4",
                        Some(tag::NEW_SEQ_NO),
                        1,
                        "NewSeqNo missing",
                        now,
                        out,
                    );
                    return SessionEvent::None;
                }
            }
        }
        self.advance_in(&m);
        self.resend_at = now;
        match ty {
            b"A" => SessionEvent::LoggedOn,
            b"0" | b"2" | b"4" => SessionEvent::None,
            b"1" => {
                // Echoed whole (the venue matches it against the one it sent); the id
                // borrows the inbound frame, not `self`. Left out when absent rather than
                // sent empty (a tag without a value is rejected by a validating venue).
                let id = m.get(tag::TEST_REQ_ID);
                self.send_admin(
                    b"0",
                    |w| {
                        if let Some(id) = id {
                            w.field(tag::TEST_REQ_ID, id);
                        }
                    },
                    now,
                    out,
                );
                SessionEvent::None
            }
            b"3" => {
                self.counters.rejects_received += 1;
                SessionEvent::None
            }
            _ => SessionEvent::App(m),
        }
    }

    /// A queued message handed back by [`Session::next_queued`]: like
    /// [`Session::on_message`], except that a queued Logon or ResendRequest only takes its
    /// number (both were acted on when they arrived), as in QuickFIX's `nextQueued`.
    pub fn on_queued<'a>(
        &mut self,
        m: Message<'a>,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        if matches!(m.msg_type(), b"A" | b"2") && m.seq() == Some(self.next_in) {
            self.next_in += 1;
            self.accepted_in += 1;
            self.resend_progress();
            self.resend_at = now;
            return SessionEvent::None;
        }
        self.on_inbound(m, true, now, out)
    }

    /// After each inbound frame: the next queued message now in sequence (to process with
    /// [`Session::on_queued`]), dropping queued ones a gap fill or reset went past. When a
    /// gap remains and no request covers it, asks for a resend.
    pub fn next_queued(&mut self, now: u64, out: &mut Vec<u8>) -> Option<Vec<u8>> {
        loop {
            let (&seq, _) = self.queue.first_key_value()?;
            if seq < self.next_in {
                self.queue_pop_first();
                continue;
            }
            if seq == self.next_in {
                return self.queue_pop_first();
            }
            if self.resend_until.is_none() && self.state == SessionState::Active {
                self.request_resend(seq, now, out);
            }
            return None;
        }
    }

    /// SendingTime (52) as QuickFIX checks it: missing, Reject 373=1; not a UTCTimestamp,
    /// 373=6; further than `max_latency_secs` from `now` (when `latency` and the check is
    /// on), 373=10 then Logout (FIX 4.4 Vol. 2, QuickFIX's doBadTime). `None`: good.
    fn sending_time_problem(
        &self,
        m: &Message<'_>,
        latency: bool,
        now: u64,
    ) -> Option<HeaderProblem> {
        let sent = match timestamp(m, tag::SENDING_TIME) {
            Ok(t) => t,
            Err(p) => return Some(p),
        };
        let max = u64::from(self.cfg.max_latency_secs) * 1_000_000_000;
        (latency && max > 0 && now.abs_diff(sent) > max)
            .then_some(HeaderProblem::inaccurate(tag::SENDING_TIME))
    }

    /// A message refused for a header field: Reject naming `ref_tag` with `reason`, its
    /// number taken when it was the expected one (not for a Logon or SequenceReset, as
    /// QuickFIX's generateReject), then a Logout when `logout`. A Logon answering ours is
    /// not rejected (there is no session to reject in, QuickFIX disconnects): Logout with
    /// the reason and disconnect.
    fn refuse<'a>(
        &mut self,
        m: &Message<'_>,
        seq: u64,
        problem: HeaderProblem,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        let HeaderProblem {
            ref_tag,
            reason,
            text,
            logout,
        } = problem;
        self.counters.sending_time_problems += 1;
        let ty = m.msg_type();
        if ty == b"A" && self.state == SessionState::LogonSent {
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, text.as_bytes());
                },
                now,
                out,
            );
            self.state = SessionState::Disconnected;
            return SessionEvent::Disconnect;
        }
        self.reject_typed(seq, ty, Some(ref_tag), reason, text, now, out);
        if ty != b"A" && ty != b"4" {
            self.consume_rejected(seq);
        }
        if logout && self.state != SessionState::LogoutSent {
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, text.as_bytes());
                },
                now,
                out,
            );
            self.state = SessionState::LogoutSent;
        }
        SessionEvent::None
    }

    /// Asks for everything from `next_in` on (EndSeqNo 0 = infinity in FIX 4.2+), satisfied
    /// once message `upto` has been processed.
    fn request_resend(&mut self, upto: u64, now: u64, out: &mut Vec<u8>) {
        let from = self.next_in;
        self.send_admin(
            b"2",
            |w| {
                w.uint(tag::BEGIN_SEQ_NO, from).uint(tag::END_SEQ_NO, 0);
            },
            now,
            out,
        );
        self.counters.resend_requests_sent += 1;
        self.resend_until = Some(upto.max(from));
        self.resend_at = now;
    }

    /// NextExpectedMsgSeqNum (789) on the venue's Logon: the number it expects from us. Below
    /// ours it is an implicit ResendRequest (QuickFIX/J with EnableNextExpectedMsgSeqNum
    /// then sends no ResendRequest of its own), served at once; above ours it asks for
    /// what we never sent, which nothing can recover: Logout (FIX 4.4 Vol. 2).
    fn on_next_expected<'a>(
        &mut self,
        m: &Message<'_>,
        now: u64,
        out: &mut Vec<u8>,
    ) -> Option<SessionEvent<'a>> {
        let next = super::codec::parse_uint(m.get(tag::NEXT_EXPECTED_MSG_SEQ_NUM)?)?;
        if next > self.next_out {
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, b"NextExpectedMsgSeqNum higher than sent");
                },
                now,
                out,
            );
            self.state = SessionState::Disconnected;
            return Some(SessionEvent::Disconnect);
        }
        if next < self.next_out {
            self.serve_range(next, 0, now, out);
        }
        None
    }

    /// Logon with ResetSeqNumFlag=Y (QuickFIX `Session::nextLogon`).
    fn on_reset_logon<'a>(
        &mut self,
        m: &Message<'a>,
        seq: u64,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        self.state = SessionState::Active;
        if self.answered_reset && seq == self.next_in {
            self.advance_in(m);
            return SessionEvent::LoggedOn;
        }
        self.advance_in(m);
        // Our answer is number 1 on the reset session.
        self.send_logon(true, now, out);
        self.logon_sent_at = now;
        SessionEvent::LoggedOn
    }

    /// SequenceReset-Reset (QuickFIX `Session::nextSequenceReset`): MsgSeqNum is ignored,
    /// NewSeqNo becomes the next expected number; going backwards is rejected.
    fn on_sequence_reset<'a>(
        &mut self,
        m: &Message<'a>,
        seq: u64,
        now: u64,
        out: &mut Vec<u8>,
    ) -> SessionEvent<'a> {
        match m.uint(tag::NEW_SEQ_NO) {
            Ok(new) if new > self.next_in => {
                self.advance_in(m);
                self.resend_at = now;
            }
            Ok(new) if new == self.next_in => {}
            Ok(_) => self.reject_typed(
                seq,
                b"4",
                Some(tag::NEW_SEQ_NO),
                5,
                "NewSeqNo below the expected MsgSeqNum",
                now,
                out,
            ),
            Err(_) => self.reject_typed(
                seq,
                b"4",
                Some(tag::NEW_SEQ_NO),
                1,
                "NewSeqNo missing",
                now,
                out,
            ),
        }
        SessionEvent::None
    }

    fn serve_resend(&mut self, m: &Message<'_>, now: u64, out: &mut Vec<u8>) {
        let (Ok(begin), Ok(end)) = (m.uint(tag::BEGIN_SEQ_NO), m.uint(tag::END_SEQ_NO)) else {
            let seq = m.seq().unwrap_or(0);
            self.reject(
                seq,
                Some(tag::BEGIN_SEQ_NO),
                1,
                "ResendRequest without range",
                now,
                out,
            );
            return;
        };
        self.serve_range(begin, end, now, out);
    }

    /// Resends `begin..=end` (`end` 0: everything sent): held application messages with
    /// PossDupFlag, gap fills over the rest.
    fn serve_range(&mut self, begin: u64, end: u64, now: u64, out: &mut Vec<u8>) {
        let last = self.next_out - 1;
        let end = if end == 0 || end > last { last } else { end };
        let mut gap_from = begin.max(1);
        // Nothing older than the ring can be held: skip straight past it.
        let oldest = (last + 1).saturating_sub(RESEND_SLOTS as u64).max(gap_from);
        let mut seq = oldest;
        while seq <= end {
            if self.store.get(seq).is_some() {
                if seq > gap_from {
                    self.gap_fill(gap_from, seq, now, out);
                }
                self.resend_one(seq, now, out);
                gap_from = seq + 1;
            }
            seq += 1;
        }
        if begin.max(1) < oldest {
            // Application messages may hide in the range the ring no longer covers.
            self.counters.gap_filled_unavailable += 1;
        }
        if gap_from <= end {
            self.gap_fill(gap_from, end + 1, now, out);
        }
        self.last_sent = now;
    }

    fn gap_fill(&mut self, seq: u64, new_seq: u64, now: u64, out: &mut Vec<u8>) {
        self.header(b"4", seq, now);
        // PossDupFlag=Y requires OrigSendingTime; for a gap fill there is no original, so
        // it is SendingTime (FIX 4.4 Vol. 2, as QuickFIX sends it).
        self.writer
            .field(tag::POSS_DUP_FLAG, b"Y")
            .timestamp(tag::ORIG_SENDING_TIME, now)
            .field(tag::GAP_FILL_FLAG, b"Y")
            .uint(tag::NEW_SEQ_NO, new_seq);
        self.writer.finish(out);
        self.counters.gap_fills_sent += 1;
    }

    /// Re-encodes stored message `seq` with PossDupFlag=Y and OrigSendingTime.
    fn resend_one(&mut self, seq: u64, now: u64, out: &mut Vec<u8>) {
        let Some(raw) = self.store.get(seq) else {
            return;
        };
        let Ok(m) = Message::parse(raw) else { return };
        let (Some(seq), ty) = (m.seq(), m.msg_type()) else {
            return;
        };
        let orig = m.get(tag::SENDING_TIME).unwrap_or(b"");
        let w = &mut self.writer;
        w.start(ty)
            .field(tag::SENDER_COMP_ID, self.cfg.sender_comp_id.as_bytes())
            .field(tag::TARGET_COMP_ID, self.cfg.target_comp_id.as_bytes())
            .uint(tag::MSG_SEQ_NUM, seq)
            .field(tag::POSS_DUP_FLAG, b"Y")
            .timestamp(tag::SENDING_TIME, now)
            .field(tag::ORIG_SENDING_TIME, orig);
        for (t, v) in m.fields().flatten() {
            if !matches!(t, 35 | 49 | 56 | 34 | 52 | 43 | 122 | 97) {
                w.field(t, v);
            }
        }
        w.finish(out);
        self.counters.messages_resent += 1;
    }
}

/// Longest refusal text kept ([`Session::logon_refusal`]); a venue's reason is a line.
pub const REFUSAL_TEXT_MAX: usize = 200;

/// A venue's Text as a line to log or show: its first [`REFUSAL_TEXT_MAX`] bytes, control
/// characters and bad UTF-8 replaced.
fn refusal_text(text: &[u8]) -> Box<str> {
    let text = String::from_utf8_lossy(&text[..text.len().min(REFUSAL_TEXT_MAX)]);
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect::<String>()
        .into_boxed_str()
}

/// N in a Logout text "MsgSeqNum too low, expecting N but received M" (QuickFIX's, the
/// commonest wording; "expecting N" anywhere after "too low" is taken).
fn expected_in_text(text: &[u8]) -> Option<u64> {
    let low = text
        .windows(7)
        .position(|w| w.eq_ignore_ascii_case(b"too low"))?;
    let rest = &text[low..];
    let at = rest
        .windows(10)
        .position(|w| w.eq_ignore_ascii_case(b"expecting "))?
        + 10;
    let digits = rest[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    super::codec::parse_uint(&rest[at..at + digits])
}

/// What the journal keeps of a Password (554).
pub const REDACTED: &[u8] = b"<redacted>";

/// For the journal: a copy of `frame` with the value of Password (554) replaced by
/// [`REDACTED`], framed again (BodyLength, CheckSum), when `frame` is a Logon carrying one;
/// `None` otherwise (the frame is journaled as sent). Replay reads a Logon's type, numbers
/// and flags only, so nothing recovery needs is lost, and the secret never reaches the disk.
pub fn redact_password(frame: &[u8]) -> Option<Vec<u8>> {
    // Cheap test first: every outbound frame passes here, and only Logons carry 554.
    if !frame.windows(6).take(32).any(|w| w == b"\x0135=A\x01")
        || !frame.windows(5).any(|w| w == b"\x01554=")
    {
        return None;
    }
    let m = Message::parse(frame).ok()?;
    let mut w = MessageWriter::default();
    w.start(m.msg_type());
    for (t, v) in m.fields().flatten() {
        match t {
            tag::MSG_TYPE => {}
            tag::PASSWORD => {
                w.field(t, REDACTED);
            }
            _ => {
                w.field(t, v);
            }
        }
    }
    let mut out = Vec::with_capacity(frame.len() + REDACTED.len());
    w.finish(&mut out);
    Some(out)
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
mod tests {
    use super::super::split_frame;
    use super::*;

    pub(super) const SEC: u64 = 1_000_000_000;
    pub(super) const T0: u64 = 1_704_207_600 * SEC;

    pub(super) fn cfg() -> SessionConfig {
        SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        }
    }

    /// Builds a venue → gateway frame.
    pub(super) fn venue(ty: &[u8], seq: u64, extra: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(ty)
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, seq)
            .timestamp(52, T0);
        for (t, v) in extra {
            w.field(*t, v);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        out
    }

    pub(super) fn frames(out: &[u8]) -> Vec<Vec<u8>> {
        let mut v = Vec::new();
        let mut rest = out;
        while !rest.is_empty() {
            let n = split_frame(rest).unwrap();
            v.push(rest[..n].to_vec());
            rest = &rest[n..];
        }
        v
    }

    pub(super) fn active() -> Session {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::LoggedOn
        ));
        s
    }

    #[test]
    fn logon_and_sequence() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = frames(&out);
        let m = Message::parse(&f[0]).unwrap();
        assert_eq!(m.msg_type(), b"A");
        assert_eq!(m.get(108), Some(&b"30"[..]));
        assert_eq!(s.state(), SessionState::LogonSent);
        let s = active();
        assert_eq!(s.state(), SessionState::Active);
        assert_eq!((s.next_out(), s.next_in()), (2, 2));
    }

    #[test]
    fn test_request_is_answered_and_heartbeats_sent() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"1", 2, &[(112, b"abc")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let hb = frames(&out);
        let m = Message::parse(&hb[0]).unwrap();
        assert_eq!((m.msg_type(), m.get(112)), (&b"0"[..], Some(&b"abc"[..])));
        out.clear();
        s.on_timer(T0 + 37 * SEC, &mut out);
        let f = frames(&out);
        let types: Vec<Vec<u8>> = f
            .iter()
            .map(|f| Message::parse(f).unwrap().msg_type().to_vec())
            .collect();
        // The TestRequest counts as traffic, so no Heartbeat is due in the same tick.
        assert_eq!(types, [b"1".to_vec()]);
        out.clear();
        assert!(matches!(
            s.on_timer(T0 + 68 * SEC, &mut out),
            SessionEvent::Disconnect
        ));
    }

    #[test]
    fn inbound_gap_requests_resend_and_gap_fill_closes_it() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"8", 5, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        let m = frames(&out);
        let rr = Message::parse(&m[0]).unwrap();
        assert_eq!(
            (rr.msg_type(), rr.uint(7), rr.uint(16)),
            (&b"2"[..], Ok(2), Ok(0))
        );
        assert_eq!(s.counters().resend_requests_sent, 1);
        // A second out-of-order message does not ask again.
        out.clear();
        let f = venue(b"8", 6, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert!(out.is_empty());
        let f = venue(b"4", 2, &[(43, b"Y"), (123, b"Y"), (36, b"5")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.next_in(), 5);
        // PossDupFlag=Y comes with OrigSendingTime (FIX 4.4; rejected without it).
        let dup: &[(u32, &[u8])] = &[(43, b"Y"), (122, b"20240102-15:00:00.000")];
        let f = venue(b"8", 5, dup);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::App(_)
        ));
        // A PossDup duplicate is ignored, a plain low sequence number logs out.
        let f = venue(b"8", 5, dup);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(s.counters().duplicates_ignored, 1);
        let f = venue(b"8", 3, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
    }

    #[test]
    fn serves_resend_with_poss_dup_and_gap_fill() {
        let mut s = active(); // seq 1 = logon
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out); // 2
        s.on_timer(T0 + 30 * SEC, &mut out); // heartbeat 3 (and maybe test request)
        let after_admin = s.next_out();
        s.send_app(b"D", b"11=2\x0155=AAPL\x01", T0 + 30 * SEC, &mut out);
        out.clear();
        let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
        s.on_message(Message::parse(&rr).unwrap(), T0 + 31 * SEC, &mut out);
        let f = frames(&out);
        let got: Vec<(Vec<u8>, u64, Option<Vec<u8>>)> = f
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                assert!(m.poss_dup());
                (
                    m.msg_type().to_vec(),
                    m.seq().unwrap(),
                    m.get(36).map(<[u8]>::to_vec),
                )
            })
            .collect();
        assert_eq!(got[0], (b"4".to_vec(), 1, Some(b"2".to_vec())));
        assert_eq!(got[1], (b"D".to_vec(), 2, None));
        assert_eq!(
            got[2],
            (b"4".to_vec(), 3, Some(after_admin.to_string().into_bytes()))
        );
        assert_eq!(got[3], (b"D".to_vec(), after_admin, None));
        assert_eq!(Message::parse(&f[1]).unwrap().get(11), Some(&b"1"[..]));
        assert!(Message::parse(&f[1]).unwrap().get(122).is_some());
        assert_eq!(s.counters().messages_resent, 2);
    }

    #[test]
    fn replay_restores_sequence_numbers_and_store() {
        let mut s = active();
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x01", T0, &mut out);
        let mut r = Session::new(cfg());
        r.replay_outbound(&out);
        let f = venue(b"8", 7, &[]);
        r.replay_inbound(&Message::parse(&f).unwrap());
        assert_eq!((r.next_out(), r.next_in()), (3, 8));
        assert_eq!((1..10).filter(|&q| r.store.get(q).is_some()).count(), 1);
    }

    #[test]
    fn bad_comp_id_is_rejected_and_counted() {
        let mut s = active();
        let mut out = Vec::new();
        let mut w = MessageWriter::default();
        w.start(b"8")
            .field(49, b"EVIL")
            .field(56, b"GW")
            .uint(34, 2)
            .timestamp(52, T0);
        let mut f = Vec::new();
        w.finish(&mut f);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let m = frames(&out);
        let rej = Message::parse(&m[0]).unwrap();
        assert_eq!((rej.msg_type(), rej.uint(45)), (&b"3"[..], Ok(2)));
        assert_eq!(s.counters().rejects_sent, 1);
        assert_eq!(s.next_in(), 3);
    }

    #[test]
    fn logout_handshake() {
        let mut s = active();
        let mut out = Vec::new();
        s.logout(T0, &mut out);
        assert_eq!(s.state(), SessionState::LogoutSent);
        let f = venue(b"5", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(frames(&out).len(), 1);
    }
}

#[cfg(test)]
mod interop_tests {
    use super::*;

    use super::tests::{active, frames as parsed, venue, SEC, T0};

    /// The Heartbeat answering a TestRequest carries its TestReqID exactly, however long.
    #[test]
    fn test_req_id_is_echoed_whole() {
        let mut s = active();
        let mut out = Vec::new();
        let id = b"20240102-15:00:00.000-VENUE-TEST-REQUEST-0001";
        let f = venue(b"1", 2, &[(112, id)]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let hb = parsed(&out);
        let m = Message::parse(&hb[0]).unwrap();
        assert_eq!((m.msg_type(), m.get(112)), (&b"0"[..], Some(&id[..])));
        // Without a TestReqID: a Heartbeat without one, not an empty 112.
        out.clear();
        let f = venue(b"1", 3, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let hb = parsed(&out);
        assert_eq!(Message::parse(&hb[0]).unwrap().get(112), None);
    }

    /// A gap fill is sent with PossDupFlag=Y, so it carries OrigSendingTime as FIX 4.4
    /// requires of every message with PossDupFlag=Y (QuickFIX includes it too).
    #[test]
    fn gap_fill_carries_orig_sending_time() {
        let mut s = active();
        let mut out = Vec::new();
        s.on_timer(T0 + 31 * SEC, &mut out); // heartbeat 2
        out.clear();
        let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
        s.on_message(Message::parse(&rr).unwrap(), T0 + 32 * SEC, &mut out);
        let f = parsed(&out);
        assert!(!f.is_empty());
        for f in &f {
            let m = Message::parse(f).unwrap();
            assert_eq!((m.msg_type(), m.poss_dup()), (&b"4"[..], true));
            assert!(m.get(tag::ORIG_SENDING_TIME).is_some(), "no 122");
        }
    }

    /// The venue's Logout takes its sequence number (QuickFIX's nextLogout), so the next
    /// session does not start with a ResendRequest for it.
    #[test]
    fn venue_logout_consumes_its_sequence_number() {
        let mut s = active();
        let mut out = Vec::new();
        let before = s.accepted_in();
        let f = venue(b"5", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(s.next_in(), 3);
        assert_eq!(s.accepted_in(), before + 1, "journaled");
        // Our Logout answer went out.
        let m = parsed(&out);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
    }

    /// MsgSeqNum missing: Logout and disconnect (FIX 4.4 Vol. 2, garbled message rules), not
    /// a Reject referencing sequence number 0.
    #[test]
    fn missing_msg_seq_num_logs_out() {
        let mut s = active();
        let mut out = Vec::new();
        let mut w = MessageWriter::default();
        w.start(b"0")
            .field(49, b"VENUE")
            .field(56, b"GW")
            .timestamp(52, T0);
        let mut f = Vec::new();
        w.finish(&mut f);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        let m = parsed(&out);
        assert_eq!(m.len(), 1);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
        assert_eq!(s.counters().rejects_sent, 0);
    }

    fn bad_comp_id(seq: u64) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(b"8")
            .field(49, b"EVIL")
            .field(56, b"GW")
            .uint(34, seq)
            .timestamp(52, T0);
        let mut f = Vec::new();
        w.finish(&mut f);
        f
    }

    /// A CompID problem is answered with Reject 373=9 and then Logout (FIX 4.4 Vol. 2 test
    /// case 2.j, QuickFIX's doBadCompID), and a number ahead of a gap does not skip it.
    #[test]
    fn bad_comp_id_rejects_then_logs_out_without_skipping_a_gap() {
        let mut s = active();
        let mut out = Vec::new();
        s.on_message(Message::parse(&bad_comp_id(2)).unwrap(), T0, &mut out);
        let m = parsed(&out);
        let types: Vec<&[u8]> = m
            .iter()
            .map(|f| Message::parse(f).unwrap().msg_type())
            .collect();
        assert_eq!(types, [&b"3"[..], &b"5"[..]]);
        let rej = Message::parse(&m[0]).unwrap();
        assert_eq!((rej.uint(45), rej.uint(373)), (Ok(2), Ok(9)));
        assert_eq!(s.next_in(), 3);
        assert_eq!(s.state(), SessionState::LogoutSent);
        let f = venue(b"5", 3, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));

        let mut s = active();
        out.clear();
        s.on_message(Message::parse(&bad_comp_id(9)).unwrap(), T0, &mut out);
        assert_eq!(s.next_in(), 2, "messages 2..8 are still owed");
    }

    /// Our session before: Logon 1, order 2 (never reached the venue). Reconnect: Logon 3.
    fn reconnected() -> (Session, Vec<u8>) {
        let mut s = active();
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out);
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        assert_eq!(s.next_out(), 4);
        (s, out)
    }

    /// A venue Logon with NextExpectedMsgSeqNum (789) below our next number is an implicit
    /// ResendRequest from it (QuickFIX/J with EnableNextExpectedMsgSeqNum sends no
    /// ResendRequest of its own then): we resend from there.
    #[test]
    fn logon_next_expected_msg_seq_num_is_served_as_a_resend() {
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"2")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::LoggedOn
        ));
        let got: Vec<(Vec<u8>, u64, bool, Option<u64>)> = parsed(&out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (
                    m.msg_type().to_vec(),
                    m.seq().unwrap(),
                    m.poss_dup(),
                    m.uint(36).ok(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (b"D".to_vec(), 2, true, None),
                (b"4".to_vec(), 3, true, Some(4)),
            ]
        );
        // In step: nothing to resend.
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"4")]);
        s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.state(), SessionState::Active);
    }

    /// 789 above anything we sent cannot be recovered: Logout and disconnect.
    #[test]
    fn logon_next_expected_msg_seq_num_too_high_logs_out() {
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"9")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::Disconnect
        ));
        let m = parsed(&out);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
    }
}

#[cfg(test)]
mod store_tests {
    use super::super::split_frame;
    use super::*;

    const T0: u64 = 1_704_207_600_000_000_000;

    fn session() -> Session {
        let mut s = Session::new(SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        });
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        s.state = SessionState::Active;
        s
    }

    fn resend_request(s: &mut Session, begin: u64) -> Vec<(Vec<u8>, u64, Option<u64>)> {
        let mut w = MessageWriter::default();
        w.start(b"2")
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, s.next_in())
            .timestamp(52, T0)
            .uint(7, begin)
            .uint(16, 0);
        let mut f = Vec::new();
        w.finish(&mut f);
        let mut out = Vec::new();
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let mut v = Vec::new();
        let mut rest = &out[..];
        while let Ok(n) = split_frame(rest) {
            let m = Message::parse(&rest[..n]).unwrap();
            v.push((m.msg_type().to_vec(), m.seq().unwrap(), m.uint(36).ok()));
            rest = &rest[n..];
        }
        v
    }

    #[test]
    fn store_keeps_the_last_ring_and_gap_fills_what_it_let_go() {
        let mut s = session(); // seq 1 = logon
        let mut out = Vec::new();
        let total = RESEND_SLOTS as u64 + 10;
        for i in 0..total {
            out.clear();
            let body = format!("11={i}\x0155=AAPL\x01");
            s.send_app(b"D", body.as_bytes(), T0, &mut out);
        }
        let last = s.next_out() - 1;
        assert_eq!(last, total + 1);
        // The oldest 11 (logon + 10 orders) fell out of the ring: one gap fill covers them,
        // then every held order is resent in order.
        let got = resend_request(&mut s, 1);
        let first_held = last + 1 - RESEND_SLOTS as u64;
        assert_eq!(got[0], (b"4".to_vec(), 1, Some(first_held)));
        assert_eq!(got.len(), 1 + RESEND_SLOTS);
        assert!(got[1..]
            .iter()
            .zip(first_held..)
            .all(|(m, q)| m.0 == b"D" && m.1 == q));
        assert_eq!(s.counters().gap_filled_unavailable, 1);
        // A recent range is served from the ring without a gap fill.
        let got = resend_request(&mut s, last - 1);
        assert_eq!(
            got.iter().map(|m| m.1).collect::<Vec<_>>(),
            [last - 1, last]
        );
        assert!(got.iter().all(|m| m.0 == b"D"));
        assert_eq!(s.counters().gap_filled_unavailable, 1);
    }

    #[test]
    fn a_message_too_long_to_keep_is_gap_filled() {
        let mut s = session();
        let mut out = Vec::new();
        let long = format!("58={}\x01", "x".repeat(RESEND_SLOT_LEN));
        s.send_app(b"D", long.as_bytes(), T0, &mut out); // 2
        s.send_app(b"D", b"11=1\x01", T0, &mut out); // 3
        assert_eq!(s.counters().too_long_to_keep, 1);
        let got = resend_request(&mut s, 2);
        assert_eq!(got, [(b"4".to_vec(), 2, Some(3)), (b"D".to_vec(), 3, None)]);
    }
}

#[cfg(test)]
mod logon_tests {
    use super::super::split_frame;
    use super::*;

    use super::tests::{frames, venue, SEC, T0};

    fn cfg(reset: bool, credentials: bool) -> SessionConfig {
        SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            username: credentials.then(|| "trader1".into()),
            password: credentials.then(|| Secret::new("s3cret-pw")),
            reset_on_logon: reset,
            max_latency_secs: 0,
        }
    }

    /// (tag, value) of every body field after the header.
    fn body(frame: &[u8]) -> Vec<(u32, Vec<u8>)> {
        Message::parse(frame)
            .unwrap()
            .fields()
            .flatten()
            .filter(|(t, _)| !matches!(t, 35 | 49 | 56 | 34 | 52))
            .map(|(t, v)| (t, v.to_vec()))
            .collect()
    }

    /// Logged on with an order and a few venue messages behind it: both numbers past 1.
    fn busy(cfg: SessionConfig) -> (Session, Vec<u8>) {
        let mut s = Session::new(cfg);
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let first = Message::parse(&frames(&out)[0]).unwrap().seq().unwrap();
        let f = venue(b"A", first, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        let f = if s.cfg.reset_on_logon {
            f
        } else {
            venue(b"A", 1, &[(98, b"0"), (108, b"30")])
        };
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.state(), SessionState::Active);
        s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out);
        for seq in 2..6 {
            s.on_message(
                Message::parse(&venue(b"0", seq, &[])).unwrap(),
                T0,
                &mut out,
            );
        }
        assert_eq!((s.next_out(), s.next_in()), (3, 6));
        (s, out)
    }

    #[test]
    fn logon_carries_username_and_password_after_encrypt_method_and_heartbeat() {
        let mut s = Session::new(cfg(false, true));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = frames(&out);
        assert_eq!(
            body(&f[0]),
            [
                (98, b"0".to_vec()),
                (108, b"30".to_vec()),
                (553, b"trader1".to_vec()),
                (554, b"s3cret-pw".to_vec()),
            ]
        );
        assert_eq!(Message::parse(&f[0]).unwrap().seq(), Some(1));
        // Not configured: neither tag, and no reset flag.
        let mut s = Session::new(cfg(false, false));
        out.clear();
        s.on_connect(T0, &mut out);
        assert_eq!(
            body(&frames(&out)[0]),
            [(98, b"0".to_vec()), (108, b"30".to_vec())]
        );
        // The password shows in no Debug output of the session or its config.
        let s = Session::new(cfg(true, true));
        let dbg = format!("{s:?} {:?}", cfg(true, true));
        assert!(!dbg.contains("s3cret"), "{dbg}");
        assert!(dbg.contains("trader1"), "{dbg}");
    }

    /// A reconnect without `reset_on_logon` keeps counting; with it, the Logon is number 1
    /// with 141=Y (before Username and Password) and both directions start again.
    #[test]
    fn reset_on_logon_sends_141_with_seq_1_on_every_logon_and_restarts_both_directions() {
        let (mut s, mut out) = busy(cfg(false, false));
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        let m = frames(&out);
        let logon = Message::parse(&m[0]).unwrap();
        assert_eq!((logon.seq(), logon.get(141)), (Some(3), None));

        let (mut s, mut out) = busy(cfg(true, true));
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        let m = frames(&out);
        assert_eq!(m.len(), 1);
        let logon = Message::parse(&m[0]).unwrap();
        assert_eq!((logon.msg_type(), logon.seq()), (&b"A"[..], Some(1)));
        assert_eq!(
            body(&m[0]),
            [
                (98, b"0".to_vec()),
                (108, b"30".to_vec()),
                (141, b"Y".to_vec()),
                (553, b"trader1".to_vec()),
                (554, b"s3cret-pw".to_vec()),
            ]
        );
        assert_eq!((s.next_out(), s.next_in()), (2, 1));
        // The venue's Logon 141=Y (its number 1) confirms: logged on, not answered again.
        out.clear();
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::LoggedOn
        ));
        assert!(out.is_empty(), "no second Logon");
        assert_eq!(s.state(), SessionState::Active);
        assert_eq!((s.next_out(), s.next_in()), (2, 2));
        assert_eq!(s.counters().resets_received, 0);
        // The order sent before the reset (old number 2) is not resent: a ResendRequest
        // from 1 is one gap fill over the Logon.
        let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
        s.on_message(Message::parse(&rr).unwrap(), T0 + SEC, &mut out);
        let got: Vec<(Vec<u8>, u64, Option<u64>)> = frames(&out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type().to_vec(), m.seq().unwrap(), m.uint(36).ok())
            })
            .collect();
        assert_eq!(got, [(b"4".to_vec(), 1, Some(2))]);
        assert!(s.sent_message(2).is_none());
    }

    /// Replaying what a reset-on-logon session sent and took gives the live numbers, also
    /// when the venue reset on its own before (its reset Logon, then our answer).
    #[test]
    fn replay_of_our_reset_logon_lands_on_the_live_numbers() {
        let (mut s, mut out) = busy(cfg(true, false));
        let mut journal: Vec<(bool, Vec<u8>)> =
            frames(&out).into_iter().map(|f| (true, f)).collect();
        // What `busy` took from the venue, in order: its Logon, then heartbeats 2..=5.
        journal.insert(
            1,
            (
                false,
                venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]),
            ),
        );
        for seq in 2..6 {
            journal.push((false, venue(b"0", seq, &[])));
        }
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        journal.extend(frames(&out).into_iter().map(|f| (true, f)));
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        out.clear();
        s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out);
        journal.push((false, f));
        s.send_app(b"D", b"11=2\x0155=AAPL\x01", T0 + SEC, &mut out);
        journal.extend(frames(&out).into_iter().map(|f| (true, f)));
        assert_eq!((s.next_out(), s.next_in()), (3, 2));

        let mut r = Session::new(cfg(true, false));
        for (outbound, f) in &journal {
            if *outbound {
                r.replay_outbound(f);
            } else {
                r.replay_inbound(&Message::parse(f).unwrap());
            }
        }
        assert_eq!((r.next_out(), r.next_in()), (s.next_out(), s.next_in()));
        assert!(r
            .sent_message(2)
            .is_some_and(|m| m.windows(4).any(|w| w == b"11=2")));
        assert_eq!(r.store.slots.iter().filter(|x| x.0 != 0).count(), 1);
    }

    #[test]
    fn the_journal_copy_of_a_logon_has_the_password_redacted() {
        let mut s = Session::new(cfg(true, true));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let redacted = redact_password(&out).unwrap();
        assert!(!redacted.windows(9).any(|w| w == b"s3cret-pw"));
        assert_eq!(split_frame(&redacted), Ok(redacted.len()), "framed again");
        let m = Message::parse(&redacted).unwrap();
        assert_eq!(
            (m.msg_type(), m.seq(), m.get(141), m.get(553), m.get(554)),
            (
                &b"A"[..],
                Some(1),
                Some(&b"Y"[..]),
                Some(&b"trader1"[..]),
                Some(REDACTED)
            )
        );
        // Anything else is journaled as sent.
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x01554=x\x01", T0, &mut out);
        assert!(redact_password(&out).is_none());
        let mut s = Session::new(cfg(false, false));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        assert!(redact_password(&out).is_none());
    }
}

#[cfg(test)]
mod checks_tests {
    use super::*;

    use super::tests::{active, frames as parsed, venue, T0};

    fn texts(out: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        parsed(out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type().to_vec(), m.get(tag::TEXT).map(<[u8]>::to_vec))
            })
            .collect()
    }

    /// A SequenceReset-GapFill below the expected number without PossDupFlag is as serious
    /// as any other low message (FIX 4.4 Vol. 2): Logout in QuickFIX's words; with
    /// PossDupFlag=Y it is a duplicate, ignored.
    #[test]
    fn low_gap_fill_without_poss_dup_logs_out() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"0", 2, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.next_in(), 3);
        let dup = venue(
            b"4",
            1,
            &[
                (43, b"Y"),
                (122, b"20240102-15:00:00.000"),
                (123, b"Y"),
                (36, b"3"),
            ],
        );
        assert!(matches!(
            s.on_message(Message::parse(&dup).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert!(out.is_empty());
        assert_eq!(s.counters().duplicates_ignored, 1);
        let low = venue(b"4", 1, &[(123, b"Y"), (36, b"3")]);
        assert!(matches!(
            s.on_message(Message::parse(&low).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(
            texts(&out),
            [(
                b"5".to_vec(),
                Some(b"MsgSeqNum too low, expecting 3 but received 1".to_vec())
            )]
        );
        assert_eq!(s.state(), SessionState::Disconnected);
    }
}

#[cfg(test)]
mod sending_time_tests {
    use super::*;

    use super::tests::{frames as parsed, venue, SEC, T0};

    const STAMP: &[u8] = b"20240102-15:00:00.000";

    fn cfg(max_latency_secs: u32) -> SessionConfig {
        SessionConfig {
            max_latency_secs,
            ..super::tests::cfg()
        }
    }

    fn active(max_latency_secs: u32) -> Session {
        let mut s = Session::new(cfg(max_latency_secs));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::LoggedOn
        ));
        s
    }

    /// A venue frame with SendingTime `sending` (absent when `None`).
    fn venue_at(ty: &[u8], seq: u64, sending: Option<&[u8]>, extra: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(ty)
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, seq);
        if let Some(t) = sending {
            w.field(52, t);
        }
        for (t, v) in extra {
            w.field(*t, v);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        out
    }

    /// (MsgType, RefSeqNum, RefTagID, SessionRejectReason, Text) of every frame sent.
    #[allow(clippy::type_complexity)]
    fn sent(out: &[u8]) -> Vec<(String, Option<u64>, Option<u64>, Option<u64>, String)> {
        parsed(out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                let s = |t| String::from_utf8_lossy(m.get(t).unwrap_or(b"")).into_owned();
                (
                    s(35),
                    m.uint(45).ok(),
                    m.uint(371).ok(),
                    m.uint(373).ok(),
                    s(58),
                )
            })
            .collect()
    }

    fn reject(
        seq: u64,
        tag: u64,
        reason: u64,
        text: &str,
    ) -> (String, Option<u64>, Option<u64>, Option<u64>, String) {
        ("3".into(), Some(seq), Some(tag), Some(reason), text.into())
    }

    fn logout(text: &str) -> (String, Option<u64>, Option<u64>, Option<u64>, String) {
        ("5".into(), None, None, None, text.into())
    }

    /// SendingTime further than `max_latency_secs` from our clock, either way: Reject
    /// 373=10, the number taken, then Logout (FIX 4.4 Vol. 2, QuickFIX's doBadTime); at the
    /// bound it is accepted.
    #[test]
    fn sending_time_beyond_max_latency_is_rejected_then_logged_out() {
        for late in [T0 + 121 * SEC, T0 - 121 * SEC] {
            let mut s = active(120);
            let mut out = Vec::new();
            let f = venue(b"8", 2, &[]);
            assert!(matches!(
                s.on_message(Message::parse(&f).unwrap(), late, &mut out),
                SessionEvent::None
            ));
            assert_eq!(
                sent(&out),
                [
                    reject(2, 52, 10, "SendingTime accuracy problem"),
                    logout("SendingTime accuracy problem")
                ]
            );
            assert_eq!(s.next_in(), 3);
            assert_eq!(s.state(), SessionState::LogoutSent);
            assert_eq!(s.counters().sending_time_problems, 1);
        }
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 120 * SEC, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty());
    }

    /// `max_latency_secs = 0`: no accuracy check (the format is still checked).
    #[test]
    fn max_latency_zero_disables_the_check() {
        let mut s = active(0);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 86_400 * SEC, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty());
    }

    /// SendingTime missing: Reject 373=1 (371=52); not a UTCTimestamp: 373=6. Both take
    /// the number (QuickFIX's generateReject) and keep the session up.
    #[test]
    fn sending_time_missing_or_malformed_is_rejected() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue_at(b"8", 2, None, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        let f = venue_at(b"8", 3, Some(b"2024-01-02 15:00:00"), &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(
            sent(&out),
            [
                reject(2, 52, 1, "Required tag missing"),
                reject(3, 52, 6, "Incorrect data format for value")
            ]
        );
        assert_eq!((s.next_in(), s.state()), (4, SessionState::Active));
        assert_eq!(s.counters().sending_time_problems, 2);
    }

    /// PossDupFlag=Y: OrigSendingTime missing, Reject 373=1 (371=122); later than
    /// SendingTime, 373=10 and Logout (QuickFIX's doPossDup). A SequenceReset-GapFill
    /// without it is accepted, as QuickFIX accepts it.
    #[test]
    fn poss_dup_needs_a_sound_orig_sending_time() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[(43, b"Y")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(sent(&out), [reject(2, 122, 1, "Required tag missing")]);
        assert_eq!(s.next_in(), 3);
        out.clear();
        let f = venue(b"4", 3, &[(43, b"Y"), (123, b"Y"), (36, b"5")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.next_in(), 5);
        // Well formed: accepted.
        let f = venue(b"8", 5, &[(43, b"Y"), (122, STAMP)]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::App(_)
        ));
        // A too-low duplicate is checked the same way before it is ignored.
        let f = venue(b"8", 4, &[(43, b"Y")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(sent(&out), [reject(4, 122, 1, "Required tag missing")]);
        assert_eq!(s.next_in(), 6);
        out.clear();
        let f = venue(b"8", 6, &[(43, b"Y"), (122, b"20240102-15:00:00.001")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(
            sent(&out),
            [
                reject(6, 122, 10, "SendingTime accuracy problem"),
                logout("SendingTime accuracy problem")
            ]
        );
        assert_eq!((s.next_in(), s.state()), (7, SessionState::LogoutSent));
    }

    /// The venue's Logon answering ours with a SendingTime out of bounds: no session to
    /// reject in, so Logout with the reason and disconnect (QuickFIX disconnects).
    #[test]
    fn logon_answer_with_a_bad_sending_time_logs_out_and_disconnects() {
        let mut s = Session::new(cfg(120));
        let mut out = Vec::new();
        s.on_connect(T0 + 600 * SEC, &mut out);
        out.clear();
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 600 * SEC, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(sent(&out), [logout("SendingTime accuracy problem")]);
        assert_eq!((s.state(), s.next_in()), (SessionState::Disconnected, 1));
    }

    /// A message held ahead of a gap was checked when it arrived: the gap taking longer
    /// than `max_latency_secs` to fill does not make it stale.
    #[test]
    fn queued_messages_are_not_stale_when_the_gap_fills_late() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 3, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.queued_len(), 1);
        out.clear();
        let later = T0 + 300 * SEC;
        let gap = venue_at(
            b"4",
            2,
            Some(b"20240102-15:05:00.000"),
            &[(43, b"Y"), (123, b"Y"), (36, b"3")],
        );
        s.on_message(Message::parse(&gap).unwrap(), later, &mut out);
        assert_eq!(s.next_in(), 3);
        let q = s.next_queued(later, &mut out).unwrap();
        assert!(matches!(
            s.on_queued(Message::parse(&q).unwrap(), later, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty(), "{:?}", sent(&out));
        assert_eq!(s.next_in(), 4);
    }
}

#[cfg(test)]
mod seq_too_low_tests {
    use super::*;

    use super::tests::{active, cfg, venue, T0};

    /// The venue's Logout answering our Logon, saying our number is too low: counted, the
    /// number it expects kept for the operator, ours never raised from its text.
    #[test]
    fn venue_logout_for_our_number_too_low_is_kept_not_obeyed() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let ours = s.next_out();
        let f = venue(
            b"5",
            1,
            &[(58, b"MsgSeqNum too low, expecting 105 but received 2")],
        );
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        let c = s.counters();
        assert_eq!((c.logons_refused, c.seq_too_low_logouts), (1, 1));
        assert_eq!(s.venue_expects(), Some(105));
        assert_eq!(s.next_out(), ours + 1, "only our Logout answer was added");
        s.clear_venue_expects();
        assert_eq!(s.venue_expects(), None);
        // Mid-session, in other words: kept too; a Logout without it is not.
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"Sequence number too low: expecting 7")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.venue_expects(), Some(7));
        assert_eq!(s.counters().logons_refused, 0);
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"bye")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.venue_expects(), None);
        assert_eq!(expected_in_text(b"MsgSeqNum too low, expecting x"), None);
        assert_eq!(expected_in_text(b"expecting 5, too low"), None);
    }

    /// The reason a venue gives for refusing our Logon is kept for the logs and `status`;
    /// a Logout mid-session is no refusal and leaves it as it was.
    #[test]
    fn the_text_of_a_logout_refusing_our_logon_is_kept() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        assert_eq!(s.logon_refusal(), None);
        s.on_connect(T0, &mut out);
        let f = venue(b"5", 1, &[(58, b"bad Username or Password")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.counters().logons_refused, 1);
        assert_eq!(s.logon_refusal(), Some("bad Username or Password"));
        // Without a Text: refused all the same, for no reason given.
        s.on_disconnect();
        s.on_connect(T0, &mut out);
        let f = venue(b"5", 2, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(
            (s.counters().logons_refused, s.logon_refusal()),
            (2, Some(""))
        );
        // A venue's text is a line: control characters replaced, cut to a bounded length.
        s.on_disconnect();
        s.on_connect(T0, &mut out);
        let long = [b"no\tway ".as_slice(), &[b'x'; 300]].concat();
        let f = venue(b"5", 3, &[(58, &long)]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let kept = s.logon_refusal().unwrap();
        assert!(
            kept.starts_with("no?way x") && kept.len() == REFUSAL_TEXT_MAX,
            "{kept}"
        );
        // Mid-session: not a refusal.
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"end of day")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.logon_refusal(), None);
    }
}

#[cfg(test)]
mod queue_bytes_tests {
    use super::tests::{active, frames, venue, T0};
    use super::*;

    /// Large messages ahead of a gap stop being queued at the byte bound; the resend (which
    /// asks up to infinity) brings them back, in order.
    #[test]
    fn the_out_of_order_queue_is_bounded_in_bytes_and_the_rest_comes_with_the_resend() {
        let mut s = active();
        s.set_queue_max_bytes(1 << 20);
        let mut out = Vec::new();
        let text = vec![b'x'; 100_000];
        let next = s.next_in();
        // `next` is lost; the 39 after it arrive, 100 KB each: about ten fit in 1 MiB.
        for seq in next + 1..next + 40 {
            let f = venue(b"8", seq, &[(58, &text)]);
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
            assert!(
                s.queued_bytes() <= 1 << 20,
                "{} bytes queued",
                s.queued_bytes()
            );
        }
        let held = s.queued_len() as u64;
        assert!((9..=10).contains(&held), "{held}");
        let c = s.counters();
        assert_eq!((c.queued, c.queue_overflow), (held, 39 - held));
        // One ResendRequest, from the gap up to infinity (EndSeqNo 0).
        let asked: Vec<_> = frames(&out)
            .iter()
            .filter_map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type() == b"2").then(|| (m.uint(7).ok(), m.uint(16).ok()))
            })
            .collect();
        assert_eq!(asked, [(Some(next), Some(0))]);
        // The venue resends from the gap on: the queue drains in order, and what was
        // dropped comes in sequence.
        let mut delivered = Vec::new();
        for seq in next..next + 40 {
            if seq < s.next_in() {
                continue;
            }
            let f = venue(b"8", seq, &[(58, &text)]);
            if let SessionEvent::App(_) = s.on_message(Message::parse(&f).unwrap(), T0, &mut out) {
                delivered.push(seq);
            }
            while let Some(q) = s.next_queued(T0, &mut out) {
                let m = Message::parse(&q).unwrap();
                let seq = m.seq().unwrap();
                if let SessionEvent::App(_) = s.on_queued(m, T0, &mut out) {
                    delivered.push(seq);
                }
            }
        }
        assert_eq!(delivered, (next..next + 40).collect::<Vec<_>>());
        assert_eq!((s.queued_len(), s.queued_bytes()), (0, 0));
    }
}
