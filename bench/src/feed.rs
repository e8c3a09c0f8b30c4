//! `feed-e2e`: the feed handler end to end in one guest. A MoldUDP64 packet is received from
//! UDP (the time is taken right after `recv` returns) → ITCH decode → order book →
//! normalized messages published on the rocebus market-data bus (UD multicast) → the
//! subscriber's handler. One sample per normalized message: handler time minus the receive
//! time of the packet that caused it.
//!
//! Three threads: the exchange (`feed_handler::udp::Replayer`, paced by `--rate`, sending to
//! the feed handler over loopback UDP: the exchange link is not what is measured), the feed
//! handler (the library's `Pipeline` over `BusSink`, exactly what `feed-handler run` does,
//! plus a stamping wrapper), and the subscriber (`McastSubscriber` into a `MarketView`).
//! Stamps go from the feed handler to the subscriber through a table indexed by bus
//! sequence, which is why this runs in one process.
//!
//! In one soft-RoCE guest, multicast frames handed to eth0 pile up (see `md.rs`): eth0's
//! egress is dropped with netem for the run.

use anyhow::{bail, Context, Result};
use feed_handler::bus::BusSink;
use feed_handler::generate::{generate, GenConfig};
use feed_handler::moldudp64::GapConfig;
use feed_handler::publish::MdSink;
use feed_handler::service::Pipeline;
use feed_handler::udp::{Pacing, ReceiverConfig, ReplayConfig, Replayer, UdpReceiver};
use feed_handler::view::MarketView;
use hdrhistogram::Histogram;
use rocebus::clock::Mono;
use rocebus::idle::{IdleStrategy, Idler};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::io::PublishError;
use rocebus::mcast::{Handler, McastSubscriber, RestoreError, SnapshotSink};
use rocebus_bench::rc::local_ip;
use rocebus_bench::report::Summary;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Options of `feed-e2e`.
#[derive(Debug, Clone, clap::Args)]
pub struct FeedE2eArgs {
    /// ITCH messages in the generated day.
    #[arg(long, short = 'n', default_value_t = 40_000)]
    pub messages: u64,
    /// Symbols in the generated day.
    #[arg(long, default_value_t = 50)]
    pub symbols: u16,
    /// Exchange send rate, ITCH messages per second.
    #[arg(long, default_value_t = 20_000)]
    pub rate: u64,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port of the bus channel's recovery service.
    #[arg(long, default_value_t = 7720)]
    pub port: u16,
    /// UDP port the feed handler receives the exchange feed on (loopback).
    #[arg(long, default_value_t = 26600)]
    pub feed_port: u16,
    /// Pin the feed handler and subscriber threads to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Spin when a poll found nothing instead of yielding (see `md-latency --spin`).
    #[arg(long)]
    pub spin: bool,
    /// Do not drop eth0's egress in a one-host guest.
    #[arg(long)]
    pub no_sink: bool,
}

/// Nanoseconds since the first call (`cargo xtask vm` boots guests with the TSC
/// clocksource, so `Instant::now()` is a vDSO read there as on real hosts).
mod clock {
    use std::sync::OnceLock;
    use std::time::Instant;

    static START: OnceLock<Instant> = OnceLock::new();

    /// Nanoseconds since the first call.
    pub fn now() -> u64 {
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Receive time per bus sequence, written by the feed handler, read by the subscriber.
struct Stamps(Vec<AtomicU64>);

impl Stamps {
    fn get(&self, seq: u64) -> u64 {
        // ORDERING: Acquire, pairs with the Release in `Stamping::publish`; the message
        // itself left the process long after that store.
        self.0
            .get(seq as usize)
            .map_or(0, |s| s.load(Ordering::Acquire))
    }
}

/// `BusSink` plus the stamps (one channel).
struct Stamping {
    bus: BusSink,
    received: u64,
    stamps: Arc<Stamps>,
}

impl MdSink for Stamping {
    type Error = PublishError;

    fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), PublishError> {
        self.bus.publish(channel, message)?;
        if let Some(s) = self.stamps.0.get(self.bus.last_seq(channel) as usize) {
            // ORDERING: Release, pairs with the Acquire in `Stamps::get`.
            s.store(self.received, Ordering::Release);
        }
        Ok(())
    }

    fn on_input(&mut self, received_ns: u64) {
        self.received = received_ns;
    }
}

/// The subscriber's application: the view, plus one latency sample per message.
struct Timed {
    view: MarketView,
    stamps: Arc<Stamps>,
    hist: Histogram<u64>,
    unstamped: u64,
}

impl Handler for Timed {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        let t = clock::now();
        self.view.on_message(seq, msg);
        match self.stamps.get(seq) {
            0 => self.unstamped += 1,
            r => {
                let _ = self.hist.record(t.saturating_sub(r).max(1));
            }
        }
    }
}

