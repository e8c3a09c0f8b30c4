//! The ring protocol without I/O: [`Sender`] builds frames in a staging
//! mirror and says which byte ranges to write to the peer's ring;
//! [`Receiver`] finds, validates, seals-checks and copies frames out of
//! ring memory and says when to return credit. Neither posts, polls a
//! completion queue or knows what RDMA is: memory is reached through
//! [`RingMemory`] (the peer-writable ring: word loads only) and
//! [`StagingMemory`] (our own bytes). `orders` drives them over registered
//! memory and RDMA WRITEs; the host tests drive them over
//! [`LoopbackMemory`](super::loopback::LoopbackMemory) with plain stores.
//!
//! What this module must not do: hold a `&[u8]` into ring memory (a peer
//! may rewrite it at any time), allocate, or read a word whose offset was
//! not first checked against the ring's bounds ([`frame::validate`]).

use super::frame::{
    self, FrameError, FrameHeader, FrameInfo, FRAME_ALIGN, HEADER_LEN, TRAILER_LEN, TYPE_PADDING,
    TYPE_RESERVED_MIN,
};
use super::state::{BadCredit, ClaimPos, ClaimRefused, ReceiverState, SenderState};
use zerocopy::IntoBytes;

/// Offset, after the ring's data, of the credit word (16 bytes: the value
/// and its complement).
pub const CREDIT_OFF: usize = 0;

/// Bytes of a control word on the wire: the value and its complement.
pub const CONTROL_WORD_LEN: usize = 16;

/// A control word as written: value, then its bitwise complement.
#[inline]
pub fn control_word(v: u64) -> [u8; CONTROL_WORD_LEN] {
    let mut b = [0u8; CONTROL_WORD_LEN];
    b[..8].copy_from_slice(&v.to_le_bytes());
    b[8..].copy_from_slice(&(!v).to_le_bytes());
    b
}

/// Memory a peer writes into: the ring's data, then its control words
/// ([`frame::CONTROL_LEN`] bytes). Only aligned 8-byte loads, so nothing
/// ever borrows bytes that can change underneath.
///
/// Implementations load the 8 bytes at byte offset `at` (a multiple of 8,
/// `at + 8 <= data_len() + CONTROL_LEN`, else they panic) as one atomic
/// word in native byte order.
pub trait RingMemory {
    /// Bytes of frame data (a power of two).
    fn data_len(&self) -> usize;
    /// The word at `at`, with `Acquire`: pairs with the writer placing
    /// bytes in ascending address order, so everything below a word seen
    /// with its final value is visible to the loads that follow.
    fn load_acquire(&self, at: usize) -> u64;
    /// The word at `at`, `Relaxed`: only after an Acquire load that
    /// established the bytes are complete.
    fn load_relaxed(&self, at: usize) -> u64;
    /// The words from `at` into `dst` (a multiple of 8 bytes long), each
    /// loaded `Relaxed` as [`load_relaxed`](Self::load_relaxed) does; an
    /// implementation may check the bounds once for the whole range.
    #[inline]
    fn copy_relaxed(&self, at: usize, dst: &mut [u8]) {
        for (i, c) in dst.chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&self.load_relaxed(at + 8 * i).to_ne_bytes());
        }
    }
    /// The frame header's word at 16-aligned offset `off` (`off + 8 <=
    /// data_len()`; otherwise an implementation panics or loads another
    /// word of the data), `Relaxed`, before any Acquire: its value
    /// counts only once the frame's seal, which covers it
    /// ([`frame::trailer_value`]), is seen with Acquire
    /// ([`take_sealed`](Self::take_sealed)); until then it may be anything.
    #[inline]
    fn load_header(&self, off: usize) -> u64 {
        // ORDERING: Relaxed: the value is checked against the seal, loaded
        // with Acquire after it; nothing else is read on its strength.
        self.load_relaxed(off)
    }
    /// The body of the frame of `total` bytes at 8-aligned offset `off`: loads
    /// its seal (the last word, at `off + total - 8`) with Acquire and, only
    /// if it equals `seal`, copies the words from `off + 8` into `dst` (a
    /// multiple of 8 bytes, ending at or before the seal) with Relaxed loads
    /// ordered after it; returns whether it did. Panics when the frame
    /// leaves the data or `dst` does not fit before the seal. An
    /// implementation may check the bounds once for all of it.
    #[inline]
    fn take_sealed(&self, off: usize, total: usize, seal: u64, dst: &mut [u8]) -> bool {
        assert!(
            dst.len() % 8 == 0
                && total >= HEADER_LEN + TRAILER_LEN + dst.len()
                && off.checked_add(total).is_some_and(|e| e <= self.data_len())
        );
        // ORDERING: Acquire, pairs with the writer placing the frame's bytes
        // in ascending order: the payload loads come after it.
        if self.load_acquire(off + total - TRAILER_LEN) != seal {
            return false;
        }
        // ORDERING: Relaxed: after the Acquire above saw the frame complete.
        self.copy_relaxed(off + HEADER_LEN, dst);
        true
    }
}

