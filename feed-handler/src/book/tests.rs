//! A hand-worked day: every step's expected depth and BBO worked out on paper first.

use super::*;
use crate::itch::*;
use zerocopy::byteorder::big_endian as be;
use zerocopy::IntoBytes;

const L: u16 = 1;

fn hdr(t: u8) -> Header {
    Header::new(t, L, 0, 1000)
}
fn add(r: u64, side: u8, shares: u32, price: u32) -> Vec<u8> {
    AddOrder {
        header: hdr(b'A'),
        order_reference_number: be::U64::new(r),
        buy_sell_indicator: side,
        shares: be::U32::new(shares),
        stock: Stock::new("AAPL"),
        price: Price4::new(price),
    }
    .as_bytes()
    .to_vec()
}
fn exec(r: u64, shares: u32, m: u64) -> Vec<u8> {
    OrderExecuted {
        header: hdr(b'E'),
        order_reference_number: be::U64::new(r),
        executed_shares: be::U32::new(shares),
        match_number: be::U64::new(m),
    }
    .as_bytes()
    .to_vec()
}
fn exec_px(r: u64, shares: u32, m: u64, price: u32) -> Vec<u8> {
    OrderExecutedWithPrice {
        header: hdr(b'C'),
        order_reference_number: be::U64::new(r),
        executed_shares: be::U32::new(shares),
        match_number: be::U64::new(m),
        printable: b'Y',
        execution_price: Price4::new(price),
    }
    .as_bytes()
    .to_vec()
}
fn cancel(r: u64, shares: u32) -> Vec<u8> {
    OrderCancel {
        header: hdr(b'X'),
        order_reference_number: be::U64::new(r),
        cancelled_shares: be::U32::new(shares),
    }
    .as_bytes()
    .to_vec()
}
fn delete(r: u64) -> Vec<u8> {
    OrderDelete {
        header: hdr(b'D'),
        order_reference_number: be::U64::new(r),
    }
    .as_bytes()
    .to_vec()
}
fn replace(old: u64, new: u64, shares: u32, price: u32) -> Vec<u8> {
    OrderReplace {
        header: hdr(b'U'),
        original_order_reference_number: be::U64::new(old),
        new_order_reference_number: be::U64::new(new),
        shares: be::U32::new(shares),
        price: Price4::new(price),
    }
    .as_bytes()
    .to_vec()
}
fn directory() -> Vec<u8> {
    StockDirectory {
        header: hdr(b'R'),
        stock: Stock::new("AAPL"),
        market_category: b'Q',
        financial_status_indicator: b'N',
        round_lot_size: be::U32::new(100),
        round_lots_only: b'N',
        issue_classification: b'C',
        issue_sub_type: *b"  ",
        authenticity: b'P',
        short_sale_threshold_indicator: b'N',
        ipo_flag: b'N',
        luld_reference_price_tier: b'1',
        etp_flag: b'N',
        etp_leverage_factor: be::U32::new(0),
        inverse_indicator: b'N',
    }
    .as_bytes()
    .to_vec()
}

fn lv(price: u32, shares: u64, orders: u32) -> Level {
    Level {
        price,
        shares,
        orders,
    }
}

struct Recorder {
    events: Vec<Event>,
}
impl EventSink for Recorder {
    fn on_event(&mut self, e: &Event) {
        self.events.push(*e);
    }
}

fn depth(b: &Book, side: Side) -> Vec<Level> {
    b.symbol(L).expect("symbol").depth(side).copied().collect()
}

