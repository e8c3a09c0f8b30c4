use super::*;
use crate::fix::split_frame;

pub(super) const SEC: u64 = 1_000_000_000;
pub(super) const T0: u64 = 1_704_207_600 * SEC;

pub(super) fn cfg() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 30,
        resend_timeout_ms: 0,
        ..Default::default()
    }
}

/// Builds a venue → gateway frame.
pub(super) fn venue(ty: &[u8], seq: u64, extra: &[(u32, &[u8])]) -> Vec<u8> {
    let mut w = MessageWriter::default();
    w.start(ty)
        .field(49, b"VENUE")
        .field(56, b"GW")
        .uint(34, seq)
        .timestamp(52, T0);
    for (t, v) in extra {
        w.field(*t, v);
    }
    let mut out = Vec::new();
    w.finish(&mut out);
    out
}

pub(super) fn frames(out: &[u8]) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    let mut rest = out;
    while !rest.is_empty() {
        let n = split_frame(rest).unwrap();
        v.push(rest[..n].to_vec());
        rest = &rest[n..];
    }
    v
}

pub(super) fn active() -> Session {
    let mut s = Session::new(cfg());
    let mut out = Vec::new();
    s.on_connect(T0, &mut out);
    let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::LoggedOn
    ));
    s
}

#[test]
fn logon_and_sequence() {
    let mut s = Session::new(cfg());
    let mut out = Vec::new();
    s.on_connect(T0, &mut out);
    let f = frames(&out);
    let m = Message::parse(&f[0]).unwrap();
    assert_eq!(m.msg_type(), b"A");
    assert_eq!(m.get(108), Some(&b"30"[..]));
    assert_eq!(s.state(), SessionState::LogonSent);
    let s = active();
    assert_eq!(s.state(), SessionState::Active);
    assert_eq!((s.next_out(), s.next_in()), (2, 2));
}

#[test]
fn test_request_is_answered_and_heartbeats_sent() {
    let mut s = active();
    let mut out = Vec::new();
    let f = venue(b"1", 2, &[(112, b"abc")]);
    s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
    let hb = frames(&out);
    let m = Message::parse(&hb[0]).unwrap();
    assert_eq!((m.msg_type(), m.get(112)), (&b"0"[..], Some(&b"abc"[..])));
    out.clear();
    s.on_timer(T0 + 37 * SEC, &mut out);
    let f = frames(&out);
    let types: Vec<Vec<u8>> = f
        .iter()
        .map(|f| Message::parse(f).unwrap().msg_type().to_vec())
        .collect();
    // The TestRequest counts as traffic, so no Heartbeat is due in the same tick.
    assert_eq!(types, [b"1".to_vec()]);
    out.clear();
    assert!(matches!(
        s.on_timer(T0 + 68 * SEC, &mut out),
        SessionEvent::Disconnect
    ));
}

#[test]
fn inbound_gap_requests_resend_and_gap_fill_closes_it() {
    let mut s = active();
    let mut out = Vec::new();
    let f = venue(b"8", 5, &[]);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::None
    ));
    let m = frames(&out);
    let rr = Message::parse(&m[0]).unwrap();
    assert_eq!(
        (rr.msg_type(), rr.uint(7), rr.uint(16)),
        (&b"2"[..], Ok(2), Ok(0))
    );
    assert_eq!(s.counters().resend_requests_sent, 1);
    // A second out-of-order message does not ask again.
    out.clear();
    let f = venue(b"8", 6, &[]);
    s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
    assert!(out.is_empty());
    let f = venue(b"4", 2, &[(43, b"Y"), (123, b"Y"), (36, b"5")]);
    s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
    assert_eq!(s.next_in(), 5);
    // PossDupFlag=Y comes with OrigSendingTime (FIX 4.4; rejected without it).
    let dup: &[(u32, &[u8])] = &[(43, b"Y"), (122, b"20240102-15:00:00.000")];
    let f = venue(b"8", 5, dup);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::App(_)
    ));
    // A PossDup duplicate is ignored, a plain low sequence number logs out.
    let f = venue(b"8", 5, dup);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::None
    ));
    assert_eq!(s.counters().duplicates_ignored, 1);
    let f = venue(b"8", 3, &[]);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::Disconnect
    ));
}

#[test]
fn serves_resend_with_poss_dup_and_gap_fill() {
    let mut s = active(); // seq 1 = logon
    let mut out = Vec::new();
    s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out); // 2
    s.on_timer(T0 + 30 * SEC, &mut out); // heartbeat 3 (and maybe test request)
    let after_admin = s.next_out();
    s.send_app(b"D", b"11=2\x0155=AAPL\x01", T0 + 30 * SEC, &mut out);
    out.clear();
    let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
    s.on_message(Message::parse(&rr).unwrap(), T0 + 31 * SEC, &mut out);
    let f = frames(&out);
    let got: Vec<(Vec<u8>, u64, Option<Vec<u8>>)> = f
        .iter()
        .map(|f| {
            let m = Message::parse(f).unwrap();
            assert!(m.poss_dup());
            (
                m.msg_type().to_vec(),
                m.seq().unwrap(),
                m.get(36).map(<[u8]>::to_vec),
            )
        })
        .collect();
    assert_eq!(got[0], (b"4".to_vec(), 1, Some(b"2".to_vec())));
    assert_eq!(got[1], (b"D".to_vec(), 2, None));
    assert_eq!(
        got[2],
        (b"4".to_vec(), 3, Some(after_admin.to_string().into_bytes()))
    );
    assert_eq!(got[3], (b"D".to_vec(), after_admin, None));
    assert_eq!(Message::parse(&f[1]).unwrap().get(11), Some(&b"1"[..]));
    assert!(Message::parse(&f[1]).unwrap().get(122).is_some());
    assert_eq!(s.counters().messages_resent, 2);
}