impl SnapshotSink for Timed {
    fn begin_restore(&mut self) {
        self.view.begin_restore();
    }
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.view.restore_chunk(data)
    }
    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        self.view.finish_restore(snapshot_seq)
    }
}
fn pin(cores: &[usize], i: usize) {
    if let Some(c) = cores.get(i) {
        if !rocebus::idle::pin_current_thread(*c) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

fn bus_config(port: u16) -> Result<McastConfig> {
    Ok(McastConfig::from_toml_str(&format!(
        "max_datagram_payload = 1024\nhistory_depth = 65536\nheartbeat_interval_ns = 1000000\n\
         [receive]\ndepth = 4096\nreplenish_batch = 64\nlow_water = 512\n\
         [batching]\nmax_messages = 64\nflush_interval_ns = 0\n\
         [recovery]\ntimeout_ns = 50000000\nmax_retries = 50\nmax_buffered = 16384\n\
         [[channels]]\nid = 1\nname = \"feed\"\nline_a = \"239.9.6.1\"\nport = {port}\n"
    ))?)
}

/// Runs `feed-e2e` and prints the summary and the RESULT line.
pub fn run(a: &FeedE2eArgs) -> Result<()> {
    let _sink = rocebus_bench::md::sink(a.no_sink);
    let ip = local_ip(a.addr)?;
    let cfg = bus_config(a.port)?;
    let mut messages = Vec::new();
    generate(
        &GenConfig {
            seed: 1,
            messages: a.messages,
            symbols: a.symbols,
        },
        |m| messages.push(m.to_vec()),
    );
    // Normalized messages per ITCH message stay below 3 (a replace: two levels and a BBO).
    let stamps = Arc::new(Stamps(
        (0..a.messages * 3 + 16)
            .map(|_| AtomicU64::new(0))
            .collect(),
    ));
    let idle = if a.spin {
        IdleStrategy::BusySpin
    } else {
        IdleStrategy::Yield
    };
    let feed_addr = SocketAddr::from((Ipv4Addr::LOCALHOST, a.feed_port));
    let mut receiver = UdpReceiver::new(&ReceiverConfig {
        group: feed_addr,
        interface: Ipv4Addr::LOCALHOST,
        sources: Vec::new(),
        retrans_server: Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
        gap: GapConfig {
            retransmit_timeout: Duration::from_millis(20),
            max_retries: 50,
            ..GapConfig::default()
        },
        recv_buffer: 8 << 20,
    })
    .context("feed socket")?;
    let stop = Arc::new(AtomicBool::new(false));
    // The feed handler: receive → decode → book → bus.
    let (fh_cfg, fh_stamps, fh_stop, cores) =
        (cfg.clone(), stamps.clone(), stop.clone(), a.cores.clone());
    let (retrans_tx, retrans_rx) = std::sync::mpsc::channel::<SocketAddr>();
    let (last_tx, last_rx) = std::sync::mpsc::channel::<u64>();
    let feed = std::thread::spawn(move || -> Result<()> {
        pin(&cores, 0);
        let bus = BusSink::new(&fh_cfg, clock::now(), ip)?;
        let mut p = Pipeline::new(
            Stamping {
                bus,
                received: 0,
                stamps: fh_stamps,
            },
            1,
            10,
        );
        let mut idler = Idler::new(idle);
        let mut ended = false;
        // ORDERING: Acquire, pairs with the Release store once the subscriber is done.
        while !fh_stop.load(Ordering::Acquire) {
            // The exchange binds once the subscriber is connected, which needs this loop
            // polling the publisher meanwhile.
            if let Ok(addr) = retrans_rx.try_recv() {
                receiver.set_retrans_server(addr);
            }
            let got = receiver.poll_timed(&mut clock::now, &mut p)?;
            let (book, sink) = p.parts_mut();
            let sent = sink.bus.poll(Mono::from_nanos(clock::now()), book)?;
            if !ended && receiver.tracker().is_complete() {
                ended = true;
                sink.bus.flush(Mono::from_nanos(clock::now()))?;
                last_tx.send(sink.bus.last_seq(0))?;
            }
            idler.idle(usize::from(got) + sent);
        }
        Ok(())
    });
    // The subscriber; connecting waits for the feed handler's publisher.
    let t0 = std::time::Instant::now();
    pin(&a.cores, 1);
    let mut sub = loop {
        match McastSubscriber::connect(&cfg, 1, ip, ip) {
            Ok(s) => break s,
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                eprintln!("waiting for the feed handler's publisher: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e).context("subscriber"),
        }
    };
    // The exchange starts once the subscriber is connected.
    let mut rc = ReplayConfig::new(feed_addr);
    rc.retrans_bind = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    rc.pacing = Pacing::MessagesPerSecond(a.rate);
    rc.linger = Duration::from_millis(300);
    let mut replayer = Replayer::new(rc).context("replayer sockets")?;
    retrans_tx.send(replayer.retrans_addr()?)?;
    let exchange = std::thread::spawn(move || replayer.run(&messages));
    let mut app = Timed {
        view: MarketView::new(),
        stamps,
        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)?,
        unstamped: 0,
    };
    let mut idler = Idler::new(idle);
    let mut last = None;
    let deadline = t0 + Duration::from_secs(50) + Duration::from_secs(a.messages / a.rate.max(1));
    while last.is_none_or(|l| app.view.last_seq() < l) {
        idler.idle(sub.poll(Mono::from_nanos(clock::now()), &mut app, 64)?);
        if last.is_none() {
            last = last_rx.try_recv().ok();
        }
        if std::time::Instant::now() > deadline {
            stop.store(true, Ordering::Release);
            bail!(
                "the subscriber got {} of {last:?} messages in time: {:?}",
                app.view.last_seq(),
                sub.counters()
            );
        }
    }
    // ORDERING: Release, pairs with the feed handler's Acquire load.
    stop.store(true, Ordering::Release);
    let ex = exchange
        .join()
        .map_err(|_| anyhow::anyhow!("exchange thread panicked"))??;
    feed.join()
        .map_err(|_| anyhow::anyhow!("feed handler thread panicked"))??;
    let s = Summary::of(&app.hist);
    println!(
        "feed-e2e: {} ITCH messages at {}/s, {} normalized messages; MoldUDP64 packet received → subscriber handler\n{s:?}",
        a.messages,
        a.rate,
        app.view.last_seq()
    );
    println!(
        "exchange: {ex:?}; subscriber: {:?}; view: {:?}; unstamped: {}",
        sub.counters(),
        app.view.counters(),
        app.unstamped
    );
    rocebus_bench::report::emit_result(&s.result_line());
    Ok(())
}
