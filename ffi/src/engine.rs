//! The order gateway's engine session ([`rocebus_engine::client::EngineSession`]) for C:
//! log on to the gateway, then `new_order`, `cancel`, `replace`, `mass_cancel`, `flush`,
//! and `poll` handing each response (ack, fill, reject, cancel, ...) to a C callback, as
//! `sample-engine` does from Rust. The session keeps the engine's book (order states,
//! positions) as the Rust one does; the C side reads it with
//! `rocebus_engine_session_order` and `rocebus_engine_session_position`.
//!
//! The configuration is `sample-engine`'s `[gateway]` table (address, engine id and token,
//! account, `[gateway.orders]`, timeouts) and its `[rdma]` table, so an engine's whole
//! configuration file will do.

use crate::error::{guard, out_arg, str_arg, Fail, RocebusStatus};
use crate::handle::{self, c_handle, with_handle, Handle};
use crate::orders::{offer_fail, orders_fail, RocebusOrdersStats};
use rocebus::orders::OrdersError;
use rocebus_engine::client::{ClientError, EngineSession, OrderState, SessionError};
use rocebus_engine::config::GatewayConfig;
use rocebus_engine::proto::{msg_type, RejectReason, Response, Side, Symbol};
use std::ffi::{c_char, c_int, c_void};

/// An engine's configuration for the gateway (`rocebus_engine_config_from_toml`).
#[derive(Debug)]
pub struct RocebusEngineConfig(GatewayConfig);

/// A logged-on session with the order gateway. Used by one thread at a time.
#[derive(Debug)]
pub struct RocebusEngineSession(Handle<Session>);

c_handle!(RocebusEngineSession => Session);

/// The session and what it keeps from its configuration.
#[derive(Debug)]
pub(crate) struct Session {
    session: EngineSession,
    account: u32,
}

/// Reads an engine's configuration as a Rust engine does ([`GatewayConfig::from_toml_str`]).
fn parse(text: &str) -> Result<GatewayConfig, Fail> {
    GatewayConfig::from_toml_str(text)
        .map_err(|e| Fail::owned(RocebusStatus::Config, e.to_string()))
}

fn engine_config(text: &str, out: *mut *mut RocebusEngineConfig) -> Result<c_int, Fail> {
    out_arg(out, c"out is NULL")?;
    let cfg = parse(text)?;
    // SAFETY: checked not NULL; the caller promises it is writable.
    unsafe { *out = Box::into_raw(Box::new(RocebusEngineConfig(cfg))) };
    Ok(0)
}

/// Makes an engine configuration from TOML text: an engine's configuration file
/// (`configs/demo/sample-engine.toml`), of which the `[gateway]` table (`addr`,
/// `engine_id`, `engine_token`, `account`, `connect_timeout_ms`, `gateway_timeout_ms`,
/// `[gateway.orders]`) and the `[rdma]` table are read and the other tables ignored; or
/// the `[gateway]` keys at the top level. Unknown keys in `[gateway]` are
/// `ROCEBUS_STATUS_CONFIG`. On success `*out` is a new configuration to free with
/// `rocebus_engine_config_free`.
///
/// # Safety
/// `toml` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_config_from_toml(
    toml: *const c_char,
    out: *mut *mut RocebusEngineConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let text = unsafe { str_arg(toml, "toml") }?;
        engine_config(text, out)
    })
}

/// As `rocebus_engine_config_from_toml`, reading the file at `path`.
///
/// # Safety
/// `path` is a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_config_from_file(
    path: *const c_char,
    out: *mut *mut RocebusEngineConfig,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let path = unsafe { str_arg(path, "path") }?;
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::owned(RocebusStatus::Config, format!("reading {path}: {e}")))?;
        engine_config(&text, out)
    })
}

