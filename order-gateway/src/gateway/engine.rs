//! The engine side of [`Gateway`]: engine logons and disconnects (cancel-on-disconnect,
//! also across restarts), frames in (decoded, journaled, re-sent ones answered with a
//! status, malformed ones bounded) and responses out (numbered per engine and kept for
//! replay). What a request decides is in `orders`.
//!
//! Must not touch sockets or files.

use std::collections::VecDeque;

use super::records::{record, MALFORMED_KEPT, ORIGIN_ENGINE, SESSION_DISCONNECT, SESSION_LOGON};
use super::{EngineId, Gateway, OrderStatus, Outputs, ResponseLog};
use crate::fix::SessionState;
use crate::proto::{msg_type, LogonStatus, OrdState, RejectReason, Request, Response};

/// Malformed-frame log lines: at most one per engine per this many nanoseconds (the rest
/// are summed into the next line).
const MALFORMED_LOG_INTERVAL_NS: u64 = 1_000_000_000;

impl Gateway {
    /// Keeps `n` responses per engine for replay instead of
    /// [`RESPONSE_HISTORY`](super::RESPONSE_HISTORY) (before any response is produced; tests
    /// use a small `n`).
    pub fn with_response_history(mut self, n: usize) -> Gateway {
        self.history = n.max(1);
        for log in self.responses.values_mut() {
            *log = ResponseLog::new(self.history);
        }
        self
    }

    /// The sequence number of the newest response to `engine` (0: none yet).
    pub fn last_response_seq(&self, engine: EngineId) -> u32 {
        self.responses.get(&engine).map_or(0, |l| l.last)
    }

    /// The highest request sequence number of `engine` journaled (0: none): the logon
    /// answer tells the engine that every later request was not taken.
    pub fn last_request_seq(&self, engine: EngineId) -> u32 {
        self.last_request.get(&engine).copied().unwrap_or(0)
    }

    /// `engine`'s request numbers from `from` on, below its highest taken, that were never
    /// taken (at most `max`, ascending), and whether there were more: what a logon answer
    /// lists ([`crate::proto::RequestHoles`]).
    pub fn request_holes(&self, engine: EngineId, from: u32, max: usize) -> (Vec<u32>, bool) {
        self.request_holes.from(engine, from, max)
    }

    /// Notes the request number of a journaled frame (live and replay).
    pub(super) fn note_request_seq(&mut self, engine: EngineId, bytes: &[u8]) {
        let seq = request_seq(bytes);
        if seq != 0 {
            let last = self.last_request.entry(engine).or_insert(0);
            self.request_holes.taken(engine, *last, seq);
            *last = (*last).max(seq);
        }
    }

