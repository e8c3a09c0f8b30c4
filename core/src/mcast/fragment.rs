//! Reassembly of large messages from their fragments (see
//! [`super::wire`]'s "Fragment datagrams").
//!
//! The subscriber hands the [`Reassembler`] fragments strictly in sequence
//! order (after arbitration and recovery), so reassembly is a copy into one
//! buffer allocated at construction: a fragment either continues the message
//! under way at exactly the next offset and sequence, or starts a new message
//! at offset 0. Anything else (a forged or stray fragment, a message larger
//! than the buffer, a total that changes mid-message, a fragment after a
//! hole the subscriber skipped) is dropped and counted, and never written
//! out of bounds.

use super::wire::Fragment;

/// What [`Reassembler::push`] did with a fragment.
#[derive(Debug, PartialEq, Eq)]
pub enum Push<'a> {
    /// Taken; the message is not complete yet.
    Partial,
    /// The message is complete: its bytes, valid until the next push.
    Complete(&'a [u8]),
    /// Dropped (counted); a message under way, if any, was abandoned.
    Dropped(DropReason),
}

/// Why a fragment was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The message is larger than the reassembly buffer (`max_message_bytes`).
    TooLarge,
    /// Not the continuation of the message under way (offset, sequence or
    /// total length differ), or a continuation with no message under way.
    OutOfPlace,
}

/// Reassembly counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReassemblyCounters {
    /// Large messages completed.
    pub messages: u64,
    /// Fragments taken into a message.
    pub fragments: u64,
    /// Fragments dropped as larger than the buffer.
    pub too_large: u64,
    /// Fragments dropped as out of place.
    pub out_of_place: u64,
    /// Messages under way abandoned (a new start or a bad fragment came in
    /// the middle, or the subscriber skipped a hole).
    pub abandoned: u64,
}

/// Reassembles large messages into a buffer allocated once.
#[derive(Debug)]
pub struct Reassembler {
    buf: Box<[u8]>,
    /// A message is under way.
    active: bool,
    total: usize,
    filled: usize,
    /// Sequence the next fragment of the message under way must have.
    next_seq: u64,
    counters: ReassemblyCounters,
}

impl Reassembler {
    /// A reassembler for messages of up to `max_message_bytes` (0: every
    /// fragment is dropped as too large).
    pub fn new(max_message_bytes: usize) -> Self {
        Reassembler {
            buf: super::prefaulted(max_message_bytes),
            active: false,
            total: 0,
            filled: 0,
            next_seq: 0,
            counters: ReassemblyCounters::default(),
        }
    }

    /// Largest message it can reassemble.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Counters.
    pub fn counters(&self) -> ReassemblyCounters {
        self.counters
    }

    /// A message is under way.
    pub fn in_progress(&self) -> bool {
        self.active
    }

    /// Forgets the message under way (the subscriber skipped a hole or
    /// restored a snapshot). Returns whether there was one.
    pub fn abandon(&mut self) -> bool {
        let was = self.active;
        if was {
            self.counters.abandoned += 1;
        }
        self.active = false;
        was
    }

