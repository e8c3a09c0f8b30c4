//! Shared-memory counters: a memory-mapped file per process that other processes read live.
//!
//! This module owns the counters file format, the writer ([`CountersFile`]), the in-process
//! variant without a file ([`LocalCounters`]), the reader ([`CountersReader`]) and, in
//! [`stat`] and [`hw`], what `rocebus stat` needs to show them. It must not touch the data
//! path: components hold [`Counter`] handles and bump them, nothing more.
//!
//! The design follows Aeron's CnC counters and `AeronStat`: the hot path does one plain
//! load and one plain store into the mapping (no lock, no syscall, no locked instruction),
//! and any process that can read the file can show the values while the writer runs.
//!
//! # File format (version 1)
//!
//! Native byte order (the file is shared between processes on one host, never sent).
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `b"RBCNTRS\0"`, stored last with Release: a reader that sees it sees the rest |
//! | 8 | 4 | version (1) |
//! | 12 | 4 | header size (128) |
//! | 16 | 4 | record size (128) |
//! | 20 | 4 | capacity: number of records after the header |
//! | 24 | 4 | pid of the writer |
//! | 28 | 4 | allocation cursor (number of records handed out so far, may exceed capacity) |
//! | 32 | 8 | start time, nanoseconds since the Unix epoch |
//! | 40 | 4 | component name length |
//! | 48 | 64 | component name, UTF-8 (the file stem) |
//!
//! Then `capacity` records of 128 bytes each, one per counter, so two counters never share a
//! cache line pair (x86_64 prefetches lines in pairs; crossbeam's `CachePadded` explains):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | value |
//! | 8 | 4 | state: 0 free, 1 allocated (stored with Release after kind, type id and label) |
//! | 12 | 4 | kind: 0 counter (only goes up), 1 gauge |
//! | 16 | 4 | type id, free for the component to use |
//! | 20 | 4 | label length |
//! | 24 | 104 | label, UTF-8 |
//!
//! Every field is accessed through atomics, by the writer and by readers, so concurrent
//! access from several processes is defined behaviour; a reader validates everything it reads
//! from the file (sizes, lengths, UTF-8) and reports a corrupt or truncated file as
//! [`CountersError`], never as a panic.
//!
//! One hazard of every shared mapping remains: if some other program truncates the file while
//! it is mapped, touching the lost pages raises `SIGBUS`. The writer here never truncates a
//! live file: [`CountersFile::create`] unlinks an old file and creates a new one, so readers
//! that still map the old one keep valid (stale) memory.
//!
//! # Example
//!
//! ```no_run
//! use rocebus::counters::{counters_path, default_dir, CountersFile, CountersReader};
//!
//! # fn main() -> Result<(), rocebus::counters::CountersError> {
//! let path = counters_path(&default_dir(), "feed-handler");
//! let file = CountersFile::create(&path, 64)?;
//! let received = file.allocate("messages received")?;
//! received.inc(); // hot path: one load and one store, no lock, no syscall
//!
//! // In another process:
//! let reader = CountersReader::open(&path)?;
//! for entry in reader.iter() {
//!     println!("{}: {}", entry.label, entry.value);
//! }
//! # Ok(())
//! # }
//! ```
#![allow(unsafe_code)] // the mapping and the atomics over it; each block argues its case.

pub mod hw;
pub mod stat;

use std::fs::{File, OpenOptions};
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use arrayvec::ArrayString;
use memmap2::{Mmap, MmapMut};

/// First 8 bytes of every counters file.
pub const MAGIC: u64 = u64::from_ne_bytes(*b"RBCNTRS\0");
/// Version of the file format this code writes and reads.
pub const VERSION: u32 = 1;
/// Size of the file header in bytes.
pub const HEADER_SIZE: usize = 128;
/// Size of one counter record in bytes.
pub const RECORD_SIZE: usize = 128;
/// Longest label a counter can have, in bytes.
pub const MAX_LABEL_LEN: usize = 104;
/// Longest component name, in bytes.
pub const MAX_COMPONENT_LEN: usize = 64;
/// Largest capacity accepted, by the writer and from a file (caps the mapping at 128 MiB).
pub const MAX_CAPACITY: u32 = 1 << 20;
/// Extension of counters files in the counters directory.
pub const FILE_EXTENSION: &str = "counters";
/// Environment variable naming the counters directory.
pub const DIR_ENV: &str = "ROCEBUS_DIR";
/// Counters directory used when [`DIR_ENV`] is unset: tmpfs, so updates never reach a disk.
pub const DEFAULT_DIR: &str = "/dev/shm/rocebus";

