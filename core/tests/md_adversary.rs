//! The market-data path against a misbehaving peer on the same fabric, on
//! real UD multicast and RC (soft-RoCE in the project's guest). All tests
//! are `#[ignore]`d "rdma: ..." so a host without a device reports them as
//! ignored; `cargo xtask test` runs them in one guest.
//!
//! The adversaries are built from the verbs layer directly: a raw UD queue
//! pair joined to the channel's group with the channel's qkey (what anyone
//! on the fabric who reads the config can do), and raw RC clients of the
//! recovery port that replay a captured handshake, skip the proof, or pass
//! it and then flood requests while never posting a receive.

mod common;

use rocebus::admission::CookieReply;
use rocebus::auth::{Initiator, Key, Purpose};
use rocebus::clock::{now_ns, Mono};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::io::NetError;
use rocebus::mcast::wire::{
    self, encode_auth_proof, encode_snapshot_request, write_datagram_header, Hello, Line,
    RetransmitRequest, Welcome, AUTH_PROOF_LEN, DATAGRAM_HEADER_LEN, WELCOME_SIGNED_LEN,
};
use rocebus::mcast::{Event, McastPublisher, McastSubscriber, Phase, Snapshot};
use rocebus::verbs::cm::{self, Connection, McastMembership};
use rocebus::verbs::{
    Access, Context, Dest, PoolConfig, PooledQp, ProtectionDomain, QpType, RcOptions, VerbsError,
};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};
use zerocopy::{FromBytes, IntoBytes};

const CHANNEL: u16 = 9;
const SECRET: &str = "md-adversary-secret";
const TIMEOUT: Duration = Duration::from_secs(5);

fn local_ip() -> IpAddr {
    if let Some(ip) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return ip;
    }
    let ctx = Context::open(None).expect("an RDMA device");
    let idx = ctx.default_gid_index(1).expect("gid index");
    let gid = ctx.query_gid(1, idx).expect("gid");
    IpAddr::V4(gid.ipv4().expect("an IPv4 GID (ROCEBUS_GUEST_ADDR)"))
}

fn config(group: &str, port: u16, extra: &str) -> McastConfig {
    McastConfig::from_toml_str(&format!(
        r#"
max_datagram_payload = 1024
history_depth = 4096
heartbeat_interval_ns = 1000000

[batching]
max_messages = 8
flush_interval_ns = 0

[recovery]
timeout_ns = 100000000
max_retries = 20
snapshot_timeout_ns = 2000000000

[auth]
secret = "{SECRET}"

{extra}

[[channels]]
id = {CHANNEL}
name = "adversary"
line_a = "{group}"
port = {port}
qkey = 0x2a2a2a2a
"#
    ))
    .expect("test config")
}

/// A snapshot of nothing (the publisher here only needs to serve one).
struct Empty(u64);

impl Snapshot for Empty {
    fn snapshot_seq(&self) -> u64 {
        self.0
    }
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[7u8; 20_000]);
    }
}

