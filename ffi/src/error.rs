//! Status codes, the thread-local last-error message, and [`guard`], the
//! wrapper of every entry point: it turns a Rust panic into
//! [`RocebusStatus::Panic`] so that no unwind ever crosses into C.
//!
//! Nothing here allocates on the hot path: the errors a hot call can
//! return (back-pressure, a lost peer, a claim left open) carry `'static`
//! messages; only cold failures (configuration, set-up, a panic) format one.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// What a call returns: 0 (`ROCEBUS_STATUS_OK`) or more on success (a
/// count, where the function says so), one of these negative codes on
/// failure, with a message in `rocebus_last_error()`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RocebusStatus {
    /// Success.
    Ok = 0,
    /// A pointer argument that must not be NULL was NULL.
    NullArgument = -1,
    /// An argument is invalid (not UTF-8, not an address, a bad stream name).
    InvalidArgument = -2,
    /// The configuration is invalid (TOML syntax, an unknown key, a value
    /// out of range); the message says which.
    Config = -3,
    /// The operating system or the RDMA device failed (a file, a mapping,
    /// a verbs call); the message says what.
    Io = -4,
    /// Try again later: the peer (orders) or the slowest subscriber (ipc)
    /// has not consumed enough. Nothing was sent, nothing was dropped.
    BackPressured = -5,
    /// The payload is larger than the stream's or connection's maximum.
    TooLarge = -6,
    /// The message type is reserved for rocebus (0xFF00 to 0xFFFF).
    ReservedType = -7,
    /// The connection is lost (the peer disconnected, a work request
    /// failed, or it was closed after a protocol violation). Free it.
    PeerLost = -8,
    /// A claim is open on this handle: commit or abort it first.
    ClaimOpen = -9,
    /// Commit or abort without an open claim.
    NoClaim = -10,
    /// Called on a handle from inside that handle's own callback (a
    /// re-entrant call); nothing was done.
    Busy = -11,
    /// A panic happened during an earlier call on this handle, which may
    /// have left it half updated: only `*_free` is accepted.
    Poisoned = -12,
    /// Nothing happened within the time given.
    Timeout = -13,
    /// Connection set-up was refused or failed (handshake, token, ring size).
    Refused = -14,
    /// A bug in rocebus: a Rust panic was caught at the boundary. The
    /// message has the panic's text.
    Panic = -15,
    /// The peer broke the protocol (garbage in our ring); the connection
    /// is closed.
    Corrupt = -16,
}

/// A failure on its way to C: its code and message.
#[derive(Debug)]
pub(crate) struct Fail {
    pub(crate) code: RocebusStatus,
    msg: Msg,
}

#[derive(Debug)]
enum Msg {
    Static(&'static CStr),
    Owned(String),
}

impl Fail {
    /// A failure with a fixed message (no allocation: hot paths use this).
    pub(crate) const fn fixed(code: RocebusStatus, msg: &'static CStr) -> Fail {
        Fail {
            code,
            msg: Msg::Static(msg),
        }
    }

    /// A failure with a formatted message (cold paths only: it allocates).
    #[cold]
    pub(crate) fn owned(code: RocebusStatus, msg: impl std::fmt::Display) -> Fail {
        Fail {
            code,
            msg: Msg::Owned(msg.to_string()),
        }
    }
}

/// The last failure's message on this thread.
enum Last {
    Static(&'static CStr),
    Owned(CString),
}

thread_local! {
    // A const initializer: no allocation and no destructor registration on
    // first use, so setting a fixed message never allocates.
    static LAST: RefCell<Last> = const { RefCell::new(Last::Static(c"")) };
}

fn set_last(msg: Msg) {
    let last = match msg {
        Msg::Static(s) => Last::Static(s),
        Msg::Owned(s) => {
            // A NUL inside the text would end the C string early.
            let s = s.replace('\0', "\\0");
            Last::Owned(CString::new(s).unwrap_or_default())
        }
    };
    // try_with: during thread teardown the slot may be gone; the code
    // still tells the caller what happened.
    let _ = LAST.try_with(|l| {
        if let Ok(mut l) = l.try_borrow_mut() {
            *l = last;
        }
    });
}

/// Runs an entry point's body: its `Ok` value is returned as is, an `Err`
/// becomes its (negative) code with the message stored for
/// [`rocebus_last_error`], and a panic becomes [`RocebusStatus::Panic`]
/// with the panic's text. Every `extern "C"` function of this crate is one
/// call to this (`tests/boundary.rs` checks the source).
#[inline(always)]
pub(crate) fn guard(body: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    // AssertUnwindSafe: a panic inside a handle's call poisons that handle
    // (`handle.rs`), so no half-updated state is used after it.
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(n)) => n,
        Ok(Err(f)) => fail(f),
        Err(payload) => panicked(payload),
    }
}

#[cold]
#[inline(never)]
fn fail(f: Fail) -> c_int {
    let code = f.code as c_int;
    set_last(f.msg);
    code
}

#[cold]
#[inline(never)]
fn panicked(payload: Box<dyn std::any::Any + Send>) -> c_int {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    // Dropping the payload runs foreign code of a sort (its Drop); guard it too.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(payload)));
    set_last(Msg::Owned(format!(
        "panic inside rocebus (a bug; please report it): {text}"
    )));
    RocebusStatus::Panic as c_int
}

