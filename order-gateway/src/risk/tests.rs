//! The risk rules end to end through [`RiskEngine`].

use super::*;
use crate::proto::{RejectReason, PRICE_SCALE};

const SEC: u64 = 1_000_000_000;
/// 2024-01-02 15:00:00 UTC.
const NOW: u64 = 1_704_207_600 * SEC;

fn cfg() -> RiskConfig {
    toml::from_str(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        restricted_symbols = ["BAD"]
        trading_start_utc = "14:30"
        trading_end_utc = "21:00"
        [[accounts]]
        id = 1
        max_order_qty = 1000
        max_order_notional = 50000
        credit_limit = 100000
        max_position = 1500
        max_open_orders = 3
        max_orders_per_interval = 5
        collar_bps = 500
        [[accounts]]
        id = 2
        max_order_qty = 1000
        max_order_notional = 50000
        credit_limit = 1000000
        max_position = 1500
        max_open_orders = 100
        max_orders_per_interval = 100
        collar_bps = 500
        [[engines]]
        id = 10
        accounts = [1, 2]
        token = "t10"
        [[engines]]
        id = 11
        accounts = [2]
        token = "t11"
        "#,
    )
    .unwrap()
}

fn sym(s: &str) -> Symbol {
    Symbol::new(s).unwrap()
}

fn engine() -> RiskEngine {
    let mut r = RiskEngine::new(&cfg()).unwrap();
    for s in ["AAPL", "MSFT", "BAD"] {
        r.on_reference_price(sym(s), 100 * PRICE_SCALE, NOW);
    }
    r
}

fn order(account: u32, qty: u32, price_units: i64) -> OrderParams {
    OrderParams {
        account,
        symbol: sym("AAPL"),
        side: Side::Buy,
        qty,
        price: price_units * PRICE_SCALE,
    }
}

/// Runs `o` with a fresh cl_ord_id each time.
fn check(r: &mut RiskEngine, engine: u32, o: OrderParams) -> Result<(), RejectReason> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    // ORDERING: Relaxed, only uniqueness matters.
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    r.check_new(engine, id, &o, NOW)
}

#[test]
fn max_quantity() {
    let mut r = engine();
    assert_eq!(
        check(&mut r, 10, order(2, 1001, 10)),
        Err(RejectReason::MaxQuantity)
    );
    assert_eq!(
        check(&mut r, 10, order(2, 0, 10)),
        Err(RejectReason::MaxQuantity)
    );
    // Inside the collar needs price near 100.
    assert_eq!(
        check(&mut r, 10, order(2, 1000, 40)),
        Err(RejectReason::PriceCollar)
    );
    assert_eq!(check(&mut r, 10, order(2, 400, 100)), Ok(()));
}

#[test]
fn max_notional() {
    let mut r = engine();
    assert_eq!(
        check(&mut r, 10, order(2, 501, 100)),
        Err(RejectReason::MaxNotional)
    );
    assert_eq!(check(&mut r, 10, order(2, 500, 100)), Ok(()));
}

#[test]
fn price_collar() {
    let mut r = engine();
    assert_eq!(
        check(&mut r, 10, order(2, 1, 106)),
        Err(RejectReason::PriceCollar)
    );
    assert_eq!(
        check(&mut r, 10, order(2, 1, 94)),
        Err(RejectReason::PriceCollar)
    );
    assert_eq!(check(&mut r, 10, order(2, 1, 105)), Ok(()));
    assert_eq!(check(&mut r, 10, order(2, 1, 95)), Ok(()));
    assert_eq!(
        check(&mut r, 10, order(2, 1, 0)),
        Err(RejectReason::InvalidPrice)
    );
}

#[test]
fn reference_missing_or_stale_fails_closed() {
    let mut r = engine();
    let mut o = order(2, 1, 100);
    o.symbol = sym("IBM");
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::NoReferencePrice));
    r.on_reference_price(sym("IBM"), 100 * PRICE_SCALE, NOW - 6 * SEC);
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::StaleReferencePrice));
    r.on_reference_price(sym("IBM"), 100 * PRICE_SCALE, NOW - 4 * SEC);
    assert_eq!(check(&mut r, 10, o), Ok(()));
}

