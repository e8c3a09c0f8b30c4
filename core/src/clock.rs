//! The one clock of the crate: nanoseconds on a process-wide monotonic
//! clock, the `now` every state machine takes (market data, shared memory)
//! and the one to pass them from an embedding loop.
//!
//! One read per loop turn is enough: the state machines take `now` as an
//! argument instead of reading a clock themselves, so a loop that drives
//! several of them reads it once.
//!
//! Two time types, one per meaning, so a deadline on one clock is never compared with a
//! reading of the other:
//! - [`Mono`]: the process's monotonic clock. Timers that must not move when the wall clock
//!   steps (liveness, back-offs, probes) run on it. It means nothing in another process.
//! - [`Wall`]: nanoseconds since the UNIX epoch. What is journaled or sent to a peer
//!   (decision times, FIX SendingTime, trading hours) and every deadline derived from it:
//!   a journal (or a replicated log) replayed elsewhere sees the same values.
//!
//! [`Now`] is both, read once per loop turn by the I/O shell ([`Now::read`]) and passed
//! to every state machine it drives.

use std::ops::{Add, AddAssign, Sub};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Nanoseconds since the first call in this process (monotonic; starts
/// near 0, so a `u64` lasts some 580 years).
#[inline]
pub fn now_ns() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// A reading of the process's monotonic clock, nanoseconds since its start ([`now_ns`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mono(u64);

impl Mono {
    /// The clock's start.
    pub const ZERO: Mono = Mono(0);

    /// A reading `nanos` after the clock's start (simulators and tests make their own).
    pub const fn from_nanos(nanos: u64) -> Mono {
        Mono(nanos)
    }

    /// Nanoseconds since the clock's start.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Reads the clock (I/O shells only, once per turn).
    pub fn now() -> Mono {
        Mono(now_ns())
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn saturating_since(self, earlier: Mono) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Mono {
    type Output = Mono;
    /// Saturates at the end of time rather than wrapping.
    fn add(self, d: Duration) -> Mono {
        Mono(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

impl AddAssign<Duration> for Mono {
    /// Saturates at the end of time, as `+` does.
    fn add_assign(&mut self, d: Duration) {
        *self = *self + d;
    }
}

impl Sub<Duration> for Mono {
    type Output = Mono;
    /// Saturates at the clock's start rather than wrapping.
    fn sub(self, d: Duration) -> Mono {
        Mono(
            self.0
                .saturating_sub(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// A reading of the wall clock, nanoseconds since the UNIX epoch (0: before it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Wall(u64);

impl Wall {
    /// The epoch.
    pub const ZERO: Wall = Wall(0);

    /// `nanos` after the UNIX epoch.
    pub const fn from_nanos(nanos: u64) -> Wall {
        Wall(nanos)
    }

    /// Nanoseconds since the UNIX epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Reads the clock (I/O shells only, once per turn).
    pub fn now() -> Wall {
        Wall(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
        )
    }

    /// How long after `earlier` this is (zero if it is not after it: the clock stepped back).
    pub fn saturating_since(self, earlier: Wall) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Wall {
    type Output = Wall;
    /// Saturates at the end of time rather than wrapping.
    fn add(self, d: Duration) -> Wall {
        Wall(
            self.0
                .saturating_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
        )
    }
}

/// Both clocks, read once at the top of a loop turn and passed to every state machine the
/// turn drives.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    /// The monotonic reading.
    pub mono: Mono,
    /// The wall reading.
    pub wall: Wall,
}

impl Now {
    /// Reads both clocks (the one read of a turn).
    pub fn read() -> Now {
        Now {
            mono: Mono::now(),
            wall: Wall::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_is_monotonic_and_starts_near_zero() {
        let a = super::now_ns();
        let b = super::now_ns();
        assert!(b >= a);
        assert!(a < 3_600_000_000_000, "{a}");
    }

    #[test]
    fn deadlines_saturate_and_differences_never_go_negative() {
        let m = Mono::from_nanos(u64::MAX - 1);
        assert_eq!(m + Duration::from_secs(1), Mono::from_nanos(u64::MAX));
        assert_eq!(Mono::ZERO.saturating_since(m), Duration::ZERO);
        let mut t = m;
        t += Duration::from_secs(1);
        assert_eq!(t, Mono::from_nanos(u64::MAX));
        assert_eq!(Mono::from_nanos(5) - Duration::from_nanos(7), Mono::ZERO);
        assert_eq!(
            Mono::from_nanos(5_000) - Duration::from_nanos(1),
            Mono::from_nanos(4_999)
        );
        assert_eq!(
            Mono::from_nanos(3_000).saturating_since(Mono::from_nanos(1_000)),
            Duration::from_nanos(2_000)
        );
        // A wall clock stepped back: no negative interval.
        let w = Wall::from_nanos(5_000);
        assert_eq!(Wall::from_nanos(4_000).saturating_since(w), Duration::ZERO);
        assert_eq!(w + Duration::from_nanos(1), Wall::from_nanos(5_001));
    }

    #[test]
    fn one_read_gives_both_clocks() {
        let n = Now::read();
        // 2020-01-01 in nanoseconds: any host this runs on is past it.
        assert!(n.wall > Wall::from_nanos(1_577_836_800_000_000_000));
        assert!(Now::read().mono >= n.mono);
    }
}
