//! rocebus order gateway: trading engines send binary orders (see [`proto`]) over the
//! rocebus orders path (RDMA RC), the gateway applies pre-trade risk ([`risk`]), journals
//! every event ([`journal`]), speaks FIX 4.4 to the venue ([`fix`]) and returns acks and fills.
//!
//! The core, [`gateway::Gateway`], is an I/O-free state machine: it takes bytes and `now`
//! (nanoseconds since the UNIX epoch) and writes its outputs (engine responses, FIX bytes,
//! journal records) into an [`gateway::Outputs`] the caller drains. [`driver`] owns the
//! journal file and the venue link (TCP, or the in-process [`sim`] venue for benchmarks) and
//! applies the write-ahead order; [`service`] is the polling thread that accepts engines over
//! RC, feeds the driver and sends responses back; [`client`] is what engines embed.
//!
//! Quick start (what `order-gateway run` does):
//!
//! ```no_run
//! use order_gateway::config::Config;
//! use order_gateway::service::{NoMarketData, Service, ServiceControl};
//! let cfg = Config::load("configs/order-gateway.toml".as_ref())?;
//! let control = ServiceControl::new(); // `control.stop()` from another thread ends `run`
//! let mut service = Service::from_config(&cfg, control)?;
//! service.run(&mut NoMarketData)?;
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod checkpoint;
pub mod checkpoint_writer;
pub mod config;
pub mod control;
pub mod driver;
pub mod engine_io;
pub mod execs;
pub mod fix;
pub mod gateway;
mod invalid;
pub mod journal;
pub mod journal_health;
pub mod market;
pub mod risk;
pub mod service;
pub mod sim;
pub mod simulator;

// The engine protocol is its own crate (an engine embeds it without the gateway); the
// gateway keeps the old paths.
pub use rocebus_engine::{client, liveness, proto, unix_nanos};
