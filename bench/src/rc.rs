//! Orders-path harnesses: `rc-latency` (ping-pong, RTT/2 like
//! `ib_write_lat`) and `rc-throughput` (64-byte messages per second like
//! `ib_write_bw`). Both sides run in one process on two threads, each
//! busy-polling its own connection.

use crate::report::Summary;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rocebus::orders::{
    Connection, OfferError, OrdersConfig, OrdersError, OrdersListener, PeerLost,
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
}

/// The local IP of the RDMA device: `a`, else `ROCEBUS_GUEST_ADDR`, else the
/// device's first IPv4-mapped GID.
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
        let l = OrdersListener::bind(addr, config())?;
        tx.send(()).ok();
        let conn = l
            .accept(Duration::from_secs(30))?
            .context("no client within 30 s")?;
        server(conn)
    });
    rx.recv().context("server thread failed to listen")?;
    Ok(h)
}

fn wait_lost(conn: &Connection) -> Result<()> {
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
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let cores = args.cores.clone();
    let server = serve(addr, move |conn| {
        pin(&cores, 1);
        let sub = conn.subscription();
        let echo = conn.publication(2);
        let mut buf = [0u8; 4096];
        loop {
            let mut got = 0usize;
            match sub.poll(
                |f| {
                    got = f.payload.len();
                    buf[..got].copy_from_slice(f.payload);
                },
                1,
            ) {
                Ok(0) => continue,
                Ok(_) => echo
                    .offer_and_flush(1, &buf[..got])
                    .map_err(anyhow::Error::from)?,
                Err(OrdersError::PeerLost(PeerLost::Disconnected)) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
    })?;
    let conn = Connection::connect(addr, &config(), Duration::from_secs(10))?;
    pin(&args.cores, 0);
    let p = conn.publication(1);
    let sub = conn.subscription();
    let msg = vec![0x5au8; args.size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let warmup = (args.iterations / 10).max(100);
    for i in 0..warmup + args.iterations {
        let t0 = Instant::now();
        p.offer_and_flush(1, &msg)?;
        loop {
            if sub.poll(|_| {}, 1)? == 1 {
                break;
            }
        }
        let rtt = t0.elapsed().as_nanos() as u64;
        if i >= warmup {
            hist.record((rtt / 2).max(1))?;
        }
    }
    let stats = conn.stats();
    conn.close();
    drop(conn);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    let s = Summary::of(&hist);
    println!(
        "rc-latency: {} B, {} round trips, one-way (RTT/2)\n{s}",
        args.size, args.iterations
    );
    println!(
        "client: {} frames sent, {} received, {} credit writes",
        stats.frames_sent, stats.frames_received, stats.credits_sent
    );
    println!("{}", s.result_line());
    Ok(())
}

/// One-way stream of messages, flushed `batch` at a time; the rate is
/// measured at the receiver from first to last message.
pub fn throughput(args: &RcArgs) -> Result<()> {
    let addr = SocketAddr::new(local_ip(args.addr)?, args.port);
    let n = args.iterations;
    let size = args.size;
    let cores = args.cores.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let server = serve(addr, move |conn| {
        pin(&cores, 1);
        let sub = conn.subscription();
        let mut count = 0u64;
        let mut bad = 0u64;
        let mut start = None;
        while count < n {
            sub.poll(
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
        let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
        tx.send((count, bad, secs)).ok();
        wait_lost(&conn)
    })?;
    let conn = Connection::connect(addr, &config(), Duration::from_secs(10))?;
    pin(&args.cores, 0);
    let p = conn.publication(1);
    let msg = vec![0x5au8; size];
    let mut pending = 0;
    let mut backpressured = 0u64;
    for _ in 0..n {
        loop {
            match p.offer(1, &msg) {
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
    let (count, bad, secs) = rx
        .recv_timeout(Duration::from_secs(60))
        .context("receiver result")?;
    server
        .join()
        .map_err(|_| anyhow::anyhow!("server panicked"))??;
    if bad > 0 || count != n {
        bail!("receiver got {count} of {n} messages, {bad} with a wrong length");
    }
    let rate = count as f64 / secs.max(1e-9);
    println!(
        "rc-throughput: {count} x {size} B in {secs:.3} s, {rate:.0} msg/s, {} flushes, back-pressured {backpressured} times",
        stats.flushes
    );
    println!(
        "RESULT msgs_per_sec={rate:.1} lost=0 flushes={}",
        stats.flushes
    );
    Ok(())
}
