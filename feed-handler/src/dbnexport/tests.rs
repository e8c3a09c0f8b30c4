use super::*;

fn date(s: &str) -> Date {
    Date::parse(s).unwrap()
}

#[test]
fn midnight_eastern_follows_daylight_saving() {
    // 2026-01-02 00:00 EST = 05:00 UTC.
    assert_eq!(
        date("2026-01-02").eastern_midnight_unix_ns(),
        1_767_330_000_000_000_000
    );
    // 2026-03-10 00:00 EDT = 04:00 UTC.
    assert_eq!(
        date("2026-03-10").eastern_midnight_unix_ns(),
        1_773_115_200_000_000_000
    );
    // DST starts at 2:00 on Sunday 2026-03-08: that midnight is still EST, the next EDT.
    assert_eq!(date("2026-03-08").eastern_offset_hours(), -5);
    assert_eq!(date("2026-03-09").eastern_offset_hours(), -4);
    // DST ends at 2:00 on Sunday 2026-11-01: that midnight is still EDT, the next EST.
    assert_eq!(date("2026-11-01").eastern_offset_hours(), -4);
    assert_eq!(date("2026-11-02").eastern_offset_hours(), -5);
    assert_eq!(date("2024-07-01").eastern_offset_hours(), -4);
    assert_eq!(date("2024-12-31").eastern_offset_hours(), -5);
}

/// Before 2007 the US rule was different (first Sunday of April to last Sunday of October),
/// and in 1974 daylight time ran all winter: the hand-written 2007 rule got these wrong, the
/// time-zone database does not.
#[test]
fn midnight_eastern_before_2007_follows_that_years_rule() {
    // 2006: DST from Sunday 2006-04-02 to Sunday 2006-10-29.
    assert_eq!(date("2006-03-20").eastern_offset_hours(), -5);
    assert_eq!(date("2006-04-02").eastern_offset_hours(), -5);
    assert_eq!(date("2006-04-03").eastern_offset_hours(), -4);
    assert_eq!(date("2006-10-29").eastern_offset_hours(), -4);
    assert_eq!(date("2006-10-30").eastern_offset_hours(), -5);
    // 2006-03-20 00:00 EST = 05:00 UTC.
    assert_eq!(
        date("2006-03-20").eastern_midnight_unix_ns(),
        1_142_830_800_000_000_000
    );
    // The 1974 energy crisis: daylight time from 1974-01-06.
    assert_eq!(date("1974-01-10").eastern_offset_hours(), -4);
}

#[test]
fn dates_are_checked() {
    assert!(Date::parse("2024-02-29").is_ok());
    for bad in [
        "2023-02-29",
        "2024-13-01",
        "2024-1",
        "x",
        "2024-01-01-01",
        "1960-01-01",
    ] {
        assert!(Date::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn trading_action_reasons_map_to_dbn() {
    assert_eq!(status_reason(b"T1  "), StatusReason::NewsPending);
    assert_eq!(status_reason(b"LUDP"), StatusReason::LuldPause);
    assert_eq!(status_reason(b"MWC1"), StatusReason::MarketWideHaltLevel1);
    assert_eq!(status_reason(b"    "), StatusReason::None);
    assert_eq!(status_reason(b"ZZZZ"), StatusReason::None);
}

#[test]
fn an_empty_capture_is_refused() {
    let opts = ExportOptions {
        schema: ExportSchema::Mbo,
        date: date("2026-03-10"),
        zstd: false,
    };
    let mut out = Vec::new();
    assert!(matches!(
        export(&[], &opts, &mut out),
        Err(ExportError::Empty)
    ));
}
