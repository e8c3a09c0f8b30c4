//! rocebus: low-latency pub/sub over RDMA (RoCE).
#![deny(unsafe_code)]

pub mod counters;
pub mod mcast;
pub mod verbs;
