//! Ring memory without a device, for host tests and simulators: plain
//! shared memory where the "RDMA WRITE" of a range is a copy that places
//! bytes one at a time in ascending address order, as soft-RoCE's
//! `memcpy` may (so a concurrent reader sees words half-written, and only
//! the seal tells it a frame is complete).
//!
//! Safe code throughout: the memory is a slice of atomic words, so a
//! reader racing a writer sees old or new bytes, never undefined
//! behaviour. Under `--cfg loom` the words are loom's atomics, so the
//! model checker explores the orders in which the sender's stores and the
//! receiver's loads can interleave.

use super::frame::CONTROL_LEN;
use super::proto::RingMemory;
use super::sync::{AtomicU64, Ordering};
use std::sync::Arc;

/// A ring region (data, then [`CONTROL_LEN`] bytes of control words) in
/// plain memory, shared by cloning: one clone is "the NIC" writing into it,
/// another the owner polling it.
///
/// Each byte range has one writer at a time, as in the protocol (frames
/// by the peer's sender, the credit word by the peer's receiver): a byte
/// is placed by a load and a store of its word, which a second concurrent
/// writer of the same word could undo.
#[derive(Debug, Clone)]
pub struct LoopbackMemory {
    words: Arc<[AtomicU64]>,
    data_len: usize,
}

impl LoopbackMemory {
    /// Zeroed memory for a ring of `data_len` bytes (a power of two) and its
    /// control words.
    pub fn new(data_len: usize) -> Self {
        assert!(data_len.is_power_of_two() && data_len >= 16);
        let words = (0..(data_len + CONTROL_LEN) / 8)
            .map(|_| AtomicU64::new(0))
            .collect();
        Self { words, data_len }
    }

    /// Total bytes (data and control words).
    pub fn total_len(&self) -> usize {
        self.words.len() * 8
    }

    /// What an RDMA WRITE of `bytes` to offset `at` does: every byte placed
    /// in ascending address order, each a separate store (so words are
    /// torn while it runs). Panics if the range leaves the region (a
    /// device would refuse the WRITE).
    pub fn write(&self, at: usize, bytes: &[u8]) {
        assert!(at
            .checked_add(bytes.len())
            .is_some_and(|e| e <= self.total_len()));
        for (i, &b) in bytes.iter().enumerate() {
            let a = at + i;
            let w = &self.words[a / 8];
            let shift = (a % 8) * 8;
            // ORDERING: Relaxed: this writer is the only one of this word
            // (see the type's doc), so it reads back its own last store.
            let old = w.load(Ordering::Relaxed);
            let new = (old & !(0xFF << shift)) | ((b as u64) << shift);
            // ORDERING: Release, pairs with the reader's Acquire load of a
            // later word (a seal, a control complement): every
            // byte placed before it is visible once it is seen.
            w.store(new, Ordering::Release);
        }
    }

    /// Like [`write`](Self::write) but placing whole aligned words (`at`
    /// and the length multiples of 8), each one store, in ascending order:
    /// how a NIC places an aligned run, and fewer steps for a model
    /// checker to explore.
    pub fn write_words(&self, at: usize, bytes: &[u8]) {
        assert!(at % 8 == 0 && bytes.len() % 8 == 0);
        assert!(at
            .checked_add(bytes.len())
            .is_some_and(|e| e <= self.total_len()));
        for (i, c) in bytes.chunks_exact(8).enumerate() {
            let v = u64::from_le_bytes(c.try_into().expect("8 bytes"));
            // ORDERING: Release, as in write().
            self.words[at / 8 + i].store(v, Ordering::Release);
        }
    }
}

impl RingMemory for LoopbackMemory {
    #[inline]
    fn data_len(&self) -> usize {
        self.data_len
    }
    #[inline]
    fn load_acquire(&self, at: usize) -> u64 {
        assert!(at % 8 == 0);
        // ORDERING: Acquire, pairs with the Release stores of write().
        self.words[at / 8].load(Ordering::Acquire)
    }
    #[inline]
    fn load_relaxed(&self, at: usize) -> u64 {
        assert!(at % 8 == 0);
        // ORDERING: Relaxed: after an Acquire that saw the bytes complete.
        self.words[at / 8].load(Ordering::Relaxed)
    }
}
