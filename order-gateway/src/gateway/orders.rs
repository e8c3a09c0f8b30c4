//! Requests turned into decisions: a new order, cancel or replace is checked (session
//! state, order state, risk), journaled as a [`Decision`], and either rejected to the
//! engine or sent to the venue as a FIX order; also the cancels the gateway makes itself
//! (kill switch, cancel-all, mass cancel, cancel-on-disconnect). What the venue answers is
//! in `fills`.
//!
//! Must not touch sockets or files.

use zerocopy::byteorder::little_endian::{I64, U16, U32, U64};
use zerocopy::IntoBytes;

use super::records::{record, Decision, DecisionTrailer, ORIGIN_ENGINE, ORIGIN_GATEWAY};
use super::{Change, EngineId, Gateway, Order, OrderStatus, Outputs};
use crate::fix::session::{push_field, push_price, push_timestamp, push_uint};
use crate::fix::{tag, SessionState};
use crate::proto::{self, msg_type, RejectReason, Response, Side, Symbol};
use crate::risk::{KillScope, OrderParams};

pub(super) fn side_fix(s: Side) -> &'static [u8] {
    match s {
        Side::Buy => b"1",
        Side::Sell => b"2",
    }
}

impl Gateway {
    /// Turns a kill switch on or off; turning it on cancels the open orders in its scope.
    /// Journaled, so it survives a restart.
    pub fn set_kill(&mut self, scope: KillScope, on: bool, now: u64, out: &mut Outputs) {
        let (tag, id) = match scope {
            KillScope::Global => (0u8, 0u32),
            KillScope::Engine(e) => (1, e),
            KillScope::Account(a) => (2, a),
        };
        out.record(record::KILL, &[&[tag], &id.to_le_bytes(), &[u8::from(on)]]);
        self.risk.set_kill(scope, on);
        if on {
            self.cancel_where(now, out, |o| match scope {
                KillScope::Global => true,
                KillScope::Engine(e) => o.engine == e,
                KillScope::Account(a) => o.params.account == a,
            });
        }
        self.seal(out);
    }

    /// Cancels every open order (of `account`, if given) at the venue, without blocking new
    /// ones (the operator's cancel-all).
    pub fn cancel_all(&mut self, account: Option<u32>, now: u64, out: &mut Outputs) {
        self.cancel_where(now, out, |o| account.is_none_or(|a| o.params.account == a));
        self.seal(out);
    }

    pub(super) fn cancel_where(
        &mut self,
        now: u64,
        out: &mut Outputs,
        pred: impl Fn(&Order) -> bool,
    ) {
        // One pass over the orders. An order with a replace in flight cannot be cancelled
        // until the venue answers the replace (one change at a time): it waits for that.
        let mut targets: Vec<(EngineId, u64)> = Vec::new();
        let mut waiting: Vec<u64> = Vec::new();
        for (id, o) in self.book.iter() {
            if o.status == OrderStatus::Done || !pred(o) {
                continue;
            }
            match o.pending {
                None => targets.push((o.engine, o.cl_ord_id)),
                Some((_, Change::Replace { .. })) if !self.cancel_after_change.contains(&id) => {
                    waiting.push(id)
                }
                Some(_) => {}
            }
        }
        targets.sort_unstable();
        waiting.sort_unstable();
        self.cancel_after_change.extend(waiting);
        for (engine, cl) in targets {
            self.handle_cancel(engine, cl, ORIGIN_GATEWAY, now, out);
        }
    }

