//! Logon: ours, the venue's answer, resets (141=Y) and NextExpectedMsgSeqNum (789); the
//! venue's Logout refusing our Logon; the Password kept out of the journal.

use super::*;

/// Longest refusal text kept ([`Session::logon_refusal`]); a venue's reason is a line.
pub const REFUSAL_TEXT_MAX: usize = 200;

/// A venue's Text as a line to log or show: its first [`REFUSAL_TEXT_MAX`] bytes, control
/// characters and bad UTF-8 replaced.
pub(super) fn refusal_text(text: &[u8]) -> Box<str> {
    let text = String::from_utf8_lossy(&text[..text.len().min(REFUSAL_TEXT_MAX)]);
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect::<String>()
        .into_boxed_str()
}

/// N in a Logout text "MsgSeqNum too low, expecting N but received M" (QuickFIX's, the
/// commonest wording; "expecting N" anywhere after "too low" is taken).
pub(super) fn expected_in_text(text: &[u8]) -> Option<u64> {
    let low = text
        .windows(7)
        .position(|w| w.eq_ignore_ascii_case(b"too low"))?;
    let rest = &text[low..];
    let at = rest
        .windows(10)
        .position(|w| w.eq_ignore_ascii_case(b"expecting "))?
        + 10;
    let digits = rest[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    crate::fix::codec::parse_uint(&rest[at..at + digits])
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

impl Session {
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

    pub(super) fn reset_numbers(&mut self) {
        self.restart_numbers();
        self.counters.resets_received += 1;
    }

    /// Both directions start again at 1 (a Logon 141=Y, the venue's or ours): what was sent
    /// before is no longer resent (a ResendRequest below the reset is gap-filled), and
    /// nothing queued is in sequence any more.
    pub(super) fn restart_numbers(&mut self) {
        self.next_out = 1;
        self.next_in = 1;
        self.store.slots.fill((0, 0));
        self.queue_clear();
        self.resend_until = None;
    }

    /// Sends a Logon: EncryptMethod, HeartBtInt, ResetSeqNumFlag when `reset`, then
    /// Username and Password when configured (FIX 4.4 field order).
    pub(super) fn send_logon(&mut self, reset: bool, now: u64, out: &mut Vec<u8>) {
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

    /// NextExpectedMsgSeqNum (789) on the venue's Logon: the number it expects from us. Below
    /// ours it is an implicit ResendRequest (QuickFIX/J with EnableNextExpectedMsgSeqNum
    /// then sends no ResendRequest of its own), served at once; above ours it asks for
    /// what we never sent, which nothing can recover: Logout (FIX 4.4 Vol. 2).
    pub(super) fn on_next_expected<'a>(
        &mut self,
        m: &Message<'_>,
        now: u64,
        out: &mut Vec<u8>,
    ) -> Option<SessionEvent<'a>> {
        let next = crate::fix::codec::parse_uint(m.get(tag::NEXT_EXPECTED_MSG_SEQ_NUM)?)?;
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
    pub(super) fn on_reset_logon<'a>(
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
}
