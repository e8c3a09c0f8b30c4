//! Liveness and "never blocks" of the gateway service, on a real RDMA device (soft-RoCE in
//! the project's guests; `cargo xtask test` runs them, a plain `cargo test` reports them
//! ignored):
//!
//! - a healthy engine's round trips stay within 2x of their normal p99 while the venue
//!   drops every SYN, engines stall in mid-handshake and the feed handler does not answer;
//! - connect requests beyond `max_pending_connections` are rejected;
//! - an engine whose gateway froze gets an error within its gateway timeout;
//! - an engine that sends without reading is held by flow control (its requests left in
//!   its ring), not disconnected for a full backlog, and gets every answer once it reads;
//! - (two hosts) a frozen engine is disconnected after `engine_timeout`, its orders are
//!   cancelled at the venue, and it logs on again from a new process at once.
//!
//! Child processes are this test binary re-executed with `LIVENESS_CHILD` set.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use order_gateway::client::{Client, EngineSession, SessionError};
use order_gateway::driver::{FixDriver, VenueLink};
use order_gateway::journal::FsyncPolicy;
use order_gateway::market::{BusMarketData, MarketDataConfig, ReferenceSource};
use order_gateway::proto::{Response, Side, Symbol, PRICE_SCALE};
use order_gateway::service::{
    MarketDataInput, MarketEvent, Service, ServiceControl, ServiceOptions,
};
use order_gateway::sim::SimVenue;
use rocebus::auth::{Initiator, Key, Purpose};
use rocebus::counters::{AllocateCounter, CountersError};
use rocebus::idle::IdleStrategy;
use rocebus::mcast::config::McastConfig;
use rocebus::orders::{OfferError, OrdersConfig, OrdersError, PeerLost};
use rocebus::ring::frame::{ConnectHello, Hello, HELLO_MAGIC};
use rocebus::verbs::cm;
use rocebus::verbs::{
    Access, CompletionQueue, Context, ProtectionDomain, QpCaps, QpType, QueuePair, RcOptions,
};
use zerocopy::IntoBytes;

const CHILD_ENV: &str = "LIVENESS_CHILD";

