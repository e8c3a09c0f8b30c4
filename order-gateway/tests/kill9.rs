//! `kill -9` of a gateway process in mid-stream, then restart from its journal: no order lost,
//! none sent twice to the venue (QuickFIX's message log and the venue's record are witnesses).
//!
//! The gateway process is this test binary re-executed with `GW_KILL9_CHILD` set (its entry point, `child_kill9`, is an ignored test), so no extra
//! binary is needed. Needs Python 3 with `quickfix-ssl`, like `venue_e2e`.

mod common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use order_gateway::gateway::OrderStatus;
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{NewOrder, Side, TimeInForce, PRICE_SCALE};

const CHILD_ENV: &str = "GW_KILL9_CHILD";
/// Small journal segments, so the child starts several while it streams (and may be killed
/// in the middle of starting one).
const SEGMENT_BYTES: u64 = 48 << 10;

/// The child: a gateway streaming orders until it is killed. An entry point, not a test:
/// ignored, and run only by the tests below (`--ignored --exact child_kill9`).
#[test]
#[ignore = "child: the gateway process of the kill -9 tests, run by them"]
fn child_kill9() {
    let spec = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("child process of the kill -9 tests: run with {CHILD_ENV}"));
    let mut parts = spec.split(' ');
    let (port, journal, policy) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let segments = policy.ends_with("+segments");
    let policy = match policy.trim_end_matches("+segments") {
        "group" => FsyncPolicy::Group,
        _ => FsyncPolicy::Never,
    };
    let mut d = gateway_with(port.parse().unwrap(), &PathBuf::from(journal), policy);
    if segments {
        d.set_segment_bytes(SEGMENT_BYTES);
    }
    let [aapl, msft, rej] = symbols();
    for i in 1u64.. {
        let (sym, qty) = match i % 10 {
            0..=5 => (aapl, 50),
            6..=8 => (msft, 300),
            _ => (rej, 10),
        };
        let m = NewOrder::new(
            i,
            ACCOUNT,
            sym,
            Side::Buy,
            qty,
            100 * PRICE_SCALE,
            TimeInForce::Day,
        );
        d.engine_message(ENGINE, zerocopy::IntoBytes::as_bytes(&m))
            .unwrap();
        d.poll(Duration::from_micros(50)).unwrap();
        let _ = d.take_engine_responses();
        // The order is journaled once engine_message returned.
        println!("journaled {i}");
    }
}

#[test]
fn kill_dash_nine_mid_stream_then_restart() {
    kill_then_restart("kill9", "never", 3000, false);
}

/// A power loss: after the kill, the journal is cut back to its durable point (the end of
/// its last commit record: what the last completed fdatasync made durable). With group
/// commit nothing that reached the venue is lost by that cut, so no ClOrdID and no
/// MsgSeqNum is reused after the restart.
#[test]
fn kill_dash_nine_then_power_loss_cut_to_the_durable_point() {
    kill_then_restart("powerloss", "group", 1500, true);
}

/// The same with journal segments: the child starts a new segment from a checkpoint every
/// 48 KiB, is killed mid-stream and its last segment is cut back to its durable point. The
/// restart reads one checkpoint and one segment, and every order the engine got journaled
/// still reaches the venue exactly once.
#[test]
fn kill_dash_nine_across_journal_segments_then_power_loss() {
    kill_then_restart("segments", "group+segments", 1200, true);
}

