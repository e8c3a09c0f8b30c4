//! A request answered "not taken" (`JournalUnavailable`) and sent again after later
//! requests were taken is taken then, not answered as a re-send of one taken before; also
//! after the gateway rebuilt its state from the journal. No venue needed: with the venue
//! session down every new order is taken and rejected `SessionDown` (a numbered answer).

mod common;

use common::*;
use order_gateway::driver::FixDriver;
use order_gateway::journal::FsyncPolicy;
use order_gateway::proto::{RejectReason, Response};
use order_gateway::unix_nanos;
use zerocopy::IntoBytes;

fn open(journal: &std::path::Path) -> FixDriver {
    let mut d = FixDriver::open_with(
        &format!("127.0.0.1:{}", free_port()),
        session_config(),
        &risk_config(),
        journal,
        FsyncPolicy::Never,
    )
    .unwrap();
    d.with_gateway(|gw, _| {
        for s in symbols() {
            gw.on_reference_price(s, 100 * order_gateway::proto::PRICE_SCALE, unix_nanos());
        }
    })
    .unwrap();
    d
}

/// Sends `bytes` and returns the one response.
fn send(d: &mut FixDriver, bytes: &[u8]) -> Response {
    d.engine_message(ENGINE, bytes).unwrap();
    let mut rs = d.take_engine_responses();
    assert_eq!(rs.len(), 1, "{rs:?}");
    rs.pop().unwrap().1
}

fn taken(r: &Response, id: u64) {
    match r {
        Response::Reject(x) => {
            assert_eq!(x.cl_ord_id.get(), id);
            assert_eq!(x.reason(), RejectReason::SessionDown);
            assert_ne!(
                x.header.seq.get(),
                0,
                "a taken request's answer is numbered"
            );
        }
        other => panic!("request {id} not taken: {other:?}"),
    }
}

fn resend_answer(r: &Response, id: u64) {
    assert!(
        matches!(r, Response::Status(_)) && r.cl_ord_id() == id,
        "request {id} was taken twice: {r:?}"
    );
}

#[test]
fn a_not_taken_request_sent_after_later_ones_is_taken_once() {
    let journal = scratch("request-holes").join("gw.journal");
    let mut e = Engine::new(1);
    let [aapl, ..] = symbols();
    let px = 100 * order_gateway::proto::PRICE_SCALE;
    let mut orders = Vec::new();
    for _ in 0..5 {
        let (id, m) = e
            .client
            .new_order(ACCOUNT, aapl, order_gateway::proto::Side::Buy, 10, px);
        orders.push((id, m));
    }
    let mut d = open(&journal);
    // 2 and 3 were not taken (disk full); 4 goes through first.
    taken(&send(&mut d, orders[0].1.as_bytes()), orders[0].0);
    taken(&send(&mut d, orders[3].1.as_bytes()), orders[3].0);
    // Sent again late: taken now, and only once.
    taken(&send(&mut d, orders[1].1.as_bytes()), orders[1].0);
    resend_answer(&send(&mut d, orders[1].1.as_bytes()), orders[1].0);
    resend_answer(&send(&mut d, orders[0].1.as_bytes()), orders[0].0);
    // The holes are rebuilt from the journal.
    drop(d);
    let mut d = open(&journal);
    taken(&send(&mut d, orders[2].1.as_bytes()), orders[2].0);
    for &i in &[0, 1, 2, 3] {
        resend_answer(&send(&mut d, orders[i].1.as_bytes()), orders[i].0);
    }
    taken(&send(&mut d, orders[4].1.as_bytes()), orders[4].0);
    assert_eq!(d.gateway().last_request_seq(ENGINE), 5);
}
