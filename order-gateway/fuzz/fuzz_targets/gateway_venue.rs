//! The whole gateway on arbitrary venue bytes: a logged-on gateway with live orders in every
//! state (pending new, open, partly filled, a replace and a cancel pending), then the input
//! as venue bytes in chunks, with timers, reconnects and a few engine requests in between.
//! After every call: no panic, and the invariants of `order_gateway_fuzz::Harness::step`
//! (open-order count, risk reservations, numbered responses, counters that only grow).
//!
//! Input: bytes go to a pending chunk; `0xFE c` is a command, `c & 7` says which and
//! `a = c >> 3` is its argument:
//! 0 the chunk as it is; 1 the chunk framed (BodyLength and CheckSum made right);
//! 2 the chunk as the body of the next in-sequence message (`35=X\x01` then fields: CompIDs,
//! MsgSeqNum and SendingTime are inserted); 1 and 2 are fed in two calls split at `8a`;
//! 3 timers `2a` seconds later; 4 a literal 0xFE; 5 reconnect (a odd: the venue logs on,
//! a & 2 with ResetSeqNumFlag); 6 we log out; 7 an engine request (`a & 3`: new order,
//! cancel, replace, engine disconnect).
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_gateway::proto::PRICE_SCALE;
use order_gateway_fuzz::{
    cancel, exec_report, new_order, numbered, replace, symbols, venue_frame, Harness, SEC,
};

/// Gateway ids of the orders `setup` leaves: 1 open, 2 open and partly filled, 3 and 4
/// open, 5 pending new; request 6 replaces order 1 and request 7 cancels order 4, both
/// unanswered.
fn setup() -> Harness {
    let mut h = Harness::new();
    h.logon();
    let [aapl, msft, ..] = symbols();
    let px = |whole: i64| whole * PRICE_SCALE;
    h.engine(1, &numbered(new_order(1, 7, aapl, false, 100, px(100)), 1));
    h.engine(1, &numbered(new_order(2, 7, aapl, true, 200, px(101)), 2));
    h.engine(2, &numbered(new_order(1, 8, msft, false, 50, px(99)), 1));
    h.engine(2, &numbered(new_order(2, 7, msft, true, 300, px(100)), 2));
    h.engine(2, &numbered(new_order(3, 8, aapl, false, 10, px(100)), 3));
    assert_eq!(h.gw.open_order_count(), 5);
    for id in 1..=4 {
        let seq = h.gw.session().next_in();
        h.venue(&exec_report(seq, h.now, id, id, b'0', 0, 0, 0, 100, None));
    }
    let seq = h.gw.session().next_in();
    h.venue(&exec_report(
        seq,
        h.now,
        2,
        10,
        b'F',
        100,
        px(101),
        100,
        100,
        None,
    ));
    h.engine(1, &numbered(replace(1, 150, px(100) + 5000), 3));
    h.engine(2, &numbered(cancel(2), 4));
    assert_eq!(h.gw.order(1, 1).map(|o| o.venue_cl_ord_id), Some(1));
    h
}

fn feed_split(h: &mut Harness, frame: &[u8], at: usize) {
    let (a, b) = frame.split_at(at.min(frame.len()));
    h.venue(a);
    h.venue(b);
}

fuzz_target!(|data: &[u8]| {
    let mut h = setup();
    let mut chunk = Vec::new();
    let mut next_cl = 100;
    let mut request_seq = 10;
    let mut bytes = data.iter().copied();
    while let Some(b) = bytes.next() {
        if b != 0xFE {
            chunk.push(b);
            continue;
        }
        let c = bytes.next().unwrap_or(0);
        let a = c >> 3;
        match c & 7 {
            0 => h.venue(&chunk),
            1 => feed_split(
                &mut h,
                &order_gateway_fuzz::frame_body(&chunk),
                8 * usize::from(a),
            ),
            2 => {
                let f = order_gateway_fuzz::frame_in_sequence(&h.gw, &chunk, h.now);
                feed_split(&mut h, &f, 8 * usize::from(a));
            }
            3 => h.timer(2 * u64::from(a) * SEC),
            4 => {
                chunk.push(0xFE);
                continue;
            }
            5 => {
                h.reconnect();
                if a & 1 == 1 {
                    let fields: &[u8] = if a & 2 == 2 {
                        b"98=0\x01108=30\x01141=Y\x01"
                    } else {
                        b"98=0\x01108=30\x01"
                    };
                    let seq = if a & 2 == 2 {
                        1
                    } else {
                        h.gw.session().next_in()
                    };
                    h.venue(&venue_frame(b"A", seq, h.now, fields));
                }
            }
            6 => {
                h.gw.logout(h.now, &mut h.out);
                h.step();
            }
            _ => {
                request_seq += 1;
                let aapl = symbols()[0];
                let cl = u64::from(a >> 2);
                let frame = match a & 3 {
                    0 => {
                        next_cl += 1;
                        let qty = 10 * u32::from(a);
                        new_order(next_cl, 7, aapl, a & 4 == 4, qty, 100 * PRICE_SCALE)
                    }
                    1 => cancel(cl),
                    2 => replace(cl, 20 * u32::from(a), 99 * PRICE_SCALE),
                    _ => {
                        h.gw.on_engine_disconnect(1 + u32::from(a & 4) / 4, h.now, &mut h.out);
                        h.step();
                        chunk.clear();
                        continue;
                    }
                };
                h.engine(1, &numbered(frame, request_seq));
            }
        }
        chunk.clear();
    }
    if !chunk.is_empty() {
        h.venue(&chunk);
    }
});
