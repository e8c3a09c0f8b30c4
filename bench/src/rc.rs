//! Orders-path harnesses: `rc-latency` (ping-pong, RTT/2 like
//! `ib_write_lat`) and `rc-throughput` (64-byte messages per second like
//! `ib_write_bw`). Both sides run in one process on two threads, each
//! busy-polling its own connection. `rc-fanin`: the one-way latency of one
//! active engine among N connected idle ones, through the fan-in summary
//! (and scanning every ring, for comparison).

use crate::report::Summary;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rocebus::orders::{
    ConnId, Connection, ConnectionSet, OfferError, OrdersConfig, OrdersError, OrdersListener,
    PeerLost,
};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Options shared by the orders-path harnesses.
#[derive(Debug, Clone, clap::Args)]
pub struct RcArgs {
    /// Payload bytes per message.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Round trips (latency) or messages (throughput).
    #[arg(long, short = 'n', default_value_t = 10_000)]
    pub iterations: u64,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port.
    #[arg(long, default_value_t = 7500)]
    pub port: u16,
    /// Frames per flush (throughput).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Pin the two threads to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// rc-latency diagnostic: also print one `TRACE` line per round trip
    /// (index, RTT/2 in ns, and per side the empty polls waited and the
    /// credit writes posted in that round trip), to look for periodic slow
    /// round trips. Off by default: it adds a counter per poll and a store
    /// per message on both sides.
    #[arg(long)]
    pub trace: bool,
    /// Two hosts, this one the server: listen on `--addr`:`--port` (the
    /// echo for rc-latency, the receiver for rc-throughput), serve one
    /// client, then exit. perftest's counterpart runs with no address.
    #[arg(long, conflicts_with = "client")]
    pub server: bool,
    /// Two hosts, this one the client: connect to the server at HOST (its
    /// `--addr`), retrying for `--connect-secs` while it starts; the client
    /// prints the figures, like perftest's client.
    #[arg(long, value_name = "HOST")]
    pub client: Option<IpAddr>,
    /// How long `--client` keeps retrying and `--server` waits for its client.
    #[arg(long, default_value_t = 120)]
    pub connect_secs: u64,
    /// Registered memory on 2 MiB huge pages (`[rdma] hugepages` of the services); the
    /// guest needs free ones (`cargo xtask bench NAME --hugepages` reserves them).
    #[arg(long, value_enum, default_value_t = crate::pages::Pages::Off)]
    pub hugepages: crate::pages::Pages,
}

/// Which ends of a harness this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// Both, on two threads (one host).
    Both,
    /// The server alone (`--server`).
    Server,
    /// The client alone, connecting to this host (`--client HOST`).
    Client(IpAddr),
}

impl RcArgs {
    fn ends(&self) -> Ends {
        match (self.server, self.client) {
            (true, _) => Ends::Server,
            (false, Some(h)) => Ends::Client(h),
            (false, None) => Ends::Both,
        }
    }

    /// Refuses `--server`/`--client` in a harness that runs on one host only.
    pub fn one_host_only(&self, name: &str) -> Result<()> {
        if self.ends() != Ends::Both {
            bail!("{name} runs both ends in one process: --server/--client do not apply");
        }
        Ok(())
    }
}

/// Connects to the server at `addr`, retrying while it is not listening yet
/// (the two hosts start their scripts at about the same time).
fn connect_retrying(addr: SocketAddr, secs: u64) -> Result<Connection> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        match Connection::connect(&config(), addr) {
            Ok(c) => return Ok(c),
            Err(e) if Instant::now() < deadline => {
                eprintln!("connecting to {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("no server at {addr} within {secs} s"))
            }
        }
    }
}

/// Accepts one client on this thread (`--server`).
fn accept_one(addr: SocketAddr, secs: u64) -> Result<Connection> {
    let mut l = OrdersListener::bind(config(), addr)?;
    eprintln!("listening on {addr}");
    l.accept(Duration::from_secs(secs))?
        .with_context(|| format!("no client within {secs} s"))
}

