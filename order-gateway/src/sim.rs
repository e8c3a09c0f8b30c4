//! An in-process venue simulator behind the [`VenueLink`] interface: it parses the FIX the
//! gateway writes and answers at once, with no socket and no thread. Every NewOrderSingle
//! is acknowledged (ExecType New) and completely filled at its limit price in the same
//! reply; a cancel or replace of an order it still knows is answered Canceled/Replaced.
//! Logon, TestRequest and Logout get their session answers; its sequence numbers go on
//! across reconnects. With [`SimVenue::keep_history`] (the deterministic simulator,
//! [`crate::simulator`]) it also serves ResendRequests (execution reports again with
//! PossDupFlag=Y, session messages as a gap fill) and answers OrderStatusRequests, and
//! [`SimVenue::set_now`] gives it a clock other than the wall clock. In that mode it also
//! asks for a resend when the gateway's MsgSeqNum jumps (messages lost on the way), after its
//! Logon answer when a Logon jumps (FIX 4.4 Vol. 2, as QuickFIX does), and asks again at
//! every Logon while numbers it asked for have not come (its expected number stays at the
//! gap, as QuickFIX's does); it takes a PossDupFlag=Y order, cancel or replace only if it
//! never had its ClOrdID. Unlike QuickFIX it does not hold back the messages after a gap
//! until the gap is filled: it answers them as they come.
//!
//! It exists for the gateway round-trip benchmark (`rocebus-bench gateway-rtt`), where it
//! stands in for the venue so the figure is ours: engine → RC → risk → journal → FIX encode
//! → simulator → FIX decode → RC → engine. It is a venue, not a test double: the gateway
//! runs its full session and order logic against it.

use std::io;
use std::time::Duration;

use crate::driver::{LinkRead, VenueLink};
use crate::fix::{split_frame, tag, Message, MessageWriter};
use crate::unix_nanos;

/// The most skipped numbers the venue remembers (a gap larger than this is asked for only
/// as far as this).
const MAX_MISSING: usize = 100_000;

/// The simulated venue.
#[derive(Debug, Default)]
pub struct SimVenue {
    open: bool,
    next_out: u64,
    next_exec: u64,
    writer: MessageWriter,
    /// Replies not yet read by the gateway; `read_at` is the read cursor.
    pending: Vec<u8>,
    read_at: usize,
    /// Frames received that did not parse (should stay zero).
    malformed: u64,
    orders: u64,
    /// Every message sent, by MsgSeqNum - 1 (only with `keep_history`).
    sent: Vec<Vec<u8>>,
    keep_history: bool,
    /// Orders received, by ClOrdID: (quantity, price), for status answers.
    known: griddle::HashMap<Vec<u8>, (u64, Vec<u8>), rustc_hash::FxBuildHasher>,
    /// Orders above this quantity rest (acknowledged, never filled) until canceled (only
    /// with `keep_history`; see [`SimVenue::rest_above`]).
    rest_above: Option<u64>,
    /// ClOrdIDs of resting orders, and of those canceled.
    resting: griddle::HashSet<Vec<u8>, rustc_hash::FxBuildHasher>,
    canceled: griddle::HashSet<Vec<u8>, rustc_hash::FxBuildHasher>,
    /// The MsgSeqNum expected next from the gateway (0: none yet; only with `keep_history`).
    next_in: u64,
    /// ClOrdIDs of cancels and replaces received (only with `keep_history`).
    changes: griddle::HashSet<Vec<u8>, rustc_hash::FxBuildHasher>,
    /// The gateway's numbers skipped (asked for, never received, neither resent nor gap
    /// filled), at most [`MAX_MISSING`] (only with `keep_history`).
    missing: std::collections::BTreeSet<u64>,
    /// The clock set by [`SimVenue::set_now`]; the wall clock when `None`.
    now: Option<u64>,
}

impl SimVenue {
    /// A closed simulator; the driver's connect opens it.
    pub fn new() -> SimVenue {
        SimVenue {
            pending: Vec::with_capacity(1 << 16),
            ..SimVenue::default()
        }
    }

