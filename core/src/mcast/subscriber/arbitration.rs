//! A/B arbitration: the same datagram may come on line A, on line B and as
//! a retransmission; the first copy is used and every later one is a
//! counted duplicate. Decides what an arriving datagram of the followed
//! session is to the stream, from the delivery point and the out-of-order
//! buffer; the composing [`SubscriberState`] acts on it. The window in
//! which a hole waits for the other line is the loss detector's
//! (`ab_grace_ns`, see [`loss`](super::loss)).
//!
//! [`SubscriberState`]: super::SubscriberState

use super::reorder::{Place, ReorderBuffer};
use super::wire::Line;
use super::SubscriberCounters;

/// Where a datagram came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// A multicast line.
    Line(Line),
    /// A retransmission over the recovery connection.
    Retransmit,
}

/// What a datagram `[first, end)` of the followed session is to the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Arrival {
    /// It carries the next sequence to deliver: deliver it now.
    Deliver,
    /// Every message in it was delivered or is held: a later copy.
    Duplicate,
    /// It overlaps a held datagram with other boundaries: not our
    /// publisher's (same session, forged or corrupt).
    Overlaps,
    /// Ahead of the delivery point (or re-synchronising): hold it.
    Ahead,
}

/// The first copy wins: what `[first, end)` is, with delivery at `next`
/// (`live`: delivering; otherwise everything is held for after a snapshot)
/// and `held` the datagrams already out of order.
#[inline]
pub(super) fn arbitrate(
    live: bool,
    next: u64,
    first: u64,
    end: u64,
    held: &ReorderBuffer,
) -> Arrival {
    if live && first <= next {
        return if end <= next {
            Arrival::Duplicate
        } else {
            Arrival::Deliver
        };
    }
    match held.place(first, end) {
        Place::Held => Arrival::Duplicate,
        Place::Overlaps => Arrival::Overlaps,
        Place::Open => Arrival::Ahead,
    }
}

/// Counts a valid datagram received on `line`.
#[inline]
pub(super) fn count_received(counters: &mut SubscriberCounters, line: Line) {
    match line {
        Line::A => counters.received_a += 1,
        Line::B => counters.received_b += 1,
    }
}

/// Counts a later copy by where it came from.
pub(super) fn count_duplicate(counters: &mut SubscriberCounters, src: Source) {
    match src {
        Source::Line(Line::A) => counters.duplicates_a += 1,
        Source::Line(Line::B) => counters.duplicates_b += 1,
        Source::Retransmit => counters.duplicates_retransmit += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{announced, cfg, datagrams, publisher, transmits, App};
    use super::super::Phase;
    use super::*;

    #[test]
    fn the_first_copy_is_delivered_and_a_later_one_is_a_duplicate() {
        let held = ReorderBuffer::new(4, 64);
        // Delivery at 3: [3, 5) is new, [1, 3) was delivered.
        assert_eq!(arbitrate(true, 3, 3, 5, &held), Arrival::Deliver);
        assert_eq!(arbitrate(true, 5, 3, 5, &held), Arrival::Duplicate);
        assert_eq!(arbitrate(true, 3, 1, 3, &held), Arrival::Duplicate);
        // Partly delivered: the rest is new.
        assert_eq!(arbitrate(true, 4, 3, 5, &held), Arrival::Deliver);
    }

    #[test]
    fn a_copy_of_a_held_datagram_is_a_duplicate_and_an_overlap_is_not_ours() {
        let mut held = ReorderBuffer::new(4, 64);
        assert_eq!(arbitrate(true, 3, 7, 9, &held), Arrival::Ahead);
        held.insert(7, 9, b"x");
        assert_eq!(arbitrate(true, 3, 7, 9, &held), Arrival::Duplicate);
        assert_eq!(arbitrate(true, 3, 8, 10, &held), Arrival::Overlaps);
        assert_eq!(arbitrate(true, 3, 5, 7, &held), Arrival::Ahead);
        // Re-synchronising, even the delivery point is held for later.
        assert_eq!(arbitrate(false, 3, 3, 5, &held), Arrival::Ahead);
        assert_eq!(arbitrate(false, 3, 7, 9, &held), Arrival::Duplicate);
    }

    #[test]
    fn duplicates_are_counted_by_where_they_came_from() {
        let mut c = SubscriberCounters::default();
        count_received(&mut c, Line::A);
        count_received(&mut c, Line::B);
        count_received(&mut c, Line::B);
        count_duplicate(&mut c, Source::Line(Line::A));
        count_duplicate(&mut c, Source::Retransmit);
        count_duplicate(&mut c, Source::Retransmit);
        assert_eq!((c.received_a, c.received_b), (1, 2));
        assert_eq!(
            (c.duplicates_a, c.duplicates_b, c.duplicates_retransmit),
            (1, 0, 2)
        );
    }

    #[test]
    fn in_order_with_b_duplicates() {
        let mut p = publisher(1);
        let mut s = announced(cfg());
        let mut app = App::default();
        for d in datagrams(&mut p, 3) {
            s.on_datagram(0, Line::A, &d, &mut app);
            s.on_datagram(0, Line::B, &d, &mut app);
        }
        assert_eq!(app.seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(s.phase(), Phase::Live);
        let c = s.counters();
        assert_eq!((c.received_a, c.received_b), (3, 3));
        assert_eq!((c.duplicates_a, c.duplicates_b), (0, 3));
        assert_eq!(c.delivered, 6);
        assert!(transmits(&mut s).is_empty());
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn b_fills_what_a_lost_and_a_duplicates_later() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app); // [3,5) lost on A
        assert_eq!(s.buffered(), 1);
        assert_eq!(s.counters().gaps_detected, 1);
        s.on_datagram(1, Line::B, &ds[1], &mut app);
        s.on_datagram(1, Line::B, &ds[2], &mut app);
        assert_eq!(app.seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(s.counters().duplicates_b, 1);
        assert_eq!(s.outstanding(), 0, "request retired once the hole filled");
        assert_eq!(s.buffered(), 0);
    }
}
