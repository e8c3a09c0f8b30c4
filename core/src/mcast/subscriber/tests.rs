//! Tests of the composed subscriber: whole streams through
//! [`SubscriberState`], with a real publisher where it helps. Each part's
//! own contract is tested in its file.

use super::*;
use crate::mcast::publisher::{PublisherConfig, PublisherState, RetransmitReply};
use crate::mcast::snapshot::{encode_snapshot, NoSnapshots, RestoreError};
use crate::mcast::wire::NotAvailable;

pub(super) const TIMEOUT: u64 = 1_000;

pub(super) fn cfg() -> SubscriberConfig {
    SubscriberConfig {
        channel: 3,
        max_datagram: 256,
        max_buffered: 8,
        max_outstanding: 2,
        recovery_timeout_ns: TIMEOUT,
        max_recovery_timeout_ns: 0,
        max_retries: 2,
        snapshot_timeout_ns: 10 * TIMEOUT,
        ab_grace_ns: 0,
        join_replay_max: 0,
        max_request_messages: 1 << 20,
        max_message_bytes: 1 << 16,
        gap_tolerance_ns: 0,
        claim_threshold: 1 << 20,
        claim_packets: 1,
        claim_timeout_ns: 0,
    }
}

/// A subscriber that was told session 1 over its recovery connection.
pub(super) fn announced(cfg: SubscriberConfig) -> SubscriberState {
    let mut s = SubscriberState::new(cfg);
    s.announce_session(0, 1);
    s
}

fn publisher_config(session: u64) -> PublisherConfig {
    PublisherConfig {
        channel: 3,
        session,
        max_datagram: 256,
        max_messages: 2,
        flush_interval_ns: 0,
        history_depth: 64,
        max_message_bytes: 1 << 16,
    }
}

pub(super) fn publisher(session: u64) -> PublisherState {
    PublisherState::new(publisher_config(session))
}

/// Publishes two messages per datagram; returns the datagrams.
pub(super) fn datagrams(p: &mut PublisherState, n: usize) -> Vec<Vec<u8>> {
    (0..n)
        .map(|_| {
            for _ in 0..2 {
                let seq = p.next_seq();
                p.publish(&seq.to_le_bytes()).unwrap();
            }
            p.flush().unwrap().to_vec()
        })
        .collect()
}

/// Records deliveries; restores a snapshot made of the last seq.
#[derive(Default)]
pub(super) struct App {
    pub(super) seqs: Vec<u64>,
    pub(super) staged: Vec<u8>,
    pub(super) restored: Option<u64>,
    pub(super) refuse: bool,
}

impl Handler for App {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        assert_eq!(msg, seq.to_le_bytes());
        self.seqs.push(seq);
    }
}

impl SnapshotSink for App {
    fn begin_restore(&mut self) {
        self.staged.clear();
    }
    fn restore_chunk(&mut self, data: &[u8]) -> Result<(), RestoreError> {
        self.staged.extend_from_slice(data);
        Ok(())
    }
    fn finish_restore(&mut self, seq: u64) -> Result<(), RestoreError> {
        if self.refuse {
            return Err(RestoreError);
        }
        self.restored = Some(seq);
        Ok(())
    }
}

pub(super) fn transmits(s: &mut SubscriberState) -> Vec<Request> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}
pub(super) fn events(s: &mut SubscriberState) -> Vec<Event> {
    std::iter::from_fn(|| s.poll_event()).collect()
}
pub(super) fn retransmit(from_seq: u64, count: u64) -> Request {
    Request::Retransmit(RetransmitRequest {
        channel: 3,
        session: 1,
        from_seq,
        count,
    })
}
/// The snapshot request of channel 3, session 1.
pub(super) fn snapshot_request() -> Request {
    Request::Snapshot {
        channel: 3,
        session: 1,
    }
}

/// A NotAvailable answer for `[from_seq, from_seq + count)`, encoded.
pub(super) fn not_available(from_seq: u64, count: u64, oldest_available: u64) -> Vec<u8> {
    let mut buf = [0u8; 64];
    let na = NotAvailable {
        channel: 3,
        session: 1,
        from_seq,
        count,
        oldest_available,
    };
    let n = na.encode(&mut buf).unwrap();
    buf[..n].to_vec()
}

