//! Queue pairs, work requests and address handles.

use super::cq::CompletionQueue;
use super::device::Gid;
use super::error::Result;
use super::error::{errno, last_err, VerbsError};
use super::memory::{Access, MemoryRegion, ProtectionDomain};
use super::types::{QpState, QpType};
use rdma_sys as sys;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// Path MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
pub enum Mtu {
    /// 256 bytes.
    #[serde(rename = "256")]
    M256,
    /// 512 bytes.
    #[serde(rename = "512")]
    M512,
    /// 1024 bytes (soft-RoCE over a 1500-byte Ethernet MTU).
    #[serde(rename = "1024")]
    M1024,
    /// 2048 bytes.
    #[serde(rename = "2048")]
    M2048,
    /// 4096 bytes (jumbo frames).
    #[serde(rename = "4096")]
    M4096,
}

impl Mtu {
    fn raw(self) -> sys::ibv_mtu::Type {
        match self {
            Mtu::M256 => 1,
            Mtu::M512 => 2,
            Mtu::M1024 => 3,
            Mtu::M2048 => 4,
            Mtu::M4096 => 5,
        }
    }
    /// In bytes.
    pub fn bytes(self) -> u32 {
        128 << self.raw()
    }
    /// The largest MTU not above `bytes`.
    pub fn from_bytes(bytes: u32) -> Mtu {
        match bytes {
            4096.. => Mtu::M4096,
            2048.. => Mtu::M2048,
            1024.. => Mtu::M1024,
            512.. => Mtu::M512,
            _ => Mtu::M256,
        }
    }
}

/// A queue pair's attributes as the device reports them ([`QueuePair::attributes`]). The
/// connection fields (`path_mtu` to `service_level`) mean something once an RC queue pair is
/// past RTR/RTS; a UD queue pair's traffic class is its address handles', not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttributes {
    /// Its state.
    pub state: QpState,
    /// Path MTU, bytes.
    pub path_mtu: u32,
    /// Local ACK timeout exponent (4.096 us x 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_count: u8,
    /// RNR retries (7: for ever).
    pub rnr_retry: u8,
    /// IP traffic class of its packets (DSCP << 2 | ECN).
    pub traffic_class: u8,
    /// Service level.
    pub service_level: u8,
    /// Largest send posted inline, bytes.
    pub max_inline: u32,
}

/// The RC knobs. Defaults suit a low-latency LAN: fail fast rather than
/// hang. The ACK timeout is 4.096 us x 2^`timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct RcOptions {
    /// Path MTU; `None` takes the port's active MTU.
    pub path_mtu: Option<Mtu>,
    /// Local ACK timeout exponent (0..=31): 4.096 us x 2^timeout.
    pub timeout: u8,
    /// Transport retries before the QP errors out (0..=7).
    pub retry_count: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code (0..=31).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READ/atomic as initiator and responder.
    pub max_rd_atomic: u8,
    /// Source GID index for connections set up through rdma_cm; `None`
    /// keeps the one rdma_cm resolved for the bound address (RoCE v2 by the
    /// kernel's default). Checked at connect/accept to be a used RoCE v2
    /// entry of the port: see [`GidPolicy`](super::GidPolicy).
    pub gid_index: Option<u8>,
    /// IP traffic class of the connection's packets (`dscp << 2 | ecn`),
    /// set through rdma_cm (`RDMA_OPTION_ID_TOS`) and the QP's address
    /// vector. Set from the service's `[rdma]` table
    /// ([`RdmaSettings`](crate::rdma_settings::RdmaSettings)), not here.
    #[serde(skip)]
    pub traffic_class: u8,
    /// Service level (0..=15) of the QP's address vector; from `[rdma]`.
    #[serde(skip)]
    pub service_level: u8,
}

/// What a UD address handle carries besides its destination: the traffic
/// class and service level of every datagram, and the source GID index when
/// one is configured (else the one rdma_cm resolved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdClass {
    /// IP traffic class (`dscp << 2 | ecn`).
    pub traffic_class: u8,
    /// Service level (0..=15).
    pub service_level: u8,
    /// Source GID index; `None` keeps rdma_cm's.
    pub gid_index: Option<u8>,
}

impl Default for UdClass {
    fn default() -> Self {
        Self {
            traffic_class: crate::rdma_settings::DEFAULT_TRAFFIC_CLASS,
            service_level: 0,
            gid_index: None,
        }
    }
}

impl RcOptions {
    /// The marking and source GID index these connections share with a UD
    /// address handle's [`UdClass`] (for reporting both paths alike).
    pub fn class(&self) -> UdClass {
        UdClass {
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            gid_index: self.gid_index,
        }
    }
}

impl Default for RcOptions {
    fn default() -> Self {
        Self {
            path_mtu: None,
            // 4.096 us * 2^14 = 67 ms, as perftest: enough for emulated
            // guests; real NICs want 12..14 too.
            timeout: 14,
            retry_count: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            gid_index: None,
            traffic_class: crate::rdma_settings::DEFAULT_TRAFFIC_CLASS,
            service_level: 0,
        }
    }
}

/// The far end of an RC connection set up without rdma_cm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RcPeer {
    /// Its QP number.
    pub qpn: u32,
    /// Its initial send PSN (our receive PSN).
    pub psn: u32,
    /// Its GID.
    pub gid: Gid,
}

/// The local end of a path: port, GID index and the port's active MTU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPath {
    /// Port number.
    pub port: u8,
    /// Local GID index.
    pub sgid_index: u8,
    /// The port's active MTU in bytes (used unless `RcOptions::path_mtu` is set).
    pub active_mtu: u32,
}

/// Queue sizes.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send WR.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive WR.
    pub max_recv_sge: u32,
    /// Max inline data (bytes copied at post time instead of DMA'd).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 1,
            max_inline_data: 256,
        }
    }
}

/// A queue pair. Holds its PD and CQs so they outlive it.
pub struct QueuePair {
    qp: NonNull<sys::ibv_qp>,
    /// The provider's post functions, read once from the context's ops
    /// (set when the device was opened, never changed): a post per
    /// message then makes no two loads and `None` check to find them.
    post_send_fn: PostSendFn,
    post_recv_fn: PostRecvFn,
    qp_type: QpType,
    caps: QpCaps,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
}

