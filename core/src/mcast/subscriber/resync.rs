//! Where the stream stands when the subscriber cannot take its position on
//! trust: a datagram far ahead of everything known ([`JumpGuard`]: a claim
//! until corroborated, see issue 41's "sequence jumps need corroboration"),
//! and a re-synchronisation's snapshot ([`SnapshotTransfer`]: asked for,
//! received in order, checked whole). Both take sequences, bytes and `now`
//! and say what they make of them; the composing [`SubscriberState`] counts,
//! raises events and calls the application. Neither touches the reorder
//! buffer or the requests in flight.
//!
//! [`SubscriberState`]: super::SubscriberState

use super::wire::SnapshotEnd;
use super::SubscriberConfig;

/// What a live, untagged datagram means for the highest sequence known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Jump {
    /// Within the threshold, and no claim to disprove: take it.
    Within,
    /// Beyond the threshold and not yet corroborated: drop it (a claim).
    Held,
    /// Beyond the threshold, and the claim has stood long enough with
    /// enough datagrams behind it: take it as a real jump.
    Accepted,
    /// New data of the stream while a claim was open: the claim is gone,
    /// take the datagram.
    Disproved,
}

/// A jump beyond the claim threshold not yet corroborated.
#[derive(Debug, Clone, Copy)]
struct Claim {
    /// When its first datagram arrived (no new datagram of the stream since).
    since: u64,
    /// Far-ahead datagrams backing it.
    packets: u32,
}

/// The corroboration rule for far-ahead datagrams (see the subscriber's
/// module documentation): without datagram tags, anyone who can put a
/// datagram of the announced session on the fabric can forge a header, so
/// a jump is believed only once the real stream has not contradicted it for
/// `claim_timeout_ns` and `claim_packets` datagrams.
#[derive(Debug, Clone, Copy)]
pub(super) struct JumpGuard {
    threshold: u64,
    packets: u32,
    timeout_ns: u64,
    claim: Option<Claim>,
}

impl JumpGuard {
    pub(super) fn new(cfg: &SubscriberConfig) -> Self {
        Self {
            threshold: cfg.claim_threshold,
            packets: cfg.claim_packets,
            timeout_ns: cfg.claim_timeout_ns,
            claim: None,
        }
    }

    /// No claim open (the latency path's condition).
    #[inline]
    pub(super) fn is_clear(&self) -> bool {
        self.claim.is_none()
    }

    /// Forgets an open claim (a new session, or a snapshot that set where
    /// the stream stands).
    pub(super) fn clear(&mut self) {
        self.claim = None;
    }

    /// A live datagram `[first, end)` (a heartbeat: announcing `first`)
    /// that is neither a retransmission nor tagged; `known` is the highest
    /// sequence known, `next` the delivery point.
    #[inline]
    pub(super) fn check(
        &mut self,
        now: u64,
        known: u64,
        next: u64,
        first: u64,
        end: u64,
        heartbeat: bool,
    ) -> Jump {
        if first > known.saturating_add(self.threshold) {
            return self.hold(now);
        }
        // New data, or a heartbeat at the highest sequence known: the
        // stream goes on where it was, so the jump was not real.
        let disproves = if heartbeat {
            first >= known
        } else {
            end > next
        };
        if disproves && self.claim.take().is_some() {
            return Jump::Disproved;
        }
        Jump::Within
    }

    /// Counts a far-ahead datagram towards the claim.
    fn hold(&mut self, now: u64) -> Jump {
        let claim = match self.claim {
            Some(c) => Claim {
                packets: c.packets.saturating_add(1),
                ..c
            },
            None => Claim {
                since: now,
                packets: 1,
            },
        };
        if claim.packets >= self.packets && now.saturating_sub(claim.since) >= self.timeout_ns {
            self.claim = None;
            return Jump::Accepted;
        }
        self.claim = Some(claim);
        Jump::Held
    }

