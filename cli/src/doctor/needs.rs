//! What the configs given to `rocebus doctor` ask of the host, read from their TOML
//! without knowing each service's schema (a feed handler's, a gateway's, an engine's and a
//! bare market-data file all qualify): the cores threads are pinned to (`core`, `cores`),
//! the addresses services bind or connect from (`listen`, `local_ip`, `addr`, `bind`), the
//! ring bytes they register (`ring_size`, `max_peer_ring_size`, `ring_bytes`) and the RoCE
//! traffic class (`traffic_class`, as the `[rdma]` table names it).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use anyhow::Context as _;

/// One value found, with where: `FILE: table.key`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<T> {
    /// The value.
    pub value: T,
    /// `FILE: table.key`, for the report.
    pub origin: String,
}

/// What the configs need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// Cores threads are pinned to.
    pub pinned: Vec<Found<usize>>,
    /// Local addresses (loopback and unspecified ones left out: they need no RDMA device).
    pub addrs: Vec<Found<IpAddr>>,
    /// Bytes of ring memory the configs name: a lower bound of what the services register
    /// (each ring is registered at least once; queue pairs, staging and a gateway's
    /// per-engine rings come on top).
    pub ring_bytes: u64,
    /// The traffic class (`DSCP << 2 | ECN`) asked for, if any config names one.
    pub traffic_class: Option<Found<u8>>,
}

impl Needs {
    /// Reads every config in `paths`.
    pub fn read(paths: &[impl AsRef<Path>]) -> anyhow::Result<Needs> {
        let mut needs = Needs::default();
        for p in paths {
            let p = p.as_ref();
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read config {}", p.display()))?;
            let value: toml::Value = toml::from_str(&text)
                .with_context(|| format!("config {} is not valid TOML", p.display()))?;
            needs.add(&p.display().to_string(), &value);
        }
        Ok(needs)
    }

    /// Adds what one parsed config asks for (`file` names it in the report).
    pub fn add(&mut self, file: &str, value: &toml::Value) {
        walk(self, file, "", value);
    }
}

fn walk(needs: &mut Needs, file: &str, at: &str, value: &toml::Value) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                leaf(needs, file, &key, k, v);
                walk(needs, file, &key, v);
            }
        }
        toml::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                walk(needs, file, &format!("{at}[{i}]"), v);
            }
        }
        _ => {}
    }
}

fn leaf(needs: &mut Needs, file: &str, key: &str, name: &str, v: &toml::Value) {
    let origin = || format!("{file}: {key}");
    match (name, v) {
        ("core", toml::Value::Integer(c)) => {
            if let Ok(c) = usize::try_from(*c) {
                needs.pinned.push(Found {
                    value: c,
                    origin: origin(),
                });
            }
        }
        ("cores", toml::Value::Array(a)) => {
            for c in a.iter().filter_map(toml::Value::as_integer) {
                if let Ok(c) = usize::try_from(c) {
                    needs.pinned.push(Found {
                        value: c,
                        origin: origin(),
                    });
                }
            }
        }
        ("listen" | "local_ip" | "addr" | "bind", toml::Value::String(s)) => {
            let ip = s
                .parse::<IpAddr>()
                .ok()
                .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()));
            if let Some(ip) = ip.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) {
                if !needs.addrs.iter().any(|a| a.value == ip) {
                    needs.addrs.push(Found {
                        value: ip,
                        origin: origin(),
                    });
                }
            }
        }
        ("ring_size" | "max_peer_ring_size" | "ring_bytes", toml::Value::Integer(n)) => {
            needs.ring_bytes = needs
                .ring_bytes
                .saturating_add(u64::try_from(*n).unwrap_or(0));
        }
        ("traffic_class", toml::Value::Integer(n)) => {
            if let Ok(tc) = u8::try_from(*n) {
                needs.traffic_class = Some(Found {
                    value: tc,
                    origin: origin(),
                });
            }
        }
        _ => {}
    }
}
