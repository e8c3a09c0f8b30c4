//! The subscriber side of the feed ([`MarketView`], the L2 snapshot layout) is the contract
//! crate's ([`rocebus_md::view`], re-exported here); this module adds the L2 snapshot of a
//! full [`Book`], which only the feed handler has.

pub use rocebus_md::view::*;

use crate::book::{Book, Side};

/// Appends the L2 snapshot of the symbols of `book` for which `on_channel(locate)` holds:
/// what a subscriber's [`MarketView`] of that channel holds once it has caught up.
pub fn write_book_l2(book: &Book, on_channel: impl Fn(u16) -> bool, out: &mut Vec<u8>) {
    write_l2(
        book.symbols()
            .filter(|(l, s)| {
                on_channel(*l)
                    && (s.state() != b' '
                        || s.depth(Side::Bid).next().is_some()
                        || s.depth(Side::Ask).next().is_some())
            })
            .map(|(l, s)| L2Entry {
                locate: l,
                stock: s.stock,
                trading_state: s.state(),
                reason: s.reason,
                n_bids: s.depth(Side::Bid).count(),
                n_asks: s.depth(Side::Ask).count(),
                bids: s.depth(Side::Bid),
                asks: s.depth(Side::Ask),
            }),
        out,
    );
}

/// [`write_book_l2`] into a new vector.
pub fn book_l2(book: &Book, on_channel: impl Fn(u16) -> bool) -> Vec<u8> {
    let mut out = Vec::new();
    write_book_l2(book, on_channel, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::book::{Event, Level};
    use crate::generate::{generate, GenConfig};
    use crate::itch::decode_exact;
    use crate::itch::Stock;
    use crate::normalized;
    use crate::publish::{MdSink, Publisher};
    use rocebus::mcast::{Handler, SnapshotSink};

    /// Normalized messages per channel, as a `McastPublisher` would sequence them.
    #[derive(Default)]
    struct Channels(Vec<Vec<Vec<u8>>>);
    impl MdSink for Channels {
        type Error = std::convert::Infallible;
        fn publish(&mut self, channel: u16, message: &[u8]) -> Result<(), Self::Error> {
            let c = usize::from(channel);
            if self.0.len() <= c {
                self.0.resize_with(c + 1, Vec::new);
            }
            self.0[c].push(message.to_vec());
            Ok(())
        }
    }

    #[test]
    fn fixed_bytes_of_a_small_snapshot() {
        let mut v = MarketView::new();
        let mut buf = [0u8; normalized::MAX_LEN];
        let e = Event::Level {
            locate: 2,
            stock: Stock::new("AB"),
            timestamp: 1,
            side: Side::Ask,
            level: Level {
                price: 0x0102,
                shares: 7,
                orders: 1,
            },
        };
        let n = normalized::encode(&e, &mut buf);
        v.apply(&buf[..n]).unwrap();
        #[rustfmt::skip]
        let expected: [u8; 12 + 24 + 16] = [
            b'R', b'B', b'L', b'2', 1, 0, 0, 0, 1, 0, 0, 0,
            2, 0, b'A', b'B', b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', 0,
            0, 0, 0, 0, 1, 0, 0, 0,
            0x02, 0x01, 0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(v.l2(), expected);
        let mut w = MarketView::new();
        w.restore_l2(&expected).unwrap();
        assert_eq!(w.l2(), expected);
        assert_eq!(w.restore_l2(&expected[..40]), Err(L2Error::Truncated));
        let mut bad = expected;
        bad[0] = b'X';
        assert_eq!(w.restore_l2(&bad), Err(L2Error::BadMagic));
        let mut zero = expected;
        zero[44] = 0;
        assert_eq!(w.restore_l2(&zero), Err(L2Error::Inconsistent));
        assert_eq!(w.l2(), expected, "a refused snapshot changes nothing");
    }

    /// The publishing path on the host: a generated day through book → partitioned
    /// normalized messages → one view per channel equals the book's own L2, channel by
    /// channel; a late joiner restored from the book's snapshot mid-day ends equal too.
    #[test]
    fn views_per_channel_match_the_book_and_late_joiners_converge() {
        let channels = 3u16;
        let mut messages = Vec::new();
        generate(
            &GenConfig {
                seed: 11,
                messages: 30_000,
                symbols: 25,
            },
            |m| messages.push(m.to_vec()),
        );
        let mut book = Book::new();
        let mut publisher = Publisher::new(Channels::default(), channels);
        let half = messages.len() / 2;
        for m in &messages[..half] {
            book.apply(&decode_exact(m).unwrap(), &mut publisher);
        }
        let on = |c: u16| move |l: u16| l % channels == c;
        let mid_snapshots: Vec<Vec<u8>> = (0..channels).map(|c| book_l2(&book, on(c))).collect();
        let mid_lens: Vec<usize> = publisher.sink().0.iter().map(Vec::len).collect();
        for m in &messages[half..] {
            book.apply(&decode_exact(m).unwrap(), &mut publisher);
        }
        let sink = publisher.into_sink();
        for c in 0..channels {
            let stream = &sink.0[usize::from(c)];
            let mut full = MarketView::new();
            for (i, m) in stream.iter().enumerate() {
                full.on_message(i as u64 + 1, m);
            }
            let expected = book_l2(&book, on(c));
            assert!(expected.len() > 12, "channel {c} has symbols");
            assert_eq!(full.l2(), expected, "channel {c}");
            assert_eq!(full.counters().bbo_mismatches, 0);
            assert_eq!(full.counters().malformed, 0);
            assert!(full.counters().trades > 0);
            // Every symbol of the channel, and only those.
            assert!(full.symbols().all(|(l, _)| l % channels == c));

            let mut late = MarketView::new();
            late.begin_restore();
            let snap = &mid_snapshots[usize::from(c)];
            let (a, b) = snap.split_at(snap.len() / 2);
            late.restore_chunk(a).unwrap();
            late.restore_chunk(b).unwrap();
            let at = mid_lens[usize::from(c)] as u64;
            late.finish_restore(at).unwrap();
            assert_eq!(late.last_seq(), at);
            for (i, m) in stream.iter().enumerate().skip(at as usize) {
                late.on_message(i as u64 + 1, m);
            }
            assert_eq!(late.l2(), expected, "late joiner on channel {c}");
            assert_eq!(late.counters().bbo_mismatches, 0);
        }
    }
}
