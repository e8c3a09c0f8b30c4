//! Fan-in without I/O: how a receiver of many rings finds the ones with
//! new frames without polling them all.
//!
//! The receiver owns one *activity summary*: one byte per connection slot,
//! eight slots to a word. After each flush a sender marks its slot with one
//! more RDMA WRITE on the same queue pair (one inline byte, after the
//! frames' WRITEs). [`Scanner::scan`] peeks at the summary words (plain
//! loads, a few cache lines for hundreds of slots), and for each word with
//! a mark atomically takes it (swap with zero) and hands the marked slots
//! to the caller, which polls those rings only.
//!
//! # Why no frame is missed (ORDERING)
//!
//! - RC executes a queue pair's WRITEs in order and places them in PSN
//!   order: every byte of a flush's frames is placed before the mark that
//!   follows them (the same placement argument as the ring's own, see
//!   [`crate::ring`]).
//! - The receiver *clears a mark before it polls the ring*: the swap reads
//!   the mark with `Acquire`, so every frame placed before that mark is
//!   visible to the ring poll that follows. A frame placed after the swap
//!   is followed by its own mark, which lands after the swap in the
//!   word's modification order and so stays set for the next scan.
//!   Clearing after the poll instead could erase the mark of a frame that
//!   arrived between the poll and the clear: that frame would wait for the
//!   next one (or the sweep).
//! - A poll that stopped at its frame limit may have left frames behind
//!   with no mark to bring the receiver back: the caller says so
//!   ([`Visit::Again`]) and the slot is revisited on the next scan without
//!   a mark.
//!
//! A mark is a hint, never data: any value, at any time, in its own byte
//! only (each connection's memory region covers its own byte of the
//! summary and nothing else). A peer writing junk into its byte costs one
//! poll of its own ring that finds nothing, counted as
//! [`ScanStats::wasted`] by the caller; it cannot reach another slot's
//! byte, the ring, or the receiver's memory beyond.

use super::sync::{AtomicU64, Ordering};
use std::sync::Arc;

/// Memory holding an activity summary: words of eight one-byte slots
/// (slot `s` is byte `s % 8`, little-endian, of word `s / 8`), written by
/// peers' NICs.
pub trait ActivityMemory {
    /// Words in the summary.
    fn words(&self) -> usize;
    /// Word `w`, `Relaxed`: a cheap look, only to decide whether to take it.
    fn peek(&self, w: usize) -> u64;
    /// Word `w`, swapped with zero, `Acquire`: pairs with the device
    /// placing the mark after the frames of the same queue pair, so those
    /// frames are visible to the ring loads that follow.
    fn take(&self, w: usize) -> u64;
}

/// What the caller did with a marked slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// Polled; nothing known to be left.
    Done,
    /// Polled up to its limit: frames may be left, look again next scan.
    Again,
}

/// Counters of a [`Scanner`] (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScanStats {
    /// Scans of the summary.
    pub scans: u64,
    /// Slots found marked (or left pending) and handed to the caller.
    pub visits: u64,
    /// Visits that found no frame (a mark for frames an earlier visit
    /// already delivered, or junk a peer wrote into its own slot); counted
    /// by the caller through [`Scanner::count_wasted`].
    pub wasted: u64,
}

/// The receiver's side of the summary: which slots to poll this turn.
#[derive(Debug, Clone)]
pub struct Scanner {
    /// Slots revisited without a mark (their last poll hit its limit),
    /// one bit per slot.
    again: Vec<u64>,
    /// Whether any bit of `again` is set.
    any_again: bool,
    slots: usize,
    stats: ScanStats,
}

impl Scanner {
    /// A scanner of `slots` slots.
    pub fn new(slots: usize) -> Self {
        Self {
            again: vec![0; slots.div_ceil(64)],
            any_again: false,
            slots,
            stats: ScanStats::default(),
        }
    }

    /// Slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Counters.
    pub fn stats(&self) -> ScanStats {
        self.stats
    }

    /// Counts a visit that found nothing.
    pub fn count_wasted(&mut self) {
        self.stats.wasted += 1;
    }

    /// Forgets the pending revisit of `slot` (its connection left).
    pub fn forget(&mut self, slot: usize) {
        if let Some(w) = self.again.get_mut(slot / 64) {
            *w &= !(1 << (slot % 64));
        }
    }

    /// Visits `slot` on the next scan, marked or not.
    pub fn revisit(&mut self, slot: usize) {
        if slot < self.slots {
            self.again[slot / 64] |= 1 << (slot % 64);
            self.any_again = true;
        }
    }

