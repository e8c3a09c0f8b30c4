//! Throttles: the sliding-window request counters ([`SlidingWindow`]) and the
//! repeated-order check ([`Identical`]). Both count at the `now` they are given, so replaying
//! the journal's decision times rebuilds them.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use super::OrderParams;
use crate::proto::{Side, Symbol};

/// The engine requests the throttles count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestKind {
    /// A new order.
    New = 0,
    /// An engine's cancel of one order.
    Cancel = 1,
    /// A replace.
    Replace = 2,
}

/// Slots of a [`SlidingWindow`].
pub(super) const WINDOW_SLOTS: usize = 64;

/// A sliding-window request counter with fixed memory: the interval is cut into slots of
/// `interval / 63` (rounded up) and the last 64 slots are counted, so a request counts for at
/// least the whole interval and at most 64/63 of it. It never lets more than the limit
/// through in any interval, wherever the interval starts (a fixed window lets twice the
/// limit through across its boundary), and costs the same whatever the limit. Checking is
/// O(1) (at most 64 slots are cleared when time jumps ahead), with no allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlidingWindow {
    pub(super) slots: [u32; WINDOW_SLOTS],
    /// Slot number (`now / slot_ns`) of the newest slot.
    pub(super) head: u64,
    /// Sum of `slots`.
    pub(super) total: u64,
}

impl Default for SlidingWindow {
    fn default() -> Self {
        SlidingWindow {
            slots: [0; WINDOW_SLOTS],
            head: 0,
            total: 0,
        }
    }
}

impl SlidingWindow {
    /// The slot length for an interval of `interval_ns` (> 0).
    pub fn slot_ns(interval_ns: u64) -> u64 {
        interval_ns.div_ceil(WINDOW_SLOTS as u64 - 1).max(1)
    }

    /// Moves the window to slot `slot`, forgetting the slots that left it. A clock that
    /// steps back keeps counting into the newest slot (the strict side).
    pub(super) fn advance(&mut self, slot: u64) {
        if slot <= self.head {
            return;
        }
        let steps = (slot - self.head).min(WINDOW_SLOTS as u64);
        for i in 1..=steps {
            let s = &mut self.slots[((self.head + i) % WINDOW_SLOTS as u64) as usize];
            self.total -= u64::from(*s);
            *s = 0;
        }
        self.head = slot;
    }

    /// Requests counted in the window ending at slot `slot`.
    pub fn count(&mut self, slot: u64) -> u64 {
        self.advance(slot);
        self.total
    }

    /// [`count`](Self::count) without moving the window (for status and tests).
    pub fn peek(&self, slot: u64) -> u64 {
        if slot <= self.head {
            return self.total;
        }
        let steps = slot - self.head;
        if steps >= WINDOW_SLOTS as u64 {
            return 0;
        }
        let leaving: u64 = (1..=steps)
            .map(|i| u64::from(self.slots[((self.head + i) % WINDOW_SLOTS as u64) as usize]))
            .sum();
        self.total - leaving
    }

    /// Counts one request at slot `slot`.
    pub fn add(&mut self, slot: u64) {
        self.advance(slot);
        let s = &mut self.slots[(self.head % WINDOW_SLOTS as u64) as usize];
        *s = s.saturating_add(1);
        self.total += 1;
    }
}

/// The terms the repeated-order check compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Terms {
    pub(super) account: u32,
    pub(super) symbol: Symbol,
    pub(super) side: Side,
    pub(super) qty: u32,
    pub(super) price: i64,
}

impl From<&OrderParams> for Terms {
    fn from(o: &OrderParams) -> Terms {
        Terms {
            account: o.account,
            symbol: o.symbol,
            side: o.side,
            qty: o.qty,
            price: o.price,
        }
    }
}

/// New orders remembered by the repeated-order check; past this many within its window the
/// oldest is forgotten early (counted in [`RiskEngine::identical_evictions`](super::RiskEngine::identical_evictions)).
pub const IDENTICAL_ORDERS_TRACKED: usize = 1 << 16;

/// The repeated-order check: the accepted new orders of the last window, oldest first, and
/// how many of each terms are among them. Exact (timestamps, not slots); O(1) amortized per
/// order (each entry is removed once); memory bounded by [`IDENTICAL_ORDERS_TRACKED`].
/// A check expires what left the window at its `now`, which the journal replays exactly
/// as long as the clock does not step back (after a step back, replay may remember orders
/// live had forgotten: the strict side).
#[derive(Debug, Default)]
pub(super) struct Identical {
    pub(super) max: u32,
    pub(super) window_ns: u64,
    pub(super) recent: VecDeque<(Terms, u64)>,
    pub(super) counts: FxHashMap<Terms, u32>,
    pub(super) evicted: u64,
}

impl Identical {
    pub(super) fn forget_oldest(&mut self) {
        if let Some((t, _)) = self.recent.pop_front() {
            if let Some(c) = self.counts.get_mut(&t) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&t);
                }
            }
        }
    }

    pub(super) fn expire(&mut self, now: u64) {
        while let Some(&(_, at)) = self.recent.front() {
            if now.saturating_sub(at) < self.window_ns {
                break;
            }
            self.forget_oldest();
        }
    }

    pub(super) fn count(&mut self, t: &Terms, now: u64) -> u32 {
        self.expire(now);
        self.counts.get(t).copied().unwrap_or(0)
    }

    /// [`count`](Self::count) without expiring anything.
    pub(super) fn peek(&self, t: &Terms, now: u64) -> u32 {
        let expired = self
            .recent
            .iter()
            .take_while(|(_, at)| now.saturating_sub(*at) >= self.window_ns)
            .filter(|(x, _)| x == t)
            .count() as u32;
        self.counts.get(t).copied().unwrap_or(0) - expired
    }

    pub(super) fn add(&mut self, t: Terms, now: u64) {
        if self.max == 0 {
            return;
        }
        self.expire(now);
        if self.recent.len() >= IDENTICAL_ORDERS_TRACKED {
            self.forget_oldest();
            self.evicted += 1;
        }
        self.recent.push_back((t, now));
        *self.counts.entry(t).or_insert(0) += 1;
    }
}
