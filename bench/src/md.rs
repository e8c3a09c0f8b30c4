//! Market-data harnesses over real UD multicast (both roles on one host, one
//! polling thread each; md-latency's echo is a second process, as perftest's
//! other side is, unless `--threads`):
//!
//! - `md-throughput`: 64-byte messages per second published and delivered
//!   in order with zero unrecovered loss (compare `ib_send_bw -c UD`).
//! - `md-latency`: publish-to-handler latency by ping-pong over two groups
//!   (RTT/2, compare `ib_send_lat -c UD -g` over two groups, run under
//!   `with-groups`; `--raw` ping-pongs bare datagrams on the same verbs
//!   objects, to split the protocol's cost from the engine's). The echo
//!   publishes its answer from inside its handler, and the round trip ends
//!   when the originator's handler runs: the time between is the protocol
//!   and the engine, not the rest of a poll. Both loops idle last, after
//!   polling their subscriber and publisher, as an agent's duty cycle does.
//! - `md-recovery`: time to recover one lost datagram (gap detected to the
//!   missing message delivered), in multiples of a 64-byte RC round trip.
//!
//! Across two hosts, md-latency and md-throughput run one side each: `--server` (the echo,
//! the subscriber) and `--client HOST` (the originator, the publisher), like perftest's
//! `ib_send_lat -c UD -g` and `ib_send_bw -c UD` (`cargo xtask bench --hosts 2 NAME`). A
//! TCP connection on `--oob-port`, perftest's out-of-band exchange in small, gives the server
//! the client's address (a subscriber connects to its publisher for recovery), tells
//! md-throughput's publisher when everything arrived and, closed by md-latency's client,
//! ends the server's echo.
//!
//! In one soft-RoCE guest the NIC's QEMU hub has no other port, so multicast
//! frames handed to eth0 are never taken and rxe stalls after 64 of them;
//! local receivers get their copy from the kernel's multicast loopback before
//! the qdisc, so the harness drops eth0's egress with netem (`--no-sink`
//! turns this off; it is only done inside a one-host guest).

use crate::rc::local_ip;
use crate::report::Summary;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rocebus::clock::Mono;
use rocebus::idle::{IdleStrategy, Idler};
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{
    Handler, Line, McastPublisher, McastSubscriber, Phase, RestoreError, Snapshot, SnapshotSink,
};
use rocebus::rdma_settings::DEFAULT_MAX_INLINE;
use rocebus::verbs::cm::{self, Listener};
use rocebus::verbs::{
    Access, Context as RdmaContext, Dest, PoolConfig, PooledQp, ProtectionDomain, QpType, RcOptions,
};
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The harnesses' clock: nanoseconds since the first call. `cargo xtask vm`
/// boots guests with the TSC clocksource, so `Instant::now()` is a vDSO read
/// there as on real hosts (with the emulated HPET it trapped into the
/// emulator on every call).
mod clock {
    use std::sync::OnceLock;
    use std::time::Instant;

    static START: OnceLock<Instant> = OnceLock::new();

    /// Nanoseconds since the first call.
    pub fn now() -> u64 {
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// Options of the market-data harnesses.
#[derive(Debug, Clone, clap::Args)]
pub struct MdArgs {
    /// Message bytes.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Messages (throughput), round trips (latency) or losses (recovery).
    #[arg(long, short = 'n')]
    pub iterations: Option<u64>,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// First rdma_cm port of the recovery services (two are used).
    #[arg(long, default_value_t = 7700)]
    pub port: u16,
    /// Publisher pacing in datagrams per second (0 = unpaced).
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Pin the two threads to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
    /// Do not drop eth0's egress in a one-host guest (see the module docs).
    #[arg(long)]
    pub no_sink: bool,
    /// Spin when a poll found nothing instead of yielding the core. Yielding
    /// is the default: soft-RoCE does its work in softirqs, which two
    /// spinning threads on two vCPUs starve for whole scheduler ticks.
    #[arg(long)]
    pub spin: bool,
    /// md-latency only: ping-pong raw UD multicast datagrams on the same
    /// verbs objects and groups, without the rocebus protocol (no header,
    /// sequencing, history or recovery), to split the protocol's cost from
    /// the engine's.
    #[arg(long)]
    pub raw: bool,
    /// md-latency: run the echo side as a thread of this process instead of
    /// a second process. perftest's two sides are two processes, and so are
    /// an exchange feed's publisher and its subscribers: that is the default.
    #[arg(long)]
    pub threads: bool,
    /// md-latency: be the echo side only, until standard input closes (how
    /// the harness runs its second process).
    #[arg(long, hide = true)]
    pub echo_only: bool,
    /// Receives each subscriber keeps posted (`receive.depth`; `--raw`
    /// posts this many too).
    #[arg(long, default_value_t = 4096)]
    pub recv_depth: u32,
    /// Tag every datagram with a keyed 8-byte tag (SipHash-2-4) and check it on receipt
    /// (`auth.datagram_tag`), to measure what it costs.
    #[arg(long)]
    pub datagram_tag: bool,
    /// md-latency, md-throughput: two hosts, this one the server (md-latency's echo,
    /// md-throughput's subscriber). It waits for the client on `--oob-port` (TCP), learns
    /// the client's address there (its subscriber connects to the client's publisher for
    /// recovery), serves one run and exits. perftest's counterpart runs with no address.
    #[arg(long, conflicts_with = "client")]
    pub server: bool,
    /// md-latency, md-throughput: two hosts, this one the client (md-latency's originator,
    /// md-throughput's publisher), reaching the server at HOST (its `--addr`), retrying for
    /// `--connect-secs` while it starts. md-latency's client prints the figures, like
    /// perftest's; md-throughput's server does (the receiver).
    #[arg(long, value_name = "HOST", conflicts_with_all = ["threads", "raw"])]
    pub client: Option<IpAddr>,
    /// TCP port of the two-host handshake (perftest's out-of-band connection in small: the
    /// client's address one way, "all received" the other; closing it ends the server's run).
    #[arg(long, default_value_t = 7790)]
    pub oob_port: u16,
    /// How long `--client` keeps retrying and `--server` waits for its client.
    #[arg(long, default_value_t = 120)]
    pub connect_secs: u64,
    /// Registered memory on 2 MiB huge pages (`[rdma] hugepages` of the services); the
    /// guest needs free ones (`cargo xtask bench NAME --hugepages` reserves them).
    #[arg(long, value_enum, default_value_t = crate::pages::Pages::Off)]
    pub hugepages: crate::pages::Pages,
}

/// Which ends of a two-sided harness this process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ends {
    /// Both (one host).
    Both,
    /// The server alone (`--server`).
    Server,
    /// The client alone, its server at this host (`--client HOST`).
    Client(IpAddr),
}

impl MdArgs {
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
            bail!("{name} runs on one host: --server/--client do not apply");
        }
        Ok(())
    }
}

