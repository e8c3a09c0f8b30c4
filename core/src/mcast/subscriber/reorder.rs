//! The out-of-order buffer: datagrams that arrived ahead of the delivery
//! point, kept sorted by sequence in slots allocated once, and the holes
//! between them ([`Holes`], the view the loss detector and gap-tolerant
//! delivery read). It stores and hands back bytes; it decides nothing about
//! what a datagram means (that is [`arbitration`](super::arbitration)'s and
//! the composing [`SubscriberState`]'s).
//!
//! [`SubscriberState`]: super::SubscriberState

use std::collections::VecDeque;

/// Where a buffered datagram's bytes are and what it covers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Buffered {
    /// Its first sequence.
    pub(super) first: u64,
    /// One past its last sequence.
    pub(super) end: u64,
    slot: u32,
    len: u32,
}

/// Where a datagram `[first, end)` ahead of the delivery point would go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Place {
    /// A datagram with the same first sequence is held: a copy.
    Held,
    /// It overlaps a held datagram with other boundaries: same session,
    /// but not our publisher's datagram.
    Overlaps,
    /// Nothing held covers any of it.
    Open,
}

/// Datagrams held out of order, sorted by sequence, never overlapping.
#[derive(Debug)]
pub(super) struct ReorderBuffer {
    max_datagram: usize,
    slots: Box<[u8]>,
    free: Vec<u32>,
    order: VecDeque<Buffered>,
}

impl ReorderBuffer {
    /// Allocates `max_buffered` slots of `max_datagram` bytes, every page
    /// faulted in (both at most `u32::MAX`).
    pub(super) fn new(max_buffered: usize, max_datagram: usize) -> Self {
        Self {
            max_datagram,
            slots: crate::mcast::prefaulted(max_buffered * max_datagram),
            // Slots are handed out from the end: lowest slot first.
            free: (0..max_buffered as u32).rev().collect(),
            order: VecDeque::with_capacity(max_buffered),
        }
    }

    /// Datagrams held.
    #[inline]
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }

    /// Nothing held (the latency path's condition).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Every slot is in use.
    pub(super) fn is_full(&self) -> bool {
        self.free.is_empty()
    }

    /// The first sequence of the lowest datagram held.
    pub(super) fn first(&self) -> Option<u64> {
        self.order.front().map(|b| b.first)
    }

    /// One past the last sequence of the highest datagram held.
    pub(super) fn end(&self) -> Option<u64> {
        self.order.back().map(|b| b.end)
    }

    /// What `[first, end)` would be to what is held.
    pub(super) fn place(&self, first: u64, end: u64) -> Place {
        let pos = self.order.partition_point(|b| b.first < first);
        if self.order.get(pos).is_some_and(|b| b.first == first) {
            return Place::Held;
        }
        let overlaps_prev = pos > 0 && self.order[pos - 1].end > first;
        let overlaps_next = self.order.get(pos).is_some_and(|b| b.first < end);
        if overlaps_prev || overlaps_next {
            Place::Overlaps
        } else {
            Place::Open
        }
    }

    /// Drops the lowest datagram held; whether there was one.
    pub(super) fn evict_first(&mut self) -> bool {
        let Some(old) = self.order.pop_front() else {
            return false;
        };
        self.free.push(old.slot);
        true
    }

    /// Holds `bytes` (at most `max_datagram`, [`Place::Open`]) as the
    /// datagram `[first, end)`; false if no slot is free.
    pub(super) fn insert(&mut self, first: u64, end: u64, bytes: &[u8]) -> bool {
        let Some(slot) = self.free.pop() else {
            return false;
        };
        let start = slot as usize * self.max_datagram;
        self.slots[start..start + bytes.len()].copy_from_slice(bytes);
        let pos = self.order.partition_point(|b| b.first < first);
        self.order.insert(
            pos,
            Buffered {
                first,
                end,
                slot,
                len: bytes.len() as u32,
            },
        );
        true
    }

    /// Takes the lowest datagram held if it starts at or before `next`;
    /// its bytes stay readable ([`bytes`](Self::bytes)) until it is
    /// [`release`](Self::release)d.
    pub(super) fn pop_ready(&mut self, next: u64) -> Option<Buffered> {
        if self.order.front()?.first > next {
            return None;
        }
        self.order.pop_front()
    }

    /// The bytes of a datagram taken by [`pop_ready`](Self::pop_ready).
    pub(super) fn bytes(&self, b: &Buffered) -> &[u8] {
        let start = b.slot as usize * self.max_datagram;
        &self.slots[start..start + b.len as usize]
    }

    /// Frees the slot of a datagram taken by [`pop_ready`](Self::pop_ready).
    pub(super) fn release(&mut self, b: Buffered) {
        self.free.push(b.slot);
    }

    /// `(first, end)` of each datagram held, in order.
    pub(super) fn spans(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.order.iter().map(|b| (b.first, b.end))
    }

    /// Keeps the lowest `keep` datagrams; returns how many were dropped.
    pub(super) fn truncate(&mut self, keep: usize) -> u64 {
        let mut dropped = 0;
        while self.order.len() > keep {
            if let Some(b) = self.order.pop_back() {
                self.free.push(b.slot);
                dropped += 1;
            }
        }
        dropped
    }

    /// Drops everything held.
    pub(super) fn clear(&mut self) {
        self.truncate(0);
    }

    /// The holes in `[next, high)`: delivery at `next`, `high` one past the
    /// highest sequence known.
    pub(super) fn holes(&self, next: u64, high: u64) -> Holes<'_> {
        Holes {
            order: &self.order,
            next,
            high,
        }
    }
}