const STATE_FREE: u32 = 0;
const STATE_ALLOCATED: u32 = 1;

/// What a counter measures, which decides how it is exported (Prometheus `counter` or `gauge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// Only goes up (messages, bytes, gaps); rates are meaningful.
    Counter,
    /// Goes up and down (queue depth, receive-queue low water).
    Gauge,
}

impl Kind {
    fn to_raw(self) -> u32 {
        match self {
            Kind::Counter => 0,
            Kind::Gauge => 1,
        }
    }

    fn from_raw(raw: u32) -> Option<Kind> {
        match raw {
            0 => Some(Kind::Counter),
            1 => Some(Kind::Gauge),
            _ => None,
        }
    }
}

/// Errors from creating, allocating in, or reading a counters file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CountersError {
    /// Creating the file (or its directory) failed.
    #[error("cannot create counters file {path}")]
    Create {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Opening or mapping an existing file failed.
    #[error("cannot open counters file {path}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is shorter than its header says (or than a header).
    #[error("counters file {path} is truncated: {len} bytes, needs {needed}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length its header implies.
        needed: u64,
    },
    /// The file does not start with [`MAGIC`] (not a counters file, or not yet initialised).
    #[error("{path} is not a counters file (bad magic {found:#018x}), or its writer has not finished creating it")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The first 8 bytes.
        found: u64,
    },
    /// The file was written by a different format version.
    #[error("counters file {path} has format version {found}, this build reads version {VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// The version in the file.
        found: u32,
    },
    /// A header field holds a value this version never writes.
    #[error("counters file {path} is corrupt: {what}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Which field is wrong, and how.
        what: String,
    },
    /// Capacity out of range for [`CountersFile::create`] or [`LocalCounters::new`].
    #[error("counters capacity {0} out of range 1..={MAX_CAPACITY}")]
    Capacity(u32),
    /// Component name (the file stem) longer than [`MAX_COMPONENT_LEN`] or not UTF-8.
    #[error("component name {0:?} must be valid UTF-8 of at most {MAX_COMPONENT_LEN} bytes")]
    Component(String),
    /// Every record is in use.
    #[error("all {capacity} counters are allocated; cannot allocate {label:?}")]
    Full {
        /// The table's capacity.
        capacity: u32,
        /// The label that did not fit.
        label: String,
    },
    /// Label longer than [`MAX_LABEL_LEN`] bytes.
    #[error("counter label {label:?} is {len} bytes, at most {MAX_LABEL_LEN} allowed")]
    LabelTooLong {
        /// The label.
        label: String,
        /// Its length in bytes.
        len: usize,
    },
}

/// The file header, every field an atomic so that several processes may share it.
#[repr(C, align(128))]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    header_size: AtomicU32,
    record_size: AtomicU32,
    capacity: AtomicU32,
    pid: AtomicU32,
    cursor: AtomicU32,
    start_unix_ns: AtomicU64,
    component_len: AtomicU32,
    _reserved0: AtomicU32,
    component: [AtomicU8; MAX_COMPONENT_LEN],
    _reserved1: [AtomicU64; 2],
}

/// One counter record; 128-byte aligned so no two counters share a prefetched line pair.
#[repr(C, align(128))]
struct Record {
    value: AtomicU64,
    state: AtomicU32,
    kind: AtomicU32,
    type_id: AtomicU32,
    label_len: AtomicU32,
    label: [AtomicU8; MAX_LABEL_LEN],
}

