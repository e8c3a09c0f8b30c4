use super::*;
use rocebus::clock::Mono;
use std::time::Duration;

/// Where the tests' clock starts (any reading: the trackers only compare readings).
const T0: Mono = Mono::from_nanos(1 << 40);

/// Session "SESS000001", sequence 5, two messages: "ab" and "xyz".
#[rustfmt::skip]
static PACKET_BYTES: [u8; 29] = [
    b'S', b'E', b'S', b'S', b'0', b'0', b'0', b'0', b'0', b'1', // session
    0, 0, 0, 0, 0, 0, 0, 5,                                     // sequence number
    0, 2,                                                       // message count
    0, 2, b'a', b'b',                                           // block 1
    0, 3, b'x', b'y', b'z',                                     // block 2
];

#[test]
fn parses_fixed_packet() {
    let p = Packet::parse(&PACKET_BYTES).expect("valid");
    assert_eq!(&p.session(), b"SESS000001");
    assert_eq!(p.sequence_number(), 5);
    assert_eq!(p.kind(), Kind::Data);
    assert_eq!(p.message_count(), 2);
    assert_eq!(p.end_sequence(), 7);
    let msgs: Vec<&[u8]> = p.messages().collect();
    assert_eq!(msgs, [&b"ab"[..], &b"xyz"[..]]);
}

#[test]
fn builder_writes_the_fixed_packet() {
    let mut b = PacketBuilder::new(1400);
    b.start(session("SESS000001"), 5);
    b.push(b"ab").expect("fits");
    b.push(b"xyz").expect("fits");
    assert_eq!(b.bytes(), &PACKET_BYTES[..]);
    // A packet limited to 26 bytes takes "ab" (24) but not "xyz" (+5).
    let mut small = PacketBuilder::new(26);
    small.start(session("SESS000001"), 5);
    small.push(b"ab").expect("fits");
    assert_eq!(small.push(b"xyz"), Err(Full));
    assert_eq!(small.count(), 1);
}

#[test]
fn heartbeat_and_end_of_session() {
    let hb = empty_packet(session("S"), 42, HEARTBEAT);
    let p = Packet::parse(&hb).expect("valid");
    assert_eq!(
        (p.kind(), p.sequence_number(), p.message_count()),
        (Kind::Heartbeat, 42, 0)
    );
    assert_eq!(p.messages().count(), 0);
    let eos = empty_packet(session("S"), 42, END_OF_SESSION);
    let p = Packet::parse(&eos).expect("valid");
    assert_eq!((p.kind(), p.end_sequence()), (Kind::EndOfSession, 42));
    let mut eos_with_tail = eos.to_vec();
    eos_with_tail.push(0);
    assert_eq!(
        Packet::parse(&eos_with_tail).err(),
        Some(PacketError::TrailingBytes(1))
    );
}

#[test]
fn malformed_packets_are_errors() {
    assert_eq!(
        Packet::parse(&PACKET_BYTES[..19]).err(),
        Some(PacketError::TooShort(19))
    );
    assert_eq!(
        Packet::parse(&PACKET_BYTES[..28]).err(),
        Some(PacketError::CountMismatch {
            declared: 2,
            found: 1
        })
    );
    let mut more = PACKET_BYTES;
    more[19] = 3; // declares 3 messages, holds 2
    assert_eq!(
        Packet::parse(&more).err(),
        Some(PacketError::CountMismatch {
            declared: 3,
            found: 2
        })
    );
    let mut trailing = PACKET_BYTES.to_vec();
    trailing.push(7);
    assert_eq!(
        Packet::parse(&trailing).err(),
        Some(PacketError::TrailingBytes(1))
    );
    let mut overflow = PACKET_BYTES;
    overflow[10..18].copy_from_slice(&u64::MAX.to_be_bytes());
    assert_eq!(
        Packet::parse(&overflow).err(),
        Some(PacketError::SequenceOverflow)
    );
    for n in 0..PACKET_BYTES.len() {
        let _ = Packet::parse(&PACKET_BYTES[..n]).map(|p| p.messages().count());
    }
}

#[test]
fn request_roundtrip() {
    let r = Request {
        session: session("SESS000001"),
        sequence_number: 5,
        count: 2,
    };
    let bytes = r.encode();
    assert_eq!(&bytes[..], &PACKET_BYTES[..20]);
    assert_eq!(Request::parse(&bytes), Ok(r));
    assert_eq!(Request::parse(&bytes[..19]), Err(PacketError::TooShort(19)));
    assert_eq!(
        Request::parse(&PACKET_BYTES),
        Err(PacketError::TrailingBytes(9))
    );
}

