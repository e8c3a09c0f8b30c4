//! rdma_cm: address and route resolution, RC connection set-up with private
//! data, disconnect events, and multicast join/leave for UD on RoCE v2.
//!
//! Queue pairs are created by the caller on the device the id resolved to
//! and driven through INIT/RTR/RTS here with the attributes rdma_cm computes
//! (`rdma_init_qp_attr`), overridden by [`RcOptions`] where the user asks, so
//! every RC knob stays in our hands (rdma_cm's own QPs hide most of them).

use super::device::{Context, Gid};
use super::error::{errno, last_err, VerbsError};
use super::memory::ProtectionDomain;
use super::qp::{AddressHandle, Mtu, QpState, QueuePair, RcOptions};
use super::Result;
use arrayvec::ArrayVec;
use rdma_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Largest private data we accept or send (the REP limit; a REQ carries at
/// most 56 bytes, which [`connect`](Resolved::connect) checks).
pub const MAX_PRIVATE_DATA: usize = 196;
/// Private data a connect request can carry on RoCE/IB (REQ).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;

/// Private data received with an event.
pub type PrivateData = ArrayVec<u8, MAX_PRIVATE_DATA>;

/// An rdma_cm event channel.
pub struct EventChannel {
    ch: NonNull<sys::rdma_event_channel>,
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

    /// Waits up to `timeout` for the next event (`None` on timeout).
    pub fn next_event(&self, timeout: Duration) -> Result<Option<CmEvent>> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        loop {
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
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
            if rc == 0 {
                return Ok(None);
            }
            break;
        }
        let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: valid channel and out pointer; an event is ready so this
        // does not block.
        let rc = unsafe { sys::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_get_cm_event",
                source: last_err(),
            });
        }
        Ok(Some(CmEvent {
            ev: NonNull::new(ev).expect("rdma_get_cm_event returned success with NULL"),
        }))
    }

    fn wait_for(
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
    ev: NonNull<sys::rdma_cm_event>,
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
    fn raw(&self) -> &sys::rdma_cm_event {
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
    fn unexpected(&self, expected: &'static str) -> VerbsError {
        use sys::rdma_cm_event_type::*;
        if self.kind() == RDMA_CM_EVENT_REJECTED {
            // IB CM reject reasons: 4 timeout (a CM message went
            // unanswered through all its retries), 8 invalid service id
            // (nobody listens on that port), 28 consumer defined (the
            // listener refused; its reason is in the private data).
            let reason = match self.status() {
                4 => "the handshake timed out (CM messages lost or unanswered)".to_owned(),
                8 => "nobody listens on that port".to_owned(),
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

fn sockaddr_to_std(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
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

fn std_to_sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
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
    id: NonNull<sys::rdma_cm_id>,
    ch: Arc<EventChannel>,
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
    fn new(ps: sys::rdma_port_space::Type) -> Result<Self> {
        let ch = EventChannel::new()?;
        let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out pointer; no user context.
        let rc = unsafe { sys::rdma_create_id(ch.ch.as_ptr(), &mut id, std::ptr::null_mut(), ps) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_create_id",
                source: last_err(),
            });
        }
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
    fn init_qp_attr(&self, state: sys::ibv_qp_state::Type) -> Result<(sys::ibv_qp_attr, u32)> {
        // SAFETY: plain C data.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0i32;
        // SAFETY: valid id and out pointers.
        let rc = unsafe { sys::rdma_init_qp_attr(self.id.as_ptr(), &mut attr, &mut mask) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_init_qp_attr",
                source: last_err(),
            });
        }
        Ok((attr, mask as u32))
    }

    /// Drives `qp` from RESET to RTS with rdma_cm's attributes and `opts`.
    fn bring_up(&self, qp: &QueuePair, opts: &RcOptions, remote: super::Access) -> Result<()> {
        self.to_init(qp, remote)?;
        self.to_rts(qp, opts)
    }

    /// RESET -> INIT with rdma_cm's attributes, granting `remote` access.
    fn to_init(&self, qp: &QueuePair, remote: super::Access) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        let (mut a, mask) = self.init_qp_attr(sys::ibv_qp_state::IBV_QPS_INIT)?;
        a.qp_access_flags = 0;
        if remote.contains(super::Access::REMOTE_WRITE) {
            a.qp_access_flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if remote.contains(super::Access::REMOTE_READ) {
            a.qp_access_flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        qp.modify(&mut a, mask | M::IBV_QP_ACCESS_FLAGS.0, QpState::Init)
    }

    /// INIT -> RTR -> RTS with rdma_cm's attributes (which know the peer
    /// once it answered), overridden by `opts`.
    fn to_rts(&self, qp: &QueuePair, opts: &RcOptions) -> Result<()> {
        use sys::ibv_qp_attr_mask as M;
        let (mut a, mask) = self.init_qp_attr(sys::ibv_qp_state::IBV_QPS_RTR)?;
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

    fn conn_param(qp: &QueuePair, opts: &RcOptions, pd: &[u8]) -> sys::rdma_conn_param {
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

/// The name of the RDMA device that owns local address `addr`.
pub fn device_for_addr(addr: IpAddr) -> Result<String> {
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
    id.device_name().ok_or(VerbsError::NoDeviceForAddr {
        addr,
        source: std::io::Error::from_raw_os_error(libc::ENODEV),
    })
}

/// A listening id for RC connections.
#[derive(Debug)]
pub struct Listener {
    id: CmId,
}

impl Listener {
    /// Binds and listens on `addr` (port 0 picks one: see [`local_port`](Self::local_port)).
    pub fn bind(addr: SocketAddr) -> Result<Self> {
        let id = CmId::new(sys::rdma_port_space::RDMA_PS_TCP)?;
        let mut ss = std_to_sockaddr(addr);
        // SAFETY: valid id and sockaddr.
        let rc = unsafe {
            sys::rdma_bind_addr(
                id.id.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_bind_addr",
                source: last_err(),
            });
        }
        // SAFETY: bound id.
        let rc = unsafe { sys::rdma_listen(id.id.as_ptr(), 64) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_listen",
                source: last_err(),
            });
        }
        Ok(Self { id })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        // SAFETY: valid id; rdma_get_src_port reads its bound address.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.id.id.as_ptr()) })
    }

    /// Waits up to `timeout` for a connect request (`None` on timeout).
    /// Other events on the listening id are skipped.
    pub fn next_request(&self, timeout: Duration) -> Result<Option<ConnectRequest>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(ev) = self.id.ch.next_event(left)? else {
                return Ok(None);
            };
            if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                continue;
            }
            let private_data = ev.private_data();
            let raw_id = ev.raw().id;
            drop(ev);
            // Move the new id to a channel of its own so the connection's
            // later events (disconnect) are not mixed with new requests.
            let ch = EventChannel::new()?;
            // SAFETY: raw_id is the new connection's id, owned by us now.
            let rc = unsafe { sys::rdma_migrate_id(raw_id, ch.ch.as_ptr()) };
            let id = CmId {
                id: NonNull::new(raw_id).expect("connect request has an id"),
                ch,
            };
            if rc != 0 {
                return Err(VerbsError::Cm {
                    op: "rdma_migrate_id",
                    source: last_err(),
                });
            }
            return Ok(Some(ConnectRequest { id, private_data }));
        }
    }
}

