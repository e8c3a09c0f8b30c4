//! Market-data datagrams on arbitrary bytes: parsing never panics, and a datagram that parses
//! iterates exactly its declared messages with consecutive sequences, covering every byte.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rocebus::mcast::wire::{Datagram, DATAGRAM_HEADER_LEN, MSG_PREFIX_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(d) = Datagram::parse(data) else {
        return;
    };
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
});
