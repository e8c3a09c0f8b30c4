//! Pre-trade risk controls in the style of SEC Rule 15c3-5, configured per account.
//!
//! [`RiskEngine`] is a pure state machine: the gateway feeds it orders, fills, reference
//! prices, halts and the time (`now`, nanoseconds since the UNIX epoch) and it answers
//! accept or a [`RejectReason`]. It keeps the accounting every rule needs (open and executed
//! notional, positions with open quantity per side, open-order counts, throttle windows) and
//! never does I/O. Symbols are fixed-size keys ([`Symbol`]), so the check path hashes 8 bytes
//! and does not allocate except when a symbol is first seen on an account. The maps use
//! FxHash (`rustc-hash`), not SipHash: keys are integers and symbols from our own config and
//! engines, hashing is on the per-order path, and flooding resistance buys nothing here
//! (an engine that floods is stopped by the throttle and its token).
//!
//! Every check fails closed: an unknown account, a missing or stale reference price, a time
//! outside the window all reject.
//!
//! Besides the per-account rules: firm-wide limits across every account ([`FirmLimits`]),
//! sliding-window throttles on new orders, cancels and replaces ([`SlidingWindow`]), and a
//! check on the same order repeated too often ([`RiskConfig::max_identical_orders`]). Their
//! state is rebuilt from the journal like the rest: the gateway journals the time of every
//! decision and replays it through [`RiskEngine::restore_request`].

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use serde::Deserialize;

use crate::proto::{RejectReason, Side, Symbol, PRICE_SCALE};

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

/// What a kill switch applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KillScope {
    /// Everything.
    Global,
    /// One engine.
    Engine(u32),
    /// One account.
    Account(u32),
}

/// The fields of an order the checks look at.
#[derive(Clone, Copy, Debug)]
pub struct OrderParams {
    /// Account.
    pub account: u32,
    /// Instrument.
    pub symbol: Symbol,
    /// Side.
    pub side: Side,
    /// Quantity.
    pub qty: u32,
    /// Limit price, 4 implied decimals.
    pub price: i64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Position {
    net: i64,
    open_buy: i64,
    open_sell: i64,
}

/// The engine requests the throttles count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A new order.
    New = 0,
    /// An engine's cancel of one order.
    Cancel = 1,
    /// A replace.
    Replace = 2,
}

/// Slots of a [`SlidingWindow`].
const WINDOW_SLOTS: usize = 64;

/// A sliding-window request counter with fixed memory: the interval is cut into slots of
/// `interval / 63` (rounded up) and the last 64 slots are counted, so a request counts for at
/// least the whole interval and at most 64/63 of it. It never lets more than the limit
/// through in any interval, wherever the interval starts (a fixed window lets twice the
/// limit through across its boundary), and costs the same whatever the limit. Checking is
/// O(1) (at most 64 slots are cleared when time jumps ahead), with no allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    slots: [u32; WINDOW_SLOTS],
    /// Slot number (`now / slot_ns`) of the newest slot.
    head: u64,
    /// Sum of `slots`.
    total: u64,
}

impl Default for SlidingWindow {
    fn default() -> Self {
        SlidingWindow {
            slots: [0; WINDOW_SLOTS],
            head: 0,
            total: 0,
        }
    }
}

impl SlidingWindow {
    /// The slot length for an interval of `interval_ns` (> 0).
    pub fn slot_ns(interval_ns: u64) -> u64 {
        interval_ns.div_ceil(WINDOW_SLOTS as u64 - 1).max(1)
    }

    /// Moves the window to slot `slot`, forgetting the slots that left it. A clock that
    /// steps back keeps counting into the newest slot (the strict side).
    fn advance(&mut self, slot: u64) {
        if slot <= self.head {
            return;
        }
        let steps = (slot - self.head).min(WINDOW_SLOTS as u64);
        for i in 1..=steps {
            let s = &mut self.slots[((self.head + i) % WINDOW_SLOTS as u64) as usize];
            self.total -= u64::from(*s);
            *s = 0;
        }
        self.head = slot;
    }

    /// Requests counted in the window ending at slot `slot`.
    pub fn count(&mut self, slot: u64) -> u64 {
        self.advance(slot);
        self.total
    }

    /// [`count`](Self::count) without moving the window (for status and tests).
    pub fn peek(&self, slot: u64) -> u64 {
        if slot <= self.head {
            return self.total;
        }
        let steps = slot - self.head;
        if steps >= WINDOW_SLOTS as u64 {
            return 0;
        }
        let leaving: u64 = (1..=steps)
            .map(|i| u64::from(self.slots[((self.head + i) % WINDOW_SLOTS as u64) as usize]))
            .sum();
        self.total - leaving
    }

    /// Counts one request at slot `slot`.
    pub fn add(&mut self, slot: u64) {
        self.advance(slot);
        let s = &mut self.slots[(self.head % WINDOW_SLOTS as u64) as usize];
        *s = s.saturating_add(1);
        self.total += 1;
    }
}

/// The terms the repeated-order check compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Terms {
    account: u32,
    symbol: Symbol,
    side: Side,
    qty: u32,
    price: i64,
}

impl From<&OrderParams> for Terms {
    fn from(o: &OrderParams) -> Terms {
        Terms {
            account: o.account,
            symbol: o.symbol,
            side: o.side,
            qty: o.qty,
            price: o.price,
        }
    }
}

/// New orders remembered by the repeated-order check; past this many within its window the
/// oldest is forgotten early (counted in [`RiskEngine::identical_evictions`]).
pub const IDENTICAL_ORDERS_TRACKED: usize = 1 << 16;

/// The repeated-order check: the accepted new orders of the last window, oldest first, and
/// how many of each terms are among them. Exact (timestamps, not slots); O(1) amortized per
/// order (each entry is removed once); memory bounded by [`IDENTICAL_ORDERS_TRACKED`].
/// A check expires what left the window at its `now`, which the journal replays exactly
/// as long as the clock does not step back (after a step back, replay may remember orders
/// live had forgotten: the strict side).
#[derive(Debug, Default)]
struct Identical {
    max: u32,
    window_ns: u64,
    recent: VecDeque<(Terms, u64)>,
    counts: FxHashMap<Terms, u32>,
    evicted: u64,
}

impl Identical {
    fn forget_oldest(&mut self) {
        if let Some((t, _)) = self.recent.pop_front() {
            if let Some(c) = self.counts.get_mut(&t) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&t);
                }
            }
        }
    }

    fn expire(&mut self, now: u64) {
        while let Some(&(_, at)) = self.recent.front() {
            if now.saturating_sub(at) < self.window_ns {
                break;
            }
            self.forget_oldest();
        }
    }

    fn count(&mut self, t: &Terms, now: u64) -> u32 {
        self.expire(now);
        self.counts.get(t).copied().unwrap_or(0)
    }

    /// [`count`](Self::count) without expiring anything.
    fn peek(&self, t: &Terms, now: u64) -> u32 {
        let expired = self
            .recent
            .iter()
            .take_while(|(_, at)| now.saturating_sub(*at) >= self.window_ns)
            .filter(|(x, _)| x == t)
            .count() as u32;
        self.counts.get(t).copied().unwrap_or(0) - expired
    }

    fn add(&mut self, t: Terms, now: u64) {
        if self.max == 0 {
            return;
        }
        self.expire(now);
        if self.recent.len() >= IDENTICAL_ORDERS_TRACKED {
            self.forget_oldest();
            self.evicted += 1;
        }
        self.recent.push_back((t, now));
        *self.counts.entry(t).or_insert(0) += 1;
    }
}

