//! The atomics of the loopback ring memory: loom's under `--cfg loom`, so
//! the model checker sees every load and store, else std's.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
