//! The engine's configuration file (`configs/demo/sample-engine.toml`) and the market-data
//! path configuration it points at. Parsing and validation only; nothing here opens a socket.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rocebus::idle::IdleStrategy;
use rocebus::ipc::IpcConfig;
use rocebus::mcast::config::McastConfig;
use rocebus::rdma_settings::RdmaSettings;
use rocebus_engine::proto::Symbol;
use serde::Deserialize;

/// The engine's configuration file (`configs/demo/sample-engine.toml`). Unknown keys are
/// errors; relative paths are relative to the configuration file's folder.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the order gateway listens and who we are (`account` is required here).
    pub gateway: GatewayConfig,
    /// The market-data bus.
    pub market_data: MarketDataConfig,
    /// What the strategy trades and how often.
    pub strategy: StrategyConfig,
    /// The polling thread.
    #[serde(default)]
    pub engine: LoopConfig,
    /// RoCE transport settings (traffic class, service level, RC knobs, GID, huge pages) of
    /// the gateway connection and the market-data subscription.
    #[serde(default)]
    pub rdma: RdmaSettings,
}

/// `[gateway]`: the engine's gateway table, the one `rocebus_engine` reads for every
/// engine (the example engine and the C ABI too); the demo also requires `account`.
pub use rocebus_engine::config::GatewayConfig;

/// `[market_data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketDataConfig {
    /// Where market data comes from (`transport = "rdma" | "ipc"`, default `"rdma"`).
    #[serde(default)]
    pub transport: Transport,
    /// The market-data path configuration (`McastConfig` TOML), shared with the feed handler.
    /// With [`Transport::Ipc`], also where the stream prefix (`publish.ipc_stream`) and the
    /// streams' folder (`[ipc]`) are read from when it is the feed handler's config.
    pub config: PathBuf,
    /// Channels to subscribe to (default: every channel of `config`).
    #[serde(default)]
    pub channels: Vec<u16>,
    /// With [`Transport::Ipc`]: the streams' prefix, the feed handler's `publish.ipc_stream`
    /// (the stream of channel `id` is `<prefix>.<id>`); default: read from `config`.
    #[serde(default)]
    pub ipc_stream: Option<String>,
    /// Our address on the RDMA device (required with [`Transport::Rdma`]).
    #[serde(default)]
    pub local: Option<IpAddr>,
    /// The feed handler's address, its recovery service (required with [`Transport::Rdma`]).
    #[serde(default)]
    pub publisher: Option<IpAddr>,
    /// The exchange feed's group and port (the feed handler's `feed.group`): the latency
    /// probe watches packets sent there (absent: market-data latency not measured).
    #[serde(default)]
    pub exchange_feed: Option<std::net::SocketAddrV4>,
}

/// How the engine receives market data (`market_data.transport`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum Transport {
    /// The rocebus bus (`MdSubscriber`): on the transport each channel of the feed
    /// handler's configuration names (UD multicast or RC fan-out), with gap recovery and
    /// snapshots, any host on the fabric.
    #[default]
    Rdma,
    /// The feed handler's shared-memory streams (`rocebus::ipc`, its `publish.ipc_stream`):
    /// the feed handler's host only; no recovery (a reader a ring behind loses messages).
    Ipc,
}

impl TryFrom<String> for Transport {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        match s.as_str() {
            "rdma" => Ok(Transport::Rdma),
            "ipc" => Ok(Transport::Ipc),
            other => Err(format!(
                "market_data.transport = {other:?}: must be \"rdma\" (the UD multicast bus) or \
                 \"ipc\" (the feed handler's shared-memory streams, on its host)"
            )),
        }
    }
}

impl std::fmt::Display for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Transport::Rdma => "rdma",
            Transport::Ipc => "ipc",
        })
    }
}

/// `[strategy]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyConfig {
    /// Symbols traded (up to [`MAX_SYMBOLS`]).
    pub symbols: Vec<String>,
    /// Orders per second on the fixed schedule.
    pub orders_per_second: u64,
    /// Shares per order.
    pub quantity: u32,
}

/// `[engine]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopConfig {
    /// Core to pin the polling thread to (absent: not pinned). A core the thread cannot be
    /// pinned to stops the engine with the cores it may use.
    #[serde(default)]
    pub core: Option<usize>,
    /// Idle strategy when a pass found no work.
    #[serde(default)]
    pub idle: IdleStrategy,
}

