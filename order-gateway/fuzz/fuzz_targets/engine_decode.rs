//! Engine protocol decoders on arbitrary bytes: never panic, and a decoded frame re-encodes to
//! the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_gateway::proto::{Request, Response};

fuzz_target!(|data: &[u8]| {
    if let Ok((r, n)) = Request::decode(data) {
        assert_eq!(r.as_bytes(), &data[..n]);
    }
    if let Ok((r, n)) = Response::decode(data) {
        assert_eq!(r.as_bytes(), &data[..n]);
    }
});