/// The server's end of the two-host handshake: accepts one client on `ip`:`--oob-port`
/// within `--connect-secs`; returns the connection and the client's address (where its
/// publisher listens for recovery connections).
fn oob_accept(args: &MdArgs, ip: IpAddr) -> Result<(TcpStream, IpAddr)> {
    let l = TcpListener::bind((ip, args.oob_port))
        .with_context(|| format!("listening on {ip}:{} (TCP)", args.oob_port))?;
    l.set_nonblocking(true)?;
    eprintln!("waiting for the client on {ip}:{} (TCP)", args.oob_port);
    let deadline = std::time::Instant::now() + Duration::from_secs(args.connect_secs);
    loop {
        match l.accept() {
            Ok((stream, peer)) => {
                stream.set_nonblocking(false)?;
                stream.set_nodelay(true)?;
                return Ok((stream, peer.ip()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    bail!("no client within {} s", args.connect_secs);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).context("accepting the client"),
        }
    }
}

/// The client's end of the two-host handshake: connects to `host`:`--oob-port`, retrying
/// for `--connect-secs` while the server starts.
fn oob_connect(args: &MdArgs, host: IpAddr) -> Result<TcpStream> {
    let addr = SocketAddr::new(host, args.oob_port);
    let deadline = std::time::Instant::now() + Duration::from_secs(args.connect_secs);
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("connecting to {addr} (TCP): {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("no server at {addr} within {} s", args.connect_secs))
            }
        }
    }
}

/// A flag set when `stream` reaches its end (or fails): the peer is done.
fn closed_flag(mut stream: TcpStream) -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let set = flag.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut stream, &mut std::io::sink());
        // ORDERING: Release, pairs with the Acquire loads of the loop it stops.
        set.store(true, Ordering::Release);
    });
    flag
}

fn idler(args: &MdArgs) -> Idler {
    Idler::new(if args.spin {
        IdleStrategy::BusySpin
    } else {
        IdleStrategy::Yield
    })
}

fn pin(cores: &[usize], i: usize) {
    if let Some(c) = cores.get(i) {
        if !rocebus::idle::pin_current_thread(*c) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

/// Drops eth0's egress for the run in a one-host guest (see the module docs);
/// the qdisc is removed when the guard drops. `no_sink` (or running outside a
/// one-host guest) installs nothing.
pub fn sink(no_sink: bool) -> Option<SinkGuard> {
    let in_one_guest = std::env::var_os("ROCEBUS_GUEST_ADDR").is_some()
        && std::env::var("ROCEBUS_HOSTS").as_deref() != Ok("2");
    if no_sink || !in_one_guest {
        return None;
    }
    let ok = std::process::Command::new("tc")
        .args("qdisc replace dev eth0 root netem loss 100%".split(' '))
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("warning: could not install the eth0 sink: multicast may stall in one guest");
    }
    ok.then_some(SinkGuard)
}

/// The eth0 sink of [`sink`]; removed on drop.
#[derive(Debug)]
pub struct SinkGuard;

impl Drop for SinkGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tc")
            .args("qdisc del dev eth0 root".split(' '))
            .status();
    }
}

/// Options of `with-groups`.
#[derive(Debug, Clone, clap::Args)]
pub struct WithGroupsArgs {
    /// IPv4 multicast groups to join, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub groups: Vec<std::net::Ipv4Addr>,
    /// Local IPv4 address to join on (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// The command to run while the groups are joined.
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `with-groups`: runs a command while `groups` are joined at the IP level
/// on the RDMA device's address (with eth0's egress sunk in a one-host
/// guest, see [`sink`]), and exits with its status.
///
/// perftest's multicast mode (`-g`) attaches its QPs with
/// `ibv_attach_mcast` alone. On RoCE v2 that does not join the group at the
/// IP level (rdma_cm joins, which rocebus uses, do), so soft-RoCE's
/// looped-back multicast is dropped by IP before it reaches the device and
/// perftest waits forever. Holding an IP membership (a UDP socket's
/// `IP_ADD_MEMBERSHIP`) for the run puts perftest on the same path as
/// rocebus: that is what makes `ib_send_lat -c UD -g` the like-for-like
/// baseline of `md-latency`.
pub fn with_groups(args: &WithGroupsArgs) -> Result<std::process::ExitStatus> {
    let IpAddr::V4(local) = local_ip(args.addr)? else {
        bail!("with-groups needs an IPv4 address");
    };
    let sock = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))
        .context("binding the membership socket")?;
    for g in &args.groups {
        if !g.is_multicast() {
            bail!("{g} is not an IPv4 multicast group");
        }
        sock.join_multicast_v4(g, &local)
            .with_context(|| format!("joining {g} on {local}"))?;
    }
    let _sink = sink(false);
    let (prog, rest) = args.cmd.split_first().context("no command given")?;
    let status = std::process::Command::new(prog)
        .args(rest)
        .status()
        .with_context(|| format!("running {prog}"))?;
    drop(sock);
    Ok(status)
}

fn config(groups: &[(u16, &str, u16)], args: &MdArgs) -> Result<McastConfig> {
    let mut text = format!(
        "max_datagram_payload = 1024\nhistory_depth = 65536\nheartbeat_interval_ns = 1000000\n\
         [receive]\ndepth = {depth}\nreplenish_batch = {batch}\nlow_water = {low}\n\
         [batching]\nmax_messages = 64\nflush_interval_ns = 20000\n\
         [pacing]\nmax_datagrams_per_sec = {}\nburst = 64\n\
         [recovery]\ntimeout_ns = 50000000\nmax_retries = 50\nmax_outstanding = 16\nmax_buffered = 16384\nrc_timeout = 12\n\
         [auth]\nsecret = \"rocebus-bench\"\ndatagram_tag = {}\n",
        args.rate,
        args.datagram_tag,
        depth = args.recv_depth,
        batch = (args.recv_depth / 4).clamp(1, 64),
        low = args.recv_depth / 8,
    );
    for (id, group, port) in groups {
        text.push_str(&format!(
            "[[channels]]\nid = {id}\nname = \"md{id}\"\nline_a = \"{group}\"\nport = {port}\n"
        ));
    }
    Ok(McastConfig::from_toml_str(&text)?)
}

