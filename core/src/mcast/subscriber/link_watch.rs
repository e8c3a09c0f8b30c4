//! The recovery link as the subscriber sees it: up or down as the I/O
//! layer reports it ([`RecoveryLink`], whose changes the composing
//! [`SubscriberState`] turns into events and losses), and the dead-link rule
//! ([`LinkWatch`]) that tells the I/O layer when a link that is up in name
//! has stopped answering. Owns no sequence state: it reads the subscriber's
//! counters, never changes them.

use super::SubscriberState;

/// What a report of the recovery connection changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LinkChange {
    /// It was up and went down.
    Lost,
    /// It was down and came up.
    Restored,
}

/// The recovery connection's state as the I/O layer reported it last.
#[derive(Debug, Clone, Copy)]
pub(super) struct RecoveryLink {
    up: bool,
}

impl RecoveryLink {
    /// A link taken as up until reported otherwise.
    pub(super) fn new() -> Self {
        Self { up: true }
    }

    /// Whether requests can be sent.
    #[inline]
    pub(super) fn is_up(&self) -> bool {
        self.up
    }

    /// Down without a change to report: the connection was never made.
    pub(super) fn start_down(&mut self) {
        self.up = false;
    }

    /// A report from the I/O layer; repeated reports of the same state
    /// change nothing.
    pub(super) fn report(&mut self, up: bool) -> Option<LinkChange> {
        if up == self.up {
            return None;
        }
        self.up = up;
        Some(if up {
            LinkChange::Restored
        } else {
            LinkChange::Lost
        })
    }
}

/// Request timeouts in a row, with nothing received over the recovery link
/// and delivery not moving, after which the link is taken for dead.
pub const DEAD_LINK_TIMEOUTS: u64 = 3;

/// The dead-link rule, I/O-free: a recovery link that takes requests but
/// never answers (the publisher's end is gone without a disconnect reaching
/// us) is dead after [`DEAD_LINK_TIMEOUTS`] rounds of request timeouts in a
/// row with nothing received over it, and no sooner than `min_silence_ns`
/// (`recovery.dead_link_ns`) after it last showed progress: a publisher
/// that is busy, or descheduled for a moment, is not a dead one (with the
/// default 200 us request wait, three timeouts alone are a millisecond).
/// Delivery that moved on is an answer too: a request covered by a
/// multicast repair is answered on the lines, not over the link.
#[derive(Debug, Clone, Copy, Default)]
pub struct LinkWatch {
    silent_timeouts: u64,
    seen_timeouts: u64,
    seen_answers: u64,
    seen_next: u64,
    /// When the link last showed progress (None: not looked at yet).
    quiet_since: Option<u64>,
    min_silence_ns: u64,
}

impl LinkWatch {
    /// A watch that gives a link up no sooner than `min_silence_ns` after
    /// its last progress (0: after the timeouts alone).
    pub fn new(min_silence_ns: u64) -> Self {
        Self {
            min_silence_ns,
            ..Self::default()
        }
    }

    /// Looks at the subscriber after a turn at `now`: `answers` is the
    /// running count of messages received over the link, `link_up` whether
    /// it is up. `true`: the link is dead, drop it and reconnect.
    pub fn check(
        &mut self,
        now: u64,
        state: &SubscriberState,
        answers: u64,
        link_up: bool,
    ) -> bool {
        if answers != self.seen_answers || state.next_seq() != self.seen_next || !link_up {
            self.seen_answers = answers;
            self.seen_next = state.next_seq();
            self.silent_timeouts = 0;
            self.quiet_since = Some(now);
        }
        let timeouts = state.timeouts();
        if timeouts != self.seen_timeouts {
            self.seen_timeouts = timeouts;
            self.silent_timeouts += 1;
        }
        let quiet_for = now.saturating_sub(*self.quiet_since.get_or_insert(now));
        if self.silent_timeouts >= DEAD_LINK_TIMEOUTS && quiet_for >= self.min_silence_ns {
            self.silent_timeouts = 0;
            self.quiet_since = Some(now);
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        announced, cfg, datagrams, events, publisher, retransmit, snapshot_request, transmits, App,
        TIMEOUT,
    };
    use super::super::{Event, SubscriberConfig};
    use super::*;
    use crate::clock::Mono;
    use crate::mcast::snapshot::encode_snapshot;
    use crate::mcast::wire::Line;

    #[test]
    fn reports_change_the_link_once_each_way() {
        let mut l = RecoveryLink::new();
        assert!(l.is_up());
        assert_eq!(l.report(true), None, "already up");
        assert_eq!(l.report(false), Some(LinkChange::Lost));
        assert_eq!(l.report(false), None, "reported twice: one change");
        assert!(!l.is_up());
        assert_eq!(l.report(true), Some(LinkChange::Restored));
        assert!(l.is_up());
    }

    #[test]
    fn a_link_started_down_reports_only_its_coming_up() {
        let mut l = RecoveryLink::new();
        l.start_down();
        assert!(!l.is_up());
        assert_eq!(l.report(false), None, "never up: nothing was lost");
        assert_eq!(l.report(true), Some(LinkChange::Restored));
    }

    #[test]
    fn dead_link_takes_three_silent_timeouts_and_the_least_silence() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = announced(SubscriberConfig {
            max_retries: 10,
            ..cfg()
        });
        let mut app = App::default();
        let mut floor = LinkWatch::new(10 * TIMEOUT);
        let mut counts_only = LinkWatch::new(0);
        for w in [&mut floor, &mut counts_only] {
            assert!(!w.check(0, &s, 0, true));
        }
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        transmits(&mut s);
        for w in [&mut floor, &mut counts_only] {
            assert!(!w.check(0, &s, 0, true), "delivery moved: progress");
        }
        for t in 1..=3 {
            s.handle_timeout(t * TIMEOUT, &mut app);
            transmits(&mut s);
            assert_eq!(s.counters().timeouts, t);
            assert!(!floor.check(t * TIMEOUT, &s, 0, true), "t={t}");
            assert_eq!(counts_only.check(t * TIMEOUT, &s, 0, true), t == 3, "t={t}");
        }
        // Three silent timeouts, but the link has been quiet for less than
        // the floor: kept until the floor has passed.
        assert!(!floor.check(10 * TIMEOUT - 1, &s, 0, true));
        assert!(floor.check(10 * TIMEOUT, &s, 0, true));
        // An answer over the link (at 11) starts the count and the clock
        // again.
        for t in 11..=13 {
            s.handle_timeout(t * TIMEOUT, &mut app);
            transmits(&mut s);
            assert!(!floor.check(t * TIMEOUT, &s, 1, true), "t={t}");
        }
        assert!(!floor.check(21 * TIMEOUT - 1, &s, 1, true));
        assert!(floor.check(21 * TIMEOUT, &s, 1, true));
    }

