//! `book` and `bbo` against a generated day (checked by recomputing from the book after each
//! message) and against a hand-built sequence whose rows are written out below.

use super::*;
use crate::binaryfile::{push_record, Reader};
use crate::generate::{generate_binaryfile, GenConfig};
use crate::itch::*;
use std::collections::HashMap;
use zerocopy::byteorder::big_endian as be;
use zerocopy::IntoBytes;

fn day() -> Vec<u8> {
    generate_binaryfile(&GenConfig {
        seed: 19,
        messages: 20_000,
        symbols: 6,
    })
    .0
}

fn bbo_csv(data: &[u8]) -> (String, BboTotals) {
    let mut out = Vec::new();
    let totals = write_bbo(data, None, &mut out, |_| {}).unwrap();
    (String::from_utf8(out).unwrap(), totals)
}

/// Price(4) formatted here rather than with the module's helper.
fn px(raw: u32) -> String {
    format!("{}.{:04}", raw / 10_000, raw % 10_000)
}

#[test]
fn bbo_rows_match_the_top_of_book_after_each_message() {
    let data = day();
    let (csv, totals) = bbo_csv(&data);

    // Independent: apply each message, then compare every symbol's top of book with what it
    // was before; each difference is one row.
    let mut book = Book::new();
    let mut last: HashMap<u16, (Option<Level>, Option<Level>)> = HashMap::new();
    let mut expected = vec![BBO_HEADER.to_owned()];
    let mut messages = 0;
    for m in Reader::new(&data).unwrap() {
        let m = m.unwrap();
        messages += 1;
        book.apply(&m, &mut |_: &Event| {});
        for (locate, b) in book.symbols() {
            let now = b.bbo();
            let before = last.insert(locate, now).unwrap_or((None, None));
            if now != before {
                let side = |l: Option<Level>| match l {
                    Some(l) => format!("{},{},{}", px(l.price), l.shares, l.orders),
                    None => ",,".to_owned(),
                };
                expected.push(format!(
                    "{locate},{},{},{},{}",
                    b.stock.as_str().unwrap(),
                    m.header().timestamp.nanos(),
                    side(now.0),
                    side(now.1)
                ));
            }
        }
    }
    let got: Vec<&str> = csv.lines().collect();
    assert!(expected.len() > 1000, "too few changes: {}", expected.len());
    assert_eq!(totals.messages, messages);
    assert_eq!(totals.rows as usize, expected.len() - 1);
    for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "row {i}");
    }
    assert_eq!(got.len(), expected.len());
    // Both kinds of row occur: one-sided books early, two-sided later.
    assert!(got.iter().any(|r| r.ends_with(",,,")));
    assert!(got.iter().skip(1).any(|r| !r.contains(",,")));
}

fn hdr(t: u8, locate: u16, ts: u64) -> Header {
    Header::new(t, locate, 0, ts)
}
fn directory(locate: u16, name: &str) -> Vec<u8> {
    StockDirectory {
        header: hdr(b'R', locate, 1),
        stock: Stock::new(name),
        market_category: b'Q',
        financial_status_indicator: b'N',
        round_lot_size: be::U32::new(100),
        round_lots_only: b'N',
        issue_classification: b'C',
        issue_sub_type: *b"Z ",
        authenticity: b'P',
        short_sale_threshold_indicator: b'N',
        ipo_flag: b' ',
        luld_reference_price_tier: b'1',
        etp_flag: b'N',
        etp_leverage_factor: be::U32::new(0),
        inverse_indicator: b'N',
    }
    .as_bytes()
    .to_vec()
}
fn add(locate: u16, ts: u64, r: u64, side: u8, shares: u32, price: u32) -> Vec<u8> {
    AddOrder {
        header: hdr(b'A', locate, ts),
        order_reference_number: be::U64::new(r),
        buy_sell_indicator: side,
        shares: be::U32::new(shares),
        stock: Stock::new(if locate == 1 { "AAPL" } else { "MSFT" }),
        price: Price4::new(price),
    }
    .as_bytes()
    .to_vec()
}
fn exec(ts: u64, r: u64, shares: u32) -> Vec<u8> {
    OrderExecuted {
        header: hdr(b'E', 1, ts),
        order_reference_number: be::U64::new(r),
        executed_shares: be::U32::new(shares),
        match_number: be::U64::new(ts),
    }
    .as_bytes()
    .to_vec()
}
fn cancel(ts: u64, r: u64, shares: u32) -> Vec<u8> {
    OrderCancel {
        header: hdr(b'X', 1, ts),
        order_reference_number: be::U64::new(r),
        cancelled_shares: be::U32::new(shares),
    }
    .as_bytes()
    .to_vec()
}
fn delete(ts: u64, r: u64) -> Vec<u8> {
    OrderDelete {
        header: hdr(b'D', 1, ts),
        order_reference_number: be::U64::new(r),
    }
    .as_bytes()
    .to_vec()
}
fn replace(ts: u64, old: u64, new: u64, shares: u32, price: u32) -> Vec<u8> {
    OrderReplace {
        header: hdr(b'U', 1, ts),
        original_order_reference_number: be::U64::new(old),
        new_order_reference_number: be::U64::new(new),
        shares: be::U32::new(shares),
        price: Price4::new(price),
    }
    .as_bytes()
    .to_vec()
}