/// Checks order and keeps the last message; accepts (empty) snapshots so a
/// resync is counted as loss, not a hang.
#[derive(Debug, Default)]
struct Sink {
    next: u64,
    out_of_order: u64,
    last: [u8; 16],
}

impl Handler for Sink {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        if self.next != 0 && seq != self.next {
            self.out_of_order += 1;
        }
        self.next = seq + 1;
        let n = msg.len().min(16);
        self.last[..n].copy_from_slice(&msg[..n]);
    }
}

impl SnapshotSink for Sink {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, seq: u64) -> Result<(), RestoreError> {
        self.next = seq + 1;
        Ok(())
    }
}

/// The publishers' snapshot: empty, at the last published sequence.
struct Seq(u64);

impl Snapshot for Seq {
    fn snapshot_seq(&self) -> u64 {
        self.0
    }
    fn write_snapshot(&self, _: &mut Vec<u8>) {}
}

/// md-latency's handler on both ends of the ping-pong: a [`Sink`] that notes
/// when the handler ran (where publish-to-handler ends) and, on the echo
/// side, publishes the message's first 16 bytes back on its own channel
/// from inside the handler, as a strategy reacting to market data would.
struct Pong {
    sink: Sink,
    at: u64,
    /// Whether the handler reads the clock into `at` (md-ping's does not:
    /// it counts instructions, not time).
    timed: bool,
    echo: Option<EchoOut>,
}

/// The echo side's publisher, its snapshot and what went wrong in a handler.
struct EchoOut {
    p: McastPublisher,
    snap: Seq,
    msg: Vec<u8>,
    err: Option<anyhow::Error>,
}

impl Pong {
    fn new(echo: Option<EchoOut>) -> Self {
        Pong {
            sink: Sink::default(),
            at: 0,
            timed: true,
            echo,
        }
    }
}

impl Handler for Pong {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        if self.timed {
            self.at = clock::now();
        }
        self.sink.on_message(seq, msg);
        let Some(e) = &mut self.echo else { return };
        if e.err.is_some() {
            return;
        }
        let n = msg.len().min(16);
        e.msg[..n].copy_from_slice(&msg[..n]);
        // Published and sent in one step, as the originator does.
        let sent = match e.p.offer_and_flush(Mono::from_nanos(self.at), &e.msg) {
            Ok(_) => {
                e.snap.0 += 1;
                Ok(())
            }
            Err(err) => Err(anyhow::Error::from(err)),
        };
        if let Err(err) = sent {
            e.err = Some(err);
        }
    }
}

impl SnapshotSink for Pong {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, seq: u64) -> Result<(), RestoreError> {
        self.sink.finish_restore(seq)
    }
}

fn subscribe(cfg: &McastConfig, channel: u16, ip: IpAddr) -> Result<McastSubscriber> {
    subscribe_from(cfg, channel, ip, ip)
}

