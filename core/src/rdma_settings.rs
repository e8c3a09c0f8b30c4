//! [`RdmaSettings`]: the `[rdma]` table every service's configuration
//! shares (feed handler, gateway, engines, `rocebus record`): how this host's
//! RoCE traffic is marked and paced on the fabric. One struct for all of
//! them, applied at set-up only: to RC queue pairs (rdma_cm's
//! `RDMA_OPTION_ID_TOS` and the QP's address vector) and to UD address
//! handles (multicast included). Nothing here touches a device; the values
//! reach the verbs layer through [`RcOptions`] and [`UdClass`].
//!
//! The defaults are what a RoCE v2 fabric configured the usual way expects:
//! traffic class 106 (DSCP 26 with ECN-capable transport ECT(0), UCX's
//! default on RoCE v2 and the DSCP most vendors' lossless RoCE profiles map
//! to the PFC priority), service level 0, and the transport knobs of
//! [`RcOptions::default`].

use crate::mcast::config::McastConfig;
use crate::orders::OrdersConfig;
use crate::verbs::{Mtu, RcOptions, UdClass};
use serde::Deserialize;

/// The default traffic class: DSCP 26 (`26 << 2`) with ECN ECT(0) (`0b10`).
pub const DEFAULT_TRAFFIC_CLASS: u8 = (26 << 2) | 0b10;

/// The default `max_inline` of every path (orders, multicast sends, recovery and RC
/// fan-out connections): sends up to 220 bytes are posted inline (copied into the work
/// request at post time), so a latency-bound sender's small message costs the device no
/// memory-region lookup or DMA read; 220 B fits every RoCE device's UD and RC inline limit.
pub const DEFAULT_MAX_INLINE: u32 = 220;

/// Largest `max_inline` accepted: above what any RoCE device inlines
/// (ConnectX RC: about 900 bytes; soft-RoCE: 512).
pub const MAX_INLINE_LIMIT: u32 = 1024;

/// Whether ring and staging memory lives on 2 MiB huge pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HugePages {
    /// Huge pages when the kernel has free ones; else 4 KiB pages, logged.
    #[default]
    Auto,
    /// Huge pages or a start-up error.
    On,
    /// Never: 4 KiB pages.
    Off,
}

/// The `[rdma]` table: transport settings applied to every queue pair and
/// address handle a service sets up. `None` keeps the path's own value (for
/// example `[service.orders.rc] timeout`), so existing configs keep working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "RdmaToml")]
pub struct RdmaSettings {
    /// IP traffic class of every RoCE v2 packet: DSCP in the upper six bits,
    /// ECN in the lower two (`dscp << 2 | ecn`).
    pub traffic_class: u8,
    /// Service level (0..=15): the 802.1p priority where the NIC maps SL to
    /// priority (VLAN-tagged RoCE); ignored by DSCP-trusting fabrics.
    pub service_level: u8,
    /// Path MTU of RC queue pairs (never above the port's active MTU).
    pub path_mtu: Option<Mtu>,
    /// RC local ACK timeout exponent (0..=31): 4.096 us x 2^ack_timeout.
    pub ack_timeout: Option<u8>,
    /// RC transport retries before the QP fails (0..=7).
    pub retry_count: Option<u8>,
    /// RC receiver-not-ready retries (0..=7, 7 = for ever).
    pub rnr_retry: Option<u8>,
    /// Largest send posted inline (bytes), 32..=1024: orders, multicast datagrams, recovery
    /// and RC fan-out connections alike.
    pub max_inline: Option<u32>,
    /// Ring and staging memory on huge pages.
    pub hugepages: HugePages,
    /// Source GID index of RC connections and UD (multicast) sends; `None`
    /// lets rdma_cm pick the entry of the bound address. Checked against the
    /// port's GID table (a used RoCE v2 entry holding the bound address).
    pub gid_index: Option<u8>,
}

impl Default for RdmaSettings {
    fn default() -> Self {
        Self {
            traffic_class: DEFAULT_TRAFFIC_CLASS,
            service_level: 0,
            path_mtu: None,
            ack_timeout: None,
            retry_count: None,
            rnr_retry: None,
            max_inline: None,
            hugepages: HugePages::Auto,
            gid_index: None,
        }
    }
}

