//! The feed handler's TOML configuration (`configs/feed-handler.toml`).
//!
//! Owns parsing and validation only; the service (`run`) wires it to sockets and the bus.
//! Unknown keys are errors, so a misspelt key is never silently ignored.

use crate::moldudp64::{GapConfig, StartPolicy};
use serde::Deserialize;
use std::net::{Ipv4Addr, SocketAddr};
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
    #[serde(default)]
    pub publish: PublishConfig,
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
    /// The exchange's retransmission server.
    pub retrans_server: SocketAddr,
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
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        let g = GapConfig::default();
        Self {
            retransmit_timeout_ms: g.retransmit_timeout.as_millis() as u64,
            max_retries: g.max_retries,
            max_request_count: g.max_request_count,
            max_buffered_bytes: g.max_buffered_bytes,
        }
    }
}

impl RecoveryConfig {
    /// As tracker configuration, recovering the session from sequence 1.
    pub fn gap_config(&self) -> GapConfig {
        GapConfig {
            start: StartPolicy::Sequence(1),
            retransmit_timeout: Duration::from_millis(self.retransmit_timeout_ms),
            max_retries: self.max_retries,
            max_request_count: self.max_request_count,
            max_buffered_bytes: self.max_buffered_bytes,
        }
    }
}

/// `[publish]`: normalized market data on the bus.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct PublishConfig {
    /// Channels symbols are partitioned across (stock locate modulo channels).
    pub channels: u16,
}

impl Default for PublishConfig {
    fn default() -> Self {
        Self { channels: 4 }
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
        /// The key, e.g. "publish.channels".
        key: &'static str,
        /// What is wrong.
        reason: &'static str,
    },
}

impl Config {
    /// Parses TOML text; `path` is only used in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source,
        })?;
        let invalid = |key, reason| ConfigError::Invalid {
            path: path.into(),
            key,
            reason,
        };
        if c.publish.channels == 0 {
            return Err(invalid("publish.channels", "must be at least 1"));
        }
        if c.recovery.max_request_count == 0 {
            return Err(invalid("recovery.max_request_count", "must be at least 1"));
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_loads() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/feed-handler.toml");
        let c = Config::load(&p).expect("example config is valid");
        assert!(c.feed.group.ip().is_multicast());
        assert!(c.publish.channels >= 1);
    }

    #[test]
    fn unknown_key_is_named_with_the_file() {
        let text = "[feed]\ngroup = \"239.1.1.1:1\"\nretrans_server = \"127.0.0.1:2\"\ngropu = 1\n";
        let e = Config::parse(text, Path::new("x.toml")).expect_err("unknown key");
        let msg = e.to_string();
        assert!(msg.contains("x.toml") && msg.contains("gropu"), "{msg}");
        let text = "[feed]\ngroup = \"239.1.1.1:1\"\nretrans_server = \"127.0.0.1:2\"\n[publish]\nchannels = 0\n";
        let e = Config::parse(text, Path::new("y.toml")).expect_err("zero channels");
        assert_eq!(
            e.to_string(),
            "invalid config y.toml: publish.channels: must be at least 1"
        );
        let c = Config::parse(
            "[feed]\ngroup = \"239.1.1.1:1\"\nretrans_server = \"127.0.0.1:2\"\n",
            Path::new("z"),
        )
        .expect("defaults");
        assert_eq!(c.recovery, RecoveryConfig::default());
    }
}
