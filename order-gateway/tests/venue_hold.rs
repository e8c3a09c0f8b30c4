//! The service's venue reconnects against a real QuickFIX acceptor (`venue/venue.py`): the
//! gateway loses its journal and comes back at MsgSeqNum 1; QuickFIX logs it out ("MsgSeqNum
//! too low, expecting N"). It does not log on again by itself; `status` on the control
//! socket shows the hold and N; after the operator's `venue-reconnect` it tries once more
//! (and is held again: nobody settled the numbers). A venue that refuses our Username and
//! Password is tried again backing off 1x, 2x, 4x, 4x the reconnect interval, its reason
//! shown to the operator, and stays up to accept the right ones later.
//!
//! The service's engine listener needs an RDMA device, so these tests run the service's
//! venue reconnect policy ([`VenueReconnect`]) and its control socket ([`ControlServer`]
//! answering with `control::execute`) around a driver of their own, as the service loop does,
//! and talk to the socket with the real `order-gateway control`. Logons are counted at the
//! venue (QuickFIX's message log). Needs Python 3 with `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use order_gateway::control::{self, ControlServer};
use order_gateway::driver::FixDriver;
use order_gateway::fix::{Secret, SessionConfig, SessionState};
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::PRICE_SCALE;
use order_gateway::service::{VenueConnect, VenueReconnect};
use order_gateway::unix_nanos;

/// The first wait of the back-off: short, so a gateway that retries by itself would do it
/// several times within the windows below.
const RECONNECT: Duration = Duration::from_secs(1);

/// What the service loop does for the venue: reconnect policy, venue bytes and timers,
/// control socket.
struct Loop {
    d: FixDriver,
    reconnect: VenueReconnect,
    control: ControlServer,
    /// A gateway configuration naming the control socket, for `order-gateway control`.
    config: PathBuf,
    /// When each venue connect completed (its Logon sent).
    connects: Vec<Instant>,
}

impl Loop {
    fn new(d: FixDriver, dir: &Path) -> Loop {
        let socket = dir.join("gw.control");
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml");
        // Keys, not the shipped samples (which the gateway refuses).
        let cfg = std::fs::read_to_string(example)
            .unwrap()
            .replace(
                "token = \"change-me\"",
                "token = \"4c1e7a0d9b3f62e58a17c4d0b9e36f21a5d87c04e2b91f3a6c58d07e4b29a1f3\"",
            )
            .replace(
                "token = \"change-me-engine-1\"",
                "token = \"8f2b5c7e1a9d04c36e8b2f1d7a5c90e4\"",
            )
            .replace(
                "control_socket = \".rocebus/order-gateway.control\"",
                &format!("control_socket = {:?}", socket.display().to_string()),
            );
        let config = dir.join("gw.toml");
        std::fs::write(&config, cfg).unwrap();
        Loop {
            d,
            reconnect: VenueReconnect::new(RECONNECT, rocebus::clock::Mono::now()),
            control: ControlServer::bind(&socket).unwrap(),
            config,
            connects: Vec::new(),
        }
    }

    fn turn(&mut self) {
        if self
            .reconnect
            .poll(&mut self.d, rocebus::clock::Now::read())
            == VenueConnect::Connected
        {
            self.connects.push(Instant::now());
        }
        self.d.poll(Duration::from_millis(2)).unwrap();
        let d = &mut self.d;
        self.control
            .poll(|line| control::execute(line, d, 0, unix_nanos()));
    }

    fn run_for(&mut self, d: Duration) {
        let t = Instant::now();
        while t.elapsed() < d {
            self.turn();
        }
    }

    fn run_until(&mut self, what: &str, mut done: impl FnMut(&FixDriver) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done(&self.d) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; counters {:?}",
                self.d.gateway().session().counters()
            );
            self.turn();
        }
    }

    /// `order-gateway control <line>` while the loop turns: its output.
    fn operator(&mut self, line: &str) -> String {
        let mut child = Command::new(env!("CARGO_BIN_EXE_order-gateway"))
            .args(["control", "--config"])
            .arg(&self.config)
            .args(line.split(' '))
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while child.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "`control {line}` hangs");
            self.turn();
        }
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "`control {line}`: {text}");
        text
    }
}

