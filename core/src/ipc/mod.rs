//! The shared-memory transport: one publisher, any number of subscribers
//! on a stream, processes on one host, no NIC.
//!
//! A stream is a file in `/dev/shm` (or a hugetlbfs mount) that every party
//! maps: a header, one slot per subscriber, then a ring of frames. The
//! publisher writes frames in place ([`IpcPublisher::try_claim`] hands out
//! the ring's bytes; nothing is copied), subscribers poll the ring's memory
//! and read frames in place.
//!
//! ```no_run
//! use rocebus::{clock::Mono, ipc::{IpcConfig, IpcPublisher, IpcSubscriber}};
//! let cfg = IpcConfig::default();
//! let mut publisher = IpcPublisher::new(&cfg, "quotes")?;
//! publisher.offer(1, &42u64.to_le_bytes())?; // message type 1
//! // In another process: never blocks, joins when the publisher is there.
//! let mut subscriber = IpcSubscriber::new(&cfg, "quotes")?;
//! subscriber.poll(Mono::now(), |m| println!("type {} {} B", m.msg_type, m.payload.len()), 16)?;
//! while let Some(event) = subscriber.poll_event() { println!("{event:?}"); } // joined, gone, ...
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Zero copy: [`IpcPublisher::try_claim`] hands out the ring's bytes, then
//! `commit()` (or `abort()`).
//!
//! A claim borrows the publisher mutably, so nothing else can be done with
//! the publisher while a claim is open: the compiler refuses it.
//!
//! ```compile_fail,E0499
//! use rocebus::ipc::{IpcConfig, IpcPublisher};
//! let mut publisher = IpcPublisher::new(&IpcConfig::default(), "quotes").unwrap();
//! let claim = publisher.try_claim(1, 8).unwrap();
//! publisher.poll(rocebus::clock::Mono::now()); // error: `publisher` is already borrowed by `claim`
//! claim.commit();
//! ```
//!
//! # Frames
//! A frame is an 8-byte header word then the payload, padded to 8 bytes.
//! The header word holds the payload length (bits 0-31), the message type
//! (32-47) and a lap tag (48-63: the ring lap of the frame's position, low
//! 15 bits, with bit 15 always set so that a header is never zero). The
//! publisher keeps the ring zeroed a little ahead of its tail (up to the
//! next frame's header word before a claim is handed out, and
//! `CLEAN_AHEAD` (256) bytes after each commit, never past what every live
//! subscriber has consumed), fills the payload, then stores the frame's
//! header with `Release`. A subscriber loads the
//! header at its position with `Acquire`: zero is "nothing yet", a tag of
//! this lap is a frame whose bytes are all visible, a tag of a later lap
//! means the subscriber was overtaken. Because the word after the newest
//! frame is always zero, stale bytes of an earlier lap are never read as a
//! header. A frame that does not fit before the ring's end is preceded by a
//! padding frame (type [`PAD_TYPE`]) to the end.
//!
//! # Flow control, chosen per stream
//! - [`FlowControl::Block`] (the default): the publisher never writes over
//!   a frame a live subscriber has not consumed; the slowest subscriber
//!   holds it ([`IpcOfferError::BackPressured`]). Subscribers read frames
//!   in place (zero copy).
//! - [`FlowControl::Drop`]: the publisher never waits; a subscriber that
//!   falls a ring behind is marked dropped, gets [`IpcEvent::Dropped`] and
//!   continues from the newest frame. Since the publisher may then write a
//!   frame while a dropped subscriber reads it, subscribers copy each frame
//!   (with atomic loads) and deliver the copy only after checking they were
//!   not dropped meanwhile.
//!
//! Each subscriber publishes its position in its slot after each poll that
//! consumed frames. The publisher takes the minimum over live slots when the
//! space it cached runs out, and at least every half ring (so that a
//! subscriber joining meanwhile is seen before its first unread frame could
//! be overwritten: the join is a store to the slot then a `SeqCst` fence
//! then a load of the publisher's position, mirrored on the publisher side).
//!
//! # Crashes
//! A subscriber that finds no frame checks, at most every
//! [`IpcConfig::liveness_ms`], whether the publisher closed the stream, died
//! (its process is gone) or was replaced by a new one at the same path, and
//! reports [`IpcEvent::PublisherGone`]; it then reconnects by itself when a
//! publisher appears. The publisher checks its subscribers' processes as
//! often, and whenever one holds it back, and frees the slots of dead ones
//! ([`IpcPubEvent::SubscriberGone`]).
//!
//! # Who can touch a stream
//! Only processes of the stream's owner (the publisher's user):
//! - the directory ([`IpcConfig::dir`], by default `/dev/shm/rocebus-ipc-UID`)
//!   is created mode 0700 when missing, and refused (OpenSSH `StrictModes`
//!   style) when it is a symlink, is not owned by the user, or group or
//!   others can write it;
//! - the file is built under a random temporary name opened with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600, then renamed into place;
//! - a subscriber opens it with `O_NOFOLLOW`, refuses a file whose owner is
//!   not its own user (or the one given to [`IpcSubscriber::expect_owner`]),
//!   that group or others can access, or that is shorter than its header
//!   says (checked with `fstat` before mapping, so a truncated file is an
//!   error, not a `SIGBUS`); it maps the ring read-only and only the header
//!   and slot pages read-write (see `shm.rs`);
//! - a slot counts only while its process maps the stream file (read from
//!   `/proc/PID/maps` once per slot and process): a slot written by hand
//!   naming a live process that is no subscriber (pid 1, say) is freed at
//!   the next check, so it cannot hold a `Block` publisher;
//! - at each check (every `liveness_ms`, and when back-pressured) the
//!   publisher `fstat`s its file and grows it back if it was truncated.
//!
//! A stream file is not sealed: a process of the owner can still shrink it
//! between two checks and make the parties that touch the cut pages die of
//! `SIGBUS`. That is no new power (the same user can signal or ptrace those
//! processes); a sealed memfd would close it, but cannot be opened by path.

mod shm;

use arrayvec::ArrayVec;
use serde::Deserialize;
use shm::Shm;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use crate::clock::{now_ns, Mono};

/// Message type of padding frames (in [`crate::RESERVED_TYPES`], which
/// claims refuse).
pub const PAD_TYPE: u16 = 0xFFFF;

const MAGIC: u64 = u64::from_le_bytes(*b"RBIPC001");
const VERSION: u64 = 1;

// Header layout (bytes).
const H_MAGIC: usize = 0;
const H_VERSION: usize = 8;
const H_RING: usize = 16;
const H_SLOTS: usize = 24;
const H_MAX_PAYLOAD: usize = 32;
const H_FLOW: usize = 40;
const H_SESSION: usize = 48;
const H_PID: usize = 56;
const H_PID_START: usize = 64;
/// Publisher state: 0 being set up, 1 live, 2 closed.
const H_STATE: usize = 128;
/// Publisher position (end of the newest committed frame).
const H_TAIL: usize = 256;
const SLOTS_OFF: usize = 512;
const SLOT_LEN: usize = 128;
// Slot layout.
const S_STATE: usize = 0;
const S_PID: usize = 8;
const S_PID_START: usize = 16;
const S_POS: usize = 64;

