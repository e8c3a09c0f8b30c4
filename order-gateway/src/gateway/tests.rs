//! Unit tests of [`Gateway`] driven with hand-built engine requests and venue frames; the
//! fixtures (`risk`, `session`, `aapl`, `SEC`, `T0`) are shared with `recovery_tests`.

use zerocopy::{Immutable, IntoBytes};

use super::*;
use crate::fix::{split_frame, tag, Message, MessageWriter, SessionState};
use crate::journal::decode_record;
use crate::proto::{
    msg_type, Cancel, LogonStatus, NewOrder, OrdState, RejectReason, Replace, Side, TimeInForce,
    PRICE_SCALE,
};
use crate::risk::KillScope;

pub(crate) const SEC: u64 = 1_000_000_000;
pub(crate) const T0: u64 = 1_704_207_600 * SEC;

/// One account (7) and one engine (1); shared with `recovery_tests`.
pub(crate) fn risk() -> RiskConfig {
    toml::from_str(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 100000
        max_open_orders = 100
        max_orders_per_interval = 100
        collar_bps = 500
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#,
    )
    .unwrap()
}

pub(crate) fn session() -> SessionConfig {
    SessionConfig {
        sender_comp_id: "GW".into(),
        target_comp_id: "VENUE".into(),
        heartbeat_secs: 30,
        resend_timeout_ms: 0,
        ..Default::default()
    }
}

pub(crate) fn aapl() -> Symbol {
    Symbol::new("AAPL").unwrap()
}

struct Venue {
    seq: u64,
}

impl Venue {
    fn frame(&mut self, ty: &[u8], fields: &[(u32, &[u8])]) -> Vec<u8> {
        let mut w = MessageWriter::default();
        w.start(ty)
            .field(49, b"VENUE")
            .field(56, b"GW")
            .uint(34, self.seq)
            .timestamp(52, T0);
        self.seq += 1;
        for (t, v) in fields {
            w.field(*t, v);
        }
        let mut out = Vec::new();
        w.finish(&mut out);
        out
    }

    fn exec(&mut self, cl: u64, exec_type: &[u8], last: u32, cum: u32, leaves: u32) -> Vec<u8> {
        let cl = cl.to_string();
        let (last, cum, leaves) = (last.to_string(), cum.to_string(), leaves.to_string());
        self.frame(
            b"8",
            &[
                (37, b"V1"),
                (17, self.seq.to_string().as_bytes()),
                (11, cl.as_bytes()),
                (150, exec_type),
                (39, b"0"),
                (55, b"AAPL"),
                (54, b"1"),
                (32, last.as_bytes()),
                (31, b"100.0"),
                (14, cum.as_bytes()),
                (151, leaves.as_bytes()),
                (6, b"100"),
            ],
        )
    }
}

/// A logged-on gateway with a fresh reference price.
fn active() -> (Gateway, Venue, Outputs) {
    let mut gw = Gateway::new(session(), &risk()).unwrap();
    let mut out = Outputs::default();
    gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    gw.on_connect(T0, &mut out);
    let mut v = Venue { seq: 1 };
    let logon = v.frame(b"A", &[(98, b"0"), (108, b"30")]);
    gw.on_fix_bytes(&logon, T0, &mut out);
    assert_eq!(gw.session().state(), SessionState::Active);
    (gw, v, out)
}

fn new_order(cl: u64, qty: u32, px: i64) -> NewOrder {
    NewOrder::new(
        cl,
        7,
        aapl(),
        Side::Buy,
        qty,
        px * PRICE_SCALE,
        TimeInForce::Day,
    )
}

fn last_fix(out: &Outputs) -> Vec<u8> {
    let mut rest = &out.fix[..];
    let mut last = Vec::new();
    while let Ok(n) = split_frame(rest) {
        last = rest[..n].to_vec();
        rest = &rest[n..];
    }
    last
}

#[test]
fn new_order_goes_out_as_new_order_single_and_fills_come_back() {
    let (mut gw, mut v, mut out) = active();
    out.clear();
    gw.on_engine_message(1, new_order(42, 300, 100).as_bytes(), T0, &mut out);
    let f = last_fix(&out);
    let m = Message::parse(&f).unwrap();
    assert_eq!(m.msg_type(), b"D");
    let id = m.uint(tag::CL_ORD_ID).unwrap();
    assert_eq!(
        (m.get(55), m.get(54), m.get(38), m.get(44), m.get(40)),
        (
            Some(&b"AAPL"[..]),
            Some(&b"1"[..]),
            Some(&b"300"[..]),
            Some(&b"100.0000"[..]),
            Some(&b"2"[..])
        )
    );
    assert!(out.engine.is_empty());
    out.clear();
    gw.on_fix_bytes(&v.exec(id, b"0", 0, 0, 300), T0, &mut out);
    gw.on_fix_bytes(&v.exec(id, b"F", 100, 100, 200), T0, &mut out);
    gw.on_fix_bytes(&v.exec(id, b"F", 200, 300, 0), T0, &mut out);
    let got: Vec<u8> = out.engine.iter().map(|(_, r)| r.as_bytes()[0]).collect();
    assert_eq!(got, [msg_type::ACK, msg_type::PARTIAL_FILL, msg_type::FILL]);
    assert_eq!(gw.order(1, 42).unwrap().status, OrderStatus::Done);
    assert_eq!(gw.risk().position(7, aapl()), 300);
    assert_eq!(gw.risk().open_orders(7), 0);
    // A late duplicate report is ignored: the engine was answered once.
    out.clear();
    gw.on_fix_bytes(&v.exec(id, b"F", 200, 300, 0), T0, &mut out);
    assert!(out.engine.is_empty());
}

