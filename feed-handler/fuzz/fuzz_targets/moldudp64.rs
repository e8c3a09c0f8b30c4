//! MoldUDP64 packets on arbitrary bytes: parsing never panics, parsed packets iterate exactly
//! their declared count, and the gap tracker survives any sequence of packets.
#![no_main]

use feed_handler::moldudp64::{GapConfig, GapTracker, Packet, Request, StartPolicy};
use libfuzzer_sys::fuzz_target;
use std::time::{Duration, Instant};

fuzz_target!(|data: &[u8]| {
    let _ = Request::parse(data);
    if let Ok(p) = Packet::parse(data) {
        assert_eq!(p.messages().count(), usize::from(p.message_count()));
    }
    // Split the input into packets at 0xFF 0xFE markers and feed them all to one tracker.
    let t0 = Instant::now();
    let mut tracker = GapTracker::new(GapConfig {
        start: StartPolicy::FirstSeen,
        max_buffered_bytes: 1 << 16,
        ..GapConfig::default()
    });
    let mut last = None;
    let mut deliver = |seq: u64, _: &[u8]| {
        if let Some(prev) = last {
            assert!(seq > prev, "delivered in order");
        }
        last = Some(seq);
    };
    for (i, chunk) in data.split(|&b| b == 0xFE).enumerate() {
        let now = t0 + Duration::from_millis(i as u64 * 30);
        let _ = tracker.on_packet(now, chunk, &mut deliver);
        tracker.handle_timeout(now, &mut deliver);
        let _ = tracker.poll_request(now);
    }
});