const STATE_LIVE: u64 = 1;
const STATE_CLOSED: u64 = 2;
const SLOT_FREE: u64 = 0;
const SLOT_LIVE: u64 = 1;
const SLOT_DROPPED: u64 = 2;

const HEADER_LEN: usize = 8;
/// Bytes of ring the publisher keeps zeroed ahead of its tail after each
/// commit (four cache lines).
const CLEAN_AHEAD: u64 = 256;

/// How the publisher treats slow subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum FlowControl {
    /// The slowest live subscriber holds the publisher back.
    #[default]
    Block,
    /// Subscribers a ring behind are dropped with an event.
    Drop,
}

/// Configuration of an IPC stream (`[ipc]` in the binaries' TOML).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IpcConfig {
    /// Folder of the stream files, only the owner may write it (created
    /// 0700 when missing): by default `/dev/shm/rocebus-ipc-UID`, or a
    /// folder in a hugetlbfs mount.
    pub dir: PathBuf,
    /// Bytes of the ring (a power of two, at least 64 KiB).
    pub ring_bytes: usize,
    /// Largest payload (at most a quarter ring).
    pub max_payload: usize,
    /// Subscriber slots (how many subscribers at once).
    pub max_subscribers: usize,
    /// Flow control (set by the publisher; subscribers follow the stream's).
    pub flow: FlowControl,
    /// How often an idle party checks the other side is alive, and how
    /// often an unconnected subscriber looks for its publisher.
    pub liveness_ms: u64,
}

impl Default for IpcConfig {
    fn default() -> Self {
        IpcConfig {
            dir: PathBuf::from(format!("/dev/shm/rocebus-ipc-{}", current_uid())),
            ring_bytes: 1 << 20,
            max_payload: 64 << 10,
            max_subscribers: 16,
            flow: FlowControl::Block,
            liveness_ms: 100,
        }
    }
}

impl IpcConfig {
    /// Checks the values; the error says which and why.
    pub fn validate(&self) -> Result<(), IpcError> {
        let bad = |why: String| Err(IpcError::Config(why));
        if !self.ring_bytes.is_power_of_two()
            || self.ring_bytes < 64 << 10
            || self.ring_bytes > 1 << 40
        {
            return bad(format!(
                "ipc.ring_bytes = {} must be a power of two from 64 KiB to 1 TiB",
                self.ring_bytes
            ));
        }
        if self.max_payload == 0
            || self.max_payload > self.ring_bytes / 4
            || self.max_payload > u32::MAX as usize
        {
            return bad(format!(
                "ipc.max_payload = {} must be from 1 to a quarter of ipc.ring_bytes ({})",
                self.max_payload,
                self.ring_bytes / 4
            ));
        }
        if self.max_subscribers == 0 || self.max_subscribers > 1024 {
            return bad(format!(
                "ipc.max_subscribers = {} must be from 1 to 1024",
                self.max_subscribers
            ));
        }
        if self.liveness_ms == 0 {
            return bad("ipc.liveness_ms must be at least 1".into());
        }
        Ok(())
    }

    /// The file of stream `name`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(format!("rocebus-{name}.ipc"))
    }
}

/// Errors of the IPC transport.
#[derive(Debug, thiserror::Error)]
pub enum IpcError {
    /// A configuration value is out of range.
    #[error("invalid IPC configuration: {0}")]
    Config(String),
    /// The stream name cannot be a file name.
    #[error("invalid IPC stream name {0:?}: use letters, digits, '-', '_' and '.'")]
    Name(String),
    /// A live publisher already owns the stream.
    #[error("IPC stream {path} already has a live publisher (pid {pid})")]
    AlreadyPublished {
        /// The stream file.
        path: PathBuf,
        /// The publisher's process.
        pid: u32,
    },
    /// The stream directory is not private to its owner.
    #[error("IPC directory {path} {why}: use a directory only its owner can write (mode 0700), e.g. /dev/shm/rocebus-ipc-UID")]
    UnsafeDir {
        /// The directory.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The stream file is not one its owner alone can touch, or is not a
    /// regular file.
    #[error("IPC stream {path} {why}: refusing it (remove it if it is not yours)")]
    UnsafeFile {
        /// The stream file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// The stream file belongs to another user.
    #[error("IPC stream {path} is owned by uid {owner}, not uid {expected}: refusing it (another user may be squatting the name)")]
    NotOwner {
        /// The stream file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The owner expected.
        expected: u32,
    },
    /// The stream file is shorter than its header says (truncated).
    #[error("IPC stream {path} holds {len} bytes, its header needs {need}: truncated")]
    Truncated {
        /// The stream file.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The length its header needs.
        need: u64,
    },
    /// Creating or mapping the stream file failed.
    #[error("IPC stream {path}: {source}")]
    Io {
        /// The stream file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// Why a claim was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IpcOfferError {
    /// The slowest subscriber has not consumed enough of the ring yet
    /// ([`FlowControl::Block`]); try again.
    #[error("back-pressured: the slowest subscriber is a ring behind")]
    BackPressured,
    /// The payload exceeds the stream's maximum.
    #[error("payload of {len} bytes exceeds the stream's maximum of {max}")]
    TooLarge {
        /// Requested.
        len: usize,
        /// Allowed.
        max: usize,
    },
    /// The message type is in [`crate::RESERVED_TYPES`].
    #[error("message type reserved for rocebus (0xFF00..=0xFFFF)")]
    ReservedType,
}

/// A message as a subscriber sees it.
///
/// `payload` points into memory another process writes. In
/// [`FlowControl::Block`] mode the publisher does not touch a frame before
/// this subscriber consumed it; a misbehaving process could, and then the
/// bytes are garbage (never anything worse: they are plain bytes, and
/// nothing here trusts them). Copy what you keep past the callback.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    /// The publisher's message type.
    pub msg_type: u16,
    /// The payload.
    pub payload: &'a [u8],
}

/// What happened to a subscriber's connection ([`IpcSubscriber::poll_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcEvent {
    /// Joined a publisher's stream (at its newest frame).
    Connected {
        /// The publisher's random session id (new for every publisher).
        session: u64,
        /// The publisher's process id.
        publisher_pid: u32,
    },
    /// Fell a ring behind in [`FlowControl::Drop`] mode: messages were
    /// lost; delivery continues from the newest frame.
    Dropped {
        /// Bytes of frames skipped.
        skipped_bytes: u64,
    },
    /// The publisher closed the stream (`clean`), or died, or was replaced.
    /// The subscriber reconnects by itself when a publisher is there.
    PublisherGone {
        /// Whether it closed the stream on purpose.
        clean: bool,
    },
    /// The stream's contents broke the protocol (a misbehaving process
    /// wrote into the ring); the subscriber disconnected and will
    /// reconnect.
    Corrupt(&'static str),
}

/// What a publisher's poll reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcPubEvent {
    /// A subscriber's process is gone; its slot was freed.
    SubscriberGone {
        /// Its slot.
        slot: usize,
        /// Its process id.
        pid: u32,
    },
    /// A subscriber was dropped for being a ring behind (Drop mode).
    SubscriberDropped {
        /// Its slot.
        slot: usize,
    },
}

/// Counters of a publisher.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpcPubStats {
    /// Messages committed.
    pub messages: u64,
    /// Claims refused for back-pressure.
    pub back_pressured: u64,
    /// Subscribers dropped for lagging (Drop mode).
    pub dropped_subscribers: u64,
    /// Slots freed because their process died.
    pub dead_subscribers: u64,
    /// Slots freed because their process, though alive, does not map the
    /// stream (written by something that is no subscriber).
    pub impostor_slots: u64,
    /// Times the stream file was found truncated and grown back.
    pub truncations: u64,
}

