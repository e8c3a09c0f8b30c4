//! Recovery: journal records replayed into [`Gateway`] (the same state transitions as live,
//! nothing emitted), and checkpoints, the whole recoverable state written as the first
//! record of a journal segment and restored from it.
//!
//! Must not touch sockets or files: the driver reads and writes the journal.

use zerocopy::FromBytes;

use super::fills::Refusal;
use super::records::{
    record, Decision, DecisionTrailer, ORIGIN_ENGINE, SESSION_DISCONNECT, SESSION_LOGON,
};
use super::venue::find_seq;
use super::{Change, EngineFrame, Gateway, Order, OrderStatus, Outputs};
use crate::fix::codec::parse_uint;
use crate::fix::{split_frame, tag, Message};
use crate::proto::{msg_type, RejectReason, Response, Side, Symbol};
use crate::risk::{KillScope, OrderParams, RequestKind};

impl Gateway {
    /// A record replay could not read (a checkpoint of another layout, a record kind, kill
    /// scope or engine session event it does not know): the journal must not be used as if
    /// replayed (the caller stops the start with it).
    pub fn take_replay_error(&mut self) -> Option<crate::checkpoint::CheckpointError> {
        self.replay_error.take()
    }

    /// The recoverable state as a checkpoint payload ([`crate::checkpoint`]), for the first
    /// record ([`record::CHECKPOINT`]) of a new journal segment. The checkpoint writer calls
    /// it on a gateway replayed up to a [`record::CUT`] (off the service thread); the live
    /// gateway applies the cut itself ([`checkpoint_written`](Self::checkpoint_written)),
    /// and the state after it is the one this checkpoint restores.
    pub fn checkpoint(&self) -> Result<Vec<u8>, crate::checkpoint::CheckpointError> {
        use crate::checkpoint::{GatewayState, OrderState};
        let mut orders: Vec<(u64, OrderState)> = self
            .book
            .iter()
            .filter(|&(_, o)| self.book.kept(o))
            .map(|(id, o)| {
                let status = match o.status {
                    OrderStatus::PendingNew => 0,
                    OrderStatus::Open => 1,
                    OrderStatus::Done => 2,
                };
                let pending = o.pending.map(|(rid, c)| {
                    (
                        rid,
                        match c {
                            Change::Cancel => None,
                            Change::Replace { qty, price } => Some((qty, price)),
                        },
                    )
                });
                let p = o.params;
                (
                    id,
                    OrderState {
                        engine: o.engine,
                        cl_ord_id: o.cl_ord_id,
                        account: p.account,
                        symbol: p.symbol.0,
                        side: p.side as u8,
                        qty: p.qty,
                        price: p.price,
                        cum_qty: o.cum_qty,
                        status,
                        venue_cl_ord_id: o.venue_cl_ord_id,
                        pending,
                    },
                )
            })
            .collect();
        orders.sort_unstable_by_key(|(id, _)| *id);
        let keep = |id: &u64| self.book.keeps(*id);
        let mut by_request: Vec<(u64, u64)> =
            self.book.requests().filter(|(_, id)| keep(id)).collect();
        by_request.sort_unstable();
        let responses = self.engines.checkpoint_responses();
        let last_request = self.engines.checkpoint_last_request();
        let connected = self.engines.checkpoint_connected();
        let malformed = self.engines.checkpoint_malformed();
        let state = GatewayState {
            next_id: self.next_id,
            orders,
            by_request,
            responses,
            last_request,
            connected,
            malformed,
            execs: self.execs.checkpoint_state(),
            notional: {
                let mut n: Vec<(u64, i128)> = self
                    .book
                    .iter()
                    .filter(|&(_, o)| o.cum_qty > 0 && self.book.kept(o))
                    .map(|(id, o)| (id, o.notional))
                    .collect();
                n.sort_unstable();
                n
            },
            risk: self.risk.checkpoint_state(),
            session: self.session.checkpoint_state(),
        };
        crate::checkpoint::encode(&state)
    }

    /// A checkpoint cut ([`record::CUT`], live and in replay): what a checkpoint of the
    /// state here leaves out is gone from then on, so the state is exactly what a restart
    /// from that checkpoint rebuilds.
    ///
    /// Runs on the service thread at every cut, so it costs neither the day's orders nor
    /// the ones it drops: [`OrderBook::checkpoint_written`](super::order_book::OrderBook::checkpoint_written)
    /// counts them dead (absent to every accessor) and [`sweep`](Self::sweep) frees them
    /// later, a bounded number at a time. The execution log is not touched: a checkpoint
    /// holds all of it, the entries of orders it leaves out included (they are never looked
    /// up again), so its eviction order is the same live and after a restart.
    pub fn checkpoint_written(&mut self) {
        self.book.checkpoint_written();
    }

