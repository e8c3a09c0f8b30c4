//! rdma_cm: address and route resolution, RC connection set-up with private
//! data, disconnect events, and multicast join/leave for UD on RoCE v2.
//!
//! Queue pairs are created by the caller on the device the id resolved to
//! and driven through INIT/RTR/RTS here with the attributes rdma_cm computes
//! (`rdma_init_qp_attr`), overridden by [`RcOptions`](crate::verbs::RcOptions) where the user asks, so
//! every RC knob stays in our hands (rdma_cm's own QPs hide most of them).
//!
//! `id` holds the rdma_cm ids and events the others build on; `listen` is
//! the passive side, `connect` the active side, `mcast` multicast
//! membership. Each imports only from `id` and the verbs types beside it.

mod connect;
mod id;
mod listen;
mod mcast;

pub use connect::*;
pub use id::*;
pub use listen::*;
pub use mcast::*;
