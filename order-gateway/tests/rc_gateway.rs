//! Engines → gateway service over RC → QuickFIX venue → back over RC, on a real RDMA device
//! (soft-RoCE in the project's guest; `cargo xtask test` runs them, a plain `cargo test`
//! reports them ignored). The venue is `venue/venue.py` under the Python named by
//! `ROCEBUS_PYTHON` (see `common::python`), storing its state under the temp dir.

mod common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use order_gateway::client::{EngineSession, OrderState, SessionError};
use order_gateway::driver::FixDriver;
use order_gateway::gateway::{EngineId, GatewayCounters, OrderStatus};
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{LogonStatus, RejectReason, Side, Symbol, PRICE_SCALE};
use order_gateway::risk::RiskConfig;
use order_gateway::service::{MarketEvent, Service, ServiceControl, ServiceOptions};
use rocebus::idle::IdleStrategy;
use rocebus::orders::{OfferError, OrdersConfig};

const ENGINE2: u32 = 2;
/// An account engine 1 is not granted.
const OTHER_ACCOUNT: u32 = 8;

fn local_ip() -> IpAddr {
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return a;
    }
    let ctx = rocebus::verbs::Context::open(None).expect("an RDMA device");
    let i = ctx.default_gid_index(1).unwrap();
    IpAddr::V4(ctx.query_gid(1, i).unwrap().ipv4().expect("IPv4 GID"))
}

fn orders_cfg(token: &str) -> OrdersConfig {
    OrdersConfig {
        ring_size: 1 << 18,
        max_payload: 1024,
        token: token.into(),
        ..OrdersConfig::default()
    }
}

fn risk() -> RiskConfig {
    toml::from_str(&format!(
        r#"
        reference_max_age_ms = 3600000
        throttle_interval_ms = 1000
        restricted_symbols = ["XXXX"]
        [[accounts]]
        id = {ACCOUNT}
        max_order_qty = 100000
        max_order_notional = 100000000
        credit_limit = 1000000000000
        max_position = 1000000000
        max_open_orders = 100000
        max_orders_per_interval = 1000000
        collar_bps = 1000
        [[accounts]]
        id = {OTHER_ACCOUNT}
        max_order_qty = 100
        max_order_notional = 100000
        credit_limit = 1000000
        max_position = 1000
        max_open_orders = 10
        max_orders_per_interval = 10
        collar_bps = 1000
        [[engines]]
        id = {ENGINE}
        accounts = [{ACCOUNT}]
        [[engines]]
        id = {ENGINE2}
        accounts = [{ACCOUNT}, {OTHER_ACCOUNT}]
        "#
    ))
    .unwrap()
}

/// What the gateway looked like when its service stopped.
struct Snapshot {
    orders: HashMap<(EngineId, u64), (OrderStatus, u32)>,
    open: usize,
    positions: Vec<(Symbol, i64)>,
    counters: GatewayCounters,
}

/// A gateway service on its own thread.
struct Gw {
    addr: SocketAddr,
    control: Arc<ServiceControl>,
    market: mpsc::Sender<MarketEvent>,
    thread: Option<JoinHandle<Snapshot>>,
}

