//! rdma_cm ids and their events: the base the other cm modules build on.

use crate::verbs::device::{Context, Gid};
use crate::verbs::error::Result;
use crate::verbs::error::{errno, last_err, VerbsError};
use crate::verbs::gid::{check_connection_index, connection_default_entry, GidTable, GidType};
use crate::verbs::memory::Access;
use crate::verbs::qp::{Mtu, QueuePair, RcOptions};
use crate::verbs::types::QpState;
use arrayvec::ArrayVec;
use rdma_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `rdma_set_option` level for id options (`<rdma/rdma_cma.h>`; the
/// bindings leave these enums out).
const RDMA_OPTION_ID: i32 = 0;
/// The id option that sets the IP type of service (one byte).
const RDMA_OPTION_ID_TOS: i32 = 0;

/// Largest private data we accept or send (the REP limit; a REQ carries at
/// most 56 bytes, which [`connect`](super::Resolved::connect) checks).
pub const MAX_PRIVATE_DATA: usize = 196;
/// Private data a connect request can carry on RoCE/IB (REQ).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;

/// Private data received with an event.
pub type PrivateData = ArrayVec<u8, MAX_PRIVATE_DATA>;

/// Most channels [`EventChannel::any_event`] polls in one call (a
/// listener and a recovery service's default 32 connections fit).
pub const ANY_EVENT_MAX: usize = 64;

/// An rdma_cm event channel.
pub struct EventChannel {
    pub(super) ch: NonNull<sys::rdma_event_channel>,
}

// SAFETY: the channel is a file descriptor wrapper; librdmacm calls on it are
// thread-safe, and we only use it from the owning id's thread.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

impl EventChannel {
    /// Creates a channel.
    pub fn new() -> Result<Arc<Self>> {
        // SAFETY: no preconditions.
        let ch = unsafe { sys::rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| VerbsError::Cm {
            op: "rdma_create_event_channel",
            source: last_err(),
        })?;
        Ok(Arc::new(Self { ch }))
    }
    /// The channel's file descriptor (readable when an event waits).
    pub fn fd(&self) -> i32 {
        // SAFETY: valid channel; fd is immutable.
        unsafe { self.ch.as_ref().fd }
    }

    /// Whether any of `channels` has an event waiting, without waiting:
    /// one `poll` system call for all of them, for a polling loop's
    /// periodic look, which usually finds nothing (a look per channel costs
    /// a call each). True, without looking, for more channels than
    /// [`ANY_EVENT_MAX`]: the caller then looks at each.
    pub fn any_event<'a>(channels: impl IntoIterator<Item = &'a EventChannel>) -> Result<bool> {
        let mut fds = ArrayVec::<libc::pollfd, ANY_EVENT_MAX>::new();
        for ch in channels {
            let pfd = libc::pollfd {
                fd: ch.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            if fds.try_push(pfd).is_err() {
                return Ok(true);
            }
        }
        loop {
            // SAFETY: `fds` holds fds.len() valid pollfds.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
            if rc >= 0 {
                return Ok(rc > 0);
            }
            let e = last_err();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(VerbsError::Cm {
                    op: "poll",
                    source: e,
                });
            }
        }
    }

    /// Waits up to `timeout` for the next event (`None` on timeout).
    pub fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        self.next_event_or_wake(timeout, None)
    }

    /// As [`next_event`](Self::next_event), and also returns `None` as soon
    /// as `wake` is readable or closed (a thread that waits here for long
    /// can then be told to stop at once: the listener thread of
    /// [`crate::orders::OrdersListener`]). `wake` is only polled, never read.
    pub fn next_event_or_wake(
        &self,
        timeout: Duration,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Option<CmEvent>> {
        use std::os::fd::AsRawFd;
        let mut pfds = [
            libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                // A negative fd is ignored by poll.
                fd: wake.map_or(-1, |w| w.as_raw_fd()),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        loop {
            // SAFETY: two valid pollfds (the second ignored when its fd is
            // -1); `wake` is borrowed for the call.
            let rc = unsafe { libc::poll(pfds.as_mut_ptr(), 2, ms) };
            if rc < 0 {
                let e = last_err();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(VerbsError::Cm {
                    op: "poll",
                    source: e,
                });
            }
            if rc == 0 || pfds[0].revents == 0 {
                // Timed out, or only `wake` is ready.
                return Ok(None);
            }
            break;
        }
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: valid channel and out pointer; an event is ready so this
        // does not block.
        let rc = unsafe { sys::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
        cm_ok(rc, "rdma_get_cm_event")?;
        Ok(Some(CmEvent {
            ev: NonNull::new(ev).expect("rdma_get_cm_event returned success with NULL"),
        }))
    }

    pub(super) fn wait_for(
        &self,
        expected: &'static str,
        want: sys::rdma_cm_event_type::Type,
        deadline: Instant,
    ) -> Result<CmEvent> {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = self.next_event(left)?.ok_or(VerbsError::CmTimeout {
            expected,
            ms: left.as_millis() as u64,
        })?;
        if ev.kind() != want {
            return Err(ev.unexpected(expected));
        }
        Ok(ev)
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc to it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// One rdma_cm event; acknowledged when dropped.
pub struct CmEvent {
    pub(super) ev: NonNull<sys::rdma_cm_event>,
}

impl fmt::Debug for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmEvent")
            .field("event", &self.name())
            .field("status", &self.status())
            .finish()
    }
}

impl CmEvent {
    pub(super) fn raw(&self) -> &sys::rdma_cm_event {
        // SAFETY: valid until acked in Drop.
        unsafe { self.ev.as_ref() }
    }
    /// The raw event type.
    pub fn kind(&self) -> sys::rdma_cm_event_type::Type {
        self.raw().event
    }
    /// The event's name (`rdma_event_str`).
    pub fn name(&self) -> String {
        // SAFETY: returns a static string for any value.
        unsafe { CStr::from_ptr(sys::rdma_event_str(self.kind())) }
            .to_string_lossy()
            .into_owned()
    }
    /// Status (negative errno, or the CM reject reason for REJECTED).
    pub fn status(&self) -> i32 {
        self.raw().status
    }
    /// Whether this is a disconnect (or the device going away).
    pub fn is_disconnect(&self) -> bool {
        use sys::rdma_cm_event_type::*;
        matches!(
            self.kind(),
            RDMA_CM_EVENT_DISCONNECTED | RDMA_CM_EVENT_DEVICE_REMOVAL | RDMA_CM_EVENT_TIMEWAIT_EXIT
        )
    }
    /// Copy of the connection private data (connect request/response).
    pub fn private_data(&self) -> PrivateData {
        let mut out = PrivateData::new();
        // SAFETY: for connection events the union holds `conn`; for others
        // private_data is NULL/len 0 in the same position (ud shares the
        // layout prefix), so reading it is sound either way.
        let conn = unsafe { self.raw().param.conn };
        if !conn.private_data.is_null() {
            let len = (conn.private_data_len as usize).min(MAX_PRIVATE_DATA);
            // SAFETY: librdmacm guarantees private_data_len readable bytes.
            let s = unsafe { std::slice::from_raw_parts(conn.private_data.cast::<u8>(), len) };
            out.try_extend_from_slice(s)
                .expect("len bounded by capacity");
        }
        out
    }
    pub(super) fn unexpected(&self, expected: &'static str) -> VerbsError {
        use sys::rdma_cm_event_type::*;
        if self.kind() == RDMA_CM_EVENT_REJECTED {
            // IB CM reject reasons: 4 timeout (a CM message went
            // unanswered through all its retries), 8 invalid service id
            // (nobody listens on that port), 28 consumer defined (the
            // listener refused; its reason is in the private data).
            let reason = match self.status() {
                4 => "the handshake timed out (CM messages lost or unanswered)".to_owned(),
                8 => "nobody listens on that port".to_owned(),
                28 if self.private_data().iter().all(|&b| b == 0) => {
                    "refused by the listener without a reason".to_owned()
                }
                28 => format!(
                    "refused by the listener: {}",
                    String::from_utf8_lossy(&self.private_data()).trim_end_matches('\0')
                ),
                s => format!("reject reason {s}"),
            };
            // SAFETY: the event's id is valid while the event is unacked.
            let peer = unsafe { peer_addr(self.raw().id) };
            return VerbsError::ConnectionRejected {
                peer,
                status: self.status(),
                reason,
                private_data: self.private_data().as_slice().into(),
            };
        }
        VerbsError::CmUnexpectedEvent {
            expected,
            got: self.name(),
            status: self.status(),
        }
    }
}

impl Drop for CmEvent {
    fn drop(&mut self) {
        // SAFETY: acked exactly once.
        unsafe { sys::rdma_ack_cm_event(self.ev.as_ptr()) };
    }
}

/// # Safety
/// `id` must be a valid rdma_cm id.
unsafe fn peer_addr(id: *mut sys::rdma_cm_id) -> String {
    if id.is_null() {
        return "?".into();
    }
    // SAFETY: the caller guarantees a valid id; the address is a sockaddr
    // union large enough for both families.
    let sa = unsafe { &(*id).route.addr.dst_addr_union.dst_storage };
    sockaddr_to_std(sa).map_or("?".into(), |a| a.to_string())
}

pub(super) fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: family says it is a sockaddr_in, which fits in storage.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(SocketAddr::from((
                u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family says sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(SocketAddr::from((
                sin6.sin6_addr.s6_addr,
                u16::from_be(sin6.sin6_port),
            )))
        }
        _ => None,
    }
}

pub(super) fn std_to_sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: plain C data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: storage is large and aligned enough for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in) };
            sin.sin_family = libc::AF_INET as u16;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from_ne_bytes(v4.ip().octets());
        }
        SocketAddr::V6(v6) => {
            // SAFETY: as above for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut _ as *mut libc::sockaddr_in6) };
            sin6.sin6_family = libc::AF_INET6 as u16;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
        }
    }
    ss
}

