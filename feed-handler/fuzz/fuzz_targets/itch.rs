//! ITCH decoding and BinaryFILE framing on arbitrary bytes: never panics, and what decodes
//! re-encodes to the same bytes.
#![no_main]

use feed_handler::binaryfile::Reader;
use feed_handler::book::{Book, Event};
use feed_handler::itch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((m, n)) = itch::decode(data) {
        assert_eq!(m.as_bytes(), &data[..n]);
        assert_eq!(itch::decode_exact(&data[..n]), Ok(m));
        let _ = itch::to_json(&m);
    }
    if let Ok(reader) = Reader::new(data) {
        let mut book = Book::new();
        for m in reader.flatten() {
            book.apply(&m, &mut |_: &Event| {});
        }
        let snap = book.snapshot();
        assert_eq!(Book::restore(&snap).as_ref(), Ok(&book));
    }
    let _ = Book::restore(data);
});
