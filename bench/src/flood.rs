//! `rc-flood`: what a flood of connect requests from a stranger costs the
//! orders path, in alternating rounds in one process (one guest): each
//! round measures, first quiet, then while `core/tests/attackers/cm_flood.py`
//! (rdma-core's pyverbs, not rocebus) floods the listener at `--rate`
//! attempts per second,
//!
//! - the handshake time of a healthy peer (`Connection::connect` to its
//!   return, `--connects` times), against the listener with its defaults and
//!   against a second listener that demands a cookie of every request
//!   (`cookie_when_pending = 0`: what a peer meets while a listener is under
//!   load, one more rdma_cm round trip carrying the cookie);
//! - the ping-pong one-way latency (RTT/2, as `rc-latency`) of a connection
//!   established before the first round.
//!
//! Both listeners and every connection are served by one thread (as the
//! gateway's service loop does): it echoes, and every 32 turns gives each
//! listener a non-blocking `accept`, whose time is summed. The time of the
//! `accept` calls that refused requests, over the requests they refused
//! (`ListenerStats`: unproved, replayed and the caps), is the listener's
//! cost per refused request: the kernel's rdma_cm event, the first-proof
//! check and the reject, what the serving thread pays for a stranger.
//!
//! Each round prints a `FLOOD` line; the run ends with the medians of the
//! per-round ratios (flood over quiet) and a `RESULT` line.

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use rocebus::auth::{Initiator, Key, Purpose};
use rocebus::orders::{Connection, ListenerStats, OrdersConfig, OrdersError, OrdersListener};
use rocebus::ring::frame::{ConnectHello, Hello, HELLO_MAGIC};
use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerocopy::IntoBytes;

/// Options of `rc-flood`.
#[derive(Debug, Clone, clap::Args)]
pub struct RcFloodArgs {
    /// Payload bytes of the ping-pong's messages.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Round trips of the ping-pong per phase.
    #[arg(long, short = 'n', default_value_t = 5000)]
    pub iterations: u64,
    /// Handshakes of a healthy peer per phase and listener.
    #[arg(long, default_value_t = 20)]
    pub connects: u32,
    /// Rounds (each: quiet, then flooded).
    #[arg(long, default_value_t = 3)]
    pub rounds: u32,
    /// Connect requests per second the attacker aims at, over all its
    /// sources (0: as fast as it can).
    #[arg(long, default_value_t = 100)]
    pub rate: u32,
    /// The attacker script (`core/tests/attackers/cm_flood.py`), run with
    /// Debian's /usr/bin/python3 (python3-pyverbs).
    #[arg(long)]
    pub attacker: std::path::PathBuf,
    /// The attacker's source addresses (default: this host's address).
    #[arg(long, value_delimiter = ',')]
    pub flood_src: Vec<IpAddr>,
    /// Attacker processes, the sources taken in turn (under emulation one
    /// pyverbs process makes some 10 attempts per second).
    #[arg(long, default_value_t = 3)]
    pub procs: usize,
    /// Local IP address of the RDMA device (default: ROCEBUS_GUEST_ADDR or the device's IPv4 GID).
    #[arg(long)]
    pub addr: Option<IpAddr>,
    /// rdma_cm port of the listener with its defaults; the always-cookie one
    /// listens on the next port.
    #[arg(long, default_value_t = 7510)]
    pub port: u16,
    /// Pin the client and the serving thread to these cores (e.g. 0,1).
    #[arg(long, value_delimiter = ',')]
    pub cores: Vec<usize>,
}

const TOKEN: &str = "bench-flood-token";

fn config(cookie_when_pending: usize) -> OrdersConfig {
    OrdersConfig {
        ring_size: 1 << 20,
        max_payload: 4096,
        token: TOKEN.into(),
        cookie_when_pending,
        ..OrdersConfig::default()
    }
}

/// A genuine connect request of a peer holding the token, as one captured
/// off the fabric would be (never sent: the flood replays it, the listener
/// answers its first copy, the replay guard silences the rest).
fn captured_request() -> Vec<u8> {
    let ini = Initiator::new(Key::derive(TOKEN.as_bytes(), Purpose::Orders));
    let mut c = ConnectHello {
        hello: Hello {
            magic: HELLO_MAGIC.into(),
            ring_log2: 20.into(),
            flags: 0.into(),
            ring_addr: 0x7f00_0000_0000.into(),
            ring_rkey: 0x1234.into(),
            max_payload: 4096.into(),
            conn_id: 0.into(),
        },
        nonce_tail: [0; 8],
        proof: [0; 16],
    };
    c.set_nonce(&ini.nonce());
    c.proof = ini.first_proof(c.hello.as_bytes(), &[]);
    c.as_bytes().to_vec()
}

