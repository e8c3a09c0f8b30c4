//! The journal as an operator meets it: `journal verify`, `journal repair`, and `run`
//! refusing a damaged or locked journal before it looks for an RDMA device.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use order_gateway::gateway::record;
use order_gateway::journal::{encode_record, FsyncPolicy, Journal, HEADER_LEN};

fn gateway() -> Command {
    Command::new(env!("CARGO_BIN_EXE_order-gateway"))
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

/// A journal of `n` engine-request records of 24 bytes each; returns the record size.
fn make_journal(path: &Path, n: u32) -> usize {
    let (mut j, _) = Journal::open(path, FsyncPolicy::Never, |_, _| {}).unwrap();
    let mut buf = Vec::new();
    for i in 0..n {
        encode_record(
            &mut buf,
            record::ENGINE_REQUEST,
            &[&1u32.to_le_bytes(), &u64::from(i).to_le_bytes(), &[0u8; 12]],
        );
    }
    j.append(&buf, n).unwrap();
    buf.len() / n as usize
}

/// Byte offset of record `i` (after the header; `never` writes no commit records).
fn record_at(i: usize, rec: usize) -> usize {
    HEADER_LEN as usize + i * rec
}

fn config_with_journal(dir: &Path, journal: &Path) -> PathBuf {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml"),
    )
    .unwrap()
    // Keys, not the shipped samples (which the gateway refuses).
    .replace(
        "token = \"change-me\"",
        "token = \"4c1e7a0d9b3f62e58a17c4d0b9e36f21a5d87c04e2b91f3a6c58d07e4b29a1f3\"",
    )
    .replace(
        "token = \"change-me-engine-1\"",
        "token = \"8f2b5c7e1a9d04c36e8b2f1d7a5c90e4\"",
    );
    let cfg = example.replace(
        "path = \".rocebus/order-gateway.journal\"",
        &format!("path = {:?}", journal.display().to_string()),
    );
    assert_ne!(cfg, example);
    let p = dir.join("gw.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

#[test]
fn a_damaged_journal_is_reported_refused_by_run_unchanged_and_repaired_into_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("gw.journal");
    let rec = make_journal(&j, 2529);
    let clean = gateway()
        .args(["journal", "verify"])
        .arg(&j)
        .output()
        .unwrap();
    assert!(clean.status.success(), "{}", text(&clean));
    assert!(
        text(&clean).contains("engine requests  2529"),
        "{}",
        text(&clean)
    );

    let mut data = std::fs::read(&j).unwrap();
    let bad = record_at(1264, rec);
    data[bad + 11] ^= 0x20;
    std::fs::write(&j, &data).unwrap();

    let v = gateway()
        .args(["journal", "verify"])
        .arg(&j)
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(2), "{}", text(&v));
    assert!(
        text(&v).contains(&format!("DAMAGED at byte {bad}")),
        "{}",
        text(&v)
    );

    // `run` stops on the journal, names it and the offset, and changes nothing. This host
    // may have no RDMA device: the journal must be the first thing checked.
    let cfg = config_with_journal(dir.path(), &j);
    let run = gateway()
        .args(["run", "--venue", "sim", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!run.status.success());
    let msg = text(&run);
    assert!(
        msg.contains(&j.display().to_string())
            && msg.contains(&format!("damaged at byte {bad}"))
            && msg.contains("journal repair"),
        "{msg}"
    );
    assert!(!msg.contains("RDMA device"), "{msg}");
    assert_eq!(std::fs::read(&j).unwrap(), data, "run changed the journal");

    let r = gateway()
        .args(["journal", "repair"])
        .arg(&j)
        .output()
        .unwrap();
    assert!(r.status.success(), "{}", text(&r));
    let q = PathBuf::from(format!("{}.quarantine.1", j.display()));
    assert!(text(&r).contains(&q.display().to_string()), "{}", text(&r));
    assert_eq!(std::fs::read(&q).unwrap(), &data[bad..]);
    // The records before the damage stay byte for byte; the superblock now ends there.
    let after = std::fs::read(&j).unwrap();
    assert_eq!(after.len(), bad);
    assert_eq!(
        &after[HEADER_LEN as usize..],
        &data[HEADER_LEN as usize..bad]
    );
    let v = gateway()
        .args(["journal", "verify"])
        .arg(&j)
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", text(&v));
    assert!(text(&v).contains("engine requests  1264"), "{}", text(&v));
}

#[test]
fn a_torn_tail_verifies_as_torn_and_a_second_gateway_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("gw.journal");
    make_journal(&j, 10);
    let data = std::fs::read(&j).unwrap();
    std::fs::write(&j, &data[..data.len() - 5]).unwrap();
    let v = gateway()
        .args(["journal", "verify"])
        .arg(&j)
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(1), "{}", text(&v));
    assert!(text(&v).contains("torn tail"), "{}", text(&v));

    let (held, _) = Journal::open(&j, FsyncPolicy::Never, |_, _| {}).unwrap();
    let cfg = config_with_journal(dir.path(), &j);
    let run = gateway()
        .args(["run", "--venue", "sim", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(
        text(&run).contains("in use by another process"),
        "{}",
        text(&run)
    );
    drop(held);
}

#[test]
fn journal_help_explains_verify_and_repair() {
    let out = gateway().args(["journal", "--help"]).output().unwrap();
    let t = text(&out);
    assert!(t.contains("verify") && t.contains("repair"), "{t}");
    let out = gateway()
        .args(["journal", "repair", "--help"])
        .output()
        .unwrap();
    assert!(text(&out).contains("quarantine"), "{}", text(&out));
}

/// A kill in the middle of the journal write that holds an order's decision and its
/// NewOrderSingle can leave the decision whole and the message torn off (the torn tail
/// is cut at open). With group commit (nothing is sent before its write is durable) the
/// next open answers the order `NotSent` before anything else, and journals it: the open
/// after that replays the answer and gives it no second time. With `never` (a power loss
/// could have kept the decision of an order that was sent) the order stays in doubt for
/// the logon's status request.
#[test]
fn an_order_message_torn_off_the_journal_is_answered_not_sent_at_open() {
    use order_gateway::journal::decode_record;
    use order_gateway::proto::{NewOrder, RejectReason, Response, Side, TimeInForce, PRICE_SCALE};
    use order_gateway::sim::SimVenue;
    use order_gateway::{driver::FixDriver, gateway::OrderStatus, unix_nanos};
    use zerocopy::IntoBytes;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.journal");
    let risk = common::risk_config();
    let open_with = |fsync| {
        FixDriver::with_link(
            SimVenue::new(),
            common::session_config(),
            &risk,
            &path,
            fsync,
        )
        .unwrap()
    };
    let open = || open_with(FsyncPolicy::Group);
    let mut d = open();
    let [aapl, ..] = common::symbols();
    d.stage(|gw, _| gw.on_reference_price(aapl, 100 * PRICE_SCALE, unix_nanos()));
    d.connect().unwrap();
    d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
    // The header as it was before order 2's write: the kill below happens in that write,
    // so nothing after it ever updated the superblock.
    let mut header_before = Vec::new();
    for cl in [1, 2] {
        if cl == 2 {
            header_before = std::fs::read(&path).unwrap()[..HEADER_LEN as usize].to_vec();
        }
        let m = NewOrder::new(
            cl,
            common::ACCOUNT,
            aapl,
            Side::Buy,
            10,
            100 * PRICE_SCALE,
            TimeInForce::Day,
        );
        d.engine_message(common::ENGINE, m.as_bytes()).unwrap();
        d.poll_with(rocebus::clock::Now::read(), |_, _| {}).unwrap();
    }
    drop(d);
    // Cut the file just past order 2's decision, as the kill would have.
    let bytes = std::fs::read(&path).unwrap();
    let (mut at, mut end_of_last_decision) = (HEADER_LEN as usize, 0);
    while let Some((kind, _, n)) = decode_record(&bytes[at..]) {
        at += n;
        if kind == record::DECISION {
            end_of_last_decision = at;
        }
    }
    assert_eq!(at, bytes.len());
    // A torn piece of the NewOrderSingle record stays behind; the open cuts it.
    let torn = end_of_last_decision + 20;
    let mut cut = bytes[..torn].to_vec();
    cut[..HEADER_LEN as usize].copy_from_slice(&header_before);
    std::fs::write(&path, &cut).unwrap();

    // Under `never`: left in doubt, nothing answered or journaled.
    let mut d = open_with(FsyncPolicy::Never);
    assert_eq!(d.recovery().truncated_bytes, 20);
    assert_eq!(
        d.gateway().order(common::ENGINE, 2).unwrap().status,
        OrderStatus::PendingNew
    );
    assert!(d.take_engine_responses().is_empty());
    assert_eq!(d.gateway().counters().not_sent, 0);
    drop(d);

    let mut d = open();
    assert_eq!(d.recovery().truncated_bytes, 0, "cut by the open before");
    let gw = d.gateway();
    assert_eq!(
        gw.order(common::ENGINE, 1).unwrap().status,
        OrderStatus::Done,
        "filled"
    );
    assert_eq!(
        gw.order(common::ENGINE, 2).unwrap().status,
        OrderStatus::Done,
        "closed"
    );
    assert_eq!((gw.counters().not_sent, gw.open_order_count()), (1, 0));
    let got = d.take_engine_responses();
    assert!(
        matches!(got[..], [(common::ENGINE, Response::Reject(r))]
            if r.cl_ord_id.get() == 2 && r.reason() == RejectReason::NotSent),
        "{got:?}"
    );
    let seq = got[0].1.seq();
    let scan = order_gateway::journal::verify(&path).unwrap();
    assert_eq!(scan.by_kind[usize::from(record::NOT_SENT)], 1);
    drop(d);
    let v = gateway()
        .args(["journal", "verify"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        text(&v)
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["never", "sent", "1"]),
        "{}",
        text(&v)
    );

    let mut d = open();
    assert!(d.take_engine_responses().is_empty(), "answered once");
    assert_eq!(d.gateway().counters().not_sent, 1, "replayed");
    let kept: Vec<_> = d
        .gateway()
        .responses_after(common::ENGINE, seq - 1)
        .unwrap()
        .collect();
    assert!(matches!(kept[..], [Response::Reject(r)] if r.reason() == RejectReason::NotSent));
    assert_eq!(
        order_gateway::journal::verify(&path).unwrap().by_kind[usize::from(record::NOT_SENT)],
        1
    );
}

fn verify_code(path: &Path) -> (Option<i32>, String) {
    let v = gateway()
        .args(["journal", "verify"])
        .arg(path)
        .output()
        .unwrap();
    (v.status.code(), text(&v))
}

/// Found by review: verify's exit codes mixed a torn tail (1) with a file that is not a
/// journal, a missing file and usage errors; unknown records verified clean.
#[test]
fn verify_exit_codes_are_distinct() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("gw.journal");
    let rec = make_journal(&j, 10);
    assert_eq!(verify_code(&j).0, Some(0));
    // 1: a torn tail only.
    let data = std::fs::read(&j).unwrap();
    std::fs::write(&j, &data[..data.len() - 5]).unwrap();
    assert_eq!(verify_code(&j).0, Some(1));
    // 2: damaged.
    let mut bad = data.clone();
    bad[record_at(3, rec) + 14] ^= 1;
    std::fs::write(&j, &bad).unwrap();
    assert_eq!(verify_code(&j).0, Some(2));
    // 2: a record kind this gateway does not know (a newer gateway's journal), and `run`
    // refuses it.
    std::fs::remove_file(&j).unwrap();
    {
        let (mut jn, _) = Journal::open(&j, FsyncPolicy::Group, |_, _| {}).unwrap();
        let mut buf = Vec::new();
        encode_record(&mut buf, 77, &[b"from the future"]);
        jn.append(&buf, 1).unwrap();
    }
    let (code, out) = verify_code(&j);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("UNKNOWN") && out.contains("kind 77"), "{out}");
    let cfg = config_with_journal(dir.path(), &j);
    let run = gateway()
        .args(["run", "--venue", "sim", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(text(&run).contains("does not know"), "{}", text(&run));
    // 3: not a journal, a format-1 journal, a missing file.
    std::fs::write(&j, b"something else entirely").unwrap();
    assert_eq!(verify_code(&j).0, Some(3));
    std::fs::write(&j, b"RBGWJNL1").unwrap();
    let (code, out) = verify_code(&j);
    assert_eq!(code, Some(3));
    assert!(out.contains("format 1"), "{out}");
    assert_eq!(verify_code(&dir.path().join("nothing-here")).0, Some(3));
    // Usage errors are none of these.
    for args in [
        &["journal", "verify"][..],
        &["journal", "verify", "--bogus", "x"],
    ] {
        let u = gateway().args(args).output().unwrap();
        assert_eq!(u.status.code(), Some(64), "{args:?}: {}", text(&u));
    }
    let help = gateway()
        .args(["journal", "verify", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(
        text(&help).contains("torn tail") && text(&help).contains("64"),
        "{}",
        text(&help)
    );
}

/// `journal verify --json`: exactly one JSON object on stdout, whose `exit_code` and
/// `verdict` match the process's exit code (the same codes as the text output).
fn verify_json(path: &Path) -> (Option<i32>, serde_json::Value) {
    let v = gateway()
        .args(["journal", "verify", "--json"])
        .arg(path)
        .output()
        .unwrap();
    let out = String::from_utf8(v.stdout).unwrap();
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    let obj: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert!(obj.is_object(), "{out}");
    assert_eq!(
        obj["exit_code"].as_i64().map(|c| c as i32),
        v.status.code(),
        "{out}"
    );
    (v.status.code(), obj)
}

#[test]
fn verify_json_is_one_object_with_the_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("gw.journal");
    let rec = make_journal(&j, 10);
    let (code, v) = verify_json(&j);
    assert_eq!(code, Some(0));
    assert_eq!(v["verdict"], "clean");
    assert_eq!(v["records"], 10);
    assert_eq!(v["by_kind"]["engine requests"], 10);
    assert_eq!(v["problems"], serde_json::json!([]));
    let data = std::fs::read(&j).unwrap();
    std::fs::write(&j, &data[..data.len() - 5]).unwrap();
    let (code, v) = verify_json(&j);
    assert_eq!(
        (code, v["verdict"].as_str()),
        (Some(1), Some("torn_tail")),
        "{v}"
    );
    let mut bad = data.clone();
    bad[record_at(3, rec) + 14] ^= 1;
    std::fs::write(&j, &bad).unwrap();
    let (code, v) = verify_json(&j);
    assert_eq!(
        (code, v["verdict"].as_str()),
        (Some(2), Some("damaged")),
        "{v}"
    );
    assert!(
        v["problems"][0]
            .as_str()
            .unwrap()
            .starts_with("DAMAGED at byte"),
        "{v}"
    );
    std::fs::write(&j, b"something else entirely").unwrap();
    let (code, v) = verify_json(&j);
    assert_eq!(
        (code, v["verdict"].as_str()),
        (Some(3), Some("unreadable")),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap().contains("not readable"), "{v}");
}

/// A journal whose current segment (segment 3) starts with a checkpoint, beside archives
/// `gw.journal.1` and `.2`.
fn segmented(dir: &Path) -> PathBuf {
    let j = dir.join("gw.journal");
    let (mut jn, _) = Journal::open(&j, FsyncPolicy::Group, |_, _| {}).unwrap();
    let req = |i: u64| {
        let mut b = Vec::new();
        encode_record(
            &mut b,
            record::ENGINE_REQUEST,
            &[&1u32.to_le_bytes(), &i.to_le_bytes(), &[0u8; 12]],
        );
        b
    };
    jn.append(&req(1), 1).unwrap();
    for i in 2..4 {
        let mut cp = Vec::new();
        // A checkpoint record's bytes; the journal does not read them.
        encode_record(&mut cp, record::CHECKPOINT, &[&[1, 2, 3, 4]]);
        jn.rotate(&j, &cp).unwrap();
        jn.append(&req(i), 1).unwrap();
    }
    j
}

/// Found by review: a checkpoint with a bad checksum was refused, but `journal repair`
/// then left a bare journal and the next start was an empty day. Repair rebuilds the
/// segment from the archive it was started from, or, without that archive, refuses and
/// changes nothing; a missing current segment beside its archives is refused by verify,
/// run and repair, and none of them creates a fresh journal in its place.
#[test]
fn repair_never_leaves_an_empty_day_when_the_day_is_in_the_archives() {
    let dir = tempfile::tempdir().unwrap();
    let j = segmented(dir.path());
    let mut data = std::fs::read(&j).unwrap();
    data[HEADER_LEN as usize + 14] ^= 0x01;
    std::fs::write(&j, &data).unwrap();
    let (code, out) = verify_code(&j);
    assert_eq!(code, Some(2), "{out}");
    let repair = || {
        gateway()
            .args(["journal", "repair"])
            .arg(&j)
            .output()
            .unwrap()
    };
    let a2 = PathBuf::from(format!("{}.2", j.display()));
    let aside = dir.path().join("aside");
    std::fs::rename(&a2, &aside).unwrap();
    let r = repair();
    assert!(!r.status.success());
    assert!(text(&r).contains("empty day"), "{}", text(&r));
    assert_eq!(
        std::fs::read(&j).unwrap(),
        data,
        "repair changed the journal"
    );
    assert!(!PathBuf::from(format!("{}.quarantine.1", j.display())).exists());
    std::fs::rename(&aside, &a2).unwrap();

    let r = repair();
    assert!(r.status.success(), "{}", text(&r));
    assert!(text(&r).contains("rebuilt it from"), "{}", text(&r));
    assert_eq!(
        std::fs::read(format!("{}.quarantine.1", j.display())).unwrap(),
        data
    );
    assert_eq!(verify_code(&j).0, Some(0));
    // The rebuilt segment holds the archive's day (its checkpoint and request 2) and, its
    // chain proving it, request 3 that followed the damaged checkpoint.
    let dump = gateway()
        .args(["journal", "dump", "--json"])
        .arg(&j)
        .output()
        .unwrap();
    let t = String::from_utf8(dump.stdout).unwrap();
    assert!(t.contains("\"kind_name\":\"checkpoint\""), "{t}");
    assert_eq!(
        t.matches("\"kind_name\":\"engine_request\"").count(),
        2,
        "{t}"
    );

    std::fs::remove_file(&j).unwrap();
    let (code, out) = verify_code(&j);
    assert_eq!(code, Some(3), "{out}");
    assert!(out.contains("gw.journal.2"), "{out}");
    let cfg = config_with_journal(dir.path(), &j);
    let run = gateway()
        .args(["run", "--venue", "sim", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!run.status.success());
    assert!(text(&run).contains("empty day"), "{}", text(&run));
    assert!(!j.exists(), "run created a fresh journal");
    assert!(!repair().status.success());
    assert!(!j.exists(), "repair created a fresh journal");
}

#[test]
fn dump_prints_every_record_as_text_or_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    let j = segmented(dir.path());
    let out = gateway()
        .args(["journal", "dump"])
        .arg(&j)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(t.contains(&format!("{:>12}", HEADER_LEN)), "{t}");
    assert!(t.contains("checkpoint version=1 bytes=4"), "{t}");
    assert!(t.contains("engine_request engine=1"), "{t}");
    assert!(t.contains("commit end="), "{t}");
    let out = gateway()
        .args(["journal", "dump", "--json"])
        .arg(&j)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let lines: Vec<_> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    // Checkpoint, its commit, the request, its commit.
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines
        .iter()
        .all(|l| l.starts_with("{\"offset\":") && l.ends_with('}')));
    assert!(
        lines[2].contains("\"kind_name\":\"engine_request\"") && lines[2].contains("\"engine\":1"),
        "{}",
        lines[2]
    );
    // An archive dumps too.
    let out = gateway()
        .args(["journal", "dump", "--json"])
        .arg(format!("{}.1", j.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
}
