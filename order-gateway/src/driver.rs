//! Thin driver for the FIX side: owns the venue link and the journal file, moves bytes
//! between them and the I/O-free [`Gateway`], and applies the write-ahead order (journal,
//! then FIX, then engine responses). Engine frames come in through
//! [`FixDriver::engine_message`] (or [`FixDriver::stage_engine_message`] plus
//! [`FixDriver::flush_with`] to batch) from whoever owns the engine transport.
//!
//! The venue link is a [`VenueLink`]: [`TcpLink`] for a real venue, or the in-process
//! [`crate::sim::SimVenue`] for benchmarks.
//!
//! An I/O shell: it decides nothing. What to send and journal is the core's
//! ([`Gateway`]); when to probe a failed journal and when to retry a failed rotation is
//! [`JournalHealth`]'s. Time comes in as a [`Now`] read once per turn: the service's loop
//! passes it ([`FixDriver::poll_with`], [`FixDriver::start_connect_at`],
//! [`FixDriver::poll_connect_at`]), and the driver hands the venue link the turn's [`Mono`]
//! for its deadlines (a connect's, a write stall's); the entry points
//! for tools and tests that take none ([`FixDriver::engine_message`], [`FixDriver::poll`],
//! [`FixDriver::poll_connect`], [`FixDriver::stop`], the recovery at open) are a turn of
//! their own and read the driver's one clock ([`FixDriver::set_clock`]) once.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::checkpoint_writer::{CheckpointJob, WriterError, Written};
use crate::config::Config;
use crate::fix::SessionConfig;
use crate::gateway::{EngineFrame, EngineId, Gateway, Outputs};
use crate::journal::{FsyncPolicy, Journal, JournalError, RecoveryStats};
use crate::proto::{RejectReason, Response};

/// An error with its causes, on one line.
fn anyhow_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
use crate::journal_health::JournalHealth;
use crate::risk::{RiskConfig, RiskConfigError};
use rocebus::clock::{Mono, Now, Wall};

/// Driver errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// Journal open/append failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Risk configuration rejected.
    #[error(transparent)]
    Risk(#[from] RiskConfigError),
    /// Connecting to the venue failed.
    #[error("connect to FIX venue at {addr}")]
    Connect {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// Socket read/write failed.
    #[error("FIX socket")]
    Io(#[source] io::Error),
    /// The journal cannot be written just now (degraded mode): the venue stays disconnected.
    #[error("the journal cannot be written (disk full or failing); waiting for it to recover")]
    JournalUnavailable,
    /// A checkpoint in the journal could not be read.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

/// Why an operator command ([`FixDriver::operator_command`]) was not acknowledged.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The journal was already known to be unwritable: the command was not run.
    #[error(
        "the journal cannot be written (disk full or failing): nothing changed; no request \
         is taken while it is; send the command again once `status` shows the journal ok"
    )]
    JournalUnavailable,
    /// Appending the command's records failed: they were rolled back and the core rebuilt
    /// from the journal, so nothing changed.
    #[error(
        "the command could not be journaled: nothing changed; the gateway takes no request \
         until the journal is writable again; send the command again once `status` shows \
         the journal ok"
    )]
    Append(#[source] JournalError),
    /// The records were appended but the sync failed: the command is in effect now, but it
    /// survives a crash only if the disk kept it.
    #[error(
        "the command was journaled but the journal could not be synced: it is in effect \
         now and may not survive a crash; send it again once `status` shows the journal ok"
    )]
    Sync(#[source] JournalError),
    /// The core could not be rebuilt after the failure (the gateway must stop).
    #[error(transparent)]
    Driver(#[from] DriverError),
}

/// What a clean stop ([`FixDriver::stop`]) did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StopReport {
    /// A FIX Logout was sent to the venue.
    pub logout_sent: bool,
    /// The session ended within the wait: the venue answered with its Logout (or, less
    /// politely, closed the connection).
    pub logout_answered: bool,
    /// A checkpoint started a new journal segment.
    pub checkpoint: bool,
}

/// What a [`VenueLink::read`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkRead {
    /// `n` bytes were read.
    Data(usize),
    /// Nothing arrived within the wait.
    Idle,
    /// The link is closed (EOF or error).
    Closed,
}

/// The byte pipe to the venue. Implementations do no FIX: the session lives in [`Gateway`].
///
/// Nothing here may wait on the venue: [`open`](Self::open) starts a connect that
/// [`poll_open`](Self::poll_open) completes, and [`write_all`](Self::write_all) queues what
/// the socket cannot take now for [`poll_write`](Self::poll_write).
///
/// Nothing here reads a clock either: the calls that have a deadline (a connect's, a write
/// stall's) are handed the caller's turn time, a [`Mono`].
pub trait VenueLink {
    /// Starts opening the link (a TCP connect) at `now`; it is open once
    /// [`is_open`](Self::is_open) says so ([`poll_open`](Self::poll_open) drives it). An
    /// error: this attempt failed.
    fn open(&mut self, now: Mono) -> io::Result<()>;
    /// Drives an open under way at `now` without blocking: `Ok(true)` once open,
    /// `Ok(false)` while still connecting, an error if the attempt failed or passed its
    /// deadline.
    fn poll_open(&mut self, now: Mono) -> io::Result<bool> {
        let _ = now;
        Ok(self.is_open())
    }
    /// True while an open is under way.
    fn is_opening(&self) -> bool {
        false
    }
    /// Closes it without a goodbye (as a crash would).
    fn close(&mut self);
    /// True while open.
    fn is_open(&self) -> bool;
    /// Reads what is there, waiting at most `wait` (`Duration::ZERO`: never blocks).
    fn read(&mut self, buf: &mut [u8], wait: Duration) -> LinkRead;
    /// Sends all of `bytes` at `now`, in order after anything queued: what the venue cannot
    /// take now waits in the link (bounded); an error closes the link.
    fn write_all(&mut self, bytes: &[u8], now: Mono) -> io::Result<()>;
    /// Moves queued bytes to the venue at `now` without blocking; an error (the venue took
    /// nothing for too long) closes the link.
    fn poll_write(&mut self, now: Mono) -> io::Result<()> {
        let _ = now;
        Ok(())
    }
    /// Where it goes, for messages.
    fn describe(&self) -> String;
}

/// A TCP connection to a FIX acceptor. Connects and writes never block: a connect has
/// [`CONNECT_TIMEOUT`] to complete, and bytes the socket cannot take wait in a queue of at
/// most `max_unsent` bytes; a venue that lets the queue fill, or takes nothing from it for
/// [`WRITE_STALL`], is disconnected (the FIX session then resends from its sequence
/// numbers after the reconnect).
#[derive(Debug)]
pub struct TcpLink {
    addr: String,
    stream: Option<TcpStream>,
    /// A connect under way.
    connecting: Option<Connecting>,
    /// The socket's current mode, so switching costs a syscall only when it changes.
    nonblocking: bool,
    /// Bytes written but not yet taken by the socket, from `unsent_pos`.
    unsent: Vec<u8>,
    unsent_pos: usize,
    /// Since when queued bytes have made no progress.
    stalled_since: Option<Mono>,
    max_unsent: usize,
    /// Links dropped because the venue did not read (queue full or stalled).
    write_stalls: u64,
}

#[derive(Debug)]
struct Connecting {
    stream: TcpStream,
    /// Addresses left to try after this one.
    rest: Vec<SocketAddr>,
    deadline: Mono,
}

/// How long a connect may take before it counts as failed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long queued bytes may wait for the venue to take any before the link counts as dead.
pub const WRITE_STALL: Duration = Duration::from_secs(5);
pub use crate::config::DEFAULT_MAX_UNSENT;

/// Starts a non-blocking connect to `a`; `Ok(Ok(stream))` if it completed at once.
fn start_connect(a: SocketAddr) -> io::Result<TcpStream> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    let family = if a.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    match rustix::net::connect(&fd, &a) {
        Ok(()) | Err(rustix::io::Errno::INPROGRESS) => Ok(TcpStream::from(fd)),
        Err(e) => Err(e.into()),
    }
}

impl TcpLink {
    /// A link to `addr` (`host:port`), not yet open. Use an IP address: a host name is
    /// looked up (a blocking call) at each connect attempt.
    pub fn new(addr: &str) -> TcpLink {
        TcpLink {
            addr: addr.to_owned(),
            stream: None,
            connecting: None,
            nonblocking: false,
            unsent: Vec::new(),
            unsent_pos: 0,
            stalled_since: None,
            max_unsent: DEFAULT_MAX_UNSENT,
            write_stalls: 0,
        }
    }

    /// Bounds the bytes queued for a venue that is not reading (at least 64 KiB).
    pub fn with_max_unsent(mut self, bytes: usize) -> TcpLink {
        self.max_unsent = bytes.max(64 << 10);
        self
    }

    /// Links dropped because the venue stopped reading (queue full, or no progress for
    /// [`WRITE_STALL`]).
    pub fn write_stalls(&self) -> u64 {
        self.write_stalls
    }

    /// Bytes queued for the venue now.
    pub fn unsent(&self) -> usize {
        self.unsent.len() - self.unsent_pos
    }

    fn set_mode(&mut self, nonblocking: bool) -> io::Result<()> {
        if let Some(s) = &self.stream {
            if self.nonblocking != nonblocking {
                s.set_nonblocking(nonblocking)?;
                self.nonblocking = nonblocking;
            }
        }
        Ok(())
    }

    fn drop_stream(&mut self) {
        self.stream = None;
        self.unsent.clear();
        self.unsent_pos = 0;
        self.stalled_since = None;
    }

    /// Tries the next address at `now`; `Ok(true)` if connected at once.
    fn try_next(&mut self, mut rest: Vec<SocketAddr>, now: Mono) -> io::Result<bool> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing");
        while !rest.is_empty() {
            let a = rest.remove(0);
            match start_connect(a) {
                Ok(stream) => {
                    self.connecting = Some(Connecting {
                        stream,
                        rest,
                        deadline: now + CONNECT_TIMEOUT,
                    });
                    return self.poll_open(now);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Writes queued bytes at `now` until the socket refuses; an error closes the link.
    fn write_queued(&mut self, now: Mono) -> io::Result<()> {
        let Some(s) = &mut self.stream else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        let mut progressed = false;
        while self.unsent_pos < self.unsent.len() {
            match s.write(&self.unsent[self.unsent_pos..]) {
                Ok(0) => {
                    self.drop_stream();
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => {
                    self.unsent_pos += n;
                    progressed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.drop_stream();
                    return Err(e);
                }
            }
        }
        if self.unsent_pos == self.unsent.len() {
            self.unsent.clear();
            self.unsent_pos = 0;
            self.stalled_since = None;
            return Ok(());
        }
        if progressed {
            self.stalled_since = Some(now);
        }
        if now.saturating_since(*self.stalled_since.get_or_insert(now)) > WRITE_STALL {
            self.write_stalls += 1;
            self.drop_stream();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the venue took no bytes for {WRITE_STALL:?}"),
            ));
        }
        Ok(())
    }
}

impl VenueLink for TcpLink {
    fn open(&mut self, now: Mono) -> io::Result<()> {
        self.close();
        let addrs: Vec<SocketAddr> = match self.addr.parse::<SocketAddr>() {
            Ok(a) => vec![a],
            Err(_) => self.addr.to_socket_addrs()?.collect(),
        };
        self.try_next(addrs, now).map(|_| ())
    }

    fn poll_open(&mut self, now: Mono) -> io::Result<bool> {
        let Some(c) = &self.connecting else {
            return Ok(self.stream.is_some());
        };
        // SO_ERROR says whether the attempt failed; a peer address, that it completed.
        let failed = match c.stream.take_error() {
            Ok(None) => None,
            Ok(Some(e)) | Err(e) => Some(e),
        };
        if let Some(e) = failed {
            let rest = self.connecting.take().map(|c| c.rest).unwrap_or_default();
            if rest.is_empty() {
                return Err(e);
            }
            return self.try_next(rest, now);
        }
        match c.stream.peer_addr() {
            Ok(_) => {
                let Some(c) = self.connecting.take() else {
                    return Ok(false);
                };
                c.stream.set_nodelay(true)?;
                self.stream = Some(c.stream);
                self.nonblocking = true;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotConnected => {
                if now < c.deadline {
                    return Ok(false);
                }
                let rest = self.connecting.take().map(|c| c.rest).unwrap_or_default();
                if rest.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer within {CONNECT_TIMEOUT:?}"),
                    ));
                }
                self.try_next(rest, now)
            }
            Err(e) => {
                self.connecting = None;
                Err(e)
            }
        }
    }