/// Firm-wide accounting and limits, in price-scale units.
#[derive(Debug, Default)]
struct Firm {
    credit_limit: i128,
    gross_limit: i128,
    max_open_orders: u64,
    open_notional: i128,
    executed_notional: i128,
    open_orders: u64,
}

#[derive(Debug)]
struct Account {
    limits: AccountLimits,
    killed: bool,
    /// Notional in price-scale units (qty × price), so no rounding happens in accounting.
    open_notional: i128,
    executed_notional: i128,
    open_orders: u32,
    positions: FxHashMap<Symbol, Position>,
    /// Throttles, indexed by [`RequestKind`].
    throttle: [SlidingWindow; 3],
}

impl Account {
    fn throttle_limit(&self, kind: RequestKind) -> u32 {
        let l = &self.limits;
        match kind {
            RequestKind::New => l.max_orders_per_interval,
            RequestKind::Cancel => l
                .max_cancels_per_interval
                .unwrap_or(l.max_orders_per_interval),
            RequestKind::Replace => l
                .max_replaces_per_interval
                .unwrap_or(l.max_orders_per_interval),
        }
    }
}

#[derive(Debug)]
struct Engine {
    accounts: Vec<u32>,
    killed: bool,
}

/// The risk state machine.
#[derive(Debug)]
pub struct RiskEngine {
    accounts: FxHashMap<u32, Account>,
    engines: FxHashMap<u32, Engine>,
    restricted: FxHashSet<Symbol>,
    halted: FxHashSet<Symbol>,
    references: FxHashMap<Symbol, (i64, u64)>,
    seen_ids: FxHashSet<(u32, u64)>,
    global_kill: bool,
    reference_max_age_ns: u64,
    /// Slot length of the throttles' sliding windows.
    throttle_slot_ns: u64,
    firm: Firm,
    identical: Identical,
    /// The trading window, in its time zone.
    window: Option<crate::trading_window::TradingWindow>,
}

/// Notional in price-scale units.
fn notional(qty: u32, price: i64) -> i128 {
    i128::from(qty) * i128::from(price).abs()
}

fn scaled(whole_units: i64) -> i128 {
    i128::from(whole_units) * i128::from(PRICE_SCALE)
}

impl RiskEngine {
    /// Builds the engine from validated config.
    pub fn new(cfg: &RiskConfig) -> Result<RiskEngine, RiskConfigError> {
        let mut restricted = FxHashSet::default();
        for s in &cfg.restricted_symbols {
            restricted.insert(Symbol::new(s).ok_or_else(|| RiskConfigError::BadSymbol(s.clone()))?);
        }
        let window = crate::trading_window::TradingWindow::from_config(cfg)?;
        let accounts: FxHashMap<u32, Account> = cfg
            .accounts
            .iter()
            .map(|l| {
                let a = Account {
                    limits: l.clone(),
                    killed: false,
                    open_notional: 0,
                    executed_notional: 0,
                    open_orders: 0,
                    positions: FxHashMap::with_capacity_and_hasher(64, Default::default()),
                    throttle: Default::default(),
                };
                (l.id, a)
            })
            .collect();
        for (i, e) in cfg.engines.iter().enumerate() {
            if crate::proto::pad_token(e.token.as_bytes()).is_none() {
                return Err(RiskConfigError::BadEngineToken(e.id));
            }
            if cfg.engines[..i].iter().any(|o| o.id == e.id) {
                return Err(RiskConfigError::DuplicateEngine(e.id));
            }
            if let Some(&account) = e.accounts.iter().find(|a| !accounts.contains_key(a)) {
                return Err(RiskConfigError::GrantWithoutAccount {
                    engine: e.id,
                    account,
                });
            }
        }
        let engines = cfg
            .engines
            .iter()
            .map(|e| {
                (
                    e.id,
                    Engine {
                        accounts: e.accounts.clone(),
                        killed: false,
                    },
                )
            })
            .collect();
        if cfg.throttle_interval_ms == 0 {
            return Err(RiskConfigError::NotPositive("throttle_interval_ms"));
        }
        if cfg.max_identical_orders > 0 && cfg.identical_order_window_ms == 0 {
            return Err(RiskConfigError::NotPositive("identical_order_window_ms"));
        }
        if cfg.max_malformed_frames == 0 {
            return Err(RiskConfigError::NotPositive("max_malformed_frames"));
        }
        if !(1..=MAX_RESPONSE_HISTORY).contains(&cfg.response_history) {
            return Err(RiskConfigError::BadResponseHistory);
        }
        let f = &cfg.firm;
        for (key, v) in [
            ("firm.credit_limit", f.credit_limit),
            ("firm.max_gross_notional", f.max_gross_notional),
            ("firm.max_open_orders", f.max_open_orders.map(i64::from)),
        ] {
            if v.is_some_and(|v| v < 1) {
                return Err(RiskConfigError::NotPositive(key));
            }
        }
        let sum_credit: i128 = cfg.accounts.iter().map(|a| scaled(a.credit_limit)).sum();
        let firm = Firm {
            credit_limit: f.credit_limit.map_or(sum_credit, scaled),
            gross_limit: f.max_gross_notional.map_or(sum_credit, scaled),
            max_open_orders: f.max_open_orders.map_or_else(
                || {
                    cfg.accounts
                        .iter()
                        .map(|a| u64::from(a.max_open_orders))
                        .sum()
                },
                u64::from,
            ),
            ..Firm::default()
        };
        Ok(RiskEngine {
            accounts,
            engines,
            restricted,
            halted: FxHashSet::default(),
            references: FxHashMap::with_capacity_and_hasher(1024, Default::default()),
            seen_ids: FxHashSet::with_capacity_and_hasher(1 << 16, Default::default()),
            global_kill: false,
            reference_max_age_ns: cfg.reference_max_age_ms.saturating_mul(1_000_000),
            throttle_slot_ns: SlidingWindow::slot_ns(
                cfg.throttle_interval_ms.saturating_mul(1_000_000),
            ),
            firm,
            identical: Identical {
                max: cfg.max_identical_orders,
                window_ns: cfg.identical_order_window_ms.saturating_mul(1_000_000),
                recent: VecDeque::with_capacity(1024),
                counts: FxHashMap::with_capacity_and_hasher(1024, Default::default()),
                evicted: 0,
            },
            window,
        })
    }

    /// Records a reference price (from the market-data bus) observed at `now`.
    pub fn on_reference_price(&mut self, symbol: Symbol, price: i64, now: u64) {
        self.references.insert(symbol, (price, now));
    }

