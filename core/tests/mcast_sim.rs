//! Deterministic simulation of the market-data path over a lossy network.
//!
//! One publisher multicasts on lines A and B to one or more subscribers; each
//! line drops, delays (reorders) and duplicates datagrams at configured rates
//! from a seeded RNG. Recovery requests travel over a reliable, ordered RC
//! link to the publisher's recovery server, which answers from the
//! publisher's history and from a snapshot server (a reference application
//! fed every published message). Time is simulated in nanoseconds; nothing
//! sleeps.
//!
//! The simulator drives the shipped state machines and nothing of its own:
//! the publisher's [`PublisherState`] and [`SendSchedule`] (batching,
//! pacing, heartbeats when idle), the [`RecoveryServer`] (admission by the
//! shared secret, rate limits, caps, unicast or multicast repair, snapshot
//! reuse) and each subscriber's [`SubscriberState`]; only bytes and time are
//! the simulator's.

use std::collections::BTreeMap;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rocebus::auth::{Key, Purpose};
use rocebus::mcast::config::RecoveryServerConfig;
use rocebus::mcast::publisher::{PublisherConfig, PublisherState};
use rocebus::mcast::schedule::{SendSchedule, Transmit};
use rocebus::mcast::server::{ClientHandshake, RecoveryServer, ServerConfig, UNPROVED};
use rocebus::mcast::snapshot::RestoreError;
use rocebus::mcast::subscriber::Request;
use rocebus::mcast::wire::{self, Datagram, RecoveryMsg, RetransmitRequest, Welcome};
use rocebus::mcast::{
    Event, Handler, Line, Phase, Snapshot, SnapshotSink, SubscriberConfig, SubscriberState,
};
use zerocopy::IntoBytes;

const CHANNEL: u16 = 9;
const SESSION: u64 = 1_700_000_000_000;
const MAX_DATAGRAM: usize = 1024;
const LINE_LATENCY: u64 = 2_000;
const RC_LATENCY: u64 = 5_000;
const STEP: u64 = 100;
/// The publisher's `heartbeat_interval_ns`.
const HEARTBEAT_INTERVAL: u64 = 20_000;
/// One RC message of the recovery service.
const RC_MSG: usize = 4096;
const SECRET: &[u8] = b"sim secret";

// ---------------------------------------------------------------------------
// The application: a running checksum plus a map, with snapshots.
// ---------------------------------------------------------------------------

#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct State {
    last_seq: u64,
    count: u64,
    hash: u64,
    levels: BTreeMap<u16, u64>,
}

#[derive(Debug, Default)]
struct Book {
    state: State,
    staged: Vec<u8>,
}

impl Handler for Book {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        let s = &mut self.state;
        assert_eq!(seq, s.last_seq + 1, "delivered out of order or twice");
        s.last_seq = seq;
        s.count += 1;
        let mut h = (s.hash ^ seq).wrapping_mul(0x0000_0100_0000_01b3);
        for &b in msg {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        s.hash = h;
        let key = u16::from_le_bytes([msg[0], *msg.get(1).unwrap_or(&0)]) % 512;
        *s.levels.entry(key).or_default() += msg.len() as u64;
    }
}

