//! `feed-handler export` read back by Databento's own decoder (PyPI `databento-dbn`, from the
//! project's venv): on a generated day, every schema's record counts, metadata and a few
//! records must match what our ITCH decoder saw, counted here independently of the exporter,
//! and the last mbp-1 / mbp-10 record of each symbol must show our books' final levels. The
//! zstd form is read back with the `dbn` crate and must hold the same records.
//!
//! Python comes from `ROCEBUS_PYTHON` (set by `cargo xtask test`) or the venv's usual place
//! under the cache folder (see tests/itch_book_crosscheck.rs); without it this test fails and
//! says how to get one.

use feed_handler::binaryfile::Reader;
use feed_handler::book::{Book, Side};
use feed_handler::itch::Message;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

const DATE: &str = "2026-03-10";
/// Midnight US Eastern (daylight time, UTC-4) of `DATE` in UNIX nanoseconds.
const MIDNIGHT: u64 = 1_773_115_200_000_000_000;

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
        "\n\n*** DBN read-back NOT RUN: no Python with databento-dbn.\n\
         *** ROCEBUS_PYTHON is unset and the project's venv ({}) does not exist.\n\
         *** Run `cargo xtask setup` (or `cargo xtask test`, which sets ROCEBUS_PYTHON), or set\n\
         *** ROCEBUS_PYTHON to a python3 with `pip install -r feed-handler/crosscheck/requirements.txt`.\n",
        venv.display()
    );
    venv
}

