//! How the publisher answers retransmit requests: by unicast to the one
//! subscriber that asked, or by one multicast retransmit that every
//! subscriber takes. An I/O-free state machine: it takes requests and `now`
//! and hands back decisions; [`super::io`] does the sending.
//!
//! A loss on the publisher's egress (or anywhere before the fabric fans the
//! datagram out) is a loss for every subscriber, and each asks for the same
//! range at about the same time. Answered one by one, N subscribers cost N
//! repairs of one loss. The planner instead:
//!
//! - answers a request by unicast at once when it is the only subscriber,
//!   when multicast repair is off, or while losses have not been seen to be
//!   shared (so a subscriber that lost a datagram on its own gets its repair
//!   at once and the others see nothing);
//! - turns a second request for a range already answered by unicast to
//!   another subscriber within `window_ns` into one multicast retransmit of
//!   it (the loss is shared: the others are probably missing it too), and
//!   counts that as evidence that losses are shared;
//! - while the recent evidence says losses are shared (a small score, raised
//!   by each shared loss and lowered by each range that only one subscriber
//!   asked for within the window), answers a first request by multicast at
//!   once, so a shared loss costs one repair whatever the number of
//!   subscribers;
//! - drops a request (counted `covered`) whose range a multicast retransmit
//!   sent within the window already covers, when that subscriber had not
//!   asked for it before: its copy is on its way;
//! - drops a request (counted `suppressed`) for a range answered to the
//!   same subscriber (by unicast, or by a multicast retransmit it asked
//!   for or was covered by) less than `holdoff_ns` ago: a retry that crossed
//!   the answer in flight (the subscriber's wait was shorter than the
//!   answer's trip), whose answer will arrive;
//! - answers a request for a range answered to the same subscriber longer
//!   than `holdoff_ns` ago by unicast (counted `retries`): the answer was
//!   lost, or is stuck behind the subscriber's receive queue; a unicast
//!   answer comes on the recovery connection, which the subscriber reads at
//!   once (and whose silence for a few retries in a row it takes for a dead
//!   link).
//!
//! The multicast retransmit is the original datagram, byte for byte (its tag
//! still verifies): subscribers take it as a normal datagram, fill their
//! hole with it, and drop it by sequence if they had it.
//!
//! The planner decides how, not how much: the recovery server
//! ([`super::server`]) charges every answer it decides, unicast or
//! multicast, to the repair budget of the connection that asked, cuts each
//! request to `repair_request_bytes`, and paces multicast retransmits; the
//! bound on what one admitted peer can make the publisher send is stated
//! there.

use arrayvec::ArrayVec;

/// Static parameters of the planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepairConfig {
    /// Answer shared losses by multicast; false answers every request by
    /// unicast (one repair per subscriber per loss).
    pub multicast: bool,
    /// How long a repair is remembered: requests of other subscribers for
    /// the same range within this time are the same loss.
    pub window_ns: u64,
    /// A subscriber's request for a range answered to it less than this
    /// long ago is dropped (a retry that crossed the answer, which is on its
    /// way); later, it is answered again. About the round trip to the
    /// subscribers plus the time they take to read the answer; effectively
    /// at most `window_ns` (repairs are forgotten after it). 0: every retry
    /// is answered.
    pub holdoff_ns: u64,
}

/// What to do with one request (or the part of it not yet covered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepairDecision {
    /// Answer `[from, to)` to the requester over its recovery connection.
    Unicast {
        /// First sequence.
        from: u64,
        /// One past the last.
        to: u64,
    },
    /// `[from, to)` is queued for one multicast retransmit
    /// ([`RepairPlanner::poll_transmit`]); nothing to answer the requester.
    Multicast {
        /// First sequence.
        from: u64,
        /// One past the last.
        to: u64,
    },
    /// A multicast retransmit within the window already covers it.
    Covered,
    /// An answer to this subscriber sent less than `holdoff_ns` ago covers
    /// it (at least part of it, the rest being covered): it is on its way.
    Suppressed,
}

