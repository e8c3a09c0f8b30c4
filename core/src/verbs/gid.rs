//! GID selection: which entry of a port's GID table a queue pair sends from.
//!
//! Real NICs list every address more than once. mlx5 has, per IP address, a
//! RoCE v1 entry and then a RoCE v2 entry; only v2 is routable (UDP/IP), so
//! "the first IPv4-mapped GID" picks v1 there and traffic silently leaves as
//! RoCE v1. Soft-RoCE (rxe) has v2 entries only, which hid the problem.
//!
//! The selection is a pure function ([`select_gid`]) over a [`GidTable`]
//! read from sysfs (`<root>/class/infiniband/<dev>/ports/<port>/gids/<N>`,
//! `gid_attrs/types/<N>`, `gid_attrs/ndevs/<N>`), so it is tested on fake
//! trees. It reads files only; it must not call verbs.

use super::device::Gid;
use std::fmt;
use std::fs;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// The RoCE version of a GID table entry (`gid_attrs/types/<N>`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidType {
    /// `IB/RoCE v1`: InfiniBand, or RoCE v1 (Ethernet, not routable).
    RoceV1,
    /// `RoCE v2`: RoCE over UDP/IP, routable.
    RoceV2,
    /// The type file was missing or unreadable (kernels before 4.5).
    Unknown,
    /// Any other text the kernel reports.
    Other(String),
}

impl GidType {
    /// Parses the text of a `gid_attrs/types/<N>` file.
    pub fn parse(text: &str) -> GidType {
        match text.trim() {
            "IB/RoCE v1" => GidType::RoceV1,
            "RoCE v2" => GidType::RoceV2,
            "" => GidType::Unknown,
            t => GidType::Other(t.to_owned()),
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Unknown => f.write_str("unknown type"),
            GidType::Other(t) => f.write_str(t),
        }
    }
}

/// One used (non-zero) entry of a GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidEntry {
    /// Its index (the `sgid_index` of an address handle or QP).
    pub index: u32,
    /// The GID.
    pub gid: Gid,
    /// RoCE v1 or v2.
    pub gid_type: GidType,
    /// The network interface it belongs to (`gid_attrs/ndevs/<N>`), if any.
    pub netdev: Option<String>,
}

impl fmt::Display for GidEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {} {}", self.index, self.gid, self.gid_type)?;
        if let Some(n) = &self.netdev {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// The used entries of one port's GID table, in index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidTable {
    /// Device name (`mlx5_0`, `rxe0`).
    pub device: String,
    /// Port number.
    pub port: u8,
    /// Non-zero entries, by increasing index.
    pub entries: Vec<GidEntry>,
}

/// Why no GID could be chosen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GidError {
    /// The port's `gids` directory could not be read.
    #[error("reading the GID table of {device} port {port} at {path} failed")]
    ReadTable {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The directory.
        path: PathBuf,
        /// OS error.
        #[source]
        source: io::Error,
    },
    /// No entry matched what was asked for.
    #[error("no GID on {device} port {port} matches {wanted}; the table has: {table}")]
    NoMatch {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// What was asked for (address, interface, type).
        wanted: String,
        /// The used entries, one `[index] gid type netdev` per entry.
        table: String,
    },
    /// An explicit `gid_index` names an unused or missing entry.
    #[error(
        "gid_index {index} is not a used entry of {device} port {port}; the table has: {table}"
    )]
    IndexNotInTable {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The index asked for.
        index: u32,
        /// The used entries.
        table: String,
    },
    /// An explicit `gid_index` is not RoCE v2 while v2 is required.
    #[error(
        "gid_index {index} on {device} port {port} is {gid_type}, not RoCE v2 (not routable); \
         pick a RoCE v2 entry or allow v1 explicitly; the table has: {table}"
    )]
    NotRoceV2 {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The index asked for.
        index: u32,
        /// Its type.
        gid_type: GidType,
        /// The used entries.
        table: String,
    },
    /// An explicit `gid_index` holds another address than the connection's.
    #[error(
        "gid_index {index} on {device} port {port} holds {gid}, but the connection is bound to \
         {bound}: the peer would drop its packets; pick the RoCE v2 entry of {bound}"
    )]
    AddressMismatch {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The index asked for.
        index: u32,
        /// Its GID.
        gid: Gid,
        /// The GID of the address the service is bound to.
        bound: Gid,
    },
    /// rdma_cm bound a connection to a RoCE v1 entry (no `gid_index` configured) and the
    /// address has no RoCE v2 entry.
    #[error(
        "rdma_cm bound the connection to GID index {index} ({gid}, RoCE v1) on {device} \
         port {port}, and that address has no RoCE v2 entry (RoCE v1 is not routable): set \
         gid_index to the entry to use; the table has: {table}"
    )]
    NoRoceV2ForAddress {
        /// Device name.
        device: String,
        /// Port.
        port: u8,
        /// The entry rdma_cm bound.
        index: u32,
        /// Its GID.
        gid: Gid,
        /// The used entries.
        table: String,
    },
}

