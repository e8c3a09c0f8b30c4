//! The active side: resolving a peer and connecting to it, blocking or step by step.

use super::id::*;
use crate::verbs::error::Result;
use crate::verbs::error::VerbsError;
use crate::verbs::memory::Access;
use crate::verbs::qp::{QueuePair, RcOptions};
use rdma_sys as sys;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

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
    cm_ok(rc, "rdma_resolve_addr")?;
    Ok(id)
}

/// Resolves `dst` (optionally from local `src`) within `timeout`, with
/// rdma_cm's default type of service (see [`resolve_with_tos`]).
pub fn resolve(dst: SocketAddr, src: Option<IpAddr>, timeout: Duration) -> Result<Resolved> {
    resolve_tos(dst, src, timeout, None)
}

/// Resolves `dst` (optionally from local `src`) within `timeout`, the
/// route (and the connection messages over it) marked with IP traffic
/// class `tos` (`RDMA_OPTION_ID_TOS`; pass [`RcOptions::traffic_class`]).
pub fn resolve_with_tos(
    dst: SocketAddr,
    src: Option<IpAddr>,
    timeout: Duration,
    tos: u8,
) -> Result<Resolved> {
    resolve_tos(dst, src, timeout, Some(tos))
}

fn resolve_tos(
    dst: SocketAddr,
    src: Option<IpAddr>,
    timeout: Duration,
    tos: Option<u8>,
) -> Result<Resolved> {
    let deadline = Instant::now() + timeout;
    let ms = timeout.as_millis().clamp(1, 60_000) as i32;
    let id = start_resolve(dst, src, timeout)?;
    id.ch.wait_for(
        "ADDR_RESOLVED",
        sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
        deadline,
    )?;
    if let Some(tos) = tos {
        // Before the route: rdma_cm copies the TOS into the path it resolves.
        id.set_tos(tos)?;
    }
    // SAFETY: address-resolved id.
    let rc = unsafe { sys::rdma_resolve_route(id.id.as_ptr(), ms) };
    cm_ok(rc, "rdma_resolve_route")?;
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
        remote: Access,
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
        remote: Access,
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
        cm_ok(rc, "rdma_connect")?;
        Ok(())
    }

    /// Client side, after CONNECT_RESPONSE: `qp` to RTS and the RTU.
    fn establish(&self, qp: &QueuePair, opts: &RcOptions) -> Result<()> {
        self.to_rts(qp, opts)?;
        // SAFETY: connected id whose QP is in RTS.
        let rc = unsafe { sys::rdma_establish(self.id.as_ptr()) };
        cm_ok(rc, "rdma_establish")?;
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
        remote: Access,
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
                    // Before the route: rdma_cm copies the TOS into the path.
                    self.id.set_tos(opts.traffic_class)?;
                    // SAFETY: address-resolved id.
                    let rc = unsafe { sys::rdma_resolve_route(self.id.id.as_ptr(), self.ms) };
                    cm_ok(rc, "rdma_resolve_route")?;
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
