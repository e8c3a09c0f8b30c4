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
//! # GID selection
//!
//! Which GID table entry a queue pair sends from decides whether traffic is
//! RoCE v2 (routable UDP/IP) or RoCE v1. [`Context::select_gid`] reads the
//! port's table with its types and netdevs from sysfs ([`GidTable`]) and
//! picks with [`select_gid`], a pure function: by the service's local IP or
//! interface, RoCE v2 only unless [`GidPolicy::allow_roce_v1`]; an explicit
//! index (a `gid_index` config key, else `ROCEBUS_GID_INDEX`) wins but is
//! checked. The choice is logged once and returned as a [`GidChoice`] to
//! print. rdma_cm connections pick their own GID from the bound address
//! (RoCE v2 by the kernel's `default_roce_mode`); [`cm::CmId::sgid`] shows it.
//!
//! This module must not know about rings, frames or market data.
#![allow(unsafe_code)]

mod cq;
mod device;
mod error;
mod gid;
mod memory;
mod qp;
mod types;

pub mod cm;
pub mod pool;

pub use cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
pub use device::{device_names, Context, Gid, PortInfo, PortState};
pub use error::{Result, VerbsError};
pub use gid::{
    check_connection_index, env_gid_index, gid_matches_ip, select_gid, GidChoice, GidEntry,
    GidError, GidPolicy, GidTable, GidType, LocalGid,
};
pub use memory::{
    huge_pages, memlock_limit, registered_memory, set_huge_pages, Access, MemoryRegion,
    ProtectionDomain, RegisteredMemory, SharedMemory, HUGE_PAGE, HUGE_PAGE_MIN,
};
pub use pool::{
    Dest, PoolConfig, PoolError, PoolStats, PooledQp, RecvPoll, RecvSource, StageError,
};
pub use qp::{
    AddressHandle, AhAttr, LocalPath, Mtu, PreparedRecvs, PreparedUdSend, PreparedWrite,
    QpAttributes, QpCaps, QueuePair, RcOptions, RcPeer, RecvWr, SendWr, Sge, UdClass, UdDest,
    WriteFlags, PREPARED_UD_DESTS,
};
pub use types::{QpState, QpType, GRH_LEN, RDMA_UDP_QKEY};
