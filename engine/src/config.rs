//! An engine's configuration for the gateway: the `[gateway]` table of an engine's file
//! (`configs/demo/sample-engine.toml`) and its `[rdma]` table. The C ABI
//! (`rocebus_engine_config_from_file`) and a Rust engine read the same file the same way.
//!
//! ```toml
//! [gateway]
//! addr = "198.18.0.1:7470"        # the gateway's [service] listen
//! engine_id = 1                   # a [[risk.engines]] entry of the gateway
//! engine_token = "..."            # that entry's token (1 to 32 bytes)
//! account = 1                     # an account granted to the engine
//! connect_timeout_ms = 20000      # keep retrying while the gateway starts
//! gateway_timeout_ms = 3000       # a gateway silent this long is presumed dead
//! [gateway.orders]
//! token = "..."                   # the gateway's [service.orders] token
//! ```

use std::net::SocketAddr;
use std::path::Path;

use rocebus::orders::OrdersConfig;
use rocebus::rdma_settings::{PrepareError, RdmaSettings};
use serde::Deserialize;

use crate::proto::TOKEN_LEN;

/// Why an engine's configuration was refused; the message names the table and the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the engine configuration {path}: {source}")]
    Read {
        /// The path as given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid TOML, a key unknown or mistyped, or a value out of range.
    #[error("{0}")]
    Invalid(String),
}

/// `[gateway]` of an engine's configuration: where the gateway is and who the engine is.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GatewayConfig {
    /// The gateway's orders listener (its `[service] listen`).
    pub addr: SocketAddr,
    /// The engine's id: a `[[risk.engines]]` entry of the gateway.
    pub engine_id: u32,
    /// That entry's token (1 to 32 bytes).
    pub engine_token: String,
    /// The account the engine trades (one the gateway grants it).
    #[serde(default)]
    pub account: u32,
    /// The orders path to the gateway (`[gateway.orders]`: its `token` is the gateway's
    /// `[service.orders]` token); the file's `[rdma]` table is applied to it.
    pub orders: OrdersConfig,
    /// How long `EngineSession::connect_configured` keeps trying while the gateway starts
    /// (twice this while the gateway still holds the engine's previous connection).
    #[serde(default = "default_connect_ms")]
    pub connect_timeout_ms: u64,
    /// Silence after which the gateway is presumed dead.
    #[serde(default = "default_gateway_timeout_ms")]
    pub gateway_timeout_ms: u64,
    /// The file's `[rdma]` table (set by [`with_rdma`](Self::with_rdma)): what
    /// [`prepare_process`](Self::prepare_process) applies to the process.
    #[serde(skip)]
    pub rdma: RdmaSettings,
}

fn default_connect_ms() -> u64 {
    20_000
}

fn default_gateway_timeout_ms() -> u64 {
    crate::client::DEFAULT_GATEWAY_TIMEOUT.as_millis() as u64
}

