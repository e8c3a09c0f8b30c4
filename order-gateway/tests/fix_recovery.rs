//! FIX session recovery against a real QuickFIX acceptor (`venue/venue.py`): the venue resets
//! sequence numbers (Logon 141=Y, SequenceReset-Reset) in mid-session and orders keep flowing
//! on the same connection. Needs Python 3 with `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use order_gateway::fix::{Secret, SessionConfig, SessionState};
use order_gateway::gateway::OrderStatus;
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::PRICE_SCALE;

/// Sends orders `from..=to` and waits until all are final.
fn round_trip(d: &mut order_gateway::driver::FixDriver, e: &mut Engine, from: u64, to: u64) {
    for i in from..=to {
        e.send(d, i);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !e.open().is_empty() {
        assert!(Instant::now() < deadline, "open: {:?}", e.open());
        d.poll(Duration::from_millis(2)).unwrap();
        e.deliver(d);
        e.cancel_resting(d);
    }
    assert!(e.errors.is_empty(), "engine errors: {:?}", e.errors);
}

fn pump_until(
    d: &mut order_gateway::driver::FixDriver,
    what: &str,
    mut f: impl FnMut(&order_gateway::driver::FixDriver) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f(d) {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        d.poll(Duration::from_millis(2)).unwrap();
    }
}

#[test]
fn venue_resets_in_mid_session_and_orders_keep_flowing() {
    let dir = scratch("fix-reset");
    let mut venue = Venue::start(&dir.join("venue"), free_port());
    let mut d = gateway(venue.port, &dir.join("gw.journal"));
    let mut e = Engine::new(1);
    round_trip(&mut d, &mut e, 1, 40);
    assert!(d.gateway().session().next_in() > 40);

    // Logon 141=Y from QuickFIX: we answer once, its answer confirms, nobody logs out.
    venue.command("reset");
    pump_until(&mut d, "the reset", |d| {
        d.gateway().session().counters().resets_received == 1
            && d.gateway().session().next_in() >= 3
    });
    // Let any (wrong) Logon ping-pong or logout show itself.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(500) {
        d.poll(Duration::from_millis(2)).unwrap();
    }
    let s = d.gateway().session();
    assert_eq!(s.state(), SessionState::Active);
    assert_eq!((s.next_out(), s.next_in()), (2, 3), "{:?}", s.counters());
    assert!(d.is_connected());
    round_trip(&mut d, &mut e, 41, 60);

    // SequenceReset-Reset 100 ahead: we expect the new number, QuickFIX goes on from it.
    let before = d.gateway().session().next_in();
    venue.command("seqreset 100");
    pump_until(&mut d, "the sequence reset", |d| {
        d.gateway().session().next_in() >= before + 100
    });
    round_trip(&mut d, &mut e, 61, 80);
    let s = d.gateway().session();
    assert_eq!(s.state(), SessionState::Active);
    assert_eq!(s.counters().resets_received, 2);
    assert_eq!(s.counters().rejects_sent, 0);
    assert_eq!(e.finals.len(), 80);
    assert!(e.finals.values().all(|&c| c == 1));
}

