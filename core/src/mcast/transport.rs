//! One publisher and one subscriber type for either transport, chosen by the
//! channel's `transport` key: `"multicast"` ([`McastPublisher`],
//! [`McastSubscriber`]) or `"rc"` ([`RcFanoutPublisher`],
//! [`RcFanoutSubscriber`]). The application code is the same for both: it
//! publishes, polls, and hands the subscriber its [`Handler`] +
//! [`SnapshotSink`].
//!
//! ```no_run
//! use rocebus::mcast::{config::McastConfig, now_ns, MdPublisher};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = McastConfig::load("configs/md.toml")?;
//! let mut p = MdPublisher::new(&cfg, 1, now_ns(), "198.18.0.1".parse()?)?;
//! p.publish(now_ns(), b"hello")?;
//! # Ok(()) }
//! ```

use std::net::IpAddr;

use super::config::{McastConfig, Transport};
use super::io::{McastPublisher, McastSubscriber, NetError, PublishError};
use super::publisher::PublisherState;
use super::rcfanout::{FanoutError, RcFanoutPublisher, RcFanoutSubscriber};
use super::snapshot::{Handler, Snapshot, SnapshotSink};
use super::subscriber::{Event, SubscriberCounters, SubscriberState};

fn transport_of(cfg: &McastConfig, channel: u16) -> Result<Transport, NetError> {
    Ok(cfg
        .channel(channel)
        .ok_or(NetError::NoChannel(channel))?
        .transport)
}

/// A market-data publisher on whichever transport the channel is configured for.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum MdPublisher {
    /// UD multicast.
    Multicast(McastPublisher),
    /// RC fan-out.
    Rc(RcFanoutPublisher),
}

impl MdPublisher {
    /// Opens the publisher for `channel` on its configured transport.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        session: u64,
        local: IpAddr,
    ) -> Result<Self, FanoutError> {
        Ok(match transport_of(cfg, channel)? {
            Transport::Multicast => {
                MdPublisher::Multicast(McastPublisher::new(cfg, channel, session, local)?)
            }
            Transport::Rc => MdPublisher::Rc(RcFanoutPublisher::new(cfg, channel, session, local)?),
        })
    }
    /// The protocol state (sequence, history, counters).
    pub fn state(&self) -> &PublisherState {
        match self {
            MdPublisher::Multicast(p) => p.state(),
            MdPublisher::Rc(p) => p.state(),
        }
    }
    /// Connected subscribers (RC) or recovery connections (multicast).
    pub fn connections(&self) -> usize {
        match self {
            MdPublisher::Multicast(p) => p.connections(),
            MdPublisher::Rc(p) => p.connections(),
        }
    }
    /// See [`McastPublisher::publish`].
    pub fn publish(&mut self, now: u64, msg: &[u8]) -> Result<u64, PublishError> {
        match self {
            MdPublisher::Multicast(p) => p.publish(now, msg),
            MdPublisher::Rc(p) => p.publish(now, msg),
        }
    }
    /// See [`McastPublisher::try_claim`].
    pub fn try_claim(&mut self, now: u64, len: usize) -> Result<&mut [u8], PublishError> {
        match self {
            MdPublisher::Multicast(p) => p.try_claim(now, len),
            MdPublisher::Rc(p) => p.try_claim(now, len),
        }
    }
    /// See [`McastPublisher::commit`].
    pub fn commit(&mut self, now: u64) -> Option<u64> {
        match self {
            MdPublisher::Multicast(p) => p.commit(now),
            MdPublisher::Rc(p) => p.commit(now),
        }
    }
    /// See [`McastPublisher::flush`].
    pub fn flush(&mut self, now: u64) -> Result<(), FanoutError> {
        match self {
            MdPublisher::Multicast(p) => Ok(p.flush(now)?),
            MdPublisher::Rc(p) => p.flush(now),
        }
    }
    /// See [`McastPublisher::poll`]; returns datagrams sent (multicast) or
    /// datagram frames written, summed over subscribers (RC).
    pub fn poll(&mut self, now: u64, snapshot: &impl Snapshot) -> Result<usize, FanoutError> {
        match self {
            MdPublisher::Multicast(p) => Ok(p.poll(now, snapshot)?),
            MdPublisher::Rc(p) => p.poll(now, snapshot),
        }
    }
}