/// Answers every retransmit request from `p` into `s`.
pub(super) fn serve(
    p: &mut PublisherState,
    s: &mut SubscriberState,
    app: &mut (impl Handler + SnapshotSink),
    now: u64,
) {
    for req in transmits(s) {
        let Request::Retransmit(r) = req else {
            continue;
        };
        let mut replies = Vec::new();
        p.answer_retransmit(&r, |rep| {
            let mut buf = [0u8; 512];
            let n = match rep {
                RetransmitReply::Data(d) => wire::encode_retransmit_data(&mut buf, 3, 1, d),
                RetransmitReply::NotAvailable(na) => na.encode(&mut buf),
            }
            .unwrap();
            replies.push(buf[..n].to_vec());
        });
        for r in replies {
            s.on_recovery(now, &r, app);
        }
    }
}

/// The latency path (one-message datagrams in the steady state) and the
/// full path (`one_message` unset) agree on what is delivered, counted,
/// requested and raised, over a stream with duplicates, a gap and its
/// repair, heartbeats, foreign, stale and malformed datagrams; with
/// tags on, also over datagrams whose tag is wrong or missing where the
/// latency path would otherwise take them.
#[test]
fn latency_path_agrees_with_the_full_path() {
    latency_path_agrees(None);
    latency_path_agrees(Some(DatagramKey::derive(b"s3cret")));
}

fn latency_path_agrees(key: Option<DatagramKey>) {
    let mut p = PublisherState::new(PublisherConfig {
        max_messages: 1,
        ..publisher_config(1)
    });
    p.set_datagram_key(key.clone());
    let one: Vec<Vec<u8>> = (0..12)
        .map(|_| {
            let seq = p.next_seq();
            p.publish(&seq.to_le_bytes()).unwrap();
            p.flush().unwrap().to_vec()
        })
        .collect();
    // A changed datagram, tagged again by whoever holds the key (the
    // foreign, stale and malformed ones are well tagged: the checks
    // after the tag's are what they exercise).
    let tag_len = if key.is_some() { DATAGRAM_TAG_LEN } else { 0 };
    let change = |d: &[u8], f: &dyn Fn(&mut Vec<u8>)| {
        let mut body = d[..d.len() - tag_len].to_vec();
        f(&mut body);
        if let Some(key) = &key {
            let tag = key.tag(&body);
            body.extend_from_slice(&tag);
        }
        body
    };
    let foreign = change(&one[0], &|d| d[4] = 9); // channel 9
    let stale = change(&one[1], &|d| d[8] = 7); // session 7
    let bad_line = change(&one[1], &|d| d[3] = 5);
    let short = change(&one[1], &|d| {
        d.pop();
    });
    let heartbeat = {
        let mut h = vec![0u8; wire::DATAGRAM_HEADER_LEN];
        wire::write_datagram_header(&mut h, Line::A, 3, 1, 5, 0).unwrap();
        if let Some(key) = &key {
            let tag = key.tag(&h);
            h.extend_from_slice(&tag);
        }
        h
    };
    // Wrong and missing tags on the next datagram in order.
    let mut bad_tag = one[1].clone();
    *bad_tag.last_mut().unwrap() ^= 1;
    let untagged = one[1][..one[1].len() - tag_len].to_vec();
    let mut script: Vec<(Line, &[u8])> = vec![
        (Line::A, &one[0]),
        (Line::B, &one[0]),
        (Line::A, &foreign),
        (Line::A, &stale),
        (Line::A, &bad_line),
        (Line::A, &short),
    ];
    if key.is_some() {
        script.extend([(Line::A, &bad_tag[..]), (Line::B, &untagged[..])]);
    }
    let repair_at = script.len() + 9;
    script.extend([
        (Line::B, &one[1][..]),
        (Line::A, &one[1]),
        (Line::A, &one[3]), // 3 missing
        (Line::A, &heartbeat),
        (Line::A, &one[4]),
        (Line::B, &one[2]), // 3, from the other line
        (Line::A, &one[5]),
        (Line::A, &one[6]),
        (Line::A, &one[8]), // 8 missing: retransmitted below
        (Line::A, &one[9]),
        (Line::A, &one[10]),
        (Line::A, &one[11]),
    ]);
    let run = |fast: bool| {
        let mut s = announced(cfg());
        s.set_datagram_key(key.clone());
        // Tags or not, an announced session has the latency path.
        assert!(s.one_message.is_some());
        if !fast {
            s.one_message = None;
        }
        let mut app = App::default();
        let mut requests = Vec::new();
        let mut taken = Vec::new();
        for (i, (line, d)) in script.iter().enumerate() {
            taken.push(s.on_datagram(i as u64, *line, d, &mut app));
            requests.extend(transmits(&mut s));
            if i == repair_at {
                let mut buf = [0u8; 512];
                let n = wire::encode_retransmit_data(&mut buf, 3, 1, &one[7]).unwrap();
                s.on_recovery(i as u64, &buf[..n], &mut app);
            }
        }
        (
            app.seqs,
            taken,
            requests,
            events(&mut s),
            s.counters(),
            s.next_seq(),
        )
    };
    let fast = run(true);
    assert_eq!(fast, run(false));
    assert_eq!(fast.0, (1..=12).collect::<Vec<_>>());
    assert_eq!(fast.4.foreign_dropped, 1);
    assert_eq!(fast.4.wrong_session_dropped, 1);
    assert_eq!(fast.4.malformed_dropped, 2);
    assert_eq!(fast.4.duplicates_b, 1);
    assert_eq!(fast.4.duplicates_a, 1);
    assert_eq!(fast.4.bad_tag_dropped, if key.is_some() { 2 } else { 0 });
    assert_eq!(fast.4.delivered, 12);
}

