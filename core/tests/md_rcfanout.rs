//! Market data over RC fan-out (`transport = "rc"`) on soft-RoCE, in one
//! guest: the publisher and its subscribers are threads of this process,
//! each on its own RC connection. All tests are `#[ignore]`d "rdma: ..." so a
//! host without a device reports them as ignored; `cargo xtask test` runs
//! them in the guest.
//!
//! Every subscriber applies the stream to a small order-book-like state and
//! checks each message's sequence (carried in the message too), through the
//! same `Handler`/`SnapshotSink` a multicast subscriber takes; the final
//! state, count and running checksum must equal the publisher's.

use rocebus::clock::{now_ns, Mono};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{
    Event, FanoutDrop, FanoutEvent, Handler, MdPublisher, MdSubscriber, Phase, RcFanoutPublisher,
    RcFanoutSubscriber, RestoreError, Snapshot, SnapshotSink,
};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEYS: usize = 256;
const MSG_LEN: usize = 16;
const CHANNEL: u16 = 9;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Book {
    prices: Vec<u64>,
    count: u64,
    last_seq: u64,
    hash: u64,
    order_errors: u64,
    staged: Vec<u8>,
}

impl Book {
    fn new() -> Self {
        Book {
            prices: vec![0; KEYS],
            count: 0,
            last_seq: 0,
            hash: 0xcbf2_9ce4_8422_2325,
            order_errors: 0,
            staged: Vec::new(),
        }
    }
    fn msg(seq: u64) -> [u8; MSG_LEN] {
        let mut m = [0u8; MSG_LEN];
        m[..8].copy_from_slice(&seq.to_le_bytes());
        let key = (seq.wrapping_mul(7919) % KEYS as u64) as u16;
        m[8..10].copy_from_slice(&key.to_le_bytes());
        m[10..16].copy_from_slice(&(seq * 31 + 17).to_le_bytes()[..6]);
        m
    }
    fn apply(&mut self, seq: u64, msg: &[u8]) {
        if seq != self.last_seq + 1 || msg.len() != MSG_LEN || msg[..8] != seq.to_le_bytes() {
            self.order_errors += 1;
        }
        if msg.len() == MSG_LEN {
            let key = u16::from_le_bytes([msg[8], msg[9]]) as usize % KEYS;
            let mut p = [0u8; 8];
            p[..6].copy_from_slice(&msg[10..16]);
            self.prices[key] = u64::from_le_bytes(p);
        }
        for b in msg {
            self.hash = (self.hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.count += 1;
        self.last_seq = seq;
    }
    fn digest(&self) -> (u64, u64, u64, &[u64]) {
        (self.count, self.last_seq, self.hash, &self.prices)
    }
}

impl Handler for Book {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.apply(seq, msg);
    }
}

impl Snapshot for Book {
    fn snapshot_seq(&self) -> u64 {
        self.last_seq
    }
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        for v in [self.count, self.last_seq, self.hash] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for p in &self.prices {
            out.extend_from_slice(&p.to_le_bytes());
        }
    }
}

impl SnapshotSink for Book {
    fn begin_restore(&mut self) {
        self.staged.clear();
    }
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.staged.extend_from_slice(data);
        Ok(())
    }
    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        if self.staged.len() != 24 + KEYS * 8 {
            return Err(RestoreError);
        }
        let word = |i: usize| u64::from_le_bytes(self.staged[i * 8..i * 8 + 8].try_into().unwrap());
        if word(1) != snapshot_seq {
            return Err(RestoreError);
        }
        self.count = word(0);
        self.last_seq = word(1);
        self.hash = word(2);
        self.prices = (0..KEYS).map(|k| word(3 + k)).collect();
        Ok(())
    }
}

fn local_ip() -> IpAddr {
    if let Some(ip) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return ip;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let idx = ctx.default_gid_index(1).expect("gid index");
    let gid = ctx.query_gid(1, idx).expect("gid");
    IpAddr::V4(gid.ipv4().expect("an IPv4 GID (ROCEBUS_GUEST_ADDR)"))
}

