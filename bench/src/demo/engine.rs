//! The engine loop (I/O): subscribes, connects to the gateway, and polls market data, the
//! probe and the order session until the run's time is up.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use rocebus::counters::{counters_path, default_dir, Counter, CountersFile, Kind};
use rocebus::idle::{pin_to, Idler};
use rocebus::mcast::MdSubscriber;
use rocebus::orders::OfferError;
use rocebus::rdma_settings::export::RdmaCountersExport;
use rocebus::verbs::RcOptions;
use rocebus_engine::client::{ClientError, EngineSession};
use rocebus_engine::proto::{RejectReason, Response, Symbol};

use super::config::{load_ipc_source, load_market_data, EngineConfig, Transport};
use super::md::{MdCounts, MdView};
use super::orders::{OrderCounts, OrderTimes, Strategy};
use super::report::Outcome;
use super::transport::{ChannelCounters, IpcChannel, MdSubscribers};
use super::{monotonic_ns, realtime_ns, tap};
use crate::report::{FixedRateSchedule, LatencyRecorder};

/// How long and where [`run`] runs.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Trading time after the gateway connection is up.
    pub duration: Duration,
    /// Print a progress line this often (0: never).
    pub progress: Duration,
    /// Publish counters in a counters file under this folder (`rocebus stat`).
    pub counters_dir: Option<PathBuf>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            duration: Duration::from_secs(30),
            progress: Duration::from_secs(1),
            counters_dir: Some(default_dir()),
        }
    }
}

/// The engine's live counters (`rocebus stat sample-engine`).
struct EngineCounters {
    md_messages: Counter,
    md_bbo: Counter,
    orders: Counter,
    acks: Counter,
    fills: Counter,
    rejects: Counter,
    skipped: Counter,
    back_pressured: Counter,
    _file: CountersFile,
    channels: ChannelCounters,
    /// The gateway connection's GID and marking, and the registered memory (`rdma.*`).
    rdma: RdmaCountersExport,
}

impl EngineCounters {
    fn open(
        dir: &Path,
        subs: &MdSubscribers,
        channels: &[u16],
        session: &EngineSession,
        rc: &RcOptions,
    ) -> anyhow::Result<EngineCounters> {
        let path = counters_path(dir, "sample-engine");
        let file = CountersFile::create(&path, 256)
            .with_context(|| format!("cannot create counters file {}", path.display()))?;
        let c = |label: &str| file.allocate_with(label, Kind::Counter, 0);
        let channels = ChannelCounters::new(&file, subs, channels)?;
        Ok(EngineCounters {
            md_messages: c("md messages handled")?,
            md_bbo: c("md bbo updates (traded symbols)")?,
            orders: c("orders sent")?,
            acks: c("acks")?,
            fills: c("fills")?,
            rejects: c("rejects")?,
            skipped: c("scheduled orders skipped (no quote)")?,
            back_pressured: c("orders back-pressured")?,
            channels,
            rdma: session.export_rdma(&file, rc)?,
            _file: file,
        })
    }

    fn update(&self, md: &MdCounts, o: &OrderCounts, subs: &MdSubscribers) {
        self.md_messages.set(md.messages);
        self.md_bbo.set(md.bbo_traded);
        self.orders.set(o.sent);
        self.acks.set(o.acks);
        self.fills.set(o.fills);
        self.rejects.set(o.rejects);
        self.skipped.set(o.skipped_no_quote);
        self.back_pressured.set(o.back_pressured);
        self.channels.update(subs);
        self.rdma.update();
    }
}