/// A measured figure, on stderr past libtest's capture (the runner shows it).
macro_rules! report {
    ($($t:tt)*) => {{
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}
const TOKEN: &str = "liveness-test";
// Generous for a test machine whose guests' vCPUs can be starved for a second when the
// host is busy (an engine that cannot run is silent too).
const ENGINE_TIMEOUT: Duration = Duration::from_millis(3000);
const GATEWAY_TIMEOUT: Duration = Duration::from_millis(1000);

/// An engine's: its logon (set-up and answer) may take longer than a stalled handshake.
fn engine_cfg() -> OrdersConfig {
    OrdersConfig {
        connect_timeout_ms: 10_000,
        ..orders_cfg()
    }
}

fn orders_cfg() -> OrdersConfig {
    OrdersConfig {
        ring_size: 1 << 18,
        max_payload: 1024,
        token: TOKEN.into(),
        // A stalled handshake is given up after this long.
        connect_timeout_ms: 1500,
        ..OrdersConfig::default()
    }
}

fn opts(listen: SocketAddr, max_pending: usize) -> ServiceOptions {
    let [aapl, msft, rej] = symbols();
    ServiceOptions {
        listen,
        orders: orders_cfg(),
        core: None,
        idle: IdleStrategy::Backoff {
            max_spins: 1000,
            max_yields: 100,
            max_park_us: 50,
        },
        reconnect: Duration::from_millis(300),
        logon_timeout: Duration::from_secs(2),
        engine_timeout: ENGINE_TIMEOUT,
        heartbeat: Duration::from_millis(100),
        max_pending_connections: max_pending,
        control_socket: None,
        counters_file: false,
        static_prices: [aapl, msft, rej, Symbol::new("XXXX").unwrap()]
            .map(|s| (s, 100 * PRICE_SCALE))
            .to_vec(),
        max_response_backlog: 1 << 16,
    }
}

/// A gateway service on its own thread.
struct Gw {
    addr: SocketAddr,
    control: Arc<ServiceControl>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Gw {
    fn start<L: VenueLink + Send + 'static>(
        link: L,
        addr: SocketAddr,
        max_pending: usize,
        market: Box<dyn MarketDataInput + Send>,
    ) -> Gw {
        Gw::start_with(link, opts(addr, max_pending), market)
    }

    fn start_with<L: VenueLink + Send + 'static>(
        link: L,
        opts: ServiceOptions,
        mut market: Box<dyn MarketDataInput + Send>,
    ) -> Gw {
        let addr = opts.listen;
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .try_init();
        let control = ServiceControl::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let c = control.clone();
        let journal = scratch("liveness").join("gw.journal");
        let thread = std::thread::spawn(move || {
            let risk = risk_config();
            let driver =
                FixDriver::with_link(link, session_config(), &risk, &journal, FsyncPolicy::Never)
                    .unwrap();
            let mut service = Service::new(driver, &risk, opts, c).unwrap();
            ready_tx.send(()).unwrap();
            service.run(&mut *market).unwrap();
        });
        // Generous: on a loaded host (load 10, four builds beside it) setting up took 20 s.
        ready_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("service started");
        Gw {
            addr,
            control,
            thread: Some(thread),
        }
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn logon(addr: SocketAddr, first_id: u64) -> Result<EngineSession, SessionError> {
    EngineSession::connect(&engine_cfg(), addr, ENGINE, ENGINE_TOKEN, first_id)
}

/// Connects, retrying while the gateway is not up yet (another process or host).
fn logon_retrying(addr: SocketAddr, first_id: u64, secs: u64) -> EngineSession {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match logon(addr, first_id) {
            Ok(s) => return s,
            Err(SessionError::Connect { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("logon: {e:?}"),
        }
    }
}

/// One order answered at once (the FIX session is down, or the symbol restricted): a
/// round trip through the service loop. Returns its duration.
fn round_trip(s: &mut EngineSession) -> Duration {
    let t = Instant::now();
    let id = loop {
        match s.new_order(
            ACCOUNT,
            Symbol::new("XXXX").unwrap(),
            Side::Buy,
            10,
            100 * PRICE_SCALE,
        ) {
            Ok(id) => break id,
            Err(OfferError::BackPressured) => {
                s.poll(|_| {}, 64).unwrap();
            }
            Err(e) => panic!("send: {e}"),
        }
    };
    s.flush().unwrap();
    let mut answered = false;
    while !answered {
        s.poll(
            |r| {
                if let Ok(Response::Reject(r)) = r {
                    answered |= r.cl_ord_id.get() == id;
                }
            },
            16,
        )
        .unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "order {id} never answered"
        );
    }
    t.elapsed()
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() * 99 / 100]
}

/// An engine that starts the RDMA handshake (its connect request, with a valid hello,
/// reaches the gateway, which answers) and then never completes it.
struct StalledHandshake {
    _connecting: cm::Connecting,
    _qp: QueuePair,
}

fn stall_handshake(gw: SocketAddr) -> StalledHandshake {
    let ctx = Context::open_for_ip(local_ip()).unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let cq = CompletionQueue::new(&ctx, 16).unwrap();
    let qp = QueuePair::new(
        &pd,
        QpType::Rc,
        &cq,
        &cq,
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
    )
    .unwrap();
    // A well-formed connect hello with a valid first proof of the token: the listener
    // answers it and then waits for the connection's confirmation (and the final proof)
    // that never come. (Without the proof it would be refused at once, silently.)
    let ini = Initiator::new(Key::derive(TOKEN.as_bytes(), Purpose::Orders));
    let mut hello = ConnectHello {
        hello: Hello {
            magic: HELLO_MAGIC.into(),
            ring_log2: 18.into(),
            flags: 0.into(),
            ring_addr: 0.into(),
            ring_rkey: 0.into(),
            max_payload: 1024.into(),
            conn_id: 0.into(),
        },
        nonce_tail: [0; 8],
        proof: [0; 16],
    };
    hello.set_nonce(&ini.nonce());
    hello.proof = ini.first_proof(hello.hello.as_bytes(), &[]);
    let mut c = cm::start_connect(gw, None, Duration::from_secs(60)).unwrap();
    let t = Instant::now();
    while !c.is_requested() {
        c = match c
            .poll(
                &qp,
                &RcOptions::default(),
                Access::REMOTE_WRITE,
                hello.as_bytes(),
            )
            .unwrap()
        {
            cm::ConnectProgress::Pending(c) => c,
            cm::ConnectProgress::Done(..) => panic!("the handshake completed"),
        };
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "route never resolved"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    StalledHandshake {
        _connecting: c,
        _qp: qp,
    }
}

/// A TCP port on the loopback that, once [`SynDropper::arm`]ed, drops every SYN (its
/// listener's accept queue is full): a venue that never answers a connect. Before, nothing
/// listens there and connects are refused at once.
struct SynDropper {
    port: u16,
    armed: Option<(rustix::fd::OwnedFd, Vec<TcpStream>)>,
}

impl SynDropper {
    fn new() -> SynDropper {
        SynDropper {
            port: free_port(),
            armed: None,
        }
    }

    fn arm(&mut self) {
        use rustix::net::{sockopt, AddressFamily, SocketType};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None).unwrap();
        sockopt::set_socket_reuseaddr(&fd, true).unwrap();
        let addr: SocketAddr = format!("127.0.0.1:{}", self.port).parse().unwrap();
        rustix::net::bind(&fd, &addr).unwrap();
        rustix::net::listen(&fd, 0).unwrap();
        let held = (0..2)
            .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok())
            .collect();
        self.armed = Some((fd, held));
    }
}

/// Market data switched on by the test: nothing until `on`, then a bus subscription to a
/// feed handler address that does not answer.
struct FeedWhenOn {
    on: Arc<AtomicBool>,
    cfg: Option<(MarketDataConfig, McastConfig)>,
    input: Option<BusMarketData>,
}

impl MarketDataInput for FeedWhenOn {
    fn poll(&mut self, sink: &mut dyn FnMut(MarketEvent)) -> usize {
        // ORDERING: Relaxed; a switch, no data published with it.
        if self.input.is_none() && self.on.load(Ordering::Relaxed) {
            if let Some((md, bus)) = self.cfg.take() {
                let mut input = BusMarketData::new(&md, bus);
                // What the gateway binary does at start; reconnects go the same way.
                input.start();
                self.input = Some(input);
            }
        }
        self.input.as_mut().map_or(0, |i| i.poll(sink))
    }

    fn register_counters(&mut self, _table: &dyn AllocateCounter) -> Result<(), CountersError> {
        Ok(())
    }
}

fn bus(port: u16) -> McastConfig {
    McastConfig::from_toml_str(&format!(
        r#"
max_datagram_payload = 1024
history_depth = 64
heartbeat_interval_ns = 1000000
[batching]
max_messages = 64
flush_interval_ns = 20000
[receive]
depth = 256
replenish_batch = 32
low_water = 64
[pacing]
max_datagrams_per_sec = 0
burst = 32
[recovery]
timeout_ns = 50000000
max_retries = 3
max_outstanding = 16
max_buffered = 256
snapshot_timeout_ns = 2000000000
rc_timeout = 12
[[channels]]
id = 1
name = "liveness"
line_a = "239.9.0.17"
port = {port}
"#
    ))
    .expect("bus config")
}

/// The loop serves a healthy engine as fast while three outside parties stall it as it
/// did before: a venue that drops every SYN (the old loop waited 2 s per connect), two
/// engines stalled in mid-handshake (up to connect_timeout_ms each) and a feed handler
/// that does not answer (up to 10 s per reconnect).
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test)"]
fn rc_live_service_never_waits_on_a_silent_venue_a_stalled_engine_or_a_down_feed() {
    const ROUND_TRIPS: usize = 1000;
    let mut venue = SynDropper::new();
    let on = Arc::new(AtomicBool::new(false));
    let ip = local_ip();
    // Nothing answers at this address of the guests' subnet.
    let dead_feed = match ip {
        IpAddr::V4(v4) => IpAddr::V4(std::net::Ipv4Addr::new(
            v4.octets()[0],
            v4.octets()[1],
            0,
            77,
        )),
        IpAddr::V6(_) => panic!("IPv4 guest address"),
    };
    let md = MarketDataConfig {
        config: PathBuf::from("unused: the bus config is given"),
        channels: vec![1],
        local: ip,
        publisher: dead_feed,
        reference: ReferenceSource::Midpoint,
        confirm_ms: 50,
        reconnect_ms: 200,
    };
    let market = FeedWhenOn {
        on: on.clone(),
        cfg: Some((md, bus(7491))),
        input: None,
    };
    let link = order_gateway::driver::TcpLink::new(&format!("127.0.0.1:{}", venue.port));
    let gw = Gw::start(link, SocketAddr::new(ip, 7490), 16, Box::new(market));
    let mut s = logon(gw.addr, 1).expect("logon");
    // Not what this test is about: a busy test host can starve the guest for a second.
    s.set_gateway_timeout(Duration::from_secs(10));
    for _ in 0..200 {
        round_trip(&mut s);
    }
    let normal: Vec<Duration> = (0..ROUND_TRIPS).map(|_| round_trip(&mut s)).collect();
    // Trouble everywhere at once.
    venue.arm();
    let stalled: Vec<StalledHandshake> = (0..2).map(|_| stall_handshake(gw.addr)).collect();
    // ORDERING: Relaxed; see FeedWhenOn::poll.
    on.store(true, Ordering::Relaxed);
    // Long enough for several venue connect attempts and handshake deadlines.
    let t = Instant::now();
    let mut troubled = Vec::with_capacity(ROUND_TRIPS * 4);
    while troubled.len() < ROUND_TRIPS || t.elapsed() < Duration::from_millis(2500) {
        troubled.push(round_trip(&mut s));
    }
    let took = t.elapsed();
    drop(stalled);
    let (p_normal, p_troubled) = (p99(normal.clone()), p99(troubled.clone()));
    let max = troubled.iter().max().copied().unwrap_or_default();
    report!(
        "round trip p99: normal {p_normal:?}, troubled {p_troubled:?} (ratio {:.2}, max {max:?}, \
         {} in {took:?})",
        p_troubled.as_secs_f64() / p_normal.as_secs_f64(),
        troubled.len()
    );
    // Within 2x of the normal p99, the normal one taken as at least 100 ms: on a test host
    // so loaded that round trips take tens of milliseconds (seen: p99 64 ms and 131 ms in
    // two runs), that p99 is the host's noise, not the loop's. The old loop blocked for the
    // whole of each 2 s venue connect, 1.5 s handshake and 10 s feed connect: its p99 here
    // was seconds.
    let floor = p_normal.max(Duration::from_millis(100));
    assert!(
        p_troubled <= 2 * floor,
        "p99 {p_troubled:?} under trouble, {p_normal:?} normally"
    );
    // No bound on the maximum: on a busy test host a guest's vCPU is sometimes starved for
    // a good part of a second, in either phase; the p99 ratio is the measure.
}

