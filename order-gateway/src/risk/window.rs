//! The risk trading window: a daily `[start, end)` of local time in an IANA time zone
//! (`[risk] timezone`, default UTC), so a window written as the exchange's hours
//! (09:30-16:00 America/New_York) stays right across daylight-saving switches. Time zones
//! come from the IANA database jiff compiles into the binary (no system tzdata needed).
//!
//! Owns only the window's configuration and its test; the risk engine asks
//! [`TradingWindow::is_open`] for each new order (no allocation: an offset lookup in the
//! zone's transitions).

use jiff::tz::TimeZone;
use jiff::Timestamp;

use super::{RiskConfig, RiskConfigError};

/// Seconds in a day.
const DAY: i64 = 86_400;

/// A daily window of local time in one time zone.
#[derive(Clone, Debug)]
pub struct TradingWindow {
    /// Seconds of the local day, start inclusive.
    start: u32,
    /// Seconds of the local day, end exclusive; below `start` the window wraps midnight.
    end: u32,
    tz: TimeZone,
}

impl TradingWindow {
    /// The window `[risk]` configures, if any: `trading_start`/`trading_end` in `timezone`
    /// (default `UTC`), or the older `trading_start_utc`/`trading_end_utc` (UTC; refused
    /// beside the new keys or beside a `timezone`, which they would silently ignore).
    pub fn from_config(cfg: &RiskConfig) -> Result<Option<TradingWindow>, RiskConfigError> {
        let legacy = cfg.trading_start_utc.is_some() || cfg.trading_end_utc.is_some();
        let local = cfg.trading_start.is_some() || cfg.trading_end.is_some();
        if legacy && (local || cfg.timezone.is_some()) {
            return Err(RiskConfigError::MixedWindowKeys);
        }
        let tz_name = cfg.timezone.as_deref().unwrap_or("UTC");
        let tz = jiff::tz::db()
            .get(tz_name)
            .map_err(|_| RiskConfigError::BadTimeZone(tz_name.to_owned()))?;
        let (start, end, keys) = if legacy {
            (
                &cfg.trading_start_utc,
                &cfg.trading_end_utc,
                ("trading_start_utc", "trading_end_utc"),
            )
        } else {
            (
                &cfg.trading_start,
                &cfg.trading_end,
                ("trading_start", "trading_end"),
            )
        };
        match (start, end) {
            (None, None) => Ok(None),
            (Some(s), Some(e)) => Ok(Some(TradingWindow {
                start: parse_time_of_day(keys.0, s)?,
                end: parse_time_of_day(keys.1, e)?,
                tz,
            })),
            _ => Err(RiskConfigError::HalfWindow),
        }
    }

    /// Whether `now` (UNIX nanoseconds) falls inside the window, in local time.
    pub fn is_open(&self, now_unix_ns: u64) -> bool {
        let secs = i64::try_from(now_unix_ns / 1_000_000_000).unwrap_or(i64::MAX);
        let offset = Timestamp::from_second(secs)
            .map(|t| i64::from(self.tz.to_offset(t).seconds()))
            .unwrap_or(0);
        let sec = (secs + offset).rem_euclid(DAY) as u32;
        if self.start <= self.end {
            sec >= self.start && sec < self.end
        } else {
            sec >= self.start || sec < self.end
        }
    }
}