/// Frees an engine configuration (NULL is ignored).
///
/// # Safety
/// `cfg` is NULL or a configuration not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_config_free(cfg: *mut RocebusEngineConfig) {
    guard(|| {
        if !cfg.is_null() {
            // SAFETY: made by Box::into_raw above, not freed yet (the caller's promise).
            drop(unsafe { Box::from_raw(cfg) });
        }
        Ok(0)
    });
}

#[cold]
fn session_fail(e: SessionError) -> Fail {
    let code = match &e {
        SessionError::Connect { source, .. } => orders_fail_code(source),
        SessionError::Send(_) | SessionError::Lost(_) => RocebusStatus::PeerLost,
        SessionError::BadAnswer(_) => RocebusStatus::Corrupt,
        SessionError::BadToken => RocebusStatus::Config,
        SessionError::Refused { .. } => RocebusStatus::Refused,
        SessionError::Timeout(_) => RocebusStatus::Timeout,
        _ => RocebusStatus::Refused,
    };
    // The source chain: "connect to the gateway at ...: <why>".
    let mut msg = e.to_string();
    let mut src = std::error::Error::source(&e);
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    Fail::owned(code, msg)
}

fn orders_fail_code(e: &OrdersError) -> RocebusStatus {
    match e {
        OrdersError::PeerLost(_) => RocebusStatus::PeerLost,
        OrdersError::Config(_) => RocebusStatus::Config,
        OrdersError::Verbs(_) => RocebusStatus::Io,
        OrdersError::Corrupt(_) => RocebusStatus::Corrupt,
        _ => RocebusStatus::Refused,
    }
}

/// Connects to the gateway at the configuration's `addr` and logs on as `engine_id` with
/// `engine_token`; order ids start at `first_order_id` (they must stay unique across the
/// engine's restarts); the book has room for `expected_orders` before it grows (0: 65536).
/// Blocks: the gateway may still be starting, so a failed attempt is retried for up to
/// `connect_timeout_ms` (a refused logon, but for `AlreadyConnected`, is not retried). The
/// gateway is declared dead after `gateway_timeout_ms` of silence. On success `*out` is the
/// session, to free with `rocebus_engine_session_free`.
///
/// # Safety
/// `cfg` is a live configuration; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_connect(
    cfg: *const RocebusEngineConfig,
    first_order_id: u64,
    expected_orders: usize,
    out: *mut *mut RocebusEngineSession,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: NULL or a live configuration (the caller's promise).
        let cfg = &unsafe { cfg.as_ref() }
            .ok_or(Fail::fixed(RocebusStatus::NullArgument, c"cfg is NULL"))?
            .0;
        let expected = if expected_orders == 0 {
            1 << 16
        } else {
            expected_orders
        };
        // The configuration's `[rdma]` huge page policy and a memlock check of the orders
        // path's rings, before its memory is registered (as a Rust engine's start does).
        cfg.prepare_process(0).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(s) = std::error::Error::source(&e) {
                msg = format!("{msg}: {s}");
            }
            Fail::owned(RocebusStatus::Config, msg)
        })?;
        let session = EngineSession::connect_configured(cfg, first_order_id, expected)
            .map_err(session_fail)?;
        let s = Session {
            session,
            account: cfg.account,
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = Box::into_raw(Box::new(RocebusEngineSession(Handle::new(s)))) };
        Ok(0)
    })
}

/// Disconnects (the gateway cancels the engine's open orders) and frees the session. NULL
/// is ignored. Returns `ROCEBUS_STATUS_BUSY` (and frees nothing) from inside this
/// session's poll handler.
///
/// # Safety
/// `s` is NULL or a session not freed yet.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_free(s: *mut RocebusEngineSession) -> c_int {
    // SAFETY: the caller's promise.
    guard(|| unsafe { handle::free(s) }.map(|()| 0))
}

/// An order's side.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusSide {
    /// Buy.
    Buy = 1,
    /// Sell.
    Sell = 2,
}