fn config(port: u16, ring_size: usize, slow_ns: u64) -> McastConfig {
    McastConfig::from_toml_str(&format!(
        r#"
max_datagram_payload = 1024
history_depth = 4096

[batching]
max_messages = 64
flush_interval_ns = 20000

[recovery]
join_replay_max = 100
snapshot_timeout_ns = 2000000000
# A subscriber gives a silent publisher up after this long: long enough that
# an emulator holding a thread off its vCPU is not taken for a dead
# publisher (one test shortens it).
dead_link_ns = 10000000000

[rc_fanout]
ring_size = {ring_size}
slow_subscriber_ns = {slow_ns}

[auth]
secret = "rc-fanout-test"

[[channels]]
id = {CHANNEL}
name = "rc"
transport = "rc"
port = {port}
"#
    ))
    .expect("test config")
}

/// Connects a subscriber through the configuration, retrying while the
/// publisher's listener comes up.
fn connect(cfg: &McastConfig, ip: IpAddr) -> MdSubscriber {
    let t0 = Instant::now();
    loop {
        match MdSubscriber::connect(cfg, CHANNEL, ip, ip) {
            Ok(s) => return s,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(60), "subscriber: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Polls `s` into `book` until it delivered up to `total` (and is live).
fn follow(s: &mut MdSubscriber, book: &mut Book, total: u64, deadline: Duration) -> Vec<Event> {
    let t0 = Instant::now();
    let mut events = Vec::new();
    while !(book.last_seq == total && s.state().phase() == Phase::Live) {
        s.poll(Mono::now(), book, 64).expect("subscriber poll");
        while let Some(e) = s.poll_event() {
            events.push(e);
        }
        assert!(
            t0.elapsed() < deadline,
            "delivered up to {} of {total}: {:?} events {events:?}",
            book.last_seq,
            s.counters()
        );
    }
    events
}

/// Publishes messages `from..=to`, `per_poll` per poll, sleeping `pause`
/// between polls (a modest, steady rate).
fn publish_range(
    p: &mut MdPublisher,
    book: &mut Book,
    from: u64,
    to: u64,
    per_poll: u64,
    pause: Duration,
) {
    let mut seq = from;
    while seq <= to {
        for _ in 0..per_poll {
            if seq > to {
                break;
            }
            let m = Book::msg(seq);
            assert_eq!(p.offer(Mono::now(), &m).unwrap(), seq);
            book.apply(seq, &m);
            seq += 1;
        }
        p.poll(Mono::now(), &*book).expect("publisher poll");
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
    }
    p.flush(Mono::now()).unwrap();
}

fn wait_connections(p: &mut MdPublisher, book: &Book, n: usize) {
    let t0 = Instant::now();
    while p.connections() < n {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "only {} of {n} subscribers connected",
            p.connections()
        );
        p.poll(Mono::now(), book).unwrap();
    }
}

fn serve_until(p: &mut MdPublisher, book: &Book, stop: &AtomicBool, deadline: Duration) {
    let t0 = Instant::now();
    // ORDERING: Acquire, pairs with the Release store of the test thread.
    while !stop.load(Ordering::Acquire) {
        assert!(t0.elapsed() < deadline, "subscribers never finished");
        p.poll(Mono::now(), book).unwrap();
    }
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_three_subscribers_in_order() {
    let total = 30_000;
    let subs = 3;
    let cfg = config(7811, 1 << 20, 1_000_000_000);
    let ip = local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop) = (cfg.clone(), stop.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = MdPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        assert!(matches!(p, MdPublisher::Rc(_)), "transport = rc picks RC");
        let mut book = Book::new();
        wait_connections(&mut p, &book, subs);
        publish_range(&mut p, &mut book, 1, total, 32, Duration::from_micros(50));
        serve_until(&mut p, &book, &pstop, Duration::from_secs(120));
        (book, p)
    });
    let handles: Vec<_> = (0..subs)
        .map(|_| {
            let cfg = cfg.clone();
            std::thread::spawn(move || {
                let mut s = connect(&cfg, ip);
                assert!(matches!(s, MdSubscriber::Rc(_)));
                let mut book = Book::new();
                let events = follow(&mut s, &mut book, total, Duration::from_secs(120));
                let c = s.counters();
                s.disconnect();
                (book, c, events)
            })
        })
        .collect();
    let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    let (book, p) = publisher.join().unwrap();
    let MdPublisher::Rc(p) = p else {
        unreachable!()
    };
    eprintln!("publisher: {:?} {:?}", p.stats(), p.state().counters());
    for (b, c, events) in &results {
        assert_eq!(b.order_errors, 0, "out-of-order or corrupt delivery");
        assert_eq!(b.digest(), book.digest(), "final state differs");
        // Present from the start: every message delivered, no snapshot.
        assert_eq!(c.delivered, total, "{c:?}");
        assert_eq!(c.snapshots_applied, 0, "{c:?}");
        assert_eq!(
            (c.unrecoverable, c.gaps_detected),
            (0, 0),
            "{c:?} {events:?}"
        );
    }
    let st = p.stats();
    assert_eq!(st.subscribers_joined, subs as u64);
    assert_eq!(st.dropped_stalled + st.dropped_behind_history, 0, "{st:?}");
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_late_joiner_starts_from_snapshot() {
    let (first, total) = (20_000, 40_000);
    let cfg = config(7812, 1 << 20, 1_000_000_000);
    let ip = local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let halfway = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop, phalf) = (cfg.clone(), stop.clone(), halfway.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = MdPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let mut book = Book::new();
        wait_connections(&mut p, &book, 1);
        publish_range(&mut p, &mut book, 1, first, 64, Duration::from_micros(20));
        // ORDERING: Release, pairs with the late subscriber's Acquire.
        phalf.store(true, Ordering::Release);
        // The rest goes out while the late joiner connects and restores.
        wait_connections(&mut p, &book, 2);
        publish_range(
            &mut p,
            &mut book,
            first + 1,
            total,
            32,
            Duration::from_micros(50),
        );
        serve_until(&mut p, &book, &pstop, Duration::from_secs(120));
        (book, p)
    });
    let early_cfg = cfg.clone();
    let early = std::thread::spawn(move || {
        let mut s = connect(&early_cfg, ip);
        let mut book = Book::new();
        follow(&mut s, &mut book, total, Duration::from_secs(120));
        (book, s.counters())
    });
    let t0 = Instant::now();
    // ORDERING: Acquire, pairs with the publisher's Release store.
    while !halfway.load(Ordering::Acquire) {
        assert!(t0.elapsed() < Duration::from_secs(120), "publisher stuck");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut late = connect(&cfg, ip);
    let mut late_book = Book::new();
    let events = follow(&mut late, &mut late_book, total, Duration::from_secs(120));
    let lc = late.counters();
    late.disconnect();
    let (early_book, ec) = early.join().unwrap();
    stop.store(true, Ordering::Release);
    let (book, p) = publisher.join().unwrap();
    let MdPublisher::Rc(p) = p else {
        unreachable!()
    };
    eprintln!(
        "late joiner: {lc:?} events {events:?}\npublisher: {:?}",
        p.stats()
    );
    assert_eq!(early_book.digest(), book.digest());
    assert_eq!((ec.delivered, ec.snapshots_applied), (total, 0));
    // The late joiner started from a snapshot taken at or after message
    // `first`, then got every later message in order.
    let snap = events.iter().find_map(|e| match e {
        Event::SnapshotApplied { seq } => Some(*seq),
        _ => None,
    });
    let snap = snap.expect("the late joiner applied a snapshot");
    assert!(snap >= first && snap < total, "snapshot at {snap}");
    assert!(events.contains(&Event::ResyncStarted), "{events:?}");
    assert_eq!(lc.snapshots_applied, 1, "{lc:?}");
    assert_eq!(lc.delivered, total - snap, "{lc:?}");
    assert_eq!(late_book.order_errors, 0);
    assert_eq!(late_book.digest(), book.digest(), "final state differs");
    assert_eq!(p.stats().snapshots_served, 1, "{:?}", p.stats());
}

#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_stalled_subscriber_is_dropped_others_unaffected() {
    let total = 100_000;
    // A 64 KiB ring holds about 60 datagrams: a subscriber that takes
    // nothing is full within a few thousand messages, and dropped 2 s
    // later (while the publisher goes on publishing, or afterwards: its
    // polls keep trying to write what the subscriber is missing). The
    // bound is generous: a busy emulator can hold a healthy subscriber's
    // thread off its vCPU for a few hundred milliseconds.
    let cfg = config(7813, 64 << 10, 2_000_000_000);
    let ip = local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop, pdropped) = (cfg.clone(), stop.clone(), dropped.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = RcFanoutPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let mut book = Book::new();
        let mut events = Vec::new();
        let t0 = Instant::now();
        while p.connections() < 2 {
            assert!(t0.elapsed() < Duration::from_secs(60), "subscribers");
            p.poll(Mono::now(), &book).unwrap();
        }
        let mut seq = 1;
        while seq <= total {
            for _ in 0..32 {
                let m = Book::msg(seq);
                p.offer(Mono::now(), &m).unwrap();
                book.apply(seq, &m);
                seq += 1;
            }
            p.poll(Mono::now(), &book).unwrap();
            while let Some(e) = p.poll_event() {
                // The stalled one's drop, not the healthy one leaving
                // (`Lost`): polled before the publisher dropped it, the
                // stalled one would take credit back and catch up.
                if matches!(e, FanoutEvent::SubscriberDropped { reason, .. } if reason != FanoutDrop::Lost)
                {
                    // ORDERING: Release, pairs with the test thread's Acquire.
                    pdropped.store(true, Ordering::Release);
                }
                events.push(e);
            }
            std::thread::sleep(Duration::from_micros(100));
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "publisher too slow"
            );
        }
        p.flush(Mono::now()).unwrap();
        // ORDERING: Acquire, pairs with the test thread's Release store.
        while !pstop.load(Ordering::Acquire) {
            p.poll(Mono::now(), &book).unwrap();
            while let Some(e) = p.poll_event() {
                // The stalled one's drop, not the healthy one leaving
                // (`Lost`): polled before the publisher dropped it, the
                // stalled one would take credit back and catch up.
                if matches!(e, FanoutEvent::SubscriberDropped { reason, .. } if reason != FanoutDrop::Lost)
                {
                    // ORDERING: Release, pairs with the test thread's Acquire.
                    pdropped.store(true, Ordering::Release);
                }
                events.push(e);
            }
            assert!(t0.elapsed() < Duration::from_secs(180), "never stopped");
        }
        (book, p, events)
    });
    // The stalled one connects first and then takes nothing at all.
    let t0 = Instant::now();
    let mut stalled = loop {
        match RcFanoutSubscriber::connect(&cfg, CHANNEL, ip, ip) {
            Ok(s) => break s,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(60), "subscriber: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    let healthy_cfg = cfg.clone();
    let healthy = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut s = loop {
            match RcFanoutSubscriber::connect(&healthy_cfg, CHANNEL, ip, ip) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(t0.elapsed() < Duration::from_secs(60), "subscriber: {e}");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        };
        let mut book = Book::new();
        let mut events = Vec::new();
        // Until done, or dropped (reported by the assertions below).
        while book.last_seq < total && s.connected() && t0.elapsed() < Duration::from_secs(150) {
            s.poll(Mono::now(), &mut book, 64).unwrap();
            while let Some(e) = s.poll_event() {
                events.push(e);
            }
        }
        eprintln!("healthy: {:?} {:?} {events:?}", s.counters(), s.io_stats());
        (book, s.counters(), events)
    });
    let (hbook, hc, hevents) = healthy.join().unwrap();
    if hbook.last_seq < total {
        stop.store(true, Ordering::Release);
        let (_, p, events) = publisher.join().unwrap();
        panic!(
            "the healthy subscriber stopped at {}: publisher {:?} events {events:?}",
            hbook.last_seq,
            p.stats()
        );
    }
    // Once the publisher has dropped it, the stalled subscriber looks
    // again: it got an in-order prefix, then lost the connection.
    let t0 = Instant::now();
    // ORDERING: Acquire, pairs with the publisher thread's Release store.
    while !dropped.load(Ordering::Acquire) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the stalled subscriber was never dropped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut sbook = Book::new();
    let mut sevents = Vec::new();
    let t0 = Instant::now();
    while stalled.connected() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never saw the drop: delivered {} {:?} {:?} events {sevents:?}",
            sbook.count,
            stalled.io_stats(),
            stalled.counters()
        );
        stalled.poll(Mono::now(), &mut sbook, 64).unwrap();
        while let Some(e) = stalled.poll_event() {
            sevents.push(e);
        }
    }
    stop.store(true, Ordering::Release);
    let (book, p, events) = publisher.join().unwrap();
    let st = p.stats();
    eprintln!(
        "publisher: {st:?} events {events:?}\nstalled: delivered {} {:?} {sevents:?}",
        sbook.count,
        stalled.io_stats()
    );
    // The healthy subscriber got everything, in order, undisturbed.
    assert_eq!(hbook.order_errors, 0);
    assert_eq!(hbook.digest(), book.digest());
    assert_eq!((hc.delivered, hc.unrecoverable), (total, 0), "{hevents:?}");
    // The stalled one was dropped, with an event and a counter.
    assert_eq!(st.dropped_stalled + st.dropped_behind_history, 1, "{st:?}");
    assert_eq!(
        st.dropped_stalled, 1,
        "ring full past slow_subscriber_ns: {st:?}"
    );
    assert!(st.back_pressured > 0, "{st:?}");
    // (The healthy one leaving at the end shows up as `Lost`, behind 0.)
    let dropped: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            FanoutEvent::SubscriberDropped { reason, behind, .. }
                if *reason != FanoutDrop::Lost =>
            {
                Some((*reason, *behind))
            }
            _ => None,
        })
        .collect();
    assert_eq!(dropped.len(), 1, "{events:?}");
    assert_eq!(dropped[0].0, FanoutDrop::Stalled);
    assert!(dropped[0].1 > 0, "it was behind when dropped");
    // What it did get was an in-order prefix of the stream.
    assert_eq!(sbook.order_errors, 0);
    assert!(sbook.count > 0 && sbook.count < total, "{}", sbook.count);
    assert!(sevents.contains(&Event::RecoveryLost), "{sevents:?}");
}

