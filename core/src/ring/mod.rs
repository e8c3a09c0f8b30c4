//! The orders ring: frames RDMA-WRITten by the sender straight into a ring
//! the receiver registered in advance, found by the receiver polling its own
//! memory, with credits flowing back by RDMA WRITE.
//!
//! # Why a frame is never consumed half-written
//!
//! Each frame is `header | payload | trailer`: the header (length, stream,
//! type, then in its last 8 bytes a check word mixing the connection
//! sequence with the first 8 header bytes, [`frame::header_check`]) and a
//! trailer, the frame's last 8 bytes, holding a seal derived from the same
//! sequence ([`frame::trailer_value`]). The sequence itself is never sent:
//! the receiver knows which one comes next. The sender writes each
//! contiguous run of frames with one RDMA WRITE (inline when small). The
//! receiver polls the header at its consumer position and takes it only
//! when its check word matches the *expected* sequence; anything else
//! (a header of an earlier lap, leftover payload bytes) means the frame
//! has not arrived yet. A matching header makes it read the trailer, and
//! only a trailer holding this frame's seal makes the frame deliverable.
//! The check word and the seal are read with `Acquire` loads, the rest of
//! the header and the payload after them ([`proto::read_header`],
//! [`Receiver::poll`]).
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
//! only grow, and both the header check and the seal are the expected
//! sequence scrambled, so leftover bytes are unlikely to imitate them (a peer that writes such bytes on
//! purpose only garbles its own connection; the receiver never reads
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
//! The receiver trusts nothing it reads: once a header's check matches, its
//! length must fit in the ring and the connection's maximum and its type
//! must be an application type or padding that ends the lap exactly
//! ([`frame::validate`]). Any violation closes the connection with
//! [`FrameError`]; the receiver never reads outside its ring.
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
pub use state::{ClaimPos, ClaimRefused, ReceiverState, SenderState};
