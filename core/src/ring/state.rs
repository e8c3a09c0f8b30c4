//! Position and credit accounting of the ring, free of I/O: the sender's
//! claim/commit/flush bookkeeping and the receiver's consumption and credit
//! decisions. Positions are byte counts since the connection began (u64:
//! they never wrap in practice); the ring offset is `pos & (size - 1)`.

use super::frame::{frame_len, HEADER_LEN};

/// Where a claimed frame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimPos {
    /// A padding frame to write first at this offset, of this many bytes,
    /// when the frame does not fit before the ring's end.
    pub padding: Option<(usize, usize)>,
    /// Ring offset of the frame header.
    pub offset: usize,
    /// Total ring bytes of the frame.
    pub total: usize,
}

/// Why a claim is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimRefused {
    /// Not enough credit: the receiver has not consumed enough yet.
    BackPressured,
    /// Larger than the connection's maximum payload.
    TooLarge,
    /// A message type reserved for rocebus itself (0xFF00 and up).
    ReservedType,
}

/// A credit word the sender refused ([`SenderState::on_credit`]).
///
/// An honest receiver writes its consumer position, which only grows and
/// never passes what it was sent: every value it ever wrote was at most
/// what the sender had flushed by then, and that only grows too. So
/// [`BeyondSent`](Self::BeyondSent) is never an honest value, whatever the
/// placement order: the peer forged it (or its memory is corrupt), a
/// protocol violation. [`Behind`](Self::Behind) is impossible too with RC's
/// in-order placement, but a device that re-places a duplicate WRITE after
/// a retransmission could show an older credit for a moment, so it is only
/// refused and counted, never a reason to close.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadCredit {
    /// Behind the credit already taken.
    #[error("credit {got} behind the credit already taken ({credit})")]
    Behind {
        /// The credit taken before.
        credit: u64,
        /// The value read.
        got: u64,
    },
    /// Beyond what was ever handed to the device: the peer claims to have
    /// consumed bytes it was never sent.
    #[error("credit {got} beyond the {flushed} bytes ever sent")]
    BeyondSent {
        /// Bytes handed to the device so far.
        flushed: u64,
        /// The value read.
        got: u64,
    },
}

/// The sender's view of the remote ring.
#[derive(Debug, Clone)]
pub struct SenderState {
    size: usize,
    max_payload: usize,
    /// Next free position.
    tail: u64,
    /// Position up to which frames were handed to the device.
    flushed: u64,
    /// Remote consumer position, from its credit writes.
    credit: u64,
    /// Sequence of the next frame.
    next_seq: u64,
    /// The end of `tail`'s lap of the ring (`tail` rounded up to the next
    /// multiple of the size, a whole lap when `tail` is on a boundary),
    /// kept so the usual claim is two compares.
    lap_end: u64,
    /// How far the receiver's credit lets us write: `credit + size`.
    credit_end: u64,
}

impl SenderState {
    /// A fresh ring of `size` bytes (power of two).
    pub fn new(size: usize, max_payload: usize) -> Self {
        assert!(size.is_power_of_two() && size >= 4 * frame_len(max_payload));
        Self {
            size,
            max_payload,
            tail: 0,
            flushed: 0,
            credit: 0,
            next_seq: 1,
            lap_end: size as u64,
            credit_end: size as u64,
        }
    }
    /// Ring size.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Largest payload.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }
    /// The next sequence.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }
    /// Next free position.
    pub fn tail(&self) -> u64 {
        self.tail
    }
    /// Bytes claimed but not yet flushed.
    pub fn unflushed(&self) -> u64 {
        self.tail - self.flushed
    }
    /// Bytes the receiver has not yet given back.
    pub fn in_flight(&self) -> u64 {
        self.tail - self.credit
    }

    /// Position up to which frames were handed to the device.
    pub fn flushed(&self) -> u64 {
        self.flushed
    }
    /// The receiver's consumer position, as its last credit said.
    pub fn credit(&self) -> u64 {
        self.credit
    }

