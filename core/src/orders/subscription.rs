//! [`Subscription`]: receiving everything the peer of a [`Connection`]
//! sends. Polling is also when the connection returns credit, reaps its
//! send completions and, when idle, flushes and notices a disconnect, so a
//! subscription borrows its connection mutably, like a publication.

use super::{Connection, OrdersError, PeerLost};
use crate::ring::FrameError;

/// One received frame, valid for the duration of the handler call.
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Stream id.
    pub stream_id: u16,
    /// Message type.
    pub msg_type: u16,
    /// Connection sequence.
    pub seq: u64,
    /// The payload: a copy the connection took out of its registered ring
    /// (memory the peer writes by RDMA; it is never lent out directly, so
    /// whatever the peer writes there cannot change these bytes).
    pub payload: &'a [u8],
}

/// Receives everything the peer sends on a connection. Made by
/// [`Connection::subscription`]; it borrows the connection mutably for as
/// long as it lives.
#[derive(Debug)]
pub struct Subscription<'c> {
    conn: &'c mut Connection,
}

impl<'c> Subscription<'c> {
    #[inline]
    pub(super) fn new(conn: &'c mut Connection) -> Self {
        Self { conn }
    }

    /// Delivers up to `limit` frames to `handler`, in order; returns how
    /// many. Also returns credit to the peer, reaps send completions and,
    /// when idle, flushes and notices a disconnect. A protocol violation
    /// by the peer closes the connection and is returned as an error.
    #[inline]
    pub fn poll<F: FnMut(Frame<'_>)>(
        &mut self,
        mut handler: F,
        limit: usize,
    ) -> Result<usize, OrdersError> {
        let conn = &mut *self.conn;
        if let Some(l) = conn.link.lost {
            return Err(OrdersError::PeerLost(l));
        }
        let mut delivered = 0;
        let recv = &mut conn.recv;
        while delivered < limit {
            let info = match recv.rx.poll(&conn.ring, &mut recv.scratch) {
                Ok(Some(i)) => i,
                Ok(None) => break, // the next frame has not arrived
                Err(e) => return Err(violation(conn, e)),
            };
            handler(Frame {
                stream_id: info.stream_id,
                msg_type: info.msg_type,
                seq: info.seq,
                payload: &recv.scratch[..info.len as usize],
            });
            delivered += 1;
        }
        // The frame and byte counts are the receiver's own (read by
        // `Connection::stats`): nothing to add up here.
        if let Some(c) = conn.recv.rx.take_credit(delivered) {
            conn.send_credit(c).map_err(OrdersError::PeerLost)?;
        }
        if delivered == 0 {
            // Our own pending frames and completions, and the peer's health.
            conn.flush()
                .map_err(|_| OrdersError::PeerLost(conn.lost().unwrap_or(PeerLost::Closed)))?;
            conn.check_cm().map_err(OrdersError::PeerLost)?;
        }
        Ok(delivered)
    }
}

/// Closes a connection whose peer broke the ring protocol.
#[cold]
fn violation(conn: &mut Connection, e: FrameError) -> OrdersError {
    conn.close();
    OrdersError::Corrupt(e)
}
