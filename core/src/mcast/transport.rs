//! One publisher and one subscriber type for either transport, chosen by the
//! channel's `transport` key: `"multicast"` ([`McastPublisher`],
//! [`McastSubscriber`]) or `"rc"` ([`RcFanoutPublisher`],
//! [`RcFanoutSubscriber`]). The application code is the same for both: it
//! publishes, polls, and hands the subscriber its [`Handler`] +
//! [`SnapshotSink`].
//!
//! ```no_run
//! use rocebus::{clock::Mono, mcast::{config::McastConfig, snapshot::NoSnapshots, MdPublisher, MdSubscriber}};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = McastConfig::load("configs/md.toml")?; // channel 1: multicast or rc, the same code
//! let mut publisher = MdPublisher::new(&cfg, 1, 7, "198.18.0.1".parse()?)?; // session 7
//! publisher.offer(Mono::now(), b"hello")?;
//! let mut subscriber = MdSubscriber::new(&cfg, 1, "198.18.0.2".parse()?, "198.18.0.1".parse()?)?;
//! let mut app = NoSnapshots::new(|seq: u64, msg: &[u8]| println!("{seq}: {} B", msg.len()));
//! subscriber.poll(Mono::now(), &mut app, 16)?;
//! while let Some(event) = subscriber.poll_event() { println!("{event:?}"); }
//! # Ok(()) }
//! ```
//!
//! Zero copy: `try_claim(now, len)` hands out an [`MdClaim`] over the open
//! datagram's bytes, which borrows the publisher until it is committed, so
//! nothing else can be done with the publisher meanwhile:
//!
//! ```compile_fail,E0499
//! # use rocebus::{clock::Mono, mcast::{config::McastConfig, MdPublisher}};
//! # let cfg = McastConfig::load("configs/md.toml").unwrap();
//! # let mut publisher = MdPublisher::new(&cfg, 1, 7, "198.18.0.1".parse().unwrap()).unwrap();
//! let claim = publisher.try_claim(Mono::now(), 8).unwrap();
//! publisher.flush(Mono::now()).unwrap(); // error: `publisher` is already borrowed by `claim`
//! claim.commit();
//! ```
//!
//! Market data carries no message type: a datagram holds length-prefixed
//! messages, and a subscriber's [`Handler`] sees `(seq, bytes)`.

use std::net::IpAddr;
use std::ops::{Deref, DerefMut};

use crate::clock::Mono;

use super::config::{McastConfig, Transport};
use super::io::{McastPublisher, McastSubscriber, NetError, PublishError};
use super::publisher::PublisherState;
use super::rcfanout::{FanoutEvent, RcFanoutPublisher, RcFanoutSubscriber};
use super::snapshot::{Handler, Snapshot, SnapshotSink};
use super::status::PublisherEvent;
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
    ) -> Result<Self, NetError> {
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
    /// Copies `msg` in as the next message; its sequence. See [`McastPublisher::offer`].
    #[inline]
    pub fn offer(&mut self, now: Mono, msg: &[u8]) -> Result<u64, PublishError> {
        match self {
            MdPublisher::Multicast(p) => p.offer(now, msg),
            MdPublisher::Rc(p) => p.offer(now, msg),
        }
    }
    /// Claims `len` bytes for the next message; see [`McastPublisher::try_claim`].
    pub fn try_claim(&mut self, now: Mono, len: usize) -> Result<MdClaim<'_, Self>, PublishError> {
        match self {
            MdPublisher::Multicast(p) => p.prepare_claim(now.as_nanos(), len)?,
            MdPublisher::Rc(p) => p.prepare_claim(now.as_nanos(), len)?,
        }
        Ok(MdClaim::new(self, now))
    }
    /// The next event: a subscriber lagging or caught up (multicast), joined
    /// or dropped (RC).
    pub fn poll_event(&mut self) -> Option<MdPublisherEvent> {
        match self {
            MdPublisher::Multicast(p) => p.poll_event().map(MdPublisherEvent::Status),
            MdPublisher::Rc(p) => p.poll_event().map(MdPublisherEvent::Fanout),
        }
    }
    /// See [`McastPublisher::flush`].
    pub fn flush(&mut self, now: Mono) -> Result<(), NetError> {
        match self {
            MdPublisher::Multicast(p) => Ok(p.flush(now)?),
            MdPublisher::Rc(p) => p.flush(now),
        }
    }
    /// See [`McastPublisher::poll`]; returns datagrams sent (multicast) or
    /// datagram frames written, summed over subscribers (RC).
    pub fn poll(&mut self, now: Mono, snapshot: &impl Snapshot) -> Result<usize, NetError> {
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
    ) -> Result<Self, NetError> {
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
    ) -> Result<Self, NetError> {
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
        rc: Ctor<RcFanoutSubscriber, NetError>,
    ) -> Result<Self, NetError> {
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
    /// The next lifecycle event (loss, resync, snapshot, recovery link
    /// lost/restored), after the messages the polls before it delivered.
    pub fn poll_event(&mut self) -> Option<Event> {
        match self {
            MdSubscriber::Multicast(s) => s.poll_event(),
            MdSubscriber::Rc(s) => s.poll_event(),
        }
    }
    /// Delivers in order to `app`, taking at most `fragment_limit`
    /// datagrams (frames on RC) from each line; see [`McastSubscriber::poll`].
    #[inline]
    pub fn poll<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: Mono,
        app: &mut A,
        fragment_limit: usize,
    ) -> Result<usize, NetError> {
        match self {
            MdSubscriber::Multicast(s) => Ok(s.poll(now, app, fragment_limit)?),
            MdSubscriber::Rc(s) => s.poll(now, app, fragment_limit),
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

/// What a market-data publisher reports ([`MdPublisher::poll_event`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MdPublisherEvent {
    /// Multicast: a subscriber's status reports (lagging, caught up).
    Status(PublisherEvent),
    /// RC fan-out: a subscriber joined or was dropped.
    Fanout(FanoutEvent),
}

/// A claimed message in the publisher's open datagram (or its staging for a
/// large one): fill it, then [`commit`](Self::commit). Dropping it (or
/// [`abort`](Self::abort)) abandons it: nothing is sequenced and the next
/// claim takes its room. While it lives, its publisher cannot be used.
pub struct MdClaim<'p, P: sealed::Claimable + ?Sized> {
    publisher: &'p mut P,
    now: Mono,
}

