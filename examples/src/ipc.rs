//! Shared memory between processes on one host: one publisher, any number of subscribers.
//!
//! ```text
//! example-ipc subscribe quotes 100000     # start the subscribers first, in other shells
//! example-ipc publish   quotes 100000 1   # waits for 1 subscriber, then publishes
//! ```
//!
//! The publisher sends COUNT messages (type 1, a counter as 8 bytes), back-pressured by the
//! slowest subscriber, and exits once every subscriber has read everything; each subscriber
//! checks it saw every message once and in order.
use rocebus::clock::Mono;
use rocebus::ipc::{IpcConfig, IpcEvent, IpcOfferError, IpcPublisher, IpcSubscriber};
use std::time::{Duration, Instant};

fn main() {
    // rocebus reports what it drops or retries through `tracing`: RUST_LOG=info shows it.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run() {
        eprintln!("example-ipc: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The stream's directory: /dev/shm/rocebus-ipc-UID unless ROCEBUS_IPC_DIR says otherwise.
    let mut cfg = IpcConfig::default();
    if let Some(dir) = std::env::var_os("ROCEBUS_IPC_DIR") {
        cfg.dir = dir.into();
    }
    match &args[..] {
        [m, name, count] if m == "subscribe" => subscribe(&cfg, name, count.parse()?),
        [m, name, count, subs] if m == "publish" => {
            publish(&cfg, name, count.parse()?, subs.parse()?)
        }
        _ => Err("usage: example-ipc subscribe NAME COUNT | publish NAME COUNT SUBSCRIBERS".into()),
    }
}

fn publish(
    cfg: &IpcConfig,
    name: &str,
    count: u64,
    subscribers: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut publisher = IpcPublisher::new(cfg, name)?;
    println!("stream {}", publisher.path().display());
    let deadline = Instant::now() + Duration::from_secs(60);
    // Subscribers join at the newest message: wait for them before publishing.
    while publisher.subscribers().len() < subscribers {
        if Instant::now() > deadline {
            return Err(format!("fewer than {subscribers} subscribers joined in 60 s").into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut n = 0u64;
    while n < count {
        match publisher.offer(1, &n.to_le_bytes()) {
            Ok(()) => n += 1,
            // The slowest subscriber is a ring behind: let it read, then try again.
            Err(IpcOfferError::BackPressured) => {
                publisher.poll(Mono::now()); // frees the slots of subscribers that died
                while let Some(event) = publisher.poll_event() {
                    println!("publisher: {event:?}");
                }
                std::thread::yield_now();
            }
            Err(e) => return Err(e.into()),
        }
    }
    // Stay until every subscriber has read everything (bytes behind: the third field).
    while publisher
        .subscribers()
        .iter()
        .any(|&(_, _, behind)| behind > 0)
    {
        if Instant::now() > deadline {
            return Err("subscribers did not catch up in 60 s".into());
        }
        publisher.poll(Mono::now());
        std::thread::sleep(Duration::from_millis(1));
    }
    println!("published {n} messages");
    Ok(())
}

fn subscribe(cfg: &IpcConfig, name: &str, count: u64) -> Result<(), Box<dyn std::error::Error>> {
    // Never blocks: it joins when the publisher is there.
    let mut subscriber = IpcSubscriber::new(cfg, name)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut next, mut wrong) = (0u64, None);
    while next < count {
        let n = subscriber.poll(
            Mono::now(),
            |m| match <[u8; 8]>::try_from(m.payload) {
                Ok(b) if u64::from_le_bytes(b) == next => next += 1,
                _ => wrong = Some(next),
            },
            64,
        )?;
        if let Some(at) = wrong {
            return Err(format!("message {at} missing or out of order").into());
        }
        if n == 0 {
            // Nothing came: a trading engine would spin on a pinned core; an example shares one.
            std::thread::yield_now();
        }
        while let Some(event) = subscriber.poll_event() {
            match event {
                IpcEvent::Connected { publisher_pid, .. } => {
                    println!("joined publisher {publisher_pid}")
                }
                IpcEvent::Dropped { skipped_bytes } => {
                    return Err(format!("lost {skipped_bytes} bytes").into())
                }
                other => println!("subscriber: {other:?}"),
            }
        }
        if Instant::now() > deadline {
            return Err(format!("only {next} of {count} messages in 60 s").into());
        }
    }
    println!("received {next} messages in order");
    Ok(())
}
