//! The engine's market-data side: the handler the bus delivers to ([`MdView`]: BBOs and
//! trading status into the strategy, receive-to-handler latency against the probe's stamps)
//! and the subscribers' totals. I/O-free: the subscribers that feed it, on either transport,
//! are in `transport`.

use rocebus::mcast::{Handler, RestoreError, SnapshotSink};
use rocebus_md::normalized::{self, Normalized};

use super::orders::{Quote, Strategy};
use super::tap;
use crate::report::LatencyRecorder;

/// Market-data counts seen by the handler.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MdCounts {
    /// Messages delivered.
    pub messages: u64,
    /// BBO updates of traded symbols.
    pub bbo_traded: u64,
    /// Trading status changes of traded symbols (a halted symbol is not quoted).
    pub status_traded: u64,
    /// Messages that were not normalized messages (counted, dropped).
    pub malformed: u64,
    /// Snapshots applied (the quote table restarts empty).
    pub restores: u64,
    /// Messages whose exchange packet the probe did not see (no latency recorded).
    pub unstamped: u64,
}

/// The engine's market-data handler: feeds BBOs into the strategy and records latency.
#[derive(Debug)]
pub struct MdView {
    /// The strategy it feeds.
    pub strategy: Strategy,
    /// Receive-to-handler latency.
    pub latency: LatencyRecorder,
    /// Counts.
    pub counts: MdCounts,
    /// Arrival times of the exchange's messages (absent: latency not measured).
    pub stamps: Option<tap::StampTable>,
    /// Messages handled before their packet's stamp reached the table (the probe's thread
    /// can lag the bus): (ITCH timestamp, handled at), resolved by [`MdView::resolve`].
    pending: Vec<(u64, u64)>,
    clock: fn() -> u64,
}

/// Messages waiting for their stamp; beyond this they are counted as unstamped.
const MAX_PENDING: usize = 8192;

impl MdView {
    /// A view feeding `strategy`; with `stamps`, each message's latency is `clock()` (read
    /// once per message) minus its exchange packet's arrival.
    pub fn new(
        strategy: Strategy,
        stamps: Option<tap::StampTable>,
        clock: fn() -> u64,
    ) -> anyhow::Result<Self> {
        Ok(MdView {
            strategy,
            latency: LatencyRecorder::new()?,
            counts: MdCounts::default(),
            stamps,
            pending: Vec::with_capacity(MAX_PENDING),
            clock,
        })
    }
}

impl MdView {
    /// Market data was lost and nothing will recover it (a shared-memory reader a ring
    /// behind, or its publisher gone): the quotes may be stale, so the table starts empty
    /// and the strategy waits for fresh BBOs, as after a snapshot.
    pub fn on_loss(&mut self) {
        self.strategy.clear_quotes();
    }

    /// A frame that is not a normalized message (another message type on the stream):
    /// counted as delivered and malformed, as undecodable bytes from the bus are.
    pub fn on_foreign(&mut self) {
        self.counts.messages += 1;
        self.counts.malformed += 1;
    }

    /// Records the messages whose stamps arrived since they were handled; with `last`,
    /// counts the rest as unstamped. Call after draining the probe.
    pub fn resolve(&mut self, last: bool) {
        let Some(stamps) = &self.stamps else { return };
        let (latency, counts) = (&mut self.latency, &mut self.counts);
        self.pending.retain(|&(ts, handled)| match stamps.get(ts) {
            Some(received) => {
                latency.record(received, handled);
                false
            }
            None if last => {
                counts.unstamped += 1;
                false
            }
            None => true,
        });
    }
}

impl Handler for MdView {
    fn on_message(&mut self, _seq: u64, msg: &[u8]) {
        self.counts.messages += 1;
        let m = match normalized::decode(msg) {
            Ok(m) => m,
            Err(_) => {
                self.counts.malformed += 1;
                return;
            }
        };
        if let Some(stamps) = &self.stamps {
            let itch_ts = match m {
                Normalized::Bbo(x) => x.header.timestamp.get(),
                Normalized::Level(x) => x.header.timestamp.get(),
                Normalized::Trade(x) => x.header.timestamp.get(),
                Normalized::Status(x) => x.header.timestamp.get(),
                Normalized::FeedLoss(x) => x.header.timestamp.get(),
            };
            let now = (self.clock)();
            match stamps.get(itch_ts) {
                Some(received) => self.latency.record(received, now),
                None if self.pending.len() < MAX_PENDING => self.pending.push((itch_ts, now)),
                None => self.counts.unstamped += 1,
            }
        }
        match m {
            Normalized::Bbo(b) => {
                let quote = Quote {
                    bid: b.bid_price.get(),
                    ask: b.ask_price.get(),
                };
                if self.strategy.on_bbo(&b.header.stock, quote) {
                    self.counts.bbo_traded += 1;
                }
            }
            Normalized::Status(st) if self.strategy.on_status(&st.header.stock, st.state) => {
                self.counts.status_traded += 1;
            }
            _ => {}
        }
    }
}

