//! rocebus: low-latency pub/sub over RDMA (RoCE).
//!
//! - [`orders`]: the orders path. RC queue pairs; the sender RDMA-WRITEs
//!   frames straight into the receiver's pre-registered [`ring`], the
//!   receiver finds them by polling its memory, credits flow back by RDMA
//!   WRITE. Zero-copy `try_claim`/`commit`, no allocation per message.
//! - [`mcast`]: the market-data path. UD multicast joined through rdma_cm,
//!   sequencing, gap recovery over RC, A/B arbitration, late join.
//! - [`auth`]: the challenge-response every handshake uses, and datagram tags.
//! - [`ipc`]: the shared-memory transport for processes on one host.
//! - [`verbs`]: the safe layer over rdma-sys (the only code that touches it).
//! - [`counters`]: lock-free counters in a shared-memory file (`rocebus stat`).
//! - [`idle`]: idle strategies and thread pinning for polling loops.
//!
//! Protocol logic ([`ring::state`], [`ring::frame`], [`mcast`]'s state
//! machines) is free of I/O and tested on any host; everything that touches
//! a device runs in the soft-RoCE guest (`cargo xtask test`).
//!
//! # Quick start
//!
//! An engine that reads market data and sends orders: one busy-polling
//! thread owns both, each call returns at once (nothing blocks, locks or
//! allocates per message), and the clock is read once per turn
//! ([`clock::Mono::now`]) and passed to every call that needs time.
//!
//! ```no_run
//! use rocebus::clock::Mono;
//! use rocebus::mcast::config::McastConfig;
//! use rocebus::mcast::{Handler, MdSubscriber, RestoreError, SnapshotSink};
//! use rocebus::orders::{Connection, OrdersConfig};
//!
//! /// What the engine keeps of the feed (here: the last message's sequence).
//! #[derive(Default)]
//! struct Quotes { last: u64 }
//! impl Handler for Quotes {
//!     fn on_message(&mut self, seq: u64, _msg: &[u8]) { self.last = seq; }
//! }
//! // A late joiner starts from the publisher's snapshot: restore it here.
//! impl SnapshotSink for Quotes {
//!     fn begin_restore(&mut self) {}
//!     fn restore_chunk(&mut self, _data: &[u8]) -> Result<(), RestoreError> { Ok(()) }
//!     fn finish_restore(&mut self, seq: u64) -> Result<(), RestoreError> { self.last = seq; Ok(()) }
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let md = McastConfig::load("configs/md.toml")?;
//! let (me, feed) = ("198.18.0.2".parse()?, "198.18.0.1".parse()?);
//! let mut market = MdSubscriber::new(&md, 1, me, feed)?; // channel 1, multicast or rc
//! let cfg = OrdersConfig { token: "s3cret".into(), ..OrdersConfig::default() };
//! let mut gateway = Connection::connect(&cfg, "198.18.0.1:7470".parse()?)?;
//! let mut quotes = Quotes::default();
//! loop {
//!     let now = Mono::now(); // the one clock read of this turn
//!     market.poll(now, &mut quotes, 16)?;
//!     while let Some(event) = market.poll_event() {
//!         println!("market data: {event:?}"); // gaps, resyncs, recovery link up/down
//!     }
//!     if quotes.last % 1000 == 999 {
//!         // Zero copy: the claim is the registered memory the NIC sends from.
//!         let mut claim = gateway.try_claim(1, 7, 8)?; // stream 1, message type 7, 8 bytes
//!         claim.copy_from_slice(&quotes.last.to_le_bytes());
//!         claim.commit();
//!         gateway.flush()?; // one RDMA WRITE (and doorbell) for all claims since the last
//!     }
//!     gateway.subscription().poll(|f| println!("ack: type {} {} B", f.msg_type, f.payload.len()), 16)?;
//! }
//! # }
//! ```
//!
//! Every transport has the same shape (`docs/architecture.md`, "One API
//! shape across transports"): a subscription's `poll(.., handler,
//! fragment_limit) -> Result<usize, _>` and `poll_event()`, a publication's
//! `offer` and `try_claim` → claim → `commit()`/`abort()`, message types
//! in [`RESERVED_TYPES`] refused on orders and ipc (market-data messages
//! carry no type).
//!
//! Processes on one host use [`ipc`] with the same claim/commit shape; the
//! gateway side of the orders path is [`orders::OrdersListener`] (or
//! [`orders::ConnectionSet`] for many engines), the publishing side of
//! market data [`mcast::MdPublisher`].
#![deny(unsafe_code)]

pub mod admission;
pub mod auth;
pub mod clock;
pub mod counters;
pub mod idle;
pub mod ipc;
pub mod mcast;
pub mod orders;
pub mod rdma_settings;
pub mod ring;
pub mod verbs;

/// Message types the ring transports keep for themselves (padding and control
/// frames), 0xFF00..=0xFFFF. The transports whose messages carry a type refuse
/// them in `offer` and `try_claim`: the orders path with
/// [`orders::OfferError::ReservedType`] (guest test
/// `rdma_orders_ping_pong_streams_and_zero_copy_claims` in `core/tests/orders.rs`)
/// and ipc with [`ipc::IpcOfferError::ReservedType`] (test
/// `bad_configuration_and_names_are_refused_with_reasons` in
/// `core/src/ipc/tests.rs`). Market data has no message type: its `offer` and
/// `try_claim` take bytes only, and [`mcast::io::PublishError`] has no such
/// variant.
pub const RESERVED_TYPES: std::ops::RangeInclusive<u16> = ring::frame::TYPE_RESERVED_MIN..=u16::MAX;
