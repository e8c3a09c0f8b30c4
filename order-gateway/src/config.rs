//! Gateway configuration file (TOML). Unknown keys are errors; messages name the file and key.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use rocebus::idle::IdleStrategy;
use rocebus::orders::OrdersConfig;
use rocebus::rdma_settings::RdmaSettings;
use serde::Deserialize;

use crate::fix::{Secret, SessionConfig};
use crate::journal::FsyncPolicy;
use crate::market::MarketDataConfig;
use crate::proto::{Symbol, PRICE_SCALE};
use crate::risk::RiskConfig;

/// The whole configuration.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Engine side: the RC listener and the polling thread.
    pub service: ServiceConfig,
    /// FIX venue connection.
    pub fix: FixConfig,
    /// Journal.
    pub journal: JournalConfig,
    /// Pre-trade risk.
    pub risk: RiskConfig,
    /// Optional static reference prices by symbol, in currency units (`AAPL = 189.5`).
    /// For demos without a market-data feed: they are re-applied continuously, so they
    /// never go stale. Prices from the feed override them until the next refresh.
    #[serde(default)]
    pub reference_prices: BTreeMap<String, f64>,
    /// Optional `[market_data]`: reference prices and halts from the rocebus market-data bus
    /// (see [`crate::market`]). Exclusive with `[reference_prices]`.
    #[serde(default)]
    pub market_data: Option<MarketDataConfig>,
    /// RoCE transport settings (traffic class, service level, RC knobs, GID, huge pages) of
    /// the engine listener and the market-data subscription.
    #[serde(default)]
    pub rdma: RdmaSettings,
}

fn default_reconnect_secs() -> u64 {
    2
}

fn default_logon_timeout_ms() -> u64 {
    2000
}

fn default_engine_timeout_ms() -> u64 {
    5000
}

fn default_heartbeat_ms() -> u64 {
    100
}

fn default_max_pending_connections() -> usize {
    16
}

fn default_control_socket() -> PathBuf {
    PathBuf::from(".rocebus/order-gateway.control")
}

fn default_true() -> bool {
    true
}

fn default_max_response_backlog() -> usize {
    crate::risk::RESPONSE_HISTORY / 2
}

