//! The shared-memory transport ([`rocebus::ipc`]) for C: a publisher with
//! `offer` and `try_claim` → commit/abort, a subscriber with `poll` (a C
//! callback and a fragment limit) and `poll_event`.

use crate::config::RocebusIpcConfig;
use crate::error::{guard, out_arg, str_arg, Fail, RocebusStatus};
use crate::handle::{self, c_handle, with_handle, Handle};
use rocebus::clock::Mono;
use rocebus::ipc::{
    IpcClaim, IpcError, IpcEvent, IpcOfferError, IpcPubEvent, IpcPublisher, IpcSubscriber,
};
use std::ffi::{c_char, c_int, c_void};
use std::ptr::NonNull;

/// A publisher of an ipc stream. Used by one thread at a time.
#[derive(Debug)]
pub struct RocebusIpcPublisher(Handle<Publisher>);

/// A subscriber of an ipc stream. Used by one thread at a time.
#[derive(Debug)]
pub struct RocebusIpcSubscriber(Handle<IpcSubscriber>);

c_handle!(RocebusIpcPublisher => Publisher, RocebusIpcSubscriber => IpcSubscriber);

/// The publisher and the claim open on it, if any.
///
/// The claim borrows the publisher mutably, and both live in this one
/// object between two C calls, so the borrow is kept by hand: the
/// publisher is its own heap allocation (a raw pointer, so that no `&mut`
/// to this struct asserts anything about it), the claim is dropped before
/// it, and while a claim is open the publisher is reached only through the
/// claim (every other call returns `ROCEBUS_STATUS_CLAIM_OPEN`).
#[derive(Debug)]
pub(crate) struct Publisher {
    claim: Option<IpcClaim<'static>>,
    publisher: NonNull<IpcPublisher>,
}

impl Publisher {
    /// The publisher, unless a claim holds it.
    #[inline(always)]
    fn get(&mut self) -> Result<&mut IpcPublisher, Fail> {
        if self.claim.is_some() {
            return Err(CLAIM_OPEN);
        }
        // SAFETY: from Box::into_raw in `rocebus_ipc_publisher_new`, freed
        // only in Drop; no claim borrows it (checked above), and `&mut
        // self` makes this the only reference.
        Ok(unsafe { self.publisher.as_mut() })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // An open claim is abandoned (subscribers skip it) before the
        // publisher it borrows goes.
        drop(self.claim.take());
        // SAFETY: from Box::into_raw, freed only here, and the claim that
        // borrowed it is gone.
        drop(unsafe { Box::from_raw(self.publisher.as_ptr()) });
    }
}

pub(crate) const CLAIM_OPEN: Fail = Fail::fixed(
    RocebusStatus::ClaimOpen,
    c"a claim is open on this publisher: commit or abort it first",
);
pub(crate) const NO_CLAIM: Fail = Fail::fixed(RocebusStatus::NoClaim, c"no claim is open");

#[cold]
fn ipc_fail(e: IpcError) -> Fail {
    let code = match e {
        IpcError::Config(_) => RocebusStatus::Config,
        IpcError::Name(_) => RocebusStatus::InvalidArgument,
        _ => RocebusStatus::Io,
    };
    Fail::owned(code, e)
}

#[inline]
fn offer_fail(e: IpcOfferError) -> Fail {
    match e {
        IpcOfferError::BackPressured => Fail::fixed(
            RocebusStatus::BackPressured,
            c"back-pressured: the slowest subscriber is a ring behind",
        ),
        IpcOfferError::TooLarge { .. } => Fail::fixed(
            RocebusStatus::TooLarge,
            c"payload exceeds the stream's max_payload",
        ),
        IpcOfferError::ReservedType => Fail::fixed(
            RocebusStatus::ReservedType,
            c"message type reserved for rocebus (0xFF00..=0xFFFF)",
        ),
    }
}

/// Nanoseconds of the process's monotonic clock (the reading every `poll`
/// takes as `now_ns`): read it once per turn of a polling loop.
#[no_mangle]
pub extern "C" fn rocebus_now_ns() -> u64 {
    let mut now = 0;
    guard(|| {
        now = Mono::now().as_nanos();
        Ok(0)
    });
    now
}

