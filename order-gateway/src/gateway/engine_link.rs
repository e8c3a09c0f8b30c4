//! The engines' live links: per connection, what keeps it or ends it while it is up.
//!
//! Owns: connections accepted and waiting for their logon (at most `max_pending`, each
//! with `logon_timeout` to send it), refused ones lingering for their answer to be read,
//! and per logged-on engine its heartbeats and silence ([`Liveness`]) and its response
//! backlog (responses its ring could not take yet, at most `max_backlog`). It decides when
//! a heartbeat goes out, when a connection is closed and when an engine is disconnected
//! (its cancel-on-disconnect then runs), and says why; it sends and closes nothing itself.
//!
//! Flow control: it also decides how many requests the shell may take from an engine's
//! ring ([`EngineLinks::request_budget`]): none while its backlog is at the request mark
//! (half the cap), and never more than would bring it there. Requests not taken stay in the
//! engine's ring, and the reliable connection holds the engine back once the ring is full:
//! an engine that sends faster than it reads slows down instead of being answered into a
//! backlog that would disconnect it (and lose it more than the history keeps: simulator
//! seed 11184). The cap stays the hard limit for what comes unasked (fills, venue cancels,
//! answers to orders in flight) and for memory. A held engine is not heard (its heartbeats
//! wait behind its requests), so while held a response its ring takes counts as its sign
//! of life: one that reads nothing is still disconnected at the silence limit.
//!
//! Why not in [`EngineSessions`](super::EngineSessions): the sessions are journal state on
//! [`Wall`](rocebus::clock::Wall) time, rebuilt by replay (after a restart, after a failed
//! append, on a standby) and identical wherever the journal is read. A link is none of that:
//! it exists only while a connection does, is never journaled, and runs on [`Mono`] time only
//! (a wall-clock step must not expire an engine nor postpone its heartbeat). Keeping it apart
//! keeps live-only state out of replay, and `Mono` out of the journal's machines.
//!
//! The contract is the one of [`super`]: events in (`handle_*`: a connection accepted, a
//! logon accepted or refused, a frame heard, an offer's outcome, a connection lost), outputs
//! out ([`EngineLinks::poll_output`], and [`EngineLinks::poll_response`] for the responses to
//! offer), [`EngineLinks::poll_timeout`] and [`EngineLinks::handle_timeout`]; time only as
//! the turn's [`Mono`], passed in. The I/O shell (the service) owns the connections, reads
//! the clock once per turn and carries out the outputs. Must not touch sockets or files.

use std::collections::VecDeque;
use std::time::Duration;

use rocebus::clock::Mono;

use super::EngineId;
use crate::liveness::Liveness;
use crate::proto::Response;

/// A connection that has not become an engine yet (waiting for its logon, or refused and
/// lingering), as [`EngineLinks::handle_accepted`] named it for the shell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(u64);

/// The live link's limits (`[service]` in the configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkConfig {
    /// Time a connection has to send its logon.
    pub logon_timeout: Duration,
    /// Silence (no frame, no heartbeat) after which a logged-on engine is disconnected
    /// (zero: never).
    pub engine_timeout: Duration,
    /// Heartbeat interval to engines (zero: none).
    pub heartbeat: Duration,
    /// Connections waiting for their logon or lingering after a refusal, at most.
    pub max_pending: usize,
    /// Responses that may wait for one engine whose ring is full; one more live response
    /// disconnects it. A logon's replay is queued whatever its length (it is the gateway's
    /// history already, bounded by it: an engine must be able to log on however far behind
    /// the history lets it be), and counts: a live response behind a replay of `max_backlog`
    /// or more waiting disconnects the engine. Half of it (rounded up) is the request mark:
    /// no request is taken from an engine with that many waiting
    /// ([`EngineLinks::request_budget`]).
    pub max_backlog: usize,
    /// How long a refused connection is kept for its answer to be read.
    pub refusal_linger: Duration,
}

/// Why an engine is disconnected; every one runs its cancel-on-disconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DisconnectReason {
    /// Silent (no frame, no heartbeat; while its requests were held, no response read
    /// either) for this long, past `engine_timeout`.
    Silent(Duration),
    /// It is not reading its responses: its backlog held `max_backlog` and one more came.
    BacklogFull,
    /// The gateway cut it off (too many malformed frames).
    CutOff,
    /// The connection was lost (an offer, flush or poll failed).
    Lost,
}

/// Why a connection that never became an engine is closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// No logon within `logon_timeout`.
    LogonTimeout,
    /// Its logon was refused; the answer was read or the linger ran out.
    Refused,
}

