//! Append-only journal of every gateway event, checksummed and length-prefixed.
//!
//! File layout: an 8-byte magic `RBGWJNL1`, then records
//! `[len: u32 LE][crc32: u32 LE][kind: u8][payload: len - 1 bytes]`, where the CRC (crc32fast,
//! IEEE) covers kind and payload. Records are built by the I/O-free gateway with
//! [`encode_record`] into a byte buffer; [`Journal::append`] writes that buffer and applies the
//! fsync policy. On open, [`Journal::open`] hands every intact record to a callback and cuts
//! the file at the first torn or corrupt record (a crash mid-write leaves at most one).
//!
//! This module owns the file format and durability only; what records mean is the gateway's.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde::Deserialize;

const MAGIC: &[u8; 8] = b"RBGWJNL1";
const RECORD_HEADER: usize = 8;
/// Largest record accepted on read; anything bigger is corruption.
pub const MAX_RECORD: usize = 1 << 20;

/// When to fsync.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum FsyncPolicy {
    /// Leave it to the OS (fastest; a power loss can lose the tail).
    Never,
    /// After every `n` records.
    EveryN(u32),
    /// After every append (every batch of records the gateway produced).
    Always,
}

/// Journal errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JournalError {
    /// Opening or creating the file failed.
    #[error("open journal {path}")]
    Open {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file exists but is not a journal.
    #[error("{0} is not a gateway journal (bad magic)")]
    BadMagic(PathBuf),
    /// Reading during recovery failed.
    #[error("read journal")]
    Read(#[source] io::Error),
    /// Cutting a torn tail failed.
    #[error("truncate torn journal tail")]
    Truncate(#[source] io::Error),
    /// Appending failed.
    #[error("append to journal")]
    Append(#[source] io::Error),
    /// fsync failed.
    #[error("fsync journal")]
    Sync(#[source] io::Error),
}

/// What recovery found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecoveryStats {
    /// Intact records replayed.
    pub records: u64,
    /// Bytes cut from a torn or corrupt tail.
    pub truncated_bytes: u64,
}

/// Appends one record to `buf`.
pub fn encode_record(buf: &mut Vec<u8>, kind: u8, parts: &[&[u8]]) {
    let len: usize = 1 + parts.iter().map(|p| p.len()).sum::<usize>();
    let mut h = crc32fast::Hasher::new();
    h.update(&[kind]);
    for p in parts {
        h.update(p);
    }
    buf.extend_from_slice(&(len as u32).to_le_bytes());
    buf.extend_from_slice(&h.finalize().to_le_bytes());
    buf.push(kind);
    for p in parts {
        buf.extend_from_slice(p);
    }
}

/// Splits the first intact record off `bytes`: `(kind, payload, total length)`.
pub fn decode_record(bytes: &[u8]) -> Option<(u8, &[u8], usize)> {
    let len = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?);
    if len == 0 || len > MAX_RECORD {
        return None;
    }
    let body = bytes.get(RECORD_HEADER..RECORD_HEADER + len)?;
    (crc32fast::hash(body) == crc).then(|| (body[0], &body[1..], RECORD_HEADER + len))
}

/// An open journal, positioned at its end.
#[derive(Debug)]
pub struct Journal {
    file: File,
    policy: FsyncPolicy,
    unsynced: u32,
}

impl Journal {
    /// Opens (or creates) `path`, replays every intact record into `on_record(kind, payload)`
    /// and cuts a torn tail.
    pub fn open(
        path: &Path,
        policy: FsyncPolicy,
        mut on_record: impl FnMut(u8, &[u8]),
    ) -> Result<(Journal, RecoveryStats), JournalError> {
        let open_err = |source| JournalError::Open {
            path: path.to_owned(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(open_err)?;
        let mut data = Vec::new();
        file.read_to_end(&mut data).map_err(JournalError::Read)?;
        let mut stats = RecoveryStats::default();
        if data.len() < MAGIC.len() {
            if !MAGIC.starts_with(&data) {
                return Err(JournalError::BadMagic(path.to_owned()));
            }
            // New file, or a crash while writing the magic.
            file.set_len(0).map_err(JournalError::Truncate)?;
            file.seek(SeekFrom::Start(0))
                .map_err(JournalError::Truncate)?;
            file.write_all(MAGIC).map_err(JournalError::Append)?;
            file.sync_all().map_err(JournalError::Sync)?;
            return Ok((
                Journal {
                    file,
                    policy,
                    unsynced: 0,
                },
                stats,
            ));
        }
        if &data[..MAGIC.len()] != MAGIC {
            return Err(JournalError::BadMagic(path.to_owned()));
        }
        let mut pos = MAGIC.len();
        while let Some((kind, payload, n)) = decode_record(&data[pos..]) {
            on_record(kind, payload);
            stats.records += 1;
            pos += n;
        }
        if pos < data.len() {
            stats.truncated_bytes = (data.len() - pos) as u64;
            file.set_len(pos as u64).map_err(JournalError::Truncate)?;
            file.sync_all().map_err(JournalError::Sync)?;
        }
        file.seek(SeekFrom::Start(pos as u64))
            .map_err(JournalError::Truncate)?;
        Ok((
            Journal {
                file,
                policy,
                unsynced: 0,
            },
            stats,
        ))
    }

    /// Appends `records` (whole records from [`encode_record`], `count` of them) and syncs
    /// per policy. Must complete before the effects they describe leave the process.
    pub fn append(&mut self, records: &[u8], count: u32) -> Result<(), JournalError> {
        if records.is_empty() {
            return Ok(());
        }
        self.file.write_all(records).map_err(JournalError::Append)?;
        self.unsynced = self.unsynced.saturating_add(count);
        let sync = match self.policy {
            FsyncPolicy::Never => false,
            FsyncPolicy::Always => true,
            FsyncPolicy::EveryN(n) => self.unsynced >= n.max(1),
        };
        if sync {
            self.file.sync_data().map_err(JournalError::Sync)?;
            self.unsynced = 0;
        }
        Ok(())
    }

    /// Forces an fsync.
    pub fn sync(&mut self) -> Result<(), JournalError> {
        self.file.sync_data().map_err(JournalError::Sync)?;
        self.unsynced = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("gw-journal-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    fn write(path: &Path, n: u32) {
        let (mut j, _) = Journal::open(path, FsyncPolicy::EveryN(2), |_, _| {}).unwrap();
        let mut buf = Vec::new();
        for i in 0..n {
            encode_record(&mut buf, 1, &[&i.to_le_bytes(), b"payload"]);
        }
        j.append(&buf, n).unwrap();
    }

    fn read_all(path: &Path) -> (Vec<u32>, RecoveryStats) {
        let mut got = Vec::new();
        let (_, stats) = Journal::open(path, FsyncPolicy::Never, |k, p| {
            assert_eq!(k, 1);
            assert_eq!(&p[4..], b"payload");
            got.push(u32::from_le_bytes(p[..4].try_into().unwrap()));
        })
        .unwrap();
        (got, stats)
    }

    #[test]
    fn round_trip_and_append_after_reopen() {
        let p = tmp("rt");
        write(&p, 3);
        write(&p, 2);
        let (got, stats) = read_all(&p);
        assert_eq!(got, [0, 1, 2, 0, 1]);
        assert_eq!(
            stats,
            RecoveryStats {
                records: 5,
                truncated_bytes: 0
            }
        );
    }

    #[test]
    fn torn_tail_is_cut() {
        let p = tmp("torn");
        write(&p, 3);
        let full = std::fs::metadata(&p).unwrap().len();
        let rec = (RECORD_HEADER + 1 + 4 + 7) as u64;
        for cut in 1..rec {
            write(&p, 0);
            let f = OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(full - cut).unwrap();
            let (got, stats) = read_all(&p);
            assert_eq!(got, [0, 1], "cut {cut}");
            assert_eq!(stats.truncated_bytes, rec - cut);
            assert_eq!(std::fs::metadata(&p).unwrap().len(), full - rec);
            // Restore the third record for the next round.
            write(&p, 0);
            let mut buf = Vec::new();
            encode_record(&mut buf, 1, &[&2u32.to_le_bytes(), b"payload"]);
            let (mut j, _) = Journal::open(&p, FsyncPolicy::Always, |_, _| {}).unwrap();
            j.append(&buf, 1).unwrap();
        }
    }

    #[test]
    fn corrupt_tail_is_cut_and_appends_continue() {
        let p = tmp("corrupt");
        write(&p, 3);
        let mut data = std::fs::read(&p).unwrap();
        let l = data.len();
        data[l - 3] ^= 0xff;
        std::fs::write(&p, &data).unwrap();
        let (got, stats) = read_all(&p);
        assert_eq!(got, [0, 1]);
        assert!(stats.truncated_bytes > 0);
        write(&p, 1);
        assert_eq!(read_all(&p).0, [0, 1, 0]);
    }

    #[test]
    fn not_a_journal() {
        let p = tmp("magic");
        std::fs::write(&p, b"something else entirely").unwrap();
        assert!(matches!(
            Journal::open(&p, FsyncPolicy::Never, |_, _| {}),
            Err(JournalError::BadMagic(_))
        ));
    }

    #[test]
    fn decode_never_panics_on_garbage() {
        let mut buf = Vec::new();
        encode_record(&mut buf, 7, &[b"abc"]);
        for i in 0..buf.len() {
            let _ = decode_record(&buf[..i]);
            let mut b = buf.clone();
            b[i] ^= 0x55;
            assert!(decode_record(&b).is_none() || i >= buf.len());
        }
        assert_eq!(
            decode_record(&buf).map(|(k, p, n)| (k, p.to_vec(), n)),
            Some((7, b"abc".to_vec(), buf.len()))
        );
    }
}