/// Subscribes on `local` to `channel`, whose publisher (recovery) is at `publisher`,
/// retrying for 20 s while it starts.
fn subscribe_from(
    cfg: &McastConfig,
    channel: u16,
    local: IpAddr,
    publisher: IpAddr,
) -> Result<McastSubscriber> {
    let t = std::time::Instant::now();
    loop {
        match McastSubscriber::connect(cfg, channel, local, publisher) {
            Ok(s) => return Ok(s),
            Err(e) if t.elapsed() > Duration::from_secs(20) => return Err(e.into()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn wait_connected(p: &mut McastPublisher, snap: &Seq) -> Result<()> {
    let t = clock::now();
    while p.connections() == 0 {
        p.poll(Mono::from_nanos(clock::now()), snap)?;
        if clock::now() - t > 30_000_000_000 {
            bail!("no subscriber connected within 30 s");
        }
    }
    Ok(())
}

/// md-throughput's publishing burst, on one host or as `--client`: pins, waits for a
/// subscriber, publishes `n` messages of `args.size` bytes (polling every 16) and flushes.
/// Returns the publisher (it still serves recovery), the snapshot position, and the clock
/// at the first and after the last message.
fn publish_burst(
    args: &MdArgs,
    cfg: &McastConfig,
    ip: IpAddr,
    n: u64,
) -> Result<(McastPublisher, Seq, u64, u64)> {
    pin(&args.cores, 0);
    let mut p = McastPublisher::new(cfg, 1, clock::now(), ip)?;
    let mut snap = Seq(0);
    wait_connected(&mut p, &snap)?;
    let mut msg = vec![0u8; args.size];
    let start = clock::now();
    for seq in 1..=n {
        message(&mut msg, seq, 0);
        p.offer(Mono::from_nanos(clock::now()), &msg)?;
        snap.0 = seq;
        if seq % 16 == 0 {
            p.poll(Mono::from_nanos(clock::now()), &snap)?;
        }
    }
    p.flush(Mono::from_nanos(clock::now()))?;
    Ok((p, snap, start, clock::now()))
}

fn message(buf: &mut [u8], seq: u64, ts: u64) {
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..16].copy_from_slice(&ts.to_le_bytes());
}

/// `md-throughput`.
pub fn throughput(args: &MdArgs) -> Result<()> {
    if args.size < 16 {
        bail!("--size must be at least 16 (sequence and timestamp)");
    }
    args.hugepages.apply();
    let n = args.iterations.unwrap_or(300_000);
    let _sink = sink(args.no_sink);
    let ip = local_ip(args.addr)?;
    let cfg = config(&[(1, "239.9.1.1", args.port)], args)?;
    match args.ends() {
        Ends::Server => return throughput_server(args, &cfg, ip, n),
        Ends::Client(host) => return throughput_client(args, &cfg, ip, host, n),
        Ends::Both => {}
    }
    let done = Arc::new(AtomicU64::new(0));
    let sub_cfg = cfg.clone();
    let (cores, sub_done, mut idle) = (args.cores.clone(), done.clone(), idler(args));
    let sub = std::thread::spawn(move || -> Result<_> {
        pin(&cores, 1);
        let mut s = subscribe(&sub_cfg, 1, ip)?;
        let mut app = Sink::default();
        let deadline = clock::now() + 120_000_000_000;
        while s.counters().delivered + skipped(&s) < n {
            idle.idle(s.poll(Mono::from_nanos(clock::now()), &mut app, 64)?);
            if clock::now() > deadline {
                break;
            }
        }
        let end = clock::now();
        // ORDERING: Release, pairs with the publisher's Acquire load.
        sub_done.store(end, Ordering::Release);
        let _ = s.disconnect();
        Ok((end, s.counters(), s.io_stats(), app.out_of_order))
    });
    let (mut p, snap, start, published) = publish_burst(args, &cfg, ip, n)?;
    let mut idle = idler(args);
    // ORDERING: Acquire, pairs with the subscriber's Release store.
    while done.load(Ordering::Acquire) == 0 {
        idle.idle(p.poll(Mono::from_nanos(clock::now()), &snap)?);
    }
    let (end, c, io, ooo) = sub
        .join()
        .map_err(|_| anyhow::anyhow!("subscriber panicked"))??;
    let lost = n - c.delivered.min(n);
    let secs = (end - start) as f64 / 1e9;
    let rate = n as f64 / secs;
    println!(
        "md-throughput: {} B messages, {n} published in {:.3} s, delivered {} in {secs:.3} s ({:.0} datagrams)",
        args.size,
        (published - start) as f64 / 1e9,
        c.delivered,
        p.io_stats().datagrams_sent
    );
    println!("subscriber: {c:?}\n{io:?}\npublisher: {:?}", p.io_stats());
    if ooo != 0 {
        bail!("{ooo} messages out of order");
    }
    crate::report::emit_result(&format!(
        "RESULT msgs_per_sec={rate:.1} lost={lost} recovered={} unrecoverable={}",
        c.messages_recovered, c.unrecoverable
    ));
    Ok(())
}

/// md-throughput's receiving end across two hosts (`--server`): subscribes to channel 1 of
/// the client's publisher, takes `n` messages, timed from the first poll that delivered to
/// the last (as rc-throughput's server does: the publisher's start is on another clock),
/// tells the client it has them all and prints the rate.
fn throughput_server(args: &MdArgs, cfg: &McastConfig, ip: IpAddr, n: u64) -> Result<()> {
    let (mut oob, peer) = oob_accept(args, ip)?;
    pin(&args.cores, 0);
    let mut s = subscribe_from(cfg, 1, ip, peer)?;
    let mut app = Sink::default();
    let mut idle = idler(args);
    let mut start = None;
    let deadline = clock::now() + 120_000_000_000;
    while s.counters().delivered + skipped(&s) < n {
        let now = clock::now();
        idle.idle(s.poll(Mono::from_nanos(now), &mut app, 64)?);
        if start.is_none() && s.counters().delivered > 0 {
            start = Some(now);
        }
        if now > deadline {
            break;
        }
    }
    let end = clock::now();
    // All received (or the deadline): the client may stop serving recovery.
    oob.write_all(b"d").context("telling the client")?;
    let c = s.counters();
    let _ = s.disconnect();
    let secs = (end - start.unwrap_or(end)) as f64 / 1e9;
    let rate = c.delivered as f64 / secs.max(1e-9);
    let lost = n - c.delivered.min(n);
    println!(
        "md-throughput server: {} B messages from {peer}, delivered {} of {n} in {secs:.3} s, {rate:.0} msg/s",
        args.size, c.delivered
    );
    println!("subscriber: {c:?}\n{:?}", s.io_stats());
    if app.out_of_order != 0 {
        bail!("{} messages out of order", app.out_of_order);
    }
    crate::report::emit_result(&format!(
        "RESULT msgs_per_sec={rate:.1} lost={lost} recovered={} unrecoverable={}",
        c.messages_recovered, c.unrecoverable
    ));
    Ok(())
}

/// md-throughput's publishing end across two hosts (`--client HOST`): publishes `n`
/// messages on channel 1 once the server's subscriber is connected, then serves recovery
/// until the server says it has them all (the server prints the rate).
fn throughput_client(
    args: &MdArgs,
    cfg: &McastConfig,
    ip: IpAddr,
    host: IpAddr,
    n: u64,
) -> Result<()> {
    let mut oob = oob_connect(args, host)?;
    let (mut p, snap, start, published) = publish_burst(args, cfg, ip, n)?;
    oob.set_nonblocking(true)?;
    let mut idle = idler(args);
    let deadline = published + 150_000_000_000;
    let mut byte = [0u8; 1];
    loop {
        match oob.read(&mut byte) {
            // A byte ("all received") or the end (the server gave up): either way, done.
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e).context("the server's handshake connection"),
        }
        idle.idle(p.poll(Mono::from_nanos(clock::now()), &snap)?);
        if clock::now() > deadline {
            bail!("the server did not report within 150 s of the last message");
        }
    }
    println!(
        "md-throughput client: published {n} x {} B in {:.3} s ({} datagrams); the server prints the rate",
        args.size,
        (published - start) as f64 / 1e9,
        p.io_stats().datagrams_sent
    );
    Ok(())
}

/// Messages a subscriber skipped through a snapshot (counted as lost).
fn skipped(s: &McastSubscriber) -> u64 {
    if s.counters().snapshots_applied > 0 && s.state().phase() == Phase::Live {
        s.state().next_seq() - 1 - s.counters().delivered
    } else {
        0
    }
}

/// `md-latency`.
pub fn latency(args: &MdArgs) -> Result<()> {
    if args.size < 16 {
        bail!("--size must be at least 16 (sequence and timestamp)");
    }
    args.hugepages.apply();
    let n = args.iterations.unwrap_or(20_000);
    let warmup = (n / 10).max(100);
    let _sink = sink(args.no_sink);
    let ip = local_ip(args.addr)?;
    if args.raw {
        args.one_host_only("md-latency --raw")?;
        return raw_latency(args, ip, n, warmup);
    }
    let cfg = latency_config(args)?;
    // The echo (a thread or a second process on one host, nothing here with two), where
    // the echo's publisher is, and the handshake connection whose end stops a remote echo.
    let (echo, echo_host, oob) = match args.ends() {
        Ends::Server => {
            // The echo alone: the client's address from the handshake is where channel 1's
            // publisher is; the client closing the connection ends the run.
            let (oob, peer) = oob_accept(args, ip)?;
            echo_side(args, &cfg, ip, peer, 0)(closed_flag(oob))?;
            println!("md-latency server: echoed for {peer} until it closed the connection");
            return Ok(());
        }
        Ends::Client(host) => (None, host, Some(oob_connect(args, host)?)),
        Ends::Both => {
            let echo_body = echo_side(args, &cfg, ip, ip, 1);
            if args.echo_only {
                return echo_only(echo_body);
            }
            (Some(Echo::start(args, echo_body)?), ip, None)
        }
    };
    pin(&args.cores, 0);
    let mut p1 = McastPublisher::new(&cfg, 1, clock::now(), ip)?;
    let mut snap = Seq(0);
    wait_connected(&mut p1, &snap)?;
    // Connecting blocks until the echo's publisher accepts; it polls.
    let mut s2 = subscribe_from(&cfg, 2, ip, echo_host)?;
    let mut app = Pong::new(None);
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut msg = vec![0u8; args.size];
    let mut idle = idler(args);
    for i in 1..=(warmup + n) {
        let t0 = clock::now();
        message(&mut msg, i, t0);
        // Publish and flush in one step (the latency path).
        p1.offer_and_flush(Mono::from_nanos(t0), &msg)?;
        snap.0 = i;
        let deadline = t0 + 5_000_000_000;
        loop {
            let now = clock::now();
            let work = s2.poll(Mono::from_nanos(now), &mut app, 64)?;
            if app.sink.next > i && u64::from_le_bytes(app.sink.last[..8].try_into()?) == i {
                break;
            }
            if now > deadline {
                bail!("round trip {i} got no echo within 5 s: {:?}", s2.counters());
            }
            idle.idle(work + p1.poll(Mono::from_nanos(now), &snap)?);
        }
        if i > warmup {
            record_one_way(&mut hist, t0, app.at)?;
        }
    }
    crate::pages::report("md-latency");
    if let Some(echo) = echo {
        echo.stop()?;
    }
    // Closing the handshake connection ends a remote echo's run.
    drop(oob);
    let s = Summary::of(&hist);
    println!(
        "md-latency: {} B, {n} round trips over two multicast groups, publish-to-handler (RTT/2)\n{s:?}",
        args.size
    );
    println!("subscriber: {:?}", s2.counters());
    crate::report::emit_result(&s.result_line());
    Ok(())
}

/// md-latency's (and md-ping's) configuration: channel 1 carries the
/// pings, channel 2 the echoes.
fn latency_config(args: &MdArgs) -> Result<McastConfig> {
    config(
        &[(1, "239.9.2.1", args.port), (2, "239.9.2.2", args.port + 1)],
        args,
    )
}

/// The echo side of md-latency and md-ping: every message on channel 1
/// goes back on channel 2, published from inside the handler as a strategy
/// reacting to market data would. Runs until its stop flag is set.
/// `publisher` is where channel 1's publisher is (this host, or the client across two);
/// the echo pins itself to `--cores`' entry `core`.
fn echo_side(
    args: &MdArgs,
    cfg: &McastConfig,
    ip: IpAddr,
    publisher: IpAddr,
    core: usize,
) -> impl FnOnce(Arc<AtomicBool>) -> Result<()> + Send + 'static {
    let (echo_cfg, cores, size) = (cfg.clone(), args.cores.clone(), args.size);
    let mut echo_idle = idler(args);
    move |echo_stop: Arc<AtomicBool>| -> Result<()> {
        pin(&cores, core);
        let p = McastPublisher::new(&echo_cfg, 2, clock::now(), ip)?;
        let mut s1 = subscribe_from(&echo_cfg, 1, ip, publisher)?;
        let mut app = Pong::new(Some(EchoOut {
            p,
            snap: Seq(0),
            msg: vec![0u8; size],
            err: None,
        }));
        // One clock read per turn, as an application's loop would.
        // ORDERING: Acquire, pairs with the Release store after the last round.
        while !echo_stop.load(Ordering::Acquire) {
            // Idle last, as an agent's duty cycle does: after a yield the
            // next thing done is the multicast poll.
            let now = clock::now();
            let mut work = s1.poll(Mono::from_nanos(now), &mut app, 64)?;
            if let Some(e) = &mut app.echo {
                if let Some(err) = e.err.take() {
                    return Err(err);
                }
                work += e.p.poll(Mono::from_nanos(now), &e.snap)?;
            }
            echo_idle.idle(work);
        }
        Ok(())
    }
}

/// md-latency's configuration with no traffic that follows the clock
/// instead of the messages: no heartbeats (one an hour; the stream never
/// idles that long) and no status reports. Under callgrind the client runs
/// some 50 times slower than its native echo, so with md-latency's 1 ms
/// heartbeat the number of heartbeats each side received, and with them the
/// receive reposts and datagram checks, changed from run to run: the
/// accounting could not tell them from the messages' work and the figure
/// moved by up to 140 instructions between two runs of the same code.
fn counted_config(mut cfg: McastConfig) -> McastConfig {
    cfg.heartbeat_interval_ns = 3_600_000_000_000;
    cfg.recovery.status_interval_ns = 0;
    cfg
}

/// `md-ping`: md-latency's ping-pong with nothing else, for
/// `cargo xtask bench md-instructions` (under callgrind): `-n` round trips
/// of publish, flush and a busy poll of the echo channel (the publisher
/// polled on the turns that delivered nothing, as md-latency's loop does),
/// no warm-up, no histogram, and one clock read per round trip (md-latency
/// reads it on every turn and in the handler, to time; here the time is
/// only the `now` the protocol's timers need, and a read per turn would
/// put a timing-dependent count into the figure). The echo is a second
/// process, as md-latency's; run under valgrind, that child runs natively
/// (valgrind does not trace children by default).
pub fn ping(args: &MdArgs) -> Result<()> {
    if args.size < 16 {
        bail!("--size must be at least 16 (sequence and timestamp)");
    }
    args.one_host_only("md-ping")?;
    let n = args.iterations.unwrap_or(5000);
    let _sink = sink(args.no_sink);
    let ip = local_ip(args.addr)?;
    let cfg = counted_config(latency_config(args)?);
    let echo_body = echo_side(args, &cfg, ip, ip, 1);
    if args.echo_only {
        return echo_only(echo_body);
    }
    let echo = Echo::start(args, echo_body)?;
    let mut p1 = McastPublisher::new(&cfg, 1, clock::now(), ip)?;
    let mut snap = Seq(0);
    wait_connected(&mut p1, &snap)?;
    let mut s2 = subscribe(&cfg, 2, ip)?;
    let mut app = Pong {
        timed: false,
        ..Pong::new(None)
    };
    let mut msg = vec![0u8; args.size];
    let empty = ping_loop(&mut p1, &mut s2, &mut app, &mut snap, &mut msg, n)?;
    echo.stop()?;
    println!(
        "md-ping: {n} round trips of {} B, {empty} empty polls; subscriber: {:?}",
        args.size,
        s2.counters()
    );
    crate::report::emit_result(&format!("RESULT round_trips={n} empty_polls={empty}"));
    Ok(())
}

/// The measured loop of `md-ping`: publish and flush one message, poll the
/// echo channel until its echo is handled; returns the empty polls.
#[inline(never)]
fn ping_loop(
    p1: &mut McastPublisher,
    s2: &mut McastSubscriber,
    app: &mut Pong,
    snap: &mut Seq,
    msg: &mut [u8],
    n: u64,
) -> Result<u64> {
    let mut empty = 0u64;
    let start = clock::now();
    for i in 1..=n {
        let mut now = clock::now();
        message(msg, i, 0);
        // As md-latency: publish and flush in one step.
        p1.offer_and_flush(Mono::from_nanos(now), msg)?;
        snap.0 = i;
        loop {
            s2.poll(Mono::from_nanos(now), app, 64)?;
            if app.sink.next > i && app.sink.last[..8] == i.to_le_bytes() {
                break;
            }
            empty += 1;
            p1.poll(Mono::from_nanos(now), snap)?;
            // A long wait reads the clock again now and then, so that the
            // timers (recovery) still run; rarely, because these reads run
            // the same instructions as the one per round trip above and
            // their number follows the timing: at one per 256 empty polls
            // the accounting sometimes took the clock for a wait loop and
            // the figure moved by its ~60 instructions between runs.
            if empty % 65_536 != 0 {
                continue;
            }
            now = clock::now();
            if now - start > 3_600_000_000_000 {
                bail!(
                    "md-ping: round trip {i} not done after an hour: {:?}",
                    s2.counters()
                );
            }
        }
    }
    Ok(empty)
}

/// Records half the round trip that started at `t0` and ended, in the
/// handler, at `t1`.
fn record_one_way(hist: &mut Histogram<u64>, t0: u64, t1: u64) -> Result<()> {
    Ok(hist.record((t1.saturating_sub(t0) / 2).max(1))?)
}

/// The echo side of a ping-pong: a thread, or a second process running
/// this program with `--echo-only`.
enum Echo {
    Thread(Arc<AtomicBool>, std::thread::JoinHandle<Result<()>>),
    Process(std::process::Child),
}

impl Echo {
    /// Starts `body` (which runs until its stop flag is set) on the side
    /// `args` asks for.
    fn start(
        args: &MdArgs,
        body: impl FnOnce(Arc<AtomicBool>) -> Result<()> + Send + 'static,
    ) -> Result<Echo> {
        if args.threads {
            let stop = Arc::new(AtomicBool::new(false));
            let flag = stop.clone();
            return Ok(Echo::Thread(stop, std::thread::spawn(move || body(flag))));
        }
        let child = std::process::Command::new(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .arg("--echo-only")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("starting the echo process")?;
        Ok(Echo::Process(child))
    }

    /// Tells the echo side to stop and waits for it.
    fn stop(self) -> Result<()> {
        match self {
            Echo::Thread(stop, handle) => stop_echo(&stop, handle),
            Echo::Process(mut child) => {
                // Closing its standard input is the stop signal.
                drop(child.stdin.take());
                let st = child.wait()?;
                if !st.success() {
                    bail!("the echo process failed ({st})");
                }
                Ok(())
            }
        }
    }
}

/// In the `--echo-only` process: runs `body` until standard input closes.
fn echo_only(body: impl FnOnce(Arc<AtomicBool>) -> Result<()>) -> Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        // ORDERING: Release, pairs with the echo loop's Acquire load.
        flag.store(true, Ordering::Release);
    });
    body(stop)
}