#[test]
fn risk_and_session_rejects_reach_the_engine_with_reason() {
    let mut gw = Gateway::new(session(), &risk()).unwrap();
    let mut out = Outputs::default();
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    let Response::Reject(r) = out.engine[0].1 else {
        panic!()
    };
    assert_eq!(r.reason(), RejectReason::SessionDown);
    let (mut gw, _, mut out) = active();
    out.clear();
    gw.on_engine_message(1, new_order(1, 10, 120).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 5000, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(2, new_order(3, 10, 100).as_bytes(), T0, &mut out);
    let reasons: Vec<RejectReason> = out
        .engine
        .iter()
        .map(|(_, r)| match r {
            Response::Reject(r) => r.reason(),
            _ => panic!("not a reject"),
        })
        .collect();
    assert_eq!(
        reasons,
        [
            RejectReason::PriceCollar,
            RejectReason::MaxQuantity,
            RejectReason::AccountNotGranted
        ]
    );
    assert!(out.fix.is_empty(), "nothing rejected reaches the venue");
}

#[test]
fn malformed_engine_and_fix_input_is_counted_not_fatal() {
    let (mut gw, mut v, mut out) = active();
    out.clear();
    gw.on_engine_message(1, &[b'N', 1, 48, 0], T0, &mut out);
    gw.on_engine_message(1, &[], T0, &mut out);
    assert_eq!(gw.counters().malformed_engine, 2);
    assert!(
        matches!(out.engine[0].1, Response::Reject(r) if r.reason() == RejectReason::Malformed)
    );
    // Bad checksum: dropped and counted.
    let mut f = v.frame(b"0", &[]);
    let l = f.len();
    f[l - 2] = b'0' + (f[l - 2] - b'0' + 1) % 10;
    gw.on_fix_bytes(&f, T0, &mut out);
    assert_eq!(gw.counters().malformed_fix, 1);
    // Garbage between frames.
    gw.on_fix_bytes(b"\x00\x01garbage8=FIY", T0, &mut out);
    assert!(gw.counters().malformed_fix >= 2);
    // An execution report missing ExecType: session-level Reject.
    v.seq = gw.session().next_in();
    out.clear();
    let bad = v.frame(b"8", &[(37, b"V"), (11, b"1")]);
    gw.on_fix_bytes(&bad, T0, &mut out);
    let m = Message::parse(&out.fix).unwrap();
    assert_eq!(
        (m.msg_type(), m.uint(tag::REF_TAG_ID)),
        (&b"3"[..], Ok(u64::from(tag::EXEC_TYPE)))
    );
    assert_eq!(gw.counters().rejected_app, 1);
    // Field syntax broken: Reject too, and the session goes on.
    let mut w = MessageWriter::default();
    w.start(b"8")
        .field(49, b"VENUE")
        .field(56, b"GW")
        .uint(34, v.seq)
        .raw_fields(b"oops\x01");
    let mut f = Vec::new();
    w.finish(&mut f);
    out.clear();
    gw.on_fix_bytes(&f, T0, &mut out);
    assert_eq!(Message::parse(&out.fix).unwrap().msg_type(), b"3");
    assert_eq!(gw.session().state(), SessionState::Active);
}

/// MsgType not the third field makes a message garbled (FIX 4.4 Vol. 2): it is ignored, not
/// rejected, and its sequence number stays expected so the venue's resend brings it back.
#[test]
fn a_frame_without_msg_type_third_is_garbled_not_consumed() {
    let (mut gw, mut v, mut out) = active();
    let seq = gw.session().next_in();
    // MessageWriter always writes MsgType first: the frame is built by hand.
    let body = format!("34={seq}\x0135=8\x0149=VENUE\x0156=GW\x0152=20240102-15:00:00.000\x01");
    let mut raw = format!("8=FIX.4.4\x019={}\x01{body}", body.len()).into_bytes();
    let sum = raw.iter().map(|&b| u32::from(b)).sum::<u32>() % 256;
    raw.extend_from_slice(format!("10={sum:03}\x01").as_bytes());
    assert_eq!(split_frame(&raw), Ok(raw.len()));
    out.clear();
    gw.on_fix_bytes(&raw, T0, &mut out);
    assert!(out.fix.is_empty(), "no Reject for a garbled message");
    assert!(out.journal.is_empty(), "nothing journaled");
    assert_eq!(gw.session().next_in(), seq);
    assert_eq!(gw.session().counters().garbled, 1);
    // The good copy of that number is still taken in sequence.
    v.seq = seq;
    gw.on_fix_bytes(&v.frame(b"0", &[]), T0, &mut out);
    assert_eq!(gw.session().next_in(), seq + 1);
    assert_eq!(gw.session().counters().resend_requests_sent, 0);
}

/// A BusinessMessageReject (j) of our NewOrderSingle or cancel is the venue's answer to
/// it: the engine hears of it, and the order does not wait forever for an ack.
#[test]
fn business_message_reject_answers_the_refused_request() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id.to_string();
    let id2 = gw.order(1, 2).unwrap().venue_cl_ord_id;
    out.clear();
    let bmr = v.frame(
        b"j",
        &[(45, b"2"), (372, b"D"), (379, id1.as_bytes()), (380, b"0")],
    );
    gw.on_fix_bytes(&bmr, T0, &mut out);
    assert!(matches!(
        out.engine.last().unwrap().1,
        Response::Reject(r) if r.reason() == RejectReason::VenueReject
    ));
    assert_eq!(gw.order(1, 1).unwrap().status, OrderStatus::Done);
    assert_eq!(gw.open_order_count(), 1);
    // A cancel refused the same way.
    gw.on_fix_bytes(&v.exec(id2, b"0", 0, 0, 10), T0, &mut out);
    gw.on_engine_message(1, Cancel::new(2).as_bytes(), T0, &mut out);
    let rid = Message::parse(&last_fix(&out))
        .unwrap()
        .uint(tag::CL_ORD_ID)
        .unwrap()
        .to_string();
    out.clear();
    let bmr = v.frame(b"j", &[(372, b"F"), (379, rid.as_bytes()), (380, b"0")]);
    gw.on_fix_bytes(&bmr, T0, &mut out);
    assert!(matches!(
        out.engine.last().unwrap().1,
        Response::Reject(r) if r.reason() == RejectReason::VenueCancelReject
    ));
    assert!(gw.order(1, 2).unwrap().pending.is_none());
    assert_eq!(gw.order(1, 2).unwrap().status, OrderStatus::Open);
    assert_eq!(gw.counters().venue_refused, 2);
}

/// A session Reject (3) whose RefSeqNum is our NewOrderSingle (a venue validating against
/// its dictionary refuses it that way) answers the order: rejected, not PendingNew for
/// ever; and a replay of the journal comes to the same state.
#[test]
fn session_reject_of_a_new_order_rejects_it_live_and_on_replay() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    let sent = Message::parse(&last_fix(&out))
        .unwrap()
        .seq()
        .unwrap()
        .to_string();
    let rej = v.frame(
        b"3",
        &[
            (45, sent.as_bytes()),
            (372, b"D"),
            (371, b"59"),
            (373, b"5"),
        ],
    );
    gw.on_fix_bytes(&rej, T0, &mut out);
    assert!(matches!(
        out.engine.last().unwrap().1,
        Response::Reject(r) if r.reason() == RejectReason::VenueReject
    ));
    assert_eq!(gw.order(1, 1).unwrap().status, OrderStatus::Done);
    assert_eq!((gw.open_order_count(), gw.risk().open_orders(7)), (0, 0));
    let r = replay(&out.journal);
    assert_eq!(r.order(1, 1).unwrap().status, OrderStatus::Done);
    assert_eq!(r.open_order_count(), 0);
    // A Reject of an admin message of ours changes no order.
    gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
    let rej = v.frame(b"3", &[(45, b"1"), (373, b"0")]);
    gw.on_fix_bytes(&rej, T0, &mut out);
    assert_eq!(gw.order(1, 2).unwrap().status, OrderStatus::PendingNew);
}

