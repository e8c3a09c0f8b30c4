//! A deterministic, seeded generator of specification-conforming ITCH 5.0 days.
//!
//! Owns synthetic order flow; it only ever executes, cancels, replaces or deletes orders
//! that are live, never crosses its own book (bids below each symbol's mid, asks above), and
//! halts and resumes symbols with 'H' messages. The same seed and configuration always give
//! the same bytes: the RNG is ChaCha8, whose output is fixed by its specification (unlike
//! `rand`'s `StdRng`/`SmallRng`, which may change between versions).

use crate::binaryfile;
use crate::itch::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use zerocopy::byteorder::big_endian::{U32, U64};
use zerocopy::IntoBytes;

/// What to generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GenConfig {
    /// RNG seed.
    pub seed: u64,
    /// Total ITCH messages, including system events and the stock directory.
    pub messages: u64,
    /// Number of symbols (stock locates 1..=symbols).
    pub symbols: u16,
}

const TICK: u32 = 100; // $0.01 in Price(4)
const START_NS: u64 = 4 * 3600 * 1_000_000_000;
const OPEN_NS: u64 = 9 * 3600 * 1_000_000_000 + 30 * 60 * 1_000_000_000;

#[derive(Debug, Clone, Copy)]
struct Live {
    reference: u64,
    locate: u16,
    side: u8,
    price: u32,
    shares: u32,
}

/// The symbol name of stock locate `locate` (1-based): "A", "B", ..., "Z", "AA", ...
pub fn symbol_name(locate: u16) -> Stock {
    let mut n = u32::from(locate.max(1));
    let mut buf = [b' '; 8];
    let mut len = 0;
    while n > 0 && len < 8 {
        n -= 1;
        buf[len] = b'A' + (n % 26) as u8;
        n /= 26;
        len += 1;
    }
    buf[..len].reverse();
    Stock(buf)
}

struct Gen<'o, F: FnMut(&[u8])> {
    rng: ChaCha8Rng,
    out: &'o mut F,
    ts: u64,
    emitted: u64,
    next_ref: u64,
    next_match: u64,
    live: Vec<Live>,
    mids: Vec<u32>,
    halted: Vec<bool>,
}