const _: () = assert!(size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(size_of::<Record>() == RECORD_SIZE);
const _: () = assert!(align_of::<Record>() == RECORD_SIZE);
const _: () = assert!(std::mem::offset_of!(Header, component) == 48);
const _: () = assert!(std::mem::offset_of!(Record, label) == 24);

impl Header {
    fn zeroed() -> Header {
        Header {
            magic: AtomicU64::new(0),
            version: AtomicU32::new(0),
            header_size: AtomicU32::new(0),
            record_size: AtomicU32::new(0),
            capacity: AtomicU32::new(0),
            pid: AtomicU32::new(0),
            cursor: AtomicU32::new(0),
            start_unix_ns: AtomicU64::new(0),
            component_len: AtomicU32::new(0),
            _reserved0: AtomicU32::new(0),
            component: [const { AtomicU8::new(0) }; MAX_COMPONENT_LEN],
            _reserved1: [const { AtomicU64::new(0) }; 2],
        }
    }

    /// Fills in a zeroed header; the magic goes last, with Release.
    fn init(&self, component: &str, capacity: u32) {
        // ORDERING (all Relaxed stores below): published by the Release store of `magic`.
        self.version.store(VERSION, Ordering::Relaxed);
        self.header_size
            .store(HEADER_SIZE as u32, Ordering::Relaxed);
        self.record_size
            .store(RECORD_SIZE as u32, Ordering::Relaxed);
        self.capacity.store(capacity, Ordering::Relaxed);
        self.pid.store(std::process::id(), Ordering::Relaxed);
        self.start_unix_ns.store(unix_now_ns(), Ordering::Relaxed);
        store_bytes(&self.component, component.as_bytes());
        self.component_len
            .store(component.len() as u32, Ordering::Relaxed);
        // ORDERING: Release, pairs with the Acquire load of `magic` in
        // `CountersReader::open`: a reader that sees the magic sees every field above.
        self.magic.store(MAGIC, Ordering::Release);
    }
}

impl Record {
    fn zeroed() -> Record {
        Record {
            value: AtomicU64::new(0),
            state: AtomicU32::new(STATE_FREE),
            kind: AtomicU32::new(0),
            type_id: AtomicU32::new(0),
            label_len: AtomicU32::new(0),
            label: [const { AtomicU8::new(0) }; MAX_LABEL_LEN],
        }
    }
}

fn unix_now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn store_bytes(dst: &[AtomicU8], src: &[u8]) {
    for (d, s) in dst.iter().zip(src) {
        // ORDERING: Relaxed; the caller publishes these bytes with a later Release store.
        d.store(*s, Ordering::Relaxed);
    }
}

/// Reads `len` bytes (clamped to the field) into a string; invalid UTF-8 becomes U+FFFD.
fn load_str<const N: usize>(src: &[AtomicU8], len: u32) -> ArrayString<N> {
    let mut bytes = [0u8; N];
    let len = (len as usize).min(src.len()).min(N);
    for (d, s) in bytes.iter_mut().zip(&src[..len]) {
        // ORDERING: Relaxed; the caller has done the Acquire load that publishes these bytes.
        *d = s.load(Ordering::Relaxed);
    }
    let mut out = ArrayString::new();
    for chunk in bytes[..len].utf8_chunks() {
        for c in chunk.valid().chars() {
            if out.try_push(c).is_err() {
                return out;
            }
        }
        if !chunk.invalid().is_empty() && out.try_push('\u{FFFD}').is_err() {
            return out;
        }
    }
    out
}

/// Where a table's header and records live.
enum Backing {
    /// A shared file mapping; `header()` and `records()` point into it.
    Mapped(MmapMut),
    /// Plain memory, for [`LocalCounters`].
    Local(Box<Header>, Box<[Record]>),
}

/// A header and its records, shared by the owner and every [`Counter`] handle.
struct Table {
    backing: Backing,
    capacity: u32,
}

impl Table {
    fn header(&self) -> &Header {
        match &self.backing {
            // SAFETY: `CountersFile::create` made the mapping `HEADER_SIZE + capacity *
            // RECORD_SIZE` bytes long and mmap returns page-aligned memory, so the first 128
            // bytes are in bounds and aligned for `Header`; every field is an atomic, for
            // which any bit pattern is valid and shared mutation is allowed; the borrow of
            // `self` keeps the mapping alive.
            Backing::Mapped(map) => unsafe { &*map.as_ptr().cast::<Header>() },
            Backing::Local(header, _) => header,
        }
    }

    fn records(&self) -> &[Record] {
        match &self.backing {
            // SAFETY: the records start at `HEADER_SIZE` (128) from a page-aligned base, so
            // they are aligned for `Record`; `capacity` records fit in the mapping by its
            // construction in `CountersFile::create`; all fields are atomics (any bit pattern
            // valid, shared mutation allowed); the borrow of `self` keeps the mapping alive.
            Backing::Mapped(map) => unsafe {
                std::slice::from_raw_parts(
                    map.as_ptr().add(HEADER_SIZE).cast::<Record>(),
                    self.capacity as usize,
                )
            },
            Backing::Local(_, records) => records,
        }
    }

    fn allocate(
        self: &Arc<Self>,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        if label.len() > MAX_LABEL_LEN {
            return Err(CountersError::LabelTooLong {
                label: label.to_owned(),
                len: label.len(),
            });
        }
        // ORDERING: Relaxed; the cursor only hands out distinct indices (the RMW is atomic
        // whatever the ordering); publication of the record is by its own `state` below.
        let index = self.header().cursor.fetch_add(1, Ordering::Relaxed);
        let Some(record) = self.records().get(index as usize) else {
            return Err(CountersError::Full {
                capacity: self.capacity,
                label: label.to_owned(),
            });
        };
        // ORDERING (Relaxed stores): published by the Release store of `state` below.
        record.value.store(0, Ordering::Relaxed);
        record.kind.store(kind.to_raw(), Ordering::Relaxed);
        record.type_id.store(type_id, Ordering::Relaxed);
        store_bytes(&record.label, label.as_bytes());
        record
            .label_len
            .store(label.len() as u32, Ordering::Relaxed);
        // ORDERING: Release, pairs with the Acquire load of `state` in `entry()`: a reader
        // that sees the record allocated sees its kind, type id and whole label.
        record.state.store(STATE_ALLOCATED, Ordering::Release);
        Ok(Counter {
            value: NonNull::from(&record.value),
            _table: Arc::clone(self),
            _not_sync: PhantomData,
        })
    }
}

/// Reads record `index` if it is allocated.
fn entry(index: u32, record: &Record) -> Option<CounterEntry> {
    // ORDERING: Acquire, pairs with the Release store of `state` in `Table::allocate`.
    if record.state.load(Ordering::Acquire) != STATE_ALLOCATED {
        return None;
    }
    // ORDERING (Relaxed loads): the label fields were published by the Acquire above and are
    // never written again; the value is a single word, any recent value will do.
    let kind_raw = record.kind.load(Ordering::Relaxed);
    Some(CounterEntry {
        id: index,
        kind: Kind::from_raw(kind_raw).unwrap_or(Kind::Counter),
        type_id: record.type_id.load(Ordering::Relaxed),
        label: load_str(&record.label, record.label_len.load(Ordering::Relaxed)),
        value: record.value.load(Ordering::Relaxed),
    })
}

/// A handle to one counter, for the one thread that updates it.
///
/// Updates are a plain load and a plain store (`Relaxed`), not a locked read-modify-write:
/// the handle is not `Clone` and not `Sync`, so only one thread at a time can update a given
/// counter, and the load-then-store cannot lose another writer's increment. Give each
/// thread its own counter (and add them up when reading) rather than sharing one.
///
/// `Relaxed` is enough because a counter publishes nothing but its own value: readers need a
/// recent, untorn 64-bit word, which any atomic load gives; no other memory is read on the
/// strength of a counter's value.
#[derive(Debug)]
pub struct Counter {
    value: NonNull<AtomicU64>,
    _table: Arc<Table>,
    /// `NonNull` already makes this `!Sync`; the marker says it is on purpose.
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

// SAFETY: `value` points at an `AtomicU64` inside the table that `_table` keeps alive for
// the life of the handle, and atomics may be accessed from any thread; the handle stays
// `!Sync`, so moving it to another thread still leaves one updating thread.
unsafe impl Send for Counter {}

impl Counter {
    fn atomic(&self) -> &AtomicU64 {
        // SAFETY: `value` was made from a reference into the table's records, and `_table`
        // keeps that memory (mapping or boxed slice) alive and unmoved as long as `self`.
        unsafe { self.value.as_ref() }
    }

    /// Adds one.
    #[inline]
    pub fn inc(&self) {
        self.add(1);
    }

    /// Adds `n` (wrapping at 2^64).
    #[inline]
    pub fn add(&self, n: u64) {
        let v = self.atomic();
        // ORDERING: Relaxed load and store; single writer (see the type doc), and nothing is
        // published through a counter's value.
        v.store(v.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Sets the value (for gauges).
    #[inline]
    pub fn set(&self, value: u64) {
        // ORDERING: Relaxed; as in `add`.
        self.atomic().store(value, Ordering::Relaxed);
    }

    /// Stores `value` if it is lower than the current one (a low-water mark).
    #[inline]
    pub fn set_min(&self, value: u64) {
        let v = self.atomic();
        // ORDERING: Relaxed; as in `add`.
        if value < v.load(Ordering::Relaxed) {
            v.store(value, Ordering::Relaxed);
        }
    }

    /// Current value.
    #[inline]
    pub fn get(&self) -> u64 {
        // ORDERING: Relaxed; as in `add`.
        self.atomic().load(Ordering::Relaxed)
    }
}

/// One allocated counter as read by a reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterEntry {
    /// Record index in the file, stable for the life of the writer.
    pub id: u32,
    /// Counter or gauge.
    pub kind: Kind,
    /// The component's own type id.
    pub type_id: u32,
    /// The label (invalid UTF-8 in the file shows as U+FFFD).
    pub label: ArrayString<MAX_LABEL_LEN>,
    /// The value when it was read.
    pub value: u64,
}

/// Path of a component's counters file: `DIR/COMPONENT.counters`.
pub fn counters_path(dir: &Path, component: &str) -> PathBuf {
    dir.join(format!("{component}.{FILE_EXTENSION}"))
}

/// The counters directory: `$ROCEBUS_DIR` if set and not empty, else `/dev/shm/rocebus`.
pub fn default_dir() -> PathBuf {
    match std::env::var_os(DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(DEFAULT_DIR),
    }
}

fn check_capacity(capacity: u32) -> Result<(), CountersError> {
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(CountersError::Capacity(capacity));
    }
    Ok(())
}

fn file_len(capacity: u32) -> u64 {
    HEADER_SIZE as u64 + u64::from(capacity) * RECORD_SIZE as u64
}

/// The writer side: a counters file owned by this process.
///
/// Cheap to share (`Arc` inside): clone it into each thread that allocates counters.
/// Records are never freed or reused (a dropped [`Counter`] keeps its slot and last value):
/// allocate at start-up, not per connection or per message.
/// The file stays after the process exits, so `rocebus stat` can show final values; the
/// next [`create`](CountersFile::create) of the same path replaces it.
#[derive(Debug, Clone)]
pub struct CountersFile {
    table: Arc<Table>,
    path: PathBuf,
}

impl CountersFile {
    /// Creates (or replaces) the counters file at `path` with room for `capacity` counters.
    ///
    /// The component name recorded in the header is the file stem. Missing parent
    /// directories are created. An existing file is unlinked first, never truncated, so a
    /// reader mapping it keeps valid memory.
    pub fn create(path: impl AsRef<Path>, capacity: u32) -> Result<CountersFile, CountersError> {
        let path = path.as_ref();
        check_capacity(capacity)?;
        let component = path
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| s.len() <= MAX_COMPONENT_LEN)
            .ok_or_else(|| CountersError::Component(path.display().to_string()))?;
        let create_err = |source| CountersError::Create {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(create_err)?;
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(create_err(e)),
            _ => {}
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(create_err)?;
        file.set_len(file_len(capacity)).map_err(create_err)?;
        // SAFETY: we just created this file and gave it its final length; this module never
        // truncates it, and every access to the mapped bytes (here and in other processes
        // following the format) goes through atomics, so the mapping may change under us
        // without undefined behaviour.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(create_err)?;
        if (map.len() as u64) < file_len(capacity) {
            return Err(create_err(io::Error::other("mapping shorter than file")));
        }
        let table = Table {
            backing: Backing::Mapped(map),
            capacity,
        };
        table.header().init(component, capacity);
        Ok(CountersFile {
            table: Arc::new(table),
            path: path.to_owned(),
        })
    }

    /// Allocates a [`Kind::Counter`] with type id 0.
    pub fn allocate(&self, label: &str) -> Result<Counter, CountersError> {
        self.table.allocate(label, Kind::Counter, 0)
    }

    /// Allocates a counter of the given kind and type id.
    pub fn allocate_with(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        self.table.allocate(label, kind, type_id)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The allocated counters, as a reader in this process sees them.
    pub fn iter(&self) -> impl Iterator<Item = CounterEntry> + '_ {
        iter_records(self.table.records())
    }
}

/// Where counters can be allocated: a [`CountersFile`] or [`LocalCounters`], so that code
/// publishing counters (e.g. [`SubscriberCountersExport`](crate::mcast::io::SubscriberCountersExport))
/// works with either.
pub trait AllocateCounter {
    /// Allocates a counter of the given kind and type id.
    fn allocate_counter(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError>;
}

impl AllocateCounter for CountersFile {
    fn allocate_counter(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        self.table.allocate(label, kind, type_id)
    }
}

impl AllocateCounter for LocalCounters {
    fn allocate_counter(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        self.table.allocate(label, kind, type_id)
    }
}

fn iter_records(records: &[Record]) -> impl Iterator<Item = CounterEntry> + '_ {
    (0u32..).zip(records).filter_map(|(i, r)| entry(i, r))
}

/// Counters in plain memory, with the same [`Counter`] handles as a file: for tests and for
/// code run without a counters directory.
#[derive(Debug, Clone)]
pub struct LocalCounters {
    table: Arc<Table>,
}

impl LocalCounters {
    /// Room for `capacity` counters.
    pub fn new(capacity: u32) -> Result<LocalCounters, CountersError> {
        check_capacity(capacity)?;
        let header = Box::new(Header::zeroed());
        let records: Box<[Record]> = (0..capacity).map(|_| Record::zeroed()).collect();
        let table = Table {
            backing: Backing::Local(header, records),
            capacity,
        };
        table.header().init("local", capacity);
        Ok(LocalCounters {
            table: Arc::new(table),
        })
    }

    /// Allocates a [`Kind::Counter`] with type id 0.
    pub fn allocate(&self, label: &str) -> Result<Counter, CountersError> {
        self.table.allocate(label, Kind::Counter, 0)
    }

    /// Allocates a counter of the given kind and type id.
    pub fn allocate_with(
        &self,
        label: &str,
        kind: Kind,
        type_id: u32,
    ) -> Result<Counter, CountersError> {
        self.table.allocate(label, kind, type_id)
    }

    /// The allocated counters.
    pub fn iter(&self) -> impl Iterator<Item = CounterEntry> + '_ {
        iter_records(self.table.records())
    }
}

/// Header fields of a counters file, as validated by [`CountersReader::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Component name (the writer's file stem).
    pub component: ArrayString<MAX_COMPONENT_LEN>,
    /// Pid of the writer.
    pub pid: u32,
    /// Writer start time, nanoseconds since the Unix epoch.
    pub start_unix_ns: u64,
    /// Number of records.
    pub capacity: u32,
}

