//! Disk full, against the QuickFIX venue: a journal that cannot be written (the file-size
//! limit, RLIMIT_FSIZE, set in a child process) makes new requests come back "not taken"
//! (`JournalUnavailable`, unnumbered), loses nothing acknowledged, and once space returns the
//! gateway logs on again, recovers what the venue sent meanwhile (ResendRequest), and the
//! requests not taken are sent again with the same numbers and ids, after a new request
//! was taken: the venue sees every ClOrdID exactly once. Needs Python 3 with `quickfix`,
//! like `venue_e2e`. `RUST_LOG=info` adds the gateway's log to a failure's output.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use order_gateway::client::OrderState;
use order_gateway::journal::{self, FsyncPolicy};
use order_gateway::proto::{RejectReason, Response};
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

const CHILD_ENV: &str = "GW_DISK_FULL_CHILD";

fn limit_file_size(bytes: Option<u64>) {
    let hard = getrlimit(Resource::Fsize).maximum;
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: bytes.or(hard),
            maximum: hard,
        },
    )
    .unwrap();
}

/// Sends order `i` of the standard mix, polls a little and applies the responses; returns
/// the `JournalUnavailable` rejects seen.
fn step(d: &mut order_gateway::driver::FixDriver, e: &mut Engine, i: u64) -> usize {
    e.send(d, i);
    let mut unavailable = 0;
    for _ in 0..3 {
        d.poll(Duration::from_millis(2)).unwrap();
        let rs = d.take_engine_responses();
        for (_, r) in &rs {
            if let Response::Reject(x) = r {
                if x.reason() == RejectReason::JournalUnavailable {
                    assert_eq!(x.header.seq.get(), 0, "not-taken answers are unnumbered");
                    unavailable += 1;
                }
            }
            if let Err(err) = e.client.on_response(r.as_bytes()) {
                e.errors.push(format!("{err:?}"));
            }
        }
    }
    unavailable
}

/// The child: a gateway under a file-size limit. An entry point, not a test: ignored, and
/// run only by the test below (`--ignored --exact child_disk_full`).
#[test]
#[ignore = "child: the gateway process of the disk-full test, run by it"]
fn child_disk_full() {
    let dir = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("child process of the disk-full test: run with {CHILD_ENV}"));
    // As the gateway binary does: past the limit a write fails instead of killing us.
    signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    )
    .unwrap();
    let dir = std::path::PathBuf::from(dir);
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let venue = Venue::start(&dir.join("venue"), free_port());
    let path = dir.join("gw.journal");
    let mut d = gateway_with(venue.port, &path, FsyncPolicy::Group);
    let mut e = Engine::new(1);
    for i in 1..=30 {
        assert_eq!(step(&mut d, &mut e, i), 0);
    }
    // The disk fills up a few orders later.
    limit_file_size(Some(std::fs::metadata(&path).unwrap().len() + 4000));
    let mut unavailable = 0;
    for i in 31..=90 {
        unavailable += step(&mut d, &mut e, i);
    }
    assert!(d.is_degraded(), "the journal never filled up");
    assert!(unavailable > 0);
    assert!(
        !d.is_connected(),
        "venue stays disconnected while nothing can be journaled"
    );
    assert_eq!(e.client.not_taken().len(), unavailable);
    assert!(journal::verify(&path).unwrap().damage.is_none());
    // Nothing was acknowledged that the journal does not hold.
    let acked: Vec<u64> = e
        .client
        .orders()
        .filter(|(_, o)| o.state != OrderState::PendingNew)
        .map(|(id, _)| id)
        .collect();
    for id in &acked {
        assert!(
            d.gateway().order(ENGINE, *id).is_some()
                || e.client.order(*id).unwrap().state.is_final()
        );
    }

    // Space returns: the next probe takes the gateway out of degraded mode; it logs on
    // again and catches up with what the venue sent meanwhile.
    limit_file_size(None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while d.is_degraded() {
        assert!(Instant::now() < deadline, "still degraded");
        d.poll(Duration::from_millis(20)).unwrap();
        e.deliver(&mut d);
    }
    connect(&mut d);
    // A new request goes first (an engine sends the ones not taken when it gets to them):
    // their numbers are now below a taken one, and they are still taken when they come.
    assert_eq!(step(&mut d, &mut e, 91), 0);
    // The requests not taken go again, same numbers and ids.
    for req in e.client.take_not_taken() {
        d.engine_message(ENGINE, req.as_bytes()).unwrap();
    }
    pump(&mut d, &mut e, 60, |e| {
        e.client
            .orders()
            .all(|(_, o)| o.state != OrderState::PendingNew)
    });
    e.cancel_resting(&mut d);
    pump(&mut d, &mut e, 60, |e| e.open().is_empty());
    assert!(e.errors.is_empty(), "client errors: {:?}", e.errors);
    assert_eq!(e.client.orders().count(), 91);
    let lines = venue.received();
    assert!(
        lines.iter().all(|l| l[0] != "dup"),
        "an order was sent twice"
    );
    let mut ids = HashSet::new();
    for l in lines.iter().filter(|l| l[0] == "D") {
        assert!(ids.insert(l[1].clone()), "venue executed {} twice", l[1]);
    }
    let accepted = d.gateway().orders().count();
    assert_eq!(
        ids.len(),
        accepted,
        "every accepted order reached the venue once"
    );
    assert_eq!(
        d.gateway().last_request_seq(ENGINE),
        e.client.next_request_seq() - 1
    );
    println!("DISK-FULL-OK not-taken={unavailable} accepted={accepted}");
}

#[test]
fn disk_full_rejects_new_requests_loses_nothing_and_recovers() {
    let dir = scratch("disk-full");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_disk_full",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, &dir)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && text.contains("DISK-FULL-OK"),
        "{text}"
    );
    println!(
        "{}",
        text.lines()
            .find(|l| l.contains("DISK-FULL-OK"))
            .unwrap_or("")
    );
}
