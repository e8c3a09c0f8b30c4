//! The journal as an operator meets it: `journal verify`, `journal repair`, and `run`
//! refusing a damaged or locked journal before it looks for an RDMA device.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use order_gateway::gateway::record;
use order_gateway::journal::{encode_record, FsyncPolicy, Journal};

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

/// Byte offset of record `i` (after the 8-byte magic; `never` writes no commit records).
fn record_at(i: usize, rec: usize) -> usize {
    8 + i * rec
}

fn config_with_journal(dir: &Path, journal: &Path) -> PathBuf {
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml"),
    )
    .unwrap();
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
    assert_eq!(std::fs::read(&j).unwrap(), &data[..bad]);
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
