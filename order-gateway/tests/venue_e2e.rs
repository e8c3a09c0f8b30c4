//! End-to-end against a real QuickFIX acceptor (`venue/venue.py`), on loopback.
//!
//! Needs Python 3 with `quickfix-ssl` (`pip install -r order-gateway/venue/requirements.txt`);
//! without it these tests fail with that instruction rather than pass.

mod common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::*;
use order_gateway::client::OrderState;
use order_gateway::gateway::OrderStatus;
use order_gateway::proto::RejectReason;

/// Venue-side witness: every NewOrderSingle ClOrdID executed at most once, and the set of
/// ClOrdIDs the venue accepted.
fn venue_orders(lines: &[Vec<String>]) -> HashSet<String> {
    let mut seen = HashSet::new();
    for l in lines.iter().filter(|l| l[0] == "D") {
        assert!(
            seen.insert(l[1].clone()),
            "venue executed ClOrdID {} twice",
            l[1]
        );
    }
    seen
}

/// Checks engine and gateway agree on every order and every order got one final answer.
fn check_consistent(e: &Engine, d: &order_gateway::driver::FixDriver, n: u64) {
    assert!(
        e.errors.is_empty(),
        "engine saw bad responses: {:?}",
        &e.errors[..e.errors.len().min(5)]
    );
    assert_eq!(e.finals.len() as u64, n, "orders with a final answer");
    assert!(
        e.finals.values().all(|&c| c == 1),
        "an order was answered twice"
    );
    let gw = d.gateway();
    for (id, o) in e.client.orders() {
        let g = gw.order(ENGINE, id);
        match o.state {
            OrderState::Rejected(RejectReason::VenueReject) => {
                assert_eq!(g.unwrap().status, OrderStatus::Done)
            }
            OrderState::Rejected(r) => panic!("order {id} rejected by the gateway: {r:?}"),
            OrderState::Filled | OrderState::Canceled => {
                let g = g.unwrap();
                assert_eq!(g.status, OrderStatus::Done);
                assert_eq!(g.cum_qty, o.cum_qty, "cum qty of {id}");
            }
            s => panic!("order {id} not final: {s:?}"),
        }
    }
    assert_eq!(gw.open_order_count(), 0);
    let [aapl, msft, _] = symbols();
    for s in [aapl, msft] {
        assert_eq!(
            gw.risk().position(ACCOUNT, s),
            e.client.position(s),
            "position {s}"
        );
    }
    assert_eq!(gw.risk().open_orders(ACCOUNT), 0);
}

#[test]
fn ten_thousand_orders_round_trip() {
    let dir = scratch("10k");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let mut d = gateway(venue.port, &dir.join("gw.journal"));
    let mut e = Engine::new(1);
    const N: u64 = 10_000;
    let mut sent = 0;
    while sent < N {
        // Keep a window of outstanding orders, like an engine would.
        while sent < N && e.open().len() < 256 {
            sent += 1;
            e.send(&mut d, sent);
        }
        d.poll(Duration::from_millis(1)).unwrap();
        e.deliver(&mut d);
        e.cancel_resting(&mut d);
    }
    check_consistent_after_cancels(&mut e, &mut d, N);
    let venue_seen = venue_orders(&venue.received());
    assert_eq!(
        venue_seen.len() as u64,
        N,
        "every order reached the venue once"
    );
}

#[test]
fn gateway_crash_and_restart_loses_nothing_sends_nothing_twice() {
    let dir = scratch("crash");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let journal = dir.join("gw.journal");
    let mut e = Engine::new(1);
    let mut d = gateway(venue.port, &journal);
    for i in 1..=1000 {
        e.send(&mut d, i);
        if i % 50 == 0 {
            d.poll(Duration::from_millis(1)).unwrap();
            e.deliver(&mut d);
        }
    }
    // Crash: no logout, unread execution reports are lost with the socket.
    drop(d);
    let mut d = gateway(venue.port, &journal);
    assert!(
        d.recovery().records > 1000,
        "journal replayed {:?}",
        d.recovery()
    );
    let recovered = d.gateway().orders().count();
    assert_eq!(recovered, 1000, "orders rebuilt from the journal");
    for i in 1001..=2000 {
        e.send(&mut d, i);
        if i % 50 == 0 {
            d.poll(Duration::from_millis(1)).unwrap();
            e.deliver(&mut d);
            e.cancel_resting(&mut d);
        }
    }
    check_consistent_after_cancels(&mut e, &mut d, 2000);
    let lines = venue.received();
    let seen = venue_orders(&lines);
    assert_eq!(seen.len(), 2000, "every order reached the venue once");
    assert!(
        lines.iter().all(|l| l[0] != "dup"),
        "the venue was sent an order twice: {:?}",
        lines.iter().find(|l| l[0] == "dup")
    );
    // QuickFIX's own store: the incoming message log has each ClOrdID of 35=D in one MsgSeqNum.
    assert_quickfix_log_unique(&dir.join("venue"));
}