impl<F: FnMut(&[u8])> Gen<'_, F> {
    fn header(&mut self, t: u8, locate: u16) -> Header {
        self.ts += self.rng.gen_range(1..=50_000);
        Header::new(t, locate, 0, self.ts.min(Timestamp::MAX))
    }

    fn emit(&mut self, bytes: &[u8]) {
        (self.out)(bytes);
        self.emitted += 1;
    }

    fn system(&mut self, code: u8) {
        let m = SystemEvent {
            header: self.header(b'S', 0),
            event_code: code,
        };
        self.emit(m.as_bytes());
    }

    fn directory(&mut self, locate: u16) {
        let m = StockDirectory {
            header: self.header(b'R', locate),
            stock: symbol_name(locate),
            market_category: b'Q',
            financial_status_indicator: b'N',
            round_lot_size: U32::new(100),
            round_lots_only: b'N',
            issue_classification: b'C',
            issue_sub_type: *b"Z ",
            authenticity: b'P',
            short_sale_threshold_indicator: b'N',
            ipo_flag: b'N',
            luld_reference_price_tier: b'1',
            etp_flag: b'N',
            etp_leverage_factor: U32::new(0),
            inverse_indicator: b'N',
        };
        self.emit(m.as_bytes());
    }

    fn add(&mut self, locate: u16) {
        let side = if self.rng.gen_bool(0.5) { b'B' } else { b'S' };
        let price = self.price(locate, side);
        let shares = 100 * self.rng.gen_range(1..=10);
        let reference = self.next_ref;
        self.next_ref += 1;
        let stock = symbol_name(locate);
        if self.rng.gen_bool(0.1) {
            let m = AddOrderMpid {
                header: self.header(b'F', locate),
                order_reference_number: U64::new(reference),
                buy_sell_indicator: side,
                shares: U32::new(shares),
                stock,
                price: Price4::new(price),
                attribution: *b"GSCO",
            };
            self.emit(m.as_bytes());
        } else {
            let m = AddOrder {
                header: self.header(b'A', locate),
                order_reference_number: U64::new(reference),
                buy_sell_indicator: side,
                shares: U32::new(shares),
                stock,
                price: Price4::new(price),
            };
            self.emit(m.as_bytes());
        }
        self.live.push(Live {
            reference,
            locate,
            side,
            price,
            shares,
        });
    }

    /// A price 1..=20 ticks away from the symbol's mid, on the side's own half of the book.
    fn price(&mut self, locate: u16, side: u8) -> u32 {
        let mid = self.mids[usize::from(locate)];
        let off = TICK * self.rng.gen_range(1..=20);
        if side == b'B' {
            mid - off
        } else {
            mid + off
        }
    }

    fn pick(&mut self) -> Option<usize> {
        (!self.live.is_empty()).then(|| self.rng.gen_range(0..self.live.len()))
    }

    fn step(&mut self) {
        let symbols = self.mids.len() as u16 - 1;
        let roll = self.rng.gen_range(0..1000);
        let Some(i) = self.pick().filter(|_| roll >= 400) else {
            let locate = self.rng.gen_range(1..=symbols);
            return self.add(locate);
        };
        let o = self.live[i];
        let halted = self.halted[usize::from(o.locate)];
        match roll {
            400..=599 => {
                let m = OrderDelete {
                    header: self.header(b'D', o.locate),
                    order_reference_number: U64::new(o.reference),
                };
                self.emit(m.as_bytes());
                self.live.swap_remove(i);
            }
            600..=699 => {
                let n = self.rng.gen_range(1..=o.shares);
                let m = OrderCancel {
                    header: self.header(b'X', o.locate),
                    order_reference_number: U64::new(o.reference),
                    cancelled_shares: U32::new(n),
                };
                self.emit(m.as_bytes());
                self.reduce(i, n);
            }
            700..=819 if !halted => {
                let n = self.rng.gen_range(1..=o.shares);
                let match_number = self.match_number();
                if self.rng.gen_bool(0.2) {
                    let m = OrderExecutedWithPrice {
                        header: self.header(b'C', o.locate),
                        order_reference_number: U64::new(o.reference),
                        executed_shares: U32::new(n),
                        match_number: U64::new(match_number),
                        printable: b'Y',
                        execution_price: Price4::new(o.price),
                    };
                    self.emit(m.as_bytes());
                } else {
                    let m = OrderExecuted {
                        header: self.header(b'E', o.locate),
                        order_reference_number: U64::new(o.reference),
                        executed_shares: U32::new(n),
                        match_number: U64::new(match_number),
                    };
                    self.emit(m.as_bytes());
                }
                self.reduce(i, n);
            }
            820..=939 => {
                let reference = self.next_ref;
                self.next_ref += 1;
                let price = self.price(o.locate, o.side);
                let shares = 100 * self.rng.gen_range(1..=10);
                let m = OrderReplace {
                    header: self.header(b'U', o.locate),
                    original_order_reference_number: U64::new(o.reference),
                    new_order_reference_number: U64::new(reference),
                    shares: U32::new(shares),
                    price: Price4::new(price),
                };
                self.emit(m.as_bytes());
                self.live[i] = Live {
                    reference,
                    price,
                    shares,
                    ..o
                };
            }
            940..=989 if !halted => {
                let side = if self.rng.gen_bool(0.5) { b'B' } else { b'S' };
                let match_number = self.match_number();
                let m = Trade {
                    header: self.header(b'P', o.locate),
                    order_reference_number: U64::new(0),
                    buy_sell_indicator: side,
                    shares: U32::new(100 * self.rng.gen_range(1..=5)),
                    stock: symbol_name(o.locate),
                    price: Price4::new(self.mids[usize::from(o.locate)]),
                    match_number: U64::new(match_number),
                };
                self.emit(m.as_bytes());
            }
            _ => {
                // Halt or resume the symbol.
                let was = self.halted[usize::from(o.locate)];
                let (state, reason) = if was {
                    (b'T', *b"    ")
                } else {
                    (b'H', *b"T1  ")
                };
                let m = StockTradingAction {
                    header: self.header(b'H', o.locate),
                    stock: symbol_name(o.locate),
                    trading_state: state,
                    reserved: b' ',
                    reason,
                };
                self.emit(m.as_bytes());
                self.halted[usize::from(o.locate)] = !was;
            }
        }
    }

    fn match_number(&mut self) -> u64 {
        self.next_match += 1;
        self.next_match
    }

    fn reduce(&mut self, i: usize, n: u32) {
        self.live[i].shares -= n;
        if self.live[i].shares == 0 {
            self.live.swap_remove(i);
        }
    }
}