/// Connections in their handshake count against `max_pending_connections`; one more is
/// rejected at once, and once the stalled ones are given up a new engine gets in. (With a
/// cap of 2 the listener lets one address hold only 1 handshake (rocebus::admission), so
/// here, all from one address, the second stall and the logon meet the per-address cap.)
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test)"]
fn rc_live_pending_connections_beyond_the_cap_are_rejected() {
    let gw = Gw::start(
        SimVenue::new(),
        SocketAddr::new(local_ip(), 7492),
        2,
        Box::new(order_gateway::service::NoMarketData),
    );
    let stalled: Vec<StalledHandshake> = (0..2).map(|_| stall_handshake(gw.addr)).collect();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    match logon(gw.addr, 1) {
        Err(SessionError::Connect { source, .. }) => report!("third connect refused: {source}"),
        Ok(_) => panic!("a third pending connection was let in past the cap of 2"),
        Err(e) => panic!("unexpected: {e:?}"),
    }
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "the rejection took {:?}",
        t.elapsed()
    );
    drop(stalled);
    // The stalled handshakes are given up after connect_timeout_ms (1.5 s); then there is room.
    let mut s = logon_retrying(gw.addr, 1, 10);
    s.set_gateway_timeout(Duration::from_secs(10));
    round_trip(&mut s);
}

