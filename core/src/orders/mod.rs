//! The orders path: one RC connection per peer pair carrying framed
//! messages on several streams in both directions, through the rings of
//! [`crate::ring`].
//!
//! ```no_run
//! use rocebus::orders::{OrdersConfig, OrdersListener, Connection};
//! use std::time::Duration;
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cfg = OrdersConfig { token: "s3cret".into(), ..OrdersConfig::default() };
//! // Gateway side:
//! let mut listener = OrdersListener::bind(cfg.clone(), "198.18.0.1:7470".parse()?)?;
//! // Engine side (another process or host):
//! let mut conn = Connection::connect(&cfg, "198.18.0.1:7470".parse()?)?;
//! let mut orders = conn.publication(1);
//! let mut claim = orders.try_claim(7, 64)?; // message type 7, 64 bytes, in registered memory
//! claim.copy_from_slice(&[0u8; 64]);
//! claim.commit();
//! orders.flush()?; // or conn.flush() once `orders` is no longer used
//! // Gateway side:
//! let mut gw = listener.accept(Duration::from_secs(5))?.expect("a connection");
//! gw.subscription().poll(|f| println!("stream {} type {} {} bytes", f.stream_id, f.msg_type, f.payload.len()), 16)?;
//! # Ok(()) }
//! ```
//!
//! A [`Connection`] is used from one thread at a time (it is `Send`): the
//! busy-polling thread that owns it publishes, polls and flushes. Its
//! hot-path calls never allocate, lock, log or make system calls; they
//! return small `Copy` errors.
//!
//! Everything that moves bytes borrows the connection mutably: a
//! [`Publication`] and a [`Subscription`] each hold `&mut Connection`, and a
//! [`Claim`] holds its publication mutably until it is committed or
//! dropped. So a claim cannot be open across a flush, a poll or another
//! claim: the compiler refuses it (the shape of [`crate::ipc`]'s
//! publisher), and there is no run-time borrow check to fail.
//!
//! ```compile_fail,E0499
//! # use rocebus::orders::{Connection, OrdersConfig};
//! #
//! # let mut conn = Connection::connect(&OrdersConfig::default(), "198.18.0.1:7470".parse().unwrap()).unwrap();
//! let mut orders = conn.publication(1);
//! let claim = orders.try_claim(7, 64).unwrap();
//! conn.flush().unwrap(); // error: `conn` is already borrowed by `orders`, which `claim` holds
//! claim.commit();
//! ```
//!
//! ```compile_fail,E0499
//! # use rocebus::orders::{Connection, OrdersConfig};
//! #
//! # let mut conn = Connection::connect(&OrdersConfig::default(), "198.18.0.1:7470".parse().unwrap()).unwrap();
//! let mut orders = conn.publication(1);
//! let claim = orders.try_claim(7, 64).unwrap();
//! orders.flush().unwrap(); // error: `orders` is already borrowed by `claim`
//! claim.commit();
//! ```
//!
//! [`Connection::try_claim`] (the stream named per call) borrows the
//! connection itself, so polling while its claim is open is refused too:
//!
//! ```compile_fail,E0499
//! # use rocebus::orders::{Connection, OrdersConfig};
//! #
//! # let mut conn = Connection::connect(&OrdersConfig::default(), "198.18.0.1:7470".parse().unwrap()).unwrap();
//! let claim = conn.try_claim(1, 7, 64).unwrap();
//! conn.subscription().poll(|_| {}, 16).unwrap(); // error: `conn` is already borrowed by `claim`
//! claim.commit();
//! ```
//!
//! The same with the claim committed first compiles (and is what the
//! examples above do):
//!
//! ```no_run
//! # use rocebus::orders::{Connection, OrdersConfig};
//! #
//! # let mut conn = Connection::connect(&OrdersConfig::default(), "198.18.0.1:7470".parse().unwrap()).unwrap();
//! let mut orders = conn.publication(1);
//! let claim = orders.try_claim(7, 64).unwrap();
//! claim.commit();
//! conn.flush().unwrap();
//! ```
//!
//! # Where each part lives
//!
//! - `config`: [`OrdersConfig`] and its checks.
//! - `connection`: [`Connection`], the I/O shell over
//!   [`crate::ring::proto`]'s [`Sender`](crate::ring::Sender) and
//!   [`Receiver`](crate::ring::Receiver): connect, post the RDMA WRITEs,
//!   reap completions, return credit, notice a lost peer.
//! - `publication` ([`Publication`], [`Claim`]) and `subscription`
//!   ([`Subscription`], [`Frame`]): the two directions of the embedding API.
//! - `listener`: [`OrdersListener`], admission and handshakes.
//! - `fanin`: [`ConnectionSet`] and [`FanIn`], polling many accepted
//!   connections through one activity summary.

mod config;
mod connection;
mod fanin;
mod listener;
mod publication;
mod subscription;

pub use config::OrdersConfig;
pub use connection::{
    bad_credits_total, ConnStats, ConnectProgress, Connecting, Connection, OrdersError, PeerLost,
    CM_CHECK_IDLE_POLLS,
};
pub use fanin::{ConnId, ConnectionSet, FanIn, SetError, SetStats};
pub use listener::{first_proof, ListenerStats, OrdersListener};
pub use publication::{Claim, OfferError, Publication};
pub use subscription::{Frame, OrdersEvent, Subscription};