    /// Sets or clears a halt (from the feed).
    pub fn on_halt(&mut self, symbol: Symbol, halted: bool) {
        if halted {
            self.halted.insert(symbol);
        } else {
            self.halted.remove(&symbol);
        }
    }

    /// Turns a kill switch on or off.
    pub fn set_kill(&mut self, scope: KillScope, on: bool) {
        match scope {
            KillScope::Global => self.global_kill = on,
            KillScope::Engine(id) => {
                if let Some(e) = self.engines.get_mut(&id) {
                    e.killed = on;
                }
            }
            KillScope::Account(id) => {
                if let Some(a) = self.accounts.get_mut(&id) {
                    a.killed = on;
                }
            }
        }
    }

    /// The journaled part of the state, for a checkpoint.
    pub fn checkpoint_state(&self) -> crate::checkpoint::RiskState {
        use crate::checkpoint::{AccountState, RiskState};
        let mut accounts: Vec<AccountState> = self
            .accounts
            .iter()
            .map(|(&id, a)| AccountState {
                id,
                killed: a.killed,
                open_notional: a.open_notional,
                executed_notional: a.executed_notional,
                open_orders: a.open_orders,
                positions: a
                    .positions
                    .iter()
                    .map(|(s, p)| (s.0, p.net, p.open_buy, p.open_sell))
                    .collect(),
                throttle: a
                    .throttle
                    .iter()
                    .map(|w| crate::checkpoint::WindowState {
                        slots: w.slots.to_vec(),
                        head: w.head,
                        total: w.total,
                    })
                    .collect(),
            })
            .collect();
        accounts.sort_unstable_by_key(|a| a.id);
        let mut killed_engines: Vec<u32> = self
            .engines
            .iter()
            .filter(|(_, e)| e.killed)
            .map(|(&id, _)| id)
            .collect();
        killed_engines.sort_unstable();
        RiskState {
            global_kill: self.global_kill,
            killed_engines,
            accounts,
            seen_ids: self.seen_ids.iter().copied().collect(),
            firm: (
                self.firm.open_notional,
                self.firm.executed_notional,
                self.firm.open_orders,
            ),
            identical: self
                .identical
                .recent
                .iter()
                .map(|(t, at)| (t.account, t.symbol.0, t.side as u8, t.qty, t.price, *at))
                .collect(),
            identical_evicted: self.identical.evicted,
        }
    }

    /// Restores what [`checkpoint_state`](Self::checkpoint_state) took. Accounts and engines
    /// no longer in the configuration are left out (as replay would).
    pub fn restore_state(&mut self, s: &crate::checkpoint::RiskState) {
        self.global_kill = s.global_kill;
        for (id, e) in &mut self.engines {
            e.killed = s.killed_engines.contains(id);
        }
        for a in &s.accounts {
            if let Some(acct) = self.accounts.get_mut(&a.id) {
                acct.killed = a.killed;
                acct.open_notional = a.open_notional;
                acct.executed_notional = a.executed_notional;
                acct.open_orders = a.open_orders;
                acct.positions = a
                    .positions
                    .iter()
                    .map(|&(sym, net, open_buy, open_sell)| {
                        (
                            Symbol(sym),
                            Position {
                                net,
                                open_buy,
                                open_sell,
                            },
                        )
                    })
                    .collect();
                for (w, c) in acct.throttle.iter_mut().zip(&a.throttle) {
                    if let Ok(slots) = <[u32; WINDOW_SLOTS]>::try_from(c.slots.as_slice()) {
                        *w = SlidingWindow {
                            slots,
                            head: c.head,
                            total: c.total,
                        };
                    }
                }
            }
        }
        self.seen_ids.clear();
        self.seen_ids.extend(s.seen_ids.iter().copied());
        (
            self.firm.open_notional,
            self.firm.executed_notional,
            self.firm.open_orders,
        ) = s.firm;
        self.identical.recent.clear();
        self.identical.counts.clear();
        for &(account, symbol, side, qty, price, at) in &s.identical {
            let t = Terms {
                account,
                symbol: Symbol(symbol),
                side: if side == Side::Sell as u8 {
                    Side::Sell
                } else {
                    Side::Buy
                },
                qty,
                price,
            };
            self.identical.recent.push_back((t, at));
            *self.identical.counts.entry(t).or_insert(0) += 1;
        }
        self.identical.evicted = s.identical_evicted;
    }

    /// Takes from `old` what the journal does not hold: reference prices and halts (used
    /// when the gateway rebuilds its state from the journal while running, so a rebuild
    /// never lifts a halt). Kill switches are not taken: one is acknowledged only once its
    /// record is durable, so the journal holds every kill switch in effect, and a kill
    /// whose record failed to append did not happen (its operator was told so).
    pub fn inherit_live_state(&mut self, old: &RiskEngine) {
        self.halted.clone_from(&old.halted);
        self.references.clone_from(&old.references);
    }

    /// The kill switches that are on: global, then engines, then accounts (sorted).
    pub fn kills(&self) -> (bool, Vec<u32>, Vec<u32>) {
        let mut engines: Vec<u32> = self
            .engines
            .iter()
            .filter(|(_, e)| e.killed)
            .map(|(id, _)| *id)
            .collect();
        let mut accounts: Vec<u32> = self
            .accounts
            .iter()
            .filter(|(_, a)| a.killed)
            .map(|(id, _)| *id)
            .collect();
        engines.sort_unstable();
        accounts.sort_unstable();
        (self.global_kill, engines, accounts)
    }

    /// Configured account ids, sorted.
    pub fn account_ids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.accounts.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The credit limit of `account` (whole currency units; 0 if unknown).
    pub fn credit_limit(&self, account: u32) -> i64 {
        self.accounts
            .get(&account)
            .map_or(0, |a| a.limits.credit_limit)
    }

    /// True if new orders from `engine` for `account` are blocked by any kill switch.
    pub fn is_killed(&self, engine: u32, account: u32) -> bool {
        self.global_kill
            || self.engines.get(&engine).is_some_and(|e| e.killed)
            || self.accounts.get(&account).is_some_and(|a| a.killed)
    }

    /// Whether `engine` may trade `account`.
    pub fn is_granted(&self, engine: u32, account: u32) -> bool {
        self.engines
            .get(&engine)
            .is_some_and(|e| e.accounts.contains(&account))
    }

    /// Marks a client order id as used (journal recovery replays this).
    pub fn mark_seen(&mut self, engine: u32, cl_ord_id: u64) -> bool {
        self.seen_ids.insert((engine, cl_ord_id))
    }

    /// True if `engine` has used `cl_ord_id` for a new order (accepted or not).
    pub fn is_seen(&self, engine: u32, cl_ord_id: u64) -> bool {
        self.seen_ids.contains(&(engine, cl_ord_id))
    }

