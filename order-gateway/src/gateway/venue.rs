//! The venue side of [`Gateway`]: the FIX transport's events and timers, inbound bytes
//! framed, parsed and passed through the session (malformed frames rejected as QuickFIX
//! does), outbound frames journaled one record each, the OrderStatusRequests for orders in
//! doubt at logon, and application messages routed to `fills`.
//!
//! Must not touch sockets or files: the driver owns the link.

use rocebus::clock::Wall;

use super::orders::side_fix;
use super::records::record;
use super::{Gateway, OrderStatus, Outputs};
use crate::fix::session::{push_field, push_uint, redact_password};
use crate::fix::{split_frame, tag, Message, SessionEvent, SessionState};
use crate::journal::encode_record;

/// Why an application message was rejected: (tag, FIX SessionRejectReason, text).
pub(super) type AppReject = (u32, u32, &'static str);

impl Gateway {
    /// FIX transport connected: logs on.
    pub fn on_connect(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        self.session.on_connect(now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// FIX transport lost.
    pub fn on_disconnect(&mut self) {
        self.session.on_disconnect();
        self.inbuf.clear();
    }

    /// When [`on_timer`](Self::on_timer) next has something to do: the FIX session's
    /// timers, and while it is logged on the engines' cancel-on-disconnect deadlines (they
    /// need the venue). `None`: nothing until an event changes that.
    pub fn poll_timeout(&self) -> Option<Wall> {
        let session = self.session.poll_timeout();
        let engines = if self.session.state() == SessionState::Active {
            self.engines.poll_timeout()
        } else {
            None
        };
        match (session, engines) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Timers (heartbeat, test request, timeouts, cancel-on-disconnect after a restart).
    pub fn on_timer(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        if matches!(
            self.session.on_timer(now, &mut out.fix),
            SessionEvent::Disconnect
        ) {
            out.disconnect = true;
        }
        Self::journal_out(out, start);
        // Cancels need the venue: a deadline that passed while it was down fires once the
        // session is up.
        if self.session.state() == SessionState::Active {
            while let Some(engine) = self.engines.poll_due(Wall::from_nanos(now)) {
                self.counters.deferred_cancel_on_disconnect += 1;
                self.on_engine_disconnect(engine, now, out);
            }
        }
    }

    /// Starts a FIX logout.
    pub fn logout(&mut self, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        self.session.logout(now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// Journals the FIX frames written since `start`, one record per frame, so a record is
    /// never larger than one message whatever a resend answers with. A Logon's Password is
    /// journaled redacted ([`redact_password`]).
    pub(super) fn journal_out(out: &mut Outputs, start: usize) {
        let mut rest = &out.fix[start..];
        while !rest.is_empty() {
            // The session writes whole frames; should one ever not split, it goes whole.
            let n = split_frame(rest).map_or(rest.len(), |n| n.clamp(1, rest.len()));
            match redact_password(&rest[..n]) {
                Some(redacted) => {
                    encode_record(&mut out.journal, record::FIX_OUT, &[&redacted]);
                }
                None => encode_record(&mut out.journal, record::FIX_OUT, &[&rest[..n]]),
            }
            out.journal_records += 1;
            rest = &rest[n..];
        }
    }

    /// Bytes from the venue.
    pub fn on_fix_bytes(&mut self, bytes: &[u8], now: u64, out: &mut Outputs) {
        let mut buf = std::mem::take(&mut self.inbuf);
        buf.extend_from_slice(bytes);
        let mut pos = 0;
        while pos < buf.len() {
            match split_frame(&buf[pos..]) {
                Ok(n) => {
                    self.on_frame(&buf[pos..pos + n], false, now, out);
                    self.drain_queued(now, out);
                    pos += n;
                }
                Err(crate::fix::FixError::Incomplete) => break,
                Err(crate::fix::FixError::WrongBeginString { .. }) => {
                    // Not garbled: the venue speaks another version. Logout, disconnect.
                    self.counters.malformed_fix += 1;
                    tracing::warn!(
                        "FIX message with a BeginString other than FIX.4.4: logging out"
                    );
                    let start = out.fix.len();
                    if matches!(
                        self.session.on_wrong_begin_string(now, &mut out.fix),
                        SessionEvent::Disconnect
                    ) {
                        out.disconnect = true;
                    }
                    Self::journal_out(out, start);
                    pos = buf.len();
                }
                Err(
                    crate::fix::FixError::BadBeginString { skip }
                    | crate::fix::FixError::BadBodyLength { skip }
                    | crate::fix::FixError::BadChecksum { skip },
                ) => {
                    // Garbled frames are dropped (FIX spec); the gap they leave is resent.
                    self.counters.malformed_fix += 1;
                    self.session.count_garbled();
                    pos += skip.max(1);
                }
                Err(_) => {
                    self.counters.malformed_fix += 1;
                    pos = buf.len();
                }
            }
            if out.disconnect {
                break;
            }
        }
        buf.drain(..pos.min(buf.len()));
        self.inbuf = buf;
        if !self.cancel_after_change.is_empty() && self.session.state() == SessionState::Active {
            self.cancel_after_changes(now, out);
        }
        self.seal(out);
    }

    /// Feeds the messages queued ahead of a gap that are now in sequence.
    fn drain_queued(&mut self, now: u64, out: &mut Outputs) {
        while !out.disconnect {
            let start = out.fix.len();
            let next = self.session.next_queued(now, &mut out.fix);
            Self::journal_out(out, start);
            let Some(frame) = next else { break };
            self.on_frame(&frame, true, now, out);
        }
    }

    fn on_frame(&mut self, frame: &[u8], queued: bool, now: u64, out: &mut Outputs) {
        let start = out.fix.len();
        let m = match Message::parse(frame) {
            Ok(m) => m,
            Err(
                crate::fix::FixError::MissingTag(tag::MSG_TYPE)
                | crate::fix::FixError::BadField(0)
                | crate::fix::FixError::BadDataLength(_),
            ) => {
                // MsgType not the third field, or a data field (RawData, XmlData...) not
                // matching its declared length: a garbled message (FIX 4.4 Vol. 2), ignored
                // like a bad CheckSum, neither rejected nor given its sequence number, so
                // the gap it leaves is resent.
                self.counters.malformed_fix += 1;
                self.session.count_garbled();
                tracing::warn!(seq = find_seq(frame), "garbled FIX message ignored");
                return;
            }
            Err(e) => {
                self.counters.malformed_fix += 1;
                let seq = find_seq(frame);
                let (ref_tag, reason, text) = bad_field(frame, e);
                self.session.reject_typed(
                    seq.unwrap_or(0),
                    find_msg_type(frame).unwrap_or(b""),
                    ref_tag,
                    reason,
                    text,
                    now,
                    &mut out.fix,
                );
                tracing::warn!(seq, ?ref_tag, reason, text, "FIX message rejected");
                if let Some(seq) = seq {
                    let before = self.session.accepted_in();
                    self.session.consume_rejected(seq);
                    if self.session.accepted_in() != before {
                        // Journaled so a restart consumes the same number (replay_into).
                        out.record(record::FIX_IN, &[frame]);
                    }
                }
                Self::journal_out(out, start);
                return;
            }
        };
        // A Logon that restarts sequence numbers (the venue's 141=Y, or ours answered):
        // what the venue sent before it is never resent.
        // A QuickFIX peer confirms our answer to its reset with a second Logon 141=Y while
        // the session is up: the orders were asked about at the first.
        let confirmation =
            self.session.state() == SessionState::Active && self.session.reset_unconfirmed();
        let reset_logon = m.msg_type() == b"A"
            && (m.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y") || self.session.resets_on_logon());
        let before = self.session.accepted_in();
        let rejected_before = self.session.rejected_in();
        let resets_before = self.session.counters().resets_received;
        let too_low_before = self.session.counters().seq_too_low_logouts;
        let ev = if queued {
            self.session.on_queued(m, now, &mut out.fix)
        } else {
            self.session.on_message(m, now, &mut out.fix)
        };
        if self.session.rejected_in() != rejected_before {
            // Rejected (CompID, SendingTime) but numbered: replay must not apply it.
            out.record(record::FIX_IN_REJECTED, &[frame]);
        } else if self.session.accepted_in() != before {
            out.record(record::FIX_IN, &[frame]);
            if m.msg_type() == b"3" {
                self.on_session_reject(&m, out);
            }
        }
        let logged_on = matches!(ev, SessionEvent::LoggedOn) && !(reset_logon && confirmation);
        match ev {
            SessionEvent::App(m) => {
                if let Err((t, reason, text)) = self.apply_app(&m, out) {
                    self.counters.rejected_app += 1;
                    let seq = m.seq().unwrap_or(0);
                    tracing::warn!(
                        seq,
                        tag = t,
                        reason,
                        text,
                        "FIX application message rejected"
                    );
                    self.session.reject_typed(
                        seq,
                        m.msg_type(),
                        Some(t),
                        reason,
                        text,
                        now,
                        &mut out.fix,
                    );
                }
            }
            SessionEvent::None
                if m.msg_type() == b"4"
                    && self.session.counters().resets_received != resets_before =>
            {
                // A SequenceReset-Reset from the venue moved the expected number on: the
                // messages it skipped are never resent, so every live order is asked
                // about, as after a reset logon.
                if !self.replaying {
                    tracing::warn!(
                        next_in = self.session.next_in(),
                        "venue SequenceReset-Reset: querying every live order"
                    );
                }
                self.query_order_status(true, now, out);
            }
            SessionEvent::Disconnect => {
                out.disconnect = true;
                let too_low = self.session.counters().seq_too_low_logouts != too_low_before;
                if let (true, Some(expected)) = (too_low, self.session.venue_expects()) {
                    tracing::error!(
                        venue_expects = expected,
                        our_next = self.session.next_out().saturating_sub(1),
                        times = self.session.counters().seq_too_low_logouts,
                        "venue logged us out: our MsgSeqNum is too low. Not logging on again \
                         until an operator acts (`order-gateway control venue-reconnect` \
                         once the venue's expected number is sorted out)"
                    );
                }
            }
            SessionEvent::LoggedOn if reset_logon && confirmation => {}
            SessionEvent::LoggedOn => self.query_order_status(reset_logon, now, out),
            SessionEvent::None => {}
        }
        Self::journal_out(out, start);
        if logged_on {
            // After the frames above are journaled: each cancel journals its own.
            self.cancel_killed(now, out);
        }
    }

    /// At logon: an OrderStatusRequest (35=H) per order whose state the venue must tell us.
    ///
    /// After a normal logon, the orders sent and not yet acknowledged (after a crash or a
    /// lost connection the venue may or may not have them): the answer (ExecType I)
    /// acknowledges those it has, and the session's resend handling delivers every other
    /// report missed. Querying every live order then would only repeat what the resends
    /// bring, at the cost of one message each way per resting order at every reconnect.
    ///
    /// After a logon that reset sequence numbers, or a mid-session SequenceReset-Reset from
    /// the venue (`all`), every order not final: the reports the venue sent before the reset
    /// (or in the numbers it skipped) that we never read (fills, cancels) are never resent, and only the answers' CumQty and OrdStatus recover them
    /// (`on_status_answer`). Bounded per logon, lowest order ids first.
    fn query_order_status(&mut self, all: bool, now: u64, out: &mut Outputs) {
        const MAX_QUERIES: usize = 10_000;
        let mut doubt: Vec<(u64, u64)> = self
            .book
            .iter()
            .filter(|(_, o)| match o.status {
                OrderStatus::PendingNew => true,
                OrderStatus::Open => all,
                OrderStatus::Done => false,
            })
            .map(|(oid, o)| (oid, o.venue_cl_ord_id))
            .collect();
        doubt.sort_unstable();
        doubt.truncate(MAX_QUERIES);
        for (oid, venue_cl) in doubt {
            let Some(o) = self.book.get(oid) else {
                continue;
            };
            let (symbol, side) = (o.params.symbol, o.params.side);
            let b = &mut self.body;
            b.clear();
            push_uint(b, tag::CL_ORD_ID, venue_cl);
            push_field(b, tag::SYMBOL, symbol.as_bytes());
            push_field(b, tag::SIDE, side_fix(side));
            self.session.send_app(b"H", &self.body, now, &mut out.fix);
            self.counters.status_requests += 1;
        }
    }

    /// Applies an in-sequence application message (live and replay).
    pub(super) fn apply_app(
        &mut self,
        m: &Message<'_>,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        match m.msg_type() {
            b"8" => self.on_execution_report(m, out),
            b"9" => self.on_cancel_reject(m, out),
            b"j" => {
                // BusinessMessageReject: BusinessRejectRefID (379) is the ClOrdID of the
                // order message refused (a venue's throttle, an unsupported field value...).
                let ref_type = m.get(tag::REF_MSG_TYPE).unwrap_or(b"");
                let req = m.get(tag::BUSINESS_REJECT_REF_ID);
                if let Some(req) = req.and_then(crate::fix::codec::parse_uint) {
                    self.on_request_refused(ref_type, req, out);
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// A session Reject (35=3) taken in sequence (live and replay): when RefSeqNum is one
    /// of our order messages, the venue refused it at the session level (a required tag
    /// missing, a value out of range for its dictionary) and no other answer will come.
    pub(super) fn on_session_reject(&mut self, m: &Message<'_>, out: &mut Outputs) {
        let Some(ref_seq) = m
            .get(tag::REF_SEQ_NUM)
            .and_then(crate::fix::codec::parse_uint)
        else {
            return;
        };
        let Some(sent) = self.session.sent_message(ref_seq) else {
            return;
        };
        let Ok(sent) = Message::parse(sent) else {
            return;
        };
        let ty = match sent.msg_type() {
            b"D" => b"D",
            b"F" => b"F",
            b"G" => b"G",
            _ => return,
        };
        let Some(req) = sent
            .get(tag::CL_ORD_ID)
            .and_then(crate::fix::codec::parse_uint)
        else {
            return;
        };
        self.on_request_refused(ty, req, out);
    }

    pub(super) fn lookup(&mut self, m: &Message<'_>) -> Result<Option<(u64, u64)>, AppReject> {
        let req = m
            .require(tag::CL_ORD_ID)
            .map_err(|_| (tag::CL_ORD_ID, 1, "required tag missing"))?;
        // A ClOrdID that is not one of our numbers is an unknown order, not a bad message.
        let req = crate::fix::codec::parse_uint(req).unwrap_or(0);
        match self.book.order_of_request(req) {
            Some(oid) => Ok(Some((req, oid))),
            None => {
                self.counters.unknown_exec += 1;
                // Not ours, or an order final before the previous checkpoint: nothing to
                // apply it to, and an operator should know (a late fill moves the real
                // position). Logged at the 1st, 2nd, 4th, 8th... so a venue that floods
                // them cannot flood the log.
                if !self.replaying && self.counters.unknown_exec.is_power_of_two() {
                    tracing::warn!(
                        total = self.counters.unknown_exec,
                        cl_ord_id = req,
                        msg_type = %String::from_utf8_lossy(m.msg_type()),
                        exec_id = %String::from_utf8_lossy(m.get(tag::EXEC_ID).unwrap_or(b"")),
                        "venue report for an order the gateway does not hold: not applied"
                    );
                }
                Ok(None)
            }
        }
    }
}

/// Finds MsgType in a frame whose fields did not all parse.
fn find_msg_type(frame: &[u8]) -> Option<&[u8]> {
    let at = frame.windows(4).position(|w| w == b"\x0135=")? + 4;
    let len = frame[at..]
        .iter()
        .position(|&c| c == crate::fix::codec::SOH)?;
    Some(&frame[at..at + len])
}

/// RefTagID, SessionRejectReason and text for a frame whose fields do not parse: an empty
/// value is reason 4 (tag specified without a value), anything else 0 (invalid tag number),
/// as QuickFIX reports them.
fn bad_field(frame: &[u8], e: crate::fix::FixError) -> (Option<u32>, u32, &'static str) {
    let crate::fix::FixError::BadField(at) = e else {
        return (Some(tag::MSG_TYPE), 1, "MsgType missing or not first");
    };
    // `at` is relative to the body, which starts after BodyLength.
    let body = frame
        .iter()
        .skip(10)
        .position(|&c| c == crate::fix::codec::SOH)
        .map_or(0, |i| i + 11);
    let field = frame.get(body + at..).unwrap_or(b"");
    let field = &field[..field
        .iter()
        .position(|&c| c == crate::fix::codec::SOH)
        .unwrap_or(field.len())];
    match field.iter().position(|&c| c == b'=') {
        Some(eq) => {
            let t = std::str::from_utf8(&field[..eq])
                .ok()
                .and_then(|t| t.parse::<u32>().ok())
                .filter(|&t| t > 0);
            match t {
                Some(t) if eq + 1 == field.len() => (Some(t), 4, "tag specified without a value"),
                _ => (None, 0, "invalid tag number"),
            }
        }
        None => (None, 0, "invalid tag number"),
    }
}

/// Finds MsgSeqNum in a frame whose fields did not all parse.
pub(super) fn find_seq(frame: &[u8]) -> Option<u64> {
    let at = frame.windows(4).position(|w| w == b"\x0134=")? + 4;
    let digits = frame[at..]
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    std::str::from_utf8(&frame[at..at + digits])
        .ok()?
        .parse()
        .ok()
}