// SAFETY: posting to one QP from several threads is serialised by the
// provider's QP locks; rocebus posts from one thread per QP anyway.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.qpn())
            .field("type", &self.qp_type)
            .finish()
    }
}

/// `ibv_context_ops::post_send`.
type PostSendFn = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_send_wr,
    *mut *mut sys::ibv_send_wr,
) -> std::os::raw::c_int;
/// `ibv_context_ops::post_recv`.
type PostRecvFn = unsafe extern "C" fn(
    *mut sys::ibv_qp,
    *mut sys::ibv_recv_wr,
    *mut *mut sys::ibv_recv_wr,
) -> std::os::raw::c_int;

/// Stands in for a provider without `post_send`: every post fails.
unsafe extern "C" fn no_post_send(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_send_wr,
    _: *mut *mut sys::ibv_send_wr,
) -> std::os::raw::c_int {
    libc::EOPNOTSUPP
}
/// Stands in for a provider without `post_recv`: every post fails.
unsafe extern "C" fn no_post_recv(
    _: *mut sys::ibv_qp,
    _: *mut sys::ibv_recv_wr,
    _: *mut *mut sys::ibv_recv_wr,
) -> std::os::raw::c_int {
    libc::EOPNOTSUPP
}

impl QueuePair {
    /// Creates a queue pair in RESET. The provider may round the caps up;
    /// [`caps`](Self::caps) reports what was granted.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        qp_type: QpType,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Self> {
        // SAFETY: plain C data, zero is valid.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = send_cq.as_raw();
        init.recv_cq = recv_cq.as_raw();
        init.qp_type = match qp_type {
            QpType::Rc => sys::ibv_qp_type::IBV_QPT_RC,
            QpType::Ud => sys::ibv_qp_type::IBV_QPT_UD,
        };
        init.sq_sig_all = 0;
        init.cap.max_send_wr = caps.max_send_wr;
        init.cap.max_recv_wr = caps.max_recv_wr;
        init.cap.max_send_sge = caps.max_send_sge;
        init.cap.max_recv_sge = caps.max_recv_sge;
        init.cap.max_inline_data = caps.max_inline_data;
        // SAFETY: valid PD and CQs (kept alive by the Arcs we store).
        let qp = unsafe { sys::ibv_create_qp(pd.as_raw(), &mut init) };
        let qp = NonNull::new(qp).ok_or_else(|| VerbsError::CreateQp {
            qp_type,
            source: last_err(),
        })?;
        // SAFETY: a QP made by ibv_create_qp points at its live context;
        // the ops table is the provider's, filled when the device was
        // opened and not changed after.
        let ops = unsafe { &(*qp.as_ref().context).ops };
        let post_send_fn = ops.post_send.unwrap_or(no_post_send);
        let post_recv_fn = ops.post_recv.unwrap_or(no_post_recv);
        let granted = QpCaps {
            max_send_wr: init.cap.max_send_wr,
            max_recv_wr: init.cap.max_recv_wr,
            max_send_sge: init.cap.max_send_sge,
            max_recv_sge: init.cap.max_recv_sge,
            max_inline_data: init.cap.max_inline_data,
        };
        Ok(Self {
            qp,
            post_send_fn,
            post_recv_fn,
            qp_type,
            caps: granted,
            pd: pd.clone(),
            send_cq: send_cq.clone(),
            recv_cq: recv_cq.clone(),
        })
    }

    /// QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: valid QP; qp_num is immutable.
        unsafe { self.qp.as_ref().qp_num }
    }
    /// RC or UD.
    pub fn qp_type(&self) -> QpType {
        self.qp_type
    }
    /// Granted capacities.
    pub fn caps(&self) -> QpCaps {
        self.caps
    }
    /// The PD.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }
    /// The send CQ.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }
    /// The receive CQ.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }
    /// The raw QP.
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.qp.as_ptr()
    }

    /// `ibv_post_send` through the function read at creation.
    ///
    /// # Safety
    /// As `ibv_post_send`: `wr` heads a valid chain of requests whose
    /// memory stays valid as [`post_send`](Self::post_send) documents.
    #[inline(always)]
    unsafe fn raw_post_send(
        &self,
        wr: *mut sys::ibv_send_wr,
        bad: *mut *mut sys::ibv_send_wr,
    ) -> std::os::raw::c_int {
        // SAFETY: the provider's own function for this QP's context, called
        // as ibv_post_send would; the requests are the caller's obligation.
        unsafe { (self.post_send_fn)(self.qp.as_ptr(), wr, bad) }
    }

    /// `ibv_post_recv` through the function read at creation.
    ///
    /// # Safety
    /// As `ibv_post_recv`: `wr` heads a valid chain of receive requests
    /// whose buffers stay valid until their completions are polled.
    #[inline(always)]
    unsafe fn raw_post_recv(
        &self,
        wr: *mut sys::ibv_recv_wr,
        bad: *mut *mut sys::ibv_recv_wr,
    ) -> std::os::raw::c_int {
        // SAFETY: as raw_post_send.
        unsafe { (self.post_recv_fn)(self.qp.as_ptr(), wr, bad) }
    }

    /// Current state as the device sees it (a QP whose retries ran out
    /// reports [`QpState::Error`]).
    pub fn state(&self) -> Result<QpState> {
        let attr = self.query(sys::ibv_qp_attr_mask::IBV_QP_STATE)?;
        Ok(QpState::from_raw(attr.qp_state))
    }

    /// The source GID index of the QP's address vector: the GID table entry
    /// an RC QP past RTR sends from (`ah_attr.grh.sgid_index`).
    pub fn source_gid_index(&self) -> Result<u8> {
        let attr = self.query(sys::ibv_qp_attr_mask::IBV_QP_AV)?;
        Ok(attr.ah_attr.grh.sgid_index)
    }

    /// What the device holds for this queue pair (`ibv_query_qp`): the transport settings
    /// a configuration's `[rdma]` table asks for, read back (tests, operators).
    pub fn attributes(&self) -> Result<QpAttributes> {
        use sys::ibv_qp_attr_mask as M;
        let attr = self.query(
            M::IBV_QP_STATE
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_AV
                | M::IBV_QP_CAP,
        )?;
        Ok(QpAttributes {
            state: QpState::from_raw(attr.qp_state),
            path_mtu: 128 << attr.path_mtu,
            timeout: attr.timeout,
            retry_count: attr.retry_cnt,
            rnr_retry: attr.rnr_retry,
            traffic_class: attr.ah_attr.grh.traffic_class,
            service_level: attr.ah_attr.sl,
            max_inline: attr.cap.max_inline_data,
        })
    }

    /// `ibv_query_qp` of the attributes in `mask`.
    fn query(&self, mask: sys::ibv_qp_attr_mask) -> Result<sys::ibv_qp_attr> {
        // SAFETY: plain C data.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: plain C data.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out pointers.
        let rc =
            unsafe { sys::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask.0 as i32, &mut init) };
        if rc != 0 {
            return Err(VerbsError::QueryQp {
                qpn: self.qpn(),
                source: errno(rc),
            });
        }
        Ok(attr)
    }

    pub(crate) fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, to: QpState) -> Result<()> {
        // SAFETY: valid QP; attr is fully initialised for the bits in mask.
        let rc = unsafe { sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask as i32) };
        if rc != 0 {
            return Err(VerbsError::ModifyQp {
                qpn: self.qpn(),
                to,
                source: errno(rc),
            });
        }
        Ok(())
    }

    /// RESET → INIT for RC, granting the peer `remote` access on this QP.
    pub fn init_rc(&self, port: u8, remote: Access) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = remote_access_bits(remote);
        self.modify(
            &mut a,
            (M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS).0,
            QpState::Init,
        )
    }

    /// INIT → RTR for RC towards `peer` (RoCE v2: always global routing
    /// through the local GID index of `local`). For connecting without
    /// rdma_cm, after exchanging QPN, PSN and GID out of band.
    pub fn rtr_rc(&self, peer: &RcPeer, local: &LocalPath, opts: &RcOptions) -> Result<()> {
        let (dest_qpn, rq_psn, dgid) = (peer.qpn, peer.psn, peer.gid);
        let (sgid_index, port, active_mtu) = (local.sgid_index, local.port, local.active_mtu);
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = opts.path_mtu.unwrap_or(Mtu::from_bytes(active_mtu)).raw();
        a.dest_qp_num = dest_qpn;
        a.rq_psn = rq_psn;
        a.max_dest_rd_atomic = opts.max_rd_atomic;
        a.min_rnr_timer = opts.min_rnr_timer;
        a.ah_attr = AhAttr {
            dgid,
            sgid_index,
            port,
            hop_limit: 64,
        }
        .to_sys();
        a.ah_attr.grh.traffic_class = opts.traffic_class;
        a.ah_attr.sl = opts.service_level;
        self.modify(
            &mut a,
            (M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER)
                .0,
            QpState::Rtr,
        )
    }

    /// RTR → RTS for RC.
    pub fn rts_rc(&self, sq_psn: u32, opts: &RcOptions) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        a.timeout = opts.timeout;
        a.retry_cnt = opts.retry_count;
        a.rnr_retry = opts.rnr_retry;
        a.max_rd_atomic = opts.max_rd_atomic;
        self.modify(
            &mut a,
            (M::IBV_QP_STATE
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            QpState::Rts,
        )
    }

    /// RESET → INIT → RTR → RTS for UD with `qkey`.
    pub fn activate_ud(&self, port: u8, qkey: u32, sq_psn: u32) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qkey = qkey;
        self.modify(
            &mut a,
            (M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_QKEY).0,
            QpState::Init,
        )?;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        self.modify(&mut a, M::IBV_QP_STATE.0, QpState::Rtr)?;
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.sq_psn = sq_psn;
        self.modify(&mut a, (M::IBV_QP_STATE | M::IBV_QP_SQ_PSN).0, QpState::Rts)
    }

    /// Forces the QP into the error state (flushes outstanding WRs).
    pub fn set_error(&self) -> Result<()> {
        // SAFETY: plain C data.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        self.modify(
            &mut a,
            sys::ibv_qp_attr_mask::IBV_QP_STATE.0,
            QpState::Error,
        )
    }

    /// Posts a batch of send work requests with one doorbell, chaining them
    /// in place (no allocation). On error, the requests before
    /// [`VerbsError::PostSend::index`] were posted.
    ///
    /// # Safety
    /// Every non-inline scatter/gather entry's memory must stay registered
    /// and allocated, and must not be written by the caller, until the
    /// request's completion is polled (or a later signaled request of the
    /// same QP completes, or the QP is destroyed). For RDMA READ the local
    /// memory is written by the device until then.
    pub unsafe fn post_send(&self, wrs: &mut [SendWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let n = wrs.len();
        let base = wrs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: i and i+1 are within the slice (or next is NULL).
            unsafe {
                (*base.add(i)).wr.next = if i + 1 < n {
                    base.add(i + 1).cast()
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain points into `wrs`, alive for the call; SGE memory
        // validity is the caller's obligation (see # Safety).
        let rc = unsafe { self.raw_post_send(base.cast(), &mut bad) };
        if rc != 0 {
            let index = if bad.is_null() {
                0
            } else {
                (bad as usize - base as usize) / std::mem::size_of::<SendWr<'_>>()
            };
            return Err(VerbsError::PostSend {
                index,
                wr_id: wrs.get(index).map_or(0, |w| w.wr.wr_id),
                source: errno(rc),
            });
        }
        Ok(())
    }

    /// Posts send requests whose data is all inline (copied at post time),
    /// which is safe: nothing refers to our memory after the call.
    pub fn post_send_inline(&self, wrs: &mut [SendWr<'_>]) -> Result<()> {
        for w in wrs.iter() {
            let total: usize = w.sges().iter().map(|s| s.length as usize).sum();
            if w.wr.send_flags & sys::ibv_send_flags::IBV_SEND_INLINE.0 == 0
                || w.wr.opcode == sys::ibv_wr_opcode::IBV_WR_RDMA_READ
                || total > self.caps.max_inline_data as usize
            {
                return Err(VerbsError::InlineTooLarge {
                    len: total,
                    max: self.caps.max_inline_data,
                });
            }
        }
        // SAFETY: every request is inline and not a READ: the device copies
        // the data during the call and keeps no reference to our memory.
        unsafe { self.post_send(wrs) }
    }

    /// Posts a batch of receive work requests with one doorbell.
    ///
    /// # Safety
    /// Every entry's memory must stay registered, allocated and unread by the
    /// caller until its completion is polled (or the QP is destroyed): the
    /// device writes into it.
    pub unsafe fn post_recv(&self, wrs: &mut [RecvWr<'_>]) -> Result<()> {
        if wrs.is_empty() {
            return Ok(());
        }
        let n = wrs.len();
        let base = wrs.as_mut_ptr();
        for i in 0..n {
            // SAFETY: in bounds, as in post_send.
            unsafe {
                (*base.add(i)).wr.next = if i + 1 < n {
                    base.add(i + 1).cast()
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: chain points into `wrs`; memory validity is the caller's.
        let rc = unsafe { self.raw_post_recv(base.cast(), &mut bad) };
        if rc != 0 {
            let index = if bad.is_null() {
                0
            } else {
                (bad as usize - base as usize) / std::mem::size_of::<RecvWr<'_>>()
            };
            return Err(VerbsError::PostRecv {
                index,
                source: errno(rc),
            });
        }
        Ok(())
    }

    /// Attaches this UD QP to a multicast group (receive side).
    pub fn attach_mcast(&self, gid: Gid, lid: u16) -> Result<()> {
        let g = gid.to_sys();
        // SAFETY: valid QP, gid copied by the call.
        let rc = unsafe { sys::ibv_attach_mcast(self.qp.as_ptr(), &g, lid) };
        if rc != 0 {
            return Err(VerbsError::AttachMcast(errno(rc)));
        }
        Ok(())
    }

    /// Detaches from a multicast group.
    pub fn detach_mcast(&self, gid: Gid, lid: u16) -> Result<()> {
        let g = gid.to_sys();
        // SAFETY: valid QP, gid copied by the call.
        let rc = unsafe { sys::ibv_detach_mcast(self.qp.as_ptr(), &g, lid) };
        if rc != 0 {
            return Err(VerbsError::AttachMcast(errno(rc)));
        }
        Ok(())
    }
}

fn remote_access_bits(a: Access) -> u32 {
    let mut bits = 0;
    if a.contains(Access::REMOTE_WRITE) {
        bits |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        bits |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    bits
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: destroyed once; CQs and PD outlive it through our Arcs.
        let rc = unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
        if rc != 0 {
            // The QP (and what it holds: its CQs, the provider's memory) stays
            // until the process ends; e.g. EBUSY while attached to a group.
            tracing::warn!(qpn = self.qpn(), error = %std::io::Error::from_raw_os_error(rc), "ibv_destroy_qp failed: the queue pair is leaked");
        }
    }
}

/// A scatter/gather entry: bytes of a registered region, or (for inline
/// sends) any bytes. Laid out exactly as `ibv_sge`.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Sge<'a>(sys::ibv_sge, PhantomData<&'a [u8]>);

impl fmt::Debug for Sge<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Sge({:#x}+{}, lkey {:#x})",
            self.0.addr, self.0.length, self.0.lkey
        )
    }
}

impl<'a> Sge<'a> {
    /// `len` bytes at `offset` of `mr`, bounds-checked.
    pub fn new(mr: &'a MemoryRegion, offset: usize, len: usize) -> Result<Self> {
        if offset.checked_add(len).is_none_or(|e| e > mr.len()) || len > u32::MAX as usize {
            return Err(VerbsError::SgeOutOfBounds {
                offset,
                len,
                region_len: mr.len(),
            });
        }
        Ok(Sge(
            sys::ibv_sge {
                addr: mr.addr() + offset as u64,
                length: len as u32,
                lkey: mr.lkey(),
            },
            PhantomData,
        ))
    }
    /// Arbitrary bytes for an inline send (the lkey is not used).
    pub fn inline(data: &'a [u8]) -> Self {
        Sge(
            sys::ibv_sge {
                addr: data.as_ptr() as u64,
                length: data.len() as u32,
                lkey: 0,
            },
            PhantomData,
        )
    }
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.0.length
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.length == 0
    }
}

/// A send work request, laid out exactly as `ibv_send_wr` (so a slice of
/// them can be chained in place and posted with one doorbell).
#[repr(transparent)]
pub struct SendWr<'a> {
    wr: sys::ibv_send_wr,
    _sges: PhantomData<&'a [Sge<'a>]>,
}

impl fmt::Debug for SendWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendWr")
            .field("wr_id", &self.wr.wr_id)
            .field("opcode", &self.wr.opcode)
            .field("flags", &self.wr.send_flags)
            .finish()
    }
}

impl<'a> SendWr<'a> {
    fn base(wr_id: u64, sges: &'a [Sge<'a>], opcode: sys::ibv_wr_opcode::Type) -> Self {
        // SAFETY: plain C data; zero is valid.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = sges.as_ptr() as *mut sys::ibv_sge;
        wr.num_sge = sges.len() as i32;
        wr.opcode = opcode;
        Self {
            wr,
            _sges: PhantomData,
        }
    }
    /// SEND.
    pub fn send(wr_id: u64, sges: &'a [Sge<'a>]) -> Self {
        Self::base(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND)
    }
    /// SEND with immediate data.
    pub fn send_with_imm(wr_id: u64, sges: &'a [Sge<'a>], imm: u32) -> Self {
        let mut w = Self::base(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM);
        w.wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        w
    }
    /// RDMA WRITE to `remote_addr` under `rkey`.
    pub fn write(wr_id: u64, sges: &'a [Sge<'a>], remote_addr: u64, rkey: u32) -> Self {
        let mut w = Self::base(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE);
        w.wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
        w
    }
    /// RDMA WRITE with immediate (consumes a receive at the peer).
    pub fn write_with_imm(
        wr_id: u64,
        sges: &'a [Sge<'a>],
        remote_addr: u64,
        rkey: u32,
        imm: u32,
    ) -> Self {
        let mut w = Self::base(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM);
        w.wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
        w.wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        w
    }
    /// RDMA READ from `remote_addr` into the entries.
    pub fn read(wr_id: u64, sges: &'a [Sge<'a>], remote_addr: u64, rkey: u32) -> Self {
        let mut w = Self::base(wr_id, sges, sys::ibv_wr_opcode::IBV_WR_RDMA_READ);
        w.wr.wr.rdma = sys::rdma_t { remote_addr, rkey };
        w
    }
    /// Addresses a UD send.
    pub fn ud(mut self, ah: &'a AddressHandle, remote_qpn: u32, remote_qkey: u32) -> Self {
        self.wr.wr.ud = sys::ud_t {
            ah: ah.as_raw(),
            remote_qpn,
            remote_qkey,
        };
        self
    }
    /// Asks for a completion (selective signaling: unsignaled by default).
    pub fn signaled(mut self) -> Self {
        self.wr.send_flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }
    /// Copies the data into the WQE at post time.
    pub fn inline(mut self) -> Self {
        self.wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }
    /// Fence: waits for earlier RDMA READs of this QP before executing.
    pub fn fenced(mut self) -> Self {
        self.wr.send_flags |= sys::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }
    /// The wr_id.
    pub fn wr_id(&self) -> u64 {
        self.wr.wr_id
    }
    /// Replaces the wr_id (e.g. with a running count just before posting).
    pub fn set_wr_id(&mut self, wr_id: u64) {
        self.wr.wr_id = wr_id;
    }
    /// Asks for a completion on a request already built.
    pub fn set_signaled(&mut self) {
        self.wr.send_flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }
    fn sges(&self) -> &[sys::ibv_sge] {
        if self.wr.num_sge <= 0 {
            return &[];
        }
        // SAFETY: sg_list/num_sge come from a `&'a [Sge]` that outlives self.
        unsafe { std::slice::from_raw_parts(self.wr.sg_list, self.wr.num_sge as usize) }
    }
}