fn current_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    unsafe {
        libc::getuid()
    }
}

/// Whether a file of owner `owner` and mode `mode` may be used by a party
/// that expects owner `expected`: owned by it, nothing for group or others.
fn check_owner(path: &Path, owner: u32, mode: u32, expected: u32) -> Result<(), IpcError> {
    if owner != expected {
        return Err(IpcError::NotOwner {
            path: path.into(),
            owner,
            expected,
        });
    }
    if mode & 0o077 != 0 {
        return Err(IpcError::UnsafeFile {
            path: path.into(),
            why: format!(
                "has mode {:o} (group or others may access it)",
                mode & 0o7777
            ),
        });
    }
    Ok(())
}

/// Why a directory of owner `owner` and mode `mode` (`is_dir`) is not
/// private to `expected`, if it is not (OpenSSH `StrictModes`).
fn dir_problem(is_dir: bool, owner: u32, mode: u32, expected: u32) -> Option<String> {
    if !is_dir {
        return Some("is not a directory (a symlink?)".into());
    }
    if owner != expected {
        return Some(format!("is owned by uid {owner}, not uid {expected}"));
    }
    if mode & 0o022 != 0 {
        return Some(format!(
            "has mode {:o}: group or others can write it",
            mode & 0o7777
        ));
    }
    None
}

/// Checks the stream directory `dir` is private to `owner`; creates it
/// (0700) when missing and `create`. `Ok(false)`: missing, not created.
fn private_dir(dir: &Path, owner: u32, create: bool) -> Result<bool, IpcError> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            // Another party may create it between our look and our create (two publishers
            // starting at once): AlreadyExists is fine, the checks below judge what is there.
            match std::fs::DirBuilder::new().mode(0o700).create(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(IpcError::Io {
                        path: dir.into(),
                        source: e,
                    })
                }
                _ => {}
            }
            std::fs::symlink_metadata(dir).map_err(|source| IpcError::Io {
                path: dir.into(),
                source,
            })?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(IpcError::Io {
                path: dir.into(),
                source,
            })
        }
    };
    match dir_problem(meta.is_dir(), meta.uid(), meta.mode(), owner) {
        Some(why) => Err(IpcError::UnsafeDir {
            path: dir.into(),
            why,
        }),
        None => Ok(true),
    }
}

/// Opens `path` read-write, never through a symlink. `Ok(None)`: missing.
fn open_nofollow(path: &Path) -> Result<Option<File>, IpcError> {
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => Err(IpcError::UnsafeFile {
            path: path.into(),
            why: "is a symlink".into(),
        }),
        Err(source) => Err(IpcError::Io {
            path: path.into(),
            source,
        }),
    }
}

/// The first `SLOTS_OFF` bytes of a stream file as words (read with
/// `pread`, before anything is mapped).
fn read_header(f: &File) -> Option<[u64; SLOTS_OFF / 8]> {
    let mut b = [0u8; SLOTS_OFF];
    f.read_exact_at(&mut b, 0).ok()?;
    let mut w = [0u64; SLOTS_OFF / 8];
    for (i, c) in b.chunks_exact(8).enumerate() {
        w[i] = u64::from_le_bytes(c.try_into().ok()?);
    }
    Some(w)
}

/// Whether process `pid` maps the file of inode `ino` (from
/// `/proc/PID/maps`; unreadable, e.g. another user's process: no).
fn maps_inode(pid: u64, ino: u64) -> bool {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    maps.lines().any(|l| {
        l.split_ascii_whitespace()
            .nth(4)
            .and_then(|i| i.parse().ok())
            == Some(ino)
    })
}

impl IpcError {
    /// A copy (an `io::Error` is rebuilt from its kind and message).
    fn clone_checks(&self) -> IpcError {
        match self {
            IpcError::Config(s) => IpcError::Config(s.clone()),
            IpcError::Name(s) => IpcError::Name(s.clone()),
            IpcError::AlreadyPublished { path, pid } => IpcError::AlreadyPublished {
                path: path.clone(),
                pid: *pid,
            },
            IpcError::UnsafeDir { path, why } => IpcError::UnsafeDir {
                path: path.clone(),
                why: why.clone(),
            },
            IpcError::UnsafeFile { path, why } => IpcError::UnsafeFile {
                path: path.clone(),
                why: why.clone(),
            },
            IpcError::NotOwner {
                path,
                owner,
                expected,
            } => IpcError::NotOwner {
                path: path.clone(),
                owner: *owner,
                expected: *expected,
            },
            IpcError::Truncated { path, len, need } => IpcError::Truncated {
                path: path.clone(),
                len: *len,
                need: *need,
            },
            IpcError::Io { path, source } => IpcError::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
        }
    }
}

fn lap_tag(pos: u64, log2: u32) -> u64 {
    ((pos >> log2) & 0x7FFF) | 0x8000
}

#[inline]
fn frame_len(payload: usize) -> usize {
    (HEADER_LEN + payload + 7) & !7
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !name.starts_with('.')
}

/// State (field 3) and start time (field 22) of process `pid`, from
/// `/proc/PID/stat`. The start time tells a live process from a later one
/// that reused its pid.
fn process_stat(pid: u32) -> Option<(u8, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let mut fields = s.get(s.rfind(')')? + 2..)?.split(' ');
    let state = *fields.next()?.as_bytes().first()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// Start time of process `pid` (field 22 of `/proc/PID/stat`).
fn process_start(pid: u32) -> Option<u64> {
    process_stat(pid).map(|(_, start)| start)
}

/// Whether process `pid`, started at `start`, still runs. A zombie (`Z`:
/// exited, not yet reaped by its parent) or a dying process (`X`) keeps its
/// pid and start time but will never touch the stream again: it is dead
/// here, or a peer whose parent is slow to reap it would never be noticed.
fn alive(pid: u64, start: u64) -> bool {
    pid != 0
        && pid <= u32::MAX as u64
        && matches!(process_stat(pid as u32),
            Some((state, s)) if s == start && !matches!(state, b'Z' | b'X'))
}

fn data_off(slots: usize) -> usize {
    (SLOTS_OFF + slots * SLOT_LEN).next_multiple_of(4096)
}

fn slot_off(i: usize) -> usize {
    SLOTS_OFF + i * SLOT_LEN
}

/// The publisher of a stream.
#[derive(Debug)]
pub struct IpcPublisher {
    shm: Shm,
    /// The stream file, to check its length (truncation) at each reap.
    file: File,
    path: PathBuf,
    ino: u64,
    /// Per slot, the (pid, start) found mapping the stream: a slot is
    /// looked up in `/proc/PID/maps` once per process.
    verified: Vec<(u64, u64)>,
    data: usize,
    ring: usize,
    log2: u32,
    mask: u64,
    slots: usize,
    max_payload: usize,
    flow: FlowControl,
    /// Next frame's position.
    tail: u64,
    /// Claims may end (plus the next header word) at most here.
    limit: u64,
    /// Ring positions from `tail` up to here are zero in memory: the next
    /// frame's header word is zeroed before a commit needs it, so a commit
    /// stores nothing past its own frame (see [`CLEAN_AHEAD`]).
    clean: u64,
    liveness: Duration,
    /// When the subscribers' processes were last looked at, on
    /// [`now_ns`]'s clock.
    last_check: u64,
    refusals: u32,
    stats: IpcPubStats,
    pending: Vec<IpcPubEvent>,
}

/// A frame being written; dereferences to its payload. Commit it, or drop
/// it to abandon it (subscribers skip it).
#[derive(Debug)]
pub struct IpcClaim<'p> {
    publisher: &'p mut IpcPublisher,
    pos: u64,
    len: usize,
    msg_type: u16,
}

