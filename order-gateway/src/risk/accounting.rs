//! Accounting: what every rule measures (open and executed notional, positions with open
//! quantity per side, open-order counts, per account and firm-wide), moved by reservations,
//! executions and final orders, and the read-outs the operator sees.

use rustc_hash::FxHashMap;

use super::throttles::{SlidingWindow, Terms};
use super::{AccountLimits, OrderParams, RequestKind, RiskEngine};
use crate::proto::{Side, Symbol, PRICE_SCALE};

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Position {
    pub(super) net: i64,
    pub(super) open_buy: i64,
    pub(super) open_sell: i64,
}

/// Firm-wide accounting and limits, in price-scale units.
#[derive(Debug, Default)]
pub(super) struct Firm {
    pub(super) credit_limit: i128,
    pub(super) gross_limit: i128,
    pub(super) max_open_orders: u64,
    pub(super) open_notional: i128,
    pub(super) executed_notional: i128,
    pub(super) open_orders: u64,
}

#[derive(Debug)]
pub(super) struct Account {
    pub(super) limits: AccountLimits,
    pub(super) killed: bool,
    /// Notional in price-scale units (qty × price), so no rounding happens in accounting.
    pub(super) open_notional: i128,
    pub(super) executed_notional: i128,
    pub(super) open_orders: u32,
    pub(super) positions: FxHashMap<Symbol, Position>,
    /// Throttles, indexed by [`RequestKind`].
    pub(super) throttle: [SlidingWindow; 3],
}

impl Account {
    pub(super) fn throttle_limit(&self, kind: RequestKind) -> u32 {
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

/// Notional in price-scale units.
pub(super) fn notional(qty: u32, price: i64) -> i128 {
    i128::from(qty) * i128::from(price).abs()
}

pub(super) fn scaled(whole_units: i64) -> i128 {
    i128::from(whole_units) * i128::from(PRICE_SCALE)
}

impl RiskEngine {
    pub(super) fn reserve(a: &mut Account, firm: &mut Firm, o: &OrderParams, sign: i64) {
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
    pub(super) fn execute(
        a: &mut Account,
        firm: &mut Firm,
        o: &OrderParams,
        qty: u32,
        px: i64,
        sign: i64,
    ) {
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
    /// [`IDENTICAL_ORDERS_TRACKED`](super::IDENTICAL_ORDERS_TRACKED) were accepted within its window.
    pub fn identical_evictions(&self) -> u64 {
        self.identical.evicted
    }
}