fn seq_too_low(d: &FixDriver) -> u64 {
    d.gateway().session().counters().seq_too_low_logouts
}

#[test]
fn a_lost_journal_logs_on_too_low_once_then_waits_for_the_operator() {
    let dir = scratch("venue-hold");
    let venue = Venue::start(&dir.join("venue"), free_port());
    // The journal in a directory of its own, lost whole below.
    let journal_dir = dir.join("gw");
    let journal = journal_dir.join("gw.journal");

    // A session with traffic: both sides' numbers well above 1.
    let mut d = gateway(venue.port, &journal);
    let mut e = Engine::new(1);
    for i in 1..=10 {
        e.send(&mut d, i);
    }
    pump(&mut d, &mut e, 30, |e| {
        e.open().is_empty() && e.finals.len() == 10
    });
    assert!(e.errors.is_empty(), "engine errors: {:?}", e.errors);
    let expected = d.gateway().session().next_out();
    assert!(expected > 10, "our next MsgSeqNum {expected}");
    assert_eq!(venue.logons_received(), 1);
    drop(d);

    // The journal is lost: the gateway comes back at MsgSeqNum 1.
    std::fs::remove_dir_all(&journal_dir).unwrap();
    let d = FixDriver::open_with(
        &format!("127.0.0.1:{}", venue.port),
        session_config(),
        &risk_config(),
        &journal,
        FsyncPolicy::Never,
    )
    .unwrap();
    assert_eq!(d.gateway().session().next_out(), 1);
    let mut gw = Loop::new(d, &dir);
    gw.run_until("QuickFIX's \"MsgSeqNum too low\" Logout", |d| {
        seq_too_low(d) >= 1
    });
    assert_eq!(venue.logons_received(), 2, "our Logon at 1");

    // (a) Not by itself: a gateway that retried, backing off from `RECONNECT`, would have
    // logged on again several times in this window.
    gw.run_for(Duration::from_secs(6));
    assert_eq!(
        venue.logons_received(),
        2,
        "the gateway logged on again by itself after \"MsgSeqNum too low\""
    );
    assert!(!gw.d.is_connected() && !gw.d.is_connecting());
    // (c) Counted once: the counter the counters file publishes ("fix logouts for our
    // MsgSeqNum too low"), and the Logon counts as refused.
    let c = gw.d.gateway().session().counters();
    assert_eq!((c.seq_too_low_logouts, c.logons_refused), (1, 1));
    assert_eq!(gw.d.gateway().reconnect_hold(), Some(expected));

    // (b) The operator sees the hold and the number the venue expects.
    let status = gw.operator("status");
    assert!(
        status.contains(&format!(
            "venue logon held    the venue expects MsgSeqNum {expected}, our next is "
        )),
        "{status}"
    );

    // (d) Released: one more Logon, refused the same way (the numbers were not settled),
    // and held again.
    let answer = gw.operator("venue-reconnect");
    assert!(
        answer.starts_with("ok: logging on to the venue again")
            && answer.contains(&format!("expects MsgSeqNum {expected}")),
        "{answer}"
    );
    gw.run_until("the Logon after venue-reconnect", |d| seq_too_low(d) >= 2);
    assert_eq!(
        venue.logons_received(),
        3,
        "one Logon after venue-reconnect"
    );
    gw.run_for(Duration::from_secs(3));
    assert_eq!(venue.logons_received(), 3, "held again");
    assert_eq!(seq_too_low(&gw.d), 2);
    assert!(gw.operator("status").contains("venue logon held"));
    // Both refused Logons count as failures in a row: opening the socket between them
    // did not reset the back-off (only an accepted Logon does).
    assert_eq!(gw.reconnect.failures(), 2);
}

/// The gateway's session as the test venue knows it, logging on as `trader1`.
fn with_password(password: &str) -> SessionConfig {
    SessionConfig {
        username: Some("trader1".into()),
        password: Some(Secret::new(password)),
        ..session_config()
    }
}