#[test]
fn cancel_replace_and_cancel_on_disconnect() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, new_order(1, 500, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 500, 100).as_bytes(), T0, &mut out);
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 500), T0, &mut out);
    out.clear();
    gw.on_engine_message(
        1,
        Replace::new(1, 400, 99 * PRICE_SCALE).as_bytes(),
        T0,
        &mut out,
    );
    let m = Message::parse(&out.fix).unwrap();
    assert_eq!(
        (m.msg_type(), m.uint(41), m.get(38)),
        (&b"G"[..], Ok(id1), Some(&b"400"[..]))
    );
    let rid = m.uint(11).unwrap();
    // A second change while one is pending is refused.
    gw.on_engine_message(1, Cancel::new(1).as_bytes(), T0, &mut out);
    assert!(
        matches!(out.engine.last().unwrap().1, Response::Reject(r) if r.reason() == RejectReason::PendingChange)
    );
    gw.on_fix_bytes(&v.exec(rid, b"5", 0, 0, 400), T0, &mut out);
    assert!(matches!(out.engine.last().unwrap().1, Response::Replaced(r) if r.qty.get() == 400));
    assert_eq!(gw.order(1, 1).unwrap().params.price, 99 * PRICE_SCALE);
    assert_eq!(gw.risk().exposure(7).0, 400 * 99 + 500 * 100);
    out.clear();
    gw.on_engine_disconnect(1, T0, &mut out);
    let mut rest = &out.fix[..];
    let mut cancels = Vec::new();
    while let Ok(n) = split_frame(rest) {
        let m = Message::parse(&rest[..n]).unwrap();
        assert_eq!(m.msg_type(), b"F");
        cancels.push((m.uint(41).unwrap(), m.uint(11).unwrap()));
        rest = &rest[n..];
    }
    assert_eq!(cancels.len(), 2);
    for (_, req) in cancels {
        gw.on_fix_bytes(&v.exec(req, b"4", 0, 0, 0), T0, &mut out);
    }
    assert_eq!(gw.open_order_count(), 0);
    assert_eq!(gw.open_order_scan(), 0);
    assert_eq!(gw.risk().exposure(7), (0, 0));
}

#[test]
fn open_order_count_is_kept_through_fills_cancels_and_rejects() {
    let (mut gw, mut v, mut out) = active();
    let check = |gw: &Gateway, n: usize| {
        assert_eq!((gw.open_order_count(), gw.open_order_scan()), (n, n));
    };
    for cl in 1..=4 {
        gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), T0, &mut out);
    }
    check(&gw, 4);
    let id = |gw: &Gateway, cl| gw.order(1, cl).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id(&gw, 1), b"0", 0, 0, 10), T0, &mut out);
    check(&gw, 4); // acked: still open
    gw.on_fix_bytes(&v.exec(id(&gw, 1), b"1", 4, 4, 6), T0, &mut out);
    check(&gw, 4); // partly filled
    gw.on_fix_bytes(&v.exec(id(&gw, 1), b"2", 6, 10, 0), T0, &mut out);
    check(&gw, 3); // filled
    gw.on_fix_bytes(&v.exec(id(&gw, 1), b"2", 6, 10, 0), T0, &mut out);
    check(&gw, 3); // a late duplicate report changes nothing
    gw.on_fix_bytes(&v.exec(id(&gw, 2), b"4", 0, 0, 0), T0, &mut out);
    check(&gw, 2); // canceled
    gw.on_fix_bytes(&v.exec(id(&gw, 3), b"8", 0, 0, 0), T0, &mut out);
    check(&gw, 1); // rejected by the venue
}

#[test]
fn kill_switch_cancels_and_blocks() {
    let (mut gw, _, mut out) = active();
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    out.clear();
    gw.set_kill(KillScope::Account(7), true, T0, &mut out);
    assert_eq!(Message::parse(&out.fix).unwrap().msg_type(), b"F");
    gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
    assert!(
        matches!(out.engine.last().unwrap().1, Response::Reject(r) if r.reason() == RejectReason::KillSwitchAccount)
    );
}

#[test]
fn journal_replay_rebuilds_orders_positions_and_sequence_numbers() {
    let (mut gw, mut v, mut out) = active();
    let mut journal = Vec::new();
    gw.on_engine_message(1, new_order(1, 300, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(3, 10, 200).as_bytes(), T0, &mut out); // collar reject
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"F", 100, 100, 200), T0, &mut out);
    journal.extend_from_slice(&out.journal);
    let mut r = Gateway::new(session(), &risk()).unwrap();
    let mut rest = &journal[..];
    while let Some((k, p, n)) = decode_record(rest) {
        r.replay_record(k, p);
        rest = &rest[n..];
    }
    assert!(rest.is_empty());
    assert_eq!(
        (r.session().next_out(), r.session().next_in()),
        (gw.session().next_out(), gw.session().next_in())
    );
    assert_eq!(r.open_order_count(), 2);
    assert_eq!(gw.open_order_count(), gw.open_order_scan());
    assert_eq!(r.order(1, 1).unwrap().cum_qty, 100);
    assert_eq!(r.risk().position(7, aapl()), 100);
    assert_eq!(r.risk().exposure(7), gw.risk().exposure(7));
    assert_eq!(r.risk().open_orders(7), 2);
    // Ids are not reused, and engine ids stay single-use (including the rejected one).
    let mut out2 = Outputs::default();
    r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    r.on_engine_message(1, new_order(3, 10, 100).as_bytes(), T0, &mut out2);
    assert!(
        matches!(out2.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::SessionDown)
    );
    r.on_connect(T0, &mut out2);
    r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out2);
    out2.clear();
    r.on_engine_message(1, new_order(2, 10, 100).as_bytes(), T0, &mut out2);
    assert!(
        matches!(out2.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::DuplicateClientOrderId)
    );
    r.on_engine_message(1, new_order(9, 10, 100).as_bytes(), T0, &mut out2);
    let m = Message::parse(&last_fix(&out2)).unwrap().uint(11).unwrap();
    assert!(m > gw.order(1, 2).unwrap().venue_cl_ord_id);
}
/// A venue ResendRequest answered with thousands of messages (several MiB of FIX) is
/// journaled, and after a restart every record after it still replays.
#[test]
fn a_resend_of_several_mebibytes_is_journaled_and_everything_after_it_replays() {
    use crate::journal::{FsyncPolicy, Journal};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gw.journal");
    let big = r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        max_identical_orders = 0
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 100000000000
        max_position = 100000000
        max_open_orders = 100000
        max_orders_per_interval = 100000
        collar_bps = 500
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
    "#;
    let risk: RiskConfig = toml::from_str(big).unwrap();
    let (mut j, _) = Journal::open(&path, FsyncPolicy::Never, |_, _| {}).unwrap();
    let mut gw = Gateway::new(session(), &risk).unwrap();
    let mut out = Outputs::default();
    let flush = |out: &mut Outputs, j: &mut Journal| {
        j.append(&out.journal, out.journal_records).unwrap();
        out.clear();
    };
    gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    gw.on_connect(T0, &mut out);
    let mut v = Venue { seq: 1 };
    gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    flush(&mut out, &mut j);
    for cl in 1..=6000 {
        gw.on_engine_message(1, new_order(cl, 1, 100).as_bytes(), T0, &mut out);
        flush(&mut out, &mut j);
    }
    let resend = v.frame(b"2", &[(7, b"1"), (16, b"0")]);
    gw.on_fix_bytes(&resend, T0, &mut out);
    assert!(out.fix.len() > 1 << 20, "resend of {} bytes", out.fix.len());
    flush(&mut out, &mut j);
    // Later history: a fill and one more order.
    let id = gw.order(1, 5999).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id, b"F", 1, 1, 0), T0, &mut out);
    gw.on_engine_message(1, new_order(6001, 1, 100).as_bytes(), T0, &mut out);
    flush(&mut out, &mut j);
    drop(j);
    let mut r = Gateway::new(session(), &risk).unwrap();
    let (_, stats) =
        Journal::open(&path, FsyncPolicy::Never, |k, p| r.replay_record(k, p)).unwrap();
    assert_eq!(stats.truncated_bytes, 0);
    assert_eq!(
        (r.session().next_out(), r.session().next_in()),
        (gw.session().next_out(), gw.session().next_in())
    );
    assert_eq!(r.order(1, 5999).unwrap().cum_qty, 1);
    assert!(r.order(1, 6001).is_some());
    assert_eq!(r.open_order_count(), gw.open_order_count());
}

