//! ITCH 5.0 throughput on one core (issue 6, Benchmark): decode-only, and decode plus
//! full-depth order books, over a generated day.
//!
//! The day comes from `feed_handler::generate` with a fixed seed, so every run and every
//! machine measures the same bytes. One iteration reads the whole capture through
//! `binaryfile::Reader` (BinaryFILE framing plus ITCH decoding); the book variant also applies
//! every message to a fresh `Book` (building a book from an empty state is part of a day).
//! The same work is reported twice: in messages per second, and in capture bytes per second.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use feed_handler::binaryfile::{Framing, Reader};
use feed_handler::book::{Book, Event};
use feed_handler::generate::{generate_binaryfile, GenConfig};

/// One million messages over 500 symbols: big enough that the books outgrow L2 like a real
/// day's, small enough that generating it takes about a second.
const DAY: GenConfig = GenConfig {
    seed: 0x17C4_5000,
    messages: 1_000_000,
    symbols: 500,
};

fn decode_only(file: &[u8]) -> u64 {
    let mut n = 0u64;
    for m in Reader::with_framing(file, Framing::LengthPrefixed).flatten() {
        black_box(&m);
        n += 1;
    }
    n
}

fn decode_and_book(file: &[u8]) -> usize {
    let mut book = Book::new();
    let mut sink = |e: &Event| {
        black_box(e);
    };
    for m in Reader::with_framing(file, Framing::LengthPrefixed).flatten() {
        book.apply(&m, &mut sink);
    }
    black_box(book.order_count())
}

fn register(group: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>, file: &[u8]) {
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("decode", |b| b.iter(|| decode_only(black_box(file))));
    group.bench_function("decode+book", |b| {
        b.iter(|| decode_and_book(black_box(file)))
    });
}

fn itch(c: &mut Criterion) {
    let (file, _live) = generate_binaryfile(&DAY);
    // A bench over a capture that does not decode would measure the error path.
    let messages = decode_only(&file);
    assert_eq!(
        messages, DAY.messages,
        "generated day must decode completely"
    );

    let mut group = c.benchmark_group("itch_messages");
    group.throughput(Throughput::Elements(messages));
    register(&mut group, &file);
    group.finish();

    let mut group = c.benchmark_group("itch_bytes");
    group.throughput(Throughput::Bytes(file.len() as u64));
    register(&mut group, &file);
    group.finish();
}

criterion_group!(benches, itch);
criterion_main!(benches);