/// Ends a ping-pong: tells the echo thread to stop and waits for it.
fn stop_echo(stop: &AtomicBool, echo: std::thread::JoinHandle<Result<()>>) -> Result<()> {
    // ORDERING: Release, pairs with the echo thread's Acquire load.
    stop.store(true, Ordering::Release);
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))?
}

/// One side of the raw ping-pong: a UD QP attached to `rx_group`, sending
/// to `tx_group`.
struct RawSide {
    qp: PooledQp,
    ah: rocebus::verbs::AddressHandle,
    qpn: u32,
    qkey: u32,
    _rx: rocebus::verbs::cm::McastMembership,
    _tx: rocebus::verbs::cm::McastMembership,
}

impl RawSide {
    fn new(ip: IpAddr, rx_group: &str, tx_group: &str, depth: u32) -> Result<Self> {
        use rocebus::verbs::cm::McastMembership;
        let ctx = RdmaContext::open_for_ip(ip)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let timeout = Duration::from_secs(5);
        let rx = McastMembership::join(ip, rx_group.parse()?, false, timeout)?;
        let tx = McastMembership::join(ip, tx_group.parse()?, false, timeout)?;
        let mut qp = PooledQp::new(
            &pd,
            QpType::Ud,
            PoolConfig {
                recv_slots: depth,
                recv_len: 1024,
                recv_batch: (depth / 4).clamp(1, 64),
                recv_low_water: depth / 8,
                send_slots: 64,
                send_len: 1024,
                signal_every: 16,
                dests_per_send: 1,
                max_inline: DEFAULT_MAX_INLINE,
            },
        )?;
        qp.qp().activate_ud(rx.port_num(), rx.qkey(), 0)?;
        rx.attach(qp.qp())?;
        qp.post_receives()?;
        Ok(RawSide {
            qp,
            ah: tx.address_handle(&pd, &rocebus::verbs::UdClass::default())?,
            qpn: tx.remote_qpn(),
            qkey: tx.qkey(),
            _rx: rx,
            _tx: tx,
        })
    }