/// A symbol argument: 1 to 8 printable ASCII characters (no allocation).
fn symbol_arg(p: *const c_char) -> Result<Symbol, Fail> {
    const BAD: Fail = Fail::fixed(
        RocebusStatus::InvalidArgument,
        c"symbol: 1 to 8 printable ASCII characters",
    );
    if p.is_null() {
        return Err(Fail::fixed(RocebusStatus::NullArgument, c"symbol is NULL"));
    }
    // SAFETY: not NULL; the public functions' callers promise a NUL-terminated string.
    let s = unsafe { std::ffi::CStr::from_ptr(p) };
    Symbol::from_bytes(s.to_bytes()).ok_or(BAD)
}

fn side_arg(side: c_int) -> Result<Side, Fail> {
    match side {
        1 => Ok(Side::Buy),
        2 => Ok(Side::Sell),
        _ => Err(Fail::fixed(
            RocebusStatus::InvalidArgument,
            c"side: ROCEBUS_SIDE_BUY or ROCEBUS_SIDE_SELL",
        )),
    }
}

/// Queues a new day limit order of `qty` `symbol` at `price` (4 implied decimals: 1890000
/// is 189.00) for `account` (0: the configuration's `account`); `*id` is its order id. It
/// goes out with the next `rocebus_engine_session_flush`. `ROCEBUS_STATUS_BACK_PRESSURED`:
/// the gateway's ring is full, nothing was sent nor tracked; poll and try again. Does not
/// allocate (unless the book outgrows `expected_orders`).
///
/// # Safety
/// `s` is a live session; `symbol` a NUL-terminated string; `id` writable or NULL.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_new_order(
    s: *mut RocebusEngineSession,
    account: u32,
    symbol: *const c_char,
    side: c_int,
    qty: u32,
    price: i64,
    id: *mut u64,
) -> c_int {
    guard(|| {
        let (symbol, side) = (symbol_arg(symbol)?, side_arg(side)?);
        // SAFETY: the caller's promise: NULL or a live handle.
        let new = with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            let account = if account == 0 { s.account } else { account };
            s.session
                .new_order(account, symbol, side, qty, price)
                .map_err(offer_fail)
        })?;
        if !id.is_null() {
            // SAFETY: not NULL; the caller promises it is writable.
            unsafe { *id = new };
        }
        Ok(0)
    })
}

/// Queues a cancel of order `id` (the answer is a `CANCELED` response, or a `REJECT` whose
/// `request` is `'C'` when it came too late).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_cancel(
    s: *mut RocebusEngineSession,
    id: u64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            s.session.cancel(id).map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// Queues a replace of order `id`: new total `qty` and `price` (a `REPLACED` response, or
/// a `REJECT` whose `request` is `'R'`).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_replace(
    s: *mut RocebusEngineSession,
    id: u64,
    qty: u32,
    price: i64,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            s.session.replace(id, qty, price).map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// Queues a mass cancel of the engine's open orders in `account` (0: every account it is
/// granted) and `symbol` (NULL: every symbol).
///
/// # Safety
/// `s` is a live session; `symbol` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_mass_cancel(
    s: *mut RocebusEngineSession,
    account: u32,
    symbol: *const c_char,
) -> c_int {
    guard(|| {
        let symbol = if symbol.is_null() {
            Symbol([b' '; 8])
        } else {
            symbol_arg(symbol)?
        };
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            s.session.mass_cancel(account, symbol).map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// Sends everything queued (and a heartbeat when one is due). `ROCEBUS_STATUS_PEER_LOST`
/// once the gateway is gone (or was declared dead for its silence). Does not allocate.
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_flush(s: *mut RocebusEngineSession) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise: NULL or a live handle.
        with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            s.session.flush().map_err(offer_fail)
        })?;
        Ok(0)
    })
}