/// What the shell must do, taken with [`EngineLinks::poll_output`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkOutput {
    /// Send a heartbeat to this engine (stamped with the turn's wall time). It counts as
    /// sent whatever the ring says: a ring too full to take it has responses to read.
    Heartbeat(EngineId),
    /// Close this engine's connection and run its cancel-on-disconnect. The link is gone
    /// already: responses for it are dropped (counted), and it may log on again.
    Disconnect(EngineId, DisconnectReason),
    /// Close this connection; it was never an engine.
    Close(ConnId, CloseReason),
}

/// What [`EngineLinks::handle_accepted`] decided about a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// It waits for its logon under this name.
    Pending(ConnId),
    /// `max_pending` connections wait already: close it at once. `rejected` so far; `log`:
    /// this one is worth a log line (the 1st, 2nd, 4th, 8th... rejection).
    OverCap {
        /// Connections rejected so far, this one included.
        rejected: u64,
        /// Log this one.
        log: bool,
    },
}

/// The outcome of the shell's offer of a response from [`EngineLinks::poll_response`]
/// (a lost connection is [`EngineLinks::handle_lost`] instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// The ring took it.
    Accepted,
    /// The ring is full: it waits, first in the backlog, for the next turn.
    BackPressured,
}

/// What the live links decided, for the counters file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Responses the engines' rings took.
    pub responses_sent: u64,
    /// Times an engine's ring refused a response and a backlog started.
    pub back_pressured: u64,
    /// Responses for an engine with no link (gone): dropped, its logon replays them.
    pub dropped: u64,
    /// Engines disconnected for their silence.
    pub silent: u64,
    /// Engines disconnected with their backlog full.
    pub backlog_full: u64,
    /// Times an engine's backlog reached the request mark (flow control): its requests
    /// waited in its ring until it read.
    pub held: u64,
    /// Connections closed for sending no logon in time.
    pub logon_timeouts: u64,
    /// Connections closed at once: `max_pending` were waiting.
    pub over_cap: u64,
}

#[derive(Debug)]
struct Waiting {
    conn: ConnId,
    /// Pending: accepted at; refused: closed at.
    at: Mono,
}

#[derive(Debug)]
struct Link {
    engine: EngineId,
    live: Liveness,
    backlog: VecDeque<Response>,
    /// The last offer was back-pressured (a backlog is under way).
    pressed: bool,
    /// The backlog is at the request mark: no request is taken (flow control).
    held: bool,
}

impl Link {
    /// The backlog grew to `len`: held from `mark` on (counted once per hold).
    fn grew(&mut self, mark: usize, counters: &mut LinkCounters) {
        if !self.held && self.backlog.len() >= mark {
            self.held = true;
            counters.held += 1;
        }
    }
}

/// Every connection's live link; see the module documentation.
#[derive(Debug)]
pub struct EngineLinks {
    cfg: LinkConfig,
    next_conn: u64,
    pending: Vec<Waiting>,
    closing: Vec<Waiting>,
    links: Vec<Link>,
    /// Responses waiting in all backlogs (0: nothing to drain, the common case).
    queued: usize,
    out: VecDeque<LinkOutput>,
    counters: LinkCounters,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl EngineLinks {
    /// No connection yet.
    pub fn new(cfg: LinkConfig) -> EngineLinks {
        EngineLinks {
            cfg,
            next_conn: 0,
            pending: Vec::new(),
            closing: Vec::new(),
            links: Vec::new(),
            queued: 0,
            out: VecDeque::new(),
            counters: LinkCounters::default(),
        }
    }

    /// The limits.
    pub fn config(&self) -> &LinkConfig {
        &self.cfg
    }

    /// What was decided so far.
    pub fn counters(&self) -> LinkCounters {
        self.counters
    }

    /// Whether `engine` is logged on over a live link.
    pub fn is_linked(&self, engine: EngineId) -> bool {
        self.links.iter().any(|l| l.engine == engine)
    }

    /// Engines logged on.
    pub fn linked(&self) -> usize {
        self.links.len()
    }

    /// Connections waiting for their logon.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    fn link(&mut self, engine: EngineId) -> Option<&mut Link> {
        self.links.iter_mut().find(|l| l.engine == engine)
    }

    fn disconnect(&mut self, engine: EngineId, reason: DisconnectReason) {
        if let Some(i) = self.links.iter().position(|l| l.engine == engine) {
            let l = self.links.swap_remove(i);
            self.queued -= l.backlog.len();
            self.out.push_back(LinkOutput::Disconnect(engine, reason));
        }
    }

    // ---- connections and logons ----

