//! The orders ring: frames RDMA-WRITten by the sender straight into a ring
//! the receiver registered in advance, found by the receiver polling its own
//! memory, with credits flowing back by RDMA WRITE.
//!
//! # Why a frame is never consumed half-written
//!
//! The sender posts, on one RC queue pair and in this order, (1) one RDMA
//! WRITE per contiguous run of frames and (2) an 8-byte RDMA WRITE of the
//! new producer position into the receiver's commit word. The receiver
//! reads only the commit word to learn what is readable, then the frames
//! below it. This is sound because:
//!
//! - RC delivers and executes the requests of one QP in order: the responder
//!   places all data of WRITE (1) before it places WRITE (2) (IBA: requests
//!   are executed in the order posted; packets carry consecutive PSNs and are
//!   processed in PSN order, retransmissions included). No fence is needed
//!   (fences order after READs/atomics only), and we never register memory
//!   with relaxed ordering, so the NIC's DMA writes reach memory in order.
//! - The commit word is an aligned 8-byte location written by one 8-byte
//!   DMA store and read with an `Acquire` load; frame bytes are read only
//!   after it, so they are at least as new as the commit.
//! - Nothing relies on the order of bytes *within* one WRITE (which the
//!   specification does not promise), unlike schemes that poll the last
//!   byte of a frame.
//!
//! The alternatives were weighed: WRITE-with-immediate is ordered by its
//! completion but needs receive WRs and a completion per message at the
//! receiver, which this path exists to avoid; a per-frame trailer saves the
//! small second WRITE but relies on in-message placement order. The commit
//! write costs one extra 8-byte inline WQE per flush (not per frame: a
//! flush carries every frame claimed since the last one).
//!
//! # Credits
//!
//! The receiver writes its consumer position into the sender's credit word
//! (also an aligned 8-byte word, read with `Acquire`), every quarter ring
//! and whenever it goes idle with something unreported. The sender never
//! claims beyond `credit + ring size`: no frame is ever overwritten before
//! it was consumed, and a full ring is reported as back-pressure.
//!
//! The receiver trusts nothing it reads: the producer position must be
//! ahead of its consumer position by at most one ring, every header's
//! length must fit in what was committed and in the ring, types and
//! sequences must be the expected ones ([`frame::validate`]). Any violation
//! closes the connection with [`FrameError`]; the receiver never reads
//! outside its ring.

pub mod frame;
pub mod mem;
pub mod state;

pub use frame::{FrameError, FrameHeader, Hello};
pub use state::{ClaimPos, ClaimRefused, ReceiverState, SenderState};