/// What a response is (`rocebus_engine_response_t.kind`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusResponseKind {
    /// The frame was not a response (`error` is `DECODE`); nothing else is set.
    Invalid = 0,
    /// The venue acknowledged the order: `order_id`.
    Ack = 1,
    /// A request was refused: `reason` (a reject reason code), `request` (`'N'` new order,
    /// `'C'` cancel, `'R'` replace, `'M'` mass cancel). Only a rejected new order is final.
    Reject = 2,
    /// The order is completely filled: `qty` (this execution), `price`, `cum_qty`.
    Fill = 3,
    /// A partial fill: `qty`, `price`, `cum_qty`, `leaves_qty`.
    PartialFill = 4,
    /// The order is canceled: `qty` (what was still open).
    Canceled = 5,
    /// The order was replaced: `qty` (new total), `price`, `leaves_qty`.
    Replaced = 6,
    /// Informational status of a re-sent request: `state` (0 unknown, 1 pending new, 2
    /// open, 3 filled, 4 canceled, 5 rejected), `qty`, `cum_qty`, `price`, `reason`,
    /// `request`.
    Status = 7,
    /// Informational: the venue did something after the fact (`state` is the notice
    /// kind: 1 late fill, 2 overfill, 3 trade cancel, 4 trade correct), `exec_qty_delta`,
    /// `price`, `cum_qty`, `leaves_qty`.
    Notice = 8,
}

/// Why a response did not apply to the engine's book (`rocebus_engine_response_t.error`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusResponseError {
    /// It applied.
    None = 0,
    /// The frame is not a response (counted by the caller, say).
    Decode = 1,
    /// For an order this session never sent.
    UnknownOrder = 2,
    /// For an order already final (a duplicate answer).
    AlreadyFinal = 3,
    /// Numbered at or below the last applied (a replay overlap); ignored.
    Duplicate = 4,
}

/// One response from the gateway, as a poll handler sees it. The fields that do not apply
/// to its `kind` are 0.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusEngineResponse {
    /// What it is.
    pub kind: RocebusResponseKind,
    /// Whether it applied to the book.
    pub error: RocebusResponseError,
    /// The gateway's response number (0: unnumbered).
    pub seq: u32,
    /// The engine's order id it is about.
    pub cl_ord_id: u64,
    /// `ACK`: the gateway's order id.
    pub order_id: u64,
    /// Quantity: this execution (fills), what was open (canceled), the new total
    /// (replaced, status).
    pub qty: u32,
    /// Executed so far.
    pub cum_qty: u32,
    /// Still open.
    pub leaves_qty: u32,
    /// `REJECT`, `STATUS`: the reject reason code.
    pub reason: u16,
    /// `REJECT`, `STATUS`: the request's message type (`'N'`, `'C'`, `'R'`, `'M'`).
    pub request: u8,
    /// `STATUS`: the order state; `NOTICE`: the notice kind.
    pub state: u8,
    /// Price (4 implied decimals): of this execution (fills, notices), the new one
    /// (replaced), the current one (status).
    pub price: i64,
    /// `NOTICE`: change of the executed quantity (negative for a trade cancel).
    pub exec_qty_delta: i64,
}

impl RocebusEngineResponse {
    const EMPTY: RocebusEngineResponse = RocebusEngineResponse {
        kind: RocebusResponseKind::Invalid,
        error: RocebusResponseError::None,
        seq: 0,
        cl_ord_id: 0,
        order_id: 0,
        qty: 0,
        cum_qty: 0,
        leaves_qty: 0,
        reason: 0,
        request: 0,
        state: 0,
        price: 0,
        exec_qty_delta: 0,
    };

