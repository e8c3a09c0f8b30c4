//! Shared-memory harnesses: `ipc-latency` (ping-pong round trip, two
//! spinning threads pinned to two cores, as Aeron's embedded ping-pong
//! sample does) and `ipc-throughput` (64-byte messages per second from one
//! publisher to one spinning subscriber), and `ipc-floor`, the hardware's floor under
//! the first (a bare ping-pong of one cache line each way between the same two cores).
//! `cargo xtask bench ipc` runs them beside the same harnesses on Aeron's `aeron:ipc`.

use crate::report::Summary;
use anyhow::{bail, Result};
use hdrhistogram::Histogram;
use rocebus::clock::Mono;
use rocebus::ipc::{IpcConfig, IpcEvent, IpcOfferError, IpcPublisher, IpcSubscriber};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Options of the IPC harnesses.
#[derive(Debug, Clone, clap::Args)]
pub struct IpcArgs {
    /// Payload bytes per message.
    #[arg(long, short = 's', default_value_t = 64)]
    pub size: usize,
    /// Round trips (latency) or messages (throughput), after a warm-up of a tenth as many.
    #[arg(long, short = 'n', default_value_t = 1_000_000)]
    pub iterations: u64,
    /// Pin the two threads to these cores.
    #[arg(long, value_delimiter = ',', default_value = "0,1")]
    pub cores: Vec<usize>,
    /// Ring bytes per stream. Aeron C's IPC default is three 64 MiB terms, of which a
    /// publisher may run half a term (32 MiB) ahead of its subscriber; this ring lets the
    /// rocebus publisher run at most its own size ahead, so the stream comparison never
    /// favours rocebus by buffering.
    #[arg(long, default_value_t = 128 << 10)]
    pub ring_bytes: usize,
    /// Folder of the stream files (created 0700; one others can write is refused).
    #[arg(long, default_value = "/dev/shm/rocebus-bench-ipc")]
    pub dir: std::path::PathBuf,
}

