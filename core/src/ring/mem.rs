//! The ring's registered memory and the only unsafe code above the verbs
//! layer: [`RingMemory`] over the region a peer's NIC writes (word loads
//! only; the protocol in `ring::proto` decides what to load and in what
//! order) and [`StagingMemory`] over the local staging mirror the device
//! reads frames from.
//!
//! Layout of the incoming-ring region (registered REMOTE_WRITE, nothing
//! else, and the only memory of ours a peer can touch):
//!
//! | offset | bytes | written by | meaning |
//! |---|---|---|---|
//! | 0 | N | peer's sender (RDMA WRITE) | frame data |
//! | N | 16 | peer's receiver (RDMA WRITE) | credit: how far the peer consumed *our* frames, and its complement |
//! | N+32 | 32 | peer (one inline RDMA WRITE, once) | the initiator's handshake proof `Ti`, then [`PROOF_SEAL`] |
//!
//! The credit word sits on its own cache line, away from the frames.
//!
//! It travels with its bitwise complement in one 16-byte WRITE, and a value
//! is taken only when the two halves agree. Real NICs
//! place an aligned 8-byte word with one DMA store, but neither the
//! specification nor soft-RoCE promise it: rxe copies with the kernel's
//! `memcpy`, which may move one byte at a time (and under emulation the
//! copying thread can be preempted mid-word for milliseconds, which the
//! ring torture test caught). A torn read shows mismatched halves when the
//! bytes are placed in ascending order, as every memcpy does, and is
//! simply read again.
#![allow(unsafe_code)]

use super::fanin::ActivityMemory;
use super::frame::{CONTROL_LEN, HEADER_LEN, PROOF_OFF, PROOF_SEAL, TRAILER_LEN};
use super::proto::{RingMemory, StagingMemory};
use crate::auth::{Tag, TAG_LEN};
use crate::verbs::{
    Access, MemoryRegion, PreparedWrite, ProtectionDomain, QueuePair, SendWr, SharedMemory,
    VerbsError, WriteFlags,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The incoming ring: data plus control words, written by the peer.
#[derive(Debug)]
pub struct IncomingRing {
    mr: MemoryRegion,
    size: usize,
}

impl IncomingRing {
    /// Registers a ring of `size` data bytes (power of two) with remote
    /// write access only.
    pub fn new(pd: &Arc<ProtectionDomain>, size: usize) -> Result<Self, VerbsError> {
        assert!(size.is_power_of_two() && size >= 16);
        let mr = MemoryRegion::new(pd, size + CONTROL_LEN, Access::REMOTE_WRITE)?;
        Ok(Self { mr, size })
    }
    /// The region (address and rkey for the peer). Shared access only:
    /// nothing can write it through this.
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        self.word_at(self.size + off)
    }

    /// The aligned 8-byte word at byte offset `at` of the region.
    fn word_at(&self, at: usize) -> &AtomicU64 {
        assert!(at % 8 == 0 && at + 8 <= self.size + CONTROL_LEN);
        // SAFETY: in bounds (asserted) of the mapping, which lives as long as
        // self.mr; 8-byte aligned (the mapping is page-aligned, `at` is a
        // multiple of 8). AtomicU64 has the layout of u64, and every bit
        // pattern is a valid u64. The device writes these bytes by DMA,
        // outside the Rust memory model; we only ever load them.
        unsafe { &*(self.mr.as_ptr().add(at) as *const AtomicU64) }
    }

    /// The initiator's handshake proof, once its WRITE has been placed
    /// (`None` before). Read like a frame: the seal word with Acquire, then
    /// the tag before it (the 32 bytes travel in one inline WRITE, placed in
    /// ascending order). The bytes are the peer's: the caller verifies them.
    pub fn load_proof(&self) -> Option<Tag> {
        // ORDERING: Acquire, pairs with the device placing the tag's bytes
        // before the seal after them; the tag loads follow.
        if self.word(PROOF_OFF + TAG_LEN).load(Ordering::Acquire) != PROOF_SEAL {
            return None;
        }
        let mut t = [0u8; TAG_LEN];
        for (i, c) in t.chunks_exact_mut(8).enumerate() {
            // ORDERING: Relaxed: ordered after the Acquire above.
            c.copy_from_slice(
                &self
                    .word(PROOF_OFF + 8 * i)
                    .load(Ordering::Relaxed)
                    .to_le_bytes(),
            );
        }
        Some(t)
    }
}