/// Retries `f` until it succeeds or `timeout` passes (peers may still be starting).
fn retry<T, E: std::fmt::Display>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, E>,
) -> anyhow::Result<T> {
    let t0 = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if t0.elapsed() >= timeout => {
                anyhow::bail!("{what}: {e} (gave up after {} s)", timeout.as_secs())
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// Runs the engine: subscribes, connects, trades for `opts.duration`, and returns what the
/// report needs. Prints a progress line every `opts.progress`.
pub fn run(cfg: &EngineConfig, opts: &RunOptions) -> anyhow::Result<Outcome> {
    let mut md_cfg = load_market_data(&cfg.market_data.config)?;
    // This host's transport settings, not the publisher's file's.
    cfg.rdma.apply_to_mcast(&mut md_cfg);
    cfg.rdma.prepare_process(
        cfg.gateway.orders.pinned_bytes_per_connection()
            + md_cfg.subscriber_pinned_bytes(cfg.market_data.channels.len().max(1)),
    )?;
    let channels: Vec<u16> = if cfg.market_data.channels.is_empty() {
        md_cfg.channels.iter().map(|c| c.id).collect()
    } else {
        cfg.market_data.channels.clone()
    };
    let symbols: Vec<Symbol> = cfg
        .strategy
        .symbols
        .iter()
        .filter_map(|s| Symbol::new(s))
        .collect();
    let rate = cfg.strategy.orders_per_second;
    let capacity = (rate as f64 * (opts.duration.as_secs_f64() + 5.0) * 1.1) as usize + 16;

    if let Some(core) = cfg.engine.core {
        // A configured core is a promise about tail latency: not kept, the engine does not run.
        pin_to(core).context("engine.core")?;
    }
    let connect_timeout = Duration::from_millis(cfg.gateway.connect_timeout_ms);
    let mut subs = match cfg.market_data.transport {
        Transport::Rdma => {
            // Validated by EngineConfig::parse: both are set for the bus.
            let (Some(local), Some(publisher)) = (cfg.market_data.local, cfg.market_data.publisher)
            else {
                anyhow::bail!("transport = \"rdma\" needs market_data.local and .publisher");
            };
            let mut subs = Vec::with_capacity(channels.len());
            for &ch in &channels {
                let s = retry(
                    &format!("subscribe to market-data channel {ch} (publisher {publisher})"),
                    connect_timeout,
                    || MdSubscriber::connect(&md_cfg, ch, local, publisher),
                )?;
                subs.push(s);
            }
            MdSubscribers::Rdma(subs)
        }
        Transport::Ipc => {
            let source = load_ipc_source(&cfg.market_data)?;
            let chans = channels
                .iter()
                .map(|&ch| IpcChannel::new(&source, ch))
                .collect::<anyhow::Result<Vec<_>>>()?;
            MdSubscribers::Ipc(chans)
        }
    };
    subs.wait_connected(connect_timeout)?;
    let first_id = 1;
    let mut session = EngineSession::connect_configured(&cfg.gateway, first_id, capacity)
        .with_context(|| {
            format!(
                "connect to the order gateway at {} (tried for {} s)",
                cfg.gateway.addr,
                connect_timeout.as_secs()
            )
        })?;
    let counters = match &opts.counters_dir {
        Some(dir) => Some(EngineCounters::open(
            dir,
            &subs,
            &channels,
            &session,
            &cfg.gateway.orders.rc,
        )?),
        None => None,
    };
    eprintln!(
        "sample-engine: engine {} on {} channel(s) over {}, trading {} symbol(s) at {rate} orders/s for {} s",
        cfg.gateway.engine_id,
        subs.len(),
        cfg.market_data.transport,
        symbols.len(),
        opts.duration.as_secs()
    );

    let tap = match cfg.market_data.exchange_feed {
        Some(feed) => match tap::ExchangeTap::open(feed) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!(
                    "sample-engine: market-data latency not measured: cannot open the raw-socket \
                     probe for {feed} ({e}; it needs CAP_NET_RAW)"
                );
                None
            }
        },
        None => None,
    };
    let mut view = MdView::new(
        Strategy::new(&symbols, cfg.strategy.quantity),
        tap.as_ref().map(|_| tap::StampTable::new(18)),
        realtime_ns,
    )?;
    let mut rtt = LatencyRecorder::new()?;
    let mut times = OrderTimes::new(first_id, capacity);
    let mut o = OrderCounts::default();
    let mut reasons = [0u64; 64];
    let start = monotonic_ns();
    let end = start + opts.duration.as_nanos() as u64;
    let mut schedule = FixedRateSchedule::with_rate(start, rate)?;
    let mut idler = Idler::new(cfg.engine.idle);
    let progress_ns = opts.progress.as_nanos() as u64;
    let mut next_progress = start + progress_ns;
    let mut next_counters = start;
    let account = cfg.gateway.account;

    loop {
        let now = monotonic_ns();
        if now >= end {
            break;
        }
        let mut work = 0;
        // Exchange packet stamps first, so they are known when the bus delivers.
        if let (Some(t), Some(stamps)) = (&tap, &mut view.stamps) {
            if t.drain(stamps) > 0 {
                work += 1;
                view.resolve(false);
            }
        }
        work += subs.poll(now, &mut view)?;
        work += session
            .poll(
                |r| match r {
                    Ok(Response::Ack(a)) => {
                        o.acks += 1;
                        if let Some(t) = times.take(a.cl_ord_id.get()) {
                            rtt.record(t, monotonic_ns());
                        }
                    }
                    Ok(Response::Fill(_)) => o.fills += 1,
                    Ok(Response::Reject(r)) => {
                        o.rejects += 1;
                        let code = usize::from(r.reason.get()).min(reasons.len() - 1);
                        reasons[code] += 1;
                        times.take(r.cl_ord_id.get());
                    }
                    Ok(Response::Canceled(_)) => o.canceled += 1,
                    Ok(_) => {}
                    Err(ClientError::AlreadyFinal(_) | ClientError::UnknownOrder(_)) | Err(_) => {
                        o.bad_responses += 1
                    }
                },
                64,
            )
            .context("the order gateway connection failed")?;
        // Every order due by now goes out, late ones at once: each keeps its intended time.
        let mut sent_now = false;
        while schedule.peek() <= now {
            let Some(intent) = view.strategy.next_order() else {
                schedule.next_send();
                o.skipped_no_quote += 1;
                continue;
            };
            match session.new_order(
                account,
                intent.symbol,
                intent.side,
                intent.qty,
                intent.price,
            ) {
                Ok(id) => {
                    if times.is_full(id) {
                        anyhow::bail!("more orders than planned ({capacity}): raise the capacity");
                    }
                    times.set(id, schedule.next_send());
                    o.sent += 1;
                    sent_now = true;
                }
                Err(OfferError::BackPressured) => {
                    // The strategy's turn is spent; the schedule is not: try again next pass.
                    o.back_pressured += 1;
                    break;
                }
                Err(e) => return Err(anyhow::anyhow!("send an order to the gateway: {e:?}")),
            }
        }
        if sent_now {
            session
                .flush()
                .map_err(|e| anyhow::anyhow!("send orders to the gateway: {e:?}"))?;
            work += 1;
        }
        if now >= next_counters {
            next_counters = now + 10_000_000;
            if let Some(c) = &counters {
                c.update(&view.counts, &o, &subs);
            }
        }
        if progress_ns > 0 && now >= next_progress {
            next_progress += progress_ns;
            let b = subs.bus_counts();
            println!(
                "[{:>3.0} s] md {:>8} msgs  gaps {:>3}  recovered {:>5}  lost {}  | orders {:>6}  acks {:>6}  fills {:>6}  rejects {:>4}",
                (now - start) as f64 / 1e9,
                b.delivered,
                b.gaps,
                b.recovered,
                b.unrecoverable,
                o.sent,
                o.acks,
                o.fills,
                o.rejects
            );
        }
        idler.idle(work);
    }
    let seconds = (monotonic_ns() - start) as f64 / 1e9;
    if let (Some(t), Some(stamps)) = (&tap, &mut view.stamps) {
        std::thread::sleep(Duration::from_millis(100));
        t.drain(stamps);
    }
    view.resolve(true);
    // Collect the answers to the last orders (bounded wait).
    let drain_end = Instant::now() + Duration::from_secs(2);
    while o.acks + o.rejects < o.sent && Instant::now() < drain_end {
        session
            .poll(
                |r| match r {
                    Ok(Response::Ack(a)) => {
                        o.acks += 1;
                        if let Some(t) = times.take(a.cl_ord_id.get()) {
                            rtt.record(t, monotonic_ns());
                        }
                    }
                    Ok(Response::Fill(_)) => o.fills += 1,
                    Ok(Response::Reject(_)) => o.rejects += 1,
                    _ => {}
                },
                64,
            )
            .context("the order gateway connection failed")?;
    }
    if let Some(c) = &counters {
        c.update(&view.counts, &o, &subs);
    }
    session.close();
    if let Some(t) = &tap {
        if t.dropped() > 0 {
            eprintln!(
                "sample-engine: the latency probe dropped {} stamps (queue full)",
                t.dropped()
            );
        }
    }
    let rejects_by_reason = (0..reasons.len() as u16)
        .filter(|&r| reasons[usize::from(r)] > 0)
        .filter_map(|r| RejectReason::from_u16(r).map(|rr| (rr, reasons[usize::from(r)])))
        .collect();
    Ok(Outcome {
        seconds,
        rate,
        md: view.counts,
        bus: subs.bus_counts(),
        orders: o,
        rejects_by_reason,
        md_latency: view.latency.into_histogram(),
        rtt: rtt.into_histogram(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A configured core the engine cannot be pinned to stops it before it connects
    /// anywhere, naming the setting and the cores it may use (it used to log a warning and
    /// trade unpinned).
    #[test]
    fn a_core_that_cannot_be_pinned_stops_the_engine() {
        let dir = tempfile::tempdir().unwrap();
        let md = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/md.toml");
        std::fs::copy(md, dir.path().join("md.toml")).unwrap();
        let path = dir.path().join("engine.toml");
        let text = format!(
            "{}\n[engine]\ncore = 100000\n",
            crate::demo::config::tests::GOOD
        );
        std::fs::write(&path, text).unwrap();
        let cfg = EngineConfig::load(&path).unwrap();
        let opts = RunOptions {
            counters_dir: None,
            ..RunOptions::default()
        };
        let e = format!("{:#}", run(&cfg, &opts).unwrap_err());
        assert!(
            e.contains("engine.core") && e.contains("cannot pin this thread to core 100000"),
            "{e}"
        );
    }
}
