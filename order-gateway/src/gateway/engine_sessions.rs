//! The engine sessions: per engine, what its logon answer and its replay need and what
//! guards its orders when it goes away.
//!
//! Owns, per engine: whether it is logged on (as the journal says), its numbered responses
//! and the last `history` of them (the replay cursor an engine logs on again with), the
//! highest request number taken and the numbers never taken below it, the malformed frames
//! since its logon and the cut-off they lead to, and the cancel-on-disconnect deadlines (an
//! engine that must log on again after a restart, or whose cancels wait for the venue).
//!
//! Fed the same way live and in replay (journal records, or later a replicated log): the
//! gateway calls [`EngineSessions::handle_logon`], [`EngineSessions::handle_disconnect`],
//! [`EngineSessions::handle_request_seq`], [`EngineSessions::handle_malformed`] and
//! [`EngineSessions::seal`] from the records it applies. The deadlines are live-only state
//! (not journaled: [`EngineSessions::inherit_live_state`] carries them across a rebuild) on
//! [`Wall`] time, the time the gateway's decisions are journaled with;
//! [`EngineSessions::poll_timeout`] says when the next one is due and
//! [`EngineSessions::poll_due`] hands out those that are.
//!
//! The engine's live link (its heartbeats and silence, its response backlog, the logon
//! timeout) is [`EngineLinks`](super::EngineLinks)': live-only, on `Mono` time, owned by
//! the service with the connection. Must not touch sockets or files.

use std::collections::VecDeque;

use rocebus::clock::Wall;
use rustc_hash::{FxHashMap, FxHashSet};

use super::{holes, EngineId, Outputs};
use crate::proto::{LogonStatus, RejectReason, Response};

/// Malformed-frame log lines: at most one per engine per this many nanoseconds (the rest
/// are summed into the next line).
const MALFORMED_LOG_INTERVAL_NS: u64 = 1_000_000_000;

/// Per engine, malformed frames since its logon and the rate-limited log of them.
#[derive(Clone, Copy, Debug, Default)]
struct MalformedLog {
    /// Since the engine's last logon (journaled, so replay rebuilds it).
    count: u32,
    /// Live only: when the last line was logged, and frames not logged since.
    logged_at: u64,
    unlogged: u64,
}

/// One engine's numbered responses.
#[derive(Debug)]
struct ResponseLog {
    /// Sequence number of the newest response (0: none yet).
    last: u32,
    /// The newest responses, oldest first: seqs `last - len + 1 ..= last`.
    kept: VecDeque<Response>,
}

impl ResponseLog {
    fn new(history: usize) -> ResponseLog {
        ResponseLog {
            last: 0,
            kept: VecDeque::with_capacity(history),
        }
    }
}

/// A cancel-on-disconnect waiting: after a restart, until the engine logs on again or
/// `at` passes; or, `at` zero, for the venue session to be up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Deadline {
    engine: EngineId,
    at: u64,
}

/// Every engine's session state.
#[derive(Debug)]
pub struct EngineSessions {
    responses: FxHashMap<EngineId, ResponseLog>,
    /// Per engine, the highest request sequence number journaled.
    last_request: FxHashMap<EngineId, u32>,
    /// Numbers below `last_request` never taken (a not-taken request sent again late).
    request_holes: holes::Holes,
    /// Engines logged on, as the journal says (after a crash: those that were).
    connected: FxHashSet<EngineId>,
    /// Engines whose open orders are cancelled unless they log on again by the deadline
    /// (cancel-on-disconnect across crashes), or once the venue is up (deadline 0).
    deadlines: Vec<Deadline>,
    /// Responses kept per engine for replay.
    history: usize,
    /// Malformed frames per engine.
    malformed: FxHashMap<EngineId, MalformedLog>,
    /// Malformed frames that cut an engine off.
    max_malformed: u32,
}

/// What [`EngineSessions::handle_malformed`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MalformedVerdict {
    /// This frame reached `max_malformed_frames`: the engine is cut off.
    pub cut_off: bool,
    /// A log line is due, summing this many frames (0: stay quiet).
    pub log_frames: u64,
    /// Malformed frames since the engine's logon.
    pub since_logon: u32,
}

impl EngineSessions {
    /// Sessions for the configured `engines`, keeping `history` responses each.
    pub fn new(
        engines: impl IntoIterator<Item = EngineId>,
        history: usize,
        max_malformed: u32,
    ) -> EngineSessions {
        EngineSessions {
            responses: engines
                .into_iter()
                .map(|e| (e, ResponseLog::new(history)))
                .collect(),
            last_request: FxHashMap::default(),
            request_holes: Default::default(),
            connected: FxHashSet::default(),
            deadlines: Vec::new(),
            history,
            malformed: FxHashMap::default(),
            max_malformed,
        }
    }