/// Read-only view of another process's counters file.
#[derive(Debug)]
pub struct CountersReader {
    map: Mmap,
    info: FileInfo,
    path: PathBuf,
}

impl CountersReader {
    /// Maps `path` read-only and validates its header.
    ///
    /// Nothing in the file is trusted: a short file, a wrong magic, version or size, or a
    /// capacity the file cannot hold is an error.
    pub fn open(path: impl AsRef<Path>) -> Result<CountersReader, CountersError> {
        let path = path.as_ref().to_owned();
        let open_err = |source| CountersError::Open {
            path: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(open_err)?;
        let len = file.metadata().map_err(open_err)?.len();
        if len < HEADER_SIZE as u64 {
            return Err(CountersError::Truncated {
                path,
                len,
                needed: HEADER_SIZE as u64,
            });
        }
        // SAFETY: the mapping is only ever read through atomic loads (see `header()` and
        // `records()`), so concurrent writes by the owner are defined; its length is checked
        // against every offset before use. Truncation by a third party would raise SIGBUS, a
        // documented hazard of shared mappings that the format's writer never causes.
        let map = unsafe { Mmap::map(&file) }.map_err(open_err)?;
        let len = map.len() as u64;
        if len < HEADER_SIZE as u64 {
            return Err(CountersError::Truncated {
                path,
                len,
                needed: HEADER_SIZE as u64,
            });
        }
        // SAFETY: `len >= HEADER_SIZE` was checked just above and the mapping is
        // page-aligned, so the header is in bounds and aligned; all its fields are atomics
        // (any bit pattern is valid) and we only load from them, which the std docs allow on
        // read-only memory for lock-free sizes of at most 8 bytes ("Atomic accesses to
        // read-only memory").
        let header = unsafe { &*map.as_ptr().cast::<Header>() };
        // ORDERING: Acquire, pairs with the Release store of `magic` in `Header::init`.
        let magic = header.magic.load(Ordering::Acquire);
        if magic != MAGIC {
            return Err(CountersError::BadMagic { path, found: magic });
        }
        // ORDERING (Relaxed loads): published by the Acquire load of `magic`.
        let version = header.version.load(Ordering::Relaxed);
        if version != VERSION {
            return Err(CountersError::Version {
                path,
                found: version,
            });
        }
        let corrupt = |what: String| CountersError::Corrupt {
            path: path.clone(),
            what,
        };
        let header_size = header.header_size.load(Ordering::Relaxed);
        let record_size = header.record_size.load(Ordering::Relaxed);
        if header_size as usize != HEADER_SIZE || record_size as usize != RECORD_SIZE {
            return Err(corrupt(format!(
                "header size {header_size} / record size {record_size}, expected {HEADER_SIZE} / {RECORD_SIZE}"
            )));
        }
        let capacity = header.capacity.load(Ordering::Relaxed);
        if capacity > MAX_CAPACITY {
            return Err(corrupt(format!("capacity {capacity} above {MAX_CAPACITY}")));
        }
        let needed = file_len(capacity);
        if len < needed {
            return Err(CountersError::Truncated { path, len, needed });
        }
        let component_len = header.component_len.load(Ordering::Relaxed);
        if component_len as usize > MAX_COMPONENT_LEN {
            return Err(corrupt(format!("component name length {component_len}")));
        }
        let info = FileInfo {
            component: load_str(&header.component, component_len),
            pid: header.pid.load(Ordering::Relaxed),
            start_unix_ns: header.start_unix_ns.load(Ordering::Relaxed),
            capacity,
        };
        Ok(CountersReader { map, info, path })
    }

    /// The validated header.
    pub fn info(&self) -> &FileInfo {
        &self.info
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the writer's process still exists (checks `/proc/PID`; Linux only).
    pub fn writer_alive(&self) -> bool {
        Path::new("/proc").join(self.info.pid.to_string()).exists()
    }

    fn records(&self) -> &[Record] {
        // SAFETY: `open` checked `map.len() >= HEADER_SIZE + capacity * RECORD_SIZE` and
        // the mapping (page-aligned) is immutable in length for our lifetime; records start
        // 128-aligned; all fields are atomics that we only load (allowed on read-only
        // memory, see `open`); the borrow of `self` keeps the mapping alive.
        unsafe {
            std::slice::from_raw_parts(
                self.map.as_ptr().add(HEADER_SIZE).cast::<Record>(),
                self.info.capacity as usize,
            )
        }
    }

    /// The allocated counters with their current values.
    pub fn iter(&self) -> impl Iterator<Item = CounterEntry> + '_ {
        iter_records(self.records())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp_dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("tempdir")
    }

    #[test]
    fn writer_and_second_mapping_agree() {
        let dir = temp_dir();
        let path = counters_path(dir.path(), "feed-handler");
        let file = CountersFile::create(&path, 8).unwrap();
        let rx = file.allocate("messages received").unwrap();
        let low = file.allocate_with("rq low water", Kind::Gauge, 7).unwrap();
        rx.inc();
        rx.add(41);
        low.set(100);
        low.set_min(30);
        low.set_min(50);

        let reader = CountersReader::open(&path).unwrap();
        assert_eq!(reader.info().component.as_str(), "feed-handler");
        assert_eq!(reader.info().pid, std::process::id());
        assert_eq!(reader.info().capacity, 8);
        assert!(reader.writer_alive());
        let entries: Vec<_> = reader.iter().collect();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            (entries[0].id, entries[0].label.as_str(), entries[0].value),
            (0, "messages received", 42)
        );
        assert_eq!(entries[0].kind, Kind::Counter);
        assert_eq!(
            (
                entries[1].label.as_str(),
                entries[1].value,
                entries[1].type_id
            ),
            ("rq low water", 30, 7)
        );
        assert_eq!(entries[1].kind, Kind::Gauge);

        // Live: the reader's mapping sees later updates.
        rx.add(8);
        assert_eq!(reader.iter().next().unwrap().value, 50);
        assert_eq!(rx.get(), 50);
    }

