//! The seam to the bus: book events become normalized messages handed to an [`MdSink`].
//!
//! Owns symbol-to-channel partitioning and nothing of the transport: the bus implements
//! [`MdSink`] over rocebus market-data channels; tests implement it over a `Vec`.

use crate::book::{Event, EventSink};
use crate::normalized::{self, MAX_LEN};

/// Where normalized messages go: one call per message, on a channel chosen by symbol.
pub trait MdSink {
    /// Why a publish failed (e.g. the ring was full).
    type Error;
    /// Publishes one normalized message on `channel`. Must not block; called on the hot path.
    fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error>;

    /// Called before the events of each input message, with the time its packet was
    /// received (nanoseconds on the caller's clock; 0 when unknown). Latency harnesses use
    /// it to stamp what they publish; the default ignores it.
    fn on_input(&mut self, received_ns: u64) {
        let _ = received_ns;
    }
}

/// Totals kept by a [`Publisher`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishCounters {
    /// Messages the sink accepted.
    pub published: u64,
    /// Messages the sink refused.
    pub failed: u64,
}

/// Encodes book events and publishes them, partitioned by stock locate across `channels`.
#[derive(Debug)]
pub struct Publisher<S> {
    sink: S,
    channels: u16,
    counters: PublishCounters,
    ts_recv: u64,
}

impl<S: MdSink> Publisher<S> {
    /// Publishes on `channels` channels (at least 1); symbol with locate `l` goes to `l % channels`.
    pub fn new(sink: S, channels: u16) -> Self {
        Self {
            sink,
            channels: channels.max(1),
            counters: PublishCounters::default(),
            ts_recv: 0,
        }
    }

    /// Stamps the messages published from now on with the receive time of the exchange
    /// packet they come from (UNIX nanoseconds; see `normalized::Header::ts_recv`).
    pub fn set_ts_recv(&mut self, ts_recv: u64) {
        self.ts_recv = ts_recv;
    }

    /// The receive time messages are stamped with.
    pub fn ts_recv(&self) -> u64 {
        self.ts_recv
    }

    /// The channel of a symbol.
    pub fn channel_of(&self, locate: u16) -> u16 {
        locate % self.channels
    }

    /// Totals so far.
    pub fn counters(&self) -> &PublishCounters {
        &self.counters
    }

    /// The sink.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The sink, mutably (e.g. to set its clock once per loop).
    pub fn sink_mut(&mut self) -> &mut S {
        &mut self.sink
    }

    /// Publishes `message` on every channel (a message about all symbols).
    pub fn broadcast(&mut self, message: &[u8]) {
        for channel in 0..self.channels {
            match self.sink.publish(channel, message) {
                Ok(()) => self.counters.published += 1,
                Err(_) => self.counters.failed += 1,
            }
        }
    }

    /// Gives the sink back.
    pub fn into_sink(self) -> S {
        self.sink
    }
}

impl<S: MdSink> EventSink for Publisher<S> {
    fn on_event(&mut self, event: &Event) {
        let locate = match *event {
            Event::Bbo { locate, .. }
            | Event::Level { locate, .. }
            | Event::Trade { locate, .. }
            | Event::TradingStatus { locate, .. } => locate,
        };
        let mut buf = [0u8; MAX_LEN];
        let n = normalized::encode_received(event, self.ts_recv, &mut buf);
        match self.sink.publish(self.channel_of(locate), &buf[..n]) {
            Ok(()) => self.counters.published += 1,
            // Counted, not logged: a full ring would otherwise log per message.
            Err(_) => self.counters.failed += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::{Level, Side};
    use crate::itch::Stock;
    use crate::normalized::{decode, Normalized};

    #[derive(Default)]
    struct VecSink {
        out: Vec<(u16, Vec<u8>)>,
        refuse: bool,
    }
    impl MdSink for VecSink {
        type Error = ();
        fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), ()> {
            if self.refuse {
                return Err(());
            }
            self.out.push((channel, message.to_vec()));
            Ok(())
        }
    }

    #[test]
    fn partitions_by_locate_and_counts_failures() {
        let mut p = Publisher::new(VecSink::default(), 4);
        for locate in [1u16, 6, 8] {
            p.on_event(&Event::Level {
                locate,
                stock: Stock::new("X"),
                timestamp: 1,
                side: Side::Ask,
                level: Level {
                    price: 1,
                    shares: 2,
                    orders: 1,
                },
            });
        }
        let chans: Vec<u16> = p.sink().out.iter().map(|(c, _)| *c).collect();
        assert_eq!(chans, [1, 2, 0]);
        assert!(
            matches!(decode(&p.sink().out[1].1), Ok(Normalized::Level(l)) if l.header.stock_locate.get() == 6)
        );
        p.sink.refuse = true;
        p.on_event(&Event::TradingStatus {
            locate: 1,
            stock: Stock::new("X"),
            timestamp: 2,
            state: b'T',
            reason: [b' '; 4],
        });
        assert_eq!(
            *p.counters(),
            PublishCounters {
                published: 3,
                failed: 1
            }
        );
    }
}