impl IpcPublisher {
    /// Creates stream `name` in `cfg.dir`, replacing the file of a publisher
    /// that is gone. Subscribers already waiting connect on their next poll.
    pub fn new(cfg: &IpcConfig, name: &str) -> Result<Self, IpcError> {
        cfg.validate()?;
        if !valid_name(name) {
            return Err(IpcError::Name(name.into()));
        }
        let path = cfg.path(name);
        let io = |source| IpcError::Io {
            path: path.clone(),
            source,
        };
        private_dir(&cfg.dir, current_uid(), true)?;
        if let Some(f) = open_nofollow(&path)? {
            if let Some((pid, start, state)) = Self::owner(&f) {
                if state == STATE_LIVE && alive(pid, start) && pid != std::process::id() as u64 {
                    return Err(IpcError::AlreadyPublished {
                        path,
                        pid: pid as u32,
                    });
                }
            }
        }
        let data = data_off(cfg.max_subscribers);
        let mut total = data + cfg.ring_bytes + 64;
        if is_hugetlbfs(&cfg.dir) {
            total = total.next_multiple_of(2 << 20);
        }
        // Built under a temporary name and renamed into place: a subscriber
        // never maps a half-initialised stream. The name is random and the
        // open exclusive and not through a symlink: nothing planted at it
        // is opened or truncated.
        let mut rnd = [0u8; 8];
        getrandom::getrandom(&mut rnd).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        let tmp = cfg.dir.join(format!(
            ".rocebus-{name}.{:016x}.tmp",
            u64::from_le_bytes(rnd)
        ));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(io)?;
        let prep = (|| {
            file.set_len(total as u64)?;
            Shm::map(&file)
        })();
        let mut shm = match prep {
            Ok(s) => s,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(io(e));
            }
        };
        let me = std::process::id();
        let mut session = [0u8; 8];
        getrandom::getrandom(&mut session).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        for (off, v) in [
            (H_MAGIC, MAGIC),
            (H_VERSION, VERSION),
            (H_RING, cfg.ring_bytes as u64),
            (H_SLOTS, cfg.max_subscribers as u64),
            (H_MAX_PAYLOAD, cfg.max_payload as u64),
            (H_FLOW, (cfg.flow == FlowControl::Drop) as u64),
            (H_SESSION, u64::from_le_bytes(session)),
            (H_PID, me as u64),
            (H_PID_START, process_start(me).unwrap_or(0)),
        ] {
            shm.write_init(off, &v.to_le_bytes());
        }
        // ORDERING: Release: a subscriber that sees LIVE (Acquire) sees the
        // header written above.
        shm.word(H_STATE).store(STATE_LIVE, Ordering::Release);
        if let Err(e) = std::fs::rename(&tmp, &path) {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(e));
        }
        let ino = inode(&path).unwrap_or(0);
        let log2 = cfg.ring_bytes.trailing_zeros();
        let mut p = IpcPublisher {
            shm,
            file,
            path,
            ino,
            verified: vec![(0, 0); cfg.max_subscribers],
            data,
            ring: cfg.ring_bytes,
            log2,
            mask: cfg.ring_bytes as u64 - 1,
            slots: cfg.max_subscribers,
            max_payload: cfg.max_payload,
            flow: cfg.flow,
            tail: 0,
            limit: 0,
            clean: 0,
            liveness: Duration::from_millis(cfg.liveness_ms),
            last_check: now_ns(),
            refusals: 0,
            stats: IpcPubStats::default(),
            pending: Vec::with_capacity(cfg.max_subscribers),
        };
        p.refresh_limit(0);
        Ok(p)
    }

    fn owner(f: &File) -> Option<(u64, u64, u64)> {
        // Read, not mapped: a file someone truncated cannot SIGBUS us.
        let h = read_header(f)?;
        let w = |off: usize| h[off / 8];
        (w(H_MAGIC) == MAGIC).then(|| (w(H_PID), w(H_PID_START), w(H_STATE)))
    }

    /// The stream file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Counters.
    pub fn stats(&self) -> IpcPubStats {
        self.stats
    }

    /// Live subscribers and their positions (bytes behind the publisher).
    pub fn subscribers(&self) -> Vec<(usize, u32, u64)> {
        (0..self.slots)
            .filter_map(|i| {
                // ORDERING: Acquire on the slot state pairs with the subscriber's Release at join, so its pid and position are visible; a stale value only makes this report late.
                let s = slot_off(i);
                (self.shm.word(s + S_STATE).load(Ordering::Acquire) == SLOT_LIVE).then(|| {
                    let pos = self.shm.word(s + S_POS).load(Ordering::Acquire);
                    (
                        i,
                        self.shm.word(s + S_PID).load(Ordering::Relaxed) as u32,
                        self.tail.saturating_sub(pos),
                    )
                })
            })
            .collect()
    }

    /// Recomputes how far claims may go: `needed` is the end (exclusive)
    /// the caller wants. In Drop mode, subscribers that hold it back are
    /// dropped.
    #[cold]
    fn refresh_limit(&mut self, needed: u64) {
        // ORDERING: SeqCst fence between our tail store (in commit) and the
        // loads of the slots, mirrored by the subscriber's slot store,
        // SeqCst fence, tail load at join: either we see its slot, or it
        // sees a tail at least ours and starts there (see the module docs).
        fence(Ordering::SeqCst);
        let ring = self.ring as u64;
        let mut limit = self.tail + ring / 2;
        for i in 0..self.slots {
            let s = slot_off(i);
            // ORDERING: Acquire loads of the slot, after the SeqCst fence above (see there); a position read late is only smaller, i.e. conservative.
            if self.shm.word(s + S_STATE).load(Ordering::Acquire) != SLOT_LIVE {
                continue;
            }
            let pos = self.shm.word(s + S_POS).load(Ordering::Acquire);
            // A position beyond our tail is a misbehaving process's write:
            // treat it as our tail.
            let pos = pos.min(self.tail);
            if self.flow == FlowControl::Drop && pos + ring < needed {
                // ORDERING: AcqRel on the mark and a Release fence before
                // any later write into the ring: a dropped subscriber that
                // copies bytes we write afterwards and then checks its slot
                // (Acquire fence, load) sees DROPPED.
                if self
                    .shm
                    .word(s + S_STATE)
                    .compare_exchange(SLOT_LIVE, SLOT_DROPPED, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    fence(Ordering::Release);
                    self.stats.dropped_subscribers += 1;
                    self.push_event(IpcPubEvent::SubscriberDropped { slot: i });
                }
                continue;
            }
            limit = limit.min(pos + ring);
        }
        self.limit = limit;
    }

    /// Whether `liveness` has passed since the last look at the
    /// subscribers' processes (`now` on [`now_ns`]'s clock).
    fn check_due(&self, now: u64) -> bool {
        Duration::from_nanos(now.saturating_sub(self.last_check)) >= self.liveness
    }

    /// Frees the slots of subscribers whose process is gone, or does not
    /// map the stream; grows the file back if it was truncated.
    #[cold]
    fn reap(&mut self, now: u64) {
        self.last_check = now;
        if self
            .file
            .metadata()
            .is_ok_and(|m| m.len() < self.shm.len() as u64)
            && self.file.set_len(self.shm.len() as u64).is_ok()
        {
            self.stats.truncations += 1;
        }
        for i in 0..self.slots {
            let s = slot_off(i);
            // ORDERING: Acquire on state, pid and start pairs with the subscriber's Release at join; the CAS below frees only the state we read, so a slot re-taken meanwhile is left alone.
            let st = self.shm.word(s + S_STATE).load(Ordering::Acquire);
            if st == SLOT_FREE {
                continue;
            }
            let pid = self.shm.word(s + S_PID).load(Ordering::Acquire);
            let start = self.shm.word(s + S_PID_START).load(Ordering::Acquire);
            let alive = alive(pid, start);
            let impostor = alive && self.verified[i] != (pid, start) && !maps_inode(pid, self.ino);
            if alive && !impostor {
                self.verified[i] = (pid, start);
                continue;
            }
            if self
                .shm
                .word(s + S_STATE)
                .compare_exchange(st, SLOT_FREE, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                if impostor {
                    self.stats.impostor_slots += 1;
                } else {
                    self.stats.dead_subscribers += 1;
                }
                self.push_event(IpcPubEvent::SubscriberGone {
                    slot: i,
                    pid: pid as u32,
                });
            }
        }
    }

    /// Claims a frame of `len` payload bytes of type `msg_type`.
    #[inline]
    pub fn try_claim(&mut self, msg_type: u16, len: usize) -> Result<IpcClaim<'_>, IpcOfferError> {
        if len > self.max_payload {
            return Err(IpcOfferError::TooLarge {
                len,
                max: self.max_payload,
            });
        }
        if msg_type >= *crate::RESERVED_TYPES.start() {
            return Err(IpcOfferError::ReservedType);
        }
        let need = frame_len(len) as u64;
        let off = self.tail & self.mask;
        let pad = if off + need > self.ring as u64 {
            self.ring as u64 - off
        } else {
            0
        };
        // The frame, the padding before it, and the next header word.
        let end = self.tail + pad + need + HEADER_LEN as u64;
        if end > self.limit {
            self.refresh_limit(end);
            if end > self.limit {
                // A dead subscriber may be what holds us: look, but read
                // the clock only every 1024 refusals.
                self.refusals = self.refusals.wrapping_add(1);
                if self.refusals % 1024 == 0 {
                    let now = now_ns();
                    if self.check_due(now) {
                        self.reap(now);
                        self.refresh_limit(end);
                    }
                }
                if end > self.limit {
                    self.stats.back_pressured += 1;
                    return Err(IpcOfferError::BackPressured);
                }
            }
        }
        if end > self.clean {
            // The frame, its padding and the next header word (end <= limit:
            // no live subscriber reads these positions' bytes any more).
            self.clean_to(end);
        }
        if pad > 0 {
            self.write_pad(self.tail, pad);
            self.tail += pad;
        }
        Ok(IpcClaim {
            pos: self.tail,
            len,
            msg_type,
            publisher: self,
        })
    }

    /// Zeroes the ring's words for positions `clean..to` (`to` at most
    /// `limit`, a multiple of 8) and moves `clean` there.
    #[inline]
    fn clean_to(&mut self, to: u64) {
        while self.clean < to {
            let off = self.data + (self.clean & self.mask) as usize;
            // Whole cache lines at a time where it can (a line never straddles
            // the ring's end: the ring is a power of two of at least a page).
            let words = if self.clean % 64 == 0 && to - self.clean >= 64 {
                8
            } else {
                1
            };
            for i in 0..words {
                self.shm
                    .word_unchecked(off + i * 8)
                    // ORDERING: Relaxed: published by the Release store of the
                    // header of a frame before these positions (a subscriber
                    // reads a header word only after the frame before it).
                    .store(0, Ordering::Relaxed);
            }
            self.clean += words as u64 * 8;
        }
    }

    /// Writes a padding frame of `bytes` at `pos` and publishes it.
    /// The header word after it is zero already: the claim that led here (a
    /// frame wrapping to the ring's start, or one abandoned) cleaned past it.
    fn write_pad(&mut self, pos: u64, bytes: u64) {
        debug_assert!(self.clean >= pos + bytes + HEADER_LEN as u64);
        let h = (bytes - HEADER_LEN as u64)
            | ((PAD_TYPE as u64) << 32)
            | (lap_tag(pos, self.log2) << 48);
        // ORDERING: Release publishes the zeroed next header with it.
        self.shm
            .word_unchecked(self.data + (pos & self.mask) as usize)
            .store(h, Ordering::Release);
        // ORDERING: Release: a joining subscriber that reads this position (Acquire) sees every frame before it.
        self.shm.word(H_TAIL).store(pos + bytes, Ordering::Release);
    }

    /// Copies `payload` into a frame and commits it.
    #[inline]
    pub fn offer(&mut self, msg_type: u16, payload: &[u8]) -> Result<(), IpcOfferError> {
        let mut c = self.try_claim(msg_type, payload.len())?;
        c.copy_from_slice(payload);
        c.commit();
        Ok(())
    }

    /// Housekeeping, for the publisher's duty cycle: finds subscribers
    /// whose process died (at most every `liveness_ms`). `now` is the
    /// turn's reading of [`Mono`], as every transport takes it. Returns how
    /// many events wait in [`poll_event`](Self::poll_event).
    pub fn poll(&mut self, now: Mono) -> usize {
        let now = now.as_nanos();
        if self.check_due(now) {
            self.reap(now);
        }
        self.pending.len()
    }

    /// The next event (a subscriber gone or dropped), oldest first. At most
    /// `max_subscribers` wait; later ones are counted in [`stats`](Self::stats) only.
    pub fn poll_event(&mut self) -> Option<IpcPubEvent> {
        (!self.pending.is_empty()).then(|| self.pending.remove(0))
    }

    /// Queues `e` unless `max_subscribers` events already wait (never grows).
    #[cold]
    fn push_event(&mut self, e: IpcPubEvent) {
        if self.pending.len() < self.slots {
            self.pending.push(e);
        }
    }
}

