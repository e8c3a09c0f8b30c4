//! Completion queues and work completions.

use super::device::Context;
use super::error::Result;
use super::error::{errno, last_err, VerbsError};
use rdma_sys as sys;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// A completion queue, polled (never armed for events): rocebus busy-polls.
pub struct CompletionQueue {
    cq: NonNull<sys::ibv_cq>,
    /// The provider's `poll_cq`, read once from the context's ops (filled
    /// when the device was opened, never changed): a poll per turn then
    /// makes no two loads and `None` check to find it.
    poll_fn: PollCqFn,
    depth: u32,
    ctx: Arc<Context>,
}

// SAFETY: ibv_poll_cq on one CQ from several threads is serialised by the
// provider's CQ lock; the handle itself is inert.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("depth", &self.depth)
            .finish()
    }
}

/// `ibv_context_ops::poll_cq`.
type PollCqFn = unsafe extern "C" fn(
    *mut sys::ibv_cq,
    std::os::raw::c_int,
    *mut sys::ibv_wc,
) -> std::os::raw::c_int;

/// Stands in for a provider without `poll_cq`: every poll fails.
unsafe extern "C" fn no_poll_cq(
    _: *mut sys::ibv_cq,
    _: std::os::raw::c_int,
    _: *mut sys::ibv_wc,
) -> std::os::raw::c_int {
    -libc::EOPNOTSUPP
}

impl CompletionQueue {
    /// Creates a CQ with room for at least `depth` completions.
    pub fn new(ctx: &Arc<Context>, depth: u32) -> Result<Arc<Self>> {
        // SAFETY: valid context; no completion channel, no vector.
        let cq = unsafe {
            sys::ibv_create_cq(
                ctx.as_raw(),
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::CreateCq {
            depth,
            source: last_err(),
        })?;
        // SAFETY: a CQ made by ibv_create_cq points at its live context; the
        // ops table is the provider's, filled when the device was opened.
        let poll_fn = unsafe { (*cq.as_ref().context).ops.poll_cq }.unwrap_or(no_poll_cq);
        Ok(Arc::new(Self {
            cq,
            poll_fn,
            depth,
            ctx: ctx.clone(),
        }))
    }

    /// The raw CQ.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.cq.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Polls up to `out.len()` completions into `out`; returns how many.
    /// No allocation, no system call (the provider reads the CQ ring in
    /// user memory).
    #[inline]
    pub fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let n = out.len().min(i32::MAX as usize) as i32;
        // SAFETY: WorkCompletion is repr(transparent) over ibv_wc, and `out`
        // has room for `n` of them.
        // The provider's poll_cq, as ibv_poll_cq calls it.
        let rc = unsafe { (self.poll_fn)(self.cq.as_ptr(), n, out.as_mut_ptr().cast()) };
        if rc < 0 {
            return Err(VerbsError::PollCq(errno(rc)));
        }
        Ok(rc as usize)
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc to it, so none is left.
        unsafe { sys::ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

/// Work completion status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcStatus {
    /// Success.
    Success,
    /// Local length error.
    LocalLength,
    /// Local QP operation error.
    LocalQpOperation,
    /// Local protection error (bad lkey, or memory not registered).
    LocalProtection,
    /// The WR was flushed because the QP went to the error state.
    WrFlush,
    /// Memory window bind error.
    MwBind,
    /// Bad response from the responder.
    BadResponse,
    /// Local access error.
    LocalAccess,
    /// Remote invalid request (e.g. operation not allowed by the peer QP).
    RemoteInvalidRequest,
    /// Remote access error (wrong rkey, or address outside the region).
    RemoteAccess,
    /// Remote operation error.
    RemoteOperation,
    /// Transport retries exhausted: the peer did not answer.
    RetryExceeded,
    /// Receiver-not-ready retries exhausted.
    RnrRetryExceeded,
    /// Remote aborted.
    RemoteAborted,
    /// Any other status, with its raw value.
    Other(u32),
}

impl WcStatus {
    fn from_raw(s: u32) -> Self {
        use sys::ibv_wc_status::*;
        match s {
            IBV_WC_SUCCESS => Self::Success,
            IBV_WC_LOC_LEN_ERR => Self::LocalLength,
            IBV_WC_LOC_QP_OP_ERR => Self::LocalQpOperation,
            IBV_WC_LOC_PROT_ERR => Self::LocalProtection,
            IBV_WC_WR_FLUSH_ERR => Self::WrFlush,
            IBV_WC_MW_BIND_ERR => Self::MwBind,
            IBV_WC_BAD_RESP_ERR => Self::BadResponse,
            IBV_WC_LOC_ACCESS_ERR => Self::LocalAccess,
            IBV_WC_REM_INV_REQ_ERR => Self::RemoteInvalidRequest,
            IBV_WC_REM_ACCESS_ERR => Self::RemoteAccess,
            IBV_WC_REM_OP_ERR => Self::RemoteOperation,
            IBV_WC_RETRY_EXC_ERR => Self::RetryExceeded,
            IBV_WC_RNR_RETRY_EXC_ERR => Self::RnrRetryExceeded,
            IBV_WC_REM_ABORT_ERR => Self::RemoteAborted,
            other => Self::Other(other),
        }
    }
}

/// What a completion completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WcOpcode {
    /// SEND (with or without immediate).
    Send,
    /// RDMA WRITE (with or without immediate).
    RdmaWrite,
    /// RDMA READ.
    RdmaRead,
    /// A receive (SEND from the peer).
    Recv,
    /// A receive consumed by RDMA WRITE with immediate.
    RecvRdmaWithImm,
    /// Anything else.
    Other(u32),
}

/// One work completion, laid out exactly as `ibv_wc`.
#[repr(transparent)]
pub struct WorkCompletion(sys::ibv_wc);

impl Default for WorkCompletion {
    fn default() -> Self {
        Self::empty()
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkCompletion")
            .field("wr_id", &self.wr_id())
            .field("status", &self.status())
            .field("opcode", &self.opcode())
            .field("byte_len", &self.byte_len())
            .field("imm", &self.imm())
            .finish()
    }
}

impl WorkCompletion {
    /// A zeroed completion, to fill arrays that poll writes into.
    pub const fn empty() -> Self {
        // SAFETY: ibv_wc is plain C data; all-zero is a valid value.
        Self(unsafe { std::mem::zeroed() })
    }
    /// The wr_id given at post time.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }
    /// Status.
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }
    /// Whether it succeeded.
    pub fn is_success(&self) -> bool {
        self.0.status == sys::ibv_wc_status::IBV_WC_SUCCESS
    }
    /// Opcode (only meaningful on success).
    pub fn opcode(&self) -> WcOpcode {
        use sys::ibv_wc_opcode::*;
        match self.0.opcode {
            IBV_WC_SEND => WcOpcode::Send,
            IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
            IBV_WC_RDMA_READ => WcOpcode::RdmaRead,
            IBV_WC_RECV => WcOpcode::Recv,
            IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
            o => WcOpcode::Other(o),
        }
    }
    /// Bytes received (receives only; includes the 40-byte GRH on UD).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }
    /// Immediate data (host order), if the completion carries one.
    pub fn imm(&self) -> Option<u32> {
        if self.0.wc_flags & sys::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
            // SAFETY: WITH_IMM says the union holds imm_data.
            Some(u32::from_be(unsafe {
                self.0.imm_data_invalidated_rkey_union.imm_data
            }))
        } else {
            None
        }
    }
    /// The local QP number.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }
    /// The sending QP (UD receives).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }
    /// Vendor error code (diagnostics).
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }
}
