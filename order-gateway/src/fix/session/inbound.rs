//! Inbound messages: header checks (SendingTime, CompIDs, MsgSeqNum), what the session
//! state allows, sequence numbers too high (queued) or too low, SequenceReset, and the
//! session-level answers (Heartbeat, Reject, Logout).

use super::*;

/// Reject texts, QuickFIX's.
pub(super) const SENDING_TIME_MISSING: &str = "Required tag missing";
pub(super) const SENDING_TIME_FORMAT: &str = "Incorrect data format for value";
pub(super) const SENDING_TIME_ACCURACY: &str = "SendingTime accuracy problem";

/// A header field that makes a message refused: the Reject's RefTagID (371),
/// SessionRejectReason (373) and Text, and whether a Logout follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HeaderProblem {
    ref_tag: u32,
    reason: u32,
    text: &'static str,
    logout: bool,
}

impl HeaderProblem {
    /// 373=10, then Logout.
    pub(super) fn inaccurate(ref_tag: u32) -> Self {
        HeaderProblem {
            ref_tag,
            reason: 10,
            text: SENDING_TIME_ACCURACY,
            logout: true,
        }
    }
}

/// The UTCTimestamp in field `t`: missing, 373=1; malformed, 373=6.
pub(super) fn timestamp(m: &Message<'_>, t: u32) -> Result<u64, HeaderProblem> {
    let problem = |reason, text| HeaderProblem {
        ref_tag: t,
        reason,
        text,
        logout: false,
    };
    let v = m.get(t).ok_or(problem(1, SENDING_TIME_MISSING))?;
    crate::fix::codec::parse_utc_timestamp(v).ok_or(problem(6, SENDING_TIME_FORMAT))
}

/// OrigSendingTime (122) of a PossDupFlag=Y message other than a SequenceReset (QuickFIX
/// accepts one without it there, and so do we): missing, Reject 373=1; malformed, 373=6;
/// later than SendingTime, 373=10 then Logout (QuickFIX's doPossDup). `None`: good.
pub(super) fn orig_sending_time_problem(m: &Message<'_>) -> Option<HeaderProblem> {
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

impl Session {
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
    pub(super) fn on_inbound<'a>(
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
        if !self.valid_logon_state(&m) {
            // QuickFIX's `validLogonState` failing: it logs the event and disconnects
            // without a Logout; nothing of the message is processed and its number is not
            // taken (the next session asks for it again). FIX 4.4 Vol. 2 test cases 1B and
            // 2Q: the first message must be a Logon; a Logon is not accepted twice.
            self.counters.out_of_state += 1;
            self.state = SessionState::Disconnected;
            return SessionEvent::Disconnect;
        }
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
                // TestReqID is required (FIX 4.4): without it there is nothing to echo, so
                // a session Reject, 373=1 required tag missing, as QuickFIX's validation
                // answers; the number stays taken.
                let Some(id) = m.get(tag::TEST_REQ_ID) else {
                    self.reject_typed(
                        seq,
                        b"1",
                        Some(tag::TEST_REQ_ID),
                        1,
                        "Required tag missing",
                        now,
                        out,
                    );
                    return SessionEvent::None;
                };
                // Echoed whole (the venue matches it against the one it sent); the id
                // borrows the inbound frame, not `self`.
                self.send_admin(
                    b"0",
                    |w| {
                        w.field(tag::TEST_REQ_ID, id);
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

    /// Whether the session state allows `m` now, as QuickFIX's `validLogonState`: before
    /// the venue's Logon only a Logon, a Logout (a refusal), a SequenceReset or a Reject;
    /// once logged on (or logging out), no second Logon unless it resets sequence numbers (141=Y, handled
    /// as a reset) or is a PossDup resend.
    pub(super) fn valid_logon_state(&self, m: &Message<'_>) -> bool {
        let ty = m.msg_type();
        match self.state {
            SessionState::LogonSent => matches!(ty, b"A" | b"5" | b"4" | b"3"),
            SessionState::Active | SessionState::LogoutSent => {
                ty != b"A" || m.get(tag::RESET_SEQ_NUM_FLAG) == Some(b"Y") || m.poss_dup()
            }
            SessionState::Disconnected => true,
        }
    }

    /// A well-framed message whose BeginString is not FIX.4.4
    /// ([`FixError::WrongBeginString`](crate::fix::FixError::WrongBeginString)): Logout saying
    /// so, then disconnect (FIX 4.4 Vol. 2 test case 2R; QuickFIX's UnsupportedVersion
    /// answers "Incorrect BeginString"). Its number is not taken: the session ends here.
    pub fn on_wrong_begin_string(&mut self, now: u64, out: &mut Vec<u8>) -> SessionEvent<'static> {
        self.counters.wrong_begin_string += 1;
        if matches!(self.state, SessionState::Active | SessionState::LogonSent) {
            self.send_admin(
                b"5",
                |w| {
                    w.field(tag::TEXT, b"Incorrect BeginString");
                },
                now,
                out,
            );
        }
        self.state = SessionState::Disconnected;
        SessionEvent::Disconnect
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
    pub(super) fn sending_time_problem(
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
    pub(super) fn refuse<'a>(
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

    /// SequenceReset-Reset (QuickFIX `Session::nextSequenceReset`): MsgSeqNum is ignored,
    /// NewSeqNo becomes the next expected number; going backwards is rejected.
    pub(super) fn on_sequence_reset<'a>(
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
}