#[test]
fn hand_worked_sequence() {
    let mut book = Book::new();
    let mut rec = Recorder { events: Vec::new() };
    let mut apply = |book: &mut Book, bytes: Vec<u8>| {
        let m = decode_exact(&bytes).expect("valid");
        book.apply(&m, &mut rec);
    };
    apply(&mut book, directory());
    apply(&mut book, add(1, b'B', 100, 100_000)); // bid 10.0000 x100
    apply(&mut book, add(2, b'B', 200, 100_100)); // bid 10.0100 x200
    apply(&mut book, add(3, b'S', 300, 100_300)); // ask 10.0300 x300
    apply(&mut book, add(4, b'S', 50, 100_300)); // ask 10.0300 x350 (2)
    apply(&mut book, add(5, b'B', 100, 100_000)); // bid 10.0000 x200 (2)
    assert_eq!(
        depth(&book, Side::Bid),
        [lv(100_100, 200, 1), lv(100_000, 200, 2)]
    );
    assert_eq!(depth(&book, Side::Ask), [lv(100_300, 350, 2)]);

    apply(&mut book, exec(2, 50, 1)); // 10.0100 x150
    apply(&mut book, exec_px(3, 100, 2, 100_250)); // 10.0300 x250, printed at 10.0250
    apply(&mut book, cancel(1, 30)); // 10.0000 x170 (2)
    assert_eq!(
        depth(&book, Side::Bid),
        [lv(100_100, 150, 1), lv(100_000, 170, 2)]
    );
    assert_eq!(depth(&book, Side::Ask), [lv(100_300, 250, 2)]);

    apply(&mut book, replace(4, 6, 80, 100_200)); // #4 (50 @ 10.03) -> #6 80 @ 10.02
    assert_eq!(
        depth(&book, Side::Ask),
        [lv(100_200, 80, 1), lv(100_300, 200, 1)]
    );
    apply(&mut book, delete(2));
    apply(&mut book, exec(6, 80, 3)); // fills #6: the 10.02 level goes
    apply(&mut book, exec(99, 1, 4)); // unknown order: counted

    assert_eq!(depth(&book, Side::Bid), [lv(100_000, 170, 2)]);
    assert_eq!(depth(&book, Side::Ask), [lv(100_300, 200, 1)]);
    assert_eq!(
        book.symbol(L).expect("symbol").bbo(),
        (Some(lv(100_000, 170, 2)), Some(lv(100_300, 200, 1)))
    );
    assert_eq!(book.order_count(), 3);
    assert_eq!(book.symbol_by_name("AAPL").map(|(l, _)| l), Some(L));
    assert_eq!(book.counters().unknown_orders, 1);
    assert_eq!(book.counters().overfills, 0);

    let bbos: Vec<_> = rec
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Bbo { bid, ask, .. } => Some((
                bid.map(|l| (l.price, l.shares)),
                ask.map(|l| (l.price, l.shares)),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(
        bbos,
        [
            (Some((100_000, 100)), None),
            (Some((100_100, 200)), None),
            (Some((100_100, 200)), Some((100_300, 300))),
            (Some((100_100, 200)), Some((100_300, 350))),
            (Some((100_100, 150)), Some((100_300, 350))),
            (Some((100_100, 150)), Some((100_300, 250))),
            (Some((100_100, 150)), Some((100_200, 80))),
            (Some((100_000, 170)), Some((100_200, 80))),
            (Some((100_000, 170)), Some((100_300, 200))),
        ]
    );
    let trades: Vec<_> = rec
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Trade {
                price,
                shares,
                match_number,
                side,
                ..
            } => Some((*price, *shares, *match_number, *side)),
            _ => None,
        })
        .collect();
    assert_eq!(
        trades,
        [
            (100_100, 50, 1, Some(Side::Bid)),
            (100_250, 100, 2, Some(Side::Ask)),
            (100_200, 80, 3, Some(Side::Ask))
        ]
    );
    // The replace produced a level removal at 10.03 (-50) and an addition at 10.02.
    assert!(rec.events.contains(&Event::Level {
        locate: L,
        stock: Stock::new("AAPL"),
        timestamp: 1000,
        side: Side::Ask,
        level: lv(100_200, 0, 0),
    }));

    // Snapshot: restore gives an equal book, and the same bytes again.
    let snap = book.snapshot();
    let restored = Book::restore(&snap).expect("restores");
    assert_eq!(restored, book);
    assert_eq!(restored.snapshot(), snap);
    assert_eq!(depth(&restored, Side::Bid), [lv(100_000, 170, 2)]);
}

#[test]
fn overfill_and_halt() {
    let mut book = Book::new();
    let mut events = Vec::new();
    let mut sink = |e: &Event| events.push(*e);
    let a = add(1, b'S', 10, 5000);
    book.apply(&decode_exact(&a).expect("valid"), &mut sink);
    let e = exec(1, 15, 1);
    book.apply(&decode_exact(&e).expect("valid"), &mut sink);
    assert_eq!(book.counters().overfills, 1);
    assert_eq!(book.order_count(), 0);
    let h = StockTradingAction {
        header: hdr(b'H'),
        stock: Stock::new("AAPL"),
        trading_state: b'H',
        reserved: b' ',
        reason: *b"T1  ",
    };
    book.apply(&Message::StockTradingAction(&h), &mut sink);
    assert_eq!(book.symbol(L).expect("symbol").trading_state, b'H');
    assert!(matches!(
        events.last(),
        Some(Event::TradingStatus { state: b'H', .. })
    ));
    assert!(matches!(
        events.iter().find(|e| matches!(e, Event::Trade { .. })),
        Some(Event::Trade { shares: 10, .. })
    ));
}