    fn of(r: &Response) -> RocebusEngineResponse {
        use RocebusResponseKind as K;
        let mut o = RocebusEngineResponse {
            seq: r.seq(),
            cl_ord_id: r.cl_ord_id(),
            ..Self::EMPTY
        };
        match r {
            Response::Ack(a) => (o.kind, o.order_id) = (K::Ack, a.order_id.get()),
            Response::Reject(j) => {
                (o.kind, o.reason, o.request) = (K::Reject, j.reason.get(), j.request)
            }
            Response::Fill(f) => {
                o.kind = if f.header.msg_type == msg_type::FILL {
                    K::Fill
                } else {
                    K::PartialFill
                };
                (o.qty, o.leaves_qty, o.cum_qty, o.price) = (
                    f.last_qty.get(),
                    f.leaves_qty.get(),
                    f.cum_qty.get(),
                    f.last_px.get(),
                );
            }
            Response::Canceled(c) => (o.kind, o.qty) = (K::Canceled, c.canceled_qty.get()),
            Response::Replaced(p) => {
                (o.kind, o.qty, o.leaves_qty, o.price) =
                    (K::Replaced, p.qty.get(), p.leaves_qty.get(), p.price.get())
            }
            Response::Status(st) => {
                o.kind = K::Status;
                (o.qty, o.cum_qty, o.price, o.state, o.request, o.reason) = (
                    st.qty.get(),
                    st.cum_qty.get(),
                    st.price.get(),
                    st.state,
                    st.request,
                    st.reason.get(),
                );
            }
            Response::Notice(n) => {
                o.kind = K::Notice;
                (o.exec_qty_delta, o.price, o.cum_qty, o.leaves_qty, o.state) = (
                    n.exec_qty_delta.get(),
                    n.last_px.get(),
                    n.cum_qty.get(),
                    n.leaves_qty.get(),
                    n.kind,
                );
            }
        }
        o
    }

    fn of_error(e: ClientError) -> RocebusEngineResponse {
        use RocebusResponseError as E;
        let mut o = Self::EMPTY;
        match e {
            ClientError::UnknownOrder(id) => (o.error, o.cl_ord_id) = (E::UnknownOrder, id),
            ClientError::AlreadyFinal(id) => (o.error, o.cl_ord_id) = (E::AlreadyFinal, id),
            ClientError::Duplicate(seq) => (o.error, o.seq) = (E::Duplicate, seq),
            _ => o.error = E::Decode,
        }
        o
    }
}

/// A session's poll handler: called once per response, in order. `response` is valid
/// ONLY until the handler returns (copy what you keep). The handler must not call
/// functions on the same session (`ROCEBUS_STATUS_BUSY`: send after the poll returns);
/// other handles are fine. It must not unwind (no C++ exception may leave it).
pub type RocebusEngineResponseHandler =
    Option<unsafe extern "C" fn(clientd: *mut c_void, response: *const RocebusEngineResponse)>;

/// Applies up to `fragment_limit` responses to the engine's book, handing each (or why it
/// did not apply) to `handler` with `clientd`; returns how many frames were read. When
/// nothing arrived it also sends what is queued, and every few polls it sends a heartbeat
/// when due and judges the gateway's silence. Never blocks; does not allocate.
/// `ROCEBUS_STATUS_PEER_LOST` once the gateway is gone.
///
/// # Safety
/// `s` is a live session; `handler` is a function that does not unwind.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_poll(
    s: *mut RocebusEngineSession,
    handler: RocebusEngineResponseHandler,
    clientd: *mut c_void,
    fragment_limit: usize,
) -> c_int {
    guard(|| {
        let handler =
            handler.ok_or(Fail::fixed(RocebusStatus::NullArgument, c"handler is NULL"))?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let n = with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            s.session
                .poll(
                    |r| {
                        let resp = match r {
                            Ok(r) => RocebusEngineResponse::of(&r),
                            Err(e) => RocebusEngineResponse::of_error(e),
                        };
                        // SAFETY: `resp` lives for this call (the header says the pointer is
                        // valid only until the handler returns); the handler does not
                        // unwind (the caller's promise).
                        unsafe { handler(clientd, &resp) }
                    },
                    fragment_limit.min(c_int::MAX as usize),
                )
                .map_err(orders_fail)
        })?;
        Ok(n as c_int)
    })
}