/// A subscriber made before its publisher exists: `new` returns at once,
/// unconnected, and its polls keep trying (counted failures, no error);
/// once the publisher is up they connect (`RecoveryRestored`) and deliver
/// the stream. A connection closed in mid-stream is made again by the
/// polls that follow, and what was sent meanwhile arrives (replayed or by
/// snapshot): the final state equals the publisher's.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_subscriber_never_waits_and_reconnects() {
    let total = 20_000;
    let mut cfg = config(7814, 1 << 20, 2_000_000_000);
    cfg.recovery.reconnect_min_ns = 1_000_000;
    cfg.recovery.reconnect_max_ns = 50_000_000;
    let ip = local_ip();
    let t0 = Instant::now();
    let mut s = MdSubscriber::new(&cfg, CHANNEL, ip, ip).expect("subscriber");
    // Local work only (the device opened, the ring registered): 2.3 s once in a loaded
    // emulated guest (pre-check 12-07), hence the bound; what never waits is shown below.
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "new waited {:?}",
        t0.elapsed()
    );
    assert!(!s.connected());
    let mut book = Book::new();
    let mut events = Vec::new();
    // Nobody listens yet: polls return nothing and fail no call, until an attempt to
    // connect has failed and been counted (the first one of a fresh process takes longer:
    // the device is opened and rdma_cm set up first; 10 s at most in an emulated guest).
    let failures = |s: &MdSubscriber| match s {
        MdSubscriber::Rc(rc) => rc.io_stats(),
        _ => panic!("transport = rc picks RC"),
    };
    let t1 = Instant::now();
    while t1.elapsed() < Duration::from_millis(300)
        || (failures(&s).reconnect_failures == 0 && t1.elapsed() < Duration::from_secs(10))
    {
        assert_eq!(s.poll(Mono::now(), &mut book, 64).expect("poll"), 0);
        while let Some(e) = s.poll_event() {
            events.push(e);
        }
    }
    let before = failures(&s);
    assert!(
        before.reconnect_failures > 0 && before.reconnects == 0,
        "{before:?}"
    );
    assert!(!s.connected());
    let stop = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop) = (cfg.clone(), stop.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = MdPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let mut book = Book::new();
        wait_connections(&mut p, &book, 1);
        publish_range(&mut p, &mut book, 1, total, 16, Duration::from_micros(200));
        serve_until(&mut p, &book, &pstop, Duration::from_secs(120));
        (book, p)
    });
    let mut closed = false;
    let t2 = Instant::now();
    while !(book.last_seq == total && s.state().phase() == Phase::Live) {
        s.poll(Mono::now(), &mut book, 64).expect("poll");
        while let Some(e) = s.poll_event() {
            events.push(e);
        }
        if !closed && book.last_seq >= 3_000 {
            // Closed by us in mid-stream: the next polls connect again.
            s.disconnect();
            assert!(!s.connected());
            closed = true;
        }
        assert!(
            t2.elapsed() < Duration::from_secs(120),
            "delivered up to {} of {total}: {:?} events {events:?}",
            book.last_seq,
            s.counters()
        );
    }
    let MdSubscriber::Rc(rc) = &s else {
        unreachable!()
    };
    let st = rc.io_stats();
    let c = s.counters();
    stop.store(true, Ordering::Release);
    let (pbook, p) = publisher.join().unwrap();
    eprintln!("subscriber: {c:?} {st:?} events {events:?}");
    let MdPublisher::Rc(p) = p else {
        unreachable!()
    };
    eprintln!("publisher: {:?}", p.stats());
    assert!(closed);
    assert_eq!(book.order_errors, 0, "out-of-order or corrupt delivery");
    assert_eq!(book.digest(), pbook.digest(), "final state differs");
    assert_eq!(
        st.reconnects, 2,
        "the first connect and one after the close: {st:?}"
    );
    let restored = events
        .iter()
        .filter(|e| **e == Event::RecoveryRestored)
        .count();
    assert_eq!(restored, 2, "{events:?}");
    assert!(events.contains(&Event::RecoveryLost), "{events:?}");
    assert_eq!(p.stats().subscribers_joined, 2, "{:?}", p.stats());
}

