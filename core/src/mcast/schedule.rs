//! When the publisher's datagrams go out: pacing of flushed datagrams and
//! heartbeats when the stream is idle. An I/O-free state machine beside
//! [`PublisherState`] (which owns the bytes): it takes `now` and hands back
//! what to send next; the multicast shell ([`super::io`]) and the
//! simulator (`core/tests/mcast_sim.rs`) both drive it, so the simulated
//! schedule is the shipped one.
//!
//! The rules:
//! - every sealed datagram goes out once, in order, as fast as the
//!   [`Pacer`] (`pacing.max_datagrams_per_sec`, `pacing.burst`) allows; a
//!   datagram the history overwrote before pacing let it out is skipped and
//!   counted (`unsent_overwritten`);
//! - when everything sealed has gone out and nothing was sent for
//!   `heartbeat_interval_ns`, a heartbeat (the next sequence, no messages)
//!   goes out, so subscribers detect a lost tail. Heartbeats are decided in
//!   [`handle_timeout`](SendSchedule::handle_timeout) only: a flush or a
//!   publish never sends one.
//!
//! The caller sends what [`poll_transmit`](SendSchedule::poll_transmit)
//! returns and confirms a datagram with [`sent`](SendSchedule::sent); one
//! it could not take (its send ring full) is offered again by the next
//! call, pacing permitting.

use super::publisher::{Pacer, PublisherState};
use crate::clock::Mono;

/// What to send next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transmit<'a> {
    /// A flushed datagram of the history, byte for byte; confirm it with
    /// [`SendSchedule::sent`]`(now, end)` once taken.
    Datagram {
        /// One past its last sequence.
        end: u64,
        /// Its bytes (in the history: no copy).
        bytes: &'a [u8],
    },
    /// A heartbeat (counted as sent whether or not the caller could take it:
    /// the next one follows an interval later).
    Heartbeat(&'a [u8]),
}

/// Counters of the schedule (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScheduleCounters {
    /// Datagrams confirmed sent.
    pub datagrams_sent: u64,
    /// Heartbeats handed out.
    pub heartbeats: u64,
    /// Times flushed datagrams were overwritten in the history before
    /// pacing let them out (the stream skipped ahead; subscribers recover
    /// or resync).
    pub unsent_overwritten: u64,
}

/// The publisher's send schedule. See the module documentation.
#[derive(Debug, Clone, Copy)]
pub struct SendSchedule {
    pacer: Pacer,
    /// First sequence not yet sent.
    sent_upto: u64,
    /// Time of the last datagram or heartbeat sent.
    last_send: u64,
    heartbeat_interval_ns: u64,
    heartbeat_due: bool,
    counters: ScheduleCounters,
}

impl SendSchedule {
    /// A schedule for a publisher whose next sequence is `next_seq`:
    /// `rate_per_sec` datagrams a second in bursts of `burst` (0: unpaced),
    /// heartbeats after `heartbeat_interval_ns` of silence.
    pub fn new(next_seq: u64, rate_per_sec: u64, burst: u64, heartbeat_interval_ns: u64) -> Self {
        SendSchedule {
            pacer: Pacer::new(rate_per_sec, burst),
            sent_upto: next_seq,
            last_send: 0,
            heartbeat_interval_ns,
            heartbeat_due: false,
            counters: ScheduleCounters::default(),
        }
    }

    /// First sequence not sent yet.
    pub fn sent_upto(&self) -> u64 {
        self.sent_upto
    }
    /// Counters.
    pub fn counters(&self) -> ScheduleCounters {
        self.counters
    }

    /// Flushed datagrams not sent yet (waiting for pacing or send slots).
    pub fn unsent_datagrams(&self, state: &PublisherState) -> u64 {
        let mut n = 0;
        let mut seq = self.sent_upto;
        while let Some((_, end, _)) = state.sealed_from(seq) {
            n += 1;
            seq = end;
        }
        n
    }

    /// Whether everything flushed has been sent.
    pub fn idle(&self, state: &PublisherState) -> bool {
        self.sent_upto == state.unflushed_seq()
    }

