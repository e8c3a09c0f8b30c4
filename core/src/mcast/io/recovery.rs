//! The recovery port's transport on the publisher's side: the rdma_cm
//! listener, each connection's RC queue pair from accept to release, and
//! the sending of what the [`RecoveryServer`] queued. It decides nothing:
//! admission, limits, answers and drops are the server's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use zerocopy::IntoBytes;

use super::common::RC_MSG_LEN;
use super::error::NetError;
use crate::mcast::server::{refusal_message, RecoveryServer};
use crate::verbs::cm::{self, Connection, EventChannel, Listener};
use crate::verbs::{
    Access, Dest, PoolConfig, PooledQp, ProtectionDomain, QpType, RcOptions, StageError,
};

/// An accepted recovery connection waiting for ESTABLISHED, by the
/// [`RecoveryServer`]'s connection id. Field order: the queue pair goes
/// before the rdma_cm id it is connected through.
pub(super) struct PendingIo {
    id: u32,
    qp: PooledQp,
    accepting: cm::Accepting,
}

/// An established recovery connection's queue pair and rdma_cm id.
pub(super) struct ConnIo {
    pub(super) id: u32,
    pub(super) qp: PooledQp,
    pub(super) conn: Connection,
    /// Messages that arrived before the CM reported the connection
    /// established (see [`RecoveryIo::progress`]), for the server first.
    pub(super) early: Vec<Vec<u8>>,
}

/// The recovery port's I/O: the rdma_cm listener and each connection's
/// queue pair. Decides nothing: [`RecoveryServer`] does.
pub(super) struct RecoveryIo {
    pub(super) addr: SocketAddr,
    /// None while the service is disabled.
    pub(super) listener: Option<Listener>,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) conns: Vec<ConnIo>,
    pub(super) pending: Vec<PendingIo>,
    pub(super) opts: RcOptions,
    /// Inline limit of the connections' queue pairs (`[rdma] max_inline`).
    pub(super) max_inline: u32,
    pub(super) next_cm_check: u64,
}

impl RecoveryIo {
    /// Whether connection management has anything to do: a handshake under
    /// way, or an event (a connect request, a disconnect) waiting on the
    /// listener's or a connection's rdma_cm channel, found with one poll
    /// system call for all of them; most looks find nothing, and a look per
    /// channel cost a call each. A failed poll counts as something to do:
    /// the looks that follow meet the error.
    pub(super) fn cm_events(&self) -> bool {
        if !self.pending.is_empty() {
            return true;
        }
        let listener = self.listener.iter().map(|l| l.events());
        let conns = self.conns.iter().map(|c| c.conn.events());
        EventChannel::any_event(listener.chain(conns)).unwrap_or(true)
    }

    /// Takes one connect request, if any, to the server: rejects it with
    /// the server's reason, or answers it with the server's welcome without
    /// waiting for the handshake to finish (see [`Self::progress`]).
    pub(super) fn accept(&mut self, now: u64, server: &mut RecoveryServer) -> Result<(), NetError> {
        let Some(listener) = &self.listener else {
            return Ok(());
        };
        let Some(req) = listener.next_request(Duration::ZERO)? else {
            return Ok(());
        };
        let (id, welcome) = match server.on_connect_request(now, req.peer(), req.private_data()) {
            Ok(w) => w,
            Err(refused) => {
                req.reject(&refusal_message(refused))?;
                return Ok(());
            }
        };
        let accepted = (|| {
            let mut qp = PooledQp::new(
                &self.pd,
                QpType::Rc,
                PoolConfig {
                    recv_slots: 32,
                    recv_len: 256,
                    recv_batch: 8,
                    recv_low_water: 4,
                    send_slots: 64,
                    send_len: RC_MSG_LEN,
                    signal_every: 8,
                    dests_per_send: 1,
                    max_inline: self.max_inline,
                },
            )?;
            let accepting =
                req.start_accept(qp.qp(), &self.opts, Access::LOCAL, welcome.as_bytes())?;
            // In RTS already: receives go up before the subscriber's proof
            // and first request can arrive.
            qp.post_receives()?;
            Ok::<_, NetError>((qp, accepting))
        })();
        match accepted {
            Ok((qp, accepting)) => {
                self.pending.push(PendingIo { id, qp, accepting });
                Ok(())
            }
            Err(e) => {
                // The server counts it failed when it is closed.
                server.on_transport_error(id, false);
                Err(e)
            }
        }
    }

    /// Moves established connections to `conns` and tells the server; a
    /// failed set-up is reported to it (it also times out slow ones).
    /// Connection set-up only, so the Vec shuffle and the copies of early
    /// messages do not matter.
    ///
    /// A connection is established when the CM says so, or when the
    /// subscriber's first message (its proof) reached the queue pair: the
    /// subscriber sends only once it has our accept, and if its
    /// ready-to-use message was lost the CM would hear of the connection
    /// only at the retry of the accept, seconds later, while the
    /// subscriber's requests went unanswered and it gave the link up.
    pub(super) fn progress(&mut self, now: u64, server: &mut RecoveryServer) {
        for mut p in std::mem::take(&mut self.pending) {
            let established = match p.accepting.poll() {
                Ok(cm::AcceptProgress::Done(conn)) => Ok((conn, Vec::new())),
                Ok(cm::AcceptProgress::Pending(accepting)) => {
                    let mut early = Vec::new();
                    match p.qp.poll_recv(|bytes| early.push(bytes.to_vec())) {
                        Ok(_) if early.is_empty() => {
                            self.pending.push(PendingIo { accepting, ..p });
                            continue;
                        }
                        Ok(_) => accepting
                            .established_by_traffic()
                            .map(|conn| (conn, early))
                            .map_err(NetError::from),
                        Err(e) => Err(NetError::from(e)),
                    }
                }
                Err(e) => Err(NetError::from(e)),
            };
            match established {
                Ok((conn, early)) => {
                    server.on_established(now, p.id);
                    self.conns.push(ConnIo {
                        id: p.id,
                        qp: p.qp,
                        conn,
                        early,
                    });
                }
                Err(_) => server.on_transport_error(p.id, false),
            }
        }
    }

    /// Releases the transport of a connection the server closed.
    pub(super) fn release(&mut self, id: u32) {
        if let Some(i) = self.conns.iter().position(|c| c.id == id) {
            self.conns.swap_remove(i);
        } else if let Some(i) = self.pending.iter().position(|c| c.id == id) {
            self.pending.swap_remove(i);
        }
    }
}

/// Sends what the server queued on connection `id`, packed into RC
/// messages, as far as the send ring takes.
pub(super) fn send_answers(
    qp: &mut PooledQp,
    server: &mut RecoveryServer,
    now: u64,
    id: u32,
) -> Result<(), NetError> {
    while let Some(bytes) = server.poll_transmit(id, qp.send_capacity()) {
        let len = bytes.len();
        match qp.stage(bytes) {
            Ok(()) => server.transmitted(now, id, len),
            Err(StageError::BatchFull) => {
                qp.post_staged(&[Dest::Connected])?;
            }
            Err(_) => {
                if qp.poll_send()? == 0 {
                    break;
                }
            }
        }
    }
    qp.post_staged(&[Dest::Connected])?;
    qp.reclaim()?;
    Ok(())
}