/// A publisher that stops (frozen: no heartbeat, no disconnect, as a host
/// that died or hangs) is noticed by its subscriber within the silence bound
/// (`recovery.dead_link_ns`): the connection is given up (`RecoveryLost`,
/// `silent_links`), made again once the publisher is back, and the stream
/// goes on in order. An idle publisher that keeps polling is not given up:
/// its heartbeats keep the subscriber hearing from it. A frozen publisher
/// admits no subscriber (its listener thread refuses them: nobody would
/// welcome them), so the subscriber is connected again once, after the
/// freeze.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_frozen_publisher_is_noticed_by_silence() {
    let (first, total) = (2_000, 4_000);
    let mut cfg = config(7815, 1 << 20, 2_000_000_000);
    // 2.5 s: a loaded emulator has held the publisher's vCPU off for over
    // 1 s (CI, 12-07: a second, spurious give-up while it published).
    cfg.recovery.dead_link_ns = 2_500_000_000;
    cfg.recovery.reconnect_min_ns = 1_000_000;
    cfg.recovery.reconnect_max_ns = 100_000_000;
    let ip = local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop) = (cfg.clone(), stop.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = MdPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let mut book = Book::new();
        wait_connections(&mut p, &book, 1);
        publish_range(&mut p, &mut book, 1, first, 16, Duration::from_micros(200));
        // Idle but alive for 4 s (longer than the silence bound): heartbeats only.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(4) {
            p.poll(Mono::now(), &book).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        // Frozen for 5 s: nothing at all.
        std::thread::sleep(Duration::from_secs(5));
        publish_range(
            &mut p,
            &mut book,
            first + 1,
            total,
            16,
            Duration::from_micros(200),
        );
        serve_until(&mut p, &book, &pstop, Duration::from_secs(120));
        (book, p)
    });
    let mut s = connect(&cfg, ip);
    let mut book = Book::new();
    let mut events = Vec::new();
    let mut lost_at = None;
    let t0 = Instant::now();
    while !(book.last_seq == total && s.state().phase() == Phase::Live) {
        s.poll(Mono::now(), &mut book, 64).expect("poll");
        while let Some(e) = s.poll_event() {
            if e == Event::RecoveryLost && lost_at.is_none() {
                lost_at = Some(book.last_seq);
            }
            events.push(e);
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "delivered up to {} of {total}: {:?} events {events:?}",
            book.last_seq,
            s.counters()
        );
    }
    let MdSubscriber::Rc(rc) = &s else {
        panic!("transport = rc picks RC")
    };
    let st = rc.io_stats();
    stop.store(true, Ordering::Release);
    let (pbook, p) = publisher.join().unwrap();
    let MdPublisher::Rc(p) = p else {
        unreachable!()
    };
    eprintln!(
        "subscriber: {st:?} events {events:?}\npublisher: {:?} {:?}",
        p.stats(),
        p.listener_stats()
    );
    assert_eq!(book.order_errors, 0);
    assert_eq!(book.digest(), pbook.digest(), "final state differs");
    // Given up once, during the freeze (after everything before it arrived),
    // not during the idle phase, whose heartbeats kept it alive.
    assert_eq!(st.silent_links, 1, "{st:?}");
    assert_eq!(lost_at, Some(first), "{events:?}");
    assert!(p.stats().heartbeats_written > 10, "{:?}", p.stats());
    assert_eq!(st.reconnects, 1, "made again after the freeze: {st:?}");
    // While frozen the publisher admitted no one: its listener's thread
    // refused the subscriber's attempts (it had not polled for half the
    // silence bound) instead of completing handshakes nobody would
    // welcome; the subscriber got in once the publisher polled again. With
    // the listener answering regardless, the subscriber was admitted during
    // the freeze, heard nothing for the bound and gave the link up a second
    // time (silent_links 2, reconnects 2).
    let ls = p.listener_stats();
    assert!(st.reconnect_failures > 0, "{st:?}");
    assert!(ls.not_accepting > 0, "{ls:?}");
    assert_eq!(p.stats().subscribers_joined, 2, "{:?}", p.stats());
}

