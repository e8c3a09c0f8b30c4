//! Bus recordings on the host (no RDMA): a generated day's normalized messages, as the feed
//! handler publishes them on two channels, go through the recorder `rocebus record` uses
//! (`busrecord::Recorder`, with a feed loss, an unrecoverable bus loss and a late-join
//! snapshot among them). The file is read back by Databento's own Python decoder
//! (`databento-dbn`) and by the `dbn` crate, and counted against what was published; the
//! replay conversion (`feed-handler replay`'s) recorded again gives the same records.
//!
//! The guest test `cli/tests/record_replay.rs` runs the same path over soft-RoCE with the
//! real binaries.

use dbn::decode::{DbnDecoder, DecodeRecordRef};
use dbn::{rtype, ErrorMsg, Mbp1Msg, RecordRef, StatusMsg, SymbolMappingMsg, TradeMsg};
use feed_handler::book::Book;
use feed_handler::busrecord::{Recorder, Replayed, Replayer};
use feed_handler::generate::{generate, GenConfig};
use feed_handler::itch::decode_exact;
use feed_handler::normalized::{decode, FeedLoss, Normalized, MAX_LEN};
use feed_handler::publish::{MdSink, Publisher};
use feed_handler::view::book_l2;
use rocebus::mcast::{Handler, SnapshotSink};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use zerocopy::IntoBytes;

/// Midnight US Eastern of 2026-03-10 (UTC-4), UNIX ns.
const MIDNIGHT: u64 = 1_773_115_200_000_000_000;
const CHANNELS: u16 = 2;

#[derive(Default)]
struct Bus(Vec<(u16, Vec<u8>)>);
impl MdSink for Bus {
    type Error = std::convert::Infallible;
    fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error> {
        self.0.push((channel, message.to_vec()));
        Ok(())
    }
}

/// The day's bus traffic in publish order, a feed loss broadcast in the middle; and the book
/// at the end.
fn day() -> (Vec<(u16, Vec<u8>)>, Book) {
    let mut messages = Vec::new();
    generate(
        &GenConfig {
            seed: 21,
            messages: 20_000,
            symbols: 20,
        },
        |m| messages.push(m.to_vec()),
    );
    let mut book = Book::new();
    let mut p = Publisher::new(Bus::default(), CHANNELS);
    p.set_ts_recv(MIDNIGHT + 36_000_000_000_000);
    for (i, m) in messages.iter().enumerate() {
        book.apply(&decode_exact(m).expect("valid ITCH"), &mut p);
        if i == messages.len() / 2 {
            p.broadcast(FeedLoss::new(7, 10, 34_200_000_000_000).as_bytes());
        }
    }
    (p.into_sink().0, book)
}

/// Records `bus` (sequences per channel from 1), with `extra` run after message `at`.
fn record(
    path: &Path,
    bus: &[(u16, Vec<u8>)],
    at: usize,
    extra: impl FnOnce(&mut Recorder<std::fs::File>),
) -> feed_handler::busrecord::RecordCounters {
    let file = std::fs::File::create(path).unwrap();
    let zstd = path.extension().is_some_and(|e| e == "zst");
    let mut rec = Recorder::new(file, zstd, MIDNIGHT, usize::from(CHANNELS)).unwrap();
    let mut seq = [0u64; CHANNELS as usize];
    let mut extra = Some(extra);
    for (i, (ch, m)) in bus.iter().enumerate() {
        rec.set_ts_recv(MIDNIGHT + 40_000_000_000_000 + i as u64);
        seq[usize::from(*ch)] += 1;
        rec.channel(usize::from(*ch))
            .on_message(seq[usize::from(*ch)], m);
        if i == at {
            if let Some(f) = extra.take() {
                f(&mut rec);
            }
        }
    }
    assert!(rec.take_error().is_none());
    rec.finish().unwrap()
}

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("ROCEBUS_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("ROCEBUS_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("rocebus")))
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/rocebus")
        });
    let venv = cache.join("venv/bin/python3");
    assert!(
        venv.exists(),
        "\n\n*** DBN read-back NOT RUN: no Python with databento-dbn ({} missing).\n\
         *** Run `cargo xtask setup`, or set ROCEBUS_PYTHON to a python3 with\n\
         *** `pip install -r feed-handler/crosscheck/requirements.txt`.\n",
        venv.display()
    );
    venv
}