/// AAPL (locate 1) and MSFT (locate 2); each step's effect on the top of book in a comment.
fn hand_built() -> Vec<u8> {
    let (b, s) = (b'B', b'S');
    let messages = [
        directory(1, "AAPL"),
        directory(2, "MSFT"),
        add(1, 1000, 1, b, 100, 1_000_000),  // bid 100.0000 100x1
        add(1, 2000, 2, s, 200, 1_010_000),  // ask 101.0000 200x1
        add(1, 3000, 3, b, 50, 990_000),     // below the best bid: no row
        add(1, 4000, 4, b, 30, 1_000_000),   // bid 130x2
        exec(5000, 1, 40),                   // bid 90x2
        cancel(6000, 2, 50),                 // ask 150x1
        delete(7000, 4),                     // bid 60x1
        replace(8000, 2, 5, 100, 1_005_000), // ask moves to 100.5000 100x1
        replace(8500, 5, 6, 100, 1_005_000), // same size, same price: no row
        cancel(8700, 3, 10),                 // deeper bid level only: no row
        delete(9000, 1),                     // bid falls back to 99.0000 40x1
        delete(10000, 3),                    // no bids left
        cancel(11000, 77, 5),                // unknown order: no row
        add(2, 12000, 10, s, 10, 500_000),   // MSFT ask 50.0000 10x1
        exec(13000, 6, 100),                 // AAPL ask gone: both sides empty
    ];
    let mut file = Vec::new();
    for m in &messages {
        push_record(&mut file, m);
    }
    file
}

#[test]
fn bbo_of_a_hand_built_sequence() {
    let (csv, totals) = bbo_csv(&hand_built());
    let expected = "\
locate,symbol,timestamp,bid_price,bid_size,bid_orders,ask_price,ask_size,ask_orders
1,AAPL,1000,100.0000,100,1,,,
1,AAPL,2000,100.0000,100,1,101.0000,200,1
1,AAPL,4000,100.0000,130,2,101.0000,200,1
1,AAPL,5000,100.0000,90,2,101.0000,200,1
1,AAPL,6000,100.0000,90,2,101.0000,150,1
1,AAPL,7000,100.0000,60,1,101.0000,150,1
1,AAPL,8000,100.0000,60,1,100.5000,100,1
1,AAPL,9000,99.0000,40,1,100.5000,100,1
1,AAPL,10000,,,,100.5000,100,1
2,MSFT,12000,,,,50.0000,10,1
1,AAPL,13000,,,,,,
";
    assert_eq!(csv, expected);
    assert_eq!(totals.messages, 17);
    assert_eq!(totals.rows, 11);
}

