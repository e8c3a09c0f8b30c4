//! FIX session recovery against a real QuickFIX acceptor (`venue/venue.py`): the venue resets
//! sequence numbers (Logon 141=Y, SequenceReset-Reset) in mid-session and orders keep flowing
//! on the same connection. Needs Python 3 with `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use order_gateway::fix::SessionState;

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
