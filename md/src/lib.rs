//! The market-data contract of rocebus: the normalized messages the feed handler publishes
//! on the bus ([`normalized`]), the L2 snapshot layout and [`view::MarketView`], the
//! price-level view a subscriber rebuilds from them.
//!
//! A crate of its own so that every consumer (the order gateway's risk checks, a trading
//! engine, `rocebus record`) depends on this and on `rocebus`, not on the feed handler
//! (ITCH decoding, order books, MoldUDP64). The feed handler re-exports these modules under
//! their old paths (`feed_handler::normalized`, `feed_handler::view`) and adds the encoders
//! from its books.

pub mod normalized;
pub mod types;
pub mod view;

pub use types::{Level, Side, Stock};