    /// Keeps `n` responses per engine (before any response is produced).
    pub fn set_history(&mut self, n: usize) {
        self.history = n.max(1);
        for log in self.responses.values_mut() {
            *log = ResponseLog::new(self.history);
        }
    }

    /// Takes from `old` the live state the journal does not hold: the deadlines.
    pub fn inherit_live_state(&mut self, old: &EngineSessions) {
        self.deadlines.clone_from(&old.deadlines);
    }

    // ---- logon, disconnect, requests ----

    /// `engine` logged on: its restart deadline, if any, is met; malformed frames start
    /// again from zero.
    pub fn handle_logon(&mut self, engine: EngineId) {
        self.connected.insert(engine);
        self.deadlines.retain(|d| d.engine != engine);
        self.reset_malformed(engine);
    }

    /// `engine` went away: no deadline of its own is left (its cancels run now, or wait for
    /// the venue: [`defer_cancels`](Self::defer_cancels)).
    pub fn handle_disconnect(&mut self, engine: EngineId) {
        self.connected.remove(&engine);
        self.deadlines.retain(|d| d.engine != engine);
        self.reset_malformed(engine);
    }

    /// `engine`'s cancel-on-disconnect needs the venue: it runs as soon as the session is up
    /// again (unless the engine logs on first).
    pub fn defer_cancels(&mut self, engine: EngineId) {
        self.deadlines.push(Deadline { engine, at: 0 });
    }

    /// A journaled frame of `engine` carried request number `seq` (0: unnumbered).
    pub fn handle_request_seq(&mut self, engine: EngineId, seq: u32) {
        if seq != 0 {
            let last = self.last_request.entry(engine).or_insert(0);
            self.request_holes.taken(engine, *last, seq);
            *last = (*last).max(seq);
        }
    }

    /// Whether request `seq` of `engine` was taken before (numbered at or below the last
    /// taken, and not one of the holes): it is answered with a status, never acted on again.
    pub fn is_taken(&self, engine: EngineId, seq: u32) -> bool {
        seq != 0
            && seq <= self.last_request_seq(engine)
            && !self.request_holes.contains(engine, seq)
    }

    /// The highest request sequence number of `engine` journaled (0: none).
    pub fn last_request_seq(&self, engine: EngineId) -> u32 {
        self.last_request.get(&engine).copied().unwrap_or(0)
    }

    /// `engine`'s request numbers from `from` on, below its highest taken, never taken (at
    /// most `max`, ascending), and whether there were more.
    pub fn request_holes(&self, engine: EngineId, from: u32, max: usize) -> (Vec<u32>, bool) {
        self.request_holes.from(engine, from, max)
    }

    /// Whether `engine` is logged on, as the journal says.
    pub fn is_connected(&self, engine: EngineId) -> bool {
        self.connected.contains(&engine)
    }

    // ---- malformed frames and the cut-off ----

    fn reset_malformed(&mut self, engine: EngineId) {
        if let Some(m) = self.malformed.get_mut(&engine) {
            m.count = 0;
        }
    }

    /// Malformed frames `engine` sent since it last logged on.
    pub fn malformed_since_logon(&self, engine: EngineId) -> u32 {
        self.malformed.get(&engine).map_or(0, |m| m.count)
    }

    /// Whether `engine` is cut off (it sent `max_malformed_frames` since its logon): nothing
    /// more is taken from it until it logs on again.
    pub fn is_cut_off(&self, engine: EngineId) -> bool {
        self.malformed_since_logon(engine) >= self.max_malformed
    }

    /// The cut-off threshold, `risk.max_malformed_frames`.
    pub fn max_malformed(&self) -> u32 {
        self.max_malformed
    }

    /// A malformed frame from `engine` at `now` (`quiet`: in replay, never logged): counted,
    /// and whether it cuts the engine off and whether a log line is due (at most one per
    /// engine a second, and always at the cut-off).
    pub fn handle_malformed(
        &mut self,
        engine: EngineId,
        now: u64,
        quiet: bool,
    ) -> MalformedVerdict {
        let max = self.max_malformed;
        let m = self.malformed.entry(engine).or_default();
        m.count = m.count.saturating_add(1);
        m.unlogged += 1;
        let cut_off = m.count == max;
        let mut log_frames = 0;
        if !quiet && (cut_off || now.saturating_sub(m.logged_at) >= MALFORMED_LOG_INTERVAL_NS) {
            log_frames = m.unlogged;
            m.logged_at = now;
            m.unlogged = 0;
        }
        MalformedVerdict {
            cut_off,
            log_frames,
            since_logon: m.count,
        }
    }

