//! The per-message calls of the C API do not allocate: offer, try_claim,
//! commit, abort and poll, and their everyday errors (back-pressure, a
//! claim left open, commit without a claim), whose messages are static.
//! Counted by a global allocator around a loop through the entry points,
//! on this thread only (the test harness's other threads do not count).

#![allow(unsafe_code)] // the test calls the C entry points and is an allocator

mod common;

use rocebus_ffi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::path::Path;
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

unsafe extern "C" fn count_frame(clientd: *mut c_void, f: *const RocebusFrame) {
    // SAFETY: clientd is a Cell<u64> of the test; the frame and its payload are valid
    // during the call.
    unsafe {
        let f = &*f;
        let n = &*(clientd as *const Cell<u64>);
        n.set(n.get() + u64::from(*f.payload.add(f.len - 1)));
    }
}

/// The same over the orders path (RC, RDMA WRITE into the peer's ring) in the soft-RoCE
/// guest: offer, offer_and_flush, try_claim/commit/abort, flush and poll on both ends of a
/// connection, and their everyday errors (a claim left open, commit without a claim, a
/// payload too large, a reserved type), for 1,000 round trips, with no allocation on this
/// thread. Connecting allocates (the rings, the queue pair): before counting.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_orders_per_message_calls_do_not_allocate() {
    let toml = c"[orders]\ntoken = \"no-alloc\"\nring_size = 65536\nmax_payload = 256\nconnect_timeout_ms = 60000\n";
    let addr =
        CString::new(std::net::SocketAddr::new(common::local_ip(), 7571).to_string()).unwrap();
    let (mut cfg, mut listener, mut client) = (null_mut(), null_mut(), null_mut());
    // SAFETY: all calls below get pointers the library made and that are not freed yet,
    // and buffers of the lengths given; the accepted connection is used by this thread
    // only once the accepting thread has handed it over.
    unsafe {
        assert_eq!(rocebus_orders_config_from_toml(toml.as_ptr(), &mut cfg), 0);
        assert_eq!(
            rocebus_orders_listener_bind(cfg, addr.as_ptr(), &mut listener),
            0
        );
        let l = listener as usize;
        let accepting = std::thread::spawn(move || {
            let mut c = null_mut();
            let rc = rocebus_orders_listener_accept(l as *mut _, 60_000, &mut c);
            (rc, c as usize)
        });
        assert_eq!(rocebus_orders_connect(cfg, addr.as_ptr(), &mut client), 0);
        let (rc, server) = accepting.join().unwrap();
        assert_eq!(rc, 0, "accept");
        let server = server as *mut RocebusOrdersConnection;
        let (at_server, at_client) = (Cell::new(0u64), Cell::new(0u64));
        let sd = &at_server as *const Cell<u64> as *mut c_void;
        let cd = &at_client as *const Cell<u64> as *mut c_void;
        let msg = [5u8; 64];
        let mut buf = null_mut();
        let too_large = [0u8; 257];
        // The first round trip outside the count (a first poll may set up what it reuses).
        assert_eq!(
            rocebus_orders_connection_offer_and_flush(client, 1, 10, msg.as_ptr(), msg.len()),
            0
        );
        while at_server.get() < 5 {
            assert!(rocebus_orders_connection_poll(server, Some(count_frame), sd, 16) >= 0);
        }
        assert_eq!(
            rocebus_orders_connection_offer_and_flush(server, 1, 11, msg.as_ptr(), msg.len()),
            0
        );
        while at_client.get() < 5 {
            assert!(rocebus_orders_connection_poll(client, Some(count_frame), cd, 16) >= 0);
        }

        let before = allocs();
        for i in 0..1000u64 {
            // Client: an offer and a claim, then the errors, then a flush.
            assert_eq!(
                rocebus_orders_connection_offer(client, 1, 10, msg.as_ptr(), msg.len()),
                0
            );
            assert_eq!(
                rocebus_orders_connection_try_claim(client, 2, 12, 32, &mut buf),
                0
            );
            *buf.add(31) = 2;
            assert_eq!(
                rocebus_orders_connection_offer(client, 1, 10, msg.as_ptr(), 1),
                RocebusStatus::ClaimOpen as i32
            );
            assert_eq!(rocebus_orders_connection_commit(client), 0);
            assert_eq!(
                rocebus_orders_connection_commit(client),
                RocebusStatus::NoClaim as i32
            );
            if i % 3 == 0 {
                assert_eq!(
                    rocebus_orders_connection_try_claim(client, 2, 12, 32, &mut buf),
                    0
                );
                assert_eq!(rocebus_orders_connection_abort(client), 0);
            }
            assert_eq!(
                rocebus_orders_connection_offer(client, 1, 10, too_large.as_ptr(), too_large.len()),
                RocebusStatus::TooLarge as i32
            );
            assert_eq!(
                rocebus_orders_connection_offer(client, 1, 0xFF00, msg.as_ptr(), msg.len()),
                RocebusStatus::ReservedType as i32
            );
            assert_eq!(rocebus_orders_connection_flush(client), 0);
            // Server: both frames in, one answer out.
            let want = 5 + (i + 1) * 7;
            while at_server.get() < want {
                assert!(rocebus_orders_connection_poll(server, Some(count_frame), sd, 16) >= 0);
            }
            assert_eq!(
                rocebus_orders_connection_offer_and_flush(server, 1, 11, msg.as_ptr(), msg.len()),
                0
            );
            let want = 5 + (i + 1) * 5;
            while at_client.get() < want {
                assert!(rocebus_orders_connection_poll(client, Some(count_frame), cd, 16) >= 0);
            }
        }
        let during = allocs() - before;
        assert_eq!(
            (at_server.get(), at_client.get()),
            (5 + 1000 * 7, 5 + 1000 * 5),
            "every frame arrived once"
        );
        assert_eq!(
            during, 0,
            "{during} allocations on the orders per-message path"
        );

        assert_eq!(rocebus_orders_connection_free(client), 0);
        assert_eq!(rocebus_orders_connection_free(server), 0);
        assert_eq!(rocebus_orders_listener_free(listener), 0);
        rocebus_orders_config_free(cfg);
    }
}