    /// Checks a new order; on success reserves its exposure (open notional, open quantity,
    /// open-order count, throttle slot). Release with [`RiskEngine::on_fill`] and
    /// [`RiskEngine::on_order_done`].
    pub fn check_new(
        &mut self,
        engine: u32,
        cl_ord_id: u64,
        o: &OrderParams,
        now: u64,
    ) -> Result<(), RejectReason> {
        if self.global_kill {
            return Err(RejectReason::KillSwitchGlobal);
        }
        let e = self
            .engines
            .get(&engine)
            .ok_or(RejectReason::AccountNotGranted)?;
        if e.killed {
            return Err(RejectReason::KillSwitchEngine);
        }
        if !e.accounts.contains(&o.account) {
            return Err(RejectReason::AccountNotGranted);
        }
        if !self.mark_seen(engine, cl_ord_id) {
            return Err(RejectReason::DuplicateClientOrderId);
        }
        self.check_order(o, now)?;
        let a = self
            .accounts
            .get(&o.account)
            .ok_or(RejectReason::UnknownAccount)?;
        if a.open_orders >= a.limits.max_open_orders {
            return Err(RejectReason::MaxOpenOrders);
        }
        if self.firm.open_orders >= self.firm.max_open_orders {
            return Err(RejectReason::FirmMaxOpenOrders);
        }
        self.check_throttle(RequestKind::New, o.account, now)?;
        let terms = Terms::from(o);
        if self.identical.max > 0 && self.identical.count(&terms, now) >= self.identical.max {
            return Err(RejectReason::RepeatedOrder);
        }
        self.restore_open(o);
        self.restore_request(RequestKind::New, o, now);
        Ok(())
    }

    /// Rejects with `Throttled` if `account` has used up its `kind` throttle at `now`.
    /// Looks without moving the window: only accepted requests change it, so the journal
    /// (which has their times) rebuilds it exactly, even across a clock step back.
    fn check_throttle(
        &self,
        kind: RequestKind,
        account: u32,
        now: u64,
    ) -> Result<(), RejectReason> {
        let slot = now / self.throttle_slot_ns;
        let a = self
            .accounts
            .get(&account)
            .ok_or(RejectReason::UnknownAccount)?;
        let limit = a.throttle_limit(kind);
        if a.throttle[kind as usize].peek(slot) >= u64::from(limit) {
            return Err(RejectReason::Throttled);
        }
        Ok(())
    }

    /// Counts an accepted request of `kind` on `o.account` at `now` in the throttles and, for
    /// a new order, in the repeated-order check. Called by the checks when they accept, and
    /// by journal recovery for every accepted request (with the time it was decided), so
    /// the windows after a restart are those before it.
    pub fn restore_request(&mut self, kind: RequestKind, o: &OrderParams, now: u64) {
        let slot = now / self.throttle_slot_ns;
        if let Some(a) = self.accounts.get_mut(&o.account) {
            a.throttle[kind as usize].add(slot);
        }
        if kind == RequestKind::New {
            self.identical.add(Terms::from(o), now);
        }
    }

    /// Checks an engine's cancel of an open order of `account` (the cancel throttle) and
    /// counts it if accepted.
    pub fn check_cancel(&mut self, o: &OrderParams, now: u64) -> Result<(), RejectReason> {
        self.check_throttle(RequestKind::Cancel, o.account, now)?;
        self.restore_request(RequestKind::Cancel, o, now);
        Ok(())
    }

    /// Checks a replace of an open order (`old` with `old_leaves` open) into `new` (its open
    /// part). The reservation stays on the old terms: move it with
    /// [`RiskEngine::move_reservation`] when the venue confirms.
    pub fn check_replace(
        &mut self,
        engine: u32,
        old: &OrderParams,
        old_leaves: u32,
        new: &OrderParams,
        now: u64,
    ) -> Result<(), RejectReason> {
        if self.global_kill {
            return Err(RejectReason::KillSwitchGlobal);
        }
        if self.engines.get(&engine).is_some_and(|e| e.killed) {
            return Err(RejectReason::KillSwitchEngine);
        }
        let a = self
            .accounts
            .get_mut(&old.account)
            .ok_or(RejectReason::UnknownAccount)?;
        let old_open = OrderParams {
            qty: old_leaves,
            ..*old
        };
        Self::reserve(a, &mut self.firm, &old_open, -1);
        let r = self.check_order(new, now);
        let a = self
            .accounts
            .get_mut(&old.account)
            .ok_or(RejectReason::UnknownAccount)?;
        Self::reserve(a, &mut self.firm, &old_open, 1);
        r?;
        self.check_throttle(RequestKind::Replace, old.account, now)?;
        self.restore_request(RequestKind::Replace, new, now);
        Ok(())
    }

    /// Moves an open order's reservation from `from` to `to` (a confirmed replace).
    pub fn move_reservation(&mut self, from: &OrderParams, to: &OrderParams) {
        if let Some(a) = self.accounts.get_mut(&from.account) {
            Self::reserve(a, &mut self.firm, from, -1);
            Self::reserve(a, &mut self.firm, to, 1);
        }
    }

    /// The stateless and exposure rules shared by new orders and replaces.
    fn check_order(&self, o: &OrderParams, now: u64) -> Result<(), RejectReason> {
        let a = self
            .accounts
            .get(&o.account)
            .ok_or(RejectReason::UnknownAccount)?;
        if a.killed {
            return Err(RejectReason::KillSwitchAccount);
        }
        let l = &a.limits;
        if o.qty == 0 || o.qty > l.max_order_qty {
            return Err(RejectReason::MaxQuantity);
        }
        if o.price <= 0 {
            return Err(RejectReason::InvalidPrice);
        }
        if self.restricted.contains(&o.symbol) {
            return Err(RejectReason::RestrictedSymbol);
        }
        if self.halted.contains(&o.symbol) {
            return Err(RejectReason::Halted);
        }
        if let Some(w) = &self.window {
            if !w.is_open(now) {
                return Err(RejectReason::OutsideTradingHours);
            }
        }
        let &(ref_px, at) = self
            .references
            .get(&o.symbol)
            .ok_or(RejectReason::NoReferencePrice)?;
        if now.saturating_sub(at) > self.reference_max_age_ns || at > now {
            return Err(RejectReason::StaleReferencePrice);
        }
        let dist = i128::from((o.price - ref_px).abs()) * 10_000;
        if dist > i128::from(ref_px.abs()) * i128::from(l.collar_bps) {
            return Err(RejectReason::PriceCollar);
        }
        let n = notional(o.qty, o.price);
        if n > scaled(l.max_order_notional) {
            return Err(RejectReason::MaxNotional);
        }
        if a.open_notional + a.executed_notional + n > scaled(l.credit_limit) {
            return Err(RejectReason::CreditLimit);
        }
        let f = &self.firm;
        if f.open_notional + f.executed_notional + n > f.credit_limit {
            return Err(RejectReason::FirmCreditLimit);
        }
        if f.open_notional + n > f.gross_limit {
            return Err(RejectReason::FirmGrossNotional);
        }
        let p = a.positions.get(&o.symbol).copied().unwrap_or_default();
        let qty = i64::from(o.qty);
        let worst = match o.side {
            Side::Buy => p.net + p.open_buy + qty,
            Side::Sell => -(p.net - p.open_sell - qty),
        };
        if worst > l.max_position {
            return Err(RejectReason::PositionLimit);
        }
        Ok(())
    }