    /// Keeps every message sent, to serve ResendRequests, and every order, to answer
    /// OrderStatusRequests (memory grows with the day: not for benchmarks).
    pub fn keep_history(mut self) -> SimVenue {
        self.keep_history = true;
        self
    }

    /// With `keep_history`: an order above `qty` is acknowledged and rests, unfilled, until
    /// it is canceled (so cancels, cancel-on-disconnect and kill switches find live orders).
    pub fn rest_above(mut self, qty: u64) -> SimVenue {
        self.rest_above = Some(qty);
        self
    }

    /// The time the venue stamps its messages with from now on (a simulated clock).
    pub fn set_now(&mut self, now: u64) {
        self.now = Some(now);
    }

    /// A copy of `frame` (one this venue sent) marked PossDupFlag=Y with OrigSendingTime,
    /// as a resend carries it.
    pub fn poss_dup_copy(frame: &[u8], now: u64) -> Option<Vec<u8>> {
        let m = Message::parse(frame).ok()?;
        let mut w = MessageWriter::default();
        w.start(m.msg_type())
            .field(tag::SENDER_COMP_ID, m.get(tag::SENDER_COMP_ID)?)
            .field(tag::TARGET_COMP_ID, m.get(tag::TARGET_COMP_ID)?)
            .uint(tag::MSG_SEQ_NUM, m.seq()?)
            .field(tag::POSS_DUP_FLAG, b"Y")
            .timestamp(tag::SENDING_TIME, now)
            .field(tag::ORIG_SENDING_TIME, m.get(tag::SENDING_TIME)?);
        for (t, v) in m.fields().flatten() {
            if !matches!(t, 8 | 9 | 10 | 35 | 49 | 56 | 34 | 43 | 52 | 122) {
                w.field(t, v);
            }
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        Some(out)
    }

    /// Moves what the last call wrote into `pending` to the history.
    fn keep(&mut self, from: usize) {
        if !self.keep_history {
            return;
        }
        let mut rest = &self.pending[from..];
        while let Ok(n) = split_frame(rest) {
            if n == 0 || n > rest.len() {
                break;
            }
            // Resent copies and gap fills keep the numbers of the originals.
            if !Message::parse(&rest[..n]).is_ok_and(|m| m.poss_dup()) {
                self.sent.push(rest[..n].to_vec());
            }
            rest = &rest[n..];
        }
    }

    fn resend(&mut self, m: &Message<'_>, now: u64) {
        let begin = m.uint(tag::BEGIN_SEQ_NO).unwrap_or(1).max(1);
        let end = match m.uint(tag::END_SEQ_NO).unwrap_or(0) {
            0 => self.sent.len() as u64,
            e => e.min(self.sent.len() as u64),
        };
        let mut seq = begin;
        while seq <= end {
            let frame = &self.sent[(seq - 1) as usize];
            let app = Message::parse(frame).is_ok_and(|f| matches!(f.msg_type(), b"8" | b"9"));
            if app {
                if let Some(copy) = SimVenue::poss_dup_copy(frame, now) {
                    self.pending.extend_from_slice(&copy);
                }
                seq += 1;
                continue;
            }
            // Session messages are not resent: one gap fill up to the next report.
            let mut next = seq + 1;
            while next <= end
                && !Message::parse(&self.sent[(next - 1) as usize])
                    .is_ok_and(|f| matches!(f.msg_type(), b"8" | b"9"))
            {
                next += 1;
            }
            let sender = m.get(tag::TARGET_COMP_ID).unwrap_or(b"VENUE");
            let target = m.get(tag::SENDER_COMP_ID).unwrap_or(b"GW");
            self.writer
                .start(b"4")
                .field(tag::SENDER_COMP_ID, sender)
                .field(tag::TARGET_COMP_ID, target)
                .uint(tag::MSG_SEQ_NUM, seq)
                .field(tag::POSS_DUP_FLAG, b"Y")
                .timestamp(tag::SENDING_TIME, now)
                .timestamp(tag::ORIG_SENDING_TIME, now)
                .field(tag::GAP_FILL_FLAG, b"Y")
                .uint(tag::NEW_SEQ_NO, next);
            self.writer.finish(&mut self.pending);
            seq = next;
        }
    }

    /// Messages sent and kept for resends (with `keep_history`).
    pub fn sent_len(&self) -> usize {
        self.sent.len()
    }

    /// NewOrderSingles received.
    pub fn orders(&self) -> u64 {
        self.orders
    }

    /// Frames that did not parse.
    pub fn malformed(&self) -> u64 {
        self.malformed
    }

    fn header(&mut self, ty: &[u8], m: &Message<'_>, now: u64) {
        let seq = self.next_out;
        self.next_out += 1;
        // Answer with the CompIDs swapped.
        let sender = m.get(tag::TARGET_COMP_ID).unwrap_or(b"VENUE");
        let target = m.get(tag::SENDER_COMP_ID).unwrap_or(b"GW");
        self.writer
            .start(ty)
            .field(tag::SENDER_COMP_ID, sender)
            .field(tag::TARGET_COMP_ID, target)
            .uint(tag::MSG_SEQ_NUM, seq)
            .timestamp(tag::SENDING_TIME, now);
    }

    #[allow(clippy::too_many_arguments)]
    fn exec(
        &mut self,
        m: &Message<'_>,
        exec_type: &[u8],
        ord_status: &[u8],
        last: u64,
        cum: u64,
        leaves: u64,
        px: &[u8],
        now: u64,
    ) {
        self.header(b"8", m, now);
        let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"0");
        let exec_id = self.next_exec;
        self.next_exec += 1;
        self.writer
            .field(tag::ORDER_ID, m.get(tag::ORIG_CL_ORD_ID).unwrap_or(cl))
            .uint(tag::EXEC_ID, exec_id)
            .field(tag::CL_ORD_ID, cl)
            .field(tag::EXEC_TYPE, exec_type)
            .field(tag::ORD_STATUS, ord_status)
            .field(tag::SYMBOL, m.get(tag::SYMBOL).unwrap_or(b"?"))
            .field(tag::SIDE, m.get(tag::SIDE).unwrap_or(b"1"))
            .uint(tag::LAST_QTY, last)
            .field(tag::LAST_PX, px)
            .uint(tag::CUM_QTY, cum)
            .uint(tag::LEAVES_QTY, leaves)
            .field(tag::AVG_PX, px);
        if let Some(orig) = m.get(tag::ORIG_CL_ORD_ID) {
            self.writer.field(tag::ORIG_CL_ORD_ID, orig);
        }
        self.writer.finish(&mut self.pending);
    }