/// Planner counters (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairCounters {
    /// Requests planned.
    pub requests: u64,
    /// Requests answered by unicast.
    pub unicast: u64,
    /// Ranges queued for a multicast retransmit.
    pub multicast: u64,
    /// Requests dropped because a recent multicast retransmit covered them.
    pub covered: u64,
    /// Requests for a range another subscriber had asked for within the
    /// window (evidence of a shared loss).
    pub shared: u64,
    /// Requests for a range answered to the same subscriber longer than
    /// the holdoff ago (its answer was lost), answered again.
    pub retries: u64,
    /// Requests dropped because an answer sent to the same subscriber less
    /// than the holdoff ago covers them (retries that crossed the answer).
    pub suppressed: u64,
}

#[derive(Debug, Clone, Copy)]
struct Record {
    from: u64,
    to: u64,
    at: u64,
    multicast: bool,
    /// Bit `id % 64` of every subscriber that asked for (part of) it.
    askers: u64,
    /// Bit of the subscriber a unicast answer went to; every bit for a
    /// multicast retransmit.
    answered: u64,
    /// Already counted into the score when it expired.
    settled: bool,
}

/// Repairs remembered at once (the oldest is forgotten first): a window
/// of seconds (emulated guests run that far apart) at a few losses a
/// second.
const RECORDS: usize = 256;
/// Multicast ranges waiting for the I/O layer.
const PENDING: usize = 64;
/// Highest score; losses count as shared from [`SHARED_AT`] on.
const SCORE_MAX: u8 = 8;
const SHARED_AT: u8 = 2;

/// The planner. See the module documentation.
#[derive(Debug)]
pub struct RepairPlanner {
    cfg: RepairConfig,
    /// Ring of recent repairs, oldest at `next`.
    records: ArrayVec<Record, RECORDS>,
    next: usize,
    pending: ArrayVec<(u64, u64), PENDING>,
    score: u8,
    counters: RepairCounters,
}

fn bit(id: u32) -> u64 {
    1 << (id % 64)
}

/// How a remembered repair bears on one subscriber's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bearing {
    /// It does not cover the request.
    None,
    /// A multicast retransmit the subscriber had not asked for: its copy is
    /// on its way.
    Covered,
    /// An answer to this subscriber, sent within the holdoff.
    Suppressed,
}

impl RepairPlanner {
    /// A planner with nothing remembered.
    pub fn new(cfg: RepairConfig) -> Self {
        RepairPlanner {
            cfg,
            records: ArrayVec::new(),
            next: 0,
            pending: ArrayVec::new(),
            score: 0,
            counters: RepairCounters::default(),
        }
    }

    /// Counters so far.
    pub fn counters(&self) -> RepairCounters {
        self.counters
    }

    /// Whether losses currently count as shared (first requests go
    /// multicast).
    pub fn shared_mode(&self) -> bool {
        self.score >= SHARED_AT
    }

    fn bearing(&self, r: &Record, me: u64, now: u64) -> Bearing {
        let fresh = now.saturating_sub(r.at) < self.cfg.holdoff_ns;
        if r.multicast && r.askers & me == 0 {
            // It never asked: its copy is on its way (or arrived).
            Bearing::Covered
        } else if r.answered & me != 0 && fresh {
            Bearing::Suppressed
        } else {
            Bearing::None
        }
    }