/// Our own staging bytes (nobody else writes them; a device may read a
/// range between its WRITE being posted and executed, which the credit
/// argument of [`Sender`] keeps apart from every range we rewrite).
pub trait StagingMemory {
    /// Bytes of staging (the peer ring's data size).
    fn len(&self) -> usize;
    /// Whether empty (never, for a real ring).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// `len` bytes at `off`.
    fn bytes(&self, off: usize, len: usize) -> &[u8];
    /// `len` bytes at `off`, to fill.
    fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8];
}

impl StagingMemory for Box<[u8]> {
    fn len(&self) -> usize {
        <[u8]>::len(self)
    }
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        &self[off..off + len]
    }
    fn bytes_mut(&mut self, off: usize, len: usize) -> &mut [u8] {
        &mut self[off..off + len]
    }
}

/// Reads a control word and its complement; `None` if they disagree (a
/// write in progress).
#[inline]
pub fn load_control<M: RingMemory>(mem: &M, off: usize) -> Option<u64> {
    let at = mem.data_len() + off;
    // ORDERING: Acquire on both loads, pairs with the writer placing the
    // value's bytes before the complement's; the complement is read second,
    // so a matching pair was fully placed before any later load of ours.
    let v = mem.load_acquire(at);
    let c = mem.load_acquire(at + 8);
    (v == !c).then_some(v)
}

/// Copies `len` payload bytes at 8-aligned offset `off` into `dst` (which
/// holds `len` rounded up to 8), with relaxed word loads: a peer that
/// rewrites the frame meanwhile can only make the copy inconsistent, never
/// undefined. The words read stay inside the frame: the payload rounded up
/// to 8 ends at or before the trailer.
#[inline]
pub fn copy_payload<M: RingMemory>(mem: &M, off: usize, len: usize, dst: &mut [u8]) {
    let words = len.div_ceil(8);
    assert!(off % 8 == 0 && off + words * 8 <= mem.data_len() && dst.len() >= words * 8);
    // ORDERING: Relaxed: ordered after the trailer's Acquire load in the
    // caller, which saw the frame complete.
    mem.copy_relaxed(off, &mut dst[..words * 8]);
}

/// The sending half of a ring connection: frames built in `S` at the
/// offsets they will occupy in the peer's ring, so a run of frames is one
/// write of one contiguous range (or two when it wraps).
///
/// A staging range is rewritten only once claimed again, which needs the
/// peer's credit past it, which the peer gives only after it consumed the
/// frames there, i.e. after the write carrying them executed: the I/O
/// shell may let the device read staging until then.
#[derive(Debug)]
pub struct Sender<S> {
    state: SenderState,
    staging: S,
    open: Option<OpenClaim>,
    /// Padding frames written (frames sent are the sequences used less
    /// these: no per-frame count on the hot path).
    paddings: u64,
    /// Payload bytes committed.
    bytes: u64,
    /// [`offer_run`](Self::offer_run) takes payloads shorter than this:
    /// at most the maximum payload, and short enough for the frame to fit
    /// the shell's largest write ([`set_max_write`](Self::set_max_write)).
    run_limit: usize,
    /// Credit words refused ([`BadCredit`]), each distinct value once (the
    /// word is read again on every back-pressured claim).
    bad_credits: u64,
    /// The last value refused, and why.
    last_bad: Option<(u64, BadCredit)>,
    /// The first credit beyond what was sent: a protocol violation, for
    /// the shell to close the connection on. Sticky.
    violation: Option<BadCredit>,
}

