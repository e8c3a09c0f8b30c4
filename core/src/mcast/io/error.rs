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
    /// ([`McastPublisher::offer_and_flush`](super::McastPublisher::offer_and_flush)).
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

/// Why a market-data publisher's `offer`/`try_claim` refused a message
/// (as `OfferError` on the orders path and `IpcOfferError` on shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// Larger than `max_message_bytes` (or one datagram when large messages
    /// are off).
    #[error("message of {len} bytes exceeds the maximum of {max}")]
    TooLarge {
        /// Requested.
        len: usize,
        /// Allowed.
        max: usize,
    },
}

impl From<ClaimError> for PublishError {
    #[cold]
    fn from(e: ClaimError) -> Self {
        match e {
            ClaimError::TooLarge { len, max } => PublishError::TooLarge { len, max },
            // The I/O shells make room (flush) before every claim, so a full
            // datagram never reaches them: it would be a message that fits
            // in no datagram.
            ClaimError::Full => PublishError::TooLarge { len: 0, max: 0 },
        }
    }
}
