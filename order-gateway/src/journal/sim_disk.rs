//! The simulated disk the journal runs on in the simulator: a [`Storage`] with a volatile
//! view (the page cache: what reads return while the machine is up) and a durable view
//! (what a power loss leaves), and a disk that lies (TigerBeetle's storage fault model).
//!
//! - **Writes** go to the page cache and dirty its 4 KiB pages; a successful
//!   `sync_data`/`sync_all` writes the file's dirty pages and its length to the durable
//!   view. One page in [`MISDIRECT_ONE_IN`] written by a sync lands on another page (of the
//!   same file or another one, inside its durable length) and its own place keeps what it
//!   held: a misdirected write, invisible until the page cache is lost.
//! - **A failed sync** (a disk outage on fsync) writes each dirty page, or drops it: marked
//!   clean, the page cache keeping the new bytes, or evicted and reading back what the disk
//!   holds (Linux after a writeback error, "fsyncgate"); the length is written or not.
//! - **A power loss** ([`SimDisk::power_loss`]) keeps each page dirtied since the last sync
//!   whole, torn at any byte, or not at all, and the new length or the old; of the renames,
//!   links, creates and removes since the last directory sync a prefix survives (file
//!   systems journal their metadata in order). The page cache is then what the disk holds.
//!   **A process crash** ([`SimDisk::kill`]) loses nothing the kernel holds.
//! - **A crash during a sync** ([`SimDisk::arm_crash`]): the Nth sync from now takes a
//!   snapshot of the whole disk as it is when it is called and fails; the crash then starts
//!   from that snapshot (the process died in the system call).
//! - **Outages** ([`SimDisk::set_outage`]): every operation of one kind fails with EIO or
//!   ENOSPC; a write that fails may first have written a prefix of its bytes.
//! - **Damage at rest** (zeroed sectors, corrupt bytes, cut or removed files): in both
//!   views, done by the simulator between a crash and the restart.
//!
//! The disk keeps, per file, what its last successful sync promised (the bytes and length
//! the page cache held then), so the simulator can tell, after any of this, whether a byte
//! the journal was promised is not what it was ([`SimDisk::broken_promise`]): the oracle of
//! "the start must refuse". Everything is drawn from the disk's own seeded stream.
//!
//! This module owns the simulated disk; it knows nothing of the journal's format.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::journal::storage::{FileId, OpenMode, Storage, StorageFile};
use crate::journal::StorageOp;

/// What was done to the journal, and what the restart must therefore do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Damage {
    /// Nothing, or only bytes past the durable point (the start must accept the journal).
    Cuttable,
    /// The header (magic, superblock copies) damaged past its redundancy, records intact:
    /// the start may refuse (naming the journal) or accept.
    MayRefuse(String),
    /// Bytes inside the durable extent, or the current segment lost while archives exist:
    /// the start must be refused.
    MustRefuse(String),
}

/// Page size of the page cache.
pub const PAGE: u64 = 4096;
/// Sector size of damage at rest.
const SECTOR: u64 = 512;
/// One page written by a sync in this many is misdirected.
pub const MISDIRECT_ONE_IN: u32 = 40_000;

/// Kinds of disk fault counted, in the order of [`SimDisk::counts`].
pub const DISK_FAULTS: [&str; 8] = [
    "power loss: dirty page lost",
    "power loss: dirty page torn",
    "power loss: directory operation lost",
    "misdirected page write",
    "failed fsync: dirty page dropped (cached)",
    "failed fsync: dirty page dropped (evicted)",
    "failed write: a prefix written first",
    "crash inside a sync",
];
const LOST: usize = 0;
const TORN: usize = 1;
const DIR_LOST: usize = 2;
const MISDIRECTED: usize = 3;
const DROPPED: usize = 4;
const EVICTED: usize = 5;
const SHORT: usize = 6;
const IN_SYNC: usize = 7;

/// The operations an outage fails, in the order of [`SimDisk::failed`].
pub const OUTAGE_OPS: [StorageOp; 5] = [
    StorageOp::Write,
    StorageOp::Fsync,
    StorageOp::Rename,
    StorageOp::Link,
    StorageOp::DirSync,
];