fn kill_then_restart(name: &str, policy: &str, orders: u64, power_loss: bool) {
    let segments = policy.ends_with("+segments");
    let dir = scratch(name);
    let venue = Venue::start(&dir.join("venue"), free_port());
    let journal = dir.join("gw.journal");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_kill9",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(
            CHILD_ENV,
            format!("{} {} {policy}", venue.port, journal.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut journaled = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("journaled ") {
            journaled = n.parse().unwrap();
            if journaled >= orders {
                break;
            }
        }
        assert!(Instant::now() < deadline, "child gateway too slow");
    }
    assert!(journaled >= orders, "child gateway exited early");
    // SIGKILL: no logout, no flush, whatever was in flight stays in flight.
    child.kill().unwrap();
    child.wait().unwrap();
    if power_loss {
        let scan = order_gateway::journal::verify(&journal).unwrap();
        assert!(
            scan.by_kind[usize::from(order_gateway::journal::META)] > 0
                && scan.durable_len > order_gateway::journal::HEADER_LEN,
            "no commit record in a group-commit journal"
        );
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&journal)
            .unwrap();
        f.set_len(scan.durable_len).unwrap();
        println!(
            "power loss: cut {} of {} bytes",
            scan.file_len - scan.durable_len,
            scan.file_len
        );
    }

    // Restart from the journal, in this process.
    let t0 = Instant::now();
    let mut d = gateway(venue.port, &journal);
    println!(
        "restart: {} records replayed in {:?}, {} bytes",
        d.recovery().records,
        t0.elapsed(),
        std::fs::metadata(&journal).unwrap().len()
    );
    // Engine order ids the journal has (accepted or rejected): 1..=last, none missing.
    let seen = |d: &order_gateway::driver::FixDriver, i: u64| d.gateway().risk().is_seen(ENGINE, i);
    let last = (1..).take_while(|&i| seen(&d, i)).last().unwrap_or(0);
    assert!(
        last >= journaled,
        "journal lost orders: ids up to {last} known, {journaled} journaled"
    );
    assert!(
        !seen(&d, last + 1) && !seen(&d, last + 2),
        "ids beyond {last}"
    );
    if segments {
        let archived = (1..)
            .take_while(|k| dir.join(format!("gw.journal.{k}")).exists())
            .count();
        assert!(archived >= 3, "only {archived} segments started");
        assert!(!dir.join("gw.journal.next").exists());
        // One segment replayed, not the day: no more records than the current segment
        // holds (its checkpoint, then the records appended from the cut on). Not "fewer
        // records than orders": a segment starts with the records appended while the writer
        // built its checkpoint off the service thread, which on a loaded host were more
        // than this small day's orders (1,336 records for 1,200 orders in a pre-check).
        let scan = order_gateway::journal::verify(&journal).unwrap();
        let in_segment = scan.by_kind.iter().sum::<u64>()
            - scan.by_kind[usize::from(order_gateway::journal::META)];
        println!(
            "{} records replayed; the current segment holds {in_segment}, {archived} archives",
            d.recovery().records
        );
        assert!(
            d.recovery().records <= in_segment,
            "{} records replayed for {last} orders: the current segment holds {in_segment}",
            d.recovery().records
        );
        d.set_segment_bytes(SEGMENT_BYTES);
    } else {
        let known: usize = d.gateway().orders().count();
        assert!(
            known as u64 >= journaled,
            "journal lost orders: {known} < {journaled}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while d.gateway().open_order_count() > 0 {
        assert!(
            Instant::now() < deadline,
            "{} orders never completed",
            d.gateway().open_order_count()
        );
        d.poll(Duration::from_millis(2)).unwrap();
        let _ = d.take_engine_responses();
    }
    let gw_ids: HashSet<String> = d
        .gateway()
        .orders()
        .map(|(_, o)| {
            assert_eq!(o.status, OrderStatus::Done);
            o.venue_cl_ord_id.to_string()
        })
        .collect();
    let lines = venue.received();
    assert!(
        lines.iter().all(|l| l[0] != "dup"),
        "an order was sent twice: {:?}",
        lines.iter().find(|l| l[0] == "dup")
    );
    let mut venue_ids = HashSet::new();
    for l in lines.iter().filter(|l| l[0] == "D") {
        assert!(
            venue_ids.insert(l[1].clone()),
            "venue executed {} twice",
            l[1]
        );
    }
    // A SIGKILL can cut the journal's write of the last batch short (Linux stops a write to
    // a file at a page boundary when a fatal signal is pending): the restart then cuts the
    // torn record, and an order whose decision was whole but whose NewOrderSingle record was
    // torn is known and was never sent (the journal is written before the venue). Seen once
    // in CI. That order is the last one or two. With group commit the restart answers it
    // NotSent at once (closed Done, checked above) and never asks the venue about it; with
    // `never` (a power loss could have kept the decision of an order that was sent) it asks
    // the venue at logon, whose "unknown order" closes it as rejected. Every other
    // journaled order reached the venue exactly once.
    let highest_sent = venue_ids
        .iter()
        .map(|id| id.parse::<u64>().unwrap())
        .max()
        .unwrap_or(0);
    let never_sent: Vec<u64> = (highest_sent + 1..=last).collect();
    assert!(
        never_sent.len() <= 2,
        "orders {never_sent:?} journaled and never sent: more than the kill can explain"
    );
    let group = policy.starts_with("group");
    assert_eq!(
        d.gateway().counters().not_sent,
        if group { never_sent.len() as u64 } else { 0 },
        "orders {never_sent:?} never sent, answered NotSent at the restart under group commit"
    );
    for id in &never_sent {
        assert_eq!(
            lines.iter().any(|l| l[0] == "H" && l[1] == id.to_string()),
            !group,
            "order {id}, never sent: asked about at logon only without group commit"
        );
    }
    if segments {
        // Orders final two checkpoints ago are no longer held: count instead. Every id
        // went to the venue once (the venue rejects every tenth, its symbol).
        assert_eq!(
            venue_ids.len() as u64 + never_sent.len() as u64,
            last,
            "every journaled order reached the venue exactly once"
        );
        assert!(gw_ids
            .iter()
            .all(|id| venue_ids.contains(id) || never_sent.contains(&id.parse().unwrap())));
        // A clean stop writes a checkpoint; the next start replays nothing else.
        assert!(d.checkpoint());
        let next_out = d.gateway().session().next_out();
        drop(d);
        let d = gateway(venue.port, &journal);
        assert_eq!(d.recovery().records, 1, "a checkpoint only");
        assert!(d.gateway().session().next_out() >= next_out);
        assert!(seen(&d, last) && !seen(&d, last + 1));
    } else {
        let sent: HashSet<String> = gw_ids
            .iter()
            .filter(|id| !never_sent.contains(&id.parse().unwrap()))
            .cloned()
            .collect();
        assert_eq!(
            venue_ids, sent,
            "every journaled order reached the venue exactly once"
        );
        assert_eq!(gw_ids.len(), sent.len() + never_sent.len());
    }
}