    fn reserve(a: &mut Account, firm: &mut Firm, o: &OrderParams, sign: i64) {
        let n = i128::from(sign) * notional(o.qty, o.price);
        a.open_notional += n;
        firm.open_notional += n;
        let p = a.positions.entry(o.symbol).or_default();
        match o.side {
            Side::Buy => p.open_buy += sign * i64::from(o.qty),
            Side::Sell => p.open_sell += sign * i64::from(o.qty),
        }
    }

    /// Adds an execution of `qty` at `px` (negative `sign`: takes it back) to the position
    /// and the executed notional of the account and the firm.
    fn execute(a: &mut Account, firm: &mut Firm, o: &OrderParams, qty: u32, px: i64, sign: i64) {
        let n = i128::from(sign) * notional(qty, px);
        a.executed_notional += n;
        firm.executed_notional += n;
        let p = a.positions.entry(o.symbol).or_default();
        let q = sign * i64::from(qty);
        p.net += if o.side == Side::Buy { q } else { -q };
    }

    /// Re-creates the reservation of an order accepted before a restart (journal recovery).
    pub fn restore_open(&mut self, o: &OrderParams) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            a.open_orders += 1;
            self.firm.open_orders += 1;
            Self::reserve(a, &mut self.firm, o, 1);
        }
    }

    /// An execution of `qty` at `px` on an order resting at `order_px`.
    pub fn on_fill(&mut self, o: &OrderParams, qty: u32, px: i64) {
        self.on_execution(o, qty, px, qty);
    }

    /// An execution of `qty` at `px` that releases only `released` of the order's reservation
    /// (less than `qty` when the venue executes more than was open: an over-fill, or a fill
    /// after the order was final).
    pub fn on_execution(&mut self, o: &OrderParams, qty: u32, px: i64, released: u32) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            let open = OrderParams {
                qty: released,
                ..*o
            };
            Self::reserve(a, &mut self.firm, &open, -1);
            Self::execute(a, &mut self.firm, o, qty, px, 1);
        }
    }

    /// Takes back an execution of `qty` at `px` (a trade cancel, or the old terms of a trade
    /// correct): position and executed notional as if it had not happened. Reservations are
    /// the caller's (the venue says what is open again).
    pub fn on_execution_reversed(&mut self, o: &OrderParams, qty: u32, px: i64) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            Self::execute(a, &mut self.firm, o, qty, px, -1);
        }
    }

    /// The order is final (filled, canceled or rejected) with `leaves` still reserved.
    pub fn on_order_done(&mut self, o: &OrderParams, leaves: u32) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            Self::reserve(a, &mut self.firm, &OrderParams { qty: leaves, ..*o }, -1);
            if a.open_orders > 0 {
                a.open_orders -= 1;
                self.firm.open_orders -= 1;
            }
        }
    }

    /// Net position of `account` in `symbol`.
    pub fn position(&self, account: u32, symbol: Symbol) -> i64 {
        self.accounts
            .get(&account)
            .and_then(|a| a.positions.get(&symbol))
            .map_or(0, |p| p.net)
    }

    /// Open orders of `account`.
    pub fn open_orders(&self, account: u32) -> u32 {
        self.accounts.get(&account).map_or(0, |a| a.open_orders)
    }

    /// Open and executed notional of `account`, in whole currency units (rounded down).
    pub fn exposure(&self, account: u32) -> (i64, i64) {
        let s = i128::from(PRICE_SCALE);
        self.accounts.get(&account).map_or((0, 0), |a| {
            (
                (a.open_notional / s) as i64,
                (a.executed_notional / s) as i64,
            )
        })
    }
}

impl RiskEngine {
    /// Firm-wide open orders, open notional and executed notional (whole currency units,
    /// rounded down).
    pub fn firm_exposure(&self) -> (u64, i64, i64) {
        let s = i128::from(PRICE_SCALE);
        let f = &self.firm;
        (
            f.open_orders,
            (f.open_notional / s) as i64,
            (f.executed_notional / s) as i64,
        )
    }

    /// Firm-wide limits in force: open orders, gross open notional and credit (whole
    /// currency units).
    pub fn firm_limits(&self) -> (u64, i64, i64) {
        let s = i128::from(PRICE_SCALE);
        let f = &self.firm;
        let units = |v: i128| i64::try_from(v / s).unwrap_or(i64::MAX);
        (
            f.max_open_orders,
            units(f.gross_limit),
            units(f.credit_limit),
        )
    }

    /// Requests of `account` counted by its new-order, cancel and replace throttles at `now`.
    pub fn throttle_usage(&self, account: u32, now: u64) -> [u64; 3] {
        let slot = now / self.throttle_slot_ns;
        self.accounts
            .get(&account)
            .map_or([0; 3], |a| [0, 1, 2].map(|k| a.throttle[k].peek(slot)))
    }

    /// Orders with the terms of `o` counted by the repeated-order check at `now`.
    pub fn identical_count(&self, o: &OrderParams, now: u64) -> u32 {
        self.identical.peek(&Terms::from(o), now)
    }

    /// Orders the repeated-order check forgot early because more than
    /// [`IDENTICAL_ORDERS_TRACKED`] were accepted within its window.
    pub fn identical_evictions(&self) -> u64 {
        self.identical.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;
    /// 2024-01-02 15:00:00 UTC.
    const NOW: u64 = 1_704_207_600 * SEC;

    fn cfg() -> RiskConfig {
        toml::from_str(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            restricted_symbols = ["BAD"]
            trading_start_utc = "14:30"
            trading_end_utc = "21:00"
            [[accounts]]
            id = 1
            max_order_qty = 1000
            max_order_notional = 50000
            credit_limit = 100000
            max_position = 1500
            max_open_orders = 3
            max_orders_per_interval = 5
            collar_bps = 500
            [[accounts]]
            id = 2
            max_order_qty = 1000
            max_order_notional = 50000
            credit_limit = 1000000
            max_position = 1500
            max_open_orders = 100
            max_orders_per_interval = 100
            collar_bps = 500
            [[engines]]
            id = 10
            accounts = [1, 2]
            token = "t10"
            [[engines]]
            id = 11
            accounts = [2]
            token = "t11"
            "#,
        )
        .unwrap()
    }

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    fn engine() -> RiskEngine {
        let mut r = RiskEngine::new(&cfg()).unwrap();
        for s in ["AAPL", "MSFT", "BAD"] {
            r.on_reference_price(sym(s), 100 * PRICE_SCALE, NOW);
        }
        r
    }

    fn order(account: u32, qty: u32, price_units: i64) -> OrderParams {
        OrderParams {
            account,
            symbol: sym("AAPL"),
            side: Side::Buy,
            qty,
            price: price_units * PRICE_SCALE,
        }
    }

    /// Runs `o` with a fresh cl_ord_id each time.
    fn check(r: &mut RiskEngine, engine: u32, o: OrderParams) -> Result<(), RejectReason> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        // ORDERING: Relaxed, only uniqueness matters.
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        r.check_new(engine, id, &o, NOW)
    }