/// A pending connect request.
#[derive(Debug)]
pub struct ConnectRequest {
    id: CmId,
    private_data: PrivateData,
}

impl ConnectRequest {
    /// The requester's private data.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }
    /// The device the request came in on.
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }
    /// The port it came in on.
    pub fn port_num(&self) -> u8 {
        self.id.port_num()
    }
    /// The requester's address.
    pub fn peer(&self) -> String {
        self.id.peer()
    }
    /// The requester's IP address (`None` for an unknown address family).
    pub fn peer_ip(&self) -> Option<IpAddr> {
        // SAFETY: valid id; the address is a sockaddr union large enough
        // for both families.
        let sa = unsafe { &self.id.id.as_ref().route.addr.dst_addr_union.dst_storage };
        sockaddr_to_std(sa).map(|a| a.ip())
    }

    /// Brings `qp` (fresh, in RESET, on the request's device) to RTS,
    /// accepts with `private_data`, and waits for ESTABLISHED.
    pub fn accept(
        self,
        qp: &QueuePair,
        opts: &RcOptions,
        remote: super::Access,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<Connection> {
        let deadline = Instant::now() + timeout;
        let accepting = self.start_accept(qp, opts, remote, private_data)?;
        accepting.id.ch.wait_for(
            "ESTABLISHED",
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
            deadline,
        )?;
        Ok(Connection { id: accepting.id })
    }

    /// As [`accept`](Self::accept) without waiting: `qp` is in RTS (receives
    /// may be posted at once) and the answer is sent; the connection is
    /// usable once [`Accepting::poll`] reports it established.
    pub fn start_accept(
        self,
        qp: &QueuePair,
        opts: &RcOptions,
        remote: super::Access,
        private_data: &[u8],
    ) -> Result<Accepting> {
        if private_data.len() > MAX_PRIVATE_DATA {
            return Err(VerbsError::PrivateDataTooLong {
                len: private_data.len(),
                max: MAX_PRIVATE_DATA,
            });
        }
        self.id.bring_up(qp, opts, remote)?;
        let mut p = CmId::conn_param(qp, opts, private_data);
        // SAFETY: valid id and param; private_data outlives the call.
        let rc = unsafe { sys::rdma_accept(self.id.id.as_ptr(), &mut p) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_accept",
                source: last_err(),
            });
        }
        Ok(Accepting { id: self.id })
    }

    /// Refuses the request, telling the peer why in private data.
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        let len = private_data.len().min(148);
        // SAFETY: valid id; private_data readable for len bytes.
        let rc = unsafe {
            sys::rdma_reject(self.id.id.as_ptr(), private_data.as_ptr().cast(), len as u8)
        };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_reject",
                source: last_err(),
            });
        }
        Ok(())
    }
}