impl Snapshot for Book {
    fn snapshot_seq(&self) -> u64 {
        self.state.last_seq
    }
    fn write_snapshot(&self, out: &mut Vec<u8>) {
        let s = &self.state;
        for v in [s.last_seq, s.count, s.hash, s.levels.len() as u64] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        for (k, v) in &s.levels {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

impl SnapshotSink for Book {
    fn begin_restore(&mut self) {
        self.staged.clear();
    }
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.staged.extend_from_slice(data);
        Ok(())
    }
    fn finish_restore(&mut self, snapshot_seq: u64) -> Result<(), RestoreError> {
        let b = &self.staged;
        let u64_at = |at: usize| -> Result<u64, RestoreError> {
            let bytes = b.get(at..at + 8).ok_or(RestoreError)?;
            Ok(u64::from_le_bytes(
                bytes.try_into().map_err(|_| RestoreError)?,
            ))
        };
        let mut st = State {
            last_seq: u64_at(0)?,
            count: u64_at(8)?,
            hash: u64_at(16)?,
            levels: BTreeMap::new(),
        };
        let n = u64_at(24)? as usize;
        for i in 0..n {
            let at = 32 + i * 10;
            let k = b.get(at..at + 2).ok_or(RestoreError)?;
            st.levels
                .insert(u16::from_le_bytes([k[0], k[1]]), u64_at(at + 2)?);
        }
        if st.last_seq != snapshot_seq {
            return Err(RestoreError);
        }
        self.state = st;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The network.
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
struct LineModel {
    drop: f64,
    reorder: f64,
    dup: f64,
    cut: bool,
    /// Datagram indices `[from, to)` dropped (an outage).
    outage: Option<(u64, u64)>,
    /// Extra latency of this line (A/B skew), ns.
    delay: u64,
}

impl LineModel {
    fn lossy(drop: f64) -> Self {
        LineModel {
            drop,
            ..Default::default()
        }
    }
    fn cut() -> Self {
        LineModel {
            cut: true,
            ..Default::default()
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Injected {
    /// Copies delivered per line (data and heartbeats).
    delivered: [u64; 2],
    dropped: [u64; 2],
    /// Extra copies of data datagrams delivered per line.
    dups: [u64; 2],
    reordered: u64,
    /// Data datagrams (and their messages) no copy of which was delivered.
    lost_datagrams: u64,
    lost_messages: u64,
}

enum Ev {
    Datagram(Line, Vec<u8>),
    ToServer(Vec<u8>),
    ToSubscriber(Vec<u8>),
}

struct Sub {
    /// Its connection's id at the recovery server.
    conn: u32,
    state: SubscriberState,
    app: Book,
    lines: [LineModel; 2],
    attach_after: u64,
    injected: Injected,
    events: Vec<Event>,
    not_available: Vec<wire::NotAvailable>,
    /// When the first gap was detected and the first retransmit was asked.
    first_gap_at: Option<u64>,
    first_request_at: Option<u64>,
}

struct Sim {
    now: u64,
    rng: SmallRng,
    msg_rng: SmallRng,
    publisher: PublisherState,
    /// When the publisher's datagrams and heartbeats go out.
    sched: SendSchedule,
    server: RecoveryServer,
    reference: Book,
    subs: Vec<Sub>,
    queue: BTreeMap<(u64, u64), (usize, Ev)>,
    next_id: u64,
    datagrams_sent: u64,
    firsts: Vec<u64>,
    pause_after: Option<(u64, u64)>,
    paused_until: u64,
    heartbeats: u64,
    /// Datagrams the recovery server had multicast again.
    repairs_multicast: u64,
    /// Their bytes (on each line).
    repair_bytes_multicast: u64,
}

fn sub_config() -> SubscriberConfig {
    SubscriberConfig {
        channel: CHANNEL,
        max_datagram: MAX_DATAGRAM,
        max_buffered: 4096,
        max_outstanding: 16,
        recovery_timeout_ns: 50_000,
        max_recovery_timeout_ns: 0,
        max_retries: 3,
        snapshot_timeout_ns: 1_000_000,
        ab_grace_ns: 0,
        // Late joins in these simulations are asked to take a snapshot.
        join_replay_max: 0,
        max_request_messages: 1 << 20,
        max_message_bytes: 0,
        gap_tolerance_ns: 0,
        claim_threshold: 4096,
        claim_packets: 3,
        claim_timeout_ns: 20_000_000,
    }
}

/// The recovery server's limits in these simulations: the shipped
/// defaults, but rate limits the heavy-loss scenarios never reach (they
/// measure recovery, not the limits, which have tests of their own) and
/// unicast repair unless a scenario asks for multicast.
fn server_limits() -> RecoveryServerConfig {
    RecoveryServerConfig {
        requests_per_sec: 1_000_000_000,
        request_burst: 1 << 20,
        multicast_repair: false,
        ..RecoveryServerConfig::default()
    }
}

impl Sim {
    fn new(seed: u64, history_depth: usize) -> Self {
        Self::with_limits(seed, history_depth, server_limits())
    }

    fn with_limits(seed: u64, history_depth: usize, limits: RecoveryServerConfig) -> Self {
        let publisher = PublisherState::new(PublisherConfig {
            channel: CHANNEL,
            session: SESSION,
            max_datagram: MAX_DATAGRAM,
            max_messages: 64,
            flush_interval_ns: 1_000,
            history_depth,
            max_message_bytes: 0,
        });
        let identity = Welcome::identity(CHANNEL, SESSION, false, 0x11, [0; 16]);
        let server = RecoveryServer::new(
            ServerConfig {
                limits,
                max_request_messages: 1 << 20,
                snapshot_chunk: 900,
                setup_timeout_ns: 10_000_000,
                outbox_capacity: RC_MSG,
                lines: 2,
            },
            Key::derive(SECRET, Purpose::Recovery),
            identity,
        );
        Sim {
            now: 0,
            rng: SmallRng::seed_from_u64(seed),
            msg_rng: SmallRng::seed_from_u64(seed ^ 0xabcdef),
            // Unpaced, as the simulated publisher always was.
            sched: SendSchedule::new(publisher.next_seq(), 0, 1, HEARTBEAT_INTERVAL),
            publisher,
            server,
            reference: Book::default(),
            subs: Vec::new(),
            queue: BTreeMap::new(),
            next_id: 0,
            datagrams_sent: 0,
            firsts: Vec::new(),
            pause_after: None,
            paused_until: 0,
            heartbeats: 0,
            repairs_multicast: 0,
            repair_bytes_multicast: 0,
        }
    }

    fn add_sub(&mut self, a: LineModel, b: LineModel, attach_after: u64) -> usize {
        self.add_sub_with(sub_config(), a, b, attach_after)
    }

    fn add_sub_with(
        &mut self,
        cfg: SubscriberConfig,
        a: LineModel,
        b: LineModel,
        attach_after: u64,
    ) -> usize {
        // The recovery handshake, as the I/O layers run it: hello with the
        // connect request, welcome with the accept, proof as the first
        // message; the welcome announces the session.
        let handshake =
            ClientHandshake::new(Key::derive(SECRET, Purpose::Recovery), CHANNEL, false);
        let peer = format!("10.0.0.{}:4791", self.subs.len() + 2);
        let (conn, welcome) = self
            .server
            .on_connect_request(self.now, peer, handshake.hello().as_bytes())
            .expect("admitted");
        self.server.on_established(self.now, conn);
        let admitted = handshake.on_welcome(welcome.as_bytes()).expect("welcome");
        let mut state = SubscriberState::new(cfg);
        state.announce_session(self.now, admitted.session);
        let s = self.subs.len();
        self.schedule(
            self.now + RC_LATENCY,
            s,
            Ev::ToServer(admitted.proof.to_vec()),
        );
        self.subs.push(Sub {
            conn,
            state,
            app: Book::default(),
            lines: [a, b],
            attach_after,
            injected: Injected::default(),
            events: Vec::new(),
            not_available: Vec::new(),
            first_gap_at: None,
            first_request_at: None,
        });
        self.subs.len() - 1
    }

    /// A recovery connection that proves the secret and then does what a
    /// test makes it do (no subscriber behind it): its id.
    fn admit_peer(&mut self) -> u32 {
        let handshake =
            ClientHandshake::new(Key::derive(SECRET, Purpose::Recovery), CHANNEL, false);
        let (conn, welcome) = self
            .server
            .on_connect_request(self.now, "10.6.6.6:1".into(), handshake.hello().as_bytes())
            .expect("admitted");
        self.server.on_established(self.now, conn);
        let proof = handshake
            .on_welcome(welcome.as_bytes())
            .expect("welcome")
            .proof;
        self.server
            .on_receive(self.now, conn, &proof, &mut self.publisher, &self.reference);
        assert!(self.server.is_open(conn));
        conn
    }

    /// Peer `conn` asks for `count` messages from `from`: the bytes it sent.
    fn ask(&mut self, conn: u32, from: u64, count: u64) -> u64 {
        let mut b = [0u8; 64];
        let n = RetransmitRequest {
            channel: CHANNEL,
            session: SESSION,
            from_seq: from,
            count,
        }
        .encode(&mut b)
        .expect("fits");
        self.server.on_receive(
            self.now,
            conn,
            &b[..n],
            &mut self.publisher,
            &self.reference,
        );
        n as u64
    }

    /// Takes everything the server queued on `conn`, as a peer that reads
    /// at once: its bytes.
    fn drain(&mut self, conn: u32) -> u64 {
        let mut total = 0;
        while let Some(bytes) = self.server.poll_transmit(conn, RC_MSG) {
            let n = bytes.len();
            total += n as u64;
            self.server.transmitted(self.now, conn, n);
        }
        total
    }

    fn schedule(&mut self, at: u64, sub: usize, ev: Ev) {
        self.queue.insert((at, self.next_id), (sub, ev));
        self.next_id += 1;
    }

    /// Multicasts one datagram on both lines to every attached subscriber.
    fn multicast(&mut self, bytes: Vec<u8>) {
        self.multicast_copy(bytes, false);
    }

    /// Multicasts a datagram; `repair`: a retransmit of one sent before
    /// (subject to the lines' random loss, not to their outages, and not
    /// counted as a new datagram or a loss).
    fn multicast_copy(&mut self, bytes: Vec<u8>, repair: bool) {
        let d = Datagram::parse(&bytes).expect("publisher output parses");
        let data = !d.is_heartbeat() && !repair;
        let index = self.datagrams_sent;
        if data {
            self.firsts.push(d.first_seq());
            self.datagrams_sent += 1;
            if self.pause_after.is_some_and(|(after, _)| index == after) {
                self.paused_until = self.now + self.pause_after.map_or(0, |p| p.1);
            }
        }
        let published = self.publisher.counters().messages;
        for s in 0..self.subs.len() {
            if published < self.subs[s].attach_after {
                continue;
            }
            let mut copies = 0;
            for (li, line) in [Line::A, Line::B].into_iter().enumerate() {
                let m = self.subs[s].lines[li];
                // An outage cuts heartbeats too (up to the first datagram after it).
                let in_outage = !repair
                    && m.outage.is_some_and(|(a, b)| {
                        (a..b).contains(&index) || (!data && (a..=b).contains(&index))
                    });
                if m.cut || in_outage || self.rng.gen_bool(m.drop) {
                    self.subs[s].injected.dropped[li] += 1;
                    continue;
                }
                let mut at = self.now + LINE_LATENCY + m.delay;
                if self.rng.gen_bool(m.reorder) {
                    at += self.rng.gen_range(1_000..20_000);
                    self.subs[s].injected.reordered += 1;
                }
                self.schedule(at, s, Ev::Datagram(line, bytes.clone()));
                self.subs[s].injected.delivered[li] += 1;
                copies += 1;
                if self.rng.gen_bool(m.dup) {
                    self.schedule(at + 1_000, s, Ev::Datagram(line, bytes.clone()));
                    self.subs[s].injected.delivered[li] += 1;
                    if data {
                        self.subs[s].injected.dups[li] += 1;
                    }
                }
            }
            if data && copies == 0 {
                self.subs[s].injected.lost_datagrams += 1;
                self.subs[s].injected.lost_messages += u64::from(d.count());
            }
        }
    }

    /// Multicasts what the publisher's schedule lets out now.
    fn pump(&mut self) {
        while let Some(t) = self.sched.poll_transmit(self.now, &mut self.publisher) {
            let (bytes, end) = match t {
                Transmit::Datagram { end, bytes } => (bytes.to_vec(), Some(end)),
                Transmit::Heartbeat(hb) => (hb.to_vec(), None),
            };
            if let Some(end) = end {
                self.sched.sent(self.now, end);
            } else {
                self.heartbeats += 1;
            }
            self.multicast(bytes);
        }
    }

    fn flush(&mut self) {
        self.publisher.flush();
        self.pump();
    }

    fn publish_one(&mut self) {
        let len = self.msg_rng.gen_range(1..=60);
        let mut msg = [0u8; 60];
        self.msg_rng.fill(&mut msg[..len]);
        let p = self.publisher.publish_flushing(&msg[..len]).expect("fits");
        if p.output.is_due() {
            self.pump();
        }
        // The reference application is fed losslessly: it is the snapshot
        // server and the state every subscriber must converge to.
        self.reference.on_message(p.seq, &msg[..len]);
    }

    /// The RC peer of subscriber `s`: the recovery server, answering from
    /// the publisher's history and the reference application's snapshots.
    fn serve(&mut self, s: usize, bytes: &[u8]) {
        let conn = self.subs[s].conn;
        self.server
            .on_receive(self.now, conn, bytes, &mut self.publisher, &self.reference);
        assert!(self.server.is_open(conn), "{:?}", self.server.counters());
        self.send_answers(s);
    }

    /// Moves what the server queued for subscriber `s` over its RC link,
    /// and multicasts the repairs it chose.
    fn send_answers(&mut self, s: usize) {
        let conn = self.subs[s].conn;
        let mut replies = Vec::new();
        while let Some(bytes) = self.server.poll_transmit(conn, RC_MSG) {
            replies.push(bytes.to_vec());
            let n = bytes.len();
            self.server.transmitted(self.now, conn, n);
        }
        for r in replies {
            self.schedule(self.now + RC_LATENCY, s, Ev::ToSubscriber(r));
        }
        self.pump_repairs();
    }

    /// Multicasts the repair datagrams the server's pacing lets out now.
    fn pump_repairs(&mut self) {
        while let Some((first, _)) = self.server.poll_repair(self.now, &self.publisher) {
            let (_, _, bytes) = self.publisher.sealed_from(first).expect("in the history");
            let d = bytes.to_vec();
            self.repairs_multicast += 1;
            self.repair_bytes_multicast += d.len() as u64;
            self.multicast_copy(d, true);
        }
    }

    /// Drains the subscribers' outputs after an input or a timeout.
    fn collect_outputs(&mut self, s: usize) {
        let sub = &mut self.subs[s];
        if sub
            .state
            .poll_timeout()
            .is_some_and(|t| t.as_nanos() <= self.now)
        {
            sub.state.handle_timeout(self.now, &mut sub.app);
        }
        if sub.first_gap_at.is_none() && sub.state.counters().gaps_detected > 0 {
            sub.first_gap_at = Some(self.now);
        }
        while let Some(ev) = sub.state.poll_event() {
            sub.events.push(ev);
        }
        let mut out = Vec::new();
        while let Some(req) = sub.state.poll_transmit() {
            let mut buf = [0u8; 64];
            let n = req.encode(&mut buf).expect("fits");
            if let Request::Retransmit(r) = req {
                assert!(r.count > 0);
                sub.first_request_at.get_or_insert(self.now);
            }
            out.push(buf[..n].to_vec());
        }
        for o in out {
            self.schedule(self.now + RC_LATENCY, s, Ev::ToServer(o));
        }
    }

    fn deliver_due(&mut self) {
        while let Some(entry) = self.queue.first_entry() {
            if entry.key().0 > self.now {
                break;
            }
            let (s, ev) = entry.remove();
            match ev {
                Ev::Datagram(line, bytes) => {
                    let sub = &mut self.subs[s];
                    sub.state.on_datagram(self.now, line, &bytes, &mut sub.app);
                }
                Ev::ToSubscriber(bytes) => {
                    let sub = &mut self.subs[s];
                    let mut rest = &bytes[..];
                    while let Ok((msg, used)) = wire::decode_recovery(rest) {
                        if let RecoveryMsg::NotAvailable(na) = msg {
                            sub.not_available.push(na);
                        }
                        rest = &rest[used..];
                    }
                    sub.state.on_recovery(self.now, &bytes, &mut sub.app);
                }
                Ev::ToServer(bytes) => self.serve(s, &bytes),
            }
            self.collect_outputs(s);
        }
    }

    /// Publishes `n` messages, one per 100 ns, then runs until every
    /// subscriber has delivered everything (or a time limit is hit).
    fn run(&mut self, n: u64) {
        let target = self.publisher.next_seq() + n;
        while self.publisher.next_seq() < target {
            if self.now >= self.paused_until {
                self.publish_one();
            }
            self.tick();
        }
        self.flush();
        self.converge();
    }

    /// Runs until every subscriber has delivered everything (or a time
    /// limit is hit).
    fn converge(&mut self) {
        let deadline = self.now + 100_000_000;
        let end = self.publisher.next_seq();
        while !self.subs.iter().all(|s| {
            s.state.phase() == Phase::Live && s.state.next_seq() == end && self.queue.is_empty()
        }) {
            assert!(self.now < deadline, "did not converge: {:?}", self.report());
            self.tick();
        }
    }

    fn tick(&mut self) {
        self.publisher.poll_flush(self.now);
        self.sched.handle_timeout(self.now, &self.publisher);
        self.pump();
        self.server.handle_timeout(self.now, &self.publisher);
        if let Some((conn, why)) = self.server.poll_closed(self.now) {
            panic!("the server closed connection {conn}: {why:?}");
        }
        self.pump_repairs();
        self.deliver_due();
        for s in 0..self.subs.len() {
            self.collect_outputs(s);
        }
        self.now += STEP;
    }

    fn report(&self) -> Vec<String> {
        self.subs
            .iter()
            .map(|s| {
                format!(
                    "phase {:?} next {} of {} counters {:?} injected {:?} events {:?}",
                    s.state.phase(),
                    s.state.next_seq(),
                    self.publisher.next_seq(),
                    s.state.counters(),
                    s.injected,
                    s.events
                )
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Scenarios.
// ---------------------------------------------------------------------------

const N: u64 = 50_000;

/// Every message exactly once, in order (the Book asserts order), same count
/// and checksum as the publisher's, and no resync.
fn assert_lossless(sim: &Sim, s: usize) {
    let sub = &sim.subs[s];
    assert_eq!(sub.app.state, sim.reference.state, "{:?}", sim.report());
    assert_eq!(sub.app.state.count, sim.publisher.counters().messages);
    let c = sub.state.counters();
    assert_eq!(
        c.delivered,
        sim.publisher.counters().messages,
        "{:?}",
        sim.report()
    );
    assert_eq!(c.unrecoverable, 0);
    assert_eq!(c.snapshots_applied, 0);
    assert!(sub.events.is_empty(), "{:?}", sub.events);
    assert_eq!(c.malformed_dropped + c.foreign_dropped, 0);
}

/// Counters that must match the injected faults exactly or bound them.
fn assert_counters_match(sim: &Sim, s: usize) {
    let sub = &sim.subs[s];
    let (c, inj) = (sub.state.counters(), sub.injected);
    assert_eq!(c.received_a, inj.delivered[0]);
    assert_eq!(c.received_b, inj.delivered[1]);
    // Messages lost on every line can only have come back by retransmission.
    assert!(c.messages_recovered >= inj.lost_messages, "{c:?} {inj:?}");
    if inj.lost_datagrams > 0 {
        assert!(c.gaps_detected >= 1);
        assert!(c.gaps_detected <= inj.lost_datagrams + inj.reordered);
        assert!(c.retransmit_requests >= 1);
    }
    assert!(c.received_retransmit >= inj.lost_datagrams);
    assert!(sim.publisher.counters().retransmitted_datagrams >= inj.lost_datagrams);
    assert!(c.max_buffered as usize <= sub_config().max_buffered);
    assert_eq!(sub.state.outstanding(), 0);
    assert_eq!(sub.state.buffered(), 0);
}

#[test]
fn one_percent_loss_with_reorder_and_duplicates() {
    let mut sim = Sim::new(1, 4096);
    let a = LineModel {
        drop: 0.01,
        reorder: 0.01,
        dup: 0.01,
        ..Default::default()
    };
    sim.add_sub(a, LineModel::cut(), 0);
    sim.run(N);
    assert_lossless(&sim, 0);
    assert_counters_match(&sim, 0);
    let (c, inj) = (sim.subs[0].state.counters(), sim.subs[0].injected);
    assert!(inj.lost_datagrams > 10 && inj.dups[0] > 10 && inj.reordered > 10);
    assert!(c.duplicates_a >= inj.dups[0]);
    assert!(c.out_of_order_buffered > 0);
}

#[test]
fn ten_percent_loss_recovery_counts_match_exactly() {
    let mut sim = Sim::new(2, 4096);
    let a = LineModel {
        drop: 0.10,
        dup: 0.02,
        ..Default::default()
    };
    sim.add_sub(a, LineModel::cut(), 0);
    sim.run(N);
    assert_lossless(&sim, 0);
    assert_counters_match(&sim, 0);
    let (c, inj) = (sim.subs[0].state.counters(), sim.subs[0].injected);
    // Without reordering, what was lost is exactly what was recovered, and
    // every injected duplicate is dropped as one.
    assert_eq!(c.messages_recovered, inj.lost_messages);
    assert_eq!(c.duplicates_a, inj.dups[0]);
    assert!(inj.lost_datagrams > 100);
}

#[test]
fn ab_thirty_and_one_percent_deliver_everything() {
    let mut sim = Sim::new(3, 4096);
    let a = LineModel {
        drop: 0.30,
        reorder: 0.01,
        ..Default::default()
    };
    let b = LineModel {
        drop: 0.01,
        reorder: 0.01,
        ..Default::default()
    };
    sim.add_sub(a, b, 0);
    sim.run(N);
    assert_lossless(&sim, 0);
    assert_counters_match(&sim, 0);
    let (c, inj) = (sim.subs[0].state.counters(), sim.subs[0].injected);
    assert!(inj.dropped[0] > 1000);
    // Arbitration: most of A's losses were covered by B without recovery.
    assert!(c.messages_recovered < c.delivered / 50, "{c:?}");
    assert!(c.duplicates_a + c.duplicates_b > 0);
}

#[test]
fn ab_one_line_cut_stream_continues() {
    let mut sim = Sim::new(4, 4096);
    sim.add_sub(LineModel::cut(), LineModel::lossy(0.01), 0);
    sim.add_sub(LineModel::lossy(0.01), LineModel::cut(), 0);
    sim.run(N);
    for s in 0..2 {
        assert_lossless(&sim, s);
        assert_counters_match(&sim, s);
    }
    assert_eq!(sim.subs[0].state.counters().received_a, 0);
    assert_eq!(sim.subs[1].state.counters().received_b, 0);
}

#[test]
fn history_too_small_raises_exact_loss_then_resyncs() {
    let depth = 16;
    let mut sim = Sim::new(5, depth);
    // Both lines lose datagrams [100, 400); the publisher then pauses so
    // its history at request time is exactly datagrams [385, 401).
    let outage = LineModel {
        outage: Some((100, 400)),
        ..Default::default()
    };
    sim.add_sub(outage, outage, 0);
    let lossless = sim.add_sub(LineModel::default(), LineModel::cut(), 0);
    sim.pause_after = Some((400, 500_000));
    sim.run(N);

    let expected_from = sim.firsts[100];
    let expected_to = sim.firsts[401 - depth];
    let sub = &sim.subs[0];
    assert_eq!(
        sub.events[..3],
        [
            Event::UnrecoverableLoss {
                from: expected_from,
                to: expected_to
            },
            Event::ResyncStarted,
            Event::SnapshotApplied {
                seq: sim.firsts[401] - 1
            },
        ],
        "{:?}",
        sim.report()
    );
    assert_eq!(sub.not_available[0].oldest_available, expected_to);
    let c = sub.state.counters();
    assert_eq!((c.unrecoverable, c.snapshots_applied), (1, 1));
    // Same final state as the subscriber that lost nothing.
    assert_eq!(sub.app.state, sim.subs[lossless].app.state);
    assert_lossless(&sim, lossless);
}

#[test]
fn late_join_after_100k_converges() {
    let mut sim = Sim::new(6, 4096);
    let a = LineModel::lossy(0.01);
    let early = sim.add_sub(a, LineModel::lossy(0.01), 0);
    let late = sim.add_sub(a, LineModel::lossy(0.01), 100_000);
    sim.run(120_000);
    assert_lossless(&sim, early);
    let sub = &sim.subs[late];
    assert_eq!(sub.app.state, sim.subs[early].app.state);
    assert_eq!(sub.app.state.count, 120_000);
    let c = sub.state.counters();
    assert_eq!(c.snapshots_applied, 1);
    assert_eq!(c.unrecoverable, 0);
    assert!(c.delivered < 25_000, "late joiner saw only the tail: {c:?}");
    assert_eq!(sub.events[0], Event::ResyncStarted);
}

/// Line B lags line A by 3 us; A alone loses datagrams [1000, 1001).
fn skewed_lines(b_loses_too: bool) -> (LineModel, LineModel) {
    let outage = Some((1000, 1001));
    let a = LineModel {
        outage,
        ..Default::default()
    };
    let b = LineModel {
        delay: 3_000,
        outage: outage.filter(|_| b_loses_too),
        ..Default::default()
    };
    (a, b)
}

const GRACE: u64 = 10_000;

fn with_grace() -> SubscriberConfig {
    SubscriberConfig {
        ab_grace_ns: GRACE,
        ..sub_config()
    }
}

#[test]
fn ab_grace_hole_filled_by_line_b_is_never_requested() {
    let mut sim = Sim::new(7, 4096);
    let (a, b) = skewed_lines(false);
    let graced = sim.add_sub_with(with_grace(), a, b, 0);
    let eager = sim.add_sub(a, b, 0);
    sim.run(N);
    for s in [graced, eager] {
        assert_lossless(&sim, s);
    }
    let c = sim.subs[graced].state.counters();
    assert!(c.gaps_detected >= 1, "{c:?}");
    assert_eq!(c.gaps_filled_by_other_line, c.gaps_detected, "{c:?}");
    assert_eq!((c.retransmit_requests, c.received_retransmit), (0, 0));
    // Without the window, the same hole costs a request that B makes moot.
    let e = sim.subs[eager].state.counters();
    assert!(e.retransmit_requests >= 1, "{e:?}");
    assert_eq!(e.gaps_filled_by_other_line, 0);
}

#[test]
fn ab_grace_hole_still_open_is_requested_after_the_window() {
    let mut sim = Sim::new(8, 4096);
    let (a, b) = skewed_lines(true);
    let s = sim.add_sub_with(with_grace(), a, b, 0);
    sim.run(N);
    assert_lossless(&sim, s);
    assert_counters_match(&sim, s);
    let sub = &sim.subs[s];
    let c = sub.state.counters();
    assert_eq!(c.gaps_filled_by_other_line, 0, "{c:?}");
    assert!(c.retransmit_requests >= 1);
    let (gap, req) = (sub.first_gap_at.unwrap(), sub.first_request_at.unwrap());
    assert!(
        (gap + GRACE..=gap + GRACE + STEP).contains(&req),
        "gap seen at {gap}, requested at {req}"
    );
}

#[test]
fn ab_grace_with_heavy_loss_still_delivers_everything() {
    let mut sim = Sim::new(10, 4096);
    let b = LineModel {
        drop: 0.01,
        delay: 3_000,
        ..Default::default()
    };
    let s = sim.add_sub_with(with_grace(), LineModel::lossy(0.30), b, 0);
    sim.run(N);
    assert_lossless(&sim, s);
    let (c, inj) = (sim.subs[s].state.counters(), sim.subs[s].injected);
    assert!(inj.lost_datagrams > 5, "{inj:?}");
    // Only what both lines lost is asked for, and exactly that comes back.
    assert!(c.gaps_filled_by_other_line > 500, "{c:?}");
    assert!(c.retransmit_requests <= inj.lost_datagrams, "{c:?} {inj:?}");
    assert_eq!(c.messages_recovered, inj.lost_messages);
    assert_eq!(c.timeouts, 0);
}

/// The shipped heartbeat rule: none while datagrams flow, one per
/// `heartbeat_interval_ns` of silence, and that is what reveals a lost tail.
#[test]
fn heartbeats_when_idle_reveal_a_lost_tail() {
    let mut sim = Sim::new(11, 4096);
    let s = sim.add_sub(LineModel::default(), LineModel::cut(), 0);
    // Publishing one message per 100 ns never leaves the stream idle.
    let target = sim.publisher.next_seq() + 2_000;
    while sim.publisher.next_seq() < target {
        sim.publish_one();
        sim.tick();
    }
    assert_eq!(sim.heartbeats, 0, "no heartbeat while datagrams flow");
    sim.flush();
    sim.converge();
    // Idle: one heartbeat per interval.
    let (hb, t0) = (sim.heartbeats, sim.now);
    while sim.now < t0 + 10 * HEARTBEAT_INTERVAL {
        sim.tick();
    }
    let idle = sim.heartbeats - hb;
    assert!(
        (9..=11).contains(&idle),
        "{idle} heartbeats in 10 intervals"
    );
    // The last datagram is lost on every line: only a heartbeat tells.
    sim.subs[s].lines = [LineModel::cut(), LineModel::cut()];
    for _ in 0..5 {
        sim.publish_one();
    }
    sim.flush();
    sim.subs[s].lines = [LineModel::default(), LineModel::cut()];
    let lost_at = sim.now;
    sim.converge();
    let sub = &sim.subs[s];
    let c = sub.state.counters();
    assert_eq!(c.messages_recovered, 5, "{c:?}");
    assert!(sub.first_gap_at.unwrap() >= lost_at + HEARTBEAT_INTERVAL);
    assert_lossless(&sim, s);
}

/// A loss on the publisher's egress (every subscriber misses the same
/// datagrams) is repaired by the shipped recovery server's planner with
/// multicast retransmits, not one unicast repair per subscriber.
#[test]
fn shared_loss_is_repaired_on_multicast_by_the_server() {
    let limits = RecoveryServerConfig {
        multicast_repair: true,
        ..server_limits()
    };
    let mut sim = Sim::with_limits(12, 4096, limits);
    let mut lost = Vec::new();
    for k in 0..10 {
        lost.push((100 + 200 * k, 101 + 200 * k));
    }
    for _ in 0..4 {
        let s = sim.add_sub(LineModel::default(), LineModel::cut(), 0);
        sim.subs[s].lines[0].outage = Some(lost[0]);
    }
    // Every subscriber loses the same ten datagrams.
    let mut k = 0;
    let target = sim.publisher.next_seq() + N;
    while sim.publisher.next_seq() < target {
        if sim.datagrams_sent >= lost[k].1 && k + 1 < lost.len() {
            k += 1;
            for s in &mut sim.subs {
                s.lines[0].outage = Some(lost[k]);
            }
        }
        sim.publish_one();
        sim.tick();
    }
    sim.flush();
    sim.converge();
    for s in 0..sim.subs.len() {
        assert_lossless(&sim, s);
        assert_eq!(sim.subs[s].injected.lost_datagrams, 10);
    }
    let r = sim.server.repair_counters();
    assert!(r.multicast >= 1, "{r:?}");
    assert!(sim.repairs_multicast >= 1);
    // Fewer unicast repairs than one per subscriber per loss.
    assert!(r.unicast < 4 * 10, "{r:?}");
    let k = sim.server.counters();
    assert_eq!(k.requests_dropped + k.requests_rate_limited, 0, "{k:?}");
    assert_eq!(sim.server.admitted_connections(), 4);
}

/// The server's admission holds in the simulation too: a client without
/// the secret gets no welcome at all (the subscriber proves first), and a
/// client whose first message on the connection is not its final proof is
/// closed; neither's requests are ever answered.
#[test]
fn a_client_without_the_secret_is_never_served() {
    let mut sim = Sim::new(13, 4096);
    sim.add_sub(LineModel::default(), LineModel::cut(), 0);
    let stranger = ClientHandshake::new(Key::derive(b"wrong", Purpose::Recovery), CHANNEL, false);
    assert_eq!(
        sim.server
            .on_connect_request(0, "10.9.9.9:1".into(), stranger.hello().as_bytes())
            .err(),
        Some(UNPROVED)
    );
    assert_eq!(sim.server.counters().connections_unproved, 1);
    let skipper = ClientHandshake::new(Key::derive(SECRET, Purpose::Recovery), CHANNEL, false);
    let (conn, _) = sim
        .server
        .on_connect_request(0, "10.9.9.9:2".into(), skipper.hello().as_bytes())
        .unwrap();
    sim.server.on_established(0, conn);
    let mut req = [0u8; 64];
    let n = wire::RetransmitRequest {
        channel: CHANNEL,
        session: SESSION,
        from_seq: 1,
        count: 1,
    }
    .encode(&mut req)
    .unwrap();
    sim.server
        .on_receive(0, conn, &req[..n], &mut sim.publisher, &sim.reference);
    assert!(!sim.server.is_open(conn));
    assert_eq!(sim.server.poll_transmit(conn, RC_MSG), None);
    assert_eq!(sim.server.poll_closed(0).map(|c| c.0), Some(conn));
    assert_eq!(sim.server.counters().auth_failures, 1);
    sim.run(1_000);
    assert_lossless(&sim, 0);
}

/// Fills the history (4096 datagrams) with nobody listening.
fn full_history(limits: RecoveryServerConfig) -> Sim {
    let mut sim = Sim::with_limits(14, 4096, limits);
    while sim.publisher.counters().datagrams < 4200 {
        sim.publish_one();
    }
    sim.flush();
    sim
}

/// The finding of issue 41: two admitted peers ask for the same ranges over
/// and over, the second right after the first, so the planner takes every
/// loss for a shared one and answers each first request with a multicast
/// retransmit of the whole range on both lines. For one simulated second,
/// at the request rate the server admits, the publisher sends no more than
/// the bound of `rocebus::mcast::server`: per peer, `repair_burst_bytes +
/// repair_bytes_per_sec * 1 s + lines * repair_request_bytes`.
#[test]
fn two_admitted_peers_cannot_make_the_publisher_send_more_than_the_bound() {
    let limits = RecoveryServerConfig {
        multicast_repair: true,
        ..RecoveryServerConfig::default()
    };
    let mut sim = full_history(limits);
    let peers = [sim.admit_peer(), sim.admit_peer()];
    let (mut bytes_in, mut unicast_out) = (0u64, 0u64);
    let oldest = sim.publisher.oldest_available();
    let end = sim.publisher.unflushed_seq();
    // Ranges of 4096 messages (recovery.max_request_messages), taken in
    // turn: each comes back long after the planner forgot it.
    let ranges = (end - oldest) / 4096;
    let interval = 1_000_000_000 / limits.requests_per_sec;
    let t0 = sim.now;
    let mut k = 0u64;
    while sim.now < t0 + 1_000_000_000 {
        sim.server.handle_timeout(sim.now, &sim.publisher);
        let from = oldest + (k % ranges) * 4096;
        // Each leads in turn, so both budgets are spent.
        let (a, b) = if k % 2 == 0 {
            (peers[0], peers[1])
        } else {
            (peers[1], peers[0])
        };
        bytes_in += sim.ask(a, from, 4096);
        bytes_in += sim.ask(b, from, 4096);
        for p in peers {
            unicast_out += sim.drain(p);
        }
        sim.pump_repairs();
        k += 1;
        sim.now += interval;
    }
    let multicast_out = 2 * sim.repair_bytes_multicast;
    let out = unicast_out + multicast_out;
    let per_peer =
        limits.repair_burst_bytes + limits.repair_bytes_per_sec + 2 * limits.repair_request_bytes;
    let bound = 2 * per_peer;
    let r = sim.server.repair_counters();
    let k = sim.server.counters();
    println!(
        "md-repair-amplification: in {bytes_in} out {out} (unicast {unicast_out}, multicast {multicast_out} on 2 lines) ratio {:.0} bound {bound} ratio-bound {:.0}",
        out as f64 / bytes_in as f64,
        bound as f64 / bytes_in as f64
    );
    assert!(
        r.multicast > 10 && sim.server.repair_counters().covered > 10,
        "{r:?}"
    );
    assert!(
        out <= bound,
        "{out} bytes out for {bytes_in} in (bound {bound}): {r:?} {k:?}"
    );
    assert!(k.repair_budget_dropped > 0, "{k:?}");
}

/// A multicast retransmit larger than the burst goes out at the budget's
/// rate, not at once.
#[test]
fn a_large_multicast_repair_is_spread_over_time() {
    let limits = RecoveryServerConfig {
        multicast_repair: true,
        repair_bytes_per_sec: 1 << 20,
        repair_burst_bytes: 64 << 10,
        repair_request_bytes: 1 << 20,
        ..RecoveryServerConfig::default()
    };
    let mut sim = full_history(limits);
    let (a, b) = (sim.admit_peer(), sim.admit_peer());
    sim.server.handle_timeout(sim.now, &sim.publisher);
    let from = sim.publisher.oldest_available();
    // The second asker of a range turns it into a multicast retransmit.
    sim.ask(a, from, 1 << 20);
    sim.drain(a);
    sim.ask(b, from, 1 << 20);
    assert_eq!(sim.server.repair_counters().multicast, 1);
    let t0 = sim.now;
    let mut released = Vec::new();
    while sim.now < t0 + 5_000_000_000 {
        sim.pump_repairs();
        released.push((sim.now - t0, 2 * sim.repair_bytes_multicast));
        if sim.server.poll_timeout().is_none() {
            break;
        }
        sim.now += 1_000_000;
    }
    let total = released.last().unwrap().1;
    // About 1 MiB on each of two lines: two seconds at 1 MiB/s.
    assert!(total > 3 << 19, "{total}");
    for &(t, bytes) in &released {
        let allowed = (64 << 10) + t * (1 << 20) / 1_000_000_000 + 2 * MAX_DATAGRAM as u64;
        assert!(
            bytes <= allowed,
            "{bytes} bytes out {t} ns in (at most {allowed})"
        );
    }
    let first = released.iter().find(|r| r.1 > 0).unwrap().0;
    let last = released.iter().find(|r| r.1 == total).unwrap().0;
    assert!(
        last - first > 1_500_000_000,
        "spread over {} ns",
        last - first
    );
}

/// A lossy subscriber recovers everything, under the default budget, while
/// two admitted peers ask for the same ranges over and over, the second
/// right after the first (the attack of
/// `two_admitted_peers_cannot_make_the_publisher_send_more_than_the_bound`).
/// A guard that the budget does not starve the honest: it passes without
/// the budget too (the flood then only costs bandwidth here).
#[test]
fn a_lossy_subscriber_recovers_everything_while_two_peers_flood_repairs() {
    let limits = RecoveryServerConfig {
        multicast_repair: true,
        ..server_limits()
    };
    let mut sim = Sim::with_limits(15, 4096, limits);
    let s = sim.add_sub(LineModel::lossy(0.01), LineModel::lossy(0.01), 0);
    let peers = [sim.admit_peer(), sim.admit_peer()];
    let interval = 500_000;
    let mut next_attack = 0;
    let target = sim.publisher.next_seq() + N;
    let mut k = 0u64;
    while sim.publisher.next_seq() < target {
        sim.publish_one();
        sim.tick();
        if sim.now >= next_attack {
            let from = sim.publisher.oldest_available();
            let (a, b) = if k % 2 == 0 {
                (peers[0], peers[1])
            } else {
                (peers[1], peers[0])
            };
            sim.ask(a, from, 4096);
            sim.ask(b, from, 4096);
            for p in peers {
                sim.drain(p);
            }
            k += 1;
            next_attack = sim.now + interval;
        }
    }
    sim.flush();
    sim.converge();
    assert_lossless(&sim, s);
    assert!(sim.subs[s].injected.lost_datagrams > 0);
    assert!(sim.server.repair_counters().multicast > 0);
}