/// `[service]`: where engines connect and how the polling thread runs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// RC listen address, `ip:port`: an address of the RDMA device engines reach.
    pub listen: SocketAddr,
    /// The orders path (`token` is required; other keys default as in rocebus).
    pub orders: OrdersConfig,
    /// Core to pin the polling thread to (absent: not pinned).
    #[serde(default)]
    pub core: Option<usize>,
    /// What the polling thread does when idle (default: back off).
    #[serde(default)]
    pub idle: IdleStrategy,
    /// Seconds between venue reconnect attempts.
    #[serde(default = "default_reconnect_secs")]
    pub reconnect_secs: u64,
    /// How long a new engine connection may take to send its logon.
    #[serde(default = "default_logon_timeout_ms")]
    pub logon_timeout_ms: u64,
    /// How long a logged-on engine may stay silent (no frame, not even a heartbeat) before
    /// it is disconnected and its open orders are cancelled at the venue; after a restart,
    /// also how long an engine that was logged on (or has open orders) has to log on again
    /// before its orders are cancelled. At least twice `heartbeat_ms`. Default 5000.
    #[serde(default = "default_engine_timeout_ms")]
    pub engine_timeout_ms: u64,
    /// Heartbeat interval both ways on the engine protocol, milliseconds (1..=65535): the
    /// gateway sends each engine a heartbeat this often and tells it, in the logon answer,
    /// to do the same. Default 100.
    #[serde(default = "default_heartbeat_ms")]
    pub heartbeat_ms: u64,
    /// Connections in their handshake, and connections waiting for their logon, at once
    /// (each capped by it; it lowers `orders.max_pending_handshakes` when smaller, never
    /// below 2, and `orders.max_pending_per_peer` below that): a connect
    /// request beyond it is rejected, a completed connection beyond it closed, counted and
    /// logged at a bounded rate. At least 1. Default 16.
    #[serde(default = "default_max_pending_connections")]
    pub max_pending_connections: usize,
    /// The operator's control socket (`order-gateway control`), a Unix socket with mode
    /// 0600; relative paths are relative to the working directory.
    #[serde(default = "default_control_socket")]
    pub control_socket: PathBuf,
    /// Publish counters in the rocebus counters directory (`rocebus stat order-gateway`).
    #[serde(default = "default_true")]
    pub counters: bool,
    /// Responses that may wait for an engine whose ring is full (it is not reading); one
    /// more disconnects it (cancel-on-disconnect) and it gets them replayed when it logs on
    /// again (a logon's replay is queued whatever its length). Flow control: while half of
    /// it waits, no request is taken from the engine (they stay in its ring, which holds the
    /// engine back), so its own requests fill only that half; the other half is for what
    /// comes unasked (fills, venue cancels). At most half of `risk.response_history`, so
    /// what an engine disconnected for a full backlog missed (the backlog, its unread ring,
    /// the cancels that follow) is still kept for its replay. Default 32768.
    #[serde(default = "default_max_response_backlog")]
    pub max_response_backlog: usize,
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
    /// Optional: how long a ResendRequest we sent may go unanswered (no progress) before it
    /// is sent again, milliseconds. Default (0): one heartbeat interval.
    #[serde(default)]
    pub resend_timeout_ms: u32,
    /// Optional: bytes that may wait for a venue that is not reading (its socket buffer
    /// full); one more, or no progress for 5 s, drops the link (the session resends after
    /// the reconnect). At least 65536. Default 4194304 (4 MiB).
    #[serde(default = "default_max_unsent_bytes")]
    pub max_unsent_bytes: usize,
    /// Optional: Username (553) sent on every Logon.
    #[serde(default)]
    pub username: Option<String>,
    /// Optional: Password (554) sent on every Logon. Exclusive with `password_env`.
    /// Redacted in `Debug`, never logged, and journaled redacted.
    #[serde(default)]
    pub password: Option<Secret>,
    /// Optional: the environment variable holding the Password, read when the config is
    /// loaded (a variable that is not set is a config error). Exclusive with `password`.
    #[serde(default)]
    pub password_env: Option<String>,
    /// Optional, default false: every Logon we send carries ResetSeqNumFlag (141=Y) with
    /// MsgSeqNum 1 and both directions start again at 1 (QuickFIX's ResetOnLogon=Y).
    #[serde(default)]
    pub reset_on_logon: bool,
    /// Optional, default 120 (QuickFIX's MaxLatency): a venue message whose SendingTime (52)
    /// is further than this many seconds from our clock is rejected (SessionRejectReason 10,
    /// SendingTime accuracy problem) and the session logged out (FIX 4.4 Vol. 2, QuickFIX's
    /// CheckLatency=Y). 0 turns the check off. At most 86400.
    #[serde(default = "default_max_latency_secs")]
    pub max_latency_secs: u32,
    /// The Password read from `password_env` by [`Config::load`].
    #[serde(skip)]
    env_password: Option<Secret>,
}

fn default_max_latency_secs() -> u32 {
    120
}

fn default_max_unsent_bytes() -> usize {
    DEFAULT_MAX_UNSENT
}

/// Default bound on bytes queued for a venue that is not reading (`fix.max_unsent_bytes`).
/// Defined with the setting, as the config must not import the driver (which reads the
/// config); [`crate::driver::DEFAULT_MAX_UNSENT`] re-exports it.
pub const DEFAULT_MAX_UNSENT: usize = 4 << 20;

impl FixConfig {
    /// The session part.
    pub fn session(&self) -> SessionConfig {
        SessionConfig {
            sender_comp_id: self.sender_comp_id.clone(),
            target_comp_id: self.target_comp_id.clone(),
            heartbeat_secs: self.heartbeat_secs,
            resend_timeout_ms: self.resend_timeout_ms,
            username: self.username.clone(),
            password: self.password.clone().or_else(|| self.env_password.clone()),
            reset_on_logon: self.reset_on_logon,
            max_latency_secs: self.max_latency_secs,
        }
    }