/// Where an order stands, as the engine's book has it (`rocebus_engine_order_t.state`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusOrderState {
    /// Sent, no answer yet.
    PendingNew = 1,
    /// Acknowledged, nothing executed.
    New = 2,
    /// Partially executed.
    PartiallyFilled = 3,
    /// Completely executed (final).
    Filled = 4,
    /// Canceled (final).
    Canceled = 5,
    /// Rejected (final; `reject_reason` says why).
    Rejected = 6,
}

/// One order of the engine's book (`rocebus_engine_session_order`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RocebusEngineOrder {
    /// Where it stands.
    pub state: RocebusOrderState,
    /// `REJECTED`: the reject reason code.
    pub reject_reason: u16,
    /// Its side.
    pub side: RocebusSide,
    /// Its total quantity (after replaces).
    pub qty: u32,
    /// Executed so far.
    pub cum_qty: u32,
    /// Its limit price (after replaces).
    pub price: i64,
    /// Its symbol, NUL-terminated (space padding removed).
    pub symbol: [c_char; 9],
}

/// Copies order `id` of the engine's book into `*out`: returns 1, or 0 when the session
/// never sent it.
///
/// # Safety
/// `s` is a live session; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_order(
    s: *mut RocebusEngineSession,
    id: u64,
    out: *mut RocebusEngineOrder,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let o = with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            Ok(s.session.client().order(id).copied())
        })?;
        let Some(o) = o else { return Ok(0) };
        let (state, reject_reason) = match o.state {
            OrderState::PendingNew => (RocebusOrderState::PendingNew, 0),
            OrderState::New => (RocebusOrderState::New, 0),
            OrderState::PartiallyFilled => (RocebusOrderState::PartiallyFilled, 0),
            OrderState::Filled => (RocebusOrderState::Filled, 0),
            OrderState::Canceled => (RocebusOrderState::Canceled, 0),
            OrderState::Rejected(r) => (RocebusOrderState::Rejected, reject_code(r)),
        };
        let mut symbol = [0 as c_char; 9];
        let name = o.symbol.as_bytes();
        let name = &name[..name.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1)];
        for (d, &b) in symbol.iter_mut().zip(name) {
            *d = b as c_char;
        }
        let order = RocebusEngineOrder {
            state,
            reject_reason,
            side: match o.side {
                Side::Buy => RocebusSide::Buy,
                Side::Sell => RocebusSide::Sell,
            },
            qty: o.qty,
            cum_qty: o.cum_qty,
            price: o.price,
            symbol,
        };
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = order };
        Ok(1)
    })
}

fn reject_code(r: RejectReason) -> u16 {
    r as u16
}

/// The engine's net position in `symbol` from the fills received (bought minus sold)
/// into `*out`.
///
/// # Safety
/// `s` is a live session; `symbol` a NUL-terminated string; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_position(
    s: *mut RocebusEngineSession,
    symbol: *const c_char,
    out: *mut i64,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        let symbol = symbol_arg(symbol)?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let p = with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            Ok(s.session.client().position(symbol))
        })?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = p };
        Ok(0)
    })
}

/// A session's counters (`rocebus_engine_session_stats`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct RocebusEngineStats {
    /// The orders connection's counters (frames, bytes, flushes, back-pressure).
    pub connection: RocebusOrdersStats,
    /// The last response number applied.
    pub last_response_seq: u32,
    /// 1 once the responses missed before this logon were all applied.
    pub caught_up: u32,
    /// The id the next new order gets.
    pub next_order_id: u64,
    /// Frames received on another stream than the orders stream (dropped).
    pub stray_frames: u64,
    /// The heartbeat interval the gateway announced, ms (0: none).
    pub heartbeat_interval_ms: u64,
}