#[test]
fn a_closure_subscriber_is_told_what_a_snapshot_skipped() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 5);
    let mut s = announced(cfg());
    let mut seen: Vec<u64> = Vec::new();
    let mut gaps: Vec<(u64, u64)> = Vec::new();
    {
        struct Both<'a>(&'a mut Vec<u64>, &'a mut Vec<(u64, u64)>);
        impl Handler for Both<'_> {
            fn on_message(&mut self, seq: u64, _: &[u8]) {
                self.0.push(seq);
            }
            fn on_gap(&mut self, from: u64, to: u64) {
                self.1.push((from, to));
            }
        }
        let mut app = NoSnapshots::new(Both(&mut seen, &mut gaps));
        s.on_datagram(0, Line::A, &ds[3], &mut app); // [7,9): late join
        s.on_datagram(0, Line::A, &ds[4], &mut app);
        assert_eq!(s.phase(), Phase::Resyncing);
        transmits(&mut s);
        let mut msgs = Vec::new();
        encode_snapshot(3, 1, 4, &[7; 100], 30, |m| msgs.push(m.to_vec()));
        for m in &msgs {
            s.on_recovery(1, m, &mut app);
        }
        serve(&mut p, &mut s, &mut app, 2);
    }
    assert_eq!(
        gaps,
        vec![(1, 5)],
        "sequences 1-4 are in the snapshot it skipped"
    );
    assert_eq!(seen, (5..=10).collect::<Vec<_>>());
    assert_eq!(s.counters().snapshots_applied, 1);
    // A plain closure is a handler too (no gap callback).
    let mut n = 0;
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 2);
    let mut s = announced(cfg());
    {
        let mut app = NoSnapshots::new(|_: u64, _: &[u8]| n += 1);
        for d in &ds {
            s.on_datagram(0, Line::A, d, &mut app);
        }
    }
    assert_eq!(n, 4);
}

#[test]
fn lost_first_datagrams_within_join_replay_max_come_from_history() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 5);
    let mut s = announced(SubscriberConfig {
        join_replay_max: 6,
        ..cfg()
    });
    let mut app = App::default();
    // [1,7) never arrived: [7,9) starts 6 messages in, within the window.
    s.on_datagram(0, Line::A, &ds[3], &mut app);
    assert_eq!(s.phase(), Phase::Live);
    assert!(events(&mut s).is_empty(), "no resync");
    serve(&mut p, &mut s, &mut app, 1);
    assert_eq!(app.seqs, (1..=8).collect::<Vec<_>>());
    assert_eq!(s.counters().retransmit_requests, 1);
    s.on_datagram(2, Line::A, &ds[4], &mut app);
    assert_eq!(app.seqs, (1..=10).collect::<Vec<_>>());
    assert_eq!(s.counters().snapshot_requests, 0);
    // One message further in is a late join.
    let mut s = announced(SubscriberConfig {
        join_replay_max: 5,
        ..cfg()
    });
    s.on_datagram(0, Line::A, &ds[3], &mut App::default());
    assert_eq!(s.phase(), Phase::Resyncing);
}