/// Numbers a request frame as an engine's client does.
fn numbered<T: IntoBytes + Immutable>(m: &T, seq: u32) -> Vec<u8> {
    let mut b = m.as_bytes().to_vec();
    b[4..8].copy_from_slice(&seq.to_le_bytes());
    b
}

/// A request taken before (even before a restart) is answered with the order's state,
/// unnumbered, and neither journaled nor sent to the venue again.
#[test]
fn a_resent_request_is_answered_with_status_and_never_acted_on_twice() {
    let (mut gw, mut v, mut out) = active();
    let mut journal = Vec::new();
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    gw.on_engine_message(1, &numbered(&new_order(2, 10, 200), 2), T0, &mut out); // collar
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"1", 100, 100, 200), T0, &mut out);
    assert_eq!(gw.last_request_seq(1), 2);
    journal.extend_from_slice(&out.journal);
    // After a restart the journal alone says what was taken.
    let mut r = replay(&journal);
    assert_eq!(r.last_request_seq(1), 2);
    assert_eq!(r.last_request_seq(2), 0);
    r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    r.on_connect(T0, &mut out);
    r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    out.clear();
    r.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    r.on_engine_message(1, &numbered(&new_order(2, 10, 200), 2), T0, &mut out);
    r.on_engine_message(1, &numbered(&Cancel::new(1), 2), T0, &mut out);
    assert!(out.fix.is_empty() && out.journal.is_empty() && out.engine.is_empty());
    let st: Vec<(u64, u8, u32, u16, u8)> = out
        .info
        .iter()
        .map(|(e, resp)| {
            assert_eq!(*e, 1);
            assert_eq!(resp.seq(), 0, "status answers are unnumbered");
            let Response::Status(s) = resp else {
                panic!("{resp:?}")
            };
            (
                s.cl_ord_id.get(),
                s.state,
                s.cum_qty.get(),
                s.reason.get(),
                s.request,
            )
        })
        .collect();
    assert_eq!(
        st,
        [
            (1, OrdState::Open as u8, 100, 0, msg_type::NEW_ORDER),
            (
                2,
                OrdState::Rejected as u8,
                0,
                RejectReason::PriceCollar as u16,
                msg_type::NEW_ORDER
            ),
            (1, OrdState::Open as u8, 100, 0, msg_type::CANCEL),
        ]
    );
    assert_eq!(r.counters().resent_requests, 3);
    // The next number is a new request, acted on as usual.
    out.clear();
    r.on_engine_message(1, &numbered(&new_order(3, 10, 100), 3), T0, &mut out);
    assert!(!out.fix.is_empty() && out.info.is_empty());
    assert_eq!(r.last_request_seq(1), 3);
}

fn fix_types(out: &Outputs) -> Vec<Vec<u8>> {
    let mut rest = &out.fix[..];
    let mut types = Vec::new();
    while let Ok(n) = split_frame(rest) {
        types.push(Message::parse(&rest[..n]).unwrap().msg_type().to_vec());
        rest = &rest[n..];
    }
    types
}

/// An engine logged on when the gateway died has `engine_timeout` after the restart to
/// log on again; if it does not, its open orders are cancelled at the venue.
#[test]
fn cancel_on_disconnect_survives_a_restart() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_logon(1, &mut out);
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    gw.on_engine_message(1, &numbered(&new_order(2, 300, 100), 2), T0, &mut out);
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
    let journal = out.journal.clone();
    let restart = |v: &mut Venue| {
        let mut r = replay(&journal);
        r.arm_restart_cancel_on_disconnect(T0, 5 * SEC);
        assert_eq!(r.restart_deadlines(), &[(1, T0 + 5 * SEC)]);
        let mut o = Outputs::default();
        r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
        r.on_connect(T0, &mut o);
        r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut o);
        o.clear();
        (r, o)
    };
    // The engine never comes back: both open orders are cancelled once the time is up.
    let (mut r, mut o) = restart(&mut v);
    r.on_timer(T0 + SEC, &mut o);
    assert!(!fix_types(&o).contains(&b"F".to_vec()));
    r.on_timer(T0 + 6 * SEC, &mut o);
    assert_eq!(fix_types(&o), [b"F".to_vec(), b"F".to_vec()]);
    assert_eq!(r.counters().deferred_cancel_on_disconnect, 1);
    assert!(r.restart_deadlines().is_empty());
    // It logs on in time: nothing is cancelled.
    let (mut r, mut o) = restart(&mut v);
    r.on_engine_logon(1, &mut o);
    r.on_timer(T0 + 6 * SEC, &mut o);
    assert!(!fix_types(&o).contains(&b"F".to_vec()));
    // A clean disconnect before the crash leaves nothing to guard.
    let mut clean = Outputs::default();
    let (mut g2, _, _) = active();
    g2.on_engine_logon(1, &mut clean);
    g2.on_engine_disconnect(1, T0, &mut clean);
    let mut r2 = replay(&clean.journal);
    r2.arm_restart_cancel_on_disconnect(T0, 5 * SEC);
    assert!(r2.restart_deadlines().is_empty());
}

/// A kill switch is journaled: after a restart it is still on, and new orders are
/// rejected with its reason until it is turned off.
#[test]
fn kill_switches_survive_a_restart() {
    let (mut gw, mut v, mut out) = active();
    gw.set_kill(KillScope::Account(7), true, T0, &mut out);
    gw.set_kill(KillScope::Global, true, T0, &mut out);
    gw.set_kill(KillScope::Global, false, T0, &mut out);
    let mut r = replay(&out.journal);
    assert_eq!(r.risk().kills(), (false, vec![], vec![7]));
    r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    let mut o = Outputs::default();
    r.on_connect(T0, &mut o);
    r.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut o);
    o.clear();
    r.on_engine_message(1, &numbered(&new_order(1, 10, 100), 1), T0, &mut o);
    assert!(
        matches!(o.engine[0].1, Response::Reject(x) if x.reason() == RejectReason::KillSwitchAccount),
        "{:?}",
        o.engine
    );
}

