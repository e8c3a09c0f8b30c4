//! The market-data subscriber ([`rocebus::mcast::MdSubscriber`]) for C: the bus the feed
//! handler publishes, on whichever transport the channel is configured for (UD multicast
//! with gap recovery, or RC fan-out). `poll` delivers messages in sequence order to a C
//! callback, with a fragment limit; lifecycle events (loss, resync, snapshot, recovery link
//! lost and back) go to an event callback or wait for `poll_event`; snapshots are restored
//! through three optional callbacks, or skipped and reported as a gap.

use crate::error::{guard, out_arg, str_arg, Fail, RocebusStatus};
use crate::handle::{self, c_handle, with_handle, Handle};
use rocebus::clock::Mono;
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{
    Event, Handler, MdSubscriber, NetError, RestoreError, SnapshotSink, SubscriberCounters,
};
use std::ffi::{c_char, c_int, c_void};
use std::net::IpAddr;

/// A market-data path's configuration (`rocebus_md_config_from_toml`).
#[derive(Debug)]
pub struct RocebusMdConfig(McastConfig);

/// A subscriber of one market-data channel. Used by one thread at a time.
#[derive(Debug)]
pub struct RocebusMdSubscriber(Handle<Subscriber>);

c_handle!(RocebusMdSubscriber => Subscriber);

/// The subscriber and the last sequence its application saw (or was told it missed), for
/// the snapshots it skips when the application restores none.
#[derive(Debug)]
pub(crate) struct Subscriber {
    sub: MdSubscriber,
    last: u64,
}

/// `[market_data]` of a file (the feed handler's configuration, which both sides share), or
/// the whole text when it has no such table, plus a top-level `[rdma]`
/// ([`McastConfig::from_service_toml_str`], as a Rust engine reads it).
fn parse(text: &str) -> Result<McastConfig, Fail> {
    McastConfig::from_service_toml_str(text).map_err(|e| {
        // The source chain: the TOML error names the line and the key.
        let mut msg = format!("invalid market-data configuration: {e}");
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        Fail::owned(RocebusStatus::Config, msg)
    })
}

fn md_config(text: &str, out: *mut *mut RocebusMdConfig) -> Result<c_int, Fail> {
    out_arg(out, c"out is NULL")?;
    let cfg = parse(text)?;
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { *out = Box::into_raw(Box::new(RocebusMdConfig(cfg))) };
    Ok(0)
}

/// Makes a market-data configuration from TOML text: the feed handler's configuration
/// file (its `[market_data]` table: channels, groups, recovery, auth; the other tables are
/// ignored), or a market-data file (`configs/md.toml`, the keys at the top level). A
/// top-level `[rdma]` table gives the transport settings. On success `*out` is a new
/// configuration to free with `rocebus_md_config_free`.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_config_from_toml(
    toml: *const c_char,
    out: *mut *mut RocebusMdConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { str_arg(toml, "toml") }?;
        md_config(text, out)
    })
}

/// As `rocebus_md_config_from_toml`, reading the file at `path`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_config_from_file(
    path: *const c_char,
    out: *mut *mut RocebusMdConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { str_arg(path, "path") }?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::owned(RocebusStatus::Config, format!("reading {path}: {e}")))?;
        md_config(&text, out)
    })
}

/// Frees a market-data configuration (NULL is ignored).
///
/// # Safety
/// `cfg` is NULL or a configuration not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_config_free(cfg: *mut RocebusMdConfig) {
    guard(|| {
        if !cfg.is_null() {
            // SAFETY: made by Box::into_raw above, not freed yet (the caller's promise).
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(0)
    });
}

#[cold]
fn net_fail(e: NetError) -> Fail {
    let code = match &e {
        NetError::NoChannel(_) => RocebusStatus::InvalidArgument,
        NetError::Admission { .. } => RocebusStatus::Refused,
        _ => RocebusStatus::Io,
    };
    Fail::owned(code, e)
}

fn ip_arg(p: *const c_char, what: &str) -> Result<IpAddr, Fail> {
    // SAFETY: the public functions' callers promise a NUL-terminated string.
    let s = unsafe { str_arg(p, what) }?;
    s.parse().map_err(|_| {
        Fail::owned(
            RocebusStatus::InvalidArgument,
            format!("{what} {s:?} is not an IP address"),
        )
    })
}

