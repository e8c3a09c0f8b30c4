//! Gap-tolerant delivery's clock (`gap_tolerance_ns > 0`; 0 is strict and
//! this part does nothing): how long delivery has waited at one point, and
//! whether a hole there is to be skipped now. Values in (the delivery point,
//! whether anything is missing, the hole and the part of it known lost),
//! decisions out (where delivery goes on); the composing
//! [`SubscriberState`] finds the holes, tells the handler and moves
//! delivery. Owns no sequence state of its own beyond the point it watches.
//!
//! [`SubscriberState`]: super::SubscriberState

/// The stall timer and the "a lost range may be at the delivery point"
/// flag of a gap-tolerant subscriber.
#[derive(Debug, Clone, Copy)]
pub(super) struct Tolerance {
    tolerance_ns: u64,
    /// Since when delivery has waited at `stall_seq`.
    stall_since: Option<u64>,
    stall_seq: u64,
    /// A range was marked lost; look at skipping it.
    skip_due: bool,
}

impl Tolerance {
    /// `tolerance_ns == 0`: strict, never skips.
    pub(super) fn new(tolerance_ns: u64) -> Self {
        Self {
            tolerance_ns,
            stall_since: None,
            stall_seq: 0,
            skip_due: false,
        }
    }

    /// Holes are skipped rather than re-synchronised.
    #[inline]
    pub(super) fn enabled(&self) -> bool {
        self.tolerance_ns > 0
    }

    /// A timer runs or a skip is due (the steady state's one check).
    #[inline]
    pub(super) fn pending(&self) -> bool {
        self.skip_due || self.stall_since.is_some()
    }

    /// When a skip may be due: now if a lost range waits, else when the
    /// stall reaches the bound.
    pub(super) fn deadline(&self) -> Option<u64> {
        if self.skip_due {
            Some(0)
        } else {
            self.stall_since
                .map(|t| t.saturating_add(self.tolerance_ns))
        }
    }

    /// After delivery may have moved: (re)starts the stall timer when
    /// delivery waits (`stalled`) at a new point `next`, stops it when
    /// nothing is missing.
    #[inline]
    pub(super) fn track(&mut self, now: u64, stalled: bool, next: u64) {
        if !self.enabled() {
            return;
        }
        if stalled {
            if self.stall_since.is_none() || self.stall_seq != next {
                self.stall_since = Some(now);
                self.stall_seq = next;
            }
        } else {
            self.stall_since = None;
        }
    }

    /// A range known lost is waiting to be skipped.
    pub(super) fn mark_due(&mut self) {
        self.skip_due = true;
    }

    /// The skips due were looked at.
    pub(super) fn clear_due(&mut self) {
        self.skip_due = false;
    }

    /// Where delivery goes on past the hole `[next, hole_to)` at the
    /// delivery point, if it is to be skipped now: the whole hole once
    /// delivery has waited at `next` for the bound, else up to the end of
    /// the range known lost from `next` (`lost_to`, what follows it may
    /// still come); `None`: wait.
    pub(super) fn skip_to(
        &self,
        now: u64,
        next: u64,
        hole_to: u64,
        lost_to: Option<u64>,
    ) -> Option<u64> {
        let expired = self.stall_seq == next
            && self
                .stall_since
                .is_some_and(|t| now.saturating_sub(t) >= self.tolerance_ns);
        if expired {
            Some(hole_to)
        } else {
            lost_to
        }
    }

    /// Forgets the timer and the skips due (a resync or a new session).
    pub(super) fn reset(&mut self) {
        self.stall_since = None;
        self.skip_due = false;
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        announced, cfg, datagrams, events, not_available, publisher, retransmit, serve, tolerant,
        transmits, App, Rec, TIMEOUT,
    };
    use super::super::{Event, Phase, SubscriberConfig};
    use super::*;
    use crate::mcast::wire::Line;

    #[test]
    fn a_strict_subscriber_never_times_a_stall_and_never_skips() {
        let mut t = Tolerance::new(0);
        assert!(!t.enabled());
        t.track(0, true, 3);
        assert!(!t.pending());
        assert_eq!(t.deadline(), None);
        assert_eq!(t.skip_to(1_000_000, 3, 5, None), None);
    }