    #[test]
    fn counter_updates_from_another_thread_are_seen() {
        let dir = temp_dir();
        let path = dir.path().join("t.counters");
        let file = CountersFile::create(&path, 2).unwrap();
        let c = file.allocate("spins").unwrap();
        let writer = std::thread::spawn(move || {
            for _ in 0..100_000 {
                c.inc();
            }
            c
        });
        let c = writer.join().unwrap();
        assert_eq!(c.get(), 100_000);
        let reader = CountersReader::open(&path).unwrap();
        assert_eq!(reader.iter().next().unwrap().value, 100_000);
    }

    #[test]
    fn full_and_long_label_are_errors() {
        let local = LocalCounters::new(1).unwrap();
        let _a = local.allocate("a").unwrap();
        assert!(matches!(
            local.allocate("b"),
            Err(CountersError::Full { capacity: 1, .. })
        ));
        let long = "x".repeat(MAX_LABEL_LEN + 1);
        assert!(matches!(
            local.allocate(&long),
            Err(CountersError::LabelTooLong { len: 105, .. })
        ));
        let exact = "y".repeat(MAX_LABEL_LEN);
        let local = LocalCounters::new(1).unwrap();
        let _b = local.allocate(&exact).unwrap();
        assert_eq!(local.iter().next().unwrap().label.as_str(), exact);
        assert!(matches!(
            LocalCounters::new(0),
            Err(CountersError::Capacity(0))
        ));
        assert!(matches!(
            LocalCounters::new(MAX_CAPACITY + 1),
            Err(CountersError::Capacity(_))
        ));
    }