/// A market-data subscriber on whichever transport the channel is configured for.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum MdSubscriber {
    /// UD multicast.
    Multicast(McastSubscriber),
    /// RC fan-out.
    Rc(RcFanoutSubscriber),
}

/// A subscriber constructor of one transport: config, channel, local and publisher address.
type Ctor<T, E> = fn(&McastConfig, u16, IpAddr, IpAddr) -> Result<T, E>;

impl MdSubscriber {
    /// Opens the subscriber for `channel` on its configured transport
    /// without waiting for the publisher at `publisher`: the connection is
    /// made by later polls and reported as [`Event::RecoveryRestored`] (see
    /// [`McastSubscriber::new`] and [`RcFanoutSubscriber::new`]).
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, FanoutError> {
        Self::open(
            (cfg, channel, local, publisher),
            McastSubscriber::new,
            RcFanoutSubscriber::new,
        )
    }

    /// As [`new`](Self::new), then waits for the connection to the
    /// publisher (up to `connect_timeout_ms`; see
    /// [`McastSubscriber::connect`] and [`RcFanoutSubscriber::connect`]).
    pub fn connect(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, FanoutError> {
        Self::open(
            (cfg, channel, local, publisher),
            McastSubscriber::connect,
            RcFanoutSubscriber::connect,
        )
    }

    /// The channel's transport, made by the matching constructor.
    fn open(
        (cfg, channel, local, publisher): (&McastConfig, u16, IpAddr, IpAddr),
        multicast: Ctor<McastSubscriber, NetError>,
        rc: Ctor<RcFanoutSubscriber, FanoutError>,
    ) -> Result<Self, FanoutError> {
        Ok(match transport_of(cfg, channel)? {
            Transport::Multicast => {
                MdSubscriber::Multicast(multicast(cfg, channel, local, publisher)?)
            }
            Transport::Rc => MdSubscriber::Rc(rc(cfg, channel, local, publisher)?),
        })
    }

    /// Whether the connection to the publisher is up (the recovery
    /// connection on multicast, the stream itself on RC).
    pub fn connected(&self) -> bool {
        match self {
            MdSubscriber::Multicast(s) => s.recovery_connected(),
            MdSubscriber::Rc(s) => s.connected(),
        }
    }
    /// The protocol state.
    pub fn state(&self) -> &SubscriberState {
        match self {
            MdSubscriber::Multicast(s) => s.state(),
            MdSubscriber::Rc(s) => s.state(),
        }
    }
    /// Protocol counters.
    pub fn counters(&self) -> SubscriberCounters {
        self.state().counters()
    }
    /// Next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        match self {
            MdSubscriber::Multicast(s) => s.poll_event(),
            MdSubscriber::Rc(s) => s.poll_event(),
        }
    }
    /// Delivers in order to `app`; see [`McastSubscriber::poll`].
    pub fn poll<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: u64,
        app: &mut A,
    ) -> Result<usize, FanoutError> {
        match self {
            MdSubscriber::Multicast(s) => Ok(s.poll(now, app)?),
            MdSubscriber::Rc(s) => s.poll(now, app),
        }
    }
    /// Closes the connection to the publisher (recovery connection, or the
    /// whole stream on RC).
    pub fn disconnect(&mut self) {
        match self {
            MdSubscriber::Multicast(s) => {
                let _ = s.disconnect();
            }
            MdSubscriber::Rc(s) => s.disconnect(),
        }
    }
}