/// What the market-data test's callbacks keep: messages seen, counters out of order, events.
#[derive(Default)]
struct MdSeen {
    messages: Cell<u64>,
    wrong: Cell<u64>,
    events: Cell<u64>,
}

unsafe extern "C" fn md_message(clientd: *mut c_void, _seq: u64, msg: *const u8, len: usize) {
    // SAFETY: clientd is the test's MdSeen; msg holds len bytes during the call.
    unsafe {
        let seen = &*(clientd as *const MdSeen);
        let mut v = [0u8; 8];
        if len == 8 {
            std::ptr::copy_nonoverlapping(msg, v.as_mut_ptr(), 8);
        }
        if len != 8 || u64::from_le_bytes(v) != seen.messages.get() {
            seen.wrong.set(seen.wrong.get() + 1);
        }
        seen.messages.set(seen.messages.get() + 1);
    }
}

unsafe extern "C" fn md_event(clientd: *mut c_void, _e: *const RocebusMdEvent) {
    // SAFETY: clientd is the test's MdSeen.
    let seen = unsafe { &*(clientd as *const MdSeen) };
    seen.events.set(seen.events.get() + 1);
}

/// The same for the market-data subscriber through C (`rocebus_md_subscriber_poll`), on a
/// channel over RC fan-out (`transport = "rc"`: reliable, so the steady state has no
/// repair to make) in the soft-RoCE guest: a Rust publisher on another thread offers
/// 20,000 counters; this thread subscribes through the C API and, once 2,000 have arrived
/// (connecting and the first polls allocate), polls the other 18,000 with no allocation on
/// this thread, every counter in order.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_subscriber_poll_does_not_allocate() {
    use rocebus::clock::Mono;
    use rocebus::mcast::{config::McastConfig, MdPublisher, Snapshot};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    const CHANNEL: u16 = 3;
    const TOTAL: u64 = 20_000;
    const WARM: u64 = 2_000;
    let text = "max_datagram_payload = 1024\nhistory_depth = 4096\n\n[recovery]\n\
                dead_link_ns = 10000000000\n\n[auth]\nsecret = \"no-alloc-md\"\n\n\
                [[channels]]\nid = 3\nname = \"noalloc\"\ntransport = \"rc\"\nport = 7572\n";
    let ip = common::local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = {
        let cfg = McastConfig::from_toml_str(text).expect("config");
        let stop = stop.clone();
        std::thread::spawn(move || {
            struct Last(u64);
            impl Snapshot for Last {
                fn snapshot_seq(&self) -> u64 {
                    self.0
                }
                fn write_snapshot(&self, out: &mut Vec<u8>) {
                    out.extend_from_slice(&self.0.to_le_bytes());
                }
            }
            let mut p = MdPublisher::new(&cfg, CHANNEL, 1, ip).expect("publisher");
            let mut last = Last(0);
            let t0 = Instant::now();
            while p.connections() < 1 {
                assert!(t0.elapsed() < Duration::from_secs(60), "no subscriber");
                p.poll(Mono::now(), &last).expect("poll");
            }
            for i in 0..TOTAL {
                let now = Mono::now();
                last.0 = p.offer(now, &i.to_le_bytes()).expect("offer");
                p.poll(now, &last).expect("poll");
            }
            p.flush(Mono::now()).expect("flush");
            // ORDERING: Acquire pairs with the test thread's Release once it has everything.
            while !stop.load(Ordering::Acquire) {
                p.poll(Mono::now(), &last).expect("poll");
                assert!(t0.elapsed() < Duration::from_secs(120), "never stopped");
            }
        })
    };
    let toml = CString::new(text).unwrap();
    let addr = CString::new(ip.to_string()).unwrap();
    let seen = MdSeen::default();
    let handler = RocebusMdHandler {
        clientd: &seen as *const MdSeen as *mut c_void,
        on_message: Some(md_message),
        on_gap: None,
        on_event: Some(md_event),
        on_snapshot_begin: None,
        on_snapshot_chunk: None,
        on_snapshot_end: None,
    };
    let (mut cfg, mut s) = (null_mut(), null_mut());
    // SAFETY: all calls below get pointers the library made and that are not freed yet,
    // NUL-terminated strings, and a handler whose callbacks do not unwind.
    unsafe {
        assert_eq!(rocebus_md_config_from_toml(toml.as_ptr(), &mut cfg), 0);
        let t0 = Instant::now();
        while rocebus_md_subscriber_connect(cfg, CHANNEL, addr.as_ptr(), addr.as_ptr(), &mut s) != 0
        {
            assert!(t0.elapsed() < Duration::from_secs(60), "never connected");
            std::thread::sleep(Duration::from_millis(100));
        }
        while seen.messages.get() < WARM {
            assert!(rocebus_md_subscriber_poll(s, rocebus_now_ns(), &handler, 64) >= 0);
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "{} messages",
                seen.messages.get()
            );
        }
        let before = allocs();
        while seen.messages.get() < TOTAL {
            assert!(rocebus_md_subscriber_poll(s, rocebus_now_ns(), &handler, 64) >= 0);
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "{} messages",
                seen.messages.get()
            );
        }
        let during = allocs() - before;
        // ORDERING: Release pairs with the publisher's Acquire.
        stop.store(true, Ordering::Release);
        publisher.join().expect("publisher");
        assert_eq!(seen.wrong.get(), 0, "counters out of order");
        assert_eq!(
            during, 0,
            "{during} allocations polling market data through C"
        );
        assert_eq!(rocebus_md_subscriber_free(s), 0);
        rocebus_md_config_free(cfg);
    }
}