    /// Takes what arrived; returns the first 8 bytes of the last datagram
    /// and when it was handed over.
    fn recv(&mut self) -> Result<Option<(u64, u64)>> {
        let mut last = None;
        self.qp.poll_recv(|b| {
            if b.len() >= 8 {
                let i = u64::from_le_bytes(b[..8].try_into().unwrap_or_default());
                last = Some((i, clock::now()));
            }
        })?;
        Ok(last)
    }

    fn send(&mut self, msg: &[u8]) -> Result<()> {
        let dest = [Dest::Ud {
            ah: &self.ah,
            qpn: self.qpn,
            qkey: self.qkey,
        }];
        while !self.qp.send(msg, &dest)? {}
        self.qp.poll_send()?;
        Ok(())
    }
}

/// `md-latency --raw`: see [`MdArgs::raw`].
fn raw_latency(args: &MdArgs, ip: IpAddr, n: u64, warmup: u64) -> Result<()> {
    let (cores, size, depth) = (args.cores.clone(), args.size, args.recv_depth);
    let mut echo_idle = idler(args);
    let echo_body = move |echo_stop: Arc<AtomicBool>| -> Result<()> {
        pin(&cores, 1);
        let mut side = RawSide::new(ip, "239.9.2.1", "239.9.2.2", depth)?;
        let mut msg = vec![0u8; size];
        // ORDERING: Acquire, pairs with the Release store after the last round.
        while !echo_stop.load(Ordering::Acquire) {
            let got = side.recv()?;
            echo_idle.idle(got.is_some() as usize);
            if let Some((i, _)) = got {
                msg[..8].copy_from_slice(&i.to_le_bytes());
                side.send(&msg)?;
            }
        }
        Ok(())
    };
    if args.echo_only {
        return echo_only(echo_body);
    }
    let echo = Echo::start(args, echo_body)?;
    pin(&args.cores, 0);
    let mut side = RawSide::new(ip, "239.9.2.2", "239.9.2.1", args.recv_depth)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut msg = vec![0u8; args.size];
    let mut idle = idler(args);
    // The echo side joins and attaches in its own time: ping until answered.
    let start = clock::now();
    let mut i = 0u64;
    while i < warmup + n {
        i += 1;
        let t0 = clock::now();
        msg[..8].copy_from_slice(&i.to_le_bytes());
        side.send(&msg)?;
        let resend = t0 + 100_000_000;
        let answered = loop {
            let got = side.recv()?;
            idle.idle(got.is_some() as usize);
            if let Some((j, at)) = got {
                if j == i {
                    break Some(at);
                }
            }
            if clock::now() > resend {
                break None;
            }
        };
        let Some(t1) = answered else {
            if i > 1 || clock::now() - start > 10_000_000_000 {
                bail!("raw round trip {i} got no echo within 100 ms");
            }
            i -= 1;
            continue;
        };
        if i > warmup {
            record_one_way(&mut hist, t0, t1)?;
        }
    }
    echo.stop()?;
    let s = Summary::of(&hist);
    println!(
        "md-latency --raw: {} B, {n} round trips of bare UD multicast datagrams over two groups (RTT/2)\n{s:?}",
        args.size
    );
    crate::report::emit_result(&s.result_line());
    Ok(())
}

