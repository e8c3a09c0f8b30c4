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
    /// Maximum orders accepted per throttle interval.
    pub max_orders_per_interval: u32,
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

/// Risk configuration (the `[risk]` table of the gateway config).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskConfig {
    /// Per-account limits.
    pub accounts: Vec<AccountLimits>,
    /// Engine → account grants.
    pub engines: Vec<EngineGrant>,
    /// Symbols nobody may trade.
    #[serde(default)]
    pub restricted_symbols: Vec<String>,
    /// A reference price older than this rejects.
    pub reference_max_age_ms: u64,
    /// Length of the order-rate throttle interval.
    pub throttle_interval_ms: u64,
    /// Trading window start, "HH:MM" or "HH:MM:SS" UTC. Absent: no window.
    #[serde(default)]
    pub trading_start_utc: Option<String>,
    /// Trading window end (exclusive), UTC; may be before the start to wrap midnight.
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
    #[error("risk: trading_start_utc and trading_end_utc must be set together")]
    HalfWindow,
    /// An engine's token is empty or longer than 32 bytes.
    #[error("risk.engines: engine {0}: token must be 1..=32 bytes")]
    BadEngineToken(u32),
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

#[derive(Debug)]
struct Account {
    limits: AccountLimits,
    killed: bool,
    /// Notional in price-scale units (qty × price), so no rounding happens in accounting.
    open_notional: i128,
    executed_notional: i128,
    open_orders: u32,
    positions: FxHashMap<Symbol, Position>,
    window_start: u64,
    window_count: u32,
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
    throttle_interval_ns: u64,
    /// Seconds of the UTC day, `[start, end)`.
    window: Option<(u32, u32)>,
}