/// Makes the subscriber and writes it to `out`.
fn subscriber(
    cfg: *const RocebusMdConfig,
    channel: u16,
    local: *const c_char,
    publisher: *const c_char,
    out: *mut *mut RocebusMdSubscriber,
    open: fn(&McastConfig, u16, IpAddr, IpAddr) -> Result<MdSubscriber, NetError>,
) -> Result<c_int, Fail> {
    out_arg(out, c"out is NULL")?;
    // SAFETY: NULL or a live configuration (the public functions' callers' promise).
    let cfg =
        unsafe { cfg.as_ref() }.ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?;
    let (local, publisher) = (ip_arg(local, "local")?, ip_arg(publisher, "publisher")?);
    let sub = open(&cfg.0, channel, local, publisher).map_err(net_fail)?;
    let h = RocebusMdSubscriber(Handle::new(Subscriber { sub, last: 0 }));
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { *out = Box::into_raw(Box::new(h)) };
    Ok(0)
}

/// Subscribes to market-data `channel` from `local` (our address on the RDMA device) with
/// the publisher (the feed handler's `publish.local_ip`) at `publisher`, without waiting:
/// the connection to the publisher is made by later polls and reported as a
/// `RECOVERY_RESTORED` event. On success `*out` is the subscriber, to free with
/// `rocebus_md_subscriber_free`.
///
/// # Safety
/// `cfg` is a live configuration; `local` and `publisher` NUL-terminated strings; `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_new(
    cfg: *const RocebusMdConfig,
    channel: u16,
    local: *const c_char,
    publisher: *const c_char,
    out: *mut *mut RocebusMdSubscriber,
) -> c_int {
    guard(|| subscriber(cfg, channel, local, publisher, out, MdSubscriber::new))
}

/// As `rocebus_md_subscriber_new`, then waits for the connection to the publisher (up to
/// the configuration's `connect_timeout_ms`).
///
/// # Safety
/// As `rocebus_md_subscriber_new`.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_connect(
    cfg: *const RocebusMdConfig,
    channel: u16,
    local: *const c_char,
    publisher: *const c_char,
    out: *mut *mut RocebusMdSubscriber,
) -> c_int {
    guard(|| subscriber(cfg, channel, local, publisher, out, MdSubscriber::connect))
}

/// Leaves the channel and frees the subscriber (NULL is ignored). Returns
/// `ROCEBUS_STATUS_BUSY` (and frees nothing) from inside this subscriber's callbacks.
///
/// # Safety
/// `s` is NULL or a subscriber not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_free(s: *mut RocebusMdSubscriber) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(s) }.map(|()| 0))
}

/// What a market-data event reports (`rocebus_md_event_t.kind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusMdEventKind {
    /// Messages `[from, to)` cannot be recovered; a resync from a snapshot follows.
    UnrecoverableLoss = 1,
    /// The publisher restarted: session `from` became `to`; state reset, snapshot asked.
    SessionChanged = 2,
    /// A re-synchronisation (or late join) started; a snapshot is requested.
    ResyncStarted = 3,
    /// A snapshot was applied (`seq`); delivery resumes at `seq + 1`.
    SnapshotApplied = 4,
    /// The recovery connection is down: holes become unrecoverable until it is back.
    RecoveryLost = 5,
    /// The recovery connection is up (also: first connected).
    RecoveryRestored = 6,
    /// Gap-tolerant delivery skipped `[from, to)` (the handler's `on_gap` saw it first).
    GapSkipped = 7,
}

/// A market-data lifecycle event; the fields that do not apply to its `kind` are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusMdEvent {
    /// What happened.
    pub kind: RocebusMdEventKind,
    /// First sequence of a range; the old session for `SESSION_CHANGED`.
    pub from: u64,
    /// One past the last sequence of a range; the new session for `SESSION_CHANGED`.
    pub to: u64,
    /// `SNAPSHOT_APPLIED`: the snapshot's sequence.
    pub seq: u64,
}