fn run(cmd: &mut Command) -> Vec<u8> {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn export(day: &Path, schema: &str, out: &Path) {
    run(Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .arg("export")
        .arg(day)
        .args(["--schema", schema, "--date", DATE, "-o"])
        .arg(out));
}

fn read_back(python: &Path, file: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("crosscheck/dbn_read.py");
    let out = run(Command::new(python).arg(script).arg(file));
    serde_json::from_slice(&out).expect("dbn_read.py prints JSON")
}

fn count(v: &Value, key: &str) -> u64 {
    v["actions"][key]
        .as_u64()
        .or_else(|| v["counts"][key].as_u64())
        .unwrap_or(0)
}

/// What the capture says, counted without the exporter.
#[derive(Debug, Default)]
struct Seen {
    first_ts: u64,
    last_ts: u64,
    directory: Vec<(u16, String)>,
    adds: u64,
    executions: u64,
    printable_executions: u64,
    cancels: u64,
    deletes: u64,
    replaces: u64,
    non_cross_trades: u64,
    trading_actions: u64,
    operational_halts: u64,
    /// First add: (ts, locate, order id, side, shares, price).
    first_add: Option<(u64, u16, u64, u8, u32, u32)>,
    /// First E: (order id, shares, resting side, resting price).
    first_exec: Option<(u64, u32, u8, u32)>,
}

fn seen(data: &[u8]) -> (Seen, Book) {
    let mut s = Seen::default();
    let mut orders: HashMap<u64, (u8, u32, u32)> = HashMap::new();
    let mut book = Book::new();
    for m in Reader::new(data).unwrap().flatten() {
        book.apply(&m, &mut |_: &feed_handler::book::Event| {});
        let t = m.header().timestamp.nanos();
        if s.first_ts == 0 {
            s.first_ts = t;
        }
        s.last_ts = s.last_ts.max(t);
        match m {
            Message::StockDirectory(d) => s.directory.push((
                d.header.stock_locate.get(),
                d.stock.as_str().unwrap().to_owned(),
            )),
            Message::AddOrder(a) => {
                s.adds += 1;
                let id = a.order_reference_number.get();
                orders.insert(id, (a.buy_sell_indicator, a.shares.get(), a.price.get()));
                s.first_add.get_or_insert((
                    t,
                    a.header.stock_locate.get(),
                    id,
                    a.buy_sell_indicator,
                    a.shares.get(),
                    a.price.get(),
                ));
            }
            Message::AddOrderMpid(a) => {
                s.adds += 1;
                orders.insert(
                    a.order_reference_number.get(),
                    (a.buy_sell_indicator, a.shares.get(), a.price.get()),
                );
            }
            Message::OrderExecuted(e) => {
                s.executions += 1;
                s.printable_executions += 1;
                let id = e.order_reference_number.get();
                let o = orders
                    .get_mut(&id)
                    .expect("generated days name live orders");
                s.first_exec
                    .get_or_insert((id, e.executed_shares.get(), o.0, o.2));
                o.1 -= e.executed_shares.get();
            }
            Message::OrderExecutedWithPrice(e) => {
                s.executions += 1;
                s.printable_executions += u64::from(e.printable == b'Y');
                let o = orders.get_mut(&e.order_reference_number.get()).unwrap();
                o.1 -= e.executed_shares.get();
            }
            Message::OrderCancel(x) => {
                s.cancels += 1;
                let o = orders.get_mut(&x.order_reference_number.get()).unwrap();
                o.1 -= x.cancelled_shares.get();
            }
            Message::OrderDelete(d) => {
                s.deletes += 1;
                orders.remove(&d.order_reference_number.get()).unwrap();
            }
            Message::OrderReplace(u) => {
                s.replaces += 1;
                let o = orders
                    .remove(&u.original_order_reference_number.get())
                    .unwrap();
                orders.insert(
                    u.new_order_reference_number.get(),
                    (o.0, u.shares.get(), u.price.get()),
                );
            }
            Message::Trade(_) => s.non_cross_trades += 1,
            Message::StockTradingAction(_) => s.trading_actions += 1,
            Message::OperationalHalt(h) if h.market_code == b'Q' => s.operational_halts += 1,
            _ => {}
        }
    }
    (s, book)
}

/// `[bid_px, bid_sz, bid_ct, ask_px, ask_sz, ask_ct]` of level `k` of our book, DBN style.
fn level(book: &Book, locate: u16, k: usize) -> Vec<i64> {
    let b = book.symbol(locate).unwrap();
    let side = |s: Side| match b.depth(s).nth(k) {
        Some(l) => [
            i64::from(l.price) * 100_000,
            l.shares as i64,
            i64::from(l.orders),
        ],
        None => [i64::MAX, 0, 0],
    };
    let (bid, ask) = (side(Side::Bid), side(Side::Ask));
    vec![bid[0], bid[1], bid[2], ask[0], ask[1], ask[2]]
}

#[test]
fn export_reads_back_with_databento_dbn() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let day = dir.path().join("day.itch50");
    run(Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .args([
            "generate",
            "--seed",
            "7",
            "--messages",
            "30000",
            "--symbols",
            "8",
            "-o",
        ])
        .arg(&day));
    let data = std::fs::read(&day).unwrap();
    let (s, book) = seen(&data);
    assert!(s.executions > 0 && s.cancels > 0 && s.deletes > 0 && s.replaces > 0);
    assert!(s.non_cross_trades > 0 && s.trading_actions > 0);
    let n_sym = s.directory.len() as u64;

    let mut read = BTreeMap::new();
    for schema in ["mbo", "mbp-1", "mbp-10", "trades", "status", "definition"] {
        let out = dir.path().join(format!("{schema}.dbn"));
        export(&day, schema, &out);
        let v = read_back(&python, &out);
        let m = &v["metadata"];
        assert_eq!(m["version"], 3, "{schema}");
        assert_eq!(m["dataset"], "XNAS.ITCH");
        assert_eq!(m["schema"], schema);
        assert_eq!(m["stype_in"], "raw_symbol");
        assert_eq!(m["stype_out"], "instrument_id");
        assert_eq!(m["start"].as_u64(), Some(MIDNIGHT + s.first_ts));
        assert_eq!(m["end"].as_u64(), Some(MIDNIGHT + s.last_ts + 1));
        let symbols: Vec<&str> = s.directory.iter().map(|(_, n)| n.as_str()).collect();
        assert_eq!(m["symbols"], serde_json::json!(symbols));
        for (locate, name) in &s.directory {
            assert_eq!(
                m["mappings"][name],
                serde_json::json!([[DATE, "2026-03-11", locate.to_string()]])
            );
        }
        assert_eq!(count(&v, "SymbolMappingMsg"), n_sym, "{schema}");
        read.insert(schema, v);
    }

    // MBO: one record per book action, as the module documents.
    let mbo = &read["mbo"];
    assert_eq!(count(mbo, "MBOMsg:R"), n_sym);
    assert_eq!(count(mbo, "MBOMsg:A"), s.adds + s.replaces);
    assert_eq!(
        count(mbo, "MBOMsg:T"),
        s.printable_executions + s.non_cross_trades
    );
    assert_eq!(count(mbo, "MBOMsg:F"), s.executions);
    assert_eq!(
        count(mbo, "MBOMsg:C"),
        s.executions + s.cancels + s.deletes + s.replaces
    );
    let (ts, locate, id, side, shares, price) = s.first_add.unwrap();
    let a = &mbo["first"]["MBOMsg:A"][0];
    assert_eq!(a["ts_event"].as_u64(), Some(MIDNIGHT + ts));
    assert_eq!(a["ts_recv"].as_u64(), Some(MIDNIGHT + ts));
    assert_eq!(a["instrument_id"].as_u64(), Some(u64::from(locate)));
    assert_eq!(a["order_id"].as_u64(), Some(id));
    assert_eq!(a["size"].as_u64(), Some(u64::from(shares)));
    assert_eq!(a["price"].as_i64(), Some(i64::from(price) * 100_000));
    assert_eq!(a["side"], if side == b'B' { "B" } else { "A" });
    assert_eq!(
        a["flags"].as_u64(),
        Some(0x80 | 0x08),
        "F_LAST | F_BAD_TS_RECV"
    );
    let (id, shares, side, price) = s.first_exec.unwrap();
    let f = &mbo["first"]["MBOMsg:F"][0];
    assert_eq!(f["order_id"].as_u64(), Some(id));
    assert_eq!(f["size"].as_u64(), Some(u64::from(shares)));
    assert_eq!(f["price"].as_i64(), Some(i64::from(price) * 100_000));
    assert_eq!(f["side"], if side == b'B' { "B" } else { "A" });
    assert_eq!(
        f["flags"].as_u64(),
        Some(0x08),
        "F is not the last record of an E"
    );

    // Trades: executions that print and non-cross trades.
    let trades = &read["trades"];
    assert_eq!(
        count(trades, "TradeMsg:T"),
        s.printable_executions + s.non_cross_trades
    );
    let status = &read["status"];
    assert_eq!(
        count(status, "StatusMsg"),
        s.trading_actions + s.operational_halts
    );
    assert_eq!(count(&read["definition"], "InstrumentDefMsg"), n_sym);
    let def = &read["definition"]["first"]["InstrumentDefMsg"][0];
    assert_eq!(def["raw_symbol"], s.directory[0].1.as_str());
    assert_eq!(def["instrument_class"], "K");
    assert_eq!(def["exchange"], "XNAS");

    // MBP: the last record of each symbol shows our books' final levels.
    for (schema, ty, depth) in [("mbp-1", "MBP1Msg", 1), ("mbp-10", "MBP10Msg", 10)] {
        let v = &read[schema];
        let mut checked = 0;
        for (locate, name) in &s.directory {
            let Some(last) = v["last"][ty].get(locate.to_string()) else {
                continue;
            };
            for k in 0..depth {
                assert_eq!(
                    last["levels"][k],
                    serde_json::json!(level(&book, *locate, k)),
                    "{schema} {name} level {k}"
                );
            }
            checked += 1;
        }
        assert!(checked > 0, "{schema}: no symbol had a record");
    }

    // The zstd form holds the same records.
    let zst = dir.path().join("mbo.dbn.zst");
    export(&day, "mbo", &zst);
    use dbn::decode::{DbnMetadata, DecodeRecordRef};
    let mut dec = dbn::decode::DbnDecoder::from_zstd_file(&zst).unwrap();
    assert_eq!(dec.metadata().dataset, "XNAS.ITCH");
    let mut n = 0u64;
    while dec.decode_record_ref().unwrap().is_some() {
        n += 1;
    }
    let plain: u64 = mbo["counts"]
        .as_object()
        .unwrap()
        .values()
        .map(|c| c.as_u64().unwrap())
        .sum();
    assert_eq!(n, plain);
}

#[test]
fn export_refuses_bad_input_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.itch50");
    std::fs::write(&junk, b"not a capture at all").unwrap();
    let out = dir.path().join("x.dbn");
    let o = Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .arg("export")
        .arg(&junk)
        .args(["--schema", "mbo", "--date", DATE, "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        !out.exists(),
        "no output file for a file that is no capture"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_feed-handler"))
        .arg("export")
        .arg(&junk)
        .args(["--schema", "mbo", "--date", "2026-02-30", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("YYYY-MM-DD"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