fn book_text(book: &Book, symbols: Symbols<'_>, depth: usize) -> String {
    let mut out = Vec::new();
    write_book(&mut out, book, symbols, depth).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn book_of_a_hand_built_sequence_at_a_time() {
    let data = hand_built();
    let at = book_at(&data[..], Some(4000)).unwrap();
    assert_eq!(at.applied, 6);
    assert_eq!(at.last_timestamp, Some(4000));
    let expected = "\
AAPL (locate 1): 2 bid levels, 1 ask level
   bid size  orders        price |        price  ask size  orders
        130       2     100.0000 |     101.0000       200       1
         50       1      99.0000 |
";
    assert_eq!(book_text(&at.book, Symbols::NonEmpty, 10), expected);
    assert_eq!(
        book_text(&at.book, Symbols::Named("AAPL"), 1),
        "\
AAPL (locate 1): 2 bid levels, 1 ask level
   bid size  orders        price |        price  ask size  orders
        130       2     100.0000 |     101.0000       200       1
  (1 of 2 bid and 1 ask levels shown)
"
    );
    assert_eq!(
        book_text(&at.book, Symbols::Named("MSFT"), 10),
        "MSFT (locate 2): 0 bid levels, 0 ask levels\n  (empty)\n"
    );
    assert!(check_symbol(&at.book, "AAPL", Some(4000)).is_ok());
    let err = check_symbol(&at.book, "IBM", Some(4000)).unwrap_err();
    assert!(err.to_string().contains("\"IBM\""), "{err}");
    assert!(err.to_string().contains("00:00:00.000004000"), "{err}");
}

#[test]
fn book_at_a_time_is_the_book_after_exactly_the_messages_up_to_it() {
    let data = day();
    let messages: Vec<Message<'_>> = Reader::new(&data).unwrap().map(Result::unwrap).collect();
    let ts = |i: usize| messages[i].header().timestamp.nanos();
    assert!((1..messages.len()).all(|i| ts(i - 1) <= ts(i)));
    let mid = messages.len() / 2;
    let at = ts(mid);
    // Everything at that very nanosecond is included, nothing after it.
    let k = messages
        .iter()
        .take_while(|m| m.header().timestamp.nanos() <= at)
        .count();
    assert!(k > mid && k < messages.len());
    let mut expected = Book::new();
    for m in &messages[..k] {
        expected.apply(m, &mut |_: &Event| {});
    }

    let got = book_at(&data[..], Some(at)).unwrap();
    assert_eq!(got.applied as usize, k);
    assert_eq!(got.last_timestamp, Some(at));
    assert!(got.book == expected);
    assert_eq!(
        book_text(&got.book, Symbols::NonEmpty, 1000),
        book_text(&expected, Symbols::NonEmpty, 1000)
    );

    // One nanosecond earlier leaves out the messages at `at`; the end of the file is another book.
    let before = book_at(&data[..], Some(at - 1)).unwrap();
    let first_at = messages
        .iter()
        .position(|m| m.header().timestamp.nanos() == at)
        .unwrap();
    assert_eq!(before.applied as usize, first_at);
    let end = book_at(&data[..], None).unwrap();
    assert_eq!(end.applied as usize, messages.len());
    assert!(end.book != got.book);
}

#[test]
fn time_of_day_syntax() {
    let ns = |h: u64, m: u64, s: u64, n: u64| ((h * 60 + m) * 60 + s) * 1_000_000_000 + n;
    assert_eq!(parse_time_of_day("09:30:00.000000001"), Ok(ns(9, 30, 0, 1)));
    assert_eq!(parse_time_of_day("09:30:00"), Ok(ns(9, 30, 0, 0)));
    assert_eq!(
        parse_time_of_day("14:05:59.5"),
        Ok(ns(14, 5, 59, 500_000_000))
    );
    assert_eq!(
        parse_time_of_day("23:59:59.999999999"),
        Ok(ns(23, 59, 59, 999_999_999))
    );
    for bad in [
        "",
        "9:30:00",
        "09:30",
        "09:30:00.",
        "09:30:00.1234567890",
        "24:00:00",
        "09:60:00",
        "09:30:60",
        "09:30:00.-1",
        "+9:30:00",
        "09:30:00:00",
        "093000",
        "09:30:00.1e3",
    ] {
        let e = parse_time_of_day(bad).unwrap_err();
        assert!(e.to_string().contains("HH:MM:SS.nnnnnnnnn"), "{bad}: {e}");
    }
    assert_eq!(
        TimeOfDay(ns(9, 30, 0, 42)).to_string(),
        "09:30:00.000000042"
    );
    assert_eq!(
        TimeOfDay(parse_time_of_day("14:05:59.5").unwrap()).to_string(),
        "14:05:59.500000000"
    );
}

/// The chunked pass sees every message once, wherever the chunks cut the records, and counts
/// exactly the rows `bbo` writes.
#[test]
fn books_pass_counts_bbo_changes_across_chunk_cuts() {
    let data = day();
    let (csv, totals) = bbo_csv(&data);
    for chunk in [64, 97, 4096, PASS_CHUNK] {
        let pass = pass_in_chunks(&data[..], chunk).unwrap();
        assert_eq!(pass.messages, totals.messages, "chunk {chunk}");
        assert_eq!(pass.bbo_changes, totals.rows, "chunk {chunk}");
        assert_eq!(pass.reader, totals.reader, "chunk {chunk}");
    }
    assert_eq!(csv.lines().count() as u64, totals.rows + 1);
    assert!(totals.rows > 1000);
}

/// A capture cut inside its last record: everything before is applied, the cut is reported.
#[test]
fn books_pass_reports_a_truncated_tail_and_refuses_no_capture() {
    let data = day();
    let cut = &data[..data.len() - 3];
    let pass = pass_in_chunks(cut, 100).unwrap();
    assert_eq!(pass.messages, 19_999);
    assert_eq!(pass.reader.bad_records, 1);
    assert!(pass.reader.unread_bytes > 0);
    let err = books_pass(&[0u8, 0, 0xff, 1, 2, 3][..]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    assert!(
        err.to_string().contains("not a BinaryFILE capture"),
        "{err}"
    );
}

/// The pass applies messages some messages after reading them (to prefetch their orders):
/// every event comes out as applying each message at once gives it, in the same order, and
/// the books end equal, whatever the chunk and for captures shorter than the lookahead.
#[test]
fn the_pass_applies_every_message_in_order_whatever_it_reads_ahead() {
    for messages in [3, LOOKAHEAD as u64, LOOKAHEAD as u64 + 1, 20_000] {
        let (data, _) = generate_binaryfile(&GenConfig {
            seed: 23,
            messages,
            symbols: 6,
        });
        let mut direct = Book::new();
        let mut want = Vec::new();
        StreamReader::with_chunk(&data[..], 4096)
            .for_each(|m| direct.apply(&m.unwrap(), &mut |e: &Event| want.push(*e)))
            .unwrap();
        if messages > 1000 {
            assert!(want.len() as u64 >= messages / 2, "{} events", want.len());
        }
        for chunk in [64, 4096] {
            let mut book = Book::new();
            let mut got = Vec::new();
            apply_ahead(&data[..], chunk, &mut book, &mut |e: &Event| got.push(*e)).unwrap();
            assert!(
                got == want,
                "{messages} messages, chunk {chunk}: events differ"
            );
            assert!(
                book == direct,
                "{messages} messages, chunk {chunk}: books differ"
            );
        }
    }
}

/// The ring hands messages back oldest first across many wraps, and only what it holds.
#[test]
fn the_lookahead_ring_is_first_in_first_out_across_wraps() {
    let mut ring = Lookahead::default();
    let mut next_out = 0u8;
    for i in 0..(5 * LOOKAHEAD as u8 + 3) {
        if ring.is_full() {
            assert_eq!(ring.oldest(), Some(&[next_out; 3][..]));
            ring.drop_oldest();
            next_out += 1;
        }
        ring.push(&[i; 3]);
    }
    while let Some(b) = ring.oldest() {
        assert_eq!(b, &[next_out; 3][..]);
        ring.drop_oldest();
        next_out += 1;
    }
    assert_eq!(next_out, 5 * LOOKAHEAD as u8 + 3);
    ring.drop_oldest();
    assert_eq!(ring.oldest(), None);
}