/// Most symbols one engine trades (the quote table is a fixed array, searched linearly).
pub const MAX_SYMBOLS: usize = 64;

/// A configuration file that cannot be used; the message names the file, the key and the
/// problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not TOML, or unknown, missing or mistyped keys (toml's message names the key).
    #[error("config {path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// toml's description, with the key and line.
        message: String,
    },
    /// A value parses but cannot be used.
    #[error("config {path}: {key}: {problem}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// Dotted key.
        key: &'static str,
        /// What is wrong.
        problem: String,
    },
}

impl EngineConfig {
    /// Reads, parses and validates `path`; relative paths inside are made relative to its
    /// folder.
    pub fn load(path: &Path) -> Result<EngineConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut cfg = EngineConfig::parse(&text).map_err(|e| match e {
            ParseError::Toml(message) => ConfigError::Parse {
                path: path.to_owned(),
                message,
            },
            ParseError::Invalid(key, problem) => ConfigError::Invalid {
                path: path.to_owned(),
                key,
                problem,
            },
        })?;
        if cfg.market_data.config.is_relative() {
            let dir = path.parent().unwrap_or(Path::new("."));
            cfg.market_data.config = dir.join(&cfg.market_data.config);
        }
        Ok(cfg)
    }

    fn parse(text: &str) -> Result<EngineConfig, ParseError> {
        let mut cfg: EngineConfig =
            toml::from_str(text).map_err(|e| ParseError::Toml(e.to_string()))?;
        cfg.gateway = cfg
            .gateway
            .with_rdma(&cfg.rdma)
            .map_err(|e| ParseError::Toml(e.to_string()))?;
        let invalid = |key, problem: &str| Err(ParseError::Invalid(key, problem.to_owned()));
        let s = &cfg.strategy;
        if s.symbols.is_empty() || s.symbols.len() > MAX_SYMBOLS {
            return invalid(
                "strategy.symbols",
                &format!("give 1 to {MAX_SYMBOLS} symbols"),
            );
        }
        if let Some(bad) = s.symbols.iter().find(|s| Symbol::new(s).is_none()) {
            return invalid(
                "strategy.symbols",
                &format!("{bad:?} is not a symbol (1 to 8 printable ASCII characters)"),
            );
        }
        if s.orders_per_second == 0 || s.orders_per_second > 1_000_000 {
            return invalid("strategy.orders_per_second", "must be 1 to 1000000");
        }
        if s.quantity == 0 {
            return invalid("strategy.quantity", "must be at least 1");
        }
        if cfg.gateway.account == 0 {
            return invalid(
                "gateway.account",
                "missing or 0: give an account the gateway grants this engine",
            );
        }
        let md = &cfg.market_data;
        match md.transport {
            Transport::Rdma => {
                if md.local.is_none() {
                    return invalid(
                        "market_data.local",
                        "missing: our address on the RDMA device (transport = \"rdma\")",
                    );
                }
                if md.publisher.is_none() {
                    return invalid(
                        "market_data.publisher",
                        "missing: the feed handler's publish.local_ip (transport = \"rdma\")",
                    );
                }
            }
            Transport::Ipc => {
                if let Some(name) = &md.ipc_stream {
                    if !valid_stream_prefix(name) {
                        return invalid(
                            "market_data.ipc_stream",
                            "must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' or '-' \
                             (the feed handler's publish.ipc_stream)",
                        );
                    }
                }
            }
        }
        Ok(cfg)
    }
}

