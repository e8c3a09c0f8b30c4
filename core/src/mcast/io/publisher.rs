//! [`McastPublisher`]: the UD queue pair that multicasts what the
//! [`SendSchedule`] lets out on lines A and B, and the recovery port
//! ([`super::recovery`]) driven for the [`RecoveryServer`]; with its I/O
//! counters, [`PublisherIoStats`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use arrayvec::ArrayVec;

use super::common::{
    channel_of, gid_of, inline_max, server_rc_options, warn_if_open, CM_CHECK_NS, CM_STEP_NS,
    PENDING_TIMEOUT, RC_MSG_LEN, SNAPSHOT_CHUNK,
};
use super::error::{NetError, PublishError};
use super::recovery::{send_answers, RecoveryIo};
use crate::clock::Mono;
use crate::mcast::config::McastConfig;
use crate::mcast::publisher::{Output, PublisherState};
use crate::mcast::repair::RepairCounters;
use crate::mcast::schedule::{SendSchedule, Transmit};
use crate::mcast::server::{RecoveryServer, ServerConfig};
use crate::mcast::snapshot::Snapshot;
use crate::mcast::status::{PublisherEvent, SubscriberRow};
use crate::mcast::transport::MdClaim;
use crate::mcast::wire::{Line, Welcome};
use crate::verbs::cm::{self, Listener, McastMembership};
use crate::verbs::{
    AddressHandle, Context, Dest, PoolConfig, PoolError, PooledQp, ProtectionDomain, QpType,
    StageError, UdDest,
};

/// I/O counters of a publisher (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublisherIoStats {
    /// Datagrams multicast (each on every enabled line).
    pub datagrams_sent: u64,
    /// Heartbeats multicast.
    pub heartbeats_sent: u64,
    /// Datagrams overwritten in the history before pacing let them out.
    pub unsent_overwritten: u64,
    /// Recovery connections accepted.
    pub connections_accepted: u64,
    /// Recovery connections that failed to set up (or timed out doing so).
    pub connections_failed: u64,
    /// Recovery connections closed (peer disconnected or send failed).
    pub connections_closed: u64,
    /// Retransmit requests served.
    pub retransmit_requests: u64,
    /// Snapshots served.
    pub snapshots_served: u64,
    /// Requests dropped because the connection's outbox was full, or
    /// undecodable.
    pub requests_dropped: u64,
    /// Connect requests refused before any set-up: without a valid first
    /// proof of the secret, or a hello answered before or too old (a
    /// replay; both rejected silently), the connection cap was
    /// reached, or the hello was not for this channel with the same
    /// datagram-tag setting.
    pub connections_refused: u64,
    /// Proved connect requests answered a cookie to echo
    /// (`recovery_server.cookie_when_pending` handshakes in progress):
    /// nothing was kept for them.
    pub cookies_sent: u64,
    /// Connections dropped because their first message was not a valid
    /// proof of the shared secret (a wrong secret or a replayed handshake).
    pub auth_failures: u64,
    /// Connections dropped because no proof came within
    /// `recovery_server.handshake_timeout_ns`.
    pub handshake_timeouts: u64,
    /// Retransmit requests dropped by the per-connection rate limit.
    pub requests_rate_limited: u64,
    /// Snapshot requests dropped by the per-connection rate limit.
    pub snapshots_rate_limited: u64,
    /// Retransmit requests cut to `recovery.max_request_messages`.
    pub requests_clamped: u64,
    /// Snapshots serialised (the rest of `snapshots_served` reused one).
    pub snapshots_built: u64,
    /// Connections dropped because their client took nothing: RNR retries
    /// exhausted (no receive posted) or no send progress for
    /// `recovery_server.stall_timeout_ns`.
    pub clients_stalled: u64,
    /// Datagrams retransmitted by unicast, over recovery connections.
    pub repair_unicast_datagrams: u64,
    /// Datagrams retransmitted on multicast (a loss several subscribers
    /// shared, see [`crate::mcast::repair`]), each once on every enabled line.
    pub repair_multicast_datagrams: u64,
    /// Retransmit and snapshot requests dropped because the connection's
    /// repair budget (`recovery_server.repair_bytes_per_sec`) was spent.
    pub repair_budget_dropped: u64,
    /// Retransmit requests whose answer was cut to
    /// `recovery_server.repair_request_bytes`.
    pub repair_requests_cut: u64,
    /// Retransmit requests answered by nothing because a multicast
    /// retransmit had just covered them.
    pub repair_requests_covered: u64,
    /// Retransmit requests answered by nothing because an answer sent to
    /// the same subscriber within `recovery_server.repair_holdoff_ns`
    /// covers them (retries that crossed their answer).
    pub repair_requests_suppressed: u64,
    /// Subscriber status reports taken.
    pub status_reports: u64,
    /// Subscriber status reports dropped as invalid (another channel or
    /// session, or a position ahead of the publisher's).
    pub status_invalid: u64,
}