    /// Plans the answer to subscriber `id`'s request for `[from, to)`;
    /// `subscribers` is how many are connected. The caller has checked that
    /// the range is ours and still in the history (what is not goes by
    /// unicast, with its NotAvailable).
    pub fn on_request(
        &mut self,
        now: u64,
        id: u32,
        from: u64,
        to: u64,
        subscribers: usize,
    ) -> RepairDecision {
        self.handle_timeout(now);
        self.counters.requests += 1;
        if from >= to {
            self.counters.unicast += 1;
            return RepairDecision::Unicast { from, to };
        }
        let me = bit(id);
        // Trim, from both ends, what answers on their way cover.
        let (mut a, mut b) = (from, to);
        // Whether an answer to this subscriber (not only a copy it never
        // asked for) covered part of it.
        let mut suppressed = false;
        loop {
            let before = (a, b);
            for i in 0..self.records.len() {
                let r = self.records[i];
                let how = self.bearing(&r, me, now);
                if how == Bearing::None || a >= b {
                    continue;
                }
                let trimmed = if r.from <= a && a < r.to {
                    a = r.to.min(b);
                    true
                } else if r.from < b && b <= r.to {
                    b = r.from.max(a);
                    true
                } else {
                    false
                };
                if trimmed {
                    suppressed |= how == Bearing::Suppressed;
                    // Its copy was due to this one too: a later request
                    // of it for the range is a retry.
                    self.records[i].askers |= me;
                }
            }
            if (a, b) == before || a >= b {
                break;
            }
        }
        if a >= b {
            if suppressed {
                self.counters.suppressed += 1;
                return RepairDecision::Suppressed;
            }
            self.counters.covered += 1;
            return RepairDecision::Covered;
        }
        // Asked before and answered past the holdoff: the answer was lost
        // (or is stuck behind the subscriber's receive queue), and it is
        // answered by unicast, on the recovery connection, whose answers
        // the subscriber reads at once and takes as a sign the link lives.
        let retry = self
            .records
            .iter()
            .any(|r| r.askers & me != 0 && r.from < b && a < r.to);
        if retry {
            self.counters.retries += 1;
        }
        if retry || !self.cfg.multicast || subscribers <= 1 {
            // Remembered for the holdoff only: nothing is shared.
            self.remember(Record {
                from: a,
                to: b,
                at: now,
                multicast: false,
                askers: me,
                answered: me,
                settled: true,
            });
            self.counters.unicast += 1;
            return RepairDecision::Unicast { from: a, to: b };
        }
        // Did another subscriber ask for part of it (answered by unicast)?
        let mut shared = false;
        for r in self.records.iter_mut().filter(|r| !r.multicast) {
            if r.from < b && a < r.to && r.askers & !me != 0 {
                shared = true;
                r.askers |= me;
                // Counted into the score now, not again when it expires.
                r.settled = true;
            }
        }
        if shared {
            self.counters.shared += 1;
            self.score = (self.score + 1).min(SCORE_MAX);
        }
        if (shared || self.shared_mode()) && !self.pending.is_full() {
            // Only the askers of this range know of it: a record with the
            // unicast askers folded in keeps their retries apart.
            let askers = self
                .records
                .iter()
                .filter(|r| !r.multicast && r.from < b && a < r.to)
                .fold(me, |m, r| m | r.askers);
            self.pending.push((a, b));
            self.remember(Record {
                from: a,
                to: b,
                at: now,
                multicast: true,
                askers,
                answered: u64::MAX,
                settled: shared,
            });
            self.counters.multicast += 1;
            return RepairDecision::Multicast { from: a, to: b };
        }
        self.remember(Record {
            from: a,
            to: b,
            at: now,
            multicast: false,
            askers: me,
            answered: me,
            settled: false,
        });
        self.counters.unicast += 1;
        RepairDecision::Unicast { from: a, to: b }
    }

    /// The next range to retransmit on multicast, if any.
    pub fn poll_transmit(&mut self) -> Option<(u64, u64)> {
        if self.pending.is_empty() {
            None
        } else {
            Some(self.pending.remove(0))
        }
    }

    /// Forgets repairs older than the window; each one only its first asker
    /// wanted lowers the shared score, each several wanted raises it.
    pub fn handle_timeout(&mut self, now: u64) {
        let window = self.cfg.window_ns;
        let mut score = self.score;
        self.records.retain(|r| {
            if now.saturating_sub(r.at) < window {
                return true;
            }
            if !r.settled {
                if r.askers.count_ones() > 1 {
                    score = (score + 1).min(SCORE_MAX);
                } else {
                    score = score.saturating_sub(1);
                }
            }
            false
        });
        self.score = score;
        self.next = self.next.min(self.records.len());
    }