    /// Live, after venue messages: cancels the orders [`cancel_where`](Self::cancel_where)
    /// found with a replace in flight, once the venue has answered it (replaced or refused).
    /// Not journaled as such (each cancel is, as a decision); a restart in between leaves
    /// them to the kill switch's logon sweep and the restart's cancel-on-disconnect
    /// deadline.
    pub(super) fn cancel_after_changes(&mut self, now: u64, out: &mut Outputs) {
        let mut i = 0;
        while i < self.cancel_after_change.len() {
            let oid = self.cancel_after_change[i];
            let state = self
                .book
                .get(oid)
                .map(|o| (o.status, o.pending.is_some(), o.engine, o.cl_ord_id));
            match state {
                Some((status, true, _, _)) if status != OrderStatus::Done => i += 1,
                Some((status, false, engine, cl)) if status != OrderStatus::Done => {
                    self.cancel_after_change.remove(i);
                    self.handle_cancel(engine, cl, ORIGIN_GATEWAY, now, out);
                }
                _ => {
                    self.cancel_after_change.remove(i);
                }
            }
        }
    }

    /// At every logon: cancels the open orders a kill switch covers. Normally there are
    /// none (turning a switch on cancels them), but some stay open when the switch went on
    /// while the venue session was down (their cancels were refused `SessionDown`), when a
    /// restart answered a kill's cancel `NotSent`, or when the venue refused one. So a kill
    /// switch holds across venue outages and restarts.
    pub(super) fn cancel_killed(&mut self, now: u64, out: &mut Outputs) {
        let (global, engines, accounts) = self.risk.kills();
        if self.session.state() != SessionState::Active
            || !(global || !engines.is_empty() || !accounts.is_empty())
        {
            return;
        }
        self.cancel_where(now, out, |o| {
            global || engines.contains(&o.engine) || accounts.contains(&o.params.account)
        });
        self.seal(out);
    }

    fn decision(out: &mut Outputs, d: &Decision, t: DecisionTrailer) {
        out.record(record::DECISION, &[d.as_bytes(), t.as_bytes()]);
    }

    #[allow(clippy::too_many_arguments)]
    fn reject_request(
        engine: EngineId,
        cl: u64,
        request: u8,
        reason: RejectReason,
        out: &mut Outputs,
        d: Option<Decision>,
        t: DecisionTrailer,
    ) {
        let d = d.unwrap_or_else(|| Decision {
            engine: U32::new(engine),
            account: U32::ZERO,
            cl_ord_id: U64::new(cl),
            order_id: U64::ZERO,
            request_id: U64::ZERO,
            price: I64::ZERO,
            qty: U32::ZERO,
            reason: U16::ZERO,
            request,
            side: 0,
            symbol: Symbol::default(),
        });
        Self::decision(
            out,
            &Decision {
                reason: U16::new(reason as u16),
                ..d
            },
            t,
        );
        out.engine
            .push((engine, Response::reject(cl, request, reason)));
    }

