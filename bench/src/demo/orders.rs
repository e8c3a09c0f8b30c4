//! The engine's order side, I/O-free: the sample quoting strategy, the intended send time of
//! each order (the round trip's start) and the order path's counts. The loop that sends and
//! receives is in `engine`.

use rocebus_engine::proto::{Side, Symbol};

/// Best bid and offer of one symbol, prices with 4 implied decimals; 0 means the side is
/// empty.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quote {
    /// Best bid price.
    pub bid: u32,
    /// Best ask price.
    pub ask: u32,
}

/// What the strategy wants to send now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrderIntent {
    /// Instrument.
    pub symbol: Symbol,
    /// Side.
    pub side: Side,
    /// Shares.
    pub qty: u32,
    /// Limit price, 4 implied decimals.
    pub price: i64,
}

/// The sample strategy: joins the book of each traded symbol in turn, buying at the best
/// bid and selling at the best ask alternately, so the position stays near flat.
#[derive(Debug, Clone)]
pub struct Strategy {
    symbols: Vec<(Symbol, Quote)>,
    next: usize,
    sells: Vec<bool>,
    /// Per symbol: trading is halted, paused or quotation-only (the gateway would reject
    /// orders as `Halted`), as the last status message said.
    halted: Vec<bool>,
    qty: u32,
}

impl Strategy {
    /// A strategy trading `symbols` (already validated) `qty` shares at a time.
    pub fn new(symbols: &[Symbol], qty: u32) -> Strategy {
        Strategy {
            symbols: symbols.iter().map(|s| (*s, Quote::default())).collect(),
            next: 0,
            sells: vec![false; symbols.len()],
            halted: vec![false; symbols.len()],
            qty,
        }
    }

    /// Applies a trading status (ITCH state: b'H' halted, b'P' paused, b'Q' quotation
    /// only, b'T' trading); returns false if the symbol is not traded. No orders go out for
    /// a symbol that cannot trade: the gateway's risk would only reject them.
    pub fn on_status(&mut self, stock: &[u8; 8], state: u8) -> bool {
        match self.symbols.iter().position(|(s, _)| &s.0 == stock) {
            Some(i) => {
                self.halted[i] = matches!(state, b'H' | b'P' | b'Q');
                true
            }
            None => false,
        }
    }

    /// Applies one BBO update; returns false if the symbol is not traded.
    pub fn on_bbo(&mut self, stock: &[u8; 8], quote: Quote) -> bool {
        match self.symbols.iter_mut().find(|(s, _)| &s.0 == stock) {
            Some((_, q)) => {
                *q = quote;
                true
            }
            None => false,
        }
    }

    /// The current quote of `symbol`.
    pub fn quote(&self, symbol: Symbol) -> Option<Quote> {
        self.symbols
            .iter()
            .find(|(s, _)| *s == symbol)
            .map(|(_, q)| *q)
    }

    /// Forgets every quote (after a market-data re-synchronisation).
    pub fn clear_quotes(&mut self) {
        for (_, q) in &mut self.symbols {
            *q = Quote::default();
        }
    }

    /// The next order: the next symbol (round robin) that is trading and whose book has the
    /// side it is due to trade; `None` while no traded symbol has a usable quote.
    pub fn next_order(&mut self) -> Option<OrderIntent> {
        let n = self.symbols.len();
        for k in 0..n {
            let i = (self.next + k) % n;
            let (symbol, q) = self.symbols[i];
            let sell = self.sells[i];
            let price = if sell { q.ask } else { q.bid };
            if price == 0 || self.halted[i] {
                continue;
            }
            self.next = (i + 1) % n;
            self.sells[i] = !sell;
            return Some(OrderIntent {
                symbol,
                side: if sell { Side::Sell } else { Side::Buy },
                qty: self.qty,
                price: i64::from(price),
            });
        }
        None
    }
}

/// Intended send times of the orders, by order id, allocated once for the whole run.
#[derive(Debug, Clone)]
pub struct OrderTimes {
    first_id: u64,
    intended: Vec<u64>,
}

impl OrderTimes {
    /// Room for `capacity` orders with ids from `first_id`.
    pub fn new(first_id: u64, capacity: usize) -> OrderTimes {
        OrderTimes {
            first_id,
            intended: vec![0; capacity],
        }
    }