#[test]
fn a_venue_refusing_our_password_is_backed_off_and_stays_up_for_the_right_one() {
    let dir = scratch("venue-refuses");
    let mut venue = Venue::start_with(
        &dir.join("venue"),
        free_port(),
        &["--username", "trader1", "--password", "right"],
    );
    let journal = dir.join("gw").join("gw.journal");
    let port = venue.port;
    let open = |password: &str| {
        let mut d = FixDriver::open_with(
            &format!("127.0.0.1:{port}"),
            with_password(password),
            &risk_config(),
            &journal,
            FsyncPolicy::Never,
        )
        .unwrap();
        d.with_gateway(|gw, _| {
            for s in symbols() {
                gw.on_reference_price(s, 100 * PRICE_SCALE, unix_nanos());
            }
        })
        .unwrap();
        d
    };
    let mut gw = Loop::new(open("wrong"), &dir);

    // Five Logons, each answered with the venue's Logout (QuickFIX's RejectLogon): the
    // waits between them double from RECONNECT up to 4x it.
    const REFUSALS: u64 = 5;
    let refused = |d: &FixDriver| d.gateway().session().counters().logons_refused;
    for n in 1..=REFUSALS {
        gw.run_until("the venue's refusal of our Logon", |d| refused(d) >= n);
        assert!(
            venue.is_running(),
            "the venue died refusing Logon {n} (see its stderr above)"
        );
    }
    // The last refusal reaches the back-off at the turn after the disconnect.
    gw.run_for(Duration::from_millis(100));
    let waits: Vec<Duration> = gw.connects.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(waits.len() as u64, REFUSALS - 1, "connects: {waits:?}");
    for (wait, factor) in waits.iter().zip([1, 2, 4, 4]) {
        // At least the back-off; not much more (the refusal comes within milliseconds).
        let due = RECONNECT * factor;
        assert!(
            *wait >= due && *wait < due + Duration::from_millis(900),
            "waits between refused Logons {waits:?}, expected 1x, 2x, 4x, 4x {RECONNECT:?}"
        );
    }
    assert_eq!(gw.reconnect.failures(), REFUSALS as u32);
    assert_eq!(gw.d.gateway().reconnect_hold(), None, "refused is not held");
    // The venue saw each Logon and refused each; the gateway knows why.
    assert_eq!(venue.logons_received(), REFUSALS as usize);
    let refusals = venue
        .received()
        .iter()
        .filter(|l| l[0] == "refused")
        .count();
    assert_eq!(refusals as u64, REFUSALS);
    assert_eq!(
        gw.d.gateway().session().logon_refusal(),
        Some("bad Username or Password")
    );
    assert_eq!(gw.d.gateway().session().counters().seq_too_low_logouts, 0);
    let status = gw.operator("status");
    assert!(
        status.contains("venue session       down\n")
            && status.contains(&format!(
                "venue logons refused {REFUSALS}, the last: \"bad Username or Password\"\n"
            )),
        "{status}"
    );

    // The operator fixes the password and restarts the gateway: the venue, still up, lets
    // it in (its numbers recovered over the refusals) and orders go through.
    drop(gw);
    assert!(venue.is_running());
    let mut gw = Loop::new(open("right"), &dir);
    gw.run_until("the Logon with the right password", |d| {
        d.is_connected() && d.gateway().session().state() == SessionState::Active
    });
    gw.turn();
    assert_eq!(
        gw.reconnect.failures(),
        0,
        "an accepted Logon ends the failures"
    );
    let mut e = Engine::new(1);
    for i in 1..=3 {
        e.send(&mut gw.d, i);
    }
    pump(&mut gw.d, &mut e, 20, |e| {
        e.open().is_empty() && e.finals.len() == 3
    });
    assert!(e.errors.is_empty(), "engine errors: {:?}", e.errors);
    assert!(venue.is_running());
    assert_eq!(venue.logons_received(), REFUSALS as usize + 1);
}
