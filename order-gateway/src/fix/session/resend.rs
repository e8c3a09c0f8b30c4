//! ResendRequests both ways: asking for a gap, serving a range from the bounded store of
//! what we sent (PossDupFlag=Y), SequenceReset-GapFill over the rest.

use super::*;

/// Application messages kept for resends: the last this many sequence numbers.
pub const RESEND_SLOTS: usize = 1 << 14;
/// Largest message kept for resends (a NewOrderSingle is about 200 bytes).
pub const RESEND_SLOT_LEN: usize = 512;

/// Raw application messages we sent, for resends: a ring of fixed slots indexed by sequence
/// number, allocated once (8 MiB), so storing costs one copy and no allocation.
pub(super) struct SentStore {
    pub(super) bytes: Box<[u8]>,
    /// Per slot: the sequence number held (0: none) and the message length.
    pub(super) slots: Box<[(u64, u16)]>,
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
    pub(super) fn slot(seq: u64) -> usize {
        (seq % RESEND_SLOTS as u64) as usize
    }

    /// Keeps `raw` as message `seq`, replacing whatever held its slot; a message longer than
    /// a slot is not kept (a resend request for it is gap-filled).
    pub(super) fn push(&mut self, seq: u64, raw: &[u8]) -> bool {
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
    pub(super) fn get(&self, seq: u64) -> Option<&[u8]> {
        let i = Self::slot(seq);
        let (held, len) = self.slots[i];
        (held == seq && seq != 0).then(|| &self.bytes[i * RESEND_SLOT_LEN..][..usize::from(len)])
    }
}

const _: () = assert!(RESEND_SLOT_LEN <= u16::MAX as usize);

impl Session {
    /// Sets how long an unanswered ResendRequest waits before it is sent again (default: the
    /// heartbeat interval).
    pub fn set_resend_timeout(&mut self, nanos: u64) {
        self.resend_timeout = Some(nanos.max(1));
    }

    pub(super) fn resend_timeout(&self) -> u64 {
        self.resend_timeout
            .unwrap_or(match self.cfg.resend_timeout_ms {
                0 => u64::from(self.cfg.heartbeat_secs.max(1)) * 1_000_000_000,
                ms => u64::from(ms) * 1_000_000,
            })
    }

    /// True while a ResendRequest of ours is outstanding.
    pub fn resend_pending(&self) -> bool {
        self.resend_until.is_some()
    }

    /// The application message we sent as number `seq`, if still held for resends.
    pub fn sent_message(&self, seq: u64) -> Option<&[u8]> {
        self.store.get(seq)
    }

    /// `next_in` moved: an outstanding resend is being answered (or is complete).
    pub(super) fn resend_progress(&mut self) {
        if self.resend_until.is_some_and(|u| self.next_in > u) {
            self.resend_until = None;
        }
        self.answered_reset = false;
    }

    /// Asks for everything from `next_in` on (EndSeqNo 0 = infinity in FIX 4.2+), satisfied
    /// once message `upto` has been processed.
    pub(super) fn request_resend(&mut self, upto: u64, now: u64, out: &mut Vec<u8>) {
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

    pub(super) fn serve_resend(&mut self, m: &Message<'_>, now: u64, out: &mut Vec<u8>) {
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
    pub(super) fn serve_range(&mut self, begin: u64, end: u64, now: u64, out: &mut Vec<u8>) {
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

    pub(super) fn gap_fill(&mut self, seq: u64, new_seq: u64, now: u64, out: &mut Vec<u8>) {
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
    pub(super) fn resend_one(&mut self, seq: u64, now: u64, out: &mut Vec<u8>) {
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