    fn on_frame(&mut self, frame: &[u8], now: u64) {
        let Ok(m) = Message::parse(frame) else {
            self.malformed += 1;
            return;
        };
        let from = self.pending.len();
        if self.keep_history {
            self.note_received(&m);
        }
        if self.keep_history && m.msg_type() == b"A" && !m.poss_dup() {
            // FIX 4.4 Vol. 2 and QuickFIX: the Logon answer first, then any ResendRequest. A
            // gateway takes nothing before the Logon (it disconnects): a ResendRequest sent
            // first was lost with the connection, and once gap filled among the venue's
            // admin messages never asked again (simulator seeds 404219, 581703: a cancel
            // lost in a crash was never resent, and stayed unanswered for ever).
            self.answer(&m, now);
            self.in_sequence(&m, now);
        } else if !self.keep_history || self.in_sequence(&m, now) {
            self.answer(&m, now);
        }
        self.keep(from);
    }

    /// A skipped number arrived (resent, PossDupFlag=Y) or was gap filled: no longer asked
    /// for. A SequenceReset-Reset forgets every number below its NewSeqNo.
    fn note_received(&mut self, m: &Message<'_>) {
        let Some(seq) = m.seq() else {
            return;
        };
        self.missing.remove(&seq);
        if m.msg_type() == b"4" {
            let new = m.uint(tag::NEW_SEQ_NO).unwrap_or(0);
            if m.get(tag::GAP_FILL_FLAG) == Some(b"Y") {
                self.missing.retain(|&n| !(seq..new).contains(&n));
            } else {
                self.missing.retain(|&n| n >= new);
            }
        }
    }