    /// A connection completed its handshake at `now`: it waits for its logon, or is
    /// rejected at once when `max_pending` connections wait already (pending or lingering).
    pub fn handle_accepted(&mut self, now: Mono) -> Admission {
        if self.pending.len() + self.closing.len() >= self.cfg.max_pending {
            self.counters.over_cap += 1;
            let rejected = self.counters.over_cap;
            return Admission::OverCap {
                rejected,
                log: rejected.is_power_of_two(),
            };
        }
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        self.pending.push(Waiting { conn, at: now });
        Admission::Pending(conn)
    }

    /// `conn` logged on as `engine` at `now` (the shell checked the logon, and that
    /// `engine` is not [linked](Self::is_linked)): its link starts, as if a frame had just
    /// been heard and a heartbeat sent. False if `conn` was not waiting (closed already) or
    /// `engine` is linked: nothing changed, the shell refuses it.
    pub fn handle_logon(&mut self, conn: ConnId, engine: EngineId, now: Mono) -> bool {
        let Some(i) = self.pending.iter().position(|w| w.conn == conn) else {
            return false;
        };
        if self.is_linked(engine) {
            return false;
        }
        self.pending.swap_remove(i);
        self.links.push(Link {
            engine,
            live: Liveness::new(
                now.as_nanos(),
                nanos(self.cfg.heartbeat),
                nanos(self.cfg.engine_timeout),
            ),
            // Room for a burst up front: the response path does not allocate in steady
            // state (a longer backlog grows it once).
            backlog: VecDeque::with_capacity(self.cfg.max_backlog.min(64)),
            pressed: false,
            held: false,
        });
        true
    }

    /// `conn`'s logon was refused at `now` and answered: it lingers until the answer is
    /// read ([`handle_answer_read`](Self::handle_answer_read)) or `refusal_linger` passes,
    /// still counting against `max_pending`.
    pub fn handle_refused(&mut self, conn: ConnId, now: Mono) {
        if let Some(i) = self.pending.iter().position(|w| w.conn == conn) {
            self.pending.swap_remove(i);
            self.closing.push(Waiting { conn, at: now });
        }
    }

    /// The refused `conn`'s answer was read (or its peer went): close it now.
    pub fn handle_answer_read(&mut self, conn: ConnId) {
        if let Some(i) = self.closing.iter().position(|w| w.conn == conn) {
            self.closing.swap_remove(i);
            self.out
                .push_back(LinkOutput::Close(conn, CloseReason::Refused));
        }
    }

    /// `conn`, waiting for its logon, is gone (its peer closed it): forgotten.
    pub fn handle_conn_gone(&mut self, conn: ConnId) {
        self.pending.retain(|w| w.conn != conn);
        self.closing.retain(|w| w.conn != conn);
    }

    // ---- a logged-on engine ----

    /// A frame (any frame, a heartbeat too) came from `engine` at `now`: a sign of life.
    pub fn handle_frame(&mut self, engine: EngineId, now: Mono) {
        if let Some(l) = self.link(engine) {
            l.live.on_heard(now.as_nanos());
        }
    }

    /// `engine`'s connection is lost (an offer, a flush or a poll failed).
    pub fn handle_lost(&mut self, engine: EngineId) {
        self.disconnect(engine, DisconnectReason::Lost);
    }

    /// The gateway cut `engine` off (malformed frames): it is disconnected.
    pub fn handle_cut_off(&mut self, engine: EngineId) {
        self.disconnect(engine, DisconnectReason::CutOff);
    }

    /// A response for `engine`, in order after what waits for it: the shell offers it
    /// when [`poll_response`](Self::poll_response) hands it out. An engine with no link
    /// is gone: dropped (counted; its next logon replays it from the gateway's history).
    /// A backlog already holding `max_backlog` responses (its logon's replay included)
    /// disconnects the engine: it is not reading.
    pub fn queue_response(&mut self, engine: EngineId, r: &Response) {
        let (cap, mark) = (self.cfg.max_backlog, self.request_mark());
        let Some(l) = self.links.iter_mut().find(|l| l.engine == engine) else {
            self.counters.dropped += 1;
            return;
        };
        if l.backlog.len() >= cap {
            self.counters.backlog_full += 1;
            self.disconnect(engine, DisconnectReason::BacklogFull);
            return;
        }
        l.backlog.push_back(*r);
        l.grew(mark, &mut self.counters);
        self.queued += 1;
    }

