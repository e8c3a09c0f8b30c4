//! Clean stop against the QuickFIX venue (issue 40): SIGTERM to a gateway process makes it
//! log out of the venue (the venue's message log shows our Logout, 35=5), wait for the
//! venue's answer, write a checkpoint and exit 0; the restart logs on with the next
//! sequence numbers, which the venue accepts.
//!
//! The gateway process is this test binary re-executed with `GW_CLEAN_STOP_CHILD` set: it
//! runs the driver loop with the service's own signal wiring
//! ([`ServiceControl::stop_on_signals`]) and, once stopping, the same
//! [`FixDriver::stop`] the service's shutdown calls. (`order-gateway run` itself needs an
//! RDMA device for its engine listener, so it is not run here.) Needs Python 3 with
//! `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use order_gateway::fix::SessionState;
use order_gateway::journal::FsyncPolicy;
use order_gateway::service::{ServiceControl, STOP_LOGOUT_WAIT};

const CHILD_ENV: &str = "GW_CLEAN_STOP_CHILD";

/// The child: a gateway taking a few orders, then polling until SIGTERM.
#[test]
#[ignore = "child: the gateway process of the clean-stop test, run by it"]
fn child_clean_stop() {
    let spec = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("child process of the clean-stop test: run with {CHILD_ENV}"));
    let (port, journal) = spec.split_once(' ').unwrap();
    let control = ServiceControl::new();
    control.stop_on_signals().unwrap();
    let mut d = gateway_with(
        port.parse().unwrap(),
        Path::new(journal),
        FsyncPolicy::Never,
    );
    d.set_segment_bytes(1 << 20);
    let mut e = Engine::new(1);
    for i in 1..=10 {
        e.send(&mut d, i);
    }
    pump(&mut d, &mut e, 30, |e| {
        e.client
            .orders()
            .all(|(_, o)| o.state != order_gateway::client::OrderState::PendingNew)
    });
    println!("READY");
    while !control.is_stopping() {
        d.poll(Duration::from_millis(5)).unwrap();
        e.deliver(&mut d);
    }
    let report = d.stop(STOP_LOGOUT_WAIT, |_, _| {}).unwrap();
    assert!(report.logout_sent && report.logout_answered, "{report:?}");
    assert!(report.checkpoint, "{report:?}");
    println!(
        "STOPPED next_out={} next_in={}",
        d.gateway().session().next_out(),
        d.gateway().session().next_in()
    );
}

/// Our Logouts (35=5 sent by GW) in the venue's QuickFIX message logs.
fn logouts_from_us(venue_dir: &Path) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(venue_dir.join("log")).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().contains("messages") {
            continue;
        }
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned();
        n += text
            .lines()
            .filter(|l| l.contains("\x0135=5\x01") && l.contains("\x0149=GW\x01"))
            .count();
    }
    n
}

#[test]
fn sigterm_logs_out_checkpoints_exits_zero_and_the_restart_resumes() {
    let dir = scratch("clean-stop");
    let mut venue = Venue::start(&dir.join("venue"), free_port());
    let journal: PathBuf = dir.join("gw.journal");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_clean_stop",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, format!("{} {}", venue.port, journal.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        let line = lines
            .next()
            .unwrap_or_else(|| panic!("child ended before READY: {seen:?}"))
            .unwrap();
        if line.contains("READY") {
            break;
        }
        seen.push(line);
    }
    assert_eq!(logouts_from_us(&venue.dir), 0);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let t = Instant::now();
    let status = child.wait().unwrap();
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(status.success(), "exit {status:?}; output: {rest:?}");
    assert_eq!(status.code(), Some(0));
    assert!(
        t.elapsed() < STOP_LOGOUT_WAIT + Duration::from_secs(3),
        "the stop took {:?}",
        t.elapsed()
    );
    assert_eq!(logouts_from_us(&venue.dir), 1, "no Logout (35=5) from us");
    let stopped = rest
        .iter()
        .find_map(|l| l.strip_prefix("STOPPED "))
        .unwrap_or_else(|| panic!("{rest:?}"))
        .to_owned();
    let next_out: u64 = stopped
        .split(' ')
        .find_map(|w| w.strip_prefix("next_out="))
        .unwrap()
        .parse()
        .unwrap();
    assert!(venue.is_running());

    // The restart reads the checkpoint and logs on with our next number: the venue takes
    // it (a number too low would be logged out, one too high would make it ask a resend).
    let d = gateway(venue.port, &journal);
    assert_eq!(d.gateway().session().state(), SessionState::Active);
    assert!(
        d.recovery().records <= 2,
        "replayed {} records, not the checkpoint",
        d.recovery().records
    );
    assert!(
        d.gateway().session().next_out() > next_out,
        "ours {} after the stop's {next_out}",
        d.gateway().session().next_out()
    );
    assert_eq!(d.gateway().session().counters().seq_too_low_logouts, 0);
    assert_eq!(
        d.gateway().orders().count(),
        10,
        "the day survived the stop"
    );
    assert_eq!(venue.logons_received(), 2);
}
