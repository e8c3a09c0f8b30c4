//! Venue answers applied: execution reports (acks, fills, cancels, replaces, rejects,
//! trade cancels and corrections, status answers) and cancel rejects update the order, the
//! risk reservations and positions, and queue the engine's response. Each report is checked
//! whole before anything changes.
//!
//! Must not touch sockets or files.

use super::venue::AppReject;
use super::{Change, Gateway, Order, OrderStatus, Outputs};
use crate::fix::{tag, Message};
use crate::proto::{self, msg_type, RejectReason, Response};
use crate::risk::OrderParams;

fn parse_u32(m: &Message<'_>, t: u32) -> Result<u32, AppReject> {
    // Quantities may come as decimals ("100" or "100.0"); whole units only.
    let v = m.require(t).map_err(|_| (t, 1, "required tag missing"))?;
    let int = v.split(|&c| c == b'.').next().unwrap_or(b"");
    std::str::from_utf8(int)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or((t, 6, "incorrect data format"))
}

/// Why a request is refused without the venue's report of it, which decides what the
/// engine is told.
#[derive(Clone, Copy, Debug)]
pub(super) enum Refusal {
    /// The venue refused it (ExecType 8, a status answer, a reject of the message).
    Venue,
    /// It never reached the venue: the gateway stopped before its order message was
    /// journaled ([`Gateway::close_unsent`]).
    NotSent,
}

impl Refusal {
    /// The reason a refused new order is given.
    fn order(self) -> RejectReason {
        match self {
            Refusal::Venue => RejectReason::VenueReject,
            Refusal::NotSent => RejectReason::NotSent,
        }
    }

    /// The reason a refused cancel or replace is given.
    fn change(self) -> RejectReason {
        match self {
            Refusal::Venue => RejectReason::VenueCancelReject,
            Refusal::NotSent => RejectReason::NotSent,
        }
    }
}

/// What a status answer (ExecType I) says of an order.
#[derive(Clone, Copy, Debug)]
struct StatusAnswer<'a> {
    /// ExecID (venues often give every status answer the same one).
    exec_id: &'a [u8],
    /// OrdStatus (39).
    ord_status: &'a [u8],
    /// CumQty (14).
    cum: u32,
    /// LeavesQty (151).
    leaves: u32,
    /// AvgPx (6), when present.
    avg_px: Option<i64>,
}