/// An rdma_cm id, destroyed on drop (after its events are acknowledged,
/// which [`CmEvent`]'s drop guarantees).
pub struct CmId {
    pub(super) id: NonNull<sys::rdma_cm_id>,
    pub(super) ch: Arc<EventChannel>,
}

// SAFETY: the id is used from one thread at a time through &self/&mut self;
// librdmacm calls are thread-safe.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CmId")
            .field("port", &self.port_num())
            .finish()
    }
}

impl CmId {
    pub(super) fn new(ps: sys::rdma_port_space::Type) -> Result<Self> {
        let ch = EventChannel::new()?;
        let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out pointer; no user context.
        let rc = unsafe { sys::rdma_create_id(ch.ch.as_ptr(), &mut id, std::ptr::null_mut(), ps) };
        cm_ok(rc, "rdma_create_id")?;
        Ok(Self {
            id: NonNull::new(id).expect("success with NULL id"),
            ch,
        })
    }
    /// The event channel of this id.
    pub fn channel(&self) -> &Arc<EventChannel> {
        &self.ch
    }
    /// The port the id is bound to.
    pub fn port_num(&self) -> u8 {
        // SAFETY: valid id.
        unsafe { self.id.as_ref().port_num }
    }
    /// The name of the device the id is bound to, if bound.
    pub fn device_name(&self) -> Option<String> {
        // SAFETY: valid id; verbs is NULL or a valid context.
        let verbs = unsafe { self.id.as_ref().verbs };
        if verbs.is_null() {
            return None;
        }
        // SAFETY: valid context with a valid device and name.
        Some(
            unsafe { CStr::from_ptr(sys::ibv_get_device_name((*verbs).device)) }
                .to_string_lossy()
                .into_owned(),
        )
    }
    /// The peer's address.
    pub fn peer(&self) -> String {
        // SAFETY: valid id.
        unsafe { peer_addr(self.id.as_ptr()) }
    }
    /// The source GID index rdma_cm chose for the route (after resolution).
    pub fn sgid(&self) -> Gid {
        // SAFETY: valid id; the ib addr union is plain bytes.
        Gid(unsafe { self.id.as_ref().route.addr.addr.ibaddr.sgid.raw })
    }
    pub(super) fn init_qp_attr(
        &self,
        state: sys::ibv_qp_state::Type,
    ) -> Result<(sys::ibv_qp_attr, u32)> {
        // SAFETY: plain C data.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0i32;
        // SAFETY: valid id and out pointers.
        let rc = unsafe { sys::rdma_init_qp_attr(self.id.as_ptr(), &mut attr, &mut mask) };
        cm_ok(rc, "rdma_init_qp_attr")?;
        Ok((attr, mask as u32))
    }