/// A receive work request, laid out exactly as `ibv_recv_wr`.
#[repr(transparent)]
pub struct RecvWr<'a> {
    wr: sys::ibv_recv_wr,
    _sges: PhantomData<&'a [Sge<'a>]>,
}

impl fmt::Debug for RecvWr<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvWr")
            .field("wr_id", &self.wr.wr_id)
            .finish()
    }
}

impl<'a> RecvWr<'a> {
    /// A receive into `sges`.
    pub fn new(wr_id: u64, sges: &'a [Sge<'a>]) -> Self {
        // SAFETY: plain C data.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = sges.as_ptr() as *mut sys::ibv_sge;
        wr.num_sge = sges.len() as i32;
        Self {
            wr,
            _sges: PhantomData,
        }
    }
}

/// Where to send: a destination GID reached through a local GID index.
#[derive(Debug, Clone, Copy)]
pub struct AhAttr {
    /// Destination GID.
    pub dgid: Gid,
    /// Local GID index (1 on soft-RoCE: the IPv4-mapped one).
    pub sgid_index: u8,
    /// Port.
    pub port: u8,
    /// IP TTL.
    pub hop_limit: u8,
}

impl AhAttr {
    pub(crate) fn to_sys(self) -> sys::ibv_ah_attr {
        // SAFETY: plain C data.
        let mut a: sys::ibv_ah_attr = unsafe { std::mem::zeroed() };
        a.is_global = 1;
        a.port_num = self.port;
        a.grh.dgid = self.dgid.to_sys();
        a.grh.sgid_index = self.sgid_index;
        a.grh.hop_limit = self.hop_limit;
        a
    }
}