impl Gw {
    fn start(venue_port: u16, journal: &Path, port: u16) -> Gw {
        let addr = SocketAddr::new(local_ip(), port);
        let control = ServiceControl::new();
        let (ready_tx, ready_rx) = mpsc::channel();
        let (market, mut market_rx) = mpsc::channel();
        let (c, journal) = (control.clone(), journal.to_owned());
        let thread = std::thread::spawn(move || {
            let risk = risk();
            let driver = FixDriver::open_with(
                &format!("127.0.0.1:{venue_port}"),
                session_config(),
                &risk,
                &journal,
                FsyncPolicy::Never,
            )
            .unwrap();
            let [aapl, msft, rej] = symbols();
            let opts = ServiceOptions {
                listen: addr,
                orders: orders_cfg("rc-test"),
                core: None,
                // The guest has 2 vCPUs for gateway, engines and venue: back off when idle.
                idle: IdleStrategy::Backoff {
                    max_spins: 1000,
                    max_yields: 100,
                    max_park_us: 50,
                },
                reconnect: Duration::from_millis(500),
                logon_timeout: Duration::from_secs(2),
                counters_file: false,
                static_prices: vec![
                    (aapl, 100 * PRICE_SCALE),
                    (msft, 100 * PRICE_SCALE),
                    (rej, 100 * PRICE_SCALE),
                    (Symbol::new("XXXX").unwrap(), 100 * PRICE_SCALE),
                    (Symbol::new("HALTED").unwrap(), 100 * PRICE_SCALE),
                ],
            };
            let mut service = Service::new(driver, &risk, opts, c).unwrap();
            ready_tx.send(()).unwrap();
            service.run(&mut market_rx).unwrap();
            let gw = service.gateway();
            Snapshot {
                orders: gw
                    .orders()
                    .map(|(_, o)| ((o.engine, o.cl_ord_id), (o.status, o.cum_qty)))
                    .collect(),
                open: gw.open_order_count(),
                positions: symbols()
                    .iter()
                    .map(|&s| (s, gw.risk().position(ACCOUNT, s)))
                    .collect(),
                counters: gw.counters(),
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("service started");
        let gw = Gw {
            addr,
            control,
            market,
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !gw.control.is_fix_active() {
            assert!(
                Instant::now() < deadline,
                "FIX logon to the venue did not complete"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        gw
    }

    fn engine(&self, id: u32, first_order_id: u64) -> Engine {
        let s = EngineSession::connect(
            self.addr,
            &orders_cfg("rc-test"),
            id,
            first_order_id,
            Duration::from_secs(10),
        )
        .expect("engine logon");
        Engine {
            s,
            errors: Vec::new(),
            touched: Vec::with_capacity(256),
            cancels_sent: Default::default(),
        }
    }

    fn stop(mut self) -> Snapshot {
        self.control.stop();
        self.thread.take().unwrap().join().expect("service thread")
    }
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.control.stop();
    }
}

/// An engine over RC, with the checks the tests need.
struct Engine {
    s: EngineSession,
    errors: Vec<String>,
    touched: Vec<u64>,
    cancels_sent: std::collections::HashSet<u64>,
}

impl Engine {
    /// Reads responses; a second final answer shows up as `AlreadyFinal` in `errors`.
    fn pump(&mut self) -> usize {
        let (errors, touched) = (&mut self.errors, &mut self.touched);
        touched.clear();
        let n = self
            .s
            .poll(
                |r| match r {
                    Ok(resp) => touched.push(resp.cl_ord_id()),
                    Err(e) => errors.push(format!("{e:?}")),
                },
                256,
            )
            .expect("engine connection");
        if n == 0 {
            std::thread::yield_now();
        }
        n
    }

    fn send(&mut self, account: u32, sym: Symbol, side: Side, qty: u32, px: i64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.s.new_order(account, sym, side, qty, px * PRICE_SCALE) {
                Ok(id) => return id,
                Err(OfferError::BackPressured) => {
                    assert!(Instant::now() < deadline, "gateway never took the order");
                    self.pump();
                }
                Err(e) => panic!("send: {e}"),
            }
        }
    }

    /// Order `i` of the standard mix (as `common::Engine::send`).
    fn send_mix(&mut self, i: u64) -> u64 {
        let [aapl, msft, rej] = symbols();
        let (sym, qty) = match i % 10 {
            0..=4 => (aapl, 50),
            5..=8 => (msft, 300),
            _ if i % 20 == 9 => (rej, 10),
            _ => (aapl, 2000),
        };
        let side = if i % 2 == 0 { Side::Buy } else { Side::Sell };
        self.send(ACCOUNT, sym, side, qty, 100)
    }

    fn open(&self) -> usize {
        self.s
            .client()
            .orders()
            .filter(|(_, o)| !o.state.is_final())
            .count()
    }

    /// Cancels resting (acked, big, unfilled) orders not canceled yet.
    fn cancel_resting(&mut self) {
        let resting: Vec<u64> = self
            .s
            .client()
            .orders()
            .filter(|(id, o)| {
                o.state == OrderState::New && o.qty > 1000 && !self.cancels_sent.contains(id)
            })
            .map(|(id, _)| id)
            .collect();
        for id in resting {
            self.s.cancel(id).expect("cancel");
            self.cancels_sent.insert(id);
        }
        self.s.flush().expect("flush");
    }

    fn state(&self, id: u64) -> OrderState {
        self.s.client().order(id).expect("tracked").state
    }

    fn wait_final(&mut self, ids: &[u64], secs: u64) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !ids.iter().all(|&id| self.state(id).is_final()) {
            assert!(Instant::now() < deadline, "orders not answered in {secs} s");
            self.pump();
        }
    }
}

/// Two engines, 1,000 orders each, interleaved: every order gets exactly one final answer
/// over RC, the engines' books agree with the gateway's, the venue saw each order once.
#[test]
#[ignore = "rdma: needs an RDMA device and QuickFIX (cargo xtask test)"]
fn rc_two_engines_two_thousand_orders_each_answered_once() {
    const PER_ENGINE: u64 = 1000;
    let dir = scratch("rc-2k");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let gw = Gw::start(venue.port, &dir.join("gw.journal"), 7471);
    let mut engines = [gw.engine(ENGINE, 1), gw.engine(ENGINE2, 1)];
    let t = Instant::now();
    let deadline = t + Duration::from_secs(180);
    let sent = |e: &Engine| e.s.client().orders().count() as u64;
    while engines.iter().any(|e| e.open() > 0 || sent(e) < PER_ENGINE) {
        assert!(Instant::now() < deadline, "timed out");
        for e in &mut engines {
            // A window of outstanding orders, like an engine would keep.
            while sent(e) < PER_ENGINE && e.open() < 128 {
                let i = sent(e) + 1;
                e.send_mix(i);
            }
            e.s.flush().unwrap();
            e.pump();
            e.cancel_resting();
        }
    }
    eprintln!(
        "2 x {PER_ENGINE} orders over RC answered in {:?}",
        t.elapsed()
    );
    let snap = gw.stop();
    for (k, e) in engines.iter().enumerate() {
        let engine = [ENGINE, ENGINE2][k];
        assert!(
            e.errors.is_empty(),
            "engine {engine}: {:?}",
            &e.errors[..e.errors.len().min(5)]
        );
        assert_eq!(e.s.client().orders().count() as u64, PER_ENGINE);
        for (id, o) in e.s.client().orders() {
            let &(status, cum) = snap
                .orders
                .get(&(engine, id))
                .unwrap_or_else(|| panic!("gateway lost order {engine}/{id}"));
            assert_eq!(status, OrderStatus::Done, "{engine}/{id}");
            assert_eq!(cum, o.cum_qty, "cum qty of {engine}/{id}");
            assert!(
                matches!(
                    o.state,
                    OrderState::Filled
                        | OrderState::Canceled
                        | OrderState::Rejected(RejectReason::VenueReject)
                ),
                "{engine}/{id}: {:?}",
                o.state
            );
        }
    }
    assert_eq!(snap.open, 0);
    for (sym, pos) in snap.positions {
        let engines_pos: i64 = engines.iter().map(|e| e.s.client().position(sym)).sum();
        assert_eq!(pos, engines_pos, "position {sym}");
    }
    assert_eq!(snap.counters, GatewayCounters::default());
    let lines = venue.received();
    let mut seen = std::collections::HashSet::new();
    for l in lines.iter().filter(|l| l[0] == "D") {
        assert!(seen.insert(l[1].clone()), "venue executed {} twice", l[1]);
    }
    assert_eq!(seen.len() as u64, 2 * PER_ENGINE);
}

fn reason_of(e: &Engine, id: u64) -> RejectReason {
    match e.state(id) {
        OrderState::Rejected(r) => r,
        s => panic!("order {id} not rejected: {s:?}"),
    }
}

/// Risk rejects come back over RC with their reason codes; logons are checked.
#[test]
#[ignore = "rdma: needs an RDMA device and QuickFIX (cargo xtask test)"]
fn rc_risk_rejects_and_logon_checks() {
    let dir = scratch("rc-risk");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let gw = Gw::start(venue.port, &dir.join("gw.journal"), 7472);
    let mut e = gw.engine(ENGINE, 1);
    let [aapl, _, _] = symbols();
    let sym = |s| Symbol::new(s).unwrap();
    gw.market
        .send(MarketEvent::Halt {
            symbol: sym("HALTED"),
            halted: true,
        })
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let cases = [
        (
            e.send(ACCOUNT, aapl, Side::Buy, 10, 150),
            RejectReason::PriceCollar,
        ),
        (
            e.send(ACCOUNT, aapl, Side::Buy, 200_000, 100),
            RejectReason::MaxQuantity,
        ),
        (
            e.send(OTHER_ACCOUNT, aapl, Side::Buy, 10, 100),
            RejectReason::AccountNotGranted,
        ),
        (
            e.send(ACCOUNT, sym("XXXX"), Side::Buy, 10, 100),
            RejectReason::RestrictedSymbol,
        ),
        (
            e.send(ACCOUNT, sym("HALTED"), Side::Buy, 10, 100),
            RejectReason::Halted,
        ),
        (
            e.send(ACCOUNT, sym("NOREF"), Side::Buy, 10, 100),
            RejectReason::NoReferencePrice,
        ),
        (
            e.send(99, aapl, Side::Buy, 10, 100),
            RejectReason::AccountNotGranted,
        ),
    ];
    let good = e.send(ACCOUNT, aapl, Side::Buy, 10, 100);
    e.s.flush().unwrap();
    let mut ids: Vec<u64> = cases.iter().map(|c| c.0).collect();
    ids.push(good);
    e.wait_final(&ids, 30);
    for (id, want) in cases {
        assert_eq!(reason_of(&e, id), want, "order {id}");
    }
    assert_eq!(e.state(good), OrderState::Filled);
    // A cancel of an unknown order is rejected too (it is not an order state change).
    e.s.cancel(777).unwrap();
    e.s.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !e.errors.iter().any(|x| x.contains("UnknownOrder(777)")) {
        assert!(
            Instant::now() < deadline,
            "no answer to the cancel: {:?}",
            e.errors
        );
        e.pump();
    }
    // Engine 2 may trade account 8, but its limits are tight.
    let mut e2 = gw.engine(ENGINE2, 1);
    let big = e2.send(OTHER_ACCOUNT, aapl, Side::Buy, 500, 100);
    e2.s.flush().unwrap();
    e2.wait_final(&[big], 30);
    assert_eq!(reason_of(&e2, big), RejectReason::MaxQuantity);

    // Logon checks: unknown engine, second connection of a live engine, wrong token.
    let cfg = orders_cfg("rc-test");
    let t = Duration::from_secs(10);
    match EngineSession::connect(gw.addr, &cfg, 42, 1, t) {
        Err(SessionError::Refused { status, .. }) => assert_eq!(status, LogonStatus::UnknownEngine),
        other => panic!("unknown engine accepted: {other:?}"),
    }
    match EngineSession::connect(gw.addr, &cfg, ENGINE, 1000, t) {
        Err(SessionError::Refused { status, .. }) => {
            assert_eq!(status, LogonStatus::AlreadyConnected)
        }
        other => panic!("second connection of engine 1 accepted: {other:?}"),
    }
    assert!(
        EngineSession::connect(gw.addr, &orders_cfg("wrong"), ENGINE2, 1, t).is_err(),
        "wrong token accepted"
    );
    // The refused attempts did not disturb the logged-on engine.
    let after = e.send(ACCOUNT, aapl, Side::Sell, 10, 100);
    e.s.flush().unwrap();
    e.wait_final(&[after], 30);
    assert_eq!(e.state(after), OrderState::Filled);
    let snap = gw.stop();
    assert_eq!(snap.open, 0);
    assert!(
        e.errors.iter().all(|x| x.contains("UnknownOrder(777)")),
        "{:?}",
        e.errors
    );
    // Nothing rejected by risk reached the venue.
    let d_lines = venue.received().iter().filter(|l| l[0] == "D").count();
    assert_eq!(d_lines, 2);
}

/// An engine's connection is lost: the gateway cancels its open orders at the venue and
/// leaves the other engine's orders alone.
#[test]
#[ignore = "rdma: needs an RDMA device and QuickFIX (cargo xtask test)"]
fn rc_engine_disconnect_cancels_its_orders_at_the_venue() {
    const RESTING: usize = 20;
    let dir = scratch("rc-cod");
    let venue = Venue::start(&dir.join("venue"), free_port());
    let gw = Gw::start(venue.port, &dir.join("gw.journal"), 7473);
    let mut e1 = gw.engine(ENGINE, 1);
    let mut e2 = gw.engine(ENGINE2, 1);
    let [aapl, _, _] = symbols();
    // Quantity above 1000: the venue acks and rests them.
    let ids: Vec<u64> = (0..RESTING)
        .map(|_| e1.send(ACCOUNT, aapl, Side::Buy, 2000, 100))
        .collect();
    let other = e2.send(ACCOUNT, aapl, Side::Sell, 2000, 100);
    e1.s.flush().unwrap();
    e2.s.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(ids.iter().all(|&id| e1.state(id) == OrderState::New)
        && e2.state(other) == OrderState::New)
    {
        assert!(Instant::now() < deadline, "orders not acknowledged");
        e1.pump();
        e2.pump();
    }
    assert!(venue.received().iter().all(|l| l[0] != "F"));
    // The engine goes away without canceling anything.
    e1.s.close();
    drop(e1);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let cancels = venue.received().iter().filter(|l| l[0] == "F").count();
        if cancels >= RESTING {
            assert_eq!(cancels, RESTING, "more cancels than engine 1 had orders");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "venue got {cancels} of {RESTING} cancels"
        );
        e2.pump();
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the Canceled reports reach the gateway before stopping it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.control.engines_connected() != 1 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(500));
    e2.pump();
    assert_eq!(
        e2.state(other),
        OrderState::New,
        "engine 2's order was touched"
    );
    let snap = gw.stop();
    for id in ids {
        assert_eq!(
            snap.orders[&(ENGINE, id)].0,
            OrderStatus::Done,
            "order {id}"
        );
    }
    assert_eq!(snap.orders[&(ENGINE2, other)].0, OrderStatus::Open);
    assert_eq!(snap.open, 1);
    assert!(e2.errors.is_empty(), "{:?}", e2.errors);
}
