//! Loss detection, as Aeron's `LossDetector` is to its receiver: which
//! holes are asked for, when, how often, and when a hole is given up. Owns
//! the requests in flight (bounded by `max_outstanding`, each at most
//! `max_request_messages`), the A/B arbitration window a new hole waits in
//! (`ab_grace_ns`), and the retry wait, which adapts to the measured repair
//! time as TCP's retransmit timer does (RFC 6298) and backs off while
//! requests go unanswered.
//!
//! Values in: `now`, the holes (a [`Holes`] view of the out-of-order
//! buffer), whether the recovery link is up, and delivery moving on.
//! Decisions out: requests to send ([`LossDetector::poll_request`]), its
//! deadline ([`LossDetector::poll_timeout`]), and ranges to give up
//! ([`Expired`]), which the composing [`SubscriberState`] turns into a
//! re-synchronisation or, gap-tolerant, into a range marked lost here
//! ([`LossDetector::mark_lost`]) for delivery to skip. It never delivers,
//! never touches the buffer, and raises no event.
//!
//! [`SubscriberState`]: super::SubscriberState

use super::reorder::Holes;
use super::{SubscriberConfig, SubscriberCounters};

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    from: u64,
    to: u64,
    deadline: u64,
    /// When it was (last) asked for: the start of a repair time sample.
    asked: u64,
    /// The wait it was (last) asked with.
    wait: u64,
    retries: u32,
    needs_send: bool,
    /// Seen but not requested yet: waiting `ab_grace_ns` for the other line.
    in_grace: bool,
    /// Known unrecoverable, to be skipped (gap-tolerant only): never sent,
    /// never times out.
    lost: bool,
}

impl Outstanding {
    /// A request for `[from, to)` sent now (or to be sent), waiting `wait`.
    fn asked(now: u64, from: u64, to: u64, wait: u64, retries: u32) -> Self {
        Outstanding {
            from,
            to,
            deadline: now + wait,
            asked: now,
            wait,
            retries,
            needs_send: true,
            in_grace: false,
            lost: false,
        }
    }

    /// The time a filled request took, if it is a sample: asked once and
    /// sent (a retry's answer may be the first ask's: Karn's rule).
    fn repair_time(&self, now: u64) -> Option<u64> {
        (!self.in_grace && !self.lost && !self.needs_send && self.retries == 0)
            .then(|| now.saturating_sub(self.asked))
    }
}

/// The retry wait (see [`SubscriberConfig::max_recovery_timeout_ns`]).
#[derive(Debug, Clone, Copy)]
struct RetryWait {
    min: u64,
    max: u64,
    /// Measured time from asking for a range to having all of it (by
    /// unicast, multicast repair or the other line), smoothed; 0 before the
    /// first sample. Only first asks are sampled (a retry's answer may be
    /// the first ask's).
    srtt: u64,
    /// Mean deviation of those samples.
    rttvar: u64,
    /// The current wait before asking again.
    rto: u64,
}

impl RetryWait {
    fn new(min: u64, max: u64) -> Self {
        Self {
            min,
            max,
            srtt: 0,
            rttvar: 0,
            rto: min,
        }
    }

    fn adaptive(&self) -> bool {
        self.max > self.min
    }

    /// A request asked with `wait` went unanswered: the wait doubles (once
    /// for all the requests asked with the same wait), up to the most.
    fn back_off(&mut self, wait: u64) {
        if self.adaptive() && wait >= self.rto {
            self.rto = self.rto.saturating_mul(2).min(self.max);
        }
    }

    /// One measured repair time (RFC 6298's smoothing, gains 1/8 and 1/4);
    /// the wait becomes the estimate plus four deviations, within bounds.
    fn sample(&mut self, t: u64) {
        if self.srtt == 0 {
            self.srtt = t.max(1);
            self.rttvar = t / 2;
        } else {
            self.rttvar = (3 * self.rttvar + self.srtt.abs_diff(t)) / 4;
            self.srtt = ((7 * self.srtt + t) / 8).max(1);
        }
        if self.adaptive() {
            self.rto = self
                .srtt
                .saturating_add(self.rttvar.saturating_mul(4))
                .clamp(self.min, self.max);
        }
    }
}