    #[test]
    fn local_counters_work_like_the_file() {
        let local = LocalCounters::new(4).unwrap();
        let a = local.allocate("a").unwrap();
        let b = local.allocate("b").unwrap();
        a.add(3);
        b.inc();
        a.add(u64::MAX); // wraps
        let values: Vec<_> = local
            .iter()
            .map(|e| (e.label.to_string(), e.value))
            .collect();
        assert_eq!(values, vec![("a".to_string(), 2), ("b".to_string(), 1)]);
    }

    #[test]
    fn recreate_replaces_file_and_old_reader_stays_valid() {
        let dir = temp_dir();
        let path = dir.path().join("gw.counters");
        let first = CountersFile::create(&path, 2).unwrap();
        first.allocate("old").unwrap().add(5);
        let old_reader = CountersReader::open(&path).unwrap();
        let second = CountersFile::create(&path, 2).unwrap();
        second.allocate("new").unwrap().add(6);
        assert_eq!(old_reader.iter().next().unwrap().label.as_str(), "old");
        let new_reader = CountersReader::open(&path).unwrap();
        assert_eq!(new_reader.iter().next().unwrap().label.as_str(), "new");
    }

    fn write_file(path: &Path, bytes: &[u8]) {
        let mut f = File::create(path).unwrap();
        f.write_all(bytes).unwrap();
    }

