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
#![deny(unsafe_code)]

pub mod auth;
pub mod counters;
pub mod idle;
pub mod ipc;
pub mod mcast;
pub mod orders;
pub mod ring;
pub mod verbs;