/// What to select a GID by. The default takes the first RoCE v2 entry
/// holding an IPv4 address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GidPolicy {
    /// The local address the service binds: the GID must equal it
    /// (IPv4-mapped for IPv4).
    pub local_ip: Option<IpAddr>,
    /// The network interface the GID must belong to.
    pub netdev: Option<String>,
    /// An explicit index: wins over everything else, checked to exist (and
    /// to be RoCE v2 unless `allow_roce_v1`).
    pub gid_index: Option<u32>,
    /// Accept RoCE v1 entries (v2 entries are still preferred).
    pub allow_roce_v1: bool,
}

/// The GID chosen, with what it is: print it or log it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GidChoice {
    /// Device name.
    pub device: String,
    /// Port.
    pub port: u8,
    /// The entry.
    pub entry: GidEntry,
    /// Whether an explicit index chose it (rather than the policy's match).
    pub explicit: bool,
}

/// The GID a service bound to a local address sends from, with its port's
/// active MTU ([`local_gid`](super::cm::local_gid)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalGid {
    /// The entry (index, GID, type, netdev) and its device and port.
    pub choice: GidChoice,
    /// The port's active MTU, bytes.
    pub active_mtu: u32,
}

impl GidChoice {
    /// The index as `ibv_ah_attr.grh.sgid_index` takes it.
    pub fn index(&self) -> u32 {
        self.entry.index
    }
}

impl fmt::Display for GidChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} port {} gid_index {} gid {} {} netdev {}{}",
            self.device,
            self.port,
            self.entry.index,
            self.entry.gid,
            self.entry.gid_type,
            self.entry.netdev.as_deref().unwrap_or("-"),
            if self.explicit { " (explicit)" } else { "" }
        )
    }
}

