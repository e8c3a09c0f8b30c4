//! Normalized market data on shared memory (`rocebus::ipc`), for processes on the feed
//! handler's host: [`IpcSink`] publishes partition `i` on the stream
//! `<prefix>.<channel id>` of the `i`-th market-data channel, beside (or instead of) the
//! RDMA bus.
//!
//! The feed handler never waits for a reader, so the streams use
//! [`FlowControl::Drop`](rocebus::ipc::FlowControl::Drop): a subscriber that falls a ring
//! behind is dropped with an `IpcEvent::Dropped` and continues from the newest frame
//! (configuration refuses `block`). Each frame carries one normalized message, its type
//! being [`MSG_TYPE`]; decode it with `rocebus_md` as from the bus.

use crate::publish::MdSink;
use rocebus::clock::Mono;
use rocebus::ipc::{IpcConfig, IpcError, IpcOfferError, IpcPublisher};

/// The IPC message type of a frame holding one normalized message.
pub const MSG_TYPE: u16 = 1;

/// Totals of an [`IpcSink`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IpcSinkCounters {
    /// Messages written to a stream.
    pub published: u64,
    /// Messages not written: larger than the stream's `max_payload`.
    pub too_large: u64,
    /// Messages not written because a stream refused them (only with `flow = "block"`,
    /// which the feed handler's configuration does not allow).
    pub back_pressured: u64,
}

/// One shared-memory publisher per market-data channel.
#[derive(Debug)]
pub struct IpcSink {
    publishers: Vec<IpcPublisher>,
    counters: IpcSinkCounters,
}

/// The stream name of channel `id` under `prefix`.
pub fn stream_name(prefix: &str, channel_id: u16) -> String {
    format!("{prefix}.{channel_id}")
}

impl IpcSink {
    /// Creates the streams `<prefix>.<id>` for `channel_ids`, in partition order.
    pub fn create(prefix: &str, channel_ids: &[u16], cfg: &IpcConfig) -> Result<Self, IpcError> {
        let publishers = channel_ids
            .iter()
            .map(|&id| IpcPublisher::new(cfg, &stream_name(prefix, id)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            publishers,
            counters: IpcSinkCounters::default(),
        })
    }

    /// Totals so far.
    pub fn counters(&self) -> IpcSinkCounters {
        self.counters
    }

    /// Subscribers attached, over all streams.
    pub fn subscribers(&self) -> usize {
        self.publishers.iter().map(|p| p.subscribers().len()).sum()
    }

    /// Publishes `message` on partition `i`'s stream; never blocks.
    #[inline]
    pub fn publish_at(&mut self, i: usize, message: &[u8]) {
        let Some(p) = self.publishers.get_mut(i) else {
            return;
        };
        match p.offer(MSG_TYPE, message) {
            Ok(()) => self.counters.published += 1,
            Err(IpcOfferError::TooLarge { .. } | IpcOfferError::ReservedType) => {
                self.counters.too_large += 1
            }
            Err(IpcOfferError::BackPressured) => self.counters.back_pressured += 1,
        }
    }

    /// Liveness and subscriber bookkeeping of every stream; call from the polling loop
    /// with the turn's `now`, as for the market-data publishers. Returns the events handled.
    pub fn poll(&mut self, now: Mono) -> usize {
        let mut n = 0;
        for p in &mut self.publishers {
            p.poll(now);
            while let Some(ev) = p.poll_event() {
                tracing::debug!(?ev, "ipc stream");
                n += 1;
            }
        }
        n
    }
}

impl MdSink for IpcSink {
    type Error = std::convert::Infallible;

    fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error> {
        self.publish_at(usize::from(channel), message);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::Book;
    use crate::generate::{generate, GenConfig};
    use crate::itch::decode_exact;
    use crate::publish::Publisher;
    use rocebus::clock::Mono;
    use rocebus::ipc::{FlowControl, IpcEvent, IpcSubscriber};

    fn cfg(dir: &std::path::Path) -> IpcConfig {
        IpcConfig {
            dir: dir.into(),
            flow: FlowControl::Drop,
            ..IpcConfig::default()
        }
    }

    /// What a `Vec` sink gets, per partition.
    struct Collect(Vec<Vec<Vec<u8>>>);
    impl MdSink for Collect {
        type Error = ();
        fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), ()> {
            self.0[usize::from(channel)].push(message.to_vec());
            Ok(())
        }
    }

    fn run<S: MdSink>(sink: S, channels: u16) -> S {
        let mut book = Book::new();
        let mut publisher = Publisher::new(sink, channels);
        generate(
            &GenConfig {
                seed: 7,
                messages: 3_000,
                symbols: 12,
            },
            |m| {
                let msg = decode_exact(m).unwrap();
                book.apply(&msg, &mut publisher);
            },
        );
        publisher.into_sink()
    }

    #[test]
    fn subscribers_get_every_normalized_message_of_their_channel_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = cfg(dir.path());
        let ids = [3u16, 9];
        // Subscribers first (they never block: they connect when the stream appears).
        let mut subs: Vec<IpcSubscriber> = ids
            .iter()
            .map(|&id| IpcSubscriber::new(&cfg, &stream_name("md", id)).unwrap())
            .collect();
        for s in &mut subs {
            s.poll(Mono::now(), |_| {}, 16).unwrap();
        }
        let sink = IpcSink::create("md", &ids, &cfg).unwrap();
        let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); ids.len()];
        let mut connected = vec![false; ids.len()];
        // Connect before the first message, as a reader started before the feed does.
        for _ in 0..1000 {
            for (i, s) in subs.iter_mut().enumerate() {
                s.poll(Mono::now(), |_| {}, 16).unwrap();
                if let Some(IpcEvent::Connected { .. }) = s.poll_event() {
                    connected[i] = true;
                }
            }
            if connected.iter().all(|c| *c) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(connected.iter().all(|c| *c), "subscribers did not connect");
        let sink = run(sink, ids.len() as u16);
        assert!(sink.counters().published > 0);
        assert_eq!(
            sink.counters().too_large + sink.counters().back_pressured,
            0
        );
        for (i, s) in subs.iter_mut().enumerate() {
            loop {
                let n = s
                    .poll(
                        Mono::now(),
                        |m| {
                            assert_eq!(m.msg_type, MSG_TYPE);
                            got[i].push(m.payload.to_vec());
                        },
                        256,
                    )
                    .unwrap();
                if let Some(e) = s.poll_event() {
                    panic!("unexpected {e:?}");
                }
                if n == 0 {
                    break;
                }
            }
        }
        let want = run(Collect(vec![Vec::new(); ids.len()]), ids.len() as u16);
        assert_eq!(
            got.iter().map(Vec::len).sum::<usize>() as u64,
            sink.counters().published
        );
        assert_eq!(got, want.0);
    }

    #[test]
    fn a_stream_name_per_channel() {
        assert_eq!(stream_name("md", 7), "md.7");
    }
}