/// Requests a listener refused (or silenced) so far.
fn refused(s: &ListenerStats) -> u64 {
    s.unproved
        + s.replayed
        + s.bad_hello
        + s.ring_too_large
        + s.pending_full
        + s.peer_pending
        + s.peer_limit
        + s.bad_proof
        + s.not_accepting
}

/// What the serving thread shares with the client thread.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Nanoseconds spent in the listeners' `accept` calls.
    listener_ns: AtomicU64,
    /// Requests the two listeners refused.
    refused: AtomicU64,
    /// Nanoseconds spent in the `accept` calls that refused a request.
    refusing_ns: AtomicU64,
    /// The longest single `accept` call (ns), reset at each phase's start.
    listener_max_ns: AtomicU64,
    /// `accept` calls that took more than [`SLOW_NS`].
    listener_slow: AtomicU64,
    /// The longest serving turn outside the `accept` calls (ns), reset at
    /// each phase's start: echoing takes microseconds, so a long one is the
    /// thread not running (preempted by another thread or process).
    stall_max_ns: AtomicU64,
    /// Serving turns that took more than [`SLOW_NS`] outside the `accept` calls.
    stalls: AtomicU64,
}

/// A listener call or a serving turn longer than this is counted as slow.
const SLOW_NS: u64 = 1_000_000;

