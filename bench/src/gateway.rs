//! `gateway-rtt`: order round trip through the whole gateway, over RC.
//!
//! The engine side (this thread) sends a NewOrder over the rocebus orders path; the gateway
//! service (another thread, the real `order_gateway::service::Service`) checks risk,
//! journals, encodes FIX and hands it to the in-process venue simulator
//! (`order_gateway::sim::SimVenue`), which acknowledges and fills it at once; the gateway
//! decodes the execution reports, journals them and answers Ack and Fill over RC. One
//! sample is NewOrder sent → Fill received, one order outstanding at a time (closed loop,
//! like `ib_write_lat`, so there is no coordinated omission to correct). The journal is
//! written to the temp dir (tmpfs in the guest) with the gateway's default group commit
//! (`--fsync never` for the old figure): the write and `fdatasync` system calls are in the
//! figure, a disk is not (`cargo xtask bench gateway-journal` measures that).
//!
//! With `--engines 1,32` (the default) the same gateway is measured first with the one
//! active engine, then again after 31 more engines logged on and stayed idle (their rings
//! are only swept, and polled when they mark the gateway's fan-in summary): the two rows
//! are printed side by side. The RESULT line is the one-engine figure.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use order_gateway::client::{EngineSession, OrderState};
use order_gateway::driver::FixDriver;
use order_gateway::fix::SessionConfig;
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{Side, Symbol, PRICE_SCALE};
use order_gateway::risk::RiskConfig;
use order_gateway::service::{NoMarketData, Service, ServiceControl, ServiceOptions};
use order_gateway::sim::SimVenue;
use rocebus::idle::IdleStrategy;
use rocebus::orders::{OfferError, OrdersConfig};
use rocebus_bench::rc::local_ip;
use rocebus_bench::report::{summary_table, write_hgrm_file, Summary};

/// Options of `gateway-rtt`.
#[derive(Debug, Clone, clap::Args)]
pub struct GatewayRttArgs {
    /// Timed round trips (after the warm-up).
    #[arg(long, short = 'n', default_value_t = 20_000)]
    pub iterations: u64,
    /// Untimed round trips first.
    #[arg(long, default_value_t = 1_000)]
    pub warmup: u64,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port of the gateway.
    #[arg(long, default_value_t = 7510)]
    pub port: u16,
    /// Pin the gateway and engine threads to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Let the gateway thread spin when idle (isolated cores). Default: yield, because
    /// engine, gateway and the soft-RoCE kernel work share the guest's two vCPUs.
    #[arg(long)]
    pub busy_spin: bool,
    /// Also write the percentile distribution here (.hgrm). Set RUST_LOG=info for the
    /// gateway's log.
    #[arg(long)]
    pub hgrm: Option<std::path::PathBuf>,
    /// The journal's sync policy: `group` (the gateway's default: each service turn is
    /// fdatasync'ed before its FIX and acks leave) or `never`.
    #[arg(long, default_value = "group", value_parser = ["group", "never"])]
    pub fsync: String,
    /// Connected engines to measure with, in increasing order: one active, the rest
    /// logged on and idle.
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    pub engines: Vec<u32>,
}

pub(crate) const ENGINE: u32 = 1;
pub(crate) const ACCOUNT: u32 = 1;
const ENGINE_TOKEN: &str = "bench-engine";
fn orders_config() -> OrdersConfig {
    OrdersConfig {
        // 4 MiB: a default run (21,000 orders, ~1.7 MB of requests, ~2.4 MB of responses)
        // stays within the first lap of each ring. Rings that wrap mid-run currently trip
        // the receiver's check of stale bytes from the previous lap (reported to core).
        ring_size: 1 << 22,
        max_payload: 1024,
        token: "bench".into(),
        ..OrdersConfig::default()
    }
}

/// Limits that never reject the benchmark's flow (risk is still fully evaluated).
pub(crate) fn risk() -> Result<RiskConfig> {
    risk_with_idle(0)
}

/// Rings of the idle engines (their side; the gateway's rings are its own `ring_size`).
const IDLE_RING: usize = 64 << 10;

/// [`risk`] with `idle` more engines (ids 2..), each with its token `idle-engine-ID`.
fn risk_with_idle(idle: u32) -> Result<RiskConfig> {
    let mut extra = String::new();
    for id in 2..2 + idle {
        extra.push_str(&format!(
            "[[engines]]\nid = {id}\naccounts = [{ACCOUNT}]\ntoken = \"idle-engine-{id}\"\n"
        ));
    }
    Ok(toml::from_str(&format!(
        r#"
        reference_max_age_ms = 3600000
        throttle_interval_ms = 1000
        max_identical_orders = 1000000000
        [[accounts]]
        id = {ACCOUNT}
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 1000000000000000
        max_position = 1000000000000
        max_open_orders = 1000
        max_orders_per_interval = 1000000000
        collar_bps = 500
        [[engines]]
        id = {ENGINE}
        accounts = [{ACCOUNT}]
        token = "{ENGINE_TOKEN}"
        {extra}"#
    ))?)
}