    // ---- responses: numbering, history, replay ----

    /// Numbers the responses queued in `out` since the last call and keeps them for replay.
    pub fn seal(&mut self, out: &mut Outputs) {
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

    /// The sequence number of the newest response to `engine` (0: none yet).
    pub fn last_response_seq(&self, engine: EngineId) -> u32 {
        self.responses.get(&engine).map_or(0, |l| l.last)
    }

    /// The responses to `engine` after sequence number `after`, oldest first:
    /// `BadSequence` if `after` is beyond the newest, `ReplayUnavailable` if some of them
    /// are no longer kept.
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

    /// The reason `engine`'s new order `cl` was rejected with, if that response is still
    /// kept.
    pub fn kept_new_order_reject(&self, engine: EngineId, cl: u64) -> Option<RejectReason> {
        self.responses.get(&engine).and_then(|l| {
            l.kept.iter().rev().find_map(|r| match r {
                Response::Reject(x)
                    if x.cl_ord_id.get() == cl
                        && x.request == crate::proto::msg_type::NEW_ORDER =>
                {
                    Some(x.reason())
                }
                _ => None,
            })
        })
    }

    // ---- deadlines ----

    /// After a restart: each of `engines` must log on again by `now + timeout_ns`, else its
    /// open orders are cancelled at the venue, as if its connection had dropped.
    pub fn arm_restart(&mut self, engines: Vec<EngineId>, now: u64, timeout_ns: u64) {
        self.deadlines = engines
            .into_iter()
            .map(|engine| Deadline {
                engine,
                at: now.saturating_add(timeout_ns),
            })
            .collect();
    }

    /// Engines logged on as the journal says, sorted.
    pub fn connected(&self) -> impl Iterator<Item = EngineId> + '_ {
        self.connected.iter().copied()
    }