    #[test]
    fn link_down_turns_holes_into_losses_and_snapshot_waits_for_link_up() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 6);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app); // hole [3,5), requested
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        s.set_recovery_link(1, false);
        s.set_recovery_link(1, false); // reported twice: one event
        assert!(!s.recovery_link_up());
        assert_eq!(
            events(&mut s),
            vec![
                Event::RecoveryLost,
                Event::UnrecoverableLoss { from: 3, to: 5 },
                Event::ResyncStarted
            ]
        );
        // Multicast still comes in (buffered for after the snapshot); no
        // request goes out and no snapshot timer runs while down.
        s.on_datagram(2, Line::A, &ds[3], &mut app);
        assert!(transmits(&mut s).is_empty());
        assert_eq!(s.poll_timeout(), None);
        s.set_recovery_link(3, true);
        assert_eq!(events(&mut s), vec![Event::RecoveryRestored]);
        assert_eq!(transmits(&mut s), vec![snapshot_request()]);
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, &[], 64, |m| msgs.push(m.to_vec()));
        s.on_recovery(4, &msgs[0], &mut app);
        assert_eq!(app.seqs, vec![1, 2, 5, 6, 7, 8]);
        assert_eq!(events(&mut s), vec![Event::SnapshotApplied { seq: 4 }]);
        // Live again with the link down: a new hole is lost at once.
        s.set_recovery_link(5, false);
        s.on_datagram(5, Line::A, &ds[5], &mut app); // hole [9,11)
        assert_eq!(
            events(&mut s),
            vec![
                Event::RecoveryLost,
                Event::UnrecoverableLoss { from: 9, to: 11 },
                Event::ResyncStarted
            ]
        );
        let c = s.counters();
        assert_eq!((c.recovery_link_lost, c.lost_while_link_down), (2, 2));
        assert_eq!(c.retransmit_requests, 1, "nothing asked while down");
    }

    #[test]
    fn a_link_never_up_is_reported_when_it_comes_up_not_as_lost() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = SubscriberState::new(cfg());
        s.start_link_down();
        assert!(!s.recovery_link_up());
        assert_eq!(events(&mut s), vec![], "nothing was lost");
        assert_eq!(s.counters().recovery_link_lost, 0);
        // Down means down: nothing is requested until the link comes up.
        s.announce_session(0, 1);
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        assert!(transmits(&mut s).is_empty());
        s.set_recovery_link(1, true);
        assert_eq!(
            events(&mut s),
            vec![
                Event::UnrecoverableLoss { from: 3, to: 5 },
                Event::ResyncStarted,
                Event::RecoveryRestored
            ]
        );
    }

    #[test]
    fn link_down_lets_the_arbitration_window_run_first() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = announced(SubscriberConfig {
            ab_grace_ns: 100,
            ..cfg()
        });
        let mut app = App::default();
        s.set_recovery_link(0, false);
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        assert_eq!(s.poll_timeout(), Some(Mono::from_nanos(100)));
        s.on_datagram(50, Line::B, &ds[1], &mut app); // B fills it in time
        assert_eq!(app.seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(s.counters().gaps_filled_by_other_line, 1);
        assert_eq!(events(&mut s), vec![Event::RecoveryLost]);
    }
}