/// An accepted connection waiting for ESTABLISHED (see
/// [`ConnectRequest::start_accept`]).
#[derive(Debug)]
pub struct Accepting {
    id: CmId,
}

/// Where a non-blocking accept stands.
#[derive(Debug)]
pub enum AcceptProgress {
    /// Not established yet: poll again later.
    Pending(Accepting),
    /// Established.
    Done(Connection),
}

impl Accepting {
    /// Checks, without blocking, whether the connection is established. Any
    /// other event (the peer gave up, a reject) is an error.
    pub fn poll(self) -> Result<AcceptProgress> {
        let Some(ev) = self.id.ch.next_event(Duration::ZERO)? else {
            return Ok(AcceptProgress::Pending(self));
        };
        if ev.kind() != sys::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED {
            return Err(ev.unexpected("ESTABLISHED"));
        }
        drop(ev);
        Ok(AcceptProgress::Done(Connection { id: self.id }))
    }
}

/// An id whose address and route to a peer are resolved, ready to connect.
#[derive(Debug)]
pub struct Resolved {
    id: CmId,
}

/// Starts resolving `dst` (from `src` if given): rdma_cm works within
/// `timeout` per step.
fn start_resolve(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> Result<CmId> {
    let id = CmId::new(sys::rdma_port_space::RDMA_PS_TCP)?;
    let mut d = std_to_sockaddr(dst);
    let mut s = src.map(|ip| std_to_sockaddr(SocketAddr::new(ip, 0)));
    let ms = timeout.as_millis().clamp(1, 60_000) as i32;
    // SAFETY: valid id and sockaddrs (src NULL when absent).
    let rc = unsafe {
        sys::rdma_resolve_addr(
            id.id.as_ptr(),
            s.as_mut().map_or(std::ptr::null_mut(), |s| {
                (s as *mut libc::sockaddr_storage).cast()
            }),
            (&mut d as *mut libc::sockaddr_storage).cast(),
            ms,
        )
    };
    if rc != 0 {
        return Err(VerbsError::Cm {
            op: "rdma_resolve_addr",
            source: last_err(),
        });
    }
    Ok(id)
}

/// Resolves `dst` (optionally from local `src`) within `timeout`.
pub fn resolve(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> Result<Resolved> {
    let deadline = Instant::now() + timeout;
    let ms = timeout.as_millis().clamp(1, 60_000) as i32;
    let id = start_resolve(dst, src, timeout)?;
    id.ch.wait_for(
        "ADDR_RESOLVED",
        sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        deadline,
    )?;
    // SAFETY: address-resolved id.
    let rc = unsafe { sys::rdma_resolve_route(id.id.as_ptr(), ms) };
    if rc != 0 {
        return Err(VerbsError::Cm {
            op: "rdma_resolve_route",
            source: last_err(),
        });
    }
    id.ch.wait_for(
        "ROUTE_RESOLVED",
        sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
        deadline,
    )?;
    Ok(Resolved { id })
}

impl Resolved {
    /// The device the route goes through (create the QP there).
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }
    /// The port.
    pub fn port_num(&self) -> u8 {
        self.id.port_num()
    }

    /// Connects `qp` (fresh, in RESET, on [`device_name`](Self::device_name))
    /// sending `private_data`; returns the connection and the peer's private
    /// data from its accept. A listener that refuses, or no listener at all,
    /// is [`VerbsError::ConnectionRejected`].
    pub fn connect(
        self,
        qp: &QueuePair,
        opts: &RcOptions,
        remote: super::Access,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(Connection, PrivateData)> {
        let deadline = Instant::now() + timeout;
        self.id.send_connect(qp, opts, remote, private_data)?;
        let ev = self.id.ch.wait_for(
            "CONNECT_RESPONSE",
            sys::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE,
            deadline,
        )?;
        let peer_data = ev.private_data();
        drop(ev);
        self.id.establish(qp, opts)?;
        Ok((Connection { id: self.id }, peer_data))
    }
}

impl CmId {
    /// Client side, on a resolved id: `qp` to INIT, then the connect
    /// request. RTR/RTS wait for the peer's answer (its QPN and PSN come
    /// with the response and rdma_init_qp_attr knows them then).
    fn send_connect(
        &self,
        qp: &QueuePair,
        opts: &RcOptions,
        remote: super::Access,
        private_data: &[u8],
    ) -> Result<()> {
        if private_data.len() > MAX_CONNECT_PRIVATE_DATA {
            return Err(VerbsError::PrivateDataTooLong {
                len: private_data.len(),
                max: MAX_CONNECT_PRIVATE_DATA,
            });
        }
        self.to_init(qp, remote)?;
        let mut p = CmId::conn_param(qp, opts, private_data);
        // SAFETY: valid resolved id and param.
        let rc = unsafe { sys::rdma_connect(self.id.as_ptr(), &mut p) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_connect",
                source: last_err(),
            });
        }
        Ok(())
    }

    /// Client side, after CONNECT_RESPONSE: `qp` to RTS and the RTU.
    fn establish(&self, qp: &QueuePair, opts: &RcOptions) -> Result<()> {
        self.to_rts(qp, opts)?;
        // SAFETY: connected id whose QP is in RTS.
        let rc = unsafe { sys::rdma_establish(self.id.as_ptr()) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_establish",
                source: last_err(),
            });
        }
        Ok(())
    }
}