impl<P: sealed::Claimable + ?Sized> std::fmt::Debug for MdClaim<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MdClaim")
            .field("len", &self.publisher.state_ref().claimed().len())
            .finish()
    }
}

impl<'p, P: sealed::Claimable + ?Sized> MdClaim<'p, P> {
    pub(crate) fn new(publisher: &'p mut P, now: Mono) -> Self {
        Self { publisher, now }
    }

    /// Sequences the message (a large one is sealed as fragments, sent as
    /// pacing allows) and returns its sequence.
    #[inline]
    pub fn commit(self) -> u64 {
        self.publisher.commit_claim(self.now.as_nanos())
    }

    /// Abandons the message: nothing is sequenced.
    pub fn abort(self) {
        self.publisher.state_mut_ref().abort();
    }
}

impl<P: sealed::Claimable + ?Sized> Deref for MdClaim<'_, P> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.publisher.state_ref().claimed()
    }
}

impl<P: sealed::Claimable + ?Sized> DerefMut for MdClaim<'_, P> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.publisher.state_mut_ref().claimed_mut()
    }
}

pub(crate) mod sealed {
    use super::*;

    /// A publisher an [`MdClaim`] commits into (not implementable outside
    /// the crate).
    pub trait Claimable {
        /// The protocol state.
        fn state_ref(&self) -> &PublisherState;
        /// The protocol state, to write the claim and abandon it.
        fn state_mut_ref(&mut self) -> &mut PublisherState;
        /// Commits the claim, sending what it sealed; its sequence.
        fn commit_claim(&mut self, now: u64) -> u64;
    }

    impl Claimable for McastPublisher {
        fn state_ref(&self) -> &PublisherState {
            self.state()
        }
        fn state_mut_ref(&mut self) -> &mut PublisherState {
            self.state_mut()
        }
        fn commit_claim(&mut self, now: u64) -> u64 {
            McastPublisher::commit_claim(self, now)
        }
    }

    impl Claimable for RcFanoutPublisher {
        fn state_ref(&self) -> &PublisherState {
            self.state()
        }
        fn state_mut_ref(&mut self) -> &mut PublisherState {
            self.state_mut()
        }
        fn commit_claim(&mut self, now: u64) -> u64 {
            RcFanoutPublisher::commit_claim(self, now)
        }
    }

    impl Claimable for MdPublisher {
        fn state_ref(&self) -> &PublisherState {
            self.state()
        }
        fn state_mut_ref(&mut self) -> &mut PublisherState {
            match self {
                MdPublisher::Multicast(p) => p.state_mut(),
                MdPublisher::Rc(p) => p.state_mut(),
            }
        }
        fn commit_claim(&mut self, now: u64) -> u64 {
            match self {
                MdPublisher::Multicast(p) => p.commit_claim(now),
                MdPublisher::Rc(p) => p.commit_claim(now),
            }
        }
    }
}