/// Packets of one message each: message `s` is the 8 bytes of `s`.
fn packet(seq: u64, count: u16) -> Vec<u8> {
    let mut b = PacketBuilder::new(1400);
    b.start(session("T"), seq);
    for s in seq..seq + u64::from(count) {
        b.push(&s.to_be_bytes()).expect("fits");
    }
    b.bytes().to_vec()
}

fn collect(out: &mut Vec<u64>) -> impl FnMut(u64, &[u8]) + '_ {
    |seq, m| {
        assert_eq!(m, seq.to_be_bytes(), "message matches its sequence number");
        out.push(seq);
    }
}

/// What a timeout released, in order: `Ok(sequence)` per message, `Err(loss)` per loss.
#[derive(Default)]
struct Released(Vec<Result<u64, Loss>>);

impl Deliver for Released {
    fn message(&mut self, sequence: u64, message: &[u8]) {
        assert_eq!(message, sequence.to_be_bytes());
        self.0.push(Ok(sequence));
    }
    fn loss(&mut self, loss: Loss) {
        self.0.push(Err(loss));
    }
}

#[test]
fn in_order_delivery_and_duplicates() {
    let t = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    assert_eq!(
        g.on_packet(t, &packet(1, 3), &mut collect(&mut got)),
        Ok(Outcome::Delivered)
    );
    assert_eq!(
        g.on_packet(t, &packet(4, 2), &mut collect(&mut got)),
        Ok(Outcome::Delivered)
    );
    assert_eq!(
        g.on_packet(t, &packet(2, 2), &mut collect(&mut got)),
        Ok(Outcome::Duplicate)
    );
    // Overlapping: only 6 is new.
    assert_eq!(
        g.on_packet(t, &packet(5, 2), &mut collect(&mut got)),
        Ok(Outcome::Delivered)
    );
    assert_eq!(got, [1, 2, 3, 4, 5, 6]);
    assert_eq!(g.poll_request(t), None);
    let c = g.counters();
    assert_eq!((c.packets, c.messages, c.duplicates, c.gaps), (4, 6, 1, 0));
}