/// An address handle for UD sends.
pub struct AddressHandle {
    ah: NonNull<sys::ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: an AH is an inert handle used read-only by post_send.
unsafe impl Send for AddressHandle {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle {}

impl fmt::Debug for AddressHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressHandle").finish_non_exhaustive()
    }
}

impl AddressHandle {
    /// Creates an AH towards `attr.dgid`.
    pub fn new(pd: &Arc<ProtectionDomain>, attr: AhAttr) -> Result<Self> {
        Self::from_sys(pd, attr.to_sys())
    }
    pub(crate) fn from_sys(pd: &Arc<ProtectionDomain>, mut attr: sys::ibv_ah_attr) -> Result<Self> {
        // SAFETY: valid PD; attr copied by the call.
        let ah = unsafe { sys::ibv_create_ah(pd.as_raw(), &mut attr) };
        let ah = NonNull::new(ah).ok_or_else(|| VerbsError::CreateAh(last_err()))?;
        Ok(Self {
            ah,
            _pd: pd.clone(),
        })
    }
    /// The raw AH.
    pub fn as_raw(&self) -> *mut sys::ibv_ah {
        self.ah.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: destroyed once; WRs referencing it borrow self, so none is
        // being built; posted UD sends copied the AV at post time in rxe and
        // mlx5 (and the caller's post_send contract covers the rest).
        unsafe { sys::ibv_destroy_ah(self.ah.as_ptr()) };
    }
}