/// What the engine-session test's handler counts: responses by kind, and any that did not
/// apply to the book.
#[derive(Default)]
struct EngineSeen {
    acks: Cell<u64>,
    fills: Cell<u64>,
    other: Cell<u64>,
    not_applied: Cell<u64>,
}

unsafe extern "C" fn engine_response(clientd: *mut c_void, r: *const RocebusEngineResponse) {
    // SAFETY: clientd is the test's EngineSeen; `r` is valid during the call.
    unsafe {
        let seen = &*(clientd as *const EngineSeen);
        let r = &*r;
        if r.error != RocebusResponseError::None {
            seen.not_applied.set(seen.not_applied.get() + 1);
        }
        let c = match r.kind {
            RocebusResponseKind::Ack => &seen.acks,
            RocebusResponseKind::Fill => &seen.fills,
            _ => &seen.other,
        };
        c.set(c.get() + 1);
    }
}

/// The order gateway, killed when the test ends however it ends.
struct Gateway(std::process::Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The engine session's per-order calls through the C API (`rocebus_engine_session_new_order`,
/// `_flush`, `_poll` with its response handler) against the real order gateway (the demo's
/// configuration, its venue simulator, a fixed reference price instead of market data): 1,000
/// orders, each acknowledged and filled, with no allocation on this thread. Connecting and
/// the first orders (the book's first entries, the first responses) are not counted; the
/// book is made with room for every order (`expected_orders`), as the header says.
#[test]
#[ignore = "rdma: runs order-gateway on an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_engine_session_calls_do_not_allocate() {
    const WARM: u64 = 20;
    const COUNTED: u64 = 1000;
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(|d| d.parent()).unwrap();
    let gw_bin = bin.join("order-gateway");
    assert!(
        gw_bin.is_file(),
        "{} missing: build the workspace's binaries first (`cargo build --workspace --bins`)",
        gw_bin.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    let configs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/demo");
    let addr = std::net::SocketAddr::new(common::local_ip(), 7573).to_string();
    let adapt = |text: String| {
        text.replace("198.18.0.1:7470", &addr)
            .replace("198.18.0.1", &common::local_ip().to_string())
            .replace("/tmp/rocebus-demo", &work.display().to_string())
    };
    let demo = adapt(std::fs::read_to_string(configs.join("order-gateway.toml")).unwrap());
    // No market data: a reference price the gateway sets itself every turn.
    let (head, tail) = demo.split_at(demo.find("[market_data]").expect("[market_data]"));
    let rdma = &tail[tail.find("[rdma]").expect("[rdma] after [market_data]")..];
    let gw_cfg = work.join("order-gateway.toml");
    std::fs::write(
        &gw_cfg,
        format!("{head}{rdma}\n[reference_prices]\nAAPL = 100.0\n"),
    )
    .unwrap();
    let log = work.join("order-gateway.log");
    let _gw = Gateway(
        std::process::Command::new(&gw_bin)
            .args(["run", "--venue", "sim", "--config"])
            .arg(&gw_cfg)
            .env("ROCEBUS_DIR", work.join("counters"))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let engine = adapt(std::fs::read_to_string(configs.join("sample-engine.toml")).unwrap())
        .replace("gateway_timeout_ms = 3000", "gateway_timeout_ms = 60000");
    let engine = CString::new(engine).unwrap();
    let seen = EngineSeen::default();
    let clientd = &seen as *const EngineSeen as *mut c_void;
    let (mut cfg, mut s) = (null_mut(), null_mut());
    let gw_log = || std::fs::read_to_string(&log).unwrap_or_default();
    // SAFETY: all calls below get pointers the library made and that are not freed yet;
    // `clientd` outlives every poll.
    unsafe {
        assert_eq!(
            rocebus_engine_config_from_toml(engine.as_ptr(), &mut cfg),
            0
        );
        let rc = rocebus_engine_connect(cfg, 1, (WARM + COUNTED + 100) as usize, &mut s);
        assert_eq!(
            rc,
            0,
            "logon: {:?}\n{}",
            std::ffi::CStr::from_ptr(rocebus_last_error()),
            gw_log()
        );
        let aapl = c"AAPL";
        let order = |n: u64| {
            let mut id = 0u64;
            let side = if n % 2 == 0 { 1 } else { 2 };
            let rc =
                rocebus_engine_session_new_order(s, 0, aapl.as_ptr(), side, 10, 1_000_000, &mut id);
            assert_eq!(rc, 0, "new order {n}");
            assert_eq!(rocebus_engine_session_flush(s), 0, "flush {n}");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while seen.fills.get() < n {
                let got = rocebus_engine_session_poll(s, Some(engine_response), clientd, 16);
                assert!(
                    got >= 0,
                    "poll: {:?}",
                    std::ffi::CStr::from_ptr(rocebus_last_error())
                );
                assert!(
                    seen.other.get() == 0 && seen.not_applied.get() == 0,
                    "order {n}: {} responses neither ack nor fill, {} not applied\n{}",
                    seen.other.get(),
                    seen.not_applied.get(),
                    gw_log()
                );
                assert!(
                    std::time::Instant::now() < deadline,
                    "order {n} not filled in 30 s\n{}",
                    gw_log()
                );
            }
        };
        for n in 1..=WARM {
            order(n);
        }
        let before = allocs();
        for n in WARM + 1..=WARM + COUNTED {
            order(n);
        }
        let during = allocs() - before;
        assert_eq!(
            (seen.acks.get(), seen.fills.get()),
            (WARM + COUNTED, WARM + COUNTED),
            "every order acknowledged and filled once"
        );
        assert_eq!(
            during, 0,
            "{during} allocations on the engine session's per-order path"
        );
        assert_eq!(rocebus_engine_session_free(s), 0);
        rocebus_engine_config_free(cfg);
    }
}