fn parse_time_of_day(key: &'static str, s: &str) -> Result<u32, RiskConfigError> {
    let bad = || RiskConfigError::BadTime {
        key,
        value: s.to_owned(),
    };
    let mut parts = s.split(':');
    let mut field = |max: u32| -> Result<u32, RiskConfigError> {
        let v: u32 = parts.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if v > max {
            Err(bad())
        } else {
            Ok(v)
        }
    };
    let h = field(23)?;
    let m = field(59)?;
    let sec = if s.matches(':').count() == 2 {
        field(59)?
    } else {
        0
    };
    if s.matches(':').count() > 2 {
        return Err(bad());
    }
    Ok(h * 3600 + m * 60 + sec)
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
        let window = match (&cfg.trading_start_utc, &cfg.trading_end_utc) {
            (None, None) => None,
            (Some(s), Some(e)) => Some((
                parse_time_of_day("trading_start_utc", s)?,
                parse_time_of_day("trading_end_utc", e)?,
            )),
            _ => return Err(RiskConfigError::HalfWindow),
        };
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
                    window_start: 0,
                    window_count: 0,
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
        Ok(RiskEngine {
            accounts,
            engines,
            restricted,
            halted: FxHashSet::default(),
            references: FxHashMap::with_capacity_and_hasher(1024, Default::default()),
            seen_ids: FxHashSet::with_capacity_and_hasher(1 << 16, Default::default()),
            global_kill: false,
            reference_max_age_ns: cfg.reference_max_age_ms.saturating_mul(1_000_000),
            throttle_interval_ns: cfg.throttle_interval_ms.saturating_mul(1_000_000),
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
            }
        }
        self.seen_ids.clear();
        self.seen_ids.extend(s.seen_ids.iter().copied());
    }

    /// Takes from `old` what the journal does not hold: reference prices, halts and kill
    /// switches (used when the gateway rebuilds its state from the journal while running,
    /// so a rebuild never lifts a halt or a kill).
    pub fn inherit_live_state(&mut self, old: &RiskEngine) {
        self.halted.clone_from(&old.halted);
        self.references.clone_from(&old.references);
        self.global_kill = old.global_kill;
        for (id, e) in &mut self.engines {
            e.killed = old.engines.get(id).is_some_and(|o| o.killed);
        }
        for (id, a) in &mut self.accounts {
            a.killed = old.accounts.get(id).is_some_and(|o| o.killed);
        }
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
        let l = &a.limits;
        if a.open_orders >= l.max_open_orders {
            return Err(RejectReason::MaxOpenOrders);
        }
        let in_window = now.saturating_sub(a.window_start) < self.throttle_interval_ns;
        if in_window && a.window_count >= l.max_orders_per_interval {
            return Err(RejectReason::Throttled);
        }
        let a = self
            .accounts
            .get_mut(&o.account)
            .ok_or(RejectReason::UnknownAccount)?;
        if in_window {
            a.window_count += 1;
        } else {
            a.window_start = now;
            a.window_count = 1;
        }
        a.open_orders += 1;
        Self::reserve(a, o, 1);
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
        Self::reserve(a, &old_open, -1);
        let r = self.check_order(new, now);
        let a = self
            .accounts
            .get_mut(&old.account)
            .ok_or(RejectReason::UnknownAccount)?;
        Self::reserve(a, &old_open, 1);
        r
    }

    /// Moves an open order's reservation from `from` to `to` (a confirmed replace).
    pub fn move_reservation(&mut self, from: &OrderParams, to: &OrderParams) {
        if let Some(a) = self.accounts.get_mut(&from.account) {
            Self::reserve(a, from, -1);
            Self::reserve(a, to, 1);
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
        if let Some((start, end)) = self.window {
            let sec = ((now / 1_000_000_000) % 86_400) as u32;
            let open = if start <= end {
                sec >= start && sec < end
            } else {
                sec >= start || sec < end
            };
            if !open {
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

    fn reserve(a: &mut Account, o: &OrderParams, sign: i64) {
        a.open_notional += i128::from(sign) * notional(o.qty, o.price);
        let p = a.positions.entry(o.symbol).or_default();
        match o.side {
            Side::Buy => p.open_buy += sign * i64::from(o.qty),
            Side::Sell => p.open_sell += sign * i64::from(o.qty),
        }
    }

    /// Re-creates the reservation of an order accepted before a restart (journal recovery).
    pub fn restore_open(&mut self, o: &OrderParams) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            a.open_orders += 1;
            Self::reserve(a, o, 1);
        }
    }

    /// An execution of `qty` at `px` on an order resting at `order_px`.
    pub fn on_fill(&mut self, o: &OrderParams, qty: u32, px: i64) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            Self::reserve(a, &OrderParams { qty, ..*o }, -1);
            a.executed_notional += notional(qty, px);
            let p = a.positions.entry(o.symbol).or_default();
            p.net += if o.side == Side::Buy {
                i64::from(qty)
            } else {
                -i64::from(qty)
            };
        }
    }

    /// An execution of `qty` at `px` that releases only `released` of the order's reservation
    /// (less than `qty` when the venue executes more than was open: an over-fill, or a fill
    /// after the order was final).
    pub fn on_execution(&mut self, o: &OrderParams, qty: u32, px: i64, released: u32) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            Self::reserve(
                a,
                &OrderParams {
                    qty: released,
                    ..*o
                },
                -1,
            );
            a.executed_notional += notional(qty, px);
            let p = a.positions.entry(o.symbol).or_default();
            p.net += if o.side == Side::Buy {
                i64::from(qty)
            } else {
                -i64::from(qty)
            };
        }
    }

    /// Takes back an execution of `qty` at `px` (a trade cancel, or the old terms of a trade
    /// correct): position and executed notional as if it had not happened. Reservations are
    /// the caller's (the venue says what is open again).
    pub fn on_execution_reversed(&mut self, o: &OrderParams, qty: u32, px: i64) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            a.executed_notional -= notional(qty, px);
            let p = a.positions.entry(o.symbol).or_default();
            p.net -= if o.side == Side::Buy {
                i64::from(qty)
            } else {
                -i64::from(qty)
            };
        }
    }

    /// The order is final (filled, canceled or rejected) with `leaves` still reserved.
    pub fn on_order_done(&mut self, o: &OrderParams, leaves: u32) {
        if let Some(a) = self.accounts.get_mut(&o.account) {
            Self::reserve(a, &OrderParams { qty: leaves, ..*o }, -1);
            a.open_orders = a.open_orders.saturating_sub(1);
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
        assert_eq!(r.check_new(10, 1006, &o, NOW + SEC), Ok(()));
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
    }
}