impl Drop for IpcPublisher {
    fn drop(&mut self) {
        // ORDERING: Release after the last frame: a subscriber that sees
        // CLOSED has seen every frame before it.
        self.shm
            .word(H_STATE)
            .store(STATE_CLOSED, Ordering::Release);
        // Remove the path only if it is still ours (not a newer publisher's).
        if inode(&self.path) == Some(self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl IpcClaim<'_> {
    /// Publishes the frame.
    #[inline]
    pub fn commit(self) {
        let p = &mut *self.publisher;
        let pos = self.pos;
        let need = frame_len(self.len) as u64;
        // The next header word is already zero: try_claim cleaned up to it.
        let h = self.len as u64 | ((self.msg_type as u64) << 32) | (lap_tag(pos, p.log2) << 48);
        // ORDERING: Release: a subscriber that loads this header (Acquire)
        // sees the payload and the zeroed next header.
        p.shm
            .word_unchecked(p.data + (pos & p.mask) as usize)
            .store(h, Ordering::Release);
        p.tail = pos + need;
        // ORDERING: Release, as in write_pad: joiners start at a position whose frames are visible.
        p.shm.word(H_TAIL).store(p.tail, Ordering::Release);
        p.stats.messages += 1;
        // Zero ahead now, after the header is out: the next small frame's
        // header word is then zero before its claim, and its commit touches
        // no cache line beyond its own frame (the subscriber waits on the
        // next header's line; writing it at every commit cost a transfer).
        // Whole lines: the loop above then stores a line per pass. The claim
        // cleaned past this frame, so nothing behind the tail is touched.
        debug_assert!(p.clean >= p.tail);
        let ahead = ((p.tail + CLEAN_AHEAD) & !63).min(p.limit);
        if ahead > p.clean {
            p.clean_to(ahead);
        }
        std::mem::forget(self);
    }

    /// Abandons the frame: subscribers skip it (what dropping the claim
    /// does; this says so at the call site).
    #[inline]
    pub fn abort(self) {}

    /// Payload bytes of this frame.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

// The claim's bytes and a subscriber's in-place payload are the two views
// the protocol makes exclusive; shm.rs holds every other unsafe operation.
#[allow(unsafe_code)]
impl std::ops::Deref for IpcClaim<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let p = &*self.publisher;
        // SAFETY: the claimed range is inside the ring (try_claim padded to
        // the ring's end), not visible to subscribers until commit (its
        // header is zero or a stale lap), and only this claim refers to it.
        unsafe {
            p.shm
                .slice(p.data + (self.pos & p.mask) as usize + HEADER_LEN, self.len)
        }
    }
}

#[allow(unsafe_code)]
impl std::ops::DerefMut for IpcClaim<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        let p = &*self.publisher;
        // SAFETY: as in deref; &mut self makes this the only live view.
        unsafe {
            p.shm
                .slice_mut(p.data + (self.pos & p.mask) as usize + HEADER_LEN, self.len)
        }
    }
}