#[test]
fn replay_restores_sequence_numbers_and_store() {
    let mut s = active();
    let mut out = Vec::new();
    s.send_app(b"D", b"11=1\x01", T0, &mut out);
    let mut r = Session::new(cfg());
    r.replay_outbound(&out);
    let f = venue(b"8", 7, &[]);
    r.replay_inbound(&Message::parse(&f).unwrap());
    assert_eq!((r.next_out(), r.next_in()), (3, 8));
    assert_eq!((1..10).filter(|&q| r.store.get(q).is_some()).count(), 1);
}

#[test]
fn bad_comp_id_is_rejected_and_counted() {
    let mut s = active();
    let mut out = Vec::new();
    let mut w = MessageWriter::default();
    w.start(b"8")
        .field(49, b"EVIL")
        .field(56, b"GW")
        .uint(34, 2)
        .timestamp(52, T0);
    let mut f = Vec::new();
    w.finish(&mut f);
    s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
    let m = frames(&out);
    let rej = Message::parse(&m[0]).unwrap();
    assert_eq!((rej.msg_type(), rej.uint(45)), (&b"3"[..], Ok(2)));
    assert_eq!(s.counters().rejects_sent, 1);
    assert_eq!(s.next_in(), 3);
}

#[test]
fn logout_handshake() {
    let mut s = active();
    let mut out = Vec::new();
    s.logout(T0, &mut out);
    assert_eq!(s.state(), SessionState::LogoutSent);
    let f = venue(b"5", 2, &[]);
    assert!(matches!(
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
        SessionEvent::Disconnect
    ));
    assert_eq!(frames(&out).len(), 1);
}

mod interop_tests {
    use super::*;

    use super::{active, frames as parsed, venue, SEC, T0};

    /// The Heartbeat answering a TestRequest carries its TestReqID exactly, however long.
    #[test]
    fn test_req_id_is_echoed_whole() {
        let mut s = active();
        let mut out = Vec::new();
        let id = b"20240102-15:00:00.000-VENUE-TEST-REQUEST-0001";
        let f = venue(b"1", 2, &[(112, id)]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let hb = parsed(&out);
        let m = Message::parse(&hb[0]).unwrap();
        assert_eq!((m.msg_type(), m.get(112)), (&b"0"[..], Some(&id[..])));
        // Without a TestReqID: a session Reject, never an empty 112
        // (`a_test_request_without_its_id_is_rejected_not_answered`).
        out.clear();
        let f = venue(b"1", 3, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let answer = parsed(&out);
        let m = Message::parse(&answer[0]).unwrap();
        assert_eq!((m.msg_type(), m.get(112)), (&b"3"[..], None));
    }

    /// A gap fill is sent with PossDupFlag=Y, so it carries OrigSendingTime as FIX 4.4
    /// requires of every message with PossDupFlag=Y (QuickFIX includes it too).
    #[test]
    fn gap_fill_carries_orig_sending_time() {
        let mut s = active();
        let mut out = Vec::new();
        s.on_timer(T0 + 31 * SEC, &mut out); // heartbeat 2
        out.clear();
        let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
        s.on_message(Message::parse(&rr).unwrap(), T0 + 32 * SEC, &mut out);
        let f = parsed(&out);
        assert!(!f.is_empty());
        for f in &f {
            let m = Message::parse(f).unwrap();
            assert_eq!((m.msg_type(), m.poss_dup()), (&b"4"[..], true));
            assert!(m.get(tag::ORIG_SENDING_TIME).is_some(), "no 122");
        }
    }

    /// The venue's Logout takes its sequence number (QuickFIX's nextLogout), so the next
    /// session does not start with a ResendRequest for it.
    #[test]
    fn venue_logout_consumes_its_sequence_number() {
        let mut s = active();
        let mut out = Vec::new();
        let before = s.accepted_in();
        let f = venue(b"5", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(s.next_in(), 3);
        assert_eq!(s.accepted_in(), before + 1, "journaled");
        // Our Logout answer went out.
        let m = parsed(&out);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
    }

    /// MsgSeqNum missing: Logout and disconnect (FIX 4.4 Vol. 2, garbled message rules), not
    /// a Reject referencing sequence number 0.
    #[test]
    fn missing_msg_seq_num_logs_out() {
        let mut s = active();
        let mut out = Vec::new();
        let mut w = MessageWriter::default();
        w.start(b"0")
            .field(49, b"VENUE")
            .field(56, b"GW")
            .timestamp(52, T0);
        let mut f = Vec::new();
        w.finish(&mut f);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        let m = parsed(&out);
        assert_eq!(m.len(), 1);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
        assert_eq!(s.counters().rejects_sent, 0);
    }

    fn bad_comp_id(seq: u64) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(b"8")
            .field(49, b"EVIL")
            .field(56, b"GW")
            .uint(34, seq)
            .timestamp(52, T0);
        let mut f = Vec::new();
        w.finish(&mut f);
        f
    }

    /// A CompID problem is answered with Reject 373=9 and then Logout (FIX 4.4 Vol. 2 test
    /// case 2.j, QuickFIX's doBadCompID), and a number ahead of a gap does not skip it.
    #[test]
    fn bad_comp_id_rejects_then_logs_out_without_skipping_a_gap() {
        let mut s = active();
        let mut out = Vec::new();
        s.on_message(Message::parse(&bad_comp_id(2)).unwrap(), T0, &mut out);
        let m = parsed(&out);
        let types: Vec<&[u8]> = m
            .iter()
            .map(|f| Message::parse(f).unwrap().msg_type())
            .collect();
        assert_eq!(types, [&b"3"[..], &b"5"[..]]);
        let rej = Message::parse(&m[0]).unwrap();
        assert_eq!((rej.uint(45), rej.uint(373)), (Ok(2), Ok(9)));
        assert_eq!(s.next_in(), 3);
        assert_eq!(s.state(), SessionState::LogoutSent);
        let f = venue(b"5", 3, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));

        let mut s = active();
        out.clear();
        s.on_message(Message::parse(&bad_comp_id(9)).unwrap(), T0, &mut out);
        assert_eq!(s.next_in(), 2, "messages 2..8 are still owed");
    }

    /// Our session before: Logon 1, order 2 (never reached the venue). Reconnect: Logon 3.
    fn reconnected() -> (Session, Vec<u8>) {
        let mut s = active();
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out);
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        assert_eq!(s.next_out(), 4);
        (s, out)
    }