    /// The next fragment in sequence order.
    pub fn push(&mut self, f: Fragment<'_>) -> Push<'_> {
        let total = f.total_len as usize;
        let offset = f.offset as usize;
        if offset == 0 {
            self.abandon();
            if total > self.buf.len() {
                self.counters.too_large += 1;
                return Push::Dropped(DropReason::TooLarge);
            }
            self.active = true;
            self.total = total;
            self.filled = 0;
        } else if !self.active
            || f.seq != self.next_seq
            || offset != self.filled
            || total != self.total
        {
            self.abandon();
            self.counters.out_of_place += 1;
            return Push::Dropped(DropReason::OutOfPlace);
        }
        // Wire::parse checked offset + len <= total, and total <= buf.len()
        // was checked at the start; get_mut keeps a broken caller from
        // panicking all the same.
        let end = self.filled + f.bytes.len();
        let Some(dst) = self.buf.get_mut(self.filled..end.min(self.total)) else {
            self.abandon();
            self.counters.out_of_place += 1;
            return Push::Dropped(DropReason::OutOfPlace);
        };
        if dst.len() != f.bytes.len() {
            self.abandon();
            self.counters.out_of_place += 1;
            return Push::Dropped(DropReason::OutOfPlace);
        }
        dst.copy_from_slice(f.bytes);
        self.filled = end;
        self.next_seq = f.seq.wrapping_add(1);
        self.counters.fragments += 1;
        if self.filled == self.total {
            self.active = false;
            self.counters.messages += 1;
            Push::Complete(&self.buf[..self.total])
        } else {
            Push::Partial
        }
    }
}

/// Number of fragments a message of `len` bytes takes with `chunk` bytes of
/// message per fragment (`chunk > 0`).
pub fn fragments_for(len: usize, chunk: usize) -> usize {
    len.div_ceil(chunk.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(seq: u64, total: u32, offset: u32, bytes: &[u8]) -> Fragment<'_> {
        Fragment {
            seq,
            total_len: total,
            offset,
            bytes,
        }
    }

    #[test]
    fn reassembles_in_order_and_reuses_the_buffer() {
        let mut r = Reassembler::new(10);
        assert_eq!(r.push(frag(5, 10, 0, b"0123")), Push::Partial);
        assert_eq!(r.push(frag(6, 10, 4, b"4567")), Push::Partial);
        assert_eq!(r.push(frag(7, 10, 8, b"89")), Push::Complete(b"0123456789"));
        assert!(!r.in_progress());
        assert_eq!(r.push(frag(8, 3, 0, b"abc")), Push::Complete(b"abc"));
        let c = r.counters();
        assert_eq!((c.messages, c.fragments, c.abandoned), (2, 4, 0));
    }

    #[test]
    fn out_of_place_fragments_are_dropped_and_abandon_the_message() {
        let mut r = Reassembler::new(16);
        // A continuation with nothing under way.
        assert_eq!(
            r.push(frag(1, 8, 4, b"xxxx")),
            Push::Dropped(DropReason::OutOfPlace)
        );
        // Wrong offset, wrong sequence, changed total: each abandons.
        for bad in [
            frag(3, 8, 5, b"xxx"),
            frag(4, 8, 4, b"xxxx"),
            frag(3, 9, 4, b"xxxx"),
        ] {
            assert_eq!(r.push(frag(2, 8, 0, b"abcd")), Push::Partial);
            assert_eq!(r.push(bad), Push::Dropped(DropReason::OutOfPlace));
            assert!(!r.in_progress());
        }
        // A new start in the middle abandons the old message.
        assert_eq!(r.push(frag(2, 8, 0, b"abcd")), Push::Partial);
        assert_eq!(r.push(frag(3, 4, 0, b"wxyz")), Push::Complete(b"wxyz"));
        let c = r.counters();
        assert_eq!((c.out_of_place, c.abandoned, c.messages), (4, 4, 1));
    }

    #[test]
    fn too_large_and_overrunning_fragments_never_write_out_of_bounds() {
        let mut r = Reassembler::new(8);
        assert_eq!(
            r.push(frag(1, 9, 0, b"a")),
            Push::Dropped(DropReason::TooLarge)
        );
        // A caller that skipped wire validation: bytes past the total.
        assert_eq!(r.push(frag(1, 4, 0, b"abc")), Push::Partial);
        assert_eq!(
            r.push(frag(2, 4, 3, b"defgh")),
            Push::Dropped(DropReason::OutOfPlace)
        );
        assert_eq!(
            r.push(frag(3, 8, 0, b"0123456789")),
            Push::Dropped(DropReason::OutOfPlace)
        );
        let mut none = Reassembler::new(0);
        assert_eq!(
            none.push(frag(1, 1, 0, b"a")),
            Push::Dropped(DropReason::TooLarge)
        );
    }

    #[test]
    fn abandon_reports_a_message_under_way() {
        let mut r = Reassembler::new(8);
        assert!(!r.abandon());
        assert_eq!(r.push(frag(1, 8, 0, b"abcd")), Push::Partial);
        assert!(r.abandon());
        assert_eq!(
            r.push(frag(2, 8, 4, b"efgh")),
            Push::Dropped(DropReason::OutOfPlace)
        );
        assert_eq!(fragments_for(10, 4), 3);
        assert_eq!(fragments_for(8, 4), 2);
    }
}