    fn is_opening(&self) -> bool {
        self.connecting.is_some()
    }

    fn close(&mut self) {
        self.connecting = None;
        self.drop_stream();
    }

    fn is_open(&self) -> bool {
        self.stream.is_some()
    }

    fn read(&mut self, buf: &mut [u8], wait: Duration) -> LinkRead {
        let prepared = if wait.is_zero() {
            self.set_mode(true)
        } else {
            self.set_mode(false).and_then(|()| match &self.stream {
                Some(s) => s.set_read_timeout(Some(wait)),
                None => Ok(()),
            })
        };
        let Some(s) = &mut self.stream else {
            return LinkRead::Closed;
        };
        if prepared.is_err() {
            self.drop_stream();
            return LinkRead::Closed;
        }
        match s.read(buf) {
            Ok(0) => {
                self.drop_stream();
                LinkRead::Closed
            }
            Ok(n) => LinkRead::Data(n),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                LinkRead::Idle
            }
            Err(_) => {
                self.drop_stream();
                LinkRead::Closed
            }
        }
    }

    fn write_all(&mut self, bytes: &[u8], now: Mono) -> io::Result<()> {
        if self.stream.is_none() {
            return Err(io::ErrorKind::NotConnected.into());
        }
        // Writes never block: the socket takes what it can, the rest queues behind
        // anything already queued (order kept), bounded.
        self.set_mode(true).inspect_err(|_| self.drop_stream())?;
        let mut bytes = bytes;
        if self.unsent() == 0 {
            // The usual case: nothing queued, the socket takes it all, no copy.
            let Some(s) = &mut self.stream else {
                return Err(io::ErrorKind::NotConnected.into());
            };
            while !bytes.is_empty() {
                match s.write(bytes) {
                    Ok(0) => {
                        self.drop_stream();
                        return Err(io::ErrorKind::WriteZero.into());
                    }
                    Ok(n) => bytes = &bytes[n..],
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        self.drop_stream();
                        return Err(e);
                    }
                }
            }
            if bytes.is_empty() {
                return Ok(());
            }
            self.unsent.clear();
            self.unsent_pos = 0;
            self.stalled_since = Some(now);
        } else if self.unsent_pos * 2 >= self.unsent.len() {
            self.unsent.drain(..self.unsent_pos);
            self.unsent_pos = 0;
        }
        if self.unsent() + bytes.len() > self.max_unsent {
            self.write_stalls += 1;
            let queued = self.unsent();
            self.drop_stream();
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "the venue is not reading: {queued} bytes queued, {} more would pass \
                     fix.max_unsent_bytes ({})",
                    bytes.len(),
                    self.max_unsent
                ),
            ));
        }
        self.unsent.extend_from_slice(bytes);
        self.write_queued(now)
    }

    fn poll_write(&mut self, now: Mono) -> io::Result<()> {
        if self.unsent_pos == self.unsent.len() {
            return Ok(());
        }
        self.write_queued(now)
    }

    fn describe(&self) -> String {
        format!("FIX venue at {}", self.addr)
    }
}

/// The FIX driver: gateway core, journal and venue link.
#[derive(Debug)]
pub struct FixDriver<L: VenueLink = TcpLink> {
    gw: Gateway,
    journal: Journal,
    link: L,
    out: Outputs,
    responses: Vec<(EngineId, Response)>,
    rbuf: Vec<u8>,
    /// Private copy of the engine frame being processed (see `stage_engine_message`).
    frame: Vec<u8>,
    recovery: RecoveryStats,
    /// What the core is rebuilt from when an append fails.
    rebuild: Rebuild,
    /// Engine requests staged since the last flush, with the "not taken" reject each gets
    /// if the flush cannot journal them ([`EngineFrame::reject`]).
    batch: Vec<(EngineId, Response)>,
    /// Degraded mode and the rotation back-off: when the journal may be touched again.
    health: JournalHealth,
    /// Engine disconnects staged since the last flush (redone if the flush fails).
    batch_disconnects: Vec<EngineId>,
    /// Cancel-on-disconnects that arrived while degraded, run once the journal is back.
    deferred_disconnects: Vec<EngineId>,
    /// Engines the core cut off (too many malformed frames), for the engine transport to
    /// disconnect ([`pop_kicked`](Self::pop_kicked)).
    kicked: Vec<EngineId>,
    journal_failures: u64,
    /// Start a new segment once the journal is this long (0: never).
    segment_bytes: u64,
    /// Segments started and checkpoint failures.
    segments: SegmentStats,
    /// A venue connect is under way (the Logon goes out when it completes).
    opening: bool,
    /// Where this segment's own records start: its length when it was opened, or the end
    /// of its checkpoint when a switch started it (the records copied after the checkpoint
    /// count toward `segment_bytes`, so a segment stays near it however far the writer
    /// lagged: the next cut comes as soon as the copies alone reach it).
    segment_start: u64,
    /// Engine responses produced by operator commands, delivered at the next flush.
    held: Vec<(EngineId, Response)>,
    /// The time of the current turn: given by the caller ([`poll_with`](Self::poll_with),
    /// [`poll_connect_at`](Self::poll_connect_at)) or read once from `clock` by an entry
    /// point that takes none.
    turn: Now,
    /// The one clock the driver reads, for entry points not handed a [`Now`]
    /// ([`Now::read`] but in the simulator).
    clock: fn() -> Now,
    /// The checkpoint in flight: its cut is journaled and applied, the writer builds it.
    checkpoint: Option<InFlight>,
    /// Run checkpoint jobs in line, this many flushes after the cut (the simulator and
    /// tests: deterministic), instead of on a thread of their own (`None`).
    checkpoint_inline: Option<u32>,
    /// In line: flushes between the writer's answer and the switch (records appended
    /// meanwhile are the switch's to copy).
    switch_delay: u32,
    /// In line: flushes between the switch and its finish (what makes it durable), unless
    /// a synced append finishes it first.
    finish_delay: u32,
    /// How far the writer catches up with the segment before it answers.
    catch_up: crate::journal::CatchUp,
}

/// A checkpoint between its cut and its switch.
#[derive(Debug)]
enum InFlight {
    /// To be run in line once this many more flushes have passed.
    Inline(Box<CheckpointJob>, u32),
    /// Running on its own thread.
    Thread(WriterThread),
    /// Written and caught up (in line), to be switched to once this many more flushes have
    /// passed.
    Ready(Box<Written>, u32),
    /// Switched to: appends go to the new segment; what makes the switch durable (the
    /// journal's pending switch: syncs, seal, link, rename) is being finished on a thread
    /// of its own, or in line (the simulator) once `delay` more flushes have passed, or
    /// by the first synced append, whichever comes first. `failed`: an attempt failed, the
    /// next waits for the rotation back-off.
    Finishing(Finish),
}

/// A switch being made durable ([`InFlight::Finishing`]).
#[derive(Debug, Clone, Copy)]
struct Finish {
    /// In line: flushes to wait before finishing it here.
    delay: u32,
    /// An attempt failed: the next waits for the rotation back-off.
    failed: bool,
    /// When it switched.
    since: Instant,
    /// The new segment's number (the journal is back on the old one if the switch was
    /// undone: [`Journal::finish_switch`]).
    segment: u64,
    /// Where the old segment's own records started, for an undone switch.
    prev_start: u64,
}

/// A checkpoint writer thread and where its answer arrives. Dropped (the driver dropped with
/// a job in flight), it waits for the thread, so no writer outlives its driver and writes
/// `FILE.next` beside a journal another driver has opened since.
#[derive(Debug)]
struct WriterThread {
    rx: std::sync::mpsc::Receiver<Result<Written, WriterError>>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WriterThread {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Journal segments started by this driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentStats {
    /// New segments started (checkpoints written).
    pub rotations: u64,
    /// Checkpoints that failed (the old segment stayed in use).
    pub failures: u64,
    /// Bytes of the last checkpoint record.
    pub last_checkpoint_bytes: u64,
    /// How long the last rotation held the service, nanoseconds (wall time).
    pub last_rotation_ns: u64,
    /// CPU time of the service thread during the last rotation, nanoseconds (the wall
    /// time less waiting for the disk or for a CPU).
    pub last_rotation_cpu_ns: u64,
    /// How long the last rotation's cut (its record appended and applied) held the
    /// service, nanoseconds (wall; CPU in `last_cut_cpu_ns`).
    pub last_cut_ns: u64,
    /// CPU time of the service thread during the last cut, nanoseconds.
    pub last_cut_cpu_ns: u64,
    /// How long the last switch to a new segment held the service, nanoseconds (wall; CPU
    /// in `last_switch_cpu_ns`). `last_rotation_ns` is the longer of cut and switch.
    pub last_switch_ns: u64,
    /// CPU time of the service thread during the last switch, nanoseconds.
    pub last_switch_cpu_ns: u64,
    /// Wall time the checkpoint writer took for the last checkpoint (off the service
    /// thread), nanoseconds.
    pub last_build_ns: u64,
    /// Bytes of records appended after the last cut that the writer copied into the new
    /// segment (off the service thread).
    pub last_caught_up_bytes: u64,
    /// Bytes of records the last switch copied on the service thread (what the writer had
    /// not caught up with).
    pub last_switch_copied_bytes: u64,
    /// Wall time from the last switch until it was durable (its syncs, seal, link and
    /// rename, on a thread of their own but in the simulator), nanoseconds.
    pub last_finish_ns: u64,
}

fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
}

#[derive(Debug)]
struct Rebuild {
    session: SessionConfig,
    risk: RiskConfig,
    path: PathBuf,
}

/// Space a probe reserves past the journal's end before it declares the journal writable.
const PROBE_HEADROOM: u64 = 1 << 20;

/// Orders a cut left out that a turn with work frees after its output has left, beyond as
/// many as became final since the previous sweep (the book adds those): the orders waiting
/// to be freed shrink by at least this much a turn, however fast engines finish orders.
const SWEEP_BUSY: usize = 32;

/// The same for a turn with nothing to journal (the service polls many of those).
const SWEEP_IDLE: usize = 128;

impl FixDriver<TcpLink> {
    /// Opens the journal from `cfg`, recovering state; the venue is `cfg.fix.venue_addr`.
    pub fn open(cfg: &Config) -> Result<FixDriver, DriverError> {
        let link = TcpLink::new(&cfg.fix.venue_addr).with_max_unsent(cfg.fix.max_unsent_bytes);
        let mut d = FixDriver::with_link(
            link,
            cfg.fix.session(),
            &cfg.risk,
            &cfg.journal.path,
            cfg.journal.fsync,
        )?;
        d.set_segment_bytes(cfg.journal.segment_bytes);
        Ok(d)
    }