    #[test]
    fn a_hole_within_the_bound_waits_and_beyond_it_is_skipped_whole() {
        let mut t = Tolerance::new(100);
        assert!(t.enabled());
        t.track(10, true, 3); // delivery waits at 3 (a hole [3, 5))
        assert_eq!(t.deadline(), Some(110));
        assert_eq!(t.skip_to(109, 3, 5, None), None, "within the bound");
        assert_eq!(t.skip_to(110, 3, 5, None), Some(5), "at the bound");
        // Waiting on at the same point does not restart the clock...
        t.track(50, true, 3);
        assert_eq!(t.deadline(), Some(110));
        // ...a new point does, and the old point's time counts for nothing.
        t.track(60, true, 7);
        assert_eq!(t.deadline(), Some(160));
        assert_eq!(t.skip_to(110, 7, 9, None), None);
        // Nothing missing: no timer.
        t.track(70, false, 9);
        assert!(!t.pending());
        assert_eq!(t.skip_to(1_000, 9, 11, None), None);
    }

    #[test]
    fn a_range_known_lost_is_skipped_at_once_up_to_its_end() {
        let mut t = Tolerance::new(100);
        t.track(0, true, 3);
        t.mark_due();
        assert_eq!(t.deadline(), Some(0), "due now");
        // Lost [3, 4) of the hole [3, 9): what follows may still come.
        assert_eq!(t.skip_to(1, 3, 9, Some(4)), Some(4));
        // Once the bound has passed, the whole hole.
        assert_eq!(t.skip_to(100, 3, 9, Some(4)), Some(9));
        t.clear_due();
        assert_eq!(t.deadline(), Some(100));
        t.reset();
        assert!(!t.pending());
    }

    #[test]
    fn tolerant_subscriber_skips_an_unrepaired_hole_after_the_bound() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 4);
        let mut s = announced(tolerant());
        let mut app = Rec::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app); // hole [3,5)
        s.on_datagram(10, Line::A, &ds[3], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        // Nobody answers; requests time out and are repeated until the bound.
        let mut now = 0;
        while s.phase() == Phase::Live && app.gaps.is_empty() {
            now = s.poll_timeout().expect("a deadline").as_nanos();
            assert!(now <= 5 * TIMEOUT, "skipped late: {now}");
            s.handle_timeout(now, &mut app);
            transmits(&mut s);
        }
        assert_eq!(now, 5 * TIMEOUT);
        assert_eq!(app.gaps, vec![(3, 5)]);
        let seqs: Vec<u64> = app.msgs.iter().map(|m| m.0).collect();
        assert_eq!(seqs, vec![1, 2, 5, 6, 7, 8]);
        assert_eq!(events(&mut s), vec![Event::GapSkipped { from: 3, to: 5 }]);
        let c = s.counters();
        assert_eq!((c.gaps_skipped, c.sequences_skipped), (1, 2));
        assert_eq!((c.unrecoverable, c.snapshot_requests), (0, 0));
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.poll_timeout(), None);
        // A late retransmission of the skipped range is a duplicate.
        serve(&mut p, &mut s, &mut App::default(), now);
        s.on_datagram(now, Line::A, &ds[1], &mut app);
        assert_eq!(app.msgs.len(), 6);
    }

    #[test]
    fn tolerant_subscriber_skips_what_the_history_no_longer_has_at_once() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 6);
        for (tolerance, strict) in [(tolerant().gap_tolerance_ns, false), (0, true)] {
            let mut s = announced(SubscriberConfig {
                gap_tolerance_ns: tolerance,
                ..cfg()
            });
            let mut app = Rec::default();
            s.on_datagram(0, Line::A, &ds[0], &mut app);
            s.on_datagram(0, Line::A, &ds[5], &mut app); // hole [3,11)
            assert_eq!(transmits(&mut s), vec![retransmit(3, 8)]);
            s.on_recovery(1, &not_available(3, 4, 7), &mut app);
            if strict {
                assert_eq!(s.phase(), Phase::Resyncing);
                assert!(app.gaps.is_empty());
                assert_eq!(app.msgs.len(), 2);
                continue;
            }
            // [3,7) skipped at once; [7,11) still asked for and repaired.
            assert_eq!(app.gaps, vec![(3, 7)]);
            assert_eq!(s.phase(), Phase::Live);
            for d in &ds[3..5] {
                s.on_datagram(2, Line::A, d, &mut app);
            }
            let seqs: Vec<u64> = app.msgs.iter().map(|m| m.0).collect();
            assert_eq!(seqs, vec![1, 2, 7, 8, 9, 10, 11, 12]);
            assert_eq!(s.counters().gaps_skipped, 1);
        }
    }
}
