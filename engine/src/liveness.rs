//! Heartbeats and silence on the engine protocol, as an I/O-free state machine both ends
//! share: the gateway keeps one per logged-on engine, the engine one for its gateway.
//!
//! It takes `now` (nanoseconds, any monotonic-enough clock the caller reads) and says when a
//! heartbeat is due ([`Liveness::poll_transmit`]) and whether the peer has been silent for
//! too long ([`Liveness::is_expired`]). Any frame from the peer counts as a sign of life. It
//! owns no connection and sends nothing itself, so its decisions are tested here, without a
//! device, and the I/O shells stay thin.

/// One peer's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// Send a heartbeat this often (0: never).
    interval_ns: u64,
    /// The peer is dead after this long without a frame (0: never).
    timeout_ns: u64,
    last_heard: u64,
    last_sent: u64,
}

impl Liveness {
    /// Starts at `now` as if a frame had just been heard and a heartbeat sent.
    pub fn new(now: u64, interval_ns: u64, timeout_ns: u64) -> Liveness {
        Liveness {
            interval_ns,
            timeout_ns,
            last_heard: now,
            last_sent: now,
        }
    }

    /// A frame (any frame) arrived from the peer at `now`.
    pub fn on_heard(&mut self, now: u64) {
        self.last_heard = self.last_heard.max(now);
    }

    /// Something was sent to the peer at `now` (a heartbeat or any other frame), so no
    /// heartbeat is due before `now + interval`.
    pub fn on_sent(&mut self, now: u64) {
        self.last_sent = self.last_sent.max(now);
    }

    /// True if a heartbeat should go out now; the caller sends it and calls
    /// [`on_sent`](Self::on_sent) (a heartbeat that could not be sent is retried at the
    /// next call).
    pub fn poll_transmit(&self, now: u64) -> bool {
        self.interval_ns > 0 && now.saturating_sub(self.last_sent) >= self.interval_ns
    }

    /// True once the peer has been silent for the timeout or longer.
    pub fn is_expired(&self, now: u64) -> bool {
        self.timeout_ns > 0 && now.saturating_sub(self.last_heard) >= self.timeout_ns
    }

    /// How long the peer has been silent at `now`, nanoseconds.
    pub fn silent_for(&self, now: u64) -> u64 {
        now.saturating_sub(self.last_heard)
    }

    /// The timeout, nanoseconds (0: none).
    pub fn timeout_ns(&self) -> u64 {
        self.timeout_ns
    }

    /// When the next heartbeat is due (none: heartbeats are off): the caller's timer.
    pub fn next_transmit(&self) -> Option<u64> {
        (self.interval_ns > 0).then(|| self.last_sent.saturating_add(self.interval_ns))
    }

    /// When the peer counts as silent unless a frame comes first (none: no timeout).
    pub fn expires_at(&self) -> Option<u64> {
        (self.timeout_ns > 0).then(|| self.last_heard.saturating_add(self.timeout_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn heartbeats_are_due_every_interval_after_the_last_send() {
        let mut l = Liveness::new(1000 * MS, 100 * MS, 1000 * MS);
        assert!(!l.poll_transmit(1099 * MS));
        assert!(l.poll_transmit(1100 * MS));
        // Not sent (back-pressure): still due.
        assert!(l.poll_transmit(1150 * MS));
        l.on_sent(1150 * MS);
        assert!(!l.poll_transmit(1249 * MS));
        assert!(l.poll_transmit(1250 * MS));
        // Other traffic counts as sent.
        l.on_sent(1240 * MS);
        assert!(!l.poll_transmit(1250 * MS));
        assert!(l.poll_transmit(1340 * MS));
        // A clock that steps back does not postpone it.
        l.on_sent(1000 * MS);
        assert!(l.poll_transmit(1340 * MS));
    }

    #[test]
    fn silence_past_the_timeout_expires_and_any_frame_resets_it() {
        let mut l = Liveness::new(0, 100 * MS, 500 * MS);
        assert!(!l.is_expired(499 * MS));
        l.on_heard(400 * MS);
        assert!(!l.is_expired(899 * MS));
        assert_eq!(l.silent_for(899 * MS), 499 * MS);
        assert!(l.is_expired(900 * MS));
        // A clock that steps back is not a sign of life.
        l.on_heard(100 * MS);
        assert!(l.is_expired(900 * MS));
        assert!(
            !l.is_expired(10 * MS),
            "a time before the last frame is not silence"
        );
    }

    #[test]
    fn zero_turns_each_side_off() {
        let l = Liveness::new(0, 0, 0);
        assert!(!l.poll_transmit(u64::MAX));
        assert!(!l.is_expired(u64::MAX));
        assert_eq!((l.next_transmit(), l.expires_at()), (None, None));
    }

    /// The timers a caller sleeps until are exactly where the checks turn true.
    #[test]
    fn the_timers_are_where_the_checks_turn() {
        let mut l = Liveness::new(1000 * MS, 100 * MS, 500 * MS);
        l.on_heard(1200 * MS);
        l.on_sent(1050 * MS);
        let (tx, exp) = (l.next_transmit().unwrap(), l.expires_at().unwrap());
        assert_eq!((tx, exp), (1150 * MS, 1700 * MS));
        assert!(!l.poll_transmit(tx - 1) && l.poll_transmit(tx));
        assert!(!l.is_expired(exp - 1) && l.is_expired(exp));
    }
}