    /// Opens with explicit parts (tests).
    pub fn open_with(
        addr: &str,
        session: SessionConfig,
        risk: &RiskConfig,
        journal: &Path,
        fsync: FsyncPolicy,
    ) -> Result<FixDriver, DriverError> {
        FixDriver::with_link(TcpLink::new(addr), session, risk, journal, fsync)
    }
}

impl<L: VenueLink> FixDriver<L> {
    /// Opens the journal, recovering state, with `link` as the venue.
    pub fn with_link(
        link: L,
        session: SessionConfig,
        risk: &RiskConfig,
        journal: &Path,
        fsync: FsyncPolicy,
    ) -> Result<FixDriver<L>, DriverError> {
        let os = std::sync::Arc::new(crate::journal::OsStorage);
        FixDriver::with_link_in(os, link, session, risk, journal, fsync)
    }

    /// [`with_link`](Self::with_link) with the journal on `storage` (the simulator's disk).
    pub fn with_link_in(
        storage: std::sync::Arc<dyn crate::journal::Storage>,
        link: L,
        session: SessionConfig,
        risk: &RiskConfig,
        journal: &Path,
        fsync: FsyncPolicy,
    ) -> Result<FixDriver<L>, DriverError> {
        let mut gw = Gateway::new(session.clone(), risk)?;
        if let Some(dir) = journal.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = storage.create_dir_all(dir);
        }
        let (journal_file, recovery) =
            Journal::open_in(storage, journal, fsync, |k, p| gw.replay_record(k, p))?;
        if let Some(e) = gw.take_replay_error() {
            return Err(e.into());
        }
        if recovery.truncated_bytes > 0 {
            tracing::warn!(
                journal = %journal.display(),
                bytes = recovery.truncated_bytes,
                records = recovery.records,
                "cut a torn tail off the journal (an interrupted last write, never synced)"
            );
        } else {
            tracing::info!(journal = %journal.display(), records = recovery.records, "journal replayed");
        }
        let rebuild = Rebuild {
            session,
            risk: risk.clone(),
            path: journal.to_owned(),
        };
        let journal = journal_file;
        let segment_start = journal.len();
        let mut d = FixDriver {
            gw,
            journal,
            link,
            out: Outputs::default(),
            responses: Vec::with_capacity(1024),
            rbuf: vec![0; 1 << 16],
            frame: Vec::with_capacity(1 << 14),
            recovery,
            rebuild,
            batch: Vec::with_capacity(256),
            health: JournalHealth::default(),
            batch_disconnects: Vec::new(),
            deferred_disconnects: Vec::new(),
            kicked: Vec::new(),
            journal_failures: 0,
            segment_bytes: 0,
            segments: SegmentStats::default(),
            segment_start,
            opening: false,
            held: Vec::new(),
            turn: Now::read(),
            clock: Now::read,
            checkpoint: None,
            checkpoint_inline: None,
            switch_delay: 0,
            finish_delay: 0,
            catch_up: crate::journal::CatchUp::default(),
        };
        // Requests whose order message the journal lost with a torn last write never went
        // out: answered now (and journaled), before anything else happens.
        d.close_unsent();
        d.flush()?;
        Ok(d)
    }

    /// Answers the requests replay found without their order message
    /// ([`Gateway::close_unsent`]), when the sync policy proves they never went out: with
    /// group commit nothing leaves before the write that holds it is durable, so a decision
    /// whose message is missing was never sent. With `never` or `every_n` a power loss can
    /// keep the decision and lose the message of an order that did reach the venue: those
    /// stay in doubt, and the logon asks the venue about them (as about any order sent and
    /// not acknowledged).
    fn close_unsent(&mut self) {
        if self.journal.policy() == FsyncPolicy::Group {
            self.gw.close_unsent(&mut self.out);
        } else {
            let n = self.gw.leave_unsent_in_doubt();
            if n > 0 {
                tracing::warn!(
                    requests = n,
                    "requests journaled without their order message, under a sync policy \
                     that may have sent them: the venue is asked about them at logon"
                );
            }
        }
    }

    /// What recovery found in the journal.
    pub fn recovery(&self) -> RecoveryStats {
        self.recovery
    }

    /// The gateway core.
    pub fn gateway(&self) -> &Gateway {
        &self.gw
    }

    /// The venue link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// Runs `f` against the core with the driver's outputs, then flushes them.
    pub fn with_gateway<R>(
        &mut self,
        f: impl FnOnce(&mut Gateway, &mut Outputs) -> R,
    ) -> Result<R, DriverError> {
        let r = f(&mut self.gw, &mut self.out);
        self.flush()?;
        Ok(r)
    }

    /// True while the venue link is open.
    pub fn is_connected(&self) -> bool {
        self.link.is_open()
    }

