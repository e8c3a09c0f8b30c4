//! The feed handler on the rocebus market-data path: [`BusSink`] implements
//! [`MdSink`] over one [`MdPublisher`] per channel (UD multicast or RC fan-out, as the
//! channel's `transport` says), and [`ChannelSnapshot`] serves the books of a channel's
//! symbols to late joiners.
//!
//! Owns the mapping from partition index (what [`crate::publish::Publisher`] computes from
//! the stock locate) to bus channel, and the per-channel sequence a snapshot is taken at.
//! Sequencing, batching, multicast and recovery are rocebus's; the books are
//! [`crate::book`]'s.

use crate::book::Book;
use crate::ipcsink::IpcSink;
use crate::publish::MdSink;
use crate::view::write_book_l2;
use rocebus::clock::Mono;
use rocebus::mcast::config::McastConfig;
use rocebus::mcast::io::{PublishError, PublisherIoStats};
use rocebus::mcast::{McastPublisher, MdPublisher, NetError, Snapshot};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Publishes normalized messages on the bus: partition `i` goes to the `i`-th channel of the
/// market-data configuration.
#[derive(Debug)]
pub struct BusSink {
    publishers: Vec<MdPublisher>,
    /// Last sequence published per partition (0: none).
    last_seq: Vec<u64>,
    now: Mono,
    /// The same messages on shared memory, when configured.
    ipc: Option<IpcSink>,
}

impl BusSink {
    /// Opens one publisher per configured channel, on its configured transport, on the
    /// RDMA device owning `local`.
    /// `session` must grow across restarts (e.g. derived from the wall clock).
    pub fn new(cfg: &McastConfig, session: u64, local: IpAddr) -> Result<Self, NetError> {
        let publishers = cfg
            .channels
            .iter()
            .map(|c| MdPublisher::new(cfg, c.id, session, local))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            last_seq: vec![0; publishers.len()],
            publishers,
            now: Mono::ZERO,
            ipc: None,
        })
    }

    /// Also publishes every message on `ipc` (its streams in partition order).
    pub fn with_ipc(mut self, ipc: IpcSink) -> Self {
        self.ipc = Some(ipc);
        self
    }

    /// The shared-memory output, if configured.
    pub fn ipc(&self) -> Option<&IpcSink> {
        self.ipc.as_ref()
    }

    /// Partitions (channels).
    pub fn channels(&self) -> u16 {
        self.publishers.len() as u16
    }

    /// Sets the `now` given to the publishers by [`MdSink::publish`]; call once per loop.
    pub fn set_now(&mut self, now: Mono) {
        self.now = now;
    }

    /// The publisher of partition `i`.
    pub fn publisher(&self, i: u16) -> Option<&MdPublisher> {
        self.publishers.get(usize::from(i))
    }

    /// The multicast publisher of partition `i` (`None` on an RC fan-out channel).
    pub fn multicast(&self, i: u16) -> Option<&McastPublisher> {
        match self.publishers.get(usize::from(i))? {
            MdPublisher::Multicast(p) => Some(p),
            MdPublisher::Rc(_) => None,
        }
    }

    /// Last sequence published on partition `i` (0: none).
    pub fn last_seq(&self, i: u16) -> u64 {
        self.last_seq.get(usize::from(i)).copied().unwrap_or(0)
    }

    /// Recovery connections open, over all channels.
    pub fn connections(&self) -> usize {
        self.publishers.iter().map(MdPublisher::connections).sum()
    }

    /// I/O counters summed over all channels (an RC fan-out channel adds what its
    /// counters share with multicast's: datagrams written once per datagram, heartbeats,
    /// requests and snapshots served, refusals and rate limits).
    pub fn io_stats(&self) -> PublisherIoStats {
        let mut t = PublisherIoStats::default();
        for p in &self.publishers {
            let p = match p {
                MdPublisher::Multicast(p) => p,
                MdPublisher::Rc(p) => {
                    let f = p.stats();
                    t.datagrams_sent += p.state().counters().datagrams;
                    t.heartbeats_sent += f.heartbeats_written;
                    t.connections_accepted += f.subscribers_joined;
                    t.connections_closed += f.dropped_stalled + f.dropped_behind_history;
                    t.connections_failed += f.subscribers_lost;
                    t.connections_refused += f.subscribers_refused;
                    t.retransmit_requests += f.retransmit_requests;
                    t.snapshots_served += f.snapshots_served;
                    t.snapshots_built += f.snapshots_built;
                    t.requests_dropped += f.requests_dropped;
                    t.requests_rate_limited += f.requests_rate_limited;
                    t.requests_clamped += f.requests_clamped;
                    continue;
                }
            };
            let s = p.io_stats();
            t.datagrams_sent += s.datagrams_sent;
            t.heartbeats_sent += s.heartbeats_sent;
            t.unsent_overwritten += s.unsent_overwritten;
            t.connections_accepted += s.connections_accepted;
            t.connections_failed += s.connections_failed;
            t.connections_closed += s.connections_closed;
            t.retransmit_requests += s.retransmit_requests;
            t.snapshots_served += s.snapshots_served;
            t.requests_dropped += s.requests_dropped;
            t.connections_refused += s.connections_refused;
            t.auth_failures += s.auth_failures;
            t.handshake_timeouts += s.handshake_timeouts;
            t.requests_rate_limited += s.requests_rate_limited;
            t.snapshots_rate_limited += s.snapshots_rate_limited;
            t.requests_clamped += s.requests_clamped;
            t.snapshots_built += s.snapshots_built;
            t.clients_stalled += s.clients_stalled;
            t.repair_unicast_datagrams += s.repair_unicast_datagrams;
            t.repair_multicast_datagrams += s.repair_multicast_datagrams;
            t.repair_requests_covered += s.repair_requests_covered;
            t.repair_requests_suppressed += s.repair_requests_suppressed;
        }
        t
    }

    /// Sends, heartbeats and serves recovery on every channel, with `book` as the snapshot
    /// source. Returns the datagrams sent.
    pub fn poll(&mut self, now: Mono, book: &Book) -> Result<usize, NetError> {
        let channels = self.channels();
        let mut sent = 0;
        for (i, p) in self.publishers.iter_mut().enumerate() {
            let snapshot = ChannelSnapshot {
                book,
                channel: i as u16,
                channels,
                seq: self.last_seq[i],
            };
            sent += p.poll(now, &snapshot)?;
        }
        if let Some(ipc) = &mut self.ipc {
            sent += ipc.poll(now);
        }
        Ok(sent)
    }

    /// Sends, heartbeats and serves recovery on partition `i` only, with `snapshot` as its
    /// snapshot source (for publishers whose state is not a [`Book`], e.g. a replay's
    /// views). Returns the datagrams sent.
    pub fn poll_channel(
        &mut self,
        i: u16,
        now: Mono,
        snapshot: &impl rocebus::mcast::Snapshot,
    ) -> Result<usize, NetError> {
        match self.publishers.get_mut(usize::from(i)) {
            Some(p) => p.poll(now, snapshot),
            None => Ok(0),
        }
    }

    /// Datagrams of partition `i` flushed but not yet sent (held back by pacing): a
    /// publisher that gets more than its history ahead overwrites them unsent.
    pub fn backlog(&self, i: u16) -> u64 {
        // RC fan-out writes every flushed datagram to each subscriber with room at once;
        // one without room is dropped when it falls out of the history, not waited for.
        self.multicast(i).map_or(0, |p| {
            p.state()
                .counters()
                .datagrams
                .saturating_sub(p.io_stats().datagrams_sent)
        })
    }

    /// Seals the open datagrams and sends them.
    pub fn flush(&mut self, now: Mono) -> Result<(), NetError> {
        for p in &mut self.publishers {
            p.flush(now)?;
        }
        Ok(())
    }
}

