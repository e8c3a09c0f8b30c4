//! Gateway configuration file (TOML). Unknown keys are errors; messages name the file and key.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::fix::SessionConfig;
use crate::journal::FsyncPolicy;
use crate::risk::RiskConfig;

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// FIX venue connection.
    pub fix: FixConfig,
    /// Journal.
    pub journal: JournalConfig,
    /// Pre-trade risk.
    pub risk: RiskConfig,
}

/// `[fix]`: the venue session.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FixConfig {
    /// Venue acceptor, `host:port`.
    pub venue_addr: String,
    /// Our SenderCompID.
    pub sender_comp_id: String,
    /// The venue's CompID.
    pub target_comp_id: String,
    /// Heartbeat interval, seconds.
    pub heartbeat_secs: u32,
}

impl FixConfig {
    /// The session part.
    pub fn session(&self) -> SessionConfig {
        SessionConfig {
            sender_comp_id: self.sender_comp_id.clone(),
            target_comp_id: self.target_comp_id.clone(),
            heartbeat_secs: self.heartbeat_secs,
        }
    }
}

/// `[journal]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// Journal file (relative paths are relative to the working directory).
    pub path: PathBuf,
    /// `"never"`, `"always"` or `{ every_n = N }`.
    pub fsync: FsyncPolicy,
}

/// Loading the configuration failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("read config {path}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML is invalid or has unknown/missing keys (the message names the key and line).
    #[error("config {path}: {source}")]
    Parse {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: toml::de::Error,
    },
}

impl Config {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })
    }

    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/order-gateway.toml")
    }

    #[test]
    fn example_config_parses_and_builds_risk() {
        let c = Config::load(&example()).unwrap();
        assert_eq!(c.fix.target_comp_id, "VENUE");
        crate::risk::RiskEngine::new(&c.risk).unwrap();
    }

    #[test]
    fn unknown_key_names_file_and_key() {
        let text = std::fs::read_to_string(example())
            .unwrap()
            .replace("heartbeat_secs", "heartbeat_sec");
        let dir = std::env::temp_dir().join(format!("gw-config-{}.toml", std::process::id()));
        std::fs::write(&dir, text).unwrap();
        let msg = format!("{:#}", anyhow::Error::from(Config::load(&dir).unwrap_err()));
        assert!(msg.contains("gw-config-"), "{msg}");
        assert!(msg.contains("heartbeat_sec"), "{msg}");
    }
}