    /// The responses to `engine` after sequence number `after`, oldest first, for an engine
    /// that logs on again: `BadSequence` if `after` is beyond the newest, `ReplayUnavailable`
    /// if some of them are no longer kept.
    pub fn responses_after(
        &self,
        engine: EngineId,
        after: u32,
    ) -> Result<impl Iterator<Item = &Response> + '_, LogonStatus> {
        let (last, kept) = self
            .responses
            .get(&engine)
            .map_or((0, None), |l| (l.last, Some(&l.kept)));
        if after > last {
            return Err(LogonStatus::BadSequence);
        }
        let missing = (last - after) as usize;
        let held = kept.map_or(0, VecDeque::len);
        if missing > held {
            return Err(LogonStatus::ReplayUnavailable);
        }
        Ok(kept
            .into_iter()
            .flat_map(move |k| k.range(held - missing..)))
    }

    /// Numbers the responses queued in `out` since the last call and keeps them for replay.
    pub(super) fn seal(&mut self, out: &mut Outputs) {
        let history = self.history;
        for (engine, r) in &mut out.engine[out.stamped..] {
            let log = self
                .responses
                .entry(*engine)
                .or_insert_with(|| ResponseLog::new(history));
            // u32 numbers 4 billion responses per engine over the journal's life.
            log.last = log.last.wrapping_add(1);
            r.set_seq(log.last);
            if log.kept.len() == history {
                log.kept.pop_front();
            }
            log.kept.push_back(*r);
        }
        out.stamped = out.engine.len();
    }

    /// After a restart (journal replayed): every engine that was logged on when the
    /// gateway stopped, or that has open orders, must log on again within `timeout_ns`,
    /// else its open orders are cancelled at the venue, as if its connection had dropped.
    pub fn arm_restart_cancel_on_disconnect(&mut self, now: u64, timeout_ns: u64) {
        let mut engines: Vec<EngineId> = self.connected.iter().copied().collect();
        engines.extend(
            self.book
                .iter()
                .filter(|(_, o)| o.status != OrderStatus::Done)
                .map(|(_, o)| o.engine),
        );
        engines.sort_unstable();
        engines.dedup();
        self.cod_deadlines = engines
            .into_iter()
            .map(|e| (e, now.saturating_add(timeout_ns)))
            .collect();
    }

    /// Engines that must log on again before their restart deadline, with the deadline.
    pub fn restart_deadlines(&self) -> &[(EngineId, u64)] {
        &self.cod_deadlines
    }

    /// An engine logged on: journaled (so a restart knows whose orders to guard), and its
    /// restart deadline, if any, is met.
    pub fn on_engine_logon(&mut self, engine: EngineId, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_LOGON]],
        );
        self.connected.insert(engine);
        self.cod_deadlines.retain(|(e, _)| *e != engine);
        self.reset_malformed(engine);
    }

    /// A new connection of `engine` starts with a clean slate (live and replay).
    pub(super) fn reset_malformed(&mut self, engine: EngineId) {
        if let Some(m) = self.malformed.get_mut(&engine) {
            m.count = 0;
        }
    }

    /// Malformed frames `engine` sent since it last logged on.
    pub fn malformed_since_logon(&self, engine: EngineId) -> u32 {
        self.malformed.get(&engine).map_or(0, |m| m.count)
    }

    /// Cancel-on-disconnect: cancels every open order of `engine`.
    pub fn on_engine_disconnect(&mut self, engine: EngineId, now: u64, out: &mut Outputs) {
        out.record(
            record::ENGINE_SESSION,
            &[&engine.to_le_bytes(), &[SESSION_DISCONNECT]],
        );
        self.connected.remove(&engine);
        self.cod_deadlines.retain(|(e, _)| *e != engine);
        self.reset_malformed(engine);
        if self.session.state() != SessionState::Active {
            // The cancels need the venue: they go out as soon as the session is up again
            // (unless the engine logs on first), not rejected as SessionDown to nobody.
            self.cod_deadlines.push((engine, 0));
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
        self.engine_message(engine, bytes, now, out);
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
        let max = self.max_malformed;
        let m = self.malformed.entry(engine).or_default();
        m.count = m.count.saturating_add(1);
        m.unlogged += 1;
        let cut_off = m.count == max;
        let quiet = self.replaying;
        if !quiet && (cut_off || now.saturating_sub(m.logged_at) >= MALFORMED_LOG_INTERVAL_NS) {
            tracing::warn!(
                engine,
                frames = m.unlogged,
                since_logon = m.count,
                max_malformed_frames = max,
                "malformed engine frames (answered Malformed)"
            );
            m.logged_at = now;
            m.unlogged = 0;
        }
        if cut_off {
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
        let cl = bytes
            .get(8..16)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes);
        let ty = bytes.first().copied().unwrap_or(0);
        out.engine
            .push((engine, Response::reject(cl, ty, RejectReason::Malformed)));
    }

    fn engine_message(&mut self, engine: EngineId, bytes: &[u8], now: u64, out: &mut Outputs) {
        if self.malformed_since_logon(engine) >= self.max_malformed {
            // Cut off (its connection is being closed): nothing is taken, and its logon
            // answer will say so (last request taken).
            self.counters.frames_after_cutoff += 1;
            return;
        }
        let seq = request_seq(bytes);
        if seq != 0
            && seq <= self.last_request_seq(engine)
            && !self.request_holes.contains(engine, seq)
        {
            // Taken before (the engine could not know: it lost our answer or its state).
            // Answered with where the order stands; never acted on, nor journaled, again.
            if let Ok((req, _)) = Request::decode(bytes) {
                self.answer_resend(engine, &req, out);
            }
            self.counters.resent_requests += 1;
            return;
        }
        let req = match Request::decode(bytes) {
            Ok((r, _)) => r,
            Err(_) => {
                self.note_request_seq(engine, bytes);
                return self.on_malformed(engine, bytes, now, out);
            }
        };
        out.record(record::ENGINE_REQUEST, &[&engine.to_le_bytes(), bytes]);
        self.note_request_seq(engine, bytes);
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
                let reason = self.responses.get(&engine).and_then(|l| {
                    l.kept.iter().rev().find_map(|r| match r {
                        Response::Reject(x)
                            if x.cl_ord_id.get() == cl && x.request == msg_type::NEW_ORDER =>
                        {
                            Some(x.reason())
                        }
                        _ => None,
                    })
                });
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

/// The request sequence number in an engine frame's header (0: unnumbered or no header).
fn request_seq(frame: &[u8]) -> u32 {
    frame
        .get(4..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}