impl RingMemory for IncomingRing {
    #[inline]
    fn data_len(&self) -> usize {
        self.size
    }
    #[inline]
    fn load_acquire(&self, at: usize) -> u64 {
        // ORDERING: Acquire, as the trait documents: pairs with the
        // device placing the peer's WRITE in ascending address order.
        self.word_at(at).load(Ordering::Acquire)
    }
    #[inline]
    fn load_header(&self, off: usize) -> u64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.size);
        // The offset masked into the data and down to a word (`size` is a
        // power of two of at least 16, asserted in `new`): the mask stands
        // in for the bounds check, and an offset the receiver keeps (always
        // in the data, 16-aligned) is unchanged by it.
        let at = off & (self.size - 8);
        let base = self.mr.as_ptr() as *const AtomicU64;
        // SAFETY: `at` is a multiple of 8 at most `size - 8`, so the word
        // lies in the data, inside the mapping that lives as long as
        // self.mr; 8-byte aligned (page-aligned mapping); any bit pattern
        // is a valid u64; only loaded (the device writes it by DMA).
        let w = unsafe { &*base.add(at / 8) };
        // ORDERING: Relaxed, as the trait documents: the value counts only
        // once the seal that covers it is seen with Acquire.
        w.load(Ordering::Relaxed)
    }
    #[inline]
    fn load_relaxed(&self, at: usize) -> u64 {
        // ORDERING: Relaxed: callers load after an Acquire that saw the
        // bytes complete (see the trait).
        self.word_at(at).load(Ordering::Relaxed)
    }
    #[inline]
    fn copy_relaxed(&self, at: usize, dst: &mut [u8]) {
        assert!(
            at % 8 == 0
                && dst.len() % 8 == 0
                && at
                    .checked_add(dst.len())
                    .is_some_and(|e| e <= self.size + CONTROL_LEN)
        );
        self.copy_words(at, dst);
    }
    #[inline]
    fn take_sealed(&self, off: usize, total: usize, seal: u64, dst: &mut [u8]) -> bool {
        // One check for the seal and every payload word: the frame lies in
        // the data, and the payload words end at or before the seal.
        assert!(
            (off | total | dst.len()) % 8 == 0
                && off < self.size
                && total <= self.size - off
                && total >= HEADER_LEN + TRAILER_LEN + dst.len()
        );
        let base = self.mr.as_ptr() as *const AtomicU64;
        // SAFETY: as `word_at`: the seal's word, at `off + total - 8` (a
        // multiple of 8, as `off` and `total` are; `total` is at least 16),
        // ends at `off + total`, within the data (checked above) and so the
        // mapping that lives as long as self.mr; any bit pattern valid;
        // only loaded.
        let seal_word = unsafe { &*base.add((off + total) / 8 - 1) };
        // ORDERING: Acquire, pairs with the device placing the frame's bytes
        // in ascending address order: the payload loads come after it.
        if seal_word.load(Ordering::Acquire) != seal {
            return false;
        }
        // ORDERING: Relaxed loads, after the Acquire above saw the frame
        // complete (see `copy_words`).
        self.copy_words(off + HEADER_LEN, dst);
        true
    }
}

impl IncomingRing {
    /// The words from `at` into `dst`, Relaxed; the caller checked that
    /// `at` is 8-aligned, `dst` a multiple of 8 long and the range inside
    /// the region.
    #[inline(always)]
    fn copy_words(&self, at: usize, dst: &mut [u8]) {
        debug_assert!(at % 8 == 0 && at + dst.len() <= self.size + CONTROL_LEN);
        let base = self.mr.as_ptr() as *const AtomicU64;
        // Word `i` of the range (`i` below `dst.len() / 8`: every caller
        // below counts from 0 to below it).
        let load = |i: usize| {
            // SAFETY: as `word_at`, for every word of the range the caller
            // checked once: in bounds of the mapping that lives as long as
            // self.mr, 8-byte aligned, any bit pattern valid; only loaded.
            let w = unsafe { &*base.add(at / 8 + i) };
            // ORDERING: Relaxed, as `load_relaxed`.
            w.load(Ordering::Relaxed)
        };
        let n = dst.len() / 8;
        let d = dst.as_mut_ptr();
        // Word `i` of `dst` (`i` below `n`: every caller below counts from
        // 0 to below `n`).
        let store = |i: usize, w: u64| {
            debug_assert!(i < n);
            // SAFETY: `i < n`, so bytes `8 * i..8 * i + 8` lie in `dst`, which
            // we borrow mutably; unaligned write (dst has byte alignment).
            unsafe { d.add(8 * i).cast::<u64>().write_unaligned(w) }
        };
        if n < 4 {
            for i in 0..n {
                store(i, load(i));
            }
            return;
        }
        // Four words at `j..j + 4` (`j + 4 <= n`).
        let copy4 = |j: usize| {
            let (w0, w1, w2, w3) = (load(j), load(j + 1), load(j + 2), load(j + 3));
            store(j, w0);
            store(j + 1, w1);
            store(j + 2, w2);
            store(j + 3, w3);
        };
        // Four-word steps, the last one moved back to end at the last word
        // when `n` is not a multiple of four; up to eight words (a 64-byte
        // payload) are the first four and the last four, with no loop. A
        // step that overlaps the one before rereads up to three words: a
        // peer rewriting the frame meanwhile can make the copy
        // inconsistent, as it always could, never undefined.
        let mut j = 0;
        while j + 8 < n {
            copy4(j);
            j += 4;
        }
        copy4(j);
        copy4(n - 4);
    }
}