#[derive(Debug, Clone, Copy)]
struct OpenClaim {
    pos: ClaimPos,
    stream_id: u16,
    msg_type: u16,
    len: usize,
}

impl<S: StagingMemory> Sender<S> {
    /// A sender into a peer ring of `staging.len()` bytes (a power of two,
    /// at least four maximal frames) taking payloads up to `max_payload`.
    pub fn new(staging: S, max_payload: usize) -> Self {
        Self {
            state: SenderState::new(staging.len(), max_payload),
            staging,
            open: None,
            paddings: 0,
            bytes: 0,
            run_limit: max_payload + 1,
            bad_credits: 0,
            last_bad: None,
            violation: None,
        }
    }

    /// The shell writes at most `max_write` bytes at once: from now on
    /// [`offer_run`](Self::offer_run) takes only frames of at most that
    /// many bytes (one compare of the payload's length, decided here).
    pub fn set_max_write(&mut self, max_write: usize) {
        // The frame of a payload of `len` bytes is `len` plus header and
        // trailer rounded up to `FRAME_ALIGN` (`frame::frame_len`): it fits
        // `max_write` exactly when it fits `max_write` rounded down to that.
        let fits = (max_write & !(FRAME_ALIGN - 1))
            .checked_sub(HEADER_LEN + TRAILER_LEN)
            .map_or(0, |l| l + 1);
        self.run_limit = fits.min(self.state.max_payload() + 1);
    }
    /// Application frames committed (padding not counted).
    pub fn frames(&self) -> u64 {
        self.state.next_seq() - 1 - self.paddings
    }
    /// Payload bytes committed.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
    /// Positions and credit.
    pub fn state(&self) -> &SenderState {
        &self.state
    }
    /// The staging memory (for the shell's writes: see [`take_flush`](Self::take_flush)).
    pub fn staging(&self) -> &S {
        &self.staging
    }

    /// Takes the credit word the peer wrote into `credit_mem` (our own
    /// incoming ring's control words), if it is not being placed. Returns
    /// whether a value was read. An impossible value is refused and
    /// counted ([`bad_credits`](Self::bad_credits)); one beyond what was
    /// sent is also a protocol violation
    /// ([`credit_violation`](Self::credit_violation)).
    #[inline]
    pub fn refresh_credit<M: RingMemory>(&mut self, credit_mem: &M) -> bool {
        match load_control(credit_mem, CREDIT_OFF) {
            Some(c) => {
                if let Err(b) = self.state.on_credit(c) {
                    self.refused_credit(c, b);
                }
                true
            }
            None => false,
        }
    }

    /// Counts a refused credit value `c` (once while it stays in the word)
    /// and keeps the first one beyond what was sent.
    #[cold]
    #[inline(never)]
    fn refused_credit(&mut self, c: u64, why: BadCredit) {
        if self.last_bad.is_some_and(|(v, _)| v == c) {
            return;
        }
        self.bad_credits += 1;
        self.last_bad = Some((c, why));
        if let (None, BadCredit::BeyondSent { .. }) = (self.violation, why) {
            self.violation = Some(why);
        }
    }

    /// Credit words refused so far: values behind the credit already taken
    /// or beyond what was sent, each counted once while it stays in the
    /// word. An honest peer never writes one (see [`BadCredit`]).
    pub fn bad_credits(&self) -> u64 {
        self.bad_credits
    }

    /// The last credit value refused and why.
    pub fn last_bad_credit(&self) -> Option<BadCredit> {
        self.last_bad.map(|(_, b)| b)
    }

    /// The first credit beyond what was ever sent, if the peer wrote one:
    /// the peer is broken or hostile, and the shell closes the connection.
    pub fn credit_violation(&self) -> Option<BadCredit> {
        self.violation
    }

