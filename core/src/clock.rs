//! The one clock of the crate: nanoseconds on a process-wide monotonic
//! clock, the `now` every state machine takes (market data, shared memory)
//! and the one to pass them from an embedding loop.
//!
//! One read per loop turn is enough: the state machines take `now` as an
//! argument instead of reading a clock themselves, so a loop that drives
//! several of them reads it once.

use std::sync::OnceLock;
use std::time::Instant;

/// Nanoseconds since the first call in this process (monotonic; starts
/// near 0, so a `u64` lasts some 580 years).
#[inline]
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn now_is_monotonic_and_starts_near_zero() {
        let a = super::now_ns();
        let b = super::now_ns();
        assert!(b >= a);
        assert!(a < 3_600_000_000_000, "{a}");
    }
}