#[test]
fn only_the_announced_session_is_followed() {
    let mut p1 = publisher(1);
    let mut s = announced(cfg());
    let mut app = App::default();
    let old = datagrams(&mut p1, 2);
    assert!(s.on_datagram(0, Line::A, &old[0], &mut app));
    // A restarted publisher's datagrams (or a forger's, whatever session
    // they claim) are dropped until the session is announced.
    let mut p2 = publisher(2);
    let new = datagrams(&mut p2, 1);
    assert!(!s.on_datagram(1, Line::A, &new[0], &mut app));
    let mut forged = publisher(u64::MAX);
    let forged = datagrams(&mut forged, 1);
    assert!(!s.on_datagram(1, Line::A, &forged[0], &mut app));
    assert_eq!((s.session(), s.phase()), (1, Phase::Live));
    assert_eq!(s.counters().wrong_session_dropped, 2);
    assert!(events(&mut s).is_empty());
    assert!(s.on_datagram(1, Line::A, &old[1], &mut app));
    assert_eq!(app.seqs, vec![1, 2, 3, 4]);
    // Announced over the recovery connection: reset and resync.
    s.announce_session(2, 2);
    s.announce_session(2, 2);
    assert_eq!(s.session(), 2);
    assert_eq!(s.phase(), Phase::Resyncing);
    assert_eq!(
        events(&mut s),
        vec![
            Event::SessionChanged { old: 1, new: 2 },
            Event::ResyncStarted
        ]
    );
    assert!(!s.on_datagram(2, Line::B, &old[1], &mut app));
    assert_eq!(s.counters().wrong_session_dropped, 3);
    assert!(s.on_datagram(2, Line::A, &new[0], &mut app));
    // Empty snapshot of the new session at 0: deliver from 1.
    let mut msgs = Vec::new();
    encode_snapshot(3, 2, 0, &[], 64, |m| msgs.push(m.to_vec()));
    s.on_recovery(3, &msgs[0], &mut app);
    assert_eq!(app.seqs, vec![1, 2, 3, 4, 1, 2]);
    assert_eq!(s.counters().session_changes, 1);
}

#[test]
fn nothing_is_accepted_before_a_session_is_announced() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 1);
    let mut s = SubscriberState::new(cfg());
    let mut app = App::default();
    assert!(!s.on_datagram(0, Line::A, &ds[0], &mut app));
    assert_eq!(
        (s.phase(), s.counters().wrong_session_dropped),
        (Phase::Idle, 1)
    );
    s.announce_session(1, 1);
    assert!(events(&mut s).is_empty());
    assert!(s.on_datagram(1, Line::A, &ds[0], &mut app));
    assert_eq!(app.seqs, vec![1, 2]);
}

#[test]
fn datagram_tags_are_required_when_on() {
    let key = DatagramKey::derive(b"s3cret");
    let mut p = publisher(1);
    p.set_datagram_key(Some(key.clone()));
    let ds = datagrams(&mut p, 3);
    let mut s = announced(cfg());
    s.set_datagram_key(Some(key));
    let mut app = App::default();
    // Untagged, tagged with another key, altered, too short: dropped.
    let mut plain = publisher(1);
    let untagged = datagrams(&mut plain, 1);
    assert!(!s.on_datagram(0, Line::A, &untagged[0], &mut app));
    let mut other = publisher(1);
    other.set_datagram_key(Some(DatagramKey::derive(b"guess")));
    let wrong = datagrams(&mut other, 1);
    assert!(!s.on_datagram(0, Line::A, &wrong[0], &mut app));
    let mut altered = ds[0].clone();
    altered[30] ^= 1;
    assert!(!s.on_datagram(0, Line::A, &altered, &mut app));
    assert!(!s.on_datagram(0, Line::A, &[1, 2, 3], &mut app));
    assert_eq!(s.counters().bad_tag_dropped, 4);
    assert_eq!(s.phase(), Phase::Idle);
    // Tagged by the publisher: delivered, out of order too (the buffered
    // copy is kept without its tag and parsed again when drained).
    assert!(s.on_datagram(0, Line::A, &ds[0], &mut app));
    assert!(s.on_datagram(0, Line::A, &ds[2], &mut app));
    assert!(s.on_datagram(0, Line::B, &ds[1], &mut app));
    assert_eq!(app.seqs, vec![1, 2, 3, 4, 5, 6]);
    // The heartbeat is tagged too.
    let hb = p.heartbeat().to_vec();
    assert!(s.on_datagram(0, Line::A, &hb, &mut app));
    assert_eq!(s.counters().bad_tag_dropped, 4);
}