fn pin(cores: &[usize], i: usize) {
    if let Some(c) = cores.get(i) {
        if !rocebus::idle::pin_current_thread(*c) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

fn config(a: &IpcArgs) -> IpcConfig {
    IpcConfig {
        dir: a.dir.clone(),
        ring_bytes: a.ring_bytes,
        max_payload: (a.ring_bytes / 4).min(64 << 10),
        ..IpcConfig::default()
    }
}

fn names() -> (String, String) {
    let id = std::process::id();
    (format!("bench-ping-{id}"), format!("bench-pong-{id}"))
}

fn connect(s: &mut IpcSubscriber) -> Result<()> {
    let t = Instant::now();
    let mut ok = false;
    while !ok {
        s.poll(Mono::now(), |_| {}, 1).unwrap();
        ok |= matches!(s.poll_event(), Some(IpcEvent::Connected { .. }));
        if t.elapsed() > Duration::from_secs(10) {
            bail!("the IPC stream never appeared");
        }
    }
    Ok(())
}

fn offer_spin(p: &mut IpcPublisher, payload: &[u8]) -> Result<()> {
    loop {
        match p.try_claim(1, payload.len()) {
            Ok(mut c) => {
                c.copy_from_slice(payload);
                c.commit();
                return Ok(());
            }
            Err(IpcOfferError::BackPressured) => std::hint::spin_loop(),
            Err(e) => bail!("{e}"),
        }
    }
}

/// Ping-pong: prints the round-trip percentiles and a `RESULT` line.
pub fn latency(a: &IpcArgs) -> Result<()> {
    let cfg = config(a);
    let (ping, pong) = names();
    let mut ping_pub = IpcPublisher::new(&cfg, &ping)?;
    let mut pong_pub = IpcPublisher::new(&cfg, &pong)?;
    let mut ping_sub = IpcSubscriber::new(&cfg, &ping)?;
    let mut pong_sub = IpcSubscriber::new(&cfg, &pong)?;
    connect(&mut ping_sub)?;
    connect(&mut pong_sub)?;
    let total = a.iterations + a.iterations / 10;
    let cores = a.cores.clone();
    let echo = std::thread::spawn(move || -> Result<()> {
        pin(&cores, 1);
        let mut done = 0;
        // The clock only paces the subscriber's looks for its publisher: one
        // read per thousand turns, as a spinning engine would.
        let mut now = Mono::now();
        let mut turns = 0u32;
        while done < total {
            turns = turns.wrapping_add(1);
            if turns % 1024 == 0 {
                now = Mono::now();
            }
            let mut err = None;
            ping_sub
                .poll(
                    now,
                    |m| {
                        // Echo in place: claim, copy, commit, as Aeron's pong does.
                        if let Err(x) = offer_spin(&mut pong_pub, m.payload) {
                            err = Some(x);
                        }
                        done += 1;
                    },
                    16,
                )
                .unwrap();
            if let Some(e) = err {
                return Err(e);
            }
        }
        Ok(())
    });
    pin(&a.cores, 0);
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)?;
    let mut msg = vec![0u8; a.size.max(8)];
    for i in 0..total {
        // Read outside the timed round trip (it only paces liveness looks).
        let now = Mono::now();
        let t0 = Instant::now();
        msg[..8].copy_from_slice(&i.to_le_bytes());
        offer_spin(&mut ping_pub, &msg)?;
        let mut got = false;
        while !got {
            pong_sub
                .poll(now, |m| got = m.payload[..8] == i.to_le_bytes(), 16)
                .unwrap();
        }
        if i >= a.iterations / 10 {
            h.record(t0.elapsed().as_nanos() as u64)?;
        }
    }
    echo.join().expect("echo thread")?;
    let s = Summary::of(&h);
    println!("rocebus ipc round trip, {} B: {s}", a.size);
    crate::report::emit_result(&s.result_line());
    Ok(())
}

/// One-way stream: prints the subscriber's message rate.
pub fn throughput(a: &IpcArgs) -> Result<()> {
    let cfg = config(a);
    let (name, _) = names();
    let mut publisher = IpcPublisher::new(&cfg, &name)?;
    let mut sub = IpcSubscriber::new(&cfg, &name)?;
    connect(&mut sub)?;
    let total = a.iterations + a.iterations / 10;
    let warm = a.iterations / 10;
    let cores = a.cores.clone();
    let reader = std::thread::spawn(move || -> f64 {
        pin(&cores, 1);
        let mut n = 0u64;
        let mut start = None;
        let mut sum = 0u64;
        let mut now = Mono::now();
        let mut turns = 0u32;
        while n < total {
            turns = turns.wrapping_add(1);
            if turns % 1024 == 0 {
                now = Mono::now();
            }
            sub.poll(
                now,
                |m| {
                    sum = sum.wrapping_add(m.payload[0] as u64);
                    n += 1;
                    if n == warm {
                        start = Some(Instant::now());
                    }
                },
                256,
            )
            .unwrap();
        }
        std::hint::black_box(sum);
        (total - warm) as f64 / start.expect("warm-up").elapsed().as_secs_f64()
    });
    pin(&a.cores, 0);
    let msg = vec![7u8; a.size];
    for _ in 0..total {
        offer_spin(&mut publisher, &msg)?;
    }
    let rate = reader.join().expect("reader thread");
    println!("rocebus ipc throughput, {} B: {rate:.0} msg/s", a.size);
    crate::report::emit_result(&format!("RESULT msgs_per_sec={rate:.0}"));
    Ok(())
}

/// One word alone in its 128 bytes (the x86-64 prefetcher fetches lines in pairs), so the
/// two directions of the floor's ping-pong never share a line.
#[repr(align(128))]
#[derive(Default)]
struct Line(AtomicU64);

/// The floor under [`latency`]: a bare ping-pong between the same two pinned cores, the
/// main thread storing round `i` into one line and spinning until the echo thread has
/// stored it into the other: two cache-line transfers a round trip and no other work.
/// Timed like [`latency`] (one `Instant` pair a round trip, the same warm-up); prints the
/// same `RESULT` line.
pub fn floor(a: &IpcArgs) -> Result<()> {
    let (ping, pong) = (Arc::new(Line::default()), Arc::new(Line::default()));
    let total = a.iterations + a.iterations / 10;
    let cores = a.cores.clone();
    let echo = {
        let (ping, pong) = (ping.clone(), pong.clone());
        std::thread::spawn(move || {
            pin(&cores, 1);
            for i in 1..=total {
                // ORDERING: nothing but the word itself is handed over, so Relaxed would
                // do; Acquire/Release is what a real hand-over of a message costs (free on
                // x86-64) and keeps the floor honest for other targets.
                while ping.0.load(Ordering::Acquire) != i {
                    std::hint::spin_loop();
                }
                pong.0.store(i, Ordering::Release);
            }
        })
    };
    pin(&a.cores, 0);
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)?;
    for i in 1..=total {
        let t0 = Instant::now();
        // ORDERING: as in the echo thread above.
        ping.0.store(i, Ordering::Release);
        while pong.0.load(Ordering::Acquire) != i {
            std::hint::spin_loop();
        }
        if i > a.iterations / 10 {
            h.record(t0.elapsed().as_nanos() as u64)?;
        }
    }
    echo.join().expect("echo thread");
    let s = Summary::of(&h);
    println!("bare one-word ping-pong, two cache lines: {s}");
    crate::report::emit_result(&s.result_line());
    Ok(())
}
