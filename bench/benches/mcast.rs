//! The market-data protocol's per-message CPU cost on one core, without the
//! engine: what `md-latency` pays on top of bare UD datagrams (see
//! `rocebus-bench md-latency --raw`).
//!
//! - `publish`: one 64-byte message published, its datagram sealed into the
//!   history and taken for sending, as `McastPublisher::flush` does with a
//!   65,536-datagram history.
//! - `deliver`: one in-order datagram of one 64-byte message through the
//!   subscriber's state machine to the handler.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rocebus::mcast::wire::write_datagram_header;
use rocebus::mcast::{
    Handler, Line, PublisherConfig, PublisherState, SubscriberConfig, SubscriberState,
};

struct Sink(u64);

impl Handler for Sink {
    fn on_message(&mut self, seq: u64, msg: &[u8]) {
        self.0 = seq + msg.len() as u64;
    }
}

fn mcast(c: &mut Criterion) {
    let mut group = c.benchmark_group("mcast");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.throughput(Throughput::Elements(1));
    let msg = [7u8; 64];

    let mut p = PublisherState::new(PublisherConfig {
        channel: 1,
        session: 1,
        max_datagram: 1024,
        max_messages: 64,
        flush_interval_ns: 20_000,
        history_depth: 65_536,
        max_message_bytes: 0,
    });
    let mut sent_upto = p.next_seq();
    group.bench_function("publish", |b| {
        b.iter(|| {
            p.publish(black_box(&msg)).expect("fits");
            p.flush();
            let (_, end, bytes) = p.sealed_from(sent_upto).expect("just sealed");
            sent_upto = end;
            black_box(bytes);
        })
    });

    // One datagram reused with a rising sequence: a live, loss-free stream.
    let mut template = PublisherState::new(PublisherConfig {
        history_depth: 4,
        ..PublisherConfig {
            channel: 1,
            session: 1,
            max_datagram: 1024,
            max_messages: 64,
            flush_interval_ns: 20_000,
            history_depth: 4,
            max_message_bytes: 0,
        }
    });
    template.publish(&msg).expect("fits");
    let mut dgram = template.flush().expect("one message").to_vec();
    let mut s = SubscriberState::new(SubscriberConfig {
        channel: 1,
        max_datagram: 1024,
        max_buffered: 16_384,
        max_outstanding: 16,
        recovery_timeout_ns: 50_000_000,
        max_recovery_timeout_ns: 0,
        max_retries: 50,
        snapshot_timeout_ns: 1_000_000_000,
        ab_grace_ns: 0,
        join_replay_max: 0,
        max_request_messages: 4096,
        max_message_bytes: 0,
        gap_tolerance_ns: 0,
        claim_threshold: 4096,
        claim_packets: 3,
        claim_timeout_ns: 20_000_000,
    });
    s.announce_session(0, 1);
    let mut sink = Sink(0);
    let mut seq = 1u64;
    group.bench_function("deliver", |b| {
        b.iter(|| {
            write_datagram_header(&mut dgram, Line::A, 1, 1, seq, 1).expect("header fits");
            s.on_datagram(seq, Line::A, black_box(&dgram), &mut sink);
            seq += 1;
        })
    });
    assert_eq!(s.counters().delivered, seq - 1, "every datagram delivered");
    group.finish();
}

criterion_group!(benches, mcast);
criterion_main!(benches);
