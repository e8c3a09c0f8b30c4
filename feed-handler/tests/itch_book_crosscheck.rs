//! `feed-handler bbo` against itch-book (PyPI `itch-book`, MIT), an independent ITCH 5.0 book
//! written in C++: on a generated day with hundreds of symbols and every message kind the
//! generator writes, both must report the same top-of-book changes, row for row, for every
//! symbol (locate, timestamp, best bid and ask price, size and order count).
//!
//! itch-book's `bbo` table has one row per change of the best bid or offer's price or size;
//! ours has one per change of price, size or order count. A single ITCH message cannot change
//! the order count of the top level without changing its size (every order rests with at
//! least one share, and both books refuse zero-share adds), so the two definitions give the
//! same rows: a difference is a bug on one side, not a matter of definition.
//!
//! Python comes from `ROCEBUS_PYTHON` (set by `cargo xtask test` to the project's venv, which
//! `cargo xtask setup` fills from `crosscheck/requirements.txt`), else the venv's usual place
//! under the cache folder. Without either this test fails and says how to get one: it never
//! passes without having compared.

use feed_handler::binaryfile::Reader;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const SYMBOLS: u16 = 500;
const MESSAGES: u64 = 100_000;

/// The venv's python, as `cargo xtask setup` builds it (see `xtask/src/venue.rs`).
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
        "\n\n*** itch-book cross-check NOT RUN: no Python with itch-book.\n\
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

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("crosscheck/itch_book_run.py")
}

#[test]
fn bbo_matches_itch_book_on_a_generated_day() {
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let day = dir.path().join("day.itch50");
    let exe = env!("CARGO_BIN_EXE_feed-handler");
    run(Command::new(exe)
        .args(["generate", "--seed", "19", "--messages"])
        .arg(MESSAGES.to_string())
        .arg("--symbols")
        .arg(SYMBOLS.to_string())
        .arg("-o")
        .arg(&day));

    // The day holds every kind of message the generator writes, book-changing or not.
    let bytes = std::fs::read(&day).unwrap();
    let kinds: BTreeSet<u8> = Reader::new(&bytes)
        .unwrap()
        .map(|m| m.expect("generated records decode").message_type())
        .collect();
    assert_eq!(
        String::from_utf8(kinds.into_iter().collect()).unwrap(),
        "ACDEFHPRSUX"
    );

    let ours = String::from_utf8(run(Command::new(exe).arg("bbo").arg(&day))).unwrap();
    let theirs = run(Command::new(&python).arg(script()).arg("bbo").arg(&day));
    let theirs = String::from_utf8(theirs).unwrap();

    // itch-book's rows carry no symbol: compare without ours (the second column).
    let ours: Vec<String> = ours
        .lines()
        .map(|l| {
            let mut f: Vec<&str> = l.split(',').collect();
            f.remove(1);
            f.join(",")
        })
        .collect();
    let ours: Vec<&str> = ours.iter().map(String::as_str).collect();
    let theirs: Vec<&str> = theirs.lines().collect();
    let differing: Vec<usize> = (0..ours.len().max(theirs.len()))
        .filter(|&i| ours.get(i) != theirs.get(i))
        .collect();
    if let Some(&first) = differing.first() {
        let show = |rows: &[&str]| {
            rows[first.saturating_sub(2)..(first + 3).min(rows.len())]
                .iter()
                .map(|r| format!("    {r}"))
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "feed-handler bbo and itch-book differ on {} of {}/{} rows; first at row {first}:\n  \
             ours:\n{}\n  itch-book:\n{}",
            differing.len(),
            ours.len(),
            theirs.len(),
            show(&ours),
            show(&theirs)
        );
    }

    // Not an empty agreement: a header, many rows, and every symbol's top of book moved.
    assert_eq!(
        ours[0],
        feed_handler::inspect::BBO_HEADER.replace(",symbol", "")
    );
    assert!(ours.len() > 10_000, "only {} rows", ours.len());
    let locates: BTreeSet<u16> = ours[1..]
        .iter()
        .map(|r| r.split(',').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(locates, (1..=SYMBOLS).collect());
}