    /// Reads the Password from `password_env` (at start, so a missing variable stops the
    /// start with the key named). The value is never part of an error or a log line.
    fn resolve_password(&mut self) -> Result<(), Invalid> {
        self.env_password = None;
        let Some(var) = &self.password_env else {
            return Ok(());
        };
        if self.password.is_some() {
            return Err(both_passwords());
        }
        match std::env::var(var) {
            Ok(v) if !v.is_empty() => {
                self.env_password = Some(Secret::new(v));
                Ok(())
            }
            Ok(_) => Err((
                "fix.password_env".into(),
                format!("environment variable {var} is empty"),
            )),
            Err(std::env::VarError::NotPresent) => Err((
                "fix.password_env".into(),
                format!("environment variable {var} is not set"),
            )),
            Err(std::env::VarError::NotUnicode(_)) => Err((
                "fix.password_env".into(),
                format!("environment variable {var} is not valid UTF-8"),
            )),
        }
    }

    /// Username and Password: not both password keys, no empty values, no SOH (the FIX
    /// field separator would cut the Logon).
    fn validate_logon(&self) -> Result<(), Invalid> {
        if self.password.is_some() && self.password_env.is_some() {
            return Err(both_passwords());
        }
        let bad = |v: &str| v.is_empty() || v.contains('\x01');
        if self.username.as_deref().is_some_and(bad) {
            return Err((
                "fix.username".into(),
                "must not be empty or contain SOH (\\x01)".into(),
            ));
        }
        if self.password.as_ref().is_some_and(|p| bad(p.expose()))
            || self.env_password.as_ref().is_some_and(|p| bad(p.expose()))
        {
            let key = if self.password.is_some() {
                "fix.password"
            } else {
                "fix.password_env"
            };
            return Err((
                key.into(),
                "the password must not be empty or contain SOH (\\x01)".into(),
            ));
        }
        if self.password_env.as_deref().is_some_and(str::is_empty) {
            return Err((
                "fix.password_env".into(),
                "must name an environment variable".into(),
            ));
        }
        Ok(())
    }
}

fn both_passwords() -> Invalid {
    (
        "fix.password".into(),
        "set either password or password_env, not both".into(),
    )
}

/// `[journal]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// Journal file (relative paths are relative to the working directory).
    pub path: PathBuf,
    /// Optional, default `"group"`: every service turn's records are `fdatasync`ed before
    /// any order they describe goes to the venue or any ack to an engine. `{ every_n = N }`
    /// and `"never"` trade that away (see configs/order-gateway.toml).
    #[serde(default)]
    pub fsync: FsyncPolicy,
    /// Optional, default 64 MiB: once this much was appended to the journal since its last
    /// checkpoint, the gateway writes a
    /// checkpoint and starts a new segment (the old file is kept as `path.N`), and it does
    /// so at every clean stop; a restart replays one segment at most. 0 turns segments off.
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
}

fn default_segment_bytes() -> u64 {
    64 << 20
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
    /// A value parses but cannot be used.
    #[error("config {path}: {key}: {problem}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// Key, dotted (`service.orders.ring_size`).
        key: String,
        /// What is wrong.
        problem: String,
    },
}

pub use crate::invalid::Invalid;

