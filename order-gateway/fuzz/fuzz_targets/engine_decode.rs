//! Engine protocol decoders on arbitrary bytes: never panic, and a decoded frame re-encodes to
//! the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_gateway::proto::{Heartbeat, LogonAck, Request, RequestHoles, Response, HOLES_PER_FRAME};

fuzz_target!(|data: &[u8]| {
    if let Ok((r, n)) = Request::decode(data) {
        assert_eq!(r.as_bytes(), &data[..n]);
    }
    if let Ok((r, n)) = Response::decode(data) {
        assert_eq!(r.as_bytes(), &data[..n]);
    }
    let le32 = |at: usize| u32::from_le_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]]);
    if let Ok(h) = Heartbeat::decode(data) {
        assert_eq!(data[..4], [b'h', 1, 16, 0]);
        assert_eq!(
            u64::from(le32(8)) | u64::from(le32(12)) << 32,
            h.sent_ns.get()
        );
    }
    if let Ok((a, status)) = LogonAck::decode(data) {
        assert_eq!(data[..4], [b'l', 1, 24, 0]);
        assert_eq!(le32(8), a.engine_id.get());
        assert_eq!(u16::from_le_bytes([data[12], data[13]]), status as u16);
        assert_eq!(
            u16::from_le_bytes([data[14], data[15]]),
            a.heartbeat_ms.get()
        );
        assert_eq!(
            (le32(16), le32(20)),
            (a.last_response_seq.get(), a.last_request_seq.get())
        );
    }
    if let Ok(h) = RequestHoles::decode(data) {
        assert_eq!(data[..4], [b'H', 1, 252, 0]);
        let n = h.holes().count();
        assert!((1..=HOLES_PER_FRAME).contains(&n));
        assert_eq!(n, usize::from(u16::from_le_bytes([data[8], data[9]])));
        for (i, s) in h.holes().enumerate() {
            assert_eq!(s, le32(12 + 4 * i));
        }
    }
});
