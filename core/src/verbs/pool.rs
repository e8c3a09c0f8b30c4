//! Registered buffer pools bound to one queue pair, so code above the verbs
//! layer posts and receives without `unsafe`.
//!
//! A [`PooledQp`] owns a queue pair, its two completion queues (one per
//! direction, so polling receives never steals a send completion) and two
//! registered regions cut into fixed-size slots:
//!
//! - the **receive ring**: every free slot is posted as a receive; a receive
//!   completion hands the slot's bytes (the 40-byte GRH already stripped on
//!   UD) to a closure as a short-lived borrow, then the slot goes back to the
//!   free list and free slots are re-posted in batches, one doorbell each. The
//!   number of posted receives is tracked so a queue running low is counted.
//! - the **send ring**: data is copied into the next slot and posted (possibly
//!   to several destinations, e.g. lines A and B, from the same slot). Only
//!   every `signal_every`-th slot asks for a completion; since a queue pair's
//!   send queue completes in order, that completion frees every slot up to it.
//!   A slot is therefore written again only after the device is done reading.
//!
//! Why this is sound without `unsafe` in callers: the slots' memory is private
//! to the pool, the queue pair and its CQs are created here (so no one else's
//! completions can appear with our `wr_id`s, and `wr_id`s are still
//! bounds-checked), and the queue pair is a field declared before the regions,
//! so it is destroyed (every posted request flushed, the device done with our
//! memory) before the regions are deregistered and unmapped.
//!
//! Work requests that do not change are built once: a receive request per
//! slot (reposting only links the free slots' requests), and the inline UD
//! send to fixed destinations ([`PooledQp::prepare_ud_dests`], then
//! [`PooledQp::send_prepared`] writes only the data's address and length,
//! the `wr_id` and the signal flag per send).
//!
//! Nothing here allocates after [`PooledQp::new`] but
//! [`PooledQp::prepare_ud_dests`], a set-up call.

use super::cq::{CompletionQueue, WcStatus, WorkCompletion};
use super::device::Gid;
use super::error::VerbsError;
use super::memory::{Access, MemoryRegion, ProtectionDomain};
use super::qp::{
    AddressHandle, PreparedRecvs, PreparedUdSend, QpCaps, QueuePair, SendWr, Sge, UdDest,
};
use super::types::QpType;
use super::types::GRH_LEN;
use arrayvec::ArrayVec;
use std::fmt;
use std::sync::Arc;

/// Who sent a received message (see [`PooledQp::poll_recv_from`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvSource {
    /// The sender's queue pair number (UD; 0 on RC).
    pub qpn: u32,
    /// The sender's GID (UD; zero on RC). On RoCE v2 over IPv4 the device
    /// writes the IPv4 header where the GRH would be; its source address
    /// is returned as an IPv4-mapped GID, as the GID table lists it.
    pub gid: Gid,
}

/// The source GID of the 40 bytes the device wrote in front of a UD
/// message: a GRH (IB and RoCE v1/v2 over IPv6: IP version 6 in the first
/// nibble, source GID at bytes 8..24), or for RoCE v2 over IPv4 20 unused
/// bytes and then the IPv4 header (source address at bytes 32..36).
fn source_gid(grh: &[u8]) -> Gid {
    let mut gid = [0u8; 16];
    if grh.len() < GRH_LEN {
        return Gid(gid);
    }
    if grh[0] >> 4 == 6 {
        gid.copy_from_slice(&grh[8..24]);
    } else {
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&grh[32..36]);
    }
    Gid(gid)
}

/// Work requests built on the stack per doorbell (and completions polled per
/// call).
pub const MAX_BATCH: usize = 32;

/// Most destinations one slot can be sent to in one post (the lines of a
/// channel; the same limit as the prepared send's).
pub const MAX_DESTS: usize = super::qp::PREPARED_UD_DESTS;

