//! Thin driver for the FIX side: owns the venue link and the journal file, moves bytes
//! between them and the I/O-free [`Gateway`], and applies the write-ahead order (journal,
//! then FIX, then engine responses). Engine frames come in through
//! [`FixDriver::engine_message`] (or [`FixDriver::stage_engine_message`] plus
//! [`FixDriver::flush_with`] to batch) from whoever owns the engine transport.
//!
//! The venue link is a [`VenueLink`]: [`TcpLink`] for a real venue, or the in-process
//! [`crate::sim::SimVenue`] for benchmarks.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::fix::SessionConfig;
use crate::gateway::{EngineId, Gateway, Outputs};
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
use crate::risk::{RiskConfig, RiskConfigError};
use crate::unix_nanos;

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
pub trait VenueLink {
    /// Opens the link (a TCP connect).
    fn open(&mut self) -> io::Result<()>;
    /// Closes it without a goodbye (as a crash would).
    fn close(&mut self);
    /// True while open.
    fn is_open(&self) -> bool;
    /// Reads what is there, waiting at most `wait` (`Duration::ZERO`: never blocks).
    fn read(&mut self, buf: &mut [u8], wait: Duration) -> LinkRead;
    /// Writes all of `bytes`; an error closes the link.
    fn write_all(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Where it goes, for messages.
    fn describe(&self) -> String;
}

/// A TCP connection to a FIX acceptor.
#[derive(Debug)]
pub struct TcpLink {
    addr: String,
    stream: Option<TcpStream>,
    /// The socket's current mode, so switching costs a syscall only when it changes.
    nonblocking: bool,
}

/// How long a connect may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a write may wait for the venue to take bytes before the link counts as dead.
const WRITE_STALL: Duration = Duration::from_secs(5);

impl TcpLink {
    /// A link to `addr` (`host:port`), not yet open.
    pub fn new(addr: &str) -> TcpLink {
        TcpLink {
            addr: addr.to_owned(),
            stream: None,
            nonblocking: false,
        }
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
}

impl VenueLink for TcpLink {
    fn open(&mut self) -> io::Result<()> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "address resolves to nothing");
        for a in self.addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    self.stream = Some(s);
                    self.nonblocking = false;
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn close(&mut self) {
        self.stream = None;
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
            self.stream = None;
            return LinkRead::Closed;
        }
        match s.read(buf) {
            Ok(0) => {
                self.stream = None;
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
                self.stream = None;
                LinkRead::Closed
            }
        }
    }