#[test]
fn bad_input_is_counted_not_fatal() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 1);
    let mut s = announced(cfg());
    let mut app = App::default();
    assert!(!s.on_datagram(0, Line::A, &ds[0][..10], &mut app));
    s.on_datagram(0, Line::A, &[0u8; 300], &mut app);
    s.on_recovery(0, &[1, 2, 3], &mut app);
    let mut other = PublisherState::new(PublisherConfig {
        channel: 4,
        ..*p.config()
    });
    other.publish(b"x").unwrap();
    s.on_datagram(0, Line::A, other.flush().unwrap(), &mut app);
    let c = s.counters();
    assert_eq!((c.malformed_dropped, c.foreign_dropped), (3, 1));
    assert_eq!(s.phase(), Phase::Idle);
    s.receive_queue_low();
    assert_eq!(s.counters().receive_queue_low, 1);
}

#[test]
fn buffer_overflow_is_unrecoverable() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 12);
    let mut s = announced(cfg());
    let mut app = App::default();
    s.on_datagram(0, Line::A, &ds[0], &mut app);
    for d in &ds[2..10] {
        s.on_datagram(0, Line::A, d, &mut app); // fills the 8 slots
    }
    assert!(events(&mut s).is_empty());
    s.on_datagram(0, Line::A, &ds[10], &mut app);
    assert_eq!(
        events(&mut s),
        vec![
            Event::UnrecoverableLoss { from: 3, to: 5 },
            Event::ResyncStarted
        ]
    );
    assert_eq!(s.buffered(), 8);
    assert_eq!(s.counters().evicted, 1);
    // Snapshot at 6 then the rest of the buffer delivers 7..=22.
    let mut msgs = Vec::new();
    encode_snapshot(3, 1, 6, &[], 64, |m| msgs.push(m.to_vec()));
    s.on_recovery(1, &msgs[0], &mut app);
    assert_eq!(app.seqs[2..], (7..=22).collect::<Vec<_>>());
}

// -- large messages and gap-tolerant delivery ---------------------------

/// Records whole messages and reported gaps.
#[derive(Default)]
pub(super) struct Rec {
    pub(super) msgs: Vec<(u64, Vec<u8>)>,
    pub(super) gaps: Vec<(u64, u64)>,
}

impl Handler for Rec {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.msgs.push((seq, msg.to_vec()));
    }
    fn on_gap(&mut self, from: u64, to: u64) {
        self.gaps.push((from, to));
    }
}

impl SnapshotSink for Rec {
    fn begin_restore(&mut self) {}
    fn restore_chunk(&mut self, _: &[u8]) -> Result<(), RestoreError> {
        Ok(())
    }
    fn finish_restore(&mut self, _: u64) -> Result<(), RestoreError> {
        Ok(())
    }
}

pub(super) fn tolerant() -> SubscriberConfig {
    SubscriberConfig {
        gap_tolerance_ns: 5 * TIMEOUT,
        max_retries: 100,
        ..cfg()
    }
}

/// Message `i` of `len` bytes: recognisable at every offset.
fn big(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|k| (k as u64).wrapping_mul(31).wrapping_add(i * 7) as u8)
        .collect()
}

/// Every sealed datagram from `from` on, and the next sequence.
fn sealed_since(p: &PublisherState, mut from: u64) -> (Vec<Vec<u8>>, u64) {
    let mut out = Vec::new();
    while let Some((_, end, bytes)) = p.sealed_from(from) {
        out.push(bytes.to_vec());
        from = end;
    }
    (out, from)
}