    /// True when `id` has no slot (the run sent more orders than planned).
    pub fn is_full(&self, id: u64) -> bool {
        self.slot(id).is_none()
    }

    fn slot(&self, id: u64) -> Option<usize> {
        let i = usize::try_from(id.checked_sub(self.first_id)?).ok()?;
        (i < self.intended.len()).then_some(i)
    }

    /// Remembers that order `id` was due at `intended_ns`.
    pub fn set(&mut self, id: u64, intended_ns: u64) {
        if let Some(i) = self.slot(id) {
            self.intended[i] = intended_ns;
        }
    }

    /// Takes the intended time of `id` (each order is measured once: its first answer).
    pub fn take(&mut self, id: u64) -> Option<u64> {
        let i = self.slot(id)?;
        let t = std::mem::take(&mut self.intended[i]);
        (t != 0).then_some(t)
    }
}
/// Order-path counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OrderCounts {
    /// Orders sent.
    pub sent: u64,
    /// Acks received.
    pub acks: u64,
    /// Fills (full or partial) received.
    pub fills: u64,
    /// Rejects received (risk or venue).
    pub rejects: u64,
    /// Cancels received.
    pub canceled: u64,
    /// Scheduled sends skipped because no traded symbol had a quote yet.
    pub skipped_no_quote: u64,
    /// Sends that found the RC ring full (retried at once, latency still counts from the
    /// intended time).
    pub back_pressured: u64,
    /// Responses the client could not apply (unknown or already-final orders).
    pub bad_responses: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sym(s: &str) -> Symbol {
        Symbol::new(s).unwrap()
    }

    #[test]
    fn strategy_joins_the_book_alternating_sides_round_robin() {
        let mut s = Strategy::new(&[sym("A"), sym("B")], 100);
        assert_eq!(s.next_order(), None, "no quotes yet");
        assert!(s.on_bbo(
            &sym("B").0,
            Quote {
                bid: 990_000,
                ask: 1_010_000
            }
        ));
        assert!(!s.on_bbo(&sym("ZZ").0, Quote { bid: 1, ask: 2 }));
        let o = s.next_order().unwrap();
        assert_eq!(
            (o.symbol, o.side, o.price, o.qty),
            (sym("B"), Side::Buy, 990_000, 100)
        );
        let o = s.next_order().unwrap();
        assert_eq!(
            (o.symbol, o.side, o.price),
            (sym("B"), Side::Sell, 1_010_000)
        );
        s.on_bbo(&sym("A").0, Quote { bid: 500, ask: 0 });
        // A's buy is due (bid 500); then B; then A's sell has no ask, so B again.
        let seq: Vec<_> = (0..4)
            .map(|_| s.next_order().map(|o| (o.symbol, o.side)))
            .collect();
        assert_eq!(
            seq,
            [
                Some((sym("A"), Side::Buy)),
                Some((sym("B"), Side::Buy)),
                Some((sym("B"), Side::Sell)),
                Some((sym("B"), Side::Buy)),
            ]
        );
        // B halts: only A trades (its sell has no ask: nothing) until B trades again.
        assert!(s.on_status(&sym("B").0, b'H'));
        s.on_bbo(&sym("A").0, Quote { bid: 500, ask: 600 });
        let seq: Vec<_> = (0..3)
            .map(|_| s.next_order().map(|o| (o.symbol, o.side)))
            .collect();
        assert_eq!(
            seq,
            [
                Some((sym("A"), Side::Sell)),
                Some((sym("A"), Side::Buy)),
                Some((sym("A"), Side::Sell)),
            ]
        );
        assert!(s.on_status(&sym("B").0, b'T'));
        assert!(!s.on_status(&sym("ZZ").0, b'H'));
        assert_eq!(s.next_order().map(|o| o.symbol), Some(sym("B")));
        s.clear_quotes();
        assert_eq!(s.next_order(), None);
    }

    #[test]
    fn order_times_measure_each_order_once() {
        let mut t = OrderTimes::new(10, 2);
        assert!(t.is_full(9) && t.is_full(12) && !t.is_full(11));
        t.set(10, 1000);
        assert_eq!(t.take(10), Some(1000));
        assert_eq!(t.take(10), None, "a second answer is not measured again");
        assert_eq!(t.take(11), None, "never sent");
        assert_eq!(t.take(99), None);
    }
}
