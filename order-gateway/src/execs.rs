//! Executions the gateway has applied, by order and ExecID (tag 17).
//!
//! A venue may send an execution report twice: resent with PossDupFlag (43=Y) under its old
//! MsgSeqNum, with PossResend (97=Y) under a new one, or simply repeated. Each must change
//! positions once, so every report's ExecID is remembered and a second report with it is
//! ignored. A trade cancel or correct (ExecType H/G) names the execution it changes in
//! ExecRefID (tag 19); the quantity and price kept here say what to take back.
//!
//! Bounded: the newest [`EXEC_HISTORY`] ExecIDs are kept, the oldest forgotten first, with no
//! allocation once full. Nothing here is persisted: the journal's FIX_IN records replay
//! every report through the same path after a restart, which rebuilds it.
//!
//! Keys hold the first 24 bytes of the ExecID, its length and a SipHash of the whole, so an
//! ExecID of up to 24 bytes is compared exactly and a longer one by its hash as well.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

/// ExecIDs remembered (about 6 MiB).
pub const EXEC_HISTORY: usize = 1 << 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    order: u64,
    len: u16,
    head: [u8; 24],
    hash: u64,
}

impl Key {
    fn new(order: u64, exec_id: &[u8]) -> Key {
        let mut head = [0u8; 24];
        let n = exec_id.len().min(head.len());
        head[..n].copy_from_slice(&exec_id[..n]);
        // Fixed keys: the same ExecID hashes the same after a restart.
        let mut h = std::hash::DefaultHasher::new();
        exec_id.hash(&mut h);
        Key {
            order,
            len: exec_id.len().min(usize::from(u16::MAX)) as u16,
            head,
            hash: h.finish(),
        }
    }
}

/// Quantity and price of an execution (0, 0 for a report that executed nothing, or an
/// execution since canceled).
pub type Trade = (u32, i64);

/// The ExecIDs applied, newest [`EXEC_HISTORY`] (or the capacity given).
#[derive(Debug)]
pub struct ExecLog {
    map: FxHashMap<Key, Trade>,
    age: VecDeque<Key>,
    cap: usize,
}

impl Default for ExecLog {
    fn default() -> ExecLog {
        ExecLog::with_capacity(EXEC_HISTORY)
    }
}

impl ExecLog {
    /// Keeps the newest `cap` ExecIDs.
    pub fn with_capacity(cap: usize) -> ExecLog {
        let cap = cap.max(1);
        ExecLog {
            map: FxHashMap::with_capacity_and_hasher(cap, Default::default()),
            age: VecDeque::with_capacity(cap),
            cap,
        }
    }

    /// Remembers `exec_id` of `order` with what it executed; false if it was already there
    /// (a duplicate: apply nothing).
    pub fn insert(&mut self, order: u64, exec_id: &[u8], trade: Trade) -> bool {
        let k = Key::new(order, exec_id);
        if self.map.contains_key(&k) {
            return false;
        }
        if self.age.len() == self.cap {
            if let Some(old) = self.age.pop_front() {
                self.map.remove(&old);
            }
        }
        self.map.insert(k, trade);
        self.age.push_back(k);
        true
    }

    /// What execution `exec_id` of `order` executed, if remembered.
    pub fn trade(&self, order: u64, exec_id: &[u8]) -> Option<Trade> {
        self.map.get(&Key::new(order, exec_id)).copied()
    }

    /// Changes what a remembered execution stands for (after a trade cancel or correct).
    pub fn set_trade(&mut self, order: u64, exec_id: &[u8], trade: Trade) {
        if let Some(t) = self.map.get_mut(&Key::new(order, exec_id)) {
            *t = trade;
        }
    }

    /// Every entry, oldest first, for a checkpoint: the entries of orders the checkpoint
    /// leaves out included (never looked up again, as no order has their id), so a restart
    /// forgets the same entries first as the live log does.
    pub fn checkpoint_state(&self) -> Vec<crate::checkpoint::ExecState> {
        self.age
            .iter()
            .filter_map(|k| {
                let trade = *self.map.get(k)?;
                Some(crate::checkpoint::ExecState {
                    order: k.order,
                    len: k.len,
                    head: k.head,
                    hash: k.hash,
                    trade,
                })
            })
            .collect()
    }

    /// Restores entries taken by [`checkpoint_state`](Self::checkpoint_state).
    pub fn restore_state(&mut self, entries: &[crate::checkpoint::ExecState]) {
        self.map.clear();
        self.age.clear();
        for e in entries.iter().rev().take(self.cap).rev() {
            let k = Key {
                order: e.order,
                len: e.len,
                head: e.head,
                hash: e.hash,
            };
            if self.map.insert(k, e.trade).is_none() {
                self.age.push_back(k);
            }
        }
    }

    /// ExecIDs held.
    pub fn len(&self) -> usize {
        self.age.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.age.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicates_are_refused_and_the_oldest_forgotten() {
        let mut l = ExecLog::with_capacity(2);
        assert!(l.insert(1, b"A", (10, 5)));
        assert!(!l.insert(1, b"A", (10, 5)));
        assert!(l.insert(2, b"A", (0, 0)), "ExecIDs are per order");
        let long = [b'x'; 40];
        let mut other = long;
        other[39] = b'y';
        assert!(l.insert(1, &long, (1, 1)));
        assert_eq!(l.len(), 2);
        assert_eq!(l.trade(1, b"A"), None, "the oldest went first");
        assert!(l.insert(1, &other, (2, 2)), "long ids differ past the head");
        l.set_trade(1, &other, (0, 0));
        assert_eq!(l.trade(1, &other), Some((0, 0)));
    }

    /// A checkpoint holds the whole log (entries of orders it leaves out included), so a
    /// log restored from it forgets the same entries first as the live one: with only some
    /// orders' entries in the checkpoint, the restored log would keep older entries longer
    /// than the live one and a duplicate would be applied on one side only.
    #[test]
    fn a_restored_log_forgets_the_same_entries_as_the_live_one() {
        let mut l = ExecLog::with_capacity(8);
        for (i, order) in [1u64, 2, 1, 3, 2, 4, 1, 5, 6, 2].iter().enumerate() {
            l.insert(*order, format!("E{i}").as_bytes(), (i as u32, 1));
        }
        let all = |l: &ExecLog| -> Vec<_> {
            l.checkpoint_state()
                .iter()
                .map(|e| (e.order, e.len, e.head, e.hash, e.trade))
                .collect()
        };
        let mut r = ExecLog::with_capacity(8);
        r.restore_state(&l.checkpoint_state());
        assert_eq!(all(&r), all(&l));
        for i in 0..5 {
            let id = format!("N{i}");
            assert_eq!(
                l.insert(9, id.as_bytes(), (0, 0)),
                r.insert(9, id.as_bytes(), (0, 0))
            );
            for (j, order) in [1u64, 2, 1, 3, 2, 4, 1, 5, 6, 2].iter().enumerate() {
                let e = format!("E{j}");
                assert_eq!(l.trade(*order, e.as_bytes()), r.trade(*order, e.as_bytes()));
            }
        }
        assert_eq!(all(&r), all(&l));
    }
}
