//! rocebus: low-latency pub/sub over RDMA (RoCE).
#![deny(unsafe_code)]