    /// Connects to the venue and sends Logon, waiting for the connect (at most
    /// [`CONNECT_TIMEOUT`]): for tests and tools. The service uses
    /// [`start_connect`](Self::start_connect) and [`poll_connect`](Self::poll_connect),
    /// which never wait. Refused while the journal cannot be written: nothing the venue
    /// sends could be recorded.
    pub fn connect(&mut self) -> Result<(), DriverError> {
        self.start_connect()?;
        while !self.poll_connect()? {
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Starts connecting to the venue without waiting; the Logon goes out when
    /// [`poll_connect`](Self::poll_connect) finds the link open.
    pub fn start_connect(&mut self) -> Result<(), DriverError> {
        let now = self.read_clock();
        self.start_connect_at(now)
    }

    /// [`start_connect`](Self::start_connect) at `now` (the connect's deadline runs from
    /// it).
    pub fn start_connect_at(&mut self, now: Now) -> Result<(), DriverError> {
        self.turn = now;
        if self.health.is_degraded() {
            return Err(DriverError::JournalUnavailable);
        }
        self.opening = true;
        if let Err(source) = self.link.open(now.mono) {
            self.opening = false;
            return Err(DriverError::Connect {
                addr: self.link.describe(),
                source,
            });
        }
        Ok(())
    }

    /// True while a connect started by [`start_connect`](Self::start_connect) is under way.
    pub fn is_connecting(&self) -> bool {
        self.opening
    }

    /// Drives a connect under way without blocking: `Ok(true)` when it completed now (the
    /// Logon was sent), `Ok(false)` while it goes on or when none is under way, an error
    /// when the attempt failed or timed out.
    pub fn poll_connect(&mut self) -> Result<bool, DriverError> {
        let now = self.read_clock();
        self.poll_connect_at(now)
    }

    /// [`poll_connect`](Self::poll_connect) at `now` (the Logon's SendingTime and the
    /// session's timers start from it).
    pub fn poll_connect_at(&mut self, now: Now) -> Result<bool, DriverError> {
        self.turn = now;
        let mono = now.mono;
        let now = now.wall.as_nanos();
        if !self.opening {
            return Ok(false);
        }
        match self.link.poll_open(mono) {
            Ok(false) => Ok(false),
            Ok(true) => {
                self.opening = false;
                self.gw.on_connect(now, &mut self.out);
                self.flush()?;
                Ok(true)
            }
            Err(source) => {
                self.opening = false;
                self.link.close();
                Err(DriverError::Connect {
                    addr: self.link.describe(),
                    source,
                })
            }
        }
    }

    /// Closes the connection without a logout (as a crash would).
    pub fn drop_connection(&mut self) {
        self.opening = false;
        self.link.close();
        self.gw.on_disconnect();
    }

    /// One engine frame, flushed at once.
    pub fn engine_message(&mut self, engine: EngineId, bytes: &[u8]) -> Result<(), DriverError> {
        let now = self.read_clock();
        self.stage_engine_message(engine, bytes, now.wall);
        self.flush()
    }

    /// One engine frame, processed but not flushed: call [`flush_with`](Self::flush_with)
    /// after a batch (one journal write and one venue write for the batch).
    ///
    /// `bytes` may live in memory the engine can still write (its RDMA-writable ring): they
    /// are copied once into private memory first, and the journal's checksum and every
    /// decision are made on that copy, so the journal records exactly what was decided.
    ///
    /// While the journal cannot be written the request is not taken: it is answered with an
    /// unnumbered `JournalUnavailable` reject at the flush, and the engine may send it again.
    pub fn stage_engine_message(&mut self, engine: EngineId, bytes: &[u8], now: Wall) {
        let now = now.as_nanos();
        self.frame.clear();
        self.frame.extend_from_slice(bytes);
        // Decoded once, here; the core takes the value.
        let f = EngineFrame::decode(&self.frame);
        self.batch
            .push((engine, f.reject(RejectReason::JournalUnavailable)));
        if !self.health.is_degraded() {
            self.gw.on_engine_frame(engine, &f, now, &mut self.out);
        }
    }

    /// Cancel-on-disconnect for `engine`, processed but not flushed (deferred until the
    /// journal is writable again if it is not).
    pub fn stage_engine_disconnect(&mut self, engine: EngineId, now: Wall) {
        let now = now.as_nanos();
        if self.health.is_degraded() {
            self.deferred_disconnects.push(engine);
        } else {
            self.batch_disconnects.push(engine);
            self.gw.on_engine_disconnect(engine, now, &mut self.out);
        }
    }

    /// True while the journal cannot be written: requests are answered "not taken" and the
    /// venue stays disconnected until a probe succeeds.
    pub fn is_degraded(&self) -> bool {
        self.health.is_degraded()
    }

    /// Journal appends that failed (each put the gateway in degraded mode).
    pub fn journal_failures(&self) -> u64 {
        self.journal_failures
    }

    /// In degraded mode, when [`JournalHealth`] says a probe is due: can the journal be
    /// written again?
    fn probe(&mut self) {
        let t = self.turn.mono;
        if !self.health.poll_probe(t) {
            return;
        }
        let now = self.turn.wall.as_nanos();
        let ok = self.journal.probe(PROBE_HEADROOM).is_ok();
        self.health.handle_probe(ok, t);
        if ok {
            tracing::warn!("journal writable again: taking requests, reconnecting the venue");
            // Requests never sent that the start could not journal as such (the journal
            // failed then), and none else: every failed append was rolled back whole.
            self.close_unsent();
            for engine in std::mem::take(&mut self.deferred_disconnects) {
                self.gw.on_engine_disconnect(engine, now, &mut self.out);
            }
        }
    }

    /// Runs `f` against the core without flushing (market data; operator commands
    /// go through [`operator_command`](Self::operator_command)).
    pub fn stage<R>(&mut self, f: impl FnOnce(&mut Gateway, &mut Outputs) -> R) -> R {
        f(&mut self.gw, &mut self.out)
    }

    /// Runs an operator command (kill switch, cancel-all) against the core and returns only
    /// once its journal records are durable (appended and synced, whatever the sync policy):
    /// an operator is never told "done" about something a crash can undo. What it sends to
    /// the venue leaves after that; its engine responses go with the next flush.
    ///
    /// Refused while the journal is known to be unwritable (the command is not run: nothing
    /// changes, and no request is taken meanwhile anyway). If the append fails, it is rolled
    /// back and the core rebuilt from the journal, as for any failed batch: the command did
    /// not happen, and the operator sends it again once the journal is writable. Anything
    /// staged before goes in its own batch first, so this command's failure takes nothing
    /// else with it.
    pub fn operator_command<R>(
        &mut self,
        f: impl FnOnce(&mut Gateway, &mut Outputs) -> R,
    ) -> Result<R, CommandError> {
        if self.health.is_degraded() {
            return Err(CommandError::JournalUnavailable);
        }
        let mut held = std::mem::take(&mut self.held);
        let r = self.flush_into(&mut |e, r| held.push((e, *r)));
        held.append(&mut self.held);
        self.held = held;
        r?;
        if self.health.is_degraded() {
            return Err(CommandError::JournalUnavailable);
        }
        let result = f(&mut self.gw, &mut self.out);
        if self.out.journal_records > 0 {
            let mut held = std::mem::take(&mut self.held);
            let mut keep = |e: EngineId, r: &Response| held.push((e, *r));
            // One synced append: if it fails, nothing of the command stays in the journal
            // the core is rebuilt from (an append then a separate sync left it there when
            // the sync failed: the rebuilt core held the command and its cancels, never sent;
            // simulator seed 4809).
            if let Err(e) = self
                .journal
                .append_durable(&self.out.journal, self.out.journal_records)
            {
                let r = self.journal_failed(&e, &mut keep);
                self.held = held;
                r?;
                return Err(match e {
                    JournalError::Sync(e) => CommandError::Sync(JournalError::Sync(e)),
                    e => CommandError::Append(e),
                });
            }
            self.held = held;
            self.out.journal.clear();
            self.out.journal_records = 0;
        }
        // The FIX it produced goes out now; responses wait in `held` for the next flush.
        let mut held = std::mem::take(&mut self.held);
        let r = self.flush_into(&mut |e, r| held.push((e, *r)));
        held.append(&mut self.held);
        self.held = held;
        r?;
        Ok(result)
    }

    /// Clean stop: logs out of the venue and waits at most `wait` for its Logout (reading
    /// and journaling what it sends meanwhile), closes the link, syncs the journal and
    /// writes a checkpoint ([`checkpoint_at_stop`](Self::checkpoint_at_stop)), so the next
    /// start resumes the same sequence numbers from one record. Engine responses produced
    /// meanwhile go to `deliver`.
    pub fn stop(
        &mut self,
        wait: Duration,
        mut deliver: impl FnMut(EngineId, &Response),
    ) -> Result<StopReport, DriverError> {
        use crate::fix::SessionState;
        let mut report = StopReport::default();
        self.opening = false;
        if self.link.is_open() && self.gw.session().state() == SessionState::Active {
            let now = self.read_clock();
            self.gw.logout(now.wall.as_nanos(), &mut self.out);
            self.flush_into(&mut deliver)?;
            report.logout_sent = true;
            let deadline = now.mono + wait;
            // One turn per pass, each with its one clock read.
            while self.link.is_open() && self.read_clock().mono < deadline {
                if let Err(e) = self.link.poll_write(self.turn.mono) {
                    tracing::warn!(venue = %self.link.describe(), error = %e, "venue link dropped");
                    self.gw.on_disconnect();
                    break;
                }
                self.read_venue(Duration::from_millis(10), self.turn.wall.as_nanos());
                self.flush_into(&mut deliver)?;
                if self.gw.session().state() == SessionState::Disconnected {
                    report.logout_answered = true;
                    break;
                }
            }
            if !report.logout_answered {
                tracing::warn!(?wait, "the venue did not answer our Logout in time");
            }
        }
        self.link.close();
        self.gw.on_disconnect();
        self.flush_into(&mut deliver)?;
        self.sync()?;
        let before = self.segments.rotations;
        self.checkpoint_at_stop();
        report.checkpoint = self.segments.rotations > before;
        Ok(report)
    }

    /// Waits up to `timeout` for venue bytes, processes them and the timers, and queues the
    /// engine responses for [`take_engine_responses`](Self::take_engine_responses).
    pub fn poll(&mut self, timeout: Duration) -> Result<(), DriverError> {
        let now = self.read_clock().wall.as_nanos();
        if self.link.is_open() {
            self.read_venue(timeout.max(Duration::from_micros(10)), now);
        } else {
            std::thread::sleep(timeout);
        }
        self.probe();
        self.run_timers(now);
        self.flush()
    }

    /// The gateway's timers, when one is due ([`Gateway::poll_timeout`]): most turns have
    /// none, and skipping them changes nothing (`on_timer` does nothing before its time).
    fn run_timers(&mut self, now: u64) {
        if self.gw.poll_timeout().is_some_and(|t| now >= t.as_nanos()) {
            self.gw.on_timer(now, &mut self.out);
        }
    }

    /// One non-blocking pass over the venue link and the timers at `now`; the engine
    /// responses produced (here and by staged calls) go to `deliver`, in order. Returns the
    /// number of venue bytes read (work done, for the idle strategy).
    pub fn poll_with(
        &mut self,
        now: Now,
        deliver: impl FnMut(EngineId, &Response),
    ) -> Result<usize, DriverError> {
        self.turn = now;
        let now = now.wall.as_nanos();
        let n = if self.link.is_open() {
            if let Err(e) = self.link.poll_write(self.turn.mono) {
                tracing::warn!(venue = %self.link.describe(), error = %e, "venue link dropped");
                self.gw.on_disconnect();
            }
            self.read_venue(Duration::ZERO, now)
        } else {
            0
        };
        self.probe();
        self.run_timers(now);
        self.flush_with(deliver)?;
        Ok(n)
    }

    /// The time of this turn, read from the driver's one clock: for the entry points that
    /// are not handed a [`Now`] (each is a turn of its own).
    fn read_clock(&mut self) -> Now {
        self.turn = (self.clock)();
        self.turn
    }

    fn read_venue(&mut self, wait: Duration, now: u64) -> usize {
        match self.link.read(&mut self.rbuf, wait) {
            LinkRead::Data(n) => {
                self.gw.on_fix_bytes(&self.rbuf[..n], now, &mut self.out);
                n
            }
            LinkRead::Idle => 0,
            LinkRead::Closed => {
                self.gw.on_disconnect();
                0
            }
        }
    }

    /// Write-ahead: journal first, then FIX; engine responses queue for
    /// [`take_engine_responses`](Self::take_engine_responses).
    fn flush(&mut self) -> Result<(), DriverError> {
        let mut responses = std::mem::take(&mut self.responses);
        let r = self.flush_into(&mut |e, r| responses.push((e, *r)));
        self.responses = responses;
        r
    }

    /// Write-ahead: journal first, then FIX, then each engine response to `deliver`.
    ///
    /// If the journal cannot be written (disk full, I/O error), the append is rolled back
    /// and nothing of the batch leaves: no FIX message, no response but an unnumbered
    /// `JournalUnavailable` reject for each request of the batch. The core is rebuilt from
    /// the journal (so it holds exactly what is recorded), the venue link is closed, and the
    /// gateway stays degraded until a probe can write again. Only a journal that could not
    /// even be rolled back is an error.
    pub fn flush_with(
        &mut self,
        mut deliver: impl FnMut(EngineId, &Response),
    ) -> Result<(), DriverError> {
        self.flush_into(&mut deliver)
    }

    fn flush_into(
        &mut self,
        deliver: &mut dyn FnMut(EngineId, &Response),
    ) -> Result<(), DriverError> {
        // Durable already (see `operator_command`): they go first, in the order produced.
        for (e, r) in self.held.drain(..) {
            deliver(e, &r);
        }
        let out = &mut self.out;
        let busy = out.journal_records > 0;
        if out.journal_records > 0 {
            if let Err(e) = self.journal.append(&out.journal, out.journal_records) {
                return self.journal_failed(&e, deliver);
            }
        }
        if self.health.is_degraded() {
            // Requests staged while degraded were not taken.
            for (engine, reject) in &self.batch {
                deliver(*engine, reject);
            }
        }
        self.batch.clear();
        self.batch_disconnects.clear();
        let out = &mut self.out;
        if !out.fix.is_empty() && self.link.is_open() {
            if let Err(e) = self.link.write_all(&out.fix, self.turn.mono) {
                tracing::warn!(venue = %self.link.describe(), error = %e, "venue link dropped");
                self.gw.on_disconnect();
            }
        }
        for (e, r) in out.engine.iter().chain(&out.info) {
            deliver(*e, r);
        }
        if out.disconnect {
            self.link.close();
            self.gw.on_disconnect();
        }
        for e in out.kick.drain(..) {
            if !self.kicked.contains(&e) {
                self.kicked.push(e);
            }
        }
        out.clear();
        if self.segment_bytes > 0 {
            if self.checkpoint.is_some() && !self.health.is_degraded() {
                self.finish_checkpoint(false);
            }
            if self.checkpoint.is_none()
                && self.journal.len() - self.segment_start >= self.segment_bytes
                && self.health.poll_rotation(self.turn.mono)
            {
                self.cut();
            }
        }
        // Everything of the turn has left: free some of what cuts left out (bounded, so a
        // cut never costs a turn the orders it dropped; more when the turn had no work).
        self.gw.sweep(if busy { SWEEP_BUSY } else { SWEEP_IDLE });
        Ok(())
    }

    /// Runs checkpoint jobs in line, `Some(n)`: at the flush `n + 1` flushes after their
    /// cut (the simulator and tests: deterministic; the segment grows meanwhile as it does
    /// behind a slow writer), instead of on a thread of their own (`None`, the default).
    pub fn set_checkpoint_inline(&mut self, inline: Option<u32>) {
        self.checkpoint_inline = inline;
    }

    /// In line ([`set_checkpoint_inline`](Self::set_checkpoint_inline)): switches to the
    /// writer's segment this many flushes after it answered (0: at once), so the switch
    /// has records of its own to copy, as behind a writer thread.
    pub fn set_switch_delay(&mut self, flushes: u32) {
        self.switch_delay = flushes;
    }

    /// In line ([`set_checkpoint_inline`](Self::set_checkpoint_inline)): finishes a switch
    /// (its syncs, seal, link, rename) this many flushes after it, unless a synced append
    /// does first; appends go to the new segment meanwhile, as beside the switch's thread.
    pub fn set_finish_delay(&mut self, flushes: u32) {
        self.finish_delay = flushes;
    }

    /// How far the checkpoint writer catches up with the segment before the switch.
    pub fn set_catch_up(&mut self, how: crate::journal::CatchUp) {
        self.catch_up = how;
    }

    /// Whether a checkpoint is in flight (cut journaled, switch not done yet).
    pub fn checkpoint_in_flight(&self) -> bool {
        self.checkpoint.is_some()
    }

    /// Starts a checkpoint: journals a [`record::CUT`](crate::gateway::record::CUT) in an
    /// ordinary append, applies it where it stands (as replay does), and hands the
    /// writer the job of building the checkpoint at the cut from the segment on disk. The
    /// service thread does no pass over the state: the cut's own
    /// ([`Gateway::checkpoint_written`]) visits what changed since the previous cut.
    /// Returns whether a checkpoint is now in flight.
    fn cut(&mut self) -> bool {
        if self.health.is_degraded() || self.checkpoint.is_some() {
            return false;
        }
        let t0 = Instant::now();
        let cpu0 = thread_cpu_ns();
        let at = self.journal.len();
        let mut rec = Vec::with_capacity(16);
        crate::journal::encode_record(&mut rec, crate::gateway::record::CUT, &[]);
        if let Err(e) = self.journal.append(&rec, 1) {
            // Rolled back: nothing of the cut is in the journal, nor applied.
            self.checkpoint_failed(&e);
            return false;
        }
        self.gw.checkpoint_written();
        let job = CheckpointJob {
            fs: self.journal.storage(),
            path: self.rebuild.path.clone(),
            cut: at,
            session: self.rebuild.session.clone(),
            risk: self.rebuild.risk.clone(),
            appended: self.journal.appended(),
            catch_up: self.catch_up,
        };
        self.checkpoint = Some(if let Some(delay) = self.checkpoint_inline {
            InFlight::Inline(Box::new(job), delay)
        } else {
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("gw-checkpoint".into())
                .spawn(move || {
                    let _ = tx.send(job.run(None));
                });
            match spawned {
                Ok(h) => InFlight::Thread(WriterThread {
                    rx,
                    handle: Some(h),
                }),
                Err(e) => {
                    // The cut stays (journaled and applied, as replay will): the next
                    // attempt cuts again.
                    self.checkpoint_failed(&JournalError::Rotate {
                        path: self.rebuild.path.clone(),
                        source: e,
                    });
                    return false;
                }
            }
        });
        self.segments.last_cut_ns = t0.elapsed().as_nanos() as u64;
        self.segments.last_cut_cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
        true
    }

    /// The writer's answer, if it has one (`wait`: waits for it), switched to: returns
    /// whether a new segment was started, `None` if the writer is not done.
    fn finish_checkpoint(&mut self, wait: bool) -> Option<bool> {
        let written = match self.checkpoint.take()? {
            InFlight::Finishing(f) => return self.poll_finish(wait, f),
            InFlight::Inline(job, delay) if delay > 0 && !wait => {
                self.checkpoint = Some(InFlight::Inline(job, delay - 1));
                return None;
            }
            InFlight::Inline(job, _) => match job.run(self.journal.faults_mut()) {
                Ok(w) if self.switch_delay > 0 && !wait => {
                    self.checkpoint = Some(InFlight::Ready(Box::new(w), self.switch_delay - 1));
                    return None;
                }
                r => r,
            },
            InFlight::Ready(w, delay) if delay > 0 && !wait => {
                self.checkpoint = Some(InFlight::Ready(w, delay - 1));
                return None;
            }
            InFlight::Ready(w, _) => Ok(*w),
            InFlight::Thread(t) => {
                let r = if wait {
                    t.rx.recv().unwrap_or(Err(WriterError::Gone))
                } else {
                    match t.rx.try_recv() {
                        Ok(r) => r,
                        Err(std::sync::mpsc::TryRecvError::Empty) => {
                            self.checkpoint = Some(InFlight::Thread(t));
                            return None;
                        }
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(WriterError::Gone),
                    }
                };
                drop(t);
                r
            }
        };
        let t0 = Instant::now();
        let cpu0 = thread_cpu_ns();
        if let Err(WriterError::Journal(JournalError::SyncCurrent(_))) = &written {
            // The writer's fdatasync of this segment failed: the kernel may have dropped
            // dirty pages of it, which the journal's next sync would then claim unwritten.
            self.journal.distrust_unsynced();
        }
        let result = written.and_then(|w| {
            let (bytes, took, caught_up) = (w.checkpoint_bytes, w.took_ns, w.caught_up);
            let switched = self
                .journal
                .switch_prepared(&self.rebuild.path, w.prepared)?;

            Ok((switched, bytes, took, caught_up))
        });
        Some(match result {
            Ok((switched, bytes, took, caught_up)) => {
                let archive = switched.archive;
                self.health.handle_rotation(true, self.turn.mono);
                if self.journal.dir_sync_pending() {
                    tracing::warn!(
                        journal = %self.rebuild.path.display(),
                        "journal: the new segment is in place but its directory could not be \
                         synced; synced appends retry that and fail (degraded) until it works"
                    );
                }
                let prev_start = self.segment_start;
                self.segment_start = crate::journal::HEADER_LEN + bytes;
                let s = &mut self.segments;
                s.rotations += 1;
                s.last_checkpoint_bytes = bytes;
                s.last_build_ns = took;
                s.last_caught_up_bytes = caught_up;
                s.last_switch_copied_bytes = switched.copied;
                s.last_switch_ns = t0.elapsed().as_nanos() as u64;
                s.last_switch_cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
                (s.last_rotation_ns, s.last_rotation_cpu_ns) = if s.last_switch_ns >= s.last_cut_ns
                {
                    (s.last_switch_ns, s.last_switch_cpu_ns)
                } else {
                    (s.last_cut_ns, s.last_cut_cpu_ns)
                };
                tracing::info!(
                    archived = %archive.display(),
                    checkpoint_bytes = bytes,
                    built_us = took / 1000,
                    cut_us = s.last_cut_ns / 1000,
                    switch_us = s.last_switch_ns / 1000,
                    caught_up_bytes = caught_up,
                    switch_copied_bytes = switched.copied,
                    open_orders = self.gw.open_order_count(),
                    "journal: new segment started from a checkpoint"
                );
                // Its syncs, seal, link and rename: on a thread of their own (in line in
                // the simulator, `switch_delay` flushes later).
                self.checkpoint = Some(InFlight::Finishing(Finish {
                    delay: if self.checkpoint_inline.is_some() {
                        self.finish_delay
                    } else {
                        0
                    },
                    failed: false,
                    since: t0,
                    segment: self.journal.segment(),
                    prev_start,
                }));
                if wait || self.checkpoint_inline.is_none() {
                    return self.finish_checkpoint(wait).or(Some(true));
                }
                true
            }
            Err(e) => {
                self.checkpoint_failed(&e);
                false
            }
        })
    }

    /// A switch being made durable ([`InFlight::Finishing`]): done once the journal has no
    /// pending switch (returns `Some(true)`); `None` while it is not (with `wait`, it is
    /// finished here, `Some(false)` if that fails). A failure is logged and counted and
    /// tried again after the rotation back-off: appends go on to the new segment, and a
    /// synced one finishes the switch first or fails.
    fn poll_finish(&mut self, wait: bool, f: Finish) -> Option<bool> {
        let result = if !self.journal.switch_pending() {
            // Finished (by its thread, already taken, or by a synced append), or undone.
            Some(Ok(()))
        } else if wait {
            Some(self.journal.finish_switch())
        } else if self.journal.switch_running() {
            self.journal.poll_switch()
        } else if f.delay > 0 || (f.failed && !self.health.poll_rotation(self.turn.mono)) {
            self.checkpoint = Some(InFlight::Finishing(Finish {
                delay: f.delay.saturating_sub(1),
                ..f
            }));
            return None;
        } else if self.checkpoint_inline.is_some() {
            Some(self.journal.finish_switch())
        } else {
            match self.journal.finish_switch_away() {
                Ok(()) if self.journal.switch_pending() => None,
                r => Some(r),
            }
        };
        if self.journal.segment() != f.segment {
            // Undone (the new file could not be synced before anything went to it): the
            // old segment is the journal again, as after a failed checkpoint.
            self.segment_start = f.prev_start;
            self.segments.rotations -= 1;
            let e = match result {
                Some(Err(e)) => e,
                _ => JournalError::Rotate {
                    path: self.rebuild.path.clone(),
                    source: std::io::Error::other(
                        "the new segment could not be synced; the switch was undone",
                    ),
                },
            };
            self.checkpoint_failed(&e);
            return wait.then_some(false);
        }
        match result {
            None => {
                self.checkpoint = Some(InFlight::Finishing(Finish { delay: 0, ..f }));
                None
            }
            Some(Ok(())) => {
                self.segments.last_finish_ns = f.since.elapsed().as_nanos() as u64;
                if f.failed {
                    self.health.handle_rotation(true, self.turn.mono);
                }
                tracing::info!(
                    journal = %self.rebuild.path.display(),
                    finish_us = self.segments.last_finish_ns / 1000,
                    "journal: the new segment is durable (synced, the old one sealed and archived)"
                );
                Some(true)
            }
            Some(Err(e)) => {
                self.segments.failures += 1;
                let retry = self.health.handle_rotation(false, self.turn.mono);
                tracing::error!(
                    error = %anyhow_chain(&e),
                    retry_in_s = retry.as_secs(),
                    journal = %self.rebuild.path.display(),
                    "journal: the switch to the new segment could not be made durable yet; \
                     appends go on to it, synced ones finish the switch first or fail"
                );
                self.checkpoint = Some(InFlight::Finishing(Finish {
                    delay: 0,
                    failed: true,
                    ..f
                }));
                wait.then_some(false)
            }
        }
    }

    fn checkpoint_failed(&mut self, e: &(dyn std::error::Error + 'static)) {
        self.segments.failures += 1;
        let wait = self.health.handle_rotation(false, self.turn.mono);
        tracing::error!(
            error = %anyhow_chain(e),
            retry_in_s = wait.as_secs(),
            "journal: checkpoint failed; the current segment stays in use"
        );
    }

    /// Starts a new journal segment once `bytes` have been appended to the current one
    /// after its checkpoint (0: never). Each new segment begins with a checkpoint, so a
    /// restart replays at most one segment.
    pub fn set_segment_bytes(&mut self, bytes: u64) {
        self.segment_bytes = bytes;
    }

    /// At a clean stop: starts a new segment if this one holds anything besides its
    /// checkpoint and segments are on.
    pub fn checkpoint_at_stop(&mut self) {
        if self.segment_bytes > 0
            && (self.checkpoint.is_some() || self.journal.len() > self.segment_start)
        {
            self.checkpoint();
        }
    }

    /// Segments started so far.
    pub fn segment_stats(&self) -> SegmentStats {
        self.segments
    }

    /// Writes a checkpoint and starts a new journal segment with it now (also at a clean
    /// stop, so the next start replays little but the checkpoint): finishes the one in
    /// flight, if any, else cuts and waits for the writer. Everything staged must have been
    /// flushed. A failure is logged and counted; the current segment stays in use and
    /// nothing is lost. Returns whether a new segment was started.
    pub fn checkpoint(&mut self) -> bool {
        if self.health.is_degraded() {
            return false;
        }
        if self.checkpoint.is_none() && !self.cut() {
            return false;
        }
        self.finish_checkpoint(true).unwrap_or(false)
    }

    fn journal_failed(
        &mut self,
        e: &JournalError,
        deliver: &mut dyn FnMut(EngineId, &Response),
    ) -> Result<(), DriverError> {
        self.journal_failures += 1;
        tracing::error!(
            error = %anyhow_chain(e),
            journal = %self.rebuild.path.display(),
            "journal append failed: new requests are answered JournalUnavailable, the venue \
             is disconnected until the journal is writable again (nothing recorded is lost)"
        );
        self.out.clear();
        self.link.close();
        // The core ran ahead of the journal: rebuild it from what is recorded.
        let mut gw = Gateway::new(self.rebuild.session.clone(), &self.rebuild.risk)?;
        self.journal
            .replay(&self.rebuild.path, |k, p| gw.replay_record(k, p))?;
        gw.inherit_live_state(&self.gw);
        self.gw = gw;
        for (engine, reject) in &self.batch {
            deliver(*engine, reject);
        }
        self.batch.clear();
        // Their cancel-on-disconnect was not journaled either: it runs once the journal
        // is back.
        self.deferred_disconnects
            .append(&mut self.batch_disconnects);
        self.health.handle_append_failed(self.turn.mono);
        Ok(())
    }

    /// An engine the core cut off since the last call (it sent `risk.max_malformed_frames`
    /// malformed frames): close its connection and run cancel-on-disconnect for it
    /// ([`stage_engine_disconnect`](Self::stage_engine_disconnect)).
    pub fn pop_kicked(&mut self) -> Option<EngineId> {
        self.kicked.pop()
    }

    /// Takes the engine responses produced so far.
    pub fn take_engine_responses(&mut self) -> Vec<(EngineId, Response)> {
        std::mem::take(&mut self.responses)
    }

    /// The simulator's: storage faults injected into the journal's file operations, and
    /// the clock the driver reads for entry points not handed a [`Now`]
    /// ([`set_clock`](Self::set_clock)).
    pub fn set_storage_faults(
        &mut self,
        faults: Option<Box<dyn crate::journal::StorageFaults>>,
        clock: fn() -> Now,
    ) {
        self.journal.set_faults(faults);
        self.set_clock(clock);
    }

    /// The one clock the driver reads, once per turn, in the entry points that are not
    /// handed a [`Now`] ([`Now::read`] unless set: a simulator sets its own).
    pub fn set_clock(&mut self, clock: fn() -> Now) {
        self.clock = clock;
        self.turn = clock();
    }

    /// Journal bytes a completed sync made durable (what survives a power loss).
    pub fn journal_durable_len(&self) -> u64 {
        self.journal.durable_len()
    }

    /// Forces the journal to disk.
    pub fn sync(&mut self) -> Result<(), DriverError> {
        Ok(self.journal.sync()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A listener whose accept queue is full, so the kernel drops further SYNs: a venue that
    /// never answers a connect, on the loopback.
    /// Found by review: a rotation that keeps failing was retried on every loop turn,
    /// rebuilding the checkpoint each time (4,998 failures a second). It backs off: 1 s,
    /// doubling to 60 s, one attempt (and one log line) each.
    #[test]
    fn a_failing_rotation_backs_off() {
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        // No venue is needed: an engine request is journaled (and rejected) all the same.
        let mut d =
            FixDriver::open_with("127.0.0.1:9", session, &risk, &path, FsyncPolicy::Group).unwrap();
        d.set_segment_bytes(1);
        d.set_checkpoint_inline(Some(0));
        // The next segment cannot be created: a directory is in its way.
        std::fs::create_dir(dir.path().join("gw.journal.next")).unwrap();
        let m = crate::proto::NewOrder::new(
            1,
            7,
            crate::proto::Symbol::new("AAPL").unwrap(),
            crate::proto::Side::Buy,
            10,
            100,
            crate::proto::TimeInForce::Day,
        );
        d.stage_engine_message(1, zerocopy::IntoBytes::as_bytes(&m), Wall::now());
        for _ in 0..200 {
            d.flush_with(|_, _| {}).unwrap();
        }
        assert_eq!(d.segment_stats().failures, 1, "retried every loop turn");
        assert_eq!(
            d.health.rotation_retry.map(|(_, w)| w),
            Some(Duration::from_secs(2))
        );
        // The retry is due: one more attempt, and the wait doubles.
        for expect in [4, 8, 16, 32, 60, 60] {
            d.health.rotation_retry = d.health.rotation_retry.map(|(_, w)| (d.turn.mono, w));
            d.flush_with(|_, _| {}).unwrap();
            d.flush_with(|_, _| {}).unwrap();
            assert_eq!(
                d.health.rotation_retry.map(|(_, w)| w),
                Some(Duration::from_secs(expect))
            );
        }
        assert_eq!(d.segment_stats().failures, 7);
        // The cause goes away: the next due attempt succeeds and the back-off ends.
        std::fs::remove_dir(dir.path().join("gw.journal.next")).unwrap();
        d.health.rotation_retry = d.health.rotation_retry.map(|(_, w)| (d.turn.mono, w));
        // The cut at one flush, the writer's checkpoint switched to at the next.
        d.flush_with(|_, _| {}).unwrap();
        assert!(d.checkpoint_in_flight());
        d.flush_with(|_, _| {}).unwrap();
        assert_eq!(d.segment_stats().rotations, 1);
        assert!(d.health.rotation_retry.is_none());
    }

    /// The real disk, but opening `FILE.next` panics while `armed`: the checkpoint writer's
    /// thread dies mid-job.
    #[derive(Debug)]
    struct PanicOnNext {
        armed: std::sync::atomic::AtomicBool,
    }

    impl crate::journal::Storage for PanicOnNext {
        fn open(
            &self,
            path: &Path,
            mode: crate::journal::OpenMode,
        ) -> std::io::Result<Box<dyn crate::journal::StorageFile>> {
            // ORDERING: Relaxed: a test flag read by the writer thread; the thread's spawn
            // orders it after the test's store.
            let next = path.extension().is_some_and(|e| e == "next");
            if next && self.armed.swap(false, std::sync::atomic::Ordering::Relaxed) {
                panic!(
                    "injected: the checkpoint writer dies opening {}",
                    path.display()
                );
            }
            crate::journal::OsStorage.open(path, mode)
        }
        fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            crate::journal::OsStorage.rename(from, to)
        }
        fn hard_link(&self, from: &Path, to: &Path) -> std::io::Result<()> {
            crate::journal::OsStorage.hard_link(from, to)
        }
        fn remove(&self, path: &Path) -> std::io::Result<()> {
            crate::journal::OsStorage.remove(path)
        }
        fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
            crate::journal::OsStorage.sync_dir(dir)
        }
        fn read_dir(
            &self,
            dir: &Path,
        ) -> std::io::Result<Vec<(std::ffi::OsString, crate::journal::storage::FileId)>> {
            crate::journal::OsStorage.read_dir(dir)
        }
        fn file_id(&self, path: &Path) -> std::io::Result<crate::journal::storage::FileId> {
            crate::journal::OsStorage.file_id(path)
        }
        fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
            crate::journal::OsStorage.create_dir_all(dir)
        }
    }

    /// Issue 40: the checkpoint writer's thread panics (a bug, an allocation failure). The
    /// service neither hangs waiting for its answer nor dies with it: the checkpoint counts
    /// as failed (the current segment stays in use, nothing is lost), the rotation backs
    /// off, and the next attempt starts a segment that restores every order.
    #[test]
    fn a_checkpoint_writer_that_panics_is_a_failed_checkpoint_and_the_next_one_works() {
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let fs = std::sync::Arc::new(PanicOnNext {
            armed: std::sync::atomic::AtomicBool::new(false),
        });
        let mut d = FixDriver::with_link_in(
            fs.clone(),
            TcpLink::new("127.0.0.1:9"),
            session,
            &risk,
            &path,
            FsyncPolicy::Group,
        )
        .unwrap();
        d.set_segment_bytes(1);
        // On a thread of its own, as the service runs it.
        d.set_checkpoint_inline(None);
        // ORDERING: Relaxed: the writer thread is spawned after this store.
        fs.armed.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(orders(&mut d, 1, 4));
        let deadline = Instant::now() + Duration::from_secs(20);
        while d.segment_stats().failures == 0 {
            assert!(
                Instant::now() < deadline,
                "the panicked writer's answer never came"
            );
            d.flush_with(|_, _| {}).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(d.segment_stats().rotations, 0);
        assert!(!d.checkpoint_in_flight());
        assert!(
            d.health.rotation_retry.is_some(),
            "the failed rotation does not back off"
        );
        // The service goes on: more orders, journaled in the current segment.
        assert!(orders(&mut d, 4, 8));
        // The retry is due: the next writer (not armed) switches to a new segment.
        d.health.rotation_retry = d.health.rotation_retry.map(|(_, w)| (d.turn.mono, w));
        while d.segment_stats().rotations == 0 {
            assert!(Instant::now() < deadline, "no checkpoint after the panic");
            d.flush_with(|_, _| {}).unwrap();
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(orders(&mut d, 8, 10));
        drop(d);
        let back = reopen(&path);
        assert_eq!(
            back.gateway().last_response_seq(1),
            9,
            "the restart from the new segment lost orders"
        );
    }

    // ---- checkpoints off the service thread (issue 40) ----

    /// A driver with no venue whose every batch is past the segment size: each flush with
    /// records cuts, and the next one switches (the writer runs in line).
    fn segmented(path: &Path) -> FixDriver {
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        let mut d =
            FixDriver::open_with("127.0.0.1:9", session, &risk, path, FsyncPolicy::Group).unwrap();
        d.set_segment_bytes(1);
        d.set_checkpoint_inline(Some(0));
        d
    }

    fn reopen(path: &Path) -> FixDriver {
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        FixDriver::open_with("127.0.0.1:9", session, &risk, path, FsyncPolicy::Group).unwrap()
    }

    /// Engine 1's order `n`, staged and flushed.
    fn order(d: &mut FixDriver, n: u64) {
        let m = crate::proto::NewOrder::new(
            n,
            7,
            crate::proto::Symbol::new("AAPL").unwrap(),
            crate::proto::Side::Buy,
            10,
            100,
            crate::proto::TimeInForce::Day,
        );
        d.stage_engine_message(1, zerocopy::IntoBytes::as_bytes(&m), Wall::now());
        d.flush_with(|_, _| {}).unwrap();
    }

    /// The state a restart rebuilds is the live one: the checkpoints of both are equal.
    fn assert_restart_is_live(d: FixDriver, path: &Path) {
        let live = d.gateway().checkpoint().unwrap();
        drop(d);
        let back = reopen(path);
        assert_eq!(
            back.gateway().checkpoint().unwrap(),
            live,
            "a restart rebuilds another state than the live one"
        );
    }

    fn cuts_in(file: &Path) -> usize {
        let mut n = 0;
        crate::journal::read_records(file, |r| {
            n += usize::from(r.kind == crate::gateway::record::CUT)
        })
        .unwrap();
        n
    }

    /// The segment keeps growing while the writer works: what was appended after the cut
    /// is copied after the checkpoint, so the new segment restores to the live state (the
    /// order of the batch flushed between cut and switch included).
    #[test]
    fn records_appended_after_the_cut_reach_the_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        order(&mut d, 1);
        assert!(
            d.checkpoint_in_flight(),
            "the flush past the segment size cuts"
        );
        order(&mut d, 2);
        order(&mut d, 3);
        assert_eq!(d.segment_stats().rotations, 1);
        assert_eq!(cuts_in(&dir.path().join("gw.journal.1")), 1);
        assert_eq!(cuts_in(&path), 1, "order 3's flush cut again");
        assert!(crate::journal::verify(&path).unwrap().damage.is_none());
        d.sync().unwrap();
        // Built off the service thread from the segment's prefix, the checkpoint and the
        // copied tail restore what the live gateway holds.
        assert_restart_is_live(d, &path);
    }

    /// A second checkpoint asked for while one is in flight finishes that one: one cut,
    /// one new segment.
    #[test]
    fn a_checkpoint_asked_for_while_one_is_in_flight_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        order(&mut d, 1);
        assert!(d.checkpoint_in_flight());
        assert!(d.checkpoint());
        assert!(!d.checkpoint_in_flight());
        assert_eq!(d.segment_stats().rotations, 1);
        assert_eq!(cuts_in(&dir.path().join("gw.journal.1")), 1);
        assert_eq!(cuts_in(&path), 0);
        assert_restart_is_live(d, &path);
    }

    /// A stop (SIGTERM, `control stop`) while a checkpoint is in flight finishes it, so
    /// the next start replays the checkpoint and nothing else.
    #[test]
    fn a_stop_during_a_checkpoint_finishes_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        order(&mut d, 1);
        assert!(d.checkpoint_in_flight());
        d.checkpoint_at_stop();
        assert!(!d.checkpoint_in_flight());
        assert_eq!(d.segment_stats().rotations, 1);
        let live = d.gateway().checkpoint().unwrap();
        drop(d);
        let back = reopen(&path);
        assert_eq!(
            back.recovery().records,
            1,
            "the start replays the checkpoint only"
        );
        assert_eq!(back.gateway().checkpoint().unwrap(), live);
    }

    /// A crash after the cut, before the switch: the cut replays where it stands and the
    /// day is whole; no `FILE.next` is left in use.
    #[test]
    fn a_crash_between_cut_and_switch_restarts_to_the_same_day() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        order(&mut d, 1);
        assert!(d.checkpoint_in_flight());
        // The writer got as far as `FILE.next`, then the process died.
        let job = match d.checkpoint.take() {
            Some(InFlight::Inline(job, _)) => job,
            other => panic!("{other:?}"),
        };
        let _ = job.run(None).unwrap();
        assert!(dir.path().join("gw.journal.next").exists());
        let live = d.gateway().checkpoint().unwrap();
        drop(d);
        let back = reopen(&path);
        assert!(!dir.path().join("gw.journal.next").exists());
        assert_eq!(back.gateway().checkpoint().unwrap(), live);
        assert_eq!(cuts_in(&path), 1);
    }