    /// Frees the memory of up to `budget` orders a cut left out (see
    /// [`checkpoint_written`](Self::checkpoint_written)); returns the entries visited.
    /// Nothing any caller can see changes.
    pub fn sweep(&mut self, budget: usize) -> usize {
        self.book.sweep(budget)
    }

    /// Orders final and not swept yet (memory a sweep will free once a cut left them out).
    pub fn unswept(&self) -> usize {
        self.book.unswept()
    }

    /// Replaces the whole recoverable state with a checkpoint's.
    fn restore_checkpoint(&mut self, s: &crate::checkpoint::GatewayState) {
        self.book.clear();
        let notional: rustc_hash::FxHashMap<u64, i128> = s.notional.iter().copied().collect();
        for (id, o) in &s.orders {
            let symbol = Symbol(o.symbol);
            let side = if o.side == Side::Sell as u8 {
                Side::Sell
            } else {
                Side::Buy
            };
            let status = match o.status {
                0 => OrderStatus::PendingNew,
                1 => OrderStatus::Open,
                _ => OrderStatus::Done,
            };
            let pending = o.pending.map(|(rid, c)| {
                (
                    rid,
                    match c {
                        None => Change::Cancel,
                        Some((qty, price)) => Change::Replace { qty, price },
                    },
                )
            });
            let order = Order {
                engine: o.engine,
                cl_ord_id: o.cl_ord_id,
                params: OrderParams {
                    account: o.account,
                    symbol,
                    side,
                    qty: o.qty,
                    price: o.price,
                },
                cum_qty: o.cum_qty,
                status,
                venue_cl_ord_id: o.venue_cl_ord_id,
                // Every order with executions has its notional in the checkpoint, except in
                // one written before it was kept: estimated at the limit price then.
                notional: notional
                    .get(id)
                    .copied()
                    .unwrap_or(i128::from(o.cum_qty) * i128::from(o.price)),
                pending,
                final_cut: 0,
            };
            self.book.restore(*id, order);
        }
        for &(request, id) in &s.by_request {
            self.book.note_request(request, id);
        }
        self.next_id = s.next_id;
        self.engines.restore_checkpoint(s);
        self.execs.restore_state(&s.execs);
        self.risk.restore_state(&s.risk);
        self.session.restore_state(&s.session);
    }

    /// Replays one journal record (recovery). Emits nothing, but numbers and keeps the
    /// engine responses the record produced live, so they can be replayed to engines.
    pub fn replay_record(&mut self, kind: u8, payload: &[u8]) {
        let mut scratch = std::mem::take(&mut self.scratch);
        self.replaying = true;
        self.replay_into(kind, payload, &mut scratch);
        self.replaying = false;
        self.seal(&mut scratch);
        scratch.clear();
        self.scratch = scratch;
    }