    /// A venue Logon with NextExpectedMsgSeqNum (789) below our next number is an implicit
    /// ResendRequest from it (QuickFIX/J with EnableNextExpectedMsgSeqNum sends no
    /// ResendRequest of its own then): we resend from there.
    #[test]
    fn logon_next_expected_msg_seq_num_is_served_as_a_resend() {
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"2")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::LoggedOn
        ));
        let got: Vec<(Vec<u8>, u64, bool, Option<u64>)> = parsed(&out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (
                    m.msg_type().to_vec(),
                    m.seq().unwrap(),
                    m.poss_dup(),
                    m.uint(36).ok(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (b"D".to_vec(), 2, true, None),
                (b"4".to_vec(), 3, true, Some(4)),
            ]
        );
        // In step: nothing to resend.
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"4")]);
        s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.state(), SessionState::Active);
    }

    /// 789 above anything we sent cannot be recovered: Logout and disconnect.
    #[test]
    fn logon_next_expected_msg_seq_num_too_high_logs_out() {
        let (mut s, mut out) = reconnected();
        out.clear();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30"), (789, b"9")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::Disconnect
        ));
        let m = parsed(&out);
        assert_eq!(Message::parse(&m[0]).unwrap().msg_type(), b"5");
    }
}

mod store_tests {
    use super::*;
    use crate::fix::split_frame;

    const T0: u64 = 1_704_207_600_000_000_000;

    fn session() -> Session {
        let mut s = Session::new(SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            ..Default::default()
        });
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        s.state = SessionState::Active;
        s
    }

    fn resend_request(s: &mut Session, begin: u64) -> Vec<(Vec<u8>, u64, Option<u64>)> {
        let mut w = MessageWriter::default();
        w.start(b"2")
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, s.next_in())
            .timestamp(52, T0)
            .uint(7, begin)
            .uint(16, 0);
        let mut f = Vec::new();
        w.finish(&mut f);
        let mut out = Vec::new();
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let mut v = Vec::new();
        let mut rest = &out[..];
        while let Ok(n) = split_frame(rest) {
            let m = Message::parse(&rest[..n]).unwrap();
            v.push((m.msg_type().to_vec(), m.seq().unwrap(), m.uint(36).ok()));
            rest = &rest[n..];
        }
        v
    }

    #[test]
    fn store_keeps_the_last_ring_and_gap_fills_what_it_let_go() {
        let mut s = session(); // seq 1 = logon
        let mut out = Vec::new();
        let total = RESEND_SLOTS as u64 + 10;
        for i in 0..total {
            out.clear();
            let body = format!("11={i}\x0155=AAPL\x01");
            s.send_app(b"D", body.as_bytes(), T0, &mut out);
        }
        let last = s.next_out() - 1;
        assert_eq!(last, total + 1);
        // The oldest 11 (logon + 10 orders) fell out of the ring: one gap fill covers them,
        // then every held order is resent in order.
        let got = resend_request(&mut s, 1);
        let first_held = last + 1 - RESEND_SLOTS as u64;
        assert_eq!(got[0], (b"4".to_vec(), 1, Some(first_held)));
        assert_eq!(got.len(), 1 + RESEND_SLOTS);
        assert!(got[1..]
            .iter()
            .zip(first_held..)
            .all(|(m, q)| m.0 == b"D" && m.1 == q));
        assert_eq!(s.counters().gap_filled_unavailable, 1);
        // A recent range is served from the ring without a gap fill.
        let got = resend_request(&mut s, last - 1);
        assert_eq!(
            got.iter().map(|m| m.1).collect::<Vec<_>>(),
            [last - 1, last]
        );
        assert!(got.iter().all(|m| m.0 == b"D"));
        assert_eq!(s.counters().gap_filled_unavailable, 1);
    }

    #[test]
    fn a_message_too_long_to_keep_is_gap_filled() {
        let mut s = session();
        let mut out = Vec::new();
        let long = format!("58={}\x01", "x".repeat(RESEND_SLOT_LEN));
        s.send_app(b"D", long.as_bytes(), T0, &mut out); // 2
        s.send_app(b"D", b"11=1\x01", T0, &mut out); // 3
        assert_eq!(s.counters().too_long_to_keep, 1);
        let got = resend_request(&mut s, 2);
        assert_eq!(got, [(b"4".to_vec(), 2, Some(3)), (b"D".to_vec(), 3, None)]);
    }
}

mod logon_tests {
    use super::*;
    use crate::fix::split_frame;

    use super::{frames, venue, SEC, T0};

    fn cfg(reset: bool, credentials: bool) -> SessionConfig {
        SessionConfig {
            sender_comp_id: "GW".into(),
            target_comp_id: "VENUE".into(),
            heartbeat_secs: 30,
            resend_timeout_ms: 0,
            username: credentials.then(|| "trader1".into()),
            password: credentials.then(|| Secret::new("s3cret-pw")),
            reset_on_logon: reset,
            max_latency_secs: 0,
        }
    }

    /// (tag, value) of every body field after the header.
    fn body(frame: &[u8]) -> Vec<(u32, Vec<u8>)> {
        Message::parse(frame)
            .unwrap()
            .fields()
            .flatten()
            .filter(|(t, _)| !matches!(t, 35 | 49 | 56 | 34 | 52))
            .map(|(t, v)| (t, v.to_vec()))
            .collect()
    }