impl Drop for IpcClaim<'_> {
    fn drop(&mut self) {
        // Abandoned: publish it as padding so subscribers skip it.
        let bytes = frame_len(self.len) as u64;
        let pos = self.pos;
        self.publisher.write_pad(pos, bytes);
        self.publisher.tail = pos + bytes;
    }
}

fn inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

fn is_hugetlbfs(dir: &Path) -> bool {
    const HUGETLBFS_MAGIC: u64 = 0x9584_58f6;
    rustix::fs::statfs(dir)
        .map(|s| s.f_type as u64 == HUGETLBFS_MAGIC)
        .unwrap_or(false)
}

/// What the header word at a subscriber's position says.
#[derive(Debug, Clone, Copy)]
enum Head {
    /// No frame yet.
    Empty,
    /// A frame of a later lap: the publisher overtook us.
    Overtaken,
    /// A frame of this lap.
    Frame {
        msg_type: u16,
        len: usize,
        /// Bytes up to the next frame.
        bytes: u64,
    },
}

/// A connected subscriber's view of the stream.
#[derive(Debug)]
struct Joined {
    shm: Shm,
    /// The stream file, to notice a truncation at the liveness checks.
    file: File,
    ino: u64,
    data: usize,
    ring: usize,
    log2: u32,
    mask: u64,
    max_payload: usize,
    drop_mode: bool,
    slot: usize,
    pid: u64,
    pid_start: u64,
    pos: u64,
}

/// A subscriber of a stream. Never blocks: it starts unconnected and
/// reports [`IpcEvent::Connected`] once it joined a live publisher.
#[derive(Debug)]
pub struct IpcSubscriber {
    path: PathBuf,
    dir: PathBuf,
    /// The user the stream's directory and file must belong to.
    owner: u32,
    /// Why the last attempt to join was refused, if it was.
    refused: Option<IpcError>,
    liveness_ns: u64,
    joined: Option<Joined>,
    last_check: Option<u64>,
    idle_polls: u32,
    /// Copy of a frame in Drop mode (allocated once).
    scratch: Vec<u8>,
    /// Lifecycle events not yet taken by [`IpcSubscriber::poll_event`].
    events: ArrayVec<IpcEvent, EVENTS>,
}

/// Lifecycle events a subscriber keeps for [`IpcSubscriber::poll_event`];
/// past that, the oldest is discarded (each poll adds at most one).
const EVENTS: usize = 16;

impl IpcSubscriber {
    /// A subscriber of stream `name` in `cfg.dir`. Fails only on bad
    /// configuration; a missing publisher is not an error.
    pub fn new(cfg: &IpcConfig, name: &str) -> Result<Self, IpcError> {
        cfg.validate()?;
        if !valid_name(name) {
            return Err(IpcError::Name(name.into()));
        }
        Ok(IpcSubscriber {
            path: cfg.path(name),
            dir: cfg.dir.clone(),
            owner: current_uid(),
            refused: None,
            liveness_ns: cfg.liveness_ms.saturating_mul(1_000_000),
            joined: None,
            last_check: None,
            idle_polls: 0,
            scratch: Vec::new(),
            events: ArrayVec::new(),
        })
    }

    /// Whether it is joined to a live publisher.
    pub fn is_connected(&self) -> bool {
        self.joined.is_some()
    }

    /// Accepts streams of user `uid` instead of this process's own (the
    /// directory and the file must both belong to it).
    pub fn expect_owner(mut self, uid: u32) -> Self {
        self.owner = uid;
        self
    }

    /// Why the last attempt to join was refused (an unsafe directory or
    /// file, another owner, a truncated file); `None` once joined, or when
    /// there was simply no publisher yet. [`Self::poll`] keeps trying.
    pub fn refused(&self) -> Option<&IpcError> {
        self.refused.as_ref()
    }

