//! Plain value types and constants of the verbs layer, shared by its
//! modules (errors name queue pair types and states): they depend on
//! nothing but `rdma-sys`, so the modules that use them form no cycle.

use rdma_sys as sys;

/// Transport type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable datagram.
    Ud,
}

/// Queue pair state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialised.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error: every outstanding WR is flushed (e.g. transport retries exhausted).
    Error,
    /// Unknown value.
    Unknown(u32),
}

impl QpState {
    pub(super) fn from_raw(s: u32) -> Self {
        use sys::ibv_qp_state::*;
        match s {
            IBV_QPS_RESET => Self::Reset,
            IBV_QPS_INIT => Self::Init,
            IBV_QPS_RTR => Self::Rtr,
            IBV_QPS_RTS => Self::Rts,
            IBV_QPS_SQD => Self::Sqd,
            IBV_QPS_SQE => Self::Sqe,
            IBV_QPS_ERR => Self::Error,
            o => Self::Unknown(o),
        }
    }
}

/// The qkey rdma_cm uses for UDP port space (`RDMA_UDP_QKEY`), which a UD
/// queue pair must carry to receive multicast joined through rdma_cm.
pub const RDMA_UDP_QKEY: u32 = 0x0123_4567;

/// Bytes of Global Routing Header in front of every UD receive on RoCE.
pub const GRH_LEN: usize = 40;