    /// Logged on with an order and a few venue messages behind it: both numbers past 1.
    fn busy(cfg: SessionConfig) -> (Session, Vec<u8>) {
        let mut s = Session::new(cfg);
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let first = Message::parse(&frames(&out)[0]).unwrap().seq().unwrap();
        let f = venue(b"A", first, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        let f = if s.cfg.reset_on_logon {
            f
        } else {
            venue(b"A", 1, &[(98, b"0"), (108, b"30")])
        };
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.state(), SessionState::Active);
        s.send_app(b"D", b"11=1\x0155=AAPL\x01", T0, &mut out);
        for seq in 2..6 {
            s.on_message(
                Message::parse(&venue(b"0", seq, &[])).unwrap(),
                T0,
                &mut out,
            );
        }
        assert_eq!((s.next_out(), s.next_in()), (3, 6));
        (s, out)
    }

    #[test]
    fn logon_carries_username_and_password_after_encrypt_method_and_heartbeat() {
        let mut s = Session::new(cfg(false, true));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = frames(&out);
        assert_eq!(
            body(&f[0]),
            [
                (98, b"0".to_vec()),
                (108, b"30".to_vec()),
                (553, b"trader1".to_vec()),
                (554, b"s3cret-pw".to_vec()),
            ]
        );
        assert_eq!(Message::parse(&f[0]).unwrap().seq(), Some(1));
        // Not configured: neither tag, and no reset flag.
        let mut s = Session::new(cfg(false, false));
        out.clear();
        s.on_connect(T0, &mut out);
        assert_eq!(
            body(&frames(&out)[0]),
            [(98, b"0".to_vec()), (108, b"30".to_vec())]
        );
        // The password shows in no Debug output of the session or its config.
        let s = Session::new(cfg(true, true));
        let dbg = format!("{s:?} {:?}", cfg(true, true));
        assert!(!dbg.contains("s3cret"), "{dbg}");
        assert!(dbg.contains("trader1"), "{dbg}");
    }

    /// A reconnect without `reset_on_logon` keeps counting; with it, the Logon is number 1
    /// with 141=Y (before Username and Password) and both directions start again.
    #[test]
    fn reset_on_logon_sends_141_with_seq_1_on_every_logon_and_restarts_both_directions() {
        let (mut s, mut out) = busy(cfg(false, false));
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        let m = frames(&out);
        let logon = Message::parse(&m[0]).unwrap();
        assert_eq!((logon.seq(), logon.get(141)), (Some(3), None));

        let (mut s, mut out) = busy(cfg(true, true));
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        let m = frames(&out);
        assert_eq!(m.len(), 1);
        let logon = Message::parse(&m[0]).unwrap();
        assert_eq!((logon.msg_type(), logon.seq()), (&b"A"[..], Some(1)));
        assert_eq!(
            body(&m[0]),
            [
                (98, b"0".to_vec()),
                (108, b"30".to_vec()),
                (141, b"Y".to_vec()),
                (553, b"trader1".to_vec()),
                (554, b"s3cret-pw".to_vec()),
            ]
        );
        assert_eq!((s.next_out(), s.next_in()), (2, 1));
        // The venue's Logon 141=Y (its number 1) confirms: logged on, not answered again.
        out.clear();
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out),
            SessionEvent::LoggedOn
        ));
        assert!(out.is_empty(), "no second Logon");
        assert_eq!(s.state(), SessionState::Active);
        assert_eq!((s.next_out(), s.next_in()), (2, 2));
        assert_eq!(s.counters().resets_received, 0);
        // The order sent before the reset (old number 2) is not resent: a ResendRequest
        // from 1 is one gap fill over the Logon.
        let rr = venue(b"2", 2, &[(7, b"1"), (16, b"0")]);
        s.on_message(Message::parse(&rr).unwrap(), T0 + SEC, &mut out);
        let got: Vec<(Vec<u8>, u64, Option<u64>)> = frames(&out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type().to_vec(), m.seq().unwrap(), m.uint(36).ok())
            })
            .collect();
        assert_eq!(got, [(b"4".to_vec(), 1, Some(2))]);
        assert!(s.sent_message(2).is_none());
    }

    /// Replaying what a reset-on-logon session sent and took gives the live numbers, also
    /// when the venue reset on its own before (its reset Logon, then our answer).
    #[test]
    fn replay_of_our_reset_logon_lands_on_the_live_numbers() {
        let (mut s, mut out) = busy(cfg(true, false));
        let mut journal: Vec<(bool, Vec<u8>)> =
            frames(&out).into_iter().map(|f| (true, f)).collect();
        // What `busy` took from the venue, in order: its Logon, then heartbeats 2..=5.
        journal.insert(
            1,
            (
                false,
                venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]),
            ),
        );
        for seq in 2..6 {
            journal.push((false, venue(b"0", seq, &[])));
        }
        s.on_disconnect();
        out.clear();
        s.on_connect(T0 + SEC, &mut out);
        journal.extend(frames(&out).into_iter().map(|f| (true, f)));
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30"), (141, b"Y")]);
        out.clear();
        s.on_message(Message::parse(&f).unwrap(), T0 + SEC, &mut out);
        journal.push((false, f));
        s.send_app(b"D", b"11=2\x0155=AAPL\x01", T0 + SEC, &mut out);
        journal.extend(frames(&out).into_iter().map(|f| (true, f)));
        assert_eq!((s.next_out(), s.next_in()), (3, 2));

        let mut r = Session::new(cfg(true, false));
        for (outbound, f) in &journal {
            if *outbound {
                r.replay_outbound(f);
            } else {
                r.replay_inbound(&Message::parse(f).unwrap());
            }
        }
        assert_eq!((r.next_out(), r.next_in()), (s.next_out(), s.next_in()));
        assert!(r
            .sent_message(2)
            .is_some_and(|m| m.windows(4).any(|w| w == b"11=2")));
        assert_eq!(r.store.slots.iter().filter(|x| x.0 != 0).count(), 1);
    }

    #[test]
    fn the_journal_copy_of_a_logon_has_the_password_redacted() {
        let mut s = Session::new(cfg(true, true));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let redacted = redact_password(&out).unwrap();
        assert!(!redacted.windows(9).any(|w| w == b"s3cret-pw"));
        assert_eq!(split_frame(&redacted), Ok(redacted.len()), "framed again");
        let m = Message::parse(&redacted).unwrap();
        assert_eq!(
            (m.msg_type(), m.seq(), m.get(141), m.get(553), m.get(554)),
            (
                &b"A"[..],
                Some(1),
                Some(&b"Y"[..]),
                Some(&b"trader1"[..]),
                Some(REDACTED)
            )
        );
        // Anything else is journaled as sent.
        let mut out = Vec::new();
        s.send_app(b"D", b"11=1\x01554=x\x01", T0, &mut out);
        assert!(redact_password(&out).is_none());
        let mut s = Session::new(cfg(false, false));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        assert!(redact_password(&out).is_none());
    }
}