/// The message of the last failed call on this thread (an empty string if
/// none failed yet). Never NULL. The pointer stays valid until the next
/// rocebus call on this thread that fails; copy the text to keep it.
#[no_mangle]
pub extern "C" fn rocebus_last_error() -> *const c_char {
    static EMPTY: &CStr = c"";
    let mut out = EMPTY.as_ptr();
    guard(|| {
        out = LAST
            .try_with(|l| match &*l.borrow() {
                Last::Static(s) => s.as_ptr(),
                // The CString's heap buffer does not move while it stays
                // in the slot, i.e. until the next failure replaces it.
                Last::Owned(s) => s.as_ptr(),
            })
            .unwrap_or(EMPTY.as_ptr());
        Ok(0)
    });
    out
}

/// The name of a status code (`"ROCEBUS_STATUS_BACK_PRESSURED"`), or
/// `"unknown"`. Never NULL; the string is static.
#[no_mangle]
pub extern "C" fn rocebus_status_name(code: c_int) -> *const c_char {
    let mut out = c"unknown".as_ptr();
    guard(|| {
        use RocebusStatus as S;
        let all = [
            (S::Ok, c"ROCEBUS_STATUS_OK"),
            (S::NullArgument, c"ROCEBUS_STATUS_NULL_ARGUMENT"),
            (S::InvalidArgument, c"ROCEBUS_STATUS_INVALID_ARGUMENT"),
            (S::Config, c"ROCEBUS_STATUS_CONFIG"),
            (S::Io, c"ROCEBUS_STATUS_IO"),
            (S::BackPressured, c"ROCEBUS_STATUS_BACK_PRESSURED"),
            (S::TooLarge, c"ROCEBUS_STATUS_TOO_LARGE"),
            (S::ReservedType, c"ROCEBUS_STATUS_RESERVED_TYPE"),
            (S::PeerLost, c"ROCEBUS_STATUS_PEER_LOST"),
            (S::ClaimOpen, c"ROCEBUS_STATUS_CLAIM_OPEN"),
            (S::NoClaim, c"ROCEBUS_STATUS_NO_CLAIM"),
            (S::Busy, c"ROCEBUS_STATUS_BUSY"),
            (S::Poisoned, c"ROCEBUS_STATUS_POISONED"),
            (S::Timeout, c"ROCEBUS_STATUS_TIMEOUT"),
            (S::Refused, c"ROCEBUS_STATUS_REFUSED"),
            (S::Panic, c"ROCEBUS_STATUS_PANIC"),
            (S::Corrupt, c"ROCEBUS_STATUS_CORRUPT"),
        ];
        if let Some((_, name)) = all.iter().find(|(s, _)| *s as c_int == code) {
            out = name.as_ptr();
        }
        Ok(0)
    });
    out
}

/// Reads a C string argument as UTF-8 (cold paths: names, addresses, TOML).
///
/// # Safety
/// `p` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(Fail::owned(
            RocebusStatus::NullArgument,
            format!("{what} is NULL"),
        ));
    }
    // SAFETY: not NULL, and the caller promises a NUL-terminated string
    // that outlives the call.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| {
        Fail::owned(
            RocebusStatus::InvalidArgument,
            format!("{what} is not UTF-8"),
        )
    })
}

/// Checks an out-pointer argument.
pub(crate) fn out_arg<T>(p: *mut T, what: &'static CStr) -> Result<(), Fail> {
    if p.is_null() {
        Err(Fail::fixed(RocebusStatus::NullArgument, what))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last() -> String {
        // SAFETY: rocebus_last_error never returns NULL and the string is
        // read before any other call on this thread.
        unsafe { CStr::from_ptr(rocebus_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_an_error_code_with_its_text() {
        let code = guard(|| panic!("boom {}", 42));
        assert_eq!(code, RocebusStatus::Panic as c_int);
        assert!(last().contains("boom 42"), "{}", last());
        let code = guard(|| std::panic::panic_any(7u32));
        assert_eq!(code, RocebusStatus::Panic as c_int);
        assert!(last().contains("no message"), "{}", last());
    }

    #[test]
    fn errors_set_the_message_and_successes_keep_it() {
        assert_eq!(
            guard(|| Err(Fail::fixed(RocebusStatus::BackPressured, c"full"))),
            RocebusStatus::BackPressured as c_int
        );
        assert_eq!(last(), "full");
        assert_eq!(guard(|| Ok(3)), 3);
        assert_eq!(last(), "full");
        assert_eq!(
            guard(|| Err(Fail::owned(RocebusStatus::Config, "bad\0key"))),
            RocebusStatus::Config as c_int
        );
        assert_eq!(last(), "bad\\0key");
    }

    #[test]
    fn every_status_has_its_header_name() {
        for code in -16..=0 {
            // SAFETY: static strings, never NULL.
            let name = unsafe { CStr::from_ptr(rocebus_status_name(code)) };
            assert!(
                name.to_str().unwrap().starts_with("ROCEBUS_STATUS_"),
                "{code}"
            );
        }
        // SAFETY: as above.
        let name = unsafe { CStr::from_ptr(rocebus_status_name(-17)) };
        assert_eq!(name.to_str().unwrap(), "unknown");
    }
}
