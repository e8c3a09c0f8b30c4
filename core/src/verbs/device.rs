//! Device discovery and the device context.

use super::error::Result;
use super::error::{last_err, VerbsError};
use super::gid::{env_gid_index, select_gid, GidChoice, GidPolicy, GidTable};
use rdma_sys as sys;
use std::ffi::CStr;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

/// A 128-bit global identifier (on RoCE v2 with IPv4: `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID.
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
    /// Whether the GID is all zeros (an unused table slot).
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
    pub(crate) fn to_sys(self) -> sys::ibv_gid {
        sys::ibv_gid { raw: self.0 }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Ipv6Addr::from(self.0))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Logical port state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// Not usable.
    Down,
    /// Initializing.
    Init,
    /// Armed.
    Armed,
    /// Ready for traffic.
    Active,
    /// Any other value the driver reports.
    Other(u32),
}

/// What `ibv_query_port` says about a port.
#[derive(Debug, Clone, Copy)]
pub struct PortInfo {
    /// Logical state.
    pub state: PortState,
    /// Active path MTU in bytes (1024 on soft-RoCE over a 1500-byte netdev).
    pub active_mtu: u32,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// Entries in the GID table.
    pub gid_table_len: i32,
    /// Link layer (1 = InfiniBand, 2 = Ethernet, i.e. RoCE).
    pub link_layer: u8,
    /// Largest message size.
    pub max_msg_size: u32,
}

pub(crate) fn mtu_bytes(m: sys::ibv_mtu::Type) -> u32 {
    match m {
        1..=5 => 128 << m,
        _ => 0,
    }
}

/// Names of the RDMA devices on this host. Empty list or NULL from
/// `ibv_get_device_list` is [`VerbsError::NoDevice`] (and never passed to
/// `ibv_free_device_list`, which crashes on NULL).
pub fn device_names() -> Result<Vec<String>> {
    let mut n = 0i32;
    // SAFETY: `n` is a valid out pointer; the call has no other preconditions.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = last_err();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::ENOENT) | Some(0) | None => Err(VerbsError::NoDevice),
            _ => Err(VerbsError::ListDevices(e)),
        };
    }
    let mut names = Vec::new();
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers until freed below.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is valid; ibv_get_device_name returns a NUL-terminated
        // string owned by the device, which we copy before freeing the list.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
        names.push(name.to_string_lossy().into_owned());
    }
    // SAFETY: `list` is non-NULL and came from ibv_get_device_list.
    unsafe { sys::ibv_free_device_list(list) };
    if names.is_empty() {
        return Err(VerbsError::NoDevice);
    }
    Ok(names)
}

enum Owner {
    /// rdma_cm's device list: the contexts stay open for the process's life;
    /// the list is released on drop.
    Cm(*mut *mut sys::ibv_context),
    /// Opened by us with `ibv_open_device` (rdma_cm unavailable).
    Own,
}

/// An open RDMA device.
///
/// Obtained from rdma_cm's own device list where possible, so that rdma_cm
/// ids bound to this device share this very context and queue pairs created
/// here can be connected and attached to multicast groups through rdma_cm.
pub struct Context {
    ctx: NonNull<sys::ibv_context>,
    owner: Owner,
    name: String,
}