#[test]
fn bad_snapshots_are_errors() {
    let mut book = Book::new();
    let a = add(7, b'B', 10, 5000);
    book.apply(&decode_exact(&a).expect("valid"), &mut |_: &Event| {});
    let snap = book.snapshot();
    for n in 0..snap.len() {
        assert!(Book::restore(&snap[..n]).is_err(), "truncated at {n}");
    }
    let mut bad = snap.clone();
    bad[0] = b'X';
    assert_eq!(Book::restore(&bad), Err(SnapshotError::BadMagic));
    let mut bad = snap.clone();
    let side_at = snap.len() - 20 + 10;
    bad[side_at] = b'Z';
    assert_eq!(Book::restore(&bad), Err(SnapshotError::Inconsistent));
    let mut longer = snap;
    longer.push(0);
    assert_eq!(Book::restore(&longer), Err(SnapshotError::Inconsistent));
}

#[test]
fn operational_halt_overrides_state_until_resumed() {
    let mut book = Book::new();
    let mut events: Vec<Event> = Vec::new();
    fn apply(book: &mut Book, m: &Message<'_>, events: &mut Vec<Event>) {
        book.apply(m, &mut |e: &Event| events.push(*e));
    }
    let action = |state: u8| StockTradingAction {
        header: hdr(b'H'),
        stock: Stock::new("AAPL"),
        trading_state: state,
        reserved: b' ',
        reason: *b"    ",
    };
    let op = |market: u8, action: u8| OperationalHalt {
        header: hdr(b'h'),
        stock: Stock::new("AAPL"),
        market_code: market,
        operational_halt_action: action,
    };
    let status = |e: Option<&Event>| match e {
        Some(Event::TradingStatus { state, .. }) => Some(*state),
        _ => None,
    };
    apply(
        &mut book,
        &Message::StockTradingAction(&action(b'T')),
        &mut events,
    );
    assert_eq!(status(events.last()), Some(b'T'));

    // Another market's halt changes nothing here.
    apply(
        &mut book,
        &Message::OperationalHalt(&op(b'B', b'H')),
        &mut events,
    );
    assert_eq!(events.len(), 1);
    assert_eq!(book.counters().other_market_halts, 1);

    apply(
        &mut book,
        &Message::OperationalHalt(&op(b'Q', b'H')),
        &mut events,
    );
    assert_eq!(status(events.last()), Some(b'H'));
    let sym = book.symbol(L).expect("symbol");
    assert!(sym.operational_halt);
    assert_eq!((sym.state(), sym.trading_state), (b'H', b'T'));

    // A trading action during the halt still reads halted; the snapshot keeps the halt.
    apply(
        &mut book,
        &Message::StockTradingAction(&action(b'Q')),
        &mut events,
    );
    assert_eq!(status(events.last()), Some(b'H'));
    let restored = Book::restore(&book.snapshot()).expect("restores");
    assert_eq!(restored, book);
    assert_eq!(restored.symbol(L).expect("symbol").state(), b'H');

    // An unknown action is counted and ignored; the resume shows the last action's state.
    let n = events.len();
    apply(
        &mut book,
        &Message::OperationalHalt(&op(b'Q', b'?')),
        &mut events,
    );
    assert_eq!((events.len(), book.counters().bad_halt_actions), (n, 1));
    apply(
        &mut book,
        &Message::OperationalHalt(&op(b'Q', b'T')),
        &mut events,
    );
    assert_eq!(status(events.last()), Some(b'Q'));
    assert!(!book.symbol(L).expect("symbol").operational_halt);
}

/// `find` gallops from the best end; it answers as a plain binary search does, on both
/// sides, for every price in and around the levels, at every size.
#[test]
fn galloping_find_agrees_with_binary_search() {
    for side in [Side::Bid, Side::Ask] {
        for n in 0..40u32 {
            let mut levels = Levels::default();
            for k in 0..n {
                levels.add(side, 100 + 3 * k, 1);
            }
            for price in 90..(110 + 3 * n) {
                let k = Levels::key(side, price);
                let plain = levels
                    .levels
                    .binary_search_by_key(&k, |l| Levels::key(side, l.price));
                assert_eq!(
                    levels.find(side, price),
                    plain,
                    "{side:?} n {n} price {price}"
                );
            }
        }
    }
}