/// Sizes of a [`PooledQp`]'s buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    /// Receive slots (all posted when idle); 0 for a send-only queue pair.
    pub recv_slots: u32,
    /// Largest message received, in bytes (the GRH is added for UD).
    pub recv_len: usize,
    /// Free receive slots are re-posted once this many have gathered.
    pub recv_batch: u32,
    /// Fewer posted receives than this after a poll is counted as "low".
    pub recv_low_water: u32,
    /// Send slots; 0 for a receive-only queue pair. Rounded up to a multiple
    /// of `signal_every`.
    pub send_slots: u32,
    /// Largest message sent, in bytes.
    pub send_len: usize,
    /// One send in this many is signaled (1 = every send).
    pub signal_every: u32,
    /// Destinations per slot at most (1..=[`MAX_DESTS`]); sizes the send queue.
    pub dests_per_send: u32,
    /// Sends of at most this many bytes are posted inline: the provider
    /// copies them into the work request, so the device reads no registered
    /// memory (no MR lookup, no DMA read of the slot) on the critical path.
    /// Capped at what the device grants; 0 turns inline off.
    pub max_inline: u32,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            recv_slots: 256,
            recv_len: 4096,
            recv_batch: 16,
            recv_low_water: 32,
            send_slots: 64,
            send_len: 4096,
            signal_every: 16,
            dests_per_send: 1,
            max_inline: 0,
        }
    }
}

/// Where a send goes.
#[derive(Debug, Clone, Copy)]
pub enum Dest<'a> {
    /// The connected peer of an RC queue pair.
    Connected,
    /// A UD destination (a multicast group: QPN 0xFFFFFF).
    Ud {
        /// Address handle.
        ah: &'a AddressHandle,
        /// Remote QPN.
        qpn: u32,
        /// Remote QKey.
        qkey: u32,
    },
}

/// Why a pool operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    /// A verb failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// A send completed in error (RC: the peer is gone or refused).
    #[error("send completion failed with {status:?} (vendor error {vendor_err:#x})")]
    SendCompletion {
        /// Status.
        status: WcStatus,
        /// Vendor error code.
        vendor_err: u32,
    },
    /// A configuration value is out of range.
    #[error("pool configuration: {0}")]
    Config(&'static str),
}

/// Why [`PooledQp::stage`] refused a message. Small and `Copy`: the caller
/// polls send completions or posts the batch, then tries again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    /// Every send slot is in flight: poll send completions first.
    #[error("send ring full")]
    RingFull,
    /// [`MAX_BATCH`] slots are staged: post them first.
    #[error("batch full")]
    BatchFull,
    /// The message is larger than a slot.
    #[error("message of {len} bytes exceeds the slot size {max}")]
    TooLarge {
        /// Message length.
        len: usize,
        /// Slot size.
        max: usize,
    },
}

/// Counters of one pool (plain values).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Successful receive completions handed out.
    pub received: u64,
    /// Receive completions in error (flushes when the QP errors).
    pub recv_errors: u64,
    /// Receives whose length was impossible (shorter than the GRH).
    pub recv_bad_len: u64,
    /// Polls that found the receive queue below the low-water mark.
    pub recv_low: u64,
    /// Receives posted in total.
    pub recv_posted: u64,
    /// Slots sent (each to one or more destinations).
    pub sent: u64,
    /// Doorbells rung for sends.
    pub send_doorbells: u64,
    /// Stage attempts refused because the ring was full.
    pub send_ring_full: u64,
}

/// What one [`PooledQp::poll_recv`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvPoll {
    /// Messages handed to the closure.
    pub received: usize,
    /// The receive queue was below the low-water mark.
    pub low: bool,
}

/// How often [`PooledQp::reclaim`] polls when no signaled request is in
/// flight.
pub const RECLAIM_IDLE_POLLS: u32 = 64;