    #[test]
    fn max_quantity() {
        let mut r = engine();
        assert_eq!(
            check(&mut r, 10, order(2, 1001, 10)),
            Err(RejectReason::MaxQuantity)
        );
        assert_eq!(
            check(&mut r, 10, order(2, 0, 10)),
            Err(RejectReason::MaxQuantity)
        );
        // Inside the collar needs price near 100.
        assert_eq!(
            check(&mut r, 10, order(2, 1000, 40)),
            Err(RejectReason::PriceCollar)
        );
        assert_eq!(check(&mut r, 10, order(2, 400, 100)), Ok(()));
    }

    #[test]
    fn max_notional() {
        let mut r = engine();
        assert_eq!(
            check(&mut r, 10, order(2, 501, 100)),
            Err(RejectReason::MaxNotional)
        );
        assert_eq!(check(&mut r, 10, order(2, 500, 100)), Ok(()));
    }

    #[test]
    fn price_collar() {
        let mut r = engine();
        assert_eq!(
            check(&mut r, 10, order(2, 1, 106)),
            Err(RejectReason::PriceCollar)
        );
        assert_eq!(
            check(&mut r, 10, order(2, 1, 94)),
            Err(RejectReason::PriceCollar)
        );
        assert_eq!(check(&mut r, 10, order(2, 1, 105)), Ok(()));
        assert_eq!(check(&mut r, 10, order(2, 1, 95)), Ok(()));
        assert_eq!(
            check(&mut r, 10, order(2, 1, 0)),
            Err(RejectReason::InvalidPrice)
        );
    }