/// `reset_on_logon` against QuickFIX with ResetOnLogon=Y and credentials it checks: orders
/// flow, the gateway crashes (resting orders sent just before, their answers unread) and
/// restarts, the session starts again at 1, the orders in doubt are resolved by status
/// requests, and nothing is lost or sent twice.
#[test]
fn reset_on_logon_with_credentials_resumes_from_1_after_a_gateway_restart() {
    let dir = scratch("fix-reset-on-logon");
    let args = [
        "--reset-on-logon",
        "--username",
        "trader1",
        "--password",
        "pw-it-s3cret",
    ];
    let venue = Venue::start_with(&dir.join("venue"), free_port(), &args);
    let cfg = SessionConfig {
        reset_on_logon: true,
        username: Some("trader1".into()),
        password: Some(Secret::new("pw-it-s3cret")),
        ..session_config()
    };
    let journal = dir.join("gw.journal");
    let open = |cfg: &SessionConfig| {
        gateway_session(venue.port, &journal, FsyncPolicy::Never, cfg.clone())
    };
    let mut d = open(&cfg);
    let mut e = Engine::new(1);
    round_trip(&mut d, &mut e, 1, 30);
    let (out_before, in_before) = {
        let s = d.gateway().session();
        (s.next_out(), s.next_in())
    };
    assert!(
        out_before > 30 && in_before > 30,
        "{out_before} {in_before}"
    );
    // Orders in flight, then a crash: no logout, their answers unread. They are of the
    // kind that rests (no fill): a reset loses the execution reports the venue sent before
    // it, and the status answer acknowledges an order but does not carry its fills.
    for i in [39, 59, 79, 99, 119] {
        e.send(&mut d, i);
    }
    d.poll(Duration::from_millis(1)).unwrap();
    // What the gateway answered before the crash reaches the engine (a real engine gets it
    // replayed at its next logon; this in-process one has no logon).
    e.deliver(&mut d);
    drop(d);

    let mut d = open(&cfg);
    let s = d.gateway().session();
    assert_eq!(s.state(), SessionState::Active);
    // Started again at 1: our Logon, then at most a status request per order in doubt.
    assert!(s.next_out() <= 2 + 5, "next_out {}", s.next_out());
    assert!(s.next_in() < 10, "next_in {}", s.next_in());
    assert_eq!(s.counters().rejects_sent, 0);
    // Orders in doubt are resolved, the session goes on.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !e.open().is_empty() {
        assert!(Instant::now() < deadline, "still open: {:?}", e.open());
        d.poll(Duration::from_millis(2)).unwrap();
        e.deliver(&mut d);
        e.cancel_resting(&mut d);
    }
    round_trip(&mut d, &mut e, 36, 60);
    assert!(d.is_connected());
    assert_eq!(e.finals.len(), 60);
    assert!(e.finals.values().all(|&c| c == 1), "a final answer twice");
    let lines = venue.received();
    assert!(
        lines.iter().all(|l| l[0] != "dup"),
        "an order reached the venue twice: {:?}",
        lines.iter().find(|l| l[0] == "dup")
    );
    // The password went to the venue, never to the journal.
    let bytes = std::fs::read(&journal).unwrap();
    assert!(!bytes.windows(12).any(|w| w == b"pw-it-s3cret"));
}

