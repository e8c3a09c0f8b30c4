//! Request numbers below an engine's highest taken one that were never taken.
//!
//! The gateway answers a request numbered at or below the highest number it journaled for
//! that engine as a re-send of one taken before (an order status, never acted on again).
//! Numbers are not always taken in order, though: a request answered "not taken"
//! (`JournalUnavailable`, disk full) may be sent again after later requests were taken. Its
//! number is then below the highest, yet it was never taken; answering it with a status
//! would leave the engine's order pending forever. [`Holes`] remembers, per engine, the
//! numbers skipped when a higher one was taken, so such a request is taken when it comes.
//!
//! Kept from the journal's request records (live and on replay, so a rebuild after a failed
//! append or a restart finds the same holes). Not in checkpoints: after a new segment the
//! holes before it are forgotten and a request sent into one is answered as a re-send, as
//! it was before holes were kept.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

use super::EngineId;

/// Holes kept per engine; the oldest are forgotten past it (a request not taken is sent
/// again soon, or given up).
pub const MAX_HOLES: usize = 1 << 16;

/// Per engine, the request numbers below its highest taken one that were never taken.
#[derive(Debug, Default)]
pub struct Holes {
    by_engine: FxHashMap<EngineId, BTreeSet<u32>>,
}

impl Holes {
    /// Request `seq` of `engine` was taken; `last` is the highest taken before it.
    pub fn taken(&mut self, engine: EngineId, last: u32, seq: u32) {
        if seq <= last {
            if let Some(h) = self.by_engine.get_mut(&engine) {
                h.remove(&seq);
            }
            return;
        }
        if seq - last == 1 {
            return;
        }
        let h = self.by_engine.entry(engine).or_default();
        let skipped = seq - last - 1;
        // Only the newest MAX_HOLES of a long run are kept.
        let from = seq - skipped.min(MAX_HOLES as u32);
        h.extend(from..seq);
        while h.len() > MAX_HOLES {
            h.pop_first();
        }
    }

    /// `engine`'s holes from `from` on, ascending, at most `max` of them; and whether
    /// there were more.
    pub fn from(&self, engine: EngineId, from: u32, max: usize) -> (Vec<u32>, bool) {
        let Some(h) = self.by_engine.get(&engine) else {
            return (Vec::new(), false);
        };
        let mut it = h.range(from..);
        let list: Vec<u32> = it.by_ref().take(max).copied().collect();
        (list, it.next().is_some())
    }

    /// True if request `seq` of `engine` is below its highest taken one and was never taken.
    pub fn contains(&self, engine: EngineId, seq: u32) -> bool {
        self.by_engine
            .get(&engine)
            .is_some_and(|h| h.contains(&seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skipped_numbers_are_holes_until_taken() {
        let mut h = Holes::default();
        h.taken(1, 0, 1);
        h.taken(1, 1, 2);
        assert!(!h.contains(1, 1) && !h.contains(1, 2));
        h.taken(1, 2, 6);
        assert!(h.contains(1, 3) && h.contains(1, 4) && h.contains(1, 5));
        assert!(!h.contains(1, 6) && !h.contains(2, 3));
        h.taken(1, 6, 4);
        assert!(!h.contains(1, 4) && h.contains(1, 3));
        // What a logon lists: from the engine's oldest unsure request, capped.
        h.taken(1, 6, 10);
        assert_eq!(h.from(1, 0, 10), (vec![3, 5, 7, 8, 9], false));
        assert_eq!(h.from(1, 5, 2), (vec![5, 7], true));
        assert_eq!(h.from(1, 9, 2), (vec![9], false));
        assert_eq!(h.from(2, 0, 2), (vec![], false));
    }

    #[test]
    fn a_long_run_keeps_the_newest() {
        let mut h = Holes::default();
        h.taken(1, 0, MAX_HOLES as u32 + 10);
        assert!(!h.contains(1, 9) && h.contains(1, 10) && h.contains(1, MAX_HOLES as u32 + 9));
        h.taken(1, MAX_HOLES as u32 + 10, MAX_HOLES as u32 + 12);
        assert!(!h.contains(1, 10) && h.contains(1, 11));
        assert!(h.contains(1, MAX_HOLES as u32 + 11));
    }
}
