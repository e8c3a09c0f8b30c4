//! A trading engine: market data from the feed handler in, orders through the order gateway
//! out, on whatever transport the feed handler's channels name (multicast or RC fan-out).
//!
//! ```text
//! example-engine ENGINE_TOML FEED_HANDLER_TOML LOCAL_IP PUBLISHER_IP [ORDERS [SECONDS]]
//! ```
//!
//! ENGINE_TOML is an engine's configuration (`configs/demo/sample-engine.toml`: its
//! `[gateway]` and `[rdma]` tables); FEED_HANDLER_TOML the feed handler's, whose
//! `[market_data]` table both sides share. For each fresh best bid and offer of a traded
//! symbol it sends a day limit order at the touch (buy at the bid, sell at the ask, in
//! turn) until ORDERS (default 20) were acknowledged and filled (the gateway's venue
//! simulator fills every order at its limit), then checks its positions against its fills.
//! The gateway takes reference prices from the same bus, so an order on a symbol whose quote
//! reached us first may be rejected for want of one (or as halted): counted, allowed. Any
//! other reject, or SECONDS (default 120) without finishing, fails (exit 1). Prints
//! `example-engine: ready` once subscribed and logged on. The C++ twin is
//! `ffi/examples/engine_cpp.cpp`; both run in the guest tests against the real services.
use rocebus::clock::Mono;
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{Event, Handler, MdSubscriber, NoSnapshots};
use rocebus_engine::client::EngineSession;
use rocebus_engine::config::GatewayConfig;
use rocebus_engine::proto::{RejectReason, Response, Side, Symbol};
use rocebus_md::normalized::{decode, Normalized};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

fn main() {
    // rocebus reports what it drops or retries through `tracing`: RUST_LOG=info shows it.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run() {
        eprintln!("example-engine: {e}");
        std::process::exit(1);
    }
}

/// The last quote of a traded symbol.
#[derive(Default)]
struct Quote {
    bid: i64,
    ask: i64,
    /// A quote arrived since the last order on it.
    fresh: bool,
    /// Halted, paused or quotation only.
    halted: bool,
}

/// The market-data handler: the quotes of the traded symbols.
struct Quotes(HashMap<Symbol, Quote>);

impl Handler for Quotes {
    fn on_message(&mut self, _seq: u64, msg: &[u8]) {
        match decode(msg) {
            // Symbols are space-padded 8 bytes on the bus and in the engine protocol alike.
            Ok(Normalized::Bbo(b)) => {
                if let Some(q) = self.0.get_mut(&Symbol(b.header.stock)) {
                    q.bid = i64::from(b.bid_price.get());
                    q.ask = i64::from(b.ask_price.get());
                    q.fresh = true;
                }
            }
            Ok(Normalized::Status(s)) => {
                if let Some(q) = self.0.get_mut(&Symbol(s.header.stock)) {
                    q.halted = matches!(s.state, b'H' | b'P' | b'Q');
                }
            }
            _ => {}
        }
    }

