//! Per-order cost of the gateway's hot path (issue 7, Benchmark): the pre-trade risk check
//! plus encoding the FIX 4.4 NewOrderSingle, as `Gateway` does for each accepted order.
//!
//! criterion measures the mean and its spread over batches; `risk+fix/each` also times every
//! order on its own and prints p50/p99 from an HdrHistogram (each sample then includes one
//! `Instant::now()` pair, about 20-40 ns, which the batch figures do not).
//!
//! `fix_encode` frames the message with the same header `Session::send_app` writes (49, 56,
//! 34, 52) but without the session's resend store; `risk+fix+store` goes through
//! `Session::send_app` itself, so the difference is what keeping every sent message costs.
//!
//! The order path is rebuilt (outside the timed region) every [`CHUNK`] orders, so the
//! duplicate-id set and the session's resend store grow as over a real day without the
//! benchmark's memory growing with the iteration count criterion picks.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hdrhistogram::Histogram;
use order_gateway::fix::session::{push_field, push_price, push_timestamp, push_uint};
use order_gateway::fix::{tag, MessageWriter, Session, SessionConfig};
use order_gateway::proto::{Side, Symbol};
use order_gateway::risk::{AccountLimits, EngineGrant, OrderParams, RiskConfig, RiskEngine};
use rocebus_bench::report::Summary;

/// Orders per order-path instance.
const CHUNK: u64 = 1 << 18;
const ENGINE: u32 = 1;
const ACCOUNT: u32 = 7;
/// 2023-11-14 12:00:00 UTC, inside the trading window below.
const T0: u64 = 1_699_963_200 * 1_000_000_000;
const SYMBOLS: [&str; 8] = [
    "AAPL", "MSFT", "NVDA", "AMZN", "GOOG", "META", "TSLA", "AVGO",
];
const REFERENCE_PX: i64 = 150 * 10_000;

/// What one step does.
#[derive(Clone, Copy, Debug)]
enum Step {
    Risk,
    Fix,
    RiskAndFix,
    RiskFixAndStore,
}

/// Risk engine, FIX session and buffers of one gateway, with every rule enabled and limits
/// that every generated order passes (a rejected order would measure the short path).
#[derive(Debug)]
struct OrderPath {
    risk: RiskEngine,
    session: Session,
    writer: MessageWriter,
    symbols: Vec<Symbol>,
    body: Vec<u8>,
    out: Vec<u8>,
    sent: u64,
}

impl OrderPath {
    fn new() -> OrderPath {
        let cfg = RiskConfig {
            accounts: vec![AccountLimits {
                id: ACCOUNT,
                max_order_qty: 10_000,
                max_order_notional: 10_000_000,
                credit_limit: i64::MAX / 20_000,
                max_position: i64::MAX / 2,
                max_open_orders: u32::MAX,
                max_orders_per_interval: u32::MAX,
                max_cancels_per_interval: None,
                max_replaces_per_interval: None,
                collar_bps: 500,
            }],
            firm: Default::default(),
            engines: vec![EngineGrant {
                id: ENGINE,
                accounts: vec![ACCOUNT],
                token: "bench-engine".into(),
            }],
            restricted_symbols: vec!["XXXX".into(), "ZZZZ".into()],
            reference_max_age_ms: 60_000,
            throttle_interval_ms: 1_000,
            // The repeated-order check runs on every order, but never rejects.
            max_identical_orders: u32::MAX,
            identical_order_window_ms: 1_000,
            max_malformed_frames: 100,
            response_history: 1 << 16,
            trading_start: Some("09:00".into()),
            trading_end: Some("21:00".into()),
            timezone: None,
            trading_start_utc: None,
            trading_end_utc: None,
        };
        let mut risk = RiskEngine::new(&cfg).expect("benchmark risk config is valid");
        let symbols: Vec<Symbol> = SYMBOLS
            .iter()
            .map(|s| Symbol::new(s).expect("benchmark symbols are valid"))
            .collect();
        for &s in &symbols {
            risk.on_reference_price(s, REFERENCE_PX, T0);
        }
        let session = Session::new(SessionConfig {
            sender_comp_id: "ROCEBUS".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        });
        OrderPath {
            risk,
            session,
            writer: MessageWriter::default(),
            symbols,
            body: Vec::with_capacity(256),
            out: Vec::with_capacity(512),
            sent: 0,
        }
    }