enum ParseError {
    Toml(String),
    Invalid(&'static str, String),
}

/// The rule of the feed handler's `publish.ipc_stream`.
fn valid_stream_prefix(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Where the feed handler's shared-memory streams are: the stream prefix (the stream of
/// channel `id` is `<prefix>.<id>`) and the streams' configuration (folder, liveness).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcSource {
    /// The feed handler's `publish.ipc_stream`.
    pub prefix: String,
    /// Its `[ipc]` table, or the defaults (`/dev/shm/rocebus-ipc-UID`) when it has none.
    pub config: IpcConfig,
}

impl IpcSource {
    /// The stream of channel `id`, named as the feed handler names it.
    pub fn stream(&self, id: u16) -> String {
        feed_handler::ipcsink::stream_name(&self.prefix, id)
    }
}

/// Reads the shared-memory side of `md.config` (the feed handler's config): its
/// `publish.ipc_stream`, unless `md.ipc_stream` names the prefix, and its `[ipc]` table.
pub fn load_ipc_source(md: &MarketDataConfig) -> anyhow::Result<IpcSource> {
    let path = &md.config;
    let what = || {
        format!(
            "market-data configuration {} (key market_data.config of the engine config)",
            path.display()
        )
    };
    let text = std::fs::read_to_string(path).with_context(what)?;
    let table: toml::Table = toml::from_str(&text).with_context(what)?;
    let published = table
        .get("publish")
        .and_then(|p| p.get("ipc_stream"))
        .and_then(|v| v.as_str());
    let prefix = match (&md.ipc_stream, published) {
        (Some(ours), _) => ours.clone(),
        (None, Some(theirs)) => theirs.to_owned(),
        (None, None) => anyhow::bail!(
            "{}: transport = \"ipc\" needs the streams' prefix: set publish.ipc_stream in the \
             feed handler's config (it then publishes on shared memory), or \
             market_data.ipc_stream in the engine's",
            what()
        ),
    };
    anyhow::ensure!(
        valid_stream_prefix(&prefix),
        "{}: publish.ipc_stream {prefix:?} is not a stream prefix",
        what()
    );
    let config = match table.get("ipc") {
        Some(v) => v.clone().try_into::<IpcConfig>().with_context(what)?,
        None => IpcConfig::default(),
    };
    config.validate().with_context(what)?;
    Ok(IpcSource { prefix, config })
}

/// Loads the market-data path configuration from `path`: a `McastConfig` file, or any file
/// with a `[market_data]` table holding one (the feed handler's config).
pub fn load_market_data(path: &Path) -> anyhow::Result<McastConfig> {
    let what = || {
        format!(
            "market-data configuration {} (key market_data.config of the engine config)",
            path.display()
        )
    };
    let text = std::fs::read_to_string(path).with_context(what)?;
    let mut table: toml::Table = toml::from_str(&text).with_context(what)?;
    let cfg: McastConfig = match table.remove("market_data") {
        Some(v) => McastConfig::from_value(v),
        None => McastConfig::from_value(toml::Value::Table(table)),
    }
    .with_context(what)?;
    cfg.validate().with_context(what)?;
    Ok(cfg)
}
#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A valid engine file (its market data in `md.toml` beside it).
    pub(crate) const GOOD: &str = r#"
[gateway]
addr = "198.18.0.1:7470"
engine_id = 1
engine_token = "e"
account = 1
[gateway.orders]
token = "t"

[market_data]
config = "md.toml"
local = "198.18.0.1"
publisher = "198.18.0.1"

[strategy]
symbols = ["A", "B"]
orders_per_second = 100
quantity = 100
"#;