// SAFETY: libibverbs contexts are thread-safe (the library serialises
// internally where the provider needs it); we never hand out &mut to it.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take &self and call thread-safe verbs.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// Opens a device by name, or, with `None`, the one named by the
    /// `ROCEBUS_RDMA_DEVICE` environment variable, else the first device.
    pub fn open(name: Option<&str>) -> Result<Arc<Context>> {
        let names = device_names()?;
        let env = std::env::var("ROCEBUS_RDMA_DEVICE").ok();
        let want = match name.or(env.as_deref()) {
            Some(n) => n.to_owned(),
            None => names[0].clone(),
        };
        if !names.contains(&want) {
            return Err(VerbsError::DeviceNotFound {
                name: want,
                present: names.join(", "),
            });
        }
        Self::open_cm(&want).or_else(|_| Self::open_own(&want))
    }

    fn open_cm(want: &str) -> Result<Arc<Context>> {
        let mut n = 0i32;
        // SAFETY: valid out pointer.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            return Err(VerbsError::ListDevices(last_err()));
        }
        for i in 0..n.max(0) as usize {
            // SAFETY: rdma_get_devices returned `n` valid context pointers.
            let ctx = unsafe { *list.add(i) };
            // SAFETY: ctx is a valid open context; its device pointer and name
            // live as long as the context.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx).device)) };
            if name.to_bytes() == want.as_bytes() {
                return Ok(Arc::new(Context {
                    ctx: NonNull::new(ctx).expect("non-null in list"),
                    owner: Owner::Cm(list),
                    name: want.to_owned(),
                }));
            }
        }
        // SAFETY: list came from rdma_get_devices and is freed once.
        unsafe { sys::rdma_free_devices(list) };
        Err(VerbsError::DeviceNotFound {
            name: want.to_owned(),
            present: String::new(),
        })
    }

    fn open_own(want: &str) -> Result<Arc<Context>> {
        let mut n = 0i32;
        // SAFETY: valid out pointer.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(VerbsError::NoDevice);
        }
        let mut found = None;
        for i in 0..n.max(0) as usize {
            // SAFETY: `n` valid entries.
            let dev = unsafe { *list.add(i) };
            // SAFETY: valid device, NUL-terminated name.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) };
            if name.to_bytes() == want.as_bytes() {
                // SAFETY: dev is valid until the list is freed; an opened
                // context does not depend on the list afterwards.
                found = Some(unsafe { sys::ibv_open_device(dev) });
                break;
            }
        }
        let err = last_err();
        // SAFETY: non-NULL list from ibv_get_device_list, freed once.
        unsafe { sys::ibv_free_device_list(list) };
        match found {
            Some(ctx) if !ctx.is_null() => Ok(Arc::new(Context {
                ctx: NonNull::new(ctx).expect("checked"),
                owner: Owner::Own,
                name: want.to_owned(),
            })),
            Some(_) => Err(VerbsError::ListDevices(err)),
            None => Err(VerbsError::DeviceNotFound {
                name: want.to_owned(),
                present: String::new(),
            }),
        }
    }

    /// The device's name (e.g. `rxe0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw context, for what this layer does not wrap.
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.ctx.as_ptr()
    }

    /// Queries a port (ports are numbered from 1).
    pub fn query_port(&self, port: u8) -> Result<PortInfo> {
        // SAFETY: ibv_port_attr is plain C data; all-zero is a valid value.
        let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid context and out pointer of the right type/size.
        let rc = unsafe { sys::___ibv_query_port(self.as_raw(), port, &mut attr) };
        if rc != 0 {
            return Err(VerbsError::QueryPort {
                device: self.name.clone(),
                port,
                source: super::error::errno(rc),
            });
        }
        let state = match attr.state {
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            s => PortState::Other(s),
        };
        Ok(PortInfo {
            state,
            active_mtu: mtu_bytes(attr.active_mtu),
            max_mtu: mtu_bytes(attr.max_mtu),
            gid_table_len: attr.gid_tbl_len,
            link_layer: attr.link_layer,
            max_msg_size: attr.max_msg_sz,
        })
    }

    /// Reads one GID table entry.
    pub fn query_gid(&self, port: u8, index: i32) -> Result<Gid> {
        let mut gid = sys::ibv_gid { raw: [0; 16] };
        // SAFETY: valid context and out pointer.
        let rc = unsafe { sys::ibv_query_gid(self.as_raw(), port, index, &mut gid) };
        if rc != 0 {
            return Err(VerbsError::QueryGid {
                device: self.name.clone(),
                index,
                source: last_err(),
            });
        }
        // SAFETY: every bit pattern of the union is a valid [u8; 16].
        Ok(Gid(unsafe { gid.raw }))
    }

    /// All non-zero GIDs of a port, with their index.
    pub fn gids(&self, port: u8) -> Result<Vec<(i32, Gid)>> {
        let len = self.query_port(port)?.gid_table_len;
        let mut out = Vec::new();
        for i in 0..len {
            match self.query_gid(port, i) {
                Ok(g) if !g.is_zero() => out.push((i, g)),
                Ok(_) => {}
                // rxe reports EINVAL for unused slots on some kernels.
                Err(_) => {}
            }
        }
        Ok(out)
    }

    /// The used entries of a port's GID table with their RoCE type and
    /// netdev, read from `/sys/class/infiniband/<dev>/ports/<port>/`.
    pub fn gid_table(&self, port: u8) -> Result<GidTable> {
        Ok(GidTable::read_sysfs(Path::new("/sys"), &self.name, port)?)
    }

    /// Chooses the GID `policy` asks for on `port` (see [`select_gid`]).
    /// Without an index in the policy, `ROCEBUS_GID_INDEX` is the explicit
    /// index. The choice (index, GID, type, netdev) is logged at info level.
    pub fn select_gid(&self, port: u8, policy: &GidPolicy) -> Result<GidChoice> {
        let mut policy = policy.clone();
        policy.gid_index = policy.gid_index.or_else(env_gid_index);
        let choice = select_gid(&self.gid_table(port)?, &policy)?;
        tracing::info!(
            device = %choice.device,
            port = choice.port,
            gid_index = choice.entry.index,
            gid = %choice.entry.gid,
            gid_type = %choice.entry.gid_type,
            netdev = choice.entry.netdev.as_deref().unwrap_or("-"),
            explicit = choice.explicit,
            "GID selected"
        );
        Ok(choice)
    }

    /// The GID index with the default policy: `ROCEBUS_GID_INDEX` if set
    /// (checked to be a used RoCE v2 entry), else the first RoCE v2 entry
    /// holding an IPv4 address. On mlx5 that is the v2 twin of the address,
    /// not its v1 entry that comes first.
    pub fn default_gid_index(&self, port: u8) -> Result<i32> {
        Ok(self.select_gid(port, &GidPolicy::default())?.index() as i32)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match self.owner {
            // SAFETY: the list came from rdma_get_devices and is freed once;
            // every child object holds an Arc<Context>, so none is left.
            Owner::Cm(list) => unsafe { sys::rdma_free_devices(list) },
            // SAFETY: we opened it, all children are gone (they hold Arcs).
            Owner::Own => unsafe {
                sys::ibv_close_device(self.ctx.as_ptr());
            },
        }
    }
}