/// An engine that drops while the venue session is down has its orders cancelled once
/// the session is back, instead of cancels rejected as SessionDown to nobody.
#[test]
fn cancel_on_disconnect_waits_for_the_venue_session() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
    gw.on_disconnect();
    out.clear();
    gw.on_engine_disconnect(1, T0, &mut out);
    assert!(out.fix.is_empty() && out.engine.is_empty());
    gw.on_timer(T0 + SEC, &mut out);
    assert!(out.fix.is_empty());
    gw.on_connect(T0, &mut out);
    gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    out.clear();
    gw.on_timer(T0 + 2 * SEC, &mut out);
    assert_eq!(fix_types(&out), [b"F".to_vec()]);
    assert!(gw.restart_deadlines().is_empty());
}

/// An acked order of 300 with a replace to 200 in flight: the gateway, the venue, the
/// outputs, the order's ClOrdID and the replace's.
fn replace_in_flight() -> (Gateway, Venue, Outputs, u64, u64) {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    let id = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id, b"0", 0, 0, 300), T0, &mut out);
    let replace = Replace::new(1, 200, 100 * PRICE_SCALE);
    gw.on_engine_message(1, &numbered(&replace, 2), T0, &mut out);
    let rid = Message::parse(&last_fix(&out)).unwrap().uint(11).unwrap();
    out.fix.clear();
    (gw, v, out, id, rid)
}

/// The last FIX message sent: (MsgType, OrigClOrdID).
fn last_type_and_orig(out: &Outputs) -> (Vec<u8>, Option<u64>) {
    let last = last_fix(out);
    let m = Message::parse(&last).unwrap();
    (m.msg_type().to_vec(), m.uint(41).ok())
}

/// A gateway cancel (here the kill switch, then cancel-on-disconnect) that finds an order
/// with a replace in flight cancels it once the venue has answered the replace, replaced
/// or refused; the journal replays to the same state.
#[test]
fn a_gateway_cancel_waits_for_a_replace_in_flight_then_cancels() {
    for refused in [false, true] {
        let (mut gw, mut v, mut out, id, rid) = replace_in_flight();
        gw.set_kill(KillScope::Account(7), true, T0, &mut out);
        assert!(
            !fix_types(&out).contains(&b"F".to_vec()),
            "one change at a time"
        );
        let answer = if refused {
            v.frame(
                b"9",
                &[
                    (37, b"V1"),
                    (11, rid.to_string().as_bytes()),
                    (41, id.to_string().as_bytes()),
                    (39, b"0"),
                    (434, b"2"),
                ],
            )
        } else {
            v.exec(rid, b"5", 0, 0, 200)
        };
        gw.on_fix_bytes(&answer, T0, &mut out);
        let orig = if refused { id } else { rid };
        assert_eq!(
            last_type_and_orig(&out),
            (b"F".to_vec(), Some(orig)),
            "refused {refused}"
        );
        let r = replay(&out.journal);
        assert!(
            r.order(1, 1).unwrap().pending.is_some(),
            "the cancel replayed"
        );
    }
    // Cancel-on-disconnect waits the same way.
    let (mut gw, mut v, mut out, _, rid) = replace_in_flight();
    gw.on_engine_disconnect(1, T0, &mut out);
    assert!(out.fix.is_empty());
    gw.on_fix_bytes(&v.exec(rid, b"5", 0, 0, 200), T0, &mut out);
    assert_eq!(last_type_and_orig(&out), (b"F".to_vec(), Some(rid)));
}

/// What the operator's status calls unacknowledged: a new order until the venue's ack, a
/// cancel until the venue's answer.
#[test]
fn unacknowledged_counts_requests_the_venue_has_not_answered() {
    let (mut gw, mut v, mut out) = active();
    assert_eq!(gw.unacknowledged(), (0, 0));
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    assert_eq!(gw.unacknowledged(), (1, 0));
    let id = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id, b"0", 0, 0, 300), T0, &mut out);
    assert_eq!(gw.unacknowledged(), (0, 0));
    gw.on_engine_message(1, &numbered(&Cancel::new(1), 2), T0, &mut out);
    assert_eq!(gw.unacknowledged(), (0, 1));
}

/// A kill switch turned on while the venue session is down cannot cancel at once (the
/// engine hears `SessionDown` for those cancels); its orders are cancelled at the next
/// logon, and a replay of the journal reaches the same state. Orders outside its scope are
/// left alone, and a logon with nothing killed cancels nothing.
#[test]
fn a_kill_switch_turned_on_while_the_venue_is_down_cancels_at_the_next_logon() {
    let account = |id| {
        format!(
            "[[accounts]]\nid = {id}\nmax_order_qty = 1000\nmax_order_notional = 1000000\n\
             credit_limit = 10000000\nmax_position = 100000\nmax_open_orders = 100\n\
             max_orders_per_interval = 100\ncollar_bps = 500\n"
        )
    };
    let text = format!(
        "reference_max_age_ms = 5000\nthrottle_interval_ms = 1000\n{}{}[[engines]]\nid = 1\naccounts = [7, 8]\ntoken = \"e1\"\n",
        account(7),
        account(8)
    );
    let risk: RiskConfig = toml::from_str(&text).unwrap();
    let mut gw = Gateway::new(session(), &risk).unwrap();
    let mut out = Outputs::default();
    gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    gw.on_connect(T0, &mut out);
    let mut v = Venue { seq: 1 };
    gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    let mut ids = Vec::new();
    for (cl, account) in [(1, 7), (2, 8)] {
        let mut m = new_order(cl, 300, 100);
        m.account = account.into();
        gw.on_engine_message(1, &numbered(&m, cl as u32), T0, &mut out);
        let id = gw.order(1, cl).unwrap().venue_cl_ord_id;
        gw.on_fix_bytes(&v.exec(id, b"0", 0, 0, 300), T0, &mut out);
        ids.push(id);
    }
    assert_eq!(gw.open_order_count(), 2);
    // A logon with nothing killed cancels nothing.
    gw.on_disconnect();
    gw.on_connect(T0, &mut out);
    out.fix.clear();
    gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    assert!(!fix_types(&out).contains(&b"F".to_vec()));

    gw.on_disconnect();
    let kept = (std::mem::take(&mut out.journal), out.journal_records);
    out.clear();
    (out.journal, out.journal_records) = kept;
    gw.set_kill(KillScope::Account(7), true, T0, &mut out);
    assert!(
        matches!(out.engine[..], [(1, Response::Reject(x))]
            if x.reason() == RejectReason::SessionDown && x.request == msg_type::CANCEL),
        "{:?}",
        out.engine
    );
    assert_eq!(gw.order(1, 1).unwrap().status, OrderStatus::Open);
    gw.on_connect(T0 + SEC, &mut out);
    out.fix.clear();
    gw.on_fix_bytes(
        &v.frame(b"A", &[(98, b"0"), (108, b"30")]),
        T0 + SEC,
        &mut out,
    );
    let mut cancels: Vec<Vec<u8>> = Vec::new();
    let mut rest = &out.fix[..];
    while let Ok(n) = split_frame(rest) {
        let m = Message::parse(&rest[..n]).unwrap();
        if m.msg_type() == b"F" {
            cancels.push(m.get(tag::ORIG_CL_ORD_ID).unwrap().to_vec());
        }
        rest = &rest[n..];
    }
    assert_eq!(
        cancels,
        [ids[0].to_string().into_bytes()],
        "account 7's order only"
    );
    assert!(gw.order(1, 1).unwrap().pending.is_some());
    assert!(gw.order(1, 2).unwrap().pending.is_none());
    let r = replay_like(&risk, &out.journal);
    assert!(r.order(1, 1).unwrap().pending.is_some(), "replayed");
    assert_eq!(r.open_order_count(), 2);
    // Once cancelled (pending, then done), the next logon sends nothing more.
    gw.on_disconnect();
    gw.on_connect(T0 + 2 * SEC, &mut out);
    out.fix.clear();
    gw.on_fix_bytes(
        &v.frame(b"A", &[(98, b"0"), (108, b"30")]),
        T0 + 2 * SEC,
        &mut out,
    );
    assert!(!fix_types(&out).contains(&b"F".to_vec()), "already pending");
}