impl Gateway {
    pub(super) fn on_execution_report(
        &mut self,
        m: &Message<'_>,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        // Every field needed is checked before anything changes, so a rejected report leaves
        // no trace but its (consumed) sequence number and the counters.
        let exec_type = m
            .require(tag::EXEC_TYPE)
            .map_err(|_| (tag::EXEC_TYPE, 1, "required tag missing"))?;
        if !matches!(
            exec_type,
            b"0" | b"1"
                | b"2"
                | b"3"
                | b"4"
                | b"5"
                | b"6"
                | b"7"
                | b"8"
                | b"9"
                | b"A"
                | b"B"
                | b"C"
                | b"D"
                | b"E"
                | b"F"
                | b"G"
                | b"H"
                | b"I"
                | b"L"
        ) {
            return Err((
                tag::EXEC_TYPE,
                5,
                "value is incorrect (out of range) for this tag",
            ));
        }
        for t in [tag::ORDER_ID, tag::EXEC_ID, tag::ORD_STATUS, tag::SIDE] {
            m.require(t).map_err(|_| (t, 1, "required tag missing"))?;
        }
        let exec_id = m.require(tag::EXEC_ID).unwrap_or(b"");
        let cum = parse_u32(m, tag::CUM_QTY)?;
        let leaves = parse_u32(m, tag::LEAVES_QTY)?;
        let trade = matches!(exec_type, b"F" | b"1" | b"2" | b"G");
        let (last_qty, last_px) = if trade {
            let q = parse_u32(m, tag::LAST_QTY)?;
            let px = m.price(tag::LAST_PX).map_err(|e| match e {
                crate::fix::FixError::MissingTag(_) => (tag::LAST_PX, 1, "required tag missing"),
                _ => (tag::LAST_PX, 6, "incorrect data format"),
            })?;
            (q, px)
        } else {
            (0, 0)
        };
        let exec_ref = if matches!(exec_type, b"G" | b"H") {
            m.require(tag::EXEC_REF_ID)
                .map_err(|_| (tag::EXEC_REF_ID, 1, "required tag missing"))?
        } else {
            b""
        };
        let avg_px = match m.get(tag::AVG_PX) {
            Some(_) if exec_type == b"I" => Some(
                m.price(tag::AVG_PX)
                    .map_err(|_| (tag::AVG_PX, 6, "incorrect data format"))?,
            ),
            _ => None,
        };
        let Some((req, oid)) = self.lookup(m)? else {
            return Ok(());
        };
        if exec_type == b"I" {
            // A status answer is not deduplicated by ExecID: venues often give every status
            // answer the same ExecID (or "0"), and applying one twice changes nothing (it
            // only applies what its CumQty is above what the order has).
            let answer = StatusAnswer {
                exec_id,
                ord_status: m.get(tag::ORD_STATUS).unwrap_or(b""),
                cum,
                leaves,
                avg_px,
            };
            self.on_status_answer(oid, &answer, out);
            return Ok(());
        }
        if !self.execs.insert(oid, exec_id, (last_qty, last_px)) {
            // PossDup/PossResend copy, or the venue repeating itself: applied once already.
            self.counters.duplicate_execs += 1;
            return Ok(());
        }
        match exec_type {
            b"F" | b"1" | b"2" => return self.on_trade(oid, last_qty, last_px, cum, leaves, out),
            b"H" => return self.on_trade_change(oid, exec_ref, None, cum, leaves, out),
            b"G" => {
                let new = Some((last_qty, last_px));
                return self.on_trade_change(oid, exec_ref, new, cum, leaves, out);
            }
            _ => {}
        }
        let Some(o) = self.book.get_mut(oid) else {
            return Ok(());
        };
        if o.status == OrderStatus::Done {
            // A late cancel/reject for a final order: the engine was answered already.
            self.counters.late_answers += 1;
            return Ok(());
        }
        let cl = o.cl_ord_id;
        let engine = o.engine;
        match exec_type {
            b"0" if o.status == OrderStatus::PendingNew => {
                o.status = OrderStatus::Open;
                out.engine.push((engine, Response::ack(cl, oid)));
            }
            b"4" | b"C" => self.close_canceled(oid, out),
            b"5" => {
                if let Some((rid, Change::Replace { qty, price })) = o.pending {
                    if rid == req {
                        let old = o.params;
                        let old_open = OrderParams {
                            qty: old.qty.saturating_sub(o.cum_qty),
                            ..old
                        };
                        let new_open = OrderParams {
                            qty: qty.saturating_sub(o.cum_qty),
                            price,
                            ..old
                        };
                        self.risk.move_reservation(&old_open, &new_open);
                        o.params.qty = qty;
                        o.params.price = price;
                        o.venue_cl_ord_id = rid;
                        o.pending = None;
                        if o.status == OrderStatus::PendingNew {
                            o.status = OrderStatus::Open;
                        }
                        let leaves = qty.saturating_sub(o.cum_qty);
                        out.engine
                            .push((engine, Response::replaced(cl, qty, leaves, price)));
                    }
                }
            }
            b"8" => self.new_order_refused(oid, Refusal::Venue, out),
            _ => {}
        }
        Ok(())
    }