#[test]
fn large_messages_are_fragmented_and_reassembled_across_loss() {
    let mut p = PublisherState::new(PublisherConfig {
        history_depth: 512,
        ..*publisher(1).config()
    });
    let chunk = p.fragment_chunk_len();
    assert_eq!(chunk, 256 - 24 - 2 - 8);
    let mut s = announced(SubscriberConfig {
        max_buffered: 64,
        max_outstanding: 8,
        join_replay_max: 1 << 20,
        ..cfg()
    });
    let mut app = Rec::default();
    let mut expected = Vec::new();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut sent = 1;
    let mut lost = 0;
    let mut now = 0;
    for i in 0..200u64 {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // Small, exactly one datagram's worth, and up to 64 KiB.
        let len = match i % 4 {
            0 => 1 + (rng % 200) as usize,
            1 => p.max_message_len() + (rng % 2) as usize,
            _ => 1 + (rng % (1 << 16)) as usize,
        };
        let msg = big(i, len);
        let seq = if i % 3 == 0 && len > p.max_message_len() {
            // The claim API stages a large message.
            let buf = p.try_claim(len).unwrap();
            buf.copy_from_slice(&msg);
            p.commit().unwrap()
        } else {
            let seq = p.publish(&msg).unwrap();
            p.flush();
            seq
        };
        expected.push((seq, msg));
        let (ds, next) = sealed_since(&p, sent);
        sent = next;
        for d in ds {
            now += 10;
            // Lose one datagram in 13: fragments and whole datagrams.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            if rng % 13 == 0 {
                lost += 1;
                continue;
            }
            assert!(s.on_datagram(now, Line::A, &d, &mut app));
            serve(&mut p, &mut s, &mut app, now);
        }
        let hb = p.heartbeat().to_vec();
        s.on_datagram(now, Line::A, &hb, &mut app);
        serve(&mut p, &mut s, &mut app, now);
    }
    assert!(lost > 50, "{lost}");
    assert_eq!(app.msgs.len(), expected.len());
    for (got, want) in app.msgs.iter().zip(&expected) {
        assert_eq!(got.0, want.0);
        assert!(got.1 == want.1, "message {} differs", want.0);
    }
    let c = s.counters();
    assert_eq!(s.phase(), Phase::Live);
    assert!(
        c.large_messages > 90 && c.messages_recovered >= lost,
        "{c:?}"
    );
    assert_eq!((c.fragments_dropped, c.partial_messages_dropped), (0, 0));
    assert_eq!(c.unrecoverable, 0);
    assert!(p.counters().fragments > 1000, "{:?}", p.counters());
}

#[test]
fn forged_fragments_are_counted_drops() {
    let mut p = publisher(1);
    let mut s = announced(cfg());
    let mut app = Rec::default();
    let msg = big(1, 1000);
    p.publish(&msg).unwrap();
    let (ds, _) = sealed_since(&p, 1);
    assert_eq!(ds.len(), 5);
    let offset = Datagram::parse(&ds[1]).unwrap().fragment().unwrap().offset;
    assert_eq!(offset, 222);
    // A forged continuation with a wrong offset, then one with another
    // total: each drops the message under way.
    let mut forged = ds[1].clone();
    forged[24 + 2 + 4] ^= 1;
    s.on_datagram(0, Line::A, &ds[0], &mut app);
    s.on_datagram(0, Line::A, &forged, &mut app);
    for d in &ds[2..] {
        s.on_datagram(0, Line::A, d, &mut app);
    }
    assert!(app.msgs.is_empty());
    let c = s.counters();
    assert_eq!(c.fragments_dropped, 4, "{c:?}");
    // A fragment whose bytes run past its total is malformed on the wire.
    let mut overrun = ds[4].clone();
    overrun[24 + 2..24 + 2 + 4].copy_from_slice(&10u32.to_le_bytes());
    assert_eq!(
        Datagram::parse(&overrun).unwrap_err(),
        wire::WireError::BadFragment
    );
    // Larger than max_message_bytes: dropped, never written.
    let mut huge = PublisherState::new(PublisherConfig {
        max_message_bytes: 1 << 20,
        history_depth: 8192,
        ..*p.config()
    });
    huge.publish(&big(2, (1 << 16) + 1)).unwrap();
    let mut s2 = announced(cfg());
    let (ds, _) = sealed_since(&huge, 1);
    for d in &ds {
        s2.on_datagram(0, Line::A, d, &mut app);
    }
    assert!(app.msgs.is_empty());
    assert_eq!(s2.counters().fragments_dropped, ds.len() as u64);
}

