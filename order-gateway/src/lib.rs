//! rocebus order gateway: trading engines send binary orders (see [`proto`]), the gateway
//! applies pre-trade risk ([`risk`]), journals every event ([`journal`]), speaks FIX 4.4 to
//! the venue ([`fix`]) and returns acks and fills.
//!
//! The core, [`gateway::Gateway`], is an I/O-free state machine: it takes bytes and `now`
//! (nanoseconds since the UNIX epoch) and writes its outputs (engine responses, FIX bytes,
//! journal records) into an [`gateway::Outputs`] the caller drains. [`driver`] is the thin std
//! TCP front for the FIX side; the RC engine side is wired by the rocebus transport.
//!
//! Quick start (a driver loop, with the engine side in-process):
//!
//! ```no_run
//! use order_gateway::{config::Config, driver::FixDriver};
//! let cfg = Config::load("configs/order-gateway.toml".as_ref())?;
//! let mut driver = FixDriver::open(&cfg)?;
//! driver.connect()?;
//! loop {
//!     driver.poll(std::time::Duration::from_millis(1))?;
//!     for (engine, response) in driver.take_engine_responses() {
//!         // hand `response.as_bytes()` to the engine's transport
//!         let _ = (engine, response);
//!     }
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

pub mod client;
pub mod config;
pub mod driver;
pub mod fix;
pub mod gateway;
pub mod journal;
pub mod proto;
pub mod risk;

/// Nanoseconds since the UNIX epoch, from the system clock (drivers only; the core takes
/// `now` as an argument).
pub fn unix_nanos() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