    /// An answer to an OrderStatusRequest (ExecType I): the venue's view of the order.
    ///
    /// - The venue has it and it is PendingNew here: acknowledged.
    /// - CumQty above what the order has applied: the difference is executions whose
    ///   reports we never read (sent before a sequence reset, or otherwise unrecoverable).
    ///   It is applied as one fill through the path of real fills (positions, credit, the
    ///   engine's Fill; the report itself is in the journal as FIX_IN, so replay applies it
    ///   again the same way), priced so the order's average is the venue's AvgPx. A real
    ///   report for those shares cannot come after it: the venue sends its status answer
    ///   after the reports it covers, and we process messages in sequence, so any such
    ///   report was applied already (and is in `cum_qty`), or was lost for good. Should a
    ///   venue resend one anyway (PossDup from before a reset), its CumQty is not above
    ///   the order's and `on_trade` drops it as a duplicate.
    /// - OrdStatus final: the order is closed as the matching report would (Canceled with
    ///   what was left open; Rejected as a venue reject). A cancel or replace still pending
    ///   on an order the answer closes, or on one already final here, is answered too: a cancel by that Canceled, anything
    ///   else refused (`VenueCancelReject`). The answer stands for reports the venue may
    ///   never send again (those before a sequence reset), its answer to the change among
    ///   them; should that answer come after all, it is late (counted, not forwarded).
    /// - CumQty below what the order has applied: counted (`status_mismatch`) and logged,
    ///   nothing changed (the venue forgot executions? an operator must look).
    fn on_status_answer(&mut self, oid: u64, a: &StatusAnswer<'_>, out: &mut Outputs) {
        let StatusAnswer {
            exec_id,
            ord_status,
            cum,
            leaves,
            avg_px,
        } = *a;
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        let was_done = o.status == OrderStatus::Done;
        if cum < o.cum_qty {
            self.counters.status_mismatch += 1;
            if !self.replaying {
                tracing::warn!(
                    order = oid,
                    venue_cum = cum,
                    applied = o.cum_qty,
                    ord_status = %String::from_utf8_lossy(ord_status),
                    "status answer's CumQty is below what the gateway applied: not applied"
                );
            }
            return;
        }
        // OrdStatus 2 Filled, 3 DoneForDay, 4 Canceled, 8 Rejected, C Expired.
        let is_final = matches!(ord_status, b"2" | b"3" | b"4" | b"8" | b"C");
        let (engine, cl) = (o.engine, o.cl_ord_id);
        if o.status == OrderStatus::PendingNew && !matches!(ord_status, b"8" | b"A") {
            o.status = OrderStatus::Open;
            out.engine.push((engine, Response::ack(cl, oid)));
        }
        if cum > o.cum_qty {
            let diff = cum - o.cum_qty;
            let px = avg_px.map_or(o.params.price, |avg| {
                status_fill_price(avg, cum, o.notional, diff)
            });
            // Final: what the venue left open goes with the close below (a fill of all
            // closes the order itself); live: what the venue says is open.
            let trade_leaves = match ord_status {
                b"2" => 0,
                _ if is_final => o.params.qty.saturating_sub(cum),
                _ => leaves,
            };
            self.counters.status_fills += 1;
            if !self.replaying {
                tracing::warn!(
                    order = oid,
                    qty = diff,
                    px,
                    cum,
                    prev_cum = o.cum_qty,
                    ord_status = %String::from_utf8_lossy(ord_status),
                    "executions known only from a status answer (their reports were never \
                     read): applied as one fill"
                );
            }
            // Remembered under a key no venue ExecID can be (SOH never occurs in a FIX
            // value): it can neither pass for a real execution nor make one a duplicate.
            let mut key = Vec::with_capacity(exec_id.len() + 8);
            key.extend_from_slice(b"\x01status:");
            key.extend_from_slice(exec_id);
            self.execs.insert(oid, &key, (diff, px));
            let _ = self.on_trade(oid, diff, px, cum, trade_leaves, out);
        }
        if !is_final {
            return;
        }
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        // An order already final here (its fill or cancel read before this answer) is not
        // closed again, but a change still pending on it is answered below all the same: a
        // final OrdStatus means no change can take effect any more, whichever came first,
        // the report that closed the order or this answer. Returning early here left the
        // change pending for ever when the venue never got it (simulator seed 404219: the
        // cancel's MsgSeqNum lost in a crash, the venue's ResendRequest for it lost before
        // its Logon; the status answer came after the resent fill).
        if !was_done && o.status != OrderStatus::Done {
            if ord_status == b"8" {
                // Rejected while we took it for live: as a venue reject (which answers a
                // pending change too).
                return self.new_order_refused(oid, Refusal::Venue, out);
            }
            self.close_canceled(oid, out);
        }
        // Closed by this answer (a fill of the rest above, or the close just made), or final
        // before it.
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        match o.pending {
            Some((_, Change::Cancel)) if matches!(ord_status, b"3" | b"4" | b"C") => {
                o.pending = None;
            }
            Some(_) => self.change_refused(oid, Refusal::Venue, out),
            None => {}
        }
    }

