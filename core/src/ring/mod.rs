//! The orders ring: frames RDMA-WRITten by the sender straight into a ring
//! the receiver registered in advance, found by the receiver polling its own
//! memory, with credits flowing back by RDMA WRITE.
//!
//! # Why a frame is never consumed half-written
//!
//! Each frame is `header | payload | trailer`: the header, one 8-byte
//! word (length, stream, type), and the trailer, the frame's last 8 bytes
//! (the frame is padded to a multiple of 16), holding a seal that mixes
//! the connection sequence with the header word ([`frame::trailer_value`]).
//! The sequence itself is never sent: the receiver knows which one comes
//! next. A 64-byte message is an 80-byte frame. The sender writes each
//! contiguous run of frames with one RDMA WRITE (inline when small). The
//! receiver reads the header word at its consumer position, which tells
//! it where this frame's seal would be, and takes the frame only when the
//! word there is the seal of the *expected* sequence and of that header
//! word; anything else (a header of an earlier lap, leftover payload
//! bytes, a frame still being placed) means the frame has not arrived
//! yet. The seal is read with an `Acquire` load and the payload after it;
//! the header word is read before, and its value counts only because the
//! seal covers it ([`Receiver::poll`]). Sixteen bytes of header (a word
//! of fields and a check word) were the format until 2026-12: the seal
//! covering the header's word makes the check word redundant, and a
//! 64-byte message went out as 96 bytes instead of 80, which soft-RoCE's
//! per-byte work turned into about 6% of `ib_write_lat`'s round trip.
//!
//! The argument rests on two placement facts:
//!
//! - RC executes one QP's requests in order and places a multi-packet
//!   WRITE packet by packet in PSN order (retransmissions included), so the
//!   packet carrying a frame's trailer is placed after every earlier packet
//!   of the frame and of the run.
//! - Within a packet, the bytes reach memory in ascending address order.
//!   The InfiniBand specification does not promise this; NICs do (ConnectX
//!   places writes in increasing address order, and perftest's
//!   `ib_write_lat` polls the last byte of each message on exactly this
//!   basis), and soft-RoCE copies packets with the kernel's forward
//!   `memcpy`. We never register memory with relaxed ordering, which is
//!   what would break it on PCIe.
//!
//! The ring torture test (millions of frames of random sizes, wrapping
//! thousands of times, a CRC in every payload) checks it on soft-RoCE.
//! Stale bytes of an earlier lap cannot pass for a new frame: sequences
//! only grow, and the seal is the expected sequence and the header word
//! scrambled together (a bijection of the sequence for each header), so
//! leftover bytes are unlikely to imitate it (a peer that writes such bytes
//! on purpose only garbles its own connection; the receiver never reads
//! outside its ring either way).
//!
//! Schemes weighed and not chosen: a separate commit word written by a
//! second RDMA WRITE after the data on the same QP is sound by the letter
//! of the specification but costs a second packet and its ACK per flush
//! (measured: about 2x the one-way latency of `ib_write_lat` on
//! soft-RoCE, against the goal of 1.10x); WRITE-with-immediate is ordered
//! by its completion but needs receive WRs and a completion per message
//! at the receiver, which this path exists to avoid.
//!
//! # Credits
//!
//! The receiver writes its consumer position into the sender's credit word
//! every `credit_every` consumed bytes (a quarter ring on the orders path)
//! and after [`state::IDLE_CREDIT_POLLS`] polls that found nothing. The word travels with
//! its bitwise complement in one 16-byte WRITE, and the sender takes a
//! value only when the halves agree (a torn read is read again). The
//! sender never claims beyond `credit + ring size`: no frame is ever
//! overwritten before it was consumed, and a full ring is reported as
//! back-pressure.
//!
//! The receiver trusts nothing it reads: a header word counts only with
//! its seal in place, where its length puts it, so a length running past
//! the ring's end is never taken (no seal can be there: the peer has
//! stalled its own connection); a sealed header must have a length within
//! the connection's maximum and an application type, or be padding that
//! ends the lap exactly ([`frame::validate`]). Any violation closes the
//! connection with [`FrameError`]; the receiver never reads outside its
//! ring.
//!
//! # Where each part lives
//!
//! - [`proto`]: the protocol, free of I/O: [`Sender`] (claim, seal,
//!   the ranges a flush writes, credit and back-pressure) and [`Receiver`]
//!   (find the expected frame, validate, check the seal, copy the payload,
//!   decide when credit is due), over the [`RingMemory`] and
//!   [`StagingMemory`] traits.
//! - [`frame`] and [`state`]: wire formats and position arithmetic, pure.
//! - `mem` (crate-private): the implementations of those traits over
//!   registered memory (and the fan-in summary's), the only unsafe code of
//!   the ring; [`crate::orders`] (its `connection` module) is the I/O shell
//!   that posts the RDMA WRITEs the [`Sender`] names and reaps their
//!   completions.
//! - [`fanin`]: the activity summary a receiver of many rings scans to
//!   poll only the rings with new frames (and its ORDERING argument).
//! - [`loopback`]: implementations of the traits over plain atomic memory,
//!   for host tests
//!   (the `tests` module here: threads racing torn placement, credits,
//!   junk in the ring; run under valgrind's memcheck by `cargo xtask
//!   test`) and a loom model of the control words (`RUSTFLAGS="--cfg
//!   loom" cargo test -p rocebus --lib loom`).

pub mod fanin;
pub mod frame;
pub mod loopback;
pub(crate) mod mem;
pub mod proto;
pub mod state;
mod sync;
#[cfg(test)]
mod tests;

pub use frame::{AcceptHello, ConnectHello, FrameError, FrameHeader, FrameInfo, Hello};
pub use loopback::LoopbackMemory;
pub use proto::{Receiver, RingMemory, Sender, StagingMemory};
pub use state::{BadCredit, ClaimPos, ClaimRefused, ReceiverState, SenderState};
