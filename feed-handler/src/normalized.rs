//! Normalized market-data messages: the wire layout is the contract crate's
//! ([`rocebus_md::normalized`], re-exported here); this module adds the encoders from the
//! book's [`Event`]s, which only the feed handler needs.

pub use rocebus_md::normalized::*;

use crate::book::{Event, Level, Side};
use zerocopy::byteorder::little_endian::{U32, U64};
use zerocopy::IntoBytes;

/// Encodes a book event into `out` with `ts_recv` 0 (unknown); returns the bytes written.
pub fn encode(event: &Event, out: &mut [u8; MAX_LEN]) -> usize {
    encode_received(event, 0, out)
}

/// Encodes a book event into `out`, stamped with the receive time `ts_recv` (UNIX
/// nanoseconds, see [`Header::ts_recv`]); returns the bytes written (no allocation).
pub fn encode_received(event: &Event, ts_recv: u64, out: &mut [u8; MAX_LEN]) -> usize {
    fn put(out: &mut [u8; MAX_LEN], bytes: &[u8]) -> usize {
        out[..bytes.len()].copy_from_slice(bytes);
        bytes.len()
    }
    let side_byte = |s: Option<Side>| s.map_or(b' ', Side::to_itch);
    match *event {
        Event::Bbo {
            locate,
            stock,
            timestamp,
            bid,
            ask,
        } => {
            let z = Level {
                price: 0,
                shares: 0,
                orders: 0,
            };
            let (b, a) = (bid.unwrap_or(z), ask.unwrap_or(z));
            let m = Bbo {
                header: header(KIND_BBO, locate, stock, timestamp, ts_recv),
                bid_price: U32::new(b.price),
                ask_price: U32::new(a.price),
                bid_shares: U64::new(b.shares),
                ask_shares: U64::new(a.shares),
                bid_orders: U32::new(b.orders),
                ask_orders: U32::new(a.orders),
            };
            put(out, m.as_bytes())
        }
        Event::Level {
            locate,
            stock,
            timestamp,
            side,
            level,
        } => {
            let m = LevelChange {
                header: header(KIND_LEVEL, locate, stock, timestamp, ts_recv),
                side: side.to_itch(),
                reserved: [0; 3],
                price: U32::new(level.price),
                shares: U64::new(level.shares),
                orders: U32::new(level.orders),
            };
            put(out, m.as_bytes())
        }
        Event::Trade {
            locate,
            stock,
            timestamp,
            side,
            price,
            shares,
            match_number,
            source,
        } => {
            let m = Trade {
                header: header(KIND_TRADE, locate, stock, timestamp, ts_recv),
                side: side_byte(side),
                source,
                reserved: [0; 2],
                price: U32::new(price),
                shares: U64::new(shares),
                match_number: U64::new(match_number),
            };
            put(out, m.as_bytes())
        }
        Event::TradingStatus {
            locate,
            stock,
            timestamp,
            state,
            reason,
        } => {
            let m = TradingStatus {
                header: header(KIND_STATUS, locate, stock, timestamp, ts_recv),
                state,
                reserved: [0; 3],
                reason,
            };
            put(out, m.as_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::itch::Stock;

    /// A level change: bid 10.0100 x 150, 1 order, AAPL locate 1 at 1000 ns, received at
    /// UNIX time 0x0102030405060708 ns.
    #[rustfmt::skip]
    static LEVEL_BYTES: [u8; 48] = [
        KIND_LEVEL, 2, 1, 0,                       // kind, version 2, locate (LE)
        b'A', b'A', b'P', b'L', b' ', b' ', b' ', b' ',
        0xe8, 0x03, 0, 0, 0, 0, 0, 0,              // timestamp 1000
        8, 7, 6, 5, 4, 3, 2, 1,                    // ts_recv
        b'B', 0, 0, 0,                             // side, reserved
        0x04, 0x87, 0x01, 0x00,                    // price 100100
        150, 0, 0, 0, 0, 0, 0, 0,                  // shares
        1, 0, 0, 0,                                // orders
    ];

    #[test]
    fn level_change_fixed_bytes() {
        let e = Event::Level {
            locate: 1,
            stock: Stock::new("AAPL"),
            timestamp: 1000,
            side: Side::Bid,
            level: Level {
                price: 100_100,
                shares: 150,
                orders: 1,
            },
        };
        let mut buf = [0u8; MAX_LEN];
        let n = encode_received(&e, 0x0102_0304_0506_0708, &mut buf);
        assert_eq!(&buf[..n], &LEVEL_BYTES[..]);
        let n = encode(&e, &mut buf);
        assert_eq!(&buf[20..28], &[0; 8], "encode leaves ts_recv unknown");
        assert_eq!(&buf[..20], &LEVEL_BYTES[..20]);
        assert_eq!(&buf[28..n], &LEVEL_BYTES[28..]);
        let Ok(Normalized::Level(m)) = decode(&LEVEL_BYTES) else {
            panic!("level")
        };
        assert_eq!(
            (m.price.get(), m.shares.get(), m.orders.get(), m.side),
            (100_100, 150, 1, b'B')
        );
        assert_eq!(m.header.ts_recv.get(), 0x0102_0304_0506_0708);
        // A version 1 message (no ts_recv) is refused, not misread.
        let mut v1 = LEVEL_BYTES[..40].to_vec();
        v1[1] = 1;
        assert_eq!(decode(&v1), Err(NormalizedError::Version(1)));
    }

    /// Messages 7..10 lost after exchange time 1000.
    #[rustfmt::skip]
    static FEED_LOSS_BYTES: [u8; 44] = [
        KIND_FEED_LOSS, 2, 0, 0,                   // kind, version 2, locate 0
        b' ', b' ', b' ', b' ', b' ', b' ', b' ', b' ', // no symbol
        0xe8, 0x03, 0, 0, 0, 0, 0, 0,              // timestamp 1000
        0, 0, 0, 0, 0, 0, 0, 0,                    // ts_recv unknown
        7, 0, 0, 0, 0, 0, 0, 0,                    // from
        10, 0, 0, 0, 0, 0, 0, 0,                   // to
    ];

    #[test]
    fn feed_loss_fixed_bytes() {
        assert_eq!(FeedLoss::new(7, 10, 1000).as_bytes(), &FEED_LOSS_BYTES[..]);
        let Ok(Normalized::FeedLoss(m)) = decode(&FEED_LOSS_BYTES) else {
            panic!("feed loss")
        };
        assert_eq!((m.from.get(), m.to.get()), (7, 10));
        assert!(decode(&FEED_LOSS_BYTES[..43]).is_err());
    }

    #[test]
    fn every_kind_roundtrips() {
        let stock = Stock::new("MSFT");
        let events = [
            Event::Bbo {
                locate: 3,
                stock,
                timestamp: 5,
                bid: Some(Level {
                    price: 10,
                    shares: 20,
                    orders: 2,
                }),
                ask: None,
            },
            Event::Trade {
                locate: 3,
                stock,
                timestamp: 6,
                side: None,
                price: 11,
                shares: 1 << 40,
                match_number: 9,
                source: b'Q',
            },
            Event::TradingStatus {
                locate: 3,
                stock,
                timestamp: 7,
                state: b'H',
                reason: *b"T1  ",
            },
        ];
        let mut buf = [0u8; MAX_LEN];
        let n = encode(&events[0], &mut buf);
        let Ok(Normalized::Bbo(b)) = decode(&buf[..n]) else {
            panic!("bbo")
        };
        assert_eq!(
            (
                b.bid_price.get(),
                b.bid_shares.get(),
                b.bid_orders.get(),
                b.ask_price.get()
            ),
            (10, 20, 2, 0)
        );
        assert_eq!(b.header.stock, *b"MSFT    ");
        let n = encode(&events[1], &mut buf);
        let Ok(Normalized::Trade(t)) = decode(&buf[..n]) else {
            panic!("trade")
        };
        assert_eq!(
            (t.side, t.source, t.shares.get(), t.match_number.get()),
            (b' ', b'Q', 1 << 40, 9)
        );
        let n = encode(&events[2], &mut buf);
        let Ok(Normalized::Status(s)) = decode(&buf[..n]) else {
            panic!("status")
        };
        assert_eq!(
            (s.state, s.reason, s.header.timestamp.get()),
            (b'H', *b"T1  ", 7)
        );
        assert_eq!(
            decode(&buf[..n - 1]),
            Err(NormalizedError::Length {
                kind: KIND_STATUS,
                len: n - 1
            })
        );
        assert_eq!(decode(&[]), Err(NormalizedError::UnknownKind(0)));
        assert_eq!(decode(&[KIND_BBO, 9]), Err(NormalizedError::Version(9)));
    }
}