/// `md-recovery`: each round publishes one datagram on no line (lost), then
/// one normally; the subscriber detects the gap when the second arrives and
/// recovers the first over RC. Reports the median of gap-detected →
/// lost-message-delivered, and the median 64-byte RC round trip measured with
/// the same buffer pools.
pub fn recovery(args: &MdArgs) -> Result<()> {
    args.one_host_only("md-recovery")?;
    let rounds = args.iterations.unwrap_or(300);
    let _sink = sink(args.no_sink);
    let ip = local_ip(args.addr)?;
    let rc_rtt = rc_round_trip(ip, args.port + 2, 1000)?;
    let cfg = config(&[(1, "239.9.3.1", args.port)], args)?;
    let recovered = Arc::new(AtomicU64::new(0));
    let (sub_cfg, sub_rec, cores) = (cfg.clone(), recovered.clone(), args.cores.clone());
    let mut sub_idle = idler(args);
    let sub = std::thread::spawn(move || -> Result<(Histogram<u64>, [Histogram<u64>; 3])> {
        pin(&cores, 1);
        let mut s = subscribe(&sub_cfg, 1, ip)?;
        let mut app = Sink::default();
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
        // Where the time goes: gap -> request posted, request posted ->
        // answer taken from RC, answer taken -> lost message delivered.
        let mut legs = [(); 3].map(|_| hist.clone());
        let (mut requested, mut answered) = (0, 0);
        let (mut sent, mut taken) = (0, 0);
        let mut gaps = 0;
        let mut detected = 0;
        let deadline = clock::now() + 120_000_000_000;
        while app.next <= 2 * rounds {
            // The gap is dated at the start of the poll that saw it (the
            // request leaves inside that poll), so recovery time includes
            // the whole detect-request-answer-deliver path.
            let before = clock::now();
            sub_idle.idle(s.poll(Mono::from_nanos(before), &mut app, 64)?);
            let now = clock::now();
            if s.counters().gaps_detected > gaps {
                gaps = s.counters().gaps_detected;
                detected = before;
            }
            let io = s.io_stats();
            if io.requests_sent > sent {
                sent = io.requests_sent;
                requested = now;
            }
            if io.recovery_messages > taken {
                taken = io.recovery_messages;
                answered = before;
            }
            let done = app.next.saturating_sub(1);
            if done > sub_rec.load(Ordering::Relaxed) {
                // Message 2r-1 was the lost one; it is delivered with 2r.
                if done % 2 == 0 && detected != 0 {
                    hist.record((now - detected).max(1))?;
                    if detected <= requested && requested <= answered {
                        legs[0].record((requested - detected).max(1))?;
                        legs[1].record((answered - requested).max(1))?;
                        legs[2].record((now - answered).max(1))?;
                    }
                    detected = 0;
                }
                // ORDERING: Release, pairs with the publisher's Acquire load.
                sub_rec.store(done, Ordering::Release);
            }
            if now > deadline {
                bail!("recovery stalled at {done}: {:?}", s.counters());
            }
        }
        let _ = s.disconnect();
        Ok((hist, legs))
    });
    pin(&args.cores, 0);
    let mut p = McastPublisher::new(&cfg, 1, clock::now(), ip)?;
    let mut snap = Seq(0);
    wait_connected(&mut p, &snap)?;
    let mut msg = vec![0u8; args.size.max(16)];
    // The publisher's side: time between polls while it waits, and the
    // length of the polls that answered a request.
    let mut gap_hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let mut serve_hist = gap_hist.clone();
    let mut served = 0;
    for r in 1..=rounds {
        let lost = 2 * r - 1;
        p.set_line_enabled(Line::A, false);
        message(&mut msg, lost, 0);
        p.offer(Mono::from_nanos(clock::now()), &msg)?;
        p.flush(Mono::from_nanos(clock::now()))?;
        p.set_line_enabled(Line::A, true);
        message(&mut msg, lost + 1, 0);
        p.offer(Mono::from_nanos(clock::now()), &msg)?;
        snap.0 = lost + 1;
        p.flush(Mono::from_nanos(clock::now()))?;
        // ORDERING: Acquire, pairs with the subscriber's Release store.
        let mut idle = idler(args);
        let mut last_end = clock::now();
        while recovered.load(Ordering::Acquire) < lost + 1 {
            let start = clock::now();
            gap_hist.record((start - last_end).max(1))?;
            idle.idle(p.poll(Mono::from_nanos(start), &snap)?);
            last_end = clock::now();
            if p.io_stats().retransmit_requests > served {
                served = p.io_stats().retransmit_requests;
                serve_hist.record((last_end - start).max(1))?;
            }
        }
    }
    let (hist, legs) = sub
        .join()
        .map_err(|_| anyhow::anyhow!("subscriber panicked"))??;
    let s = Summary::of(&hist);
    let rec = s.p50_ns;
    println!(
        "md-recovery: {rounds} lost datagrams, gap detected -> delivered: {s:?}\n\
         rc round trip (64 B, p50): {rc_rtt} ns; recovery = {:.2} RC round trips",
        rec as f64 / rc_rtt.max(1) as f64
    );
    let p50 = |h: &Histogram<u64>| h.value_at_quantile(0.5);
    println!(
        "where the time goes (p50 ns): subscriber gap->request posted {}, \
         request posted->answer taken {}, answer->delivered {}; \
         publisher between polls {}, answering poll {}",
        p50(&legs[0]),
        p50(&legs[1]),
        p50(&legs[2]),
        p50(&gap_hist),
        p50(&serve_hist)
    );
    crate::report::emit_result(&format!("RESULT recovery_ns={rec} rc_rtt_ns={rc_rtt}"));
    Ok(())
}