/// The sender's staging mirror of the remote ring: frames are built here
/// at the offsets they will occupy remotely, so a run of frames is one
/// RDMA WRITE.
#[derive(Debug)]
pub struct Staging {
    mr: MemoryRegion,
    size: usize,
}

impl Staging {
    /// Registers `size` bytes for local reads by the device only.
    pub fn new(pd: &Arc<ProtectionDomain>, size: usize) -> Result<Self, VerbsError> {
        let mr = MemoryRegion::new(pd, size, Access::LOCAL)?;
        Ok(Self { mr, size })
    }
    /// The region (for SGEs).
    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }
}

impl StagingMemory for Staging {
    fn len(&self) -> usize {
        self.size
    }

    /// Mutable bytes of the staging area.
    ///
    /// Sound because the range is claimed space: beyond everything the
    /// device may still read. The device reads a staging range only between
    /// posting its RDMA WRITE and that write executing at the peer; the
    /// range is reclaimed only after the peer returned credit past it,
    /// which it can only do after the write executed (or, for inline
    /// writes, the bytes were copied at post time).
    #[inline]
    fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.size));
        // SAFETY: in bounds; &mut self gives exclusive CPU access; device
        // access is excluded by the credit argument above.
        unsafe { std::slice::from_raw_parts_mut(self.mr.as_ptr().add(off), len) }
    }

    /// Read-only bytes (for inline posts).
    #[inline]
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off.checked_add(len).is_some_and(|e| e <= self.size));
        // SAFETY: in bounds; the device only ever reads staging.
        unsafe { std::slice::from_raw_parts(self.mr.as_ptr().add(off), len) }
    }
}