/// At a logon the venue is asked about every order sent and not yet acknowledged; an
/// ExecType I answer that it has the order acknowledges it to the engine.
#[test]
fn orders_in_doubt_are_queried_at_logon() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, &numbered(&new_order(1, 300, 100), 1), T0, &mut out);
    gw.on_engine_message(1, &numbered(&new_order(2, 300, 100), 2), T0, &mut out);
    let (id1, id2) = (
        gw.order(1, 1).unwrap().venue_cl_ord_id,
        gw.order(1, 2).unwrap().venue_cl_ord_id,
    );
    gw.on_fix_bytes(&v.exec(id2, b"0", 0, 0, 300), T0, &mut out);
    // The connection drops before order 1 is acknowledged; the restarted session asks.
    gw.on_disconnect();
    out.clear();
    gw.on_connect(T0, &mut out);
    gw.on_fix_bytes(&v.frame(b"A", &[(98, b"0"), (108, b"30")]), T0, &mut out);
    let mut rest = &out.fix[..];
    let mut queried = Vec::new();
    while let Ok(n) = split_frame(rest) {
        let m = Message::parse(&rest[..n]).unwrap();
        if m.msg_type() == b"H" {
            queried.push(m.uint(11).unwrap());
        }
        rest = &rest[n..];
    }
    assert_eq!(queried, [id1]);
    assert_eq!(gw.counters().status_requests, 1);
    out.clear();
    let mut status = v.exec(id1, b"I", 0, 0, 300);
    // v.exec writes OrdStatus 0 (New): the venue has it.
    assert!(status.windows(5).any(|w| w == b"\x0139=0"));
    gw.on_fix_bytes(&std::mem::take(&mut status), T0, &mut out);
    assert_eq!(gw.order(1, 1).unwrap().status, OrderStatus::Open);
    assert!(matches!(out.engine[..], [(1, Response::Ack(_))]));
}

fn replay(journal: &[u8]) -> Gateway {
    let mut r = Gateway::new(session(), &risk()).unwrap();
    let mut rest = journal;
    while let Some((k, p, n)) = decode_record(rest) {
        r.replay_record(k, p);
        rest = &rest[n..];
    }
    assert!(rest.is_empty());
    r
}

fn bytes<'a>(it: impl Iterator<Item = &'a Response>) -> Vec<Vec<u8>> {
    it.map(|r| r.as_bytes().to_vec()).collect()
}

#[test]
fn responses_are_numbered_per_engine_kept_and_rebuilt_from_the_journal() {
    let (mut gw, mut v, mut out) = active();
    gw.on_engine_message(1, new_order(1, 300, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 10, 200).as_bytes(), T0, &mut out); // collar
    gw.on_engine_message(1, &[b'N', 1, 48, 0], T0, &mut out); // malformed
    gw.on_engine_message(2, new_order(3, 10, 100).as_bytes(), T0, &mut out); // engine 2
    let id1 = gw.order(1, 1).unwrap().venue_cl_ord_id;
    gw.on_fix_bytes(&v.exec(id1, b"0", 0, 0, 300), T0, &mut out);
    gw.on_fix_bytes(&v.exec(id1, b"F", 100, 100, 200), T0, &mut out);
    // The engine goes away: its order is canceled, the Canceled is numbered and kept.
    gw.on_engine_disconnect(1, T0, &mut out);
    let cancel = Message::parse(&last_fix(&out)).unwrap().uint(11).unwrap();
    gw.on_fix_bytes(&v.exec(cancel, b"4", 0, 100, 0), T0, &mut out);
    let numbered: Vec<(EngineId, u32, u8)> = out
        .engine
        .iter()
        .map(|(e, r)| (*e, r.seq(), r.as_bytes()[0]))
        .collect();
    assert_eq!(
        numbered,
        [
            (1, 1, msg_type::REJECT),
            (1, 2, msg_type::REJECT),
            (2, 1, msg_type::REJECT),
            (1, 3, msg_type::ACK),
            (1, 4, msg_type::PARTIAL_FILL),
            (1, 5, msg_type::CANCELED),
        ]
    );
    assert_eq!((gw.last_response_seq(1), gw.last_response_seq(2)), (5, 1));
    let engine1: Vec<Vec<u8>> = bytes(out.engine.iter().filter(|(e, _)| *e == 1).map(|(_, r)| r));
    // What an engine that processed response 2 missed: 3, 4, 5, byte for byte.
    assert_eq!(bytes(gw.responses_after(1, 2).unwrap()), engine1[2..]);
    assert_eq!(gw.responses_after(1, 5).unwrap().count(), 0);
    assert_eq!(
        gw.responses_after(1, 6).err(),
        Some(LogonStatus::BadSequence)
    );
    assert_eq!(gw.last_response_seq(99), 0);
    // A restart rebuilds numbers and history from the journal alone.
    let r = replay(&out.journal);
    assert_eq!((r.last_response_seq(1), r.last_response_seq(2)), (5, 1));
    assert_eq!(bytes(r.responses_after(1, 0).unwrap()), engine1);
    // And numbering continues where it stopped.
    let mut r = r;
    let mut out2 = Outputs::default();
    r.on_engine_message(1, &[], T0, &mut out2);
    assert_eq!(out2.engine[0].1.seq(), 6);
}

#[test]
fn response_history_is_bounded() {
    let mut gw = Gateway::new(session(), &risk())
        .unwrap()
        .with_response_history(2);
    let mut out = Outputs::default();
    for _ in 0..5 {
        gw.on_engine_message(1, &[], T0, &mut out);
    }
    assert_eq!(gw.last_response_seq(1), 5);
    assert_eq!(gw.responses_after(1, 3).unwrap().count(), 2);
    assert_eq!(
        gw.responses_after(1, 2).err(),
        Some(LogonStatus::ReplayUnavailable)
    );
}