    fn valid_bytes(capacity: u32) -> Vec<u8> {
        let dir = temp_dir();
        let path = dir.path().join("v.counters");
        let file = CountersFile::create(&path, capacity).unwrap();
        file.allocate("a").unwrap().add(1);
        std::fs::read(&path).unwrap()
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let dir = temp_dir();
        let path = dir.path().join("bad.counters");

        write_file(&path, b"");
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Truncated { len: 0, .. })
        ));

        let good = valid_bytes(4);
        assert_eq!(good.len(), HEADER_SIZE + 4 * RECORD_SIZE);

        // Truncated records.
        write_file(&path, &good[..HEADER_SIZE + RECORD_SIZE]);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Truncated { needed: 640, .. })
        ));

        let mut bad = good.clone();
        bad[0] ^= 0xff;
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::BadMagic { .. })
        ));

        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&2u32.to_ne_bytes());
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Version { found: 2, .. })
        ));

        let mut bad = good.clone();
        bad[16..20].copy_from_slice(&64u32.to_ne_bytes());
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Corrupt { .. })
        ));

        // A capacity the file cannot hold.
        let mut bad = good.clone();
        bad[20..24].copy_from_slice(&1000u32.to_ne_bytes());
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Truncated { .. })
        ));
        bad[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Corrupt { .. })
        ));

        let mut bad = good.clone();
        bad[40..44].copy_from_slice(&65u32.to_ne_bytes());
        write_file(&path, &bad);
        assert!(matches!(
            CountersReader::open(&path),
            Err(CountersError::Corrupt { .. })
        ));

        // Record-level garbage is clamped, not trusted: huge label length, invalid UTF-8,
        // unknown kind.
        let mut bad = good.clone();
        let rec = HEADER_SIZE;
        bad[rec + 20..rec + 24].copy_from_slice(&u32::MAX.to_ne_bytes());
        bad[rec + 24] = 0xff;
        bad[rec + 12..rec + 16].copy_from_slice(&9u32.to_ne_bytes());
        write_file(&path, &bad);
        let reader = CountersReader::open(&path).unwrap();
        let e = reader.iter().next().unwrap();
        assert!(e.label.starts_with('\u{FFFD}'));
        assert!(e.label.len() <= MAX_LABEL_LEN);
        assert_eq!(e.kind, Kind::Counter);
        assert_eq!(e.value, 1);
    }

    #[test]
    fn missing_file_is_open_error() {
        let dir = temp_dir();
        assert!(matches!(
            CountersReader::open(dir.path().join("none.counters")),
            Err(CountersError::Open { .. })
        ));
    }

    /// Two processes: the test binary re-runs itself as a child that writes counters, and
    /// this process reads them while the child holds them.
    #[test]
    fn reader_in_another_process() {
        const CHILD_ENV: &str = "ROCEBUS_COUNTERS_TEST_CHILD";
        if let Some(path) = std::env::var_os(CHILD_ENV) {
            let file = CountersFile::create(PathBuf::from(path), 4).unwrap();
            let c = file.allocate("child messages").unwrap();
            c.add(1234);
            // Stay alive until the parent closes our stdin.
            let _ = io::Read::read(&mut io::stdin(), &mut [0u8; 1]);
            return;
        }
        let dir = temp_dir();
        let path = dir.path().join("child.counters");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "counters::tests::reader_in_another_process",
                "--nocapture",
            ])
            .env(CHILD_ENV, &path)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let value = loop {
            if let Ok(reader) = CountersReader::open(&path) {
                if let Some(e) = reader
                    .iter()
                    .find(|e| e.label.as_str() == "child messages" && e.value == 1234)
                {
                    assert_eq!(reader.info().pid, child.id());
                    assert!(reader.writer_alive());
                    break e.value;
                }
            }
            assert!(
                std::time::Instant::now() < deadline,
                "child never published its counter"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_eq!(value, 1234);
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}