    fn replay_into(&mut self, kind: u8, payload: &[u8], scratch: &mut Outputs) {
        match kind {
            record::ENGINE_REQUEST => {
                let (Some(engine), Some(bytes)) = (payload.get(..4), payload.get(4..)) else {
                    return self.refuse_record(format!(
                        "an engine request record of {} bytes",
                        payload.len()
                    ));
                };
                let id = u32::from_le_bytes(engine.try_into().unwrap_or_default());
                // The same reading of the frame as live (EngineFrame::decode).
                let frame = EngineFrame::decode(bytes);
                self.engines.handle_request_seq(id, frame.seq);
                if frame.request.is_none() {
                    // Journals of earlier versions keep malformed frames whole, here.
                    self.counters.malformed_engine += 1;
                    Self::malformed(id, bytes, scratch);
                }
            }
            record::ENGINE_MALFORMED => {
                let (Some(engine), Some(kept)) = (payload.get(..4), payload.get(8..)) else {
                    return self.refuse_record(format!(
                        "a malformed-frame record of {} bytes",
                        payload.len()
                    ));
                };
                let engine = u32::from_le_bytes(engine.try_into().unwrap_or_default());
                self.engines
                    .handle_request_seq(engine, EngineFrame::decode(kept).seq);
                // `replaying` keeps it quiet; the cut-off is the same as live.
                self.on_malformed(engine, kept, 0, scratch);
            }
            record::DECISION => {
                let Ok((d, _)) = Decision::read_from_prefix(payload) else {
                    return self.refuse_record(format!(
                        "a decision of {} bytes (at least {} expected)",
                        payload.len(),
                        size_of::<Decision>()
                    ));
                };
                if let Some(reason) = RejectReason::from_u16(d.reason.get()) {
                    let (engine, cl) = (d.engine.get(), d.cl_ord_id.get());
                    scratch
                        .engine
                        .push((engine, Response::reject(cl, d.request, reason)));
                }
                self.apply_decision(&d);
                if d.reason.get() == 0 && d.request_id.get() != 0 {
                    // Its order message follows in the same write; see `close_unsent`.
                    self.unsent.insert(d.request_id.get());
                }
                let extra = payload.len() - size_of::<Decision>();
                if extra != 0 && extra != size_of::<DecisionTrailer>() {
                    return self.refuse_record(format!(
                        "a decision of {} bytes (fields after its trailer)",
                        payload.len()
                    ));
                }
                let trailer = payload
                    .get(size_of::<Decision>()..)
                    .and_then(|t| DecisionTrailer::read_from_prefix(t).ok())
                    .map(|(t, _)| t);
                if d.reason.get() == 0 {
                    let p = self.book.get(d.order_id.get()).map(|o| o.params);
                    if let Some(p) = p {
                        if d.request == msg_type::NEW_ORDER {
                            self.risk.restore_open(&p);
                        }
                        if let Some(t) = trailer {
                            self.restore_windows(&d, &p, t);
                        }
                    }
                }
            }
            record::KILL => {
                if let [tag, a, b, c, d, on] = *payload {
                    let id = u32::from_le_bytes([a, b, c, d]);
                    let scope = match tag {
                        0 => Some(KillScope::Global),
                        1 => Some(KillScope::Engine(id)),
                        2 => Some(KillScope::Account(id)),
                        _ => None,
                    };
                    let Some(scope) = scope else {
                        return self.refuse_record(format!("a kill switch of scope {tag}"));
                    };
                    // The cancels it caused are journaled as their own decisions.
                    self.risk.set_kill(scope, on != 0);
                } else {
                    self.refuse_record(format!("a kill switch record of {} bytes", payload.len()));
                }
            }
            record::ENGINE_SESSION => {
                if let (Some(e), Some(&ev)) = (payload.get(..4), payload.get(4)) {
                    let engine = u32::from_le_bytes(e.try_into().unwrap_or_default());
                    match ev {
                        SESSION_LOGON => self.engines.handle_logon(engine),
                        SESSION_DISCONNECT => self.engines.handle_disconnect(engine),
                        ev => self.refuse_record(format!("an engine session event {ev}")),
                    }
                } else {
                    self.refuse_record(format!(
                        "an engine session record of {} bytes",
                        payload.len()
                    ));
                }
            }
            record::CHECKPOINT => match crate::checkpoint::decode(payload) {
                Ok(state) => {
                    // Written between batches: every decision before it had its message.
                    self.unsent.clear();
                    self.restore_checkpoint(&state);
                }
                Err(e) => {
                    if self.replay_error.is_none() {
                        self.replay_error = Some(e);
                    }
                }
            },
            record::FIX_OUT => {
                if !self.unsent.is_empty() {
                    self.note_sent(payload);
                }
                self.session.replay_outbound(payload);
            }
            record::NOT_SENT => {
                let Ok(req) = <[u8; 8]>::try_from(payload) else {
                    return self
                        .refuse_record(format!("a never-sent record of {} bytes", payload.len()));
                };
                let req = u64::from_le_bytes(req);
                self.unsent.remove(&req);
                self.refuse_unsent(req, scratch);
            }
            record::FIX_IN_REJECTED => {
                let seq = split_frame(payload)
                    .ok()
                    .and_then(|_| Message::parse(payload).ok())
                    .and_then(|m| m.seq())
                    .or_else(|| find_seq(payload));
                if let Some(seq) = seq {
                    self.session.consume_rejected(seq);
                }
            }
            record::FIX_IN => {
                if split_frame(payload).is_err() {
                    return;
                }
                let Ok(m) = Message::parse(payload) else {
                    // Rejected for its fields and consumed live: consume it again.
                    if let Some(seq) = find_seq(payload) {
                        self.session.consume_rejected(seq);
                    }
                    return;
                };
                self.session.replay_inbound(&m);
                if !self.unsent.is_empty() && matches!(m.msg_type(), b"8" | b"9") {
                    // The venue answered it: it went out, whatever the journal lost.
                    if let Some(id) = m.get(tag::CL_ORD_ID).and_then(parse_uint) {
                        self.unsent.remove(&id);
                    }
                }
                if m.msg_type() == b"3" {
                    self.on_session_reject(&m, scratch);
                }
                if !matches!(m.msg_type(), b"0" | b"1" | b"2" | b"3" | b"4" | b"5" | b"A") {
                    let _ = self.apply_app(&m, scratch);
                }
            }
            // Where the live gateway applied it: the same state follows, and the next
            // segment's checkpoint (the state just before it) restores to it.
            record::CUT if payload.is_empty() => {
                // Replay has no turn to keep short: what the cut left out is freed at once.
                self.checkpoint_written();
                self.sweep(usize::MAX);
            }
            record::CUT => self.refuse_record(format!("a cut record of {} bytes", payload.len())),
            kind => self.refuse_record(format!("a record of kind {kind}")),
        }
    }