mod checks_tests {
    use super::*;

    use super::{active, frames as parsed, venue, T0};

    fn texts(out: &[u8]) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        parsed(out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type().to_vec(), m.get(tag::TEXT).map(<[u8]>::to_vec))
            })
            .collect()
    }

    /// A SequenceReset-GapFill below the expected number without PossDupFlag is as serious
    /// as any other low message (FIX 4.4 Vol. 2): Logout in QuickFIX's words; with
    /// PossDupFlag=Y it is a duplicate, ignored.
    #[test]
    fn low_gap_fill_without_poss_dup_logs_out() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"0", 2, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.next_in(), 3);
        let dup = venue(
            b"4",
            1,
            &[
                (43, b"Y"),
                (122, b"20240102-15:00:00.000"),
                (123, b"Y"),
                (36, b"3"),
            ],
        );
        assert!(matches!(
            s.on_message(Message::parse(&dup).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert!(out.is_empty());
        assert_eq!(s.counters().duplicates_ignored, 1);
        let low = venue(b"4", 1, &[(123, b"Y"), (36, b"3")]);
        assert!(matches!(
            s.on_message(Message::parse(&low).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(
            texts(&out),
            [(
                b"5".to_vec(),
                Some(b"MsgSeqNum too low, expecting 3 but received 1".to_vec())
            )]
        );
        assert_eq!(s.state(), SessionState::Disconnected);
    }
}

mod sending_time_tests {
    use super::*;

    use super::{frames as parsed, venue, SEC, T0};

    const STAMP: &[u8] = b"20240102-15:00:00.000";

    fn cfg(max_latency_secs: u32) -> SessionConfig {
        SessionConfig {
            max_latency_secs,
            ..super::tests::cfg()
        }
    }

    fn active(max_latency_secs: u32) -> Session {
        let mut s = Session::new(cfg(max_latency_secs));
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::LoggedOn
        ));
        s
    }

    /// A venue frame with SendingTime `sending` (absent when `None`).
    fn venue_at(ty: &[u8], seq: u64, sending: Option<&[u8]>, extra: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(ty)
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, seq);
        if let Some(t) = sending {
            w.field(52, t);
        }
        for (t, v) in extra {
            w.field(*t, v);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        out
    }

    /// (MsgType, RefSeqNum, RefTagID, SessionRejectReason, Text) of every frame sent.
    #[allow(clippy::type_complexity)]
    fn sent(out: &[u8]) -> Vec<(String, Option<u64>, Option<u64>, Option<u64>, String)> {
        parsed(out)
            .iter()
            .map(|f| {
                let m = Message::parse(f).unwrap();
                let s = |t| String::from_utf8_lossy(m.get(t).unwrap_or(b"")).into_owned();
                (
                    s(35),
                    m.uint(45).ok(),
                    m.uint(371).ok(),
                    m.uint(373).ok(),
                    s(58),
                )
            })
            .collect()
    }

    fn reject(
        seq: u64,
        tag: u64,
        reason: u64,
        text: &str,
    ) -> (String, Option<u64>, Option<u64>, Option<u64>, String) {
        ("3".into(), Some(seq), Some(tag), Some(reason), text.into())
    }

    fn logout(text: &str) -> (String, Option<u64>, Option<u64>, Option<u64>, String) {
        ("5".into(), None, None, None, text.into())
    }

    /// SendingTime further than `max_latency_secs` from our clock, either way: Reject
    /// 373=10, the number taken, then Logout (FIX 4.4 Vol. 2, QuickFIX's doBadTime); at the
    /// bound it is accepted.
    #[test]
    fn sending_time_beyond_max_latency_is_rejected_then_logged_out() {
        for late in [T0 + 121 * SEC, T0 - 121 * SEC] {
            let mut s = active(120);
            let mut out = Vec::new();
            let f = venue(b"8", 2, &[]);
            assert!(matches!(
                s.on_message(Message::parse(&f).unwrap(), late, &mut out),
                SessionEvent::None
            ));
            assert_eq!(
                sent(&out),
                [
                    reject(2, 52, 10, "SendingTime accuracy problem"),
                    logout("SendingTime accuracy problem")
                ]
            );
            assert_eq!(s.next_in(), 3);
            assert_eq!(s.state(), SessionState::LogoutSent);
            assert_eq!(s.counters().sending_time_problems, 1);
        }
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 120 * SEC, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty());
    }

    /// `max_latency_secs = 0`: no accuracy check (the format is still checked).
    #[test]
    fn max_latency_zero_disables_the_check() {
        let mut s = active(0);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 86_400 * SEC, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty());
    }

    /// SendingTime missing: Reject 373=1 (371=52); not a UTCTimestamp: 373=6. Both take
    /// the number (QuickFIX's generateReject) and keep the session up.
    #[test]
    fn sending_time_missing_or_malformed_is_rejected() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue_at(b"8", 2, None, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        let f = venue_at(b"8", 3, Some(b"2024-01-02 15:00:00"), &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(
            sent(&out),
            [
                reject(2, 52, 1, "Required tag missing"),
                reject(3, 52, 6, "Incorrect data format for value")
            ]
        );
        assert_eq!((s.next_in(), s.state()), (4, SessionState::Active));
        assert_eq!(s.counters().sending_time_problems, 2);
    }

    /// PossDupFlag=Y: OrigSendingTime missing, Reject 373=1 (371=122); later than
    /// SendingTime, 373=10 and Logout (QuickFIX's doPossDup). A SequenceReset-GapFill
    /// without it is accepted, as QuickFIX accepts it.
    #[test]
    fn poss_dup_needs_a_sound_orig_sending_time() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 2, &[(43, b"Y")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(sent(&out), [reject(2, 122, 1, "Required tag missing")]);
        assert_eq!(s.next_in(), 3);
        out.clear();
        let f = venue(b"4", 3, &[(43, b"Y"), (123, b"Y"), (36, b"5")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.next_in(), 5);
        // Well formed: accepted.
        let f = venue(b"8", 5, &[(43, b"Y"), (122, STAMP)]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::App(_)
        ));
        // A too-low duplicate is checked the same way before it is ignored.
        let f = venue(b"8", 4, &[(43, b"Y")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(sent(&out), [reject(4, 122, 1, "Required tag missing")]);
        assert_eq!(s.next_in(), 6);
        out.clear();
        let f = venue(b"8", 6, &[(43, b"Y"), (122, b"20240102-15:00:00.001")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        assert_eq!(
            sent(&out),
            [
                reject(6, 122, 10, "SendingTime accuracy problem"),
                logout("SendingTime accuracy problem")
            ]
        );
        assert_eq!((s.next_in(), s.state()), (7, SessionState::LogoutSent));
    }

    /// The venue's Logon answering ours with a SendingTime out of bounds: no session to
    /// reject in, so Logout with the reason and disconnect (QuickFIX disconnects).
    #[test]
    fn logon_answer_with_a_bad_sending_time_logs_out_and_disconnects() {
        let mut s = Session::new(cfg(120));
        let mut out = Vec::new();
        s.on_connect(T0 + 600 * SEC, &mut out);
        out.clear();
        let f = venue(b"A", 1, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0 + 600 * SEC, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(sent(&out), [logout("SendingTime accuracy problem")]);
        assert_eq!((s.state(), s.next_in()), (SessionState::Disconnected, 1));
    }

    /// A message held ahead of a gap was checked when it arrived: the gap taking longer
    /// than `max_latency_secs` to fill does not make it stale.
    #[test]
    fn queued_messages_are_not_stale_when_the_gap_fills_late() {
        let mut s = active(120);
        let mut out = Vec::new();
        let f = venue(b"8", 3, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.queued_len(), 1);
        out.clear();
        let later = T0 + 300 * SEC;
        let gap = venue_at(
            b"4",
            2,
            Some(b"20240102-15:05:00.000"),
            &[(43, b"Y"), (123, b"Y"), (36, b"3")],
        );
        s.on_message(Message::parse(&gap).unwrap(), later, &mut out);
        assert_eq!(s.next_in(), 3);
        let q = s.next_queued(later, &mut out).unwrap();
        assert!(matches!(
            s.on_queued(Message::parse(&q).unwrap(), later, &mut out),
            SessionEvent::App(_)
        ));
        assert!(out.is_empty(), "{:?}", sent(&out));
        assert_eq!(s.next_in(), 4);
    }
}

mod seq_too_low_tests {
    use super::*;

    use super::{active, cfg, venue, T0};

    /// The venue's Logout answering our Logon, saying our number is too low: counted, the
    /// number it expects kept for the operator, ours never raised from its text.
    #[test]
    fn venue_logout_for_our_number_too_low_is_kept_not_obeyed() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let ours = s.next_out();
        let f = venue(
            b"5",
            1,
            &[(58, b"MsgSeqNum too low, expecting 105 but received 2")],
        );
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        let c = s.counters();
        assert_eq!((c.logons_refused, c.seq_too_low_logouts), (1, 1));
        assert_eq!(s.venue_expects(), Some(105));
        assert_eq!(s.next_out(), ours + 1, "only our Logout answer was added");
        s.clear_venue_expects();
        assert_eq!(s.venue_expects(), None);
        // Mid-session, in other words: kept too; a Logout without it is not.
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"Sequence number too low: expecting 7")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.venue_expects(), Some(7));
        assert_eq!(s.counters().logons_refused, 0);
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"bye")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.venue_expects(), None);
        assert_eq!(expected_in_text(b"MsgSeqNum too low, expecting x"), None);
        assert_eq!(expected_in_text(b"expecting 5, too low"), None);
    }

    /// The reason a venue gives for refusing our Logon is kept for the logs and `status`;
    /// a Logout mid-session is no refusal and leaves it as it was.
    #[test]
    fn the_text_of_a_logout_refusing_our_logon_is_kept() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        assert_eq!(s.logon_refusal(), None);
        s.on_connect(T0, &mut out);
        let f = venue(b"5", 1, &[(58, b"bad Username or Password")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.counters().logons_refused, 1);
        assert_eq!(s.logon_refusal(), Some("bad Username or Password"));
        // Without a Text: refused all the same, for no reason given.
        s.on_disconnect();
        s.on_connect(T0, &mut out);
        let f = venue(b"5", 2, &[]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(
            (s.counters().logons_refused, s.logon_refusal()),
            (2, Some(""))
        );
        // A venue's text is a line: control characters replaced, cut to a bounded length.
        s.on_disconnect();
        s.on_connect(T0, &mut out);
        let long = [b"no\tway ".as_slice(), &[b'x'; 300]].concat();
        let f = venue(b"5", 3, &[(58, &long)]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        let kept = s.logon_refusal().unwrap();
        assert!(
            kept.starts_with("no?way x") && kept.len() == REFUSAL_TEXT_MAX,
            "{kept}"
        );
        // Mid-session: not a refusal.
        let mut s = active();
        let f = venue(b"5", 2, &[(58, b"end of day")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.logon_refusal(), None);
    }
}

/// FIX 4.4 session rules on what the session state allows, TestRequest validation and
/// BeginString (issue 40).
mod session_rules_tests {
    use super::*;
    use crate::fix::split_frame;

    use super::{active, cfg, frames, venue, SEC, T0};

    /// Before the venue's Logon nothing but a Logon, Logout, SequenceReset or Reject is
    /// processed (QuickFIX's validLogonState; FIX 4.4 Vol. 2 test case 1B): an application
    /// message, a Heartbeat or a TestRequest drops the connection unanswered, and its number
    /// is not taken.
    #[test]
    fn messages_before_the_venues_logon_are_not_processed() {
        for ty in [&b"8"[..], b"0", b"1", b"2"] {
            let mut s = Session::new(cfg());
            let mut out = Vec::new();
            s.on_connect(T0, &mut out);
            out.clear();
            let f = venue(ty, 1, &[(112, b"t1"), (7, b"1"), (16, b"0")]);
            assert!(
                matches!(
                    s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
                    SessionEvent::Disconnect
                ),
                "{ty:?} before the Logon"
            );
            assert_eq!(s.state(), SessionState::Disconnected);
            assert_eq!(s.next_in(), 1, "its number is not taken");
            assert!(out.is_empty(), "nothing is answered");
            assert_eq!(s.counters().out_of_state, 1);
        }
        // The venue's Logon still logs on, and a Logout still reads as a refusal.
        let s = active();
        assert_eq!(s.state(), SessionState::Active);
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        let f = venue(b"5", 1, &[(58, b"no")]);
        s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
        assert_eq!(s.counters().logons_refused, 1);
    }

    /// A Logon while logged on (or logging out) without ResetSeqNumFlag does not make a
    /// new session: the connection is dropped, as QuickFIX does (FIX 4.4 Vol. 2 test case
    /// 2Q), its number not taken.
    #[test]
    fn a_second_logon_without_reset_does_not_reactivate_the_session() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"A", 2, &[(98, b"0"), (108, b"30")]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(s.state(), SessionState::Disconnected);
        assert_eq!(s.next_in(), 2);
        assert!(out.is_empty());
        // After our Logout: the venue's Logon does not bring the session back either.
        let mut s = active();
        s.logout(T0, &mut out);
        assert_eq!(s.state(), SessionState::LogoutSent);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::Disconnect
        ));
        assert_ne!(s.state(), SessionState::Active);
        assert_eq!(s.counters().out_of_state, 1);
    }

    /// A TestRequest without TestReqID (112) is answered with a session Reject, 373=1
    /// (required tag missing) naming 112, not with a Heartbeat; its number is taken.
    #[test]
    fn a_test_request_without_its_id_is_rejected_not_answered() {
        let mut s = active();
        let mut out = Vec::new();
        let f = venue(b"1", 2, &[]);
        assert!(matches!(
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out),
            SessionEvent::None
        ));
        let f = frames(&out);
        assert_eq!(f.len(), 1, "one answer");
        let m = Message::parse(&f[0]).unwrap();
        assert_eq!(m.msg_type(), b"3");
        assert_eq!(m.uint(45), Ok(2), "RefSeqNum");
        assert_eq!(m.uint(371), Ok(112), "RefTagID");
        assert_eq!(m.get(372), Some(&b"1"[..]), "RefMsgType");
        assert_eq!(m.uint(373), Ok(1), "required tag missing");
        assert_eq!(s.next_in(), 3);
        assert_eq!(s.counters().rejects_sent, 1);
    }

    /// A sound frame of another FIX version is not garbled: the framing says so
    /// (`WrongBeginString`) and the session logs out saying why, then disconnects (FIX 4.4
    /// Vol. 2 test case 2R; QuickFIX's "Incorrect BeginString").
    #[test]
    fn a_wrong_begin_string_is_logged_out_not_dropped_as_garbled() {
        let mut f = venue(b"0", 2, &[]);
        f[7] = b'2'; // 8=FIX.4.2
        let trailer = f.len() - 7;
        let sum = f[..trailer].iter().map(|&b| u32::from(b)).sum::<u32>() % 256;
        f[trailer + 3..trailer + 6].copy_from_slice(format!("{sum:03}").as_bytes());
        assert_eq!(
            split_frame(&f),
            Err(crate::fix::FixError::WrongBeginString { len: f.len() })
        );
        let mut s = active();
        let mut out = Vec::new();
        assert!(matches!(
            s.on_wrong_begin_string(T0, &mut out),
            SessionEvent::Disconnect
        ));
        let f = frames(&out);
        let m = Message::parse(&f[0]).unwrap();
        assert_eq!(m.msg_type(), b"5");
        assert_eq!(m.get(58), Some(&b"Incorrect BeginString"[..]));
        assert_eq!(s.state(), SessionState::Disconnected);
        assert_eq!(s.counters().wrong_begin_string, 1);
        assert_eq!(s.counters().garbled, 0);
    }

    /// Our Logon, or our Logout, unanswered for two heartbeat intervals: the connection is
    /// dropped (FIX 4.4 Vol. 2 suggests a timeout; QuickFIX's LogonTimeout/LogoutTimeout).
    #[test]
    fn an_unanswered_logon_or_logout_times_out() {
        let mut s = Session::new(cfg());
        let mut out = Vec::new();
        s.on_connect(T0, &mut out);
        assert!(matches!(
            s.on_timer(T0 + 60 * SEC, &mut out),
            SessionEvent::None
        ));
        assert!(matches!(
            s.on_timer(T0 + 61 * SEC, &mut out),
            SessionEvent::Disconnect
        ));
        let mut s = active();
        s.logout(T0, &mut out);
        assert!(matches!(
            s.on_timer(T0 + 61 * SEC, &mut out),
            SessionEvent::Disconnect
        ));
        assert_eq!(s.state(), SessionState::Disconnected);
    }
}