/// An invalid `[rdma]` value: the message names the key and the range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RdmaSettingsError {
    /// ECN bits 11 (Congestion Experienced) are set by switches, never by a sender.
    #[error(
        "rdma.traffic_class {0}: ECN bits 11 (Congestion Experienced) are for switches to set; \
         use dscp << 2 | 2 (ECT(0)), e.g. 106 for DSCP 26"
    )]
    TrafficClassCongestion(u32),
    /// Traffic class above 255.
    #[error("rdma.traffic_class {0} does not fit the 8-bit IP traffic class (0..=255)")]
    TrafficClassRange(u32),
    /// Service level above 15.
    #[error("rdma.service_level {0} is out of range 0..=15")]
    ServiceLevel(u32),
    /// A path MTU RoCE does not have.
    #[error("rdma.path_mtu {0} is not one of 256, 512, 1024, 2048, 4096")]
    PathMtu(u32),
    /// ACK timeout exponent above 31.
    #[error("rdma.ack_timeout {0} is out of range 0..=31 (4.096 us x 2^ack_timeout)")]
    AckTimeout(u32),
    /// Retry count above 7.
    #[error("rdma.retry_count {0} is out of range 0..=7")]
    RetryCount(u32),
    /// RNR retry above 7.
    #[error("rdma.rnr_retry {0} is out of range 0..=7 (7 retries for ever)")]
    RnrRetry(u32),
    /// Inline size above [`MAX_INLINE_LIMIT`], or below the handshake proof's length.
    #[error(
        "rdma.max_inline {0} is out of range {min}..={MAX_INLINE_LIMIT} bytes: the handshake \
         proof ({min} bytes) is sent inline, and no RoCE device inlines more than {MAX_INLINE_LIMIT}",
        min = crate::ring::frame::PROOF_LEN
    )]
    MaxInline(u32),
    /// GID index above 255.
    #[error("rdma.gid_index {0} is out of range 0..=255")]
    GidIndex(u32),
}

/// The table as written, before the checks.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RdmaToml {
    traffic_class: u32,
    service_level: u32,
    path_mtu: Option<u32>,
    ack_timeout: Option<u32>,
    retry_count: Option<u32>,
    rnr_retry: Option<u32>,
    max_inline: Option<u32>,
    hugepages: HugePages,
    gid_index: Option<u32>,
}

impl Default for RdmaToml {
    fn default() -> Self {
        let d = RdmaSettings::default();
        Self {
            traffic_class: d.traffic_class.into(),
            service_level: d.service_level.into(),
            path_mtu: None,
            ack_timeout: None,
            retry_count: None,
            rnr_retry: None,
            max_inline: None,
            hugepages: d.hugepages,
            gid_index: None,
        }
    }
}

fn in_range<E>(v: Option<u32>, max: u32, err: fn(u32) -> E) -> Result<Option<u8>, E> {
    match v {
        Some(v) if v > max => Err(err(v)),
        Some(v) => Ok(Some(v as u8)),
        None => Ok(None),
    }
}

impl TryFrom<RdmaToml> for RdmaSettings {
    type Error = RdmaSettingsError;
    fn try_from(t: RdmaToml) -> Result<Self, Self::Error> {
        use RdmaSettingsError as E;
        let traffic_class =
            u8::try_from(t.traffic_class).map_err(|_| E::TrafficClassRange(t.traffic_class))?;
        if traffic_class & 0b11 == 0b11 {
            return Err(E::TrafficClassCongestion(t.traffic_class));
        }
        let service_level = in_range(Some(t.service_level), 15, E::ServiceLevel)?.unwrap_or(0);
        let path_mtu = match t.path_mtu {
            None => None,
            Some(b) => match b {
                256 | 512 | 1024 | 2048 | 4096 => Some(Mtu::from_bytes(b)),
                _ => return Err(E::PathMtu(b)),
            },
        };
        if let Some(m) = t
            .max_inline
            .filter(|&m| m > MAX_INLINE_LIMIT || (m as usize) < crate::ring::frame::PROOF_LEN)
        {
            return Err(E::MaxInline(m));
        }
        Ok(Self {
            traffic_class,
            service_level,
            path_mtu,
            ack_timeout: in_range(t.ack_timeout, 31, E::AckTimeout)?,
            retry_count: in_range(t.retry_count, 7, E::RetryCount)?,
            rnr_retry: in_range(t.rnr_retry, 7, E::RnrRetry)?,
            max_inline: t.max_inline,
            hugepages: t.hugepages,
            gid_index: in_range(t.gid_index, 255, E::GidIndex)?,
        })
    }
}