/// A client connection being set up without blocking: address and route
/// resolution, then the connect handshake, each step driven by
/// [`poll`](Self::poll) as rdma_cm reports progress.
#[derive(Debug)]
pub struct Connecting {
    id: CmId,
    step: ConnectStep,
    deadline: Instant,
    ms: i32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnectStep {
    Address,
    Route,
    Response,
}

impl ConnectStep {
    /// The event that ends this step.
    fn expected(self) -> &'static str {
        match self {
            ConnectStep::Address => "ADDR_RESOLVED",
            ConnectStep::Route => "ROUTE_RESOLVED",
            ConnectStep::Response => "CONNECT_RESPONSE",
        }
    }
}

/// Where a non-blocking connect stands.
#[derive(Debug)]
pub enum ConnectProgress {
    /// Not connected yet: poll again later.
    Pending(Connecting),
    /// Connected, with the peer's private data.
    Done(Connection, PrivateData),
}

/// Starts connecting to `dst` (from local `src` if given); the whole set-up
/// must finish within `timeout`. Nothing here blocks.
pub fn start_connect(
    dst: SocketAddr,
    src: Option<IpAddr>,
    timeout: Duration,
) -> Result<Connecting> {
    Ok(Connecting {
        id: start_resolve(dst, src, timeout)?,
        step: ConnectStep::Address,
        deadline: Instant::now() + timeout,
        ms: timeout.as_millis().clamp(1, 60_000) as i32,
    })
}