/// The local IP of the RDMA device: `a`, else `ROCEBUS_GUEST_ADDR`, else the
/// address of the device's first RoCE v2 IPv4 GID (or of `ROCEBUS_GID_INDEX`).
pub fn local_ip(a: Option<IpAddr>) -> Result<IpAddr> {
    if let Some(a) = a {
        return Ok(a);
    }
    if let Some(a) = std::env::var("ROCEBUS_GUEST_ADDR")
        .ok()
        .and_then(|a| a.parse().ok())
    {
        return Ok(a);
    }
    let ctx = rocebus::verbs::Context::open(None)?;
    let i = ctx.default_gid_index(1)?;
    ctx.query_gid(1, i)?
        .ipv4()
        .map(IpAddr::V4)
        .context("the RDMA device has no IPv4 GID: pass --addr")
}

fn config() -> OrdersConfig {
    OrdersConfig {
        ring_size: 1 << 20,
        max_payload: 4096,
        token: "bench".into(),
        ..OrdersConfig::default()
    }
}

fn pin(cores: &[usize], i: usize) {
    if let Some(c) = cores.get(i) {
        if !rocebus::idle::pin_current_thread(*c) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

/// Accepts one connection on a thread and runs `server` on it.
fn serve<F>(addr: SocketAddr, server: F) -> Result<std::thread::JoinHandle<Result<()>>>
where
    F: FnOnce(Connection) -> Result<()> + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || -> Result<()> {
        let mut l = OrdersListener::bind(config(), addr)?;
        tx.send(()).ok();
        let conn = l
            .accept(Duration::from_secs(30))?
            .context("no client within 30 s")?;
        server(conn)
    });
    rx.recv().context("server thread failed to listen")?;
    Ok(h)
}