impl From<Event> for RocebusMdEvent {
    fn from(e: Event) -> Self {
        use RocebusMdEventKind as K;
        let (kind, from, to, seq) = match e {
            Event::UnrecoverableLoss { from, to } => (K::UnrecoverableLoss, from, to, 0),
            Event::SessionChanged { old, new } => (K::SessionChanged, old, new, 0),
            Event::ResyncStarted => (K::ResyncStarted, 0, 0, 0),
            Event::SnapshotApplied { seq } => (K::SnapshotApplied, 0, 0, seq),
            Event::RecoveryLost => (K::RecoveryLost, 0, 0, 0),
            Event::RecoveryRestored => (K::RecoveryRestored, 0, 0, 0),
            Event::GapSkipped { from, to } => (K::GapSkipped, from, to, 0),
        };
        RocebusMdEvent {
            kind,
            from,
            to,
            seq,
        }
    }
}

/// A subscriber's callbacks, with `clientd` as their first argument. Every pointer they
/// receive is valid ONLY until they return (copy what you keep). They must not call
/// functions on the same subscriber (`ROCEBUS_STATUS_BUSY`) and must not unwind.
///
/// - `on_message` (required): one message, in sequence order: `seq` is one more than the
///   previous one's, except after a gap or a snapshot.
/// - `on_gap` (optional): sequences `[from, to)` will never be delivered (gap-tolerant
///   delivery, or a snapshot the application does not restore).
/// - `on_event` (optional): a lifecycle event, after the messages that came before it.
///   NULL: events wait for `rocebus_md_subscriber_poll_event`.
/// - Snapshots (optional; all three or none): `on_snapshot_begin` starts a transfer
///   (discard what an earlier one staged), `on_snapshot_chunk` gets the next piece,
///   `on_snapshot_end` says all arrived (length and CRC checked) and the state now reflects
///   every message up to `seq`; the two return 0, or non-zero to refuse the snapshot (a
///   new one is requested). With none, a snapshot's bytes are skipped and `on_gap` tells
///   what was missed (the application keeps no state worth a snapshot).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusMdHandler {
    /// The callbacks' first argument.
    pub clientd: *mut c_void,
    /// One message.
    pub on_message:
        Option<unsafe extern "C" fn(clientd: *mut c_void, seq: u64, msg: *const u8, len: usize)>,
    /// Sequences lost for good.
    pub on_gap: Option<unsafe extern "C" fn(clientd: *mut c_void, from: u64, to: u64)>,
    /// A lifecycle event.
    pub on_event: Option<unsafe extern "C" fn(clientd: *mut c_void, event: *const RocebusMdEvent)>,
    /// A snapshot transfer starts.
    pub on_snapshot_begin: Option<unsafe extern "C" fn(clientd: *mut c_void)>,
    /// The next piece of a snapshot; 0, or non-zero to refuse it.
    pub on_snapshot_chunk:
        Option<unsafe extern "C" fn(clientd: *mut c_void, data: *const u8, len: usize) -> c_int>,
    /// A snapshot is complete at `seq`; 0, or non-zero to refuse it.
    pub on_snapshot_end: Option<unsafe extern "C" fn(clientd: *mut c_void, seq: u64) -> c_int>,
}

type OnMessage = unsafe extern "C" fn(*mut c_void, u64, *const u8, usize);
type SnapshotFns = (
    unsafe extern "C" fn(*mut c_void),
    unsafe extern "C" fn(*mut c_void, *const u8, usize) -> c_int,
    unsafe extern "C" fn(*mut c_void, u64) -> c_int,
);

/// The C callbacks as the Rust subscriber's [`Handler`] and [`SnapshotSink`].
struct CApp<'a> {
    h: &'a RocebusMdHandler,
    on_message: OnMessage,
    snapshots: Option<SnapshotFns>,
    /// The last sequence the application saw or was told it missed (kept in the handle
    /// between polls).
    last: &'a mut u64,
}

impl CApp<'_> {
    fn gap(&mut self, from: u64, to: u64) {
        *self.last = (*self.last).max(to.saturating_sub(1));
        if let Some(f) = self.h.on_gap {
            // SAFETY: the callback does not unwind (the caller's promise).
            unsafe { f(self.h.clientd, from, to) }
        }
    }
}

impl Handler for CApp<'_> {
    #[inline]
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        *self.last = seq;
        // SAFETY: `msg` is valid for this call (the header says only until the callback
        // returns); the callback does not unwind (the caller's promise).
        unsafe { (self.on_message)(self.h.clientd, seq, msg.as_ptr(), msg.len()) }
    }

    fn on_gap(&mut self, from: u64, to: u64) {
        self.gap(from, to);
    }
}