    /// After a snapshot that resumes delivery at `next`: how many of the
    /// `buffered` datagrams (`(first, end)`, in order) follow it without a
    /// jump beyond the threshold (any jump when `tagged`), and one past the
    /// last sequence they reach. The rest were never corroborated.
    pub(super) fn corroborated(
        &self,
        next: u64,
        tagged: bool,
        buffered: impl Iterator<Item = (u64, u64)>,
    ) -> (usize, u64) {
        let mut high = next;
        let mut keep = 0;
        for (first, end) in buffered {
            if !tagged && first > high.saturating_add(self.threshold) {
                break;
            }
            high = high.max(end);
            keep += 1;
        }
        (keep, high)
    }
}

#[derive(Debug, Clone)]
struct Receiving {
    seq: u64,
    received: u64,
    crc: crc32fast::Hasher,
}

/// How a snapshot transfer ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Finish {
    /// An empty snapshot with no chunk before it: the application's restore
    /// has to be begun before it is finished.
    pub(super) begin: bool,
    /// Length, sequence and CRC agree with what was received.
    pub(super) valid: bool,
}

/// A re-synchronisation's snapshot: whether to ask for one, when to ask
/// again, and the transfer under way (chunks in order, CRC over them).
#[derive(Debug, Clone)]
pub(super) struct SnapshotTransfer {
    timeout_ns: u64,
    needs_send: bool,
    deadline: u64,
    receiving: Option<Receiving>,
}

impl SnapshotTransfer {
    pub(super) fn new(cfg: &SubscriberConfig) -> Self {
        Self {
            timeout_ns: cfg.snapshot_timeout_ns,
            needs_send: false,
            deadline: 0,
            receiving: None,
        }
    }

    /// Asks for a (new) snapshot, forgetting any transfer under way.
    pub(super) fn request(&mut self, now: u64) {
        self.needs_send = true;
        self.deadline = now + self.timeout_ns;
        self.receiving = None;
    }

    /// A request waits to be sent.
    #[inline]
    pub(super) fn needs_send(&self) -> bool {
        self.needs_send
    }

    /// Takes the request to send, if one waits.
    pub(super) fn take_request(&mut self) -> bool {
        std::mem::take(&mut self.needs_send)
    }

    /// When to ask again without progress.
    pub(super) fn deadline(&self) -> u64 {
        self.deadline
    }

    /// The connection carrying the transfer is gone.
    pub(super) fn abandon(&mut self) {
        self.receiving = None;
    }

    /// A chunk of snapshot `seq` at `offset` (0 begins a transfer: the
    /// application's restore is begun by the caller). Whether it continues
    /// the transfer; the caller rejects the snapshot if not, or else calls
    /// [`progress`](Self::progress) once the application took it.
    pub(super) fn chunk(&mut self, seq: u64, offset: u64, data: &[u8]) -> bool {
        if offset == 0 {
            self.receiving = Some(Receiving {
                seq,
                received: 0,
                crc: crc32fast::Hasher::new(),
            });
        }
        match &mut self.receiving {
            Some(r) if r.seq == seq && r.received == offset => {
                r.received += data.len() as u64;
                r.crc.update(data);
                true
            }
            _ => false,
        }
    }

    /// The transfer moved: the deadline starts again.
    pub(super) fn progress(&mut self, now: u64) {
        self.deadline = now + self.timeout_ns;
    }

