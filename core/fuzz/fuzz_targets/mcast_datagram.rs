//! Market-data datagrams on arbitrary bytes: parsing never panics, and a datagram that parses
//! iterates exactly its declared messages with consecutive sequences, covering every byte. A
//! fragment datagram's fragment stays within its total, and a stream of them (the input cut
//! into datagrams by a u16 length in front of each) fed to a reassembler never panics nor
//! hands out a message other than its declared length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocebus::mcast::fragment::{Push, Reassembler};
use rocebus::mcast::wire::{
    Datagram, DATAGRAM_HEADER_LEN, FRAGMENT_HEADER_LEN, MSG_PREFIX_LEN,
};

fn check(data: &[u8]) -> Option<Datagram<'_>> {
    let d = Datagram::parse(data).ok()?;
    let mut covered = DATAGRAM_HEADER_LEN;
    let mut expected_seq = d.first_seq();
    let mut n = 0u16;
    for (seq, msg) in d.messages() {
        assert_eq!(seq, expected_seq);
        expected_seq += 1;
        covered += MSG_PREFIX_LEN + msg.len();
        n += 1;
    }
    assert_eq!(n, d.count());
    assert_eq!(expected_seq, d.end_seq());
    assert_eq!(covered, data.len());
    assert_eq!(d.is_heartbeat(), n == 0);
    assert_eq!(d.is_fragment(), d.fragment().is_some());
    if let Some(f) = d.fragment() {
        assert_eq!(d.count(), 1);
        assert!(!f.bytes.is_empty());
        assert!(u64::from(f.offset) + f.bytes.len() as u64 <= u64::from(f.total_len));
        assert_eq!(f.bytes.len() + FRAGMENT_HEADER_LEN + MSG_PREFIX_LEN, covered - DATAGRAM_HEADER_LEN);
    }
    Some(d)
}

fuzz_target!(|data: &[u8]| {
    check(data);
    let mut r = Reassembler::new(4096);
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let Some(one) = rest.get(2..2 + len) else {
            break;
        };
        rest = &rest[2 + len..];
        if let Some(f) = check(one).and_then(|d| d.fragment()) {
            if let Push::Complete(msg) = r.push(f) {
                assert_eq!(msg.len(), f.total_len as usize);
                assert!(msg.len() <= r.capacity());
            }
        }
    }
});