    /// Replay met a record it does not know: the start stops rather than half-read a journal
    /// a newer gateway wrote.
    fn refuse_record(&mut self, what: String) {
        if self.replay_error.is_none() {
            self.replay_error = Some(crate::checkpoint::CheckpointError::UnknownRecord(what));
        }
    }

    /// Replay: the order messages (D, F, G) in a FIX_OUT record went out.
    fn note_sent(&mut self, frames: &[u8]) {
        let mut rest = frames;
        while let Ok(n) = split_frame(rest) {
            if let Ok(m) = Message::parse(&rest[..n]) {
                if matches!(m.msg_type(), b"D" | b"F" | b"G") {
                    let id = m.get(tag::CL_ORD_ID).and_then(parse_uint);
                    if let Some(id) = id {
                        self.unsent.remove(&id);
                    }
                }
            }
            rest = &rest[n..];
        }
    }

    /// After the journal is replayed: rejects, with [`RejectReason::NotSent`], every
    /// accepted request whose order message the journal does not hold, and journals that
    /// it did ([`record::NOT_SENT`]), so a later replay gives the same answers once.
    ///
    /// A decision and its order message are written together, the journal before anything
    /// is sent, and a failed append is rolled back whole; only a gateway killed in the
    /// middle of that write (the kernel stops a write at a page boundary when a fatal
    /// signal is pending) leaves a decision without its message, in the torn last batch.
    /// Such a request never reached the venue. Closing it here, rather than asking the
    /// venue about an order it never saw, does not depend on how a venue answers an
    /// OrderStatusRequest for an unknown ClOrdID (some ignore it, and the order would stay
    /// pending, its risk reserved, for the day).
    pub fn close_unsent(&mut self, out: &mut Outputs) {
        if self.unsent.is_empty() {
            return;
        }
        let mut reqs: Vec<u64> = self.unsent.drain().collect();
        reqs.sort_unstable();
        for req in reqs {
            out.record(record::NOT_SENT, &[&req.to_le_bytes()]);
            self.refuse_unsent(req, out);
        }
        self.seal(out);
    }

    /// Requests replay found without their order message are left in doubt (the sync
    /// policy cannot prove they were never sent): they are asked about at logon like any
    /// order sent and not acknowledged. Returns how many.
    pub fn leave_unsent_in_doubt(&mut self) -> usize {
        let n = self.unsent.len();
        self.unsent.clear();
        n
    }

    /// Request `req` never went out: a new order is closed, a cancel or replace answered,
    /// each with [`RejectReason::NotSent`] (live and replay).
    fn refuse_unsent(&mut self, req: u64, out: &mut Outputs) {
        let Some(oid) = self.book.order_of_request(req) else {
            return;
        };
        let Some(&o) = self.book.get(oid) else {
            return;
        };
        self.counters.not_sent += 1;
        if !self.replaying {
            tracing::warn!(
                order = oid,
                request = req,
                "request journaled but never sent (the gateway stopped before its order \
                 message was journaled): rejected NotSent"
            );
        }
        if req == oid && o.status == OrderStatus::PendingNew {
            self.new_order_refused(oid, Refusal::NotSent, out);
        } else if o.pending.is_some_and(|(rid, _)| rid == req) {
            self.change_refused(oid, Refusal::NotSent, out);
        }
    }

    /// Counts an accepted decision in the throttle and repeated-order windows as its check
    /// did live (recovery).
    fn restore_windows(&mut self, d: &Decision, order: &OrderParams, t: DecisionTrailer) {
        let now = t.now.get();
        match d.request {
            msg_type::NEW_ORDER => self.risk.restore_request(RequestKind::New, order, now),
            msg_type::CANCEL if t.origin == ORIGIN_ENGINE => {
                self.risk.restore_request(RequestKind::Cancel, order, now)
            }
            msg_type::REPLACE => {
                let new = OrderParams {
                    qty: d.qty.get(),
                    price: d.price.get(),
                    ..*order
                };
                self.risk.restore_request(RequestKind::Replace, &new, now)
            }
            _ => {}
        }
    }
}
