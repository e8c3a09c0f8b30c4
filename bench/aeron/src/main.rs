//! Aeron's `aeron:ipc` measured exactly as `rocebus-bench ipc-latency` and
//! `ipc-throughput` measure rocebus's shared-memory transport: an embedded
//! media driver (non-sparse, pre-touched term buffers, as in Aeron's
//! embedded ping-pong), spinning ping and pong threads pinned to two cores,
//! exclusive publications, `try_claim` in the pong as in Aeron's samples.
//! Ends with the same `RESULT` line as the rocebus harness.
//!
//! Usage: `rocebus-aeron-bench latency|throughput ITERATIONS SIZE CORE0,CORE1`

use hdrhistogram::Histogram;
use rusteron_client::*;
use rusteron_media_driver::testing::EmbeddedDriver;
use std::error::Error;
use std::hint::spin_loop;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PING_STREAM: i32 = 1002;
const PONG_STREAM: i32 = 1003;
const CHANNEL: &std::ffi::CStr = c"aeron:ipc";
const FRAGMENT_LIMIT: usize = 10;

type Res<T> = Result<T, Box<dyn Error + Send + Sync>>;

fn pin(cores: &[usize], i: usize) {
    if let Some(&c) = cores.get(i) {
        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
            eprintln!("warning: could not pin to core {c}");
        }
    }
}

fn client(dir: &str) -> Res<Aeron> {
    let context = AeronContext::new()?;
    context.set_dir(&std::ffi::CString::new(dir)?)?;
    context.set_pre_touch_mapped_memory(true)?;
    let aeron = Aeron::new(&context)?;
    aeron.start()?;
    Ok(aeron)
}

fn claim_copy(p: &AeronExclusivePublication, buf: &[u8]) -> Res<()> {
    loop {
        match p.try_claim_owned(buf.len()) {
            Ok(mut claim) => {
                claim.data().copy_from_slice(buf);
                claim.commit()?;
                return Ok(());
            }
            Err(e) if e.is_retryable() => spin_loop(),
            Err(e) => return Err(e.into()),
        }
    }
}

fn latency(dir: &str, iterations: u64, size: usize, cores: Vec<usize>) -> Res<()> {
    let running = Arc::new(AtomicBool::new(true));
    let pong = {
        let (running, dir, cores) = (running.clone(), dir.to_string(), cores.clone());
        std::thread::spawn(move || -> Res<()> {
            pin(&cores, 1);
            let aeron = client(&dir)?;
            let publication = aeron
                .async_add_exclusive_publication(CHANNEL, PONG_STREAM)?
                .poll_blocking(Duration::from_secs(10))?;
            let subscription = aeron
                .async_add_subscription(CHANNEL, PING_STREAM, Handlers::NONE, Handlers::NONE)?
                .poll_blocking(Duration::from_secs(10))?;
            let mut failure = None;
            while running.load(Ordering::Acquire) {
                let n = subscription.poll_fn(
                    |buf, _| {
                        if failure.is_none() {
                            failure = claim_copy(&publication, buf).err();
                        }
                    },
                    FRAGMENT_LIMIT,
                )?;
                if let Some(e) = failure.take() {
                    return Err(e);
                }
                if n == 0 {
                    spin_loop();
                }
            }
            Ok(())
        })
    };
    pin(&cores, 0);
    let aeron = client(dir)?;
    let publication = aeron
        .async_add_exclusive_publication(CHANNEL, PING_STREAM)?
        .poll_blocking(Duration::from_secs(10))?;
    let subscription = aeron
        .async_add_subscription(CHANNEL, PONG_STREAM, Handlers::NONE, Handlers::NONE)?
        .poll_blocking(Duration::from_secs(10))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let image = loop {
        if publication.is_connected() {
            if let Some(image) = subscription.image_at_index(0) {
                break image;
            }
        }
        if Instant::now() > deadline {
            return Err("pong never connected".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut h = Histogram::<u64>::new_with_bounds(1, 10_000_000_000, 3)?;
    let mut buf = vec![0u8; size.max(8)];
    let warm = iterations / 10;
    for i in 0..iterations + warm {
        let t0 = Instant::now();
        buf[..8].copy_from_slice(&i.to_le_bytes());
        let position = loop {
            match publication.offer(&buf) {
                Ok(p) => break p,
                Err(e) if e.is_retryable() => spin_loop(),
                Err(e) => return Err(e.into()),
            }
        };
        while image.position() < position {
            if image.poll_fn(|_, _| {}, FRAGMENT_LIMIT)? == 0 {
                spin_loop();
            }
        }
        if i >= warm {
            h.record(t0.elapsed().as_nanos() as u64)?;
        }
    }
    running.store(false, Ordering::Release);
    pong.join().expect("pong thread")?;
    println!(
        "aeron ipc round trip, {size} B: p50 {} ns, p99 {} ns, max {} ns",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.max()
    );
    println!(
        "RESULT p50_ns={} p90_ns={} p99_ns={} p999_ns={} max_ns={} count={}",
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.9),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max(),
        h.len()
    );
    Ok(())
}

fn throughput(dir: &str, iterations: u64, size: usize, cores: Vec<usize>) -> Res<()> {
    let warm = iterations / 10;
    let total = iterations + warm;
    let reader = {
        let (dir, cores) = (dir.to_string(), cores.clone());
        std::thread::spawn(move || -> Res<f64> {
            pin(&cores, 1);
            let aeron = client(&dir)?;
            let subscription = aeron
                .async_add_subscription(CHANNEL, PING_STREAM, Handlers::NONE, Handlers::NONE)?
                .poll_blocking(Duration::from_secs(10))?;
            let (mut n, mut start, mut sum) = (0u64, None, 0u64);
            while n < total {
                subscription.poll_fn(
                    |buf, _| {
                        sum = sum.wrapping_add(buf[0] as u64);
                        n += 1;
                        if n == warm {
                            start = Some(Instant::now());
                        }
                    },
                    256,
                )?;
            }
            std::hint::black_box(sum);
            Ok((total - warm) as f64 / start.expect("warm-up").elapsed().as_secs_f64())
        })
    };
    pin(&cores, 0);
    let aeron = client(dir)?;
    let publication = aeron
        .async_add_exclusive_publication(CHANNEL, PING_STREAM)?
        .poll_blocking(Duration::from_secs(10))?;
    while !publication.is_connected() {
        std::thread::sleep(Duration::from_millis(10));
    }
    let buf = vec![7u8; size];
    for _ in 0..total {
        claim_copy(&publication, &buf)?;
    }
    let rate = reader.join().expect("reader thread")?;
    println!("aeron ipc throughput, {size} B: {rate:.0} msg/s");
    println!("RESULT msgs_per_sec={rate:.0}");
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 5 {
        return Err(
            "usage: rocebus-aeron-bench latency|throughput ITERATIONS SIZE CORE0,CORE1".into(),
        );
    }
    let iterations: u64 = args[2].parse()?;
    let size: usize = args[3].parse()?;
    let cores: Vec<usize> = args[4]
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let driver = EmbeddedDriver::launch_with(|context| {
        context.set_term_buffer_sparse_file(false)?;
        Ok(())
    })?;
    let dir = driver.dir().to_string();
    match args[1].as_str() {
        "latency" => latency(&dir, iterations, size, cores),
        "throughput" => throughput(&dir, iterations, size, cores),
        other => Err(format!("unknown mode {other}").into()),
    }
}