/// Flow control through the service: an engine sends orders the gateway answers at once
/// (rejects) and reads nothing. Its receive ring fills, then its backlog reaches half the
/// 64-response cap and the gateway stops taking its requests: its own ring to the gateway
/// fills and stays full (the engine is held). Once it reads, every order is answered, on
/// the same connection. Without flow control (checked: the service polling 64 frames
/// whatever waits) the gateway takes every request, the 65th waiting answer disconnects the
/// engine for a full backlog, and the engine finds its connection lost when it reads
/// ("poll after 64 of 4093 answers: connection lost").
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test)"]
fn rc_live_an_engine_sending_without_reading_is_held_not_disconnected() {
    let mut o = opts(SocketAddr::new(local_ip(), 7494), 16);
    o.max_response_backlog = 64;
    let gw = Gw::start_with(
        SimVenue::new(),
        o,
        Box::new(order_gateway::service::NoMarketData),
    );
    let mut s = logon_retrying(gw.addr, 1, 10);
    s.set_gateway_timeout(Duration::from_secs(10));
    let sym = Symbol::new("XXXX").unwrap();
    let (mut sent, mut refused_since) = (0usize, None::<Instant>);
    let t = Instant::now();
    // Send, never read, until the gateway has taken nothing for 300 ms (well within its
    // 3 s silence limit, which still runs for a held engine that reads nothing).
    loop {
        match s.new_order(ACCOUNT, sym, Side::Buy, 10, 100 * PRICE_SCALE) {
            Ok(_) => {
                sent += 1;
                refused_since = None;
                if sent % 64 == 0 {
                    s.flush()
                        .unwrap_or_else(|e| panic!("flush after {sent}: {e}"));
                }
            }
            Err(OfferError::BackPressured) => {
                s.flush()
                    .unwrap_or_else(|e| panic!("flush after {sent}: {e}"));
                let since = *refused_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(300) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("send after {sent} orders, reading none: {e}"),
        }
        // What a held engine can have sent: its ring to the gateway full, the gateway's ring
        // to it full of answers, and the half-cap backlog; every frame is at least 32 bytes.
        // A count, not a time: on a loaded CI host the filling itself took over 2 s (6,143
        // orders, stop 50), while a gateway without flow control takes without end.
        let most = 2 * (orders_cfg().ring_size / 32) + 64;
        assert!(
            sent <= most && t.elapsed() < Duration::from_secs(60),
            "the gateway kept taking requests ({sent} in {:?}, at most {most} can wait) from \
             an engine reading nothing",
            t.elapsed()
        );
    }
    report!(
        "held after {sent} orders sent without reading, in {:?}",
        t.elapsed()
    );
    // Now it reads: every order answered, the connection kept.
    let mut answered = 0usize;
    let t = Instant::now();
    while answered < sent {
        s.poll(
            |r| {
                if let Ok(Response::Reject(_)) = r {
                    answered += 1;
                }
            },
            256,
        )
        .unwrap_or_else(|e| panic!("poll after {answered} of {sent} answers: {e}"));
        s.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{answered} of {sent} answered"
        );
    }
    round_trip(&mut s);
}