    /// A response of `engine`'s logon replay, queued right after its logon and before any
    /// live one ([`crate::engine_io::logon`]), whatever the backlog holds: the replay is at
    /// most the gateway's response history, which holds it already. A live response that
    /// finds `max_backlog` or more waiting, replay included, still disconnects the engine,
    /// so an engine's lag at a backlog-full disconnect is at most the larger of its lag at
    /// logon and the cap, plus its ring: with the cap at most half the history (the
    /// configuration's rule), what it missed is still kept for its next replay.
    ///
    /// Found by the simulator: through `queue_response`, a replay longer than the cap
    /// disconnected the engine at each logon, so the configuration required the cap to be
    /// at least the history; and then an engine disconnected for its full backlog had missed
    /// more than the history keeps, and could never be replayed what it missed.
    pub fn queue_replay(&mut self, engine: EngineId, r: &Response) {
        let mark = self.request_mark();
        let Some(l) = self.links.iter_mut().find(|l| l.engine == engine) else {
            self.counters.dropped += 1;
            return;
        };
        l.backlog.push_back(*r);
        l.grew(mark, &mut self.counters);
        self.queued += 1;
    }

    /// The request mark: half the cap, rounded up (at least 1: a cap of 1 still takes one
    /// request at a time).
    pub fn request_mark(&self) -> usize {
        self.cfg.max_backlog.div_ceil(2).max(1)
    }

    /// How many frames the shell may take from `engine`'s ring now (flow control): the
    /// request mark less the responses waiting for it; zero for an engine with no link.
    /// Frames beyond it stay in the ring (the reliable connection holds the engine back
    /// once the ring is full) until the engine has read enough of what it was sent.
    ///
    /// Why: every request is answered, and a request taken while the backlog is at the cap
    /// is an answer into a backlog that disconnects its engine; a burst of them answered to
    /// an engine gone makes it miss more than the history keeps (simulator seed 11184: a
    /// logon 137 responses behind, 300 cancels before reading, 527 missed against 512
    /// kept). With the budget, what an engine's own requests add to its backlog stops at
    /// the mark; the other half of the cap is left for what comes unasked. Counts every
    /// frame (a heartbeat too): it is a bound, not an exact count of answers.
    pub fn request_budget(&self, engine: EngineId) -> usize {
        let mark = self.request_mark();
        self.links
            .iter()
            .find(|l| l.engine == engine)
            .map_or(0, |l| mark.saturating_sub(l.backlog.len()))
    }

    /// Whether any response waits to be offered.
    pub fn has_queued(&self) -> bool {
        self.queued > 0
    }

    /// The next response to offer to `engine`, oldest first; the shell offers it and says
    /// how it went ([`handle_offered`](Self::handle_offered)) before asking again.
    pub fn poll_response(&self, engine: EngineId) -> Option<Response> {
        self.links
            .iter()
            .find(|l| l.engine == engine)
            .and_then(|l| l.backlog.front().copied())
    }

    /// How the offer at `now` of [`poll_response`](Self::poll_response)'s response went.
    /// While `engine`'s requests are held (its backlog at the request mark), a response its
    /// ring takes is its sign of life: its frames wait unread behind its requests, so what
    /// it reads is all the gateway can see of it.
    pub fn handle_offered(&mut self, engine: EngineId, how: Offered, now: Mono) {
        let mark = self.request_mark();
        let Some(l) = self.links.iter_mut().find(|l| l.engine == engine) else {
            return;
        };
        match how {
            Offered::Accepted => {
                if l.backlog.pop_front().is_some() {
                    self.queued -= 1;
                    self.counters.responses_sent += 1;
                }
                if l.held {
                    l.live.on_heard(now.as_nanos());
                    l.held = l.backlog.len() >= mark;
                }
                if l.backlog.is_empty() {
                    l.pressed = false;
                }
            }
            Offered::BackPressured => {
                if !l.pressed {
                    l.pressed = true;
                    self.counters.back_pressured += 1;
                }
            }
        }
    }

    // ---- time ----

    /// When [`handle_timeout`](Self::handle_timeout) is next needed (none: nothing is
    /// armed): the earliest of the logon deadlines, the refusal lingers, the engines'
    /// silence limits and their next heartbeats.
    pub fn poll_timeout(&self) -> Option<Mono> {
        let logon = self.pending.iter().map(|w| w.at + self.cfg.logon_timeout);
        let linger = self.closing.iter().map(|w| w.at + self.cfg.refusal_linger);
        let live = self.links.iter().flat_map(|l| {
            [l.live.expires_at(), l.live.next_transmit()]
                .into_iter()
                .flatten()
                .map(Mono::from_nanos)
        });
        logon.chain(linger).chain(live).min()
    }

