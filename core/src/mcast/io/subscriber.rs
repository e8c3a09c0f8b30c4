//! [`McastSubscriber`]: one UD queue pair per line feeding the
//! [`SubscriberState`], the recovery link ([`super::link`]) kept up with
//! back-off, and the requests and status reports sent over it; with its I/O
//! counters, [`SubscriberIoStats`].

use std::net::{IpAddr, SocketAddr};

use arrayvec::ArrayVec;
use zerocopy::IntoBytes;

use super::common::{
    channel_of, inline_max, now_ns, rc_options, warn_if_open, CM_CHECK_NS, CM_STEP_NS,
};
use super::error::NetError;
use super::link::{admit, cookie_of, recovery_qp, send_proof, Link, Reconnect};
use crate::clock::Mono;
use crate::mcast::backoff::Backoff;
use crate::mcast::config::McastConfig;
use crate::mcast::server::ClientHandshake;
use crate::mcast::snapshot::{Handler, SnapshotSink};
use crate::mcast::status::StatusReporter;
use crate::mcast::subscriber::{Event, LinkWatch, SubscriberCounters, SubscriberState};
use crate::mcast::wire::{Line, SubscriberStatus};
use crate::verbs::cm::{self, McastMembership};
use crate::verbs::{
    Access, Context, Dest, Gid, PoolConfig, PooledQp, ProtectionDomain, QpType, StageError,
};

/// An idle subscriber polls its recovery connection's CQ once in this many
/// turns (see [`McastSubscriber::poll`]).
const IDLE_LINK_POLLS: u32 = 64;

/// I/O counters of a subscriber (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubscriberIoStats {
    /// Datagrams received on line A (before validation).
    pub datagrams_a: u64,
    /// Datagrams received on line B (before validation).
    pub datagrams_b: u64,
    /// RC messages received from the recovery service.
    pub recovery_messages: u64,
    /// Requests sent to the recovery service.
    pub requests_sent: u64,
    /// Requests dropped because the RC send ring was full (asked again on
    /// timeout).
    pub requests_dropped: u64,
    /// Times the recovery connection was found dead (error completion or
    /// disconnect).
    pub connections_lost: u64,
    /// Reconnections to the recovery service that succeeded.
    pub reconnects: u64,
    /// Reconnection attempts that failed (each followed by a longer wait).
    pub reconnect_failures: u64,
    /// Recovery connections dropped because [`DEAD_LINK_TIMEOUTS`] requests
    /// in a row went unanswered (counted in `connections_lost` too).
    ///
    /// [`DEAD_LINK_TIMEOUTS`]: super::DEAD_LINK_TIMEOUTS
    pub unanswered_links: u64,
    /// Datagrams dropped unparsed because they came from another queue pair
    /// or GID than the publisher announced over the recovery connection.
    pub foreign_source_dropped: u64,
    /// Reconnections whose admission failed (the publisher's proof was
    /// wrong, or the two sides disagree on the channel or datagram tags).
    pub auth_failures: u64,
    /// Status reports sent to the publisher.
    pub status_sent: u64,
}

struct LineRx {
    line: Line,
    qp: PooledQp,
    membership: McastMembership,
}

impl Drop for LineRx {
    /// Detaches the queue pair from the group before it is destroyed (the
    /// fields drop after this). The kernel refuses to destroy a QP still
    /// attached to a multicast group (`EBUSY`: the attachment holds a use
    /// count), and `ibv_destroy_qp`'s failure left the QP, its completion
    /// queues and the provider's memory behind for the life of the process,
    /// one set per line at every subscriber's drop or reconnect; memcheck
    /// saw the provider's memory lost (the C++ engine example run under it
    /// by hand; not in the suite yet).
    fn drop(&mut self) {
        if let Err(e) = self.membership.detach(self.qp.qp()) {
            tracing::warn!(line = ?self.line, error = %e, "detaching a market-data line's queue pair from its group failed: the QP cannot be destroyed");
        }
    }
}