/// Copies the session's counters into `*out`.
///
/// # Safety
/// `s` is a live session; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn rocebus_engine_session_stats(
    s: *mut RocebusEngineSession,
    out: *mut RocebusEngineStats,
) -> c_int {
    guard(|| {
        out_arg(out, c"out is NULL")?;
        // SAFETY: the caller's promise: NULL or a live handle.
        let st = with_handle(unsafe { s.as_ref() }, c"session is NULL", |s| {
            let s = &s.session;
            Ok(RocebusEngineStats {
                connection: s.connection().stats().into(),
                last_response_seq: s.client().last_response_seq(),
                caught_up: s.caught_up() as u32,
                next_order_id: s.client().next_order_id(),
                stray_frames: s.stray_frames(),
                heartbeat_interval_ms: s.heartbeat_interval().as_millis() as u64,
            })
        })?;
        // SAFETY: checked not NULL; the caller promises it is writable.
        unsafe { *out = st };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = include_str!("../../configs/demo/sample-engine.toml");

    #[test]
    fn an_engines_config_file_is_read_for_its_gateway_and_rdma_tables() {
        let cfg = parse(SAMPLE).unwrap();
        assert_eq!(cfg.addr, "198.18.0.1:7470".parse().unwrap());
        assert_eq!((cfg.engine_id, cfg.account), (1, 1));
        assert_eq!(cfg.connect_timeout_ms, 30000);
        assert_eq!(cfg.gateway_timeout_ms, 3000);
        assert!(cfg.orders.token.starts_with("9d41c0e7"));
        // [rdma] traffic_class = 106 reaches the RC options.
        assert_eq!(cfg.orders.rc.class().traffic_class, 106);
        let other = parse(&SAMPLE.replace("traffic_class = 106", "traffic_class = 42")).unwrap();
        assert_eq!(other.orders.rc.class().traffic_class, 42);
        let top =
            "addr = \"10.0.0.1:1\"\nengine_id = 2\nengine_token = \"t\"\n[orders]\ntoken = \"x\"";
        assert_eq!(parse(top).unwrap().engine_id, 2);
    }

    #[test]
    fn bad_engine_configs_are_config_errors_with_the_key() {
        for (text, key) in [
            (
                SAMPLE.replace("engine_id = 1 ", "engine_idd = 1 "),
                "engine_idd",
            ),
            (
                SAMPLE.replace("engine_token = \"3a7f", "engine_token = \"\" #"),
                "engine_token",
            ),
            (
                SAMPLE.replace("addr = \"198.18.0.1:7470\"", "addr = \"nowhere\""),
                "addr",
            ),
            (
                SAMPLE.replace("traffic_class = 106", "traffic_class = 1000"),
                "rdma",
            ),
        ] {
            let e = parse(&text).unwrap_err();
            assert_eq!(e.code, RocebusStatus::Config, "{key}");
            assert!(format!("{e:?}").contains(key), "{key}: {e:?}");
        }
    }

    #[test]
    fn responses_become_c_structs() {
        let fill = Response::decode(Response::fill(7, 30, 1_890_000, 30, 70).as_bytes())
            .unwrap()
            .0;
        let c = RocebusEngineResponse::of(&fill);
        assert_eq!(c.kind, RocebusResponseKind::PartialFill);
        assert_eq!(
            (c.cl_ord_id, c.qty, c.leaves_qty, c.cum_qty, c.price),
            (7, 30, 70, 30, 1_890_000)
        );
        let e = RocebusEngineResponse::of_error(ClientError::AlreadyFinal(9));
        assert_eq!(
            (e.error, e.cl_ord_id),
            (RocebusResponseError::AlreadyFinal, 9)
        );
        assert_eq!(
            symbol_arg(c"TOOLONGSYM".as_ptr()).unwrap_err().code,
            RocebusStatus::InvalidArgument
        );
        assert!(symbol_arg(c"AAPL".as_ptr()).is_ok());
        assert_eq!(
            side_arg(3).unwrap_err().code,
            RocebusStatus::InvalidArgument
        );
    }
}