    fn write_all(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        let Some(s) = &mut self.stream else {
            return Err(io::ErrorKind::NotConnected.into());
        };
        // Non-blocking mode: spin on a full socket buffer, bounded, rather than switch modes.
        let mut stalled_since: Option<Instant> = None;
        while !bytes.is_empty() {
            match s.write(bytes) {
                Ok(0) => {
                    self.stream = None;
                    return Err(io::ErrorKind::WriteZero.into());
                }
                Ok(n) => {
                    bytes = &bytes[n..];
                    stalled_since = None;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let t = *stalled_since.get_or_insert_with(Instant::now);
                    if t.elapsed() > WRITE_STALL {
                        self.stream = None;
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    std::thread::yield_now();
                }
                Err(e) => {
                    self.stream = None;
                    return Err(e);
                }
            }
        }
        Ok(())
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
    /// Engine requests staged since the last flush: `(engine, cl_ord_id, request type)`,
    /// to answer "not taken" if the flush cannot journal them.
    batch: Vec<(EngineId, u64, u8)>,
    /// Set while the journal cannot be written (disk full or failing).
    degraded: Option<Degraded>,
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
    /// Journal length when this segment was opened or started.
    segment_start: u64,
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

/// The journal could not be written: since when, and when to try again.
#[derive(Clone, Copy, Debug)]
struct Degraded {
    next_probe: Instant,
}

/// How often a degraded gateway checks whether the journal can be written again.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);
/// Space a probe reserves past the journal's end before it declares the journal writable.
const PROBE_HEADROOM: u64 = 1 << 20;

impl FixDriver<TcpLink> {
    /// Opens the journal from `cfg`, recovering state; the venue is `cfg.fix.venue_addr`.
    pub fn open(cfg: &Config) -> Result<FixDriver, DriverError> {
        let mut d = Self::open_with(
            &cfg.fix.venue_addr,
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
        let mut gw = Gateway::new(session.clone(), risk)?;
        if let Some(dir) = journal.parent().filter(|d| !d.as_os_str().is_empty()) {
            let _ = std::fs::create_dir_all(dir);
        }
        let (journal_file, recovery) =
            Journal::open(journal, fsync, |k, p| gw.replay_record(k, p))?;
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
        Ok(FixDriver {
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
            degraded: None,
            batch_disconnects: Vec::new(),
            deferred_disconnects: Vec::new(),
            kicked: Vec::new(),
            journal_failures: 0,
            segment_bytes: 0,
            segments: SegmentStats::default(),
            segment_start,
        })
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

    /// Connects to the venue and sends Logon (refused while the journal cannot be written:
    /// nothing the venue sends could be recorded).
    pub fn connect(&mut self) -> Result<(), DriverError> {
        if self.degraded.is_some() {
            return Err(DriverError::JournalUnavailable);
        }
        self.link.open().map_err(|source| DriverError::Connect {
            addr: self.link.describe(),
            source,
        })?;
        self.gw.on_connect(unix_nanos(), &mut self.out);
        self.flush()
    }

    /// Closes the connection without a logout (as a crash would).
    pub fn drop_connection(&mut self) {
        self.link.close();
        self.gw.on_disconnect();
    }

    /// One engine frame, flushed at once.
    pub fn engine_message(&mut self, engine: EngineId, bytes: &[u8]) -> Result<(), DriverError> {
        self.stage_engine_message(engine, bytes, unix_nanos());
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
    pub fn stage_engine_message(&mut self, engine: EngineId, bytes: &[u8], now: u64) {
        self.frame.clear();
        self.frame.extend_from_slice(bytes);
        let f = &self.frame;
        let cl = f
            .get(8..16)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or_default()));
        self.batch
            .push((engine, cl, f.first().copied().unwrap_or(0)));
        if self.degraded.is_none() {
            self.gw.on_engine_message(engine, f, now, &mut self.out);
        }
    }

    /// Cancel-on-disconnect for `engine`, processed but not flushed (deferred until the
    /// journal is writable again if it is not).
    pub fn stage_engine_disconnect(&mut self, engine: EngineId, now: u64) {
        if self.degraded.is_some() {
            self.deferred_disconnects.push(engine);
        } else {
            self.batch_disconnects.push(engine);
            self.gw.on_engine_disconnect(engine, now, &mut self.out);
        }
    }

    /// True while the journal cannot be written: requests are answered "not taken" and the
    /// venue stays disconnected until a probe succeeds.
    pub fn is_degraded(&self) -> bool {
        self.degraded.is_some()
    }

    /// Journal appends that failed (each put the gateway in degraded mode).
    pub fn journal_failures(&self) -> u64 {
        self.journal_failures
    }

    /// In degraded mode, every [`PROBE_INTERVAL`]: can the journal be written again?
    fn probe(&mut self, now: u64) {
        let Some(d) = self.degraded else { return };
        let t = Instant::now();
        if t < d.next_probe {
            return;
        }
        match self.journal.probe(PROBE_HEADROOM) {
            Ok(()) => {
                tracing::warn!("journal writable again: taking requests, reconnecting the venue");
                self.degraded = None;
                for engine in std::mem::take(&mut self.deferred_disconnects) {
                    self.gw.on_engine_disconnect(engine, now, &mut self.out);
                }
            }
            Err(_) => {
                self.degraded = Some(Degraded {
                    next_probe: t + PROBE_INTERVAL,
                });
            }
        }
    }

    /// Runs `f` against the core without flushing (market data, kill switches in a batch).
    pub fn stage<R>(&mut self, f: impl FnOnce(&mut Gateway, &mut Outputs) -> R) -> R {
        f(&mut self.gw, &mut self.out)
    }

    /// Waits up to `timeout` for venue bytes, processes them and the timers, and queues the
    /// engine responses for [`take_engine_responses`](Self::take_engine_responses).
    pub fn poll(&mut self, timeout: Duration) -> Result<(), DriverError> {
        if self.link.is_open() {
            self.read_venue(timeout.max(Duration::from_micros(10)));
        } else {
            std::thread::sleep(timeout);
        }
        self.probe(unix_nanos());
        self.gw.on_timer(unix_nanos(), &mut self.out);
        self.flush()
    }

    /// One non-blocking pass over the venue link and the timers at `now`; the engine
    /// responses produced (here and by staged calls) go to `deliver`, in order. Returns the
    /// number of venue bytes read (work done, for the idle strategy).
    pub fn poll_with(
        &mut self,
        now: u64,
        deliver: impl FnMut(EngineId, &Response),
    ) -> Result<usize, DriverError> {
        let n = if self.link.is_open() {
            self.read_venue(Duration::ZERO)
        } else {
            0
        };
        self.probe(now);
        self.gw.on_timer(now, &mut self.out);
        self.flush_with(deliver)?;
        Ok(n)
    }

    fn read_venue(&mut self, wait: Duration) -> usize {
        match self.link.read(&mut self.rbuf, wait) {
            LinkRead::Data(n) => {
                self.gw
                    .on_fix_bytes(&self.rbuf[..n], unix_nanos(), &mut self.out);
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
        let out = &mut self.out;
        if out.journal_records > 0 {
            if let Err(e) = self.journal.append(&out.journal, out.journal_records) {
                return self.journal_failed(e, deliver);
            }
        }
        if self.degraded.is_some() {
            // Requests staged while degraded were not taken.
            for &(engine, cl, ty) in &self.batch {
                deliver(
                    engine,
                    &Response::reject(cl, ty, RejectReason::JournalUnavailable),
                );
            }
        }
        self.batch.clear();
        self.batch_disconnects.clear();
        let out = &mut self.out;
        if !out.fix.is_empty() && self.link.is_open() && self.link.write_all(&out.fix).is_err() {
            self.gw.on_disconnect();
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
        if self.segment_bytes > 0
            && self.journal.len() - self.segment_start >= self.segment_bytes
            && self.degraded.is_none()
        {
            self.checkpoint();
        }
        Ok(())
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
        if self.segment_bytes > 0 && self.journal.len() > self.segment_start {
            self.checkpoint();
        }
    }

    /// Segments started so far.
    pub fn segment_stats(&self) -> SegmentStats {
        self.segments
    }

    /// Writes a checkpoint and starts a new journal segment with it now (also at a clean
    /// stop, so the next start replays nothing but the checkpoint). Everything staged must
    /// have been flushed. A failure is logged and counted; the current segment stays in
    /// use and nothing is lost. Returns whether a new segment was started.
    pub fn checkpoint(&mut self) -> bool {
        if self.degraded.is_some() {
            return false;
        }
        let t0 = Instant::now();
        let cpu0 = thread_cpu_ns();
        let result = self
            .gw
            .checkpoint()
            .map_err(DriverError::from)
            .and_then(|payload| {
                let mut record = Vec::with_capacity(payload.len() + 16);
                crate::journal::encode_record(
                    &mut record,
                    crate::gateway::record::CHECKPOINT,
                    &[&payload],
                );
                self.segments.last_checkpoint_bytes = record.len() as u64;
                Ok(self.journal.rotate(&self.rebuild.path, &record)?)
            });
        match result {
            Ok(archive) => {
                self.gw.checkpoint_written();
                self.segment_start = self.journal.len();
                self.segments.rotations += 1;
                self.segments.last_rotation_ns = t0.elapsed().as_nanos() as u64;
                self.segments.last_rotation_cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
                tracing::info!(
                    archived = %archive.display(),
                    checkpoint_bytes = self.segments.last_checkpoint_bytes,
                    took_us = self.segments.last_rotation_ns / 1000,
                    open_orders = self.gw.open_order_count(),
                    "journal: new segment started from a checkpoint"
                );
                true
            }
            Err(e) => {
                self.segments.failures += 1;
                tracing::error!(
                    error = %anyhow_chain(&e),
                    "journal: checkpoint failed; the current segment stays in use"
                );
                false
            }
        }
    }

    fn journal_failed(
        &mut self,
        e: JournalError,
        deliver: &mut dyn FnMut(EngineId, &Response),
    ) -> Result<(), DriverError> {
        self.journal_failures += 1;
        tracing::error!(
            error = %anyhow_chain(&e),
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
        for &(engine, cl, ty) in &self.batch {
            deliver(
                engine,
                &Response::reject(cl, ty, RejectReason::JournalUnavailable),
            );
        }
        self.batch.clear();
        // Their cancel-on-disconnect was not journaled either: it runs once the journal
        // is back.
        self.deferred_disconnects
            .append(&mut self.batch_disconnects);
        self.degraded = Some(Degraded {
            next_probe: Instant::now() + PROBE_INTERVAL,
        });
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

    /// Journal bytes a completed sync made durable (what survives a power loss).
    pub fn journal_durable_len(&self) -> u64 {
        self.journal.durable_len()
    }

    /// Forces the journal to disk.
    pub fn sync(&mut self) -> Result<(), DriverError> {
        Ok(self.journal.sync()?)
    }
}