#[test]
fn credit_limit_counts_open_and_executed() {
    let mut r = engine();
    let o = order(1, 500, 100); // 50_000 each
    assert_eq!(check(&mut r, 10, o), Ok(()));
    r.on_fill(&o, 500, 100 * PRICE_SCALE);
    r.on_order_done(&o, 0);
    assert_eq!(r.exposure(1), (0, 50_000));
    assert_eq!(
        check(
            &mut r,
            10,
            OrderParams {
                side: Side::Sell,
                ..o
            }
        ),
        Ok(())
    );
    assert_eq!(r.exposure(1), (50_000, 50_000));
    assert_eq!(
        check(&mut r, 10, order(1, 1, 100)),
        Err(RejectReason::CreditLimit)
    );
}

#[test]
fn position_limit_counts_open_same_side() {
    let mut r = engine();
    let o = order(2, 400, 100);
    for _ in 0..3 {
        assert_eq!(check(&mut r, 10, o), Ok(()));
    }
    // 1200 open buy; limit 1500.
    assert_eq!(
        check(&mut r, 10, order(2, 301, 100)),
        Err(RejectReason::PositionLimit)
    );
    assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
    r.on_fill(&o, 400, 100 * PRICE_SCALE);
    assert_eq!(r.position(2, sym("AAPL")), 400);
    // Sells are checked against the short side: 400 long allows 1900 of sells.
    let sell = OrderParams {
        side: Side::Sell,
        ..order(2, 1, 100)
    };
    assert_eq!(check(&mut r, 10, sell), Ok(()));
}

#[test]
fn max_open_orders() {
    let mut r = engine();
    let o = order(1, 1, 100);
    for _ in 0..3 {
        assert_eq!(check(&mut r, 10, o), Ok(()));
    }
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::MaxOpenOrders));
    r.on_order_done(&o, 1);
    assert_eq!(check(&mut r, 10, o), Ok(()));
}

#[test]
fn throttle_per_interval() {
    let mut r = engine();
    let o = order(1, 1, 100);
    for i in 0..5 {
        assert_eq!(r.check_new(10, 1000 + i, &o, NOW), Ok(()));
        r.on_order_done(&o, 1);
    }
    assert_eq!(
        r.check_new(10, 1005, &o, NOW + SEC / 2),
        Err(RejectReason::Throttled)
    );
    // Counted for at least the whole interval, at most 64/63 of it.
    assert_eq!(
        r.check_new(10, 1006, &o, NOW + SEC - 1),
        Err(RejectReason::Throttled)
    );
    assert_eq!(r.check_new(10, 1007, &o, NOW + SEC + SEC / 60), Ok(()));
}

/// A fixed window restarts its count at its boundary and lets twice the limit through
/// in a short span across it; the sliding window never does.
#[test]
fn throttle_is_a_sliding_window_not_a_fixed_one() {
    let mut r = engine();
    let o = order(1, 1, 100);
    let mut id = 2000;
    let mut send = |r: &mut RiskEngine, at: u64| {
        id += 1;
        let v = r.check_new(10, id, &o, at);
        if v.is_ok() {
            r.on_order_done(&o, 1);
        }
        v
    };
    // One order opens the (fixed) window, four more come at the end of it.
    assert_eq!(send(&mut r, NOW), Ok(()));
    for _ in 0..4 {
        assert_eq!(send(&mut r, NOW + SEC * 9 / 10), Ok(()));
    }
    // Just past the first order's interval only that one has left the window: one more,
    // not five (a fixed window would take five here: 9 orders in 0.15 s).
    let t = NOW + SEC + SEC / 20;
    assert_eq!(send(&mut r, t), Ok(()));
    assert_eq!(send(&mut r, t), Err(RejectReason::Throttled));
    assert_eq!(r.throttle_usage(1, t), [5, 0, 0]);
}

/// Whatever the arrival times, no interval of the configured length ever holds more
/// accepted requests than the limit.
#[test]
fn sliding_window_never_exceeds_the_limit_in_any_interval() {
    let interval = 1_000_000u64;
    let slot = SlidingWindow::slot_ns(interval);
    let limit = 7;
    let mut w = SlidingWindow::default();
    let mut accepted: Vec<u64> = Vec::new();
    let mut t = 5 * interval;
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        t += x % (interval / 5);
        assert_eq!(w.peek(t / slot), w.clone().count(t / slot));
        if w.count(t / slot) < limit {
            w.add(t / slot);
            accepted.push(t);
        }
    }
    for (i, &start) in accepted.iter().enumerate() {
        let n = accepted[i..]
            .iter()
            .take_while(|&&a| a < start + interval)
            .count();
        assert!(
            n as u64 <= limit,
            "{n} accepted within one interval from {start}"
        );
    }
    // And it does not starve: most of the offered requests that fit got through.
    assert!(accepted.len() > 20_000 / 20 * 7 / 2, "{}", accepted.len());
}