    #[test]
    fn reference_missing_or_stale_fails_closed() {
        let mut r = engine();
        let mut o = order(2, 1, 100);
        o.symbol = sym("IBM");
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::NoReferencePrice));
        r.on_reference_price(sym("IBM"), 100 * PRICE_SCALE, NOW - 6 * SEC);
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::StaleReferencePrice));
        r.on_reference_price(sym("IBM"), 100 * PRICE_SCALE, NOW - 4 * SEC);
        assert_eq!(check(&mut r, 10, o), Ok(()));
    }

    #[test]
    fn credit_limit_counts_open_and_executed() {
        let mut r = engine();
        let o = order(1, 500, 100); // 50_000 each
        assert_eq!(check(&mut r, 10, o), Ok(()));
        r.on_fill(&o, 500, 100 * PRICE_SCALE);
        r.on_order_done(&o, 0);
        assert_eq!(r.exposure(1), (0, 50_000));
        assert_eq!(
            check(
                &mut r,
                10,
                OrderParams {
                    side: Side::Sell,
                    ..o
                }
            ),
            Ok(())
        );
        assert_eq!(r.exposure(1), (50_000, 50_000));
        assert_eq!(
            check(&mut r, 10, order(1, 1, 100)),
            Err(RejectReason::CreditLimit)
        );
    }

    #[test]
    fn position_limit_counts_open_same_side() {
        let mut r = engine();
        let o = order(2, 400, 100);
        for _ in 0..3 {
            assert_eq!(check(&mut r, 10, o), Ok(()));
        }
        // 1200 open buy; limit 1500.
        assert_eq!(
            check(&mut r, 10, order(2, 301, 100)),
            Err(RejectReason::PositionLimit)
        );
        assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
        r.on_fill(&o, 400, 100 * PRICE_SCALE);
        assert_eq!(r.position(2, sym("AAPL")), 400);
        // Sells are checked against the short side: 400 long allows 1900 of sells.
        let sell = OrderParams {
            side: Side::Sell,
            ..order(2, 1, 100)
        };
        assert_eq!(check(&mut r, 10, sell), Ok(()));
    }

    #[test]
    fn max_open_orders() {
        let mut r = engine();
        let o = order(1, 1, 100);
        for _ in 0..3 {
            assert_eq!(check(&mut r, 10, o), Ok(()));
        }
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::MaxOpenOrders));
        r.on_order_done(&o, 1);
        assert_eq!(check(&mut r, 10, o), Ok(()));
    }

    #[test]
    fn throttle_per_interval() {
        let mut r = engine();
        let o = order(1, 1, 100);
        for i in 0..5 {
            assert_eq!(r.check_new(10, 1000 + i, &o, NOW), Ok(()));
            r.on_order_done(&o, 1);
        }
        assert_eq!(
            r.check_new(10, 1005, &o, NOW + SEC / 2),
            Err(RejectReason::Throttled)
        );
        // Counted for at least the whole interval, at most 64/63 of it.
        assert_eq!(
            r.check_new(10, 1006, &o, NOW + SEC - 1),
            Err(RejectReason::Throttled)
        );
        assert_eq!(r.check_new(10, 1007, &o, NOW + SEC + SEC / 60), Ok(()));
    }

    /// A fixed window restarts its count at its boundary and lets twice the limit through
    /// in a short span across it; the sliding window never does.
    #[test]
    fn throttle_is_a_sliding_window_not_a_fixed_one() {
        let mut r = engine();
        let o = order(1, 1, 100);
        let mut id = 2000;
        let mut send = |r: &mut RiskEngine, at: u64| {
            id += 1;
            let v = r.check_new(10, id, &o, at);
            if v.is_ok() {
                r.on_order_done(&o, 1);
            }
            v
        };
        // One order opens the (fixed) window, four more come at the end of it.
        assert_eq!(send(&mut r, NOW), Ok(()));
        for _ in 0..4 {
            assert_eq!(send(&mut r, NOW + SEC * 9 / 10), Ok(()));
        }
        // Just past the first order's interval only that one has left the window: one more,
        // not five (a fixed window would take five here: 9 orders in 0.15 s).
        let t = NOW + SEC + SEC / 20;
        assert_eq!(send(&mut r, t), Ok(()));
        assert_eq!(send(&mut r, t), Err(RejectReason::Throttled));
        assert_eq!(r.throttle_usage(1, t), [5, 0, 0]);
    }

    /// Whatever the arrival times, no interval of the configured length ever holds more
    /// accepted requests than the limit.
    #[test]
    fn sliding_window_never_exceeds_the_limit_in_any_interval() {
        let interval = 1_000_000u64;
        let slot = SlidingWindow::slot_ns(interval);
        let limit = 7;
        let mut w = SlidingWindow::default();
        let mut accepted: Vec<u64> = Vec::new();
        let mut t = 5 * interval;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            t += x % (interval / 5);
            assert_eq!(w.peek(t / slot), w.clone().count(t / slot));
            if w.count(t / slot) < limit {
                w.add(t / slot);
                accepted.push(t);
            }
        }
        for (i, &start) in accepted.iter().enumerate() {
            let n = accepted[i..]
                .iter()
                .take_while(|&&a| a < start + interval)
                .count();
            assert!(
                n as u64 <= limit,
                "{n} accepted within one interval from {start}"
            );
        }
        // And it does not starve: most of the offered requests that fit got through.
        assert!(accepted.len() > 20_000 / 20 * 7 / 2, "{}", accepted.len());
    }

    #[test]
    fn cancels_and_replaces_have_their_own_throttles() {
        let mut c = cfg();
        c.accounts[1].max_cancels_per_interval = Some(2);
        c.accounts[1].max_replaces_per_interval = Some(1);
        let mut r = RiskEngine::new(&c).unwrap();
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
        let o = order(2, 10, 100);
        assert_eq!(check(&mut r, 10, o), Ok(()));
        assert_eq!(r.check_cancel(&o, NOW), Ok(()));
        assert_eq!(r.check_cancel(&o, NOW), Ok(()));
        assert_eq!(r.check_cancel(&o, NOW), Err(RejectReason::Throttled));
        let new = order(2, 20, 100);
        assert_eq!(r.check_replace(10, &o, 10, &new, NOW), Ok(()));
        assert_eq!(
            r.check_replace(10, &o, 10, &new, NOW),
            Err(RejectReason::Throttled)
        );
        // New orders have their own budget (100): untouched by the cancels and replaces.
        assert_eq!(check(&mut r, 10, order(2, 11, 100)), Ok(()));
        assert_eq!(r.throttle_usage(2, NOW), [2, 2, 1]);
        // Absent, the cancel and replace limits are the new-order limit (5 on account 1).
        let a = order(1, 1, 100);
        for _ in 0..5 {
            assert_eq!(r.check_cancel(&a, NOW), Ok(()));
        }
        assert_eq!(r.check_cancel(&a, NOW), Err(RejectReason::Throttled));
        // A rejected replace uses no slot.
        let mut r = RiskEngine::new(&c).unwrap();
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
        assert_eq!(check(&mut r, 10, o), Ok(()));
        let huge = order(2, 1001, 100);
        assert_eq!(
            r.check_replace(10, &o, 10, &huge, NOW),
            Err(RejectReason::MaxQuantity)
        );
        assert_eq!(r.throttle_usage(2, NOW), [1, 0, 0]);
    }

    #[test]
    fn repeated_identical_orders_reject() {
        let mut c = cfg();
        c.max_identical_orders = 3;
        c.identical_order_window_ms = 1000;
        let mut r = RiskEngine::new(&c).unwrap();
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
        let o = order(2, 10, 100);
        for i in 0..3 {
            assert_eq!(r.check_new(10, 3000 + i, &o, NOW + i * SEC / 10), Ok(()));
        }
        assert_eq!(
            r.check_new(10, 3003, &o, NOW + SEC / 2),
            Err(RejectReason::RepeatedOrder)
        );
        // Any other term differs: another order.
        for other in [
            order(2, 11, 100),
            order(2, 10, 101),
            OrderParams {
                side: Side::Sell,
                ..o
            },
            order(1, 10, 100),
        ]
        .into_iter()
        .zip(3100..)
        {
            assert_eq!(r.check_new(10, other.1, &other.0, NOW + SEC / 2), Ok(()));
        }
        // Exactly one window after the first, that one no longer counts.
        assert_eq!(r.identical_count(&o, NOW + SEC - 1), 3);
        assert_eq!(r.identical_count(&o, NOW + SEC), 2);
        assert_eq!(r.check_new(10, 3004, &o, NOW + SEC), Ok(()));
        assert_eq!(
            r.check_new(10, 3005, &o, NOW + SEC),
            Err(RejectReason::RepeatedOrder)
        );
        // 0 turns it off.
        let mut c = cfg();
        c.max_identical_orders = 0;
        let mut r = RiskEngine::new(&c).unwrap();
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
        for i in 0..50 {
            assert_eq!(r.check_new(10, 4000 + i, &o, NOW), Ok(()));
            r.on_order_done(&o, 10);
        }
    }

    #[test]
    fn repeated_order_check_is_on_by_default() {
        let mut r = engine();
        let o = order(2, 1, 100);
        for _ in 0..10 {
            assert_eq!(check(&mut r, 10, o), Ok(()));
        }
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::RepeatedOrder));
    }

    fn firm_cfg(firm: &str) -> RiskConfig {
        let mut c: RiskConfig = toml::from_str(&format!(
            r#"
            reference_max_age_ms = 5000
            throttle_interval_ms = 1000
            max_identical_orders = 0
            [firm]
            {firm}
            [[accounts]]
            id = 1
            max_order_qty = 1000
            max_order_notional = 50000
            credit_limit = 100000
            max_position = 100000
            max_open_orders = 10
            max_orders_per_interval = 100
            collar_bps = 500
            [[engines]]
            id = 10
            accounts = [1]
            token = "t10"
            "#
        ))
        .unwrap();
        let mut second = c.accounts[0].clone();
        second.id = 2;
        c.accounts.push(second);
        c.engines[0].accounts.push(2);
        c
    }

    fn firm_engine(firm: &str) -> RiskEngine {
        let mut r = RiskEngine::new(&firm_cfg(firm)).unwrap();
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, NOW);
        r
    }

    #[test]
    fn firm_credit_limit_counts_every_account() {
        let mut r = firm_engine("credit_limit = 120000");
        // Account 1: 50_000 executed + 40_000 open (well inside its own 100_000).
        let a = order(1, 500, 100);
        assert_eq!(check(&mut r, 10, a), Ok(()));
        r.on_fill(&a, 500, 100 * PRICE_SCALE);
        r.on_order_done(&a, 0);
        assert_eq!(check(&mut r, 10, order(1, 400, 100)), Ok(()));
        // Account 2 has used nothing, but the firm has 90_000 of 120_000.
        assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
        assert_eq!(
            check(&mut r, 10, order(2, 1, 100)),
            Err(RejectReason::FirmCreditLimit)
        );
        assert_eq!(r.firm_exposure(), (2, 70_000, 50_000));
        // A fill taken back frees firm credit.
        r.on_execution_reversed(&a, 500, 100 * PRICE_SCALE);
        assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
    }

    #[test]
    fn firm_gross_notional_counts_open_orders_of_every_account_both_sides() {
        let mut r = firm_engine("max_gross_notional = 60000");
        let buy = order(1, 300, 100);
        assert_eq!(check(&mut r, 10, buy), Ok(()));
        let sell = OrderParams {
            side: Side::Sell,
            ..order(2, 300, 100)
        };
        assert_eq!(check(&mut r, 10, sell), Ok(()));
        assert_eq!(
            check(&mut r, 10, order(2, 1, 100)),
            Err(RejectReason::FirmGrossNotional)
        );
        // Executed notional is the credit limit's business, not the gross limit's.
        r.on_fill(&buy, 300, 100 * PRICE_SCALE);
        r.on_order_done(&buy, 0);
        assert_eq!(check(&mut r, 10, order(2, 300, 100)), Ok(()));
        // A replace is checked against the firm too, without its own old reservation.
        let o = order(2, 300, 100);
        assert_eq!(
            r.check_replace(10, &o, 300, &order(2, 301, 100), NOW),
            Err(RejectReason::FirmGrossNotional)
        );
        assert_eq!(
            r.check_replace(10, &o, 300, &order(2, 300, 99), NOW),
            Ok(())
        );
    }

    #[test]
    fn firm_open_orders_count_every_account() {
        let mut r = firm_engine("max_open_orders = 3");
        let o1 = order(1, 1, 100);
        assert_eq!(check(&mut r, 10, o1), Ok(()));
        assert_eq!(check(&mut r, 10, order(1, 2, 100)), Ok(()));
        assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
        assert_eq!(
            check(&mut r, 10, order(2, 2, 100)),
            Err(RejectReason::FirmMaxOpenOrders)
        );
        r.on_order_done(&o1, 1);
        assert_eq!(check(&mut r, 10, order(2, 2, 100)), Ok(()));
    }

    #[test]
    fn firm_limits_default_to_the_sum_of_the_accounts() {
        let mut r = firm_engine("");
        // 2 × 10 open orders, each account at its own limit: the firm takes all 20.
        for acct in [1, 2] {
            for q in 1..=10 {
                assert_eq!(check(&mut r, 10, order(acct, q, 100)), Ok(()));
            }
        }
        assert_eq!(r.firm_exposure().0, 20);
        let c = firm_cfg("credit_limit = 0");
        assert!(RiskEngine::new(&c)
            .unwrap_err()
            .to_string()
            .contains("risk.firm.credit_limit"));
    }

    #[test]
    fn duplicate_client_order_id() {
        let mut r = engine();
        let o = order(2, 1, 100);
        assert_eq!(r.check_new(10, 42, &o, NOW), Ok(()));
        assert_eq!(
            r.check_new(10, 42, &o, NOW),
            Err(RejectReason::DuplicateClientOrderId)
        );
        // Ids are per engine.
        assert_eq!(r.check_new(11, 42, &o, NOW), Ok(()));
    }

    #[test]
    fn restricted_and_halted() {
        let mut r = engine();
        let mut o = order(2, 1, 100);
        o.symbol = sym("BAD");
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::RestrictedSymbol));
        r.on_halt(sym("AAPL"), true);
        assert_eq!(
            check(&mut r, 10, order(2, 1, 100)),
            Err(RejectReason::Halted)
        );
        r.on_halt(sym("AAPL"), false);
        assert_eq!(check(&mut r, 10, order(2, 1, 100)), Ok(()));
    }

    #[test]
    fn trading_hours() {
        let mut r = engine();
        let o = order(2, 1, 100);
        let early = NOW - 31 * 60 * SEC; // 14:29
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, early);
        assert_eq!(
            r.check_new(10, 1, &o, early),
            Err(RejectReason::OutsideTradingHours)
        );
        let open = NOW - 30 * 60 * SEC; // 14:30
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, open);
        assert_eq!(r.check_new(10, 2, &o, open), Ok(()));
        let close = NOW + 6 * 3600 * SEC; // 21:00
        r.on_reference_price(sym("AAPL"), 100 * PRICE_SCALE, close);
        assert_eq!(
            r.check_new(10, 3, &o, close),
            Err(RejectReason::OutsideTradingHours)
        );
    }

    #[test]
    fn kill_switches() {
        let mut r = engine();
        let o = order(2, 1, 100);
        r.set_kill(KillScope::Engine(10), true);
        assert_eq!(check(&mut r, 10, o), Err(RejectReason::KillSwitchEngine));
        assert_eq!(check(&mut r, 11, o), Ok(()));
        r.set_kill(KillScope::Engine(10), false);
        r.set_kill(KillScope::Account(2), true);
        assert_eq!(check(&mut r, 11, o), Err(RejectReason::KillSwitchAccount));
        assert_eq!(check(&mut r, 10, order(1, 1, 100)), Ok(()));
        r.set_kill(KillScope::Account(2), false);
        r.set_kill(KillScope::Global, true);
        assert_eq!(
            check(&mut r, 10, order(1, 1, 100)),
            Err(RejectReason::KillSwitchGlobal)
        );
        r.set_kill(KillScope::Global, false);
        assert_eq!(check(&mut r, 11, o), Ok(()));
    }

    #[test]
    fn grants() {
        let mut r = engine();
        assert_eq!(
            check(&mut r, 11, order(1, 1, 100)),
            Err(RejectReason::AccountNotGranted)
        );
        assert_eq!(
            check(&mut r, 99, order(2, 1, 100)),
            Err(RejectReason::AccountNotGranted)
        );
        assert_eq!(check(&mut r, 10, order(1, 1, 100)), Ok(()));
    }

    #[test]
    fn replace_checks_new_terms_and_moves_on_confirm() {
        let mut r = engine();
        let o = order(2, 400, 100);
        assert_eq!(check(&mut r, 10, o), Ok(()));
        let bigger = order(2, 501, 100);
        assert_eq!(
            r.check_replace(10, &o, 400, &bigger, NOW),
            Err(RejectReason::MaxNotional)
        );
        assert_eq!(r.exposure(2), (40_000, 0));
        let smaller = order(2, 100, 101);
        assert_eq!(r.check_replace(10, &o, 400, &smaller, NOW), Ok(()));
        assert_eq!(r.exposure(2), (40_000, 0));
        r.move_reservation(&o, &smaller);
        assert_eq!(r.exposure(2), (10_100, 0));
    }

    #[test]
    fn config_errors_name_the_key() {
        let mut c = cfg();
        c.trading_end_utc = Some("25:00".into());
        assert!(RiskEngine::new(&c)
            .unwrap_err()
            .to_string()
            .contains("trading_end_utc"));
        let mut c = cfg();
        c.engines[0].accounts.push(77);
        assert!(matches!(
            RiskEngine::new(&c),
            Err(RiskConfigError::GrantWithoutAccount { account: 77, .. })
        ));
        for bad in [String::new(), "x".repeat(33)] {
            let mut c = cfg();
            c.engines[1].token = bad;
            assert!(matches!(
                RiskEngine::new(&c),
                Err(RiskConfigError::BadEngineToken(11))
            ));
        }
        let mut c = cfg();
        c.engines[1].id = 10;
        assert!(matches!(
            RiskEngine::new(&c),
            Err(RiskConfigError::DuplicateEngine(10))
        ));
        // The token never shows in debug output.
        assert!(!format!("{:?}", cfg().engines).contains("t10"));
        let mut c = cfg();
        c.throttle_interval_ms = 0;
        assert!(RiskEngine::new(&c)
            .unwrap_err()
            .to_string()
            .contains("risk.throttle_interval_ms"));
        let mut c = cfg();
        c.response_history = 0;
        assert!(RiskEngine::new(&c)
            .unwrap_err()
            .to_string()
            .contains("risk.response_history"));
        let mut c = cfg();
        c.max_malformed_frames = 0;
        assert!(RiskEngine::new(&c)
            .unwrap_err()
            .to_string()
            .contains("risk.max_malformed_frames"));
    }
}
