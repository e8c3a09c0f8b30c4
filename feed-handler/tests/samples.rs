//! The two ITCH samples written by other implementations (`tests/data/itch/`, with a note of
//! where each came from) decode fully, with their known quirks.

use feed_handler::binaryfile::{Framing, Reader};
use feed_handler::book::{Book, Event};
use feed_handler::itch::Message;
use std::path::PathBuf;

fn sample(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/itch")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[test]
fn meatpy_sample_decodes_20_messages() {
    let data = sample("sample.itch50");
    let mut r = Reader::new(&data).expect("framing");
    assert_eq!(r.framing(), Framing::LengthPrefixed);
    let msgs: Vec<Message<'_>> = r.by_ref().map(|m| m.expect("decodes")).collect();
    assert_eq!(msgs.len(), 20);
    assert_eq!(r.counters().bad_records, 0);
    // Blank issue sub-type is accepted as-is.
    let dirs: Vec<_> = msgs
        .iter()
        .filter_map(|m| match m {
            Message::StockDirectory(d) => {
                Some((d.stock.as_str().map(str::to_owned), d.issue_sub_type))
            }
            _ => None,
        })
        .collect();
    assert_eq!(dirs.len(), 2);
    assert!(dirs.iter().any(|(s, _)| s.as_deref() == Some("MEAT")));
    let mut book = Book::new();
    for m in &msgs {
        book.apply(m, &mut |_: &Event| {});
    }
    assert_eq!(book.counters().unknown_orders, 0);
}

#[test]
fn ritch_sample_with_zero_prefixes_decodes_12012_messages() {
    let data = sample("ex20101224.TEST_ITCH_50");
    let mut r = Reader::new(&data).expect("framing");
    assert_eq!(r.framing(), Framing::ZeroPrefixed);
    let mut counts = std::collections::BTreeMap::new();
    let mut book = Book::new();
    for m in r.by_ref() {
        let m = m.expect("decodes");
        *counts.entry(m.message_type()).or_insert(0u32) += 1;
        book.apply(&m, &mut |_: &Event| {});
    }
    assert_eq!(r.counters().messages, 12012);
    assert_eq!(r.counters().bad_records, 0);
    let expected = [
        (b'A', 4997),
        (b'D', 1745),
        (b'E', 198),
        (b'F', 3),
        (b'H', 3),
        (b'P', 5000),
        (b'R', 3),
        (b'S', 6),
        (b'U', 12),
        (b'X', 45),
    ];
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), expected);
}

#[test]
fn zero_prefixed_file_is_not_misread_as_length_prefixed() {
    let data = sample("ex20101224.TEST_ITCH_50");
    let mut r = Reader::with_framing(&data, Framing::LengthPrefixed);
    assert!(
        r.next().expect("one record").is_err(),
        "a zero prefix is reported, not skipped"
    );
    assert_eq!(r.next(), None);
}
