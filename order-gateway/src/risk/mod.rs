//! Pre-trade risk controls in the style of SEC Rule 15c3-5, configured per account.
//!
//! [`RiskEngine`] is a pure state machine: the gateway feeds it orders, fills, reference
//! prices, halts and the time (`now`, nanoseconds since the UNIX epoch) and it answers
//! accept or a [`RejectReason`](crate::proto::RejectReason). It keeps the accounting every
//! rule needs (open and executed notional, positions with open quantity per side,
//! open-order counts, throttle windows) and never does I/O. Symbols are fixed-size keys
//! ([`Symbol`]), so the check path hashes 8 bytes and does not allocate except when a
//! symbol is first seen on an account. The maps use FxHash (`rustc-hash`), not SipHash:
//! keys are integers and symbols from our own config and engines, hashing is on the
//! per-order path, and flooding resistance buys nothing here (an engine that floods is
//! stopped by the throttle and its token).
//!
//! Every check fails closed: an unknown account, a missing or stale reference price, a time
//! outside the window all reject.
//!
//! Besides the per-account rules: firm-wide limits across every account ([`FirmLimits`]),
//! sliding-window throttles on new orders, cancels and replaces ([`SlidingWindow`]), and a
//! check on the same order repeated too often ([`RiskConfig::max_identical_orders`]). Their
//! state is rebuilt from the journal like the rest: the gateway journals the time of every
//! decision and replays it through [`RiskEngine::restore_request`].

//!
//! # Layout
//! One sub-machine, its state split by concern, each file with its own tests:
//! - `config`: the `[risk]` section ([`RiskConfig`]) and its validation errors;
//! - `checks`: the pre-trade checks that accept or reject a request;
//! - `accounting`: open and executed notional, positions, open-order counts, firm totals;
//! - `throttles`: the sliding-window throttles and the repeated-order check;
//! - `window`: the daily trading window in its time zone;
//! - `tests`: the rules end to end through [`RiskEngine`].
//!
//! [`RiskEngine`] follows the gateway's one contract (see [`crate::gateway`]): every input
//! is a method call carrying `now`; it never reads a clock and never does I/O.

use std::collections::VecDeque;

use rustc_hash::{FxHashMap, FxHashSet};

use crate::proto::{Side, Symbol};

mod accounting;
mod checks;
mod config;
mod throttles;
pub mod window;

use accounting::scaled;
use accounting::{Account, Firm, Position};
pub use config::{
    AccountLimits, EngineGrant, FirmLimits, RiskConfig, RiskConfigError, MAX_RESPONSE_HISTORY,
    RESPONSE_HISTORY,
};
use throttles::{Identical, Terms, WINDOW_SLOTS};
pub use throttles::{RequestKind, SlidingWindow, IDENTICAL_ORDERS_TRACKED};

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
    /// Every (engine, ClOrdID) of the day: it grows all day, so a resize moves a few
    /// entries per insert (griddle's incremental resizing) instead of all of them in one
    /// turn (at 917,504 ids that stalled a turn 20 ms).
    seen_ids: griddle::HashSet<(u32, u64), rustc_hash::FxBuildHasher>,
    global_kill: bool,
    reference_max_age_ns: u64,
    /// Slot length of the throttles' sliding windows.
    throttle_slot_ns: u64,
    firm: Firm,
    identical: Identical,
    /// The trading window, in its time zone.
    window: Option<crate::risk::window::TradingWindow>,
}

impl RiskEngine {
    /// Builds the engine from validated config.
    pub fn new(cfg: &RiskConfig) -> Result<RiskEngine, RiskConfigError> {
        let mut restricted = FxHashSet::default();
        for s in &cfg.restricted_symbols {
            restricted.insert(Symbol::new(s).ok_or_else(|| RiskConfigError::BadSymbol(s.clone()))?);
        }
        let window = crate::risk::window::TradingWindow::from_config(cfg)?;
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
            seen_ids: griddle::HashSet::with_capacity_and_hasher(1 << 16, Default::default()),
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
            seen_ids: {
                // Sorted: the checkpoint does not depend on the set's layout.
                let mut ids: Vec<(u32, u64)> = self.seen_ids.iter().copied().collect();
                ids.sort_unstable();
                ids
            },
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
}

#[cfg(test)]
mod tests;