    /// The timers due at `now`: engines silent past `engine_timeout` are disconnected,
    /// heartbeats due go out, connections with no logon in `logon_timeout` and refused ones
    /// past their linger are closed. A `now` earlier than a time already seen changes
    /// nothing: it is neither silence nor a reason to send.
    pub fn handle_timeout(&mut self, now: Mono) {
        let t = now.as_nanos();
        let mut i = 0;
        while i < self.links.len() {
            let l = &mut self.links[i];
            if l.live.is_expired(t) {
                let (engine, silent) = (l.engine, Duration::from_nanos(l.live.silent_for(t)));
                self.counters.silent += 1;
                self.disconnect(engine, DisconnectReason::Silent(silent));
                continue;
            }
            if l.live.poll_transmit(t) {
                l.live.on_sent(t);
                self.out.push_back(LinkOutput::Heartbeat(l.engine));
            }
            i += 1;
        }
        let (logon_timeout, linger) = (self.cfg.logon_timeout, self.cfg.refusal_linger);
        let out = &mut self.out;
        let counters = &mut self.counters;
        self.pending.retain(|w| {
            // Past the deadline, not at it: a logon read this turn still counts.
            let expired = now.saturating_since(w.at) > logon_timeout;
            if expired {
                counters.logon_timeouts += 1;
                out.push_back(LinkOutput::Close(w.conn, CloseReason::LogonTimeout));
            }
            !expired
        });
        self.closing.retain(|w| {
            let over = now >= w.at + linger;
            if over {
                out.push_back(LinkOutput::Close(w.conn, CloseReason::Refused));
            }
            !over
        });
    }