mod queue_bytes_tests {
    use super::*;

    use super::{active, frames, venue, T0};

    /// Large messages ahead of a gap stop being queued at the byte bound; the resend (which
    /// asks up to infinity) brings them back, in order.
    #[test]
    fn the_out_of_order_queue_is_bounded_in_bytes_and_the_rest_comes_with_the_resend() {
        let mut s = active();
        s.set_queue_max_bytes(1 << 20);
        let mut out = Vec::new();
        let text = vec![b'x'; 100_000];
        let next = s.next_in();
        // `next` is lost; the 39 after it arrive, 100 KB each: about ten fit in 1 MiB.
        for seq in next + 1..next + 40 {
            let f = venue(b"8", seq, &[(58, &text)]);
            s.on_message(Message::parse(&f).unwrap(), T0, &mut out);
            assert!(
                s.queued_bytes() <= 1 << 20,
                "{} bytes queued",
                s.queued_bytes()
            );
        }
        let held = s.queued_len() as u64;
        assert!((9..=10).contains(&held), "{held}");
        let c = s.counters();
        assert_eq!((c.queued, c.queue_overflow), (held, 39 - held));
        // One ResendRequest, from the gap up to infinity (EndSeqNo 0).
        let asked: Vec<_> = frames(&out)
            .iter()
            .filter_map(|f| {
                let m = Message::parse(f).unwrap();
                (m.msg_type() == b"2").then(|| (m.uint(7).ok(), m.uint(16).ok()))
            })
            .collect();
        assert_eq!(asked, [(Some(next), Some(0))]);
        // The venue resends from the gap on: the queue drains in order, and what was
        // dropped comes in sequence.
        let mut delivered = Vec::new();
        for seq in next..next + 40 {
            if seq < s.next_in() {
                continue;
            }
            let f = venue(b"8", seq, &[(58, &text)]);
            if let SessionEvent::App(_) = s.on_message(Message::parse(&f).unwrap(), T0, &mut out) {
                delivered.push(seq);
            }
            while let Some(q) = s.next_queued(T0, &mut out) {
                let m = Message::parse(&q).unwrap();
                let seq = m.seq().unwrap();
                if let SessionEvent::App(_) = s.on_queued(m, T0, &mut out) {
                    delivered.push(seq);
                }
            }
        }
        assert_eq!(delivered, (next..next + 40).collect::<Vec<_>>());
        assert_eq!((s.queued_len(), s.queued_bytes()), (0, 0));
    }
}

