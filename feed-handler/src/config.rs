//! The feed handler's TOML configuration (`configs/feed-handler.toml`).
//!
//! Owns parsing and validation only; the service (`run`) wires it to sockets and the bus.
//! Unknown keys are errors, so a misspelt key is never silently ignored.

use crate::moldudp64::{session, GapConfig, SourceAddr, StartPolicy};
use rocebus::idle::IdleStrategy;
use rocebus::ipc::{FlowControl, IpcConfig};
use rocebus::mcast::config::{ConfigError as McastConfigError, McastConfig};
use rocebus::rdma_settings::RdmaSettings;
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole file.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The exchange feed.
    pub feed: FeedConfig,
    /// Gap recovery.
    #[serde(default)]
    pub recovery: RecoveryConfig,
    /// Publishing on the bus.
    pub publish: PublishConfig,
    /// The polling loop.
    #[serde(default)]
    pub service: ServiceConfig,
    /// The rocebus market-data path: one channel per partition of the symbols.
    pub market_data: McastConfig,
    /// The shared-memory streams `publish.ipc_stream` publishes on (absent: the defaults
    /// with `flow = "drop"`).
    #[serde(default)]
    pub ipc: Option<IpcConfig>,
    /// RoCE transport settings (traffic class, service level, RC knobs, GID, huge pages),
    /// applied to `market_data` when the file is parsed.
    #[serde(default)]
    pub rdma: RdmaSettings,
}

/// `[feed]`: where the MoldUDP64 feed arrives and where re-requests go.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FeedConfig {
    /// Multicast group and port, e.g. "239.1.1.1:26477".
    pub group: SocketAddr,
    /// Interface address for the multicast join.
    #[serde(default = "unspecified")]
    pub interface: Ipv4Addr,
    /// Senders the feed is accepted from: IPs (any port) or `ip:port`s. Empty (the
    /// default) accepts any sender, with a warning at start.
    #[serde(default)]
    pub sources: Vec<SourceAddr>,
    /// The MoldUDP64 session to follow (up to 10 ASCII characters); unset follows the
    /// session of the first packet accepted from an allowed sender.
    #[serde(default)]
    pub session: Option<String>,
    /// The exchange's retransmission server; unset gives every gap up at once (announced
    /// on the bus as a feed loss).
    #[serde(default)]
    pub retrans_server: Option<SocketAddr>,
    /// Read this capture instead of the network (relative to the working directory):
    /// BinaryFILE, or a pcap/pcapng capture of the MoldUDP64 feed, either possibly
    /// gzip-compressed (see [`crate::capture`]).
    #[serde(default)]
    pub capture: Option<PathBuf>,
    /// With a packet capture in `capture`: read only UDP datagrams to these destination
    /// ports (empty: every port).
    #[serde(default)]
    pub capture_dst_ports: Vec<u16>,
    /// With a packet capture in `capture`: read only UDP datagrams to these destination
    /// addresses, e.g. the A and B groups (empty: every address).
    #[serde(default)]
    pub capture_dst_addrs: Vec<std::net::IpAddr>,
    /// Receive buffer of the feed socket, bytes (capped by the kernel's
    /// `net.core.rmem_max`; 0 keeps the OS default).
    #[serde(default = "default_recv_buffer")]
    pub recv_buffer_bytes: usize,
}

fn default_recv_buffer() -> usize {
    8 << 20
}

fn unspecified() -> Ipv4Addr {
    Ipv4Addr::UNSPECIFIED
}

/// `[recovery]`: MoldUDP64 re-request tuning.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Wait for a re-request's answer, milliseconds.
    pub retransmit_timeout_ms: u64,
    /// Re-sends before a gap is given up.
    pub max_retries: u32,
    /// Largest count in one re-request.
    pub max_request_count: u16,
    /// Out-of-order bytes kept while a gap is open.
    pub max_buffered_bytes: usize,
    /// Packets starting more than this many messages beyond the highest sequence known
    /// are dropped (a forged or corrupt sequence number must not move the feed).
    pub max_sequence_ahead: u64,
    /// Consecutive, agreeing far-ahead packets after which a jump is accepted as real.
    pub reanchor_packets: u32,
    /// Packets starting more than this many messages beyond the highest sequence known are
    /// an unconfirmed claim: not acted on until the stream corroborates them.
    pub claim_threshold: u64,
    /// Far-ahead packets that must back a claim before it is accepted.
    pub claim_packets: u32,
    /// How long a claim must stand with no new packet of the stream before it is
    /// accepted, milliseconds (keep it above the exchange's heartbeat interval).
    pub claim_timeout_ms: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        let g = GapConfig::default();
        Self {
            retransmit_timeout_ms: g.retransmit_timeout.as_millis() as u64,
            max_retries: g.max_retries,
            max_request_count: g.max_request_count,
            max_buffered_bytes: g.max_buffered_bytes,
            max_sequence_ahead: g.max_sequence_ahead,
            reanchor_packets: g.reanchor_packets,
            claim_threshold: g.claim_threshold,
            claim_packets: g.claim_packets,
            claim_timeout_ms: g.claim_timeout.as_millis() as u64,
        }
    }
}