/// `reset_on_logon` against QuickFIX: executions the venue makes while the gateway is down
/// are reported before the next logon's reset and never read. The status requests sent
/// after the reset (for every live order, acknowledged ones included) recover them: no
/// order the venue filled stays open, the engine receives the fills, at the prices that
/// make the venue's average, and positions follow.
#[test]
fn reset_on_logon_recovers_fills_the_venue_made_while_the_gateway_was_down() {
    let dir = scratch("fix-reset-fills");
    let mut venue = Venue::start_with(&dir.join("venue"), free_port(), &["--reset-on-logon"]);
    let cfg = SessionConfig {
        reset_on_logon: true,
        ..session_config()
    };
    let journal = dir.join("gw.journal");
    let port = venue.port;
    let open =
        |cfg: &SessionConfig| gateway_session(port, &journal, FsyncPolicy::Never, cfg.clone());
    let mut d = open(&cfg);
    let mut e = Engine::new(1);
    round_trip(&mut d, &mut e, 1, 10);
    // Three resting sells of 2000 AAPL at 100, acknowledged.
    let ids: Vec<u64> = [19, 39, 59].iter().map(|&i| e.send(&mut d, i)).collect();
    pump(&mut d, &mut e, 30, |e| {
        ids.iter().all(|&id| {
            e.client
                .order(id)
                .is_some_and(|o| o.state == order_gateway::client::OrderState::New)
        })
    });
    let venue_id = |d: &order_gateway::driver::FixDriver, id: u64| {
        d.gateway().order(ENGINE, id).unwrap().venue_cl_ord_id
    };
    let v: Vec<u64> = ids.iter().map(|&id| venue_id(&d, id)).collect();
    // One is partly filled while the gateway is up: that report is read.
    venue.command(&format!("fill {} 500 101", v[0]));
    pump(&mut d, &mut e, 30, |e| {
        e.client.order(ids[0]).is_some_and(|o| o.cum_qty == 500)
    });
    let [aapl, _, _] = symbols();
    let position_before = d.gateway().risk().position(ACCOUNT, aapl);
    drop(d);

    // While the gateway is down the venue fills the rest of the first, all of the second,
    // part of the third. Those reports are sent (QuickFIX stores them) and lost in the
    // reset of the next logon.
    venue.command(&format!("fill {} 1500 102", v[0]));
    venue.command(&format!("fill {} 2000 99.5", v[1]));
    venue.command(&format!("fill {} 800 100", v[2]));
    let deadline = Instant::now() + Duration::from_secs(10);
    while venue.received().iter().filter(|l| l[0] == "fill").count() < 4 {
        assert!(
            Instant::now() < deadline,
            "venue fills: {:?}",
            venue.received()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let mut d = open(&cfg);
    let before = e.responses;
    pump(&mut d, &mut e, 30, |e| {
        e.client.order(ids[0]).is_some_and(|o| o.state.is_final())
            && e.client.order(ids[1]).is_some_and(|o| o.state.is_final())
            && e.client.order(ids[2]).is_some_and(|o| o.cum_qty == 800)
    });
    assert!(e.responses > before);
    assert!(e.errors.is_empty(), "{:?}", e.errors);
    let g = d.gateway();
    for (id, cum) in [(ids[0], 2000), (ids[1], 2000), (ids[2], 800)] {
        let o = g.order(ENGINE, id).unwrap();
        assert_eq!(o.cum_qty, cum, "order {id}");
        assert_eq!(
            e.client.order(id).unwrap().cum_qty,
            cum,
            "engine's order {id}"
        );
    }
    assert_eq!(g.order(ENGINE, ids[0]).unwrap().status, OrderStatus::Done);
    assert_eq!(g.order(ENGINE, ids[1]).unwrap().status, OrderStatus::Done);
    assert_eq!(g.order(ENGINE, ids[2]).unwrap().status, OrderStatus::Open);
    // Sells: the position fell by what was executed while down.
    assert_eq!(
        g.risk().position(ACCOUNT, aapl),
        position_before - 1500 - 2000 - 800
    );
    assert_eq!(g.counters().status_fills, 3);
    // The first order's average is the venue's: 500 at 101, so the 1500 at 102.
    assert_eq!(
        g.order(ENGINE, ids[0]).unwrap().notional,
        i128::from(500 * 101 * PRICE_SCALE + 1500 * 102 * PRICE_SCALE)
    );
    // The session goes on (the partly filled order is cancelled: Canceled with the 1200
    // left); a restart from the journal lands on the same book.
    let c = e.client.cancel(ids[2]);
    d.engine_message(ENGINE, zerocopy::IntoBytes::as_bytes(&c))
        .unwrap();
    round_trip(&mut d, &mut e, 60, 70);
    assert_eq!(
        d.gateway().order(ENGINE, ids[2]).unwrap().status,
        OrderStatus::Done
    );
    let position = d.gateway().risk().position(ACCOUNT, aapl);
    let open_orders = d.gateway().open_order_count();
    drop(d);
    // Recovery only (no connection): the journal's status answers replay into the book.
    let r = order_gateway::driver::FixDriver::open_with(
        &format!("127.0.0.1:{port}"),
        cfg.clone(),
        &risk_config(),
        &journal,
        FsyncPolicy::Never,
    )
    .unwrap();
    let r = r.gateway();
    assert_eq!(r.risk().position(ACCOUNT, aapl), position);
    assert_eq!(r.open_order_count(), open_orders);
    assert_eq!(r.order(ENGINE, ids[1]).unwrap().cum_qty, 2000);
}