/// The timer contract (issue 42's one `poll_timeout`): over a seeded walk of a session
/// (venue traffic in and out of sequence, gaps, gap fills, our own sends, time passing,
/// logouts and reconnections), `on_timer` before `poll_timeout()` does nothing (no bytes,
/// no event, no state change), and at `poll_timeout()` it acts. The driver calls it only
/// when due: a deadline later than `on_timer`'s own tests delays heartbeats and timeouts
/// (`on_timer` acts at the instant before it), one earlier makes `on_timer` do nothing at
/// it; both halves are checked, the first at the last instant before each deadline.
#[test]
fn on_timer_acts_exactly_from_poll_timeout() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let (mut acted, mut idle) = (0, 0);
    for _walk in 0..40 {
        let mut s = active();
        let mut now = T0;
        let mut out = Vec::new();
        for _ in 0..300 {
            out.clear();
            let due = s.poll_timeout().map(|t| t.as_nanos());
            match rng.gen_range(0..6) {
                0 => {
                    if let Some(t) = due.filter(|&t| t > now) {
                        // The last instant before the deadline, or any before it.
                        let probe = if rng.gen_bool(0.5) {
                            t - 1
                        } else {
                            rng.gen_range(now..t)
                        };
                        let before = (s.state(), s.next_out(), s.next_in());
                        let ev = s.on_timer(probe, &mut out);
                        assert!(
                            out.is_empty() && matches!(ev, SessionEvent::None),
                            "on_timer acted at {} before its time {}",
                            probe - T0,
                            t - T0
                        );
                        assert_eq!((s.state(), s.next_out(), s.next_in()), before);
                        now = probe;
                        idle += 1;
                    }
                }
                1 => {
                    if let Some(t) = due {
                        now = now.max(t);
                        let ev = s.on_timer(now, &mut out);
                        assert!(
                            !out.is_empty() || matches!(ev, SessionEvent::Disconnect),
                            "on_timer did nothing at its time {} ({:?})",
                            now - T0,
                            s.state()
                        );
                        acted += 1;
                    }
                }
                2 => {
                    // The venue's next message in sequence, some time later.
                    now += rng.gen_range(0..20 * SEC);
                    let f = venue(b"0", s.next_in(), &[]);
                    s.on_message(Message::parse(&f).unwrap(), now, &mut out);
                }
                3 => {
                    // One ahead of a gap (queued, a resend asked for).
                    let f = venue(b"0", s.next_in() + rng.gen_range(1..4), &[]);
                    s.on_message(Message::parse(&f).unwrap(), now, &mut out);
                }
                4 => {
                    // The gap filled (SequenceReset-GapFill up to what is queued, or on).
                    let upto = s.next_in() + rng.gen_range(1..5);
                    let f = venue(
                        b"4",
                        s.next_in(),
                        &[(123, b"Y"), (36, upto.to_string().as_bytes())],
                    );
                    s.on_message(Message::parse(&f).unwrap(), now, &mut out);
                }
                _ => {
                    now += rng.gen_range(0..5 * SEC);
                    s.send_app(b"D", b"11=1\x01", now, &mut out);
                }
            }
            if s.state() == SessionState::Disconnected {
                break;
            }
        }
    }
    assert!(acted > 500 && idle > 500, "acted {acted}, idle {idle}");
}