    /// Drives `qp` from RESET to RTS with rdma_cm's attributes and `opts`.
    pub(super) fn bring_up(&self, qp: &QueuePair, opts: &RcOptions, remote: Access) -> Result<()> {
        // The passive side's id: marks what rdma_cm sends for it from now on.
        self.set_tos(opts.traffic_class)?;
        self.to_init(qp, remote)?;
        self.to_rts(qp, opts)
    }

    /// RESET -> INIT with rdma_cm's attributes, granting `remote` access.
    pub(super) fn to_init(&self, qp: &QueuePair, remote: Access) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        let (mut a, mask) = self.init_qp_attr(sys::ibv_qp_state::IBV_QPS_INIT)?;
        a.qp_access_flags = 0;
        if remote.contains(Access::REMOTE_WRITE) {
            a.qp_access_flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if remote.contains(Access::REMOTE_READ) {
            a.qp_access_flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        qp.modify(&mut a, mask | M::IBV_QP_ACCESS_FLAGS.0, QpState::Init)
    }

    /// INIT -> RTR -> RTS with rdma_cm's attributes (which know the peer
    /// once it answered), overridden by `opts`.
    pub(super) fn to_rts(&self, qp: &QueuePair, opts: &RcOptions) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        let (mut a, mask) = self.init_qp_attr(sys::ibv_qp_state::IBV_QPS_RTR)?;
        a.ah_attr.grh.sgid_index = self.source_gid(a.ah_attr.grh.sgid_index, opts.gid_index)?;
        // Both sides mark their packets whatever rdma_cm derived (the
        // passive side's id never had the option set).
        a.ah_attr.grh.traffic_class = opts.traffic_class;
        a.ah_attr.sl = opts.service_level;
        if let Some(m) = opts.path_mtu {
            // Only ever lower the MTU below what the route supports.
            a.path_mtu = a.path_mtu.min(mtu_raw(m));
        }
        a.min_rnr_timer = opts.min_rnr_timer;
        a.max_dest_rd_atomic = opts.max_rd_atomic;
        qp.modify(
            &mut a,
            mask | (M::IBV_QP_MIN_RNR_TIMER | M::IBV_QP_MAX_DEST_RD_ATOMIC | M::IBV_QP_PATH_MTU).0,
            QpState::Rtr,
        )?;
        let (mut a, mask) = self.init_qp_attr(sys::ibv_qp_state::IBV_QPS_RTS)?;
        a.timeout = opts.timeout;
        a.retry_cnt = opts.retry_count;
        a.rnr_retry = opts.rnr_retry;
        a.max_rd_atomic = opts.max_rd_atomic;
        qp.modify(
            &mut a,
            mask | (M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_MAX_QP_RD_ATOMIC)
                .0,
            QpState::Rts,
        )
    }