impl Connecting {
    /// The device the route goes through, once resolved.
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }

    /// True once the connect request is sent and the peer's answer is awaited
    /// (for tests that play a peer stalling in mid-handshake).
    pub fn is_requested(&self) -> bool {
        self.step == ConnectStep::Response
    }

    /// Takes the steps rdma_cm has events for, without blocking. `qp` (fresh,
    /// in RESET, on the device of the local address) and the other
    /// arguments must be the same on every call. Past the deadline, or on
    /// any unexpected event (a reject: nobody listens), it is an error.
    pub fn poll(
        mut self,
        qp: &QueuePair,
        opts: &RcOptions,
        remote: super::Access,
        private_data: &[u8],
    ) -> Result<ConnectProgress> {
        use sys::rdma_cm_event_type::*;
        loop {
            let Some(ev) = self.id.ch.next_event(Duration::ZERO)? else {
                if Instant::now() >= self.deadline {
                    return Err(VerbsError::CmTimeout {
                        expected: self.step.expected(),
                        ms: self.ms as u64,
                    });
                }
                return Ok(ConnectProgress::Pending(self));
            };
            match (self.step, ev.kind()) {
                (ConnectStep::Address, RDMA_CM_EVENT_ADDR_RESOLVED) => {
                    drop(ev);
                    // SAFETY: address-resolved id.
                    let rc = unsafe { sys::rdma_resolve_route(self.id.id.as_ptr(), self.ms) };
                    if rc != 0 {
                        return Err(VerbsError::Cm {
                            op: "rdma_resolve_route",
                            source: last_err(),
                        });
                    }
                    self.step = ConnectStep::Route;
                }
                (ConnectStep::Route, RDMA_CM_EVENT_ROUTE_RESOLVED) => {
                    drop(ev);
                    self.id.send_connect(qp, opts, remote, private_data)?;
                    self.step = ConnectStep::Response;
                }
                (ConnectStep::Response, RDMA_CM_EVENT_CONNECT_RESPONSE) => {
                    let peer_data = ev.private_data();
                    drop(ev);
                    self.id.establish(qp, opts)?;
                    return Ok(ConnectProgress::Done(Connection { id: self.id }, peer_data));
                }
                (step, _) => return Err(ev.unexpected(step.expected())),
            }
        }
    }
}

/// An established RC connection's rdma_cm side (the QP is the caller's).
#[derive(Debug)]
pub struct Connection {
    id: CmId,
}

impl Connection {
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

/// Membership of a UD multicast group, joined through rdma_cm. Leaves the
/// group on drop.
pub struct McastMembership {
    id: CmId,
    group: SocketAddr,
    ah_attr: sys::ibv_ah_attr,
    remote_qpn: u32,
    qkey: u32,
}

impl fmt::Debug for McastMembership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McastMembership")
            .field("group", &self.group)
            .field("mgid", &self.mgid())
            .field("qkey", &self.qkey)
            .finish()
    }
}

// SAFETY: the membership only holds plain data and an id (Send/Sync).
unsafe impl Send for McastMembership {}
// SAFETY: as above.
unsafe impl Sync for McastMembership {}