/// The gateway process freezes (SIGSTOP, as a dead host would: no disconnect ever comes):
/// the engine gets an error within its gateway timeout, then refuses orders, instead of
/// committing them for as long as RC retries last.
#[test]
#[ignore = "rdma: needs an RDMA device (cargo xtask test)"]
fn rc_live_engine_refuses_orders_within_gateway_timeout_of_a_frozen_gateway() {
    let port = 7493;
    let mut child = spawn_child(&format!("gateway {port}"));
    let mut s = logon_retrying(SocketAddr::new(local_ip(), port), 1, 30);
    s.set_gateway_timeout(GATEWAY_TIMEOUT);
    assert_eq!(s.heartbeat_interval(), Duration::from_millis(100));
    // A healthy gateway: quiet for several timeouts, the engine polling, nothing happens.
    let t = Instant::now();
    while t.elapsed() < 3 * GATEWAY_TIMEOUT {
        s.poll(|_| {}, 16).expect("a live gateway");
        s.flush().expect("a live gateway");
    }
    round_trip(&mut s);
    let _ = rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::STOP,
    );
    let stopped = Instant::now();
    let mut committed = 0u64;
    let err = loop {
        let [aapl, _, _] = symbols();
        match s.new_order(ACCOUNT, aapl, Side::Buy, 10, 100 * PRICE_SCALE) {
            Ok(_) => committed += 1,
            Err(OfferError::BackPressured) => {}
            Err(OfferError::PeerLost(l)) => break OrdersError::PeerLost(l),
            Err(e) => panic!("send: {e}"),
        }
        if let Err(e) = s.flush() {
            break OrdersError::PeerLost(match e {
                OfferError::PeerLost(l) => l,
                e => panic!("flush: {e}"),
            });
        }
        if let Err(e) = s.poll(|_| {}, 16) {
            break e;
        }
        std::thread::sleep(Duration::from_millis(1));
        assert!(
            stopped.elapsed() < Duration::from_secs(8),
            "no error {:?} after the gateway froze ({committed} orders committed)",
            stopped.elapsed()
        );
    };
    let after = stopped.elapsed();
    report!("engine error {after:?} after the gateway froze: {err} ({committed} orders committed meanwhile)");
    assert!(
        matches!(err, OrdersError::PeerLost(PeerLost::Silent)),
        "{err}"
    );
    assert!(s.gateway_silent());
    assert!(
        after < GATEWAY_TIMEOUT + Duration::from_millis(300),
        "detected after {after:?}"
    );
    // Refused from now on, with the reason.
    let [aapl, _, _] = symbols();
    assert_eq!(
        s.new_order(ACCOUNT, aapl, Side::Buy, 10, 100 * PRICE_SCALE)
            .unwrap_err(),
        OfferError::PeerLost(PeerLost::Silent)
    );
    let _ = child.kill();
    let _ = child.wait();
}