    /// Sequence rules of a venue that keeps history: a jump in the gateway's numbers gets a
    /// ResendRequest for the missing ones; a resent order, cancel or replace it already
    /// had is not taken again. False: drop the message.
    fn in_sequence(&mut self, m: &Message<'_>, now: u64) -> bool {
        let seq = m.seq().unwrap_or(0);
        if m.poss_dup() {
            let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"");
            return match m.msg_type() {
                b"D" => !self.known.contains_key(cl),
                b"F" | b"G" => !self.changes.contains(cl),
                b"4" | b"2" | b"0" | b"1" | b"5" | b"A" => false,
                _ => true,
            };
        }
        let jump = self.next_in > 0 && seq > self.next_in;
        if jump {
            for n in self.next_in..seq {
                if self.missing.len() >= MAX_MISSING {
                    break;
                }
                self.missing.insert(n);
            }
        }
        // At a Logon: every number still missing, of this gap and of earlier ones.
        let ask = match (self.missing.first(), self.missing.last()) {
            (Some(&a), Some(&b)) if m.msg_type() == b"A" => Some((a, b)),
            _ if jump => Some((self.next_in, seq - 1)),
            _ => None,
        };
        if let Some((begin, end)) = ask {
            self.header(b"2", m, now);
            self.writer
                .uint(tag::BEGIN_SEQ_NO, begin)
                .uint(tag::END_SEQ_NO, end);
            self.writer.finish(&mut self.pending);
        }
        self.next_in = self.next_in.max(seq + 1);
        if matches!(m.msg_type(), b"F" | b"G") {
            let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"");
            self.changes.insert(cl.to_vec());
        }
        true
    }

    fn answer(&mut self, m: &Message<'_>, now: u64) {
        let m = *m;
        match m.msg_type() {
            b"2" if self.keep_history => self.resend(&m, now),
            b"H" if self.keep_history => {
                let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"0");
                // Every order this venue took was filled at once; one it never got is
                // rejected (OrdStatus 8) with nothing executed.
                match self.known.get(cl).cloned() {
                    Some((qty, px)) if self.resting.contains(cl) => {
                        self.exec(&m, b"I", b"0", 0, 0, qty, &px, now)
                    }
                    Some((_, px)) if self.canceled.contains(cl) => {
                        self.exec(&m, b"I", b"4", 0, 0, 0, &px, now)
                    }
                    Some((qty, px)) => self.exec(&m, b"I", b"2", 0, qty, 0, &px, now),
                    None => self.exec(&m, b"I", b"8", 0, 0, 0, b"0", now),
                }
            }
            b"A" => {
                // Sequence numbers last for the simulator's life, as a venue's last for the
                // day: a gateway that reconnects continues where it was.
                self.next_out = self.next_out.max(1);
                let hb = m.get(tag::HEART_BT_INT).unwrap_or(b"30");
                self.header(b"A", &m, now);
                self.writer
                    .uint(tag::ENCRYPT_METHOD, 0)
                    .field(tag::HEART_BT_INT, hb);
                self.writer.finish(&mut self.pending);
            }
            b"1" => {
                let id = m.get(tag::TEST_REQ_ID).unwrap_or(b"");
                self.header(b"0", &m, now);
                self.writer.field(tag::TEST_REQ_ID, id);
                self.writer.finish(&mut self.pending);
            }
            b"5" => {
                self.header(b"5", &m, now);
                self.writer.finish(&mut self.pending);
            }
            b"D" => {
                self.orders += 1;
                let qty = m.uint(tag::ORDER_QTY).unwrap_or(0);
                let px = m.get(tag::PRICE).unwrap_or(b"0");
                let mut rests = false;
                if self.keep_history {
                    let cl = m.get(tag::CL_ORD_ID).unwrap_or(b"0");
                    self.known.insert(cl.to_vec(), (qty, px.to_vec()));
                    rests = self.rest_above.is_some_and(|r| qty > r);
                    if rests {
                        self.resting.insert(cl.to_vec());
                    }
                }
                self.exec(&m, b"0", b"0", 0, 0, qty, px, now);
                if !rests {
                    self.exec(&m, b"F", b"2", qty, qty, 0, px, now);
                }
            }
            b"F" if self
                .resting
                .contains(m.get(tag::ORIG_CL_ORD_ID).unwrap_or(b"")) =>
            {
                let orig = m.get(tag::ORIG_CL_ORD_ID).unwrap_or(b"").to_vec();
                self.resting.remove(&orig);
                self.canceled.insert(orig);
                self.exec(&m, b"4", b"4", 0, 0, 0, b"0", now);
            }
            b"F" | b"G" if self.keep_history => {
                // Filled or canceled already: too late to cancel (FIX 4.4 OrderCancelReject,
                // CxlRejReason 0; replaces are not supported); an order it never had (1).
                let orig = m.get(tag::ORIG_CL_ORD_ID).unwrap_or(b"0");
                let (status, reason): (&[u8], &[u8]) = if self.canceled.contains(orig) {
                    (b"4", b"0")
                } else if self.known.contains_key(orig) {
                    (b"2", b"0")
                } else {
                    (b"8", b"1")
                };
                let to: &[u8] = if m.msg_type() == b"F" { b"1" } else { b"2" };
                self.header(b"9", &m, now);
                self.writer
                    .field(tag::ORDER_ID, orig)
                    .field(tag::CL_ORD_ID, m.get(tag::CL_ORD_ID).unwrap_or(b"0"))
                    .field(tag::ORIG_CL_ORD_ID, orig)
                    .field(tag::ORD_STATUS, status)
                    .field(tag::CXL_REJ_RESPONSE_TO, to)
                    .field(102, reason);
                self.writer.finish(&mut self.pending);
            }
            b"F" => self.exec(&m, b"4", b"4", 0, 0, 0, b"0", now),
            b"G" => {
                let qty = m.uint(tag::ORDER_QTY).unwrap_or(0);
                let px = m.get(tag::PRICE).unwrap_or(b"0");
                self.exec(&m, b"5", b"0", 0, 0, qty, px, now);
            }
            _ => {}
        }
    }
}