impl SnapshotSink for CApp<'_> {
    fn begin_restore(&mut self) {
        if let Some((begin, _, _)) = self.snapshots {
            // SAFETY: the callback does not unwind (the caller's promise).
            unsafe { begin(self.h.clientd) }
        }
    }

    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        let Some((_, chunk, _)) = self.snapshots else {
            return Ok(());
        };
        // SAFETY: `data` is valid for this call (the header says only until the callback
        // returns); the callback does not unwind (the caller's promise).
        match unsafe { chunk(self.h.clientd, data.as_ptr(), data.len()) } {
            0 => Ok(()),
            _ => Err(RestoreError),
        }
    }

    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        let Some((_, _, end)) = self.snapshots else {
            // Not restored: what the snapshot covered is a gap to the application.
            if snapshot_seq > *self.last {
                self.gap(*self.last + 1, snapshot_seq + 1);
            }
            return Ok(());
        };
        // SAFETY: the callback does not unwind (the caller's promise).
        match unsafe { end(self.h.clientd, snapshot_seq) } {
            0 => {
                *self.last = snapshot_seq;
                Ok(())
            }
            _ => Err(RestoreError),
        }
    }
}

/// Delivers what arrived, in sequence order, to `handler`'s callbacks, taking at most
/// `fragment_limit` datagrams (frames on RC) from each line; returns the work done (0: none
/// waited). Also keeps the protocol going: gap detection, retransmission and snapshot
/// requests, the recovery connection. `now_ns` is the turn's `rocebus_now_ns()`. Events go
/// to `on_event` when set. Never blocks. `ROCEBUS_STATUS_IO` when the device fails.
///
/// # Safety
/// `s` is a live subscriber; `handler` points to callbacks that do not unwind.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_poll(
    s: *mut RocebusMdSubscriber,
    now_ns: u64,
    handler: *const RocebusMdHandler,
    fragment_limit: usize,
) -> c_int {
    guard(|| {
        // SAFETY: NULL or valid for the call (the caller's promise).
        let h = unsafe { handler.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"handler is NULL"))?;
        let on_message = h.on_message.ok_or(Fail::fixed(
            RocebusStatus::NullArgument,
            c"handler->on_message is NULL",
        ))?;
        let snapshots = match (h.on_snapshot_begin, h.on_snapshot_chunk, h.on_snapshot_end) {
            (Some(b), Some(c), Some(e)) => Some((b, c, e)),
            (None, None, None) => None,
            _ => {
                return Err(Fail::fixed(
                    RocebusStatus::InvalidArgument,
                    c"handler: set all three on_snapshot_* callbacks, or none",
                ))
            }
        };
        // SAFETY: the caller's promise: NULL or a live handle.
        let n = with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            let mut app = CApp {
                h,
                on_message,
                snapshots,
                last: &mut s.last,
            };
            let n = s
                .sub
                .poll(Mono::from_nanos(now_ns), &mut app, fragment_limit)
                .map_err(net_fail)?;
            if let Some(on_event) = h.on_event {
                while let Some(e) = s.sub.poll_event() {
                    let e = RocebusMdEvent::from(e);
                    // SAFETY: `e` lives for this call (valid only until the callback
                    // returns); the callback does not unwind (the caller's promise).
                    unsafe { on_event(h.clientd, &e) }
                }
            }
            Ok(n)
        })?;
        Ok(n.min(c_int::MAX as usize) as c_int)
    })
}

/// Takes the subscriber's oldest lifecycle event into `*out` (when the poll handler has no
/// `on_event`): returns 1 if there was one, 0 if none waits.
///
/// # Safety
/// `s` is a live subscriber; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_poll_event(
    s: *mut RocebusMdSubscriber,
    out: *mut RocebusMdEvent,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let e = with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            Ok(s.sub.poll_event())
        })?;
        let Some(e) = e else { return Ok(0) };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = e.into() };
        Ok(1)
    })
}

/// Whether the connection to the publisher is up (the recovery connection on multicast,
/// the stream itself on RC): 1 or 0.
///
/// # Safety
/// `s` is a live subscriber.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_is_connected(s: *mut RocebusMdSubscriber) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            Ok(s.sub.connected() as c_int)
        })
    })
}

