//! `md-fanout`: what one published message costs the publisher, on UD
//! multicast and on RC fan-out (`transport = "rc"`), with 1, 2 and 4
//! subscribers.
//!
//! The publisher thread publishes `-n` messages of `-s` bytes at a fixed
//! offered rate (`--rate` messages per second, in bursts of 64 followed by
//! one poll, sleeping until the next burst is due) and reads its own thread
//! CPU time (`CLOCK_THREAD_CPUTIME_ID`: user and kernel time) before and
//! after: the figure is that time divided by the messages. Sleeping between
//! bursts keeps idle polling out of it. Subscribers are threads of the same
//! process (one guest), each with its own queue pairs, delivering in order
//! into a handler that checks every sequence.
//!
//! On soft-RoCE the kernel's work of sending (the copy into each RC
//! connection, or the multicast loopback to each receiver) runs partly in
//! the posting thread's system calls and so is counted; on a NIC the
//! device does that part.

use crate::md::sink;
use crate::rc::local_ip;
use anyhow::{bail, Context, Result};
use rocebus::clock::Mono;
use rocebus::idle::{IdleStrategy, Idler};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{Handler, MdPublisher, MdSubscriber, RestoreError, Snapshot, SnapshotSink};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of `md-fanout`.
#[derive(Debug, Clone, clap::Args)]
pub struct FanoutArgs {
    /// Message bytes (at least 8: the sequence).
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Messages per configuration.
    #[arg(long, short = 'n', default_value_t = 50_000)]
    pub iterations: u64,
    /// Offered rate, messages per second.
    #[arg(long, default_value_t = 100_000)]
    pub rate: u64,
    /// Subscriber counts to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4])]
    pub subscribers: Vec<usize>,
    /// Transports to measure (`multicast`, `rc`).
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("multicast"), String::from("rc")])]
    pub transports: Vec<String>,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// First rdma_cm port (one per configuration).
    #[arg(long, default_value_t = 7900)]
    pub port: u16,
    /// Do not drop eth0's egress in a one-host guest (see `md-throughput`).
    #[arg(long)]
    pub no_sink: bool,
}

/// This thread's CPU time (user + system), nanoseconds.
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn config(transport: &str, i: usize, port: u16) -> Result<McastConfig> {
    let route = match transport {
        "multicast" => format!("line_a = \"239.9.7.{}\"", i + 1),
        "rc" => "transport = \"rc\"".to_owned(),
        other => bail!("unknown transport {other:?}: multicast or rc"),
    };
    Ok(McastConfig::from_toml_str(&format!(
        r#"
max_datagram_payload = 1024
history_depth = 16384
heartbeat_interval_ns = 1000000

[receive]
depth = 4096
replenish_batch = 32

[batching]
max_messages = 64
flush_interval_ns = 20000

[recovery]
timeout_ns = 50000000
max_retries = 20

[rc_fanout]
ring_size = 1048576
slow_subscriber_ns = 10000000000

[auth]
secret = "md-fanout bench"

[[channels]]
id = 1
name = "fanout"
{route}
port = {port}
"#
    ))?)
}

/// Counts in-order deliveries.
#[derive(Default)]
struct Count {
    next: u64,
    out_of_order: u64,
}

impl Handler for Count {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        let carried = msg
            .get(..8)
            .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
        if seq != self.next + 1 || carried != seq {
            self.out_of_order += 1;
        }
        self.next = seq;
    }
}

impl SnapshotSink for Count {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, seq: u64) -> Result<(), RestoreError> {
        self.next = seq;
        Ok(())
    }
}

/// The publisher's snapshot: just its sequence (subscribers join first).
struct Seq(u64);

impl Snapshot for Seq {
    fn snapshot_seq(&self) -> u64 {
        self.0
    }
    fn write_snapshot(&self, _: &mut Vec<u8>) {}
}

