//! The passive side: a listening id, connect requests, accepting.

use super::id::*;
use crate::verbs::error::Result;
use crate::verbs::error::VerbsError;
use crate::verbs::memory::Access;
use crate::verbs::qp::{QueuePair, RcOptions};
use rdma_sys as sys;
use std::net::{IpAddr, SocketAddr};
use std::ptr::NonNull;
use std::time::{Duration, Instant};

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
        cm_ok(rc, "rdma_bind_addr")?;
        // SAFETY: bound id.
        let rc = unsafe { sys::rdma_listen(id.id.as_ptr(), 64) };
        cm_ok(rc, "rdma_listen")?;
        Ok(Self { id })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        // SAFETY: valid id; rdma_get_src_port reads its bound address.
        u16::from_be(unsafe { sys::rdma_get_src_port(self.id.id.as_ptr()) })
    }

    /// The event channel [`next_request`](Self::next_request) reads (for
    /// [`EventChannel::any_event`]).
    pub fn events(&self) -> &EventChannel {
        &self.id.ch
    }

    /// Waits up to `timeout` for a connect request (`None` on timeout).
    /// Other events on the listening id are skipped.
    pub fn next_request(&self, timeout: Duration) -> Result<Option<ConnectRequest>> {
        self.next_request_or_wake(timeout, None)
    }

    /// As [`next_request`](Self::next_request), and `None` as soon as
    /// `wake` is readable or closed ([`EventChannel::next_event_or_wake`]).
    pub fn next_request_or_wake(
        &self,
        timeout: Duration,
        wake: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Option<ConnectRequest>> {
        // A zero timeout (a look from a polling loop) reads no clock.
        let deadline = (!timeout.is_zero()).then(|| Instant::now() + timeout);
        loop {
            let left = deadline.map_or(Duration::ZERO, |d| {
                d.saturating_duration_since(Instant::now())
            });
            let Some(ev) = self.id.ch.next_event_or_wake(left, wake)? else {
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
            cm_ok(rc, "rdma_migrate_id")?;
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
        remote: Access,
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
        remote: Access,
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
        cm_ok(rc, "rdma_accept")?;
        Ok(Accepting { id: self.id })
    }

    /// Refuses the request, telling the peer why in private data (empty:
    /// nothing; the peer's CM still reports the reject, with zeros where
    /// the private data would be).
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        let len = private_data.len().min(148);
        let data = if len == 0 {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: valid id; data is null with length 0, or readable for len bytes.
        let rc = unsafe { sys::rdma_reject(self.id.id.as_ptr(), data, len as u8) };
        cm_ok(rc, "rdma_reject")?;
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

    /// The peer is established: something it sent reached the queue pair
    /// (it sends only once it has our accept). Its ready-to-use message may
    /// have been lost on the way, and the CM would learn of the connection
    /// only from the retry of our accept, seconds later (rdma_cm's CM
    /// response timeout is ~4 s); meanwhile the peer's messages go
    /// unanswered. This tells the CM what the traffic shows
    /// (`rdma_notify(IBV_EVENT_COMM_EST)`, what the InfiniBand
    /// "communication established" event is for) and returns the
    /// connection. Call it only on such evidence: an accept whose reply was
    /// lost would otherwise stop being retried.
    pub fn established_by_traffic(self) -> Result<Connection> {
        // SAFETY: valid id.
        let rc = unsafe {
            sys::rdma_notify(self.id.id.as_ptr(), sys::ibv_event_type::IBV_EVENT_COMM_EST)
        };
        if rc != 0 {
            let err = crate::verbs::error::last_err();
            // EISCONN: the ready-to-use message came first after all.
            if err.raw_os_error() != Some(libc::EISCONN) {
                return Err(VerbsError::Cm {
                    op: "rdma_notify",
                    source: err,
                });
            }
        }
        // The ESTABLISHED event still comes, on the connection's channel,
        // where only a disconnect is looked for.
        Ok(Connection { id: self.id })
    }
}