    /// Messages missed for good (a snapshot resynchronised us): every quote is stale.
    fn on_gap(&mut self, _from: u64, _to: u64) {
        self.0.values_mut().for_each(|q| q.fresh = false);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [engine_toml, fh_toml, local, publisher, rest @ ..] = &args[..] else {
        return Err(
            "usage: example-engine ENGINE_TOML FEED_HANDLER_TOML LOCAL_IP \
                    PUBLISHER_IP [ORDERS [SECONDS]]"
                .into(),
        );
    };
    let target: usize = rest.first().map_or(Ok(20), |s| s.parse())?;
    let seconds: u64 = rest.get(1).map_or(Ok(120), |s| s.parse())?;
    let (local, publisher): (IpAddr, IpAddr) = (local.parse()?, publisher.parse()?);

    // Market data in: one subscriber per channel of the feed handler's configuration, made
    // without waiting for the feed handler (`new`): polls connect, and connect again after a
    // loss, on either transport.
    let mut md_cfg = McastConfig::load_from_service(fh_toml)?;
    // Before any memory is registered: the engine file's `[rdma]` table (huge pages, this
    // host's transport settings) and a memlock limit that covers every ring, as the
    // services check at their start.
    let gw_cfg = GatewayConfig::load(engine_toml)?;
    gw_cfg.rdma.apply_to_mcast(&mut md_cfg);
    gw_cfg.prepare_process(md_cfg.subscriber_pinned_bytes(md_cfg.channels.len()))?;
    let mut md = md_cfg
        .channels
        .iter()
        .map(|c| MdSubscriber::new(&md_cfg, c.id, local, publisher))
        .collect::<Result<Vec<_>, _>>()?;
    let symbols = ["A", "B", "C", "D", "E", "F", "G", "H"].map(|s| Symbol::new(s).unwrap());
    let mut quotes = NoSnapshots::new(Quotes(
        symbols.iter().map(|&s| (s, Quote::default())).collect(),
    ));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !md.iter().all(MdSubscriber::connected) {
        if Instant::now() > deadline {
            return Err("the feed handler's channels never came up".into());
        }
        let now = Mono::now();
        for sub in &mut md {
            sub.poll(now, &mut quotes, 64)?;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Orders out: log on to the gateway (retried while it starts).
    let mut gw = EngineSession::connect_configured(&gw_cfg, 1, 1024)?;
    println!("example-engine: ready");

    let (mut sent, mut acked, mut filled, mut no_reference) = (Vec::new(), 0, 0, 0);
    let mut turn = 0u32;
    while filled < target {
        if Instant::now() > deadline {
            return Err(format!(
                "timed out: {} orders sent, {filled} filled, {no_reference} rejected for the \
                 reference price",
                sent.len()
            )
            .into());
        }
        // One clock reading per turn, handed to every state machine that needs it.
        let now = Mono::now();
        let mut work = 0;
        for sub in &mut md {
            work += sub.poll(now, &mut quotes, 64)?;
            while let Some(ev) = sub.poll_event() {
                if matches!(
                    ev,
                    Event::UnrecoverableLoss { .. } | Event::SnapshotApplied { .. }
                ) {
                    quotes.handler_mut().on_gap(0, 0);
                }
            }
        }
        let mut failure = None;
        work += gw.poll(
            |r| match r {
                Ok(Response::Ack(_)) => acked += 1,
                Ok(Response::Fill(_)) => filled += 1,
                Ok(Response::Reject(r)) => match RejectReason::from_u16(r.reason.get()) {
                    // The gateway's view of the bus lags ours (we never trade a halted one).
                    Some(
                        RejectReason::NoReferencePrice
                        | RejectReason::StaleReferencePrice
                        | RejectReason::Halted,
                    ) => no_reference += 1,
                    other => {
                        failure = Some(format!("order {} rejected: {other:?}", r.cl_ord_id.get()))
                    }
                },
                Ok(_) => {}
                Err(e) => failure = Some(format!("a response the book refused: {e:?}")),
            },
            64,
        )?;
        if let Some(f) = failure {
            return Err(f.into());
        }
        // An order on each fresh quote, until enough are live.
        let mut any = false;
        for &symbol in &symbols {
            let q = quotes
                .handler_mut()
                .0
                .get_mut(&symbol)
                .expect("traded symbol");
            if sent.len() - no_reference >= target
                || !q.fresh
                || q.halted
                || q.bid == 0
                || q.ask == 0
            {
                continue;
            }
            q.fresh = false;
            let (side, price) = match sent.len() % 2 {
                0 => (Side::Buy, q.bid),
                _ => (Side::Sell, q.ask),
            };
            match gw.new_order(gw_cfg.account, symbol, side, 100, price) {
                Ok(id) => sent.push((id, symbol, side)),
                Err(rocebus::orders::OfferError::BackPressured) => break,
                Err(e) => return Err(format!("send an order: {e:?}").into()),
            }
            any = true;
        }
        if any {
            gw.flush()?;
        }
        // Several busy processes share the guest's cores: rest when idle.
        turn = if work > 0 || any { 0 } else { turn + 1 };
        if turn > 1000 {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    // The session's book agrees with the fills: each symbol's position is what we bought
    // less what we sold.
    for &symbol in &symbols {
        let want: i64 = sent
            .iter()
            .filter(|&&(id, s, _)| {
                s == symbol
                    && gw
                        .client()
                        .order(id)
                        .is_some_and(|o| o.state == rocebus_engine::client::OrderState::Filled)
            })
            .map(|&(_, _, side)| if side == Side::Buy { 100 } else { -100 })
            .sum();
        let got = gw.client().position(symbol);
        if got != want {
            return Err(
                format!("position of {symbol}: the book says {got}, the fills {want}").into(),
            );
        }
    }
    if acked != filled {
        return Err(format!("{filled} fills but {acked} acks").into());
    }
    let delivered: u64 = md.iter().map(|s| s.counters().delivered).sum();
    println!(
        "example-engine: {target} orders acknowledged and filled ({no_reference} rejected for \
         the gateway's lagging view of the bus; {delivered} market-data messages)"
    );
    gw.close();
    Ok(())
}
