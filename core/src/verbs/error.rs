use super::types::{QpState, QpType};
use std::io;

/// Errors of the verbs layer: one variant per failing operation, with the
/// OS error the verb reported.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// No RDMA device exists on this host.
    #[error(
        "no RDMA device found: load soft-RoCE with `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <ethN>`, \
         or run inside the project's guest with `cargo xtask vm -- <command>`"
    )]
    NoDevice,
    /// A device was asked for by name and is not there.
    #[error("RDMA device {name:?} not found (devices present: {present})")]
    DeviceNotFound {
        /// The name asked for.
        name: String,
        /// The names that exist.
        present: String,
    },
    /// No device owns the given IP address.
    #[error("no RDMA device owns address {addr}")]
    NoDeviceForAddr {
        /// The address.
        addr: std::net::IpAddr,
        /// What rdma_cm said.
        #[source]
        source: io::Error,
    },
    /// `ibv_get_device_list` / `rdma_get_devices` failed.
    #[error("listing RDMA devices failed")]
    ListDevices(#[source] io::Error),
    /// `ibv_query_port` failed.
    #[error("query of port {port} on {device} failed")]
    QueryPort {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_gid` failed.
    #[error("query of GID index {index} on {device} failed")]
    QueryGid {
        /// Device name.
        device: String,
        /// GID index.
        index: i32,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// No GID could be chosen (see [`GidError`](super::GidError)).
    #[error(transparent)]
    Gid(#[from] super::gid::GidError),
    /// `ibv_alloc_pd` failed.
    #[error("allocating a protection domain failed")]
    AllocPd(#[source] io::Error),
    /// Allocating the memory to register failed.
    #[error("allocating {len} bytes of memory to register failed")]
    AllocMemory {
        /// Bytes asked for.
        len: usize,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `hugepages = "on"` and no 2 MiB huge page mapping could be made.
    #[error(
        "hugepages = \"on\": no 2 MiB huge pages for {len} bytes of registered memory; reserve \
         them (sysctl vm.nr_hugepages=N, each 2 MiB) or set hugepages = \"auto\""
    )]
    HugePages {
        /// Bytes asked for.
        len: usize,
        /// OS error of the `MAP_HUGETLB` mapping.
        #[source]
        source: io::Error,
    },
    /// `ibv_reg_mr` failed.
    #[error("registering a memory region of {len} bytes failed")]
    RegisterMemoryRegion {
        /// Bytes.
        len: usize,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_create_cq` failed.
    #[error("creating a completion queue of {depth} entries failed")]
    CreateCq {
        /// Entries asked for.
        depth: u32,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_poll_cq` returned an error.
    #[error("polling a completion queue failed")]
    PollCq(#[source] io::Error),
    /// `ibv_create_qp` failed.
    #[error("creating a {qp_type:?} queue pair failed")]
    CreateQp {
        /// RC or UD.
        qp_type: QpType,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_modify_qp` failed.
    #[error("moving queue pair {qpn:#x} to {to:?} failed")]
    ModifyQp {
        /// QP number.
        qpn: u32,
        /// Target state.
        to: QpState,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_query_qp` failed.
    #[error("querying queue pair {qpn:#x} failed")]
    QueryQp {
        /// QP number.
        qpn: u32,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// `ibv_post_send` refused work request number `index` of the batch
    /// (those before it were posted). ENOMEM means the send queue is full.
    #[error("posting send work request {index} (wr_id {wr_id}) failed")]
    PostSend {
        /// Position in the batch of the first refused request.
        index: usize,
        /// Its wr_id.
        wr_id: u64,
        /// OS error (ENOMEM: send queue full).
        #[source]
        source: io::Error,
    },
    /// `ibv_post_recv` refused work request number `index` of the batch.
    #[error("posting receive work request {index} failed")]
    PostRecv {
        /// Position in the batch.
        index: usize,
        /// OS error (ENOMEM: receive queue full).
        #[source]
        source: io::Error,
    },
    /// A scatter/gather entry points outside its memory region.
    #[error("scatter/gather entry [{offset}, +{len}) is outside a region of {region_len} bytes")]
    SgeOutOfBounds {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
    /// Inline data larger than the queue pair's max inline size.
    #[error("inline data of {len} bytes exceeds the queue pair's max inline data ({max})")]
    InlineTooLarge {
        /// Bytes asked for.
        len: usize,
        /// The QP's limit.
        max: u32,
    },
    /// A prepared UD send was given an address handle of another
    /// protection domain than its queue pair's, or more destinations than
    /// it holds.
    #[error("prepared UD send: {0}")]
    PreparedUdSend(&'static str),
    /// `ibv_create_ah` failed.
    #[error("creating an address handle failed")]
    CreateAh(#[source] io::Error),
    /// `ibv_attach_mcast` / `ibv_detach_mcast` failed.
    #[error("attaching queue pair to multicast group failed")]
    AttachMcast(#[source] io::Error),
    /// An rdma_cm call failed.
    #[error("rdma_cm {op} failed")]
    Cm {
        /// The call (e.g. "rdma_resolve_addr").
        op: &'static str,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// rdma_cm delivered an event other than the one expected.
    #[error("rdma_cm: expected {expected} but got {got} (status {status})")]
    CmUnexpectedEvent {
        /// What we waited for.
        expected: &'static str,
        /// What came (rdma_event_str).
        got: String,
        /// The event's status (negative errno, or a reject reason).
        status: i32,
    },
    /// The peer rejected the connection (no listener, or refused by it).
    #[error("connection to {peer} rejected (status {status}): {reason}")]
    ConnectionRejected {
        /// Who.
        peer: String,
        /// The CM reject status.
        status: i32,
        /// Why, as far as known.
        reason: String,
        /// The reject's private data as it came (zeros past what the
        /// listener sent: the CM carries a fixed-size field). Boxed: a
        /// reject is rare, and errors stay small.
        private_data: Box<[u8]>,
    },
    /// No rdma_cm event arrived in time.
    #[error("rdma_cm: timed out after {ms} ms waiting for {expected}")]
    CmTimeout {
        /// What we waited for.
        expected: &'static str,
        /// How long.
        ms: u64,
    },
    /// Private data longer than the CM message can carry.
    #[error("private data of {len} bytes exceeds {max}")]
    PrivateDataTooLong {
        /// Bytes given.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The rdma_cm id resolved to another device than the given context.
    #[error("address resolved to a different RDMA device than the context given")]
    DeviceMismatch,
}

/// The current `errno` as an `io::Error`.
pub(crate) fn last_err() -> io::Error {
    io::Error::last_os_error()
}

/// An `io::Error` from a verbs return value that is itself an errno
/// (most `ibv_post_*` and `ibv_modify_qp` return the error instead of
/// setting errno).
pub(crate) fn errno(code: i32) -> io::Error {
    if code > 0 {
        io::Error::from_raw_os_error(code)
    } else if code < 0 {
        // Some providers return -1 and set errno.
        let e = io::Error::last_os_error();
        if e.raw_os_error().unwrap_or(0) == 0 {
            io::Error::from_raw_os_error(-code)
        } else {
            e
        }
    } else {
        io::Error::other("unknown verbs error")
    }
}

/// Result of a verbs operation.
pub type Result<T, E = VerbsError> = std::result::Result<T, E>;