    /// Closes live order `oid` as Canceled with what was left open: its exposure released,
    /// the engine told (a venue's Canceled or Expired, or a status answer saying so).
    fn close_canceled(&mut self, oid: u64, out: &mut Outputs) {
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        let left = o.params.qty.saturating_sub(o.cum_qty);
        // A pending cancel is answered by this (else it counted as unanswered for ever); a
        // pending replace still gets the venue's reject, which tells the engine it failed.
        if matches!(o.pending, Some((_, Change::Cancel))) {
            o.pending = None;
        }
        let (p, engine, cl) = (o.params, o.engine, o.cl_ord_id);
        self.book.set_status(oid, OrderStatus::Done);
        self.risk.on_order_done(&p, left);
        out.engine.push((engine, Response::canceled(cl, left)));
    }

    /// The venue refused new order `oid` (ExecType 8, a status answer saying Rejected, or a
    /// reject of its NewOrderSingle). A cancel or replace pending on it is refused too: the
    /// venue has no order to change, and after a status answer its own reply to the change
    /// may never come (a later one is a late answer, counted and not forwarded).
    pub(super) fn new_order_refused(&mut self, oid: u64, by: Refusal, out: &mut Outputs) {
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        if o.status == OrderStatus::Done {
            return;
        }
        let leaves = o.params.qty.saturating_sub(o.cum_qty);
        let (p, engine, cl) = (o.params, o.engine, o.cl_ord_id);
        self.book.set_status(oid, OrderStatus::Done);
        self.risk.on_order_done(&p, leaves);
        out.engine.push((
            engine,
            Response::reject(cl, msg_type::NEW_ORDER, by.order()),
        ));
        self.change_refused(oid, by, out);
    }

    /// The venue refused our order message `ref_type` (D, F or G) whose ClOrdID is `req`
    /// without an ExecutionReport or OrderCancelReject (BusinessMessageReject, or a session
    /// Reject): a new order not yet acknowledged is rejected, a pending cancel or replace
    /// is answered as cancel-rejected. Anything else (a refused OrderStatusRequest, a late
    /// reject of a request already answered) changes nothing.
    pub(super) fn on_request_refused(&mut self, ref_type: &[u8], req: u64, out: &mut Outputs) {
        let Some(oid) = self.book.order_of_request(req) else {
            return;
        };
        let Some(o) = self.book.get(oid) else {
            return;
        };
        self.counters.venue_refused += 1;
        if !self.replaying {
            tracing::warn!(
                order = oid,
                request = req,
                msg_type = %String::from_utf8_lossy(ref_type),
                "venue refused an order message"
            );
        }
        match ref_type {
            b"D" if req == oid && o.status == OrderStatus::PendingNew => {
                self.new_order_refused(oid, Refusal::Venue, out);
            }
            b"F" | b"G" if o.pending.is_some_and(|(rid, _)| rid == req) => {
                self.change_refused(oid, Refusal::Venue, out);
            }
            _ => {}
        }
    }

    /// Quantity of `o` still reserved in risk: what is open while it is live.
    fn reserved(o: &Order) -> u32 {
        if o.status == OrderStatus::Done {
            0
        } else {
            o.params.qty.saturating_sub(o.cum_qty)
        }
    }