/// Flags of one post of a [`PreparedWrite`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WriteFlags {
    /// Copy the data into the work queue entry at post time.
    pub inline: bool,
    /// Ask for a completion of the last request posted (the write, or the
    /// chained mark after it).
    pub signaled: bool,
}

/// The C side of a [`PreparedWrite`]: two requests and their entries, at
/// a heap address that never changes (the requests point at the entries
/// and the first at the second).
struct PreparedInner {
    wr: [sys::ibv_send_wr; 2],
    sge: [sys::ibv_sge; 2],
    /// The chained request's one inline byte.
    mark: [u8; 8],
}

/// An RDMA WRITE built once and posted many times: each post patches only
/// the local range, the remote address, the flags and the `wr_id`, and
/// calls the provider's post directly (no zeroed request, no chain walk).
/// Optionally a one-byte inline WRITE to a fixed remote address is chained
/// after it on the same doorbell (RC executes it after the first: a
/// "something arrived" mark).
///
/// The local range must lie in the region whose `lkey` the request was
/// built with; that is the caller's obligation ([`post`](Self::post) is
/// unsafe), which is why only the ring's staging module uses it.
pub struct PreparedWrite {
    inner: Box<PreparedInner>,
    chained: bool,
    /// The data WRITE's own signal flag: `IBV_SEND_SIGNALED` when it is the
    /// last request, 0 when the mark follows it (and is signaled instead).
    data_signal: u32,
}

impl fmt::Debug for PreparedWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedWrite")
            .field("chained", &self.chained)
            .finish()
    }
}

// SAFETY: the raw pointers inside only point into the same heap block,
// which moves with the value; nothing is shared with another thread.
unsafe impl Send for PreparedWrite {}