fn msg(seq: u64) -> [u8; 16] {
    let mut m = [0u8; 16];
    m[..8].copy_from_slice(&seq.to_le_bytes());
    m[8..].copy_from_slice(&(seq.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    m
}

/// Publishes `total` messages (one per `every`) once `wait_for` recovery
/// connections are open, then serves until `stop`. Returns the publisher.
fn publisher_thread(
    cfg: McastConfig,
    ip: IpAddr,
    total: u64,
    every: Duration,
    wait_for: usize,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<McastPublisher> {
    thread::spawn(move || {
        let mut p = McastPublisher::new(&cfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
        let t0 = Instant::now();
        let mut snap = Empty(0);
        while p.connections() < wait_for {
            assert!(t0.elapsed() < Duration::from_secs(30), "no subscriber");
            p.poll(Mono::now(), &snap).expect("publisher poll");
        }
        let mut seq = 1;
        let mut next = Instant::now();
        // ORDERING: Acquire pairs with the Release at the end of each test.
        while !stop.load(Ordering::Acquire) {
            if seq <= total && Instant::now() >= next {
                p.offer(Mono::now(), &msg(seq)).expect("publish");
                p.flush(Mono::now()).expect("flush");
                snap.0 = seq;
                seq += 1;
                next += every;
            }
            p.poll(Mono::now(), &snap).expect("publisher poll");
            assert!(t0.elapsed() < Duration::from_secs(120), "test never ended");
        }
        p
    })
}

/// Subscribes (retrying while the publisher comes up).
fn subscribe(cfg: &McastConfig, ip: IpAddr) -> McastSubscriber {
    let t0 = Instant::now();
    loop {
        match McastSubscriber::connect(cfg, CHANNEL, ip, ip) {
            Ok(s) => return s,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(30), "subscriber: {e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// What a subscriber delivered: every message must be the real one, in order.
#[derive(Default)]
struct Delivered {
    last: u64,
    wrong: u64,
}

impl rocebus::mcast::Handler for Delivered {
    fn on_message(&mut self, seq: u64, m: &[u8]) {
        if seq != self.last + 1 || m != msg(seq) {
            self.wrong += 1;
        }
        self.last = seq;
    }
}

impl rocebus::mcast::SnapshotSink for Delivered {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _: &[u8]) -> Result<(), rocebus::mcast::RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, seq: u64) -> Result<(), rocebus::mcast::RestoreError> {
        self.last = seq;
        Ok(())
    }
}

/// A raw UD queue pair joined to `group`, sending whatever it is given.
struct Forger {
    ud: PooledQp,
    ah: rocebus::verbs::AddressHandle,
    qpn: u32,
    qkey: u32,
    _m: McastMembership,
}

impl Forger {
    fn new(ip: IpAddr, group: IpAddr, qkey: u32) -> Forger {
        let ctx = Context::open_for_ip(ip).expect("device");
        let pd = ProtectionDomain::new(&ctx).expect("pd");
        let m = McastMembership::join(ip, group, false, TIMEOUT).expect("join");
        let ud = PooledQp::new(
            &pd,
            QpType::Ud,
            PoolConfig {
                recv_slots: 0,
                recv_len: 0,
                recv_batch: 1,
                recv_low_water: 0,
                send_slots: 64,
                send_len: 1024,
                signal_every: 1,
                dests_per_send: 1,
                max_inline: 0,
            },
        )
        .expect("ud qp");
        ud.qp().activate_ud(m.port_num(), qkey, 0).expect("rts");
        Forger {
            ah: m
                .address_handle(&pd, &rocebus::verbs::UdClass::default())
                .expect("ah"),
            qpn: m.remote_qpn(),
            qkey,
            ud,
            _m: m,
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        let dest = [Dest::Ud {
            ah: &self.ah,
            qpn: self.qpn,
            qkey: self.qkey,
        }];
        // A loaded emulator completes sends late: wait for a free slot.
        let t0 = Instant::now();
        while !self.ud.send(bytes, &dest).expect("send") {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "send queue full for 5 s"
            );
            self.ud.reclaim().expect("reclaim");
        }
        self.ud.reclaim().expect("reclaim");
    }
}

/// A datagram of `session` starting at `first` carrying `body` as one message.
fn datagram(session: u64, first: u64, body: &[u8]) -> Vec<u8> {
    let mut d = vec![0u8; DATAGRAM_HEADER_LEN + 2 + body.len()];
    write_datagram_header(&mut d, Line::A, CHANNEL, session, first, 1).unwrap();
    d[DATAGRAM_HEADER_LEN..DATAGRAM_HEADER_LEN + 2]
        .copy_from_slice(&(body.len() as u16).to_le_bytes());
    d[DATAGRAM_HEADER_LEN + 2..].copy_from_slice(body);
    d
}

/// Forged datagrams from a raw UD queue pair joined to the group with the
/// channel's qkey: a datagram of session u64::MAX (which used to make the
/// subscriber adopt it and drop every real datagram), datagrams of the real
/// session at the next sequences carrying a halt lift ('T') and a moved BBO,
/// a heartbeat announcing a sequence far ahead, and junk. All are dropped
/// before parsing (not from the publisher's queue pair), counted, and the
/// real stream is delivered complete, in order, with no resync.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_forged_datagrams_from_a_raw_ud_qp_are_dropped() {
    let ip = local_ip();
    let cfg = config("239.9.1.1", 7901, "");
    let stop = Arc::new(AtomicBool::new(false));
    const TOTAL: u64 = 600;
    let publisher = publisher_thread(
        cfg.clone(),
        ip,
        TOTAL,
        Duration::from_micros(500),
        1,
        stop.clone(),
    );
    let mut s = subscribe(&cfg, ip);
    let session = s.state().session();
    assert_ne!(session, 0, "the session is announced at connect");
    let mut forger = Forger::new(ip, "239.9.1.1".parse().unwrap(), 0x2a2a_2a2a);
    let mut app = Delivered::default();
    let mut events = Vec::new();
    let mut forged = 0u64;
    let t0 = Instant::now();
    let mut valid = 0;
    // One forgery per poll while the stream goes on (and after it, until all
    // 200 are sent: a subscriber held off its vCPU takes the stream in a few
    // large polls, CI 12-07).
    while app.last < TOTAL || forged < 200 {
        valid += s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        while let Some(ev) = s.poll_event() {
            events.push(ev);
        }
        if forged < 200 && (app.last > forged || app.last >= TOTAL) {
            let next = s.state().next_seq();
            let d = match forged % 5 {
                0 => datagram(u64::MAX, 1, b"session hijack"),
                1 => datagram(session, next, b"H    AAPL T halt lifted"),
                2 => datagram(session, next, b"Q AAPL bid 1 ask 1000000"),
                3 => {
                    let mut hb = vec![0u8; DATAGRAM_HEADER_LEN];
                    write_datagram_header(&mut hb, Line::A, CHANNEL, session, next + 1_000_000, 0)
                        .unwrap();
                    hb
                }
                _ => vec![0x5a; 333],
            };
            forger.send(&d);
            forged += 1;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "delivered up to {}: {:?} {:?} {events:?}",
            app.last,
            s.counters(),
            s.io_stats()
        );
    }
    // Let the last forgeries arrive and be counted.
    let t1 = Instant::now();
    while s.io_stats().foreign_source_dropped < forged && t1.elapsed() < Duration::from_secs(10) {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
    }
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let (c, io) = (s.counters(), s.io_stats());
    eprintln!("forged {forged}: {c:?} {io:?} {events:?}");
    assert_eq!(forged, 200);
    assert_eq!(app.wrong, 0, "a forged message was delivered");
    assert_eq!(app.last, TOTAL);
    assert_eq!(io.foreign_source_dropped, forged, "every forgery counted");
    assert_eq!(c.wrong_session_dropped, 0);
    assert_eq!(c.malformed_dropped, 0, "junk is dropped before parsing");
    assert_eq!((c.session_changes, c.unrecoverable), (0, 0));
    assert_eq!(c.delivered, TOTAL);
    assert_eq!(s.state().session(), session);
    assert_eq!(s.state().session(), p.state().session());
    assert_eq!(s.state().phase(), Phase::Live);
    assert!(events.is_empty(), "no resync, no loss: {events:?}");
    // Only the publisher's datagrams (and recovery messages, when a real loss was
    // repaired: `poll` counts both) counted as a sign of life.
    assert!(
        valid as u64 <= io.datagrams_a - io.foreign_source_dropped + io.recovery_messages,
        "{valid} counted as valid"
    );
}

/// Issue 41: a stranger on the fabric forging bus heartbeats, with an
/// attacker that is not rocebus (`tests/attackers/bus_forge.py`: raw IP
/// sockets and rdma-core's pyverbs). It sniffs the channel's group as any
/// host on the fabric can, learning the publisher's address and queue pair,
/// the Q_Key, the session and where the stream is, then every 20 ms sends,
/// in turn: a heartbeat of the real session claiming next + 1,000,000 and
/// one claiming next + 20, both as hand-built RoCE v2 packets carrying the
/// publisher's IP address and source QP (what a host that can forge its
/// source sends: they pass the subscriber's source filter), and a heartbeat
/// at next + 1,000,000 posted on a UD queue pair of its own (pyverbs; what
/// any host sends without forging). The publisher publishes a message every
/// millisecond meanwhile, then goes quiet (heartbeats only) for 1.5 s of
/// forgeries and 3 s more, then resumes. The subscriber delivers every real
/// message, in order, with no loss, no resync and no skipped gap, and no
/// request left open: the far-ahead forgeries from the publisher's source
/// are held as unconfirmed claims (`claimed`, `claims_disproved`; logged at
/// counts 1, 2, 4, ...) and disproved by the next real datagram or
/// heartbeat, never accepted; those from the attacker's own queue pair are
/// dropped before parsing (`foreign_source_dropped`); the slightly-ahead ones
/// are within `recovery.claim_threshold`, a hole like any: on the live stream
/// real messages fill it, on the quiet one the publisher answers that it was
/// never published (`not_yet_published`) and it is forgotten. Without the
/// claim rule the far-ahead heartbeat opens a hole of a million messages the
/// publisher never sent: declared lost, and the subscriber re-synchronises.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_forged_bus_heartbeats_from_a_pyverbs_stranger_lose_no_message() {
    const GROUP: &str = "239.9.1.7";
    let ip = local_ip();
    let cfg = config(GROUP, 7907, "");
    assert_eq!(cfg.recovery.claim_threshold, 4096, "near (20) is within it");
    assert!(!cfg.auth.datagram_tag, "claims apply to untagged datagrams");
    let publishing = Arc::new(AtomicBool::new(true));
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let publisher = {
        let (cfg, publishing, stop, published) = (
            cfg.clone(),
            publishing.clone(),
            stop.clone(),
            published.clone(),
        );
        thread::spawn(move || {
            let mut p = McastPublisher::new(&cfg, CHANNEL, now_ns() + 1, ip).expect("publisher");
            let t0 = Instant::now();
            let mut snap = Empty(0);
            while p.connections() < 1 {
                assert!(t0.elapsed() < Duration::from_secs(30), "no subscriber");
                p.poll(Mono::now(), &snap).expect("publisher poll");
            }
            let mut next = Instant::now();
            // ORDERING: Acquire pairs with the test's Release stores: once
            // publishing is seen false, `published` is final.
            while !stop.load(Ordering::Acquire) {
                if publishing.load(Ordering::Acquire) && Instant::now() >= next {
                    let seq = snap.0 + 1;
                    p.offer(Mono::now(), &msg(seq)).expect("publish");
                    p.flush(Mono::now()).expect("flush");
                    snap.0 = seq;
                    // ORDERING: Release pairs with the test's Acquire load
                    // once publishing has stopped.
                    published.store(seq, Ordering::Release);
                    next += Duration::from_millis(1);
                }
                p.poll(Mono::now(), &snap).expect("publisher poll");
                assert!(t0.elapsed() < Duration::from_secs(300), "test never ended");
            }
            p
        })
    };
    let mut s = subscribe(&cfg, ip);
    let session = s.state().session();
    let attacker = common::PyAttacker::start(
        "bus_forge.py",
        &[
            "--group".into(),
            GROUP.into(),
            "--channel".into(),
            CHANNEL.to_string(),
        ],
    );
    let mut app = Delivered::default();
    let mut events = Vec::new();
    let t0 = Instant::now();
    // Forge for 180 forgeries (60 of each kind, 3.6 s at 20 ms): the
    // subscriber's unanswered requests would be given up after 20 retries
    // of 100 ms.
    loop {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        while let Some(ev) = s.poll_event() {
            events.push(ev);
        }
        if let Some(l) = attacker.try_line() {
            eprintln!("attacker: {l}");
            if l == "progress 180" {
                break;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the attacker never got going; delivered up to {}: {:?} {:?} {events:?}",
            app.last,
            s.counters(),
            s.io_stats()
        );
    }
    // The stream goes quiet (the publisher only sends heartbeats) while the
    // attacker goes on for 1.5 s: its slightly-ahead forgeries now open
    // holes no real message will fill.
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    publishing.store(false, Ordering::Release);
    let mut poll_for = |s: &mut McastSubscriber, app: &mut Delivered, d: Duration| {
        let t = Instant::now();
        while t.elapsed() < d {
            s.poll(Mono::now(), app, 64).expect("subscriber poll");
            while let Some(ev) = s.poll_event() {
                events.push(ev);
            }
        }
    };
    poll_for(&mut s, &mut app, Duration::from_millis(1500));
    // The attacker stops (in a thread: the subscriber keeps polling).
    let stopper = thread::spawn(move || attacker.stop());
    let t1 = Instant::now();
    while !stopper.is_finished() {
        poll_for(&mut s, &mut app, Duration::from_millis(10));
        assert!(
            t1.elapsed() < Duration::from_secs(90),
            "the attacker never stopped"
        );
    }
    let report = stopper.join().expect("the attacker's report");
    eprintln!("bus_forge.py: {report}");
    // Longer than the subscriber's 20 retries of 100 ms: a hole it kept
    // asking for would have been declared lost by now.
    poll_for(&mut s, &mut app, Duration::from_secs(3));
    // The stream resumes: the real messages of the sequences the forgeries
    // claimed come now, and are delivered.
    // ORDERING: Acquire pairs with the publisher's Release store.
    let quiet_at = published.load(Ordering::Acquire);
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    publishing.store(true, Ordering::Release);
    let t1 = Instant::now();
    // ORDERING: Acquire pairs with the publisher's Release store.
    while published.load(Ordering::Acquire) < quiet_at + 200 {
        poll_for(&mut s, &mut app, Duration::from_millis(1));
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "the stream never resumed"
        );
    }
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    publishing.store(false, Ordering::Release);
    poll_for(&mut s, &mut app, Duration::from_millis(50));
    // ORDERING: Acquire pairs with the publisher's Release store; 50 ms
    // after `publishing` went false the publisher has seen it.
    let total = published.load(Ordering::Acquire);
    let t1 = Instant::now();
    while app.last < total {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        while let Some(ev) = s.poll_event() {
            events.push(ev);
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "delivered up to {} of {total}: {:?} {:?} {events:?}",
            app.last,
            s.counters(),
            s.io_stats()
        );
    }
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let (c, io) = (s.counters(), s.io_stats());
    eprintln!("published {total}: {c:?} {io:?} {events:?}");
    let n = |v: &serde_json::Value| v.as_u64().expect("a count");
    assert_eq!(report["errors"], serde_json::json!([]), "{report}");
    assert_eq!(n(&report["sniffed"]["session"]), session, "{report}");
    assert_eq!(n(&report["sniffed"]["qkey"]), 0x2a2a_2a2a, "{report}");
    for kind in ["spoofed_far", "spoofed_near", "stranger"] {
        assert!(n(&report["sent"][kind]) >= 55, "{kind}: {report}");
    }
    // Every real message, in order, nothing forged, nothing lost.
    assert_eq!(
        app.wrong, 0,
        "a message out of order or not the publisher's"
    );
    assert_eq!((app.last, c.delivered), (total, total));
    assert!(total > 1000, "the publisher published {total}");
    assert!(events.is_empty(), "no loss, no resync, no skip: {events:?}");
    assert_eq!(
        (c.unrecoverable, c.snapshots_applied, c.gaps_skipped),
        (0, 0, 0)
    );
    assert_eq!(s.state().phase(), Phase::Live);
    assert!(
        !s.state().expects_recovery(),
        "no hole left open: a request still waits for an answer"
    );
    assert_eq!(s.state().session(), p.state().session());
    // The far-ahead forgeries from the publisher's source: claims, each
    // disproved by the stream, none accepted.
    assert!(
        c.claimed >= n(&report["sent"]["spoofed_far"]) / 2,
        "the spoofed heartbeats reached the subscriber: {c:?}"
    );
    assert!(c.claims_disproved > 0, "{c:?}");
    assert_eq!(c.claims_accepted, 0, "{c:?}");
    // The slightly-ahead ones on the quiet stream: asked for, answered
    // never published by the publisher, forgotten.
    assert!(c.not_yet_published > 0, "{c:?}");
    // The attacker's own queue pair: dropped before parsing.
    assert!(
        io.foreign_source_dropped >= n(&report["sent"]["stranger"]) / 2,
        "{io:?}"
    );
    assert_eq!(c.wrong_session_dropped, 0);
}

/// The same with the tag option on and a forger that uses the publisher's
/// own source (here: a datagram whose tag is wrong arrives from the right
/// queue pair as far as the state machine knows). Datagrams carry tags, the
/// subscriber checks them, and the stream still goes through.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_tagged_datagrams_flow_and_mismatched_tag_setting_is_refused() {
    let ip = local_ip();
    let mut tagged = config("239.9.2.1", 7902, "");
    tagged.auth.datagram_tag = true;
    let stop = Arc::new(AtomicBool::new(false));
    const TOTAL: u64 = 300;
    let publisher = publisher_thread(
        tagged.clone(),
        ip,
        TOTAL,
        Duration::from_micros(300),
        1,
        stop.clone(),
    );
    let mut s = subscribe(&tagged, ip);
    // A subscriber without tags is refused at connect, with the reason.
    let mut untagged = tagged.clone();
    untagged.auth.datagram_tag = false;
    match McastSubscriber::connect(&untagged, CHANNEL, ip, ip) {
        Err(e @ NetError::Verbs(_)) => eprintln!("refused as expected: {e}"),
        other => panic!("an untagged subscriber was admitted: {other:?}"),
    }
    let mut app = Delivered::default();
    let t0 = Instant::now();
    while app.last < TOTAL {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", s.counters());
    }
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let c = s.counters();
    assert_eq!((app.wrong, c.bad_tag_dropped, c.delivered), (0, 0, TOTAL));
    assert!(p.io_stats().connections_refused >= 1);
}

/// A raw recovery client: rdma_cm connection with our hello, its welcome.
struct RawClient {
    rc: PooledQp,
    conn: Connection,
    welcome: Vec<u8>,
}

fn raw_connect(
    ip: IpAddr,
    port: u16,
    hello: &[u8],
    post_receives: bool,
) -> Result<RawClient, String> {
    raw_connect_with(ip, port, hello, post_receives, &RcOptions::default())
}

fn raw_connect_with(
    ip: IpAddr,
    port: u16,
    hello: &[u8],
    post_receives: bool,
    opts: &RcOptions,
) -> Result<RawClient, String> {
    let ctx = Context::open_for_ip(ip).map_err(|e| e.to_string())?;
    let pd = ProtectionDomain::new(&ctx).map_err(|e| e.to_string())?;
    let mut rc = PooledQp::new(
        &pd,
        QpType::Rc,
        PoolConfig {
            recv_slots: if post_receives { 64 } else { 0 },
            recv_len: 4096,
            recv_batch: 8,
            recv_low_water: 0,
            send_slots: 256,
            send_len: 256,
            signal_every: 8,
            dests_per_send: 1,
            max_inline: 0,
        },
    )
    .map_err(|e| e.to_string())?;
    let resolved =
        cm::resolve(SocketAddr::new(ip, port), Some(ip), TIMEOUT).map_err(|e| e.to_string())?;
    let (conn, welcome) = resolved
        .connect(rc.qp(), opts, Access::LOCAL, hello, TIMEOUT)
        .map_err(|e| e.to_string())?;
    if post_receives {
        rc.post_receives().map_err(|e| e.to_string())?;
    }
    Ok(RawClient {
        rc,
        conn,
        welcome: welcome.to_vec(),
    })
}

impl RawClient {
    fn send(&mut self, bytes: &[u8]) -> bool {
        let ok = self.rc.send(bytes, &[Dest::Connected]).unwrap_or(false);
        let _ = self.rc.reclaim();
        ok
    }
    /// Messages received within `d`.
    fn received_within(&mut self, d: Duration) -> usize {
        let t = Instant::now();
        let mut n = 0;
        while t.elapsed() < d {
            match self.rc.poll_recv(|_| ()) {
                Ok(r) => n += r.received,
                Err(_) => break,
            }
        }
        n
    }
}

/// A hello with `initiator`'s nonce and first proof (the subscriber proves
/// first: without the proof the publisher answers nothing).
fn hello(initiator: &Initiator, flags: u8) -> Hello {
    let mut h = Hello {
        magic: wire::HELLO_MAGIC.into(),
        version: wire::VERSION,
        flags,
        channel: CHANNEL.into(),
        reserved: 0.into(),
        nonce: initiator.nonce(),
        proof: [0; 16],
    };
    h.proof = initiator.first_proof(&h.as_bytes()[..wire::HELLO_SIGNED_LEN], &[]);
    h
}

fn ctx_of(hello: &Hello, welcome: &Welcome) -> Vec<u8> {
    let mut ctx = hello.as_bytes().to_vec();
    ctx.extend_from_slice(&welcome.as_bytes()[..WELCOME_SIGNED_LEN]);
    ctx
}

fn proof_msg(tag: &[u8; 16]) -> [u8; AUTH_PROOF_LEN] {
    let mut m = [0u8; AUTH_PROOF_LEN];
    encode_auth_proof(&mut m, CHANNEL, tag).unwrap();
    m
}

fn request(session: u64, from_seq: u64, count: u64) -> Vec<u8> {
    let mut m = vec![0u8; RetransmitRequest::LEN];
    RetransmitRequest {
        channel: CHANNEL,
        session,
        from_seq,
        count,
    }
    .encode(&mut m)
    .unwrap();
    m
}

/// A captured handshake replayed from another connection fails: the
/// captured hello played again gets silence (no Welcome, no slot: the
/// replay guard, counted `connections_replayed`); a captured final proof
/// sent after another hello (one the publisher never answered) is refused,
/// as the publisher's nonce is fresh each time; nothing is served, the
/// connection is dropped and counted. So is a client that skips the proof,
/// one with the wrong secret, and one beyond the connection cap.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_replayed_recovery_handshake_fails() {
    let ip = local_ip();
    let port = 7903;
    let cfg = config(
        "239.9.3.1",
        port,
        "[recovery_server]\nmax_connections = 3\ncookie_when_pending = 2\nhandshake_timeout_ns = 2000000000\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = publisher_thread(
        cfg.clone(),
        ip,
        50,
        Duration::from_micros(100),
        0,
        stop.clone(),
    );
    let key = Key::derive(SECRET.as_bytes(), Purpose::Recovery);

    // The genuine client: its handshake is what the attacker captured.
    let genuine = Initiator::new(key.clone());
    let h = hello(&genuine, 0);
    let t0 = Instant::now();
    let mut a = loop {
        match raw_connect(ip, port, h.as_bytes(), true) {
            Ok(c) => break c,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(30), "{e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let (w, _) = Welcome::read_from_prefix(&a.welcome).expect("a welcome");
    let (captured_proof, _) = genuine
        .on_response(&w.nonce, &w.tag, &ctx_of(&h, &w))
        .expect("the publisher proves the secret");
    let session = w.session.get();
    thread::sleep(Duration::from_millis(50));
    assert!(a.send(&proof_msg(&captured_proof)));
    assert!(a.send(&request(session, 1, 10)));
    assert!(
        a.received_within(Duration::from_millis(500)) > 0,
        "the genuine client is served"
    );

    // The replay of the captured hello: silence, no Welcome.
    match raw_connect(ip, port, h.as_bytes(), true) {
        Err(e) => assert!(e.contains("without a reason"), "{e}"),
        Ok(c) => panic!("the replayed hello got a welcome: {:?}", &c.welcome[..]),
    }
    // The captured proof after another hello (one never answered before),
    // then a request.
    let other = hello(&Initiator::new(key.clone()), 0);
    let mut b = raw_connect(ip, port, other.as_bytes(), true).expect("another hello connects");
    let (w2, _) = Welcome::read_from_prefix(&b.welcome).expect("a welcome");
    assert_ne!(w2.nonce, w.nonce, "a fresh responder nonce");
    assert!(b.send(&proof_msg(&captured_proof)));
    assert!(b.send(&request(session, 1, 10)));
    assert_eq!(
        b.received_within(Duration::from_millis(500)),
        0,
        "nothing served to the replay"
    );
    assert!(
        b.conn.wait_disconnected(TIMEOUT).unwrap(),
        "the replay is dropped"
    );

    // No proof at all: the request is not served, the connection dropped.
    let mut c = raw_connect(
        ip,
        port,
        hello(&Initiator::new(key.clone()), 0).as_bytes(),
        true,
    )
    .expect("connects");
    assert!(c.send(&request(session, 1, 10)));
    assert_eq!(c.received_within(Duration::from_millis(300)), 0);
    assert!(c.conn.wait_disconnected(TIMEOUT).unwrap());

    // The wrong secret: the publisher does not answer it (a reject with no
    // private data: no Welcome, so no proof, session, QPN or GID).
    let mut wrong = cfg.clone();
    wrong.auth.secret = "guess".into();
    match McastSubscriber::connect(&wrong, CHANNEL, ip, ip) {
        Err(NetError::Verbs(VerbsError::ConnectionRejected { private_data, .. })) => {
            assert!(private_data.iter().all(|&b| b == 0), "{private_data:?}")
        }
        other => panic!("expected a silent reject for the wrong secret: {other:?}"),
    }
    // A raw stranger's hello (another key): the same silence.
    let stranger = Initiator::new(Key::derive(b"another secret", Purpose::Recovery));
    match raw_connect(ip, port, hello(&stranger, 0).as_bytes(), true) {
        // The reason the CM layer gives a reject whose private data is all zeros.
        Err(e) => assert!(e.contains("without a reason"), "{e}"),
        Ok(c) => panic!("a stranger got a welcome: {:?}", &c.welcome[..]),
    }
    // Its connection (established, then closed by the subscriber) is gone
    // from the publisher's count by the time the cap is tested.
    thread::sleep(Duration::from_millis(400));

    // The cap (3): the genuine one, two that never prove, then one refused
    // (the handshake timeout is 2 s so that, under emulation on a busy host,
    // the unproven two are still there when the third connects).
    let fresh = || hello(&Initiator::new(key.clone()), 0);
    let d1 = raw_connect(ip, port, fresh().as_bytes(), true).expect("below the cap");
    let d2 = raw_connect(ip, port, fresh().as_bytes(), true).expect("at the cap");
    let refused = raw_connect(ip, port, fresh().as_bytes(), true);
    assert!(refused.is_err(), "beyond the cap");
    // Unproven connections are dropped after handshake_timeout_ns.
    assert!(d1.conn.wait_disconnected(TIMEOUT).unwrap());
    assert!(d2.conn.wait_disconnected(TIMEOUT).unwrap());
    drop((b, c, d1, d2));
    thread::sleep(Duration::from_millis(100));

    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let io = p.io_stats();
    eprintln!("{io:?}");
    assert_eq!(
        io.auth_failures, 2,
        "the captured proof and the proofless client"
    );
    assert_eq!(
        p.recovery_server().counters().connections_replayed,
        1,
        "the replayed hello"
    );
    assert!(io.handshake_timeouts >= 2);
    // Beyond the cap: under load (2 in progress) it is asked for a cookie
    // first, which a replay cannot fold into its proof.
    assert!(io.connections_refused + io.cookies_sent >= 1);
    assert_eq!(
        io.retransmit_requests, 1,
        "only the genuine client was served"
    );
    assert_eq!(p.admitted_connections(), 1);
    drop(a);
}

/// Connects a raw recovery client from local address `src` to the port at
/// `dst` sending exactly `hello`, posting receives; the error as it came
/// (a reject's private data is what the publisher answered).
fn raw_connect_from(
    src: IpAddr,
    dst: IpAddr,
    port: u16,
    hello: &[u8],
) -> Result<RawClient, VerbsError> {
    let ctx = Context::open_for_ip(src)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut rc = PooledQp::new(
        &pd,
        QpType::Rc,
        PoolConfig {
            recv_slots: 8,
            recv_len: 4096,
            recv_batch: 8,
            recv_low_water: 0,
            send_slots: 8,
            send_len: 256,
            signal_every: 8,
            dests_per_send: 1,
            max_inline: 0,
        },
    )
    .expect("a queue pair");
    let resolved = cm::resolve(SocketAddr::new(dst, port), Some(src), TIMEOUT)?;
    let (conn, welcome) = resolved.connect(
        rc.qp(),
        &RcOptions::default(),
        Access::LOCAL,
        hello,
        TIMEOUT,
    )?;
    rc.post_receives().expect("receives");
    Ok(RawClient {
        rc,
        conn,
        welcome: welcome.to_vec(),
    })
}

/// What one replaying address got back.
#[derive(Debug, Default)]
struct ReplayTally {
    attempts: u64,
    /// Answered with a welcome (a slot held until the handshake timeout).
    welcomed: u64,
    /// Answered a cookie it cannot fold into the captured proof.
    cookied: u64,
    /// Refused with a reason (busy).
    refused: u64,
    /// Rejected with no private data at all (the replay guard).
    silenced: u64,
    other: u64,
}

/// Issue 41: a captured hello (a valid first proof of the secret), answered
/// once, played again five times from its own address and five times from
/// another, gets silence: a reject with no private data (no Welcome: no
/// proof, session, QPN or GID), no slot, counted `connections_replayed`,
/// before any cookie or cap (`admission::ReplayGuard`, as on the orders
/// listener, `recovery_server.request_max_age_ms`). A subscriber connects
/// meanwhile at once. Without the guard each replay was welcomed with the
/// publisher's proof and identity and held a slot until
/// `handshake_timeout_ns` (here 30 s: two would have filled the port's
/// three slots with the captured handshake's own).
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_a_replayed_hello_gets_silence_and_no_slot() {
    let ip = local_ip();
    let second = common::gid_stat::SecondAddress::add(ip, 126);
    let port = 7907;
    let cfg = config(
        "239.9.7.1",
        port,
        "[recovery_server]\nmax_connections = 3\nmax_pending_per_address = 2\ncookie_when_pending = 2\nhandshake_timeout_ns = 30000000000\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    let publisher = publisher_thread(
        cfg.clone(),
        ip,
        100,
        Duration::from_micros(500),
        0,
        stop.clone(),
    );
    let key = Key::derive(SECRET.as_bytes(), Purpose::Recovery);
    let captured = hello(&Initiator::new(key), 0);
    // Answered once (its client then never proves: it holds its slot).
    let t0 = Instant::now();
    let first = loop {
        match raw_connect_from(ip, ip, port, captured.as_bytes()) {
            Ok(c) => break c,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(30), "{e}");
                thread::sleep(Duration::from_millis(50));
            }
        }
    };
    Welcome::read_from_prefix(&first.welcome).expect("the genuine hello is welcomed");
    for (what, src) in [
        ("from its own address", ip),
        ("from another address", IpAddr::V4(second.0)),
    ] {
        for i in 0..5 {
            match raw_connect_from(src, ip, port, captured.as_bytes()) {
                Err(VerbsError::ConnectionRejected { private_data, .. }) => assert!(
                    private_data.iter().all(|&b| b == 0),
                    "{what}, replay {i}: the reject carried {private_data:?}"
                ),
                Err(e) => panic!("{what}, replay {i}: expected a silent reject, got {e}"),
                Ok(c) => panic!(
                    "{what}, replay {i}: welcomed ({:?}), it holds a slot",
                    &c.welcome[..]
                ),
            }
        }
    }
    // The replays hold nothing: a subscriber connects at once.
    let t = Instant::now();
    let mut sub = McastSubscriber::connect(&cfg, CHANNEL, ip, ip).expect("a subscriber");
    let took = t.elapsed();
    let mut app = Delivered::default();
    let t = Instant::now();
    while app.last < 100 {
        sub.poll(Mono::now(), &mut app, 64)
            .expect("subscriber poll");
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "stuck at {}: {:?}",
            app.last,
            sub.counters()
        );
    }
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let k = p.recovery_server().counters();
    eprintln!("subscriber in after {took:?}; {k:?}");
    assert_eq!(app.wrong, 0);
    assert_eq!(k.connections_replayed, 10, "{k:?}");
    assert_eq!(k.cookies_sent, 0, "a replay costs not even a cookie: {k:?}");
    assert_eq!(p.admitted_connections(), 1, "{k:?}");
    drop((first, second));
}

