//! The engine's configuration file (`configs/demo/sample-engine.toml`) and the market-data
//! path configuration it points at. Parsing and validation only; nothing here opens a socket.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use rocebus::idle::IdleStrategy;
use rocebus::mcast::config::McastConfig;
use rocebus::orders::OrdersConfig;
use rocebus_engine::proto::Symbol;
use serde::Deserialize;

/// The engine's configuration file (`configs/demo/sample-engine.toml`). Unknown keys are
/// errors; relative paths are relative to the configuration file's folder.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineConfig {
    /// Where the order gateway listens and who we are.
    pub gateway: GatewayConfig,
    /// The market-data bus.
    pub market_data: MarketDataConfig,
    /// What the strategy trades and how often.
    pub strategy: StrategyConfig,
    /// The polling thread.
    #[serde(default)]
    pub engine: LoopConfig,
}

/// `[gateway]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's RC listen address, `ip:port`.
    pub addr: SocketAddr,
    /// Our engine id (the gateway's `[[risk.engines]]` entry).
    pub engine_id: u32,
    /// Our engine's secret (that entry's `token`).
    pub engine_token: String,
    /// The account orders are sent for.
    pub account: u32,
    /// The orders path; `token` must match the gateway's.
    pub orders: OrdersConfig,
    /// How long to keep trying to connect (the gateway may still be starting), ms.
    #[serde(default = "default_connect_ms")]
    pub connect_timeout_ms: u64,
    /// How long the gateway may be silent (no frame, no heartbeat) before the engine
    /// declares it dead and stops sending, ms.
    #[serde(default = "default_gateway_timeout_ms")]
    pub gateway_timeout_ms: u64,
}

fn default_connect_ms() -> u64 {
    20_000
}

fn default_gateway_timeout_ms() -> u64 {
    rocebus_engine::client::DEFAULT_GATEWAY_TIMEOUT.as_millis() as u64
}

/// `[market_data]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MarketDataConfig {
    /// The market-data path configuration (`McastConfig` TOML), shared with the feed handler.
    pub config: PathBuf,
    /// Channels to subscribe to (default: every channel of `config`).
    #[serde(default)]
    pub channels: Vec<u16>,
    /// Our address on the RDMA device.
    pub local: IpAddr,
    /// The feed handler's address (its recovery service).
    pub publisher: IpAddr,
    /// The exchange feed's group and port (the feed handler's `feed.group`): the latency
    /// probe watches packets sent there (absent: market-data latency not measured).
    #[serde(default)]
    pub exchange_feed: Option<std::net::SocketAddrV4>,
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
    /// Core to pin the polling thread to (absent: not pinned).
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
        let cfg: EngineConfig =
            toml::from_str(text).map_err(|e| ParseError::Toml(e.to_string()))?;
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
        if cfg.gateway.orders.token.is_empty() {
            return invalid(
                "gateway.orders.token",
                "is empty: set the gateway's [service.orders] token",
            );
        }
        Ok(cfg)
    }
}

enum ParseError {
    Toml(String),
    Invalid(&'static str, String),
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
        Some(v) => v.try_into(),
        None => toml::Value::Table(table).try_into(),
    }
    .with_context(what)?;
    cfg.validate().with_context(what)?;
    Ok(cfg)
}
#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
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
}