impl McastMembership {
    /// Joins `group` (an IPv4 multicast address) from local address `local`.
    /// `send_only` asks for a send-only full member where the kernel
    /// supports it (no receive traffic is attracted).
    pub fn join(local: IpAddr, group: IpAddr, send_only: bool, timeout: Duration) -> Result<Self> {
        let deadline = Instant::now() + timeout;
        let id = CmId::new(sys::rdma_port_space::RDMA_PS_UDP)?;
        let mut s = std_to_sockaddr(SocketAddr::new(local, 0));
        let mut g = std_to_sockaddr(SocketAddr::new(group, 0));
        let ms = timeout.as_millis().clamp(1, 60_000) as i32;
        // SAFETY: valid id and sockaddrs.
        let rc = unsafe {
            sys::rdma_resolve_addr(
                id.id.as_ptr(),
                (&mut s as *mut libc::sockaddr_storage).cast(),
                (&mut g as *mut libc::sockaddr_storage).cast(),
                ms,
            )
        };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_resolve_addr (multicast)",
                source: last_err(),
            });
        }
        id.ch.wait_for(
            "ADDR_RESOLVED",
            sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            deadline,
        )?;
        // SAFETY: plain C data.
        let mut attr: sys::rdma_cm_join_mc_attr_ex = unsafe { std::mem::zeroed() };
        attr.comp_mask = (sys::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_ADDRESS
            | sys::rdma_cm_join_mc_attr_mask::RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS)
            .0;
        attr.join_flags = if send_only {
            sys::rdma_cm_mc_join_flags::RDMA_MC_JOIN_FLAG_SENDONLY_FULLMEMBER.0
        } else {
            sys::rdma_cm_mc_join_flags::RDMA_MC_JOIN_FLAG_FULLMEMBER.0
        };
        attr.addr = (&mut g as *mut libc::sockaddr_storage).cast();
        // SAFETY: valid resolved id; attr and the address outlive the call.
        let rc =
            unsafe { sys::rdma_join_multicast_ex(id.id.as_ptr(), &mut attr, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(VerbsError::Cm {
                op: "rdma_join_multicast_ex",
                source: last_err(),
            });
        }
        let ev = id.ch.wait_for(
            "MULTICAST_JOIN",
            sys::rdma_cm_event_type::RDMA_CM_EVENT_MULTICAST_JOIN,
            deadline,
        )?;
        // SAFETY: a MULTICAST_JOIN event carries the ud parameters.
        let ud = unsafe { ev.raw().param.ud };
        drop(ev);
        Ok(Self {
            id,
            group: SocketAddr::new(group, 0),
            ah_attr: ud.ah_attr,
            remote_qpn: ud.qp_num,
            qkey: ud.qkey,
        })
    }

    /// The multicast GID.
    pub fn mgid(&self) -> Gid {
        // SAFETY: the union is plain bytes.
        Gid(unsafe { self.ah_attr.grh.dgid.raw })
    }
    /// The multicast LID (0 on RoCE).
    pub fn mlid(&self) -> u16 {
        self.ah_attr.dlid
    }
    /// The QPN to send to (0xFFFFFF for multicast).
    pub fn remote_qpn(&self) -> u32 {
        self.remote_qpn
    }
    /// The qkey the group uses; UD QPs that send or receive must carry it.
    pub fn qkey(&self) -> u32 {
        self.qkey
    }
    /// The port of the local device.
    pub fn port_num(&self) -> u8 {
        self.id.port_num()
    }
    /// The device the group was joined on.
    pub fn device_name(&self) -> Option<String> {
        self.id.device_name()
    }
    /// Attaches a UD QP so it receives the group's datagrams.
    pub fn attach(&self, qp: &QueuePair) -> Result<()> {
        qp.attach_mcast(self.mgid(), self.mlid())
    }
    /// Detaches a QP.
    pub fn detach(&self, qp: &QueuePair) -> Result<()> {
        qp.detach_mcast(self.mgid(), self.mlid())
    }
    /// An address handle for sending to the group.
    pub fn address_handle(&self, pd: &Arc<ProtectionDomain>) -> Result<AddressHandle> {
        AddressHandle::from_sys(pd, self.ah_attr)
    }
}

impl Drop for McastMembership {
    fn drop(&mut self) {
        let mut g = std_to_sockaddr(self.group);
        // SAFETY: the id joined this address; leaving once. Errors are
        // ignored: the id is destroyed right after, which leaves anyway.
        unsafe {
            sys::rdma_leave_multicast(
                self.id.id.as_ptr(),
                (&mut g as *mut libc::sockaddr_storage).cast(),
            )
        };
    }
}

/// Helper for opening the context the id resolved to, checking it is the
/// one the caller uses.
pub fn check_device(ctx: &Context, id_device: Option<String>) -> Result<()> {
    match id_device {
        Some(n) if n == ctx.name() => Ok(()),
        _ => Err(VerbsError::DeviceMismatch),
    }
}
