//! The transport settings and the GID chosen, as `rocebus stat` lines: a
//! service that has a counters file publishes them next to its own. Every
//! service goes through here (feed handler, order gateway, engines,
//! `rocebus record`), so the lines and the start-up log read the same.

use std::net::IpAddr;

use crate::counters::{AllocateCounter, Counter, CountersError, Kind};
pub use crate::verbs::LocalGid;
use crate::verbs::{registered_memory, UdClass, VerbsError};

/// Gauges in a counters file: the GID (index, and a label naming the GID,
/// its type and netdev), the port's MTU, the traffic class and service
/// level, and this process's registered memory (updated by
/// [`update`](Self::update)).
#[derive(Debug)]
pub struct RdmaCountersExport {
    registered: Counter,
    huge: Counter,
    fallbacks: Counter,
    _fixed: Vec<Counter>,
}

impl RdmaCountersExport {
    /// The lines of a service bound to `local_ip` (a listener's or
    /// publisher's address, a subscriber's `--local`): the GID it sends from
    /// is the port's RoCE v2 entry holding the address, or entry
    /// `class.gid_index` when set ([`cm::local_gid`](crate::verbs::cm::local_gid)).
    /// `what` names the path in the log line (`"bus"`, `"engine listener"`).
    pub fn for_address(
        table: &impl AllocateCounter,
        prefix: &str,
        class: UdClass,
        local_ip: IpAddr,
        what: &str,
    ) -> Result<Self, CountersError> {
        let gid = crate::verbs::cm::local_gid(local_ip, class.gid_index);
        Self::logged(table, prefix, class, gid, what)
    }

    /// The lines of `gid`, logged once as `what`'s GID (with its MTU); a GID
    /// that could not be read is a warning and leaves the GID lines out:
    /// whatever path it describes is already up, so the service runs.
    pub fn logged(
        table: &impl AllocateCounter,
        prefix: &str,
        class: UdClass,
        gid: Result<LocalGid, VerbsError>,
        what: &str,
    ) -> Result<Self, CountersError> {
        let gid = match gid {
            Ok(g) => {
                tracing::info!(gid = %g.choice, active_mtu = g.active_mtu, "{what} GID");
                Some(g)
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the {what}'s GID for rocebus stat");
                None
            }
        };
        Self::new(table, prefix, class, gid.as_ref())
    }

    /// Allocates the gauges under `prefix` (e.g. `rdma`) and sets the fixed
    /// ones: `class`'s traffic class and service level, and `gid`, `None`
    /// when it could not be read (no GID lines then).
    pub fn new(
        table: &impl AllocateCounter,
        prefix: &str,
        class: UdClass,
        gid: Option<&LocalGid>,
    ) -> Result<Self, CountersError> {
        let gauge = |label: String, value: u64| -> Result<Counter, CountersError> {
            let c = table.allocate_counter(&label, Kind::Gauge, 0)?;
            c.set(value);
            Ok(c)
        };
        let mut fixed = vec![
            gauge(
                format!("{prefix}.traffic_class"),
                class.traffic_class.into(),
            )?,
            gauge(
                format!("{prefix}.service_level"),
                class.service_level.into(),
            )?,
        ];
        if let Some(g) = gid {
            let e = &g.choice.entry;
            fixed.push(gauge(format!("{prefix}.gid_index"), e.index.into())?);
            let label = format!(
                "{prefix}.gid {} {} {} {} port {}",
                e.gid,
                e.gid_type,
                e.netdev.as_deref().unwrap_or("-"),
                g.choice.device,
                g.choice.port
            );
            // A label is at most MAX_LABEL_LEN bytes: cut, never fail.
            let label: String = label
                .char_indices()
                .take_while(|(i, c)| i + c.len_utf8() <= crate::counters::MAX_LABEL_LEN)
                .map(|(_, c)| c)
                .collect();
            fixed.push(gauge(label, e.index.into())?);
            fixed.push(gauge(format!("{prefix}.active_mtu"), g.active_mtu.into())?);
        }
        let this = Self {
            registered: gauge(format!("{prefix}.registered_bytes"), 0)?,
            huge: gauge(format!("{prefix}.hugepage_bytes"), 0)?,
            fallbacks: gauge(format!("{prefix}.hugepage_fallbacks"), 0)?,
            _fixed: fixed,
        };
        this.update();
        Ok(this)
    }

    /// Sets the registered memory gauges from the process's totals.
    pub fn update(&self) {
        let m = registered_memory();
        self.registered.set(m.bytes);
        self.huge.set(m.huge_page_bytes);
        self.fallbacks.set(m.huge_page_fallbacks);
    }
}
