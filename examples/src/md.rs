//! Market data: one publisher, any number of subscribers, on the transport the channel's
//! configuration names (`transport = "multicast"`, UD multicast with recovery over RC, or
//! `"rc"`, RC fan-out). The code is the same for both.
//!
//! ```text
//! example-md subscribe md.toml 1 198.18.0.2 198.18.0.1 100000   # on each subscriber host
//! example-md publish   md.toml 1 198.18.0.1 100000 1            # waits for 1 subscriber
//! ```
//!
//! The publisher sends COUNT messages (a counter as 8 bytes), keeps serving repairs until the
//! subscribers have gone (at most a minute), then exits; each subscriber checks it saw every
//! counter once and in order (or restored a snapshot of the counter when it joined late) and
//! exits once it saw the last, or fails when nothing new came for 30 s.
use rocebus::clock::Mono;
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::{
    Event, Handler, MdPublisher, MdSubscriber, RestoreError, Snapshot, SnapshotSink,
};
use std::net::IpAddr;
use std::time::{Duration, Instant};

fn main() {
    // rocebus reports what it drops or retries through `tracing`: RUST_LOG=info shows it.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run() {
        eprintln!("example-md: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: example-md publish CONFIG CHANNEL LOCAL_IP COUNT SUBSCRIBERS\n       \
                 example-md subscribe CONFIG CHANNEL LOCAL_IP PUBLISHER_IP COUNT";
    let [mode, config, channel, local, rest @ ..] = &args[..] else {
        return Err(usage.into());
    };
    let cfg = McastConfig::load(config)?;
    // Who may publish and recover is decided by this secret: a random key, never a word.
    rocebus::auth::check_secret(&cfg.auth.secret).map_err(|e| format!("[auth] secret {e}"))?;
    let (channel, local): (u16, IpAddr) = (channel.parse()?, local.parse()?);
    match (mode.as_str(), rest) {
        ("publish", [count, subs]) => publish(&cfg, channel, local, count.parse()?, subs.parse()?),
        ("subscribe", [publisher, count]) => {
            subscribe(&cfg, channel, local, publisher.parse()?, count.parse()?)
        }
        _ => Err(usage.into()),
    }
}

/// The application's state, which a late joiner restores: here, the last counter sent.
struct Counter {
    seq: u64,
    value: u64,
}

impl Snapshot for Counter {
    fn snapshot_seq(&self) -> u64 {
        self.seq
    }
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.value.to_le_bytes());
    }
}

fn publish(
    cfg: &McastConfig,
    channel: u16,
    local: IpAddr,
    count: u64,
    subscribers: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let session = u64::from(std::process::id()); // new for every run of a publisher
    let mut publisher = MdPublisher::new(cfg, channel, session, local)?;
    let mut state = Counter { seq: 0, value: 0 };
    let deadline = Instant::now() + Duration::from_secs(60);
    // Subscribers connect to the publisher (recovery link, or the stream itself on RC).
    while publisher.connections() < subscribers {
        if Instant::now() > deadline {
            return Err(format!("fewer than {subscribers} subscribers connected in 60 s").into());
        }
        publisher.poll(Mono::now(), &state)?;
        std::thread::yield_now();
    }
    while state.value < count {
        let now = Mono::now(); // the one clock read of this turn
        state.seq = publisher.offer(now, &state.value.to_le_bytes())?;
        state.value += 1;
        publisher.poll(now, &state)?; // sends what is due, answers repairs and snapshots
        while let Some(event) = publisher.poll_event() {
            println!("publisher: {event:?}");
        }
    }
    publisher.flush(Mono::now())?;
    // Keep answering repair requests until every subscriber has gone (each leaves once it
    // has the last message), at most 60 s: one that is behind may still need repairs.
    let linger = Instant::now() + Duration::from_secs(60);
    while publisher.connections() > 0 && Instant::now() < linger {
        if publisher.poll(Mono::now(), &state)? == 0 {
            std::thread::yield_now();
        }
    }
    println!(
        "published {} messages, last sequence {}",
        state.value, state.seq
    );
    Ok(())
}

/// What the subscriber keeps: the next counter due.
struct Check {
    next: u64,
    restored: bool,
    wrong: Option<u64>,
}

impl Handler for Check {
    fn on_message(&mut self, _seq: u64, msg: &[u8]) {
        match <[u8; 8]>::try_from(msg) {
            Ok(b) if u64::from_le_bytes(b) == self.next => self.next += 1,
            _ => self.wrong = Some(self.next),
        }
    }
}

impl SnapshotSink for Check {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        let b = <[u8; 8]>::try_from(data).map_err(|_| RestoreError)?;
        self.next = u64::from_le_bytes(b); // the counter the next message carries
        Ok(())
    }
    fn finish_restore(&mut self, _seq: u64) -> Result<(), RestoreError> {
        self.restored = true;
        Ok(())
    }
}

fn subscribe(
    cfg: &McastConfig,
    channel: u16,
    local: IpAddr,
    publisher: IpAddr,
    count: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    // Never waits: the connection is made by the polls and reported as an event.
    let mut subscriber = MdSubscriber::new(cfg, channel, local, publisher)?;
    let mut app = Check {
        next: 0,
        restored: false,
        wrong: None,
    };
    // A stall is an error, a slow run is not (on a loaded machine this can take minutes):
    // nothing new for 30 s, or 60 s before the first message while the publisher starts.
    let mut progress = (app.next, Instant::now());
    while app.next < count {
        if subscriber.poll(Mono::now(), &mut app, 16)? == 0 {
            // Nothing came: a trading engine would spin on a pinned core; an example shares one.
            std::thread::yield_now();
        }
        if let Some(at) = app.wrong {
            return Err(format!("counter {at} missing or out of order").into());
        }
        while let Some(event) = subscriber.poll_event() {
            if let Event::UnrecoverableLoss { .. } = event {
                return Err(format!("{event:?}").into());
            }
            println!("subscriber: {event:?}"); // connected, resync, snapshot, ...
        }
        if app.next != progress.0 {
            progress = (app.next, Instant::now());
        }
        let limit = Duration::from_secs(if app.restored || app.next > 0 { 30 } else { 60 });
        if progress.1.elapsed() > limit {
            let (next, counters) = (app.next, subscriber.counters());
            return Err(format!(
                "stalled at {next} of {count} messages, nothing new for {limit:?}: {counters:?}"
            )
            .into());
        }
    }
    let how = if app.restored {
        " (joined late: from a snapshot)"
    } else {
        ""
    };
    println!("received {} messages in order{how}", app.next);
    Ok(())
}
