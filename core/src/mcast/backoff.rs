//! When a subscriber tries its connection to the publisher next: an I/O-free
//! schedule shared by the multicast subscriber's recovery connection
//! ([`super::io`]) and the RC fan-out subscriber ([`super::rcfanout`]).
//! Times are the caller's monotonic nanoseconds.
//!
//! The rules: a failed attempt waits the current back-off, which then
//! doubles up to `reconnect_max_ns`; a connection that comes up resets it to
//! `reconnect_min_ns`; a connection that is lost is tried again after the
//! minimum. Between attempts the caller looks again when
//! [`due`](Backoff::due) says (a handshake step or a health check sooner).

/// Exponential back-off between a minimum and a maximum wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    min_ns: u64,
    max_ns: u64,
    /// What the next failed attempt waits.
    wait_ns: u64,
    /// The next look at the connection.
    next_ns: u64,
}

impl Backoff {
    /// Waits from `min_ns` doubling to `max_ns` (raised to `min_ns` if
    /// below); due at once.
    pub fn new(min_ns: u64, max_ns: u64) -> Self {
        Backoff {
            min_ns,
            max_ns: max_ns.max(min_ns),
            wait_ns: min_ns,
            next_ns: 0,
        }
    }

    /// True when the connection should be looked at (an attempt, a
    /// handshake step or a check).
    pub fn due(&self, now: u64) -> bool {
        now >= self.next_ns
    }

    /// Look again `after_ns` from `now` (a handshake step, a health check).
    pub fn check_after(&mut self, now: u64, after_ns: u64) {
        self.next_ns = now.saturating_add(after_ns);
    }

    /// The connection came up: the next failure waits the minimum.
    pub fn connected(&mut self) {
        self.wait_ns = self.min_ns;
    }

    /// An established connection was lost: try again after the minimum.
    pub fn lost(&mut self, now: u64) {
        self.wait_ns = self.min_ns;
        self.next_ns = now.saturating_add(self.min_ns);
    }

    /// An attempt failed: wait the current back-off, then double it.
    pub fn failed(&mut self, now: u64) {
        self.next_ns = now.saturating_add(self.wait_ns);
        self.wait_ns = self.wait_ns.saturating_mul(2).min(self.max_ns);
    }

    /// What the next failed attempt will wait.
    pub fn wait_ns(&self) -> u64 {
        self.wait_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_resets_on_success_and_loss() {
        let mut b = Backoff::new(100, 1000);
        assert!(b.due(0));
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            b.failed(now);
            assert!(!b.due(now));
            let w = b.wait_ns();
            waits.push(w);
            // Not due one nanosecond early, due on time.
            let due_at = (now..).find(|&t| b.due(t)).unwrap();
            now = due_at;
        }
        assert_eq!(waits, [200, 400, 800, 1000, 1000, 1000]);
        b.connected();
        assert_eq!(b.wait_ns(), 100);
        b.failed(now);
        assert!(b.due(now + 100) && !b.due(now + 99));
        b.failed(now);
        b.lost(now);
        assert_eq!(b.wait_ns(), 100);
        assert!(b.due(now + 100) && !b.due(now + 99));
        b.check_after(now, 5);
        assert!(b.due(now + 5) && !b.due(now + 4));
    }

    #[test]
    fn saturates_instead_of_overflowing() {
        let mut b = Backoff::new(u64::MAX / 2 + 1, u64::MAX);
        b.failed(u64::MAX - 1);
        assert!(!b.due(u64::MAX - 1));
        assert!(b.due(u64::MAX));
        b.failed(0);
        assert_eq!(b.wait_ns(), u64::MAX);
        // A maximum below the minimum is the minimum.
        let mut b = Backoff::new(50, 10);
        b.failed(0);
        assert_eq!(b.wait_ns(), 50);
    }
}
