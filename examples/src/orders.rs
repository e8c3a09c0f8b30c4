//! The orders path: one RC connection, messages RDMA-written into the peer's ring.
//!
//! ```text
//! ROCEBUS_ORDERS_TOKEN=$(rocebus keygen) example-orders listen 198.18.0.1:7470 1000
//! ROCEBUS_ORDERS_TOKEN=...same...        example-orders send   198.18.0.1:7470 1000
//! ```
//!
//! `send` sends COUNT orders (message type 1, the order number as 8 bytes) and waits until
//! each is acknowledged; `listen` accepts one connection, checks every order arrives once
//! and in order, and acknowledges each (message type 2, the same 8 bytes).
use rocebus::orders::{Connection, OrdersConfig, OrdersListener};
use std::time::{Duration, Instant};

const ORDER: u16 = 1;
const ACK: u16 = 2;

fn main() {
    // rocebus reports what it drops or retries through `tracing`: RUST_LOG=info shows it.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run() {
        eprintln!("example-orders: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [mode, addr, count] = &args[..] else {
        return Err(
            "usage: example-orders listen|send ADDR:PORT COUNT (token in ROCEBUS_ORDERS_TOKEN)"
                .into(),
        );
    };
    let (addr, count): (std::net::SocketAddr, u64) = (addr.parse()?, count.parse()?);
    let token = std::env::var("ROCEBUS_ORDERS_TOKEN")
        .map_err(|_| "set ROCEBUS_ORDERS_TOKEN (e.g. `rocebus keygen`)")?;
    rocebus::auth::check_secret(&token).map_err(|e| format!("ROCEBUS_ORDERS_TOKEN {e}"))?;
    let cfg = OrdersConfig {
        token,
        ..OrdersConfig::default()
    };
    match mode.as_str() {
        "listen" => listen(cfg, addr, count),
        "send" => send(&cfg, addr, count),
        _ => Err(format!("unknown mode {mode:?}: listen or send").into()),
    }
}

fn listen(
    cfg: OrdersConfig,
    addr: std::net::SocketAddr,
    count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut listener = OrdersListener::bind(cfg, addr)?;
    println!("listening on {addr}");
    let mut conn = loop {
        // Each call drives the handshakes in progress for at most the timeout.
        if let Some(conn) = listener.accept(Duration::from_secs(1))? {
            break conn;
        }
    };
    println!("connected: {}", conn.peer());
    let mut next = 0u64;
    let mut bad = None;
    while next < count {
        let mut got = Vec::new();
        // The handler sees a copy of each frame; answer after the poll (the connection is
        // borrowed while it runs).
        conn.subscription().poll(
            |f| match <[u8; 8]>::try_from(f.payload) {
                Ok(b) if f.msg_type == ORDER => got.push(u64::from_le_bytes(b)),
                _ => bad = Some((f.msg_type, f.payload.len())),
            },
            64,
        )?;
        if got.is_empty() {
            // Nothing came: a trading engine would spin on a pinned core; an example shares one.
            std::thread::yield_now();
        }
        if let Some((t, len)) = bad {
            return Err(format!("unexpected message: type {t}, {len} bytes").into());
        }
        for n in got {
            if n != next {
                return Err(format!("order {n} arrived where {next} was due").into());
            }
            next += 1;
            conn.publication(1).offer(ACK, &n.to_le_bytes())?;
        }
        conn.flush()?;
    }
    // The last acknowledgements reach the sender before it goes: it waits for every one, so
    // its disconnect is the end. (`drain` returns once it has read them, or fails once it left.)
    let _ = conn.drain(Duration::from_secs(5));
    println!("received {next} orders in order, acknowledged each");
    Ok(())
}

fn send(
    cfg: &OrdersConfig,
    addr: std::net::SocketAddr,
    count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut conn = Connection::connect(cfg, addr)?;
    let started = Instant::now();
    let (mut sent, mut acked) = (0u64, 0u64);
    while acked < count {
        if sent < count && sent - acked < 64 {
            // Zero copy: the claim is the registered memory the NIC sends from.
            let mut orders = conn.publication(1);
            let mut claim = orders.try_claim(ORDER, 8)?;
            claim.copy_from_slice(&sent.to_le_bytes());
            claim.commit();
            orders.flush()?; // one RDMA WRITE for every claim since the last flush
            sent += 1;
        }
        let mut wrong = None;
        let n = conn.subscription().poll(
            |f| match <[u8; 8]>::try_from(f.payload) {
                Ok(b) if f.msg_type == ACK && u64::from_le_bytes(b) == acked => acked += 1,
                _ => wrong = Some(f.seq),
            },
            64,
        )?;
        if n == 0 {
            std::thread::yield_now(); // as in `listen`
        }
        if let Some(seq) = wrong {
            return Err(format!("acknowledgement {seq} is not the one due ({acked})").into());
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("only {acked} of {count} acknowledged after 60 s").into());
        }
    }
    println!(
        "sent {sent} orders, {acked} acknowledged in {:?}",
        started.elapsed()
    );
    Ok(())
}