/// Generates a day, handing each encoded message to `out` in order. Returns the number of
/// orders still live at the end.
pub fn generate(config: &GenConfig, mut out: impl FnMut(&[u8])) -> usize {
    let symbols = config.symbols.max(1);
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    // Index 0 unused: locates start at 1.
    let mids = (0..=symbols)
        .map(|_| 10_000 * rng.gen_range(20..=500))
        .collect();
    let mut g = Gen {
        rng,
        out: &mut out,
        ts: START_NS,
        emitted: 0,
        next_ref: 1,
        next_match: 0,
        live: Vec::new(),
        mids,
        halted: vec![false; usize::from(symbols) + 1],
    };
    let fixed = 3 + u64::from(symbols) + 3;
    let budget = config.messages;
    let emit_system = |g: &mut Gen<'_, _>, code| {
        if g.emitted < budget {
            g.system(code)
        }
    };
    emit_system(&mut g, b'O');
    emit_system(&mut g, b'S');
    for locate in 1..=symbols {
        if g.emitted < budget {
            g.directory(locate);
        }
    }
    g.ts = g.ts.max(OPEN_NS);
    emit_system(&mut g, b'Q');
    while g.emitted + 3 < budget.max(fixed) && g.emitted < budget {
        g.step();
    }
    emit_system(&mut g, b'M');
    emit_system(&mut g, b'E');
    emit_system(&mut g, b'C');
    g.live.len()
}

/// Generates a day as a BinaryFILE capture.
pub fn generate_binaryfile(config: &GenConfig) -> (Vec<u8>, usize) {
    let mut file = Vec::with_capacity(
        usize::try_from(config.messages)
            .unwrap_or(0)
            .saturating_mul(38),
    );
    let live = generate(config, |m| binaryfile::push_record(&mut file, m));
    (file, live)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::binaryfile::Reader;
    use crate::book::{Book, Event};

    #[test]
    fn symbol_names() {
        assert_eq!(symbol_name(1).as_str(), Some("A"));
        assert_eq!(symbol_name(26).as_str(), Some("Z"));
        assert_eq!(symbol_name(27).as_str(), Some("AA"));
        assert_eq!(symbol_name(703).as_str(), Some("AAA"));
    }

    #[test]
    fn generated_day_decodes_and_books_stay_consistent() {
        let cfg = GenConfig {
            seed: 7,
            messages: 50_000,
            symbols: 40,
        };
        let (file, live) = generate_binaryfile(&cfg);
        let mut reader = Reader::new(&file).expect("framing");
        let mut book = Book::new();
        let mut types = std::collections::BTreeSet::new();
        let mut n = 0u64;
        let mut last_ts = 0;
        for m in reader.by_ref() {
            let m = m.expect("every record decodes");
            types.insert(m.message_type());
            let ts = m.header().timestamp.nanos();
            assert!(ts >= last_ts, "timestamps never go back");
            last_ts = ts;
            book.apply(&m, &mut |_: &Event| {});
            n += 1;
        }
        assert_eq!(n, cfg.messages);
        assert_eq!(reader.counters().bad_records, 0);
        assert_eq!(
            *book.counters(),
            crate::book::BookCounters {
                messages: n,
                ..Default::default()
            }
        );
        assert_eq!(book.order_count(), live);
        assert_eq!(
            types.into_iter().collect::<Vec<_>>(),
            b"ACDEFHPRSUX".to_vec()
        );
        // Never crossed.
        for (_, s) in book.symbols() {
            if let (Some(b), Some(a)) = s.bbo() {
                assert!(b.price < a.price);
            }
        }
        assert_eq!(book.symbols().count(), 40);
    }

    #[test]
    fn deterministic_per_seed() {
        let cfg = GenConfig {
            seed: 1,
            messages: 2_000,
            symbols: 5,
        };
        assert_eq!(generate_binaryfile(&cfg), generate_binaryfile(&cfg));
        assert_ne!(
            generate_binaryfile(&cfg).0,
            generate_binaryfile(&GenConfig { seed: 2, ..cfg }).0
        );
        let tiny = GenConfig {
            seed: 1,
            messages: 3,
            symbols: 5,
        };
        assert_eq!(
            Reader::new(&generate_binaryfile(&tiny).0)
                .expect("framing")
                .count(),
            3
        );
    }
}