/// Creates stream `name` (letters, digits, `-`, `_`, `.`) in the
/// configuration's `dir` and publishes on it; subscribers already waiting
/// join on their next poll. On success `*out` is the new publisher, to
/// free with `rocebus_ipc_publisher_free` (which closes the stream).
///
/// # Safety
/// `cfg` is a live configuration, `name` a NUL-terminated string, `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_new(
    cfg: *const RocebusIpcConfig,
    name: *const c_char,
    out: *mut *mut RocebusIpcPublisher,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: NULL or a live configuration (the caller's promise).
        let cfg = unsafe { cfg.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?;
        // SAFETY: the caller's promise.
        let name = unsafe { str_arg(name, "name") }?;
        let p = IpcPublisher::new(&cfg.0, name).map_err(ipc_fail)?;
        let p = Publisher {
            claim: None,
            publisher: NonNull::from(Box::leak(Box::new(p))),
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = Box::into_raw(Box::new(RocebusIpcPublisher(Handle::new(p)))) };
        Ok(0)
    })
}

/// Closes the stream (subscribers see the publisher gone, cleanly) and
/// frees the publisher; an open claim is aborted. NULL is ignored.
/// Returns `ROCEBUS_STATUS_BUSY` (and frees nothing) when called from
/// inside a callback of this publisher.
///
/// # Safety
/// `p` is NULL or a publisher not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_free(p: *mut RocebusIpcPublisher) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(p) }.map(|()| 0))
}

/// Copies `len` bytes at `payload` into a frame of type `msg_type` (below
/// 0xFF00) and publishes it. `ROCEBUS_STATUS_BACK_PRESSURED`: try again
/// later (nothing was sent). Does not allocate.
///
/// # Safety
/// `p` is a live publisher; `payload` points to `len` readable bytes (or
/// `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_offer(
    p: *mut RocebusIpcPublisher,
    msg_type: u16,
    payload: *const u8,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            p.get()?.offer(msg_type, payload).map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// Claims a frame of `len` payload bytes of type `msg_type` in the ring
/// itself (zero copy): on success `*buf` points to the `len` bytes to
/// fill, valid until `rocebus_ipc_publisher_commit` (which publishes them)
/// or `rocebus_ipc_publisher_abort` (subscribers skip the frame). While the
/// claim is open every other call on the publisher returns
/// `ROCEBUS_STATUS_CLAIM_OPEN`. Does not allocate.
///
/// # Safety
/// `p` is a live publisher; `buf` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_try_claim(
    p: *mut RocebusIpcPublisher,
    msg_type: u16,
    len: usize,
    buf: *mut *mut u8,
) -> c_int {
    guard(|| {
        out_arg(buf, c"buf is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            if p.claim.is_some() {
                return Err(CLAIM_OPEN);
            }
            // SAFETY: the claim made from this reference is stored in
            // `p.claim` and dropped before the publisher (Drop above);
            // until then no other reference to the publisher is made
            // (`get` refuses while a claim is open).
            let publisher: &'static mut IpcPublisher = unsafe { &mut *p.publisher.as_ptr() };
            let mut claim = publisher.try_claim(msg_type, len).map_err(offer_fail)?;
            // SAFETY: checked not NULL; the caller promises it is writable.
            unsafe { *buf = claim.as_mut_ptr() };
            p.claim = Some(claim);
            Ok(())
        })?;
        Ok(0)
    })
}

/// Publishes the open claim's frame. `ROCEBUS_STATUS_NO_CLAIM` if none is open.
///
/// # Safety
/// `p` is a live publisher.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_commit(p: *mut RocebusIpcPublisher) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            p.claim.take().ok_or(NO_CLAIM)?.commit();
            Ok(0)
        })
    })
}

/// Abandons the open claim: subscribers skip its frame.
/// `ROCEBUS_STATUS_NO_CLAIM` if none is open.
///
/// # Safety
/// `p` is a live publisher.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_abort(p: *mut RocebusIpcPublisher) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            p.claim.take().ok_or(NO_CLAIM)?.abort();
            Ok(0)
        })
    })
}

/// Housekeeping for the publisher's loop: frees the slots of subscribers
/// whose process died (at most every `liveness_ms`). Returns how many
/// events wait for `rocebus_ipc_publisher_poll_event`.
///
/// # Safety
/// `p` is a live publisher.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_poll(
    p: *mut RocebusIpcPublisher,
    now_ns: u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            let n = p.get()?.poll(Mono::from_nanos(now_ns));
            Ok(n.min(c_int::MAX as usize) as c_int)
        })
    })
}