    /// The next thing to send at `now`: the oldest unsent datagram if pacing
    /// allows it (taking the pacing slot), else a heartbeat if
    /// [`handle_timeout`](Self::handle_timeout) found one due, else nothing.
    pub fn poll_transmit<'a>(
        &mut self,
        now: u64,
        state: &'a mut PublisherState,
    ) -> Option<Transmit<'a>> {
        if let Some((first, _, _)) = state.sealed_from(self.sent_upto) {
            if first > self.sent_upto {
                // Overwritten before it went out: skip to what is left, once.
                self.counters.unsent_overwritten += 1;
                self.sent_upto = first;
            }
            if !self.pacer.try_acquire(now) {
                return None;
            }
            let (_, end, bytes) = state.sealed_from(self.sent_upto)?;
            return Some(Transmit::Datagram { end, bytes });
        }
        if self.heartbeat_due {
            self.heartbeat_due = false;
            self.last_send = now;
            self.counters.heartbeats += 1;
            return Some(Transmit::Heartbeat(state.heartbeat()));
        }
        None
    }

    /// The sealed datagram up to `end` the last
    /// [`poll_transmit`](Self::poll_transmit) handed out was taken by the
    /// send ring (or cannot ever be: it counts as sent either way).
    pub fn sent(&mut self, now: u64, end: u64) {
        self.sent_upto = end;
        self.last_send = now;
        self.counters.datagrams_sent += 1;
    }

    /// The latency path, which posts the one datagram just sealed straight
    /// from the history instead of through
    /// [`poll_transmit`](Self::poll_transmit): takes the pacing slot for
    /// the datagram starting at `first` if it is the next one due and
    /// pacing allows; confirm it with [`sent`](Self::sent) once posted.
    /// `false`: nothing changed.
    pub fn try_direct(&mut self, now: u64, first: u64) -> bool {
        first == self.sent_upto && self.pacer.try_acquire(now)
    }

    /// Timers: a heartbeat is due once everything flushed was sent and
    /// nothing went out for the heartbeat interval.
    pub fn handle_timeout(&mut self, now: u64, state: &PublisherState) {
        if self.idle(state) && now.saturating_sub(self.last_send) >= self.heartbeat_interval_ns {
            self.heartbeat_due = true;
        }
    }

    /// When to call [`poll_transmit`](Self::poll_transmit) (unsent
    /// datagrams: when pacing allows the next) or
    /// [`handle_timeout`](Self::handle_timeout) (idle: when the heartbeat
    /// falls due). Always `Some`: an idle publisher still owes a
    /// heartbeat; a deadline at or before `now` is due at once.
    pub fn poll_timeout(&self, state: &PublisherState) -> Option<Mono> {
        Some(Mono::from_nanos(if self.heartbeat_due {
            0
        } else if self.idle(state) {
            self.last_send.saturating_add(self.heartbeat_interval_ns)
        } else {
            self.pacer.next_allowed(0)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcast::publisher::PublisherConfig;
    use crate::mcast::wire::Datagram;

    fn publisher(depth: usize) -> PublisherState {
        PublisherState::new(PublisherConfig {
            channel: 1,
            session: 5,
            max_datagram: 64,
            max_messages: 1,
            flush_interval_ns: 0,
            history_depth: depth,
            max_message_bytes: 0,
        })
    }

    /// Sends everything due at `now`; returns (datagram ends, heartbeats).
    fn drain(s: &mut SendSchedule, p: &mut PublisherState, now: u64) -> (Vec<u64>, usize) {
        let (mut ends, mut hbs) = (Vec::new(), 0);
        while let Some(t) = s.poll_transmit(now, p) {
            match t {
                Transmit::Datagram { end, bytes } => {
                    assert!(!Datagram::parse(bytes).unwrap().is_heartbeat());
                    s.sent(now, end);
                    ends.push(end);
                }
                Transmit::Heartbeat(b) => {
                    assert!(Datagram::parse(b).unwrap().is_heartbeat());
                    hbs += 1;
                }
            }
        }
        (ends, hbs)
    }

    #[test]
    fn heartbeat_only_after_an_idle_interval() {
        let mut p = publisher(16);
        let mut s = SendSchedule::new(p.next_seq(), 0, 1, 1_000);
        s.handle_timeout(1_000, &p);
        assert_eq!(
            drain(&mut s, &mut p, 1_000),
            (vec![], 1),
            "idle from the start"
        );
        s.handle_timeout(1_500, &p);
        assert_eq!(drain(&mut s, &mut p, 1_500), (vec![], 0));
        assert_eq!(s.poll_timeout(&p), Some(Mono::from_nanos(2_000)));
        // Data resets the idle clock; a heartbeat never jumps the queue.
        let _ = p.publish_flushing(b"x").unwrap();
        p.flush();
        s.handle_timeout(2_000, &p);
        assert_eq!(drain(&mut s, &mut p, 2_000), (vec![2], 0));
        s.handle_timeout(2_999, &p);
        assert_eq!(drain(&mut s, &mut p, 2_999), (vec![], 0));
        s.handle_timeout(3_000, &p);
        assert_eq!(drain(&mut s, &mut p, 3_000), (vec![], 1));
        assert_eq!(s.counters().heartbeats, 2);
        assert_eq!(p.counters().heartbeats, 2);
    }

    #[test]
    fn pacing_holds_datagrams_and_no_heartbeat_while_any_wait() {
        let mut p = publisher(16);
        // One per µs, bursts of 2.
        let mut s = SendSchedule::new(p.next_seq(), 1_000_000, 2, 500);
        for _ in 0..4 {
            let _ = p.publish_flushing(b"m").unwrap();
            p.flush();
        }
        assert_eq!(s.unsent_datagrams(&p), 4);
        s.handle_timeout(10_000, &p);
        assert_eq!(drain(&mut s, &mut p, 10_000), (vec![2, 3], 0));
        assert_eq!(s.poll_timeout(&p), Some(Mono::from_nanos(11_000)));
        s.handle_timeout(11_000, &p);
        assert_eq!(drain(&mut s, &mut p, 11_000), (vec![4], 0));
        assert_eq!(drain(&mut s, &mut p, 12_000), (vec![5], 0));
        assert!(s.idle(&p));
        assert_eq!(s.counters().datagrams_sent, 4);
    }

    #[test]
    fn a_datagram_not_taken_is_offered_again() {
        let mut p = publisher(16);
        let mut s = SendSchedule::new(p.next_seq(), 0, 1, 500);
        let _ = p.publish_flushing(b"m").unwrap();
        p.flush();
        assert!(matches!(
            s.poll_transmit(0, &mut p),
            Some(Transmit::Datagram { end: 2, .. })
        ));
        // The send ring was full: not confirmed.
        assert!(matches!(
            s.poll_transmit(0, &mut p),
            Some(Transmit::Datagram { end: 2, .. })
        ));
        s.sent(0, 2);
        assert_eq!(s.poll_transmit(0, &mut p), None);
    }

    #[test]
    fn overwritten_before_sending_is_skipped_once() {
        let mut p = publisher(2);
        let mut s = SendSchedule::new(p.next_seq(), 0, 1, 500);
        for _ in 0..5 {
            let _ = p.publish_flushing(b"m").unwrap();
            p.flush();
        }
        // Datagrams 1..=3 are gone; 4 and 5 remain.
        assert_eq!(drain(&mut s, &mut p, 0), (vec![5, 6], 0));
        assert_eq!(s.counters().unsent_overwritten, 1);
    }

    #[test]
    fn direct_send_takes_the_pacing_slot() {
        let mut p = publisher(16);
        let mut s = SendSchedule::new(p.next_seq(), 1_000_000, 1, 500);
        let _ = p.publish_flushing(b"m").unwrap();
        p.flush();
        assert!(!s.try_direct(0, 2), "not the next one due");
        assert!(s.try_direct(0, 1));
        s.sent(0, 2);
        let _ = p.publish_flushing(b"m").unwrap();
        p.flush();
        assert!(!s.try_direct(0, 2), "paced");
        assert!(s.try_direct(1_000, 2));
    }
}