#[test]
fn claims_beyond_max_message_bytes_are_refused() {
    let mut p = publisher(1);
    assert!(matches!(
        p.try_claim((1 << 16) + 1),
        Err(crate::mcast::publisher::ClaimError::TooLarge { .. })
    ));
    assert!(p.publish(&big(0, (1 << 16) + 1)).is_err());
    let mut small = PublisherState::new(PublisherConfig {
        max_message_bytes: 0,
        ..*p.config()
    });
    assert!(small.try_claim(small.max_message_len() + 1).is_err());
    assert!(small.try_claim(small.max_message_len()).is_ok());
}

#[test]
fn a_hole_in_a_large_message_drops_it_and_the_next_one_arrives_whole() {
    let mut p = publisher(1);
    let mut s = announced(SubscriberConfig {
        max_retries: 0,
        ..tolerant()
    });
    let mut app = Rec::default();
    let first = big(1, 1000);
    let second = big(2, 600);
    p.publish(&first).unwrap();
    let s2 = p.publish(&second).unwrap();
    let (ds, _) = sealed_since(&p, 1);
    assert_eq!(ds.len(), 5 + 3);
    for (i, d) in ds.iter().enumerate() {
        if i != 2 {
            s.on_datagram(0, Line::A, d, &mut app);
        }
    }
    // Retries exhausted (0 allowed): the hole is lost and skipped.
    s.handle_timeout(TIMEOUT, &mut app);
    assert_eq!(app.gaps, vec![(3, 4)]);
    assert_eq!(app.msgs, vec![(s2, second)]);
    let c = s.counters();
    assert_eq!(c.partial_messages_dropped, 1, "{c:?}");
    assert_eq!(c.fragments_dropped, 2, "{c:?}");
}

/// On an in-order connection (RC fan-out) an answer arrives behind what
/// the ring holds before it: past its deadline a request is neither asked
/// again nor given up while the ring has not been read empty since; once
/// it has (`link_drained`) and the in-order wait (the link's silence
/// bound, fixed) has passed, it is asked again as on multicast. Without this, a
/// subscriber reading a backlog slowly declared the start it asked for
/// lost while the answer sat in its ring (CI 12-07).
#[test]
fn on_an_in_order_link_requests_wait_for_the_ring_to_be_read() {
    let mut p = publisher(1);
    let ds = datagrams(&mut p, 5);
    let join = SubscriberConfig {
        join_replay_max: 6,
        ..cfg()
    };
    let mut app = App::default();
    // Multicast: the unanswered request for [1,7) is given up.
    let mut m = announced(join);
    m.on_datagram(0, Line::A, &ds[3], &mut app);
    assert!(m.poll_transmit().is_some());
    for k in 1..=5 {
        m.handle_timeout(k * 10 * TIMEOUT, &mut app);
        while m.poll_transmit().is_some() {}
    }
    assert!(
        events(&mut m).contains(&Event::UnrecoverableLoss { from: 1, to: 7 }),
        "{:?}",
        m.counters()
    );
    // In order, the ring never read empty: the same waits ask nothing.
    let mut s = announced(join);
    s.set_in_order_link(10 * TIMEOUT);
    s.on_datagram(0, Line::A, &ds[3], &mut app);
    assert!(s.poll_transmit().is_some());
    for k in 1..=5 {
        s.handle_timeout(k * 10 * TIMEOUT, &mut app);
        assert!(s.poll_transmit().is_none());
    }
    assert!(events(&mut s).is_empty());
    assert_eq!(s.counters().timeouts, 0);
    // Read empty before the deadline (the in-order wait, 10 TIMEOUT,
    // not the multicast one): still nothing.
    s.link_drained(5 * TIMEOUT);
    s.handle_timeout(60 * TIMEOUT, &mut app);
    assert!(s.poll_transmit().is_none());
    // Read empty after it: asked again (a retry, not a loss), and the
    // answer fills the start.
    s.link_drained(60 * TIMEOUT);
    s.handle_timeout(60 * TIMEOUT, &mut app);
    assert_eq!(s.counters().timeouts, 1);
    assert!(events(&mut s).is_empty());
    let mut app = App::default();
    serve(&mut p, &mut s, &mut app, 61 * TIMEOUT);
    assert_eq!(app.seqs, (1..=8).collect::<Vec<_>>());
}