    /// A fill (ExecType F, or 1/2 of earlier FIX versions).
    fn on_trade(
        &mut self,
        oid: u64,
        last_qty: u32,
        last_px: i64,
        cum: u32,
        leaves: u32,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        let Some(o) = self.book.get_mut(oid) else {
            return Ok(());
        };
        if cum <= o.cum_qty {
            // CumQty did not grow: a repeat of a fill already applied under another ExecID.
            self.counters.duplicate_execs += 1;
            return Ok(());
        }
        let was_done = o.status == OrderStatus::Done;
        let reserved = Self::reserved(o);
        // What the order has left open follows CumQty, whatever LastQty says: a report whose
        // LastQty is not CumQty's growth (a venue bug, or fills we never saw) must not leave
        // the reservation out of step with the order.
        let grown = cum - o.cum_qty;
        let released = grown.min(reserved);
        if grown != last_qty {
            self.counters.inconsistent_fills += 1;
        }
        // Logged at the 1st, 2nd, 4th... so a venue that sends them all day cannot flood
        // the log.
        if grown != last_qty
            && !self.replaying
            && self.counters.inconsistent_fills.is_power_of_two()
        {
            tracing::warn!(
                total = self.counters.inconsistent_fills,
                order = oid,
                last_qty,
                cum,
                prev_cum = o.cum_qty,
                "execution report's LastQty is not its CumQty's growth"
            );
        }
        o.cum_qty = cum;
        o.notional += i128::from(last_qty) * i128::from(last_px);
        if o.status == OrderStatus::PendingNew {
            o.status = OrderStatus::Open;
        }
        let overfill = cum > o.params.qty;
        let (p, cl, engine) = (o.params, o.cl_ord_id, o.engine);
        self.risk.on_execution(&p, last_qty, last_px, released);
        if overfill {
            self.counters.overfills += 1;
        }
        if was_done {
            self.counters.late_fills += 1;
            if !self.replaying {
                tracing::warn!(order = oid, last_qty, cum, "execution on a final order");
            }
            let kind = if overfill {
                proto::NoticeKind::Overfill
            } else {
                proto::NoticeKind::LateFill
            };
            out.engine.push((
                engine,
                Response::notice(cl, kind, i64::from(last_qty), last_px, cum, 0),
            ));
            return Ok(());
        }
        let leaves = if overfill { 0 } else { leaves };
        if leaves == 0 {
            // Final: whatever was reserved beyond this execution (an IOC remainder) goes too.
            self.book.set_status(oid, OrderStatus::Done);
            self.risk.on_order_done(&p, reserved - released);
        }
        out.engine
            .push((engine, Response::fill(cl, last_qty, last_px, cum, leaves)));
        if overfill {
            if !self.replaying {
                tracing::warn!(
                    order = oid,
                    qty = p.qty,
                    cum,
                    "over-fill: CumQty above OrderQty"
                );
            }
            out.engine.push((
                engine,
                Response::notice(cl, proto::NoticeKind::Overfill, 0, last_px, cum, 0),
            ));
        }
        Ok(())
    }