    /// Engines that must log on again before their deadline, with the deadline (0: waits
    /// for the venue only).
    pub fn deadlines(&self) -> impl ExactSizeIterator<Item = (EngineId, u64)> + '_ {
        self.deadlines.iter().map(|d| (d.engine, d.at))
    }

    /// When the next deadline is due (none: none armed). One at zero is due as soon as the
    /// venue session is up: the gateway looks at them only then.
    pub fn poll_timeout(&self) -> Option<Wall> {
        self.deadlines.iter().map(|d| Wall::from_nanos(d.at)).min()
    }

    /// Takes the next deadline due at `now`, if any (the caller runs its
    /// cancel-on-disconnect, and calls again).
    pub fn poll_due(&mut self, now: Wall) -> Option<EngineId> {
        let i = self.deadlines.iter().position(|d| now.as_nanos() >= d.at)?;
        Some(self.deadlines.swap_remove(i).engine)
    }

    // ---- checkpoints ----

    /// Per engine: the last response number and the kept responses, sorted by engine.
    pub fn checkpoint_responses(&self) -> Vec<(u32, u32, Vec<Vec<u8>>)> {
        let mut r: Vec<(u32, u32, Vec<Vec<u8>>)> = self
            .responses
            .iter()
            .map(|(&e, log)| {
                let kept = log.kept.iter().map(|r| r.as_bytes().to_vec()).collect();
                (e, log.last, kept)
            })
            .collect();
        r.sort_unstable_by_key(|r| r.0);
        r
    }

    /// Per engine, the highest request number taken, sorted.
    pub fn checkpoint_last_request(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self.last_request.iter().map(|(&e, &n)| (e, n)).collect();
        v.sort_unstable();
        v
    }

    /// Engines logged on, sorted.
    pub fn checkpoint_connected(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.connected.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// Per engine with any, the malformed frames since its logon, sorted.
    pub fn checkpoint_malformed(&self) -> Vec<(u32, u32)> {
        let mut v: Vec<(u32, u32)> = self
            .malformed
            .iter()
            .filter(|(_, m)| m.count > 0)
            .map(|(&e, m)| (e, m.count))
            .collect();
        v.sort_unstable();
        v
    }

    /// Replaces the journaled state with a checkpoint's (deadlines, live-only, stay).
    pub fn restore_checkpoint(&mut self, s: &crate::checkpoint::GatewayState) {
        let history = self.history;
        for (engine, last, kept) in &s.responses {
            // Engines get a log with their first response, configured or not (see `seal`).
            let log = self
                .responses
                .entry(*engine)
                .or_insert_with(|| ResponseLog::new(history));
            log.last = *last;
            log.kept.clear();
            let skip = kept.len().saturating_sub(history);
            for bytes in &kept[skip..] {
                if let Ok((r, _)) = Response::decode(bytes) {
                    log.kept.push_back(r);
                }
            }
        }
        self.last_request = s.last_request.iter().copied().collect();
        self.connected = s.connected.iter().copied().collect();
        self.malformed.clear();
        for &(engine, count) in &s.malformed {
            self.malformed.entry(engine).or_default().count = count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::msg_type;

    const S: u64 = 1_000_000_000;

    fn sessions() -> EngineSessions {
        EngineSessions::new([1, 2, 3], 4, 3)
    }

    #[test]
    fn poll_timeout_is_the_earliest_deadline_and_a_logon_meets_its_own() {
        let mut s = sessions();
        assert_eq!(s.poll_timeout(), None);
        s.arm_restart(vec![1, 2], 10 * S, 5 * S);
        assert_eq!(s.poll_timeout(), Some(Wall::from_nanos(15 * S)));
        s.handle_logon(1);
        assert_eq!(s.deadlines().len(), 1);
        // A disconnect while the venue is down: its cancels wait for the venue, due first.
        s.defer_cancels(3);
        assert_eq!(s.poll_timeout(), Some(Wall::ZERO));
        assert_eq!(s.poll_due(Wall::from_nanos(11 * S)), Some(3));
        assert_eq!(s.poll_due(Wall::from_nanos(11 * S)), None);
        assert_eq!(s.poll_due(Wall::from_nanos(15 * S)), Some(2));
        assert_eq!(s.poll_timeout(), None);
    }

    /// The restart deadlines are not in the journal: a rebuild from it (after a failed
    /// append) must carry them over, or the engines' orders stay open at the venue for good.
    #[test]
    fn a_rebuild_keeps_the_deadlines() {
        let mut old = sessions();
        old.arm_restart(vec![2], 0, 5 * S);
        let mut rebuilt = sessions();
        assert_eq!(rebuilt.poll_timeout(), None);
        rebuilt.inherit_live_state(&old);
        assert_eq!(rebuilt.poll_timeout(), Some(Wall::from_nanos(5 * S)));
        assert_eq!(rebuilt.poll_due(Wall::from_nanos(5 * S)), Some(2));
    }

    #[test]
    fn malformed_frames_cut_an_engine_off_until_it_logs_on_again() {
        let mut s = sessions();
        let v = s.handle_malformed(1, S, false);
        assert_eq!((v.cut_off, v.log_frames, v.since_logon), (false, 1, 1));
        // Within the second: counted, not logged.
        assert_eq!(s.handle_malformed(1, S + 1, false).log_frames, 0);
        let v = s.handle_malformed(1, S + 2, false);
        assert!(v.cut_off && v.log_frames == 2, "{v:?}");
        assert!(s.is_cut_off(1) && !s.is_cut_off(2));
        s.handle_logon(1);
        assert!(!s.is_cut_off(1));
        // Replay counts the same, quietly.
        assert_eq!(s.handle_malformed(2, S, true).log_frames, 0);
        assert_eq!(s.malformed_since_logon(2), 1);
    }

    #[test]
    fn request_numbers_taken_and_the_holes_below_them() {
        let mut s = sessions();
        s.handle_request_seq(1, 1);
        s.handle_request_seq(1, 4);
        assert_eq!(s.last_request_seq(1), 4);
        assert!(s.is_taken(1, 1) && s.is_taken(1, 4));
        assert!(!s.is_taken(1, 2) && !s.is_taken(1, 5) && !s.is_taken(1, 0));
        assert_eq!(s.request_holes(1, 1, 10), (vec![2, 3], false));
    }

    #[test]
    fn responses_are_numbered_kept_and_replayed_from_a_cursor() {
        let mut s = sessions();
        let mut out = Outputs::default();
        for cl in 1..=6 {
            out.engine.push((
                1,
                Response::reject(cl, msg_type::NEW_ORDER, RejectReason::Halted),
            ));
        }
        s.seal(&mut out);
        assert_eq!(s.last_response_seq(1), 6);
        let after_3: Vec<u64> = s
            .responses_after(1, 3)
            .map(|i| i.map(|r| r.cl_ord_id()).collect())
            .unwrap();
        assert_eq!(after_3, vec![4, 5, 6]);
        // History 4: the first two are gone.
        assert_eq!(
            s.responses_after(1, 1).err(),
            Some(LogonStatus::ReplayUnavailable)
        );
        assert_eq!(
            s.responses_after(1, 7).err(),
            Some(LogonStatus::BadSequence)
        );
        assert_eq!(s.kept_new_order_reject(1, 5), Some(RejectReason::Halted));
        assert_eq!(s.kept_new_order_reject(1, 1), None);
    }
}
