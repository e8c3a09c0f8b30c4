//! The pre-trade checks: a new order, a cancel or a replace is accepted (and its exposure
//! reserved) or rejected with a [`RejectReason`]. Every check fails closed.

use super::accounting::{notional, scaled};
use super::throttles::Terms;
use super::{OrderParams, RequestKind, RiskEngine};
use crate::proto::{RejectReason, Side};

impl RiskEngine {
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
    pub(super) fn check_throttle(
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
    pub(super) fn check_order(&self, o: &OrderParams, now: u64) -> Result<(), RejectReason> {
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
}
