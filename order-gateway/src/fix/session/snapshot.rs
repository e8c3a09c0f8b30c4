//! The session's state in a checkpoint, and rebuilt from the journal's frames.

use super::*;

impl Session {
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

    /// Recovery: a frame (or several) we sent before the restart.
    ///
    /// A Logon with 141=Y is either our answer to the venue's reset Logon (journaled right
    /// after it, which already restarted both directions: `answered_reset` with nothing
    /// sent since, `next_out` 1) or our own reset (`reset_on_logon`), which restarts both
    /// directions here as [`on_connect`](Self::on_connect) did live.
    pub fn replay_outbound(&mut self, frames: &[u8]) {
        let mut rest = frames;
        while let Ok(n) = crate::fix::split_frame(rest) {
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
}