#[test]
fn cancels_and_replaces_have_their_own_throttles() {
    let mut c = cfg();
    c.accounts[1].max_cancels_per_interval = Some(2);
    c.accounts[1].max_replaces_per_interval = Some(1);
    let mut r = RiskEngine::new(&c).unwrap();
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
    let o = order(2, 10, 100);
    assert_eq!(check(&mut r, 10, o), Ok(()));
    assert_eq!(r.check_cancel(&o, NOW), Ok(()));
    assert_eq!(r.check_cancel(&o, NOW), Ok(()));
    assert_eq!(r.check_cancel(&o, NOW), Err(RejectReason::Throttled));
    let new = order(2, 20, 100);
    assert_eq!(r.check_replace(10, &o, 10, &new, NOW), Ok(()));
    assert_eq!(
        r.check_replace(10, &o, 10, &new, NOW),
        Err(RejectReason::Throttled)
    );
    // New orders have their own budget (100): untouched by the cancels and replaces.
    assert_eq!(check(&mut r, 10, order(2, 11, 100)), Ok(()));
    assert_eq!(r.throttle_usage(2, NOW), [2, 2, 1]);
    // Absent, the cancel and replace limits are the new-order limit (5 on account 1).
    let a = order(1, 1, 100);
    for _ in 0..5 {
        assert_eq!(r.check_cancel(&a, NOW), Ok(()));
    }
    assert_eq!(r.check_cancel(&a, NOW), Err(RejectReason::Throttled));
    // A rejected replace uses no slot.
    let mut r = RiskEngine::new(&c).unwrap();
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
    assert_eq!(check(&mut r, 10, o), Ok(()));
    let huge = order(2, 1001, 100);
    assert_eq!(
        r.check_replace(10, &o, 10, &huge, NOW),
        Err(RejectReason::MaxQuantity)
    );
    assert_eq!(r.throttle_usage(2, NOW), [1, 0, 0]);
}

#[test]
fn repeated_identical_orders_reject() {
    let mut c = cfg();
    c.max_identical_orders = 3;
    c.identical_order_window_ms = 1000;
    let mut r = RiskEngine::new(&c).unwrap();
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
    let o = order(2, 10, 100);
    for i in 0..3 {
        assert_eq!(r.check_new(10, 3000 + i, &o, NOW + i * SEC / 10), Ok(()));
    }
    assert_eq!(
        r.check_new(10, 3003, &o, NOW + SEC / 2),
        Err(RejectReason::RepeatedOrder)
    );
    // Any other term differs: another order.
    for other in [
        order(2, 11, 100),
        order(2, 10, 101),
        OrderParams {
            side: Side::Sell,
            ..o
        },
        order(1, 10, 100),
    ]
    .into_iter()
    .zip(3100..)
    {
        assert_eq!(r.check_new(10, other.1, &other.0, NOW + SEC / 2), Ok(()));
    }
    // Exactly one window after the first, that one no longer counts.
    assert_eq!(r.identical_count(&o, NOW + SEC - 1), 3);
    assert_eq!(r.identical_count(&o, NOW + SEC), 2);
    assert_eq!(r.check_new(10, 3004, &o, NOW + SEC), Ok(()));
    assert_eq!(
        r.check_new(10, 3005, &o, NOW + SEC),
        Err(RejectReason::RepeatedOrder)
    );
    // 0 turns it off.
    let mut c = cfg();
    c.max_identical_orders = 0;
    let mut r = RiskEngine::new(&c).unwrap();
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
    for i in 0..50 {
        assert_eq!(r.check_new(10, 4000 + i, &o, NOW), Ok(()));
        r.on_order_done(&o, 10);
    }
}

#[test]
fn repeated_order_check_is_on_by_default() {
    let mut r = engine();
    let o = order(2, 1, 100);
    for _ in 0..10 {
        assert_eq!(check(&mut r, 10, o), Ok(()));
    }
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::RepeatedOrder));
}

fn firm_cfg(firm: &str) -> RiskConfig {
    let mut c: RiskConfig = toml::from_str(&format!(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        max_identical_orders = 0
        [firm]
        {firm}
        [[accounts]]
        id = 1
        max_order_qty = 1000
        max_order_notional = 50000
        credit_limit = 100000
        max_position = 100000
        max_open_orders = 10
        max_orders_per_interval = 100
        collar_bps = 500
        [[engines]]
        id = 10
        accounts = [1]
        token = "t10"
        "#
    ))
    .unwrap();
    let mut second = c.accounts[0].clone();
    second.id = 2;
    c.accounts.push(second);
    c.engines[0].accounts.push(2);
    c
}