    #[test]
    fn config_errors_name_file_key_and_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            EngineConfig::load(&path)
        };
        let cfg = load(GOOD).unwrap();
        assert_eq!(cfg.market_data.config, dir.path().join("md.toml"));
        let e = load(&GOOD.replace("quantity = 100", "quantity = 0"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("engine.toml") && e.contains("strategy.quantity"),
            "{e}"
        );
        let e = load(&GOOD.replace("quantity = 100", "quantity = 100\nqty = 3"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("engine.toml") && e.contains("qty"), "{e}");
        let e = load(&GOOD.replace("\"B\"", "\"TOO-LONG-SYM\""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("strategy.symbols") && e.contains("TOO-LONG-SYM"),
            "{e}"
        );
        let e = load(&GOOD.replace("token = \"t\"", "token = \"\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("gateway.orders.token"), "{e}");
        let e = load(&GOOD.replace("account = 1\n", ""))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("engine.toml") && e.contains("gateway.account"),
            "{e}"
        );
        let e = EngineConfig::load(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing.toml"), "{e}");
    }

    #[test]
    fn market_data_config_comes_from_the_feed_handlers_table_or_a_plain_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let fh = load_market_data(&root.join("configs/demo/feed-handler.toml")).unwrap();
        assert_eq!(fh.channels.iter().map(|c| c.id).collect::<Vec<_>>(), [1, 2]);
        let plain = load_market_data(&root.join("configs/md.toml")).unwrap();
        assert!(!plain.channels.is_empty());
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "[market_data]\nmax_datagram_payload = 1\n").unwrap();
        let e = format!("{:#}", load_market_data(&bad).unwrap_err());
        assert!(e.contains("bad.toml"), "{e}");
    }

    #[test]
    fn transport_is_rdma_by_default_ipc_on_request_and_anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engine.toml");
        let load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            EngineConfig::load(&path)
        };
        let md = "[market_data]\n";
        assert_eq!(load(GOOD).unwrap().market_data.transport, Transport::Rdma);
        let rdma = GOOD.replace(md, "[market_data]\ntransport = \"rdma\"\n");
        assert_eq!(load(&rdma).unwrap().market_data.transport, Transport::Rdma);
        let ipc = GOOD.replace(md, "[market_data]\ntransport = \"ipc\"\n");
        assert_eq!(load(&ipc).unwrap().market_data.transport, Transport::Ipc);
        for bad in ["\"RDMA\"", "\"shm\"", "\"\"", "1"] {
            let text = GOOD.replace(md, &format!("[market_data]\ntransport = {bad}\n"));
            let e = load(&text).unwrap_err().to_string();
            assert!(e.contains("engine.toml"), "{bad}: {e}");
            if bad == "1" {
                // Not a string: toml's own message, which quotes the line.
                assert!(e.contains("transport = 1"), "{e}");
            } else {
                assert!(e.contains("market_data.transport"), "{bad}: {e}");
                assert!(
                    e.contains("\"rdma\"") && e.contains("\"ipc\""),
                    "{bad}: {e}"
                );
            }
        }
        // The bus needs our address and the publisher's; shared memory does not.
        for key in ["local", "publisher"] {
            let line = format!("{key} = \"198.18.0.1\"\n");
            let e = load(&GOOD.replace(&line, "")).unwrap_err().to_string();
            assert!(e.contains(&format!("market_data.{key}")), "{e}");
            let ipc = ipc.replace(&line, "");
            assert!(load(&ipc).is_ok(), "{key} is not needed with ipc");
        }
        let e = load(&ipc.replace(md, "[market_data]\nipc_stream = \"a/b\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("market_data.ipc_stream"), "{e}");
    }

    #[test]
    fn ipc_streams_are_named_as_the_feed_handler_publishes_them() {
        let dir = tempfile::tempdir().unwrap();
        let fh = dir.path().join("feed-handler.toml");
        let md = |ipc_stream: Option<&str>| MarketDataConfig {
            transport: Transport::Ipc,
            config: fh.clone(),
            channels: Vec::new(),
            ipc_stream: ipc_stream.map(Into::into),
            local: None,
            publisher: None,
            exchange_feed: None,
        };
        // The demo's feed handler config, with its stream enabled as the demo enables it.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let demo = std::fs::read_to_string(root.join("configs/demo/feed-handler.toml")).unwrap();
        std::fs::write(&fh, &demo).unwrap();
        let e = format!("{:#}", load_ipc_source(&md(None)).unwrap_err());
        assert!(
            e.contains("feed-handler.toml") && e.contains("publish.ipc_stream"),
            "{e}"
        );
        let ours = load_ipc_source(&md(Some("mine"))).unwrap();
        assert_eq!(ours.stream(2), "mine.2");
        let enabled = demo.replace("\n#ipc_stream = ", "\nipc_stream = ");
        assert_ne!(
            enabled, demo,
            "configs/demo/feed-handler.toml lost its #ipc_stream line"
        );
        std::fs::write(&fh, &enabled).unwrap();
        let theirs = feed_handler::config::Config::load(&fh).unwrap();
        let src = load_ipc_source(&md(None)).unwrap();
        assert_eq!(Some(src.prefix.clone()), theirs.publish.ipc_stream);
        assert_eq!(src.config.dir, theirs.ipc_config().dir);
        assert_eq!(
            src.stream(1),
            feed_handler::ipcsink::stream_name(&src.prefix, 1)
        );
        // An [ipc] table moves the streams' folder for both.
        let moved = format!("{enabled}\n[ipc]\ndir = \"/run/md\"\nflow = \"drop\"\n");
        std::fs::write(&fh, &moved).unwrap();
        let theirs = feed_handler::config::Config::load(&fh).unwrap();
        let src = load_ipc_source(&md(None)).unwrap();
        assert_eq!(src.config.dir, theirs.ipc_config().dir);
        assert_eq!(src.config.dir, Path::new("/run/md"));
    }
}
