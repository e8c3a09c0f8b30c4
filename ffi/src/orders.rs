//! The orders path ([`rocebus::orders`]) for C: connect to a listener or
//! accept from one, then on the connection `offer`, `try_claim` →
//! commit/abort, `flush`, and `poll` with a C callback and a fragment
//! limit.

use crate::config::RocebusOrdersConfig;
use crate::error::{guard, out_arg, str_arg, Fail, RocebusStatus};
use crate::handle::{self, c_handle, with_handle, Handle};
use crate::ipc::{bytes, CLAIM_OPEN, NO_CLAIM};
use rocebus::orders::{Claim, Connection, OfferError, OrdersError, OrdersListener, PeerLost};
use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::time::Duration;

/// An orders connection (either end). Used by one thread at a time.
#[derive(Debug)]
pub struct RocebusOrdersConnection(Handle<Conn>);

/// A listener for orders connections (the gateway's side).
#[derive(Debug)]
pub struct RocebusOrdersListener(Handle<OrdersListener>);

c_handle!(RocebusOrdersConnection => Conn, RocebusOrdersListener => OrdersListener);

/// The connection and the claim open on it, kept as `ipc.rs`'s
/// `Publisher` keeps its claim: the connection in its own allocation (a raw
/// pointer), the claim dropped first, the connection reached only through
/// the claim while one is open.
#[derive(Debug)]
pub(crate) struct Conn {
    claim: Option<Claim<'static>>,
    conn: NonNull<Connection>,
}

impl Conn {
    fn new(c: Connection) -> Conn {
        Conn {
            claim: None,
            conn: NonNull::from(Box::leak(Box::new(c))),
        }
    }

    /// The connection, unless a claim holds it.
    #[inline(always)]
    fn get(&mut self) -> Result<&mut Connection, Fail> {
        if self.claim.is_some() {
            return Err(CLAIM_OPEN);
        }
        // SAFETY: from Box::leak in `Conn::new`, freed only in Drop; no
        // claim borrows it (checked above), and `&mut self` makes this the
        // only reference.
        Ok(unsafe { self.conn.as_mut() })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // The claim (which has no destructor: an abandoned claim is replaced
        // by the next) goes first: nothing may borrow the connection below.
        self.claim = None;
        // SAFETY: from Box::leak in `Conn::new`, freed only here, after the
        // claim that borrowed it.
        drop(unsafe { Box::from_raw(self.conn.as_ptr()) });
    }
}

#[inline]
fn lost_fail(l: PeerLost) -> Fail {
    Fail::fixed(
        RocebusStatus::PeerLost,
        match l {
            PeerLost::Completion(_) => c"connection lost: a work request failed",
            PeerLost::Disconnected => c"connection lost: the peer disconnected",
            PeerLost::Closed => c"connection lost: closed (a protocol violation, or closed here)",
            PeerLost::Silent => c"connection lost: the peer was silent past the liveness timeout",
        },
    )
}

#[inline]
pub(crate) fn offer_fail(e: OfferError) -> Fail {
    match e {
        OfferError::BackPressured => Fail::fixed(
            RocebusStatus::BackPressured,
            c"back-pressured: the peer's ring is full",
        ),
        OfferError::TooLarge { .. } => Fail::fixed(
            RocebusStatus::TooLarge,
            c"payload exceeds the connection's max_payload",
        ),
        OfferError::ReservedType => Fail::fixed(
            RocebusStatus::ReservedType,
            c"message type reserved for rocebus (0xFF00..=0xFFFF)",
        ),
        OfferError::PeerLost(l) => lost_fail(l),
    }
}

#[cold]
pub(crate) fn orders_fail(e: OrdersError) -> Fail {
    let code = match &e {
        OrdersError::PeerLost(l) => return lost_fail(*l),
        OrdersError::Config(_) => RocebusStatus::Config,
        OrdersError::Verbs(_) => RocebusStatus::Io,
        OrdersError::Corrupt(_) => RocebusStatus::Corrupt,
        _ => RocebusStatus::Refused,
    };
    Fail::owned(code, e)
}