fn read_trimmed(path: &Path) -> Option<String> {
    // Unused slots answer EINVAL on real kernels: treated as absent.
    fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn port_dir(root: &Path, device: &str, port: u8) -> PathBuf {
    root.join("class/infiniband")
        .join(device)
        .join("ports")
        .join(port.to_string())
}

/// Entry `index` under a port directory; `None` if unused or unreadable.
fn read_entry(base: &Path, index: u32) -> Option<GidEntry> {
    let n = index.to_string();
    let gid: Ipv6Addr = read_trimmed(&base.join("gids").join(&n))?.parse().ok()?;
    let gid = Gid(gid.octets());
    if gid.is_zero() {
        return None;
    }
    let gid_type = read_trimmed(&base.join("gid_attrs/types").join(&n))
        .map_or(GidType::Unknown, |t| GidType::parse(&t));
    let netdev = read_trimmed(&base.join("gid_attrs/ndevs").join(&n));
    Some(GidEntry {
        index,
        gid,
        gid_type,
        netdev,
    })
}

impl GidTable {
    /// Reads one entry (three small files, not the whole table: for a
    /// connection's report); `None` if unused or unreadable.
    pub fn read_sysfs_entry(root: &Path, device: &str, port: u8, index: u32) -> Option<GidEntry> {
        read_entry(&port_dir(root, device, port), index)
    }

    /// Reads `<root>/class/infiniband/<device>/ports/<port>/` (`root` is
    /// `/sys` on a host, a fake tree in tests). Zero and unreadable GIDs are
    /// skipped.
    pub fn read_sysfs(root: &Path, device: &str, port: u8) -> Result<GidTable, GidError> {
        let base = port_dir(root, device, port);
        let gids = base.join("gids");
        let dir = fs::read_dir(&gids).map_err(|source| GidError::ReadTable {
            device: device.to_owned(),
            port,
            path: gids.clone(),
            source,
        })?;
        let mut entries = Vec::new();
        for ent in dir.flatten() {
            let index = ent.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            if let Some(e) = index.and_then(|i| read_entry(&base, i)) {
                entries.push(e);
            }
        }
        entries.sort_by_key(|e| e.index);
        Ok(GidTable {
            device: device.to_owned(),
            port,
            entries,
        })
    }

    /// The entries, one `[index] gid type netdev` each, for error messages.
    pub fn listing(&self) -> String {
        if self.entries.is_empty() {
            return "no used entries".to_owned();
        }
        let v: Vec<String> = self.entries.iter().map(|e| e.to_string()).collect();
        v.join(", ")
    }
}

/// Whether `gid` holds `ip` (IPv4-mapped for IPv4, equal for IPv6).
pub fn gid_matches_ip(gid: Gid, ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => gid.0 == v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => gid.0 == v6.octets(),
    }
}

/// Chooses the GID `policy` asks for from `table`:
/// 1. an explicit `gid_index` wins, if it is a used entry, RoCE v2 (or
///    `allow_roce_v1`) and holds `local_ip` when that is set;
/// 2. else entries are filtered by `local_ip` (without it, by holding an
///    IPv4 address) and `netdev`, RoCE v2 ones first, then RoCE v1 ones only
///    if `allow_roce_v1`; the lowest index wins.
///
/// Errors list the whole table so the operator sees what exists.
pub fn select_gid(table: &GidTable, policy: &GidPolicy) -> Result<GidChoice, GidError> {
    let choice = |entry: &GidEntry, explicit| GidChoice {
        device: table.device.clone(),
        port: table.port,
        entry: entry.clone(),
        explicit,
    };
    if let Some(index) = policy.gid_index {
        let Some(e) = table.entries.iter().find(|e| e.index == index) else {
            return Err(GidError::IndexNotInTable {
                device: table.device.clone(),
                port: table.port,
                index,
                table: table.listing(),
            });
        };
        if e.gid_type != GidType::RoceV2 && !policy.allow_roce_v1 {
            return Err(GidError::NotRoceV2 {
                device: table.device.clone(),
                port: table.port,
                index,
                gid_type: e.gid_type.clone(),
                table: table.listing(),
            });
        }
        // An index holding another address than the one bound sends
        // packets the peer drops: refuse rather than send from it.
        if let Some(ip) = policy.local_ip.filter(|ip| !gid_matches_ip(e.gid, *ip)) {
            return Err(GidError::AddressMismatch {
                device: table.device.clone(),
                port: table.port,
                index,
                gid: e.gid,
                bound: Gid(match ip {
                    IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
                    IpAddr::V6(v6) => v6.octets(),
                }),
            });
        }
        return Ok(choice(e, true));
    }
    let matches = |e: &&GidEntry| {
        let by_ip = match policy.local_ip {
            Some(ip) => gid_matches_ip(e.gid, ip),
            // IPv6 (link-local included) only when asked for by address.
            None => e.gid.ipv4().is_some(),
        };
        let by_dev = match &policy.netdev {
            Some(n) => e.netdev.as_deref() == Some(n.as_str()),
            None => true,
        };
        by_ip && by_dev
    };
    let v2 = table
        .entries
        .iter()
        .filter(matches)
        .find(|e| e.gid_type == GidType::RoceV2);
    let any = || table.entries.iter().find(matches);
    match v2.or_else(|| policy.allow_roce_v1.then(any).flatten()) {
        Some(e) => Ok(choice(e, false)),
        None => Err(GidError::NoMatch {
            device: table.device.clone(),
            port: table.port,
            wanted: describe(policy),
            table: table.listing(),
        }),
    }
}

