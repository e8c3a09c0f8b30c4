//! The engine protocol of the rocebus order gateway: the contract between a trading engine
//! and the gateway, in a crate of its own so that an engine depends on this and on
//! `rocebus`, not on the gateway (its journal, FIX engine, risk and venue code).
//!
//! - [`proto`]: the binary frames both sides exchange over the orders path (zerocopy views,
//!   fixed layouts, versioned, checked on decode).
//! - [`liveness`]: heartbeats and silence as an I/O-free state machine both ends share.
//! - [`client`]: [`client::EngineSession`], what an engine embeds: connect, logon, send orders,
//!   receive acks and fills, reconnect and resume.
//! - [`config`]: [`config::GatewayConfig`], the `[gateway]` table of an engine's file, read
//!   the same way by Rust engines and the C ABI.
//!
//! The gateway re-exports these modules under their old paths (`order_gateway::proto`, ...).

pub mod client;
pub mod config;
pub mod liveness;
pub mod proto;

/// Nanoseconds since the UNIX epoch, from the system clock (the I/O shells only; the state
/// machines take `now` as an argument).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