struct LineTx {
    /// Shared with the send pool's prepared requests, which point at it.
    ah: Arc<AddressHandle>,
    qpn: u32,
    qkey: u32,
    enabled: bool,
    _membership: McastMembership,
}

/// A market-data publisher for one channel: multicast sender plus recovery
/// service. See the [module documentation](super).
pub struct McastPublisher {
    state: PublisherState,
    /// When datagrams and heartbeats go out.
    schedule: SendSchedule,
    // Field order: the queue pairs go before what they reference.
    ud: PooledQp,
    lines: ArrayVec<LineTx, 2>,
    server: RecoveryServer,
    io: RecoveryIo,
    /// The multicast retransmit in progress: `[from, to)` still to send.
    mcast_repair: Option<(u64, u64)>,
    stats: PublisherIoStats,
}

impl std::fmt::Debug for McastPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McastPublisher")
            .field("session", &self.state.session())
            .field("next_seq", &self.state.next_seq())
            .field("sent_upto", &self.schedule.sent_upto())
            .field("stats", &self.io_stats())
            .field("ud", &self.ud)
            .finish_non_exhaustive()
    }
}

impl McastPublisher {
    /// Opens the device owning `local`, joins the channel's groups, and
    /// listens for recovery connections on `local`:`channel.port`.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        session: u64,
        local: IpAddr,
    ) -> Result<Self, NetError> {
        let ch = channel_of(cfg, channel)?;
        warn_if_open(cfg, channel);
        let ctx = Context::open_for_ip(local)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let mut ud = PooledQp::new(
            &pd,
            QpType::Ud,
            PoolConfig {
                recv_slots: 0,
                recv_len: 0,
                recv_batch: 1,
                recv_low_water: 0,
                send_slots: 256,
                send_len: cfg.max_datagram_payload,
                signal_every: 16,
                dests_per_send: 2,
                max_inline: inline_max(cfg),
            },
        )?;
        let mut lines = ArrayVec::new();
        for group in std::iter::once(ch.line_a).chain(ch.line_b) {
            let m = McastMembership::join(local, group, false, cfg.connect_timeout())?;
            cm::check_device(&ctx, m.device_name())?;
            if lines.is_empty() {
                ud.qp().activate_ud(m.port_num(), ch.qkey, 0)?;
            }
            lines.push(LineTx {
                ah: Arc::new(m.address_handle(&pd, &cfg.rdma.ud_class())?),
                qpn: m.remote_qpn(),
                qkey: ch.qkey,
                enabled: true,
                _membership: m,
            });
        }
        // The latency path's sends (see flush) go to the lines through
        // requests built once, here; set_line_enabled re-links them.
        let dests: ArrayVec<UdDest, 2> = lines
            .iter()
            .map(|l: &LineTx| UdDest {
                ah: l.ah.clone(),
                qpn: l.qpn,
                qkey: l.qkey,
            })
            .collect();
        ud.prepare_ud_dests(&dests)?;
        let addr = SocketAddr::new(local, ch.port);
        let listener = Listener::bind(addr)?;
        let mut state = PublisherState::new(cfg.publisher(channel, session));
        state.set_datagram_key(cfg.datagram_key());
        let identity = Welcome::identity(
            channel,
            session,
            cfg.auth.datagram_tag,
            ud.qp().qpn(),
            gid_of(local).0,
        );
        let server = RecoveryServer::new(
            ServerConfig {
                limits: cfg.recovery_server,
                max_request_messages: cfg.recovery.max_request_messages,
                snapshot_chunk: SNAPSHOT_CHUNK,
                setup_timeout_ns: PENDING_TIMEOUT.max(cfg.connect_timeout()).as_nanos() as u64,
                outbox_capacity: RC_MSG_LEN * 4,
                lines: lines.len(),
            },
            cfg.recovery_key(),
            identity,
        );
        Ok(McastPublisher {
            schedule: SendSchedule::new(
                state.next_seq(),
                cfg.pacing.max_datagrams_per_sec,
                cfg.pacing.burst,
                cfg.heartbeat_interval_ns,
            ),
            state,
            ud,
            lines,
            mcast_repair: None,
            server,
            io: RecoveryIo {
                addr,
                listener: Some(listener),
                pd,
                conns: Vec::new(),
                pending: Vec::new(),
                opts: server_rc_options(cfg),
                max_inline: inline_max(cfg),
                next_cm_check: 0,
            },
            stats: PublisherIoStats::default(),
        })
    }

    /// The protocol state (sequence, history, counters).
    pub fn state(&self) -> &PublisherState {
        &self.state
    }
    /// The recovery service's state machine (connections, counters).
    pub fn recovery_server(&self) -> &RecoveryServer {
        &self.server
    }
    /// The longest datagram posted inline: `[rdma] max_inline` (default 220), at most
    /// what the device granted its UD queue pair.
    pub fn max_inline(&self) -> usize {
        self.ud.max_inline()
    }

    /// I/O counters (the shell's, the schedule's and the recovery
    /// service's, in one value).
    pub fn io_stats(&self) -> PublisherIoStats {
        let (s, k) = (self.schedule.counters(), self.server.counters());
        PublisherIoStats {
            datagrams_sent: s.datagrams_sent,
            unsent_overwritten: s.unsent_overwritten,
            connections_accepted: k.connections_accepted,
            connections_failed: k.connections_failed + self.stats.connections_failed,
            connections_closed: k.connections_closed,
            retransmit_requests: k.retransmit_requests,
            snapshots_served: k.snapshots_served,
            requests_dropped: k.requests_dropped,
            connections_refused: k.connections_refused
                + k.connections_unproved
                + k.connections_replayed,
            cookies_sent: k.cookies_sent,
            auth_failures: k.auth_failures,
            handshake_timeouts: k.handshake_timeouts,
            requests_rate_limited: k.requests_rate_limited,
            snapshots_rate_limited: k.snapshots_rate_limited,
            requests_clamped: k.requests_clamped,
            snapshots_built: k.snapshots_built,
            clients_stalled: k.clients_stalled,
            repair_unicast_datagrams: k.repair_unicast_datagrams,
            repair_requests_covered: k.repair_requests_covered,
            repair_budget_dropped: k.repair_budget_dropped,
            repair_requests_cut: k.repair_requests_cut,
            repair_requests_suppressed: k.repair_requests_suppressed,
            status_reports: k.status_reports,
            status_invalid: k.status_invalid,
            ..self.stats
        }
    }
    /// Every admitted subscriber: address, position, lag, rate, requests,
    /// as of the last poll (see [`crate::mcast::status`]).
    pub fn subscribers(&self) -> &[SubscriberRow] {
        self.server.subscribers()
    }
    /// The next event about subscribers (one fell behind the
    /// `recovery_server.lag_alert_messages` bound, or caught up again).
    pub fn poll_event(&mut self) -> Option<PublisherEvent> {
        self.server.poll_event()
    }
    /// How retransmit requests were answered (unicast, multicast, covered).
    pub fn repair_counters(&self) -> RepairCounters {
        self.server.repair_counters()
    }
    /// Recovery connections currently open (admitted or still proving
    /// themselves; not those still being set up).
    pub fn connections(&self) -> usize {
        self.server.connections()
    }
    /// Recovery connections that proved the shared secret.
    pub fn admitted_connections(&self) -> usize {
        self.server.admitted_connections()
    }
    /// Stops the recovery service (closing its connections and no longer
    /// listening) or starts it again, e.g. for maintenance or to test how
    /// subscribers live without it. Multicast goes on either way.
    pub fn set_recovery_enabled(&mut self, enabled: bool) -> Result<(), NetError> {
        let io = &mut self.io;
        if !enabled {
            self.server.close_all();
            io.conns.clear();
            io.pending.clear();
            io.listener = None;
        } else if io.listener.is_none() {
            io.listener = Some(Listener::bind(io.addr)?);
        }
        Ok(())
    }
    /// Stops (or resumes) sending on `line`, e.g. to test a cut line.
    pub fn set_line_enabled(&mut self, line: Line, enabled: bool) {
        if let Some(l) = self.lines.get_mut(line as usize) {
            l.enabled = enabled;
            self.ud.set_ud_dest_enabled(line as usize, enabled);
        }
    }

    /// Appends one message to the open datagram (flushing it first if full)
    /// and returns its sequence. Sending happens in [`poll`](Self::poll) and
    /// [`flush`](Self::flush).
    ///
    /// A message larger than one datagram (up to `max_message_bytes`) is
    /// sealed as fragment datagrams at once and sent as pacing allows, here
    /// and in later polls: offer the next one once
    /// [`unsent_datagrams`](Self::unsent_datagrams) is small, or a history
    /// smaller than the backlog overwrites fragments before they are sent.
    pub fn offer(&mut self, now: Mono, msg: &[u8]) -> Result<u64, PublishError> {
        let now = now.as_nanos();
        let p = self.state.publish_flushing(msg)?;
        self.send_output(now, p.output);
        Ok(p.seq)
    }

    /// [`offer`](Self::offer) then [`flush`](Self::flush), in one step
    /// for the latency path: a message published alone (nothing else open)
    /// that fits one datagram is sealed with its header at once and, when
    /// it is the only datagram unsent, fits inline and a send slot is free,
    /// posted straight from the history as `flush` does. Anything else
    /// takes `offer` and `flush`.
    pub fn offer_and_flush(&mut self, now: Mono, msg: &[u8]) -> Result<u64, NetError> {
        let now = now.as_nanos();
        let first = self.state.unflushed_seq();
        let Some((seq, bytes)) = self.state.publish_alone(msg) else {
            let seq = self.offer(Mono::from_nanos(now), msg)?;
            self.flush(Mono::from_nanos(now))?;
            return Ok(seq);
        };
        if !self.ud.has_staged()
            && self.ud.sends_in_flight() < self.ud.send_slots()
            && bytes.len() <= self.ud.max_inline()
            && self.schedule.try_direct(now, first)
        {
            // As in flush: the requests to the enabled lines were built
            // when the lines were set up or switched.
            self.ud.send_prepared(bytes)?;
            self.schedule.sent(now, seq + 1);
            return Ok(seq);
        }
        self.pump(now);
        self.ud.post_staged(&dests_of(&self.lines))?;
        Ok(seq)
    }

    /// Claims `len` bytes for the next message (flushing a full datagram
    /// first): write the message into the claim, then
    /// [`commit`](MdClaim::commit) it (or [`abort`](MdClaim::abort)). A
    /// claim larger than one datagram (up to `max_message_bytes`) is staged
    /// and fragmented at commit, its fragments sent as pacing allows, then
    /// and in later polls.
    pub fn try_claim(&mut self, now: Mono, len: usize) -> Result<MdClaim<'_, Self>, PublishError> {
        self.prepare_claim(now.as_nanos(), len)?;
        Ok(MdClaim::new(self, now))
    }

    /// Makes room for a claim of `len` bytes and claims it in the state.
    pub(crate) fn prepare_claim(&mut self, now: u64, len: usize) -> Result<(), PublishError> {
        let output = self.state.make_room(len);
        self.send_output(now, output);
        self.state.try_claim(len)?;
        Ok(())
    }

    /// Commits the claimed message; its sequence (0: nothing was claimed).
    pub(crate) fn commit_claim(&mut self, now: u64) -> u64 {
        let Some(p) = self.state.commit_flushing() else {
            return 0;
        };
        self.send_output(now, p.output);
        p.seq
    }

    /// The protocol state, to fill and abandon a claim.
    pub(crate) fn state_mut(&mut self) -> &mut PublisherState {
        &mut self.state
    }

    /// Sends what a publishing call sealed: a datagram sealed to make room
    /// joins the current batch of sends; fragments are posted at once.
    fn send_output(&mut self, now: u64, output: Output) {
        match output {
            Output::Nothing => {}
            Output::Sealed => self.pump(now),
            Output::Fragments => {
                self.pump(now);
                // As in pump, a failed post is left to the next one.
                let _ = self.ud.post_staged(&dests_of(&self.lines));
            }
        }
    }

    /// Flushed datagrams not sent yet (waiting for pacing or send slots).
    pub fn unsent_datagrams(&self) -> u64 {
        self.schedule.unsent_datagrams(&self.state)
    }

    /// Seals the open datagram now and sends what pacing allows.
    pub fn flush(&mut self, now: Mono) -> Result<(), NetError> {
        let now = now.as_nanos();
        let first = self.state.unflushed_seq();
        // The latency path: when the datagram just sealed is the only one
        // unsent (the schedule has sent up to its first sequence), nothing
        // is staged and it fits inline, it is posted straight from the
        // history (no copy into a send slot), from the bytes the seal
        // returned (no search of the history for them).
        if let Some(bytes) = self.state.flush() {
            if !self.ud.has_staged()
                && self.ud.sends_in_flight() < self.ud.send_slots()
                && bytes.len() <= self.ud.max_inline()
                && self.schedule.try_direct(now, first)
            {
                // Cannot decline now (nothing staged, it fits, a slot is
                // free) but for no enabled line, where the datagram counts
                // as sent, as in pump. The requests to the enabled lines
                // were built when the lines were set up or switched.
                self.ud.send_prepared(bytes)?;
                self.schedule.sent(now, self.state.unflushed_seq());
                return Ok(());
            }
        }
        self.pump(now);
        self.ud.post_staged(&dests_of(&self.lines))?;
        Ok(())
    }

    /// Stages what the schedule lets out (flushed datagrams as pacing
    /// allows, a heartbeat when one is due) as the send ring allows; posts
    /// full batches. Errors are left to the next post.
    fn pump(&mut self, now: u64) {
        while let Some(t) = self.schedule.poll_transmit(now, &mut self.state) {
            let (end, bytes) = match t {
                Transmit::Heartbeat(hb) => {
                    if self.ud.stage(hb).is_ok() {
                        self.stats.heartbeats_sent += 1;
                    }
                    continue;
                }
                Transmit::Datagram { end, bytes } => (end, bytes),
            };
            match self.ud.stage(bytes) {
                Ok(()) => {}
                Err(StageError::BatchFull) => {
                    let dests = dests_of(&self.lines);
                    if self.ud.post_staged(&dests).is_err() || self.ud.stage(bytes).is_err() {
                        return;
                    }
                }
                Err(StageError::RingFull) => {
                    if self.ud.poll_send().is_err() || self.ud.stage(bytes).is_err() {
                        return;
                    }
                }
                // Cannot be sent, ever: counts as sent.
                Err(StageError::TooLarge { .. }) => {}
            }
            self.schedule.sent(now, end);
        }
    }

    /// Does all pending work once: flushes on the batching timer, multicasts,
    /// sends a heartbeat when idle, reclaims send slots, and serves recovery
    /// (accepting connections, answering retransmit requests from the
    /// history and snapshot requests from `snapshot`). Returns the datagrams
    /// sent. Never blocks.
    pub fn poll(&mut self, now: Mono, snapshot: &impl Snapshot) -> Result<usize, NetError> {
        let now = now.as_nanos();
        let before = self.schedule.counters().datagrams_sent;
        self.state.poll_flush(now);
        self.schedule.handle_timeout(now, &self.state);
        self.pump(now);
        if self.ud.has_staged() {
            self.ud.post_staged(&dests_of(&self.lines))?;
        }
        self.ud.reclaim()?;
        self.poll_recovery(now, snapshot);
        self.send_multicast_repairs(now)?;
        Ok((self.schedule.counters().datagrams_sent - before) as usize)
    }

    /// The recovery service's I/O: connection management (at most once per
    /// [`CM_CHECK_NS`]), then each open connection's receives into the
    /// server and the server's answers out, then closing what it closed.
    fn poll_recovery(&mut self, now: u64, snapshot: &impl Snapshot) {
        let (io, server, state) = (&mut self.io, &mut self.server, &mut self.state);
        // Connection management costs system calls (a poll and reads on the
        // rdma_cm channels): at most once per CM_CHECK_NS, not per loop, and
        // only past one poll over all the channels (see cm_events).
        let mut check_cm = false;
        if now >= io.next_cm_check {
            check_cm = io.cm_events();
            if check_cm {
                if io.accept(now, server).is_err() {
                    self.stats.connections_failed += 1;
                }
                io.progress(now, server);
            }
            let step = if io.pending.is_empty() {
                CM_CHECK_NS
            } else {
                CM_STEP_NS
            };
            io.next_cm_check = now + step;
        }
        for c in &mut io.conns {
            if !server.is_open(c.id) {
                continue;
            }
            let id = c.id;
            if !c.early.is_empty() {
                for bytes in std::mem::take(&mut c.early) {
                    server.on_receive(now, id, &bytes, state, snapshot);
                }
            }
            let recv =
                c.qp.poll_recv(|bytes| server.on_receive(now, id, bytes, state, snapshot));
            if recv.is_err() {
                server.on_transport_error(id, false);
                continue;
            }
            if let Err(e) = send_answers(&mut c.qp, server, now, id) {
                let stalled = matches!(
                    e,
                    NetError::Pool(PoolError::SendCompletion {
                        status: crate::verbs::WcStatus::RnrRetryExceeded,
                        ..
                    })
                );
                server.on_transport_error(id, stalled);
                continue;
            }
            if check_cm && c.conn.poll_disconnected().unwrap_or(true) {
                server.on_transport_error(id, false);
            }
        }
        // Timers after input: a proof (or request) that arrived before its
        // deadline but is read late, after a turn that took long (a large
        // message sealed, a descheduled thread), still counts.
        server.handle_timeout(now, state);
        while let Some((id, _)) = server.poll_closed(now) {
            io.release(id);
        }
    }

    /// Multicasts the datagrams of the repairs the planner chose, from the
    /// history (the original datagrams, byte for byte), as the server's
    /// pacing lets them out and the send ring takes them; the rest goes on
    /// in the next poll.
    fn send_multicast_repairs(&mut self, now: u64) -> Result<(), NetError> {
        let mut staged = false;
        loop {
            let (from, to) = match self.mcast_repair {
                Some(r) => r,
                None => match self.server.poll_repair(now, &self.state) {
                    Some(r) => r,
                    None => break,
                },
            };
            self.mcast_repair = None;
            let Some((first, end, bytes)) = self.state.sealed_from(from) else {
                continue;
            };
            if first >= to {
                continue;
            }
            match self.ud.stage(bytes) {
                Ok(()) => {
                    staged = true;
                    self.stats.repair_multicast_datagrams += 1;
                }
                // Cannot happen (it was sent once); skip it.
                Err(StageError::TooLarge { .. }) => {}
                Err(StageError::BatchFull) => {
                    self.ud.post_staged(&dests_of(&self.lines))?;
                    self.mcast_repair = Some((from, to));
                    continue;
                }
                Err(StageError::RingFull) => {
                    self.mcast_repair = Some((from, to));
                    if self.ud.poll_send()? == 0 {
                        break;
                    }
                    continue;
                }
            }
            if end < to {
                self.mcast_repair = Some((end, to));
            }
        }
        if staged {
            self.ud.post_staged(&dests_of(&self.lines))?;
        }
        Ok(())
    }
}

fn dests_of(lines: &[LineTx]) -> ArrayVec<Dest<'_>, 2> {
    lines
        .iter()
        .filter(|l| l.enabled)
        .map(|l| Dest::Ud {
            ah: &l.ah,
            qpn: l.qpn,
            qkey: l.qkey,
        })
        .collect()
}