/// A gateway on [`risk`] with `extra` keys in `[risk]` and `account` keys added to the
/// account, logged on, with a fresh reference price.
fn active_with(extra: &str, account: &str) -> (Gateway, Venue, Outputs) {
    let text = format!(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        {extra}
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 100000
        max_open_orders = 100
        collar_bps = 500
        {account}
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#
    );
    let risk: RiskConfig = toml::from_str(&text).unwrap();
    let mut gw = Gateway::new(session(), &risk).unwrap();
    let mut out = Outputs::default();
    gw.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    gw.on_connect(T0, &mut out);
    let mut v = Venue { seq: 1 };
    let logon = v.frame(b"A", &[(98, b"0"), (108, b"30")]);
    gw.on_fix_bytes(&logon, T0, &mut out);
    assert_eq!(gw.session().state(), SessionState::Active);
    (gw, v, out)
}

/// Replays `journal` into a fresh gateway built like `like` (same risk config).
fn replay_like(risk: &RiskConfig, journal: &[u8]) -> Gateway {
    let mut r = Gateway::new(session(), risk).unwrap();
    let mut rest = journal;
    while let Some((k, p, n)) = decode_record(rest) {
        r.replay_record(k, p);
        rest = &rest[n..];
    }
    assert!(rest.is_empty());
    r
}

fn reject_reasons(out: &Outputs) -> Vec<RejectReason> {
    out.engine
        .iter()
        .filter_map(|(_, r)| match r {
            Response::Reject(x) => Some(x.reason()),
            _ => None,
        })
        .collect()
}

const WINDOWS: &str = "max_identical_orders = 3";
const ACCOUNT_WINDOWS: &str = "max_orders_per_interval = 5
        max_cancels_per_interval = 2
        max_replaces_per_interval = 1";

fn windows_config() -> RiskConfig {
    toml::from_str(&format!(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        {WINDOWS}
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 100000
        max_open_orders = 100
        collar_bps = 500
        {ACCOUNT_WINDOWS}
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#
    ))
    .unwrap()
}

/// The engine's requests: three identical orders (the fourth rejects), two more new
/// orders (the next is throttled), cancels and replaces up to their own limits.
fn exhaust_windows(gw: &mut Gateway, out: &mut Outputs) {
    let t = T0 + SEC / 10;
    for cl in 1..=4 {
        gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), t, out);
    }
    gw.on_engine_message(1, new_order(5, 11, 100).as_bytes(), t, out);
    gw.on_engine_message(1, new_order(6, 12, 100).as_bytes(), t, out);
    gw.on_engine_message(1, new_order(7, 13, 100).as_bytes(), t, out);
    gw.on_engine_message(1, Replace::new(5, 20, 100 * PRICE_SCALE).as_bytes(), t, out);
    gw.on_engine_message(1, Replace::new(6, 20, 100 * PRICE_SCALE).as_bytes(), t, out);
    for cl in 1..=3 {
        gw.on_engine_message(1, Cancel::new(cl).as_bytes(), t, out);
    }
}

#[test]
fn throttles_and_repeated_orders_reject_and_rebuild_from_the_journal() {
    let (mut gw, _v, mut out) = active_with(WINDOWS, ACCOUNT_WINDOWS);
    out.clear();
    exhaust_windows(&mut gw, &mut out);
    use RejectReason::{RepeatedOrder, Throttled};
    assert_eq!(
        reject_reasons(&out),
        [RepeatedOrder, Throttled, Throttled, Throttled]
    );
    let t = T0 + SEC / 2;
    let o = gw.order(1, 1).unwrap().params;
    assert_eq!(gw.risk().throttle_usage(7, t), [5, 2, 1]);
    assert_eq!(gw.risk().identical_count(&o, t), 3);
    // A restart: the windows are what they were, so the next requests get the same
    // answers from the rebuilt gateway as from the live one.
    let mut r = replay_like(&windows_config(), &out.journal);
    assert_eq!(r.risk().throttle_usage(7, t), [5, 2, 1]);
    assert_eq!(r.risk().identical_count(&o, t), 3);
    assert_eq!(r.risk().firm_exposure(), gw.risk().firm_exposure());
    let mut v = Venue { seq: 2 };
    r.on_reference_price(aapl(), 100 * PRICE_SCALE, T0);
    r.on_connect(T0, &mut Outputs::default());
    r.on_fix_bytes(
        &v.frame(b"A", &[(98, b"0"), (108, b"30")]),
        T0,
        &mut Outputs::default(),
    );
    assert_eq!(r.session().state(), SessionState::Active);
    for g in [&mut gw, &mut r] {
        let mut o2 = Outputs::default();
        g.on_engine_message(1, new_order(20, 14, 100).as_bytes(), t, &mut o2);
        g.on_engine_message(1, Cancel::new(6).as_bytes(), t, &mut o2);
        assert_eq!(reject_reasons(&o2), [Throttled, Throttled]);
    }
    // A window later everything is free again.
    let later = T0 + 2 * SEC;
    r.on_reference_price(aapl(), 100 * PRICE_SCALE, later);
    let mut o3 = Outputs::default();
    r.on_engine_message(1, new_order(21, 10, 100).as_bytes(), later, &mut o3);
    r.on_engine_message(1, Cancel::new(6).as_bytes(), later, &mut o3);
    assert_eq!(reject_reasons(&o3), []);
}

/// Journals written before decisions carried their time still replay: orders and
/// reservations as before, the windows empty.
#[test]
fn decisions_without_a_trailer_still_replay() {
    let (mut gw, _v, mut out) = active_with(WINDOWS, ACCOUNT_WINDOWS);
    exhaust_windows(&mut gw, &mut out);
    let mut old = Vec::new();
    let mut rest = &out.journal[..];
    while let Some((k, p, n)) = decode_record(rest) {
        let p = if k == record::DECISION {
            &p[..size_of::<Decision>()]
        } else {
            p
        };
        encode_record(&mut old, k, &[p]);
        rest = &rest[n..];
    }
    let r = replay_like(&windows_config(), &old);
    assert_eq!(r.open_order_count(), gw.open_order_count());
    assert_eq!(r.risk().exposure(7), gw.risk().exposure(7));
    assert_eq!(r.risk().throttle_usage(7, T0 + SEC / 2), [0, 0, 0]);
}