#[test]
fn gap_is_requested_buffered_and_recovered() {
    let t = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 2), &mut collect(&mut got))
        .expect("ok");
    // 3..=5 lost; 6..=7 arrives.
    assert_eq!(
        g.on_packet(t, &packet(6, 2), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    assert_eq!(got, [1, 2]);
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (3, 3));
    assert_eq!(g.poll_request(t), None, "one request in flight");
    // Retransmission arrives: everything flows, in order.
    g.on_packet(t, &packet(3, 3), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(got, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(g.poll_timeout(), None, "request satisfied");
    let c = *g.counters();
    assert_eq!(
        (c.gaps, c.requests, c.re_requested, c.recovered, c.messages),
        (1, 1, 3, 3, 7)
    );
}

#[test]
fn partial_answer_asks_for_the_rest_at_once() {
    let t = T0;
    let cfg = GapConfig {
        max_retries: 1,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(t, &packet(101, 1), &mut collect(&mut got))
        .expect("ok");
    // 2..=100 missing; each answer holds 10 messages. Far more answers than retries: none
    // of them is a retry, nothing is lost and no timeout is needed.
    let mut answers = 0;
    while let Some(r) = g.poll_request(t) {
        assert_eq!(r.count, (101 - r.sequence_number) as u16);
        let n = r.count.min(10);
        g.on_packet(t, &packet(r.sequence_number, n), &mut collect(&mut got))
            .expect("ok");
        answers += 1;
    }
    assert_eq!(answers, 10);
    assert_eq!(got, (1..=101).collect::<Vec<u64>>());
    let c = *g.counters();
    assert_eq!(
        (c.timeouts, c.lost, c.recovered, c.requests),
        (0, 0, 99, 10)
    );
}

#[test]
fn heartbeat_reveals_tail_loss_and_end_of_session_completes() {
    let t = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(
        t,
        &empty_packet(session("T"), 4, HEARTBEAT),
        &mut collect(&mut got),
    )
    .expect("ok");
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (2, 2));
    g.on_packet(
        t,
        &empty_packet(session("T"), 4, END_OF_SESSION),
        &mut collect(&mut got),
    )
    .expect("ok");
    assert!(!g.is_complete());
    g.on_packet(t, &packet(2, 2), &mut collect(&mut got))
        .expect("ok");
    assert!(g.is_complete());
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(g.counters().heartbeats, 1);
}

#[test]
fn timeouts_retry_then_give_up() {
    let t0 = T0;
    let cfg = GapConfig {
        max_retries: 2,
        retransmit_timeout: Duration::from_millis(10),
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(t0, &packet(5, 1), &mut collect(&mut got))
        .expect("ok");
    let mut t = t0;
    let mut released = Released::default();
    for attempt in 0..3 {
        let r = g.poll_request(t).expect("request");
        assert_eq!((r.sequence_number, r.count), (2, 3), "attempt {attempt}");
        let due = g.poll_timeout().expect("waiting");
        assert_eq!(due, t + Duration::from_millis(10));
        g.handle_timeout(due - Duration::from_millis(1), &mut released);
        assert_eq!(g.poll_request(due), None, "not yet timed out");
        t = due;
        g.handle_timeout(t, &mut released);
    }
    // Third timeout: retries exhausted, 2..=4 lost (said first), 5 delivered from the buffer.
    assert_eq!(got, [1]);
    assert_eq!(released.0, [Err(Loss { from: 2, to: 5 }), Ok(5)]);
    assert_eq!(g.poll_request(t), None);
    let c = *g.counters();
    assert_eq!(
        (c.timeouts, c.requests, c.lost, c.unrecoverable),
        (3, 3, 3, 1)
    );
}

#[test]
fn wrong_session_and_malformed_are_counted() {
    let t = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    let mut other = packet(2, 1);
    other[0] = b'U';
    assert_eq!(
        g.on_packet(t, &other, &mut collect(&mut got)),
        Ok(Outcome::WrongSession)
    );
    assert!(g.on_packet(t, &[1, 2, 3], &mut collect(&mut got)).is_err());
    let c = g.counters();
    assert_eq!((c.wrong_session, c.malformed, c.messages), (1, 1, 1));
}

#[test]
fn buffer_limit_drops_and_rerequests() {
    let t = T0;
    let cfg = GapConfig {
        max_buffered_bytes: 40,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(
        g.on_packet(t, &packet(3, 1), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    assert_eq!(
        g.on_packet(t, &packet(4, 1), &mut collect(&mut got)),
        Ok(Outcome::Dropped)
    );
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (2, 1));
    g.on_packet(t, &packet(2, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(got, [1, 2, 3]);
    // 4 was dropped: asked for now.
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (4, 1));
    assert_eq!(g.counters().buffer_overflows, 1);
}

#[test]
fn retransmission_answers_from_history() {
    let history: Vec<Vec<u8>> = (1..=10u64).map(|s| s.to_be_bytes().to_vec()).collect();
    let mut b = PacketBuilder::new(20 + 3 * 10);
    let req = Request {
        session: session("T"),
        sequence_number: 4,
        count: 5,
    };
    let p = build_retransmission(&mut b, session("T"), 1, &history, &req).expect("answer");
    let p = Packet::parse(p).expect("valid");
    assert_eq!(
        (p.sequence_number(), p.message_count()),
        (4, 3),
        "limited by packet size"
    );
    let out_of_range = Request {
        sequence_number: 11,
        ..req
    };
    assert!(build_retransmission(&mut b, session("T"), 1, &history, &out_of_range).is_none());
    let before = Request {
        sequence_number: 0,
        ..req
    };
    assert!(build_retransmission(&mut b, session("T"), 1, &history, &before).is_none());
}

#[test]
fn far_ahead_packet_is_dropped_and_the_feed_continues() {
    let t = T0;
    let cfg = GapConfig {
        max_sequence_ahead: 100,
        reanchor_packets: 10,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 3), &mut collect(&mut got))
        .expect("ok");
    // A forged sequence number far beyond the stream, as data, heartbeat and end of session.
    for p in [
        packet(1 << 40, 1),
        empty_packet(session("T"), 1 << 40, HEARTBEAT).to_vec(),
        empty_packet(session("T"), 1 << 40, END_OF_SESSION).to_vec(),
    ] {
        assert_eq!(
            g.on_packet(t, &p, &mut collect(&mut got)),
            Ok(Outcome::FarAhead)
        );
    }
    assert_eq!(g.poll_request(t), None, "no gap opened");
    assert!(!g.is_complete(), "no end of session taken");
    // The real stream goes on; a gap inside the window is still an ordinary gap.
    g.on_packet(t, &packet(4, 2), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(
        g.on_packet(t, &packet(106, 1), &mut collect(&mut got)),
        Ok(Outcome::Buffered),
        "within the window of the highest sequence known (6)"
    );
    assert_eq!(got, [1, 2, 3, 4, 5]);
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (6, 100));
    let c = *g.counters();
    assert_eq!((c.far_ahead, c.gaps, c.packets), (3, 1, 3));
}

#[test]
fn agreeing_far_ahead_packets_are_a_real_jump() {
    let t = T0;
    let cfg = GapConfig {
        max_sequence_ahead: 100,
        reanchor_packets: 3,
        // The jump is taken as soon as the window agrees; claims are tested on their own.
        claim_packets: 1,
        claim_timeout: Duration::ZERO,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    // Two far-ahead packets, then a packet in the window: the run starts over.
    for s in [1000, 1001] {
        assert_eq!(
            g.on_packet(t, &packet(s, 1), &mut collect(&mut got)),
            Ok(Outcome::FarAhead)
        );
    }
    g.on_packet(t, &packet(2, 1), &mut collect(&mut got))
        .expect("ok");
    // A run that goes backwards does not agree either.
    for s in [5000, 1002, 1003] {
        assert_eq!(
            g.on_packet(t, &packet(s, 1), &mut collect(&mut got)),
            Ok(Outcome::FarAhead),
            "{s}"
        );
    }
    // The third agreeing packet is taken: 3..1004 is a gap to recover.
    assert_eq!(
        g.on_packet(t, &packet(1004, 1), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (3, 1000));
    let c = *g.counters();
    assert_eq!((c.far_ahead, c.reanchors), (5, 1));
    assert_eq!(got, [1, 2]);
}

#[test]
fn late_start_catches_up_after_agreeing_packets() {
    // Started mid-day from sequence 1: the live stream is far ahead of anything known.
    let t = T0;
    let cfg = GapConfig {
        max_sequence_ahead: 10,
        reanchor_packets: 2,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    assert_eq!(
        g.on_packet(t, &packet(500, 1), &mut collect(&mut got)),
        Ok(Outcome::FarAhead)
    );
    assert_eq!(g.session(), None, "a dropped packet locks nothing");
    assert_eq!(
        g.on_packet(t, &packet(501, 1), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    assert_eq!(g.session(), Some(session("T")));
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (1, 500));
}

#[test]
fn configured_session_is_the_only_one_locked() {
    let t = T0;
    let cfg = GapConfig {
        session: Some(session("T")),
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    // A foreign session first: today's tracker would lock onto it and drop the real feed.
    let mut foreign = packet(1, 2);
    foreign[0] = b'X';
    assert_eq!(
        g.on_packet(t, &foreign, &mut collect(&mut got)),
        Ok(Outcome::WrongSession)
    );
    assert_eq!(g.session(), None);
    g.on_packet(t, &packet(1, 2), &mut collect(&mut got))
        .expect("ok");
    // Once locked, foreign packets at any sequence change nothing.
    foreign = packet(3, 5);
    foreign[0] = b'X';
    assert_eq!(
        g.on_packet(t, &foreign, &mut collect(&mut got)),
        Ok(Outcome::WrongSession)
    );
    g.on_packet(t, &packet(3, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(g.poll_request(t), None);
    let c = *g.counters();
    assert_eq!((c.wrong_session, c.messages), (2, 3));
}

#[test]
fn without_retransmission_a_gap_is_lost_after_one_timeout() {
    let t0 = T0;
    let cfg = GapConfig {
        retransmission: false,
        retransmit_timeout: Duration::from_millis(10),
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(t0, &packet(4, 2), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(g.poll_request(t0), None, "nobody to ask");
    let due = g.poll_timeout().expect("waits for reordered packets");
    assert_eq!(due, t0 + Duration::from_millis(10));
    let mut released = Released::default();
    g.handle_timeout(due, &mut released);
    assert_eq!(released.0, [Err(Loss { from: 2, to: 4 }), Ok(4), Ok(5)]);
    let c = *g.counters();
    assert_eq!((c.requests, c.lost, c.unrecoverable), (0, 2, 1));
}

#[test]
fn reordered_packet_within_the_wait_is_no_loss() {
    let t0 = T0;
    let cfg = GapConfig {
        retransmission: false,
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(t0, &packet(3, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(g.poll_request(t0), None);
    g.on_packet(t0, &packet(2, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(g.poll_timeout(), None);
    assert_eq!(g.counters().unrecoverable, 0);
}

#[test]
fn heartbeat_ahead_of_a_gap_does_not_hide_the_data_after_it() {
    // 2 is lost; the sender then idles (heartbeat saying 3 is next) and sends 3..=4. The
    // heartbeat carries nothing to keep: the data packet at the same sequence must be kept,
    // not taken for a duplicate of it.
    let t0 = T0;
    let cfg = GapConfig {
        retransmission: false,
        retransmit_timeout: Duration::from_millis(10),
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(
        t0,
        &empty_packet(session("T"), 3, HEARTBEAT),
        &mut collect(&mut got),
    )
    .expect("ok");
    assert_eq!(
        g.on_packet(t0, &packet(3, 2), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    assert_eq!(g.poll_request(t0), None);
    let due = g.poll_timeout().expect("waits for reordered packets");
    let mut released = Released::default();
    g.handle_timeout(due, &mut released);
    assert_eq!(released.0, [Err(Loss { from: 2, to: 3 }), Ok(3), Ok(4)]);
    assert_eq!(g.next_sequence(), Some(5));
    let c = *g.counters();
    assert_eq!((c.lost, c.duplicates, c.unrecoverable), (1, 0, 1));
}

#[test]
fn longer_packet_at_a_buffered_sequence_replaces_the_shorter() {
    // A short retransmission answer (5..=5) is buffered ahead of a gap, then the multicast
    // packet 5..=7 arrives: it holds messages the short one lacks and must be kept.
    let t = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    g.on_packet(t, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    g.on_packet(t, &packet(5, 1), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(
        g.on_packet(t, &packet(5, 3), &mut collect(&mut got)),
        Ok(Outcome::Buffered)
    );
    assert_eq!(
        g.on_packet(t, &packet(5, 2), &mut collect(&mut got)),
        Ok(Outcome::Duplicate)
    );
    let r = g.poll_request(t).expect("request");
    assert_eq!((r.sequence_number, r.count), (2, 3));
    g.on_packet(t, &packet(2, 3), &mut collect(&mut got))
        .expect("ok");
    assert_eq!(got, [1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(g.poll_request(t), None, "nothing left to ask");
}

/// Runs the tracker as the shell does between packets: requests, and every timeout due
/// up to `until`, at its time.
fn turn(g: &mut GapTracker, until: Mono, out: &mut Released, requests: &mut Vec<Request>) {
    let mut now = until;
    loop {
        while let Some(r) = g.poll_request(now) {
            requests.push(r);
        }
        match g.poll_timeout() {
            Some(due) if due <= until => {
                now = due;
                g.handle_timeout(due, out);
            }
            _ => return,
        }
    }
}

#[test]
fn forged_far_ahead_heartbeat_loses_no_real_message() {
    // The attack of issue 41: one heartbeat from the exchange's address claiming
    // next + 999,000 (inside the sequence window), then the real feed goes on in order.
    let t0 = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut out = Released::default();
    let mut requests = Vec::new();
    let mut now = t0;
    for seq in 1..=10 {
        g.on_packet(now, &packet(seq, 1), &mut |s, m| out.message(s, m))
            .expect("ok");
    }
    let forged = empty_packet(session("T"), 11 + 999_000, HEARTBEAT);
    assert_eq!(
        g.on_packet(now, &forged, &mut |s, m| out.message(s, m)),
        Ok(Outcome::Claimed)
    );
    // Real packets, one every 10 ms, then a quiet stretch of one every 400 ms (longer
    // than a request's retries take to run out), with a forged heartbeat every tenth.
    let mut forged_sent = 1;
    for i in 0..600u64 {
        now += Duration::from_millis(if i < 500 { 10 } else { 400 });
        turn(&mut g, now, &mut out, &mut requests);
        g.on_packet(now, &packet(11 + i, 1), &mut |s, m| out.message(s, m))
            .expect("ok");
        if i % 10 == 0 {
            g.on_packet(now, &forged, &mut |s, m| out.message(s, m))
                .expect("ok");
            forged_sent += 1;
        }
        turn(&mut g, now, &mut out, &mut requests);
    }
    let want: Vec<_> = (1..=610).map(Ok).collect();
    assert_eq!(out.0, want, "every real message, no loss");
    assert_eq!(requests, [], "no re-request");
    let c = *g.counters();
    assert_eq!((c.lost, c.gaps, c.requests, c.duplicates), (0, 0, 0, 0));
    assert_eq!((c.claimed, c.claims_accepted), (forged_sent, 0));
    assert_eq!(c.claims_disproved, forged_sent);
}

#[test]
fn forged_burst_inside_the_claim_timeout_is_not_a_jump() {
    // Several agreeing forged packets in a row are not enough: the real feed keeps
    // arriving at the head within the timeout.
    let t0 = T0;
    let mut g = GapTracker::new(GapConfig::default());
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    for s in 0..50 {
        assert_eq!(
            g.on_packet(t0, &packet(500_000 + s, 1), &mut collect(&mut got)),
            Ok(Outcome::Claimed)
        );
    }
    g.on_packet(
        t0 + Duration::from_secs(1),
        &packet(2, 1),
        &mut collect(&mut got),
    )
    .expect("ok");
    // Long after the first forged packet, one more: the claim started over at the head.
    assert_eq!(
        g.on_packet(
            t0 + Duration::from_secs(3),
            &packet(500_050, 1),
            &mut collect(&mut got)
        ),
        Ok(Outcome::Claimed)
    );
    assert_eq!(g.poll_request(t0 + Duration::from_secs(3)), None);
    assert_eq!(got, [1, 2]);
}

#[test]
fn real_jump_is_still_detected_after_the_claim_timeout() {
    // The source really skipped from 11 to 5011: nothing arrives at the head any more.
    let t0 = T0;
    let cfg = GapConfig {
        retransmission: false,
        ..GapConfig::default()
    };
    let timeout = cfg.claim_timeout;
    let mut g = GapTracker::new(cfg);
    let mut out = Released::default();
    let mut requests = Vec::new();
    for seq in 1..=10 {
        g.on_packet(t0, &packet(seq, 1), &mut |s, m| out.message(s, m))
            .expect("ok");
    }
    let mut now = t0;
    let mut seq = 5011;
    while now <= t0 + timeout + Duration::from_millis(200) {
        let o = g
            .on_packet(now, &packet(seq, 1), &mut |s, m| out.message(s, m))
            .expect("ok");
        if now < t0 + timeout {
            assert_eq!(o, Outcome::Claimed, "not before the timeout");
        }
        turn(&mut g, now, &mut out, &mut requests);
        seq += 1;
        now += Duration::from_millis(10);
    }
    let c = *g.counters();
    assert_eq!(c.claims_accepted, 1);
    assert_eq!(c.unrecoverable, 1, "{c:?}");
    // The range before the packet that confirmed the claim is declared lost, then the
    // stream goes on from there.
    let first_taken = 5011 + c.claimed;
    assert_eq!(
        out.0[10],
        Err(Loss {
            from: 11,
            to: first_taken
        })
    );
    assert_eq!(out.0[11], Ok(first_taken));
    assert_eq!(out.0.last(), Some(&Ok(seq - 1)));
}

#[test]
fn real_jump_is_re_requested_with_a_retransmission_server() {
    let t0 = T0;
    let cfg = GapConfig {
        claim_packets: 2,
        claim_timeout: Duration::from_millis(100),
        ..GapConfig::default()
    };
    let mut g = GapTracker::new(cfg);
    let mut got = Vec::new();
    g.on_packet(t0, &packet(1, 1), &mut collect(&mut got))
        .expect("ok");
    let later = t0 + Duration::from_millis(100);
    for (now, s, want) in [
        (t0, 3000, Outcome::Claimed),
        (t0 + Duration::from_millis(50), 3001, Outcome::Claimed),
        (later, 3002, Outcome::Buffered),
    ] {
        assert_eq!(
            g.on_packet(now, &packet(s, 1), &mut collect(&mut got)),
            Ok(want),
            "{s}"
        );
    }
    let r = g.poll_request(later).expect("request");
    assert_eq!((r.sequence_number, r.count), (2, 1000));
}