/// Cancels resting orders as they are acknowledged until every order is final, then checks.
fn check_consistent_after_cancels(
    e: &mut Engine,
    d: &mut order_gateway::driver::FixDriver,
    n: u64,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !e.open().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out; open: {:?}",
            &e.open()[..e.open().len().min(10)]
        );
        d.poll(Duration::from_millis(2)).unwrap();
        e.deliver(d);
        e.cancel_resting(d);
    }
    check_consistent(e, d, n);
}

/// Parses QuickFIX's FileLog messages log and checks no NewOrderSingle ClOrdID arrived under
/// two different sequence numbers (a PossDup resend of the same sequence number is the same
/// message, not a second order).
fn assert_quickfix_log_unique(venue_dir: &std::path::Path) {
    let log_dir = venue_dir.join("log");
    let mut by_cl: HashMap<String, HashSet<String>> = HashMap::new();
    let mut found = false;
    for entry in std::fs::read_dir(&log_dir).unwrap() {
        let p = entry.unwrap().path();
        if !p.to_string_lossy().ends_with("messages.current.log") {
            continue;
        }
        found = true;
        for line in std::fs::read_to_string(&p).unwrap().lines() {
            let fields: HashMap<&str, &str> = line
                .split('\x01')
                .filter_map(|f| f.split_once('='))
                .map(|(t, v)| (t.rsplit(' ').next().unwrap_or(t), v))
                .collect();
            if fields.get("35") == Some(&"D") && fields.get("49") == Some(&"GW") {
                by_cl
                    .entry(fields["11"].to_owned())
                    .or_default()
                    .insert(fields["34"].to_owned());
            }
        }
    }
    assert!(found, "no QuickFIX message log in {}", log_dir.display());
    assert!(!by_cl.is_empty());
    for (cl, seqs) in by_cl {
        assert_eq!(seqs.len(), 1, "ClOrdID {cl} sent as {seqs:?}");
    }
}

#[test]
fn venue_restart_resend_and_gap_fill() {
    let dir = scratch("venue-restart");
    let vdir = dir.join("venue");
    let port = free_port();
    let venue = Venue::start(&vdir, port);
    let journal = dir.join("gw.journal");
    let mut e = Engine::new(1);
    let mut d = gateway(port, &journal);
    let [aapl, _, _] = symbols();
    // A burst the venue cannot have processed completely when it dies.
    for _ in 0..500 {
        let (_, m) = e.client.new_order(
            ACCOUNT,
            aapl,
            order_gateway::proto::Side::Buy,
            50,
            100 * order_gateway::proto::PRICE_SCALE,
        );
        d.engine_message(ENGINE, zerocopy::IntoBytes::as_bytes(&m))
            .unwrap();
    }
    venue.kill();
    // Whatever the venue answered is unread and lost with the socket.
    d.drop_connection();
    let venue = Venue::start(&vdir, port);
    connect(&mut d);
    pump(&mut d, &mut e, 120, |e| e.open().is_empty());
    check_consistent(&e, &d, 500);
    let c = d.gateway().session().counters();
    assert!(
        c.resend_requests_sent > 0,
        "we never asked the venue to resend: {c:?}"
    );
    assert!(
        c.messages_resent + c.gap_fills_sent > 0,
        "the venue never needed our resend: {c:?}"
    );
    let seen = venue_orders(&venue.received());
    assert_eq!(seen.len(), 500);
}