/// What `rocebus_ipc_publisher_poll_event` reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusIpcPubEventKind {
    /// A subscriber's process is gone: its slot (`slot`, `pid`) was freed.
    SubscriberGone = 1,
    /// A subscriber fell a ring behind in `flow = "drop"` mode and was
    /// dropped (`slot`); it continues from the newest frame.
    SubscriberDropped = 2,
}

/// A publisher's event; `pid` is 0 for `SUBSCRIBER_DROPPED`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusIpcPubEvent {
    /// What happened.
    pub kind: RocebusIpcPubEventKind,
    /// The subscriber's slot.
    pub slot: u32,
    /// `SUBSCRIBER_GONE`: its process id.
    pub pid: u32,
}

/// Takes the publisher's oldest event into `*out`: returns 1 if there was
/// one, 0 if none waits. At most `max_subscribers` wait; later ones are
/// lost (the Rust publisher's statistics count them).
///
/// # Safety
/// `p` is a live publisher; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_publisher_poll_event(
    p: *mut RocebusIpcPublisher,
    out: *mut RocebusIpcPubEvent,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let e = with_handle(unsafe { p.as_ref() }, c"publisher is NULL", |p| {
            Ok(p.get()?.poll_event())
        })?;
        let ev = match e {
            None => return Ok(0),
            Some(IpcPubEvent::SubscriberGone { slot, pid }) => RocebusIpcPubEvent {
                kind: RocebusIpcPubEventKind::SubscriberGone,
                slot: slot as u32,
                pid,
            },
            Some(IpcPubEvent::SubscriberDropped { slot }) => RocebusIpcPubEvent {
                kind: RocebusIpcPubEventKind::SubscriberDropped,
                slot: slot as u32,
                pid: 0,
            },
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = ev };
        Ok(1)
    })
}

/// Makes a subscriber of stream `name`. It never blocks: it joins the
/// stream's publisher in a later poll, whenever there is one (an
/// `ROCEBUS_IPC_EVENT_CONNECTED` event says when). On success `*out` is
/// the new subscriber, to free with `rocebus_ipc_subscriber_free`.
///
/// # Safety
/// `cfg` is a live configuration, `name` a NUL-terminated string, `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_subscriber_new(
    cfg: *const RocebusIpcConfig,
    name: *const c_char,
    out: *mut *mut RocebusIpcSubscriber,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: NULL or a live configuration (the caller's promise).
        let cfg = unsafe { cfg.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?;
        // SAFETY: the caller's promise.
        let name = unsafe { str_arg(name, "name") }?;
        let s = IpcSubscriber::new(&cfg.0, name).map_err(ipc_fail)?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = Box::into_raw(Box::new(RocebusIpcSubscriber(Handle::new(s)))) };
        Ok(0)
    })
}

/// Frees a subscriber (its slot in the stream is released). NULL is
/// ignored. Returns `ROCEBUS_STATUS_BUSY` (and frees nothing) when called
/// from inside this subscriber's handler.
///
/// # Safety
/// `s` is NULL or a subscriber not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_subscriber_free(s: *mut RocebusIpcSubscriber) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(s) }.map(|()| 0))
}

/// A subscriber's handler: called once per message, in order.
///
/// `payload` points into the stream's shared memory (or the subscriber's
/// copy) and is valid ONLY until the handler returns: copy what you keep.
/// The handler must not call rocebus functions on the same subscriber
/// (they return `ROCEBUS_STATUS_BUSY`); other handles are fine. It must
/// not unwind (no C++ exception may leave it).
pub type RocebusIpcHandler = Option<
    unsafe extern "C" fn(clientd: *mut c_void, msg_type: u16, payload: *const u8, len: usize),
>;