/// Median round trip of a 64-byte SEND ping-pong over one RC connection (the
/// same pools and RC options the recovery service uses).
fn rc_round_trip(ip: IpAddr, port: u16, iterations: usize) -> Result<u64> {
    let pool = PoolConfig {
        recv_slots: 64,
        recv_len: 256,
        recv_batch: 8,
        recv_low_water: 8,
        send_slots: 64,
        send_len: 256,
        signal_every: 8,
        dests_per_send: 1,
        max_inline: DEFAULT_MAX_INLINE,
    };
    let opts = RcOptions {
        timeout: 12,
        ..RcOptions::default()
    };
    let listener = Listener::bind(SocketAddr::new(ip, port))?;
    let server = std::thread::spawn(move || -> Result<()> {
        let req = listener
            .next_request(Duration::from_secs(20))?
            .context("no RC client")?;
        let ctx = RdmaContext::open_for_ip(ip)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let mut qp = PooledQp::new(&pd, QpType::Rc, pool)?;
        let _conn = req.accept(qp.qp(), &opts, Access::LOCAL, &[], Duration::from_secs(10))?;
        qp.post_receives()?;
        let mut buf = [0u8; 64];
        let mut n = 0;
        while n < iterations {
            let mut got = 0;
            qp.poll_recv(|b| {
                let k = b.len().min(64);
                buf[..k].copy_from_slice(&b[..k]);
                got += 1;
            })?;
            for _ in 0..got {
                while !qp.send(&buf, &[Dest::Connected])? {}
            }
            qp.poll_send()?;
            n += got;
        }
        // Let the last answer complete before the QP goes.
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    });
    let ctx = RdmaContext::open_for_ip(ip)?;
    let pd = ProtectionDomain::new(&ctx)?;
    let mut qp = PooledQp::new(&pd, QpType::Rc, pool)?;
    let (_conn, _) = cm::resolve(SocketAddr::new(ip, port), Some(ip), Duration::from_secs(10))?
        .connect(qp.qp(), &opts, Access::LOCAL, &[], Duration::from_secs(10))?;
    qp.post_receives()?;
    let mut rtts = Vec::with_capacity(iterations);
    let buf = [7u8; 64];
    for _ in 0..iterations {
        let t0 = clock::now();
        while !qp.send(&buf, &[Dest::Connected])? {}
        let mut got = 0;
        while got == 0 {
            got = qp.poll_recv(|_| {})?.received;
            qp.poll_send()?;
            if clock::now() - t0 > 5_000_000_000 {
                bail!("RC echo lost");
            }
        }
        rtts.push(clock::now() - t0);
    }
    server
        .join()
        .map_err(|_| anyhow::anyhow!("RC echo server panicked"))??;
    rtts.sort_unstable();
    Ok(rtts[rtts.len() / 2])
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        md: MdArgs,
    }

    fn args(line: &str) -> MdArgs {
        Cli::try_parse_from(std::iter::once("md").chain(line.split_whitespace()))
            .unwrap()
            .md
    }

    /// The two-host handshake: the server learns the client's address (where the
    /// client's publisher is), "all received" reaches the client, and the client
    /// closing the connection is what stops the server's echo.
    #[test]
    fn the_handshake_gives_the_server_the_client_address_and_ends_with_the_client() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        // A free port: bind one, then let the server take it.
        let port = TcpListener::bind((lo, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let a = args(&format!("--oob-port {port} --connect-secs 10"));
        let server = std::thread::spawn(move || oob_accept(&a, lo).unwrap());
        let b = args(&format!("--oob-port {port} --connect-secs 10"));
        let mut client = oob_connect(&b, lo).unwrap();
        let (mut conn, peer) = server.join().unwrap();
        assert_eq!(peer, lo);
        conn.write_all(b"d").unwrap();
        let mut byte = [0u8; 1];
        client.read_exact(&mut byte).unwrap();
        assert_eq!(&byte, b"d");
        let closed = closed_flag(conn);
        std::thread::sleep(Duration::from_millis(50));
        // ORDERING: Acquire, pairs with closed_flag's Release store.
        assert!(
            !closed.load(Ordering::Acquire),
            "set before the client closed"
        );
        drop(client);
        let t = std::time::Instant::now();
        // ORDERING: Acquire, as above.
        while !closed.load(Ordering::Acquire) {
            assert!(t.elapsed() < Duration::from_secs(5), "never set");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A server with no client gives up after `--connect-secs`, with an error.
    #[test]
    fn a_server_without_a_client_gives_up() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let port = TcpListener::bind((lo, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = oob_accept(&args(&format!("--oob-port {port} --connect-secs 1")), lo).unwrap_err();
        assert!(e.to_string().contains("no client within 1 s"), "{e}");
    }

    #[test]
    fn two_host_roles_are_refused_where_they_do_not_apply() {
        assert!(args("--server").one_host_only("md-ping").is_err());
        assert!(args("--client 10.0.0.1").one_host_only("md-ping").is_err());
        assert!(args("").one_host_only("md-ping").is_ok());
        assert_eq!(
            args("--client 10.0.0.1").ends(),
            Ends::Client("10.0.0.1".parse().unwrap())
        );
        assert!(Cli::try_parse_from(["md", "--server", "--client", "10.0.0.1"]).is_err());
        assert!(Cli::try_parse_from(["md", "--client", "10.0.0.1", "--raw"]).is_err());
    }
}
