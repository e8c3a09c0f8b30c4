//! The errors of the market-data path, whatever its transport (multicast or
//! RC fan-out): [`NetError`] for set-up and polling, [`PublishError`] for a
//! refused message (as the orders path has `OrdersError` and `OfferError`,
//! and shared memory `IpcError` and `IpcOfferError`).

use std::net::SocketAddr;

use crate::mcast::publisher::ClaimError;
use crate::orders::OrdersError;
use crate::verbs::{PoolError, VerbsError};

/// Why the market-data I/O failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// The configuration has no such channel.
    #[error("channel {0} is not in the market-data configuration")]
    NoChannel(u16),
    /// A verb or rdma_cm call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A buffer pool failed (including failed send completions).
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The message was refused
    /// ([`McastPublisher::publish_and_flush`](super::McastPublisher::publish_and_flush)).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// The publisher's answer to the recovery handshake was refused: it
    /// does not know the shared secret (or is not a rocebus publisher), or
    /// the two sides disagree on the channel or on datagram tags.
    #[error("recovery admission to {publisher} failed: {reason}")]
    Admission {
        /// The publisher's recovery address.
        publisher: SocketAddr,
        /// What was wrong.
        reason: &'static str,
    },
    /// The channel is configured with another `transport`: multicast
    /// channels are served by [`McastPublisher`]/[`McastSubscriber`], RC
    /// fan-out ones by [`crate::mcast::rcfanout`]; [`crate::mcast::MdPublisher`] and
    /// [`crate::mcast::MdSubscriber`] pick the right one from the configuration.
    ///
    /// [`McastPublisher`]: super::McastPublisher
    /// [`McastSubscriber`]: super::McastSubscriber
    #[error("channel {channel} is configured with transport = \"{configured}\": use the matching publisher and subscriber (MdPublisher/MdSubscriber pick it from the configuration)")]
    WrongTransport {
        /// The channel.
        channel: u16,
        /// Its configured transport.
        configured: &'static str,
    },
    /// An RC fan-out connection (handshake, token, ring) failed.
    #[error(transparent)]
    Orders(#[from] OrdersError),
    /// Both lines of a channel came out of their joins with the same
    /// multicast GID: the A/B copies would land on one queue pair twice.
    #[error("lines A and B of channel {channel} joined the same multicast GID {mgid}")]
    LinesShareGroup {
        /// The channel.
        channel: u16,
        /// The GID both joins returned.
        mgid: String,
    },
}

/// Why [`McastPublisher::publish`](super::McastPublisher::publish) refused a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PublishError {
    /// Larger than fits in a datagram.
    #[error(transparent)]
    Claim(#[from] ClaimError),
}