fn spawn_child(spec: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "child_liveness", "--nocapture"])
        .env(CHILD_ENV, spec)
        .stdout(Stdio::piped())
        .spawn()
        .expect("child process")
}

/// Waits for `word` on the child's stdout.
fn wait_for(child: &mut Child, word: &str) {
    let out = child.stdout.as_mut().expect("piped");
    let mut r = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "child ended before {word}"
        );
        // libtest prints "test NAME ... " before the output of a test it runs, on the same line.
        if line.trim().ends_with(word) {
            return;
        }
    }
}

/// The children: a gateway (`gateway PORT`), or an engine (`engine ADDR first|again`).
#[test]
#[ignore = "child: process of the liveness tests, run by them"]
fn child_liveness() {
    let spec = std::env::var(CHILD_ENV)
        .unwrap_or_else(|_| panic!("child process of the liveness tests: run with {CHILD_ENV}"));
    let parts: Vec<&str> = spec.split(' ').collect();
    match parts[..] {
        ["gateway", port] => {
            let _gw = Gw::start(
                SimVenue::new(),
                SocketAddr::new(local_ip(), port.parse().unwrap()),
                16,
                Box::new(order_gateway::service::NoMarketData),
            );
            println!("READY");
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        ["engine", addr, mode] => engine_child(addr.parse().unwrap(), mode),
        _ => panic!("bad {CHILD_ENV}: {spec}"),
    }
}

const RESTING: usize = 10;

/// `first`: logs on, rests RESTING orders at the venue, says ACKED, keeps polling (until
/// stopped). `again`: logs on at once (must be accepted), one order acknowledged, OK.
fn engine_child(addr: SocketAddr, mode: &str) {
    let [aapl, _, _] = symbols();
    let mut s = if mode == "first" {
        logon_retrying(addr, 1, 120)
    } else {
        match EngineSession::resume(&engine_cfg(), addr, ENGINE, ENGINE_TOKEN, Client::new(1000)) {
            Ok(s) => s,
            Err(e) => panic!("logon again: {:?}", e.error),
        }
    };
    let n = if mode == "first" { RESTING } else { 1 };
    let ids: Vec<u64> = (0..n)
        .map(|_| {
            // Quantity above 1000: the venue acks and rests them.
            s.new_order(ACCOUNT, aapl, Side::Buy, 2000, 100 * PRICE_SCALE)
                .expect("order")
        })
        .collect();
    s.flush().unwrap();
    let t = Instant::now();
    let mut rejects = Vec::new();
    while !ids.iter().all(|&id| {
        s.client().order(id).map(|o| o.state) == Some(order_gateway::client::OrderState::New)
    }) {
        s.poll(
            |r| {
                if let Ok(Response::Reject(x)) = r {
                    rejects.push(x.reason());
                }
            },
            64,
        )
        .expect("gateway");
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "orders not acknowledged ({mode}): rejects {rejects:?}"
        );
    }
    if mode == "first" {
        println!("ACKED");
        loop {
            let _ = s.poll(|_| {}, 64);
            let _ = s.flush();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    println!("OK");
}

/// Guest 1 runs the engine in a process it freezes (SIGSTOP) once its orders rest at the
/// venue of guest 0; the gateway there must cancel them within engine_timeout (plus
/// slack), and a new engine process must be let in at once (not `AlreadyConnected`).
#[test]
#[ignore = "rdma: needs two soft-RoCE guests and QuickFIX (cargo xtask test)"]
fn rc_live_two_hosts_frozen_engine_is_canceled_and_logs_on_again() {
    let idx = std::env::var("ROCEBUS_GUEST_INDEX").expect("run by cargo xtask test in two guests");
    let port = 7494;
    if idx == "1" {
        let peer: IpAddr = std::env::var("ROCEBUS_PEER_ADDR").unwrap().parse().unwrap();
        let gw = SocketAddr::new(peer, port);
        let mut first = spawn_child(&format!("engine {gw} first"));
        wait_for(&mut first, "ACKED");
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&first),
            rustix::process::Signal::STOP,
        )
        .unwrap();
        // Past the engine timeout, the gateway has let the frozen connection go.
        std::thread::sleep(ENGINE_TIMEOUT + Duration::from_millis(1500));
        let mut again = spawn_child(&format!("engine {gw} again"));
        wait_for(&mut again, "OK");
        assert!(again.wait().unwrap().success(), "second engine process");
        let _ = first.kill();
        let _ = first.wait();
        return;
    }
    let dir = scratch("liveness-2h");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let link = order_gateway::driver::TcpLink::new(&format!("127.0.0.1:{}", venue.port));
    let gw = Gw::start(
        link,
        SocketAddr::new(local_ip(), port),
        16,
        Box::new(order_gateway::service::NoMarketData),
    );
    let count = |ty: &str| venue.received().iter().filter(|l| l[0] == ty).count();
    let deadline = Instant::now() + Duration::from_secs(180);
    while count("D") < RESTING {
        assert!(Instant::now() < deadline, "the engine's orders never came");
        std::thread::sleep(Duration::from_millis(10));
    }
    let rested = Instant::now();
    while count("F") < RESTING {
        assert!(
            rested.elapsed() < Duration::from_secs(20),
            "venue got {} of {RESTING} cancels",
            count("F")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = rested.elapsed();
    report!("cancels at the venue {took:?} after the orders (engine_timeout {ENGINE_TIMEOUT:?})");
    // The orders rest, the engine is frozen right after its acks: cancels come after the
    // engine timeout, and not much later.
    assert!(
        took >= ENGINE_TIMEOUT - Duration::from_millis(100),
        "cancelled before the timeout: {took:?}"
    );
    assert!(
        took < ENGINE_TIMEOUT + Duration::from_secs(3),
        "cancelled {took:?} after"
    );
    // The new process's order.
    while count("D") < RESTING + 1 {
        assert!(
            Instant::now() < deadline,
            "the engine's new process never got its order through"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(count("F"), RESTING);
    // Let guest 1's engine read its ack before the gateway goes.
    std::thread::sleep(Duration::from_secs(2));
    drop(gw);
}
