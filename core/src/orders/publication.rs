//! [`Publication`]: sending on one stream of a [`Connection`], zero-copy
//! ([`Publication::try_claim`] hands out the registered staging memory the
//! device sends from) and without a run-time borrow check: a publication
//! borrows its connection mutably and a [`Claim`] borrows its publication
//! mutably, so while a claim is open the compiler refuses every other use
//! of the connection (flush, poll, another claim).

use super::{Connection, PeerLost};
use crate::ring::ClaimRefused;

/// Why `try_claim`/`offer` could not take a message. `Copy`, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// The receiver has not consumed enough: try again later (never
    /// blocks, never drops).
    #[error("back-pressured: the peer's ring is full")]
    BackPressured,
    /// Larger than the connection's maximum payload.
    #[error("payload of {len} bytes exceeds the connection's maximum of {max}")]
    TooLarge {
        /// Requested.
        len: usize,
        /// Allowed (the smaller of the two sides' `max_payload`).
        max: usize,
    },
    /// The message type is in [`crate::RESERVED_TYPES`].
    #[error("message type reserved for rocebus (0xFF00..=0xFFFF)")]
    ReservedType,
    /// The connection is lost (the same reason [`Subscription::poll`](super::Subscription::poll)
    /// returns as [`OrdersError::PeerLost`](super::OrdersError::PeerLost)).
    #[error("connection lost: {0}")]
    PeerLost(PeerLost),
}

/// Sends on one stream of a connection. Made by
/// [`Connection::publication`]; it borrows the connection mutably for as
/// long as it lives.
#[derive(Debug)]
pub struct Publication<'c> {
    conn: &'c mut Connection,
    stream_id: u16,
}

/// A claimed frame in registered memory: fill it, then [`commit`](Claim::commit).
/// Dropping it without committing abandons it: nothing is sent, and the
/// next claim takes its room ([`Sender::claim`](crate::ring::Sender::claim)
/// replaces a claim left open). While it lives, its publication and
/// connection cannot be used.
///
/// It has no destructor on purpose: a `match` on `try_claim` may then use
/// the connection in its `Err` arm (e.g. flush and poll when
/// back-pressured), which a destructor would make the borrow checker refuse.
pub struct Claim<'a> {
    conn: &'a mut Connection,
    len: usize,
}

impl std::fmt::Debug for Claim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim").field("len", &self.len).finish()
    }
}

impl<'c> Publication<'c> {
    #[inline]
    pub(super) fn new(conn: &'c mut Connection, stream_id: u16) -> Self {
        Self { conn, stream_id }
    }

    /// The stream id.
    pub fn stream_id(&self) -> u16 {
        self.stream_id
    }

    /// Claims `len` bytes for a message of type `msg_type` (below
    /// 0xFF00), in the staging memory the device will send from.
    #[inline]
    pub fn try_claim(&mut self, msg_type: u16, len: usize) -> Result<Claim<'_>, OfferError> {
        self.conn.try_claim(self.stream_id, msg_type, len)
    }

    /// Copies `payload` into a frame and commits it (not yet flushed).
    #[inline]
    pub fn offer(&mut self, msg_type: u16, payload: &[u8]) -> Result<(), OfferError> {
        self.conn.offer(self.stream_id, msg_type, payload)
    }

    /// [`Connection::flush`], through the publication.
    #[inline]
    pub fn flush(&mut self) -> Result<(), OfferError> {
        self.conn.flush()
    }

    /// [`offer`](Self::offer) then [`flush`](Self::flush).
    #[inline]
    pub fn offer_and_flush(&mut self, msg_type: u16, payload: &[u8]) -> Result<(), OfferError> {
        self.conn.offer_and_flush(self.stream_id, msg_type, payload)
    }
}

impl Connection {
    /// Claims `len` bytes for a message of type `msg_type` (below 0xFF00)
    /// on `stream_id`, in the staging memory the device will send from:
    /// [`Publication::try_claim`] without the publication (which a
    /// `let claim = conn.publication(s).try_claim(..)` could not keep alive).
    #[inline]
    pub fn try_claim(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        len: usize,
    ) -> Result<Claim<'_>, OfferError> {
        if let Some(l) = self.link.lost {
            return Err(OfferError::PeerLost(l));
        }
        match self.send.tx.claim(stream_id, msg_type, len, &self.ring) {
            Ok(()) => Ok(Claim { conn: self, len }),
            Err(e) => Err(self.refused(e, len)),
        }
    }

    /// Counts and converts a refused claim.
    #[cold]
    fn refused(&mut self, e: ClaimRefused, len: usize) -> OfferError {
        match e {
            ClaimRefused::TooLarge => OfferError::TooLarge {
                len,
                max: self.send.tx.state().max_payload(),
            },
            ClaimRefused::ReservedType => OfferError::ReservedType,
            ClaimRefused::BackPressured => {
                // A back-pressured claim read the peer's credit word: a
                // forged one is counted here, and one beyond what was sent
                // closes the connection.
                if let Some(l) = self.check_credit() {
                    return OfferError::PeerLost(l);
                }
                self.stats.back_pressured += 1;
                OfferError::BackPressured
            }
        }
    }

    /// Copies `payload` into a frame of type `msg_type` on `stream_id` and
    /// commits it (not yet flushed).
    #[inline(always)]
    pub fn offer(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
    ) -> Result<(), OfferError> {
        if let Some(l) = self.link.lost {
            return Err(OfferError::PeerLost(l));
        }
        // Claim, copy and seal in one go (`Sender::offer`): what a claim
        // that is filled and committed at once amounts to.
        match self.send.tx.offer(stream_id, msg_type, payload, &self.ring) {
            Ok(_) => Ok(()),
            Err(e) => Err(self.refused(e, payload.len())),
        }
    }
}

impl Connection {
    /// [`offer`](Connection::offer) then [`flush`](Connection::flush) on
    /// `stream_id`. The usual case, nothing else waiting for a flush and a
    /// frame that fits before the ring's end within the credit, is one
    /// step: the frame is written to staging and posted as its own run
    /// through the prepared WRITE, without working out the flush range.
    /// Always inlined: a call would save and restore as many registers as
    /// the step has instructions of its own.
    #[inline(always)]
    pub fn offer_and_flush(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
    ) -> Result<(), OfferError> {
        if self.link.lost.is_none() {
            if let Some((off, len)) = self.send.tx.offer_run(stream_id, msg_type, payload) {
                return self.post_run(off, len);
            }
        }
        self.offer_and_flush_slow(stream_id, msg_type, payload)
    }

    /// [`offer_and_flush`](Self::offer_and_flush) the general way.
    #[inline(never)]
    fn offer_and_flush_slow(
        &mut self,
        stream_id: u16,
        msg_type: u16,
        payload: &[u8],
    ) -> Result<(), OfferError> {
        self.offer(stream_id, msg_type, payload)?;
        self.flush()
    }
}

impl Claim<'_> {
    /// Commits the frame: it goes out with the next flush.
    #[inline]
    pub fn commit(self) {
        // The sender counts the frame and its bytes (`Connection::stats`).
        self.conn.send.tx.commit();
    }

    /// Abandons the frame: nothing is sent and the next claim takes its room
    /// (what dropping the claim does; this says so at the call site).
    #[inline]
    pub fn abort(self) {}
}

impl std::ops::Deref for Claim<'_> {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.conn.send.tx.payload()
    }
}

impl std::ops::DerefMut for Claim<'_> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [u8] {
        self.conn.send.tx.payload_mut()
    }
}