fn wait_lost(conn: &mut Connection) -> Result<()> {
    let t = Instant::now();
    loop {
        match conn.subscription().poll(|_| {}, 16) {
            Ok(_) => {}
            Err(OrdersError::PeerLost(PeerLost::Disconnected)) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        if t.elapsed() > Duration::from_secs(30) {
            bail!("peer never disconnected");
        }
    }
}

/// Ping-pong: the client sends a message, the server echoes it, the
/// client records RTT/2 (what ib_write_lat reports).
pub fn latency(args: &RcArgs) -> Result<()> {
    args.hugepages.apply();
    if args.trace {
        return latency_traced(args);
    }
    let (mut conn, server) = match args.ends() {
        Ends::Server => {
            let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
            let mut conn = accept_one(addr, args.connect_secs)?;
            pin(&args.cores, 0);
            let echoed = echo(&mut conn)?;
            crate::pages::report("rc-latency server");
            println!("rc-latency server: echoed {echoed} messages");
            return Ok(());
        }
        Ends::Client(host) => {
            let conn = connect_retrying(SocketAddr::new(host, args.port), args.connect_secs)?;
            (conn, None)
        }
        Ends::Both => {
            let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
            let cores = args.cores.clone();
            let server = serve(addr, move |mut conn| {
                pin(&cores, 1);
                echo(&mut conn).map(|_| ())
            })?;
            (Connection::connect(&config(), addr)?, Some(server))
        }
    };
    pin(&args.cores, 0);
    let msg = vec![0x5au8; args.size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let warmup = (args.iterations / 10).max(100);
    for i in 0..warmup + args.iterations {
        let t0 = Instant::now();
        conn.publication(1).offer_and_flush(1, &msg)?;
        loop {
            if conn.subscription().poll(|_| {}, 1)? == 1 {
                break;
            }
        }
        let rtt = t0.elapsed().as_nanos() as u64;
        if i >= warmup {
            hist.record((rtt / 2).max(1))?;
        }
    }
    crate::pages::report("rc-latency");
    let stats = conn.stats();
    conn.close();
    drop(conn);
    if let Some(server) = server {
        server
            .join()
            .map_err(|_| anyhow::anyhow!("server panicked"))??;
    }
    let s = Summary::of(&hist);
    println!(
        "rc-latency: {} B, {} round trips, one-way (RTT/2)\n{s}",
        args.size, args.iterations
    );
    println!(
        "client: {} frames sent, {} received, {} credit writes",
        stats.frames_sent, stats.frames_received, stats.credits_sent
    );
    crate::report::emit_result(&s.result_line());
    Ok(())
}

/// What one side of the traced ping-pong noted about one round trip.
#[derive(Debug, Clone, Copy, Default)]
struct Turn {
    /// Polls that found nothing before the message arrived.
    empty_polls: u32,
    /// Credit writes this side posted during the round trip.
    credits: u32,
}

/// [`latency`] with `--trace`: the same ping-pong, plus per round trip
/// the client's and the echo's empty polls and credit writes, printed as
/// `TRACE index rtt2_ns c_empty c_credits s_empty s_credits` lines (warm-up
/// included, its indices first), then the usual summary. A diagnostic:
/// the counting is not free, so its figures are not the benchmark's.
fn latency_traced(args: &RcArgs) -> Result<()> {
    args.one_host_only("rc-latency --trace")?;
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let cores = args.cores.clone();
    let warmup = (args.iterations / 10).max(100);
    let total = (warmup + args.iterations) as usize;
    let (tx, rx) = std::sync::mpsc::channel();
    let server = serve(addr, move |mut conn| {
        pin(&cores, 1);
        let mut turns = vec![Turn::default(); total];
        let mut buf = [0u8; 4096];
        let (mut i, mut empty) = (0usize, 0u32);
        loop {
            let mut got = 0usize;
            match conn.subscription().poll(
                |f| {
                    got = f.payload.len();
                    buf[..got].copy_from_slice(f.payload);
                },
                1,
            ) {
                Ok(0) => empty += 1,
                Ok(_) => {
                    let before = conn.stats().credits_sent;
                    conn.publication(2).offer_and_flush(1, &buf[..got])?;
                    if let Some(t) = turns.get_mut(i) {
                        *t = Turn {
                            empty_polls: empty,
                            credits: (conn.stats().credits_sent - before) as u32,
                        };
                    }
                    i += 1;
                    empty = 0;
                }
                Err(OrdersError::PeerLost(PeerLost::Disconnected)) => break,
                Err(e) => return Err(e.into()),
            }
        }
        tx.send(turns).ok();
        Ok(())
    })?;
    let mut conn = Connection::connect(&config(), addr)?;
    pin(&args.cores, 0);
    let msg = vec![0x5au8; args.size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut rtts = vec![0u64; total];
    let mut turns = vec![Turn::default(); total];
    for i in 0..total {
        let before = conn.stats().credits_sent;
        let mut empty = 0u32;
        let t0 = Instant::now();
        conn.publication(1).offer_and_flush(1, &msg)?;
        while conn.subscription().poll(|_| {}, 1)? == 0 {
            empty += 1;
        }
        let rtt2 = (t0.elapsed().as_nanos() as u64 / 2).max(1);
        rtts[i] = rtt2;
        turns[i] = Turn {
            empty_polls: empty,
            credits: (conn.stats().credits_sent - before) as u32,
        };
        if i as u64 >= warmup {
            hist.record(rtt2)?;
        }
    }
    conn.close();
    drop(conn);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    let echo = rx.recv().context("the echo's trace")?;
    for (i, (r, (c, s))) in rtts.iter().zip(turns.iter().zip(&echo)).enumerate() {
        println!(
            "TRACE {i} {r} {} {} {} {}",
            c.empty_polls, c.credits, s.empty_polls, s.credits
        );
    }
    let s = Summary::of(&hist);
    println!(
        "rc-latency (traced, warm-up {warmup}): {} B, {} round trips, one-way (RTT/2)\n{s}",
        args.size, args.iterations
    );
    crate::report::emit_result(&s.result_line());
    Ok(())
}

/// The receiving end of rc-throughput: counts `n` messages of `size` bytes,
/// timed from the first to the last; returns (count, wrong lengths, seconds)
/// once all arrived (the caller then waits for the sender to disconnect).
fn receive(conn: &mut Connection, n: u64, size: usize) -> Result<(u64, u64, f64)> {
    let mut count = 0u64;
    let mut bad = 0u64;
    let mut start = None;
    while count < n {
        conn.subscription().poll(
            |f| {
                if f.payload.len() != size {
                    bad += 1;
                }
                count += 1;
            },
            256,
        )?;
        if count > 0 && start.is_none() {
            start = Some(Instant::now());
        }
    }
    Ok((count, bad, start.map_or(0.0, |s| s.elapsed().as_secs_f64())))
}

/// One-way stream of messages, flushed `batch` at a time; the rate is
/// measured at the receiver from first to last message. Across two hosts
/// the receiver is the server and prints the rate (the sender only knows
/// when its ring drained).
pub fn throughput(args: &RcArgs) -> Result<()> {
    args.hugepages.apply();
    let n = args.iterations;
    let size = args.size;
    let (tx, rx) = std::sync::mpsc::channel();
    let (mut conn, server) = match args.ends() {
        Ends::Server => {
            let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
            let mut conn = accept_one(addr, args.connect_secs)?;
            pin(&args.cores, 0);
            let (count, bad, secs) = receive(&mut conn, n, size)?;
            wait_lost(&mut conn)?;
            return report_throughput(count, bad, secs, n, size, None);
        }
        Ends::Client(host) => {
            let conn = connect_retrying(SocketAddr::new(host, args.port), args.connect_secs)?;
            (conn, None)
        }
        Ends::Both => {
            let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
            let cores = args.cores.clone();
            let server = serve(addr, move |mut conn| {
                pin(&cores, 1);
                tx.send(receive(&mut conn, n, size)?).ok();
                wait_lost(&mut conn)
            })?;
            (Connection::connect(&config(), addr)?, Some(server))
        }
    };
    pin(&args.cores, 0);
    let msg = vec![0x5au8; size];
    let mut pending = 0;
    let mut backpressured = 0u64;
    for _ in 0..n {
        loop {
            match conn.offer(1, 1, &msg) {
                Ok(()) => break,
                Err(OfferError::BackPressured) => {
                    backpressured += 1;
                    conn.flush()?;
                    pending = 0;
                    conn.subscription().poll(|_| {}, 1)?;
                }
                Err(e) => return Err(e.into()),
            }
        }
        pending += 1;
        if pending >= args.batch {
            conn.flush()?;
            pending = 0;
        }
    }
    conn.flush()?;
    if !conn.drain(Duration::from_secs(120))? {
        bail!("receiver did not consume everything within 120 s");
    }
    let stats = conn.stats();
    conn.close();
    drop(conn);
    let Some(server) = server else {
        println!(
            "rc-throughput client: sent {n} x {size} B, {} flushes, back-pressured {backpressured} times; the server prints the rate",
            stats.flushes
        );
        return Ok(());
    };
    let (count, bad, secs) = rx
        .recv_timeout(Duration::from_secs(60))
        .context("receiver result")?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    report_throughput(
        count,
        bad,
        secs,
        n,
        size,
        Some((stats.flushes, backpressured)),
    )
}

/// Prints rc-throughput's figures and `RESULT` line (the sender's flush
/// counts when this process was the sender too).
fn report_throughput(
    count: u64,
    bad: u64,
    secs: f64,
    n: u64,
    size: usize,
    sender: Option<(u64, u64)>,
) -> Result<()> {
    if bad > 0 || count != n {
        bail!("receiver got {count} of {n} messages, {bad} with a wrong length");
    }
    let rate = count as f64 / secs.max(1e-9);
    match sender {
        Some((flushes, backpressured)) => {
            println!(
                "rc-throughput: {count} x {size} B in {secs:.3} s, {rate:.0} msg/s, {flushes} flushes, back-pressured {backpressured} times"
            );
            crate::report::emit_result(&format!(
                "RESULT msgs_per_sec={rate:.1} lost=0 flushes={flushes}"
            ));
        }
        None => {
            println!("rc-throughput server: {count} x {size} B in {secs:.3} s, {rate:.0} msg/s");
            crate::report::emit_result(&format!("RESULT msgs_per_sec={rate:.1} lost=0"));
        }
    }
    Ok(())
}

/// Options of `rc-fanin`.
#[derive(Debug, Clone, clap::Args)]
pub struct FanInArgs {
    /// Payload bytes per message.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Round trips per connection count and mode.
    #[arg(long, short = 'n', default_value_t = 5_000)]
    pub iterations: u64,
    /// Connection counts (one active engine among them, the rest idle).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub conns: Vec<usize>,
    /// Ring bytes of every connection (small, so hundreds fit the guest).
    #[arg(long, default_value_t = 64 << 10)]
    pub ring: usize,
    /// Alternating fan-in / scan-all measurements per connection count.
    #[arg(long, default_value_t = 1)]
    pub rounds: u32,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port.
    #[arg(long, default_value_t = 7520)]
    pub port: u16,
    /// Pin the two threads to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
}

/// What the receiving thread of `rc-fanin` does.
const MODE_ACCEPT: u8 = 0;
const MODE_FANIN: u8 = 1;
const MODE_SCAN: u8 = 2;
const MODE_STOP: u8 = 3;

fn fanin_config(args: &FanInArgs, slots: usize) -> OrdersConfig {
    OrdersConfig {
        ring_size: args.ring,
        max_payload: 1024,
        token: "bench".into(),
        send_queue_depth: 64,
        signal_every: 16,
        fanin_slots: slots,
        max_connections_per_peer: 2 * slots + 2,
        ..OrdersConfig::default()
    }
}

/// Echoes every frame back on its own connection, polling either through
/// the fan-in summary ([`ConnectionSet::poll`]) or every connection in
/// turn (the scan the fan-in replaces), as `mode` says; accepts new
/// connections in between.
fn fanin_server(
    mut listener: OrdersListener,
    mode: &std::sync::atomic::AtomicU8,
    count: &std::sync::atomic::AtomicUsize,
) -> Result<rocebus::orders::SetStats> {
    use std::sync::atomic::Ordering;
    let mut set = ConnectionSet::new(&listener);
    let mut ids = Vec::new();
    let mut replies: Vec<(ConnId, usize)> = Vec::with_capacity(64);
    let mut buf = vec![0u8; 1024];
    loop {
        // ORDERING: Relaxed: a mode switch carries no data; the client
        // switches only between round trips.
        match mode.load(Ordering::Relaxed) {
            MODE_ACCEPT => {
                if let Some(c) = listener.accept(Duration::from_millis(1))? {
                    ids.push(set.insert(c));
                    // ORDERING: Release, pairs with the client's Acquire
                    // wait for the connection count.
                    count.store(set.len(), Ordering::Release);
                }
                continue;
            }
            MODE_STOP => return Ok(set.stats()),
            MODE_FANIN => {
                set.poll(
                    |id, f| {
                        buf[..f.payload.len()].copy_from_slice(f.payload);
                        replies.push((id, f.payload.len()));
                    },
                    16,
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            }
            _ => {
                for &id in &ids {
                    let c = set.get_mut(id).context("member")?;
                    c.subscription().poll(
                        |f| {
                            buf[..f.payload.len()].copy_from_slice(f.payload);
                            replies.push((id, f.payload.len()));
                        },
                        16,
                    )?;
                }
            }
        }
        for &(id, len) in &replies {
            let c = set.get_mut(id).context("member")?;
            c.publication(2).offer_and_flush(1, &buf[..len])?;
        }
        replies.clear();
    }
}

/// `rc-fanin`: one-way latency (RTT/2) of one active engine among N
/// connected idle ones, through the fan-in summary and, for comparison,
/// scanning every connection; prints each N's percentiles and the ratios
/// against N = 1.
pub fn fanin(args: &FanInArgs) -> Result<()> {
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    use std::sync::Arc;
    let max_n = args.conns.iter().copied().max().unwrap_or(1).max(1);
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let cfg = fanin_config(args, max_n);
    cfg.validate().map_err(|e| anyhow::anyhow!(e))?;
    let listener = OrdersListener::bind(cfg.clone(), addr)?;
    let mode = Arc::new(AtomicU8::new(MODE_ACCEPT));
    let count = Arc::new(AtomicUsize::new(0));
    let (m2, c2, cores) = (mode.clone(), count.clone(), args.cores.clone());
    let server = std::thread::spawn(move || {
        pin(&cores, 1);
        fanin_server(listener, &m2, &c2)
    });
    let wait_count = |n: usize| -> Result<()> {
        let t = Instant::now();
        // ORDERING: Acquire, pairs with the server's Release store.
        while count.load(Ordering::Acquire) < n {
            if t.elapsed() > Duration::from_secs(60) || server.is_finished() {
                bail!("the receiver did not accept connection {n}");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    };
    let mut active = Connection::connect(&cfg, addr)?;
    wait_count(1)?;
    let mut idle: Vec<Connection> = Vec::new();
    let msg = vec![0x5au8; args.size];
    let warmup = (args.iterations / 10).max(100);
    let mut ping = |hist: &mut Histogram<u64>| -> Result<()> {
        for i in 0..warmup + args.iterations {
            let t0 = Instant::now();
            active.publication(1).offer_and_flush(1, &msg)?;
            let t = Instant::now();
            while active.subscription().poll(|_| {}, 1)? == 0 {
                if t.elapsed() > Duration::from_secs(10) {
                    bail!("no echo within 10 s");
                }
            }
            let rtt = t0.elapsed().as_nanos() as u64;
            if i >= warmup {
                hist.record((rtt / 2).max(1))?;
            }
        }
        Ok(())
    };
    pin(&args.cores, 0);
    let mut rows = Vec::new();
    let mut rss_before = None;
    for &n in &args.conns {
        let n = n.max(1);
        // ORDERING: Relaxed: see fanin_server.
        mode.store(MODE_ACCEPT, Ordering::Relaxed);
        if rss_before.is_none() {
            rss_before = Some((rss_kib(), 1 + idle.len()));
        }
        while 1 + idle.len() < n {
            idle.push(Connection::connect(&cfg, addr)?);
            wait_count(1 + idle.len())?;
        }
        let mut fan = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        let mut scan = fan.clone();
        for _ in 0..args.rounds.max(1) {
            mode.store(MODE_FANIN, Ordering::Relaxed);
            ping(&mut fan)?;
            mode.store(MODE_SCAN, Ordering::Relaxed);
            ping(&mut scan)?;
        }
        let (f, s) = (Summary::of(&fan), Summary::of(&scan));
        println!(
            "rc-fanin N={n}: fan-in p50 {} ns p99 {} ns | scan-all p50 {} ns p99 {} ns",
            f.p50_ns, f.p99_ns, s.p50_ns, s.p99_ns
        );
        rows.push((n, f, s));
    }
    let rss_after = (rss_kib(), 1 + idle.len());
    mode.store(MODE_STOP, Ordering::Relaxed);
    let stats = server
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    drop(idle);
    active.close();
    println!(
        "receiver: {} scans, {} marked visits ({} found nothing), {} sweeps",
        stats.scan.scans, stats.scan.visits, stats.scan.wasted, stats.sweeps
    );
    let page = |b: usize| b.div_ceil(4096) * 4096;
    let ring_b = page(args.ring + rocebus::ring::frame::CONTROL_LEN);
    let staging_b = page(args.ring);
    if let Some((before, n0)) = rss_before {
        let added = rss_after.1.saturating_sub(n0).max(1);
        println!(
            "memory per connection end: ring {} KiB + staging {} KiB registered (ring_size {} KiB, \
             send queue {} WRs); resident growth {:.0} KiB per connection with both ends in this \
             process (ring, staging, queue pair, completion queue, contexts)",
            ring_b / 1024,
            staging_b / 1024,
            args.ring / 1024,
            cfg.send_queue_depth,
            rss_after.0.saturating_sub(before) as f64 / added as f64
        );
    }
    let Some((_, base_f, base_s)) = rows.iter().find(|r| r.0 == 1).cloned() else {
        bail!("--conns must include 1 (the baseline)");
    };
    for (n, f, s) in &rows {
        if *n == 1 {
            continue;
        }
        println!(
            "rc-fanin (scan-all, for reference): N={n} p50 ratio {:.2}, p99 ratio {:.2}",
            s.p50_ns as f64 / base_s.p50_ns.max(1) as f64,
            s.p99_ns as f64 / base_s.p99_ns.max(1) as f64
        );
        println!(
            "rc-fanin: N={n} p50 ratio {:.2}, p99 ratio {:.2}",
            f.p50_ns as f64 / base_f.p50_ns.max(1) as f64,
            f.p99_ns as f64 / base_f.p99_ns.max(1) as f64
        );
    }
    Ok(())
}

/// Resident set size of this process, KiB (0 if unknown).
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Senders of `rc-fanin-throughput`.
const FANIN_SENDERS: usize = 4;

/// `rc-fanin-throughput`: four senders, each on its own connection and
/// thread, into one receiver polling them through the fan-in summary
/// ([`ConnectionSet`]); the total rate is measured at the receiver from
/// its first message to its last (compare `ib_write_bw -q 4`).
pub fn fanin_throughput(args: &RcArgs) -> Result<()> {
    args.one_host_only("rc-fanin-throughput")?;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let per = (args.iterations / FANIN_SENDERS as u64).max(1);
    let n = per * FANIN_SENDERS as u64;
    let size = args.size.max(8);
    let cfg = OrdersConfig {
        fanin_slots: 16,
        ..config()
    };
    let mut listener = OrdersListener::bind(cfg.clone(), addr)?;
    let done = Arc::new(AtomicBool::new(false));
    let done2 = done.clone();
    let cores = args.cores.clone();
    let server = std::thread::spawn(
        move || -> Result<(u64, u64, f64, rocebus::orders::SetStats)> {
            pin(&cores, 1);
            let mut set = ConnectionSet::new(&listener);
            while set.len() < FANIN_SENDERS {
                let c = listener
                    .accept(Duration::from_secs(30))?
                    .context("a sender did not connect within 30 s")?;
                set.insert(c);
            }
            // Per connection: the next sequence its payloads carry.
            let mut next = [0u64; FANIN_SENDERS * 2];
            let (mut count, mut bad) = (0u64, 0u64);
            let mut start = None;
            let t = Instant::now();
            while count < n {
                set.poll(
                    |id, f| {
                        let seq = f
                            .payload
                            .get(..8)
                            .map_or(u64::MAX, |b| u64::from_le_bytes(b.try_into().expect("8")));
                        match next.get_mut(id) {
                            Some(x) if *x == seq && f.payload.len() == size => *x += 1,
                            _ => bad += 1,
                        }
                        count += 1;
                    },
                    256,
                )
                .map_err(|e| anyhow::anyhow!("{e}"))?;
                if count > 0 && start.is_none() {
                    start = Some(Instant::now());
                }
                if t.elapsed() > Duration::from_secs(300) {
                    bail!("received {count} of {n} messages in 300 s");
                }
            }
            let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
            // ORDERING: Release, pairs with the senders' Acquire: they close only now.
            done2.store(true, Ordering::Release);
            let st = set.stats();
            // Keep returning credit until the senders have drained and gone.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(1) {
                let _ = set.poll(|_, _| {}, 256);
            }
            Ok((count, bad, secs, st))
        },
    );
    let mut senders = Vec::new();
    for i in 0..FANIN_SENDERS {
        let (cfg, done, cores, batch) = (cfg.clone(), done.clone(), args.cores.clone(), args.batch);
        senders.push(std::thread::spawn(move || -> Result<u64> {
            pin(&cores, 2 + i);
            let mut conn = Connection::connect(&cfg, addr)?;
            if !conn.marks_fanin() {
                bail!("sender {i}: the listener granted no fan-in slot");
            }
            let mut msg = vec![0x5au8; size];
            let mut pending = 0;
            let mut backpressured = 0u64;
            for seq in 0..per {
                msg[..8].copy_from_slice(&seq.to_le_bytes());
                loop {
                    match conn.offer(1, 1, &msg) {
                        Ok(()) => break,
                        Err(OfferError::BackPressured) => {
                            backpressured += 1;
                            conn.flush()?;
                            pending = 0;
                            conn.subscription().poll(|_| {}, 1)?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                pending += 1;
                if pending >= batch {
                    conn.flush()?;
                    pending = 0;
                }
            }
            conn.flush()?;
            if !conn.drain(Duration::from_secs(120))? {
                bail!("sender {i}: the receiver did not consume everything within 120 s");
            }
            let t = Instant::now();
            // ORDERING: Acquire, pairs with the receiver's Release.
            while !done.load(Ordering::Acquire) && t.elapsed() < Duration::from_secs(120) {
                conn.subscription().poll(|_| {}, 16)?;
                std::thread::yield_now();
            }
            conn.close();
            Ok(backpressured)
        }));
    }
    let mut backpressured = 0;
    for s in senders {
        backpressured += s.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    let (count, bad, secs, st) = server
        .join()
        .map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    if bad > 0 || count != n {
        bail!("receiver got {count} of {n} messages, {bad} out of order or of a wrong length");
    }
    let rate = count as f64 / secs.max(1e-9);
    println!(
        "rc-fanin-throughput: {FANIN_SENDERS} senders, {count} x {size} B in {secs:.3} s, {rate:.0} msg/s, \
         back-pressured {backpressured} times; receiver {} scans, {} marked visits ({} found nothing), {} sweeps",
        st.scan.scans, st.scan.visits, st.scan.wasted, st.sweeps
    );
    crate::report::emit_result(&format!("RESULT msgs_per_sec={rate:.1} lost=0"));
    Ok(())
}

/// Options of `rc-ping` and `rc-pong`, the two processes of the
/// ping-pong `cargo xtask bench rc-instructions` runs under callgrind.
#[derive(Debug, Clone, clap::Args)]
pub struct PingArgs {
    /// Payload bytes per message.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Round trips (rc-ping; rc-pong echoes until the client disconnects).
    #[arg(long, short = 'n', default_value_t = 10_000)]
    pub iterations: u64,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port.
    #[arg(long, default_value_t = 7510)]
    pub port: u16,
}

/// Echoes every frame on stream 2 (type 1) until the peer disconnects;
/// returns how many. The far end of the latency ping-pongs.
fn echo(conn: &mut Connection) -> Result<u64> {
    let mut buf = [0u8; 4096];
    let mut echoed = 0u64;
    loop {
        let mut got = 0usize;
        match conn.subscription().poll(
            |f| {
                got = f.payload.len();
                buf[..got].copy_from_slice(f.payload);
            },
            1,
        ) {
            Ok(0) => continue,
            Ok(_) => {
                conn.publication(2).offer_and_flush(1, &buf[..got])?;
                echoed += 1;
            }
            Err(OrdersError::PeerLost(PeerLost::Disconnected)) => return Ok(echoed),
            Err(e) => return Err(e.into()),
        }
    }
}

/// `rc-pong`: accepts one connection and echoes every frame until the
/// client disconnects (the native peer of `rc-ping`).
pub fn pong(args: &PingArgs) -> Result<()> {
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let mut l = OrdersListener::bind(config(), addr)?;
    println!("rc-pong: listening on {addr}");
    let mut conn = l
        .accept(Duration::from_secs(900))?
        .context("no client within 900 s")?;
    let echoed = echo(&mut conn)?;
    println!("rc-pong: echoed {echoed} messages");
    Ok(())
}

/// `rc-ping`: connects to `rc-pong`, sends a message and waits for its
/// echo, `-n` times, then disconnects. Nothing else: no clock reads, no
/// warm-up, no statistics, so that under callgrind the instructions are the
/// orders path's (set-up and teardown cancel out between runs of N and 2N
/// round trips).
pub fn ping(args: &PingArgs) -> Result<()> {
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    // Under callgrind the handshake runs some 50 times slower.
    let cfg = OrdersConfig {
        connect_timeout_ms: 30_000,
        ..config()
    };
    let mut conn = Connection::connect(&cfg, addr)?;
    let msg = vec![0x5au8; args.size];
    let empty = ping_loop(&mut conn, &msg, args.iterations)?;
    let stats = conn.stats();
    conn.close();
    println!(
        "rc-ping: {} round trips of {} B, {empty} empty polls, {} frames received, {} credit writes, {} flushes",
        args.iterations, args.size, stats.frames_received, stats.credits_sent, stats.flushes
    );
    crate::report::emit_result(&format!(
        "RESULT round_trips={} empty_polls={empty} credits_sent={}",
        args.iterations, stats.credits_sent
    ));
    Ok(())
}

/// The measured loop of `rc-ping`: offer and flush one message, poll until
/// its echo arrives; returns the empty polls (the wait).
#[inline(never)]
fn ping_loop(conn: &mut Connection, msg: &[u8], n: u64) -> Result<u64> {
    let mut empty = 0u64;
    for _ in 0..n {
        conn.publication(1).offer_and_flush(1, msg)?;
        while conn.subscription().poll(|_| {}, 1)? == 0 {
            empty += 1;
        }
    }
    Ok(empty)
}