    pub(super) fn handle_new(
        &mut self,
        engine: EngineId,
        m: &proto::NewOrder,
        now: u64,
        out: &mut Outputs,
    ) {
        let cl = m.cl_ord_id.get();
        let params = OrderParams {
            account: m.account.get(),
            symbol: m.symbol,
            side: m.side(),
            qty: m.qty.get(),
            price: m.price.get(),
        };
        let mut d = Decision {
            engine: U32::new(engine),
            account: m.account,
            cl_ord_id: m.cl_ord_id,
            order_id: U64::ZERO,
            request_id: U64::ZERO,
            price: m.price,
            qty: m.qty,
            reason: U16::ZERO,
            request: msg_type::NEW_ORDER,
            side: m.side,
            symbol: m.symbol,
        };
        let t = trailer(now, ORIGIN_ENGINE);
        let verdict = if self.session.state() != SessionState::Active {
            Err(RejectReason::SessionDown)
        } else {
            self.risk.check_new(engine, cl, &params, now)
        };
        // Ids are single-use whatever the verdict (replay marks every decision the same way).
        self.risk.mark_seen(engine, cl);
        if let Err(reason) = verdict {
            Self::reject_request(engine, cl, msg_type::NEW_ORDER, reason, out, Some(d), t);
            return;
        }
        let id = self.next_id;
        d.order_id = U64::new(id);
        d.request_id = U64::new(id);
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::CL_ORD_ID, id);
        push_uint(b, tag::ACCOUNT, u64::from(params.account));
        push_field(b, tag::SYMBOL, params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(params.side));
        self.send_order_body(b"D", params.qty, Some(params.price), m.tif, now, out);
    }

    /// Appends TransactTime, OrderQty, OrdType/Price, TimeInForce to `self.body` and sends it.
    fn send_order_body(
        &mut self,
        ty: &[u8],
        qty: u32,
        price: Option<i64>,
        tif: u8,
        now: u64,
        out: &mut Outputs,
    ) {
        let b = &mut self.body;
        push_timestamp(b, tag::TRANSACT_TIME, now);
        push_uint(b, tag::ORDER_QTY, u64::from(qty));
        if let Some(px) = price {
            push_field(b, tag::ORD_TYPE, b"2");
            push_price(b, tag::PRICE, px);
            if ty == b"D" {
                push_field(b, tag::TIME_IN_FORCE, &[tif]);
            }
        }
        let start = out.fix.len();
        self.session.send_app(ty, &self.body, now, &mut out.fix);
        Self::journal_out(out, start);
    }

    /// A cancel of one order: the engine's own (`ORIGIN_ENGINE`, throttled) or one the
    /// gateway makes (`ORIGIN_GATEWAY`: kill switch, cancel-all, mass cancel,
    /// cancel-on-disconnect; never throttled, or the operator would lose control).
    pub(super) fn handle_cancel(
        &mut self,
        engine: EngineId,
        cl: u64,
        origin: u8,
        now: u64,
        out: &mut Outputs,
    ) {
        let t = trailer(now, origin);
        let Some(oid) = self.book.id_of(engine, cl) else {
            return Self::reject_request(
                engine,
                cl,
                msg_type::CANCEL,
                RejectReason::UnknownOrder,
                out,
                None,
                t,
            );
        };
        let Some(&o) = self.book.get(oid) else {
            return;
        };
        let reason = if o.status == OrderStatus::Done {
            Some(RejectReason::UnknownOrder)
        } else if o.pending.is_some() {
            Some(RejectReason::PendingChange)
        } else if self.session.state() != SessionState::Active {
            Some(RejectReason::SessionDown)
        } else if origin == ORIGIN_ENGINE {
            self.risk.check_cancel(&o.params, now).err()
        } else {
            None
        };
        if let Some(r) = reason {
            return Self::reject_request(engine, cl, msg_type::CANCEL, r, out, None, t);
        }
        let id = self.next_id;
        let d = Decision {
            engine: U32::new(engine),
            account: U32::new(o.params.account),
            cl_ord_id: U64::new(cl),
            order_id: U64::new(oid),
            request_id: U64::new(id),
            price: I64::new(o.params.price),
            qty: U32::new(o.params.qty),
            reason: U16::ZERO,
            request: msg_type::CANCEL,
            side: o.params.side as u8,
            symbol: o.params.symbol,
        };
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::ORIG_CL_ORD_ID, o.venue_cl_ord_id);
        push_uint(b, tag::CL_ORD_ID, id);
        push_field(b, tag::SYMBOL, o.params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(o.params.side));
        self.send_order_body(b"F", o.params.qty, None, 0, now, out);
    }

    pub(super) fn handle_replace(
        &mut self,
        engine: EngineId,
        m: &proto::Replace,
        now: u64,
        out: &mut Outputs,
    ) {
        let cl = m.cl_ord_id.get();
        let t = trailer(now, ORIGIN_ENGINE);
        let Some(oid) = self.book.id_of(engine, cl) else {
            return Self::reject_request(
                engine,
                cl,
                msg_type::REPLACE,
                RejectReason::UnknownOrder,
                out,
                None,
                t,
            );
        };
        let Some(&o) = self.book.get(oid) else {
            return;
        };
        let new = OrderParams {
            qty: m.qty.get(),
            price: m.price.get(),
            ..o.params
        };
        let verdict = if o.status == OrderStatus::Done {
            Err(RejectReason::UnknownOrder)
        } else if o.pending.is_some() {
            Err(RejectReason::PendingChange)
        } else if self.session.state() != SessionState::Active {
            Err(RejectReason::SessionDown)
        } else if new.qty <= o.cum_qty {
            Err(RejectReason::MaxQuantity)
        } else {
            let leaves = o.params.qty - o.cum_qty;
            let new_open = OrderParams {
                qty: new.qty - o.cum_qty,
                ..new
            };
            self.risk
                .check_replace(engine, &o.params, leaves, &new_open, now)
        };
        if let Err(r) = verdict {
            return Self::reject_request(engine, cl, msg_type::REPLACE, r, out, None, t);
        }
        let id = self.next_id;
        let d = Decision {
            engine: U32::new(engine),
            account: U32::new(o.params.account),
            cl_ord_id: U64::new(cl),
            order_id: U64::new(oid),
            request_id: U64::new(id),
            price: m.price,
            qty: m.qty,
            reason: U16::ZERO,
            request: msg_type::REPLACE,
            side: o.params.side as u8,
            symbol: o.params.symbol,
        };
        Self::decision(out, &d, t);
        self.apply_decision(&d);
        let b = &mut self.body;
        b.clear();
        push_uint(b, tag::ORIG_CL_ORD_ID, o.venue_cl_ord_id);
        push_uint(b, tag::CL_ORD_ID, id);
        push_field(b, tag::SYMBOL, o.params.symbol.as_bytes());
        push_field(b, tag::SIDE, side_fix(o.params.side));
        self.send_order_body(b"G", new.qty, Some(new.price), 0, now, out);
    }

    /// State change of an accepted decision (live and replay).
    pub(super) fn apply_decision(&mut self, d: &Decision) {
        let engine = d.engine.get();
        let cl = d.cl_ord_id.get();
        if d.request == msg_type::NEW_ORDER {
            self.risk.mark_seen(engine, cl);
        }
        if d.reason.get() != 0 {
            return;
        }
        let (oid, rid) = (d.order_id.get(), d.request_id.get());
        self.next_id = self.next_id.max(rid + 1);
        match d.request {
            msg_type::NEW_ORDER => {
                let side = if d.side == Side::Sell as u8 {
                    Side::Sell
                } else {
                    Side::Buy
                };
                let params = OrderParams {
                    account: d.account.get(),
                    symbol: d.symbol,
                    side,
                    qty: d.qty.get(),
                    price: d.price.get(),
                };
                self.book.insert_new(
                    oid,
                    Order {
                        engine,
                        cl_ord_id: cl,
                        params,
                        cum_qty: 0,
                        status: OrderStatus::PendingNew,
                        venue_cl_ord_id: oid,
                        notional: 0,
                        pending: None,
                        final_cut: 0,
                    },
                );
                // Live, check_new already reserved; replay has to. Reserve here only on replay:
                // see replay_record.
            }
            msg_type::CANCEL => {
                if let Some(o) = self.book.get_mut(oid) {
                    o.pending = Some((rid, Change::Cancel));
                }
            }
            msg_type::REPLACE => {
                if let Some(o) = self.book.get_mut(oid) {
                    // The reservation stays on the old terms until the venue confirms the replace.
                    o.pending = Some((
                        rid,
                        Change::Replace {
                            qty: d.qty.get(),
                            price: d.price.get(),
                        },
                    ));
                }
            }
            _ => {}
        }
        // After the order exists: a request noted for no order is one the next cut must
        // look at again (`OrderBook::note_request`).
        self.book.note_request(rid, oid);
    }
}

/// The trailer of a decision taken at `now` for `origin`.
fn trailer(now: u64, origin: u8) -> DecisionTrailer {
    DecisionTrailer {
        now: U64::new(now),
        origin,
    }
}