    fn remember(&mut self, r: Record) {
        if self.records.is_full() {
            // Settle the oldest as if it had expired.
            let i = self.next % RECORDS;
            let old = self.records[i];
            if !old.settled && old.askers.count_ones() <= 1 {
                self.score = self.score.saturating_sub(1);
            }
            self.records[i] = r;
            self.next = (i + 1) % RECORDS;
        } else {
            self.records.push(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000_000;
    /// Holdoff: a tenth of the window.
    const H: u64 = W / 10;

    fn planner() -> RepairPlanner {
        RepairPlanner::new(RepairConfig {
            multicast: true,
            window_ns: W,
            holdoff_ns: H,
        })
    }

    fn is_repair(d: RepairDecision) -> bool {
        matches!(
            d,
            RepairDecision::Unicast { .. } | RepairDecision::Multicast { .. }
        )
    }

    #[test]
    fn a_single_subscriber_gets_unicast_at_once() {
        let mut p = planner();
        for i in 0..10 {
            let at = i * 10 * W;
            assert_eq!(
                p.on_request(at, 1, 100 + i, 101 + i, 1),
                RepairDecision::Unicast {
                    from: 100 + i,
                    to: 101 + i
                }
            );
        }
        assert_eq!(p.poll_transmit(), None);
        assert_eq!(p.counters().multicast, 0);
    }

    #[test]
    fn an_individual_loss_stays_unicast_among_many() {
        let mut p = planner();
        for i in 0..20 {
            // Each loss is one subscriber's own.
            let at = i * 10 * W;
            let d = p.on_request(at, (i % 3) as u32, 10 * i, 10 * i + 2, 3);
            assert_eq!(
                d,
                RepairDecision::Unicast {
                    from: 10 * i,
                    to: 10 * i + 2
                }
            );
        }
        assert!(!p.shared_mode());
    }

    #[test]
    fn a_second_asker_turns_it_into_one_multicast_and_the_third_is_covered() {
        let mut p = planner();
        assert_eq!(
            p.on_request(0, 1, 50, 52, 3),
            RepairDecision::Unicast { from: 50, to: 52 }
        );
        assert_eq!(
            p.on_request(10, 2, 50, 52, 3),
            RepairDecision::Multicast { from: 50, to: 52 }
        );
        assert_eq!(p.poll_transmit(), Some((50, 52)));
        assert_eq!(p.poll_transmit(), None);
        assert_eq!(p.on_request(20, 3, 50, 52, 3), RepairDecision::Covered);
        let c = p.counters();
        assert_eq!((c.unicast, c.multicast, c.covered, c.shared), (1, 1, 1, 1));
    }

    #[test]
    fn shared_losses_go_multicast_first_and_cost_one_repair_each() {
        let mut p = planner();
        let mut repairs = 0;
        for i in 0..100u64 {
            let at = i * 10 * W;
            for id in 1..=3 {
                match p.on_request(at + u64::from(id), id, 10 * i, 10 * i + 1, 3) {
                    RepairDecision::Unicast { .. } | RepairDecision::Multicast { .. } => {
                        repairs += 1
                    }
                    RepairDecision::Covered | RepairDecision::Suppressed => {}
                }
            }
            while p.poll_transmit().is_some() {}
        }
        // Two losses of warm-up at two repairs each, then one per loss.
        assert!(repairs <= 102, "{repairs} repairs for 100 shared losses");
        assert!(p.shared_mode());
    }

    #[test]
    fn shared_mode_decays_when_losses_become_individual() {
        let mut p = planner();
        for i in 0..4u64 {
            p.on_request(i * 10 * W, 1, 10 * i, 10 * i + 1, 2);
            p.on_request(i * 10 * W + 1, 2, 10 * i, 10 * i + 1, 2);
        }
        assert!(p.shared_mode());
        let mut unicast = 0;
        for i in 10..40u64 {
            if let RepairDecision::Unicast { .. } =
                p.on_request(i * 10 * W, 1, 10 * i, 10 * i + 1, 2)
            {
                unicast += 1;
            }
        }
        p.handle_timeout(100 * 10 * W);
        assert!(!p.shared_mode());
        assert!(unicast > 20, "{unicast}");
    }

    #[test]
    fn a_retry_that_crossed_the_multicast_is_suppressed_a_later_one_answered() {
        let mut p = planner();
        p.on_request(0, 1, 5, 6, 2);
        assert!(matches!(
            p.on_request(1, 2, 5, 6, 2),
            RepairDecision::Multicast { .. }
        ));
        // Subscriber 2 asks again before the copy could have reached it.
        assert_eq!(p.on_request(H, 2, 5, 6, 2), RepairDecision::Suppressed);
        // Subscriber 1 too, for the unicast answer on its way.
        assert_eq!(p.on_request(H, 1, 5, 6, 2), RepairDecision::Suppressed);
        let c = p.counters();
        assert_eq!((c.suppressed, c.retries), (2, 0));
        // Past the holdoff the copy was lost: answered again, by unicast.
        assert_eq!(
            p.on_request(H + 1, 2, 5, 6, 2),
            RepairDecision::Unicast { from: 5, to: 6 }
        );
        assert_eq!(p.counters().retries, 1);
    }

    #[test]
    fn a_single_subscribers_retry_crossing_its_answer_is_suppressed() {
        let mut p = planner();
        assert_eq!(
            p.on_request(0, 1, 5, 8, 1),
            RepairDecision::Unicast { from: 5, to: 8 }
        );
        assert_eq!(p.on_request(H / 2, 1, 5, 8, 1), RepairDecision::Suppressed);
        // What the answer does not cover is answered at once.
        assert_eq!(
            p.on_request(H / 2, 1, 6, 10, 1),
            RepairDecision::Unicast { from: 8, to: 10 }
        );
        // Past the holdoff: the answer was lost, answered again.
        assert_eq!(
            p.on_request(H, 1, 5, 8, 1),
            RepairDecision::Unicast { from: 5, to: 8 }
        );
        let c = p.counters();
        assert_eq!((c.unicast, c.suppressed, c.retries), (3, 1, 1));
        // Holdoff 0: every retry is answered.
        let mut p = RepairPlanner::new(RepairConfig {
            holdoff_ns: 0,
            ..p.cfg
        });
        for t in 0..3 {
            assert_eq!(
                p.on_request(t, 1, 5, 8, 1),
                RepairDecision::Unicast { from: 5, to: 8 }
            );
        }
    }

    /// A multicast copy lost on the publisher's egress is lost for every
    /// subscriber: past the holdoff each retry is answered by unicast.
    #[test]
    fn a_lost_multicast_copy_is_answered_by_unicast_after_the_holdoff() {
        let mut p = planner();
        for i in 0..4u64 {
            for id in 1..=3 {
                p.on_request(i * 10 * W + u64::from(id), id, 10 * i, 10 * i + 1, 3);
            }
        }
        assert!(p.shared_mode());
        let t = 100 * W;
        assert_eq!(
            p.on_request(t, 1, 500, 502, 3),
            RepairDecision::Multicast { from: 500, to: 502 }
        );
        assert_eq!(p.on_request(t + 1, 2, 500, 502, 3), RepairDecision::Covered);
        assert_eq!(p.on_request(t + 2, 3, 500, 502, 3), RepairDecision::Covered);
        while p.poll_transmit().is_some() {}
        for id in 1..=3 {
            assert_eq!(
                p.on_request(t + H / 2, id, 500, 502, 3),
                RepairDecision::Suppressed
            );
        }
        let t = t + 2 * H;
        for id in 1..=3 {
            assert_eq!(
                p.on_request(t, id, 500, 502, 3),
                RepairDecision::Unicast { from: 500, to: 502 }
            );
        }
        assert_eq!(p.poll_transmit(), None);
        assert_eq!(p.counters().retries, 3);
    }

    /// Correlated loss with N = 1, 2 and 3 subscribers, where every tenth
    /// multicast copy is lost too and every fifth loss sees each
    /// subscriber's retry cross its answer: under 1.5 repairs per lost
    /// datagram (copies lost count as lost, as netem counts them).
    #[test]
    fn correlated_loss_costs_under_one_and_a_half_repairs_per_loss() {
        for n in 1..=3u32 {
            let mut p = planner();
            let (mut repairs, mut lost) = (0u64, 0u64);
            for i in 0..200u64 {
                let (from, to) = (10 * i, 10 * i + 1);
                let t = i * 10 * W;
                lost += 1;
                let mut multicast = false;
                for id in 1..=n {
                    let d = p.on_request(t + u64::from(id), id, from, to, n as usize);
                    multicast |= matches!(d, RepairDecision::Multicast { .. });
                    repairs += u64::from(is_repair(d));
                }
                if i % 5 == 0 {
                    for id in 1..=n {
                        let d = p.on_request(t + H / 2, id, from, to, n as usize);
                        assert!(!is_repair(d), "{d:?}");
                    }
                }
                if multicast && i % 10 == 3 {
                    // The copy was lost: every subscriber asks again.
                    lost += 1;
                    for id in 1..=n {
                        let d = p.on_request(t + 2 * H + u64::from(id), id, from, to, n as usize);
                        repairs += u64::from(is_repair(d));
                    }
                }
                while p.poll_transmit().is_some() {}
            }
            let per_lost = repairs as f64 / lost as f64;
            assert!(
                per_lost < 1.5,
                "{n} subscribers: {repairs} repairs for {lost} lost"
            );
            if n == 1 {
                assert_eq!(repairs, lost, "one unicast per loss");
            }
        }
    }

    #[test]
    fn partly_covered_requests_are_trimmed() {
        let mut p = planner();
        p.on_request(0, 1, 10, 20, 3);
        assert!(matches!(
            p.on_request(1, 2, 10, 20, 3),
            RepairDecision::Multicast { from: 10, to: 20 }
        ));
        // Subscriber 3 misses more: only what the multicast did not cover.
        assert_eq!(
            p.on_request(2, 3, 15, 30, 3),
            RepairDecision::Unicast { from: 20, to: 30 }
        );
        assert_eq!(
            p.on_request(3, 4, 5, 12, 4),
            RepairDecision::Unicast { from: 5, to: 10 }
        );
    }

    #[test]
    fn unicast_only_when_multicast_repair_is_off() {
        let mut p = RepairPlanner::new(RepairConfig {
            multicast: false,
            window_ns: W,
            holdoff_ns: H,
        });
        for id in 1..=3 {
            assert_eq!(
                p.on_request(id.into(), id, 7, 9, 3),
                RepairDecision::Unicast { from: 7, to: 9 }
            );
        }
        assert_eq!(p.poll_transmit(), None);
    }

    #[test]
    fn the_window_forgets() {
        let mut p = planner();
        p.on_request(0, 1, 5, 6, 2);
        assert_eq!(
            p.on_request(2 * W, 2, 5, 6, 2),
            RepairDecision::Unicast { from: 5, to: 6 }
        );
    }

    #[test]
    fn many_records_stay_bounded() {
        let mut p = planner();
        for i in 0..10_000u64 {
            p.on_request(i, (i % 5) as u32, i / 2, i / 2 + 1, 5);
            while p.poll_transmit().is_some() {}
        }
        assert!(p.records.len() <= RECORDS);
    }
}
