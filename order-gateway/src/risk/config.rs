//! The `[risk]` configuration: per-account limits, engine grants, firm-wide limits and
//! the knobs of the engine sessions the risk section carries, with the errors validation
//! reports (each names its key).

use serde::Deserialize;

/// Risk limits of one account.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountLimits {
    /// Account number.
    pub id: u32,
    /// Maximum quantity of one order.
    pub max_order_qty: u32,
    /// Maximum notional of one order, in whole currency units.
    pub max_order_notional: i64,
    /// Maximum open plus executed notional, in whole currency units.
    pub credit_limit: i64,
    /// Maximum absolute position per symbol, counting open orders on the same side.
    pub max_position: i64,
    /// Maximum number of open orders.
    pub max_open_orders: u32,
    /// Maximum new orders accepted in any throttle interval (a sliding window).
    pub max_orders_per_interval: u32,
    /// Maximum cancels accepted in any throttle interval (absent: `max_orders_per_interval`).
    /// Only an engine's own cancels count; kill switches, cancel-all, mass cancels and
    /// cancel-on-disconnect are never throttled.
    #[serde(default)]
    pub max_cancels_per_interval: Option<u32>,
    /// Maximum replaces accepted in any throttle interval (absent: `max_orders_per_interval`).
    #[serde(default)]
    pub max_replaces_per_interval: Option<u32>,
    /// Price collar: maximum distance from the reference price, in basis points.
    pub collar_bps: u32,
}

/// The accounts an engine may trade, and the secret it logs on with.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineGrant {
    /// Engine id (named by the engine in its logon).
    pub id: u32,
    /// Accounts granted.
    pub accounts: Vec<u32>,
    /// The engine's own secret, 1..=32 bytes, presented in its logon: one engine's token
    /// cannot log on as another engine.
    pub token: String,
}

impl std::fmt::Debug for EngineGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token stays out of logs and panic messages.
        f.debug_struct("EngineGrant")
            .field("id", &self.id)
            .field("accounts", &self.accounts)
            .finish_non_exhaustive()
    }
}

/// Firm-wide limits across every account (`[risk.firm]`). An absent key defaults to the sum
/// of that limit over the configured accounts, so the firm is never looser than its accounts
/// together; set them lower to cap what all accounts may do at once.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirmLimits {
    /// Maximum open plus executed notional of all accounts, whole currency units.
    #[serde(default)]
    pub credit_limit: Option<i64>,
    /// Maximum gross notional of the open orders of all accounts (buys and sells added),
    /// whole currency units: what may be outstanding at the venue at once.
    #[serde(default)]
    pub max_gross_notional: Option<i64>,
    /// Maximum open orders of all accounts.
    #[serde(default)]
    pub max_open_orders: Option<u32>,
}

fn default_max_identical_orders() -> u32 {
    10
}

fn default_identical_order_window_ms() -> u64 {
    1000
}

fn default_max_malformed_frames() -> u32 {
    100
}

fn default_response_history() -> usize {
    RESPONSE_HISTORY
}

/// Responses kept per engine for replay after a reconnect by default (about 2.7 MB per
/// engine; `risk.response_history` sets it). An engine that was away for more responses
/// than are kept is refused with
/// [`LogonStatus::ReplayUnavailable`](crate::proto::LogonStatus::ReplayUnavailable) and must
/// rebuild its state another way. Owned here, with the setting it is the default of, so
/// risk needs nothing from the gateway; [`crate::gateway::RESPONSE_HISTORY`] re-exports it.
pub const RESPONSE_HISTORY: usize = 1 << 16;

/// Largest `response_history` accepted (about 700 MB per engine at this size).
pub const MAX_RESPONSE_HISTORY: usize = 1 << 24;

