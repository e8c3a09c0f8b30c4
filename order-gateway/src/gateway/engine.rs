//! The engine side of [`Gateway`]: engine logons and disconnects (cancel-on-disconnect,
//! also across restarts), frames in (decoded, journaled, re-sent ones answered with a
//! status, malformed ones bounded) and responses out (numbered per engine and kept for
//! replay). What a request decides is in `orders`.
//!
//! Must not touch sockets or files.

use super::records::{record, MALFORMED_KEPT, ORIGIN_ENGINE, SESSION_DISCONNECT, SESSION_LOGON};
use super::{EngineFrame, EngineId, EngineSessions, Gateway, OrderStatus, Outputs};
use crate::fix::SessionState;
use crate::proto::{msg_type, LogonStatus, OrdState, RejectReason, Request, Response};

impl Gateway {
    /// Keeps `n` responses per engine for replay instead of
    /// [`RESPONSE_HISTORY`](super::RESPONSE_HISTORY) (before any response is produced; tests
    /// use a small `n`).
    pub fn with_response_history(mut self, n: usize) -> Gateway {
        self.engines.set_history(n);
        self
    }

    /// The engine sessions (logon state, response numbering, request numbers, deadlines).
    pub fn engine_sessions(&self) -> &EngineSessions {
        &self.engines
    }

    /// The sequence number of the newest response to `engine` (0: none yet).
    pub fn last_response_seq(&self, engine: EngineId) -> u32 {
        self.engines.last_response_seq(engine)
    }

    /// The highest request sequence number of `engine` journaled (0: none): the logon
    /// answer tells the engine that every later request was not taken.
    pub fn last_request_seq(&self, engine: EngineId) -> u32 {
        self.engines.last_request_seq(engine)
    }

    /// `engine`'s request numbers from `from` on, below its highest taken, that were never
    /// taken (at most `max`, ascending), and whether there were more: what a logon answer
    /// lists ([`crate::proto::RequestHoles`]).
    pub fn request_holes(&self, engine: EngineId, from: u32, max: usize) -> (Vec<u32>, bool) {
        self.engines.request_holes(engine, from, max)
    }