impl GatewayConfig {
    /// Reads `[gateway]` (or the top level when the text has no such table), applies a
    /// top-level `[rdma]` table to its orders path, and checks it. Other tables (an
    /// engine's own settings) are left to the engine.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError::Invalid(format!("invalid TOML: {e}")))?;
        let rdma: RdmaSettings = match table.remove("rdma") {
            Some(v) => v
                .try_into()
                .map_err(|e| ConfigError::Invalid(format!("[rdma]: {e}")))?,
            None => RdmaSettings::default(),
        };
        let gateway = match table.remove("gateway") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => return Err(ConfigError::Invalid("gateway: must be a table".into())),
            None => table,
        };
        let cfg: GatewayConfig = toml::Value::Table(gateway)
            .try_into()
            .map_err(|e| ConfigError::Invalid(format!("[gateway]: {e}")))?;
        cfg.with_rdma(&rdma)
    }

    /// Applies the file's `[rdma]` table to the orders path and checks the whole: what
    /// [`from_toml_str`](Self::from_toml_str) does after parsing, for a program that
    /// deserializes `[gateway]` inside its own configuration (the demo's engine does).
    pub fn with_rdma(mut self, rdma: &RdmaSettings) -> Result<Self, ConfigError> {
        rdma.apply_to_orders(&mut self.orders);
        self.rdma = *rdma;
        let cfg = self;
        cfg.orders.validate().map_err(|e| {
            ConfigError::Invalid(format!(
                "[gateway.orders]: invalid orders configuration: {e}"
            ))
        })?;
        if cfg.orders.token.is_empty() {
            return Err(ConfigError::Invalid(
                "gateway.orders.token is empty: set the gateway's [service.orders] token".into(),
            ));
        }
        if cfg.engine_token.is_empty() || cfg.engine_token.len() > TOKEN_LEN {
            return Err(ConfigError::Invalid(format!(
                "gateway.engine_token: must be 1 to {TOKEN_LEN} bytes (the gateway's \
                 [[risk.engines]] token)"
            )));
        }
        Ok(cfg)
    }

    /// An engine process's start-up, before it registers any memory, as the services do
    /// theirs ([`RdmaSettings::prepare_process`]): the `[rdma]` table's huge page policy
    /// for the process, and a memlock limit (RLIMIT_MEMLOCK) check covering the orders
    /// path's rings plus `other_bytes` (the engine's market-data subscribers': see
    /// `McastConfig::subscriber_pinned_bytes`), an error naming the bytes needed. Call it
    /// first: memory registered before it keeps the default policy.
    pub fn prepare_process(&self, other_bytes: u64) -> Result<(), PrepareError> {
        self.rdma
            .prepare_process(self.orders.pinned_bytes_per_connection() + other_bytes)
    }

    /// [`from_toml_str`](Self::from_toml_str) of the file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
[gateway]
addr = "198.18.0.1:7470"
engine_id = 1
engine_token = "3a7f09c2e5b18d64f0a2c7e91b4d6f58"
account = 7
[gateway.orders]
token = "9d41c0e7b25a8f63d1e04b7c29a58f3e"

[strategy]
symbols = ["A"]

[rdma]
traffic_class = 104
"#;

    #[test]
    fn an_engines_file_gives_its_gateway_table_with_the_rdma_settings() {
        let cfg = GatewayConfig::from_toml_str(FILE).unwrap();
        assert_eq!(cfg.addr, "198.18.0.1:7470".parse().unwrap());
        assert_eq!((cfg.engine_id, cfg.account), (1, 7));
        assert_eq!(cfg.connect_timeout_ms, 20_000);
        assert_eq!(cfg.orders.rc.traffic_class, 104);
        // The top level when there is no [gateway] table.
        let bare = FILE
            .replace("[gateway]\n", "")
            .replace("[gateway.orders]", "[orders]")
            .replace("[strategy]\nsymbols = [\"A\"]\n", "");
        let bare = GatewayConfig::from_toml_str(&bare).unwrap();
        assert_eq!((bare.engine_id, bare.account), (1, 7));
    }

    #[test]
    fn a_bad_gateway_table_is_refused_naming_the_key() {
        let err = |text: &str| GatewayConfig::from_toml_str(text).unwrap_err().to_string();
        let e = err(&FILE.replace("account = 7", "acount = 7"));
        assert!(e.contains("[gateway]") && e.contains("acount"), "{e}");
        let e = err(&FILE.replace("3a7f09c2e5b18d64f0a2c7e91b4d6f58", ""));
        assert!(e.contains("gateway.engine_token"), "{e}");
        let e = err(&FILE.replace("9d41c0e7b25a8f63d1e04b7c29a58f3e", ""));
        assert!(e.contains("gateway.orders.token"), "{e}");
        let e = err(&FILE.replace("traffic_class = 104", "traffic_class = 999"));
        assert!(e.contains("[rdma]"), "{e}");
        assert!(err("[gateway\n").contains("invalid TOML"));
        let e = GatewayConfig::load("/nonexistent/engine.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/engine.toml"), "{e}");
    }
}
