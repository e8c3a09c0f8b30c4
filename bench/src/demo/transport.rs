//! Where the engine's market data comes from (`market_data.transport`): the rocebus UD
//! multicast bus, or the feed handler's shared-memory streams on its own host. Both deliver
//! every normalized message to the same [`MdView`] through its [`Handler`] impl, so the
//! book handling, latency and counts do not depend on the transport; this module only moves
//! bytes and reports each transport's losses in the same [`BusCounts`].

use rocebus::clock::Mono;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use feed_handler::ipcsink::MSG_TYPE;
use rocebus::counters::{Counter, CountersFile, Kind};
use rocebus::ipc::{IpcEvent, IpcSubscriber};
use rocebus::mcast::io::SubscriberCountersExport;
use rocebus::mcast::{Event, Handler, MdSubscriber};

use super::config::IpcSource;
use super::md::{BusCounts, MdView};

/// One channel's shared-memory stream and what it delivered.
#[derive(Debug)]
pub(super) struct IpcChannel {
    stream: String,
    sub: IpcSubscriber,
    counts: IpcCounts,
}

/// What one shared-memory stream delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct IpcCounts {
    /// Frames delivered (normalized messages, and any frame of another type).
    pub messages: u64,
    /// Times the engine fell a ring behind and lost messages for good (no recovery on
    /// shared memory).
    pub dropped: u64,
    /// Times the stream's contents broke the protocol (the subscriber rejoined).
    pub corrupt: u64,
    /// Times the feed handler closed the stream or died.
    pub publisher_gone: u64,
}

impl IpcChannel {
    /// A subscriber of `stream`; it connects when the feed handler's stream is there.
    pub(super) fn new(source: &IpcSource, channel: u16) -> anyhow::Result<IpcChannel> {
        let stream = source.stream(channel);
        let sub = IpcSubscriber::new(&source.config, &stream)
            .with_context(|| format!("shared-memory stream {stream} of channel {channel}"))?;
        Ok(IpcChannel {
            stream,
            sub,
            counts: IpcCounts::default(),
        })
    }

    /// Delivers what the stream holds to `handler`; returns the events handled. A loss (a
    /// ring behind, junk in the ring, the feed handler gone) makes the view forget its
    /// quotes, as a re-synchronisation on the bus does: the engine never quotes from a book
    /// it may have missed updates of.
    fn poll(&mut self, now: u64, view: &mut MdView) -> usize {
        let IpcChannel {
            stream,
            sub,
            counts,
        } = self;
        let Ok(n) = sub.poll(
            rocebus::clock::Mono::from_nanos(now),
            |m| {
                counts.messages += 1;
                if m.msg_type == MSG_TYPE {
                    view.on_message(counts.messages, m.payload);
                } else {
                    view.on_foreign();
                }
            },
            64,
        );
        // Events close a poll: whatever it delivered came before them.
        while let Some(ev) = sub.poll_event() {
            match ev {
                IpcEvent::Dropped { skipped_bytes } => {
                    counts.dropped += 1;
                    view.on_loss();
                    eprintln!(
                        "sample-engine: stream {stream}: fell a ring behind, {skipped_bytes} bytes \
                         of market data lost; continuing from the newest"
                    );
                }
                IpcEvent::Corrupt(why) => {
                    counts.corrupt += 1;
                    view.on_loss();
                    eprintln!("sample-engine: stream {stream}: {why}; rejoining");
                }
                IpcEvent::PublisherGone { clean } => {
                    counts.publisher_gone += 1;
                    view.on_loss();
                    eprintln!(
                        "sample-engine: stream {stream}: the feed handler {}; waiting for it",
                        if clean { "closed it" } else { "died" }
                    );
                }
                IpcEvent::Connected { publisher_pid, .. } => {
                    eprintln!(
                        "sample-engine: stream {stream}: joined feed handler pid {publisher_pid}"
                    )
                }
            }
        }
        n
    }
}

/// The market-data subscribers, one per channel, on the configured transport.
#[derive(Debug)]
pub(super) enum MdSubscribers {
    /// The UD multicast bus.
    Rdma(Vec<MdSubscriber>),
    /// The feed handler's shared-memory streams.
    Ipc(Vec<IpcChannel>),
}

impl MdSubscribers {
    /// Channels subscribed.
    pub(super) fn len(&self) -> usize {
        match self {
            MdSubscribers::Rdma(s) => s.len(),
            MdSubscribers::Ipc(s) => s.len(),
        }
    }