    /// The source GID index for this connection: `explicit` if given
    /// (checked to be a used RoCE v2 entry: an error otherwise), else
    /// `resolved`, rdma_cm's, when it is RoCE v2, or else the RoCE v2 entry of
    /// the same address ([`connection_default_entry`]: an error if there is
    /// none). Logs the choice (index, GID, type, netdev) once per connection.
    fn source_gid(&self, resolved: u8, explicit: Option<u8>) -> Result<u8> {
        let device = self.device_name().unwrap_or_default();
        let port = self.port_num();
        let sys = Path::new("/sys");
        let Some(index) = explicit else {
            // One entry first (three small files); the whole table only when it is not v2.
            match GidTable::read_sysfs_entry(sys, &device, port, u32::from(resolved)) {
                Some(e) if e.gid_type != GidType::RoceV1 => {
                    tracing::info!(%device, port, gid = %e, peer = %self.peer(), "rdma_cm GID");
                    return Ok(resolved);
                }
                Some(_) => {}
                None => {
                    tracing::info!(%device, port, gid_index = resolved, peer = %self.peer(), "rdma_cm GID (type unknown: sysfs GID table unreadable)");
                    return Ok(resolved);
                }
            }
            let twin = connection_default_entry(
                &GidTable::read_sysfs(sys, &device, port)?,
                u32::from(resolved),
            )?;
            tracing::info!(%device, port, gid = %twin, resolved, peer = %self.peer(), "rdma_cm bound a RoCE v1 GID; the connection sends from that address's RoCE v2 entry");
            // At most 255: `connection_default_entry` takes no larger index.
            return Ok(twin.index as u8);
        };
        let choice = check_connection_index(
            &GidTable::read_sysfs(sys, &device, port)?,
            u32::from(index),
            u32::from(resolved),
        )?;
        tracing::info!(gid = %choice, resolved, peer = %self.peer(), "configured GID");
        Ok(index)
    }