fn read_back(file: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("crosscheck/dbn_read.py");
    let out = Command::new(python())
        .arg(script)
        .arg(file)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "dbn_read.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

#[derive(Debug, Default, PartialEq, Eq)]
struct Kinds {
    bbo: u64,
    levels: u64,
    trades: u64,
    status: u64,
    losses: u64,
}

fn kinds(bus: &[(u16, Vec<u8>)]) -> Kinds {
    let mut k = Kinds::default();
    for (_, m) in bus {
        match decode(m).unwrap() {
            Normalized::Bbo(_) => k.bbo += 1,
            Normalized::Level(_) => k.levels += 1,
            Normalized::Trade(_) => k.trades += 1,
            Normalized::Status(_) => k.status += 1,
            Normalized::FeedLoss(_) => k.losses += 1,
        }
    }
    k
}

#[test]
fn recording_reads_back_in_python_with_losses_and_snapshot() {
    let (bus, book) = day();
    let k = kinds(&bus);
    assert_eq!(k.losses, u64::from(CHANNELS), "one feed loss per channel");
    let dir = tempfile::tempdir().unwrap();
    // Uncompressed: the Python decoder takes DBN bytes (the zstd path is the other test's).
    let path = dir.path().join("rec.dbn");
    let l2 = book_l2(&book, |l| l % CHANNELS == 1);
    let counters = record(&path, &bus, 100, |rec| {
        // A bus loss on channel id 2 (index 1), then the snapshot that repairs it.
        rec.bus_loss(2, 40, 104);
        let mut ch = rec.channel(1);
        ch.begin_restore();
        for piece in l2.chunks(100) {
            ch.restore_chunk(piece).unwrap();
        }
        ch.finish_restore(104).unwrap();
    });
    assert_eq!(
        (
            counters.bbo,
            counters.levels,
            counters.trades,
            counters.status,
            counters.feed_losses
        ),
        (k.bbo, k.levels, k.trades, k.status, 1)
    );
    assert_eq!((counters.bus_losses, counters.bus_lost_messages), (1, 64));
    assert_eq!((counters.snapshots, counters.malformed), (1, 0));

    // What the snapshot holds, counted from the book.
    let snap_symbols: Vec<u16> = book
        .symbols()
        .filter(|(l, s)| {
            l % CHANNELS == 1
                && (s.state() != b' '
                    || s.depth(feed_handler::book::Side::Bid).next().is_some()
                    || s.depth(feed_handler::book::Side::Ask).next().is_some())
        })
        .map(|(l, _)| l)
        .collect();
    let snap_levels: u64 = book
        .symbols()
        .filter(|(l, _)| snap_symbols.contains(l))
        .map(|(_, s)| {
            (s.depth(feed_handler::book::Side::Bid).count()
                + s.depth(feed_handler::book::Side::Ask).count()) as u64
        })
        .sum();
    let snap_status = book
        .symbols()
        .filter(|(l, s)| snap_symbols.contains(l) && s.state() != b' ')
        .count() as u64;
    assert!(snap_levels > 0);

    let v = read_back(&path);
    let action = |a: &str| v["actions"][a].as_u64().unwrap_or(0);
    let count = |t: &str| v["counts"][t].as_u64().unwrap_or(0);
    assert_eq!(action("MBP1Msg:N"), k.bbo, "{}", v["actions"]);
    assert_eq!(action("MBP1Msg:M") + action("MBP1Msg:C"), k.levels);
    assert_eq!(action("MBP1Msg:R"), snap_symbols.len() as u64);
    assert_eq!(action("MBP1Msg:A"), snap_levels);
    assert_eq!(action("TradeMsg:T"), k.trades);
    assert_eq!(count("StatusMsg"), k.status + snap_status);
    assert_eq!(count("SymbolMappingMsg"), 20);
    assert_eq!(count("ErrorMsg"), 2, "the feed loss once, the bus loss");
    assert_eq!(v["metadata"]["dataset"], "XNAS.ITCH");
    assert_eq!(v["metadata"]["start"], MIDNIGHT);
    let errors: Vec<String> = v["first"]["ErrorMsg"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["err"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        errors,
        [
            "rocebus bus loss: channel 2 sequences 40..104 lost; every symbol of the channel suspect",
            "rocebus feed loss: exchange sequences 7..10 lost; every symbol suspect",
        ]
    );
    let first_bbo = &v["first"]["MBP1Msg:N"][0];
    assert_eq!(first_bbo["flags"].as_u64(), Some(0x80 | 0x40 | 0x10));
    let snap = &v["first"]["MBP1Msg:A"][0];
    assert_eq!(snap["flags"].as_u64().unwrap() & 0x20, 0x20, "F_SNAPSHOT");
}

/// A record's bytes with the receive times cleared.
fn without_recv(r: RecordRef<'_>) -> Vec<u8> {
    match r.header().rtype {
        rtype::MBP_1 => {
            let mut m = r.get::<Mbp1Msg>().unwrap().clone();
            (m.ts_recv, m.ts_in_delta) = (0, 0);
            m.as_ref().to_vec()
        }
        rtype::MBP_0 => {
            let mut m = r.get::<TradeMsg>().unwrap().clone();
            (m.ts_recv, m.ts_in_delta) = (0, 0);
            m.as_ref().to_vec()
        }
        rtype::STATUS => {
            let mut m = r.get::<StatusMsg>().unwrap().clone();
            m.ts_recv = 0;
            m.as_ref().to_vec()
        }
        rtype::SYMBOL_MAPPING => r.get::<SymbolMappingMsg>().unwrap().as_ref().to_vec(),
        rtype::ERROR => r.get::<ErrorMsg>().unwrap().as_ref().to_vec(),
        other => panic!("unexpected rtype {other:#x}"),
    }
}

fn records(path: &Path) -> Vec<Vec<u8>> {
    let mut dec = DbnDecoder::from_zstd_file(path).unwrap();
    let mut out = Vec::new();
    while let Some(r) = dec.decode_record_ref().unwrap() {
        out.push(without_recv(r));
    }
    out
}

#[test]
fn replayed_recording_records_the_same() {
    let (bus, _) = day();
    let dir = tempfile::tempdir().unwrap();
    let first = dir.path().join("first.dbn.zst");
    record(&first, &bus, 0, |_| {});
    // Replay's conversion, partitioned as `feed-handler replay` publishes.
    let mut replayed: Vec<(u16, Vec<u8>)> = Vec::new();
    let mut conv = Replayer::new();
    let mut dec = DbnDecoder::from_zstd_file(&first).unwrap();
    let mut buf = [0u8; MAX_LEN];
    while let Some(r) = dec.decode_record_ref().unwrap() {
        match conv.convert(r, 1, &mut buf) {
            Replayed::Message { locate, len } => {
                replayed.push((locate % CHANNELS, buf[..len].to_vec()))
            }
            Replayed::Broadcast { len } => {
                for c in 0..CHANNELS {
                    replayed.push((c, buf[..len].to_vec()));
                }
            }
            Replayed::Mapping => {}
            other => panic!("{other:?} in a plain recording"),
        }
    }
    // Only the receive stamp differs from what the feed handler published.
    assert_eq!(replayed.len(), bus.len());
    let second = dir.path().join("second.dbn.zst");
    record(&second, &replayed, 0, |_| {});
    let (a, b) = (records(&first), records(&second));
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x, y, "record {i} differs");
    }
    // And the messages themselves round-trip, receive stamp and trade source aside.
    let strip = |m: &[u8]| {
        let mut m = m.to_vec();
        m[20..28].fill(0);
        if m[0] == feed_handler::normalized::KIND_TRADE {
            m[29] = 0;
        }
        m
    };
    for ((c1, m1), (c2, m2)) in bus.iter().zip(&replayed) {
        assert_eq!(c1, c2);
        assert_eq!(strip(m1), strip(m2), "{:?}", decode(m1));
    }
}