    /// Hands `visit` every slot marked in `mem` (each mark cleared before
    /// its slot is handed over: see the module's ORDERING) and every slot
    /// left pending by the last scan, each once, in slot order per word.
    /// Slots beyond [`slots`](Self::slots) are ignored. Returns how many
    /// slots were visited.
    #[inline]
    pub fn scan<M: ActivityMemory, F: FnMut(usize) -> Visit>(
        &mut self,
        mem: &M,
        mut visit: F,
    ) -> usize {
        self.stats.scans += 1;
        let mut n = 0;
        let words = mem.words().min(self.slots.div_ceil(8));
        let had_again = std::mem::take(&mut self.any_again);
        for w in 0..words {
            let mut bits = slot_bits(if mem.peek(w) != 0 { mem.take(w) } else { 0 });
            if had_again {
                // 8 slots of word w are bits 8*(w%8).. of again[w/8].
                let a = (self.again[w / 8] >> (8 * (w % 8))) & 0xFF;
                self.again[w / 8] &= !(0xFF << (8 * (w % 8)));
                bits |= a as u8;
            }
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let slot = w * 8 + b;
                if slot >= self.slots {
                    break;
                }
                n += 1;
                if visit(slot) == Visit::Again {
                    self.again[slot / 64] |= 1 << (slot % 64);
                    self.any_again = true;
                }
            }
        }
        self.stats.visits += n as u64;
        n
    }
}