    /// The end of a transfer. `None`: the tail of a transfer already
    /// rejected (a new one is asked for; nothing to do).
    pub(super) fn finish(&mut self, end: &SnapshotEnd) -> Option<Finish> {
        let (receiving, begin) = match self.receiving.take() {
            Some(r) => (r, false),
            None if end.total_len == 0 => (
                Receiving {
                    seq: end.snapshot_seq,
                    received: 0,
                    crc: crc32fast::Hasher::new(),
                },
                true,
            ),
            None => return None,
        };
        let valid = receiving.seq == end.snapshot_seq
            && receiving.received == end.total_len
            && receiving.crc.finalize() == end.crc32;
        Some(Finish { begin, valid })
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{
        announced, cfg, datagrams, events, publisher, serve, snapshot_request, transmits, App,
        TIMEOUT,
    };
    use super::super::{wire, Event, Phase, SubscriberConfig};
    use super::*;
    use crate::mcast::snapshot::encode_snapshot;
    use crate::mcast::wire::{decode_recovery, Line, RecoveryMsg};

    fn guard() -> JumpGuard {
        JumpGuard::new(&SubscriberConfig {
            claim_threshold: 100,
            claim_packets: 3,
            claim_timeout_ns: 50,
            ..cfg()
        })
    }

    #[test]
    fn a_far_ahead_datagram_is_held_until_packets_and_time_back_it() {
        let mut g = guard();
        // Known up to 10: 111 is beyond the threshold of 100, 110 is not.
        assert_eq!(g.check(0, 10, 10, 110, 111, false), Jump::Within);
        assert_eq!(g.check(0, 10, 10, 111, 112, false), Jump::Held);
        assert!(!g.is_clear());
        // Enough time but not enough datagrams, then enough datagrams.
        assert_eq!(g.check(60, 10, 10, 112, 113, false), Jump::Held);
        assert_eq!(g.check(60, 10, 10, 113, 114, false), Jump::Accepted);
        assert!(g.is_clear());
        // Enough datagrams but not enough time.
        let mut g = guard();
        for now in 0..3 {
            assert_eq!(g.check(now, 10, 10, 500, 501, true), Jump::Held);
        }
        assert_eq!(g.check(49, 10, 10, 500, 501, true), Jump::Held);
        assert_eq!(g.check(50, 10, 10, 500, 501, true), Jump::Accepted);
    }

    #[test]
    fn new_data_or_a_heartbeat_at_the_top_disproves_a_claim() {
        let mut g = guard();
        assert_eq!(g.check(0, 10, 10, 1_000, 1_001, true), Jump::Held);
        // A stale datagram or heartbeat says nothing.
        assert_eq!(g.check(1, 10, 10, 8, 10, false), Jump::Within);
        assert_eq!(g.check(1, 10, 10, 9, 9, true), Jump::Within);
        assert!(!g.is_clear());
        // New data of the stream.
        assert_eq!(g.check(2, 10, 10, 10, 12, false), Jump::Disproved);
        assert!(g.is_clear());
        // A heartbeat at the highest sequence known.
        assert_eq!(g.check(3, 12, 12, 1_000, 1_000, true), Jump::Held);
        assert_eq!(g.check(4, 12, 12, 12, 12, true), Jump::Disproved);
        // A disproved claim starts again from one datagram and a new clock.
        assert_eq!(g.check(100, 12, 12, 1_000, 1_001, false), Jump::Held);
        assert_eq!(g.check(100, 12, 12, 1_001, 1_002, false), Jump::Held);
        assert_eq!(g.check(149, 12, 12, 1_002, 1_003, false), Jump::Held);
    }

    #[test]
    fn after_a_snapshot_only_the_corroborated_buffer_counts() {
        let g = guard();
        let buffered = [(12, 14), (14, 20), (150, 152), (152, 160)];
        // From 11: 12..20 follow; 150 is beyond 20 + 100.
        assert_eq!(g.corroborated(11, false, buffered.into_iter()), (2, 20));
        // Tagged datagrams are never claims.
        assert_eq!(g.corroborated(11, true, buffered.into_iter()), (4, 160));
        assert_eq!(g.corroborated(11, false, [].into_iter()), (0, 11));
    }

    /// The recovery messages of a snapshot of `data` at `seq`, in chunks.
    fn snapshot(seq: u64, data: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, seq, data, chunk, |m| msgs.push(m.to_vec()));
        msgs
    }

