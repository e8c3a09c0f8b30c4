//! The demo's sample trading engine (`sample-engine`, run by `cargo xtask demo`).
//!
//! It shows an engine embedding rocebus end to end: it subscribes to the feed handler's
//! normalized market data on the UD multicast bus (or, on the feed handler's host, on its
//! shared-memory streams: `market_data.transport`), keeps a best bid/offer per traded symbol,
//! and on a fixed schedule sends a day limit order that joins the book (buy at the best bid,
//! sell at the best ask, alternating) to the order gateway over RC; acks, fills and rejects
//! come back on the same connection.
//!
//! It is also the demo's measuring instrument, so the figures are honest:
//! - order round trip: from the order's *intended* send time on the fixed schedule
//!   ([`FixedRateSchedule`](crate::report::FixedRateSchedule)) to the venue's ack arriving
//!   back in the engine, so a stall anywhere shows as the latency every scheduled order
//!   would have seen (coordinated omission corrected);
//! - market-data latency: from the kernel's receive stamp of the exchange packet the feed
//!   handler reads (a raw-socket probe, [`tap`]) to the engine's handler, per normalized
//!   message (matched by its ITCH timestamp).
//!
//! The round trip is taken on CLOCK_MONOTONIC inside the engine ([`monotonic_ns`]); the
//! market-data latency on CLOCK_REALTIME, the clock of the kernel's stamps, read on the same
//! host ([`realtime_ns`]).
//!
//! Split as the rest of rocebus: [`Strategy`], [`OrderTimes`] and [`MdView`] are I/O-free
//! and tested here; [`run`] is the thin loop that moves bytes. The module owns no wire format
//! (those are `rocebus_md::normalized` and `rocebus_engine::proto`).
//!
//! One file per part: `config` (the TOML), `md` (the market-data side: the handler that
//! feeds the strategy and measures latency), `orders` (the quoting strategy and the order
//! path's bookkeeping), `report` (what the run says and writes), `transport` (the market-data
//! subscribers: the RDMA bus or the feed handler's shared-memory streams, both feeding the
//! same handler), `engine` (the polling loop).

mod config;
mod engine;
mod md;
mod orders;
mod report;
pub mod tap;
mod transport;

pub use config::{
    load_ipc_source, load_market_data, ConfigError, EngineConfig, GatewayConfig, IpcSource,
    LoopConfig, MarketDataConfig, StrategyConfig, Transport, MAX_SYMBOLS,
};
pub use engine::{run, RunOptions};
pub use md::{BusCounts, MdCounts, MdView};
pub use orders::{OrderCounts, OrderIntent, OrderTimes, Quote, Strategy};
pub use report::{Floors, Outcome};

/// The clocks of the report's figures, as named in the report.
pub const CLOCK_NAME: &str = "order round trip on CLOCK_MONOTONIC (engine); market data from the \
kernel's receive stamp of the exchange packet (SO_TIMESTAMPNS, CLOCK_REALTIME) to CLOCK_REALTIME \
in the engine's handler, same host";

/// Nanoseconds of CLOCK_MONOTONIC: the same clock in every process of the host, so a stamp
/// taken in the feed handler can be compared with one taken in the engine.
#[allow(unsafe_code)]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call, and
    // CLOCK_MONOTONIC is supported by every Linux kernel (the call cannot fail with it).
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Nanoseconds of CLOCK_REALTIME, the clock of the kernel's receive stamps
/// ([`tap`]).
pub fn realtime_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