impl PreparedWrite {
    /// An RDMA WRITE from memory under `lkey` to memory under `rkey`, with,
    /// when `mark` is `(addr, rkey)`, a one-byte inline WRITE of `1` to
    /// that address chained after it.
    pub fn new(lkey: u32, rkey: u32, mark: Option<(u64, u32)>) -> Self {
        // SAFETY: plain C data; zero is valid for every field.
        let mut inner: Box<PreparedInner> = Box::new(unsafe { std::mem::zeroed() });
        inner.mark[0] = 1;
        let mark_addr = inner.mark.as_ptr() as u64;
        let p = &mut *inner;
        let sge0: *mut sys::ibv_sge = &mut p.sge[0];
        let sge1: *mut sys::ibv_sge = &mut p.sge[1];
        let wr1: *mut sys::ibv_send_wr = &mut p.wr[1];
        p.sge[0].lkey = lkey;
        p.wr[0].sg_list = sge0;
        p.wr[0].num_sge = 1;
        p.wr[0].opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        p.wr[0].wr.rdma = sys::rdma_t {
            remote_addr: 0,
            rkey,
        };
        if let Some((addr, mrkey)) = mark {
            p.sge[1] = sys::ibv_sge {
                addr: mark_addr,
                length: 1,
                lkey: 0,
            };
            p.wr[1].sg_list = sge1;
            p.wr[1].num_sge = 1;
            p.wr[1].opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            p.wr[1].send_flags = sys::ibv_send_flags::IBV_SEND_INLINE.0;
            p.wr[1].wr.rdma = sys::rdma_t {
                remote_addr: addr,
                rkey: mrkey,
            };
            p.wr[0].next = wr1;
        }
        Self {
            inner,
            chained: mark.is_some(),
            data_signal: if mark.is_some() {
                0
            } else {
                sys::ibv_send_flags::IBV_SEND_SIGNALED.0
            },
        }
    }

    /// How many requests one post puts on the send queue (1 or 2).
    #[inline]
    pub fn requests(&self) -> u64 {
        1 + self.chained as u64
    }

    /// Posts the WRITE of `len` bytes at `local_addr` to `remote_addr`
    /// (and the chained mark), the last request carrying `wr_id` and, if
    /// `flags.signaled`, asking for a completion.
    ///
    /// # Safety
    /// As [`QueuePair::post_send`]: `local_addr..+len` lies in the region
    /// of the `lkey` given to [`new`](Self::new), which stays registered,
    /// allocated and unwritten until the write has executed (unless
    /// `flags.inline`); and `qp` is an RC queue pair of the same
    /// protection domain.
    #[inline]
    pub unsafe fn post(
        &mut self,
        qp: &QueuePair,
        local_addr: u64,
        len: u32,
        remote_addr: u64,
        flags: WriteFlags,
        wr_id: u64,
    ) -> Result<()> {
        let p = &mut *self.inner;
        p.sge[0].addr = local_addr;
        p.sge[0].length = len;
        p.wr[0].wr.rdma.remote_addr = remote_addr;
        let signaled = if flags.signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        let inline = if flags.inline {
            sys::ibv_send_flags::IBV_SEND_INLINE.0
        } else {
            0
        };
        // Both requests' flags and ids are written whether the mark is
        // chained or not (unchained, the second is never posted): no branch
        // on what the connection's set-up decided. Only the last request
        // can be signaled; an unsignaled one never completes successfully,
        // so its `wr_id` is never read.
        p.wr[0].send_flags = inline | (signaled & self.data_signal);
        p.wr[1].send_flags = sys::ibv_send_flags::IBV_SEND_INLINE.0 | signaled;
        p.wr[0].wr_id = wr_id;
        p.wr[1].wr_id = wr_id;
        let first: *mut sys::ibv_send_wr = &mut p.wr[0];
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain (set up in `new`) points into `self.inner`, alive
        // for the call; the data's validity is the caller's obligation.
        let rc = unsafe { qp.raw_post_send(first, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::PostSend {
                index: (!bad.is_null() && bad != first) as usize,
                wr_id,
                source: errno(rc),
            });
        }
        Ok(())
    }
}

/// Most destinations a [`PreparedUdSend`] holds (lines A and B).
pub const PREPARED_UD_DESTS: usize = 2;

/// One destination of a [`PreparedUdSend`]: the address handle is shared,
/// so the prepared requests that point at it keep it alive.
#[derive(Debug, Clone)]
pub struct UdDest {
    /// Address handle (of the queue pair's protection domain).
    pub ah: Arc<AddressHandle>,
    /// Remote QPN (0xFFFFFF for a multicast group).
    pub qpn: u32,
    /// Remote QKey.
    pub qkey: u32,
}

/// The C side of a [`PreparedUdSend`]: one request per destination, all
/// pointing at the same entry, at a heap address that never changes.
struct PreparedUdInner {
    wr: [sys::ibv_send_wr; PREPARED_UD_DESTS],
    sge: sys::ibv_sge,
}

/// An inline UD SEND to a fixed set of destinations (e.g. a channel's
/// lines), built once and posted many times: each post writes only the
/// data's address and length, the `wr_id` and the flags, and calls the
/// provider's post directly (no zeroed requests, no chain walk, no check
/// loop). Destinations can be switched off and on again
/// ([`set_enabled`](Self::set_enabled)): that re-links the chain once, not
/// per post.
///
/// Every post is inline (the provider copies the data during the call), the
/// address handles are owned (`Arc`) and of the queue pair's protection
/// domain (checked when built and at each post), so posting is safe.
pub struct PreparedUdSend {
    inner: Box<PreparedUdInner>,
    dests: arrayvec::ArrayVec<UdDest, PREPARED_UD_DESTS>,
    pd: Arc<ProtectionDomain>,
    enabled: [bool; PREPARED_UD_DESTS],
    /// The first enabled request (None: no destination enabled).
    first: Option<usize>,
    /// Per request: `IBV_SEND_SIGNALED` for the last enabled one, else 0
    /// (only the last request of a post asks for a completion).
    signal_mask: [u32; PREPARED_UD_DESTS],
}

impl fmt::Debug for PreparedUdSend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedUdSend")
            .field("dests", &self.dests.len())
            .field("enabled", &self.enabled)
            .finish()
    }
}

// SAFETY: the raw pointers inside point into the same heap block (which
// moves with the value) or at address handles the value owns through `Arc`
// (address handles are Send and Sync); nothing is shared with another
// thread.
unsafe impl Send for PreparedUdSend {}

