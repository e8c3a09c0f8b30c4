//! MoldUDP64 packets on arbitrary bytes: parsing never panics, parsed packets iterate exactly
//! their declared count, and the gap tracker survives any sequence of packets.
#![no_main]

use feed_handler::moldudp64::{Deliver, GapConfig, GapTracker, Loss, Packet, Request, StartPolicy};
use libfuzzer_sys::fuzz_target;
use rocebus::clock::Mono;
use std::time::Duration;

/// Checks that messages come in increasing order and losses only move forward.
struct InOrder(Option<u64>);

impl InOrder {
    fn message(&mut self, seq: u64) {
        if let Some(prev) = self.0 {
            assert!(seq > prev, "delivered in order");
        }
        self.0 = Some(seq);
    }
}

impl Deliver for InOrder {
    fn message(&mut self, sequence: u64, _: &[u8]) {
        InOrder::message(self, sequence);
    }
    fn loss(&mut self, loss: Loss) {
        assert!(loss.from < loss.to, "a loss is a non-empty range");
        if let Some(prev) = self.0 {
            assert!(loss.from > prev, "a loss follows what was delivered");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = Request::parse(data);
    if let Ok(p) = Packet::parse(data) {
        assert_eq!(p.messages().count(), usize::from(p.message_count()));
    }
    // Split the input into packets at 0xFF 0xFE markers and feed them all to one tracker.
    let t0 = Mono::from_nanos(1 << 40);
    let mut tracker = GapTracker::new(GapConfig {
        start: StartPolicy::FirstSeen,
        max_buffered_bytes: 1 << 16,
        ..GapConfig::default()
    });
    let mut order = InOrder(None);
    for (i, chunk) in data.split(|&b| b == 0xFE).enumerate() {
        let now = t0 + Duration::from_millis(i as u64 * 30);
        let _ = tracker.on_packet(now, chunk, &mut |seq, _| order.message(seq));
        tracker.handle_timeout(now, &mut order);
        let _ = tracker.poll_request(now);
    }
});