    /// The service's own mode: the writer on a thread of its own while the service keeps
    /// appending; the checkpoint is switched to at a later flush, and a driver dropped with
    /// a writer in flight waits for it (no writer outlives its driver to write `FILE.next`
    /// beside a journal reopened since).
    #[test]
    fn the_writer_thread_builds_while_the_service_appends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        d.set_checkpoint_inline(None);
        order(&mut d, 1);
        assert!(d.checkpoint_in_flight());
        let mut n = 2;
        while d.segment_stats().rotations == 0 {
            order(&mut d, n);
            n += 1;
            std::thread::sleep(Duration::from_millis(1));
            assert!(n < 10_000, "the writer never answered");
        }
        assert_eq!(d.segment_stats().rotations, 1);
        assert!(d.segment_stats().last_build_ns > 0);
        // A cut, then the driver is dropped at once: the thread is waited for.
        order(&mut d, n);
        assert!(d.checkpoint_in_flight());
        d.sync().unwrap();
        assert_restart_is_live(d, &path);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!dir.path().join("gw.journal.next").exists());
    }

    /// `journal repair` of a segment whose checkpoint is damaged rebuilds it from its
    /// archive: the archive's records up to its last cut, then this segment's records after
    /// the checkpoint. The records after the cut are in both files (copied at the switch):
    /// taken twice, the rebuilt day would replay them twice.
    #[test]
    fn repair_rebuilds_a_segment_started_at_a_cut_without_doubling_its_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        order(&mut d, 1);
        order(&mut d, 2);
        assert_eq!(d.segment_stats().rotations, 1);
        d.set_segment_bytes(0);
        order(&mut d, 3);
        let live = d.gateway().checkpoint().unwrap();
        drop(d);
        // The checkpoint's payload is hit (a bad CRC in the segment's first record).
        let mut bytes = std::fs::read(&path).unwrap();
        let at = crate::journal::HEADER_LEN as usize + 40;
        bytes[at] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        assert!(
            FixDriver::open_with("127.0.0.1:9", session, &risk, &path, FsyncPolicy::Group).is_err()
        );
        crate::journal::repair(&path).unwrap();
        let back = reopen(&path);
        assert_eq!(back.gateway().checkpoint().unwrap(), live);
    }

    /// Fails the `n`th journal operation from now, once.
    #[derive(Debug)]
    struct FailNth {
        n: u32,
        seen: std::sync::Arc<std::sync::atomic::AtomicU32>,
    }

    impl crate::journal::StorageFaults for FailNth {
        fn check(&mut self, _op: crate::journal::StorageOp) -> io::Result<()> {
            // ORDERING: Relaxed: one thread (the test's) counts; read after it joined.
            let i = self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i == self.n {
                return Err(io::Error::from_raw_os_error(5));
            }
            Ok(())
        }
    }

    /// EIO on each file operation of a checkpoint in turn (the cut's append, the writer's
    /// write of `FILE.next`, its catch-up's writes, its fdatasync of the live segment and
    /// its sync of `FILE.next`, the switch's seal, write, sync, link, rename and directory
    /// sync), with the switch at the writer's flush and one flush later (records of its
    /// own to copy): the driver goes on, the day is whole at a restart, and once the disk
    /// works a later attempt starts the segment.
    #[test]
    fn eio_on_each_step_of_a_checkpoint_loses_nothing() {
        for delay in [0, 1] {
            eio_on_each_step_with_switch_delay(delay);
        }
    }

    fn eio_on_each_step_with_switch_delay(delay: u32) {
        let mut n = 0;
        loop {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("gw.journal");
            let mut d = segmented(&path);
            d.set_switch_delay(delay);
            let seen = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
            d.set_storage_faults(
                Some(Box::new(FailNth {
                    n,
                    seen: seen.clone(),
                })),
                Now::read,
            );
            order(&mut d, 1);
            order(&mut d, 2);
            // ORDERING: Relaxed, as in FailNth (same thread).
            let ops = seen.load(std::sync::atomic::Ordering::Relaxed);
            d.set_storage_faults(None, Now::read);
            if !d.health.is_degraded() {
                d.health.rotation_retry = None;
            }
            for k in 3..6 {
                if d.health.is_degraded() {
                    d.health.next_probe = Some(d.turn.mono);
                    d.probe();
                    d.flush_with(|_, _| {}).unwrap();
                }
                d.health.rotation_retry = d.health.rotation_retry.map(|(_, w)| (d.turn.mono, w));
                order(&mut d, k);
            }
            d.checkpoint();
            assert!(!d.health.is_degraded(), "fault {n}: the disk works again");
            assert!(
                d.segment_stats().rotations >= 1,
                "fault {n}: no segment started"
            );
            d.sync().unwrap();
            let live = d.gateway().checkpoint().unwrap();
            drop(d);
            let back = reopen(&path);
            assert_eq!(back.gateway().checkpoint().unwrap(), live, "fault {n}");
            if n >= ops {
                break;
            }
            n += 1;
        }
        assert!(n > 10, "only {n} operations in two checkpointed batches");
    }

    /// Engine 1's orders `from..to`, staged as one batch and flushed; whether the flush
    /// acknowledged them (a crash or a fault may fail it).
    fn orders(d: &mut FixDriver, from: u64, to: u64) -> bool {
        for n in from..to {
            let m = crate::proto::NewOrder::new(
                n,
                7,
                crate::proto::Symbol::new("AAPL").unwrap(),
                crate::proto::Side::Buy,
                10,
                100,
                crate::proto::TimeInForce::Day,
            );
            d.stage_engine_message(1, zerocopy::IntoBytes::as_bytes(&m), Wall::now());
        }
        let journal_failures = d.journal_failures;
        d.flush_with(|_, _| {}).is_ok() && d.journal_failures == journal_failures
    }

    /// Issue 40: the records appended while the writer works are copied by the writer, off
    /// the service thread, until at most its slack is left; the switch copies only what was
    /// appended after the writer answered. Here 400 orders (about 100 KiB of records) land
    /// between the cut and the writer's run, then 3 between its answer and the switch:
    /// the switch copies those 3 orders' records, and the new segment restores the day.
    #[test]
    fn the_switch_copies_only_what_the_writer_had_not_caught_up_with() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        d.set_checkpoint_inline(Some(2));
        d.set_switch_delay(1);
        d.set_catch_up(crate::journal::CatchUp {
            slack: 0,
            max_rounds: 64,
        });
        assert!(orders(&mut d, 1, 2));
        assert!(
            d.checkpoint_in_flight(),
            "the flush past the segment size cuts"
        );
        let before = d.journal.len();
        assert!(orders(&mut d, 2, 202));
        assert!(orders(&mut d, 202, 402));
        let appended_before_writer = d.journal.len() - before;
        assert!(appended_before_writer > 50_000);
        // The writer runs at this flush (after its batch is appended) and catches up.
        assert!(orders(&mut d, 402, 403));
        assert!(d.checkpoint_in_flight());
        let len_at_answer = d.journal.len();
        // This batch is appended after the writer answered; the switch follows it.
        assert!(orders(&mut d, 403, 406));
        // Switched; the next synced append makes the switch durable first.
        assert!(d.checkpoint_in_flight());
        assert!(d.journal.switch_pending());
        assert!(orders(&mut d, 406, 407));
        assert!(!d.journal.switch_pending());
        let s = d.segment_stats();
        assert_eq!(s.rotations, 1);
        assert!(
            s.last_caught_up_bytes >= appended_before_writer * 9 / 10,
            "the writer copied {} bytes of {appended_before_writer}",
            s.last_caught_up_bytes
        );
        assert!(
            s.last_switch_copied_bytes > 0 && s.last_switch_copied_bytes < 2_000,
            "the switch copied {} bytes (the writer answered at {len_at_answer})",
            s.last_switch_copied_bytes
        );
        assert!(crate::journal::verify(&path).unwrap().damage.is_none());
        assert_eq!(
            d.gateway().last_response_seq(1),
            406,
            "every order answered"
        );
        assert_restart_is_live(d, &path);
    }

    /// Issue 40: the records copied behind a checkpoint count toward the segment's size. A
    /// writer that lagged (here: 200 orders, about 50 KiB, appended between the cut and
    /// the switch, with 16 KiB segments) leaves a new segment already past its size, and
    /// the next flush cuts again; counted from the switch instead, the segment would grow
    /// another `segment_bytes` on top of the copies (the 276.8 MiB last segment of 64 MiB
    /// ones under the restart bench).
    #[test]
    fn the_records_copied_behind_a_checkpoint_count_toward_the_segment_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.journal");
        let mut d = segmented(&path);
        d.set_segment_bytes(16 << 10);
        d.set_checkpoint_inline(Some(1));
        let mut n = 1;
        while !d.checkpoint_in_flight() {
            assert!(orders(&mut d, n, n + 10));
            n += 10;
        }
        assert!(orders(&mut d, n, n + 200));
        assert!(orders(&mut d, n + 200, n + 201));
        assert_eq!(d.segment_stats().rotations, 1);
        assert!(d.segment_stats().last_caught_up_bytes > 16 << 10);
        // The next flush cuts: the copies alone are past the segment size.
        assert!(orders(&mut d, n + 201, n + 202));
        assert!(
            d.checkpoint_in_flight(),
            "the copied records were not counted"
        );
    }

    /// Issue 40: a crash inside each sync of a checkpoint's second half in turn (the
    /// batches' syncs and claims, the writer's fdatasync of the live segment and of
    /// `FILE.next`, the seal's two, the new segment's, the directory's), on the simulator's
    /// disk, then a power loss: the journal opens, every acknowledged order is there, and a
    /// batch that was not acknowledged is there whole or not at all.
    #[test]
    fn a_crash_inside_each_sync_of_the_catch_up_and_switch_restarts_to_the_same_day() {
        use crate::journal::sim_disk::SimDisk;
        use crate::journal::Storage;
        use std::sync::Arc;
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        let path = Path::new("/sim/gw.journal");
        let open = |fs: &Arc<dyn Storage>| {
            FixDriver::with_link_in(
                fs.clone(),
                TcpLink::new("127.0.0.1:9"),
                session.clone(),
                &risk,
                path,
                FsyncPolicy::Group,
            )
        };
        let mut switched_after = 0;
        for power_loss in [false, true] {
            for nth in 0..14 {
                let disk = SimDisk::new(40 + nth as u64);
                let fs: Arc<dyn Storage> = Arc::new(disk.clone());
                let mut d = open(&fs).unwrap();
                d.set_segment_bytes(1);
                d.set_checkpoint_inline(Some(0));
                d.set_switch_delay(1);
                assert!(orders(&mut d, 1, 2));
                assert!(d.checkpoint_in_flight());
                disk.arm_crash(nth);
                // The writer runs at the first of these flushes, the switch at the second.
                let mut acked = 1;
                let mut maybe = 0;
                for (from, to) in [(2, 12), (12, 22), (22, 32)] {
                    if orders(&mut d, from, to) {
                        acked = to - 1;
                    } else {
                        maybe = to - from;
                        break;
                    }
                }
                if maybe == 0 {
                    switched_after += 1;
                }
                drop(d);
                disk.kill();
                if power_loss {
                    disk.power_loss(None);
                }
                let back = open(&fs).unwrap_or_else(|e| panic!("crash at sync {nth}: {e}"));
                // One response per order: the orders whose requests the day holds.
                let kept = u64::from(back.gateway().last_response_seq(1));
                assert!(
                    kept == acked || kept == acked + maybe,
                    "crash at sync {nth} (power loss {power_loss}): {kept} orders kept, \
                     {acked} acknowledged, {maybe} not"
                );
            }
        }
        assert!(switched_after > 0, "no crash came after the switch");
    }

    /// Issue 40: the writer's fdatasync of the live segment fails (simulator disk: the
    /// kernel drops the dirty pages it could not write, marked clean or evicted). The
    /// journal's own next sync would succeed and claim pages that never reached the disk;
    /// the journal re-checks what it had not synced first (`distrust_unsynced`), so a
    /// sync that succeeds after it vouches only for bytes that are there, and a power loss
    /// after it leaves a journal that opens with every order the sync vouched for (without
    /// the re-check, an evicted page is vouched for and the restart refuses the journal).
    #[test]
    fn a_failed_writer_fsync_of_the_live_segment_is_not_trusted_by_the_next_sync() {
        use crate::journal::sim_disk::SimDisk;
        use crate::journal::{Storage, StorageOp};
        use std::sync::Arc;
        let (risk, session) = (
            crate::gateway::tests::risk(),
            crate::gateway::tests::session(),
        );
        let path = Path::new("/sim/gw.journal");
        let open = |fs: &Arc<dyn Storage>| {
            FixDriver::with_link_in(
                fs.clone(),
                TcpLink::new("127.0.0.1:9"),
                session.clone(),
                &risk,
                path,
                FsyncPolicy::Never,
            )
        };
        let (mut synced, mut refused) = (0, 0);
        for seed in 0..24 {
            let disk = SimDisk::new(seed);
            let fs: Arc<dyn Storage> = Arc::new(disk.clone());
            let mut d = open(&fs).unwrap();
            d.set_segment_bytes(1);
            d.set_checkpoint_inline(Some(0));
            d.set_switch_delay(1);
            assert!(orders(&mut d, 1, 40));
            assert!(d.checkpoint_in_flight());
            disk.set_outage(Some((StorageOp::Fsync, false)));
            // The writer runs after this batch: its fdatasync of the live segment fails.
            assert!(orders(&mut d, 40, 80));
            disk.set_outage(None);
            assert_eq!(d.segment_stats().failures, 1, "seed {seed}");
            let vouched = d.sync().is_ok();
            drop(d);
            disk.kill();
            disk.power_loss(None);
            if vouched {
                synced += 1;
                let back = open(&fs).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
                assert_eq!(back.gateway().last_response_seq(1), 79, "seed {seed}");
            } else {
                // Pages evicted: the journal refused to vouch for them (poisoned); what a
                // restart then makes of the disk is the rule of any failed fsync.
                refused += 1;
            }
        }
        assert!(synced > 0, "no seed kept its pages cached");
        assert!(refused > 0, "no seed evicted a page");
    }

    fn syn_dropping_listener() -> (rustix::fd::OwnedFd, SocketAddr, Vec<TcpStream>) {
        use rustix::net::{AddressFamily, SocketType};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        rustix::net::bind(&fd, &any).unwrap();
        rustix::net::listen(&fd, 0).unwrap();
        let addr = match rustix::net::getsockname(&fd).unwrap().try_into() {
            Ok(a) => a,
            Err(_) => panic!("an inet address"),
        };
        // Backlog 0 holds one connection; two more make sure the queue is full.
        let mut held = Vec::new();
        for _ in 0..2 {
            if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
                held.push(s);
            }
        }
        (fd, addr, held)
    }

    #[test]
    fn connect_to_a_venue_that_never_answers_never_blocks_and_times_out() {
        let (_l, addr, _held) = syn_dropping_listener();
        let mut link = TcpLink::new(&addr.to_string());
        // The deadline runs on the turn time handed in, not on a clock the link reads: the
        // turns before it are still connecting, the turn at it has failed, and no call
        // waits (the test takes no CONNECT_TIMEOUT of real time).
        let t0 = Mono::from_nanos(1_000_000_000);
        let t = Instant::now();
        link.open(t0).unwrap();
        assert!(link.is_opening());
        for ms in [0, 1000, 1999] {
            assert!(!link.poll_open(t0 + Duration::from_millis(ms)).unwrap());
        }
        let err = link.poll_open(t0 + CONNECT_TIMEOUT).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        // A call that blocked would wait out the whole timeout: the bound is a quarter of
        // it, far above a loaded machine's scheduling delays.
        assert!(
            t.elapsed() < CONNECT_TIMEOUT / 4,
            "the calls took {:?}",
            t.elapsed()
        );
        assert!(!link.is_open() && !link.is_opening());
    }

    /// Queued bytes the venue takes none of for [`WRITE_STALL`] of turn time drop the link;
    /// up to it they wait.
    #[test]
    fn a_venue_that_takes_nothing_for_write_stall_is_dropped() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut link = TcpLink::new(&l.local_addr().unwrap().to_string()).with_max_unsent(64 << 20);
        let t0 = Mono::from_nanos(1_000_000_000);
        link.open(t0).unwrap();
        while !link.poll_open(t0).unwrap() {}
        let (venue, _) = l.accept().unwrap();
        let chunk = vec![b'x'; 1 << 16];
        while link.unsent() == 0 {
            link.write_all(&chunk, t0).unwrap();
        }
        link.poll_write(t0 + WRITE_STALL).unwrap();
        let err = link
            .poll_write(t0 + WRITE_STALL + Duration::from_millis(1))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(!link.is_open());
        assert_eq!(link.write_stalls(), 1);
        drop(venue);
    }

    #[test]
    fn connect_completes_through_polls_and_a_refused_one_fails_fast() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let mut link = TcpLink::new(&addr.to_string());
        link.open(Mono::now()).unwrap();
        let t = Instant::now();
        while !link.poll_open(Mono::now()).unwrap() {
            assert!(t.elapsed() < Duration::from_secs(2));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(link.is_open() && !link.is_opening());
        drop(l);
        let mut link = TcpLink::new(&addr.to_string());
        let r = link.open(Mono::now()).and_then(|()| loop {
            if link.poll_open(Mono::now())? {
                break Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        });
        assert!(r.is_err(), "nothing listens there");
    }

    #[test]
    fn a_venue_that_does_not_read_is_queued_for_then_dropped_at_the_cap() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut link = TcpLink::new(&l.local_addr().unwrap().to_string()).with_max_unsent(1 << 16);
        link.open(Mono::now()).unwrap();
        while !link.poll_open(Mono::now()).unwrap() {}
        let (venue, _) = l.accept().unwrap();
        let chunk = vec![b'x'; 8192];
        let t = Instant::now();
        let mut written = 0usize;
        let err = loop {
            match link.write_all(&chunk, Mono::now()) {
                Ok(()) => written += chunk.len(),
                Err(e) => break e,
            }
            assert!(written < 64 << 20, "the link never gave up");
        };
        // Never a wait: the socket buffers fill, 64 KiB queue, then the link is dropped.
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "took {:?}",
            t.elapsed()
        );
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory, "{err}");
        assert!(!link.is_open());
        assert_eq!(link.write_stalls(), 1);
        assert!(link.write_all(b"more", Mono::now()).is_err());
        drop(venue);
    }

    #[test]
    fn queued_bytes_reach_a_slow_venue_in_order() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut link = TcpLink::new(&l.local_addr().unwrap().to_string());
        link.open(Mono::now()).unwrap();
        while !link.poll_open(Mono::now()).unwrap() {}
        let (mut venue, _) = l.accept().unwrap();
        let total = 8 << 20;
        let reader = std::thread::spawn(move || {
            let mut got = Vec::with_capacity(total);
            let mut buf = vec![0u8; 1 << 16];
            while got.len() < total {
                std::thread::sleep(Duration::from_micros(200));
                let n = venue.read(&mut buf).unwrap();
                assert!(n > 0);
                got.extend_from_slice(&buf[..n]);
            }
            got
        });
        let mut sent = 0usize;
        while sent < total {
            let chunk: Vec<u8> = (sent..sent + 4096).map(|i| (i % 251) as u8).collect();
            if link.unsent() < 1 << 20 {
                link.write_all(&chunk, Mono::now()).unwrap();
                sent += chunk.len();
            } else {
                link.poll_write(Mono::now()).unwrap();
            }
        }
        while link.unsent() > 0 {
            link.poll_write(Mono::now()).unwrap();
        }
        let got = reader.join().unwrap();
        assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    }
}