    /// The responses to `engine` after sequence number `after`, oldest first, for an engine
    /// that logs on again: `BadSequence` if `after` is beyond the newest, `ReplayUnavailable`
    /// if some of them are no longer kept.
    pub fn responses_after(
        &self,
        engine: EngineId,
        after: u32,
    ) -> Result<impl Iterator<Item = &Response> + '_, LogonStatus> {
        self.engines.responses_after(engine, after)
    }

    /// Numbers the responses queued in `out` since the last call and keeps them for replay.
    pub(super) fn seal(&mut self, out: &mut Outputs) {
        self.engines.seal(out);
    }

    /// After a restart (journal replayed): every engine that was logged on when the
    /// gateway stopped, or that has open orders, must log on again within `timeout_ns`,
    /// else its open orders are cancelled at the venue, as if its connection had dropped.
    pub fn arm_restart_cancel_on_disconnect(&mut self, now: u64, timeout_ns: u64) {
        let mut engines: Vec<EngineId> = self.engines.connected().collect();
        engines.extend(
            self.book
                .iter()
                .filter(|(_, o)| o.status != OrderStatus::Done)
                .map(|(_, o)| o.engine),
        );
        engines.sort_unstable();
        engines.dedup();
        self.engines.arm_restart(engines, now, timeout_ns);
    }

    /// Engines that must log on again before their restart deadline, with the deadline.
    pub fn restart_deadlines(&self) -> Vec<(EngineId, u64)> {
        self.engines.deadlines().collect()
    }

    /// An engine logged on: journaled (so a restart knows whose orders to guard), and its
    /// restart deadline, if any, is met.
    pub fn on_engine_logon(&mut self, engine: EngineId, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_LOGON]],
        );
        self.engines.handle_logon(engine);
    }

    /// Malformed frames `engine` sent since it last logged on.
    pub fn malformed_since_logon(&self, engine: EngineId) -> u32 {
        self.engines.malformed_since_logon(engine)
    }

    /// Cancel-on-disconnect: cancels every open order of `engine`.
    pub fn on_engine_disconnect(&mut self, engine: EngineId, now: u64, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_DISCONNECT]],
        );
        self.engines.handle_disconnect(engine);
        if self.session.state() != SessionState::Active {
            // The cancels need the venue: they go out as soon as the session is up again
            // (unless the engine logs on first), not rejected as SessionDown to nobody.
            self.engines.defer_cancels(engine);
            self.seal(out);
            return;
        }
        self.cancel_where(now, out, |o| o.engine == engine);
        self.seal(out);
    }

    /// One engine frame.
    pub fn on_engine_message(
        &mut self,
        engine: EngineId,
        bytes: &[u8],
        now: u64,
        out: &mut Outputs,
    ) {
        self.on_engine_frame(engine, &EngineFrame::decode(bytes), now, out);
    }

    /// One engine frame, decoded once by the caller.
    pub fn on_engine_frame(
        &mut self,
        engine: EngineId,
        frame: &EngineFrame<'_>,
        now: u64,
        out: &mut Outputs,
    ) {
        self.engine_message(engine, frame, now, out);
        self.seal(out);
    }

    /// A request that does not decode: journaled (its first [`MALFORMED_KEPT`] bytes),
    /// answered with a Malformed reject, counted, logged at most once a second per engine;
    /// the one that reaches `max_malformed_frames` since the engine's logon cuts it off.
    pub(super) fn on_malformed(
        &mut self,
        engine: EngineId,
        bytes: &[u8],
        now: u64,
        out: &mut Outputs,
    ) {
        let kept = &bytes[..bytes.len().min(MALFORMED_KEPT)];
        out.record(
            record::ENGINE_MALFORMED,
            &[
                &engine.to_le_bytes(),
                &(bytes.len() as u32).to_le_bytes(),
                kept,
            ],
        );
        self.counters.malformed_engine += 1;
        let max = self.engines.max_malformed();
        let quiet = self.replaying;
        let v = self.engines.handle_malformed(engine, now, quiet);
        if v.log_frames > 0 {
            tracing::warn!(
                engine,
                frames = v.log_frames,
                since_logon = v.since_logon,
                max_malformed_frames = max,
                "malformed engine frames (answered Malformed)"
            );
        }
        if v.cut_off {
            self.counters.malformed_disconnects += 1;
            if !quiet {
                tracing::warn!(
                    engine,
                    max_malformed_frames = max,
                    "engine sent too many malformed frames: disconnecting it \
                     (cancel-on-disconnect); nothing more is taken from it until it logs on \
                     again"
                );
            }
            if !out.kick.contains(&engine) {
                out.kick.push(engine);
            }
        }
        Self::malformed(engine, kept, out);
    }

    /// A request that does not decode is answered with a Malformed reject (live and replay).
    pub(super) fn malformed(engine: EngineId, bytes: &[u8], out: &mut Outputs) {
        let frame = EngineFrame::decode(bytes);
        out.engine
            .push((engine, frame.reject(RejectReason::Malformed)));
    }

    fn engine_message(
        &mut self,
        engine: EngineId,
        frame: &EngineFrame<'_>,
        now: u64,
        out: &mut Outputs,
    ) {
        let bytes = frame.bytes();
        if self.engines.is_cut_off(engine) {
            // Cut off (its connection is being closed): nothing is taken, and its logon
            // answer will say so (last request taken).
            self.counters.frames_after_cutoff += 1;
            return;
        }
        if self.engines.is_taken(engine, frame.seq) {
            // Taken before (the engine could not know: it lost our answer or its state).
            // Answered with where the order stands; never acted on, nor journaled, again.
            if let Some(req) = &frame.request {
                self.answer_resend(engine, req, out);
            }
            self.counters.resent_requests += 1;
            return;
        }
        let Some(req) = frame.request else {
            self.engines.handle_request_seq(engine, frame.seq);
            return self.on_malformed(engine, bytes, now, out);
        };
        out.record(record::ENGINE_REQUEST, &[&engine.to_le_bytes(), bytes]);
        self.engines.handle_request_seq(engine, frame.seq);
        match req {
            Request::NewOrder(m) => self.handle_new(engine, &m, now, out),
            Request::Cancel(m) => {
                self.handle_cancel(engine, m.cl_ord_id.get(), ORIGIN_ENGINE, now, out)
            }
            Request::Replace(m) => self.handle_replace(engine, &m, now, out),
            Request::MassCancel(m) => {
                let (account, symbol) = (m.account.get(), m.symbol);
                self.cancel_where(now, out, |o| {
                    o.engine == engine
                        && (account == 0 || o.params.account == account)
                        && (symbol.is_blank() || o.params.symbol == symbol)
                });
            }
        }
    }

    /// The unnumbered status answer to a re-sent request.
    fn answer_resend(&self, engine: EngineId, req: &Request, out: &mut Outputs) {
        let cl = req.cl_ord_id();
        if matches!(req, Request::MassCancel(_)) {
            return; // no order to report on; its cancels went out when it was taken
        }
        let status = match self.order(engine, cl) {
            Some(o) => {
                let state = match o.status {
                    OrderStatus::PendingNew => OrdState::PendingNew,
                    OrderStatus::Open => OrdState::Open,
                    OrderStatus::Done if o.cum_qty >= o.params.qty => OrdState::Filled,
                    OrderStatus::Done => OrdState::Canceled,
                };
                let p = o.params;
                Response::status(
                    cl,
                    state,
                    p.qty,
                    o.cum_qty,
                    p.price,
                    req.msg_type(),
                    None,
                    req.seq(),
                )
            }
            None if req.msg_type() == msg_type::NEW_ORDER && self.risk.is_seen(engine, cl) => {
                // Rejected when taken: the reason is in the responses still kept.
                let reason = self.engines.kept_new_order_reject(engine, cl);
                Response::status(
                    cl,
                    OrdState::Rejected,
                    0,
                    0,
                    0,
                    req.msg_type(),
                    reason,
                    req.seq(),
                )
            }
            None => Response::status(
                cl,
                OrdState::Unknown,
                0,
                0,
                0,
                req.msg_type(),
                None,
                req.seq(),
            ),
        };
        out.info.push((engine, status));
    }
}