    /// A trade cancel (`new` None, ExecType H) or correct (`new` the corrected quantity and
    /// price, ExecType G) of execution `exec_ref`: positions and executed notional lose the
    /// old execution and gain the new one; the order takes the venue's CumQty and LeavesQty
    /// (a bust can make a filled order live again).
    fn on_trade_change(
        &mut self,
        oid: u64,
        exec_ref: &[u8],
        new: Option<(u32, i64)>,
        cum: u32,
        leaves: u32,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        let Some(o) = self.book.get(oid) else {
            return Ok(());
        };
        let (p, cl, engine, old_cum) = (o.params, o.cl_ord_id, o.engine, o.cum_qty);
        let old_reserved = Self::reserved(o);
        let was_open = o.status != OrderStatus::Done;
        let (new_qty, new_px) = new.unwrap_or((0, 0));
        let old = match self.execs.trade(oid, exec_ref) {
            Some(t) => t,
            None => {
                // Not remembered (too old, or never seen): what the venue's CumQty says.
                self.counters.trade_refs_unknown += 1;
                let q = (i64::from(old_cum) - i64::from(cum) + i64::from(new_qty)).max(0);
                (
                    u32::try_from(q).unwrap_or(0),
                    if new.is_some() { new_px } else { p.price },
                )
            }
        };
        self.risk.on_execution_reversed(&p, old.0, old.1);
        if new.is_some() {
            self.risk.on_execution(&p, new_qty, new_px, 0);
        }
        self.execs.set_trade(oid, exec_ref, (new_qty, new_px));
        let now_open = leaves > 0 && p.qty > cum;
        let new_reserved = if now_open { p.qty - cum } else { 0 };
        if let Some(o) = self.book.get_mut(oid) {
            o.cum_qty = cum;
            o.notional +=
                i128::from(new_qty) * i128::from(new_px) - i128::from(old.0) * i128::from(old.1);
        }
        if was_open && !now_open {
            self.book.set_status(oid, OrderStatus::Done);
        } else if !was_open && now_open {
            self.book.set_status(oid, OrderStatus::Open);
        }
        match (was_open, now_open) {
            (true, true) => self.risk.move_reservation(
                &OrderParams {
                    qty: old_reserved,
                    ..p
                },
                &OrderParams {
                    qty: new_reserved,
                    ..p
                },
            ),
            (true, false) => {
                self.risk.on_order_done(&p, old_reserved);
            }
            (false, true) => {
                self.risk.restore_open(&OrderParams {
                    qty: new_reserved,
                    ..p
                });
            }
            (false, false) => {}
        }
        let (kind, px) = match new {
            None => {
                self.counters.trade_cancels += 1;
                (proto::NoticeKind::TradeCancel, old.1)
            }
            Some(_) => {
                self.counters.trade_corrections += 1;
                (proto::NoticeKind::TradeCorrect, new_px)
            }
        };
        let delta = i64::from(new_qty) - i64::from(old.0);
        if !self.replaying {
            tracing::warn!(
                order = oid,
                ?kind,
                delta,
                cum,
                leaves,
                "venue changed an execution"
            );
        }
        out.engine.push((
            engine,
            Response::notice(cl, kind, delta, px, cum, new_reserved),
        ));
        Ok(())
    }

    pub(super) fn on_cancel_reject(
        &mut self,
        m: &Message<'_>,
        out: &mut Outputs,
    ) -> Result<(), AppReject> {
        let Some((req, oid)) = self.lookup(m)? else {
            return Ok(());
        };
        let Some(o) = self.book.get_mut(oid) else {
            return Ok(());
        };
        let Some((rid, _)) = o.pending else {
            self.counters.late_answers += 1;
            return Ok(());
        };
        if rid != req {
            self.counters.late_answers += 1;
            return Ok(());
        }
        self.change_refused(oid, Refusal::Venue, out);
        Ok(())
    }

    /// The pending cancel or replace of `oid` was refused (by the venue, or never sent).
    pub(super) fn change_refused(&mut self, oid: u64, by: Refusal, out: &mut Outputs) {
        let Some(o) = self.book.get_mut(oid) else {
            return;
        };
        let Some((_, change)) = o.pending else {
            return;
        };
        // Answered even when a fill or cancel made the order final meanwhile: the engine
        // learns its request failed, and its client takes a cancel/replace reject of a
        // final order as information.
        o.pending = None;
        let request = match change {
            Change::Cancel => msg_type::CANCEL,
            Change::Replace { .. } => msg_type::REPLACE,
        };
        let (engine, cl) = (o.engine, o.cl_ord_id);
        out.engine
            .push((engine, Response::reject(cl, request, by.change())));
    }
}

/// Price of `diff` executions that make an order's average `avg` over `cum` when those
/// already applied came to `known` (quantity x price): `(avg*cum - known) / diff`, rounded
/// to the nearest unit of the gateway's price (1/[`crate::proto::PRICE_SCALE`]), halves
/// away from zero; `avg` itself if that does not fit.
pub(super) fn status_fill_price(avg: i64, cum: u32, known: i128, diff: u32) -> i64 {
    let num = i128::from(avg) * i128::from(cum) - known;
    let d = i128::from(diff.max(1));
    let q = if num >= 0 {
        (2 * num + d) / (2 * d)
    } else {
        -((-2 * num + d) / (2 * d))
    };
    i64::try_from(q).unwrap_or(avg)
}