/// The engine keeps only BBOs, which the live stream refreshes: a snapshot (late join or
/// re-synchronisation) is accepted and its bytes skipped, and the quote table starts empty,
/// so the strategy waits for fresh BBOs instead of trading on stale ones.
impl SnapshotSink for MdView {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _data: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, _snapshot_seq: u64) -> Result<(), RestoreError> {
        self.strategy.clear_quotes();
        self.counts.restores += 1;
        Ok(())
    }
}

/// Market-data subscriber totals over all channels. On shared memory (no recovery) a
/// reader that fell a ring behind, or found junk in the ring, counts one gap that is also
/// unrecoverable; `recovered` and `snapshots` stay 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusCounts {
    /// Messages delivered.
    pub delivered: u64,
    /// Gaps detected.
    pub gaps: u64,
    /// Messages recovered by retransmission.
    pub recovered: u64,
    /// Unrecoverable-loss events.
    pub unrecoverable: u64,
    /// Snapshots applied.
    pub snapshots: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use feed_handler::book::{Event as BookEvent, Level, Side as BookSide};
    use feed_handler::itch::Stock;
    use rocebus_engine::proto::Symbol;

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    fn encode(ev: &BookEvent) -> Vec<u8> {
        let mut buf = [0u8; normalized::MAX_LEN];
        let n = feed_handler::normalized::encode(ev, &mut buf);
        buf[..n].to_vec()
    }

    #[test]
    fn view_feeds_bbos_of_traded_symbols_and_counts_the_rest() {
        let mut stamps = tap::StampTable::new(8);
        stamps.insert(5, 1_000);
        let mut v = MdView::new(Strategy::new(&[sym("A")], 10), Some(stamps), || 1_700).unwrap();
        let lvl = |price| Level {
            price,
            shares: 100,
            orders: 1,
        };
        v.on_message(
            1,
            &encode(&BookEvent::Bbo {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 5,
                bid: Some(lvl(1_000_000)),
                ask: Some(lvl(1_000_100)),
            }),
        );
        v.on_message(
            2,
            &encode(&BookEvent::Level {
                locate: 2,
                stock: Stock::new("B"),
                timestamp: 6,
                side: BookSide::Bid,
                level: lvl(7),
            }),
        );
        v.on_message(3, b"\xff garbage");
        assert!(v.strategy.clone().next_order().is_some());
        v.on_message(
            4,
            &encode(&BookEvent::TradingStatus {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 5,
                state: b'H',
                reason: *b"T1  ",
            }),
        );
        assert_eq!(v.strategy.next_order(), None, "A is halted");
        assert_eq!(
            v.counts,
            MdCounts {
                messages: 4,
                bbo_traded: 1,
                status_traded: 1,
                malformed: 1,
                restores: 0,
                unstamped: 0,
            }
        );
        assert_eq!(
            v.strategy.quote(sym("A")),
            Some(Quote {
                bid: 1_000_000,
                ask: 1_000_100
            })
        );
        v.begin_restore();
        v.restore_chunk(b"anything").unwrap();
        v.finish_restore(9).unwrap();
        assert_eq!(v.strategy.quote(sym("A")), Some(Quote::default()));
        // The BBO and the status (ITCH timestamp 5) arrived at 1000 and were handled at
        // 1700; the level change (timestamp 6) waits for its stamp, which comes late (at
        // 1500).
        assert_eq!(
            (v.latency.histogram().len(), v.latency.histogram().max()),
            (2, 700)
        );
        v.stamps.as_mut().unwrap().insert(6, 1_500);
        v.resolve(false);
        assert_eq!(v.latency.histogram().len(), 3);
        // A message whose stamp never comes is counted once the run ends.
        v.on_message(
            4,
            &encode(&BookEvent::Bbo {
                locate: 1,
                stock: Stock::new("A"),
                timestamp: 99,
                bid: None,
                ask: None,
            }),
        );
        v.resolve(false);
        assert_eq!(v.counts.unstamped, 0);
        v.resolve(true);
        assert_eq!((v.counts.unstamped, v.latency.histogram().len()), (1, 3));
    }
}