    /// Tries to join the stream's publisher now: `Ok(None)` when there is
    /// none (yet), `Err` when the stream is there but must not be used.
    pub fn try_connect(&mut self) -> Result<Option<(u64, u32)>, IpcError> {
        let r = self.try_join();
        self.refused = r.as_ref().err().map(IpcError::clone_checks);
        r
    }

    /// Tries to join the stream's publisher.
    fn try_join(&mut self) -> Result<Option<(u64, u32)>, IpcError> {
        if self.joined.is_some() {
            return Ok(None);
        }
        if !private_dir(&self.dir, self.owner, false)? {
            return Ok(None);
        }
        let Some(f) = open_nofollow(&self.path)? else {
            return Ok(None);
        };
        let meta = f.metadata().map_err(|source| IpcError::Io {
            path: self.path.clone(),
            source,
        })?;
        if !meta.is_file() {
            return Err(IpcError::UnsafeFile {
                path: self.path.clone(),
                why: "is not a regular file".into(),
            });
        }
        check_owner(&self.path, meta.uid(), meta.mode(), self.owner)?;
        let len = meta.len() as usize;
        // The header is read, not mapped, and the length it implies checked
        // against fstat before anything is mapped: a short file is an error.
        let truncated = |need: usize| IpcError::Truncated {
            path: self.path.clone(),
            len: len as u64,
            need: need as u64,
        };
        if len < SLOTS_OFF {
            return Err(truncated(SLOTS_OFF));
        }
        let Some(h) = read_header(&f) else {
            return Err(truncated(SLOTS_OFF));
        };
        let hw = |off: usize| h[off / 8];
        if hw(H_MAGIC) != MAGIC || hw(H_VERSION) != VERSION || hw(H_STATE) != STATE_LIVE {
            return Ok(None);
        }
        let (ring, slots, max_payload) = (
            hw(H_RING) as usize,
            hw(H_SLOTS) as usize,
            hw(H_MAX_PAYLOAD) as usize,
        );
        if !ring.is_power_of_two()
            || ring > 1 << 40
            || slots == 0
            || slots > 1024
            || max_payload > ring / 4
        {
            return Ok(None);
        }
        let data = data_off(slots);
        if data + ring + 64 > len {
            return Err(truncated(data + ring + 64));
        }
        let map = if is_hugetlbfs(&self.dir) {
            // Huge pages cannot be mapped from an offset inside one.
            Shm::map(&f)
        } else {
            Shm::map_split(&f, data, len)
        };
        let shm = map.map_err(|source| IpcError::Io {
            path: self.path.clone(),
            source,
        })?;
        // ORDERING: Acquire pairs with the publisher's Release of H_STATE (header fields) and of H_TAIL (frames before it).
        let w = |off| shm.word(off).load(Ordering::Acquire);
        let (pid, pid_start) = (w(H_PID), w(H_PID_START));
        if w(H_STATE) != STATE_LIVE || !alive(pid, pid_start) {
            return Ok(None);
        }
        let me = std::process::id() as u64;
        let my_start = process_start(me as u32).unwrap_or(0);
        let Some(slot) = (0..slots).find(|&i| {
            let s = slot_off(i);
            shm.word(s + S_STATE)
                // ORDERING: AcqRel CAS reserves a free slot (DROPPED = not counted by the publisher yet); pid, start and position are written Relaxed and published by the Release store of LIVE below.
                .compare_exchange(SLOT_FREE, SLOT_DROPPED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        }) else {
            return Ok(None);
        };
        let s = slot_off(slot);
        shm.word(s + S_PID).store(me, Ordering::Relaxed);
        shm.word(s + S_PID_START).store(my_start, Ordering::Relaxed);
        let tail0 = w(H_TAIL);
        shm.word(s + S_POS).store(tail0, Ordering::Relaxed);
        shm.word(s + S_STATE).store(SLOT_LIVE, Ordering::Release);
        // ORDERING: see IpcPublisher::refresh_limit.
        fence(Ordering::SeqCst);
        let pos = w(H_TAIL);
        shm.word(s + S_POS).store(pos, Ordering::Release);
        let session = w(H_SESSION);
        self.scratch = vec![0u8; max_payload.next_multiple_of(8)];
        self.joined = Some(Joined {
            ino: meta.ino(),
            file: f,
            data,
            ring,
            log2: ring.trailing_zeros(),
            mask: ring as u64 - 1,
            max_payload,
            drop_mode: w(H_FLOW) == 1,
            slot,
            pid,
            pid_start,
            pos,
            shm,
        });
        Ok(Some((session, pid as u32)))
    }

    fn leave(&mut self) {
        if let Some(j) = self.joined.take() {
            let s = slot_off(j.slot);
            let _ = j
                .shm
                .word(s + S_STATE)
                // ORDERING: AcqRel: our last position store happens before the slot is seen free.
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |st| {
                    (st != SLOT_FREE).then_some(SLOT_FREE)
                });
        }
    }

    /// Whether the joined publisher is gone; `Some(clean)` if so.
    fn publisher_gone(&self) -> Option<bool> {
        let j = self.joined.as_ref()?;
        // ORDERING: Acquire pairs with the publisher's Release of CLOSED after its last frame.
        if j.shm.word(H_STATE).load(Ordering::Acquire) == STATE_CLOSED {
            return Some(true);
        }
        if !alive(j.pid, j.pid_start) || inode(&self.path) != Some(j.ino) {
            return Some(false);
        }
        None
    }

    /// Whether the joined stream's file is shorter than our mapping.
    fn truncated(&self) -> bool {
        self.joined.as_ref().is_some_and(|j| {
            j.file
                .metadata()
                .is_ok_and(|m| m.len() < j.shm.len() as u64)
        })
    }