/// A queue pair with its own CQs and registered receive and send rings. See
/// the module documentation.
pub struct PooledQp {
    // Declared first, so dropped first: destroying the QP flushes every posted
    // request before the regions below are deregistered and unmapped.
    qp: QueuePair,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    grh: usize,
    recv_slot: usize,
    recv_slots: u32,
    recv_batch: u32,
    recv_low_water: u32,
    posted: u32,
    /// Slots not posted (completed, waiting to be re-posted).
    free_recv: Vec<u32>,
    /// A receive request per slot, built once: reposting links and posts.
    recvs: PreparedRecvs,
    /// The inline UD send to the destinations given to
    /// [`PooledQp::prepare_ud_dests`] (none until then).
    ud_send: PreparedUdSend,
    send_slot: usize,
    send_slots: u32,
    signal_every: u64,
    /// `signal_every` is a power of two (every configuration in the tree):
    /// then whether a send is signaled takes a mask, not a division.
    signal_pow2: bool,
    /// Sends up to this length are posted inline.
    max_inline: u32,
    /// Sequence of the next send slot; slot = seq % send_slots.
    send_head: u64,
    /// Oldest sequence the device may still be reading.
    send_tail: u64,
    /// Staged (copied, not yet posted) sends: (seq, len).
    staged: ArrayVec<(u64, u32), MAX_BATCH>,
    /// Calls of [`PooledQp::reclaim`] since it last polled the CQ.
    reclaim_skips: u32,
    wcs: Box<[WorkCompletion]>,
    stats: PoolStats,
}

impl fmt::Debug for PooledQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledQp")
            .field("qp", &self.qp)
            .field("posted", &self.posted)
            .field("in_flight", &(self.send_head - self.send_tail))
            .field("stats", &self.stats)
            .finish()
    }
}