    fn params(&self) -> OrderParams {
        let i = self.sent;
        OrderParams {
            account: ACCOUNT,
            symbol: self.symbols[(i % self.symbols.len() as u64) as usize],
            side: if i % 2 == 0 { Side::Buy } else { Side::Sell },
            qty: 100 + (i % 7) as u32 * 100,
            price: REFERENCE_PX + (i % 41) as i64 * 100 - 2_000,
        }
    }

    /// One order through `step`; returns the FIX bytes written (0 for the risk step alone).
    fn order(&mut self, step: Step) -> usize {
        let p = self.params();
        let cl = self.sent;
        let now = T0 + self.sent;
        self.sent += 1;
        if !matches!(step, Step::Fix) {
            let verdict = self.risk.check_new(ENGINE, cl, &p, now);
            assert!(verdict.is_ok(), "benchmark order rejected: {verdict:?}");
        }
        if matches!(step, Step::Risk) {
            return 0;
        }
        // The body exactly as `Gateway::handle_new` builds it for a limit day order.
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::CL_ORD_ID, cl);
        push_uint(b, tag::ACCOUNT, u64::from(p.account));
        push_field(b, tag::SYMBOL, p.symbol.as_bytes());
        push_field(b, tag::SIDE, if p.side == Side::Buy { b"1" } else { b"2" });
        push_timestamp(b, tag::TRANSACT_TIME, now);
        push_uint(b, tag::ORDER_QTY, u64::from(p.qty));
        push_field(b, tag::ORD_TYPE, b"2");
        push_price(b, tag::PRICE, p.price);
        push_field(b, tag::TIME_IN_FORCE, b"0");
        self.out.clear();
        if matches!(step, Step::RiskFixAndStore) {
            self.session.send_app(b"D", &self.body, now, &mut self.out);
        } else {
            self.writer
                .start(b"D")
                .field(tag::SENDER_COMP_ID, b"ROCEBUS")
                .field(tag::TARGET_COMP_ID, b"VENUE")
                .uint(tag::MSG_SEQ_NUM, cl + 1)
                .timestamp(tag::SENDING_TIME, now)
                .raw_fields(&self.body)
                .finish(&mut self.out);
        }
        self.out.len()
    }

    fn exhausted(&self) -> bool {
        self.sent >= CHUNK
    }
}

/// Runs `iters` orders, rebuilding the path between chunks; `each` sees every order's
/// duration when per-order timing is wanted.
fn run(
    path: &mut OrderPath,
    step: Step,
    iters: u64,
    mut each: Option<&mut Histogram<u64>>,
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        if path.exhausted() {
            *path = OrderPath::new();
        }
        let n = left.min(CHUNK - path.sent);
        left -= n;
        match each.as_deref_mut() {
            None => {
                let t = Instant::now();
                for _ in 0..n {
                    black_box(path.order(step));
                }
                total += t.elapsed();
            }
            Some(h) => {
                for _ in 0..n {
                    let t = Instant::now();
                    black_box(path.order(step));
                    let d = t.elapsed();
                    total += d;
                    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
                }
            }
        }
    }
    total
}

fn gateway(c: &mut Criterion) {
    let mut group = c.benchmark_group("gateway_order");
    group.throughput(Throughput::Elements(1));
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    for (name, step) in [
        ("risk", Step::Risk),
        ("fix_encode", Step::Fix),
        ("risk+fix", Step::RiskAndFix),
        ("risk+fix+store", Step::RiskFixAndStore),
    ] {
        let mut path = OrderPath::new();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| run(&mut path, step, iters, None))
        });
    }
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 1_000_000_000, 3).expect("histogram bounds are valid");
    let mut path = OrderPath::new();
    group.bench_function("risk+fix/each", |b| {
        b.iter_custom(|iters| run(&mut path, Step::RiskAndFix, iters, Some(&mut hist)))
    });
    group.finish();
    let s = Summary::of(&hist);
    println!(
        "gateway_order/risk+fix per order (HdrHistogram, {} orders): p50 {} ns, p90 {} ns, \
         p99 {} ns, p99.9 {} ns, max {} ns",
        s.count, s.p50_ns, s.p90_ns, s.p99_ns, s.p999_ns, s.max_ns
    );
}

criterion_group!(benches, gateway);
criterion_main!(benches);