    /// Delivers up to `fragment_limit` messages to `handler`, in order;
    /// returns how many. Never blocks, and never fails: what happens to the
    /// connection (joined, dropped, publisher gone, a corrupt stream, after
    /// which it rejoins by itself) is an [`IpcEvent`] for
    /// [`poll_event`](Self::poll_event). `now` is the turn's reading of
    /// [`Mono`], as every transport takes it; it only paces the looks for a
    /// publisher (joining, and whether it is gone, at most every
    /// `liveness_ms`), so a spinning loop may pass one read for many turns.
    #[inline]
    pub fn poll(
        &mut self,
        now: Mono,
        mut handler: impl FnMut(Message<'_>),
        fragment_limit: usize,
    ) -> Result<usize, std::convert::Infallible> {
        let now = now.as_nanos();
        let liveness_ns = self.liveness_ns;
        let due = |last: Option<u64>| last.is_none_or(|t| now.saturating_sub(t) >= liveness_ns);
        let Some(j) = self.joined.as_mut() else {
            if due(self.last_check) {
                self.last_check = Some(now);
                if let Ok(Some((session, publisher_pid))) = self.try_connect() {
                    self.event(IpcEvent::Connected {
                        session,
                        publisher_pid,
                    });
                }
            }
            return Ok(0);
        };
        let n = if j.drop_mode {
            Self::poll_copy(j, &mut self.scratch, fragment_limit, &mut handler)
        } else {
            Self::poll_in_place(j, fragment_limit, &mut handler)
        };
        match n {
            Ok((0, None)) => {
                self.idle_polls += 1;
                if self.idle_polls >= 1024 {
                    self.idle_polls = 0;
                    if due(self.last_check) {
                        self.last_check = Some(now);
                        if self.truncated() {
                            self.leave();
                            self.event(IpcEvent::Corrupt("the stream file was truncated"));
                        } else if let Some(clean) = self.publisher_gone() {
                            // Deliver what is left first: after CLOSED
                            // (Release after the last frame) every frame is
                            // visible, so a drained ring is complete.
                            self.leave();
                            self.event(IpcEvent::PublisherGone { clean });
                        }
                    }
                }
                Ok(0)
            }
            Ok((n, dropped)) => {
                self.idle_polls = 0;
                if let Some(skipped_bytes) = dropped {
                    self.event(IpcEvent::Dropped { skipped_bytes });
                }
                Ok(n)
            }
            Err(why) => {
                self.leave();
                self.event(IpcEvent::Corrupt(why));
                Ok(0)
            }
        }
    }

    /// The next lifecycle event, oldest first.
    pub fn poll_event(&mut self) -> Option<IpcEvent> {
        (!self.events.is_empty()).then(|| self.events.remove(0))
    }

    /// Queues `e`, discarding the oldest when [`EVENTS`] wait.
    #[cold]
    fn event(&mut self, e: IpcEvent) {
        if self.events.is_full() {
            self.events.remove(0);
        }
        self.events.push(e);
    }

    /// Reads the header at `j.pos`; `Err` when it breaks the protocol.
    #[inline(always)]
    fn header(j: &Joined) -> Result<Head, &'static str> {
        let off = (j.pos & j.mask) as usize;
        // ORDERING: Acquire pairs with the publisher's Release store of the
        // header: the payload and the zeroed next header are visible.
        let h = j.shm.word_unchecked(j.data + off).load(Ordering::Acquire);
        if h == 0 {
            return Ok(Head::Empty);
        }
        let tag = h >> 48;
        let want = lap_tag(j.pos, j.log2);
        if tag != want {
            // Later lap: overtaken. Earlier lap: not written yet.
            let later = tag.wrapping_sub(want) & 0x7FFF < 0x4000;
            return Ok(if later { Head::Overtaken } else { Head::Empty });
        }
        let len = (h & 0xFFFF_FFFF) as usize;
        let msg_type = (h >> 32) as u16;
        let bytes = if msg_type == PAD_TYPE {
            HEADER_LEN + len
        } else {
            frame_len(len)
        };
        if (msg_type != PAD_TYPE && len > j.max_payload) || off + bytes > j.ring || bytes % 8 != 0 {
            return Err("a frame header runs outside the ring");
        }
        Ok(Head::Frame {
            msg_type,
            len,
            bytes: bytes as u64,
        })
    }

    fn publish_pos(j: &Joined) {
        // ORDERING: Release: the publisher that reads this position
        // (Acquire) may overwrite everything before it; our reads of it
        // happen before.
        j.shm
            .word(slot_off(j.slot) + S_POS)
            .store(j.pos, Ordering::Release);
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    fn poll_in_place(
        j: &mut Joined,
        limit: usize,
        f: &mut impl FnMut(Message<'_>),
    ) -> Result<(usize, Option<u64>), &'static str> {
        let mut n = 0;
        let start = j.pos;
        while n < limit {
            let (msg_type, len, bytes) = match Self::header(j)? {
                Head::Empty => break,
                Head::Overtaken => {
                    return Err(
                        "overtaken by the publisher in a stream that blocks for subscribers",
                    )
                }
                Head::Frame {
                    msg_type,
                    len,
                    bytes,
                } => (msg_type, len, bytes),
            };
            if msg_type != PAD_TYPE {
                let off = j.data + (j.pos & j.mask) as usize + HEADER_LEN;
                // SAFETY: inside the ring (checked in header); in Block mode
                // the publisher does not write this frame again before our
                // position, published after the callback, passes it.
                let payload = unsafe { j.shm.slice(off, len) };
                f(Message { msg_type, payload });
                n += 1;
            }
            j.pos += bytes;
        }
        if j.pos != start {
            Self::publish_pos(j);
        }
        Ok((n, None))
    }

    /// As [`poll_in_place`](Self::poll_in_place), copying; the second
    /// value is the bytes skipped when it found itself dropped.
    fn poll_copy(
        j: &mut Joined,
        scratch: &mut [u8],
        limit: usize,
        f: &mut impl FnMut(Message<'_>),
    ) -> Result<(usize, Option<u64>), &'static str> {
        let mut n = 0;
        let start = j.pos;
        let slot_state = slot_off(j.slot) + S_STATE;
        while n < limit {
            let h = match Self::header(j) {
                Ok(h) => h,
                // In Drop mode a torn view of an overwritten header is
                // possible; the slot tells whether we were dropped.
                Err(why) => {
                    // ORDERING: Acquire pairs with the publisher's AcqRel mark of DROPPED.
                    if j.shm.word(slot_state).load(Ordering::Acquire) == SLOT_DROPPED {
                        Head::Overtaken
                    } else {
                        return Err(why);
                    }
                }
            };
            let dropped = match h {
                Head::Empty => break,
                Head::Overtaken => true,
                Head::Frame {
                    msg_type,
                    len,
                    bytes,
                } => {
                    if msg_type != PAD_TYPE {
                        let off = j.data + (j.pos & j.mask) as usize + HEADER_LEN;
                        j.shm
                            .copy_racy(off, &mut scratch[..len.next_multiple_of(8)]);
                    }
                    // ORDERING: Acquire fence after the relaxed copies,
                    // pairs with the publisher's Release fence after marking
                    // us dropped: if the copy saw any later write, we see
                    // DROPPED here.
                    fence(Ordering::Acquire);
                    if j.shm.word(slot_state).load(Ordering::Relaxed) == SLOT_DROPPED {
                        true
                    } else {
                        if msg_type != PAD_TYPE {
                            f(Message {
                                msg_type,
                                payload: &scratch[..len],
                            });
                            n += 1;
                        }
                        j.pos += bytes;
                        false
                    }
                }
            };
            if dropped {
                // Rejoin at the newest frame.
                let s = slot_off(j.slot);
                // ORDERING: rejoin as at join: position Relaxed, published by the Release of LIVE; the SeqCst fence pairs with the one in refresh_limit (see the module docs).
                let tail = j.shm.word(H_TAIL).load(Ordering::Acquire);
                j.shm.word(s + S_POS).store(tail, Ordering::Relaxed);
                j.shm.word(s + S_STATE).store(SLOT_LIVE, Ordering::Release);
                fence(Ordering::SeqCst);
                let now = j.shm.word(H_TAIL).load(Ordering::Acquire);
                let skipped = now.saturating_sub(j.pos);
                j.pos = now;
                Self::publish_pos(j);
                return Ok((n, Some(skipped)));
            }
        }
        if j.pos != start {
            Self::publish_pos(j);
        }
        Ok((n, None))
    }
}

impl Drop for IpcSubscriber {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests;