/// Issue 41: a captured hello (a valid first proof of the secret) replayed
/// from five addresses, as fast as they can, each connection held and never
/// proved, against a recovery port of 8 connections (2 per address, a
/// cookie from 4 in progress, a handshake time of 30 s so that the slow
/// emulated attackers keep what they take). The replays hold at most one
/// slot: the hello is answered once, and every replay after gets silence
/// (the replay guard); before the guard they held 4, every further one
/// answered a cookie bound to its address, which the replayer cannot fold
/// into the captured proof. A real subscriber at another address is
/// admitted within a third of one handshake time - the blocking
/// `McastSubscriber::connect` and the engine's non-blocking `new` + `poll`
/// alike - and recovers every message. With neither guard nor cookie
/// (fedf468, and the per-address cap alone) the replays, 5 x 2, held all 8
/// slots and the subscriber was refused "busy" (seen: the same test with
/// the cookie threshold set out of reach).
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_replays_of_a_captured_hello_from_many_addresses_never_keep_a_subscriber_out() {
    let ip = local_ip();
    let extra: Vec<common::gid_stat::SecondAddress> = (0..5)
        .map(|i| common::gid_stat::SecondAddress::add(ip, 120 + i))
        .collect();
    let port = 7906;
    let cfg = config(
        "239.9.6.1",
        port,
        "[recovery_server]\nmax_connections = 8\nmax_pending_per_address = 2\ncookie_when_pending = 4\nhandshake_timeout_ns = 30000000000\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    const TOTAL: u64 = 3000;
    let publisher = publisher_thread(
        cfg.clone(),
        ip,
        TOTAL,
        Duration::from_micros(1000),
        0,
        stop.clone(),
    );
    // The captured hello: what a genuine subscriber sends.
    let key = Key::derive(SECRET.as_bytes(), Purpose::Recovery);
    let captured = hello(&Initiator::new(key), 0).as_bytes().to_vec();
    let flood_stop = Arc::new(AtomicBool::new(false));
    // Replays the publisher decided on: welcomed, cookied or refused.
    let decided = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let welcomed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let floods: Vec<_> = extra
        .iter()
        .map(|a| {
            let (stop, decided, welcomed, captured) = (
                flood_stop.clone(),
                decided.clone(),
                welcomed.clone(),
                captured.clone(),
            );
            let src = IpAddr::V4(a.0);
            thread::spawn(move || {
                let mut held = Vec::new();
                let mut t = ReplayTally::default();
                // ORDERING: Relaxed for `stop`, `decided` and `welcomed`: a flag and
                // counts read for their own value; the results come back through join.
                while !stop.load(Ordering::Relaxed) {
                    t.attempts += 1;
                    match raw_connect_from(src, ip, port, &captured) {
                        Ok(c) => {
                            t.welcomed += 1;
                            welcomed.fetch_add(1, Ordering::Relaxed);
                            decided.fetch_add(1, Ordering::Relaxed);
                            held.push(c);
                        }
                        Err(VerbsError::ConnectionRejected { private_data, .. }) => {
                            if CookieReply::parse(&private_data).is_some() {
                                t.cookied += 1;
                            } else if private_data.iter().all(|&b| b == 0) {
                                t.silenced += 1;
                            } else {
                                t.refused += 1;
                            }
                            decided.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(_) => t.other += 1,
                    }
                    held.retain(|c: &RawClient| !c.conn.poll_disconnected().unwrap_or(true));
                }
                t
            })
        })
        .collect();
    // Until the replays hold what they can: 10 decided (there are 8 slots)
    // with one welcomed (the first).
    let t0 = Instant::now();
    while decided.load(Ordering::Relaxed) < 10 || welcomed.load(Ordering::Relaxed) < 1 {
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "the flood never got going"
        );
        thread::sleep(Duration::from_millis(10));
    }
    // A third of one handshake time: what the subscribers get to come in.
    const WITHIN: Duration = Duration::from_secs(10);
    // The blocking connect, retried while refused.
    let t = Instant::now();
    let mut tries = 0;
    let mut s = loop {
        tries += 1;
        match McastSubscriber::connect(&cfg, CHANNEL, ip, ip) {
            Ok(s) if t.elapsed() < WITHIN => break s,
            Ok(_) => panic!("the subscriber got in only after {:?}", t.elapsed()),
            Err(e) if t.elapsed() < WITHIN => {
                eprintln!("subscriber refused: {e}");
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!(
                "the subscriber was kept out for {:?} ({tries} tries): {e}",
                t.elapsed()
            ),
        }
    };
    let took = t.elapsed();
    eprintln!("the blocking subscriber got in after {took:?} ({tries} tries)");
    // The engine's way: never blocks, the link comes up in poll.
    let mut app2 = Delivered::default();
    let mut s2 = McastSubscriber::new(&cfg, CHANNEL, ip, ip).expect("a second subscriber");
    let t = Instant::now();
    while !s2.recovery_connected() {
        s2.poll(Mono::now(), &mut app2, 64).expect("poll");
        assert!(
            t.elapsed() < WITHIN,
            "the polled subscriber was kept out: {:?}",
            s2.io_stats()
        );
        // Five attackers share this guest's two vCPUs with the publisher:
        // leave them some (an engine's attackers are on other hosts).
        thread::sleep(Duration::from_micros(100));
    }
    let took2 = t.elapsed();
    let mut app = Delivered::default();
    let t = Instant::now();
    while app.last < TOTAL || app2.last < TOTAL {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        s2.poll(Mono::now(), &mut app2, 64)
            .expect("subscriber poll");
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "stuck at {} / {}: {:?} {:?}",
            app.last,
            app2.last,
            s.counters(),
            s2.counters()
        );
    }
    // ORDERING: Relaxed, see the flood threads.
    flood_stop.store(true, Ordering::Relaxed);
    let tallies: Vec<ReplayTally> = floods.into_iter().map(|h| h.join().unwrap()).collect();
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let io = p.io_stats();
    eprintln!(
        "subscriber in after {took:?} ({tries} tries), the polled one after {took2:?} ({:?}); replays: {tallies:#?}; {io:?}",
        s2.io_stats()
    );
    assert_eq!((app.wrong, app2.wrong), (0, 0));
    let k = p.recovery_server().counters();
    assert!(k.connections_replayed > 0, "replays get silence: {k:?}");
    assert_eq!(
        tallies.iter().map(|t| t.welcomed).sum::<u64>(),
        1,
        "the captured hello is answered once: {tallies:#?}"
    );
    for t in &tallies {
        assert!(t.silenced > 0, "{t:?}");
        assert_eq!(t.cookied + t.refused, 0, "{t:?}");
    }
    // The replays never proved: only the two subscribers were admitted.
    assert_eq!(p.admitted_connections(), 2, "{io:?}");
    drop(extra);
}

/// An admitted client that floods retransmit requests (each for the whole
/// history and more) and snapshot requests while never posting a receive:
/// its requests are capped and rate-limited, one snapshot serialisation
/// serves its repeats, and it is dropped in bounded time (RNR retries are
/// bounded, and stalled clients are dropped), while a healthy subscriber
/// keeps receiving every message in order.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test runs it in the soft-RoCE guest)"]
fn rdma_mdsec_flooding_client_that_never_receives_is_capped_and_dropped() {
    let ip = local_ip();
    let port = 7904;
    let cfg = config(
        "239.9.4.1",
        port,
        "[recovery_server]\nrequests_per_sec = 200\nrequest_burst = 20\nsnapshots_per_sec = 2\nsnapshot_burst = 2\nrnr_retry = 1\nstall_timeout_ns = 1000000000\nsnapshot_reuse_ns = 1000000000\n",
    );
    let stop = Arc::new(AtomicBool::new(false));
    const TOTAL: u64 = 3000;
    let publisher = publisher_thread(
        cfg.clone(),
        ip,
        TOTAL,
        Duration::from_micros(1000),
        1,
        stop.clone(),
    );
    let mut s = subscribe(&cfg, ip);
    let session = s.state().session();
    let key = Key::derive(SECRET.as_bytes(), Purpose::Recovery);

    let flood = thread::spawn(move || {
        let ini = Initiator::new(key);
        let h = hello(&ini, 0);
        // The longest RNR delay a receiver can ask for (491 ms): what an
        // attacker picks to hold each of our sends as long as it can.
        let opts = RcOptions {
            min_rnr_timer: 31,
            ..RcOptions::default()
        };
        let mut f =
            raw_connect_with(ip, port, h.as_bytes(), false, &opts).expect("the flooder connects");
        let (w, _) = Welcome::read_from_prefix(&f.welcome).expect("a welcome");
        let (proof, _) = ini
            .on_response(&w.nonce, &w.tag, &ctx_of(&h, &w))
            .expect("proof");
        assert!(f.send(&proof_msg(&proof)));
        let t0 = Instant::now();
        let mut snap = [0u8; wire::RECOVERY_HEADER_LEN];
        encode_snapshot_request(&mut snap, CHANNEL, session).unwrap();
        let (mut sent, mut dropped_after) = (0u64, None);
        // A burst first (the send ring holds 256), then a steady flood.
        for i in 0..96 {
            let m = if i % 8 == 7 {
                snap.to_vec()
            } else {
                request(session, 1, u64::MAX / 2)
            };
            if f.send(&m) {
                sent += 1;
            }
        }
        while t0.elapsed() < Duration::from_secs(15) {
            let m = if sent % 4 == 3 {
                snap.to_vec()
            } else {
                request(session, 1, u64::MAX / 2)
            };
            if f.send(&m) {
                sent += 1;
            }
            if f.conn.poll_disconnected().unwrap_or(true) {
                dropped_after = Some(t0.elapsed());
                break;
            }
            thread::sleep(Duration::from_micros(200));
        }
        (sent, dropped_after)
    });

    let mut app = Delivered::default();
    let t0 = Instant::now();
    while app.last < TOTAL {
        s.poll(Mono::now(), &mut app, 64).expect("subscriber poll");
        assert!(
            t0.elapsed() < Duration::from_secs(40),
            "healthy subscriber stuck at {}: {:?}",
            app.last,
            s.counters()
        );
    }
    let (sent, dropped_after) = flood.join().expect("flooder");
    // ORDERING: Release pairs with the Acquire in the publisher thread.
    stop.store(true, Ordering::Release);
    let p = publisher.join().expect("publisher thread");
    let io = p.io_stats();
    eprintln!(
        "flooder sent {sent}, dropped after {dropped_after:?}; {io:?}; {:?}",
        s.counters()
    );
    assert_eq!(app.wrong, 0);
    assert_eq!(s.counters().delivered, TOTAL);
    let dropped_after = dropped_after.expect("the flooder was never dropped");
    assert!(dropped_after < Duration::from_secs(10), "{dropped_after:?}");
    assert_eq!(io.clients_stalled, 1);
    assert!(io.requests_rate_limited > 0, "requests rate-limited");
    assert!(io.requests_clamped > 0, "requests clamped");
    assert!(
        io.snapshots_built <= 2,
        "one serialisation serves the repeats"
    );
    assert_eq!(
        p.admitted_connections(),
        1,
        "only the healthy subscriber is left"
    );
    assert!(io.snapshots_rate_limited > 0, "snapshots rate-limited");
    assert!(!matches!(
        s.poll_event(),
        Some(Event::UnrecoverableLoss { .. })
    ));
}