/// `[publish]`: normalized market data on the bus. Symbols are partitioned by stock
/// locate modulo the number of `[[market_data.channels]]`, in the order listed.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PublishConfig {
    /// Address of the local RDMA device that publishes (and serves recovery).
    pub local_ip: IpAddr,
    /// Bus session id; 0 derives one from the wall clock, so a restart takes a greater one.
    #[serde(default)]
    pub session: u64,
    /// Also publish every normalized message on shared memory for processes on this
    /// host (`rocebus::ipc`): one stream per channel, named `<ipc_stream>.<channel id>`.
    #[serde(default)]
    pub ipc_stream: Option<String>,
}

/// `[service]`: the polling loop.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceConfig {
    /// What the loop does when a pass found no work: `{ kind = "busy_spin" }` on an
    /// isolated core, `{ kind = "yield" }` or `{ kind = "backoff", ... }` on shared ones.
    pub idle: IdleStrategy,
    /// Pin the loop to this core.
    pub core: Option<usize>,
    /// Log lines about bad input allowed per second (the rest are only counted).
    pub bad_input_log_per_sec: u32,
    /// How often the shared-memory counters are refreshed, milliseconds.
    pub counters_interval_ms: u64,
    /// After the feed ended, keep serving bus recovery until no subscriber is connected,
    /// or until no recovery request came for this long, milliseconds.
    pub linger_ms: u64,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            idle: IdleStrategy::BusySpin,
            core: None,
            bad_input_log_per_sec: 10,
            counters_interval_ms: 10,
            linger_ms: 5000,
        }
    }
}

/// Why a configuration could not be loaded; always names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid, has an unknown key or a bad value (the message names the key).
    #[error("invalid config {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Cause, naming the key and line.
        #[source]
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("invalid config {path}: {key}: {reason}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The key, e.g. `market_data.channels[0].line_a`.
        key: String,
        /// What is wrong.
        reason: String,
    },
}