impl PooledQp {
    /// Creates the queue pair (in RESET), its CQs and both rings. Bring the
    /// QP up through [`qp`](Self::qp) (rdma_cm accept/connect, or
    /// `activate_ud`), then call [`post_receives`](Self::post_receives).
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        qp_type: QpType,
        cfg: PoolConfig,
    ) -> Result<Self, PoolError> {
        if cfg.signal_every == 0 {
            return Err(PoolError::Config("signal_every must be at least 1"));
        }
        if !(1..=MAX_DESTS as u32).contains(&cfg.dests_per_send) {
            return Err(PoolError::Config("dests_per_send must be 1 or 2"));
        }
        if cfg.recv_slots > 0 && (cfg.recv_batch == 0 || cfg.recv_batch > cfg.recv_slots) {
            return Err(PoolError::Config(
                "recv_batch must be within 1..=recv_slots",
            ));
        }
        let grh = if qp_type == QpType::Ud { GRH_LEN } else { 0 };
        let send_slots = cfg.send_slots.div_ceil(cfg.signal_every) * cfg.signal_every;
        let ctx = pd.context();
        let send_wr = (send_slots * cfg.dests_per_send).max(1);
        let recv_wr = cfg.recv_slots.max(1);
        let send_cq = CompletionQueue::new(ctx, send_wr)?;
        let recv_cq = CompletionQueue::new(ctx, recv_wr)?;
        let qp = QueuePair::new(
            pd,
            qp_type,
            &send_cq,
            &recv_cq,
            QpCaps {
                max_send_wr: send_wr,
                max_recv_wr: recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: cfg.max_inline,
            },
        )?;
        let max_inline = qp.caps().max_inline_data.min(cfg.max_inline);
        let recv_slot = (cfg.recv_len + grh).next_multiple_of(64);
        let send_slot = cfg.send_len.max(1).next_multiple_of(64);
        let recv_mr = MemoryRegion::new(
            pd,
            recv_slot * cfg.recv_slots.max(1) as usize,
            Access::LOCAL_WRITE,
        )?;
        let send_mr = MemoryRegion::new(pd, send_slot * send_slots.max(1) as usize, Access::LOCAL)?;
        let recvs = PreparedRecvs::new(&recv_mr, recv_slot, cfg.recv_slots)?;
        let ud_send = PreparedUdSend::new(pd, &[])?;
        Ok(PooledQp {
            qp,
            recv_mr,
            send_mr,
            grh,
            recv_slot,
            recv_slots: cfg.recv_slots,
            recv_batch: cfg.recv_batch.max(1),
            recv_low_water: cfg.recv_low_water.min(cfg.recv_slots),
            posted: 0,
            free_recv: (0..cfg.recv_slots).rev().collect(),
            recvs,
            ud_send,
            send_slot,
            send_slots,
            signal_every: u64::from(cfg.signal_every),
            signal_pow2: cfg.signal_every.is_power_of_two(),
            max_inline,
            send_head: 0,
            send_tail: 0,
            staged: ArrayVec::new(),
            reclaim_skips: 0,
            wcs: (0..MAX_BATCH).map(|_| WorkCompletion::empty()).collect(),
            stats: PoolStats::default(),
        })
    }

    /// The queue pair, to bring it up, attach multicast groups or query it.
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }
    /// Counters.
    pub fn stats(&self) -> PoolStats {
        self.stats
    }
    /// Receives currently posted.
    pub fn posted(&self) -> u32 {
        self.posted
    }
    /// Whether messages are staged, waiting for [`post_staged`](Self::post_staged).
    pub fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }
    /// Largest message a send slot holds.
    pub fn send_capacity(&self) -> usize {
        self.send_slot
    }
    /// Largest message a receive slot holds (GRH excluded).
    pub fn recv_capacity(&self) -> usize {
        self.recv_slot - self.grh
    }
    /// Send slots the device may still be reading, staged ones included.
    pub fn sends_in_flight(&self) -> u32 {
        (self.send_head - self.send_tail) as u32
    }
    /// Send slots in the ring.
    pub fn send_slots(&self) -> u32 {
        self.send_slots
    }
    /// Longest message posted inline (0: inline is off).
    pub fn max_inline(&self) -> usize {
        self.max_inline as usize
    }

    /// Posts every free receive slot with one doorbell. The QP must be in
    /// INIT or later. The requests were built once (see
    /// [`PreparedRecvs`]): this only links the free slots' requests.
    pub fn post_receives(&mut self) -> Result<(), PoolError> {
        if self.free_recv.is_empty() {
            return Ok(());
        }
        // SAFETY: each slot is in `free_recv` (once: a slot is pushed there
        // only when its receive completes, and leaves it when posted), so
        // no receive using it is posted and no borrow of it is live
        // (borrows handed out by poll_recv end before the slot returns to
        // the free list). `recvs` was built over `recv_mr`, which outlives
        // the QP (field order, see the type docs), so it stays registered
        // until the receive completes or is flushed.
        let res = unsafe { self.recvs.post(&self.qp, &self.free_recv) };
        match res {
            Ok(()) => {
                let n = self.free_recv.len();
                self.free_recv.clear();
                self.posted += n as u32;
                self.stats.recv_posted += n as u64;
                Ok(())
            }
            Err(e) => {
                if let VerbsError::PostRecv { index, .. } = e {
                    // The first `index` were posted.
                    self.free_recv.drain(..index);
                    self.posted += index as u32;
                    self.stats.recv_posted += index as u64;
                }
                Err(e.into())
            }
        }
    }

    /// Polls up to [`MAX_BATCH`] receive completions, handing each received
    /// message to `f` (UD: without the GRH), then re-posts free slots once a
    /// batch has gathered (or the queue is low). Never blocks.
    pub fn poll_recv(&mut self, mut f: impl FnMut(&[u8])) -> Result<RecvPoll, PoolError> {
        self.poll_recv_from(|_, bytes| f(bytes))
    }

    /// [`poll_recv`](Self::poll_recv), also telling `f` who sent each
    /// message: on UD the sender's queue pair (from the completion) and GID
    /// (from the GRH); on RC the source is meaningless (zero).
    pub fn poll_recv_from(
        &mut self,
        f: impl FnMut(RecvSource, &[u8]),
    ) -> Result<RecvPoll, PoolError> {
        self.poll_recv_from_max(usize::MAX, f)
    }

    /// [`poll_recv_from`](Self::poll_recv_from), taking at most `max`
    /// completions (a subscription's fragment limit).
    pub fn poll_recv_from_max(
        &mut self,
        max: usize,
        mut f: impl FnMut(RecvSource, &[u8]),
    ) -> Result<RecvPoll, PoolError> {
        if self.recv_slots == 0 {
            return Ok(RecvPoll {
                received: 0,
                low: false,
            });
        }
        let batch = max.min(self.wcs.len());
        let n = self.qp.recv_cq().poll(&mut self.wcs[..batch])?;
        let mut received = 0;
        for i in 0..n {
            let w = &self.wcs[i];
            let (slot, ok, len) = (w.wr_id(), w.is_success(), w.byte_len() as usize);
            let src_qp = w.src_qp();
            if slot >= u64::from(self.recv_slots) {
                // Not one of ours: impossible with a private CQ; never
                // trusted as an index.
                self.stats.recv_errors += 1;
                continue;
            }
            let slot = slot as u32;
            self.posted = self.posted.saturating_sub(1);
            if !ok {
                self.stats.recv_errors += 1;
            } else if len < self.grh || len > self.recv_slot {
                self.stats.recv_bad_len += 1;
            } else {
                let start = slot as usize * self.recv_slot;
                let off = start + self.grh;
                // SAFETY: the slot's receive completed (polled just above), so
                // the device no longer writes it, and it is not re-posted
                // before `f` returns; [start, off + len - grh) lies inside the
                // slot (len <= recv_slot checked) and so inside the region.
                // The borrows cannot escape `f` (higher-ranked lifetime).
                let (grh, bytes) = unsafe {
                    (
                        std::slice::from_raw_parts(self.recv_mr.as_ptr().add(start), self.grh),
                        std::slice::from_raw_parts(self.recv_mr.as_ptr().add(off), len - self.grh),
                    )
                };
                let src = RecvSource {
                    qpn: src_qp,
                    gid: source_gid(grh),
                };
                f(src, bytes);
                received += 1;
                self.stats.received += 1;
            }
            self.free_recv.push(slot);
        }
        let low = self.posted < self.recv_low_water;
        if low {
            self.stats.recv_low += 1;
        }
        if self.free_recv.len() >= self.recv_batch as usize || (low && !self.free_recv.is_empty()) {
            self.post_receives()?;
        }
        Ok(RecvPoll { received, low })
    }

    /// Copies `data` into the next send slot, to be posted by
    /// [`post_staged`](Self::post_staged).
    pub fn stage(&mut self, data: &[u8]) -> Result<(), StageError> {
        self.stage_with(data.len(), |buf| {
            buf.copy_from_slice(data);
            data.len()
        })
    }

    /// Lets `fill` write a message of at most `max_len` bytes straight into
    /// the next send slot; `fill` returns the length written.
    pub fn stage_with(
        &mut self,
        max_len: usize,
        fill: impl FnOnce(&mut [u8]) -> usize,
    ) -> Result<(), StageError> {
        if max_len > self.send_slot {
            return Err(StageError::TooLarge {
                len: max_len,
                max: self.send_slot,
            });
        }
        if self.staged.is_full() {
            return Err(StageError::BatchFull);
        }
        if self.send_head - self.send_tail >= u64::from(self.send_slots) {
            self.stats.send_ring_full += 1;
            return Err(StageError::RingFull);
        }
        let seq = self.send_head;
        let off = (seq % u64::from(self.send_slots)) as usize * self.send_slot;
        // SAFETY: seq is at least send_slots past every sequence the device
        // may still read (send_head - send_tail < send_slots, and send_tail
        // only advances on a polled completion, which in-order send queues
        // guarantee covers every earlier request), so nothing reads this
        // slot; [off, off + max_len) lies inside it. The &mut ends with fill.
        let buf =
            unsafe { std::slice::from_raw_parts_mut(self.send_mr.as_ptr().add(off), max_len) };
        let len = fill(buf).min(max_len);
        self.send_head += 1;
        self.staged.push((seq, len as u32));
        Ok(())
    }

    /// Posts every staged slot to each of `dests` with one doorbell. With no
    /// destination the staged messages are discarded. If the post fails the
    /// staged messages are dropped (their slots reclaimed).
    pub fn post_staged(&mut self, dests: &[Dest<'_>]) -> Result<usize, PoolError> {
        if self.staged.is_empty() {
            return Ok(0);
        }
        if dests.is_empty() {
            // Sent to nobody (e.g. every line disabled): give the slots back.
            // Staged slots are always the newest, so the head rolls back.
            self.send_head = self.staged[0].0;
            self.staged.clear();
            return Ok(0);
        }
        if dests.len() > MAX_DESTS {
            self.send_head = self.staged[0].0;
            self.staged.clear();
            return Err(PoolError::Config("at most MAX_DESTS destinations per post"));
        }
        let res = if let [(seq, len)] = *self.staged {
            self.post_one(seq, len, dests)
        } else {
            self.post_batch(dests)
        };
        let count = self.staged.len();
        if let Err(e) = res {
            if matches!(e, VerbsError::PostSend { index: 0, .. }) {
                // Nothing was posted: the slots are free again.
                self.send_head = self.staged[0].0;
            }
            self.staged.clear();
            return Err(e.into());
        }
        self.staged.clear();
        self.stats.sent += count as u64;
        self.stats.send_doorbells += 1;
        Ok(count)
    }

    /// The request sending slot `seq` to the `d`-th of `n` destinations:
    /// the last copy of every `signal_every`-th slot is signaled (its
    /// completion covers every earlier request of the queue). Short
    /// messages go inline.
    fn wr<'a>(
        &self,
        seq: u64,
        sge: &'a [Sge<'a>; 1],
        dest: &Dest<'a>,
        d: usize,
        n: usize,
    ) -> SendWr<'a> {
        let mut wr = SendWr::send(seq, sge);
        if sge[0].len() <= self.max_inline {
            wr = wr.inline();
        }
        if let Dest::Ud { ah, qpn, qkey } = *dest {
            wr = wr.ud(ah, qpn, qkey);
        }
        if self.signals(seq) && d + 1 == n {
            wr = wr.signaled();
        }
        wr
    }

    /// Whether the requests of slot `seq` end with a signaled one: every
    /// `signal_every`-th slot's.
    #[inline]
    fn signals(&self, seq: u64) -> bool {
        let n = seq + 1;
        if self.signal_pow2 {
            n & (self.signal_every - 1) == 0
        } else {
            n % self.signal_every == 0
        }
    }

    /// Posts one staged slot to each of `dests` (at most [`MAX_DESTS`]):
    /// the usual case of a latency-bound sender, built in a small frame.
    fn post_one(&self, seq: u64, len: u32, dests: &[Dest<'_>]) -> Result<(), VerbsError> {
        let off = (seq % u64::from(self.send_slots)) as usize * self.send_slot;
        let sge = [Sge::new(&self.send_mr, off, len as usize)?];
        let mut wrs: ArrayVec<SendWr<'_>, MAX_DESTS> = ArrayVec::new();
        for (d, dest) in dests.iter().enumerate() {
            wrs.push(self.wr(seq, &sge, dest, d, dests.len()));
        }
        // SAFETY: the staged slot was written by stage_with and is not
        // written again until a completion at or after its sequence is
        // polled; the region stays registered until after the QP is
        // destroyed (field order); rxe and mlx5 copy the address vector at
        // post time.
        unsafe { self.qp.post_send(&mut wrs) }
    }

    /// Posts every staged slot to each of `dests` with one doorbell.
    #[inline(never)]
    fn post_batch(&self, dests: &[Dest<'_>]) -> Result<(), VerbsError> {
        let mut sges: ArrayVec<[Sge<'_>; 1], MAX_BATCH> = ArrayVec::new();
        for &(seq, len) in &self.staged {
            let off = (seq % u64::from(self.send_slots)) as usize * self.send_slot;
            sges.push([Sge::new(&self.send_mr, off, len as usize)?]);
        }
        let mut wrs: ArrayVec<SendWr<'_>, { MAX_BATCH * MAX_DESTS }> = ArrayVec::new();
        for (s, &(seq, _)) in sges.iter().zip(&self.staged) {
            for (d, dest) in dests.iter().enumerate() {
                wrs.push(self.wr(seq, s, dest, d, dests.len()));
            }
        }
        // SAFETY: each staged slot was written by stage_with and is not
        // written again until a completion at or after its sequence is
        // polled (stage_with's ring check); the region is registered until
        // after the QP is destroyed (field order). The address handles are
        // borrowed for the call; rxe and mlx5 copy the address vector at
        // post time.
        unsafe { self.qp.post_send(&mut wrs) }
    }

    /// Posts `data` inline to each of `dests` at once, without copying it
    /// into a send slot: the provider copies it into the work request, so
    /// it is read from the caller's memory during the call only. The
    /// latency path of a sender whose message is already built elsewhere
    /// (the publisher's history). It still takes a slot's sequence, so the
    /// send queue stays bounded by the ring and completions are reaped as
    /// for staged sends.
    ///
    /// `Ok(false)`: not sent, use [`stage`](Self::stage) instead (messages
    /// are staged, `data` is longer than the inline limit, no destination,
    /// or every slot is in flight).
    pub fn send_inline(&mut self, data: &[u8], dests: &[Dest<'_>]) -> Result<bool, PoolError> {
        if !self.staged.is_empty()
            || data.len() > self.max_inline as usize
            || dests.is_empty()
            || dests.len() > MAX_DESTS
        {
            return Ok(false);
        }
        if !self.free_send_slot()? {
            return Ok(false);
        }
        let seq = self.send_head;
        let sge = [Sge::inline(data)];
        let mut wrs: ArrayVec<SendWr<'_>, MAX_DESTS> = ArrayVec::new();
        for (d, dest) in dests.iter().enumerate() {
            // Inline: data.len() <= max_inline, checked above.
            wrs.push(self.wr(seq, &sge, dest, d, dests.len()));
        }
        self.qp.post_send_inline(&mut wrs)?;
        self.send_head += 1;
        self.stats.sent += 1;
        self.stats.send_doorbells += 1;
        Ok(true)
    }

    /// Whether a send slot is free for an unstaged send, reclaiming
    /// completed ones if none is (a full ring is counted).
    #[inline]
    fn free_send_slot(&mut self) -> Result<bool, PoolError> {
        if self.send_head - self.send_tail < u64::from(self.send_slots) {
            return Ok(true);
        }
        self.poll_send()?;
        if self.send_head - self.send_tail < u64::from(self.send_slots) {
            return Ok(true);
        }
        self.stats.send_ring_full += 1;
        Ok(false)
    }

    /// Sets the destinations of [`send_prepared`](Self::send_prepared)
    /// (at most [`MAX_DESTS`], each enabled, address handles of this
    /// queue pair's protection domain), building their work requests once.
    pub fn prepare_ud_dests(&mut self, dests: &[UdDest]) -> Result<(), PoolError> {
        self.ud_send = PreparedUdSend::new(self.qp.pd(), dests)?;
        Ok(())
    }

    /// Stops (or resumes) [`send_prepared`](Self::send_prepared) sending to
    /// the `index`-th destination given to
    /// [`prepare_ud_dests`](Self::prepare_ud_dests); the requests are
    /// re-linked here, not per send.
    pub fn set_ud_dest_enabled(&mut self, index: usize, enabled: bool) {
        self.ud_send.set_enabled(index, enabled);
    }

    /// [`send_inline`](Self::send_inline) to the prepared destinations:
    /// per send only the data's address and length, the `wr_id` and the
    /// signal flag are written into requests built once.
    ///
    /// `Ok(false)`: not sent, for the same reasons as `send_inline` (no
    /// enabled destination among them).
    pub fn send_prepared(&mut self, data: &[u8]) -> Result<bool, PoolError> {
        if !self.staged.is_empty()
            || data.len() > self.max_inline as usize
            || self.ud_send.is_empty()
        {
            return Ok(false);
        }
        if !self.free_send_slot()? {
            return Ok(false);
        }
        let seq = self.send_head;
        // As `wr`: every `signal_every`-th slot's last request is signaled.
        let signaled = self.signals(seq);
        self.ud_send.post(&self.qp, data, seq, signaled)?;
        self.send_head += 1;
        self.stats.sent += 1;
        self.stats.send_doorbells += 1;
        Ok(true)
    }

    /// Stages `data` and posts it at once to `dests`, polling send
    /// completions once if the ring is full. `Ok(false)`: still full.
    pub fn send(&mut self, data: &[u8], dests: &[Dest<'_>]) -> Result<bool, PoolError> {
        match self.stage(data) {
            Ok(()) => {}
            Err(StageError::RingFull) => {
                self.poll_send()?;
                if self.stage(data).is_err() {
                    return Ok(false);
                }
            }
            Err(StageError::BatchFull) => {
                self.post_staged(dests)?;
                if self.stage(data).is_err() {
                    return Ok(false);
                }
            }
            Err(StageError::TooLarge { .. }) => {
                return Err(PoolError::Config("message larger than a send slot"))
            }
        }
        self.post_staged(dests)?;
        Ok(true)
    }

    /// [`poll_send`](Self::poll_send) for loops that call it on every turn:
    /// it polls the CQ only when a signaled request is in flight (only then
    /// can a successful completion be waiting), and otherwise once every
    /// [`RECLAIM_IDLE_POLLS`] calls, for the error completions a failed queue
    /// pair gives every request. A busy loop thus skips a CQ poll (a lock
    /// and a cache line the device writes) on most turns.
    pub fn reclaim(&mut self) -> Result<u32, PoolError> {
        let k = self.signal_every;
        // The signaled sequences s are those with (s + 1) % k == 0; one is in
        // flight, [send_tail, send_head), iff a multiple of k lies in
        // (send_tail, send_head].
        if self.send_head / k == self.send_tail / k {
            self.reclaim_skips += 1;
            if self.reclaim_skips < RECLAIM_IDLE_POLLS {
                return Ok(0);
            }
        }
        self.reclaim_skips = 0;
        self.poll_send()
    }

    /// Polls send completions, freeing the slots they cover. Returns how many
    /// slots were freed. A completion in error is returned as an error.
    pub fn poll_send(&mut self) -> Result<u32, PoolError> {
        let n = self.qp.send_cq().poll(&mut self.wcs)?;
        let before = self.send_tail;
        for i in 0..n {
            let w = &self.wcs[i];
            if !w.is_success() {
                return Err(PoolError::SendCompletion {
                    status: w.status(),
                    vendor_err: w.vendor_err(),
                });
            }
            // wr_id is the slot sequence; never beyond what was posted.
            let seq = w.wr_id();
            if seq < self.send_head {
                self.send_tail = self.send_tail.max(seq + 1);
            }
        }
        Ok((self.send_tail - before) as u32)
    }
}

#[cfg(test)]
mod source_tests {
    use super::*;

    #[test]
    fn source_gid_of_a_grh_and_of_a_roce_v2_ipv4_header() {
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        grh[8..24].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(source_gid(&grh).0[..2], [0xfe, 0x80]);
        assert_eq!(source_gid(&grh).0[8..], [1, 2, 3, 4, 5, 6, 7, 8]);
        let mut v4 = [0u8; GRH_LEN];
        v4[20] = 0x45;
        v4[32..36].copy_from_slice(&[198, 18, 0, 1]);
        assert_eq!(
            source_gid(&v4).ipv4(),
            Some(std::net::Ipv4Addr::new(198, 18, 0, 1))
        );
        assert!(source_gid(&[0u8; 3]).is_zero());
    }
}