/// A subscriber that joins thousands of messages into the session, within
/// the history and `recovery.join_replay_max`, gets the start replayed
/// whole, even when it reads slowly (a debug-build recorder in a loaded
/// guest): nothing lost, no snapshot. On RC the answer to a retransmit
/// request arrives behind everything the publisher wrote to the ring
/// before it; a subscriber that timed its requests as on multicast gave a
/// range up as lost while its answer sat in the ring (CI 12-07: the
/// recorder joining ~10,000 messages in reported `1..4097` lost and
/// re-synchronised from a snapshot).
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_md_rc_fanout_late_joiner_within_history_is_replayed_whole() {
    let (first, total) = (12_000, 30_000);
    let mut cfg = config(7816, 1 << 20, 60_000_000_000);
    cfg.history_depth = 32_768;
    cfg.recovery.join_replay_max = 1_000_000;
    let ip = local_ip();
    let stop = Arc::new(AtomicBool::new(false));
    let halfway = Arc::new(AtomicBool::new(false));
    let (pcfg, pstop, phalf) = (cfg.clone(), stop.clone(), halfway.clone());
    let publisher = std::thread::spawn(move || {
        let mut p = MdPublisher::new(&pcfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let mut book = Book::new();
        // Nobody listens yet: the first messages go into the history only.
        publish_range(&mut p, &mut book, 1, first, 64, Duration::ZERO);
        // ORDERING: Release, pairs with the subscriber's Acquire.
        phalf.store(true, Ordering::Release);
        wait_connections(&mut p, &book, 1);
        // The rest goes out, fast, while the subscriber asks for the start.
        publish_range(
            &mut p,
            &mut book,
            first + 1,
            total,
            64,
            Duration::from_micros(20),
        );
        serve_until(&mut p, &book, &pstop, Duration::from_secs(180));
        (book, p)
    });
    let t0 = Instant::now();
    // ORDERING: Acquire, pairs with the publisher's Release store.
    while !halfway.load(Ordering::Acquire) {
        assert!(t0.elapsed() < Duration::from_secs(120), "publisher stuck");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut s = connect(&cfg, ip);
    let mut book = Book::new();
    let mut events = Vec::new();
    let t1 = Instant::now();
    while !(book.last_seq == total && s.state().phase() == Phase::Live) {
        // A slow reader: a few frames, then a pause (its ring fills with the
        // live stream while the start is being asked for).
        s.poll(Mono::now(), &mut book, 4).expect("subscriber poll");
        while let Some(e) = s.poll_event() {
            events.push(e);
        }
        std::thread::sleep(Duration::from_micros(500));
        assert!(
            t1.elapsed() < Duration::from_secs(150),
            "delivered up to {} of {total}: {:?} events {events:?}",
            book.last_seq,
            s.counters()
        );
    }
    let c = s.counters();
    s.disconnect();
    // ORDERING: Release, pairs with the Acquire load in `serve_until`.
    stop.store(true, Ordering::Release);
    let (pbook, p) = publisher.join().unwrap();
    let MdPublisher::Rc(p) = p else {
        unreachable!()
    };
    eprintln!(
        "subscriber: {c:?} events {events:?}\npublisher: {:?}",
        p.stats()
    );
    assert_eq!(book.order_errors, 0, "out-of-order or corrupt delivery");
    assert_eq!(book.digest(), pbook.digest(), "final state differs");
    assert_eq!(
        (c.delivered, c.snapshots_applied, c.unrecoverable),
        (total, 0, 0),
        "{c:?} {events:?}"
    );
    assert!(!events.contains(&Event::ResyncStarted), "{events:?}");
}