    /// Takes a credit update (the receiver's consumer position). An
    /// impossible value is refused and changes nothing: one behind the
    /// credit already taken, or one beyond what was handed to the device
    /// ([`BadCredit`]).
    pub fn on_credit(&mut self, consumed: u64) -> Result<(), BadCredit> {
        if consumed < self.credit {
            return Err(BadCredit::Behind {
                credit: self.credit,
                got: consumed,
            });
        }
        if consumed > self.flushed {
            return Err(BadCredit::BeyondSent {
                flushed: self.flushed,
                got: consumed,
            });
        }
        self.credit = consumed;
        self.credit_end = consumed + self.size as u64;
        Ok(())
    }

    /// Reserves room for a frame of `len` payload bytes.
    pub fn claim(&self, len: usize) -> Result<ClaimPos, ClaimRefused> {
        if len > self.max_payload {
            return Err(ClaimRefused::TooLarge);
        }
        let total = frame_len(len);
        let off = (self.tail as usize) & (self.size - 1);
        let to_end = self.size - off;
        let (padding, offset, need) = if total > to_end {
            (Some((off, to_end)), 0, to_end + total)
        } else {
            (None, off, total)
        };
        if self.in_flight() + need as u64 > self.size as u64 {
            return Err(ClaimRefused::BackPressured);
        }
        Ok(ClaimPos {
            padding,
            offset,
            total,
        })
    }

    /// The usual claim: a frame of `len` payload bytes (at most the
    /// maximum) that fits before the ring's end and within the credit.
    /// Returns its ring offset and total bytes; `None` means
    /// [`claim`](Self::claim) decides (padding first, back-pressure, too
    /// large).
    #[inline]
    pub fn claim_fast(&self, len: usize) -> Option<(usize, usize)> {
        if len > self.max_payload {
            return None;
        }
        self.claim_fast_fitting(len)
    }

    /// [`claim_fast`](Self::claim_fast) of a `len` the caller already
    /// knows to be at most the maximum payload: two compares.
    #[inline]
    pub(super) fn claim_fast_fitting(&self, len: usize) -> Option<(usize, usize)> {
        debug_assert!(len <= self.max_payload);
        let total = frame_len(len);
        // The end of the frame may reach, but not pass, the end of this
        // lap of the ring and the credit's limit: no padding needed, no
        // frame overwritten.
        let end = self.tail + total as u64;
        (end <= self.lap_end && end <= self.credit_end)
            .then_some(((self.tail as usize) & (self.size - 1), total))
    }