fn addr_arg(p: *const c_char) -> Result<SocketAddr, Fail> {
    // SAFETY: the public functions' callers promise a NUL-terminated string.
    let s = unsafe { str_arg(p, "addr") }?;
    s.parse().map_err(|_| {
        Fail::owned(
            RocebusStatus::InvalidArgument,
            format!("addr {s:?} is not an IP address and port (\"198.18.0.1:7470\")"),
        )
    })
}

fn new_conn(c: Connection, out: *mut *mut RocebusOrdersConnection) {
    let h = Box::new(RocebusOrdersConnection(Handle::new(Conn::new(c))));
    // SAFETY: the callers checked `out` is not NULL; the public functions'
    // callers promise it is writable.
    unsafe { *out = Box::into_raw(h) };
}

/// Connects to the orders listener at `addr` (`"IP:PORT"`): both sides
/// prove they hold the configuration's `token`. Blocks until connected or
/// failed, bounded by `connect_timeout_ms` for resolution and for the
/// handshake. On success `*out` is the new connection, to free with
/// `rocebus_orders_connection_free`.
///
/// # Safety
/// `cfg` is a live configuration, `addr` a NUL-terminated string, `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connect(
    cfg: *const RocebusOrdersConfig,
    addr: *const c_char,
    out: *mut *mut RocebusOrdersConnection,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: NULL or a live configuration (the caller's promise).
        let cfg = unsafe { cfg.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?;
        let c = Connection::connect(&cfg.0, addr_arg(addr)?).map_err(orders_fail)?;
        new_conn(c, out);
        Ok(0)
    })
}

/// Listens for orders connections on `addr` (`"IP:PORT"`; port 0 picks
/// one, see `rocebus_orders_listener_local_port`). On success `*out` is
/// the new listener, to free with `rocebus_orders_listener_free`.
///
/// # Safety
/// `cfg` is a live configuration, `addr` a NUL-terminated string, `out`
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_listener_bind(
    cfg: *const RocebusOrdersConfig,
    addr: *const c_char,
    out: *mut *mut RocebusOrdersListener,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: NULL or a live configuration (the caller's promise).
        let cfg = unsafe { cfg.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?;
        let l = OrdersListener::bind(cfg.0.clone(), addr_arg(addr)?).map_err(orders_fail)?;
        let h = Box::new(RocebusOrdersListener(Handle::new(l)));
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = Box::into_raw(h) };
        Ok(0)
    })
}

/// The listener's bound port (a positive number).
///
/// # Safety
/// `l` is a live listener.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_listener_local_port(
    l: *mut RocebusOrdersListener,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { l.as_ref() }, c"listener is NULL", |l| {
            Ok(l.local_port() as c_int)
        })
    })
}

/// Waits up to `timeout_ms` for a peer to complete its handshake: on
/// success `*out` is the new connection; `ROCEBUS_STATUS_TIMEOUT` when
/// none did. Refused and failed handshakes are counted and logged, and the
/// wait goes on.
///
/// # Safety
/// `l` is a live listener; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_listener_accept(
    l: *mut RocebusOrdersListener,
    timeout_ms: u64,
    out: *mut *mut RocebusOrdersConnection,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let c = with_handle(unsafe { l.as_ref() }, c"listener is NULL", |l| {
            l.accept(Duration::from_millis(timeout_ms))
                .map_err(orders_fail)
        })?;
        let c = c.ok_or(Fail::fixed(
            RocebusStatus::Timeout,
            c"no peer completed a handshake in time",
        ))?;
        new_conn(c, out);
        Ok(0)
    })
}

/// Frees a listener (NULL is ignored); connections accepted from it live on.
///
/// # Safety
/// `l` is NULL or a listener not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_listener_free(l: *mut RocebusOrdersListener) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(l) }.map(|()| 0))
}