/// Posts the ring's own work requests: RDMA WRITEs whose local data is
/// either inline or a range of a [`Staging`] area, to the peer's ring.
///
/// Callers in this crate build `wrs` only from [`Staging::mr`] ranges and
/// inline bytes; that is what makes the verbs layer's `post_send` contract
/// hold: a staging range is not rewritten until the peer returned credit
/// past it, which implies the WRITE reading it has executed, and the
/// staging region is owned by the connection that also owns the QP and
/// declares the QP first, so the QP (and with it every outstanding
/// request) is destroyed before the staging region is deregistered.
pub(crate) fn post_ring_writes(qp: &QueuePair, wrs: &mut [SendWr<'_>]) -> Result<(), VerbsError> {
    // SAFETY: see above: every SGE is inline or a staging range that stays
    // registered, allocated and unmodified until its WRITE has executed.
    unsafe { qp.post_send(wrs) }
}

/// The connection's one prepared RDMA WRITE from its [`Staging`] to the
/// same offsets of the peer's ring (and, when the peer granted a fan-in
/// slot, the mark chained after it): built once, patched per flush.
#[derive(Debug)]
pub(crate) struct StagingWrite {
    prepared: PreparedWrite,
    lkey: u32,
    remote_ring: u64,
}

impl StagingWrite {
    /// Writes from `staging` to the peer's ring at `remote_ring` under
    /// `rkey`, each followed by a mark at `mark` (address, rkey) if given.
    pub(crate) fn new(
        staging: &Staging,
        remote_ring: u64,
        rkey: u32,
        mark: Option<(u64, u32)>,
    ) -> Self {
        let lkey = staging.mr.lkey();
        Self {
            prepared: PreparedWrite::new(lkey, rkey, mark),
            lkey,
            remote_ring,
        }
    }

    /// Requests one post puts on the send queue (the write, and the mark).
    #[inline]
    pub(crate) fn requests(&self) -> u64 {
        self.prepared.requests()
    }

    /// Posts the WRITE of staging bytes `off..off + len` to the same
    /// offsets of the peer's ring (one bounds check).
    #[inline]
    pub(crate) fn post(
        &mut self,
        qp: &QueuePair,
        staging: &Staging,
        off: usize,
        len: usize,
        flags: WriteFlags,
        wr_id: u64,
    ) -> Result<(), VerbsError> {
        debug_assert_eq!(staging.mr.lkey(), self.lkey);
        if off.checked_add(len).is_none_or(|e| e > staging.size) || len > u32::MAX as usize {
            return Err(VerbsError::SgeOutOfBounds {
                offset: off,
                len,
                region_len: staging.size,
            });
        }
        // SAFETY: as `post_ring_writes`: the range lies in `staging` (checked
        // above), registered under the lkey the request was built with (a
        // different staging would only fail the request on the device); it
        // is not rewritten until the peer returned credit past it, so after
        // the WRITE executed; and the connection drops its QP before its
        // staging region. The mark is inline.
        unsafe {
            self.prepared.post(
                qp,
                staging.mr.addr() + off as u64,
                len as u32,
                self.remote_ring + off as u64,
                flags,
                wr_id,
            )
        }
    }
}

/// A receiver's activity summary ([`crate::ring::fanin`]): one byte per
/// slot in memory shared by every connection's registration of its own
/// byte ([`register_slot`](Self::register_slot)), so a peer's queue pair
/// can write its slot and nothing else.
#[derive(Debug)]
pub struct ActivityRegion {
    mem: Arc<SharedMemory>,
    slots: usize,
}

impl ActivityRegion {
    /// Maps a zeroed summary of `slots` slots (rounded up to whole words).
    pub fn new(slots: usize) -> Result<Self, VerbsError> {
        Ok(Self {
            mem: SharedMemory::new(slots.div_ceil(8) * 8)?,
            slots,
        })
    }

    /// Slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Registers byte `slot` (below [`slots`](Self::slots)) in `pd` for
    /// remote writes: the region a connection's peer marks.
    pub fn register_slot(
        &self,
        pd: &Arc<ProtectionDomain>,
        slot: usize,
    ) -> Result<MemoryRegion, VerbsError> {
        assert!(slot < self.slots);
        MemoryRegion::register_shared(pd, &self.mem, slot, 1, Access::REMOTE_WRITE)
    }

    /// Clears `slot` (a new connection gets it: a mark an earlier peer's
    /// last WRITE left would only cost one wasted poll, but need not).
    pub fn clear(&self, slot: usize) {
        assert!(slot < self.slots);
        let shift = 8 * (slot % 8);
        // ORDERING: Relaxed: the byte carries no data; a peer's mark racing
        // this is the old peer's (its registration is gone) or the new
        // peer's, which cannot have been sent before this slot was granted.
        let _ = self
            .word(slot / 8)
            .fetch_and(!(0xFF << shift), Ordering::Relaxed);
    }

    fn word(&self, w: usize) -> &AtomicU64 {
        assert!(w * 8 + 8 <= self.mem.len());
        // SAFETY: in bounds (asserted) of the mapping, which lives as long
        // as self.mem; 8-byte aligned (page-aligned mapping, w * 8).
        // AtomicU64 has the layout of u64 and every bit pattern is valid.
        // Peers' devices store single bytes here by DMA, outside the Rust
        // memory model; we only load and swap whole words, which the
        // hardware's coherence orders against those stores (a byte stored
        // after a swap survives it), so no mark is torn or lost.
        unsafe { &*(self.mem.as_ptr().add(w * 8) as *const AtomicU64) }
    }
}

impl ActivityMemory for ActivityRegion {
    #[inline]
    fn words(&self) -> usize {
        self.mem.len() / 8
    }
    #[inline]
    fn peek(&self, w: usize) -> u64 {
        // ORDERING: Relaxed: a look only; take() does the Acquire.
        self.word(w).load(Ordering::Relaxed)
    }
    #[inline]
    fn take(&self, w: usize) -> u64 {
        // ORDERING: Acquire, pairs with the device placing a mark after
        // the frames of the same queue pair (RC order): the ring loads
        // that follow see those frames. See crate::ring::fanin.
        self.word(w).swap(0, Ordering::Acquire)
    }
}