/// Risk configuration (the `[risk]` table of the gateway config).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskConfig {
    /// Per-account limits.
    pub accounts: Vec<AccountLimits>,
    /// Firm-wide limits (optional table; see [`FirmLimits`] for the defaults).
    #[serde(default)]
    pub firm: FirmLimits,
    /// Engine → account grants.
    pub engines: Vec<EngineGrant>,
    /// Symbols nobody may trade.
    #[serde(default)]
    pub restricted_symbols: Vec<String>,
    /// A reference price older than this rejects.
    pub reference_max_age_ms: u64,
    /// Length of the sliding window of the new-order, cancel and replace throttles (>= 1).
    pub throttle_interval_ms: u64,
    /// The same order (account, symbol, side, quantity, price) accepted this many times
    /// within `identical_order_window_ms` rejects the next one (`RepeatedOrder`); 0 turns
    /// the check off. Default 10.
    #[serde(default = "default_max_identical_orders")]
    pub max_identical_orders: u32,
    /// The sliding window of the repeated-order check. Default 1000.
    #[serde(default = "default_identical_order_window_ms")]
    pub identical_order_window_ms: u64,
    /// Malformed frames an engine connection may send; the one that reaches it disconnects
    /// the engine (cancel-on-disconnect runs) and nothing more from it is taken until it logs
    /// on again. Default 100.
    #[serde(default = "default_max_malformed_frames")]
    pub max_malformed_frames: u32,
    /// Responses kept per engine for replay on reconnect (1..=2^24). Default 65536.
    #[serde(default = "default_response_history")]
    pub response_history: usize,
    /// Trading window start, "HH:MM" or "HH:MM:SS" local time in `timezone`. Absent (with
    /// `trading_end`): no window.
    #[serde(default)]
    pub trading_start: Option<String>,
    /// Trading window end (exclusive), in `timezone`; may be before the start to wrap
    /// midnight.
    #[serde(default)]
    pub trading_end: Option<String>,
    /// IANA time zone of `trading_start`/`trading_end`, e.g. "America/New_York" (the
    /// database is built in). Default "UTC".
    #[serde(default)]
    pub timezone: Option<String>,
    /// The older form: trading window start in UTC (not with `trading_start` or `timezone`).
    #[serde(default)]
    pub trading_start_utc: Option<String>,
    /// The older form: trading window end in UTC.
    #[serde(default)]
    pub trading_end_utc: Option<String>,
}

/// A configuration value the risk engine cannot use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RiskConfigError {
    /// A symbol is not 1..=8 printable ASCII bytes.
    #[error("risk.restricted_symbols: invalid symbol {0:?}")]
    BadSymbol(String),
    /// A time of day does not parse.
    #[error("risk.{key}: invalid time of day {value:?} (want HH:MM or HH:MM:SS)")]
    BadTime {
        /// Config key.
        key: &'static str,
        /// Value found.
        value: String,
    },
    /// Only one end of the trading window is set.
    #[error("risk: trading_start and trading_end must be set together")]
    HalfWindow,
    /// `timezone` names no zone of the IANA database.
    #[error("risk.timezone: {0:?} is not an IANA time zone (e.g. \"America/New_York\", \"UTC\")")]
    BadTimeZone(String),
    /// The UTC-only keys beside `trading_start`/`trading_end` or `timezone`.
    #[error(
        "risk: trading_start_utc/trading_end_utc are UTC: with a timezone, use trading_start \
         and trading_end instead"
    )]
    MixedWindowKeys,
    /// An engine's token is empty or longer than 32 bytes.
    #[error("risk.engines: engine {0}: token must be 1..=32 bytes")]
    BadEngineToken(u32),
    /// A limit that must be positive is not.
    #[error("risk.{0}: must be at least 1")]
    NotPositive(&'static str),
    /// `response_history` is out of range.
    #[error("risk.response_history: must be 1..={max}", max = MAX_RESPONSE_HISTORY)]
    BadResponseHistory,
    /// Two `[[risk.engines]]` entries have the same id.
    #[error("risk.engines: engine {0} is configured twice")]
    DuplicateEngine(u32),
    /// An engine grants an account that has no limits.
    #[error("risk.engines: engine {engine} is granted account {account}, which has no [[risk.accounts]] entry")]
    GrantWithoutAccount {
        /// Engine.
        engine: u32,
        /// Account.
        account: u32,
    },
}
