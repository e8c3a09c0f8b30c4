//! The repair budget: a token bucket of bytes, I/O-free (it takes `now`,
//! it never reads a clock). The recovery server keeps one per admitted
//! connection, charged with every byte it sends on that connection's behalf
//! (unicast answers, the multicast retransmits its requests caused on every
//! line, snapshots), and one for the multicast lines, which paces multicast
//! retransmits.
//!
//! A request is served while the balance is positive and charged in full,
//! so the balance may go negative by one item (one answer, cut to
//! `repair_request_bytes`, or one snapshot, which is useless cut). Over
//! any `T` seconds a bucket therefore lets out at most
//! `burst + rate * T + one item`: that is the bound the server states
//! ([`super::server`]).

/// Nanoseconds per second: the bucket counts in bytes x 1e9 so that a
/// refill of a few nanoseconds is not rounded away.
const NS: i128 = 1_000_000_000;

/// A token bucket of bytes that may go into debt by one item. See the
/// module documentation.
#[derive(Debug, Clone, Copy)]
pub struct ByteBudget {
    /// Bytes per second.
    rate: u64,
    /// Most bytes saved up, x 1e9.
    cap: i128,
    /// Bytes that may still be spent, x 1e9 (negative: in debt).
    balance: i128,
    /// Time of the last refill.
    at: u64,
}

impl ByteBudget {
    /// A full bucket: `burst` bytes at once, `rate` bytes per second after.
    pub fn new(rate: u64, burst: u64) -> Self {
        let cap = i128::from(burst) * NS;
        ByteBudget {
            rate,
            cap,
            balance: cap,
            at: 0,
        }
    }

    fn refill(&mut self, now: u64) {
        if now > self.at {
            let earned = i128::from(now - self.at) * i128::from(self.rate);
            self.balance = (self.balance + earned).min(self.cap);
            self.at = now;
        }
    }

    /// Whether something may be sent at `now` (the balance is positive).
    pub fn ready(&mut self, now: u64) -> bool {
        self.refill(now);
        self.balance > 0
    }

    /// Charges `bytes` sent (after [`ready`](Self::ready) said yes).
    pub fn charge(&mut self, bytes: u64) {
        self.balance -= i128::from(bytes) * NS;
    }

    /// The earliest time [`ready`](Self::ready) says yes (`now` if it
    /// does already).
    pub fn ready_at(&self, now: u64) -> u64 {
        let at = now.max(self.at);
        let elapsed = at - self.at;
        let balance = self.balance + i128::from(elapsed) * i128::from(self.rate);
        if balance > 0 {
            return at;
        }
        if self.rate == 0 {
            return u64::MAX;
        }
        // The first nanosecond at which the balance is above zero.
        let wait = (-balance) / i128::from(self.rate) + 1;
        at.saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_the_rate_and_never_more() {
        // 1000 bytes a second (1 byte per ms), 100 saved up.
        let mut b = ByteBudget::new(1000, 100);
        let mut sent = 0;
        let mut now = 0;
        // Asking every 100 us for 30 bytes for 2 s.
        while now <= 2_000_000_000 {
            if b.ready(now) {
                b.charge(30);
                sent += 30;
            }
            now += 100_000;
        }
        // burst + rate * T + one item.
        assert!(sent <= 100 + 2000 + 30, "{sent}");
        assert!(sent >= 2000, "{sent}");
    }

    #[test]
    fn debt_of_one_large_item_is_paid_back_at_the_rate() {
        let mut b = ByteBudget::new(1000, 100);
        assert!(b.ready(0));
        // A snapshot of 10 kB: served whole, 9.9 s of debt.
        b.charge(10_000);
        assert!(!b.ready(1_000_000_000));
        let at = b.ready_at(1_000_000_000);
        assert_eq!(at, 9_900_000_001);
        assert!(!b.ready(at - 1));
        assert!(b.ready(at));
    }

    #[test]
    fn saving_stops_at_the_burst() {
        let mut b = ByteBudget::new(1000, 100);
        assert!(b.ready(1_000_000_000_000));
        b.charge(100);
        assert!(!b.ready(1_000_000_000_000));
        assert_eq!(b.ready_at(1_000_000_000_000), 1_000_000_000_001);
    }
}