/// Runs the benchmark and prints the summary and the RESULT line.
pub fn run(a: &GatewayRttArgs) -> Result<()> {
    if std::env::var_os("RUST_LOG").is_some() {
        // The gateway's own log (engine logons, disconnects) on stderr.
        rocebus_bin_support::init_logging("error")?;
    }
    let addr = SocketAddr::new(local_ip(a.addr)?, a.port);
    let journal_dir = tempfile_dir()?;
    let symbol = Symbol::new("AAPL").expect("valid symbol");
    let control = ServiceControl::new();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (c, cores, journal, busy_spin) = (
        control.clone(),
        a.cores.clone(),
        journal_dir.join("gateway.journal"),
        a.busy_spin,
    );
    let fsync = if a.fsync == "never" {
        FsyncPolicy::Never
    } else {
        FsyncPolicy::Group
    };
    let max_engines = a.engines.iter().copied().max().unwrap_or(1).max(1);
    let gateway = std::thread::spawn(move || -> Result<()> {
        let risk = risk_with_idle(max_engines - 1)?;
        let session = SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        };
        let driver = FixDriver::with_link(SimVenue::new(), session, &risk, &journal, fsync)?;
        let mut orders = orders_config();
        orders.max_connections_per_peer = max_engines as usize + 4;
        let opts = ServiceOptions {
            listen: addr,
            orders,
            core: cores.first().copied(),
            idle: if busy_spin {
                IdleStrategy::BusySpin
            } else {
                IdleStrategy::Yield
            },
            reconnect: Duration::from_secs(1),
            logon_timeout: Duration::from_secs(5),
            // Idle engines send no heartbeats (their thread is the measuring one): they
            // must not be disconnected for silence during the run.
            engine_timeout: Duration::from_secs(3600),
            control_socket: None,
            counters_file: false,
            static_prices: vec![(symbol, 100 * PRICE_SCALE)],
            max_response_backlog: 1 << 16,
            heartbeat: Duration::from_millis(100),
            max_pending_connections: 16,
        };
        let mut service = Service::new(driver, &risk, opts, c)?;
        ready_tx.send(()).ok();
        service.run(&mut NoMarketData)?;
        Ok(())
    });
    let result = (|| {
        ready_rx
            .recv_timeout(Duration::from_secs(30))
            .context("gateway thread failed to start")?;
        let t = Instant::now();
        while !control.is_fix_active() {
            if t.elapsed() > Duration::from_secs(10) {
                bail!("the gateway did not log on to the venue simulator");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(core) = a.cores.get(1) {
            if !rocebus::idle::pin_current_thread(*core) {
                eprintln!("warning: could not pin to core {core}");
            }
        }
        let total = a.warmup + a.iterations;
        let mut s = EngineSession::connect_with_capacity(
            &orders_config(),
            addr,
            ENGINE,
            ENGINE_TOKEN,
            1,
            (total as usize + 16) * a.engines.len().max(1),
        )?;
        let idle_cfg = OrdersConfig {
            ring_size: IDLE_RING,
            max_payload: 1024,
            ..orders_config()
        };
        let mut idle = Vec::new();
        let mut hists = Vec::new();
        for &n in &a.engines {
            while (idle.len() as u32) + 1 < n {
                let id = idle.len() as u32 + 2;
                idle.push(EngineSession::connect_with_capacity(
                    &idle_cfg,
                    addr,
                    id,
                    &format!("idle-engine-{id}"),
                    1,
                    16,
                )?);
            }
            let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
            round_trips(&mut s, a, symbol, total, &mut hist)?;
            hists.push((n, hist));
        }
        for e in &mut idle {
            e.close();
        }
        s.close();
        Ok(hists)
    })();
    control.stop();
    let joined = gateway.join();
    let _ = std::fs::remove_dir_all(&journal_dir);
    // The gateway's own failure explains an engine-side one, so it goes first.
    match joined {
        Ok(r) => r.context("gateway thread")?,
        Err(_) => bail!("gateway thread panicked"),
    }
    let hists = result?;
    let labels: Vec<String> = hists
        .iter()
        .map(|(n, _)| format!("gateway-rtt, {n} engine(s)"))
        .collect();
    let rows: Vec<(&str, Summary)> = hists
        .iter()
        .zip(&labels)
        .map(|((_, h), l)| (l.as_str(), Summary::of(h)))
        .collect();
    println!("{}", summary_table(&rows));
    println!(
        "gateway-rtt side by side: {}",
        rows.iter()
            .map(|(l, s)| format!("{l}: p50 {} ns, p99 {} ns", s.p50_ns, s.p99_ns))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let (_, first) = hists.first().context("no engine count given")?;
    if let Some(p) = &a.hgrm {
        write_hgrm_file(p, first)?;
    }
    rocebus_bench::report::emit_result(&Summary::of(first).result_line());
    Ok(())
}

/// `total` closed-loop round trips of the active engine (NewOrder sent, Fill received);
/// the ones after the warm-up recorded into `hist`.
fn round_trips(
    s: &mut EngineSession,
    a: &GatewayRttArgs,
    symbol: Symbol,
    total: u64,
    hist: &mut Histogram<u64>,
) -> Result<()> {
    for i in 0..total {
        let side = if i % 2 == 0 { Side::Buy } else { Side::Sell };
        let t0 = Instant::now();
        let id = match s.new_order(ACCOUNT, symbol, side, 1, 100 * PRICE_SCALE) {
            Ok(id) => id,
            Err(OfferError::BackPressured) => bail!("back-pressured with one order in flight"),
            Err(e) => bail!("send order: {e}"),
        };
        s.flush()?;
        let deadline = t0 + Duration::from_secs(5);
        loop {
            s.poll(|_| {}, 16)
                .with_context(|| format!("waiting for the fill of order {i}"))?;
            match s.client().order(id).map(|o| o.state) {
                Some(OrderState::Filled) => break,
                Some(OrderState::Rejected(r)) => bail!("order {id} rejected: {r:?}"),
                _ => {}
            }
            if Instant::now() > deadline {
                bail!("order {id} not filled within 5 s");
            }
        }
        if i >= a.warmup {
            hist.record(t0.elapsed().as_nanos() as u64)?;
        }
    }
    Ok(())
}

/// A fresh folder for the journal in the temp dir (tmpfs in the guest).
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("rocebus-gateway-rtt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}
