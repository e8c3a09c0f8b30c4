//! The market-data path's protocol logic: UD multicast with sequencing, A/B
//! arbitration, gap recovery over RC, and snapshots for late joiners.
//!
//! Everything here is an I/O-free state machine in the style of
//! `quinn-proto`: it takes bytes and `now` (nanoseconds, any monotonic clock)
//! and hands back bytes, events and deadlines. It owns the wire formats
//! ([`wire`]), the publisher's batching and history ([`publisher`]), the
//! subscriber's sequencing and recovery ([`subscriber`]), how the publisher
//! answers retransmit requests, unicast or multicast ([`repair`]), within
//! what budget ([`budget`]), when
//! datagrams and heartbeats go out ([`schedule`]), the recovery service's
//! admission, limits and answers ([`server`]), the
//! subscribers' status reports and the publisher's view of them
//! ([`status`]), the RC fan-out for fabrics without multicast
//! ([`rcfanout`], chosen per channel by `transport`, see [`transport`]), the application
//! traits ([`snapshot`]) and the TOML configuration ([`config`]).
//!
//! The state machines must not touch sockets, verbs, threads or clocks
//! ([`io`] is the one module here that does, as a thin shell): the verbs layer posts
//! the buffers, strips the 40-byte GRH, tells the subscriber which line a
//! datagram came on, and carries recovery messages over RC. Memory is
//! allocated once at construction; the per-message paths neither allocate,
//! lock nor log.
//!
//! Sequences start at 1 and are contiguous per publisher session; a
//! restarted publisher takes a greater session id.

pub mod backoff;
pub mod budget;
pub mod config;
pub mod fragment;
pub mod io;
pub mod publisher;
pub mod rcfanout;
pub mod repair;
pub mod schedule;
pub mod server;
pub mod snapshot;
pub mod status;
pub mod subscriber;
pub mod transport;
pub mod wire;

pub use io::{McastPublisher, McastSubscriber, NetError};
pub use publisher::{
    ClaimError, Output, Pacer, Published, PublisherConfig, PublisherState, RetransmitReply,
};
pub use rcfanout::{FanoutDrop, FanoutEvent, RcFanoutPublisher, RcFanoutSubscriber};
pub use repair::{RepairConfig, RepairCounters, RepairDecision, RepairPlanner};
pub use schedule::{SendSchedule, Transmit};
pub use server::{RecoveryCounters, RecoveryServer, ServerConfig};
pub use snapshot::{Handler, NoSnapshots, RestoreError, Snapshot, SnapshotSink};
pub use status::{PublisherEvent, StatusReporter, SubscriberRow, SubscriberTable};
pub use subscriber::{
    Event, Phase, Request, SubscriberConfig, SubscriberCounters, SubscriberState,
};
pub use transport::{MdClaim, MdPublisher, MdPublisherEvent, MdSubscriber};
pub use wire::{Datagram, Line};

/// A zeroed buffer with every page already faulted in. The publisher's
/// history and the subscriber's reorder buffer are touched a new page every
/// few datagrams; left to fault lazily, each first touch of a transparent
/// huge page would clear 2 MiB inside `publish` or a recovery (about 0.1 ms
/// on hardware, milliseconds under emulation). Faulting them in at
/// construction, as Aeron pre-touches its term buffers, keeps that off the
/// hot path.
pub(crate) fn prefaulted(len: usize) -> Box<[u8]> {
    let mut buf = vec![0u8; len].into_boxed_slice();
    for page in buf.chunks_mut(4096) {
        // black_box: storing the zero already there could be optimised away.
        page[0] = std::hint::black_box(0);
    }
    buf
}