/// A market-data subscriber for one channel. See the [module documentation](super).
pub struct McastSubscriber {
    state: SubscriberState,
    lines: ArrayVec<LineRx, 2>,
    /// The publisher's GID and UD queue pair, as its welcome announced:
    /// datagrams from anyone else are dropped.
    source: (Gid, u32),
    link: Link,
    reconnect: Reconnect,
    stats: SubscriberIoStats,
    /// The dead-link rule.
    watch: LinkWatch,
    /// Turns since the recovery connection's CQ was last polled.
    idle_link_turns: u32,
    /// When to report position and rate to the publisher.
    status: StatusReporter,
    /// `claimed` when claims were last logged (at counts 1, 2, 4, ...).
    claims_logged: u64,
}

impl std::fmt::Debug for McastSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McastSubscriber")
            .field("phase", &self.state.phase())
            .field("next_seq", &self.state.next_seq())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl McastSubscriber {
    /// As [`new`](Self::new), then waits for the recovery connection to
    /// `publisher`:`channel.port` (up to `connect_timeout_ms` when the
    /// publisher does not answer), where it proves the shared secret and
    /// learns the session and the source to accept datagrams from: an
    /// error if the publisher is down. For tools and tests that want a
    /// connected subscriber before they go on; an engine's loop uses
    /// [`new`](Self::new), which never waits.
    pub fn connect(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::join_lines(cfg, channel, local, publisher)?;
        let publisher = s.reconnect.publisher;
        let r = &s.reconnect;
        let mut cookie = None;
        // Once more with the publisher's cookie if it is under load.
        let (mut rc, handshake, conn, welcome) = loop {
            let resolved = cm::resolve_with_tos(
                publisher,
                Some(local),
                cfg.connect_timeout(),
                cfg.rdma.traffic_class,
            )?;
            let rc = recovery_qp(&r.pd, r.max_inline)?;
            let handshake =
                ClientHandshake::with_cookie(r.key.clone(), channel, r.tags, cookie.as_ref());
            match resolved.connect(
                rc.qp(),
                &r.opts,
                Access::LOCAL,
                handshake.hello().as_bytes(),
                cfg.connect_timeout(),
            ) {
                Ok((conn, welcome)) => break (rc, handshake, conn, welcome),
                Err(e) => match cookie_of(&e, &handshake) {
                    Some(c) => cookie = Some(c),
                    None => return Err(e.into()),
                },
            }
        };
        let admitted = match admit(&handshake, &welcome, publisher) {
            Ok(a) => a,
            Err(e) => {
                let _ = conn.disconnect();
                return Err(e);
            }
        };
        rc.post_receives()?;
        send_proof(&mut rc, &admitted)?;
        s.state.announce_session(now_ns(), admitted.session);
        s.source = (Gid(admitted.gid), admitted.qpn);
        s.link = Link::Up { rc, conn };
        Ok(s)
    }

    /// Opens the device owning `local` and joins the channel's line(s) with
    /// receives posted (on RoCE a local operation, no peer involved), without
    /// waiting for the publisher: the recovery connection to
    /// `publisher`:`channel.port` starts down and is made by
    /// [`poll`](Self::poll), with the same back-off as a reconnect after a
    /// lost link, each attempt bounded by `connect_timeout_ms` (a publisher
    /// that is down costs the caller nothing). It is reported as
    /// [`Event::RecoveryRestored`] when it comes up (not preceded by
    /// [`Event::RecoveryLost`]: nothing was lost). Until then no datagram
    /// is delivered: the publisher's welcome names the source and session
    /// to accept. [`connect`](Self::connect) waits for it instead.
    pub fn new(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let mut s = Self::join_lines(cfg, channel, local, publisher)?;
        s.state.start_link_down();
        Ok(s)
    }

    /// Everything but the recovery connection, which is left down.
    fn join_lines(
        cfg: &McastConfig,
        channel: u16,
        local: IpAddr,
        publisher: IpAddr,
    ) -> Result<Self, NetError> {
        let ch = channel_of(cfg, channel)?;
        warn_if_open(cfg, channel);
        let ctx = Context::open_for_ip(local)?;
        let pd = ProtectionDomain::new(&ctx)?;
        let mut lines = ArrayVec::new();
        for (line, group) in [(Line::A, Some(ch.line_a)), (Line::B, ch.line_b)] {
            let Some(group) = group else { continue };
            let m = McastMembership::join(local, group, false, cfg.connect_timeout())?;
            cm::check_device(&ctx, m.device_name())?;
            let qp = PooledQp::new(
                &pd,
                QpType::Ud,
                PoolConfig {
                    recv_slots: cfg.receive.depth,
                    recv_len: cfg.max_datagram_payload,
                    recv_batch: cfg.receive.replenish_batch,
                    recv_low_water: cfg.receive.low_water,
                    send_slots: 0,
                    send_len: 0,
                    signal_every: 1,
                    dests_per_send: 1,
                    max_inline: inline_max(cfg),
                },
            )?;
            if lines
                .first()
                .is_some_and(|l: &LineRx| l.membership.mgid() == m.mgid())
            {
                return Err(NetError::LinesShareGroup {
                    channel,
                    mgid: m.mgid().to_string(),
                });
            }
            qp.qp().activate_ud(m.port_num(), ch.qkey, 0)?;
            m.attach(qp.qp())?;
            // Attached: from here `LineRx`'s Drop detaches it, whatever fails next.
            let mut rx = LineRx {
                line,
                qp,
                membership: m,
            };
            rx.qp.post_receives()?;
            lines.push(rx);
        }
        let publisher = SocketAddr::new(publisher, ch.port);
        let key = cfg.recovery_key();
        // Until a publisher's welcome names its source and session, every
        // datagram counts as foreign and none is delivered.
        let mut state = SubscriberState::new(cfg.subscriber(channel));
        state.set_datagram_key(cfg.datagram_key());
        Ok(McastSubscriber {
            state,
            lines,
            source: (Gid::default(), 0),
            link: Link::Down,
            reconnect: Reconnect {
                pd,
                key,
                channel,
                tags: cfg.auth.datagram_tag,
                publisher,
                local,
                opts: rc_options(cfg),
                max_inline: inline_max(cfg),
                timeout: cfg.connect_timeout(),
                backoff: Backoff::new(cfg.recovery.reconnect_min_ns, cfg.recovery.reconnect_max_ns),
            },
            stats: SubscriberIoStats::default(),
            watch: LinkWatch::new(cfg.recovery.dead_link_ns),
            idle_link_turns: 0,
            status: StatusReporter::new(cfg.recovery.status_interval_ns),
            claims_logged: 0,
        })
    }

    /// Each line's multicast GID, as its join returned it.
    pub fn line_groups(&self) -> ArrayVec<(Line, crate::verbs::Gid), 2> {
        self.lines
            .iter()
            .map(|l| (l.line, l.membership.mgid()))
            .collect()
    }
    /// The protocol state.
    pub fn state(&self) -> &SubscriberState {
        &self.state
    }
    /// Protocol counters (gaps, recoveries, duplicates, ...).
    pub fn counters(&self) -> SubscriberCounters {
        self.state.counters()
    }
    /// I/O counters.
    pub fn io_stats(&self) -> SubscriberIoStats {
        self.stats
    }
    /// Closes the recovery connection (the publisher sees it go). A later
    /// [`poll`](Self::poll) treats it as lost and reconnects.
    pub fn disconnect(&self) -> Result<(), NetError> {
        match &self.link {
            Link::Up { conn, .. } => Ok(conn.disconnect()?),
            _ => Ok(()),
        }
    }
    /// Whether the recovery connection is up.
    pub fn recovery_connected(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }
    /// Next event (unrecoverable loss, resync, snapshot applied, ...).
    pub fn poll_event(&mut self) -> Option<Event> {
        self.state.poll_event()
    }

    /// Does all pending work once: takes up to `fragment_limit` received
    /// datagrams from each line and recovery messages from RC into the state
    /// machine (delivering in order to `app`), handles timers and sends the requests the state
    /// machine asks for. Returns the valid datagrams (from the publisher,
    /// of its session, well formed and tagged if tags are on) and recovery
    /// messages taken: only those are a sign of life. Never blocks,
    /// allocates or logs per message.
    ///
    /// A failing recovery connection is not an error here: it is reported
    /// through [`Event::RecoveryLost`] and re-established in later polls.
    /// Errors are the multicast receive side's only.
    pub fn poll<A: Handler + SnapshotSink + ?Sized>(
        &mut self,
        now: Mono,
        app: &mut A,
        fragment_limit: usize,
    ) -> Result<usize, NetError> {
        let now = now.as_nanos();
        let mut taken = 0;
        let state = &mut self.state;
        let (gid, qpn) = self.source;
        let mut foreign = 0;
        for l in &mut self.lines {
            let line = l.line;
            let r = l.qp.poll_recv_from_max(fragment_limit, |src, bytes| {
                if src.qpn != qpn || src.gid != gid {
                    foreign += 1;
                } else if state.on_datagram(now, line, bytes, app) {
                    taken += 1;
                }
            })?;
            if r.low {
                state.receive_queue_low();
            }
            match line {
                Line::A => self.stats.datagrams_a += r.received as u64,
                Line::B => self.stats.datagrams_b += r.received as u64,
            }
        }
        self.stats.foreign_source_dropped += foreign;
        let mut link_ok = true;
        // The recovery service only answers: its CQ is polled on every turn
        // while an answer may be coming, otherwise on every
        // IDLE_LINK_POLLS-th turn (for the error completions of a failed
        // connection), so an idle subscriber's turn costs one CQ poll per line.
        self.idle_link_turns += 1;
        let poll_link = state.expects_recovery() || self.idle_link_turns >= IDLE_LINK_POLLS;
        if let (true, Link::Up { rc, .. }) = (poll_link, &mut self.link) {
            self.idle_link_turns = 0;
            match rc.poll_recv(|bytes| state.on_recovery(now, bytes, app)) {
                Ok(r) => {
                    self.stats.recovery_messages += r.received as u64;
                    taken += r.received;
                }
                Err(_) => link_ok = false,
            }
        }
        if state.poll_timeout().is_some_and(|t| t.as_nanos() <= now) {
            state.handle_timeout(now, app);
        }
        // Far-ahead datagrams from the publisher's source (forged, without
        // datagram tags, or a real jump not yet corroborated): logged when
        // the count reaches 1, 2, 4, 8, ..., so a flood of forgeries costs
        // a few lines, never one per datagram.
        let claimed = state.claimed();
        if claimed > self.claims_logged {
            if self.claims_logged == 0 || claimed.ilog2() > self.claims_logged.ilog2() {
                let c = state.counters();
                tracing::warn!(
                    channel = self.reconnect.channel,
                    claimed,
                    disproved = c.claims_disproved,
                    accepted = c.claims_accepted,
                    "market data: datagrams far ahead of the stream held as unconfirmed claims \
                     (forged, or a jump not yet corroborated; logged at counts 1, 2, 4, ...)"
                );
            }
            self.claims_logged = claimed;
        }
        // The dead-link rule (see LinkWatch).
        let up = matches!(self.link, Link::Up { .. });
        if self
            .watch
            .check(now, state, self.stats.recovery_messages, up)
        {
            self.stats.unanswered_links += 1;
            link_ok = false;
        }
        if let Link::Up { rc, .. } = &mut self.link {
            if self.status.due(now) {
                let c = state.counters();
                if let Some(st) = self.status.poll_transmit(
                    now,
                    self.reconnect.channel,
                    state.session(),
                    state.next_seq(),
                    c.delivered,
                    c.retransmit_requests,
                ) {
                    link_ok &= send_status(rc, &st, &mut self.stats).is_ok();
                }
            }
            // The request path only when the state machine may have a
            // request; otherwise the send ring is reclaimed only while sends
            // (status reports, earlier requests) are in flight: with none,
            // no completion, not even an error, can be waiting.
            if state.may_transmit() {
                link_ok &= send_requests(rc, state, &mut self.stats).is_ok();
            } else if rc.sends_in_flight() != 0 {
                link_ok &= rc.reclaim().is_ok();
            }
        }
        if !link_ok {
            self.link_lost(now);
        }
        if self.reconnect.backoff.due(now) {
            self.manage_link(now);
        }
        Ok(taken)
    }

    fn link_lost(&mut self, now: u64) {
        self.link = Link::Down;
        self.stats.connections_lost += 1;
        self.state.set_recovery_link(now, false);
        self.reconnect.backoff.lost(now);
    }

    fn reconnect_failed(&mut self, now: u64) {
        self.link = Link::Down;
        self.stats.reconnect_failures += 1;
        self.reconnect.backoff.failed(now);
    }

    /// Connection management, at most once per [`CM_CHECK_NS`] (more often
    /// while a handshake is under way): disconnect check, reconnect
    /// attempts with back-off, handshake steps. Nothing here waits.
    fn manage_link(&mut self, now: u64) {
        let r = &mut self.reconnect;
        // The usual case, an established link, is checked in place: moving
        // the link out and back would copy its queue pair's state twice.
        if let Link::Up { conn, .. } = &self.link {
            if conn.poll_disconnected().unwrap_or(true) {
                return self.link_lost(now);
            }
            r.backoff.check_after(now, CM_CHECK_NS);
            return;
        }
        match std::mem::replace(&mut self.link, Link::Down) {
            // Handled above; put back as it was.
            up @ Link::Up { .. } => self.link = up,
            Link::Down => match r.start_attempt(None) {
                Ok(link) => {
                    self.link = link;
                    r.backoff.check_after(now, CM_STEP_NS);
                }
                Err(_) => self.reconnect_failed(now),
            },
            Link::Connecting {
                mut rc,
                connecting,
                handshake,
            } => match connecting.poll(
                rc.qp(),
                &r.opts,
                Access::LOCAL,
                handshake.hello().as_bytes(),
            ) {
                Ok(cm::ConnectProgress::Pending(connecting)) => {
                    self.link = Link::Connecting {
                        rc,
                        connecting,
                        handshake,
                    };
                    r.backoff.check_after(now, CM_STEP_NS);
                }
                Ok(cm::ConnectProgress::Done(conn, welcome)) => {
                    let admitted = match admit(&handshake, &welcome, r.publisher) {
                        Ok(a) => a,
                        Err(_) => {
                            let _ = conn.disconnect();
                            self.stats.auth_failures += 1;
                            return self.reconnect_failed(now);
                        }
                    };
                    if rc.post_receives().is_err() || send_proof(&mut rc, &admitted).is_err() {
                        return self.reconnect_failed(now);
                    }
                    self.link = Link::Up { rc, conn };
                    self.source = (Gid(admitted.gid), admitted.qpn);
                    self.stats.reconnects += 1;
                    r.backoff.connected();
                    r.backoff.check_after(now, CM_CHECK_NS);
                    // A restarted publisher announces its new session here
                    // (reset and resync); the same one changes nothing.
                    self.state.announce_session(now, admitted.session);
                    self.state.set_recovery_link(now, true);
                }
                // The publisher is under load and asks us to prove our
                // address: again at once, with its cookie (not a failure).
                Err(e) => match cookie_of(&e, &handshake) {
                    Some(c) => match r.start_attempt(Some(&c)) {
                        Ok(link) => {
                            self.link = link;
                            r.backoff.check_after(now, CM_STEP_NS);
                        }
                        Err(_) => self.reconnect_failed(now),
                    },
                    None => self.reconnect_failed(now),
                },
            },
        }
    }
}

