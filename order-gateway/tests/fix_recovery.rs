//! FIX session recovery against a real QuickFIX acceptor (`venue/venue.py`): the venue resets
//! sequence numbers (Logon 141=Y, SequenceReset-Reset) in mid-session and orders keep flowing
//! on the same connection. Needs Python 3 with `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::time::{Duration, Instant};

use common::*;
use order_gateway::fix::{Secret, SessionConfig, SessionState};
use order_gateway::journal::FsyncPolicy;

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
