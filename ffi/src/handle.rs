//! [`Handle`]: what a C pointer to a rocebus object points at. It enforces
//! at run time what the borrow checker enforces for Rust callers:
//!
//! - one call at a time on a handle: a call made from inside the handle's
//!   own callback (say, polling a subscriber from its handler) would hold
//!   two `&mut` to one object; it is refused with `ROCEBUS_STATUS_BUSY`;
//! - after a panic inside a call the object may be half updated: the
//!   handle is poisoned and refuses every call but `*_free`.
//!
//! Handles are not `Sync`: C callers use each from one thread at a time
//! (the header says so), as Rust callers do with the `Send` objects inside.

use crate::error::{Fail, RocebusStatus};
use std::cell::{Cell, UnsafeCell};
use std::ffi::CStr;

const IDLE: u8 = 0;
const BUSY: u8 = 1;
const POISONED: u8 = 2;

/// A rocebus object behind a C pointer, with its call state.
#[derive(Debug)]
pub(crate) struct Handle<T> {
    state: Cell<u8>,
    inner: UnsafeCell<T>,
}

/// Sets the state back when a call ends: idle, or poisoned if it ends by a panic.
struct EndCall<'a>(&'a Cell<u8>);

impl Drop for EndCall<'_> {
    fn drop(&mut self) {
        self.0.set(if std::thread::panicking() {
            POISONED
        } else {
            IDLE
        });
    }
}

impl<T> Handle<T> {
    pub(crate) fn new(inner: T) -> Self {
        Handle {
            state: Cell::new(IDLE),
            inner: UnsafeCell::new(inner),
        }
    }

    /// Runs `f` on the object, refusing a re-entrant call and a poisoned
    /// handle.
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> Result<R, Fail>) -> Result<R, Fail> {
        match self.state.get() {
            IDLE => {}
            BUSY => return Err(BUSY_FAIL),
            _ => return Err(POISONED_FAIL),
        }
        self.state.set(BUSY);
        let _end = EndCall(&self.state);
        // SAFETY: the state was IDLE, so no call on this handle is running
        // on this thread (a running one leaves it BUSY until it returns),
        // and handles are used by one thread at a time (not Sync; a C
        // caller's rule, stated in the header): this is the only reference
        // to the object until `f` returns. Shared references to the
        // Handle itself (a re-entrant call's) only touch `state`, outside
        // the UnsafeCell.
        f(unsafe { &mut *self.inner.get() })
    }

    /// Whether a call on this handle is running (a `*_free` from inside a
    /// callback must not free it).
    pub(crate) fn busy(&self) -> bool {
        self.state.get() == BUSY
    }
}

const BUSY_FAIL: Fail = Fail::fixed(
    RocebusStatus::Busy,
    c"called from inside this handle's own callback: return from the callback first",
);
const POISONED_FAIL: Fail = Fail::fixed(
    RocebusStatus::Poisoned,
    c"a panic happened in an earlier call on this handle: free it",
);

/// A type C holds pointers to (`rocebus_*_t`): a [`Handle`] around its object.
pub(crate) trait CHandle {
    /// The rocebus object inside.
    type Inner;
    /// Its handle.
    fn handle(&self) -> &Handle<Self::Inner>;
}

/// Implements [`CHandle`] for `pub struct Name(Handle<Inner>)` types.
macro_rules! c_handle {
    ($($outer:ty => $inner:ty),* $(,)?) => {$(
        impl $crate::handle::CHandle for $outer {
            type Inner = $inner;
            #[inline(always)]
            fn handle(&self) -> &$crate::handle::Handle<$inner> {
                &self.0
            }
        }
    )*};
}
pub(crate) use c_handle;

/// Runs `f` on the object behind a C pointer, given as `p.as_ref()`
/// ([`Handle::with`]: a re-entrant call is refused, a poisoned handle
/// too); NULL is `ROCEBUS_STATUS_NULL_ARGUMENT` with the message `what`.
/// The caller's `unsafe { p.as_ref() }` is the one unsafe step (the C
/// caller's promise that `p` is NULL or live); `f` stays outside it.
#[inline(always)]
pub(crate) fn with_handle<H: CHandle, R>(
    h: Option<&H>,
    what: &'static CStr,
    f: impl FnOnce(&mut H::Inner) -> Result<R, Fail>,
) -> Result<R, Fail> {
    h.ok_or(Fail::fixed(RocebusStatus::NullArgument, what))?
        .handle()
        .with(f)
}

/// Frees a handle made by `Box::into_raw`; refuses (frees nothing) when a
/// call on it is running, i.e. from inside its own callback.
///
/// # Safety
/// `p` is NULL or a pointer `Box::into_raw` made for this crate's caller,
/// not freed yet.
pub(crate) unsafe fn free<H: CHandle>(p: *mut H) -> Result<(), Fail> {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: not NULL, live (the caller's promise).
    if unsafe { &*p }.handle().busy() {
        return Err(Fail::fixed(
            RocebusStatus::Busy,
            c"freeing a handle from inside its own callback: free it after the call returns",
        ));
    }
    // SAFETY: made by Box::into_raw, not freed yet, and no call on it runs.
    drop(unsafe { Box::from_raw(p) });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::guard;
    use std::ffi::c_int;

    #[test]
    fn a_re_entrant_call_is_refused() {
        let h = Handle::new(5u32);
        let inner = h.with(|v| {
            *v += 1;
            Ok(h.with(|_| Ok(())).map_err(|f| f.code))
        });
        assert_eq!(inner.unwrap(), Err(RocebusStatus::Busy));
        assert_eq!(
            h.with(|v| Ok(*v)).unwrap(),
            6,
            "usable again after the call"
        );
    }

    #[test]
    fn a_panic_inside_a_call_poisons_the_handle() {
        let h = Handle::new(0u32);
        let code = guard(|| {
            h.with(|_| -> Result<(), Fail> { panic!("inside") })?;
            Ok(0)
        });
        assert_eq!(code, RocebusStatus::Panic as c_int);
        assert_eq!(
            h.with(|_| Ok(())).map_err(|f| f.code),
            Err(RocebusStatus::Poisoned)
        );
    }
}