impl VenueLink for SimVenue {
    fn open(&mut self, _now: rocebus::clock::Mono) -> io::Result<()> {
        self.open = true;
        self.pending.clear();
        self.read_at = 0;
        Ok(())
    }

    fn close(&mut self) {
        self.open = false;
    }

    fn is_open(&self) -> bool {
        self.open
    }

    fn read(&mut self, buf: &mut [u8], _wait: Duration) -> LinkRead {
        if !self.open {
            return LinkRead::Closed;
        }
        let avail = &self.pending[self.read_at..];
        if avail.is_empty() {
            return LinkRead::Idle;
        }
        let n = avail.len().min(buf.len());
        buf[..n].copy_from_slice(&avail[..n]);
        self.read_at += n;
        if self.read_at == self.pending.len() {
            self.pending.clear();
            self.read_at = 0;
        }
        LinkRead::Data(n)
    }

    fn write_all(&mut self, mut bytes: &[u8], _now: rocebus::clock::Mono) -> io::Result<()> {
        if !self.open {
            return Err(io::ErrorKind::NotConnected.into());
        }
        let now = self.now.unwrap_or_else(unix_nanos);
        // The gateway writes whole frames; anything else is counted and dropped.
        while !bytes.is_empty() {
            match split_frame(bytes) {
                Ok(n) => {
                    self.on_frame(&bytes[..n], now);
                    bytes = &bytes[n..];
                }
                Err(_) => {
                    self.malformed += 1;
                    break;
                }
            }
        }
        Ok(())
    }