impl PreparedUdSend {
    /// Requests to each of `dests` (at most [`PREPARED_UD_DESTS`], every
    /// one enabled) from a queue pair of protection domain `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, dests: &[UdDest]) -> Result<Self> {
        if dests.len() > PREPARED_UD_DESTS {
            return Err(VerbsError::PreparedUdSend("too many destinations"));
        }
        if dests.iter().any(|d| !Arc::ptr_eq(&d.ah._pd, pd)) {
            return Err(VerbsError::PreparedUdSend(
                "address handle of another protection domain",
            ));
        }
        // SAFETY: plain C data; zero is valid for every field.
        let mut inner: Box<PreparedUdInner> = Box::new(unsafe { std::mem::zeroed() });
        let p = &mut *inner;
        let sge: *mut sys::ibv_sge = &mut p.sge;
        for (wr, d) in p.wr.iter_mut().zip(dests) {
            wr.sg_list = sge;
            wr.num_sge = 1;
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND;
            wr.send_flags = sys::ibv_send_flags::IBV_SEND_INLINE.0;
            wr.wr.ud = sys::ud_t {
                ah: d.ah.as_raw(),
                remote_qpn: d.qpn,
                remote_qkey: d.qkey,
            };
        }
        let mut s = Self {
            inner,
            dests: dests.iter().cloned().collect(),
            pd: pd.clone(),
            enabled: [false; PREPARED_UD_DESTS],
            first: None,
            signal_mask: [0; PREPARED_UD_DESTS],
        };
        for i in 0..dests.len() {
            s.enabled[i] = true;
        }
        s.link();
        Ok(s)
    }

    /// Destinations held (enabled or not).
    pub fn dests(&self) -> usize {
        self.dests.len()
    }

    /// Whether no destination is enabled (a post would send nothing).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// Enables or disables destination `index` (ignored if out of range).
    pub fn set_enabled(&mut self, index: usize, enabled: bool) {
        if index < self.dests.len() {
            self.enabled[index] = enabled;
            self.link();
        }
    }

    /// Chains the enabled requests in order (see [`ud_chain`]); the last
    /// one gets the signal bit (per post) and a NULL `next`.
    fn link(&mut self) {
        let plan = ud_chain(&self.enabled[..self.dests.len()]);
        let p = &mut *self.inner;
        let base = p.wr.as_mut_ptr();
        self.signal_mask = [0; PREPARED_UD_DESTS];
        for (i, next) in plan.next.iter().enumerate() {
            p.wr[i].next = match *next {
                // In bounds: `ud_chain` returns indices below its input's
                // length, which is at most PREPARED_UD_DESTS.
                Some(j) => base.wrapping_add(j),
                None => std::ptr::null_mut(),
            };
        }
        if let Some(last) = plan.last {
            self.signal_mask[last] = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        self.first = plan.first;
    }

    /// Posts `data` inline to every enabled destination with one doorbell,
    /// each request carrying `wr_id`; if `signaled`, the last one asks for
    /// a completion. Sends nothing if no destination is enabled.
    #[inline]
    pub fn post(&mut self, qp: &QueuePair, data: &[u8], wr_id: u64, signaled: bool) -> Result<()> {
        let Some(first) = self.first else {
            return Ok(());
        };
        if data.len() > qp.caps.max_inline_data as usize {
            return Err(VerbsError::InlineTooLarge {
                len: data.len(),
                max: qp.caps.max_inline_data,
            });
        }
        if !Arc::ptr_eq(&self.pd, &qp.pd) {
            return Err(VerbsError::PreparedUdSend(
                "posted to a queue pair of another protection domain",
            ));
        }
        let p = &mut *self.inner;
        p.sge.addr = data.as_ptr() as u64;
        p.sge.length = data.len() as u32;
        let signal = if signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        // Both requests' flags and ids are written whether enabled or not
        // (a disabled one is not in the chain): no branch on the set-up.
        for (wr, mask) in p.wr.iter_mut().zip(self.signal_mask) {
            wr.send_flags = sys::ibv_send_flags::IBV_SEND_INLINE.0 | (signal & mask);
            wr.wr_id = wr_id;
        }
        let head: *mut sys::ibv_send_wr = &mut p.wr[first % PREPARED_UD_DESTS];
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: the chain (linked in `link`) points into `self.inner`,
        // alive for the call; every request is an inline SEND (the
        // provider copies `data` during the call and keeps no reference to
        // it) of at most the QP's inline size; the address handles are
        // owned through `self.dests` and of the QP's protection domain.
        let rc = unsafe { qp.raw_post_send(head, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::PostSend {
                index: (!bad.is_null() && bad != head) as usize,
                wr_id,
                source: errno(rc),
            });
        }
        Ok(())
    }
}

/// How the requests of a [`PreparedUdSend`] are chained: the enabled ones
/// in order, from `first` through `next` to `last` (whose `next` is None).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UdChain {
    first: Option<usize>,
    last: Option<usize>,
    next: [Option<usize>; PREPARED_UD_DESTS],
}

/// The chain of the enabled destinations (`enabled` holds at most
/// [`PREPARED_UD_DESTS`] flags; more are ignored).
fn ud_chain(enabled: &[bool]) -> UdChain {
    let mut c = UdChain {
        first: None,
        last: None,
        next: [None; PREPARED_UD_DESTS],
    };
    for (i, _) in enabled
        .iter()
        .take(PREPARED_UD_DESTS)
        .enumerate()
        .filter(|(_, &on)| on)
    {
        match c.last {
            Some(prev) => c.next[prev] = Some(i),
            None => c.first = Some(i),
        }
        c.last = Some(i);
    }
    c
}

/// A receive request per slot of a region cut into equal slots, built once
/// (`wr_id` = slot index, one entry covering the slot), so that reposting
/// slots only links their requests and rings the doorbell: nothing is
/// zeroed or rebuilt per receive.
pub struct PreparedRecvs {
    wrs: Box<[sys::ibv_recv_wr]>,
    /// The entries the requests point at (never moved: boxed once).
    _sges: Box<[sys::ibv_sge]>,
    slot_len: usize,
    region_len: usize,
}

impl fmt::Debug for PreparedRecvs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedRecvs")
            .field("slots", &self.wrs.len())
            .field("slot_len", &self.slot_len)
            .finish()
    }
}

// SAFETY: the raw pointers inside point into the value's own heap blocks
// (which move with it) or are addresses in a region the owner keeps
// registered (`post`'s contract); nothing is shared with another thread.
unsafe impl Send for PreparedRecvs {}

