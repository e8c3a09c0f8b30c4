//! Executions the gateway has applied, by order and ExecID (tag 17).
//!
//! A venue may send an execution report twice: resent with PossDupFlag (43=Y) under its old
//! MsgSeqNum, with PossResend (97=Y) under a new one, or simply repeated. Each must change
//! positions once, so every report's ExecID is remembered and a second report with it is
//! ignored. A trade cancel or correct (ExecType H/G) names the execution it changes in
//! ExecRefID (tag 19); the quantity and price kept here say what to take back.
//!
//! Bounded: at least the newest [`EXEC_HISTORY`] ExecIDs are kept (at most twice as many), the
//! oldest forgotten first, in two generations: when the newer one holds [`EXEC_HISTORY`],
//! the older is forgotten whole and its table, emptied, takes the newer ones. No entry is
//! ever removed alone, so no table fills with tombstones, and nothing allocates or rehashes
//! once both tables exist (a single table with one removal per insertion rehashes all of
//! itself whenever its tombstones fill it, and grew once to a table twice the size: turns of
//! 4-10 ms in the `gateway-restart` bench). A checkpoint holds the whole log (see
//! [`ExecLog::checkpoint_state`]), so a restart keeps what the live gateway keeps.
//!
//! Keys hold the first 24 bytes of the ExecID, its length and a SipHash of the whole, so an
//! ExecID of up to 24 bytes is compared exactly and a longer one by its hash as well.

use std::hash::{Hash, Hasher};

use rustc_hash::FxHashMap;

/// ExecIDs remembered at least (two generations of this many: about 18 MiB).
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

/// The ExecIDs applied: at least the newest [`EXEC_HISTORY`] (or the capacity given).
#[derive(Debug)]
pub struct ExecLog {
    /// The newer generation, and its keys in the order they came.
    young: Generation,
    /// The older generation, forgotten whole when `young` is full.
    old: Generation,
    /// Entries a generation holds.
    cap: usize,
}

/// One generation of the log: entries never removed alone, only all at once.
#[derive(Debug)]
struct Generation {
    map: FxHashMap<Key, Trade>,
    keys: Vec<Key>,
}

impl Generation {
    fn with_capacity(cap: usize) -> Generation {
        Generation {
            map: FxHashMap::with_capacity_and_hasher(cap, Default::default()),
            keys: Vec::with_capacity(cap),
        }
    }

    fn clear(&mut self) {
        // Keys and trades need no drop: this empties the table's control bytes and keeps
        // its memory.
        self.map.clear();
        self.keys.clear();
    }
}

impl Default for ExecLog {
    fn default() -> ExecLog {
        ExecLog::with_capacity(EXEC_HISTORY)
    }
}

impl ExecLog {
    /// Keeps at least the newest `cap` ExecIDs (at most `2 * cap`).
    pub fn with_capacity(cap: usize) -> ExecLog {
        let cap = cap.max(1);
        ExecLog {
            young: Generation::with_capacity(cap),
            old: Generation::with_capacity(cap),
            cap,
        }
    }

    /// Remembers `exec_id` of `order` with what it executed; false if it was already there
    /// (a duplicate: apply nothing).
    pub fn insert(&mut self, order: u64, exec_id: &[u8], trade: Trade) -> bool {
        self.admit(Key::new(order, exec_id), trade)
    }

    /// Inserts `k` unless held; when the newer generation is full, forgets the older.
    fn admit(&mut self, k: Key, trade: Trade) -> bool {
        if self.young.map.contains_key(&k) || self.old.map.contains_key(&k) {
            return false;
        }
        self.young.map.insert(k, trade);
        self.young.keys.push(k);
        if self.young.keys.len() >= self.cap {
            std::mem::swap(&mut self.young, &mut self.old);
            self.young.clear();
        }
        true
    }