    fn describe(&self) -> String {
        "in-process venue simulator".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::FixDriver;
    use crate::journal::FsyncPolicy;
    use crate::proto::{msg_type, NewOrder, Response, Side, Symbol, TimeInForce, PRICE_SCALE};
    use zerocopy::IntoBytes;

    #[test]
    fn gateway_logs_on_and_orders_are_acked_and_filled() {
        let risk: crate::risk::RiskConfig = toml::from_str(
            r#"
            reference_max_age_ms = 60000
            throttle_interval_ms = 1000
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 100000000
            max_position = 100000
            max_open_orders = 100
            max_orders_per_interval = 1000
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#,
        )
        .unwrap();
        let session = crate::fix::SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        };
        let path = std::env::temp_dir().join(format!("gw-sim-{}.journal", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let mut d =
            FixDriver::with_link(SimVenue::new(), session, &risk, &path, FsyncPolicy::Never)
                .unwrap();
        let aapl = Symbol::new("AAPL").unwrap();
        d.stage(|gw, _| gw.on_reference_price(aapl, 100 * PRICE_SCALE, unix_nanos()));
        d.connect().unwrap();
        let mut got = Vec::new();
        d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
        assert_eq!(
            d.gateway().session().state(),
            crate::fix::SessionState::Active
        );
        for i in 1..=3u64 {
            let m = NewOrder::new(
                i,
                7,
                aapl,
                Side::Buy,
                10,
                100 * PRICE_SCALE,
                TimeInForce::Day,
            );
            d.stage_engine_message(1, m.as_bytes(), rocebus::clock::Wall::now());
        }
        d.flush_with(|_, _| {}).unwrap();
        d.poll_with(rocebus::clock::Now::read(), |e, r: &Response| {
            got.push((e, r.as_bytes()[0], r.cl_ord_id()))
        })
        .unwrap();
        assert_eq!(
            got,
            [
                (1, msg_type::ACK, 1),
                (1, msg_type::FILL, 1),
                (1, msg_type::ACK, 2),
                (1, msg_type::FILL, 2),
                (1, msg_type::ACK, 3),
                (1, msg_type::FILL, 3)
            ]
        );
        assert_eq!(d.link().orders(), 3);
        assert_eq!(d.link().malformed(), 0);
        assert_eq!(d.gateway().risk().position(7, aapl), 30);
        assert_eq!(d.gateway().counters(), Default::default());
        let _ = std::fs::remove_file(&path);
    }

    /// The core's cut-off of an engine that sends too many malformed frames reaches the
    /// driver's caller, once.
    #[test]
    fn an_engine_cut_off_for_malformed_frames_is_handed_to_the_transport() {
        let risk: crate::risk::RiskConfig = toml::from_str(
            r#"
            reference_max_age_ms = 60000
            throttle_interval_ms = 1000
            max_malformed_frames = 2
            [[accounts]]
            id = 7
            max_order_qty = 1000
            max_order_notional = 1000000
            credit_limit = 100000000
            max_position = 100000
            max_open_orders = 100
            max_orders_per_interval = 1000
            collar_bps = 500
            [[engines]]
            id = 1
            accounts = [7]
            token = "e1"
            "#,
        )
        .unwrap();
        let session = crate::fix::SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d =
            FixDriver::with_link(SimVenue::new(), session, &risk, &path, FsyncPolicy::Never)
                .unwrap();
        for _ in 0..5 {
            d.stage_engine_message(1, &[1, 2, 3], rocebus::clock::Wall::now());
            d.flush_with(|_, _| {}).unwrap();
        }
        assert_eq!(d.pop_kicked(), Some(1));
        assert_eq!(d.pop_kicked(), None);
        assert_eq!(d.gateway().counters().frames_after_cutoff, 3);
    }
}