fn firm_engine(firm: &str) -> RiskEngine {
    let mut r = RiskEngine::new(&firm_cfg(firm)).unwrap();
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
    r
}

#[test]
fn firm_credit_limit_counts_every_account() {
    let mut r = firm_engine("credit_limit = 120000");
    // Account 1: 50_000 executed + 40_000 open (well inside its own 100_000).
    let a = order(1, 500, 100);
    assert_eq!(check(&mut r, 10, a), Ok(()));
    r.on_fill(&a, 500, 100 * PRICE_SCALE);
    r.on_order_done(&a, 0);
    assert_eq!(check(&mut r, 10, order(1, 400, 100)), Ok(()));
    // Account 2 has used nothing, but the firm has 90_000 of 120_000.
    assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
    assert_eq!(
        check(&mut r, 10, order(2, 1, 100)),
        Err(RejectReason::FirmCreditLimit)
    );
    assert_eq!(r.firm_exposure(), (2, 70_000, 50_000));
    // A fill taken back frees firm credit.
    r.on_execution_reversed(&a, 500, 100 * PRICE_SCALE);
    assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
}

#[test]
fn firm_gross_notional_counts_open_orders_of_every_account_both_sides() {
    let mut r = firm_engine("max_gross_notional = 60000");
    let buy = order(1, 300, 100);
    assert_eq!(check(&mut r, 10, buy), Ok(()));
    let sell = OrderParams {
        side: Side::Sell,
        ..order(2, 300, 100)
    };
    assert_eq!(check(&mut r, 10, sell), Ok(()));
    assert_eq!(
        check(&mut r, 10, order(2, 1, 100)),
        Err(RejectReason::FirmGrossNotional)
    );
    // Executed notional is the credit limit's business, not the gross limit's.
    r.on_fill(&buy, 300, 100 * PRICE_SCALE);
    r.on_order_done(&buy, 0);
    assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
    // A replace is checked against the firm too, without its own old reservation.
    let o = order(2, 300, 100);
    assert_eq!(
        r.check_replace(10, &o, 300, &order(2, 301, 100), NOW),
        Err(RejectReason::FirmGrossNotional)
    );
    assert_eq!(
        r.check_replace(10, &o, 300, &order(2, 300, 99), NOW),
        Ok(())
    );
}

#[test]
fn firm_open_orders_count_every_account() {
    let mut r = firm_engine("max_open_orders = 3");
    let o1 = order(1, 1, 100);
    assert_eq!(check(&mut r, 10, o1), Ok(()));
    assert_eq!(check(&mut r, 10, order(1, 2, 100)), Ok(()));
    assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
    assert_eq!(
        check(&mut r, 10, order(2, 2, 100)),
        Err(RejectReason::FirmMaxOpenOrders)
    );
    r.on_order_done(&o1, 1);
    assert_eq!(check(&mut r, 10, order(2, 2, 100)), Ok(()));
}

#[test]
fn firm_limits_default_to_the_sum_of_the_accounts() {
    let mut r = firm_engine("");
    // 2 × 10 open orders, each account at its own limit: the firm takes all 20.
    for acct in [1, 2] {
        for q in 1..=10 {
            assert_eq!(check(&mut r, 10, order(acct, q, 100)), Ok(()));
        }
    }
    assert_eq!(r.firm_exposure().0, 20);
    let c = firm_cfg("credit_limit = 0");
    assert!(RiskEngine::new(&c)
        .unwrap_err()
        .to_string()
        .contains("risk.firm.credit_limit"));
}

#[test]
fn duplicate_client_order_id() {
    let mut r = engine();
    let o = order(2, 1, 100);
    assert_eq!(r.check_new(10, 42, &o, NOW), Ok(()));
    assert_eq!(
        r.check_new(10, 42, &o, NOW),
        Err(RejectReason::DuplicateClientOrderId)
    );
    // Ids are per engine.
    assert_eq!(r.check_new(11, 42, &o, NOW), Ok(()));
}

#[test]
fn restricted_and_halted() {
    let mut r = engine();
    let mut o = order(2, 1, 100);
    o.symbol = sym("BAD");
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::RestrictedSymbol));
    r.on_halt(sym("AAPL"), true);
    assert_eq!(
        check(&mut r, 10, order(2, 1, 100)),
        Err(RejectReason::Halted)
    );
    r.on_halt(sym("AAPL"), false);
    assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
}