/// What is missing between the delivery point and the highest sequence
/// known: the ranges no held datagram covers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Holes<'a> {
    order: &'a VecDeque<Buffered>,
    next: u64,
    high: u64,
}

impl Holes<'_> {
    /// The next hole at or after `cursor`.
    pub(super) fn next_hole(&self, cursor: u64) -> Option<(u64, u64)> {
        let mut cursor = cursor.max(self.next);
        let i = self.order.partition_point(|b| b.end <= cursor);
        for b in self.order.range(i..) {
            if b.first > cursor {
                return Some((cursor, b.first));
            }
            cursor = cursor.max(b.end);
        }
        (self.high > cursor).then_some((cursor, self.high))
    }

    /// First missing sequence in `[from, to)` and one past the last missing.
    pub(super) fn missing_in(&self, from: u64, to: u64) -> Option<(u64, u64)> {
        let mut first = None;
        let mut last = 0;
        let mut cursor = from;
        while let Some((a, b)) = self.next_hole(cursor) {
            if a >= to {
                break;
            }
            first.get_or_insert(a);
            last = b.min(to);
            cursor = b;
        }
        first.map(|f| (f, last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_datagrams_come_back_in_order_with_their_bytes() {
        let mut r = ReorderBuffer::new(3, 8);
        assert!(r.insert(9, 11, b"nine"));
        assert!(r.insert(3, 5, b"three"));
        assert!(r.insert(6, 7, b"six"));
        assert!(r.is_full());
        assert!(!r.insert(12, 13, b"x"), "no slot");
        assert_eq!(r.first(), Some(3));
        assert_eq!(r.pop_ready(2).map(|b| b.first), None, "3 is ahead of 2");
        let b = r.pop_ready(3).expect("ready");
        assert_eq!((b.first, b.end, r.bytes(&b)), (3, 5, &b"three"[..]));
        r.release(b);
        assert!(!r.is_full());
        assert_eq!(r.spans().collect::<Vec<_>>(), [(6, 7), (9, 11)]);
        assert_eq!(r.truncate(1), 1);
        assert!(r.evict_first());
        assert!(r.is_empty() && !r.evict_first());
    }

    #[test]
    fn a_copy_and_an_overlap_are_told_apart() {
        let mut r = ReorderBuffer::new(4, 8);
        r.insert(5, 7, b"a");
        assert_eq!(r.place(5, 7), Place::Held);
        assert_eq!(r.place(6, 8), Place::Overlaps);
        assert_eq!(r.place(3, 6), Place::Overlaps);
        assert_eq!(r.place(3, 5), Place::Open);
        assert_eq!(r.place(7, 9), Place::Open);
    }

    #[test]
    fn holes_are_what_no_held_datagram_covers_up_to_high() {
        let mut r = ReorderBuffer::new(4, 8);
        r.insert(5, 7, b"a");
        r.insert(9, 10, b"b");
        let h = r.holes(3, 14);
        assert_eq!(h.next_hole(0), Some((3, 5)), "from the delivery point");
        assert_eq!(h.next_hole(5), Some((7, 9)));
        assert_eq!(h.next_hole(9), Some((10, 14)));
        assert_eq!(h.next_hole(14), None);
        assert_eq!(h.missing_in(4, 9), Some((4, 9)));
        assert_eq!(h.missing_in(5, 7), None);
        assert_eq!(h.missing_in(6, 8), Some((7, 8)));
        assert_eq!(r.holes(10, 10).next_hole(0), None, "all delivered");
    }
}