    /// Opens a frame of `len` payload bytes of type `msg_type` (below
    /// [`TYPE_RESERVED_MIN`]) on `stream_id`. When the ring looks full the
    /// credit word in `credit_mem` is read once and the claim retried.
    /// A claim left open is replaced by the next one (it was abandoned).
    #[inline]
    pub fn claim<M: RingMemory>(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        len: usize,
        credit_mem: &M,
    ) -> Result<(), ClaimRefused> {
        if msg_type >= TYPE_RESERVED_MIN {
            return Err(ClaimRefused::ReservedType);
        }
        let pos = match self.state.claim(len) {
            Ok(p) => p,
            Err(ClaimRefused::BackPressured) => {
                self.refresh_credit(credit_mem);
                self.state.claim(len)?
            }
            Err(e) => return Err(e),
        };
        self.open = Some(OpenClaim {
            pos,
            stream_id,
            msg_type,
            len,
        });
        Ok(())
    }

    /// The open claim's payload bytes (empty when none is open).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        match self.open {
            Some(c) => self.staging.bytes(c.pos.offset + HEADER_LEN, c.len),
            None => &[],
        }
    }

    /// The open claim's payload bytes, to fill (empty when none is open).
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        match self.open {
            Some(c) => self.staging.bytes_mut(c.pos.offset + HEADER_LEN, c.len),
            None => &mut [],
        }
    }

    /// Drops the open claim: nothing of it is sent.
    #[inline]
    pub fn abandon(&mut self) {
        self.open = None;
    }

    /// Seals the open claim (header, and padding before it when it wraps;
    /// the trailer after it) so it goes out with the next flush. Returns its
    /// sequence, or `None` when no claim was open.
    #[inline]
    pub fn commit(&mut self) -> Option<u64> {
        let c = self.open.take()?;
        let pos = c.pos;
        if let Some((off, pad)) = pos.padding {
            // Header and seal, nothing between (`pad` is at least 16).
            let seq = self.state.next_seq();
            let h = FrameHeader::new((pad - HEADER_LEN - TRAILER_LEN) as u32, 0, TYPE_PADDING);
            self.seal_frame(off, pad, h, seq);
            self.paddings += 1;
        }
        let seq = self.state.next_seq() + pos.padding.is_some() as u64;
        let h = FrameHeader::new(c.len as u32, c.stream_id, c.msg_type);
        self.seal_frame(pos.offset, pos.total, h, seq);
        let used = self.state.commit(&pos);
        debug_assert_eq!(used, seq);
        self.bytes += c.len as u64;
        Some(seq)
    }

    /// Writes header `h` and the seal of frame `seq` around the payload of
    /// the frame at `off..off + total` of staging.
    #[inline]
    fn seal_frame(&mut self, off: usize, total: usize, h: FrameHeader, seq: u64) {
        self.staging
            .bytes_mut(off, HEADER_LEN)
            .copy_from_slice(h.as_bytes());
        self.staging
            .bytes_mut(off + total - TRAILER_LEN, TRAILER_LEN)
            .copy_from_slice(&h.seal(seq).to_le_bytes());
    }

    /// Claims, fills and commits one frame (replacing a claim left open).
    ///
    /// The usual frame, one that fits before the ring's end within the
    /// credit ([`SenderState::claim_fast`]), is written through one slice
    /// of staging (one bounds check): header, payload, seal. Anything else
    /// (padding first, back-pressure, too large) goes through
    /// [`claim`](Self::claim) and [`commit`](Self::commit) out of line.
    #[inline(always)]
    pub fn offer<M: RingMemory>(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
        credit_mem: &M,
    ) -> Result<u64, ClaimRefused> {
        if msg_type >= TYPE_RESERVED_MIN {
            return Err(ClaimRefused::ReservedType);
        }
        let len = payload.len();
        let Some((off, total)) = self.state.claim_fast(len) else {
            return self.offer_slow(stream_id, msg_type, payload, credit_mem);
        };
        let seq = self.write_usual(off, total, stream_id, msg_type, payload);
        self.state.commit_fast(total);
        Ok(seq)
    }

    /// Writes the usual frame [`SenderState::claim_fast`] placed at
    /// `off..off + total` of staging (the caller commits it); returns its
    /// sequence.
    #[inline(always)]
    fn write_usual(
        &mut self,
        off: usize,
        total: usize,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
    ) -> u64 {
        let seq = self.state.next_seq();
        frame::write_frame(
            self.staging.bytes_mut(off, total),
            stream_id,
            msg_type,
            seq,
            payload,
        );
        self.open = None;
        self.bytes += payload.len() as u64;
        seq
    }

    /// [`offer`](Self::offer) of a frame that is flushed at once and alone
    /// (`offer` then [`take_run`](Self::take_run) in one step): when
    /// nothing else is unflushed and the frame is the usual one
    /// ([`SenderState::claim_fast`]) of at most the shell's largest write
    /// ([`set_max_write`](Self::set_max_write)), writes it, marks it
    /// flushed and returns its run `(offset, len)` for the shell to write
    /// now. `None`: nothing was done (the caller offers and flushes the
    /// general way, which also reports a reserved type or a payload too
    /// large).
    #[inline(always)]
    pub fn offer_run(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
    ) -> Option<(usize, usize)> {
        let len = payload.len();
        if msg_type >= TYPE_RESERVED_MIN || len >= self.run_limit || self.state.unflushed() != 0 {
            return None;
        }
        let (off, total) = self.state.claim_fast_fitting(len)?;
        self.write_usual(off, total, stream_id, msg_type, payload);
        self.state.commit_flushed(total);
        Some((off, total))
    }

    /// [`offer`](Self::offer) when the fast claim does not decide.
    #[cold]
    #[inline(never)]
    fn offer_slow<M: RingMemory>(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
        credit_mem: &M,
    ) -> Result<u64, ClaimRefused> {
        self.claim(stream_id, msg_type, payload.len(), credit_mem)?;
        self.payload_mut().copy_from_slice(payload);
        Ok(self.commit().expect("claim open"))
    }

    /// The staging ranges `(offset, len)` holding everything committed
    /// since the last flush, and how many (two when it wraps): the shell
    /// writes each to the same offset of the peer's ring, in this order,
    /// in one ordered channel (one RC queue pair). Marks them flushed.
    #[inline]
    pub fn take_flush(&mut self) -> ([(usize, usize); 2], usize) {
        self.state.take_flush()
    }

    /// [`SenderState::take_run`]: everything unflushed when it is one run
    /// of at most `max` bytes (else `None`, nothing marked).
    #[inline]
    pub fn take_run(&mut self, max: usize) -> Option<(usize, usize)> {
        self.state.take_run(max)
    }
}