/// One configuration: publisher CPU ns per message.
fn one(cfg: &McastConfig, ip: IpAddr, subs: usize, args: &FanoutArgs) -> Result<f64> {
    let n = args.iterations;
    let connected = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for _ in 0..subs {
        let (cfg, connected, done, stop) =
            (cfg.clone(), connected.clone(), done.clone(), stop.clone());
        handles.push(std::thread::spawn(move || -> Result<(u64, u64)> {
            let t0 = Instant::now();
            let mut s = loop {
                match MdSubscriber::connect(&cfg, 1, ip, ip) {
                    Ok(s) => break s,
                    Err(e) if t0.elapsed() > Duration::from_secs(60) => {
                        return Err(e).context("subscriber")
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            };
            connected.fetch_add(1, Ordering::AcqRel);
            let mut app = Count::default();
            let mut idle = Idler::new(IdleStrategy::Yield);
            // ORDERING: Acquire, pairs with the publisher's Release store.
            while app.next < n && !stop.load(Ordering::Acquire) {
                idle.idle(s.poll(Mono::now(), &mut app, 64)?);
            }
            done.fetch_add(1, Ordering::AcqRel);
            s.disconnect();
            Ok((app.next, app.out_of_order))
        }));
    }
    let now = rocebus::clock::now_ns;
    let mut p = MdPublisher::new(cfg, 1, now(), ip)?;
    let mut snap = Seq(0);
    let t0 = Instant::now();
    while p.connections() < subs || connected.load(Ordering::Acquire) < subs {
        if t0.elapsed() > Duration::from_secs(90) {
            stop.store(true, Ordering::Release);
            bail!("only {} of {subs} subscribers connected", p.connections());
        }
        p.poll(Mono::from_nanos(now()), &snap)?;
    }
    let mut msg = vec![0u8; args.size.max(8)];
    const BURST: u64 = 64;
    let burst_ns = BURST * 1_000_000_000 / args.rate.max(1);
    let start = now();
    let cpu0 = thread_cpu_ns();
    let mut seq = 1;
    let mut due = start;
    while seq <= n {
        for _ in 0..BURST.min(n - seq + 1) {
            msg[..8].copy_from_slice(&seq.to_le_bytes());
            p.offer(Mono::from_nanos(now()), &msg)?;
            snap.0 = seq;
            seq += 1;
        }
        p.poll(Mono::from_nanos(now()), &snap)?;
        due += burst_ns;
        let t = now();
        if due > t {
            std::thread::sleep(Duration::from_nanos(due - t));
        }
    }
    p.flush(Mono::from_nanos(now()))?;
    p.poll(Mono::from_nanos(now()), &snap)?;
    let cpu = thread_cpu_ns() - cpu0;
    let wall = now() - start;
    // Not measured: serve until every subscriber has everything.
    let t0 = Instant::now();
    while done.load(Ordering::Acquire) < subs {
        if t0.elapsed() > Duration::from_secs(60) {
            break;
        }
        p.poll(Mono::from_nanos(now()), &snap)?;
        std::thread::yield_now();
    }
    // ORDERING: Release, pairs with the subscribers' Acquire loads.
    stop.store(true, Ordering::Release);
    for h in handles {
        let (got, ooo) = h
            .join()
            .map_err(|_| anyhow::anyhow!("subscriber panicked"))??;
        if got < n || ooo > 0 {
            bail!("a subscriber delivered up to {got} of {n} ({ooo} out of order)");
        }
    }
    eprintln!(
        "  offered {:.0} msg/s, published in {:.3} s",
        args.rate as f64,
        wall as f64 / 1e9
    );
    Ok(cpu as f64 / n as f64)
}

/// `md-fanout`.
pub fn run(args: &FanoutArgs) -> Result<()> {
    let _sink = sink(args.no_sink);
    let ip = local_ip(args.addr)?;
    let mut figures = Vec::new();
    let mut i = 0;
    for t in &args.transports {
        for &subs in &args.subscribers {
            let cfg = config(t, i, args.port + i as u16)?;
            i += 1;
            eprintln!("== md-fanout: {t}, {subs} subscriber(s)");
            let ns = one(&cfg, ip, subs, args).with_context(|| format!("{t} N={subs}"))?;
            println!("{t} N={subs}: {ns:.0} ns publisher CPU per message");
            figures.push(format!("{t} N={subs} {ns:.0} ns/msg"));
            crate::report::figure(&format!("{t}_n{subs}_ns_per_msg"), format!("{ns:.0}"));
        }
    }
    println!(
        "md-fanout: {} ({} B messages, {} per configuration, offered {} msg/s)",
        figures.join(", "),
        args.size,
        args.iterations,
        args.rate
    );
    Ok(())
}