impl MdSink for BusSink {
    type Error = PublishError;

    fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), PublishError> {
        let i = usize::from(channel);
        // Partitions come from `Publisher::new(sink, sink.channels())`: always in range.
        let Some(p) = self.publishers.get_mut(i) else {
            return Ok(());
        };
        // Shared memory first: a full bus ring must not cost the local readers the message.
        if let Some(ipc) = &mut self.ipc {
            ipc.publish_at(i, message);
        }
        self.last_seq[i] = p.offer(self.now, message)?;
        Ok(())
    }
}

/// The book of one channel's symbols at the channel's last published sequence: what a late
/// joiner of that channel restores into its [`crate::view::MarketView`].
///
/// Consistent because the feed handler only polls publishers between ITCH messages, when
/// every event of the messages applied so far has been published.
#[derive(Debug, Clone, Copy)]
pub struct ChannelSnapshot<'a> {
    /// All books.
    pub book: &'a Book,
    /// Partition index.
    pub channel: u16,
    /// Partitions.
    pub channels: u16,
    /// Last sequence published on the channel.
    pub seq: u64,
}

impl Snapshot for ChannelSnapshot<'_> {
    fn snapshot_seq(&self) -> u64 {
        self.seq
    }

    fn write_snapshot(&self, out: &mut Vec<u8>) {
        let (channel, channels) = (self.channel, self.channels.max(1));
        write_book_l2(self.book, |l| l % channels == channel, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{generate, GenConfig};
    use crate::itch::decode_exact;
    use crate::view::{book_l2, MarketView};

    #[test]
    fn channel_snapshot_holds_only_its_symbols() {
        let mut book = Book::new();
        generate(
            &GenConfig {
                seed: 5,
                messages: 5_000,
                symbols: 10,
            },
            |m| book.apply(&decode_exact(m).unwrap(), &mut |_: &_| {}),
        );
        let mut all = MarketView::new();
        all.restore_l2(&book_l2(&book, |_| true)).unwrap();
        for c in 0..4u16 {
            let s = ChannelSnapshot {
                book: &book,
                channel: c,
                channels: 4,
                seq: 42,
            };
            assert_eq!(s.snapshot_seq(), 42);
            let mut bytes = Vec::new();
            s.write_snapshot(&mut bytes);
            let mut v = MarketView::new();
            v.restore_l2(&bytes).unwrap();
            assert!(v.symbols().count() > 0);
            for (l, sym) in v.symbols() {
                assert_eq!(l % 4, c);
                assert_eq!(Some(sym), all.symbol(l));
            }
        }
    }
}

/// How long a publisher waits for the subscribers it was asked to wait for
/// (`--wait-subscribers`, [`wait_for_subscribers`]).
pub const WAIT_SUBSCRIBERS_LIMIT: Duration = Duration::from_secs(60);

/// Fewer bus subscribers than asked for connected within [`WAIT_SUBSCRIBERS_LIMIT`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{connected} of the {wanted} subscribers asked for (--wait-subscribers) connected within \
     {} s; nothing was published: are they running and pointed at this publisher?",
    WAIT_SUBSCRIBERS_LIMIT.as_secs()
)]
pub struct NoSubscribers {
    /// Subscribers asked for.
    pub wanted: usize,
    /// Subscribers connected when the wait ended.
    pub connected: usize,
}