/// Checks an explicit index for a connection rdma_cm resolved to entry
/// `resolved`: it must be a used RoCE v2 entry holding the same address
/// (rdma_cm told the peer that address, and the peer drops packets from
/// another one; rxe checks it), so only the entry's type may differ, which
/// is the point of choosing (v2 over v1).
pub fn check_connection_index(
    table: &GidTable,
    index: u32,
    resolved: u32,
) -> Result<GidChoice, GidError> {
    let policy = GidPolicy {
        gid_index: Some(index),
        ..GidPolicy::default()
    };
    let choice = select_gid(table, &policy)?;
    let bound = table.entries.iter().find(|e| e.index == resolved);
    if let Some(b) = bound.filter(|b| b.gid != choice.entry.gid) {
        return Err(GidError::AddressMismatch {
            device: table.device.clone(),
            port: table.port,
            index,
            gid: choice.entry.gid,
            bound: b.gid,
        });
    }
    Ok(choice)
}

/// The source GID of a connection rdma_cm bound to entry `resolved` when no `gid_index` is
/// configured: that entry if it is RoCE v2, else the RoCE v2 entry of the same address
/// (mlx5 lists every address twice, v1 first, and rdma_cm may bind the v1 one: its packets
/// are not routable across an L3 hop). RoCE v2 only unless a `gid_index` says otherwise:
/// an address with no v2 entry is an error. An entry of unknown type (a kernel without
/// `gid_attrs/types`) is taken as it is. Only entries a QP's 8-bit `sgid_index` can name
/// (0 to 255) are candidates.
pub fn connection_default_entry(table: &GidTable, resolved: u32) -> Result<GidEntry, GidError> {
    let Some(bound) = table.entries.iter().find(|e| e.index == resolved) else {
        return Err(GidError::IndexNotInTable {
            device: table.device.clone(),
            port: table.port,
            index: resolved,
            table: table.listing(),
        });
    };
    if bound.gid_type != GidType::RoceV1 {
        return Ok(bound.clone());
    }
    table
        .entries
        .iter()
        .find(|e| e.gid == bound.gid && e.gid_type == GidType::RoceV2 && e.index <= 255)
        .cloned()
        .ok_or_else(|| GidError::NoRoceV2ForAddress {
            device: table.device.clone(),
            port: table.port,
            index: resolved,
            gid: bound.gid,
            table: table.listing(),
        })
}

fn describe(policy: &GidPolicy) -> String {
    let mut parts = Vec::new();
    match policy.local_ip {
        Some(ip) => parts.push(format!("address {ip}")),
        None => parts.push("any IPv4 address".to_owned()),
    }
    if let Some(n) = &policy.netdev {
        parts.push(format!("netdev {n}"));
    }
    parts.push(if policy.allow_roce_v1 {
        "RoCE v2 or v1".to_owned()
    } else {
        "RoCE v2".to_owned()
    });
    parts.join(", ")
}

/// The `ROCEBUS_GID_INDEX` environment variable, if set to a number: the
/// override the guests and benchmarks use when no config names an index.
pub fn env_gid_index() -> Option<u32> {
    std::env::var("ROCEBUS_GID_INDEX")
        .ok()
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests;