    /// Feeds one snapshot's messages to `t`; what `finish` said.
    fn transfer(t: &mut SnapshotTransfer, msgs: &[Vec<u8>]) -> Option<Option<Finish>> {
        for m in msgs {
            match decode_recovery(m).unwrap().0 {
                RecoveryMsg::SnapshotChunk {
                    snapshot_seq,
                    offset,
                    data,
                    ..
                } => {
                    if !t.chunk(snapshot_seq, offset, data) {
                        return None;
                    }
                }
                RecoveryMsg::SnapshotEnd(end) => return Some(t.finish(&end)),
                other => panic!("{other:?}"),
            }
        }
        panic!("no end")
    }

    #[test]
    fn a_snapshot_is_taken_whole_in_order_or_not_at_all() {
        let mut t = SnapshotTransfer::new(&cfg());
        t.request(5);
        assert!(t.needs_send());
        assert_eq!(t.deadline(), 5 + 10 * TIMEOUT);
        assert!(t.take_request());
        assert!(!t.take_request(), "asked once");
        let msgs = snapshot(4, &[1; 10], 4);
        let ok = Some(Some(Finish {
            begin: false,
            valid: true,
        }));
        assert_eq!(transfer(&mut t, &msgs), ok);
        // A missing chunk.
        let mut gap = msgs.clone();
        gap.remove(1);
        assert_eq!(transfer(&mut t, &gap), None);
        // Chunks of another snapshot in the middle.
        let mut mixed = msgs.clone();
        mixed[1] = snapshot(5, &[1; 10], 4)[1].clone();
        assert_eq!(transfer(&mut t, &mixed), None);
        // The caller rejects the snapshot and asks again; the end of the
        // transfer it rejected is a tail to ignore.
        t.request(1);
        assert_eq!(transfer(&mut t, &msgs[3..]), Some(None));
        // Data that does not match the CRC.
        let mut bad = msgs.clone();
        let n = bad[1].len();
        bad[1][n - 1] ^= 1;
        assert_eq!(
            transfer(&mut t, &bad),
            Some(Some(Finish {
                begin: false,
                valid: false
            }))
        );
        // Link lost in the middle: the transfer is gone.
        assert!(t.chunk(4, 0, &[1; 4]));
        t.abandon();
        assert_eq!(transfer(&mut t, &msgs[1..]), None);
    }

    #[test]
    fn an_empty_snapshot_begins_the_restore_it_finishes() {
        let mut t = SnapshotTransfer::new(&cfg());
        t.request(0);
        assert_eq!(
            transfer(&mut t, &snapshot(9, &[], 4)),
            Some(Some(Finish {
                begin: true,
                valid: true
            }))
        );
    }

    fn claiming() -> SubscriberConfig {
        SubscriberConfig {
            claim_threshold: 100,
            claim_packets: 3,
            claim_timeout_ns: 50 * TIMEOUT,
            max_buffered: 64,
            ..cfg()
        }
    }

    /// A heartbeat of session 1 on channel 3 claiming `first_seq`, as anyone
    /// on the fabric can send it when tags are off.
    fn forged_heartbeat(first_seq: u64) -> Vec<u8> {
        let mut hb = vec![0; wire::DATAGRAM_HEADER_LEN];
        wire::write_datagram_header(&mut hb, Line::A, 3, 1, first_seq, 0).expect("fits");
        hb
    }

