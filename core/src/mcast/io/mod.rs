//! The market-data path on real RDMA: the thin I/O shell around the
//! I/O-free state machines of [`super`].
//!
//! - [`McastPublisher`]: one UD queue pair sending what the
//!   [`SendSchedule`] lets out (flushed datagrams of the [`PublisherState`]'s
//!   history, paced; heartbeats when idle) to line A and (optionally) line
//!   B, joined through rdma_cm; and the recovery port: an rdma_cm
//!   [`Listener`] on the channel's port whose RC connections carry the
//!   recovery messages of [`super::wire`] to and from the
//!   [`RecoveryServer`], which decides admission, limits, answers and drops
//!   (see [`super::server`]).
//! - [`McastSubscriber`]: one UD queue pair per line with receives kept
//!   posted, one RC connection to the publisher's recovery service; feeds the
//!   [`SubscriberState`] and sends the requests it asks for.
//!
//! Admission and sources: the recovery connection is admitted by the
//! challenge-response of [`crate::auth`] (see [`super::wire`]'s "Recovery
//! admission"); through it the subscriber learns the publisher's session,
//! UD queue pair and GID, and drops (counts) every datagram from another
//! queue pair or GID before it is parsed. Both sides use the channel's
//! configured `qkey`. What the recovery port lets any client cost is the
//! [`RecoveryServer`]'s to decide; this shell reports to it what only the
//! transport sees (a connection established, an error completion, RNR
//! retries exhausted, a disconnect) and releases what it closes.
//!
//! Both are driven by `poll(now, ..)`, which never blocks, allocates or logs
//! per message. Connection management runs as non-blocking rdma_cm steps
//! checked at most once per [`CM_CHECK_NS`]: the publisher accepts a
//! recovery connection across polls (a connecting subscriber cannot stall
//! publishing), and a subscriber whose recovery connection dies keeps
//! delivering multicast, reports it ([`Event::RecoveryLost`]) and reconnects
//! with exponential back-off (`recovery.reconnect_min_ns` ..
//! `reconnect_max_ns`). Setting up a connection allocates its queue pair
//! and buffers (rare, not per message); a recovery connection's outbox
//! grows, amortised, to its largest burst of answers, up to
//! `recovery_server.max_outbox_bytes`. Buffers are the verbs layer's [`PooledQp`] rings, so
//! there is no `unsafe` here. Protocol decisions belong to the state
//! machines, not to this module.
//!
//! Files by responsibility: `error.rs` (the errors), `common.rs` (sizes,
//! timeouts, the clock and the configuration look-ups both sides share),
//! `publisher.rs` with the recovery port's transport in `recovery.rs`,
//! `subscriber.rs` with its recovery link in `link.rs`, and `export.rs` (the
//! counters `rocebus stat` reads). A file imports from `common` and `error`
//! and from the files it drives; none imports back from a file that
//! imports it.
//!
//! [`SendSchedule`]: super::SendSchedule
//! [`PublisherState`]: super::PublisherState
//! [`Listener`]: crate::verbs::cm::Listener
//! [`RecoveryServer`]: super::RecoveryServer
//! [`SubscriberState`]: super::SubscriberState
//! [`Event::RecoveryLost`]: super::Event::RecoveryLost
//! [`PooledQp`]: crate::verbs::PooledQp

mod common;
mod error;
mod export;
mod link;
mod publisher;
mod recovery;
mod subscriber;

pub use crate::mcast::subscriber::DEAD_LINK_TIMEOUTS;
pub use common::{CM_CHECK_NS, RC_MSG_LEN, SNAPSHOT_CHUNK};
pub use error::{NetError, PublishError};
pub use export::{PublisherCountersExport, SubscriberCountersExport, SubscriberStats};
pub use publisher::{McastPublisher, PublisherIoStats};
pub use subscriber::{McastSubscriber, SubscriberIoStats};
