//! UD multicast membership joined through rdma_cm.

use super::id::*;
use crate::verbs::device::Gid;
use crate::verbs::error::Result;
use crate::verbs::gid::{check_connection_index, GidTable};
use crate::verbs::memory::ProtectionDomain;
use crate::verbs::qp::{AddressHandle, QueuePair, UdClass};
use rdma_sys as sys;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        cm_ok(rc, "rdma_resolve_addr (multicast)")?;
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
        cm_ok(rc, "rdma_join_multicast_ex")?;
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
    /// An address handle for sending to the group, its datagrams marked
    /// with `class`'s traffic class and service level, and sent from its
    /// GID index when one is set (checked to be a used RoCE v2 entry holding
    /// the address the group was joined from, which is the one rdma_cm
    /// resolved; an error otherwise).
    pub fn address_handle(
        &self,
        pd: &Arc<ProtectionDomain>,
        class: &UdClass,
    ) -> Result<AddressHandle> {
        let mut attr = self.ah_attr;
        attr.grh.traffic_class = class.traffic_class;
        attr.sl = class.service_level;
        let device = self.device_name().unwrap_or_default();
        let port = self.port_num();
        let resolved = u32::from(attr.grh.sgid_index);
        let sys = Path::new("/sys");
        match class.gid_index {
            Some(index) => {
                let choice = check_connection_index(
                    &GidTable::read_sysfs(sys, &device, port)?,
                    u32::from(index),
                    resolved,
                )?;
                tracing::info!(gid = %choice, resolved, group = %self.group, traffic_class = class.traffic_class, "multicast send GID (configured)");
                attr.grh.sgid_index = index;
            }
            None => match GidTable::read_sysfs_entry(sys, &device, port, resolved) {
                Some(e) => {
                    tracing::info!(%device, port, gid = %e, group = %self.group, traffic_class = class.traffic_class, "multicast send GID (rdma_cm)")
                }
                None => {
                    tracing::info!(%device, port, gid_index = resolved, group = %self.group, "multicast send GID (type unknown: sysfs GID table unreadable)")
                }
            },
        }
        AddressHandle::from_sys(pd, attr)
    }

    /// The source GID index rdma_cm resolved for the group.
    pub fn sgid_index(&self) -> u8 {
        self.ah_attr.grh.sgid_index
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