/// Sends a status report over the recovery connection (dropped, counted,
/// if the send ring is full: the next one follows within an interval).
fn send_status(
    rc: &mut PooledQp,
    st: &SubscriberStatus,
    stats: &mut SubscriberIoStats,
) -> Result<(), NetError> {
    if rc
        .stage_with(SubscriberStatus::LEN, |buf| st.encode(buf).unwrap_or(0))
        .is_ok()
    {
        stats.status_sent += 1;
        rc.post_staged(&[Dest::Connected])?;
    } else {
        stats.requests_dropped += 1;
    }
    Ok(())
}

/// Sends what the state machine asks for over the recovery connection.
fn send_requests(
    rc: &mut PooledQp,
    state: &mut SubscriberState,
    stats: &mut SubscriberIoStats,
) -> Result<(), NetError> {
    let mut staged = false;
    while let Some(req) = state.poll_transmit() {
        let mut res = rc.stage_with(64, |buf| req.encode(buf).unwrap_or(0));
        if res == Err(StageError::RingFull) {
            rc.poll_send()?;
            res = rc.stage_with(64, |buf| req.encode(buf).unwrap_or(0));
        }
        if res.is_ok() {
            staged = true;
            stats.requests_sent += 1;
        } else {
            stats.requests_dropped += 1;
        }
    }
    if staged {
        rc.post_staged(&[Dest::Connected])?;
    }
    rc.reclaim()?;
    Ok(())
}