    /// Shared memory only: waits until every stream is joined (the feed handler creates
    /// them at its start), so the engine is subscribed before it says it is ready, as it is
    /// once `MdSubscriber::connect` returns on the bus.
    pub(super) fn wait_connected(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let MdSubscribers::Ipc(chans) = self else {
            return Ok(());
        };
        let t0 = Instant::now();
        loop {
            for c in chans.iter_mut().filter(|c| !c.sub.is_connected()) {
                // A limit of 0 joins without taking a message.
                let Ok(_) = c.sub.poll(rocebus::clock::Mono::now(), |_| {}, 0);
            }
            let Some(missing) = chans.iter().find(|c| !c.sub.is_connected()) else {
                return Ok(());
            };
            if t0.elapsed() >= timeout {
                anyhow::bail!(
                    "no feed handler publishes the shared-memory stream {} (gave up after {} s): \
                     start it with publish.ipc_stream set on this host, or use \
                     market_data.transport = \"rdma\"",
                    missing.stream,
                    timeout.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Delivers what every channel holds to `view`; returns the work done.
    pub(super) fn poll(&mut self, now: u64, view: &mut MdView) -> anyhow::Result<usize> {
        let mut work = 0;
        match self {
            MdSubscribers::Rdma(subs) => {
                for s in subs {
                    work += s.poll(Mono::from_nanos(now), view, 64)?;
                    while let Some(ev) = s.poll_event() {
                        if let Event::UnrecoverableLoss { from, to } = ev {
                            eprintln!(
                                "sample-engine: market data lost [{from}, {to}), re-synchronising"
                            );
                        }
                    }
                }
            }
            MdSubscribers::Ipc(chans) => {
                for c in chans {
                    work += c.poll(now, view);
                }
            }
        }
        Ok(work)
    }

    /// Totals over all channels. On shared memory every drop and every corrupt ring is a
    /// gap that nothing recovers.
    pub(super) fn bus_counts(&self) -> BusCounts {
        let mut b = BusCounts::default();
        match self {
            MdSubscribers::Rdma(subs) => {
                for s in subs {
                    let c = s.counters();
                    b.delivered += c.delivered;
                    b.gaps += c.gaps_detected;
                    b.recovered += c.messages_recovered;
                    b.unrecoverable += c.unrecoverable;
                    b.snapshots += c.snapshots_applied;
                }
            }
            MdSubscribers::Ipc(chans) => {
                for c in chans {
                    b.delivered += c.counts.messages;
                    b.gaps += c.counts.dropped + c.counts.corrupt;
                    b.unrecoverable += c.counts.dropped + c.counts.corrupt;
                }
            }
        }
        b
    }
}

/// Per-channel counters in the engine's counters file (`rocebus stat`): the bus
/// subscriber's own set, or a stream's counts.
pub(super) enum ChannelCounters {
    /// The bus subscribers' exports.
    Rdma(Vec<SubscriberCountersExport>),
    /// Per stream: messages, drops, corrupt rings, publisher gone.
    Ipc(Vec<[Counter; 4]>),
}

impl ChannelCounters {
    /// Allocates `md.ch<id>.*` counters for `channels` in `file`.
    pub(super) fn new(
        file: &CountersFile,
        subs: &MdSubscribers,
        channels: &[u16],
    ) -> anyhow::Result<ChannelCounters> {
        Ok(match subs {
            MdSubscribers::Rdma(_) => ChannelCounters::Rdma(
                channels
                    .iter()
                    .map(|ch| SubscriberCountersExport::new(file, &format!("md.ch{ch}")))
                    .collect::<Result<_, _>>()?,
            ),
            MdSubscribers::Ipc(_) => {
                let mut v = Vec::new();
                for ch in channels {
                    let c = |name: &str| {
                        file.allocate_with(&format!("md.ch{ch}.ipc {name}"), Kind::Counter, 0)
                    };
                    v.push([
                        c("messages")?,
                        c("dropped (a ring behind)")?,
                        c("corrupt")?,
                        c("publisher gone")?,
                    ]);
                }
                ChannelCounters::Ipc(v)
            }
        })
    }

    /// Stores the current values.
    pub(super) fn update(&self, subs: &MdSubscribers) {
        match (self, subs) {
            (ChannelCounters::Rdma(e), MdSubscribers::Rdma(s)) => {
                for (e, s) in e.iter().zip(s) {
                    e.update(s);
                }
            }
            (ChannelCounters::Ipc(e), MdSubscribers::Ipc(s)) => {
                for (e, c) in e.iter().zip(s) {
                    let n = c.counts;
                    for (counter, v) in
                        e.iter()
                            .zip([n.messages, n.dropped, n.corrupt, n.publisher_gone])
                    {
                        counter.set(v);
                    }
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demo::orders::{Quote, Strategy};
    use feed_handler::book::{Event as BookEvent, Level};
    use feed_handler::ipcsink::IpcSink;
    use feed_handler::itch::Stock;
    use rocebus::ipc::{FlowControl, IpcConfig};
    use rocebus_engine::proto::Symbol;

    fn bbo(stock: &str, timestamp: u64, bid: u32) -> Vec<u8> {
        let lvl = |price| Level {
            price,
            shares: 100,
            orders: 1,
        };
        let mut buf = [0u8; rocebus_md::normalized::MAX_LEN];
        let n = feed_handler::normalized::encode(
            &BookEvent::Bbo {
                locate: 1,
                stock: Stock::new(stock),
                timestamp,
                bid: Some(lvl(bid)),
                ask: Some(lvl(bid + 100)),
            },
            &mut buf,
        );
        buf[..n].to_vec()
    }

    fn poll_until(subs: &mut MdSubscribers, view: &mut MdView, messages: u64) {
        let t = Instant::now();
        while subs.bus_counts().delivered < messages {
            subs.poll(rocebus::clock::now_ns(), view).unwrap();
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{:?}",
                subs.bus_counts()
            );
        }
    }

    /// The feed handler's shared-memory sink on one side, the engine's subscribers on the
    /// other: messages reach the same handler the bus feeds, per channel, and a reader a ring
    /// behind loses its quotes and counts the loss as unrecoverable.
    #[test]
    fn shared_memory_feeds_the_same_view_and_reports_losses() {
        let dir = tempfile::tempdir().unwrap();
        let source = IpcSource {
            prefix: "md".into(),
            config: IpcConfig {
                dir: dir.path().into(),
                ring_bytes: 64 << 10,
                max_payload: 4096,
                flow: FlowControl::Drop,
                liveness_ms: 5,
                ..IpcConfig::default()
            },
        };
        let mut subs = MdSubscribers::Ipc(vec![
            IpcChannel::new(&source, 3).unwrap(),
            IpcChannel::new(&source, 9).unwrap(),
        ]);
        let e = subs.wait_connected(Duration::from_millis(50)).unwrap_err();
        assert!(format!("{e:#}").contains("md.3"), "{e:#}");
        let mut sink = IpcSink::create("md", &[3, 9], &source.config).unwrap();
        subs.wait_connected(Duration::from_secs(5)).unwrap();
        let mut view =
            MdView::new(Strategy::new(&[Symbol::new("A").unwrap()], 10), None, || 0).unwrap();
        sink.publish_at(0, &bbo("A", 1, 1_000_000));
        sink.publish_at(1, &bbo("B", 2, 7));
        poll_until(&mut subs, &mut view, 2);
        assert_eq!((view.counts.messages, view.counts.bbo_traded), (2, 1));
        assert_eq!(
            view.strategy.quote(Symbol::new("A").unwrap()),
            Some(Quote {
                bid: 1_000_000,
                ask: 1_000_100
            })
        );
        assert_eq!(subs.bus_counts().unrecoverable, 0);
        // More than a ring unread: the reader is dropped, loses the quotes, counts the loss.
        let msg = bbo("A", 3, 2_000_000);
        for _ in 0..(64 << 10) / msg.len() + 10 {
            sink.publish_at(0, &msg);
        }
        let t = Instant::now();
        while subs.bus_counts().unrecoverable == 0 {
            subs.poll(rocebus::clock::now_ns(), &mut view).unwrap();
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{:?}",
                subs.bus_counts()
            );
        }
        let b = subs.bus_counts();
        assert_eq!((b.gaps, b.unrecoverable, b.recovered), (1, 1, 0));
        assert_eq!(
            view.strategy.quote(Symbol::new("A").unwrap()),
            Some(Quote::default()),
            "quotes kept across a loss"
        );
        // The feed handler goes away: the quotes go with it.
        let before = subs.bus_counts().delivered;
        sink.publish_at(0, &bbo("A", 4, 3_000_000));
        poll_until(&mut subs, &mut view, before + 1);
        assert_ne!(
            view.strategy.quote(Symbol::new("A").unwrap()),
            Some(Quote::default())
        );
        drop(sink);
        let gone = |subs: &MdSubscribers| match subs {
            MdSubscribers::Ipc(chans) => chans.iter().map(|c| c.counts.publisher_gone).sum(),
            MdSubscribers::Rdma(_) => 0u64,
        };
        let t = Instant::now();
        while gone(&subs) < 2 {
            subs.poll(rocebus::clock::now_ns(), &mut view).unwrap();
            assert!(t.elapsed() < Duration::from_secs(5), "publisher never gone");
        }
        assert_eq!(
            view.strategy.quote(Symbol::new("A").unwrap()),
            Some(Quote::default())
        );
        assert_eq!(
            subs.bus_counts().unrecoverable,
            1,
            "a clean close loses nothing"
        );
    }
}
