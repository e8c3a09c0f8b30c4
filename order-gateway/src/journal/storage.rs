//! The journal's file system: every file and directory operation the journal makes goes
//! through [`Storage`] and [`StorageFile`], so the simulator can run the real journal code
//! over a simulated disk with a durable and a volatile view (`journal::sim_disk`), and
//! the gateway runs it over [`OsStorage`] (std and rustix: the same system calls as before
//! the trait existed, one virtual call each).
//!
//! The contract is POSIX's, as a careful reader of it (and of "fsyncgate") assumes no more:
//! a write is durable only once a later `sync_data`/`sync_all` of its file returned `Ok`; a
//! failed sync may have written any subset of the dirty pages and dropped the rest (marked
//! clean: a later sync that succeeds says nothing about them); a rename, link, create or
//! remove is durable only once its directory was synced; a crash may keep any subset of the
//! pages written since the last sync, torn at any byte.
//!
//! This module owns the I/O interface only; the journal's format and durability argument
//! are in [`super`].

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// Identity of a file (device and inode): two names of one file have the same.
pub type FileId = (u64, u64);

/// How to open a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write, created empty if missing, kept as it is otherwise.
    Create,
    /// Read and write, created if missing, cut to 0 bytes if present.
    CreateTruncate,
    /// Write, created; fails with `AlreadyExists` if the name is taken.
    CreateNew,
}

/// A directory of files the journal lives in (a file system).
pub trait Storage: Send + Sync + std::fmt::Debug {
    /// Opens `path`.
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>>;
    /// Renames `from` to `to`, replacing `to` (atomic; durable once the directory is synced).
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes `to` a second name of `from` (`AlreadyExists` if `to` exists).
    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Removes the name `path`.
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// Makes the renames, links, creates and removes in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    /// The names in `dir` with their file's identity (`NotFound` if `dir` is missing).
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, FileId)>>;
    /// The identity of the file at `path` (`NotFound` if there is none).
    fn file_id(&self, path: &Path) -> io::Result<FileId>;
    /// Creates `dir` and its parents if missing.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
}

/// An open file of a [`Storage`]. Positional I/O only: the journal keeps its own append
/// position.
pub trait StorageFile: Send + std::fmt::Debug {
    /// Reads at `at`; `Ok(0)` at the end.
    fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<usize>;
    /// Writes at `at` (possibly fewer bytes than given).
    fn write_at(&self, buf: &[u8], at: u64) -> io::Result<usize>;
    /// The file's length.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file has no bytes.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Cuts or extends the file to `len` bytes.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// `fdatasync`: the data written so far and the length are durable once it returns `Ok`.
    fn sync_data(&self) -> io::Result<()>;
    /// `fsync`: as [`sync_data`](Self::sync_data), with the file's metadata.
    fn sync_all(&self) -> io::Result<()>;
    /// Takes an exclusive advisory lock without waiting (`flock`): `Ok(false)` if another
    /// open file holds it. Released when the file is closed.
    fn try_lock(&self) -> io::Result<bool>;
    /// Reserves `len` bytes past `at` where the file system allows it, without changing
    /// the length, and fails if the file-size limit leaves less (a journal's probe).
    fn reserve(&self, at: u64, len: u64) -> io::Result<()>;
    /// The file's identity.
    fn id(&self) -> io::Result<FileId>;

    /// Reads exactly `buf.len()` bytes at `at` (`UnexpectedEof` past the end).
    fn read_exact_at(&self, mut buf: &mut [u8], mut at: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, at) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    buf = &mut buf[n..];
                    at += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `at`.
    fn write_all_at(&self, mut buf: &[u8], mut at: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, at) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    buf = &buf[n..];
                    at += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// A sequential reader over a [`StorageFile`] from an offset (for `BufReader` and
/// `io::copy`).
#[derive(Debug)]
pub struct ReadFrom<'a> {
    file: &'a dyn StorageFile,
    pos: u64,
}

impl<'a> ReadFrom<'a> {
    /// Reads `file` from `pos` on.
    pub fn new(file: &'a dyn StorageFile, pos: u64) -> ReadFrom<'a> {
        ReadFrom { file, pos }
    }
}

impl io::Read for ReadFrom<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// The operating system's file system (std and rustix): what the gateway runs on.
#[derive(Clone, Copy, Debug, Default)]
pub struct OsStorage;

/// A file of [`OsStorage`].
#[derive(Debug)]
pub struct OsFile(File);

impl Storage for OsStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut o = OpenOptions::new();
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::ReadWrite => o.read(true).write(true),
            OpenMode::Create => o.read(true).write(true).create(true).truncate(false),
            OpenMode::CreateTruncate => o.read(true).write(true).create(true).truncate(true),
            OpenMode::CreateNew => o.write(true).create_new(true),
        };
        Ok(Box::new(OsFile(o.open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::hard_link(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, FileId)>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let m = match entry.metadata() {
                Ok(m) => m,
                // Removed since it was listed.
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            out.push((entry.file_name(), (m.dev(), m.ino())));
        }
        Ok(out)
    }

    fn file_id(&self, path: &Path) -> io::Result<FileId> {
        let m = std::fs::metadata(path)?;
        Ok((m.dev(), m.ino()))
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }
}

impl StorageFile for OsFile {
    fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        self.0.read_at(buf, at)
    }

    fn write_at(&self, buf: &[u8], at: u64) -> io::Result<usize> {
        self.0.write_at(buf, at)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn try_lock(&self) -> io::Result<bool> {
        use rustix::fs::{flock, FlockOperation};
        match flock(&self.0, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(true),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    fn reserve(&self, at: u64, len: u64) -> io::Result<()> {
        use rustix::fs::{fallocate, FallocateFlags};
        // A KEEP_SIZE fallocate is not held to the file-size limit (RLIMIT_FSIZE): checked
        // here, or a journal at its limit would pass whenever a commit record still fits,
        // and the gateway would take requests again only to fail the next append.
        let limit = rustix::process::getrlimit(rustix::process::Resource::Fsize).current;
        if limit.is_some_and(|l| at.saturating_add(len) > l) {
            return Err(io::Error::from_raw_os_error(
                rustix::io::Errno::FBIG.raw_os_error(),
            ));
        }
        match fallocate(&self.0, FallocateFlags::KEEP_SIZE, at, len) {
            Ok(()) => Ok(()),
            Err(e) if e == rustix::io::Errno::OPNOTSUPP => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    fn id(&self) -> io::Result<FileId> {
        let m = self.0.metadata()?;
        Ok((m.dev(), m.ino()))
    }
}