impl RdmaSettings {
    /// `base` (a path's own RC options) with these settings applied: the
    /// traffic class and service level always, the other keys where set.
    pub fn rc_options(&self, base: RcOptions) -> RcOptions {
        RcOptions {
            path_mtu: self.path_mtu.or(base.path_mtu),
            timeout: self.ack_timeout.unwrap_or(base.timeout),
            retry_count: self.retry_count.unwrap_or(base.retry_count),
            rnr_retry: self.rnr_retry.unwrap_or(base.rnr_retry),
            gid_index: self.gid_index.or(base.gid_index),
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            ..base
        }
    }

    /// Applies these settings to an orders path's configuration (its RC
    /// options and inline size); call once, after loading it.
    pub fn apply_to_orders(&self, orders: &mut OrdersConfig) {
        orders.rc = self.rc_options(orders.rc);
        if let Some(m) = self.max_inline {
            orders.max_inline = m;
        }
    }

    /// Applies these settings to a market-data configuration (multicast
    /// sends, the recovery and RC fan-out connections).
    pub fn apply_to_mcast(&self, md: &mut McastConfig) {
        md.rdma = *self;
    }

    /// What UD address handles (multicast sends) carry.
    pub fn ud_class(&self) -> UdClass {
        UdClass {
            traffic_class: self.traffic_class,
            service_level: self.service_level,
            gid_index: self.gid_index,
        }
    }

    /// The DSCP (upper six bits of the traffic class).
    pub fn dscp(&self) -> u8 {
        self.traffic_class >> 2
    }

    /// The ECN bits (lower two bits of the traffic class).
    pub fn ecn(&self) -> u8 {
        self.traffic_class & 0b11
    }

    /// Reads the top-level `[rdma]` table of a whole configuration file
    /// (absent: the defaults), for loaders that parse the rest themselves.
    pub fn from_table(table: &toml::Table) -> Result<Self, toml::de::Error> {
        match table.get("rdma") {
            Some(v) => v.clone().try_into(),
            None => Ok(Self::default()),
        }
    }
}

/// The `memlock` limit is below what the configured rings pin.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the memlock limit (RLIMIT_MEMLOCK) is {limit} bytes, but the configured rings need at least \
     {needed} bytes of registered (pinned) memory: raise it to {needed} or more (`ulimit -l {kib}` \
     in the shell that starts the service, LimitMEMLOCK={needed} in its systemd unit, or a \
     memlock line in /etc/security/limits.conf), or make the rings smaller"
)]
pub struct MemlockError {
    /// The soft limit, bytes.
    pub limit: u64,
    /// What the configuration pins at least, bytes.
    pub needed: u64,
    /// `needed` in KiB, rounded up (what `ulimit -l` takes).
    pub kib: u64,
}

/// Whether a process whose memlock soft limit is `limit` (`None`:
/// unlimited), holding `CAP_IPC_LOCK` or not, can pin `needed` bytes.
pub fn check_memlock(limit: Option<u64>, ipc_lock: bool, needed: u64) -> Result<(), MemlockError> {
    match limit {
        Some(limit) if !ipc_lock && limit < needed => Err(MemlockError {
            limit,
            needed,
            kib: needed.div_ceil(1024),
        }),
        _ => Ok(()),
    }
}

/// What a service checks and sets before it registers any memory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PrepareError {
    /// The memlock limit is too small.
    #[error(transparent)]
    Memlock(#[from] MemlockError),
    /// The limit could not be read.
    #[error("reading the memlock limit (getrlimit) failed")]
    ReadLimit(#[source] std::io::Error),
}

impl RdmaSettings {
    /// Start-up of a service, before it registers memory: sets the process's
    /// huge page policy and checks that the memlock limit covers `needed`
    /// bytes (the service's rings: a lower bound of what it pins), logging
    /// both.
    pub fn prepare_process(&self, needed: u64) -> Result<(), PrepareError> {
        crate::verbs::set_huge_pages(self.hugepages);
        let (limit, ipc_lock) = crate::verbs::memlock_limit().map_err(PrepareError::ReadLimit)?;
        check_memlock(limit, ipc_lock, needed)?;
        tracing::info!(
            hugepages = ?self.hugepages,
            memlock_limit = ?limit,
            cap_ipc_lock = ipc_lock,
            rings_bytes = needed,
            traffic_class = self.traffic_class,
            service_level = self.service_level,
            gid_index = ?self.gid_index,
            "rdma settings"
        );
        Ok(())
    }
}

pub mod export;

#[cfg(test)]
mod tests;
