//! The ipc lifecycle events through the C API: a subscriber hears that it
//! joined and that its publisher closed the stream; a `flow = "drop"`
//! publisher reports the subscriber it dropped for lagging a ring behind.
#![allow(unsafe_code)] // the test calls the C entry points

use rocebus_ffi::*;
use std::ffi::{c_void, CString};
use std::ptr::null_mut;

unsafe extern "C" fn ignore(_: *mut c_void, _: u16, _: *const u8, _: usize) {}

#[test]
fn subscriber_and_publisher_events() {
    let dir = tempfile::tempdir().unwrap();
    let toml = CString::new(format!(
        "dir = \"{}\"\nring_bytes = 65536\nmax_payload = 1024\nflow = \"drop\"",
        dir.path().join("s").display()
    ))
    .unwrap();
    let (mut cfg, mut p, mut s) = (null_mut(), null_mut(), null_mut());
    let none = RocebusIpcEvent {
        kind: RocebusIpcEventKind::Corrupt,
        session: 0,
        publisher_pid: 0,
        skipped_bytes: 0,
        clean: 0,
    };
    // SAFETY: all calls below get pointers the library made and that are
    // not freed yet (or NULL where allowed), and buffers of the lengths given.
    unsafe {
        assert_eq!(rocebus_ipc_config_from_toml(toml.as_ptr(), &mut cfg), 0);
        assert_eq!(rocebus_ipc_publisher_new(cfg, c"ev".as_ptr(), &mut p), 0);
        assert_eq!(rocebus_ipc_subscriber_new(cfg, c"ev".as_ptr(), &mut s), 0);
        assert_eq!(
            rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(ignore), null_mut(), 1),
            0
        );
        let mut ev = none;
        assert_eq!(rocebus_ipc_subscriber_poll_event(s, &mut ev), 1);
        assert_eq!(ev.kind, RocebusIpcEventKind::Connected);
        assert_eq!(ev.publisher_pid, std::process::id());
        assert_eq!(rocebus_ipc_subscriber_poll_event(s, &mut ev), 0);

        // Two rings' worth while the subscriber does not poll: dropped.
        let msg = [1u8; 1000];
        for _ in 0..140 {
            assert_eq!(
                rocebus_ipc_publisher_offer(p, 1, msg.as_ptr(), msg.len()),
                0
            );
        }
        let mut pe = RocebusIpcPubEvent {
            kind: RocebusIpcPubEventKind::SubscriberGone,
            slot: 99,
            pid: 99,
        };
        assert!(rocebus_ipc_publisher_poll(p, rocebus_now_ns()) >= 1);
        assert_eq!(rocebus_ipc_publisher_poll_event(p, &mut pe), 1);
        assert_eq!(pe.kind, RocebusIpcPubEventKind::SubscriberDropped);
        assert_eq!((pe.slot, pe.pid), (0, 0));
        // The subscriber learns it too, and continues from the newest frame.
        rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(ignore), null_mut(), 16);
        assert_eq!(rocebus_ipc_subscriber_poll_event(s, &mut ev), 1);
        assert_eq!(ev.kind, RocebusIpcEventKind::Dropped);
        assert!(ev.skipped_bytes > 65536, "{}", ev.skipped_bytes);

        // The publisher closes the stream: the subscriber hears it (it checks
        // after 1024 idle polls, at most every liveness_ms).
        assert_eq!(rocebus_ipc_publisher_free(p), 0);
        let t = std::time::Instant::now();
        let mut gone = None;
        while gone.is_none() && t.elapsed() < std::time::Duration::from_secs(10) {
            rocebus_ipc_subscriber_poll(s, rocebus_now_ns(), Some(ignore), null_mut(), 16);
            if rocebus_ipc_subscriber_poll_event(s, &mut ev) == 1 {
                gone = Some(ev);
            }
        }
        let gone = gone.expect("PUBLISHER_GONE within 10 s");
        assert_eq!(gone.kind, RocebusIpcEventKind::PublisherGone);
        assert_eq!(gone.clean, 1);
        assert_eq!(rocebus_ipc_subscriber_is_connected(s), 0);
        assert_eq!(rocebus_ipc_subscriber_free(s), 0);
        rocebus_ipc_config_free(cfg);
    }
}