    /// Commits a claim of [`claim_fast`](Self::claim_fast) of `total` bytes
    /// (with no other change in between); returns its sequence.
    #[inline]
    pub fn commit_fast(&mut self, total: usize) -> u64 {
        self.tail += total as u64;
        // The frame ended at or before the lap's end: on it, the next lap
        // is a whole one.
        if self.tail == self.lap_end {
            self.lap_end += self.size as u64;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// [`commit_fast`](Self::commit_fast) of a frame that is also the
    /// whole of the next flush (nothing else was unflushed: the caller
    /// checked [`unflushed`](Self::unflushed) is zero): marks it flushed
    /// too. Returns its sequence.
    #[inline]
    pub fn commit_flushed(&mut self, total: usize) -> u64 {
        debug_assert_eq!(self.unflushed(), 0);
        let seq = self.commit_fast(total);
        self.flushed = self.tail;
        seq
    }

    /// Commits a claim made by [`claim`](Self::claim) (with no other
    /// change in between); returns the sequences used (padding first).
    pub fn commit(&mut self, pos: &ClaimPos) -> u64 {
        if let Some((_, pad)) = pos.padding {
            self.tail += pad as u64;
            self.next_seq += 1;
        }
        self.tail += pos.total as u64;
        self.lap_end = (self.tail | (self.size as u64 - 1)) + 1;
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    /// The usual flush: everything unflushed as one run `(offset, len)` of
    /// at most `max` bytes that does not wrap, marked flushed; `None` (and
    /// nothing marked) when it is empty, wraps or is longer, for
    /// [`take_flush`](Self::take_flush).
    #[inline]
    pub fn take_run(&mut self, max: usize) -> Option<(usize, usize)> {
        let len = (self.tail - self.flushed) as usize;
        let off = (self.flushed as usize) & (self.size - 1);
        if len == 0 || len > max || len > self.size - off {
            return None;
        }
        self.flushed = self.tail;
        Some((off, len))
    }

    /// The byte ranges `(offset, len)` to write for everything unflushed
    /// (two when it wraps) and how many there are; marks them flushed.
    pub fn take_flush(&mut self) -> ([(usize, usize); 2], usize) {
        // What is unflushed never exceeds the ring (it is within what is
        // in flight), so it is one run, or two when it wraps.
        let len = (self.tail - self.flushed) as usize;
        let off = (self.flushed as usize) & (self.size - 1);
        self.flushed = self.tail;
        let first = len.min(self.size - off);
        match (len, first == len) {
            (0, _) => ([(0, 0); 2], 0),
            (_, true) => ([(off, len), (0, 0)], 1),
            (_, false) => ([(off, first), (0, len - first)], 2),
        }
    }
}

/// The receiver's view of its own ring.
#[derive(Debug, Clone)]
pub struct ReceiverState {
    size: usize,
    /// `size - 1`: the ring offset of a position is `pos & mask`.
    mask: usize,
    max_payload: usize,
    consumed: u64,
    expected_seq: u64,
    credit_sent: u64,
    credit_every: u64,
    idle_polls: u32,
    /// The consumer position the current run of empty polls started at
    /// (a delivery moves `consumed`, which restarts the count).
    idle_since: u64,
}

/// Consecutive empty polls after which unreported consumption is credited.
///
/// Only [`crate::orders::Connection::drain`] ever waits for this credit (see
/// [`ReceiverState::credit_due`]), so it is long: thousands of polls are tens of
/// microseconds on hardware, well beyond a round trip. At 64 a ping-pong whose
/// round trip outlasted 64 polls sent a credit WRITE per message, which competed
/// with the next message on the wire and in the NIC (measured with `rc-latency`).
pub const IDLE_CREDIT_POLLS: u32 = 4096;

impl ReceiverState {
    /// A fresh ring of `size` bytes; credits are returned every
    /// `credit_every` consumed bytes (and when idle).
    pub fn new(size: usize, max_payload: usize, credit_every: usize) -> Self {
        assert!(size.is_power_of_two());
        Self {
            size,
            mask: size - 1,
            max_payload,
            consumed: 0,
            expected_seq: 1,
            credit_sent: 0,
            credit_every: credit_every.clamp(HEADER_LEN, size / 2) as u64,
            idle_polls: 0,
            idle_since: 0,
        }
    }
    /// Ring size.
    pub fn size(&self) -> usize {
        self.size
    }
    /// Largest payload accepted.
    pub fn max_payload(&self) -> usize {
        self.max_payload
    }
    /// Consumer position.
    pub fn consumed(&self) -> u64 {
        self.consumed
    }
    /// Next expected sequence.
    pub fn expected_seq(&self) -> u64 {
        self.expected_seq
    }

    /// Ring offset of the consumer position.
    #[inline]
    pub fn offset(&self) -> usize {
        (self.consumed as usize) & self.mask
    }

    /// Records a consumed frame of `total` bytes.
    #[inline]
    pub fn advance(&mut self, total: usize) {
        self.consumed += total as u64;
        self.expected_seq += 1;
    }

    /// Records the outcome of one poll (frames delivered) and says whether
    /// a credit write is due: every `credit_every` bytes, or once the ring
    /// has been idle for [`IDLE_CREDIT_POLLS`] polls with anything
    /// unreported. Not on every idle poll: in a ping-pong that would add a
    /// WRITE (and a doorbell) per message, and a sender with credit lagging
    /// by less than `credit_every` (a quarter ring) still has room for any
    /// frame (at most a quarter ring), so only `drain` ever waits for it.
    ///
    /// A poll that delivered only compares the unreported bytes with
    /// `credit_every`; the idle count is kept by the empty polls alone
    /// (they notice a delivery by the consumer position having moved).
    #[inline]
    pub fn credit_due(&mut self, delivered: usize) -> Option<u64> {
        if delivered > 0 {
            return (self.consumed - self.credit_sent >= self.credit_every)
                .then_some(self.consumed);
        }
        if self.consumed != self.idle_since {
            self.idle_since = self.consumed;
            self.idle_polls = 0;
        }
        self.idle_polls = self.idle_polls.saturating_add(1);
        let unreported = self.consumed - self.credit_sent;
        let idle = self.idle_polls >= IDLE_CREDIT_POLLS;
        (unreported >= self.credit_every || (idle && unreported > 0)).then_some(self.consumed)
    }

    /// Records that a credit for `consumed` was sent.
    pub fn credit_sent(&mut self, consumed: u64) {
        self.credit_sent = consumed;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sender_wraps_with_padding_and_respects_credit() {
        let mut s = SenderState::new(1024, 200);
        // 4 frames of 200 bytes (224 total each with header and trailer) = 896 bytes.
        for i in 0..4 {
            let c = s.claim(200).unwrap();
            assert_eq!(c.padding, None);
            assert_eq!(c.offset, i * 224);
            assert_eq!(s.commit(&c), i as u64 + 1);
        }
        // Next frame does not fit before the end (128 left): padding + wrap,
        // but no credit yet -> back-pressured.
        assert_eq!(s.claim(200), Err(ClaimRefused::BackPressured));
        let (r, n) = s.take_flush();
        assert_eq!((n, r[0]), (1, (0, 896)));
        assert_eq!(s.on_credit(448), Ok(()));
        let c = s.claim(200).unwrap();
        assert_eq!(c.padding, Some((896, 128)));
        assert_eq!(c.offset, 0);
        assert_eq!(s.commit(&c), 6); // padding took seq 5
        let (r, n) = s.take_flush();
        assert_eq!((n, r[0], r[1]), (2, (896, 128), (0, 224)));
        assert_eq!(s.claim(201), Err(ClaimRefused::TooLarge));
        // Impossible credits are refused and change nothing; the same
        // credit again is no news, and no fault.
        assert_eq!(
            s.on_credit(100),
            Err(BadCredit::Behind {
                credit: 448,
                got: 100
            })
        );
        assert_eq!(
            s.on_credit(5000),
            Err(BadCredit::BeyondSent {
                flushed: 1248,
                got: 5000
            })
        );
        assert_eq!(s.credit(), 448);
        assert_eq!(s.on_credit(448), Ok(()));
    }

    #[test]
    fn fast_claim_and_run_agree_with_the_general_ones() {
        // Every claim_fast answer is claim's when claim needs no padding,
        // and None exactly when it needs padding or is refused; take_run
        // is take_flush's single unwrapped run.
        let mut s = SenderState::new(1024, 200);
        let mut x = 12345u64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 230) as usize;
            let fast = s.claim_fast(len);
            match s.claim(len) {
                Ok(c) if c.padding.is_none() => {
                    assert_eq!(fast, Some((c.offset, c.total)));
                    assert_eq!(s.clone().commit_fast(c.total), s.clone().commit(&c));
                    s.commit_fast(c.total);
                }
                Ok(c) => {
                    assert_eq!(fast, None);
                    s.commit(&c);
                }
                Err(_) => assert_eq!(fast, None),
            }
            if x % 3 == 0 {
                let mut t = s.clone();
                let general = t.take_flush();
                match s.take_run(if x % 2 == 0 { 300 } else { usize::MAX }) {
                    Some(r) => assert_eq!(general, ([r, (0, 0)], 1)),
                    None => assert!(general.1 != 1 || general.0[0].1 > 300, "{general:?}"),
                }
                // Whatever was not taken as one run is flushed as runs.
                s.take_flush();
            }
            if x % 5 == 0 {
                let f = s.flushed;
                assert_eq!(s.on_credit(f), Ok(()));
            }
        }
    }

    #[test]
    fn receiver_checks_producer_and_batches_credit() {
        let mut r = ReceiverState::new(1024, 200, 256);
        r.advance(224);
        assert_eq!(r.credit_due(1), None);
        for _ in 1..IDLE_CREDIT_POLLS {
            assert_eq!(r.credit_due(0), None);
        }
        assert_eq!(r.credit_due(0), Some(224));
        r.advance(224);
        assert_eq!(r.credit_due(1), Some(448));
        r.credit_sent(448);
        assert_eq!(r.credit_due(0), None);
        assert_eq!(r.offset(), 448);
        assert_eq!(r.expected_seq(), 3);
    }
}