/// One bit per nonzero byte of `v` (bit `i` for byte `i`).
#[inline]
fn slot_bits(v: u64) -> u8 {
    if v == 0 {
        return 0;
    }
    // Each byte's bits folded into its lowest bit, then the eight low bits
    // gathered into one byte.
    let mut x = v | (v >> 4);
    x |= x >> 2;
    x |= x >> 1;
    x &= 0x0101_0101_0101_0101;
    (x.wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// An activity summary in plain memory, for host tests and simulators:
/// [`mark`](Self::mark) is what a sender's mark WRITE does.
#[derive(Debug, Clone)]
pub struct LoopbackActivity {
    words: Arc<[AtomicU64]>,
}

impl LoopbackActivity {
    /// A zeroed summary of `slots` slots.
    pub fn new(slots: usize) -> Self {
        Self {
            words: (0..slots.div_ceil(8)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Stores `v` into byte `slot` (a one-byte RDMA WRITE; other bytes of
    /// the word are left as they are, as a device's byte store leaves
    /// them).
    pub fn mark_with(&self, slot: usize, v: u8) {
        let w = &self.words[slot / 8];
        let shift = 8 * (slot % 8);
        // ORDERING: Relaxed load: only the starting guess of the loop.
        let mut old = w.load(Ordering::Relaxed);
        loop {
            let new = (old & !(0xFF << shift)) | ((v as u64) << shift);
            // ORDERING: Release, pairs with the Acquire swap in take(): the
            // frames this sender placed before are visible to whoever
            // takes the mark. A compare-exchange so concurrent markers of
            // other bytes of the word are not undone (a byte store does not
            // touch them either).
            match w.compare_exchange(old, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => old = now,
            }
        }
    }

    /// Marks `slot` with 1, as a sender does after a flush.
    pub fn mark(&self, slot: usize) {
        self.mark_with(slot, 1);
    }
}

impl ActivityMemory for LoopbackActivity {
    fn words(&self) -> usize {
        self.words.len()
    }
    fn peek(&self, w: usize) -> u64 {
        // ORDERING: Relaxed: a look only; take() does the Acquire.
        self.words[w].load(Ordering::Relaxed)
    }
    fn take(&self, w: usize) -> u64 {
        // ORDERING: Acquire, pairs with the Release in mark_with().
        self.words[w].swap(0, Ordering::Acquire)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::ring::proto::{Receiver, Sender};
    use crate::ring::LoopbackMemory;

    #[test]
    fn slot_bits_gathers_nonzero_bytes() {
        assert_eq!(slot_bits(0), 0);
        assert_eq!(slot_bits(1), 1);
        assert_eq!(slot_bits(0x80), 1);
        assert_eq!(slot_bits(0x0100), 2);
        assert_eq!(slot_bits(0xFF00_0000_0000_0000), 0x80);
        assert_eq!(slot_bits(u64::MAX), 0xFF);
        assert_eq!(slot_bits(0x0001_0000_2000_0004), 0b0100_1001);
    }

    #[test]
    fn marks_are_cleared_and_visited_once_and_again_is_revisited() {
        let mem = LoopbackActivity::new(20);
        let mut s = Scanner::new(20);
        mem.mark(3);
        mem.mark_with(17, 0xA5);
        let mut seen = vec![];
        assert_eq!(
            s.scan(&mem, |slot| {
                seen.push(slot);
                if slot == 17 {
                    Visit::Again
                } else {
                    Visit::Done
                }
            }),
            2
        );
        assert_eq!(seen, [3, 17]);
        seen.clear();
        // No mark: only the pending slot comes back, once.
        s.scan(&mem, |slot| {
            seen.push(slot);
            Visit::Done
        });
        assert_eq!(seen, [17]);
        seen.clear();
        s.scan(&mem, |slot| {
            seen.push(slot);
            Visit::Done
        });
        assert!(seen.is_empty());
        // A forgotten slot is not revisited.
        mem.mark(5);
        s.scan(&mem, |_| Visit::Again);
        s.forget(5);
        assert_eq!(s.scan(&mem, |_| Visit::Done), 0);
        assert_eq!(s.stats().scans, 5);
    }

    #[test]
    fn junk_beyond_the_slots_is_ignored() {
        // 20 slots: word 2 holds slots 16..24, of which 20..24 do not exist.
        let mem = LoopbackActivity::new(24);
        let mut s = Scanner::new(20);
        for slot in 16..24 {
            mem.mark_with(slot, 0xFF);
        }
        let mut seen = vec![];
        s.scan(&mem, |slot| {
            seen.push(slot);
            Visit::Done
        });
        assert_eq!(seen, [16, 17, 18, 19]);
    }

    /// Several senders, each its own ring, one receiver polling only the
    /// rings the summary marks (clearing before polling) and stopping at a
    /// small frame limit: every frame arrives exactly once, in order per
    /// sender, while idle slots are never polled.
    #[test]
    fn senders_racing_one_receiver_lose_nothing() {
        const SENDERS: usize = 4;
        const SLOTS: usize = 64;
        const SIZE: usize = 4096;
        const FRAMES: u64 = 5_000;
        let summary = LoopbackActivity::new(SLOTS);
        // Active senders on scattered slots; every other slot idle.
        let slots = [1usize, 9, 30, 63];
        let rings: Vec<_> = (0..SENDERS).map(|_| LoopbackMemory::new(SIZE)).collect();
        let backs: Vec<_> = (0..SENDERS).map(|_| LoopbackMemory::new(16)).collect();
        let mut threads = vec![];
        for i in 0..SENDERS {
            let (ring, back, summary) = (rings[i].clone(), backs[i].clone(), summary.clone());
            let slot = slots[i];
            threads.push(std::thread::spawn(move || {
                let mut tx = Sender::new(vec![0u8; SIZE].into_boxed_slice(), 64);
                let mut sent = 0u64;
                while sent < FRAMES {
                    let batch = 1 + (sent % 5);
                    let mut k = 0;
                    while k < batch && sent < FRAMES {
                        match tx.offer(1, 2, &sent.to_le_bytes(), &back) {
                            Ok(_) => {
                                sent += 1;
                                k += 1;
                            }
                            Err(_) => break,
                        }
                    }
                    let (ranges, n) = tx.take_flush();
                    for &(off, len) in &ranges[..n] {
                        ring.write(
                            off,
                            crate::ring::proto::StagingMemory::bytes(tx.staging(), off, len),
                        );
                    }
                    if n > 0 {
                        summary.mark(slot);
                    }
                    std::thread::yield_now();
                }
            }));
        }
        let mut rx: Vec<_> = (0..SENDERS)
            .map(|_| Receiver::new(SIZE, 64, SIZE / 4))
            .collect();
        let mut next = [0u64; SENDERS];
        let mut s = Scanner::new(SLOTS);
        let mut buf = [0u8; 64];
        let mut polls_of_idle = 0u64;
        let t = std::time::Instant::now();
        while next.iter().any(|&n| n < FRAMES) {
            assert!(t.elapsed().as_secs() < 60, "stuck at {next:?}");
            s.scan(&summary, |slot| {
                let Some(i) = slots.iter().position(|&x| x == slot) else {
                    polls_of_idle += 1;
                    return Visit::Done;
                };
                let mut got = 0;
                while got < 3 {
                    match rx[i].poll(&rings[i], &mut buf).expect("valid frames") {
                        Some(f) => {
                            assert_eq!(f.len, 8);
                            let v = u64::from_le_bytes(buf[..8].try_into().unwrap());
                            assert_eq!(v, next[i], "sender {i} in order, once");
                            next[i] += 1;
                            got += 1;
                        }
                        None => break,
                    }
                }
                if let Some(c) = rx[i].take_credit(got) {
                    backs[i].write(
                        crate::ring::proto::RingMemory::data_len(&backs[i])
                            + crate::ring::proto::CREDIT_OFF,
                        &crate::ring::proto::control_word(c),
                    );
                }
                if got == 3 {
                    Visit::Again
                } else {
                    Visit::Done
                }
            });
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(polls_of_idle, 0, "idle slots are never visited");
        assert!(s.stats().visits > 0);
    }
}