/// Serves both listeners and every connection on this thread until `stop`.
fn serve(listeners: &mut [OrdersListener; 2], shared: &Shared) -> Result<()> {
    let mut conns: Vec<Connection> = Vec::new();
    let mut buf = vec![0u8; 4096];
    let mut turn = 0u32;
    let mut last = Instant::now();
    // ORDERING: Relaxed: a stop flag; nothing is handed over through it.
    while !shared.stop.load(Ordering::Relaxed) {
        turn = turn.wrapping_add(1);
        // The previous turn's length outside the listener calls (`last`
        // is taken again after them).
        let now = Instant::now();
        let turn_ns = (now - last).as_nanos() as u64;
        last = now;
        if turn % 32 == 0 {
            let t = Instant::now();
            let mut total = 0;
            for l in listeners.iter_mut() {
                let before = refused(&l.stats());
                let t = Instant::now();
                if let Some(c) = l.accept(Duration::ZERO)? {
                    conns.push(c);
                }
                let call = t.elapsed().as_nanos() as u64;
                // ORDERING: Relaxed, as below.
                shared.listener_max_ns.fetch_max(call, Ordering::Relaxed);
                if call > SLOW_NS {
                    shared.listener_slow.fetch_add(1, Ordering::Relaxed);
                }
                let after = refused(&l.stats());
                if after > before {
                    // ORDERING: Relaxed, as below.
                    shared
                        .refusing_ns
                        .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                }
                total += after;
            }
            let ns = t.elapsed().as_nanos() as u64;
            // ORDERING: Relaxed: figures read after the phase they belong
            // to; the client reads them a whole phase apart, where a stale
            // value by a few turns is noise.
            shared.listener_ns.fetch_add(ns, Ordering::Relaxed);
            shared.refused.store(total, Ordering::Relaxed);
            // The listener calls' time is counted above, not as a stall.
            last = Instant::now();
        }
        // ORDERING: Relaxed, as above.
        shared.stall_max_ns.fetch_max(turn_ns, Ordering::Relaxed);
        if turn_ns > SLOW_NS {
            shared.stalls.fetch_add(1, Ordering::Relaxed);
        }
        let mut i = 0;
        while i < conns.len() {
            let mut got = 0usize;
            match conns[i].subscription().poll(
                |f| {
                    got = f.payload.len();
                    buf[..got].copy_from_slice(f.payload);
                },
                1,
            ) {
                Ok(0) => i += 1,
                Ok(_) => {
                    conns[i].publication(2).offer_and_flush(1, &buf[..got])?;
                    i += 1;
                }
                Err(OrdersError::PeerLost(_)) => {
                    conns.swap_remove(i).close();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// The attacker, running: its lines read on a thread.
struct Flood {
    child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Flood {
    fn start(a: &RcFloodArgs, dst: IpAddr, srcs: &[IpAddr], port: u16) -> Result<Flood> {
        let srcs: Vec<String> = srcs.iter().map(ToString::to_string).collect();
        let hex: String = captured_request()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(&a.attacker)
            .args(["--dst", &dst.to_string(), "--port", &port.to_string()])
            .args(["--src", &srcs.join(","), "--replay", &hex])
            .args(["--rate", &a.rate.to_string(), "--seconds", "3600"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .with_context(|| {
                format!(
                    "starting {} with /usr/bin/python3 (python3-pyverbs: `cargo xtask setup`)",
                    a.attacker.display()
                )
            })?;
        let out = child.stdout.take().context("the attacker's output")?;
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let f = Flood { child, lines };
        // Under emulation python and pyverbs take seconds to load; measure
        // once the flood is under way.
        f.wait_for("flooding", Duration::from_secs(120))?;
        f.wait_for("progress 50", Duration::from_secs(120))?;
        Ok(f)
    }

    fn wait_for(&self, want: &str, within: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            let l = self
                .lines
                .recv_timeout(within.saturating_sub(t.elapsed()))
                .with_context(|| format!("the attacker printed no {want:?} within {within:?}"))?;
            if l == want {
                return Ok(());
            }
        }
    }

    /// Stops it; the attempts it made (its report's total).
    fn stop(mut self) -> Result<u64> {
        drop(self.child.stdin.take());
        let t = Instant::now();
        let report = loop {
            let l = self
                .lines
                .recv_timeout(Duration::from_secs(60).saturating_sub(t.elapsed()))
                .context("the attacker never reported")?;
            if l.starts_with('{') {
                break l;
            }
        };
        let st = self.child.wait()?;
        if !st.success() {
            bail!("the attacker failed ({st})");
        }
        let v: serde_json::Value = serde_json::from_str(&report)?;
        v["total"]["attempts"].as_u64().context("attempts")
    }
}

/// One phase's figures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phase {
    /// Median handshake time against the listener with its defaults, us.
    pub connect_us: f64,
    /// The same against the always-cookie listener, us.
    pub cookie_connect_us: f64,
    /// Ping-pong one-way latency (RTT/2), median, us.
    pub p50_us: f64,
    /// The same, 99th percentile, us.
    pub p99_us: f64,
    /// Listener time (us) per second of the phase.
    pub listener_us_per_s: f64,
    /// Requests the listeners refused per second.
    pub refused_per_s: f64,
    /// Time of the `accept` calls that refused requests over the requests
    /// they refused, us (NaN with none refused).
    pub us_per_refused: f64,
    /// The serving thread during the ping-pong only.
    pub pingpong: PingPongTurns,
}

/// Where the serving thread's time went during a phase's ping-pong: what
/// tells a slow listener call from a thread that was not running.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct PingPongTurns {
    /// The longest single `accept` call, us.
    pub listener_max_us: f64,
    /// `accept` calls longer than 1 ms.
    pub listener_slow: f64,
    /// The longest serving turn outside the `accept` calls, us.
    pub stall_max_us: f64,
    /// Serving turns longer than 1 ms outside the `accept` calls.
    pub stalls: f64,
    /// Round trips longer than 1 ms (of `--iterations`).
    pub slow_rtts: f64,
    /// Requests the listeners refused per second of the ping-pong.
    pub refused_per_s: f64,
}

fn median_us(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2)
        .map_or(f64::NAN, |d| d.as_nanos() as f64 / 1000.0)
}

/// The `FLOOD` line of one round: `FLOOD round=R attempts=A quiet:KEY=V ... flood:KEY=V
/// ...` (A: the attacker's connect requests, from its start to its stop; the flood's rate
/// is the listener's `refused_per_s` while flooded).
pub fn round_line(round: u32, attempts: u64, quiet: &Phase, flood: &Phase) -> String {
    let mut l = format!("FLOOD round={round} attempts={attempts}");
    for (name, p) in [("quiet", quiet), ("flood", flood)] {
        l.push_str(&format!(
            " {name}:connect_us={:.1} {name}:cookie_connect_us={:.1} {name}:p50_us={:.2} \
             {name}:p99_us={:.2} {name}:listener_us_per_s={:.1} {name}:refused_per_s={:.1} \
             {name}:us_per_refused={:.1} {name}:pp_listener_max_us={:.1} \
             {name}:pp_listener_slow={:.0} {name}:pp_stall_max_us={:.1} {name}:pp_stalls={:.0} \
             {name}:pp_slow_rtts={:.0} {name}:pp_refused_per_s={:.1}",
            p.connect_us,
            p.cookie_connect_us,
            p.p50_us,
            p.p99_us,
            p.listener_us_per_s,
            p.refused_per_s,
            p.us_per_refused,
            p.pingpong.listener_max_us,
            p.pingpong.listener_slow,
            p.pingpong.stall_max_us,
            p.pingpong.stalls,
            p.pingpong.slow_rtts,
            p.pingpong.refused_per_s,
        ));
    }
    l
}

fn measure(
    a: &RcFloodArgs,
    addrs: [SocketAddr; 2],
    conn: &mut Connection,
    shared: &Shared,
) -> Result<Phase> {
    // ORDERING: Relaxed: see `serve`.
    let (ns0, r0, busy0) = (
        shared.listener_ns.load(Ordering::Relaxed),
        shared.refused.load(Ordering::Relaxed),
        shared.refusing_ns.load(Ordering::Relaxed),
    );
    let t0 = Instant::now();
    let mut times: [Vec<Duration>; 2] = Default::default();
    for _ in 0..a.connects {
        for (i, addr) in addrs.iter().enumerate() {
            let t = Instant::now();
            let mut c = Connection::connect(&config(4), *addr)
                .with_context(|| format!("a healthy peer's connect to {addr}"))?;
            times[i].push(t.elapsed());
            c.close();
        }
    }
    let msg = vec![0x5au8; a.size];
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    // ORDERING: Relaxed: see `serve`; the maxima start again here, so they
    // cover the ping-pong only (not the healthy peer's handshakes above).
    shared.listener_max_ns.swap(0, Ordering::Relaxed);
    shared.stall_max_ns.swap(0, Ordering::Relaxed);
    let pp0 = (
        shared.listener_slow.load(Ordering::Relaxed),
        shared.stalls.load(Ordering::Relaxed),
        shared.refused.load(Ordering::Relaxed),
    );
    let tp = Instant::now();
    let mut slow_rtts = 0u64;
    for _ in 0..a.iterations {
        let t = Instant::now();
        conn.publication(1).offer_and_flush(1, &msg)?;
        while conn.subscription().poll(|_| {}, 1)? == 0 {}
        let rtt = t.elapsed().as_nanos() as u64;
        slow_rtts += u64::from(rtt > SLOW_NS);
        hist.record((rtt / 2).max(1))?;
    }
    let pp_secs = tp.elapsed().as_secs_f64();
    // ORDERING: Relaxed, as above.
    let pingpong = PingPongTurns {
        listener_max_us: shared.listener_max_ns.load(Ordering::Relaxed) as f64 / 1000.0,
        listener_slow: (shared.listener_slow.load(Ordering::Relaxed) - pp0.0) as f64,
        stall_max_us: shared.stall_max_ns.load(Ordering::Relaxed) as f64 / 1000.0,
        stalls: (shared.stalls.load(Ordering::Relaxed) - pp0.1) as f64,
        slow_rtts: slow_rtts as f64,
        refused_per_s: (shared.refused.load(Ordering::Relaxed) - pp0.2) as f64 / pp_secs,
    };
    let secs = t0.elapsed().as_secs_f64();
    // ORDERING: Relaxed, as at the phase's start: see `serve`.
    let (ns1, r1, busy1) = (
        shared.listener_ns.load(Ordering::Relaxed),
        shared.refused.load(Ordering::Relaxed),
        shared.refusing_ns.load(Ordering::Relaxed),
    );
    let [plain, cookie] = times;
    Ok(Phase {
        connect_us: median_us(plain),
        cookie_connect_us: median_us(cookie),
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        listener_us_per_s: (ns1 - ns0) as f64 / 1000.0 / secs,
        refused_per_s: (r1 - r0) as f64 / secs,
        us_per_refused: (busy1 - busy0) as f64 / 1000.0 / (r1 - r0) as f64,
        pingpong,
    })
}

fn pin(cores: &[usize], i: usize) {
    if let Some(c) = cores.get(i) {
        if !rocebus::idle::pin_current_thread(*c) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

/// Runs the rounds; prints a `FLOOD` line per round and a `RESULT` line.
pub fn run(a: &RcFloodArgs) -> Result<()> {
    let ip = crate::rc::local_ip(a.addr)?;
    let addrs = [SocketAddr::new(ip, a.port), SocketAddr::new(ip, a.port + 1)];
    let sources = if a.flood_src.is_empty() {
        vec![ip]
    } else {
        a.flood_src.clone()
    };
    let srcs: Vec<IpAddr> = sources
        .iter()
        .copied()
        .cycle()
        .take(a.procs.max(1))
        .collect();
    let mut listeners = [
        OrdersListener::bind(config(4), addrs[0])?,
        OrdersListener::bind(config(0), addrs[1])?,
    ];
    let shared = Arc::new(Shared::default());
    let server = {
        let (shared, cores) = (shared.clone(), a.cores.clone());
        std::thread::spawn(move || -> Result<()> {
            pin(&cores, 1);
            serve(&mut listeners, &shared)
        })
    };
    pin(&a.cores, 0);
    let result = (|| -> Result<Vec<(Phase, Phase)>> {
        let mut conn = Connection::connect(&config(4), addrs[0])?;
        let warm_up = RcFloodArgs {
            connects: 1,
            ..a.clone()
        };
        let warm = measure(&warm_up, addrs, &mut conn, &shared)?;
        eprintln!("warm-up: {warm:?}");
        let mut rounds = Vec::new();
        for r in 1..=a.rounds {
            let quiet = measure(a, addrs, &mut conn, &shared)?;
            // The flood aims at the listener with its defaults.
            let flood = Flood::start(a, ip, &srcs, addrs[0].port())?;
            let flooded = measure(a, addrs, &mut conn, &shared);
            let attempts = flood.stop()?;
            let flooded = flooded?;
            println!("{}", round_line(r, attempts, &quiet, &flooded));
            rounds.push((quiet, flooded));
        }
        conn.close();
        Ok(rounds)
    })();
    // ORDERING: Relaxed: see `serve`.
    shared.stop.store(true, Ordering::Relaxed);
    server
        .join()
        .map_err(|_| anyhow::anyhow!("the serving thread panicked"))??;
    let rounds = result?;
    let med = |f: &dyn Fn(&Phase, &Phase) -> f64| {
        let mut v: Vec<f64> = rounds.iter().map(|(q, f_)| f(q, f_)).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let connect = med(&|q, f| f.connect_us / q.connect_us);
    let cookie = med(&|q, f| f.cookie_connect_us / q.cookie_connect_us);
    let cookie_over_plain = med(&|q, _| q.cookie_connect_us / q.connect_us);
    let p50 = med(&|q, f| f.p50_us / q.p50_us);
    let p99 = med(&|q, f| f.p99_us / q.p99_us);
    let per_refused = med(&|_, f| f.us_per_refused);
    let rate = med(&|_, f| f.refused_per_s);
    crate::report::emit_result(&format!(
        "RESULT connect_ratio={connect:.3} cookie_connect_ratio={cookie:.3} \
         cookie_over_plain={cookie_over_plain:.3} p50_ratio={p50:.3} p99_ratio={p99:.3} \
         listener_us_per_refused={per_refused:.2} refused_per_s={rate:.1}"
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_captured_request_is_an_orders_connect_request() {
        // cm_flood.py takes it: a 32-byte hello, 8 of nonce tail, a 16-byte proof.
        assert_eq!(captured_request().len(), 56);
    }

    #[test]
    fn the_round_line_carries_both_phases() {
        let p = Phase {
            connect_us: 1000.0,
            cookie_connect_us: 1500.0,
            p50_us: 10.0,
            p99_us: 30.0,
            listener_us_per_s: 100.0,
            refused_per_s: 0.0,
            us_per_refused: f64::NAN,
            pingpong: PingPongTurns::default(),
        };
        let l = round_line(
            2,
            874,
            &p,
            &Phase {
                refused_per_s: 80.0,
                us_per_refused: 150.0,
                ..p
            },
        );
        assert!(
            l.starts_with("FLOOD round=2 attempts=874 quiet:connect_us=1000.0 "),
            "{l}"
        );
        assert!(l.contains(" quiet:us_per_refused=NaN"), "{l}");
        assert!(
            l.contains(" flood:refused_per_s=80.0 flood:us_per_refused=150.0"),
            "{l}"
        );
    }
}