/// Serves the bus alone, publishing nothing, until `wanted` subscribers are connected
/// (none asked for: returns at once), `stop` is set, or [`WAIT_SUBSCRIBERS_LIMIT`] passes
/// ([`NoSubscribers`]). `serve` polls the publishers once at the time it is given (their
/// handshakes move on only in polls) and returns the subscribers connected.
pub fn wait_for_subscribers<E: From<NoSubscribers>>(
    wanted: usize,
    stop: &AtomicBool,
    serve: impl FnMut(Mono) -> Result<usize, E>,
) -> Result<(), E> {
    wait_within(WAIT_SUBSCRIBERS_LIMIT, wanted, stop, serve)
}

fn wait_within<E: From<NoSubscribers>>(
    limit: Duration,
    wanted: usize,
    stop: &AtomicBool,
    mut serve: impl FnMut(Mono) -> Result<usize, E>,
) -> Result<(), E> {
    if wanted == 0 {
        return Ok(());
    }
    let waited = Instant::now();
    // ORDERING: Relaxed: the stop flag carries no data.
    while !stop.load(Ordering::Relaxed) {
        let connected = serve(Mono::now())?;
        if connected >= wanted {
            break;
        }
        if waited.elapsed() > limit {
            return Err(NoSubscribers { wanted, connected }.into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(())
}

#[cfg(test)]
mod wait_tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    enum E {
        No(usize, usize),
        Bus,
    }

    impl From<NoSubscribers> for E {
        fn from(n: NoSubscribers) -> E {
            E::No(n.wanted, n.connected)
        }
    }

    /// None asked for: the bus is not even polled. Asked for: polled until that many are
    /// in, and not once more; never enough: the error names both counts once the limit
    /// passed; a stop ends the wait; a bus error ends it with that error.
    #[test]
    fn the_wait_polls_until_the_subscribers_are_in_and_ends_in_time() {
        let go = AtomicBool::new(false);
        let mut polls = 0;
        assert_eq!(
            wait_within(Duration::ZERO, 0, &go, |_| -> Result<usize, E> {
                polls += 1;
                Ok(0)
            }),
            Ok(())
        );
        assert_eq!(polls, 0);
        let mut connected = 0;
        let r = wait_within(Duration::from_secs(60), 2, &go, |_| -> Result<usize, E> {
            polls += 1;
            connected += 1;
            Ok(connected)
        });
        assert_eq!((r, polls), (Ok(()), 2));
        let r = wait_within(Duration::from_millis(5), 3, &go, |_| Ok::<_, E>(1));
        assert_eq!(r, Err(E::No(3, 1)));
        let r = wait_within(Duration::from_secs(60), 3, &go, |_| Err::<usize, _>(E::Bus));
        assert_eq!(r, Err(E::Bus));
        let stop = AtomicBool::new(true);
        let r = wait_within(Duration::ZERO, 3, &stop, |_| Ok::<_, E>(0));
        assert_eq!(r, Ok(()));
    }
}