/// The receiving half of a ring connection: finds frames in ring memory
/// it polls, in sequence order, and says when to return credit.
#[derive(Debug, Clone)]
pub struct Receiver {
    state: ReceiverState,
    violations: u64,
    /// Padding frames skipped (so frames delivered are the sequences
    /// consumed less these: no per-frame count on the hot path).
    paddings: u64,
    /// Payload bytes delivered.
    bytes: u64,
}

/// The lowest first header word of a reserved type (padding included): the
/// type is the word's top 16 bits, so one compare tells an application frame.
const RESERVED_WORD0: u64 = frame::header_word(0, 0, TYPE_RESERVED_MIN);

impl Receiver {
    /// A receiver of a ring of `size` data bytes accepting payloads up to
    /// `max_payload`, returning credit every `credit_every` bytes.
    pub fn new(size: usize, max_payload: usize, credit_every: usize) -> Self {
        Self {
            state: ReceiverState::new(size, max_payload, credit_every),
            violations: 0,
            paddings: 0,
            bytes: 0,
        }
    }
    /// Consumer position and sequence.
    pub fn state(&self) -> &ReceiverState {
        &self.state
    }
    /// Frames refused as impossible (each one a [`FrameError`] returned by
    /// [`poll`](Self::poll)).
    pub fn violations(&self) -> u64 {
        self.violations
    }
    /// Application frames delivered (padding not counted).
    pub fn frames(&self) -> u64 {
        self.state.expected_seq() - 1 - self.paddings
    }
    /// Payload bytes delivered.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The next frame, if it is complete: its payload copied into `dst`
    /// (at least `max_payload` rounded up to 8 bytes), padding skipped.
    /// `Ok(None)`: not arrived or still being placed. An error means the
    /// peer is broken or hostile; nothing past the bad frame is read, and
    /// every later poll returns the same error.
    ///
    /// The usual frame, an application frame that fits, is taken with one
    /// look at its header word (type, length and room, one compare each),
    /// one bounds check of the memory for the seal and the payload
    /// together, and one compare of the seal with the value of the
    /// expected sequence and that header word; padding, anything
    /// impossible and the words an earlier lap left that do not look like
    /// such a header go through [`frame::validate`] out of line.
    #[inline(always)]
    pub fn poll<M: RingMemory>(
        &mut self,
        mem: &M,
        dst: &mut [u8],
    ) -> Result<Option<FrameInfo>, FrameError> {
        debug_assert_eq!(mem.data_len(), self.state.size());
        let off = self.state.offset();
        let seq = self.state.expected_seq();
        // What the header word says counts only if the seal it points to
        // is this frame's, which covers the word (see `take_sealed`).
        let w0 = mem.load_header(off);
        let len = frame::word_len(w0) as usize;
        // Each refusal its own branch (the slow path is cold): an
        // application type, a length within `max_payload` (a `u32`, so
        // `frame_len` cannot overflow), room before the ring's end.
        if w0 >= RESERVED_WORD0 {
            return self.poll_slow(mem, dst);
        }
        if len > self.state.max_payload() {
            return self.poll_slow(mem, dst);
        }
        let total = frame::frame_len(len);
        // The room is checked against the memory's size (the state's,
        // asserted above), the same compare `take_sealed` makes for its
        // bounds, so the compiler makes it once.
        if total > mem.data_len() - off {
            return self.poll_slow(mem, dst);
        }
        // The seal is the frame's last word: until it holds the value of
        // this sequence and this header word, the frame has not arrived
        // (the word is left from an earlier lap) or is still being placed.
        // The payload's words: its length rounded up to 8 (`len` is below
        // 2^32: no overflow).
        if !mem.take_sealed(
            off,
            total,
            frame::trailer_value(seq, w0),
            &mut dst[..(len + 7) & !7],
        ) {
            return Ok(None);
        }
        self.state.advance(total);
        self.bytes += len as u64;
        Ok(Some(FrameInfo {
            len: len as u32,
            stream_id: frame::word_stream(w0),
            msg_type: frame::word_type(w0),
            seq,
            total,
        }))
    }