#[test]
fn trading_hours() {
    let mut r = engine();
    let o = order(2, 1, 100);
    let early = NOW - 31 * 60 * SEC; // 14:29
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, early);
    assert_eq!(
        r.check_new(10, 1, &o, early),
        Err(RejectReason::OutsideTradingHours)
    );
    let open = NOW - 30 * 60 * SEC; // 14:30
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, open);
    assert_eq!(r.check_new(10, 2, &o, open), Ok(()));
    let close = NOW + 6 * 3600 * SEC; // 21:00
    r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, close);
    assert_eq!(
        r.check_new(10, 3, &o, close),
        Err(RejectReason::OutsideTradingHours)
    );
}

#[test]
fn kill_switches() {
    let mut r = engine();
    let o = order(2, 1, 100);
    r.set_kill(KillScope::Engine(10), true);
    assert_eq!(check(&mut r, 10, o), Err(RejectReason::KillSwitchEngine));
    assert_eq!(check(&mut r, 11, o), Ok(()));
    r.set_kill(KillScope::Engine(10), false);
    r.set_kill(KillScope::Account(2), true);
    assert_eq!(check(&mut r, 11, o), Err(RejectReason::KillSwitchAccount));
    assert_eq!(check(&mut r, 10, order(1, 1, 100)), Ok(()));
    r.set_kill(KillScope::Account(2), false);
    r.set_kill(KillScope::Global, true);
    assert_eq!(
        check(&mut r, 10, order(1, 1, 100)),
        Err(RejectReason::KillSwitchGlobal)
    );
    r.set_kill(KillScope::Global, false);
    assert_eq!(check(&mut r, 11, o), Ok(()));
}

#[test]
fn grants() {
    let mut r = engine();
    assert_eq!(
        check(&mut r, 11, order(1, 1, 100)),
        Err(RejectReason::AccountNotGranted)
    );
    assert_eq!(
        check(&mut r, 99, order(2, 1, 100)),
        Err(RejectReason::AccountNotGranted)
    );
    assert_eq!(check(&mut r, 10, order(1, 1, 100)), Ok(()));
}

#[test]
fn replace_checks_new_terms_and_moves_on_confirm() {
    let mut r = engine();
    let o = order(2, 400, 100);
    assert_eq!(check(&mut r, 10, o), Ok(()));
    let bigger = order(2, 501, 100);
    assert_eq!(
        r.check_replace(10, &o, 400, &bigger, NOW),
        Err(RejectReason::MaxNotional)
    );
    assert_eq!(r.exposure(2), (40_000, 0));
    let smaller = order(2, 100, 101);
    assert_eq!(r.check_replace(10, &o, 400, &smaller, NOW), Ok(()));
    assert_eq!(r.exposure(2), (40_000, 0));
    r.move_reservation(&o, &smaller);
    assert_eq!(r.exposure(2), (10_100, 0));
}

#[test]
fn config_errors_name_the_key() {
    let mut c = cfg();
    c.trading_end_utc = Some("25:00".into());
    assert!(RiskEngine::new(&c)
        .unwrap_err()
        .to_string()
        .contains("trading_end_utc"));
    let mut c = cfg();
    c.engines[0].accounts.push(77);
    assert!(matches!(
        RiskEngine::new(&c),
        Err(RiskConfigError::GrantWithoutAccount { account: 77, .. })
    ));
    for bad in [String::new(), "x".repeat(33)] {
        let mut c = cfg();
        c.engines[1].token = bad;
        assert!(matches!(
            RiskEngine::new(&c),
            Err(RiskConfigError::BadEngineToken(11))
        ));
    }
    let mut c = cfg();
    c.engines[1].id = 10;
    assert!(matches!(
        RiskEngine::new(&c),
        Err(RiskConfigError::DuplicateEngine(10))
    ));
    // The token never shows in debug output.
    assert!(!format!("{:?}", cfg().engines).contains("t10"));
    let mut c = cfg();
    c.throttle_interval_ms = 0;
    assert!(RiskEngine::new(&c)
        .unwrap_err()
        .to_string()
        .contains("risk.throttle_interval_ms"));
    let mut c = cfg();
    c.response_history = 0;
    assert!(RiskEngine::new(&c)
        .unwrap_err()
        .to_string()
        .contains("risk.response_history"));
    let mut c = cfg();
    c.max_malformed_frames = 0;
    assert!(RiskEngine::new(&c)
        .unwrap_err()
        .to_string()
        .contains("risk.max_malformed_frames"));
}