    /// The next thing the shell must do, in the order decided.
    pub fn poll_output(&mut self) -> Option<LinkOutput> {
        self.out.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{msg_type, RejectReason};

    const MS: Duration = Duration::from_millis(1);
    const T0: Mono = Mono::from_nanos(1_000_000_000_000);

    fn cfg() -> LinkConfig {
        LinkConfig {
            logon_timeout: 2000 * MS,
            engine_timeout: 3000 * MS,
            heartbeat: 100 * MS,
            max_pending: 2,
            max_backlog: 3,
            refusal_linger: 100 * MS,
        }
    }

    fn at(ms: u64) -> Mono {
        T0 + Duration::from_millis(ms)
    }

    fn outputs(l: &mut EngineLinks) -> Vec<LinkOutput> {
        std::iter::from_fn(|| l.poll_output()).collect()
    }

    /// A links machine with `engine` logged on at T0.
    fn linked(engine: EngineId) -> EngineLinks {
        let mut l = EngineLinks::new(cfg());
        let Admission::Pending(c) = l.handle_accepted(T0) else {
            panic!("room for one");
        };
        assert!(l.handle_logon(c, engine, T0));
        l
    }

    fn response(cl: u64) -> Response {
        Response::reject(cl, msg_type::NEW_ORDER, RejectReason::Halted)
    }

    /// A frozen engine (frames stop, nothing else happens) is disconnected once silent for
    /// `engine_timeout`, not before, with the reason and how long; its link is gone, so
    /// responses for it are dropped and it may log on again.
    #[test]
    fn a_frozen_engine_is_disconnected_after_the_silence_limit() {
        let mut l = linked(7);
        l.handle_frame(7, at(500));
        l.handle_timeout(at(3499));
        assert!(outputs(&mut l)
            .iter()
            .all(|o| matches!(o, LinkOutput::Heartbeat(7))));
        assert!(l.is_linked(7));
        l.handle_timeout(at(3500));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Disconnect(
                7,
                DisconnectReason::Silent(3000 * MS)
            )]
        );
        assert!(!l.is_linked(7));
        assert_eq!(l.counters().silent, 1);
        l.queue_response(7, &response(1));
        assert_eq!(l.counters().dropped, 1);
        // Disconnected once, not again every turn.
        l.handle_timeout(at(9000));
        assert_eq!(outputs(&mut l), []);
    }

    /// The disconnect of a frozen engine is its cancel-on-disconnect: carried out against
    /// the gateway while the venue is down, the engine's cancels wait for the venue (its
    /// deadline is set, due as soon as the session is up).
    #[test]
    fn a_frozen_engine_s_disconnect_sets_its_cancel_on_disconnect_deadline() {
        use crate::gateway::tests::{risk, session, T0 as WALL};
        use crate::gateway::{Gateway, Outputs};
        use rocebus::clock::Wall;
        let mut gw = Gateway::new(session(), &risk()).unwrap();
        let mut out = Outputs::default();
        gw.on_engine_logon(1, &mut out);
        let mut l = linked(1);
        for ms in [1000, 2000, 2999] {
            l.handle_timeout(at(ms));
        }
        l.handle_timeout(at(3000));
        for o in outputs(&mut l) {
            if let LinkOutput::Disconnect(engine, _) = o {
                gw.on_engine_disconnect(engine, WALL, &mut out);
            }
        }
        assert_eq!(gw.restart_deadlines(), [(1, 0)]);
        assert_eq!(gw.engine_sessions().poll_timeout(), Some(Wall::ZERO));
    }

    /// Heartbeats go out every interval after the last one, never earlier, whatever other
    /// events come in between (frames heard do not delay them: the engine's gateway
    /// timeout counts only what the gateway sends).
    #[test]
    fn heartbeats_are_due_at_the_interval_and_not_earlier() {
        let mut l = linked(7);
        let beats = |l: &mut EngineLinks| {
            outputs(l)
                .iter()
                .filter(|o| **o == LinkOutput::Heartbeat(7))
                .count()
        };
        l.handle_timeout(at(99));
        assert_eq!(beats(&mut l), 0);
        assert_eq!(l.poll_timeout(), Some(at(100)));
        l.handle_timeout(at(100));
        assert_eq!(beats(&mut l), 1);
        // Polled again at once, or a turn later: not again.
        l.handle_timeout(at(100));
        l.handle_frame(7, at(150));
        l.handle_timeout(at(199));
        assert_eq!(beats(&mut l), 0);
        // A late turn sends one, and the next is an interval after it.
        l.handle_timeout(at(260));
        assert_eq!(beats(&mut l), 1);
        l.handle_timeout(at(359));
        assert_eq!(beats(&mut l), 0);
        l.handle_timeout(at(360));
        assert_eq!(beats(&mut l), 1);
    }

    /// A connection that completes its handshake and never logs on is closed once
    /// `logon_timeout` has passed, counted; one that logs on in time is not.
    #[test]
    fn a_pending_connection_that_never_logs_on_is_dropped_at_logon_timeout() {
        let mut l = EngineLinks::new(cfg());
        let Admission::Pending(silent) = l.handle_accepted(T0) else {
            panic!()
        };
        let Admission::Pending(good) = l.handle_accepted(at(1000)) else {
            panic!()
        };
        assert_eq!(l.poll_timeout(), Some(at(2000)));
        l.handle_timeout(at(2000));
        assert_eq!(outputs(&mut l), []);
        l.handle_timeout(at(2001));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Close(silent, CloseReason::LogonTimeout)]
        );
        assert_eq!(l.counters().logon_timeouts, 1);
        assert!(l.handle_logon(good, 3, at(2500)));
        // A connection closed for its timeout cannot log on afterwards.
        assert!(!l.handle_logon(silent, 4, at(2500)));
        assert_eq!((l.pending(), l.linked()), (0, 1));
    }

    /// Connections waiting (for their logon, or lingering after a refusal) are capped; one
    /// more is rejected at once, and room comes back as they leave.
    #[test]
    fn waiting_connections_are_capped() {
        let mut l = EngineLinks::new(cfg());
        let Admission::Pending(a) = l.handle_accepted(T0) else {
            panic!()
        };
        let Admission::Pending(_) = l.handle_accepted(T0) else {
            panic!()
        };
        assert_eq!(
            l.handle_accepted(T0),
            Admission::OverCap {
                rejected: 1,
                log: true
            }
        );
        l.handle_refused(a, at(10));
        assert!(matches!(l.handle_accepted(T0), Admission::OverCap { .. }));
        assert_eq!(l.poll_timeout(), Some(at(110)));
        l.handle_answer_read(a);
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Close(a, CloseReason::Refused)]
        );
        assert!(matches!(l.handle_accepted(T0), Admission::Pending(_)));
        assert_eq!(l.counters().over_cap, 2);
    }

    /// Responses an engine's ring refuses wait in order; at `max_backlog` waiting one more
    /// disconnects the engine (counted once), and nothing more is offered to it.
    #[test]
    fn a_backlog_at_its_cap_disconnects_the_engine() {
        let mut l = linked(7);
        l.queue_response(7, &response(1));
        assert_eq!(l.poll_response(7).map(|r| r.cl_ord_id()), Some(1));
        l.handle_offered(7, Offered::BackPressured, T0);
        l.handle_offered(7, Offered::BackPressured, T0);
        for cl in 2..=3 {
            l.queue_response(7, &response(cl));
        }
        assert_eq!(l.counters().back_pressured, 1);
        // The ring took one: the rest follow in order.
        l.handle_offered(7, Offered::Accepted, T0);
        assert_eq!(l.poll_response(7).map(|r| r.cl_ord_id()), Some(2));
        l.queue_response(7, &response(4));
        assert_eq!(outputs(&mut l), []);
        // Three wait: one more is past the cap.
        l.queue_response(7, &response(5));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Disconnect(7, DisconnectReason::BacklogFull)]
        );
        assert_eq!(l.counters().backlog_full, 1);
        assert!(l.poll_response(7).is_none());
        assert!(!l.has_queued());
        l.queue_response(7, &response(6));
        assert_eq!(l.counters().backlog_full, 1);
        assert_eq!(l.counters().responses_sent, 1);
    }

    /// A logon's replay longer than `max_backlog` is queued whole: the engine is not
    /// disconnected for it (fails through `queue_response`: the 4th replayed response
    /// disconnects the engine, at every logon). A live response while the replay still
    /// holds the cap disconnects it; once the engine has read below the cap, live responses
    /// queue again up to it.
    #[test]
    fn a_logon_replay_longer_than_the_backlog_cap_is_not_a_full_backlog() {
        let mut l = linked(7);
        for cl in 1..=10 {
            l.queue_replay(7, &response(cl));
        }
        assert_eq!(outputs(&mut l), []);
        assert!(l.is_linked(7));
        // The engine reads all but two: one live response fits, the next is past the cap.
        for _ in 0..8 {
            l.handle_offered(7, Offered::Accepted, T0);
        }
        assert_eq!(l.poll_response(7).map(|r| r.cl_ord_id()), Some(9));
        l.queue_response(7, &response(11));
        assert_eq!(outputs(&mut l), []);
        l.queue_response(7, &response(12));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Disconnect(7, DisconnectReason::BacklogFull)]
        );
        // A live response behind a replay still at the cap disconnects at once.
        let mut l = linked(7);
        for cl in 1..=10 {
            l.queue_replay(7, &response(cl));
        }
        l.queue_response(7, &response(11));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Disconnect(7, DisconnectReason::BacklogFull)]
        );
    }

    /// Flow control: requests are taken from an engine only while fewer responses than the
    /// request mark (half the cap, rounded up: 2 of 3) wait for it, and no more than would
    /// bring it there; a logon's replay longer than that holds its requests until it has
    /// read down below the mark; an engine with no link gets none. Each hold is counted
    /// once. Fails without the budget (every request taken, whatever waits: seed 11184).
    #[test]
    fn requests_are_held_while_the_backlog_is_at_half_the_cap() {
        let mut l = linked(7);
        assert_eq!(l.request_mark(), 2);
        assert_eq!(l.request_budget(7), 2);
        assert_eq!(l.request_budget(8), 0, "no link, no request");
        // The ring is full: answers wait, and the budget shrinks with them.
        l.queue_response(7, &response(1));
        l.handle_offered(7, Offered::BackPressured, T0);
        assert_eq!(l.request_budget(7), 1);
        l.queue_response(7, &response(2));
        assert_eq!(l.request_budget(7), 0);
        assert_eq!(l.counters().held, 1);
        // Still under the cap: nothing is disconnected, the engine is only held.
        assert_eq!(outputs(&mut l), []);
        // It reads one: one more request may come.
        l.handle_offered(7, Offered::Accepted, at(10));
        assert_eq!(l.request_budget(7), 1);
        l.handle_offered(7, Offered::Accepted, at(20));
        assert_eq!(l.request_budget(7), 2);
        // A replay of 10 (above the cap) holds it until 1 waits.
        let mut l = linked(7);
        for cl in 1..=10 {
            l.queue_replay(7, &response(cl));
        }
        for read in 1..=9 {
            assert_eq!(l.request_budget(7), 0, "{read}");
            l.handle_offered(7, Offered::Accepted, at(read));
        }
        assert_eq!(l.request_budget(7), 1);
        assert_eq!(l.counters().held, 1);
        // A cap of 1 still takes one request at a time.
        let mut l = EngineLinks::new(LinkConfig {
            max_backlog: 1,
            ..cfg()
        });
        let Admission::Pending(c) = l.handle_accepted(T0) else {
            panic!()
        };
        assert!(l.handle_logon(c, 7, T0));
        assert_eq!(l.request_budget(7), 1);
        l.queue_response(7, &response(1));
        assert_eq!(l.request_budget(7), 0);
    }

    /// A held engine is not heard (its heartbeats wait behind its requests in its ring), so
    /// a response its ring takes is its sign of life: one reading slowly through a long
    /// replay stays linked past the silence limit (fails without it: disconnected silent at
    /// 3 s while it reads); once it reads nothing it is disconnected a silence limit after
    /// its last read, and its backlog goes with it. Not held, reads are not life: an engine
    /// that reads and sends nothing is silent as before.
    #[test]
    fn a_held_engine_lives_while_it_reads_and_is_disconnected_once_it_reads_nothing() {
        let mut l = linked(7);
        for cl in 1..=10 {
            l.queue_replay(7, &response(cl));
        }
        // One response read a second, past the 3 s silence limit: held and alive.
        for s in 1..=6 {
            l.handle_offered(7, Offered::Accepted, at(s * 1000));
            l.handle_timeout(at(s * 1000 + 500));
        }
        assert!(l.is_linked(7));
        assert_eq!(l.request_budget(7), 0);
        // Frozen: its ring takes nothing more.
        l.handle_offered(7, Offered::BackPressured, at(6500));
        l.handle_timeout(at(8999));
        assert!(l.is_linked(7));
        l.handle_timeout(at(9000));
        assert!(outputs(&mut l).contains(&LinkOutput::Disconnect(
            7,
            DisconnectReason::Silent(3000 * MS)
        )));
        assert!(!l.has_queued(), "its backlog went with it");
        // Not held: reads alone keep nothing alive.
        let mut l = linked(7);
        for s in 1..=3 {
            l.queue_response(7, &response(s));
            l.handle_offered(7, Offered::Accepted, at(s * 1000));
        }
        l.handle_timeout(at(3000));
        assert!(outputs(&mut l).contains(&LinkOutput::Disconnect(
            7,
            DisconnectReason::Silent(3000 * MS)
        )));
    }

    /// The machine runs on `Mono` only: a turn whose time is earlier than one already seen
    /// (what a wall clock stepping back would be, were it passed in) neither expires the
    /// engine, nor sends a heartbeat, nor moves a deadline.
    #[test]
    fn time_that_steps_back_changes_nothing() {
        let mut l = linked(7);
        l.handle_frame(7, at(2000));
        l.handle_timeout(at(2000));
        outputs(&mut l);
        let before = l.poll_timeout();
        // A stale frame time is no sign of life from the past ...
        l.handle_frame(7, at(10));
        // ... and a stale turn is no silence and no reason to send.
        l.handle_timeout(at(10));
        l.handle_timeout(Mono::ZERO);
        assert_eq!(outputs(&mut l), []);
        assert_eq!(l.poll_timeout(), before);
        assert!(l.is_linked(7));
        l.handle_timeout(at(5000));
        assert!(outputs(&mut l).contains(&LinkOutput::Disconnect(
            7,
            DisconnectReason::Silent(3000 * MS)
        )));
    }

    /// `poll_timeout` is the earliest deadline of all: logon, linger, silence, heartbeat;
    /// and `handle_timeout` at it does something.
    #[test]
    fn poll_timeout_is_the_earliest_deadline() {
        let mut l = EngineLinks::new(LinkConfig {
            heartbeat: Duration::ZERO,
            ..cfg()
        });
        assert_eq!(l.poll_timeout(), None);
        let Admission::Pending(a) = l.handle_accepted(T0) else {
            panic!()
        };
        assert_eq!(l.poll_timeout(), Some(at(2000)));
        assert!(l.handle_logon(a, 1, at(500)));
        // Silence only (heartbeats off): 500 + 3000.
        assert_eq!(l.poll_timeout(), Some(at(3500)));
        let Admission::Pending(b) = l.handle_accepted(at(1000)) else {
            panic!()
        };
        assert_eq!(l.poll_timeout(), Some(at(3000)));
        l.handle_refused(b, at(1200));
        assert_eq!(l.poll_timeout(), Some(at(1300)));
        l.handle_timeout(at(1300));
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Close(b, CloseReason::Refused)]
        );
        assert_eq!(l.poll_timeout(), Some(at(3500)));
        let mut h = linked(2);
        h.handle_frame(2, at(50));
        assert_eq!(h.poll_timeout(), Some(at(100)), "the heartbeat first");
    }

    /// The shell's lost connections and the gateway's cut-offs end the link once.
    #[test]
    fn lost_and_cut_off_engines_are_disconnected_once() {
        let mut l = linked(7);
        l.handle_lost(7);
        l.handle_cut_off(7);
        l.handle_lost(7);
        assert_eq!(
            outputs(&mut l),
            [LinkOutput::Disconnect(7, DisconnectReason::Lost)]
        );
    }
}