/// A subscriber's protocol counters (`rocebus_md_subscriber_counters`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RocebusMdCounters {
    /// Datagrams received on line A.
    pub received_a: u64,
    /// Datagrams received on line B.
    pub received_b: u64,
    /// Retransmitted datagrams received.
    pub received_retransmit: u64,
    /// Messages delivered to `on_message`.
    pub delivered: u64,
    /// Holes detected in the sequence.
    pub gaps_detected: u64,
    /// Messages that arrived by retransmission and were used.
    pub messages_recovered: u64,
    /// `UNRECOVERABLE_LOSS` events.
    pub unrecoverable: u64,
    /// Snapshots applied.
    pub snapshots_applied: u64,
    /// Snapshots rejected (bad length, CRC, or refused by the application).
    pub snapshots_rejected: u64,
    /// Undecodable input dropped.
    pub malformed_dropped: u64,
    /// Events lost because they were not taken often enough.
    pub events_dropped: u64,
    /// Sequences skipped by gap-tolerant delivery.
    pub sequences_skipped: u64,
}

impl From<SubscriberCounters> for RocebusMdCounters {
    fn from(c: SubscriberCounters) -> Self {
        RocebusMdCounters {
            received_a: c.received_a,
            received_b: c.received_b,
            received_retransmit: c.received_retransmit,
            delivered: c.delivered,
            gaps_detected: c.gaps_detected,
            messages_recovered: c.messages_recovered,
            unrecoverable: c.unrecoverable,
            snapshots_applied: c.snapshots_applied,
            snapshots_rejected: c.snapshots_rejected,
            malformed_dropped: c.malformed_dropped,
            events_dropped: c.events_dropped,
            sequences_skipped: c.sequences_skipped,
        }
    }
}

/// Copies the subscriber's counters into `*out`.
///
/// # Safety
/// `s` is a live subscriber; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_md_subscriber_counters(
    s: *mut RocebusMdSubscriber,
    out: *mut RocebusMdCounters,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let c = with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            Ok(s.sub.counters())
        })?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = c.into() };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FEED_HANDLER: &str = include_str!("../../configs/demo/feed-handler.toml");

    #[test]
    fn the_feed_handlers_file_is_read_for_its_market_data_table() {
        let cfg = parse(FEED_HANDLER).unwrap();
        let ids: Vec<u16> = cfg.channels.iter().map(|c| c.id).collect();
        assert_eq!(ids, [1, 2]);
        let md = include_str!("../../configs/md.toml");
        assert!(!parse(md).unwrap().channels.is_empty());
        let e =
            parse(&FEED_HANDLER.replace("history_depth = 16384", "history_depth = 0")).unwrap_err();
        assert_eq!(e.code, RocebusStatus::Config);
        assert!(format!("{e:?}").contains("history_depth"), "{e:?}");
    }

    #[allow(clippy::type_complexity)]
    static SEEN: std::sync::Mutex<Vec<(char, u64, u64)>> = std::sync::Mutex::new(Vec::new());

    unsafe extern "C" fn msg(_: *mut c_void, seq: u64, _: *const u8, len: usize) {
        SEEN.lock().unwrap().push(('m', seq, len as u64));
    }
    unsafe extern "C" fn gap(_: *mut c_void, from: u64, to: u64) {
        SEEN.lock().unwrap().push(('g', from, to));
    }

    /// Without snapshot callbacks, a snapshot is a gap from the last message seen to the
    /// snapshot's sequence, and the next message follows it.
    #[test]
    fn a_snapshot_not_restored_is_a_gap() {
        let h = RocebusMdHandler {
            clientd: std::ptr::null_mut(),
            on_message: Some(msg),
            on_gap: Some(gap),
            on_event: None,
            on_snapshot_begin: None,
            on_snapshot_chunk: None,
            on_snapshot_end: None,
        };
        let mut last = 0;
        let mut app = CApp {
            h: &h,
            on_message: msg,
            snapshots: None,
            last: &mut last,
        };
        app.on_message(1, b"ab");
        app.begin_restore();
        app.restore_chunk(b"state").unwrap();
        app.finish_restore(10).unwrap();
        app.on_message(11, b"c");
        app.finish_restore(5).unwrap(); // older than what was seen: nothing
        assert_eq!(
            *SEEN.lock().unwrap(),
            [('m', 1, 2), ('g', 2, 11), ('m', 11, 1)]
        );
    }
}
