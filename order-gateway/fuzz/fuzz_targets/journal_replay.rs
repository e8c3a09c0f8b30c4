//! Opening a journal file of arbitrary bytes: `verify` and `Journal::open` never panic and
//! agree with each other; damage that is not a torn tail stops the open and leaves the file
//! byte for byte unchanged; a successful open replays what a second open replays again, and
//! only ever cuts a torn tail past the durable point.
//!
//! Input: the first byte picks how the rest becomes the file: as it is (0), behind a valid
//! format-2 header (1), or (2) as operations building a journal with correct checksums and
//! chain (records, commit records with true or false lengths, a superblock claiming some
//! durable length, then bit flips, cuts and raw bytes), because CRCs are out of the
//! fuzzer's reach.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use order_gateway::journal::{
    self, segment_header, Damage, FsyncPolicy, Journal, JournalError, Superblock, HEADER_LEN,
};
use order_gateway_fuzz::Input;

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

/// The header of a first segment whose superblock claims `durable` bytes (chain `chain`).
fn header(durable: u64, chain: u32) -> Vec<u8> {
    segment_header(&Superblock {
        seq: 1,
        durable,
        chain,
        segment: 1,
        prev_len: 0,
        prev_chain: 0,
    })
}

/// A record of any kind, kind 0 (the journal's own) included, chained after `chain`;
/// returns the chain value after it.
fn record(file: &mut Vec<u8>, chain: u32, kind: u8, payload: &[u8]) -> u32 {
    let mut covered = chain.to_le_bytes().to_vec();
    covered.push(kind);
    covered.extend_from_slice(payload);
    let crc = crc32fast::hash(&covered);
    file.extend_from_slice(&(covered.len() as u32 - 4).to_le_bytes());
    file.extend_from_slice(&crc.to_le_bytes());
    file.extend_from_slice(&covered);
    crc
}

/// A commit record (meta tag 1) claiming the file is durable up to `end`.
fn commit(file: &mut Vec<u8>, chain: u32, end: u64) -> u32 {
    let mut p = vec![1];
    p.extend_from_slice(&end.to_le_bytes());
    record(file, chain, 0, &p)
}

fn build(data: &[u8]) -> Vec<u8> {
    let mut input = Input::new(data);
    match input.u8() % 3 {
        0 => input.bytes(data.len()).to_vec(),
        1 => [&header(HEADER_LEN, 0)[..], input.bytes(data.len())].concat(),
        _ => {
            let mut f = header(HEADER_LEN, 0);
            let mut chain = 0;
            while !input.is_empty() {
                let op = input.u8();
                match op % 7 {
                    0 => {
                        let (kind, len) = (input.u8(), usize::from(input.u8() % 48));
                        chain = record(&mut f, chain, kind, input.bytes(len));
                    }
                    // What an append that is synced writes last: the file length at its end.
                    1 => {
                        let end = f.len() as u64 + 22;
                        chain = commit(&mut f, chain, end);
                    }
                    2 => chain = commit(&mut f, chain, u64::from(input.u16())),
                    3 => {
                        let (at, x) = (usize::from(input.u16()), input.u8() | 1);
                        if !f.is_empty() {
                            let at = at % f.len();
                            f[at] ^= x;
                        }
                    }
                    4 => f.truncate(f.len().saturating_sub(usize::from(input.u8() % 24))),
                    // The superblock claims the file up to here durable (what a later
                    // append's superblock write says), with the true chain value.
                    5 => {
                        let h = header(f.len() as u64, chain);
                        let n = h.len().min(f.len());
                        f[..n].copy_from_slice(&h[..n]);
                    }
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

/// The records part of a file (open rewrites the superblock, never the records).
fn body(f: &[u8]) -> &[u8] {
    f.get(HEADER_LEN as usize..).unwrap_or(&[])
}

fuzz_target!(|data: &[u8]| {
    let bytes = build(data);
    std::fs::write(path(), &bytes).expect("writing the journal file");
    let scan = journal::verify(path());
    let read = || std::fs::read(path()).expect("reading the journal file");
    match (open(), scan) {
        (Ok((records, cut)), scan) => {
            let after = read();
            let scan = scan.expect("verify reads what open read");
            if scan.superblock.is_none() {
                // New, or a crash while writing the first header: a fresh journal.
                assert!(bytes.len() as u64 <= HEADER_LEN);
                assert_eq!(after.len() as u64, HEADER_LEN);
                assert!(records.is_empty());
            } else {
                // Only a torn tail past the durable point is ever cut, and verify saw the
                // same file.
                assert_eq!(scan.records(), records.len() as u64);
                match scan.damage {
                    None => assert_eq!(cut, 0),
                    Some(Damage::TornTail { offset, bytes: n }) => {
                        assert_eq!((offset + n, n), (bytes.len() as u64, cut));
                        assert!(offset >= scan.durable_len);
                    }
                    Some(d) => panic!("open succeeded on a journal verify calls corrupt: {d:?}"),
                }
                assert_eq!(body(&after), body(&bytes[..bytes.len() - cut as usize]));
            }
            // A second open finds a clean journal with the same records, and changes none.
            let (again, cut) = open().expect("a journal opened once opens again");
            assert_eq!(cut, 0);
            assert_eq!(again, records);
            assert_eq!(body(&read()), body(&after));
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
        (Err(JournalError::OldFormat(_)), scan) => {
            assert_eq!(read(), bytes, "a format-1 journal was changed");
            assert!(matches!(scan, Err(JournalError::OldFormat(_))));
        }
        (Err(e), _) => panic!("unexpected journal error on a healthy file system: {e}"),
    }
});