/// A hole whose time ran out and that cannot be asked for again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Expired {
    /// First missing sequence.
    pub(super) from: u64,
    /// One past the last missing sequence.
    pub(super) to: u64,
    /// Because the recovery link is down (else: retries exhausted).
    pub(super) link_down: bool,
}

/// What delivery moving on did to the requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    /// Holes filled inside the arbitration window, never requested.
    pub(super) filled_in_grace: u64,
    /// A range marked lost is still open (it may be at the delivery point).
    pub(super) lost_open: bool,
}

/// The holes asked for or waiting to be, and the retry wait.
#[derive(Debug)]
pub(super) struct LossDetector {
    max_outstanding: usize,
    max_request_messages: u64,
    ab_grace_ns: u64,
    max_retries: u32,
    outstanding: Vec<Outstanding>,
    wait: RetryWait,
}

impl LossDetector {
    /// `cfg`'s bounds already clamped (`max_outstanding`,
    /// `max_request_messages` at least 1).
    pub(super) fn new(cfg: &SubscriberConfig) -> Self {
        Self {
            max_outstanding: cfg.max_outstanding,
            max_request_messages: cfg.max_request_messages,
            ab_grace_ns: cfg.ab_grace_ns,
            max_retries: cfg.max_retries,
            outstanding: Vec::with_capacity(cfg.max_outstanding),
            wait: RetryWait::new(cfg.recovery_timeout_ns, cfg.max_recovery_timeout_ns),
        }
    }

    /// The retry wait is `wait_ns`, fixed (no longer measured): for a link
    /// whose answers cannot be lost, only refused (see
    /// `SubscriberState::set_in_order_link`).
    pub(super) fn fix_wait(&mut self, wait_ns: u64) {
        self.wait = RetryWait::new(wait_ns, wait_ns);
    }

    /// Nothing asked for or waiting (the latency path's condition).
    #[inline]
    pub(super) fn is_empty(&self) -> bool {
        self.outstanding.is_empty()
    }

    /// Requests in flight, holes in the arbitration window and ranges
    /// marked lost.
    pub(super) fn len(&self) -> usize {
        self.outstanding.len()
    }

    /// The wait a first ask gets now.
    pub(super) fn retry_wait(&self) -> u64 {
        self.wait.rto
    }

    /// The smoothed measured repair time (0 before the first sample).
    pub(super) fn repair_time(&self) -> u64 {
        self.wait.srtt
    }

    /// Forgets every request (a resync or a new session).
    pub(super) fn clear(&mut self) {
        self.outstanding.clear();
    }

    /// The earliest deadline of a request or a hole in the window.
    pub(super) fn poll_timeout(&self) -> Option<u64> {
        self.outstanding.iter().map(|o| o.deadline).min()
    }

    /// The next range to ask for, marked sent.
    pub(super) fn poll_request(&mut self) -> Option<(u64, u64)> {
        let o = self.outstanding.iter_mut().find(|o| o.needs_send)?;
        o.needs_send = false;
        Some((o.from, o.to))
    }

    /// The lowest range already asked for (out of the window): its answer
    /// will not come when the link goes down.
    pub(super) fn first_asked(&self) -> Option<(u64, u64)> {
        self.outstanding
            .iter()
            .filter(|o| !o.in_grace)
            .map(|o| (o.from, o.to))
            .min()
    }