    #[test]
    fn forged_far_ahead_heartbeat_loses_no_real_message() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 300);
        let mut s = announced(claiming());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        let forged = forged_heartbeat(3 + 999_000);
        let mut now = 0;
        let mut asked = Vec::new();
        for (i, d) in ds.iter().enumerate().skip(1) {
            if i % 10 == 1 {
                s.on_datagram(now, Line::A, &forged, &mut app);
            }
            // Slow enough that an open request would time out and give up.
            now += 2 * TIMEOUT;
            s.handle_timeout(now, &mut app);
            asked.extend(transmits(&mut s));
            s.on_datagram(now, Line::A, d, &mut app);
            asked.extend(transmits(&mut s));
        }
        assert_eq!(
            app.seqs,
            (1..=600).collect::<Vec<_>>(),
            "every real message"
        );
        assert_eq!(asked, [], "no request");
        assert_eq!(events(&mut s), [], "no loss, no resync");
        let c = s.counters();
        assert_eq!(
            (c.gaps_detected, c.unrecoverable, c.claims_accepted),
            (0, 0, 0)
        );
        assert_eq!((c.claimed, c.claims_disproved), (30, 30));
    }

    /// Issue 41: a forged heartbeat slightly ahead of the stream (within
    /// the claim threshold, so a hole like any) just before the stream goes
    /// quiet. The subscriber asks for the range; the publisher answers it was
    /// never published; the range is forgotten: nothing declared lost, no
    /// resync, no skip (gap-tolerant), and the real messages of those
    /// sequences, published later, are delivered. Without the answer the
    /// retries ran out: a loss declared and a resync (strict), or the range
    /// skipped and the real messages dropped when they came (gap-tolerant).
    #[test]
    fn a_forged_heartbeat_slightly_ahead_of_a_quiet_stream_is_forgotten_not_lost() {
        for gap_tolerance_ns in [0, 3 * TIMEOUT] {
            let mut p = publisher(1);
            let ds = datagrams(&mut p, 3); // 1..=6
            let mut s = announced(SubscriberConfig {
                gap_tolerance_ns,
                ..claiming()
            });
            let mut app = App::default();
            for d in &ds {
                s.on_datagram(0, Line::A, d, &mut app);
            }
            s.on_datagram(0, Line::A, &forged_heartbeat(7 + 20), &mut app);
            assert_eq!(
                s.counters().gaps_detected,
                1,
                "within the threshold: a hole"
            );
            // Quiet for longer than every retry and the gap tolerance take.
            let mut now = 0;
            for _ in 0..10 {
                serve(&mut p, &mut s, &mut app, now);
                now += 2 * TIMEOUT;
                s.handle_timeout(now, &mut app);
            }
            assert_eq!(events(&mut s), [], "no loss, no resync, no skip");
            let c = s.counters();
            assert_eq!(
                (c.unrecoverable, c.snapshot_requests, c.gaps_skipped),
                (0, 0, 0),
                "{c:?}"
            );
            assert_eq!(c.not_yet_published, 1, "{c:?}");
            assert!(!s.expects_recovery(), "nothing left asked for");
            // The real messages of those sequences come later.
            for d in datagrams(&mut p, 15) {
                s.on_datagram(now, Line::A, &d, &mut app);
            }
            assert_eq!(app.seqs, (1..=36).collect::<Vec<_>>(), "{gap_tolerance_ns}");
        }
    }

    #[test]
    fn a_real_jump_on_the_bus_is_requested_after_the_claim_timeout() {
        let mut p = publisher(1);
        // All within the publisher's history (64 datagrams).
        let ds = datagrams(&mut p, 64);
        let mut s = announced(claiming());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[0], &mut app);
        // 54 datagrams (108 messages, beyond the threshold of 100) lost on
        // the fabric: what follows is a claim until it has stood long enough.
        let mut now = 0;
        let mut taken = None;
        for (i, d) in ds.iter().enumerate().skip(55) {
            now += 10 * TIMEOUT;
            s.on_datagram(now, Line::A, d, &mut app);
            if s.outstanding() > 0 {
                taken = Some(i);
                break;
            }
        }
        let i = taken.expect("the jump is taken");
        assert!(now >= 50 * TIMEOUT, "not before the claim timeout");
        assert_eq!(s.counters().claims_accepted, 1);
        // The datagrams dropped as claims are part of the one hole asked for.
        serve(&mut p, &mut s, &mut app, now);
        assert_eq!(s.counters().retransmit_requests, 1);
        assert_eq!(app.seqs, (1..=2 * i as u64 + 2).collect::<Vec<_>>());
    }

    #[test]
    fn a_heartbeat_seen_while_resyncing_does_not_survive_the_snapshot() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 5);
        let mut s = announced(claiming());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[3], &mut app); // [7,9): late join
        assert_eq!(s.phase(), Phase::Resyncing);
        s.on_datagram(0, Line::A, &forged_heartbeat(1_000_000), &mut app);
        s.on_datagram(0, Line::A, &ds[4], &mut app);
        transmits(&mut s);
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, &[7; 10], 30, |m| msgs.push(m.to_vec()));
        for m in &msgs {
            s.on_recovery(1, m, &mut app);
        }
        assert_eq!(s.phase(), Phase::Live);
        serve(&mut p, &mut s, &mut app, 2);
        assert_eq!(app.seqs, (5..=10).collect::<Vec<_>>());
        // Only the hole before the buffered datagrams was asked for.
        assert_eq!(s.counters().retransmit_requests, 1);
        assert_eq!(transmits(&mut s), []);
        s.handle_timeout(100 * TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s), [], "nothing beyond 10 is missing");
        assert_eq!(
            events(&mut s).last(),
            Some(&Event::SnapshotApplied { seq: 4 })
        );
    }

    #[test]
    fn bad_snapshots_are_rejected_and_requested_again() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 3);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[2], &mut app);
        transmits(&mut s);
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, &[1; 10], 4, |m| msgs.push(m.to_vec()));
        // A missing chunk.
        for (i, m) in msgs.iter().enumerate() {
            if i != 1 {
                s.on_recovery(1, m, &mut app);
            }
        }
        assert_eq!(s.phase(), Phase::Resyncing);
        assert_eq!(transmits(&mut s).len(), 1, "asked again");
        // The application refuses it.
        app.refuse = true;
        for m in &msgs {
            s.on_recovery(2, m, &mut app);
        }
        assert_eq!(s.phase(), Phase::Resyncing);
        assert_eq!(s.counters().snapshots_rejected, 2);
        // No progress until the deadline: asked again.
        transmits(&mut s);
        s.handle_timeout(2 + 10 * TIMEOUT, &mut app);
        assert_eq!(transmits(&mut s).len(), 1);
        app.refuse = false;
        for m in &msgs {
            s.on_recovery(3, m, &mut app);
        }
        assert_eq!(s.phase(), Phase::Live);
        assert_eq!(app.seqs, vec![5, 6]);
    }

    #[test]
    fn late_join_restores_then_delivers_buffered() {
        let mut p = publisher(1);
        let ds = datagrams(&mut p, 5);
        let mut s = announced(cfg());
        let mut app = App::default();
        s.on_datagram(0, Line::A, &ds[3], &mut app); // [7,9): late join
        s.on_datagram(0, Line::A, &ds[4], &mut app);
        assert_eq!(s.phase(), Phase::Resyncing);
        assert_eq!(events(&mut s), vec![Event::ResyncStarted]);
        assert_eq!(transmits(&mut s), vec![snapshot_request()]);
        // Snapshot taken at 4: [5,7) must come from the history.
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, &[7; 100], 30, |m| msgs.push(m.to_vec()));
        for m in &msgs {
            s.on_recovery(1, m, &mut app);
        }
        assert_eq!(app.restored, Some(4));
        assert_eq!(app.staged, vec![7; 100]);
        assert!(app.seqs.is_empty());
        serve(&mut p, &mut s, &mut app, 2);
        assert_eq!(app.seqs, (5..=10).collect::<Vec<_>>());
        assert_eq!(s.counters().snapshots_applied, 1);
    }
}
