//! Bounded-rate logging of bad input: at most N log lines per second, the rest only counted.
//!
//! Exchange feeds and capture files can carry a flood of bad records; logging each would turn
//! a data problem into a latency and disk problem. Counters keep the exact totals.

use std::time::{Duration, Instant};

/// Allows at most `per_second` log lines per one-second window and counts what it suppressed.
#[derive(Debug, Clone)]
pub struct RateLimitedLog {
    per_second: u32,
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl RateLimitedLog {
    /// A limiter allowing `per_second` lines per second (0 silences all).
    pub const fn new(per_second: u32) -> Self {
        Self {
            per_second,
            window_start: None,
            in_window: 0,
            suppressed: 0,
        }
    }

    /// Whether a line may be logged at `now`. `Some(n)`: log it, and mention the `n` lines
    /// suppressed since the previous allowed one; `None`: stay silent (the line is counted).
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        let start = *self.window_start.get_or_insert(now);
        if now.saturating_duration_since(start) >= Duration::from_secs(1) {
            self.window_start = Some(now);
            self.in_window = 0;
        }
        if self.in_window < self.per_second {
            self.in_window += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }

    /// Lines suppressed and not yet reported.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_window_and_reports_suppressed() {
        let t0 = Instant::now();
        let mut log = RateLimitedLog::new(2);
        assert_eq!(log.allow(t0), Some(0));
        assert_eq!(log.allow(t0), Some(0));
        assert_eq!(log.allow(t0), None);
        assert_eq!(log.allow(t0 + Duration::from_millis(999)), None);
        assert_eq!(log.suppressed(), 2);
        assert_eq!(log.allow(t0 + Duration::from_secs(1)), Some(2));
        assert_eq!(log.suppressed(), 0);
    }
}
