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
///
/// Publish and poll, the shape of every rocebus transport:
///
/// ```no_run
/// # use rocebus::orders::{Connection, OrdersConfig};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let cfg = OrdersConfig { token: "s3cret".into(), ..OrdersConfig::default() };
/// let mut conn = Connection::connect(&cfg, "198.18.0.1:7470".parse()?)?;
/// conn.publication(1).offer_and_flush(7, b"order")?; // stream 1, message type 7
/// conn.subscription().poll(|f| println!("type {} {} B", f.msg_type, f.payload.len()), 16)?;
/// while let Some(event) = conn.poll_event() { println!("{event:?}"); } // the peer lost, once
/// # Ok(()) }
/// ```
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

/// What happened to a connection ([`Connection::poll_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrdersEvent {
    /// The peer is gone for good: the same reason `poll` returns as
    /// [`OrdersError::PeerLost`] and `offer`/`flush` as
    /// [`OfferError::PeerLost`](super::OfferError::PeerLost).
    PeerLost(PeerLost),
}

impl Connection {
    /// The next lifecycle event, once each: the loss of the peer (noticed
    /// by a poll, a flush or an offer). An application that handles errors
    /// where they are returned may ignore it; one that drives several
    /// transports alike reads it after each turn's polls, as on ipc and
    /// market data.
    pub fn poll_event(&mut self) -> Option<OrdersEvent> {
        let lost = self.lost()?;
        if std::mem::replace(&mut self.loss_reported, true) {
            return None;
        }
        Some(OrdersEvent::PeerLost(lost))
    }
}

/// Closes a connection whose peer broke the ring protocol.
#[cold]
fn violation(conn: &mut Connection, e: FrameError) -> OrdersError {
    conn.close();
    OrdersError::Corrupt(e)
}