    /// What execution `exec_id` of `order` executed, if remembered.
    pub fn trade(&self, order: u64, exec_id: &[u8]) -> Option<Trade> {
        let k = Key::new(order, exec_id);
        self.young
            .map
            .get(&k)
            .or_else(|| self.old.map.get(&k))
            .copied()
    }

    /// Changes what a remembered execution stands for (after a trade cancel or correct).
    pub fn set_trade(&mut self, order: u64, exec_id: &[u8], trade: Trade) {
        let k = Key::new(order, exec_id);
        if let Some(t) = self.young.map.get_mut(&k) {
            *t = trade;
        } else if let Some(t) = self.old.map.get_mut(&k) {
            *t = trade;
        }
    }

    /// Every entry, oldest first, for a checkpoint: the entries of orders the checkpoint
    /// leaves out included (never looked up again, as no order has their id), so a restart
    /// forgets the same entries first as the live log does.
    pub fn checkpoint_state(&self) -> Vec<crate::checkpoint::ExecState> {
        [&self.old, &self.young]
            .into_iter()
            .flat_map(|g| g.keys.iter().map(move |k| (k, g.map.get(k))))
            .filter_map(|(k, trade)| {
                let trade = *trade?;
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

    /// Restores entries taken by [`checkpoint_state`](Self::checkpoint_state): inserted
    /// oldest first by the same rule as live ones, so the generations split where they did.
    pub fn restore_state(&mut self, entries: &[crate::checkpoint::ExecState]) {
        self.young.clear();
        self.old.clear();
        for e in entries {
            let k = Key {
                order: e.order,
                len: e.len,
                head: e.head,
                hash: e.hash,
            };
            self.admit(k, e.trade);
        }
    }

    /// ExecIDs held.
    pub fn len(&self) -> usize {
        self.young.keys.len() + self.old.keys.len()
    }

    /// True when none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
        // The first generation is full: it is the older one now, still remembered.
        assert!(l.insert(1, &long, (1, 1)));
        assert_eq!(l.len(), 3);
        assert_eq!(l.trade(1, b"A"), Some((10, 5)), "at most 2 x 2 are kept");
        l.set_trade(1, b"A", (3, 3));
        assert_eq!(
            l.trade(1, b"A"),
            Some((3, 3)),
            "changed in the older generation"
        );
        assert!(l.insert(1, &other, (2, 2)), "long ids differ past the head");
        assert_eq!(l.len(), 2);
        assert_eq!(l.trade(1, b"A"), None, "the oldest went first");
        assert_eq!(l.trade(2, b"A"), None, "the whole older generation with it");
        assert!(!l.insert(1, &long, (1, 1)), "the newest 2 are still there");
        l.set_trade(1, &other, (0, 0));
        assert_eq!(l.trade(1, &other), Some((0, 0)));
    }

    /// A full log takes new ExecIDs for ever without growing or rehashing its tables: each
    /// generation's table keeps the capacity it was made with and no entry is removed
    /// alone (a removal per insert leaves tombstones that make a table rehash all at once,
    /// and made the single table of before double once).
    #[test]
    fn a_full_log_keeps_its_tables_and_at_least_the_newest_entries() {
        const CAP: usize = 1_000;
        let mut l = ExecLog::with_capacity(CAP);
        let capacities = |l: &ExecLog| {
            let mut c = [l.young.map.capacity(), l.old.map.capacity()];
            c.sort_unstable();
            c
        };
        let made = capacities(&l);
        for i in 0..50_000u64 {
            assert!(l.insert(i, b"X", (1, 1)));
            assert!(l.len() >= CAP.min(i as usize + 1) && l.len() < 2 * CAP);
            assert_eq!(capacities(&l), made, "a table grew at entry {i}");
            let first_kept = (i + 1).saturating_sub(CAP as u64);
            assert!(
                l.trade(first_kept, b"X").is_some(),
                "forgot {first_kept} at {i}"
            );
        }
        assert!(
            !l.insert(49_999, b"X", (1, 1)),
            "a duplicate of the newest is refused"
        );
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