/// Disconnects and frees a connection (NULL is ignored); an open claim is
/// abandoned. Returns `ROCEBUS_STATUS_BUSY` (and frees nothing) when
/// called from inside this connection's poll handler.
///
/// # Safety
/// `c` is NULL or a connection not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_free(c: *mut RocebusOrdersConnection) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(c) }.map(|()| 0))
}

/// Copies `len` bytes at `payload` into a frame of type `msg_type` (below
/// 0xFF00) on `stream_id`; it goes out with the next
/// `rocebus_orders_connection_flush`. `ROCEBUS_STATUS_BACK_PRESSURED`: the
/// peer's ring is full, poll and try again. Does not allocate.
///
/// # Safety
/// `c` is a live connection; `payload` points to `len` readable bytes (or
/// `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_offer(
    c: *mut RocebusOrdersConnection,
    stream_id: u16,
    msg_type: u16,
    payload: *const u8,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.get()?
                .offer(stream_id, msg_type, payload)
                .map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// `rocebus_orders_connection_offer` then `rocebus_orders_connection_flush`
/// in one call, as the Rust `offer_and_flush`: the frame goes out now. The
/// usual case (nothing else waiting for a flush, a frame that fits before
/// the ring's end within the credit) is one step through the prepared
/// WRITE; a request/response engine sends this way. The same statuses as
/// the two calls. Does not allocate.
///
/// # Safety
/// `c` is a live connection; `payload` points to `len` readable bytes (or
/// `len` is 0).
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_offer_and_flush(
    c: *mut RocebusOrdersConnection,
    stream_id: u16,
    msg_type: u16,
    payload: *const u8,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let payload = unsafe { bytes(payload, len) }?;
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.get()?
                .offer_and_flush(stream_id, msg_type, payload)
                .map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// Claims `len` bytes for a frame of type `msg_type` on `stream_id` in the
/// registered memory the device sends from (zero copy): on success `*buf`
/// points to the `len` bytes to fill, valid until
/// `rocebus_orders_connection_commit` (the frame then goes out with the
/// next flush) or `rocebus_orders_connection_abort` (nothing is sent).
/// While the claim is open every other call on the connection returns
/// `ROCEBUS_STATUS_CLAIM_OPEN`. Does not allocate.
///
/// # Safety
/// `c` is a live connection; `buf` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_try_claim(
    c: *mut RocebusOrdersConnection,
    stream_id: u16,
    msg_type: u16,
    len: usize,
    buf: *mut *mut u8,
) -> c_int {
    guard(|| {
        out_arg(buf, c"buf is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            if c.claim.is_some() {
                return Err(CLAIM_OPEN);
            }
            // SAFETY: the claim made from this reference is stored in
            // `c.claim` and dropped before the connection (Drop
            // above); until then no other reference to the connection
            // is made (`get` refuses while a claim is open).
            let conn: &'static mut Connection = unsafe { &mut *c.conn.as_ptr() };
            let mut claim = conn
                .try_claim(stream_id, msg_type, len)
                .map_err(offer_fail)?;
            // SAFETY: checked not NULL; the caller promises it is writable.
            unsafe { *buf = claim.as_mut_ptr() };
            c.claim = Some(claim);
            Ok(())
        })?;
        Ok(0)
    })
}

/// Commits the open claim: its frame goes out with the next flush.
/// `ROCEBUS_STATUS_NO_CLAIM` if none is open.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_commit(
    c: *mut RocebusOrdersConnection,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.claim.take().ok_or(NO_CLAIM)?.commit();
            Ok(0)
        })
    })
}

/// Abandons the open claim: nothing is sent, the next claim takes its
/// room. `ROCEBUS_STATUS_NO_CLAIM` if none is open.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_abort(c: *mut RocebusOrdersConnection) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.claim.take().ok_or(NO_CLAIM)?.abort();
            Ok(0)
        })
    })
}