    /// Opens requests for the holes not yet covered, up to
    /// `max_outstanding`: into the arbitration window, or asked at once
    /// (`ab_grace_ns == 0`). Returns a hole that cannot be asked for
    /// because the link is down; nothing more is opened after it.
    pub(super) fn open(
        &mut self,
        now: u64,
        holes: &Holes<'_>,
        link_up: bool,
    ) -> Option<(u64, u64)> {
        let mut cursor = 0;
        while self.outstanding.len() < self.max_outstanding {
            let (hole_from, hole_to) = holes.next_hole(cursor)?;
            let mut s = hole_from;
            while s < hole_to && self.outstanding.len() < self.max_outstanding {
                if let Some(o) = self.outstanding.iter().find(|o| o.from <= s && s < o.to) {
                    s = o.to;
                    continue;
                }
                let e = self
                    .outstanding
                    .iter()
                    .filter(|o| o.from > s)
                    .map(|o| o.from)
                    .min()
                    .unwrap_or(hole_to)
                    .min(hole_to)
                    .min(s.saturating_add(self.max_request_messages));
                let in_grace = self.ab_grace_ns > 0;
                if !in_grace && !link_up {
                    return Some((s, e));
                }
                let rto = self.wait.rto;
                self.outstanding.push(Outstanding {
                    deadline: now + if in_grace { self.ab_grace_ns } else { rto },
                    needs_send: !in_grace,
                    in_grace,
                    ..Outstanding::asked(now, s, e, rto, 0)
                });
                s = e;
            }
            cursor = hole_to;
        }
        None
    }

    /// Deadlines passed at `due` (`now`, or earlier on an in-order
    /// connection: see `SubscriberState::set_in_order_link`): a hole the
    /// window let through is asked for, a request that went unanswered is asked again (and the wait
    /// backs off), what was filled meanwhile is retired. Stops at the first
    /// hole that cannot be asked for (link down, retries exhausted) and
    /// returns it; call again after acting on it, until `None`.
    pub(super) fn expire(
        &mut self,
        now: u64,
        due: u64,
        holes: &Holes<'_>,
        link_up: bool,
        counters: &mut SubscriberCounters,
    ) -> Option<Expired> {
        let mut i = 0;
        while i < self.outstanding.len() {
            let o = self.outstanding[i];
            if o.deadline > due || o.lost {
                i += 1;
                continue;
            }
            if !o.in_grace {
                counters.timeouts += 1;
            }
            let Some((from, to)) = holes.missing_in(o.from, o.to) else {
                if o.in_grace {
                    counters.gaps_filled_by_other_line += 1;
                }
                self.outstanding.swap_remove(i);
                continue;
            };
            if !link_up {
                return Some(Expired {
                    from,
                    to,
                    link_down: true,
                });
            }
            if o.in_grace {
                self.outstanding[i] = Outstanding::asked(now, from, to, self.wait.rto, 0);
            } else if o.retries >= self.max_retries {
                return Some(Expired {
                    from,
                    to,
                    link_down: false,
                });
            } else {
                self.wait.back_off(o.wait);
                self.outstanding[i] =
                    Outstanding::asked(now, from, to, self.wait.rto, o.retries + 1);
            }
            i += 1;
        }
        None
    }

    /// Nothing at or after `end` exists (the publisher said so): requests
    /// are cut there, those wholly beyond it dropped.
    pub(super) fn forget_from(&mut self, end: u64) {
        for o in &mut self.outstanding {
            o.to = o.to.min(end);
        }
        self.outstanding.retain(|o| o.from < o.to);
    }