impl PreparedRecvs {
    /// Requests receiving into `slots` slots of `slot_len` bytes of `mr`.
    pub fn new(mr: &MemoryRegion, slot_len: usize, slots: u32) -> Result<Self> {
        Self::over(mr.addr(), mr.lkey(), mr.len(), slot_len, slots)
    }

    /// [`new`](Self::new) from the region's address, key and length (pure
    /// data: nothing is read or written there).
    fn over(addr: u64, lkey: u32, region_len: usize, slot_len: usize, slots: u32) -> Result<Self> {
        let total = slot_len.checked_mul(slots as usize);
        if total.is_none_or(|t| t > region_len) || slot_len > u32::MAX as usize {
            return Err(VerbsError::SgeOutOfBounds {
                offset: 0,
                len: total.unwrap_or(usize::MAX),
                region_len,
            });
        }
        let mut sges: Box<[sys::ibv_sge]> = (0..slots as usize)
            .map(|i| sys::ibv_sge {
                addr: addr + (i * slot_len) as u64,
                length: slot_len as u32,
                lkey,
            })
            .collect();
        let wrs: Box<[sys::ibv_recv_wr]> = sges
            .iter_mut()
            .enumerate()
            .map(|(i, sge)| sys::ibv_recv_wr {
                wr_id: i as u64,
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: 1,
            })
            .collect();
        Ok(Self {
            wrs,
            _sges: sges,
            slot_len,
            region_len,
        })
    }

    /// Links the requests of `slots`, in order, into one chain and returns
    /// its head (NULL for none). A slot out of range is refused before
    /// anything is posted.
    fn link(&mut self, slots: &[u32]) -> Result<*mut sys::ibv_recv_wr> {
        let mut head: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        for &s in slots.iter().rev() {
            let Some(w) = self.wrs.get_mut(s as usize) else {
                return Err(VerbsError::SgeOutOfBounds {
                    offset: s as usize * self.slot_len,
                    len: self.slot_len,
                    region_len: self.region_len,
                });
            };
            w.next = head;
            head = w;
        }
        Ok(head)
    }

    /// Posts a receive into each of `slots` with one doorbell. On
    /// [`VerbsError::PostRecv`], the slots before `index` were posted.
    ///
    /// # Safety
    /// As [`QueuePair::post_recv`]: the region given to [`new`](Self::new)
    /// stays registered and allocated, and the slots unread by the caller,
    /// until their receives complete (or the QP is destroyed); no slot in
    /// `slots` is posted already, nor listed twice.
    pub unsafe fn post(&mut self, qp: &QueuePair, slots: &[u32]) -> Result<()> {
        let head = self.link(slots)?;
        if head.is_null() {
            return Ok(());
        }
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: the chain (just linked) points into `self.wrs`, alive for
        // the call; the memory's validity is the caller's obligation.
        let rc = unsafe { qp.raw_post_recv(head, &mut bad) };
        if rc != 0 {
            // `bad` is the refused request; its slot's position in `slots`
            // is how many were posted before it.
            let index = if bad.is_null() {
                0
            } else {
                let slot = (bad as usize - self.wrs.as_ptr() as usize)
                    / std::mem::size_of::<sys::ibv_recv_wr>();
                slots.iter().position(|&s| s as usize == slot).unwrap_or(0)
            };
            return Err(VerbsError::PostRecv {
                index,
                source: errno(rc),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod prepared_tests {
    use super::*;

    #[test]
    fn ud_chain_links_the_enabled_destinations_in_order() {
        let both = ud_chain(&[true, true]);
        assert_eq!(
            both,
            UdChain {
                first: Some(0),
                last: Some(1),
                next: [Some(1), None]
            }
        );
        let b_only = ud_chain(&[false, true]);
        assert_eq!((b_only.first, b_only.last), (Some(1), Some(1)));
        assert_eq!(b_only.next, [None, None]);
        let a_only = ud_chain(&[true, false]);
        assert_eq!((a_only.first, a_only.last), (Some(0), Some(0)));
        assert_eq!(a_only.next, [None, None]);
        let one = ud_chain(&[true]);
        assert_eq!((one.first, one.last), (Some(0), Some(0)));
        for none in [&[false, false][..], &[false], &[]] {
            let c = ud_chain(none);
            assert_eq!((c.first, c.last), (None, None));
        }
        // Flags beyond the requests held are ignored.
        assert_eq!(ud_chain(&[false, false, true]).first, None);
    }

    /// The requests a chain links, from its head.
    fn walk(r: &PreparedRecvs, mut w: *mut sys::ibv_recv_wr) -> Vec<(u64, u64, u32, u32)> {
        let mut out = Vec::new();
        while !w.is_null() {
            // SAFETY: `w` is the head or a `next` set by `link`, which point
            // into `r.wrs` (alive, borrowed) or are NULL.
            let wr = unsafe { &*w };
            // SAFETY: each request's sg_list points at its own entry in
            // `r._sges`, set in `over` and never changed.
            let sge = unsafe { &*wr.sg_list };
            assert_eq!(wr.num_sge, 1);
            out.push((wr.wr_id, sge.addr, sge.length, sge.lkey));
            w = wr.next;
        }
        let _ = r;
        out
    }

    #[test]
    fn prepared_recvs_link_the_given_slots_in_order() {
        let mut r = PreparedRecvs::over(0x1000, 7, 4 * 128, 128, 4).unwrap();
        let head = r.link(&[3, 0, 2]).unwrap();
        assert_eq!(
            walk(&r, head),
            vec![
                (3, 0x1000 + 3 * 128, 128, 7),
                (0, 0x1000, 128, 7),
                (2, 0x1000 + 2 * 128, 128, 7)
            ]
        );
        // Re-linking another set overwrites the old links.
        let head = r.link(&[1]).unwrap();
        assert_eq!(walk(&r, head), vec![(1, 0x1000 + 128, 128, 7)]);
        assert!(r.link(&[]).unwrap().is_null());
        // A slot out of range is refused.
        assert!(matches!(
            r.link(&[0, 4]),
            Err(VerbsError::SgeOutOfBounds { offset: 512, .. })
        ));
        // Slots that do not fit the region are refused up front.
        assert!(PreparedRecvs::over(0, 0, 4 * 128 - 1, 128, 4).is_err());
        assert!(PreparedRecvs::over(0, 0, 0, 128, 0).is_ok());
    }
}