impl Config {
    /// Parses TOML text; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let mut c: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        c.rdma.apply_to_mcast(&mut c.market_data);
        let invalid = |key: &str, reason: &str| ConfigError::Invalid {
            path: path.into(),
            key: key.into(),
            reason: reason.into(),
        };
        if c.recovery.max_request_count == 0 {
            return Err(invalid("recovery.max_request_count", "must be at least 1"));
        }
        if c.recovery.retransmit_timeout_ms == 0 {
            return Err(invalid(
                "recovery.retransmit_timeout_ms",
                "must be at least 1",
            ));
        }
        if let Some(s) = &c.feed.session {
            if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    "feed.session",
                    "must be 1 to 10 printable ASCII characters",
                ));
            }
        }
        if c.recovery.reanchor_packets == 0 {
            return Err(invalid("recovery.reanchor_packets", "must be at least 1"));
        }
        if c.recovery.claim_packets == 0 {
            return Err(invalid("recovery.claim_packets", "must be at least 1"));
        }
        if c.recovery.max_sequence_ahead == 0 {
            return Err(invalid("recovery.max_sequence_ahead", "must be at least 1"));
        }
        if !matches!(c.feed.group, SocketAddr::V4(_)) {
            return Err(invalid("feed.group", "must be an IPv4 address"));
        }
        if c.service.counters_interval_ms == 0 {
            return Err(invalid(
                "service.counters_interval_ms",
                "must be at least 1",
            ));
        }
        if c.market_data.channels.len() > usize::from(u16::MAX) {
            return Err(invalid("market_data.channels", "too many channels"));
        }
        if let Some(name) = &c.publish.ipc_stream {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                return Err(invalid(
                    "publish.ipc_stream",
                    "must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-'",
                ));
            }
            let ipc = c.ipc_config();
            if ipc.flow == FlowControl::Block {
                return Err(invalid(
                    "ipc.flow",
                    "the feed handler never waits for a subscriber: use \"drop\" (a \
                     subscriber a ring behind is dropped and told so)",
                ));
            }
            ipc.validate().map_err(|e| invalid("ipc", &e.to_string()))?;
        } else if c.ipc.is_some() {
            return Err(invalid(
                "ipc",
                "set publish.ipc_stream to publish on shared memory (or remove [ipc])",
            ));
        }
        c.market_data.validate().map_err(|e| match e {
            McastConfigError::Invalid { key, reason } => ConfigError::Invalid {
                path: path.into(),
                key: format!("market_data.{key}"),
                reason,
            },
            other => invalid("market_data", &other.to_string()),
        })?;
        Ok(c)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// As tracker configuration, recovering the session from sequence 1 (`retransmission`
    /// follows `feed.retrans_server`).
    pub fn gap_config(&self) -> GapConfig {
        let r = &self.recovery;
        GapConfig {
            start: StartPolicy::Sequence(1),
            session: self.feed.session.as_deref().map(session),
            retransmission: self.feed.retrans_server.is_some(),
            retransmit_timeout: Duration::from_millis(r.retransmit_timeout_ms),
            max_retries: r.max_retries,
            max_request_count: r.max_request_count,
            max_buffered_bytes: r.max_buffered_bytes,
            max_sequence_ahead: r.max_sequence_ahead,
            reanchor_packets: r.reanchor_packets,
            claim_threshold: r.claim_threshold,
            claim_packets: r.claim_packets,
            claim_timeout: Duration::from_millis(r.claim_timeout_ms),
        }
    }

    /// The shared-memory streams' configuration: `[ipc]`, or the defaults with
    /// `flow = "drop"` when it is absent.
    pub fn ipc_config(&self) -> IpcConfig {
        self.ipc.clone().unwrap_or(IpcConfig {
            flow: FlowControl::Drop,
            ..IpcConfig::default()
        })
    }

    /// Partitions of the symbols: one per market-data channel.
    pub fn partitions(&self) -> u16 {
        self.market_data.channels.len() as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = "[feed]\ngroup = \"239.1.1.1:1\"\nretrans_server = \"127.0.0.1:2\"\n\
        [publish]\nlocal_ip = \"10.0.0.1\"\n\
        [[market_data.channels]]\nid = 1\nname = \"a\"\nline_a = \"239.2.0.1\"\nport = 7600\n";

    #[test]
    fn example_config_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/feed-handler.toml");
        let c = Config::load(&p).expect("example config is valid");
        assert!(c.feed.group.ip().is_multicast());
        assert!(c.partitions() >= 1);
        assert_eq!(c.market_data.rdma, c.rdma, "[rdma] reaches the bus");
        assert_eq!(c.rdma.traffic_class, 106);
    }

    #[test]
    fn rdma_table_reaches_the_bus_and_bad_values_name_the_key() {
        let c = Config::parse(
            &format!("{MINIMAL}[rdma]\ntraffic_class = 138\ngid_index = 3\n"),
            Path::new("z"),
        )
        .unwrap();
        assert_eq!(c.market_data.rdma.traffic_class, 138);
        assert_eq!(c.market_data.rdma.ud_class().gid_index, Some(3));
        let e = Config::parse(
            &format!("{MINIMAL}[rdma]\nservice_level = 16\n"),
            Path::new("z"),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rdma.service_level 16"), "{e}");
    }

    #[test]
    fn ipc_output_is_checked() {
        let key = |text: &str| match Config::parse(text, Path::new("z")) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("expected an invalid key, got {other:?}"),
        };
        let c = Config::parse(MINIMAL, Path::new("z")).unwrap();
        assert_eq!(c.publish.ipc_stream, None);
        let with = MINIMAL.replace(
            "local_ip = \"10.0.0.1\"\n",
            "local_ip = \"10.0.0.1\"\nipc_stream = \"md\"\n",
        );
        let c = Config::parse(&with, Path::new("z")).expect("ipc_stream alone");
        assert_eq!(c.publish.ipc_stream.as_deref(), Some("md"));
        assert_eq!(c.ipc_config().flow, FlowControl::Drop, "drop by default");
        let block = format!("{with}[ipc]\nring_bytes = 262144\n");
        assert_eq!(
            key(&block),
            "ipc.flow",
            "block (the [ipc] default) is refused"
        );
        let drop = format!("{with}[ipc]\nflow = \"drop\"\nring_bytes = 262144\n");
        let c = Config::parse(&drop, Path::new("z")).expect("drop");
        assert_eq!(c.ipc_config().ring_bytes, 262144);
        let small = format!("{with}[ipc]\nflow = \"drop\"\nring_bytes = 1000\n");
        assert_eq!(key(&small), "ipc");
        assert_eq!(
            key(&with.replace("\"md\"", "\"a/b\"")),
            "publish.ipc_stream"
        );
        assert_eq!(key(&with.replace("\"md\"", "\"\"")), "publish.ipc_stream");
        assert_eq!(key(&format!("{MINIMAL}[ipc]\nflow = \"drop\"\n")), "ipc");
    }

    #[test]
    fn minimal_config_takes_defaults() {
        let c = Config::parse(MINIMAL, Path::new("z")).expect("defaults");
        assert_eq!(c.recovery, RecoveryConfig::default());
        assert_eq!(c.service, ServiceConfig::default());
        assert_eq!((c.partitions(), c.publish.session), (1, 0));
        assert_eq!(c.feed.capture, None);
    }

    #[test]
    fn ingress_keys_parse_and_are_checked() {
        let c = Config::parse(MINIMAL, Path::new("z")).expect("defaults");
        assert!(c.feed.sources.is_empty() && c.feed.session.is_none());
        assert!(c.gap_config().retransmission && c.gap_config().session.is_none());
        let text = MINIMAL.replace(
            "retrans_server = \"127.0.0.1:2\"\n",
            "sources = [\"10.0.0.1\", \"10.0.0.2:26477\"]\nsession = \"000000001A\"\n",
        );
        let c = Config::parse(&text, Path::new("z")).expect("sources");
        assert_eq!(
            c.feed.sources,
            [
                SourceAddr::Ip("10.0.0.1".parse().unwrap()),
                SourceAddr::Exact("10.0.0.2:26477".parse().unwrap())
            ]
        );
        let g = c.gap_config();
        assert_eq!(g.session, Some(*b"000000001A"));
        assert!(!g.retransmission, "no retrans_server: gaps are given up");
        let msg = Config::parse(
            &MINIMAL.replace("[publish]", "sources = [\"exchange\"]\n[publish]"),
            Path::new("s.toml"),
        )
        .expect_err("bad source")
        .to_string();
        assert!(
            msg.contains("s.toml") && msg.contains("\"exchange\""),
            "{msg}"
        );
        let e = Config::parse(
            &MINIMAL.replace("[publish]", "session = \"ELEVEN_CHARS\"\n[publish]"),
            Path::new("t.toml"),
        )
        .expect_err("long session");
        assert_eq!(
            e.to_string(),
            "invalid config t.toml: feed.session: must be 1 to 10 printable ASCII characters"
        );
        let e = Config::parse(
            &format!("[recovery]\nreanchor_packets = 0\n{MINIMAL}"),
            Path::new("r.toml"),
        )
        .expect_err("zero");
        assert_eq!(
            e.to_string(),
            "invalid config r.toml: recovery.reanchor_packets: must be at least 1"
        );
    }

    #[test]
    fn errors_name_the_file_and_key() {
        let e = Config::parse(
            &MINIMAL.replace("[publish]", "gropu = 1\n[publish]"),
            Path::new("x.toml"),
        )
        .expect_err("unknown key");
        let msg = e.to_string();
        assert!(msg.contains("x.toml") && msg.contains("gropu"), "{msg}");
        let e = Config::parse(
            &MINIMAL.replace("239.2.0.1", "10.2.0.1"),
            Path::new("y.toml"),
        )
        .expect_err("unicast line");
        assert_eq!(
            e.to_string(),
            "invalid config y.toml: market_data.channels[0].line_a: 10.2.0.1 is not multicast"
        );
        let e = Config::parse(
            &format!("[recovery]\nmax_request_count = 0\n{MINIMAL}"),
            Path::new("w.toml"),
        )
        .expect_err("zero count");
        assert_eq!(
            e.to_string(),
            "invalid config w.toml: recovery.max_request_count: must be at least 1"
        );
        let text = MINIMAL.replace(
            "retrans_server",
            "[service]\ncore = 1\nidle = { kind = \"nap\" }\n[feed2]\nretrans_server",
        );
        let msg = Config::parse(&text, Path::new("v.toml"))
            .expect_err("bad")
            .to_string();
        assert!(msg.contains("v.toml"), "{msg}");
        let msg = Config::parse(
            &MINIMAL.replace("local_ip", "local_ipp"),
            Path::new("u.toml"),
        )
        .expect_err("misspelt")
        .to_string();
        assert!(msg.contains("u.toml") && msg.contains("local_ipp"), "{msg}");
    }
}
