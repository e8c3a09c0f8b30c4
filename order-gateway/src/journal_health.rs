//! When the driver may touch a journal that failed: the degraded-mode probe and the
//! rotation back-off, as an I/O-free machine in the gateway's one contract
//! ([`crate::gateway`]): events in (`handle_*`), decisions out (`poll_*`),
//! [`JournalHealth::poll_timeout`] for the next time anything is due, all on [`Mono`] time
//! the shell reads once per turn. It owns no file: the driver does the appends, probes and
//! rotations it is told are due and reports how they went.
//!
//! Monotonic time, not wall: these are live-only timers (nothing here is journaled), and a
//! step of the wall clock must neither hold a degraded gateway down nor retry a failing
//! rotation on every turn.

use std::time::Duration;

use rocebus::clock::Mono;

/// How often a degraded gateway checks whether the journal can be written again.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// The wait before retrying a failed rotation; it doubles per failure up to
/// [`ROTATION_BACKOFF_MAX`], so a rotation that keeps failing (a full disk, a directory in
/// the way) costs one checkpoint build and one log line per attempt, not per loop turn.
pub const ROTATION_BACKOFF_MIN: Duration = Duration::from_secs(1);
/// The longest wait between rotation attempts.
pub const ROTATION_BACKOFF_MAX: Duration = Duration::from_secs(60);

/// The journal's health as far as the driver's retries go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalHealth {
    /// Set while the journal cannot be written: when the next probe is due.
    pub(crate) next_probe: Option<Mono>,
    /// After a failed rotation: when the next may be tried, and the wait after that one.
    pub(crate) rotation_retry: Option<(Mono, Duration)>,
}

impl JournalHealth {
    /// True while the journal cannot be written (requests are not taken, the venue stays
    /// disconnected).
    pub fn is_degraded(&self) -> bool {
        self.next_probe.is_some()
    }

    /// An append (or its rollback's rebuild) failed at `now`: degraded, first probe one
    /// [`PROBE_INTERVAL`] later.
    pub fn handle_append_failed(&mut self, now: Mono) {
        self.next_probe = Some(now + PROBE_INTERVAL);
    }

    /// Whether a probe of the journal is due at `now`.
    pub fn poll_probe(&self, now: Mono) -> bool {
        self.next_probe.is_some_and(|at| now >= at)
    }

    /// A probe at `now` found the journal writable (`ok`) or not: healthy again, or the
    /// next probe one interval later.
    pub fn handle_probe(&mut self, ok: bool, now: Mono) {
        self.next_probe = if ok { None } else { Some(now + PROBE_INTERVAL) };
    }

    /// Whether a rotation may be tried at `now`: not degraded, and any back-off elapsed.
    pub fn poll_rotation(&self, now: Mono) -> bool {
        !self.is_degraded() && self.rotation_retry.is_none_or(|(at, _)| now >= at)
    }

    /// A rotation at `now` succeeded (the back-off ends) or failed: returns the wait before
    /// the next attempt (1 s, doubling to 60 s).
    pub fn handle_rotation(&mut self, ok: bool, now: Mono) -> Duration {
        if ok {
            self.rotation_retry = None;
            return Duration::ZERO;
        }
        let wait = self.rotation_retry.map_or(ROTATION_BACKOFF_MIN, |(_, w)| w);
        self.rotation_retry = Some((now + wait, (wait * 2).min(ROTATION_BACKOFF_MAX)));
        wait
    }

    /// The earliest time anything here is due: the next probe, or the next rotation
    /// attempt (none: nothing waits on time).
    pub fn poll_timeout(&self) -> Option<Mono> {
        match (self.next_probe, self.rotation_retry.map(|(at, _)| at)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Mono {
        Mono::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn a_degraded_journal_is_probed_every_interval_until_it_recovers() {
        let mut h = JournalHealth::default();
        assert!(!h.is_degraded() && h.poll_timeout().is_none());
        h.handle_append_failed(at(1_000));
        assert!(h.is_degraded());
        assert!(!h.poll_probe(at(1_499)));
        assert!(h.poll_probe(at(1_500)));
        assert_eq!(h.poll_timeout(), Some(at(1_500)));
        h.handle_probe(false, at(1_500));
        assert!(!h.poll_probe(at(1_999)) && h.poll_probe(at(2_000)));
        h.handle_probe(true, at(2_000));
        assert!(!h.is_degraded() && h.poll_timeout().is_none());
    }

    #[test]
    fn a_failing_rotation_backs_off_doubling_to_a_minute_and_resets_on_success() {
        let mut h = JournalHealth::default();
        assert!(h.poll_rotation(at(0)));
        let mut t = 0;
        for expect in [1, 2, 4, 8, 16, 32, 60, 60] {
            assert_eq!(h.handle_rotation(false, at(t)), Duration::from_secs(expect));
            let due = t + expect * 1_000;
            assert!(!h.poll_rotation(at(due - 1)));
            assert!(h.poll_rotation(at(due)));
            assert_eq!(h.poll_timeout(), Some(at(due)));
            t = due;
        }
        h.handle_rotation(true, at(t));
        assert!(h.poll_rotation(at(t)) && h.poll_timeout().is_none());
        // Degraded: no rotation whatever the back-off says.
        h.handle_append_failed(at(t));
        assert!(!h.poll_rotation(at(t + 3_600_000)));
    }

    #[test]
    fn the_timeout_is_the_earliest_of_probe_and_rotation_retry() {
        let mut h = JournalHealth::default();
        h.handle_rotation(false, at(0)); // retry at 1 s
        h.handle_append_failed(at(100)); // probe at 600 ms
        assert_eq!(h.poll_timeout(), Some(at(600)));
        h.handle_probe(true, at(600));
        assert_eq!(h.poll_timeout(), Some(at(1_000)));
    }
}