    /// A datagram `[first, end)` was buffered: retires the requests it
    /// completed (filled by a unicast answer, a multicast repair or the
    /// other line: never asked again), sampling the repair time.
    pub(super) fn filled(
        &mut self,
        now: u64,
        first: u64,
        end: u64,
        holes: &Holes<'_>,
        counters: &mut SubscriberCounters,
    ) {
        let mut i = 0;
        while i < self.outstanding.len() {
            let o = self.outstanding[i];
            if o.from < end && first < o.to && holes.missing_in(o.from, o.to).is_none() {
                if o.in_grace {
                    counters.gaps_filled_by_other_line += 1;
                }
                if let Some(t) = o.repair_time(now) {
                    self.wait.sample(t);
                }
                self.outstanding.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Delivery moved on to `next`: requests below it are trimmed or
    /// retired.
    pub(super) fn progress(&mut self, now: u64, next: u64) -> Progress {
        let mut filled = 0;
        let mut lost = false;
        // Requests this progress completed were filled at once: one sample,
        // the longest.
        let mut sample: Option<u64> = None;
        self.outstanding.retain_mut(|o| {
            o.from = o.from.max(next);
            let open = o.to > next;
            filled += u64::from(!open && o.in_grace);
            lost |= open && o.lost;
            if !open {
                sample = sample.max(o.repair_time(now));
            }
            open
        });
        if let Some(t) = sample {
            self.wait.sample(t);
        }
        Progress {
            filled_in_grace: filled,
            lost_open: lost,
        }
    }

    /// Gap-tolerant: `[from, to)` cannot be recovered; it replaces the
    /// requests for it, is never sent and never times out, and waits for
    /// delivery to skip it.
    pub(super) fn mark_lost(&mut self, now: u64, from: u64, to: u64) {
        self.outstanding.retain(|o| o.to <= from || to <= o.from);
        self.outstanding.push(Outstanding {
            deadline: u64::MAX,
            wait: 0,
            needs_send: false,
            lost: true,
            ..Outstanding::asked(now, from, to, 0, 0)
        });
    }

    /// The end of the range marked lost that holds `seq`, if any.
    pub(super) fn lost_to(&self, seq: u64) -> Option<u64> {
        self.outstanding
            .iter()
            .find(|o| o.lost && o.from <= seq && seq < o.to)
            .map(|o| o.to)
    }
}

#[cfg(test)]
mod tests {
    use super::super::reorder::ReorderBuffer;
    use super::super::tests::{
        announced, cfg, datagrams, events, not_available, publisher, retransmit, serve,
        snapshot_request, transmits, App, TIMEOUT,
    };
    use super::super::{Event, Phase, SubscriberConfig};
    use super::*;
    use crate::clock::Mono;
    use crate::mcast::publisher::RetransmitReply;
    use crate::mcast::snapshot::encode_snapshot;
    use crate::mcast::wire::{self, Line, RetransmitRequest};

    fn detector(cfg: SubscriberConfig) -> LossDetector {
        LossDetector::new(&cfg)
    }

    fn requests(l: &mut LossDetector) -> Vec<(u64, u64)> {
        std::iter::from_fn(|| l.poll_request()).collect()
    }

    #[test]
    fn a_gap_is_asked_for_at_once_and_again_after_the_wait_then_given_up() {
        let mut l = detector(cfg()); // wait TIMEOUT, 2 retries
        let mut c = SubscriberCounters::default();
        let none = ReorderBuffer::new(4, 64);
        // Delivered up to 3, known up to 5: [3, 5) is missing.
        let holes = none.holes(3, 5);
        assert_eq!(l.open(10, &holes, true), None);
        assert_eq!(requests(&mut l), [(3, 5)]);
        assert_eq!(l.poll_timeout(), Some(10 + TIMEOUT));
        assert_eq!(l.open(10, &holes, true), None);
        assert_eq!(requests(&mut l), [], "asked once");
        assert_eq!(
            l.expire(10 + TIMEOUT - 1, 10 + TIMEOUT - 1, &holes, true, &mut c),
            None
        );
        assert_eq!(c.timeouts, 0);
        for retry in 1..=2 {
            let now = 10 + retry * TIMEOUT;
            assert_eq!(l.expire(now, now, &holes, true, &mut c), None);
            assert_eq!(requests(&mut l), [(3, 5)], "retry {retry}");
            assert_eq!(c.timeouts, retry);
        }
        let given_up = Expired {
            from: 3,
            to: 5,
            link_down: false,
        };
        assert_eq!(
            l.expire(10 + 3 * TIMEOUT, 10 + 3 * TIMEOUT, &holes, true, &mut c),
            Some(given_up)
        );
    }

    #[test]
    fn a_hole_waits_out_the_arbitration_window_before_it_is_asked_for() {
        let mut l = detector(SubscriberConfig {
            ab_grace_ns: 100,
            ..cfg()
        });
        let mut c = SubscriberCounters::default();
        let mut buf = ReorderBuffer::new(4, 64);
        assert_eq!(l.open(0, &buf.holes(3, 9), true), None);
        assert_eq!(requests(&mut l), [], "in the window");
        assert_eq!(l.poll_timeout(), Some(100));
        // The other line fills [5, 9) meanwhile: only [3, 5) is asked for.
        buf.insert(5, 9, b"x");
        assert_eq!(l.expire(100, 100, &buf.holes(3, 9), true, &mut c), None);
        assert_eq!(requests(&mut l), [(3, 5)]);
        assert_eq!(l.poll_timeout(), Some(100 + TIMEOUT));
        assert_eq!((c.timeouts, c.gaps_filled_by_other_line), (0, 0));
        // A hole the other line fills whole is never asked for.
        let mut l = detector(SubscriberConfig {
            ab_grace_ns: 100,
            ..cfg()
        });
        let mut buf = ReorderBuffer::new(4, 64);
        l.open(0, &buf.holes(3, 5), true);
        buf.insert(3, 5, b"x");
        assert_eq!(l.expire(100, 100, &buf.holes(3, 5), true, &mut c), None);
        assert!(l.is_empty());
        assert_eq!(requests(&mut l), []);
        assert_eq!(c.gaps_filled_by_other_line, 1);
    }

    #[test]
    fn the_wait_backs_off_while_unanswered_and_follows_the_repair_time() {
        let mut l = detector(SubscriberConfig {
            max_recovery_timeout_ns: 8 * TIMEOUT,
            max_retries: 10,
            ..cfg()
        });
        let mut c = SubscriberCounters::default();
        let none = ReorderBuffer::new(4, 64);
        let holes = none.holes(3, 5);
        l.open(0, &holes, true);
        requests(&mut l);
        assert_eq!(l.retry_wait(), TIMEOUT);
        let mut now = 0;
        for wait in [2, 4, 8, 8] {
            now = l.poll_timeout().expect("a deadline");
            l.expire(now, now, &holes, true, &mut c);
            requests(&mut l);
            assert_eq!(l.retry_wait(), wait * TIMEOUT, "doubles up to the most");
        }
        // A retry's answer is no sample (Karn): the wait stays.
        assert_eq!(
            l.progress(now + 10, 5),
            Progress {
                filled_in_grace: 0,
                lost_open: false,
            }
        );
        assert_eq!((l.repair_time(), l.retry_wait()), (0, 8 * TIMEOUT));
        // A first ask answered after 300: the wait is the estimate plus four
        // deviations (300 + 4 * 150), at least the least wait.
        l.open(1_000_000, &none.holes(5, 7), true);
        requests(&mut l);
        l.progress(1_000_300, 7);
        assert_eq!((l.repair_time(), l.retry_wait()), (300, TIMEOUT));
        l.open(2_000_000, &none.holes(7, 9), true);
        requests(&mut l);
        l.progress(2_003_000, 9);
        // srtt 7/8 * 300 + 3000/8 = 637; rttvar 3/4 * 150 + 2700/4 = 787.
        assert_eq!(l.repair_time(), 637);
        assert_eq!(l.retry_wait(), 637 + 4 * 787);
    }

    #[test]
    fn with_the_link_down_a_hole_is_not_asked_for_but_expires_at_once() {
        let mut l = detector(cfg());
        let mut c = SubscriberCounters::default();
        let none = ReorderBuffer::new(4, 64);
        assert_eq!(l.open(0, &none.holes(3, 5), false), Some((3, 5)));
        assert!(l.is_empty());
        // Asked while up; the link goes down before the answer.
        l.open(0, &none.holes(3, 5), true);
        assert_eq!(l.first_asked(), Some((3, 5)));
        assert_eq!(
            l.expire(TIMEOUT, TIMEOUT, &none.holes(3, 5), false, &mut c),
            Some(Expired {
                from: 3,
                to: 5,
                link_down: true
            })
        );
    }

    #[test]
    fn a_range_marked_lost_replaces_its_requests_and_never_times_out() {
        let mut l = detector(SubscriberConfig {
            max_outstanding: 4,
            max_request_messages: 2,
            ..cfg()
        });
        let mut c = SubscriberCounters::default();
        let none = ReorderBuffer::new(4, 64);
        l.open(0, &none.holes(3, 9), true);
        assert_eq!(requests(&mut l), [(3, 5), (5, 7), (7, 9)], "in pieces");
        l.mark_lost(1, 3, 6);
        assert_eq!(l.len(), 2, "[7, 9) and the lost [3, 6)");
        assert_eq!(l.lost_to(4), Some(6));
        assert_eq!(l.lost_to(7), None);
        assert_eq!(requests(&mut l), [], "never sent");
        assert_eq!(
            l.expire(
                100 * TIMEOUT,
                100 * TIMEOUT,
                &none.holes(3, 9),
                true,
                &mut c
            ),
            None
        );
        assert_eq!(l.lost_to(3), Some(6), "never times out");
        assert!(l.progress(2, 4).lost_open);
        assert!(!l.progress(2, 6).lost_open);
    }

    #[test]
    fn gaps_are_requested_at_once_and_recovered_in_order() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 6);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app); // hole [3,5)
        s.on_datagram(0, Line::A, &ds[4], &mut app); // hole [7,9)
        s.on_datagram(0, Line::A, &ds[5], &mut app);
        assert_eq!(s.counters().gaps_detected, 2);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2), retransmit(7, 2)]);
        assert_eq!(s.poll_timeout(), Some(Mono::from_nanos(TIMEOUT)));
        assert_eq!(app.seqs, vec![1, 2]);
        for req in [(3, 2), (7, 2)] {
            p.answer_retransmit(
                &RetransmitRequest {
                    channel: 3,
                    session: 1,
                    from_seq: req.0,
                    count: req.1,
                },
                |r| {
                    let RetransmitReply::Data(d) = r else {
                        panic!("{r:?}")
                    };
                    let mut buf = [0u8; 512];
                    let n = wire::encode_retransmit_data(&mut buf, 3, 1, d).unwrap();
                    s.on_recovery(5, &buf[..n], &mut app);
                },
            );
        }
        assert_eq!(app.seqs, (1..=12).collect::<Vec<_>>());
        let c = s.counters();
        assert_eq!(c.messages_recovered, 4);
        assert_eq!(c.retransmit_requests, 2);
        assert_eq!(c.out_of_order_buffered, 3);
        assert_eq!(c.max_buffered, 3);
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.poll_timeout(), None);
    }

    /// The I/O layer's turn skips the request path and the timers when
    /// these say there is nothing: they must never hide a request or a
    /// deadline.
    #[test]
    fn steady_state_has_no_request_or_deadline_and_a_gap_has_both() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 4);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[1], &mut app);
        assert!(!s.may_transmit());
        assert_eq!(s.poll_timeout(), None);
        s.on_datagram(0, Line::A, &ds[3], &mut app); // hole
        assert!(s.may_transmit());
        assert!(s.poll_timeout().is_some());
        assert_eq!(transmits(&mut s).len(), 1);
        // Requested: nothing more to send, but the deadline stays.
        assert!(s.poll_transmit().is_none());
        assert!(s.poll_timeout().is_some());
        s.set_recovery_link(0, false);
        assert!(!s.may_transmit());
        assert!(s.poll_transmit().is_none());
    }

    #[test]
    fn outstanding_is_bounded_and_pending_holes_follow() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 7);
        let mut s = announced(cfg());
        let mut app = App::default();
        for i in [0, 2, 4, 6] {
            s.on_datagram(0, Line::A, &ds[i], &mut app);
        }
        // Three holes, at most two requests in flight.
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2), retransmit(7, 2)]);
        s.on_datagram(1, Line::B, &ds[1], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(11, 2)]);
        serve(&mut p, &mut s, &mut app, 2);
        serve(&mut p, &mut s, &mut app, 2);
        assert_eq!(app.seqs.len(), 6, "hole [7,9) still waits for its answer");
    }

    #[test]
    fn timeout_rerequests_then_gives_up() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        s.handle_timeout(TIMEOUT - 1, &mut app);
        assert!(transmits(&mut s).is_empty());
        s.handle_timeout(TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        s.handle_timeout(2 * TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        assert_eq!(s.phase(), Phase::Live);
        s.handle_timeout(3 * TIMEOUT, &mut app);
        assert_eq!(s.phase(), Phase::Resyncing);
        assert_eq!(
            events(&mut s),
            vec![
                Event::UnrecoverableLoss { from: 3, to: 5 },
                Event::ResyncStarted
            ]
        );
        assert_eq!(transmits(&mut s), vec![snapshot_request()]);
        let c = s.counters();
        assert_eq!(
            (c.timeouts, c.unrecoverable, c.retransmit_requests),
            (3, 1, 3)
        );
        // Snapshot at 4: delivery resumes at 5 from the buffer.
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, b"x", 64, |m| msgs.push(m.to_vec()));
        for m in msgs {
            s.on_recovery(4 * TIMEOUT, &m, &mut app);
        }
        assert_eq!(app.restored, Some(4));
        assert_eq!(app.seqs, vec![1, 2, 5, 6]);
        assert_eq!(s.phase(), Phase::Live);
        assert_eq!(events(&mut s), vec![Event::SnapshotApplied { seq: 4 }]);
    }

    /// A multicast repair is the original datagram on the line: it fills
    /// the hole, and the request for it is retired, never asked again.
    #[test]
    fn a_multicast_repair_cancels_the_pending_request() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 4);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        s.on_datagram(0, Line::A, &ds[3], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        assert_eq!(s.outstanding(), 1);
        // The repair comes on the line, before the timeout.
        s.on_datagram(TIMEOUT / 2, Line::A, &ds[1], &mut app);
        assert_eq!(app.seqs, (1..=8).collect::<Vec<_>>());
        assert_eq!(s.outstanding(), 0);
        assert_eq!(s.poll_timeout(), None);
        for t in 1..5 {
            s.handle_timeout(t * TIMEOUT, &mut app);
        }
        assert!(transmits(&mut s).is_empty());
        assert_eq!(s.counters().timeouts, 0);
        // An out-of-order fill retires its request too: holes [9,11) and
        // [13,15), and [13,15) comes first.
        let more = datagrams(&mut p, 4);
        s.on_datagram(5 * TIMEOUT, Line::A, &more[1], &mut app);
        s.on_datagram(5 * TIMEOUT, Line::A, &more[3], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(9, 2), retransmit(13, 2)]);
        s.on_datagram(5 * TIMEOUT, Line::A, &more[2], &mut app);
        assert_eq!(s.outstanding(), 1);
        s.handle_timeout(6 * TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(9, 2)]);
    }

    /// With `max_recovery_timeout_ns` above `recovery_timeout_ns`, the wait
    /// before asking again follows the measured repair time (a repair that
    /// takes longer than the configured least wait is not asked for again
    /// while it is on its way), backs off when unanswered, and stays within
    /// the most.
    #[test]
    fn retry_wait_follows_the_measured_repair_time_and_backs_off() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 8);
        let mut s = announced(SubscriberConfig {
            max_recovery_timeout_ns: 10 * TIMEOUT,
            max_retries: 10,
            ..cfg()
        });
        let mut app = App::default();
        assert_eq!(s.retry_wait_ns(), TIMEOUT, "no sample yet: the least");
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        // The repair takes 1.5 timeouts: asked again after one, and the
        // wait doubles.
        s.handle_timeout(TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        assert_eq!(s.retry_wait_ns(), 2 * TIMEOUT);
        s.on_datagram(1500, Line::A, &ds[1], &mut app);
        assert_eq!(app.seqs, (1..=6).collect::<Vec<_>>());
        assert_eq!(s.repair_time_ns(), 0, "a retried request is no sample");
        // The next hole waits the doubled time, so its 1.5-timeout repair
        // arrives before it is asked again, and is a sample.
        s.on_datagram(2000, Line::A, &ds[4], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(7, 2)]);
        s.handle_timeout(3499, &mut app);
        assert!(transmits(&mut s).is_empty(), "the repair may still come");
        s.on_datagram(3500, Line::A, &ds[3], &mut app);
        assert_eq!(app.seqs, (1..=10).collect::<Vec<_>>());
        assert_eq!(s.repair_time_ns(), 1500);
        // srtt 1500, deviation 750: 1500 + 4 * 750.
        assert_eq!(s.retry_wait_ns(), 4500);
        assert_eq!(s.counters().timeouts, 1);
        // Unanswered: 4.5, then 9, then capped at 10 timeouts.
        s.on_datagram(4000, Line::A, &ds[6], &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(11, 2)]);
        for (quiet, ask) in [(8499, 8500), (17_499, 17_500), (27_499, 27_500)] {
            s.handle_timeout(quiet, &mut app);
            assert!(transmits(&mut s).is_empty(), "at {quiet}");
            s.handle_timeout(ask, &mut app);
            assert_eq!(transmits(&mut s), vec![retransmit(11, 2)], "at {ask}");
        }
        assert_eq!(s.retry_wait_ns(), 10 * TIMEOUT);
        // Fixed when the most is not above the least.
        let mut fixed = announced(SubscriberConfig {
            max_recovery_timeout_ns: TIMEOUT / 2,
            ..cfg()
        });
        let mut other = App::default();
        fixed.on_datagram(0, Line::A, &ds[0], &mut other);
        fixed.on_datagram(0, Line::A, &ds[2], &mut other);
        fixed.handle_timeout(TIMEOUT, &mut other);
        fixed.on_datagram(5 * TIMEOUT, Line::A, &ds[1], &mut other);
        assert_eq!(fixed.retry_wait_ns(), TIMEOUT);
    }

    #[test]
    fn not_available_is_unrecoverable_with_exact_range() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 6);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[5], &mut app); // hole [3,11)
        assert_eq!(transmits(&mut s), vec![retransmit(3, 8)]);
        s.on_recovery(1, &not_available(3, 4, 7), &mut app);
        assert_eq!(
            events(&mut s),
            vec![
                Event::UnrecoverableLoss { from: 3, to: 7 },
                Event::ResyncStarted
            ]
        );
        assert_eq!(s.phase(), Phase::Resyncing);
    }

    #[test]
    fn large_holes_are_requested_in_pieces() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 6);
        let mut s = announced(SubscriberConfig {
            max_request_messages: 3,
            max_outstanding: 4,
            ..cfg()
        });
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        s.on_datagram(0, Line::A, &ds[5], &mut app);
        // Hole [3, 11): 8 messages in requests of at most 3.
        assert_eq!(
            transmits(&mut s),
            vec![retransmit(3, 3), retransmit(6, 3), retransmit(9, 2)]
        );
    }

    #[test]
    fn heartbeat_reveals_a_lost_tail() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 2);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        let hb = p.heartbeat().to_vec();
        s.on_datagram(1, Line::A, &hb, &mut app);
        assert_eq!(transmits(&mut s), vec![retransmit(3, 2)]);
        s.on_datagram(1, Line::B, &hb, &mut app);
        assert!(transmits(&mut s).is_empty(), "no second request");
        assert_eq!(s.counters().gaps_detected, 1);
    }
}
