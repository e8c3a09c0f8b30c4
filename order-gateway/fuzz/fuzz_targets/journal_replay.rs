//! Opening a journal file of arbitrary bytes: `verify` and `Journal::open` never panic and
//! agree with each other; damage that is not a torn tail stops the open and leaves the file
//! byte for byte unchanged; a successful open replays what a second open replays again, and
//! only ever cuts a torn tail.
//!
//! Input: the first byte picks how the rest becomes the file: as it is (0), behind the magic
//! (1), or (2) as operations building a journal with correct checksums (records, commit
//! records with true or false lengths, then bit flips, cuts and raw bytes), because CRCs are
//! out of the fuzzer's reach.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use order_gateway::journal::{self, encode_record, Damage, FsyncPolicy, Journal, JournalError};
use order_gateway_fuzz::Input;

const MAGIC: &[u8; 8] = b"RBGWJNL1";

/// One file per process, in memory where there is a tmpfs: every open syncs it.
fn path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_owned()
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("order-gateway-fuzz-{}.journal", std::process::id()))
    })
}

/// A record of any kind, kind 0 (the journal's own) included.
fn record(file: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    if kind != 0 {
        return encode_record(file, kind, &[payload]);
    }
    let mut body = vec![0];
    body.extend_from_slice(payload);
    file.extend_from_slice(&(body.len() as u32).to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    file.extend_from_slice(&body);
}

/// A commit record (meta tag 1) claiming the file is durable up to `end`.
fn commit(file: &mut Vec<u8>, end: u64) {
    let mut p = vec![1];
    p.extend_from_slice(&end.to_le_bytes());
    record(file, 0, &p);
}

fn build(data: &[u8]) -> Vec<u8> {
    let mut input = Input::new(data);
    match input.u8() % 3 {
        0 => input.bytes(data.len()).to_vec(),
        1 => [&MAGIC[..], input.bytes(data.len())].concat(),
        _ => {
            let mut f = MAGIC.to_vec();
            while !input.is_empty() {
                let op = input.u8();
                match op % 6 {
                    0 => {
                        let (kind, len) = (input.u8(), usize::from(input.u8() % 48));
                        record(&mut f, kind, input.bytes(len));
                    }
                    // What an append that is synced writes last: the file length at its end.
                    1 => {
                        let end = f.len() as u64 + 18;
                        commit(&mut f, end);
                    }
                    2 => commit(&mut f, u64::from(input.u16())),
                    3 => {
                        let (at, x) = (usize::from(input.u16()), input.u8() | 1);
                        if !f.is_empty() {
                            let at = at % f.len();
                            f[at] ^= x;
                        }
                    }
                    4 => f.truncate(f.len().saturating_sub(usize::from(input.u8() % 24))),
                    _ => {
                        let len = usize::from(input.u8() % 16);
                        f.extend_from_slice(input.bytes(len));
                    }
                }
            }
            f
        }
    }
}

/// Records as replayed: kind and payload.
type Records = Vec<(u8, Vec<u8>)>;

/// Opens the journal, returning the records replayed and the bytes cut.
fn open() -> Result<(Records, u64), JournalError> {
    let mut records = Vec::new();
    let (j, stats) = Journal::open(path(), FsyncPolicy::Never, |k, p| {
        records.push((k, p.to_vec()))
    })?;
    assert_eq!(stats.records, records.len() as u64);
    assert_eq!(j.len(), std::fs::metadata(path()).expect("stat").len());
    Ok((records, stats.truncated_bytes))
}

fuzz_target!(|data: &[u8]| {
    let bytes = build(data);
    std::fs::write(path(), &bytes).expect("writing the journal file");
    let scan = journal::verify(path());
    let read = || std::fs::read(path()).expect("reading the journal file");
    match (open(), scan) {
        (Ok((records, cut)), scan) => {
            let after = read();
            if bytes.len() < MAGIC.len() {
                // New, or a crash while writing the magic: a fresh journal.
                assert!(MAGIC.starts_with(&bytes));
                assert_eq!(after, MAGIC);
                assert!(records.is_empty());
            } else {
                // Only a torn tail is ever cut, and verify saw the same file.
                let scan = scan.expect("verify reads what open read");
                assert_eq!(scan.records(), records.len() as u64);
                match scan.damage {
                    None => assert_eq!(cut, 0),
                    Some(Damage::TornTail { offset, bytes: n }) => {
                        assert_eq!((offset + n, n), (bytes.len() as u64, cut));
                    }
                    Some(d) => panic!("open succeeded on a journal verify calls corrupt: {d:?}"),
                }
                // (A commit record may claim more than the file holds: nothing can tell.)
                assert_eq!(after[..], bytes[..bytes.len() - cut as usize]);
            }
            // A second open finds a clean journal with the same records, and changes nothing.
            let (again, cut) = open().expect("a journal opened once opens again");
            assert_eq!(cut, 0);
            assert_eq!(again, records);
            assert_eq!(read(), after);
        }
        (Err(JournalError::Damaged { offset, .. }), scan) => {
            assert_eq!(read(), bytes, "a damaged journal was changed");
            let scan = scan.expect("verify reads what open read");
            assert!(
                matches!(scan.damage, Some(Damage::Corrupt { offset: o, .. }) if o == offset),
                "open and verify disagree: {:?}",
                scan.damage
            );
        }
        (Err(JournalError::BadMagic(_)), scan) => {
            assert_eq!(read(), bytes, "a file that is not a journal was changed");
            assert!(matches!(scan, Err(JournalError::BadMagic(_))));
        }
        (Err(e), _) => panic!("unexpected journal error on a healthy file system: {e}"),
    }
});