#[derive(Clone, Debug, Default)]
struct Inode {
    /// The volatile view (page cache).
    cache: Vec<u8>,
    /// The durable view.
    disk: Vec<u8>,
    /// Pages written since they last reached the disk (or were dropped).
    dirty: BTreeSet<u64>,
    /// The length changed since it last reached the disk.
    len_dirty: bool,
    /// What the last successful sync promised: the page cache then.
    promised: Vec<u8>,
    /// Bytes written since the last successful sync (not promised): `true` at their index.
    since_sync: Vec<bool>,
    /// The length was changed since the last successful sync: bytes from here on are not
    /// promised.
    cut_since_sync: Option<u64>,
    /// The open file holding its lock.
    lock: Option<u64>,
}

#[derive(Clone, Debug)]
enum DirOp {
    Link(PathBuf, usize),
    Rename(PathBuf, PathBuf),
    Remove(PathBuf),
}

fn apply(names: &mut BTreeMap<PathBuf, usize>, op: &DirOp) {
    match op {
        DirOp::Link(p, ino) => {
            names.insert(p.clone(), *ino);
        }
        DirOp::Rename(from, to) => {
            if let Some(ino) = names.remove(from) {
                names.insert(to.clone(), ino);
            }
        }
        DirOp::Remove(p) => {
            names.remove(p);
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Fs {
    inodes: Vec<Inode>,
    /// Names as the running system sees them.
    names: BTreeMap<PathBuf, usize>,
    /// Names as a power loss leaves them, before `pending`.
    durable_names: BTreeMap<PathBuf, usize>,
    /// Directory operations since the last directory sync, in order.
    pending: Vec<DirOp>,
}

#[derive(Debug)]
struct State {
    fs: Fs,
    rng: ChaCha8Rng,
    next_open: u64,
    outage: Option<(StorageOp, bool)>,
    failed: [u64; 10],
    counts: [u64; DISK_FAULTS.len()],
    /// Syncs to go before the one a crash interrupts.
    crash_in: Option<u32>,
    /// The disk as it was when the crash interrupted a sync.
    snapshot: Option<Fs>,
    /// Misdirect one page in this many (0: never).
    misdirect_one_in: u32,
    /// A failed sync may evict the pages it drops.
    evict: bool,
}

/// The simulated disk (cheap to clone: one shared state).
#[derive(Clone, Debug)]
pub struct SimDisk(Arc<Mutex<State>>);

/// A file open on a [`SimDisk`].
#[derive(Debug)]
pub struct SimFile {
    disk: SimDisk,
    ino: usize,
    open: u64,
}

/// Marks bytes `from..to` in `mask`.
fn mark(mask: &mut Vec<bool>, from: usize, to: usize) {
    if mask.len() < to {
        mask.resize(to, false);
    }
    mask[from..to].fill(true);
}

fn errno(n: i32) -> io::Error {
    io::Error::from_raw_os_error(n)
}

fn pages(at: u64, len: u64) -> std::ops::RangeInclusive<u64> {
    at / PAGE..=(at + len.max(1) - 1) / PAGE
}

/// Copies page `p` of `from` over `to`, clipped to `to`'s length.
fn copy_page(from: &[u8], to: &mut [u8], p: u64, upto: usize) {
    let start = (p * PAGE) as usize;
    let end = (((p + 1) * PAGE) as usize).min(upto).min(to.len());
    for (i, b) in to.iter_mut().enumerate().take(end).skip(start) {
        *b = from.get(i).copied().unwrap_or(0);
    }
}

impl State {
    fn fail(&mut self, op: StorageOp) -> io::Result<()> {
        match self.outage {
            Some((o, enospc)) if o == op => {
                let i = 2 * OUTAGE_OPS.iter().position(|x| *x == op).unwrap_or(0);
                self.failed[i + usize::from(enospc)] += 1;
                Err(errno(if enospc { 28 } else { 5 }))
            }
            _ => Ok(()),
        }
    }

    /// A sync a crash interrupts: `true` once the crash has happened (every later sync
    /// fails too: the process is dead, whatever it still does is lost).
    fn crashed(&mut self) -> bool {
        if self.snapshot.is_some() {
            return true;
        }
        match &mut self.crash_in {
            Some(0) => {
                self.crash_in = None;
                self.snapshot = Some(self.fs.clone());
                self.counts[IN_SYNC] += 1;
                true
            }
            Some(n) => {
                *n -= 1;
                false
            }
            None => false,
        }
    }

    fn sync(&mut self, ino: usize) -> io::Result<()> {
        if self.crashed() {
            return Err(errno(5));
        }
        if self.fail(StorageOp::Fsync).is_err() {
            self.failed_sync(ino);
            return Err(errno(5));
        }
        let dirty: Vec<u64> = std::mem::take(&mut self.fs.inodes[ino].dirty)
            .into_iter()
            .collect();
        let node = &mut self.fs.inodes[ino];
        node.disk.resize(node.cache.len(), 0);
        node.len_dirty = false;
        for p in dirty {
            if self.misdirect_one_in > 0 && self.rng.gen_ratio(1, self.misdirect_one_in) {
                self.misdirect(ino, p);
            } else {
                let node = &mut self.fs.inodes[ino];
                let n = node.disk.len();
                copy_page(&node.cache, &mut node.disk, p, n);
            }
        }
        let node = &mut self.fs.inodes[ino];
        node.promised = node.cache.clone();
        node.since_sync.clear();
        node.cut_since_sync = None;
        Ok(())
    }

    /// Page `p` of file `ino` lands on a page of a file drawn at random (inside its durable
    /// length); its own place keeps what it held.
    fn misdirect(&mut self, ino: usize, p: u64) {
        let targets: Vec<usize> = (0..self.fs.inodes.len())
            .filter(|&i| self.fs.inodes[i].disk.len() as u64 >= PAGE)
            .collect();
        if targets.is_empty() {
            return;
        }
        let t = targets[self.rng.gen_range(0..targets.len())];
        let tp = self
            .rng
            .gen_range(0..self.fs.inodes[t].disk.len() as u64 / PAGE);
        if (t, tp) == (ino, p) {
            return;
        }
        let mut page = vec![0u8; PAGE as usize];
        let src = &self.fs.inodes[ino].cache;
        for (i, b) in page.iter_mut().enumerate() {
            *b = src.get((p * PAGE) as usize + i).copied().unwrap_or(0);
        }
        let dst = &mut self.fs.inodes[t].disk;
        let start = (tp * PAGE) as usize;
        let end = (start + PAGE as usize).min(dst.len());
        dst[start..end].copy_from_slice(&page[..end - start]);
        self.counts[MISDIRECTED] += 1;
    }

    /// fsyncgate: each dirty page written, or dropped (cached or evicted).
    fn failed_sync(&mut self, ino: usize) {
        let dirty: Vec<u64> = std::mem::take(&mut self.fs.inodes[ino].dirty)
            .into_iter()
            .collect();
        if self.fs.inodes[ino].len_dirty && self.rng.gen_bool(0.5) {
            let node = &mut self.fs.inodes[ino];
            node.disk.resize(node.cache.len(), 0);
            node.len_dirty = false;
        }
        for p in dirty {
            let node = &mut self.fs.inodes[ino];
            let n = node.disk.len();
            match self.rng.gen_range(0..3) {
                0 => copy_page(&node.cache, &mut node.disk, p, n),
                1 => self.counts[DROPPED] += 1,
                _ if !self.evict => self.counts[DROPPED] += 1,
                _ => {
                    // Evicted: reads see what the disk holds (zeros where it has nothing).
                    let m = node.cache.len();
                    let disk = node.disk.clone();
                    copy_page(&disk, &mut node.cache, p, m);
                    self.counts[EVICTED] += 1;
                }
            }
        }
    }

    fn file(&self, path: &Path) -> io::Result<usize> {
        self.fs
            .names
            .get(path)
            .copied()
            .ok_or_else(|| io::ErrorKind::NotFound.into())
    }

    fn dir_op(&mut self, op: DirOp) {
        apply(&mut self.fs.names, &op);
        self.fs.pending.push(op);
    }
}

impl SimDisk {
    /// An empty disk drawing its faults from `seed`.
    pub fn new(seed: u64) -> SimDisk {
        SimDisk(Arc::new(Mutex::new(State {
            fs: Fs::default(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            next_open: 0,
            outage: None,
            failed: [0; 10],
            counts: [0; DISK_FAULTS.len()],
            crash_in: None,
            snapshot: None,
            misdirect_one_in: MISDIRECT_ONE_IN,
            evict: true,
        })))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while the lock is held ends the run anyway.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One page written by a sync in `one_in` is misdirected (0: none;
    /// [`MISDIRECT_ONE_IN`] by default).
    pub fn set_misdirect_one_in(&self, one_in: u32) {
        self.state().misdirect_one_in = one_in;
    }

    /// Whether a failed sync may evict the pages it drops (they then read back as the disk
    /// holds them): losing unsynced writes while running, which `never` and `every_n` accept
    /// by design as they accept a power loss.
    pub fn set_evict(&self, evict: bool) {
        self.state().evict = evict;
    }

    /// Every operation of kind `op` fails (ENOSPC if `enospc`, else EIO) until it is set
    /// to `None`.
    pub fn set_outage(&self, outage: Option<(StorageOp, bool)>) {
        self.state().outage = outage;
    }

    /// Whether an outage is on.
    pub fn outage(&self) -> Option<(StorageOp, bool)> {
        self.state().outage
    }

    /// Operations failed by outages: `2 * op + enospc` ([`OUTAGE_OPS`]).
    pub fn failed(&self) -> [u64; 10] {
        self.state().failed
    }

    /// Disk faults injected, by kind ([`DISK_FAULTS`]).
    pub fn counts(&self) -> [u64; DISK_FAULTS.len()] {
        self.state().counts
    }

    /// The `n`th sync from now (0: the next) is interrupted by a crash.
    pub fn arm_crash(&self, n: u32) {
        self.state().crash_in = Some(n);
    }

    /// Takes back the disk to the moment a crash interrupted a sync, if one did; disarms.
    fn to_crash_point(s: &mut State) {
        s.crash_in = None;
        if let Some(fs) = s.snapshot.take() {
            s.fs = fs;
        }
        for n in &mut s.fs.inodes {
            n.lock = None;
        }
    }

    /// A process crash (kill -9): the page cache and pending directory operations stay
    /// (the kernel writes them later). If a crash interrupted a sync, the disk is as it was
    /// then.
    pub fn kill(&self) {
        Self::to_crash_point(&mut self.state());
    }

    /// The write that was under way when the process died got only up to byte `len` of the
    /// file at `path` into the page cache: a torn write (the volatile view is cut there).
    pub fn tear(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut s = self.state();
        let ino = s.file(path)?;
        let node = &mut s.fs.inodes[ino];
        if (node.cache.len() as u64) > len {
            node.cache.truncate(len as usize);
            node.len_dirty = true;
            node.cut_since_sync = Some(node.cut_since_sync.map_or(len, |c| c.min(len)));
            node.dirty.insert(len / PAGE);
        }
        Ok(())
    }

    /// A power loss: see the module doc. `lose_bytes`: the disk also loses that many bytes
    /// at the end of `lie_about` that a sync had made durable, and forgets it promised them
    /// (the simulator's own test of its checks).
    pub fn power_loss(&self, lie_about: Option<(&Path, u64)>) {
        let mut s = self.state();
        Self::to_crash_point(&mut s);
        let s = &mut *s;
        let keep = s.rng.gen_range(0..=s.fs.pending.len());
        if keep < s.fs.pending.len() {
            s.counts[DIR_LOST] += (s.fs.pending.len() - keep) as u64;
        }
        let mut names = s.fs.durable_names.clone();
        for op in &s.fs.pending[..keep] {
            apply(&mut names, op);
        }
        s.fs.durable_names = names.clone();
        s.fs.names = names;
        s.fs.pending.clear();
        for node in &mut s.fs.inodes {
            if node.len_dirty && s.rng.gen_bool(0.5) {
                node.disk.resize(node.cache.len(), 0);
            }
            let n = node.disk.len();
            for p in std::mem::take(&mut node.dirty) {
                let start = (p * PAGE) as usize;
                if start >= n {
                    continue;
                }
                let before = node.disk.clone();
                match s.rng.gen_range(0..3) {
                    0 => copy_page(&node.cache, &mut node.disk, p, n),
                    1 => {
                        let cut = start + s.rng.gen_range(0..PAGE as usize);
                        copy_page(&node.cache, &mut node.disk, p, cut.min(n));
                        if node.disk != before {
                            s.counts[TORN] += 1;
                        }
                    }
                    _ => {
                        let end = (start + PAGE as usize).min(n);
                        if node.cache.get(start..end) != Some(&node.disk[start..end]) {
                            s.counts[LOST] += 1;
                        }
                    }
                }
            }
            node.len_dirty = false;
            node.cache = node.disk.clone();
            node.lock = None;
        }
        if let Some((path, lose)) = lie_about {
            if let Some(&ino) = s.fs.names.get(path) {
                let node = &mut s.fs.inodes[ino];
                let l = node.disk.len().saturating_sub(lose as usize).max(8);
                node.disk.truncate(l);
                node.cache.truncate(l);
                node.promised.truncate(l);
            }
        }
    }

    /// The first byte of the file at `path` (as a restart sees it) that a successful sync
    /// promised and that is no longer what it promised (bytes written since are not
    /// promised), if any.
    pub fn broken_promise(&self, path: &Path) -> Option<u64> {
        self.broken_promise_in(path, 0, u64::MAX)
    }

    /// [`SimDisk::broken_promise`] over bytes `from..to` only.
    pub fn broken_promise_in(&self, path: &Path, from: u64, to: u64) -> Option<u64> {
        let s = self.state();
        let ino = *s.fs.names.get(path)?;
        let node = &s.fs.inodes[ino];
        let upto = node
            .promised
            .len()
            .min(node.cut_since_sync.map_or(usize::MAX, |c| c as usize))
            .min(usize::try_from(to).unwrap_or(usize::MAX));
        (usize::try_from(from).unwrap_or(usize::MAX).min(upto)..upto)
            .find(|&i| {
                !node.since_sync.get(i).copied().unwrap_or(false)
                    && node.cache.get(i) != Some(&node.promised[i])
            })
            .map(|i| i as u64)
    }

    /// Bytes the last successful sync of the file at `path` promised.
    pub fn promised_len(&self, path: &Path) -> u64 {
        let s = self.state();
        s.fs.names
            .get(path)
            .map_or(0, |&i| s.fs.inodes[i].promised.len() as u64)
    }

    // ---- damage at rest and the simulator's look at the files (both views) ----

    /// The length of the file at `path` as the running system sees it (0 if missing).
    pub fn len(&self, path: &Path) -> u64 {
        let s = self.state();
        s.file(path)
            .map_or(0, |i| s.fs.inodes[i].cache.len() as u64)
    }

    /// Whether `path` names a file.
    pub fn exists(&self, path: &Path) -> bool {
        self.state().file(path).is_ok()
    }

    /// The file's identity, if `path` names one.
    pub fn id(&self, path: &Path) -> Option<usize> {
        self.state().file(path).ok()
    }

    fn damage(&self, path: &Path, at: u64, bytes: &[u8]) -> io::Result<()> {
        let mut s = self.state();
        let ino = s.file(path)?;
        let node = &mut s.fs.inodes[ino];
        for view in [&mut node.cache, &mut node.disk] {
            for (i, b) in bytes.iter().enumerate() {
                if let Some(x) = view.get_mut(at as usize + i) {
                    *x = *b;
                }
            }
        }
        Ok(())
    }

    fn read(&self, path: &Path, from: u64, to: u64) -> io::Result<Vec<u8>> {
        let s = self.state();
        let ino = s.file(path)?;
        let c = &s.fs.inodes[ino].cache;
        Ok(c[(from as usize).min(c.len())..(to as usize).min(c.len())].to_vec())
    }

    /// Zeroes the sector holding a byte drawn in `[from, to)`, clipped to that range
    /// (`false` if those bytes were all zero already: no damage).
    pub fn zero_sector(
        &self,
        path: &Path,
        from: u64,
        to: u64,
        rng: &mut ChaCha8Rng,
    ) -> io::Result<bool> {
        let at = rng.gen_range(from..to);
        let start = (at / SECTOR * SECTOR).max(from);
        let end = ((at / SECTOR + 1) * SECTOR).min(to);
        let buf = self.read(path, start, end)?;
        if buf.iter().all(|b| *b == 0) {
            return Ok(false);
        }
        self.damage(path, start, &vec![0u8; buf.len()])?;
        Ok(true)
    }

    /// Flips bits of one byte drawn in `[from, to)`; returns its offset.
    pub fn corrupt_byte(
        &self,
        path: &Path,
        from: u64,
        to: u64,
        rng: &mut ChaCha8Rng,
    ) -> io::Result<u64> {
        let at = rng.gen_range(from..to);
        let b = self.read(path, at, at + 1)?;
        let x = b.first().copied().unwrap_or(0) ^ rng.gen_range(1..=255u8);
        self.damage(path, at, &[x])?;
        Ok(at)
    }

    /// Cuts the file to `len` bytes, in both views.
    pub fn cut(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut s = self.state();
        let ino = s.file(path)?;
        let node = &mut s.fs.inodes[ino];
        node.cache.truncate(len as usize);
        node.disk.truncate(len as usize);
        Ok(())
    }

    /// Removes the name, in both views.
    pub fn remove_now(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.file(path)?;
        s.fs.names.remove(path);
        s.fs.durable_names.remove(path);
        s.fs.pending.retain(|op| match op {
            DirOp::Link(p, _) => p != path,
            _ => true,
        });
        Ok(())
    }

    /// Renames, in both views.
    pub fn rename_now(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        let ino = s.file(from)?;
        s.fs.names.remove(from);
        s.fs.names.insert(to.to_owned(), ino);
        s.fs.durable_names.remove(from);
        s.fs.durable_names.insert(to.to_owned(), ino);
        Ok(())
    }
}

impl Storage for SimDisk {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Box<dyn StorageFile>> {
        let mut s = self.state();
        let found = s.file(path).ok();
        let ino = match (found, mode) {
            (Some(_), OpenMode::CreateNew) => return Err(io::ErrorKind::AlreadyExists.into()),
            (Some(i), OpenMode::CreateTruncate) => {
                let node = &mut s.fs.inodes[i];
                if !node.cache.is_empty() {
                    node.cache.clear();
                    node.len_dirty = true;
                    node.cut_since_sync = Some(0);
                }
                i
            }
            (Some(i), _) => i,
            (None, OpenMode::Read | OpenMode::ReadWrite) => {
                return Err(io::ErrorKind::NotFound.into())
            }
            (None, _) => {
                s.fs.inodes.push(Inode::default());
                let i = s.fs.inodes.len() - 1;
                s.dir_op(DirOp::Link(path.to_owned(), i));
                i
            }
        };
        s.next_open += 1;
        let open = s.next_open;
        Ok(Box::new(SimFile {
            disk: self.clone(),
            ino,
            open,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fail(StorageOp::Rename)?;
        s.file(from)?;
        s.dir_op(DirOp::Rename(from.to_owned(), to.to_owned()));
        Ok(())
    }

    fn hard_link(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.fail(StorageOp::Link)?;
        let ino = s.file(from)?;
        if s.file(to).is_ok() {
            return Err(io::ErrorKind::AlreadyExists.into());
        }
        s.dir_op(DirOp::Link(to.to_owned(), ino));
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut s = self.state();
        s.file(path)?;
        s.dir_op(DirOp::Remove(path.to_owned()));
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> io::Result<()> {
        let mut s = self.state();
        if s.crashed() {
            return Err(errno(5));
        }
        s.fail(StorageOp::DirSync)?;
        let s = &mut *s;
        for op in s.fs.pending.drain(..) {
            apply(&mut s.fs.durable_names, &op);
        }
        Ok(())
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(OsString, FileId)>> {
        let s = self.state();
        Ok(s.fs
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, &i)| Some((p.file_name()?.to_owned(), (0, i as u64))))
            .collect())
    }

    fn file_id(&self, path: &Path) -> io::Result<FileId> {
        Ok((0, self.state().file(path)? as u64))
    }

    fn create_dir_all(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
}

impl StorageFile for SimFile {
    fn read_at(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        let s = self.disk.state();
        let c = &s.fs.inodes[self.ino].cache;
        let at = (at as usize).min(c.len());
        let n = buf.len().min(c.len() - at);
        buf[..n].copy_from_slice(&c[at..at + n]);
        Ok(n)
    }

    fn write_at(&self, buf: &[u8], at: u64) -> io::Result<usize> {
        let mut s = self.disk.state();
        if s.snapshot.is_some() {
            return Err(errno(5));
        }
        let (n, err) = match s.fail(StorageOp::Write) {
            Ok(()) => (buf.len(), None),
            Err(e) => {
                let k = s.rng.gen_range(0..=buf.len());
                if k > 0 {
                    s.counts[SHORT] += 1;
                }
                (k, Some(e))
            }
        };
        let node = &mut s.fs.inodes[self.ino];
        let (a, end) = (at as usize, at as usize + n);
        if node.cache.len() < end {
            node.cache.resize(end, 0);
            node.len_dirty = true;
        }
        node.cache[a..end].copy_from_slice(&buf[..n]);
        if n > 0 {
            for p in pages(at, n as u64) {
                node.dirty.insert(p);
            }
            mark(&mut node.since_sync, a, end);
        }
        match err {
            None => Ok(n),
            Some(e) => Err(e),
        }
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.disk.state().fs.inodes[self.ino].cache.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut s = self.disk.state();
        if s.snapshot.is_some() {
            return Err(errno(5));
        }
        let node = &mut s.fs.inodes[self.ino];
        if node.cache.len() as u64 != len {
            let from = len.min(node.cache.len() as u64);
            node.cache.resize(len as usize, 0);
            node.len_dirty = true;
            node.cut_since_sync = Some(node.cut_since_sync.map_or(from, |c| c.min(from)));
            node.dirty.insert(from / PAGE);
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        self.disk.state().sync(self.ino)
    }

    fn sync_all(&self) -> io::Result<()> {
        self.disk.state().sync(self.ino)
    }

    fn try_lock(&self) -> io::Result<bool> {
        let mut s = self.disk.state();
        let node = &mut s.fs.inodes[self.ino];
        match node.lock {
            Some(o) if o != self.open => Ok(false),
            _ => {
                node.lock = Some(self.open);
                Ok(true)
            }
        }
    }

    fn reserve(&self, _at: u64, _len: u64) -> io::Result<()> {
        let mut s = self.disk.state();
        s.fail(StorageOp::Write)
    }

    fn id(&self) -> io::Result<FileId> {
        Ok((0, self.ino as u64))
    }
}

impl Drop for SimFile {
    fn drop(&mut self) {
        let mut s = self.disk.state();
        if let Some(node) = s.fs.inodes.get_mut(self.ino) {
            if node.lock == Some(self.open) {
                node.lock = None;
            }
        }
    }
}

/// Damages an archived segment `PATH.N`, at one restart in twelve where archives exist, in
/// a way the start must refuse (the archives are checked against the segment after each at
/// open): one cut short (its length is not the length it was sealed at), one missing that
/// is not the oldest (a gap; the oldest may have been pruned by an operator), or two swapped
/// (reordered). Returns what was done.
pub fn damage_archive(
    disk: &SimDisk,
    path: &Path,
    rng: &mut ChaCha8Rng,
) -> io::Result<Option<String>> {
    if !rng.gen_bool(1.0 / 12.0) {
        return Ok(None);
    }
    let name = |n: u64| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    // A rotation whose rename failed leaves the current file linked as `PATH.N` too: that
    // name is not an archive (removing it loses nothing; cutting it cuts the current
    // segment), so it is left out, as the journal leaves it out.
    let current = disk.id(path);
    let nums: Vec<u64> = (1..)
        .take_while(|&n| disk.exists(&name(n)))
        .filter(|&n| current.is_none() || disk.id(&name(n)) != current)
        .collect();
    let Some(&newest) = nums.last() else {
        return Ok(None);
    };
    let what = match rng.gen_range(0..3) {
        0 => {
            let n = rng.gen_range(1..=newest);
            let l = disk.len(&name(n));
            if l <= crate::journal::HEADER_LEN {
                return Ok(None);
            }
            let to = rng.gen_range(crate::journal::HEADER_LEN..l);
            disk.cut(&name(n), to)?;
            format!("archived segment {n} cut from {l} to {to} bytes")
        }
        1 if newest >= 2 => {
            let n = rng.gen_range(2..=newest);
            disk.remove_now(&name(n))?;
            format!("archived segment {n} missing (not the oldest)")
        }
        2 if newest >= 2 => {
            let n = rng.gen_range(2..=newest);
            let tmp = name(0);
            disk.rename_now(&name(n), &tmp)?;
            disk.rename_now(&name(n - 1), &name(n))?;
            disk.rename_now(&tmp, &name(n - 1))?;
            format!("archived segments {} and {n} swapped", n - 1)
        }
        _ => return Ok(None),
    };
    Ok(Some(what))
}

/// Damage inside an archived segment's records (a zeroed sector or a corrupt byte past its
/// header), at one restart in twelve where archives exist: the start does not read them
/// (the current segment's checkpoint holds the day) and must accept. Returns what was done.
pub fn damage_archive_records(
    disk: &SimDisk,
    path: &Path,
    rng: &mut ChaCha8Rng,
) -> io::Result<Option<String>> {
    if !rng.gen_bool(1.0 / 12.0) {
        return Ok(None);
    }
    let current = disk.id(path);
    let name = |n: u64| {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        PathBuf::from(p)
    };
    let nums: Vec<u64> = (1..)
        .take_while(|&n| disk.exists(&name(n)))
        .filter(|&n| current.is_none() || disk.id(&name(n)) != current)
        .collect();
    if nums.is_empty() {
        return Ok(None);
    }
    let n = nums[rng.gen_range(0..nums.len())];
    let l = disk.len(&name(n));
    let h = crate::journal::HEADER_LEN;
    if l <= h {
        return Ok(None);
    }
    if rng.gen_bool(0.5) {
        if disk.zero_sector(&name(n), h, l, rng)? {
            return Ok(Some(format!("a zeroed sector in archived segment {n}")));
        }
        Ok(None)
    } else {
        let at = disk.corrupt_byte(&name(n), h, l, rng)?;
        Ok(Some(format!(
            "a corrupt byte at {at} of archived segment {n}"
        )))
    }
}

/// The oracle for archived segments (`PATH.N`, as a restart sees the names, leaving out a
/// name of the current file): a header whose promised bytes changed (a misdirected page
/// write that landed on its first page, visible once a power loss drops the page cache).
///
/// An archive was fully synced before its rotation (the seal's superblock claims its whole
/// length, fdatasync'ed before the rename), so every byte of it is inside the durable
/// extent, and the start reads its header to check the chain of segments. Its magic
/// changed, or both superblock copies changed: damage inside the durable extent that the
/// start must refuse, naming the file (simulator seed 497354: the oracle looked at the
/// current file's promises only and called the journal's correct refusal of such an archive
/// a refusal of damage past the durable point). Other header bytes changed (one copy, or
/// bytes no check covers): the start may refuse or accept. Changed records of an archive
/// are not read by the start, which must accept them ([`damage_archive_records`]).
pub fn archive_header_damage(disk: &SimDisk, path: &Path) -> Option<Damage> {
    use crate::journal::HEADER_LEN;
    /// The magic, then the two superblock copies' slots (`journal`'s SLOTS: 64 and 512).
    const MAGIC: (u64, u64) = (0, 8);
    const COPIES: [(u64, u64); 2] = [(64, 512), (512, HEADER_LEN)];
    let current = disk.id(path);
    let mut found: Option<Damage> = None;
    for n in 1.. {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{n}"));
        let archive = PathBuf::from(p);
        if !disk.exists(&archive) {
            break;
        }
        if current.is_some() && disk.id(&archive) == current {
            continue;
        }
        let Some(at) = disk.broken_promise_in(&archive, 0, HEADER_LEN) else {
            continue;
        };
        let gone = |(a, b): (u64, u64)| disk.broken_promise_in(&archive, a, b).is_some();
        if gone(MAGIC) || COPIES.iter().all(|&c| gone(c)) {
            return Some(Damage::MustRefuse(format!(
                "archived segment {n}'s header overwritten from byte {at} (a misdirected \
                 write), inside its durable extent"
            )));
        }
        found.get_or_insert(Damage::MayRefuse(format!(
            "archived segment {n}'s header changed at byte {at}, one superblock copy left"
        )));
    }
    found
}