    /// Sets the IP type of service (traffic class) rdma_cm uses for this
    /// id's route and connection messages (`RDMA_OPTION_ID_TOS`). On the
    /// active side it must precede `rdma_resolve_route`; on the passive side
    /// it is set on the connect request's id before the accept.
    pub(super) fn set_tos(&self, tos: u8) -> Result<()> {
        let mut v = tos;
        // SAFETY: valid id; the option value is one byte that outlives the call.
        let rc = unsafe {
            sys::rdma_set_option(
                self.id.as_ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_TOS,
                (&mut v as *mut u8).cast(),
                std::mem::size_of::<u8>(),
            )
        };
        cm_ok(rc, "rdma_set_option(RDMA_OPTION_ID_TOS)")
    }

    pub(super) fn conn_param(qp: &QueuePair, opts: &RcOptions, pd: &[u8]) -> sys::rdma_conn_param {
        // SAFETY: plain C data.
        let mut p: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        p.private_data = pd.as_ptr().cast();
        p.private_data_len = pd.len() as u8;
        p.responder_resources = opts.max_rd_atomic;
        p.initiator_depth = opts.max_rd_atomic;
        p.retry_count = opts.retry_count;
        p.rnr_retry_count = opts.rnr_retry;
        p.qp_num = qp.qpn();
        p
    }
}