impl Config {
    /// The control socket's path in the configuration file at `path`, read without the rest
    /// of the configuration (no FIX password, no risk limits): `order-gateway control` needs
    /// only the socket. A missing `[service] control_socket` is the default.
    pub fn control_socket_of(path: &Path) -> Result<PathBuf, ConfigError> {
        #[derive(serde::Deserialize)]
        struct Service {
            #[serde(default = "default_control_socket")]
            control_socket: PathBuf,
        }
        #[derive(serde::Deserialize)]
        struct Only {
            service: Option<Service>,
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let only: Only = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        Ok(only
            .service
            .map_or_else(default_control_socket, |s| s.control_socket))
    }

    /// Reads, parses and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        let mut cfg = Config::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source,
        })?;
        if let Some(md) = &mut cfg.market_data {
            if md.config.is_relative() {
                md.config = path.parent().unwrap_or(Path::new(".")).join(&md.config);
            }
        }
        cfg.fix
            .resolve_password()
            .and_then(|()| cfg.validate())
            .map_err(|(key, problem)| ConfigError::Invalid {
                path: path.to_owned(),
                key,
                problem,
            })?;
        Ok(cfg)
    }

    /// Checks that the transport token and every engine token are keys that resist
    /// guessing ([`rocebus::auth::check_secret`]: at least 128 bits of key material, none of
    /// the shipped sample values). `order-gateway check` and `run` ask it; the error names
    /// the key and `rocebus keygen`.
    pub fn check_secrets(&self) -> Result<(), Invalid> {
        rocebus::auth::check_secret(&self.service.orders.token)
            .map_err(|e| ("service.orders.token".to_owned(), e.to_string()))?;
        for e in &self.risk.engines {
            rocebus::auth::check_secret(&e.token).map_err(|w| {
                (
                    format!("risk.engines: engine {}: token", e.id),
                    w.to_string(),
                )
            })?;
        }
        Ok(())
    }

    /// Checks values serde cannot: the orders path, the risk tables, reference prices.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.service.orders.token.is_empty() {
            return Err((
                "service.orders.token".into(),
                "must be set (the transport gate every engine passes; each engine also has its own [[risk.engines]] token)".into(),
            ));
        }
        self.service.orders.validate().map_err(|e| {
            let (k, p) = e.split_once(": ").unwrap_or(("", &e));
            (format!("service.orders.{k}"), p.to_owned())
        })?;
        if let Err(e) = crate::risk::RiskEngine::new(&self.risk) {
            let text = e.to_string();
            let (k, p) = text.split_once(": ").unwrap_or(("risk", &text));
            return Err((k.to_owned(), p.to_owned()));
        }
        let s = &self.service;
        if !(1..=u64::from(u16::MAX)).contains(&s.heartbeat_ms) {
            return Err((
                "service.heartbeat_ms".into(),
                "must be between 1 and 65535".into(),
            ));
        }
        if s.engine_timeout_ms < 2 * s.heartbeat_ms {
            return Err((
                "service.engine_timeout_ms".into(),
                format!(
                    "must be at least twice heartbeat_ms ({}), or a healthy engine whose \
                     heartbeat is a little late is disconnected",
                    s.heartbeat_ms
                ),
            ));
        }
        self.fix.validate_logon()?;
        if self.fix.max_latency_secs > 86_400 {
            return Err((
                "fix.max_latency_secs".into(),
                "must be at most 86400 (a day); 0 turns the check off".into(),
            ));
        }
        if self.fix.max_unsent_bytes < 65536 {
            return Err((
                "fix.max_unsent_bytes".into(),
                "must be at least 65536".into(),
            ));
        }
        if s.max_pending_connections == 0 {
            return Err((
                "service.max_pending_connections".into(),
                "must be at least 1".into(),
            ));
        }
        let half = (self.risk.response_history / 2).max(1);
        if self.service.max_response_backlog == 0 || self.service.max_response_backlog > half {
            return Err((
                "service.max_response_backlog".into(),
                format!(
                    "must be 1..={half}, at most half of risk.response_history ({}): an \
                     engine disconnected for a full backlog must still be able to get what \
                     it missed replayed",
                    self.risk.response_history
                ),
            ));
        }
        self.static_prices()?;
        if let Some(md) = &self.market_data {
            if !self.reference_prices.is_empty() {
                return Err((
                    "reference_prices".into(),
                    "must be empty when [market_data] is set: static prices never go stale \
                     and would mask a stale or halted feed"
                        .into(),
                ));
            }
            md.validate(&md.load_bus()?, self.risk.reference_max_age_ms)?;
        }
        Ok(())
    }

    /// `[reference_prices]` as fixed-point prices.
    pub fn static_prices(&self) -> Result<Vec<(Symbol, i64)>, Invalid> {
        self.reference_prices
            .iter()
            .map(|(s, &p)| {
                let key = || format!("reference_prices.{s}");
                let sym = Symbol::new(s)
                    .ok_or_else(|| (key(), "symbol must be 1..=8 printable ASCII bytes".into()))?;
                let fixed = (p * PRICE_SCALE as f64).round();
                if !(fixed >= 1.0 && fixed < i64::MAX as f64) {
                    return Err((key(), format!("price {p} is not a positive number")));
                }
                Ok((sym, fixed as i64))
            })
            .collect()
    }

    /// Parses TOML text.
    /// `[rdma]` is applied to `service.orders` here (and to the market-data bus by
    /// [`MarketDataConfig::load_bus`]'s caller).
    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        let mut cfg: Config = toml::from_str(text)?;
        cfg.rdma.apply_to_orders(&mut cfg.service.orders);
        Ok(cfg)
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
        assert!(!c.service.orders.token.is_empty());
        let prices = c.static_prices().unwrap();
        assert!(prices.contains(&(Symbol::new("AAPL").unwrap(), 1_895_000)));
    }

    /// Loads the example with `from` replaced by `to`; returns the error text.
    fn broken(from: &str, to: &str) -> String {
        let text = std::fs::read_to_string(example()).unwrap();
        assert!(text.contains(from), "example lacks {from:?}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw-bad.toml");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
        format!(
            "{:#}",
            anyhow::Error::from(Config::load(&path).unwrap_err())
        )
    }

    /// Loads the example with `extra` added to `[fix]`.
    fn with_fix(extra: &str) -> Result<Config, String> {
        with_fix_text(&std::fs::read_to_string(example()).unwrap(), extra)
    }

    /// Loads config `text` (the example, edited) with `extra` added to `[fix]`.
    fn with_fix_text(text: &str, extra: &str) -> Result<Config, String> {
        let at = "max_unsent_bytes = 4194304\n";
        assert!(text.contains(at));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw-fix.toml");
        // The example sets reset_on_logon (to its default): `extra` may set it instead.
        let text = text.replacen("\nreset_on_logon = false\n", "\n", 1);
        std::fs::write(&path, text.replacen(at, &format!("{at}{extra}\n"), 1)).unwrap();
        Config::load(&path).map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    }

    #[test]
    fn logon_keys_default_off_and_reach_the_session() {
        let c = Config::load(&example()).unwrap();
        let s = c.fix.session();
        assert_eq!(
            (s.username, s.password, s.reset_on_logon),
            (None, None, false)
        );
        let c =
            with_fix("username = \"trader1\"\npassword = \"pw-in-toml\"\nreset_on_logon = true")
                .unwrap();
        let s = c.fix.session();
        assert_eq!(s.username.as_deref(), Some("trader1"));
        assert_eq!(s.password.as_ref().map(Secret::expose), Some("pw-in-toml"));
        assert!(s.reset_on_logon);
        // Debug (of the config, and of what the session gets) never shows the password.
        let dbg = format!("{c:?} {s:?}");
        assert!(
            !dbg.contains("pw-in-toml") && dbg.contains("redacted"),
            "{dbg}"
        );
        let m = with_fix("reset_on_logon = \"yes\"").unwrap_err();
        assert!(
            m.contains("reset_on_logon") && m.contains("gw-fix.toml"),
            "{m}"
        );
        let m = with_fix("passwd = \"x\"").unwrap_err();
        assert!(m.contains("unknown field `passwd`"), "{m}");
        let m = with_fix("username = \"\"").unwrap_err();
        assert!(m.contains("fix.username"), "{m}");
        let m = with_fix("password = \"a\\u0001b\"").unwrap_err();
        assert!(m.contains("fix.password") && !m.contains("a\u{1}b"), "{m}");
    }

    /// `max_latency_secs`: QuickFIX's 120 unless set, 0 turns the check off, a day at most;
    /// it reaches the session.
    #[test]
    fn max_latency_secs_defaults_to_120_and_reaches_the_session() {
        let text = std::fs::read_to_string(example()).unwrap();
        let without = text.replacen("\nmax_latency_secs = 120\n", "\n", 1);
        assert_ne!(text, without, "the example documents max_latency_secs");
        let c = Config::parse(&without).unwrap();
        assert_eq!(c.fix.session().max_latency_secs, 120);
        assert_eq!(
            with_fix_text(&without, "max_latency_secs = 0")
                .unwrap()
                .fix
                .session()
                .max_latency_secs,
            0
        );
        assert_eq!(
            with_fix_text(&without, "max_latency_secs = 30")
                .unwrap()
                .fix
                .session()
                .max_latency_secs,
            30
        );
        let m = with_fix_text(&without, "max_latency_secs = 86401").unwrap_err();
        assert!(m.contains("fix.max_latency_secs"), "{m}");
        let m = with_fix_text(&without, "max_latency_secs = -1").unwrap_err();
        assert!(m.contains("max_latency_secs"), "{m}");
    }

    #[test]
    fn password_env_is_read_at_load_and_checked() {
        // Names unique to this test: the environment is shared by the test threads.
        let var = "ORDER_GATEWAY_TEST_FIX_PASSWORD";
        std::env::set_var(var, "pw-from-env");
        let c = with_fix(&format!("password_env = \"{var}\"")).unwrap();
        let s = c.fix.session();
        assert_eq!(s.password.as_ref().map(Secret::expose), Some("pw-from-env"));
        assert!(!format!("{c:?}").contains("pw-from-env"));
        // Both: refused, whatever the variable holds.
        let m = with_fix(&format!("password = \"x\"\npassword_env = \"{var}\"")).unwrap_err();
        assert!(
            m.contains("gw-fix.toml") && m.contains("fix.password") && m.contains("not both"),
            "{m}"
        );
        assert!(!m.contains("pw-from-env"), "{m}");
        // A variable that is not set, or empty: the key and the variable are named.
        let missing = "ORDER_GATEWAY_TEST_FIX_PASSWORD_UNSET";
        std::env::remove_var(missing);
        let m = with_fix(&format!("password_env = \"{missing}\"")).unwrap_err();
        assert!(
            m.contains("fix.password_env") && m.contains(missing) && m.contains("not set"),
            "{m}"
        );
        let empty = "ORDER_GATEWAY_TEST_FIX_PASSWORD_EMPTY";
        std::env::set_var(empty, "");
        let m = with_fix(&format!("password_env = \"{empty}\"")).unwrap_err();
        assert!(m.contains("fix.password_env") && m.contains("empty"), "{m}");
    }

    #[test]
    fn liveness_and_cap_keys_default_and_are_checked() {
        let c = Config::load(&example()).unwrap();
        assert_eq!(c.service.heartbeat_ms, 100);
        assert_eq!(c.service.max_pending_connections, 16);
        assert_eq!(c.fix.max_unsent_bytes, 4 << 20);
        let m = broken("heartbeat_ms = 100", "heartbeat_ms = 0");
        assert!(m.contains("service.heartbeat_ms"), "{m}");
        let m = broken("heartbeat_ms = 100", "heartbeat_ms = 70000");
        assert!(m.contains("service.heartbeat_ms"), "{m}");
        let m = broken("heartbeat_ms = 100", "heartbeat_ms = 3000");
        assert!(
            m.contains("service.engine_timeout_ms") && m.contains("twice"),
            "{m}"
        );
        let m = broken(
            "max_pending_connections = 16",
            "max_pending_connections = 0",
        );
        assert!(m.contains("service.max_pending_connections"), "{m}");
        let m = broken("max_unsent_bytes = 4194304", "max_unsent_bytes = 1000");
        assert!(m.contains("fix.max_unsent_bytes"), "{m}");
        // Absent keys take their defaults.
        let text = std::fs::read_to_string(example()).unwrap();
        let bare: String = text
            .lines()
            .filter(|l| {
                ![
                    "heartbeat_ms",
                    "max_pending_connections",
                    "max_unsent_bytes",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let c = Config::parse(&bare).unwrap();
        assert_eq!(
            (
                c.service.heartbeat_ms,
                c.service.max_pending_connections,
                c.fix.max_unsent_bytes
            ),
            (100, 16, 4 << 20)
        );
    }

    #[test]
    fn bad_values_name_file_key_and_problem() {
        let m = broken("ring_size = 1048576", "ring_size = 1000000");
        assert!(m.contains("gw-bad.toml"), "{m}");
        assert!(m.contains("service.orders.ring_size"), "{m}");
        assert!(m.contains("power of two"), "{m}");
        let m = broken("AAPL = 189.50", "AAPL = -1.0");
        assert!(m.contains("reference_prices.AAPL"), "{m}");
        let m = broken("accounts = [1]", "accounts = [2]");
        assert!(m.contains("risk.engines") && m.contains("account 2"), "{m}");
        let m = broken("listen = \"", "listen = \"nowhere");
        assert!(m.contains("listen") && m.contains("gw-bad.toml"), "{m}");
        let m = broken("trading_start = \"09:30\"", "trading_start = \"25:99\"");
        assert!(m.contains("risk.trading_start"), "{m}");
        let m = broken("token = \"", "token = \"\" #");
        assert!(m.contains("service.orders.token"), "{m}");
        let m = broken("token = \"change-me-engine-1\"", "token = \"\"");
        assert!(m.contains("risk.engines") && m.contains("engine 1"), "{m}");
        assert!(m.contains("token must be 1..=32 bytes"), "{m}");
        let m = broken("token = \"change-me-engine-1\"", "");
        assert!(m.contains("missing field `token`"), "{m}");
    }

    /// The example with `[reference_prices]` replaced by a `[market_data]` section.
    fn with_market_data(extra: &str) -> Result<Config, String> {
        let text = std::fs::read_to_string(example()).unwrap();
        let cut = text
            .find("\n[reference_prices]")
            .expect("example has reference prices");
        let bus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/demo/feed-handler.toml");
        let text = format!(
            "{}[market_data]\nconfig = {:?}\nlocal = \"198.18.0.1\"\npublisher = \"198.18.0.1\"\n{extra}",
            &text[..=cut],
            bus.display().to_string()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw-md.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path).map_err(|e| format!("{:#}", anyhow::Error::from(e)))
    }

    #[test]
    fn market_data_section_loads_and_names_bad_keys() {
        let c = with_market_data("").unwrap();
        let md = c.market_data.unwrap();
        assert_eq!(md.confirm_ms, 100);
        assert!(!md.channel_ids(&md.load_bus().unwrap()).is_empty());
        let m = with_market_data("confirm_ms = 4000\n").unwrap_err();
        assert!(
            m.contains("gw-md.toml") && m.contains("market_data.confirm_ms"),
            "{m}"
        );
        let m = with_market_data("channels = [77]\n").unwrap_err();
        assert!(
            m.contains("market_data.channels") && m.contains("77"),
            "{m}"
        );
        let m = with_market_data("reference = \"vwap\"\n").unwrap_err();
        assert!(m.contains("gw-md.toml") && m.contains("vwap"), "{m}");
        let m = with_market_data("[reference_prices]\nAAPL = 1.0\n").unwrap_err();
        assert!(
            m.contains("reference_prices") && m.contains("market_data"),
            "{m}"
        );
        // A relative bus config resolves against the gateway config's folder.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gw.toml");
        let text = std::fs::read_to_string(example()).unwrap();
        let cut = text.find("\n[reference_prices]").unwrap();
        std::fs::write(
            &path,
            format!(
                "{}[market_data]\nconfig = \"md-missing.toml\"\nlocal = \"10.0.0.1\"\npublisher = \"10.0.0.1\"\n",
                &text[..=cut]
            ),
        )
        .unwrap();
        let m = format!(
            "{:#}",
            anyhow::Error::from(Config::load(&path).unwrap_err())
        );
        assert!(m.contains("market_data.config"), "{m}");
        assert!(
            m.contains(&dir.path().join("md-missing.toml").display().to_string()),
            "{m}"
        );
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
