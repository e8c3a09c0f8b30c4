//! The safe verbs layer: the only code in rocebus that touches `rdma-sys`.
//!
//! One Rust type per verbs object, each holding an `Arc` of its parent so
//! teardown always happens in dependency order (queue pairs before their
//! completion queues and protection domain, memory regions before the
//! protection domain, everything before the device context):
//!
//! | type | verbs object |
//! |---|---|
//! | [`Context`] | `ibv_context` (from rdma_cm's device list, so rdma_cm ids share it) |
//! | [`ProtectionDomain`] | `ibv_pd` |
//! | [`MemoryRegion`] | `ibv_mr` plus the page-aligned memory it owns |
//! | [`CompletionQueue`] | `ibv_cq` |
//! | [`QueuePair`] | `ibv_qp` (RC or UD) |
//! | [`AddressHandle`] | `ibv_ah` |
//! | [`cm::EventChannel`], [`cm::CmId`] | rdma_cm channel and id |
//!
//! Posting never allocates: work requests are built in caller-owned arrays
//! and chained in place, one doorbell per batch. Polling fills a
//! caller-provided array. The rule that registered memory outlives the work
//! requests that reference it cannot be enforced by types without a cost per
//! post, so [`QueuePair::post_send`] and [`QueuePair::post_recv`] are `unsafe fn`s
//! that state it; inline sends copy their data at post time and are safe.
//!
//! This module must not know about rings, frames or market data.
#![allow(unsafe_code)]

mod cq;
mod device;
mod error;
mod memory;
mod qp;

pub mod cm;
pub mod pool;

pub use cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use device::{device_names, Context, Gid, PortInfo, PortState};
pub use error::VerbsError;
pub use memory::{Access, MemoryRegion, ProtectionDomain, SharedMemory};
pub use pool::{
    Dest, PoolConfig, PoolError, PoolStats, PooledQp, RecvPoll, RecvSource, StageError,
};
pub use qp::{
    AddressHandle, AhAttr, LocalPath, Mtu, QpCaps, QpState, QpType, QueuePair, RcOptions, RcPeer,
    RecvWr, SendWr, Sge,
};

/// Result of a verbs operation.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;

/// The qkey rdma_cm uses for UDP port space (`RDMA_UDP_QKEY`), which a UD
/// queue pair must carry to receive multicast joined through rdma_cm.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Bytes of Global Routing Header in front of every UD receive on RoCE.
pub const GRH_LEN: usize = 40;
