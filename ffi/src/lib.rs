//! rocebus-ffi: the C ABI of rocebus, for engines written in C and C++.
//!
//! The header `include/rocebus.h` is generated from this crate by cbindgen
//! and checked in; `tests/header.rs` fails when it differs from what
//! cbindgen makes of the current source (`ROCEBUS_BLESS=1` rewrites it).
//! `include/rocebus.hpp` wraps it for C++17.
//!
//! The C API mirrors the Rust one (`docs/architecture.md`, "One API shape
//! across transports"): a publication's `offer` and `try_claim` →
//! `commit`/`abort`, a subscription's `poll(handler, fragment_limit)` and
//! `poll_event`. What Rust's borrow checker refuses at compile time is
//! refused at run time with a code (`handle.rs`): a call from inside a
//! handle's own callback, any call but commit/abort while a claim is open.
//!
//! Every entry point is one call to `guard` (`error.rs`): an error is a
//! negative [`RocebusStatus`] plus a thread-local message
//! ([`rocebus_last_error`]), and a Rust panic is caught there and returned
//! as [`RocebusStatus::Panic`], never unwound into C. (The workspace's
//! release profile aborts on panic instead, see the root `Cargo.toml`: a
//! release build then dies at the panic, which does not cross the boundary
//! either.) Nothing on the per-message path (offer, claim, commit, flush,
//! poll, including their back-pressure errors) allocates
//! (`tests/no_alloc.rs`).
// The crate is the unsafe boundary: every function takes raw pointers from
// C, and `#[no_mangle]` counts as unsafe code. Each unsafe block says why.
#![allow(unsafe_code)]

mod config;
mod engine;
mod error;
mod handle;
mod ipc;
mod md;
mod orders;

pub use config::*;
pub use engine::*;
pub use error::{rocebus_last_error, rocebus_status_name, RocebusStatus};
pub use ipc::*;
pub use md::*;
pub use orders::*;
