//! FIX framing, field iteration and the whole gateway inbound path on arbitrary venue bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use order_gateway::fix::{split_frame, FixError, Message};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while !rest.is_empty() {
        match split_frame(rest) {
            Ok(n) => {
                if let Ok(m) = Message::parse(&rest[..n]) {
                    for f in m.fields() {
                        let _ = f;
                    }
                    let _ = (m.seq(), m.poss_dup(), m.price(44), m.uint(38));
                }
                rest = &rest[n..];
            }
            Err(
                FixError::BadBeginString { skip }
                | FixError::BadBodyLength { skip }
                | FixError::BadChecksum { skip },
            ) => {
                assert!(skip > 0 && skip <= rest.len());
                rest = &rest[skip..];
            }
            Err(_) => break,
        }
    }
});
