//! The per-message calls of the C API do not allocate: offer, try_claim,
//! commit, abort and poll, and their everyday errors (back-pressure, a
//! claim left open, commit without a claim), whose messages are static.
//! Counted by a global allocator around a loop through the entry points,
//! on this thread only (the test harness's other threads do not count).

#![allow(unsafe_code)] // the test calls the C entry points and is an allocator

use rocebus_ffi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialized
// thread-local Cell, which neither allocates nor registers a destructor.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's promise, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's promise, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's promise, passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

unsafe extern "C" fn count(clientd: *mut c_void, _t: u16, payload: *const u8, len: usize) {
    // SAFETY: clientd is the u64 below; payload holds len bytes during the call.
    unsafe {
        *(clientd as *mut u64) += u64::from(*payload.add(len - 1));
    }
}

#[test]
fn the_per_message_calls_do_not_allocate() {
    let dir = tempfile::tempdir().unwrap();
    let toml = CString::new(format!(
        "dir = \"{}\"\nring_bytes = 65536\nmax_payload = 256",
        dir.path().join("s").display()
    ))
    .unwrap();
    let name = c"noalloc";
    let (mut cfg, mut p, mut s) = (null_mut(), null_mut(), null_mut());
    // SAFETY: all calls below get pointers the library made and that are
    // not freed yet, and buffers of the lengths given.
    unsafe {
        assert_eq!(rocebus_ipc_config_from_toml(toml.as_ptr(), &mut cfg), 0);
        assert_eq!(rocebus_ipc_publisher_new(cfg, name.as_ptr(), &mut p), 0);
        assert_eq!(rocebus_ipc_subscriber_new(cfg, name.as_ptr(), &mut s), 0);
        let mut seen = 0u64;
        let clientd = &mut seen as *mut u64 as *mut c_void;
        // Joining allocates (a copy buffer, the mapping): before counting.
        rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(count), clientd, 16);
        assert_eq!(rocebus_ipc_subscriber_is_connected(s), 1);
        let msg = [7u8; 64];
        let mut buf = null_mut();

        let before = allocs();
        let mut sent = 0u64;
        for i in 0..2000u32 {
            assert_eq!(
                rocebus_ipc_publisher_offer(p, 1, msg.as_ptr(), msg.len()),
                0
            );
            assert_eq!(rocebus_ipc_publisher_try_claim(p, 2, 32, &mut buf), 0);
            *buf.add(31) = 3;
            // The errors of a claim left open and of a second commit.
            assert_eq!(
                rocebus_ipc_publisher_offer(p, 1, msg.as_ptr(), 1),
                RocebusStatus::ClaimOpen as i32
            );
            assert_eq!(rocebus_ipc_publisher_commit(p), 0);
            assert_eq!(
                rocebus_ipc_publisher_commit(p),
                RocebusStatus::NoClaim as i32
            );
            if i % 3 == 0 {
                assert_eq!(rocebus_ipc_publisher_try_claim(p, 2, 32, &mut buf), 0);
                assert_eq!(rocebus_ipc_publisher_abort(p), 0);
            }
            sent += 7 + 3;
            assert!(
                rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(count), clientd, 16) >= 0
            );
        }
        while rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(count), clientd, 16) > 0 {}
        // Back-pressure: the subscriber stops polling and the ring fills.
        let mut refused = 0;
        for _ in 0..2000 {
            match rocebus_ipc_publisher_offer(p, 1, msg.as_ptr(), msg.len()) {
                0 => {}
                rc => {
                    assert_eq!(rc, RocebusStatus::BackPressured as i32);
                    refused += 1;
                }
            }
        }
        let during = allocs() - before;
        assert_eq!(seen, sent, "every message was delivered, in full");
        assert!(refused > 100, "the ring never filled ({refused} refusals)");
        assert_eq!(during, 0, "{during} allocations on the per-message path");

        assert_eq!(rocebus_ipc_subscriber_free(s), 0);
        assert_eq!(rocebus_ipc_publisher_free(p), 0);
        rocebus_ipc_config_free(cfg);
    }
}
