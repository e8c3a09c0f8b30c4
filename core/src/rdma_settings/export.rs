//! The transport settings and the GID chosen, as `rocebus stat` lines: a
//! service that has a counters file publishes them next to its own.

use super::RdmaSettings;
use crate::counters::{Counter, CountersError, CountersFile, Kind};
use crate::verbs::registered_memory;
pub use crate::verbs::LocalGid;

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
    /// Allocates the gauges under `prefix` (e.g. `rdma`) and sets the fixed
    /// ones; `gid` is `None` when it could not be read (no GID lines then).
    pub fn new(
        file: &CountersFile,
        prefix: &str,
        settings: &RdmaSettings,
        gid: Option<&LocalGid>,
    ) -> Result<Self, CountersError> {
        let gauge = |label: String, value: u64| -> Result<Counter, CountersError> {
            let c = file.allocate_with(&label, Kind::Gauge, 0)?;
            c.set(value);
            Ok(c)
        };
        let mut fixed = vec![
            gauge(
                format!("{prefix}.traffic_class"),
                settings.traffic_class.into(),
            )?,
            gauge(
                format!("{prefix}.service_level"),
                settings.service_level.into(),
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