/// Delivers up to `fragment_limit` messages to `handler` (with `clientd`
/// as its first argument), in order; returns how many (0 when none
/// waited). Never blocks and does not allocate. `now_ns` is the turn's
/// `rocebus_now_ns()`; it paces the looks for a publisher. What happens to
/// the connection (joined, dropped, publisher gone) is an event for
/// `rocebus_ipc_subscriber_poll_event`.
///
/// # Safety
/// `s` is a live subscriber; `handler` is a function that does not unwind.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_subscriber_poll(
    s: *mut RocebusIpcSubscriber,
    now_ns: u64,
    handler: RocebusIpcHandler,
    clientd: *mut c_void,
    fragment_limit: usize,
) -> c_int {
    guard(|| {
        let handler =
            handler.ok_or(Fail::fixed(RocebusStatus::NullArgument, c"handler is NULL"))?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let n = with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            let Ok(n) = s.poll(
                Mono::from_nanos(now_ns),
                |m| {
                    // SAFETY: the payload is valid for this call (the
                    // header says the pointer is valid only until the
                    // handler returns); the handler does not unwind
                    // (the caller's promise).
                    unsafe { handler(clientd, m.msg_type, m.payload.as_ptr(), m.payload.len()) }
                },
                fragment_limit.min(c_int::MAX as usize),
            );
            Ok(n)
        })?;
        Ok(n as c_int)
    })
}

/// What `rocebus_ipc_subscriber_poll_event` reports.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusIpcEventKind {
    /// Joined a publisher's stream (at its newest frame): `session`,
    /// `publisher_pid`.
    Connected = 1,
    /// Fell a ring behind in `flow = "drop"` mode: `skipped_bytes` of
    /// frames were lost; delivery continues from the newest frame.
    Dropped = 2,
    /// The publisher closed the stream (`clean` = 1), died or was replaced
    /// (`clean` = 0); the subscriber rejoins by itself when one is there.
    PublisherGone = 3,
    /// The stream broke the protocol (a misbehaving process wrote into
    /// it); the subscriber left it and will rejoin.
    Corrupt = 4,
}

/// A subscriber's lifecycle event; the fields that do not apply to its
/// `kind` are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusIpcEvent {
    /// What happened.
    pub kind: RocebusIpcEventKind,
    /// `CONNECTED`: the publisher's random session id.
    pub session: u64,
    /// `CONNECTED`: the publisher's process id.
    pub publisher_pid: u32,
    /// `DROPPED`: bytes of frames skipped.
    pub skipped_bytes: u64,
    /// `PUBLISHER_GONE`: 1 if it closed the stream on purpose.
    pub clean: u8,
}

/// Takes the subscriber's oldest lifecycle event into `*out`: returns 1
/// if there was one, 0 if none waits.
///
/// # Safety
/// `s` is a live subscriber; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_subscriber_poll_event(
    s: *mut RocebusIpcSubscriber,
    out: *mut RocebusIpcEvent,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let e = with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            Ok(s.poll_event())
        })?;
        let Some(e) = e else { return Ok(0) };
        let mut ev = RocebusIpcEvent {
            kind: RocebusIpcEventKind::Connected,
            session: 0,
            publisher_pid: 0,
            skipped_bytes: 0,
            clean: 0,
        };
        match e {
            IpcEvent::Connected {
                session,
                publisher_pid,
            } => (ev.session, ev.publisher_pid) = (session, publisher_pid),
            IpcEvent::Dropped { skipped_bytes } => {
                (ev.kind, ev.skipped_bytes) = (RocebusIpcEventKind::Dropped, skipped_bytes)
            }
            IpcEvent::PublisherGone { clean } => {
                (ev.kind, ev.clean) = (RocebusIpcEventKind::PublisherGone, clean as u8)
            }
            IpcEvent::Corrupt(_) => ev.kind = RocebusIpcEventKind::Corrupt,
        }
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = ev };
        Ok(1)
    })
}

/// Whether the subscriber is joined to a live publisher: 1 or 0.
///
/// # Safety
/// `s` is a live subscriber.
#[no_mangle]
pub unsafe extern "C" fn rocebus_ipc_subscriber_is_connected(
    s: *mut RocebusIpcSubscriber,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"subscriber is NULL", |s| {
            Ok(s.is_connected() as c_int)
        })
    })
}

/// `len` bytes at `p` as a slice (an empty one when `len` is 0, whatever `p`).
///
/// # Safety
/// `p` points to `len` readable bytes that stay unchanged during the call,
/// or `len` is 0.
#[inline(always)]
pub(crate) unsafe fn bytes<'a>(p: *const u8, len: usize) -> Result<&'a [u8], Fail> {
    if len == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Fail::fixed(
            RocebusStatus::NullArgument,
            c"payload is NULL with a length above 0",
        ));
    }
    // SAFETY: not NULL, `len` readable bytes (the caller's promise).
    Ok(unsafe { std::slice::from_raw_parts(p, len) })
}