fn mtu_raw(m: Mtu) -> u32 {
    match m {
        Mtu::M256 => 1,
        Mtu::M512 => 2,
        Mtu::M1024 => 3,
        Mtu::M2048 => 4,
        Mtu::M4096 => 5,
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: destroyed once; all its events were acked (CmEvent drops
        // before any CmId that could own them is dropped by our API shape).
        unsafe { sys::rdma_destroy_id(self.id.as_ptr()) };
    }
}

// Defined here rather than in `device`, which would otherwise need rdma_cm
// (and rdma_cm needs the device types): the modules stay acyclic.
impl Context {
    /// Opens the device that owns a local IP address (through rdma_cm).
    pub fn open_for_ip(addr: IpAddr) -> Result<std::sync::Arc<Context>> {
        crate::verbs::device::device_names()?;
        let name = device_for_addr(addr)?;
        Self::open(Some(&name))
    }
}

/// The name of the RDMA device that owns local address `addr`.
pub fn device_for_addr(addr: IpAddr) -> Result<String> {
    bound_port(addr).map(|(device, _)| device)
}

/// The RDMA device and port that own local address `addr`.
fn bound_port(addr: IpAddr) -> Result<(String, u8)> {
    let id = CmId::new(sys::rdma_port_space::RDMA_PS_TCP)?;
    let mut ss = std_to_sockaddr(SocketAddr::new(addr, 0));
    // SAFETY: valid id and a sockaddr of the right family.
    let rc = unsafe {
        sys::rdma_bind_addr(
            id.id.as_ptr(),
            (&mut ss as *mut libc::sockaddr_storage).cast(),
        )
    };
    if rc != 0 {
        return Err(VerbsError::NoDeviceForAddr {
            addr,
            source: last_err(),
        });
    }
    let device = id.device_name().ok_or(VerbsError::NoDeviceForAddr {
        addr,
        source: std::io::Error::from_raw_os_error(libc::ENODEV),
    })?;
    Ok((device, id.port_num()))
}

/// The GID a service bound to local address `addr` sends from: the port's
/// RoCE v2 entry holding `addr`, or entry `gid_index` when given (checked
/// to be a used RoCE v2 entry holding `addr`), with the port's active MTU.
/// For start-up logs and `rocebus stat`; reads sysfs and binds an id, no
/// traffic.
pub fn local_gid(addr: IpAddr, gid_index: Option<u8>) -> Result<crate::verbs::LocalGid> {
    let (device, port) = bound_port(addr)?;
    let policy = crate::verbs::GidPolicy {
        local_ip: Some(addr),
        gid_index: gid_index.map(u32::from),
        ..Default::default()
    };
    let table = GidTable::read_sysfs(Path::new("/sys"), &device, port)?;
    with_active_mtu(crate::verbs::select_gid(&table, &policy)?)
}

/// `choice` with its port's active MTU.
fn with_active_mtu(choice: crate::verbs::GidChoice) -> Result<crate::verbs::LocalGid> {
    let active_mtu = Context::open(Some(&choice.device))?
        .query_port(choice.port)?
        .active_mtu;
    Ok(crate::verbs::LocalGid { choice, active_mtu })
}

/// An rdma_cm call's return code as a result: nonzero is the error `errno`
/// holds, reported with the call's name.
pub(super) fn cm_ok(rc: i32, op: &'static str) -> Result<()> {
    if rc != 0 {
        return Err(VerbsError::Cm {
            op,
            source: last_err(),
        });
    }
    Ok(())
}

/// Helper for opening the context the id resolved to, checking it is the
/// one the caller uses.
pub fn check_device(ctx: &Context, id_device: Option<String>) -> Result<()> {
    match id_device {
        Some(n) if n == ctx.name() => Ok(()),
        _ => Err(VerbsError::DeviceMismatch),
    }
}

/// An established RC connection's rdma_cm side (the QP is the caller's).
#[derive(Debug)]
pub struct Connection {
    pub(super) id: CmId,
}

impl Connection {
    /// The event channel [`poll_disconnected`](Self::poll_disconnected)
    /// reads (for [`EventChannel::any_event`]).
    pub fn events(&self) -> &EventChannel {
        &self.id.ch
    }
    /// Checks, without blocking, whether the peer disconnected.
    pub fn poll_disconnected(&self) -> Result<bool> {
        while let Some(ev) = self.id.ch.next_event(Duration::ZERO)? {
            if ev.is_disconnect() {
                return Ok(true);
            }
        }
        Ok(false)
    }
    /// Waits up to `timeout` for the peer to disconnect.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.id.ch.next_event(left)? {
                Some(ev) if ev.is_disconnect() => return Ok(true),
                Some(_) => continue,
                None => return Ok(false),
            }
        }
    }
    /// The peer's address.
    pub fn peer(&self) -> String {
        self.id.peer()
    }
    /// Entry `index` of this connection's port's GID table (pass the
    /// index its QP sends from, [`QueuePair::source_gid_index`]) with the
    /// port's active MTU: what the connection really uses, whoever chose
    /// it. Any type is reported as it is (a RoCE v1 entry too); `explicit`
    /// is false. Reads sysfs, no traffic.
    pub fn local_gid(&self, index: u8) -> Result<crate::verbs::LocalGid> {
        let device = self.id.device_name().ok_or_else(|| VerbsError::Cm {
            op: "device of the connection's id",
            source: std::io::Error::from_raw_os_error(libc::ENODEV),
        })?;
        let port = self.id.port_num();
        let table = GidTable::read_sysfs(Path::new("/sys"), &device, port)?;
        let policy = crate::verbs::GidPolicy {
            gid_index: Some(u32::from(index)),
            allow_roce_v1: true,
            ..Default::default()
        };
        let mut choice = crate::verbs::select_gid(&table, &policy)?;
        choice.explicit = false;
        with_active_mtu(choice)
    }
    /// Sends a disconnect (the local QP goes to the error state).
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: valid connected id.
        let rc = unsafe { sys::rdma_disconnect(self.id.id.as_ptr()) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_disconnect",
                source: errno(rc),
            });
        }
        Ok(())
    }
}