/// Kill switches, cancel-all and cancel-on-disconnect cancel whatever the engine's
/// cancel throttle says: the operator stays in control.
#[test]
fn cancels_the_gateway_makes_are_never_throttled() {
    let (mut gw, _v, mut out) = active_with(
        "max_identical_orders = 0",
        "max_orders_per_interval = 100\nmax_cancels_per_interval = 1",
    );
    for cl in 1..=6 {
        gw.on_engine_message(1, new_order(cl, 10, 100).as_bytes(), T0, &mut out);
    }
    out.clear();
    gw.on_engine_message(1, Cancel::new(1).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, Cancel::new(2).as_bytes(), T0, &mut out);
    assert_eq!(reject_reasons(&out), [RejectReason::Throttled]);
    out.clear();
    gw.cancel_all(Some(7), T0, &mut out);
    assert_eq!(fix_types(&out), vec![b"F".to_vec(); 5]);
    let pending = gw.orders().filter(|(_, o)| o.pending.is_some()).count();
    assert_eq!(pending, 6);
    assert_eq!(gw.risk().throttle_usage(7, T0), [6, 1, 0]);
    // Replayed, the gateway's cancels are not counted either.
    let r = replay(&out.journal);
    assert_eq!(r.risk().throttle_usage(7, T0)[1], 0);
}

#[test]
fn malformed_frames_are_bounded_and_cut_the_engine_off() {
    let (mut gw, _v, mut out) =
        active_with("max_malformed_frames = 3", "max_orders_per_interval = 100");
    out.clear();
    // 16 KiB of garbage costs the journal its first 64 bytes.
    let mut big = vec![0xAAu8; 16 << 10];
    big[0] = msg_type::NEW_ORDER;
    gw.on_engine_message(1, &big, T0, &mut out);
    assert!(
        out.journal.len() < 100,
        "{} journal bytes",
        out.journal.len()
    );
    assert!(out.kick.is_empty());
    gw.on_engine_message(1, &[1, 2, 3], T0, &mut out);
    gw.on_engine_message(1, &[], T0, &mut out);
    assert_eq!(out.kick, [1]);
    assert_eq!(gw.counters().malformed_engine, 3);
    assert_eq!(gw.counters().malformed_disconnects, 1);
    assert_eq!(gw.malformed_since_logon(1), 3);
    assert_eq!(reject_reasons(&out), [RejectReason::Malformed; 3]);
    // Cut off: nothing more is taken, journaled or answered, valid or not.
    let (records, responses) = (out.journal_records, out.engine.len());
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    for _ in 0..1000 {
        gw.on_engine_message(1, &big, T0, &mut out);
    }
    assert_eq!(
        (out.journal_records, out.engine.len()),
        (records, responses)
    );
    assert_eq!(gw.counters().frames_after_cutoff, 1001);
    assert_eq!(gw.counters().malformed_disconnects, 1);
    assert!(gw.order(1, 1).is_none());
    // The journal rebuilds the same count and the same responses.
    let risk = toml::from_str::<RiskConfig>(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        max_malformed_frames = 3
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 100000
        max_open_orders = 100
        max_orders_per_interval = 100
        collar_bps = 500
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#,
    )
    .unwrap();
    let r = replay_like(&risk, &out.journal);
    assert_eq!(r.malformed_since_logon(1), 3);
    assert_eq!(r.last_response_seq(1), gw.last_response_seq(1));
    assert_eq!(
        bytes(r.responses_after(1, 0).unwrap()),
        bytes(gw.responses_after(1, 0).unwrap())
    );
    // The service disconnects it; once it logs on again it is taken again.
    gw.on_engine_disconnect(1, T0, &mut out);
    assert_eq!(replay_like(&risk, &out.journal).malformed_since_logon(1), 0);
    gw.on_engine_logon(1, &mut out);
    out.clear();
    gw.on_engine_message(1, new_order(1, 10, 100).as_bytes(), T0, &mut out);
    assert!(gw.order(1, 1).is_some());
    assert_eq!(gw.malformed_since_logon(1), 0);
}

#[test]
fn response_history_comes_from_the_config() {
    let (mut gw, _v, mut out) =
        active_with("response_history = 2", "max_orders_per_interval = 100");
    for _ in 0..5 {
        gw.on_engine_message(1, &[], T0, &mut out);
    }
    assert_eq!(gw.responses_after(1, 3).unwrap().count(), 2);
    assert_eq!(
        gw.responses_after(1, 2).err(),
        Some(LogonStatus::ReplayUnavailable)
    );
}

/// Firm-wide limits reject with their own reasons, and survive a restart.
#[test]
fn firm_limits_reject_and_rebuild_from_the_journal() {
    let firm = "max_identical_orders = 0\n[firm]\nmax_open_orders = 2\nmax_gross_notional = 25000";
    let (mut gw, _v, mut out) = active_with(firm, "max_orders_per_interval = 100");
    out.clear();
    gw.on_engine_message(1, new_order(1, 100, 100).as_bytes(), T0, &mut out);
    gw.on_engine_message(1, new_order(2, 100, 101).as_bytes(), T0, &mut out);
    // 20_100 open, 25_000 allowed: 5_000 more is too much.
    gw.on_engine_message(1, new_order(3, 50, 100).as_bytes(), T0, &mut out);
    // Small enough, but the firm has its 2 open orders.
    gw.on_engine_message(1, new_order(4, 1, 100).as_bytes(), T0, &mut out);
    assert_eq!(
        reject_reasons(&out),
        [
            RejectReason::FirmGrossNotional,
            RejectReason::FirmMaxOpenOrders
        ]
    );
    assert_eq!(gw.risk().firm_exposure(), (2, 20_100, 0));
    let risk = toml::from_str::<RiskConfig>(&format!(
        r#"
        reference_max_age_ms = 5000
        throttle_interval_ms = 1000
        {firm}
        [[accounts]]
        id = 7
        max_order_qty = 1000
        max_order_notional = 1000000
        credit_limit = 10000000
        max_position = 100000
        max_open_orders = 100
        max_orders_per_interval = 100
        collar_bps = 500
        [[engines]]
        id = 1
        accounts = [7]
        token = "e1"
        "#
    ))
    .unwrap();
    let r = replay_like(&risk, &out.journal);
    assert_eq!(r.risk().firm_exposure(), (2, 20_100, 0));
}

/// A frame of another FIX version from the venue: Logout ("Incorrect BeginString"),
/// journaled like any frame sent, then the link is closed; not counted as garbled.
#[test]
fn a_wrong_begin_string_from_the_venue_logs_out_and_disconnects() {
    let (mut gw, mut v, mut out) = active();
    out.clear();
    let mut f = v.frame(b"0", &[]);
    f[7] = b'2'; // 8=FIX.4.2
    let trailer = f.len() - 7;
    let sum = f[..trailer].iter().map(|&b| u32::from(b)).sum::<u32>() % 256;
    f[trailer + 3..trailer + 6].copy_from_slice(format!("{sum:03}").as_bytes());
    gw.on_fix_bytes(&f, T0, &mut out);
    let logout = last_fix(&out);
    let m = Message::parse(&logout).unwrap();
    assert_eq!(m.msg_type(), b"5");
    assert_eq!(m.get(tag::TEXT), Some(&b"Incorrect BeginString"[..]));
    assert!(out.disconnect, "the link is closed after the Logout");
    assert_eq!(out.journal_records, 1, "the Logout is journaled");
    assert_eq!(gw.session().counters().garbled, 0);
    assert_eq!(gw.session().state(), SessionState::Disconnected);
}