/// Writes everything committed since the last flush: one RDMA WRITE per
/// contiguous run, one doorbell. Does not allocate.
///
/// # Safety
/// `c` is a live connection.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_flush(c: *mut RocebusOrdersConnection) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.get()?.flush().map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// One received frame, as a poll handler sees it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusFrame {
    /// The stream it was sent on.
    pub stream_id: u16,
    /// Its message type.
    pub msg_type: u16,
    /// The connection's sequence number of the frame.
    pub seq: u64,
    /// The payload: valid ONLY until the handler returns (the connection's
    /// copy, reused for the next frame). Copy what you keep.
    pub payload: *const u8,
    /// Bytes at `payload`.
    pub len: usize,
}

/// A connection's poll handler: called once per frame, in order. `frame`
/// and the bytes it points to are valid ONLY until the handler returns.
/// The handler must not call rocebus functions on the same connection
/// (they return `ROCEBUS_STATUS_BUSY`: to answer a frame, keep what you
/// need and offer after the poll returns); other handles are fine. It must
/// not unwind (no C++ exception may leave it).
pub type RocebusFrameHandler =
    Option<unsafe extern "C" fn(clientd: *mut c_void, frame: *const RocebusFrame)>;

/// Delivers up to `fragment_limit` received frames to `handler` (with
/// `clientd` as its first argument), in order; returns how many. Also
/// returns credit to the peer and, when nothing arrived, flushes and
/// checks the peer's health. Never blocks and does not allocate.
/// `ROCEBUS_STATUS_PEER_LOST` once the peer is gone,
/// `ROCEBUS_STATUS_CORRUPT` if it broke the protocol.
///
/// # Safety
/// `c` is a live connection; `handler` is a function that does not unwind.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_poll(
    c: *mut RocebusOrdersConnection,
    handler: RocebusFrameHandler,
    clientd: *mut c_void,
    fragment_limit: usize,
) -> c_int {
    guard(|| {
        let handler =
            handler.ok_or(Fail::fixed(RocebusStatus::NullArgument, c"handler is NULL"))?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let n = with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            c.get()?
                .subscription()
                .poll(
                    |f| {
                        let frame = RocebusFrame {
                            stream_id: f.stream_id,
                            msg_type: f.msg_type,
                            seq: f.seq,
                            payload: f.payload.as_ptr(),
                            len: f.payload.len(),
                        };
                        // SAFETY: `frame` and its payload are valid for
                        // this call (the header says only until the
                        // handler returns); the handler does not unwind
                        // (the caller's promise).
                        unsafe { handler(clientd, &frame) }
                    },
                    fragment_limit.min(c_int::MAX as usize),
                )
                .map_err(|e| match e {
                    OrdersError::PeerLost(l) => lost_fail(l),
                    e => orders_fail(e),
                })
        })?;
        Ok(n as c_int)
    })
}

/// Counters of a connection (`rocebus_orders_connection_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RocebusOrdersStats {
    /// Frames sent.
    pub frames_sent: u64,
    /// Payload bytes sent.
    pub bytes_sent: u64,
    /// Flushes.
    pub flushes: u64,
    /// Claims and offers refused for lack of credit.
    pub back_pressured: u64,
    /// Frames received.
    pub frames_received: u64,
    /// Payload bytes received.
    pub bytes_received: u64,
}

/// Copies the connection's counters into `*out`.
///
/// # Safety
/// `c` is a live connection; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_orders_connection_stats(
    c: *mut RocebusOrdersConnection,
    out: *mut RocebusOrdersStats,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let s = with_handle(unsafe { c.as_ref() }, c"connection is NULL", |c| {
            Ok(c.get()?.stats())
        })?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = s.into() };
        Ok(0)
    })
}

impl From<rocebus::orders::ConnStats> for RocebusOrdersStats {
    fn from(s: rocebus::orders::ConnStats) -> Self {
        RocebusOrdersStats {
            frames_sent: s.frames_sent,
            bytes_sent: s.bytes_sent,
            flushes: s.flushes,
            back_pressured: s.back_pressured,
            frames_received: s.frames_received,
            bytes_received: s.bytes_received,
        }
    }
}