    /// [`poll`](Self::poll) for a header that is padding or impossible (or
    /// anything else the fast path does not take): the full validation.
    #[cold]
    #[inline(never)]
    fn poll_slow<M: RingMemory>(
        &mut self,
        mem: &M,
        dst: &mut [u8],
    ) -> Result<Option<FrameInfo>, FrameError> {
        loop {
            let off = self.state.offset();
            let w0 = mem.load_header(off);
            let h = FrameHeader::from_word(w0);
            let Some((total, verdict)) = frame::validate(
                &h,
                self.state.consumed(),
                off,
                self.state.size(),
                self.state.expected_seq(),
                self.state.max_payload(),
            ) else {
                // No frame of that length fits: not a header.
                return Ok(None);
            };
            // The seal is the frame's last word: until it holds the value
            // of this sequence and this header word, the frame has not
            // arrived or is still being placed.
            // ORDERING: Acquire, pairs with the writer placing the frame's
            // bytes in ascending order: the payload loads come after it.
            let seal = mem.load_acquire(off + total - TRAILER_LEN);
            if seal != h.seal(self.state.expected_seq()) {
                return Ok(None);
            }
            let info = match verdict {
                Ok(i) => i,
                Err(e) => {
                    self.violations += 1;
                    return Err(e);
                }
            };
            if info.msg_type == TYPE_PADDING {
                self.state.advance(info.total);
                self.paddings += 1;
                continue;
            }
            copy_payload(mem, off + HEADER_LEN, info.len as usize, dst);
            self.state.advance(info.total);
            self.bytes += info.len as u64;
            return Ok(Some(info));
        }
    }

    /// Records how many frames the last round of polls delivered; when a
    /// credit write is due returns the position to write (with
    /// [`control_word`], to the sender's [`CREDIT_OFF`]) and counts it as
    /// sent.
    #[inline]
    pub fn take_credit(&mut self, delivered: usize) -> Option<u64> {
        let due = self.state.credit_due(delivered);
        if let Some(c) = due {
            self.state.credit_sent(c);
        }
        due
    }
}