/// `HH:MM` or `HH:MM:SS` as seconds of the day.
fn parse_time_of_day(key: &'static str, s: &str) -> Result<u32, RiskConfigError> {
    let bad = || RiskConfigError::BadTime {
        key,
        value: s.to_owned(),
    };
    let parts: Vec<&str> = s.split(':').collect();
    if !(2..=3).contains(&parts.len()) {
        return Err(bad());
    }
    let field = |p: &str, max: u32| -> Result<u32, RiskConfigError> {
        let v: u32 = p.parse().map_err(|_| bad())?;
        if v > max {
            Err(bad())
        } else {
            Ok(v)
        }
    };
    let h = field(parts[0], 23)?;
    let m = field(parts[1], 59)?;
    let sec = parts.get(2).map_or(Ok(0), |p| field(p, 59))?;
    Ok(h * 3600 + m * 60 + sec)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn window(extra: &str) -> Result<Option<TradingWindow>, RiskConfigError> {
        let cfg: RiskConfig = toml::from_str(&format!(
            "reference_max_age_ms = 5000\nthrottle_interval_ms = 1000\naccounts = []\nengines = []\n{extra}"
        ))
        .unwrap();
        TradingWindow::from_config(&cfg)
    }

    fn new_york() -> TradingWindow {
        window(
            "trading_start = \"09:30\"\ntrading_end = \"16:00\"\ntimezone = \"America/New_York\"",
        )
        .unwrap()
        .unwrap()
    }

    /// UNIX nanoseconds of a UTC instant.
    fn utc(s: &str) -> u64 {
        let t: Timestamp = s.parse().unwrap();
        u64::try_from(t.as_nanosecond()).unwrap()
    }

    /// 09:30 in New York is 14:30 UTC in winter and 13:30 UTC in summer; a fixed UTC window
    /// is an hour off for half the year, the zone's is not.
    #[test]
    fn new_york_hours_follow_both_dst_switches() {
        let w = new_york();
        // Friday 2026-03-06, EST (UTC-5): open 14:30-21:00 UTC.
        assert!(!w.is_open(utc("2026-03-06T14:29:59Z")));
        assert!(w.is_open(utc("2026-03-06T14:30:00Z")));
        assert!(w.is_open(utc("2026-03-06T20:59:59Z")));
        assert!(!w.is_open(utc("2026-03-06T21:00:00Z")));
        // Monday 2026-03-09, the day after the spring switch, EDT (UTC-4): 13:30-20:00 UTC.
        assert!(!w.is_open(utc("2026-03-09T13:29:59Z")));
        assert!(w.is_open(utc("2026-03-09T13:30:00Z")));
        assert!(!w.is_open(utc("2026-03-09T20:00:00Z")));
        // Friday 2026-10-30, still EDT.
        assert!(w.is_open(utc("2026-10-30T13:30:00Z")));
        assert!(!w.is_open(utc("2026-10-30T20:00:00Z")));
        // Monday 2026-11-02, after the autumn switch (Sunday 2026-11-01): EST again.
        assert!(!w.is_open(utc("2026-11-02T13:30:00Z")));
        assert!(w.is_open(utc("2026-11-02T14:30:00Z")));
        assert!(w.is_open(utc("2026-11-02T20:30:00Z")));
        assert!(!w.is_open(utc("2026-11-02T21:00:00Z")));
    }

    /// Before 2007 daylight time started on the first Sunday of April: 2006-03-20 was still
    /// EST, which a 2007-rule hand calculation gets wrong.
    #[test]
    fn new_york_hours_before_2007() {
        let w = new_york();
        assert!(!w.is_open(utc("2006-03-20T13:30:00Z")));
        assert!(w.is_open(utc("2006-03-20T14:30:00Z")));
        // 2006-04-03, after the first Sunday of April: EDT.
        assert!(w.is_open(utc("2006-04-03T13:30:00Z")));
        // 2006-10-30, after the last Sunday of October: EST.
        assert!(!w.is_open(utc("2006-10-30T13:30:00Z")));
        assert!(w.is_open(utc("2006-10-30T14:30:00Z")));
    }

    #[test]
    fn utc_is_the_default_and_the_old_keys_still_mean_utc() {
        for extra in [
            "trading_start = \"14:30\"\ntrading_end = \"21:00\"",
            "trading_start_utc = \"14:30\"\ntrading_end_utc = \"21:00\"",
            "trading_start = \"14:30\"\ntrading_end = \"21:00\"\ntimezone = \"UTC\"",
        ] {
            let w = window(extra).unwrap().unwrap();
            // 2024-01-02 15:00 UTC open; 2024-07-02 14:00 UTC closed whatever the season.
            assert!(w.is_open(1_704_207_600 * SEC), "{extra}");
            assert!(!w.is_open(utc("2024-07-02T14:00:00Z")), "{extra}");
        }
        // Wrapping midnight.
        let w = window("trading_start = \"22:00\"\ntrading_end = \"02:00\"")
            .unwrap()
            .unwrap();
        assert!(w.is_open(utc("2024-07-02T23:00:00Z")));
        assert!(w.is_open(utc("2024-07-03T01:00:00Z")));
        assert!(!w.is_open(utc("2024-07-03T02:00:00Z")));
        assert!(window("").unwrap().is_none());
    }

    #[test]
    fn bad_window_configs_say_what_is_wrong() {
        let err = |extra: &str| window(extra).unwrap_err().to_string();
        assert!(err(
            "trading_start = \"09:30\"\ntrading_end = \"16:00\"\ntimezone = \"America/Nowhere\""
        )
        .contains("America/Nowhere"));
        assert!(err("trading_start_utc = \"13:30\"\ntrading_end_utc = \"20:00\"\ntimezone = \"America/New_York\"")
            .contains("trading_start"));
        assert!(err("trading_start = \"09:30\"").contains("together"));
        assert!(err("trading_start = \"25:00\"\ntrading_end = \"16:00\"").contains("25:00"));
        assert!(
            err("trading_start = \"09:30:00:00\"\ntrading_end = \"16:00\"").contains("09:30:00:00")
        );
    }
}
